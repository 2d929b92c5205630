/*
 * Tests of tool calling's JSON side (daemon/net/toolcall.h): tools read and refused,
 * OpenAI's and ollama's messages rendered (each tool written as the template's tojson
 * writes it: the expected prompts are Qwen2.5-7B-Instruct's and Mistral-Nemo-Instruct-
 * 2407's own renderings; Hermes' tools and prompts are its tool_use template's, Hermes 2
 * Pro's and Hermes 3's one text), and replies scanned for calls, whole and piece by piece.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/net/toolcall.h"
#include "engine/model/jsonmask.h"
#include "engine/model/jsonschema.h"
#include "tests/support/test.h"

static const char WEATHER_TOOL[] =
    "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Get the "
    "weather in a city\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":"
    "\"string\",\"description\":\"the city\"},\"unit\":{\"type\":\"string\",\"enum\":[\"celsius\","
    "\"fahrenheit\"]}},\"required\":[\"city\"]}}}";

/* Qwen-Qwen2.5-7B-Instruct.jinja of system, user, a get_weather call, its result, user */
static const char CHATML_ONE_TOOL[] =
    "<|im_start|>system\n"
    "You are a helpful assistant.\n"
    "\n"
    "# Tools\n"
    "\n"
    "You may call one or more functions to assist with the user query.\n"
    "\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>\n"
    "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"descripti"
    "on\": \"Get the weather in a city\", \"parameters\": {\"type\": \"object\", \""
    "properties\": {\"city\": {\"type\": \"string\", \"description\": \"the city\"}"
    ", \"unit\": {\"type\": \"string\", \"enum\": [\"celsius\", \"fahrenheit\"]}}, "
    "\"required\": [\"city\"]}}}\n"
    "</tools>\n"
    "\n"
    "For each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n"
    "<tool_call>\n"
    "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\n"
    "What is the weather in Paris?<|im_end|>\n"
    "<|im_start|>assistant\n"
    "<tool_call>\n"
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c"
    "elsius\"}}\n"
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\n"
    "<tool_response>\n"
    "{\"temperature\": 22}\n"
    "</tool_response><|im_end|>\n"
    "<|im_start|>user\n"
    "And in Rome?<|im_end|>\n"
    "<|im_start|>assistant\n";

/* tojson(indent=4) of the get_weather tool (Llama 3.x) */
static const char WEATHER_INDENTED[] =
    "{\n"
    "    \"type\": \"function\",\n"
    "    \"function\": {\n"
    "        \"name\": \"get_weather\",\n"
    "        \"description\": \"Get the weather in a city\",\n"
    "        \"parameters\": {\n"
    "            \"type\": \"object\",\n"
    "            \"properties\": {\n"
    "                \"city\": {\n"
    "                    \"type\": \"string\",\n"
    "                    \"description\": \"the city\"\n"
    "                },\n"
    "                \"unit\": {\n"
    "                    \"type\": \"string\",\n"
    "                    \"enum\": [\n"
    "                        \"celsius\",\n"
    "                        \"fahrenheit\"\n"
    "                    ]\n"
    "                }\n"
    "            },\n"
    "            \"required\": [\n"
    "                \"city\"\n"
    "            ]\n"
    "        }\n"
    "    }\n"
    "}";

/* NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja of system, user, a get_weather call,
 * its result, user */
static const char HERMES_ONE_TOOL[] =
    "<|im_start|>system\n"
    "You are a function calling AI model. You are provided with function signatures w"
    "ithin <tools></tools> XML tags. You may call one or more functions to assist wit"
    "h the user query. Don't make assumptions about what values to plug into function"
    "s. Here are the available tools: <tools> {\"type\": \"function\", \"function\": "
    "{\"name\": \"get_weather\", \"description\": \"get_weather(city: str, unit: str)"
    " - Get the weather in a city\n"
    "\n"
    "    Args:\n"
    "        city(str): the city        unit(str): \", \"parameters\": {\"type\": \"o"
    "bject\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"th"
    "e city\"}, \"unit\": {\"type\": \"string\", \"enum\": [\"celsius\", \"fahrenheit"
    "\"]}}, \"required\": [\"city\"]}} </tools>Use the following pydantic model json "
    "schema for each tool call you will make: {\"properties\": {\"name\": {\"title\":"
    " \"Name\", \"type\": \"string\"}, \"arguments\": {\"title\": \"Arguments\", \"ty"
    "pe\": \"object\"}}, \"required\": [\"name\", \"arguments\"], \"title\": \"Functi"
    "onCall\", \"type\": \"object\"}}\n"
    "For each function call return a json object with function name and arguments wit"
    "hin <tool_call></tool_call> XML tags as follows:\n"
    "<tool_call>\n"
    "{\"name\": <function-name>, \"arguments\": <args-dict>}\n"
    "</tool_call><|im_end|>\n"
    "<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\n"
    "What is the weather in Paris?<|im_end|>\n"
    "<|im_start|>assistant\n"
    "<tool_call>\n"
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"cel"
    "sius\"}}\n"
    "</tool_call><|im_end|>\n"
    "<|im_start|>tool\n"
    "<tool_response>\n"
    "{\"temperature\": 22}\n"
    "</tool_response>\n"
    "<|im_end|><|im_start|>user\n"
    "And in Rome?<|im_end|>\n"
    "<|im_start|>assistant\n";

