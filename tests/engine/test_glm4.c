/*
 * GLM-4 (glm4: GLM-4-9B/32B-0414, GLM-Z1) and ChatGLM (chatglm: GLM-4-9B-chat of 2024) in
 * the decoder engine, against the double-precision reference (tests/support/ref_forward.c,
 * written from Hugging Face's modeling_glm4 and THUDM's modeling_chatglm): RMSNorms before
 * each sublayer and (glm4) after it, q/k/v biases (chatglm's in one attn_qkv with q, k and
 * v), gate and up in one ffn_up, RoPE over half of each head in neighbouring pairs.
 *
 * The models are modelgen's on a synthetic 260-token vocabulary, with grouped-query
 * attention (4 heads over 2 KV heads) as GLM-4's. Checked for each: the hyper-parameters
 * the loader reads; logits against the reference on every attention path (a 40-row
 * prefill on sgemm, sub-batches of 8 on per-row attention, gapped and out-of-order
 * batches, compressed KV chunks) in float and 8-bit weights; that removing each of its own
 * parts from the file (glm4's post norms, the biases) or rotating whole heads moves the
 * reference far past the tolerance, so the comparison would catch an engine that ignored
 * it; that q, k and v fused into one attn_qkv with one bias (as llama.cpp also reads glm4)
 * answer as glm4's separate ones; a prefill equals the same tokens decoded one by one;
 * sequences stacked in one step equal each alone, bit for bit; the partitioned long-prompt
 * prefill equals one whole step; files without a part the architecture needs, or with
 * GLM-4.1V's or GLM-OCR's keys, are refused, naming the tensor or the key. Tolerances are
 * test_archs.c's. The tokenizer's pre-tokenizers "glm4" and "chatglm-bpe" give llama.cpp's
 * ids on the GPT-2 vocabulary of the shared test data, without BOS.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf/gguf.h"
#include "engine/gguf/modelgen.h"
#include "engine/model/model.h"
#include "engine/quant/quant.h"
#include "engine/tok/tokenizer.h"
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

static const char *const ARCHS[] = {"glm4", "chatglm"};
#define N_ARCHS 2

static modelgen_params glm4_params(const char *arch, uint32_t type)
{
    return (modelgen_params){.arch = arch, .dim = 128, .n_layer = 4, .n_head = 4,
                             .n_head_kv = 2, .n_ff = 256, .n_ctx = 512, .type = type,
                             .seed = 17, .n_vocab = N_VOCAB, .n_threads = 1};
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

static int32_t tok_at(int i)
{
    return (int32_t)((i * 37 + 11) % N_VOCAB);
}

/* A prefill of 40, 6 decodes, then a fresh sequence with gapped and out-of-order batches
 * (positions 0..7, 30..37, then 12..15 after them). */
static const model_check_plan PLAN = {.n_prefill = 40, .n_total = 46, .gap_b = 30, .gap_c = 12};

