/*
 * The smaller architectures of llama.cpp's layout in the decoder engine, each against the
 * double-precision reference (tests/support/ref_forward.c, written from Hugging Face's
 * modeling code): olmo2 (OLMo 2: norms of the sublayers' outputs, none of their inputs,
 * q/k norms over the whole projections), granitemoe (Granite 3.x MoE: granite's scales
 * around Mixtral-like experts; with Granite MoE Shared's ungated shared expert too),
 * smollm3 (SmolLM3: llama with no RoPE on every fourth layer), exaone (EXAONE 3.5: llama
 * with NEOX RoPE), stablelm (StableLM 2 1.6B: LayerNorms with biases, a quarter of each
 * head rotated, q/k/v biases), mistral3 (Ministral 3: llama with YaRN whose
 * yarn_log_multiplier cancels its attention factor, and Llama 4's attention temperature
 * on the queries past the original context), exaone4 (EXAONE 4.0: OLMo 2's output norms
 * with qwen3's per-head q/k norms; the 32B's sliding layers with RoPE beside global ones
 * without).
 *
 * Models are modelgen's on a synthetic 260-token vocabulary, one case per architecture.
 * For each: the hyper-parameters the loader reads; logits against the reference on every
 * attention path (a 40-row prefill on sgemm, sub-batches of 8 on per-row attention,
 * gapped and out-of-order batches) in float and 8-bit weights; a mutation of the file
 * that removes what the architecture adds moves the reference past the tolerance (so the
 * comparison would catch an engine that ignored it); a prefill equals the same tokens
 * decoded one by one; sequences stacked in one step equal each alone, bit for bit; the
 * partitioned long-prompt prefill (score blocks, row slices) equals one whole step; a file
 * without a tensor the architecture needs is refused, naming it (and what its keys may not
 * say). Tolerances are test_model.c's: TOL_FLOAT for f32/f16 weights, TOL_QUANT for Q8_0's
 * 8-bit activations, TOL_PART (relative) between two paths of the engine. Q8_0's mixtures
 * use every expert, as test_moe's: the activations' rounding may flip a near-tied router
 * choice that the reference makes the other way.
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
#define N_VOCAB 260

typedef struct arch_case {
    const char *arch;
    const char *label;     /* the case's name */
    int n_expert, n_expert_used, n_ff_shexp; /* modelgen's (0: a dense model) */
    const char *what;      /* what the mutation takes away */
    gguf_edit mutation;    /* the same weights without the architecture's own part */
    const char *needed[3]; /* tensors a file must have, NULL-ended */
    int rope_orig_ctx;     /* modelgen's (mistral3: YaRN's original context) */
    int sliding_window;    /* modelgen's (exaone4: the 32B's hybrid attention) */
} arch_case;

