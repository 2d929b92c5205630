/*
 * test_xlmr.c — XLM-RoBERTa's encoders served, in the layout of bge-m3 and
 * bge-reranker-v2-m3: an embedding model (CLS pooling) and a cross-encoder generated on
 * the unigram vocabulary of tests/engine/data, one token type, in a real llmsd.
 * /v1/embeddings gives the engine's vector of a multilingual text whose full-width
 * letters and ligature NFKC folds, counting its <s> and </s>; /v1/rerank gives the
 * engine's scores and order of <s> query </s></s> document </s> pairs.
 */
#include <json-c/json.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/encoder/bert.h"
#include "engine/encoder/rerank.h"
#include "engine/gguf/gguf.h"
#include "engine/tok/tokenizer.h"
#include "tests/integration/httpc.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/support/test.h"

#define VOCAB "tests/engine/data/ugm-docs.gguf"
#define TEXT "Le serveur r\xc3\xa9pond \xc3\xa0 chaque requ\xc3\xaate: \xef\xbc\xa1\xef\xbc\xa2 \xef\xac\x81le"
#define N_DOCS 4

static const char *const QUERY = "Which directive sets the port the server listens on?";
static const char *const DOCS[N_DOCS] = {
    "Listen 80 makes the server accept connections on port 80.",
    "DocumentRoot names the directory of the served files.",
    "Der Server antwortet auf jede Anfrage mit einem Statuscode.",
    "\xe6\x9c\x8d\xe5\x8a\xa1\xe5\x99\xa8\xe8\xbf\x94\xe5\x9b\x9e\xe7\x8a\xb6\xe6\x80\x81\xe7\xa0\x81",
};

static char llmsd_path[1024], gen_path[1024], emb_path[1024], rr_path[1024], hsock[1024];
static llmsd_proc daemon_;
static int daemon_up;

#define NEED()                                                                        \
    do {                                                                              \
        if (!llmsd_path[0])                                                           \
            SKIP("llmsd is not built in this tree");                                  \
        CHECK_MSG(gen_path[0] && emb_path[0] && rr_path[0], "models not generated");  \
        if (!daemon_up)                                                               \
            daemon_up = start_daemon() == 0 ? 1 : -1;                                 \
        CHECK_MSG(daemon_up == 1, "llmsd did not start");                             \
    } while (0)

static int start_daemon(void)
{
    char extra[4096];
    proc_fmt(hsock, sizeof hsock, "%s/xlmr-h.sock", test_tmpdir());
    proc_fmt(extra, sizeof extra, "model.m3 = %s embed\nrerank_model = %s\nhttp_socket = %s\n",
             emb_path, rr_path, hsock);
    return proc_start(&daemon_, llmsd_path, "xlmr", gen_path, extra);
}

/* The embedding of TEXT as the engine computes it: <s> text </s>, CLS row, unit length. */
static int engine_embedding(float *out, int *n_tokens)
{
    char err[ERR_MAX];
    gguf_file *g = gguf_open(emb_path, err);
    bert_model *m = g ? bert_from_gguf(g, err) : NULL;
    bert_runner *r = m ? bert_runner_new(m, 1, 64, err) : NULL;
    tokenizer *tok = NULL;
    int rc = -1;
    if (r && tok_load(g, &tok, err) == 0) {
        int32_t ids[64];
        int n = tok_encode(tok, TEXT, strlen(TEXT), true, false, ids, 64);
        *n_tokens = n;
        if (n > 2 && n <= 64 && ids[0] == tok_bos(tok) && ids[n - 1] == tok_eos(tok))
            rc = bert_embed(r, 1, &n, ids, NULL, BERT_POOL_CLS, out, err);
    }
    if (rc)
        fprintf(stderr, "engine embedding: %s\n", err);
    tok_free(tok);
    bert_runner_free(r);
    bert_free(m);
    gguf_close(g);
    return rc;
}

