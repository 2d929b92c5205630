/*
 * uidtab.c — an amount per peer uid (uidtab.h).
 */
#include "daemon/net/uidtab.h"

#include <stdlib.h>

static uidtab_entry *find(const uidtab *t, uid_t uid)
{
    for (size_t i = 0; i < t->n; i++)
        if (t->e[i].uid == uid)
            return &t->e[i];
    return NULL;
}

size_t uidtab_get(const uidtab *t, uid_t uid)
{
    const uidtab_entry *u = find(t, uid);
    return u ? u->amount : 0;
}

int uidtab_add(uidtab *t, uid_t uid, size_t n)
{
    uidtab_entry *u = find(t, uid);
    if (u) {
        u->amount += n;
        return 0;
    }
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 16;
        uidtab_entry *p = realloc(t->e, cap * sizeof *p);
        if (!p)
            return -1;
        t->e = p;
        t->cap = cap;
    }
    t->e[t->n++] = (uidtab_entry){uid, n};
    return 0;
}

void uidtab_sub(uidtab *t, uid_t uid, size_t n)
{
    uidtab_entry *u = find(t, uid);
    if (!u)
        return;
    u->amount -= n < u->amount ? n : u->amount;
    if (u->amount == 0)
        *u = t->e[--t->n];
}

void uidtab_free(uidtab *t)
{
    free(t->e);
    *t = (uidtab){0};
}
