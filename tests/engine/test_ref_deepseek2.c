/*
 * deepseek2 test infrastructure: modelgen's files (DeepSeek-V2/V3 as llama.cpp's
 * converter writes them today) and the double-precision reference forward
 * (tests/support/ref_deepseek2.c, reached through ref_forward.h) the engine's absorbed
 * latent attention is checked against.
 *
 * Checked: every key llama.cpp's loader reads for deepseek2 and every tensor's name, type
 * and GGUF shape (ne order) as its create_tensor lists them, for V3's shape (q_lora_rank,
 * sigmoid gating, groups, the selection bias, YaRN) and V2-Lite's (attn_q, none of the
 * optional keys); matrices whose rows are not whole blocks of the type take
 * llama-quantize's fallbacks; bad shapes are refused. The reference loads both, refuses a
 * file without a part it needs, gives finite logits of a useful spread that a prefix
 * computes the same without the tokens after it (causal), spreads its tokens over the
 * experts, and moves when any one of its parts is taken away or changed: the selection
 * bias, the gating function, the groups, the weights' norm and scale, YaRN's
 * log-multiplier and YaRN itself, the q LoRA's norm, the latent's norm, the shared
 * experts, the rotary base.
 *
 * Against llama.cpp (2026-04, flash attention off, F32 KV) on modelgen's F32 files of dim
 * 256, 4 heads, kv_lora 64, qk_nope 32, qk_rope 16, v_head 32, 8 experts (2 used), 1 dense
 * layer, 48 tokens: the largest logit difference is 1.1e-6 to 1.9e-6 of each position's
 * largest logit over 3 layers with q_lora 96 (softmax, sigmoid or unwritten gating, with
 * and without the selection bias, groups 4/2, YaRN factor 4 with mscale_all_dim 0.707 or
 * without yarn_log_multiplier, original context 16 or 64, 1 or 2 shared experts, weights
 * normalized and scaled 2.5 or not), 3.9e-6 over 27 layers of V2-Lite's attn_q (llama.cpp
 * takes a file without q_lora_rank for V2-Lite by its 26/27/48 layers alone). llama.cpp's
 * CPU flash attention rounds to f16: 2.4e-3 to 3.2e-3 there, and where that flips a
 * token's experts up to 0.4-0.75.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf/gguf.h"
#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"
#include "tests/support/gguf_copy.h"
#include "tests/support/ref_forward.h"
#include "tests/support/test.h"

#define N_VOCAB 300
#define N_TOK 24
/* a change of the model is seen when the logits move by this share of their largest; the
 * reference repeats itself to ~1e-15 */
#define MOVED 1e-3

/* DeepSeek-V3's shape, small: 3 layers (1 dense), 8 experts in 4 groups of which 2 are
 * kept, 2 used, 2 shared, sigmoid gating with the selection bias, normalized weights
 * times 2.5, and V2's YaRN (factor 4, mscale_all_dim 0.707) */
static modelgen_params ds_params(uint32_t type)
{
    return (modelgen_params){
        .arch = "deepseek2", .dim = 128, .n_layer = 3, .n_head = 4, .n_head_kv = 4,
        .n_ff = 192, .n_ctx = 512, .type = type, .seed = 31, .n_vocab = N_VOCAB,
        .n_threads = 1, .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 64,
        .q_lora_rank = 48, .kv_lora_rank = 64, .qk_nope_dim = 32, .qk_rope_dim = 16,
        .v_head_dim = 32, .n_expert_shared = 2, .n_dense_lead = 1, .expert_gating = 2,
        .expert_weights_norm = true, .expert_weights_scale = 2.5f, .n_expert_groups = 4,
        .n_expert_groups_used = 2, .exp_probs_b = true, .yarn_factor = 4.0f,
        .yarn_mscale_all_dim = 0.707f, .rope_orig_ctx = 64};
}

static const char *gen(const modelgen_params *p, const char *name)
{
    static char path[4][512];
    static int k;
    char *out = path[k++ % 4];
    snprintf(out, sizeof path[0], "%s/deepseek2-%s.gguf", test_tmpdir(), name);
    char err[ERR_MAX];
    if (modelgen_write(p, out, err) < 0) {
        fprintf(stderr, "modelgen: %s\n", err);
        return NULL;
    }
    return out;
}

