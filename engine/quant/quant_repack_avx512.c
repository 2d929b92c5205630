/*
 * quant_repack_avx512.c — Q8_0 weights repacked for AVX-512 VNNI (see quant.h): rows in
 * groups of 16, the lanes of a register being the rows.
 *
 * The packed-activation kernel of quant_avx512.c keeps activations in the lanes and
 * broadcasts weight bytes from rows as they are stored; fewer than 9 activations then
 * leave lanes to split an activation's block, summed horizontally at the end, and each
 * (row, block) pays the weights' offset and scale again for every group of activations.
 * Here a group's block is stored as eight 64-byte vectors, vector g holding bytes
 * 4 g .. 4 g + 3 of the block in each of the 16 rows (plus 128: vpdpbusd wants its
 * first operand unsigned, and the offset is folded in once, at repack time), beside the
 * 16 rows' f16 scales (rp_qs, rp_scales). One vpdpbusd multiplies a vector with 4 bytes
 * of one activation, broadcast from memory, so every lane holds a whole (row, activation)
 * block sum: eight give the block's 16 sums for that activation, whatever the number of
 * activations, with no horizontal sum and the weights loaded once per block for all.
 * The sum starts at -128 * (the activation block's sum), computed once when activations
 * are packed, which makes it exactly the scalar kernel's integer; the f32 steps are the
 * scalar kernel's too, sum += (d_w * d_a) * (float)isum block after block (this file is
 * compiled with -ffp-contract=off), so each result equals quant_dot_scalar bit for bit.
 */
#if defined(__x86_64__)

#include "engine/quant/quant_repack_avx512.h"

#include <immintrin.h>
#include <string.h>

#include "engine/quant/quant.h"
#include "engine/quant/quant_blocks.h"

#define INLINE static inline __attribute__((always_inline))

#define RP_ROWS QUANT_REPACK_ROWS
#define RP_ACT 16                     /* activations a pass keeps in registers */
#define RP_QS_BYTES (8 * RP_ROWS * 4) /* a group's quants of one block: 512 */
#define RP_GROUP_BLOCK_BYTES (RP_ROWS * sizeof(qblock_q8_0)) /* a group's bytes per block */
_Static_assert(RP_GROUP_BLOCK_BYTES == RP_QS_BYTES + RP_ROWS * sizeof(uint16_t),
               "a repacked group takes the bytes of its rows");

/* Where block b's quants and scales are in a group of nb blocks: blocks go in pairs, the
 * pair's two scale rows (64 bytes) then its two quant blocks, so that one stream of whole
 * cache lines runs through the group (a last block alone: its scales, then its quants). */
INLINE const uint8_t *rp_qs(const uint8_t *grp, int64_t b, int64_t nb)
{
    const uint8_t *pair = grp + (size_t)(b / 2) * 2 * RP_GROUP_BLOCK_BYTES;
    size_t head = (b | 1) < nb ? 2 * RP_ROWS * sizeof(uint16_t) : RP_ROWS * sizeof(uint16_t);
    return pair + head + (size_t)(b % 2) * RP_QS_BYTES;
}

INLINE const uint8_t *rp_scales(const uint8_t *grp, int64_t b)
{
    return grp + (size_t)(b / 2) * 2 * RP_GROUP_BLOCK_BYTES +
           (size_t)(b % 2) * RP_ROWS * sizeof(uint16_t);
}

/* Four activation bytes read as one operand: vpdpbusd then broadcasts them from memory
 * (a memcpy into an int compiles into a move from a general register, which costs as
 * much as the product). */
typedef int32_t __attribute__((may_alias)) rp_bytes4;

/* One activation's block as the kernel reads it. */
typedef struct rp_act {
    int8_t q[QB_32]; /* 4-byte aligned: the struct is */
    float d;
    int32_t corr; /* -128 * the sum of q */
} rp_act;

