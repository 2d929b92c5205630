/*
 * llmsd end to end: a real daemon of this build (build/llmsd) on a socket in a temporary
 * directory, driven through libllmsclient and, for the abuse cases, raw frames.
 *
 * Concurrent clients of several apps; isolation between apps; streaming and cancel;
 * per-app quotas; malformed, truncated, oversized and garbage frames next to a working
 * client; a context that survives kill -9 and continues with the same greedy tokens as
 * an uninterrupted run (stories260K); SIGTERM losing nothing.
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client/llms.h"
#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"
#include "proto/frame.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/integration/rawframe.h"
#include "tests/support/test.h"

#define MAX_FRAME LLMSD_PROC_MAX_FRAME

static char llmsd_path[1024];
static char tiny_model[1024]; /* generated once: random weights, synthetic vocabulary */

static llms_params greedy(int max_tokens)
{
    llms_params p;
    llms_params_init(&p);
    p.temperature = 0;
    p.max_tokens = max_tokens;
    return p;
}

/* ---- concurrent clients of several apps ---- */

struct worker {
    const llmsd_proc *d;
    char app[32];
    int ok;         /* calls that succeeded */
    char msg[256];  /* the first failure */
};

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    llms_conn *c = proc_connect(w->d, w->app);
    if (!c) {
        snprintf(w->msg, sizeof w->msg, "%s: connect/bind failed", w->app);
        return NULL;
    }
    llms_params p = greedy(6);
    char id[LLMS_ID_MAX];
    enum llms_status s = llms_context_create(c, "You are a test.", NULL, id);
    uint32_t last_len = 0;
    for (int turn = 0; s == LLMS_OK && turn < 2; turn++) {
        llms_result r;
        s = llms_call(c, id, turn ? "And then?" : "Hello there", &p, NULL, NULL, &r);
        if (s == LLMS_OK) {
            if (r.context_tokens <= last_len || r.generated_tokens == 0 ||
                r.generated_tokens > 6) {
                snprintf(w->msg, sizeof w->msg, "%s: turn %d: context %u after %u, %u generated",
                         w->app, turn, r.context_tokens, last_len, r.generated_tokens);
                s = LLMS_ERR_INTERNAL;
            }
            last_len = r.context_tokens;
            w->ok++;
        }
        llms_result_free(&r);
    }
    if (s == LLMS_OK) {
        llms_result r;
        s = llms_complete(c, "one shot", NULL, 0, &p, NULL, NULL, &r);
        w->ok += s == LLMS_OK;
        llms_result_free(&r);
    }
    if (s != LLMS_OK && !w->msg[0])
        snprintf(w->msg, sizeof w->msg, "%s: %s: %s", w->app, llms_status_name(s),
                 llms_last_error(c));
    llms_close(c);
    return NULL;
}

static llmsd_proc shared_daemon; /* for the tests that do not restart it */
static int shared_up;

static const llmsd_proc *shared(void)
{
    if (!shared_up) {
        shared_up = proc_start(&shared_daemon, llmsd_path, "shared", tiny_model,
                                 "max_contexts_per_app = 4\nmax_queued_per_app = 4\n") == 0
                        ? 1
                        : -1;
    }
    return shared_up == 1 ? &shared_daemon : NULL;
}

#define NEED_DAEMON(d)                                                         \
    do {                                                                       \
        if (!llmsd_path[0])                                                    \
            SKIP("llmsd is not built in this tree");                           \
        CHECK_MSG(tiny_model[0], "could not generate the test model");         \
        (d) = shared();                                                        \
        CHECK_MSG((d), "llmsd did not start");                                 \
    } while (0)

