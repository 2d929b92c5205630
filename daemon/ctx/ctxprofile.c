/*
 * ctxprofile.c — the switch-in cost models: recompute(tokens, ctx) = a + b tokens +
 * c tokens ctx milliseconds (the c term is attention over the entries before), and
 * read(chunks, bytes) = d + f chunks + e bytes twice, for chunk files out of the page
 * cache (cold) and in it (warm). Measured by a short profile of this model on this
 * machine, kept in the store per model shape and thread count, and corrected online by
 * every switch-in.
 *
 * Why this shape of profile: one timing per point on a shared 2-core machine gave
 * intercepts that moved 10x between consecutive profiles. So every point is timed
 * several times, the runs of all points interleaved (a burst of load elsewhere lands on
 * one run of several points, which the per-point median then drops), and the line is
 * fitted to the medians by non-negative least squares on relative residuals. A fit that
 * stays poor over three attempts is refused rather than stored.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/ctx/ctxmem.h"
#include "engine/clock.h"
#include "storage/chunks.h"

#define PROF_MAX_CTX 256      /* entries before the batch at the far recompute points */
#define PROF_GROUPS 3         /* chunk files read back per precision: groups of 1, 2, 4 */
#define PROF_FILES ((1 << PROF_GROUPS) - 1)
#define PROF_MIN_ROUNDS 3     /* timed runs per point: a median needs three */
#define PROF_MAX_ROUNDS 7
#define PROF_BUDGET_MS 2000.0 /* more rounds (up to the maximum) while they fit in this */
#define PROF_ATTEMPTS 3
#define PROF_GOOD_RESID 0.10  /* a fit this close is kept at once */
#define PROF_MAX_RESID 0.30   /* the best of the attempts must be this close */

/* Online refinement. */
#define FIX_WEIGHT 0.2        /* of each observation in the moving average of log ratios */
#define FIX_STEP 4.0          /* one observation counts for at most this ratio to the
                                 current correction */
#define FIX_MAX 8.0           /* a correction factor stays within [1/FIX_MAX, FIX_MAX] */
#define FIX_MIN_MS 1.0        /* parts shorter than this (observed and predicted) are noise */
#define SAVE_EVERY_MS 60000.0 /* the store syncs every write: corrections go at most once a
                                 minute (and at close) */

#define N_STORED 23           /* doubles of a stored record: the ctx_cost fields but the
                                 per-chunk terms, the log corrections and their counts,
                                 the log contentions and their counts, the per-chunk
                                 terms */

double ctx_cost_recompute(const ctx_cost *k, int64_t tokens, int64_t ctx)
{
    double t = (double)tokens;
    return tokens > 0 ? k->rec_a + k->rec_b * t + k->rec_c * t * (double)ctx : 0;
}

double ctx_cost_read_cold(const ctx_cost *k, double chunks, double bytes)
{
    return chunks > 0 ? k->io_d + k->io_f * chunks + k->io_e * bytes : 0;
}

double ctx_cost_read_warm(const ctx_cost *k, double chunks, double bytes)
{
    return chunks > 0 ? k->warm_d + k->warm_f * chunks + k->warm_e * bytes : 0;
}

double ctx_cost_fix(const ctxmgr *cm, enum ctx_model model)
{
    return exp(cm->refine.log_fix[model]);
}

double ctx_cost_contention(const ctxmgr *cm, enum ctx_part part)
{
    return exp(cm->refine.log_contend[part]);
}