/* Reads {"tools": [tool], extra...} for family f: 0 or -1, msg says why. */
static int read_tools(enum chat_family f, const char *tool, const char *extra, toolcall_set *ts,
                      char *msg, size_t cap)
{
    char body[2048];
    snprintf(body, sizeof body, "{\"tools\":[%s]%s%s}", tool, extra[0] ? "," : "", extra);
    json_object *o = json_tokener_parse(body);
    msg[0] = '\0';
    int rc = o ? toolcall_read(o, f, ts, msg, cap) : -2;
    /* the names and parameters point into the body: the test only looks at the rest */
    for (size_t i = 0; i < ts->n; i++) {
        ts->names[i] = "get_weather";
        ts->params[i] = NULL;
    }
    json_object_put(o);
    return rc;
}

static void tools_are_written_as_tojson(void)
{
    toolcall_set ts;
    char msg[256];
    CHECK_EQ(read_tools(CHAT_LLAMA3, WEATHER_TOOL, "", &ts, msg, sizeof msg), 0);
    CHECK_EQ(ts.n, 1);
    CHECK_MSG(!strcmp(ts.defs[0], WEATHER_INDENTED), "%s", ts.defs[0]);
    CHECK(ts.parse && !ts.first_only);
    toolcall_set_free(&ts);
}

/* Mistral Nemo's template writes a tool itself: "type" and "function" whatever the tool
 * holds, the function's keys but "return", strings unescaped (its rendering of this tool) */
static void mistral_tools_are_written_as_its_template(void)
{
    static const char tool[] =
        "{\"function\":{\"name\":\"now\",\"description\":\"Say \\\"hi\\\" \xc3\xa9\",\"return\":"
        "{\"type\":\"string\"},\"parameters\":{\"type\":\"object\",\"properties\":{\"tz\":"
        "{\"type\":\"string\",\"default\":\"UTC\"}}},\"strict\":true}}";
    static const char want[] =
        "{\"type\": \"function\", \"function\": {\"name\": \"now\", \"description\": \"Say \"hi\" "
        "\xc3\xa9\", \"parameters\": {\"type\": \"object\", \"properties\": {\"tz\": {\"type\": "
        "\"string\", \"default\": \"UTC\"}}}, \"strict\": true}}";
    toolcall_set ts;
    char msg[256];
    CHECK_EQ(read_tools(CHAT_MISTRAL_V3_TEKKEN, tool, "", &ts, msg, sizeof msg), 0);
    CHECK_EQ(ts.n, 1);
    CHECK_MSG(!strcmp(ts.defs[0], want), "%s", ts.defs[0]);
    toolcall_set_free(&ts);
}

/* A tool of many parameter kinds: nested objects, an array, an enum, optional ones, one
 * without a type, a list of types, maps, a return, descriptions to trim or quote */
static const char BOOK_TOOL[] =
    "{\"type\":\"function\",\"function\":{\"name\":\"book_trip\",\"description\":\"Book a "
    "\\\"trip\\\" \xe2\x80\x93 \xc3\xa9\",\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"destination\":{\"type\":\"string\",\"description\":\"  where to\\n \"},\"nights\":{"
    "\"type\":\"integer\",\"description\":\"how many nights\",\"minimum\":1},\"travellers\":{"
    "\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":"
    "\"string\"},\"age\":{\"type\":\"integer\"}}},\"description\":\"who travels\"},\"class\":{"
    "\"type\":\"string\",\"enum\":[\"economy\",\"business\"]},\"budget\":{\"type\":[\"number\","
    "\"integer\"],\"description\":\"at most\"},\"extras\":{\"type\":\"object\","
    "\"additionalProperties\":{\"type\":\"boolean\"},\"description\":\"options\"},\"tags\":{"
    "\"type\":\"object\",\"additionalProperties\":false},\"notes\":{\"description\":\"free "
    "text\"},\"flexible\":{\"type\":\"boolean\"},\"any\":{\"type\":null}},\"required\":["
    "\"destination\",\"nights\"]},\"return\":{\"type\":\"string\",\"description\":\"the "
    "booking reference\"}}}";

/* The Hermes tool_use template's text of BOOK_TOOL: Python-like types (its
 * json_to_python_type: an array's items are lost to "list[Union[]]", a map's values kept,
 * no type "Union[]", a null one "Any"), each "Args:" line after the other, descriptions
 * trimmed, the function's as it is (quotes unescaped) */
static const char HERMES_BOOK[] =
    "{\"type\": \"function\", \"function\": {\"name\": \"book_trip\", \"description\""
    ": \"book_trip(destination: str, nights: int, travellers: list[Union[]], class: s"
    "tr, budget: Union[float,int], extras: dict[str, bool], tags: dict[str, Union[]],"
    " notes: Union[], flexible: bool, any: Any) -> str - Book a \"trip\" \xe2\x80\x93 \xc3\xa9\n"
    "\n"
    "    Args:\n"
    "        destination(str): where to        nights(int): how many nights        tr"
    "avellers(list[Union[]]): who travels        class(str):         budget(Union[flo"
    "at,int]): at most        extras(dict[str, bool]): options        tags(dict[str, "
    "Union[]]):         notes(Union[]): free text        flexible(bool):         any("
    "Any): \n"
    "    Returns:\n"
    "        the booking reference\", \"parameters\": {\"type\": \"object\", \"proper"
    "ties\": {\"destination\": {\"type\": \"string\", \"description\": \"  where to\\"
    "n \"}, \"nights\": {\"type\": \"integer\", \"description\": \"how many nights\","
    " \"minimum\": 1}, \"travellers\": {\"type\": \"array\", \"items\": {\"type\": \""
    "object\", \"properties\": {\"name\": {\"type\": \"string\"}, \"age\": {\"type\":"
    " \"integer\"}}}, \"description\": \"who travels\"}, \"class\": {\"type\": \"stri"
    "ng\", \"enum\": [\"economy\", \"business\"]}, \"budget\": {\"type\": [\"number\""
    ", \"integer\"], \"description\": \"at most\"}, \"extras\": {\"type\": \"object\""
    ", \"additionalProperties\": {\"type\": \"boolean\"}, \"description\": \"options\""
    "}, \"tags\": {\"type\": \"object\", \"additionalProperties\": false}, \"notes\":"
    " {\"description\": \"free text\"}, \"flexible\": {\"type\": \"boolean\"}, \"any\""
    ": {\"type\": null}}, \"required\": [\"destination\", \"nights\"]}}";

