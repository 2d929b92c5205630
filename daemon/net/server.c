/*
 * server.c — libevent listener, bufferevent connections, frame reading, reply delivery.
 * Its connections count in the budget it is given (connbudget.h); the partial frames
 * they hold, in its own.
 */
#include "daemon/net/server.h"

#include <errno.h>
#include <limits.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/listener.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

#include "daemon/net/http.h"
#include "daemon/net/listen.h"
#include "daemon/notify.h"
#include "daemon/net/ratelog.h"
#include "daemon/net/reply.h"
#include "daemon/net/session.h"
#include "daemon/net/uidtab.h"
#include "engine/clock.h"
#include "proto/frame.h"

#define CONN_BUCKETS 256
#define GRACE_SECONDS 5 /* longest wait for replies to drain at shutdown */
#define DRAIN_POLL_MS 10 /* how often the gateway's unsent answers are looked at then */
/* Bytes of frames one read callback decodes before it lets other connections run. */
#define READ_SLICE_BYTES (256u << 10)
/* What one read takes from the socket when no frame is half there (libevent's own). */
#define READ_CHUNK_BYTES 16384
/* A large frame's deadline grows with its size: a MiB a second is far below what any
 * local client sends, however loaded the machine. */
#define FRAME_MS_PER_MIB 1000

typedef struct conn {
    server *srv;
    struct bufferevent *bev;
    struct event *timer;    /* the Bind deadline, then the idle timeout */
    session ss;
    bool closing;           /* an error was sent: close once it is written */
    bool throttled;         /* reading paused: too many unread replies */
    bool streams_cancelled; /* CANCEL_STREAMS sent during this throttling */
    size_t reserved;        /* bytes of max_buffered_bytes its partial frame holds */
    struct event *frame_timer; /* the deadline of a partial frame that reserves bytes */
    unsigned in_flight;     /* requests sent to the worker and not answered yet */
    int64_t last_active_ms;
    struct conn *hnext;     /* hash bucket chain */
} conn;

struct server {
    struct event_base *base;
    const config *cfg;
    sched *sch;
    outq *out;
    connbudget *budget;     /* shared with the HTTP gateway */
    session_env senv;
    struct evconnlistener *listener;
    bool owns_path;         /* we bound the socket file: remove it at exit */
    struct event *out_ev;
    struct event *grace_ev;
    struct event *drain_ev;     /* looks again whether the gateway's answers have left */
    bool shutting, worker_done;
    bool have_admin_gid;
    gid_t admin_gid;
    uint64_t next_id;
    unsigned n_conns;       /* native connections */
    size_t buffered;        /* bytes reserved by partial large frames */
    uidtab buffered_per_uid; /* the same per peer uid */
    struct event *accept_ev; /* resumes a listener paused for lack of descriptors */
    ratelog log_accept, log_refused;
    http *gw;               /* the HTTP gateway, when one is configured */
    conn *buckets[CONN_BUCKETS];
};

static conn **bucket(server *srv, uint64_t id)
{
    return &srv->buckets[id % CONN_BUCKETS];
}

static conn *conn_lookup(server *srv, uint64_t id)
{
    for (conn *c = *bucket(srv, id); c; c = c->hnext)
        if (c->ss.conn_id == id)
            return c;
    return NULL;
}

static void maybe_exit(server *srv)
{
    if (!srv->worker_done || srv->n_conns)
        return;
    /* The gateway's last answers (a stream's end, a reply the stop cut short) are written
     * to its connections in the same turn of the loop as the worker's end: leaving now
     * would drop them unsent. Its connections tell no one when their output has left,
     * so it is looked at again shortly, within the grace period. */
    if (srv->gw && http_sending(srv->gw)) {
        struct timeval tv = {0, DRAIN_POLL_MS * 1000};
        evtimer_add(srv->drain_ev, &tv);
        return;
    }
    event_base_loopexit(srv->base, NULL);
}

static void on_drain(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    maybe_exit(arg);
}

static void release_buffered(conn *c)
{
    if (!c->reserved)
        return;
    uidtab_sub(&c->srv->buffered_per_uid, c->ss.uid, c->reserved);
    c->srv->buffered -= c->reserved;
    c->reserved = 0;
    evtimer_del(c->frame_timer);
}

