/*
 * Idle-time prediction and the cache scheduler end to end (daemon/rag/predict.h): a real
 * llmsd fills its caches with predicted queries while idle, a real query reuses them
 * (greedy answer equal to a fresh one), CacheTune moves the cache scheduler between
 * prefill-only and decoded population with conversions, and a real request that arrives
 * during prediction runs alone: no prediction step while it is queued or running, its
 * prompt in as many steps as it needs alone, and prediction resumes afterwards. Warm-ups
 * prefill new passages as a prompt's first, and a real query that retrieves one first
 * reuses its KV with the answer a fresh query gets, and warm-ups finish while another
 * connection polls the daemon back to back. A QA entry a change makes stale is
 * regenerated in idle time.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/llms.h"
#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/integration/rawframe.h"
#include "tests/support/test.h"

static char llmsd_path[1024], work_model[1024], q8_model[1024], deep_model[1024];

/* Polls the cache statistics until done(stats) or the timeout (seconds). */
static int wait_stats(llms_conn *c, bool (*done)(const llms_cache_stats *), double timeout,
                      llms_cache_stats *st)
{
    double end = proc_now() + timeout * TEST_TIME_SCALE;
    for (; proc_now() < end; usleep(20000 * TEST_TIME_SCALE)) {
        if (llms_cache_stats_get(c, st) != LLMS_OK)
            return -1;
        if (done(st))
            return 0;
    }
    return -1;
}

static bool predicted_one(const llms_cache_stats *st)
{
    return st->predicted >= 1 && st->predict_generations >= 2;
}

static uint64_t prefilled_before;
static bool prefilled_more(const llms_cache_stats *st)
{
    return st->predict_prefilled > prefilled_before;
}

static bool converted_one(const llms_cache_stats *st)
{
    return st->predict_converted >= 1;
}

/* On the trained stories260K: one passage, so every query's path is (system prompt,
 * that passage), which the first predicted query stores. */