/* Hermes' tools are written as its template's loop writes them. A function without
 * parameters or a description (the template raises on either) is written as one with
 * "parameters": {} and "description": "" (the template's rendering of those), as is one
 * whose parameters have no properties. */
static void hermes_tools_are_written_as_its_template(void)
{
    static const struct {
        const char *tool, *want;
    } T[] = {
        {BOOK_TOOL, HERMES_BOOK},
        {"{\"type\":\"function\",\"function\":{\"name\":\"now\"}}",
         "{\"type\": \"function\", \"function\": {\"name\": \"now\", \"description\": \"now"
         "() - \n\n\", \"parameters\": {}}"},
        {"{\"type\":\"function\",\"function\":{\"name\":\"ping\",\"description\":\"Ping\","
         "\"parameters\":{\"type\":\"object\",\"properties\":{}}}}",
         "{\"type\": \"function\", \"function\": {\"name\": \"ping\", \"description\": \"ping"
         "() - Ping\n\n\", \"parameters\": {}}"},
        /* a type name the template does not know makes its json_to_python_type recurse
         * until Python gives up (it takes the string for a list of types): "Any", the
         * template's answer for a type it does not know */
        {"{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"d\","
         "\"parameters\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":[\"string\","
         "\"null\"]},\"b\":{\"type\":\"null\"}}}}}",
         "{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"f(a: "
         "Union[str,Any], b: Any) - d\n\n    Args:\n        a(Union[str,Any]):         "
         "b(Any): \", \"parameters\": {\"type\": \"object\", \"properties\": {\"a\": {\"type"
         "\": [\"string\", \"null\"]}, \"b\": {\"type\": \"null\"}}}}"},
    };
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++) {
        toolcall_set ts;
        char msg[256];
        CHECK_MSG(read_tools(CHAT_HERMES, T[i].tool, "", &ts, msg, sizeof msg) == 0, "%zu: %s",
                  i, msg);
        CHECK_EQ(ts.n, 1);
        size_t at = 0;
        while (ts.defs[0][at] && ts.defs[0][at] == T[i].want[at])
            at++;
        CHECK_MSG(!strcmp(ts.defs[0], T[i].want), "%zu differs at %zu: '%s'", i, at,
                  ts.defs[0] + at);
        toolcall_set_free(&ts);
    }
}

static void malformed_tools_and_choices_are_refused(void)
{
    static const struct {
        enum chat_family family;
        const char *tool, *extra, *says;
    } bad[] = {
        {CHAT_CHATML, "{\"type\":\"function\",\"function\":{\"parameters\":{}}}", "",
         "tools[0].function.name"},
        {CHAT_CHATML, "{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":[1]}}",
         "", "tools[0].function.parameters"},
        {CHAT_CHATML, "{\"type\":\"retrieval\",\"function\":{\"name\":\"f\"}}", "",
         "tools[0].type"},
        {CHAT_CHATML, "\"f\"", "", "tools[0]"},
        {CHAT_CHATML, "{\"type\":\"function\",\"function\":{\"name\":\"f\"}}",
         "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"g\"}}",
         "names the function 'g', which is not in 'tools'"},
        {CHAT_CHATML, "{\"type\":\"function\",\"function\":{\"name\":\"f\"}}",
         "\"tool_choice\":{\"type\":\"function\"}", "'tool_choice' must be"},
        {CHAT_CHATML, "{\"type\":\"function\",\"function\":{\"name\":\"f\"}}",
         "\"tool_choice\":\"sometimes\"", "tool_choice"},
        {CHAT_ZEPHYR, "{\"type\":\"function\",\"function\":{\"name\":\"f\"}}", "",
         "no tool format"},
        /* where Hermes' template raises: properties that are no object, a description
         * that is no string (it would write Python's str() of it) */
        {CHAT_HERMES, "{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
         "{\"properties\":[1]}}}", "", "tools[0].function.parameters.properties"},
        {CHAT_HERMES, "{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
         "{\"properties\":{\"a\":{\"description\":3}}}}}", "",
         "tools[0].function.parameters.properties.a.description"},
        {CHAT_HERMES, "{\"type\":\"function\",\"function\":{\"name\":\"f\",\"return\":"
         "{\"description\":null}}}", "", "tools[0].function.return.description"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        toolcall_set ts;
        char msg[256];
        CHECK_EQ(read_tools(bad[i].family, bad[i].tool, bad[i].extra, &ts, msg, sizeof msg), -1);
        CHECK_MSG(strstr(msg, bad[i].says), "%zu: %s", i, msg);
        toolcall_set_free(&ts);
    }
}

