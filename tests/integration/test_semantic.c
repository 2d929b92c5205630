/*
 * Embed, Rerank and RerankCalibrate end to end: a real llmsd of this build through
 * libllmsclient, checked against the engine run in this process on the same model.
 *
 * Embed uses a generated model (random weights, synthetic vocabulary); Rerank uses the
 * trained stories260K with fixed "yes"/"no" token ids (it has no such words), so those
 * tests skip without the shared test data. The llms and llmsctl programs of this build
 * are run against the same daemons (llms embed, llms rerank, llmsctl rerank-calibrate).
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/llms.h"
#include "engine/model/embed.h"
#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"
#include "engine/encoder/rerank.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/support/test.h"

#define YES_TOKEN 300
#define NO_TOKEN 301

static char llmsd_path[1024], llms_path[1100], llmsctl_path[1100];
static char tiny_model[1024], cross_model[1024];

static llmsd_proc embed_daemon, rerank_daemon, cross_daemon;
static int embed_up, rerank_up, cross_up;

#define NEED(up, d, start)                                                     \
    do {                                                                       \
        if (!llmsd_path[0])                                                    \
            SKIP("llmsd is not built in this tree");                           \
        if (!(up))                                                             \
            (up) = (start) == 0 ? 1 : -1;                                      \
        CHECK_MSG((up) == 1, "llmsd did not start");                           \
    } while (0)

static int start_embed(void)
{
    if (!tiny_model[0])
        return -1;
    return proc_start(&embed_daemon, llmsd_path, "embed", tiny_model, "embed_max_texts = 4\n");
}

static const char *stories(void)
{
    return test_data_path("models/stories260K.gguf");
}

static int start_rerank(void)
{
    char extra[512];
    proc_fmt(extra, sizeof extra,
             "rerank_yes_token = %d\nrerank_no_token = %d\nrerank_max_documents = 8\n"
             "rerank_max_bytes = 2000\n",
             YES_TOKEN, NO_TOKEN);
    return proc_start(&rerank_daemon, llmsd_path, "rerank", stories(), extra);
}

/* ---- Embed ---- */

static void embed_matches_engine(void)
{
    NEED(embed_up, &embed_daemon, start_embed());
    llms_conn *c = proc_connect(&embed_daemon, "emb-app");
    CHECK(c);
    const char *texts[] = {"Once upon a time", "a cat sat", "Once upon a time"};
    char err[ERR_MAX];
    model *m = model_load(tiny_model, err);
    CHECK_MSG(m, "%s", err);
    tokenizer *tok = NULL;
    CHECK(tok_load(model_gguf(m), &tok, err) == 0);
    model_runner *r = model_runner_new(m, 1, 0, 512, err);
    kv_pool *pool = kv_pool_new(model_kv_shape(m), 0, err);
    embedder *e = embed_new(m, r, pool, err);
    CHECK(e);
    int dim = embed_dim(e);
    for (int pl = 0; pl < 2; pl++) {
        llms_embeddings got;
        CHECK_EQ(llms_embed(c, texts, 3, pl ? LLMS_POOLING_MEAN : LLMS_POOLING_LAST, &got),
                 LLMS_OK);
        CHECK_EQ(got.n, 3);
        CHECK_EQ((int)got.dim, dim);
        for (int i = 0; i < 3; i++) {
            float *want = malloc(sizeof *want * (size_t)dim);
            int n_tok = 0;
            CHECK(embed_text(e, tok, texts[i], pl ? EMBED_MEAN : EMBED_LAST, want, &n_tok,
                             err) == 0);
            CHECK_EQ((int)got.n_tokens[i], n_tok);
            double norm = 0, maxd = 0;
            for (int d = 0; d < dim; d++) {
                float v = got.values[(size_t)i * dim + d];
                norm += (double)v * v;
                maxd = fmax(maxd, fabs(v - want[d]));
            }
            CHECK_NEAR(norm, 1.0, 1e-4);
            CHECK_MSG(maxd < 1e-4, "text %d pooling %d: max diff %g", i, pl, maxd);
            free(want);
        }
        CHECK(memcmp(got.values, got.values + 2 * (size_t)dim, sizeof(float) * (size_t)dim) == 0);
        llms_embeddings_free(&got);
    }
    embed_free(e);
    kv_pool_free(pool);
    model_runner_free(r);
    tok_free(tok);
    model_free(m);
    llms_close(c);
}