static bool has_u32(const gguf_file *g, const char *key, uint32_t want)
{
    uint32_t v;
    return gguf_get_u32(g, key, &v) && v == want;
}

static bool has_f32(const gguf_file *g, const char *key, float want)
{
    float v;
    return gguf_get_f32(g, key, &v) && fabsf(v - want) <= 1e-6f * fabsf(want);
}

/* The tensor name (layer l's where it starts "blk.") has these dimensions and type. */
static bool has_tensor(const gguf_file *g, int l, const char *name, uint32_t n_dims,
                       int64_t ne0, int64_t ne1, int64_t ne2, uint32_t type)
{
    char full[96];
    if (l >= 0)
        snprintf(full, sizeof full, "blk.%d.%s", l, name);
    else
        snprintf(full, sizeof full, "%s", name);
    const gguf_tensor *t = gguf_find_tensor(g, full);
    bool ok = t && t->n_dims == n_dims && t->ne[0] == ne0 && t->type == type &&
              (n_dims < 2 || t->ne[1] == ne1) && (n_dims < 3 || t->ne[2] == ne2);
    if (!ok)
        fprintf(stderr, "  %s: %s\n", full, t ? "wrong shape or type" : "missing");
    return ok;
}

/* V3's keys and tensors, as llama.cpp's llm_load_hparams and create_tensor read them. */
static void v3_file_is_llama_cpp_layout(void)
{
    modelgen_params p = ds_params(QTYPE_F32);
    const char *path = gen(&p, "v3");
    char err[ERR_MAX];
    gguf_file *g = path ? gguf_open(path, err) : NULL;
    CHECK(g);
    gguf_str s;
    bool b;
    CHECK(gguf_get_str(g, "general.architecture", &s) && gguf_str_eq(s, "deepseek2"));
    CHECK(has_u32(g, "deepseek2.embedding_length", 128) &&
          has_u32(g, "deepseek2.block_count", 3) &&
          has_u32(g, "deepseek2.feed_forward_length", 192) &&
          has_u32(g, "deepseek2.context_length", 512) &&
          has_u32(g, "deepseek2.vocab_size", N_VOCAB));
    CHECK(has_u32(g, "deepseek2.attention.head_count", 4) &&
          has_u32(g, "deepseek2.attention.head_count_kv", 1));
    CHECK(has_u32(g, "deepseek2.attention.key_length", 64 + 16) &&
          has_u32(g, "deepseek2.attention.value_length", 64) &&
          has_u32(g, "deepseek2.attention.key_length_mla", 32 + 16) &&
          has_u32(g, "deepseek2.attention.value_length_mla", 32));
    CHECK(has_u32(g, "deepseek2.attention.q_lora_rank", 48) &&
          has_u32(g, "deepseek2.attention.kv_lora_rank", 64) &&
          has_u32(g, "deepseek2.rope.dimension_count", 16));
    CHECK(has_f32(g, "deepseek2.attention.layer_norm_rms_epsilon", 1e-6f) &&
          has_f32(g, "deepseek2.rope.freq_base", 10000.0f));
    CHECK(has_u32(g, "deepseek2.expert_count", 8) && has_u32(g, "deepseek2.expert_used_count", 2) &&
          has_u32(g, "deepseek2.expert_feed_forward_length", 64) &&
          has_u32(g, "deepseek2.expert_shared_count", 2) &&
          has_u32(g, "deepseek2.leading_dense_block_count", 1) &&
          has_u32(g, "deepseek2.expert_gating_func", 2) &&
          has_u32(g, "deepseek2.expert_group_count", 4) &&
          has_u32(g, "deepseek2.expert_group_used_count", 2));
    CHECK(gguf_get_bool(g, "deepseek2.expert_weights_norm", &b) && b);
    CHECK(has_f32(g, "deepseek2.expert_weights_scale", 2.5f));
    CHECK(gguf_get_str(g, "deepseek2.rope.scaling.type", &s) && gguf_str_eq(s, "yarn"));
    CHECK(has_f32(g, "deepseek2.rope.scaling.factor", 4.0f) &&
          has_u32(g, "deepseek2.rope.scaling.original_context_length", 64) &&
          has_f32(g, "deepseek2.rope.scaling.yarn_log_multiplier", 0.1f * 0.707f) &&
          has_f32(g, "deepseek2.rope.scaling.yarn_beta_fast", 32.0f) &&
          has_f32(g, "deepseek2.rope.scaling.yarn_beta_slow", 1.0f));

    const uint32_t F = QTYPE_F32;
    CHECK(has_tensor(g, -1, "token_embd.weight", 2, 128, N_VOCAB, 1, F) &&
          has_tensor(g, -1, "output_norm.weight", 1, 128, 1, 1, F) &&
          has_tensor(g, -1, "output.weight", 2, 128, N_VOCAB, 1, F));
    int per_layer[3] = {0};
    for (int l = 0; l < 3; l++) {
        CHECK(has_tensor(g, l, "attn_norm.weight", 1, 128, 1, 1, F) &&
              has_tensor(g, l, "attn_q_a_norm.weight", 1, 48, 1, 1, F) &&
              has_tensor(g, l, "attn_kv_a_norm.weight", 1, 64, 1, 1, F) &&
              has_tensor(g, l, "attn_q_a.weight", 2, 128, 48, 1, F) &&
              has_tensor(g, l, "attn_q_b.weight", 2, 48, 4 * 48, 1, F) &&
              has_tensor(g, l, "attn_kv_a_mqa.weight", 2, 128, 64 + 16, 1, F) &&
              has_tensor(g, l, "attn_k_b.weight", 3, 32, 64, 4, F) &&
              has_tensor(g, l, "attn_v_b.weight", 3, 64, 32, 4, F) &&
              has_tensor(g, l, "attn_output.weight", 2, 4 * 32, 128, 1, F) &&
              has_tensor(g, l, "ffn_norm.weight", 1, 128, 1, 1, F));
        per_layer[l] = 10;
        if (l < 1) {
            CHECK(has_tensor(g, l, "ffn_gate.weight", 2, 128, 192, 1, F) &&
                  has_tensor(g, l, "ffn_up.weight", 2, 128, 192, 1, F) &&
                  has_tensor(g, l, "ffn_down.weight", 2, 192, 128, 1, F));
            per_layer[l] += 3;
            continue;
        }
        CHECK(has_tensor(g, l, "ffn_gate_inp.weight", 2, 128, 8, 1, F) &&
              has_tensor(g, l, "exp_probs_b.bias", 1, 8, 1, 1, F) &&
              has_tensor(g, l, "ffn_gate_exps.weight", 3, 128, 64, 8, F) &&
              has_tensor(g, l, "ffn_up_exps.weight", 3, 128, 64, 8, F) &&
              has_tensor(g, l, "ffn_down_exps.weight", 3, 64, 128, 8, F) &&
              has_tensor(g, l, "ffn_gate_shexp.weight", 2, 128, 2 * 64, 1, F) &&
              has_tensor(g, l, "ffn_up_shexp.weight", 2, 128, 2 * 64, 1, F) &&
              has_tensor(g, l, "ffn_down_shexp.weight", 2, 2 * 64, 128, 1, F));
        per_layer[l] += 8;
    }
    /* nothing else: the old fused attn_kv_b, attn_q with q_lora, ... */
    CHECK_EQ(gguf_n_tensors(g), 3 + per_layer[0] + per_layer[1] + per_layer[2]);
    gguf_close(g);
}

