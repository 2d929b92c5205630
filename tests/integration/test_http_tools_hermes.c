/*
 * Tool calling end to end in Hermes' format (daemon/net/toolcall.h), as test_http_tools
 * does it for chatml: a real llmsd of this build serving a random-weight model stored as
 * Hermes 2 Pro's and Hermes 3's GGUF files are, a chatml template with the tool_use one
 * beside it (tokenizer.chat_template.tool_use), on the synthetic vocabulary plus one token
 * whose text is a whole call. The prompts are checked by their token counts against
 * /tokenize of the renderings of NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja
 * (jinja2, Hugging Face's tojson), the replies by making the model emit the call token
 * (logit_bias) or by a forced tool_choice, whose reply is decoded against the call's
 * schema.
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

/* The call token's text: a whole call, as Qwen's */
static const char CALL_PIECE[] =
    "<tool_call>\n{\"name\":" TOOLMODEL_SP "\"get_weather\"," TOOLMODEL_SP "\"arguments\":"
    TOOLMODEL_SP "{\"city\":" TOOLMODEL_SP "\"Paris\"}}\n</tool_call>";

/* Hermes' default template (chatml) and the start of its tool_use one, as chat_detect
 * reads them */
static const char CHATML_TEMPLATE[] =
    "{{bos_token}}{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}";
static const char TOOL_USE_TEMPLATE[] =
    "{{- bos_token }}\n{{- '<|im_start|>system\n' }}\n{{- \"You are a function calling AI "
    "model. You are provided with function signatures within <tools></tools> XML tags. \" }}";

/* The template's system turn with the weather tool */
#define SYSTEM_TURN                                                                        \
    "<|im_start|>system\n"                                                                 \
    "You are a function calling AI model. You are provided with function signatures w"     \
    "ithin <tools></tools> XML tags. You may call one or more functions to assist wit"     \
    "h the user query. Don't make assumptions about what values to plug into function"     \
    "s. Here are the available tools: <tools> {\"type\": \"function\", \"function\": "     \
    "{\"name\": \"get_weather\", \"description\": \"get_weather(city: str) - Get the "     \
    "weather in a city\n"                                                                  \
    "\n"                                                                                   \
    "    Args:\n"                                                                          \
    "        city(str): \", \"parameters\": {\"type\": \"object\", \"properties\": {\""    \
    "city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}} </tools>Use the foll"     \
    "owing pydantic model json schema for each tool call you will make: {\"properties"     \
    "\": {\"name\": {\"title\": \"Name\", \"type\": \"string\"}, \"arguments\": {\"ti"     \
    "tle\": \"Arguments\", \"type\": \"object\"}}, \"required\": [\"name\", \"argumen"     \
    "ts\"], \"title\": \"FunctionCall\", \"type\": \"object\"}}\n"                         \
    "For each function call return a json object with function name and arguments wit"     \
    "hin <tool_call></tool_call> XML tags as follows:\n"                                   \
    "<tool_call>\n"                                                                        \
    "{\"name\": <function-name>, \"arguments\": <args-dict>}\n"                            \
    "</tool_call><|im_end|>\n"

/* ... of system, user with the weather tool */
static const char WANT_PROMPT[] =
    SYSTEM_TURN
    "<|im_start|>system\n"
    "Be brief.<|im_end|>\n"
    "<|im_start|>user\n"
    "Weather in Paris?<|im_end|>\n"
    "<|im_start|>assistant\n";

/* ... of user, a call, its result */
static const char WANT_HISTORY[] =
    SYSTEM_TURN
    "<|im_start|>user\n"
    "Weather?<|im_end|>\n"
    "<|im_start|>assistant\n"
    "<tool_call>\n"
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
    "</tool_call><|im_end|>\n"
    "<|im_start|>tool\n"
    "<tool_response>\n"
    "sunny\n"
    "</tool_response><|im_end|><|im_start|>assistant\n";

/* The same system and user messages without tools, as the default template (chatml)
 * renders them */
static const char WANT_CHATML[] =
    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n"
    "<|im_start|>assistant\n";

static char llmsd_path[1024], model_path[1024], hsock[700];
static llmsd_proc daemon_;
static int daemon_up;

