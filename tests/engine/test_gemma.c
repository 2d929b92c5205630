/*
 * Google's Gemma family (gemma, gemma2, gemma3) in the decoder engine, against the
 * double-precision reference (tests/support/ref_forward.c, written from HF transformers'
 * modeling_gemma / modeling_gemma2 / modeling_gemma3).
 *
 * Models are modelgen's on a synthetic vocabulary, shaped so that the Gemma parts matter:
 * a sliding window of W_SMALL positions (far shorter than the sequences), gemma2's
 * soft-caps low enough to bend (attention 2, logits 1.5, where Gemma 2's 50 and 30 hardly
 * touch unit-scale random weights), gemma3 with both kinds of layer (7 layers: 0-4 and 6
 * sliding, 5 global) and linear rope scaling of 8 on its global layer. Every attention
 * path is checked: per-row decode, sgemm prefill, sub-batches, the partitioned prefill
 * (score blocks and row slices), compressed KV chunks, sequences stacked in one step.
 * Tolerances are test_model.c's (TOL_FLOAT for float weights, TOL_QUANT for 8-bit
 * activations, TOL_KV_* for compressed chunks); bit equality where the engine promises it.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf/gguf.h"
#include "engine/gguf/modelgen.h"
#include "engine/model/model.h"
#include "engine/model/prefill.h"
#include "engine/quant/quant.h"
#include "tests/support/model_check.h"
#include "tests/support/ref_forward.h"
#include "tests/support/test.h"

#define TOL_FLOAT 0.02
#define TOL_QUANT 0.2
#define TOL_KV_INT8 0.06
#define TOL_KV_INT4 0.8
#define TOL_PART 1e-3 /* partitioned vs whole prefill, relative (test_prefill.c's TOL) */
#define W_SMALL 8
#define N_VOCAB 260

static const char *ARCHS[] = {"gemma", "gemma2", "gemma3"};

static modelgen_params gemma_params(const char *arch, uint32_t type)
{
    bool g3 = !strcmp(arch, "gemma3");
    return (modelgen_params){.arch = arch, .dim = 128, .n_layer = g3 ? 7 : 3, .n_head = 4,
                             .n_head_kv = 2, .n_ff = 256, .n_ctx = 512, .type = type, .seed = 9,
                             .n_vocab = N_VOCAB, .n_threads = 1, .sliding_window = W_SMALL,
                             .attn_softcap = 2.0f, .final_softcap = 1.5f,
                             .rope_linear = g3 ? 8.0f : 0.0f};
}

static const char *gen(const modelgen_params *p, const char *name)
{
    static char path[4][512];
    static int k;
    char *out = path[k++ % 4];
    snprintf(out, sizeof path[0], "%s/%s.gguf", test_tmpdir(), name);
    char err[ERR_MAX];
    if (modelgen_write(p, out, err) < 0) {
        fprintf(stderr, "modelgen: %s\n", err);
        return NULL;
    }
    return out;
}

static int32_t tok_at(int i)
{
    return (int32_t)((i * 37 + 11) % N_VOCAB);
}

/* A prefill of 40 (past the window 5 times), 6 decodes, then a fresh sequence with gapped
 * and out-of-order batches (positions 0..7, 30..37, then 12..15 after them): the window
 * and the mask are by position. */
static const model_check_plan PLAN = {.n_prefill = 40, .n_total = 46, .gap_b = 30, .gap_c = 12};

/* ---- hyper-parameters ---- */