static void concurrent_apps(void)
{
    const llmsd_proc *d;
    NEED_DAEMON(d);
    enum { N_APPS = 3, PER_APP = 2 };
    struct worker w[N_APPS * PER_APP];
    pthread_t th[N_APPS * PER_APP];
    for (int i = 0; i < N_APPS * PER_APP; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].d = d;
        snprintf(w[i].app, sizeof w[i].app, "conc-app-%d", i % N_APPS);
        CHECK(pthread_create(&th[i], NULL, worker_main, &w[i]) == 0);
    }
    for (int i = 0; i < N_APPS * PER_APP; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < N_APPS * PER_APP; i++)
        CHECK_MSG(w[i].ok == 3, "worker %d: %d calls ok; %s", i, w[i].ok, w[i].msg);

    /* Each app sees exactly its own two contexts; the admin view agrees. */
    for (int a = 0; a < N_APPS; a++) {
        char app[32];
        snprintf(app, sizeof app, "conc-app-%d", a);
        llms_conn *c = proc_connect(d, app);
        CHECK(c);
        llms_context_info *infos;
        size_t n;
        CHECK_EQ(llms_context_list(c, &infos, &n), LLMS_OK);
        llms_context_list_free(infos, n);
        llms_close(c);
        CHECK_EQ(n, PER_APP);
    }
    llms_conn *admin = proc_connect(d, "conc-admin");
    CHECK(admin);
    llms_app_info *apps;
    size_t n_apps;
    CHECK_EQ(llms_list_apps(admin, &apps, &n_apps), LLMS_OK);
    int seen = 0;
    for (size_t i = 0; i < n_apps; i++)
        if (!strncmp(apps[i].app_name, "conc-app-", 9)) {
            seen++;
            CHECK_EQ(apps[i].n_contexts, PER_APP);
        }
    llms_app_list_free(apps, n_apps);
    llms_close(admin);
    CHECK_EQ(seen, N_APPS);
}

/* ---- isolation ---- */

/* Replaces the first occurrence of id in msg by "ID", so that messages echoing the id a
 * client asked for compare equal. */
static void mask_id(char *msg, const char *id)
{
    char *at = strstr(msg, id);
    if (!at)
        return;
    size_t n = strlen(id);
    memmove(at + 2, at + n, strlen(at + n) + 1);
    memcpy(at, "ID", 2);
}

static void isolation(void)
{
    const llmsd_proc *d;
    NEED_DAEMON(d);
    llms_conn *a = proc_connect(d, "iso-a"), *b = proc_connect(d, "iso-b");
    CHECK(a && b);
    char id[LLMS_ID_MAX];
    CHECK_EQ(llms_context_create(a, "secret", NULL, id), LLMS_OK);
    llms_params p = greedy(3);
    CHECK_EQ(llms_call(a, id, "hi", &p, NULL, NULL, NULL), LLMS_OK);

    /* B gets what a made-up id gets: NOT_FOUND, with the same message. */
    char other_msg[LLMS_ERROR_MAX], made_up_msg[LLMS_ERROR_MAX];
    CHECK_EQ(llms_call(b, id, "hi", &p, NULL, NULL, NULL), LLMS_ERR_NOT_FOUND);
    snprintf(other_msg, sizeof other_msg, "%s", llms_last_error(b));
    CHECK_EQ(llms_call(b, "ctx-that-does-not-exist", "hi", &p, NULL, NULL, NULL),
             LLMS_ERR_NOT_FOUND);
    snprintf(made_up_msg, sizeof made_up_msg, "%s", llms_last_error(b));
    mask_id(other_msg, id);
    mask_id(made_up_msg, "ctx-that-does-not-exist");
    CHECK_MSG(strcmp(other_msg, made_up_msg) == 0, "the message reveals the context: '%s' vs '%s'",
              other_msg, made_up_msg);
    llms_context_info info;
    CHECK_EQ(llms_context_get(b, id, 1, &info), LLMS_ERR_NOT_FOUND);
    CHECK_EQ(llms_context_delete(b, id), LLMS_ERR_NOT_FOUND);
    llms_context_info *infos;
    size_t n;
    CHECK_EQ(llms_context_list(b, &infos, &n), LLMS_OK);
    for (size_t i = 0; i < n; i++)
        CHECK(strcmp(infos[i].id, id) != 0);
    llms_context_list_free(infos, n);

    /* A's context is untouched. */
    CHECK_EQ(llms_context_get(a, id, 1, &info), LLMS_OK);
    CHECK(info.n_tokens > 0);
    CHECK(info.n_history >= 2);
    llms_context_info_free(&info);
    CHECK_EQ(llms_context_delete(a, id), LLMS_OK);
    CHECK_EQ(llms_context_get(a, id, 0, &info), LLMS_ERR_NOT_FOUND);
    llms_close(a);
    llms_close(b);
}