static void embed_invalid_requests(void)
{
    NEED(embed_up, &embed_daemon, start_embed());
    llms_conn *c = proc_connect(&embed_daemon, NULL);
    CHECK(c);
    const char *one[] = {"hello"};
    llms_embeddings e;
    CHECK_EQ(llms_embed(c, one, 1, LLMS_POOLING_LAST, &e), LLMS_ERR_FAILED_PRECONDITION);
    CHECK_EQ(llms_bind(c, "emb-bad"), LLMS_OK);
    CHECK_EQ(llms_embed(c, NULL, 0, LLMS_POOLING_LAST, &e), LLMS_ERR_INVALID_ARGUMENT);
    const char *five[] = {"a", "b", "c", "d", "e"};
    CHECK_EQ(llms_embed(c, five, 5, LLMS_POOLING_LAST, &e), LLMS_ERR_INVALID_ARGUMENT);
    CHECK(strstr(llms_last_error(c), "embed_max_texts") != NULL);
    char *long_text = malloc(4001);
    memset(long_text, 'a', 4000);
    long_text[4000] = '\0';
    const char *lt[] = {"fine", long_text};
    CHECK_EQ(llms_embed(c, lt, 2, LLMS_POOLING_MEAN, &e), LLMS_ERR_INVALID_ARGUMENT);
    CHECK(strstr(llms_last_error(c), "text 1") != NULL);
    free(long_text);
    CHECK_EQ(llms_embed(c, one, 1, (enum llms_pooling)9, &e), LLMS_ERR_INVALID_ARGUMENT);
    /* the connection still works */
    CHECK_EQ(llms_embed(c, one, 1, LLMS_POOLING_MEAN, &e), LLMS_OK);
    CHECK_EQ(e.n, 1);
    llms_embeddings_free(&e);
    llms_close(c);
}

/* ---- Rerank ---- */

static const char *QUERY = "Where did the little dog go?";
static const char *DOCS[] = {
    "The little dog went to the park to play with a ball.",
    "Lily ate a big red apple.",
    "Tom saw a bird in the sky. It was blue.",
    "The dog ran to the park and jumped.",
    "Once upon a time there was a girl named Sue.",
    "The sun was hot and the kids went to swim.",
};
#define N_DOCS 6

static void rerank_matches_engine_full_forward(void)
{
    if (!stories())
        SKIP("needs models/stories260K.gguf from the shared test data");
    NEED(rerank_up, &rerank_daemon, start_rerank());
    llms_conn *c = proc_connect(&rerank_daemon, "rr-app");
    CHECK(c);
    llms_rerank_options o;
    llms_rerank_options_init(&o);
    o.top_k = 3;
    o.cv_threshold = 0;
    llms_rerank_result got;
    CHECK_MSG(llms_rerank(c, QUERY, DOCS, N_DOCS, &o, &got) == LLMS_OK, "%s", llms_last_error(c));
    CHECK_EQ(got.n_hits, 3);
    CHECK_EQ(got.n_documents, N_DOCS);

    char err[ERR_MAX];
    rerank_options ro = rerank_default_options();
    ro.yes_token = YES_TOKEN;
    ro.no_token = NO_TOKEN;
    ro.n_threads = 1;
    ro.top_k = 3;
    ro.cv_threshold = 0;
    reranker *rr = rerank_open(stories(), &ro, err);
    CHECK_MSG(rr, "%s", err);
    rerank_result want;
    memset(&want, 0, sizeof want);
    CHECK_MSG(rerank_run(rr, QUERY, DOCS, N_DOCS, &ro, &want, err) == 0, "%s", err);
    CHECK_EQ(want.n, 3);
    CHECK_EQ((size_t)want.n_layer, got.n_layer);
    for (int i = 0; i < want.n && i < (int)got.n_hits; i++) {
        CHECK_EQ((int)got.hits[i].index, want.index[i]);
        CHECK_NEAR(got.hits[i].score, want.score[i], 1e-4);
    }
    for (int i = 0; i < N_DOCS; i++)
        CHECK_EQ((int)got.layers_computed[i], want.n_layer);
    rerank_result_free(&want);
    rerank_close(rr);
    llms_rerank_result_free(&got);
    llms_close(c);
}

