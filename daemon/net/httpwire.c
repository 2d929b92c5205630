/*
 * httpwire.c — HTTP/1.1 listeners, connections and request parsing (httpwire.h).
 *
 * A connection is in one state at a time: reading a request head, reading its body,
 * with the hooks (waiting for its answer), streaming its answer, flushing its answer,
 * or lingering before the close. One timer per connection holds whichever deadline
 * the state has.
 */
#include "daemon/net/httpwire.h"

#include <errno.h>
#include <event2/bufferevent.h>
#include <event2/listener.h>
#include <json-c/json.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon/net/listen.h"
#include "daemon/net/ratelog.h"

/* After a last answer whose request still had bytes coming (an unread body), those are
 * read and dropped for this long at least before the close: closing a socket with
 * unread input resets it, which can destroy the answer on its way to the client. */
#define LINGER_MS 2000
/* How long the answer to a client past its deadline may take to leave. */
#define ABORT_MS 1000
/* Input read beyond a head's limit while a request waits (a pipelined next one). */
#define READ_SLACK (16u << 10)
#define CONTENT_LENGTH_MAX ((size_t)1 << 40)

enum wstate {
    WS_HEAD,    /* reading a request head */
    WS_BODY,    /* reading its body */
    WS_HANDLER, /* the hooks have the request: its answer has not begun */
    WS_STREAM,  /* its answer is being streamed */
    WS_FLUSH,   /* its answer is whole: waiting for it to leave */
    WS_LINGER,  /* the last answer is out: dropping input until the client closes */
};

typedef struct header {
    const char *name, *value;
} header;

typedef struct listener {
    httpwire *w;
    struct evconnlistener *l;
    struct event *resume;      /* re-enables the listener after a failed accept() */
    struct listener *next;
} listener;

struct httpwire_conn {
    httpwire *w;
    void *data;
    int fd;
    struct bufferevent *bev;
    struct event *timer;
    enum wstate st;
    bool head_timer;           /* WS_HEAD: the header deadline runs (else the idle wait) */
    bool close_after;          /* close once the answer is out */
    bool unread_body;          /* the request's body will not be read: close after it */
    bool abort;                /* the client is past a deadline: close within ABORT_MS */
    bool http10, is_head, expect_continue;
    size_t scanned;            /* input already searched for the end of the head */
    char *head;                /* the current request's head, split in place */
    const char *method, *target;
    header hdr[HTTPWIRE_MAX_HEADERS];
    size_t n_hdr;
    size_t content_length;
    char *body;
    size_t body_got;
    struct evbuffer *out_hdr;  /* headers added for the answer, as "Name: value\r\n" */
    httpwire_conn *prev, *next;
};

struct httpwire {
    struct event_base *base;
    httpwire_config cfg;
    httpwire_hooks hooks;
    void *arg;
    listener *listeners;
    httpwire_conn *conns;
    ratelog log_accept, log_refused;
};

static const char *reason(int status)
{
    switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return "Internal Server Error";
    }
}

/* The gateway's JSON error body for a status of this layer, into out (cap bytes). */
static void error_json(int status, const char *msg, char *out, size_t cap)
{
    const char *type = status == 429 ? "rate_limit_error"
                       : status >= 500 ? "server_error" : "invalid_request_error";
    const char *code;
    switch (status) {
    case 408: code = "request_timeout"; break;
    case 411: code = "length_required"; break;
    case 413: code = "body_too_large"; break;
    case 429: code = "resource_exhausted"; break;
    case 431: code = "headers_too_large"; break;
    case 503: code = "unavailable"; break;
    case 505: code = "http_version_not_supported"; break;
    default: code = status >= 500 ? "internal_error" : "invalid_request"; break;
    }
    json_object *m = json_object_new_string(msg);
    const char *esc = m ? json_object_to_json_string_ext(m, JSON_C_TO_STRING_PLAIN |
                                                                JSON_C_TO_STRING_NOSLASHESCAPE)
                        : "\"\"";
    snprintf(out, cap,
             "{\"error\":{\"message\":%s,\"type\":\"%s\",\"param\":null,\"code\":\"%s\"}}", esc,
             type, code);
    json_object_put(m);
}

