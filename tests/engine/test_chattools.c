/* Tests of conversations with tools (chattools.h). Expected prompts are what the models'
 * own Jinja templates render for the same conversation (Python's jinja2 with Hugging Face's
 * tojson, as transformers and llama.cpp's --jinja apply them): Qwen2.5-7B-Instruct and
 * Qwen3 for chatml, Llama 3.1 / 3.2 / 3.3 Instruct for llama3.
 *
 * Conversation A: system, user, an assistant call of get_weather, its result, user.
 * Conversation B (chatml): user, an assistant's text and two calls, two results, an
 * assistant reply, user. Conversation L (llama3): user, a call of search with nested
 * arguments, its result, user. */
#include <stdlib.h>
#include <string.h>

#include "engine/tok/chattools.h"
#include "tests/support/test.h"

/* tojson of the get_weather tool */
static const char WEATHER_LINE[] =
    "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"descripti"
    "on\": \"Get the weather in a city\", \"parameters\": {\"type\": \"object\", \""
    "properties\": {\"city\": {\"type\": \"string\", \"description\": \"the city\"}"
    ", \"unit\": {\"type\": \"string\", \"enum\": [\"celsius\", \"fahrenheit\"]}}, "
    "\"required\": [\"city\"]}}}";

/* tojson(indent=4) of the get_weather tool */
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

/* tojson of the search tool (nested parameters) */
static const char SEARCH_LINE[] =
    "{\"type\": \"function\", \"function\": {\"name\": \"search\", \"description\":"
    " \"Search the web\", \"parameters\": {\"type\": \"object\", \"properties\": {\""
    "query\": {\"type\": \"string\"}, \"filters\": {\"type\": \"object\", \"propert"
    "ies\": {\"site\": {\"type\": \"string\"}, \"max_age_days\": {\"type\": \"integ"
    "er\"}}}, \"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}}}, "
    "\"required\": [\"query\"]}}}";

/* tojson(indent=4) of the search tool */
static const char SEARCH_INDENTED[] =
    "{\n"
    "    \"type\": \"function\",\n"
    "    \"function\": {\n"
    "        \"name\": \"search\",\n"
    "        \"description\": \"Search the web\",\n"
    "        \"parameters\": {\n"
    "            \"type\": \"object\",\n"
    "            \"properties\": {\n"
    "                \"query\": {\n"
    "                    \"type\": \"string\"\n"
    "                },\n"
    "                \"filters\": {\n"
    "                    \"type\": \"object\",\n"
    "                    \"properties\": {\n"
    "                        \"site\": {\n"
    "                            \"type\": \"string\"\n"
    "                        },\n"
    "                        \"max_age_days\": {\n"
    "                            \"type\": \"integer\"\n"
    "                        }\n"
    "                    }\n"
    "                },\n"
    "                \"tags\": {\n"
    "                    \"type\": \"array\",\n"
    "                    \"items\": {\n"
    "                        \"type\": \"string\"\n"
    "                    }\n"
    "                }\n"
    "            },\n"
    "            \"required\": [\n"
    "                \"query\"\n"
    "            ]\n"
    "        }\n"
    "    }\n"
    "}";

/* Qwen2.5-7B-Instruct (and Qwen3) of conversation A, one tool */
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

/* Qwen3 of conversation B (no system message), two tools, two calls */
static const char CHATML_TWO_TOOLS[] =
    "<|im_start|>system\n"
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
    "{\"type\": \"function\", \"function\": {\"name\": \"search\", \"description\":"
    " \"Search the web\", \"parameters\": {\"type\": \"object\", \"properties\": {\""
    "query\": {\"type\": \"string\"}, \"filters\": {\"type\": \"object\", \"propert"
    "ies\": {\"site\": {\"type\": \"string\"}, \"max_age_days\": {\"type\": \"integ"
    "er\"}}}, \"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}}}, "
    "\"required\": [\"query\"]}}}\n"
    "</tools>\n"
    "\n"
    "For each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n"
    "<tool_call>\n"
    "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\n"
    "Weather in Paris and news about \"Rome\"?<|im_end|>\n"
    "<|im_start|>assistant\n"
    "Let me check.\n"
    "<tool_call>\n"
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
    "</tool_call>\n"
    "<tool_call>\n"
    "{\"name\": \"search\", \"arguments\": {\"query\": \"Rome\", \"filters\": {\"ma"
    "x_age_days\": 2}, \"tags\": [\"news\", \"é\"]}}\n"
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\n"
    "<tool_response>\n"
    "sunny\n"
    "</tool_response>\n"
    "<tool_response>\n"
    "no news\n"
    "</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n"
    "Sunny in Paris, no news.<|im_end|>\n"
    "<|im_start|>user\n"
    "Thanks<|im_end|>\n"
    "<|im_start|>assistant\n";

