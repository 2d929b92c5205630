/*
 * The step scheduler end to end: a real llmsd of this build, driven through
 * libllmsclient and raw frames.
 *
 * Concurrent greedy generations give the tokens they give alone (stories260K); a
 * sampled reply's text is the pieces it streamed, each valid UTF-8 (NUL bytes and split
 * or invalid characters among its byte tokens); a short request is answered while
 * another app's long Embed is still running, and an app's
 * pipelined requests come back in order; a flood of Embeds from a client that
 * disconnects stops being computed; Cancel ends a running generation or Embed at once and
 * frees its work; every kind of request counts toward
 * max_queued_per_app; a request's timeout stops its generation; the status shows the
 * scheduler.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/llms.h"
#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"
#include "engine/tok/utf8.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/integration/rawframe.h"
#include "tests/support/test.h"

static char llmsd_path[1024];
static char work_model[1024]; /* random weights, big enough that long work takes a while */
/* Eight times work_model's weights per token: on repacked weights (llmsd repacks Q8_0
 * where the CPU has AVX-512 VNNI) work_model's 480 tokens can take under 100 ms. */
static char slow_model[1024];

#define NEED_LLMSD()                                        \
    do {                                                    \
        if (!llmsd_path[0])                                 \
            SKIP("llmsd is not built in this tree");        \
        if (!work_model[0])                                 \
            SKIP("the test model could not be generated");  \
    } while (0)

static llms_params greedy(int max_tokens)
{
    llms_params p;
    llms_params_init(&p);
    p.temperature = 0;
    p.max_tokens = max_tokens;
    return p;
}

/* A text of about n tokens of the synthetic vocabulary (one per letter). */
static char *long_text(int n, int salt)
{
    char *t = malloc((size_t)n + 1);
    for (int i = 0; i < n; i++)
        t[i] = (char)('a' + (i * 7 + salt) % 26);
    t[n] = '\0';
    return t;
}

/* ---- concurrent generations equal lone ones ---- */

struct gen_thread {
    const llmsd_proc *d;
    const char *prompt;
    char *text;
    enum llms_status s;
};

static void *gen_thread_main(void *arg)
{
    struct gen_thread *g = arg;
    char app[32];
    snprintf(app, sizeof app, "eq-%p", (void *)g);
    for (char *p = app; *p; p++)
        if (*p == 'x')
            *p = 'h';
    llms_conn *c = proc_connect(g->d, app);
    if (!c) {
        g->s = LLMS_ERR_IO;
        return NULL;
    }
    llms_params p = greedy(24);
    llms_result r;
    g->s = llms_complete(c, g->prompt, NULL, 0, &p, NULL, NULL, &r);
    if (g->s == LLMS_OK) {
        g->text = strdup(r.text);
        llms_result_free(&r);
    }
    llms_close(c);
    return NULL;
}

/* Three short prompts stay within 16 stacked rows, where the batched forward is bit-equal
 * to a lone one: greedy decoding must then give exactly the same text. */
