/* chatharmony.c — gpt-oss's harmony prompt (chatharmony.h). */
#include "engine/tok/chatharmony.h"

#include <limits.h>
#include <string.h>

#include "engine/jsonesc.h"
#include "engine/tok/textwriter.h"

bool chat_harmony_effort_valid(const char *s)
{
    return s && (strcmp(s, "low") == 0 || strcmp(s, "medium") == 0 || strcmp(s, "high") == 0);
}

void chat_harmony_answer(const char *reply, const char **answer, size_t *n)
{
    static const char final[] = "<|channel|>final<|message|>";
    static const char *const enders[] = {"<|end|>", "<|return|>", "<|call|>"};
    const char *body = NULL;
    for (const char *p = reply; (p = strstr(p, final)); p += strlen(final))
        body = p + strlen(final);
    if (!body) {
        *answer = reply;
        *n = strstr(reply, "<|message|>") ? 0 : strlen(reply);
        return;
    }
    size_t len = strlen(body);
    for (size_t k = 0; k < sizeof enders / sizeof enders[0]; k++) {
        const char *e = strstr(body, enders[k]);
        if (e && (size_t)(e - body) < len)
            len = (size_t)(e - body);
    }
    *answer = body;
    *n = len;
}

static bool is_role(const struct chat_tool_message *m, const char *role)
{
    return strcmp(m->role, role) == 0;
}

/* Whether a text holds a channel's markup, which the template refuses in a message. */
static bool has_channel_markup(const char *s)
{
    return s && (strstr(s, "<|channel|>analysis<|message|>") ||
                 strstr(s, "<|channel|>final<|message|>"));
}

static const char *reasoning_of(const struct chat_harmony_opts *o, int i)
{
    return o->reasoning ? o->reasoning[i] : NULL;
}

static bool valid(const struct chat_harmony_opts *o, const struct chat_tool_message *m, int i)
{
    if (!chat_tool_message_well_formed(m))
        return false;
    if (is_role(m, "assistant")) {
        const char *r = reasoning_of(o, i);
        if (has_channel_markup(m->content) || has_channel_markup(r))
            return false;
        /* "Cannot pass both content and thinking in an assistant message with tool
         * calls!" */
        if (m->n_calls > 0 && m->content[0] && r && r[0])
            return false;
    }
    return is_role(m, "system") || is_role(m, "developer") || is_role(m, "user") ||
           is_role(m, "assistant") || is_role(m, "tool");
}

static void put_bytes(void *w, const char *b, size_t n)
{
    textwriter_put_n(w, b, n);
}

static void system_turn(textwriter *w, const struct chat_harmony_opts *o, bool tools)
{
    textwriter_put(w, "<|start|>system<|message|>You are ChatGPT, a large language model "
                      "trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: ");
    textwriter_put(w, o->date);
    textwriter_put(w, "\n\nReasoning: ");
    textwriter_put(w, o->effort ? o->effort : "medium");
    textwriter_put(w, "\n\n# Valid channels: analysis, commentary, final. Channel must be "
                      "included for every message.");
    if (tools)
        textwriter_put(w, "\nCalls to these tools must go to the commentary channel: "
                          "'functions'.");
    textwriter_put(w, "<|end|>");
}

static void developer_turn(textwriter *w, const char *instructions, const char *const *tools,
                           int n_tools)
{
    if (!instructions[0] && n_tools == 0)
        return;
    textwriter_put(w, "<|start|>developer<|message|>");
    if (instructions[0]) {
        textwriter_put(w, "# Instructions\n\n");
        textwriter_put(w, instructions);
        textwriter_put(w, "\n\n");
    }
    if (n_tools > 0) {
        textwriter_put(w, "# Tools\n\n## functions\n\nnamespace functions {\n\n");
        for (int t = 0; t < n_tools; t++)
            textwriter_put(w, tools[t]);
        textwriter_put(w, "} // namespace functions");
    }
    textwriter_put(w, "<|end|>");
}

