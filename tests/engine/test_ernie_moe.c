/*
 * ERNIE 4.5's mixtures of experts (ernie4_5-moe: ERNIE-4.5-21B-A3B, 300B-A47B) in the
 * decoder engine, against the double-precision reference (tests/support/ref_forward.c,
 * from Hugging Face's Ernie4_5_MoeForCausalLM): llama's attention, a leading dense layer,
 * then experts chosen by the softmax of the router's logits plus the correction bias
 * (exp_probs_b), weighted by the unbiased probabilities renormalized, and a shared expert
 * added ungated.
 *
 * The models are modelgen's on a synthetic 260-token vocabulary: dim 128, 3 layers (the
 * first dense, FFN 256), 4 heads over 2 KV heads, 8 experts of FFN 64 of which 2 are used,
 * a shared expert of 128. Checked: the hyper-parameters the loader reads; logits against
 * the reference in float weights and, with every expert used (no near-tied choice to flip
 * under 8-bit activations), in Q8_0; that the selection bias and the shared expert each
 * move the reference far past the tolerance; a prefill equals the same tokens decoded one
 * by one; sequences stacked in one step equal each alone, bit for bit; bad files are
 * refused, naming the tensor or key. Tolerances are test_archs.c's.
 */
#include <stdio.h>
#include <string.h>

#include "engine/gguf/modelgen.h"
#include "engine/model/model.h"
#include "engine/quant/quant.h"
#include "tests/support/gguf_copy.h"
#include "tests/support/model_check.h"
#include "tests/support/test.h"

#define TOL_FLOAT 0.02
#define TOL_QUANT 0.2
#define TOL_PART 1e-3
#define N_VOCAB 260

static modelgen_params ernie_params(uint32_t type)
{
    return (modelgen_params){.arch = "ernie4_5-moe", .dim = 128, .n_layer = 3, .n_head = 4,
                             .n_head_kv = 2, .n_ff = 256, .n_ctx = 512, .type = type,
                             .seed = 41, .n_vocab = N_VOCAB, .n_threads = 1, .n_expert = 8,
                             .n_expert_used = 2, .n_ff_exp = 64, .n_ff_shexp = 128,
                             .n_dense_lead = 1, .exp_probs_b = true};
}

static const char *gen(const modelgen_params *p, const char *name)
{
    static char path[4][512];
    static int k;
    char *out = path[k++ % 4];
    snprintf(out, sizeof path[0], "%s/ernie-%s.gguf", test_tmpdir(), name);
    char err[ERR_MAX];
    if (modelgen_write(p, out, err) < 0) {
        fprintf(stderr, "modelgen: %s\n", err);
        return NULL;
    }
    return out;
}

static const model_check_plan PLAN = {.n_prefill = 40, .n_total = 46, .gap_b = 30, .gap_c = 12};

static void test_metadata(void)
{
    char err[ERR_MAX];
    modelgen_params p = ernie_params(QTYPE_F32);
    model *m = model_load(gen(&p, "meta"), err);
    CHECK_MSG(m, "%s", err);
    const model_hparams *hp = model_hparams_of(m);
    CHECK_EQ(hp->arch, (int)MODEL_ARCH_ERNIE4_5_MOE);
    CHECK(!strcmp(model_arch_name(hp->arch), "ernie4_5-moe"));
    CHECK_EQ(hp->rope_style, MODEL_ROPE_INTERLEAVED);
    CHECK(hp->n_expert == 8 && hp->n_expert_used == 2 && hp->n_ff_exp == 64 &&
          hp->n_ff_shexp == 128 && hp->n_ff == 256 && hp->n_dense_lead == 1);
    CHECK(!model_layer_has_experts(hp, 0) && model_layer_has_experts(hp, 2));
    CHECK(hp->expert_norm && !hp->expert_sigmoid && hp->expert_scale == 0);
    model_free(m);
}

