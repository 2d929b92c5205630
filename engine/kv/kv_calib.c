/*
 * kv_calib.c — factors for kv_assign_layer_precisions' error model, measured on a model.
 */
#include "engine/kv/kv_calib.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "engine/clock.h"

/* log of the sum of exp(x[i]) over n values, computed from the largest. */
static double kv_calib_log_sum_exp(const float *x, int n)
{
    double top = x[0], sum = 0;
    for (int i = 1; i < n; i++)
        top = x[i] > top ? x[i] : top;
    for (int i = 0; i < n; i++)
        sum += exp(x[i] - top);
    return top + log(sum);
}

double kv_calib_logits_kl(const float *ref, const float *got, int n)
{
    double zr = kv_calib_log_sum_exp(ref, n), zg = kv_calib_log_sum_exp(got, n), kl = 0;
    for (int i = 0; i < n; i++) {
        double lr = ref[i] - zr;
        kl += exp(lr) * (lr - (got[i] - zg));
    }
    return kl > 0 ? kl : 0;
}

/* A mean KL over the forced rows and its standard error. */
typedef struct kv_calib_kl {
    double mean, se;
} kv_calib_kl;

/* Evaluates the tokens in one batch on a copy of prefix whose chunks' layers get
 * layers[] (n_layer entries; NULL: as they are), every row's logits into out (n_forced,
 * n_vocab); with ref, *kl gets their KL against it. */
static int kv_calib_run(model_runner *r, const kv_seq *prefix, const uint8_t *layers,
                        const int32_t *tokens, const int32_t *positions, const int32_t *rows,
                        int n_forced, int n_vocab, float *out, const float *ref,
                        kv_calib_kl *kl, char err[ERR_MAX])
{
    kv_seq work;
    kv_seq_init(&work, prefix->pool);
    int rc = kv_seq_copy(&work, prefix, err);
    for (int i = 0; rc == 0 && layers && i < work.n_chunks; i++)
        rc = kv_chunk_convert_layers(work.pool, work.chunks[i], layers, err);
    model_batch b = {.n_tokens = n_forced, .tokens = tokens, .positions = positions,
                     .n_out = n_forced, .out_rows = rows, .logits = out};
    if (rc == 0)
        rc = model_forward(r, &work, &b, err);
    double sum = 0, sum2 = 0;
    for (int t = 0; rc == 0 && ref && t < n_forced; t++) {
        double d = kv_calib_logits_kl(ref + (size_t)t * n_vocab, out + (size_t)t * n_vocab,
                                      n_vocab);
        sum += d;
        sum2 += d * d;
    }
    if (kl) {
        double mean = sum / n_forced, var = sum2 / n_forced - mean * mean;
        *kl = (kv_calib_kl){mean, n_forced > 1 && var > 0 ? sqrt(var / (n_forced - 1)) : 0};
    }
    kv_seq_free(&work);
    return rc;
}

struct kv_calib {
    kv_seq prefix;            /* its own copies of the prefix's chunks */
    kv_chunk_stats *stats;    /* (n_chunks, n_layer) the prefix's section statistics */
    int32_t *tokens;          /* (n_forced) */
    int32_t *positions;       /* (n_forced) */
    int32_t *rows;            /* (n_forced) 0, 1, ...: every row's logits */
    int n_forced, n_vocab, n_layer;
    float *ref;               /* (n_forced, n_vocab) logits with f16 KV */
    float *logits;            /* (n_forced, n_vocab) */
    float *factors;           /* (n_layer, KV_CALIB_PARTS) */
    double factor_sum;
    kv_calib_kl base;         /* the current layer's with both parts at 8 bits */
    int done;                 /* forwards run: the reference, then for each layer its
                               * base and its parts in order */
};

void kv_calib_free(kv_calib *c)
{
    if (!c)
        return;
    kv_seq_free(&c->prefix);
    free(c->stats);
    free(c->tokens);
    free(c->positions);
    free(c->rows);
    free(c->ref);
    free(c->logits);
    free(c->factors);
    free(c);
}