static void arm(httpwire_conn *c, int64_t ms)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    evtimer_add(c->timer, &tv);
}

/* How long a body of n bytes may take to arrive after its head. */
static int64_t body_deadline_ms(const httpwire *w, size_t n)
{
    return w->cfg.body_timeout_ms + (int64_t)(((uint64_t)n * (uint64_t)w->cfg.body_ms_per_mib) >> 20);
}

/* ---- connections ---- */

static void conn_free(httpwire_conn *c)
{
    httpwire *w = c->w;
    if (c->prev)
        c->prev->next = c->next;
    else
        w->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    void *data = c->data;
    event_free(c->timer);
    bufferevent_free(c->bev);
    evbuffer_free(c->out_hdr);
    free(c->head);
    free(c->body);
    free(c);
    w->hooks.close(w->arg, data);
}

static void request_reset(httpwire_conn *c)
{
    free(c->head);
    free(c->body);
    c->head = c->body = NULL;
    c->method = c->target = NULL;
    c->n_hdr = 0;
    c->content_length = c->body_got = 0;
    c->unread_body = c->is_head = c->expect_continue = false;
    evbuffer_drain(c->out_hdr, evbuffer_get_length(c->out_hdr));
}

/* The answer is whole: it leaves before anything else happens on c. */
static void enter_flush(httpwire_conn *c)
{
    c->st = WS_FLUSH;
    if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
        arm(c, 0); /* nothing left to write: no write callback will come */
    else if (c->abort)
        arm(c, ABORT_MS);
    else
        evtimer_del(c->timer);
}

/* The status line and headers of an answer; len < 0: streamed. */
static void write_head(httpwire_conn *c, int status, long long len)
{
    struct evbuffer *out = bufferevent_get_output(c->bev);
    if (c->unread_body)
        c->close_after = true;
    int rc = evbuffer_add_printf(out, "HTTP/1.1 %d %s\r\n", status, reason(status)) < 0;
    rc |= evbuffer_add_buffer(out, c->out_hdr);
    if (len >= 0)
        rc |= evbuffer_add_printf(out, "Content-Length: %lld\r\n", len) < 0;
    else if (!c->http10)
        rc |= evbuffer_add(out, "Transfer-Encoding: chunked\r\n", 28);
    if (c->close_after)
        rc |= evbuffer_add(out, "Connection: close\r\n", 19);
    rc |= evbuffer_add(out, "\r\n", 2);
    if (rc)
        c->close_after = c->abort = true;
}

void httpwire_reply(httpwire_conn *c, int status, const void *body, size_t len)
{
    if (c->st != WS_HANDLER)
        return;
    write_head(c, status, (long long)len);
    if (len && !c->is_head && evbuffer_add(bufferevent_get_output(c->bev), body, len))
        c->close_after = c->abort = true;
    enter_flush(c);
}

void httpwire_stream_start(httpwire_conn *c, int status)
{
    if (c->st != WS_HANDLER)
        return;
    if (c->http10)
        c->close_after = true; /* no chunks in HTTP/1.0: the close ends the answer */
    write_head(c, status, -1);
    c->st = WS_STREAM;
}

void httpwire_stream_chunk(httpwire_conn *c, struct evbuffer *b)
{
    size_t n = evbuffer_get_length(b);
    if (c->st != WS_STREAM || n == 0) {
        evbuffer_drain(b, n);
        return;
    }
    struct evbuffer *out = bufferevent_get_output(c->bev);
    int rc = 0;
    if (!c->http10)
        rc |= evbuffer_add_printf(out, "%zx\r\n", n) < 0;
    rc |= evbuffer_add_buffer(out, b);
    if (!c->http10)
        rc |= evbuffer_add(out, "\r\n", 2);
    if (rc) {
        /* A chunk half written cannot be taken back: the stream ends with the close. */
        evbuffer_drain(b, evbuffer_get_length(b));
        c->close_after = c->abort = true;
        enter_flush(c);
    }
}