static const arch_case CASES[] = {
    {"olmo2", "olmo2", 0, 0, 0, "post norms",
     {.drop = {"blk.*.post_attention_norm.weight", "blk.*.post_ffw_norm.weight"}},
     {"blk.1.post_ffw_norm.weight", "blk.0.attn_k_norm.weight", NULL}, 0, 0},
    {"granitemoe", "granitemoe", 8, 2, 0, "residual scale",
     {.num_key = "granitemoe.residual_scale", .num_value = 1.0},
     {"blk.1.ffn_gate_exps.weight", "blk.0.ffn_gate_inp.weight", NULL}, 0, 0},
    {"granitemoe", "granitemoe shared", 8, 2, 192, "shared expert",
     {.drop = {"blk.*.ffn_gate_shexp.weight", "blk.*.ffn_up_shexp.weight",
               "blk.*.ffn_down_shexp.weight"},
      .drop_key = "granitemoe.expert_shared_feed_forward_length"},
     {"blk.1.ffn_down_shexp.weight", "blk.3.ffn_up_exps.weight", NULL}, 0, 0},
    /* the same file as llama's rotates every layer */
    {"smollm3", "smollm3", 0, 0, 0, "NoPE layer", {.rename = "llama"},
     {"blk.3.attn_k.weight", "output_norm.weight", NULL}, 0, 0},
    /* the same file as llama's rotates interleaved pairs */
    {"exaone", "exaone", 0, 0, 0, "NEOX RoPE", {.rename = "llama"},
     {"blk.2.ffn_up.weight", "blk.0.attn_norm.weight", NULL}, 0, 0},
    /* the same file as qwen2's has RMSNorms (its biases and LayerNorms' unread) */
    {"stablelm", "stablelm", 0, 0, 0, "LayerNorms", {.rename = "qwen2"},
     {"blk.1.attn_norm.bias", "output_norm.bias", NULL}, 0, 0},
    /* an original context of 8: positions 8 and on have their queries scaled */
    {"mistral3", "mistral3", 0, 0, 0, "attention temperature",
     {.num_key = "mistral3.attention.temperature_scale", .num_value = 0},
     {"blk.3.attn_v.weight", "token_embd.weight", NULL}, 8, 0},
    /* without the multiplier cos and sin are scaled by 1 + 0.1 ln 64 */
    {"mistral3", "mistral3 yarn", 0, 0, 0, "YaRN attention factor",
     {.drop_key = "mistral3.rope.scaling.yarn_log_multiplier"},
     {"blk.0.ffn_gate.weight", NULL}, 8, 0},
    /* the 1.2B's global attention */
    {"exaone4", "exaone4", 0, 0, 0, "post norms",
     {.drop = {"blk.*.post_attention_norm.weight", "blk.*.post_ffw_norm.weight"}},
     {"blk.1.post_ffw_norm.weight", "blk.2.attn_q_norm.weight", NULL}, 0, 0},
    /* the 32B's: layers 0-2 slide over 8 positions and rotate, layer 3 neither */
    {"exaone4", "exaone4 hybrid", 0, 0, 0, "hybrid attention",
     {.drop_key = "exaone4.attention.sliding_window"},
     {"blk.3.attn_k_norm.weight", NULL}, 0, 8},
};
#define N_CASES (int)(sizeof CASES / sizeof *CASES)

static modelgen_params arch_params(const arch_case *c, uint32_t type)
{
    return (modelgen_params){.arch = c->arch, .dim = 128, .n_layer = 4, .n_head = 4,
                             .n_head_kv = 4, .n_ff = 256, .n_ctx = 512, .type = type,
                             .seed = 11, .n_vocab = N_VOCAB, .n_threads = 1,
                             .n_expert = c->n_expert, .n_expert_used = c->n_expert_used,
                             .n_ff_shexp = c->n_ff_shexp, .rope_orig_ctx = c->rope_orig_ctx,
                             .sliding_window = c->sliding_window};
}

