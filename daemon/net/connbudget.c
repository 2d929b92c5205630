/*
 * connbudget.c — the connection counts both listeners share (connbudget.h): in all, per
 * peer uid, and the admission check with its refusals.
 */
#include "daemon/net/connbudget.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>

/* Descriptors kept for everything but connections: the store's files, the model, the
 * listeners, the eventfd, the journal. */
#define FD_RESERVE 64

typedef struct uid_conns {
    uid_t uid;
    unsigned n;
} uid_conns;

struct connbudget {
    unsigned n;             /* connections counted, of both listeners */
    unsigned max;           /* max_connections within the open-file limit */
    unsigned max_per_uid;   /* max_connections_per_uid */
    bool shutting;
    uid_conns *uids;        /* connections per peer uid (uids with any) */
    size_t n_uids, cap_uids;
};

static uid_conns *uid_find(const connbudget *cb, uid_t uid)
{
    for (size_t i = 0; i < cb->n_uids; i++)
        if (cb->uids[i].uid == uid)
            return &cb->uids[i];
    return NULL;
}

/* Counts a connection of uid; -1 when memory runs out. */
static int uid_add(connbudget *cb, uid_t uid)
{
    uid_conns *u = uid_find(cb, uid);
    if (u) {
        u->n++;
        return 0;
    }
    if (cb->n_uids == cb->cap_uids) {
        size_t cap = cb->cap_uids ? cb->cap_uids * 2 : 16;
        uid_conns *p = realloc(cb->uids, cap * sizeof *p);
        if (!p)
            return -1;
        cb->uids = p;
        cb->cap_uids = cap;
    }
    cb->uids[cb->n_uids++] = (uid_conns){uid, 1};
    return 0;
}

static void uid_remove(connbudget *cb, uid_t uid)
{
    uid_conns *u = uid_find(cb, uid);
    if (u && --u->n == 0)
        *u = cb->uids[--cb->n_uids];
}

/* Whether uid (counted as u) may hold one more connection; msg when not. */
static bool uid_fits(const connbudget *cb, uid_t uid, const uid_conns *u, char *msg,
                     size_t cap)
{
    if (u && u->n >= cb->max_per_uid) {
        snprintf(msg, cap, "uid %u has %u connections, the limit (max_connections_per_uid)",
                 (unsigned)uid, u->n);
        return false;
    }
    return true;
}

connbudget *connbudget_new(const config *cfg, char err[ERR_MAX])
{
    connbudget *cb = calloc(1, sizeof *cb);
    if (!cb) {
        err_set(err, "out of memory");
        return NULL;
    }
    cb->max = (unsigned)cfg->max_connections;
    cb->max_per_uid = (unsigned)cfg->max_connections_per_uid;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        rlim_t fit = rl.rlim_cur > 2 * FD_RESERVE ? rl.rlim_cur - FD_RESERVE : rl.rlim_cur / 2;
        if (cb->max > fit) {
            fprintf(stderr, "llmsd: warn: max_connections %u lowered to %u: the open-file limit "
                            "is %llu\n", cb->max, (unsigned)fit,
                    (unsigned long long)rl.rlim_cur);
            cb->max = (unsigned)fit;
        }
    }
    return cb;
}

enum connbudget_admit connbudget_add(connbudget *cb, bool with_uid, uid_t uid, char *msg,
                                     size_t cap)
{
    if (cb->shutting) {
        snprintf(msg, cap, "the daemon is shutting down");
        return CONNBUDGET_FULL;
    }
    if (cb->n >= cb->max) {
        snprintf(msg, cap, "the daemon has %u connections, the limit (max_connections)", cb->n);
        return CONNBUDGET_FULL;
    }
    if (with_uid && !uid_fits(cb, uid, uid_find(cb, uid), msg, cap))
        return CONNBUDGET_UID_FULL;
    if (with_uid && uid_add(cb, uid)) {
        snprintf(msg, cap, "out of memory");
        return CONNBUDGET_FULL;
    }
    cb->n++;
    return CONNBUDGET_OK;
}

enum connbudget_admit connbudget_set_uid(connbudget *cb, bool had_uid, uid_t from, uid_t to,
                                         char *msg, size_t cap)
{
    if (had_uid && from == to)
        return CONNBUDGET_OK;
    if (!uid_fits(cb, to, uid_find(cb, to), msg, cap))
        return CONNBUDGET_UID_FULL;
    if (uid_add(cb, to)) {
        snprintf(msg, cap, "out of memory");
        return CONNBUDGET_FULL;
    }
    if (had_uid)
        uid_remove(cb, from);
    return CONNBUDGET_OK;
}

void connbudget_remove(connbudget *cb, bool with_uid, uid_t uid)
{
    if (with_uid)
        uid_remove(cb, uid);
    cb->n--;
}

unsigned connbudget_uid_count(const connbudget *cb, uid_t uid)
{
    const uid_conns *u = uid_find(cb, uid);
    return u ? u->n : 0;
}

void connbudget_shutdown(connbudget *cb)
{
    cb->shutting = true;
}

void connbudget_free(connbudget *cb)
{
    if (!cb)
        return;
    free(cb->uids);
    free(cb);
}
