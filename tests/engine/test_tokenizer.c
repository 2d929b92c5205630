/*
 * Tests of the tokenizers: llama.cpp's test vectors for the SPM, BPE and WordPiece
 * vocabularies (exact ids), round trips, special tokens, pre-tokenizer splits, small
 * hand-built vocabularies, and malformed metadata.
 */
#include "engine/tok/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/test.h"

/* ---- helpers ---- */

static char *read_whole(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)n + 1);
    if (p && fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    if (p)
        p[n] = 0;
    *size = (size_t)n;
    return p;
}

/* Printable form of some bytes for failure messages. */
static const char *esc(const char *s, size_t n)
{
    static char buf[4][256];
    static int k;
    char *b = buf[k++ & 3];
    size_t o = 0;
    for (size_t i = 0; i < n && o + 5 < sizeof buf[0]; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f && c != '\\')
            b[o++] = (char)c;
        else
            o += (size_t)snprintf(b + o, 5, "\\x%02x", c);
    }
    b[o] = 0;
    return b;
}

static const char *ids_str(const int32_t *ids, int n)
{
    static char buf[2][512];
    static int k;
    char *b = buf[k++ & 1];
    size_t o = 0;
    b[0] = 0;
    for (int i = 0; i < n && o + 12 < sizeof buf[0]; i++)
        o += (size_t)snprintf(b + o, 12, " %d", ids[i]);
    return b;
}

static tokenizer *load_path(const char *path, char *err)
{
    gguf_file *g = gguf_open(path, err);
    if (!g)
        return NULL;
    tokenizer *t = NULL;
    tok_load(g, &t, err);
    gguf_close(g);
    return t;
}

static const char *vocab_path(const char *name)
{
    char rel[128];
    snprintf(rel, sizeof rel, "vocab/ggml-vocab-%s.gguf", name);
    return test_data_path(rel);
}

/* Encodes text (NUL-terminated) into ids; returns the count. */
static int enc(const tokenizer *t, const char *text, bool add_special, bool parse_special,
               int32_t *ids, int cap)
{
    return tok_encode(t, text, strlen(text), add_special, parse_special, ids, cap);
}

static bool ids_eq(const int32_t *a, int na, const int32_t *b, int nb)
{
    return na == nb && memcmp(a, b, (size_t)na * sizeof *a) == 0;
}

/* Checks every case of PATH.inp against PATH.out (name for messages). */
static void check_vectors_at(const char *gguf_path, const char *name)
{
    char err[ERR_MAX] = "", path[1024];
    tokenizer *t = load_path(gguf_path, err);
    CHECK_MSG(t, "load %s: %s", name, err);

    size_t ni, no;
    snprintf(path, sizeof path, "%s.inp", gguf_path);
    char *inp = read_whole(path, &ni);
    snprintf(path, sizeof path, "%s.out", gguf_path);
    char *out = read_whole(path, &no);
    if (!inp || !out) {
        free(inp);
        free(out);
        tok_free(t);
        SKIP("test vectors for %s not found", name);
    }

    /* Cases are separated by "\n__ggml_vocab_test__\n" and the file ends with one;
     * each .out line holds the ids of one case. */
    static const char sep[] = "\n__ggml_vocab_test__\n";
    int32_t *ids = malloc(4096 * sizeof *ids), *want = malloc(4096 * sizeof *want);
    char *case_start = inp, *line = out;
    int n_cases = 0, failed = -1;
    char msg[1024] = "";
    for (;;) {
        char *end = strstr(case_start, sep);
        if (!end)
            break;
        char *eol = strchr(line, '\n');
        if (!eol) {
            snprintf(msg, sizeof msg, "case %d: no line left in .out", n_cases);
            failed = n_cases;
            break;
        }
        int nw = 0;
        for (char *p = line; p < eol;) {
            char *q;
            long v = strtol(p, &q, 10);
            if (q == p)
                break;
            want[nw++] = (int32_t)v;
            p = q;
        }
        size_t len = (size_t)(end - case_start);
        int n = tok_encode(t, case_start, len, false, false, ids, 4096);
        if (!ids_eq(ids, n, want, nw)) {
            snprintf(msg, sizeof msg, "case %d \"%s\":\n   want%s\n   got %s", n_cases,
                     esc(case_start, len), ids_str(want, nw), ids_str(ids, n < 0 ? 0 : n));
            failed = n_cases;
            break;
        }
        n_cases++;
        case_start = end + strlen(sep);
        line = eol + 1;
    }
    free(ids);
    free(want);
    free(inp);
    free(out);
    tok_free(t);
    CHECK_MSG(failed < 0, "%s %s", name, msg);
    CHECK(n_cases >= 40);
}

/* Checks the test vectors of ../shared's vocab/ggml-vocab-NAME.gguf. */
static void check_vectors(const char *name)
{
    const char *path = vocab_path(name);
    if (!path)
        SKIP("vocab/ggml-vocab-%s.gguf not found (set LLMS_TESTDATA)", name);
    char copy[1024];
    snprintf(copy, sizeof copy, "%s", path);
    check_vectors_at(copy, name);
}

/* decode(encode(s)) == s for every test string of a lossless vocabulary. */
static void check_round_trip(const char *name)
{
    const char *path = vocab_path(name);
    if (!path)
        SKIP("vocab/ggml-vocab-%s.gguf not found (set LLMS_TESTDATA)", name);
    char err[ERR_MAX] = "", rel[128];
    tokenizer *t = load_path(path, err);
    CHECK_MSG(t, "load %s: %s", name, err);
    snprintf(rel, sizeof rel, "vocab/ggml-vocab-%s.gguf.inp", name);
    const char *pi = test_data_path(rel);
    size_t ni;
    char *inp = pi ? read_whole(pi, &ni) : NULL;
    if (!inp) {
        tok_free(t);
        SKIP("test vectors for %s not found", name);
    }
    int32_t *ids = malloc(8192 * sizeof *ids);
    char *text = malloc(ni + 16);
    char msg[600] = "";
    static const char sep[] = "\n__ggml_vocab_test__\n";
    for (char *s = inp, *end; !msg[0] && (end = strstr(s, sep)); s = end + strlen(sep)) {
        size_t len = (size_t)(end - s);
        int n = tok_encode(t, s, len, true, false, ids, 8192);
        int m = tok_decode(t, ids, n, true, false, text, ni + 16);
        if (m != (int)len || memcmp(text, s, len) != 0)
            snprintf(msg, sizeof msg, "\"%s\" came back as \"%s\"", esc(s, len),
                     esc(text, m < 0 ? 0 : (size_t)m));
    }
    /* The whole file at once: long input, many fragments. */
    if (!msg[0]) {
        int n = tok_encode(t, inp, ni, false, false, ids, 8192);
        int m = n > 0 && n <= 8192 ? tok_decode(t, ids, n, false, false, text, ni + 16) : -1;
        if (m != (int)ni || memcmp(text, inp, ni) != 0)
            snprintf(msg, sizeof msg, "whole .inp file does not round-trip (%d tokens)", n);
    }
    free(ids);
    free(text);
    free(inp);
    tok_free(t);
    CHECK_MSG(!msg[0], "%s: %s", name, msg);
}

static tokenizer *load_vocab(const char *name, char *err)
{
    const char *path = vocab_path(name);
    return path ? load_path(path, err) : NULL;
}

