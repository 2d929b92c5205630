/*
 * Embeddings on generated models (synthetic 260-token vocabulary, no shared data):
 * unit length, last-token, mean and first-token pooling against the forward's own
 * hidden rows put through output_norm.weight read from the file, determinism,
 * independence from what was embedded before and from the runner's batch size, text
 * tokenization, and the pooling a file's {arch}.pooling_type names. On the shared test
 * data: docs-embed-5M's vectors against llama.cpp's (tests/engine/data).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/embed.h"
#include "engine/gguf/gguf.h"
#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"
#include "tests/support/test.h"

#define DIM 64
#define N_LAYER 2
#define N_VOCAB 260

typedef struct fixture {
    model *m;
    model_runner *r;
    kv_pool *pool;
    embedder *e;
} fixture;

/* A small decoder with {arch}.pooling_type = pooling_type (0: none written). */
static int gen_pooled(int pooling_type, char *path, size_t cap)
{
    snprintf(path, cap, "%s/pooled-%d.gguf", test_tmpdir(), pooling_type);
    modelgen_params p = {.arch = "llama", .dim = 32, .n_layer = 1, .n_head = 2, .n_head_kv = 2,
                         .n_ff = 64, .n_ctx = 64, .type = QTYPE_F32, .seed = 3,
                         .n_vocab = N_VOCAB, .n_threads = 1, .pooling_type = pooling_type};
    char err[ERR_MAX];
    return modelgen_write(&p, path, err);
}

static const char *gen_model(void)
{
    static char path[512];
    if (path[0])
        return path;
    snprintf(path, sizeof path, "%s/embed.gguf", test_tmpdir());
    modelgen_params p = {.arch = "qwen3", .dim = DIM, .n_layer = N_LAYER, .n_head = 4,
                         .n_head_kv = 2, .n_ff = 128, .n_ctx = 256, .type = QTYPE_F32,
                         .seed = 11, .n_vocab = N_VOCAB, .n_threads = 1};
    char err[ERR_MAX];
    if (modelgen_write(&p, path, err) < 0) {
        fprintf(stderr, "modelgen: %s\n", err);
        path[0] = 0;
        return NULL;
    }
    return path;
}

static int fx_open(fixture *f, int max_batch)
{
    memset(f, 0, sizeof *f);
    char err[ERR_MAX];
    const char *path = gen_model();
    if (!path)
        return -1;
    if (!(f->m = model_load(path, err)) || !(f->r = model_runner_new(f->m, 1, max_batch, 0, err)) ||
        !(f->pool = kv_pool_new(model_kv_shape(f->m), 0, err)) ||
        !(f->e = embed_new(f->m, f->r, f->pool, err))) {
        fprintf(stderr, "fixture: %s\n", err);
        return -1;
    }
    return 0;
}

static void fx_close(fixture *f)
{
    embed_free(f->e);
    kv_pool_free(f->pool);
    model_runner_free(f->r);
    model_free(f->m);
}

static void tokens_of(int32_t *t, int n, int seed)
{
    for (int i = 0; i < n; i++)
        t[i] = 3 + (int32_t)((i * 37 + seed * 101) % (N_VOCAB - 3));
}

static double norm2(const float *v, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++)
        s += (double)v[i] * v[i];
    return sqrt(s);
}

static double max_diff(const float *a, const float *b, int n)
{
    double d = 0;
    for (int i = 0; i < n; i++)
        if (fabs(a[i] - b[i]) > d)
            d = fabs(a[i] - b[i]);
    return d;
}

/* Reference: one forward with every row out, rows through RMSNorm with the file's
 * output_norm.weight, then last or mean, L2-normalised. */