/* ---- streaming and cancel ---- */

struct stream_log {
    char text[8192];
    size_t len;
    int pieces;
    int cancel_at; /* 0: never */
};

static int on_piece(const char *text, size_t len, void *user)
{
    struct stream_log *s = user;
    if (s->len + len < sizeof s->text) {
        memcpy(s->text + s->len, text, len);
        s->len += len;
        s->text[s->len] = '\0';
    }
    s->pieces++;
    return s->cancel_at && s->pieces >= s->cancel_at;
}

static void streaming_and_cancel(void)
{
    const llmsd_proc *d;
    NEED_DAEMON(d);
    llms_conn *c = proc_connect(d, "stream-app");
    CHECK(c);
    char id[LLMS_ID_MAX];
    CHECK_EQ(llms_context_create(c, NULL, NULL, id), LLMS_OK);
    llms_params p = greedy(24);
    struct stream_log log = {0};
    llms_result r;
    CHECK_EQ(llms_call(c, id, "Tell me everything.", &p, on_piece, &log, &r), LLMS_OK);
    CHECK_MSG(log.pieces >= 2 || r.generated_tokens <= 1, "%d pieces for %u tokens", log.pieces,
              r.generated_tokens);
    CHECK_MSG(strcmp(log.text, r.text) == 0, "streamed '%s' but the result says '%s'", log.text,
              r.text);
    uint32_t len_before = r.context_tokens;
    llms_result_free(&r);

    /* Cancel after the first piece of a long reply: CANCELLED, far fewer tokens. */
    llms_params longp = greedy(400);
    struct stream_log cl = {.cancel_at = 1};
    enum llms_status s = llms_call(c, id, "Go on at length.", &longp, on_piece, &cl, &r);
    CHECK_MSG(s == LLMS_ERR_CANCELLED, "got %s: %s", llms_status_name(s), llms_last_error(c));
    CHECK_EQ(cl.pieces, 1);
    llms_result_free(&r);

    /* The connection and the context still work, and the context did not lose turns. */
    CHECK_EQ(llms_call(c, id, "Short answer.", &p, NULL, NULL, &r), LLMS_OK);
    CHECK(r.context_tokens > len_before);
    llms_result_free(&r);

    struct stream_log cc = {.cancel_at = 1};
    s = llms_complete(c, "Once upon a time", NULL, 0, &longp, on_piece, &cc, NULL);
    CHECK_EQ(s, LLMS_ERR_CANCELLED);
    char *text;
    CHECK_EQ(llms_call_text(c, id, "Bye.", &p, &text), LLMS_OK);
    free(text);
    llms_close(c);
}

/* ---- raw frames ---- */

/*
 * After a bad frame the daemon must answer with an error or close the connection:
 * reads until EOF, checking that every frame that comes is an error. Returns 0 when
 * that holds, -1 on a success reply or a timeout.
 */
static int expect_error_or_close(int fd, char *why, size_t cap)
{
    for (int frames = 0; frames < 4; frames++) {
        int timed_out;
        Llms__Response *r = raw_read(fd, &timed_out);
        if (!r) {
            if (timed_out)
                snprintf(why, cap, "no answer and no close within 20 s");
            return timed_out ? -1 : 0;
        }
        int is_error = r->error && r->error->code != LLMS__ERROR_CODE__OK;
        frame_free_response(r);
        if (!is_error) {
            snprintf(why, cap, "a non-error reply to a bad frame");
            return -1;
        }
    }
    return 0; /* errors only, connection left open: acceptable for a decodable frame */
}

struct victim {
    const llmsd_proc *d;
    atomic_int stop;
    int calls_ok;
    char msg[256];
};