/* ---- test vectors ---- */

static void test_vectors_spm(void)
{
    check_vectors("llama-spm");
}

static void test_vectors_bpe_gpt2(void)
{
    check_vectors("gpt-2");
}

static void test_vectors_wpm_bert(void)
{
    check_vectors("bert-bge");
}

/* The unigram vocabulary of tests/engine/data (make_ugm_vocab.py): ids from
 * SentencePiece's own encoder, in XLM-RoBERTa's layout. */
#define UGM_VOCAB "tests/engine/data/ugm-docs.gguf"

static void test_vectors_ugm(void)
{
    CHECK_MSG(access(UGM_VOCAB, R_OK) == 0 && access(UGM_VOCAB ".inp", R_OK) == 0 &&
                  access(UGM_VOCAB ".out", R_OK) == 0,
              UGM_VOCAB " and its .inp/.out: run from the repository");
    check_vectors_at(UGM_VOCAB, "ugm-docs");
}

static void test_round_trip_spm(void)
{
    check_round_trip("llama-spm");
}

static void test_round_trip_bpe(void)
{
    check_round_trip("gpt-2");
}

/* ---- behaviour on the real vocabularies ---- */

/* Every token's bytes in the table are its piece, for tokens of text; control, unknown,
 * unused and end-of-generation tokens have none. */
static void check_pieces(const char *name)
{
    const char *path = vocab_path(name);
    if (!path)
        SKIP("vocab/ggml-vocab-%s.gguf not found (set LLMS_TESTDATA)", name);
    char err[ERR_MAX] = "", piece[512];
    tokenizer *t = load_path(path, err);
    CHECK_MSG(t, "load %s: %s", name, err);
    tok_pieces p;
    CHECK_MSG(tok_pieces_new(t, &p, err) == 0, "%s", err);
    CHECK_EQ(p.n_vocab, tok_n_vocab(t));
    int with_text = 0;
    size_t longest = 0;
    for (int32_t id = 0; id < p.n_vocab; id++) {
        enum tok_type ty = tok_type(t, id);
        bool text = (ty == TOK_TYPE_NORMAL || ty == TOK_TYPE_BYTE || ty == TOK_TYPE_USER_DEFINED) &&
                    !tok_is_eog(t, id);
        uint32_t len = p.start[id + 1] - p.start[id];
        int n = tok_piece(t, id, piece, sizeof piece);
        CHECK(n >= 0 && n < (int)sizeof piece);
        CHECK_MSG(len == (text ? (uint32_t)n : 0), "%s: token %d has %u bytes", name, id, len);
        CHECK(memcmp(p.bytes + p.start[id], piece, len) == 0);
        with_text += len > 0;
        longest = (size_t)n > longest ? (size_t)n : longest;
    }
    CHECK(with_text > p.n_vocab / 2);
    CHECK_MSG(tok_max_piece_len(t) == longest, "%s: %zu, the longest piece has %zu bytes", name,
              tok_max_piece_len(t), longest);
    tok_pieces_free(&p);
    tok_free(t);
}

static void test_pieces_table(void)
{
    check_pieces("llama-spm");
    check_pieces("gpt-2");
}

/* tok_eog_tokens lists exactly the tokens tok_is_eog says yes to, in id order. */
static bool eog_list_matches(const tokenizer *t)
{
    const int32_t *ids;
    int n = tok_eog_tokens(t, &ids), k = 0;
    for (int32_t id = 0; id < tok_n_vocab(t); id++)
        if (tok_is_eog(t, id) && (k >= n || ids[k++] != id))
            return false;
    return k == n && n > 0;
}

static void test_spm_specials_and_bos(void)
{
    char err[ERR_MAX] = "";
    tokenizer *t = load_vocab("llama-spm", err);
    if (!t && !err[0])
        SKIP("vocab/ggml-vocab-llama-spm.gguf not found");
    CHECK_MSG(t, "%s", err);
    int32_t ids[64];
    CHECK_EQ(tok_model(t), TOK_MODEL_SPM);
    CHECK_EQ(tok_n_vocab(t), 32000);
    CHECK_EQ(tok_bos(t), 1);
    CHECK_EQ(tok_eos(t), 2);
    CHECK_EQ(tok_special(t, TOK_SPECIAL_UNK), 0);
    CHECK(tok_add_bos(t) && !tok_add_eos(t));

    /* add_special puts BOS first; empty text with add_special is just BOS. */
    int n = enc(t, "Hello world", true, false, ids, 64);
    int32_t w1[] = {1, 15043, 3186};
    CHECK_MSG(ids_eq(ids, n, w1, 3), "got%s", ids_str(ids, n));
    CHECK_EQ(enc(t, "", true, false, ids, 64), 1);
    CHECK_EQ(ids[0], 1);
    CHECK_EQ(enc(t, "", false, false, ids, 64), 0);

    /* parse_special: "<s>" / "</s>" become tokens and text after a special token gets
     * the space prefix again; without it they are plain text. */
    n = enc(t, "<s>Hello</s>world", false, true, ids, 64);
    int32_t w2[] = {1, 15043, 2, 3186};
    CHECK_MSG(ids_eq(ids, n, w2, 4), "got%s", ids_str(ids, n));
    n = enc(t, "<s>Hello</s>world", false, false, ids, 64);
    CHECK(n > 4);
    for (int i = 0; i < n; i++)
        CHECK(ids[i] != 1 && ids[i] != 2);

    /* Decoding: specials vanish unless unparsed, and then the text round-trips. */
    char buf[128];
    n = enc(t, "<s>Hello</s>world", false, true, ids, 64);
    CHECK_EQ(tok_decode(t, ids, n, false, false, buf, sizeof buf), 10);
    CHECK(strcmp(buf, "Helloworld") == 0);
    CHECK_EQ(tok_decode(t, ids, n, false, true, buf, sizeof buf), 17);
    CHECK(strcmp(buf, "<s>Hello</s>world") == 0);

    /* Byte fallback: U+1F680 is not in the vocabulary, its bytes are <0xF0>... (id 3 + byte). */
    n = enc(t, "\xf0\x9f\x9a\x80", false, false, ids, 64);
    int32_t w3[] = {29871, 3 + 0xf0, 3 + 0x9f, 3 + 0x9a, 3 + 0x80};
    CHECK_MSG(ids_eq(ids, n, w3, 5), "got%s", ids_str(ids, n));
    CHECK_EQ(tok_type(t, 3 + 0xf0), TOK_TYPE_BYTE);

    /* Pieces. */
    CHECK_EQ(tok_piece(t, 15043, buf, sizeof buf), 6);
    CHECK(strcmp(buf, " Hello") == 0);
    CHECK_EQ(tok_piece(t, 3 + 'A', buf, sizeof buf), 1);
    CHECK(strcmp(buf, "A") == 0);
    CHECK_EQ(tok_piece(t, 1, buf, sizeof buf), 3);
    CHECK(strcmp(buf, "<s>") == 0);
    CHECK_EQ(tok_piece(t, 15043, buf, 4), 6); /* truncated, still NUL-terminated */
    CHECK(strcmp(buf, " He") == 0);
    CHECK_EQ(tok_piece(t, 32000, buf, sizeof buf), -1);

    /* Lookups. */
    CHECK_EQ(tok_find(t, "\xe2\x96\x81Hello", 8), 15043);
    CHECK_EQ(tok_find(t, "</s>", 4), 2);
    CHECK_EQ(tok_find(t, "no such token", 13), -1);
    size_t len;
    CHECK(strcmp(tok_token_text(t, 2, &len), "</s>") == 0 && len == 4);
    CHECK(tok_token_text(t, -1, NULL) == NULL);
    CHECK(tok_is_eog(t, 2) && !tok_is_eog(t, 1) && !tok_is_eog(t, 15043));
    CHECK(eog_list_matches(t));
    CHECK_EQ(tok_type(t, 0), TOK_TYPE_UNKNOWN);
    CHECK_EQ(tok_type(t, 1), TOK_TYPE_CONTROL);
    CHECK_EQ(tok_type(t, 15043), TOK_TYPE_NORMAL);
    CHECK_EQ(tok_type(t, 99999), TOK_TYPE_INVALID);

    /* The count is returned even when the buffer is too small. */
    CHECK_EQ(enc(t, "Hello world", true, false, ids, 1), 3);
    CHECK_EQ(ids[0], 1);
    CHECK_EQ(enc(t, "Hello world", true, false, NULL, 0), 3);
    tok_free(t);
}

