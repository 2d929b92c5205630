/*
 * GRATING reranking on bert cross-encoders (engine/encoder/rerank.c's encoder path), on a
 * random encoder with the shared bge vocabulary: the full forward's scores and order
 * against the reference encoder and head (tests/support/ref_bert.c), pruning with
 * intermediate exits, steps against one run (equal up to the rounding of other matrix
 * kernels for other group sizes), XLM-RoBERTa's pairs on a unigram vocabulary, and an
 * embedding model refused.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf/gguf.h"
#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"
#include "engine/encoder/rerank.h"
#include "engine/tok/tokenizer.h"
#include "tests/support/ref_bert.h"
#include "tests/support/test.h"

#define DIM 64
#define N_LAYER 4
#define N_DOCS 12

static const char *const QUERY = "what is the capital of france";
static const char *const DOCS[N_DOCS] = {
    "paris is the capital and largest city of france",
    "the eiffel tower is in paris",
    "berlin is the capital of germany",
    "bananas are rich in potassium",
    "france borders spain, italy and germany",
    "the louvre holds the mona lisa",
    "rome was not built in a day",
    "capital letters start sentences",
    "lyon is a large city in france",
    "the seine flows through paris",
    "madrid is the capital of spain",
    "cats sleep most of the day",
};

/* A random cross-encoder (rank pooling: the cls head) or embedding model (pooling) on
 * the vocabulary at vp. */
static const char *gen_on(const char *vp, int pooling, char *path, size_t cap)
{
    char err[ERR_MAX];
    gguf_file *v = gguf_open(vp, err);
    if (!v)
        return NULL;
    snprintf(path, cap, "%s/bert-%d-%s.gguf", test_tmpdir(), pooling, strrchr(vp, '/') + 1);
    modelgen_params p = {.arch = "bert", .dim = DIM, .n_layer = N_LAYER, .n_head = 4,
                         .n_head_kv = 4, .n_ff = 128, .n_ctx = 128, .type = QTYPE_F32,
                         .seed = 9, .vocab = v, .n_threads = 1, .pooling_type = pooling};
    int rc = modelgen_write(&p, path, err);
    gguf_close(v);
    if (rc < 0)
        fprintf(stderr, "modelgen: %s\n", err);
    return rc < 0 ? NULL : path;
}

/* The same on ../shared's bge (WordPiece) vocabulary; NULL where it is absent. */
static const char *gen(int pooling, char *path, size_t cap)
{
    const char *vp = test_data_path("vocab/ggml-vocab-bert-bge.gguf");
    return vp ? gen_on(vp, pooling, path, cap) : NULL;
}

/* The reference score of (QUERY, doc): sigmoid of the head on the last layer's [CLS]. */
static double ref_score(const ref_bert *ref, const tokenizer *tok, const char *doc)
{
    int32_t ids[128], types[128];
    int n = tok_encode(tok, QUERY, strlen(QUERY), true, false, ids, 128);
    int nq = n;
    n += tok_encode(tok, doc, strlen(doc), false, false, ids + n, 128 - n);
    ids[n++] = tok_special(tok, TOK_SPECIAL_SEP);
    for (int i = 0; i < n; i++)
        types[i] = i >= nq;
    double *h = malloc(sizeof(double) * (N_LAYER + 1) * n * DIM);
    ref_bert_forward(ref, n, ids, types, h);
    double s = ref_bert_head(ref, h + (size_t)N_LAYER * n * DIM);
    free(h);
    return 1.0 / (1.0 + exp(-s));
}

static void test_full_matches_reference(void)
{
    char path[512], err[ERR_MAX];
    if (!gen(4, path, sizeof path)) {
        test_skip("../shared/testdata/vocab/ggml-vocab-bert-bge.gguf is absent");
        return;
    }
    rerank_options o = rerank_default_options();
    o.cv_threshold = 0;
    o.top_k = N_DOCS;
    o.mode = RERANK_ORDERED;
    o.n_threads = 2;
    reranker *rr = rerank_open(path, &o, err);
    CHECK_MSG(rr, "%s", err);
    rerank_result res;
    CHECK_MSG(rerank_run(rr, QUERY, DOCS, N_DOCS, NULL, &res, err) == 0, "%s", err);
    CHECK_EQ(res.n, N_DOCS);
    CHECK_EQ(res.n_layer, N_LAYER);
    gguf_file *g = gguf_open(path, err);
    ref_bert *ref = ref_bert_load(g);
    tokenizer *tok;
    CHECK(ref && tok_load(g, &tok, err) == 0);
    double prev = 2;
    for (int i = 0; i < res.n; i++) {
        double want = ref_score(ref, tok, DOCS[res.index[i]]);
        CHECK_NEAR(res.score[i], want, 1e-5);
        CHECK(res.score[i] <= prev);
        prev = res.score[i];
        CHECK_EQ(res.layers_computed[res.index[i]], N_LAYER);
    }
    CHECK_EQ(res.pruned_at_layer[N_LAYER - 1], N_DOCS);
    rerank_result_free(&res);
    tok_free(tok);
    ref_bert_free(ref);
    gguf_close(g);
    rerank_close(rr);
}

/* A low threshold prunes after early layers (intermediate exits); steps of a few rows
 * give the same result as one run. */