static void prediction_fills_and_converts(void)
{
    const char *stories = test_data_path("models/stories260K.gguf");
    if (!llmsd_path[0] || !stories)
        SKIP("llmsd or ../shared/testdata/models/stories260K.gguf is missing");
    llmsd_proc d;
    CHECK(proc_start(&d, llmsd_path, "predict", stories,
                     "temperature = 0\nmax_tokens = 8\nrag_top_k = 1\npredict_budget = 64\n"
                     "idle_after_ms = 200\npredict_stride = 1\npredict_max_tokens = 24\n"
                     "kb_passage_tokens = 96\nkb_overlap_tokens = 0\n"
                     "predict_warm = 0\n") == 0); /* warm-ups would store every path here */
    llms_conn *c = proc_connect(&d, "predict");
    CHECK(c);
    CHECK_EQ(llms_kb_create(c, "kb", 0, 0), LLMS_OK);
    llms_kb_doc doc = {"d0", "Lily had a small red ball. She played with it in the park every "
                             "day, and her dog Max ran after it.", NULL};
    CHECK_EQ(llms_kb_add(c, "kb", &doc, 1, NULL), LLMS_OK);
    llms_cache_stats st;
    CHECK_MSG(wait_stats(c, predicted_one, 60, &st) == 0, "no prediction ran (%llu queries, "
              "%llu generations)", (unsigned long long)st.predicted,
              (unsigned long long)st.predict_generations);
    /* tau_query 0.85 < tau_scheduler 0.9: decoded, into both levels */
    CHECK(st.predict_decoded >= 1 && st.predict_prefilled == 0);
    CHECK(st.qa_entries >= 1 && st.qkv_nodes >= 2);
    CHECK_EQ(st.rag_queries, 0);

    /* a real query reuses the predicted passage node, exactly */
    llms_rag_options fresh = {.no_qa = 1, .no_qkv = 1}, qkv = {.no_qa = 1};
    llms_rag_result a, b;
    CHECK_EQ(llms_rag_query(c, "kb", "What did Lily play with?", &fresh, NULL, NULL, &a),
             LLMS_OK);
    CHECK_EQ(llms_rag_query(c, "kb", "What did Lily play with?", &qkv, NULL, NULL, &b), LLMS_OK);
    CHECK_EQ(b.outcome, LLMS_RAG_QKV_HIT);
    CHECK_EQ(b.reused_passages, 1);
    CHECK_MSG(!strcmp(a.text, b.text), "'%s' vs '%s'", a.text, b.text);
    llms_rag_result_free(&a);
    llms_rag_result_free(&b);
    CHECK_EQ(llms_cache_stats_get(c, &st), LLMS_OK);
    CHECK(st.predict_qkv_hits >= 1);

    /* tau_query at or above tau_scheduler: predicted queries (about new passages, the
     * paraphrase and follow-up of a real question) are only prefilled; one whose whole
     * path is stored already costs nothing */
    CHECK_EQ(llms_cache_tune(c, 0.95f), LLMS_OK);
    CHECK_EQ(llms_cache_tune(c, 3.0f), LLMS_ERR_INVALID_ARGUMENT);
    CHECK_EQ(llms_cache_stats_get(c, &st), LLMS_OK);
    prefilled_before = st.predict_prefilled;
    uint64_t decoded = st.predict_decoded;
    llms_kb_doc more[] = {
        {"d1", "Tom flew his blue kite at the beach. The wind was strong and the kite went "
               "high over the sea.", NULL},
        {"d2", "Ben baked a big cake with his mom. They put berries on top and ate it after "
               "dinner.", NULL}};
    CHECK_EQ(llms_kb_add(c, "kb", more, 2, NULL), LLMS_OK);
    CHECK_EQ(llms_rag_query(c, "kb", "Who flew the kite?", &qkv, NULL, NULL, &a), LLMS_OK);
    llms_rag_result_free(&a);
    CHECK_MSG(wait_stats(c, prefilled_more, 60, &st) == 0, "nothing was prefilled only");
    CHECK(st.tau_query == 0.95f);
    /* at most the one query under way when tau rose was decoded since */
    CHECK(st.predict_decoded <= decoded + 1);
    decoded = st.predict_decoded;
    /* tau drops: the prefilled ones are decoded (QKV -> QA); after a clear, since an
     * entry within tau_query would already answer them */
    CHECK_EQ(llms_cache_clear(c), LLMS_OK);
    CHECK_EQ(llms_cache_tune(c, 0.5f), LLMS_OK);
    CHECK_MSG(wait_stats(c, converted_one, 60, &st) == 0, "no conversion");
    CHECK(st.predict_decoded > decoded);
    CHECK(st.qa_bytes <= st.qa_budget_bytes && st.qkv_bytes <= st.qkv_budget_bytes);
    llms_close(c);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

static uint64_t predicted_before;
static bool predicted_more(const llms_cache_stats *st)
{
    return st->predicted > predicted_before;
}

/* A QA entry a KbAdd makes stale is regenerated in idle time: its question is asked again
 * as a predicted query, so a repeat of it is answered from the QA bank again, with the
 * answer a fresh query gives now. tau_query 0.999 (under tau_scheduler 1: decoded) keeps
 * paraphrases out of the way: only the question itself matches its entry. */
static void stale_entry_regenerated(void)
{
    const char *stories = test_data_path("models/stories260K.gguf");
    if (!llmsd_path[0] || !stories)
        SKIP("llmsd or ../shared/testdata/models/stories260K.gguf is missing");
    llmsd_proc d;
    CHECK(proc_start(&d, llmsd_path, "predict-stale", stories,
                     "temperature = 0\nmax_tokens = 8\nrag_top_k = 1\npredict_budget = 64\n"
                     "idle_after_ms = 200\npredict_stride = 1000\npredict_max_tokens = 16\n"
                     "kb_passage_tokens = 96\nkb_overlap_tokens = 0\npredict_warm = 0\n"
                     "tau_query = 0.999\ntau_scheduler = 1\n") == 0);
    llms_conn *c = proc_connect(&d, "predict");
    CHECK(c);
    CHECK_EQ(llms_kb_create(c, "kb", 0, 0), LLMS_OK);
    llms_kb_doc doc = {"d0", "Lily had a small red ball. She played with it in the park.", NULL};
    CHECK_EQ(llms_kb_add(c, "kb", &doc, 1, NULL), LLMS_OK);
    const char *question = "What did Lily play with in the park?";
    llms_rag_result a, b;
    CHECK_EQ(llms_rag_query(c, "kb", question, NULL, NULL, NULL, &a), LLMS_OK);
    llms_rag_result_free(&a);
    CHECK_EQ(llms_rag_query(c, "kb", question, NULL, NULL, NULL, &a), LLMS_OK);
    CHECK_EQ(a.outcome, LLMS_RAG_QA_HIT);
    llms_rag_result_free(&a);

    /* the new passage is the question's best: its entry goes, its question is queued */
    llms_cache_stats st;
    CHECK_EQ(llms_cache_stats_get(c, &st), LLMS_OK);
    predicted_before = st.predicted;
    llms_kb_doc news = {"d1", "What did Lily play with in the park? Lily played with a kite "
                              "in the park.", NULL};
    CHECK_EQ(llms_kb_add(c, "kb", &news, 1, NULL), LLMS_OK);
    CHECK_MSG(wait_stats(c, predicted_more, 60, &st) == 0, "nothing was predicted");
    /* the history's paraphrase and follow-up queue behind it: wait for the queue to drain */
    for (double end = proc_now() + 60; proc_now() < end && st.predict_queued > 0;
         usleep(50000))
        CHECK_EQ(llms_cache_stats_get(c, &st), LLMS_OK);
    llms_rag_options fresh = {.no_qa = 1, .no_qkv = 1};
    CHECK_EQ(llms_rag_query(c, "kb", question, &fresh, NULL, NULL, &a), LLMS_OK);
    CHECK_EQ(llms_rag_query(c, "kb", question, NULL, NULL, NULL, &b), LLMS_OK);
    CHECK_MSG(b.outcome == LLMS_RAG_QA_HIT, "the stale entry was not regenerated (%s)",
              llms_rag_outcome_name(b.outcome));
    CHECK_MSG(!strcmp(a.text, b.text), "'%s' vs '%s'", a.text, b.text);
    CHECK(b.n_passages == 1 && !strcmp(b.passages[0].document, "d1"));
    llms_rag_result_free(&a);
    llms_rag_result_free(&b);
    llms_close(c);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

static llms_kb_doc story_docs[] = {
    {"d0", "Lily had a small red ball. She played with it in the park every day, and her dog "
           "Max ran after it.", NULL},
    {"d1", "Tom flew his blue kite at the beach. The wind was strong and the kite went high "
           "over the sea.", NULL},
    {"d2", "Ben baked a big cake with his mom. They put berries on top and ate it after "
           "dinner.", NULL}};

static uint64_t n_passages;
static bool warmed_all(const llms_cache_stats *st)
{
    return st->predict_warmed >= n_passages;
}

/* Warm-ups with no question generation in the budget's way (predict_stride is larger
 * than the documents added). */
#define WARM_UPS_CONF                                                                      \
    "temperature = 0\nmax_tokens = 32\nrag_top_k = 3\npredict_budget = 1\n"                 \
    "idle_after_ms = 200\npredict_stride = 1000\npredict_warm = 16\n"                       \
    "kb_passage_tokens = 96\nkb_overlap_tokens = 0\n"

/* Long answers on a random model, whose next-token scores are close,
 * show the smallest difference in the reused KV or in how the rest is computed. */
static void check_warm_ups_reused_exactly(llms_conn *c, uint32_t passages);

static void warm_ups_on(const char *name, const char *model)
{
    llmsd_proc d;
    CHECK(proc_start(&d, llmsd_path, name, model, WARM_UPS_CONF) == 0);
    llms_conn *c = proc_connect(&d, name);
    CHECK(c);
    CHECK_MSG(llms_kb_create(c, "kb", 0, 0) == LLMS_OK, "%s", llms_last_error(c));
    uint32_t passages = 0;
    CHECK_EQ(llms_kb_add(c, "kb", story_docs, 3, &passages), LLMS_OK);
    n_passages = passages;
    llms_cache_stats st;
    CHECK_MSG(wait_stats(c, warmed_all, 60, &st) == 0, "%llu of %u passages warmed",
              (unsigned long long)st.predict_warmed, passages);
    check_warm_ups_reused_exactly(c, passages);
    llms_close(c);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

/* Every warmed passage's node serves a question as a prefix, and the answer is the one
 * computed from scratch. */
static void check_warm_ups_reused_exactly(llms_conn *c, uint32_t passages)
{
    int hits = 0;
    llms_cache_stats st;
    CHECK_EQ(llms_cache_stats_get(c, &st), LLMS_OK);
    CHECK_EQ(st.predicted, 0);
    CHECK_EQ(st.rag_queries, 0);
    CHECK(st.qkv_nodes >= 1 + passages); /* the system prompt's node and one per passage */

    const char *questions[] = {"Who flew the kite?", "What did Ben bake?",
                               "What did Lily play with?"};
    llms_rag_options fresh = {.no_qa = 1, .no_qkv = 1}, qkv = {.no_qa = 1};
    for (int i = 0; i < 3; i++) {
        llms_rag_result a, b;
        CHECK_EQ(llms_rag_query(c, "kb", questions[i], &fresh, NULL, NULL, &a), LLMS_OK);
        CHECK_EQ(llms_rag_query(c, "kb", questions[i], &qkv, NULL, NULL, &b), LLMS_OK);
        hits += b.outcome == LLMS_RAG_QKV_HIT && b.reused_passages == 1;
        CHECK(b.reused_tokens > 0 && b.reused_tokens < b.prompt_tokens);
        CHECK_MSG(!strcmp(a.text, b.text), "'%s' vs '%s'", a.text, b.text);
        llms_rag_result_free(&a);
        llms_rag_result_free(&b);
    }
    CHECK_EQ(hits, 3);
    CHECK_EQ(llms_cache_stats_get(c, &st), LLMS_OK);
    CHECK_EQ(st.predict_qkv_hits, (uint64_t)hits);
}

static void warm_ups_reuse_exactly(void)
{
    const char *stories = test_data_path("models/stories260K.gguf");
    if (!llmsd_path[0] || !stories)
        SKIP("llmsd or ../shared/testdata/models/stories260K.gguf is missing");
    warm_ups_on("warm", stories);
}

/* A monitor that polls the daemon's status and caches back to back, as a dashboard or
 * `watch llmsctl status` on a slow machine does, until told to stop. */
typedef struct {
    llms_conn *c;
    _Atomic bool stop;
    unsigned long polls, failed;
    double longest_ms; /* the longest poll */
    double total_ms;   /* all polls */
} monitor;

static void monitor_took(monitor *m, double t0)
{
    double ms = (proc_now() - t0) * 1e3;
    m->longest_ms = ms > m->longest_ms ? ms : m->longest_ms;
    m->total_ms += ms;
    m->polls++;
}

static void *monitor_poll(void *arg)
{
    monitor *m = arg;
    while (!atomic_load(&m->stop)) {
        llms_daemon_status ds;
        llms_cache_stats cs;
        double t0 = proc_now();
        if (llms_status_get(m->c, &ds) == LLMS_OK)
            llms_daemon_status_free(&ds);
        else
            m->failed++;
        monitor_took(m, t0);
        t0 = proc_now();
        m->failed += llms_cache_stats_get(m->c, &cs) != LLMS_OK;
        monitor_took(m, t0);
    }
    return NULL;
}

/* Status and cache polls need no forward: one that comes while an idle-time forward runs
 * stops it after the layer it is in, and the forward goes on from there once the poll is
 * answered, so warm-ups finish however often another connection polls (each poll used to
 * throw the warm-up's forward away, and one that took longer than the gap between polls
 * never finished), and what they computed in pieces is reused exactly. */
static void monitoring_does_not_starve_warm_ups(void)
{
    if (!llmsd_path[0] || !deep_model[0])
        SKIP("llmsd or the generated model is missing");
    llmsd_proc d;
    CHECK(proc_start(&d, llmsd_path, "monitored", deep_model, WARM_UPS_CONF) == 0);
    llms_conn *c = proc_connect(&d, "monitored");
    monitor m = {.c = proc_connect(&d, "monitor")};
    CHECK(c && m.c);
    CHECK_EQ(llms_kb_create(c, "kb", 0, 0), LLMS_OK);
    uint32_t passages = 0;
    CHECK_EQ(llms_kb_add(c, "kb", story_docs, 3, &passages), LLMS_OK);
    n_passages = passages;
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, monitor_poll, &m), 0);
    llms_cache_stats st;
    int waited = wait_stats(c, warmed_all, 60, &st);
    atomic_store(&m.stop, true);
    pthread_join(t, NULL);
    CHECK_MSG(waited == 0, "%llu of %u passages warmed under %lu polls (%.0f ms of prediction)",
              (unsigned long long)st.predict_warmed, passages, m.polls, st.predict_ms);
    CHECK_EQ(m.failed, 0);
    CHECK(m.polls > 0);
    CHECK(st.predict_resumed > 0);
    printf("  %lu polls while %llu passages warmed up in %.0f ms (%llu forwards resumed "
           "where a poll stopped them); polls took %.2f ms on average, the longest %.1f ms\n",
           m.polls, (unsigned long long)st.predict_warmed, st.predict_ms,
           (unsigned long long)st.predict_resumed, m.total_ms / (double)m.polls, m.longest_ms);
    check_warm_ups_reused_exactly(c, passages);
    llms_close(m.c);
    llms_close(c);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

static void warm_ups_reuse_exactly_random_f32(void)
{
    if (!llmsd_path[0] || !work_model[0])
        SKIP("llmsd or the generated model is missing");
    warm_ups_on("warm-f32", work_model);
}

static void warm_ups_reuse_exactly_random_q8(void)
{
    if (!llmsd_path[0] || !q8_model[0])
        SKIP("llmsd, ../shared/testdata/vocab/ggml-vocab-llama-spm.gguf or the generated "
             "model is missing");
    warm_ups_on("warm-q8", q8_model);
}

static uint64_t steps_seen;
static bool stepping(const llms_cache_stats *st)
{
    bool more = steps_seen && st->predict_steps > steps_seen;
    steps_seen = st->predict_steps;
    return more;
}

static bool resumed(const llms_cache_stats *st)
{
    return st->predict_steps > steps_seen;
}

static Llms__Request *simple_request(uint64_t id, Llms__Request__BodyCase body)
{
    static Llms__Empty e = LLMS__EMPTY__INIT;
    static Llms__CacheRequest cr = LLMS__CACHE_REQUEST__INIT;
    static Llms__Request req;
    llms__request__init(&req);
    req.id = id;
    req.body_case = body;
    if (body == LLMS__REQUEST__BODY_CACHE)
        req.cache = &cr;
    else
        req.status = &e;
    return &req;
}

/* Reads frames until the final one of request id (others' frames are kept in got). */
static Llms__Response *read_final(int fd, uint64_t id, Llms__Response **got, int n_got)
{
    for (;;) {
        int timed_out;
        Llms__Response *r = raw_read(fd, &timed_out);
        if (!r)
            return NULL;
        if (r->final && r->id == id)
            return r;
        if (r->final && r->id < (uint64_t)n_got && !got[r->id]) {
            got[r->id] = r;
            continue;
        }
        frame_free_response(r);
    }
}

/* A request arriving during prediction: on a generated model whose generations run to
 * predict_max_tokens, so prediction is mid-work whenever it runs. */
static void real_request_preempts(void)
{
    if (!llmsd_path[0] || !work_model[0])
        SKIP("llmsd or the generated model is missing");
    llmsd_proc d;
    CHECK(proc_start(&d, llmsd_path, "preempt", work_model,
                     "temperature = 0\nstep_tokens = 16\npredict_budget = 1000\n"
                     "idle_after_ms = 1500\npredict_stride = 1\npredict_max_tokens = 400\n"
                     "kb_passage_tokens = 32\nkb_overlap_tokens = 0\n"
                     "predict_warm = 0\n") == 0); /* warm-ups are too short to catch */
    llms_conn *c = proc_connect(&d, "preempt");
    CHECK(c);
    CHECK_EQ(llms_kb_create(c, "kb", 0, 0), LLMS_OK);
    for (int i = 0; i < 6; i++) {
        char id[16], text[128];
        snprintf(id, sizeof id, "d%d", i);
        snprintf(text, sizeof text, "note %d about the garden and the river boat", i);
        llms_kb_doc doc = {id, text, NULL};
        CHECK_EQ(llms_kb_add(c, "kb", &doc, 1, NULL), LLMS_OK);
    }
    llms_cache_stats st;
    steps_seen = 0;
    CHECK_MSG(wait_stats(c, stepping, 60, &st) == 0, "prediction did not start");
    uint64_t preempted = st.predict_preempted;

    /* the request first, then the counters: every prediction step they count after it
     * would have run while it waited or ran */
    int fd = raw_connect(&d);
    CHECK(fd >= 0 && raw_bind(fd, "preempt") == 0);
    char prompt[1024];
    int at = 0;
    for (int w = 0; w < 25; w++)
        at += snprintf(prompt + at, sizeof prompt - (size_t)at, "word%d ", w);
    Llms__GenerationParams gp = LLMS__GENERATION_PARAMS__INIT;
    gp.has_max_tokens = 1;
    gp.max_tokens = 1;
    Llms__CompleteRequest cr = LLMS__COMPLETE_REQUEST__INIT;
    cr.prompt = prompt;
    cr.params = &gp;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.id = 3;
    req.body_case = LLMS__REQUEST__BODY_COMPLETE;
    req.complete = &cr;
    CHECK(raw_send(fd, &req) == 0);
    CHECK(raw_send(fd, simple_request(1, LLMS__REQUEST__BODY_CACHE)) == 0);
    CHECK(raw_send(fd, simple_request(2, LLMS__REQUEST__BODY_STATUS)) == 0);
    Llms__Response *got[8] = {0};
    Llms__Response *res = read_final(fd, 3, got, 8);
    CHECK_MSG(res && res->body_case == LLMS__RESPONSE__BODY_RESULT, "%s",
              res && res->error ? res->error->message : "no result");
    CHECK(raw_send(fd, simple_request(4, LLMS__REQUEST__BODY_CACHE)) == 0);
    CHECK(raw_send(fd, simple_request(5, LLMS__REQUEST__BODY_STATUS)) == 0);
    Llms__Response *r5 = read_final(fd, 5, got, 8);
    CHECK(r5 && got[1] && got[2] && got[4]);
    CHECK(got[1]->body_case == LLMS__RESPONSE__BODY_CACHE &&
          got[4]->body_case == LLMS__RESPONSE__BODY_CACHE);
    uint64_t p1 = got[1]->cache->predict_steps, p4 = got[4]->cache->predict_steps;
    uint64_t s2 = got[2]->status->sched_steps, s5 = r5->status->sched_steps;
    uint32_t n_prompt = res->result->prompt_tokens;
    /* no prediction step while the request was queued or running */
    CHECK_EQ(p4, p1);
    /* its prompt took the steps it takes alone (16 rows each), give or take the step
     * under way when the counters were read */
    CHECK_MSG(s5 - s2 <= (n_prompt + 15) / 16 + 1, "%llu steps for %u prompt tokens",
              (unsigned long long)(s5 - s2), n_prompt);
    CHECK(got[4]->cache->predict_preempted > preempted);
    frame_free_response(res);
    frame_free_response(r5);
    for (int i = 0; i < 8; i++)
        if (got[i])
            frame_free_response(got[i]);
    close(fd);

    /* idle again: prediction resumes where it paused */
    steps_seen = p4;
    CHECK_MSG(wait_stats(c, resumed, 60, &st) == 0, "prediction did not resume");
    llms_close(c);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

int main(int argc, char **argv)
{
    (void)argc;
    signal(SIGPIPE, SIG_IGN);
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    modelgen_params mp = {
        .arch = "llama", .dim = 256, .n_layer = 4, .n_head = 4, .n_head_kv = 4, .n_ff = 512,
        .n_ctx = 512, .type = QTYPE_F32, .seed = 11, .n_vocab = 300, .n_threads = 1,
    };
    proc_generate_model(work_model, sizeof work_model, "predict.gguf", &mp);
    modelgen_params mq = mp;
    mq.type = QTYPE_Q8_0;
    mq.dim = 512;
    mq.n_ff = 1024;
    mq.n_head = 8;
    mq.n_head_kv = 2;
    const char *spm = test_data_path("vocab/ggml-vocab-llama-spm.gguf");
    char err[ERR_MAX];
    gguf_file *vocab = spm ? gguf_open(spm, err) : NULL;
    mq.vocab = vocab;
    if (vocab)
        proc_generate_model(q8_model, sizeof q8_model, "predict-q8.gguf", &mq);
    gguf_close(vocab);
    /* forwards of a passage long enough (tens of ms) that a monitor's polls always
     * arrive during one */
    modelgen_params md = mp;
    md.type = QTYPE_Q8_0;
    md.dim = 512;
    md.n_layer = 8;
    md.n_head = md.n_head_kv = 8;
    md.n_ff = 1376;
    proc_generate_model(deep_model, sizeof deep_model, "predict-deep.gguf", &md);
    RUN(prediction_fills_and_converts);
    RUN(stale_entry_regenerated);
    RUN(warm_ups_reuse_exactly);
    RUN(warm_ups_reuse_exactly_random_f32);
    RUN(warm_ups_reuse_exactly_random_q8);
    RUN(real_request_preempts);
    RUN(monitoring_does_not_starve_warm_ups);
    return test_finish();
}
