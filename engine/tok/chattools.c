/* chattools.c — conversations with tools in the chatml, llama3 and mistral formats
 * (chattools.h). */
#include "engine/tok/chattools.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

static const struct chat_tool_syntax chatml_syntax = {"<tool_call>", "</tool_call>", "arguments",
                                                      false, false};
static const struct chat_tool_syntax llama3_syntax = {"{", NULL, "parameters", true, false};
static const struct chat_tool_syntax mistral_syntax = {"[TOOL_CALLS]", NULL, "arguments", false,
                                                       true};

const struct chat_tool_syntax *chat_tool_syntax(enum chat_family f)
{
    switch (f) {
    case CHAT_CHATML:
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

/* snprintf-style output: writes what fits, counts everything (as chat.c's). */
typedef struct writer {
    char *out;
    size_t cap;
    size_t len;
} writer;

static void put_n(writer *w, const char *s, size_t n)
{
    if (w->len < w->cap) {
        size_t room = w->cap - w->len;
        memcpy(w->out + w->len, s, n < room ? n : room);
    }
    w->len += n;
}

static void put(writer *w, const char *s)
{
    put_n(w, s, strlen(s));
}

static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

/* Jinja's trim: leading and trailing white space removed. */
static void put_trimmed(writer *w, const char *s)
{
    size_t n = strlen(s);
    while (n > 0 && is_space(*s))
        s++, n--;
    while (n > 0 && is_space(s[n - 1]))
        n--;
    put_n(w, s, n);
}

/* s as a JSON string, as Python's json.dumps(ensure_ascii=False) writes it. */
static void put_json_string(writer *w, const char *s)
{
    put(w, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char esc[8];
        switch (c) {
        case '"': put(w, "\\\""); break;
        case '\\': put(w, "\\\\"); break;
        case '\n': put(w, "\\n"); break;
        case '\r': put(w, "\\r"); break;
        case '\t': put(w, "\\t"); break;
        case '\b': put(w, "\\b"); break;
        case '\f': put(w, "\\f"); break;
        default:
            if (c < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", c);
                put(w, esc);
            } else {
                put_n(w, s, 1);
            }
        }
    }
    put(w, "\"");
}

static bool is_role(const struct chat_tool_message *m, const char *role)
{
    return strcmp(m->role, role) == 0;
}

static bool valid(const struct chat_tool_message *m)
{
    if (!m->role || !m->content || m->n_calls < 0 || (m->n_calls > 0 && !m->calls))
        return false;
    if (m->n_calls > 0 && !is_role(m, "assistant"))
        return false;
    for (int k = 0; k < m->n_calls; k++)
        if (!m->calls[k].name || !m->calls[k].arguments)
            return false;
    return is_role(m, "system") || is_role(m, "user") || is_role(m, "assistant") ||
           is_role(m, "tool");
}

/* Qwen's system turn: the system message (if first), then the tools section. */
static void chatml_tools_turn(writer *w, const char *system, const char *const *tools, int n_tools)
{
    put(w, "<|im_start|>system\n");
    if (system) {
        put(w, system);
        put(w, "\n\n");
    }
    put(w, "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
           "You are provided with function signatures within <tools></tools> XML tags:\n"
           "<tools>");
    for (int i = 0; i < n_tools; i++) {
        put(w, "\n");
        put(w, tools[i]);
    }
    put(w, "\n</tools>\n\nFor each function call, return a json object with function name "
           "and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
           "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
           "</tool_call><|im_end|>\n");
}

static void chatml_calls(writer *w, const struct chat_tool_message *m)
{
    put(w, "<|im_start|>assistant");
    if (m->content[0]) {
        put(w, "\n");
        put(w, m->content);
    }
    for (int k = 0; k < m->n_calls; k++) {
        put(w, "\n<tool_call>\n{\"name\": \"");
        put(w, m->calls[k].name);
        put(w, "\", \"arguments\": ");
        put(w, m->calls[k].arguments);
        put(w, "}\n</tool_call>");
    }
    put(w, "<|im_end|>\n");
}

static int apply_chatml(writer *w, const char *const *tools, int n_tools,
                        const struct chat_tool_message *msgs, int n, bool gen)
{
    int first = n > 0 && is_role(&msgs[0], "system");
    chatml_tools_turn(w, first ? msgs[0].content : NULL, tools, n_tools);
    for (int i = first; i < n; i++) {
        const struct chat_tool_message *m = &msgs[i];
        if (is_role(m, "tool")) {
            /* consecutive results share one user turn */
            if (i == 0 || !is_role(&msgs[i - 1], "tool"))
                put(w, "<|im_start|>user");
            put(w, "\n<tool_response>\n");
            put(w, m->content);
            put(w, "\n</tool_response>");
            if (i == n - 1 || !is_role(&msgs[i + 1], "tool"))
                put(w, "<|im_end|>\n");
        } else if (m->n_calls > 0) {
            chatml_calls(w, m);
        } else {
            put(w, "<|im_start|>");
            put(w, m->role);
            put(w, "\n");
            put(w, m->content);
            put(w, "<|im_end|>\n");
        }
    }
    if (gen)
        put(w, "<|im_start|>assistant\n");
    return 0;
}

static void llama3_header(writer *w, const char *role)
{
    put(w, "<|start_header_id|>");
    put(w, role);
    put(w, "<|end_header_id|>\n\n");
}

static int apply_llama3(writer *w, const char *const *tools, int n_tools, const char *date,
                        const struct chat_tool_message *msgs, int n, bool gen)
{
    int i = 0;
    llama3_header(w, "system");
    put(w, "Environment: ipython\nCutting Knowledge Date: December 2023\nToday Date: ");
    put(w, date);
    put(w, "\n\n");
    if (n > 0 && is_role(&msgs[0], "system"))
        put_trimmed(w, msgs[i++].content);
    put(w, "<|eot_id|>");
    /* the template puts the tools in the first message after the system one, a user's */
    if (i >= n || !is_role(&msgs[i], "user"))
        return -1;
    llama3_header(w, "user");
    put(w, "Given the following functions, please respond with a JSON for a function call "
           "with its proper arguments that best answers the given prompt.\n\n"
           "Respond in the format {\"name\": function name, \"parameters\": dictionary of "
           "argument name and its value}.Do not use variables.\n\n");
    for (int t = 0; t < n_tools; t++) {
        put(w, tools[t]);
        put(w, "\n\n");
    }
    put_trimmed(w, msgs[i++].content);
    put(w, "<|eot_id|>");
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
            put(w, "{\"name\": \"");
            put(w, m->calls[0].name);
            put(w, "\", \"parameters\": ");
            put(w, m->calls[0].arguments);
            put(w, "}");
        } else {
            llama3_header(w, m->role);
            put_trimmed(w, m->content);
        }
        put(w, "<|eot_id|>");
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

static void mistral_tools(writer *w, const char *const *tools, int n_tools)
{
    put(w, "[AVAILABLE_TOOLS][");
    for (int t = 0; t < n_tools; t++) {
        put(w, tools[t]);
        put(w, t + 1 < n_tools ? ", " : "]");
    }
    put(w, "[/AVAILABLE_TOOLS]");
}

/* An assistant message's calls as one array, each the function's tojson with the id. */
static int mistral_calls(writer *w, const struct chat_tool_message *m)
{
    put(w, "[TOOL_CALLS][");
    for (int k = 0; k < m->n_calls; k++) {
        if (!is_mistral_id(m->calls[k].id))
            return -1;
        put(w, "{\"name\": ");
        put_json_string(w, m->calls[k].name);
        put(w, ", \"arguments\": ");
        put(w, m->calls[k].arguments);
        put(w, ", \"id\": \"");
        put(w, m->calls[k].id);
        put(w, k + 1 < m->n_calls ? "\"}, " : "\"}]</s>");
    }
    return 0;
}

static int apply_mistral(writer *w, const char *const *tools, int n_tools,
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
            put(w, "[INST]");
            /* the template's "loop.last": a system message goes into the turn that ends
             * the conversation, and is lost when a result or a reply ends it */
            if (system && i == n - 1) {
                put(w, system);
                put(w, "\n\n");
            }
            put(w, m->content);
            put(w, "[/INST]");
        } else if (m->n_calls > 0) {
            if (mistral_calls(w, m) < 0)
                return -1;
        } else if (is_role(m, "assistant")) {
            put(w, m->content);
            put(w, "</s>");
        } else if (is_role(m, "tool") && is_mistral_id(m->call_id)) {
            /* the result as it is, not as a JSON string: the template's content|string */
            put(w, "[TOOL_RESULTS]{\"content\": ");
            put(w, m->content);
            put(w, ", \"call_id\": \"");
            put(w, m->call_id);
            put(w, "\"}[/TOOL_RESULTS]");
        } else {
            return -1; /* a system message after the first, or a result without its id */
        }
    }
    return 0;
}

