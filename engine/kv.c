/*
 * kv.c — chunk pool, chunk precisions and sequences of chunks.
 *
 * The pool keeps returned chunk structs and data buffers (one spare list per precision)
 * so that the forward pass, which takes a new chunk every KV_CHUNK_TOKENS tokens, and the
 * context manager, which converts chunks between precisions, reuse memory instead of
 * calling malloc.
 */
#include "engine/kv.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kv_quant.h"
#include "engine/ops.h"
#include "engine/quant.h"

typedef struct kv_spares {
    void **items; /* (n) */
    int n;
    int cap;
} kv_spares;

struct kv_pool {
    kv_shape shape;
    int max_chunks; /* 0: no cap */
    int n_used;
    size_t bytes_used;
    size_t bytes_by_precision[KV_N_PRECISIONS]; /* bytes_used split by precision */
    kv_spares structs;                 /* kv_chunk without data */
    kv_spares data[KV_N_PRECISIONS];   /* buffers of kv_chunk_data_bytes(shape, p) */
    float *scratch;                    /* (2, KV_CHUNK_TOKENS, head_dim) for conversions */
};

int kv_precision_bits(enum kv_precision p)
{
    static const int bits[KV_N_PRECISIONS] = {16, 8, 4, 2};
    return (unsigned)p < KV_N_PRECISIONS ? bits[p] : 0;
}

const char *kv_precision_name(enum kv_precision p)
{
    static const char *names[KV_N_PRECISIONS] = {"f16", "int8", "int4", "int2"};
    return (unsigned)p < KV_N_PRECISIONS ? names[p] : "?";
}

static size_t kv_f16_block_elems(kv_shape s)
{
    return (size_t)KV_CHUNK_TOKENS * s.head_dim;
}

size_t kv_chunk_layer_bytes(kv_shape s, enum kv_precision p)
{
    if (p == KV_F16)
        return 2 * (size_t)s.n_head_kv * kv_f16_block_elems(s) * sizeof(uint16_t);
    return (size_t)s.n_head_kv * kv_quant_block_bytes(s.head_dim, kv_precision_bits(p));
}

size_t kv_chunk_data_bytes(kv_shape s, enum kv_precision p)
{
    return (size_t)s.n_layer * kv_chunk_layer_bytes(s, p);
}

uint16_t *kv_chunk_k_f16(const kv_chunk *c, kv_shape s, int layer, int head)
{
    return (uint16_t *)kv_chunk_layer(c, s, layer) + (size_t)head * kv_f16_block_elems(s);
}

uint16_t *kv_chunk_v_f16(const kv_chunk *c, kv_shape s, int layer, int head)
{
    return (uint16_t *)kv_chunk_layer(c, s, layer) +
           ((size_t)s.n_head_kv + head) * kv_f16_block_elems(s);
}

static const uint8_t *kv_chunk_quant_block(const kv_chunk *c, kv_shape s, int layer, int head)
{
    return kv_chunk_layer(c, s, layer) +
           (size_t)head * kv_quant_block_bytes(s.head_dim, kv_precision_bits(c->precision));
}

void kv_chunk_read_f32(const kv_chunk *c, kv_shape s, int layer, int head, float *k, float *v)
{
    int64_t n = (int64_t)c->n_tokens * s.head_dim;
    if (c->precision == KV_F16) {
        if (k)
            quant_dequantize_row(QTYPE_F16, kv_chunk_k_f16(c, s, layer, head), k, n);
        if (v)
            quant_dequantize_row(QTYPE_F16, kv_chunk_v_f16(c, s, layer, head), v, n);
        return;
    }
    kv_quant_decode(kv_chunk_quant_block(c, s, layer, head), s.head_dim,
                    kv_precision_bits(c->precision), c->n_tokens, k, v);
}

/* ---- pool ---- */

static void *kv_spares_take(kv_spares *s)
{
    return s->n > 0 ? s->items[--s->n] : NULL;
}

/* Keeps item for reuse, or frees it when the list is full or cannot grow. */
static void kv_spares_put(kv_spares *s, void *item)
{
    if (s->n == s->cap && s->cap < KV_POOL_SPARE_MAX) {
        int cap = s->cap ? 2 * s->cap : 8;
        cap = cap < KV_POOL_SPARE_MAX ? cap : KV_POOL_SPARE_MAX;
        void **items = realloc(s->items, (size_t)cap * sizeof *items);
        if (items) {
            s->items = items;
            s->cap = cap;
        }
    }
    if (s->n < s->cap)
        s->items[s->n++] = item;
    else
        free(item);
}

