/*
 * The prefill memory plan (engine/model/prefill.h) and the partitioned forward it chooses.
 *
 * - The estimate is held to what the runner really allocates (model_runner_scratch_bytes)
 *   within EST_MARGIN, over shapes, rows, score blocks, contexts and threads.
 * - Partitioned prefill (score blocks of fewer rows: moderate; row slices of the prompt:
 *   severe) gives the unpartitioned path's logits, last hidden rows and K/V within float
 *   rounding: f32 weights, the three architectures (llama: interleaved RoPE; qwen2/qwen3:
 *   halves), GQA and MHA, with a history whose full chunks are compressed (int8, int4).
 *   Sums of products are taken over other blocks and shapes (sgemm vs per-row kernels),
 *   so differences are rounding: TOL (measured ~1e-5 of the logits' scale).
 * - The planner's choices under budgets (the cheapest fitting plan by its time model),
 *   and its refusal naming the bytes needed.
 * - Weight streaming (madvise per layer) changes no result; copied weights refuse it.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/model.h"
#include "engine/gguf/modelgen.h"
#include "engine/model/prefill.h"
#include "engine/quant/quant.h"
#include "tests/support/test.h"

#define EST_MARGIN 0.02
#define TOL 1e-3
#define TOL_KV 1e-2
#define N_HIST 48
#define N_PROMPT 100

static const char *gen(const char *arch, uint32_t type, int n_head, int n_head_kv)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s-%s-%d-%d.gguf", test_tmpdir(), arch,
             quant_traits_of(type)->name, n_head, n_head_kv);
    modelgen_params p = {.arch = arch, .dim = 128, .n_layer = 2, .n_head = n_head,
                         .n_head_kv = n_head_kv, .n_ff = 320, .n_ctx = 512, .type = type,
                         .seed = 5, .n_vocab = 300, .n_threads = 1};
    char err[ERR_MAX];
    if (modelgen_write(&p, path, err) < 0) {
        fprintf(stderr, "modelgen: %s\n", err);
        return NULL;
    }
    return path;
}

static void test_estimate_matches_runner(void)
{
    const char *path = gen("llama", QTYPE_Q8_0, 4, 2);
    CHECK(path);
    char err[ERR_MAX];
    model *m = model_load(path, err);
    CHECK_MSG(m, "%s", err);
    const int rows[] = {1, 8, 16, 100, 512}, blocks[] = {1, 4, 32, 512}, ctxs[] = {64, 2048};
    double worst = 0;
    bool ok = true;
    for (int t = 1; t <= 2 && ok; t++)
        for (size_t i = 0; i < sizeof rows / sizeof rows[0] && ok; i++)
            for (size_t j = 0; j < sizeof blocks / sizeof blocks[0] && ok; j++)
                for (size_t c = 0; c < sizeof ctxs / sizeof ctxs[0] && ok; c++) {
                    model_runner_opts o = {.n_threads = t, .max_batch = rows[i],
                                           .max_kv = ctxs[c], .attn_rows = blocks[j]};
                    model_runner *r = model_runner_new_opts(m, &o, err);
                    if (!r) {
                        fprintf(stderr, "runner: %s\n", err);
                        ok = false;
                        break;
                    }
                    prefill_estimate e = prefill_estimate_of(model_hparams_of(m), rows[i],
                                                             blocks[j], ctxs[c],
                                                             model_runner_n_threads(r), KV_F16);
                    double real = (double)model_runner_scratch_bytes(r);
                    double d = ((double)e.working - real) / real;
                    worst = fabs(d) > fabs(worst) ? d : worst;
                    model_runner_free(r);
                    if (fabs(d) > EST_MARGIN) {
                        fprintf(stderr, "rows %d block %d ctx %d threads %d: estimate %zu vs "
                                        "%.0f\n", rows[i], blocks[j], ctxs[c], t, e.working, real);
                        ok = false;
                    }
                }
    model_free(m);
    printf("   estimate vs allocation: worst %+.2f%%\n", worst * 100);
    CHECK(ok);
}

/* Largest |x - y| over n floats relative to the largest |x| when that is above 1. */
static double max_diff(const float *x, const float *y, size_t n)
{
    double d = 0, scale = 1;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)x[i] - y[i]);
        d = isnan(e) ? 1e9 : e > d ? e : d;
        scale = fabs(x[i]) > scale ? fabs(x[i]) : scale;
    }
    return d / scale;
}

