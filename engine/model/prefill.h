/*
 * prefill.h — the memory plan of a long prompt's prefill (HyperGen): the bytes each step
 * of a layer holds while it runs and leaves behind, and the partitioning that keeps the
 * working memory under a budget.
 *
 * A forward step evaluates `rows` prompt rows against `ctx` KV entries. Its steps per
 * layer are QKV (three matrix products), scores (Q K^T), softmax, attention output (P V)
 * and MLP, then logits once. Attention runs per KV head in blocks of `attn_rows` query
 * rows: each thread holds one block's scores (attn_rows, ctx), softmax works on them in
 * place and P V writes the block's output rows straight into the step's output, where
 * the blocks end up concatenated. The runner allocates its scratch once, with the
 * attention buffers and the MLP's sharing one region (model.h), so its working memory is
 * what every step uses plus the larger of the two regions.
 *
 * The unpartitioned path (HyperGen's baseline) runs every step on the whole prompt with
 * one score block per head: (rows, ctx) floats per thread. Plans, from the least
 * partitioning to the most: whole steps with the engine's score blocks of
 * MODEL_ATTN_ROWS_DEFAULT rows, which are also faster than whole-step scores on a CPU
 * (none); smaller score blocks: scores, softmax and output partitioned (moderate; softmax
 * works in place on the scores here, so it cannot be partitioned apart from them); every
 * step on slices of the prompt's rows, the K/V of each slice appended to the sequence's
 * chunks before the next (severe). When the least partitioned plan does not fit, the
 * planner takes the cheapest one that does under a time model (prefill_cost), since
 * partitioning costs time: every step streams the weights and decodes the K/V again,
 * and every score block reads the K/V again. A block's output rows are written (spilled) into the
 * step's output at their place, which is their concatenation; on a CPU that is host
 * memory already, and no file spill is made: the largest partial result, the output
 * rows, shrinks with the slice. The results are the unpartitioned path's within float
 * rounding (tests/engine/test_prefill.c).
 */
#ifndef LLMS_PREFILL_H
#define LLMS_PREFILL_H

#include <stddef.h>
#include <stdio.h>

#include "engine/err.h"
#include "engine/kv/kv.h"
#include "engine/model/model.h"

enum prefill_step_kind {
    PREFILL_QKV,
    PREFILL_SCORES,
    PREFILL_SOFTMAX,
    PREFILL_ATTN_OUT,
    PREFILL_MLP,
    PREFILL_LOGITS,
    PREFILL_N_STEPS
};

const char *prefill_step_name(enum prefill_step_kind k);

/* One step's estimate. */
typedef struct prefill_step_mem {
    size_t peak;     /* bytes the step's tensors take while it runs (with what every step keeps) */
    size_t retained; /* bytes it leaves to the following steps (K/V in the KV's precision) */
} prefill_step_mem;

/* The estimate for one choice of partitioning. */
typedef struct prefill_estimate {
    int rows;      /* prompt rows per forward step */
    int attn_rows; /* query rows per score block */
    int ctx;       /* KV entries the last step attends to */
    prefill_step_mem steps[PREFILL_N_STEPS];
    size_t every;   /* bytes every step uses: residual rows, matmul scratch, bookkeeping */
    size_t attn;    /* the attention region: q, k, v, output, score blocks, K/V as f32 */
    size_t mlp;     /* the MLP region: gate and up rows */
    size_t working; /* every + max(attn, mlp): what the runner allocates */
} prefill_estimate;

/* What a plan is made for. */
typedef struct prefill_request {
    int n_prompt;   /* prompt tokens, > 0 */
    int n_past;     /* KV entries before the prompt (a context's history), >= 0 */
    int max_rows;   /* most rows per step the caller runs; <= 0: n_prompt */
    int max_kv;     /* KV entries the runner must hold (decode after the prompt); <= 0
                       or fewer than n_past + n_prompt: n_past + n_prompt */
    int n_threads;  /* the runner's threads, > 0 */
    enum kv_precision kv; /* the precision the prompt's chunks are kept in */
    size_t budget;  /* bytes of working memory; 0: none */
    size_t resident_small; /* weight residency (model_runner_stream_weights); SIZE_MAX: off */
} prefill_request;

enum prefill_pressure { PREFILL_WHOLE, PREFILL_MODERATE, PREFILL_SEVERE };

typedef struct prefill_plan {
    prefill_request req;
    enum prefill_pressure pressure;
    prefill_estimate est;      /* the chosen partitioning */
    double cost;               /* its prefill_cost, model nanoseconds */
    prefill_estimate whole;    /* the unpartitioned path, for comparison: steps of
                                  min(n_prompt, max_rows) rows */
    size_t kv_bytes;           /* the prompt's K/V in req.kv */
    model_residency weights;   /* under req.resident_small */
    size_t weights_window;     /* streamed weights in memory at once: two layers' worth */
} prefill_plan;

/* The estimate for rows per step, attn_rows per score block, ctx entries and n_threads,
 * of a model shaped hp whose K/V are kept in precision kv. */
prefill_estimate prefill_estimate_of(const model_hparams *hp, int rows, int attn_rows, int ctx,
                                     int n_threads, enum kv_precision kv);

/*
 * The time a prefill of n_prompt rows after n_past takes in steps of `rows` rows with
 * score blocks of attn_rows, in nanoseconds of the CPU it was calibrated on (prefill.c),
 * less what every plan spends alike: a model for comparing plans of one prompt, not a
 * prediction of TTFT. Grows with the steps (weights streamed and K/V decoded again per
 * step) and with the score blocks (K/V read again per block and head).
 */
double prefill_cost(const model_hparams *hp, int n_prompt, int n_past, int rows, int attn_rows);

/*
 * Chooses the plan: the whole prompt (at most max_rows per step) with score blocks of
 * MODEL_ATTN_ROWS_DEFAULT rows when its working memory fits req->budget; else, of the
 * plans with steps of that many rows halved down to 1 and score blocks of at most
 * MODEL_ATTN_ROWS_DEFAULT rows halved down to 1, the cheapest by prefill_cost among
 * those that fit (moderate when its steps are whole, severe when they are slices).
 * out->whole is the unpartitioned path.
 * Fails, before anything is computed, when even one row per step does not fit: err names
 * the bytes needed. Also fails on a bad request.
 */
int prefill_plan_make(const model *m, const prefill_request *req, prefill_plan *out,
                      char err[ERR_MAX]);

/* The largest prompt (after n_past) whose plan fits req's budget, up to limit tokens
 * (req->n_prompt is ignored); 0 when none does. */
int prefill_max_prompt(const model *m, const prefill_request *req, int limit);

/* Writes the plan as text, a line per step, then the budget and the partitioning. */
void prefill_plan_print(const prefill_plan *p, FILE *out);

/* The runner options that carry out the plan. */
model_runner_opts prefill_runner_opts(const prefill_plan *p);

#endif