/* Set mode with K at least the number of documents: every document is in, and the scores
 * shown are the full forward's (not the first layer's), best first, through the CLI too. */
static void rerank_set_mode_all_documents_has_final_scores(void)
{
    NEED(rerank_up, &rerank_daemon, start_rerank());
    llms_conn *c = proc_connect(&rerank_daemon, "rr-all");
    CHECK(c);
    llms_rerank_options o;
    llms_rerank_options_init(&o);
    o.top_k = N_DOCS + 2;
    o.mode = LLMS_RERANK_SET;
    o.cv_threshold = 0.01f; /* prunes wherever it may */
    llms_rerank_result got;
    CHECK_MSG(llms_rerank(c, QUERY, DOCS, N_DOCS, &o, &got) == LLMS_OK, "%s", llms_last_error(c));
    CHECK_EQ(got.n_hits, N_DOCS);

    char err[ERR_MAX];
    rerank_options ro = rerank_default_options();
    ro.yes_token = YES_TOKEN;
    ro.no_token = NO_TOKEN;
    ro.n_threads = 1;
    ro.top_k = N_DOCS;
    ro.cv_threshold = 0;
    reranker *rr = rerank_open(stories(), &ro, err);
    CHECK_MSG(rr, "%s", err);
    rerank_result want;
    memset(&want, 0, sizeof want);
    CHECK_MSG(rerank_run(rr, QUERY, DOCS, N_DOCS, &ro, &want, err) == 0, "%s", err);
    for (int i = 0; i < want.n && i < (int)got.n_hits; i++) {
        CHECK_EQ((int)got.hits[i].index, want.index[i]);
        CHECK_NEAR(got.hits[i].score, want.score[i], 1e-4);
    }
    for (int i = 0; i < N_DOCS; i++)
        CHECK_EQ((int)got.layers_computed[i], want.n_layer);
    rerank_result_free(&want);
    rerank_close(rr);
    llms_rerank_result_free(&got);
    llms_close(c);
}

