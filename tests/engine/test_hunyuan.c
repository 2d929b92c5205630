/*
 * Hunyuan's dense models (hunyuan-dense: Hunyuan 0.5B to 7B, Hunyuan-MT-7B) in the decoder
 * engine, against the double-precision reference (tests/support/ref_forward.c, written
 * from Hugging Face's HunYuanDenseV1 modeling code): qwen3's layer with the per-head q/k
 * RMSNorms of the rotated q and k, and the RoPE base raised by the NTK-aware
 * rope.scaling.alpha (base * alpha^(d / (d - 2))).
 *
 * The models are modelgen's on a synthetic 260-token vocabulary, with grouped-query
 * attention (4 heads over 2 KV heads, heads of 64) and Hunyuan-7B's alpha of 1000.
 * Checked: the hyper-parameters the loader reads; logits against the reference on every
 * attention path (a 40-row prefill on sgemm, sub-batches of 8 on per-row attention,
 * gapped and out-of-order batches, compressed KV chunks) in float and 8-bit weights; that
 * removing the q/k norms or the alpha moves the reference far past the tolerance; a
 * prefill equals the same tokens decoded one by one; sequences stacked in one step equal
 * each alone, bit for bit; the partitioned long-prompt prefill equals one whole step;
 * files without a part it needs, or with HunyuanOCR's XD-RoPE sections, are refused,
 * naming it. Tolerances are test_archs.c's. The pre-tokenizer "hunyuan-dense" gives
 * llama.cpp's ids on the GPT-2 vocabulary of the shared test data.
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
/* 4-bit chunks cost this model more than test_model.c's 0.8 allows: 0.80 here, where the
 * other architectures' tests measure 0.4-0.55 (its K is RMS-normalized per head after
 * RoPE); f16 and 8-bit chunks are within the usual bounds. */
#define TOL_KV_INT4 1.0
#define N_VOCAB 260

static modelgen_params hy_params(uint32_t type)
{
    return (modelgen_params){.arch = "hunyuan-dense", .dim = 128, .n_layer = 4, .n_head = 4,
                             .n_head_kv = 2, .head_dim = 64, .n_ff = 256, .n_ctx = 512,
                             .type = type, .seed = 29, .n_vocab = N_VOCAB, .n_threads = 1};
}

static const char *gen(const modelgen_params *p, const char *name)
{
    static char path[4][512];
    static int k;
    char *out = path[k++ % 4];
    snprintf(out, sizeof path[0], "%s/hunyuan-%s.gguf", test_tmpdir(), name);
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
    modelgen_params p = hy_params(QTYPE_F32);
    model *m = model_load(gen(&p, "meta"), err);
    CHECK_MSG(m, "%s", err);
    const model_hparams *hp = model_hparams_of(m);
    CHECK_EQ(hp->arch, (int)MODEL_ARCH_HUNYUAN_DENSE);
    CHECK(!strcmp(model_arch_name(hp->arch), "hunyuan-dense"));
    CHECK_EQ(hp->rope_style, MODEL_ROPE_HALVES);
    CHECK(hp->qk_norm_after_rope && hp->pre_norms && !hp->post_norms);
    CHECK(hp->n_head == 4 && hp->n_head_kv == 2 && hp->head_dim == 64 && hp->n_ff == 256);
    /* 10000 * 1000^(64 / 62) */
    CHECK_NEAR(hp->rope_base / (10000.0 * pow(1000.0, 64.0 / 62.0)), 1.0, 1e-6);
    CHECK_NEAR(hp->norm_eps, 1e-5, 1e-12);
    model_layer_tensors lt;
    model_layer_tensors_of(m, 2, &lt);
    CHECK(lt.extras.q_norm && lt.extras.k_norm && !lt.extras.bq && !lt.bo);
    model_free(m);
}

static void test_logits_vs_reference(void)
{
    CHECK_EQ(model_check_types(hy_params(QTYPE_F32), "hunyuan", &PLAN, TOL_FLOAT, TOL_QUANT), 0);
}

/* K/V chunks kept in f16 or compressed to 8 and 4 bits, then decodes and a prefill over
 * them, against the reference with exact K/V (the tolerances above). */
static void test_compressed_chunks(void)
{
    static const double tol[3] = {TOL_FLOAT, TOL_KV_INT8, TOL_KV_INT4};
    modelgen_params p = hy_params(QTYPE_F32);
    const char *path = gen(&p, "kv");
    CHECK(path);
    CHECK_EQ(model_check_compressed_file(path, tol), 0);
}

/* Hunyuan's own parts each move the reference by more than 5 float tolerances when the
 * file is rewritten without them (the alpha: set to 0, the file's base alone). */
static void test_parts_matter(void)
{
    const struct {
        const char *what;
        gguf_edit edit;
    } cases[] = {
        {"q/k norms", {.drop = {"blk.*.attn_q_norm.weight", "blk.*.attn_k_norm.weight"}}},
        {"alpha", {.num_key = "hunyuan-dense.rope.scaling.alpha", .num_value = 0}},
    };
    modelgen_params p = hy_params(QTYPE_F32);
    const char *src = gen(&p, "whole");
    CHECK(src);
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        double d = model_check_part_matters(src, &cases[c].edit, false);
        printf("  without its %s: the reference moves by %.3g\n", cases[c].what, d);
        CHECK_MSG(d > 5 * TOL_FLOAT, "%s: %g", cases[c].what, d);
    }
}

