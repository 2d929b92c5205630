/*
 * Tool calling through the gateway end to end (daemon/net/toolcall.h): a real llmsd of
 * this build serving a random-weight model whose chat template is chatml, on a vocabulary
 * of toolmodel.h: the synthetic one, with one token whose text is a whole Qwen-style tool
 * call. The request side is checked by the prompt the daemon builds (usage.prompt_tokens
 * equals /tokenize of the expected rendering); the reply side by making the model emit
 * the call token (logit_bias), so the tool_calls objects, finish reasons and streamed
 * deltas of OpenAI's and ollama's routes come from a real generation.
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

/* The call token's text: a whole Qwen-style call */
static const char CALL_PIECE[] =
    "<tool_call>\n{\"name\":" TOOLMODEL_SP "\"get_weather\"," TOOLMODEL_SP "\"arguments\":"
    TOOLMODEL_SP "{\"city\":" TOOLMODEL_SP "\"Paris\"}}\n</tool_call>";

/* Qwen2.5's rendering of system, user with the weather tool (Qwen-Qwen2.5-7B-Instruct.jinja) */
static const char WANT_PROMPT[] =
    "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist "
    "with the user query.\n\nYou are provided with function signatures within <tools></tools> "
    "XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
    "\"description\": \"Get the weather in a city\", \"parameters\": {\"type\": \"object\", "
    "\"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n"
    "<|im_start|>assistant\n";

static char llmsd_path[1024], model_path[1024], hsock[700];
static llmsd_proc daemon_;
static int daemon_up;

static int start_daemon(void)
{
    return toolmodel_start(&daemon_, llmsd_path, "tools", model_path, hsock, sizeof hsock);
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

/* A chat body with the weather tool; extra: more fields (or ""). */
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
    /* without tools the prompt is shorter: the tools were in it */
    o = post("/v1/chat/completions",
             "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\","
             "\"content\":\"Weather in Paris?\"}],\"max_tokens\":1}", &st);
    CHECK(o && st == 200);
    CHECK(atoi(httpc_jstr(o, "usage.prompt_tokens")) < want);
    json_object_put(o);
}

/* The model emits the call token twice: two calls, no content. */
static void reply_calls_become_tool_calls(void)
{
    NEED();
    char body[2048];
    chat_body(body, sizeof body,
              "\"max_tokens\":2,\"temperature\":0,\"logit_bias\":{\"3\":100}");
    int st;
    json_object *o = post("/v1/chat/completions", body, &st);
    CHECK_MSG(o && st == 200, "%d", st);
    CHECK_MSG(!strcmp(httpc_jstr(o, "choices.0.finish_reason"), "tool_calls"), "%s",
              json_object_to_json_string(o));
    json_object *msg = json_object_object_get(json_object_array_get_idx(
                           json_object_object_get(o, "choices"), 0), "message");
    CHECK(json_object_object_get_ex(msg, "content", NULL) && !json_object_object_get(msg, "content"));
    CHECK(!strcmp(httpc_jstr(o, "choices.0.message.tool_calls.0.type"), "function"));
    CHECK(!strcmp(httpc_jstr(o, "choices.0.message.tool_calls.0.function.name"), "get_weather"));
    CHECK(!strcmp(httpc_jstr(o, "choices.0.message.tool_calls.1.function.arguments"),
                  "{\"city\":\"Paris\"}"));
    const char *id0 = httpc_jstr(o, "choices.0.message.tool_calls.0.id");
    const char *id1 = httpc_jstr(o, "choices.0.message.tool_calls.1.id");
    CHECK(id0 && id1 && !strncmp(id0, "call_", 5) && strcmp(id0, id1) != 0);
    json_object_put(o);

    /* parallel_tool_calls false: the first alone; tool_choice none: the text as it is */
    chat_body(body, sizeof body, "\"max_tokens\":2,\"temperature\":0,\"logit_bias\":{\"3\":100},"
                                 "\"parallel_tool_calls\":false");
    o = post("/v1/chat/completions", body, &st);
    CHECK(o && st == 200);
    CHECK(httpc_jstr(o, "choices.0.message.tool_calls.0.id") &&
          !httpc_jstr(o, "choices.0.message.tool_calls.1.id"));
    json_object_put(o);
    chat_body(body, sizeof body, "\"max_tokens\":1,\"temperature\":0,\"logit_bias\":{\"3\":100},"
                                 "\"tool_choice\":\"none\"");
    o = post("/v1/chat/completions", body, &st);
    CHECK(o && st == 200);
    CHECK(strstr(httpc_jstr(o, "choices.0.message.content"), "<tool_call>"));
    CHECK(!strcmp(httpc_jstr(o, "choices.0.finish_reason"), "length"));
    json_object_put(o);
}