/* Llama-3.1-8B-Instruct (and 3.2) of conversation A, one tool, date 26 Jul 2024 */
static const char LLAMA3_ONE_TOOL[] =
    "<|start_header_id|>system<|end_header_id|>\n"
    "\n"
    "Environment: ipython\n"
    "Cutting Knowledge Date: December 2023\n"
    "Today Date: 26 Jul 2024\n"
    "\n"
    "You are a helpful assistant.<|eot_id|><|start_header_id|>user<|end_header_id|>"
    "\n"
    "\n"
    "Given the following functions, please respond with a JSON for a function call "
    "with its proper arguments that best answers the given prompt.\n"
    "\n"
    "Respond in the format {\"name\": function name, \"parameters\": dictionary of "
    "argument name and its value}.Do not use variables.\n"
    "\n"
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
    "}\n"
    "\n"
    "What is the weather in Paris?<|eot_id|><|start_header_id|>assistant<|end_heade"
    "r_id|>\n"
    "\n"
    "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \""
    "celsius\"}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n"
    "\n"
    "\"{\\\"temperature\\\": 22}\"<|eot_id|><|start_header_id|>user<|end_header_id|"
    ">\n"
    "\n"
    "And in Rome?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
    "\n";

/* Llama-3.3-70B-Instruct of conversation L (no system message), two tools, date 03 Feb 2026 */
static const char LLAMA3_TWO_TOOLS[] =
    "<|start_header_id|>system<|end_header_id|>\n"
    "\n"
    "Environment: ipython\n"
    "Cutting Knowledge Date: December 2023\n"
    "Today Date: 03 Feb 2026\n"
    "\n"
    "<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
    "\n"
    "Given the following functions, please respond with a JSON for a function call "
    "with its proper arguments that best answers the given prompt.\n"
    "\n"
    "Respond in the format {\"name\": function name, \"parameters\": dictionary of "
    "argument name and its value}.Do not use variables.\n"
    "\n"
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
    "}\n"
    "\n"
    "{\n"
    "    \"type\": \"function\",\n"
    "    \"function\": {\n"
    "        \"name\": \"search\",\n"
    "        \"description\": \"Search the web\",\n"
    "        \"parameters\": {\n"
    "            \"type\": \"object\",\n"
    "            \"properties\": {\n"
    "                \"query\": {\n"
    "                    \"type\": \"string\"\n"
    "                },\n"
    "                \"filters\": {\n"
    "                    \"type\": \"object\",\n"
    "                    \"properties\": {\n"
    "                        \"site\": {\n"
    "                            \"type\": \"string\"\n"
    "                        },\n"
    "                        \"max_age_days\": {\n"
    "                            \"type\": \"integer\"\n"
    "                        }\n"
    "                    }\n"
    "                },\n"
    "                \"tags\": {\n"
    "                    \"type\": \"array\",\n"
    "                    \"items\": {\n"
    "                        \"type\": \"string\"\n"
    "                    }\n"
    "                }\n"
    "            },\n"
    "            \"required\": [\n"
    "                \"query\"\n"
    "            ]\n"
    "        }\n"
    "    }\n"
    "}\n"
    "\n"
    "Weather in Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
    "\n"
    "{\"name\": \"search\", \"parameters\": {\"query\": \"Paris weather\", \"filter"
    "s\": {\"site\": \"a.b\"}}}<|eot_id|><|start_header_id|>ipython<|end_header_id|"
    ">\n"
    "\n"
    "\"sunny\"<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
    "\n"
    "Thanks<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
    "\n";

static const struct chat_tool_call WEATHER_PARIS_CELSIUS = {
    "get_weather", "{\"city\": \"Paris\", \"unit\": \"celsius\"}"};
static const struct chat_tool_call B_CALLS[] = {
    {"get_weather", "{\"city\": \"Paris\"}"},
    {"search", "{\"query\": \"Rome\", \"filters\": {\"max_age_days\": 2}, \"tags\": [\"news\", "
               "\"\xc3\xa9\"]}"},
};
static const struct chat_tool_call SEARCH_PARIS = {
    "search", "{\"query\": \"Paris weather\", \"filters\": {\"site\": \"a.b\"}}"};

static const struct chat_tool_message CONV_A[] = {
    {"system", "You are a helpful assistant.", NULL, 0},
    {"user", "What is the weather in Paris?", NULL, 0},
    {"assistant", "", &WEATHER_PARIS_CELSIUS, 1},
    {"tool", "{\"temperature\": 22}", NULL, 0},
    {"user", "And in Rome?", NULL, 0},
};
static const struct chat_tool_message CONV_B[] = {
    {"user", "Weather in Paris and news about \"Rome\"?", NULL, 0},
    {"assistant", "Let me check.", B_CALLS, 2},
    {"tool", "sunny", NULL, 0},
    {"tool", "no news", NULL, 0},
    {"assistant", "Sunny in Paris, no news.", NULL, 0},
    {"user", "Thanks", NULL, 0},
};
static const struct chat_tool_message CONV_L[] = {
    {"user", "Weather in Paris?", NULL, 0},
    {"assistant", "", &SEARCH_PARIS, 1},
    {"tool", "sunny", NULL, 0},
    {"user", "Thanks", NULL, 0},
};

