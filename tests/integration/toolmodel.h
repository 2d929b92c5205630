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

#include <stdio.h>

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

#endif
