/*
 * kbint.h — the knowledge-base module's internals, shared by its two files: kb.c (the
 * requests answered at once, retrieval, the drops finished in idle time) and kbadd.c
 * (the KbAdd and KbDrop tasks the scheduler advances a slice at a time).
 */
#ifndef LLMS_KBINT_H
#define LLMS_KBINT_H

#include "daemon/net/reply.h"
#include "daemon/rag/kb.h"

typedef struct kb_vecs kb_vecs;

struct kbm {
    kb_env env;
    reply_to to;
    kb_vecs *cache;
    kb_ivf_stats ivf_stats;
    kb_changed_fn changed;
    void *changed_arg;
    bool drops_pending;     /* rows of hidden knowledge bases or retired documents, or
                             * their freed pages, may be left (kb_drop_idle) */
    /* kb_disk_measure_idle's state: the last whole measurement, the one under way */
    bool disk_stale;        /* a write since the measurement under way (or last) began */
    bool disk_measured;     /* disk_bytes holds a whole measurement */
    int disk_btree;         /* the next btree to measure; -1: none under way */
    int64_t disk_bytes, disk_partial;
};

/* Rows of a KbDrop slice per row of scheduler work it is given: a deleted row costs far
 * less than a row of a forward. */
#define KB_DROP_ROWS_PER_ROW 32

/* Forgets the in-memory vectors of kb_id (it changed), and marks the knowledge bases'
 * bytes on disk to be measured again. */
void kb_cache_drop(kbm *k, int64_t kb_id);

/* Looks up the request's knowledge base name of app (uid, app) into *out: true when
 * found, false after answering the request NOT_FOUND or INTERNAL itself. */
bool kb_find(kbm *k, uint64_t conn_id, uint32_t uid, const char *app,
             const Llms__Request *req, const char *name, kb_ref *out);

#endif
