/*
 * Tool calling end to end in Mistral Nemo's format (daemon/net/toolcall.h), as
 * test_http_tools does it for chatml: a real llmsd of this build serving a random-weight
 * model whose chat template is detected as mistral-v3-tekken (Mistral-Nemo-Instruct-2407's
 * markers), on the synthetic vocabulary plus one token whose text is "[TOOL_CALLS]" and an
 * array of two calls. The prompt is checked by its token count against /tokenize of the
 * template's rendering, the replies by making the model emit the call token (logit_bias)
 * or by a forced tool_choice, whose reply is decoded against the call's schema.
 */
#include <json-c/json.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/integration/httpc.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/integration/toolmodel.h"
#include "tests/support/test.h"

#define SP TOOLMODEL_SP
static const char CALL_PIECE[] =
    "[TOOL_CALLS][{\"name\":" SP "\"get_weather\"," SP "\"arguments\":" SP "{\"city\":" SP
    "\"Paris\"}}," SP "{\"name\":" SP "\"get_weather\"," SP "\"arguments\":" SP "{\"city\":" SP
    "\"Rome\"}," SP "\"id\":" SP "\"abcDEF123\"}]";

/* Mistral-Nemo-Instruct-2407's markers, as chat_detect reads them */
static const char NEMO_TEMPLATE[] =
    "{{- \"[AVAILABLE_TOOLS][\" }}{%- if loop.last and system_message is defined %}\n"
    "            {{- \"[INST]\" + system_message + \"\\n\\n\" + message[\"content\"] + "
    "\"[/INST]\" }}";

/* Mistral-Nemo-Instruct-2407.jinja of system, user with the weather tool (without its BOS) */
static const char WANT_PROMPT[] =
    "[AVAILABLE_TOOLS][{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
    "\"description\": \"Get the weather in a city\", \"parameters\": {\"type\": \"object\", "
    "\"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}]"
    "[/AVAILABLE_TOOLS][INST]Be brief.\n\nWeather in Paris?[/INST]";

static char llmsd_path[1024], model_path[1024], hsock[700];
static llmsd_proc daemon_;
static int daemon_up;

static int start_daemon(void)
{
    return toolmodel_start(&daemon_, llmsd_path, "toolsm", model_path, hsock, sizeof hsock);
}

#define NEED()                                                                 \
    do {                                                                       \
        if (!llmsd_path[0])                                                    \
            SKIP("llmsd is not built in this tree");                           \
        if (!model_path[0])                                                    \
            SKIP("no model could be generated");                               \
        if (!daemon_up)                                                        \
            daemon_up = start_daemon() == 0 ? 1 : -1;                          \
        CHECK_MSG(daemon_up == 1, "llmsd did not start");                      \
    } while (0)

static json_object *post(const char *path, const char *body, int *status)
{
    return httpc_post_json(hsock, path, body, status);
}

/* A chat body of system, user with the weather tool; extra: more fields (or ""). */
static void chat_body(char *out, size_t cap, const char *extra)
{
    snprintf(out, cap,
             "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\","
             "\"content\":\"Weather in Paris?\"}],\"tools\":[%s]%s%s}",
             toolmodel_weather_tool, extra[0] ? "," : "", extra);
}

/* The prompt the daemon builds is the template's: as many tokens as the expected text. */
static void prompt_is_the_templates(void)
{
    NEED();
    json_object *req = json_object_new_object();
    json_object_object_add(req, "content", json_object_new_string(WANT_PROMPT));
    json_object_object_add(req, "add_special", json_object_new_boolean(1));
    int st;
    json_object *t = post("/tokenize", json_object_to_json_string(req), &st);
    json_object_put(req);
    CHECK(t && st == 200);
    int want = atoi(httpc_jstr(t, "count"));
    json_object_put(t);
    char body[2048];
    chat_body(body, sizeof body, "\"max_tokens\":1,\"temperature\":0");
    json_object *o = post("/v1/chat/completions", body, &st);
    CHECK_MSG(o && st == 200, "%d %s", st, o ? json_object_to_json_string(o) : "");
    CHECK_EQ(atoi(httpc_jstr(o, "usage.prompt_tokens")), want);
    json_object_put(o);
}

