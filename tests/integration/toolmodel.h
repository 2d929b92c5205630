/*
 * toolmodel.h — the random-weight model the tool-calling tests serve: a synthetic
 * vocabulary (specials, one token whose text is a whole reply of calls, the printable
 * ASCII characters one each so that any JSON can be written, a test's own tokens, "tokN"
 * fillers) with the chat template of the family under test, and the tools the tests send.
 *
 * Header-only (static inline), as llmsd_proc.h: the Makefile links tests only with
 * tests/support, and this is for the integration tests alone.
 */
#ifndef LLMS_TESTS_TOOLMODEL_H
#define LLMS_TESTS_TOOLMODEL_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/gguf/gguf.h"
#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/support/test.h"

#define TOOLMODEL_N_VOCAB 300
#define TOOLMODEL_CALL_TOKEN 3 /* the token whose text is the reply of calls */
#define TOOLMODEL_FIRST_CHAR 4 /* tokens from here are ' ' .. '~' */

/* SentencePiece writes a space as U+2581 */
#define TOOLMODEL_SP "\xe2\x96\x81"

/* A test's own tokens come after the characters: from this id on. */
#define TOOLMODEL_FIRST_EXTRA (TOOLMODEL_FIRST_CHAR + '~' - ' ' + 1)

/* A token of a test's own: its text (a space as TOOLMODEL_SP) and GGUF token type (1
 * normal, 3 control, 4 user-defined). */
typedef struct toolmodel_token {
    const char *text;
    int32_t type;
} toolmodel_token;

static const char toolmodel_weather_tool[] =
    "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Get the "
    "weather in a city\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":"
    "\"string\"}},\"required\":[\"city\"]}}}";

/* A tool whose arguments are bounded (an enum, an integer in 1..9): a forced call of it
 * ends within a few tokens whatever a random model prefers. */
static const char toolmodel_pick_tool[] =
    "{\"type\":\"function\",\"function\":{\"name\":\"pick_day\",\"parameters\":{\"type\":"
    "\"object\",\"properties\":{\"day\":{\"enum\":[\"mon\",\"tue\"]},\"hours\":{\"type\":"
    "\"integer\",\"minimum\":1,\"maximum\":9}},\"required\":[\"day\",\"hours\"]}}}";

/* Writes the vocabulary, call_piece the call token's text, chat_template its template
 * and tool_use (unless NULL) its tool_use one (tokenizer.chat_template.tool_use, where
 * llama.cpp's converter puts a model's template of that name), extra[0..n_extra) from
 * TOOLMODEL_FIRST_EXTRA on, to path. 0 or -1. */
static inline int toolmodel_write_vocab(const char *path, const char *call_piece,
                                        const char *chat_template, const char *tool_use,
                                        const toolmodel_token *extra, int n_extra)
{
    static char names[TOOLMODEL_N_VOCAB][16];
    const char *strs[TOOLMODEL_N_VOCAB];
    float scores[TOOLMODEL_N_VOCAB];
    int32_t types[TOOLMODEL_N_VOCAB];
    for (int i = 0; i < TOOLMODEL_N_VOCAB; i++) {
        int ch = ' ' + i - TOOLMODEL_FIRST_CHAR;
        if (i >= TOOLMODEL_FIRST_CHAR && ch == ' ')
            snprintf(names[i], sizeof names[i], TOOLMODEL_SP);
        else if (i >= TOOLMODEL_FIRST_CHAR && ch <= '~')
            snprintf(names[i], sizeof names[i], "%c", ch);
        else
            snprintf(names[i], sizeof names[i], i == 0 ? "<unk>" : i == 1 ? "<s>" : i == 2 ? "</s>"
                                                                                : "tok%d", i);
        strs[i] = i == TOOLMODEL_CALL_TOKEN ? call_piece : names[i];
        scores[i] = -(float)i;
        types[i] = i == 0 ? 2 : i < 3 ? 3 : 1;
        if (i >= TOOLMODEL_FIRST_EXTRA && i < TOOLMODEL_FIRST_EXTRA + n_extra) {
            strs[i] = extra[i - TOOLMODEL_FIRST_EXTRA].text;
            types[i] = extra[i - TOOLMODEL_FIRST_EXTRA].type;
        }
    }
    char err[ERR_MAX];
    gguf_writer *w = gguf_writer_new();
    int n = TOOLMODEL_N_VOCAB;
    int rc = w && gguf_writer_set_str(w, "tokenizer.ggml.model", "llama") == 0 &&
                     gguf_writer_set_str_arr(w, "tokenizer.ggml.tokens", strs, n) == 0 &&
                     gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_FLOAT32, scores, n) == 0 &&
                     gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_INT32, types, n) == 0 &&
                     gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0) == 0 &&
                     gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1) == 0 &&
                     gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2) == 0 &&
                     gguf_writer_set_str(w, "tokenizer.chat_template", chat_template) == 0 &&
                     (!tool_use ||
                      gguf_writer_set_str(w, "tokenizer.chat_template.tool_use", tool_use) == 0) &&
                     gguf_writer_write(w, path, err) == 0
                 ? 0 : -1;
    gguf_writer_free(w);
    return rc;
}

/* Generates the model (a small llama on that vocabulary, with extra[0..n_extra) as
 * toolmodel_write_vocab puts them) named name into model_path; it stays empty when that
 * fails (the tests then skip). */
