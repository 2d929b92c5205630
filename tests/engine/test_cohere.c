/*
 * Cohere's architectures in the decoder engine, against the double-precision reference
 * (tests/support/ref_forward.c, written from Hugging Face's modeling_cohere and
 * modeling_cohere2): command-r (Command-R, Aya 23, Aya Expanse: one LayerNorm without bias
 * feeding attention and the feed-forward in parallel, interleaved RoPE, tied output,
 * logits times logit_scale), the same with Command-R+'s per-head q/k LayerNorms (64
 * layers, where llama.cpp reads them), and cohere2 (Command R7B, Command A: three sliding
 * layers of four, the fourth global and without RoPE).
 *
 * Models are modelgen's on a synthetic 260-token vocabulary, one case each. For each: the
 * hyper-parameters the loader reads; logits against the reference on every attention path
 * (a 40-row prefill on sgemm, sub-batches of 8 on per-row attention, gapped and
 * out-of-order batches) in float and 8-bit weights, and over compressed KV chunks; a
 * mutation that removes one of the architecture's parts (the parallel residual, the logit
 * scale, the q/k norms, the window, the global layers' missing RoPE) moves the reference
 * past the tolerance, so the comparison would catch an engine that ignored it; a prefill
 * equals the same tokens decoded one by one; sequences stacked in one step equal each
 * alone, bit for bit; the partitioned long-prompt prefill equals one whole step; a file
 * without a tensor or key the architecture needs is refused, naming it. Tolerances are
 * test_archs.c's and test_gemma.c's.
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
#define WINDOW 16 /* cohere2's: the plan's 46 positions reach well past it */

typedef struct cohere_case {
    const char *label;
    const char *arch;
    int n_layer, dim;
    const char *needed[3]; /* tensors and keys a file must have, NULL-ended */
} cohere_case;

enum { C_COMMAND_R, C_COMMAND_R_PLUS, C_COHERE2, N_CASES };

static const cohere_case CASES[N_CASES] = {
    [C_COMMAND_R] = {"command-r", "command-r", 4, 128,
                     {"blk.2.attn_norm.weight", "command-r.attention.layer_norm_epsilon", NULL}},
    [C_COMMAND_R_PLUS] = {"command-r+", "command-r", 64, 64,
                          {"blk.63.attn_k_norm.weight", "blk.5.attn_q_norm.weight", NULL}},
    [C_COHERE2] = {"cohere2", "cohere2", 4, 128,
                   {"cohere2.attention.sliding_window", "cohere2.logit_scale", NULL}},
};

static modelgen_params cohere_params(const cohere_case *c, uint32_t type)
{
    bool cohere2 = !strcmp(c->arch, "cohere2");
    return (modelgen_params){.arch = c->arch, .dim = c->dim, .n_layer = c->n_layer,
                             .n_head = 4, .n_head_kv = 2, .n_ff = 2 * c->dim, .n_ctx = 512,
                             .type = type, .seed = 13, .n_vocab = N_VOCAB, .n_threads = 1,
                             .sliding_window = cohere2 ? WINDOW : 0};
}

static const char *gen(const modelgen_params *p, const char *name)
{
    static char path[4][512];
    static int k;
    char *out = path[k++ % 4];
    snprintf(out, sizeof path[0], "%s/%s-%d-%s.gguf", test_tmpdir(), p->arch, p->n_layer, name);
    char err[ERR_MAX];
    if (modelgen_write(p, out, err) < 0) {
        fprintf(stderr, "modelgen: %s\n", err);
        return NULL;
    }
    return out;
}

/* A prefill of 40, 6 decodes, then a fresh sequence with gapped and out-of-order batches
 * (positions 0..7, 30..37, then 12..15 after them). */
static const model_check_plan PLAN = {.n_prefill = 40, .n_total = 46, .gap_b = 30, .gap_c = 12};

/* ---- hyper-parameters ---- */

static model *load_case(const cohere_case *c, const char *name)
{
    char err[ERR_MAX] = "modelgen";
    modelgen_params p = cohere_params(c, QTYPE_F32);
    const char *path = gen(&p, name);
    model *m = path ? model_load(path, err) : NULL;
    if (!m)
        fprintf(stderr, "%s: %s\n", c->label, err);
    return m;
}

