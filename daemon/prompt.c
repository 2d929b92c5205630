/*
 * prompt.c — rendering turns with the chat template and tokenizing what is new.
 */
#include "daemon/prompt.h"

#include <stdlib.h>
#include <string.h>

#include "engine/tok/chatharmony.h"

int prompt_tokenize(const tokenizer *tok, const char *text, size_t len, bool add_special,
                    bool parse_special, int32_t **out, int *n, char err[ERR_MAX])
{
    int need = tok_encode(tok, text, len, add_special, parse_special, NULL, 0);
    if (need < 0)
        return err_set(err, "tokenizer failed on the text");
    int32_t *ids = malloc(sizeof *ids * (size_t)(need > 0 ? need : 1));
    if (!ids)
        return err_set(err, "out of memory");
    if (need > 0 && tok_encode(tok, text, len, add_special, parse_special, ids, need) != need) {
        free(ids);
        return err_set(err, "tokenizer failed on the text");
    }
    *out = ids;
    *n = need;
    return 0;
}

/* chat_apply_think into a fresh string. */
static char *render_think(enum chat_family f, const struct chat_message *msgs, int n, bool gen,
                          bool enable_thinking, char err[ERR_MAX])
{
    int need = chat_apply_think(f, msgs, n, gen, enable_thinking, NULL, 0);
    char *s = need >= 0 ? malloc((size_t)need + 1) : NULL;
    if (!s) {
        err_set(err, need < 0 ? "the chat template cannot render the conversation"
                              : "out of memory");
        return NULL;
    }
    chat_apply_think(f, msgs, n, gen, enable_thinking, s, (size_t)need + 1);
    return s;
}

/* chat_apply into a fresh string. */
static char *render(enum chat_family f, const struct chat_message *msgs, int n, bool gen,
                    char err[ERR_MAX])
{
    return render_think(f, msgs, n, gen, true, err);
}

/* When G does not continue the rendering full (held is its first hl bytes), what follows
 * the reply there still closes the reply's turn ("</s>", "<|im_end|>") before the new
 * one: full from the end of the reply as the client saw it (after no more than the white
 * space a template puts before a reply), less what of it G already holds past that
 * reply. NULL when the reply is not there as it was (templates that trim it). */
static char *after_reply(const char *full, size_t hl, const char *reply, const char *g)
{
    size_t rl = strlen(reply);
    const char *p = full + hl;
    while (rl > 0 && strncmp(p, reply, rl) != 0 && (*p == ' ' || *p == '\n'))
        p++;
    if (rl == 0 || strncmp(p, reply, rl) != 0)
        return NULL;
    const char *rest = p + rl, *in_g = strstr(g, reply);
    if (in_g && strncmp(rest, in_g + rl, strlen(in_g + rl)) == 0)
        rest += strlen(in_g + rl);
    return strdup(rest);
}

/* After gpt-oss's reply, whose G does not continue the rendering (it holds the reply's
 * reasoning, which the template drops from earlier replies): the context keeps what the
 * model wrote, so the reply's last message is closed ("<|end|>", unless G ended one) and
 * what follows the reply's final message in the rendering (tail, from the reply on)
 * comes after it. NULL when the rendering does not hold the reply's answer there. */
static char *after_harmony_reply(const char *tail, const char *answer, const char *g)
{
    static const char final[] = "<|channel|>final<|message|>", end[] = "<|end|>";
    static const char *const enders[] = {"<|end|>", "<|return|>", "<|call|>"};
    size_t fl = strlen(final), al = strlen(answer), el = strlen(end), gl = strlen(g);
    if (strncmp(tail, final, fl) != 0 || strncmp(tail + fl, answer, al) != 0 ||
        strncmp(tail + fl + al, end, el) != 0)
        return NULL;
    bool closed = false;
    for (size_t k = 0; k < sizeof enders / sizeof enders[0]; k++) {
        size_t kl = strlen(enders[k]);
        closed |= gl >= kl && strcmp(g + gl - kl, enders[k]) == 0;
    }
    const char *rest = tail + fl + al + (closed ? el : 0);
    return strdup(rest);
}

