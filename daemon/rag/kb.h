/*
 * kb.h — apps' knowledge bases: the KbCreate, KbAdd, KbRemove, KbList, KbDrop and
 * KbSearch requests, and the hybrid retrieval RagQuery uses.
 *
 * A knowledge base belongs to one app (uid, app name); every lookup is by (app, name),
 * so another app's knowledge base is NOT_FOUND, never revealed. KbAdd and KbDrop are
 * scheduler work (kb_begin, then kb_task_advance a slice at a time), counted by
 * max_queued_per_app and max_queued_per_uid like Embed: a KbAdd splits one document per
 * slice into passages of passage_tokens tokens of the daemon's model overlapping by
 * overlap_tokens, embeds them as an Embed would (semantic_embed_texts: slices of the
 * step's forward on the generate model, or of the encoder), then stages its documents
 * (storage/kb.h: rows no read sees), writes their passages, vectors and FTS5 index
 * entries a slice of about 5 ms a turn, and publishes every document of the request in
 * one small transaction: the reply goes out after that commit, so an acknowledged KbAdd
 * survives a crash whole, and an unacknowledged one (failed, cancelled, cut by a crash)
 * leaves nothing visible, its staged rows deleted in idle time. A KbDrop takes the knowledge base out of every lookup
 * at once and deletes its rows in slices (store_kb_drop_step); what a cancelled drop or
 * a crash leaves is deleted in idle time (kb_drop_idle).
 *
 * Retrieval: BM25 over the knowledge base's FTS5 table and cosine over its vectors (held
 * in memory per knowledge base after first use, dropped when it changes): brute force,
 * or from kb_ivf_min_passages passages on through an IVF index (storage/ivf.h, stored
 * as the app's index "kb:<id>", visiting kb_ivf_nprobe lists, skipping those that cannot
 * change the candidates: kb_hints, kb_ivf_refresh_hot below). The index is brought up
 * to date with the passages when the vectors are (re)loaded: passages gone are removed,
 * new ones added to their nearest list, and it is retrained (4 sqrt(n) lists, at most
 * n / 8) once the passages call for twice its lists; a stored index that does not load
 * is rebuilt. Training waits for idle time (kb_ivf_train_idle); search is exact until
 * then. Each retriever gives a ranked candidate list, fused by reciprocal rank fusion (1/(60 + rank)
 * summed) or by the sum of min-max normalised scores.
 *
 * Limits (config): kb_max_per_app, kb_max_doc_bytes, kb_max_add_bytes, and per uid over
 * all its apps kb_max_mb_per_uid of document text and kb_max_passages_per_uid.
 */
#ifndef LLMS_KB_H
#define LLMS_KB_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "daemon/config.h"
#include "daemon/models/models.h"
#include "daemon/net/outq.h"
#include "daemon/sched/semantic.h"
#include "engine/err.h"
#include "engine/tok/tokenizer.h"
#include "proto/llms.pb-c.h"
#include "storage/store.h"

#define KB_NAME_MAX 64

typedef struct kb_env {
    const config *cfg;
    store *st;
    outq *out;
    const tokenizer *tok;   /* the daemon's: passages are measured in its tokens */
    semantic *sem;          /* embeddings */
    models *reg;            /* the embed models knowledge bases name */
} kb_env;

typedef struct kbm kbm;

kbm *kb_new(const kb_env *env, char err[ERR_MAX]);
void kb_free(kbm *k);

/* Whether req is one kb_handle answers (KbAdd and KbDrop are kb_begin's). */
bool kb_is_request(Llms__Request__BodyCase body);

/* Answers a KbCreate, KbRemove, KbList or KbSearch of app (uid, app). */
void kb_handle(kbm *k, uint64_t conn_id, uint32_t uid, const char *app, const Llms__Request *req);

typedef struct kb_task kb_task;

/* Checks a KbAdd or KbDrop of app (uid, app; app and req borrowed until the task is
 * freed) and prepares its work. NULL when the request was answered at once (an error). */