/* Largest difference between two sequences' K/V (1e9 when their chunks differ in
 * count, ids, positions or precision). */
static double kv_diff(const kv_pool *pool, const kv_seq *a, const kv_seq *b)
{
    if (a->n_chunks != b->n_chunks)
        return 1e9;
    kv_shape shape = kv_pool_shape(pool);
    size_t n = (size_t)KV_CHUNK_TOKENS * shape.head_dim;
    float *buf = malloc(4 * n * sizeof(float));
    if (!buf)
        return 1e9;
    double d = 0;
    for (int c = 0; c < a->n_chunks && d < 1e9; c++) {
        const kv_chunk *x = a->chunks[c], *y = b->chunks[c];
        if (x->n_tokens != y->n_tokens || x->precision != y->precision ||
            memcmp(x->positions, y->positions, (size_t)x->n_tokens * sizeof(int32_t))) {
            d = 1e9;
            break;
        }
        for (int l = 0; l < shape.n_layer; l++)
            for (int h = 0; h < shape.n_head_kv; h++) {
                kv_chunk_read_f32(x, shape, l, h, buf, buf + n);
                kv_chunk_read_f32(y, shape, l, h, buf + 2 * n, buf + 3 * n);
                size_t used = (size_t)x->n_tokens * shape.head_dim;
                double e = max_diff(buf, buf + 2 * n, used);
                double f = max_diff(buf + n, buf + 3 * n, used);
                d = e > d ? e : d;
                d = f > d ? f : d;
            }
    }
    free(buf);
    return d;
}

/* One (rows per step, score block) partitioning against the unpartitioned path. */
typedef struct part_case {
    int rows, attn_rows;
} part_case;

/* Prefills N_PROMPT tokens after a history of N_HIST (full chunks compressed to hist_p)
 * once unpartitioned and once per case; returns the worst relative difference of logits
 * and hidden rows in *d_out and of K/V in *d_kv, or -1 on an engine error. */
static int compare_paths(const char *path, enum kv_precision hist_p, const part_case *cases,
                         int n_cases, double *d_out, double *d_kv)
{
    char err[ERR_MAX];
    int rc = -1;
    model *m = model_load(path, err);
    if (!m) {
        fprintf(stderr, "load: %s\n", err);
        return -1;
    }
    const model_hparams *hp = model_hparams_of(m);
    int nv = hp->n_vocab, dim = hp->dim, n_kv = N_HIST + N_PROMPT;
    int32_t tok[N_HIST + N_PROMPT], pos[N_HIST + N_PROMPT], outs[] = {0, 37, N_PROMPT - 1};
    for (int i = 0; i < n_kv; i++)
        tok[i] = (i * 53 + 7) % nv, pos[i] = i;
    int n_out = (int)(sizeof outs / sizeof outs[0]);
    float *lw = malloc(sizeof(float) * n_out * (nv + dim) * 2), *hw = lw + n_out * nv;
    float *lp = hw + n_out * dim, *hpart = lp + n_out * nv;
    kv_pool *pool = kv_pool_new(model_kv_shape(m), 0, err);
    model_runner_opts wo = {.n_threads = 2, .max_batch = N_PROMPT, .max_kv = n_kv,
                            .attn_rows = N_PROMPT};
    model_runner *whole = model_runner_new_opts(m, &wo, err);
    kv_seq a, b;
    if (!lw || !pool || !whole)
        goto out;
    kv_seq_init(&a, pool);
    kv_seq_init(&b, pool);
    *d_out = *d_kv = 0;
    for (int c = 0; c < n_cases; c++) {
        model_runner_opts po = {.n_threads = 2, .max_batch = cases[c].rows, .max_kv = n_kv,
                                .attn_rows = cases[c].attn_rows};
        model_runner *part = model_runner_new_opts(m, &po, err);
        if (!part)
            goto fail;
        model_batch hist = {.n_tokens = N_HIST, .tokens = tok, .positions = pos};
        kv_seq_truncate(&a, 0);
        kv_seq_truncate(&b, 0);
        bool ok = model_forward(whole, &a, &hist, err) == 0 &&
                  model_forward(whole, &b, &hist, err) == 0;
        for (int i = 0; ok && hist_p != KV_F16 && i < a.n_chunks; i++)
            if (a.chunks[i]->n_tokens == KV_CHUNK_TOKENS)
                ok = kv_chunk_convert(pool, a.chunks[i], hist_p, err) == 0 &&
                     kv_chunk_convert(pool, b.chunks[i], hist_p, err) == 0;
        model_batch bw = {.n_tokens = N_PROMPT, .tokens = tok + N_HIST, .positions = pos + N_HIST,
                          .n_out = n_out, .out_rows = outs, .logits = lw, .hidden_last = hw};
        model_batch bp = bw;
        bp.logits = lp, bp.hidden_last = hpart;
        ok = ok && model_forward(whole, &a, &bw, err) == 0 && model_forward(part, &b, &bp, err) == 0;
        model_runner_free(part);
        if (!ok)
            goto fail;
        double d = max_diff(lw, lp, (size_t)n_out * nv), h = max_diff(hw, hpart, (size_t)n_out * dim);
        double k = kv_diff(pool, &a, &b);
        d = h > d ? h : d;
        *d_out = d > *d_out ? d : *d_out;
        *d_kv = k > *d_kv ? k : *d_kv;
    }
    rc = 0;
fail:
    if (rc < 0)
        fprintf(stderr, "forward: %s\n", err);
    kv_seq_free(&a);
    kv_seq_free(&b);
out:
    model_runner_free(whole);
    kv_pool_free(pool);
    free(lw);
    model_free(m);
    return rc;
}

