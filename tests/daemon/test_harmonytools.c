/*
 * Tests of gpt-oss's tools and conversations on the gateway: a tool's JSON schema as the
 * template's TypeScript-like type (daemon/net/harmonytools.h; the expected texts are
 * what its render_tool_namespace and render_typescript_type macros write, with Jinja's
 * trim_blocks and lstrip_blocks, written out by hand), and OpenAI's and ollama's
 * messages (calls, results, reasoning sent back) rendered through toolcall.h for the
 * gpt-oss family; a named tool_choice as the call's header, "required" refused.
 */
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/net/harmonytools.h"
#include "daemon/net/toolcall.h"
#include "tests/support/test.h"

static const struct {
    const char *tool, *want;
} TOOLS[] = {
    {"{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Get the "
     "weather in a city\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":"
     "\"string\",\"description\":\"The city\"},\"unit\":{\"type\":\"string\",\"enum\":[\"c\","
     "\"f\"],\"default\":\"c\"}},\"required\":[\"city\"]}}}",
     "// Get the weather in a city\ntype get_weather = (_: {\n// The city\ncity: string,\n"
     "unit?: \"c\" | \"f\", // default: c,\n}) => any;\n\n"},
    /* no parameters, or none with properties */
    {"{\"type\":\"function\",\"function\":{\"name\":\"now\",\"description\":\"The time\"}}",
     "// The time\ntype now = () => any;\n\n"},
    {"{\"type\":\"function\",\"function\":{\"name\":\"now\",\"description\":\"\",\"parameters\":"
     "{\"type\":\"object\",\"properties\":{}}}}",
     "// \ntype now = () => any;\n\n"},
    /* every kind of type */
    {"{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"d\",\"parameters\":{"
     "\"type\":\"object\",\"properties\":{"
     "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},"
     "\"ids\":{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"nullable\":true},"
     "\"any\":{\"type\":\"array\"},"
     "\"pts\":{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":"
     "\"number\"}},\"required\":[\"x\"]}},"
     "\"big\":{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":"
     "\"string\"},\"b\":{\"type\":\"string\"}}}},"
     "\"n\":{\"type\":[\"string\",\"number\"]},"
     "\"flag\":{\"type\":\"boolean\",\"default\":false},"
     "\"count\":{\"type\":\"integer\",\"default\":3,\"description\":\"How many\"},"
     "\"name\":{\"type\":\"string\",\"nullable\":true,\"default\":\"x\\\"y\"},"
     "\"v\":{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"number\",\"description\":\"a count\"}]},"
     "\"o\":{\"type\":\"object\"},"
     "\"e\":{\"enum\":[\"a\",\"b\"]}"
     "},\"required\":[\"n\",\"e\"]}}}",
     "// d\ntype f = (_: {\n"
     "tags?: string[],\n"
     "ids?: number[] | null,\n"
     "any?: any[],\n"
     "pts?: {\nx: \n                number}[],\n"
     "big?: any[],\n"
     "n: string | number,\n"
     "flag?: boolean, // default: false,\n"
     "// How many\ncount?: number, // default: 3,\n"
     "name?: string | null, // default: \"x\\\"y\",\n"
     "v?: string | \nnumber// a count,\n"
     "o?: object,\n"
     "e: any,\n"
     "}) => any;\n\n"},
};

static void tools_as_typescript(void)
{
    for (size_t i = 0; i < sizeof TOOLS / sizeof TOOLS[0]; i++) {
        json_object *t = json_tokener_parse(TOOLS[i].tool);
        CHECK_MSG(t, "tool %zu does not parse", i);
        char *got = harmonytools_text(t);
        CHECK_MSG(got && !strcmp(got, TOOLS[i].want), "tool %zu:\n%s\nwant:\n%s", i,
                  got ? got : "(null)", TOOLS[i].want);
        free(got);
        json_object_put(t);
    }
}

#define SYS_TOOLS                                                                           \
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n" \
    "Knowledge cutoff: 2024-06\nCurrent date: 2025-08-05\n\nReasoning: high\n\n# Valid "     \
    "channels: analysis, commentary, final. Channel must be included for every message.\n"   \
    "Calls to these tools must go to the commentary channel: 'functions'.<|end|>"

/* OpenAI's messages (arguments as a string, reasoning_content) and ollama's (arguments as
 * an object, thinking) give the template's prompt */
static void messages_render_as_its_template(void)
{
    static const char *const assistant[] = {
        "\"content\":null,\"reasoning_content\":\"Need it.\",\"tool_calls\":[{\"id\":\"call_1\","
        "\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":"
        "\"{\\\"city\\\":\\\"Paris\\\"}\"}}]",
        "\"content\":\"\",\"thinking\":\"Need it.\",\"tool_calls\":[{\"function\":{\"name\":"
        "\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}}]",
    };
    for (size_t i = 0; i < 2; i++) {
        char body[4096];
        snprintf(body, sizeof body,
                 "{\"tools\":[%s],\"messages\":[{\"role\":\"developer\",\"content\":\"Be "
                 "brief.\"},{\"role\":\"user\",\"content\":\"Weather in Paris?\"},"
                 "{\"role\":\"assistant\",%s},{\"role\":\"tool\",\"content\":\"22 C\"}]}",
                 TOOLS[0].tool, assistant[i]);
        json_object *o = json_tokener_parse(body), *msgs;
        CHECK(o && json_object_object_get_ex(o, "messages", &msgs));
        toolcall_set ts;
        char msg[256];
        CHECK_EQ(toolcall_read(o, CHAT_GPT_OSS, &ts, msg, sizeof msg), 0);
        char *got = toolcall_render(&ts, msgs, "2025-08-05", true, "high", msg, sizeof msg);
        const char *want =
            SYS_TOOLS "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n# Tools\n\n"
                      "## functions\n\nnamespace functions {\n\n// Get the weather in a city\n"
                      "type get_weather = (_: {\n// The city\ncity: string,\nunit?: \"c\" | \"f\", "
                      "// default: c,\n}) => any;\n\n} // namespace functions<|end|><|start|>user"
                      "<|message|>Weather in Paris?<|end|><|start|>assistant<|channel|>analysis"
                      "<|message|>Need it.<|end|><|start|>assistant to=functions.get_weather"
                      "<|channel|>commentary json<|message|>{\"city\": \"Paris\"}<|call|><|start|>"
                      "functions.get_weather to=assistant<|channel|>commentary<|message|>\"22 C\""
                      "<|end|><|start|>assistant";
        CHECK_MSG(got && !strcmp(got, want), "%s", got ? got : msg);
        free(got);
        toolcall_set_free(&ts);
        json_object_put(o);
    }
}