static void test_bpe_specials(void)
{
    char err[ERR_MAX] = "";
    tokenizer *t = load_vocab("gpt-2", err);
    if (!t && !err[0])
        SKIP("vocab/ggml-vocab-gpt-2.gguf not found");
    CHECK_MSG(t, "%s", err);
    int32_t ids[64];
    char buf[128];
    CHECK_EQ(tok_model(t), TOK_MODEL_BPE);
    CHECK_EQ(tok_bos(t), 50256);
    CHECK(!tok_add_bos(t)); /* llama.cpp's default for GPT-2 style vocabularies */
    CHECK(tok_is_eog(t, 50256));
    CHECK(eog_list_matches(t));

    int n = enc(t, "Hello<|endoftext|> world", false, true, ids, 64);
    int32_t w1[] = {15496, 50256, 995};
    CHECK_MSG(ids_eq(ids, n, w1, 3), "got%s", ids_str(ids, n));
    n = enc(t, "Hello<|endoftext|> world", false, false, ids, 64);
    CHECK(n > 3);
    for (int i = 0; i < n; i++)
        CHECK(ids[i] != 50256);
    CHECK_EQ(tok_decode(t, ids, n, false, false, buf, sizeof buf), 24);
    CHECK(strcmp(buf, "Hello<|endoftext|> world") == 0);

    CHECK_EQ(tok_piece(t, 18435, buf, sizeof buf), 6);
    CHECK(strcmp(buf, " Hello") == 0);
    CHECK_EQ(tok_piece(t, 198, buf, sizeof buf), 1);
    CHECK(strcmp(buf, "\n") == 0);
    CHECK_EQ(tok_find(t, "\xc4\xa0Hello", 7), 18435); /* byte-level 'Ġ' is the space */

    /* Bytes that are not valid UTF-8 still encode, and decode back exactly. */
    const char bad[] = "a\xff\xfe b\xc3";
    n = tok_encode(t, bad, sizeof bad - 1, false, false, ids, 64);
    CHECK(n > 0);
    CHECK_EQ(tok_decode(t, ids, n, false, false, buf, sizeof buf), (int)sizeof bad - 1);
    CHECK(memcmp(buf, bad, sizeof bad - 1) == 0);
    tok_free(t);
}

static void test_wpm_specials(void)
{
    char err[ERR_MAX] = "";
    tokenizer *t = load_vocab("bert-bge", err);
    if (!t && !err[0])
        SKIP("vocab/ggml-vocab-bert-bge.gguf not found");
    CHECK_MSG(t, "%s", err);
    int32_t ids[64];
    char buf[128];
    CHECK_EQ(tok_model(t), TOK_MODEL_WPM);
    CHECK_EQ(tok_special(t, TOK_SPECIAL_CLS), 101);
    CHECK_EQ(tok_special(t, TOK_SPECIAL_SEP), 102);
    CHECK_EQ(tok_special(t, TOK_SPECIAL_UNK), 100);

    /* [CLS] text [SEP]; uppercase and accents fold ("Führer" as "fuhrer"). */
    int n = enc(t, "Hello World", true, false, ids, 64);
    int32_t w1[] = {101, 7592, 2088, 102};
    CHECK_MSG(ids_eq(ids, n, w1, 4), "got%s", ids_str(ids, n));
    n = enc(t, "HELLO F\xc3\xbchrer", false, false, ids, 64);
    int32_t w2[] = {7592, 11865, 17875};
    CHECK_MSG(ids_eq(ids, n, w2, 3), "got%s", ids_str(ids, n));
    /* Special text is recognised only with parse_special. */
    n = enc(t, "[CLS] hi [SEP]", false, true, ids, 64);
    CHECK(n == 3 && ids[0] == 101 && ids[2] == 102);

    n = enc(t, "Hello, world!", false, false, ids, 64);
    CHECK_EQ(tok_decode(t, ids, n, false, false, buf, sizeof buf), 15);
    CHECK(strcmp(buf, "hello , world !") == 0);
    tok_free(t);
}

/* ---- pre-tokenizers ---- */

/* The GPT-2 vocabulary re-labelled with another pre-tokenizer name. */
static tokenizer *gpt2_with_pre(const char *pre, char *err)
{
    const char *path = vocab_path("gpt-2");
    if (!path)
        return NULL;
    gguf_file *g = gguf_open(path, err);
    if (!g)
        return NULL;
    gguf_writer *w = gguf_writer_new();
    for (int64_t i = 0; i < gguf_n_kv(g); i++)
        gguf_writer_copy_kv(w, g, i);
    gguf_writer_set_str(w, "tokenizer.ggml.pre", pre);
    char path2[512];
    snprintf(path2, sizeof path2, "%s/gpt2-%s.gguf", test_tmpdir(), pre);
    int rc = gguf_writer_write(w, path2, err);
    gguf_writer_free(w);
    gguf_close(g);
    return rc ? NULL : load_path(path2, err);
}

/* Encodes text and compares the decoded pieces, joined by '|', with want. */
static bool split_is(const tokenizer *t, const char *text, const char *want, char *got, size_t cap)
{
    int32_t ids[128];
    int n = enc(t, text, false, false, ids, 128);
    size_t o = 0;
    got[0] = 0;
    for (int i = 0; i < n && o + 1 < cap; i++) {
        if (i > 0)
            got[o++] = '|';
        int m = tok_piece(t, ids[i], got + o, cap - o);
        if (m < 0 || o + (size_t)m >= cap)
            return false;
        o += (size_t)m;
    }
    got[o] = 0;
    return strcmp(got, want) == 0;
}

