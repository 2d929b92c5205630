/*
 * kv.c — chunk pool, chunk precisions and sequences of chunks.
 *
 * The pool keeps returned chunk structs and data buffers (one spare list per precision)
 * so that the forward pass, which takes a new chunk every KV_CHUNK_TOKENS tokens, and the
 * context manager, which converts chunks between precisions, reuse memory instead of
 * calling malloc.
 */
#include "engine/kv/kv.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kv/kv_quant.h"
#include "engine/model/ops.h"
#include "engine/quant/quant.h"

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
    size_t bytes_by_precision[KV_PRECISION_END]; /* bytes_used split by precision */
    kv_spares structs;                 /* kv_chunk without data */
    kv_spares data[KV_PRECISION_END];   /* buffers of kv_chunk_data_bytes(shape, p) */
    float *scratch;                    /* (2, KV_CHUNK_TOKENS, head_dim) for conversions */
};

static const int kv_widths[KV_N_WIDTHS] = {2, 3, 4, 5, 6, 8};

int kv_precision_valid(int p)
{
    return p == KV_F16 || (p >= KV_INT_FIRST && p < KV_PRECISION_END);
}

bool kv_precision_v_block(enum kv_precision p)
{
    return p >= KV_VBLOCK_FIRST && p < KV_PRECISION_END;
}

/* KV_N_WIDTHS * index(k) + index(v) of an integer precision of either layout. */
static int kv_width_pair(enum kv_precision p)
{
    return (int)p - (kv_precision_v_block(p) ? KV_VBLOCK_FIRST : KV_INT_FIRST);
}

int kv_precision_k_bits(enum kv_precision p)
{
    if (p == KV_F16)
        return 16;
    return kv_precision_valid(p) ? kv_widths[kv_width_pair(p) / KV_N_WIDTHS] : 0;
}

int kv_precision_v_bits(enum kv_precision p)
{
    if (p == KV_F16)
        return 16;
    return kv_precision_valid(p) ? kv_widths[kv_width_pair(p) % KV_N_WIDTHS] : 0;
}

int kv_precision_bits(enum kv_precision p)
{
    return (kv_precision_k_bits(p) + kv_precision_v_bits(p)) / 2;
}

static int kv_width_index(int bits)
{
    for (int i = 0; i < KV_N_WIDTHS; i++)
        if (kv_widths[i] == bits)
            return i;
    return -1;
}

int kv_precision_layout_of(int k_bits, int v_bits, bool v_block)
{
    int k = kv_width_index(k_bits), v = kv_width_index(v_bits);
    return k < 0 || v < 0 ? -1
                          : (v_block ? KV_VBLOCK_FIRST : KV_INT_FIRST) + KV_N_WIDTHS * k + v;
}

int kv_precision_of(int k_bits, int v_bits)
{
    return kv_precision_layout_of(k_bits, v_bits, false);
}

const char *kv_precision_name(enum kv_precision p)
{
    static const char *names[KV_PRECISION_END - KV_INT_FIRST] = {
        "int2", "k2v3", "k2v4", "k2v5", "k2v6", "k2v8",
        "k3v2", "int3", "k3v4", "k3v5", "k3v6", "k3v8",
        "k4v2", "k4v3", "int4", "k4v5", "k4v6", "k4v8",
        "k5v2", "k5v3", "k5v4", "int5", "k5v6", "k5v8",
        "k6v2", "k6v3", "k6v4", "k6v5", "int6", "k6v8",
        "k8v2", "k8v3", "k8v4", "k8v5", "k8v6", "int8",
        "k2v2b", "k2v3b", "k2v4b", "k2v5b", "k2v6b", "k2v8b",
        "k3v2b", "k3v3b", "k3v4b", "k3v5b", "k3v6b", "k3v8b",
        "k4v2b", "k4v3b", "k4v4b", "k4v5b", "k4v6b", "k4v8b",
        "k5v2b", "k5v3b", "k5v4b", "k5v5b", "k5v6b", "k5v8b",
        "k6v2b", "k6v3b", "k6v4b", "k6v5b", "k6v6b", "k6v8b",
        "k8v2b", "k8v3b", "k8v4b", "k8v5b", "k8v6b", "k8v8b"};
    if (p == KV_F16)
        return "f16";
    return kv_precision_valid(p) ? names[p - KV_INT_FIRST] : "?";
}