/* A prefill of 48 tokens gives the logits of 48 single-token decodes (rounding apart). */
static void test_prefill_equals_decode(void)
{
    modelgen_params p = hy_params(QTYPE_F32);
    const char *path = gen(&p, "pd");
    CHECK(path);
    double d = model_check_prefill_vs_decode(path);
    printf("  prefill vs decode %.2g\n", d);
    CHECK(d <= TOL_PART);
}

/* Three sequences advanced in one step give each one's logits alone, bit for bit. */
static void test_batched_equals_alone(void)
{
    modelgen_params p = hy_params(QTYPE_F32);
    const char *path = gen(&p, "bat");
    CHECK(path);
    double d;
    CHECK_MSG(model_check_batched_vs_alone(path, &d) == 1, "%g", d);
}

/* Score blocks of fewer rows and row slices give the unpartitioned logits and hidden
 * rows. */
static void test_partitioned_prefill(void)
{
    const enum kv_precision hist[] = {KV_F16};
    modelgen_params p = hy_params(QTYPE_F32);
    const char *path = gen(&p, "part");
    CHECK(path);
    double d = model_check_partitioned_shapes(path, hist, 1);
    printf("  partitioned vs whole: %.2g\n", d);
    CHECK(d <= TOL_PART);
}

/* A file without a part hunyuan-dense needs is refused, naming it; so is HunyuanOCR's
 * XD-RoPE and a negative alpha, naming the key. */
static void test_missing_parts_refused(void)
{
    static const int32_t sections[4] = {8, 8, 8, 8};
    const struct {
        gguf_edit edit;
        const char *named, *says;
    } cases[] = {
        {{.drop = {"blk.1.attn_q_norm.weight"}}, "blk.1.attn_q_norm.weight", "missing"},
        {{.drop = {"blk.0.ffn_norm.weight"}}, "blk.0.ffn_norm.weight", "missing"},
        {{.drop_key = "hunyuan-dense.attention.layer_norm_rms_epsilon"},
         "hunyuan-dense.attention.layer_norm_rms_epsilon", "missing"},
        {{.ints_key = "hunyuan-dense.rope.dimension_sections", .ints = sections, .n_ints = 4},
         "hunyuan-dense.rope.dimension_sections", "not supported"},
        {{.num_key = "hunyuan-dense.rope.scaling.alpha", .num_value = -1},
         "hunyuan-dense.rope.scaling.alpha", "out of range"},
    };
    char err[ERR_MAX], dst[512];
    snprintf(dst, sizeof dst, "%s/hunyuan-broken.gguf", test_tmpdir());
    modelgen_params p = hy_params(QTYPE_F16);
    const char *src = gen(&p, "whole16");
    CHECK(src);
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        CHECK(gguf_copy_edited(src, dst, &cases[c].edit, err) == 0);
        err[0] = '\0';
        CHECK(model_load(dst, err) == NULL);
        printf("  refused: %s\n", err);
        CHECK_MSG(strstr(err, cases[c].named) && strstr(err, cases[c].says), "%s", err);
    }
}

/* The GPT-2 vocabulary with tokenizer.ggml.pre "hunyuan-dense" (Hunyuan's own vocabulary
 * is not in the test data): digits in threes, CJK ideographs and kana in runs of their
 * own, a letter run after one ASCII punctuation mark, marks with their letters; the ids
 * are llama.cpp's (2026-04, llama_tokenize with add_special and parse_special) on the same
 * file. */
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
        int32_t ids[40];
    } cases[] = {
        {"服务器返回状态码和消息。サーバーはひらがな", 39,
         {17312, 235,   27950, 94,    161,   247,   101,   32573, 242,   32368,
          252,   163,   232,   35050, 222,   223,   163,   254,   223,   161,
          240,   234,   162,   114,   230,   162,   223,   107,   16764, 26503,
          12045, 238,   6312,  31676, 2515,  110,   36853, 35585, 26945}},
        {"#include <stdio.h> $HOME @user .NET", 14,
         {2, 17256, 1279, 19282, 952, 13, 71, 29, 720, 39069, 2488, 7220, 764, 12884}},
        {"café naïve e\xcc\x81 ½ € 😀😀 ++--==", 17,
         {66, 1878, 2634, 41492, 304, 136, 223, 220, 23141, 10432, 30325, 222, 47249, 222,
          19969, 438, 855}},
        {"Hello, world 1234567!", 8, {15496, 11, 995, 220, 10163, 29228, 22, 0}},
    };
    char path[512], err[ERR_MAX];
    snprintf(path, sizeof path, "%s/hunyuan-vocab.gguf", test_tmpdir());
    CHECK_MSG(gguf_copy_with_str(src, path, "tokenizer.ggml.pre", "hunyuan-dense", err) == 0,
              "%s", err);
    gguf_file *g = gguf_open(path, err);
    CHECK_MSG(g, "%s", err);
    tokenizer *t = NULL;
    CHECK_MSG(tok_load(g, &t, err) == 0, "%s", err);
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        int32_t ids[64];
        int n = tok_encode(t, cases[c].text, strlen(cases[c].text), true, true, ids, 64);
        CHECK_MSG(n == cases[c].n && !memcmp(ids, cases[c].ids, (size_t)n * sizeof *ids),
                  "case %zu: %d ids", c, n);
    }
    tok_free(t);
    gguf_close(g);
}

int main(void)
{
    RUN(test_metadata);
    RUN(test_logits_vs_reference);
    RUN(test_compressed_chunks);
    RUN(test_parts_matter);
    RUN(test_prefill_equals_decode);
    RUN(test_batched_equals_alone);
    RUN(test_partitioned_prefill);
    RUN(test_missing_parts_refused);
    RUN(test_pre_tokenizer);
    return test_finish();
}
