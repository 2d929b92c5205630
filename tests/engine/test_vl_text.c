/*
 * The language model of a vision model's conversion (model.c's model_arch_vision_text):
 * a qwen2, qwen3 and qwen3moe file renamed qwen2vl, qwen3vl and qwen3vlmoe, with M-RoPE
 * sections as Qwen2-VL's and Qwen3-VL's have them, loads as its text architecture under
 * the file's name and gives the plain file's logits bit for bit (a text token's equal
 * positions make M-RoPE plain RoPE; the plain architectures are checked against the
 * reference in test_model.c and test_moe.c). Sections missing, negative or wider than
 * the rotated dimensions are refused, naming the key.
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
    int32_t sections[4]; /* Qwen2-VL's [16, 24, 24] and Qwen3-VL's [24, 20, 20], halved */
} CASES[] = {
    {"qwen2", "qwen2vl", MODEL_ARCH_QWEN2, {8, 12, 12, 0}},
    {"qwen3", "qwen3vl", MODEL_ARCH_QWEN3, {12, 10, 10, 0}},
    {"qwen3moe", "qwen3vlmoe", MODEL_ARCH_QWEN3MOE, {12, 10, 10, 0}},
};
#define N_CASES 3

/* The plain model (head dimension 64, all of it rotated), written once per case. */
static const char *plain(int c)
{
    static char path[N_CASES][512];
    if (path[c][0])
        return path[c];
    bool moe = CASES[c].arch == MODEL_ARCH_QWEN3MOE;
    modelgen_params p = {.arch = CASES[c].text_arch, .dim = 128, .n_layer = 2, .n_head = 4,
                         .n_head_kv = 2, .head_dim = 64, .n_ff = 256, .n_ctx = 512,
                         .type = QTYPE_F16, .seed = 5, .n_vocab = N_VOCAB, .n_threads = 1,
                         .n_expert = moe ? 4 : 0, .n_expert_used = moe ? 2 : 0};
    snprintf(path[c], sizeof path[c], "%s/%s.gguf", test_tmpdir(), CASES[c].text_arch);
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
    gguf_edit e = {.rename = CASES[c].vision_arch, .ints_key = s ? key : NULL, .ints = s,
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
        const char *vl = renamed(c, CASES[c].sections, 4, "ok");
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
    for (int c = 0; c < N_CASES; c++) {
        expect_refused(c, NULL, 0, "none", "rope.dimension_sections: missing");
        static const int32_t negative[4] = {16, -1, 8, 0}, wide[4] = {16, 12, 5, 0};
        expect_refused(c, negative, 4, "negative", "is negative");
        expect_refused(c, wide, 4, "wide", "more than rope.dimension_count");
    }
}

int main(void)
{
    RUN(test_text_model_equals_plain);
    RUN(test_bad_sections_refused);
    return test_finish();
}
