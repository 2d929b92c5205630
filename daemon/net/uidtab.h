/*
 * uidtab.h — an amount per peer uid (connections, bytes of partial frames or bodies),
 * kept only for uids whose amount is not 0. The per-uid budgets of the native listener
 * and the HTTP gateway each keep one; a machine's uids with anything in flight are few,
 * so a small array searched in order serves.
 */
#ifndef LLMS_UIDTAB_H
#define LLMS_UIDTAB_H

#include <stddef.h>
#include <sys/types.h>

typedef struct uidtab_entry {
    uid_t uid;
    size_t amount;
} uidtab_entry;

/* Zero-initialised is empty. */
typedef struct uidtab {
    uidtab_entry *e; /* (n) the uids with an amount, in no order */
    size_t n, cap;
} uidtab;

/* uid's amount, 0 when it has none. */
size_t uidtab_get(const uidtab *t, uid_t uid);

/* Adds n to uid's amount; -1 when memory runs out (nothing changed). */
int uidtab_add(uidtab *t, uid_t uid, size_t n);

/* Takes n (at most what uid has) from uid's amount; at 0 its entry goes. */
void uidtab_sub(uidtab *t, uid_t uid, size_t n);

/* Frees the table's memory; it is empty again. */
void uidtab_free(uidtab *t);

#endif