static void test_pre_tokenizers(void)
{
    if (!vocab_path("gpt-2"))
        SKIP("vocab/ggml-vocab-gpt-2.gguf not found");
    static const struct {
        const char *pre, *text, *want;
    } cases[] = {
        /* digits: GPT-2 keeps runs whole, llama3 and "default" cut them into threes,
         * qwen2 / starcoder / deepseek-coder take single digits */
        {"gpt-2", "x 12", "x| 12"},
        {"llama3", "x 12", "x| |12"},
        {"llama-bpe", "x 1234567", "x| |123|456|7"},
        {"llama3", "x 1234567", "x| |123|456|7"},
        {"default", "x 1234567", "x| |123|456|7"},
        {"falcon", "x 1234567", "x| |123|456|7"},
        {"qwen2", "x 12345", "x| |1|2|3|4|5"},
        {"starcoder", "x 12345", "x| |1|2|3|4|5"},
        {"deepseek-coder", "x 12345", "x| |1|2|3|4|5"},
        {"deepseek-llm", "x 12", "x| |12"},
        {"deepseek-llm", "ab cd\n", "ab| cd|\n"},
        /* punctuation: "default" and falcon split it off before the GPT-2 regex */
        {"default", "a !!!", "a| |!!!"},
        {"falcon", "a !!!", "a| |!!!"},
        /* newlines: llama3 keeps a run of them together; GPT-2's \s+(?!\S) leaves the
         * last whitespace character before a word on its own */
        {"llama3", "a\n\nb", "a|\n\n|b"},
        {"gpt-2", "a\n\nb", "a|\n|\n|b"},
    };
    char err[ERR_MAX], got[256];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        err[0] = 0;
        tokenizer *t = gpt2_with_pre(cases[i].pre, err);
        CHECK_MSG(t, "%s: %s", cases[i].pre, err);
        bool ok = split_is(t, cases[i].text, cases[i].want, got, sizeof got);
        tok_free(t);
        CHECK_MSG(ok, "pre '%s', \"%s\": want \"%s\", got \"%s\"", cases[i].pre,
                  esc(cases[i].text, strlen(cases[i].text)),
                  esc(cases[i].want, strlen(cases[i].want)), esc(got, strlen(got)));
    }
    /* Every listed name compiles. */
    static const char *names[] = {"mpt",       "olmo",      "gpt-neox",        "dbrx",
                                  "smaug-bpe", "refact",    "command-r",       "smollm",
                                  "stablelm2", "poro-chat", "bloom",           "viking",
                                  "tekken",    "gpt-4o",    "deepseek-r1-qwen"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        err[0] = 0;
        tokenizer *t = gpt2_with_pre(names[i], err);
        CHECK_MSG(t, "%s: %s", names[i], err);
        int32_t ids[64];
        CHECK(enc(t, "Hello, world 123!", false, false, ids, 64) > 0);
        tok_free(t);
    }
    /* llama.cpp adds BOS by default for the llama3 family only. */
    tokenizer *t = gpt2_with_pre("llama-bpe", err);
    CHECK_MSG(t, "%s", err);
    bool llama3_bos = tok_add_bos(t);
    tok_free(t);
    CHECK(llama3_bos);
    t = gpt2_with_pre("dbrx", err);
    CHECK_MSG(t, "%s", err);
    bool dbrx_bos = tok_add_bos(t);
    tok_free(t);
    CHECK(!dbrx_bos);
    err[0] = 0;
    CHECK(gpt2_with_pre("no-such-pre", err) == NULL);
    CHECK_MSG(strstr(err, "no-such-pre"), "%s", err);
}

/* Exact ids where the pre-tokenizer once split differently from llama.cpp. The ids are
 * llama.cpp's (commit c392e5094, llama_tokenize without add_special / parse_special on
 * the GPT-2 vocabulary re-labelled with pre). */
static void test_pre_tokenizer_ids(void)
{
    if (!vocab_path("gpt-2"))
        SKIP("vocab/ggml-vocab-gpt-2.gguf not found");
    static const struct {
        const char *pre, *text;
        int n;
        int32_t ids[8];
    } cases[] = {
        /* U+180E MONGOLIAN VOWEL SEPARATOR is not white space (since Unicode 6.3), so
         * it joins the punctuation run after the space */
        {"gpt-2", " \xe1\xa0\x8e!", 4, {28053, 254, 236, 0}},
        {"llama3", "a \xe1\xa0\x8e!", 5, {64, 28053, 254, 236, 0}},
    };
    char err[ERR_MAX];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        err[0] = 0;
        tokenizer *t = gpt2_with_pre(cases[i].pre, err);
        CHECK_MSG(t, "%s: %s", cases[i].pre, err);
        int32_t ids[64];
        int n = enc(t, cases[i].text, false, false, ids, 64);
        tok_free(t);
        CHECK_MSG(ids_eq(ids, n, cases[i].ids, cases[i].n), "pre '%s', \"%s\": want%s, got%s",
                  cases[i].pre, esc(cases[i].text, strlen(cases[i].text)),
                  ids_str(cases[i].ids, cases[i].n), ids_str(ids, n < 0 ? 0 : n));
    }
    /* A word of 1000 letters: llama.cpp gives 250 tokens "aaaa" (24794) with tekken's
     * upper/lower-case regex, which must not run out of backtracking stack. */
    char word[1001];
    memset(word, 'a', 1000);
    word[1000] = 0;
    tokenizer *t = gpt2_with_pre("tekken", err);
    CHECK_MSG(t, "tekken: %s", err);
    int32_t *ids = malloc(1000 * sizeof *ids);
    int n = enc(t, word, false, false, ids, 1000);
    int n_aaaa = 0;
    for (int i = 0; i < n && i < 1000; i++)
        n_aaaa += ids[i] == 24794;
    free(ids);
    tok_free(t);
    CHECK_MSG(n == 250 && n_aaaa == 250, "1000 letters with tekken: %d tokens, %d of them 24794",
              n, n_aaaa);
}

/* ---- small hand-built vocabularies (no test data needed) ---- */

typedef struct {
    const char *text;
    float score;
    int32_t type;
} vtok;

static gguf_writer *vocab_writer(const char *model, const vtok *v, int n)
{
    gguf_writer *w = gguf_writer_new();
    const char **texts = malloc((size_t)n * sizeof *texts);
    float *scores = malloc((size_t)n * sizeof *scores);
    int32_t *types = malloc((size_t)n * sizeof *types);
    for (int i = 0; i < n; i++) {
        texts[i] = v[i].text;
        scores[i] = v[i].score;
        types[i] = v[i].type;
    }
    gguf_writer_set_str(w, "tokenizer.ggml.model", model);
    gguf_writer_set_str_arr(w, "tokenizer.ggml.tokens", texts, (uint64_t)n);
    gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_FLOAT32, scores, (uint64_t)n);
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_INT32, types, (uint64_t)n);
    free(texts);
    free(scores);
    free(types);
    return w;
}

/* Writes w (and frees it), then loads it; NULL with err on failure. */
static tokenizer *finish(gguf_writer *w, const char *name, char *err)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s.gguf", test_tmpdir(), name);
    int rc = gguf_writer_write(w, path, err);
    gguf_writer_free(w);
    return rc ? NULL : load_path(path, err);
}

#define U2581 "\xe2\x96\x81"

static const vtok spm_vocab[] = {
    {"<unk>", 0, 2},    {"<s>", 0, 3},    {"</s>", 0, 3},   {"<0x61>", 0, 6}, {"<0x62>", 0, 6},
    {"<0x63>", 0, 6},   {"<0xE2>", 0, 6}, {"<0x96>", 0, 6}, {"<0x81>", 0, 6}, {U2581, -1, 1},
    {"a", -2, 1},       {"b", -2, 1},     {"c", -2, 1},     {"ab", -3, 1},    {"bc", -2.5f, 1},
    {U2581 "a", -4, 1}, {"<tool>", 0, 4},
};

