/*
 * LoRA adapters (engine/model/lora.h) applied unmerged by the forward pass of a model made
 * with model_with_loras, against the same adapters merged into the weights.
 *
 * The reference is modelgen_convert: W + s B A in double, rounded to f32, written as a
 * new GGUF (what llama-export-lora does). On an F32 base the unmerged forward computes
 * W x + s B (A x) in f32 where the merged one computes (W + s B A) x: the products differ
 * by f32 rounding, which now and then flips the f16 rounding of a K/V entry (2^-11 of
 * it), so logits agree within TOL_F32 of their largest magnitude (measured 5e-6 to 2e-4).
 * A BF16 adapter's A product rounds its activations to bf16 where the CPU computes BF16
 * products with AVX-512 BF16 (as the base's BF16 matrices do, and llama.cpp): TOL_BF16
 * (measured 1.5e-3). A Q8_0 adapter's A product takes 8-bit activations, as llama.cpp
 * computes it: TOL_Q8_ADAPTER (measured 5e-3). On a Q8_0 base every product quantizes its activations,
 * and the adapter moves the activations, so the adapter's delta (logits with it less
 * logits without) is compared with the delta of the merged F32 model over the F32 copy
 * of the base: TOL_Q8_DELTA of the largest delta (measured 0.05).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/gguf/gguf.h"
#include "engine/gguf/modelgen.h"
#include "engine/model/lora.h"
#include "engine/model/model.h"
#include "engine/quant/quant.h"
#include "tests/support/test.h"

#define TOL_F32 1e-3
#define TOL_BF16 5e-3
#define TOL_Q8_ADAPTER 2e-2
#define TOL_Q8_DELTA 0.15
#define N_PROMPT 20
#define N_DECODE 3
#define N_ROWS (N_PROMPT + N_DECODE)
#define ALL_TARGETS (MODELGEN_LORA_LAYERS | MODELGEN_LORA_OUTPUT | MODELGEN_LORA_TOKEN_EMBD)

static const char *tmp_path(const char *name)
{
    static char buf[8][1024];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, sizeof buf[0], "%s/%s", test_tmpdir(), name);
    return p;
}

/* A small random base: dim 64, 2 layers, GQA 4/2, 300 tokens. */
static int gen_base(const char *path, const char *arch, uint32_t type, bool tied, int dim)
{
    char err[ERR_MAX];
    modelgen_params p = {.arch = arch, .dim = dim, .n_layer = 2, .n_head = 4, .n_head_kv = 2,
                         .n_ff = 128, .n_ctx = 256, .type = type, .seed = 11, .n_vocab = 300,
                         .n_threads = 2, .tie_output = tied};
    if (modelgen_write(&p, path, err) < 0) {
        printf("       modelgen_write: %s\n", err);
        return -1;
    }
    return 0;
}

static int gen_lora(const char *base, const char *path, int rank, float alpha, uint32_t type,
                    unsigned targets, uint64_t seed)
{
    char err[ERR_MAX];
    gguf_file *g = gguf_open(base, err);
    if (!g) {
        printf("       %s: %s\n", base, err);
        return -1;
    }
    modelgen_lora_params p = {.base = g, .rank = rank, .alpha = alpha, .type = type,
                              .targets = targets, .seed = seed, .n_threads = 2};
    int rc = modelgen_write_lora(&p, path, err);
    gguf_close(g);
    if (rc < 0)
        printf("       modelgen_write_lora: %s\n", err);
    return rc;
}

static int merge(const char *base, const char *out, int n, const char *const *loras,
                 const float *scales)
{
    char err[ERR_MAX];
    if (modelgen_convert(base, out, QTYPE_F32, MODELGEN_MIX_NONE, n, loras, scales, 0, err) < 0) {
        printf("       modelgen_convert: %s\n", err);
        return -1;
    }
    return 0;
}

static int32_t tok_at(int i)
{
    return (int32_t)((i * 37 + 5) % 300);
}

/* Logits of N_PROMPT prompt rows (one forward) then N_DECODE decode rows, one by one, into
 * out (N_ROWS, n_vocab). */
static int run_logits(const model *m, float *out)
{
    char err[ERR_MAX];
    model_runner *r = model_runner_new(m, 2, 64, 256, err);
    kv_pool *pool = r ? kv_pool_new(model_kv_shape(m), 0, err) : NULL;
    int rc = -1, nv = model_hparams_of(m)->n_vocab;
    if (!pool) {
        printf("       runner: %s\n", err);
        goto out;
    }
    kv_seq seq;
    kv_seq_init(&seq, pool);
    int32_t tok[N_PROMPT], pos[N_PROMPT], rows[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++)
        tok[i] = tok_at(i), pos[i] = i, rows[i] = i;
    model_batch b = {.n_tokens = N_PROMPT, .tokens = tok, .positions = pos, .n_out = N_PROMPT,
                     .out_rows = rows, .logits = out};
    rc = model_forward(r, &seq, &b, err);
    for (int i = 0; i < N_DECODE && rc == 0; i++) {
        int32_t t = tok_at(100 + i), p = N_PROMPT + i, o = 0;
        model_batch d = {.n_tokens = 1, .tokens = &t, .positions = &p, .n_out = 1,
                         .out_rows = &o, .logits = out + (size_t)(N_PROMPT + i) * nv};
        rc = model_forward(r, &seq, &d, err);
    }
    if (rc < 0)
        printf("       forward: %s\n", err);
    kv_seq_free(&seq);
out:
    kv_pool_free(pool);
    model_runner_free(r);
    return rc;
}