/* V2-Lite's: attn_q, and none of the optional keys or the selection bias. */
static void lite_file_leaves_out_the_optional(void)
{
    modelgen_params p = ds_params(QTYPE_F32);
    p.q_lora_rank = 0, p.expert_gating = 0, p.expert_weights_norm = false;
    p.expert_weights_scale = 0, p.n_expert_groups = p.n_expert_groups_used = 0;
    p.exp_probs_b = false, p.yarn_factor = p.yarn_mscale_all_dim = 0, p.rope_orig_ctx = 0;
    const char *path = gen(&p, "lite");
    char err[ERR_MAX];
    gguf_file *g = path ? gguf_open(path, err) : NULL;
    CHECK(g);
    CHECK(has_tensor(g, 0, "attn_q.weight", 2, 128, 4 * 48, 1, QTYPE_F32));
    CHECK(!gguf_find_tensor(g, "blk.0.attn_q_a.weight") &&
          !gguf_find_tensor(g, "blk.0.attn_q_a_norm.weight") &&
          !gguf_find_tensor(g, "blk.0.attn_q_b.weight") &&
          !gguf_find_tensor(g, "blk.1.exp_probs_b.bias"));
    const char *absent[] = {"attention.q_lora_rank", "expert_gating_func", "expert_weights_norm",
                            "expert_weights_scale", "expert_group_count",
                            "expert_group_used_count", "rope.scaling.type",
                            "rope.scaling.factor", "rope.scaling.yarn_log_multiplier"};
    for (size_t i = 0; i < sizeof absent / sizeof *absent; i++) {
        char key[96];
        snprintf(key, sizeof key, "deepseek2.%s", absent[i]);
        CHECK_MSG(gguf_find_key(g, key) < 0, "%s written", key);
    }
    ref_model *m = ref_model_load(g);
    CHECK(m);
    ref_model_free(m);
    gguf_close(g);
}

