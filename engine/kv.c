/*
 * kv.c — chunk pool and sequences of chunks.
 *
 * The pool keeps returned chunks on a free list so that the forward pass, which takes
 * a new chunk every KV_CHUNK_TOKENS tokens, reuses memory instead of calling malloc.
 */
#include "engine/kv.h"

#include <stdlib.h>
#include <string.h>

struct kv_pool {
    kv_shape shape;
    int max_chunks; /* 0: no cap */
    int n_used;
    kv_chunk **spare; /* (n_spare) freed chunks ready for reuse */
    int n_spare;
    int spare_cap;
};

size_t kv_chunk_bytes(kv_shape s)
{
    return 2 * (size_t)s.n_layer * s.n_head_kv * KV_CHUNK_TOKENS * s.head_dim * sizeof(uint16_t);
}

kv_pool *kv_pool_new(kv_shape shape, int max_chunks, char err[ERR_MAX])
{
    if (shape.n_layer <= 0 || shape.n_head_kv <= 0 || shape.head_dim <= 0) {
        err_set(err, "kv pool: bad shape (%d layers, %d heads, head_dim %d)", shape.n_layer,
                shape.n_head_kv, shape.head_dim);
        return NULL;
    }
    kv_pool *pool = calloc(1, sizeof *pool);
    if (!pool) {
        err_set(err, "kv pool: out of memory");
        return NULL;
    }
    pool->shape = shape;
    pool->max_chunks = max_chunks > 0 ? max_chunks : 0;
    return pool;
}

static void kv_chunk_release(kv_chunk *c)
{
    free(c->k);
    free(c->scales);
    free(c);
}

void kv_pool_free(kv_pool *pool)
{
    if (!pool)
        return;
    for (int i = 0; i < pool->n_spare; i++)
        kv_chunk_release(pool->spare[i]);
    free(pool->spare);
    free(pool);
}

kv_shape kv_pool_shape(const kv_pool *pool)
{
    return pool->shape;
}

int kv_pool_n_used(const kv_pool *pool)
{
    return pool->n_used;
}

kv_chunk *kv_chunk_new(kv_pool *pool, char err[ERR_MAX])
{
    if (pool->max_chunks && pool->n_used >= pool->max_chunks) {
        err_set(err, "kv pool: all %d chunks in use", pool->max_chunks);
        return NULL;
    }
    kv_chunk *c;
    if (pool->n_spare > 0) {
        c = pool->spare[--pool->n_spare];
    } else {
        c = calloc(1, sizeof *c);
        /* K and V share one allocation: v is its second half. */
        uint16_t *data = c ? malloc(kv_chunk_bytes(pool->shape)) : NULL;
        if (!data) {
            free(c);
            err_set(err, "kv pool: out of memory for a chunk (%zu bytes)",
                    kv_chunk_bytes(pool->shape));
            return NULL;
        }
        c->k = data;
        c->v = data + kv_chunk_bytes(pool->shape) / sizeof(uint16_t) / 2;
    }
    c->precision = KV_F16;
    c->n_tokens = 0;
    c->scales = NULL;
    pool->n_used++;
    return c;
}

void kv_chunk_free(kv_pool *pool, kv_chunk *c)
{
    if (!c)
        return;
    pool->n_used--;
    if (pool->n_spare == pool->spare_cap) {
        int cap = pool->spare_cap ? 2 * pool->spare_cap : 16;
        kv_chunk **s = realloc(pool->spare, (size_t)cap * sizeof *s);
        if (!s) {
            kv_chunk_release(c);
            return;
        }
        pool->spare = s;
        pool->spare_cap = cap;
    }
    free(c->scales);
    c->scales = NULL;
    pool->spare[pool->n_spare++] = c;
}

void kv_seq_init(kv_seq *seq, kv_pool *pool)
{
    memset(seq, 0, sizeof *seq);
    seq->pool = pool;
}

void kv_seq_free(kv_seq *seq)
{
    for (int i = 0; i < seq->n_chunks; i++)
        kv_chunk_free(seq->pool, seq->chunks[i]);
    free(seq->chunks);
    seq->chunks = NULL;
    seq->n_chunks = seq->cap = 0;
}

int kv_seq_n_tokens(const kv_seq *seq)
{
    int n = 0;
    for (int i = 0; i < seq->n_chunks; i++)
        n += seq->chunks[i]->n_tokens;
    return n;
}

static int kv_seq_grow(kv_seq *seq, int need, char err[ERR_MAX])
{
    if (need <= seq->cap)
        return 0;
    int cap = seq->cap ? seq->cap : 8;
    while (cap < need)
        cap *= 2;
    kv_chunk **c = realloc(seq->chunks, (size_t)cap * sizeof *c);
    if (!c)
        return err_set(err, "kv sequence: out of memory");
    seq->chunks = c;
    seq->cap = cap;
    return 0;
}

/* Index of the chunk the next entry goes to (may be n_chunks: a chunk must be added). */
static int kv_seq_append_chunk(const kv_seq *seq)
{
    int i = seq->n_chunks;
    while (i > 0 && seq->chunks[i - 1]->n_tokens == 0)
        i--;
    if (i > 0 && seq->chunks[i - 1]->n_tokens < KV_CHUNK_TOKENS)
        i--;
    return i;
}

int kv_seq_reserve(kv_seq *seq, int n, char err[ERR_MAX])
{
    int i = kv_seq_append_chunk(seq);
    int room = 0;
    for (int j = i; j < seq->n_chunks; j++)
        room += KV_CHUNK_TOKENS - seq->chunks[j]->n_tokens;
    int add = room >= n ? 0 : (n - room + KV_CHUNK_TOKENS - 1) / KV_CHUNK_TOKENS;
    if (kv_seq_grow(seq, seq->n_chunks + add, err) < 0)
        return -1;
    for (int j = 0; j < add; j++) {
        kv_chunk *c = kv_chunk_new(seq->pool, err);
        if (!c)
            return -1;
        seq->chunks[seq->n_chunks++] = c;
    }
    return 0;
}

int kv_seq_append(kv_seq *seq, int32_t token, int32_t pos, kv_chunk **chunk, int *index)
{
    int i = kv_seq_append_chunk(seq);
    if (i >= seq->n_chunks)
        return -1;
    kv_chunk *c = seq->chunks[i];
    int e = c->n_tokens++;
    c->tokens[e] = token;
    c->positions[e] = pos;
    *chunk = c;
    *index = e;
    return 0;
}

int kv_seq_push_chunk(kv_seq *seq, kv_chunk *chunk, char err[ERR_MAX])
{
    while (seq->n_chunks > 0 && seq->chunks[seq->n_chunks - 1]->n_tokens == 0)
        kv_chunk_free(seq->pool, seq->chunks[--seq->n_chunks]);
    if (kv_seq_grow(seq, seq->n_chunks + 1, err) < 0)
        return -1;
    seq->chunks[seq->n_chunks++] = chunk;
    return 0;
}

void kv_seq_truncate(kv_seq *seq, int n)
{
    int kept = 0, i = 0;
    for (; i < seq->n_chunks; i++) {
        kv_chunk *c = seq->chunks[i];
        if (kept + c->n_tokens > n)
            c->n_tokens = n - kept;
        kept += c->n_tokens;
        if (c->n_tokens == 0 && kept >= n)
            break;
    }
    for (int j = i; j < seq->n_chunks; j++)
        kv_chunk_free(seq->pool, seq->chunks[j]);
    if (i < seq->n_chunks)
        seq->n_chunks = i;
}