static void test_spm_merge_order(void)
{
    char err[ERR_MAX] = "";
    tokenizer *t = finish(vocab_writer("llama", spm_vocab, 17), "spm-small", err);
    CHECK_MSG(t, "%s", err);
    int32_t ids[32];
    /* "▁abc": pairs ▁a (-4), ab (-3), bc (-2.5): bc wins, then ▁a. */
    int n = enc(t, "abc", false, false, ids, 32);
    int32_t w1[] = {15, 14};
    CHECK_MSG(ids_eq(ids, n, w1, 2), "got%s", ids_str(ids, n));
    /* No space prefix when add_space_prefix is false is tested below; 'd' is not in the
     * vocabulary and has no byte token: it becomes <unk>. */
    n = enc(t, "ad", false, false, ids, 32);
    int32_t w2[] = {15, 0};
    CHECK_MSG(ids_eq(ids, n, w2, 2), "got%s", ids_str(ids, n));
    /* User-defined tokens are split out even without parse_special, and the text after
     * them gets the space prefix. */
    n = enc(t, "a<tool>b", false, false, ids, 32);
    int32_t w3[] = {15, 16, 9, 11};
    CHECK_MSG(ids_eq(ids, n, w3, 4), "got%s", ids_str(ids, n));
    char buf[64];
    CHECK_EQ(tok_decode(t, ids, n, false, false, buf, sizeof buf), 8);
    CHECK(strcmp(buf, "a<tool>b") == 0);
    /* A truncated UTF-8 lead byte before a space swallows part of the '▁': more
     * symbols than input bytes (found by fuzzing; ASan checks the bounds). */
    n = enc(t, "\xd9 \xd9 \xf0 \xf0  ", false, false, ids, 32);
    CHECK(n > 8 && n <= 32);
    tok_free(t);

    gguf_writer *w = vocab_writer("llama", spm_vocab, 17);
    gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", false);
    gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", true);
    t = finish(w, "spm-small-noprefix", err);
    CHECK_MSG(t, "%s", err);
    n = enc(t, "abc", true, false, ids, 32);
    int32_t w4[] = {1, 10, 14, 2};
    CHECK_MSG(ids_eq(ids, n, w4, 4), "got%s", ids_str(ids, n));
    CHECK_EQ(tok_decode(t, ids, n, true, false, buf, sizeof buf), 3);
    CHECK(strcmp(buf, "abc") == 0);
    tok_free(t);
}

static void test_bpe_small(void)
{
    /* Byte-level alphabet for "a", "b", " " ("Ġ") plus merges. */
    static const vtok v[] = {{"a", 0, 1},
                             {"b", 0, 1},
                             {"\xc4\xa0", 0, 1},
                             {"ab", 0, 1},
                             {"\xc4\xa0"
                              "a",
                              0, 1},
                             {"\xc4\xa0"
                              "ab",
                              0, 1},
                             {"<|end|>", 0, 3}};
    static const char *merges[] = {"a b", "\xc4\xa0 a",
                                   "\xc4\xa0"
                                   "a b"};
    char err[ERR_MAX] = "";
    gguf_writer *w = vocab_writer("gpt2", v, 7);
    gguf_writer_set_str_arr(w, "tokenizer.ggml.merges", merges, 3);
    tokenizer *t = finish(w, "bpe-small", err);
    CHECK_MSG(t, "%s", err);
    int32_t ids[32];
    /* "a" "b" merge first (rank 0), so " ab" is Ġ + ab: rank of (Ġ, ab) is absent. */
    int n = enc(t, "ab ab", false, false, ids, 32);
    int32_t w1[] = {3, 2, 3};
    CHECK_MSG(ids_eq(ids, n, w1, 3), "got%s", ids_str(ids, n));
    CHECK(tok_is_eog(t, 6));
    CHECK_EQ(tok_special(t, TOK_SPECIAL_EOT), 6);
    CHECK(eog_list_matches(t));
    /* 'c' has no byte-level token: it is dropped, like llama.cpp does. */
    n = enc(t, "acb", false, false, ids, 32);
    int32_t w2[] = {0, 1};
    CHECK_MSG(ids_eq(ids, n, w2, 2), "got%s", ids_str(ids, n));
    tok_free(t);
}

/* Cohere's vocabulary (Command-R, Aya): "<|END_OF_TURN_TOKEN|>" ends generation (a
 * reply's turn) whatever EOS the file names, "<|START_OF_TURN_TOKEN|>" does not. */
static void test_cohere_turn_end(void)
{
    static const vtok v[] = {{"a", 0, 1},
                             {"b", 0, 1},
                             {"<|END_OF_TURN_TOKEN|>", 0, 3},
                             {"<|START_OF_TURN_TOKEN|>", 0, 3},
                             {"<|CHATBOT_TOKEN|>", 0, 3},
                             {"ab", 0, 1}};
    static const char *merges[] = {"a b"};
    char err[ERR_MAX] = "";
    gguf_writer *w = vocab_writer("gpt2", v, 6);
    gguf_writer_set_str_arr(w, "tokenizer.ggml.merges", merges, 1);
    tokenizer *t = finish(w, "cohere", err);
    CHECK_MSG(t, "%s", err);
    CHECK(tok_is_eog(t, 2) && !tok_is_eog(t, 3) && !tok_is_eog(t, 4));
    CHECK_EQ(tok_special(t, TOK_SPECIAL_EOT), 2);
    CHECK(eog_list_matches(t));
    tok_free(t);
}

/* gpt-oss's harmony vocabulary: "<|return|>" and "<|call|>" end generation and "<|end|>",
 * which ends a message, does not; it and the markup between messages are shown in a
 * reply's text (user-defined), as llama.cpp loads them. A vocabulary with "<|end|>" but
 * no "<|return|>" keeps it as an end of generation (phi3's). */
static void test_harmony_tokens(void)
{
    static const vtok v[] = {{"a", 0, 1},           {"b", 0, 1},           {"<|return|>", 0, 3},
                             {"<|call|>", 0, 3},    {"<|end|>", 0, 3},     {"<|start|>", 0, 3},
                             {"<|channel|>", 0, 3}, {"<|message|>", 0, 3}, {"<|constrain|>", 0, 3},
                             {"<|endoftext|>", 0, 3}, {"ab", 0, 1}};
    char err[ERR_MAX] = "";
    static const char *merges[] = {"a b"};
    gguf_writer *w = vocab_writer("gpt2", v, 11);
    gguf_writer_set_str_arr(w, "tokenizer.ggml.merges", merges, 1);
    tokenizer *t = finish(w, "harmony", err);
    CHECK_MSG(t, "%s", err);
    CHECK(tok_is_eog(t, 2) && tok_is_eog(t, 3) && tok_is_eog(t, 9));
    CHECK(!tok_is_eog(t, 4) && !tok_is_eog(t, 5) && !tok_is_eog(t, 6));
    CHECK(eog_list_matches(t));
    int32_t ids[] = {5, 6, 0, 7, 1, 4, 2};
    char buf[128];
    int n = tok_decode(t, ids, 7, false, false, buf, sizeof buf);
    CHECK_MSG(n > 0 && !strcmp(buf, "<|start|><|channel|>a<|message|>b<|end|>"), "%s", buf);
    tok_free(t);

    static const vtok phi[] = {{"a", 0, 1}, {"<|end|>", 0, 3}, {"<|endoftext|>", 0, 3},
                               {"b", 0, 1}, {"ab", 0, 1}};
    w = vocab_writer("gpt2", phi, 5);
    gguf_writer_set_str_arr(w, "tokenizer.ggml.merges", merges, 1);
    t = finish(w, "harmony-not", err);
    CHECK_MSG(t, "%s", err);
    CHECK(tok_is_eog(t, 1));
    int32_t one[] = {0, 1};
    n = tok_decode(t, one, 2, false, false, buf, sizeof buf);
    CHECK_MSG(n == 1 && !strcmp(buf, "a"), "%s", buf);
    tok_free(t);
}