void quant_avx512_repack_q8_0(const void *src, size_t row_bytes, int64_t n, void *dst)
{
    int64_t nb = n / QB_32;
    for (int r = 0; r < RP_ROWS; r++) {
        const qblock_q8_0 *x = (const qblock_q8_0 *)(const void *)((const uint8_t *)src +
                                                                     (size_t)r * row_bytes);
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *qb = (uint8_t *)rp_qs(dst, b, nb);
            for (int g = 0; g < 8; g++) {
                uint32_t v;
                memcpy(&v, x[b].qs + 4 * g, sizeof v);
                v ^= 0x80808080u;
                memcpy(qb + (g * RP_ROWS + r) * 4, &v, sizeof v);
            }
            memcpy((uint8_t *)rp_scales(dst, b) + r * sizeof(uint16_t), &x[b].d, sizeof(uint16_t));
        }
    }
}

size_t quant_avx512_repacked_act_bytes(int n_act, int64_t n)
{
    return (size_t)n_act * (size_t)(n / QB_32) * sizeof(rp_act);
}

void quant_avx512_repack_activations(const void *act, size_t act_stride, int a0, int a1,
                                     int n_act, int64_t n, void *packed)
{
    int64_t nb = n / QB_32;
    rp_act *p = packed;
    for (int a = a0; a < a1; a++) {
        const qblock_q8_0 *y = (const qblock_q8_0 *)(const void *)((const uint8_t *)act +
                                                                     (size_t)a * act_stride);
        for (int64_t b = 0; b < nb; b++) {
            rp_act *o = &p[(size_t)b * (size_t)n_act + (size_t)a];
            int32_t sum = 0;
            for (int j = 0; j < QB_32; j++)
                sum += y[b].qs[j];
            memcpy(o->q, y[b].qs, QB_32);
            o->d = _cvtsh_ss(y[b].d);
            o->corr = -128 * sum;
        }
    }
}

/* s + the products of w's 64 unsigned bytes with the 4 signed bytes at x repeated,
 * the 4 bytes broadcast by the load itself (GCC emits a separate broadcast for
 * _mm512_set1_epi32 of memory, one more instruction per product). */
INLINE __m512i dp_bcast(__m512i s, __m512i w, const rp_bytes4 *x)
{
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(s) : "v"(w), "m"(*x));
    return s;
}

/* The block sums of na activations (8 at most) against one block's eight weight vectors.
 * The eight products of an activation form a chain, each waiting on the one before; the
 * chains of the activations go side by side (product g of every activation, then g + 1),
 * so that the core always has independent products to start: one activation's chain
 * after the other ran at about half the core's vpdpbusd rate. The weight vector is
 * loaded for each g rather than kept, which leaves registers for 16 accumulators. Up to
 * four activations split their chains in two instead: four chains side by side wait on
 * each other's latency. */
INLINE void rp_block_sums(int na, const uint8_t *qb, const rp_act *p, __m512i *s)
{
    if (na <= 4) {
#pragma GCC unroll 4
        for (int a = 0; a < na; a++) {
            const rp_bytes4 *x = (const rp_bytes4 *)(const void *)p[a].q;
            __m512i s0 = _mm512_set1_epi32(p[a].corr), s1 = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                s0 = dp_bcast(s0, _mm512_loadu_si512(qb + 64 * g), x + g);
                s1 = dp_bcast(s1, _mm512_loadu_si512(qb + 64 * (g + 4)), x + g + 4);
            }
            s[a] = _mm512_add_epi32(s0, s1);
        }
        return;
    }
#pragma GCC unroll 8
    for (int a = 0; a < na; a++)
        s[a] = _mm512_set1_epi32(p[a].corr);
#pragma GCC unroll 8
    for (int g = 0; g < 8; g++) {
        __m512i w = _mm512_loadu_si512(qb + 64 * g);
#pragma GCC unroll 8
        for (int a = 0; a < na; a++)
            s[a] = dp_bcast(s[a], w, (const rp_bytes4 *)(const void *)p[a].q + g);
    }
}

