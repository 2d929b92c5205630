/* Tests of conversations with tools (chattools.h). Expected prompts are what the models'
 * own Jinja templates render for the same conversation (Python's jinja2 with Hugging Face's
 * tojson, as transformers and llama.cpp's --jinja apply them): Qwen2.5-7B-Instruct and
 * Qwen3 for chatml, Llama 3.1 / 3.2 / 3.3 Instruct for llama3, Mistral-Nemo-Instruct-2407
 * for mistral-v3-tekken (without the BOS it writes first, which the tokenizer adds), the
 * tool_use template of Hermes 2 Pro (Llama-3-8B) and Hermes 3 (Llama-3.1-8B), one text,
 * for hermes.
 *
 * Conversation A: system, user, an assistant call of get_weather, its result, user.
 * Conversation B (chatml): user, an assistant's text and two calls, two results, an
 * assistant reply, user. Conversation L (llama3): user, a call of search with nested
 * arguments, its result, user. Conversation R (hermes): user, two calls, their results. */
#include <stdio.h>
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

/* Mistral-Nemo-Instruct-2407.jinja of system, user with get_weather (the system message
 * in the last user turn) */
static const char MISTRAL_SYS_USER[] =
    "[AVAILABLE_TOOLS][{\"type\": \"function\", \"function\": {\"name\": \"get_weat"
    "her\", \"description\": \"Get the weather in a city\", \"parameters\": {\"type\":"
    " \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \""
    "the city\"}, \"unit\": {\"type\": \"string\", \"enum\": [\"celsius\", \"fahrenhei"
    "t\"]}}, \"required\": [\"city\"]}}}][/AVAILABLE_TOOLS][INST]You are a helpful ass"
    "istant.\n"
    "\n"
    "What is the weather in Paris?[/INST]";

/* ... of conversation A with ids and a reply after the result (the template wants user
 * and assistant to alternate): the tools before the last user turn */
static const char MISTRAL_CALL_RESULT[] =
    "[INST]What is the weather in Paris?[/INST][TOOL_CALLS][{\"name\": \"get_weathe"
    "r\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}, \"id\": \"abcDE"
    "F123\"}]</s>[TOOL_RESULTS]{\"content\": {\"temperature\": 22}, \"call_id\": \"abc"
    "DEF123\"}[/TOOL_RESULTS]22 degrees.</s>[AVAILABLE_TOOLS][{\"type\": \"function\","
    " \"function\": {\"name\": \"get_weather\", \"description\": \"Get the weather in "
    "a city\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"ty"
    "pe\": \"string\", \"description\": \"the city\"}, \"unit\": {\"type\": \"string\""
    ", \"enum\": [\"celsius\", \"fahrenheit\"]}}, \"required\": [\"city\"]}}}][/AVAILA"
    "BLE_TOOLS][INST]You are a helpful assistant.\n"
    "\n"
    "And in Rome?[/INST]";

/* ... of conversation B with ids: two calls in one array, the message's text not written */
static const char MISTRAL_TWO_CALLS[] =
    "[INST]Weather in Paris and news about \"Rome\"?[/INST][TOOL_CALLS][{\"name\": "
    "\"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"a00000001\"}, {\""
    "name\": \"search\", \"arguments\": {\"query\": \"Rome\", \"filters\": {\"max_age_"
    "days\": 2}, \"tags\": [\"news\", \"\xc3\xa9\"]}, \"id\": \"a00000002\"}]</s>[TOOL"
    "_RESULTS]{\"content\": sunny, \"call_id\": \"a00000001\"}[/TOOL_RESULTS][TOOL_RES"
    "ULTS]{\"content\": no news, \"call_id\": \"a00000002\"}[/TOOL_RESULTS]Sunny in Pa"
    "ris, no news.</s>[AVAILABLE_TOOLS][{\"type\": \"function\", \"function\": {\"name"
    "\": \"get_weather\", \"description\": \"Get the weather in a city\", \"parameters"
    "\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"de"
    "scription\": \"the city\"}, \"unit\": {\"type\": \"string\", \"enum\": [\"celsius"
    "\", \"fahrenheit\"]}}, \"required\": [\"city\"]}}}, {\"type\": \"function\", \"fu"
    "nction\": {\"name\": \"search\", \"description\": \"Search the web\", \"parameter"
    "s\": {\"type\": \"object\", \"properties\": {\"query\": {\"type\": \"string\"}, \""
    "filters\": {\"type\": \"object\", \"properties\": {\"site\": {\"type\": \"string\""
    "}, \"max_age_days\": {\"type\": \"integer\"}}}, \"tags\": {\"type\": \"array\", \""
    "items\": {\"type\": \"string\"}}}, \"required\": [\"query\"]}}}][/AVAILABLE_TOOLS"
    "][INST]Thanks[/INST]";