/* The history's messages as the template takes them (msgs[0..c->n_msgs), each pointing
 * into c or *owned): gpt-oss's replies, which the context holds as the model wrote them,
 * by their answer alone (chat_harmony_answer). -1 out of memory. */
static int history_messages(enum chat_family family, const ctx_entry *c,
                            struct chat_message *msgs, char ***owned)
{
    *owned = NULL;
    if (family == CHAT_GPT_OSS && !(*owned = calloc((size_t)c->n_msgs + 1, sizeof **owned)))
        return -1;
    for (int i = 0; i < c->n_msgs; i++) {
        msgs[i] = (struct chat_message){c->msgs[i].role, c->msgs[i].text};
        if (family != CHAT_GPT_OSS || strcmp(c->msgs[i].role, "assistant") != 0)
            continue;
        const char *answer;
        size_t n;
        chat_harmony_answer(c->msgs[i].text, &answer, &n);
        if (!((*owned)[i] = strndup(answer, n)))
            return -1;
        msgs[i].content = (*owned)[i];
    }
    return 0;
}

static void free_owned(char **owned, int n)
{
    for (int i = 0; owned && i < n; i++)
        free(owned[i]);
    free(owned);
}

char *prompt_turn_text(enum chat_family family, const ctx_entry *c, const char *generated,
                       const char *prompt, char err[ERR_MAX])
{
    int n_max = c->n_msgs + 2, n = 0;
    struct chat_message *msgs = malloc(sizeof *msgs * (size_t)n_max);
    char **owned = NULL;
    if (!msgs) {
        err_set(err, "out of memory");
        return NULL;
    }
    bool has_raw = false;
    if (c->system_prompt)
        msgs[n++] = (struct chat_message){"system", c->system_prompt};
    int n_fixed = n;
    if (history_messages(family, c, msgs + n, &owned) < 0) {
        free_owned(owned, c->n_msgs);
        free(msgs);
        err_set(err, "out of memory");
        return NULL;
    }
    for (int i = 0; i < c->n_msgs; i++)
        has_raw |= strcmp(c->msgs[i].role, "raw") == 0;
    n += c->n_msgs;
    char *out = NULL;
    if (c->n_tokens == 0 && c->n_msgs == 0) {
        msgs[n++] = (struct chat_message){"user", prompt};
        out = render(family, msgs, n, true, err);
    } else if (!has_raw && c->n_msgs >= 2 && strcmp(c->msgs[c->n_msgs - 1].role, "assistant") == 0) {
        char *held = render(family, msgs, n - 1, true, err);
        msgs[n++] = (struct chat_message){"user", prompt};
        char *full = held ? render(family, msgs, n, true, err) : NULL;
        const char *g = generated ? generated : "";
        size_t hl = held ? strlen(held) : 0, gl = strlen(g);
        const char *reply = msgs[n - 2].content;
        if (full && strncmp(full, held, hl) == 0)
            out = strncmp(full + hl, g, gl) == 0 ? strdup(full + hl + gl)
                  : family == CHAT_GPT_OSS       ? after_harmony_reply(full + hl, reply, g)
                                                 : after_reply(full, hl, reply, g);
        free(held);
        free(full);
    }
    if (!out) {
        msgs[n_fixed] = (struct chat_message){"user", prompt};
        out = render(family, msgs + n_fixed, 1, true, err);
    }
    free_owned(owned, c->n_msgs);
    free(msgs);
    return out;
}

/* G: the text of the tokens of the last reply (NULL when there is none or memory runs
 * out, which only costs the fallback rendering). */
