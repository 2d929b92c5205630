/* libFuzzer target for the HTTP connection layer (daemon/net/httpwire.c), which parses what
 * any client of the gateway's TCP port sends before it is known who the client is. The
 * first input byte picks how many bytes each send() delivers (1 to 64, or all at once);
 * the rest is what the client sends, then it shuts its side. The connection is served
 * on one end of a socketpair as if accepted. The hooks answer each request by what its
 * target holds: "stream" streams three chunks, "skip" answers without reading the body,
 * a body over 1 MiB is refused (413) unread, anything else reads the body and echoes it.
 * Every request the hooks see must have a method, a target and a body of its
 * Content-Length; the connection must end once the client has gone, and nothing may crash
 * or leak. httpwire's internals are static, so this file includes httpwire.c itself. */
#include "daemon/net/httpwire.c" /* IWYU pragma: keep */

#include <fcntl.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The largest body the hooks take (the gateway's http_max_body_bytes). */
#define FUZZ_MAX_BODY (1u << 20)

/* Event-loop turns a connection may take after its client has gone. */
#define FUZZ_MAX_TURNS 100000

typedef struct fuzz_state {
    bool open;     /* the server side's connection exists */
    int requests;  /* requests the hooks answered */
} fuzz_state;

static int hook_open(void *arg, int fd, void **data, char *msg, size_t cap)
{
    (void)fd;
    (void)msg;
    (void)cap;
    ((fuzz_state *)arg)->open = true;
    *data = NULL;
    return 0;
}

static bool hook_head(void *arg, httpwire_conn *c)
{
    const char *method = httpwire_method(c), *target = httpwire_target(c);
    if (!method || !target || !*method || !*target)
        abort();
    (void)httpwire_header(c, "Host");
    fuzz_state *st = arg;
    if (strstr(target, "stream")) {
        st->requests++;
        httpwire_add_header(c, "Content-Type", "text/event-stream");
        httpwire_stream_start(c, 200);
        struct evbuffer *b = evbuffer_new();
        if (!b)
            abort();
        for (int i = 0; i < 3; i++) {
            evbuffer_add_printf(b, "data: %d\n\n", i);
            httpwire_stream_chunk(c, b);
        }
        evbuffer_free(b);
        httpwire_stream_end(c);
        return false;
    }
    if (strstr(target, "skip")) {
        st->requests++;
        httpwire_reply(c, 404, "{}", 2);
        return false;
    }
    /* as the gateway's head hook refuses a body over http_max_body_bytes before httpwire
     * allocates it */
    if (httpwire_content_length(c) > FUZZ_MAX_BODY) {
        st->requests++;
        httpwire_reply(c, 413, "{}", 2);
        return false;
    }
    return true;
}

static void hook_body(void *arg, httpwire_conn *c)
{
    size_t len = 0;
    const char *body = httpwire_body(c, &len);
    if (len != httpwire_content_length(c) || (len && !body) || (body && body[len] != '\0'))
        abort();
    ((fuzz_state *)arg)->requests++;
    httpwire_reply(c, 200, body, len);
}

static void hook_close(void *arg, void *data)
{
    (void)data;
    ((fuzz_state *)arg)->open = false;
}

/* Reads and drops what the server has answered so far. */
static void drain(int fd)
{
    char buf[4096];
    while (read(fd, buf, sizeof buf) > 0)
        ;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t step = data[0] % 65;
    const uint8_t *in = data + 1;
    size_t n = size - 1;
    if (step == 0)
        step = n ? n : 1;

    struct event_base *base = event_base_new();
    int sv[2];
    if (!base || socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) != 0)
        abort();
    httpwire_config cfg = {.max_head_bytes = 1024,
                           .header_timeout_ms = 60000,
                           .body_timeout_ms = 60000,
                           .body_ms_per_mib = 0,
                           .idle_timeout_ms = 60000,
                           .accept_retry_ms = 100};
    httpwire_hooks hooks = {hook_open, hook_head, hook_body, hook_close};
    fuzz_state st = {0};
    httpwire *w = httpwire_new(base, &cfg, &hooks, &st);
    if (!w)
        abort();
    listener ls = {.w = w};
    on_accept(NULL, sv[0], NULL, 0, &ls);
    if (!st.open)
        abort();

    size_t sent = 0;
    bool shut = false;
    for (int turns_since_shut = 0; st.open;) {
        if (sent < n) {
            size_t k = n - sent < step ? n - sent : step;
            ssize_t got = send(sv[1], in + sent, k, MSG_NOSIGNAL);
            if (got > 0)
                sent += (size_t)got;
            else if (errno == EPIPE || errno == ECONNRESET)
                sent = n; /* the server has closed: the rest is not taken */
        } else if (!shut) {
            shutdown(sv[1], SHUT_WR);
            shut = true;
        }
        drain(sv[1]);
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
        if (shut && ++turns_since_shut > FUZZ_MAX_TURNS)
            abort(); /* the client has gone but its connection stays */
    }
    httpwire_free(w);
    close(sv[1]);
    event_base_free(base);
    return 0;
}