/* ... of system, user, a call, its result: the system message is lost (no user turn
 * ends the conversation) */
static const char MISTRAL_RESULT_LAST[] =
    "[AVAILABLE_TOOLS][{\"type\": \"function\", \"function\": {\"name\": \"get_weat"
    "her\", \"description\": \"Get the weather in a city\", \"parameters\": {\"type\":"
    " \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \""
    "the city\"}, \"unit\": {\"type\": \"string\", \"enum\": [\"celsius\", \"fahrenhei"
    "t\"]}}, \"required\": [\"city\"]}}}][/AVAILABLE_TOOLS][INST]Weather in Paris?[/IN"
    "ST][TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"},"
    " \"id\": \"abcDEF123\"}]</s>[TOOL_RESULTS]{\"content\": sunny, \"call_id\": \"abc"
    "DEF123\"}[/TOOL_RESULTS]";

/* The Hermes tool_use template's system turn before and after its tools. */
#define HERMES_INTRO                                                                       \
    "<|im_start|>system\n"                                                                 \
    "You are a function calling AI model. You are provided with function signatures w"     \
    "ithin <tools></tools> XML tags. You may call one or more functions to assist wit"     \
    "h the user query. Don't make assumptions about what values to plug into function"     \
    "s. Here are the available tools: <tools> "
#define HERMES_OUTRO                                                                       \
    " </tools>Use the following pydantic model json schema for each tool call you wil"     \
    "l make: {\"properties\": {\"name\": {\"title\": \"Name\", \"type\": \"string\"},"     \
    " \"arguments\": {\"title\": \"Arguments\", \"type\": \"object\"}}, \"required\":"     \
    " [\"name\", \"arguments\"], \"title\": \"FunctionCall\", \"type\": \"object\"}}\n"    \
    "For each function call return a json object with function name and arguments wit"     \
    "hin <tool_call></tool_call> XML tags as follows:\n"                                   \
    "<tool_call>\n"                                                                        \
    "{\"name\": <function-name>, \"arguments\": <args-dict>}\n"                            \
    "</tool_call><|im_end|>\n"

/* The template's text of the get_weather tool: a Python-like signature and "Args:" doc
 * as the description, the parameters as tojson, the outer object left open (as the
 * template leaves it) */
#define HERMES_WEATHER_TEXT                                                                \
    "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description"     \
    "\": \"get_weather(city: str, unit: str) - Get the weather in a city\n"                \
    "\n"                                                                                   \
    "    Args:\n"                                                                          \
    "        city(str): the city        unit(str): \", \"parameters\": {\"type\": \"o"     \
    "bject\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"th"     \
    "e city\"}, \"unit\": {\"type\": \"string\", \"enum\": [\"celsius\", \"fahrenheit"     \
    "\"]}}, \"required\": [\"city\"]}}"

/* ... of the search tool (an object and an array: "dict", "list[Union[]]") */
#define HERMES_SEARCH_TEXT                                                                 \
    "{\"type\": \"function\", \"function\": {\"name\": \"search\", \"description\": \""    \
    "search(query: str, filters: dict, tags: list[Union[]]) - Search the web\n"            \
    "\n"                                                                                   \
    "    Args:\n"                                                                          \
    "        query(str):         filters(dict):         tags(list[Union[]]): \", \"pa"     \
    "rameters\": {\"type\": \"object\", \"properties\": {\"query\": {\"type\": \"stri"     \
    "ng\"}, \"filters\": {\"type\": \"object\", \"properties\": {\"site\": {\"type\":"     \
    " \"string\"}, \"max_age_days\": {\"type\": \"integer\"}}}, \"tags\": {\"type\": "     \
    "\"array\", \"items\": {\"type\": \"string\"}}}, \"required\": [\"query\"]}}"

/* NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja (the same text as Hermes 3's) of
 * conversation A, one tool: the system message a turn of its own after the tools' */