static inline void toolmodel_generate(const char *name, const char *call_piece,
                                      const char *chat_template, const char *tool_use,
                                      const toolmodel_token *extra, int n_extra,
                                      char *model_path, size_t cap)
{
    char vocab_path[1024], err[ERR_MAX];
    proc_fmt(vocab_path, sizeof vocab_path, "%s/%s-vocab.gguf", test_tmpdir(), name);
    gguf_file *vocab = toolmodel_write_vocab(vocab_path, call_piece, chat_template, tool_use,
                                             extra, n_extra) == 0
                           ? gguf_open(vocab_path, err)
                           : NULL;
    if (!vocab)
        return;
    modelgen_params mp = {
        .arch = "llama", .dim = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 128,
        .n_ctx = 2048, .type = QTYPE_F32, .seed = 9, .vocab = vocab, .n_threads = 1,
    };
    char file[256];
    snprintf(file, sizeof file, "%s.gguf", name);
    proc_generate_model(model_path, cap, file, &mp);
    gguf_close(vocab);
}

/* Starts llmsd on model_path with its HTTP socket (written to hsock) and a window of
 * 2048. 0 or -1. */
static inline int toolmodel_start(llmsd_proc *p, const char *llmsd_path, const char *name,
                                  const char *model_path, char *hsock, size_t cap)
{
    char extra[1024];
    proc_fmt(hsock, cap, "%s/%s-h.sock", test_tmpdir(), name);
    proc_fmt(extra, sizeof extra, "http_socket = %s\nn_ctx = 2048\n", hsock);
    return proc_start(p, llmsd_path, name, model_path, extra);
}

/* What toolmodel_make_chain's edits read: the model's dim and the chain. */
typedef struct toolmodel_chain {
    size_t dim;
    const int (*pairs)[2];
    int n;
} toolmodel_chain;

/* count floats of a tensor at byte at of fd: read, changed by edit, written back. */
static inline int toolmodel_rewrite(int fd, size_t at, size_t count,
                                    void (*edit)(float *, size_t, const toolmodel_chain *),
                                    const toolmodel_chain *c)
{
    float *v = malloc(count * sizeof *v);
    int rc = v && pread(fd, v, count * sizeof *v, (off_t)at) == (ssize_t)(count * sizeof *v)
                 ? 0 : -1;
    if (rc == 0) {
        edit(v, count, c);
        rc = pwrite(fd, v, count * sizeof *v, (off_t)at) == (ssize_t)(count * sizeof *v) ? 0 : -1;
    }
    free(v);
    return rc;
}

static inline void toolmodel_set_zero(float *v, size_t n, const toolmodel_chain *c)
{
    (void)c;
    memset(v, 0, n * sizeof *v);
}

static inline void toolmodel_set_one(float *v, size_t n, const toolmodel_chain *c)
{
    (void)c;
    for (size_t i = 0; i < n; i++)
        v[i] = 1;
}

/* token_embd and output are dim x n_vocab, a token's row after another */
static inline void toolmodel_chain_embeddings(float *v, size_t n, const toolmodel_chain *c)
{
    (void)n;
    for (int k = 0; k < c->n; k++)
        for (size_t d = 0; d < c->dim; d++)
            v[(size_t)c->pairs[k][0] * c->dim + d] = d == (size_t)k ? 1 : 0;
}

static inline void toolmodel_chain_output(float *v, size_t n, const toolmodel_chain *c)
{
    for (int k = 0; k < c->n; k++) {
        for (size_t row = 0; row < n / c->dim; row++)
            v[row * c->dim + (size_t)k] = 0;
        v[(size_t)c->pairs[k][1] * c->dim + (size_t)k] = 4;
    }
}

/* Makes the F32 model at path write pairs[k][1] after pairs[k][0], whatever came before
 * (n_pairs <= dim): attention and feed-forward outputs zeroed, so that a token's
 * embedding reaches the output alone, k-th pair's first token embedded as unit vector k,
 * which the output maps to its second. 0 or -1. */
static inline int toolmodel_make_chain(const char *path, const int (*pairs)[2], int n_pairs)
{
    char err[ERR_MAX], name[64];
    gguf_file *g = gguf_open(path, err);
    if (!g)
        return -1;
    struct {
        size_t at, count;
        void (*edit)(float *, size_t, const toolmodel_chain *);
    } parts[16];
    int n = 0, rc = 0;
    size_t base = gguf_data_offset(g);
    toolmodel_chain c = {0, pairs, n_pairs};
    for (int64_t i = 0; i < gguf_n_tensors(g) && n < 16; i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        void (*edit)(float *, size_t, const toolmodel_chain *) =
            strstr(name, "attn_output") || strstr(name, "ffn_down") ? toolmodel_set_zero
            : !strcmp(name, "output_norm.weight")                   ? toolmodel_set_one
            : !strcmp(name, "token_embd.weight")                    ? toolmodel_chain_embeddings
            : !strcmp(name, "output.weight")                        ? toolmodel_chain_output
                                                                    : NULL;
        if (!edit)
            continue;
        rc |= t->type != QTYPE_F32 ? -1 : 0;
        if (edit == toolmodel_chain_output)
            c.dim = (size_t)t->ne[0];
        parts[n].at = base + t->offset;
        parts[n].count = t->bytes / sizeof(float);
        parts[n++].edit = edit;
    }
    gguf_close(g);
    int fd = open(path, O_RDWR);
    rc |= fd < 0 || c.dim == 0 ? -1 : 0;
    for (int i = 0; rc == 0 && i < n; i++)
        rc = toolmodel_rewrite(fd, parts[i].at, parts[i].count, parts[i].edit, &c);
    if (fd >= 0)
        close(fd);
    return rc;
}

#endif
