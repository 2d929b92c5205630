/* libFuzzer target for the decoder's loader: any bytes that open as GGUF either load as a
 * model of one of its architectures or are refused with a message, and a small model that
 * loads runs a forward of two tokens, all without touching memory outside what the file
 * and the runner hold. The seeds are modelgen's files of each architecture. */
#include <stdlib.h>

#include "engine/gguf/gguf.h"
#include "engine/kv/kv.h"
#include "engine/model/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Two tokens, the first and the last of the vocabulary, through a runner of m: an engine
 * error must say why. */
static void forward_two(const model *m)
{
    char err[ERR_MAX] = "";
    const model_hparams *hp = model_hparams_of(m);
    model_runner *r = model_runner_new(m, 1, 4, 64, err);
    kv_pool *pool = r ? kv_pool_new(model_kv_shape(m), 0, err) : NULL;
    float *logits = malloc(sizeof(float) * (size_t)hp->n_vocab);
    if (pool && logits) {
        kv_seq s;
        kv_seq_init(&s, pool);
        int32_t tok[2] = {0, hp->n_vocab - 1}, pos[2] = {0, 1}, rows[1] = {1};
        model_batch b = {.n_tokens = 2, .tokens = tok, .positions = pos, .n_out = 1,
                         .out_rows = rows, .logits = logits};
        err[0] = '\0';
        if (model_forward(r, &s, &b, err) < 0 && !err[0])
            abort();
        kv_seq_free(&s);
    }
    free(logits);
    kv_pool_free(pool);
    model_runner_free(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[ERR_MAX] = "";
    gguf_file *g = gguf_open_memory(data, size, err);
    if (!g) {
        if (!err[0])
            abort();
        return 0;
    }
    model *m = model_from_gguf(g, err);
    if (!m && !err[0])
        abort();
    const model_hparams *hp = m ? model_hparams_of(m) : NULL;
    /* a forward's cost grows with the shapes: small models only, so that inputs run fast */
    if (hp && (int64_t)hp->dim * hp->n_layer <= 4096 && hp->n_vocab <= 4096 &&
        hp->n_ff <= 4096 && (int64_t)hp->n_head * hp->head_dim <= 1024)
        forward_two(m);
    model_free(m);
    gguf_close(g);
    return 0;
}
