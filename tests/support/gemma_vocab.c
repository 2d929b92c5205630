/*
 * gemma_vocab.c — a vocabulary with Gemma's tokenizer conventions (gemma_vocab.h).
 */
#include "tests/support/gemma_vocab.h"

#include <stdlib.h>
#include <string.h>

#include "engine/gguf/gguf.h"

const char GEMMA_VOCAB_TEMPLATE[] =
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role "
    "not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == "
    "'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must "
    "alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == "
    "'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% "
    "endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + "
    "'<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}"
    "{% endif %}";

int gemma_vocab_write(const char *src, const char *dst, char err[ERR_MAX])
{
    gguf_file *g = gguf_open(src, err);
    if (!g)
        return -1;
    static const char *const added[] = {"<start_of_turn>", "<end_of_turn>"};
    enum { N_ADDED = 2, TYPE_CONTROL = 3 };
    enum gguf_value_type et;
    uint64_t n = 0;
    int rc = -1;
    char **toks = NULL;
    float *scores = NULL;
    int32_t *types = NULL;
    gguf_writer *w = gguf_writer_new();
    if (!gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n) || n == 0 || n > 1 << 20) {
        err_set(err, "%s: no tokenizer.ggml.tokens", src);
        goto out;
    }
    toks = calloc(n + N_ADDED, sizeof *toks);
    scores = calloc(n + N_ADDED, sizeof *scores);
    types = calloc(n + N_ADDED, sizeof *types);
    if (!w || !toks || !scores || !types) {
        err_set(err, "out of memory");
        goto out;
    }
    for (uint64_t i = 0; i < n; i++) {
        gguf_str s;
        if (!gguf_arr_str(g, "tokenizer.ggml.tokens", i, &s) || !(toks[i] = strndup(s.ptr, s.len))) {
            err_set(err, "%s: token %llu unreadable", src, (unsigned long long)i);
            goto out;
        }
    }
    if (!gguf_arr_f32(g, "tokenizer.ggml.scores", scores, n) ||
        !gguf_arr_i32(g, "tokenizer.ggml.token_type", types, n)) {
        err_set(err, "%s: no scores or token types", src);
        goto out;
    }
    for (int i = 0; i < N_ADDED; i++) {
        toks[n + i] = strdup(added[i]);
        types[n + i] = TYPE_CONTROL;
        if (!toks[n + i]) {
            err_set(err, "out of memory");
            goto out;
        }
    }
    for (int64_t i = 0; i < gguf_n_kv(g); i++) {
        gguf_str k = gguf_key(g, i);
        if (gguf_str_eq(k, "tokenizer.ggml.tokens") || gguf_str_eq(k, "tokenizer.ggml.scores") ||
            gguf_str_eq(k, "tokenizer.ggml.token_type"))
            continue;
        if (gguf_writer_copy_kv(w, g, i) < 0) {
            err_set(err, "cannot copy metadata");
            goto out;
        }
    }
    if (gguf_writer_set_str_arr(w, "tokenizer.ggml.tokens", (const char *const *)toks, n + N_ADDED) < 0 ||
        gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_FLOAT32, scores, n + N_ADDED) < 0 ||
        gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_INT32, types, n + N_ADDED) < 0 ||
        gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", false) < 0 ||
        gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true) < 0 ||
        gguf_writer_set_str(w, "tokenizer.chat_template", GEMMA_VOCAB_TEMPLATE) < 0) {
        err_set(err, "cannot set metadata");
        goto out;
    }
    rc = gguf_writer_write(w, dst, err);
out:
    for (uint64_t i = 0; toks && i < n + N_ADDED; i++)
        free(toks[i]);
    free(toks), free(scores), free(types);
    gguf_writer_free(w);
    gguf_close(g);
    return rc;
}