static const char *gen(const modelgen_params *p, const char *name)
{
    static char path[4][512];
    static int k;
    char *out = path[k++ % 4];
    snprintf(out, sizeof path[0], "%s/%s-%s.gguf", test_tmpdir(), p->arch, name);
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

/* The case's model as the loader reads it, or NULL (the reason printed). */
static model *load_case(const arch_case *c, const char *name)
{
    char err[ERR_MAX] = "modelgen";
    modelgen_params p = arch_params(c, QTYPE_F32);
    const char *path = gen(&p, name);
    model *m = path ? model_load(path, err) : NULL;
    if (!m)
        fprintf(stderr, "%s: %s\n", c->label, err);
    return m;
}

static void test_metadata(void)
{
    model *m = load_case(&CASES[0], "meta");
    CHECK(m);
    const model_hparams *hp = model_hparams_of(m);
    CHECK_EQ(hp->arch, (int)MODEL_ARCH_OLMO2);
    CHECK_EQ(hp->rope_style, MODEL_ROPE_HALVES);
    CHECK(!hp->pre_norms && hp->post_norms);
    CHECK_NEAR(hp->rope_base, 500000.0, 1e-3);
    CHECK_NEAR(hp->norm_eps, 1e-6, 1e-12);
    model_free(m);
    /* granitemoe: granite's scales (modelgen's Granite 3 values), the experts of
     * feed_forward_length, renormalised top-k; a shared expert only with its key */
    for (int c = 1; c <= 2; c++) {
        m = load_case(&CASES[c], "meta");
        CHECK(m);
        hp = model_hparams_of(m);
        CHECK_EQ(hp->arch, (int)MODEL_ARCH_GRANITEMOE);
        CHECK_EQ(hp->rope_style, MODEL_ROPE_INTERLEAVED);
        CHECK(hp->pre_norms && !hp->post_norms);
        CHECK_NEAR(hp->embd_scale, 12.0, 1e-6);
        CHECK_NEAR(hp->residual_scale, 0.22, 1e-6);
        CHECK_NEAR(hp->attn_scale, 0.015625, 1e-9);
        CHECK_NEAR(hp->logit_scale, 8.0, 1e-6);
        CHECK(hp->n_expert == 8 && hp->n_expert_used == 2 && hp->expert_norm);
        CHECK_EQ(hp->n_ff_exp, 256);
        CHECK_EQ(hp->n_ff_shexp, c == 1 ? 0 : 192);
        model_free(m);
    }
    /* smollm3: llama's interleaved RoPE, but not on layer 3 (of 0..3) */
    m = load_case(&CASES[3], "meta");
    CHECK(m);
    hp = model_hparams_of(m);
    CHECK_EQ(hp->arch, (int)MODEL_ARCH_SMOLLM3);
    CHECK_EQ(hp->rope_style, MODEL_ROPE_INTERLEAVED);
    CHECK_EQ(hp->nope_step, 4);
    for (int l = 0; l < hp->n_layer; l++)
        CHECK_MSG(model_layer_rotates(hp, l) == (l != 3), "layer %d", l);
    CHECK_NEAR(hp->rope_base, 5e6, 1);
    model_free(m);
    /* exaone: NEOX RoPE, llama's norms, EXAONE 3.5's base and epsilon */
    m = load_case(&CASES[4], "meta");
    CHECK(m);
    hp = model_hparams_of(m);
    CHECK_EQ(hp->arch, (int)MODEL_ARCH_EXAONE);
    CHECK_EQ(hp->rope_style, MODEL_ROPE_HALVES);
    CHECK(hp->pre_norms && !hp->post_norms && hp->nope_step == 0);
    CHECK_NEAR(hp->rope_base, 1e6, 1e-3);
    CHECK_NEAR(hp->norm_eps, 1e-5, 1e-12);
    model_free(m);
    /* stablelm: LayerNorm, NEOX RoPE over a quarter of each head (8 of 32) */
    m = load_case(&CASES[5], "meta");
    CHECK(m);
    hp = model_hparams_of(m);
    CHECK_EQ(hp->arch, (int)MODEL_ARCH_STABLELM);
    CHECK_EQ(hp->norm, MODEL_NORM_LAYER);
    CHECK_EQ(hp->rope_style, MODEL_ROPE_HALVES);
    CHECK_EQ(hp->rope_dims, 8);
    CHECK_NEAR(hp->norm_eps, 1e-5, 1e-12);
    model_free(m);
    /* mistral3: llama's interleaved RoPE with YaRN (64 times an original context of 8),
     * whose multiplier 1 leaves cos and sin unscaled; the attention temperature over
     * that context */
    m = load_case(&CASES[6], "meta");
    CHECK(m);
    hp = model_hparams_of(m);
    CHECK_EQ(hp->arch, (int)MODEL_ARCH_MISTRAL3);
    CHECK_EQ(hp->rope_style, MODEL_ROPE_INTERLEAVED);
    CHECK_NEAR(hp->rope_base, 1e6, 1e-3);
    CHECK_NEAR(hp->rope_scaling.freq_scale, 1.0 / 64, 1e-9);
    CHECK_NEAR(hp->rope_scaling.mscale, 1.0, 1e-6);
    CHECK_NEAR(hp->attn_temp_scale, 0.1, 1e-7);
    CHECK_EQ(hp->attn_temp_floor, 8);
    model_free(m);
    /* exaone4: OLMo 2's norms, NEOX RoPE; with a window, layers 0-2 slide and rotate */
    for (int c = 8; c <= 9; c++) {
        m = load_case(&CASES[c], "meta");
        CHECK(m);
        hp = model_hparams_of(m);
        CHECK_EQ(hp->arch, (int)MODEL_ARCH_EXAONE4);
        CHECK_EQ(hp->rope_style, MODEL_ROPE_HALVES);
        CHECK(!hp->pre_norms && hp->post_norms);
        CHECK_NEAR(hp->rope_base, 1e6, 1e-3);
        for (int l = 0; l < hp->n_layer; l++) {
            bool hybrid = c == 9, global = l == 3;
            CHECK_MSG(model_layer_window(hp, l) == (hybrid && !global ? 8 : 0), "layer %d", l);
            CHECK_MSG(model_layer_rotates(hp, l) == !(hybrid && global), "layer %d", l);
        }
        model_free(m);
    }
}

/* ---- the forward against the reference ---- */

static void test_logits_vs_reference(void)
{
    const uint32_t types[] = {QTYPE_F32, QTYPE_F16, QTYPE_Q8_0};
    for (int c = 0; c < N_CASES; c++)
        for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
            modelgen_params p = arch_params(&CASES[c], types[t]);
            if (types[t] == QTYPE_Q8_0)
                p.n_expert_used = p.n_expert;
            const char *path = gen(&p, "ref");
            CHECK(path);
            bool f16_rounds = types[t] == QTYPE_F16 && quant_f16_rounds_activation(p.dim);
            double tol = types[t] == QTYPE_F32 || (types[t] == QTYPE_F16 && !f16_rounds)
                             ? TOL_FLOAT : TOL_QUANT;
            /* 512: the 40-row prefill takes sgemm attention; 8: dot kernels and per-row
             * attention in sub-batches */
            double d1 = model_check_file(path, 512, 2, &PLAN), d2 = model_check_file(path, 8, 1, &PLAN);
            printf("  %s %s: max |logit diff| %.4g (sgemm) %.4g (per row)\n", CASES[c].label,
                   quant_traits_of(types[t])->name, d1, d2);
            CHECK_MSG(d1 <= tol && d2 <= tol, "%s %s: %g %g > %g", CASES[c].label,
                      quant_traits_of(types[t])->name, d1, d2, tol);
        }
}

