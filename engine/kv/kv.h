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

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/err.h"

#define KV_CHUNK_TOKENS 16

/* How a chunk's K/V are stored: IEEE half floats, or integer codes with a width for K and
 * one for V, each 2, 3, 4, 5, 6 or 8 bits, on 8-bit per-group scales and offsets (K per
 * channel over the chunk's tokens, V per token: the layout the KIVI line of work found to
 * keep attention accurate at low widths; kv_quant.h). The integer precision of widths
 * (k, v) is KV_INT_FIRST + KV_N_WIDTHS * index(k) + index(v); the same widths with V on
 * one scale and offset per (layer, head) block instead of per token ("V block" layout,
 * kv_quant.h) are KV_VBLOCK_FIRST + the same offset. Values 1..7 are not precisions:
 * 1..3 named an earlier layout (f16 scales), and chunks stored under them are refused
 * and recomputed. */
#define KV_N_WIDTHS 6 /* 2, 3, 4, 5, 6, 8 bits */
enum kv_precision {
    KV_F16 = 0,
    KV_INT_FIRST = 8,
    KV_INT2 = KV_INT_FIRST,                      /* k2v2 */
    KV_INT4 = KV_INT_FIRST + 2 * KV_N_WIDTHS + 2, /* k4v4 */
    KV_INT8 = KV_INT_FIRST + 5 * KV_N_WIDTHS + 5, /* k8v8 */
    KV_VBLOCK_FIRST = KV_INT_FIRST + KV_N_WIDTHS * KV_N_WIDTHS, /* k2v2b */
};
/* One past the largest precision: the length of arrays indexed by precision. */
#define KV_PRECISION_END (KV_VBLOCK_FIRST + KV_N_WIDTHS * KV_N_WIDTHS)

/* A chunk's precision when its layers have different ones (kv_chunk.layer_precision):
 * not a precision itself, kv_precision_valid says no. */
#define KV_MIXED 255

/* Whether p names a precision. */
int kv_precision_valid(int p);

/* Bits of K's and of V's codes: 16 for KV_F16; 0 for an invalid p. */
int kv_precision_k_bits(enum kv_precision p);
int kv_precision_v_bits(enum kv_precision p);

/* Whether p keeps V in the block layout (one scale and offset per block). */
bool kv_precision_v_block(enum kv_precision p);

/* The mean of the two widths, rounded down (16 for f16; 0 for an invalid p). */
int kv_precision_bits(enum kv_precision p);

/* The integer precision of widths (k_bits, v_bits), V per token or (v_block) in the
 * block layout, or -1 when one is not a width. */
int kv_precision_of(int k_bits, int v_bits);
int kv_precision_layout_of(int k_bits, int v_bits, bool v_block);

/* "f16", "int8", "int4", "int2" (equal widths), "k5v4" (others), "k4v5b" (V block
 * layout), "?" (invalid). */
const char *kv_precision_name(enum kv_precision p);

/* Largest head_dim a pool accepts (as the attention kernels, OPS_MAX_HEAD_DIM). */
#define KV_MAX_HEAD_DIM 576

/* Most layers a pool accepts (the largest published models have 126). */
#define KV_MAX_LAYERS 256

/* The dimensions every chunk of a model shares. */
typedef struct kv_shape {
    int n_layer;
    int n_head_kv;
    int head_dim;
    /* Each entry's V is its K (deepseek2's latent, which attention reads as both): chunks
     * store it once, K's blocks alone, and V reads give K's values; an integer precision's
     * V width then means nothing (its K width alone is stored). */
    bool shared_kv;
} kv_shape;