/* A well-behaved client calling in a loop while others misbehave. */
static void *victim_main(void *arg)
{
    struct victim *v = arg;
    llms_conn *c = proc_connect(v->d, "victim");
    char id[LLMS_ID_MAX];
    if (!c || llms_context_create(c, NULL, NULL, id) != LLMS_OK) {
        snprintf(v->msg, sizeof v->msg, "setup: %s", c ? llms_last_error(c) : "connect");
        llms_close(c);
        return NULL;
    }
    llms_params p = greedy(4);
    while (!atomic_load(&v->stop) || v->calls_ok < 2) {
        struct stream_log log = {0};
        enum llms_status s = llms_call(c, id, "ping", &p, on_piece, &log, NULL);
        if (s != LLMS_OK) {
            snprintf(v->msg, sizeof v->msg, "call %d: %s: %s", v->calls_ok, llms_status_name(s),
                     llms_last_error(c));
            break;
        }
        v->calls_ok++;
    }
    llms_close(c);
    return NULL;
}

static void bad_frames_do_not_disturb_others(void)
{
    const llmsd_proc *d;
    NEED_DAEMON(d);
    struct victim v = {.d = d};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, victim_main, &v) == 0);

    char why[128] = "";
    uint8_t buf[8192];
    int failures = 0;
    char failed_case[160] = "";
    for (int kind = 0; kind < 7; kind++) {
        int fd = raw_connect(d);
        if (fd < 0) {
            failures++;
            snprintf(failed_case, sizeof failed_case, "case %d: connect failed", kind);
            continue;
        }
        int expect = 1; /* read the answer */
        switch (kind) {
        case 0: /* garbage bytes that are not protobuf */
            frame_put_header(buf, 16);
            memset(buf + 4, 0xff, 16);
            raw_write(fd, buf, 20);
            break;
        case 1: /* a valid protobuf that is not a Request (no id) */
            frame_put_header(buf, 2);
            buf[4] = 0x50; /* field 10, varint */
            buf[5] = 0x01;
            raw_write(fd, buf, 6);
            break;
        case 2: /* an empty frame */
            frame_put_header(buf, 0);
            raw_write(fd, buf, 4);
            break;
        case 3: /* oversized: the header announces more than max_frame_bytes */
            frame_put_header(buf, MAX_FRAME + 1);
            memset(buf + 4, 0, 1024);
            raw_write(fd, buf, 4 + 1024);
            break;
        case 4: /* truncated: half a frame, then the client goes away */
            frame_put_header(buf, 100);
            memset(buf + 4, 0x08, 50);
            raw_write(fd, buf, 54);
            expect = 0;
            break;
        case 5: /* random noise without framing */
            srand(7);
            for (size_t i = 0; i < sizeof buf; i++)
                buf[i] = (uint8_t)rand();
            raw_write(fd, buf, sizeof buf);
            break;
        case 6: { /* a Request with no body */
            Llms__Request req = LLMS__REQUEST__INIT;
            req.id = 5;
            raw_send(fd, &req);
            break;
        }
        }
        /* Except for the oversized frame, which must be refused from its header
         * alone, the client then stops sending: a daemon may rightly wait for the rest
         * of a frame that is merely incomplete so far. */
        if (kind != 3)
            shutdown(fd, SHUT_WR);
        if (expect && expect_error_or_close(fd, why, sizeof why) < 0) {
            failures++;
            snprintf(failed_case, sizeof failed_case, "case %d: %s", kind, why);
        }
        close(fd);
    }
    atomic_store(&v.stop, 1);
    pthread_join(th, NULL);
    CHECK_MSG(failures == 0, "%d bad frames handled wrongly: %s", failures, failed_case);
    CHECK_MSG(!v.msg[0], "the well-behaved client was disturbed: %s", v.msg);
    CHECK(v.calls_ok >= 2);

    CHECK(proc_still_answers(d, "after-garbage"));
}

/* ---- listings ---- */

/* More contexts than one reply holds: the client library fetches every page, and a page
 * is what offset and limit ask for. */