static void test_partitioned_equals_whole(void)
{
    /* moderate (blocks of 8 and 1 row), severe (slices of 24, 33 and 64 rows), and slices
     * under MODEL_ATTN_GEMM_MIN rows, which take the per-row attention */
    const part_case cases[] = {{N_PROMPT, 8}, {N_PROMPT, 1}, {24, 4}, {33, 32}, {64, 16}, {10, 10}};
    const char *archs[] = {"llama", "qwen2", "qwen3"};
    const int kv_heads[] = {1, 4};
    const enum kv_precision hist[] = {KV_F16, KV_INT8, KV_INT4};
    double worst = 0, worst_kv = 0;
    for (int a = 0; a < 3; a++)
        for (int g = 0; g < 2; g++) {
            const char *path = gen(archs[a], QTYPE_F32, 4, kv_heads[g]);
            CHECK(path);
            for (int h = 0; h < 3; h++) {
                double d, k;
                CHECK(compare_paths(path, hist[h], cases, (int)(sizeof cases / sizeof cases[0]),
                                    &d, &k) == 0);
                CHECK_MSG(d <= TOL && k <= TOL_KV, "%s kv_heads %d history %s: outputs %g, "
                          "K/V %g", archs[a], kv_heads[g], kv_precision_name(hist[h]), d, k);
                worst = d > worst ? d : worst;
                worst_kv = k > worst_kv ? k : worst_kv;
            }
        }
    printf("   partitioned vs whole: outputs %.2g, K/V %.2g\n", worst, worst_kv);
}