kb_task *kb_begin(kbm *k, uint64_t conn_id, uint32_t uid, const char *app,
                  const Llms__Request *req);

/* A KbAdd's embedding while it runs as slices of the step's forward (semantic_slice,
 * semantic_slice_done), else NULL: kb_task_advance does the task's next slice. */
sem_task *kb_task_embedding(kb_task *t);

/* Advances by about max_rows rows of work: a slice of a document's split, a slice of
 * encoder embedding, the staging, a write slice (about 5 ms, whatever max_rows), the
 * publish, or max_rows * 32 rows of a drop. 1 when the task is finished, its request
 * answered. */
int kb_task_advance(kb_task *t, int max_rows);

/* Rows of work the task still has, about (the scheduler's share of steps); at least 1
 * until it is finished. */
long kb_task_rows_left(const kb_task *t);

/* Sends a KbAdd's progress (a KbAddProgress frame, not final) when its request asked
 * for it and the last was sent KB_PROGRESS_MS ago or more; nothing otherwise. The
 * scheduler calls it after each of the add's embedding slices in its forward;
 * kb_task_advance after each of its own slices. */
#define KB_PROGRESS_MS 250
void kb_task_progress(kb_task *t);

/* Frees a task at any point: an unfinished KbAdd (cancelled, past its deadline) leaves
 * nothing visible (what it staged is retired, deleted in idle time) and is not answered
 * (the caller answers it); an unfinished drop's remaining rows go in idle time. NULL is
 * allowed. */
void kb_task_free(kb_task *t);

/* Whether a drop has rows left, and one slice of them (max_rows of work, as
 * kb_task_advance) in idle time. */
bool kb_drop_pending(const kbm *k);
void kb_drop_idle(kbm *k, int max_rows);

/* The knowledge bases' bytes on disk (storage/kb.h store_kb_disk_btree) are measured in
 * idle time, one btree a turn, because measuring reads every page: a status call only
 * reads the last measurement. kb_disk_stale: whether a write came since the last one
 * began (or none ended yet); kb_disk_measure_idle measures one more btree;
 * kb_disk_bytes: false until a first measurement ended, else its bytes. */
bool kb_disk_stale(const kbm *k);
void kb_disk_measure_idle(kbm *k);
bool kb_disk_bytes(const kbm *k, int64_t *bytes);

/* A knowledge base found for a query. */
typedef struct kb_ref {
    int64_t id;
    int64_t app_id;         /* its app's (the owner of its IVF index) */
    int dim;
    uint32_t uid;          /* its app (uid, app) and name: the strings kb_lookup was given */
    const char *app, *name;
    bool share_uid;         /* its caches are its uid's apps' together (KbCreate) */
    char embed_model[MODELS_NAME_MAX + 1]; /* the model of its vectors, by registry name
                                              ('' when made before names were kept) */
    char embedder[CONFIG_PATH_MAX];        /* that model's file */
} kb_ref;

/* Looks up app's knowledge base name: 1 found, 0 not (err says so), -1 failure. */
int kb_lookup(kbm *k, uint32_t uid, const char *app, const char *name, kb_ref *out,
              char err[ERR_MAX]);

/* The embed model of kb's vectors: the model it was made with (by name; the default
 * embed model for a knowledge base made before names were kept) while it serves the same
 * file with the embed role. NULL + err (FAILED_PRECONDITION: what changed, and what to
 * do) when it does not: a knowledge base never changes model, since its vectors are
 * that model's. */
models_entry *kb_embedder(kbm *k, const kb_ref *kb, char err[ERR_MAX]);

typedef struct kb_hit {
    int64_t id;
    float score;
} kb_hit;

/* The top k (<= 64) passages of kb for query (whose vector is qvec, kb's dim) under
 * retrieval (proto Retrieval), best first, into hits; *n how many. */
int kb_retrieve(kbm *k, const kb_ref *kb, const char *query, const float *qvec, int top_k,
                Llms__Retrieval retrieval, kb_hit *hits, int *n, char err[ERR_MAX]);

