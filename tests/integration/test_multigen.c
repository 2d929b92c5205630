/*
 * Several generate models in one llmsd (stories260K, the default, and
 * TinyStories-656K-Q8_0 named "tiny"): concurrent greedy streams on both give what each
 * model gives alone, contexts keep their model across a restart and a call naming
 * another model is refused, a generate model loaded at run time takes back its
 * contexts, unloading one (refused while it has contexts, naming them) leaves the other
 * models' contexts working, and the listings show every generate model. Skips without
 * the two trained models of ../shared/testdata.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/llms.h"
#include "engine/gguf/gguf.h"
#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"
#include "engine/tok/tokenizer.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/support/test.h"

#define DEFAULT_NAME "stories260K"
#define TINY_NAME "tiny"
#define N_PROMPTS 2

static char llmsd_path[1024], random_model[1024], slow_model[1024], stories_path[1024],
    tiny_path[1024];
static const char *stories, *tiny; /* the paths, or NULL when absent */
static llmsd_proc daemon_;
static int up;

static const char *const PROMPTS[N_PROMPTS] = {"Once upon a time", "The little dog"};
static const char *const CALL_PROMPT = "Lily was happy";

/* What one model gives alone: Completes of PROMPTS and a first Call on a context. */
typedef struct outputs {
    char *complete[N_PROMPTS];
    char *call;
} outputs;

static outputs alone_default, alone_tiny;

static int start_multi(bool with_tiny)
{
    char extra[1200];
    proc_fmt(extra, sizeof extra, "kv_compress = none\n%s%s%s", with_tiny ? "model." : "",
             with_tiny ? TINY_NAME " = " : "", with_tiny ? tiny : "");
    return proc_start(&daemon_, llmsd_path, "multi", stories, extra);
}

#define NEED()                                                                        \
    do {                                                                              \
        if (!llmsd_path[0])                                                           \
            SKIP("llmsd is not built in this tree");                                  \
        if (!stories || !tiny)                                                        \
            SKIP("stories260K.gguf and TinyStories-656K-Q8_0.gguf are not in the test " \
                 "data (set LLMS_TESTDATA)");                                         \
        if (!up)                                                                      \
            up = start_multi(true) == 0 ? 1 : -1;                                     \
        CHECK_MSG(up == 1, "llmsd did not start");                                    \
    } while (0)

/* A Complete (ctx NULL) or a Call on ctx, greedy; the text or NULL. */
static char *generate(llms_conn *c, const char *ctx, const char *prompt, const char *model)
{
    llms_params p = proc_greedy(24, model);
    llms_result r;
    enum llms_status s = ctx ? llms_call(c, ctx, prompt, &p, NULL, NULL, &r)
                             : llms_complete(c, prompt, NULL, 0, &p, NULL, NULL, &r);
    if (s != LLMS_OK) {
        fprintf(stderr, "generate on %s: %s\n", model ? model : "(default)", llms_last_error(c));
        return NULL;
    }
    char *text = strdup(r.text);
    llms_result_free(&r);
    return text;
}