static void rerank_invalid_requests(void)
{
    if (!stories())
        SKIP("needs models/stories260K.gguf from the shared test data");
    NEED(rerank_up, &rerank_daemon, start_rerank());
    llms_conn *c = proc_connect(&rerank_daemon, "rr-bad");
    CHECK(c);
    llms_rerank_result r;
    CHECK_EQ(llms_rerank(c, "", DOCS, 2, NULL, &r), LLMS_ERR_INVALID_ARGUMENT);
    CHECK_EQ(llms_rerank(c, QUERY, NULL, 0, NULL, &r), LLMS_ERR_INVALID_ARGUMENT);
    const char *with_empty[] = {DOCS[0], ""};
    CHECK_EQ(llms_rerank(c, QUERY, with_empty, 2, NULL, &r), LLMS_ERR_INVALID_ARGUMENT);
    CHECK(strstr(llms_last_error(c), "document 1 is empty") != NULL);
    const char *nine[9];
    for (int i = 0; i < 9; i++)
        nine[i] = DOCS[i % N_DOCS];
    CHECK_EQ(llms_rerank(c, QUERY, nine, 9, NULL, &r), LLMS_ERR_INVALID_ARGUMENT);
    CHECK(strstr(llms_last_error(c), "rerank_max_documents") != NULL);
    char *big = malloc(2100);
    memset(big, 'x', 2099);
    big[2099] = '\0';
    const char *bigdocs[] = {DOCS[0], big};
    CHECK_EQ(llms_rerank(c, QUERY, bigdocs, 2, NULL, &r), LLMS_ERR_INVALID_ARGUMENT);
    CHECK(strstr(llms_last_error(c), "rerank_max_bytes") != NULL);
    free(big);
    llms_rerank_options o;
    llms_rerank_options_init(&o);
    o.cv_threshold = 0.3f;
    o.target_precision = 0.9f;
    CHECK_EQ(llms_rerank(c, QUERY, DOCS, 2, &o, &r), LLMS_ERR_INVALID_ARGUMENT);
    llms_rerank_options_init(&o);
    o.target_precision = 1.5f;
    CHECK_EQ(llms_rerank(c, QUERY, DOCS, 2, &o, &r), LLMS_ERR_INVALID_ARGUMENT);
    o.target_precision = 0.42f;
    CHECK_EQ(llms_rerank(c, QUERY, DOCS, 2, &o, &r), LLMS_ERR_FAILED_PRECONDITION);
    llms_rerank_options_init(&o);
    o.top_k = 100;
    CHECK_EQ(llms_rerank(c, QUERY, DOCS, 2, &o, &r), LLMS_ERR_INVALID_ARGUMENT);
    o.top_k = 2;
    o.mode = (enum llms_rerank_mode)5;
    CHECK_EQ(llms_rerank(c, QUERY, DOCS, 2, &o, &r), LLMS_ERR_INVALID_ARGUMENT);
    llms_calibration cal;
    CHECK_EQ(llms_rerank_calibrate(c, NULL, 0, 1.0f, 2, LLMS_RERANK_SET, &cal),
             LLMS_ERR_INVALID_ARGUMENT);
    llms_rerank_query q = {QUERY, DOCS, 2};
    CHECK_EQ(llms_rerank_calibrate(c, &q, 1, 0.0f, 2, LLMS_RERANK_SET, &cal),
             LLMS_ERR_INVALID_ARGUMENT);
    llms_close(c);
}

static int start_cross(void)
{
    char extra[1200];
    if (!cross_model[0])
        return -1;
    proc_fmt(extra, sizeof extra, "rerank_model = %s\nembed_model = %s\n", cross_model,
             cross_model);
    return proc_start(&cross_daemon, llmsd_path, "cross", tiny_model, extra);
}

/* A cross-encoder (pooling_type rank) given the embed role embeds only with a pooling
 * named: its CLS state is no embedding its file stands for, as a decoder reranker's last
 * state is none. */
static void cross_encoder_embeds_only_with_a_pooling(void)
{
    if (!cross_model[0])
        SKIP("needs vocab/ggml-vocab-bert-bge.gguf from the shared test data");
    NEED(cross_up, &cross_daemon, start_cross());
    llms_conn *c = proc_connect(&cross_daemon, "emb-cross");
    CHECK(c);
    const char *texts[] = {"a ball"};
    llms_embeddings e;
    CHECK_EQ(llms_embed(c, texts, 1, LLMS_POOLING_MODEL, &e), LLMS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(llms_last_error(c), "pooling_type is rank") != NULL, "%s",
              llms_last_error(c));
    CHECK_MSG(llms_embed(c, texts, 1, LLMS_POOLING_CLS, &e) == LLMS_OK, "%s",
              llms_last_error(c));
    CHECK(e.n == 1 && e.dim > 0);
    llms_embeddings_free(&e);
    llms_close(c);
}

/* A query that leaves a bert cross-encoder no room for a document is the caller's
 * error, as a text too long to embed is, not the daemon's. */
