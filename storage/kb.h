/*
 * kb.h — the catalog of knowledge bases (documents, passages, embeddings, BM25), the QA
 * bank and the QKV prefix tree of RAG.
 *
 * The store knows strings, vectors and bytes, not transformers: a passage is text with
 * a float vector; a QKV node is an opaque blob under a 64-bit key with a parent key.
 * Each knowledge base has its own SQLite FTS5 table (kbfts_<id>), so BM25 ranks and
 * statistics of one app's documents never depend on another's. QKV blobs are kept
 * compressed with zstd and checked with CRC-32C on every read (a corrupt blob is an
 * error naming the node, never wrong bytes); they live in the catalog itself, so they
 * are as crash-safe as any committed row.
 *
 * Same conventions as store.h: 0 or -1 with err; *found for missing rows; one thread.
 */
#ifndef LLMS_STORAGE_KB_H
#define LLMS_STORAGE_KB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/err.h"
#include "storage/store.h"

typedef struct store_kb {
    int64_t id;
    const char *name;          /* valid during the callback (or until the next call) */
    int passage_tokens, overlap_tokens;
    const char *embedder;      /* which model made its vectors */
    int dim;
    int64_t n_docs, n_passages, bytes, qa_entries;
} store_kb;

/* Creates knowledge base name of app_id; *exists true (and nothing written) when the app
 * already has one of that name. */
int store_kb_create(store *s, int64_t app_id, const char *name, int passage_tokens,
                    int overlap_tokens, const char *embedder, int dim, int64_t now_ms,
                    int64_t *kb_id, bool *exists, char err[ERR_MAX]);

/* Looks up name of app_id and calls fn with it (counts filled in); *found false when the
 * app has none of that name. */
int store_kb_get(store *s, int64_t app_id, const char *name,
                 int (*fn)(void *arg, const store_kb *kb), void *arg, bool *found,
                 char err[ERR_MAX]);

/* Calls fn for each knowledge base of app_id (of every app when -1), by name. */
int store_kb_list(store *s, int64_t app_id, int (*fn)(void *arg, const store_kb *kb),
                  void *arg, char err[ERR_MAX]);

/* Deletes a knowledge base with its documents, passages, FTS table and QA entries. */
int store_kb_drop(store *s, int64_t kb_id, char err[ERR_MAX]);

/* Text bytes and passages of every knowledge base of the uid's apps. */
int store_kb_uid_usage(store *s, uint32_t uid, int64_t *bytes, int64_t *passages,
                       char err[ERR_MAX]);

/* Groups the writes that follow into one transaction (all durable at store_kb_commit,
 * none after store_kb_rollback or a crash). */
int store_kb_begin(store *s, char err[ERR_MAX]);
int store_kb_commit(store *s, char err[ERR_MAX]);
void store_kb_rollback(store *s);

/* Stores document doc of kb_id (replacing one of the same id) as n passages: texts[i]
 * with vector vecs + i * dim. The passages get consecutive new ids from *first_id. */
int store_kb_put_doc(store *s, int64_t kb_id, const char *doc, const char *metadata,
                     int64_t bytes, const char *const *texts, const float *vecs, int n,
                     int dim, int64_t now_ms, int64_t *first_id, char err[ERR_MAX]);

/* Deletes document doc of kb_id and its passages; *found says whether it existed. */
int store_kb_remove_doc(store *s, int64_t kb_id, const char *doc, bool *found,
                        char err[ERR_MAX]);

/* Calls fn for each passage of kb_id with its vector (dim floats), in id order. */
int store_kb_vectors(store *s, int64_t kb_id, int dim,
                     int (*fn)(void *arg, int64_t id, const float *vec), void *arg,
                     char err[ERR_MAX]);

/* BM25 search of kb_id's passages for the words of query (any of them): up to k ids,
 * best first, with scores (higher is better: -bm25). A query with no words finds none. */
int store_kb_bm25(store *s, int64_t kb_id, const char *query, int k, int64_t *ids,
                  float *scores, int *n, char err[ERR_MAX]);

/* One passage of kb_id (strings valid during the call). */
typedef struct store_passage {
    int64_t id;
    const char *doc;
    int seq;
    const char *text;
    const char *metadata;   /* NULL when none */
} store_passage;