/* Frees a connection; tell_worker when its requests must be dropped. */
static void conn_free(conn *c, bool tell_worker)
{
    server *srv = c->srv;
    if (tell_worker && !srv->worker_done) {
        sched_job *j = sched_job_new(SCHED_CLOSED, c->ss.conn_id);
        if (j) {
            j->uid = c->ss.uid;
            if (c->ss.bound)
                snprintf(j->app, sizeof j->app, "%s", c->ss.app);
            sched_submit(srv->sch, j);
        }
    }
    conn **pp = bucket(srv, c->ss.conn_id);
    while (*pp != c)
        pp = &(*pp)->hnext;
    *pp = c->hnext;
    release_buffered(c);
    connbudget_remove(srv->budget, true, c->ss.uid);
    event_free(c->timer);
    event_free(c->frame_timer);
    bufferevent_free(c->bev);
    free(c);
    srv->n_conns--;
    sched_set_connections(srv->sch, srv->n_conns);
    maybe_exit(srv);
}

static void conn_send(void *arg, uint8_t *frame, size_t len)
{
    conn *c = arg;
    evbuffer_add(bufferevent_get_output(c->bev), frame, len);
    free(frame);
}

/* Counts a request handed to the worker: the connection is not idle until it ends. */
static void conn_submitted(void *arg)
{
    conn *c = arg;
    c->in_flight++;
}

/* Distinct app names, other than name, that connections of uid are bound to. */
static int server_bound_names(void *arg, uid_t uid, const char *name)
{
    server *srv = arg;
    unsigned n = connbudget_uid_count(srv->budget, uid);
    const char **names = n ? malloc(n * sizeof *names) : NULL;
    if (!names)
        return 0;
    unsigned k = 0;
    int distinct = 0;
    for (int b = 0; b < CONN_BUCKETS; b++)
        for (conn *c = srv->buckets[b]; c && k < n; c = c->hnext) {
            if (c->ss.uid != uid || !c->ss.bound || strcmp(c->ss.app, name) == 0)
                continue;
            bool dup = false;
            for (unsigned i = 0; i < k && !dup; i++)
                dup = strcmp(names[i], c->ss.app) == 0;
            names[k++] = c->ss.app;
            distinct += !dup;
        }
    free(names);
    return distinct;
}


/* Answers a framing error with id 0 and closes the connection once it is written. */
static void conn_fail(conn *c, Llms__ErrorCode code, const char *msg)
{
    uint8_t *buf;
    size_t len;
    if (reply_pack_error(0, code, c->srv->cfg->max_frame_bytes, &buf, &len, "%s", msg) == 0)
        conn_send(c, buf, len);
    c->closing = true;
    release_buffered(c);
    bufferevent_disable(c->bev, EV_READ);
    evbuffer_drain(bufferevent_get_input(c->bev), evbuffer_get_length(bufferevent_get_input(c->bev)));
}

/* Whether the connection is past the Bind deadline's reach: bound, or an admin's, whose
 * tools make their calls without binding. */
static bool conn_settled(const conn *c)
{
    return c->ss.bound || c->ss.admin;
}

/* Arms the connection's timer for the Bind deadline or, once settled, the idle timeout. */
static void conn_arm_timer(conn *c)
{
    const config *cfg = c->srv->cfg;
    int ms = conn_settled(c) ? cfg->idle_timeout_ms : cfg->bind_timeout_ms;
    if (ms <= 0) {
        evtimer_del(c->timer);
        return;
    }
    struct timeval tv = {ms / 1000, (suseconds_t)(ms % 1000) * 1000};
    evtimer_add(c->timer, &tv);
}

static void conn_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    conn *c = arg;
    const config *cfg = c->srv->cfg;
    char msg[128];
    if (c->closing)
        return;
    if (!conn_settled(c)) {
        snprintf(msg, sizeof msg, "no Bind within bind_timeout_ms (%d ms)", cfg->bind_timeout_ms);
        conn_fail(c, LLMS__ERROR_CODE__DEADLINE_EXCEEDED, msg);
        return;
    }
    int64_t idle = clock_mono_ns() / 1000000 - c->last_active_ms;
    if (c->in_flight > 0 || idle < cfg->idle_timeout_ms) {
        int64_t left = c->in_flight > 0 ? cfg->idle_timeout_ms : cfg->idle_timeout_ms - idle;
        struct timeval tv = {(time_t)(left / 1000), (suseconds_t)(left % 1000) * 1000};
        evtimer_add(c->timer, &tv);
        return;
    }
    snprintf(msg, sizeof msg, "idle for idle_timeout_ms (%d ms)", cfg->idle_timeout_ms);
    conn_fail(c, LLMS__ERROR_CODE__DEADLINE_EXCEEDED, msg);
}