/* Quantized: attn_k_b's rows of qk_nope_dim (32) and attn_v_b's of kv_lora_rank (64) are
 * no whole Q4_K blocks, and take llama-quantize's Q5_0; the rest stays Q4_K. */
static void quantized_rows_fall_back(void)
{
    modelgen_params p = ds_params(QTYPE_Q4_K);
    p.dim = 256;
    const char *path = gen(&p, "q4k");
    char err[ERR_MAX];
    gguf_file *g = path ? gguf_open(path, err) : NULL;
    CHECK(g);
    CHECK(has_tensor(g, 1, "attn_k_b.weight", 3, 32, 64, 4, QTYPE_Q5_0) &&
          has_tensor(g, 1, "attn_v_b.weight", 3, 64, 32, 4, QTYPE_Q5_0) &&
          has_tensor(g, 1, "attn_kv_a_mqa.weight", 2, 256, 80, 1, QTYPE_Q4_K) &&
          has_tensor(g, 1, "ffn_gate_exps.weight", 3, 256, 64, 8, QTYPE_Q4_K) &&
          has_tensor(g, 1, "ffn_down_exps.weight", 3, 64, 256, 8, QTYPE_Q5_0) &&
          has_tensor(g, 1, "ffn_gate_inp.weight", 2, 256, 8, 1, QTYPE_F32));
    ref_model *m = ref_model_load(g);
    CHECK(m);
    ref_model_free(m);
    gguf_close(g);
}

static void bad_shapes_are_refused(void)
{
    /* what each case breaks, as the error names it */
    static const char *const what[] = {"expert groups", "expert groups", "expert groups",
                                       "shared", "rotary", "leading dense", "gating",
                                       "mscale_all_dim", "head_dim"};
    char err[ERR_MAX], path[512];
    snprintf(path, sizeof path, "%s/deepseek2-bad.gguf", test_tmpdir());
    for (int i = 0; i < (int)(sizeof what / sizeof *what); i++) {
        modelgen_params p = ds_params(QTYPE_F32);
        switch (i) {
        case 0: /* 8 experts in 3 groups */
            p.n_expert_groups = 3, p.n_expert_groups_used = 1;
            break;
        case 1: /* every group kept */
            p.n_expert_groups_used = 4;
            break;
        case 2: /* groups of one expert: no two best */
            p.n_expert_groups = 8;
            break;
        case 3:
            p.n_expert_shared = 0;
            break;
        case 4:
            p.qk_rope_dim = 15;
            break;
        case 5:
            p.n_dense_lead = 4;
            break;
        case 6:
            p.expert_gating = 3;
            break;
        case 7:
            p.yarn_factor = -1;
            break;
        default:
            p.head_dim = 64;
        }
        CHECK_MSG(modelgen_write(&p, path, err) < 0, "%s: written", what[i]);
        CHECK_MSG(strstr(err, what[i]), "%s: %s", what[i], err);
    }
    /* deepseek2's fields on another architecture */
    modelgen_params p = {.arch = "llama", .dim = 64, .n_layer = 1, .n_head = 2, .n_head_kv = 2,
                         .n_ff = 64, .n_ctx = 64, .type = QTYPE_F32, .n_vocab = 16,
                         .n_threads = 1, .exp_probs_b = true};
    CHECK(modelgen_write(&p, path, err) < 0 && strstr(err, "deepseek2's"));
}