static int run_file(const char *path, float *out)
{
    char err[ERR_MAX];
    model *m = model_load(path, err);
    if (!m) {
        printf("       %s: %s\n", path, err);
        return -1;
    }
    int rc = run_logits(m, out);
    model_free(m);
    return rc;
}

/* The base at path with n adapters at their scales: its logits into out. */
static int run_adapted(const char *base, int n, const char *const *paths, const float *scales,
                       float *out)
{
    char err[ERR_MAX];
    model *m = model_load(base, err), *v = NULL;
    lora *l[4] = {0};
    int rc = -1;
    if (!m)
        goto out;
    for (int i = 0; i < n; i++)
        if (!(l[i] = lora_load(m, paths[i], err)))
            goto out;
    if (!(v = model_with_loras(m, n, (const lora *const *)l, scales, err)))
        goto out;
    rc = run_logits(v, out);
out:
    if (rc < 0 && !v)
        printf("       %s: %s\n", base, err);
    model_free(v);
    for (int i = 0; i < n; i++)
        lora_free(l[i]);
    model_free(m);
    return rc;
}

/* Largest |a - b| over n relative to the largest |b| (at least 1). */
static double rel_diff(const float *a, const float *b, size_t n)
{
    double d = 0, scale = 1;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        d = e > d || e != e ? e : d;
        scale = fabs(b[i]) > scale ? fabs(b[i]) : scale;
    }
    return d / scale;
}

static float *logits_buf(void)
{
    return malloc((size_t)N_ROWS * 300 * sizeof(float));
}

/* One adapter of every matrix (the layers', output and token embedding) on an F32 base of
 * each architecture: the unmerged forward gives the merged model's logits. */
static void adapter_equals_merged_model(void)
{
    const char *archs[] = {"llama", "qwen2", "qwen3"};
    float *a = logits_buf(), *b = logits_buf();
    CHECK(a && b);
    for (int i = 0; i < 3; i++) {
        const char *base = tmp_path("base.gguf"), *ad = tmp_path("a.gguf"), *mg = tmp_path("m.gguf");
        float scale = 0.7f;
        CHECK(gen_base(base, archs[i], QTYPE_F32, false, 64) == 0);
        CHECK(gen_lora(base, ad, 8, 16.0f, QTYPE_F32, ALL_TARGETS, 3) == 0);
        CHECK(merge(base, mg, 1, &ad, &scale) == 0);
        CHECK(run_adapted(base, 1, &ad, &scale, a) == 0);
        CHECK(run_file(mg, b) == 0);
        double d = rel_diff(a, b, (size_t)N_ROWS * 300);
        printf("       %s: max relative difference %.2g\n", archs[i], d);
        CHECK_MSG(d <= TOL_F32, "%s: %g", archs[i], d);
        /* and the adapter changed something */
        CHECK(run_file(base, b) == 0);
        CHECK(rel_diff(a, b, (size_t)N_ROWS * 300) > 0.01);
    }
    free(a), free(b);
}

/* Gemma: adapters of the layers' matrices (PEFT's all-linear; the delta hooks are the
 * same) on gemma, gemma2 and gemma3 bases whose sliding window (8) is shorter than the
 * rows, against the merged models. The token embedding, to which Gemma always ties its
 * output, takes no adapter (as for any tied base), nor do its post norms (norm weights). */
static const char *load_error(const model *m, const char *path);

static void gemma_adapters(void)
{
    const char *archs[] = {"gemma", "gemma2", "gemma3"};
    float *a = logits_buf(), *b = logits_buf();
    char err[ERR_MAX];
    CHECK(a && b);
    for (int i = 0; i < 3; i++) {
        const char *base = tmp_path("gbase.gguf"), *ad = tmp_path("ga.gguf"), *mg = tmp_path("gm.gguf");
        modelgen_params p = {.arch = archs[i], .dim = 64, .n_layer = i == 2 ? 7 : 3, .n_head = 4,
                             .n_head_kv = 2, .n_ff = 128, .n_ctx = 256, .type = QTYPE_F32,
                             .seed = 11, .n_vocab = 300, .n_threads = 2, .sliding_window = 8,
                             .attn_softcap = 3.0f, .final_softcap = 4.0f};
        CHECK_MSG(modelgen_write(&p, base, err) == 0, "%s", err);
        float scale = 0.7f;
        CHECK(gen_lora(base, ad, 8, 16.0f, QTYPE_F16, MODELGEN_LORA_LAYERS, 3) == 0);
        CHECK(merge(base, mg, 1, &ad, &scale) == 0);
        CHECK(run_adapted(base, 1, &ad, &scale, a) == 0);
        CHECK(run_file(mg, b) == 0);
        double d = rel_diff(a, b, (size_t)N_ROWS * 300);
        printf("       %s: max relative difference %.2g\n", archs[i], d);
        CHECK_MSG(d <= TOL_F32, "%s: %g", archs[i], d);
        CHECK(run_file(base, b) == 0);
        CHECK(rel_diff(a, b, (size_t)N_ROWS * 300) > 0.01);
        /* the tied token embedding: refused, naming it */
        CHECK(gen_lora(base, ad, 8, 8.0f, QTYPE_F16, MODELGEN_LORA_TOKEN_EMBD, 1) == 0);
        model *m = model_load(base, err);
        CHECK_MSG(m, "%s", err);
        const char *e = load_error(m, ad);
        CHECK_MSG(strstr(e, "token_embd.weight: the base ties its output to the token embedding"),
                  "%s", e);
        model_free(m);
    }
    free(a), free(b);
}