static void reference(fixture *f, const int32_t *tok, int n, enum embed_pooling pooling, float *out)
{
    const gguf_tensor *nw = gguf_find_tensor(model_gguf(f->m), "output_norm.weight");
    const float *w = nw->data;
    int32_t *rows = malloc(sizeof *rows * (size_t)n), *pos = malloc(sizeof *pos * (size_t)n);
    float *hidden = malloc(sizeof *hidden * (size_t)(N_LAYER + 1) * n * DIM);
    for (int i = 0; i < n; i++)
        rows[i] = pos[i] = i;
    kv_seq seq;
    kv_seq_init(&seq, f->pool);
    model_batch b = {.n_tokens = n, .tokens = tok, .positions = pos, .n_out = n,
                     .out_rows = rows, .hidden = hidden};
    char err[ERR_MAX];
    CHECK(model_forward(f->r, &seq, &b, err) == 0);
    kv_seq_free(&seq);
    double acc[DIM] = {0};
    int first = pooling == EMBED_LAST ? n - 1 : 0, end = pooling == EMBED_CLS ? 1 : n;
    for (int o = first; o < end; o++) {
        const float *x = hidden + ((size_t)N_LAYER * n + o) * DIM;
        double ss = 0;
        for (int i = 0; i < DIM; i++)
            ss += (double)x[i] * x[i];
        double sc = 1.0 / sqrt(ss / DIM + model_hparams_of(f->m)->norm_eps);
        for (int i = 0; i < DIM; i++)
            acc[i] += x[i] * sc * w[i];
    }
    double ss = 0;
    for (int i = 0; i < DIM; i++)
        ss += acc[i] * acc[i];
    for (int i = 0; i < DIM; i++)
        out[i] = (float)(acc[i] / sqrt(ss));
    free(rows);
    free(pos);
    free(hidden);
}

static void test_pooling_matches_reference(void)
{
    fixture f;
    CHECK(fx_open(&f, 0) == 0);
    if (!f.e)
        return;
    CHECK_EQ(embed_dim(f.e), DIM);
    int32_t tok[100];
    tokens_of(tok, 100, 1);
    float last[DIM], mean[DIM], ref[DIM];
    char err[ERR_MAX];
    CHECK(embed_tokens(f.e, tok, 100, EMBED_LAST, last, err) == 0);
    CHECK(embed_tokens(f.e, tok, 100, EMBED_MEAN, mean, err) == 0);
    CHECK_NEAR(norm2(last, DIM), 1.0, 1e-5);
    CHECK_NEAR(norm2(mean, DIM), 1.0, 1e-5);
    reference(&f, tok, 100, EMBED_LAST, ref);
    CHECK(max_diff(last, ref, DIM) < 1e-4);
    reference(&f, tok, 100, EMBED_MEAN, ref);
    CHECK(max_diff(mean, ref, DIM) < 1e-4);
    CHECK(max_diff(last, mean, DIM) > 1e-2);
    float cls[DIM];
    CHECK(embed_tokens(f.e, tok, 100, EMBED_CLS, cls, err) == 0);
    reference(&f, tok, 100, EMBED_CLS, ref);
    CHECK(max_diff(cls, ref, DIM) < 1e-4);
    /* causal: the first token's state is the same whatever follows it. The 100-row
     * prefill and the 1-row step take different f32 matrix products (the scalar build's
     * differ by 1.7e-5 here); a token that saw its followers would move by over 1e-2,
     * as last and mean differ above. */
    float cls_one[DIM];
    CHECK(embed_tokens(f.e, tok, 1, EMBED_CLS, cls_one, err) == 0);
    CHECK(max_diff(cls, cls_one, DIM) < 1e-4);
    CHECK_EQ(kv_pool_n_used(f.pool), 0);
    fx_close(&f);
}

static void test_deterministic_and_independent(void)
{
    fixture f;
    CHECK(fx_open(&f, 0) == 0);
    if (!f.e)
        return;
    int32_t a[30], b[45];
    tokens_of(a, 30, 2);
    tokens_of(b, 45, 3);
    float a1[DIM], a2[DIM], b1[DIM], b2[DIM];
    char err[ERR_MAX];
    for (int p = 0; p < 2; p++) {
        enum embed_pooling pl = p ? EMBED_MEAN : EMBED_LAST;
        CHECK(embed_tokens(f.e, a, 30, pl, a1, err) == 0);
        CHECK(embed_tokens(f.e, b, 45, pl, b1, err) == 0);
        CHECK(embed_tokens(f.e, b, 45, pl, b2, err) == 0);
        CHECK(embed_tokens(f.e, a, 30, pl, a2, err) == 0);
        CHECK(memcmp(a1, a2, sizeof a1) == 0);
        CHECK(memcmp(b1, b2, sizeof b1) == 0);
        CHECK(max_diff(a1, b1, DIM) > 1e-2);
    }
    fx_close(&f);
}

