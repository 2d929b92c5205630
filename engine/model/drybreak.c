/* drybreak.c — DRY's sequence breakers as tokens (see drybreak.h). */
#include "engine/model/drybreak.h"

#include <stdlib.h>
#include <string.h>

const char *const drybreak_default[DRYBREAK_N_DEFAULT] = {"\n", ":", "\"", "*"};

/* The sequences made so far. */
typedef struct seqs {
    sampler_breaker *b;
    size_t n, cap;
} seqs;

static int push(seqs *s, int32_t head, const sampler_breaker *tail)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        sampler_breaker *b = realloc(s->b, sizeof *b * cap);
        if (!b)
            return -1;
        s->b = b;
        s->cap = cap;
    }
    s->b[s->n] = tail ? *tail : (sampler_breaker){0};
    s->b[s->n++].head = head;
    return 0;
}

static int seq_cmp(const void *a, const void *b)
{
    const sampler_breaker *x = a, *y = b;
    if (x->head != y->head)
        return x->head < y->head ? -1 : 1;
    if (x->n_tail != y->n_tail)
        return x->n_tail < y->n_tail ? -1 : 1;
    return memcmp(x->tail, y->tail, sizeof *x->tail * (size_t)x->n_tail);
}

/* Token id's text alone into *buf (grown as needed; NUL-terminated): its length, or -1
 * out of memory. */
static int token_text(const tokenizer *tok, int32_t id, char **buf, size_t *cap)
{
    int n = tok_decode(tok, &id, 1, false, true, *buf, *cap);
    if (n >= 0 && (size_t)n >= *cap) {
        char *b = realloc(*buf, (size_t)n + 1);
        if (!b)
            return -1;
        *buf = b;
        *cap = (size_t)n + 1;
        n = tok_decode(tok, &id, 1, false, true, *buf, *cap);
    }
    return n < 0 ? 0 : n; /* an id of the vocabulary always decodes */
}

/* Breaker t (len bytes)'s sequences over the vocabulary into s; text a buffer for the
 * tokens' texts. */
static int breaker_seqs(const tokenizer *tok, const char *t, size_t len, seqs *s, char **text,
                        size_t *text_cap, char *err)
{
    /* the tokens of t's rest after its first r bytes, made when a token ends with those */
    sampler_breaker rest[DRYBREAK_TEXT_MAX];
    bool made[DRYBREAK_TEXT_MAX] = {false};
    int32_t n_vocab = tok_n_vocab(tok);
    for (int32_t id = 0; id < n_vocab; id++) {
        int n = token_text(tok, id, text, text_cap);
        if (n < 0)
            return err_set(err, "DRY sequence breakers: out of memory");
        if (memmem(*text, (size_t)n, t, len)) {
            if (push(s, id, NULL))
                return err_set(err, "DRY sequence breakers: out of memory");
            continue;
        }
        /* each end of the text shorter than t that t starts with */
        for (size_t r = 1; r < len && r <= (size_t)n; r++) {
            if (memcmp(*text + n - r, t, r) != 0)
                continue;
            if (!made[r]) {
                int32_t ids[SAMPLER_BREAKER_TAIL_MAX];
                int k = tok_encode(tok, t + r, len - r, false, false, ids,
                                   SAMPLER_BREAKER_TAIL_MAX);
                if (k < 0)
                    return err_set(err, "DRY sequence breakers: the tokenizer failed on "
                                        "'%.*s'", (int)(len - r), t + r);
                rest[r] = (sampler_breaker){.n_tail = k < SAMPLER_BREAKER_TAIL_MAX
                                                          ? k : SAMPLER_BREAKER_TAIL_MAX};
                memcpy(rest[r].tail, ids, sizeof *ids * (size_t)rest[r].n_tail);
                made[r] = true;
            }
            if (push(s, id, &rest[r]))
                return err_set(err, "DRY sequence breakers: out of memory");
        }
    }
    return 0;
}

int drybreak_tokens(const tokenizer *tok, const char *const *texts, int n,
                    sampler_breaker **out, int *n_out, char err[ERR_MAX])
{
    seqs s = {0};
    char *text = NULL;
    size_t text_cap = 0;
    *out = NULL;
    *n_out = 0;
    for (int i = 0; i < n; i++) {
        size_t len = strlen(texts[i]);
        if (len > DRYBREAK_TEXT_MAX)
            len = DRYBREAK_TEXT_MAX;
        if (len > 0 && breaker_seqs(tok, texts[i], len, &s, &text, &text_cap, err)) {
            free(s.b);
            free(text);
            return -1;
        }
    }
    free(text);
    /* each sequence once: several breakers may give a token the same one */
    if (s.n > 0)
        qsort(s.b, s.n, sizeof *s.b, seq_cmp);
    size_t kept = 0;
    for (size_t i = 0; i < s.n; i++)
        if (kept == 0 || seq_cmp(&s.b[kept - 1], &s.b[i]) != 0)
            s.b[kept++] = s.b[i];
    *out = s.b;
    *n_out = (int)kept;
    return 0;
}