/* A daemon serving only model gives out: the reference of each model alone. */
static void record_alone(const char *name, const char *model, outputs *out)
{
    llmsd_proc d;
    CHECK(proc_start(&d, llmsd_path, name, model, "kv_compress = none\n") == 0);
    llms_conn *c = proc_connect(&d, "alone");
    CHECK(c);
    char id[LLMS_ID_MAX];
    for (int i = 0; i < N_PROMPTS; i++)
        out->complete[i] = generate(c, NULL, PROMPTS[i], NULL);
    CHECK(llms_context_create(c, NULL, NULL, id) == LLMS_OK);
    out->call = generate(c, id, CALL_PROMPT, NULL);
    llms_close(c);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

static void each_model_alone(void)
{
    if (!llmsd_path[0])
        SKIP("llmsd is not built in this tree");
    if (!stories || !tiny)
        SKIP("the two trained models are not in the test data (set LLMS_TESTDATA)");
    record_alone("alone-default", stories, &alone_default);
    record_alone("alone-tiny", tiny, &alone_tiny);
    for (int i = 0; i < N_PROMPTS; i++)
        CHECK(alone_default.complete[i] && alone_tiny.complete[i]);
    CHECK(alone_default.call && alone_tiny.call);
    fprintf(stderr, "(alone: %s '%s', %s '%s')\n", DEFAULT_NAME,
            alone_default.complete[0] ? alone_default.complete[0] : "", TINY_NAME,
            alone_tiny.complete[0] ? alone_tiny.complete[0] : "");
    /* two different models: the comparison below can tell them apart */
    CHECK(alone_default.complete[0] && alone_tiny.complete[0] &&
          strcmp(alone_default.complete[0], alone_tiny.complete[0]) != 0);
}

typedef struct stream {
    const char *model;   /* a registry name */
    int prompt;          /* PROMPTS index, or -1: a Call on a new context */
    const char *want;
    char *got;
} stream;

static void *stream_main(void *arg)
{
    stream *st = arg;
    char app[32];
    snprintf(app, sizeof app, "mg-%s-%d", st->model, st->prompt + 1);
    llms_conn *c = proc_connect(&daemon_, app);
    if (!c)
        return NULL;
    char id[LLMS_ID_MAX];
    llms_params p = proc_greedy(24, st->model);
    if (st->prompt >= 0)
        st->got = generate(c, NULL, PROMPTS[st->prompt], st->model);
    else if (llms_context_create(c, NULL, &p, id) == LLMS_OK)
        st->got = generate(c, id, CALL_PROMPT, NULL);
    llms_close(c);
    return NULL;
}

/* Three streams per model at once (two Completes, a Call): each model's forward holds
 * at most a few short rows, where a batched forward is bit-equal to a lone one, so the
 * greedy texts must equal each model's alone. */
static void concurrent_streams_equal_each_alone(void)
{
    NEED();
    if (!alone_default.call || !alone_tiny.call)
        SKIP("no reference outputs (each_model_alone failed)");
    for (int round = 0; round < 2; round++) {
        stream st[2 * (N_PROMPTS + 1)];
        pthread_t th[2 * (N_PROMPTS + 1)];
        int n = 0;
        for (int m = 0; m < 2; m++) {
            const outputs *ref = m ? &alone_tiny : &alone_default;
            for (int i = -1; i < N_PROMPTS; i++)
                st[n++] = (stream){m ? TINY_NAME : DEFAULT_NAME, i,
                                   i < 0 ? ref->call : ref->complete[i], NULL};
        }
        for (int i = 0; i < n; i++)
            pthread_create(&th[i], NULL, stream_main, &st[i]);
        for (int i = 0; i < n; i++) {
            pthread_join(th[i], NULL);
            CHECK_MSG(st[i].got && strcmp(st[i].got, st[i].want) == 0,
                      "model %s, prompt %d: alone '%s', together '%s'", st[i].model,
                      st[i].prompt, st[i].want, st[i].got ? st[i].got : "(none)");
            free(st[i].got);
        }
    }
}

static const llms_model_info *find_model(const llms_model_info *m, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(m[i].name, name) == 0)
            return &m[i];
    return NULL;
}

static void listings_show_both(void)
{
    NEED();
    llms_conn *c = proc_connect(&daemon_, "mg-list");
    CHECK(c);
    llms_model_info *m;
    size_t n;
    CHECK(llms_list_models(c, &m, &n) == LLMS_OK);
    const llms_model_info *a = find_model(m, n, DEFAULT_NAME), *b = find_model(m, n, TINY_NAME);
    CHECK(a && b);
    uint64_t scratch = (a ? a->scratch_bytes : 0) + (b ? b->scratch_bytes : 0);
    if (a && b) {
        CHECK_MSG(strstr(a->roles, "generate") && strstr(b->roles, "generate"), "%s / %s",
                  a->roles, b->roles);
        CHECK_MSG(strstr(a->default_for, "generate") && !strstr(b->default_for, "generate"),
                  "%s / %s", a->default_for, b->default_for);
        /* each has its own runner, contexts and half of kv_budget_mb (64) */
        CHECK(a->scratch_bytes > 0 && b->scratch_bytes > 0);
        CHECK(a->generates && b->generates);
        CHECK_EQ(a->kv_budget_bytes, (uint64_t)32 << 20);
        CHECK_EQ(b->kv_budget_bytes, (uint64_t)32 << 20);
        CHECK_MSG(b->contexts >= 1 && b->kv_bytes > 0, "tiny: %u contexts, %llu KV bytes",
                  b->contexts, (unsigned long long)b->kv_bytes);
    }
    llms_model_list_free(m, n);
    llms_daemon_status st;
    CHECK(llms_status_get(c, &st) == LLMS_OK);
    /* kv_budget_mb (64) in equal shares, reported together */
    CHECK_EQ(st.kv_budget_bytes, (uint64_t)64 << 20);
    CHECK(st.models_scratch_bytes >= scratch);
    llms_daemon_status_free(&st);
    llms_close(c);
}

