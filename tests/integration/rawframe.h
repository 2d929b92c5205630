/*
 * rawframe.h — a client of llmsd that speaks raw frames, for the integration tests that
 * need what libllmsclient will not do: pipelining requests without reading, bad frames.
 * Header-only (static inline), as llmsd_proc.h.
 */
#ifndef LLMS_TESTS_RAWFRAME_H
#define LLMS_TESTS_RAWFRAME_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "proto/frame.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/support/test.h"

static inline int raw_connect(const llmsd_proc *d)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    memcpy(addr.sun_path, d->sock, strlen(d->sock) + 1);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    /* A daemon that hangs on a bad frame fails the test rather than hanging it (an Embed
     * of 16 long texts takes longer than 20 s under ThreadSanitizer). */
    struct timeval tv = {.tv_sec = 20 * TEST_TIME_SCALE};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

static inline int raw_write(int fd, const void *buf, size_t n)
{
    const uint8_t *p = buf;
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static inline int raw_send(int fd, Llms__Request *req)
{
    uint8_t *buf;
    size_t len;
    if (frame_pack(&req->base, UINT32_MAX, &buf, &len) < 0)
        return -1;
    int rc = raw_write(fd, buf, len);
    free(buf);
    return rc;
}

/* Reads one Response; NULL at EOF, on a timeout (*timed_out set) or garbage. */
static inline Llms__Response *raw_read(int fd, int *timed_out)
{
    uint8_t h[FRAME_HEADER_BYTES];
    size_t got = 0;
    uint32_t len;
    *timed_out = 0;
    while (got < sizeof h) {
        ssize_t r = read(fd, h + got, sizeof h - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            *timed_out = 1;
        if (r <= 0)
            return NULL;
        got += (size_t)r;
    }
    if (frame_peek(h, sizeof h, 1u << 26, &len) == FRAME_TOO_LARGE || len == 0)
        return NULL;
    uint8_t *body = malloc(len);
    for (got = 0; body && got < len;) {
        ssize_t r = read(fd, body + got, len - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            *timed_out = 1;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    Llms__Response *resp = body && got == len ? frame_unpack_response(body, len) : NULL;
    free(body);
    return resp;
}

/* Binds the connection to app; 0, or -1 when the daemon refused or did not answer. */
static inline int raw_bind(int fd, const char *app)
{
    Llms__BindRequest b = LLMS__BIND_REQUEST__INIT;
    b.app_name = (char *)app;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.id = 1000;
    req.body_case = LLMS__REQUEST__BODY_BIND;
    req.bind = &b;
    if (raw_send(fd, &req) < 0)
        return -1;
    int timed_out;
    Llms__Response *r = raw_read(fd, &timed_out);
    int ok = r && !r->error;
    frame_free_response(r);
    return ok ? 0 : -1;
}

#endif