static void choice_none_and_one_call_are_read(void)
{
    toolcall_set ts;
    char msg[256];
    CHECK_EQ(read_tools(CHAT_CHATML, WEATHER_TOOL,
                        "\"tool_choice\":\"none\",\"parallel_tool_calls\":false", &ts, msg,
                        sizeof msg), 0);
    CHECK(!ts.parse && ts.first_only && ts.n == 1);
    toolcall_set_free(&ts);
    /* no tools: nothing to do, whatever tool_choice "auto" says */
    json_object *o = json_tokener_parse("{\"tools\":[],\"tool_choice\":\"auto\"}");
    CHECK_EQ(toolcall_read(o, CHAT_ZEPHYR, &ts, msg, sizeof msg), 0);
    CHECK_EQ(ts.n, 0);
    toolcall_set_free(&ts);
    json_object_put(o);
}

/* A forced tool_choice: the call's schema (the family's argument key, the function's
 * parameters), which the engine compiles; a reply read as the call's body, whole, or cut
 * short (then its own text, without the markers put around it). */
static void forced_choice_builds_the_schema(void)
{
    static const struct {
        enum chat_family family;
        const char *args_key, *reply;
    } fams[] = {
        {CHAT_CHATML, "\"arguments\"", "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}"},
        {CHAT_LLAMA3, "\"parameters\"", "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}"},
        /* the prompt ends with "[TOOL_CALLS][": the reply is the array's one item */
        {CHAT_MISTRAL_V3_TEKKEN, "\"arguments\"",
         "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}"},
        {CHAT_HERMES, "\"arguments\"", "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}"},
    };
    for (size_t f = 0; f < sizeof fams / sizeof fams[0]; f++) {
        json_object *body = json_tokener_parse(
            "{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
            "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"
            "\"required\":[\"city\"]}}},{\"type\":\"function\",\"function\":{\"name\":\"now\"}}],"
            "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}}");
        toolcall_set ts;
        char msg[256], err[ERR_MAX];
        CHECK_EQ(toolcall_read(body, fams[f].family, &ts, msg, sizeof msg), 0);
        CHECK(ts.forced && ts.forced_fn == 0);
        CHECK_MSG(ts.schema && strstr(ts.schema, "{\"const\":\"get_weather\"}") &&
                      strstr(ts.schema, fams[f].args_key) && strstr(ts.schema, "\"city\""),
                  "%s", ts.schema ? ts.schema : "(none)");
        jsonschema *js = NULL;
        CHECK_MSG(jsonschema_compile(ts.schema, strlen(ts.schema), &js, err) == 0, "%s", err);
        jsonschema_free(js);
        Llms__GenerationParams p = LLMS__GENERATION_PARAMS__INIT;
        CHECK_EQ(toolcall_constrain(&ts, &p, msg, sizeof msg), 0);
        CHECK(p.format == LLMS__RESPONSE_FORMAT__FORMAT_JSON_SCHEMA && p.json_schema == ts.schema);
        toolcall_scan *sc = toolcall_scan_new(&ts);
        toolcall_out out;
        const char *reply = fams[f].reply;
        CHECK_EQ(toolcall_scan_feed(sc, reply, strlen(reply), true, &out), 0);
        CHECK_EQ(json_object_array_length(out.calls), 1);
        CHECK_EQ(out.content_len, 0);
        CHECK_EQ(toolcall_scan_fed(sc), strlen(reply));
        toolcall_out_free(&out);
        toolcall_scan_free(sc);
        /* cut short by max_tokens: the reply's own text */
        sc = toolcall_scan_new(&ts);
        CHECK_EQ(toolcall_scan_feed(sc, reply, 20, false, &out), 0);
        CHECK_EQ(out.content_len, 0); /* held: it is the call */
        toolcall_out_free(&out);
        CHECK_EQ(toolcall_scan_feed(sc, "", 0, true, &out), 0);
        CHECK_EQ(json_object_array_length(out.calls), 0);
        CHECK_MSG(out.content_len == 20 && !memcmp(out.content, reply, 20), "'%.*s'",
                  (int)out.content_len, out.content ? out.content : "");
        toolcall_out_free(&out);
        toolcall_scan_free(sc);
        toolcall_set_free(&ts);
        json_object_put(body);
    }
    /* "required" among two functions: one of their calls, the name choosing whose
     * parameters the arguments follow (a tagged union); without tools: refused */
    json_object *body = json_tokener_parse(
        "{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"parameters\":{"
        "\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"}},\"required\":[\"x\"]}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"b\"}}],\"tool_choice\":\"required\"}");
    toolcall_set ts;
    char msg[256], err[ERR_MAX];
    CHECK_EQ(toolcall_read(body, CHAT_CHATML, &ts, msg, sizeof msg), 0);
    CHECK(ts.forced && ts.forced_fn == TOOLCALL_ANY_FN);
    jsonschema *js = NULL;
    CHECK_MSG(jsonschema_compile(ts.schema, strlen(ts.schema), &js, err) == 0, "%s: %s",
              ts.schema, err);
    static const struct {
        const char *reply;
        bool valid;
    } replies[] = {
        {"{\"name\": \"a\", \"arguments\": {\"x\": 3}}", true},
        {"{\"name\": \"b\", \"arguments\": {}}", true},
        {"{\"name\": \"a\", \"arguments\": {}}", false},       /* a's x is required */
        {"{\"name\": \"b\", \"arguments\": {\"x\": 3}}", false}, /* b takes none */
        {"{\"name\": \"c\"", false},
    };
    for (size_t i = 0; js && i < sizeof replies / sizeof *replies; i++) {
        jsonmask_state st;
        jsonmask_init_schema(&st, js);
        bool whole = jsonmask_feed(&st, replies[i].reply, strlen(replies[i].reply)) &&
                     jsonmask_complete(&st);
        CHECK_MSG(whole == replies[i].valid, "%s: %d", replies[i].reply, whole);
    }
    jsonschema_free(js);
    toolcall_set_free(&ts);
    json_object_put(body);
    body = json_tokener_parse("{\"tool_choice\":\"required\"}");
    CHECK_EQ(toolcall_read(body, CHAT_CHATML, &ts, msg, sizeof msg), -1);
    CHECK_MSG(strstr(msg, "there are no 'tools'"), "%s", msg);
    toolcall_set_free(&ts);
    json_object_put(body);
}