/* The reference's logits of the first n tokens of the fixed list; routes may be NULL. */
static double *run_ref(const char *path, int n, bool kv_f16, int *routes)
{
    char err[ERR_MAX];
    gguf_file *g = path ? gguf_open(path, err) : NULL;
    ref_model *m = g ? ref_model_load(g) : NULL;
    double *logits = m ? malloc((size_t)n * N_VOCAB * sizeof *logits) : NULL;
    if (logits) {
        int32_t tok[N_TOK], pos[N_TOK];
        for (int i = 0; i < n; i++)
            tok[i] = 3 + (i * 97 + 11) % (N_VOCAB - 3), pos[i] = i;
        ref_model_round_kv_f16(m, kv_f16);
        ref_model_record_routes(m, routes);
        ref_forward(m, n, tok, pos, logits, NULL, NULL);
    }
    ref_model_free(m);
    gguf_close(g);
    return logits;
}

/* The largest change over the positions of b from a, relative to each position's largest
 * |logit| of a. */
static double moved(const double *a, const double *b, int n)
{
    double worst = 0;
    for (int t = 0; t < n; t++) {
        double d = 0, top = 0;
        for (int i = 0; i < N_VOCAB; i++) {
            d = fmax(d, fabs(a[(size_t)t * N_VOCAB + i] - b[(size_t)t * N_VOCAB + i]));
            top = fmax(top, fabs(a[(size_t)t * N_VOCAB + i]));
        }
        worst = fmax(worst, d / top);
    }
    return worst;
}

/* Finite logits of a useful spread; a prefix's logits without the later tokens are the
 * same; the MoE layers' tokens go to most experts; a cache rounded to f16 is a small
 * change. */
static void reference_is_causal_and_sane(void)
{
    modelgen_params p = ds_params(QTYPE_F32);
    const char *path = gen(&p, "ref");
    int routes[3 * N_TOK * 2];
    double *all = run_ref(path, N_TOK, false, routes);
    double *prefix = run_ref(path, N_TOK / 2, false, NULL);
    double *f16 = run_ref(path, N_TOK, true, NULL);
    CHECK(all && prefix && f16);
    for (int t = 0; t < N_TOK; t++) {
        double lo = INFINITY, hi = -INFINITY;
        for (int i = 0; i < N_VOCAB; i++) {
            double z = all[(size_t)t * N_VOCAB + i];
            CHECK(isfinite(z));
            lo = fmin(lo, z), hi = fmax(hi, z);
        }
        CHECK_MSG(hi - lo > 2.0 && hi - lo < 50.0, "position %d: logits span %g", t, hi - lo);
    }
    CHECK_MSG(moved(all, prefix, N_TOK / 2) < 1e-12, "prefix moved %g", moved(all, prefix, N_TOK / 2));
    int uses[8] = {0}, distinct = 0;
    for (int l = 0; l < 3; l++)
        for (int j = 0; j < N_TOK * 2; j++) {
            int e = routes[l * N_TOK * 2 + j];
            CHECK(l == 0 ? e == -1 : e >= 0 && e < 8);
            if (l > 0)
                distinct += uses[e]++ == 0;
        }
    CHECK_MSG(distinct >= 7, "%d experts used", distinct);
    for (int e = 0; e < 8; e++) /* of 2 layers' 2 * N_TOK choices, a third at most */
        CHECK_MSG(uses[e] <= 2 * 2 * N_TOK / 3, "expert %d took %d of %d", e, uses[e],
                  2 * 2 * N_TOK);
    double d = moved(all, f16, N_TOK);
    CHECK_MSG(d > 0 && d < 0.01, "f16 cache moved %g", d);
    free(all), free(prefix), free(f16);
}