size_t kv_pool_spare_bytes(const kv_pool *pool)
{
    size_t n = 0;
    for (int p = 0; p < KV_N_PRECISIONS; p++)
        n += (size_t)pool->data[p].n * kv_chunk_data_bytes(pool->shape, (enum kv_precision)p);
    return n;
}

void kv_pool_trim_spares(kv_pool *pool, size_t keep)
{
    size_t have = kv_pool_spare_bytes(pool);
    for (int p = 0; p < KV_N_PRECISIONS && have > keep; p++) {
        kv_spares *s = &pool->data[p];
        size_t each = kv_chunk_data_bytes(pool->shape, (enum kv_precision)p);
        while (s->n > 0 && have > keep) {
            free(s->items[--s->n]);
            have -= each;
        }
    }
}

static void kv_spares_free(kv_spares *s)
{
    for (int i = 0; i < s->n; i++)
        free(s->items[i]);
    free(s->items);
}

kv_pool *kv_pool_new(kv_shape shape, int max_chunks, char err[ERR_MAX])
{
    if (shape.n_layer <= 0 || shape.n_head_kv <= 0 || shape.head_dim <= 0 ||
        shape.n_layer > 1 << 16 || shape.n_head_kv > 1 << 16 ||
        shape.head_dim > KV_MAX_HEAD_DIM) {
        err_set(err, "kv pool: bad shape (%d layers, %d heads, head_dim %d)", shape.n_layer,
                shape.n_head_kv, shape.head_dim);
        return NULL;
    }
    kv_pool *pool = calloc(1, sizeof *pool);
    float *scratch = malloc(2 * kv_f16_block_elems(shape) * sizeof(float));
    if (!pool || !scratch) {
        free(pool);
        free(scratch);
        err_set(err, "kv pool: out of memory");
        return NULL;
    }
    pool->shape = shape;
    pool->max_chunks = max_chunks > 0 ? max_chunks : 0;
    pool->scratch = scratch;
    return pool;
}