/* Adapters stored F16, BF16 and Q8_0 (rank 32, Q8_0's block) against their merged models. */
static void adapter_types(void)
{
    const uint32_t types[] = {QTYPE_F16, QTYPE_BF16, QTYPE_Q8_0};
    const int ranks[] = {8, 16, 32};
    float *a = logits_buf(), *b = logits_buf();
    CHECK(a && b);
    const char *base = tmp_path("tbase.gguf");
    CHECK(gen_base(base, "llama", QTYPE_F32, false, 64) == 0);
    for (int i = 0; i < 3; i++) {
        const char *ad = tmp_path("t.gguf"), *mg = tmp_path("tm.gguf");
        float scale = 1.0f;
        CHECK(gen_lora(base, ad, ranks[i], 2.0f * ranks[i], types[i], ALL_TARGETS, 4) == 0);
        CHECK(merge(base, mg, 1, &ad, &scale) == 0);
        CHECK(run_adapted(base, 1, &ad, &scale, a) == 0);
        CHECK(run_file(mg, b) == 0);
        double d = rel_diff(a, b, (size_t)N_ROWS * 300);
        printf("       %s rank %d: max relative difference %.2g\n",
               quant_traits_of(types[i])->name, ranks[i], d);
        double tol = types[i] == QTYPE_Q8_0                                 ? TOL_Q8_ADAPTER
                     : types[i] == QTYPE_BF16 && quant_bf16_rounds_activation() ? TOL_BF16
                                                                                : TOL_F32;
        CHECK_MSG(d <= tol, "%g", d);
    }
    free(a), free(b);
}

/* Two adapters stacked with their scales, one negative, against both merged. */
static void stacked_adapters(void)
{
    float *a = logits_buf(), *b = logits_buf();
    CHECK(a && b);
    const char *base = tmp_path("sbase.gguf"), *m = tmp_path("sm.gguf");
    const char *ads[2] = {tmp_path("s1.gguf"), tmp_path("s2.gguf")};
    float scales[2] = {0.5f, -1.25f};
    CHECK(gen_base(base, "qwen2", QTYPE_F32, false, 64) == 0);
    CHECK(gen_lora(base, ads[0], 8, 8.0f, QTYPE_F16, ALL_TARGETS, 5) == 0);
    CHECK(gen_lora(base, ads[1], 4, 0.0f, QTYPE_F32, MODELGEN_LORA_Q | MODELGEN_LORA_DOWN, 6) == 0);
    CHECK(merge(base, m, 2, ads, scales) == 0);
    CHECK(run_adapted(base, 2, ads, scales, a) == 0);
    CHECK(run_file(m, b) == 0);
    double d = rel_diff(a, b, (size_t)N_ROWS * 300);
    printf("       max relative difference %.2g\n", d);
    CHECK_MSG(d <= TOL_F32, "%g", d);
    free(a), free(b);
}

/* An adapter at scale 0 leaves the base's logits as they are, bit for bit. */
static void scale_zero_is_the_base(void)
{
    float *a = logits_buf(), *b = logits_buf();
    CHECK(a && b);
    const char *base = tmp_path("zbase.gguf"), *ad = tmp_path("z.gguf");
    const char *ads[2] = {ad, ad};
    float zero[2] = {0.0f, -0.0f};
    CHECK(gen_base(base, "llama", QTYPE_Q8_0, false, 64) == 0);
    CHECK(gen_lora(base, ad, 8, 16.0f, QTYPE_F16, ALL_TARGETS, 7) == 0);
    CHECK(run_adapted(base, 2, ads, zero, a) == 0);
    CHECK(run_file(base, b) == 0);
    CHECK(memcmp(a, b, (size_t)N_ROWS * 300 * sizeof(float)) == 0);
    free(a), free(b);
}

/* On a Q8_0 base the adapter's delta is the merged F32 model's delta over the F32 copy of
 * the base. */
static void q8_0_base_delta(void)
{
    float *a = logits_buf(), *a0 = logits_buf(), *b = logits_buf(), *b0 = logits_buf();
    CHECK(a && a0 && b && b0);
    const char *base = tmp_path("qbase.gguf"), *f32 = tmp_path("qf32.gguf"),
               *ad = tmp_path("q.gguf"), *m = tmp_path("qm.gguf");
    float scale = 1.0f;
    CHECK(gen_base(base, "llama", QTYPE_Q8_0, false, 64) == 0);
    CHECK(gen_lora(base, ad, 8, 8.0f, QTYPE_F16, MODELGEN_LORA_LAYERS | MODELGEN_LORA_OUTPUT,
                   8) == 0);
    CHECK(merge(base, f32, 0, NULL, NULL) == 0);
    CHECK(merge(base, m, 1, &ad, &scale) == 0);
    CHECK(run_adapted(base, 1, &ad, &scale, a) == 0);
    CHECK(run_file(base, a0) == 0);
    CHECK(run_file(m, b) == 0);
    CHECK(run_file(f32, b0) == 0);
    size_t n = (size_t)N_ROWS * 300;
    for (size_t i = 0; i < n; i++)
        a[i] -= a0[i], b[i] -= b0[i];
    double d = rel_diff(a, b, n);
    printf("       max difference of the deltas relative to the largest %.2g\n", d);
    CHECK_MSG(d <= TOL_Q8_DELTA, "%g", d);
    free(a), free(a0), free(b), free(b0);
}

/* Batched sequences of an adapted model give their solo outputs: bit for bit with at most
 * 16 stacked rows (decode), within f32 rounding with more (prompt slices, sgemm). */