/*
 * A chunk's data is one allocation made of n_layer sections, layer 0 first, so that a
 * chunk can be written, read or recomputed one layer at a time. Each layer has its own
 * precision (layer_precision) and its section kv_chunk_layer_bytes(shape, that) bytes:
 * how much a layer's error moves the output differs by layer (on TinyStories-656K int4
 * on layer 0 alone costs 0.6-0.8x of int4 on both layers), and the layers that matter
 * can then keep more bits than the rest.
 * When every layer has the same precision, precision says which (and the data is
 * kv_chunk_data_bytes(shape, precision) bytes); otherwise it is KV_MIXED.
 * Within a layer section: for KV_F16, K then V, each (n_head_kv, KV_CHUNK_TOKENS,
 * head_dim) half floats (K alone for a shape with shared_kv); for the integer precisions
 * the layout is private to kv.c. Rows
 * >= n_tokens are unused (zero after compression).
 */
typedef struct kv_chunk {
    enum kv_precision precision;           /* every layer's, or KV_MIXED */
    int n_tokens;                          /* entries used, 0..KV_CHUNK_TOKENS, filled in order */
    int32_t tokens[KV_CHUNK_TOKENS];       /* token id of each entry */
    int32_t positions[KV_CHUNK_TOKENS];    /* absolute position of each entry */
    uint8_t layer_precision[KV_MAX_LAYERS]; /* (n_layer) each section's kv_precision */
    uint8_t *data;                         /* (n_layer sections of their precision's bytes) */
} kv_chunk;

/* Bytes of one layer section, and of a chunk whose layers all have precision p. */
size_t kv_chunk_layer_bytes(kv_shape shape, enum kv_precision p);
size_t kv_chunk_data_bytes(kv_shape shape, enum kv_precision p);

/* Bytes of a chunk whose layer l has precision layers[l] (n_layer entries, each valid). */
size_t kv_layers_data_bytes(kv_shape shape, const uint8_t *layers);

/* Data bytes of chunk c (its layers' precisions). */
size_t kv_chunk_bytes(kv_shape shape, const kv_chunk *c);

/* Start of one layer's section of a chunk. */
uint8_t *kv_chunk_layer(const kv_chunk *c, kv_shape shape, int layer);

/* Bytes of one layer's section of a chunk. */
static inline size_t kv_chunk_section_bytes(const kv_chunk *c, kv_shape shape, int layer)
{
    return kv_chunk_layer_bytes(shape, (enum kv_precision)c->layer_precision[layer]);
}

/* KV_F16 chunks only: (layer, head)'s K or V block of KV_CHUNK_TOKENS rows of head_dim
 * (with shared_kv both are K's). */
uint16_t *kv_chunk_k_f16(const kv_chunk *c, kv_shape shape, int layer, int head);
uint16_t *kv_chunk_v_f16(const kv_chunk *c, kv_shape shape, int layer, int head);

/* Any precision: the first n_tokens rows of (layer, head)'s K and V as f32,
 * k and v (n_tokens, head_dim); either may be NULL to skip it. This is how attention
 * reads a compressed chunk. */
void kv_chunk_read_f32(const kv_chunk *c, kv_shape shape, int layer, int head, float *k,
                       float *v);

/* ---- pool: where chunks come from ---- */

typedef struct kv_pool kv_pool;

/* A pool for chunks of the given shape; max_chunks > 0 caps the number of chunks alive
 * at once (kv_chunk_new fails beyond it), 0 means no cap. Freed chunk data is kept for
 * reuse in one spare list per precision, each holding at most KV_POOL_SPARE_MAX
 * buffers, so compressing chunks really returns memory beyond that. */
#define KV_POOL_SPARE_MAX 64
kv_pool *kv_pool_new(kv_shape shape, int max_chunks, char err[ERR_MAX]);

/* Frees the pool and its spare chunks. Every chunk taken from it must be freed first. */
void kv_pool_free(kv_pool *pool);

kv_shape kv_pool_shape(const kv_pool *pool);

/* Chunks alive (taken and not yet returned). */
int kv_pool_n_used(const kv_pool *pool);

/* Data bytes of all chunks alive, each counted at its precision: the resident KV. */
size_t kv_pool_bytes_used(const kv_pool *pool);

/* The part of kv_pool_bytes_used held by chunks of precision p. */
size_t kv_pool_bytes_at(const kv_pool *pool, enum kv_precision p);