/* kb_retrieve in two halves, for a retrieval that wants an estimate before it embeds
 * its query: the BM25 candidates (none under RETRIEVAL_VECTOR; bm holds KB_CAND_MAX),
 * best first, whose first top_k are what BM25 alone would answer; then the vector search
 * (qvec unused under RETRIEVAL_BM25) fused with them, which is kb_retrieve's answer. */
#define KB_CAND_MAX 64      /* candidates each retriever gives the fusion, at most */
int kb_retrieve_bm25(kbm *k, const kb_ref *kb, const char *query, int top_k,
                     Llms__Retrieval retrieval, kb_hit *bm, int *n_bm, char err[ERR_MAX]);

/* Similarity-aware search (HedraRAG): the IVF lists where a request's last retrieval
 * from knowledge base kb_id found its vector candidates. Its next retrieval of the same
 * knowledge base searches them first, which lets the early stop (every IVF search skips
 * the lists that cannot change its candidates) leave more out: the results are the
 * plain nprobe search's, with less work when a request's queries are alike. */
#define KB_HINTS_MAX KB_CAND_MAX
typedef struct kb_hints {
    int64_t kb_id;
    int32_t lists[KB_HINTS_MAX];
    int n;
} kb_hints;

/* hints (NULL: none) are read when they are kb's, and after an IVF search hold its
 * candidates' lists. */
int kb_retrieve_fuse(kbm *k, const kb_ref *kb, const float *qvec, int top_k,
                     Llms__Retrieval retrieval, const kb_hit *bm, int n_bm,
                     kb_hints *hints, kb_hit *hits, int *n, char err[ERR_MAX]);

/* The IVF searches of knowledge bases since the daemon started. */
typedef struct kb_ivf_stats {
    uint64_t searches;      /* vector searches through an IVF index */
    uint64_t hinted;        /* of them with a request's hint lists */
    uint64_t lists_scanned; /* lists they scanned */
    uint64_t lists_skipped; /* lists the early stop left out of their nprobe */
    uint64_t hot_bytes;     /* vectors in the indexes' hot copies (kb_ivf_refresh_hot) */
    uint64_t trained;       /* indexes trained (k-means), in idle time */
} kb_ivf_stats;
const kb_ivf_stats *kb_get_ivf_stats(const kbm *k);

/* Hot lists (HedraRAG): repacks every IVF index searched since its last refresh so that
 * its most scanned lists, up to an equal share of kb_ivf_hot_mb, sit in one copy in
 * large pages that searches read (the same values: the same results). Off the request
 * path: the scheduler calls it in idle time when kb_ivf_hot_stale says so. */
void kb_ivf_refresh_hot(kbm *k);
bool kb_ivf_hot_stale(const kbm *k);

/* Training off the request path: a knowledge base whose passages call for an IVF index
 * that must be trained (none stored, or one that no longer fits) is searched by brute
 * force (exact: the index only trades recall for speed) until the scheduler, in idle
 * time, has built it with kb_ivf_train_idle: one index at a time, its k-means and then
 * its vectors' lists a slice of rows at a time, until the index is saved or *stop is
 * raised (a request came: the next call goes on where this one stopped; a change of the
 * knowledge base drops the work done). stop may be NULL (build to the end). */
bool kb_ivf_train_pending(const kbm *k);
void kb_ivf_train_idle(kbm *k, const _Atomic bool *stop);

/* Called after every committed change of kb. A KbAdd passes first_new: every passage of
 * kb with an id >= first_new is new (a new row's id is above every id present), so cached
 * answers they make stale can be found. A KbRemove or KbDrop passes -1: passages went,
 * and as SQLite hands a freed largest id out again, an answer must be checked against
 * the passages now, before a later add reuses their ids. Returns how many cached answers
 * were invalidated. The RAG cache registers it. */
typedef int (*kb_changed_fn)(void *arg, const kb_ref *kb, int64_t first_new);
void kb_on_changed(kbm *k, kb_changed_fn fn, void *arg);


#endif