static void batched_equals_alone(void)
{
    char err[ERR_MAX];
    const char *base = tmp_path("bbase.gguf"), *ad = tmp_path("b.gguf");
    float scale = 1.5f;
    CHECK(gen_base(base, "llama", QTYPE_F16, false, 64) == 0);
    CHECK(gen_lora(base, ad, 8, 16.0f, QTYPE_F16, ALL_TARGETS, 9) == 0);
    model *m = model_load(base, err);
    CHECK_MSG(m, "%s", err);
    lora *l = lora_load(m, ad, err);
    CHECK_MSG(l, "%s", err);
    model *v = model_with_loras(m, 1, (const lora *const *)&l, &scale, err);
    CHECK_MSG(v, "%s", err);
    model_runner *r = model_runner_new(v, 2, 64, 256, err);
    kv_pool *pool = kv_pool_new(model_kv_shape(v), 0, err);
    CHECK(r && pool);
    enum { NS = 5, NP = 9 };
    kv_seq a[NS], b[NS];
    static float la[NS][NP][300], lb[NS][NP][300];
    int32_t tok[NS][NP], pos[NS][NP], rows[NP];
    for (int j = 0; j < NP; j++)
        rows[j] = j;
    model_batch ba[NS];
    kv_seq *sb[NS];
    /* the same history for both copies, each alone */
    for (int i = 0; i < NS; i++) {
        kv_seq_init(&a[i], pool);
        kv_seq_init(&b[i], pool);
        sb[i] = &b[i];
        for (int j = 0; j < NP; j++)
            tok[i][j] = tok_at(i * 13 + j), pos[i][j] = j;
        ba[i] = (model_batch){.n_tokens = NP, .tokens = tok[i], .positions = pos[i],
                              .n_out = NP, .out_rows = rows, .logits = &la[i][0][0]};
        CHECK_MSG(model_forward(r, &a[i], &ba[i], err) == 0, "%s", err);
        CHECK_MSG(model_forward(r, &b[i], &ba[i], err) == 0, "%s", err);
    }
    /* 5 decode rows stacked: the per-row kernels, bit for bit */
    for (int step = 0; step < 3; step++) {
        int32_t t[NS], p[NS], o = 0;
        model_batch d[NS];
        for (int i = 0; i < NS; i++) {
            t[i] = tok_at(200 + i * 3 + step), p[i] = NP + step;
            d[i] = (model_batch){.n_tokens = 1, .tokens = &t[i], .positions = &p[i], .n_out = 1,
                                 .out_rows = &o, .logits = la[i][0]};
            CHECK_MSG(model_forward(r, &a[i], &d[i], err) == 0, "%s", err);
            d[i].logits = lb[i][0];
        }
        CHECK_MSG(model_forward_batch(r, NS, sb, d, err) == 0, "%s", err);
        for (int i = 0; i < NS; i++)
            CHECK_MSG(memcmp(la[i][0], lb[i][0], sizeof la[i][0]) == 0,
                      "step %d sequence %d differs batched", step, i);
    }
    /* a prompt slice of 9 rows each, 45 stacked rows: sgemm */
    for (int i = 0; i < NS; i++) {
        for (int j = 0; j < NP; j++)
            tok[i][j] = tok_at(i * 7 + j + 50), pos[i][j] = NP + 3 + j;
        ba[i].logits = &la[i][0][0];
        CHECK_MSG(model_forward(r, &a[i], &ba[i], err) == 0, "%s", err);
        ba[i].logits = &lb[i][0][0];
    }
    CHECK_MSG(model_forward_batch(r, NS, sb, ba, err) == 0, "%s", err);
    for (int i = 0; i < NS; i++) {
        double d = rel_diff(&lb[i][0][0], &la[i][0][0], NP * 300);
        CHECK_MSG(d <= TOL_F32, "sequence %d: %g", i, d);
    }
    for (int i = 0; i < NS; i++)
        kv_seq_free(&a[i]), kv_seq_free(&b[i]);
    kv_pool_free(pool);
    model_runner_free(r);
    model_free(v);
    lora_free(l);
    model_free(m);
}

/* Runners of a base and of two views of it sharing the base's runner's scratch, used in
 * turns, give what runners of their own give, bit for bit, and add only the adapters'
 * scratch. */
