/*
 * chunks.h — blobs of a context's KV chunks, stored as files beside the catalog.
 *
 * The store knows bytes, not transformers: a chunk blob is a list of byte sections (the
 * daemon writes one per model layer so that it can read a chunk back one layer at a
 * time) plus a small record in the catalog (table chunks) describing it. Files live in
 * <dir>/chunks/<context id>/; each section is compressed with zstd (or kept as is when
 * that saves little) and checksummed, and
 * every read verifies sizes and checksums, so a corrupt, truncated or missing file is
 * an error naming the chunk, never wrong bytes.
 *
 * Writes are crash-safe: the file is written under a temporary name, fsynced, renamed
 * and its directory fsynced before the catalog row commits; a crash at any point leaves
 * either the old chunk (row and file) or the new one. Files no row refers to (left by a
 * crash between rename and commit) are removed by store_chunks_gc. A batch of chunks
 * shares the syncs and one catalog transaction, which costs much less per chunk.
 *
 * Catalog functions run on the store's thread (like store.h). A store_chunk_reader,
 * once opened, touches only its file and may be used from another thread (an I/O
 * thread), one thread at a time.
 */
#ifndef LLMS_STORAGE_CHUNKS_H
#define LLMS_STORAGE_CHUNKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/err.h"
#include "storage/store.h"

#define STORE_CHUNK_MAX_SECTIONS 1024

/* What the catalog keeps about one stored chunk. */
typedef struct store_chunk {
    int index;             /* chunk number in its context: covers tokens [16 i, 16 i + 16) */
    int precision;         /* opaque to the store (the engine's kv_precision) */
    int n_tokens;          /* entries the chunk holds */
    int n_sections;        /* sections of the blob */
    int64_t raw_bytes;     /* sum of the sections' uncompressed sizes */
    int64_t file_bytes;    /* size of the file on disk */
    float density;         /* opaque to the store (attention-based information density) */
    int64_t last_used_ms;  /* Unix ms; set by the caller */
} store_chunk;

/* One chunk to write: its record and its sections. */
typedef struct store_chunk_blob {
    store_chunk meta;                 /* in: index, precision, n_tokens, density,
                                       * last_used_ms; out: n_sections and byte counts */
    const void *const *sections;      /* (n_sections) bytes of each section */
    const size_t *section_bytes;      /* (n_sections) size of each section */
    int n_sections;                   /* 0 .. STORE_CHUNK_MAX_SECTIONS */
} store_chunk_blob;

/*
 * Writes n_chunks chunks (distinct indexes; 0 is fine) of context ctx_id (which must
 * exist), each replacing any stored version, all durable when it returns. All or
 * nothing: every file is written and synced, then one catalog transaction stores every
 * row; on failure no row changes, the stored versions stay readable and the new files
 * are removed. chunks[k].meta.n_sections and the byte counts are filled in on success.
 */
int store_chunk_write_batch(store *s, const char *ctx_id, store_chunk_blob *chunks,
                            int n_chunks, char err[ERR_MAX]);

/*
 * The same write in three phases, so that the slow part (compressing, writing and
 * syncing the files) runs on another thread while the store's thread goes on:
 * - store_chunk_batch_begin (store's thread): checks the batch and picks each chunk's
 *   new file generation. The sections must stay valid and unchanged, and no other batch
 *   of the same context may begin, until store_chunk_batch_end.
 * - store_chunk_batch_write (any one thread; touches files only, no catalog): writes and
 *   syncs every file, compressing with e. On failure its files are removed.
 * - store_chunk_batch_end (store's thread): commits the rows of a written batch, removes
 *   the versions they replace and fills in the metas as store_chunk_write_batch does;
 *   a batch that was not written (or whose commit fails) changes nothing. Frees the batch
 *   either way.
 */
typedef struct store_chunk_batch store_chunk_batch;
typedef struct store_chunk_encoder store_chunk_encoder;

store_chunk_encoder *store_chunk_encoder_new(char err[ERR_MAX]);
void store_chunk_encoder_free(store_chunk_encoder *e);

store_chunk_batch *store_chunk_batch_begin(store *s, const char *ctx_id,
                                           store_chunk_blob *chunks, int n_chunks,
                                           char err[ERR_MAX]);