/* OpenAI's messages (arguments as a JSON string, null content) and ollama's (arguments
 * as an object) render as the template does. */
static void messages_render_as_the_template(void)
{
    static const char *const calls[] = {
        "\"content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"function\":"
        "{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\",\\\"unit\\\":"
        "\\\"celsius\\\"}\"}}]",
        "\"content\":\"\",\"tool_calls\":[{\"function\":{\"name\":\"get_weather\",\"arguments\":"
        "{\"city\":\"Paris\",\"unit\":\"celsius\"}}}]",
    };
    for (size_t i = 0; i < 2; i++) {
        char body[4096];
        snprintf(body, sizeof body,
                 "{\"tools\":[%s],\"messages\":[{\"role\":\"system\",\"content\":\"You are a "
                 "helpful assistant.\"},{\"role\":\"user\",\"content\":\"What is the weather in "
                 "Paris?\"},{\"role\":\"assistant\",%s},{\"role\":\"tool\",\"tool_call_id\":"
                 "\"call_1\",\"content\":\"{\\\"temperature\\\": 22}\"},{\"role\":\"user\","
                 "\"content\":\"And in Rome?\"}]}",
                 WEATHER_TOOL, calls[i]);
        json_object *o = json_tokener_parse(body), *msgs;
        CHECK(o && json_object_object_get_ex(o, "messages", &msgs));
        toolcall_set ts;
        char msg[256];
        CHECK_EQ(toolcall_read(o, CHAT_CHATML, &ts, msg, sizeof msg), 0);
        char *got = toolcall_render(&ts, msgs, "26 Jul 2024", true, NULL, msg, sizeof msg);
        CHECK_MSG(got && !strcmp(got, CHATML_ONE_TOOL), "%s", got ? got : msg);
        free(got);
        toolcall_set_free(&ts);
        json_object_put(o);
    }
}

/* OpenAI's messages render as Hermes' template does (arguments, a string, written as the
 * object they hold); a forced call's prompt ends with its opening. */
