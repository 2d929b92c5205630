/*
 * session.h — what the event loop knows about one client connection, and the first
 * handling of its requests.
 *
 * The loop answers Bind, Tokenize, Detokenize and Shutdown itself (they need no
 * context and no inference), checks the preconditions of every request (Bind first;
 * admin calls only for admins) and hands the rest to the scheduler.
 */
#ifndef LLMS_SESSION_H
#define LLMS_SESSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "daemon/config.h"
#include "daemon/sched/sched.h"
#include "engine/tok/tokenizer.h"
#include "proto/llms.pb-c.h"

typedef struct session {
    uint64_t conn_id;
    uid_t uid;
    gid_t gid;
    pid_t pid;
    bool admin;                  /* root or a member of admin_group */
    bool bound;
    char app[SCHED_APP_MAX + 1];
} session;

typedef struct session_env {
    const config *cfg;
    const tokenizer *tok;
    sched *sch;
    /* Queues a whole frame (ownership passes) on the connection conn. */
    void (*send)(void *conn, uint8_t *frame, size_t len);
    /* Tells the connection conn that one of its requests went to the worker. */
    void (*submitted)(void *conn);
    /* How many app names other than name connections of uid are bound to (arg is
     * shutdown_arg). */
    int (*bound_names)(void *arg, uid_t uid, const char *name);
    /* Starts the daemon's shutdown (admin Shutdown). */
    void (*shutdown)(void *arg);
    void *shutdown_arg;
} session_env;

/* Whether the peer of the connected socket fd is an admin: uid 0, primary group
 * admin_gid, or admin_gid among its supplementary groups. The groups come from the
 * socket (SO_PEERGROUPS, fixed at connect) rather than from /proc/PID, whose PID a
 * peer that exits could hand to another process. */
bool session_peer_admin(int fd, uid_t uid, gid_t gid, bool have_admin_gid, gid_t admin_gid);

/* Whether name is a valid app name: 1..64 bytes of [A-Za-z0-9._-]. */
bool session_valid_app(const char *name);

/* Handles one decoded request of the connection conn (taking ownership of req). */
void session_handle(const session_env *env, session *ss, void *conn, Llms__Request *req);

#endif