kv_calib *kv_calib_new(const model *m, const kv_seq *prefix,
                       const kv_chunk_stats *section_stats, const int32_t *tokens,
                       const int32_t *positions, int n_forced, char err[ERR_MAX])
{
    kv_shape shape = kv_pool_shape(prefix->pool);
    int n_chunks = prefix->n_chunks, n_vocab = model_hparams_of(m)->n_vocab;
    if (n_forced < 1 || n_chunks < 1) {
        err_set(err, "kv calibration: needs a prefix and a token after it");
        return NULL;
    }
    kv_calib *c = calloc(1, sizeof *c);
    if (!c) {
        err_set(err, "kv calibration: out of memory");
        return NULL;
    }
    kv_seq_init(&c->prefix, prefix->pool);
    size_t n_stats = (size_t)n_chunks * shape.n_layer, n_logits = (size_t)n_forced * n_vocab;
    c->n_forced = n_forced;
    c->n_vocab = n_vocab;
    c->n_layer = shape.n_layer;
    c->stats = malloc(n_stats * sizeof *c->stats);
    c->tokens = malloc((size_t)n_forced * sizeof *c->tokens);
    c->positions = malloc((size_t)n_forced * sizeof *c->positions);
    c->rows = malloc((size_t)n_forced * sizeof *c->rows);
    c->ref = malloc(n_logits * sizeof *c->ref);
    c->logits = malloc(n_logits * sizeof *c->logits);
    c->factors = malloc((size_t)shape.n_layer * KV_CALIB_PARTS * sizeof *c->factors);
    if (!c->stats || !c->tokens || !c->positions || !c->rows || !c->ref || !c->logits ||
        !c->factors) {
        err_set(err, "kv calibration: out of memory");
        kv_calib_free(c);
        return NULL;
    }
    if (kv_seq_copy(&c->prefix, prefix, err)) {
        kv_calib_free(c);
        return NULL;
    }
    memcpy(c->stats, section_stats, n_stats * sizeof *c->stats);
    memcpy(c->tokens, tokens, (size_t)n_forced * sizeof *c->tokens);
    memcpy(c->positions, positions, (size_t)n_forced * sizeof *c->positions);
    for (int t = 0; t < n_forced; t++)
        c->rows[t] = t;
    return c;
}

int kv_calib_forwards_total(const kv_calib *c)
{
    return (KV_CALIB_PARTS + 1) * c->n_layer + 1;
}

int kv_calib_forwards_done(const kv_calib *c)
{
    return c->done;
}

size_t kv_calib_step_bytes(const kv_calib *c)
{
    kv_shape shape = kv_pool_shape(c->prefix.pool);
    int chunks = c->prefix.n_chunks + (c->n_forced + KV_CHUNK_TOKENS - 1) / KV_CHUNK_TOKENS + 1;
    return (size_t)chunks * kv_chunk_data_bytes(shape, KV_F16);
}

const float *kv_calib_factors(const kv_calib *c)
{
    return c->done == kv_calib_forwards_total(c) ? c->factors : NULL;
}

/* The error the assignment predicts for part q of layer l at 4 bits over the prefix. */
static double kv_calib_predicted(const kv_calib *c, int l, int q)
{
    int n_chunks = c->prefix.n_chunks, n_layer = c->n_layer;
    double mean = 0, predicted = 0, int4_error = 1.0 / (15.0 * 15.0);
    for (int i = 0; i < n_chunks; i++)
        mean += c->stats[(size_t)i * n_layer].density / n_chunks;
    for (int i = 0; i < n_chunks; i++) {
        const kv_chunk_stats *st = &c->stats[(size_t)i * n_layer + l];
        double spread = q == KV_CALIB_K    ? KV_K_ERROR_WEIGHT * st->k_spread
                        : q == KV_CALIB_V ? st->v_spread
                                           : st->vb_spread;
        predicted += (st->density + mean / 2) * spread * int4_error;
    }
    return predicted;
}