static void rerank_query_too_long_for_encoder(void)
{
    if (!cross_model[0])
        SKIP("needs vocab/ggml-vocab-bert-bge.gguf from the shared test data");
    NEED(cross_up, &cross_daemon, start_cross());
    llms_conn *c = proc_connect(&cross_daemon, "rr-cross");
    CHECK(c);
    char query[1300] = "";
    for (int i = 0; i < 200; i++)
        strcat(query, "word ");
    llms_rerank_result r;
    CHECK_EQ(llms_rerank(c, query, DOCS, 2, NULL, &r), LLMS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(llms_last_error(c), "query") != NULL, "%s", llms_last_error(c));
    llms_rerank_query q = {query, DOCS, 2};
    llms_calibration cal;
    CHECK_EQ(llms_rerank_calibrate(c, &q, 1, 1.0f, 1, LLMS_RERANK_SET, &cal),
             LLMS_ERR_INVALID_ARGUMENT);
    /* a query that fits is answered */
    CHECK_MSG(llms_rerank(c, QUERY, DOCS, 2, NULL, &r) == LLMS_OK, "%s", llms_last_error(c));
    CHECK_EQ(r.n_hits, 2);
    llms_rerank_result_free(&r);
    llms_close(c);
}

/* A query that leaves a decoder reranker no room for a document in the model's
 * positions (stories260K: 512) is the caller's error, as on a cross-encoder, in Rerank
 * and RerankCalibrate alike; a document too long is cut to fit, not refused. */
static void rerank_query_too_long_for_decoder(void)
{
    if (!stories())
        SKIP("needs models/stories260K.gguf from the shared test data");
    NEED(rerank_up, &rerank_daemon, start_rerank());
    llms_conn *c = proc_connect(&rerank_daemon, "rr-window");
    CHECK(c);
    char query[700] = "", doc[1300] = "";
    for (int i = 0; i < 200; i++) /* about 600 tokens in the stories vocabulary */
        strcat(query, "xq ");
    for (int i = 0; i < 400; i++)
        strcat(doc, "xq ");
    llms_rerank_result r;
    CHECK_EQ(llms_rerank(c, query, DOCS, 2, NULL, &r), LLMS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(llms_last_error(c), "query") && strstr(llms_last_error(c), "no room"),
              "%s", llms_last_error(c));
    llms_rerank_query q = {query, DOCS, 2};
    llms_calibration cal;
    CHECK_EQ(llms_rerank_calibrate(c, &q, 1, 1.0f, 1, LLMS_RERANK_SET, &cal),
             LLMS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(llms_last_error(c), "no room"), "%s", llms_last_error(c));
    const char *long_docs[] = {DOCS[0], doc};
    CHECK_MSG(llms_rerank(c, QUERY, long_docs, 2, NULL, &r) == LLMS_OK, "%s",
              llms_last_error(c));
    CHECK_EQ(r.n_hits, 2);
    llms_rerank_result_free(&r);
    llms_close(c);
}

/* Calibration stores a threshold; a target_precision call then uses it, and at
 * precision 1 every calibration query keeps the full forward's top-K. */