static void test_metadata(void)
{
    for (int c = 0; c < N_CASES; c++) {
        model *m = load_case(&CASES[c], "meta");
        CHECK(m);
        const model_hparams *hp = model_hparams_of(m);
        bool cohere2 = c == C_COHERE2;
        CHECK_EQ(hp->arch, (int)(cohere2 ? MODEL_ARCH_COHERE2 : MODEL_ARCH_COMMAND_R));
        CHECK_EQ(hp->norm, MODEL_NORM_LAYER);
        CHECK_EQ(hp->rope_style, MODEL_ROPE_INTERLEAVED);
        CHECK(hp->parallel && hp->pre_norms && !hp->post_norms);
        CHECK_NEAR(hp->norm_eps, 1e-5, 1e-12);
        CHECK_NEAR(hp->rope_base, cohere2 ? 50000.0 : 10000.0, 1e-3);
        /* modelgen's logit_scale 2, which multiplies: hp holds its reciprocal */
        CHECK_NEAR(hp->logit_scale, 0.5, 1e-7);
        CHECK_NEAR(hp->attn_scale, 1.0 / sqrt(hp->head_dim), 1e-7);
        CHECK(model_output_matrix(m)->data == model_token_embedding(m)->data);
        CHECK_EQ(hp->swa_window, cohere2 ? WINDOW : 0);
        for (int l = 0; l < hp->n_layer; l++) {
            bool global = cohere2 && l % 4 == 3;
            CHECK_MSG(model_layer_rotates(hp, l) == !global, "%s layer %d", CASES[c].label, l);
            CHECK_MSG(model_layer_window(hp, l) == (cohere2 && !global ? WINDOW : 0),
                      "%s layer %d", CASES[c].label, l);
            model_layer_tensors t;
            model_layer_tensors_of(m, l, &t);
            CHECK(t.attn_norm && !t.ffn_norm);
            CHECK(!t.extras.q_norm_heads == (c != C_COMMAND_R_PLUS));
            CHECK(!t.extras.k_norm_heads == (c != C_COMMAND_R_PLUS));
        }
        model_free(m);
    }
}

/* cohere2 with attention.sliding_window_pattern 2 (the key llama.cpp reads, default 4):
 * the even layers slide and rotate, the odd ones attend globally without RoPE, in the
 * loader's layers and in the logits against the reference, which reads the key too. */
static void test_window_pattern(void)
{
    char err[ERR_MAX], dst[512];
    snprintf(dst, sizeof dst, "%s/pattern2.gguf", test_tmpdir());
    modelgen_params p = cohere_params(&CASES[C_COHERE2], QTYPE_F32);
    const char *src = gen(&p, "pattern");
    gguf_edit e = {.num_key = "cohere2.attention.sliding_window_pattern", .num_value = 2};
    CHECK(src && gguf_copy_edited(src, dst, &e, err) == 0);
    model *m = model_load(dst, err);
    CHECK_MSG(m, "%s", err);
    const model_hparams *hp = model_hparams_of(m);
    for (int l = 0; l < hp->n_layer; l++) {
        CHECK_MSG(model_layer_rotates(hp, l) == (l % 2 == 0), "layer %d", l);
        CHECK_MSG(model_layer_window(hp, l) == (l % 2 == 0 ? WINDOW : 0), "layer %d", l);
    }
    model_free(m);
    double d = model_check_file(dst, 512, 2, &PLAN);
    printf("  cohere2, pattern 2: max |logit diff| %.4g\n", d);
    CHECK(d <= TOL_FLOAT);
}

/* ---- the forward against the reference ---- */

