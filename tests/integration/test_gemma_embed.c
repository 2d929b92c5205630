/*
 * test_gemma_embed.c — EmbeddingGemma served: a "gemma-embedding" model with its dense
 * layers, generated on a Gemma-like SentencePiece vocabulary (tests/support/gemma_vocab.c
 * from the shared test data's SPM vocabulary, with add_eos_token as EmbeddingGemma's
 * files have it), as `model.NAME = PATH embed` in a real llmsd. /v1/embeddings gives the
 * engine's vector of each text, tokenized as <bos> text <eos>, alone and in a batch.
 */
#include <json-c/json.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/encoder/bert.h"
#include "engine/gguf/gguf.h"
#include "engine/tok/tokenizer.h"
#include "tests/integration/httpc.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/support/gemma_vocab.h"
#include "tests/support/test.h"

#define DIM 64
#define N_TEXTS 2

static const char *const TEXTS[N_TEXTS] = {
    "The embedding of this sentence reads every token in both directions at once.",
    "A second text, shorter.",
};

static char llmsd_path[1024], gen_path[1024], emb_path[1024], hsock[1024];
static llmsd_proc daemon_;
static int daemon_up;

#define NEED()                                                                          \
    do {                                                                                \
        if (!llmsd_path[0])                                                             \
            SKIP("llmsd is not built in this tree");                                    \
        if (!emb_path[0])                                                               \
            SKIP("no vocab/ggml-vocab-llama-spm.gguf in the test data (LLMS_TESTDATA)"); \
        CHECK_MSG(gen_path[0], "models not generated");                                 \
        if (!daemon_up)                                                                 \
            daemon_up = start_daemon() == 0 ? 1 : -1;                                   \
        CHECK_MSG(daemon_up == 1, "llmsd did not start");                               \
    } while (0)

static int start_daemon(void)
{
    char extra[4096];
    proc_fmt(hsock, sizeof hsock, "%s/gemb-h.sock", test_tmpdir());
    proc_fmt(extra, sizeof extra, "model.gemb = %s embed\nhttp_socket = %s\n", emb_path, hsock);
    return proc_start(&daemon_, llmsd_path, "gemb", gen_path, extra);
}

/* The engine's embedding of text into out (DIM): <bos> text <eos>, mean pooling, the
 * dense layers, unit length; its token count into *n_tokens. */
static int engine_embedding(const char *text, float *out, int *n_tokens)
{
    char err[ERR_MAX] = "";
    gguf_file *g = gguf_open(emb_path, err);
    bert_model *m = g ? bert_from_gguf(g, err) : NULL;
    bert_runner *r = m ? bert_runner_new(m, 1, 128, err) : NULL;
    tokenizer *tok = NULL;
    int rc = -1;
    if (r && tok_load(g, &tok, err) == 0) {
        int32_t ids[128];
        int n = tok_encode(tok, text, strlen(text), true, false, ids, 128);
        *n_tokens = n;
        if (n > 2 && n <= 128 && ids[0] == tok_bos(tok) && ids[n - 1] == tok_eos(tok))
            rc = bert_embed(r, 1, &n, ids, NULL, BERT_POOL_MEAN, out, err);
        else
            err_set(err, "%d tokens, not <bos> ... <eos>", n);
    }
    if (rc)
        fprintf(stderr, "engine embedding: %s\n", err);
    tok_free(tok);
    bert_runner_free(r);
    bert_free(m);
    gguf_close(g);
    return rc;
}

/* The largest difference of data[i].embedding from want (DIM). */
static double embedding_diff(json_object *o, size_t i, const float *want)
{
    json_object *v = NULL;
    if (!json_object_object_get_ex(
            json_object_array_get_idx(json_object_object_get(o, "data"), i), "embedding", &v) ||
        json_object_array_length(v) != DIM)
        return INFINITY;
    double worst = 0;
    for (int d = 0; d < DIM; d++)
        worst = fmax(worst, fabs(json_object_get_double(json_object_array_get_idx(v, (size_t)d)) -
                                 want[d]));
    return worst;
}

static void embeddings_equal_the_engine(void)
{
    NEED();
    float want[DIM];
    int n_tokens = 0;
    CHECK(engine_embedding(TEXTS[0], want, &n_tokens) == 0);
    char body[1024];
    snprintf(body, sizeof body, "{\"model\":\"gemb\",\"input\":\"%s\"}", TEXTS[0]);
    int st;
    json_object *o = httpc_post_json(hsock, "/v1/embeddings", body, &st);
    CHECK_MSG(o && st == 200, "%d", st);
    double worst = embedding_diff(o, 0, want);
    CHECK_MSG(worst < 1e-5, "largest difference %.3g", worst);
    CHECK_EQ(atoi(httpc_jstr(o, "usage.prompt_tokens")), n_tokens);
    json_object_put(o);
}

