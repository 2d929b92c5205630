/* libFuzzer target for the tokenizers. The first input byte picks the mode:
 *   even: the rest is a GGUF file; if it loads as a tokenizer, some text is encoded and
 *         every token is decoded (malformed metadata must fail cleanly, never crash);
 *   odd:  the rest is text, encoded with small SPM, byte-level BPE (llama3 pre-tokenizer)
 *         and WordPiece vocabularies and the unigram one of tests/engine/data (with its
 *         NFKC charsmap; run from the repository, or it is left out); byte-level BPE
 *         must give the text back exactly. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/tok/tokenizer.h"

static void exercise(const tokenizer *t, const char *text, size_t len, bool must_round_trip)
{
    int32_t ids[4096];
    static char buf[65536];
    for (int special = 0; special < 2; special++) {
        int n = tok_encode(t, text, len, special, special, ids, 4096);
        if (n < 0 || (n > 0 && tok_encode(t, text, len, special, special, ids, 1) != n))
            abort();
        if (n > 4096)
            continue;
        for (int i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= tok_n_vocab(t) || tok_piece(t, ids[i], buf, 64) < 0)
                abort();
        int m = tok_decode(t, ids, n, special, special, buf, sizeof buf);
        if (m < 0)
            abort();
        if (must_round_trip && !special && (m != (int)len || memcmp(buf, text, len) != 0))
            abort();
    }
}

static tokenizer *build(const char *model, const char *pre, int n, const char *const *texts,
                        const int32_t *types, int n_merges, const char *const *merges)
{
    char path[] = "/tmp/fuzz_tokenizer_XXXXXX", err[ERR_MAX];
    int fd = mkstemp(path);
    if (fd < 0)
        abort();
    close(fd);
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_str(w, "tokenizer.ggml.model", model);
    if (pre)
        gguf_writer_set_str(w, "tokenizer.ggml.pre", pre);
    gguf_writer_set_str_arr(w, "tokenizer.ggml.tokens", texts, (uint64_t)n);
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_INT32, types, (uint64_t)n);
    if (strcmp(model, "bert") == 0) {
        gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 1);
        gguf_writer_set_u32(w, "tokenizer.ggml.cls_token_id", 2);
        gguf_writer_set_u32(w, "tokenizer.ggml.seperator_token_id", 3);
    }
    if (merges)
        gguf_writer_set_str_arr(w, "tokenizer.ggml.merges", merges, (uint64_t)n_merges);
    tokenizer *t = NULL;
    if (gguf_writer_write(w, path, err) == 0) {
        gguf_file *g = gguf_open(path, err);
        if (g && tok_load(g, &t, err) != 0)
            fprintf(stderr, "%s\n", err);
        gguf_close(g);
    }
    gguf_writer_free(w);
    unlink(path);
    if (!t)
        abort();
    return t;
}

static tokenizer *vocabs[4];

static void build_vocabs(void)
{
    static char store[300][8];
    const char *texts[300];
    int32_t types[300];
    int n = 0;

    /* SPM: specials, 256 byte tokens, a few pieces. */
    static const char *spm_extra[] = {"<unk>",           "<s>",           "</s>",
                                      "\xe2\x96\x81",    "\xe2\x96\x81t", "he",
                                      "\xe2\x96\x81the", "<|im_end|>"};
    for (int i = 0; i < 3; i++, n++)
        texts[n] = spm_extra[i], types[n] = i == 0 ? 2 : 3;
    for (int b = 0; b < 256; b++, n++) {
        snprintf(store[n], sizeof store[n], "<0x%02X>", b);
        texts[n] = store[n], types[n] = 6;
    }
    for (int i = 3; i < 8; i++, n++)
        texts[n] = spm_extra[i], types[n] = i == 7 ? 4 : 1;
    vocabs[0] = build("llama", NULL, n, texts, types, 0, NULL);

    /* BPE: the 256 byte-level characters, two merges, an end token. */
    n = 0;
    int next = 256;
    for (int b = 0; b < 256; b++, n++) {
        bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
        int cp = printable ? b : next++;
        if (cp < 0x80) {
            store[n][0] = (char)cp, store[n][1] = 0;
        } else {
            store[n][0] = (char)(0xc0 | cp >> 6), store[n][1] = (char)(0x80 | (cp & 0x3f));
            store[n][2] = 0;
        }
        texts[n] = store[n], types[n] = 1;
    }
    static const char *bpe_extra[] = {"he", "\xc4\xa0t", "<|endoftext|>"};
    static const char *merges[] = {"h e", "\xc4\xa0 t"};
    for (int i = 0; i < 3; i++, n++)
        texts[n] = bpe_extra[i], types[n] = i == 2 ? 3 : 1;
    vocabs[1] = build("gpt2", "llama3", n, texts, types, 2, merges);

    /* WordPiece. */
    static const char *wpm[] = {"[PAD]",         "[UNK]",  "[CLS]",
                                "[SEP]",         "[MASK]", "\xe2\x96\x81the",
                                "\xe2\x96\x81t", "he",     "\xe2\x96\x81,"};
    n = 0;
    for (int i = 0; i < 9; i++, n++)
        texts[n] = wpm[i], types[n] = i < 5 ? 3 : 1;
    vocabs[2] = build("bert", NULL, n, texts, types, 0, NULL);

    char err[ERR_MAX];
    gguf_file *g = gguf_open("tests/engine/data/ugm-docs.gguf", err);
    if (!g || tok_load(g, &vocabs[3], err) != 0)
        fprintf(stderr, "fuzz_tokenizer: no unigram vocabulary: %s\n", err);
    gguf_close(g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const char *rest = (const char *)data + 1;
    size_t len = size - 1;
    if (data[0] & 1) {
        if (!vocabs[0])
            build_vocabs();
        exercise(vocabs[0], rest, len, false);
        exercise(vocabs[1], rest, len, true);
        exercise(vocabs[2], rest, len, false);
        if (vocabs[3])
            exercise(vocabs[3], rest, len, false);
        return 0;
    }
    char err[ERR_MAX];
    gguf_file *g = gguf_open_memory(rest, len, err);
    if (!g)
        return 0;
    tokenizer *t = NULL;
    if (tok_load(g, &t, err) == 0) {
        static const char sample[] = "Hello, world! <s> 123 \xc3\xa9\xe2\x96\x81 \xff";
        exercise(t, sample, sizeof sample - 1, false);
        for (int32_t id = 0; id < tok_n_vocab(t) && id < 1000; id++) {
            char buf[64];
            if (tok_piece(t, id, buf, sizeof buf) < 0)
                abort();
        }
        tok_free(t);
    } else if (t != NULL) {
        abort();
    }
    gguf_close(g);
    return 0;
}