static void calibrate_then_target_precision(void)
{
    if (!stories())
        SKIP("needs models/stories260K.gguf from the shared test data");
    NEED(rerank_up, &rerank_daemon, start_rerank());
    llms_conn *c = proc_connect(&rerank_daemon, "rr-cal");
    CHECK(c);
    static const char *docs2[] = {"Sue had a red ball.", "The ball was big and red.",
                                  "A fish swam in the pond.", "Tom liked his toy car.",
                                  "The red ball rolled away."};
    llms_rerank_query qs[] = {{QUERY, DOCS, N_DOCS}, {"What color was the ball?", docs2, 5}};
    llms_calibration cal;
    CHECK_MSG(llms_rerank_calibrate(c, qs, 2, 1.0f, 2, LLMS_RERANK_SET, &cal) == LLMS_OK, "%s",
              llms_last_error(c));
    CHECK(cal.n_grid >= 1);
    CHECK(cal.found ? cal.cv_threshold > 0 && cal.precision >= 1.0f : cal.cv_threshold == 0);
    for (size_t i = 1; i < cal.n_grid; i++)
        CHECK(cal.grid[i] > cal.grid[i - 1]);
    for (size_t i = 0; i + 1 < cal.n_grid; i++)
        CHECK(cal.grid_precision[i] < 1.0f);

    for (int q = 0; q < 2; q++) {
        llms_rerank_options o;
        llms_rerank_options_init(&o);
        o.top_k = 2;
        o.cv_threshold = 0;
        llms_rerank_result full, tuned;
        CHECK_EQ(llms_rerank(c, qs[q].query, qs[q].documents, qs[q].n_documents, &o, &full),
                 LLMS_OK);
        llms_rerank_options_init(&o);
        o.top_k = 2;
        o.target_precision = 1.0f;
        CHECK_EQ(llms_rerank(c, qs[q].query, qs[q].documents, qs[q].n_documents, &o, &tuned),
                 LLMS_OK);
        CHECK_NEAR(tuned.cv_threshold, cal.cv_threshold, 1e-6);
        CHECK_EQ(tuned.n_hits, full.n_hits);
        for (size_t i = 0; i < tuned.n_hits; i++) {
            int in = 0;
            for (size_t j = 0; j < full.n_hits; j++)
                in |= tuned.hits[i].index == full.hits[j].index;
            CHECK_MSG(in, "query %d: document %u is not in the full top-2", q,
                      tuned.hits[i].index);
        }
        llms_rerank_result_free(&full);
        llms_rerank_result_free(&tuned);
    }
    llms_close(c);

    /* The threshold is kept in the store: it survives a restart. */
    CHECK_EQ(proc_stop(&rerank_daemon, SIGTERM), 0);
    rerank_up = start_rerank() == 0 ? 1 : -1;
    CHECK_MSG(rerank_up == 1, "llmsd did not restart");
    c = proc_connect(&rerank_daemon, "rr-cal");
    CHECK(c);
    llms_rerank_options o;
    llms_rerank_options_init(&o);
    o.top_k = 2;
    o.target_precision = 1.0f;
    llms_rerank_result r;
    CHECK_EQ(llms_rerank(c, QUERY, DOCS, N_DOCS, &o, &r), LLMS_OK);
    CHECK_NEAR(r.cv_threshold, cal.cv_threshold, 1e-6);
    llms_rerank_result_free(&r);
    llms_calibration_free(&cal);
    llms_close(c);
}

/* ---- the command line programs ---- */

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void cli_embed(void)
{
    NEED(embed_up, &embed_daemon, start_embed());
    char cmd[4096], out[65536];
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' embed 'a cat sat' 'Once upon a time'",
             llms_path, embed_daemon.sock);
    CHECK_EQ(test_run_capture(cmd, out, sizeof out), 0);
    llms_conn *c = proc_connect(&embed_daemon, LLMS_DEFAULT_APP);
    CHECK(c);
    const char *texts[] = {"a cat sat", "Once upon a time"};
    llms_embeddings e;
    CHECK_EQ(llms_embed(c, texts, 2, LLMS_POOLING_LAST, &e), LLMS_OK);
    char *p = out;
    for (size_t i = 0; i < e.n; i++) {
        for (uint32_t d = 0; d < e.dim; d++) {
            char *end;
            double v = strtod(p, &end);
            CHECK_MSG(end != p, "vector %zu value %u missing in: %.200s", i, d, out);
            CHECK_NEAR(v, e.values[i * e.dim + d], 1e-5);
            p = end;
        }
        CHECK(*p == '\n');
        p++;
    }
    CHECK(*p == '\0');
    llms_embeddings_free(&e);
    llms_close(c);

    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' --json embed --pooling mean hello",
             llms_path, embed_daemon.sock);
    CHECK_EQ(test_run_capture(cmd, out, sizeof out), 0);
    const char *head = "{\"dim\": 64, \"vectors\": [{\"n_tokens\": ";
    CHECK_MSG(strncmp(out, head, strlen(head)) == 0, "%.100s", out);
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' embed 2>/dev/null", llms_path,
             embed_daemon.sock);
    CHECK_EQ(test_run_capture(cmd, out, sizeof out), 2);
}

