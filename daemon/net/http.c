/*
 * http.c — the OpenAI-compatible HTTP gateway (http.h): HTTP requests (daemon/net/httpwire.h)
 * turned into native Requests on connections of their own, their Response frames into
 * JSON and Server-Sent Events; what each HTTP connection and body may hold, counted.
 */
#include "daemon/net/http.h"

#include <ctype.h>
#include <errno.h>
#include <event2/buffer.h>
#include <grp.h>
#include <json-c/json.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pwd.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

#include "daemon/net/httpwire.h"
#include "daemon/net/server.h"
#include "daemon/net/session.h"
#include "engine/tok/stop.h"
#include "proto/frame.h"

#define HREQ_BUCKETS 256
#define MAX_COUNTS 64           /* (route, status) pairs /metrics counts */
#define APP_HEADER "X-Llmsd-App"
#define MAX_HEADERS_BYTES (64 << 10)
#define IDLE_MS 60000           /* a keep-alive connection with no request closes */
/* A body's deadline grows with its size, as a native frame's: a MiB a second is far
 * below what any local client sends, however loaded the machine. */
#define BODY_MS_PER_MIB 1000
/* Request ids on a gateway connection: its Bind, then its one request. */
#define ID_BIND 1
#define ID_WORK 2

enum route {
    R_MODELS,
    R_CHAT,
    R_COMPLETIONS,
    R_EMBEDDINGS,
    R_RERANK,
    R_RAG,
    R_HEALTH,
    R_METRICS,
    R_OTHER,
};

static const char *const route_path[] = {
    "/v1/models", "/v1/chat/completions", "/v1/completions", "/v1/embeddings",
    "/v1/rerank", "/v1/llmsd/rag", "/health", "/metrics", "other",
};

/* Tokens are kept as digests only: a lookup hashes the presented token and compares
 * digests of one fixed size in constant time, so neither the time a lookup takes nor
 * the daemon's memory tells anything of a token. */
#define TOKEN_DIGEST_BYTES 32
#define TOKEN_MIN_BYTES 16

typedef struct token_entry {
    unsigned char digest[TOKEN_DIGEST_BYTES]; /* BLAKE2b of the token */
    uid_t uid;
    char app[SCHED_APP_MAX + 1];
    bool admin;
} token_entry;

struct hreq;

/* One HTTP connection: whom it counts against, and its request between head and body. */
typedef struct gwconn {
    http *h;
    bool tcp;
    bool has_uid;              /* counted under uid (server_conn_add); else under the
                                  unauthenticated TCP peers (n_unauth) */
    uid_t uid;
    size_t reserved;           /* body bytes it holds of the budgets (body_bytes) */
    enum route route;          /* the request whose body is being read ... */
    session ss;                /* ... and who sent it */
    struct hreq *hr;           /* its request waiting for the worker, or NULL */
} gwconn;

typedef struct hreq {
    http *h;
    httpwire_conn *wc;
    gwconn *gc;
    session ss;
    enum route route;
    json_object *body;         /* the parsed request, kept for the texts it holds */
    bool stream, include_usage, base64, return_documents;
    bool started;              /* the SSE reply (headers and chunks) has begun */
    bool done;                 /* answered (or gone): only freeing is left */
    bool cancel_sent;          /* the client reads too slowly: generation cancelled */
    const char *context_id;    /* "llmsd": {"context": ...}, or NULL */
    const char *model_named;   /* the body's "model", or NULL: the route's default */
    char model[MODELS_NAME_MAX + 1]; /* the model the reply names */
    enum chat_family family;   /* its chat template (a chat is rendered with it) */
    size_t sent;               /* bytes of reply text already streamed */
    char *prefix;              /* the start of every SSE chunk ("data: {...,\"choices\":[{") */
    struct evbuffer *sse;
    char id[48];
    int64_t created;
    struct hreq *next;
} hreq;

/* Request bodies in flight of one uid (uids with any). */
typedef struct uid_bodies {
    uid_t uid;
    size_t bytes;
} uid_bodies;

typedef struct count {
    enum route route;
    int status;
    uint64_t n;
} count;

struct http {
    struct event_base *base;
    const config *cfg;
    session_env senv;
    models *reg;               /* only models_view_update: the worker owns the rest */
    models_view view;          /* the registry's names, roles and templates, brought up to
                                  date at each request */
    server *srv;               /* counts the connections with the native ones */
    httpwire *wire;
    bool owns_path;
    token_entry *tokens;
    size_t n_tokens;
    bool have_admin_gid;
    gid_t admin_gid;
    uint64_t next_id;
    bool shutting, worker_done;
    unsigned n_reqs;
    hreq *buckets[HREQ_BUCKETS];
    unsigned n_conns;          /* HTTP connections open */
    unsigned n_unauth;         /* ... of them on TCP with no valid token yet */
    size_t body_bytes;         /* bodies being received, every uid together */
    uid_bodies *ub;
    size_t n_ub, cap_ub;
    /* /metrics */
    count counts[MAX_COUNTS];
    size_t n_counts;
    uint64_t prompt_tokens, completion_tokens, embed_tokens, cancelled;
};

/* ---- small helpers ---- */

static void count_status(http *h, enum route r, int status)
{
    for (size_t i = 0; i < h->n_counts; i++)
        if (h->counts[i].route == r && h->counts[i].status == status) {
            h->counts[i].n++;
            return;
        }
    if (h->n_counts < MAX_COUNTS)
        h->counts[h->n_counts++] = (count){r, status, 1};
}

/* The HTTP status, OpenAI error type and code of a native error. */
static void map_error(Llms__ErrorCode c, int *status, const char **type, const char **code)
{
    *type = "server_error";
    switch (c) {
    case LLMS__ERROR_CODE__INVALID_ARGUMENT:
        *status = 400, *type = "invalid_request_error", *code = "invalid_argument";
        break;
    case LLMS__ERROR_CODE__NOT_FOUND:
        *status = 404, *type = "invalid_request_error", *code = "not_found";
        break;
    case LLMS__ERROR_CODE__PERMISSION_DENIED:
        *status = 403, *type = "permission_error", *code = "permission_denied";
        break;
    case LLMS__ERROR_CODE__RESOURCE_EXHAUSTED:
        *status = 429, *type = "rate_limit_error", *code = "resource_exhausted";
        break;
    case LLMS__ERROR_CODE__FAILED_PRECONDITION:
        *status = 409, *type = "invalid_request_error", *code = "failed_precondition";
        break;
    case LLMS__ERROR_CODE__UNAVAILABLE:
        *status = 503, *code = "unavailable";
        break;
    case LLMS__ERROR_CODE__UNIMPLEMENTED:
        *status = 501, *code = "unimplemented";
        break;
    case LLMS__ERROR_CODE__DEADLINE_EXCEEDED:
        *status = 504, *code = "deadline_exceeded";
        break;
    case LLMS__ERROR_CODE__CANCELLED:
        *status = 500, *code = "cancelled";
        break;
    default:
        *status = 500, *code = "internal_error";
        break;
    }
}

static const char *stop_name(Llms__StopReason r)
{
    switch (r) {
    case LLMS__STOP_REASON__STOP_EOS: return "eos";
    case LLMS__STOP_REASON__STOP_MAX_TOKENS: return "max_tokens";
    case LLMS__STOP_REASON__STOP_STRING: return "stop_string";
    case LLMS__STOP_REASON__STOP_CONTEXT_FULL: return "context_full";
    case LLMS__STOP_REASON__STOP_CANCELLED: return "cancelled";
    case LLMS__STOP_REASON__STOP_DEADLINE: return "deadline";
    case LLMS__STOP_REASON__STOP_SHUTDOWN: return "shutdown";
    default: return "unknown";
    }
}

/* OpenAI's finish_reason: "stop" and "length" where they apply; the reasons OpenAI has
 * no word for keep llmsd's name rather than pass for a normal end. */
static const char *finish_reason(Llms__StopReason r)
{
    switch (r) {
    case LLMS__STOP_REASON__STOP_EOS:
    case LLMS__STOP_REASON__STOP_STRING:
        return "stop";
    case LLMS__STOP_REASON__STOP_MAX_TOKENS:
    case LLMS__STOP_REASON__STOP_CONTEXT_FULL:
        return "length";
    default:
        return stop_name(r);
    }
}

static const char *json_text(json_object *o)
{
    return json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
}

/* Sends o (taken) as a JSON reply. */
static void send_json(http *h, httpwire_conn *wc, enum route r, int status, json_object *o)
{
    const char *s = o ? json_text(o) : NULL;
    httpwire_add_header(wc, "Content-Type", "application/json");
    if (!s)
        status = 500;
    httpwire_reply(wc, status, s ? s : "", s ? strlen(s) : 0);
    json_object_put(o);
    count_status(h, r, status);
}

static void send_error(http *h, httpwire_conn *wc, enum route r, int status,
                       const char *type, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));

/* OpenAI's error shape: {"error": {"message", "type", "param", "code"}}. */
static void send_error(http *h, httpwire_conn *wc, enum route r, int status,
                       const char *type, const char *code, const char *fmt, ...)
{
    char msg[ERR_MAX + 256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    json_object *e = json_object_new_object(), *o = json_object_new_object();
    if (e && o) {
        json_object_object_add(e, "message", json_object_new_string(msg));
        json_object_object_add(e, "type", json_object_new_string(type));
        json_object_object_add(e, "param", NULL);
        json_object_object_add(e, "code", json_object_new_string(code));
        json_object_object_add(o, "error", e);
        e = NULL;
    }
    json_object_put(e);
    send_json(h, wc, r, status, o);
}

static void bad_request(http *h, httpwire_conn *wc, enum route r, const char *msg)
{
    send_error(h, wc, r, 400, "invalid_request_error", "invalid_request", "%s", msg);
}

/* Appends s as the inside of a JSON string. Streamed text is escaped here rather than
 * through json-c, which would build and free an object per token. */
static void add_escaped(struct evbuffer *b, const char *s, size_t n)
{
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        evbuffer_add(b, s + run, i - run);
        char esc[8];
        switch (c) {
        case '"': strcpy(esc, "\\\""); break;
        case '\\': strcpy(esc, "\\\\"); break;
        case '\n': strcpy(esc, "\\n"); break;
        case '\r': strcpy(esc, "\\r"); break;
        case '\t': strcpy(esc, "\\t"); break;
        default: snprintf(esc, sizeof esc, "\\u%04x", c); break;
        }
        evbuffer_add(b, esc, strlen(esc));
        run = i + 1;
    }
    evbuffer_add(b, s + run, n - run);
}

/* ---- requests in flight ---- */

static hreq **hreq_bucket(http *h, uint64_t id)
{
    return &h->buckets[(id ^ (id >> 17)) % HREQ_BUCKETS];
}

static hreq *hreq_find(http *h, uint64_t id)
{
    for (hreq *r = *hreq_bucket(h, id); r; r = r->next)
        if (r->ss.conn_id == id)
            return r;
    return NULL;
}

static void hreq_unlink(hreq *hr)
{
    hreq **pp = hreq_bucket(hr->h, hr->ss.conn_id);
    while (*pp && *pp != hr)
        pp = &(*pp)->next;
    if (*pp) {
        *pp = hr->next;
        hr->h->n_reqs--;
    }
}

/* Ends the request towards the worker and the loop: the connection is closed as a
 * native one is (which cancels anything of it still running), and the HTTP connection
 * no longer waits for it. The caller answers it (the HTTP connection is still there) or
 * the client has gone. */