static void wrong_model_refused(void)
{
    NEED();
    llms_conn *c = proc_connect(&daemon_, "mg-wrong");
    CHECK(c);
    char id[LLMS_ID_MAX];
    llms_params p = proc_greedy(4, TINY_NAME);
    CHECK(llms_context_create(c, NULL, &p, id) == LLMS_OK);
    p.model = DEFAULT_NAME;
    char *text;
    CHECK_EQ(llms_call_text(c, id, "hello", &p, &text), LLMS_ERR_FAILED_PRECONDITION);
    CHECK_MSG(strstr(llms_last_error(c), "'" TINY_NAME "'") &&
                  strstr(llms_last_error(c), DEFAULT_NAME),
              "%s", llms_last_error(c));
    /* naming its own model, or none, is fine */
    p.model = TINY_NAME;
    CHECK_MSG(llms_call_text(c, id, "hello", &p, &text) == LLMS_OK, "%s", llms_last_error(c));
    free(text);
    p.model = "nope";
    llms_result r;
    CHECK_EQ(llms_complete(c, "hello", NULL, 0, &p, NULL, NULL, &r), LLMS_ERR_NOT_FOUND);
    CHECK_EQ(llms_context_create(c, NULL, &p, id), LLMS_ERR_NOT_FOUND);
    llms_close(c);
}

/* Tokenize and Detokenize naming a model use its tokenizer (the two files' vocabularies
 * differ); an unknown name is NOT_FOUND. */
static void tokenize_by_model(void)
{
    NEED();
    llms_conn *c = proc_connect(&daemon_, "mg-tok");
    CHECK(c);
    const char *text = "Once upon a time, a tiny dragon";
    const char *paths[2] = {stories, tiny}, *names[2] = {DEFAULT_NAME, TINY_NAME};
    size_t n_vocab[2] = {0, 0};
    for (int m = 0; m < 2; m++) {
        char err[ERR_MAX];
        gguf_file *g = gguf_open(paths[m], err);
        tokenizer *tok = NULL;
        CHECK_MSG(g && tok_load(g, &tok, err) == 0, "%s", err);
        if (!tok) {
            gguf_close(g);
            continue;
        }
        n_vocab[m] = (size_t)tok_n_vocab(tok);
        int32_t want[64], *got;
        int n = tok_encode(tok, text, strlen(text), true, false, want, 64);
        size_t n_got;
        CHECK_MSG(llms_tokenize_model(c, names[m], text, 1, 0, &got, &n_got) == LLMS_OK, "%s",
                  llms_last_error(c));
        CHECK(n > 0 && n_got == (size_t)n && memcmp(got, want, sizeof *want * (size_t)n) == 0);
        char *back;
        CHECK_MSG(llms_detokenize_model(c, names[m], got + 1, n_got - 1, &back) == LLMS_OK,
                  "%s", llms_last_error(c));
        CHECK_MSG(back && strstr(back, "tiny dragon"), "%s", back ? back : "(none)");
        free(back);
        free(got);
        tok_free(tok);
        gguf_close(g);
    }
    CHECK(n_vocab[0] != n_vocab[1]);
    int32_t *ids;
    size_t n;
    CHECK_EQ(llms_tokenize_model(c, "nope", text, 1, 0, &ids, &n), LLMS_ERR_NOT_FOUND);
    llms_close(c);
}

/* The context's history and model. */
static void check_context(llms_conn *c, const char *id, size_t n_history, const char *model)
{
    llms_context_info info;
    CHECK_MSG(llms_context_get(c, id, 1, &info) == LLMS_OK, "%s", llms_last_error(c));
    CHECK_EQ(info.n_history, n_history);
    CHECK_MSG(info.model && strcmp(info.model, model) == 0, "context of %s: %s", model,
              info.model ? info.model : "(none)");
    llms_context_info_free(&info);
}

/* Contexts of both models survive a restart with both; after a restart without "tiny"
 * its context is kept and its calls refused, and loading "tiny" at run time brings it
 * back. */
