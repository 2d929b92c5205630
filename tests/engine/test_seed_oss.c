/*
 * Seed-OSS (seed_oss: ByteDance's Seed-OSS-36B) in the decoder engine, against the
 * double-precision reference (tests/support/ref_forward.c, written from Hugging Face's
 * modeling_seed_oss): llama's layer with rotate_half (NEOX) RoPE, q/k/v biases, and the
 * feed-forward's RMSNorm named after HF's post_attention_layernorm.
 *
 * The models are modelgen's on a synthetic 260-token vocabulary, with grouped-query
 * attention (4 heads over 2 KV heads, a head wider than dim / heads, as Seed-OSS's 80
 * heads of 128 over a width of 5120). Checked: the hyper-parameters the loader reads;
 * logits against the reference on every attention path (a 40-row prefill on sgemm,
 * sub-batches of 8 on per-row attention, gapped and out-of-order batches, compressed KV
 * chunks) in float and 8-bit weights; that removing the biases or the feed-forward's norm
 * moves the reference far past the tolerance, so the
 * comparison would catch an engine that ignored them; a prefill equals the same tokens
 * decoded one by one; sequences stacked in one step equal each alone, bit for bit; the
 * partitioned long-prompt prefill equals one whole step; files without a part it needs
 * are refused, naming it. Tolerances are test_archs.c's. The pre-tokenizer "seed-coder"
 * gives llama.cpp's ids on the GPT-2 vocabulary of the shared test data.
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

static modelgen_params seed_params(uint32_t type)
{
    return (modelgen_params){.arch = "seed_oss", .dim = 128, .n_layer = 4, .n_head = 4,
                             .n_head_kv = 2, .head_dim = 48, .n_ff = 256, .n_ctx = 512,
                             .type = type, .seed = 23, .n_vocab = N_VOCAB, .n_threads = 1};
}

static const char *gen(const modelgen_params *p, const char *name)
{
    static char path[4][512];
    static int k;
    char *out = path[k++ % 4];
    snprintf(out, sizeof path[0], "%s/seed_oss-%s.gguf", test_tmpdir(), name);
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
    modelgen_params p = seed_params(QTYPE_F32);
    model *m = model_load(gen(&p, "meta"), err);
    CHECK_MSG(m, "%s", err);
    const model_hparams *hp = model_hparams_of(m);
    CHECK_EQ(hp->arch, (int)MODEL_ARCH_SEED_OSS);
    CHECK(!strcmp(model_arch_name(hp->arch), "seed_oss") && !strcmp(hp->file_arch, "seed_oss"));
    CHECK_EQ(hp->rope_style, MODEL_ROPE_HALVES);
    CHECK_EQ(hp->rope_dims, 48);
    CHECK(hp->pre_norms && !hp->post_norms && !hp->parallel);
    CHECK_EQ(hp->norm, MODEL_NORM_RMS);
    CHECK_EQ(hp->ffn_act, MODEL_FFN_SILU);
    CHECK(hp->n_head == 4 && hp->n_head_kv == 2 && hp->head_dim == 48 && hp->n_ff == 256);
    CHECK_NEAR(hp->attn_scale, 1.0 / sqrt(48.0), 1e-7);
    CHECK_NEAR(hp->rope_base, 1e7, 1.0);
    CHECK_NEAR(hp->norm_eps, 1e-6, 1e-12);
    model_layer_tensors lt;
    model_layer_tensors_of(m, 2, &lt);
    CHECK(lt.extras.bq && lt.extras.bk && lt.extras.bv && lt.ffn_norm && !lt.bo);
    model_free(m);
}

static void test_logits_vs_reference(void)
{
    CHECK_EQ(model_check_types(seed_params(QTYPE_F32), "seed_oss", &PLAN, TOL_FLOAT, TOL_QUANT), 0);
}

/* K/V chunks kept in f16 or compressed to 8 and 4 bits, then decodes and a prefill over
 * them, against the reference with exact K/V (the tolerances above). */
