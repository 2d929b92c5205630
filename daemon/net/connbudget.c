/*
 * connbudget.c — the connection counts both listeners share (connbudget.h): in all, per
 * peer uid, and the admission check with its refusals.
 */
#include "daemon/net/connbudget.h"
#include "daemon/net/uidtab.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>

/* Descriptors kept for everything but connections: the store's files, the model, the
 * listeners, the eventfd, the journal. */
#define FD_RESERVE 64

struct connbudget {
    unsigned n;             /* connections counted, of both listeners */
    unsigned max;           /* max_connections within the open-file limit */
    unsigned max_per_uid;   /* max_connections_per_uid */
    bool shutting;
    uidtab per_uid;         /* connections per peer uid */
};

/* Whether uid may hold one more connection; msg when not. */
static bool uid_fits(const connbudget *cb, uid_t uid, char *msg, size_t cap)
{
    size_t n = uidtab_get(&cb->per_uid, uid);
    if (n >= cb->max_per_uid) {
        snprintf(msg, cap, "uid %u has %u connections, the limit (max_connections_per_uid)",
                 (unsigned)uid, (unsigned)n);
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
    if (with_uid && !uid_fits(cb, uid, msg, cap))
        return CONNBUDGET_UID_FULL;
    if (with_uid && uidtab_add(&cb->per_uid, uid, 1)) {
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
    if (!uid_fits(cb, to, msg, cap))
        return CONNBUDGET_UID_FULL;
    if (uidtab_add(&cb->per_uid, to, 1)) {
        snprintf(msg, cap, "out of memory");
        return CONNBUDGET_FULL;
    }
    if (had_uid)
        uidtab_sub(&cb->per_uid, from, 1);
    return CONNBUDGET_OK;
}

void connbudget_remove(connbudget *cb, bool with_uid, uid_t uid)
{
    if (with_uid)
        uidtab_sub(&cb->per_uid, uid, 1);
    cb->n--;
}

unsigned connbudget_uid_count(const connbudget *cb, uid_t uid)
{
    return (unsigned)uidtab_get(&cb->per_uid, uid);
}

void connbudget_shutdown(connbudget *cb)
{
    cb->shutting = true;
}

void connbudget_free(connbudget *cb)
{
    if (!cb)
        return;
    uidtab_free(&cb->per_uid);
    free(cb);
}
