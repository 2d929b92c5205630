/* chattools.c — conversations with tools in the chatml (Qwen2.5's and Qwen3's), hermes,
 * llama3 and mistral formats (chattools.h). */
#include "engine/tok/chattools.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "engine/jsonesc.h"
#include "engine/tok/chatharmony.h"
#include "engine/tok/chatthink.h"
#include "engine/tok/textwriter.h"

static const struct chat_tool_syntax chatml_syntax = {"<tool_call>", "</tool_call>", "arguments",
                                                      false, false};
static const struct chat_tool_syntax llama3_syntax = {"{", NULL, "parameters", true, false};
static const struct chat_tool_syntax mistral_syntax = {"[TOOL_CALLS]", NULL, "arguments", false,
                                                       true};

const struct chat_tool_syntax *chat_tool_syntax(enum chat_family f)
{
    switch (f) {
    case CHAT_CHATML:
    case CHAT_HERMES: /* the same calls: Qwen2.5 took Hermes' style */
    case CHAT_QWEN3:
    case CHAT_QWEN3_THINKING:
    /* gpt-oss's calls are channels of their own, which the gateway's reading of its
     * replies (daemon/net/harmony.h) gives in this syntax */
    case CHAT_GPT_OSS:
        return &chatml_syntax;
    case CHAT_LLAMA3:
        return &llama3_syntax;
    case CHAT_MISTRAL_V3_TEKKEN: /* Mistral Nemo's template is detected as this one */
        return &mistral_syntax;
    default:
        return NULL;
    }
}

int chat_tools_indent(enum chat_family f)
{
    return f == CHAT_LLAMA3 ? 4 : 0;
}

static void put_bytes(void *w, const char *b, size_t n)
{
    textwriter_put_n(w, b, n);
}

/* s as a JSON string, as Python's json.dumps(ensure_ascii=False) writes it. */
static void put_json_string(textwriter *w, const char *s)
{
    textwriter_put(w, "\"");
    jsonesc_write(s, strlen(s), put_bytes, w);
    textwriter_put(w, "\"");
}

static bool is_role(const struct chat_tool_message *m, const char *role)
{
    return strcmp(m->role, role) == 0;
}

bool chat_tool_message_well_formed(const struct chat_tool_message *m)
{
    if (!m->role || !m->content || m->n_calls < 0 || (m->n_calls > 0 && !m->calls))
        return false;
    if (m->n_calls > 0 && !is_role(m, "assistant"))
        return false;
    for (int k = 0; k < m->n_calls; k++)
        if (!m->calls[k].name || !m->calls[k].arguments)
            return false;
    return true;
}

static bool valid(const struct chat_tool_message *m)
{
    return chat_tool_message_well_formed(m) &&
           (is_role(m, "system") || is_role(m, "user") || is_role(m, "assistant") ||
            is_role(m, "tool"));
}

/* Qwen's system turn: the system message (if first), then the tools section. */
static void chatml_tools_turn(textwriter *w, const char *system, const char *const *tools, int n_tools)
{
    textwriter_put(w, "<|im_start|>system\n");
    if (system) {
        textwriter_put(w, system);
        textwriter_put(w, "\n\n");
    }
    textwriter_put(w, "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
           "You are provided with function signatures within <tools></tools> XML tags:\n"
           "<tools>");
    for (int i = 0; i < n_tools; i++) {
        textwriter_put(w, "\n");
        textwriter_put(w, tools[i]);
    }
    textwriter_put(w, "\n</tools>\n\nFor each function call, return a json object with function name "
           "and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
           "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
           "</tool_call><|im_end|>\n");
}

/* A message without calls as a chatml turn. */
static void chatml_turn(textwriter *w, const struct chat_tool_message *m)
{
    textwriter_put(w, "<|im_start|>");
    textwriter_put(w, m->role);
    textwriter_put(w, "\n");
    textwriter_put(w, m->content);
    textwriter_put(w, "<|im_end|>\n");
}

/* The calls of an assistant turn, each after a line break but a first one right after
 * the opening (Qwen3's template: after its empty content), and the end of the turn. */
static void chatml_call_list(textwriter *w, const struct chat_tool_message *m, bool first_break)
{
    for (int k = 0; k < m->n_calls; k++) {
        textwriter_put(w, k > 0 || first_break ? "\n" : "");
        textwriter_put(w, "<tool_call>\n{\"name\": \"");
        textwriter_put(w, m->calls[k].name);
        textwriter_put(w, "\", \"arguments\": ");
        textwriter_put(w, m->calls[k].arguments);
        textwriter_put(w, "}\n</tool_call>");
    }
    textwriter_put(w, "<|im_end|>\n");
}