/* A text longer than the runner's max batch (and than mean pooling's pieces) gives the
 * same vector as with a runner that takes it in one batch. */
static void test_long_text_beyond_max_batch(void)
{
    fixture small, big;
    CHECK(fx_open(&small, 7) == 0);
    CHECK(fx_open(&big, 256) == 0);
    if (!small.e || !big.e)
        return;
    int32_t tok[200];
    tokens_of(tok, 200, 4);
    char err[ERR_MAX];
    for (int p = 0; p < 2; p++) {
        enum embed_pooling pl = p ? EMBED_MEAN : EMBED_LAST;
        float x[DIM], y[DIM];
        CHECK(embed_tokens(small.e, tok, 200, pl, x, err) == 0);
        CHECK(embed_tokens(big.e, tok, 200, pl, y, err) == 0);
        CHECK(max_diff(x, y, DIM) < 1e-4);
    }
    fx_close(&small);
    fx_close(&big);
}

static void test_text_and_errors(void)
{
    fixture f;
    CHECK(fx_open(&f, 0) == 0);
    if (!f.e)
        return;
    char err[ERR_MAX];
    float v[DIM], w[DIM];
    int n = 0;
    tokenizer *tok;
    CHECK(tok_load(model_gguf(f.m), &tok, err) == 0);
    char text[2000];
    memset(text, 'a', 150);
    text[150] = 0;
    CHECK_MSG(embed_text(f.e, tok, text, EMBED_MEAN, v, &n, err) == 0, "%s", err);
    CHECK(n > 0);
    int32_t *ids = malloc(sizeof *ids * (size_t)n);
    CHECK_EQ(tok_encode(tok, text, 150, true, false, ids, n), n);
    CHECK(embed_tokens(f.e, ids, n, EMBED_MEAN, w, err) == 0);
    CHECK(memcmp(v, w, sizeof v) == 0);
    free(ids);
    int32_t bad[2] = {5, N_VOCAB};
    CHECK(embed_tokens(f.e, bad, 2, EMBED_LAST, v, err) < 0);
    CHECK(embed_tokens(f.e, bad, 0, EMBED_LAST, v, err) < 0);
    int32_t many[300];
    tokens_of(many, 300, 5);
    CHECK(embed_tokens(f.e, many, 300, EMBED_LAST, v, err) < 0);
    CHECK(strstr(err, "more than") != NULL);
    CHECK(embed_tokens(f.e, many, 3, (enum embed_pooling)7, v, err) < 0);
    CHECK_EQ(kv_pool_n_used(f.pool), 0);
    tok_free(tok);
    fx_close(&f);
}

/* {arch}.pooling_type chooses the pooling (llama.cpp's numbers); none and rank give no
 * vector per text, a value llama.cpp does not define stops the load. */
static void test_pooling_type_of_file(void)
{
    static const struct {
        int type;
        int rc;
        enum embed_pooling pooling;
    } cases[] = {{0, 0, EMBED_LAST}, {1, 1, EMBED_MEAN}, {2, 1, EMBED_CLS},
                 {3, 1, EMBED_LAST}, {4, -1, EMBED_LAST}};
    char path[512], err[ERR_MAX];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK(gen_pooled(cases[i].type, path, sizeof path) == 0);
        model *m = model_load(path, err);
        CHECK_MSG(m != NULL, "%s", err);
        if (!m)
            continue;
        CHECK_EQ(model_hparams_of(m)->pooling_type, cases[i].type ? cases[i].type : -1);
        enum embed_pooling got = EMBED_LAST;
        err[0] = 0;
        CHECK_EQ(embed_pooling_of_model(m, &got, err), cases[i].rc);
        if (cases[i].rc == 1)
            CHECK_EQ(got, cases[i].pooling);
        if (cases[i].rc < 0)
            CHECK(strstr(err, "rank") != NULL);
        model_free(m);
    }
    CHECK(gen_pooled(7, path, sizeof path) == 0);
    CHECK(model_load(path, err) == NULL);
    CHECK(strstr(err, "llama.pooling_type") && strstr(err, "7"));
}