/* One group of 16 rows against na (<= RP_ACT, constant after inlining) activations,
 * block stride n_act in the packed activations, in passes of at most 8 activations over
 * each block (rp_block_sums). */
INLINE void rp_group(int na, const uint8_t *grp, int64_t nb, const rp_act *pk, int n_act,
                     float *out, size_t os)
{
    __m512 acc[RP_ACT];
#pragma GCC unroll 16
    for (int a = 0; a < na; a++)
        acc[a] = _mm512_setzero_ps();
    /* Several activations: the next group into L2, spread evenly over this pass (the
     * hardware prefetcher alone took ~20% longer for 16 activations: one thread, twelve
     * 5632 x 2048 matrices from DRAM).
     * One activation reads fastest on the hardware prefetcher alone: a group is one
     * stream of whole cache lines. Integer addresses: the last group prefetches past the
     * matrix, which is harmless. */
    const uintptr_t pf = (uintptr_t)grp + (size_t)nb * RP_GROUP_BLOCK_BYTES;
    for (int64_t b = 0; b < nb; b++) {
        if (na > 1)
            for (size_t k = 0; k < RP_GROUP_BLOCK_BYTES; k += 64)
                _mm_prefetch((const char *)(pf + (size_t)b * RP_GROUP_BLOCK_BYTES + k),
                             _MM_HINT_T1);
        const uint8_t *qb = rp_qs(grp, b, nb);
        __m512 dw = _mm512_cvtph_ps(
            _mm256_loadu_si256((const __m256i *)(const void *)rp_scales(grp, b)));
        const rp_act *p = pk + (size_t)b * (size_t)n_act;
#pragma GCC unroll 2
        for (int a0 = 0; a0 < na; a0 += 8) {
            const int sub = na - a0 < 8 ? na - a0 : 8;
            __m512i s[8];
            rp_block_sums(sub, qb, p + a0, s);
#pragma GCC unroll 8
            for (int a = 0; a < sub; a++) {
                __m512 m = _mm512_mul_ps(dw, _mm512_set1_ps(p[a0 + a].d));
                acc[a0 + a] =
                    _mm512_add_ps(acc[a0 + a], _mm512_mul_ps(m, _mm512_cvtepi32_ps(s[a])));
            }
        }
    }
#pragma GCC unroll 16
    for (int a = 0; a < na; a++)
        _mm512_storeu_ps(out + (size_t)a * os, acc[a]);
}

#define RP_CASE(k)                                                                            \
    case k:                                                                                   \
        rp_group(k, grp, nb, pk + a0, n_act, o, out_stride);                                  \
        break;

void quant_avx512_dot_rows_repacked(const void *weights, size_t row_bytes, int64_t n_rows,
                                    const void *packed, int n_act, int64_t n, float *out,
                                    size_t out_stride)
{
    int64_t nb = n / QB_32;
    const rp_act *pk = packed;
    for (int64_t r = 0; r < n_rows; r += RP_ROWS) {
        const uint8_t *grp = (const uint8_t *)weights + (size_t)r * row_bytes;
        for (int a0 = 0; a0 < n_act; a0 += RP_ACT) {
            float *o = out + (size_t)a0 * out_stride + r;
            switch (n_act - a0 < RP_ACT ? n_act - a0 : RP_ACT) {
                RP_CASE(1) RP_CASE(2) RP_CASE(3) RP_CASE(4) RP_CASE(5) RP_CASE(6) RP_CASE(7)
                RP_CASE(8) RP_CASE(9) RP_CASE(10) RP_CASE(11) RP_CASE(12) RP_CASE(13)
                RP_CASE(14) RP_CASE(15) RP_CASE(16)
            default:
                break;
            }
        }
    }
}

#endif