static void test_metadata(void)
{
    char err[ERR_MAX];
    for (int a = 0; a < 3; a++) {
        modelgen_params p = gemma_params(ARCHS[a], QTYPE_F32);
        model *m = model_load(gen(&p, "meta"), err);
        CHECK_MSG(m, "%s: %s", ARCHS[a], err);
        const model_hparams *hp = model_hparams_of(m);
        CHECK_EQ(hp->arch, (int)MODEL_ARCH_GEMMA + a);
        CHECK(!strcmp(model_arch_name(hp->arch), ARCHS[a]));
        CHECK_EQ(hp->rope_style, MODEL_ROPE_HALVES);
        CHECK_EQ(hp->ffn_act, MODEL_FFN_GELU_TANH);
        CHECK_NEAR(hp->embd_scale, sqrt(128.0), 1e-5);
        CHECK_NEAR(hp->attn_scale, 1 / sqrt(32.0), 1e-7);
        CHECK_NEAR(hp->norm_eps, 1e-6, 1e-12);
        CHECK(hp->post_norms == (a > 0));
        CHECK_NEAR(hp->attn_softcap, a == 1 ? 2.0 : 0.0, 1e-6);
        CHECK_NEAR(hp->final_softcap, a == 1 ? 1.5 : 0.0, 1e-6);
        CHECK(hp->rope_swa == (a == 2));
        CHECK_EQ(hp->swa_window, a == 0 ? 0 : W_SMALL);
        for (int l = 0; l < hp->n_layer; l++) {
            /* gemma2: the even layers slide (HF: not layer_idx % 2); gemma3: all but
             * (l + 1) % 6 == 0 */
            bool sliding = a == 1 ? l % 2 == 0 : a == 2 ? (l + 1) % 6 != 0 : false;
            CHECK_MSG(model_layer_window(hp, l) == (sliding ? W_SMALL : 0), "%s layer %d",
                      ARCHS[a], l);
        }
        if (a == 2) { /* the global layers' base and linear factor 8; local ones fixed */
            CHECK_NEAR(hp->rope_base, 1e6, 1);
            CHECK_NEAR(hp->rope_scaling.freq_scale, 1.0 / 8, 1e-7);
            CHECK_NEAR(hp->rope_base_swa, 1e4, 1e-3);
        }
        model_free(m);
    }
    /* gemma2's defaults (llama.cpp's) when the keys are absent: window 4096, caps 50 / 30 */
    modelgen_params p = gemma_params("gemma2", QTYPE_F32);
    p.sliding_window = 0, p.attn_softcap = 0, p.final_softcap = 0;
    model *m = model_load(gen(&p, "dflt"), err);
    CHECK_MSG(m, "%s", err);
    CHECK_EQ(model_hparams_of(m)->swa_window, 4096);
    CHECK_NEAR(model_hparams_of(m)->attn_softcap, 50, 1e-6);
    CHECK_NEAR(model_hparams_of(m)->final_softcap, 30, 1e-6);
    model_free(m);
    /* the query scale of 27B shapes (46 layers gemma2, 62 gemma3, head_dim 16 where
     * dim / n_head is 32): 1/sqrt(dim / n_head), as llama.cpp and HF's
     * query_pre_attn_scalar; another depth of that shape: 1/sqrt(head_dim) */
    const struct {
        const char *arch;
        int layers;
        double scale;
    } shapes[] = {{"gemma2", 46, 1 / sqrt(32.0)}, {"gemma3", 62, 1 / sqrt(32.0)},
                  {"gemma2", 4, 1 / sqrt(16.0)},  {"gemma3", 4, 1 / sqrt(16.0)}};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        modelgen_params q = {.arch = shapes[i].arch, .dim = 64, .n_layer = shapes[i].layers,
                             .n_head = 2, .n_head_kv = 1, .head_dim = 16, .n_ff = 64,
                             .n_ctx = 64, .type = QTYPE_F16, .seed = 1, .n_vocab = 32,
                             .n_threads = 2};
        m = model_load(gen(&q, "27b"), err);
        CHECK_MSG(m, "%s", err);
        CHECK_MSG(fabs(model_hparams_of(m)->attn_scale - shapes[i].scale) < 1e-7,
                  "%s %d layers: %g", shapes[i].arch, shapes[i].layers,
                  (double)model_hparams_of(m)->attn_scale);
        model_free(m);
    }
}

/* ---- the forward against the reference ---- */

