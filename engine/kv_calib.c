/*
 * kv_calib.c — factors for kv_assign_layer_precisions' error model, measured on a model.
 */
#include "engine/kv_calib.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

/* Evaluates the tokens in one batch on a copy of prefix whose chunks' layers get
 * layers[] (n_layer entries; NULL: as they are), every row's logits into out (n_forced,
 * n_vocab); with ref, *kl gets their mean KL against it. */
static int kv_calib_run(model_runner *r, const kv_seq *prefix, const uint8_t *layers,
                        const int32_t *tokens, const int32_t *positions, const int32_t *rows,
                        int n_forced, int n_vocab, float *out, const float *ref, double *kl,
                        char err[ERR_MAX])
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
    double sum = 0;
    for (int t = 0; rc == 0 && ref && t < n_forced; t++)
        sum += kv_calib_logits_kl(ref + (size_t)t * n_vocab, out + (size_t)t * n_vocab,
                                   n_vocab);
    if (kl)
        *kl = sum / n_forced;
    kv_seq_free(&work);
    return rc;
}

static double kv_calib_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int kv_calib_measure(const model *m, model_runner *r, const kv_seq *prefix,
                     const kv_chunk_stats *section_stats, const int32_t *tokens,
                     const int32_t *positions, int n_forced, double max_seconds,
                     float *factors, char err[ERR_MAX])
{
    kv_shape shape = kv_pool_shape(prefix->pool);
    int n_layer = shape.n_layer, n_chunks = prefix->n_chunks;
    int n_vocab = model_hparams_of(m)->n_vocab;
    if (n_forced < 1 || n_chunks < 1)
        return err_set(err, "kv calibration: needs a prefix and a token after it");
    float *ref = malloc((size_t)n_forced * n_vocab * sizeof *ref);
    float *logits = malloc((size_t)n_forced * n_vocab * sizeof *logits);
    int32_t *rows = malloc((size_t)n_forced * sizeof *rows);
    int rc = ref && logits && rows ? 0 : err_set(err, "kv calibration: out of memory");
    for (int t = 0; rc == 0 && t < n_forced; t++)
        rows[t] = t;
    double t0 = kv_calib_now();
    if (rc == 0)
        rc = kv_calib_run(r, prefix, NULL, tokens, positions, rows, n_forced, n_vocab, ref,
                          NULL, NULL, err);
    if (rc == 0 && max_seconds > 0 &&
        (kv_calib_now() - t0) * (KV_CALIB_PARTS * n_layer + 1) > max_seconds)
        rc = 1;
    double mean = 0, sum = 0;
    for (int c = 0; c < n_chunks; c++)
        mean += section_stats[(size_t)c * n_layer].density / n_chunks;
    static const int k_bits[KV_CALIB_PARTS] = {4, 8, 8}, v_bits[KV_CALIB_PARTS] = {8, 4, 4};
    double int4_error = 1.0 / (15.0 * 15.0);
    for (int l = 0; rc == 0 && l < n_layer; l++)
        for (int q = 0; rc == 0 && q < KV_CALIB_PARTS; q++) {
            double predicted = 0, kl;
            for (int c = 0; c < n_chunks; c++) {
                const kv_chunk_stats *st = &section_stats[(size_t)c * n_layer + l];
                double spread = q == KV_CALIB_K    ? KV_K_ERROR_WEIGHT * st->k_spread
                                : q == KV_CALIB_V ? st->v_spread
                                                   : st->vb_spread;
                predicted += (st->density + mean / 2) * spread * int4_error;
            }
            uint8_t layers[KV_MAX_LAYERS];
            memset(layers, KV_F16, (size_t)n_layer);
            layers[l] = (uint8_t)kv_precision_layout_of(k_bits[q], v_bits[q],
                                                        q == KV_CALIB_VBLOCK);
            rc = kv_calib_run(r, prefix, layers, tokens, positions, rows, n_forced, n_vocab,
                              logits, ref, &kl, err);
            float *f = &factors[l * KV_CALIB_PARTS + q];
            *f = predicted > 0 ? (float)(kl / predicted) : 1;
            sum += *f;
        }
    for (int i = 0; rc == 0 && i < n_layer * KV_CALIB_PARTS; i++)
        factors[i] = sum > 0 ? (float)(factors[i] * n_layer * KV_CALIB_PARTS / sum) : 1;
    free(ref);
    free(logits);
    free(rows);
    return rc;
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
