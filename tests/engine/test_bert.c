/*
 * The bert and nomic-bert encoders (engine/encoder/bert.c) against the double-precision
 * reference (tests/support/ref_bert.c) on generated models of every matrix type: hidden
 * rows of every layer, pooled embeddings, the cross-encoder head, independence from the
 * other sequences of a batch, nomic-bert's optional biases, and clear errors for bad
 * inputs and bad files. With the shared bge vocabulary: WordPiece text to an embedding.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/encoder/bert.h"
#include "engine/gguf/gguf.h"
#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"
#include "engine/tok/tokenizer.h"
#include "tests/support/ref_bert.h"
#include "tests/support/test.h"

#define DIM 64
#define N_LAYER 2
#define N_VOCAB 260
#define N_CTX 64

static const char *gen_arch(const char *arch, const char *tag, uint32_t type, int pooling,
                            const gguf_file *vocab)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s-%s.gguf", test_tmpdir(), arch, tag);
    modelgen_params p = {.arch = arch, .dim = DIM, .n_layer = N_LAYER, .n_head = 4,
                         .n_head_kv = 4, .n_ff = 128, .n_ctx = N_CTX, .type = type, .seed = 5,
                         .n_vocab = N_VOCAB, .vocab = vocab, .n_threads = 1,
                         .pooling_type = pooling};
    char err[ERR_MAX];
    if (modelgen_write(&p, path, err) < 0) {
        fprintf(stderr, "modelgen: %s\n", err);
        return NULL;
    }
    return path;
}

static const char *gen(const char *tag, uint32_t type, int pooling, const gguf_file *vocab)
{
    return gen_arch("bert", tag, type, pooling, vocab);
}

static void tokens_of(int32_t *t, int n, int seed)
{
    for (int i = 0; i < n; i++)
        t[i] = 3 + (int32_t)((i * 37 + seed * 101) % (N_VOCAB - 3));
}

/* Largest |a - ref| over n values, relative to the reference's largest magnitude. */
static double rel_err(const float *a, const double *ref, size_t n)
{
    double d = 0, mx = 1e-12;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs(a[i] - ref[i]));
        mx = fmax(mx, fabs(ref[i]));
    }
    return d / mx;
}

/* The reference's mean-pooled, L2-normalised last layer of n tokens into want (DIM). */
static void ref_mean(const ref_bert *ref, int n, const int32_t *tok, double *want)
{
    double *h = malloc(sizeof(double) * (N_LAYER + 1) * n * DIM), ss = 0;
    ref_bert_forward(ref, n, tok, NULL, h);
    for (int i = 0; i < DIM; i++) {
        want[i] = 0;
        for (int t = 0; t < n; t++)
            want[i] += h[((size_t)N_LAYER * n + t) * DIM + i] / n;
        ss += want[i] * want[i];
    }
    for (int i = 0; i < DIM; i++)
        want[i] /= sqrt(ss);
    free(h);
}

/* Two stacked sequences (the second with segment B types) through every layer of the
 * model at path, each layer's rows against the reference; bert's head on the [CLS] rows
 * when the file has one. */