static void test_logits_vs_reference(void)
{
    const uint32_t types[] = {QTYPE_F32, QTYPE_F16, QTYPE_Q8_0, QTYPE_Q4_0};
    for (int a = 0; a < 3; a++)
        for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
            modelgen_params p = gemma_params(ARCHS[a], types[t]);
            const char *path = gen(&p, "ref");
            CHECK(path);
            double tol = types[t] == QTYPE_F32 || types[t] == QTYPE_F16 ? TOL_FLOAT : TOL_QUANT;
            /* 512: the 40-row prefill takes sgemm attention; 8: dot kernels and per-row
             * attention in sub-batches */
            double d1 = model_check_file(path, 512, 2, &PLAN), d2 = model_check_file(path, 8, 1, &PLAN);
            printf("  %s %s: max |logit diff| %.4g (sgemm) %.4g (per row)\n", ARCHS[a],
                   quant_traits_of(types[t])->name, d1, d2);
            CHECK_MSG(d1 <= tol && d2 <= tol, "%s %s: %g %g > %g", ARCHS[a],
                      quant_traits_of(types[t])->name, d1, d2, tol);
        }
}

/* The window, the caps and gemma3's local RoPE change the logits by far more than the
 * tolerance: the reference of the model without them differs, and the engine follows the
 * one with them (so the comparisons above would catch an engine that ignored them). */
static void test_gemma_parts_matter(void)
{
    enum { N = 40 };
    int32_t tok[N], pos[N];
    for (int i = 0; i < N; i++)
        tok[i] = tok_at(i), pos[i] = i;
    double *with = malloc(sizeof(double) * N * N_VOCAB), *without = malloc(sizeof(double) * N * N_VOCAB);
    const struct {
        const char *arch, *what;
        int window;
        float caps;
        float rope_linear;
    } cases[] = {{"gemma2", "window", 4096, 2.0f, 0},
                 {"gemma2", "soft-caps", W_SMALL, 1000.0f, 0},
                 {"gemma3", "window", 4096, 0, 8.0f},
                 {"gemma3", "global rope scaling", W_SMALL, 0, 1.0f}};
    char err[ERR_MAX];
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        modelgen_params p = gemma_params(cases[c].arch, QTYPE_F32), q = p;
        q.sliding_window = cases[c].window;
        if (cases[c].caps > 0)
            q.attn_softcap = q.final_softcap = cases[c].caps;
        q.rope_linear = cases[c].rope_linear;
        const char *pp = gen(&p, "with"), *qq = gen(&q, "without");
        gguf_file *gp = gguf_open(pp, err), *gq = gguf_open(qq, err);
        ref_model *rp = ref_model_load(gp), *rq = ref_model_load(gq);
        CHECK(rp && rq);
        ref_forward(rp, N, tok, pos, with, NULL, NULL);
        ref_forward(rq, N, tok, pos, without, NULL, NULL);
        double d = 0;
        for (size_t i = 0; i < (size_t)N * N_VOCAB; i++)
            d = fmax(d, fabs(with[i] - without[i]));
        printf("  %s %s: the reference moves by %.3g\n", cases[c].arch, cases[c].what, d);
        CHECK_MSG(d > 10 * TOL_FLOAT, "%s %s: %g", cases[c].arch, cases[c].what, d);
        ref_model_free(rp), ref_model_free(rq);
        gguf_close(gp), gguf_close(gq);
    }
    free(with), free(without);
}

/* Attention probabilities of a prefill (both paths) are the reference's: 0 outside the
 * window on the sliding layers, and the caps applied before the softmax. */