/* Streamed: each call a delta.tool_calls entry with its index, finish_reason tool_calls. */
static void streamed_calls_are_deltas(void)
{
    NEED();
    char body[2048];
    chat_body(body, sizeof body, "\"max_tokens\":2,\"temperature\":0,\"stream\":true,"
                                 "\"logit_bias\":{\"3\":100}");
    httpc_reply r;
    CHECK(httpc_do(hsock, 0, "POST", "/v1/chat/completions", NULL, body, &r) == 0);
    CHECK_EQ(r.status, 200);
    int calls = 0, indexes = 0;
    bool done = false, content = false;
    char *finish = NULL, *save;
    for (char *line = strtok_r(r.body, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (strncmp(line, "data: ", 6) != 0)
            continue;
        if (!strcmp(line + 6, "[DONE]")) {
            done = true;
            continue;
        }
        json_object *o = json_tokener_parse(line + 6);
        CHECK(o);
        const char *c = httpc_jstr(o, "choices.0.delta.content");
        content |= c && c[0];
        if (httpc_jstr(o, "choices.0.delta.tool_calls.0.function.name")) {
            CHECK(!strcmp(httpc_jstr(o, "choices.0.delta.tool_calls.0.function.arguments"),
                          "{\"city\":\"Paris\"}"));
            CHECK(!strncmp(httpc_jstr(o, "choices.0.delta.tool_calls.0.id"), "call_", 5));
            indexes += atoi(httpc_jstr(o, "choices.0.delta.tool_calls.0.index"));
            calls++;
        }
        const char *f = httpc_jstr(o, "choices.0.finish_reason");
        if (f && !finish)
            finish = strdup(f);
        json_object_put(o);
    }
    httpc_reply_free(&r);
    CHECK_EQ(calls, 2);
    CHECK_EQ(indexes, 1); /* 0 and 1 */
    CHECK(!content && done);
    CHECK_MSG(finish && !strcmp(finish, "tool_calls"), "%s", finish ? finish : "(none)");
    free(finish);
}

/* ollama's /api/chat: message.tool_calls with arguments as an object, whole or streamed. */
static void ollama_chat_calls(void)
{
    NEED();
    char body[2048];
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}],\"tools\":[%s],"
             "\"stream\":false,\"options\":{\"num_predict\":1,\"temperature\":0}}", toolmodel_weather_tool);
    int st;
    /* ollama has no logit_bias: the call token is forced through the OpenAI route's
     * equivalent only; here the request side is checked, and the reply shape on a
     * forced stream below */
    json_object *o = post("/api/chat", body, &st);
    CHECK_MSG(o && st == 200, "%d", st);
    json_object_put(o);
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"},{\"role\":\"assistant\","
             "\"content\":\"\",\"tool_calls\":[{\"function\":{\"name\":\"get_weather\","
             "\"arguments\":{\"city\":\"Paris\"}}}]},{\"role\":\"tool\",\"content\":\"sunny\"}],"
             "\"tools\":[%s],\"stream\":false,\"options\":{\"num_predict\":1}}", toolmodel_weather_tool);
    o = post("/api/chat", body, &st);
    CHECK_MSG(o && st == 200, "%d %s", st, o ? json_object_to_json_string(o) : "");
    json_object_put(o);
}

