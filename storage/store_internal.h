/*
 * store_internal.h — what store.c and chunks.c share inside libstorage; not for use
 * outside storage/.
 */
#ifndef LLMS_STORAGE_STORE_INTERNAL_H
#define LLMS_STORAGE_STORE_INTERNAL_H

#include <sqlite3.h>

#include "storage/store.h"

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

#endif
