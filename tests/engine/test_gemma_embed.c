/*
 * EmbeddingGemma ("gemma-embedding", engine/encoder/gemma_embed.c through bert.h) against
 * the double-precision reference (tests/support/ref_gemma_embed.c) on generated models in
 * F32, F16 and Q8_0 with grouped KV heads, a head dimension other than dim / heads, a
 * sliding window shorter than the texts and the dense layers: the embeddings; each part of
 * the architecture (q/k norms, post norms, the sliding mask, the dense layers, the
 * embedding scale) left out of the reference moves it far past the tolerance; texts in a
 * batch embed as they do alone; files without a tensor or key are refused by name; the
 * sliding_window_pattern key is followed.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/encoder/bert.h"
#include "engine/gguf/gguf.h"
#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"
#include "tests/support/gguf_copy.h"
#include "tests/support/ref_gemma_embed.h"
#include "tests/support/test.h"

#define DIM 64
#define N_LAYER 7 /* layer 5 global, the others sliding (the default pattern of 6) */
#define N_VOCAB 260
#define N_CTX 64
#define WINDOW 6 /* a sliding layer's row sees 3 positions on either side */
#define N_TEXT 3

static const int LENS[N_TEXT] = {5, 17, 30};

static const char *gen(const char *tag, uint32_t type, int pooling)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/gemma-embed-%s.gguf", test_tmpdir(), tag);
    modelgen_params p = {.arch = "gemma-embedding", .dim = DIM, .n_layer = N_LAYER,
                         .n_head = 4, .n_head_kv = 2, .head_dim = 32, .n_ff = 96,
                         .n_ctx = N_CTX, .type = type, .seed = 11, .n_vocab = N_VOCAB,
                         .n_threads = 1, .pooling_type = pooling, .sliding_window = WINDOW,
                         .n_dense = 128};
    char err[ERR_MAX];
    if (modelgen_write(&p, path, err) < 0) {
        fprintf(stderr, "modelgen: %s\n", err);
        return NULL;
    }
    return path;
}

/* The texts' tokens back to back (sum of LENS). */
static void tokens_of(int32_t *t)
{
    int row = 0;
    for (int s = 0; s < N_TEXT; s++)
        for (int i = 0; i < LENS[s]; i++, row++)
            t[row] = 3 + (int32_t)((i * 37 + s * 101 + 13) % (N_VOCAB - 3));
}

static double max_diff(const float *a, const double *ref, int n)
{
    double d = 0;
    for (int i = 0; i < n; i++)
        d = fmax(d, fabs(a[i] - ref[i]));
    return d;
}

/* The engine's embeddings of the N_TEXT texts in one batch into out (N_TEXT, DIM). */
static void embed_all(const char *path, float *out)
{
    char err[ERR_MAX];
    bert_model *m = bert_load(path, err);
    CHECK_MSG(m, "%s", err);
    bert_runner *r = bert_runner_new(m, 2, 64, err);
    CHECK_MSG(r, "%s", err);
    int32_t tok[64];
    tokens_of(tok);
    CHECK_MSG(bert_embed(r, N_TEXT, LENS, tok, NULL, bert_hparams_of(m)->pooling, out, err) == 0,
              "%s", err);
    bert_runner_free(r);
    bert_free(m);
}

/* The largest difference of the engine's embeddings from the reference's with skip. */
static double diff_from_ref(const char *path, const float *got, const ref_gemma_embed_skip *skip)
{
    char err[ERR_MAX];
    gguf_file *g = gguf_open(path, err);
    ref_gemma_embed *ref = g ? ref_gemma_embed_load(g) : NULL;
    if (!ref) {
        test_fail(__FILE__, __LINE__, "the reference cannot read %s: %s", path, g ? "" : err);
        gguf_close(g);
        return NAN;
    }
    int32_t tok[64];
    tokens_of(tok);
    double worst = 0, want[DIM];
    int row = 0;
    for (int s = 0; s < N_TEXT; s++) {
        ref_gemma_embed_forward(ref, LENS[s], tok + row, skip, want);
        worst = fmax(worst, max_diff(got + s * DIM, want, DIM));
        row += LENS[s];
    }
    ref_gemma_embed_free(ref);
    gguf_close(g);
    return worst;
}

static void check_type(const char *tag, uint32_t type, double tol)
{
    const char *path = gen(tag, type, 1);
    CHECK(path);
    float out[N_TEXT * DIM];
    embed_all(path, out);
    double d = diff_from_ref(path, out, NULL);
    printf("# %s: largest difference per element of the normalised vectors %.3g\n", tag, d);
    CHECK_MSG(d <= tol, "%s: %g from the reference (> %g)", tag, d, tol);
}

static void test_f32_matches_reference(void)
{
    check_type("f32", QTYPE_F32, 2e-6);
}