static void hreq_finish(hreq *hr)
{
    if (hr->done)
        return;
    hr->done = true;
    hreq_unlink(hr);
    if (hr->gc->hr == hr)
        hr->gc->hr = NULL;
    if (hr->ss.bound && !hr->h->worker_done) {
        sched_job *j = sched_job_new(SCHED_CLOSED, hr->ss.conn_id);
        if (j) {
            j->uid = hr->ss.uid;
            snprintf(j->app, sizeof j->app, "%s", hr->ss.app);
            sched_submit(hr->h->senv.sch, j);
        }
    }
}

static void hreq_free(hreq *hr)
{
    hreq_finish(hr);
    json_object_put(hr->body);
    if (hr->sse)
        evbuffer_free(hr->sse);
    free(hr->prefix);
    free(hr);
}

/* The client went away before its answer (its connection is gone): the worker drops
 * the request (a generation is cancelled within a step). */
static void hreq_gone(hreq *hr)
{
    hr->h->cancelled++;
    hreq_free(hr);
}

/* ---- answers ---- */

static void finish_error(hreq *hr, Llms__ErrorCode code, const char *msg)
{
    int status;
    const char *type, *ecode;
    map_error(code, &status, &type, &ecode);
    hreq_finish(hr);
    if (!hr->started) {
        send_error(hr->h, hr->wc, hr->route, status, type, ecode, "%s", msg);
        return;
    }
    /* The stream has begun with 200: the error is its last event. */
    json_object *e = json_object_new_object(), *o = json_object_new_object();
    if (e && o) {
        json_object_object_add(e, "message", json_object_new_string(msg));
        json_object_object_add(e, "type", json_object_new_string(type));
        json_object_object_add(e, "code", json_object_new_string(ecode));
        json_object_object_add(o, "error", e);
        e = NULL;
        evbuffer_add_printf(hr->sse, "data: %s\n\n", json_text(o));
    }
    json_object_put(e);
    json_object_put(o);
    evbuffer_add_printf(hr->sse, "data: [DONE]\n\n");
    httpwire_stream_chunk(hr->wc, hr->sse);
    httpwire_stream_end(hr->wc);
}

/* The JSON object every chunk and reply of a generation starts with. */
static json_object *gen_head(hreq *hr, const char *object)
{
    json_object *o = json_object_new_object();
    if (!o)
        return NULL;
    json_object_object_add(o, "id", json_object_new_string(hr->id));
    json_object_object_add(o, "object", json_object_new_string(object));
    json_object_object_add(o, "created", json_object_new_int64(hr->created));
    json_object_object_add(o, "model", json_object_new_string(hr->model));
    return o;
}

static bool is_chat(const hreq *hr)
{
    return hr->route == R_CHAT;
}

/* Begins the SSE reply: headers, then for chat the assistant role. */
static int sse_start(hreq *hr)
{
    if (hr->started)
        return 0;
    json_object *o = gen_head(hr, is_chat(hr) ? "chat.completion.chunk" : "text_completion");
    const char *s = o ? json_text(o) : NULL;
    size_t n = s ? strlen(s) : 0;
    const char *tail = ",\"choices\":[{\"index\":0,";
    hr->prefix = n ? malloc(6 + n + strlen(tail)) : NULL;
    if (!hr->prefix) {
        json_object_put(o);
        return -1;
    }
    /* s ends with '}': the object stays open for its choices. */
    sprintf(hr->prefix, "data: %.*s%s", (int)(n - 1), s, tail);
    json_object_put(o);
    httpwire_add_header(hr->wc, "Content-Type", "text/event-stream");
    httpwire_add_header(hr->wc, "Cache-Control", "no-cache");
    httpwire_stream_start(hr->wc, 200);
    count_status(hr->h, hr->route, 200);
    hr->started = true;
    if (is_chat(hr)) {
        evbuffer_add_printf(hr->sse, "%s\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"
                                     "\"logprobs\":null,\"finish_reason\":null}]}\n\n",
                            hr->prefix);
        httpwire_stream_chunk(hr->wc, hr->sse);
    }
    return 0;
}

/* One SSE event with a piece of text and, at the end, the finish reason. */
static void sse_text(hreq *hr, const char *text, size_t n, const char *finish)
{
    struct evbuffer *b = hr->sse;
    evbuffer_add(b, hr->prefix, strlen(hr->prefix));
    if (is_chat(hr)) {
        if (n || !finish) {
            evbuffer_add(b, "\"delta\":{\"content\":\"", 20);
            add_escaped(b, text, n);
            evbuffer_add(b, "\"}", 2);
        } else {
            evbuffer_add(b, "\"delta\":{}", 10);
        }
    } else {
        evbuffer_add(b, "\"text\":\"", 8);
        add_escaped(b, text, n);
        evbuffer_add(b, "\"", 1);
    }
    if (finish)
        evbuffer_add_printf(b, ",\"logprobs\":null,\"finish_reason\":\"%s\"}]}\n\n", finish);
    else
        evbuffer_add(b, ",\"logprobs\":null,\"finish_reason\":null}]}\n\n", 42);
    httpwire_stream_chunk(hr->wc, b);
    hr->sent += n;
}

/* Bytes the client has not read yet. */
static size_t unread(const hreq *hr)
{
    return httpwire_unsent(hr->wc);
}