static void metadata_of(int a)
{
    char err[ERR_MAX];
    modelgen_params p = glm4_params(ARCHS[a], QTYPE_F32);
    model *m = model_load(gen(&p, "meta"), err);
    CHECK_MSG(m, "%s", err);
    const model_hparams *hp = model_hparams_of(m);
    CHECK_EQ(hp->arch, a == 0 ? (int)MODEL_ARCH_GLM4 : (int)MODEL_ARCH_CHATGLM);
    CHECK(!strcmp(model_arch_name(hp->arch), ARCHS[a]));
    CHECK_EQ(hp->rope_style, MODEL_ROPE_INTERLEAVED);
    CHECK_EQ(hp->rope_dims, 16); /* half of each 32-wide head */
    CHECK(hp->pre_norms && hp->post_norms == (a == 0));
    CHECK_EQ(hp->norm, MODEL_NORM_RMS);
    CHECK_EQ(hp->ffn_act, MODEL_FFN_SILU);
    CHECK(hp->n_head == 4 && hp->n_head_kv == 2 && hp->head_dim == 32 && hp->n_ff == 256);
    CHECK_NEAR(hp->attn_scale, 1.0 / sqrt(32.0), 1e-7);
    CHECK_NEAR(hp->rope_base, 10000.0, 1e-3);
    CHECK_NEAR(hp->norm_eps, 1e-5, 1e-12);
    /* gate and up are views of one ffn_up's rows, the gate's first; chatglm's q, k, v of
     * one attn_qkv's, its biases of one bias */
    model_layer_tensors lt;
    model_layer_tensors_of(m, 1, &lt);
    CHECK(lt.w_gate.rows == 256 && lt.w_up.rows == 256);
    CHECK((const char *)lt.w_up.data == (const char *)lt.w_gate.data + 256 * lt.w_gate.row_bytes);
    CHECK(lt.extras.bq && lt.extras.bk && lt.extras.bv);
    CHECK(a == 0 || ((const char *)lt.wk.data == (const char *)lt.wq.data + 128 * lt.wq.row_bytes &&
                     lt.extras.bk == lt.extras.bq + 128 && lt.extras.bv == lt.extras.bk + 64));
    model_free(m);
}

static void test_metadata(void)
{
    for (int a = 0; a < N_ARCHS; a++)
        metadata_of(a);
}

static void test_logits_vs_reference(void)
{
    const uint32_t types[] = {QTYPE_F32, QTYPE_F16, QTYPE_Q8_0};
    for (int a = 0; a < N_ARCHS; a++) {
        for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
            modelgen_params p = glm4_params(ARCHS[a], types[t]);
            const char *path = gen(&p, "ref");
            CHECK(path);
            bool f16_rounds = types[t] == QTYPE_F16 && quant_f16_rounds_activation(p.dim);
            bool exact = types[t] == QTYPE_F32 || (types[t] == QTYPE_F16 && !f16_rounds);
            double tol = exact ? TOL_FLOAT : TOL_QUANT;
            /* 512: the 40-row prefill takes sgemm attention; 8: dot kernels and per-row
             * attention in sub-batches */
            double d1 = model_check_file(path, 512, 2, &PLAN);
            double d2 = model_check_file(path, 8, 1, &PLAN);
            printf("  %s %s: max |logit diff| %.4g (sgemm) %.4g (per row)\n", ARCHS[a],
                   quant_traits_of(types[t])->name, d1, d2);
            CHECK_MSG(d1 <= tol && d2 <= tol, "%s %s: %g %g > %g", ARCHS[a],
                      quant_traits_of(types[t])->name, d1, d2, tol);
        }
    }
}

/* K/V chunks kept in f16 or compressed to 8 and 4 bits, then decodes (attention on
 * decoded blocks) and a prefill over them, against the reference with exact K/V (test_model's
 * tolerances: the compression's own error). */
static void compressed_of(const char *arch)
{
    char err[ERR_MAX];
    modelgen_params p = glm4_params(arch, QTYPE_F32);
    const char *path = gen(&p, "kv");
    CHECK(path);
    model *m = model_load(path, err);
    CHECK_MSG(m, "%s", err);
    ref_model *rm = ref_model_load(model_gguf(m));
    CHECK(rm);
    double e16 = model_check_compressed(m, rm, KV_F16), e8 = model_check_compressed(m, rm, KV_INT8);
    double e4 = model_check_compressed(m, rm, KV_INT4);
    printf("  %s: max |logit diff| vs exact KV: f16 %.4f int8 %.4f int4 %.4f\n", arch, e16, e8,
           e4);
    CHECK(e16 <= TOL_FLOAT);
    CHECK(e8 <= TOL_KV_INT8);
    CHECK(e4 <= TOL_KV_INT4);
    ref_model_free(rm);
    model_free(m);
}