static void shared_runners(void)
{
    char err[ERR_MAX];
    const char *base = tmp_path("hbase.gguf"), *ads[2] = {tmp_path("h1.gguf"), tmp_path("h2.gguf")};
    CHECK(gen_base(base, "llama", QTYPE_F32, false, 64) == 0);
    CHECK(gen_lora(base, ads[0], 8, 16.0f, QTYPE_F16, ALL_TARGETS, 21) == 0);
    CHECK(gen_lora(base, ads[1], 32, 32.0f, QTYPE_F32, MODELGEN_LORA_LAYERS, 22) == 0);
    model *m = model_load(base, err);
    CHECK_MSG(m, "%s", err);
    lora *l[2];
    model *v[3] = {m, NULL, NULL};
    float scale = 1.0f;
    for (int i = 0; i < 2; i++) {
        l[i] = lora_load(m, ads[i], err);
        CHECK_MSG(l[i], "%s", err);
        v[i + 1] = model_with_loras(m, 1, (const lora *const *)&l[i], &scale, err);
        CHECK_MSG(v[i + 1], "%s", err);
    }
    model_runner *own[3], *shared[3];
    kv_pool *pool = kv_pool_new(model_kv_shape(m), 0, err);
    CHECK(pool);
    for (int i = 0; i < 3; i++) {
        own[i] = model_runner_new(v[i], 2, 64, 256, err);
        CHECK_MSG(own[i], "%s", err);
    }
    shared[0] = own[0];
    for (int i = 1; i < 3; i++) {
        shared[i] = model_runner_new_shared(v[i], shared[0], err);
        CHECK_MSG(shared[i], "%s", err);
        CHECK(model_runner_scratch_bytes(shared[i]) < model_runner_scratch_bytes(own[0]) / 4);
    }
    CHECK(!model_runner_new_shared(v[1], shared[1], err));
    kv_seq a[3], b[3];
    static float la[3][N_ROWS][300], lb[3][N_ROWS][300];
    for (int i = 0; i < 3; i++)
        kv_seq_init(&a[i], pool), kv_seq_init(&b[i], pool);
    /* prompts then decode rows, the three models in turns on each side */
    for (int step = 0; step <= N_DECODE; step++)
        for (int i = 0; i < 3; i++) {
            int n = step == 0 ? N_PROMPT : 1, p0 = step == 0 ? 0 : N_PROMPT + step - 1;
            int32_t tok[N_PROMPT], pos[N_PROMPT], rows[N_PROMPT];
            for (int j = 0; j < n; j++)
                tok[j] = tok_at(p0 + j), pos[j] = p0 + j, rows[j] = j;
            model_batch bt = {.n_tokens = n, .tokens = tok, .positions = pos, .n_out = n,
                              .out_rows = rows, .logits = la[i][p0]};
            CHECK_MSG(model_forward(own[i], &a[i], &bt, err) == 0, "%s", err);
            bt.logits = lb[i][p0];
            CHECK_MSG(model_forward(shared[i], &b[i], &bt, err) == 0, "%s", err);
        }
    for (int i = 0; i < 3; i++)
        CHECK_MSG(memcmp(la[i], lb[i], sizeof la[i]) == 0, "model %d differs shared", i);
    CHECK(memcmp(la[1], la[2], sizeof la[1]) != 0 && memcmp(la[0], la[1], sizeof la[0]) != 0);
    for (int i = 0; i < 3; i++)
        kv_seq_free(&a[i]), kv_seq_free(&b[i]);
    for (int i = 1; i < 3; i++) {
        model_runner_free(shared[i]);
        model_runner_free(own[i]);
        model_free(v[i]);
        lora_free(l[i - 1]);
    }
    model_runner_free(own[0]);
    kv_pool_free(pool);
    model_free(m);
}

/* One forward stacking the rows of a base and of two views of it (model_batch.model, on
 * the base's runner with room for their ranks) gives each sequence what its model gives
 * alone: bit for bit with decode rows (at most 16), within f32 rounding with prompt
 * slices; a batch of a model of other weights, or of a rank the runner has no room for,
 * is refused. */
static void mixed_batch(void)
{
    char err[ERR_MAX];
    const char *base = tmp_path("xbase.gguf"), *other = tmp_path("xother.gguf"),
               *ads[2] = {tmp_path("x1.gguf"), tmp_path("x2.gguf")};
    CHECK(gen_base(base, "llama", QTYPE_F16, false, 64) == 0);
    CHECK(gen_base(other, "llama", QTYPE_F16, false, 64) == 0);
    CHECK(gen_lora(base, ads[0], 8, 16.0f, QTYPE_F16, ALL_TARGETS, 31) == 0);
    CHECK(gen_lora(base, ads[1], 16, 16.0f, QTYPE_F32, MODELGEN_LORA_LAYERS, 32) == 0);
    model *m = model_load(base, err), *mo = model_load(other, err);
    CHECK_MSG(m && mo, "%s", err);
    lora *l[2];
    model *v[3] = {m, NULL, NULL};
    float scales[2] = {1.0f, -0.75f};
    for (int i = 0; i < 2; i++) {
        l[i] = lora_load(m, ads[i], err);
        CHECK_MSG(l[i], "%s", err);
        v[i + 1] = model_with_loras(m, 1, (const lora *const *)&l[i], &scales[i], err);
        CHECK_MSG(v[i + 1], "%s", err);
    }
    model_runner *alone[3], *r = model_runner_new(m, 2, 64, 256, err);
    kv_pool *pool = kv_pool_new(model_kv_shape(m), 0, err);
    CHECK(r && pool);
    for (int i = 0; i < 3; i++) {
        alone[i] = model_runner_new(v[i], 2, 64, 256, err);
        CHECK_MSG(alone[i], "%s", err);
    }
    enum { NP = 9 };
    kv_seq a[3], b[3];
    kv_seq *sb[3] = {&b[0], &b[1], &b[2]};
    static float la[3][NP][300], lb[3][NP][300];
    int32_t tok[3][NP], pos[3][NP], rows[NP];
    model_batch ba[3];
    for (int j = 0; j < NP; j++)
        rows[j] = j;
    for (int i = 0; i < 3; i++) {
        kv_seq_init(&a[i], pool);
        kv_seq_init(&b[i], pool);
        for (int j = 0; j < NP; j++)
            tok[i][j] = tok_at(i * 5 + j), pos[i][j] = j;
        ba[i] = (model_batch){.n_tokens = NP, .tokens = tok[i], .positions = pos[i], .n_out = NP,
                              .out_rows = rows, .logits = &la[i][0][0]};
        CHECK_MSG(model_forward(alone[i], &a[i], &ba[i], err) == 0, "%s", err);
        CHECK_MSG(model_forward(alone[i], &b[i], &ba[i], err) == 0, "%s", err);
        ba[i].model = i ? v[i] : NULL;
    }
    /* the views' rank (16) needs room in the base's runner */
    int32_t t1 = 5, p1 = NP, o1 = 0;
    model_batch one = {.n_tokens = 1, .tokens = &t1, .positions = &p1, .n_out = 1,
                       .out_rows = &o1, .logits = la[0][0], .model = v[2]};
    CHECK(model_forward(r, &b[2], &one, err) < 0);
    CHECK_MSG(strstr(err, "model_runner_reserve_lora"), "%s", err);
    CHECK_MSG(model_runner_reserve_lora(r, 16, err) == 0, "%s", err);
    one.model = mo;
    CHECK(model_forward(r, &b[2], &one, err) < 0);
    CHECK_MSG(strstr(err, "other weights"), "%s", err);
    for (int step = 0; step < 3; step++) {
        int32_t t[3], p[3], o = 0;
        model_batch d[3];
        for (int i = 0; i < 3; i++) {
            t[i] = tok_at(100 + step * 3 + i), p[i] = NP + step;
            d[i] = (model_batch){.n_tokens = 1, .tokens = &t[i], .positions = &p[i], .n_out = 1,
                                 .out_rows = &o, .logits = la[i][0]};
            CHECK_MSG(model_forward(alone[i], &a[i], &d[i], err) == 0, "%s", err);
            d[i].logits = lb[i][0];
            d[i].model = i ? v[i] : NULL;
        }
        CHECK_MSG(model_forward_batch(r, 3, sb, d, err) == 0, "%s", err);
        for (int i = 0; i < 3; i++)
            CHECK_MSG(memcmp(la[i][0], lb[i][0], sizeof la[i][0]) == 0,
                      "step %d model %d differs in the mixed batch", step, i);
    }
    for (int i = 0; i < 3; i++) {
        for (int j = 0; j < NP; j++)
            tok[i][j] = tok_at(i * 11 + j + 40), pos[i][j] = NP + 3 + j;
        ba[i].logits = &la[i][0][0];
        ba[i].model = NULL;
        CHECK_MSG(model_forward(alone[i], &a[i], &ba[i], err) == 0, "%s", err);
        ba[i].logits = &lb[i][0][0];
        ba[i].model = i ? v[i] : NULL;
    }
    CHECK_MSG(model_forward_batch(r, 3, sb, ba, err) == 0, "%s", err);
    for (int i = 0; i < 3; i++) {
        double d = rel_diff(&lb[i][0][0], &la[i][0][0], NP * 300);
        CHECK_MSG(d <= TOL_F32, "model %d: %g", i, d);
    }
    CHECK(memcmp(la[0], la[1], sizeof la[0]) != 0 && memcmp(la[1], la[2], sizeof la[1]) != 0);
    for (int i = 0; i < 3; i++) {
        kv_seq_free(&a[i]), kv_seq_free(&b[i]);
        model_runner_free(alone[i]);
    }
    model_runner_free(r);
    kv_pool_free(pool);
    for (int i = 0; i < 2; i++) {
        model_free(v[i + 1]);
        lora_free(l[i]);
    }
    model_free(m);
    model_free(mo);
}

