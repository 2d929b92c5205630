/*
 * listen.h — listening Unix sockets and how long a listener rests when accept() fails,
 * for the native listener (server.c) and the HTTP gateway (http.c) alike.
 */
#ifndef LLMS_LISTEN_H
#define LLMS_LISTEN_H

#include "engine/err.h"

/* How long a listener rests when accept() fails for want of descriptors. */
#define LISTEN_ACCEPT_RETRY_MS 250

/* A listening Unix socket at path with permission bits mode: its directory is created
 * when missing, a stale socket file replaced, one a live daemon answers on refused.
 * The descriptor (non-blocking, close-on-exec), or -1 + err. */
int listen_unix(const char *path, unsigned mode, char err[ERR_MAX]);

#endif