static void test_compressed_chunks(void)
{
    for (int a = 0; a < N_ARCHS; a++)
        compressed_of(ARCHS[a]);
}

/* Each of glm4's and chatglm's own parts moves the reference by more than 5 float
 * tolerances when the file is rewritten without it: the comparison above would catch an
 * engine that ignored it. */
static void test_parts_matter(void)
{
    const struct {
        int arch; /* of ARCHS */
        const char *what;
        gguf_edit edit;
    } cases[] = {
        {0, "post norms",
         {.drop = {"blk.*.post_attention_norm.weight", "blk.*.post_ffw_norm.weight"}}},
        {0, "q/k/v biases",
         {.drop = {"blk.*.attn_q.bias", "blk.*.attn_k.bias", "blk.*.attn_v.bias"}}},
        {0, "partial rotary", {.num_key = "glm4.rope.dimension_count", .num_value = 32}},
        {1, "q/k/v bias", {.drop = {"blk.*.attn_qkv.bias"}}},
        {1, "partial rotary", {.num_key = "chatglm.rope.dimension_count", .num_value = 32}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        modelgen_params p = glm4_params(ARCHS[cases[c].arch], QTYPE_F32);
        const char *src = gen(&p, "whole");
        CHECK(src);
        double d = model_check_part_matters(src, &cases[c].edit, false);
        printf("  %s without its %s: the reference moves by %.3g\n", ARCHS[cases[c].arch],
               cases[c].what, d);
        CHECK_MSG(d > 5 * TOL_FLOAT, "%s %s: %g", ARCHS[cases[c].arch], cases[c].what, d);
    }
}

/* The same weights with q, k, v (and their biases) in one attn_qkv answer as with them
 * apart, bit for bit. */
static void test_fused_qkv(void)
{
    enum { N = 24 };
    char err[ERR_MAX], dst[512];
    snprintf(dst, sizeof dst, "%s/glm4-fused.gguf", test_tmpdir());
    modelgen_params p = glm4_params("glm4", QTYPE_F16);
    const char *src = gen(&p, "apart");
    CHECK(src);
    gguf_edit e = {.fuse_qkv = true};
    CHECK(gguf_copy_edited(src, dst, &e, err) == 0);
    int32_t tok[N], pos[N];
    for (int i = 0; i < N; i++)
        tok[i] = tok_at(i * 5 + 2), pos[i] = i;
    float *out[2];
    const char *paths[2] = {src, dst};
    for (int f = 0; f < 2; f++) {
        out[f] = malloc(sizeof(float) * N * N_VOCAB);
        model *m = model_load(paths[f], err);
        CHECK_MSG(m, "%s", err);
        model_layer_tensors lt;
        model_layer_tensors_of(m, 0, &lt);
        CHECK(lt.extras.bq && lt.extras.bk && lt.extras.bv);
        model_runner *r = model_runner_new(m, 2, 0, 0, err);
        kv_pool *pool = kv_pool_new(model_kv_shape(m), 0, err);
        CHECK(r && pool);
        CHECK(model_check_run(r, pool, N_VOCAB, N, tok, pos, false, out[f]) == 0);
        kv_pool_free(pool);
        model_runner_free(r);
        model_free(m);
    }
    double d = model_check_max_rel(out[0], out[1], (size_t)N * N_VOCAB);
    printf("  attn_qkv vs attn_q/k/v: %.2g\n", d);
    CHECK(d == 0); /* views of the same rows: the same products */
    free(out[0]), free(out[1]);
}

/* A prefill of 48 tokens gives the logits of 48 single-token decodes (sgemm attention over
 * f32 K/V against per-row attention over f16 blocks: rounding apart). */
static void test_prefill_equals_decode(void)
{
    for (int a = 0; a < N_ARCHS; a++) {
        modelgen_params p = glm4_params(ARCHS[a], QTYPE_F32);
        const char *path = gen(&p, "pd");
        CHECK(path);
        double d = model_check_prefill_vs_decode(path);
        printf("  %s: prefill vs decode %.2g\n", ARCHS[a], d);
        CHECK(d <= TOL_PART);
    }
}

/* Three sequences advanced in one step (two decode rows and a slice of 5: 7 stacked rows)
 * give each one's logits alone, bit for bit (f32 weights: per-row dot kernels, per-row
 * attention, as alone). */
static void test_batched_equals_alone(void)
{
    for (int a = 0; a < N_ARCHS; a++) {
        modelgen_params p = glm4_params(ARCHS[a], QTYPE_F32);
        const char *path = gen(&p, "bat");
        CHECK(path);
        double d;
        CHECK_MSG(model_check_batched_vs_alone(path, &d) == 1, "%s: %g", ARCHS[a], d);
    }
}

/* Score blocks of fewer rows (moderate partitioning) and row slices (severe: each slice's
 * K/V appended before the next; slices under 16 rows take the per-row path) give the
 * unpartitioned logits and hidden rows. */
static void test_partitioned_prefill(void)
{
    const enum kv_precision hist[] = {KV_F16};
    double worst = 0;
    for (int a = 0; a < N_ARCHS; a++) {
        modelgen_params p = glm4_params(ARCHS[a], QTYPE_F32);
        const char *path = gen(&p, "part");
        CHECK(path);
        double d = model_check_partitioned_shapes(path, hist, 1);
        CHECK_MSG(d <= TOL_PART, "%s: %g", ARCHS[a], d);
        worst = fmax(worst, d);
    }
    printf("  partitioned vs whole: %.2g\n", worst);
}

/* A file without a part glm4 or chatglm needs is refused, naming the tensor; so is a glm4
 * one with a bias of q alone (biases are all three or none), and GLM-4.1V's M-RoPE and
 * GLM-OCR's NextN layers, naming the key. A chatglm file without attn_qkv is read as one of
 * separate q, k, v, as llama.cpp reads it: the first of those is named. */
static void test_missing_parts_refused(void)
{
    const struct {
        int arch; /* of ARCHS */
        gguf_edit edit;
        const char *named, *says;
    } cases[] = {
        {0, {.drop = {"blk.1.post_attention_norm.weight"}}, "blk.1.post_attention_norm.weight",
         "missing"},
        {0, {.drop = {"blk.3.post_ffw_norm.weight"}}, "blk.3.post_ffw_norm.weight", "missing"},
        {0, {.drop = {"blk.0.attn_norm.weight"}}, "blk.0.attn_norm.weight", "missing"},
        {0, {.drop = {"blk.2.ffn_norm.weight"}}, "blk.2.ffn_norm.weight", "missing"},
        {0, {.drop = {"blk.2.ffn_up.weight"}}, "blk.2.ffn_up.weight", "missing"},
        {0, {.drop = {"blk.0.attn_k.bias"}}, "blk.0.attn_k.bias", "missing"},
        {0, {.drop = {"blk.1.attn_v.weight"}}, "blk.1.attn_v.weight", "missing"},
        {0, {.drop_key = "glm4.attention.layer_norm_rms_epsilon"},
         "glm4.attention.layer_norm_rms_epsilon", "missing"},
        {0, {.num_key = "glm4.nextn_predict_layers", .num_value = 1},
         "glm4.nextn_predict_layers", "not supported"},
        {0, {.num_key = "glm4.rope.dimension_sections", .num_value = 8},
         "glm4.rope.dimension_sections", "not supported"},
        {0, {.num_key = "glm4.feed_forward_length", .num_value = 512}, "blk.0.ffn_up.weight",
         "2 * feed_forward_length"},
        {1, {.drop = {"blk.2.attn_qkv.weight"}}, "blk.2.attn_q.weight", "missing"},
        {1, {.drop = {"blk.3.ffn_down.weight"}}, "blk.3.ffn_down.weight", "missing"},
        {1, {.drop = {"blk.0.ffn_norm.weight"}}, "blk.0.ffn_norm.weight", "missing"},
        {1, {.drop_key = "chatglm.attention.layer_norm_rms_epsilon"},
         "chatglm.attention.layer_norm_rms_epsilon", "missing"},
    };
    char err[ERR_MAX], dst[512];
    snprintf(dst, sizeof dst, "%s/glm4-broken.gguf", test_tmpdir());
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        modelgen_params p = glm4_params(ARCHS[cases[c].arch], QTYPE_F16);
        const char *src = gen(&p, "whole");
        CHECK(src);
        CHECK(gguf_copy_edited(src, dst, &cases[c].edit, err) == 0);
        err[0] = '\0';
        CHECK(model_load(dst, err) == NULL);
        printf("  %s: refused: %s\n", ARCHS[cases[c].arch], err);
        CHECK_MSG(strstr(err, cases[c].named) && strstr(err, cases[c].says), "%s", err);
    }
}