/* ---- refusals ---- */

typedef struct fake_tensor {
    const char *name;
    uint32_t type;
    int64_t ne0, ne1;
} fake_tensor;

/* An adapter file written by hand: general.type gtype and adapter.type atype when not
 * NULL, the tensors given (zeros). */
static int write_fake(const char *path, const char *arch, const char *gtype, const char *atype,
                      const fake_tensor *t, int n)
{
    char err[ERR_MAX];
    gguf_writer *w = gguf_writer_new();
    static char zeros[1 << 20];
    int rc = w ? 0 : -1;
    if (rc == 0 && arch)
        rc = gguf_writer_set_str(w, "general.architecture", arch);
    if (rc == 0 && gtype)
        rc = gguf_writer_set_str(w, "general.type", gtype);
    if (rc == 0 && atype)
        rc = gguf_writer_set_str(w, "adapter.type", atype);
    if (rc == 0)
        rc = gguf_writer_set_f32(w, "adapter.lora.alpha", 8.0f);
    for (int i = 0; i < n && rc == 0; i++) {
        int64_t ne[2] = {t[i].ne0, t[i].ne1};
        rc = gguf_writer_add_tensor(w, t[i].name, t[i].type, 2, ne, zeros);
    }
    if (rc == 0)
        rc = gguf_writer_write(w, path, err);
    gguf_writer_free(w);
    return rc;
}

/* lora_load's error for a file, or "" when it loads. */
static const char *load_error(const model *m, const char *path)
{
    static char err[ERR_MAX];
    lora *l = lora_load(m, path, err);
    if (l) {
        lora_free(l);
        return "";
    }
    return err;
}

#define REFUSED(path, what)                                                            \
    do {                                                                               \
        const char *e_ = load_error(m, path);                                          \
        CHECK_MSG(strstr(e_, what), "expected '%s', got '%s'", what, e_);              \
    } while (0)