static void on_chunk(hreq *hr, const Llms__CallChunk *ch)
{
    if (!hr->stream)
        return;
    if (sse_start(hr)) {
        finish_error(hr, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        return;
    }
    if (unread(hr) > SERVER_OUT_CAP) {
        /* As for a native connection that does not read: the generation stops, and the
         * final result (the whole text) fills in what was not streamed. */
        if (!hr->cancel_sent) {
            sched_job *j = sched_job_new(SCHED_CANCEL_STREAMS, hr->ss.conn_id);
            if (j)
                sched_submit(hr->h->senv.sch, j);
            hr->cancel_sent = true;
        }
        return;
    }
    sse_text(hr, ch->text, strlen(ch->text), NULL);
}

static json_object *usage_obj(uint32_t prompt, uint32_t gen)
{
    json_object *u = json_object_new_object();
    if (u) {
        json_object_object_add(u, "prompt_tokens", json_object_new_int64(prompt));
        json_object_object_add(u, "completion_tokens", json_object_new_int64(gen));
        json_object_object_add(u, "total_tokens", json_object_new_int64((int64_t)prompt + gen));
    }
    return u;
}

static json_object *llmsd_obj(const hreq *hr, const Llms__CallResult *res)
{
    json_object *x = json_object_new_object();
    if (!x)
        return NULL;
    json_object_object_add(x, "stop_reason", json_object_new_string(stop_name(res->stop_reason)));
    json_object_object_add(x, "queue_ms", json_object_new_double(res->queue_ms));
    json_object_object_add(x, "prefill_ms", json_object_new_double(res->prefill_ms));
    json_object_object_add(x, "decode_ms", json_object_new_double(res->decode_ms));
    if (hr->context_id) {
        json_object_object_add(x, "context", json_object_new_string(hr->context_id));
        json_object_object_add(x, "context_tokens", json_object_new_int64(res->context_tokens));
    }
    return x;
}

/* The final reply of a generation (a completion, a chat turn, a RAG answer): the last SSE
 * chunks, or the whole object; extra is its "llmsd" object (taken over, may be NULL). */
static void reply_generation(hreq *hr, uint32_t prompt_tokens, uint32_t generated_tokens,
                             Llms__StopReason stop, const char *text, json_object *extra)
{
    http *h = hr->h;
    h->prompt_tokens += prompt_tokens;
    h->completion_tokens += generated_tokens;
    const char *fin = finish_reason(stop);
    if (hr->stream) {
        if (sse_start(hr)) {
            finish_error(hr, LLMS__ERROR_CODE__INTERNAL, "out of memory");
            return;
        }
        hreq_finish(hr);
        size_t len = strlen(text);
        /* Text of chunks dropped for a slow reader, or none. */
        size_t from = hr->sent < len ? hr->sent : len;
        sse_text(hr, text + from, len - from, fin);
        /* A RAG answer's outcome and passages come in this last chunk whether or not
         * usage was asked for: they are what the route is for. */
        if (hr->include_usage || hr->route == R_RAG) {
            json_object *o = gen_head(hr, is_chat(hr) ? "chat.completion.chunk" : "text_completion");
            if (o) {
                json_object_object_add(o, "choices", json_object_new_array());
                json_object_object_add(o, "usage", usage_obj(prompt_tokens, generated_tokens));
                json_object_object_add(o, "llmsd", extra);
                extra = NULL;
                evbuffer_add_printf(hr->sse, "data: %s\n\n", json_text(o));
                json_object_put(o);
            }
        }
        json_object_put(extra);
        evbuffer_add_printf(hr->sse, "data: [DONE]\n\n");
        httpwire_stream_chunk(hr->wc, hr->sse);
        httpwire_stream_end(hr->wc);
        return;
    }
    hreq_finish(hr);
    json_object *o = gen_head(hr, is_chat(hr) ? "chat.completion" : "text_completion");
    json_object *choices = json_object_new_array(), *c = json_object_new_object();
    if (!o || !choices || !c) {
        json_object_put(choices);
        json_object_put(c);
        json_object_put(o);
        json_object_put(extra);
        send_error(h, hr->wc, hr->route, 500, "server_error", "internal_error", "out of memory");
        return;
    }
    json_object_object_add(c, "index", json_object_new_int(0));
    if (is_chat(hr)) {
        json_object *m = json_object_new_object();
        json_object_object_add(m, "role", json_object_new_string("assistant"));
        json_object_object_add(m, "content", json_object_new_string(text));
        json_object_object_add(c, "message", m);
    } else {
        json_object_object_add(c, "text", json_object_new_string(text));
    }
    json_object_object_add(c, "logprobs", NULL);
    json_object_object_add(c, "finish_reason", json_object_new_string(fin));
    json_object_array_add(choices, c);
    json_object_object_add(o, "choices", choices);
    json_object_object_add(o, "usage", usage_obj(prompt_tokens, generated_tokens));
    json_object_object_add(o, "llmsd", extra);
    send_json(h, hr->wc, hr->route, 200, o);
}

static void on_result(hreq *hr, const Llms__CallResult *res)
{
    reply_generation(hr, res->prompt_tokens, res->generated_tokens, res->stop_reason, res->text,
                     llmsd_obj(hr, res));
}

static const char *rag_outcome_name(Llms__RagOutcome o)
{
    switch (o) {
    case LLMS__RAG_OUTCOME__RAG_QA_HIT:
        return "qa_hit";
    case LLMS__RAG_OUTCOME__RAG_QKV_HIT:
        return "qkv_hit";
    default:
        return "miss";
    }
}

/* A RAG answer: as a completion, with the cache outcome, the passages used and the
 * latency breakdown in its "llmsd" object. */
static void on_rag_result(hreq *hr, const Llms__RagResult *res)
{
    json_object *x = json_object_new_object(), *ps = json_object_new_array();
    if (x && ps) {
        json_object_object_add(x, "stop_reason",
                               json_object_new_string(stop_name(res->stop_reason)));
        json_object_object_add(x, "outcome",
                               json_object_new_string(rag_outcome_name(res->outcome)));
        json_object_object_add(x, "reused_tokens", json_object_new_int64(res->reused_tokens));
        json_object_object_add(x, "reused_passages",
                               json_object_new_int64(res->reused_passages));
        if (res->has_qa_similarity)
            json_object_object_add(x, "qa_similarity",
                                   json_object_new_double(res->qa_similarity));
        json_object_object_add(x, "queue_ms", json_object_new_double(res->queue_ms));
        json_object_object_add(x, "retrieve_ms", json_object_new_double(res->retrieve_ms));
        json_object_object_add(x, "prefill_ms", json_object_new_double(res->prefill_ms));
        json_object_object_add(x, "decode_ms", json_object_new_double(res->decode_ms));
        for (size_t i = 0; i < res->n_passages; i++) {
            const Llms__KbHit *k = res->passages[i];
            json_object *e = json_object_new_object();
            if (!e)
                continue;
            json_object_object_add(e, "passage", json_object_new_int64((int64_t)k->passage));
            json_object_object_add(e, "document", json_object_new_string(k->document));
            json_object_object_add(e, "seq", json_object_new_int64(k->seq));
            json_object_object_add(e, "score", json_object_new_double(k->score));
            json_object_array_add(ps, e);
        }
        json_object_object_add(x, "passages", ps);
        ps = NULL;
    }
    json_object_put(ps);
    reply_generation(hr, res->prompt_tokens, res->generated_tokens, res->stop_reason, res->text,
                     x);
}

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* The vector as little-endian float32 bytes in base64 (what OpenAI's encoding_format
 * "base64" sends). Fresh string. */
static char *vector_base64(const float *v, size_t n)
{
    size_t bytes = n * 4;
    char *out = malloc((bytes + 2) / 3 * 4 + 1);
    if (!out)
        return NULL;
    uint8_t in[3];
    size_t k = 0, o = 0;
    for (size_t i = 0; i < bytes; i++) {
        uint32_t bits;
        memcpy(&bits, &v[i / 4], 4);
        in[k++] = (uint8_t)(bits >> (8 * (i % 4)));
        if (k == 3 || i == bytes - 1) {
            uint32_t w = (uint32_t)in[0] << 16 | (k > 1 ? (uint32_t)in[1] << 8 : 0) |
                         (k > 2 ? in[2] : 0);
            out[o++] = b64[w >> 18 & 63];
            out[o++] = b64[w >> 12 & 63];
            out[o++] = k > 1 ? b64[w >> 6 & 63] : '=';
            out[o++] = k > 2 ? b64[w & 63] : '=';
            k = 0;
        }
    }
    out[o] = '\0';
    return out;
}

static void on_embed(hreq *hr, const Llms__EmbedResponse *e)
{
    http *h = hr->h;
    hreq_finish(hr);
    json_object *o = json_object_new_object(), *data = json_object_new_array();
    if (!o || !data) {
        json_object_put(o);
        json_object_put(data);
        send_error(h, hr->wc, hr->route, 500, "server_error", "internal_error", "out of memory");
        return;
    }
    uint64_t tokens = 0;
    for (size_t i = 0; i < e->n_vectors; i++) {
        const Llms__Vector *v = e->vectors[i];
        json_object *item = json_object_new_object(), *emb;
        if (hr->base64) {
            char *s = vector_base64(v->values, v->n_values);
            emb = s ? json_object_new_string(s) : NULL;
            free(s);
        } else {
            emb = json_object_new_array_ext((int)v->n_values);
            for (size_t d = 0; emb && d < v->n_values; d++)
                json_object_array_add(emb, json_object_new_double(v->values[d]));
        }
        json_object_object_add(item, "object", json_object_new_string("embedding"));
        json_object_object_add(item, "index", json_object_new_int((int)i));
        json_object_object_add(item, "embedding", emb);
        json_object_array_add(data, item);
        if (i < e->n_n_tokens)
            tokens += e->n_tokens[i];
    }
    h->embed_tokens += tokens;
    json_object_object_add(o, "object", json_object_new_string("list"));
    json_object_object_add(o, "data", data);
    json_object_object_add(o, "model", json_object_new_string(hr->model));
    json_object *u = json_object_new_object();
    json_object_object_add(u, "prompt_tokens", json_object_new_int64((int64_t)tokens));
    json_object_object_add(u, "total_tokens", json_object_new_int64((int64_t)tokens));
    json_object_object_add(o, "usage", u);
    send_json(h, hr->wc, hr->route, 200, o);
}

/* The text of documents[i] of the request (a string or {"text": ...}). */
static const char *document_text(json_object *docs, size_t i)
{
    json_object *d = json_object_array_get_idx(docs, i), *t;
    if (json_object_is_type(d, json_type_object) && json_object_object_get_ex(d, "text", &t))
        d = t;
    return json_object_get_string(d);
}

static void on_rerank(hreq *hr, const Llms__RerankResponse *rr)
{
    http *h = hr->h;
    hreq_finish(hr);
    json_object *o = json_object_new_object(), *results = json_object_new_array(), *docs = NULL;
    if (!o || !results) {
        json_object_put(o);
        json_object_put(results);
        send_error(h, hr->wc, hr->route, 500, "server_error", "internal_error", "out of memory");
        return;
    }
    json_object_object_get_ex(hr->body, "documents", &docs);
    for (size_t i = 0; i < rr->n_hits; i++) {
        json_object *item = json_object_new_object();
        float s = rr->hits[i]->score;
        json_object_object_add(item, "index", json_object_new_int((int)rr->hits[i]->index));
        json_object_object_add(item, "relevance_score", isnan(s) ? NULL : json_object_new_double(s));
        if (hr->return_documents && docs) {
            json_object *d = json_object_new_object();
            json_object_object_add(d, "text",
                                   json_object_new_string(document_text(docs, rr->hits[i]->index)));
            json_object_object_add(item, "document", d);
        }
        json_object_array_add(results, item);
    }
    json_object_object_add(o, "object", json_object_new_string("list"));
    json_object_object_add(o, "model", json_object_new_string(hr->model));
    json_object_object_add(o, "results", results);
    send_json(h, hr->wc, hr->route, 200, o);
}

static void metric(struct evbuffer *b, const char *name, const char *type, const char *help,
                   double v)
{
    evbuffer_add_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

/* /metrics: what llmsctl status shows, plus the gateway's own counters. */
static void on_status(hreq *hr, const Llms__StatusResponse *st)
{
    http *h = hr->h;
    hreq_finish(hr);
    struct evbuffer *b = evbuffer_new();
    if (!b) {
        send_error(h, hr->wc, hr->route, 500, "server_error", "internal_error", "out of memory");
        return;
    }
    /* This request is answered 200 and counts too. */
    count_status(h, R_METRICS, 200);
    evbuffer_add_printf(b, "# HELP llmsd_http_requests_total HTTP requests answered, by route "
                           "and status\n# TYPE llmsd_http_requests_total counter\n");
    for (size_t i = 0; i < h->n_counts; i++)
        evbuffer_add_printf(b, "llmsd_http_requests_total{route=\"%s\",code=\"%d\"} %llu\n",
                            route_path[h->counts[i].route], h->counts[i].status,
                            (unsigned long long)h->counts[i].n);
    metric(b, "llmsd_http_requests_in_flight", "gauge", "HTTP requests waiting for the worker",
           h->n_reqs);
    metric(b, "llmsd_http_connections", "gauge", "HTTP connections open", h->n_conns);
    metric(b, "llmsd_http_body_bytes_in_flight", "gauge",
           "bytes of HTTP request bodies reserved while they arrive", (double)h->body_bytes);
    metric(b, "llmsd_http_disconnects_total", "counter",
           "HTTP requests whose client left before the answer (cancelled)", (double)h->cancelled);
    metric(b, "llmsd_http_prompt_tokens_total", "counter",
           "prompt tokens evaluated for HTTP completions", (double)h->prompt_tokens);
    metric(b, "llmsd_http_completion_tokens_total", "counter",
           "tokens generated for HTTP completions", (double)h->completion_tokens);
    metric(b, "llmsd_http_embedding_tokens_total", "counter", "tokens embedded for HTTP requests",
           (double)h->embed_tokens);
    metric(b, "llmsd_uptime_seconds", "gauge", "time since the daemon started",
           (double)st->uptime_ms / 1000);
    metric(b, "llmsd_model_bytes", "gauge", "bytes of the model file", (double)st->model_bytes);
    metric(b, "llmsd_rss_bytes", "gauge", "resident memory of the daemon", (double)st->rss_bytes);
    metric(b, "llmsd_connections", "gauge", "native connections open", st->n_connections);
    metric(b, "llmsd_apps", "gauge", "apps known to the worker", st->n_apps);
    metric(b, "llmsd_contexts", "gauge", "contexts kept", st->n_contexts);
    metric(b, "llmsd_contexts_resident", "gauge", "contexts with KV in memory",
           st->n_resident_contexts);
    metric(b, "llmsd_requests_queued", "gauge", "engine requests waiting", st->queued_requests);
    metric(b, "llmsd_requests_running", "gauge", "engine requests running", st->running_requests);
    metric(b, "llmsd_kv_resident_bytes", "gauge", "resident KV cache bytes",
           (double)st->kv_bytes_resident);
    metric(b, "llmsd_kv_budget_bytes", "gauge", "resident KV cap, 0 = none",
           (double)st->kv_budget_bytes);
    metric(b, "llmsd_kv_spare_bytes", "gauge", "KV buffers kept for reuse",
           (double)st->kv_spare_bytes);
    evbuffer_add_printf(b, "# HELP llmsd_kv_bytes resident KV bytes by precision\n"
                           "# TYPE llmsd_kv_bytes gauge\n"
                           "llmsd_kv_bytes{bits=\"16\"} %llu\nllmsd_kv_bytes{bits=\"8\"} %llu\n"
                           "llmsd_kv_bytes{bits=\"4\"} %llu\nllmsd_kv_bytes{bits=\"2\"} %llu\n",
                        (unsigned long long)st->kv_f16_bytes, (unsigned long long)st->kv_int8_bytes,
                        (unsigned long long)st->kv_int4_bytes, (unsigned long long)st->kv_int2_bytes);
    metric(b, "llmsd_sched_steps_total", "counter", "scheduler steps", (double)st->sched_steps);
    metric(b, "llmsd_sched_step_mean_ms", "gauge", "mean step time over the last minute",
           st->sched_step_mean_ms);
    metric(b, "llmsd_sched_rows_per_step", "gauge", "mean rows per step over the last minute",
           st->sched_rows_per_step);
    metric(b, "llmsd_sched_longest_stall_ms", "gauge",
           "longest gap between two tokens of a stream in the last minute",
           st->sched_longest_stall_ms);
    metric(b, "llmsd_sched_active_sequences", "gauge", "generations decoding or prefilling",
           st->sched_active_sequences);
    evbuffer_add_printf(b, "# HELP llmsd_sched_queued requests waiting for admission by kind\n"
                           "# TYPE llmsd_sched_queued gauge\n"
                           "llmsd_sched_queued{kind=\"generate\"} %u\n"
                           "llmsd_sched_queued{kind=\"embed\"} %u\n"
                           "llmsd_sched_queued{kind=\"rerank\"} %u\n",
                        st->sched_queued_generate, st->sched_queued_embed, st->sched_queued_rerank);
    metric(b, "llmsd_swap_bytes_written_total", "counter", "KV chunk bytes written to the store",
           (double)st->swap_bytes_written);
    metric(b, "llmsd_swap_bytes_read_total", "counter", "KV chunk bytes read from the store",
           (double)st->swap_bytes_read);
    metric(b, "llmsd_swap_chunks_written_total", "counter", "KV chunks written",
           (double)st->swap_chunks_written);
    metric(b, "llmsd_swap_chunks_read_total", "counter", "KV chunks read",
           (double)st->swap_chunks_read);
    metric(b, "llmsd_swap_chunks_recomputed_total", "counter", "KV chunks recomputed at switch-in",
           (double)st->swap_chunks_recomputed);
    metric(b, "llmsd_swap_faults_total", "counter", "chunks brought in during a forward",
           (double)st->swap_faults);
    metric(b, "llmsd_swap_bad_blobs_total", "counter", "stored chunks found corrupt or missing",
           (double)st->swap_bad_blobs);
    metric(b, "llmsd_swap_stale_blobs_total", "counter", "stored chunks of a history that moved on",
           (double)st->swap_stale_blobs);
    metric(b, "llmsd_swap_writes_pending", "gauge", "swap-out batches queued or being written",
           st->swap_writes_pending);
    metric(b, "llmsd_swap_write_waits_total", "counter", "times the worker waited for a swap-out",
           (double)st->swap_write_waits);
    metric(b, "llmsd_swap_write_wait_ms_total", "counter", "time the worker waited for swap-outs",
           st->swap_write_wait_ms);
    metric(b, "llmsd_swap_write_failures_total", "counter", "swap-out batches that failed",
           (double)st->swap_write_failures);
    metric(b, "llmsd_switch_ins_total", "counter", "context switch-ins", (double)st->switch_ins);
    metric(b, "llmsd_switch_in_mean_ms", "gauge", "mean switch-in time", st->switch_in_mean_ms);
    httpwire_add_header(hr->wc, "Content-Type", "text/plain; version=0.0.4");
    size_t n = evbuffer_get_length(b);
    const unsigned char *text = evbuffer_pullup(b, -1);
    httpwire_reply(hr->wc, text ? 200 : 500, text, text ? n : 0);
    evbuffer_free(b);
}

/* A Response frame for hr, from the worker or from session_handle. */
static void hreq_frame(hreq *hr, const uint8_t *frame, size_t len)
{
    Llms__Response *r = len > FRAME_HEADER_BYTES
                            ? frame_unpack_response(frame + FRAME_HEADER_BYTES, len - FRAME_HEADER_BYTES)
                            : NULL;
    if (!r) {
        finish_error(hr, LLMS__ERROR_CODE__INTERNAL, "undecodable reply from the worker");
        return;
    }
    if (r->error) {
        finish_error(hr, r->error->code, r->error->message);
    } else if (r->body_case == LLMS__RESPONSE__BODY_BIND) {
        /* Bound: the request itself follows. */
    } else if (r->body_case == LLMS__RESPONSE__BODY_CHUNK) {
        on_chunk(hr, r->chunk);
    } else if (r->body_case == LLMS__RESPONSE__BODY_RESULT) {
        on_result(hr, r->result);
    } else if (r->body_case == LLMS__RESPONSE__BODY_RAG_RESULT) {
        on_rag_result(hr, r->rag_result);
    } else if (r->body_case == LLMS__RESPONSE__BODY_EMBED) {
        on_embed(hr, r->embed);
    } else if (r->body_case == LLMS__RESPONSE__BODY_RERANK) {
        on_rerank(hr, r->rerank);
    } else if (r->body_case == LLMS__RESPONSE__BODY_STATUS) {
        on_status(hr, r->status);
    } else {
        finish_error(hr, LLMS__ERROR_CODE__INTERNAL, "unexpected reply from the worker");
    }
    frame_free_response(r);
}

void http_deliver(http *h, uint64_t conn_id, const uint8_t *frame, size_t len, bool droppable)
{
    hreq *hr = hreq_find(h, conn_id);
    /* A whole reply is built from the final result: its streamed chunks are not even
     * decoded. */
    if (!hr || (droppable && !hr->stream))
        return;
    hreq_frame(hr, frame, len);
    if (hr->done)
        hreq_free(hr);
}

/* session_env.send: a frame session_handle answers itself (Bind, a refusal). */
static void gw_send(void *conn, uint8_t *frame, size_t len)
{
    hreq_frame(conn, frame, len);
    free(frame);
}

static void gw_submitted(void *conn)
{
    (void)conn;
}

/* Hands a request to session_handle as a native client's decoded frame. -1 when it
 * could not be built (the request is then answered). */
static int submit(hreq *hr, const Llms__Request *r)
{
    size_t n = llms__request__get_packed_size(r);
    uint8_t *buf = malloc(n ? n : 1);
    Llms__Request *req = NULL;
    if (buf) {
        llms__request__pack(r, buf);
        req = frame_unpack_request(buf, n);
        free(buf);
    }
    if (!req) {
        finish_error(hr, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        return -1;
    }
    session_handle(&hr->h->senv, &hr->ss, hr, req);
    return 0;
}

/* ---- reading requests ---- */

/* A field of o of type t (int accepted where double is asked): 1 found, 0 absent or
 * null, -1 wrong type (msg says which). */
static int field(json_object *o, const char *key, json_type t, json_object **out, char *msg,
                 size_t cap)
{
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) || json_object_is_type(v, json_type_null))
        return 0;
    json_type have = json_object_get_type(v);
    if (have == t || (t == json_type_double && have == json_type_int)) {
        *out = v;
        return 1;
    }
    snprintf(msg, cap, "'%s' must be %s", key,
             t == json_type_string ? "a string" : t == json_type_int ? "an integer"
             : t == json_type_double ? "a number" : t == json_type_boolean ? "a boolean"
             : t == json_type_array ? "an array" : "an object");
    return -1;
}

/* Sampling fields of an OpenAI request into p (strings point into body). */
static int read_params(json_object *body, Llms__GenerationParams *p, const char **stops,
                       size_t max_stops, char *msg, size_t cap)
{
    json_object *v;
    int rc;
    if ((rc = field(body, "temperature", json_type_double, &v, msg, cap)) < 0)
        return -1;
    if (rc)
        p->has_temperature = 1, p->temperature = (float)json_object_get_double(v);
    if ((rc = field(body, "top_p", json_type_double, &v, msg, cap)) < 0)
        return -1;
    if (rc)
        p->has_top_p = 1, p->top_p = (float)json_object_get_double(v);
    if ((rc = field(body, "min_p", json_type_double, &v, msg, cap)) < 0)
        return -1;
    if (rc)
        p->has_min_p = 1, p->min_p = (float)json_object_get_double(v);
    if ((rc = field(body, "repeat_penalty", json_type_double, &v, msg, cap)) < 0)
        return -1;
    if (rc)
        p->has_repeat_penalty = 1, p->repeat_penalty = (float)json_object_get_double(v);
    if ((rc = field(body, "top_k", json_type_int, &v, msg, cap)) < 0)
        return -1;
    if (rc) {
        int64_t k = json_object_get_int64(v);
        p->has_top_k = 1, p->top_k = k < 0 ? -1 : k > INT32_MAX ? INT32_MAX : (int32_t)k;
    }
    const char *mt = json_object_object_get_ex(body, "max_completion_tokens", NULL)
                         ? "max_completion_tokens" : "max_tokens";
    if ((rc = field(body, mt, json_type_int, &v, msg, cap)) < 0)
        return -1;
    if (rc) {
        int64_t n = json_object_get_int64(v);
        p->has_max_tokens = 1, p->max_tokens = n < 0 ? 0 : n > INT32_MAX ? INT32_MAX : (int32_t)n;
    }
    if ((rc = field(body, "seed", json_type_int, &v, msg, cap)) < 0)
        return -1;
    /* A negative seed is llama.cpp's "random". */
    if (rc && json_object_get_int64(v) >= 0)
        p->has_seed = 1, p->seed = (uint64_t)json_object_get_int64(v);
    if ((rc = field(body, "n", json_type_int, &v, msg, cap)) < 0)
        return -1;
    if (rc && json_object_get_int64(v) != 1) {
        snprintf(msg, cap, "'n' must be 1: one choice per request");
        return -1;
    }
    json_object *stop;
    if (!json_object_object_get_ex(body, "stop", &stop) || json_object_is_type(stop, json_type_null))
        return 0;
    if (json_object_is_type(stop, json_type_string)) {
        stops[p->n_stop++] = json_object_get_string(stop);
        return 0;
    }
    if (!json_object_is_type(stop, json_type_array)) {
        snprintf(msg, cap, "'stop' must be a string or an array of strings");
        return -1;
    }
    size_t n = json_object_array_length(stop);
    if (n > max_stops) {
        snprintf(msg, cap, "'stop' has %zu strings, at most %zu", n, max_stops);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        json_object *s = json_object_array_get_idx(stop, i);
        if (!json_object_is_type(s, json_type_string)) {
            snprintf(msg, cap, "'stop' must be a string or an array of strings");
            return -1;
        }
        stops[p->n_stop++] = json_object_get_string(s);
    }
    return 0;
}

/* A message's content: a string, or text parts joined (into *owned, to free). */
static const char *message_content(json_object *m, char **owned, char *msg, size_t cap)
{
    json_object *c;
    *owned = NULL;
    if (!json_object_object_get_ex(m, "content", &c) || json_object_is_type(c, json_type_null))
        return "";
    if (json_object_is_type(c, json_type_string))
        return json_object_get_string(c);
    if (!json_object_is_type(c, json_type_array)) {
        snprintf(msg, cap, "a message's 'content' must be a string or an array of parts");
        return NULL;
    }
    size_t n = json_object_array_length(c), len = 0;
    for (size_t pass = 0; pass < 2; pass++) {
        size_t at = 0;
        for (size_t i = 0; i < n; i++) {
            json_object *part = json_object_array_get_idx(c, i), *type, *text;
            /* a JSON null is a NULL json_object: every value is type-checked first */
            if (!json_object_is_type(part, json_type_object) ||
                !json_object_object_get_ex(part, "type", &type) ||
                !json_object_is_type(type, json_type_string) ||
                strcmp(json_object_get_string(type), "text") != 0 ||
                !json_object_object_get_ex(part, "text", &text) ||
                !json_object_is_type(text, json_type_string)) {
                free(*owned);
                *owned = NULL;
                snprintf(msg, cap, "only text content parts are supported");
                return NULL;
            }
            size_t k = (size_t)json_object_get_string_len(text);
            if (pass)
                memcpy(*owned + at, json_object_get_string(text), k);
            at += k;
        }
        if (!pass) {
            len = at;
            if (!(*owned = malloc(len + 1))) {
                snprintf(msg, cap, "out of memory");
                return NULL;
            }
        }
    }
    (*owned)[len] = '\0';
    return *owned;
}

/* The chat's messages rendered with a model's template and the assistant opening.
 * Fresh string, or NULL with msg. */
static char *render_chat(enum chat_family family, json_object *msgs, char *msg, size_t cap)
{
    size_t n = json_object_array_length(msgs);
    struct chat_message *cm = calloc(n ? n : 1, sizeof *cm);
    char **owned = calloc(n ? n : 1, sizeof *owned);
    char *out = NULL;
    if (!cm || !owned) {
        snprintf(msg, cap, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        json_object *m = json_object_array_get_idx(msgs, i), *role;
        if (!json_object_is_type(m, json_type_object) ||
            !json_object_object_get_ex(m, "role", &role) ||
            !json_object_is_type(role, json_type_string)) {
            snprintf(msg, cap, "messages[%zu] needs a 'role' string", i);
            goto done;
        }
        const char *r = json_object_get_string(role);
        /* OpenAI's newer name for the system role. */
        if (strcmp(r, "developer") == 0)
            r = "system";
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant")) {
            snprintf(msg, cap, "messages[%zu]: role '%.32s' is not supported (system, user, "
                               "assistant)", i, r);
            goto done;
        }
        cm[i].role = r;
        if (!(cm[i].content = message_content(m, &owned[i], msg, cap)))
            goto done;
    }
    int len = chat_apply(family, cm, (int)n, true, NULL, 0);
    if (len < 0 || !(out = malloc((size_t)len + 1))) {
        snprintf(msg, cap, len < 0 ? "the messages cannot be rendered" : "out of memory");
        goto done;
    }
    chat_apply(family, cm, (int)n, true, out, (size_t)len + 1);
done:
    for (size_t i = 0; owned && i < n; i++)
        free(owned[i]);
    free(owned);
    free(cm);
    return out;
}

/* Builds and submits the native request of a generation route. */
static void start_generate(hreq *hr, Llms__Request *r, char *msg, size_t cap)
{
    json_object *v, *x;
    const char *stops[STOP_MAX];
    Llms__GenerationParams gp = LLMS__GENERATION_PARAMS__INIT;
    gp.stop = (char **)stops;
    bool chat = hr->route == R_CHAT;
    int rc;
    if ((rc = field(hr->body, "stream", json_type_boolean, &v, msg, cap)) < 0)
        goto bad;
    hr->stream = rc && json_object_get_boolean(v);
    if (field(hr->body, "stream_options", json_type_object, &x, msg, cap) == 1 &&
        field(x, "include_usage", json_type_boolean, &v, msg, cap) == 1)
        hr->include_usage = json_object_get_boolean(v);
    if ((rc = field(hr->body, "llmsd", json_type_object, &x, msg, cap)) < 0)
        goto bad;
    if (rc && (rc = field(x, "context", json_type_string, &v, msg, cap)) < 0)
        goto bad;
    if (rc)
        hr->context_id = json_object_get_string(v);
    if (hr->context_id && !chat) {
        snprintf(msg, cap, "'llmsd.context' is for /v1/chat/completions");
        goto bad;
    }
    /* A rendered chat carries its template's end of turn as one more stop string. */
    size_t max_stops = STOP_MAX - 1 - (chat && !hr->context_id);
    if (read_params(hr->body, &gp, stops, max_stops, msg, cap))
        goto bad;
    char *prompt = NULL;
    Llms__CompleteRequest cr = LLMS__COMPLETE_REQUEST__INIT;
    Llms__CallRequest call = LLMS__CALL_REQUEST__INIT;
    if (chat) {
        json_object *msgs;
        if (field(hr->body, "messages", json_type_array, &msgs, msg, cap) != 1 ||
            json_object_array_length(msgs) == 0) {
            snprintf(msg, cap, "'messages' must be a non-empty array");
            goto bad;
        }
        if (hr->context_id) {
            /* The context holds the conversation: the turn is the last user message. */
            json_object *last = json_object_array_get_idx(msgs, json_object_array_length(msgs) - 1);
            json_object *role;
            if (!json_object_is_type(last, json_type_object) ||
                !json_object_object_get_ex(last, "role", &role) ||
                !json_object_is_type(role, json_type_string) ||
                strcmp(json_object_get_string(role), "user") != 0) {
                snprintf(msg, cap, "with 'llmsd.context' the last message must be the user's");
                goto bad;
            }
            char *owned;
            const char *text = message_content(last, &owned, msg, cap);
            if (!text)
                goto bad;
            prompt = owned ? owned : strdup(text);
            call.context_id = (char *)hr->context_id;
            call.model = (char *)hr->model_named;
            call.prompt = prompt;
            call.params = &gp;
            r->body_case = LLMS__REQUEST__BODY_CALL;
            r->call = &call;
        } else {
            if (!(prompt = render_chat(hr->family, msgs, msg, cap)))
                goto bad;
            stops[gp.n_stop++] = chat_stop_text(hr->family);
        }
    } else {
        json_object *p;
        if (!json_object_object_get_ex(hr->body, "prompt", &p)) {
            snprintf(msg, cap, "'prompt' is required");
            goto bad;
        }
        if (json_object_is_type(p, json_type_array) && json_object_array_length(p) == 1)
            p = json_object_array_get_idx(p, 0);
        if (!json_object_is_type(p, json_type_string)) {
            snprintf(msg, cap, "'prompt' must be a string (or an array of one string)");
            goto bad;
        }
        prompt = strdup(json_object_get_string(p));
    }
    if (!prompt) {
        finish_error(hr, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        return;
    }
    if (r->body_case != LLMS__REQUEST__BODY_CALL) {
        cr.prompt = prompt;
        cr.params = &gp;
        cr.model = (char *)hr->model_named;
        r->body_case = LLMS__REQUEST__BODY_COMPLETE;
        r->complete = &cr;
    }
    if (hr->stream && !(hr->sse = evbuffer_new())) {
        free(prompt);
        finish_error(hr, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        return;
    }
    submit(hr, r);
    free(prompt);
    return;
bad:
    finish_error(hr, LLMS__ERROR_CODE__INVALID_ARGUMENT, msg);
}

/* POST /v1/llmsd/rag: {"kb", "question", "top_k"?, "retrieval"? (rrf, sum, bm25, vector),
 * "system"?, "no_qa"?, "no_qkv"?, "share_system_uid"?, "stream"?, and the sampling fields of
 * a completion}. */
static void start_rag(hreq *hr, Llms__Request *r, char *msg, size_t cap)
{
    static const char *const retrievals[] = {"rrf", "sum", "bm25", "vector"};
    json_object *v;
    const char *stops[STOP_MAX];
    Llms__GenerationParams gp = LLMS__GENERATION_PARAMS__INIT;
    gp.stop = (char **)stops;
    Llms__RagQueryRequest rq = LLMS__RAG_QUERY_REQUEST__INIT;
    int rc;
    if ((rc = field(hr->body, "stream", json_type_boolean, &v, msg, cap)) < 0)
        goto bad;
    hr->stream = rc && json_object_get_boolean(v);
    if (field(hr->body, "kb", json_type_string, &v, msg, cap) != 1) {
        snprintf(msg, cap, "'kb' (a knowledge base name) is required");
        goto bad;
    }
    rq.kb = (char *)json_object_get_string(v);
    if (field(hr->body, "question", json_type_string, &v, msg, cap) != 1) {
        snprintf(msg, cap, "'question' (a string) is required");
        goto bad;
    }
    rq.question = (char *)json_object_get_string(v);
    if ((rc = field(hr->body, "top_k", json_type_int, &v, msg, cap)) < 0)
        goto bad;
    if (rc) {
        int64_t k = json_object_get_int64(v);
        if (k < 1 || k > UINT32_MAX) {
            snprintf(msg, cap, "'top_k' must be a positive integer");
            goto bad;
        }
        rq.has_top_k = 1;
        rq.top_k = (uint32_t)k;
    }
    if ((rc = field(hr->body, "retrieval", json_type_string, &v, msg, cap)) < 0)
        goto bad;
    if (rc) {
        const char *name = json_object_get_string(v);
        size_t i = 0;
        while (i < sizeof retrievals / sizeof retrievals[0] && strcmp(name, retrievals[i]))
            i++;
        if (i == sizeof retrievals / sizeof retrievals[0]) {
            snprintf(msg, cap, "'retrieval' must be rrf, sum, bm25 or vector");
            goto bad;
        }
        rq.has_retrieval = 1;
        rq.retrieval = (Llms__Retrieval)i;
    }
    if ((rc = field(hr->body, "system", json_type_string, &v, msg, cap)) < 0)
        goto bad;
    if (rc)
        rq.system_prompt = (char *)json_object_get_string(v);
    if ((rc = field(hr->body, "no_qa", json_type_boolean, &v, msg, cap)) < 0)
        goto bad;
    if (rc)
        rq.has_no_qa = 1, rq.no_qa = json_object_get_boolean(v);
    if ((rc = field(hr->body, "no_qkv", json_type_boolean, &v, msg, cap)) < 0)
        goto bad;
    if (rc)
        rq.has_no_qkv = 1, rq.no_qkv = json_object_get_boolean(v);
    if ((rc = field(hr->body, "share_system_uid", json_type_boolean, &v, msg, cap)) < 0)
        goto bad;
    if (rc)
        rq.has_share_system_uid = 1, rq.share_system_uid = json_object_get_boolean(v);
    if (read_params(hr->body, &gp, stops, STOP_MAX, msg, cap))
        goto bad;
    rq.params = &gp;
    if (hr->stream && !(hr->sse = evbuffer_new())) {
        finish_error(hr, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        return;
    }
    r->body_case = LLMS__REQUEST__BODY_RAG_QUERY;
    r->rag_query = &rq;
    submit(hr, r);
    return;
bad:
    finish_error(hr, LLMS__ERROR_CODE__INVALID_ARGUMENT, msg);
}

static void start_embed(hreq *hr, Llms__Request *r, char *msg, size_t cap)
{
    json_object *in, *v;
    int rc;
    if ((rc = field(hr->body, "encoding_format", json_type_string, &v, msg, cap)) < 0)
        goto bad;
    if (rc) {
        const char *f = json_object_get_string(v);
        if (strcmp(f, "float") && strcmp(f, "base64")) {
            snprintf(msg, cap, "'encoding_format' must be float or base64");
            goto bad;
        }
        hr->base64 = strcmp(f, "base64") == 0;
    }
    if (!json_object_object_get_ex(hr->body, "input", &in)) {
        snprintf(msg, cap, "'input' is required");
        goto bad;
    }
    bool one = json_object_is_type(in, json_type_string);
    size_t n = one ? 1 : json_object_is_type(in, json_type_array) ? json_object_array_length(in) : 0;
    if (n == 0) {
        snprintf(msg, cap, "'input' must be a string or a non-empty array of strings");
        goto bad;
    }
    const char **texts = malloc(n * sizeof *texts);
    if (!texts) {
        finish_error(hr, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        return;
    }
    for (size_t i = 0; i < n; i++) {
        json_object *t = one ? in : json_object_array_get_idx(in, i);
        if (!json_object_is_type(t, json_type_string)) {
            free(texts);
            snprintf(msg, cap, "'input' must be a string or an array of strings (token arrays "
                               "are not supported)");
            goto bad;
        }
        texts[i] = json_object_get_string(t);
    }
    Llms__EmbedRequest e = LLMS__EMBED_REQUEST__INIT;
    e.texts = (char **)texts;
    e.n_texts = n;
    e.model = (char *)hr->model_named;
    r->body_case = LLMS__REQUEST__BODY_EMBED;
    r->embed = &e;
    submit(hr, r);
    free(texts);
    return;
bad:
    finish_error(hr, LLMS__ERROR_CODE__INVALID_ARGUMENT, msg);
}

static void start_rerank(hreq *hr, Llms__Request *r, char *msg, size_t cap)
{
    json_object *q, *docs, *v;
    int rc;
    if (field(hr->body, "query", json_type_string, &q, msg, cap) != 1) {
        snprintf(msg, cap, "'query' must be a string");
        goto bad;
    }
    if (field(hr->body, "documents", json_type_array, &docs, msg, cap) != 1 ||
        json_object_array_length(docs) == 0) {
        snprintf(msg, cap, "'documents' must be a non-empty array");
        goto bad;
    }
    size_t n = json_object_array_length(docs);
    int64_t top = (int64_t)n;
    if ((rc = field(hr->body, "top_n", json_type_int, &v, msg, cap)) < 0)
        goto bad;
    if (rc)
        top = json_object_get_int64(v);
    if (top < 1) {
        snprintf(msg, cap, "'top_n' must be at least 1");
        goto bad;
    }
    if ((rc = field(hr->body, "return_documents", json_type_boolean, &v, msg, cap)) < 0)
        goto bad;
    hr->return_documents = rc && json_object_get_boolean(v);
    const char **texts = malloc(n * sizeof *texts);
    if (!texts) {
        finish_error(hr, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        return;
    }
    for (size_t i = 0; i < n; i++) {
        json_object *d = json_object_array_get_idx(docs, i), *t;
        if (json_object_is_type(d, json_type_object) && json_object_object_get_ex(d, "text", &t))
            d = t;
        if (!json_object_is_type(d, json_type_string)) {
            free(texts);
            snprintf(msg, cap, "documents[%zu] must be a string or {\"text\": string}", i);
            goto bad;
        }
        texts[i] = json_object_get_string(d);
    }
    Llms__RerankRequest rr = LLMS__RERANK_REQUEST__INIT;
    rr.query = (char *)json_object_get_string(q);
    rr.model = (char *)hr->model_named;
    rr.documents = (char **)texts;
    rr.n_documents = n;
    rr.has_top_k = 1;
    rr.top_k = (uint32_t)(top < (int64_t)n ? top : (int64_t)n);
    /* Relevance scores are the answer, so every winner's score must be finished. */
    rr.has_mode = 1;
    rr.mode = LLMS__RERANK_MODE__RERANK_ORDERED;
    r->body_case = LLMS__REQUEST__BODY_RERANK;
    r->rerank = &rr;
    submit(hr, r);
    free(texts);
    return;
bad:
    finish_error(hr, LLMS__ERROR_CODE__INVALID_ARGUMENT, msg);
}

/* ---- identity ---- */

static void token_digest(const char *token, unsigned char digest[TOKEN_DIGEST_BYTES])
{
    crypto_generichash(digest, TOKEN_DIGEST_BYTES, (const unsigned char *)token, strlen(token),
                       NULL, 0);
}

/* Who sent the request of wc: fills ss (uid, app, admin). 0, or an HTTP status with msg. */
static int identify(http *h, httpwire_conn *wc, int fd, session *ss, char *msg, size_t cap)
{
    int domain = 0;
    socklen_t dl = sizeof domain;
    if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &dl) != 0) {
        snprintf(msg, cap, "cannot identify the peer: %s", strerror(errno));
        return 500;
    }
    if (domain == AF_UNIX) {
        struct ucred cred;
        socklen_t len = sizeof cred;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
            snprintf(msg, cap, "cannot identify the peer: %s", strerror(errno));
            return 500;
        }
        const char *app = httpwire_header(wc, APP_HEADER);
        if (!app)
            app = FRAME_DEFAULT_APP;
        if (!session_valid_app(app)) {
            snprintf(msg, cap, APP_HEADER " must be 1..%d bytes of [A-Za-z0-9._-]", SCHED_APP_MAX);
            return 400;
        }
        ss->uid = cred.uid;
        ss->gid = cred.gid;
        ss->pid = cred.pid;
        ss->admin = session_peer_admin(fd, cred.uid, cred.gid, h->have_admin_gid, h->admin_gid);
        snprintf(ss->app, sizeof ss->app, "%s", app);
        return 0;
    }
    const char *auth = httpwire_header(wc, "Authorization");
    if (!auth || strncasecmp(auth, "Bearer ", 7) != 0) {
        snprintf(msg, cap, "an API key is required: Authorization: Bearer TOKEN");
        return 401;
    }
    const char *tok = auth + 7;
    while (*tok == ' ')
        tok++;
    unsigned char digest[TOKEN_DIGEST_BYTES];
    token_digest(tok, digest);
    const token_entry *match = NULL;
    for (size_t i = 0; i < h->n_tokens; i++) /* every entry, so the time names none */
        if (sodium_memcmp(digest, h->tokens[i].digest, TOKEN_DIGEST_BYTES) == 0)
            match = &h->tokens[i];
    if (!match) {
        snprintf(msg, cap, "invalid API key");
        return 401;
    }
    ss->uid = match->uid;
    ss->gid = (gid_t)-1;
    ss->admin = match->admin;
    snprintf(ss->app, sizeof ss->app, "%s", match->app);
    return 0;
}

/* ---- the request callback ---- */

static enum route route_of(const char *uri, size_t *len)
{
    size_t n = strcspn(uri, "?#");
    *len = n;
    if (n == 7 && strncmp(uri, "/rerank", 7) == 0)
        return R_RERANK;
    for (int r = 0; r < R_OTHER; r++)
        if (strlen(route_path[r]) == n && strncmp(uri, route_path[r], n) == 0)
            return (enum route)r;
    return R_OTHER;
}

/* The model named name, NULL when the registry has none. */
static const models_view_entry *view_find(const http *h, const char *name)
{
    for (size_t i = 0; i < h->view.n; i++)
        if (strcmp(h->view.entries[i].name, name) == 0)
            return &h->view.entries[i];
    return NULL;
}

/* The model a request of role runs on when it names none; NULL when no model has it. */
static const models_view_entry *view_default(const http *h, unsigned role)
{
    for (size_t i = 0; i < h->view.n; i++)
        if (h->view.entries[i].defaults & role)
            return &h->view.entries[i];
    return NULL;
}

static json_object *role_array(unsigned roles)
{
    json_object *a = json_object_new_array();
    for (unsigned bit = MODELS_GENERATE; a && bit <= MODELS_RERANK; bit <<= 1)
        if (roles & bit)
            json_object_array_add(a, json_object_new_string(models_role_name(bit)));
    return a;
}

/* Every model of the registry, the default generate model first (clients that take the
 * first as theirs get what a request naming none gets); OpenAI's shape, with each
 * model's roles and the roles it is the default for in "llmsd". */
static void send_models(http *h, httpwire_conn *wc)
{
    json_object *o = json_object_new_object(), *data = json_object_new_array();
    const models_view_entry *first = view_default(h, MODELS_GENERATE);
    for (size_t i = 0; i <= h->view.n && o && data; i++) {
        const models_view_entry *e = i == 0 ? first : &h->view.entries[i - 1];
        if (!e || (i > 0 && e == first))
            continue;
        json_object *m = json_object_new_object(), *x = json_object_new_object();
        if (!m || !x) {
            json_object_put(m);
            json_object_put(x);
            json_object_put(o);
            o = NULL;
            break;
        }
        json_object_object_add(m, "id", json_object_new_string(e->name));
        json_object_object_add(m, "object", json_object_new_string("model"));
        json_object_object_add(m, "created", json_object_new_int64(0));
        json_object_object_add(m, "owned_by", json_object_new_string("llmsd"));
        json_object_object_add(x, "roles", role_array(e->roles));
        json_object_object_add(x, "default_for", role_array(e->defaults));
        json_object_object_add(m, "llmsd", x);
        json_object_array_add(data, m);
    }
    if (o)
        json_object_object_add(o, "object", json_object_new_string("list"));
    if (o && data)
        json_object_object_add(o, "data", data);
    else
        json_object_put(data);
    send_json(h, wc, R_MODELS, 200, o);
}

/* The role a route's requests need of their model. */
static unsigned route_role(enum route r)
{
    return r == R_EMBEDDINGS ? MODELS_EMBED : r == R_RERANK ? MODELS_RERANK : MODELS_GENERATE;
}

/* The model a request of route r runs on: *e, the one body's "model" names (*named),
 * else the route's default (*named NULL; *e NULL when no model has the role, which the
 * worker answers). 0, or -1 after answering: 404 model_not_found for a name the registry
 * does not hold (naming those it holds), 400 for a RAG query on another model than the
 * default generate model (retrieval runs on that one only). A model that lacks the
 * route's role is the worker's to refuse, as for a native request. */
static int request_model(http *h, httpwire_conn *wc, enum route r, json_object *body,
                         const char **named, const models_view_entry **e)
{
    json_object *m;
    const models_view_entry *dflt = view_default(h, route_role(r));
    *named = NULL;
    *e = dflt;
    if (json_object_object_get_ex(body, "model", &m) && json_object_is_type(m, json_type_string)) {
        const char *name = json_object_get_string(m);
        if (!(*e = view_find(h, name))) {
            char names[256];
            size_t at = 0;
            names[0] = '\0';
            for (size_t i = 0; i < h->view.n && at < sizeof names; i++) {
                int w = snprintf(names + at, sizeof names - at, "%s'%s'", i ? ", " : "",
                                 h->view.entries[i].name);
                at += w > 0 ? (size_t)w : 0;
            }
            send_error(h, wc, r, 404, "invalid_request_error", "model_not_found",
                       "the model '%.200s' does not exist (this daemon serves %s)", name, names);
            return -1;
        }
        if (r == R_RAG && *e != dflt) {
            send_error(h, wc, r, 400, "invalid_request_error", "invalid_argument",
                       "%s runs on the default generate model '%s', not '%s'",
                       route_path[R_RAG], dflt ? dflt->name : "", (*e)->name);
            return -1;
        }
        *named = name;
    }
    return 0;
}

/* The request body as a JSON object, or NULL after answering. */
static json_object *read_body(http *h, httpwire_conn *wc, enum route r)
{
    size_t n;
    const char *p = httpwire_body(wc, &n);
    if (n == 0) {
        bad_request(h, wc, r, "the body must be a JSON object");
        return NULL;
    }
    json_tokener *tk = json_tokener_new();
    if (!tk) {
        send_error(h, wc, r, 500, "server_error", "internal_error", "out of memory");
        return NULL;
    }
    json_tokener_set_flags(tk, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
    json_object *o = json_tokener_parse_ex(tk, p, (int)n);
    enum json_tokener_error e = json_tokener_get_error(tk);
    size_t end = json_tokener_get_parse_end(tk);
    json_tokener_free(tk);
    while (o && end < n && isspace((unsigned char)p[end]))
        end++;
    if (!o || e != json_tokener_success || end != n || !json_object_is_type(o, json_type_object)) {
        json_object_put(o);
        bad_request(h, wc, r,
                    e == json_tokener_success || e == json_tokener_continue
                        ? "the body must be one JSON object"
                        : json_tokener_error_desc(e));
        return NULL;
    }
    return o;
}

/* ---- what connections and bodies hold ---- */

static uid_bodies *ub_find(http *h, uid_t uid)
{
    for (size_t i = 0; i < h->n_ub; i++)
        if (h->ub[i].uid == uid)
            return &h->ub[i];
    return NULL;
}

/*
 * Reserves n bytes of the body budgets for gc's request of uid before its body is read:
 * its uid's (http_max_body_buffered_bytes_per_uid) first, so that one uid over its share
 * hears that it is, then everyone's (http_max_body_buffered_bytes). 0, or the status it
 * is refused with (429, 503) and msg.
 */
static int reserve_body(http *h, gwconn *gc, uid_t uid, size_t n, char *msg, size_t cap)
{
    const config *cfg = h->cfg;
    uid_bodies *u = ub_find(h, uid);
    size_t mine = u ? u->bytes : 0;
    if (mine + n > (size_t)cfg->http_max_body_buffered_bytes_per_uid) {
        snprintf(msg, cap, "uid %u has %zu bytes of request bodies on their way; %zu more would "
                           "pass http_max_body_buffered_bytes_per_uid (%d)",
                 (unsigned)uid, mine, n, cfg->http_max_body_buffered_bytes_per_uid);
        return 429;
    }
    if (h->body_bytes + n > (size_t)cfg->http_max_body_buffered_bytes) {
        snprintf(msg, cap, "the gateway holds %zu bytes of request bodies on their way; %zu "
                           "more would pass http_max_body_buffered_bytes (%d)",
                 h->body_bytes, n, cfg->http_max_body_buffered_bytes);
        return 503;
    }
    if (!u) {
        if (h->n_ub == h->cap_ub) {
            size_t c = h->cap_ub ? 2 * h->cap_ub : 16;
            uid_bodies *p = realloc(h->ub, c * sizeof *p);
            if (!p) {
                snprintf(msg, cap, "out of memory");
                return 503;
            }
            h->ub = p;
            h->cap_ub = c;
        }
        u = &h->ub[h->n_ub++];
        *u = (uid_bodies){uid, 0};
    }
    u->bytes += n;
    h->body_bytes += n;
    gc->reserved = n;
    return 0;
}

static void release_body(http *h, gwconn *gc)
{
    if (!gc->reserved)
        return;
    uid_bodies *u = ub_find(h, gc->ss.uid);
    if (u && (u->bytes -= gc->reserved) == 0)
        *u = h->ub[--h->n_ub];
    h->body_bytes -= gc->reserved;
    gc->reserved = 0;
}

/* httpwire's open hook: the connection counts against max_connections and, on the Unix
 * socket, its peer uid's max_connections_per_uid; on TCP, whose peer is known only by
 * the token of a request, against http_max_unauthenticated_connections until then. */
static int gw_open(void *arg, int fd, void **data, char *msg, size_t cap)
{
    http *h = arg;
    int domain = 0;
    socklen_t dl = sizeof domain;
    struct ucred cred;
    socklen_t cl = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &dl) != 0 ||
        (domain == AF_UNIX && getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0)) {
        snprintf(msg, cap, "cannot identify the peer: %s", strerror(errno));
        return 503;
    }
    bool tcp = domain != AF_UNIX;
    if (tcp && h->n_unauth >= (unsigned)h->cfg->http_max_unauthenticated_connections) {
        snprintf(msg, cap, "%u TCP connections have sent no valid token yet, the limit "
                           "(http_max_unauthenticated_connections)", h->n_unauth);
        return 429;
    }
    gwconn *gc = calloc(1, sizeof *gc);
    if (!gc) {
        snprintf(msg, cap, "out of memory");
        return 503;
    }
    enum server_admit a = server_conn_add(h->srv, !tcp, tcp ? 0 : cred.uid, msg, cap);
    if (a != SERVER_ADMIT_OK) {
        free(gc);
        return a == SERVER_ADMIT_UID_FULL ? 429 : 503;
    }
    gc->h = h;
    gc->tcp = tcp;
    gc->has_uid = !tcp;
    gc->uid = tcp ? 0 : cred.uid;
    h->n_conns++;
    h->n_unauth += tcp;
    *data = gc;
    return 0;
}

/* httpwire's close hook: a request still waiting is dropped (its client left). */
static void gw_close(void *arg, void *data)
{
    http *h = arg;
    gwconn *gc = data;
    if (gc->hr)
        hreq_gone(gc->hr);
    release_body(h, gc);
    server_conn_remove(h->srv, gc->has_uid, gc->uid);
    h->n_conns--;
    h->n_unauth -= !gc->has_uid;
    free(gc);
}

/* A TCP connection's requests name their uid by token: from the first one that does,
 * the connection counts under that uid (and under the next one that names another).
 * 0, or 429 with msg when the uid has its max_connections_per_uid. */
static int count_under(http *h, gwconn *gc, uid_t uid, char *msg, size_t cap)
{
    if (server_conn_set_uid(h->srv, gc->has_uid, gc->uid, uid, msg, cap) != SERVER_ADMIT_OK)
        return 429;
    h->n_unauth -= !gc->has_uid;
    gc->has_uid = true;
    gc->uid = uid;
    return 0;
}

/* ---- the request hooks ---- */

/* A request whose answer waits for the worker: hr of route r from ss, on wc. NULL after
 * answering (out of memory). */
static hreq *hreq_new(http *h, httpwire_conn *wc, enum route r, const session *ss,
                      json_object *body, const char *named, const models_view_entry *model)
{
    hreq *hr = calloc(1, sizeof *hr);
    if (!hr) {
        json_object_put(body);
        send_error(h, wc, r, 500, "server_error", "internal_error", "out of memory");
        return NULL;
    }
    hr->h = h;
    hr->wc = wc;
    hr->gc = httpwire_data(wc);
    hr->route = r;
    hr->body = body;
    hr->model_named = named;
    snprintf(hr->model, sizeof hr->model, "%s", model ? model->name : "");
    hr->family = model ? model->family : CHAT_PLAIN;
    hr->ss = *ss;
    hr->ss.conn_id = HTTP_CONN_BIT | ++h->next_id;
    hr->created = (int64_t)time(NULL);
    uint64_t rnd = 0;
    if (getrandom(&rnd, sizeof rnd, GRND_NONBLOCK) != sizeof rnd)
        rnd = h->next_id * 0x9e3779b97f4a7c15ull;
    snprintf(hr->id, sizeof hr->id, "%s-%016llx",
             r == R_CHAT ? "chatcmpl" : r == R_COMPLETIONS ? "cmpl" : r == R_RAG ? "rag" : "req",
             (unsigned long long)rnd);
    hreq **b = hreq_bucket(h, hr->ss.conn_id);
    hr->next = *b;
    *b = hr;
    h->n_reqs++;
    hr->gc->hr = hr;
    return hr;
}

/* Binds hr's connection (not for /metrics) and sends its request to the worker. */
static void hreq_start(hreq *hr)
{
    char msg[ERR_MAX + 128];
    Llms__Request rq = LLMS__REQUEST__INIT;
    if (hr->route != R_METRICS) {
        Llms__BindRequest bind = LLMS__BIND_REQUEST__INIT;
        bind.app_name = hr->ss.app;
        rq.id = ID_BIND;
        rq.body_case = LLMS__REQUEST__BODY_BIND;
        rq.bind = &bind;
        submit(hr, &rq);
        if (hr->done) {
            hreq_free(hr);
            return;
        }
    }
    rq = (Llms__Request)LLMS__REQUEST__INIT;
    rq.id = ID_WORK;
    Llms__Empty empty = LLMS__EMPTY__INIT;
    switch (hr->route) {
    case R_CHAT:
    case R_COMPLETIONS:
        start_generate(hr, &rq, msg, sizeof msg);
        break;
    case R_EMBEDDINGS:
        start_embed(hr, &rq, msg, sizeof msg);
        break;
    case R_RERANK:
        start_rerank(hr, &rq, msg, sizeof msg);
        break;
    case R_RAG:
        start_rag(hr, &rq, msg, sizeof msg);
        break;
    default:
        rq.body_case = LLMS__REQUEST__BODY_STATUS;
        rq.status = &empty;
        submit(hr, &rq);
        break;
    }
    if (hr->done)
        hreq_free(hr);
}

/*
 * httpwire's head hook: everything that needs no body is decided here, before a byte
 * of it is read (route, method, shutdown, identity, the uid's connection count, the
 * body's size against http_max_body_bytes and the body budgets); true when the body is
 * to be read (gw_body goes on).
 */
static bool gw_head(void *arg, httpwire_conn *wc)
{
    http *h = arg;
    gwconn *gc = httpwire_data(wc);
    size_t plen;
    const char *uri = httpwire_target(wc);
    const char *method = httpwire_method(wc);
    enum route r = route_of(uri, &plen);
    bool get = r == R_MODELS || r == R_HEALTH || r == R_METRICS;
    char msg[ERR_MAX + 128];
    if (r == R_OTHER) {
        send_error(h, wc, r, 404, "invalid_request_error", "unknown_route", "no route %.*s",
                   (int)(plen > 200 ? 200 : plen), uri);
        return false;
    }
    if (strcmp(method, get ? "GET" : "POST") != 0) {
        httpwire_add_header(wc, "Allow", get ? "GET" : "POST");
        send_error(h, wc, r, 405, "invalid_request_error", "method_not_allowed",
                   "%s takes %s", route_path[r], get ? "GET" : "POST");
        return false;
    }
    if (h->shutting || h->worker_done) {
        if (r == R_HEALTH) {
            json_object *o = json_object_new_object();
            json_object_object_add(o, "status", json_object_new_string("shutting_down"));
            send_json(h, wc, r, 503, o);
        } else {
            send_error(h, wc, r, 503, "server_error", "unavailable", "the daemon is shutting down");
        }
        return false;
    }
    if (r == R_HEALTH) {
        json_object *o = json_object_new_object();
        json_object_object_add(o, "status", json_object_new_string("ok"));
        send_json(h, wc, r, 200, o);
        return false;
    }
    session ss = {0};
    int status = identify(h, wc, httpwire_fd(wc), &ss, msg, sizeof msg);
    if (status) {
        if (status == 401)
            httpwire_add_header(wc, "WWW-Authenticate", "Bearer");
        send_error(h, wc, r, status, status == 401 ? "authentication_error" : "invalid_request_error",
                   status == 401 ? "invalid_api_key" : "invalid_request", "%s", msg);
        return false;
    }
    if (gc->tcp && count_under(h, gc, ss.uid, msg, sizeof msg)) {
        send_error(h, wc, r, 429, "rate_limit_error", "resource_exhausted", "%s", msg);
        return false;
    }
    if (models_view_update(h->reg, &h->view)) {
        send_error(h, wc, r, 500, "server_error", "internal_error", "out of memory");
        return false;
    }
    if (r == R_MODELS) {
        send_models(h, wc);
        return false;
    }
    if (r == R_METRICS) {
        if (!ss.admin) {
            send_error(h, wc, r, 403, "permission_error", "permission_denied",
                       "/metrics needs an admin: uid 0 or group %s on the socket, an admin "
                       "token on TCP", h->cfg->admin_group);
            return false;
        }
        hreq *hr = hreq_new(h, wc, r, &ss, NULL, NULL, NULL);
        if (hr)
            hreq_start(hr);
        return false;
    }
    size_t n = httpwire_content_length(wc);
    if (n > (size_t)h->cfg->http_max_body_bytes) {
        send_error(h, wc, r, 413, "invalid_request_error", "body_too_large",
                   "the body is %zu bytes, the limit is %d (http_max_body_bytes)", n,
                   h->cfg->http_max_body_bytes);
        return false;
    }
    gc->route = r;
    gc->ss = ss;
    if (n && (status = reserve_body(h, gc, ss.uid, n, msg, sizeof msg))) {
        send_error(h, wc, r, status, status == 429 ? "rate_limit_error" : "server_error",
                   status == 429 ? "resource_exhausted" : "unavailable", "%s", msg);
        return false;
    }
    return true;
}

/* httpwire's body hook: the body of a request gw_head let through has arrived whole. */
static void gw_body(void *arg, httpwire_conn *wc)
{
    http *h = arg;
    gwconn *gc = httpwire_data(wc);
    enum route r = gc->route;
    json_object *body = read_body(h, wc, r);
    /* Parsed (or refused): the raw body is about to go. */
    release_body(h, gc);
    const char *named = NULL;
    const models_view_entry *model = NULL;
    if (!body)
        return;
    if (request_model(h, wc, r, body, &named, &model)) {
        json_object_put(body);
        return;
    }
    hreq *hr = hreq_new(h, wc, r, &gc->ss, body, named, model);
    if (hr)
        hreq_start(hr);
}

/* ---- setup ---- */

/*
 * Whoever may write the tokens file may map a token to any uid, uid 0 too, and whoever
 * may read it may act as any uid it names: so it must belong to root or to the daemon's
 * user and be neither writable by its group or others nor readable by others.
 */
static int check_tokens_file(FILE *f, const char *path, char err[ERR_MAX])
{
    struct stat st;
    if (fstat(fileno(f), &st) != 0)
        return err_set(err, "http_tokens_file %s: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return err_set(err, "http_tokens_file %s: not a regular file", path);
    if (st.st_uid != 0 && st.st_uid != geteuid())
        return err_set(err, "http_tokens_file %s: owned by uid %u; it must belong to root or "
                            "to llmsd's user (uid %u)", path, (unsigned)st.st_uid,
                       (unsigned)geteuid());
    if (st.st_mode & 0022)
        return err_set(err, "http_tokens_file %s: writable by its group or others (mode %04o); "
                            "chmod 0600 it", path, (unsigned)(st.st_mode & 07777));
    if (st.st_mode & 0004)
        return err_set(err, "http_tokens_file %s: readable by others (mode %04o); chmod 0600 "
                            "it (or 0640 with llmsd's group)", path, (unsigned)(st.st_mode & 07777));
    return 0;
}

/* A uid written as digits, within uid_t and not (uid_t)-1, which means "no uid". */
static bool parse_uid(const char *s, uid_t *uid)
{
    if (!*s || strspn(s, "0123456789") != strlen(s))
        return false;
    errno = 0;
    unsigned long long v = strtoull(s, NULL, 10);
    if (errno || v >= (unsigned long long)(uid_t)-1)
        return false;
    *uid = (uid_t)v;
    return true;
}

static int load_tokens(http *h, const char *path, char err[ERR_MAX])
{
    FILE *f = fopen(path, "re");
    if (!f)
        return err_set(err, "http_tokens_file %s: %s", path, strerror(errno));
    if (check_tokens_file(f, path, err)) {
        fclose(f);
        return -1;
    }
    char line[1024], tok[512], user[128], app[128], flag[32];
    int lineno = 0, rc = 0;
    while (!rc && fgets(line, sizeof line, f)) {
        lineno++;
        if (!strchr(line, '\n') && !feof(f)) {
            rc = err_set(err, "http_tokens_file %s:%d: longer than %zu bytes", path, lineno,
                         sizeof line - 2);
            break;
        }
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        int n = sscanf(line, "%511s %127s %127s %31s", tok, user, app, flag);
        if (n <= 0)
            continue;
        if (n < 3 || (n == 4 && strcmp(flag, "admin") != 0)) {
            rc = err_set(err, "http_tokens_file %s:%d: expected 'TOKEN UID APP [admin]'", path, lineno);
            break;
        }
        if (strlen(tok) < TOKEN_MIN_BYTES) {
            rc = err_set(err, "http_tokens_file %s:%d: a token must be at least %d bytes (one "
                              "from 'openssl rand -hex 32' is 64)", path, lineno, TOKEN_MIN_BYTES);
            break;
        }
        uid_t uid;
        if (isdigit((unsigned char)user[0])) {
            if (!parse_uid(user, &uid)) {
                rc = err_set(err, "http_tokens_file %s:%d: '%s' is not a uid (0..%u)", path,
                             lineno, user, (unsigned)((uid_t)-1 - 1));
                break;
            }
        } else {
            struct passwd *pw = getpwnam(user);
            if (!pw) {
                rc = err_set(err, "http_tokens_file %s:%d: no user '%s'", path, lineno, user);
                break;
            }
            uid = pw->pw_uid;
        }
        if (!session_valid_app(app)) {
            rc = err_set(err, "http_tokens_file %s:%d: app must be 1..%d bytes of [A-Za-z0-9._-]",
                         path, lineno, SCHED_APP_MAX);
            break;
        }
        unsigned char digest[TOKEN_DIGEST_BYTES];
        token_digest(tok, digest);
        for (size_t i = 0; i < h->n_tokens && !rc; i++)
            if (sodium_memcmp(digest, h->tokens[i].digest, TOKEN_DIGEST_BYTES) == 0)
                rc = err_set(err, "http_tokens_file %s:%d: the same token as an earlier line",
                             path, lineno);
        if (rc)
            break;
        token_entry *t = realloc(h->tokens, (h->n_tokens + 1) * sizeof *t);
        if (!t) {
            rc = err_set(err, "out of memory");
            break;
        }
        h->tokens = t;
        memcpy(t[h->n_tokens].digest, digest, TOKEN_DIGEST_BYTES);
        t[h->n_tokens].uid = uid;
        memcpy(t[h->n_tokens].app, app, strlen(app) + 1); /* valid: at most SCHED_APP_MAX */
        t[h->n_tokens].admin = n == 4;
        h->n_tokens++;
    }
    explicit_bzero(line, sizeof line);
    explicit_bzero(tok, sizeof tok);
    fclose(f);
    return rc;
}

/*
 * The group http_socket is to have: http_socket_group, else the clients' socket's, so
 * that whoever may use llmsd may use its gateway and nobody else. Under socket
 * activation that is the socket unit's SocketGroup= (llms), which llmsd's own group is
 * not: llmsd's group may read its state directory, every app's contexts.
 */
static int http_socket_gid(const config *cfg, gid_t *gid, char err[ERR_MAX])
{
    if (cfg->http_socket_group[0]) {
        struct group *gr = getgrnam(cfg->http_socket_group);
        if (!gr)
            return err_set(err, "http_socket_group: no group '%s'", cfg->http_socket_group);
        *gid = gr->gr_gid;
        return 0;
    }
    *gid = getegid();
    if (sd_listen_fds(0) != 1)
        return 0;
    struct sockaddr_un addr;
    socklen_t len = sizeof addr;
    struct stat st;
    if (getsockname(SD_LISTEN_FDS_START, (struct sockaddr *)&addr, &len) == 0 &&
        addr.sun_family == AF_UNIX && len > offsetof(struct sockaddr_un, sun_path) &&
        addr.sun_path[0] && stat(addr.sun_path, &st) == 0)
        *gid = st.st_gid;
    return 0;
}

static int listen_unix(http *h, const config *cfg, char err[ERR_MAX])
{
    gid_t gid = getegid();
    if (http_socket_gid(cfg, &gid, err))
        return -1;
    int fd = server_listen_unix(cfg->http_socket, cfg->socket_mode, err);
    if (fd < 0)
        return -1;
    if (gid != getegid() && chown(cfg->http_socket, (uid_t)-1, gid) != 0) {
        struct group *gr = getgrgid(gid);
        err_set(err, "http_socket %s: cannot give it the group %s: %s (llmsd must be a member: "
                     "SupplementaryGroups= in its unit)", cfg->http_socket,
                gr ? gr->gr_name : "?", strerror(errno));
        close(fd);
        unlink(cfg->http_socket);
        return -1;
    }
    if (httpwire_listen(h->wire, fd, err)) {
        unlink(cfg->http_socket);
        return -1;
    }
    h->owns_path = true;
    fprintf(stderr, "llmsd: http gateway on unix:%s\n", cfg->http_socket);
    return 0;
}

static bool is_loopback(const struct sockaddr_storage *a)
{
    if (a->ss_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)a)->sin_addr.s_addr) >> 24) == 127;
    if (a->ss_family == AF_INET6) {
        const struct in6_addr *x = &((const struct sockaddr_in6 *)a)->sin6_addr;
        if (IN6_IS_ADDR_LOOPBACK(x))
            return true;
        return IN6_IS_ADDR_V4MAPPED(x) && x->s6_addr[12] == 127;
    }
    return false;
}