static const char HERMES_ONE_TOOL[] =
    HERMES_INTRO HERMES_WEATHER_TEXT HERMES_OUTRO
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

/* ... of conversation B, two tools (one a line each): the text said before the calls is
 * not written, two results share a "tool" turn */
static const char HERMES_TWO_TOOLS[] =
    HERMES_INTRO HERMES_WEATHER_TEXT "\n" HERMES_SEARCH_TEXT HERMES_OUTRO
    "<|im_start|>user\n"
    "Weather in Paris and news about \"Rome\"?<|im_end|>\n"
    "<|im_start|>assistant\n"
    "<tool_call>\n"
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
    "</tool_call>\n"
    "<tool_call>\n"
    "{\"name\": \"search\", \"arguments\": {\"query\": \"Rome\", \"filters\": {\"max_"
    "age_days\": 2}, \"tags\": [\"news\", \"é\"]}}\n"
    "</tool_call><|im_end|>\n"
    "<|im_start|>tool\n"
    "<tool_response>\n"
    "sunny\n"
    "</tool_response>\n"
    "<tool_response>\n"
    "no news\n"
    "</tool_response>\n"
    "<|im_end|><|im_start|>assistant\n"
    "Sunny in Paris, no news.<|im_end|>\n"
    "<|im_start|>user\n"
    "Thanks<|im_end|>\n"
    "<|im_start|>assistant\n";

/* ... of conversation R without the generation prompt: the last result's turn ends
 * without a line break */
static const char HERMES_RESULTS_LAST[] =
    HERMES_INTRO HERMES_WEATHER_TEXT HERMES_OUTRO
    "<|im_start|>user\n"
    "Weather in Paris and Rome?<|im_end|>\n"
    "<|im_start|>assistant\n"
    "<tool_call>\n"
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
    "</tool_call>\n"
    "<tool_call>\n"
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n"
    "</tool_call><|im_end|>\n"
    "<|im_start|>tool\n"
    "<tool_response>\n"
    "sunny\n"
    "</tool_response>\n"
    "<tool_response>\n"
    "rainy\n"
    "</tool_response><|im_end|>";

/* ... of a result before anything else, then a user message, without the generation
 * prompt: the template opens a "tool" turn only after another message */
static const char HERMES_RESULT_FIRST[] =
    HERMES_INTRO HERMES_WEATHER_TEXT HERMES_OUTRO
    "<tool_response>\n"
    "sunny\n"
    "</tool_response>\n"
    "<|im_end|><|im_start|>user\n"
    "Thanks<|im_end|>\n";

static const struct chat_tool_call WEATHER_PARIS_CELSIUS = {
    "get_weather", "{\"city\": \"Paris\", \"unit\": \"celsius\"}", NULL};
static const struct chat_tool_call B_CALLS[] = {
    {"get_weather", "{\"city\": \"Paris\"}", NULL},
    {"search", "{\"query\": \"Rome\", \"filters\": {\"max_age_days\": 2}, \"tags\": [\"news\", "
               "\"\xc3\xa9\"]}", NULL},
};
static const struct chat_tool_call SEARCH_PARIS = {
    "search", "{\"query\": \"Paris weather\", \"filters\": {\"site\": \"a.b\"}}", NULL};

static const struct chat_tool_message CONV_A[] = {
    {"system", "You are a helpful assistant.", NULL, 0, NULL},
    {"user", "What is the weather in Paris?", NULL, 0, NULL},
    {"assistant", "", &WEATHER_PARIS_CELSIUS, 1, NULL},
    {"tool", "{\"temperature\": 22}", NULL, 0, NULL},
    {"user", "And in Rome?", NULL, 0, NULL},
};
static const struct chat_tool_message CONV_B[] = {
    {"user", "Weather in Paris and news about \"Rome\"?", NULL, 0, NULL},
    {"assistant", "Let me check.", B_CALLS, 2, NULL},
    {"tool", "sunny", NULL, 0, NULL},
    {"tool", "no news", NULL, 0, NULL},
    {"assistant", "Sunny in Paris, no news.", NULL, 0, NULL},
    {"user", "Thanks", NULL, 0, NULL},
};
static const struct chat_tool_call R_CALLS[] = {
    {"get_weather", "{\"city\": \"Paris\"}", NULL},
    {"get_weather", "{\"city\": \"Rome\"}", NULL},
};
static const struct chat_tool_message CONV_R[] = {
    {"user", "Weather in Paris and Rome?", NULL, 0, NULL},
    {"assistant", "", R_CALLS, 2, NULL},
    {"tool", "sunny", NULL, 0, NULL},
    {"tool", "rainy", NULL, 0, NULL},
};
static const struct chat_tool_message CONV_L[] = {
    {"user", "Weather in Paris?", NULL, 0, NULL},
    {"assistant", "", &SEARCH_PARIS, 1, NULL},
    {"tool", "sunny", NULL, 0, NULL},
    {"user", "Thanks", NULL, 0, NULL},
};

