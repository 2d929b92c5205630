/*
 * Phi-3 / Phi-4-mini (phi3) and Granite (granite) against the double-precision reference
 * (tests/support/ref_forward, which follows Hugging Face's Phi3 and Granite modeling code:
 * qkv_proj split into q, k, v; gate_up_proj chunked into gate, up; partial rotary;
 * LongRoPE's ext_factors and attention factor; Granite's multipliers).
 *
 * Models come from modelgen on a synthetic 260-token vocabulary: no shared test data.
 * Tolerance: test_model.c's TOL_FLOAT (f32 weights, an f16 KV cache; max abs logit
 * difference, logits of unit scale), divided by granite's logit scale for granite, whose
 * logits are that much smaller.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf/gguf.h"
#include "engine/gguf/modelgen.h"
#include "engine/model/lora.h"
#include "engine/model/model.h"
#include "engine/quant/quant.h"
#include "tests/support/ref_forward.h"
#include "tests/support/test.h"

#define TOL_FLOAT 0.02
#define TOL_ROUNDING 1e-3

/* Phi-4-mini's shape, small: 4 heads of 64 over 2 KV heads. */
static modelgen_params small_params(const char *arch)
{
    return (modelgen_params){.arch = arch, .dim = 256, .n_layer = 2, .n_head = 4, .n_head_kv = 2,
                             .n_ff = 384, .n_ctx = 128, .type = QTYPE_F32, .seed = 11,
                             .n_vocab = 260, .n_threads = 1};
}

static const char *gen(const modelgen_params *p, const char *name)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s.gguf", test_tmpdir(), name);
    char err[ERR_MAX];
    if (modelgen_write(p, path, err) < 0) {
        fprintf(stderr, "modelgen: %s\n", err);
        return NULL;
    }
    return path;
}

/* Forward of n tokens at pos against seq, logits of every row into out (n, n_vocab). */
static int forward(model_runner *r, kv_seq *seq, int n, const int32_t *tok, const int32_t *pos,
                   float *out)
{
    int32_t rows[64];
    for (int i = 0; i < n; i++)
        rows[i] = i;
    model_batch b = {.n_tokens = n, .tokens = tok, .positions = pos, .n_out = n,
                     .out_rows = rows, .logits = out};
    char err[ERR_MAX];
    int rc = model_forward(r, seq, &b, err);
    if (rc != 0)
        fprintf(stderr, "forward: %s\n", err);
    return rc;
}

static double max_diff(const float *a, const double *ref, size_t n)
{
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs(a[i] - ref[i]);
        if (!(d <= worst))
            worst = isnan(d) ? 1e9 : d;
    }
    return worst;
}

/*
 * The model at path against the reference: a prefill of 20, 4 single-token decodes, then
 * in a fresh sequence positions 0..7 and 40..47 (a gap). A runner of max_kv entries
 * (LongRoPE's choice of factors: long above the original context), with long telling the
 * reference the same; max_batch 512 (sgemm attention) or 8 (dot kernels, sub-batches).
 */
static double check_vs_ref(const char *path, int max_batch, int max_kv, bool long_factors)
{
    char err[ERR_MAX];
    gguf_file *g = gguf_open(path, err);
    model *m = g ? model_from_gguf(g, err) : NULL;
    ref_model *rm = g ? ref_model_load(g) : NULL;
    if (!m || !rm) {
        fprintf(stderr, "load: %s\n", err);
        return 1e9;
    }
    ref_model_longrope_long(rm, long_factors);
    int nv = model_hparams_of(m)->n_vocab;
    model_runner *r = model_runner_new(m, 2, max_batch, max_kv, err);
    kv_pool *pool = r ? kv_pool_new(model_kv_shape(m), 0, err) : NULL;
    if (!pool) {
        fprintf(stderr, "runner: %s\n", err);
        return 1e9;
    }
    enum { N = 24 };
    int32_t tok[N], pos[N];
    for (int i = 0; i < N; i++)
        tok[i] = (int32_t)((i * 37 + 11) % nv), pos[i] = i < 16 ? i : i + 8;
    double *ref = malloc((size_t)N * nv * sizeof(double));
    float *out = malloc((size_t)N * nv * sizeof(float));
    double worst = 1e9;
    kv_seq seq;
    kv_seq_init(&seq, pool);
    ref_forward(rm, N, tok, pos, ref, NULL, NULL);
    if (forward(r, &seq, 20, tok, pos, out) == 0) {
        worst = max_diff(out, ref, (size_t)20 * nv);
        for (int i = 20; i < N; i++) {
            double d = forward(r, &seq, 1, tok + i, pos + i, out) == 0
                           ? max_diff(out, ref + (size_t)i * nv, (size_t)nv)
                           : 1e9;
            worst = d > worst ? d : worst;
        }
    }
    kv_seq_free(&seq);
    kv_seq_init(&seq, pool);
    int32_t gp[16];
    for (int i = 0; i < 16; i++)
        gp[i] = i < 8 ? i : 32 + i;
    ref_forward(rm, 16, tok, gp, ref, NULL, NULL);
    double d = forward(r, &seq, 8, tok, gp, out) == 0 ? max_diff(out, ref, (size_t)8 * nv) : 1e9;
    worst = d > worst ? d : worst;
    d = forward(r, &seq, 8, tok + 8, gp + 8, out) == 0
            ? max_diff(out, ref + (size_t)8 * nv, (size_t)8 * nv)
            : 1e9;
    worst = d > worst ? d : worst;
    kv_seq_free(&seq);
    free(out);
    free(ref);
    kv_pool_free(pool);
    model_runner_free(r);
    model_free(m);
    ref_model_free(rm);
    gguf_close(g);
    return worst;
}

