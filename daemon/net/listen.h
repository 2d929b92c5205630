/*
 * listen.h — listening Unix sockets and how long a listener rests when accept() fails,
 * for the native listener (server.c) and the HTTP gateway (http.c) alike.
 */
#ifndef LLMS_LISTEN_H
#define LLMS_LISTEN_H

#include <event2/event.h>
#include <event2/listener.h>

#include "daemon/net/ratelog.h"
#include "engine/err.h"

/* How long a listener rests when accept() fails for want of descriptors. */
#define LISTEN_ACCEPT_RETRY_MS 250

/* A listening Unix socket at path with permission bits mode: its directory is created
 * when missing, a stale socket file replaced, one a live daemon answers on refused.
 * The descriptor (non-blocking, close-on-exec), or -1 + err. */
int listen_unix(const char *path, unsigned mode, char err[ERR_MAX]);

/* What a listener does when accept() failed (from its evconnlistener error callback):
 * libevent would retry at once and forever, so l rests ms milliseconds, resume (a timer
 * that enables it again) armed, with one rate-limited warning naming what (the
 * listener) and the n_open connections it has (those keep working). */
void listen_rest(struct evconnlistener *l, struct event *resume, int ms, ratelog *log,
                 const char *what, unsigned n_open);

#endif