int store_chunk_batch_write(store_chunk_batch *b, store_chunk_encoder *e, char err[ERR_MAX]);
int store_chunk_batch_end(store *s, store_chunk_batch *b, char err[ERR_MAX]);

/* Stores bytes as the context's stats (store_context_set_stats) in the batch's
 * transaction, so that they are committed with the chunk rows they go with, or not at
 * all; a batch of no chunks then still commits them. Copies bytes; before
 * store_chunk_batch_end. */
int store_chunk_batch_set_context_stats(store_chunk_batch *b, const void *bytes, size_t n,
                                        char err[ERR_MAX]);

/* A batch of one: writes chunk meta->index of ctx_id from n_sections sections; meta's
 * n_sections and byte counts are filled in. */
int store_chunk_write(store *s, const char *ctx_id, store_chunk *meta,
                      const void *const *sections, const size_t *section_bytes,
                      int n_sections, char err[ERR_MAX]);

/* Updates the catalog fields that change without rewriting the blob. */
int store_chunk_touch(store *s, const char *ctx_id, int index, float density,
                      int64_t last_used_ms, char err[ERR_MAX]);

/* Calls fn (may be NULL) for each stored chunk of a context in index order; a non-zero
 * return from fn stops the walk and is returned. fn must not call store_chunk_list. */
int store_chunk_list(store *s, const char *ctx_id,
                     int (*fn)(void *arg, const store_chunk *c), void *arg, char err[ERR_MAX]);

/* Deletes the chunks of a context whose index is >= first (0: all of them), rows and
 * files. store_context_delete also deletes a context's chunks. */
int store_chunk_delete_from(store *s, const char *ctx_id, int first, char err[ERR_MAX]);

/* Removes chunk files that no catalog row refers to (after a crash); *n_removed counts
 * them (may be NULL). Called when the daemon starts. */
int store_chunks_gc(store *s, int *n_removed, char err[ERR_MAX]);

/* Asks the kernel to drop the page cache of every chunk file of a context (benchmarks
 * measure reads from the disk, not from memory). */
int store_chunk_drop_cache(store *s, const char *ctx_id, char err[ERR_MAX]);

/* ---- reading ---- */

typedef struct store_chunk_reader store_chunk_reader;

/* Opens chunk index of ctx_id for reading; its header is read and checked. *found false
 * (and NULL) when the catalog has no such chunk; a missing or corrupt file is an error. */
store_chunk_reader *store_chunk_open(store *s, const char *ctx_id, int index, bool *found,
                                     char err[ERR_MAX]);

/*
 * store_chunk_open in two steps, so that the second (disk reads) can run on an I/O
 * thread: store_chunk_open_deferred (store's thread) looks the chunk up in the catalog
 * and opens its file without reading from it (store_chunk_reader_cached and the meta
 * are then known; *found as for store_chunk_open); store_chunk_read_header (any one
 * thread, as the reading functions below) reads and checks the header, and must succeed
 * before any section is read. A failed header read can be tried again.
 */
store_chunk_reader *store_chunk_open_deferred(store *s, const char *ctx_id, int index,
                                              bool *found, char err[ERR_MAX]);
int store_chunk_read_header(store_chunk_reader *r, char err[ERR_MAX]);

/* The catalog record the reader was opened from. */
const store_chunk *store_chunk_reader_meta(const store_chunk_reader *r);

/* Uncompressed size of section i (0 before the header is read). */
size_t store_chunk_section_bytes(const store_chunk_reader *r, int i);

/* Reads, decompresses and verifies section i into dst, which holds exactly
 * store_chunk_section_bytes(r, i) bytes. Sections may be read in any order. On failure
 * (a wrong size leaves dst alone) dst may hold partial bytes that must not be used. */
int store_chunk_read_section(store_chunk_reader *r, int i, void *dst, size_t dst_bytes,
                             char err[ERR_MAX]);

/* Bytes read from the file so far (to report the disk bandwidth seen). */
int64_t store_chunk_reader_bytes_read(const store_chunk_reader *r);

/* The share (0..1) of the file's pages that were in the page cache when it was opened,
 * before its header was read (cachestat, or mincore where the kernel lacks it); -1 when
 * the kernel could not tell. Reading a cached chunk costs memory bandwidth and
 * decompression, an uncached one disk time. */
double store_chunk_reader_cached(const store_chunk_reader *r);

void store_chunk_close(store_chunk_reader *r);

#endif