static void listings_come_in_pages(void)
{
    const llmsd_proc *d;
    NEED_DAEMON(d);
    enum { APPS = 70, PER_APP = 4 }; /* max_contexts_per_app = 4; a page holds 256 */
    static char ids[APPS][PER_APP][LLMS_ID_MAX];
    for (int a = 0; a < APPS; a++) {
        char app[32];
        snprintf(app, sizeof app, "pages-%d", a);
        llms_conn *c = proc_connect(d, app);
        CHECK(c);
        for (int i = 0; c && i < PER_APP; i++)
            CHECK_EQ(llms_context_create(c, NULL, NULL, ids[a][i]), LLMS_OK);
        llms_close(c);
    }
    llms_conn *admin = proc_connect(d, "pages-admin");
    CHECK(admin);
    llms_context_info *all = NULL;
    size_t n_all = 0;
    CHECK_EQ(llms_list_all_contexts(admin, &all, &n_all), LLMS_OK);
    CHECK(n_all >= APPS * PER_APP);
    int found = 0;
    for (size_t k = 0; k < n_all; k++) {
        for (size_t m = 0; m < k; m++)
            CHECK(strcmp(all[k].id, all[m].id) != 0);
        for (int a = 0; a < APPS; a++)
            for (int i = 0; i < PER_APP; i++)
                found += strcmp(all[k].id, ids[a][i]) == 0;
    }
    CHECK_EQ(found, APPS * PER_APP);
    llms_context_list_free(all, n_all);
    llms_close(admin);

    /* one app's listing, then its page [1, 3) on the wire */
    llms_conn *c = proc_connect(d, "pages-0");
    CHECK(c);
    llms_context_info *mine = NULL;
    size_t n_mine = 0;
    CHECK_EQ(llms_context_list(c, &mine, &n_mine), LLMS_OK);
    CHECK_EQ(n_mine, PER_APP);
    int fd = raw_connect(d);
    CHECK(fd >= 0);
    CHECK(raw_bind(fd, "pages-0") == 0);
    int timed_out;
    Llms__Response *r;
    Llms__ListContextsRequest lc = LLMS__LIST_CONTEXTS_REQUEST__INIT;
    lc.has_offset = lc.has_limit = 1;
    lc.offset = 1;
    lc.limit = 2;
    Llms__Request q = LLMS__REQUEST__INIT;
    q.id = 2;
    q.body_case = LLMS__REQUEST__BODY_LIST_CONTEXTS;
    q.list_contexts = &lc;
    CHECK(raw_send(fd, &q) == 0);
    r = raw_read(fd, &timed_out);
    CHECK(r && r->body_case == LLMS__RESPONSE__BODY_CONTEXTS);
    if (r && r->body_case == LLMS__RESPONSE__BODY_CONTEXTS && n_mine == PER_APP) {
        CHECK_EQ(r->contexts->n_contexts, 2);
        CHECK(r->contexts->has_total && r->contexts->total == PER_APP);
        for (size_t k = 0; k < r->contexts->n_contexts && k < 2; k++)
            CHECK(strcmp(r->contexts->contexts[k]->context_id, mine[1 + k].id) == 0);
    }
    frame_free_response(r);
    close(fd);
    llms_context_list_free(mine, n_mine);
    llms_close(c);
}

/* ---- quotas ---- */

