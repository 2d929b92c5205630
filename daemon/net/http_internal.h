/*
 * http_internal.h — what the gateway's two files share: http.c (routes, identity,
 * connections and bodies, requests in flight, streaming, setup) and openai.c (the JSON
 * of the OpenAI API: request bodies read into native requests, native answers written
 * as OpenAI's objects and Server-Sent Events). Not for any other file.
 */
#ifndef LLMS_HTTP_INTERNAL_H
#define LLMS_HTTP_INTERNAL_H

#include <event2/buffer.h>
#include <json-c/json.h>

#include "daemon/net/http.h"
#include "daemon/net/httpwire.h"
#include "daemon/net/server.h"
#include "daemon/net/session.h"

#define HREQ_BUCKETS 256
#define MAX_COUNTS 64           /* (route, status) pairs /metrics counts */

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

typedef struct token_entry token_entry;
typedef struct gwconn gwconn;
typedef struct uid_bodies uid_bodies;

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

/* http.c */
const char *json_text(json_object *o);
void count_status(http *h, enum route r, int status);
void send_json(http *h, httpwire_conn *wc, enum route r, int status, json_object *o);
void hreq_finish(hreq *hr);
int submit(hreq *hr, const Llms__Request *r);
const models_view_entry *view_default(const http *h, unsigned role);

/* openai.c */
void send_error(http *h, httpwire_conn *wc, enum route r, int status,
                const char *type, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
void bad_request(http *h, httpwire_conn *wc, enum route r, const char *msg);
void finish_error(hreq *hr, Llms__ErrorCode code, const char *msg);
int sse_start(hreq *hr);
void sse_text(hreq *hr, const char *text, size_t n, const char *finish);
void on_result(hreq *hr, const Llms__CallResult *res);
void on_rag_result(hreq *hr, const Llms__RagResult *res);
void on_embed(hreq *hr, const Llms__EmbedResponse *e);
void on_rerank(hreq *hr, const Llms__RerankResponse *rr);
void start_generate(hreq *hr, Llms__Request *r, char *msg, size_t cap);
void start_rag(hreq *hr, Llms__Request *r, char *msg, size_t cap);
void start_embed(hreq *hr, Llms__Request *r, char *msg, size_t cap);
void start_rerank(hreq *hr, Llms__Request *r, char *msg, size_t cap);
void send_models(http *h, httpwire_conn *wc);

#endif