static size_t kv_f16_block_elems(kv_shape s)
{
    return (size_t)KV_CHUNK_TOKENS * s.head_dim;
}

/* The block format of an integer precision: K alone where V is K. */
static kv_quant_format kv_format(kv_shape s, enum kv_precision p)
{
    return (kv_quant_format){kv_precision_k_bits(p), s.shared_kv ? 0 : kv_precision_v_bits(p),
                             kv_precision_v_block(p)};
}

size_t kv_chunk_layer_bytes(kv_shape s, enum kv_precision p)
{
    if (p == KV_F16)
        return (s.shared_kv ? 1 : 2) * (size_t)s.n_head_kv * kv_f16_block_elems(s) *
               sizeof(uint16_t);
    return (size_t)s.n_head_kv * kv_quant_block_bytes(s.head_dim, kv_format(s, p));
}

size_t kv_chunk_data_bytes(kv_shape s, enum kv_precision p)
{
    return (size_t)s.n_layer * kv_chunk_layer_bytes(s, p);
}

size_t kv_layers_data_bytes(kv_shape s, const uint8_t *layers)
{
    size_t n = 0;
    for (int l = 0; l < s.n_layer; l++)
        n += kv_chunk_layer_bytes(s, (enum kv_precision)layers[l]);
    return n;
}

size_t kv_chunk_bytes(kv_shape s, const kv_chunk *c)
{
    return c->precision == KV_MIXED ? kv_layers_data_bytes(s, c->layer_precision)
                                    : kv_chunk_data_bytes(s, c->precision);
}

/* The precision every entry of layers has, or KV_MIXED. */
static enum kv_precision kv_layers_uniform(kv_shape s, const uint8_t *layers)
{
    for (int l = 1; l < s.n_layer; l++)
        if (layers[l] != layers[0])
            return KV_MIXED;
    return (enum kv_precision)layers[0];
}

/* Offset of layer's section in a buffer of layers' precisions (uniform: p). */
static size_t kv_section_offset(kv_shape s, enum kv_precision p, const uint8_t *layers,
                                int layer)
{
    if (p != KV_MIXED)
        return (size_t)layer * kv_chunk_layer_bytes(s, p);
    size_t off = 0;
    for (int l = 0; l < layer; l++)
        off += kv_chunk_layer_bytes(s, (enum kv_precision)layers[l]);
    return off;
}

uint8_t *kv_chunk_layer(const kv_chunk *c, kv_shape s, int layer)
{
    return c->data + kv_section_offset(s, c->precision, c->layer_precision, layer);
}

bool kv_chunk_has_layers(const kv_chunk *c, kv_shape s, const uint8_t *layers)
{
    return memcmp(c->layer_precision, layers, (size_t)s.n_layer) == 0;
}

uint16_t *kv_chunk_k_f16(const kv_chunk *c, kv_shape s, int layer, int head)
{
    return (uint16_t *)kv_chunk_layer(c, s, layer) + (size_t)head * kv_f16_block_elems(s);
}

uint16_t *kv_chunk_v_f16(const kv_chunk *c, kv_shape s, int layer, int head)
{
    if (s.shared_kv)
        return kv_chunk_k_f16(c, s, layer, head);
    return (uint16_t *)kv_chunk_layer(c, s, layer) +
           ((size_t)s.n_head_kv + head) * kv_f16_block_elems(s);
}

void kv_chunk_read_f32(const kv_chunk *c, kv_shape s, int layer, int head, float *k, float *v)
{
    int64_t n = (int64_t)c->n_tokens * s.head_dim;
    enum kv_precision p = (enum kv_precision)c->layer_precision[layer];
    if (p == KV_F16) {
        if (k)
            quant_dequantize_row(QTYPE_F16, kv_chunk_k_f16(c, s, layer, head), k, n);
        if (v)
            quant_dequantize_row(QTYPE_F16, kv_chunk_v_f16(c, s, layer, head), v, n);
        return;
    }
    kv_quant_format f = kv_format(s, p);
    const uint8_t *blk =
        kv_chunk_layer(c, s, layer) + (size_t)head * kv_quant_block_bytes(s.head_dim, f);
    if (!s.shared_kv) {
        kv_quant_decode(blk, s.head_dim, f, c->n_tokens, k, v);
        return;
    }
    /* V is K: decoded once, copied where both are asked for */
    kv_quant_decode(blk, s.head_dim, f, c->n_tokens, k ? k : v, NULL);
    if (k && v)
        memcpy(v, k, (size_t)n * sizeof *v);
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
    for (int p = 0; p < KV_PRECISION_END; p++)
        n += (size_t)pool->data[p].n * kv_chunk_data_bytes(pool->shape, (enum kv_precision)p);
    return n;
}