#define N(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* chat_apply_tools into a fresh string (NULL when it refuses). */
static char *render(enum chat_family f, const char *const *tools, int n_tools, const char *date,
                    const struct chat_tool_message *msgs, int n)
{
    int len = chat_apply_tools(f, tools, n_tools, date, msgs, n, true, NULL, 0);
    if (len < 0)
        return NULL;
    char *s = malloc((size_t)len + 1);
    if (s && chat_apply_tools(f, tools, n_tools, date, msgs, n, true, s, (size_t)len + 1) != len) {
        free(s);
        return NULL;
    }
    return s;
}

static void check_render(enum chat_family f, const char *const *tools, int n_tools,
                         const char *date, const struct chat_tool_message *msgs, int n,
                         const char *want)
{
    char *got = render(f, tools, n_tools, date, msgs, n);
    CHECK_MSG(got, "%s refused", chat_family_name(f));
    size_t at = 0;
    while (got[at] && got[at] == want[at])
        at++;
    CHECK_MSG(strcmp(got, want) == 0, "%s differs at byte %zu: got '%.60s', want '%.60s'",
              chat_family_name(f), at, got + at, want + at);
    free(got);
}

static void chatml_matches_qwen(void)
{
    const char *one[] = {WEATHER_LINE}, *two[] = {WEATHER_LINE, SEARCH_LINE};
    check_render(CHAT_CHATML, one, 1, "26 Jul 2024", CONV_A, N(CONV_A), CHATML_ONE_TOOL);
    check_render(CHAT_CHATML, two, 2, "26 Jul 2024", CONV_B, N(CONV_B), CHATML_TWO_TOOLS);
}

static void llama3_matches_llama_3_x(void)
{
    const char *one[] = {WEATHER_INDENTED}, *two[] = {WEATHER_INDENTED, SEARCH_INDENTED};
    check_render(CHAT_LLAMA3, one, 1, "26 Jul 2024", CONV_A, N(CONV_A), LLAMA3_ONE_TOOL);
    check_render(CHAT_LLAMA3, two, 2, "03 Feb 2026", CONV_L, N(CONV_L), LLAMA3_TWO_TOOLS);
}

/* What the templates themselves refuse, and families without a tool format. */
static void refusals(void)
{
    const char *one[] = {WEATHER_INDENTED};
    /* Llama 3.x: "This model only supports single tool-calls at once!" */
    CHECK(!render(CHAT_LLAMA3, one, 1, "26 Jul 2024", CONV_B, N(CONV_B)));
    /* no user message to hold the tools */
    CHECK(!render(CHAT_LLAMA3, one, 1, "26 Jul 2024", CONV_A, 1));
    for (int f = 0; f < CHAT_N_FAMILIES; f++) {
        bool has = f == CHAT_CHATML || f == CHAT_LLAMA3;
        CHECK_EQ(chat_tool_syntax((enum chat_family)f) != NULL, has);
        if (!has)
            CHECK(!render((enum chat_family)f, one, 1, "26 Jul 2024", CONV_A, N(CONV_A)));
    }
    struct chat_tool_message bad[] = {{"user", "hi", &SEARCH_PARIS, 1}};
    CHECK(!render(CHAT_CHATML, one, 1, "26 Jul 2024", bad, 1));
    bad[0] = (struct chat_tool_message){"function", "hi", NULL, 0};
    CHECK(!render(CHAT_CHATML, one, 1, "26 Jul 2024", bad, 1));
}

static void syntax_and_indent_per_family(void)
{
    const struct chat_tool_syntax *s = chat_tool_syntax(CHAT_CHATML);
    CHECK(s && !strcmp(s->open, "<tool_call>") && !strcmp(s->close, "</tool_call>") &&
          !strcmp(s->args_key, "arguments") && !s->whole);
    s = chat_tool_syntax(CHAT_LLAMA3);
    CHECK(s && !strcmp(s->open, "{") && !s->close && !strcmp(s->args_key, "parameters") && s->whole);
    CHECK_EQ(chat_tools_indent(CHAT_CHATML), 0);
    CHECK_EQ(chat_tools_indent(CHAT_LLAMA3), 4);
}

/* A buffer too small gets what fits and the full length, as chat_apply. */
static void small_buffer_is_sized(void)
{
    const char *one[] = {WEATHER_LINE};
    char small[16];
    int len = chat_apply_tools(CHAT_CHATML, one, 1, "x", CONV_A, N(CONV_A), true, small,
                               sizeof small);
    CHECK_EQ(len, (int)strlen(CHATML_ONE_TOOL));
    CHECK_EQ(strlen(small), sizeof small - 1);
    CHECK(!strncmp(small, CHATML_ONE_TOOL, sizeof small - 1));
}

int main(void)
{
    RUN(chatml_matches_qwen);
    RUN(llama3_matches_llama_3_x);
    RUN(refusals);
    RUN(syntax_and_indent_per_family);
    RUN(small_buffer_is_sized);
    return test_finish();
}
