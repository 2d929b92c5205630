/*
 * ctxcalib.c — calibrating the model's layers for per-(chunk, layer) compression.
 *
 * kv_assign_layer_precisions needs to know how much the output follows each layer's K
 * and V (kv_calib.h): the factors are measured once per model shape, on the first
 * context whose first CTX_CALIB_PREFIX_CHUNKS chunks are resident and still f16 at the
 * end of a call with CTX_CALIB_FORCED tokens after them (its own history teacher-forced
 * on copies of those chunks: 4 n_layer + 1 forwards of CTX_CALIB_FORCED tokens), and
 * kept in the store's settings, so that every later start uses them. Until then the
 * context manager compresses per chunk, which needs no calibration.
 *
 * A small model's calibration runs whole at the end of that call. A larger one's would
 * hold every app up (the TinyLlama-1.1B shape, Q8_0, 2 threads: about 8 s for 3 n_layer
 * + 1 forwards, before each layer got its 8-bit base forward too), so when its
 * first forward says the whole would take longer than policy.calib_inline_ms, the rest
 * waits for idle periods: the scheduler runs one forward at a time while no request is
 * queued or running (ctx_calib_idle_step), and a request that comes stops it within a
 * layer.
 */
#include <stdio.h>
#include <stdlib.h>

#include "daemon/ctx/ctxmem.h"
#include "daemon/reqlog.h"
#include "engine/clock.h"

/* The prefix a calibration compresses and the tokens it scores after it (bench/kvquant
 * calibrates on 448 and 64; these keep the cost of the first long call small). */
#define CTX_CALIB_PREFIX_CHUNKS 8
#define CTX_CALIB_FORCED 32

/* "kv_calib2": factors net of each layer's 8-bit base (kv_calib.h); those stored under
 * "kv_calib1" were not, and a model whose products round activations was calibrated
 * nearly flat, so it is calibrated again. */
static void calib_key(const ctxmgr *cm, char *key, size_t cap)
{
    const model_hparams *hp = model_hparams_of(cm->m);
    snprintf(key, cap, "kv_calib2/%d/l%d/d%d/h%d/kv%dx%d/ff%d/v%d", (int)hp->arch,
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

void ctx_calib_drop(ctxmgr *cm)
{
    kv_calib_free(cm->calib);
    cm->calib = NULL;
}

/* Stores the finished calibration's factors and makes them the manager's. */
static void calib_finish(ctxmgr *cm)
{
    char err[ERR_MAX], key[160];
    int want = cm->shape.n_layer * KV_CALIB_PARTS;
    float *f = malloc(sizeof *f * (size_t)want);
    double *v = malloc(sizeof *v * (size_t)want);
    const float *got = kv_calib_factors(cm->calib);
    if (f && v && got) {
        for (int i = 0; i < want; i++)
            v[i] = f[i] = got[i];
        calib_key(cm, key, sizeof key);
        if (store_setting_put(cm->st, key, v, want, err) == 0) {
            cm->layer_factors = f;
            f = NULL;
            cm->stats.calibrations++;
            if (reqlog_enabled(REQLOG_INFO))
                fprintf(stderr, "llmsd: info: kv calibration done: chunks get a precision "
                        "per layer from now on\n");
        } else {
            if (reqlog_enabled(REQLOG_WARN))
                fprintf(stderr, "llmsd: warn: kv calibration not stored: %s\n", err);
        }
    }
    free(f);
    free(v);
    ctx_calib_drop(cm);
}

/* A calibration that failed (not one a request aborted) is not tried again. */
static void calib_fail(ctxmgr *cm, const char *err)
{
    if (reqlog_enabled(REQLOG_WARN))
        fprintf(stderr, "llmsd: warn: kv calibration failed, compression stays per chunk: "
                "%s\n", err);
    ctx_calib_drop(cm);
    cm->calib_given_up = true;
}

void ctx_calib_maybe(ctxmgr *cm, ctx_entry *c)
{
    char err[ERR_MAX];
    int n_layer = cm->shape.n_layer, p = CTX_CALIB_PREFIX_CHUNKS;
    int at = p * KV_CHUNK_TOKENS;
    if (cm->layer_factors || cm->calib || cm->calib_given_up ||
        c->n_tokens < at + CTX_CALIB_FORCED || kv_seq_n_tokens(&c->seq) < at + CTX_CALIB_FORCED)
        return;
    for (int i = 0; i < p; i++)
        if (!c->seq.chunks[i] || c->seq.chunks[i]->precision != KV_F16)
            return;
    /* the calibration's own copy of the prefix, then a forward's copy and its tokens */
    size_t copies = (size_t)(2 * p + CTX_CALIB_FORCED / KV_CHUNK_TOKENS + 1) *
                    kv_chunk_data_bytes(cm->shape, KV_F16);
    kv_chunk_stats *sec = malloc(sizeof *sec * (size_t)p * n_layer);
    int32_t pos[CTX_CALIB_FORCED];
    if (!sec || ctx_claim(cm, copies, err)) {
        free(sec);
        return;
    }
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
    cm->calib = kv_calib_new(cm->m, &prefix, sec, c->tokens + at, pos, CTX_CALIB_FORCED, err);
    free(sec);
    if (!cm->calib)
        return;
    double inline_ms = cm->policy.calib_inline_ms > 0 ? cm->policy.calib_inline_ms
                                                      : CTX_CALIB_INLINE_MS;
    /* begun again after a claim dropped it: no forward at the end of a call this time */
    if (cm->calib_whole_ms > inline_ms)
        return;
    double t0 = clock_mono_ms();
    int rc = kv_calib_step(cm->calib, cm->runner, err);
    double whole = (clock_mono_ms() - t0) * kv_calib_forwards_total(cm->calib);
    cm->calib_whole_ms = whole;
    if (rc == 0 && whole > inline_ms) {
        if (reqlog_enabled(REQLOG_INFO))
            fprintf(stderr, "llmsd: info: kv calibration goes on in idle time (%d forwards, "
                    "about %.0f ms in all)\n", kv_calib_forwards_total(cm->calib), whole);
        return;
    }
    while (rc == 0)
        rc = kv_calib_step(cm->calib, cm->runner, err);
    if (rc == KV_CALIB_DONE)
        calib_finish(cm);
    else
        calib_fail(cm, err);
}

bool ctx_layers_calibrated(const ctxmgr *cm)
{
    return cm->layer_factors != NULL;
}

int ctx_calib_forwards_left(const ctxmgr *cm)
{
    return cm->calib ? kv_calib_forwards_total(cm->calib) - kv_calib_forwards_done(cm->calib)
                     : 0;
}

int ctx_calib_idle_step(ctxmgr *cm)
{
    char err[ERR_MAX];
    kv_calib *k = cm->calib;
    if (!k)
        return 0;
    /* claimed with the calibration detached, so that the claim cannot drop it for room */
    cm->calib = NULL;
    int rc = ctx_claim(cm, kv_calib_step_bytes(k), err);
    cm->calib = k;
    if (rc) {
        /* no room beside the idle contexts' KV: a later context starts it again */
        ctx_calib_drop(cm);
        return 0;
    }
    rc = kv_calib_step(k, cm->runner, err);
    if (rc == MODEL_ABORTED)
        return MODEL_ABORTED;
    if (rc == KV_CALIB_DONE)
        calib_finish(cm);
    else if (rc < 0)
        calib_fail(cm, err);
    return 0;
}