/* Refused: "required" (a call of any function is a header the reply writes, which a JSON
 * Schema cannot constrain), a result before a call */
static void refusals(void)
{
    json_object *o = json_tokener_parse("{\"tool_choice\":\"required\",\"tools\":[{\"type\":"
                                        "\"function\",\"function\":{\"name\":\"f\"}}]}");
    toolcall_set ts;
    char msg[256];
    CHECK_EQ(toolcall_read(o, CHAT_GPT_OSS, &ts, msg, sizeof msg), -1);
    CHECK_MSG(strstr(msg, "tool_choice"), "%s", msg);
    toolcall_set_free(&ts);
    json_object_put(o);
    o = json_tokener_parse("{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":"
                           "\"tool\",\"content\":\"x\"}]}");
    json_object *msgs = json_object_object_get(o, "messages");
    CHECK_EQ(toolcall_read(o, CHAT_GPT_OSS, &ts, msg, sizeof msg), 0);
    char *got = toolcall_render(&ts, msgs, "2025-08-05", true, NULL, msg, sizeof msg);
    CHECK(!got);
    CHECK_MSG(strstr(msg, "gpt-oss"), "%s", msg);
    toolcall_set_free(&ts);
    json_object_put(o);
}

/* A named tool_choice: the prompt ends with the call's header, the reply (decoded against
 * the function's parameters) is its arguments alone, read as the call; a reply cut short
 * is its own text. */
static void named_choice_ends_the_prompt_with_the_call(void)
{
    char body[2048];
    snprintf(body, sizeof body,
             "{\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":"
             "\"get_weather\"}},\"tools\":[%s],\"messages\":[{\"role\":\"user\","
             "\"content\":\"Weather in Paris?\"}]}",
             TOOLS[0].tool);
    json_object *o = json_tokener_parse(body), *msgs;
    CHECK(o && json_object_object_get_ex(o, "messages", &msgs));
    toolcall_set ts;
    char msg[256];
    CHECK_EQ(toolcall_read(o, CHAT_GPT_OSS, &ts, msg, sizeof msg), 0);
    const char *tail = "<|start|>user<|message|>Weather in Paris?<|end|><|start|>assistant"
                       "<|channel|>commentary to=functions.get_weather <|constrain|>json"
                       "<|message|>";
    char *got = toolcall_render(&ts, msgs, "2025-08-05", true, NULL, msg, sizeof msg);
    CHECK_MSG(got && strlen(got) > strlen(tail) && !strcmp(got + strlen(got) - strlen(tail), tail),
              "%s", got ? got : msg);
    free(got);
    /* the reply's schema: the function's parameters */
    json_object *schema = json_tokener_parse(ts.schema), *params;
    CHECK(json_object_object_get_ex(json_object_object_get(json_object_array_get_idx(
                                        json_object_object_get(o, "tools"), 0), "function"),
                                    "parameters", &params));
    CHECK_MSG(schema && json_object_equal(schema, params), "%s", ts.schema);
    json_object_put(schema);
    static const struct {
        const char *reply, *content, *args;
    } replies[] = {
        {"{\"city\": \"Paris\"}", "", "{\"city\":\"Paris\"}"},
        {"{\"city\": \"Par", "{\"city\": \"Par", NULL},
    };
    for (size_t i = 0; i < 2; i++) {
        toolcall_scan *s = toolcall_scan_new(&ts);
        toolcall_out out;
        CHECK(s && toolcall_scan_feed(s, replies[i].reply, strlen(replies[i].reply), true,
                                      &out) == 0);
        json_object *call = json_object_array_get_idx(out.calls, 0);
        CHECK_MSG(!strcmp(out.content ? out.content : "", replies[i].content), "%zu: '%s'", i,
                  out.content);
        if (replies[i].args)
            CHECK_MSG(json_object_array_length(out.calls) == 1 &&
                          !strcmp(json_object_get_string(json_object_object_get(call, "name")),
                                  "get_weather") &&
                          !strcmp(toolcall_arguments_text(call), replies[i].args),
                      "%zu: %s", i, json_object_to_json_string(out.calls));
        else
            CHECK_EQ(json_object_array_length(out.calls), 0);
        toolcall_out_free(&out);
        toolcall_scan_free(s);
    }
    toolcall_set_free(&ts);
    json_object_put(o);
}

int main(void)
{
    RUN(tools_as_typescript);
    RUN(messages_render_as_its_template);
    RUN(refusals);
    RUN(named_choice_ends_the_prompt_with_the_call);
    return test_finish();
}
