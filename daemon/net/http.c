/*
 * http.c — the OpenAI-compatible HTTP gateway (http.h): HTTP requests (daemon/net/httpwire.h)
 * routed, their senders identified and turned into native Requests on connections of
 * their own, the Response frames handed back to openai.c (which writes OpenAI's JSON and
 * Server-Sent Events), a stream's slow reader cut off, /metrics; what each HTTP
 * connection and body may hold, counted; the listeners and the tokens file.
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

#include "daemon/net/connbudget.h"
#include "daemon/net/http_internal.h"
#include "daemon/net/httpwire.h"
#include "daemon/net/listen.h"
#include "daemon/net/session.h"
#include "engine/tok/stop.h"
#include "proto/frame.h"

#define APP_HEADER "X-Llmsd-App"
#define MAX_HEADERS_BYTES (64 << 10)
#define IDLE_MS 60000           /* a keep-alive connection with no request closes */
/* A body's deadline grows with its size, as a native frame's: a MiB a second is far
 * below what any local client sends, however loaded the machine. */
#define BODY_MS_PER_MIB 1000
/* Request ids on a gateway connection: its Bind, then its request (a generation's n
 * choices: ID_WORK + i for choice i). */
#define ID_BIND 1
#define ID_WORK 2

static const char *const route_path[] = {
    "/v1/models", "/v1/chat/completions", "/v1/completions", "/v1/embeddings",
    "/v1/rerank", "/v1/llmsd/rag", "/v1/responses", "/v1/responses/{id}",
    "/v1/responses/{id}/input_items", "/tokenize", "/detokenize", "/health",
    "/", "/metrics", "/api/version", "/api/tags", "/api/ps", "/api/show", "/api/generate",
    "/api/chat", "/api/embed", "/api/embeddings", "/api/(pull|push|create|copy|delete)",
    "/completion", "/infill", "/props", "/embedding", "/apply-template", "/lora-adapters",
    "/slots", "/slots/{id_slot}", "other",
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

/* One HTTP connection: whom it counts against, and its request between head and body. */
typedef struct gwconn {
    http *h;
    bool tcp;
    bool has_uid;              /* counted under uid (connbudget_add); else under the
                                  unauthenticated TCP peers (n_unauth) */
    uid_t uid;
    size_t reserved;           /* body bytes it holds of the budgets (body_bytes) */
    enum route route;          /* the request whose body is being read ... */
    session ss;                /* ... and who sent it */
    struct hreq *hr;           /* its request waiting for the worker, or NULL */
} gwconn;

/* ---- small helpers ---- */

void http_count_status(http *h, enum route r, int status)
{
    for (size_t i = 0; i < h->n_counts; i++)
        if (h->counts[i].route == r && h->counts[i].status == status) {
            h->counts[i].n++;
            return;
        }
    if (h->n_counts < MAX_COUNTS)
        h->counts[h->n_counts++] = (count){r, status, 1};
}

const char *http_json_text(json_object *o)
{
    return json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
}

/* Sends o (taken) as a JSON reply. */
void http_send_json(http *h, httpwire_conn *wc, enum route r, int status, json_object *o)
{
    const char *s = o ? http_json_text(o) : NULL;
    httpwire_add_header(wc, "Content-Type", "application/json");
    if (!s)
        status = 500;
    httpwire_reply(wc, status, s ? s : "", s ? strlen(s) : 0);
    json_object_put(o);
    http_count_status(h, r, status);
}

/* Answers an error in the shape of route r's API: ollama's {"error": message}, llama.cpp's
 * {"error": {code, message, type}} (its type from the status), else OpenAI's object with
 * type and code. */
__attribute__((format(printf, 7, 8))) static void send_error(http *h, httpwire_conn *wc,
                                                             enum route r, int status,
                                                             const char *type, const char *code,
                                                             const char *fmt, ...)
{
    char msg[ERR_MAX + 256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (http_route_is_ollama(r))
        ollama_send_error(h, wc, r, status, msg);
    else if (http_route_is_llamacpp(r))
        llamacpp_send_error(h, wc, r, status, msg);
    else
        openai_send_error(h, wc, r, status, type, code, "%s", msg);
}

void http_finish_error(hreq *hr, Llms__ErrorCode code, const char *msg)
{
    if (http_route_is_ollama(hr->route))
        ollama_finish_error(hr, code, msg);
    else if (http_route_is_llamacpp(hr->route))
        llamacpp_finish_error(hr, code, msg);
    else if (hr->route == R_RESPONSES)
        responses_finish_error(hr, code, msg);
    else
        openai_finish_error(hr, code, msg);
}

json_object *http_vector_json(const Llms__Vector *v)
{
    json_object *a = json_object_new_array_ext((int)v->n_values);
    for (size_t d = 0; a && d < v->n_values; d++)
        json_object_array_add(a, json_object_new_double(v->values[d]));
    return a;
}

bool http_embed_dimensions_differ(const hreq *hr, const Llms__EmbedResponse *e, char *msg,
                                  size_t cap)
{
    if (!hr->dimensions || !e->n_vectors || e->vectors[0]->n_values == hr->dimensions)
        return false;
    snprintf(msg, cap, "'dimensions' is %u, but the model '%s' gives vectors of %zu dimensions "
                       "and cannot shorten them", (unsigned)hr->dimensions, hr->model,
             e->vectors[0]->n_values);
    return true;
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
void http_req_finish(hreq *hr)
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
    http_req_finish(hr);
    json_object_put(hr->body);
    if (hr->sse)
        evbuffer_free(hr->sse);
    free(hr->prefix);
    free(hr->bias);
    free(hr->bias_ptrs);
    for (unsigned i = 0; i < hr->n_choices; i++) {
        json_object_put(hr->choices[i].lp);
        frame_free_response(hr->choices[i].result);
    }
    toolcall_scan_free(hr->scan);
    toolcall_set_free(&hr->tools);
    free(hr->whole_split);
    llamacpp_req_free(hr->lc);
    responses_req_free(hr->rs);
    free(hr);
}

/* The client went away before its answer (its connection is gone): the worker drops
 * the request (a generation is cancelled within a step). */
static void hreq_gone(hreq *hr)
{
    hr->h->cancelled++;
    if (hr->route == R_RESPONSES)
        responses_gone(hr);
    hreq_free(hr);
}

/* ---- answers ---- */

/* Bytes the client has not read yet. */
static size_t unread(const hreq *hr)
{
    return httpwire_unsent(hr->wc);
}

static void on_chunk(hreq *hr, unsigned choice, const Llms__CallChunk *ch)
{
    if (!hr->stream)
        return;
    bool ollama = http_route_is_ollama(hr->route), llamacpp = http_route_is_llamacpp(hr->route);
    bool responses = hr->route == R_RESPONSES;
    if (ollama) {
        ollama_stream_start(hr);
    } else if (llamacpp) {
        llamacpp_stream_start(hr);
    } else if (responses ? responses_sse_start(hr) : openai_sse_start(hr)) {
        http_finish_error(hr, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        return;
    }
    if (hr->cancel_sent || unread(hr) > CONNBUDGET_OUT_CAP) {
        /* As for a native connection that does not read: the generations stop, and each
         * final result (the whole text) fills in what was not streamed, from its sent.
         * Chunks already on their way are dropped too, even once the client has read
         * again: sent after a gap, they would leave that offset behind the text shown. */
        if (!hr->cancel_sent) {
            sched_job *j = sched_job_new(SCHED_CANCEL_STREAMS, hr->ss.conn_id);
            if (j)
                sched_submit(hr->h->senv.sch, j);
            hr->cancel_sent = true;
        }
        return;
    }
    if (ollama) {
        if (ch->text[0])
            ollama_stream_text(hr, ch->text, strlen(ch->text));
        return;
    }
    /* llama.cpp's server sends an event for every token, with its text or none */
    if (llamacpp) {
        llamacpp_stream_chunk(hr, ch);
        return;
    }
    /* the Responses API streams no logprobs; a piece held back is no event, as below */
    if (responses) {
        if (ch->text[0])
            responses_sse_piece(hr, ch->text, strlen(ch->text));
        return;
    }
    openai_logprobs_add(hr, choice, ch->logprobs, ch->n_logprobs);
    hr->choices[choice].lp_seen += ch->n_logprobs;
    /* a piece held back while it may begin a stop string is empty: no event, as OpenAI
     * sends no empty deltas (its tokens' logprobs go with the next) */
    if (ch->text[0])
        openai_sse_piece(hr, choice, ch->text, strlen(ch->text));
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
    http_req_finish(hr);
    struct evbuffer *b = evbuffer_new();
    if (!b) {
        send_error(h, hr->wc, hr->route, 500, "server_error", "internal_error", "out of memory");
        return;
    }
    /* This request is answered 200 and counts too. */
    http_count_status(h, R_METRICS, 200);
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
           "prompt tokens of HTTP completions, cached ones included", (double)h->prompt_tokens);
    metric(b, "llmsd_http_prompt_cached_tokens_total", "counter",
           "prompt tokens of HTTP completions resumed from the prompt cache, not evaluated",
           (double)h->cached_tokens);
    metric(b, "llmsd_http_completion_tokens_total", "counter",
           "tokens generated for HTTP completions", (double)h->completion_tokens);
    metric(b, "llmsd_http_embedding_tokens_total", "counter", "tokens embedded for HTTP requests",
           (double)h->embed_tokens);
    metric(b, "llmsd_http_responses_stored", "gauge",
           "Responses API responses stored (responses_store_bytes)",
           (double)respstore_count(h->store));
    metric(b, "llmsd_http_responses_stored_bytes", "gauge",
           "bytes the stored responses take of responses_store_bytes",
           (double)respstore_bytes(h->store));
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
    metric(b, "llmsd_prompt_cache_hits_total", "counter",
           "Completes that resumed a cached prompt's KV", (double)st->prompt_cache_hits);
    metric(b, "llmsd_prompt_cache_misses_total", "counter",
           "Completes that found no cached prompt to resume", (double)st->prompt_cache_misses);
    metric(b, "llmsd_prompt_cache_reused_tokens_total", "counter",
           "prompt tokens resumed from the prompt cache, not evaluated",
           (double)st->prompt_cache_reused_tokens);
    metric(b, "llmsd_prompt_cache_bytes", "gauge",
           "KV bytes the prompt cache holds (inside the KV budget)",
           (double)st->prompt_cache_bytes);
    metric(b, "llmsd_prompt_cache_entries", "gauge", "prompts the prompt cache holds",
           st->prompt_cache_entries);
    evbuffer_add_printf(b, "# HELP llmsd_kv_bytes resident KV bytes by precision\n"
                           "# TYPE llmsd_kv_bytes gauge\n"
                           "llmsd_kv_bytes{bits=\"16\"} %llu\nllmsd_kv_bytes{bits=\"8\"} %llu\n"
                           "llmsd_kv_bytes{bits=\"4\"} %llu\nllmsd_kv_bytes{bits=\"2\"} %llu\n",
                        (unsigned long long)st->kv_f16_bytes, (unsigned long long)st->kv_int8_bytes,
                        (unsigned long long)st->kv_int4_bytes, (unsigned long long)st->kv_int2_bytes);
    metric(b, "llmsd_sched_steps_total", "counter", "scheduler steps", (double)st->sched_steps);
    metric(b, "llmsd_sched_shared_steps_total", "counter",
           "scheduler steps that ran a base and its adapter models in one forward",
           (double)st->sched_shared_steps);
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
        http_finish_error(hr, LLMS__ERROR_CODE__INTERNAL, "undecodable reply from the worker");
        return;
    }
    /* the choice a generation's frame is of: its request id's place after ID_WORK */
    bool generation = r->body_case == LLMS__RESPONSE__BODY_CHUNK ||
                      r->body_case == LLMS__RESPONSE__BODY_RESULT;
    uint64_t choice = r->id - ID_WORK;
    if (r->error) {
        http_finish_error(hr, r->error->code, r->error->message);
    } else if (generation && (r->id < ID_WORK || choice >= hr->n_choices)) {
        http_finish_error(hr, LLMS__ERROR_CODE__INTERNAL, "a reply of no request from the worker");
    } else if (r->body_case == LLMS__RESPONSE__BODY_BIND) {
        /* Bound: the request itself follows. */
    } else if (r->body_case == LLMS__RESPONSE__BODY_CHUNK) {
        on_chunk(hr, (unsigned)choice, r->chunk);
    } else if (r->body_case == LLMS__RESPONSE__BODY_RESULT) {
        if (http_route_is_ollama(hr->route)) {
            ollama_on_result(hr, r->result);
        } else if (http_route_is_llamacpp(hr->route)) {
            llamacpp_on_result(hr, r->result);
        } else if (hr->route == R_RESPONSES) {
            responses_on_result(hr, r);
            r = NULL; /* taken */
        } else {
            openai_on_result(hr, (unsigned)choice, r);
            r = NULL; /* taken */
        }
    } else if (r->body_case == LLMS__RESPONSE__BODY_RAG_RESULT) {
        openai_on_rag_result(hr, r->rag_result);
    } else if (r->body_case == LLMS__RESPONSE__BODY_EMBED) {
        if (http_route_is_ollama(hr->route))
            ollama_on_embed(hr, r->embed);
        else if (http_route_is_llamacpp(hr->route))
            llamacpp_on_embedding(hr, r->embed);
        else
            openai_on_embed(hr, r->embed);
    } else if (r->body_case == LLMS__RESPONSE__BODY_RERANK) {
        openai_on_rerank(hr, r->rerank);
    } else if (r->body_case == LLMS__RESPONSE__BODY_TOKENIZE) {
        tokroute_on_tokenize(hr, r->tokenize);
    } else if (r->body_case == LLMS__RESPONSE__BODY_DETOKENIZE) {
        tokroute_on_detokenize(hr, r->detokenize);
    } else if (r->body_case == LLMS__RESPONSE__BODY_STATUS) {
        on_status(hr, r->status);
    } else {
        http_finish_error(hr, LLMS__ERROR_CODE__INTERNAL, "unexpected reply from the worker");
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
int http_submit(hreq *hr, const Llms__Request *r)
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
        http_finish_error(hr, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        return -1;
    }
    session_handle(&hr->h->senv, &hr->ss, hr, req);
    return 0;
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
    /* llama.cpp's server's names of the rerank route */
    static const char *const rerank[] = {"/rerank", "/reranking", "/v1/reranking"};
    for (size_t i = 0; i < sizeof rerank / sizeof rerank[0]; i++)
        if (strlen(rerank[i]) == n && strncmp(uri, rerank[i], n) == 0)
            return R_RERANK;
    if (n == 12 && strncmp(uri, "/completions", 12) == 0)
        return R_LLAMACPP_COMPLETION;
    if (n == 11 && strncmp(uri, "/embeddings", 11) == 0)
        return R_LLAMACPP_EMBEDDING;
    static const char *const manage[] = {"/api/pull", "/api/push", "/api/create", "/api/copy",
                                         "/api/delete"};
    for (size_t i = 0; i < sizeof manage / sizeof manage[0]; i++)
        if (strlen(manage[i]) == n && strncmp(uri, manage[i], n) == 0)
            return R_OLLAMA_MANAGE;
    /* /v1/models/{id}: one model, the rest of the path its name */
    if (n > 11 && strncmp(uri, "/v1/models/", 11) == 0)
        return R_MODELS;
    if (n > 7 && strncmp(uri, "/slots/", 7) == 0)
        return R_LLAMACPP_SLOTS_ACTION;
    /* /v1/responses/{id} and /v1/responses/{id}/input_items: the id checked once the
     * caller is known */
    if (n > 14 && strncmp(uri, "/v1/responses/", 14) == 0) {
        const char *slash = memchr(uri + 14, '/', n - 14);
        if (!slash)
            return R_RESPONSE;
        return (size_t)(uri + n - slash) == 12 && strncmp(slash, "/input_items", 12) == 0
                   ? R_RESPONSE_ITEMS : R_OTHER;
    }
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
const models_view_entry *http_view_default(const http *h, unsigned role)
{
    for (size_t i = 0; i < h->view.n; i++)
        if (h->view.entries[i].defaults & role)
            return &h->view.entries[i];
    return NULL;
}

/* The role a route's requests need of their model. */
static unsigned route_role(enum route r)
{
    return r == R_EMBEDDINGS || r == R_OLLAMA_EMBED || r == R_OLLAMA_EMBEDDINGS ||
                   r == R_LLAMACPP_EMBEDDING
               ? MODELS_EMBED
           : r == R_RERANK ? MODELS_RERANK
                           : MODELS_GENERATE;
}

/* The id of an adapter file among llamacpp_lora_each's. */
typedef struct lora_find {
    const char *path;
    int id;
} lora_find;

static bool lora_find_fn(void *arg, int id, const char *path)
{
    lora_find *f = arg;
    if (strcmp(path, f->path) != 0)
        return true;
    f->id = id;
    return false;
}

/* Whether the adapter model e applies exactly the adapters of want (n_ids scales by
 * llamacpp_lora_each's ids) that are not 0, at those scales. */
static bool lora_matches(const http *h, const models_view_entry *e, const float *want,
                         int n_ids, int n_nonzero)
{
    char path[CONFIG_PATH_MAX], err[ERR_MAX];
    float scale;
    int n = 0;
    for (const char *p = e->lora_spec; config_lora_next(&p, path, &scale, err) == 1; n++) {
        lora_find f = {path, -1};
        llamacpp_lora_each(h, lora_find_fn, &f);
        if (f.id < 0 || f.id >= n_ids || want[f.id] != scale)
            return false;
    }
    return n == n_nonzero;
}

/* Reads a request's "lora" (n objects) into want (n_ids scales by llamacpp_lora_each's
 * ids, zeroed) and finds the adapter model of its adapters of a nonzero scale at those
 * scales (*found; the default generate model when there are none). 0, or -1 after
 * answering 400. */
static int lora_pick(http *h, httpwire_conn *wc, enum route r, json_object *lora, size_t n,
                     float *want, int n_ids, const models_view_entry **found)
{
    const models_view_entry *dflt = http_view_default(h, MODELS_GENERATE);
    for (size_t i = 0; i < n; i++) {
        json_object *o = json_object_array_get_idx(lora, i), *id, *scale;
        bool has_id = json_object_object_get_ex(o, "id", &id) &&
                      json_object_is_type(id, json_type_int);
        int64_t k = has_id ? json_object_get_int64(id) : -1;
        if (k < 0 || k >= n_ids) {
            send_error(h, wc, r, 400, "invalid_request_error", "invalid_argument",
                       "invalid adapter id (lora[%zu]; /lora-adapters lists %d)", i, n_ids);
            return -1;
        }
        double s = json_object_object_get_ex(o, "scale", &scale) ? json_object_get_double(scale)
                                                                 : 0.0;
        if (!isfinite(s)) {
            send_error(h, wc, r, 400, "invalid_request_error", "invalid_argument",
                       "lora[%zu].scale is not a number", i);
            return -1;
        }
        want[k] = (float)s;
    }
    int n_nonzero = 0;
    for (int k = 0; k < n_ids; k++)
        n_nonzero += want[k] != 0.0f;
    *found = dflt;
    for (size_t i = 0; n_nonzero && i < h->view.n; i++) {
        const models_view_entry *v = &h->view.entries[i];
        if (dflt && strcmp(v->base, dflt->name) == 0 && lora_matches(h, v, want, n_ids, n_nonzero))
            *found = v;
    }
    if (*found == dflt && n_nonzero) {
        send_error(h, wc, r, 400, "invalid_request_error", "invalid_argument",
                   "no adapter model applies these adapters at these scales: llmsd serves "
                   "each set of adapters as a model of its own (lora.NAME lines in "
                   "llmsd.conf, llmsctl load-lora; GET /lora-adapters says which models "
                   "apply each adapter at which scale)");
        return -1;
    }
    return 0;
}

/* llama.cpp's per-request "lora", [{"id", "scale"}, ...] over the adapters
 * /lora-adapters lists (an adapter not listed at scale 0, as llama.cpp reads it): llmsd
 * serves each set of adapters at its scales as a model of its own, so the request runs
 * on the adapter model over the default generate model that applies exactly the
 * adapters of a nonzero scale at those scales (none: the default generate model), which
 * becomes the body's "model". 0, or -1 after answering 400: not an array of objects, an
 * id /lora-adapters does not list (llama.cpp's "invalid adapter id"), no adapter model
 * of that set, or a "model" naming another. */
static int request_lora(http *h, httpwire_conn *wc, enum route r, json_object *body,
                        json_object *lora, const char **named, const models_view_entry **e)
{
    const models_view_entry *dflt = http_view_default(h, MODELS_GENERATE), *found = NULL;
    bool ok = json_object_is_type(lora, json_type_array);
    size_t n = ok ? json_object_array_length(lora) : 0;
    for (size_t i = 0; ok && i < n; i++)
        ok = json_object_is_type(json_object_array_get_idx(lora, i), json_type_object);
    if (!ok) {
        send_error(h, wc, r, 400, "invalid_request_error", "invalid_argument",
                   "'lora' must be an array of objects with 'id' and 'scale' fields");
        return -1;
    }
    int n_ids = llamacpp_lora_each(h, NULL, NULL);
    float *want = calloc((size_t)n_ids + 1, sizeof *want);
    if (!want) {
        send_error(h, wc, r, 500, "server_error", "internal_error", "out of memory");
        return -1;
    }
    int rc = lora_pick(h, wc, r, lora, n, want, n_ids, &found);
    free(want);
    if (rc < 0)
        return -1;
    if (*named && found && strcmp(*named, found->name) != 0) {
        send_error(h, wc, r, 400, "invalid_request_error", "invalid_argument",
                   "'lora' picks model '%s' (adapters over the default generate model), "
                   "but 'model' names '%.64s'", found->name, *named);
        return -1;
    }
    if (found && found != dflt) {
        json_object *name = json_object_new_string(found->name);
        if (!name) {
            send_error(h, wc, r, 500, "server_error", "internal_error", "out of memory");
            return -1;
        }
        json_object_object_add(body, "model", name);
        *named = json_object_get_string(name);
    }
    *e = found;
    return 0;
}

/* The model a request of route r runs on: *e, the one body's "model" names (*named),
 * else the route's default (*named NULL; *e NULL when no model has the role, which the
 * worker answers); for a generation, llama.cpp's "lora" may name an adapter model
 * (request_lora). 0, or -1 after answering: 404 model_not_found for a name the registry
 * does not hold (naming those it holds), 400 for a RAG query or an infill on another
 * model than the default generate model (retrieval runs on that one only; an infill's
 * prompt is laid out with its tokenizer, the one the gateway holds). A model that lacks
 * the route's role is the worker's to refuse, as for a native request. */
static int request_model(http *h, httpwire_conn *wc, enum route r, json_object *body,
                         const char **named, const models_view_entry **e)
{
    json_object *m;
    if (http_route_is_ollama(r))
        return ollama_request_model(h, wc, r, body, named, e);
    const models_view_entry *dflt = http_view_default(h, route_role(r));
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
                       "the model '%.200s' does not exist (this daemon serves %s)", name,
                       names);
            return -1;
        }
        *named = name;
    }
    json_object *lora;
    if (route_role(r) == MODELS_GENERATE && json_object_object_get_ex(body, "lora", &lora) &&
        !json_object_is_type(lora, json_type_null) &&
        request_lora(h, wc, r, body, lora, named, e) < 0)
        return -1;
    if ((r == R_RAG || r == R_LLAMACPP_INFILL) && *named && *e != dflt) {
        send_error(h, wc, r, 400, "invalid_request_error", "invalid_argument",
                   "%s runs on the default generate model '%s', not '%s'", route_path[r],
                   dflt ? dflt->name : "", (*e)->name);
        return -1;
    }
    return 0;
}

