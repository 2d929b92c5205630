/*
 * starcoder2 (StarCoder2 3B/7B/15B in llama.cpp's layout) in the decoder engine, against
 * the double-precision reference (tests/support/ref_forward.c, from Hugging Face's
 * modeling_starcoder2): LayerNorms with biases, q/k/v/o with biases, grouped-query
 * attention, NEOX RoPE over the whole head, and the ungated feed-forward
 * ffn_down(gelu_tanh(ffn_up x + b)) + b.
 *
 * Models are modelgen's on a synthetic 260-token vocabulary (4 heads on 2 KV heads). The
 * checks: the hyper-parameters the loader reads; ops_gelu_tanh_bias against the formula;
 * logits against the reference on every attention path (a 40-row prefill on sgemm,
 * sub-batches of 8 on per-row attention, gapped and out-of-order batches) in float and
 * 8-bit weights, with the output matrix of its own and tied to the embedding; decodes on
 * compressed KV chunks; mutations of the file that take away what starcoder2 adds (the
 * biases of q/k/v/o, of the feed-forward, of the LayerNorms; the feed-forward itself)
 * move the reference past the tolerance, so the comparison would catch an engine that
 * ignored them; a prefill equals the same tokens decoded one by one; sequences stacked in
 * one step equal each alone, bit for bit; the partitioned long-prompt prefill equals one
 * whole step; a file without a tensor or key it needs is refused, naming it. Last, a
 * StarCoder2-like vocabulary ("<fim_prefix>", "<fim_suffix>", "<fim_middle>" as control
 * tokens, no key naming them) has the roles /infill needs. Tolerances are test_model.c's.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/infill.h"
#include "engine/gguf/gguf.h"
#include "engine/gguf/modelgen.h"
#include "engine/model/model.h"
#include "engine/model/ops.h"
#include "engine/quant/quant.h"
#include "engine/tok/tokenizer.h"
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

static modelgen_params sc2_params(uint32_t type)
{
    return (modelgen_params){.arch = "starcoder2", .dim = 128, .n_layer = 4, .n_head = 4,
                             .n_head_kv = 2, .n_ff = 512, .n_ctx = 512, .type = type,
                             .seed = 23, .n_vocab = N_VOCAB, .n_threads = 1};
}

static const char *gen(const modelgen_params *p, const char *name)
{
    static char path[4][512];
    static int k;
    char *out = path[k++ % 4];
    snprintf(out, sizeof path[0], "%s/starcoder2-%s.gguf", test_tmpdir(), name);
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

/* ---- hyper-parameters and the activation ---- */

static void test_metadata(void)
{
    char err[ERR_MAX] = "modelgen";
    modelgen_params p = sc2_params(QTYPE_F32);
    const char *path = gen(&p, "meta");
    model *m = path ? model_load(path, err) : NULL;
    CHECK_MSG(m, "%s", err);
    const model_hparams *hp = model_hparams_of(m);
    CHECK_EQ(hp->arch, (int)MODEL_ARCH_STARCODER2);
    CHECK_EQ(hp->norm, MODEL_NORM_LAYER);
    CHECK_EQ(hp->ffn_act, MODEL_FFN_GELU_TANH_UNGATED);
    CHECK_EQ(hp->rope_style, MODEL_ROPE_HALVES);
    CHECK_EQ(hp->rope_dims, 32);
    CHECK(hp->n_head == 4 && hp->n_head_kv == 2 && hp->n_ff == 512);
    CHECK(hp->pre_norms && !hp->post_norms && hp->swa_window == 0 && hp->sliding_window == 0);
    CHECK_NEAR(hp->norm_eps, 1e-5, 1e-12);
    CHECK_NEAR(hp->rope_base, 1e6, 1e-3);
    CHECK_EQ(model_layer_window(hp, 0), 0);
    model_free(m);
}

/* ops_gelu_tanh_bias (AVX2 lanes and the scalar tail, 37 values) against
 * 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3))) in double, v = x + b, over -8..8. */