void kv_pool_trim_spares(kv_pool *pool, size_t keep)
{
    size_t have = kv_pool_spare_bytes(pool);
    for (int p = 0; p < KV_PRECISION_END && have > keep; p++) {
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
        shape.n_layer > KV_MAX_LAYERS || shape.n_head_kv > 1 << 16 ||
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
    for (int p = 0; p < KV_PRECISION_END; p++)
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
    return kv_precision_valid(p) ? pool->bytes_by_precision[p] : 0;
}

/* A buffer for layers' precisions (p: the uniform one or KV_MIXED). Only uniform
 * buffers are kept for reuse: the mixed ones are as many sizes as there are mixes, and
 * only the context manager's conversions make them, not the per-token path. */
static uint8_t *kv_data_take(kv_pool *pool, enum kv_precision p, const uint8_t *layers)
{
    uint8_t *d = p == KV_MIXED ? NULL : kv_spares_take(&pool->data[p]);
    return d ? d : malloc(kv_layers_data_bytes(pool->shape, layers));
}

static void kv_data_put(kv_pool *pool, enum kv_precision p, uint8_t *data)
{
    if (p == KV_MIXED)
        free(data);
    else
        kv_spares_put(&pool->data[p], data);
}

/* Adds c's bytes to the pool's counts (add), or takes them off, by layer precision. */
static void kv_pool_count(kv_pool *pool, const kv_chunk *c, bool add)
{
    for (int l = 0; l < pool->shape.n_layer; l++) {
        enum kv_precision p = (enum kv_precision)c->layer_precision[l];
        size_t b = kv_chunk_layer_bytes(pool->shape, p);
        if (add) {
            pool->bytes_used += b;
            pool->bytes_by_precision[p] += b;
        } else {
            pool->bytes_used -= b;
            pool->bytes_by_precision[p] -= b;
        }
    }
}

static bool kv_layers_valid(kv_shape s, const uint8_t *layers)
{
    for (int l = 0; l < s.n_layer; l++)
        if (!kv_precision_valid(layers[l]))
            return false;
    return true;
}

kv_chunk *kv_chunk_new_precision(kv_pool *pool, enum kv_precision p, char err[ERR_MAX])
{
    if (!kv_precision_valid(p)) {
        err_set(err, "kv pool: unknown precision %d", (int)p);
        return NULL;
    }
    uint8_t layers[KV_MAX_LAYERS];
    memset(layers, (int)p, sizeof layers);
    return kv_chunk_new_layers(pool, layers, err);
}

kv_chunk *kv_chunk_new_layers(kv_pool *pool, const uint8_t *layers, char err[ERR_MAX])
{
    if (!kv_layers_valid(pool->shape, layers)) {
        err_set(err, "kv pool: unknown precision in a chunk's layers");
        return NULL;
    }
    enum kv_precision p = kv_layers_uniform(pool->shape, layers);
    if (pool->max_chunks && pool->n_used >= pool->max_chunks) {
        err_set(err, "kv pool: all %d chunks in use", pool->max_chunks);
        return NULL;
    }
    kv_chunk *c = kv_spares_take(&pool->structs);
    if (!c)
        c = malloc(sizeof *c);
    uint8_t *data = c ? kv_data_take(pool, p, layers) : NULL;
    if (!data) {
        free(c);
        err_set(err, "kv pool: out of memory for a chunk (%zu bytes)",
                kv_layers_data_bytes(pool->shape, layers));
        return NULL;
    }
    memset(c, 0, sizeof *c);
    c->precision = p;
    memcpy(c->layer_precision, layers, (size_t)pool->shape.n_layer);
    c->data = data;
    pool->n_used++;
    kv_pool_count(pool, c, true);
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
    kv_pool_count(pool, c, false);
    kv_data_put(pool, c->precision, c->data);
    kv_spares_put(&pool->structs, c);
}

/* Writes the first n rows of k and v (n, head_dim) as head's block of sec, a layer
 * section of precision p; rows >= n become zero. */
static void kv_block_write(kv_shape s, enum kv_precision p, uint8_t *sec, int head, int n,
                           const float *k, const float *v)
{
    if (p != KV_F16) {
        kv_quant_format f = kv_format(s, p);
        kv_quant_encode(sec + (size_t)head * kv_quant_block_bytes(s.head_dim, f), s.head_dim,
                        f, n, k, v);
        return;
    }
    size_t blk = kv_f16_block_elems(s), used = (size_t)n * s.head_dim;
    uint16_t *kd = (uint16_t *)sec + (size_t)head * blk;
    for (size_t i = 0; i < used; i++)
        kd[i] = quant_f32_to_f16(k[i]);
    memset(kd + used, 0, (blk - used) * sizeof *kd);
    if (s.shared_kv)
        return;
    uint16_t *vd = (uint16_t *)sec + ((size_t)s.n_head_kv + head) * blk;
    for (size_t i = 0; i < used; i++)
        vd[i] = quant_f32_to_f16(v[i]);
    memset(vd + used, 0, (blk - used) * sizeof *vd);
}

int kv_chunk_convert(kv_pool *pool, kv_chunk *c, enum kv_precision p, char err[ERR_MAX])
{
    if (!kv_precision_valid(p))
        return err_set(err, "kv chunk: unknown precision %d", (int)p);
    uint8_t layers[KV_MAX_LAYERS];
    memset(layers, (int)p, sizeof layers);
    return kv_chunk_convert_layers(pool, c, layers, err);
}

int kv_chunk_convert_layers(kv_pool *pool, kv_chunk *c, const uint8_t *layers,
                            char err[ERR_MAX])
{
    kv_shape s = pool->shape;
    if (!kv_layers_valid(s, layers))
        return err_set(err, "kv chunk: unknown precision in a chunk's layers");
    if (kv_chunk_has_layers(c, s, layers))
        return 0;
    enum kv_precision p = kv_layers_uniform(s, layers);
    uint8_t *data = kv_data_take(pool, p, layers);
    if (!data)
        return err_set(err, "kv chunk: out of memory converting to %s (%zu bytes)",
                       p == KV_MIXED ? "mixed layers" : kv_precision_name(p),
                       kv_layers_data_bytes(s, layers));
    float *k = pool->scratch, *v = pool->scratch + kv_f16_block_elems(s);
    for (int l = 0; l < s.n_layer; l++) {
        uint8_t *sec = data + kv_section_offset(s, p, layers, l);
        for (int h = 0; h < s.n_head_kv; h++) {
            kv_chunk_read_f32(c, s, l, h, k, v);
            kv_block_write(s, (enum kv_precision)layers[l], sec, h, c->n_tokens, k, v);
        }
    }
    kv_pool_count(pool, c, false);
    kv_data_put(pool, c->precision, c->data);
    c->data = data;
    c->precision = p;
    memcpy(c->layer_precision, layers, (size_t)s.n_layer);
    kv_pool_count(pool, c, true);
    return 0;
}

/* ---- tolerance-aware precisions ---- */

/* kv_chunk_spread over layers [from, to). */
static void kv_spread_layers(kv_pool *pool, const kv_chunk *c, int from, int to,
                             float *k_spread, float *v_spread, float *vb_spread)
{
    kv_shape s = pool->shape;
    int hd = s.head_dim, n = c->n_tokens;
    float *k = pool->scratch, *v = pool->scratch + kv_f16_block_elems(s);
    double ks = 0, vs = 0, vbs = 0;
    long nk = 0, nv = 0, nvb = 0;
    for (int l = from; l < to && n > 0; l++)
        for (int h = 0; h < s.n_head_kv; h++) {
            kv_chunk_read_f32(c, s, l, h, k, v);
            for (int j = 0; j < hd; j++, nk++) {
                float lo = k[j], hi = k[j];
                for (int i = 1; i < n; i++) {
                    float x = k[(size_t)i * hd + j];
                    lo = x < lo ? x : lo;
                    hi = x > hi ? x : hi;
                }
                ks += (double)(hi - lo) * (hi - lo);
            }
            float block_lo = v[0], block_hi = v[0];
            for (int i = 0; i < n; i++)
                for (int j0 = 0; j0 < hd; j0 += KV_QUANT_V_GROUP, nv++) {
                    const float *row = v + (size_t)i * hd;
                    int j1 = j0 + KV_QUANT_V_GROUP < hd ? j0 + KV_QUANT_V_GROUP : hd;
                    float lo = row[j0], hi = row[j0];
                    for (int j = j0 + 1; j < j1; j++) {
                        lo = row[j] < lo ? row[j] : lo;
                        hi = row[j] > hi ? row[j] : hi;
                    }
                    vs += (double)(hi - lo) * (hi - lo);
                    block_lo = lo < block_lo ? lo : block_lo;
                    block_hi = hi > block_hi ? hi : block_hi;
                }
            vbs += (double)(block_hi - block_lo) * (block_hi - block_lo);
            nvb++;
        }
    *k_spread = nk ? (float)(ks / (double)nk) : 0;
    *v_spread = nv ? (float)(vs / (double)nv) : 0;
    *vb_spread = nvb ? (float)(vbs / (double)nvb) : 0;
}

void kv_chunk_spread(kv_pool *pool, const kv_chunk *c, float *k_spread, float *v_spread,
                     float *vb_spread)
{
    kv_spread_layers(pool, c, 0, pool->shape.n_layer, k_spread, v_spread, vb_spread);
}

void kv_chunk_layer_spread(kv_pool *pool, const kv_chunk *c, int layer, float *k_spread,
                           float *v_spread, float *vb_spread)
{
    kv_spread_layers(pool, c, layer, layer + 1, k_spread, v_spread, vb_spread);
}

/* A chunk's next widening in the greedy assignment: error saved per byte it costs. */
typedef struct kv_step {
    double gain;
    int chunk;
} kv_step;


static double kv_width_error(int bits)
{
    double top = (double)((1 << bits) - 1);
    return 1.0 / (top * top);
}

/* A V choice: width index w (0..KV_N_WIDTHS-1), + KV_N_WIDTHS for the block layout. */
#define KV_V_CHOICES (2 * KV_N_WIDTHS)

/* The precision of K width index ik and V choice vc. */
static enum kv_precision kv_choice_precision(int ik, int vc)
{
    return (vc >= KV_N_WIDTHS ? KV_VBLOCK_FIRST : KV_INT_FIRST) + KV_N_WIDTHS * ik +
           vc % KV_N_WIDTHS;
}

/* Predicted error of a chunk's V under choice vc (before the density weight). */
static double kv_v_error(const kv_chunk_stats *st, int vc)
{
    double spread = vc >= KV_N_WIDTHS ? st->vb_spread : st->v_spread;
    return spread * kv_width_error(kv_widths[vc % KV_N_WIDTHS]);
}

/*
 * Writes into chain the V choices on the lower convex hull of (bytes, error) for one
 * chunk, cheapest first, and returns their count: the steps along it save less error per
 * byte each, which the greedy needs. The bytes of V choices differ as the chunk's bytes
 * do at any one K width.
 */
static int kv_v_chain(kv_shape shape, const kv_chunk_stats *st, bool v_block,
                      uint8_t chain[KV_V_CHOICES])
{
    int n_choices = v_block ? KV_V_CHOICES : KV_N_WIDTHS, order[KV_V_CHOICES];
    double bytes[KV_V_CHOICES], error[KV_V_CHOICES];
    for (int vc = 0; vc < n_choices; vc++) {
        bytes[vc] = (double)kv_chunk_data_bytes(shape, kv_choice_precision(0, vc));
        error[vc] = kv_v_error(st, vc);
        int at = vc; /* insertion sort by bytes, then error */
        while (at > 0 && (bytes[order[at - 1]] > bytes[vc] ||
                          (bytes[order[at - 1]] == bytes[vc] && error[order[at - 1]] > error[vc]))) {
            order[at] = order[at - 1];
            at--;
        }
        order[at] = vc;
    }
    int len = 0;
    for (int i = 0; i < n_choices; i++) {
        int c = order[i];
        if (len > 0 && !(error[c] < error[chain[len - 1]]))
            continue; /* no better than a cheaper choice */
        while (len >= 2) {
            int a = chain[len - 2], b = chain[len - 1];
            if ((error[a] - error[b]) * (bytes[c] - bytes[b]) >
                (error[b] - error[c]) * (bytes[b] - bytes[a]))
                break; /* b saves more per byte than the step after it: on the hull */
            len--;
        }
        chain[len++] = (uint8_t)c;
    }
    return len;
}

/* Bytes of an item of the greedy at precision p: a whole chunk (layers = n_layer) or one
 * layer section (layers = 1). */
static size_t kv_item_bytes(kv_shape shape, int layers, enum kv_precision p)
{
    return (size_t)layers * kv_chunk_layer_bytes(shape, p);
}

/* The better of widening an item's K by one width or moving its V one step along its
 * chain (at position iv of len): *which 0 for K, 1 for V, *bytes the cost; gain 0 when
 * neither can move. */
static double kv_best_widening(kv_shape shape, int layers, const kv_chunk_stats *st, double w,
                               int ik, const uint8_t *chain, int iv, int len, int *which,
                               size_t *bytes)
{
    double best = 0;
    size_t now = kv_item_bytes(shape, layers, kv_choice_precision(ik, chain[iv]));
    for (int side = 0; side < 2; side++) {
        if (side ? iv + 1 >= len : ik + 1 >= KV_N_WIDTHS)
            continue;
        enum kv_precision p = side ? kv_choice_precision(ik, chain[iv + 1])
                                   : kv_choice_precision(ik + 1, chain[iv]);
        size_t cost = kv_item_bytes(shape, layers, p) - now;
        double saved = side ? kv_v_error(st, chain[iv]) - kv_v_error(st, chain[iv + 1])
                            : KV_K_ERROR_WEIGHT * st->k_spread *
                                  (kv_width_error(kv_widths[ik]) - kv_width_error(kv_widths[ik + 1]));
        double gain = w * saved / (double)(cost ? cost : 1);
        if (gain > best) {
            best = gain;
            *which = side;
            *bytes = cost;
        }
    }
    return best;
}

static void kv_heap_sift_down(kv_step *h, int n, int i)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && h[l].gain > h[m].gain)
            m = l;
        if (r < n && h[r].gain > h[m].gain)
            m = r;
        if (m == i)
            return;
        kv_step t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