/* A forced tool_choice on /v1/chat/completions, whole and streamed: the reply is decoded
 * against the function's schema, so even a random model's reply is one valid call. */
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

static void forced_choice_is_one_valid_call(void)
{
    NEED();
    static const char *const choices[] = {
        "{\"type\":\"function\",\"function\":{\"name\":\"pick_day\"}}", "\"required\""};
    for (int c = 0; c < 2; c++)
        for (int seed = 0; seed < 3; seed++) {
            char body[4096];
            /* "required" among several functions leaves the arguments any object: one tool */
            snprintf(body, sizeof body,
                     "{\"messages\":[{\"role\":\"user\",\"content\":\"Which day?\"}],\"tools\":"
                     "[%s%s%s],\"tool_choice\":%s,\"max_tokens\":400,\"seed\":%d%s}",
                     c == 0 ? toolmodel_weather_tool : "", c == 0 ? "," : "", toolmodel_pick_tool, choices[c], seed,
                     seed == 0 ? ",\"temperature\":0" : "");
            int st;
            json_object *o = post("/v1/chat/completions", body, &st);
            CHECK_MSG(o && st == 200, "%d %s", st, o ? json_object_to_json_string(o) : "");
            CHECK_MSG(!strcmp(httpc_jstr(o, "choices.0.finish_reason"), "tool_calls"), "%s",
                      json_object_to_json_string(o));
            CHECK(!strcmp(httpc_jstr(o, "choices.0.message.tool_calls.0.function.name"),
                          "pick_day"));
            CHECK_MSG(check_pick_arguments(
                          httpc_jstr(o, "choices.0.message.tool_calls.0.function.arguments")),
                      "%s", json_object_to_json_string(o));
            CHECK(!httpc_jstr(o, "choices.0.message.tool_calls.1.id"));
            json_object_put(o);
        }
    /* streamed: one tool_calls delta, finish tool_calls */
    char body[4096];
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Which day?\"}],\"tools\":[%s],"
             "\"tool_choice\":\"required\",\"max_tokens\":400,\"temperature\":0,\"stream\":true}",
             toolmodel_pick_tool);
    httpc_reply r;
    CHECK(httpc_do(hsock, 0, "POST", "/v1/chat/completions", NULL, body, &r) == 0);
    CHECK_EQ(r.status, 200);
    int calls = 0;
    bool finished = false;
    char *save;
    for (char *line = strtok_r(r.body, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (strncmp(line, "data: {", 7) != 0)
            continue;
        json_object *o = json_tokener_parse(line + 6);
        const char *c = httpc_jstr(o, "choices.0.delta.content");
        CHECK_MSG(!c || !c[0], "content streamed beside a forced call: %s", c);
        if (httpc_jstr(o, "choices.0.delta.tool_calls.0.function.name")) {
            calls++;
            CHECK(check_pick_arguments(httpc_jstr(o, "choices.0.delta.tool_calls.0.function.arguments")));
        }
        const char *f = httpc_jstr(o, "choices.0.finish_reason");
        finished |= f && !strcmp(f, "tool_calls");
        json_object_put(o);
    }
    httpc_reply_free(&r);
    CHECK_EQ(calls, 1);
    CHECK(finished);
}

/* ollama's /api/chat has no tool_choice of its own; llmsd reads OpenAI's there too, which
 * shows its reply side: message.tool_calls with the arguments as an object. */