static void test_logits_vs_reference(void)
{
    modelgen_params p = ernie_params(QTYPE_F32), all = p;
    all.n_expert_used = all.n_expert;
    CHECK_EQ(model_check_type(p, QTYPE_F32, "ernie-f32", &PLAN, TOL_FLOAT), 0);
    CHECK_EQ(model_check_type(p, QTYPE_F16, "ernie-f16", &PLAN, TOL_FLOAT), 0);
    CHECK_EQ(model_check_type(all, QTYPE_Q8_0, "ernie-all-q8_0", &PLAN, TOL_QUANT), 0);
}

/* The selection bias and the shared expert each move the reference by more than 5 float
 * tolerances when the file is rewritten without them. */
static void test_parts_matter(void)
{
    const struct {
        const char *what;
        gguf_edit edit;
    } cases[] = {
        {"selection bias", {.drop = {"blk.*.exp_probs_b.bias"}}},
        {"shared expert",
         {.drop_key = "ernie4_5-moe.expert_shared_feed_forward_length",
          .drop = {"blk.*.ffn_gate_shexp.weight", "blk.*.ffn_up_shexp.weight",
                   "blk.*.ffn_down_shexp.weight"}}},
    };
    modelgen_params p = ernie_params(QTYPE_F32);
    const char *src = gen(&p, "whole");
    CHECK(src);
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        double d = model_check_part_matters(src, &cases[c].edit, false);
        printf("  without its %s: the reference moves by %.3g\n", cases[c].what, d);
        CHECK_MSG(d > 5 * TOL_FLOAT, "%s: %g", cases[c].what, d);
    }
}

static void test_prefill_equals_decode(void)
{
    modelgen_params p = ernie_params(QTYPE_F32);
    const char *path = gen(&p, "pd");
    CHECK(path);
    double d = model_check_prefill_vs_decode(path);
    printf("  prefill vs decode %.2g\n", d);
    CHECK(d <= TOL_PART);
}

static void test_batched_equals_alone(void)
{
    modelgen_params p = ernie_params(QTYPE_F32);
    const char *path = gen(&p, "bat");
    CHECK(path);
    double d;
    CHECK_MSG(model_check_batched_vs_alone(path, &d) == 1, "%g", d);
}

/* A file without a part ernie4_5-moe needs is refused, naming it; so is an interleave
 * step other than 1. */
static void test_bad_files_refused(void)
{
    const struct {
        gguf_edit edit;
        const char *named, *says;
    } cases[] = {
        {{.drop = {"blk.0.ffn_gate.weight"}}, "blk.0.ffn_gate.weight", "missing"},
        {{.drop = {"blk.2.ffn_up_exps.weight"}}, "blk.2.ffn_up_exps.weight", "missing"},
        {{.drop = {"blk.1.ffn_down_shexp.weight"}}, "blk.1.ffn_down_shexp.weight", "missing"},
        {{.drop_key = "ernie4_5-moe.interleave_moe_layer_step"},
         "ernie4_5-moe.interleave_moe_layer_step", "missing"},
        {{.num_key = "ernie4_5-moe.interleave_moe_layer_step", .num_value = 2},
         "ernie4_5-moe.interleave_moe_layer_step", "supported"},
        {{.num_key = "ernie4_5-moe.leading_dense_block_count", .num_value = 9},
         "ernie4_5-moe.leading_dense_block_count", "above"},
        {{.drop_key = "ernie4_5-moe.expert_feed_forward_length"},
         "ernie4_5-moe.expert_feed_forward_length", "missing"},
    };
    modelgen_params p = ernie_params(QTYPE_F16);
    const char *src = gen(&p, "whole16");
    CHECK(src);
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
        CHECK_MSG(model_check_refused(src, "ernie", &cases[c].edit, cases[c].named,
                                      cases[c].says) == 0, "%s", cases[c].named);
}

int main(void)
{
    RUN(test_metadata);
    RUN(test_logits_vs_reference);
    RUN(test_parts_matter);
    RUN(test_prefill_equals_decode);
    RUN(test_batched_equals_alone);
    RUN(test_bad_files_refused);
    return test_finish();
}