static void check_file(const char *path, const char *tag, double tol)
{
    char err[ERR_MAX];
    gguf_file *g = gguf_open(path, err);
    CHECK_MSG(g, "%s", err);
    bert_model *m = bert_from_gguf(g, err);
    CHECK_MSG(m, "%s", err);
    ref_bert *ref = ref_bert_load(g);
    CHECK(ref);
    bert_runner *r = bert_runner_new(m, 2, 64, err);
    CHECK_MSG(r, "%s", err);
    int lens[2] = {9, 23};
    int32_t tok[32], types[32];
    tokens_of(tok, 9, 1);
    tokens_of(tok + 9, 23, 2);
    for (int i = 0; i < 32; i++)
        types[i] = i >= 9 + 11; /* the second sequence's last 12 tokens are segment B */
    float *x = malloc(sizeof(float) * 32 * DIM);
    double *h0 = malloc(sizeof(double) * (N_LAYER + 1) * 9 * DIM);
    double *h1 = malloc(sizeof(double) * (N_LAYER + 1) * 23 * DIM);
    ref_bert_forward(ref, 9, tok, types, h0);
    ref_bert_forward(ref, 23, tok + 9, types + 9, h1);
    CHECK_MSG(bert_input(m, 2, lens, tok, types, x, err) == 0, "%s", err);
    double worst = 0;
    for (int l = 0; l <= N_LAYER; l++) {
        if (l > 0)
            CHECK_MSG(bert_layer(r, l - 1, 2, lens, x, err) == 0, "%s", err);
        double e0 = rel_err(x, h0 + (size_t)l * 9 * DIM, 9 * DIM);
        double e1 = rel_err(x + 9 * DIM, h1 + (size_t)l * 23 * DIM, 23 * DIM);
        worst = fmax(worst, fmax(e0, e1));
    }
    CHECK_MSG(worst <= tol, "%s: hidden rows differ from the reference by %g (> %g)", tag,
              worst, tol);
    if (bert_hparams_of(m)->n_cls_out > 0) {
        float cls[2 * DIM], score[2];
        memcpy(cls, x, sizeof(float) * DIM);
        memcpy(cls + DIM, x + 9 * DIM, sizeof(float) * DIM);
        CHECK_MSG(bert_head(r, 2, cls, score, err) == 0, "%s", err);
        double s0 = ref_bert_head(ref, h0 + (size_t)N_LAYER * 9 * DIM);
        double s1 = ref_bert_head(ref, h1 + (size_t)N_LAYER * 23 * DIM);
        CHECK_NEAR(score[0], s0, 10 * tol + 1e-5);
        CHECK_NEAR(score[1], s1, 10 * tol + 1e-5);
    }
    free(x);
    free(h0);
    free(h1);
    bert_runner_free(r);
    ref_bert_free(ref);
    bert_free(m);
    gguf_close(g);
}

static void check_type(uint32_t type, const char *tag, double tol)
{
    const char *path = gen(tag, type, 4, NULL);
    CHECK(path);
    check_file(path, tag, tol);
}

/* nomic-bert (no head: mean pooling) */
static void check_nomic_type(uint32_t type, const char *tag, double tol)
{
    const char *path = gen_arch("nomic-bert", tag, type, 1, NULL);
    CHECK(path);
    check_file(path, tag, tol);
}

static void test_f32_matches_reference(void) { check_type(QTYPE_F32, "f32", 1e-5); }
static void test_f16_matches_reference(void) { check_type(QTYPE_F16, "f16", 1e-5); }
static void test_q8_0_matches_reference(void) { check_type(QTYPE_Q8_0, "q8_0", 2e-2); }
static void test_nomic_f32_matches_reference(void) { check_nomic_type(QTYPE_F32, "f32", 1e-5); }
static void test_nomic_f16_matches_reference(void) { check_nomic_type(QTYPE_F16, "f16", 1e-5); }
static void test_nomic_q8_0_matches_reference(void)
{
    check_nomic_type(QTYPE_Q8_0, "q8_0", 2e-2);
}

/* Mean and CLS pooling against the reference's rows; unit length; a sequence's vector
 * does not depend on the sequences stacked with it. */