/* A listening TCP socket on host:port (the first address host resolves to that takes
 * it); its address in *a. The descriptor, or -1 + err. */
static int tcp_socket(const char *spec, const char *host, const char *port,
                      struct sockaddr_storage *a, char err[ERR_MAX])
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_ADDRCONFIG};
    struct addrinfo *res;
    int e = getaddrinfo(host[0] ? host : NULL, port, &hints, &res);
    if (e)
        return err_set(err, "http_listen %s: %s", spec, gai_strerror(e));
    int fd = -1, saved = 0;
    for (const struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        int one = 1;
        if (fd >= 0 && (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
                        bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 128) != 0)) {
            saved = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    socklen_t len = sizeof *a;
    if (fd < 0)
        return err_set(err, "http_listen %s: cannot listen there: %s", spec, strerror(saved));
    if (getsockname(fd, (struct sockaddr *)a, &len) != 0) {
        err_set(err, "http_listen %s: %s", spec, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

static int listen_tcp(http *h, const char *spec, char err[ERR_MAX])
{
    char host[256];
    const char *colon = strrchr(spec, ':');
    if (!colon || colon == spec || !colon[1])
        return err_set(err, "http_listen: '%s' is not host:port", spec);
    snprintf(host, sizeof host, "%.*s", (int)(colon - spec), spec);
    if (host[0] == '[' && host[strlen(host) - 1] == ']') {
        memmove(host, host + 1, strlen(host));
        host[strlen(host) - 1] = '\0';
    }
    char *end;
    unsigned long port = strtoul(colon + 1, &end, 10);
    if (*end || port > 65535)
        return err_set(err, "http_listen: '%s' is not a port", colon + 1);
    struct sockaddr_storage a;
    int fd = tcp_socket(spec, host, colon + 1, &a, err);
    if (fd < 0)
        return -1;
    if (!is_loopback(&a) && !h->cfg->http_allow_remote) {
        close(fd);
        return err_set(err, "http_listen %s is not a loopback address; set http_allow_remote = 1 "
                            "to serve other machines (bearer tokens travel in clear text)", spec);
    }
    if (httpwire_listen(h->wire, fd, err))
        return -1;
    unsigned bound = ntohs(a.ss_family == AF_INET ? ((struct sockaddr_in *)&a)->sin_port
                                                  : ((struct sockaddr_in6 *)&a)->sin6_port);
    fprintf(stderr, "llmsd: http gateway on %s (port %u), %zu token%s\n", spec, bound,
            h->n_tokens, h->n_tokens == 1 ? "" : "s");
    return 0;
}

http *http_new(struct event_base *base, const config *cfg, server *srv, models *reg,
               char err[ERR_MAX])
{
    http *h = calloc(1, sizeof *h);
    if (!h) {
        err_set(err, "out of memory");
        return NULL;
    }
    h->base = base;
    h->cfg = cfg;
    h->srv = srv;
    h->senv = *server_session_env(srv);
    h->senv.send = gw_send;
    h->senv.submitted = gw_submitted;
    h->reg = reg;
    struct group *gr = getgrnam(cfg->admin_group);
    if (gr) {
        h->have_admin_gid = true;
        h->admin_gid = gr->gr_gid;
    }
    if (sodium_init() < 0) {
        err_set(err, "libsodium cannot start");
        goto fail;
    }
    /* Vectors and scores are floats: nine digits round-trip them. */
    json_c_set_serialization_double_format("%.9g", JSON_C_OPTION_GLOBAL);
    httpwire_config wcfg = {
        .max_head_bytes = MAX_HEADERS_BYTES,
        .header_timeout_ms = cfg->http_header_timeout_ms,
        .body_timeout_ms = cfg->http_body_timeout_ms,
        .body_ms_per_mib = BODY_MS_PER_MIB,
        .idle_timeout_ms = IDLE_MS,
        .accept_retry_ms = SERVER_ACCEPT_RETRY_MS,
    };
    httpwire_hooks hooks = {gw_open, gw_head, gw_body, gw_close};
    if (!(h->wire = httpwire_new(base, &wcfg, &hooks, h))) {
        err_set(err, "out of memory");
        goto fail;
    }
    if (cfg->http_tokens_file[0] && load_tokens(h, cfg->http_tokens_file, err))
        goto fail;
    if (cfg->http_socket[0] && listen_unix(h, cfg, err))
        goto fail;
    if (cfg->http_listen[0] && listen_tcp(h, cfg->http_listen, err))
        goto fail;
    return h;
fail:
    http_free(h);
    return NULL;
}

void http_shutdown(http *h)
{
    h->shutting = true;
}

void http_worker_done(http *h)
{
    h->worker_done = true;
    for (int b = 0; b < HREQ_BUCKETS; b++)
        while (h->buckets[b]) {
            hreq *hr = h->buckets[b];
            finish_error(hr, LLMS__ERROR_CODE__UNAVAILABLE, "the daemon is shutting down");
            hreq_free(hr);
        }
}

void http_free(http *h)
{
    if (!h)
        return;
    /* Every connection closes, with the request it still waits for. */
    httpwire_free(h->wire);
    if (h->owns_path)
        unlink(h->cfg->http_socket);
    free(h->tokens);
    models_view_free(&h->view);
    free(h->ub);
    free(h);
}
