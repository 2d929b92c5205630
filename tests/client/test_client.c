/*
 * libllmsclient against a scripted fake daemon (a thread on a Unix socket): streaming,
 * cancel, skipped frames of other ids, frames that arrive a byte at a time, error codes,
 * a daemon that refuses the stream, listings, tokens, the status call, the embed and
 * rerank calls (request fields, reply mapping, inconsistent replies), and KbAdd's
 * progress reports (asked for only with a callback; a callback that cancels); a
 * connection never takes the fd of a closed standard stream.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/un.h>
#include <unistd.h>

#include "client/llms.h"
#include "proto/frame.h"
#include "tests/support/test.h"

static char sock_path[512];
static int listen_fd = -1;

/* What the fake daemon saw, checked by the tests after the connection ends. */
static uint64_t seen_ids[64];
static int n_seen;
static uint64_t cancelled_id;
static float seen_temperature;
static int seen_has_top_k;
/* llama.cpp's other samplers of the last CreateContext's defaults */
static int seen_mirostat = -1, seen_has_dry_multiplier, seen_order[4];
static float seen_typical_p;
/* the defaults of a context made with a zeroed llms_params (system prompt "zeroed") */
static int zeroed_seen, zeroed_has_newer;
static size_t seen_n_breakers, seen_n_order;
static char seen_breaker[16];
static Llms__RerankRequest seen_rerank;  /* scalar fields of the last Rerank */
static int seen_pooling;
static int seen_kb_progress;             /* KbAddRequest.progress; -1 unset */

