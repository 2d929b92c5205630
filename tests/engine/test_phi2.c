/*
 * phi2 (Phi-2 in llama.cpp's layout) in the decoder engine, against the double-precision
 * reference (tests/support/ref_forward.c, from Hugging Face's modeling_phi): one
 * LayerNorm with bias read by the attention and the feed-forward side by side, their
 * outputs added to the residual together; q/k/v/o with biases; NEOX RoPE over 0.4 of each
 * head; the ungated feed-forward ffn_down(gelu_tanh(ffn_up x + b)) + b; the final
 * LayerNorm and an output matrix with a bias.
 *
 * Models are modelgen's on a synthetic 260-token vocabulary, with q, k and v as three
 * matrices (today's converter) and as one attn_qkv with its bias (files converted from
 * HF's older Wqkv). The checks: the hyper-parameters the loader reads; logits against the
 * reference on every attention path (a 40-row prefill on sgemm, sub-batches of 8 on
 * per-row attention, gapped and out-of-order batches) in float and 8-bit weights; decodes
 * on compressed KV chunks; mutations of the file that take away what phi2 adds (its
 * biases, the output's bias, the LayerNorm biases, the parallel feed-forward: the same
 * weights as starcoder2's sequential layer) move the reference past the tolerance, so the
 * comparison would catch an engine that ignored them; a prefill equals the same tokens
 * decoded one by one; sequences stacked in one step equal each alone, bit for bit; the
 * partitioned long-prompt prefill equals one whole step; a file without a tensor or key
 * it needs is refused, naming it. Tolerances are test_model.c's.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf/gguf.h"
#include "engine/gguf/modelgen.h"
#include "engine/model/model.h"
#include "engine/quant/quant.h"
#include "tests/support/gguf_copy.h"
#include "tests/support/model_check.h"
#include "tests/support/ref_forward.h"
#include "tests/support/test.h"

#define TOL_FLOAT 0.02
#define TOL_QUANT 0.2
#define TOL_PART 1e-3
#define TOL_KV_INT8 0.06
#define TOL_KV_INT4 0.8
#define N_VOCAB 260
#define N_LAYER 4

static modelgen_params phi2_params(uint32_t type)
{
    return (modelgen_params){.arch = "phi2", .dim = 128, .n_layer = N_LAYER, .n_head = 4,
                             .n_head_kv = 4, .n_ff = 512, .n_ctx = 512, .type = type,
                             .seed = 29, .n_vocab = N_VOCAB, .n_threads = 1};
}

static const char *gen(const modelgen_params *p, const char *name)
{
    static char path[4][512];
    static int k;
    char *out = path[k++ % 4];
    snprintf(out, sizeof path[0], "%s/phi2-%s.gguf", test_tmpdir(), name);
    char err[ERR_MAX];
    if (modelgen_write(p, out, err) < 0) {
        fprintf(stderr, "modelgen: %s\n", err);
        return NULL;
    }
    return out;
}

/* p's file, rewritten with its q, k and v fused when fused (name distinguishes them). */
static const char *gen_variant(const modelgen_params *p, const char *name, bool fused)
{
    const char *path = gen(p, name);
    if (!path || !fused)
        return path;
    static char out[512];
    snprintf(out, sizeof out, "%s/phi2-%s-fused.gguf", test_tmpdir(), name);
    gguf_edit e = {.fuse_qkv = true};
    char err[ERR_MAX];
    return gguf_copy_edited(path, out, &e, err) == 0 ? out : NULL;
}

/* A prefill of 40, 6 decodes, then a fresh sequence with gapped and out-of-order batches
 * (positions 0..7, 30..37, then 12..15 after them). */
static const model_check_plan PLAN = {.n_prefill = 40, .n_total = 46, .gap_b = 30, .gap_c = 12};

/* ---- hyper-parameters ---- */

