/*
 * http.h — the OpenAI-compatible HTTP gateway: HTTP/1.1 (daemon/net/httpwire.h) on a Unix
 * socket (http_socket) and/or a loopback TCP port (http_listen), JSON through json-c.
 *
 * Routes: GET /v1/models, POST /v1/chat/completions, POST /v1/completions,
 * POST /v1/embeddings, POST /v1/rerank (also llama.cpp's /rerank, /reranking and
 * /v1/reranking), POST /v1/responses with GET and DELETE /v1/responses/{id} and GET
 * /v1/responses/{id}/input_items (stored responses, answered on the loop from its
 * respstore.h, each its uid's alone), GET /health, GET /metrics; and ollama's API (ollama.c): GET /api/version,
 * /api/tags, /api/ps, POST /api/show, /api/generate, /api/chat, /api/embed,
 * /api/embeddings, with its error shape; its model management (/api/pull, push, create,
 * copy, delete) is refused; and llama.cpp's server's own (llamacpp.c, tokroute.c): POST
 * /completion (/completions), /apply-template, /embedding (/embeddings), GET /props, with
 * its error shape, and /tokenize and /detokenize, with OpenAI's; /slots is refused.
 *
 * Every request becomes the native Request a client would send (Complete, Call, Embed,
 * Rerank, Status) on a connection of its own whose id has HTTP_CONN_BIT set: it binds
 * through session_handle like a native connection (the same app identity, checks and
 * limits), goes to the same scheduler, and its Response frames come back through the
 * outq to http_deliver, which writes JSON or Server-Sent Events. When the HTTP client
 * goes away before the answer, the connection is closed towards the worker exactly as
 * a native one is (SCHED_CLOSED), which cancels the generation.
 *
 * Models: a request's "model" names any model of the registry (absent: the route's
 * default, as a native request naming none). Completions and chats go to that model
 * (CompleteRequest.model, CallRequest.model), a chat rendered with its chat template;
 * embeddings and rerank pass it on (EmbedRequest.model, RerankRequest.model) and the
 * worker checks the role; /v1/llmsd/rag takes only the default generate model. A name
 * the registry does not hold is 404 model_not_found; /v1/models lists every model. The
 * gateway runs on the event loop, which must not touch the registry: at each request it
 * brings its copy of the registry's names, roles and templates up to date with
 * models_view_update (the worker publishes one after every load and unload), so a model
 * is usable over HTTP once its load has answered and gone once its unload has.
 *
 * Identity: on the Unix socket the peer's uid (SO_PEERCRED) and the app named by the
 * X-Llmsd-App header (default FRAME_DEFAULT_APP, "default", as every client); on TCP the bearer token, mapped to (uid, app) by
 * http_tokens_file. /metrics needs an admin (as llmsctl status): uid 0 or admin_group
 * on the socket, a token marked admin on TCP. /health needs no identity.
 *
 * What one local user can make the gateway hold is bounded as for native connections:
 * its connections count in the daemon's max_connections and max_connections_per_uid
 * (on the Unix socket under the peer's uid from the accept; on TCP under the uid of the
 * token once a request names one, before that under http_max_unauthenticated_connections),
 * past which a connection is answered 429 (its uid) or 503 (everyone's) and closed; a
 * request head must arrive within http_header_timeout_ms and a body within
 * http_body_timeout_ms plus a second a MiB (408 and the close after); a body is read only
 * after its request is known to be acceptable, and its Content-Length is first reserved
 * from http_max_body_buffered_bytes_per_uid (429 past it) and
 * http_max_body_buffered_bytes (503), given back once it is parsed.
 */
#ifndef LLMS_HTTP_H
#define LLMS_HTTP_H

#include <event2/event.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/config.h"
#include "daemon/models/models.h"
#include "daemon/net/connbudget.h"
#include "daemon/net/respstore.h"
#include "daemon/net/session.h"
#include "daemon/sched/sched.h"
#include "engine/tok/chat.h"
#include "engine/err.h"

/* Connection ids of HTTP requests have this bit; native connections count from 1. */
#define HTTP_CONN_BIT (UINT64_C(1) << 63)

typedef struct http http;

/* Opens the gateway's listeners on base (cfg->http_socket and/or cfg->http_listen; at
 * least one is set). senv is the native connections' session environment (copied), which
 * the requests go through with the gateway's own send and submitted; budget the
 * connection counts the gateway's connections join; reg the model registry (budget and
 * reg outlive the gateway), of which the gateway only calls models_view_update. NULL +
 * err when a listener cannot be opened, http_listen is not a loopback address (and
 * http_allow_remote is 0), or the tokens file is unreadable or malformed. */
http *http_new(struct event_base *base, const config *cfg, const session_env *senv,
               connbudget *budget, models *reg, char err[ERR_MAX]);

/* The gateway's stored responses, for daemon/respload.h to fill before the loop runs. */
respstore *http_respstore(http *h);

/* A Response frame (header and body; not taken) from the worker for connection id
 * conn_id; droppable: a streamed chunk. Frames for requests already gone are dropped. */
void http_deliver(http *h, uint64_t conn_id, const uint8_t *frame, size_t len, bool droppable);

/* Shutdown began: new requests are answered 503, /health says so. */
void http_shutdown(http *h);

/* The worker has exited: requests still waiting are answered 503. */
void http_worker_done(http *h);

/* Reads http_tokens_file again (SIGHUP): its tokens replace those in use, which a file
 * that does not load (err says why) leaves in place; *n gets their number. Requests
 * already identified keep their identity. */
int http_reload_tokens(http *h, size_t *n, char err[ERR_MAX]);

/* Whether an answer is still on its way out: the daemon waits for it before it exits. */
bool http_sending(const http *h);

/* Closes the listeners (removing the socket file) and frees everything. NULL is fine. */
void http_free(http *h);

#endif
