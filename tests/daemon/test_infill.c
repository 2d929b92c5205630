/*
 * Tests of the fill-in-the-middle prompt (daemon/infill.h) laid out as llama.cpp's server
 * lays it out for /infill: the repo-level context (FIM_REP, FIM_SEP and file names, or
 * llama.cpp's snippet separator without them) before BOS, FIM_PRE prefix prompt FIM_SUF
 * suffix FIM_MID, and the budget that keeps the prefix's end, the suffix's start and the
 * extra context's end. The vocabulary is written here: one token per printable character
 * (no merges, no space prefix), so that each expected sequence is spelled out by hand.
 */
#include "daemon/infill.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf/gguf.h"
#include "tests/support/test.h"

enum { UNK, BOS, EOS, PRE, SUF, MID, PAD, REP, SEP, NL, FIRST_CHAR, N_VOCAB = FIRST_CHAR + 95 };

/* The vocabulary: FIM tokens as Qwen spells them (with repo: FIM_REP and FIM_SEP too;
 * without fim: none at all, "tokN" in their places), then '\n' as a byte and ' '..'~'.
 * NULL when it does not load. */
static tokenizer *vocab(const char *name, bool fim, bool repo, bool add_bos)
{
    static const char *const fim_texts[] = {"<|fim_prefix|>", "<|fim_suffix|>",
                                            "<|fim_middle|>", "<|fim_pad|>",
                                            "<|repo_name|>",  "<|file_sep|>"};
    static const char *const first[] = {"<unk>", "<s>", "</s>"};
    static char names[N_VOCAB][16];
    const char *texts[N_VOCAB];
    float scores[N_VOCAB] = {0};
    int32_t types[N_VOCAB];
    for (int i = 0; i < N_VOCAB; i++) {
        bool has = i >= PRE && i < NL && fim && (repo || i < REP);
        types[i] = i == UNK ? 2 : i < PRE || has ? 3 : i == NL ? 6 : 1;
        if (i < PRE)
            texts[i] = first[i];
        else if (has)
            texts[i] = fim_texts[i - PRE];
        else if (i == NL)
            texts[i] = "<0x0A>";
        else if (i == FIRST_CHAR)
            texts[i] = "\xe2\x96\x81"; /* SentencePiece writes a space as U+2581 */
        else if (i > FIRST_CHAR)
            snprintf(names[i], sizeof names[i], "%c", ' ' + i - FIRST_CHAR);
        else
            snprintf(names[i], sizeof names[i], "tok%d", i);
        if (i > FIRST_CHAR || (i >= PRE && i < NL && !has))
            texts[i] = names[i];
    }
    char path[512], err[ERR_MAX];
    snprintf(path, sizeof path, "%s/%s.gguf", test_tmpdir(), name);
    gguf_writer *w = gguf_writer_new();
    bool written =
        w && gguf_writer_set_str(w, "tokenizer.ggml.model", "llama") == 0 &&
        gguf_writer_set_str_arr(w, "tokenizer.ggml.tokens", texts, N_VOCAB) == 0 &&
        gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_FLOAT32, scores, N_VOCAB) == 0 &&
        gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_INT32, types, N_VOCAB) == 0 &&
        gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", false) == 0 &&
        gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", add_bos) == 0 &&
        gguf_writer_write(w, path, err) == 0;
    gguf_writer_free(w);
    gguf_file *g = written ? gguf_open(path, err) : NULL;
    tokenizer *t = NULL;
    if (!g || tok_load(g, &t, err))
        fprintf(stderr, "%s: %s\n", name, err);
    gguf_close(g);
    return t;
}

/* The ids of the first n characters of s, one each, put at ids[*at] on. */
static void spell_n(int32_t *ids, int *at, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        ids[(*at)++] = s[i] == '\n' ? NL : FIRST_CHAR + (s[i] - ' ');
}

static void spell(int32_t *ids, int *at, const char *s)
{
    spell_n(ids, at, s, strlen(s));
}

static void put(int32_t *ids, int *at, int32_t id)
{
    ids[(*at)++] = id;
}