/* What the greedy keeps per chunk. */
typedef struct kv_chunk_choice {
    uint8_t chain[KV_V_CHOICES]; /* its V choices on the hull, cheapest first */
    uint8_t len;                 /* entries of chain */
    uint8_t ik, iv;              /* its K width index, its position on chain */
} kv_chunk_choice;

/* Writes precision p of item i into out (enum) or out8 (bytes), whichever is given. */
static void kv_put(enum kv_precision *out, uint8_t *out8, int i, enum kv_precision p)
{
    if (out)
        out[i] = p;
    else
        out8[i] = (uint8_t)p;
}

/* Item i's error weight: its density plus half the mean (kv.h). */
static double kv_item_weight(const kv_chunk_stats *stats, double mean, int i)
{
    return (stats[i].density > 0 ? stats[i].density : 0) + mean / 2;
}

/* The greedy of kv_assign_precisions over n items of `layers` layers each (whole chunks
 * or layer sections). */
static void kv_assign(kv_shape shape, const kv_chunk_stats *stats, int n, int layers, size_t budget_bytes, bool v_block,
                      enum kv_precision *out, uint8_t *out8)
{
    if (n <= 0)
        return;
    kv_step *heap = malloc((size_t)n * sizeof *heap);
    kv_chunk_choice *ch = malloc((size_t)n * sizeof *ch);
    if (!heap || !ch) {
        enum kv_precision p = KV_INT2;
        for (int i = KV_N_WIDTHS - 1; i >= 0; i--)
            if ((size_t)n * kv_item_bytes(shape, layers, KV_INT_FIRST + (KV_N_WIDTHS + 1) * i) <=
                budget_bytes) {
                p = KV_INT_FIRST + (KV_N_WIDTHS + 1) * i;
                break;
            }
        for (int i = 0; i < n; i++)
            kv_put(out, out8, i, p);
        free(heap);
        free(ch);
        return;
    }
    double mean = 0;
    for (int i = 0; i < n; i++)
        mean += (stats[i].density > 0 ? stats[i].density : 0) / n;
    if (!(mean > 0))
        mean = 2; /* nothing measured: every chunk weighs 1 */
    size_t used = 0;
    int which;
    size_t cost;
    for (int i = 0; i < n; i++) {
        kv_chunk_choice *c = &ch[i];
        c->len = (uint8_t)kv_v_chain(shape, &stats[i], v_block, c->chain);
        c->ik = c->iv = 0;
        used += kv_item_bytes(shape, layers, kv_choice_precision(0, c->chain[0]));
        heap[i] = (kv_step){kv_best_widening(shape, layers, &stats[i], kv_item_weight(stats, mean, i), 0,
                                             c->chain, 0, c->len, &which, &cost), i};
    }
    for (int i = n / 2 - 1; i >= 0; i--)
        kv_heap_sift_down(heap, n, i);
    int live = n;
    while (live > 0 && used < budget_bytes) {
        int i = heap[0].chunk;
        kv_chunk_choice *c = &ch[i];
        double w = kv_item_weight(stats, mean, i);
        double gain = kv_best_widening(shape, layers, &stats[i], w, c->ik, c->chain, c->iv,
                                       c->len, &which, &cost);
        if (gain <= 0 || used + cost > budget_bytes) {
            heap[0] = heap[--live]; /* widest already, or its next step does not fit */
        } else {
            used += cost;
            if (which)
                c->iv++;
            else
                c->ik++;
            heap[0].gain = kv_best_widening(shape, layers, &stats[i], w, c->ik, c->chain,
                                            c->iv, c->len, &which, &cost);
        }
        kv_heap_sift_down(heap, live, 0);
    }
    for (int i = 0; i < n; i++)
        kv_put(out, out8, i, kv_choice_precision(ch[i].ik, ch[i].chain[ch[i].iv]));
    free(heap);
    free(ch);
}