static void quotas(void)
{
    const llmsd_proc *d;
    NEED_DAEMON(d);
    /* max_contexts_per_app = 4 */
    llms_conn *c = proc_connect(d, "quota-app");
    CHECK(c);
    char id[LLMS_ID_MAX];
    for (int i = 0; i < 4; i++)
        CHECK_EQ(llms_context_create(c, NULL, NULL, id), LLMS_OK);
    CHECK_EQ(llms_context_create(c, NULL, NULL, id), LLMS_ERR_RESOURCE_EXHAUSTED);
    /* Deleting one makes room again. */
    CHECK_EQ(llms_context_delete(c, id), LLMS_OK);
    CHECK_EQ(llms_context_create(c, NULL, NULL, id), LLMS_OK);
    /* Another app has its own allowance. */
    llms_conn *other = proc_connect(d, "quota-other");
    CHECK(other);
    CHECK_EQ(llms_context_create(other, NULL, NULL, id), LLMS_OK);
    llms_close(other);
    llms_close(c);

    /* max_queued_per_app = 4: eight pipelined Completes in one write; some must be
     * refused with RESOURCE_EXHAUSTED, the others answered. */
    int fd = raw_connect(d);
    CHECK(fd >= 0);
    CHECK(raw_bind(fd, "quota-queue") == 0);
    int timed_out;
    Llms__Response *r;

    uint8_t *all = NULL;
    size_t all_len = 0;
    Llms__GenerationParams g = LLMS__GENERATION_PARAMS__INIT;
    g.has_max_tokens = 1;
    g.max_tokens = 32;
    g.has_temperature = 1;
    Llms__CompleteRequest cr = LLMS__COMPLETE_REQUEST__INIT;
    cr.prompt = "count to ten";
    cr.params = &g;
    for (int i = 0; i < 8; i++) {
        Llms__Request q = LLMS__REQUEST__INIT;
        q.id = 10 + (uint64_t)i;
        q.body_case = LLMS__REQUEST__BODY_COMPLETE;
        q.complete = &cr;
        uint8_t *fr;
        size_t fl;
        CHECK(frame_pack(&q.base, UINT32_MAX, &fr, &fl) == 0);
        all = realloc(all, all_len + fl);
        CHECK(all);
        memcpy(all + all_len, fr, fl);
        all_len += fl;
        free(fr);
    }
    CHECK(raw_write(fd, all, all_len) == 0);
    free(all);
    int finals = 0, exhausted = 0, results = 0;
    while (finals < 8) {
        r = raw_read(fd, &timed_out);
        CHECK_MSG(r, "the stream ended after %d of 8 answers", finals);
        if (r->final) {
            finals++;
            if (r->error && r->error->code == LLMS__ERROR_CODE__RESOURCE_EXHAUSTED)
                exhausted++;
            else if (!r->error && r->body_case == LLMS__RESPONSE__BODY_RESULT)
                results++;
        }
        frame_free_response(r);
    }
    close(fd);
    CHECK_MSG(exhausted >= 1 && results >= 1, "%d refused, %d answered", exhausted, results);
    CHECK_EQ(exhausted + results, 8);
}

/* ---- persistence ---- */

struct turns {
    char text[3][4096];
    uint32_t len[3];
};

/* Creates a greedy context and runs turn first..last-1 on it. */
static int run_turns(llms_conn *c, const char *id, int first, int last, struct turns *t)
{
    static const char *const prompts[3] = {"Once upon a time", "there was a cat", "and a dog"};
    llms_params p = greedy(12);
    p.raw = 1;
    for (int i = first; i < last; i++) {
        llms_result r;
        if (llms_call(c, id, prompts[i], &p, NULL, NULL, &r) != LLMS_OK) {
            fprintf(stderr, "turn %d: %s\n", i, llms_last_error(c));
            return -1;
        }
        snprintf(t->text[i], sizeof t->text[i], "%s", r.text);
        t->len[i] = r.context_tokens;
        llms_result_free(&r);
    }
    return 0;
}