static void test_logits_vs_reference(void)
{
    const uint32_t types[] = {QTYPE_F32, QTYPE_F16, QTYPE_Q8_0};
    for (int c = 0; c < N_CASES; c++)
        for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
            modelgen_params p = cohere_params(&CASES[c], types[t]);
            const char *path = gen(&p, "ref");
            CHECK(path);
            bool f16_rounds = types[t] == QTYPE_F16 && quant_f16_rounds_activation(p.dim);
            /* 8-bit activations' rounding adds up over the layers as a random walk:
             * Command-R+'s 64 take sqrt(64 / 4) times the 4 layers' tolerance */
            double tol = types[t] == QTYPE_F32 || (types[t] == QTYPE_F16 && !f16_rounds)
                             ? TOL_FLOAT : TOL_QUANT * sqrt(p.n_layer / 4.0);
            /* 512: the 40-row prefill takes sgemm attention; 8: dot kernels and per-row
             * attention in sub-batches */
            double d1 = model_check_file(path, 512, 2, &PLAN);
            double d2 = model_check_file(path, 8, 1, &PLAN);
            printf("  %s %s: max |logit diff| %.4g (sgemm) %.4g (per row)\n", CASES[c].label,
                   quant_traits_of(types[t])->name, d1, d2);
            CHECK_MSG(d1 <= tol && d2 <= tol, "%s %s: %g %g > %g", CASES[c].label,
                      quant_traits_of(types[t])->name, d1, d2, tol);
        }
}

/* Decode and sgemm attention over chunks compressed to int8 and int4 (and back in f16)
 * against the reference's exact KV. */
static void test_compressed_kv(void)
{
    char err[ERR_MAX];
    for (int c = 0; c < N_CASES; c++) {
        modelgen_params p = cohere_params(&CASES[c], QTYPE_F32);
        model *m = model_load(gen(&p, "kvq"), err);
        CHECK_MSG(m, "%s", err);
        ref_model *rm = ref_model_load(model_gguf(m));
        CHECK(rm);
        double e8 = model_check_compressed(m, rm, KV_INT8);
        double e4 = model_check_compressed(m, rm, KV_INT4);
        double e16 = model_check_compressed(m, rm, KV_F16);
        printf("  %s: max |logit diff| vs exact KV: f16 %.4f int8 %.4f int4 %.4f\n",
               CASES[c].label, e16, e8, e4);
        CHECK(e16 <= TOL_FLOAT);
        CHECK(e8 <= TOL_KV_INT8);
        CHECK(e4 <= TOL_KV_INT4);
        ref_model_free(rm);
        model_free(m);
    }
}

/* What each mutation takes away: the reference of the mutated model (the same weights) is
 * more than 5 float tolerances from the original's, so a forward that skipped that part
 * would fail the comparisons above. */
typedef struct cohere_mutation {
    int c;              /* the case */
    const char *what;
    gguf_edit edit;   /* the file without the part, or nothing */
    bool sequential;    /* the reference's MLP reads the norm after attention's add */
} cohere_mutation;

static const cohere_mutation MUTATIONS[] = {
    {C_COMMAND_R, "parallel residual", {0}, true},
    {C_COMMAND_R, "logit scale", {.num_key = "command-r.logit_scale", .num_value = 1.0}, false},
    {C_COMMAND_R_PLUS, "q/k norms",
     {.drop = {"blk.*.attn_q_norm.weight", "blk.*.attn_k_norm.weight"}}, false},
    {C_COHERE2, "sliding window",
     {.num_key = "cohere2.attention.sliding_window", .num_value = 4096}, false},
    /* command-r's layers: none slides, every one rotates */
    {C_COHERE2, "window and global NoPE layers", {.rename = "command-r"}, false},
};

static void test_parts_matter(void)
{
    for (size_t k = 0; k < sizeof MUTATIONS / sizeof *MUTATIONS; k++) {
        const cohere_mutation *mu = &MUTATIONS[k];
        modelgen_params p = cohere_params(&CASES[mu->c], QTYPE_F32);
        const char *src = gen(&p, "whole");
        CHECK(src);
        double d = model_check_part_matters(src, &mu->edit, mu->sequential);
        printf("  %s without its %s: the reference moves by %.3g\n", CASES[mu->c].label,
               mu->what, d);
        CHECK_MSG(d > 5 * TOL_FLOAT, "%s %s: %g", CASES[mu->c].label, mu->what, d);
    }
}

/* ---- the engine's paths against each other ---- */

/* A prefill of 48 tokens gives the logits of 48 single-token decodes (sgemm attention over
 * f32 K/V against per-row attention over f16 blocks: rounding apart). */