static void test_gelu_tanh_bias(void)
{
    enum { N = 37 };
    float x[N], b[N];
    for (int i = 0; i < N; i++)
        x[i] = -8.0f + 16.0f * (float)i / (N - 1), b[i] = 0.03f * (float)(i % 5) - 0.06f;
    float y[N];
    memcpy(y, x, sizeof y);
    ops_gelu_tanh_bias(y, b, N);
    double worst = 0;
    for (int i = 0; i < N; i++) {
        double v = (double)x[i] + b[i];
        double want = 0.5 * v * (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
        worst = fmax(worst, fabs(y[i] - want) / fmax(fabs(want), 1e-3));
    }
    printf("  max relative error %.2g\n", worst);
    CHECK(worst < 2e-6);
}

/* ---- the forward against the reference ---- */

static void test_logits_vs_reference(void)
{
    const uint32_t types[] = {QTYPE_F32, QTYPE_F16, QTYPE_Q8_0};
    for (int tie = 0; tie < 2; tie++)
        for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
            modelgen_params p = sc2_params(types[t]);
            p.tie_output = tie;
            const char *path = gen(&p, "ref");
            CHECK(path);
            bool f16_rounds = types[t] == QTYPE_F16 && quant_f16_rounds_activation(p.dim);
            double tol = types[t] == QTYPE_F32 || (types[t] == QTYPE_F16 && !f16_rounds)
                             ? TOL_FLOAT : TOL_QUANT;
            /* 512: the 40-row prefill takes sgemm attention; 8: dot kernels and per-row
             * attention in sub-batches */
            double d1 = model_check_file(path, 512, 2, &PLAN);
            double d2 = model_check_file(path, 8, 1, &PLAN);
            printf("  %s%s: max |logit diff| %.4g (sgemm) %.4g (per row)\n",
                   quant_traits_of(types[t])->name, tie ? " tied" : "", d1, d2);
            CHECK_MSG(d1 <= tol && d2 <= tol, "%s%s: %g %g > %g", quant_traits_of(types[t])->name,
                      tie ? " tied" : "", d1, d2, tol);
        }
}

/* Decodes on the prefix's chunks compressed to 8 and 4 bits (and left f16) against the
 * reference's exact KV. */
