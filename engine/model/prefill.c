/*
 * prefill.c — memory plan of a prefill (prefill.h). The estimate counts the tensors of
 * each step from the model's shape; tests/engine/test_prefill.c holds it to the bytes
 * model_runner_new_opts really allocates, bench/longprompt to the measured peak RSS.
 */
#include "engine/model/prefill.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "engine/model/ops.h"

/* Rows of the output matrix's product per call (MODEL_LOGITS_STAGE in model.c). */
#define PREFILL_LOGITS_STAGE 64
/* Sequences with fewer rows in a step take the per-row attention (MODEL_ATTN_GEMM_MIN). */
#define PREFILL_GEMM_MIN 16
/* Bytes of per-row bookkeeping of the runner: a step's part, chunk slot, positions, out
 * destination (model_runner's (max_batch) arrays). */
#define PREFILL_ROW_BOOK 96

const char *prefill_step_name(enum prefill_step_kind k)
{
    static const char *const names[] = {"qkv", "scores", "softmax", "attn_out", "mlp", "logits"};
    return k < PREFILL_N_STEPS ? names[k] : "?";
}

prefill_estimate prefill_estimate_of(const model_hparams *hp, int rows, int attn_rows, int ctx,
                                     int n_threads, enum kv_precision kv)
{
    prefill_estimate e = {.rows = rows, .attn_rows = attn_rows < rows ? attn_rows : rows,
                          .ctx = ctx};
    size_t R = (size_t)rows, C = (size_t)ctx, T = (size_t)n_threads, F = sizeof(float);
    size_t hd = (size_t)hp->head_dim, q_dim = (size_t)hp->n_head * hd;
    size_t kv_dim = (size_t)hp->n_head_kv * hd, group = (size_t)(hp->n_head / hp->n_head_kv);
    size_t ff = (size_t)model_ff_max(hp);
    /* deepseek2's latent attention (model.c's runner): the queries before and after
     * attn_q_a, a head's rows in and out per thread and their product's scratch, the
     * heads' values */
    model_widths widths = model_widths_of(hp);
    size_t mla_in = (size_t)widths.mla_in, mla_out = (size_t)widths.mla_out;
    size_t mla_qf = hp->mla_kv_rank ? (size_t)hp->n_head * (hp->mla_qk_nope + hp->rope_dims) : 0;
    size_t mla_v = (size_t)hp->n_head * hp->mla_v_dim;
    size_t stage = R < PREFILL_LOGITS_STAGE ? R : PREFILL_LOGITS_STAGE;
    kv_shape shape = {hp->n_layer, hp->n_head_kv, hp->head_dim, hp->mla_kv_rank > 0};

    size_t x = R * hp->dim * F; /* the residual, the normalized input, a projection */
    size_t mm = ops_matmul_scratch_bytes(rows, widths.max_cols, n_threads);
    /* the rows' RoPE pairs, twice where sliding layers rotate otherwise (gemma3) */
    e.every = 3 * x + (hp->rope_swa ? 2 : 1) * R * hd * F + 2 * C * sizeof(int32_t) +
              R * PREFILL_ROW_BOOK + mm + stage * hp->n_vocab * F;

    size_t q = R * q_dim * F, k = R * kv_dim * F;
    size_t kf = C * hd * F; /* one KV head's K (or V) as f32 */
    /* one score block per thread: the per-row path holds a row per query head instead */
    size_t blk = T * (size_t)e.attn_rows * C * F, per_row = T * group * C * F;
    size_t scores = rows < PREFILL_GEMM_MIN ? per_row : blk;
    size_t recv = T * C * F, dec = T * KV_CHUNK_TOKENS * hd * F;
    e.attn = 2 * q + 2 * k + per_row + 2 * kf + blk + dec + recv +
             R * (hp->mla_q_rank + mla_qf + mla_v) * F + T * R * (mla_in + mla_out) * F +
             (mla_in ? T * ops_matmul_scratch_bytes(rows, (int)mla_in, 1) : 0);
    /* with experts also the rows of one expert in and out, the router's logits and each
     * row's choices */
    e.mlp = 2 * R * ff * F;
    if (hp->n_expert)
        e.mlp += 2 * x + R * (size_t)(hp->n_expert + 3 * hp->n_expert_used) * F;
    e.working = e.every + (e.attn > e.mlp ? e.attn : e.mlp);

    /* a layer's K/V of these rows, in the precision the sequence keeps them */
    size_t kv_rows = kv_chunk_layer_bytes(shape, kv) * ((R + KV_CHUNK_TOKENS - 1) / KV_CHUNK_TOKENS);
    e.steps[PREFILL_QKV] = (prefill_step_mem){e.every + q + 2 * k, q + kv_rows};
    e.steps[PREFILL_SCORES] = (prefill_step_mem){e.every + q + kf + scores, q + scores};
    e.steps[PREFILL_SOFTMAX] = (prefill_step_mem){e.every + q + scores, q + scores};
    e.steps[PREFILL_ATTN_OUT] = (prefill_step_mem){e.every + q + scores + kf + q, q};
    e.steps[PREFILL_MLP] = (prefill_step_mem){e.every + e.mlp, 0};
    e.steps[PREFILL_LOGITS] = (prefill_step_mem){e.every, 0};
    return e;
}