/* Data bytes of the spare buffers kept for reuse: memory the pool holds beside the
 * resident KV, which a memory cap has to count too. */
size_t kv_pool_spare_bytes(const kv_pool *pool);

/* Frees spare buffers, the largest precisions first, until at most keep bytes remain. */
void kv_pool_trim_spares(kv_pool *pool, size_t keep);

/* An empty F16 chunk (n_tokens 0), reusing a freed one when possible. NULL + err when
 * the cap is reached or memory is exhausted. */
kv_chunk *kv_chunk_new(kv_pool *pool, char err[ERR_MAX]);

/* A chunk of precision p whose data is uninitialised and n_tokens 0, for the caller to
 * fill (loading from disk); the caller sets tokens, positions and n_tokens. */
kv_chunk *kv_chunk_new_precision(kv_pool *pool, enum kv_precision p, char err[ERR_MAX]);

/* The same with layer l at precision layers[l] (n_layer entries); NULL + err when one
 * is not a precision. */
kv_chunk *kv_chunk_new_layers(kv_pool *pool, const uint8_t *layers, char err[ERR_MAX]);

/*
 * Converts a chunk to precision p in place (its data is replaced by one of the new size;
 * the pool's byte count follows). F16 -> integer compresses (lossy); integer -> F16
 * decompresses; between two integer precisions goes through f32. Same precision: no-op.
 * On failure (out of memory) the chunk is unchanged.
 */
int kv_chunk_convert(kv_pool *pool, kv_chunk *c, enum kv_precision p, char err[ERR_MAX]);

/* kv_chunk_convert with layer l to precision layers[l] (n_layer entries). */
int kv_chunk_convert_layers(kv_pool *pool, kv_chunk *c, const uint8_t *layers,
                            char err[ERR_MAX]);

/* Whether chunk c's layers have the precisions layers[] (n_layer entries). */
bool kv_chunk_has_layers(const kv_chunk *c, kv_shape shape, const uint8_t *layers);

/* Gives a chunk back to its pool. NULL is allowed. */
void kv_chunk_free(kv_pool *pool, kv_chunk *chunk);

/* ---- tolerance-aware compression levels ---- */

/* What the assignment of precisions knows about one chunk. */
typedef struct kv_chunk_stats {
    float density;   /* attention the chunk receives (>= 0); higher: it tolerates less loss */
    float k_spread;  /* mean squared range of its K groups (kv_chunk_spread) */
    float v_spread;  /* mean squared range of its V groups */
    float vb_spread; /* mean squared range of its V blocks (the V block layout's groups) */
} kv_chunk_stats;

/*
 * How widely a chunk's values spread: the mean over its (layer, head) blocks and groups of
 * (max - min)^2, for K per channel over the tokens and for V per token group, as the
 * integer codes group them. The quantization error of a group at b bits grows as its
 * squared range over (2^b - 1)^2, so these predict what each width costs. Reads any
 * precision (for an integer one, of the values it keeps). Uses the pool's scratch.
 */
void kv_chunk_spread(kv_pool *pool, const kv_chunk *c, float *k_spread, float *v_spread,
                     float *vb_spread);

/* The same spreads over one layer of a chunk only. */
void kv_chunk_layer_spread(kv_pool *pool, const kv_chunk *c, int layer, float *k_spread,
                           float *v_spread, float *vb_spread);

/* How much more a unit of K's spread weighs in the predicted error than one of V's: a
 * key's error moves every score of its token, a value's only its share of the output
 * (bench/kvquant measured 2 lower than 1 on TinyStories-656K: 0.94x against 1.11x of
 * uniform int4's KL at int4's bytes, and the same on stories260K). */
#define KV_K_ERROR_WEIGHT 2.0

