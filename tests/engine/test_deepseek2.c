/*
 * DeepSeek-V2/V3 (deepseek2) in the decoder engine, against the double-precision
 * reference (tests/support/ref_deepseek2.c, written from Hugging Face's modeling_deepseek
 * with every head's keys and values decompressed from the latent, where the engine maps
 * the queries into the latent and attends over it as one KV head: the two agree only if
 * the absorption is right).
 *
 * The models are modelgen's on a synthetic 260-token vocabulary: 4 heads, a latent of 64
 * with 16 rotated dimensions, heads of 32 + 16 and values of 32, one dense layer before
 * two with 8 experts of which 2 are used and a shared one. Two shapes: V3's (a query
 * latent, sigmoid gating with the selection bias, 4 groups of which 2 are kept,
 * renormalized weights scaled by 2.5, V2's YaRN with mscale_all_dim) and V2-Lite's (attn_q,
 * softmax gating, no groups, no scaling). Checked: the hyper-parameters the loader reads
 * (the query scale's mscale, the cache of one latent per token stored once); logits
 * against the reference on every attention path in float and 8-bit weights and on
 * compressed chunks; a file of the older converter (one attn_kv_b) gives the newer
 * file's logits bit for bit; a prefill equals the same tokens decoded one by one;
 * sequences stacked in one step equal each alone, bit for bit; the partitioned
 * long-prompt prefill equals one whole step; bad files are refused, naming the tensor or
 * key. Tolerances are test_archs.c's.
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
#define TOL_KV_INT8 0.06 /* test_model.c's */
#define TOL_KV_INT4 0.8
#define N_VOCAB 260

/* DeepSeek-V3's routing and a query latent, V2's YaRN */
static modelgen_params v3_params(uint32_t type)
{
    return (modelgen_params){
        .arch = "deepseek2", .dim = 128, .n_layer = 3, .n_head = 4, .n_head_kv = 1,
        .n_ff = 256, .n_ctx = 512, .type = type, .seed = 31, .n_vocab = N_VOCAB, .n_threads = 1,
        .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 64, .n_expert_shared = 1,
        .n_dense_lead = 1, .q_lora_rank = 64, .kv_lora_rank = 64, .qk_nope_dim = 32,
        .qk_rope_dim = 16, .v_head_dim = 32, .expert_gating = 2, .expert_weights_norm = true,
        .expert_weights_scale = 2.5f, .n_expert_groups = 4, .n_expert_groups_used = 2,
        .exp_probs_b = true, .yarn_factor = 4.0f, .yarn_mscale_all_dim = 0.707f};
}

