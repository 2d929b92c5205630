/*
 * kv.h — the KV cache as chunks of KV_CHUNK_TOKENS tokens covering all layers.
 *
 * A chunk is the unit the context manager compresses, swaps and recomputes: it holds
 * the keys and values of up to 16 tokens for every layer, with the tokens' ids and
 * absolute positions. A sequence (kv_seq) is one context's KV: an ordered list of chunk
 * pointers. The forward pass reads K/V directly from the chunks and appends new
 * entries to the last chunk, then to new chunks taken from the sequence's pool.
 *
 * Chunks come from a kv_pool, which keeps freed chunks for reuse so that appending in
 * the per-token path does not call malloc once the pool has warmed up, and which can
 * limit how many chunks exist at once (a memory budget).
 */
#ifndef LLMS_KV_H
#define LLMS_KV_H

#include <stddef.h>
#include <stdint.h>

#include "engine/err.h"

#define KV_CHUNK_TOKENS 16

/* How a chunk's K/V are stored. Only KV_F16 is implemented; the others are the
 * compressed forms (per-(layer, head, token group) scales in kv_chunk.scales). */
enum kv_precision { KV_F16 = 0, KV_INT8 = 1, KV_INT4 = 2, KV_INT2 = 3 };

/* The dimensions every chunk of a model shares. */
typedef struct kv_shape {
    int n_layer;
    int n_head_kv;
    int head_dim;
} kv_shape;

typedef struct kv_chunk {
    enum kv_precision precision;
    int n_tokens;                          /* entries used, 0..KV_CHUNK_TOKENS, filled in order */
    int32_t tokens[KV_CHUNK_TOKENS];       /* token id of each entry */
    int32_t positions[KV_CHUNK_TOKENS];    /* absolute position of each entry */
    /* KV_F16: IEEE half floats, for each layer and KV head a contiguous block of
     * KV_CHUNK_TOKENS rows of head_dim (rows >= n_tokens are unused). */
    uint16_t *k; /* (n_layer, n_head_kv, KV_CHUNK_TOKENS, head_dim) */
    uint16_t *v; /* (n_layer, n_head_kv, KV_CHUNK_TOKENS, head_dim) */
    float *scales; /* quantized precisions only; NULL for KV_F16 */
} kv_chunk;

/* Offset, in elements, of (layer, head)'s block of KV_CHUNK_TOKENS x head_dim in k / v. */
static inline size_t kv_block_offset(const kv_shape *s, int layer, int head)
{
    return ((size_t)layer * s->n_head_kv + head) * KV_CHUNK_TOKENS * s->head_dim;
}

/* ---- pool: where chunks come from ---- */

typedef struct kv_pool kv_pool;

/* A pool for chunks of the given shape; max_chunks > 0 caps the number of chunks alive
 * at once (kv_chunk_new fails beyond it), 0 means no cap. */
kv_pool *kv_pool_new(kv_shape shape, int max_chunks, char err[ERR_MAX]);

/* Frees the pool and its spare chunks. Every chunk taken from it must be freed first. */
void kv_pool_free(kv_pool *pool);

kv_shape kv_pool_shape(const kv_pool *pool);

/* Chunks alive (taken and not yet returned). */
int kv_pool_n_used(const kv_pool *pool);

/* Bytes of K and V data of one F16 chunk of this shape. */
size_t kv_chunk_bytes(kv_shape shape);

/* An empty F16 chunk (n_tokens 0), reusing a freed one when possible. NULL + err when
 * the cap is reached or memory is exhausted. */
kv_chunk *kv_chunk_new(kv_pool *pool, char err[ERR_MAX]);

/* Gives a chunk back to its pool. NULL is allowed. */
void kv_chunk_free(kv_pool *pool, kv_chunk *chunk);

/* ---- sequence: one context's KV ---- */

typedef struct kv_seq kv_seq;
struct kv_seq {
    kv_pool *pool;       /* where appended chunks come from and freed ones go */
    kv_chunk **chunks;   /* (n_chunks) in the order the entries were appended */
    int n_chunks;
    int cap;             /* allocated length of chunks */
    /* A NULL entry of chunks is a chunk that is not resident. model_forward calls fault
     * for each one before it computes anything (it may use the runner itself): fault
     * must put a chunk there (read or recomputed) or fail, and then so does the forward.
     * NULL fault: a missing chunk fails the forward. */
    int (*fault)(void *arg, kv_seq *seq, int index, char err[ERR_MAX]);
    void *fault_arg;
};

/* An empty sequence drawing chunks from pool. */
void kv_seq_init(kv_seq *seq, kv_pool *pool);

/* Returns all chunks to the pool and releases the chunk array. */
void kv_seq_free(kv_seq *seq);

/* Total entries over all chunks. */
int kv_seq_n_tokens(const kv_seq *seq);

/* Makes room for n more entries: fills the last chunk then adds new chunks from the pool
 * so that appending n entries needs no further allocation. */
int kv_seq_reserve(kv_seq *seq, int n, char err[ERR_MAX]);

/* Appends one entry (token id and position) in space made by kv_seq_reserve, and says
 * where its K/V go: entry *index of *chunk (the caller writes the data for every layer).
 * Returns -1 when no reserved space is left. Allocates nothing. */
int kv_seq_append(kv_seq *seq, int32_t token, int32_t pos, kv_chunk **chunk, int *index);

/* Appends an existing chunk (e.g. one loaded from disk); the sequence owns it afterwards.
 * Entries appended later go to new chunks after it when it is not full. */
int kv_seq_push_chunk(kv_seq *seq, kv_chunk *chunk, char err[ERR_MAX]);

/* Drops entries after the first n (freeing chunks that become empty). */
void kv_seq_truncate(kv_seq *seq, int n);

#endif