/* Fill-in-the-middle tokens as llama.cpp's vocabulary loading finds them: the
 * tokenizer.ggml.fim_*_token_id keys, the older prefix/suffix/middle keys (read after
 * them, so they win), else a control or user-defined token of a known spelling; FIM_PAD,
 * FIM_REP and FIM_SEP end generation, as llama.cpp adds them to its end-of-generation
 * tokens. */
static void test_fim_tokens(void)
{
    static const enum tok_special fim[] = {TOK_SPECIAL_FIM_PRE, TOK_SPECIAL_FIM_SUF,
                                           TOK_SPECIAL_FIM_MID, TOK_SPECIAL_FIM_PAD,
                                           TOK_SPECIAL_FIM_REP, TOK_SPECIAL_FIM_SEP};
    char err[ERR_MAX] = "";
    /* none: no key, no known spelling */
    tokenizer *t = finish(vocab_writer("llama", spm_vocab, 17), "fim-none", err);
    CHECK_MSG(t, "%s", err);
    for (size_t i = 0; i < sizeof fim / sizeof *fim; i++)
        CHECK_EQ(tok_special(t, fim[i]), -1);
    tok_free(t);

    /* the keys, pointing at tokens of any type */
    gguf_writer *w = vocab_writer("llama", spm_vocab, 17);
    static const char *const keys[] = {"fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep",
                                       "fim_sep"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        char key[64];
        snprintf(key, sizeof key, "tokenizer.ggml.%s_token_id", keys[i]);
        gguf_writer_set_u32(w, key, 10 + (uint32_t)i);
    }
    t = finish(w, "fim-keys", err);
    CHECK_MSG(t, "%s", err);
    for (size_t i = 0; i < sizeof fim / sizeof *fim; i++)
        CHECK_EQ(tok_special(t, fim[i]), 10 + (int)i);
    CHECK(!tok_is_eog(t, 10) && !tok_is_eog(t, 11) && !tok_is_eog(t, 12));
    CHECK(tok_is_eog(t, 13) && tok_is_eog(t, 14) && tok_is_eog(t, 15) && tok_is_eog(t, 2));
    CHECK(eog_list_matches(t));
    tok_free(t);

    /* the older keys, which llama.cpp reads after the new ones */
    w = vocab_writer("llama", spm_vocab, 17);
    gguf_writer_set_u32(w, "tokenizer.ggml.fim_pre_token_id", 10);
    gguf_writer_set_u32(w, "tokenizer.ggml.prefix_token_id", 13);
    gguf_writer_set_u32(w, "tokenizer.ggml.suffix_token_id", 14);
    gguf_writer_set_u32(w, "tokenizer.ggml.middle_token_id", 15);
    t = finish(w, "fim-old-keys", err);
    CHECK_MSG(t, "%s", err);
    CHECK_EQ(tok_special(t, TOK_SPECIAL_FIM_PRE), 13);
    CHECK_EQ(tok_special(t, TOK_SPECIAL_FIM_SUF), 14);
    CHECK_EQ(tok_special(t, TOK_SPECIAL_FIM_MID), 15);
    CHECK_EQ(tok_special(t, TOK_SPECIAL_FIM_PAD), -1);
    CHECK(!tok_is_eog(t, 13));
    tok_free(t);

    /* Qwen's spellings, as control tokens; a key wins over a spelling */
    static const vtok qwen[] = {
        {"<unk>", 0, 2},          {"<s>", 0, 3},           {"</s>", 0, 3},
        {"a", 0, 1},              {"<|fim_prefix|>", 0, 3}, {"<|fim_suffix|>", 0, 3},
        {"<|fim_middle|>", 0, 3}, {"<|fim_pad|>", 0, 3},    {"<|repo_name|>", 0, 3},
        {"<|file_sep|>", 0, 3},   {"<fim-prefix>", 0, 4},
    };
    t = finish(vocab_writer("llama", qwen, 11), "fim-qwen", err);
    CHECK_MSG(t, "%s", err);
    for (size_t i = 0; i < sizeof fim / sizeof *fim; i++)
        CHECK_EQ(tok_special(t, fim[i]), 4 + (int)i);
    CHECK(tok_is_eog(t, 7) && tok_is_eog(t, 8) && tok_is_eog(t, 9) && !tok_is_eog(t, 4));
    CHECK(eog_list_matches(t));
    tok_free(t);
    w = vocab_writer("llama", qwen, 11);
    gguf_writer_set_u32(w, "tokenizer.ggml.fim_pre_token_id", 10);
    t = finish(w, "fim-qwen-key", err);
    CHECK_MSG(t, "%s", err);
    CHECK_EQ(tok_special(t, TOK_SPECIAL_FIM_PRE), 10);
    CHECK_EQ(tok_special(t, TOK_SPECIAL_FIM_SUF), 5);
    tok_free(t);

    /* CodeLlama's short spellings are taken as control tokens only: a normal token that
     * happens to read "<PRE>" is text of the vocabulary */
    static const vtok short_names[] = {
        {"<unk>", 0, 2}, {"<s>", 0, 3},   {"</s>", 0, 3},   {"<PRE>", 0, 3},
        {"<SUF>", 0, 3}, {"<MID>", 0, 4}, {"<PAD>", 0, 1}, {"<REPO>", 0, 3},
    };
    t = finish(vocab_writer("llama", short_names, 8), "fim-short", err);
    CHECK_MSG(t, "%s", err);
    CHECK_EQ(tok_special(t, TOK_SPECIAL_FIM_PRE), 3);
    CHECK_EQ(tok_special(t, TOK_SPECIAL_FIM_SUF), 4);
    CHECK_EQ(tok_special(t, TOK_SPECIAL_FIM_MID), 5);
    CHECK_EQ(tok_special(t, TOK_SPECIAL_FIM_PAD), -1);
    CHECK(!tok_is_eog(t, 6));
    CHECK_EQ(tok_special(t, TOK_SPECIAL_FIM_REP), 7);
    CHECK_EQ(tok_special(t, TOK_SPECIAL_FIM_SEP), -1);
    tok_free(t);
}

/* ---- malformed metadata ---- */

static void expect_error(gguf_writer *w, const char *name, const char *needle)
{
    char err[ERR_MAX] = "";
    tokenizer *t = finish(w, name, err);
    tok_free(t);
    CHECK_MSG(t == NULL, "%s: loaded", name);
    CHECK_MSG(strstr(err, needle), "%s: error \"%s\" lacks \"%s\"", name, err, needle);
}