/* How long a frame of need bytes may take to arrive whole after its header. */
static int frame_deadline_ms(const config *cfg, size_t need)
{
    int64_t ms = cfg->frame_body_timeout_ms + (int64_t)(need >> 20) * FRAME_MS_PER_MIB;
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

/* A partial large frame past its deadline: the connection holds memory it does not use. */
static void conn_frame_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    conn *c = arg;
    if (c->closing || !c->reserved)
        return;
    char msg[200];
    snprintf(msg, sizeof msg,
             "a frame of %zu bytes did not arrive whole within %d ms of its header "
             "(frame_body_timeout_ms plus %d ms a MiB)",
             c->reserved, frame_deadline_ms(c->srv->cfg, c->reserved), FRAME_MS_PER_MIB);
    conn_fail(c, LLMS__ERROR_CODE__DEADLINE_EXCEEDED, msg);
}

/*
 * Makes room in the input for a frame of need bytes (header included) and no more, so
 * that a connection holds at most one frame. A frame over SERVER_SMALL_FRAME first
 * takes its size from max_buffered_bytes and from its uid's max_buffered_bytes_per_uid,
 * and must then arrive within frame_deadline_ms; false, with msg saying which budget is
 * spent, when one is.
 */
static bool conn_expect(conn *c, size_t need, char *msg, size_t cap)
{
    server *srv = c->srv;
    const config *cfg = srv->cfg;
    if (need > SERVER_SMALL_FRAME && c->reserved < need) {
        size_t more = need - c->reserved;
        if (uidtab_get(&srv->buffered_per_uid, c->ss.uid) + more >
            (size_t)cfg->max_buffered_bytes_per_uid) {
            snprintf(msg, cap,
                     "uid %u already holds max_buffered_bytes_per_uid (%d) of partial frames; "
                     "send frames under %u bytes or one at a time",
                     (unsigned)c->ss.uid, cfg->max_buffered_bytes_per_uid, SERVER_SMALL_FRAME);
            return false;
        }
        if (srv->buffered + more > (size_t)cfg->max_buffered_bytes) {
            snprintf(msg, cap,
                     "the daemon already holds max_buffered_bytes (%d) of partial frames; "
                     "send frames under %u bytes or retry later",
                     cfg->max_buffered_bytes, SERVER_SMALL_FRAME);
            return false;
        }
        if (uidtab_add(&srv->buffered_per_uid, c->ss.uid, more)) {
            snprintf(msg, cap, "out of memory");
            return false;
        }
        if (!c->reserved) {
            int ms = frame_deadline_ms(cfg, need);
            struct timeval tv = {ms / 1000, (suseconds_t)(ms % 1000) * 1000};
            evtimer_add(c->frame_timer, &tv);
        }
        srv->buffered += more;
        c->reserved = need;
    }
    bufferevent_setwatermark(c->bev, EV_READ, 0, need > READ_CHUNK_BYTES ? need : READ_CHUNK_BYTES);
    return true;
}