/* An assistant turn with calls; with_text (Qwen's): the text said before them first. */
static void chatml_calls(textwriter *w, const struct chat_tool_message *m, bool with_text)
{
    textwriter_put(w, "<|im_start|>assistant");
    if (with_text && m->content[0]) {
        textwriter_put(w, "\n");
        textwriter_put(w, m->content);
    }
    chatml_call_list(w, m, true);
}

/* Qwen2.5's template, or Qwen3's (f qwen3 or qwen3-thinking: an assistant message as
 * chatthink_put_reply writes it, its calls after it, and the generation prompt as
 * chat_apply_think writes it). */
static int apply_chatml(textwriter *w, enum chat_family f, const char *const *tools, int n_tools,
                        const struct chat_tool_message *msgs, int n, bool gen,
                        bool enable_thinking)
{
    bool qwen3 = f == CHAT_QWEN3 || f == CHAT_QWEN3_THINKING;
    int first = n > 0 && is_role(&msgs[0], "system"), last_query = n - 1;
    for (int i = n - 1; i >= 0; i--)
        if (chatthink_is_query(msgs[i].role, msgs[i].content)) {
            last_query = i;
            break;
        }
    chatml_tools_turn(w, first ? msgs[0].content : NULL, tools, n_tools);
    for (int i = first; i < n; i++) {
        const struct chat_tool_message *m = &msgs[i];
        if (is_role(m, "tool")) {
            /* consecutive results share one user turn */
            if (i == 0 || !is_role(&msgs[i - 1], "tool"))
                textwriter_put(w, "<|im_start|>user");
            textwriter_put(w, "\n<tool_response>\n");
            textwriter_put(w, m->content);
            textwriter_put(w, "\n</tool_response>");
            if (i == n - 1 || !is_role(&msgs[i + 1], "tool"))
                textwriter_put(w, "<|im_end|>\n");
        } else if (qwen3 && is_role(m, "assistant")) {
            bool content = chatthink_put_reply(w, m->content, i > last_query, i == n - 1);
            chatml_call_list(w, m, content);
        } else if (m->n_calls > 0) {
            chatml_calls(w, m, true);
        } else {
            chatml_turn(w, m);
        }
    }
    if (!gen)
        return 0;
    textwriter_put(w, "<|im_start|>assistant\n");
    if (f == CHAT_QWEN3_THINKING)
        textwriter_put(w, "<think>\n");
    else if (f == CHAT_QWEN3 && !enable_thinking)
        textwriter_put(w, "<think>\n\n</think>\n\n");
    return 0;
}

/* Hermes' tool_use template: its system turn listing the tools (each its text as the
 * template writes it, one after the other on their own lines) and the FunctionCall
 * schema; the messages, the system message among them, as chatml turns but for an
 * assistant's calls (its text not written) and results in "tool" turns, opened only after
 * another message, whose "<|im_end|>" ends no line. */
static int apply_hermes(textwriter *w, const char *const *tools, int n_tools,
                        const struct chat_tool_message *msgs, int n, bool gen)
{
    textwriter_put(w, "<|im_start|>system\nYou are a function calling AI model. You are provided "
           "with function signatures within <tools></tools> XML tags. You may call one or more "
           "functions to assist with the user query. Don't make assumptions about what values "
           "to plug into functions. Here are the available tools: <tools> ");
    for (int t = 0; t < n_tools; t++) {
        textwriter_put(w, t > 0 ? "\n" : "");
        textwriter_put(w, tools[t]);
    }
    textwriter_put(w, " </tools>Use the following pydantic model json schema for each tool call "
           "you will make: {\"properties\": {\"name\": {\"title\": \"Name\", \"type\": "
           "\"string\"}, \"arguments\": {\"title\": \"Arguments\", \"type\": \"object\"}}, "
           "\"required\": [\"name\", \"arguments\"], \"title\": \"FunctionCall\", \"type\": "
           "\"object\"}}\nFor each function call return a json object with function name and "
           "arguments within <tool_call></tool_call> XML tags as follows:\n<tool_call>\n"
           "{\"name\": <function-name>, \"arguments\": <args-dict>}\n</tool_call><|im_end|>\n");
    for (int i = 0; i < n; i++) {
        const struct chat_tool_message *m = &msgs[i];
        bool last = i == n - 1;
        if (is_role(m, "tool")) {
            if (i > 0 && !is_role(&msgs[i - 1], "tool"))
                textwriter_put(w, "<|im_start|>tool\n");
            textwriter_put(w, "<tool_response>\n");
            textwriter_put(w, m->content);
            textwriter_put(w, last ? "\n</tool_response>" : "\n</tool_response>\n");
            if (last || !is_role(&msgs[i + 1], "tool"))
                textwriter_put(w, "<|im_end|>");
        } else if (m->n_calls > 0) {
            chatml_calls(w, m, false);
        } else {
            chatml_turn(w, m);
        }
    }
    if (gen)
        textwriter_put(w, "<|im_start|>assistant\n");
    return 0;
}