static void test_attention_probabilities(void)
{
    char err[ERR_MAX];
    for (int a = 1; a < 3; a++) {
        modelgen_params p = gemma_params(ARCHS[a], QTYPE_F32);
        model *m = model_load(gen(&p, "attn"), err);
        CHECK_MSG(m, "%s", err);
        ref_model *rm = ref_model_load(model_gguf(m));
        CHECK(rm);
        const model_hparams *hp = model_hparams_of(m);
        enum { N = 30 };
        int32_t tok[N], pos[N];
        for (int i = 0; i < N; i++)
            tok[i] = tok_at(i), pos[i] = i;
        size_t na = (size_t)hp->n_layer * hp->n_head * N * N;
        double *ra = malloc(na * sizeof(double)), *rl = malloc(sizeof(double) * N * N_VOCAB);
        float *attn = malloc(na * sizeof(float));
        ref_forward(rm, N, tok, pos, rl, NULL, ra);
        for (int mb = 8; mb <= 512; mb *= 64) {
            model_runner *r = model_runner_new(m, 2, mb, 0, err);
            kv_pool *pool = kv_pool_new(model_kv_shape(m), 0, err);
            kv_seq s;
            kv_seq_init(&s, pool);
            model_batch b = {.n_tokens = N, .tokens = tok, .positions = pos, .attn = attn};
            CHECK(model_forward(r, &s, &b, err) == 0);
            double worst = 0;
            bool zero_outside = true;
            for (int l = 0; l < hp->n_layer; l++)
                for (int h = 0; h < hp->n_head; h++)
                    for (int t = 0; t < N; t++)
                        for (int j = 0; j < N; j++) {
                            size_t i = (((size_t)l * hp->n_head + h) * N + t) * N + j;
                            worst = fmax(worst, fabs(attn[i] - ra[i]));
                            int w = model_layer_window(hp, l);
                            if (w > 0 && t - j >= w)
                                zero_outside = zero_outside && attn[i] == 0.0f;
                        }
            printf("  %s max batch %d: max |attention diff| %.2g\n", ARCHS[a], mb, worst);
            CHECK(worst < 2e-3);
            CHECK(zero_outside);
            kv_seq_free(&s);
            kv_pool_free(pool);
            model_runner_free(r);
        }
        free(ra), free(rl), free(attn);
        ref_model_free(rm);
        model_free(m);
    }
}

/* A prefill of 48 tokens gives the logits of 48 single-token decodes (sgemm attention over
 * f32 K/V against per-row attention over f16 blocks: rounding apart). */
static void test_prefill_equals_decode(void)
{
    enum { N = 48 };
    char err[ERR_MAX];
    int32_t tok[N], pos[N];
    for (int i = 0; i < N; i++)
        tok[i] = tok_at(i * 3 + 1), pos[i] = i;
    float *a = malloc(sizeof(float) * N * N_VOCAB), *b = malloc(sizeof(float) * N * N_VOCAB);
    for (int k = 0; k < 3; k++) {
        modelgen_params p = gemma_params(ARCHS[k], QTYPE_F32);
        model *m = model_load(gen(&p, "pd"), err);
        CHECK_MSG(m, "%s", err);
        model_runner *r = model_runner_new(m, 2, 0, 0, err);
        kv_pool *pool = kv_pool_new(model_kv_shape(m), 0, err);
        CHECK(model_check_run(r, pool, N_VOCAB, N, tok, pos, false, a) == 0);
        CHECK(model_check_run(r, pool, N_VOCAB, N, tok, pos, true, b) == 0);
        double d = model_check_max_rel(a, b, (size_t)N * N_VOCAB);
        printf("  %s: prefill vs decode %.2g\n", ARCHS[k], d);
        CHECK(d <= TOL_PART);
        kv_pool_free(pool);
        model_runner_free(r);
        model_free(m);
    }
    free(a), free(b);
}

/* Three sequences past the window advanced in one step (two decode rows and a slice of 5,
 * 7 stacked rows) give each one's logits alone, bit for bit (f32 weights: per-row dot
 * kernels, per-row attention, as alone). */
