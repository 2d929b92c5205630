/*
 * ctxcalib.c — calibrating the model's layers for per-(chunk, layer) compression.
 *
 * kv_assign_layer_precisions needs to know how much the output follows each layer's K
 * and V (kv_calib.h): the factors are measured once per model shape, on the first
 * context whose first CTX_CALIB_PREFIX_CHUNKS chunks are resident and still f16 at the
 * end of a call with CTX_CALIB_FORCED tokens after them (its own history teacher-forced
 * on copies of those chunks: 3 n_layer + 1 forwards of CTX_CALIB_FORCED tokens), and
 * kept in the store's settings, so that every later start uses them. Until then (and
 * for models whose calibration would stall the worker too long) the context manager
 * compresses per chunk, which needs no calibration.
 */
#include <stdio.h>
#include <stdlib.h>

#include "daemon/ctxmem.h"

/* The prefix a calibration compresses and the tokens it scores after it (bench/kvquant
 * calibrates on 448 and 64; these keep the cost of the first long call small). */
#define CTX_CALIB_PREFIX_CHUNKS 8
#define CTX_CALIB_FORCED 32

/* The worker runs a calibration between two steps, so every app waits for it: one that
 * would take longer is given up after its first forward (measured on TinyLlama-1.1B
 * Q8_0, 22 layers, 2 threads: 54 s), and that model stays compressed per chunk. */
#define CTX_CALIB_MAX_SECONDS 2.0

static void calib_key(const ctxmgr *cm, char *key, size_t cap)
{
    const model_hparams *hp = model_hparams_of(cm->m);
    snprintf(key, cap, "kv_calib1/%d/l%d/d%d/h%d/kv%dx%d/ff%d/v%d", (int)hp->arch,
             hp->n_layer, hp->dim, hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_ff,
             hp->n_vocab);
}

int ctx_calib_load(ctxmgr *cm, char err[ERR_MAX])
{
    char key[160];
    int want = cm->shape.n_layer * KV_CALIB_PARTS, n;
    bool found;
    double *v = malloc(sizeof *v * (size_t)want);
    if (!v)
        return err_set(err, "out of memory");
    calib_key(cm, key, sizeof key);
    int rc = store_setting_get(cm->st, key, v, want, &n, &found, err);
    if (rc == 0 && found && n == want) {
        float *f = malloc(sizeof *f * (size_t)want);
        for (int i = 0; f && i < want; i++)
            f[i] = v[i] > 0 ? (float)v[i] : 0;
        free(cm->layer_factors);
        cm->layer_factors = f;
    }
    free(v);
    return rc;
}

void ctx_calib_maybe(ctxmgr *cm, ctx_entry *c)
{
    char err[ERR_MAX], key[160];
    int n_layer = cm->shape.n_layer, p = CTX_CALIB_PREFIX_CHUNKS;
    int at = p * KV_CHUNK_TOKENS, want = n_layer * KV_CALIB_PARTS;
    if (cm->layer_factors || cm->calib_given_up || c->n_tokens < at + CTX_CALIB_FORCED ||
        kv_seq_n_tokens(&c->seq) < at + CTX_CALIB_FORCED)
        return;
    for (int i = 0; i < p; i++)
        if (!c->seq.chunks[i] || c->seq.chunks[i]->precision != KV_F16)
            return;
    /* the copies kv_calib_measure makes: the prefix and the scored tokens' chunks */
    size_t copies = (size_t)(p + CTX_CALIB_FORCED / KV_CHUNK_TOKENS + 1) *
                    kv_chunk_data_bytes(cm->shape, KV_F16);
    kv_chunk_stats *sec = malloc(sizeof *sec * (size_t)p * n_layer);
    float *f = malloc(sizeof *f * (size_t)want);
    double *v = malloc(sizeof *v * (size_t)want);
    int32_t pos[CTX_CALIB_FORCED];
    if (!sec || !f || !v || ctx_claim(cm, copies, err))
        goto out;
    for (int i = 0; i < p; i++) {
        ctx_chunk_spreads(cm, c, i);
        float density = ctx_chunk_density(c, i);
        for (int l = 0; l < n_layer; l++) {
            sec[i * n_layer + l] = c->layer_stats[(size_t)i * n_layer + l];
            sec[i * n_layer + l].density = density;
        }
    }
    for (int t = 0; t < CTX_CALIB_FORCED; t++)
        pos[t] = at + t;
    /* a view of the context's first chunks: borrowed, never freed through it */
    kv_seq prefix = {.pool = cm->pool, .chunks = c->seq.chunks, .n_chunks = p, .cap = p};
    int rc = kv_calib_measure(cm->m, cm->runner, &prefix, sec, c->tokens + at, pos,
                              CTX_CALIB_FORCED, CTX_CALIB_MAX_SECONDS, f, err);
    cm->calib_given_up = rc == 1;
    if (rc)
        goto out;
    for (int i = 0; i < want; i++)
        v[i] = f[i];
    calib_key(cm, key, sizeof key);
    if (store_setting_put(cm->st, key, v, want, err))
        goto out;
    cm->layer_factors = f;
    f = NULL;
    cm->stats.calibrations++;
out:
    free(sec);
    free(f);
    free(v);
}