/* Whether the layout of p for the window and reply is want (n of them); the two are
 * printed when not. */
static bool lays_out(const tokenizer *t, const infill_parts *p, int n_ctx, int64_t n_predict,
                     const int32_t *want, int n)
{
    int32_t *got = NULL;
    int n_got = -1;
    char err[ERR_MAX];
    if (infill_tokens(t, p, n_ctx, n_predict, &got, &n_got, err)) {
        fprintf(stderr, "infill_tokens: %s\n", err);
        return false;
    }
    bool same = n_got == n && memcmp(got, want, sizeof *want * (size_t)n) == 0;
    if (!same) {
        fprintf(stderr, "got ");
        for (int i = 0; i < n_got; i++)
            fprintf(stderr, " %d", got[i]);
        fprintf(stderr, "\nwant");
        for (int i = 0; i < n; i++)
            fprintf(stderr, " %d", want[i]);
        fprintf(stderr, "\n");
    }
    free(got);
    return same;
}

/* With FIM_REP and FIM_SEP: the project's line, each file's name line and text, the
 * current file's line, then BOS and the FIM sequence, the prompt after the prefix. */
static void repo_level_layout(void)
{
    tokenizer *t = vocab("repo", true, true, true);
    CHECK(t);
    int32_t want[128];
    int n = 0;
    infill_parts p = {.prefix = "ab", .suffix = "cd", .prompt = "x"};
    put(want, &n, REP), spell(want, &n, "myproject\n");
    put(want, &n, SEP), spell(want, &n, "filename\n");
    put(want, &n, BOS), put(want, &n, PRE), spell(want, &n, "abx");
    put(want, &n, SUF), spell(want, &n, "cd"), put(want, &n, MID);
    CHECK(lays_out(t, &p, 4096, 100, want, n));

    /* input_extra: a chunk without a filename is llama.cpp's "tmp" */
    infill_chunk extra[] = {{"a.c", "int x;\n"}, {NULL, "y"}};
    p.extra = extra;
    p.n_extra = 2;
    n = 0;
    put(want, &n, REP), spell(want, &n, "myproject\n");
    put(want, &n, SEP), spell(want, &n, "a.c\nint x;\n");
    put(want, &n, SEP), spell(want, &n, "tmp\ny");
    put(want, &n, SEP), spell(want, &n, "filename\n");
    put(want, &n, BOS), put(want, &n, PRE), spell(want, &n, "abx");
    put(want, &n, SUF), spell(want, &n, "cd"), put(want, &n, MID);
    CHECK(lays_out(t, &p, 4096, 100, want, n));

    /* the prompt's special tokens are read (parse_special, as llama.cpp tokenizes a
     * prompt), the prefix's and suffix's are text */
    infill_parts q = {.prefix = "<|fim_pad|>", .suffix = "", .prompt = "<|fim_pad|>"};
    n = 0;
    put(want, &n, REP), spell(want, &n, "myproject\n");
    put(want, &n, SEP), spell(want, &n, "filename\n");
    put(want, &n, BOS), put(want, &n, PRE), spell(want, &n, "<|fim_pad|>");
    put(want, &n, PAD), put(want, &n, SUF), put(want, &n, MID);
    CHECK(lays_out(t, &q, 4096, 100, want, n));
    tok_free(t);
}

/* Without FIM_REP and FIM_SEP each chunk follows llama.cpp's snippet separator, and
 * nothing names the project or the files; a vocabulary that adds no BOS gets none. */
static void snippet_layout(void)
{
    tokenizer *t = vocab("snippets", true, false, false);
    CHECK(t);
    int32_t want[128];
    int n = 0;
    infill_chunk extra[] = {{"a.c", "int x;"}, {"b.c", "y"}};
    infill_parts p = {.prefix = "ab", .suffix = "cd", .prompt = "", .extra = extra,
                      .n_extra = 2};
    spell(want, &n, "\n\n--- snippet ---\n\nint x;\n\n--- snippet ---\n\ny");
    put(want, &n, PRE), spell(want, &n, "ab");
    put(want, &n, SUF), spell(want, &n, "cd"), put(want, &n, MID);
    CHECK(lays_out(t, &p, 4096, 100, want, n));
    p.n_extra = 0;
    n = 0;
    put(want, &n, PRE), spell(want, &n, "ab");
    put(want, &n, SUF), spell(want, &n, "cd"), put(want, &n, MID);
    CHECK(lays_out(t, &p, 4096, 100, want, n));
    tok_free(t);
}

