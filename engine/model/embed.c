/*
 * embed.c — pooled, normalised last-layer states of a text.
 *
 * The forward keeps every layer's rows of its out rows (model_batch.hidden), so mean
 * pooling evaluates the text in pieces of EMBED_PIECE tokens to bound that buffer;
 * last- and first-token pooling ask for one row and evaluate the text in one forward.
 */
#include "engine/model/embed.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define EMBED_PIECE 64

struct embedder {
    const model *m;
    model_runner *r;
    kv_pool *pool;
    int dim, n_layer, max_kv;
    int32_t *positions;  /* (max_kv) 0, 1, 2, ... */
    int32_t rows[EMBED_PIECE];
    float *hidden;       /* (n_layer + 1, EMBED_PIECE, dim) */
    float *row;          /* (dim) */
    double *acc;         /* (dim) */
    int32_t *tokens;     /* (tok_cap) a text's ids */
    int tok_cap;
};

embedder *embed_new(const model *m, model_runner *r, kv_pool *pool, char err[ERR_MAX])
{
    embedder *e = calloc(1, sizeof *e);
    if (!e) {
        err_set(err, "out of memory");
        return NULL;
    }
    const model_hparams *hp = model_hparams_of(m);
    e->m = m;
    e->r = r;
    e->pool = pool;
    e->dim = hp->dim;
    e->n_layer = hp->n_layer;
    e->max_kv = model_runner_max_kv(r);
    e->positions = malloc(sizeof *e->positions * (size_t)e->max_kv);
    e->hidden = malloc(sizeof *e->hidden * (size_t)(e->n_layer + 1) * EMBED_PIECE * e->dim);
    e->row = malloc(sizeof *e->row * (size_t)e->dim);
    e->acc = malloc(sizeof *e->acc * (size_t)e->dim);
    if (!e->positions || !e->hidden || !e->row || !e->acc) {
        embed_free(e);
        err_set(err, "out of memory");
        return NULL;
    }
    for (int i = 0; i < e->max_kv; i++)
        e->positions[i] = i;
    for (int i = 0; i < EMBED_PIECE; i++)
        e->rows[i] = i;
    return e;
}

void embed_free(embedder *e)
{
    if (!e)
        return;
    free(e->positions);
    free(e->hidden);
    free(e->row);
    free(e->acc);
    free(e->tokens);
    free(e);
}

int embed_dim(const embedder *e)
{
    return e->dim;
}

/* Adds the final-norm'd last-layer rows of a forward with n_out rows to acc. */
static void embed_accumulate(embedder *e, int n_out)
{
    const float *last = e->hidden + (size_t)e->n_layer * n_out * e->dim;
    for (int o = 0; o < n_out; o++) {
        model_output_norm(e->m, last + (size_t)o * e->dim, e->row);
        for (int i = 0; i < e->dim; i++)
            e->acc[i] += e->row[i];
    }
}

int embed_pooling_of_model(const model *m, enum embed_pooling *out, char err[ERR_MAX])
{
    switch (model_hparams_of(m)->pooling_type) {
    case -1:
        return 0;
    case 1:
        *out = EMBED_MEAN;
        return 1;
    case 2:
        *out = EMBED_CLS;
        return 1;
    case 3:
        *out = EMBED_LAST;
        return 1;
    case 0:
        return err_set(err, "the file's pooling_type is none (a vector per token): name a "
                            "pooling (last, mean or cls)");
    default:
        return err_set(err, "the file's pooling_type is rank (a reranker's scores, not an "
                            "embedding): rerank with it, or name a pooling");
    }
}

int embed_tokens(embedder *e, const int32_t *tokens, int n, enum embed_pooling pooling,
                 float *out, char err[ERR_MAX])
{
    if (n <= 0)
        return err_set(err, "embed: no tokens");
    if (n > e->max_kv)
        return err_set(err, "embed: %d tokens, more than the %d the runner holds", n, e->max_kv);
    if (pooling != EMBED_LAST && pooling != EMBED_MEAN && pooling != EMBED_CLS)
        return err_set(err, "embed: unknown pooling %d", (int)pooling);
    memset(e->acc, 0, sizeof *e->acc * (size_t)e->dim);
    kv_seq seq;
    kv_seq_init(&seq, e->pool);
    int piece = pooling == EMBED_MEAN ? EMBED_PIECE : n;
    for (int t0 = 0; t0 < n; t0 += piece) {
        int len = n - t0 < piece ? n - t0 : piece;
        bool final = t0 + len == n;
        model_batch b = {.n_tokens = len, .tokens = tokens + t0, .positions = e->positions + t0,
                         .hidden = e->hidden};
        int32_t last_row = len - 1;
        if (pooling == EMBED_MEAN) {
            b.n_out = len;
            b.out_rows = e->rows;
        } else if (pooling == EMBED_CLS) {
            b.n_out = 1;
            b.out_rows = e->rows; /* row 0 */
        } else if (final) {
            b.n_out = 1;
            b.out_rows = &last_row;
        }
        if (model_forward(e->r, &seq, &b, err) < 0) {
            kv_seq_free(&seq);
            return -1;
        }
        if (b.n_out > 0)
            embed_accumulate(e, b.n_out);
    }
    kv_seq_free(&seq);
    double ss = 0;
    for (int i = 0; i < e->dim; i++)
        ss += e->acc[i] * e->acc[i];
    double inv = ss > 0 ? 1.0 / sqrt(ss) : 0.0;
    for (int i = 0; i < e->dim; i++)
        out[i] = (float)(e->acc[i] * inv);
    return 0;
}

int embed_text(embedder *e, const tokenizer *tok, const char *text, enum embed_pooling pooling,
               float *out, int *n_tokens, char err[ERR_MAX])
{
    size_t len = strlen(text);
    int n = tok_encode(tok, text, len, true, false, e->tokens, e->tok_cap);
    if (n > e->tok_cap) {
        int32_t *t = realloc(e->tokens, sizeof *t * (size_t)n);
        if (!t)
            return err_set(err, "out of memory");
        e->tokens = t;
        e->tok_cap = n;
        n = tok_encode(tok, text, len, true, false, e->tokens, e->tok_cap);
    }
    if (n < 0)
        return err_set(err, "embed: tokenization failed");
    if (n_tokens)
        *n_tokens = n;
    return embed_tokens(e, e->tokens, n, pooling, out, err);
}