static void test_f16_matches_reference(void)
{
    check_type("f16", QTYPE_F16, 2e-6);
}

static void test_q8_0_matches_reference(void)
{
    check_type("q8_0", QTYPE_Q8_0, 2e-2);
}

/* CLS and last-token pooling, as the file says, through the dense layers. */
static void test_pooling(void)
{
    static const int pools[] = {2, 3};
    for (size_t i = 0; i < sizeof pools / sizeof *pools; i++) {
        char tag[32];
        snprintf(tag, sizeof tag, "pool%d", pools[i]);
        const char *path = gen(tag, QTYPE_F32, pools[i]);
        CHECK(path);
        float out[N_TEXT * DIM];
        embed_all(path, out);
        double d = diff_from_ref(path, out, NULL);
        CHECK_MSG(d <= 2e-6, "pooling %d: %g from the reference", pools[i], d);
    }
}

/* Each part left out of the reference moves it far from the engine's result. */
static void test_parts_matter(void)
{
    const char *path = gen("parts", QTYPE_F32, 1);
    CHECK(path);
    float out[N_TEXT * DIM];
    embed_all(path, out);
    static const struct {
        const char *what;
        ref_gemma_embed_skip skip;
    } parts[] = {
        {"q/k norms", {.qk_norm = true}},
        {"post norms", {.post_norms = true}},
        {"sliding mask", {.swa_mask = true}},
        {"dense layers", {.dense = true}},
        {"embedding scale", {.embd_scale = true}},
    };
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++) {
        double d = diff_from_ref(path, out, &parts[i].skip);
        printf("# without the %s: %.3g\n", parts[i].what, d);
        CHECK_MSG(d > 1e-2, "the reference without the %s is only %g away", parts[i].what, d);
    }
}

/* Each text of a batch embeds as it does alone, and the vectors have unit length. */
static void test_batch_equals_alone(void)
{
    const char *path = gen("batch", QTYPE_Q8_0, 1);
    CHECK(path);
    float out[N_TEXT * DIM];
    embed_all(path, out);
    char err[ERR_MAX];
    bert_model *m = bert_load(path, err);
    CHECK_MSG(m, "%s", err);
    bert_runner *r = bert_runner_new(m, 2, 0, err);
    CHECK_MSG(r, "%s", err);
    int32_t tok[64];
    tokens_of(tok);
    int row = 0;
    for (int s = 0; s < N_TEXT; s++) {
        float alone[DIM];
        CHECK_MSG(bert_embed(r, 1, &LENS[s], tok + row, NULL, BERT_POOL_MEAN, alone, err) == 0,
                  "%s", err);
        double ss = 0, d = 0;
        for (int i = 0; i < DIM; i++) {
            ss += (double)alone[i] * alone[i];
            d = fmax(d, fabs(alone[i] - out[s * DIM + i]));
        }
        CHECK_NEAR(ss, 1.0, 1e-5);
        CHECK_MSG(d <= 1e-6, "text %d: %g between alone and in a batch", s, d);
        row += LENS[s];
    }
    bert_runner_free(r);
    bert_free(m);
}

static void test_metadata_and_inputs(void)
{
    const char *path = gen("meta", QTYPE_F32, 1);
    CHECK(path);
    char err[ERR_MAX];
    gguf_file *g = gguf_open(path, err);
    CHECK_MSG(g, "%s", err);
    CHECK(bert_is_encoder(g));
    bert_model *m = bert_from_gguf(g, err);
    CHECK_MSG(m, "%s", err);
    const bert_hparams *hp = bert_hparams_of(m);
    CHECK_EQ(hp->arch, BERT_ARCH_GEMMA_EMBED);
    CHECK(hp->dim == DIM && hp->n_layer == N_LAYER && hp->n_head == 4 && hp->head_dim == 32 &&
          hp->n_ff == 96 && hp->n_pos == N_CTX && hp->n_types == 1 && hp->n_vocab == N_VOCAB &&
          hp->pooling == BERT_POOL_MEAN && hp->n_cls_out == 0);
    CHECK_NEAR(hp->rope_base, 1e6, 1);
    bert_runner *r = bert_runner_new(m, 1, 32, err);
    CHECK_MSG(r, "%s", err);
    int32_t tok[40] = {5, N_VOCAB, 7};
    int32_t types[3] = {0, 1, 0};
    float out[DIM], x[40 * DIM];
    int len = 3, big = N_CTX + 1;
    CHECK(bert_embed(r, 1, &len, tok, NULL, BERT_POOL_MEAN, out, err) < 0);
    CHECK_MSG(strstr(err, "out of range"), "%s", err);
    tok[1] = 6;
    CHECK(bert_input(m, 1, &len, tok, types, x, err) < 0);
    CHECK_MSG(strstr(err, "type"), "%s", err);
    CHECK(bert_input(m, 1, &big, tok, NULL, x, err) < 0);
    CHECK(bert_embed(r, 1, &len, tok, NULL, BERT_POOL_NONE, out, err) < 0);
    CHECK(bert_head(r, 1, x, out, err) < 0);
    CHECK(bert_layer(r, N_LAYER, 1, &len, x, err) < 0);
    bert_runner_free(r);
    bert_free(m);
    gguf_close(g);
}

