/*
 * Architectures under other names (model.c's model_arch_aliases) and the optional biases
 * llama.cpp's loader takes for every architecture:
 * - a qwen2, qwen3 and qwen3moe file renamed qwen2vl, qwen3vl and qwen3vlmoe (the language
 *   model of a vision conversion), with M-RoPE sections as Qwen2-VL's and Qwen3-VL's have
 *   them, and a llama file renamed internlm2, ernie4_5 and xverse, load as their
 *   architecture under the file's name and give the plain file's logits bit for bit (a
 *   text token's equal positions make M-RoPE plain RoPE; the plain architectures are
 *   checked against the reference in test_model.c and test_moe.c). Sections missing,
 *   negative or wider than the rotated dimensions are refused, naming the key;
 * - a llama file given q/k/v and output biases computes them as the reference does (and
 *   they move the logits); a partial q/k/v set and a gated feed-forward's bias are
 *   refused, naming the tensor.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf/modelgen.h"
#include "engine/kv/kv.h"
#include "engine/model/model.h"
#include "engine/quant/quant.h"
#include "tests/support/gguf_copy.h"
#include "tests/support/model_check.h"
#include "tests/support/test.h"

#define N_VOCAB 260
#define N_TOKENS 40

static const struct {
    const char *text_arch, *vision_arch;
    enum model_arch arch;
    int32_t sections[4]; /* Qwen2-VL's [16, 24, 24] and Qwen3-VL's [24, 20, 20], halved;
                            none for the llama family */
} CASES[] = {
    {"qwen2", "qwen2vl", MODEL_ARCH_QWEN2, {8, 12, 12, 0}},
    {"qwen3", "qwen3vl", MODEL_ARCH_QWEN3, {12, 10, 10, 0}},
    {"qwen3moe", "qwen3vlmoe", MODEL_ARCH_QWEN3MOE, {12, 10, 10, 0}},
    {"llama", "internlm2", MODEL_ARCH_LLAMA, {0}},
    {"llama", "ernie4_5", MODEL_ARCH_LLAMA, {0}},
    {"llama", "xverse", MODEL_ARCH_LLAMA, {0}},
};
#define N_CASES 6
#define N_VISION 3

/* The plain model (head dimension 64, all of it rotated), written once per case. */
static const char *plain(int c)
{
    static char path[N_CASES][512];
    if (path[c][0])
        return path[c];
    /* n_head_kv = n_head for the llama family: q, k and v biases of one length (dim) */
    bool llama = CASES[c].arch == MODEL_ARCH_LLAMA;
    bool moe = CASES[c].arch == MODEL_ARCH_QWEN3MOE;
    modelgen_params p = {.arch = CASES[c].text_arch, .dim = 128, .n_layer = 2, .n_head = 4,
                         .n_head_kv = llama ? 4 : 2, .head_dim = llama ? 32 : 64,
                         .n_ff = 256, .n_ctx = 512,
                         .type = QTYPE_F16, .seed = 5, .n_vocab = N_VOCAB, .n_threads = 1,
                         .n_expert = moe ? 4 : 0, .n_expert_used = moe ? 2 : 0};
    snprintf(path[c], sizeof path[c], "%s/%s-%d.gguf", test_tmpdir(), CASES[c].text_arch, c);
    char err[ERR_MAX];
    if (modelgen_write(&p, path[c], err) < 0) {
        fprintf(stderr, "modelgen: %s\n", err);
        path[c][0] = '\0';
        return NULL;
    }
    return path[c];
}

/* The plain file renamed to the vision architecture, its sections key set to n of s. */
static const char *renamed(int c, const int32_t *s, int n, const char *name)
{
    static char path[512];
    char key[96], err[ERR_MAX];
    snprintf(path, sizeof path, "%s/%s-%s.gguf", test_tmpdir(), CASES[c].vision_arch, name);
    snprintf(key, sizeof key, "%s.rope.dimension_sections", CASES[c].vision_arch);
    gguf_edit e = {.rename = CASES[c].vision_arch, .ints_key = n ? key : NULL, .ints = s,
                   .n_ints = n};
    const char *src = plain(c);
    if (!src || gguf_copy_edited(src, path, &e, err) < 0) {
        fprintf(stderr, "copy: %s\n", err);
        return NULL;
    }
    return path;
}

/* Logits of N_TOKENS tokens in one batch; -1 on an error (printed). */
static int logits_of(const char *path, float *out, model_hparams *hp)
{
    char err[ERR_MAX];
    model *m = model_load(path, err);
    if (!m) {
        fprintf(stderr, "%s: %s\n", path, err);
        return -1;
    }
    *hp = *model_hparams_of(m);
    model_runner *r = model_runner_new(m, 2, 0, 0, err);
    kv_pool *pool = r ? kv_pool_new(model_kv_shape(m), 0, err) : NULL;
    int32_t tok[N_TOKENS], pos[N_TOKENS];
    for (int i = 0; i < N_TOKENS; i++)
        tok[i] = (i * 37 + 11) % N_VOCAB, pos[i] = i;
    int rc = pool ? model_check_run(r, pool, N_VOCAB, N_TOKENS, tok, pos, false, out) : -1;
    if (!pool)
        fprintf(stderr, "%s: %s\n", path, err);
    kv_pool_free(pool);
    model_runner_free(r);
    model_free(m);
    return rc;
}