static void conn_read(struct bufferevent *bev, void *arg)
{
    conn *c = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    const config *cfg = c->srv->cfg;
    size_t decoded = 0;
    while (!c->closing && !c->throttled) {
        size_t avail = evbuffer_get_length(in);
        char msg[200];
        if (avail < FRAME_HEADER_BYTES) {
            conn_expect(c, FRAME_HEADER_BYTES, msg, sizeof msg);
            return;
        }
        if (decoded >= READ_SLICE_BYTES) {
            /* The rest waits for the next loop iteration, after the other connections. */
            bufferevent_trigger(bev, EV_READ, BEV_TRIG_IGNORE_WATERMARKS | BEV_TRIG_DEFER_CALLBACKS);
            return;
        }
        uint32_t body;
        uint32_t max = c->ss.bound || (uint32_t)cfg->max_unbound_frame_bytes > cfg->max_frame_bytes
                           ? cfg->max_frame_bytes
                           : (uint32_t)cfg->max_unbound_frame_bytes;
        enum frame_status st = frame_peek(evbuffer_pullup(in, FRAME_HEADER_BYTES),
                                          FRAME_HEADER_BYTES, max, &body);
        if (st == FRAME_TOO_LARGE) {
            if (c->ss.bound)
                snprintf(msg, sizeof msg, "frame of %u bytes exceeds max_frame_bytes (%u)", body, max);
            else
                snprintf(msg, sizeof msg,
                         "frame of %u bytes before Bind exceeds max_unbound_frame_bytes (%u)",
                         body, max);
            conn_fail(c, LLMS__ERROR_CODE__INVALID_ARGUMENT, msg);
            return;
        }
        if (st == FRAME_EMPTY) {
            conn_fail(c, LLMS__ERROR_CODE__MALFORMED_FRAME, "empty frame");
            return;
        }
        size_t need = FRAME_HEADER_BYTES + (size_t)body;
        if (avail < need) {
            if (!conn_expect(c, need, msg, sizeof msg))
                conn_fail(c, LLMS__ERROR_CODE__RESOURCE_EXHAUSTED, msg);
            return;
        }
        c->last_active_ms = clock_mono_ns() / 1000000;
        uint8_t *p = evbuffer_pullup(in, (ssize_t)need);
        size_t fields = frame_count_fields(&llms__request__descriptor, p + FRAME_HEADER_BYTES, body,
                                           FRAME_MAX_FIELDS);
        if (fields > FRAME_MAX_FIELDS) {
            snprintf(msg, sizeof msg, "frame of %u bytes has more than %u fields", body,
                     FRAME_MAX_FIELDS);
            conn_fail(c, LLMS__ERROR_CODE__INVALID_ARGUMENT, msg);
            return;
        }
        Llms__Request *req = frame_unpack_request(p + FRAME_HEADER_BYTES, body);
        evbuffer_drain(in, need);
        release_buffered(c);
        decoded += need;
        if (!req) {
            snprintf(msg, sizeof msg, "frame of %u bytes is not a Request", body);
            conn_fail(c, LLMS__ERROR_CODE__MALFORMED_FRAME, msg);
            return;
        }
        bool was_bound = c->ss.bound;
        session_handle(&c->srv->senv, &c->ss, c, req);
        if (c->ss.bound && !was_bound)
            conn_arm_timer(c);
        if (evbuffer_get_length(bufferevent_get_output(bev)) > CONNBUDGET_OUT_CAP) {
            c->throttled = true;
            bufferevent_disable(bev, EV_READ);
        }
    }
}

static void conn_write(struct bufferevent *bev, void *arg)
{
    conn *c = arg;
    if (evbuffer_get_length(bufferevent_get_output(bev)) > 0)
        return;
    if (c->closing) {
        conn_free(c, true);
        return;
    }
    if (c->throttled) {
        c->throttled = false;
        c->streams_cancelled = false;
        bufferevent_enable(bev, EV_READ);
        conn_read(bev, c);
    }
}

static void conn_event(struct bufferevent *bev, short what, void *arg)
{
    conn *c = arg;
    if ((what & BEV_EVENT_ERROR) ||
        ((what & BEV_EVENT_EOF) && evbuffer_get_length(bufferevent_get_output(bev)) == 0)) {
        conn_free(c, true);
    } else if (what & BEV_EVENT_EOF) {
        /* The client stopped sending: deliver what is already answered, then close
         * (requests still in flight are cancelled then). */
        c->closing = true;
        bufferevent_disable(bev, EV_READ);
    }
}

/* Refuses a connection with an error frame; the socket's buffer is empty, so the short
 * frame goes out at once or not at all. */