/* Mistral's calls and results carry ids of 9 letters and digits */
static const struct chat_tool_call M_WEATHER_PARIS_CELSIUS = {
    "get_weather", "{\"city\": \"Paris\", \"unit\": \"celsius\"}", "abcDEF123"};
static const struct chat_tool_call M_WEATHER_PARIS = {"get_weather", "{\"city\": \"Paris\"}",
                                                      "abcDEF123"};
static const struct chat_tool_call M_B_CALLS[] = {
    {"get_weather", "{\"city\": \"Paris\"}", "a00000001"},
    {"search", "{\"query\": \"Rome\", \"filters\": {\"max_age_days\": 2}, \"tags\": [\"news\", "
               "\"\xc3\xa9\"]}", "a00000002"},
};
static const struct chat_tool_message MCONV_SYS_USER[] = {
    {"system", "You are a helpful assistant.", NULL, 0, NULL},
    {"user", "What is the weather in Paris?", NULL, 0, NULL},
};
static const struct chat_tool_message MCONV_A[] = {
    {"system", "You are a helpful assistant.", NULL, 0, NULL},
    {"user", "What is the weather in Paris?", NULL, 0, NULL},
    {"assistant", "", &M_WEATHER_PARIS_CELSIUS, 1, NULL},
    {"tool", "{\"temperature\": 22}", NULL, 0, "abcDEF123"},
    {"assistant", "22 degrees.", NULL, 0, NULL},
    {"user", "And in Rome?", NULL, 0, NULL},
};
static const struct chat_tool_message MCONV_B[] = {
    {"user", "Weather in Paris and news about \"Rome\"?", NULL, 0, NULL},
    {"assistant", "Let me check.", M_B_CALLS, 2, NULL},
    {"tool", "sunny", NULL, 0, "a00000001"},
    {"tool", "no news", NULL, 0, "a00000002"},
    {"assistant", "Sunny in Paris, no news.", NULL, 0, NULL},
    {"user", "Thanks", NULL, 0, NULL},
};
static const struct chat_tool_message MCONV_RESULT_LAST[] = {
    {"system", "Be brief.", NULL, 0, NULL},
    {"user", "Weather in Paris?", NULL, 0, NULL},
    {"assistant", "", &M_WEATHER_PARIS, 1, NULL},
    {"tool", "sunny", NULL, 0, "abcDEF123"},
};

#define N(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* chat_apply_tools into a fresh string (NULL when it refuses); gen: the generation prompt. */
static char *render_gen(enum chat_family f, const char *const *tools, int n_tools,
                        const char *date, const struct chat_tool_message *msgs, int n, bool gen)
{
    int len = chat_apply_tools(f, tools, n_tools, date, msgs, n, gen, true, NULL, 0);
    if (len < 0)
        return NULL;
    char *s = malloc((size_t)len + 1);
    if (s && chat_apply_tools(f, tools, n_tools, date, msgs, n, gen, true, s, (size_t)len + 1) !=
                 len) {
        free(s);
        return NULL;
    }
    return s;
}

static char *render(enum chat_family f, const char *const *tools, int n_tools, const char *date,
                    const struct chat_tool_message *msgs, int n)
{
    return render_gen(f, tools, n_tools, date, msgs, n, true);
}

/* Whether chat_apply_tools renders the conversation (rather than refusing it). */
static bool renders(enum chat_family f, const char *const *tools, int n_tools,
                    const struct chat_tool_message *msgs, int n)
{
    char *s = render(f, tools, n_tools, "x", msgs, n);
    bool ok = s != NULL;
    free(s);
    return ok;
}