/* One reference line: the text and its vector (dim floats); 0 at the end of the file. */
static int read_reference(FILE *f, char *text, size_t cap, float *vec, int dim)
{
    char *line = NULL;
    size_t n = 0;
    int rc = 0;
    while (getline(&line, &n, f) > 0) {
        if (line[0] == '#')
            continue;
        char *tab = strchr(line, '\t');
        if (!tab || (size_t)(tab - line) >= cap)
            break;
        memcpy(text, line, (size_t)(tab - line));
        text[tab - line] = 0;
        char *p = tab + 1, *end;
        int i = 0;
        for (; i < dim; i++, p = end) {
            vec[i] = strtof(p, &end);
            if (end == p)
                break;
        }
        rc = i == dim;
        break;
    }
    free(line);
    return rc;
}

/* docs-embed-5M (a trained decoder embedding model, mean pooling named by its file): the
 * vectors of texts embedded as the file says equal llama.cpp's (cosine >= 0.9999). */
static void test_docs_embed_matches_llamacpp(void)
{
    const char *path = test_data_path("models/docs-embed-5M-F16.gguf");
    if (!path)
        SKIP("../shared/testdata/models/docs-embed-5M-F16.gguf is absent");
    char err[ERR_MAX];
    model *m = model_load(path, err);
    CHECK_MSG(m != NULL, "%s", err);
    if (!m)
        return;
    int dim = model_hparams_of(m)->dim;
    enum embed_pooling pooling = EMBED_LAST;
    CHECK_EQ(embed_pooling_of_model(m, &pooling, err), 1);
    CHECK_EQ(pooling, EMBED_MEAN);
    tokenizer *tok = NULL;
    model_runner *r = model_runner_new(m, 2, 0, 512, err);
    kv_pool *pool = r ? kv_pool_new(model_kv_shape(m), 0, err) : NULL;
    embedder *e = pool ? embed_new(m, r, pool, err) : NULL;
    CHECK_MSG(e && tok_load(model_gguf(m), &tok, err) == 0, "%s", err);
    FILE *f = fopen("tests/engine/data/docs-embed-5M.llamacpp.tsv", "r");
    CHECK_MSG(f != NULL, "tests/engine/data/docs-embed-5M.llamacpp.tsv: run from the repository");
    float *want = malloc(sizeof *want * (size_t)dim), *got = malloc(sizeof *got * (size_t)dim);
    char text[4096];
    int n = 0;
    double worst = 1;
    while (f && e && tok && read_reference(f, text, sizeof text, want, dim)) {
        CHECK_MSG(embed_text(e, tok, text, pooling, got, NULL, err) == 0, "%s", err);
        double dot = 0, ww = 0, gg = 0;
        for (int i = 0; i < dim; i++) {
            dot += (double)want[i] * got[i];
            ww += (double)want[i] * want[i];
            gg += (double)got[i] * got[i];
        }
        double cos = dot / sqrt(ww * gg);
        CHECK_MSG(cos >= 0.9999, "'%.40s': cosine %.6f with llama.cpp's", text, cos);
        worst = cos < worst ? cos : worst;
        n++;
    }
    CHECK_EQ(n, 8);
    printf("   docs-embed-5M: %d texts, worst cosine with llama.cpp %.7f\n", n, worst);
    if (f)
        fclose(f);
    free(want);
    free(got);
    tok_free(tok);
    embed_free(e);
    kv_pool_free(pool);
    model_runner_free(r);
    model_free(m);
}

int main(void)
{
    RUN(test_pooling_matches_reference);
    RUN(test_deterministic_and_independent);
    RUN(test_long_text_beyond_max_batch);
    RUN(test_text_and_errors);
    RUN(test_pooling_type_of_file);
    RUN(test_docs_embed_matches_llamacpp);
    return test_finish();
}