static void test_pruning_and_steps(void)
{
    char path[512], err[ERR_MAX];
    if (!gen(4, path, sizeof path)) {
        test_skip("../shared/testdata/vocab/ggml-vocab-bert-bge.gguf is absent");
        return;
    }
    rerank_options o = rerank_default_options();
    o.cv_threshold = 1e-4f;
    o.top_k = 3;
    o.n_threads = 1;
    reranker *rr = rerank_open(path, &o, err);
    CHECK_MSG(rr, "%s", err);
    rerank_result one;
    CHECK_MSG(rerank_run(rr, QUERY, DOCS, N_DOCS, NULL, &one, err) == 0, "%s", err);
    CHECK_EQ(one.n, 3);
    int total = 0, early = 0;
    for (int l = 0; l < N_LAYER; l++)
        total += one.pruned_at_layer[l];
    for (int i = 0; i < N_DOCS; i++)
        early += one.layers_computed[i] < N_LAYER;
    CHECK_EQ(total, N_DOCS);
    CHECK_MSG(early > 0, "nothing stopped before the last layer");

    rerank_task *t = rerank_begin(rr, QUERY, DOCS, N_DOCS, NULL, err);
    CHECK_MSG(t, "%s", err);
    int rc, steps = 0;
    while ((rc = rerank_step(t, 20, err)) == 0)
        steps++;
    CHECK_MSG(rc == 1, "%s", err);
    CHECK(steps > 2);
    CHECK_EQ(rerank_task_rows_left(t), 0);
    rerank_result st;
    CHECK_MSG(rerank_task_result(t, &st, err) == 0, "%s", err);
    rerank_task_free(t);
    CHECK_EQ(st.n, one.n);
    for (int i = 0; i < one.n; i++) {
        CHECK_EQ(st.index[i], one.index[i]);
        CHECK_NEAR(st.score[i], one.score[i], 1e-4); /* group sizes change the kernels */
    }
    rerank_result_free(&st);
    rerank_result_free(&one);
    rerank_close(rr);
}

/*
 * An XLM-RoBERTa cross-encoder (bge-reranker-v2-m3's layout: the unigram vocabulary of
 * tests/engine/data, one token type) scores <s> query </s></s> document </s>, the pair
 * Hugging Face and llama.cpp give it; the BERT layout would move every score.
 */
static void test_xlmr_pairs(void)
{
    char path[512], err[ERR_MAX];
    CHECK_MSG(gen_on("tests/engine/data/ugm-docs.gguf", 4, path, sizeof path),
              "tests/engine/data/ugm-docs.gguf: run from the repository");
    rerank_options o = rerank_default_options();
    o.cv_threshold = 0;
    o.top_k = N_DOCS;
    o.mode = RERANK_ORDERED;
    o.n_threads = 2;
    reranker *rr = rerank_open(path, &o, err);
    CHECK_MSG(rr, "%s", err);
    rerank_result res;
    CHECK_MSG(rerank_run(rr, QUERY, DOCS, N_DOCS, NULL, &res, err) == 0, "%s", err);
    gguf_file *g = gguf_open(path, err);
    ref_bert *ref = ref_bert_load(g);
    tokenizer *tok;
    CHECK(ref && tok_load(g, &tok, err) == 0);
    int32_t bos = tok_bos(tok), eos = tok_eos(tok);
    CHECK_EQ(bos, 0);
    CHECK_EQ(eos, 2);
    CHECK_EQ(tok_special(tok, TOK_SPECIAL_SEP), 2);
    double worst = 0, worst_bert = 1;
    for (int i = 0; i < res.n; i++) {
        const char *doc = DOCS[res.index[i]];
        int32_t ids[160], types[160] = {0};
        int n = tok_encode(tok, QUERY, strlen(QUERY), true, false, ids, 160);
        CHECK(ids[0] == bos && ids[n - 1] == eos);
        int nq = n;
        ids[n++] = eos;
        n += tok_encode(tok, doc, strlen(doc), false, false, ids + n, 150 - n);
        ids[n++] = eos;
        double *h = malloc(sizeof(double) * (N_LAYER + 1) * 160 * DIM);
        ref_bert_forward(ref, n, ids, types, h);
        double want = 1.0 / (1.0 + exp(-ref_bert_head(ref, h + (size_t)N_LAYER * n * DIM)));
        /* the BERT layout, one </s> between the texts */
        memmove(ids + nq, ids + nq + 1, (size_t)(n - nq - 1) * sizeof *ids);
        ref_bert_forward(ref, n - 1, ids, types, h);
        double bert = 1.0 / (1.0 + exp(-ref_bert_head(ref, h + (size_t)N_LAYER * (n - 1) * DIM)));
        free(h);
        worst = fmax(worst, fabs(res.score[i] - want));
        worst_bert = fmin(worst_bert, fabs(res.score[i] - bert));
    }
    printf("# xlmr pairs: largest difference from the reference %.2e; the BERT layout's "
           "nearest %.2e\n", worst, worst_bert);
    CHECK(worst < 1e-5);
    CHECK(worst_bert > 1e-4);
    rerank_result_free(&res);
    tok_free(tok);
    ref_bert_free(ref);
    gguf_close(g);
    rerank_close(rr);
}

static void test_embedding_model_refused(void)
{
    char path[512], err[ERR_MAX];
    if (!gen(2, path, sizeof path)) {
        test_skip("../shared/testdata/vocab/ggml-vocab-bert-bge.gguf is absent");
        return;
    }
    CHECK(!rerank_open(path, NULL, err));
    CHECK_MSG(strstr(err, "classification head"), "%s", err);
}

int main(void)
{
    RUN(test_full_matches_reference);
    RUN(test_pruning_and_steps);
    RUN(test_xlmr_pairs);
    RUN(test_embedding_model_refused);
    return test_finish();
}