/* A unigram vocabulary of T5's layout (pad, eos, unk first), no charsmap. */
static const vtok ugm_vocab[] = {
    {"<pad>", 0, 3}, {"</s>", 0, 3},  {"<unk>", 0, 2}, {U2581, -2, 1},    {"a", -3, 1},
    {"b", -3, 1},    {"ab", -4, 1},   {U2581 "ab", -1, 1}, {"c", -5, 1},  {"abc", -8.5f, 1},
    {"<x>", 0, 4},   {"zz", -1, 5},   {"\xc3\xa9", -2, 1},
};

static tokenizer *ugm_small(bool space_prefix, bool remove_extra, const char *name, char *err)
{
    gguf_writer *w = vocab_writer("t5", ugm_vocab, 13);
    gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", space_prefix);
    gguf_writer_set_bool(w, "tokenizer.ggml.remove_extra_whitespaces", remove_extra);
    return finish(w, name, err);
}

#define CHECK_IDS(t, text, add_special, ...)                                                       \
    do {                                                                                           \
        int32_t want_[] = {__VA_ARGS__}, got_[64];                                                 \
        int n_ = enc(t, text, add_special, false, got_, 64);                                       \
        CHECK_MSG(ids_eq(got_, n_, want_, (int)(sizeof want_ / sizeof *want_)), "\"%s\": got%s",  \
                  esc(text, strlen(text)), ids_str(got_, n_));                                     \
    } while (0)

/* The segmentation of highest score, unknowns, whitespace rules, user-defined tokens and
 * the T5 defaults, on a vocabulary small enough to work the sums by hand. */
static void test_ugm_small(void)
{
    char err[ERR_MAX] = "";
    tokenizer *t = ugm_small(true, true, "ugm-small", err);
    CHECK_MSG(t, "%s", err);
    CHECK_EQ(tok_model(t), TOK_MODEL_UGM);
    /* "▁ab": ▁ab (-1) beats ▁ + ab (-6) and ▁ + a + b (-8) */
    CHECK_IDS(t, "ab", false, 7);
    /* "▁abc": ▁ab + c (-6) beats ▁ + abc (-10.5) */
    CHECK_IDS(t, "abc", false, 7, 8);
    /* 'd' is in no piece: the unknown token at -8.5 - 10; a run of them is one */
    CHECK_IDS(t, "a d", false, 3, 4, 3, 2);
    CHECK_IDS(t, "a ddd b", false, 3, 4, 3, 2, 3, 5);
    /* a byte that starts no UTF-8 character is U+FFFD, unknown here; é is a piece */
    CHECK_IDS(t, "\xff" "\xc3\xa9", false, 3, 2, 12);
    /* remove_extra_whitespaces: runs shrink to one space, the ends lose theirs */
    CHECK_IDS(t, "  a   b  ", false, 3, 4, 3, 5);
    CHECK_EQ(enc(t, "   ", false, false, NULL, 0), 0);
    /* unused pieces may be chosen, as llama.cpp and Hugging Face have it */
    CHECK_IDS(t, "zz", false, 3, 11);
    /* user-defined tokens are split out; each run of text gets its own space prefix */
    CHECK_IDS(t, "a<x>b", false, 3, 4, 10, 3, 5);
    /* T5's defaults: EOS 1 appended, no BOS */
    CHECK_IDS(t, "ab", true, 7, 1);
    CHECK(tok_add_eos(t) && !tok_add_bos(t));
    CHECK_EQ(tok_eos(t), 1);
    CHECK_EQ(tok_special(t, TOK_SPECIAL_UNK), 2);
    CHECK_EQ(tok_special(t, TOK_SPECIAL_PAD), 0);
    /* the decoder undoes the space prefix, as for SentencePiece's BPE */
    int32_t ids[] = {7, 8, 1};
    char text[32];
    int n = tok_decode(t, ids, 3, true, false, text, sizeof text);
    CHECK_MSG(n == 3 && !strcmp(text, "abc"), "decoded \"%s\"", text);
    tok_free(t);

    /* with neither prefix nor merging, the text starts bare and each space is a piece */
    t = ugm_small(false, false, "ugm-plain", err);
    CHECK_MSG(t, "%s", err);
    CHECK_IDS(t, "ab", false, 6);
    CHECK_IDS(t, "a  b", false, 4, 3, 3, 5);
    CHECK_IDS(t, " ab", false, 7);
    tok_free(t);
}

/* With all 256 <0xXX> byte tokens, an unknown run is spelled in bytes (SentencePiece's
 * byte fallback); without one of them, it is the unknown token. */
static void test_ugm_byte_fallback(void)
{
    vtok v[13 + 256];
    char names[256][8];
    memcpy(v, ugm_vocab, sizeof ugm_vocab);
    for (int b = 0; b < 256; b++) {
        snprintf(names[b], sizeof names[b], "<0x%02X>", b);
        v[13 + b] = (vtok){names[b], 0, 6};
    }
    char err[ERR_MAX] = "";
    gguf_writer *w = vocab_writer("t5", v, 13 + 256);
    gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", true);
    tokenizer *t = finish(w, "ugm-bytes", err);
    CHECK_MSG(t, "%s", err);
    CHECK_IDS(t, "a dd", false, 3, 4, 3, 13 + 'd', 13 + 'd');
    char text[32];
    int32_t ids[] = {3, 4, 3, 13 + 'd', 13 + 'd'};
    int n = tok_decode(t, ids, 5, false, false, text, sizeof text);
    CHECK_MSG(n == 4 && !strcmp(text, "a dd"), "decoded \"%s\"", text);
    tok_free(t);

    v[13 + 'q'].type = 1;
    w = vocab_writer("t5", v, 13 + 256);
    gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", true);
    t = finish(w, "ugm-bytes-partial", err);
    CHECK_MSG(t, "%s", err);
    CHECK_IDS(t, "a dd", false, 3, 4, 3, 2);
    tok_free(t);
}

/* A copy of tests/engine/data/ugm-docs.gguf with its charsmap replaced by blob; NULL if
 * it does not load (err says why). */
static tokenizer *ugm_docs_with_charsmap(const uint8_t *blob, size_t n, const char *name,
                                         char *err)
{
    gguf_file *g = gguf_open("tests/engine/data/ugm-docs.gguf", err);
    if (!g)
        return NULL;
    gguf_writer *w = gguf_writer_new();
    for (int64_t i = 0; i < gguf_n_kv(g); i++)
        if (!gguf_str_eq(gguf_key(g, i), "tokenizer.ggml.precompiled_charsmap"))
            gguf_writer_copy_kv(w, g, i);
    gguf_writer_set_arr(w, "tokenizer.ggml.precompiled_charsmap", GGUF_UINT8, blob, n);
    char path[512];
    snprintf(path, sizeof path, "%s/%s.gguf", test_tmpdir(), name);
    int rc = gguf_writer_write(w, path, err);
    gguf_writer_free(w);
    gguf_close(g);
    return rc ? NULL : load_path(path, err);
}

/* A charsmap of random units cannot make encoding read outside it: every index is
 * bounded. Random texts through a few random maps give ids in the vocabulary. */