static void analysis(textwriter *w, const char *text)
{
    textwriter_put(w, "<|start|>assistant<|channel|>analysis<|message|>");
    textwriter_put(w, text);
    textwriter_put(w, "<|end|>");
}

/* Whether an assistant message without calls follows message i (the template's
 * future_final_message: the turn with i's calls is over). */
static bool final_follows(const struct chat_tool_message *msgs, int i, int n)
{
    for (int j = i + 1; j < n; j++)
        if (is_role(&msgs[j], "assistant") && msgs[j].n_calls == 0)
            return true;
    return false;
}

static int apply(textwriter *w, const struct chat_harmony_opts *o, const char *const *tools,
                 int n_tools, const struct chat_tool_message *msgs, int n, bool gen)
{
    int first = n > 0 && (is_role(&msgs[0], "system") || is_role(&msgs[0], "developer"));
    system_turn(w, o, n_tools > 0);
    developer_turn(w, first ? msgs[0].content : "", tools, n_tools);
    const char *last_call = NULL;
    for (int i = first; i < n; i++) {
        const struct chat_tool_message *m = &msgs[i];
        const char *r = reasoning_of(o, i);
        if (is_role(m, "assistant") && m->n_calls > 0) {
            if (!final_follows(msgs, i, n)) {
                if (m->content[0])
                    analysis(w, m->content);
                else if (r && r[0])
                    analysis(w, r);
            }
            /* the template assumes one call a message and writes the first */
            textwriter_put(w, "<|start|>assistant to=functions.");
            textwriter_put(w, m->calls[0].name);
            textwriter_put(w, "<|channel|>commentary json<|message|>");
            textwriter_put(w, m->calls[0].arguments);
            textwriter_put(w, "<|call|>");
            last_call = m->calls[0].name;
        } else if (is_role(m, "assistant")) {
            bool training_end = i == n - 1 && !gen;
            if (training_end && r)
                analysis(w, r);
            textwriter_put(w, "<|start|>assistant<|channel|>final<|message|>");
            textwriter_put(w, m->content);
            textwriter_put(w, training_end ? "<|return|>" : "<|end|>");
            last_call = NULL;
        } else if (is_role(m, "tool")) {
            /* "Message has tool role, but there was no previous assistant message with a
             * tool call!" */
            if (!last_call)
                return -1;
            textwriter_put(w, "<|start|>functions.");
            textwriter_put(w, last_call);
            textwriter_put(w, " to=assistant<|channel|>commentary<|message|>\"");
            jsonesc_write(m->content, strlen(m->content), put_bytes, w);
            textwriter_put(w, "\"<|end|>");
        } else if (is_role(m, "user")) {
            textwriter_put(w, "<|start|>user<|message|>");
            textwriter_put(w, m->content);
            textwriter_put(w, "<|end|>");
        }
    }
    if (gen)
        textwriter_put(w, "<|start|>assistant");
    return 0;
}

int chat_harmony_apply(const struct chat_harmony_opts *o, const char *const *tools, int n_tools,
                       const struct chat_tool_message *msgs, int n, bool add_generation_prompt,
                       char *out, size_t cap)
{
    if (!o || !o->date || (o->effort && !chat_harmony_effort_valid(o->effort)) || n_tools < 0 ||
        (n_tools > 0 && !tools) || n < 0 || (n > 0 && !msgs) || (cap > 0 && !out))
        return -1;
    for (int t = 0; t < n_tools; t++)
        if (!tools[t])
            return -1;
    for (int i = 0; i < n; i++)
        if (!valid(o, &msgs[i], i))
            return -1;
    textwriter w = {out, cap, 0};
    int rc = apply(&w, o, tools, n_tools, msgs, n, add_generation_prompt);
    if (cap > 0)
        out[w.len < cap ? w.len : cap - 1] = '\0';
    return rc < 0 || w.len > INT_MAX ? -1 : (int)w.len;
}
