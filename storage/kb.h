/*
 * kb.h — the catalog of knowledge bases (documents, passages, embeddings, BM25), the QA
 * bank and the QKV prefix tree of RAG.
 *
 * The store knows strings, vectors and bytes, not transformers: a passage is a span of
 * its document's text with a vector; a QKV node is an opaque blob under a 64-bit key
 * with a parent key. Each knowledge base has its own SQLite FTS5 table (kbfts_<id>), so
 * BM25 ranks and statistics of one app's documents never depend on another's. QKV blobs
 * are kept compressed with zstd and checked with CRC-32C on every read (a corrupt blob is
 * an error naming the node, never wrong bytes); they live in the catalog itself, so they
 * are as crash-safe as any committed row.
 *
 * Compact passages (schema 11): a document's text is stored once, whatever the passages'
 * overlap: each passage row keeps its head, the document's bytes from its start to the
 * next passage's start, and its length, so its text is its head and those of the
 * passages after it, cut. The FTS5 table is contentless (it keeps the index, not a copy
 * of the text), and a row leaves it by the 'delete' command with the text rebuilt so.
 * Vectors are int8 with a float scale per vector (STORE_VEC_BYTES).
 *
 * A document is written staged (store_kb_stage_doc, then its passages in as many calls
 * and transactions as the writer likes) and published in one small transaction
 * (store_kb_publish): no read (counts, lists, vectors, BM25, passages, usage aside)
 * sees a staged document, and a published one replaces the visible document of its
 * name, which is retired. Staged documents of a writer that stopped and retired ones
 * are deleted a slice at a time (store_kb_clean_step).
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
    const char *embedder;      /* the file of the model that made its vectors */
    const char *embed_model;   /* that model's registry name ('' in older databases) */
    int dim;
    int64_t n_docs, n_passages, bytes, qa_entries; /* visible documents' */
    bool share_uid;            /* its caches are shared by every app of its uid */
} store_kb;

/* Creates knowledge base name of app_id (share_uid: store_kb.share_uid); *exists true
 * (and nothing written) when the app already has one of that name. */
int store_kb_create(store *s, int64_t app_id, const char *name, int passage_tokens,
                    int overlap_tokens, const char *embed_model, const char *embedder, int dim,
                    bool share_uid,
                    int64_t now_ms, int64_t *kb_id, bool *exists, char err[ERR_MAX]);

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

/* A drop in slices, so that a knowledge base of any size never holds the catalog for
 * long: store_kb_hide renames it out of every lookup and list (to "~<id>", a name no
 * app can give) and drops its FTS table; store_kb_drop_step then deletes up to max_rows
 * of its rows a call, each call one transaction, *done once the knowledge base is gone.
 * A hidden knowledge base still counts in its uid's usage until then, and one a crash
 * left is found by store_kb_hidden (*kb_id -1: none). */
int store_kb_hide(store *s, int64_t kb_id, char err[ERR_MAX]);
int store_kb_drop_step(store *s, int64_t kb_id, int max_rows, bool *done, char err[ERR_MAX]);
int store_kb_hidden(store *s, int64_t *kb_id, char err[ERR_MAX]);

/* The visible passages of every knowledge base and their documents' text bytes (sums
 * over the documents' rows: cheap enough for every status call). */
int store_kb_totals(store *s, int64_t *passages, int64_t *text_bytes, char err[ERR_MAX]);

/* The bytes of the catalog's pages in the index-th (0, 1, ... by name) of the btrees
 * that hold knowledge bases (documents, passages, their indexes, the FTS tables), into
 * *bytes; *done when index is past the last. SQLite's dbstat reads every page of the
 * btree, so this is idle-time work, one btree a turn (daemon/rag/kb.h kb_disk_*). */
int store_kb_disk_btree(store *s, int index, int64_t *bytes, bool *done, char err[ERR_MAX]);

/* Text bytes and passages of every knowledge base of the uid's apps, staged and retired
 * documents included (they hold their space until deleted). */
int store_kb_uid_usage(store *s, uint32_t uid, int64_t *bytes, int64_t *passages,
                       char err[ERR_MAX]);

/* Groups the writes that follow into one transaction (all durable at store_kb_commit,
 * none after store_kb_rollback or a crash). */
int store_kb_begin(store *s, char err[ERR_MAX]);
int store_kb_commit(store *s, char err[ERR_MAX]);
void store_kb_rollback(store *s);

/* A stored vector of dim components: dim int8 q, then a float scale; the vector is
 * q * scale. A quarter of float32's bytes; cosine ranks move by the rounding of q only
 * (bench/kb_store measures recall). */
#define STORE_VEC_BYTES(dim) ((size_t)(dim) + sizeof(float))

/* v (dim floats) as int8 q with its scale (max |v| / 127; 0 for a zero vector). */
void store_vec_quantize(const float *v, int dim, int8_t *q, float *scale);