static void batch_equals_the_engine(void)
{
    NEED();
    float want[N_TEXTS][DIM];
    int n_tokens = 0, total = 0;
    for (int i = 0; i < N_TEXTS; i++) {
        CHECK(engine_embedding(TEXTS[i], want[i], &n_tokens) == 0);
        total += n_tokens;
    }
    char body[1024];
    snprintf(body, sizeof body, "{\"model\":\"gemb\",\"input\":[\"%s\",\"%s\"]}", TEXTS[0],
             TEXTS[1]);
    int st;
    json_object *o = httpc_post_json(hsock, "/v1/embeddings", body, &st);
    CHECK_MSG(o && st == 200, "%d", st);
    for (int i = 0; i < N_TEXTS; i++) {
        double worst = embedding_diff(o, (size_t)i, want[i]);
        CHECK_MSG(worst < 1e-5, "text %d: largest difference %.3g", i, worst);
    }
    CHECK_EQ(atoi(httpc_jstr(o, "usage.prompt_tokens")), total);
    json_object_put(o);
}

static void daemon_exits_cleanly(void)
{
    proc_check_clean_exit(&daemon_, &daemon_up);
}

/* gemma_vocab's vocabulary with add_eos_token true, as EmbeddingGemma's converter writes
 * it (its tokenizer appends <eos>). 0, or -1 + err. */
static int write_vocab(const char *src, const char *dst, char err[ERR_MAX])
{
    char plain[1024];
    proc_fmt(plain, sizeof plain, "%s/gemb-vocab-plain.gguf", test_tmpdir());
    if (gemma_vocab_write(src, plain, err) < 0)
        return -1;
    gguf_file *g = gguf_open(plain, err);
    if (!g)
        return -1;
    gguf_writer *w = gguf_writer_new();
    int rc = w ? 0 : err_set(err, "out of memory");
    for (int64_t i = 0; rc == 0 && i < gguf_n_kv(g); i++)
        if (!gguf_str_eq(gguf_key(g, i), "tokenizer.ggml.add_eos_token") &&
            gguf_writer_copy_kv(w, g, i) < 0)
            rc = err_set(err, "cannot copy metadata");
    if (rc == 0 && gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", true) < 0)
        rc = err_set(err, "cannot set metadata");
    if (rc == 0)
        rc = gguf_writer_write(w, dst, err);
    gguf_writer_free(w);
    gguf_close(g);
    return rc;
}

/* A small llama on a synthetic vocabulary (the default generate model), and the
 * embedding model on the Gemma-like vocabulary. */
static void make_models(void)
{
    char err[ERR_MAX];
    modelgen_params gp = {.arch = "llama", .dim = 32, .n_layer = 1, .n_head = 2,
                          .n_head_kv = 2, .n_ff = 64, .n_ctx = 128, .type = QTYPE_F32,
                          .seed = 1, .n_vocab = 64, .n_threads = 1};
    proc_generate_model(gen_path, sizeof gen_path, "gen.gguf", &gp);
    const char *src = test_data_path("vocab/ggml-vocab-llama-spm.gguf");
    char vocab[1024];
    proc_fmt(vocab, sizeof vocab, "%s/gemb-vocab.gguf", test_tmpdir());
    gguf_file *v = NULL;
    if (!src)
        return;
    if (write_vocab(src, vocab, err) < 0 || !(v = gguf_open(vocab, err))) {
        fprintf(stderr, "gemma-embedding vocabulary: %s\n", err);
        return;
    }
    modelgen_params ep = {.arch = "gemma-embedding", .dim = DIM, .n_layer = 7, .n_head = 4,
                          .n_head_kv = 2, .head_dim = 32, .n_ff = 96, .n_ctx = 256,
                          .type = QTYPE_Q8_0, .seed = 5, .vocab = v, .n_threads = 1,
                          .pooling_type = 1, .sliding_window = 6, .n_dense = 128};
    proc_generate_model(emb_path, sizeof emb_path, "gemb.gguf", &ep);
    gguf_close(v);
}

int main(int argc, char **argv)
{
    (void)argc;
    signal(SIGPIPE, SIG_IGN);
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    make_models();
    RUN(embeddings_equal_the_engine);
    RUN(batch_equals_the_engine);
    RUN(daemon_exits_cleanly);
    return test_finish();
}