static bool prefill_fits(const prefill_request *req, const prefill_estimate *e)
{
    return req->budget == 0 || e->working <= req->budget;
}

static int prefill_check(const prefill_request *req, char err[ERR_MAX])
{
    if (req->n_prompt <= 0 || req->n_past < 0 || req->n_threads <= 0)
        return err_set(err, "plan: prompt of %d tokens after %d, %d threads", req->n_prompt,
                       req->n_past, req->n_threads);
    if (!kv_precision_valid(req->kv))
        return err_set(err, "plan: KV precision %d is not valid", (int)req->kv);
    if ((long)req->n_past + req->n_prompt > 1 << 24 || req->max_kv > 1 << 24)
        return err_set(err, "plan: %d + %d KV entries are more than a runner holds",
                       req->n_past, req->n_prompt);
    return 0;
}

/*
 * The time model (prefill_cost), in nanoseconds of a 2-thread x86 CPU, calibrated with
 * forced plans on bench/longprompt's shape (dim 512, 4 layers, 8/1 heads, 2048 tokens,
 * Q8_0; medians of 3 on a shared, noisy machine, so the constants are rough):
 * - every step streams all the layers' weights again: at 1024 tokens 64-row steps cost
 *   ~1 ms each more than one whole step, over 11M parameters: ~0.07 ns a parameter;
 * - every step decodes the sequence's K/V so far to f32 once per layer and KV head
 *   (model_kv_f32_job): not separable from the weights in those runs, so 0.5 ns an
 *   element is an assumption (an f16 load, convert and store), not a measurement;
 * - every score block of every query head reads the K/V it attends to again (two sgemm
 *   of a few rows, bandwidth-bound): 1-row blocks cost 0.47 s more than 32-row ones,
 *   ~0.055 ns an element of K and V.
 * What all plans share (the rows' matrix products, the causal score pairs) is left out:
 * only differences between plans matter.
 */
#define PREFILL_NS_WEIGHT 0.07 /* a weight parameter, once per step */
#define PREFILL_NS_KV_DEC 0.5  /* a K/V element decoded to f32, per step */
#define PREFILL_NS_BLOCK 0.055 /* a K/V element read by one score block of one head */