static void test_embed_pooling(void)
{
    char err[ERR_MAX];
    const char *path = gen("mean", QTYPE_F32, 1, NULL);
    CHECK(path);
    gguf_file *g = gguf_open(path, err);
    CHECK(g);
    bert_model *m = bert_from_gguf(g, err);
    CHECK_MSG(m, "%s", err);
    CHECK_EQ(bert_hparams_of(m)->pooling, BERT_POOL_MEAN);
    CHECK_EQ(bert_hparams_of(m)->n_cls_out, 0);
    ref_bert *ref = ref_bert_load(g);
    bert_runner *r = bert_runner_new(m, 1, 0, err);
    CHECK_MSG(r, "%s", err);
    CHECK_EQ(bert_runner_max_rows(r), N_CTX);
    int lens[3] = {5, 17, 1};
    int32_t tok[23];
    tokens_of(tok, 5, 3);
    tokens_of(tok + 5, 17, 4);
    tok[22] = 7;
    float out[3 * DIM], alone[DIM];
    CHECK_MSG(bert_embed(r, 3, lens, tok, NULL, BERT_POOL_MEAN, out, err) == 0, "%s", err);
    double want[DIM];
    ref_mean(ref, 17, tok + 5, want);
    CHECK(rel_err(out + DIM, want, DIM) < 1e-4);
    double n2 = 0;
    for (int i = 0; i < DIM; i++)
        n2 += (double)out[DIM + i] * out[DIM + i];
    CHECK_NEAR(n2, 1.0, 1e-5);
    CHECK_MSG(bert_embed(r, 1, &lens[1], tok + 5, NULL, BERT_POOL_MEAN, alone, err) == 0, "%s",
              err);
    for (int i = 0; i < DIM; i++)
        CHECK_NEAR(alone[i], out[DIM + i], 1e-5);
    /* CLS pooling is the first row, normalised */
    CHECK_MSG(bert_embed(r, 1, &lens[1], tok + 5, NULL, BERT_POOL_CLS, alone, err) == 0, "%s",
              err);
    double *h = malloc(sizeof(double) * (N_LAYER + 1) * 17 * DIM), ss = 0;
    ref_bert_forward(ref, 17, tok + 5, NULL, h);
    for (int i = 0; i < DIM; i++)
        ss += h[(size_t)N_LAYER * 17 * DIM + i] * h[(size_t)N_LAYER * 17 * DIM + i];
    for (int i = 0; i < DIM; i++)
        CHECK_NEAR(alone[i], h[(size_t)N_LAYER * 17 * DIM + i] / sqrt(ss), 1e-4);
    free(h);
    bert_runner_free(r);
    ref_bert_free(ref);
    bert_free(m);
    gguf_close(g);
}

static void test_bad_inputs(void)
{
    char err[ERR_MAX];
    const char *path = gen("bad", QTYPE_F32, 2, NULL);
    CHECK(path);
    bert_model *m = bert_load(path, err);
    CHECK_MSG(m, "%s", err);
    bert_runner *r = bert_runner_new(m, 1, 32, err);
    CHECK(r);
    int32_t tok[40] = {0};
    float out[DIM], x[40 * DIM];
    int len = 3, big = 40, types_bad[3] = {0, 0, 2};
    tok[1] = N_VOCAB;
    CHECK(bert_embed(r, 1, &len, tok, NULL, BERT_POOL_CLS, out, err) < 0);
    CHECK(strstr(err, "out of range"));
    tok[1] = 5;
    CHECK(bert_input(m, 1, &len, tok, types_bad, x, err) < 0);
    CHECK(strstr(err, "type"));
    CHECK(bert_embed(r, 1, &big, tok, NULL, BERT_POOL_CLS, out, err) < 0);
    big = N_CTX + 1;
    CHECK(bert_input(m, 1, &big, tok, NULL, x, err) < 0);
    CHECK(bert_embed(r, 1, &len, tok, NULL, BERT_POOL_RANK, out, err) < 0);
    CHECK(bert_head(r, 1, x, out, err) < 0);
    CHECK(strstr(err, "head"));
    CHECK(bert_layer(r, N_LAYER, 1, &len, x, err) < 0);
    bert_runner_free(r);
    bert_free(m);
}

/* An F32 tensor for rewrite (1-D: ne[1] 1). */
typedef struct extra_tensor {
    const char *name;
    uint32_t n_dims;
    int64_t ne[2];
    const float *data;
} extra_tensor;

/* What rewrite changes in a copy of a file; NULL / 0 fields change nothing. */
typedef struct edits {
    const char *drop_tensor;
    const extra_tensor *extra; /* (n_extra) added */
    int n_extra;
    const char *drop_key;
    const char *u32_key; /* added with the value u32 */
    uint32_t u32;
} edits;

static char rewritten[600]; /* rewrite's output path */