static void check_both_paths(const char *path, const char *what, double tol)
{
    double d1 = check_vs_ref(path, 512, 0, false), d2 = check_vs_ref(path, 8, 0, false);
    printf("  %s: max |logit diff| %.4g (sgemm) %.4g (dot)\n", what, d1, d2);
    CHECK_MSG(d1 <= tol && d2 <= tol, "%s: %g %g", what, d1, d2);
}

static void test_phi3_full_rotary(void)
{
    modelgen_params p = small_params("phi3");
    const char *path = gen(&p, "phi3");
    CHECK(path);
    char err[ERR_MAX];
    model *m = model_load(path, err);
    CHECK_MSG(m, "%s", err);
    const model_hparams *hp = model_hparams_of(m);
    CHECK_EQ(hp->arch, MODEL_ARCH_PHI3);
    CHECK_EQ(hp->rope_style, MODEL_ROPE_HALVES);
    CHECK_EQ(hp->rope_dims, 64);
    CHECK_EQ(hp->n_ctx, 128);
    model_free(m);
    check_both_paths(path, "phi3 f32", TOL_FLOAT);
    p.type = QTYPE_F16;
    p.n_head_kv = 4; /* Phi-3-mini: as many KV heads as heads */
    check_both_paths(gen(&p, "phi3_f16"), "phi3 f16 mha", TOL_FLOAT);
}

/* Phi-4-mini: 3/4 of each head rotated, the output tied to the token embedding. */
static void test_phi3_partial_rotary_tied(void)
{
    modelgen_params p = small_params("phi3");
    p.rope_dims = 48;
    p.tie_output = true;
    const char *path = gen(&p, "phi3_partial");
    CHECK(path);
    char err[ERR_MAX];
    model *m = model_load(path, err);
    CHECK_MSG(m, "%s", err);
    CHECK_EQ(model_hparams_of(m)->rope_dims, 48);
    model_free(m);
    check_both_paths(path, "phi3 partial rotary 48/64, tied", TOL_FLOAT);
    /* qwen2 files say so too */
    p = small_params("qwen2");
    p.rope_dims = 32;
    check_both_paths(gen(&p, "qwen2_partial"), "qwen2 partial rotary 32/64", TOL_FLOAT);
}

/* LongRoPE: a runner of at most the original context (64) rotates by the short factors, a
 * longer one by the long factors; both scale cos and sin by the attention factor. */
static void test_phi3_longrope(void)
{
    modelgen_params p = small_params("phi3");
    p.rope_orig_ctx = 64;
    p.rope_dims = 48;
    const char *path = gen(&p, "phi3_longrope");
    CHECK(path);
    double ds = check_vs_ref(path, 512, 64, false), dl = check_vs_ref(path, 512, 128, true);
    double ds8 = check_vs_ref(path, 8, 64, false), dl8 = check_vs_ref(path, 8, 128, true);
    /* the other factors are far off: the choice is what the test sees */
    double wrong = check_vs_ref(path, 512, 128, false);
    printf("  short (ctx 64): %.4g %.4g, long (ctx 128): %.4g %.4g, long vs short ref %.4g\n",
           ds, ds8, dl, dl8, wrong);
    CHECK_MSG(ds <= TOL_FLOAT && dl <= TOL_FLOAT && ds8 <= TOL_FLOAT && dl8 <= TOL_FLOAT,
              "%g %g %g %g", ds, dl, ds8, dl8);
    CHECK_MSG(wrong > 10 * TOL_FLOAT, "long and short factors give alike logits: %g", wrong);
}