static void ollama_forced_call_has_object_arguments(void)
{
    NEED();
    char body[4096];
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Which day?\"}],\"tools\":[%s],"
             "\"tool_choice\":\"required\",\"stream\":false,\"options\":{\"num_predict\":400,"
             "\"temperature\":0}}", toolmodel_pick_tool);
    int st;
    json_object *o = post("/api/chat", body, &st);
    CHECK_MSG(o && st == 200, "%d %s", st, o ? json_object_to_json_string(o) : "");
    CHECK(!strcmp(httpc_jstr(o, "message.tool_calls.0.function.name"), "pick_day"));
    json_object *calls = NULL, *msg = NULL, *fn = NULL, *args = NULL;
    json_object_object_get_ex(o, "message", &msg);
    json_object_object_get_ex(msg, "tool_calls", &calls);
    json_object_object_get_ex(json_object_array_get_idx(calls, 0), "function", &fn);
    json_object_object_get_ex(fn, "arguments", &args);
    CHECK_MSG(json_object_is_type(args, json_type_object) &&
                  check_pick_arguments(json_object_to_json_string(args)),
              "%s", json_object_to_json_string(o));
    json_object_put(o);
}

static void refusals_name_the_field(void)
{
    NEED();
    static const struct {
        const char *path, *extra, *says;
    } bad[] = {
        {"/v1/chat/completions",
         "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_time\"}}",
         "names the function 'get_time', which is not in 'tools'"},
        {"/v1/chat/completions",
         "\"tool_choice\":\"required\",\"response_format\":{\"type\":\"json_object\"}",
         "a forced 'tool_choice' and a JSON or grammar reply format"},
        {"/v1/chat/completions", "\"tool_choice\":\"always\"", "'tool_choice' must be"},
        {"/v1/chat/completions", "\"llmsd\":{\"context\":\"abc\"}", "llmsd.context"},
        {"/v1/chat/completions", "\"n\":2", "'tools' with 'n' above 1"},
    };
    char body[2048];
    int st;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        chat_body(body, sizeof body, bad[i].extra);
        json_object *o = post(bad[i].path, body, &st);
        const char *msg = o ? httpc_jstr(o, "error.message") : NULL;
        CHECK_MSG(st == 400 && msg && strstr(msg, bad[i].says), "%zu: %d %s", i, st, msg ? msg : "");
        json_object_put(o);
    }
    static const struct {
        const char *path, *body, *says;
    } malformed[] = {
        {"/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\","
         "\"function\":{\"parameters\":{}}}]}", "tools[0].function.name"},
        {"/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\","
         "\"function\":{\"name\":\"f\",\"parameters\":\"x\"}}]}", "tools[0].function.parameters"},
        {"/api/chat",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\","
         "\"function\":{\"name\":\"f\",\"parameters\":7}}]}", "tools[0].function.parameters"},
        {"/v1/completions",
         "{\"prompt\":\"x\",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}",
         "tools"},
        {"/api/generate",
         "{\"prompt\":\"x\",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}",
         "tools"},
    };
    for (size_t i = 0; i < sizeof malformed / sizeof malformed[0]; i++) {
        json_object *o = post(malformed[i].path, malformed[i].body, &st);
        const char *msg = o ? httpc_jstr(o, "error.message") : NULL;
        if (!msg && o)
            msg = httpc_jstr(o, "error");
        CHECK_MSG(st == 400 && msg && strstr(msg, malformed[i].says), "%s: %d %s",
                  malformed[i].body, st, msg ? msg : "");
        json_object_put(o);
    }
}

static void daemon_exits_cleanly(void)
{
    proc_check_clean_exit(&daemon_, &daemon_up);
}

int main(int argc, char **argv)
{
    (void)argc;
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    toolmodel_generate("tools", CALL_PIECE, "{{ '<|im_start|>' }}", NULL, NULL, 0, model_path,
                       sizeof model_path);
    RUN(prompt_is_the_templates);
    RUN(reply_calls_become_tool_calls);
    RUN(streamed_calls_are_deltas);
    RUN(ollama_chat_calls);
    RUN(forced_choice_is_one_valid_call);
    RUN(ollama_forced_call_has_object_arguments);
    RUN(refusals_name_the_field);
    RUN(daemon_exits_cleanly);
    return test_finish();
}