static void test_ugm_random_charsmap(void)
{
    uint64_t rng = 88172645463325252ull;
    char err[ERR_MAX] = "";
    for (int map = 0; map < 8; map++) {
        uint8_t blob[4 + 4096 + 64];
        uint32_t units = 4096;
        memcpy(blob, &units, 4);
        for (size_t i = 4; i < sizeof blob; i++) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            blob[i] = (uint8_t)(rng >> 24);
        }
        blob[sizeof blob - 1] = 0;
        char name[32];
        snprintf(name, sizeof name, "ugm-random-%d", map);
        tokenizer *t = ugm_docs_with_charsmap(blob, sizeof blob, name, err);
        CHECK_MSG(t, "%s", err);
        for (int k = 0; k < 200; k++) {
            char text[64];
            for (size_t i = 0; i < sizeof text; i++) {
                rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
                text[i] = (char)(rng >> 32);
            }
            int32_t ids[1024];
            int n = tok_encode(t, text, sizeof text, true, false, ids, 1024);
            CHECK(n > 0 && n <= 1024);
            for (int i = 0; i < n; i++)
                CHECK(ids[i] >= 0 && ids[i] < tok_n_vocab(t));
        }
        tok_free(t);
    }
}

static void test_ugm_bad_charsmap(void)
{
    char err[ERR_MAX] = "";
    uint8_t blob[16] = {8, 0, 0, 0};
    CHECK(!ugm_docs_with_charsmap(blob, 3, "ugm-cm-short", err));
    CHECK_MSG(strstr(err, "precompiled_charsmap"), "%s", err);
    blob[0] = 12; /* units and nothing after them */
    CHECK(!ugm_docs_with_charsmap(blob, 16, "ugm-cm-nostrings", err));
    CHECK_MSG(strstr(err, "double array"), "%s", err);
    blob[0] = 6; /* not whole units */
    CHECK(!ugm_docs_with_charsmap(blob, 16, "ugm-cm-units", err));
    CHECK_MSG(strstr(err, "double array"), "%s", err);
    blob[0] = 8;
    blob[15] = 'x';
    CHECK(!ugm_docs_with_charsmap(blob, 16, "ugm-cm-nul", err));
    CHECK_MSG(strstr(err, "NUL"), "%s", err);
    static uint8_t long_string[4 + 8 + 2000]; /* a replacement past the bound */
    memcpy(long_string, blob, 12);
    memset(long_string + 12, 'a', sizeof long_string - 13);
    long_string[sizeof long_string - 1] = 0;
    CHECK(!ugm_docs_with_charsmap(long_string, sizeof long_string, "ugm-cm-long", err));
    CHECK_MSG(strstr(err, "replacement string of 1999 bytes"), "%s", err);

    static const vtok v[] = {{"a", -1, 1}, {"b", -1, 1}, {"<unk>", 0, 2}};
    gguf_writer *w = vocab_writer("t5", v, 3);
    float f[2] = {0};
    gguf_writer_set_arr(w, "tokenizer.ggml.precompiled_charsmap", GGUF_FLOAT32, f, 2);
    expect_error(w, "ugm-cm-type", "not an array of bytes");
    w = vocab_writer("t5", v, 3);
    gguf_writer_set_u32(w, "tokenizer.ggml.remove_extra_whitespaces", 1);
    expect_error(w, "ugm-ws-type", "remove_extra_whitespaces");
    w = vocab_writer("t5", v, 3);
    gguf_writer_set_i32(w, "tokenizer.ggml.unknown_token_id", -1);
    expect_error(w, "ugm-no-unk", "unknown token");
}

static void test_bad_metadata(void)
{
    static const vtok v[] = {{"a", 0, 1}, {"b", 0, 1}, {"ab", 0, 1}, {"<s>", 0, 3}};
    gguf_writer *w;

    w = vocab_writer("gpt2", v, 4);
    static const char *m1[] = {"a c"};
    gguf_writer_set_str_arr(w, "tokenizer.ggml.merges", m1, 1);
    expect_error(w, "merge-missing", "not in the vocabulary");

    w = vocab_writer("gpt2", v, 4);
    static const char *m2[] = {"ab"};
    gguf_writer_set_str_arr(w, "tokenizer.ggml.merges", m2, 1);
    expect_error(w, "merge-nospace", "two tokens");

    w = vocab_writer("gpt2", v, 4);
    expect_error(w, "merges-absent", "tokenizer.ggml.merges");

    w = vocab_writer("llama", v, 4);
    int32_t short_types[3] = {1, 1, 1};
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_INT32, short_types, 3);
    expect_error(w, "types-short", "token_type");

    w = vocab_writer("llama", v, 4);
    int32_t bad_types[4] = {1, 1, 9, 1};
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_INT32, bad_types, 4);
    expect_error(w, "types-bad", "token_type[2]");

    w = vocab_writer("llama", v, 4);
    float scores[5] = {0};
    gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_FLOAT32, scores, 5);
    expect_error(w, "scores-long", "scores");

    w = vocab_writer("llama", v, 4);
    gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 4);
    expect_error(w, "bos-range", "bos_token_id");

    w = vocab_writer("llama", v, 4);
    gguf_writer_set_u32(w, "tokenizer.ggml.fim_mid_token_id", 4);
    expect_error(w, "fim-range", "fim_mid_token_id");

    w = vocab_writer("llama", v, 4);
    gguf_writer_set_str(w, "tokenizer.ggml.eos_token_id", "2");
    expect_error(w, "eos-type", "eos_token_id");

    w = vocab_writer("llama", v, 4);
    gguf_writer_set_u32(w, "tokenizer.ggml.add_bos_token", 1);
    expect_error(w, "flag-type", "add_bos_token");

    w = vocab_writer("rwkv", v, 4);
    expect_error(w, "model-unknown", "rwkv");

    w = gguf_writer_new();
    gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    expect_error(w, "tokens-absent", "tokenizer.ggml.tokens");

    w = gguf_writer_new();
    gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_writer_set_arr(w, "tokenizer.ggml.tokens", GGUF_INT32, short_types, 3);
    expect_error(w, "tokens-type", "tokenizer.ggml.tokens");

    static const vtok vb[] = {{"<unk>", 0, 2}, {"<s>", 0, 3}, {"</s>", 0, 3}, {"<0xZZ>", 0, 6}};
    w = vocab_writer("llama", vb, 4);
    expect_error(w, "byte-bad", "<0xXX>");

    /* A vocabulary too small for the SPM default BOS (1) but asked to add BOS. */
    static const vtok v1[] = {{"a", 0, 1}};
    w = vocab_writer("llama", v1, 1);
    expect_error(w, "bos-missing", "BOS");
}

int main(void)
{
    RUN(test_vectors_spm);
    RUN(test_vectors_bpe_gpt2);
    RUN(test_vectors_wpm_bert);
    RUN(test_vectors_ugm);
    RUN(test_round_trip_spm);
    RUN(test_round_trip_bpe);
    RUN(test_pieces_table);
    RUN(test_spm_specials_and_bos);
    RUN(test_bpe_specials);
    RUN(test_wpm_specials);
    RUN(test_pre_tokenizers);
    RUN(test_pre_tokenizer_ids);
    RUN(test_spm_merge_order);
    RUN(test_bpe_small);
    RUN(test_harmony_tokens);
    RUN(test_cohere_turn_end);
    RUN(test_fim_tokens);
    RUN(test_ugm_small);
    RUN(test_ugm_byte_fallback);
    RUN(test_ugm_random_charsmap);
    RUN(test_ugm_bad_charsmap);
    RUN(test_bad_metadata);
    return test_finish();
}
