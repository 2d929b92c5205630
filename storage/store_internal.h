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

/*
 * Row checksums (schema version 15): llmsd_crc(v1, v2, ...), an SQL function of the
 * store's connection (store_sql_functions), is the CRC-32C of its arguments' types and
 * contents in order. A turn's covers (context id, seq, role, text, tokens); a context's
 * covers what its answers depend on: (id, its app's uid and name, system prompt, params,
 * model, overflow, window sink, dropped, slides). Its counters (n_tokens, n_turns) are
 * checked against its turns instead, and last use, creation time and stats are not
 * covered. Each macro takes its columns as SQL expressions, so that a statement that
 * changes a covered column passes its new value.
 */
#define STORE_TURN_CRC(id, seq, role, text, tokens)                                         \
    "llmsd_crc(" id ", " seq ", " role ", " text ", " tokens ")"
#define STORE_CONTEXT_CRC(id, uid, app, prompt, params, model, overflow, sink, dropped,     \
                          slides)                                                          \
    "llmsd_crc(" id ", " uid ", " app ", " prompt ", " params ", " model ", " overflow ", "   \
    sink ", " dropped ", " slides ")"
/* A stored response's (storage/responses.h) covers every column but seq and crc. */
#define STORE_RESPONSE_CRC(id, uid, created, previous, response, items, bytes)             \
    "llmsd_crc(" id ", " uid ", " created ", " previous ", " response ", " items ", " bytes ")"
/* The uid and name of the app of app_id (an SQL expression). */
#define STORE_APP_UID(app_id) "(SELECT apps.uid FROM apps WHERE apps.id = " app_id ")"
#define STORE_APP_NAME(app_id) "(SELECT apps.name FROM apps WHERE apps.id = " app_id ")"

/* SQL that sets every turn's and every context's checksum from its columns: migration
 * 15, and tests that write rows as a bug of a later version could. */
#define STORE_SEAL_TURNS                                                                   \
    "UPDATE turns SET crc = " STORE_TURN_CRC("context_id", "seq", "role", "text", "tokens") ";"
#define STORE_SEAL_CONTEXTS                                                                \
    "UPDATE contexts SET crc = "                                                           \
    STORE_CONTEXT_CRC("id", STORE_APP_UID("contexts.app_id"), STORE_APP_NAME("contexts.app_id"), \
                      "system_prompt", "params", "model", "overflow", "window_sink",       \
                      "window_dropped", "window_slides") ";"

/* Registers llmsd_crc on db (the store's connection, or a test's). SQLITE_OK or sqlite's
 * error code. */
int store_sql_functions(sqlite3 *db);

/* checkpointer.c: the write-ahead log checkpointed on a thread of its own, through a
 * connection of its own, woken by db's commits past 1000 pages of log (instead of
 * SQLite's automatic checkpoint inside such a commit). NULL with err. */
typedef struct store_checkpointer store_checkpointer;
store_checkpointer *store_checkpointer_start(sqlite3 *db, const char *path, char *err);

/* Stops the thread (a checkpoint it runs finishes first) and closes its connection;
 * db's commits checkpoint as SQLite's default does again. */
void store_checkpointer_stop(store_checkpointer *c, sqlite3 *db);

/* Holds off the thread's checkpoints (and waits for one running) until released: a
 * TRUNCATE checkpoint of the store's connection, run beside one, would find the log in
 * use and leave it whole. */
void store_checkpointer_hold(store_checkpointer *c);
void store_checkpointer_release(store_checkpointer *c);

/* Checkpoints the thread has run (tests). */
uint64_t store_checkpointer_done(store_checkpointer *c);

/* The store's checkpointer (NULL: none). */
store_checkpointer *store_checkpointer_of(store *s);

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