static void kill9_then_same_continuation(void)
{
    if (!llmsd_path[0])
        SKIP("llmsd is not built in this tree");
    const char *stories = test_data_path("models/stories260K.gguf");
    if (!stories)
        SKIP("../shared/testdata/models/stories260K.gguf is absent");
    char model[1024];
    snprintf(model, sizeof model, "%s", stories);

    /* Reference: three turns without interruption. Lossless KV chunks: with lossy ones a
     * continuation depends on whether a chunk was compressed (and at which level, from
     * the attention seen so far) before the kill. */
    const char *conf = "kv_compress = none\n";
    llmsd_proc d;
    CHECK_MSG(proc_start(&d, llmsd_path, "k9-ref", model, conf) == 0, "llmsd did not start");
    llms_conn *c = proc_connect(&d, "k9");
    char id[LLMS_ID_MAX];
    struct turns ref = {0}, got = {0};
    llms_params defaults = greedy(12);
    int ok = c && llms_context_create(c, NULL, &defaults, id) == LLMS_OK &&
             run_turns(c, id, 0, 3, &ref) == 0;
    llms_close(c);
    proc_stop(&d, SIGTERM);
    CHECK_MSG(ok, "the reference run failed");
    CHECK(ref.text[2][0] != '\0');

    /* The same with kill -9 after the first turn and a restart on the same state. */
    CHECK_MSG(proc_start(&d, llmsd_path, "k9", model, conf) == 0, "llmsd did not start");
    c = proc_connect(&d, "k9");
    ok = c && llms_context_create(c, NULL, &defaults, id) == LLMS_OK &&
         run_turns(c, id, 0, 1, &got) == 0;
    llms_close(c);
    proc_stop(&d, SIGKILL);
    CHECK_MSG(ok, "the first turn failed");
    CHECK_MSG(strcmp(got.text[0], ref.text[0]) == 0, "turn 0: '%s' vs '%s'", got.text[0],
              ref.text[0]);

    CHECK_MSG(proc_start(&d, llmsd_path, "k9", model, conf) == 0,
              "llmsd did not restart after kill -9");
    c = proc_connect(&d, "k9");
    CHECK(c);
    llms_context_info info;
    enum llms_status s = llms_context_get(c, id, 1, &info);
    CHECK_MSG(s == LLMS_OK, "the context is gone after kill -9: %s", llms_last_error(c));
    CHECK_EQ(info.n_tokens, ref.len[0]);
    llms_context_info_free(&info);
    ok = run_turns(c, id, 1, 3, &got) == 0;
    llms_close(c);
    proc_stop(&d, SIGTERM);
    CHECK(ok);
    for (int i = 1; i < 3; i++) {
        CHECK_MSG(strcmp(got.text[i], ref.text[i]) == 0, "turn %d after kill -9: '%s' vs '%s'",
                  i, got.text[i], ref.text[i]);
        CHECK_EQ(got.len[i], ref.len[i]);
    }
}

struct long_call {
    const llmsd_proc *d;
    enum llms_status status;
    char msg[256];
};

static void *long_call_main(void *arg)
{
    struct long_call *lc = arg;
    llms_conn *c = proc_connect(lc->d, "term-app");
    char id[LLMS_ID_MAX];
    lc->status = LLMS_ERR_IO;
    if (c && llms_context_create(c, NULL, NULL, id) == LLMS_OK) {
        llms_params p = greedy(400);
        lc->status = llms_call(c, id, "Talk for a long time.", &p, NULL, NULL, NULL);
        snprintf(lc->msg, sizeof lc->msg, "%s", llms_last_error(c));
    }
    llms_close(c);
    return NULL;
}

static void sigterm_loses_nothing(void)
{
    if (!llmsd_path[0])
        SKIP("llmsd is not built in this tree");
    CHECK(tiny_model[0]);
    llmsd_proc d;
    CHECK_MSG(proc_start(&d, llmsd_path, "term", tiny_model, NULL) == 0, "llmsd did not start");
    llms_conn *c = proc_connect(&d, "term-app");
    CHECK(c);
    char ids[3][LLMS_ID_MAX];
    uint32_t lens[3];
    size_t hist[3];
    llms_params p = greedy(5);
    for (int i = 0; i < 3; i++) {
        CHECK_EQ(llms_context_create(c, i ? "sys" : NULL, NULL, ids[i]), LLMS_OK);
        for (int t = 0; t <= i; t++)
            CHECK_EQ(llms_call(c, ids[i], "remember this", &p, NULL, NULL, NULL), LLMS_OK);
        llms_context_info info;
        CHECK_EQ(llms_context_get(c, ids[i], 1, &info), LLMS_OK);
        lens[i] = info.n_tokens;
        hist[i] = info.n_history;
        llms_context_info_free(&info);
    }
    llms_close(c);

    /* SIGTERM while a long call runs: the call gets a final answer, the daemon exits 0. */
    struct long_call lc = {.d = &d};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, long_call_main, &lc) == 0);
    usleep(300000);
    int rc = proc_stop(&d, SIGTERM);
    pthread_join(th, NULL);
    if (rc != 0)
        proc_print_log(&d);
    CHECK_EQ(rc, 0);
    CHECK_MSG(lc.status == LLMS_OK || lc.status == LLMS_ERR_CANCELLED ||
                  lc.status == LLMS_ERR_UNAVAILABLE,
              "the call in flight got %s: %s", llms_status_name(lc.status), lc.msg);

    CHECK_MSG(proc_start(&d, llmsd_path, "term", tiny_model, NULL) == 0, "llmsd did not restart");
    c = proc_connect(&d, "term-app");
    CHECK(c);
    for (int i = 0; i < 3; i++) {
        llms_context_info info;
        CHECK_EQ(llms_context_get(c, ids[i], 1, &info), LLMS_OK);
        CHECK_EQ(info.n_tokens, lens[i]);
        CHECK_EQ(info.n_history, hist[i]);
        llms_context_info_free(&info);
    }
    CHECK_EQ(llms_call(c, ids[2], "still there?", &p, NULL, NULL, NULL), LLMS_OK);
    llms_close(c);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