void httpwire_stream_end(httpwire_conn *c)
{
    if (c->st != WS_STREAM)
        return;
    if (!c->http10 && evbuffer_add(bufferevent_get_output(c->bev), "0\r\n\r\n", 5))
        c->close_after = c->abort = true;
    enter_flush(c);
}

void httpwire_add_header(httpwire_conn *c, const char *name, const char *value)
{
    if (evbuffer_add_printf(c->out_hdr, "%s: %s\r\n", name, value) < 0)
        c->close_after = c->abort = true;
}

/* Answers the request being read with a protocol error and closes: at once after the
 * answer when the client is past a deadline (abort), else after a linger. */
static void fail(httpwire_conn *c, int status, bool abort, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void fail(httpwire_conn *c, int status, bool abort, const char *fmt, ...)
{
    char msg[300], body[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    free(c->body);
    c->body = NULL;
    c->st = WS_HANDLER;
    c->close_after = true;
    c->abort = abort;
    c->is_head = false;
    evbuffer_drain(c->out_hdr, evbuffer_get_length(c->out_hdr));
    error_json(status, msg, body, sizeof body);
    httpwire_add_header(c, "Content-Type", "application/json");
    httpwire_reply(c, status, body, strlen(body));
}

static bool is_tchar(unsigned char ch)
{
    return ch > 0x20 && ch < 0x7f && !strchr("\"(),/:;<=>?@[\\]{}", ch);
}

/* Whether the comma-separated list s holds token (any case). */
static bool list_has(const char *s, const char *token)
{
    size_t n = strlen(token);
    while (*s) {
        s += strspn(s, " \t,");
        size_t len = strcspn(s, ",");
        size_t end = len;
        while (end && (s[end - 1] == ' ' || s[end - 1] == '\t'))
            end--;
        if (end == n && strncasecmp(s, token, n) == 0)
            return true;
        s += len;
    }
    return false;
}

/* Splits the request line (line, a C string) into method, target and version. 0, or the
 * status it is refused with (msg says why). */
static int parse_request_line(httpwire_conn *c, char *line, char *msg, size_t cap)
{
    char *sp1 = strchr(line, ' ');
    char *sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;
    if (!sp1 || !sp2 || sp1 == line || sp2 == sp1 + 1) {
        snprintf(msg, cap, "the request line is not 'METHOD TARGET HTTP/1.1'");
        return 400;
    }
    *sp1 = *sp2 = '\0';
    for (const char *p = line; *p; p++)
        if (!is_tchar((unsigned char)*p)) {
            snprintf(msg, cap, "the request line is not 'METHOD TARGET HTTP/1.1'");
            return 400;
        }
    for (const unsigned char *p = (const unsigned char *)sp1 + 1; *p; p++)
        if (*p <= 0x20 || *p == 0x7f) {
            snprintf(msg, cap, "the request target has control characters");
            return 400;
        }
    const char *version = sp2 + 1;
    if (strcmp(version, "HTTP/1.1") == 0) {
        c->http10 = false;
    } else if (strcmp(version, "HTTP/1.0") == 0) {
        c->http10 = true;
    } else {
        snprintf(msg, cap, "HTTP/1.1 or HTTP/1.0 only");
        return strncmp(version, "HTTP/", 5) == 0 ? 505 : 400;
    }
    c->method = line;
    c->target = sp1 + 1;
    return 0;
}

/* Splits the header lines from line to the blank line (each ends in CRLF) into c->hdr,
 * values trimmed. 0, or the status they are refused with (msg says why). */
static int parse_header_lines(httpwire_conn *c, char *line, char *msg, size_t cap)
{
    while (*line) {
        char *e = strstr(line, "\r\n");
        *e = '\0';
        if (!*line)
            break;
        if (c->n_hdr == HTTPWIRE_MAX_HEADERS) {
            snprintf(msg, cap, "more than %d header lines", HTTPWIRE_MAX_HEADERS);
            return 431;
        }
        char *colon = strchr(line, ':');
        bool ok = colon && colon > line;
        for (const char *p = line; ok && p < colon; p++)
            ok = is_tchar((unsigned char)*p);
        if (!ok) {
            snprintf(msg, cap, "a header line is not 'Name: value'");
            return 400;
        }
        *colon = '\0';
        char *v = colon + 1;
        v += strspn(v, " \t");
        char *end = v + strlen(v);
        while (end > v && (end[-1] == ' ' || end[-1] == '\t'))
            *--end = '\0';
        for (const unsigned char *p = (const unsigned char *)v; *p; p++)
            if ((*p < 0x20 && *p != '\t') || *p == 0x7f) {
                snprintf(msg, cap, "the header %.64s has control characters", line);
                return 400;
            }
        c->hdr[c->n_hdr++] = (header){line, v};
        line = e + 2;
    }
    return 0;
}

/* The body's length from Content-Length (every such header the same number); a
 * Transfer-Encoding is refused. 0, or the status (msg says why). */
static int read_content_length(httpwire_conn *c, char *msg, size_t cap)
{
    bool have_length = false;
    for (size_t i = 0; i < c->n_hdr; i++) {
        const header *x = &c->hdr[i];
        if (strcasecmp(x->name, "Transfer-Encoding") == 0) {
            snprintf(msg, cap, "request bodies must come with Content-Length, not a "
                               "Transfer-Encoding");
            return 411;
        }
        if (strcasecmp(x->name, "Content-Length") != 0)
            continue;
        size_t digits = strspn(x->value, "0123456789");
        if (!digits || x->value[digits] || digits > 15) {
            snprintf(msg, cap, "Content-Length is not a number of bytes");
            return digits > 15 && !x->value[digits] ? 413 : 400;
        }
        size_t n = (size_t)strtoull(x->value, NULL, 10);
        if (n > CONTENT_LENGTH_MAX) {
            snprintf(msg, cap, "a body of %zu bytes", n);
            return 413;
        }
        if (have_length && n != c->content_length) {
            snprintf(msg, cap, "two different Content-Length headers");
            return 400;
        }
        have_length = true;
        c->content_length = n;
    }
    return 0;
}

/*
 * Takes the head (head_len bytes of the input, its blank line included) and splits it
 * in place: request line, then "Name: value" lines. 0, or the status it is refused with
 * (msg says why).
 */
static int parse_head(httpwire_conn *c, size_t head_len, char *msg, size_t cap)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);
    char *h = malloc(head_len + 1);
    if (!h) {
        evbuffer_drain(in, head_len);
        snprintf(msg, cap, "out of memory");
        return 503;
    }
    evbuffer_remove(in, h, head_len);
    h[head_len] = '\0';
    c->head = h;
    if (memchr(h, '\0', head_len)) { /* the splitting below works on C strings */
        snprintf(msg, cap, "the request head has a NUL byte");
        return 400;
    }
    char *eol = strstr(h, "\r\n");
    *eol = '\0';
    int status = parse_request_line(c, h, msg, cap);
    if (status || (status = parse_header_lines(c, eol + 2, msg, cap)) ||
        (status = read_content_length(c, msg, cap)))
        return status;
    const char *conn = httpwire_header(c, "Connection");
    if (c->http10 || (conn && list_has(conn, "close")))
        c->close_after = true;
    const char *expect = httpwire_header(c, "Expect");
    c->expect_continue = !c->http10 && expect && strcasecmp(expect, "100-continue") == 0;
    c->is_head = strcmp(c->method, "HEAD") == 0;
    return 0;
}