/* A passage: bytes [off, off + len) of its document's text. Passages of a document are
 * in order of off. */
typedef struct store_span {
    size_t off, len;
} store_span;

/* Adds a staged document doc of kb_id (text_bytes of text, n_passages passages): *doc_id
 * is its row, for store_kb_put_passages and store_kb_publish. */
int store_kb_stage_doc(store *s, int64_t kb_id, const char *doc, const char *metadata,
                       int64_t text_bytes, int n_passages, int64_t now_ms, int64_t *doc_id,
                       char err[ERR_MAX]);

/* Writes passages [from, from + n) of staged document doc_id of kb_id: spans (all its
 * n_spans passages, as store_span says) into text, vecs (n rows of dim floats: passage
 * from's first). Their ids are new and ascending; *first_id (may be NULL) gets the
 * first. */
int store_kb_put_passages(store *s, int64_t kb_id, int64_t doc_id, const char *text,
                          const store_span *spans, int n_spans, int from, int n,
                          const float *vecs, int dim, int64_t *first_id, char err[ERR_MAX]);

/* Makes the staged documents doc_ids[0..n) visible, retiring the visible documents of
 * their names; one transaction unless one is open. */
int store_kb_publish(store *s, int64_t kb_id, const int64_t *doc_ids, int n, char err[ERR_MAX]);

/* Retires the staged documents doc_ids[0..n) (a writer that gives up). */
int store_kb_unstage(store *s, const int64_t *doc_ids, int n, char err[ERR_MAX]);

/* Retires every staged document: at startup, when no writer is left. */
int store_kb_unstage_all(store *s, char err[ERR_MAX]);

/* Deletes up to max_rows passages of retired documents (their FTS rows too), then the
 * documents left with none, in one transaction; *done once none is left. */
int store_kb_clean_step(store *s, int max_rows, bool *done, char err[ERR_MAX]);

/* Stores document doc of kb_id (replacing one of the same id): text cut into the n
 * passages spans gives, with vectors vecs (n rows of dim floats); staged, written and
 * published in one call. The passages get new ascending ids from *first_id. */
int store_kb_put_doc(store *s, int64_t kb_id, const char *doc, const char *metadata,
                     const char *text, const store_span *spans, int n, const float *vecs,
                     int dim, int64_t now_ms, int64_t *first_id, char err[ERR_MAX]);

/* Retires document doc of kb_id (store_kb_clean_step deletes its rows); *found says
 * whether it existed. */
int store_kb_remove_doc(store *s, int64_t kb_id, const char *doc, bool *found,
                        char err[ERR_MAX]);

/* Calls fn for each visible passage of kb_id with its vector (dim int8 q and scale, as
 * STORE_VEC_BYTES says), in id order. */
int store_kb_vectors(store *s, int64_t kb_id, int dim,
                     int (*fn)(void *arg, int64_t id, const int8_t *q, float scale),
                     void *arg, char err[ERR_MAX]);

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

/* ---- owners ---- */

/* Whose a cache entry is: a uid and a scope, the app's name or STORE_SCOPE_UID for what
 * every app of the uid shares (a knowledge base made with share_uid). App names are
 * [A-Za-z0-9._-], so the two never meet. A QA entry's owner is its knowledge base's app.
 * Where a call takes a filter (const store_owner *, NULL: every owner), a NULL scope
 * means every scope of the uid. */
#define STORE_SCOPE_UID "*"
typedef struct store_owner {
    uint32_t uid;
    const char *scope;
} store_owner;

/* ---- QA bank ---- */

typedef struct store_qa {
    int64_t id;
    const char *question;
    const float *vec;        /* dim floats */
    const char *answer;
    int stop;                /* why the answer stopped, the caller's code (>= 0) */
    int n_tokens;            /* the answer's generated tokens */
    const int64_t *passages; /* n_passages passage ids the answer was made from */
    int n_passages;
    int64_t created_ms;
    bool predicted;          /* made by a predicted query, not asked yet */
} store_qa;

/* Adds an entry whose answer stopped for reason stop after n_tokens tokens (entries
 * stored before schema version 14 read 0 and 0); predicted marks one a predicted query
 * made (store_qa.predicted). */
int store_qa_put(store *s, int64_t kb_id, const char *question, const float *vec, int dim,
                 const char *answer, int stop, int n_tokens, const int64_t *passages,
                 int n_passages, bool predicted, int64_t now_ms, char err[ERR_MAX]);

/* Calls fn for each entry of kb_id (dim floats per vector), oldest first. */
int store_qa_list(store *s, int64_t kb_id, int dim,
                  int (*fn)(void *arg, const store_qa *q), void *arg, char err[ERR_MAX]);

int store_qa_delete(store *s, int64_t id, char err[ERR_MAX]);

/* Marks entry id as asked for real (its predicted flag goes). */
int store_qa_asked(store *s, int64_t id, char err[ERR_MAX]);