static void check_render_gen(enum chat_family f, const char *const *tools, int n_tools,
                             const char *date, const struct chat_tool_message *msgs, int n,
                             bool gen, const char *want)
{
    char *got = render_gen(f, tools, n_tools, date, msgs, n, gen);
    CHECK_MSG(got, "%s refused", chat_family_name(f));
    size_t at = 0;
    while (got[at] && got[at] == want[at])
        at++;
    CHECK_MSG(strcmp(got, want) == 0, "%s differs at byte %zu: got '%.60s', want '%.60s'",
              chat_family_name(f), at, got + at, want + at);
    free(got);
}

static void check_render(enum chat_family f, const char *const *tools, int n_tools,
                         const char *date, const struct chat_tool_message *msgs, int n,
                         const char *want)
{
    check_render_gen(f, tools, n_tools, date, msgs, n, true, want);
}

static void chatml_matches_qwen(void)
{
    const char *one[] = {WEATHER_LINE}, *two[] = {WEATHER_LINE, SEARCH_LINE};
    check_render(CHAT_CHATML, one, 1, "26 Jul 2024", CONV_A, N(CONV_A), CHATML_ONE_TOOL);
    check_render(CHAT_CHATML, two, 2, "26 Jul 2024", CONV_B, N(CONV_B), CHATML_TWO_TOOLS);
}

/* Qwen3's template (its text: tests/engine/test_chat.c's QWEN3 and the tools part of
 * Qwen-Qwen3-0.6B.jinja) by hand. Without reasoning it writes conversations A and B as
 * Qwen2.5 does but for the persona (chatml's). Conversation T: user, an assistant call of
 * get_weather with reasoning before it, its result. The call comes after the last query
 * (the user message) and has reasoning: '<|im_start|>assistant\n<think>\n' + reasoning +
 * '\n</think>\n\n' + content ("" after the split), then the call without a line break
 * before it (content is empty); the result in a user turn; the generation prompt, with
 * enable_thinking false '<think>\n\n</think>\n\n' after it. */
static const struct chat_tool_call WEATHER_PARIS = {"get_weather", "{\"city\": \"Paris\"}", NULL};
static const struct chat_tool_message CONV_T[] = {
    {"user", "What is the weather in Paris?", NULL, 0, NULL},
    {"assistant", "<think>\nI should call the tool.\n</think>\n\n", &WEATHER_PARIS, 1, NULL},
    {"tool", "sunny", NULL, 0, NULL},
};
static const char QWEN3_T[] =
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
    "</tools>\n"
    "\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n"
    "<tool_call>\n"
    "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\n"
    "What is the weather in Paris?<|im_end|>\n"
    "<|im_start|>assistant\n"
    "<think>\n"
    "I should call the tool.\n"
    "</think>\n"
    "\n"
    "<tool_call>\n"
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\n"
    "<tool_response>\n"
    "sunny\n"
    "</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n";

static void qwen3_matches_its_template(void)
{
    const char *one[] = {WEATHER_LINE}, *two[] = {WEATHER_LINE, SEARCH_LINE};
    check_render(CHAT_QWEN3, one, 1, "x", CONV_A, N(CONV_A), CHATML_ONE_TOOL);
    check_render(CHAT_QWEN3, two, 2, "x", CONV_B, N(CONV_B), CHATML_TWO_TOOLS);
    check_render(CHAT_QWEN3, one, 1, "x", CONV_T, N(CONV_T), QWEN3_T);
    char want[2048], got[2048];
    snprintf(want, sizeof want, "%s<think>\n\n</think>\n\n", QWEN3_T);
    CHECK_EQ(chat_apply_tools(CHAT_QWEN3, one, 1, "x", CONV_T, N(CONV_T), true, false, got,
                              sizeof got), (int)strlen(want));
    CHECK_MSG(!strcmp(got, want), "%s", got);
    /* text after the block comes before the call, a line break between them */
    struct chat_tool_message t[3];
    memcpy(t, CONV_T, sizeof t);
    t[1].content = "<think>r</think>\n\nLet me check.";
    CHECK(chat_apply_tools(CHAT_QWEN3, one, 1, "x", t, 3, false, true, got, sizeof got) > 0);
    CHECK_MSG(strstr(got, "<|im_start|>assistant\n<think>\nr\n</think>\n\nLet me check.\n"
                          "<tool_call>\n{\"name\""), "%s", got);
    /* an earlier turn's call (before the last query) drops its reasoning */
    struct chat_tool_message u[4];
    memcpy(u, CONV_T, sizeof CONV_T);
    u[3] = (struct chat_tool_message){"user", "Thanks", NULL, 0, NULL};
    CHECK(chat_apply_tools(CHAT_QWEN3, one, 1, "x", u, 4, true, true, got, sizeof got) > 0);
    CHECK_MSG(strstr(got, "<|im_start|>assistant\n<tool_call>\n{\"name\"") &&
                  !strstr(got, "I should"), "%s", got);
    /* the thinking models' generation prompt opens the block */
    CHECK(chat_apply_tools(CHAT_QWEN3_THINKING, one, 1, "x", CONV_T, N(CONV_T), true, false,
                           got, sizeof got) > 0);
    snprintf(want, sizeof want, "%s<think>\n", QWEN3_T);
    CHECK_MSG(!strcmp(got, want), "%s", got);
}