/* The model emits the call token: one array, two calls, no content. */
static void array_of_calls_becomes_tool_calls(void)
{
    NEED();
    char body[2048];
    chat_body(body, sizeof body, "\"max_tokens\":1,\"temperature\":0,\"logit_bias\":{\"3\":100}");
    int st;
    json_object *o = post("/v1/chat/completions", body, &st);
    CHECK_MSG(o && st == 200, "%d", st);
    CHECK_MSG(!strcmp(httpc_jstr(o, "choices.0.finish_reason"), "tool_calls"), "%s",
              json_object_to_json_string(o));
    CHECK(!httpc_jstr(o, "choices.0.message.content"));
    CHECK(!strcmp(httpc_jstr(o, "choices.0.message.tool_calls.0.function.name"), "get_weather"));
    CHECK(!strcmp(httpc_jstr(o, "choices.0.message.tool_calls.0.function.arguments"),
                  "{\"city\":\"Paris\"}"));
    CHECK(!strcmp(httpc_jstr(o, "choices.0.message.tool_calls.1.function.arguments"),
                  "{\"city\":\"Rome\"}"));
    const char *id0 = httpc_jstr(o, "choices.0.message.tool_calls.0.id");
    const char *id1 = httpc_jstr(o, "choices.0.message.tool_calls.1.id");
    CHECK(id0 && id1 && !strncmp(id0, "call_", 5) && strcmp(id0, id1) != 0);
    json_object_put(o);

    /* parallel_tool_calls false: the first alone */
    chat_body(body, sizeof body, "\"max_tokens\":1,\"temperature\":0,\"logit_bias\":{\"3\":100},"
                                 "\"parallel_tool_calls\":false");
    o = post("/v1/chat/completions", body, &st);
    CHECK(o && st == 200);
    CHECK(httpc_jstr(o, "choices.0.message.tool_calls.0.id") &&
          !httpc_jstr(o, "choices.0.message.tool_calls.1.id"));
    json_object_put(o);

    /* streamed: two delta.tool_calls entries, indexes 0 and 1 */
    chat_body(body, sizeof body, "\"max_tokens\":1,\"temperature\":0,\"stream\":true,"
                                 "\"logit_bias\":{\"3\":100}");
    httpc_reply r;
    CHECK(httpc_do(hsock, 0, "POST", "/v1/chat/completions", NULL, body, &r) == 0);
    CHECK_EQ(r.status, 200);
    int calls = 0, indexes = 0;
    bool finished = false;
    char *save;
    for (char *line = strtok_r(r.body, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (strncmp(line, "data: {", 7) != 0)
            continue;
        json_object *d = json_tokener_parse(line + 6);
        const char *c = httpc_jstr(d, "choices.0.delta.content");
        CHECK_MSG(!c || !c[0], "content streamed beside the calls: %s", c);
        for (int k = 0; k < 2; k++) {
            char path[64];
            snprintf(path, sizeof path, "choices.0.delta.tool_calls.%d.index", k);
            const char *index = httpc_jstr(d, path);
            if (index) {
                indexes += atoi(index);
                calls++;
            }
        }
        const char *f = httpc_jstr(d, "choices.0.finish_reason");
        finished |= f && !strcmp(f, "tool_calls");
        json_object_put(d);
    }
    httpc_reply_free(&r);
    CHECK_EQ(calls, 2);
    CHECK_EQ(indexes, 1);
    CHECK(finished);
}

/* A history with calls and results, OpenAI's ids (mapped to Mistral's 9 characters) or
 * ollama's none; what the template refuses is 400. */
static void history_is_rendered_or_refused(void)
{
    NEED();
    char body[4096];
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"},{\"role\":\"assistant\","
             "\"content\":null,\"tool_calls\":[{\"id\":\"call_0123456789abcdef01234567\",\"type\":"
             "\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":"
             "\\\"Paris\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":"
             "\"call_0123456789abcdef01234567\",\"content\":\"sunny\"}],\"tools\":[%s],"
             "\"max_tokens\":1}", toolmodel_weather_tool);
    int st;
    json_object *o = post("/v1/chat/completions", body, &st);
    CHECK_MSG(o && st == 200, "%d %s", st, o ? json_object_to_json_string(o) : "");
    json_object_put(o);
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"},{\"role\":\"assistant\","
             "\"content\":\"\",\"tool_calls\":[{\"function\":{\"name\":\"get_weather\","
             "\"arguments\":{\"city\":\"Paris\"}}}]},{\"role\":\"tool\",\"content\":\"sunny\"}],"
             "\"tools\":[%s],\"stream\":false,\"options\":{\"num_predict\":1}}", toolmodel_weather_tool);
    o = post("/api/chat", body, &st);
    CHECK_MSG(o && st == 200, "%d %s", st, o ? json_object_to_json_string(o) : "");
    json_object_put(o);
    /* a user message right after a result: the roles do not alternate */
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"},{\"role\":\"assistant\","
             "\"tool_calls\":[{\"function\":{\"name\":\"get_weather\",\"arguments\":{}}}]},"
             "{\"role\":\"tool\",\"content\":\"sunny\"},{\"role\":\"user\",\"content\":\"Rome?\"}],"
             "\"tools\":[%s],\"max_tokens\":1}", toolmodel_weather_tool);
    o = post("/v1/chat/completions", body, &st);
    const char *msg = o ? httpc_jstr(o, "error.message") : NULL;
    CHECK_MSG(st == 400 && msg && strstr(msg, "alternate"), "%d %s", st, msg ? msg : "");
    json_object_put(o);
}