int chat_apply_tools(enum chat_family f, const char *const *tools, int n_tools, const char *date,
                     const struct chat_tool_message *msgs, int n, bool add_generation_prompt,
                     char *out, size_t cap)
{
    if (!chat_tool_syntax(f) || n_tools < 0 || (n_tools > 0 && !tools) || !date || n < 0 ||
        (n > 0 && !msgs) || (cap > 0 && !out))
        return -1;
    for (int t = 0; t < n_tools; t++)
        if (!tools[t])
            return -1;
    for (int i = 0; i < n; i++)
        if (!valid(&msgs[i]))
            return -1;
    writer w = {out, cap, 0};
    int rc;
    /* mistral's templates open the reply with the user's "[/INST]": no generation prompt */
    if (f == CHAT_LLAMA3)
        rc = apply_llama3(&w, tools, n_tools, date, msgs, n, add_generation_prompt);
    else if (f == CHAT_MISTRAL_V3_TEKKEN)
        rc = apply_mistral(&w, tools, n_tools, msgs, n);
    else
        rc = apply_chatml(&w, tools, n_tools, msgs, n, add_generation_prompt);
    if (cap > 0)
        out[w.len < cap ? w.len : cap - 1] = '\0';
    return rc < 0 || w.len > INT_MAX ? -1 : (int)w.len;
}
