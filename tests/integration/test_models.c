/*
 * bert encoders in a running llmsd: a daemon whose main model is a small decoder answers
 * Embed with its embed_model (a bert encoder) or a registry model by name (a nomic-bert
 * encoder) and Rerank with its rerank_model (a bert cross-encoder), each checked against
 * the engine in this process. Generated models on the shared bge vocabulary: skips
 * without it. A decoder whose file pools by rank (a reranker's scores) given as
 * embed_model stops the daemon at start with a message naming the model and why.
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/llms.h"
#include "engine/encoder/bert.h"
#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"
#include "engine/encoder/rerank.h"
#include "engine/tok/tokenizer.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/support/test.h"

static char llmsd_path[1024], decoder[1024], ranking_decoder[1024], encoder[1024], cross[1024],
    nomic[1024];
static llmsd_proc daemon_;
static int up;

static const char *const QUERY = "where do cats sleep";
static const char *const DOCS[] = {"cats sleep on warm windows", "the stock market fell",
                                   "dogs bark at night", "a cat naps in the sun all day",
                                   "rain is expected tomorrow"};
#define N_DOCS 5

static int start(void)
{
    char extra[4200];
    proc_fmt(extra, sizeof extra, "embed_model = %s\nrerank_model = %s\nmodel.nomic = %s embed\n",
             encoder, cross, nomic);
    return proc_start(&daemon_, llmsd_path, "models", decoder, extra);
}

#define NEED()                                                                 \
    do {                                                                       \
        if (!llmsd_path[0])                                                    \
            SKIP("llmsd is not built in this tree");                           \
        if (!encoder[0])                                                       \
            SKIP("../shared/testdata/vocab/ggml-vocab-bert-bge.gguf is absent"); \
        if (!up)                                                               \
            up = start() == 0 ? 1 : -1;                                        \
        CHECK_MSG(up == 1, "llmsd did not start");                             \
    } while (0)

/* Embed through llmsd with the model named name (NULL: the default) against the engine's
 * mean-pooled vectors of the file at path. */
static void check_embed(llms_conn *c, const char *name, const char *path)
{
    const char *texts[] = {"Hello world", "cats sleep on warm windows", "Hello world"};
    llms_embeddings got;
    CHECK_MSG(llms_embed_model(c, name, texts, 3, LLMS_POOLING_MEAN, &got) == LLMS_OK, "%s",
              llms_last_error(c));
    char err[ERR_MAX];
    bert_model *m = bert_load(path, err);
    CHECK_MSG(m, "%s", err);
    tokenizer *tok;
    CHECK(tok_load(bert_gguf(m), &tok, err) == 0);
    bert_runner *r = bert_runner_new(m, 1, 0, err);
    CHECK(r);
    int dim = bert_hparams_of(m)->dim;
    CHECK_EQ((int)got.dim, dim);
    CHECK_EQ(got.n, 3);
    float *want = malloc(sizeof *want * (size_t)dim);
    for (int i = 0; i < 3; i++) {
        int32_t ids[64];
        int n = tok_encode(tok, texts[i], strlen(texts[i]), true, false, ids, 64);
        CHECK_EQ((int)got.n_tokens[i], n);
        CHECK(bert_embed(r, 1, &n, ids, NULL, BERT_POOL_MEAN, want, err) == 0);
        for (int d = 0; d < dim; d++)
            CHECK_NEAR(got.values[(size_t)i * dim + d], want[d], 1e-4);
    }
    free(want);
    llms_embeddings_free(&got);
    bert_runner_free(r);
    tok_free(tok);
    bert_free(m);
}

static void embed_on_bert_matches_engine(void)
{
    NEED();
    llms_conn *c = proc_connect(&daemon_, "emb");
    CHECK(c);
    check_embed(c, NULL, encoder);
    llms_embeddings got;
    /* a text longer than the encoder's positions is refused with a message */
    char *big = malloc(4000);
    for (int i = 0; i < 1999; i++)
        memcpy(big + 2 * i, "a ", 2);
    big[3998] = 0;
    const char *one[] = {big};
    CHECK_EQ(llms_embed(c, one, 1, LLMS_POOLING_MEAN, &got), LLMS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(llms_last_error(c), "encoder's positions"), "%s", llms_last_error(c));
    free(big);
    llms_close(c);
}

/* A nomic-bert file in the registry embeds by name, as the engine does; llmsctl models'
 * list shows its architecture. */