void kv_pool_free(kv_pool *pool)
{
    if (!pool)
        return;
    kv_spares_free(&pool->structs);
    for (int p = 0; p < KV_N_PRECISIONS; p++)
        kv_spares_free(&pool->data[p]);
    free(pool->scratch);
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

size_t kv_pool_bytes_used(const kv_pool *pool)
{
    return pool->bytes_used;
}

size_t kv_pool_bytes_at(const kv_pool *pool, enum kv_precision p)
{
    return (unsigned)p < KV_N_PRECISIONS ? pool->bytes_by_precision[p] : 0;
}

static uint8_t *kv_data_take(kv_pool *pool, enum kv_precision p)
{
    uint8_t *d = kv_spares_take(&pool->data[p]);
    return d ? d : malloc(kv_chunk_data_bytes(pool->shape, p));
}

kv_chunk *kv_chunk_new_precision(kv_pool *pool, enum kv_precision p, char err[ERR_MAX])
{
    if ((unsigned)p >= KV_N_PRECISIONS) {
        err_set(err, "kv pool: unknown precision %d", (int)p);
        return NULL;
    }
    if (pool->max_chunks && pool->n_used >= pool->max_chunks) {
        err_set(err, "kv pool: all %d chunks in use", pool->max_chunks);
        return NULL;
    }
    kv_chunk *c = kv_spares_take(&pool->structs);
    if (!c)
        c = malloc(sizeof *c);
    uint8_t *data = c ? kv_data_take(pool, p) : NULL;
    if (!data) {
        free(c);
        err_set(err, "kv pool: out of memory for a chunk (%zu bytes)",
                kv_chunk_data_bytes(pool->shape, p));
        return NULL;
    }
    memset(c, 0, sizeof *c);
    c->precision = p;
    c->data = data;
    pool->n_used++;
    pool->bytes_used += kv_chunk_data_bytes(pool->shape, p);
    pool->bytes_by_precision[p] += kv_chunk_data_bytes(pool->shape, p);
    return c;
}

kv_chunk *kv_chunk_new(kv_pool *pool, char err[ERR_MAX])
{
    return kv_chunk_new_precision(pool, KV_F16, err);
}

void kv_chunk_free(kv_pool *pool, kv_chunk *c)
{
    if (!c)
        return;
    pool->n_used--;
    pool->bytes_used -= kv_chunk_data_bytes(pool->shape, c->precision);
    pool->bytes_by_precision[c->precision] -= kv_chunk_data_bytes(pool->shape, c->precision);
    kv_spares_put(&pool->data[c->precision], c->data);
    kv_spares_put(&pool->structs, c);
}

/* Writes the first n rows of k and v (n, head_dim) as (layer, head)'s block of data,
 * a chunk buffer of precision p; rows >= n become zero. */
static void kv_block_write(kv_shape s, enum kv_precision p, uint8_t *data, int layer, int head,
                           int n, const float *k, const float *v)
{
    uint8_t *sec = data + (size_t)layer * kv_chunk_layer_bytes(s, p);
    if (p != KV_F16) {
        int bits = kv_precision_bits(p);
        kv_quant_encode(sec + (size_t)head * kv_quant_block_bytes(s.head_dim, bits), s.head_dim,
                        bits, n, k, v);
        return;
    }
    size_t blk = kv_f16_block_elems(s), used = (size_t)n * s.head_dim;
    uint16_t *kd = (uint16_t *)sec + (size_t)head * blk;
    uint16_t *vd = (uint16_t *)sec + ((size_t)s.n_head_kv + head) * blk;
    for (size_t i = 0; i < used; i++) {
        kd[i] = quant_f32_to_f16(k[i]);
        vd[i] = quant_f32_to_f16(v[i]);
    }
    memset(kd + used, 0, (blk - used) * sizeof *kd);
    memset(vd + used, 0, (blk - used) * sizeof *vd);
}

int kv_chunk_convert(kv_pool *pool, kv_chunk *c, enum kv_precision p, char err[ERR_MAX])
{
    if ((unsigned)p >= KV_N_PRECISIONS)
        return err_set(err, "kv chunk: unknown precision %d", (int)p);
    if (c->precision == p)
        return 0;
    kv_shape s = pool->shape;
    uint8_t *data = kv_data_take(pool, p);
    if (!data)
        return err_set(err, "kv chunk: out of memory converting to %s (%zu bytes)",
                       kv_precision_name(p), kv_chunk_data_bytes(s, p));
    float *k = pool->scratch, *v = pool->scratch + kv_f16_block_elems(s);
    for (int l = 0; l < s.n_layer; l++)
        for (int h = 0; h < s.n_head_kv; h++) {
            kv_chunk_read_f32(c, s, l, h, k, v);
            kv_block_write(s, p, data, l, h, c->n_tokens, k, v);
        }
    pool->bytes_used += kv_chunk_data_bytes(s, p);
    pool->bytes_used -= kv_chunk_data_bytes(s, c->precision);
    pool->bytes_by_precision[p] += kv_chunk_data_bytes(s, p);
    pool->bytes_by_precision[c->precision] -= kv_chunk_data_bytes(s, c->precision);
    kv_spares_put(&pool->data[c->precision], c->data);
    c->data = data;
    c->precision = p;
    return 0;
}

/* ---- tolerance-aware precisions ---- */

static int kv_by_density_desc(const void *a, const void *b, void *keys)
{
    int i = *(const int *)a, j = *(const int *)b;
    float x = ((const float *)keys)[i], y = ((const float *)keys)[j];
    if (x != y)
        return x > y ? -1 : 1;
    return (i > j) - (i < j);
}

void kv_assign_precisions(const float *density, int n, double ratio, enum kv_precision *out)
{
    if (n <= 0)
        return;
    ratio = ratio < 0.25 ? 0.25 : ratio > 1 ? 1 : ratio;
    /* budget in units of 2 bits per chunk: int8 costs 4, int4 2, int2 1 */
    long budget = (long)(4.0 * ratio * n + 1e-9);
    int *order = malloc((size_t)n * sizeof *order);
    double *sum = malloc(((size_t)n + 1) * sizeof *sum); /* sum[k]: k densest */
    if (!order || !sum) {
        enum kv_precision p = budget >= 4L * n ? KV_INT8 : budget >= 2L * n ? KV_INT4 : KV_INT2;
        for (int i = 0; i < n; i++)
            out[i] = p;
        free(order);
        free(sum);
        return;
    }
    for (int i = 0; i < n; i++)
        order[i] = i;
    qsort_r(order, (size_t)n, sizeof *order, kv_by_density_desc, (void *)density);
    sum[0] = 0;
    for (int i = 0; i < n; i++)
        sum[i + 1] = sum[i] + density[order[i]];

    /* Minimises the attention-weighted squared error sum_i density_i * step(bits_i)^2,
     * step(b) = 1 / (2^b - 1) the code step relative to a group's range: with the n8
     * densest at int8, the next n4 at int4 and the rest at int2 that is
     * e2 S(n) + (e4 - e2) S(n8 + n4) + (e8 - e4) S(n8), under the cost
     * 4 n8 + 2 n4 + (n - n8 - n4) <= budget. */
    const double e8 = 1.0 / (255.0 * 255.0), e4 = 1.0 / (15.0 * 15.0), e2 = 1.0 / 9.0;
    int best8 = 0, best4 = 0;
    double best = 1e300, tol = 1e-12 * (fabs(sum[n]) + 1e-30);
    for (int n8 = 0; n8 <= n; n8++) {
        long left = budget - (long)n - 3L * n8;
        if (left < 0)
            break;
        for (int n4 = 0; n4 <= n - n8 && n4 <= left; n4++) {
            double cost = e2 * sum[n] + (e4 - e2) * sum[n8 + n4] + (e8 - e4) * sum[n8];
            int n2 = n - n8 - n4, best2 = n - best8 - best4;
            if (cost < best - tol || (cost <= best + tol && n2 < best2)) {
                best = cost < best ? cost : best;
                best8 = n8;
                best4 = n4;
            }
        }
    }
    for (int r = 0; r < n; r++)
        out[order[r]] = r < best8 ? KV_INT8 : r < best8 + best4 ? KV_INT4 : KV_INT2;
    free(order);
    free(sum);
}

/* ---- sequences ---- */

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

static int kv_slot_tokens(const kv_chunk *c)
{
    return c ? c->n_tokens : KV_CHUNK_TOKENS;
}

int kv_seq_n_tokens(const kv_seq *seq)
{
    int n = 0;
    for (int i = 0; i < seq->n_chunks; i++)
        n += kv_slot_tokens(seq->chunks[i]);
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
    while (i > 0 && kv_slot_tokens(seq->chunks[i - 1]) == 0)
        i--;
    if (i > 0 && kv_slot_tokens(seq->chunks[i - 1]) < KV_CHUNK_TOKENS)
        i--;
    return i;
}

int kv_seq_reserve(kv_seq *seq, int n, char err[ERR_MAX])
{
    int i = kv_seq_append_chunk(seq);
    if (i < seq->n_chunks && seq->chunks[i]->precision != KV_F16 &&
        kv_chunk_convert(seq->pool, seq->chunks[i], KV_F16, err) < 0)
        return -1;
    int room = 0;
    for (int j = i; j < seq->n_chunks; j++)
        room += KV_CHUNK_TOKENS - kv_slot_tokens(seq->chunks[j]);
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
    if (c->precision != KV_F16)
        return -1;
    int e = c->n_tokens++;
    c->tokens[e] = token;
    c->positions[e] = pos;
    *chunk = c;
    *index = e;
    return 0;
}

int kv_seq_push_chunk(kv_seq *seq, kv_chunk *chunk, char err[ERR_MAX])
{
    while (seq->n_chunks > 0 && kv_slot_tokens(seq->chunks[seq->n_chunks - 1]) == 0)
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
        if (kept + kv_slot_tokens(c) > n) {
            if (!c)
                break;
            c->n_tokens = n - kept;
        }
        kept += kv_slot_tokens(c);
        if (kv_slot_tokens(c) == 0 && kept >= n)
            break;
    }
    for (int j = i; j < seq->n_chunks; j++)
        kv_chunk_free(seq->pool, seq->chunks[j]);
    if (i < seq->n_chunks)
        seq->n_chunks = i;
}