static void concurrent_equals_alone(void)
{
    if (!llmsd_path[0])
        SKIP("llmsd is not built in this tree");
    const char *stories = test_data_path("models/stories260K.gguf");
    if (!stories)
        SKIP("stories260K.gguf is not in the test data (set LLMS_TESTDATA)");
    llmsd_proc d;
    CHECK(proc_start(&d, llmsd_path, "equal", stories, "kv_compress = none\n") == 0);
    const char *prompts[] = {"Once upon a time", "The little dog", "Lily was happy"};
    char *alone[3] = {0};
    llms_conn *c = proc_connect(&d, "eq-alone");
    CHECK(c);
    for (int i = 0; i < 3; i++) {
        llms_params p = greedy(24);
        llms_result r;
        CHECK_EQ(llms_complete(c, prompts[i], NULL, 0, &p, NULL, NULL, &r), LLMS_OK);
        alone[i] = strdup(r.text);
        llms_result_free(&r);
    }
    llms_close(c);
    for (int round = 0; round < 3; round++) {
        struct gen_thread g[3];
        pthread_t th[3];
        for (int i = 0; i < 3; i++) {
            g[i] = (struct gen_thread){.d = &d, .prompt = prompts[i]};
            pthread_create(&th[i], NULL, gen_thread_main, &g[i]);
        }
        for (int i = 0; i < 3; i++) {
            pthread_join(th[i], NULL);
            CHECK_EQ(g[i].s, LLMS_OK);
            CHECK_MSG(g[i].text && strcmp(g[i].text, alone[i]) == 0,
                      "prompt %d: alone '%s', together '%s'", i, alone[i],
                      g[i].text ? g[i].text : "(none)");
            free(g[i].text);
        }
    }
    for (int i = 0; i < 3; i++)
        free(alone[i]);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

/* ---- the streamed pieces are the reply ---- */

struct stream_acc {
    char *text;
    size_t len, cap;
    int invalid; /* pieces that were not whole valid UTF-8 */
};

static int stream_acc_text(const char *text, size_t len, void *user)
{
    struct stream_acc *a = user;
    if (!utf8_valid(text, len))
        a->invalid++;
    if (a->len + len + 1 > a->cap) {
        a->cap = 2 * (a->len + len + 1);
        a->text = realloc(a->text, a->cap);
    }
    memcpy(a->text + a->len, text, len);
    a->len += len;
    a->text[a->len] = '\0';
    return 0;
}

/* Seeded samples of stories260K at temperature 100 take its byte tokens often: a NUL
 * byte among them, an invalid or a split character. The reply's text is then still the
 * pieces streamed, each whole valid UTF-8. */
static void sampled_text_equals_its_stream(void)
{
    if (!llmsd_path[0])
        SKIP("llmsd is not built in this tree");
    const char *stories = test_data_path("models/stories260K.gguf");
    if (!stories)
        SKIP("stories260K.gguf is not in the test data (set LLMS_TESTDATA)");
    llmsd_proc d;
    CHECK(proc_start(&d, llmsd_path, "stream", stories, NULL) == 0);
    llms_conn *c = proc_connect(&d, "stream");
    CHECK(c);
    for (int seed = 1; c && seed <= 16; seed++) {
        llms_params p = greedy(200);
        p.temperature = 100;
        p.top_k = 0;
        p.top_p = 1;
        p.min_p = 0;
        p.has_seed = 1;
        p.seed = (uint64_t)seed;
        struct stream_acc a = {0};
        llms_result r;
        CHECK_EQ(llms_complete(c, "Once upon a time", NULL, 0, &p, stream_acc_text, &a, &r),
                 LLMS_OK);
        CHECK_MSG(a.text && strcmp(a.text, r.text) == 0,
                  "seed %d: %zu bytes streamed, the reply's text is %zu", seed, a.len,
                  strlen(r.text));
        CHECK_MSG(a.invalid == 0, "seed %d: %d pieces were not valid UTF-8", seed, a.invalid);
        free(a.text);
        llms_result_free(&r);
    }
    if (c)
        llms_close(c);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

/* ---- long work does not hold short requests up ---- */

static Llms__Request *embed_request(uint64_t id, char **texts, size_t n)
{
    static Llms__EmbedRequest er;
    static Llms__Request req;
    llms__embed_request__init(&er);
    er.n_texts = n;
    er.texts = texts;
    llms__request__init(&req);
    req.id = id;
    req.body_case = LLMS__REQUEST__BODY_EMBED;
    req.embed = &er;
    return &req;
}

static Llms__Request *complete_request(uint64_t id, const char *prompt, uint32_t max_tokens)
{
    static Llms__GenerationParams gp;
    static Llms__CompleteRequest cr;
    static Llms__Request req;
    llms__generation_params__init(&gp);
    gp.has_temperature = 1;
    gp.temperature = 0;
    gp.has_max_tokens = 1;
    gp.max_tokens = max_tokens;
    llms__complete_request__init(&cr);
    cr.prompt = (char *)prompt;
    cr.params = &gp;
    llms__request__init(&req);
    req.id = id;
    req.body_case = LLMS__REQUEST__BODY_COMPLETE;
    req.complete = &cr;
    return &req;
}

/* Reads frames until the final one of request id; its error code (OK = 0), -1 when the
 * connection ended first. */
static int raw_wait_final(int fd, uint64_t *id)
{
    for (;;) {
        int timed_out;
        Llms__Response *r = raw_read(fd, &timed_out);
        if (!r)
            return -1;
        int final = r->final;
        int code = r->error ? (int)r->error->code : 0;
        *id = r->id;
        frame_free_response(r);
        if (final)
            return code;
    }
}

static void short_requests_pass_long_work(void)
{
    NEED_LLMSD();
    llmsd_proc d;
    CHECK(proc_start(&d, llmsd_path, "fair", work_model, "step_tokens = 64\n") == 0);
    int flood = raw_connect(&d), shorts = raw_connect(&d);
    CHECK(flood >= 0 && shorts >= 0);
    CHECK(raw_bind(flood, "flood") == 0 && raw_bind(shorts, "short") == 0);

    /* one Embed of 16 texts of 480 tokens, and a long prompt */
    char *texts[16];
    for (int i = 0; i < 16; i++)
        texts[i] = long_text(480, i);
    CHECK(raw_send(flood, embed_request(1, texts, 16)) == 0);
    CHECK(raw_send(flood, complete_request(2, texts[0], 1)) == 0);
    usleep(20000);

    /* three short Completes sent at once: answered in order, all before the flood ends */
    double t0 = proc_now();
    for (uint64_t id = 1; id <= 3; id++)
        CHECK(raw_send(shorts, complete_request(id, "hi", 2)) == 0);
    for (uint64_t want = 1; want <= 3; want++) {
        uint64_t id;
        CHECK_EQ(raw_wait_final(shorts, &id), 0);
        CHECK_EQ(id, want);
    }
    double short_s = proc_now() - t0;
    uint64_t id;
    CHECK_EQ(raw_wait_final(flood, &id), 0);
    CHECK_EQ(id, 1);
    double flood_s = proc_now() - t0;
    CHECK_EQ(raw_wait_final(flood, &id), 0);
    CHECK_EQ(id, 2);
    CHECK_MSG(short_s < flood_s / 2, "short requests took %.3f s, the Embed %.3f s", short_s,
              flood_s);
    for (int i = 0; i < 16; i++)
        free(texts[i]);
    close(flood);
    close(shorts);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

/* ---- a disconnected client's flood stops ---- */

static void disconnect_stops_flood(void)
{
    NEED_LLMSD();
    llmsd_proc d;
    CHECK(proc_start(&d, llmsd_path, "gone", work_model, "max_queued_per_app = 64\n") == 0);
    int fd = raw_connect(&d);
    CHECK(fd >= 0);
    CHECK(raw_bind(fd, "leaver") == 0);
    char *texts[4];
    for (int i = 0; i < 4; i++)
        texts[i] = long_text(400, i);
    for (uint64_t id = 1; id <= 40; id++)
        CHECK(raw_send(fd, embed_request(id, texts, 4)) == 0);
    for (int i = 0; i < 4; i++)
        free(texts[i]);
    usleep(100000);
    close(fd);

    llms_conn *admin = proc_connect(&d, "watcher");
    CHECK(admin);
    llms_daemon_status st;
    double deadline = proc_now() + 5;
    bool idle = false;
    while (!idle && proc_now() < deadline) {
        CHECK_EQ(llms_status_get(admin, &st), LLMS_OK);
        idle = st.running_requests == 0 && st.queued_requests == 0;
        llms_daemon_status_free(&st);
        if (!idle)
            usleep(10000);
    }
    CHECK_MSG(idle, "work of a closed connection still queued or running after 5 s");
    CHECK_EQ(llms_status_get(admin, &st), LLMS_OK);
    uint64_t steps = st.sched_steps;
    llms_daemon_status_free(&st);
    usleep(200000);
    CHECK_EQ(llms_status_get(admin, &st), LLMS_OK);
    CHECK_MSG(st.sched_steps == steps, "steps went on: %llu then %llu",
              (unsigned long long)steps, (unsigned long long)st.sched_steps);
    llms_daemon_status_free(&st);
    llms_close(admin);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

/* ---- Cancel frees the work ---- */

static Llms__Request *cancel_request(uint64_t id, uint64_t target)
{
    static Llms__CancelRequest cr;
    static Llms__Request req;
    llms__cancel_request__init(&cr);
    cr.request_id = target;
    llms__request__init(&req);
    req.id = id;
    req.body_case = LLMS__REQUEST__BODY_CANCEL;
    req.cancel = &cr;
    return &req;
}

/* Polls the status until nothing of any app is queued or running; false after 5 s. */
static bool wait_idle(llms_conn *c)
{
    double deadline = proc_now() + 5;
    while (proc_now() < deadline) {
        llms_daemon_status st;
        if (llms_status_get(c, &st) != LLMS_OK)
            return false;
        bool idle = st.running_requests == 0 && st.queued_requests == 0 &&
                    st.sched_active_sequences == 0;
        llms_daemon_status_free(&st);
        if (idle)
            return true;
        usleep(5000);
    }
    return false;
}

/* A long generation and a long Embed, each cancelled while running: the generation ends
 * with STOP_CANCELLED and the Embed with CANCELLED at once, and the scheduler holds no
 * work of theirs afterwards. */
static void cancel_frees_the_work(void)
{
    NEED_LLMSD();
    llmsd_proc d;
    CHECK(proc_start(&d, llmsd_path, "cancel", work_model, NULL) == 0);
    int fd = raw_connect(&d);
    CHECK(fd >= 0);
    CHECK(raw_bind(fd, "canceller") == 0);
    llms_conn *watch = proc_connect(&d, "watcher");
    CHECK(watch);

    /* cancelled once its first token has come: it is decoding then */
    CHECK(raw_send(fd, complete_request(1, "Tell me a long story", 480)) == 0);
    bool stopped = false, sent = false;
    double t0 = 0;
    for (;;) {
        int timed_out;
        Llms__Response *r = raw_read(fd, &timed_out);
        if (!r)
            break;
        bool final = r->final && r->id == 1;
        if (final)
            stopped = r->body_case == LLMS__RESPONSE__BODY_RESULT &&
                      r->result->stop_reason == LLMS__STOP_REASON__STOP_CANCELLED &&
                      r->result->generated_tokens < 480;
        frame_free_response(r);
        if (final)
            break;
        if (!sent) {
            t0 = proc_now();
            CHECK(raw_send(fd, cancel_request(2, 1)) == 0);
            sent = true;
        }
    }
    CHECK_MSG(stopped, "the generation did not stop as cancelled");
    CHECK_MSG(proc_now() - t0 < 1.0, "the cancel took %.3f s", proc_now() - t0);
    CHECK(wait_idle(watch));

    char *texts[8];
    for (int i = 0; i < 8; i++)
        texts[i] = long_text(480, i);
    CHECK(raw_send(fd, embed_request(3, texts, 8)) == 0);
    for (int i = 0; i < 8; i++)
        free(texts[i]);
    usleep(50000);
    t0 = proc_now();
    CHECK(raw_send(fd, cancel_request(4, 3)) == 0);
    uint64_t id = 0;
    int code;
    while ((code = raw_wait_final(fd, &id)) >= 0 && id != 3)
        ;
    CHECK_EQ(id, 3);
    CHECK_EQ(code, LLMS__ERROR_CODE__CANCELLED);
    CHECK_MSG(proc_now() - t0 < 1.0, "the cancel took %.3f s", proc_now() - t0);
    CHECK(wait_idle(watch));
    llms_close(watch);
    close(fd);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

/* ---- queue limits ---- */

static void queue_limit_counts_every_kind(void)
{
    NEED_LLMSD();
    llmsd_proc d;
    CHECK(proc_start(&d, llmsd_path, "limit", work_model, "max_queued_per_app = 2\n") == 0);
    int fd = raw_connect(&d);
    CHECK(fd >= 0);
    CHECK(raw_bind(fd, "limited") == 0);
    char *texts[4];
    for (int i = 0; i < 4; i++)
        texts[i] = long_text(400, i);
    for (uint64_t id = 1; id <= 2; id++)
        CHECK(raw_send(fd, embed_request(id, texts, 4)) == 0);
    CHECK(raw_send(fd, complete_request(3, "hi", 2)) == 0);
    int codes[4] = {-1, -1, -1, -1};
    for (int i = 0; i < 3; i++) {
        uint64_t id;
        int code = raw_wait_final(fd, &id);
        CHECK(id >= 1 && id <= 3);
        codes[id] = code;
    }
    CHECK_EQ(codes[1], 0);
    CHECK_EQ(codes[2], 0);
    CHECK_EQ(codes[3], LLMS__ERROR_CODE__RESOURCE_EXHAUSTED);
    for (int i = 0; i < 4; i++)
        free(texts[i]);
    close(fd);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

/* ---- deadlines and status ---- */

static void timeout_stops_generation(void)
{
    NEED_LLMSD();
    if (!slow_model[0])
        SKIP("the slower test model could not be generated");
    llmsd_proc d;
    CHECK(proc_start(&d, llmsd_path, "deadline", slow_model, NULL) == 0);
    llms_conn *c = proc_connect(&d, "hurried");
    CHECK(c);
    llms_set_timeout(c, 100);
    llms_params p = greedy(480);
    llms_result r;
    double t0 = proc_now();
    enum llms_status s = llms_complete(c, "Tell me a long story", NULL, 0, &p, NULL, NULL, &r);
    double took = proc_now() - t0;
    CHECK_MSG(s == LLMS_OK || s == LLMS_ERR_DEADLINE_EXCEEDED, "got %s: %s",
              llms_status_name(s), llms_last_error(c));
    if (s == LLMS_OK) {
        CHECK_EQ(r.stop_reason, LLMS_STOP_DEADLINE);
        CHECK(r.generated_tokens < 480);
        llms_result_free(&r);
    }
    CHECK_MSG(took < 2.0, "a 100 ms timeout took %.3f s", took);

    llms_set_timeout(c, 0);
    p = greedy(4);
    CHECK_EQ(llms_complete(c, "Short", NULL, 0, &p, NULL, NULL, &r), LLMS_OK);
    CHECK(r.stop_reason != LLMS_STOP_DEADLINE);
    llms_result_free(&r);

    llms_daemon_status st;
    CHECK_EQ(llms_status_get(c, &st), LLMS_OK);
    CHECK(st.sched_mode && strcmp(st.sched_mode, "batched") == 0);
    CHECK_EQ(st.sched_step_tokens, 64);
    CHECK(st.sched_steps > 0);
    CHECK(st.sched_step_mean_ms > 0);
    CHECK(st.sched_rows_per_step >= 1);
    llms_daemon_status_free(&st);

    /* a context's call: its full chunks compressed (kv_compress tolerance, the default);
     * the status splits the resident KV by precision */
    char id[LLMS_ID_MAX];
    CHECK_EQ(llms_context_create(c, NULL, NULL, id), LLMS_OK);
    p = greedy(40);
    CHECK_EQ(llms_call(c, id, "Tell me about the sea and the ships on it", &p, NULL, NULL, &r),
             LLMS_OK);
    llms_result_free(&r);
    CHECK_EQ(llms_status_get(c, &st), LLMS_OK);
    CHECK_EQ(st.kv_f16_bytes + st.kv_int8_bytes + st.kv_int4_bytes + st.kv_int2_bytes,
             st.kv_bytes_resident);
    CHECK(st.kv_f16_bytes > 0);
    CHECK_MSG(st.kv_int8_bytes + st.kv_int4_bytes + st.kv_int2_bytes > 0,
              "no compressed chunk: f16 %llu", (unsigned long long)st.kv_f16_bytes);
    llms_daemon_status_free(&st);
    llms_close(c);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

int main(int argc, char **argv)
{
    (void)argc;
    signal(SIGPIPE, SIG_IGN);
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    modelgen_params mp = {
        .arch = "llama", .dim = 256, .n_layer = 4, .n_head = 8, .n_head_kv = 4, .n_ff = 768,
        .n_ctx = 512, .type = QTYPE_Q8_0, .seed = 5, .n_vocab = 300, .n_threads = 1,
    };
    proc_generate_model(work_model, sizeof work_model, "work.gguf", &mp);
    mp.dim = 512, mp.n_layer = 8, mp.n_ff = 1536;
    proc_generate_model(slow_model, sizeof slow_model, "slow.gguf", &mp);
    RUN(concurrent_equals_alone);
    RUN(sampled_text_equals_its_stream);
    RUN(short_requests_pass_long_work);
    RUN(disconnect_stops_flood);
    RUN(cancel_frees_the_work);
    RUN(queue_limit_counts_every_kind);
    RUN(timeout_stops_generation);
    return test_finish();
}