/* A file without one of its tensors or keys is refused with an error that names it. */
static void test_missing_refused(void)
{
    const char *src = gen("whole", QTYPE_F32, 1);
    CHECK(src);
    char srcp[512], dst[512], err[ERR_MAX];
    snprintf(srcp, sizeof srcp, "%s", src);
    snprintf(dst, sizeof dst, "%s/gemma-embed-cut.gguf", test_tmpdir());
    static const struct {
        gguf_edit e;
        const char *says;
    } cases[] = {
        {{.drop = {"blk.*.attn_q_norm.weight"}}, "blk.0.attn_q_norm.weight"},
        {{.drop = {"blk.*.attn_k_norm.weight"}}, "blk.0.attn_k_norm.weight"},
        {{.drop = {"blk.*.post_attention_norm.weight"}}, "blk.0.post_attention_norm.weight"},
        {{.drop = {"blk.*.post_ffw_norm.weight"}}, "blk.0.post_ffw_norm.weight"},
        {{.drop = {"blk.*.ffn_gate.weight"}}, "blk.0.ffn_gate.weight"},
        {{.drop = {"output_norm.weight"}}, "output_norm.weight"},
        {{.drop = {"token_embd.weight"}}, "token_embd.weight"},
        {{.drop = {"dense_3.weight"}}, "single dense layer"},
        {{.drop_key = "gemma-embedding.attention.sliding_window"},
         "gemma-embedding.attention.sliding_window"},
        {{.drop_key = "gemma-embedding.attention.layer_norm_rms_epsilon"},
         "gemma-embedding.attention.layer_norm_rms_epsilon"},
        {{.drop_key = "gemma-embedding.dense_2_feat_out"}, "gemma-embedding.dense_2_feat_out"},
        {{.drop_key = "gemma-embedding.context_length"}, "gemma-embedding.context_length"},
        {{.num_key = "gemma-embedding.dense_3_feat_in", .num_value = 96}, "dense_3_feat_in"},
        {{.num_key = "gemma-embedding.attention.head_count_kv", .num_value = 3}, "head_count_kv"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        CHECK_MSG(gguf_copy_edited(srcp, dst, &cases[i].e, err) == 0, "%s", err);
        bert_model *m = bert_load(dst, err);
        CHECK_MSG(!m, "case %zu loaded", i);
        bert_free(m);
        CHECK_MSG(strstr(err, cases[i].says), "case %zu: '%s' does not name %s", i, err,
                  cases[i].says);
    }
    /* without both dense layers and their keys the file is a plain embedder */
    gguf_edit plain = {.drop = {"dense_2.weight", "dense_3.weight"}};
    CHECK_MSG(gguf_copy_edited(srcp, dst, &plain, err) == 0, "%s", err);
    float out[N_TEXT * DIM];
    embed_all(dst, out);
    ref_gemma_embed_skip no_dense = {.dense = true};
    CHECK(diff_from_ref(srcp, out, &no_dense) <= 2e-6);
}

/* attention.sliding_window_pattern (llama.cpp's 6 when absent) picks the global layers:
 * with a period of 2 the engine follows the reference, which the file without the key is
 * far from. */
static void test_pattern_key(void)
{
    const char *src = gen("pattern", QTYPE_F32, 1);
    CHECK(src);
    char srcp[512], dst[512], err[ERR_MAX];
    snprintf(srcp, sizeof srcp, "%s", src);
    snprintf(dst, sizeof dst, "%s/gemma-embed-period2.gguf", test_tmpdir());
    gguf_edit e = {.num_key = "gemma-embedding.attention.sliding_window_pattern",
                   .num_value = 2};
    CHECK_MSG(gguf_copy_edited(srcp, dst, &e, err) == 0, "%s", err);
    float out[N_TEXT * DIM];
    embed_all(dst, out);
    double d = diff_from_ref(dst, out, NULL), d6 = diff_from_ref(srcp, out, NULL);
    CHECK_MSG(d <= 2e-6 && d6 > 1e-2, "period 2: %g from its reference, %g from period 6's", d,
              d6);
}

int main(void)
{
    RUN(test_f32_matches_reference);
    RUN(test_f16_matches_reference);
    RUN(test_q8_0_matches_reference);
    RUN(test_pooling);
    RUN(test_parts_matter);
    RUN(test_batch_equals_alone);
    RUN(test_metadata_and_inputs);
    RUN(test_missing_refused);
    RUN(test_pattern_key);
    return test_finish();
}