static void embeddings_equal_the_engine(void)
{
    NEED();
    float want[64];
    int n_tokens = 0;
    CHECK(engine_embedding(want, &n_tokens) == 0);
    int st;
    json_object *o = httpc_post_json(hsock, "/v1/embeddings",
                                     "{\"model\":\"m3\",\"input\":\"" TEXT "\"}", &st);
    CHECK_MSG(o && st == 200, "%d", st);
    json_object *v = NULL;
    CHECK(json_object_object_get_ex(json_object_array_get_idx(json_object_object_get(o, "data"),
                                                               0),
                                    "embedding", &v));
    CHECK_EQ(json_object_array_length(v), 64);
    double worst = 0;
    for (int d = 0; d < 64; d++)
        worst = fmax(worst, fabs(json_object_get_double(json_object_array_get_idx(v, d)) - want[d]));
    CHECK_MSG(worst < 1e-5, "largest difference %.3g", worst);
    CHECK_EQ(atoi(httpc_jstr(o, "usage.prompt_tokens")), n_tokens);
    json_object_put(o);
}

static void rerank_equals_the_engine(void)
{
    NEED();
    char err[ERR_MAX];
    rerank_options opt = rerank_default_options();
    opt.top_k = N_DOCS;
    opt.mode = RERANK_ORDERED;
    opt.n_threads = 1;
    reranker *rr = rerank_open(rr_path, &opt, err);
    CHECK_MSG(rr, "%s", err);
    rerank_result want;
    CHECK_MSG(rerank_run(rr, QUERY, DOCS, N_DOCS, NULL, &want, err) == 0, "%s", err);
    rerank_close(rr);
    CHECK_EQ(want.n, N_DOCS);

    char body[2048];
    int len = snprintf(body, sizeof body, "{\"query\":\"%s\",\"top_n\":%d,\"documents\":[", QUERY,
                       N_DOCS);
    for (int i = 0; i < N_DOCS; i++)
        len += snprintf(body + len, sizeof body - (size_t)len, "%s\"%s\"", i ? "," : "", DOCS[i]);
    snprintf(body + len, sizeof body - (size_t)len, "]}");
    int st;
    json_object *o = httpc_post_json(hsock, "/v1/rerank", body, &st), *res = NULL;
    CHECK_MSG(o && st == 200, "%d", st);
    CHECK(json_object_object_get_ex(o, "results", &res));
    CHECK_EQ(json_object_array_length(res), N_DOCS);
    for (int i = 0; i < N_DOCS; i++) {
        json_object *h = json_object_array_get_idx(res, (size_t)i), *v;
        CHECK(json_object_object_get_ex(h, "index", &v));
        CHECK_EQ(json_object_get_int(v), want.index[i]);
        CHECK(json_object_object_get_ex(h, "relevance_score", &v));
        CHECK_NEAR(json_object_get_double(v), want.score[i], 1e-5);
    }
    json_object_put(o);
    rerank_result_free(&want);
}

static void daemon_exits_cleanly(void)
{
    proc_check_clean_exit(&daemon_, &daemon_up);
}

/* A small llama on a synthetic vocabulary (the default generate model), and the two
 * encoders on the unigram vocabulary. */
static void make_models(void)
{
    char err[ERR_MAX];
    modelgen_params gp = {.arch = "llama", .dim = 32, .n_layer = 1, .n_head = 2,
                          .n_head_kv = 2, .n_ff = 64, .n_ctx = 128, .type = QTYPE_F32,
                          .seed = 1, .n_vocab = 64, .n_threads = 1};
    proc_generate_model(gen_path, sizeof gen_path, "gen.gguf", &gp);
    gguf_file *v = gguf_open(VOCAB, err);
    if (!v) {
        fprintf(stderr, "%s: %s (run from the repository)\n", VOCAB, err);
        return;
    }
    modelgen_params bp = {.arch = "bert", .dim = 64, .n_layer = 2, .n_head = 4,
                          .n_head_kv = 4, .n_ff = 128, .n_ctx = 256, .type = QTYPE_F16,
                          .seed = 3, .vocab = v, .n_threads = 1, .pooling_type = 2};
    proc_generate_model(emb_path, sizeof emb_path, "m3-embed.gguf", &bp);
    bp.pooling_type = 4;
    bp.seed = 4;
    proc_generate_model(rr_path, sizeof rr_path, "m3-rerank.gguf", &bp);
    gguf_close(v);
}

int main(int argc, char **argv)
{
    (void)argc;
    signal(SIGPIPE, SIG_IGN);
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    make_models();
    RUN(embeddings_equal_the_engine);
    RUN(rerank_equals_the_engine);
    RUN(daemon_exits_cleanly);
    return test_finish();
}