double prefill_cost(const model_hparams *hp, int n_prompt, int n_past, int rows, int attn_rows)
{
    double n = n_prompt, past = n_past, hd = hp->head_dim, L = hp->n_layer;
    double q_dim = (double)hp->n_head * hd, kv_dim = (double)hp->n_head_kv * hd;
    /* a prefill's rows reach every expert */
    double ffn = 3.0 * hp->dim *
                 (hp->n_expert ? (double)hp->n_expert * hp->n_ff_exp + hp->n_ff_shexp : hp->n_ff);
    double layer = 2 * hp->dim * q_dim + 2 * hp->dim * kv_dim + ffn;
    double steps = ceil(n / rows);
    /* the K/V a step sees, on average over the steps: the history and half the prompt */
    double ctx = past + n / 2 + rows / 2.0;
    /* fewer than PREFILL_GEMM_MIN rows take the per-row path: a block of one row */
    double a = rows < PREFILL_GEMM_MIN ? 1 : attn_rows < rows ? attn_rows : rows;
    double blocks = steps * ceil(rows / a) * hp->n_head;
    return steps * (PREFILL_NS_WEIGHT * L * layer + PREFILL_NS_KV_DEC * L * 2 * kv_dim * ctx) +
           PREFILL_NS_BLOCK * L * blocks * 2 * hd * ctx;
}

int prefill_plan_make(const model *m, const prefill_request *req, prefill_plan *out,
                      char err[ERR_MAX])
{
    if (prefill_check(req, err) < 0)
        return -1;
    const model_hparams *hp = model_hparams_of(m);
    int ctx = req->n_past + req->n_prompt;
    ctx = req->max_kv > ctx ? req->max_kv : ctx;
    int r0 = req->max_rows > 0 && req->max_rows < req->n_prompt ? req->max_rows : req->n_prompt;
    memset(out, 0, sizeof *out);
    out->req = *req;
    out->whole = prefill_estimate_of(hp, r0, r0, ctx, req->n_threads, req->kv);
    kv_shape shape = model_kv_shape(m);
    int n_kv = req->n_past + req->n_prompt;
    out->kv_bytes = kv_chunk_data_bytes(shape, req->kv) *
                    (size_t)((n_kv + KV_CHUNK_TOKENS - 1) / KV_CHUNK_TOKENS);
    out->weights = model_weight_residency(m, req->resident_small);
    out->weights_window = req->resident_small == SIZE_MAX ? 0 : 2 * out->weights.layer_max;

    /* score blocks of more rows only cost cache misses (bench/longprompt: whole-step
     * scores are slower), so even the least partitioned plan keeps the engine's blocks */
    int a0 = r0 < MODEL_ATTN_ROWS_DEFAULT ? r0 : MODEL_ATTN_ROWS_DEFAULT;
    out->est = prefill_estimate_of(hp, r0, a0, ctx, req->n_threads, req->kv);
    out->cost = prefill_cost(hp, req->n_prompt, req->n_past, r0, a0);
    if (prefill_fits(req, &out->est)) {
        out->pressure = PREFILL_WHOLE;
        return 0;
    }
    /* Otherwise the cheapest partitioning that fits: the least partitioned one can be
     * far from it (8K tokens under 16 MiB: 64-row steps with 2-row score blocks took
     * 1.8x the unpartitioned time, bench/longprompt). Row counts and blocks halve. */
    bool found = false;
    for (int rows = r0; rows >= 1; rows /= 2) {
        int amax = rows < MODEL_ATTN_ROWS_DEFAULT ? rows : MODEL_ATTN_ROWS_DEFAULT;
        for (int a = amax; a >= 1; a /= 2) {
            prefill_estimate e = prefill_estimate_of(hp, rows, a, ctx, req->n_threads, req->kv);
            if (!prefill_fits(req, &e))
                continue;
            double c = prefill_cost(hp, req->n_prompt, req->n_past, rows, a);
            if (!found || c < out->cost) {
                out->est = e;
                out->cost = c;
                out->pressure = rows == r0 ? PREFILL_MODERATE : PREFILL_SEVERE;
                found = true;
            }
        }
    }
    if (found)
        return 0;
    /* the smallest partitioning, one row per step, named in the error */
    out->est = prefill_estimate_of(hp, 1, 1, ctx, req->n_threads, req->kv);
    return err_set(err, "prompt of %d tokens (after %d) needs at least %.1f MiB of prefill "
                        "memory even partitioned to one row per step; the budget is %.1f MiB",
                   req->n_prompt, req->n_past, (double)out->est.working / (1 << 20),
                   (double)req->budget / (1 << 20));
}