static void contexts_survive_restart(void)
{
    NEED();
    llms_conn *c = proc_connect(&daemon_, "mg-keep");
    CHECK(c);
    char ids[2][LLMS_ID_MAX], *text;
    const char *names[2] = {DEFAULT_NAME, TINY_NAME};
    for (int m = 0; m < 2; m++) {
        llms_params p = proc_greedy(8, names[m]);
        CHECK(llms_context_create(c, NULL, &p, ids[m]) == LLMS_OK);
        CHECK_MSG(llms_call_text(c, ids[m], "remember", &p, &text) == LLMS_OK, "%s",
                  llms_last_error(c));
        free(text);
    }
    llms_close(c);
    CHECK_EQ(proc_stop(&daemon_, SIGTERM), 0);
    up = start_multi(true) == 0 ? 1 : -1;
    CHECK_MSG(up == 1, "llmsd did not start again");
    c = proc_connect(&daemon_, "mg-keep");
    CHECK(c);
    for (int m = 0; m < 2; m++) {
        check_context(c, ids[m], 2, names[m]);
        llms_params p = proc_greedy(8, NULL);
        CHECK_MSG(llms_call_text(c, ids[m], "again", &p, &text) == LLMS_OK, "%s",
                  llms_last_error(c));
        free(text);
        check_context(c, ids[m], 4, names[m]);
    }
    llms_close(c);

    CHECK_EQ(proc_stop(&daemon_, SIGTERM), 0);
    up = start_multi(false) == 0 ? 1 : -1;
    CHECK_MSG(up == 1, "llmsd did not start without tiny");
    c = proc_connect(&daemon_, "mg-keep");
    CHECK(c);
    check_context(c, ids[1], 4, TINY_NAME);
    llms_params p = proc_greedy(8, NULL);
    CHECK_EQ(llms_call_text(c, ids[1], "third", &p, &text), LLMS_ERR_FAILED_PRECONDITION);
    CHECK_MSG(strstr(llms_last_error(c), "not loaded"), "%s", llms_last_error(c));
    CHECK_MSG(llms_model_load(c, TINY_NAME, tiny, "generate") == LLMS_OK, "%s",
              llms_last_error(c));
    for (int m = 0; m < 2; m++) {
        CHECK_MSG(llms_call_text(c, ids[m], "third", &p, &text) == LLMS_OK, "%s",
                  llms_last_error(c));
        free(text);
        check_context(c, ids[m], 6, names[m]);
    }
    llms_close(c);
}

/* A generate model loaded at run time serves contexts; unloading it is refused while it
 * has contexts (they are named) and for the default model; once its contexts are gone
 * it goes, and the other models' contexts go on. */
static void unload_keeps_other_contexts(void)
{
    NEED();
    if (!random_model[0])
        SKIP("no generated model");
    llms_conn *c = proc_connect(&daemon_, "mg-unload");
    CHECK(c);
    char ids[3][LLMS_ID_MAX], *text;
    const char *names[3] = {DEFAULT_NAME, TINY_NAME, "rand"};
    CHECK_MSG(llms_model_load(c, "rand", random_model, "generate") == LLMS_OK, "%s",
              llms_last_error(c));
    for (int m = 0; m < 3; m++) {
        llms_params p = proc_greedy(4, names[m]);
        CHECK(llms_context_create(c, NULL, &p, ids[m]) == LLMS_OK);
        CHECK_MSG(llms_call_text(c, ids[m], "one", &p, &text) == LLMS_OK, "%s",
                  llms_last_error(c));
        free(text);
    }
    llms_model_info *models;
    size_t n_models;
    CHECK(llms_list_models(c, &models, &n_models) == LLMS_OK);
    CHECK_EQ(n_models, 3);
    llms_model_list_free(models, n_models);
    CHECK_EQ(llms_model_unload(c, "rand"), LLMS_ERR_FAILED_PRECONDITION);
    CHECK_MSG(strstr(llms_last_error(c), ids[2]), "%s", llms_last_error(c));
    CHECK_EQ(llms_model_unload(c, DEFAULT_NAME), LLMS_ERR_FAILED_PRECONDITION);
    CHECK(llms_context_delete(c, ids[2]) == LLMS_OK);
    CHECK_MSG(llms_model_unload(c, "rand") == LLMS_OK, "%s", llms_last_error(c));
    llms_params p = proc_greedy(4, "rand");
    llms_result r;
    CHECK_EQ(llms_complete(c, "one", NULL, 0, &p, NULL, NULL, &r), LLMS_ERR_NOT_FOUND);
    for (int m = 0; m < 2; m++) {
        p = proc_greedy(4, NULL);
        CHECK_MSG(llms_call_text(c, ids[m], "two", &p, &text) == LLMS_OK, "%s",
                  llms_last_error(c));
        free(text);
        check_context(c, ids[m], 4, names[m]);
    }
    llms_close(c);
}

/* A generation on "slow" that holds its first streamed text until the test let it go,
 * then cancels. The model is a random one with a long window: a trained story ends in
 * end-of-text long before a unload could arrive, and a finished generation is no longer
 * running. */
typedef struct held {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool streaming, released;
    enum llms_status status;
} held;