/*
 * Chooses an integer precision for each of n chunks so that their data bytes total at
 * most budget_bytes and the predicted error
 *   sum_i w_i (2 k_spread_i / (2^kb_i - 1)^2 + V_i / (2^vb_i - 1)^2),
 *   w_i = density_i + mean density / 2,
 * is smallest, V_i being v_spread_i for V per token and vb_spread_i for the V block
 * layout, which only v_block allows. The half mean density keeps weight on chunks the
 * recent rows ignored: bench/kvquant measured pure density weighting 10x better than none
 * on stories260K and 15% worse on TinyStories-656K, whose later tokens spread their
 * attention; this compromise keeps most of the first and all of the second. A chunk's V
 * choices (six widths, in one or both layouts) are reduced to the lower convex hull of
 * their (bytes, error); greedy on the error saved per byte (optimal for convex steps up to
 * the last chunk that fits): every chunk starts at its cheapest choice (k2v2, or k2v2b)
 * and the best widening of K or step along its V hull that fits is taken until none
 * does. When even the cheapest do not fit every chunk gets its cheapest. n == 0 is
 * allowed. Should its O(n) scratch not be allocatable, every chunk gets the widest equal
 * widths (V per token) that fit.
 */
void kv_assign_precisions(kv_shape shape, const kv_chunk_stats *stats, int n,
                          size_t budget_bytes, bool v_block, enum kv_precision *out);

/*
 * kv_assign_precisions for every (chunk, layer) section: stats (n, n_layer) hold each
 * layer's spreads (kv_chunk_layer_spread) beside its chunk's density, and out (n,
 * n_layer) gets each section's precision. The greedy spends the bytes on the sections
 * that save the most predicted error per byte, so a layer whose errors the output
 * follows most can keep more bits than the others in every chunk: the spreads do not
 * say which layer that is, kv_calib_apply (kv_calib.h) scales them so that they do.
 * Same fallback and budget rules as kv_assign_precisions.
 */
void kv_assign_layer_precisions(kv_shape shape, const kv_chunk_stats *stats, int n,
                                size_t budget_bytes, bool v_block, uint8_t *out);

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

/* Total entries over all chunks. A NULL (not resident) slot counts KV_CHUNK_TOKENS:
 * only the last chunk of a sequence may be partial, and a forward faults it in first. */
int kv_seq_n_tokens(const kv_seq *seq);

/* Makes room for n more entries: fills the last chunk (converting it to F16 first when it
 * is partial and compressed; a NULL last slot counts as full) then adds new chunks from
 * the pool so that appending n entries needs no further allocation. */
int kv_seq_reserve(kv_seq *seq, int n, char err[ERR_MAX]);

/* Appends one entry (token id and position) in space made by kv_seq_reserve, and says
 * where its K/V go: entry *index of *chunk (the caller writes the data for every layer).
 * Returns -1 when no reserved space is left. Allocates nothing. */
int kv_seq_append(kv_seq *seq, int32_t token, int32_t pos, kv_chunk **chunk, int *index);

/* Appends an existing chunk (e.g. one loaded from disk); the sequence owns it afterwards.
 * Entries appended later go to new chunks after it when it is not full. chunk NULL
 * appends a slot that is not resident (see fault). */
int kv_seq_push_chunk(kv_seq *seq, kv_chunk *chunk, char err[ERR_MAX]);

/* Appends a copy of every chunk of src (all resident, same shape) to dst, each at its
 * precisions; dst draws them from its pool. On failure dst may hold some of them. */
int kv_seq_copy(kv_seq *dst, const kv_seq *src, char err[ERR_MAX]);

/* The same for src's first n entries only (the chunks holding them, the last one cut
 * to what it holds of them). */
int kv_seq_copy_prefix(kv_seq *dst, const kv_seq *src, int n, char err[ERR_MAX]);

/* The bytes kv_seq_copy_prefix(..., src, n, ...) draws from the pool. */
size_t kv_seq_prefix_bytes(const kv_seq *src, int n);

/* Drops entries after the first n (freeing chunks that become empty). A NULL slot
 * that the cut falls inside is dropped whole, with everything after it. */
void kv_seq_truncate(kv_seq *seq, int n);

#endif