static void hermes_messages_render_as_its_template(void)
{
    for (int forced = 0; forced < 2; forced++) {
        char body[4096];
        snprintf(body, sizeof body,
                 "{\"tools\":[%s],%s\"messages\":[{\"role\":\"system\",\"content\":\"You are a "
                 "helpful assistant.\"},{\"role\":\"user\",\"content\":\"What is the weather in "
                 "Paris?\"},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":"
                 "\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                 "\"arguments\":\"{\\\"city\\\":\\\"Paris\\\",\\\"unit\\\":\\\"celsius\\\"}\"}}]},"
                 "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"{\\\"temperature"
                 "\\\": 22}\"},{\"role\":\"user\",\"content\":\"And in Rome?\"}]}",
                 WEATHER_TOOL, forced ? "\"tool_choice\":\"required\"," : "");
        json_object *o = json_tokener_parse(body), *msgs;
        CHECK(o && json_object_object_get_ex(o, "messages", &msgs));
        toolcall_set ts;
        char msg[256], want[sizeof HERMES_ONE_TOOL + 16];
        CHECK_EQ(toolcall_read(o, CHAT_HERMES, &ts, msg, sizeof msg), 0);
        snprintf(want, sizeof want, "%s%s", HERMES_ONE_TOOL, forced ? "<tool_call>\n" : "");
        char *got = toolcall_render(&ts, msgs, "26 Jul 2024", true, NULL, msg, sizeof msg);
        CHECK_MSG(got && !strcmp(got, want), "%s", got ? got : msg);
        free(got);
        toolcall_set_free(&ts);
        json_object_put(o);
    }
}

/* Mistral-Nemo-Instruct-2407.jinja of system, user, a get_weather call with the id %s, its
 * result, a reply, user (the ids where %s stands: OpenAI's mapped to their last 9 letters
 * and digits, none at all to the call's position) */
static const char MISTRAL_CALL_RESULT[] =
    "[INST]What is the weather in Paris?[/INST][TOOL_CALLS][{\"name\": \"get_weather\", "
    "\"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}, \"id\": \"%s\"}]</s>"
    "[TOOL_RESULTS]{\"content\": {\"temperature\": 22}, \"call_id\": \"%s\"}[/TOOL_RESULTS]"
    "22 degrees.</s>[AVAILABLE_TOOLS][{\"type\": \"function\", \"function\": {\"name\": "
    "\"get_weather\", \"description\": \"Get the weather in a city\", \"parameters\": {\"type\": "
    "\"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"the "
    "city\"}, \"unit\": {\"type\": \"string\", \"enum\": [\"celsius\", \"fahrenheit\"]}}, "
    "\"required\": [\"city\"]}}}][/AVAILABLE_TOOLS][INST]You are a helpful assistant.\n\n"
    "And in Rome?[/INST]";

/* Renders {"tools": [WEATHER_TOOL], "messages": [messages]} for Mistral Nemo: fresh, or
 * NULL with msg. */
static char *render_mistral(const char *messages, char *msg, size_t cap)
{
    char body[4096];
    snprintf(body, sizeof body, "{\"tools\":[%s],\"messages\":[%s]}", WEATHER_TOOL, messages);
    json_object *o = json_tokener_parse(body), *msgs = NULL;
    json_object_object_get_ex(o, "messages", &msgs);
    toolcall_set ts;
    char *got = NULL;
    if (toolcall_read(o, CHAT_MISTRAL_V3_TEKKEN, &ts, msg, cap) == 0 && msgs)
        got = toolcall_render(&ts, msgs, "26 Jul 2024", true, NULL, msg, cap);
    toolcall_set_free(&ts);
    json_object_put(o);
    return got;
}

static void mistral_messages_map_call_ids(void)
{
    static const struct {
        const char *call_id, *result_id, *rendered_id;
    } ids[] = {
        {"\"id\":\"call_7f3abcDEF123\",", "\"tool_call_id\":\"call_7f3abcDEF123\",", "abcDEF123"},
        {"\"id\":\"x1\",", "\"tool_call_id\":\"x1\",", "0000000x1"},
        {"", "", "000000000"}, /* ollama's: no ids */
    };
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        char messages[2048], want[2048], msg[256];
        snprintf(messages, sizeof messages,
                 "{\"role\":\"system\",\"content\":\"You are a helpful assistant.\"},{\"role\":"
                 "\"user\",\"content\":\"What is the weather in Paris?\"},{\"role\":\"assistant\","
                 "\"content\":null,\"tool_calls\":[{%s\"type\":\"function\",\"function\":{\"name\":"
                 "\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\",\\\"unit\\\":"
                 "\\\"celsius\\\"}\"}}]},{\"role\":\"tool\",%s\"content\":\"{\\\"temperature\\\": "
                 "22}\"},{\"role\":\"assistant\",\"content\":\"22 degrees.\"},{\"role\":\"user\","
                 "\"content\":\"And in Rome?\"}",
                 ids[i].call_id, ids[i].result_id);
        snprintf(want, sizeof want, MISTRAL_CALL_RESULT, ids[i].rendered_id, ids[i].rendered_id);
        char *got = render_mistral(messages, msg, sizeof msg);
        CHECK_MSG(got && !strcmp(got, want), "%zu: %s", i, got ? got : msg);
        free(got);
    }
    /* two calls without ids: the results answer them in order */
    char msg[256];
    char *got = render_mistral(
        "{\"role\":\"user\",\"content\":\"Paris and Rome?\"},{\"role\":\"assistant\",\"content\":"
        "\"\",\"tool_calls\":[{\"function\":{\"name\":\"get_weather\",\"arguments\":{\"city\":"
        "\"Paris\"}}},{\"function\":{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Rome\"}}}]},"
        "{\"role\":\"tool\",\"content\":\"sunny\"},{\"role\":\"tool\",\"content\":\"rainy\"}",
        msg, sizeof msg);
    CHECK_MSG(got && strstr(got, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": "
                                 "{\"city\": \"Paris\"}, \"id\": \"000000000\"}, {\"name\": "
                                 "\"get_weather\", \"arguments\": {\"city\": \"Rome\"}, \"id\": "
                                 "\"000000001\"}]</s>[TOOL_RESULTS]{\"content\": sunny, "
                                 "\"call_id\": \"000000000\"}[/TOOL_RESULTS][TOOL_RESULTS]"
                                 "{\"content\": rainy, \"call_id\": \"000000001\"}[/TOOL_RESULTS]"),
              "%s", got ? got : msg);
    free(got);
    /* what the template refuses: a user message right after a result */
    got = render_mistral(
        "{\"role\":\"user\",\"content\":\"Paris?\"},{\"role\":\"assistant\",\"tool_calls\":"
        "[{\"function\":{\"name\":\"get_weather\",\"arguments\":{}}}]},{\"role\":\"tool\","
        "\"content\":\"sunny\"},{\"role\":\"user\",\"content\":\"Rome?\"}", msg, sizeof msg);
    CHECK_MSG(!got && strstr(msg, "alternate"), "%s", got ? got : msg);
    free(got);
}