static void test_plan_choices(void)
{
    const char *path = gen("llama", QTYPE_Q8_0, 4, 1);
    CHECK(path);
    char err[ERR_MAX];
    model *m = model_load(path, err);
    CHECK_MSG(m, "%s", err);
    /* steps of 512 rows over 16384 entries: the score blocks outweigh the MLP's rows */
    prefill_request req = {.n_prompt = 16384, .max_rows = 512, .n_threads = 2, .kv = KV_F16,
                           .resident_small = SIZE_MAX};
    prefill_plan p;
    bool ok = prefill_plan_make(m, &req, &p, err) == 0 && p.pressure == PREFILL_WHOLE &&
              p.est.rows == 512 && p.est.attn_rows == MODEL_ATTN_ROWS_DEFAULT &&
              p.whole.rows == 512 && p.whole.attn_rows == 512;
    /* the unpartitioned path holds two threads' scores of 512 x 16384 floats: 64 MiB */
    ok = ok && p.whole.working > (64u << 20) && p.est.working < (16u << 20);
    const model_hparams *hp = model_hparams_of(m);
    prefill_estimate e1 = prefill_estimate_of(hp, 512, 1, 16384, 2, KV_F16);
    /* between the two, some partitioning fits: whole steps with smaller score blocks
     * (moderate) or slices (severe), whichever prefill_cost finds cheaper */
    req.budget = (e1.working + p.est.working) / 2;
    ok = ok && e1.working < p.est.working && prefill_plan_make(m, &req, &p, err) == 0 &&
         p.pressure == (p.est.rows == 512 ? PREFILL_MODERATE : PREFILL_SEVERE) &&
         (p.est.rows < 512 || p.est.attn_rows < MODEL_ATTN_ROWS_DEFAULT) &&
         p.est.working <= req.budget;
    req.budget = e1.working - 1;
    ok = ok && prefill_plan_make(m, &req, &p, err) == 0 && p.pressure == PREFILL_SEVERE &&
         p.est.rows < 512 && p.est.working <= req.budget;
    /* every step's peak is within what the runner allocates */
    for (int k = 0; ok && k < PREFILL_N_STEPS; k++)
        ok = p.est.steps[k].peak <= p.est.working;
    int n_max = ok ? prefill_max_prompt(m, &req, 1 << 20) : 0;
    req.n_prompt = n_max + 1;
    ok = ok && n_max >= 16384 && prefill_plan_make(m, &req, &p, err) < 0 &&
         strstr(err, "needs at least") && strstr(err, "MiB");
    req.n_prompt = 0;
    ok = ok && prefill_plan_make(m, &req, &p, err) < 0;
    model_free(m);
    CHECK(ok);
}

/* Under a budget where two partitionings fit, the planner takes the one prefill_cost
 * finds cheaper, not the least partitioned one: 512-row steps with 1-row score blocks
 * (what the planner took before) against 128-row steps with the engine's blocks. Then,
 * over budgets from tight to loose, nothing that fits is cheaper than its choice. */
static void test_plan_cheapest(void)
{
    const char *path = gen("llama", QTYPE_Q8_0, 4, 1);
    CHECK(path);
    char err[ERR_MAX];
    model *m = model_load(path, err);
    CHECK_MSG(m, "%s", err);
    const model_hparams *hp = model_hparams_of(m);
    prefill_request req = {.n_prompt = 16384, .max_rows = 512, .n_threads = 2, .kv = KV_F16,
                           .resident_small = SIZE_MAX};
    prefill_estimate slim = prefill_estimate_of(hp, 512, 1, 16384, 2, KV_F16);
    prefill_estimate sliced = prefill_estimate_of(hp, 128, MODEL_ATTN_ROWS_DEFAULT, 16384, 2,
                                                  KV_F16);
    double c_slim = prefill_cost(hp, 16384, 0, 512, 1);
    double c_sliced = prefill_cost(hp, 16384, 0, 128, MODEL_ATTN_ROWS_DEFAULT);
    /* the model: K/V read once per 1-row block outweighs 4x the steps */
    bool ok = c_sliced < c_slim && prefill_cost(hp, 16384, 0, 512, 2) < c_slim &&
              prefill_cost(hp, 16384, 0, 64, MODEL_ATTN_ROWS_DEFAULT) > c_sliced;
    req.budget = slim.working > sliced.working ? slim.working : sliced.working;
    prefill_plan p;
    ok = ok && prefill_plan_make(m, &req, &p, err) == 0 && p.cost <= c_sliced &&
         p.est.working <= req.budget && p.cost == prefill_cost(hp, 16384, 0, p.est.rows,
                                                                p.est.attn_rows);
    for (size_t budget = 4u << 20; ok && budget <= (64u << 20); budget += 1u << 20) {
        req.budget = budget;
        if (prefill_plan_make(m, &req, &p, err) < 0 || p.pressure == PREFILL_WHOLE)
            continue;
        for (int rows = 512; ok && rows >= 1; rows /= 2)
            for (int a = rows < MODEL_ATTN_ROWS_DEFAULT ? rows : MODEL_ATTN_ROWS_DEFAULT;
                 ok && a >= 1; a /= 2)
                if (prefill_estimate_of(hp, rows, a, 16384, 2, KV_F16).working <= budget &&
                    prefill_cost(hp, 16384, 0, rows, a) < p.cost) {
                    fprintf(stderr, "budget %zu: %d/%d is cheaper than the choice %d/%d\n",
                            budget, rows, a, p.est.rows, p.est.attn_rows);
                    ok = false;
                }
    }
    model_free(m);
    CHECK(ok);
}