/* Each part of the model moves the logits when it is taken away or changed. */
static void each_part_matters(void)
{
    modelgen_params p = ds_params(QTYPE_F32);
    char base[512];
    snprintf(base, sizeof base, "%s", gen(&p, "parts"));
    double *ref = run_ref(base, N_TOK, false, NULL);
    CHECK(ref);
    static const struct {
        const char *what;
        gguf_edit e;
    } edits[] = {
        {"selection bias", {.drop = {"blk.*.exp_probs_b.bias"}}},
        {"softmax gating", {.num_key = "deepseek2.expert_gating_func", .num_value = 1}},
        {"no groups", {.drop_key = "deepseek2.expert_group_count"}},
        {"weights unnormalized", {.drop_key = "deepseek2.expert_weights_norm"}},
        {"weights unscaled", {.drop_key = "deepseek2.expert_weights_scale"}},
        {"no yarn_log_multiplier", {.drop_key = "deepseek2.rope.scaling.yarn_log_multiplier"}},
        {"no YaRN", {.drop_key = "deepseek2.rope.scaling.type"}},
        {"q_a norm", {.zero = {"blk.*.attn_q_a_norm.weight"}}},
        {"latent norm", {.zero = {"blk.*.attn_kv_a_norm.weight"}}},
        {"the shared experts", {.zero = {"blk.*.ffn_down_shexp.weight"}}},
        {"the rotary key", {.num_key = "deepseek2.rope.freq_base", .num_value = 1e6}},
    };
    char dst[512], err[ERR_MAX];
    snprintf(dst, sizeof dst, "%s/deepseek2-edited.gguf", test_tmpdir());
    for (size_t i = 0; i < sizeof edits / sizeof *edits; i++) {
        CHECK_MSG(gguf_copy_edited(base, dst, &edits[i].e, err) == 0, "%s", err);
        double *other = run_ref(dst, N_TOK, false, NULL);
        CHECK_MSG(other, "%s: not loaded", edits[i].what);
        double d = moved(ref, other, N_TOK);
        free(other);
        CHECK_MSG(d > MOVED, "%s: logits moved %g", edits[i].what, d);
    }
    free(ref);
}

/* A file without a part the reference needs is refused. */
static void missing_parts_are_refused(void)
{
    modelgen_params p = ds_params(QTYPE_F32);
    char base[512];
    snprintf(base, sizeof base, "%s", gen(&p, "missing"));
    static const gguf_edit edits[] = {
        {.drop = {"blk.*.attn_k_b.weight"}},
        {.drop = {"blk.*.attn_v_b.weight"}},
        {.drop = {"blk.*.attn_kv_a_norm.weight"}},
        {.drop = {"blk.*.attn_q_b.weight"}},
        {.drop = {"blk.*.ffn_up_shexp.weight"}},
        {.drop_key = "deepseek2.attention.kv_lora_rank"},
        {.num_key = "deepseek2.expert_gating_func", .num_value = 3},
        {.num_key = "deepseek2.expert_group_count", .num_value = 3},
    };
    char dst[512], err[ERR_MAX];
    snprintf(dst, sizeof dst, "%s/deepseek2-cut.gguf", test_tmpdir());
    for (size_t i = 0; i < sizeof edits / sizeof *edits; i++) {
        CHECK_MSG(gguf_copy_edited(base, dst, &edits[i], err) == 0, "%s", err);
        gguf_file *g = gguf_open(dst, err);
        CHECK_MSG(g, "%s", err);
        ref_model *m = ref_model_load(g);
        CHECK_MSG(!m, "edit %zu loaded", i);
        gguf_close(g);
    }
}

int main(void)
{
    RUN(v3_file_is_llama_cpp_layout);
    RUN(lite_file_leaves_out_the_optional);
    RUN(quantized_rows_fall_back);
    RUN(bad_shapes_are_refused);
    RUN(reference_is_causal_and_sane);
    RUN(each_part_matters);
    RUN(missing_parts_are_refused);
    return test_finish();
}