static void test_text_model_equals_plain(void)
{
    float *a = malloc(sizeof(float) * N_TOKENS * N_VOCAB);
    float *b = malloc(sizeof(float) * N_TOKENS * N_VOCAB);
    for (int c = 0; c < N_CASES; c++) {
        const char *vl = renamed(c, CASES[c].sections, c < N_VISION ? 4 : 0, "ok");
        CHECK(vl);
        model_hparams hp_plain, hp_vl;
        CHECK(logits_of(plain(c), a, &hp_plain) == 0);
        CHECK(logits_of(vl, b, &hp_vl) == 0);
        CHECK_EQ(hp_vl.arch, CASES[c].arch);
        CHECK_MSG(!strcmp(hp_vl.file_arch, CASES[c].vision_arch), "%s", hp_vl.file_arch);
        CHECK(!strcmp(hp_plain.file_arch, CASES[c].text_arch));
        CHECK_EQ(model_arch_from_name(CASES[c].vision_arch, strlen(CASES[c].vision_arch)),
                 (int)CASES[c].arch);
        double d = model_check_max_rel(a, b, (size_t)N_TOKENS * N_VOCAB);
        printf("  %s vs %s: %.2g\n", CASES[c].vision_arch, CASES[c].text_arch, d);
        CHECK(d == 0);
    }
    free(a);
    free(b);
}

static void expect_refused(int c, const int32_t *s, int n, const char *name, const char *needle)
{
    const char *path = renamed(c, s, n, name);
    CHECK(path);
    char err[ERR_MAX] = "";
    model *m = model_load(path, err);
    model_free(m);
    CHECK_MSG(!m, "%s: loaded", name);
    CHECK_MSG(strstr(err, needle), "%s: \"%s\" lacks \"%s\"", name, err, needle);
}

static void test_bad_sections_refused(void)
{
    for (int c = 0; c < N_VISION; c++) {
        expect_refused(c, NULL, 0, "none", "rope.dimension_sections: missing");
        static const int32_t negative[4] = {16, -1, 8, 0}, wide[4] = {16, 12, 5, 0};
        expect_refused(c, negative, 4, "negative", "is negative");
        expect_refused(c, wide, 4, "wide", "more than rope.dimension_count");
    }
}

/* The llama file with e's tensors added, written to name; NULL on an error (printed). */
static const char *edited(const char *src, const gguf_edit *e, const char *name)
{
    static char path[4][512];
    static int k;
    char *out = path[k++ % 4], err[ERR_MAX];
    snprintf(out, 512, "%s/%s.gguf", test_tmpdir(), name);
    if (!src || gguf_copy_edited(src, out, e, err) < 0) {
        fprintf(stderr, "copy: %s\n", err);
        return NULL;
    }
    return out;
}

static const model_check_plan PLAN = {.n_prefill = 24, .n_total = 30, .gap_b = 20, .gap_c = 10};

/* Biases of dim elements: copies of each layer's attn_norm weight (about 1), as big as
 * llama.cpp's loader would read from a model trained with attention_bias. */
static void test_llama_biases(void)
{
    const char *src = plain(3); /* llama, f16 */
    gguf_edit qk = {.copy_from = {"blk.*.attn_norm.weight", "blk.*.attn_norm.weight"},
                    .copy_to = {"blk.*.attn_q.bias", "blk.*.attn_k.bias"}};
    const char *partial = edited(src, &qk, "llama-qk-bias");
    gguf_edit vo = {.copy_from = {"blk.*.attn_norm.weight", "blk.*.attn_norm.weight"},
                    .copy_to = {"blk.*.attn_v.bias", "blk.*.attn_output.bias"}};
    const char *biased = edited(partial, &vo, "llama-qkvo-bias");
    CHECK(partial && biased);
    double d_plain = model_check_file(src, 512, 2, &PLAN);
    double d_sgemm = model_check_file(biased, 512, 2, &PLAN);
    double d_rows = model_check_file(biased, 8, 1, &PLAN);
    printf("  llama with q/k/v/o biases: max |logit diff| %.3g (sgemm) %.3g (per row); "
           "without: %.3g\n", d_sgemm, d_rows, d_plain);
    CHECK(d_sgemm < 0.2 && d_rows < 0.2); /* F16 weights: test_model.c's TOL_QUANT */
    float *a = malloc(sizeof(float) * N_TOKENS * N_VOCAB);
    float *b = malloc(sizeof(float) * N_TOKENS * N_VOCAB);
    model_hparams hp;
    CHECK(logits_of(src, a, &hp) == 0 && logits_of(biased, b, &hp) == 0);
    double moved = model_check_max_rel(a, b, (size_t)N_TOKENS * N_VOCAB);
    printf("  the biases move the logits by %.3g of the largest\n", moved);
    CHECK(moved > 0.05);
    free(a);
    free(b);

    char err[ERR_MAX] = "";
    model *m = model_load(partial, err);
    model_free(m);
    CHECK_MSG(!m && strstr(err, "attn_v.bias"), "q and k biases without v: %s", err);
    gguf_edit ffn = {.copy_from = {"blk.*.ffn_norm.weight"}, .copy_to = {"blk.*.ffn_down.bias"}};
    const char *ffn_biased = edited(src, &ffn, "llama-ffn-bias");
    CHECK(ffn_biased);
    m = model_load(ffn_biased, err);
    model_free(m);
    CHECK_MSG(!m && strstr(err, "ffn_down.bias") && strstr(err, "not supported"), "%s", err);
}

int main(void)
{
    RUN(test_text_model_equals_plain);
    RUN(test_bad_sections_refused);
    RUN(test_llama_biases);
    return test_finish();
}