static void test_batched_equals_alone(void)
{
    char err[ERR_MAX];
    for (int k = 1; k < 3; k++) {
        modelgen_params p = gemma_params(ARCHS[k], QTYPE_F32);
        model *m = model_load(gen(&p, "bat"), err);
        CHECK_MSG(m, "%s", err);
        model_runner *r = model_runner_new(m, 2, 64, 128, err);
        kv_pool *pool = kv_pool_new(model_kv_shape(m), 0, err);
        const int hist[3] = {30, 45, 12}, step[3] = {1, 1, 5};
        int32_t tok[3][64], pos[3][64];
        for (int s = 0; s < 3; s++)
            for (int i = 0; i < 64; i++)
                tok[s][i] = tok_at(i * (s + 2) + s), pos[s][i] = i;
        float *alone = malloc(sizeof(float) * 7 * N_VOCAB), *stacked = malloc(sizeof(float) * 7 * N_VOCAB);
        int32_t rows[5] = {0, 1, 2, 3, 4};
        kv_seq seq[2][3];
        for (int v = 0; v < 2; v++)
            for (int s = 0; s < 3; s++) {
                kv_seq_init(&seq[v][s], pool);
                model_batch h = {.n_tokens = hist[s], .tokens = tok[s], .positions = pos[s]};
                CHECK(model_forward(r, &seq[v][s], &h, err) == 0);
            }
        model_batch bs[3];
        int off = 0;
        for (int s = 0; s < 3; s++) {
            bs[s] = (model_batch){.n_tokens = step[s], .tokens = tok[s] + hist[s],
                                  .positions = pos[s] + hist[s], .n_out = step[s],
                                  .out_rows = rows, .logits = alone + (size_t)off * N_VOCAB};
            CHECK(model_forward(r, &seq[0][s], &bs[s], err) == 0);
            bs[s].logits = stacked + (size_t)off * N_VOCAB;
            off += step[s];
        }
        kv_seq *ptrs[3] = {&seq[1][0], &seq[1][1], &seq[1][2]};
        CHECK_MSG(model_forward_batch(r, 3, ptrs, bs, err) == 0, "%s", err);
        CHECK_MSG(memcmp(alone, stacked, sizeof(float) * 7 * N_VOCAB) == 0, "%s: %g", ARCHS[k],
                  model_check_max_rel(alone, stacked, (size_t)7 * N_VOCAB));
        for (int v = 0; v < 2; v++)
            for (int s = 0; s < 3; s++)
                kv_seq_free(&seq[v][s]);
        free(alone), free(stacked);
        kv_pool_free(pool);
        model_runner_free(r);
        model_free(m);
    }
}

/* ---- long prompts: the partitioned prefill ---- */

#define N_HIST MODEL_CHECK_HIST
#define N_PROMPT MODEL_CHECK_PROMPT

/* The planner's moderate (score blocks of fewer rows) and severe (row slices) plans under
 * budgets, and hand-picked partitionings (slices under MODEL_ATTN_GEMM_MIN rows take the
 * per-row path), give the unpartitioned logits: the window bounds every block and slice,
 * the leading chunks no row of a slice sees are not decoded. */