/* The request body as a JSON object, or NULL after answering. */
static json_object *read_body(http *h, httpwire_conn *wc, enum route r)
{
    size_t n;
    const char *p = httpwire_body(wc, &n);
    if (n == 0) {
        send_error(h, wc, r, 400, "invalid_request_error", "invalid_request",
                   "the body must be a JSON object");
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
        send_error(h, wc, r, 400, "invalid_request_error", "invalid_request", "%s",
                   e == json_tokener_success || e == json_tokener_continue
                       ? "the body must be one JSON object"
                       : json_tokener_error_desc(e));
        return NULL;
    }
    return o;
}

/* ---- what connections and bodies hold ---- */

/*
 * Reserves n bytes of the body budgets for gc's request of uid before its body is read:
 * its uid's (http_max_body_buffered_bytes_per_uid) first, so that one uid over its share
 * hears that it is, then everyone's (http_max_body_buffered_bytes). 0, or the status it
 * is refused with (429, 503) and msg.
 */
static int reserve_body(http *h, gwconn *gc, uid_t uid, size_t n, char *msg, size_t cap)
{
    const config *cfg = h->cfg;
    size_t mine = uidtab_get(&h->body_bytes_per_uid, uid);
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
    if (uidtab_add(&h->body_bytes_per_uid, uid, n)) {
        snprintf(msg, cap, "out of memory");
        return 503;
    }
    h->body_bytes += n;
    gc->reserved = n;
    return 0;
}