/* A window shorter than the context caps n_ctx to it (window masking is not computed). */
static void test_phi3_sliding_window_caps_context(void)
{
    modelgen_params p = small_params("phi3");
    p.sliding_window = 48;
    char err[ERR_MAX];
    model *m = model_load(gen(&p, "phi3_swa"), err);
    CHECK_MSG(m, "%s", err);
    CHECK_EQ(model_hparams_of(m)->n_ctx, 48);
    CHECK_EQ(model_hparams_of(m)->sliding_window, 48);
    model_runner *r = model_runner_new(m, 1, 8, 0, err);
    CHECK_MSG(r, "%s", err);
    CHECK_EQ(model_runner_max_kv(r), 48);
    model_runner_free(r);
    CHECK(model_runner_new(m, 1, 8, 49, err) == NULL);
    CHECK_MSG(strstr(err, "sliding window"), "%s", err);
    model_free(m);
    p.sliding_window = 4096; /* as long as the context or longer: nothing to cap */
    m = model_load(gen(&p, "phi3_swa_long"), err);
    CHECK_MSG(m, "%s", err);
    CHECK_EQ(model_hparams_of(m)->n_ctx, 128);
    model_free(m);
}

static void test_granite(void)
{
    modelgen_params p = small_params("granite");
    const char *path = gen(&p, "granite");
    CHECK(path);
    char err[ERR_MAX];
    model *m = model_load(path, err);
    CHECK_MSG(m, "%s", err);
    const model_hparams *hp = model_hparams_of(m);
    CHECK_EQ(hp->arch, MODEL_ARCH_GRANITE);
    CHECK_EQ(hp->rope_style, MODEL_ROPE_INTERLEAVED);
    CHECK(hp->embd_scale == 12.0f && hp->residual_scale == 0.22f && hp->logit_scale == 8.0f &&
          hp->attn_scale == 0.015625f);
    model_free(m);
    check_both_paths(path, "granite f32", TOL_FLOAT / 8);
    p.tie_output = true;
    p.type = QTYPE_F16;
    check_both_paths(gen(&p, "granite_tied"), "granite f16 tied", TOL_FLOAT / 8);
}

/* A prefill and the same tokens one at a time give the same logits but for f32 rounding
 * (the products' sums run in other orders); two sequences in one model_forward_batch
 * (8 rows: per-row dot kernels) give each its solo logits bit for bit. */
