/*
 * httpc.h — a minimal HTTP/1.1 client for the gateway tests: one request per
 * connection (Connection: close), over a Unix socket or 127.0.0.1:port, with the
 * chunked replies of Server-Sent Events decoded. Header-only like llmsd_proc.h.
 */
#ifndef LLMS_TESTS_HTTPC_H
#define LLMS_TESTS_HTTPC_H

#include <arpa/inet.h>
#include <json-c/json.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

typedef struct httpc_reply {
    int status;       /* 0 when no reply came */
    char *head;       /* the status line and headers */
    char *body;       /* de-chunked, NUL-terminated */
    size_t body_len;
} httpc_reply;

static inline void httpc_reply_free(httpc_reply *r)
{
    free(r->head);
    free(r->body);
    memset(r, 0, sizeof *r);
}

/* A TCP port on loopback nothing listens on now (bound and released: a daemon takes it
 * next); -1 when none could be had. */
static inline int httpc_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    close(fd);
    return ntohs(a.sin_port);
}

/* A connected socket to unix_path (when not NULL) or 127.0.0.1:port; -1 on failure. */
static inline int httpc_connect(const char *unix_path, int port)
{
    int fd;
    if (unix_path) {
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        if (strlen(unix_path) >= sizeof a.sun_path)
            return -1;
        memcpy(a.sun_path, unix_path, strlen(unix_path) + 1);
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
            close(fd);
            return -1;
        }
    } else {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
            close(fd);
            return -1;
        }
    }
    if (fd >= 0) {
        struct timeval tv = {120, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    }
    return fd;
}

/* Sends one request on fd: extra_headers are whole "Name: value\r\n" lines or NULL. */
static inline int httpc_send(int fd, const char *method, const char *path,
                             const char *extra_headers, const char *body, size_t body_len)
{
    char head[2048];
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: llmsd\r\nConnection: close\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n%s\r\n",
                     method, path, body ? body_len : 0, extra_headers ? extra_headers : "");
    if (n < 0 || (size_t)n >= sizeof head || send(fd, head, (size_t)n, MSG_NOSIGNAL) != n)
        return -1;
    for (size_t off = 0; body && off < body_len;) {
        ssize_t w = send(fd, body + off, body_len - off, MSG_NOSIGNAL);
        if (w <= 0)
            return -1;
        off += (size_t)w;
    }
    return 0;
}

/* Decodes a chunked body in place; its new length. */
static inline size_t httpc_dechunk(char *b, size_t n)
{
    size_t in = 0, out = 0;
    while (in < n) {
        char *end;
        unsigned long len = strtoul(b + in, &end, 16);
        char *crlf = strstr(b + in, "\r\n");
        if (!crlf || end == b + in)
            break;
        in = (size_t)(crlf - b) + 2;
        if (len == 0 || in + len > n)
            break;
        memmove(b + out, b + in, len);
        out += len;
        in += len + 2;
    }
    b[out] = '\0';
    return out;
}

/* Reads the whole reply (until the server closes) from fd into r. */
static inline int httpc_read(int fd, httpc_reply *r)
{
    memset(r, 0, sizeof *r);
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap);
    if (!buf)
        return -1;
    for (;;) {
        if (len + 4096 > cap) {
            char *p = realloc(buf, cap *= 2);
            if (!p) {
                free(buf);
                return -1;
            }
            buf = p;
        }
        ssize_t got = recv(fd, buf + len, cap - len - 1, 0);
        if (got <= 0)
            break;
        len += (size_t)got;
    }
    buf[len] = '\0';
    char *sep = strstr(buf, "\r\n\r\n");
    if (!sep || sscanf(buf, "HTTP/1.%*d %d", &r->status) != 1) {
        free(buf);
        return -1;
    }
    size_t head_len = (size_t)(sep - buf);
    r->head = strndup(buf, head_len);
    size_t body_len = len - head_len - 4;
    r->body = malloc(body_len + 1);
    if (!r->head || !r->body) {
        free(buf);
        return -1;
    }
    memcpy(r->body, sep + 4, body_len);
    r->body[body_len] = '\0';
    r->body_len = body_len;
    if (strcasestr(r->head, "Transfer-Encoding: chunked"))
        r->body_len = httpc_dechunk(r->body, body_len);
    free(buf);
    return 0;
}

/* One request and its whole reply; 0, or -1 when the exchange failed. */
static inline int httpc_do(const char *unix_path, int port, const char *method, const char *path,
                           const char *extra_headers, const char *body, httpc_reply *r)
{
    memset(r, 0, sizeof *r);
    int fd = httpc_connect(unix_path, port);
    if (fd < 0)
        return -1;
    int rc = httpc_send(fd, method, path, extra_headers, body, body ? strlen(body) : 0);
    if (rc == 0)
        rc = httpc_read(fd, r);
    close(fd);
    return rc;
}

/* POST body to path on the gateway's Unix socket: the reply's JSON (NULL when none or not
 * JSON), its status in *status (0 when no reply came). */
static inline json_object *httpc_post_json(const char *unix_path, const char *path,
                                           const char *body, int *status)
{
    httpc_reply r;
    *status = 0;
    if (httpc_do(unix_path, 0, "POST", path, NULL, body, &r))
        return NULL;
    *status = r.status;
    json_object *o = json_tokener_parse(r.body);
    httpc_reply_free(&r);
    return o;
}

/* The member at a dotted path of o ("choices.0.message.content": keys, and array indexes
 * as numbers); NULL when absent. */
static inline json_object *httpc_jget(json_object *o, const char *path)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    char *save;
    for (char *key = strtok_r(buf, ".", &save); key && o; key = strtok_r(NULL, ".", &save)) {
        if (*key >= '0' && *key <= '9')
            o = json_object_array_get_idx(o, (size_t)atoi(key));
        else if (!json_object_object_get_ex(o, key, &o))
            o = NULL;
    }
    return o;
}

/* The value at a dotted path of o (httpc_jget's) as a string; NULL when absent. */
static inline const char *httpc_jstr(json_object *o, const char *path)
{
    o = httpc_jget(o, path);
    return o ? json_object_get_string(o) : NULL;
}

#endif