static void test_partitioned_prefill(void)
{
    char err[ERR_MAX];
    const struct {
        int rows, attn_rows;
    } cases[] = {{N_PROMPT, 4}, {N_PROMPT, 1}, {24, 4}, {33, 32}, {10, 10}};
    const enum kv_precision hist[] = {KV_F16, KV_INT8};
    double worst = 0;
    for (int k = 1; k < 3; k++) {
        modelgen_params p = gemma_params(ARCHS[k], QTYPE_F32);
        model *m = model_load(gen(&p, "part"), err);
        CHECK_MSG(m, "%s", err);
        model_runner_opts wo = {.n_threads = 2, .max_batch = N_PROMPT,
                                .max_kv = N_HIST + N_PROMPT, .attn_rows = N_PROMPT};
        model_runner *whole = model_runner_new_opts(m, &wo, err);
        CHECK(whole);
        /* the planner's plans under budgets between the whole step's and one row's */
        prefill_request req = {.n_prompt = N_PROMPT, .n_past = N_HIST, .max_rows = N_PROMPT,
                               .n_threads = 2, .kv = KV_F16, .resident_small = SIZE_MAX};
        prefill_plan plan;
        CHECK(prefill_plan_make(m, &req, &plan, err) == 0);
        size_t full = plan.whole.working;
        req.budget = full;
        size_t one = prefill_estimate_of(model_hparams_of(m), 1, 1, N_HIST + N_PROMPT, 2, KV_F16).working;
        bool seen[3] = {false};
        int last_rows = 0, last_blocks = 0;
        for (int i = 0; i <= 24; i++) {
            req.budget = one + (full - one) * (size_t)i / 24;
            if (prefill_plan_make(m, &req, &plan, err) < 0 ||
                (plan.est.rows == last_rows && plan.est.attn_rows == last_blocks))
                continue;
            last_rows = plan.est.rows, last_blocks = plan.est.attn_rows;
            model_runner_opts po = prefill_runner_opts(&plan);
            po.n_threads = 2;
            model_runner *part = model_runner_new_opts(m, &po, err);
            CHECK(part);
            seen[plan.pressure] = true;
            for (int h = 0; h < 2; h++) {
                double d = model_check_partitioned(m, whole, part, hist[h]);
                CHECK_MSG(d <= TOL_PART, "%s plan rows %d blocks %d: %g", ARCHS[k],
                          plan.est.rows, plan.est.attn_rows, d);
                worst = fmax(worst, d);
            }
            model_runner_free(part);
        }
        CHECK(seen[PREFILL_MODERATE] && seen[PREFILL_SEVERE]);
        for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
            model_runner_opts po = {.n_threads = 2, .max_batch = cases[c].rows,
                                    .max_kv = N_HIST + N_PROMPT, .attn_rows = cases[c].attn_rows};
            model_runner *part = model_runner_new_opts(m, &po, err);
            CHECK(part);
            for (int h = 0; h < 2; h++) {
                double d = model_check_partitioned(m, whole, part, hist[h]);
                CHECK_MSG(d <= TOL_PART, "%s rows %d blocks %d: %g", ARCHS[k], cases[c].rows,
                          cases[c].attn_rows, d);
                worst = fmax(worst, d);
            }
            model_runner_free(part);
        }
        model_runner_free(whole);
        model_free(m);
    }
    printf("  partitioned vs whole: %.2g\n", worst);
}

/* ---- compressed KV ---- */

static void test_compressed_kv(void)
{
    char err[ERR_MAX];
    for (int k = 1; k < 3; k++) {
        modelgen_params p = gemma_params(ARCHS[k], QTYPE_F32);
        model *m = model_load(gen(&p, "kvq"), err);
        CHECK_MSG(m, "%s", err);
        ref_model *rm = ref_model_load(model_gguf(m));
        CHECK(rm);
        double e8 = model_check_compressed(m, rm, KV_INT8), e4 = model_check_compressed(m, rm, KV_INT4);
        double e16 = model_check_compressed(m, rm, KV_F16);
        printf("  %s: max |logit diff| vs exact KV: f16 %.4f int8 %.4f int4 %.4f\n", ARCHS[k],
               e16, e8, e4);
        CHECK(e16 <= TOL_FLOAT);
        CHECK(e8 <= TOL_KV_INT8);
        CHECK(e4 <= TOL_KV_INT4);
        ref_model_free(rm);
        model_free(m);
    }
}

/* ---- refusals ---- */

/* Rewrites src into dst without tensor drop_tensor and metadata key drop_key (either may
 * be NULL). */
static int rewrite(const char *src, const char *dst, const char *drop_tensor,
                   const char *drop_key)
{
    char err[ERR_MAX];
    gguf_file *g = gguf_open(src, err);
    if (!g)
        return -1;
    gguf_writer *w = gguf_writer_new();
    for (int64_t i = 0; i < gguf_n_kv(g); i++) {
        gguf_str k = gguf_key(g, i);
        if (drop_key && gguf_str_eq(k, drop_key))
            continue;
        gguf_writer_copy_kv(w, g, i);
    }
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        if (drop_tensor && !strcmp(name, drop_tensor))
            continue;
        gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data);
    }
    int rc = gguf_writer_write(w, dst, err);
    gguf_writer_free(w);
    gguf_close(g);
    return rc;
}

