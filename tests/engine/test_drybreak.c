/*
 * Tests of DRY's sequence breakers from text to tokens (engine/model/drybreak.h) on the
 * test data's vocabularies (skipped without them): every sequence against a reference
 * written here, llama.cpp's default breakers, and the cut and empty breakers.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf/gguf.h"
#include "engine/model/drybreak.h"
#include "tests/support/test.h"

typedef struct vocab {
    gguf_file *g;
    tokenizer *tok;
} vocab;

static bool vocab_open(const char *rel, vocab *v)
{
    char err[ERR_MAX];
    const char *path = test_data_path(rel);
    memset(v, 0, sizeof *v);
    if (!path) {
        test_skip("%s is not in the test data", rel);
        return false;
    }
    if (!(v->g = gguf_open(path, err)) || tok_load(v->g, &v->tok, err)) {
        test_fail(__FILE__, __LINE__, "%s: %s", rel, err);
        gguf_close(v->g);
        return false;
    }
    return true;
}

static void vocab_close(vocab *v)
{
    tok_free(v->tok);
    gguf_close(v->g);
}

/* Whether seqs (n) hold head followed by tail (n_tail tokens). */
static bool holds(const sampler_breaker *seqs, int n, int32_t head, const int32_t *tail,
                  int n_tail)
{
    for (int i = 0; i < n; i++)
        if (seqs[i].head == head && seqs[i].n_tail == n_tail &&
            (n_tail == 0 || memcmp(seqs[i].tail, tail, sizeof *tail * (size_t)n_tail) == 0))
            return true;
    return false;
}

/* The reference, token by token: a token's text (alone, as llama.cpp's detokenizer
 * gives it) holding breaker t is that token alone; one whose last r bytes (r shorter
 * than t) are t's first r is that token then t's rest as tokens. Counts them into
 * *n_want and checks each is among seqs. */
static void expect_reference(const tokenizer *tok, const char *t, const sampler_breaker *seqs,
                             int n, int *n_want)
{
    size_t len = strlen(t) > DRYBREAK_TEXT_MAX ? DRYBREAK_TEXT_MAX : strlen(t);
    char text[4096];
    for (int32_t id = 0; id < tok_n_vocab(tok); id++) {
        int k = tok_decode(tok, &id, 1, false, true, text, sizeof text);
        CHECK(k >= 0 && k < (int)sizeof text);
        bool inside = false;
        for (int at = 0; at + (int)len <= k && !inside; at++)
            inside = memcmp(text + at, t, len) == 0;
        if (inside) {
            CHECK_MSG(holds(seqs, n, id, NULL, 0), "'%s': token %d ('%s') alone is missing",
                      t, id, text);
            (*n_want)++;
            continue;
        }
        for (size_t r = 1; r < len && r <= (size_t)k; r++) {
            if (memcmp(text + k - r, t, r) != 0)
                continue;
            int32_t rest[64];
            int m = tok_encode(tok, t + r, len - r, false, false, rest, 64);
            CHECK(m >= 0 && m <= 64);
            if (m > SAMPLER_BREAKER_TAIL_MAX)
                m = SAMPLER_BREAKER_TAIL_MAX;
            CHECK_MSG(holds(seqs, n, id, rest, m), "'%s': token %d ('%s') + %d tokens is "
                      "missing", t, id, text, m);
            (*n_want)++;
        }
    }
}

/* Each breaker's sequences are the reference's, and nothing else (counted; no breaker
 * here gives a token the same sequence twice). */
static void check_vocab(const char *rel)
{
    vocab v;
    if (!vocab_open(rel, &v))
        return;
    static const char *const cases[][3] = {
        {"\n", NULL}, {":", NULL}, {"User:", NULL}, {"\n\n", NULL}, {"ing the", NULL},
        {"### Instruction", NULL},
    };
    char err[ERR_MAX];
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        sampler_breaker *seqs;
        int n, n_want = 0;
        CHECK_MSG(drybreak_tokens(v.tok, cases[c], 1, &seqs, &n, err) == 0, "%s", err);
        CHECK_MSG(n > 0, "%s: '%s' gives none", rel, cases[c][0]);
        expect_reference(v.tok, cases[c][0], seqs, n, &n_want);
        CHECK_MSG(n == n_want, "%s: '%s': %d sequences, the reference %d", rel, cases[c][0], n,
                  n_want);
        for (int i = 1; i < n; i++)
            CHECK(seqs[i - 1].head <= seqs[i].head);
        free(seqs);
    }
    vocab_close(&v);
}

static void spm_vocabulary(void)
{
    check_vocab("vocab/ggml-vocab-llama-spm.gguf");
}

static void bpe_vocabulary(void)
{
    check_vocab("vocab/ggml-vocab-gpt-2.gguf");
}

/* llama.cpp's defaults together: each sequence once (a token holding "\n" and ":" is
 * there once), every default's own token alone; empty breakers are left out and long
 * ones cut to their first 40 bytes. */
static void defaults_empty_and_long(void)
{
    vocab v;
    if (!vocab_open("vocab/ggml-vocab-gpt-2.gguf", &v))
        return;
    char err[ERR_MAX];
    sampler_breaker *all, *one;
    int n_all, n_one;
    CHECK(drybreak_tokens(v.tok, drybreak_default, DRYBREAK_N_DEFAULT, &all, &n_all, err) == 0);
    for (int i = 1; i < n_all; i++)
        CHECK(all[i - 1].head != all[i].head || all[i - 1].n_tail != all[i].n_tail);
    int sum = 0;
    for (int d = 0; d < DRYBREAK_N_DEFAULT; d++) {
        CHECK(drybreak_tokens(v.tok, &drybreak_default[d], 1, &one, &n_one, err) == 0);
        int32_t id;
        CHECK_EQ(tok_encode(v.tok, drybreak_default[d], 1, false, false, &id, 1), 1);
        CHECK_MSG(holds(all, n_all, id, NULL, 0), "'%s'", drybreak_default[d]);
        sum += n_one;
        free(one);
    }
    CHECK_MSG(n_all < sum, "%d sequences of the four, %d of each alone", n_all, sum);
    free(all);
    const char *empty[] = {"", ""};
    CHECK(drybreak_tokens(v.tok, empty, 2, &one, &n_one, err) == 0);
    CHECK_EQ(n_one, 0);
    free(one);
    char long_text[64], cut[DRYBREAK_TEXT_MAX + 1];
    memset(long_text, 'q', sizeof long_text - 1);
    long_text[sizeof long_text - 1] = '\0';
    memcpy(cut, long_text, DRYBREAK_TEXT_MAX);
    cut[DRYBREAK_TEXT_MAX] = '\0';
    const char *lt[] = {long_text}, *ct[] = {cut};
    CHECK(drybreak_tokens(v.tok, lt, 1, &all, &n_all, err) == 0);
    CHECK(drybreak_tokens(v.tok, ct, 1, &one, &n_one, err) == 0);
    CHECK(n_all > 0 && n_all == n_one &&
          memcmp(all, one, sizeof *all * (size_t)n_all) == 0);
    free(all);
    free(one);
    vocab_close(&v);
}

int main(void)
{
    RUN(spm_vocabulary);
    RUN(bpe_vocabulary);
    RUN(defaults_empty_and_long);
    return test_finish();
}