static void release_body(http *h, gwconn *gc)
{
    if (!gc->reserved)
        return;
    uidtab_sub(&h->body_bytes_per_uid, gc->ss.uid, gc->reserved);
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
    enum connbudget_admit a = connbudget_add(h->budget, !tcp, tcp ? 0 : cred.uid, msg, cap);
    if (a != CONNBUDGET_OK) {
        free(gc);
        return a == CONNBUDGET_UID_FULL ? 429 : 503;
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
    connbudget_remove(h->budget, gc->has_uid, gc->uid);
    h->n_conns--;
    h->n_unauth -= !gc->has_uid;
    free(gc);
}

/* A TCP connection's requests name their uid by token: from the first one that does,
 * the connection counts under that uid (and under the next one that names another).
 * 0, or 429 with msg when the uid has its max_connections_per_uid. */
static int count_under(http *h, gwconn *gc, uid_t uid, char *msg, size_t cap)
{
    if (connbudget_set_uid(h->budget, gc->has_uid, gc->uid, uid, msg, cap) != CONNBUDGET_OK)
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
    hr->n_choices = 1;
    hr->ss.conn_id = HTTP_CONN_BIT | ++h->next_id;
    hr->created = (int64_t)time(NULL);
    uint64_t rnd = 0;
    if (getrandom(&rnd, sizeof rnd, GRND_NONBLOCK) != sizeof rnd)
        rnd = h->next_id * 0x9e3779b97f4a7c15ull;
    /* OpenAI's Responses ids are "resp_" and hex digits */
    snprintf(hr->id, sizeof hr->id, "%s%016llx",
             r == R_CHAT ? "chatcmpl-" : r == R_COMPLETIONS ? "cmpl-" : r == R_RAG ? "rag-"
             : r == R_RESPONSES ? "resp_" : "req-",
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
        http_submit(hr, &rq);
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
        openai_start_generate(hr, &rq, msg, sizeof msg);
        break;
    case R_EMBEDDINGS:
        openai_start_embed(hr, &rq, msg, sizeof msg);
        break;
    case R_RERANK:
        openai_start_rerank(hr, &rq, msg, sizeof msg);
        break;
    case R_RAG:
        openai_start_rag(hr, &rq, msg, sizeof msg);
        break;
    case R_RESPONSES:
        responses_start(hr, &rq, msg, sizeof msg);
        break;
    case R_TOKENIZE:
    case R_DETOKENIZE:
        tokroute_start(hr, &rq, msg, sizeof msg);
        break;
    case R_OLLAMA_GENERATE:
    case R_OLLAMA_CHAT:
        ollama_start_generate(hr, &rq, msg, sizeof msg);
        break;
    case R_OLLAMA_EMBED:
    case R_OLLAMA_EMBEDDINGS:
        ollama_start_embed(hr, &rq, msg, sizeof msg);
        break;
    case R_LLAMACPP_COMPLETION:
        llamacpp_start_completion(hr, &rq, msg, sizeof msg);
        break;
    case R_LLAMACPP_INFILL:
        llamacpp_start_infill(hr, &rq, msg, sizeof msg);
        break;
    case R_LLAMACPP_EMBEDDING:
        llamacpp_start_embedding(hr, &rq, msg, sizeof msg);
        break;
    case R_LLAMACPP_APPLY_TEMPLATE:
        llamacpp_apply_template(hr, msg, sizeof msg);
        break;
    default:
        rq.body_case = LLMS__REQUEST__BODY_STATUS;
        rq.status = &empty;
        http_submit(hr, &rq);
        break;
    }
    if (hr->done)
        hreq_free(hr);
}

/* Whether route r is read with GET (and HEAD). */
static bool route_is_get(enum route r)
{
    return r == R_MODELS || r == R_HEALTH || r == R_ROOT || r == R_METRICS ||
           r == R_OLLAMA_VERSION || r == R_OLLAMA_TAGS || r == R_OLLAMA_PS ||
           r == R_LLAMACPP_PROPS || r == R_LLAMACPP_LORA_ADAPTERS || r == R_LLAMACPP_SLOTS ||
           r == R_RESPONSE || r == R_RESPONSE_ITEMS;
}

/* Whether route r takes method (HEAD is GET without the body, which httpwire leaves
 * out, as health checks send it). */
static bool route_takes(enum route r, const char *method)
{
    bool post = strcmp(method, "POST") == 0, del = strcmp(method, "DELETE") == 0;
    if (!route_is_get(r))
        return post || (r == R_OLLAMA_MANAGE && del);
    /* a GET route that a POST changes in llama.cpp's server: llmsd refuses the change;
     * a stored response is read or deleted */
    return !strcmp(method, "GET") || !strcmp(method, "HEAD") ||
           ((r == R_LLAMACPP_PROPS || r == R_LLAMACPP_LORA_ADAPTERS) && post) ||
           (r == R_RESPONSE && del);
}

/* The methods route r takes as Allow lists them and as a 405 says them. Ollama's model
 * management is refused whichever method it comes with (DELETE for /api/delete, POST
 * for the others); so is a change of llama.cpp's /props (POST). */
static void route_methods(enum route r, const char **allow, const char **said)
{
    if (r == R_LLAMACPP_PROPS || r == R_LLAMACPP_LORA_ADAPTERS)
        *allow = "GET, HEAD, POST", *said = "GET, HEAD or POST";
    else if (r == R_RESPONSE)
        *allow = "GET, HEAD, DELETE", *said = "GET, HEAD or DELETE";
    else if (route_is_get(r))
        *allow = "GET, HEAD", *said = "GET or HEAD";
    else if (r == R_OLLAMA_MANAGE)
        *allow = "POST, DELETE", *said = "POST or DELETE";
    else
        *allow = *said = "POST";
}

/* Answers what needs nobody's identity: an unknown route, a CORS preflight, a method
 * the route does not take, the daemon shutting down, the root and the health check.
 * true when answered. */
static bool head_answer_anonymous(http *h, httpwire_conn *wc, enum route r, const char *uri,
                                  size_t plen, const char *method)
{
    const char *allow, *said;
    route_methods(r, &allow, &said);
    if (r == R_OTHER) {
        send_error(h, wc, r, 404, "invalid_request_error", "unknown_route", "no route %.*s",
                   (int)(plen > 200 ? 200 : plen), uri);
        return true;
    }
    if (strcmp(method, "OPTIONS") == 0) {
        /* A CORS preflight, which carries no Authorization: it asks whether the request
         * may follow, with the headers it names (the SDKs' own among them). */
        const char *asked = httpwire_header(wc, "Access-Control-Request-Headers");
        httpwire_add_header(wc, "Allow", allow);
        httpwire_add_header(wc, "Access-Control-Allow-Methods", allow);
        if (asked)
            httpwire_add_header(wc, "Access-Control-Allow-Headers", asked);
        httpwire_reply(wc, 200, NULL, 0);
        http_count_status(h, r, 200);
        return true;
    }
    if (!route_takes(r, method)) {
        httpwire_add_header(wc, "Allow", allow);
        send_error(h, wc, r, 405, "invalid_request_error", "method_not_allowed",
                   "%s takes %s", route_path[r], said);
        return true;
    }
    if (h->shutting || h->worker_done) {
        if (r == R_HEALTH) {
            json_object *o = json_object_new_object();
            json_object_object_add(o, "status", json_object_new_string("shutting_down"));
            http_send_json(h, wc, r, 503, o);
        } else {
            send_error(h, wc, r, 503, "server_error", "unavailable",
                       "the daemon is shutting down");
        }
        return true;
    }
    if (r == R_ROOT) {
        static const char running[] = "llmsd is running\n";
        httpwire_add_header(wc, "Content-Type", "text/plain; charset=utf-8");
        httpwire_reply(wc, 200, running, sizeof running - 1);
        http_count_status(h, r, 200);
        return true;
    }
    if (r == R_HEALTH) {
        json_object *o = json_object_new_object();
        json_object_object_add(o, "status", json_object_new_string("ok"));
        http_send_json(h, wc, r, 200, o);
        return true;
    }
    return false;
}

/* Answers an identified request whose route reads no body: the model list, stored
 * responses, ollama's and llama.cpp's informations and refusals, the metrics. true when
 * answered. */
static bool head_answer_bodiless(http *h, httpwire_conn *wc, enum route r, const char *uri,
                                 size_t plen, const char *method, const session *ss)
{
    bool post = strcmp(method, "POST") == 0;
    switch (r) {
    case R_MODELS: {
        size_t base = strlen(route_path[R_MODELS]); /* "/v1/models", then "/{id}" or none */
        openai_send_models(h, wc, plen > base ? uri + base + 1 : NULL,
                           plen > base ? plen - base - 1 : 0);
        return true;
    }
    case R_RESPONSE:
    case R_RESPONSE_ITEMS:
        responses_send_stored(h, wc, r, uri, plen, strcmp(method, "DELETE") == 0, ss->uid);
        return true;
    case R_OLLAMA_VERSION:
    case R_OLLAMA_TAGS:
    case R_OLLAMA_PS:
        ollama_send_info(h, wc, r);
        return true;
    case R_OLLAMA_MANAGE:
        ollama_refuse_manage(h, wc);
        return true;
    case R_LLAMACPP_PROPS:
        if (post)
            llamacpp_refuse_props_change(h, wc);
        else
            llamacpp_send_props(h, wc);
        return true;
    case R_LLAMACPP_LORA_ADAPTERS:
        if (post)
            llamacpp_refuse_lora_change(h, wc);
        else
            llamacpp_send_lora_adapters(h, wc);
        return true;
    case R_LLAMACPP_SLOTS:
    case R_LLAMACPP_SLOTS_ACTION:
        llamacpp_refuse_slots(h, wc, r);
        return true;
    case R_METRICS: {
        if (!ss->admin) {
            send_error(h, wc, r, 403, "permission_error", "permission_denied",
                       "/metrics needs an admin: uid 0 or group %s on the socket, an admin "
                       "token on TCP", h->cfg->admin_group);
            return true;
        }
        hreq *hr = hreq_new(h, wc, r, ss, NULL, NULL, NULL);
        if (hr)
            hreq_start(hr);
        return true;
    }
    default:
        return false;
    }
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
    char msg[ERR_MAX + 128];
    /* Browser clients on other origins may read every answer, as OpenAI's API lets them:
     * that opens nothing to a page without a token, as no cookie or other credential a
     * browser adds by itself authenticates anyone here (the Unix socket is out of a
     * browser's reach). */
    if (httpwire_header(wc, "Origin"))
        httpwire_add_header(wc, "Access-Control-Allow-Origin", "*");
    if (head_answer_anonymous(h, wc, r, uri, plen, method))
        return false;
    session ss = {0};
    int status = identify(h, wc, httpwire_fd(wc), &ss, msg, sizeof msg);
    if (status) {
        if (status == 401)
            httpwire_add_header(wc, "WWW-Authenticate", "Bearer");
        send_error(h, wc, r, status,
                   status == 401 ? "authentication_error" : "invalid_request_error",
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
    if (head_answer_bodiless(h, wc, r, uri, plen, method, &ss))
        return false;
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
    if (r == R_OLLAMA_SHOW) {
        /* the registry's view has all it says: no worker */
        ollama_send_show(h, wc, model);
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

/* Reads the tokens file into a fresh list (*out, *n): all its lines or, on any error,
 * none of them, so that a reload with a bad file keeps the tokens in use. */
static int load_tokens(const char *path, token_entry **out, size_t *n_out, char err[ERR_MAX])
{
    token_entry *tokens = NULL;
    size_t n_tokens = 0;
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
        for (size_t i = 0; i < n_tokens && !rc; i++)
            if (sodium_memcmp(digest, tokens[i].digest, TOKEN_DIGEST_BYTES) == 0)
                rc = err_set(err, "http_tokens_file %s:%d: the same token as an earlier line",
                             path, lineno);
        if (rc)
            break;
        token_entry *t = realloc(tokens, (n_tokens + 1) * sizeof *t);
        if (!t) {
            rc = err_set(err, "out of memory");
            break;
        }
        tokens = t;
        memcpy(t[n_tokens].digest, digest, TOKEN_DIGEST_BYTES);
        t[n_tokens].uid = uid;
        memcpy(t[n_tokens].app, app, strlen(app) + 1); /* valid: at most SCHED_APP_MAX */
        t[n_tokens].admin = n == 4;
        n_tokens++;
    }
    explicit_bzero(line, sizeof line);
    explicit_bzero(tok, sizeof tok);
    fclose(f);
    if (rc) {
        free(tokens);
        return rc;
    }
    *out = tokens;
    *n_out = n_tokens;
    return 0;
}

int http_reload_tokens(http *h, size_t *n, char err[ERR_MAX])
{
    token_entry *tokens;
    if (!h->cfg->http_tokens_file[0])
        return err_set(err, "http_tokens_file is none: no tokens to read");
    if (load_tokens(h->cfg->http_tokens_file, &tokens, n, err))
        return -1;
    free(h->tokens);
    h->tokens = tokens;
    h->n_tokens = *n;
    return 0;
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

static int gw_listen_unix(http *h, const config *cfg, char err[ERR_MAX])
{
    gid_t gid = getegid();
    if (http_socket_gid(cfg, &gid, err))
        return -1;
    int fd = listen_unix(cfg->http_socket, cfg->socket_mode, err);
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

static int gw_listen_tcp(http *h, const char *spec, char err[ERR_MAX])
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

http *http_new(struct event_base *base, const config *cfg, const session_env *senv,
               connbudget *budget, models *reg, char err[ERR_MAX])
{
    http *h = calloc(1, sizeof *h);
    if (!h) {
        err_set(err, "out of memory");
        return NULL;
    }
    h->base = base;
    h->cfg = cfg;
    h->budget = budget;
    h->senv = *senv;
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
        .accept_retry_ms = LISTEN_ACCEPT_RETRY_MS,
    };
    if (!(h->store = respstore_new((size_t)cfg->responses_store_bytes))) {
        err_set(err, "out of memory");
        goto fail;
    }
    httpwire_hooks hooks = {gw_open, gw_head, gw_body, gw_close};
    if (!(h->wire = httpwire_new(base, &wcfg, &hooks, h))) {
        err_set(err, "out of memory");
        goto fail;
    }
    if (cfg->http_tokens_file[0] &&
        load_tokens(cfg->http_tokens_file, &h->tokens, &h->n_tokens, err))
        goto fail;
    if (cfg->http_socket[0] && gw_listen_unix(h, cfg, err))
        goto fail;
    if (cfg->http_listen[0] && gw_listen_tcp(h, cfg->http_listen, err))
        goto fail;
    return h;
fail:
    http_free(h);
    return NULL;
}

respstore *http_respstore(http *h)
{
    return h->store;
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
            http_finish_error(hr, LLMS__ERROR_CODE__UNAVAILABLE, "the daemon is shutting down");
            hreq_free(hr);
        }
}

bool http_sending(const http *h)
{
    return httpwire_sending(h->wire);
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
    uidtab_free(&h->body_bytes_per_uid);
    respstore_free(h->store);
    free(h);
}