static void test_metadata(void)
{
    char err[ERR_MAX] = "modelgen";
    for (int fused = 0; fused < 2; fused++) {
        modelgen_params p = phi2_params(QTYPE_F32);
        const char *path = gen_variant(&p, "meta", fused);
        model *m = path ? model_load(path, err) : NULL;
        CHECK_MSG(m, "%s", err);
        const model_hparams *hp = model_hparams_of(m);
        CHECK_EQ(hp->arch, (int)MODEL_ARCH_PHI2);
        CHECK_EQ(hp->norm, MODEL_NORM_LAYER);
        CHECK_EQ(hp->ffn_act, MODEL_FFN_GELU_TANH_UNGATED);
        CHECK(hp->parallel && hp->pre_norms && !hp->post_norms);
        CHECK_EQ(hp->rope_style, MODEL_ROPE_HALVES);
        CHECK_EQ(hp->rope_dims, 12); /* int(0.4 * 128) / 4, even */
        CHECK_NEAR(hp->norm_eps, 1e-5, 1e-12);
        CHECK_NEAR(hp->rope_base, 10000.0, 1e-3);
        model_free(m);
    }
}

/* ---- the forward against the reference ---- */

static void test_logits_vs_reference(void)
{
    const uint32_t types[] = {QTYPE_F32, QTYPE_F16, QTYPE_Q8_0};
    for (int fused = 0; fused < 2; fused++)
        for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
            modelgen_params p = phi2_params(types[t]);
            const char *path = gen_variant(&p, "ref", fused);
            CHECK(path);
            bool f16_rounds = types[t] == QTYPE_F16 && quant_f16_rounds_activation(p.dim);
            double tol = types[t] == QTYPE_F32 || (types[t] == QTYPE_F16 && !f16_rounds)
                             ? TOL_FLOAT : TOL_QUANT;
            /* 512: the 40-row prefill takes sgemm attention; 8: dot kernels and per-row
             * attention in sub-batches */
            double d1 = model_check_file(path, 512, 2, &PLAN);
            double d2 = model_check_file(path, 8, 1, &PLAN);
            printf("  %s%s: max |logit diff| %.4g (sgemm) %.4g (per row)\n",
                   quant_traits_of(types[t])->name, fused ? " attn_qkv" : "", d1, d2);
            CHECK_MSG(d1 <= tol && d2 <= tol, "%s%s: %g %g > %g",
                      quant_traits_of(types[t])->name, fused ? " attn_qkv" : "", d1, d2, tol);
        }
}

/* Decodes on the prefix's chunks compressed to 8 and 4 bits (and left f16) against the
 * reference's exact KV. */
static void test_compressed_kv(void)
{
    char err[ERR_MAX];
    modelgen_params p = phi2_params(QTYPE_F32);
    model *m = model_load(gen(&p, "kv"), err);
    CHECK_MSG(m, "%s", err);
    ref_model *rm = ref_model_load(model_gguf(m));
    CHECK(rm);
    double e16 = model_check_compressed(m, rm, KV_F16);
    double e8 = model_check_compressed(m, rm, KV_INT8), e4 = model_check_compressed(m, rm, KV_INT4);
    printf("  max |logit diff| vs exact KV: f16 %.4f int8 %.4f int4 %.4f\n", e16, e8, e4);
    CHECK(e16 <= TOL_FLOAT);
    CHECK(e8 <= TOL_KV_INT8);
    CHECK(e4 <= TOL_KV_INT4);
    ref_model_free(rm);
    model_free(m);
}

/* The reference of each mutated file (the same weights without one of phi2's parts) is
 * more than 5 float tolerances from the original's: a forward that skipped that part
 * would fail the comparison above. */
static void test_parts_matter(void)
{
    static const struct {
        const char *what;
        gguf_edit edit;
    } muts[] = {
        {"q/k/v/o biases",
         {.zero = {"blk.*.attn_q.bias", "blk.*.attn_k.bias", "blk.*.attn_v.bias",
                   "blk.*.attn_output.bias"}}},
        {"feed-forward's biases", {.zero = {"blk.*.ffn_up.bias", "blk.*.ffn_down.bias"}}},
        {"output's bias", {.zero = {"output.bias"}}},
        {"LayerNorm biases", {.zero = {"blk.*.attn_norm.bias", "output_norm.bias"}}},
        {"parallel feed-forward",
         {.rename = "starcoder2",
          .copy_from = {"blk.*.attn_norm.weight", "blk.*.attn_norm.bias"},
          .copy_to = {"blk.*.ffn_norm.weight", "blk.*.ffn_norm.bias"}}},
    };
    modelgen_params p = phi2_params(QTYPE_F32);
    const char *src = gen(&p, "whole");
    CHECK(src);
    for (size_t c = 0; c < sizeof muts / sizeof *muts; c++) {
        double d = model_check_part_matters(src, &muts[c].edit, false);
        printf("  without its %s: the reference moves by %.3g\n", muts[c].what, d);
        CHECK_MSG(d > 5 * TOL_FLOAT, "%s: %g", muts[c].what, d);
    }
}