static void test_compressed_chunks(void)
{
    static const double tol[3] = {TOL_FLOAT, TOL_KV_INT8, TOL_KV_INT4};
    modelgen_params p = seed_params(QTYPE_F32);
    const char *path = gen(&p, "kv");
    CHECK(path);
    CHECK_EQ(model_check_compressed_file(path, tol), 0);
}

/* Seed-OSS's own parts each move the reference by more than 5 float tolerances when the
 * file is rewritten without them (the feed-forward's norm: post_attention_norm written as
 * zeros gives a feed-forward of zeros). */
static void test_parts_matter(void)
{
    const struct {
        const char *what;
        gguf_edit edit;
    } cases[] = {
        {"q/k/v biases",
         {.drop = {"blk.*.attn_q.bias", "blk.*.attn_k.bias", "blk.*.attn_v.bias"}}},
        {"feed-forward norm", {.zero = {"blk.*.post_attention_norm.weight"}}},
    };
    modelgen_params p = seed_params(QTYPE_F32);
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
    modelgen_params p = seed_params(QTYPE_F32);
    const char *path = gen(&p, "pd");
    CHECK(path);
    double d = model_check_prefill_vs_decode(path);
    printf("  prefill vs decode %.2g\n", d);
    CHECK(d <= TOL_PART);
}

/* Three sequences advanced in one step give each one's logits alone, bit for bit. */
static void test_batched_equals_alone(void)
{
    modelgen_params p = seed_params(QTYPE_F32);
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
    modelgen_params p = seed_params(QTYPE_F32);
    const char *path = gen(&p, "part");
    CHECK(path);
    double d = model_check_partitioned_shapes(path, hist, 1);
    printf("  partitioned vs whole: %.2g\n", d);
    CHECK(d <= TOL_PART);
}

/* A file without a part seed_oss needs is refused, naming it; so is a bias of q alone
 * (biases are all three or none). */
static void test_missing_parts_refused(void)
{
    const struct {
        gguf_edit edit;
        const char *named, *says;
    } cases[] = {
        {{.drop = {"blk.1.post_attention_norm.weight"}}, "blk.1.post_attention_norm.weight",
         "missing"},
        {{.drop = {"blk.0.attn_norm.weight"}}, "blk.0.attn_norm.weight", "missing"},
        {{.drop = {"blk.2.attn_k.bias"}}, "blk.2.attn_k.bias", "missing"},
        {{.drop = {"blk.3.ffn_gate.weight"}}, "blk.3.ffn_gate.weight", "missing"},
        {{.drop_key = "seed_oss.attention.layer_norm_rms_epsilon"},
         "seed_oss.attention.layer_norm_rms_epsilon", "missing"},
    };
    char err[ERR_MAX], dst[512];
    snprintf(dst, sizeof dst, "%s/seed_oss-broken.gguf", test_tmpdir());
    modelgen_params p = seed_params(QTYPE_F16);
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

/* The GPT-2 vocabulary with tokenizer.ggml.pre "seed-coder" (Seed-OSS's own vocabulary is
 * not in the test data): qwen2's split, punctuation without the line breaks after it; the
 * ids are llama.cpp's (2026-04, llama_tokenize with add_special and parse_special) on the
 * same file. */
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
        int32_t ids[24];
    } cases[] = {
        {"Hello, world 1234567!", 12, {15496, 11, 995, 220, 16, 17, 18, 19, 20, 21, 22, 0}},
        {"a\r\nb\n\n\nc  \n d", 11, {64, 201, 198, 65, 628, 198, 66, 220, 220, 198, 288}},
        {"x = f(a);\n\n// done.\n}\n", 13,
         {87, 796, 277, 7, 64, 1776, 628, 1003, 1760, 13, 198, 92, 198}},
    };
    char path[512], err[ERR_MAX];
    snprintf(path, sizeof path, "%s/seed-vocab.gguf", test_tmpdir());
    CHECK_MSG(gguf_copy_with_str(src, path, "tokenizer.ggml.pre", "seed-coder", err) == 0, "%s",
              err);
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