void kv_assign_precisions(kv_shape shape, const kv_chunk_stats *stats, int n,
                          size_t budget_bytes, bool v_block, enum kv_precision *out)
{
    kv_assign(shape, stats, n, shape.n_layer, budget_bytes, v_block, out, NULL);
}

void kv_assign_layer_precisions(kv_shape shape, const kv_chunk_stats *stats, int n,
                                size_t budget_bytes, bool v_block, uint8_t *out)
{
    if (n > 0)
        kv_assign(shape, stats, n * shape.n_layer, 1, budget_bytes, v_block, NULL, out);
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

int kv_seq_copy_prefix(kv_seq *dst, const kv_seq *src, int n, char err[ERR_MAX])
{
    kv_shape shape = kv_pool_shape(dst->pool);
    for (int i = 0, kept = 0; i < src->n_chunks && kept < n; i++) {
        const kv_chunk *c = src->chunks[i];
        if (!c)
            return err_set(err, "kv sequence: chunk %d to copy is not resident", i);
        kv_chunk *d = kv_chunk_new_layers(dst->pool, c->layer_precision, err);
        if (!d)
            return -1;
        memcpy(d->data, c->data, kv_chunk_bytes(shape, c));
        memcpy(d->tokens, c->tokens, sizeof d->tokens);
        memcpy(d->positions, c->positions, sizeof d->positions);
        d->n_tokens = c->n_tokens < n - kept ? c->n_tokens : n - kept;
        kept += d->n_tokens;
        if (kv_seq_push_chunk(dst, d, err) < 0) {
            kv_chunk_free(dst->pool, d);
            return -1;
        }
    }
    return 0;
}

int kv_seq_copy(kv_seq *dst, const kv_seq *src, char err[ERR_MAX])
{
    return kv_seq_copy_prefix(dst, src, INT_MAX, err);
}

size_t kv_seq_prefix_bytes(const kv_seq *src, int n)
{
    kv_shape shape = kv_pool_shape(src->pool);
    size_t bytes = 0;
    for (int i = 0, kept = 0; i < src->n_chunks && kept < n; i++) {
        const kv_chunk *c = src->chunks[i];
        bytes += c ? kv_chunk_bytes(shape, c) : 0;
        kept += kv_slot_tokens(c);
    }
    return bytes;
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