static void cli_rerank_and_calibrate(void)
{
    if (!stories())
        SKIP("needs models/stories260K.gguf from the shared test data");
    NEED(rerank_up, &rerank_daemon, start_rerank());
    char files[4][700], cmd[8192], out[16384];
    for (int i = 0; i < 4; i++) {
        proc_fmt(files[i], sizeof files[i], "%s/doc%d.txt", test_tmpdir(), i);
        write_file(files[i], DOCS[i]);
    }
    proc_fmt(cmd, sizeof cmd,
             "'%s' --socket '%s' rerank -q '%s' -k 2 --threshold 0 '%s' '%s' '%s' '%s'",
             llms_path, rerank_daemon.sock, QUERY, files[0], files[1], files[2], files[3]);
    CHECK_EQ(test_run_capture(cmd, out, sizeof out), 0);
    llms_conn *c = proc_connect(&rerank_daemon, LLMS_DEFAULT_APP);
    CHECK(c);
    llms_rerank_options o;
    llms_rerank_options_init(&o);
    o.top_k = 2;
    o.cv_threshold = 0;
    llms_rerank_result r;
    CHECK_EQ(llms_rerank(c, QUERY, DOCS, 4, &o, &r), LLMS_OK);
    char want[2048];
    proc_fmt(want, sizeof want, "rank  index     score  file\n   1  %5u  %.6f  %s\n   2  %5u  %.6f  %s\n",
             r.hits[0].index, r.hits[0].score, files[r.hits[0].index], r.hits[1].index,
             r.hits[1].score, files[r.hits[1].index]);
    CHECK_MSG(strncmp(out, want, strlen(want)) == 0, "got:\n%s\nwant:\n%s", out, want);
    CHECK(strstr(out, "layers computed: ") != NULL);
    llms_rerank_result_free(&r);
    llms_close(c);

    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' --json rerank -q '%s' -k 1 '%s' '%s'",
             llms_path, rerank_daemon.sock, QUERY, files[0], files[1]);
    CHECK_EQ(test_run_capture(cmd, out, sizeof out), 0);
    const char *head = "{\"hits\": [{\"rank\": 1, \"index\": ";
    CHECK_MSG(strncmp(out, head, strlen(head)) == 0, "%s", out);
    CHECK(strstr(out, "\"pruned_at_layer\": [") != NULL);
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' rerank -q '%s' '%s/missing' 2>/dev/null",
             llms_path, rerank_daemon.sock, QUERY, test_tmpdir());
    CHECK_EQ(test_run_capture(cmd, out, sizeof out), 1);

    char set[700];
    proc_fmt(set, sizeof set, "%s/set.txt", test_tmpdir());
    write_file(set, "# calibration set\nQ: Where did the little dog go?\n"
                    "D: The little dog went to the park.\nD: Lily ate a big red apple.\n"
                    "D: The dog ran to the park.\n\nQ: What color was the ball?\n"
                    "D:The ball was red.\nD: A fish swam.\nD: Tom liked his car.\n");
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' --json rerank-calibrate --precision 1 -k 1 '%s'",
             llmsctl_path, rerank_daemon.sock, set);
    CHECK_EQ(test_run_capture(cmd, out, sizeof out), 0);
    CHECK_MSG(strncmp(out, "{\"found\":", strlen("{\"found\":")) == 0 && strstr(out, "\"grid\":[{"),
              "%s", out);
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' rerank-calibrate --precision 1 -k 1 '%s'",
             llmsctl_path, rerank_daemon.sock, set);
    CHECK_EQ(test_run_capture(cmd, out, sizeof out), 0);
    CHECK_MSG(strstr(out, "stored threshold") || strstr(out, "stored 0"), "%s", out);
    /* the stored threshold now serves --precision 1 */
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' rerank -q '%s' -k 1 --precision 1 '%s' '%s'",
             llms_path, rerank_daemon.sock, QUERY, files[0], files[1]);
    CHECK_EQ(test_run_capture(cmd, out, sizeof out), 0);

    write_file(set, "D: a document first\n");
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' rerank-calibrate --precision 1 '%s' 2>&1",
             llmsctl_path, rerank_daemon.sock, set);
    CHECK_EQ(test_run_capture(cmd, out, sizeof out), 2);
    CHECK_MSG(strstr(out, "set.txt:1: a document before any query") != NULL, "%s", out);
    write_file(set, "Q: lonely\n");
    CHECK_EQ(test_run_capture(cmd, out, sizeof out), 2);
    CHECK_MSG(strstr(out, "has no documents") != NULL, "%s", out);
    write_file(set, "Q: q\nX: what\n");
    CHECK_EQ(test_run_capture(cmd, out, sizeof out), 2);
    CHECK_MSG(strstr(out, "set.txt:2: expected") != NULL, "%s", out);
}

