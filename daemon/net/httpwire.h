/*
 * httpwire.h — the HTTP/1.1 connection layer under the gateway (daemon/net/http.c): its own
 * listeners, connections and request parser, so that every bound on what a client can
 * make the daemon hold is the daemon's (libevent 2.1's evhttp has no hook for most of
 * them, and wrapping its connections in filters stalls its replies).
 *
 * What it speaks: a request line and headers of at most max_head_bytes in all (431 past
 * it, or past HTTPWIRE_MAX_HEADERS lines); bodies by Content-Length (a request with a
 * Transfer-Encoding is 411: send Content-Length); Expect: 100-continue; keep-alive on
 * HTTP/1.1 unless "Connection: close" (HTTP/1.0 closes after its answer), pipelined
 * requests taken one at a time, the next once the previous answer is written; answers
 * with Content-Length, or streamed with chunked transfer encoding (HTTP/1.0: until the
 * close).
 *
 * Deadlines: a connection's first request head must arrive whole within
 * header_timeout_ms of the accept; a later one within header_timeout_ms of its first
 * byte (a kept-alive connection waits idle_timeout_ms for that byte, then closes); a body
 * within body_timeout_ms of the end of its head plus body_ms_per_mib a MiB of its
 * Content-Length. Past a deadline the client gets 408 and the connection closes. Errors
 * of the protocol itself are answered in the gateway's JSON error shape
 * ({"error": {"message", "type", "param", "code"}}) and close the connection.
 *
 * When accept() fails (descriptors or memory run out) a listener rests accept_retry_ms
 * instead of retrying at once, with one rate-limited warning for all the failures.
 *
 * Everything runs on the event loop's thread; the hooks are called from it.
 */
#ifndef LLMS_HTTPWIRE_H
#define LLMS_HTTPWIRE_H

#include <event2/buffer.h>
#include <event2/event.h>
#include <stdbool.h>
#include <stddef.h>

#include "engine/err.h"

#define HTTPWIRE_MAX_HEADERS 100

typedef struct httpwire httpwire;
typedef struct httpwire_conn httpwire_conn;

typedef struct httpwire_config {
    size_t max_head_bytes;  /* request line and headers together */
    int header_timeout_ms;
    int body_timeout_ms;    /* plus body_ms_per_mib a MiB of the body */
    int body_ms_per_mib;
    int idle_timeout_ms;    /* a kept-alive connection waiting for its next request */
    int accept_retry_ms;    /* rest of a listener whose accept() failed */
} httpwire_config;

typedef struct httpwire_hooks {
    /* A connection was accepted on fd: 0 serves it, with *data the hook's own state of
     * it (httpwire_data); an HTTP status (429, 503) refuses it, answered with msg if the
     * socket takes the answer at once, and closed. */
    int (*open)(void *arg, int fd, void **data, char *msg, size_t cap);
    /* A request's head arrived (httpwire_method, _target, _header, _content_length).
     * true: read its body, then call body. false: the hook has answered it or will
     * (httpwire_reply, httpwire_stream_*) without its body, which is then not read: the
     * connection closes after that answer, dropping what the client still sends. */
    bool (*head)(void *arg, httpwire_conn *c);
    /* The whole body arrived (httpwire_body, valid until the hook returns); the request
     * is answered now or later. */
    void (*body)(void *arg, httpwire_conn *c);
    /* The connection has ended and is freed: after its last answer, at a deadline or
     * protocol error, or because the client left (or a write failed), possibly while
     * its request waited for an answer. data is the open hook's; nothing of the
     * connection may be used any more. */
    void (*close)(void *arg, void *data);
} httpwire_hooks;

/* A layer without listeners on base; cfg and hooks are copied. NULL when out of memory. */
httpwire *httpwire_new(struct event_base *base, const httpwire_config *cfg,
                       const httpwire_hooks *hooks, void *arg);

/* Accepts connections on fd, a listening stream socket (taken: closed by httpwire_free,
 * or at once on failure). 0, or -1 + err. */
int httpwire_listen(httpwire *w, int fd, char err[ERR_MAX]);

/* Closes the listeners and every connection (each through the close hook). NULL is
 * fine. */
void httpwire_free(httpwire *w);

/* Whether a connection has an answer not yet whole or not yet taken by the kernel. */
bool httpwire_sending(const httpwire *w);

/* The current request of c: its method ("GET"), target ("/v1/models?x"), the value of
 * its first header named name (any case; NULL when none), its Content-Length (0 when
 * none), and, in the body hook, its body (NUL-terminated; *len its length). */
const char *httpwire_method(const httpwire_conn *c);
const char *httpwire_target(const httpwire_conn *c);
const char *httpwire_header(const httpwire_conn *c, const char *name);
size_t httpwire_content_length(const httpwire_conn *c);
const char *httpwire_body(const httpwire_conn *c, size_t *len);

/* c's socket, and the open hook's state of it. */
int httpwire_fd(const httpwire_conn *c);
void *httpwire_data(const httpwire_conn *c);

/* Adds a header ("Name", "value") to the next answer of c. */
void httpwire_add_header(httpwire_conn *c, const char *name, const char *value);

/* Answers c's current request with status and body (len bytes, copied), with the
 * headers added and Content-Length. Once per request; the calls below likewise begin
 * and end its one answer. A failure (out of memory) closes the connection instead. */
void httpwire_reply(httpwire_conn *c, int status, const void *body, size_t len);

/* A streamed answer: the status and headers, then chunks (each taking the whole of b;
 * an empty one sends nothing), then its end. */
void httpwire_stream_start(httpwire_conn *c, int status);
void httpwire_stream_chunk(httpwire_conn *c, struct evbuffer *b);
void httpwire_stream_end(httpwire_conn *c);

/* Bytes of answers queued on c that the client has not taken yet. */
size_t httpwire_unsent(const httpwire_conn *c);

#endif