/* A file without a tensor or key its architecture needs is refused, naming it. */
static void test_missing_parts_refused(void)
{
    const struct {
        const char *arch, *tensor, *key, *want;
    } cases[] = {
        {"gemma2", "blk.1.post_ffw_norm.weight", NULL, "blk.1.post_ffw_norm.weight"},
        {"gemma2", "blk.0.post_attention_norm.weight", NULL, "post_attention_norm"},
        {"gemma3", "blk.5.attn_q_norm.weight", NULL, "blk.5.attn_q_norm.weight"},
        {"gemma3", "blk.2.post_ffw_norm.weight", NULL, "post_ffw_norm"},
        {"gemma3", NULL, "gemma3.attention.sliding_window", "gemma3.attention.sliding_window"},
        {"gemma", "blk.0.ffn_gate.weight", NULL, "blk.0.ffn_gate.weight"},
        {"gemma2", NULL, "gemma2.embedding_length", "gemma2.embedding_length"},
        {"gemma2", "token_embd.weight", NULL, "token_embd.weight"},
    };
    char err[ERR_MAX], dst[512];
    snprintf(dst, sizeof dst, "%s/broken.gguf", test_tmpdir());
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        modelgen_params p = gemma_params(cases[i].arch, QTYPE_F16);
        const char *src = gen(&p, "whole");
        model *m = model_load(src, err);
        CHECK_MSG(m, "%s", err);
        model_free(m);
        CHECK(rewrite(src, dst, cases[i].tensor, cases[i].key) == 0);
        err[0] = '\0';
        CHECK(model_load(dst, err) == NULL);
        CHECK_MSG(strstr(err, cases[i].want) && strstr(err, "missing"), "%s: %s",
                  cases[i].arch, err);
    }
    /* a cap or window of 0 is no value llama.cpp could run: refused, naming the key */
    modelgen_params p = gemma_params("gemma2", QTYPE_F16);
    const char *src = gen(&p, "whole");
    gguf_file *g = gguf_open(src, err);
    CHECK(g);
    gguf_writer *w = gguf_writer_new();
    for (int64_t i = 0; i < gguf_n_kv(g); i++)
        gguf_writer_copy_kv(w, g, i);
    gguf_writer_set_f32(w, "gemma2.attn_logit_softcapping", 0.0f); /* replaces it */
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data);
    }
    CHECK(gguf_writer_write(w, dst, err) == 0);
    gguf_writer_free(w);
    gguf_close(g);
    CHECK(model_load(dst, err) == NULL);
    CHECK_MSG(strstr(err, "attn_logit_softcapping"), "%s", err);
}

/* The final soft-cap bounds every logit by the cap, on every path. */
static void test_final_softcap_bounds(void)
{
    modelgen_params p = gemma_params("gemma2", QTYPE_F32);
    p.final_softcap = 0.25f;
    char err[ERR_MAX];
    model *m = model_load(gen(&p, "cap"), err);
    CHECK_MSG(m, "%s", err);
    enum { N = 20 };
    int32_t tok[N], pos[N];
    for (int i = 0; i < N; i++)
        tok[i] = tok_at(i), pos[i] = i;
    float *l = malloc(sizeof(float) * N * N_VOCAB);
    model_runner *r = model_runner_new(m, 2, 0, 0, err);
    kv_pool *pool = kv_pool_new(model_kv_shape(m), 0, err);
    for (int one = 0; one < 2; one++) {
        CHECK(model_check_run(r, pool, N_VOCAB, N, tok, pos, one, l) == 0);
        float mx = 0;
        for (int i = 0; i < N * N_VOCAB; i++)
            mx = fmaxf(mx, fabsf(l[i]));
        CHECK_MSG(mx <= 0.25f && mx > 0.2f, "max |logit| %g", (double)mx);
    }
    kv_pool_free(pool);
    model_runner_free(r);
    free(l);
    model_free(m);
}

int main(void)
{
    RUN(test_metadata);
    RUN(test_logits_vs_reference);
    RUN(test_gemma_parts_matter);
    RUN(test_attention_probabilities);
    RUN(test_prefill_equals_decode);
    RUN(test_batched_equals_alone);
    RUN(test_partitioned_prefill);
    RUN(test_compressed_kv);
    RUN(test_missing_parts_refused);
    RUN(test_final_softcap_bounds);
    return test_finish();
}
