/*
 * server.c — libevent listener, bufferevent connections, frame reading, reply delivery.
 */
#include "daemon/server.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/listener.h>
#include <fcntl.h>
#include <grp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "daemon/notify.h"
#include "daemon/resp.h"
#include "daemon/session.h"
#include "proto/frame.h"

#define CONN_BUCKETS 256
#define GRACE_SECONDS 5 /* longest wait for replies to drain at shutdown */

typedef struct conn {
    server *srv;
    struct bufferevent *bev;
    session ss;
    bool closing;           /* an error was sent: close once it is written */
    bool throttled;         /* reading paused: too many unread replies */
    bool streams_cancelled; /* CANCEL_STREAMS sent during this throttling */
    struct conn *hnext;     /* hash bucket chain */
} conn;

struct server {
    struct event_base *base;
    const config *cfg;
    sched *sch;
    outq *out;
    session_env senv;
    struct evconnlistener *listener;
    bool owns_path;         /* we bound the socket file: remove it at exit */
    struct event *out_ev;
    struct event *grace_ev;
    bool shutting, worker_done;
    bool have_admin_gid;
    gid_t admin_gid;
    uint64_t next_id;
    unsigned n_conns;
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
    if (srv->worker_done && srv->n_conns == 0)
        event_base_loopexit(srv->base, NULL);
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

/* Answers a framing error with id 0 and closes the connection once it is written. */
static void conn_fail(conn *c, Llms__ErrorCode code, const char *msg)
{
    uint8_t *buf;
    size_t len;
    if (resp_error(0, code, c->srv->cfg->max_frame_bytes, &buf, &len, "%s", msg) == 0)
        conn_send(c, buf, len);
    c->closing = true;
    bufferevent_disable(c->bev, EV_READ);
    evbuffer_drain(bufferevent_get_input(c->bev), evbuffer_get_length(bufferevent_get_input(c->bev)));
}

static void conn_read(struct bufferevent *bev, void *arg)
{
    conn *c = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    uint32_t max = c->srv->cfg->max_frame_bytes;
    while (!c->closing && !c->throttled) {
        size_t avail = evbuffer_get_length(in);
        if (avail < FRAME_HEADER_BYTES)
            return;
        uint32_t body;
        char msg[128];
        enum frame_status st = frame_peek(evbuffer_pullup(in, FRAME_HEADER_BYTES),
                                          FRAME_HEADER_BYTES, max, &body);
        if (st == FRAME_TOO_LARGE) {
            snprintf(msg, sizeof msg, "frame of %u bytes exceeds max_frame_bytes (%u)", body, max);
            conn_fail(c, LLMS__ERROR_CODE__RESOURCE_EXHAUSTED, msg);
            return;
        }
        if (st == FRAME_EMPTY) {
            conn_fail(c, LLMS__ERROR_CODE__MALFORMED_FRAME, "empty frame");
            return;
        }
        if (avail < FRAME_HEADER_BYTES + (size_t)body)
            return;
        uint8_t *p = evbuffer_pullup(in, (ssize_t)(FRAME_HEADER_BYTES + body));
        Llms__Request *req = frame_unpack_request(p + FRAME_HEADER_BYTES, body);
        evbuffer_drain(in, FRAME_HEADER_BYTES + body);
        if (!req) {
            snprintf(msg, sizeof msg, "frame of %u bytes is not a Request", body);
            conn_fail(c, LLMS__ERROR_CODE__MALFORMED_FRAME, msg);
            return;
        }
        session_handle(&c->srv->senv, &c->ss, c, req);
        if (evbuffer_get_length(bufferevent_get_output(bev)) > SERVER_OUT_CAP) {
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
    conn *c = calloc(1, sizeof *c);
    struct bufferevent *bev = c ? bufferevent_socket_new(srv->base, fd, BEV_OPT_CLOSE_ON_FREE) : NULL;
    if (!bev) {
        free(c);
        close(fd);
        return;
    }
    c->srv = srv;
    c->bev = bev;
    c->ss.conn_id = ++srv->next_id;
    c->ss.uid = cred.uid;
    c->ss.gid = cred.gid;
    c->ss.pid = cred.pid;
    c->ss.admin = session_peer_admin(cred.uid, cred.gid, cred.pid, srv->have_admin_gid,
                                     srv->admin_gid);
    conn **b = bucket(srv, c->ss.conn_id);
    c->hnext = *b;
    *b = c;
    srv->n_conns++;
    sched_set_connections(srv->sch, srv->n_conns);
    bufferevent_setcb(bev, conn_read, conn_write, conn_event, c);
    bufferevent_enable(bev, EV_READ | EV_WRITE);
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
        } else {
            conn *c = conn_lookup(srv, it->conn_id);
            if (c && !c->closing) {
                struct evbuffer *out = bufferevent_get_output(c->bev);
                if (it->droppable && evbuffer_get_length(out) > SERVER_OUT_CAP) {
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

static int make_dirs(const char *path, char err[ERR_MAX])
{
    char dir[CONFIG_SOCKET_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir)
        return 0;
    *slash = '\0';
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            return err_set(err, "socket directory %s: %s", dir, strerror(errno));
        *p = '/';
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return err_set(err, "socket directory %s: %s", dir, strerror(errno));
    return 0;
}

/* A listening Unix socket at cfg->socket. */
static int open_socket(const config *cfg, char err[ERR_MAX])
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(cfg->socket) >= sizeof addr.sun_path)
        return err_set(err, "socket: path longer than %zu bytes", sizeof addr.sun_path - 1);
    strcpy(addr.sun_path, cfg->socket);
    if (make_dirs(cfg->socket, err))
        return -1;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return err_set(err, "socket: %s", strerror(errno));
    struct stat st;
    if (lstat(cfg->socket, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            close(fd);
            return err_set(err, "socket: %s exists and is not a socket", cfg->socket);
        }
        /* A socket file nobody answers on is stale; one that answers is another llmsd. */
        int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        bool live = probe >= 0 && connect(probe, (struct sockaddr *)&addr, sizeof addr) == 0;
        if (probe >= 0)
            close(probe);
        if (live) {
            close(fd);
            return err_set(err, "socket: %s is in use by a running daemon", cfg->socket);
        }
        unlink(cfg->socket);
    }
    if (bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0 ||
        chmod(cfg->socket, cfg->socket_mode) != 0 || listen(fd, 128) != 0) {
        err_set(err, "socket %s: %s", cfg->socket, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

server *server_new(struct event_base *base, const config *cfg, const tokenizer *tok,
                   sched *sch, outq *out, char err[ERR_MAX])
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
    srv->senv = (session_env){cfg, tok, sch, conn_send, begin_shutdown, srv};
    struct group *gr = getgrnam(cfg->admin_group);
    if (gr) {
        srv->have_admin_gid = true;
        srv->admin_gid = gr->gr_gid;
    }
    int fd;
    int n = sd_listen_fds(1);
    if (n > 1) {
        err_set(err, "systemd passed %d sockets, expected one", n);
        goto fail;
    }
    if (n == 1) {
        fd = SD_LISTEN_FDS_START;
        if (sd_is_socket_unix(fd, SOCK_STREAM, 1, NULL, 0) <= 0) {
            err_set(err, "the socket systemd passed is not a listening Unix stream socket");
            goto fail;
        }
        evutil_make_socket_nonblocking(fd);
    } else {
        fd = open_socket(cfg, err);
        if (fd < 0)
            goto fail;
        srv->owns_path = true;
    }
    srv->listener = evconnlistener_new(base, on_accept, srv,
                                       LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, -1, fd);
    srv->out_ev = event_new(base, outq_fd(out), EV_READ | EV_PERSIST, on_replies, srv);
    srv->grace_ev = evtimer_new(base, on_grace, srv);
    if (!srv->listener || !srv->out_ev || !srv->grace_ev || event_add(srv->out_ev, NULL)) {
        if (!srv->listener)
            close(fd);
        err_set(err, "libevent setup failed");
        goto fail;
    }
    return srv;
fail:
    server_free(srv);
    return NULL;
}

void server_shutdown(server *srv)
{
    if (srv->shutting)
        return;
    srv->shutting = true;
    notify_stopping();
    if (srv->listener) {
        evconnlistener_free(srv->listener);
        srv->listener = NULL;
    }
    sched_job *j = sched_job_new(SCHED_SHUTDOWN, 0);
    if (j)
        sched_submit(srv->sch, j);
    struct timeval tv = {GRACE_SECONDS * 60, 0};
    /* The grace period starts once the worker is done; until then it only guards
     * against a worker that never answers. */
    evtimer_add(srv->grace_ev, &tv);
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
            bufferevent_free(c->bev);
            free(c);
            c = n;
        }
    }
    if (srv->listener)
        evconnlistener_free(srv->listener);
    if (srv->owns_path)
        unlink(srv->cfg->socket);
    if (srv->out_ev)
        event_free(srv->out_ev);
    if (srv->grace_ev)
        event_free(srv->grace_ev);
    free(srv);
}