static void refuse_fd(server *srv, evutil_socket_t fd, const char *msg)
{
    uint8_t *buf;
    size_t len;
    if (reply_pack_error(0, LLMS__ERROR_CODE__RESOURCE_EXHAUSTED, srv->cfg->max_frame_bytes,
                         &buf, &len, "%s", msg) == 0) {
        if (send(fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
            ratelog_warn(&srv->log_refused, "refused connection: could not send why: %s",
                         strerror(errno));
        free(buf);
    }
    close(fd);
    ratelog_warn(&srv->log_refused, "refused a connection: %s", msg);
}

static void on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa,
                      int socklen, void *arg)
{
    (void)l;
    (void)sa;
    (void)socklen;
    server *srv = arg;
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (srv->shutting || getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
        close(fd);
        return;
    }
    char msg[160];
    if (connbudget_add(srv->budget, true, cred.uid, msg, sizeof msg) != CONNBUDGET_OK) {
        refuse_fd(srv, fd, msg);
        return;
    }
    conn *c = calloc(1, sizeof *c);
    struct bufferevent *bev = c ? bufferevent_socket_new(srv->base, fd, BEV_OPT_CLOSE_ON_FREE) : NULL;
    struct event *timer = bev ? evtimer_new(srv->base, conn_timer, c) : NULL;
    struct event *frame_timer = timer ? evtimer_new(srv->base, conn_frame_timeout, c) : NULL;
    if (!frame_timer) {
        connbudget_remove(srv->budget, true, cred.uid);
        if (timer)
            event_free(timer);
        if (bev)
            bufferevent_free(bev);
        else
            close(fd);
        free(c);
        ratelog_warn(&srv->log_refused, "refused a connection: out of memory");
        return;
    }
    c->srv = srv;
    c->bev = bev;
    c->timer = timer;
    c->frame_timer = frame_timer;
    c->last_active_ms = clock_mono_ns() / 1000000;
    c->ss.conn_id = ++srv->next_id;
    c->ss.uid = cred.uid;
    c->ss.gid = cred.gid;
    c->ss.pid = cred.pid;
    c->ss.admin = session_peer_admin(fd, cred.uid, cred.gid, srv->have_admin_gid, srv->admin_gid);
    conn **b = bucket(srv, c->ss.conn_id);
    c->hnext = *b;
    *b = c;
    srv->n_conns++;
    sched_set_connections(srv->sch, srv->n_conns);
    bufferevent_setcb(bev, conn_read, conn_write, conn_event, c);
    bufferevent_setwatermark(bev, EV_READ, 0, READ_CHUNK_BYTES);
    bufferevent_enable(bev, EV_READ | EV_WRITE);
    conn_arm_timer(c);
}

/* accept() failed for want of descriptors or memory: the listener rests (listen_rest). */
static void on_accept_error(struct evconnlistener *l, void *arg)
{
    server *srv = arg;
    listen_rest(l, srv->accept_ev, LISTEN_ACCEPT_RETRY_MS, &srv->log_accept, "accept",
                srv->n_conns);
}

static void on_accept_resume(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    server *srv = arg;
    if (srv->listener && !srv->shutting)
        evconnlistener_enable(srv->listener);
}

/* Delivers the worker's replies. */
static void on_replies(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    server *srv = arg;
    outq_item *it = outq_pop_all(srv->out);
    while (it) {
        outq_item *next = it->next;
        if (!it->data) {
            srv->worker_done = true;
            struct timeval tv = {GRACE_SECONDS, 0};
            evtimer_add(srv->grace_ev, &tv);
            if (srv->gw)
                http_worker_done(srv->gw);
        } else if (it->conn_id & HTTP_CONN_BIT) {
            if (srv->gw)
                http_deliver(srv->gw, it->conn_id, it->data, it->len, it->droppable);
        } else {
            conn *c = conn_lookup(srv, it->conn_id);
            if (c && !c->closing) {
                struct evbuffer *out = bufferevent_get_output(c->bev);
                if (it->droppable && evbuffer_get_length(out) > CONNBUDGET_OUT_CAP) {
                    if (!c->streams_cancelled) {
                        sched_job *j = sched_job_new(SCHED_CANCEL_STREAMS, c->ss.conn_id);
                        if (j)
                            sched_submit(srv->sch, j);
                        c->streams_cancelled = true;
                        c->throttled = true;
                        bufferevent_disable(c->bev, EV_READ);
                    }
                } else {
                    evbuffer_add(out, it->data, it->len);
                }
                /* A request ends with its final frame, not with a graph event or a
                 * QA bank's chunk before it (outq.h). */
                if (it->final && c->in_flight > 0)
                    c->in_flight--;
                c->last_active_ms = clock_mono_ns() / 1000000;
            }
        }
        outq_item_free(it);
        it = next;
    }
    if (srv->worker_done) {
        /* Everything is answered: close connections once their replies are out. */
        for (int b = 0; b < CONN_BUCKETS; b++) {
            conn *c = srv->buckets[b];
            while (c) {
                conn *n = c->hnext;
                c->closing = true;
                bufferevent_disable(c->bev, EV_READ);
                if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
                    conn_free(c, false);
                c = n;
            }
        }
        maybe_exit(srv);
    }
}

static void on_grace(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    server *srv = arg;
    event_base_loopexit(srv->base, NULL);
}

static void begin_shutdown(void *arg)
{
    server_shutdown(arg);
}

server *server_new(struct event_base *base, const config *cfg, const tokenizer *tok,
                   sched *sch, outq *out, connbudget *budget, char err[ERR_MAX])
{
    server *srv = calloc(1, sizeof *srv);
    if (!srv) {
        err_set(err, "out of memory");
        return NULL;
    }
    srv->base = base;
    srv->cfg = cfg;
    srv->sch = sch;
    srv->out = out;
    srv->budget = budget;
    srv->senv = (session_env){cfg, tok, sch, conn_send, conn_submitted, server_bound_names,
                              begin_shutdown, srv};
    struct group *gr = getgrnam(cfg->admin_group);
    if (gr) {
        srv->have_admin_gid = true;
        srv->admin_gid = gr->gr_gid;
    }
    srv->out_ev = event_new(base, outq_fd(out), EV_READ | EV_PERSIST, on_replies, srv);
    srv->grace_ev = evtimer_new(base, on_grace, srv);
    srv->drain_ev = evtimer_new(base, on_drain, srv);
    srv->accept_ev = evtimer_new(base, on_accept_resume, srv);
    if (!srv->out_ev || !srv->grace_ev || !srv->drain_ev || !srv->accept_ev ||
        event_add(srv->out_ev, NULL)) {
        err_set(err, "libevent setup failed");
        server_free(srv);
        return NULL;
    }
    return srv;
}

int server_listen(server *srv, char err[ERR_MAX])
{
    int fd;
    int n = sd_listen_fds(1);
    if (n > 1)
        return err_set(err, "systemd passed %d sockets, expected one", n);
    if (n == 1) {
        fd = SD_LISTEN_FDS_START;
        if (sd_is_socket_unix(fd, SOCK_STREAM, 1, NULL, 0) <= 0)
            return err_set(err, "the socket systemd passed is not a listening Unix stream "
                                "socket");
        evutil_make_socket_nonblocking(fd);
    } else {
        fd = listen_unix(srv->cfg->socket, srv->cfg->socket_mode, err);
        if (fd < 0)
            return -1;
        srv->owns_path = true;
    }
    srv->listener = evconnlistener_new(srv->base, on_accept, srv,
                                       LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, -1, fd);
    if (!srv->listener) {
        close(fd);
        return err_set(err, "libevent setup failed");
    }
    evconnlistener_set_error_cb(srv->listener, on_accept_error);
    return 0;
}

void server_shutdown(server *srv)
{
    if (srv->shutting)
        return;
    srv->shutting = true;
    connbudget_shutdown(srv->budget);
    notify_stopping();
    if (srv->listener) {
        evconnlistener_free(srv->listener);
        srv->listener = NULL;
    }
    if (srv->gw)
        http_shutdown(srv->gw);
    sched_job *j = sched_job_new(SCHED_SHUTDOWN, 0);
    if (j)
        sched_submit(srv->sch, j);
    struct timeval tv = {GRACE_SECONDS * 60, 0};
    /* The grace period starts once the worker is done; until then it only guards
     * against a worker that never answers. */
    evtimer_add(srv->grace_ev, &tv);
}

void server_set_http(server *srv, http *gw)
{
    srv->gw = gw;
}

const session_env *server_session_env(const server *srv)
{
    return &srv->senv;
}

unsigned server_n_connections(const server *srv)
{
    return srv->n_conns;
}

void server_free(server *srv)
{
    if (!srv)
        return;
    for (int b = 0; b < CONN_BUCKETS; b++) {
        conn *c = srv->buckets[b];
        while (c) {
            conn *n = c->hnext;
            event_free(c->timer);
            bufferevent_free(c->bev);
            free(c);
            c = n;
        }
    }
    if (srv->listener)
        evconnlistener_free(srv->listener);
    if (srv->accept_ev)
        event_free(srv->accept_ev);
    uidtab_free(&srv->buffered_per_uid);
    if (srv->owns_path)
        unlink(srv->cfg->socket);
    if (srv->out_ev)
        event_free(srv->out_ev);
    if (srv->grace_ev)
        event_free(srv->grace_ev);
    if (srv->drain_ev)
        event_free(srv->drain_ev);
    free(srv);
}