static void llama3_header(textwriter *w, const char *role)
{
    textwriter_put(w, "<|start_header_id|>");
    textwriter_put(w, role);
    textwriter_put(w, "<|end_header_id|>\n\n");
}

static int apply_llama3(textwriter *w, const char *const *tools, int n_tools, const char *date,
                        const struct chat_tool_message *msgs, int n, bool gen)
{
    int i = 0;
    llama3_header(w, "system");
    textwriter_put(w, "Environment: ipython\nCutting Knowledge Date: December 2023\nToday Date: ");
    textwriter_put(w, date);
    textwriter_put(w, "\n\n");
    if (n > 0 && is_role(&msgs[0], "system"))
        textwriter_put_trimmed(w, msgs[i++].content);
    textwriter_put(w, "<|eot_id|>");
    /* the template puts the tools in the first message after the system one, a user's */
    if (i >= n || !is_role(&msgs[i], "user"))
        return -1;
    llama3_header(w, "user");
    textwriter_put(w, "Given the following functions, please respond with a JSON for a function call "
           "with its proper arguments that best answers the given prompt.\n\n"
           "Respond in the format {\"name\": function name, \"parameters\": dictionary of "
           "argument name and its value}.Do not use variables.\n\n");
    for (int t = 0; t < n_tools; t++) {
        textwriter_put(w, tools[t]);
        textwriter_put(w, "\n\n");
    }
    textwriter_put_trimmed(w, msgs[i++].content);
    textwriter_put(w, "<|eot_id|>");
    for (; i < n; i++) {
        const struct chat_tool_message *m = &msgs[i];
        if (is_role(m, "tool")) {
            llama3_header(w, "ipython");
            put_json_string(w, m->content);
        } else if (m->n_calls > 0) {
            /* the template raises "This model only supports single tool-calls at once!" */
            if (m->n_calls != 1)
                return -1;
            llama3_header(w, "assistant");
            textwriter_put(w, "{\"name\": \"");
            textwriter_put(w, m->calls[0].name);
            textwriter_put(w, "\", \"parameters\": ");
            textwriter_put(w, m->calls[0].arguments);
            textwriter_put(w, "}");
        } else {
            llama3_header(w, m->role);
            textwriter_put_trimmed(w, m->content);
        }
        textwriter_put(w, "<|eot_id|>");
    }
    if (gen)
        llama3_header(w, "assistant");
    return 0;
}

/* Mistral's call ids: 9 ASCII letters and digits (the template raises otherwise). */
static bool is_mistral_id(const char *id)
{
    size_t n = 0;
    for (; id && id[n]; n++)
        if (!((id[n] >= '0' && id[n] <= '9') || (id[n] >= 'a' && id[n] <= 'z') ||
              (id[n] >= 'A' && id[n] <= 'Z')))
            return false;
    return id && n == 9;
}

/* The template's check: after the optional system message, the messages other than tool
 * results and calls go user, assistant, user, ... */
static bool mistral_alternates(const struct chat_tool_message *msgs, int n)
{
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (is_role(&msgs[i], "tool") || msgs[i].n_calls > 0)
            continue;
        if (is_role(&msgs[i], "user") != (k % 2 == 0))
            return false;
        k++;
    }
    return true;
}

static void mistral_tools(textwriter *w, const char *const *tools, int n_tools)
{
    textwriter_put(w, "[AVAILABLE_TOOLS][");
    for (int t = 0; t < n_tools; t++) {
        textwriter_put(w, tools[t]);
        textwriter_put(w, t + 1 < n_tools ? ", " : "]");
    }
    textwriter_put(w, "[/AVAILABLE_TOOLS]");
}