/* The budget of a window of 64 (a batch of half of it, 32): the prefix's last 24 tokens
 * (3/4 of the batch), the suffix's first 8 - 2 - the prompt's tokens, and of the extra
 * context the last 64 - 32 - 2 * n_predict tokens (llama.cpp's -1 counting as -1). */
static void budget_keeps_the_ends_near_the_hole(void)
{
    tokenizer *t = vocab("budget", true, true, true);
    CHECK(t);
    static const char prefix[] = "0123456789abcdefghijklmnopqrstuvwxyzABCD"; /* 40 */
    static const char suffix[] = "EFGHIJKLMNOPQRSTUVWX";                     /* 20 */
    infill_chunk extra[] = {{"f", "0123456789012345678901234567890123456789"}};
    infill_parts p = {.prefix = prefix, .suffix = suffix, .prompt = "p", .extra = extra,
                      .n_extra = 1};
    /* the extra context: REP myproject\n SEP f\n <40 digits> SEP filename\n, 64 tokens */
    int32_t ex[128];
    int n_ex = 0;
    put(ex, &n_ex, REP), spell(ex, &n_ex, "myproject\n");
    put(ex, &n_ex, SEP), spell(ex, &n_ex, "f\n"), spell(ex, &n_ex, extra[0].text);
    put(ex, &n_ex, SEP), spell(ex, &n_ex, "filename\n");
    CHECK_EQ(n_ex, 64);
    static const struct {
        int64_t n_predict;
        int extra;
    } cases[] = {{4, 24}, {0, 32}, {-1, 34}, {16, 0}, {100, 0}, {INT64_MAX, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int32_t want[160];
        int n = 0;
        for (int k = n_ex - cases[i].extra; k < n_ex; k++)
            put(want, &n, ex[k]);
        put(want, &n, BOS), put(want, &n, PRE), spell(want, &n, prefix + 40 - 24);
        spell(want, &n, "p"), put(want, &n, SUF);
        spell_n(want, &n, suffix, 8 - 2 - 1);
        put(want, &n, MID);
        CHECK_MSG(lays_out(t, &p, 64, cases[i].n_predict, want, n), "n_predict %lld",
                  (long long)cases[i].n_predict);
    }
    /* a prompt of the batch's quarter leaves no room for the suffix */
    p.prompt = "pppppp";
    int32_t want[160];
    int n = 0;
    put(want, &n, BOS), put(want, &n, PRE), spell(want, &n, prefix + 40 - 24);
    spell(want, &n, "pppppp"), put(want, &n, SUF), put(want, &n, MID);
    CHECK(lays_out(t, &p, 64, 16, want, n));
    tok_free(t);
}

/* A vocabulary without FIM_PRE, FIM_SUF or FIM_MID cannot infill: the message names
 * what it lacks, as llama.cpp's server does. */
static void missing_tokens_are_named(void)
{
    tokenizer *t = vocab("nofim", false, false, true);
    CHECK(t);
    char msg[256];
    CHECK(!infill_supported(t, msg, sizeof msg));
    CHECK_MSG(strcmp(msg, "Infill is not supported by this model: prefix token is missing. "
                          "suffix token is missing. middle token is missing.") == 0,
              "%s", msg);
    tok_free(t);
    t = vocab("fim", true, false, true);
    CHECK(t);
    CHECK(infill_supported(t, msg, sizeof msg));
    tok_free(t);
}

int main(void)
{
    RUN(repo_level_layout);
    RUN(snippet_layout);
    RUN(budget_keeps_the_ends_near_the_hole);
    RUN(missing_tokens_are_named);
    return test_finish();
}
