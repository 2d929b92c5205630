/*
 * store_internal.h — what the files of libstorage share (store.c, chunks.c, and the
 * one-shot SQL helpers of store_sql.c for kb.c, ivf.c and graphs.c); not for use
 * outside storage/.
 */
#ifndef LLMS_STORAGE_STORE_INTERNAL_H
#define LLMS_STORAGE_STORE_INTERNAL_H

#include <sqlite3.h>

#include "storage/store.h"

/* -1 with "store: <what>: <sqlite's message>" in err. */
int store_db_err(store *s, char *err, const char *what);

/* sqlite's message of db's last failure; when the file itself is damaged (corrupt, not
 * a database) followed by the file's path, so that an admin knows what to restore or
 * remove. buf holds it when it needs the path (returned either way). */
const char *store_db_message(sqlite3 *db, char *buf, size_t cap);

/* sql prepared for one use (the caller finalizes it); NULL with err. */
sqlite3_stmt *store_prepare(store *s, const char *sql, char *err);

/* Steps st once (a statement whose rows do not matter) and finalizes it. */
int store_step_once(store *s, sqlite3_stmt *st, const char *what, char *err);

/* Runs sql (one or more statements returning no rows). */
int store_exec_sql(store *s, const char *sql, char *err);

/* chunks.c's per-store state (its prepared statements, compressor and buffers). */
typedef struct store_chunks store_chunks;

sqlite3 *store_sqlite(store *s);

/* Where chunks.c keeps its state: NULL until its first use. */
store_chunks **store_chunks_slot(store *s);

/* Frees chunks.c's state; store_close calls it before closing the database. */
void store_chunks_free(store_chunks *c);

/* Removes the chunk files of a context whose catalog rows are already gone. Best effort:
 * what it cannot remove, store_chunks_gc removes later. */
void store_chunks_remove_context(store *s, const char *ctx_id);

/* Deletes the catalog rows of ctx_id's chunks with index >= first (inside the caller's
 * transaction when there is one); their (index, generation) pairs go to a malloc'ed
 * *files (*n_files pairs) for store_chunk_files_remove once the deletion is committed. */
int store_chunk_rows_delete_from(store *s, const char *ctx_id, int first, int64_t **files,
                                 int *n_files, char *err);

/* Removes the files of n (index, generation) pairs whose rows are gone. err may be NULL:
 * what is left behind is an orphan that store_chunks_gc removes. */
int store_chunk_files_remove(store *s, const char *ctx_id, const int64_t *files, int n,
                             char *err);

/* Migration 11's conversion of the knowledge bases' passages (kb.c), inside the
 * migration's transaction: kb_passages into kb_passages_v11 (kb_docs_v11 filled), each
 * FTS table rebuilt contentless. */
int store_kb_migrate_11(store *s, char *err);


#endif
