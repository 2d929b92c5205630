/* drybreak.c — DRY's sequence breakers as tokens (see drybreak.h). */
#include "engine/model/drybreak.h"

#include <stdbool.h>
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

/* One breaker: its text (cut), and the tokens of its rest after its first r bytes, made
 * when a token ends with those. */
typedef struct breaker {
    const char *text;
    size_t len;
    bool made[DRYBREAK_TEXT_MAX];
    sampler_breaker rest[DRYBREAK_TEXT_MAX];
} breaker;

/* Breaker b's sequences headed by token id, whose text is text[0..n), into s. */
static int token_seqs(const tokenizer *tok, int32_t id, const char *text, size_t n, breaker *b,
                      seqs *s, char *err)
{
    if (memmem(text, n, b->text, b->len))
        return push(s, id, NULL) ? err_set(err, "DRY sequence breakers: out of memory") : 0;
    /* each end of the text shorter than the breaker that the breaker starts with */
    for (size_t r = 1; r < b->len && r <= n; r++) {
        if (memcmp(text + n - r, b->text, r) != 0)
            continue;
        if (!b->made[r]) {
            int32_t ids[SAMPLER_BREAKER_TAIL_MAX];
            int k = tok_encode(tok, b->text + r, b->len - r, false, false, ids,
                               SAMPLER_BREAKER_TAIL_MAX);
            if (k < 0)
                return err_set(err, "DRY sequence breakers: the tokenizer failed on '%.*s'",
                               (int)(b->len - r), b->text + r);
            b->rest[r] = (sampler_breaker){.n_tail = k < SAMPLER_BREAKER_TAIL_MAX
                                                         ? k : SAMPLER_BREAKER_TAIL_MAX};
            memcpy(b->rest[r].tail, ids, sizeof *ids * (size_t)b->rest[r].n_tail);
            b->made[r] = true;
        }
        if (push(s, id, &b->rest[r]))
            return err_set(err, "DRY sequence breakers: out of memory");
    }
    return 0;
}

int drybreak_tokens(const tokenizer *tok, const char *const *texts, int n,
                    sampler_breaker **out, int *n_out, char err[ERR_MAX])
{
    seqs s = {0};
    size_t text_cap = 256;
    int n_brk = 0, rc = 0;
    *out = NULL;
    *n_out = 0;
    char *text = malloc(text_cap);
    breaker *brk = calloc(n > 0 ? (size_t)n : 1, sizeof *brk);
    if (!text || !brk) {
        free(text);
        free(brk);
        return err_set(err, "DRY sequence breakers: out of memory");
    }
    for (int i = 0; i < n; i++) {
        size_t len = strlen(texts[i]);
        if (len > 0)
            brk[n_brk++] = (breaker){.text = texts[i],
                                     .len = len < DRYBREAK_TEXT_MAX ? len : DRYBREAK_TEXT_MAX};
    }
    /* each token's text once, for every breaker */
    for (int32_t id = 0; n_brk > 0 && id < tok_n_vocab(tok) && rc == 0; id++) {
        int k = token_text(tok, id, &text, &text_cap);
        if (k < 0)
            rc = err_set(err, "DRY sequence breakers: out of memory");
        for (int b = 0; b < n_brk && rc == 0; b++)
            rc = token_seqs(tok, id, text, (size_t)k, &brk[b], &s, err);
    }
    free(text);
    free(brk);
    if (rc) {
        free(s.b);
        return -1;
    }
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