static void test_prefill_decode_batched(void)
{
    const char *archs[] = {"phi3", "granite"};
    for (int a = 0; a < 2; a++) {
        modelgen_params p = small_params(archs[a]);
        p.rope_dims = a == 0 ? 48 : 0;
        p.rope_orig_ctx = a == 0 ? 64 : 0;
        char err[ERR_MAX];
        model *m = model_load(gen(&p, "pd"), err);
        CHECK_MSG(m, "%s", err);
        int nv = model_hparams_of(m)->n_vocab;
        model_runner *r = model_runner_new(m, 2, 16, 0, err);
        kv_pool *pool = kv_pool_new(model_kv_shape(m), 0, err);
        CHECK(r && pool);
        enum { N = 12 };
        int32_t tok[N], pos[N], tok2[N], rows[N];
        for (int i = 0; i < N; i++)
            tok[i] = (i * 31 + 5) % nv, tok2[i] = (i * 17 + 3) % nv, pos[i] = i, rows[i] = i;
        float *pre = malloc((size_t)N * nv * sizeof(float));
        float *one = malloc((size_t)N * nv * sizeof(float));
        float *alone = malloc((size_t)4 * nv * sizeof(float));
        float *both = malloc((size_t)8 * nv * sizeof(float));
        kv_seq s1, s2;
        kv_seq_init(&s1, pool);
        CHECK(forward(r, &s1, N, tok, pos, pre) == 0);
        kv_seq_free(&s1);
        kv_seq_init(&s1, pool);
        for (int i = 0; i < N; i++)
            CHECK(forward(r, &s1, 1, tok + i, pos + i, one + (size_t)i * nv) == 0);
        double d = 0;
        for (size_t i = 0; i < (size_t)N * nv; i++)
            d = fmax(d, fabs(pre[i] - one[i]));
        printf("  %s: prefill against decode: max |logit diff| %.3g\n", archs[a], d);
        CHECK_MSG(d <= TOL_ROUNDING, "%s: prefill and decode differ by %g", archs[a], d);

        /* s1 holds N entries; s2 a prefill of 8 of tok2; then 4 more rows of each */
        kv_seq_init(&s2, pool);
        CHECK(forward(r, &s2, 8, tok2, pos, both) == 0);
        model_batch b[2] = {
            {.n_tokens = 4, .tokens = tok, .positions = pos + 8, .n_out = 4, .out_rows = rows,
             .logits = both},
            {.n_tokens = 4, .tokens = tok2 + 8, .positions = pos + 8, .n_out = 4,
             .out_rows = rows, .logits = both + (size_t)4 * nv},
        };
        kv_seq *seqs[2] = {&s1, &s2};
        int32_t pos1[4] = {N, N + 1, N + 2, N + 3};
        b[0].positions = pos1;
        CHECK_MSG(model_forward_batch(r, 2, seqs, b, err) == 0, "%s", err);
        kv_seq_truncate(&s2, 8);
        CHECK(forward(r, &s2, 4, tok2 + 8, pos + 8, alone) == 0);
        CHECK_MSG(memcmp(alone, both + (size_t)4 * nv, (size_t)4 * nv * sizeof(float)) == 0,
                  "%s: batched differs from alone", archs[a]);
        kv_seq_truncate(&s1, N);
        CHECK(forward(r, &s1, 4, tok, pos1, alone) == 0);
        CHECK_MSG(memcmp(alone, both, (size_t)4 * nv * sizeof(float)) == 0,
                  "%s: batched differs from alone", archs[a]);
        kv_seq_free(&s1);
        kv_seq_free(&s2);
        free(pre), free(one), free(alone), free(both);
        kv_pool_free(pool);
        model_runner_free(r);
        model_free(m);
    }
}

/* Rewrites src into dst: without tensor drop / key drop_key, tensor reshape given shape ne
 * (its data cut to that size), u32 key set_key set to set_val (any NULL: none). */
static int rewrite(const char *src, const char *dst, const char *drop, const char *drop_key,
                   const char *reshape, const int64_t *ne, const char *set_key,
                   uint32_t set_val)
{
    char err[ERR_MAX];
    gguf_file *g = gguf_open(src, err);
    if (!g)
        return -1;
    gguf_writer *w = gguf_writer_new();
    for (int64_t i = 0; i < gguf_n_kv(g); i++) {
        gguf_str k = gguf_key(g, i);
        bool skip = (drop_key && gguf_str_eq(k, drop_key)) || (set_key && gguf_str_eq(k, set_key));
        if (!skip)
            gguf_writer_copy_kv(w, g, i);
    }
    if (set_key)
        gguf_writer_set_u32(w, set_key, set_val);
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        if (drop && !strcmp(name, drop))
            continue;
        gguf_writer_add_tensor(w, name, t->type, t->n_dims,
                               reshape && !strcmp(name, reshape) ? ne : t->ne, t->data);
    }
    int rc = gguf_writer_write(w, dst, err);
    gguf_writer_free(w);
    gguf_close(g);
    return rc;
}

static void expect_refused(const char *dst, const char *want, const char *want2)
{
    char err[ERR_MAX] = "";
    model *m = model_load(dst, err);
    CHECK_MSG(m == NULL, "loaded a file that lacks %s", want);
    model_free(m);
    CHECK_MSG(strstr(err, want) && (!want2 || strstr(err, want2)), "%s", err);
}