/* The body is whole: the hooks take the request. */
static void deliver_body(httpwire_conn *c)
{
    httpwire *w = c->w;
    evtimer_del(c->timer);
    c->st = WS_HANDLER;
    if (c->body)
        c->body[c->content_length] = '\0';
    w->hooks.body(w->arg, c);
    /* The hook has taken what it needs of the body: its memory goes now, not with the
     * answer, which may be minutes away. */
    free(c->body);
    c->body = NULL;
}

/* A head was parsed: the hooks see it, then its body is read or skipped. */
static void take_head(httpwire_conn *c)
{
    httpwire *w = c->w;
    evtimer_del(c->timer);
    c->st = WS_HANDLER;
    c->unread_body = c->content_length > 0;
    bool want = w->hooks.head(w->arg, c);
    if (c->st != WS_HANDLER || !want)
        return; /* answered, or to be answered, without the body */
    c->unread_body = false;
    if (c->content_length == 0) {
        deliver_body(c);
        return;
    }
    if (!(c->body = malloc(c->content_length + 1))) {
        fail(c, 503, false, "out of memory for a body of %zu bytes", c->content_length);
        return;
    }
    if (c->expect_continue &&
        evbuffer_add(bufferevent_get_output(c->bev), "HTTP/1.1 100 Continue\r\n\r\n", 25)) {
        fail(c, 503, false, "out of memory");
        return;
    }
    c->st = WS_BODY;
    arm(c, body_deadline_ms(w, c->content_length));
}