static int start_daemon(void)
{
    return toolmodel_start(&daemon_, llmsd_path, "toolsh", model_path, hsock, sizeof hsock);
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

/* /tokenize's count of text (with BOS, as a prompt gets it); -1 when it fails. */
static int tokens_of(const char *text)
{
    json_object *req = json_object_new_object();
    json_object_object_add(req, "content", json_object_new_string(text));
    json_object_object_add(req, "add_special", json_object_new_boolean(1));
    int st;
    json_object *t = post("/tokenize", json_object_to_json_string(req), &st);
    json_object_put(req);
    int n = t && st == 200 ? atoi(httpc_jstr(t, "count")) : -1;
    json_object_put(t);
    return n;
}

/* usage.prompt_tokens of a /v1/chat/completions body; -1 when it fails. */
static int prompt_tokens(const char *body)
{
    int st;
    json_object *o = post("/v1/chat/completions", body, &st);
    int n = o && st == 200 ? atoi(httpc_jstr(o, "usage.prompt_tokens")) : -1;
    json_object_put(o);
    return n;
}

/* A chat body of system, user with the weather tool; extra: more fields (or ""). */
static void chat_body(char *out, size_t cap, const char *extra)
{
    snprintf(out, cap,
             "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\","
             "\"content\":\"Weather in Paris?\"}],\"tools\":[%s]%s%s}",
             toolmodel_weather_tool, extra[0] ? "," : "", extra);
}

/* The model is hermes (from the tool_use template beside its chatml one); its prompts
 * are the template's with tools, chatml without. */
static void prompt_is_the_templates(void)
{
    NEED();
    int st;
    json_object *o = post("/api/show", "{\"model\":\"toolsh\"}", &st);
    CHECK_MSG(o && st == 200 && !strcmp(httpc_jstr(o, "template"), "hermes"), "%d %s", st,
              o ? json_object_to_json_string(o) : "");
    json_object_put(o);
    char body[2048];
    chat_body(body, sizeof body, "\"max_tokens\":1,\"temperature\":0");
    int want = tokens_of(WANT_PROMPT);
    CHECK(want > 0);
    CHECK_EQ(prompt_tokens(body), want);
    want = tokens_of(WANT_CHATML);
    CHECK(want > 0);
    CHECK_EQ(prompt_tokens("{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                           "{\"role\":\"user\",\"content\":\"Weather in Paris?\"}],"
                           "\"max_tokens\":1}"),
             want);
}

/* The model emits the call token twice: two calls, no content. */
static void reply_calls_become_tool_calls(void)
{
    NEED();
    char body[2048];
    chat_body(body, sizeof body, "\"max_tokens\":2,\"temperature\":0,\"logit_bias\":{\"3\":100}");
    int st;
    json_object *o = post("/v1/chat/completions", body, &st);
    CHECK_MSG(o && st == 200, "%d", st);
    CHECK_MSG(!strcmp(httpc_jstr(o, "choices.0.finish_reason"), "tool_calls"), "%s",
              json_object_to_json_string(o));
    CHECK(!httpc_jstr(o, "choices.0.message.content"));
    CHECK(!strcmp(httpc_jstr(o, "choices.0.message.tool_calls.0.function.name"), "get_weather"));
    CHECK(!strcmp(httpc_jstr(o, "choices.0.message.tool_calls.1.function.arguments"),
                  "{\"city\":\"Paris\"}"));
    json_object_put(o);
}

/* A history with a call and its result, OpenAI's (arguments a string, ids) and ollama's
 * (arguments an object, no ids), prompts the template's rendering. */
static void history_is_the_templates(void)
{
    NEED();
    int want = tokens_of(WANT_HISTORY);
    CHECK(want > 0);
    char body[4096];
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"},{\"role\":\"assistant\","
             "\"content\":null,\"tool_calls\":[{\"id\":\"call_0123456789abcdef01234567\",\"type\":"
             "\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":"
             "\\\"Paris\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":"
             "\"call_0123456789abcdef01234567\",\"content\":\"sunny\"}],\"tools\":[%s],"
             "\"max_tokens\":1}", toolmodel_weather_tool);
    CHECK_EQ(prompt_tokens(body), want);
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"},{\"role\":\"assistant\","
             "\"content\":\"\",\"tool_calls\":[{\"function\":{\"name\":\"get_weather\","
             "\"arguments\":{\"city\":\"Paris\"}}}]},{\"role\":\"tool\",\"content\":\"sunny\"}],"
             "\"tools\":[%s],\"stream\":false,\"options\":{\"num_predict\":1}}",
             toolmodel_weather_tool);
    int st;
    json_object *o = post("/api/chat", body, &st);
    CHECK_MSG(o && st == 200 && atoi(httpc_jstr(o, "prompt_eval_count")) == want, "%d %s", st,
              o ? json_object_to_json_string(o) : "");
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

/* A forced named call: the prompt ends with "<tool_call>\n", the reply is the call's
 * object, decoded against its schema: one valid tool_calls entry. */
static void forced_named_call_is_one_valid_call(void)
{
    NEED();
    for (int seed = 0; seed < 3; seed++) {
        char body[4096];
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"Which day?\"}],\"tools\":[%s,%s],"
                 "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"pick_day\"}},"
                 "\"max_tokens\":400,\"seed\":%d%s}",
                 toolmodel_weather_tool, toolmodel_pick_tool, seed,
                 seed == 0 ? ",\"temperature\":0" : "");
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
}

/* What the template cannot write is 400, naming the field. */
static void unwritable_tools_are_refused(void)
{
    NEED();
    int st;
    json_object *o = post("/v1/chat/completions",
                          "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{"
                          "\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{"
                          "\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\","
                          "\"description\":7}}}}}]}", &st);
    const char *msg = o ? httpc_jstr(o, "error.message") : NULL;
    CHECK_MSG(st == 400 && msg && strstr(msg, "tools[0].function.parameters.properties.a."
                                              "description"),
              "%d %s", st, msg ? msg : "");
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
    toolmodel_generate("toolsh", CALL_PIECE, CHATML_TEMPLATE, TOOL_USE_TEMPLATE, NULL, 0,
                       model_path, sizeof model_path);
    RUN(prompt_is_the_templates);
    RUN(reply_calls_become_tool_calls);
    RUN(history_is_the_templates);
    RUN(forced_named_call_is_one_valid_call);
    RUN(unwritable_tools_are_refused);
    RUN(daemon_exits_cleanly);
    return test_finish();
}