/* Stop signals sent again and again, as timeout(1) or an impatient admin does (SIGTERM to
 * the daemon and to its process group, Ctrl-C pressed twice, a reload on the way): the
 * daemon shuts down once and exits 0 with everything persisted, however late in the
 * teardown one lands. */
static void repeated_stop_signals_exit_cleanly(void)
{
    if (!llmsd_path[0])
        SKIP("llmsd is not built in this tree");
    llmsd_proc d;
    CHECK_MSG(proc_start(&d, llmsd_path, "storm", tiny_model, NULL) == 0, "llmsd did not start");
    llms_conn *c = proc_connect(&d, "storm-app");
    CHECK(c);
    char id[LLMS_ID_MAX];
    llms_params p = greedy(5);
    CHECK_EQ(llms_context_create(c, NULL, NULL, id), LLMS_OK);
    CHECK_EQ(llms_call(c, id, "remember this", &p, NULL, NULL, NULL), LLMS_OK);
    llms_close(c);
    static const int sigs[] = {SIGTERM, SIGINT, SIGTERM, SIGHUP};
    int status = 0, sent = 0;
    pid_t got = 0;
    double t0 = proc_now();
    while ((got = waitpid(d.pid, &status, WNOHANG)) == 0 && proc_now() - t0 < 60) {
        kill(d.pid, sigs[sent++ % 4]);
        usleep(200);
    }
    proc_track(0, d.pid);
    CHECK_EQ(got, d.pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "after %d signals: %s %d", sent, WIFEXITED(status) ? "exit" : "killed by signal",
              WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    d.pid = 0;
    CHECK_MSG(proc_start(&d, llmsd_path, "storm", tiny_model, NULL) == 0, "llmsd did not restart");
    c = proc_connect(&d, "storm-app");
    CHECK(c);
    llms_context_info info;
    CHECK_EQ(llms_context_get(c, id, 1, &info), LLMS_OK);
    CHECK(info.n_tokens > 0);
    llms_context_info_free(&info);
    llms_close(c);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

int main(int argc, char **argv)
{
    (void)argc;
    signal(SIGPIPE, SIG_IGN);
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);

    modelgen_params mp = {
        .arch = "llama", .dim = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 128,
        .n_ctx = 512, .type = QTYPE_F32, .seed = 3, .n_vocab = 300, .n_threads = 1,
    };
    proc_generate_model(tiny_model, sizeof tiny_model, "tiny.gguf", &mp);

    RUN(concurrent_apps);
    RUN(isolation);
    RUN(streaming_and_cancel);
    RUN(bad_frames_do_not_disturb_others);
    RUN(quotas);
    RUN(listings_come_in_pages);
    if (shared_up == 1 && proc_stop(&shared_daemon, SIGTERM) != 0)
        fprintf(stderr, "the shared llmsd did not exit cleanly\n");
    RUN(kill9_then_same_continuation);
    RUN(sigterm_loses_nothing);
    RUN(repeated_stop_signals_exit_cleanly);
    return test_finish();
}