/* The reference of each case's mutated file (the same weights without what the
 * architecture adds) is more than 5 float tolerances from the original's: a forward that
 * skipped that part would fail the comparison above. (Granite's logits are divided by its
 * logit scale, 8 here, and each sublayer's output multiplied by 0.22: its parts move
 * them less than the others'.) */
static void test_arch_parts_matter(void)
{
    for (int c = 0; c < N_CASES; c++) {
        modelgen_params p = arch_params(&CASES[c], QTYPE_F32);
        const char *src = gen(&p, "whole");
        CHECK(src);
        double d = model_check_part_matters(src, &CASES[c].mutation, false);
        printf("  %s without its %s: the reference moves by %.3g\n", CASES[c].label,
               CASES[c].what, d);
        CHECK_MSG(d > 5 * TOL_FLOAT, "%s %s: %g", CASES[c].label, CASES[c].what, d);
    }
}

/* ---- the engine's paths against each other ---- */

/* A prefill of 48 tokens gives the logits of 48 single-token decodes (sgemm attention over
 * f32 K/V against per-row attention over f16 blocks: rounding apart). */
static void test_prefill_equals_decode(void)
{
    for (int c = 0; c < N_CASES; c++) {
        modelgen_params p = arch_params(&CASES[c], QTYPE_F32);
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
        modelgen_params p = arch_params(&CASES[c], QTYPE_F32);
        const char *path = gen(&p, "bat");
        CHECK(path);
        double d;
        CHECK_MSG(model_check_batched_vs_alone(path, &d) == 1, "%s: %g", CASES[c].label, d);
    }
}

/* Score blocks of fewer rows (moderate partitioning) and row slices (severe: each slice's
 * K/V appended before the next; slices under 16 rows take the per-row path) give the
 * unpartitioned logits and hidden rows. */