/* ---- the engine's paths against each other ---- */

/* A prefill of 48 tokens gives the logits of 48 single-token decodes (sgemm attention over
 * f32 K/V against per-row attention over f16 blocks: rounding apart). */
static void test_prefill_equals_decode(void)
{
    modelgen_params p = phi2_params(QTYPE_F32);
    const char *path = gen(&p, "pd");
    CHECK(path);
    double d = model_check_prefill_vs_decode(path);
    printf("  prefill vs decode %.2g\n", d);
    CHECK(d <= TOL_PART);
}

/* Three sequences advanced in one step (two decode rows and a slice of 5: 7 stacked rows)
 * give each one's logits alone, bit for bit (f32 weights: per-row dot kernels, per-row
 * attention, as alone). */
static void test_batched_equals_alone(void)
{
    modelgen_params p = phi2_params(QTYPE_F32);
    const char *path = gen(&p, "bat");
    CHECK(path);
    double d;
    CHECK_MSG(model_check_batched_vs_alone(path, &d) == 1, "%g", d);
}

/* Score blocks of fewer rows (moderate partitioning) and row slices (severe: each slice's
 * K/V appended before the next; slices under 16 rows take the per-row path) give the
 * unpartitioned logits and hidden rows, after a history left f16 and one compressed to 8
 * bits. */
static void test_partitioned_prefill(void)
{
    const enum kv_precision hist[] = {KV_F16, KV_INT8};
    modelgen_params p = phi2_params(QTYPE_F32);
    const char *path = gen(&p, "part");
    CHECK(path);
    double d = model_check_partitioned_shapes(path, hist, 2);
    CHECK_MSG(d <= TOL_PART, "%g", d);
    printf("  partitioned vs whole: %.2g\n", d);
}

/* ---- refusals ---- */

/* A file without a tensor phi2 needs (its biases and output matrix included, as llama.cpp
 * requires them; a fused file's attn_qkv.bias) or without its LayerNorm epsilon is
 * refused, naming it. */
static void test_missing_parts_refused(void)
{
    static const struct {
        const char *tensor;
        bool fused;
    } needed[] = {
        {"output.bias", false},          {"output.weight", false},
        {"blk.1.attn_output.bias", false}, {"blk.2.ffn_up.bias", false},
        {"blk.3.ffn_down.bias", false},  {"blk.0.attn_norm.bias", false},
        {"blk.2.attn_k.bias", false},    {"output_norm.bias", false},
        {"blk.1.attn_qkv.bias", true},
    };
    char err[ERR_MAX], dst[512];
    snprintf(dst, sizeof dst, "%s/phi2-broken.gguf", test_tmpdir());
    modelgen_params p = phi2_params(QTYPE_F16);
    const char *src = gen(&p, "whole");
    CHECK(src);
    for (size_t i = 0; i < sizeof needed / sizeof *needed; i++) {
        gguf_edit e = {.drop = {needed[i].tensor}, .fuse_qkv = needed[i].fused};
        CHECK(gguf_copy_edited(src, dst, &e, err) == 0);
        err[0] = '\0';
        CHECK(model_load(dst, err) == NULL);
        printf("  refused: %s\n", err);
        CHECK_MSG(strstr(err, needed[i].tensor) && strstr(err, "missing"), "%s", err);
    }
    gguf_edit e = {.drop_key = "phi2.attention.layer_norm_epsilon"};
    CHECK(gguf_copy_edited(src, dst, &e, err) == 0);
    err[0] = '\0';
    CHECK(model_load(dst, err) == NULL);
    printf("  refused: %s\n", err);
    CHECK_MSG(strstr(err, "phi2.attention.layer_norm_epsilon"), "%s", err);
}

int main(void)
{
    RUN(test_metadata);
    RUN(test_logits_vs_reference);
    RUN(test_compressed_kv);
    RUN(test_parts_matter);
    RUN(test_prefill_equals_decode);
    RUN(test_batched_equals_alone);
    RUN(test_partitioned_prefill);
    RUN(test_missing_parts_refused);
    return test_finish();
}