/* Writes src's metadata and tensors, edited, to tmpdir/name (rewritten). */
static void rewrite(const char *src, const char *name, const edits *e)
{
    char err[ERR_MAX];
    snprintf(rewritten, sizeof rewritten, "%s/%s", test_tmpdir(), name);
    gguf_file *g = gguf_open(src, err);
    CHECK_MSG(g, "%s", err);
    gguf_writer *w = gguf_writer_new();
    for (int64_t i = 0; i < gguf_n_kv(g); i++)
        if (!e->drop_key || !gguf_str_eq(gguf_key(g, i), e->drop_key))
            CHECK(gguf_writer_copy_kv(w, g, i) == 0);
    if (e->u32_key)
        CHECK(gguf_writer_set_u32(w, e->u32_key, e->u32) == 0);
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        char tn[128];
        snprintf(tn, sizeof tn, "%.*s", (int)t->name.len, t->name.ptr);
        if (!e->drop_tensor || strcmp(tn, e->drop_tensor) != 0)
            CHECK(gguf_writer_add_tensor(w, tn, t->type, t->n_dims, t->ne, t->data) == 0);
    }
    for (int i = 0; i < e->n_extra; i++) {
        const extra_tensor *x = &e->extra[i];
        int64_t ne[4] = {x->ne[0], x->ne[1], 1, 1};
        CHECK(gguf_writer_add_tensor(w, x->name, QTYPE_F32, x->n_dims, ne, x->data) == 0);
    }
    CHECK_MSG(gguf_writer_write(w, rewritten, err) == 0, "%s", err);
    gguf_writer_free(w);
    gguf_close(g);
}

/* A copy of the file without one tensor, and a decoder file: clear errors. */
static void test_bad_files(void)
{
    char err[ERR_MAX], out[600];
    const char *path = gen("full", QTYPE_F32, 2, NULL);
    CHECK(path);
    rewrite(path, "bert-missing.gguf", &(edits){.drop_tensor = "blk.1.ffn_up.bias"});
    CHECK(!bert_load(rewritten, err));
    CHECK_MSG(strstr(err, "blk.1.ffn_up.bias"), "%s", err);

    snprintf(out, sizeof out, "%s/llama.gguf", test_tmpdir());
    modelgen_params p = {.arch = "llama", .dim = 32, .n_layer = 1, .n_head = 2, .n_head_kv = 2,
                         .n_ff = 64, .n_ctx = 32, .type = QTYPE_F32, .seed = 1, .n_vocab = 50,
                         .n_threads = 1};
    CHECK(modelgen_write(&p, out, err) == 0);
    CHECK(!bert_load(out, err));
    CHECK(strstr(err, "not a bert"));
}

/* nomic-bert's attn_qkv and attn_output biases, which the nomic-embed files lack but
 * llama.cpp reads when present, against the reference. */
static void test_nomic_biases(void)
{
    const char *path = gen_arch("nomic-bert", "nobias", QTYPE_F32, 1, NULL);
    CHECK(path);
    static float bqkv[3 * DIM], bo[DIM];
    for (int i = 0; i < 3 * DIM; i++)
        bqkv[i] = 0.2f * sinf(0.7f * i);
    for (int i = 0; i < DIM; i++)
        bo[i] = 0.1f * cosf(1.3f * i);
    extra_tensor ex[] = {{"blk.0.attn_qkv.bias", 1, {3 * DIM, 1}, bqkv},
                         {"blk.1.attn_output.bias", 1, {DIM, 1}, bo}};
    rewrite(path, "nomic-bias.gguf", &(edits){.extra = ex, .n_extra = 2});
    check_file(rewritten, "nomic biases", 1e-5);
}

/* A nomic-bert whose first layer has separate attn_q/k/v (llama.cpp takes them when there
 * is no attn_qkv): the reference's rows, and the same embedding as the fused file. */