int store_kb_passage(store *s, int64_t kb_id, int64_t id,
                     int (*fn)(void *arg, const store_passage *p), void *arg, bool *found,
                     char err[ERR_MAX]);

/* ---- QA bank ---- */

typedef struct store_qa {
    int64_t id;
    const char *question;
    const float *vec;        /* dim floats */
    const char *answer;
    const int64_t *passages; /* n_passages passage ids the answer was made from */
    int n_passages;
    int64_t created_ms;
    bool predicted;          /* made by a predicted query, not asked yet */
} store_qa;

/* Adds an entry; predicted marks one a predicted query made (store_qa.predicted). */
int store_qa_put(store *s, int64_t kb_id, const char *question, const float *vec, int dim,
                 const char *answer, const int64_t *passages, int n_passages,
                 bool predicted, int64_t now_ms, char err[ERR_MAX]);

/* Calls fn for each entry of kb_id (dim floats per vector), oldest first. */
int store_qa_list(store *s, int64_t kb_id, int dim,
                  int (*fn)(void *arg, const store_qa *q), void *arg, char err[ERR_MAX]);

int store_qa_delete(store *s, int64_t id, char err[ERR_MAX]);

/* Marks entry id as asked for real (its predicted flag goes). */
int store_qa_asked(store *s, int64_t id, char err[ERR_MAX]);

/* Deletes the oldest entries, every knowledge base together, until their bytes (as
 * store_qa_stats counts them) are at most budget; *evicted counts them (may be NULL). */
int store_qa_evict(store *s, int64_t budget, int *evicted, char err[ERR_MAX]);

/* Entries and their bytes, over every knowledge base. */
int store_qa_stats(store *s, int64_t *n, int64_t *bytes, char err[ERR_MAX]);

/* ---- QKV prefix tree ---- */

/* Stores node key (child of parent; 0: a root) holding n_tokens tokens' worth of raw
 * bytes, compressed and checksummed; replaces a node of the same key. predicted marks a
 * node a predicted query made. */
int store_qkv_put(store *s, uint64_t key, uint64_t parent, int n_tokens, const void *raw,
                  size_t raw_bytes, bool predicted, int64_t now_ms, char err[ERR_MAX]);

/* Reads node key into dst (dst_cap bytes; *raw_bytes gets its size); *found false when
 * absent. *predicted (may be NULL) says whether a predicted query made it and no real one
 * used it since. A blob larger than dst_cap or failing its checksum is an error. Only
 * reads: uses are counted by store_qkv_touch, off the query's path. */
int store_qkv_get(store *s, uint64_t key, void *dst, size_t dst_cap, size_t *raw_bytes,
                  int *n_tokens, bool *predicted, bool *found, char err[ERR_MAX]);

/* Counts a use of node key (for LFU eviction); a real use (real) clears its predicted
 * mark. A node that is gone is no error. */
int store_qkv_touch(store *s, uint64_t key, bool real, int64_t now_ms, char err[ERR_MAX]);

/* Whether node key exists (no use counted). */
int store_qkv_has(store *s, uint64_t key, bool *found, char err[ERR_MAX]);

/* Evicts nodes with no children, least frequently used first (then least recently),
 * until the stored bytes are at most budget; *evicted counts them (may be NULL). */
int store_qkv_evict(store *s, int64_t budget, int *evicted, char err[ERR_MAX]);

/* Nodes and their stored (compressed) bytes. */
int store_qkv_stats(store *s, int64_t *n, int64_t *bytes, char err[ERR_MAX]);

/* Groups cache writes (QA bank, QKV tree) into one transaction committed without
 * waiting for the disk (synchronous = NORMAL for it: a killed process loses none of it,
 * a power loss may lose the last such transactions, the catalog stays consistent either
 * way). A cache is rebuilt by the queries that follow, so its writes need not cost a
 * flush each. Ended by store_cache_commit, or store_kb_rollback then store_cache_end. */
int store_cache_begin(store *s, char err[ERR_MAX]);
int store_cache_commit(store *s, char err[ERR_MAX]);
void store_cache_end(store *s);

/* Empties the QA bank and the QKV tree. */
int store_rag_clear(store *s, char err[ERR_MAX]);

#endif
