/*
 * GLM-4.5, GLM-4.5-Air and GLM-4.6 (glm4moe) in the decoder engine, against the
 * double-precision reference (tests/support/ref_forward.c, from Hugging Face's
 * Glm4MoeForCausalLM): qwen2's attention (q/k/v biases) with half of each head rotated
 * (NEOX pairs), the feed-forward's norm named post_attention_norm, a leading dense layer,
 * then experts chosen by the sigmoid of the router's logits plus the selection bias
 * (exp_probs_b), weighted by the unbiased scores renormalized and times
 * routed_scaling_factor (expert_weights_scale), and a shared expert added ungated; the
 * file's multi-token-prediction layer after the model's (nextn_predict_layers) is not run.
 *
 * The models are modelgen's on a synthetic 260-token vocabulary: dim 128, 3 layers (the
 * first dense, FFN 256) and a prediction layer, 4 heads over 2 KV heads, 8 experts of FFN
 * 64 of which 2 are used, a shared one, weights normalized and times 2.5. Checked: the
 * hyper-parameters the loader reads; logits against the reference in float weights and,
 * with every expert used, in Q8_0, and with GLM-4.5 355B's per-head q/k norms; that the
 * selection bias, the gating, the scale, the q/k norms and leaving the prediction layer out
 * each move the reference far past the tolerance; a
 * prefill equals the same tokens decoded one by one; sequences stacked in one step equal
 * each alone, bit for bit; bad files are refused, naming the tensor or key. Tolerances
 * are test_archs.c's.
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

static modelgen_params glm_params(uint32_t type)
{
    return (modelgen_params){.arch = "glm4moe", .dim = 128, .n_layer = 3, .n_head = 4,
                             .n_head_kv = 2, .n_ff = 256, .n_ctx = 512, .type = type,
                             .seed = 53, .n_vocab = N_VOCAB, .n_threads = 1, .n_expert = 8,
                             .n_expert_used = 2, .n_ff_exp = 64, .n_expert_shared = 1,
                             .n_dense_lead = 1, .expert_weights_norm = true,
                             .expert_weights_scale = 2.5f, .nextn_layers = 1};
}

static const char *gen(const modelgen_params *p, const char *name)
{
    static char path[4][512];
    static int k;
    char *out = path[k++ % 4];
    snprintf(out, sizeof path[0], "%s/glm4moe-%s.gguf", test_tmpdir(), name);
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
    modelgen_params p = glm_params(QTYPE_F32);
    model *m = model_load(gen(&p, "meta"), err);
    CHECK_MSG(m, "%s", err);
    const model_hparams *hp = model_hparams_of(m);
    CHECK_EQ(hp->arch, (int)MODEL_ARCH_GLM4MOE);
    CHECK(!strcmp(model_arch_name(hp->arch), "glm4moe"));
    CHECK_EQ(hp->rope_style, MODEL_ROPE_HALVES);
    /* block_count 4: the prediction layer is not the model's */
    CHECK(hp->n_layer == 3 && hp->head_dim == 32 && hp->rope_dims == 16);
    CHECK(hp->n_expert == 8 && hp->n_expert_used == 2 && hp->n_ff_exp == 64 &&
          hp->n_ff_shexp == 64 && hp->n_ff == 256 && hp->n_dense_lead == 1);
    CHECK(!model_layer_has_experts(hp, 0) && model_layer_has_experts(hp, 2));
    CHECK(hp->expert_norm && hp->expert_sigmoid && hp->expert_scale == 2.5f &&
          hp->n_expert_groups == 0);
    CHECK_EQ(model_kv_shape(m).n_layer, 3);
    model_free(m);
}

static void test_logits_vs_reference(void)
{
    modelgen_params p = glm_params(QTYPE_F32), all = p, normed = p;
    all.n_expert_used = all.n_expert;
    normed.glm_qk_norm = true; /* GLM-4.5 355B's per-head q/k norms */
    CHECK_EQ(model_check_type(p, QTYPE_F32, "glm4moe-f32", &PLAN, TOL_FLOAT), 0);
    CHECK_EQ(model_check_type(p, QTYPE_F16, "glm4moe-f16", &PLAN, TOL_FLOAT), 0);
    CHECK_EQ(model_check_type(all, QTYPE_Q8_0, "glm4moe-all-q8_0", &PLAN, TOL_QUANT), 0);
    CHECK_EQ(model_check_type(normed, QTYPE_F32, "glm4moe-qk-norm-f32", &PLAN, TOL_FLOAT), 0);
}

/* Its parts each move the reference by more than 5 float tolerances when the file is
 * rewritten without them; so does running the prediction layer as the model's last. */
static void test_parts_matter(void)
{
    const struct {
        const char *what;
        gguf_edit edit;
    } cases[] = {
        {"selection bias", {.zero = {"blk.*.exp_probs_b.bias"}}},
        {"sigmoid gating", {.num_key = "glm4moe.expert_gating_func", .num_value = 1}},
        {"weights' scale", {.num_key = "glm4moe.expert_weights_scale", .num_value = 1}},
        {"prediction layer left out", {.drop_key = "glm4moe.nextn_predict_layers"}},
        {"q/k norms", {.drop = {"blk.*.attn_q_norm.weight", "blk.*.attn_k_norm.weight"}}},
    };
    modelgen_params p = glm_params(QTYPE_F32);
    p.glm_qk_norm = true;
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
    modelgen_params p = glm_params(QTYPE_F32);
    const char *path = gen(&p, "pd");
    CHECK(path);
    double d = model_check_prefill_vs_decode(path);
    printf("  prefill vs decode %.2g\n", d);
    CHECK(d <= TOL_PART);
}

static void test_batched_equals_alone(void)
{
    modelgen_params p = glm_params(QTYPE_F32);
    const char *path = gen(&p, "bat");
    CHECK(path);
    double d;
    CHECK_MSG(model_check_batched_vs_alone(path, &d) == 1, "%g", d);
}

/* A file without a part glm4moe needs is refused, naming it; so are prediction layers as
 * many as the blocks and GLM-4.5V's M-RoPE sections. */
static void test_bad_files_refused(void)
{
    static const int32_t sections[4] = {8, 4, 4, 0};
    const struct {
        gguf_edit edit;
        const char *named, *says;
    } cases[] = {
        {{.drop = {"blk.2.exp_probs_b.bias"}}, "blk.2.exp_probs_b.bias", "missing"},
        {{.drop = {"blk.1.post_attention_norm.weight"}}, "blk.1.post_attention_norm.weight",
         "missing"},
        {{.drop = {"blk.0.ffn_up.weight"}}, "blk.0.ffn_up.weight", "missing"},
        {{.drop_key = "glm4moe.expert_shared_count"}, "glm4moe.expert_shared_count", "missing"},
        {{.num_key = "glm4moe.nextn_predict_layers", .num_value = 4},
         "glm4moe.nextn_predict_layers", "not below"},
        {{.ints_key = "glm4moe.rope.dimension_sections", .ints = sections, .n_ints = 4},
         "glm4moe.rope.dimension_sections", "not supported"},
    };
    modelgen_params p = glm_params(QTYPE_F16);
    const char *src = gen(&p, "whole16");
    CHECK(src);
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
        CHECK_MSG(model_check_refused(src, "glm4moe", &cases[c].edit, cases[c].named,
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