static char *last_reply_text(const tokenizer *tok, const ctx_entry *c)
{
    if (c->n_msgs == 0 || strcmp(c->msgs[c->n_msgs - 1].role, "assistant") != 0)
        return NULL;
    int n = c->msgs[c->n_msgs - 1].n_tokens;
    /* A reply that the window cut is no longer whole in the tokens: its text as the
     * client saw it stands in (it lacks only what a stop string held back). */
    int whole = c->window_dropped ? c->n_tokens - c->window_sink : c->n_tokens;
    if (n > whole)
        return strdup(c->msgs[c->n_msgs - 1].text);
    if (n <= 0)
        return NULL;
    const int32_t *ids = c->tokens + c->n_tokens - n;
    size_t len = 0, cap = 64;
    char *s = malloc(cap);
    for (int i = 0; s && i < n; i++) {
        int pl = tok_piece(tok, ids[i], NULL, 0);
        if (pl < 0)
            continue;
        if (len + (size_t)pl + 1 > cap) {
            cap = 2 * (len + (size_t)pl + 1);
            char *p = realloc(s, cap);
            if (!p) {
                free(s);
                return NULL;
            }
            s = p;
        }
        tok_piece(tok, ids[i], s + len, (size_t)pl + 1);
        len += (size_t)pl;
    }
    if (s)
        s[len] = '\0';
    return s;
}

int prompt_turn(const tokenizer *tok, enum chat_family family, const ctx_entry *c,
                const char *prompt, bool raw, int32_t **out, int *n, char err[ERR_MAX])
{
    bool first = c->n_tokens == 0;
    if (raw)
        return prompt_tokenize(tok, prompt, strlen(prompt), first, true, out, n, err);
    char *generated = last_reply_text(tok, c);
    char *text = prompt_turn_text(family, c, generated, prompt, err);
    free(generated);
    if (!text)
        return -1;
    int rc = prompt_tokenize(tok, text, strlen(text), first, true, out, n, err);
    free(text);
    return rc;
}

int prompt_sink_tokens(const tokenizer *tok, enum chat_family family, const char *system_prompt,
                       int at_least)
{
    char err[ERR_MAX];
    if (!system_prompt)
        return at_least;
    struct chat_message sys = {"system", system_prompt};
    char *text = render(family, &sys, 1, false, err);
    int32_t *ids = NULL;
    int n = 0;
    if (!text || prompt_tokenize(tok, text, strlen(text), true, true, &ids, &n, err))
        n = 0;
    free(text);
    free(ids);
    return n > at_least ? n : at_least;
}

char *prompt_complete_text(enum chat_family family, const char *prompt, bool chat,
                           const char *system_prompt, bool enable_thinking, char err[ERR_MAX])
{
    if (!chat) {
        char *s = strdup(prompt);
        if (!s)
            err_set(err, "out of memory");
        return s;
    }
    struct chat_message msgs[2];
    int n = 0;
    if (system_prompt)
        msgs[n++] = (struct chat_message){"system", system_prompt};
    msgs[n++] = (struct chat_message){"user", prompt};
    return render_think(family, msgs, n, true, enable_thinking, err);
}

int prompt_parts_tokens(const tokenizer *tok, Llms__PromptPart *const *parts, size_t n,
                        int32_t **out, int *n_out, char err[ERR_MAX])
{
    int32_t *all = NULL;
    int used = 0;
    for (size_t i = 0; i < n; i++) {
        const Llms__PromptPart *p = parts[i];
        int32_t *ids = p->tokens;
        int k = (int)p->n_tokens;
        if (p->text &&
            prompt_tokenize(tok, p->text, strlen(p->text), i == 0, true, &ids, &k, err)) {
            free(all);
            return -1;
        }
        int32_t *grown = realloc(all, sizeof *all * (size_t)(used + k > 0 ? used + k : 1));
        if (!grown) {
            if (p->text)
                free(ids);
            free(all);
            return err_set(err, "out of memory");
        }
        all = grown;
        memcpy(all + used, ids, sizeof *ids * (size_t)k);
        used += k;
        if (p->text)
            free(ids);
    }
    *out = all;
    *n_out = used;
    return 0;
}

size_t prompt_parts_weight(Llms__PromptPart *const *parts, size_t n)
{
    size_t w = 0;
    for (size_t i = 0; i < n; i++)
        w += (parts[i]->text ? strlen(parts[i]->text) : 0) + parts[i]->n_tokens;
    return w;
}
