/*
 * ctxmem.h — internals of the context manager shared by ctxmgr.c (contexts, budget,
 * LCTRU, swap-out, persistence), ctxload.c (switch-in and faults) and ctxprofile.c
 * (cost models). Not for use outside those files.
 */
#ifndef LLMS_CTXMEM_H
#define LLMS_CTXMEM_H

#include <stdatomic.h>

#include "daemon/ctx/ctxmgr.h"
#include "daemon/ctx/swapout.h"
#include "engine/kv/kv_calib.h"
#include "storage/chunks.h"

/* App whose scratch context the profile writes chunks to (deleted afterwards; a
 * leftover from a crash is removed at startup). */
#define CTX_PROFILE_APP "llmsd.profile"

/* The models the corrections apply to. */
enum ctx_model { CTX_MODEL_REC, CTX_MODEL_COLD, CTX_MODEL_WARM, CTX_N_MODELS };

/* The parts of a switch-in that slow each other down when they run at once. */
enum ctx_part { CTX_PART_REC, CTX_PART_READ, CTX_N_PARTS };

/* Observed / predicted ratios kept for the status (ctx_cost_report). */
enum ctx_ratio { CTX_RATIO_REC, CTX_RATIO_READ, CTX_RATIO_TOTAL, CTX_N_RATIOS };
#define CTX_RATIOS_KEPT 64

/* Online refinement of the cost models from real switch-ins. */
typedef struct ctx_refine {
    double log_fix[CTX_N_MODELS];   /* log of each correction factor */
    double n_fix[CTX_N_MODELS];     /* observations behind each */
    double log_contend[CTX_N_PARTS]; /* log of each part's slowdown when both run */
    double n_contend[CTX_N_PARTS];
    uint64_t observed;
    double ratio[CTX_N_RATIOS][CTX_RATIOS_KEPT]; /* rings of observed / predicted */
    uint64_t n_ratio[CTX_N_RATIOS];
    double last_save_ms;            /* clock_mono_ms of the last store write */
    bool unsaved;
} ctx_refine;

/* What a switch-in predicted and observed. A part that did not run has observed < 0. */
typedef struct ctx_cost_obs {
    double fitted[CTX_N_MODELS];    /* ms the fitted lines predict, uncorrected */
    double rec_predicted_ms, read_predicted_ms, total_predicted_ms; /* the plan's */
    double rec_ms, read_ms;         /* measured: the forward less its waits for reads;
                                       the reader's time */
    double total_ms;                /* reading and recomputing, from when room was made */
} ctx_cost_obs;

struct ctxmgr {
    store *st;
    kv_pool *pool;
    kv_pool *also;        /* another pool whose KV counts against the budget (the draft
                             model's, ctx_budget_also_counts), or NULL */
    size_t (*shed)(void *arg, size_t bytes); /* KV outside the contexts reclaimed first
                                                (ctx_set_shed), or NULL */
    void *shed_arg;
    model_runner *runner;
    const model *m;
    kv_shape shape;
    int heads_layers;     /* n_layer * n_head: attention rows per token per forward */
    ctx_policy policy;
    ctx_cost cost;
    ctx_refine refine;
    ctx_stats stats;
    uint64_t clock;       /* ticks once per call; orders last uses */
    ctx_entry *head, *tail;
    int n;
    swapout *swap;        /* writes modified chunks after calls (ahead of time) */
    float *layer_factors; /* (n_layer, KV_CALIB_PARTS) kv_calib factors; NULL: the model's
                             layers are not calibrated yet (ctxcalib.c) */
    kv_calib *calib;      /* a calibration begun and not finished: its forwards run in idle
                             time (ctx_calib_idle_step); NULL: none */
    double calib_whole_ms; /* what a whole calibration takes, from one's first forward;
                              0: not measured yet */
    bool calib_given_up;  /* a calibration failed on this model: not tried again */
    bool writes_failing;  /* the last background write failed (logged once, and again
                             when writes succeed) */
    void (*_Atomic notify)(void *arg); /* told when a background write is done */
    void *notify_arg;
};

/* A chunk row's density, used when a context's stored statistics are missing, weighs as
 * much as this many rows' attention (the window of recent rows bench/kvquant measures
 * densities over), so the next call's rows refine it rather than replace it. */
#define CTX_DENSITY_ROWS 32

/* Tokens chunk i of a history of n tokens holds. */
static inline int ctx_chunk_tokens(int n_tokens, int i)
{
    int n = n_tokens - i * KV_CHUNK_TOKENS;
    return n < 0 ? 0 : n > KV_CHUNK_TOKENS ? KV_CHUNK_TOKENS : n;
}

/* Chunks covering n tokens. */
static inline int ctx_n_chunks(int n_tokens)
{
    return (n_tokens + KV_CHUNK_TOKENS - 1) / KV_CHUNK_TOKENS;
}