/* Deletes the oldest entries until their bytes (as store_qa_stats counts them) are at
 * most budget, each from the app that holds the most bytes then, so that one app's
 * churn never takes another's entries below an equal share; *evicted counts them (may
 * be NULL). */
int store_qa_evict(store *s, int64_t budget, int *evicted, char err[ERR_MAX]);

/* Deletes app (uid, app)'s oldest entries until it holds at most max_bytes and
 * max_entries (each <= 0: no limit). */
int store_qa_evict_owner(store *s, uint32_t uid, const char *app, int64_t max_bytes,
                         int64_t max_entries, int *evicted, char err[ERR_MAX]);

/* Entries and their bytes, of the owners filter matches (the scope an app's name;
 * STORE_SCOPE_UID matches none). */
int store_qa_stats(store *s, const store_owner *filter, int64_t *n, int64_t *bytes,
                   char err[ERR_MAX]);

/* ---- QKV prefix tree ---- */

#define STORE_QKV_KEY_BYTES 32

/* Stores node key (child of parent; NULL: a root) of owner o, made from the token prefix
 * prefix[0..n_prefix), holding n_tokens tokens' worth of raw bytes, compressed and
 * checksummed; replaces a node of the same key. predicted marks a node a predicted query
 * made. */
int store_qkv_put(store *s, const uint8_t key[STORE_QKV_KEY_BYTES], const uint8_t *parent,
                  const store_owner *o, const int32_t *prefix, int n_prefix, int n_tokens,
                  const void *raw, size_t raw_bytes, bool predicted, int64_t now_ms,
                  char err[ERR_MAX]);

/* Reads node key into dst (dst_cap bytes; *raw_bytes gets its size) when it is owner o's
 * and was made from exactly prefix[0..n_prefix): a node under the key with another
 * owner or prefix (a forged row, or a hash collision) is not found, with *mismatch true.
 * *predicted (may be NULL) says whether a predicted query made it and no real one used
 * it since. A blob larger than dst_cap or failing its checksum is an error. Only reads:
 * uses are counted by store_qkv_touch, off the query's path. */
int store_qkv_get(store *s, const uint8_t key[STORE_QKV_KEY_BYTES], const store_owner *o,
                  const int32_t *prefix, int n_prefix, void *dst, size_t dst_cap,
                  size_t *raw_bytes, int *n_tokens, bool *predicted, bool *found,
                  bool *mismatch, char err[ERR_MAX]);

/* Counts a use of node key (for LFU eviction); a real use (real) clears its predicted
 * mark. A node that is gone is no error. */
int store_qkv_touch(store *s, const uint8_t key[STORE_QKV_KEY_BYTES], bool real,
                    int64_t now_ms, char err[ERR_MAX]);

/* Whether node key exists as store_qkv_get would find it (no use counted, no blob
 * read). */
int store_qkv_has(store *s, const uint8_t key[STORE_QKV_KEY_BYTES], const store_owner *o,
                  const int32_t *prefix, int n_prefix, bool *found, bool *mismatch,
                  char err[ERR_MAX]);

/* Evicts nodes with no children, least frequently used first (then least recently),
 * each from the owner that holds the most bytes then (of those with a node without
 * children: a uid's shared nodes may all be parents of its apps'), until the stored bytes
 * are at most budget: an owner at or below an equal share of budget loses nothing to
 * another's churn. *evicted counts them (may be NULL). */
int store_qkv_evict(store *s, int64_t budget, int *evicted, char err[ERR_MAX]);

/* Evicts owner o's leaves in the same order until it holds at most max_bytes and
 * max_entries (each <= 0: no limit), or until every node it has left is a parent of
 * others' (which go first). */
int store_qkv_evict_owner(store *s, const store_owner *o, int64_t max_bytes,
                          int64_t max_entries, int *evicted, char err[ERR_MAX]);

/* Nodes and their stored bytes (compressed blob and prefix), of the owners filter
 * matches. */
int store_qkv_stats(store *s, const store_owner *filter, int64_t *n, int64_t *bytes,
                    char err[ERR_MAX]);

/* Groups cache writes (QA bank, QKV tree; also stored responses, responses.h) into one
 * transaction committed without waiting for the disk (synchronous = NORMAL for it: a
 * killed process loses none of it, a power loss may lose the last such transactions, the
 * catalog stays consistent either way). A cache is rebuilt by the queries that follow,
 * so its writes need not cost a flush each. Ended by store_cache_commit, or
 * store_kb_rollback then store_cache_end. */
int store_cache_begin(store *s, char err[ERR_MAX]);
int store_cache_commit(store *s, char err[ERR_MAX]);
void store_cache_end(store *s);

/* Empties the QA bank and the QKV tree of the owners filter matches (NULL: all), in
 * one transaction. */
int store_rag_clear(store *s, const store_owner *filter, char err[ERR_MAX]);

#endif