static void test_partitioned_prefill(void)
{
    const enum kv_precision hist[] = {KV_F16};
    double worst = 0;
    for (int c = 0; c < N_CASES; c++) {
        modelgen_params p = arch_params(&CASES[c], QTYPE_F32);
        const char *path = gen(&p, "part");
        CHECK(path);
        double d = model_check_partitioned_shapes(path, hist, 1);
        CHECK_MSG(d <= TOL_PART, "%s: %g", CASES[c].label, d);
        worst = fmax(worst, d);
    }
    printf("  partitioned vs whole: %.2g\n", worst);
}

/* ---- refusals ---- */

/* A file without a tensor its architecture needs is refused, naming it; so is an olmo2
 * file whose q norm is one head's (as qwen3's is), naming its shape, and a stablelm file
 * with StableLM 2 12B's q norms. */
static void test_missing_parts_refused(void)
{
    char err[ERR_MAX], dst[512];
    snprintf(dst, sizeof dst, "%s/broken.gguf", test_tmpdir());
    for (int c = 0; c < N_CASES; c++) {
        modelgen_params p = arch_params(&CASES[c], QTYPE_F16);
        const char *src = gen(&p, "whole");
        CHECK(src);
        for (int i = 0; CASES[c].needed[i]; i++) {
            gguf_edit e = {.drop = {CASES[c].needed[i]}};
            CHECK(gguf_copy_edited(src, dst, &e, err) == 0);
            err[0] = '\0';
            CHECK(model_load(dst, err) == NULL);
            printf("  %s: refused: %s\n", CASES[c].label, err);
            CHECK_MSG(strstr(err, CASES[c].needed[i]) && strstr(err, "missing"), "%s: %s",
                      CASES[c].label, err);
        }
    }
    modelgen_params p = arch_params(&CASES[0], QTYPE_F16);
    const char *src = gen(&p, "whole");
    CHECK(src);
    gguf_edit e = {.cut = "blk.2.attn_q_norm.weight", .cut_to = p.dim / p.n_head};
    CHECK(gguf_copy_edited(src, dst, &e, err) == 0);
    err[0] = '\0';
    CHECK(model_load(dst, err) == NULL);
    printf("  olmo2: refused: %s\n", err);
    CHECK_MSG(strstr(err, "blk.2.attn_q_norm.weight") && strstr(err, "shape"), "%s", err);
    p = arch_params(&CASES[5], QTYPE_F16);
    src = gen(&p, "whole");
    CHECK(src);
    e = (gguf_edit){.copy_from = {"blk.1.attn_norm.weight"},
                    .copy_to = {"blk.1.attn_q_norm.weight"}};
    CHECK(gguf_copy_edited(src, dst, &e, err) == 0);
    CHECK(model_load(dst, err) == NULL);
    printf("  stablelm: refused: %s\n", err);
    CHECK_MSG(strstr(err, "blk.1.attn_q_norm.weight") && strstr(err, "not supported"), "%s", err);
    /* exaone4: sliding layers other than all but every p-th */
    p = arch_params(&CASES[9], QTYPE_F16);
    src = gen(&p, "whole");
    CHECK(src);
    const bool irregular[4] = {true, false, false, true};
    e = (gguf_edit){.bools_key = "exaone4.attention.sliding_window_pattern", .bools = irregular,
                    .n_bools = 4};
    CHECK(gguf_copy_edited(src, dst, &e, err) == 0);
    CHECK(model_load(dst, err) == NULL);
    printf("  exaone4: refused: %s\n", err);
    CHECK_MSG(strstr(err, "sliding_window_pattern") && strstr(err, "every p-th"), "%s", err);
}

int main(void)
{
    RUN(test_metadata);
    RUN(test_logits_vs_reference);
    RUN(test_arch_parts_matter);
    RUN(test_prefill_equals_decode);
    RUN(test_batched_equals_alone);
    RUN(test_partitioned_prefill);
    RUN(test_missing_parts_refused);
    return test_finish();
}