/* Reads what the state wants of the input: heads, bodies, or nothing while a request
 * is with the hooks (a pipelined request waits in the input until its turn). */
static void conn_process(httpwire_conn *c)
{
    httpwire *w = c->w;
    struct evbuffer *in = bufferevent_get_input(c->bev);
    char msg[300];
    for (;;) {
        size_t n = evbuffer_get_length(in);
        if (c->st == WS_LINGER) {
            evbuffer_drain(in, n);
            return;
        }
        if (c->st == WS_BODY) {
            size_t take = c->content_length - c->body_got;
            take = n < take ? n : take;
            if (take)
                evbuffer_remove(in, c->body + c->body_got, take);
            c->body_got += take;
            if (c->body_got < c->content_length)
                return;
            deliver_body(c);
            continue;
        }
        if (c->st != WS_HEAD || n == 0)
            return;
        if (!c->head_timer) {
            c->head_timer = true;
            arm(c, w->cfg.header_timeout_ms);
        }
        /* Blank lines before a request line are allowed (RFC 9112, 2.2). */
        if (c->scanned == 0) {
            unsigned char *p = evbuffer_pullup(in, 1);
            if (p && (*p == '\r' || *p == '\n')) {
                evbuffer_drain(in, 1);
                continue;
            }
        }
        struct evbuffer_ptr at;
        evbuffer_ptr_set(in, &at, c->scanned > 3 ? c->scanned - 3 : 0, EVBUFFER_PTR_SET);
        struct evbuffer_ptr end = evbuffer_search(in, "\r\n\r\n", 4, &at);
        size_t head_len = end.pos >= 0 ? (size_t)end.pos + 4 : 0;
        if (end.pos < 0 ? n > w->cfg.max_head_bytes : head_len > w->cfg.max_head_bytes) {
            fail(c, 431, false, "the request head is over %zu bytes", w->cfg.max_head_bytes);
            return;
        }
        if (end.pos < 0) {
            c->scanned = n;
            return;
        }
        c->scanned = 0;
        int status = parse_head(c, head_len, msg, sizeof msg);
        if (status) {
            fail(c, status, false, "%s", msg);
            return;
        }
        take_head(c);
    }
}

/* The answer has left: the next request, or the close. */
static void answer_done(httpwire_conn *c)
{
    httpwire *w = c->w;
    struct evbuffer *in = bufferevent_get_input(c->bev);
    if (c->close_after) {
        if (c->abort || (!c->unread_body && evbuffer_get_length(in) == 0)) {
            conn_free(c);
            return;
        }
        int64_t ms = c->unread_body ? body_deadline_ms(w, c->content_length) : 0;
        request_reset(c);
        c->st = WS_LINGER;
        shutdown(c->fd, SHUT_WR);
        bufferevent_enable(c->bev, EV_READ);
        arm(c, ms > LINGER_MS ? ms : LINGER_MS);
        conn_process(c);
        return;
    }
    request_reset(c);
    c->st = WS_HEAD;
    c->head_timer = false;
    arm(c, w->cfg.idle_timeout_ms);
    conn_process(c);
}