int kv_calib_step(kv_calib *c, model_runner *r, char err[ERR_MAX])
{
    int total = kv_calib_forwards_total(c);
    if (c->done == total)
        return KV_CALIB_DONE;
    if (c->done == 0) {
        int rc = kv_calib_run(r, &c->prefix, NULL, c->tokens, c->positions, c->rows,
                              c->n_forced, c->n_vocab, c->ref, NULL, NULL, err);
        if (rc)
            return rc;
        c->done = 1;
        return 0;
    }
    /* part q = -1 is the layer's base: both parts at 8 bits */
    static const int k_bits[KV_CALIB_PARTS + 1] = {8, 4, 8, 8},
                     v_bits[KV_CALIB_PARTS + 1] = {8, 8, 4, 4};
    int l = (c->done - 1) / (KV_CALIB_PARTS + 1), q = (c->done - 1) % (KV_CALIB_PARTS + 1) - 1;
    uint8_t layers[KV_MAX_LAYERS];
    memset(layers, KV_F16, (size_t)c->n_layer);
    layers[l] = (uint8_t)kv_precision_layout_of(k_bits[q + 1], v_bits[q + 1],
                                                q == KV_CALIB_VBLOCK);
    kv_calib_kl kl;
    int rc = kv_calib_run(r, &c->prefix, layers, c->tokens, c->positions, c->rows,
                          c->n_forced, c->n_vocab, c->logits, c->ref, &kl, err);
    if (rc)
        return rc;
    if (q < 0) {
        c->base = kl;
        c->done++;
        return 0;
    }
    /* What the part's 4 bits add to the base (kv_calib.h: on a model whose products
     * round their activations, any change of the KV costs about the base), and no less
     * than the standard error of that difference: a part the measurement cannot tell
     * from no loss still keeps a weight it cannot rule out. */
    double predicted = kv_calib_predicted(c, l, q);
    double excess = kl.mean - c->base.mean, resolution = hypot(kl.se, c->base.se);
    float *f = &c->factors[l * KV_CALIB_PARTS + q];
    *f = predicted > 0 ? (float)((excess > resolution ? excess : resolution) / predicted) : 1;
    c->factor_sum += *f;
    if (++c->done < total)
        return 0;
    int n = c->n_layer * KV_CALIB_PARTS;
    for (int i = 0; i < n; i++)
        c->factors[i] = c->factor_sum > 0 ? (float)(c->factors[i] * n / c->factor_sum) : 1;
    return KV_CALIB_DONE;
}

int kv_calib_measure(const model *m, model_runner *r, const kv_seq *prefix,
                     const kv_chunk_stats *section_stats, const int32_t *tokens,
                     const int32_t *positions, int n_forced, double max_seconds,
                     float *factors, char err[ERR_MAX])
{
    kv_calib *c = kv_calib_new(m, prefix, section_stats, tokens, positions, n_forced, err);
    if (!c)
        return -1;
    double t0 = clock_mono_s();
    int rc = kv_calib_step(c, r, err);
    bool too_slow = rc == 0 && max_seconds > 0 &&
                    (clock_mono_s() - t0) * kv_calib_forwards_total(c) > max_seconds;
    while (rc == 0 && !too_slow)
        rc = kv_calib_step(c, r, err);
    if (rc == KV_CALIB_DONE)
        memcpy(factors, kv_calib_factors(c), sizeof *factors * (size_t)c->n_layer * KV_CALIB_PARTS);
    else if (rc == MODEL_ABORTED)
        err_set(err, "kv calibration: the forward was aborted");
    kv_calib_free(c);
    return too_slow ? 1 : rc == KV_CALIB_DONE ? 0 : -1;
}

void kv_calib_apply(kv_shape shape, const float *factors, int n_chunks,
                    const kv_chunk_stats *in, kv_chunk_stats *out)
{
    for (int c = 0; c < n_chunks; c++)
        for (int l = 0; l < shape.n_layer; l++) {
            const kv_chunk_stats *x = &in[(size_t)c * shape.n_layer + l];
            const float *f = &factors[l * KV_CALIB_PARTS];
            out[(size_t)c * shape.n_layer + l] =
                (kv_chunk_stats){x->density, x->k_spread * f[KV_CALIB_K],
                                 x->v_spread * f[KV_CALIB_V], x->vb_spread * f[KV_CALIB_VBLOCK]};
        }
}