int prefill_max_prompt(const model *m, const prefill_request *req, int limit)
{
    prefill_request q = *req;
    prefill_plan p;
    char err[ERR_MAX];
    int lo = 0, hi = limit; /* the largest length that fits lies in [lo, hi] */
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        q.n_prompt = mid;
        if (prefill_plan_make(m, &q, &p, err) == 0)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

static double prefill_mib(size_t b)
{
    return (double)b / (1 << 20);
}

void prefill_plan_print(const prefill_plan *p, FILE *out)
{
    static const char *const pressure[] = {"none (whole steps)",
                                           "moderate (scores/softmax/output in row blocks)",
                                           ("severe (every step on row slices, attention in "
                                            "row blocks)")};
    const prefill_estimate *e = &p->est;
    fprintf(out, "prompt %d tokens after %d, %d threads, KV %s\n", p->req.n_prompt,
            p->req.n_past, p->req.n_threads, kv_precision_name(p->req.kv));
    /* the comparison is one unpartitioned step: the prompt, or max_rows of it when the
     * caller (the daemon's scheduler) never runs more rows at once */
    fprintf(out, "%-9s %12s %12s %16s\n", "step", "peak MiB", "kept MiB", "unpart. peak MiB");
    for (int k = 0; k < PREFILL_N_STEPS; k++)
        fprintf(out, "%-9s %12.2f %12.2f %16.2f\n", prefill_step_name(k),
                prefill_mib(e->steps[k].peak), prefill_mib(e->steps[k].retained),
                prefill_mib(p->whole.steps[k].peak));
    if (p->req.budget)
        fprintf(out, "budget %.2f MiB\n", prefill_mib(p->req.budget));
    else
        fprintf(out, "budget none\n");
    fprintf(out, "working %.2f MiB (every step %.2f + max(attention %.2f, mlp %.2f))\n",
            prefill_mib(e->working), prefill_mib(e->every), prefill_mib(e->attn),
            prefill_mib(e->mlp));
    fprintf(out, "unpartitioned (unpart. column): %d-row steps%s, one score block per head, "
                 "working %.2f MiB\n",
            p->whole.rows, p->whole.rows < p->req.n_prompt ? " (the most a step runs)" :
                                                             " (the whole prompt)",
            prefill_mib(p->whole.working));
    fprintf(out, "partitioning: %s: %d rows per step (%d steps), score blocks of %d rows\n",
            pressure[p->pressure], e->rows, (p->req.n_prompt + e->rows - 1) / e->rows,
            e->attn_rows);
    fprintf(out, "model time %.2f s (what the partitioning adds)\n", p->cost / 1e9);
    fprintf(out, "kv %.2f MiB\n", prefill_mib(p->kv_bytes));
    if (p->req.resident_small == SIZE_MAX)
        fprintf(out, "weights: all resident (mapped), %.2f MiB\n",
                prefill_mib(p->weights.resident + p->weights.streamed));
    else
        fprintf(out, "weights: %d fragments resident %.2f MiB, %d streamed %.2f MiB "
                     "(window %.2f MiB)\n",
                p->weights.n_resident, prefill_mib(p->weights.resident), p->weights.n_streamed,
                prefill_mib(p->weights.streamed), prefill_mib(p->weights_window));
}

model_runner_opts prefill_runner_opts(const prefill_plan *p)
{
    return (model_runner_opts){.n_threads = p->req.n_threads, .max_batch = p->est.rows,
                               .max_kv = p->est.ctx, .attn_rows = p->est.attn_rows};
}