static void test_refusals(void)
{
    modelgen_params p = small_params("phi3");
    p.rope_orig_ctx = 64;
    char src[512], dst[512];
    snprintf(src, sizeof src, "%s", gen(&p, "phi3_valid"));
    snprintf(dst, sizeof dst, "%s/phi3_broken.gguf", test_tmpdir());
    char err[ERR_MAX];
    model *m = model_load(src, err);
    CHECK_MSG(m, "%s", err);
    model_free(m);

    const char *required[] = {"blk.1.attn_qkv.weight", "blk.0.ffn_up.weight",
                              "blk.0.attn_output.weight", "output_norm.weight"};
    for (size_t i = 0; i < sizeof required / sizeof *required; i++) {
        CHECK(rewrite(src, dst, required[i], NULL, NULL, NULL, NULL, 0) == 0);
        expect_refused(dst, required[i], "missing");
    }
    CHECK(rewrite(src, dst, "rope_factors_short.weight", NULL, NULL, NULL, NULL, 0) == 0);
    expect_refused(dst, "rope_factors_short.weight", "missing");
    /* fused shapes that do not add up: q, k and v of an MHA model; gate alone */
    int64_t qkv[2] = {256, 3 * 256}, up[2] = {256, 384};
    CHECK(rewrite(src, dst, NULL, NULL, "blk.0.attn_qkv.weight", qkv, NULL, 0) == 0);
    expect_refused(dst, "blk.0.attn_qkv.weight", "(q, k, v)");
    CHECK(rewrite(src, dst, NULL, NULL, "blk.1.ffn_up.weight", up, NULL, 0) == 0);
    expect_refused(dst, "blk.1.ffn_up.weight", "(gate, up)");
    CHECK(rewrite(src, dst, NULL, "phi3.attention.sliding_window", NULL, NULL, NULL, 0) == 0);
    expect_refused(dst, "phi3.attention.sliding_window", "missing");
    CHECK(rewrite(src, dst, NULL, "phi3.attention.layer_norm_rms_epsilon", NULL, NULL, NULL,
                  0) == 0);
    expect_refused(dst, "phi3.attention.layer_norm_rms_epsilon", "missing");
    CHECK(rewrite(src, dst, NULL, NULL, NULL, NULL, "phi3.rope.dimension_count", 66) == 0);
    expect_refused(dst, "phi3.rope.dimension_count", "above the head dimension");

    p = small_params("granite");
    snprintf(src, sizeof src, "%s", gen(&p, "granite_valid"));
    const char *keys[] = {"granite.embedding_scale", "granite.residual_scale",
                          "granite.attention.scale", "granite.logit_scale"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        CHECK(rewrite(src, dst, NULL, keys[i], NULL, NULL, NULL, 0) == 0);
        expect_refused(dst, keys[i], "missing");
    }
}

/* An adapter of phi3's fused attn_qkv or ffn_up is refused, naming the matrix. */
static void test_lora_on_fused_refused(void)
{
    modelgen_params p = small_params("phi3");
    char err[ERR_MAX];
    model *m = model_load(gen(&p, "phi3_lora_base"), err);
    CHECK_MSG(m, "%s", err);
    const char *fused[] = {"blk.0.attn_qkv.weight", "blk.1.ffn_up.weight"};
    int64_t outs[] = {256 + 2 * 128, 2 * 384};
    float *a = calloc(256 * 4, sizeof(float)), *b = calloc(4 * 768, sizeof(float));
    for (int i = 0; i < 2; i++) {
        char path[512], name[96];
        snprintf(path, sizeof path, "%s/phi3_lora.gguf", test_tmpdir());
        gguf_writer *w = gguf_writer_new();
        gguf_writer_set_str(w, "general.type", "adapter");
        gguf_writer_set_str(w, "general.architecture", "phi3");
        gguf_writer_set_str(w, "adapter.type", "lora");
        gguf_writer_set_f32(w, "adapter.lora.alpha", 4.0f);
        int64_t na[2] = {256, 4}, nb[2] = {4, outs[i]};
        snprintf(name, sizeof name, "%s.lora_a", fused[i]);
        gguf_writer_add_tensor(w, name, QTYPE_F32, 2, na, a);
        snprintf(name, sizeof name, "%s.lora_b", fused[i]);
        gguf_writer_add_tensor(w, name, QTYPE_F32, 2, nb, b);
        CHECK_MSG(gguf_writer_write(w, path, err) == 0, "%s", err);
        gguf_writer_free(w);
        lora *l = lora_load(m, path, err);
        CHECK_MSG(l == NULL, "an adapter of %s loaded", fused[i]);
        lora_free(l);
        CHECK_MSG(strstr(err, fused[i]) && strstr(err, "fused"), "%s", err);
    }
    free(a);
    free(b);
    model_free(m);
}

int main(void)
{
    RUN(test_phi3_full_rotary);
    RUN(test_phi3_partial_rotary_tied);
    RUN(test_phi3_longrope);
    RUN(test_phi3_sliding_window_caps_context);
    RUN(test_granite);
    RUN(test_prefill_decode_batched);
    RUN(test_refusals);
    RUN(test_lora_on_fused_refused);
    return test_finish();
}