static void bad_messages_are_refused(void)
{
    static const struct {
        const char *message, *says;
    } bad[] = {
        {"{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"get_weather\","
         "\"arguments\":\"{not json\"}}]}", "messages[0].tool_calls[0].function.arguments"},
        {"{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"arguments\":{}}}]}",
         "messages[0].tool_calls[0].function.name"},
        {"{\"role\":\"user\",\"content\":\"x\",\"tool_calls\":[{}]}", "messages[0].tool_calls"},
        {"{\"role\":\"function\",\"content\":\"x\"}", "role 'function'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char body[2048];
        snprintf(body, sizeof body, "{\"tools\":[%s],\"messages\":[%s]}", WEATHER_TOOL,
                 bad[i].message);
        json_object *o = json_tokener_parse(body), *msgs;
        CHECK(o && json_object_object_get_ex(o, "messages", &msgs));
        toolcall_set ts;
        char msg[256];
        CHECK_EQ(toolcall_read(o, CHAT_CHATML, &ts, msg, sizeof msg), 0);
        char *got = toolcall_render(&ts, msgs, "26 Jul 2024", true, NULL, msg, sizeof msg);
        CHECK_MSG(!got && strstr(msg, bad[i].says), "%zu: %s", i, msg);
        toolcall_set_free(&ts);
        json_object_put(o);
    }
}

/* ---- scanning ---- */

typedef struct scanned {
    char content[1024];
    char calls[1024]; /* "name(arguments);" per call */
    size_t n_calls;
} scanned;

/* Scans reply in pieces of step bytes (0: whole) for family f with tools get_weather and
 * search. */
static int scan(enum chat_family f, bool first_only, const char *reply, size_t step, scanned *out)
{
    static const char *names[] = {"get_weather", "search"};
    toolcall_set ts = {.family = f, .names = names, .n = 2, .parse = true, .first_only = first_only};
    toolcall_scan *s = toolcall_scan_new(&ts);
    memset(out, 0, sizeof *out);
    size_t len = strlen(reply), at = 0;
    int rc = s ? 0 : -1;
    while (rc == 0) {
        size_t n = step == 0 || len - at < step ? len - at : step;
        bool end = at + n == len;
        toolcall_out o;
        rc = toolcall_scan_feed(s, reply + at, n, end, &o);
        if (rc == 0) {
            strncat(out->content, o.content ? o.content : "", sizeof out->content - strlen(out->content) - 1);
            for (size_t i = 0; i < json_object_array_length(o.calls); i++) {
                json_object *c = json_object_array_get_idx(o.calls, i), *name, *id;
                json_object_object_get_ex(c, "name", &name);
                json_object_object_get_ex(c, "id", &id);
                if (strncmp(json_object_get_string(id), "call_", 5) != 0 ||
                    strlen(json_object_get_string(id)) != 29)
                    rc = -1;
                size_t k = strlen(out->calls);
                snprintf(out->calls + k, sizeof out->calls - k, "%s(%s);",
                         json_object_get_string(name), toolcall_arguments_text(c));
                out->n_calls++;
            }
        }
        toolcall_out_free(&o);
        at += n;
        if (end)
            break;
    }
    if (s && rc == 0 && toolcall_scan_calls(s) != out->n_calls)
        rc = -1;
    toolcall_scan_free(s);
    return rc;
}

static const struct {
    enum chat_family family;
    const char *reply, *content, *calls;
} REPLIES[] = {
    /* one call */
    {CHAT_CHATML, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
                  "</tool_call>", "", "get_weather({\"city\":\"Paris\"});"},
    /* two calls */
    {CHAT_CHATML, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
                  "</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": "
                  "\"a/b\", \"filters\": {\"n\": [1, 2]}}}\n</tool_call>", "",
     "get_weather({\"city\":\"Paris\"});search({\"query\":\"a/b\",\"filters\":{\"n\":[1,2]}});"},
    /* text, then a call */
    {CHAT_CHATML, "Let me check.\n<tool_call>\n{\"name\": \"search\", \"arguments\": {}}\n</tool_call>",
     "Let me check.", "search({});"},
    /* malformed JSON: the text stays */
    {CHAT_CHATML, "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": }\n</tool_call>",
     "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": }\n</tool_call>", ""},
    /* a function that is not one of the tools */
    {CHAT_CHATML, "<tool_call>\n{\"name\": \"rm\", \"arguments\": {}}\n</tool_call>",
     "<tool_call>\n{\"name\": \"rm\", \"arguments\": {}}\n</tool_call>", ""},
    /* cut at max_tokens before its end */
    {CHAT_CHATML, "Sure <tool_call>\n{\"name\": \"search\", \"argu",
     "Sure <tool_call>\n{\"name\": \"search\", \"argu", ""},
    /* text only, with what looks like the start of a marker */
    {CHAT_CHATML, "a < b <tool", "a < b <tool", ""},
    /* a good call then a bad one */
    {CHAT_CHATML, "<tool_call>{\"name\": \"search\", \"arguments\": {}}</tool_call> then "
                  "<tool_call>{\"name\": 3}</tool_call>",
     "then <tool_call>{\"name\": 3}</tool_call>", "search({});"},
    /* hermes: Qwen's calls */
    {CHAT_HERMES, "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                  "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": "
                  "{}}\n</tool_call>", "Sure.", "get_weather({\"city\":\"Paris\"});search({});"},
    /* llama3: the reply is the call */
    {CHAT_LLAMA3, " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}", "",
     "get_weather({\"city\":\"Rome\"});"},
    {CHAT_LLAMA3, "It is {\"name\": \"get_weather\"}", "It is {\"name\": \"get_weather\"}", ""},
    {CHAT_LLAMA3, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}} and more",
     "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}} and more", ""},
    /* mistral: an array of calls after [TOOL_CALLS] (the model may write the ids) */
    {CHAT_MISTRAL_V3_TEKKEN, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                             "\"Paris\"}}]", "", "get_weather({\"city\":\"Paris\"});"},
    {CHAT_MISTRAL_V3_TEKKEN, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                             "\"Paris\"}, \"id\": \"abcDEF123\"}, {\"name\": \"search\", "
                             "\"arguments\": {\"query\": \"a]b\", \"filters\": {\"n\": [1, 2]}}}]",
     "", "get_weather({\"city\":\"Paris\"});search({\"query\":\"a]b\",\"filters\":{\"n\":[1,2]}});"},
    {CHAT_MISTRAL_V3_TEKKEN, "Let me check.\n[TOOL_CALLS][{\"name\": \"search\", \"arguments\": "
                             "{}}]\n", "Let me check.", "search({});"},
    {CHAT_MISTRAL_V3_TEKKEN, "[TOOL_CALLS][{\"name\": \"search\", \"arguments\": {}}] then "
                             "[TOOL_CALLS][{\"name\": \"search\", \"arguments\": {\"q\": 1}}]",
     "then", "search({});search({\"q\":1});"},
    /* malformed JSON, an unknown function among two, no array, an empty one: text */
    {CHAT_MISTRAL_V3_TEKKEN, "[TOOL_CALLS][{\"name\": \"search\", \"arguments\": {\"q\": }}]",
     "[TOOL_CALLS][{\"name\": \"search\", \"arguments\": {\"q\": }}]", ""},
    {CHAT_MISTRAL_V3_TEKKEN, "[TOOL_CALLS][{\"name\": \"search\", \"arguments\": {}}, {\"name\": "
                             "\"rm\", \"arguments\": {}}] ok",
     "[TOOL_CALLS][{\"name\": \"search\", \"arguments\": {}}, {\"name\": \"rm\", \"arguments\": "
     "{}}] ok", ""},
    {CHAT_MISTRAL_V3_TEKKEN, "[TOOL_CALLS]{\"name\": \"search\", \"arguments\": {}}",
     "[TOOL_CALLS]{\"name\": \"search\", \"arguments\": {}}", ""},
    {CHAT_MISTRAL_V3_TEKKEN, "[TOOL_CALLS][]", "[TOOL_CALLS][]", ""},
    /* cut at max_tokens before the array's end */
    {CHAT_MISTRAL_V3_TEKKEN, "Sure [TOOL_CALLS][{\"name\": \"search\", \"arguments\": {}}, {\"na",
     "Sure [TOOL_CALLS][{\"name\": \"search\", \"arguments\": {}}, {\"na", ""},
    /* text only, with what looks like the start of a marker */
    {CHAT_MISTRAL_V3_TEKKEN, "see [1] and [TOOL", "see [1] and [TOOL", ""},
    {CHAT_LLAMA3, "{\"name\": \"get_weather\", \"parameters\": {\"ci", 
     "{\"name\": \"get_weather\", \"parameters\": {\"ci", ""},
    /* gpt-oss's calls, as daemon/net/harmony.h writes them: a function outside the tools
     * is a call still (llama.cpp's reading); a body that is no JSON object is content */
    {CHAT_GPT_OSS, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"UTC\"}}\n"
                   "</tool_call>", "", "get_time({\"tz\":\"UTC\"});"},
    {CHAT_GPT_OSS, "Checking.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {city: "
                   "Paris}}\n</tool_call>", "Checking.{city: Paris}", ""},
    {CHAT_GPT_OSS, "<tool_call>\n{\"name\": \"search\", \"arguments\": \"x\"}\n</tool_call>",
     "\"x\"", ""},
};

