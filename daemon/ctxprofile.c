/*
 * ctxprofile.c — the switch-in cost models: recompute(tokens, ctx) = a + b tokens +
 * c tokens ctx milliseconds (the c term is attention over the entries before), and
 * read(bytes) = d + e bytes (chunk files, page cache dropped). Fitted by least squares
 * from a short profile of this model on this machine, kept in the store per model shape
 * and thread count.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/ctxmem.h"
#include "storage/chunks.h"

#define PROF_CHUNKS 8 /* chunk files written and read back */

double ctx_cost_recompute(const ctx_cost *k, int64_t tokens, int64_t ctx)
{
    double t = (double)tokens;
    return tokens > 0 ? k->rec_a + k->rec_b * t + k->rec_c * t * (double)ctx : 0;
}

double ctx_cost_read(const ctx_cost *k, int64_t bytes)
{
    return bytes > 0 ? k->io_d + k->io_e * (double)bytes : 0;
}

static void cost_key(const ctxmgr *cm, char *key, size_t cap)
{
    const model_hparams *hp = model_hparams_of(cm->m);
    snprintf(key, cap, "ctx_cost/%d/l%d/d%d/h%d/kv%dx%d/ff%d/v%d/t%d", (int)hp->arch, hp->n_layer,
             hp->dim, hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_ff, hp->n_vocab,
             model_runner_n_threads(cm->runner));
}

/* Least squares for y ~ X w with n_w <= 3 unknowns (normal equations, Gaussian
 * elimination with partial pivoting). -1 when singular. */
static int fit(const double *x, const double *y, int n, int n_w, double *w)
{
    double a[3][4] = {{0}};
    for (int s = 0; s < n; s++)
        for (int i = 0; i < n_w; i++) {
            for (int j = 0; j < n_w; j++)
                a[i][j] += x[s * n_w + i] * x[s * n_w + j];
            a[i][n_w] += x[s * n_w + i] * y[s];
        }
    for (int col = 0; col < n_w; col++) {
        int p = col;
        for (int r = col + 1; r < n_w; r++)
            if (fabs(a[r][col]) > fabs(a[p][col]))
                p = r;
        if (fabs(a[p][col]) < 1e-12 * (1 + fabs(a[col][col])))
            return -1;
        for (int j = 0; j <= n_w; j++) {
            double t = a[col][j];
            a[col][j] = a[p][j];
            a[p][j] = t;
        }
        for (int r = 0; r < n_w; r++) {
            if (r == col)
                continue;
            double f = a[r][col] / a[col][col];
            for (int j = col; j <= n_w; j++)
                a[r][j] -= f * a[col][j];
        }
    }
    for (int i = 0; i < n_w; i++)
        w[i] = a[i][n_w] / a[i][i];
    return 0;
}

static int forward_timed(ctxmgr *cm, kv_seq *seq, int from, int n, double *ms, char err[ERR_MAX])
{
    int vocab = model_hparams_of(cm->m)->n_vocab;
    int32_t tok[64], pos[64];
    for (int i = 0; i < n; i++) {
        pos[i] = from + i;
        tok[i] = (int32_t)((pos[i] * 7 + 1) % vocab);
    }
    model_batch b = {.n_tokens = n, .tokens = tok, .positions = pos};
    double t0 = ctx_mono_ms();
    if (model_forward(cm->runner, seq, &b, err))
        return -1;
    *ms = ctx_mono_ms() - t0;
    return 0;
}

/* Recompute samples: batches of 16 and 64 tokens after 0 and after 128 entries (a few
 * hundred tokens in all: seconds on a 1B model on two cores, once per model). */
static int profile_recompute(ctxmgr *cm, kv_seq *seq, ctx_cost *k, char err[ERR_MAX])
{
    int max_kv = model_runner_max_kv(cm->runner);
    int ctx = (max_kv - 64) / KV_CHUNK_TOKENS * KV_CHUNK_TOKENS;
    if (ctx > PROF_CHUNKS * KV_CHUNK_TOKENS)
        ctx = PROF_CHUNKS * KV_CHUNK_TOKENS;
    double x[4 * 3], y[4], ms;
    int n = 0;
    static const int sizes[2] = {16, 64};
    if (max_kv < 64)
        return err_set(err, "profile: the runner holds %d entries, at least 64 are needed", max_kv);
    if (forward_timed(cm, seq, 0, 16, &ms, err))
        return -1;
    kv_seq_truncate(seq, 0);
    for (int s = 0; s < 2; s++) {
        if (forward_timed(cm, seq, 0, sizes[s], &ms, err))
            return -1;
        kv_seq_truncate(seq, 0);
        x[n * 3] = 1;
        x[n * 3 + 1] = sizes[s];
        x[n * 3 + 2] = 0;
        y[n++] = ms;
    }
    bool with_ctx = ctx >= PROF_CHUNKS * KV_CHUNK_TOKENS;
    for (int at = 0; with_ctx && at < ctx; at += 64)
        if (forward_timed(cm, seq, at, ctx - at < 64 ? ctx - at : 64, &ms, err))
            return -1;
    for (int s = 0; with_ctx && s < 2; s++) {
        if (forward_timed(cm, seq, ctx, sizes[s], &ms, err))
            return -1;
        kv_seq_truncate(seq, ctx);
        x[n * 3] = 1;
        x[n * 3 + 1] = sizes[s];
        x[n * 3 + 2] = (double)sizes[s] * ctx;
        y[n++] = ms;
    }
    double w[3] = {0, 0, 0};
    if (!with_ctx || fit(x, y, n, 3, w)) {
        double x2[4 * 2];
        int m = 0;
        for (int s = 0; s < n; s++)
            if (x[s * 3 + 2] == 0) {
                x2[m * 2] = 1;
                x2[m * 2 + 1] = x[s * 3 + 1];
                y[m++] = y[s];
            }
        w[2] = 0;
        if (fit(x2, y, m, 2, w))
            return err_set(err, "profile: recompute timings do not fit a line");
    }
    k->rec_a = w[0] > 0 ? w[0] : 0;
    k->rec_b = w[1] > 1e-9 ? w[1] : 1e-9;
    k->rec_c = w[2] > 0 ? w[2] : 0;
    return 0;
}