/* Makes the map and the sequence's slot array n chunks long (new ones: nowhere). */
int ctx_map_resize(ctx_entry *c, int n);

/* Data bytes of chunk i's stored blob (its KV sections, without token ids or the layer
 * table). */
size_t ctx_disk_data_bytes(const ctxmgr *cm, const ctx_entry *c, int i);

/* The precisions of the layers of chunk i's stored blob into layers (n_layer): from the
 * map, or for a KV_MIXED blob whose table is not known yet from rd (its header and table
 * section are read). -1 when the blob is not usable (the caller forgets it). */
int ctx_disk_layers(ctxmgr *cm, ctx_entry *c, int i, store_chunk_reader *rd,
                    uint8_t *layers);

/* Chunk i's density: the mean over its tokens of the attention they received per row
 * that could attend to them. */
float ctx_chunk_density(const ctx_entry *c, int i);

/* Measures resident chunk i's spreads (per layer into c->layer_stats, their mean into the
 * map) unless they are known. */
void ctx_chunk_spreads(ctxmgr *cm, ctx_entry *c, int i);

/* Loads the layer factors of the model's shape from the store (ctxcalib.c); none
 * stored: cm->layer_factors stays NULL. */
int ctx_calib_load(ctxmgr *cm, char err[ERR_MAX]);

/* When the model's layers are not calibrated yet, calibrates them on c (at the end of a
 * call, every chunk resident) if its first chunks are still f16 and long enough, and
 * stores the factors; a calibration longer than policy.calib_inline_ms is begun and
 * left to idle time (cm->calib). Failing to is not an error: compression stays per
 * chunk. */
void ctx_calib_maybe(ctxmgr *cm, ctx_entry *c);

/* Frees a calibration begun (its copies of KV go back to the pool); none: nothing. A
 * later context begins one again. */
void ctx_calib_drop(ctxmgr *cm);

/*
 * Brings every missing chunk of c with index <= upto in (reading or recomputing each),
 * under the budget; c must be locked. st may be NULL. 0, -1 + err, or CTX_E_BUDGET.
 */
int ctx_load_range(ctxmgr *cm, ctx_entry *c, int upto, ctx_load_stats *st,
                   char err[ERR_MAX]);

/* kv_seq.fault of every context's sequence (arg: the ctx_entry). */
int ctx_fault(void *arg, kv_seq *seq, int index, char err[ERR_MAX]);

/* Cost models from the store, measured when the store has none for this model. */
int ctx_cost_init(ctxmgr *cm, char err[ERR_MAX]);

/* Milliseconds the fitted lines predict for recomputing tokens attending to ctx
 * entries, and for reading chunks (files, counted by their share out of or in the page
 * cache) of bytes not in the page cache (cold) or in it (warm). Zero work costs
 * nothing. */
double ctx_cost_recompute(const ctx_cost *k, int64_t tokens, int64_t ctx);
double ctx_cost_read_cold(const ctx_cost *k, double chunks, double bytes);
double ctx_cost_read_warm(const ctx_cost *k, double chunks, double bytes);

/* The correction factor of a model (1 until switch-ins were observed), and the
 * slowdown of a part while the other runs beside it (1 until observed). */
double ctx_cost_fix(const ctxmgr *cm, enum ctx_model model);
double ctx_cost_contention(const ctxmgr *cm, enum ctx_part part);

/* Records a switch-in: updates the corrections and the observed / predicted record,
 * and stores them with the models at most once a minute. */
void ctx_cost_observe(ctxmgr *cm, const ctx_cost_obs *o);

/* Stores the corrections now if they changed since the last store (ctx_close). */
void ctx_cost_save(ctxmgr *cm);

/*
 * Non-negative least squares on relative residuals: the w >= 0 (n_w <= 3 unknowns)
 * minimising sum over the n samples of ((y_s - x_s . w) / y_s)^2, where x holds n rows of
 * n_w. Timing noise is proportional to the time, so every point counts alike. *resid
 * gets the RMS relative residual. -1 when some y_s <= 0 or no subset of the unknowns
 * can be solved for.
 */
int ctx_fit_nonneg(const double *x, const double *y, int n, int n_w, double *w,
                   double *resid);

/* Sliding window (ctxwindow.c). ctx_window_load applies a stored window to the history
 * ctx_open read (every turn's tokens): -1 + err when it does not fit the history (the
 * context is then damaged).
 * ctx_window_call_end fixes the chunk map after a committed call that slid (the chunks
 * after the sink are new and unstored), or puts back the KV and statistics of the
 * history after one that did not commit. */
int ctx_window_load(ctx_entry *c, const store_window *w, char err[ERR_MAX]);
void ctx_window_call_end(ctx_entry *c, bool committed);

#endif