static void on_read(struct bufferevent *bev, void *arg)
{
    (void)bev;
    conn_process(arg);
}

static void on_write(struct bufferevent *bev, void *arg)
{
    httpwire_conn *c = arg;
    if (c->st == WS_FLUSH && evbuffer_get_length(bufferevent_get_output(bev)) == 0)
        answer_done(c);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    httpwire_conn *c = arg;
    if ((what & BEV_EVENT_EOF) && !(what & BEV_EVENT_ERROR) && c->st == WS_FLUSH &&
        evbuffer_get_length(bufferevent_get_output(bev)) > 0) {
        /* The client stopped sending after its request: its answer still goes out. */
        c->close_after = true;
        c->unread_body = false;
        return;
    }
    /* An error, or the end of the client: a request waiting for its answer goes with it
     * (the close hook hears of it). */
    conn_free(c);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    httpwire_conn *c = arg;
    const httpwire_config *cfg = &c->w->cfg;
    switch (c->st) {
    case WS_HEAD:
        if (!c->head_timer) { /* a kept-alive connection idle too long */
            conn_free(c);
            return;
        }
        fail(c, 408, true, "the request head did not arrive whole within "
                           "http_header_timeout_ms (%d ms)", cfg->header_timeout_ms);
        return;
    case WS_BODY:
        fail(c, 408, true, "the body of %zu bytes did not arrive whole within %lld ms of its "
                           "head (http_body_timeout_ms plus %d ms a MiB)",
             c->content_length, (long long)body_deadline_ms(c->w, c->content_length),
             cfg->body_ms_per_mib);
        return;
    case WS_FLUSH:
        if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
            answer_done(c);
        else
            conn_free(c); /* an aborted connection's answer did not leave in time */
        return;
    default:
        conn_free(c); /* the linger is over */
        return;
    }
}

/* ---- listeners ---- */

/* Refuses a connection with a short answer; the socket's buffer is empty, so it goes out
 * at once or not at all. */
static void refuse_fd(httpwire *w, int fd, int status, const char *msg)
{
    char body[600], buf[900];
    error_json(status, msg, body, sizeof body);
    int n = snprintf(buf, sizeof buf,
                     "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n%s",
                     status, reason(status), strlen(body), body);
    if (n > 0 && (size_t)n < sizeof buf)
        (void)!send(fd, buf, (size_t)n, MSG_DONTWAIT | MSG_NOSIGNAL);
    close(fd);
    ratelog_warn(&w->log_refused, "refused an HTTP connection: %s", msg);
}

static void on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa,
                      int socklen, void *arg)
{
    (void)l;
    (void)sa;
    (void)socklen;
    httpwire *w = ((listener *)arg)->w;
    char msg[256] = "";
    void *data = NULL;
    int status = w->hooks.open(w->arg, fd, &data, msg, sizeof msg);
    if (status) {
        refuse_fd(w, fd, status, msg);
        return;
    }
    httpwire_conn *c = calloc(1, sizeof *c);
    struct bufferevent *bev = c ? bufferevent_socket_new(w->base, fd, BEV_OPT_CLOSE_ON_FREE) : NULL;
    struct event *timer = bev ? evtimer_new(w->base, on_timer, c) : NULL;
    struct evbuffer *out_hdr = timer ? evbuffer_new() : NULL;
    if (!out_hdr) {
        if (timer)
            event_free(timer);
        if (bev)
            bufferevent_free(bev);
        else
            close(fd);
        free(c);
        w->hooks.close(w->arg, data);
        ratelog_warn(&w->log_refused, "refused an HTTP connection: out of memory");
        return;
    }
    c->w = w;
    c->data = data;
    c->fd = fd;
    c->bev = bev;
    c->timer = timer;
    c->out_hdr = out_hdr;
    c->st = WS_HEAD;
    c->head_timer = true; /* the first request's deadline runs from the accept */
    c->next = w->conns;
    if (w->conns)
        w->conns->prev = c;
    w->conns = c;
    bufferevent_setcb(bev, on_read, on_write, on_event, c);
    bufferevent_setwatermark(bev, EV_READ, 0, w->cfg.max_head_bytes + READ_SLACK);
    bufferevent_enable(bev, EV_READ | EV_WRITE);
    arm(c, w->cfg.header_timeout_ms);
}