static void test_nomic_separate_qkv(void)
{
    char err[ERR_MAX];
    const char *path = gen_arch("nomic-bert", "fused", QTYPE_F32, 1, NULL);
    CHECK(path);
    char fused[600];
    snprintf(fused, sizeof fused, "%s", path);
    gguf_file *g = gguf_open(fused, err);
    CHECK_MSG(g, "%s", err);
    const gguf_tensor *qkv = gguf_find_tensor(g, "blk.0.attn_qkv.weight");
    CHECK(qkv && qkv->type == QTYPE_F32);
    const float *rows = qkv->data;
    extra_tensor sep[] = {{"blk.0.attn_q.weight", 2, {DIM, DIM}, rows},
                          {"blk.0.attn_k.weight", 2, {DIM, DIM}, rows + DIM * DIM},
                          {"blk.0.attn_v.weight", 2, {DIM, DIM}, rows + 2 * DIM * DIM}};
    rewrite(fused, "nomic-sep.gguf",
            &(edits){.drop_tensor = "blk.0.attn_qkv.weight", .extra = sep, .n_extra = 3});
    check_file(rewritten, "separate qkv", 1e-5);
    bert_model *a = bert_load(fused, err), *b = bert_load(rewritten, err);
    CHECK_MSG(a && b, "%s", err);
    bert_runner *ra = bert_runner_new(a, 1, 0, err), *rb = bert_runner_new(b, 1, 0, err);
    CHECK(ra && rb);
    int len = 11;
    int32_t tok[11];
    tokens_of(tok, len, 7);
    float va[DIM], vb[DIM];
    CHECK(bert_embed(ra, 1, &len, tok, NULL, BERT_POOL_MEAN, va, err) == 0);
    CHECK(bert_embed(rb, 1, &len, tok, NULL, BERT_POOL_MEAN, vb, err) == 0);
    for (int i = 0; i < DIM; i++)
        CHECK_NEAR(va[i], vb[i], 1e-6);
    bert_runner_free(ra);
    bert_runner_free(rb);
    bert_free(a);
    bert_free(b);
    gguf_close(g);
}

/* Missing and misshapen nomic-bert tensors, a missing key, an unsupported rope: errors
 * that name them. */
static void test_nomic_bad_files(void)
{
    char err[ERR_MAX];
    const char *path = gen_arch("nomic-bert", "bad", QTYPE_F32, 1, NULL);
    CHECK(path);
    char good[600];
    snprintf(good, sizeof good, "%s", path);
    bert_model *m = bert_load(good, err);
    CHECK_MSG(m, "%s", err);
    CHECK_EQ(bert_hparams_of(m)->arch, BERT_ARCH_NOMIC);
    CHECK_EQ(bert_hparams_of(m)->n_pos, N_CTX);
    CHECK_NEAR(bert_hparams_of(m)->rope_base, 1000.0, 1e-3);
    bert_free(m);
    rewrite(good, "nomic-nogate.gguf", &(edits){.drop_tensor = "blk.1.ffn_gate.weight"});
    CHECK(!bert_load(rewritten, err));
    CHECK_MSG(strstr(err, "blk.1.ffn_gate.weight"), "%s", err);
    /* q and k but no v rows */
    static float w[2 * DIM * DIM];
    extra_tensor qk = {"blk.0.attn_qkv.weight", 2, {DIM, 2 * DIM}, w};
    rewrite(good, "nomic-qk.gguf",
            &(edits){.drop_tensor = "blk.0.attn_qkv.weight", .extra = &qk, .n_extra = 1});
    CHECK(!bert_load(rewritten, err));
    CHECK_MSG(strstr(err, "blk.0.attn_qkv.weight"), "%s", err);
    static float b[2 * DIM];
    extra_tensor short_bias = {"blk.1.attn_qkv.bias", 1, {2 * DIM, 1}, b};
    rewrite(good, "nomic-qkvb.gguf", &(edits){.extra = &short_bias, .n_extra = 1});
    CHECK(!bert_load(rewritten, err));
    CHECK_MSG(strstr(err, "blk.1.attn_qkv.bias"), "%s", err);

    /* metadata: no context length (no position table says it), a partial rotation */
    rewrite(good, "nomic-noctx.gguf", &(edits){.drop_key = "nomic-bert.context_length"});
    CHECK(!bert_load(rewritten, err));
    CHECK_MSG(strstr(err, "nomic-bert.context_length"), "%s", err);
    rewrite(good, "nomic-rot.gguf",
            &(edits){.u32_key = "nomic-bert.rope.dimension_count", .u32 = DIM / 4 / 2});
    CHECK(!bert_load(rewritten, err));
    CHECK_MSG(strstr(err, "nomic-bert.rope.dimension_count"), "%s", err);
}

/* nomic-bert's mean-pooled embedding of a sequence against the reference's rows, the
 * same whether it is encoded alone or stacked after another (RoPE positions restart at
 * each sequence). */