/* Adapters that do not fit the base are refused, each with what is wrong. */
static void bad_adapters_are_refused(void)
{
    char err[ERR_MAX];
    const char *base = tmp_path("rbase.gguf"), *tied = tmp_path("rtied.gguf"),
               *other = tmp_path("rother.gguf"), *qwen = tmp_path("rqwen.gguf"),
               *f = tmp_path("r.gguf");
    CHECK(gen_base(base, "llama", QTYPE_F32, false, 64) == 0);
    CHECK(gen_base(tied, "llama", QTYPE_F32, true, 64) == 0);
    CHECK(gen_base(other, "llama", QTYPE_F32, false, 96) == 0);
    CHECK(gen_base(qwen, "qwen2", QTYPE_F32, false, 64) == 0);
    model *m = model_load(base, err), *mt = model_load(tied, err);
    CHECK_MSG(m && mt, "%s", err);

    /* made for a model of another width: dim 96 */
    CHECK(gen_lora(other, f, 8, 8.0f, QTYPE_F16, MODELGEN_LORA_LAYERS, 1) == 0);
    REFUSED(f, "blk.0.attn_q.weight: lora_a has shape [96, 8]; the base's matrix needs [64, rank]");
    /* a rank above a matrix's smaller side (attn_k: 32 rows) */
    CHECK(gen_lora(base, f, 48, 8.0f, QTYPE_F16, MODELGEN_LORA_LAYERS, 1) == 0);
    REFUSED(f, "blk.0.attn_k.weight: rank 48 is above the matrix's smaller side 32");
    /* of another architecture */
    CHECK(gen_lora(qwen, f, 8, 8.0f, QTYPE_F16, MODELGEN_LORA_LAYERS, 1) == 0);
    REFUSED(f, "adapter of a qwen2 model; the base is llama");
    /* a model, not an adapter */
    REFUSED(other, "not an adapter (no general.type)");
    /* the token embedding of a base whose output is tied to it */
    CHECK(gen_lora(base, f, 8, 8.0f, QTYPE_F16, MODELGEN_LORA_TOKEN_EMBD, 1) == 0);
    {
        const char *e = load_error(mt, f);
        CHECK_MSG(strstr(e, "token_embd.weight: the base ties its output to the token embedding"),
                  "%s", e);
    }
    CHECK(strcmp(load_error(m, f), "") == 0);
    /* the output of a base that has none */
    CHECK(gen_lora(base, f, 8, 8.0f, QTYPE_F16, MODELGEN_LORA_OUTPUT, 1) == 0);
    {
        const char *e = load_error(mt, f);
        CHECK_MSG(strstr(e, "output.weight: the base has no such matrix"), "%s", e);
    }

    fake_tensor ok[2] = {{"blk.0.attn_q.weight.lora_a", QTYPE_F16, 64, 8},
                         {"blk.0.attn_q.weight.lora_b", QTYPE_F16, 8, 64}};
    CHECK(write_fake(f, "llama", "adapter", "lora", ok, 2) == 0);
    CHECK(strcmp(load_error(m, f), "") == 0);
    CHECK(write_fake(f, "llama", "adapter", "lora", ok, 1) == 0);
    REFUSED(f, "blk.0.attn_q.weight: lora_b is missing (a pair is lora_a and lora_b)");
    CHECK(write_fake(f, "llama", "adapter", "lora", ok + 1, 1) == 0);
    REFUSED(f, "blk.0.attn_q.weight: lora_a is missing");
    CHECK(write_fake(f, "llama", "adapter", "control_vector", ok, 2) == 0);
    REFUSED(f, "adapter.type is 'control_vector', not 'lora'");
    CHECK(write_fake(f, "llama", "model", "lora", ok, 2) == 0);
    REFUSED(f, "not an adapter");
    CHECK(write_fake(f, NULL, "adapter", "lora", ok, 2) == 0);
    REFUSED(f, "no general.architecture");

    fake_tensor t[3];
    /* lora_a not transposed: [rank, in] */
    t[0] = (fake_tensor){"blk.1.ffn_up.weight.lora_a", QTYPE_F16, 8, 64};
    t[1] = (fake_tensor){"blk.1.ffn_up.weight.lora_b", QTYPE_F16, 8, 128};
    CHECK(write_fake(f, "llama", "adapter", "lora", t, 2) == 0);
    REFUSED(f, "blk.1.ffn_up.weight: lora_a has shape [8, 64]; the base's matrix needs [64, rank]");
    /* ranks of a and b differ */
    t[0] = (fake_tensor){"blk.1.ffn_up.weight.lora_a", QTYPE_F16, 64, 8};
    t[1] = (fake_tensor){"blk.1.ffn_up.weight.lora_b", QTYPE_F16, 4, 128};
    CHECK(write_fake(f, "llama", "adapter", "lora", t, 2) == 0);
    REFUSED(f, "blk.1.ffn_up.weight: lora_b has shape [4, 128]; the base's matrix needs [8, 128]");
    /* a type the engine does not compute */
    t[0] = (fake_tensor){"blk.1.ffn_up.weight.lora_a", QTYPE_Q8_1, 64, 32};
    t[1] = (fake_tensor){"blk.1.ffn_up.weight.lora_b", QTYPE_F16, 32, 128};
    CHECK(write_fake(f, "llama", "adapter", "lora", t, 2) == 0);
    REFUSED(f, "tensor 'blk.1.ffn_up.weight.lora_a': type Q8_1 is not supported");
    /* a matrix the base does not have, a tensor of no pair, a norm */
    t[0] = (fake_tensor){"blk.7.ffn_up.weight.lora_a", QTYPE_F16, 64, 8};
    t[1] = (fake_tensor){"blk.7.ffn_up.weight.lora_b", QTYPE_F16, 8, 128};
    CHECK(write_fake(f, "llama", "adapter", "lora", t, 2) == 0);
    REFUSED(f, "blk.7.ffn_up.weight: the base has no such matrix (an adapter of another model?)");
    t[0] = (fake_tensor){"blk.0.attn_q.weight.lora_c", QTYPE_F16, 64, 8};
    CHECK(write_fake(f, "llama", "adapter", "lora", t, 1) == 0);
    REFUSED(f, "tensor 'blk.0.attn_q.weight.lora_c' is no .lora_a or .lora_b");
    t[0] = (fake_tensor){"blk.0.attn_norm.weight", QTYPE_F32, 64, 1};
    CHECK(write_fake(f, "llama", "adapter", "lora", t, 1) == 0);
    REFUSED(f, "adapts norm weights");
    /* a truncated file */
    CHECK(gen_lora(base, f, 8, 8.0f, QTYPE_F16, MODELGEN_LORA_LAYERS, 1) == 0);
    CHECK(truncate(f, 4000) == 0);
    REFUSED(f, "r.gguf");
    model_free(m);
    model_free(mt);
}