static bool check_pick_arguments(const char *args)
{
    json_object *a = args ? json_tokener_parse(args) : NULL, *day, *hours;
    bool ok = a && json_object_object_get_ex(a, "day", &day) &&
              json_object_object_get_ex(a, "hours", &hours) &&
              (!strcmp(json_object_get_string(day), "mon") ||
               !strcmp(json_object_get_string(day), "tue")) &&
              json_object_is_type(hours, json_type_int) && json_object_get_int(hours) >= 1 &&
              json_object_get_int(hours) <= 9;
    json_object_put(a);
    return ok;
}

/* A forced named call: the prompt ends with "[TOOL_CALLS][", the reply is the array's one
 * item, decoded against the call's schema: one valid tool_calls entry, whole and on
 * ollama's route. */
static void forced_named_call_is_one_valid_call(void)
{
    NEED();
    for (int seed = 0; seed < 3; seed++) {
        char body[4096];
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"Which day?\"}],\"tools\":[%s,%s],"
                 "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"pick_day\"}},"
                 "\"max_tokens\":400,\"seed\":%d%s}",
                 toolmodel_weather_tool, toolmodel_pick_tool, seed, seed == 0 ? ",\"temperature\":0" : "");
        int st;
        json_object *o = post("/v1/chat/completions", body, &st);
        CHECK_MSG(o && st == 200, "%d %s", st, o ? json_object_to_json_string(o) : "");
        CHECK_MSG(!strcmp(httpc_jstr(o, "choices.0.finish_reason"), "tool_calls"), "%s",
                  json_object_to_json_string(o));
        CHECK(!strcmp(httpc_jstr(o, "choices.0.message.tool_calls.0.function.name"), "pick_day"));
        CHECK_MSG(check_pick_arguments(
                      httpc_jstr(o, "choices.0.message.tool_calls.0.function.arguments")),
                  "%s", json_object_to_json_string(o));
        CHECK(!httpc_jstr(o, "choices.0.message.tool_calls.1.id"));
        json_object_put(o);
    }
    char body[4096];
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Which day?\"}],\"tools\":[%s],"
             "\"tool_choice\":\"required\",\"stream\":false,\"options\":{\"num_predict\":400,"
             "\"temperature\":0}}", toolmodel_pick_tool);
    int st;
    json_object *o = post("/api/chat", body, &st);
    CHECK_MSG(o && st == 200, "%d %s", st, o ? json_object_to_json_string(o) : "");
    CHECK(!strcmp(httpc_jstr(o, "message.tool_calls.0.function.name"), "pick_day"));
    json_object *msg = NULL, *calls = NULL, *fn = NULL, *args = NULL;
    json_object_object_get_ex(o, "message", &msg);
    json_object_object_get_ex(msg, "tool_calls", &calls);
    json_object_object_get_ex(json_object_array_get_idx(calls, 0), "function", &fn);
    json_object_object_get_ex(fn, "arguments", &args);
    CHECK_MSG(json_object_is_type(args, json_type_object) &&
                  check_pick_arguments(json_object_to_json_string(args)),
              "%s", json_object_to_json_string(o));
    json_object_put(o);
}

static void daemon_exits_cleanly(void)
{
    proc_check_clean_exit(&daemon_, &daemon_up);
}

int main(int argc, char **argv)
{
    (void)argc;
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    toolmodel_generate("toolsm", CALL_PIECE, NEMO_TEMPLATE, NULL, NULL, 0, model_path,
                       sizeof model_path);
    RUN(prompt_is_the_templates);
    RUN(array_of_calls_becomes_tool_calls);
    RUN(history_is_rendered_or_refused);
    RUN(forced_named_call_is_one_valid_call);
    RUN(daemon_exits_cleanly);
    return test_finish();
}