static int read_full(int fd, uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t r = read(fd, p, n);
        if (r <= 0)
            return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static Llms__Request *read_request(int fd)
{
    uint8_t h[FRAME_HEADER_BYTES];
    uint32_t len;
    if (read_full(fd, h, sizeof h) < 0 ||
        frame_peek(h, sizeof h, FRAME_DEFAULT_MAX_BYTES, &len) == FRAME_TOO_LARGE)
        return NULL;
    uint8_t *body = malloc(len);
    Llms__Request *req = NULL;
    if (body && read_full(fd, body, len) == 0)
        req = frame_unpack_request(body, len);
    free(body);
    return req;
}

/* Sends a response; with trickle, one byte per write so the client sees short reads. */
static void send_response(int fd, Llms__Response *r, int trickle)
{
    uint8_t *buf;
    size_t len;
    if (frame_pack(&r->base, FRAME_DEFAULT_MAX_BYTES, &buf, &len) < 0)
        abort();
    size_t step = trickle ? 1 : len;
    for (size_t off = 0; off < len; off += step)
        if (write(fd, buf + off, step) != (ssize_t)step)
            break;
    free(buf);
}

static void send_error(int fd, uint64_t id, Llms__ErrorCode code, const char *msg)
{
    Llms__Error e = LLMS__ERROR__INIT;
    e.code = code;
    e.message = (char *)msg;
    Llms__Response r = LLMS__RESPONSE__INIT;
    r.id = id;
    r.final = 1;
    r.error = &e;
    send_response(fd, &r, 0);
}

static void send_chunk(int fd, uint64_t id, const char *text)
{
    Llms__CallChunk ch = LLMS__CALL_CHUNK__INIT;
    ch.text = (char *)text;
    Llms__Response r = LLMS__RESPONSE__INIT;
    r.id = id;
    r.body_case = LLMS__RESPONSE__BODY_CHUNK;
    r.chunk = &ch;
    send_response(fd, &r, 0);
}

static void send_result(int fd, uint64_t id, const char *text, Llms__StopReason why)
{
    Llms__CallResult res = LLMS__CALL_RESULT__INIT;
    res.prompt_tokens = 5;
    res.generated_tokens = 3;
    res.context_tokens = 8;
    res.stop_reason = why;
    res.text = (char *)text;
    Llms__Response r = LLMS__RESPONSE__INIT;
    r.id = id;
    r.final = 1;
    r.body_case = LLMS__RESPONSE__BODY_RESULT;
    r.result = &res;
    send_response(fd, &r, 0);
}

static void send_ok(int fd, uint64_t id)
{
    Llms__Empty e = LLMS__EMPTY__INIT;
    Llms__Response r = LLMS__RESPONSE__INIT;
    r.id = id;
    r.final = 1;
    r.body_case = LLMS__RESPONSE__BODY_OK;
    r.ok = &e;
    send_response(fd, &r, 0);
}

/* Answers one request; returns 0 to go on, -1 to end the connection. */
static int serve_one(int fd, Llms__Request *q)
{
    Llms__Response r = LLMS__RESPONSE__INIT;
    r.id = q->id;
    r.final = 1;
    switch (q->body_case) {
    case LLMS__REQUEST__BODY_BIND: {
        Llms__BindResponse b = LLMS__BIND_RESPONSE__INIT;
        b.uid = 1000;
        b.app_name = q->bind->app_name;
        r.body_case = LLMS__RESPONSE__BODY_BIND;
        r.bind = &b;
        send_response(fd, &r, 1);
        return 0;
    }
    case LLMS__REQUEST__BODY_CREATE_CONTEXT: {
        send_ok(fd, 9999); /* a frame for an id the client never used */
        const char *sys = q->create_context->system_prompt;
        if (sys && !strcmp(sys, "zeroed")) {
            const Llms__GenerationParams *d = q->create_context->defaults;
            zeroed_seen = 1;
            zeroed_has_newer = d && (d->has_typical_p || d->has_dry_base);
        } else if (q->create_context->defaults) {
            const Llms__GenerationParams *d = q->create_context->defaults;
            seen_temperature = d->temperature;
            seen_has_top_k = d->has_top_k;
            seen_mirostat = d->has_mirostat ? d->mirostat : -1;
            seen_typical_p = d->has_typical_p ? d->typical_p : -1;
            seen_has_dry_multiplier = d->has_dry_multiplier;
            seen_n_breakers = d->n_dry_sequence_breakers;
            snprintf(seen_breaker, sizeof seen_breaker, "%s",
                     d->n_dry_sequence_breakers ? d->dry_sequence_breakers[1] : "");
            seen_n_order = d->n_samplers;
            for (size_t i = 0; i < d->n_samplers && i < 4; i++)
                seen_order[i] = d->samplers[i];
        }
        Llms__CreateContextResponse cc = LLMS__CREATE_CONTEXT_RESPONSE__INIT;
        cc.context_id = "ctx-0123456789abcdef";
        r.body_case = LLMS__RESPONSE__BODY_CREATE_CONTEXT;
        r.create_context = &cc;
        send_response(fd, &r, 1);
        return 0;
    }
    case LLMS__REQUEST__BODY_CALL:
        if (strcmp(q->call->context_id, "ctx-0123456789abcdef") != 0) {
            send_error(fd, q->id, LLMS__ERROR_CODE__NOT_FOUND, "no such context");
            return 0;
        }
        if (!strcmp(q->call->prompt, "cancel me")) {
            send_chunk(fd, q->id, "first");
            Llms__Request *cq = read_request(fd);
            if (!cq)
                return -1;
            if (cq->body_case == LLMS__REQUEST__BODY_CANCEL)
                cancelled_id = cq->cancel->request_id;
            seen_ids[n_seen++] = cq->id;
            send_chunk(fd, q->id, "late"); /* already on the way when Cancel arrived */
            send_ok(fd, cq->id);
            frame_free_request(cq);
            send_error(fd, q->id, LLMS__ERROR_CODE__CANCELLED, "cancelled");
            return 0;
        }
        send_chunk(fd, q->id, "Hel");
        send_chunk(fd, q->id, "lo");
        send_chunk(fd, q->id, "!");
        send_result(fd, q->id, "Hello!", LLMS__STOP_REASON__STOP_EOS);
        return 0;
    case LLMS__REQUEST__BODY_COMPLETE:
        send_chunk(fd, q->id, q->complete->chat ? "chat:" : "raw:");
        send_chunk(fd, q->id, q->complete->prompt);
        send_result(fd, q->id, "done", LLMS__STOP_REASON__STOP_MAX_TOKENS);
        return 0;
    case LLMS__REQUEST__BODY_DELETE_CONTEXT:
        send_error(fd, q->id, LLMS__ERROR_CODE__NOT_FOUND, "no such context");
        return 0;
    case LLMS__REQUEST__BODY_LIST_CONTEXTS:
    case LLMS__REQUEST__BODY_GET_CONTEXT: {
        Llms__Message m[2] = {LLMS__MESSAGE__INIT, LLMS__MESSAGE__INIT};
        m[0].role = "user";
        m[0].content = "hi";
        m[1].role = "assistant";
        m[1].content = "hello";
        Llms__Message *hist[2] = {&m[0], &m[1]};
        Llms__ContextInfo ci[2] = {LLMS__CONTEXT_INFO__INIT, LLMS__CONTEXT_INFO__INIT};
        ci[0].context_id = "ctx-a";
        ci[0].n_tokens = 42;
        ci[0].memory = LLMS__MEMORY_STATE__MEMORY_RESIDENT;
        ci[0].system_prompt = "be kind";
        ci[0].n_history = 2;
        ci[0].history = hist;
        ci[1].context_id = "ctx-b";
        ci[1].n_tokens = 7;
        Llms__ContextInfo *list[2] = {&ci[0], &ci[1]};
        Llms__ListContextsResponse lr = LLMS__LIST_CONTEXTS_RESPONSE__INIT;
        if (q->body_case == LLMS__REQUEST__BODY_GET_CONTEXT) {
            r.body_case = LLMS__RESPONSE__BODY_CONTEXT;
            r.context = &ci[0];
        } else {
            lr.n_contexts = 2;
            lr.contexts = list;
            r.body_case = LLMS__RESPONSE__BODY_CONTEXTS;
            r.contexts = &lr;
        }
        send_response(fd, &r, 0);
        return 0;
    }
    case LLMS__REQUEST__BODY_TOKENIZE: {
        int32_t ids[64];
        size_t n = strlen(q->tokenize->text);
        for (size_t i = 0; i < n && i < 64; i++)
            ids[i] = (unsigned char)q->tokenize->text[i];
        Llms__TokenizeResponse t = LLMS__TOKENIZE_RESPONSE__INIT;
        t.n_tokens = n < 64 ? n : 64;
        t.tokens = ids;
        r.body_case = LLMS__RESPONSE__BODY_TOKENIZE;
        r.tokenize = &t;
        send_response(fd, &r, 0);
        return 0;
    }
    case LLMS__REQUEST__BODY_STATUS: {
        Llms__StatusResponse st = LLMS__STATUS_RESPONSE__INIT;
        st.version = "0.test";
        st.model_path = "/m.gguf";
        st.model_arch = "llama";
        st.n_ctx = 512;
        st.n_contexts = 3;
        r.body_case = LLMS__RESPONSE__BODY_STATUS;
        r.status = &st;
        send_response(fd, &r, 0);
        return 0;
    }
    case LLMS__REQUEST__BODY_EMBED: {
        /* Two-float vectors (i, -i); "bad" as the first text gets one vector too few. */
        seen_pooling = q->embed->has_pooling ? (int)q->embed->pooling : -1;
        size_t n = q->embed->n_texts < 8 ? q->embed->n_texts : 8;
        if (n && !strcmp(q->embed->texts[0], "bad"))
            n--;
        float vals[8][2];
        uint32_t ntok[8];
        Llms__Vector v[8], *vp[8];
        for (size_t i = 0; i < n; i++) {
            llms__vector__init(&v[i]);
            vals[i][0] = (float)i;
            vals[i][1] = -(float)i;
            v[i].n_values = 2;
            v[i].values = vals[i];
            vp[i] = &v[i];
            ntok[i] = (uint32_t)(10 + i);
        }
        Llms__EmbedResponse e = LLMS__EMBED_RESPONSE__INIT;
        e.n_vectors = n;
        e.vectors = vp;
        e.dim = 2;
        e.n_n_tokens = n;
        e.n_tokens = ntok;
        r.body_case = LLMS__RESPONSE__BODY_EMBED;
        r.embed = &e;
        send_response(fd, &r, 0);
        return 0;
    }
    case LLMS__REQUEST__BODY_RERANK: {
        /* Hits: the last document then the first; "bad" queries name a document too many. */
        seen_rerank = *q->rerank;
        uint32_t nd = (uint32_t)q->rerank->n_documents;
        Llms__RerankHit h[2] = {LLMS__RERANK_HIT__INIT, LLMS__RERANK_HIT__INIT};
        Llms__RerankHit *hp[2] = {&h[0], &h[1]};
        h[0].index = !strcmp(q->rerank->query, "bad") ? nd : nd - 1;
        h[0].score = 0.9f;
        h[1].index = 0;
        h[1].score = 0.25f;
        uint32_t layers[3] = {4, 2, 4}, pruned[4] = {0, 1, 0, 2};
        Llms__RerankResponse rr = LLMS__RERANK_RESPONSE__INIT;
        rr.n_hits = 2;
        rr.hits = hp;
        rr.n_layers_computed = 3;
        rr.layers_computed = layers;
        rr.n_pruned_at_layer = 4;
        rr.pruned_at_layer = pruned;
        rr.peak_bytes = 12345;
        rr.time_ms = 6.5;
        rr.cv_threshold = 0.3f;
        r.body_case = LLMS__RESPONSE__BODY_RERANK;
        r.rerank = &rr;
        send_response(fd, &r, 1);
        return 0;
    }
    case LLMS__REQUEST__BODY_KB_ADD: {
        /* With progress asked for: a report per phase, then the answer; knowledge base
         * "cancel" waits for the Cancel after the first report and answers CANCELLED. */
        const Llms__KbAddRequest *ka = q->kb_add;
        seen_kb_progress = ka->has_progress ? ka->progress : -1;
        Llms__KbAddProgress p = LLMS__KB_ADD_PROGRESS__INIT;
        p.documents = (uint32_t)ka->n_documents;
        p.bytes = 1000;
        Llms__Response pr = LLMS__RESPONSE__INIT;
        pr.id = q->id;
        pr.body_case = LLMS__RESPONSE__BODY_KB_ADD_PROGRESS;
        pr.kb_add_progress = &p;
        for (int phase = 0; ka->progress && phase < 3; phase++) {
            p.phase = (Llms__KbAddPhase)phase;
            p.bytes_split = phase ? 1000 : 400;
            p.passages = phase ? 30 : 12;
            p.passages_embedded = phase == 2 ? 30 : phase ? 10 : 0;
            p.passages_written = phase == 2 ? 30 : 0;
            p.documents_written = phase == 2 ? p.documents : 0;
            send_response(fd, &pr, phase == 1);
            if (!strcmp(ka->kb, "cancel")) {
                Llms__Request *cq = read_request(fd);
                if (!cq)
                    return -1;
                if (cq->body_case == LLMS__REQUEST__BODY_CANCEL)
                    cancelled_id = cq->cancel->request_id;
                send_ok(fd, cq->id);
                frame_free_request(cq);
                send_error(fd, q->id, LLMS__ERROR_CODE__CANCELLED, "cancelled");
                return 0;
            }
        }
        Llms__KbAddResponse ar = LLMS__KB_ADD_RESPONSE__INIT;
        ar.documents = (uint32_t)ka->n_documents;
        ar.passages = 30;
        r.body_case = LLMS__RESPONSE__BODY_KB_ADD;
        r.kb_add = &ar;
        send_response(fd, &r, 0);
        return 0;
    }
    case LLMS__REQUEST__BODY_SHUTDOWN:
        /* A wrong body for the call: the client must call it a protocol error. */
        send_chunk(fd, q->id, "?");
        return 0;
    default:
        /* The daemon refusing the stream: an error with id 0, then the close. */
        send_error(fd, 0, LLMS__ERROR_CODE__MALFORMED_FRAME, "garbage");
        return -1;
    }
}

static void *server(void *arg)
{
    (void)arg;
    int fd = accept(listen_fd, NULL, NULL);
    if (fd < 0)
        return NULL;
    for (;;) {
        Llms__Request *q = read_request(fd);
        if (!q)
            break;
        if (n_seen < 64)
            seen_ids[n_seen++] = q->id;
        int rc = serve_one(fd, q);
        frame_free_request(q);
        if (rc < 0)
            break;
    }
    close(fd);
    return NULL;
}

/* Starts the fake daemon for one connection and connects to it. */
static llms_conn *start(pthread_t *th)
{
    n_seen = 0;
    cancelled_id = 0;
    if (pthread_create(th, NULL, server, NULL) != 0)
        return NULL;
    llms_conn *c = NULL;
    char err[LLMS_ERROR_MAX];
    if (llms_connect(sock_path, &c, err) != LLMS_OK)
        fprintf(stderr, "connect: %s\n", err);
    return c;
}

struct collect {
    char text[256];
    int calls;
    int stop_after;
};

static int collect_text(const char *text, size_t len, void *user)
{
    struct collect *col = user;
    strncat(col->text, text, len);
    col->calls++;
    return col->stop_after && col->calls >= col->stop_after;
}

static void stream_and_errors(void)
{
    pthread_t th;
    llms_conn *c = start(&th);
    CHECK(c);
    CHECK_EQ(llms_bind(c, "test-app"), LLMS_OK);

    llms_params p;
    llms_params_init(&p);
    p.temperature = 0.25f;
    /* llama.cpp's other samplers go as set; the samplers' letters become the steps */
    const char *breakers[] = {"\n", "User:"};
    p.mirostat = 2;
    p.typical_p = 0.5f;
    p.dry_sequence_breakers = breakers;
    p.n_dry_sequence_breakers = 2;
    p.samplers = "ekt";
    char id[LLMS_ID_MAX];
    CHECK_EQ(llms_context_create(c, "sys", &p, id), LLMS_OK);
    CHECK(strcmp(id, "ctx-0123456789abcdef") == 0);
    p.samplers = "ekk";
    CHECK_EQ(llms_context_create(c, "sys", &p, id), LLMS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(llms_last_error(c), "samplers"), "%s", llms_last_error(c));
    p.samplers = "kz";
    CHECK_EQ(llms_context_create(c, "sys", &p, id), LLMS_ERR_INVALID_ARGUMENT);
    p.samplers = NULL;
    p.dry_sequence_breakers = NULL;
    CHECK_EQ(llms_context_create(c, "sys", &p, id), LLMS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(llms_last_error(c), "dry_sequence_breakers"), "%s", llms_last_error(c));
    /* A zeroed struct, as apps built before .so.6 wrote one ({.temperature = 0, ...}),
     * leaves llama.cpp's samplers off: its typical_p and dry_base of 0, which no sampler
     * takes, are not sent, so the daemon does not refuse them. */
    llms_params zero;
    memset(&zero, 0, sizeof zero);
    CHECK_EQ(llms_context_create(c, "zeroed", &zero, id), LLMS_OK);
    CHECK(zeroed_seen && !zeroed_has_newer);

    struct collect col = {0};
    llms_result res;
    CHECK_EQ(llms_call(c, id, "hi", NULL, collect_text, &col, &res), LLMS_OK);
    CHECK(strcmp(col.text, "Hello!") == 0);
    CHECK_EQ(col.calls, 3);
    CHECK(strcmp(res.text, "Hello!") == 0);
    CHECK_EQ(res.prompt_tokens, 5);
    CHECK_EQ(res.context_tokens, 8);
    CHECK_EQ(res.stop_reason, LLMS_STOP_EOS);
    llms_result_free(&res);

    char *text;
    CHECK_EQ(llms_call_text(c, id, "again", NULL, &text), LLMS_OK);
    CHECK(strcmp(text, "Hello!") == 0);
    free(text);

    CHECK_EQ(llms_call(c, "ctx-other", "hi", NULL, NULL, NULL, NULL), LLMS_ERR_NOT_FOUND);
    CHECK(strcmp(llms_last_error(c), "no such context") == 0);
    CHECK_EQ(llms_context_delete(c, "gone"), LLMS_ERR_NOT_FOUND);
    CHECK_EQ(llms_call(c, NULL, "hi", NULL, NULL, NULL, NULL), LLMS_ERR_INVALID_ARGUMENT);

    memset(&col, 0, sizeof col);
    CHECK_EQ(llms_complete(c, "xyz", NULL, 1, NULL, collect_text, &col, &res), LLMS_OK);
    CHECK(strcmp(col.text, "chat:xyz") == 0);
    CHECK_EQ(res.stop_reason, LLMS_STOP_MAX_TOKENS);
    llms_result_free(&res);

    /* The connection still works after errors. */
    int32_t *toks;
    size_t n;
    CHECK_EQ(llms_tokenize(c, "ab", 1, 0, &toks, &n), LLMS_OK);
    CHECK_EQ(n, 2);
    CHECK_EQ(toks[0], 'a');
    CHECK_EQ(toks[1], 'b');
    free(toks);
    llms_close(c);
    pthread_join(th, NULL);

    CHECK_NEAR(seen_temperature, 0.25, 1e-6);
    CHECK(!seen_has_top_k); /* unset fields stay off the wire */
    CHECK_EQ(seen_mirostat, 2);
    CHECK_NEAR(seen_typical_p, 0.5, 0);
    CHECK(!seen_has_dry_multiplier);
    CHECK_EQ(seen_n_breakers, 2);
    CHECK(strcmp(seen_breaker, "User:") == 0);
    CHECK_EQ(seen_n_order, 3);
    CHECK(seen_order[0] == LLMS__SAMPLER_STEP__SAMPLER_PENALTIES &&
          seen_order[1] == LLMS__SAMPLER_STEP__SAMPLER_TOP_K &&
          seen_order[2] == LLMS__SAMPLER_STEP__SAMPLER_TEMPERATURE);
    for (int i = 1; i < n_seen; i++)
        CHECK_MSG(seen_ids[i] > seen_ids[i - 1], "request ids must increase");
}

static void cancel_from_callback(void)
{
    pthread_t th;
    llms_conn *c = start(&th);
    CHECK(c);
    char id[LLMS_ID_MAX];
    CHECK_EQ(llms_context_create(c, NULL, NULL, id), LLMS_OK);
    struct collect col = {.stop_after = 1};
    CHECK_EQ(llms_call(c, id, "cancel me", NULL, collect_text, &col, NULL), LLMS_ERR_CANCELLED);
    CHECK_EQ(col.calls, 1); /* nothing is delivered after the callback said stop */
    CHECK(strcmp(col.text, "first") == 0);
    /* The Cancel named the call, and the stream is still in step for the next call. */
    char *text;
    CHECK_EQ(llms_call_text(c, id, "next", NULL, &text), LLMS_OK);
    CHECK(strcmp(text, "Hello!") == 0);
    free(text);
    llms_close(c);
    pthread_join(th, NULL);
    CHECK_EQ(n_seen, 4);
    CHECK_EQ(cancelled_id, seen_ids[1]);
}

struct nested {
    llms_conn *c;
    enum llms_status status; /* of the call made from the callback */
    int calls;
};

static int call_from_callback(const char *text, size_t len, void *user)
{
    struct nested *n = user;
    (void)text;
    (void)len;
    if (n->calls++ == 0) {
        int32_t *toks;
        size_t k;
        n->status = llms_tokenize(n->c, "ab", 1, 0, &toks, &k);
        if (n->status == LLMS_OK)
            free(toks);
    }
    return 0;
}

/* A call made from a callback on the connection of the call in progress is refused
 * without touching the connection: it read the outer call's frames as strangers' and
 * dropped them, so the outer call waited for a final frame that had gone (a hang). */
static void call_from_a_callback_is_refused(void)
{
    pthread_t th;
    llms_conn *c = start(&th);
    CHECK(c);
    char id[LLMS_ID_MAX];
    CHECK_EQ(llms_context_create(c, NULL, NULL, id), LLMS_OK);
    struct nested n = {.c = c, .status = LLMS_OK};
    llms_result res;
    alarm(20); /* the old behaviour hangs */
    CHECK_EQ(llms_call(c, id, "hi", NULL, call_from_callback, &n, &res), LLMS_OK);
    alarm(0);
    CHECK_EQ(n.status, LLMS_ERR_FAILED_PRECONDITION);
    CHECK_EQ(n.calls, 3);
    CHECK(strcmp(res.text, "Hello!") == 0);
    llms_result_free(&res);
    int32_t *toks;
    size_t k;
    CHECK_EQ(llms_tokenize(c, "ab", 1, 0, &toks, &k), LLMS_OK);
    CHECK_EQ(k, 2);
    free(toks);
    llms_close(c);
    pthread_join(th, NULL);
}

static void listings_and_status(void)
{
    pthread_t th;
    llms_conn *c = start(&th);
    CHECK(c);
    llms_context_info *infos;
    size_t n;
    CHECK_EQ(llms_context_list(c, &infos, &n), LLMS_OK);
    CHECK_EQ(n, 2);
    CHECK(strcmp(infos[0].id, "ctx-a") == 0);
    CHECK_EQ(infos[0].n_tokens, 42);
    CHECK_EQ(infos[0].memory, LLMS_MEMORY_RESIDENT);
    CHECK(strcmp(infos[0].system_prompt, "be kind") == 0);
    CHECK(infos[1].system_prompt == NULL);
    llms_context_list_free(infos, n);

    llms_context_info info;
    CHECK_EQ(llms_context_get(c, "ctx-a", 1, &info), LLMS_OK);
    CHECK_EQ(info.n_history, 2);
    CHECK(strcmp(info.history[1].role, "assistant") == 0);
    CHECK(strcmp(info.history[1].content, "hello") == 0);
    llms_context_info_free(&info);

    llms_daemon_status st;
    CHECK_EQ(llms_status_get(c, &st), LLMS_OK);
    CHECK(strcmp(st.model_arch, "llama") == 0);
    CHECK_EQ(st.n_ctx, 512);
    CHECK_EQ(st.n_contexts, 3);
    llms_daemon_status_free(&st);

    /* A reply with the wrong body breaks the connection for good. */
    CHECK_EQ(llms_shutdown(c), LLMS_ERR_PROTOCOL);
    CHECK_EQ(llms_status_get(c, &st), LLMS_ERR_IO);
    llms_close(c);
    pthread_join(th, NULL);
}

static void embed_and_rerank(void)
{
    pthread_t th;
    llms_conn *c = start(&th);
    CHECK(c);
    const char *texts[] = {"one", "two", "three"};
    llms_embeddings e;
    CHECK_EQ(llms_embed(c, texts, 3, LLMS_POOLING_MEAN, &e), LLMS_OK);
    CHECK_EQ(seen_pooling, LLMS__POOLING__POOLING_MEAN);
    CHECK_EQ(e.n, 3);
    CHECK_EQ(e.dim, 2);
    CHECK_EQ(e.values[4], 2.0f);
    CHECK_EQ(e.values[5], -2.0f);
    CHECK_EQ(e.n_tokens[1], 11);
    llms_embeddings_free(&e);
    CHECK(e.values == NULL && e.n == 0);

    const char *docs[] = {"a", "b", "c"};
    llms_rerank_result r;
    CHECK_EQ(llms_rerank(c, "q", docs, 3, NULL, &r), LLMS_OK);
    CHECK(!seen_rerank.has_top_k && !seen_rerank.has_cv_threshold &&
          !seen_rerank.has_target_precision && !seen_rerank.has_stream_weights);
    CHECK_EQ(r.n_hits, 2);
    CHECK_EQ(r.hits[0].index, 2);
    CHECK_NEAR(r.hits[0].score, 0.9, 1e-6);
    CHECK_EQ(r.n_documents, 3);
    CHECK_EQ(r.layers_computed[1], 2);
    CHECK_EQ(r.n_layer, 4);
    CHECK_EQ(r.pruned_at_layer[3], 2);
    CHECK_EQ(r.peak_bytes, 12345);
    CHECK_NEAR(r.time_ms, 6.5, 1e-9);
    llms_rerank_result_free(&r);
    llms_rerank_options o;
    llms_rerank_options_init(&o);
    o.top_k = 7;
    o.mode = LLMS_RERANK_ORDERED;
    o.target_precision = 0.95f;
    o.stream_weights = 0;
    CHECK_EQ(llms_rerank(c, "q", docs, 3, &o, &r), LLMS_OK);
    CHECK(seen_rerank.has_top_k && seen_rerank.top_k == 7);
    CHECK_EQ(seen_rerank.mode, LLMS__RERANK_MODE__RERANK_ORDERED);
    CHECK(!seen_rerank.has_cv_threshold && seen_rerank.has_target_precision);
    CHECK(seen_rerank.has_stream_weights && !seen_rerank.stream_weights);
    llms_rerank_result_free(&r);

    /* Arguments checked before anything is sent. */
    const char *holes[] = {"a", NULL};
    CHECK_EQ(llms_embed(c, holes, 2, LLMS_POOLING_LAST, &e), LLMS_ERR_INVALID_ARGUMENT);
    CHECK_EQ(llms_rerank(c, NULL, docs, 3, NULL, &r), LLMS_ERR_INVALID_ARGUMENT);
    CHECK_EQ(llms_rerank(c, "q", holes, 2, NULL, &r), LLMS_ERR_INVALID_ARGUMENT);

    /* A reply that does not fit the request is a protocol error. */
    const char *bad[] = {"bad", "x"};
    CHECK_EQ(llms_embed(c, bad, 2, LLMS_POOLING_LAST, &e), LLMS_ERR_PROTOCOL);
    llms_close(c);
    pthread_join(th, NULL);

    c = start(&th);
    CHECK(c);
    CHECK_EQ(llms_rerank(c, "bad", docs, 3, NULL, &r), LLMS_ERR_PROTOCOL);
    CHECK(r.hits == NULL);
    llms_close(c);
    pthread_join(th, NULL);
}

struct kb_reports {
    llms_kb_progress seen[8];
    int n;
    int cancel;
};

static int kb_report(const llms_kb_progress *p, void *user)
{
    struct kb_reports *r = user;
    if (r->n < 8)
        r->seen[r->n++] = *p;
    return r->cancel;
}

static void kb_add_progress_frames(void)
{
    pthread_t th;
    llms_conn *c = start(&th);
    CHECK(c);
    llms_kb_doc doc = {"d", "some text", NULL};
    uint32_t passages = 0;
    /* a plain add asks for no progress: one frame, as before */
    CHECK_EQ(llms_kb_add(c, "kb", &doc, 1, &passages), LLMS_OK);
    CHECK_EQ(seen_kb_progress, -1);
    CHECK_EQ(passages, 30);
    struct kb_reports r = {0};
    passages = 0;
    CHECK_EQ(llms_kb_add_progress(c, "kb", &doc, 1, kb_report, &r, &passages), LLMS_OK);
    CHECK_EQ(seen_kb_progress, 1);
    CHECK_EQ(passages, 30);
    CHECK_EQ(r.n, 3);
    CHECK_EQ(r.seen[0].phase, LLMS_KB_SPLIT);
    CHECK_EQ(r.seen[0].bytes_split, 400);
    CHECK_EQ(r.seen[1].phase, LLMS_KB_EMBED);
    CHECK_EQ(r.seen[1].passages_embedded, 10);
    CHECK_EQ(r.seen[2].phase, LLMS_KB_WRITE);
    CHECK_EQ(r.seen[2].bytes, 1000);
    CHECK_EQ(r.seen[2].passages_written, 30);
    CHECK_EQ(r.seen[2].documents_written, 1);
    /* a callback that says stop cancels the add, and the connection stays in step */
    struct kb_reports stop = {.cancel = 1};
    CHECK_EQ(llms_kb_add_progress(c, "cancel", &doc, 1, kb_report, &stop, NULL),
             LLMS_ERR_CANCELLED);
    CHECK_EQ(stop.n, 1);
    CHECK_EQ(llms_kb_add(c, "kb", &doc, 1, &passages), LLMS_OK);
    llms_close(c);
    pthread_join(th, NULL);
    CHECK_EQ(cancelled_id, seen_ids[2]);
}

static void daemon_refuses_stream(void)
{
    pthread_t th;
    llms_conn *c = start(&th);
    CHECK(c);
    char *text;
    int32_t t = 1;
    CHECK_EQ(llms_detokenize(c, &t, 1, &text), LLMS_ERR_MALFORMED_FRAME);
    CHECK(strcmp(llms_last_error(c), "garbage") == 0);
    CHECK_EQ(llms_bind(c, "x"), LLMS_ERR_IO);
    llms_close(c);
    pthread_join(th, NULL);
}

static void connect_failures(void)
{
    llms_conn *c = (llms_conn *)1;
    char err[LLMS_ERROR_MAX];
    char path[600];
    snprintf(path, sizeof path, "%s/absent.sock", test_tmpdir());
    CHECK_EQ(llms_connect(path, &c, err), LLMS_ERR_IO);
    CHECK(c == NULL);
    CHECK(strstr(err, "absent.sock") != NULL);
    setenv("LLMS_SOCKET", path, 1);
    CHECK_EQ(llms_connect(NULL, &c, err), LLMS_ERR_IO);
    CHECK(strstr(err, "absent.sock") != NULL);
    unsetenv("LLMS_SOCKET");
    CHECK(strcmp(llms_status_name(LLMS_ERR_RESOURCE_EXHAUSTED), "RESOURCE_EXHAUSTED") == 0);
    CHECK(strcmp(llms_status_name(LLMS_ERR_PROTOCOL), "PROTOCOL") == 0);
}

/* A program that closed a standard stream (llms ask >&-, 2>&-) must not get its
 * connection there: what it then prints would go to the daemon as frames. Runs last: its
 * connection waits in the listen queue, and no fake daemon takes it. */
static void connection_stays_off_standard_fds(void)
{
    int saved = dup(STDIN_FILENO);
    CHECK(saved >= 0);
    close(STDIN_FILENO);
    llms_conn *c = NULL;
    char err[LLMS_ERROR_MAX];
    enum llms_status s = llms_connect(sock_path, &c, err);
    int free_fd0 = fcntl(STDIN_FILENO, F_GETFD) < 0 && errno == EBADF;
    llms_close(c);
    dup2(saved, STDIN_FILENO);
    close(saved);
    CHECK_MSG(s == LLMS_OK, "connect: %s", err);
    CHECK_MSG(free_fd0, "the connection took fd 0, which the program had closed");
}

int main(void)
{
    snprintf(sock_path, sizeof sock_path, "%s/fake.sock", test_tmpdir());
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(sock_path) >= sizeof addr.sun_path) {
        fprintf(stderr, "temporary directory path too long for a socket\n");
        return 1;
    }
    memcpy(addr.sun_path, sock_path, strlen(sock_path) + 1);
    listen_fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (listen_fd < 0 || bind(listen_fd, (struct sockaddr *)&addr, sizeof addr) < 0 ||
        listen(listen_fd, 4) < 0) {
        perror("fake daemon socket");
        return 1;
    }
    RUN(stream_and_errors);
    RUN(cancel_from_callback);
    RUN(call_from_a_callback_is_refused);
    RUN(listings_and_status);
    RUN(embed_and_rerank);
    RUN(kb_add_progress_frames);
    RUN(daemon_refuses_stream);
    RUN(connect_failures);
    RUN(connection_stays_off_standard_fds);
    close(listen_fd);
    return test_finish();
}