static void test_nomic_embed(void)
{
    char err[ERR_MAX];
    const char *path = gen_arch("nomic-bert", "embed", QTYPE_F16, 1, NULL);
    CHECK(path);
    gguf_file *g = gguf_open(path, err);
    CHECK(g);
    bert_model *m = bert_from_gguf(g, err);
    CHECK_MSG(m, "%s", err);
    CHECK_EQ(bert_hparams_of(m)->pooling, BERT_POOL_MEAN);
    ref_bert *ref = ref_bert_load(g);
    CHECK(ref);
    bert_runner *r = bert_runner_new(m, 2, 0, err);
    CHECK_MSG(r, "%s", err);
    int lens[2] = {6, 13};
    int32_t tok[19];
    tokens_of(tok, 6, 5);
    tokens_of(tok + 6, 13, 6);
    float out[2 * DIM], alone[DIM];
    CHECK_MSG(bert_embed(r, 2, lens, tok, NULL, BERT_POOL_MEAN, out, err) == 0, "%s", err);
    CHECK_MSG(bert_embed(r, 1, &lens[1], tok + 6, NULL, BERT_POOL_MEAN, alone, err) == 0, "%s",
              err);
    double want[DIM];
    ref_mean(ref, 13, tok + 6, want);
    CHECK(rel_err(out + DIM, want, DIM) < 1e-4);
    for (int i = 0; i < DIM; i++)
        CHECK_NEAR(alone[i], out[DIM + i], 1e-5);
    /* the order of tokens matters (RoPE), unlike to a bag of words */
    int32_t rev[13];
    for (int i = 0; i < 13; i++)
        rev[i] = tok[6 + 12 - i];
    CHECK_MSG(bert_embed(r, 1, &lens[1], rev, NULL, BERT_POOL_MEAN, out, err) == 0, "%s", err);
    CHECK(rel_err(out, want, DIM) > 1e-3);
    bert_runner_free(r);
    ref_bert_free(ref);
    bert_free(m);
    gguf_close(g);
}

/* The bge vocabulary: "[CLS] ... [SEP]" from WordPiece, embedded end to end. */
static void test_bge_text(void)
{
    const char *vp = test_data_path("vocab/ggml-vocab-bert-bge.gguf");
    if (!vp) {
        test_skip("../shared/testdata/vocab/ggml-vocab-bert-bge.gguf is absent");
        return;
    }
    char err[ERR_MAX];
    gguf_file *v = gguf_open(vp, err);
    CHECK(v);
    const char *path = gen("bge", QTYPE_F16, 2, v);
    gguf_close(v);
    CHECK(path);
    bert_model *m = bert_load(path, err);
    CHECK_MSG(m, "%s", err);
    tokenizer *tok;
    CHECK_MSG(tok_load(bert_gguf(m), &tok, err) == 0, "%s", err);
    int32_t ids[32];
    int n = tok_encode(tok, "Hello world", 11, true, false, ids, 32);
    CHECK(n >= 4 && n <= 32);
    CHECK_EQ(ids[0], tok_special(tok, TOK_SPECIAL_CLS));
    CHECK_EQ(ids[n - 1], tok_special(tok, TOK_SPECIAL_SEP));
    bert_runner *r = bert_runner_new(m, 1, 0, err);
    CHECK(r);
    float out[DIM];
    CHECK_MSG(bert_embed(r, 1, &n, ids, NULL, BERT_POOL_CLS, out, err) == 0, "%s", err);
    double ss = 0;
    for (int i = 0; i < DIM; i++)
        ss += (double)out[i] * out[i];
    CHECK_NEAR(ss, 1.0, 1e-5);
    bert_runner_free(r);
    tok_free(tok);
    bert_free(m);
}

int main(void)
{
    RUN(test_f32_matches_reference);
    RUN(test_f16_matches_reference);
    RUN(test_q8_0_matches_reference);
    RUN(test_embed_pooling);
    RUN(test_bad_inputs);
    RUN(test_bad_files);
    RUN(test_bge_text);
    RUN(test_nomic_f32_matches_reference);
    RUN(test_nomic_f16_matches_reference);
    RUN(test_nomic_q8_0_matches_reference);
    RUN(test_nomic_embed);
    RUN(test_nomic_biases);
    RUN(test_nomic_separate_qkv);
    RUN(test_nomic_bad_files);
    return test_finish();
}