/* DeepSeek-V2-Lite's: attn_q, softmax gating, no groups, no scaling */
static modelgen_params lite_params(uint32_t type)
{
    modelgen_params p = v3_params(type);
    p.seed = 37;
    p.q_lora_rank = 0;
    p.expert_gating = 1;
    p.expert_weights_norm = false;
    p.expert_weights_scale = 0;
    p.n_expert_groups = p.n_expert_groups_used = 0;
    p.exp_probs_b = false;
    p.yarn_factor = p.yarn_mscale_all_dim = 0;
    return p;
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

/* A prefill of 40, 6 decodes, then a fresh sequence with gapped and out-of-order batches
 * (positions 0..7, 30..37, then 12..15 after them). */
static const model_check_plan PLAN = {.n_prefill = 40, .n_total = 46, .gap_b = 30, .gap_c = 12};

static void test_metadata(void)
{
    char err[ERR_MAX];
    modelgen_params p = v3_params(QTYPE_F32);
    model *m = model_load(gen(&p, "meta"), err);
    CHECK_MSG(m, "%s", err);
    const model_hparams *hp = model_hparams_of(m);
    CHECK_EQ(hp->arch, (int)MODEL_ARCH_DEEPSEEK2);
    CHECK(!strcmp(model_arch_name(hp->arch), "deepseek2"));
    CHECK_EQ(hp->rope_style, MODEL_ROPE_INTERLEAVED);
    CHECK(hp->mla_q_rank == 64 && hp->mla_kv_rank == 64 && hp->mla_qk_nope == 32 &&
          hp->mla_v_dim == 32 && hp->rope_dims == 16);
    /* one KV head: the latent and the rotated key */
    CHECK(hp->n_head == 4 && hp->n_head_kv == 1 && hp->head_dim == 80);
    CHECK(hp->n_expert == 8 && hp->n_expert_used == 2 && hp->n_ff_exp == 64 &&
          hp->n_ff_shexp == 64 && hp->n_ff == 256 && hp->n_dense_lead == 1);
    CHECK(!model_layer_has_experts(hp, 0) && model_layer_has_experts(hp, 1));
    CHECK_EQ(model_ff_max(hp), 256);
    CHECK(hp->expert_sigmoid && hp->expert_norm && hp->expert_scale == 2.5f);
    CHECK(hp->n_expert_groups == 4 && hp->n_expert_groups_used == 2);
    /* mscale = 1 + 0.1 * 0.707 * ln 4, squared, over sqrt(32 + 16); cos and sin unscaled */
    double mscale = 1 + 0.0707 * log(4.0);
    CHECK_NEAR(hp->attn_scale, mscale * mscale / sqrt(48.0), 1e-6);
    CHECK_NEAR(hp->rope_scaling.mscale, 1.0, 1e-6);
    kv_shape s = model_kv_shape(m);
    CHECK(s.n_head_kv == 1 && s.head_dim == 80 && s.shared_kv);
    /* a token's cache: one latent per layer, f16 */
    CHECK_EQ(kv_chunk_data_bytes(s, KV_F16), (size_t)3 * KV_CHUNK_TOKENS * 80 * 2);
    model_free(m);

    p = lite_params(QTYPE_F32);
    m = model_load(gen(&p, "meta-lite"), err);
    CHECK_MSG(m, "%s", err);
    hp = model_hparams_of(m);
    CHECK(hp->mla_q_rank == 0 && !hp->expert_sigmoid && !hp->expert_norm &&
          hp->expert_scale == 0 && hp->n_expert_groups == 0);
    CHECK_NEAR(hp->attn_scale, 1 / sqrt(48.0), 1e-7);
    model_free(m);
}

/* p with every expert used: no choice of experts to flip (a near-tied one goes the other
 * way under 8-bit activations or compressed K/V, and moves the logits by far more than
 * the rounding that flipped it: on these random models by 0.5-2.7, on llama.cpp's side
 * as much against its own F32 logits). */
static modelgen_params every_expert(modelgen_params p)
{
    p.n_expert_used = p.n_expert;
    p.n_expert_groups = p.n_expert_groups_used = 0;
    return p;
}

/* Routing by the file's rules in float weights; 8-bit weights (and activations) with
 * every expert used. */
static void test_logits_vs_reference(void)
{
    modelgen_params v3 = v3_params(QTYPE_F32), lite = lite_params(QTYPE_F32);
    /* YaRN without yarn_log_multiplier: cos and sin times 1 + 0.1 ln(factor), and the
     * query scale times its square, as llama.cpp computes it */
    modelgen_params plain_yarn = v3;
    plain_yarn.yarn_mscale_all_dim = 0;
    const struct {
        modelgen_params p;
        uint32_t type;
        const char *name;
        double tol;
    } cases[] = {
        {v3, QTYPE_F32, "deepseek2-v3-f32", TOL_FLOAT},
        {v3, QTYPE_F16, "deepseek2-v3-f16", TOL_FLOAT},
        {every_expert(v3), QTYPE_Q8_0, "deepseek2-v3-all-q8_0", TOL_QUANT},
        {plain_yarn, QTYPE_F32, "deepseek2-v3-plain-yarn-f32", TOL_FLOAT},
        {lite, QTYPE_F32, "deepseek2-lite-f32", TOL_FLOAT},
        {lite, QTYPE_F16, "deepseek2-lite-f16", TOL_FLOAT},
        {every_expert(lite), QTYPE_Q8_0, "deepseek2-lite-all-q8_0", TOL_QUANT},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
        CHECK_EQ(model_check_type(cases[c].p, cases[c].type, cases[c].name, &PLAN, cases[c].tol),
                 0);
}

/* K/V chunks (the latents) kept in f16 or compressed to 8 and 4 bits, then decodes and a
 * prefill over them, against the reference with exact K/V (every expert used). */
static void test_compressed_chunks(void)
{
    static const double tol[3] = {TOL_FLOAT, TOL_KV_INT8, TOL_KV_INT4};
    modelgen_params p = every_expert(v3_params(QTYPE_F32));
    const char *path = gen(&p, "kv");
    CHECK(path);
    CHECK_EQ(model_check_compressed_file(path, tol), 0);
}

/*
 * Writes src's model as the older converter laid it out: per layer one attn_kv_b of
 * (n_head * (qk_nope + v_head)) rows of the latent's width, each head's key rows (the
 * transpose of its attn_k_b block) then its value rows (its attn_v_b block), in F32;
 * key_length and value_length a head's, head_count_kv n_head, no *_mla keys; every other
 * tensor and key as src has it. 0, or -1 (printed).
 */
static int write_older_layout(const char *src, const char *dst)
{
    char err[ERR_MAX];
    gguf_file *g = gguf_open(src, err);
    if (!g) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    model *m = model_from_gguf(g, err);
    if (!m) {
        fprintf(stderr, "%s\n", err);
        gguf_close(g);
        return -1;
    }
    const model_hparams *hp = model_hparams_of(m);
    int H = hp->n_head, nope = hp->mla_qk_nope, vd = hp->mla_v_dim, rank = hp->mla_kv_rank;
    int L = hp->n_layer, stride = nope + vd;
    float *kv_b = malloc((size_t)L * H * stride * rank * sizeof(float));
    float *row = malloc((size_t)rank * sizeof(float));
    char names[64][64];
    gguf_writer *w = gguf_writer_new();
    int rc = kv_b && row && w && L <= 64 ? 0 : -1;
    for (int64_t i = 0; rc == 0 && i < gguf_n_kv(g); i++) {
        gguf_str k = gguf_key(g, i);
        if (gguf_str_eq(k, "deepseek2.attention.key_length_mla") ||
            gguf_str_eq(k, "deepseek2.attention.value_length_mla") ||
            gguf_str_eq(k, "deepseek2.attention.key_length") ||
            gguf_str_eq(k, "deepseek2.attention.value_length") ||
            gguf_str_eq(k, "deepseek2.attention.head_count_kv"))
            continue;
        rc = gguf_writer_copy_kv(w, g, i);
    }
    if (rc == 0)
        rc = gguf_writer_set_u32(w, "deepseek2.attention.key_length",
                                 (uint32_t)(nope + hp->rope_dims)) |
             gguf_writer_set_u32(w, "deepseek2.attention.value_length", (uint32_t)vd) |
             gguf_writer_set_u32(w, "deepseek2.attention.head_count_kv", (uint32_t)H);
    for (int64_t i = 0; rc == 0 && i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        char name[128], k_name[64], v_name[64];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        int l = -1;
        bool is_k = false, is_v = false;
        for (int j = 0; j < L && !is_k && !is_v; j++) {
            snprintf(k_name, sizeof k_name, "blk.%d.attn_k_b.weight", j);
            snprintf(v_name, sizeof v_name, "blk.%d.attn_v_b.weight", j);
            is_k = !strcmp(name, k_name);
            is_v = !strcmp(name, v_name);
            l = j;
        }
        if (!is_k && !is_v) {
            rc = gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data);
            continue;
        }
        /* head h's block of attn_k_b: row r (latent dimension r) of its key dims; of
         * attn_v_b: row r (value dimension r) over the latent */
        float *layer = kv_b + (size_t)l * H * stride * rank;
        size_t rb = quant_row_bytes(t->type, t->ne[0]);
        int rows = is_k ? rank : vd;
        for (int h = 0; h < H; h++)
            for (int r = 0; r < rows; r++) {
                quant_dequantize_row(t->type, (const char *)t->data + ((size_t)h * rows + r) * rb,
                                     row, t->ne[0]);
                for (int c = 0; c < t->ne[0]; c++)
                    if (is_k)
                        layer[((size_t)h * stride + c) * rank + r] = row[c];
                    else
                        layer[((size_t)h * stride + nope + r) * rank + c] = row[c];
            }
        if (is_k) {
            snprintf(names[l], sizeof names[l], "blk.%d.attn_kv_b.weight", l);
            int64_t ne[2] = {rank, (int64_t)H * stride};
            rc = gguf_writer_add_tensor(w, names[l], QTYPE_F32, 2, ne, layer);
        }
    }
    if (rc == 0 && gguf_writer_write(w, dst, err) < 0) {
        fprintf(stderr, "%s\n", err);
        rc = -1;
    }
    gguf_writer_free(w);
    free(row);
    free(kv_b);
    model_free(m);
    gguf_close(g);
    return rc;
}

/* The older converter's file of the same weights: the same logits, bit for bit, from an
 * f32 copy of attn_k_b the loader makes (in F32 files the newer layout's blocks are f32
 * too, so the products are the same). */
static void test_older_layout(void)
{
    modelgen_params p = v3_params(QTYPE_F32);
    const char *newer = gen(&p, "newer");
    CHECK(newer);
    char older[512], err[ERR_MAX];
    snprintf(older, sizeof older, "%s/deepseek2-older.gguf", test_tmpdir());
    CHECK_EQ(write_older_layout(newer, older), 0);
    model *a = model_load(newer, err), *b = model_load(older, err);
    CHECK_MSG(a && b, "%s", err);
    CHECK_EQ(model_hparams_of(b)->head_dim, 80);
    CHECK_EQ(model_hparams_of(b)->n_head_kv, 1);
    model_runner *ra = model_runner_new(a, 2, 64, 128, err);
    model_runner *rb = model_runner_new(b, 2, 64, 128, err);
    kv_pool *pa = kv_pool_new(model_kv_shape(a), 0, err);
    kv_pool *pb = kv_pool_new(model_kv_shape(b), 0, err);
    CHECK(ra && rb && pa && pb);
    enum { N = 40 };
    int32_t tok[N], pos[N];
    for (int i = 0; i < N; i++)
        tok[i] = (i * 37 + 11) % N_VOCAB, pos[i] = i;
    static float la[N * N_VOCAB], lb[N * N_VOCAB];
    for (int one_by_one = 0; one_by_one < 2; one_by_one++) {
        CHECK_EQ(model_check_run(ra, pa, N_VOCAB, N, tok, pos, one_by_one, la), 0);
        CHECK_EQ(model_check_run(rb, pb, N_VOCAB, N, tok, pos, one_by_one, lb), 0);
        CHECK_MSG(!memcmp(la, lb, sizeof la), "%s: %g", one_by_one ? "decode" : "prefill",
                  model_check_max_rel(la, lb, (size_t)N * N_VOCAB));
    }
    kv_pool_free(pa);
    kv_pool_free(pb);
    model_runner_free(ra);
    model_runner_free(rb);
    model_free(a);
    model_free(b);
}

/* A prefill of 48 tokens gives the logits of 48 single-token decodes (rounding apart). */
static void test_prefill_equals_decode(void)
{
    modelgen_params p = v3_params(QTYPE_F32);
    const char *path = gen(&p, "pd");
    CHECK(path);
    double d = model_check_prefill_vs_decode(path);
    printf("  prefill vs decode %.2g\n", d);
    CHECK(d <= TOL_PART);
}

/* Three sequences advanced in one step give each one's logits alone, bit for bit. */
static void test_batched_equals_alone(void)
{
    modelgen_params p = v3_params(QTYPE_F32);
    const char *path = gen(&p, "bat");
    CHECK(path);
    double d;
    CHECK_MSG(model_check_batched_vs_alone(path, &d) == 1, "%g", d);
}

/* Score blocks of fewer rows and row slices give the unpartitioned logits and hidden
 * rows, after a history in f16 and in 4-bit chunks. */
static void test_partitioned_prefill(void)
{
    const enum kv_precision hist[] = {KV_F16, KV_INT4};
    modelgen_params p = v3_params(QTYPE_F32);
    const char *path = gen(&p, "part");
    CHECK(path);
    double d = model_check_partitioned_shapes(path, hist, 2);
    printf("  partitioned vs whole: %.2g\n", d);
    CHECK(d <= TOL_PART);
}

/* A file without a part deepseek2 needs, or with one that does not fit, is refused,
 * naming it. */
static void test_bad_files_refused(void)
{
    const struct {
        gguf_edit edit;
        const char *named, *says;
    } cases[] = {
        {{.drop = {"blk.1.attn_kv_a_norm.weight"}}, "blk.1.attn_kv_a_norm.weight", "missing"},
        {{.drop = {"blk.0.attn_k_b.weight"}}, "blk.0.attn_k_b.weight", "missing"},
        {{.drop = {"blk.2.attn_q_a.weight"}}, "blk.2.attn_q_a.weight", "missing"},
        {{.drop = {"blk.0.ffn_gate.weight"}}, "blk.0.ffn_gate.weight", "missing"},
        {{.drop = {"blk.1.ffn_down_shexp.weight"}}, "blk.1.ffn_down_shexp.weight", "missing"},
        {{.drop_key = "deepseek2.attention.kv_lora_rank"}, "deepseek2.attention.kv_lora_rank",
         "missing"},
        {{.num_key = "deepseek2.attention.head_count_kv", .num_value = 2},
         "deepseek2.attention.head_count_kv", "one"},
        {{.num_key = "deepseek2.attention.key_length", .num_value = 96},
         "deepseek2.attention.key_length", "kv_lora_rank"},
        {{.num_key = "deepseek2.expert_group_count", .num_value = 3},
         "deepseek2.expert_group_count", "do not fit"},
        {{.num_key = "deepseek2.expert_gating_func", .num_value = 3},
         "deepseek2.expert_gating_func", "sigmoid"},
        {{.num_key = "deepseek2.attention.temperature_scale", .num_value = 1},
         "deepseek2.attention.temperature_scale", "not supported"},
    };
    modelgen_params p = v3_params(QTYPE_F16);
    const char *src = gen(&p, "whole16");
    CHECK(src);
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
        CHECK_MSG(model_check_refused(src, "deepseek2", &cases[c].edit, cases[c].named,
                                      cases[c].says) == 0, "%s", cases[c].named);
}

int main(void)
{
    RUN(test_metadata);
    RUN(test_logits_vs_reference);
    RUN(test_compressed_chunks);
    RUN(test_older_layout);
    RUN(test_prefill_equals_decode);
    RUN(test_batched_equals_alone);
    RUN(test_partitioned_prefill);
    RUN(test_bad_files_refused);
    return test_finish();
}