static void replies_are_scanned_whole_and_in_pieces(void)
{
    for (size_t i = 0; i < sizeof REPLIES / sizeof REPLIES[0]; i++)
        for (size_t step = 0; step <= 7; step++) {
            scanned got;
            CHECK_EQ(scan(REPLIES[i].family, false, REPLIES[i].reply, step, &got), 0);
            CHECK_MSG(!strcmp(got.content, REPLIES[i].content) && !strcmp(got.calls, REPLIES[i].calls),
                      "%zu step %zu: content '%s' calls '%s'", i, step, got.content, got.calls);
        }
}

static void parallel_false_keeps_the_first_call(void)
{
    scanned got;
    CHECK_EQ(scan(CHAT_CHATML, true, REPLIES[1].reply, 3, &got), 0);
    CHECK_MSG(!strcmp(got.calls, "get_weather({\"city\":\"Paris\"});") && !got.content[0], "%s|%s",
              got.calls, got.content);
    /* mistral's two calls in one array */
    for (size_t i = 0; i < sizeof REPLIES / sizeof REPLIES[0]; i++)
        if (REPLIES[i].family == CHAT_MISTRAL_V3_TEKKEN && strstr(REPLIES[i].reply, "abcDEF123")) {
            CHECK_EQ(scan(CHAT_MISTRAL_V3_TEKKEN, true, REPLIES[i].reply, 2, &got), 0);
            CHECK_MSG(!strcmp(got.calls, "get_weather({\"city\":\"Paris\"});") && !got.content[0],
                      "%s|%s", got.calls, got.content);
        }
}

/* Streamed, text before a possible call goes out at once, and a call as soon as it
 * closes. */
static void text_streams_before_a_call(void)
{
    static const char *names[] = {"search"};
    toolcall_set ts = {.family = CHAT_CHATML, .names = names, .n = 1, .parse = true};
    toolcall_scan *s = toolcall_scan_new(&ts);
    CHECK(s);
    toolcall_out o;
    CHECK_EQ(toolcall_scan_feed(s, "Hello there\n<tool", 17, false, &o), 0);
    CHECK_MSG(o.content && !strcmp(o.content, "Hello there"), "%s", o.content);
    toolcall_out_free(&o);
    const char *rest = "_call>{\"name\": \"search\", \"arguments\": {}}</tool_call>";
    CHECK_EQ(toolcall_scan_feed(s, rest, strlen(rest), false, &o), 0);
    CHECK_EQ(json_object_array_length(o.calls), 1);
    CHECK(!o.content);
    toolcall_out_free(&o);
    CHECK_EQ(toolcall_scan_feed(s, "", 0, true, &o), 0);
    CHECK(!o.content && json_object_array_length(o.calls) == 0);
    toolcall_out_free(&o);
    CHECK_EQ(toolcall_scan_fed(s), 17 + strlen(rest));
    toolcall_scan_free(s);
}

int main(void)
{
    RUN(tools_are_written_as_tojson);
    RUN(mistral_tools_are_written_as_its_template);
    RUN(hermes_tools_are_written_as_its_template);
    RUN(malformed_tools_and_choices_are_refused);
    RUN(choice_none_and_one_call_are_read);
    RUN(forced_choice_builds_the_schema);
    RUN(messages_render_as_the_template);
    RUN(mistral_messages_map_call_ids);
    RUN(hermes_messages_render_as_its_template);
    RUN(bad_messages_are_refused);
    RUN(replies_are_scanned_whole_and_in_pieces);
    RUN(parallel_false_keeps_the_first_call);
    RUN(text_streams_before_a_call);
    return test_finish();
}