/* The GPT-2 vocabulary with tokenizer.ggml.pre "glm4" or "chatglm-bpe" (GLM-4's own
 * vocabulary is not in the test data): llama3's split (contractions of any case, digits in
 * threes, line breaks apart), no BOS; the ids are llama.cpp's (2026-04, llama_tokenize with
 * add_special and parse_special) on the same file. */
static void test_pre_tokenizer(void)
{
    const char *src = test_data_path("vocab/ggml-vocab-gpt-2.gguf");
    if (!src) {
        SKIP("no shared test data (vocab/ggml-vocab-gpt-2.gguf)");
        return;
    }
    static const struct {
        const char *text;
        int n;
        int32_t ids[16];
    } cases[] = {
        {"Hello, world 1234567!", 8, {15496, 11, 995, 220, 10163, 29228, 22, 0}},
        {"don'T 'S 'Re 1234567890 x", 13,
         {9099, 6, 51, 705, 50, 705, 3041, 220, 10163, 29228, 40401, 15, 2124}},
        {"a\r\nb\n\n\nc  \n d", 11, {64, 201, 198, 65, 628, 198, 66, 220, 220, 198, 288}},
        {"  leading\n\n\ttabs   and spaces  ", 12,
         {220, 3756, 628, 197, 8658, 82, 220, 220, 290, 9029, 220, 220}},
    };
    const char *pres[] = {"glm4", "chatglm-bpe"};
    for (int p = 0; p < 2; p++) {
        char path[512], err[ERR_MAX];
        snprintf(path, sizeof path, "%s/glm4-vocab-%d.gguf", test_tmpdir(), p);
        CHECK_MSG(gguf_copy_with_str(src, path, "tokenizer.ggml.pre", pres[p], err) == 0, "%s",
                  err);
        gguf_file *g = gguf_open(path, err);
        CHECK_MSG(g, "%s", err);
        tokenizer *t = NULL;
        CHECK_MSG(tok_load(g, &t, err) == 0, "%s: %s", pres[p], err);
        CHECK(!tok_add_bos(t));
        for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
            int32_t ids[64];
            int n = tok_encode(t, cases[c].text, strlen(cases[c].text), true, true, ids, 64);
            CHECK_MSG(n == cases[c].n && !memcmp(ids, cases[c].ids, (size_t)n * sizeof *ids),
                      "%s: case %zu: %d ids", pres[p], c, n);
        }
        tok_free(t);
        gguf_close(g);
    }
}

int main(void)
{
    RUN(test_metadata);
    RUN(test_logits_vs_reference);
    RUN(test_compressed_chunks);
    RUN(test_parts_matter);
    RUN(test_fused_qkv);
    RUN(test_prefill_equals_decode);
    RUN(test_batched_equals_alone);
    RUN(test_partitioned_prefill);
    RUN(test_missing_parts_refused);
    RUN(test_pre_tokenizer);
    return test_finish();
}