static void cost_key(const ctxmgr *cm, char *key, size_t cap)
{
    /* "ctx_cost2": records of the one-sample profile (5 values) are not reused. A runner on
     * a GPU recomputes at the GPU's speed: its costs are the GPU's own, kept apart. */
    const model_hparams *hp = model_hparams_of(cm->m);
    const char *gpu = model_runner_gpu_name(cm->runner);
    snprintf(key, cap, "ctx_cost2/%d/l%d/d%d/h%d/kv%dx%d/ff%d/v%d/t%d%s%s", (int)hp->arch,
             hp->n_layer, hp->dim, hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_ff,
             hp->n_vocab, model_runner_n_threads(cm->runner), gpu ? "/gpu:" : "",
             gpu ? gpu : "");
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median of n values (reorders them). */
static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Weighted least squares on the unknowns in mask (the others 0): normal equations,
 * Gaussian elimination with partial pivoting. -1 when singular. */
static int solve_subset(const double *x, const double *y, int n, int n_w, unsigned mask,
                        double *w)
{
    int idx[3], m = 0;
    for (int i = 0; i < n_w; i++)
        if (mask & (1u << i))
            idx[m++] = i;
    double a[3][4] = {{0}};
    for (int s = 0; s < n; s++) {
        double wt = 1 / (y[s] * y[s]);
        for (int i = 0; i < m; i++) {
            for (int j = 0; j < m; j++)
                a[i][j] += wt * x[s * n_w + idx[i]] * x[s * n_w + idx[j]];
            a[i][m] += wt * x[s * n_w + idx[i]] * y[s];
        }
    }
    for (int col = 0; col < m; col++) {
        int p = col;
        for (int r = col + 1; r < m; r++)
            if (fabs(a[r][col]) > fabs(a[p][col]))
                p = r;
        if (fabs(a[p][col]) < 1e-12 * (1 + fabs(a[col][col])))
            return -1;
        for (int j = 0; j <= m; j++) {
            double t = a[col][j];
            a[col][j] = a[p][j];
            a[p][j] = t;
        }
        for (int r = 0; r < m; r++) {
            if (r == col)
                continue;
            double f = a[r][col] / a[col][col];
            for (int j = col; j <= m; j++)
                a[r][j] -= f * a[col][j];
        }
    }
    for (int i = 0; i < n_w; i++)
        w[i] = 0;
    for (int i = 0; i < m; i++)
        w[idx[i]] = a[i][m] / a[i][i];
    return 0;
}

int ctx_fit_nonneg(const double *x, const double *y, int n, int n_w, double *w, double *resid)
{
    if (n_w < 1 || n_w > 3 || n < 1)
        return -1;
    for (int s = 0; s < n; s++)
        if (!(y[s] > 0))
            return -1;
    /* The constrained optimum is the unconstrained one on its set of non-zero unknowns,
     * so with 3 unknowns trying the 7 subsets and keeping the best feasible one is exact. */
    double best = INFINITY;
    for (unsigned mask = 1; mask < 1u << n_w; mask++) {
        double t[3];
        if (solve_subset(x, y, n, n_w, mask, t))
            continue;
        bool feasible = true;
        for (int i = 0; i < n_w; i++)
            feasible &= t[i] >= 0;
        if (!feasible)
            continue;
        double ss = 0;
        for (int s = 0; s < n; s++) {
            double fit = 0;
            for (int i = 0; i < n_w; i++)
                fit += x[s * n_w + i] * t[i];
            ss += (y[s] - fit) * (y[s] - fit) / (y[s] * y[s]);
        }
        if (ss < best) {
            best = ss;
            memcpy(w, t, sizeof *t * (size_t)n_w);
        }
    }
    if (best == INFINITY)
        return -1;
    *resid = sqrt(best / n);
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
    double t0 = clock_mono_ms();
    if (model_forward(cm->runner, seq, &b, err))
        return -1;
    *ms = clock_mono_ms() - t0;
    return 0;
}

/* Rounds to time after the first one took round_ms. */
static int rounds_for(double round_ms)
{
    int r = round_ms > 0 ? (int)(PROF_BUDGET_MS / round_ms) : PROF_MAX_ROUNDS;
    return r < PROF_MIN_ROUNDS ? PROF_MIN_ROUNDS : r > PROF_MAX_ROUNDS ? PROF_MAX_ROUNDS : r;
}

/* The profile's two sequences: an empty one and one holding ctx entries, so that the
 * near and far points can be timed in any order. */
typedef struct prof_seqs {
    kv_seq near, far;
    int ctx;
    char scratch[CTX_ID_LEN + 1]; /* context holding the far sequence's first chunks */
} prof_seqs;

/* Recompute: batches of 24, 40 and 64 tokens after 0 and after ctx entries, each timed
 * in every round, fitted to the medians. The engine changes kernels with the batch size
 * (engine/model/ops.c: up to 16 rows of float weights and up to 64 of quantized ones take
 * the dot kernels, more sgemm), so the sizes lie between those thresholds, on one
 * kernel's line for either kind of weights: a 16-token point on float weights measured
 * 5x the line through 32 and 64 tokens under ASan and made every fit fail. Batches on
 * another kernel are left to the online corrections. */
static int profile_recompute(ctxmgr *cm, prof_seqs *ps, ctx_cost *k, char err[ERR_MAX])
{
    static const int sizes[3] = {24, 40, 64};
    enum { N_POINTS = 6 };
    double ms[N_POINTS][PROF_MAX_ROUNDS], x[N_POINTS * 3], y[N_POINTS];
    /* Without room for the far points the context term cannot be told: a, b only. */
    int n_points = ps->ctx > 0 ? 6 : 3, n_w = ps->ctx > 0 ? 3 : 2, rounds = PROF_MIN_ROUNDS;
    for (int r = 0; r < rounds; r++) {
        double t0 = clock_mono_ms();
        for (int p = 0; p < n_points; p++) {
            bool far = p >= 3;
            kv_seq *seq = far ? &ps->far : &ps->near;
            int at = far ? ps->ctx : 0;
            if (forward_timed(cm, seq, at, sizes[p % 3], &ms[p][r], err))
                return -1;
            kv_seq_truncate(seq, at);
        }
        if (r == 0)
            rounds = rounds_for(clock_mono_ms() - t0);
    }
    for (int p = 0; p < n_points; p++) {
        double t = sizes[p % 3];
        x[p * n_w] = 1;
        x[p * n_w + 1] = t;
        if (n_w == 3)
            x[p * n_w + 2] = p >= 3 ? t * ps->ctx : 0;
        y[p] = median(ms[p], rounds);
    }
    double w[3] = {0, 0, 0};
    if (ctx_fit_nonneg(x, y, n_points, n_w, w, &k->rec_resid))
        return err_set(err, "profile: recompute timings do not fit a line");
    k->rec_a = w[0];
    k->rec_b = w[1];
    k->rec_c = w[2];
    k->samples = rounds;
    return 0;
}

/* Reads chunks [first, first + n) of the scratch context whole (as a switch-in does:
 * open, header, every layer's section). */
static int read_group(ctxmgr *cm, const char *id, int first, int n, void *buf, double *ms,
                      char err[ERR_MAX])
{
    double t0 = clock_mono_ms();
    for (int i = first; i < first + n; i++) {
        bool found;
        store_chunk_reader *r = store_chunk_open(cm->st, id, i, &found, err);
        if (!r)
            return -1;
        for (int l = 0; l < cm->shape.n_layer; l++)
            if (store_chunk_read_section(r, l, buf, store_chunk_section_bytes(r, l), err)) {
                store_chunk_close(r);
                return -1;
            }
        store_chunk_close(r);
    }
    *ms = clock_mono_ms() - t0;
    return 0;
}

/* Writes the first n_files chunks of seq to the scratch context id, in one batch. */
static int write_scratch(ctxmgr *cm, const kv_seq *seq, const char *id, int n_files,
                         char err[ERR_MAX])
{
    int n_layer = cm->shape.n_layer, rc = -1;
    const void **sec = malloc(sizeof *sec * (size_t)(n_layer * n_files));
    size_t *bytes = malloc(sizeof *bytes * (size_t)(n_layer * n_files));
    store_chunk_blob *blobs = calloc((size_t)n_files, sizeof *blobs);
    if (!sec || !bytes || !blobs) {
        err_set(err, "out of memory");
        goto out;
    }
    for (int i = 0; i < n_files; i++) {
        const kv_chunk *c = seq->chunks[i];
        for (int l = 0; l < n_layer; l++) {
            sec[i * n_layer + l] = kv_chunk_layer(c, cm->shape, l);
            bytes[i * n_layer + l] = kv_chunk_section_bytes(c, cm->shape, l);
        }
        blobs[i] = (store_chunk_blob){
            .meta = {.index = i, .precision = (int)c->precision, .n_tokens = c->n_tokens},
            .sections = sec + i * n_layer,
            .section_bytes = bytes + i * n_layer,
            .n_sections = n_layer,
        };
    }
    rc = store_chunk_write_batch(cm->st, id, blobs, n_files, err);
out:
    free(sec);
    free(bytes);
    free(blobs);
    return rc;
}

/* Reads: the far sequence's first chunks written to a scratch context, PROF_FILES at
 * f16 and PROF_FILES at int2, so that what a file costs can be told from what its bytes
 * cost; then in every round the page cache dropped and groups of 1, 2 and 4 distinct
 * chunks of each precision read cold, then the same groups read again warm. (On a file
 * system without a page cache to drop, tmpfs, both lines are warm ones, which is the
 * truth there.) */
static int profile_read(ctxmgr *cm, prof_seqs *ps, ctx_cost *k, char err[ERR_MAX])
{
    static const enum kv_precision precs[2] = {KV_F16, KV_INT2};
    enum { N_POINTS = 2 * PROF_GROUPS };
    const char *id = ps->scratch;
    int n_groups = PROF_GROUPS, n_points = N_POINTS, rc = -1, rounds = PROF_MIN_ROUNDS;
    void *buf = malloc(kv_chunk_layer_bytes(cm->shape, KV_F16));
    double cold[N_POINTS][PROF_MAX_ROUNDS], warm[N_POINTS][PROF_MAX_ROUNDS];
    if (!buf)
        return err_set(err, "out of memory");
    for (int r = 0; r < rounds; r++) {
        double t0 = clock_mono_ms();
        if (store_chunk_drop_cache(cm->st, id, err))
            goto out;
        for (int pass = 0; pass < 2; pass++)
            for (int p = 0; p < n_points; p++) {
                int g = p % n_groups, first = p / n_groups * PROF_FILES + (1 << g) - 1;
                double *ms = pass ? &warm[p][r] : &cold[p][r];
                if (read_group(cm, id, first, 1 << g, buf, ms, err))
                    goto out;
            }
        if (r == 0)
            rounds = rounds_for(clock_mono_ms() - t0);
    }
    double x[N_POINTS * 3], yc[N_POINTS], yw[N_POINTS], wc[3], ww[3];
    for (int p = 0; p < n_points; p++) {
        double chunks = 1 << (p % n_groups);
        x[p * 3] = 1;
        x[p * 3 + 1] = chunks;
        x[p * 3 + 2] = chunks * (double)kv_chunk_data_bytes(cm->shape, precs[p / n_groups]);
        yc[p] = median(cold[p], rounds);
        yw[p] = median(warm[p], rounds);
    }
    if (ctx_fit_nonneg(x, yc, n_points, 3, wc, &k->io_resid) ||
        ctx_fit_nonneg(x, yw, n_points, 3, ww, &k->warm_resid)) {
        err_set(err, "profile: read timings do not fit a line");
        goto out;
    }
    k->io_d = wc[0];
    k->io_f = wc[1];
    k->io_e = wc[2];
    k->warm_d = ww[0];
    k->warm_f = ww[1];
    k->warm_e = ww[2];
    rc = 0;
out:
    free(buf);
    return rc;
}

/* Which of two attempts to keep: the one whose worse residual is smaller. */
static double worst_resid(const ctx_cost *k, bool rec)
{
    if (rec)
        return k->rec_resid;
    return k->io_resid > k->warm_resid ? k->io_resid : k->warm_resid;
}

/* Runs a part of the profile up to PROF_ATTEMPTS times until its fit is good, keeping
 * the best attempt. */
static int profile_part(ctxmgr *cm, prof_seqs *ps, bool rec, ctx_cost *k, char err[ERR_MAX])
{
    ctx_cost best = *k;
    bool have = false;
    for (int a = 0; a < PROF_ATTEMPTS; a++) {
        ctx_cost t = *k;
        int rc = rec ? profile_recompute(cm, ps, &t, err) : profile_read(cm, ps, &t, err);
        if (rc)
            return -1;
        if (!have || worst_resid(&t, rec) < worst_resid(&best, rec))
            best = t;
        have = true;
        if (worst_resid(&best, rec) <= PROF_GOOD_RESID)
            break;
    }
    if (worst_resid(&best, rec) > PROF_MAX_RESID)
        return err_set(err, "profile refused: the %s timings are %.0f%% off the best line "
                       "after %d attempts (is the machine busy?); the models stay as they were",
                       rec ? "recompute" : "read", 100 * worst_resid(&best, rec), PROF_ATTEMPTS);
    /* (Reads may grow with the files alone: with small chunks e can be 0 beside f.) */
    bool grows = rec ? best.rec_b > 0
                     : (best.io_e > 0 || best.io_f > 0) && (best.warm_e > 0 || best.warm_f > 0);
    if (!grows)
        return err_set(err, "profile refused: the %s time does not grow with the work; "
                       "the models stay as they were", rec ? "recompute" : "read");
    *k = best;
    return 0;
}

static void record_values(const ctxmgr *cm, double *v)
{
    const ctx_cost *k = &cm->cost;
    const ctx_refine *f = &cm->refine;
    double fields[N_STORED] = {
        k->rec_a,        k->rec_b,        k->rec_c,        k->io_d,      k->io_e,
        k->warm_d,       k->warm_e,       k->rec_resid,    k->io_resid,  k->warm_resid,
        k->samples,      f->log_fix[0],   f->log_fix[1],   f->log_fix[2], f->n_fix[0],
        f->n_fix[1],     f->n_fix[2],     f->log_contend[0], f->log_contend[1],
        f->n_contend[0], f->n_contend[1], k->io_f,        k->warm_f,
    };
    memcpy(v, fields, sizeof fields);
}

static int store_models(ctxmgr *cm, char err[ERR_MAX])
{
    char key[160];
    double v[N_STORED];
    cost_key(cm, key, sizeof key);
    record_values(cm, v);
    if (store_setting_put(cm->st, key, v, N_STORED, err))
        return -1;
    cm->refine.last_save_ms = clock_mono_ms();
    cm->refine.unsaved = false;
    return 0;
}

int ctx_profile(ctxmgr *cm, ctx_cost *out, char err[ERR_MAX])
{
    ctx_cost k = {0};
    prof_seqs ps;
    int max_kv = model_runner_max_kv(cm->runner);
    if (max_kv < 64)
        return err_set(err, "profile: the runner holds %d entries, at least 64 are needed", max_kv);
    ps.ctx = (max_kv - 64) / KV_CHUNK_TOKENS * KV_CHUNK_TOKENS;
    if (ps.ctx > PROF_MAX_CTX)
        ps.ctx = PROF_MAX_CTX;
    kv_seq_init(&ps.near, cm->pool);
    kv_seq_init(&ps.far, cm->pool);
    /* Far: ctx + 64 entries; near: 64. */
    int rc = ctx_claim(cm, (size_t)(ctx_n_chunks(ps.ctx + 64) + ctx_n_chunks(64)) *
                               kv_chunk_data_bytes(cm->shape, KV_F16), err);
    double ms;
    /* One untimed forward first: the first touches cold weights and scratch. */
    if (rc == 0)
        rc = forward_timed(cm, &ps.near, 0, 16, &ms, err);
    kv_seq_truncate(&ps.near, 0);
    for (int at = 0; rc == 0 && at < ps.ctx; at += 64)
        rc = forward_timed(cm, &ps.far, at, ps.ctx - at < 64 ? ps.ctx - at : 64, &ms, err);
    if (rc == 0)
        rc = profile_part(cm, &ps, true, &k, err);
    int64_t app;
    bool scratch = false;
    if (rc == 0 && (ps.far.n_chunks < 2 * PROF_FILES ||
                    cm->shape.n_layer > STORE_CHUNK_MAX_SECTIONS))
        rc = err_set(err, "profile: too few chunks to time reads (the runner holds %d "
                     "entries, %d are needed)", max_kv, 2 * PROF_FILES * KV_CHUNK_TOKENS + 64);
    if (rc == 0 && (ctx_new_id(ps.scratch, err) ||
                    store_app_id(cm->st, 0, CTX_PROFILE_APP, &app, err) ||
                    store_context_create(cm->st, ps.scratch, app, NULL, NULL, 0, clock_wall_ms(),
                                         err)))
        rc = -1;
    scratch = rc == 0;
    for (int i = PROF_FILES; rc == 0 && i < 2 * PROF_FILES; i++)
        rc = kv_chunk_convert(cm->pool, ps.far.chunks[i], KV_INT2, err);
    if (rc == 0)
        rc = write_scratch(cm, &ps.far, ps.scratch, 2 * PROF_FILES, err);
    if (rc == 0)
        rc = profile_part(cm, &ps, false, &k, err);
    if (scratch) {
        bool found;
        char e2[ERR_MAX];
        store_context_delete(cm->st, ps.scratch, &found, e2);
    }
    kv_seq_free(&ps.near);
    kv_seq_free(&ps.far);
    if (rc)
        return -1;
    ctx_cost old = cm->cost;
    ctx_refine old_refine = cm->refine;
    ctx_set_cost(cm, &k);
    if (store_models(cm, err)) {
        cm->cost = old;
        cm->refine = old_refine;
        return -1;
    }
    if (out)
        *out = k;
    return 0;
}

int ctx_cost_init(ctxmgr *cm, char err[ERR_MAX])
{
    char key[160];
    double v[N_STORED];
    int n;
    bool found;
    cost_key(cm, key, sizeof key);
    if (store_setting_get(cm->st, key, v, N_STORED, &n, &found, err))
        return -1;
    memset(&cm->refine, 0, sizeof cm->refine);
    if (found && n == N_STORED) {
        cm->cost = (ctx_cost){
            .rec_a = v[0], .rec_b = v[1], .rec_c = v[2], .io_d = v[3], .io_e = v[4],
            .warm_d = v[5], .warm_e = v[6], .rec_resid = v[7], .io_resid = v[8],
            .warm_resid = v[9], .samples = v[10], .io_f = v[21], .warm_f = v[22],
        };
        for (int m = 0; m < CTX_N_MODELS; m++) {
            cm->refine.log_fix[m] = v[11 + m];
            cm->refine.n_fix[m] = v[14 + m];
        }
        for (int p = 0; p < CTX_N_PARTS; p++) {
            cm->refine.log_contend[p] = v[17 + p];
            cm->refine.n_contend[p] = v[19 + p];
        }
        cm->refine.last_save_ms = clock_mono_ms();
        return 0;
    }
    /* Until measured: 0.1 ms per token, 1 GB/s cold, 4 GB/s warm. A refused or failed
     * profile keeps these (the daemon still serves; llmsctl profile tries again). */
    cm->cost = (ctx_cost){.rec_b = 0.1, .io_e = 1e-6, .warm_e = 2.5e-7};
    char e2[ERR_MAX];
    ctx_profile(cm, NULL, e2);
    return 0;
}

void ctx_set_cost(ctxmgr *cm, const ctx_cost *cost)
{
    cm->cost = *cost;
    memset(&cm->refine, 0, sizeof cm->refine);
    cm->refine.last_save_ms = clock_mono_ms();
}

ctx_cost ctx_get_cost(const ctxmgr *cm)
{
    return cm->cost;
}

/* Moves the log factor *log_f towards log(observed / base). */
static void refine(ctx_refine *f, double *log_f, double *n, double observed, double base)
{
    if (observed < 0 || base <= 0 || (observed < FIX_MIN_MS && base < FIX_MIN_MS))
        return;
    /* The step is bounded around the current factor, not around 1: an outlier moves it
     * little, a consistent error of any size is learned (up to FIX_MAX). */
    double miss = (observed > 0 ? log(observed / base) : -INFINITY) - *log_f;
    miss = fmax(-log(FIX_STEP), fmin(log(FIX_STEP), miss));
    *log_f = fmax(-log(FIX_MAX), fmin(log(FIX_MAX), *log_f + FIX_WEIGHT * miss));
    (*n)++;
    f->unsaved = true;
}

static void record_ratio(ctx_refine *f, enum ctx_ratio r, double observed, double predicted)
{
    if (observed < 0 || predicted <= 0 || (observed < FIX_MIN_MS && predicted < FIX_MIN_MS))
        return;
    f->ratio[r][f->n_ratio[r] % CTX_RATIOS_KEPT] = observed / predicted;
    f->n_ratio[r]++;
}

void ctx_cost_observe(ctxmgr *cm, const ctx_cost_obs *o)
{
    ctx_refine *f = &cm->refine;
    double rec = o->fitted[CTX_MODEL_REC] * ctx_cost_fix(cm, CTX_MODEL_REC);
    double cold = o->fitted[CTX_MODEL_COLD] * ctx_cost_fix(cm, CTX_MODEL_COLD);
    double warm = o->fitted[CTX_MODEL_WARM] * ctx_cost_fix(cm, CTX_MODEL_WARM);
    f->observed++;
    record_ratio(f, CTX_RATIO_REC, o->rec_ms, o->rec_predicted_ms);
    record_ratio(f, CTX_RATIO_READ, o->read_ms, o->read_predicted_ms);
    record_ratio(f, CTX_RATIO_TOTAL, o->total_ms, o->total_predicted_ms);
    if (o->rec_ms >= 0 && o->read_ms >= 0 && !cm->policy.sequential) {
        refine(f, &f->log_contend[CTX_PART_REC], &f->n_contend[CTX_PART_REC], o->rec_ms, rec);
        refine(f, &f->log_contend[CTX_PART_READ], &f->n_contend[CTX_PART_READ], o->read_ms,
               cold + warm);
    } else {
        /* One part alone, or both one after the other (sequential policy): each part
         * corrects its own model. */
        if (o->rec_ms >= 0)
            refine(f, &f->log_fix[CTX_MODEL_REC], &f->n_fix[CTX_MODEL_REC], o->rec_ms,
                   o->fitted[CTX_MODEL_REC]);
        if (o->read_ms >= 0 && cold + warm > 0) {
            /* One read time covers cold and warm chunks: it corrects the model that
             * predicted most of it, by the ratio of the whole (the other part as
             * predicted). */
            enum ctx_model m = cold >= warm ? CTX_MODEL_COLD : CTX_MODEL_WARM;
            double other = cold >= warm ? warm : cold;
            refine(f, &f->log_fix[m], &f->n_fix[m], fmax(o->read_ms - other, 0),
                   o->fitted[m]);
        }
    }
    if (f->unsaved && clock_mono_ms() - f->last_save_ms >= SAVE_EVERY_MS)
        ctx_cost_save(cm);
}

void ctx_cost_save(ctxmgr *cm)
{
    char err[ERR_MAX];
    /* A failed write keeps them unsaved: the next observation or close tries again. */
    if (cm->refine.unsaved && cm->cost.samples > 0)
        store_models(cm, err);
}

/* Median and last of a ring of ratios, 0 and 0 when empty. */
static void ratio_summary(const ctx_refine *f, enum ctx_ratio r, double *med, double *last)
{
    uint64_t n = f->n_ratio[r];
    int kept = n < CTX_RATIOS_KEPT ? (int)n : CTX_RATIOS_KEPT;
    double v[CTX_RATIOS_KEPT];
    *med = *last = 0;
    if (kept == 0)
        return;
    memcpy(v, f->ratio[r], sizeof *v * (size_t)kept);
    *last = f->ratio[r][(n - 1) % CTX_RATIOS_KEPT];
    *med = median(v, kept);
}

void ctx_get_cost_report(const ctxmgr *cm, ctx_cost_report *out)
{
    *out = (ctx_cost_report){
        .fit = cm->cost,
        .rec_fix = ctx_cost_fix(cm, CTX_MODEL_REC),
        .cold_fix = ctx_cost_fix(cm, CTX_MODEL_COLD),
        .warm_fix = ctx_cost_fix(cm, CTX_MODEL_WARM),
        .rec_contention = ctx_cost_contention(cm, CTX_PART_REC),
        .read_contention = ctx_cost_contention(cm, CTX_PART_READ),
        .observed = cm->refine.observed,
    };
    ratio_summary(&cm->refine, CTX_RATIO_REC, &out->rec_median, &out->rec_last);
    ratio_summary(&cm->refine, CTX_RATIO_READ, &out->read_median, &out->read_last);
    ratio_summary(&cm->refine, CTX_RATIO_TOTAL, &out->total_median, &out->total_last);
}