static void test_plan_print(void)
{
    const char *path = gen("qwen2", QTYPE_Q8_0, 4, 2);
    CHECK(path);
    char err[ERR_MAX], *text = NULL;
    size_t len = 0;
    model *m = model_load(path, err);
    CHECK_MSG(m, "%s", err);
    prefill_request req = {.n_prompt = 2000, .n_threads = 2, .kv = KV_INT8,
                           .budget = 8u << 20, .resident_small = 64 << 10};
    prefill_plan p;
    int rc = prefill_plan_make(m, &req, &p, err);
    FILE *f = open_memstream(&text, &len);
    if (rc == 0 && f)
        prefill_plan_print(&p, f);
    if (f)
        fclose(f);
    model_free(m);
    CHECK_MSG(rc == 0, "%s", err);
    CHECK(text && strstr(text, "scores") && strstr(text, "softmax") && strstr(text, "mlp") &&
          strstr(text, "budget 8.00 MiB") && strstr(text, "partitioning:") &&
          strstr(text, "streamed"));
    free(text);
}

/* Streaming weights through madvise leaves every result as it was; copied weights
 * cannot stream. */
static void test_stream_weights(void)
{
    const char *path = gen("llama", QTYPE_Q8_0, 4, 2);
    CHECK(path);
    char err[ERR_MAX];
    model *m = model_load(path, err), *c = model_load_as(path, GGUF_LOAD_COPY, err);
    CHECK_MSG(m && c, "%s", err);
    const model_hparams *hp = model_hparams_of(m);
    model_runner *r = model_runner_new(m, 2, 128, 256, err), *rc = model_runner_new(c, 1, 16, 64, err);
    kv_pool *pool = kv_pool_new(model_kv_shape(m), 0, err);
    CHECK_MSG(r && rc && pool, "%s", err);
    CHECK(model_runner_stream_weights(rc, 0, err) < 0 && strstr(err, "mapped"));
    model_residency res = model_weight_residency(m, 64 << 10);
    CHECK(res.n_streamed > 0 && res.n_resident > 0 && res.layer_max > 0 &&
          res.resident <= 64 << 10);
    int32_t tok[128], pos[128], last = 127;
    for (int i = 0; i < 128; i++)
        tok[i] = (i * 13 + 1) % hp->n_vocab, pos[i] = i;
    float *l0 = malloc(2 * (size_t)hp->n_vocab * sizeof(float)), *l1 = l0 + hp->n_vocab;
    kv_seq s0, s1;
    kv_seq_init(&s0, pool);
    kv_seq_init(&s1, pool);
    model_batch b = {.n_tokens = 128, .tokens = tok, .positions = pos, .n_out = 1,
                     .out_rows = &last, .logits = l0};
    bool ok = l0 && model_forward(r, &s0, &b, err) == 0;
    b.logits = l1;
    ok = ok && model_runner_stream_weights(r, 64 << 10, err) == 0 &&
         model_forward(r, &s1, &b, err) == 0;
    ok = ok && memcmp(l0, l1, (size_t)hp->n_vocab * sizeof(float)) == 0;
    kv_seq_free(&s0);
    kv_seq_free(&s1);
    free(l0);
    kv_pool_free(pool);
    model_runner_free(r);
    model_runner_free(rc);
    model_free(m);
    model_free(c);
    CHECK_MSG(ok, "%s", err);
}

int main(void)
{
    RUN(test_estimate_matches_runner);
    RUN(test_partitioned_equals_whole);
    RUN(test_plan_choices);
    RUN(test_plan_cheapest);
    RUN(test_plan_print);
    RUN(test_stream_weights);
    return test_finish();
}