int main(int argc, char **argv)
{
    (void)argc;
    signal(SIGPIPE, SIG_IGN);
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    if (llmsd_path[0]) {
        /* The clients sit beside llmsd: replace its name at the end of the path. */
        int dir_len = (int)strlen(llmsd_path) - (int)strlen("llmsd");
        proc_fmt(llms_path, sizeof llms_path, "%.*sllms", dir_len, llmsd_path);
        proc_fmt(llmsctl_path, sizeof llmsctl_path, "%.*sllmsctl", dir_len, llmsd_path);
    }
    modelgen_params mp = {
        .arch = "qwen3", .dim = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 128,
        .n_ctx = 512, .type = QTYPE_F32, .seed = 5, .n_vocab = 300, .n_threads = 1,
    };
    proc_generate_model(tiny_model, sizeof tiny_model, "tiny.gguf", &mp);
    const char *vp = test_data_path("vocab/ggml-vocab-bert-bge.gguf");
    char err[ERR_MAX];
    gguf_file *v = vp ? gguf_open(vp, err) : NULL;
    if (v) {
        modelgen_params bp = proc_bert_params(v);
        bp.pooling_type = 4; /* rank: the cross-encoder head */
        proc_generate_model(cross_model, sizeof cross_model, "cross.gguf", &bp);
        gguf_close(v);
    }
    RUN(embed_matches_engine);
    RUN(embed_invalid_requests);
    RUN(rerank_matches_engine_full_forward);
    RUN(rerank_set_mode_all_documents_has_final_scores);
    RUN(rerank_invalid_requests);
    RUN(rerank_query_too_long_for_encoder);
    RUN(rerank_query_too_long_for_decoder);
    RUN(cross_encoder_embeds_only_with_a_pooling);
    RUN(calibrate_then_target_precision);
    RUN(cli_embed);
    RUN(cli_rerank_and_calibrate);
    if (embed_up == 1 && proc_stop(&embed_daemon, SIGTERM) != 0)
        fprintf(stderr, "the embed llmsd did not exit cleanly\n");
    if (rerank_up == 1 && proc_stop(&rerank_daemon, SIGTERM) != 0)
        fprintf(stderr, "the rerank llmsd did not exit cleanly\n");
    if (cross_up == 1 && proc_stop(&cross_daemon, SIGTERM) != 0)
        fprintf(stderr, "the cross-encoder llmsd did not exit cleanly\n");
    return test_finish();
}