static void test_compressed_kv(void)
{
    char err[ERR_MAX];
    modelgen_params p = sc2_params(QTYPE_F32);
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

/* The reference of each mutated file (the same weights with one of starcoder2's parts
 * zeroed) is more than 5 float tolerances from the original's: a forward that skipped
 * that part would fail the comparison above. */
static void test_parts_matter(void)
{
    static const struct {
        const char *what;
        gguf_edit edit; /* the part's tensors written as zeros */
    } muts[] = {
        {"q/k/v biases",
         {.zero = {"blk.*.attn_q.bias", "blk.*.attn_k.bias", "blk.*.attn_v.bias"}}},
        {"attention output's bias", {.zero = {"blk.*.attn_output.bias"}}},
        {"feed-forward's biases", {.zero = {"blk.*.ffn_up.bias", "blk.*.ffn_down.bias"}}},
        {"LayerNorm biases",
         {.zero = {"blk.*.attn_norm.bias", "blk.*.ffn_norm.bias", "output_norm.bias"}}},
        {"ungated GELU feed-forward", {.zero = {"blk.*.ffn_down.weight", "blk.*.ffn_down.bias"}}},
    };
    modelgen_params p = sc2_params(QTYPE_F32);
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
    modelgen_params p = sc2_params(QTYPE_F32);
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
    modelgen_params p = sc2_params(QTYPE_F32);
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
    modelgen_params p = sc2_params(QTYPE_F32);
    const char *path = gen(&p, "part");
    CHECK(path);
    double d = model_check_partitioned_shapes(path, hist, 2);
    CHECK_MSG(d <= TOL_PART, "%g", d);
    printf("  partitioned vs whole: %.2g\n", d);
}

/* ---- refusals ---- */

/* A file without a tensor starcoder2 needs (its biases included, as llama.cpp requires
 * them) or without its LayerNorm epsilon is refused, naming it. */
static void test_missing_parts_refused(void)
{
    static const char *const needed[] = {
        "blk.1.attn_q.bias",   "blk.2.attn_v.bias",    "blk.0.attn_output.bias",
        "blk.3.ffn_up.bias",   "blk.1.ffn_down.bias",  "blk.2.ffn_up.weight",
        "blk.0.attn_norm.bias", "blk.3.ffn_norm.bias", "output_norm.bias",
    };
    char err[ERR_MAX], dst[512];
    snprintf(dst, sizeof dst, "%s/broken.gguf", test_tmpdir());
    modelgen_params p = sc2_params(QTYPE_F16);
    const char *src = gen(&p, "whole");
    CHECK(src);
    for (size_t i = 0; i < sizeof needed / sizeof *needed; i++) {
        gguf_edit e = {.drop = {needed[i]}};
        CHECK(gguf_copy_edited(src, dst, &e, err) == 0);
        err[0] = '\0';
        CHECK(model_load(dst, err) == NULL);
        printf("  refused: %s\n", err);
        CHECK_MSG(strstr(err, needed[i]) && strstr(err, "missing"), "%s", err);
    }
    gguf_edit e = {.drop_key = "starcoder2.attention.layer_norm_epsilon"};
    CHECK(gguf_copy_edited(src, dst, &e, err) == 0);
    err[0] = '\0';
    CHECK(model_load(dst, err) == NULL);
    printf("  refused: %s\n", err);
    CHECK_MSG(strstr(err, "starcoder2.attention.layer_norm_epsilon"), "%s", err);
}

/* ---- fill-in-the-middle ---- */

/* A byte-level BPE vocabulary as StarCoder2's begins ("<|endoftext|>", then its FIM and
 * repository tokens, all control tokens; no key names them), with "a", "b", "ab" and a
 * few more, written into a starcoder2 model: the tokenizer the daemon loads from it has
 * FIM_PRE, FIM_SUF and FIM_MID, infill_supported says so, the bare infill prompt is
 * FIM_PRE prefix FIM_SUF suffix FIM_MID (no BOS: StarCoder2's tokenizer adds none), and
 * "<fim_pad>" and "<|endoftext|>" end generation. */
static void test_fim_vocabulary(void)
{
    enum { EOT, PRE, MID, SUF, PAD, REPO, FILE_SEP, A, B, AB, SPACE, N_TOK };
    static const char *const texts[N_TOK] = {
        "<|endoftext|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>",
        "<repo_name>",   "<file_sep>",   "a",            "b",            "ab",
        "\xc4\xa0", /* byte-level BPE's space */
    };
    float scores[N_TOK] = {0};
    int32_t types[N_TOK];
    for (int i = 0; i < N_TOK; i++)
        types[i] = i < A ? 3 : 1;
    static const char *const merges[] = {"a b"};
    char vpath[512], err[ERR_MAX] = "";
    snprintf(vpath, sizeof vpath, "%s/starcoder2-vocab.gguf", test_tmpdir());
    gguf_writer *w = gguf_writer_new();
    bool ok = w && gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2") == 0 &&
              gguf_writer_set_str(w, "tokenizer.ggml.pre", "starcoder") == 0 &&
              gguf_writer_set_str_arr(w, "tokenizer.ggml.tokens", texts, N_TOK) == 0 &&
              gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_FLOAT32, scores, N_TOK) == 0 &&
              gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_INT32, types, N_TOK) == 0 &&
              gguf_writer_set_str_arr(w, "tokenizer.ggml.merges", merges, 1) == 0 &&
              gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", EOT) == 0 &&
              gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", EOT) == 0 &&
              gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false) == 0 &&
              gguf_writer_write(w, vpath, err) == 0;
    gguf_writer_free(w);
    CHECK_MSG(ok, "%s", err);
    gguf_file *vg = gguf_open(vpath, err);
    CHECK_MSG(vg, "%s", err);
    modelgen_params p = sc2_params(QTYPE_F32);
    p.vocab = vg;
    const char *path = gen(&p, "fim");
    gguf_close(vg);
    CHECK(path);

    model *m = model_load(path, err);
    CHECK_MSG(m, "%s", err);
    tokenizer *tok = NULL;
    CHECK_MSG(tok_load(model_gguf(m), &tok, err) == 0, "%s", err);
    CHECK_EQ(model_hparams_of(m)->n_vocab, N_TOK);
    CHECK_EQ(tok_special(tok, TOK_SPECIAL_FIM_PRE), PRE);
    CHECK_EQ(tok_special(tok, TOK_SPECIAL_FIM_SUF), SUF);
    CHECK_EQ(tok_special(tok, TOK_SPECIAL_FIM_MID), MID);
    CHECK_EQ(tok_special(tok, TOK_SPECIAL_FIM_PAD), PAD);
    char msg[256] = "";
    CHECK_MSG(infill_supported(tok, msg, sizeof msg), "%s", msg);
    CHECK(tok_is_eog(tok, PAD) && tok_is_eog(tok, EOT));
    CHECK(!tok_is_eog(tok, PRE) && !tok_is_eog(tok, MID));
    int32_t *ids = NULL;
    int n = 0;
    CHECK_MSG(infill_bare_tokens(tok, "ab", "ba", &ids, &n, err) == 0, "%s", err);
    const int32_t want[] = {PRE, AB, SUF, B, A, MID};
    CHECK_MSG(n == 6 && ids && !memcmp(ids, want, sizeof want), "%d tokens", n);
    free(ids);
    tok_free(tok);
    model_free(m);
}

int main(void)
{
    RUN(test_metadata);
    RUN(test_gelu_tanh_bias);
    RUN(test_logits_vs_reference);
    RUN(test_compressed_kv);
    RUN(test_parts_matter);
    RUN(test_prefill_equals_decode);
    RUN(test_batched_equals_alone);
    RUN(test_partitioned_prefill);
    RUN(test_missing_parts_refused);
    RUN(test_fim_vocabulary);
    return test_finish();
}