/* accept() failed for want of descriptors or memory: the listener rests (listen_rest). */
static void on_accept_error(struct evconnlistener *l, void *arg)
{
    listener *ls = arg;
    httpwire *w = ls->w;
    unsigned n = 0;
    for (const httpwire_conn *c = w->conns; c; c = c->next)
        n++;
    listen_rest(l, ls->resume, w->cfg.accept_retry_ms, &w->log_accept, "http accept", n);
}

static void on_accept_resume(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    listener *ls = arg;
    evconnlistener_enable(ls->l);
}

httpwire *httpwire_new(struct event_base *base, const httpwire_config *cfg,
                       const httpwire_hooks *hooks, void *arg)
{
    httpwire *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->base = base;
    w->cfg = *cfg;
    w->hooks = *hooks;
    w->arg = arg;
    return w;
}

int httpwire_listen(httpwire *w, int fd, char err[ERR_MAX])
{
    listener *ls = calloc(1, sizeof *ls);
    struct event *resume = ls ? evtimer_new(w->base, on_accept_resume, ls) : NULL;
    struct evconnlistener *l =
        resume ? evconnlistener_new(w->base, on_accept, ls,
                                    LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, -1, fd)
               : NULL;
    if (!l) {
        if (resume)
            event_free(resume);
        free(ls);
        close(fd);
        return err_set(err, "libevent cannot listen on the HTTP socket");
    }
    evconnlistener_set_error_cb(l, on_accept_error);
    ls->w = w;
    ls->l = l;
    ls->resume = resume;
    ls->next = w->listeners;
    w->listeners = ls;
    return 0;
}

void httpwire_free(httpwire *w)
{
    if (!w)
        return;
    while (w->listeners) {
        listener *ls = w->listeners;
        w->listeners = ls->next;
        evconnlistener_free(ls->l);
        event_free(ls->resume);
        free(ls);
    }
    while (w->conns)
        conn_free(w->conns);
    free(w);
}

bool httpwire_sending(const httpwire *w)
{
    for (const httpwire_conn *c = w->conns; c; c = c->next)
        if (c->st == WS_HANDLER || c->st == WS_STREAM ||
            evbuffer_get_length(bufferevent_get_output(c->bev)) > 0)
            return true;
    return false;
}

const char *httpwire_method(const httpwire_conn *c)
{
    return c->method ? c->method : "";
}

const char *httpwire_target(const httpwire_conn *c)
{
    return c->target ? c->target : "";
}

const char *httpwire_header(const httpwire_conn *c, const char *name)
{
    for (size_t i = 0; i < c->n_hdr; i++)
        if (strcasecmp(c->hdr[i].name, name) == 0)
            return c->hdr[i].value;
    return NULL;
}

size_t httpwire_content_length(const httpwire_conn *c)
{
    return c->content_length;
}

const char *httpwire_body(const httpwire_conn *c, size_t *len)
{
    *len = c->body ? c->content_length : 0;
    return c->body ? c->body : "";
}

int httpwire_fd(const httpwire_conn *c)
{
    return c->fd;
}

void *httpwire_data(const httpwire_conn *c)
{
    return c->data;
}

size_t httpwire_unsent(const httpwire_conn *c)
{
    return evbuffer_get_length(bufferevent_get_output(c->bev));
}