static void embed_on_nomic_bert_matches_engine(void)
{
    NEED();
    llms_conn *c = proc_connect(&daemon_, "nomic");
    CHECK(c);
    check_embed(c, "nomic", nomic);
    llms_model_info *ms;
    size_t n;
    CHECK_MSG(llms_list_models(c, &ms, &n) == LLMS_OK, "%s", llms_last_error(c));
    const llms_model_info *e = NULL;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(ms[i].name, "nomic"))
            e = &ms[i];
    CHECK(e);
    CHECK_MSG(!strcmp(e->arch, "nomic-bert") && !strcmp(e->type, "encoder") &&
                  !strcmp(e->roles, "embed"),
              "%s %s %s", e->arch, e->type, e->roles);
    llms_model_list_free(ms, n);
    llms_close(c);
}

static void rerank_on_cross_encoder_matches_engine(void)
{
    NEED();
    llms_conn *c = proc_connect(&daemon_, "rr");
    CHECK(c);
    llms_rerank_options o;
    llms_rerank_options_init(&o);
    o.top_k = 3;
    o.cv_threshold = 0;
    o.mode = LLMS_RERANK_ORDERED;
    llms_rerank_result got;
    CHECK_MSG(llms_rerank(c, QUERY, DOCS, N_DOCS, &o, &got) == LLMS_OK, "%s",
              llms_last_error(c));
    char err[ERR_MAX];
    rerank_options ro = rerank_default_options();
    ro.top_k = 3;
    ro.cv_threshold = 0;
    ro.mode = RERANK_ORDERED;
    ro.n_threads = 1;
    reranker *rr = rerank_open(cross, &ro, err);
    CHECK_MSG(rr, "%s", err);
    rerank_result want;
    CHECK(rerank_run(rr, QUERY, DOCS, N_DOCS, NULL, &want, err) == 0);
    CHECK_EQ((int)got.n_hits, want.n);
    for (int i = 0; i < want.n; i++) {
        CHECK_EQ((int)got.hits[i].index, want.index[i]);
        CHECK_NEAR(got.hits[i].score, want.score[i], 1e-4);
    }
    rerank_result_free(&want);
    rerank_close(rr);
    llms_rerank_result_free(&got);
    llms_close(c);
}

static void rank_pooling_embed_model_is_refused(void)
{
    if (!llmsd_path[0])
        SKIP("needs llmsd");
    llmsd_proc d;
    char extra[1200];
    proc_fmt(extra, sizeof extra, "embed_model = %s\n", ranking_decoder);
    fprintf(stderr, "(a failing start is expected; its log follows)\n");
    CHECK(proc_start(&d, llmsd_path, "bad-embed", decoder, extra) != 0);
    char cmd[1200], out[4096];
    proc_fmt(cmd, sizeof cmd, "cat '%s'", d.log);
    CHECK_EQ(test_run_capture(cmd, out, sizeof out), 0);
    CHECK_MSG(strstr(out, "'ranking'") && strstr(out, "embed role") && strstr(out, "rank"), "%s",
              out);
}

int main(int argc, char **argv)
{
    (void)argc;
    signal(SIGPIPE, SIG_IGN);
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    modelgen_params mp = {.arch = "llama", .dim = 32, .n_layer = 1, .n_head = 2,
                          .n_head_kv = 2, .n_ff = 64, .n_ctx = 512, .type = QTYPE_F32,
                          .seed = 1, .n_vocab = 100, .n_threads = 1};
    proc_generate_model(decoder, sizeof decoder, "decoder.gguf", &mp);
    mp.pooling_type = 4;
    proc_generate_model(ranking_decoder, sizeof ranking_decoder, "ranking.gguf", &mp);
    mp.pooling_type = 0;
    const char *vp = test_data_path("vocab/ggml-vocab-bert-bge.gguf");
    char err[ERR_MAX];
    gguf_file *v = vp ? gguf_open(vp, err) : NULL;
    if (v) {
        modelgen_params bp = proc_bert_params(v);
        proc_generate_model(encoder, sizeof encoder, "encoder.gguf", &bp);
        bp.pooling_type = 4;
        bp.seed = 3;
        proc_generate_model(cross, sizeof cross, "cross.gguf", &bp);
        bp.arch = "nomic-bert";
        bp.pooling_type = 1;
        bp.seed = 4;
        proc_generate_model(nomic, sizeof nomic, "nomic.gguf", &bp);
        gguf_close(v);
    }
    RUN(embed_on_bert_matches_engine);
    RUN(embed_on_nomic_bert_matches_engine);
    RUN(rerank_on_cross_encoder_matches_engine);
    RUN(rank_pooling_embed_model_is_refused);
    if (up == 1 && proc_stop(&daemon_, SIGTERM) != 0)
        fprintf(stderr, "llmsd did not exit cleanly\n");
    return test_finish();
}