static void llama3_matches_llama_3_x(void)
{
    const char *one[] = {WEATHER_INDENTED}, *two[] = {WEATHER_INDENTED, SEARCH_INDENTED};
    check_render(CHAT_LLAMA3, one, 1, "26 Jul 2024", CONV_A, N(CONV_A), LLAMA3_ONE_TOOL);
    check_render(CHAT_LLAMA3, two, 2, "03 Feb 2026", CONV_L, N(CONV_L), LLAMA3_TWO_TOOLS);
}

static void mistral_matches_nemo(void)
{
    const char *one[] = {WEATHER_LINE}, *two[] = {WEATHER_LINE, SEARCH_LINE};
    const enum chat_family f = CHAT_MISTRAL_V3_TEKKEN;
    check_render(f, one, 1, "x", MCONV_SYS_USER, N(MCONV_SYS_USER), MISTRAL_SYS_USER);
    check_render(f, one, 1, "x", MCONV_A, N(MCONV_A), MISTRAL_CALL_RESULT);
    check_render(f, two, 2, "x", MCONV_B, N(MCONV_B), MISTRAL_TWO_CALLS);
    check_render(f, one, 1, "x", MCONV_RESULT_LAST, N(MCONV_RESULT_LAST), MISTRAL_RESULT_LAST);
}

static void hermes_matches_its_tool_use_template(void)
{
    const char *one[] = {HERMES_WEATHER_TEXT}, *two[] = {HERMES_WEATHER_TEXT, HERMES_SEARCH_TEXT};
    const enum chat_family f = CHAT_HERMES;
    check_render(f, one, 1, "x", CONV_A, N(CONV_A), HERMES_ONE_TOOL);
    check_render(f, two, 2, "x", CONV_B, N(CONV_B), HERMES_TWO_TOOLS);
    check_render_gen(f, one, 1, "x", CONV_R, N(CONV_R), false, HERMES_RESULTS_LAST);
    /* the generation prompt right after the "<|im_end|>" */
    char *with_gen = malloc(sizeof HERMES_RESULTS_LAST + 32);
    CHECK(with_gen);
    strcat(strcpy(with_gen, HERMES_RESULTS_LAST), "<|im_start|>assistant\n");
    check_render_gen(f, one, 1, "x", CONV_R, N(CONV_R), true, with_gen);
    free(with_gen);
    const struct chat_tool_message result_first[] = {
        {"tool", "sunny", NULL, 0, NULL},
        {"user", "Thanks", NULL, 0, NULL},
    };
    check_render_gen(f, one, 1, "x", result_first, 2, false, HERMES_RESULT_FIRST);
}