/* Read samples: chunk files of the profile's sequence written to a scratch context, the
 * page cache dropped, then read back in groups of 1, 3 and 4 chunks. */
static int profile_read(ctxmgr *cm, kv_seq *seq, ctx_cost *k, char err[ERR_MAX])
{
    char id[CTX_ID_LEN + 1];
    int64_t app;
    int n_layer = cm->shape.n_layer, rc = -1;
    if (seq->n_chunks < PROF_CHUNKS || n_layer > STORE_CHUNK_MAX_SECTIONS)
        return err_set(err, "profile: too few chunks to time reads");
    if (ctx_new_id(id, err) || store_app_id(cm->st, 0, CTX_PROFILE_APP, &app, err) ||
        store_context_create(cm->st, id, app, NULL, NULL, 0, ctx_now_ms(), err))
        return -1;
    const void **sec = malloc(sizeof *sec * (size_t)n_layer);
    size_t *bytes = malloc(sizeof *bytes * (size_t)n_layer);
    void *buf = malloc(kv_chunk_layer_bytes(cm->shape, KV_F16));
    if (!sec || !bytes || !buf) {
        err_set(err, "out of memory");
        goto out;
    }
    for (int i = 0; i < PROF_CHUNKS; i++) {
        const kv_chunk *c = seq->chunks[i];
        for (int l = 0; l < n_layer; l++) {
            sec[l] = kv_chunk_layer(c, cm->shape, l);
            bytes[l] = kv_chunk_layer_bytes(cm->shape, c->precision);
        }
        store_chunk meta = {.index = i, .precision = (int)c->precision, .n_tokens = c->n_tokens};
        if (store_chunk_write(cm->st, id, &meta, sec, bytes, n_layer, err))
            goto out;
    }
    if (store_chunk_drop_cache(cm->st, id, err))
        goto out;
    static const int groups[3] = {1, 3, 4};
    double x[3 * 2], y[3];
    for (int g = 0, first = 0; g < 3; first += groups[g], g++) {
        double t0 = ctx_mono_ms();
        for (int i = first; i < first + groups[g]; i++) {
            bool found;
            store_chunk_reader *r = store_chunk_open(cm->st, id, i, &found, err);
            if (!r)
                goto out;
            for (int l = 0; l < n_layer; l++)
                if (store_chunk_read_section(r, l, buf, store_chunk_section_bytes(r, l), err)) {
                    store_chunk_close(r);
                    goto out;
                }
            store_chunk_close(r);
        }
        y[g] = ctx_mono_ms() - t0;
        x[g * 2] = 1;
        x[g * 2 + 1] = (double)groups[g] * (double)kv_chunk_data_bytes(cm->shape, KV_F16);
    }
    double w[2];
    if (fit(x, y, 3, 2, w)) {
        err_set(err, "profile: read timings do not fit a line");
        goto out;
    }
    k->io_d = w[0] > 0 ? w[0] : 0;
    k->io_e = w[1] > 1e-12 ? w[1] : 1e-12;
    rc = 0;
out:
    free(sec);
    free(bytes);
    free(buf);
    bool found;
    char e2[ERR_MAX];
    store_context_delete(cm->st, id, &found, e2);
    return rc;
}

int ctx_profile(ctxmgr *cm, ctx_cost *out, char err[ERR_MAX])
{
    ctx_cost k = {0};
    kv_seq seq;
    kv_seq_init(&seq, cm->pool);
    /* At most 128 + 64 entries at a time. */
    int rc = ctx_claim(cm, (size_t)ctx_n_chunks(192) * kv_chunk_data_bytes(cm->shape, KV_F16), err);
    if (rc == 0)
        rc = profile_recompute(cm, &seq, &k, err);
    if (rc == 0)
        rc = profile_read(cm, &seq, &k, err);
    kv_seq_free(&seq);
    if (rc)
        return -1;
    char key[160];
    cost_key(cm, key, sizeof key);
    double v[5] = {k.rec_a, k.rec_b, k.rec_c, k.io_d, k.io_e};
    if (store_setting_put(cm->st, key, v, 5, err))
        return -1;
    cm->cost = k;
    if (out)
        *out = k;
    return 0;
}

int ctx_cost_init(ctxmgr *cm, char err[ERR_MAX])
{
    char key[160];
    double v[5];
    int n;
    bool found;
    cost_key(cm, key, sizeof key);
    if (store_setting_get(cm->st, key, v, 5, &n, &found, err))
        return -1;
    if (found && n == 5) {
        cm->cost = (ctx_cost){v[0], v[1], v[2], v[3], v[4]};
        return 0;
    }
    /* Until measured: 0.1 ms per token, 1 GB/s. A failed profile keeps these (the
     * daemon still serves; llmsctl profile tries again). */
    cm->cost = (ctx_cost){.rec_b = 0.1, .io_e = 1e-6};
    char e2[ERR_MAX];
    ctx_profile(cm, NULL, e2);
    return 0;
}