static void test_prefill_equals_decode(void)
{
    for (int c = 0; c < N_CASES; c++) {
        modelgen_params p = cohere_params(&CASES[c], QTYPE_F32);
        const char *path = gen(&p, "pd");
        CHECK(path);
        double d = model_check_prefill_vs_decode(path);
        printf("  %s: prefill vs decode %.2g\n", CASES[c].label, d);
        CHECK(d <= TOL_PART);
    }
}

/* Three sequences advanced in one step (two decode rows and a slice of 5: 7 stacked rows)
 * give each one's logits alone, bit for bit (f32 weights: per-row dot kernels, per-row
 * attention, as alone). */
static void test_batched_equals_alone(void)
{
    for (int c = 0; c < N_CASES; c++) {
        modelgen_params p = cohere_params(&CASES[c], QTYPE_F32);
        const char *path = gen(&p, "bat");
        CHECK(path);
        double d;
        CHECK_MSG(model_check_batched_vs_alone(path, &d) == 1, "%s: %g", CASES[c].label, d);
    }
}

/* Score blocks of fewer rows (moderate partitioning) and row slices (severe: each slice's
 * K/V appended before the next; slices under 16 rows take the per-row path) give the
 * unpartitioned logits and hidden rows, after a history left f16 and one compressed to 8 bits. */
static void test_partitioned_prefill(void)
{
    const enum kv_precision hist[] = {KV_F16, KV_INT8};
    double worst = 0;
    for (int c = 0; c < N_CASES; c++) {
        modelgen_params p = cohere_params(&CASES[c], QTYPE_F32);
        const char *path = gen(&p, "part");
        CHECK(path);
        double d = model_check_partitioned_shapes(path, hist, 2);
        CHECK_MSG(d <= TOL_PART, "%s: %g", CASES[c].label, d);
        worst = fmax(worst, d);
    }
    printf("  partitioned vs whole: %.2g\n", worst);
}

/* ---- refusals ---- */

/* A file without a tensor or key its architecture needs is refused, naming it; so is a
 * Command-R+ file with a q norm of one row (qwen3's shape, shared by every head), naming
 * its shape. */
static void test_missing_parts_refused(void)
{
    char err[ERR_MAX], dst[512];
    snprintf(dst, sizeof dst, "%s/broken.gguf", test_tmpdir());
    for (int c = 0; c < N_CASES; c++) {
        modelgen_params p = cohere_params(&CASES[c], QTYPE_F16);
        const char *src = gen(&p, "whole");
        CHECK(src);
        for (int i = 0; CASES[c].needed[i]; i++) {
            const char *need = CASES[c].needed[i];
            bool key = strncmp(need, "blk.", 4) != 0;
            gguf_edit e = {.drop = {key ? NULL : need}, .drop_key = key ? need : NULL};
            CHECK(gguf_copy_edited(src, dst, &e, err) == 0);
            err[0] = '\0';
            CHECK(model_load(dst, err) == NULL);
            printf("  %s: refused: %s\n", CASES[c].label, err);
            CHECK_MSG(strstr(err, need) && strstr(err, "missing"), "%s: %s", CASES[c].label, err);
        }
    }
    modelgen_params p = cohere_params(&CASES[C_COMMAND_R_PLUS], QTYPE_F16);
    const char *src = gen(&p, "whole");
    CHECK(src);
    gguf_edit e = {.first_row = "blk.7.attn_q_norm.weight"};
    CHECK(gguf_copy_edited(src, dst, &e, err) == 0);
    err[0] = '\0';
    CHECK(model_load(dst, err) == NULL);
    printf("  command-r+: refused: %s\n", err);
    CHECK_MSG(strstr(err, "blk.7.attn_q_norm.weight") && strstr(err, "shape"), "%s", err);
}

int main(void)
{
    RUN(test_metadata);
    RUN(test_window_pattern);
    RUN(test_logits_vs_reference);
    RUN(test_compressed_kv);
    RUN(test_parts_matter);
    RUN(test_prefill_equals_decode);
    RUN(test_batched_equals_alone);
    RUN(test_partitioned_prefill);
    RUN(test_missing_parts_refused);
    return test_finish();
}