/* Where Mistral Nemo's template raises an exception. */
static void mistral_refusals(void)
{
    const char *one[] = {WEATHER_LINE};
    const enum chat_family f = CHAT_MISTRAL_V3_TEKKEN;
    struct chat_tool_call call = M_WEATHER_PARIS;
    struct chat_tool_message m[5];
    memcpy(m, MCONV_RESULT_LAST, sizeof MCONV_RESULT_LAST);
    CHECK(renders(f, one, 1, m, 4));
    /* "Tool call IDs should be alphanumeric strings with length 9!" */
    static const char *const bad_ids[] = {"abcDEF12", "abcDEF1234", "call_abcd", NULL};
    for (size_t i = 0; i < sizeof bad_ids / sizeof bad_ids[0]; i++) {
        m[3].call_id = bad_ids[i];
        CHECK(!renders(f, one, 1, m, 4));
        m[3].call_id = "abcDEF123";
        call.id = bad_ids[i];
        m[2].calls = &call;
        CHECK(!renders(f, one, 1, m, 4));
        m[2].calls = &M_WEATHER_PARIS;
    }
    /* "conversation roles must alternate": a user message right after a result */
    m[4] = (struct chat_tool_message){"user", "And Rome?", NULL, 0, NULL};
    CHECK(!renders(f, one, 1, m, 5));
    /* "Only user and assistant roles are supported, with the exception of an initial
     * optional system message" */
    m[4] = (struct chat_tool_message){"assistant", "Sunny.", NULL, 0, NULL};
    CHECK(renders(f, one, 1, m, 5));
    m[1] = m[0];
    m[0] = (struct chat_tool_message){"user", "Hi", NULL, 0, NULL};
    CHECK(!renders(f, one, 1, m, 5));
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
        bool has = f == CHAT_CHATML || f == CHAT_HERMES || f == CHAT_LLAMA3 ||
                   f == CHAT_MISTRAL_V3_TEKKEN || f == CHAT_QWEN3 || f == CHAT_QWEN3_THINKING ||
                   f == CHAT_GPT_OSS;
        CHECK_EQ(chat_tool_syntax((enum chat_family)f) != NULL, has);
        if (!has)
            CHECK(!render((enum chat_family)f, one, 1, "26 Jul 2024", CONV_A, N(CONV_A)));
    }
    struct chat_tool_message bad[] = {{"user", "hi", &SEARCH_PARIS, 1, NULL}};
    CHECK(!render(CHAT_CHATML, one, 1, "26 Jul 2024", bad, 1));
    bad[0] = (struct chat_tool_message){"function", "hi", NULL, 0, NULL};
    CHECK(!render(CHAT_CHATML, one, 1, "26 Jul 2024", bad, 1));
}

static void syntax_and_indent_per_family(void)
{
    const struct chat_tool_syntax *s = chat_tool_syntax(CHAT_CHATML);
    CHECK(s && !strcmp(s->open, "<tool_call>") && !strcmp(s->close, "</tool_call>") &&
          !strcmp(s->args_key, "arguments") && !s->whole);
    s = chat_tool_syntax(CHAT_LLAMA3);
    CHECK(s && !strcmp(s->open, "{") && !s->close && !strcmp(s->args_key, "parameters") && s->whole);
    s = chat_tool_syntax(CHAT_MISTRAL_V3_TEKKEN);
    CHECK(s && !strcmp(s->open, "[TOOL_CALLS]") && !s->close && !strcmp(s->args_key, "arguments") &&
          !s->whole && s->array);
    /* Hermes' calls are Qwen's, and Qwen3's */
    CHECK(chat_tool_syntax(CHAT_HERMES) == chat_tool_syntax(CHAT_CHATML));
    CHECK(chat_tool_syntax(CHAT_QWEN3) == chat_tool_syntax(CHAT_CHATML));
    CHECK(chat_tool_syntax(CHAT_QWEN3_THINKING) == chat_tool_syntax(CHAT_CHATML));
    CHECK_EQ(chat_tools_indent(CHAT_CHATML), 0);
    CHECK_EQ(chat_tools_indent(CHAT_HERMES), 0);
    CHECK_EQ(chat_tools_indent(CHAT_LLAMA3), 4);
    CHECK_EQ(chat_tools_indent(CHAT_MISTRAL_V3_TEKKEN), 0);
}

/* A buffer too small gets what fits and the full length, as chat_apply. */
static void small_buffer_is_sized(void)
{
    const char *one[] = {WEATHER_LINE};
    char small[16];
    int len = chat_apply_tools(CHAT_CHATML, one, 1, "x", CONV_A, N(CONV_A), true, true, small,
                               sizeof small);
    CHECK_EQ(len, (int)strlen(CHATML_ONE_TOOL));
    CHECK_EQ(strlen(small), sizeof small - 1);
    CHECK(!strncmp(small, CHATML_ONE_TOOL, sizeof small - 1));
}

int main(void)
{
    RUN(chatml_matches_qwen);
    RUN(qwen3_matches_its_template);
    RUN(llama3_matches_llama_3_x);
    RUN(mistral_matches_nemo);
    RUN(hermes_matches_its_tool_use_template);
    RUN(mistral_refusals);
    RUN(refusals);
    RUN(syntax_and_indent_per_family);
    RUN(small_buffer_is_sized);
    return test_finish();
}