static int hold_first_text(const char *text, size_t len, void *user)
{
    (void)text;
    (void)len;
    held *h = user;
    pthread_mutex_lock(&h->lock);
    h->streaming = true;
    pthread_cond_broadcast(&h->cond);
    while (!h->released)
        pthread_cond_wait(&h->cond, &h->lock);
    pthread_mutex_unlock(&h->lock);
    return 1;
}

static void *held_main(void *arg)
{
    held *h = arg;
    llms_conn *c = proc_connect(&daemon_, "mg-held");
    if (c) {
        llms_params p = proc_greedy(3000, "slow");
        h->status = llms_complete(c, "Once upon a time", NULL, 0, &p, hold_first_text, h, NULL);
        llms_close(c);
    }
    pthread_mutex_lock(&h->lock);
    h->streaming = true; /* a failure before any text must not leave the test waiting */
    pthread_cond_broadcast(&h->cond);
    pthread_mutex_unlock(&h->lock);
    return NULL;
}

/* Unloading a generate model while a generation runs on it is refused, naming the
 * running requests (before its contexts). */
static void unload_refused_while_generating(void)
{
    NEED();
    if (!slow_model[0])
        SKIP("the generated model is missing");
    llms_conn *c = proc_connect(&daemon_, "mg-unload-busy");
    CHECK(c);
    CHECK_MSG(llms_model_load(c, "slow", slow_model, "generate") == LLMS_OK, "%s",
              llms_last_error(c));
    held h = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
    pthread_t th;
    pthread_create(&th, NULL, held_main, &h);
    pthread_mutex_lock(&h.lock);
    while (!h.streaming)
        pthread_cond_wait(&h.cond, &h.lock);
    pthread_mutex_unlock(&h.lock);
    CHECK_EQ(llms_model_unload(c, "slow"), LLMS_ERR_FAILED_PRECONDITION);
    CHECK_MSG(strstr(llms_last_error(c), "running"), "%s", llms_last_error(c));
    pthread_mutex_lock(&h.lock);
    h.released = true;
    pthread_cond_broadcast(&h.cond);
    pthread_mutex_unlock(&h.lock);
    pthread_join(th, NULL);
    CHECK_EQ(h.status, LLMS_ERR_CANCELLED);
    /* once the cancelled generation is gone (a Complete leaves no context) it goes */
    enum llms_status st = LLMS_ERR_FAILED_PRECONDITION;
    for (int i = 0; i < 200 && st == LLMS_ERR_FAILED_PRECONDITION; i++) {
        st = llms_model_unload(c, "slow");
        if (st == LLMS_ERR_FAILED_PRECONDITION)
            usleep(10000);
    }
    CHECK_MSG(st == LLMS_OK, "%s", llms_last_error(c));
    llms_close(c);
}

int main(int argc, char **argv)
{
    (void)argc;
    signal(SIGPIPE, SIG_IGN);
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    const char *p = test_data_path("models/stories260K.gguf");
    stories = p ? strcpy(stories_path, p) : NULL;
    p = test_data_path("models/TinyStories-656K-Q8_0.gguf");
    tiny = p ? strcpy(tiny_path, p) : NULL;
    modelgen_params mp = {.arch = "llama", .dim = 32, .n_layer = 1, .n_head = 2,
                          .n_head_kv = 2, .n_ff = 64, .n_ctx = 512, .type = QTYPE_F32,
                          .seed = 7, .n_vocab = 100, .n_threads = 1};
    proc_generate_model(random_model, sizeof random_model, "rand.gguf", &mp);
    modelgen_params slow = {.arch = "llama", .dim = 384, .n_layer = 6, .n_head = 6,
                            .n_head_kv = 6, .n_ff = 1024, .n_ctx = 4096, .type = QTYPE_F32,
                            .seed = 9, .n_vocab = 300, .n_threads = 1};
    proc_generate_model(slow_model, sizeof slow_model, "slow.gguf", &slow);
    RUN(each_model_alone);
    RUN(concurrent_streams_equal_each_alone);
    RUN(listings_show_both);
    RUN(wrong_model_refused);
    RUN(tokenize_by_model);
    RUN(contexts_survive_restart);
    RUN(unload_keeps_other_contexts);
    RUN(unload_refused_while_generating);
    if (up == 1 && proc_stop(&daemon_, SIGTERM) != 0)
        fprintf(stderr, "llmsd did not exit cleanly\n");
    for (int i = 0; i < N_PROMPTS; i++) {
        free(alone_default.complete[i]);
        free(alone_tiny.complete[i]);
    }
    free(alone_default.call);
    free(alone_tiny.call);
    return test_finish();
}