/* model_with_loras refuses what it cannot apply: too many adapters, a scale that is no
 * number, an adapter checked against another base, a view of a view. */
static void bad_views_are_refused(void)
{
    char err[ERR_MAX];
    const char *base = tmp_path("vbase.gguf"), *base2 = tmp_path("vbase2.gguf"),
               *ad = tmp_path("v.gguf");
    CHECK(gen_base(base, "llama", QTYPE_F32, false, 64) == 0);
    CHECK(gen_base(base2, "llama", QTYPE_F32, false, 64) == 0);
    CHECK(gen_lora(base, ad, 8, 8.0f, QTYPE_F16, MODELGEN_LORA_LAYERS, 1) == 0);
    model *m = model_load(base, err), *m2 = model_load(base2, err);
    CHECK(m && m2);
    lora *l = lora_load(m, ad, err);
    CHECK_MSG(l, "%s", err);
    const lora *many[MODEL_LORA_MAX + 1];
    float scales[MODEL_LORA_MAX + 1];
    for (int i = 0; i <= MODEL_LORA_MAX; i++)
        many[i] = l, scales[i] = 1.0f;
    CHECK(!model_with_loras(m, MODEL_LORA_MAX + 1, many, scales, err));
    CHECK_MSG(strstr(err, "at most 8 adapters"), "%s", err);
    scales[0] = NAN;
    CHECK(!model_with_loras(m, 1, many, scales, err));
    CHECK_MSG(strstr(err, "scale of adapter 0 is not a number"), "%s", err);
    scales[0] = 1.0f;
    CHECK(!model_with_loras(m2, 1, many, scales, err));
    CHECK_MSG(strstr(err, "was checked against another base model"), "%s", err);
    model *v = model_with_loras(m, 1, many, scales, err);
    CHECK_MSG(v, "%s", err);
    CHECK(model_base(v) == m && model_base(m) == m);
    CHECK(!model_with_loras(v, 1, many, scales, err));
    CHECK_MSG(strstr(err, "already has adapters"), "%s", err);
    CHECK(model_repack_weights(v, err) < 0);
    CHECK_MSG(strstr(err, "repack the base"), "%s", err);
    model_free(v);
    lora_free(l);
    model_free(m);
    model_free(m2);
}

/* ---- no allocation per token ---- */

/* test_lora is linked with --wrap=malloc,calloc,realloc (the Makefile), as test_sampler
 * is, so that every allocation of the engine is counted here. */
void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
static _Atomic long n_allocs;

void *__wrap_malloc(size_t n)
{
    n_allocs++;
    return __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t size)
{
    n_allocs++;
    return __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t n)
{
    n_allocs++;
    return __real_realloc(p, n);
}

/* Decode steps and a short prompt of an adapted model, within chunks the sequence has,
 * allocate nothing. */
static void forward_never_allocates(void)
{
    char err[ERR_MAX];
    const char *base = tmp_path("nbase.gguf"), *ad = tmp_path("n.gguf");
    float scales[2] = {0.5f, 2.0f};
    CHECK(gen_base(base, "llama", QTYPE_F16, false, 64) == 0);
    CHECK(gen_lora(base, ad, 8, 16.0f, QTYPE_F16, ALL_TARGETS, 2) == 0);
    model *m = model_load(base, err);
    lora *l = m ? lora_load(m, ad, err) : NULL;
    CHECK_MSG(l, "%s", err);
    const lora *two[2] = {l, l};
    model *v = model_with_loras(m, 2, two, scales, err);
    CHECK_MSG(v, "%s", err);
    model_runner *r = model_runner_new(v, 2, 64, 256, err);
    kv_pool *pool = kv_pool_new(model_kv_shape(v), 0, err);
    CHECK(r && pool);
    kv_seq seq;
    kv_seq_init(&seq, pool);
    static float logits[8 * 300];
    int32_t tok[8], pos[8], rows[8];
    for (int i = 0; i < 8; i++)
        tok[i] = tok_at(i), pos[i] = i, rows[i] = i;
    model_batch b = {.n_tokens = 1, .tokens = tok, .positions = pos, .n_out = 1,
                     .out_rows = rows, .logits = logits};
    CHECK(model_forward(r, &seq, &b, err) == 0); /* the sequence's first chunk */
    long before = n_allocs;
    for (int i = 1; i < 6; i++) {
        b = (model_batch){.n_tokens = 1, .tokens = &tok[i], .positions = &pos[i], .n_out = 1,
                          .out_rows = rows, .logits = logits};
        CHECK(model_forward(r, &seq, &b, err) == 0);
    }
    for (int i = 0; i < 8; i++)
        pos[i] = 6 + i;
    b = (model_batch){.n_tokens = 8, .tokens = tok, .positions = pos, .n_out = 8,
                      .out_rows = rows, .logits = logits};
    CHECK(model_forward(r, &seq, &b, err) == 0);
    CHECK_MSG(n_allocs == before, "%ld allocations", n_allocs - before);
    kv_seq_free(&seq);
    kv_pool_free(pool);
    model_runner_free(r);
    model_free(v);
    lora_free(l);
    model_free(m);
}

int main(void)
{
    RUN(adapter_equals_merged_model);
    RUN(gemma_adapters);
    RUN(adapter_types);
    RUN(stacked_adapters);
    RUN(scale_zero_is_the_base);
    RUN(q8_0_base_delta);
    RUN(batched_equals_alone);
    RUN(shared_runners);
    RUN(mixed_batch);
    RUN(bad_adapters_are_refused);
    RUN(bad_views_are_refused);
    RUN(forward_never_allocates);
    return test_finish();
}
