/*
 * server.h — llmsd's event loop side: the listening socket, connections, frames, and
 * the replies coming back from the worker.
 *
 * The socket is the one systemd passes (sd_listen_fds) or a Unix socket at the
 * configured path (its directory created when missing, a stale socket file replaced,
 * its mode set to socket_mode). Each connection reads length-prefixed Request frames;
 * a malformed or empty frame is answered with MALFORMED_FRAME (id 0) and closes the
 * connection, an oversized one likewise with INVALID_ARGUMENT. A connection whose
 * unread replies pass CONNBUDGET_OUT_CAP stops being read and has its streamed calls
 * cancelled until it catches up, so a client that does not read cannot make the
 * daemon grow without bound. A connection that goes away cancels its requests; one
 * that only stops sending (EOF) first gets the replies already queued for it.
 *
 * What one peer can make the daemon hold is bounded: connections per uid and in all
 * (the budget shared with the HTTP gateway, connbudget.h; one more is answered
 * RESOURCE_EXHAUSTED and closed at once), a Bind deadline and an idle timeout
 * (DEADLINE_EXCEEDED, then close), small frames only before Bind, one partial frame per
 * connection with those over SERVER_SMALL_FRAME drawing on max_buffered_bytes, frames of
 * more than FRAME_MAX_FIELDS fields refused before decoding, and READ_SLICE_BYTES of
 * frames per read callback before other connections get their turn. When accept() fails
 * for want of descriptors the listener pauses instead of spinning, logging once in a
 * while.
 */
#ifndef LLMS_SERVER_H
#define LLMS_SERVER_H

#include <event2/event.h>

#include "daemon/config.h"
#include "daemon/net/connbudget.h"
#include "daemon/net/http.h"
#include "daemon/net/outq.h"
#include "daemon/sched/sched.h"
#include "daemon/net/session.h"
#include "engine/err.h"
#include "engine/tok/tokenizer.h"

/* Frames up to this size are read without drawing on max_buffered_bytes: each
 * connection holds at most one, and connections are capped. */
#define SERVER_SMALL_FRAME (64u << 10)

typedef struct server server;

/* The server on base, not yet listening: replies are read from out, requests go to sch,
 * connections count in budget (which outlives the server; server_shutdown closes it to
 * every listener). NULL + err on failure. */
server *server_new(struct event_base *base, const config *cfg, const tokenizer *tok,
                   sched *sch, outq *out, connbudget *budget, char err[ERR_MAX]);

/* Opens the native socket (or takes the one systemd passed) and starts accepting. Called
 * last, once every other listener (the HTTP gateway) is up: a client that can connect
 * here finds the whole daemon ready. 0, or -1 + err. */
int server_listen(server *srv, char err[ERR_MAX]);

/* Begins shutdown: stops accepting, tells the worker to cancel and persist everything,
 * and, once the worker is done and replies are flushed (or after a grace period),
 * leaves the event loop. Idempotent. */
void server_shutdown(server *srv);

/* Hands replies for HTTP_CONN_BIT connection ids to the gateway gw, which also hears of
 * shutdown (stop taking requests) and of the worker's end (fail what still waits). */
void server_set_http(server *srv, http *gw);

/* The session environment of native connections, which main.c hands to the gateway: its
 * requests go through the same checks (the same Bind, limits and refusals) with their own
 * send and submitted. */
const session_env *server_session_env(const server *srv);

/* Open native connections. */
unsigned server_n_connections(const server *srv);

/* Closes every connection and the socket (removing the socket file it created). */
void server_free(server *srv);

#endif
