/*
 * connbudget.h — the daemon's one budget of connections: max_connections in all (within
 * the open-file limit) and max_connections_per_uid for each peer uid, and the replies one
 * connection may leave unread. The native listener (server.c) and the HTTP gateway
 * (http.c) both count their connections here, so that neither kind of socket lets one
 * uid hold what the other refuses. main.c makes it and hands it to both.
 */
#ifndef LLMS_CONNBUDGET_H
#define LLMS_CONNBUDGET_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "daemon/config.h"
#include "engine/err.h"

/* Bytes of replies a connection of either listener may leave unread before its streamed
 * calls are cancelled, so that a client that does not read cannot make the daemon grow
 * without bound. */
#define CONNBUDGET_OUT_CAP (8u << 20)

typedef struct connbudget connbudget;

/* Whether one more connection may open, and which limit refuses it. */
enum connbudget_admit {
    CONNBUDGET_OK,
    CONNBUDGET_FULL,     /* max_connections (or shutdown, or out of memory) */
    CONNBUDGET_UID_FULL, /* max_connections_per_uid */
};

/* The budget of cfg's max_connections (lowered, with a warning, to what the open-file
 * limit leaves for connections) and max_connections_per_uid; cfg outlives it. NULL + err
 * when memory runs out. */
connbudget *connbudget_new(const config *cfg, char err[ERR_MAX]);

/* Counts one more connection (in uid's count too when with_uid; without, one whose owner
 * is not known yet: unauthenticated TCP). Anything but CONNBUDGET_OK counts nothing, and
 * msg (cap bytes) says which limit refused it. */
enum connbudget_admit connbudget_add(connbudget *cb, bool with_uid, uid_t uid, char *msg,
                                     size_t cap);

/* Moves a counted connection to uid to (from from, when had_uid): CONNBUDGET_UID_FULL,
 * with msg, when to has its limit, the connection then staying where it was. */
enum connbudget_admit connbudget_set_uid(connbudget *cb, bool had_uid, uid_t from, uid_t to,
                                         char *msg, size_t cap);

/* Forgets a connection, as it was last counted (with_uid, uid). */
void connbudget_remove(connbudget *cb, bool with_uid, uid_t uid);

/* Connections counted under uid, of both listeners. */
unsigned connbudget_uid_count(const connbudget *cb, uid_t uid);

/* Shutdown began: every connbudget_add from now on is refused ("the daemon is shutting
 * down"). */
void connbudget_shutdown(connbudget *cb);

/* Frees the budget. NULL is fine. */
void connbudget_free(connbudget *cb);

#endif