/* An assistant message's calls as one array, each the function's tojson with the id. */
static int mistral_calls(textwriter *w, const struct chat_tool_message *m)
{
    textwriter_put(w, "[TOOL_CALLS][");
    for (int k = 0; k < m->n_calls; k++) {
        if (!is_mistral_id(m->calls[k].id))
            return -1;
        textwriter_put(w, "{\"name\": ");
        put_json_string(w, m->calls[k].name);
        textwriter_put(w, ", \"arguments\": ");
        textwriter_put(w, m->calls[k].arguments);
        textwriter_put(w, ", \"id\": \"");
        textwriter_put(w, m->calls[k].id);
        textwriter_put(w, k + 1 < m->n_calls ? "\"}, " : "\"}]</s>");
    }
    return 0;
}

static int apply_mistral(textwriter *w, const char *const *tools, int n_tools,
                         const struct chat_tool_message *msgs, int n)
{
    int first = n > 0 && is_role(&msgs[0], "system"), last_user = -1;
    const char *system = first ? msgs[0].content : NULL;
    if (!mistral_alternates(msgs + first, n - first))
        return -1;
    for (int i = first; i < n; i++)
        if (is_role(&msgs[i], "user"))
            last_user = i;
    for (int i = first; i < n; i++) {
        const struct chat_tool_message *m = &msgs[i];
        if (is_role(m, "user")) {
            if (i == last_user)
                mistral_tools(w, tools, n_tools);
            textwriter_put(w, "[INST]");
            /* the template's "loop.last": a system message goes into the turn that ends
             * the conversation, and is lost when a result or a reply ends it */
            if (system && i == n - 1) {
                textwriter_put(w, system);
                textwriter_put(w, "\n\n");
            }
            textwriter_put(w, m->content);
            textwriter_put(w, "[/INST]");
        } else if (m->n_calls > 0) {
            if (mistral_calls(w, m) < 0)
                return -1;
        } else if (is_role(m, "assistant")) {
            textwriter_put(w, m->content);
            textwriter_put(w, "</s>");
        } else if (is_role(m, "tool") && is_mistral_id(m->call_id)) {
            /* the result as it is, not as a JSON string: the template's content|string */
            textwriter_put(w, "[TOOL_RESULTS]{\"content\": ");
            textwriter_put(w, m->content);
            textwriter_put(w, ", \"call_id\": \"");
            textwriter_put(w, m->call_id);
            textwriter_put(w, "\"}[/TOOL_RESULTS]");
        } else {
            return -1; /* a system message after the first, or a result without its id */
        }
    }
    return 0;
}

int chat_apply_tools(enum chat_family f, const char *const *tools, int n_tools, const char *date,
                     const struct chat_tool_message *msgs, int n, bool add_generation_prompt,
                     bool enable_thinking, char *out, size_t cap)
{
    if (f == CHAT_GPT_OSS) {
        struct chat_harmony_opts o = {date, NULL, NULL};
        return chat_harmony_apply(&o, tools, n_tools, msgs, n, add_generation_prompt, out, cap);
    }
    if (!chat_tool_syntax(f) || n_tools < 0 || (n_tools > 0 && !tools) || !date || n < 0 ||
        (n > 0 && !msgs) || (cap > 0 && !out))
        return -1;
    for (int t = 0; t < n_tools; t++)
        if (!tools[t])
            return -1;
    for (int i = 0; i < n; i++)
        if (!valid(&msgs[i]))
            return -1;
    textwriter w = {out, cap, 0};
    int rc;
    /* mistral's templates open the reply with the user's "[/INST]": no generation prompt */
    if (f == CHAT_LLAMA3)
        rc = apply_llama3(&w, tools, n_tools, date, msgs, n, add_generation_prompt);
    else if (f == CHAT_HERMES)
        rc = apply_hermes(&w, tools, n_tools, msgs, n, add_generation_prompt);
    else if (f == CHAT_MISTRAL_V3_TEKKEN)
        rc = apply_mistral(&w, tools, n_tools, msgs, n);
    else
        rc = apply_chatml(&w, f, tools, n_tools, msgs, n, add_generation_prompt,
                          enable_thinking);
    if (cap > 0)
        out[w.len < cap ? w.len : cap - 1] = '\0';
    return rc < 0 || w.len > INT_MAX ? -1 : (int)w.len;
}
