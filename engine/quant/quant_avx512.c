/*
 * quant_avx512.c — AVX-512 VNNI kernels (see quant_avx512.h). Compiled with the
 * AVX-512 flags; quant.c calls in only after checking the CPU.
 *
 * Batched decode makes the Q8_0 dot product compute-bound: the AVX2 kernel spends six
 * instructions on each 32 elements of each (row, activation) pair. Here a 512-bit
 * register holds two blocks and vpdpbusd does the multiply-add in one instruction, so a
 * pair costs four instructions per 64 elements. vpdpbusd multiplies unsigned by signed
 * bytes: activations are offset to a + 128 (1..255, as they never hold -128) and the
 * accumulator starts at -128 * (sum of the weights of its four bytes), which makes each
 * block's integer sum exactly the one the scalar kernel computes; only the order of the
 * f32 additions differs from the AVX2 and scalar kernels. quant.c sends one activation
 * (decode) here too, so that a row's result is the same alone or batched.
 */
#if defined(__x86_64__)

#include "engine/quant/quant_avx512.h"

#include <immintrin.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "engine/quant/quant.h"
#include "engine/quant/quant_blocks.h"
#include "engine/quant/quant_x86.h"

#define INLINE static inline __attribute__((always_inline))

/* Weight rows and activation rows per kernel call: 16 accumulators plus the weights,
 * their offsets and scales of 4 rows fit the 32 zmm registers. One activation takes
 * decode_q8_0 (below), or for rows longer than its buffer MR1 rows at once (of 1, 2, 4
 * and 8 rows there, two read fastest: bench/matmul_batch, two TinyLlama layers, 2
 * threads: ~40 GB/s against ~31 with 8 and 4 rows' ~36). */
#define MR 4
#define MA 4
#define MR1 2
#define MR_MAX (MR > MR1 ? MR : MR1) /* rows a call may take: the arrays' size */

/* The quants of blocks i and i + 1 (zero for the second when there is none). */
INLINE __m512i load_pair(const qblock_q8_0 *b, int64_t i, int64_t nb)
{
    __m256i lo = _mm256_loadu_si256((const __m256i *)(const void *)b[i].qs);
    __m256i hi = i + 1 < nb ? _mm256_loadu_si256((const __m256i *)(const void *)b[i + 1].qs)
                            : _mm256_setzero_si256();
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* Scales of blocks i and i + 1, each over 8 lanes (0 for a missing second block). */
INLINE __m512 scale_pair(const qblock_q8_0 *b, int64_t i, int64_t nb)
{
    __m128i h0 = _mm_set1_epi16((short)b[i].d);
    __m128i h1 = i + 1 < nb ? _mm_set1_epi16((short)b[i + 1].d) : _mm_setzero_si128();
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(h0), h1, 1));
}

INLINE void multi_q8_0(int nr, int na, const uint8_t *w, size_t rb, const uint8_t *act,
                       size_t as, int64_t nb, float *out, size_t os)
{
    const qblock_q8_0 *x[MR_MAX], *y[MA];
    __m512 acc[MR_MAX][MA];
#pragma GCC unroll 8
    for (int r = 0; r < nr; r++)
        x[r] = (const qblock_q8_0 *)(const void *)(w + (size_t)r * rb);
#pragma GCC unroll 8
    for (int a = 0; a < na; a++)
        y[a] = (const qblock_q8_0 *)(const void *)(act + (size_t)a * as);
#pragma GCC unroll 8
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 8
        for (int a = 0; a < na; a++)
            acc[r][a] = _mm512_setzero_ps();
    const __m512i ones = _mm512_set1_epi8(1), bias = _mm512_set1_epi8((char)0x80);
    /* One activation (decode) streams the weights from DRAM: fetch the next group of rows
     * evenly over this pass, as the AVX2 kernel does. Integer addresses, as the last
     * group prefetches past the matrix (harmless). */
    uintptr_t pf = (uintptr_t)w + (size_t)nr * rb;
    size_t pf_step = na == 1 && nb ? 2 * (size_t)nr * rb / (size_t)nb : 0;
    for (int64_t i = 0; i < nb; i += 2) {
        __m512i wq[MR_MAX], wcorr[MR_MAX];
        __m512 dw[MR_MAX];
        for (size_t k = 0; k < pf_step; k += 64)
            _mm_prefetch((const char *)(pf + (size_t)i / 2 * pf_step + k), _MM_HINT_T0);
#pragma GCC unroll 8
        for (int r = 0; r < nr; r++) {
            wq[r] = load_pair(x[r], i, nb);
            __m512i wsum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, wq[r]);
            wcorr[r] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(wsum, 7));
            dw[r] = scale_pair(x[r], i, nb);
        }
#pragma GCC unroll 8
        for (int a = 0; a < na; a++) {
            __m512i au = _mm512_xor_si512(load_pair(y[a], i, nb), bias);
            __m512 da = scale_pair(y[a], i, nb);
#pragma GCC unroll 8
            for (int r = 0; r < nr; r++) {
                __m512 s = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(wcorr[r], au, wq[r]));
                acc[r][a] = _mm512_fmadd_ps(_mm512_mul_ps(dw[r], da), s, acc[r][a]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 8
        for (int a = 0; a < na; a++)
            out[(size_t)a * os + r] = _mm512_reduce_add_ps(acc[r][a]);
}

/*
 * One activation (decode) as multi_q8_0 computes it, with the activation's side done
 * once per call instead of once per pair of rows: the weights take the offset (w + 128,
 * unsigned) and the activation stays signed, so each lane's start, -128 times the sum of
 * its four activation bytes, depends on the activation only. Every lane holds the same
 * integer as in multi_q8_0 and is scaled by the same product, so results are bit for bit
 * multi_q8_0's (a row's logits do not depend on whether its sequence is batched); per
 * pair of blocks and row this is 13 instructions where multi_q8_0 takes 18. Rows go one
 * at a time with no software prefetch, as the float rows below (one sequential stream):
 * on a TinyLlama Q8_0 model's matrices mapped from the file, one thread, 23.9, 24.5 and
 * 22.1 GB/s where two rows at a time with the next two prefetched over the pass read
 * 20.6, 20.5 and 18.1 (and with a prefetch 4 KiB ahead in each row 11.6, 11.5, 10.6).
 */
typedef struct q8_0_act_pair {
    __m512i q;    /* (64) the quants of blocks i and i + 1 */
    __m512i corr; /* (16) -128 * the sum of each lane's four quants */
    __m512 d;     /* (16) the blocks' scales, each over its 8 lanes */
} q8_0_act_pair;
#define Q8_0_DECODE_MAX_N 8192 /* activation elements a call's stack buffer holds */

INLINE float decode_q8_0(const qblock_q8_0 *x, const q8_0_act_pair *pa, int64_t nb)
{
    __m512 acc = _mm512_setzero_ps();
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    for (int64_t i = 0; i < nb; i += 2) {
        const q8_0_act_pair *p = pa + i / 2;
        __m512i wu = _mm512_xor_si512(load_pair(x, i, nb), bias);
        __m512 s = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(p->corr, wu, p->q));
        acc = _mm512_fmadd_ps(_mm512_mul_ps(scale_pair(x, i, nb), p->d), s, acc);
    }
    return _mm512_reduce_add_ps(acc);
}

INLINE void decode_q8_0_rows(const uint8_t *w, size_t rb, int64_t n_rows, const uint8_t *act,
                             int64_t nb, float *out)
{
    const qblock_q8_0 *y = (const qblock_q8_0 *)(const void *)act;
    const __m512i ones = _mm512_set1_epi8(1);
    q8_0_act_pair pa[Q8_0_DECODE_MAX_N / 64];
    for (int64_t i = 0; i < nb; i += 2) {
        __m512i q = load_pair(y, i, nb);
        __m512i sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, q);
        pa[i / 2].q = q;
        pa[i / 2].corr = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sum, 7));
        pa[i / 2].d = scale_pair(y, i, nb);
    }
    for (int64_t r = 0; r < n_rows; r++)
        out[r] = decode_q8_0((const qblock_q8_0 *)(const void *)(w + (size_t)r * rb), pa, nb);
}

/* All rows for one group of na (constant after inlining) activations. */
INLINE void multi_q8_0_rows(int na, const uint8_t *w, size_t rb, int64_t n_rows,
                            const uint8_t *act, size_t as, int64_t nb, float *out, size_t os)
{
    if (na == 1 && nb * QB_32 <= Q8_0_DECODE_MAX_N) {
        decode_q8_0_rows(w, rb, n_rows, act, nb, out);
        return;
    }
    const int mr = na == 1 ? MR1 : MR;
    int64_t r = 0;
    for (; r + mr <= n_rows; r += mr)
        multi_q8_0(mr, na, w + (size_t)r * rb, rb, act, as, nb, out + r, os);
    for (; r < n_rows; r++)
        multi_q8_0(1, na, w + (size_t)r * rb, rb, act, as, nb, out + r, os);
}

/*
 * Q4_0, four blocks a step: the 64 bytes of quants of blocks i .. i + 3 go into one
 * register, and a mask and a shift with a mask give two registers of values (0..15,
 * value + 8): elements 0-15 of the four blocks, then elements 16-31. The activation's
 * blocks are put in that order once per call, and both registers share one register of
 * scales (lanes 4 b .. 4 b + 3: block i + b). The values are unsigned, as vpdpbusd wants
 * its first operand, and the -8 of every weight is the lane's start, -8 times the sum of
 * its four activation quants: each lane's integer is exactly the scalar kernel's, only
 * the order of the f32 additions differs, and each (row, activation) pair takes the same
 * steps however rows and activations are grouped, so a row's result is the same alone as
 * batched. From L2 on one thread this reads 28.6 GB/s where the AVX2 kernel (maddubs,
 * madd and a shared sum per block), which had bound Q4_0 decode below what DRAM feeds,
 * read 17.9 (4096 columns, 256 KiB of rows, the two interleaved, median of 41; two blocks
 * a step read 23.4). Batched decode had no multi-activation Q4_0 kernel at all (each
 * activation went through the rows again); with two rows a pass sharing each activation
 * group's loads, 4-32 activations take 0.23-0.31x its time on TinyLlama's 2048 x 5632 and
 * 5632 x 2048 matrices (one row a pass: 0.30-0.46x).
 * MXFP4 takes the same steps (mx): its nibbles become twice the E2M1 values + 128 by a
 * vpshufb from a 16-entry table, each lane starts at -128 times its activation sum, and
 * the lanes' scales are half the blocks' E8M0 scales, made exactly as qb_e8m0_half makes
 * them. From DRAM on one thread it read 11.6 GB/s as the two-blocks-a-step kernel of
 * Q4_1 .. IQ4_NL below and reads 18.0 here (quant_dot, 4096 columns, median of 5 runs).
 */
typedef struct q4_0_act_group {
    __m512i q[2];    /* (2, 64) quants 0-15, then 16-31, of blocks i .. i + 3 */
    __m512i corr[2]; /* (2, 16) -8 * the sum of each lane's four quants */
    __m512 d;        /* (16) the scale of each lane's block */
} q4_0_act_group;
#define Q4_0_ACT_MAX_N 8192 /* activation elements a call puts in order on its stack */
#define Q4_0_MR 2           /* rows a pass takes for several activations */

/* The four f16 scales packed in d4 (first lowest), each over four lanes, as f32. */
INLINE __m512 q4_0_scale_lanes(uint64_t d4)
{
    const __m256i spread = _mm256_set_epi16(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    return _mm512_cvtph_ps(
        _mm256_permutexvar_epi16(spread, _mm256_castsi128_si256(_mm_cvtsi64_si128((long long)d4))));
}

/* Half the E8M0 scales packed in e4 (first lowest, 16 bits each), each over four lanes,
 * as f32: exactly qb_e8m0_half's. */
INLINE __m512 mxfp4_scale_lanes(uint64_t e4)
{
    const __m256i spread = _mm256_set_epi16(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    __m512i e = _mm512_cvtepu16_epi32(
        _mm256_permutexvar_epi16(spread, _mm256_castsi128_si256(_mm_cvtsi64_si128((long long)e4))));
    __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    __m512i subnormal = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    __mmask16 tiny = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(tiny, normal, subnormal));
}

/* The 16 bytes at offset qo of the bb-byte block j from p (zero, not read, past nb). */
INLINE __m128i q4_load16(const uint8_t *p, size_t bb, size_t qo, int64_t j, int64_t nb)
{
    return j < nb ? _mm_loadu_si128((const __m128i *)(const void *)(p + (size_t)j * bb + qo))
                  : _mm_setzero_si128();
}

/* The scales of blocks i .. i + 3 (0 past nb), each the block's first field of width
 * bytes (2: f16, 1: E8M0), packed into one integer, 16 bits each, first lowest. */
INLINE uint64_t q4_0_scales4(const void *blocks, size_t stride, size_t width, int64_t i,
                             int64_t nb)
{
    uint64_t d4 = 0;
#pragma GCC unroll 4
    for (int b = 0; b < 4; b++) {
        uint16_t d = 0;
        if (i + b < nb)
            memcpy(&d, (const char *)blocks + (size_t)(i + b) * stride, width);
        d4 |= (uint64_t)d << (16 * b);
    }
    return d4;
}

/* 64 quant bytes: the 16 at offset qo of each of the bb-byte blocks i .. i + 3 from p
 * (zero past nb). */
INLINE __m512i q4_gather4(const uint8_t *p, size_t bb, size_t qo, int64_t i, int64_t nb)
{
    __m256i lo = _mm256_set_m128i(q4_load16(p, bb, qo, i + 1, nb), q4_load16(p, bb, qo, i, nb));
    __m256i hi =
        _mm256_set_m128i(q4_load16(p, bb, qo, i + 3, nb), q4_load16(p, bb, qo, i + 2, nb));
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

INLINE q4_0_act_group q4_0_act_group_at(const qblock_q8_0 *y, int64_t i, int64_t nb, int shift)
{
    q4_0_act_group g;
    const uint8_t *p = (const uint8_t *)y;
    g.q[0] = q4_gather4(p, sizeof *y, offsetof(qblock_q8_0, qs), i, nb);
    g.q[1] = q4_gather4(p, sizeof *y, offsetof(qblock_q8_0, qs) + 16, i, nb);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        __m512i sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), g.q[h]);
        g.corr[h] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sum, shift));
    }
    g.d = q4_0_scale_lanes(q4_0_scales4(y, sizeof *y, 2, i, nb));
    return g;
}

/* Blocks i .. i + 3 (those below nb) of nr rows x[0 .. nr - 1], Q4_0 or (mx) MXFP4,
 * against na activations into acc[r][a] (mx, nr and na constant after inlining). */
INLINE void q4_0_step(bool mx, int nr, int na, const uint8_t *const *x,
                      const q4_0_act_group (*ga)[Q4_0_ACT_MAX_N / 128], const qblock_q8_0 *const *y,
                      int64_t i, int64_t nb, __m512 (*acc)[MA])
{
    const __m512i low = _mm512_set1_epi8(0x0F);
    /* MXFP4's grid values + 128, unsigned as vpdpbusd wants them */
    const __m512i grid = _mm512_xor_si512(
        _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)qb_mxfp4_grid)),
        _mm512_set1_epi8((char)0x80));
    const size_t bb = mx ? sizeof(qblock_mxfp4) : sizeof(qblock_q4_0);
    const size_t qo = mx ? offsetof(qblock_mxfp4, qs) : offsetof(qblock_q4_0, qs);
    __m512i wq[Q4_0_MR][2];
    __m512 dw[Q4_0_MR];
#pragma GCC unroll 2
    for (int r = 0; r < nr; r++) {
        __m512i q = q4_gather4(x[r], bb, qo, i, nb);
        wq[r][0] = _mm512_and_si512(q, low);
        wq[r][1] = _mm512_and_si512(_mm512_srli_epi16(q, 4), low);
        if (mx) {
            wq[r][0] = _mm512_shuffle_epi8(grid, wq[r][0]);
            wq[r][1] = _mm512_shuffle_epi8(grid, wq[r][1]);
            dw[r] = mxfp4_scale_lanes(q4_0_scales4(x[r], bb, 1, i, nb));
        } else {
            dw[r] = q4_0_scale_lanes(q4_0_scales4(x[r], bb, 2, i, nb));
        }
    }
#pragma GCC unroll 4
    for (int a = 0; a < na; a++) {
        q4_0_act_group g = ga ? ga[a][i / 4] : q4_0_act_group_at(y[a], i, nb, mx ? 7 : 3);
#pragma GCC unroll 2
        for (int r = 0; r < nr; r++) {
            __m512 d = _mm512_mul_ps(dw[r], g.d);
            __m512 s0 = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(g.corr[0], wq[r][0], g.q[0]));
            __m512 s1 = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(g.corr[1], wq[r][1], g.q[1]));
            acc[r][a] = _mm512_fmadd_ps(d, s1, _mm512_fmadd_ps(d, s0, acc[r][a]));
        }
    }
}

/* nr rows from x0, rb bytes apart, against na activations, whose groups are in ga[a] (or,
 * with ga NULL, put in order from y[a] step by step: the same values). */
INLINE void q4_0_rows(bool mx, int nr, int na, const uint8_t *x0, size_t rb,
                      const q4_0_act_group (*ga)[Q4_0_ACT_MAX_N / 128], const qblock_q8_0 *const *y,
                      int64_t nb, float *out, size_t os)
{
    const uint8_t *x[Q4_0_MR];
    __m512 acc[Q4_0_MR][MA];
#pragma GCC unroll 2
    for (int r = 0; r < nr; r++) {
        x[r] = x0 + (size_t)r * rb;
#pragma GCC unroll 4
        for (int a = 0; a < na; a++)
            acc[r][a] = _mm512_setzero_ps();
    }
    int64_t i = 0;
    for (; i + 4 <= nb; i += 4) /* whole steps: every block present, no tests */
        q4_0_step(mx, nr, na, x, ga, y, i, i + 4, acc);
    if (i < nb)
        q4_0_step(mx, nr, na, x, ga, y, i, nb, acc);
#pragma GCC unroll 2
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 4
        for (int a = 0; a < na; a++)
            out[(size_t)a * os + r] = _mm512_reduce_add_ps(acc[r][a]);
}

/* All rows for one group of na (constant after inlining) activations: one row at a time
 * for one activation (one sequential stream, as the other decode kernels read), two for
 * more, which then share each load of an activation's group. */
INLINE void multi_q4_rows(bool mx, int na, const uint8_t *w, size_t rb, int64_t n_rows,
                          const uint8_t *act, size_t as, int64_t nb, float *out, size_t os)
{
    const qblock_q8_0 *y[MA];
#pragma GCC unroll 4
    for (int a = 0; a < na; a++)
        y[a] = (const qblock_q8_0 *)(const void *)(act + (size_t)a * as);
    q4_0_act_group ga[MA][Q4_0_ACT_MAX_N / 128];
    bool ordered = nb * QB_32 <= Q4_0_ACT_MAX_N;
    for (int a = 0; a < na && ordered; a++)
        for (int64_t i = 0; i < nb; i += 4)
            ga[a][i / 4] = q4_0_act_group_at(y[a], i, nb, mx ? 7 : 3);
    const q4_0_act_group(*g)[Q4_0_ACT_MAX_N / 128] = ordered ? (const q4_0_act_group(*)[Q4_0_ACT_MAX_N / 128])ga : NULL;
    int64_t r = 0;
    if (na > 1)
        for (; r + Q4_0_MR <= n_rows; r += Q4_0_MR)
            q4_0_rows(mx, Q4_0_MR, na, w + (size_t)r * rb, rb, g, y, nb, out + r, os);
    for (; r < n_rows; r++)
        q4_0_rows(mx, 1, na, w + (size_t)r * rb, rb, g, y, nb, out + r, os);
}

INLINE void multi_q4_0_rows(int na, const uint8_t *w, size_t rb, int64_t n_rows,
                            const uint8_t *act, size_t as, int64_t nb, float *out, size_t os)
{
    multi_q4_rows(false, na, w, rb, n_rows, act, as, nb, out, os);
}

INLINE void multi_mxfp4_rows(int na, const uint8_t *w, size_t rb, int64_t n_rows,
                             const uint8_t *act, size_t as, int64_t nb, float *out, size_t os)
{
    multi_q4_rows(true, na, w, rb, n_rows, act, as, nb, out, os);
}

/*
 * Q4_1, Q5_0, Q5_1 and IQ4_NL (kind, a constant after inlining), two blocks a step
 * as Q8_0's decode: each block's 32 values unpacked unsigned (Q5_0's as q = value + 16,
 * IQ4_NL's grid values as value + 128) into a half of a register in element
 * order (Q5_0/Q5_1's fifth bits added as 16 under a mask made of the two qh words), and
 * vpdpbusd multiplies them with the activation's signed quants as stored, starting each
 * lane at -16 (-128) times the sum of its four activation quants for Q5_0 (IQ4_NL):
 * every lane holds an exact integer sum, scaled per block in f32. Q4_1/Q5_1 add m
 * times each lane's activation sum in an f32 accumulator of their own (llama.cpp reads
 * that sum from Q8_1 activations, rounded to f16; here it is the exact integer). One
 * weight row at a time, as the other decode kernels read; the activations' side (quants,
 * lane sums, scales) is made once per call where it fits a stack buffer.
 */
enum legacy_kind { LEGACY_Q4_1, LEGACY_Q5_0, LEGACY_Q5_1, LEGACY_IQ4_NL };
#define LEGACY_ACT_MAX_N 8192 /* activation elements a call prepares on its stack */

typedef struct legacy_act_pair {
    __m512i q;    /* (64) the quants of blocks i and i + 1 */
    __m512i sum4; /* (16) the sum of each lane's four quants */
    __m512 d;     /* (16) the blocks' scales, each over its 8 lanes */
} legacy_act_pair;

INLINE legacy_act_pair legacy_act_pair_at(const qblock_q8_0 *y, int64_t i, int64_t nb)
{
    legacy_act_pair p;
    p.q = load_pair(y, i, nb);
    p.sum4 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), p.q);
    p.d = scale_pair(y, i, nb);
    return p;
}

/* The f16 at p0 over lanes 0-7 and the one at p1 (0 where p1 is NULL) over lanes 8-15. */
INLINE __m512 f16_pair(const uint8_t *p0, const uint8_t *p1)
{
    uint16_t h0, h1 = 0;
    memcpy(&h0, p0, 2);
    if (p1)
        memcpy(&h1, p1, 2);
    __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16((short)h0)),
                                        _mm_set1_epi16((short)h1), 1);
    return _mm512_cvtph_ps(h);
}

/* The 32 nibbles at qs in element order: low nibbles, then high ones. */
INLINE __m256i nibbles32(const uint8_t *qs)
{
    __m128i b = _mm_loadu_si128((const __m128i *)(const void *)qs);
    __m256i v = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
    return _mm256_and_si256(v, _mm256_set1_epi8(0xF));
}

INLINE void multi_legacy(enum legacy_kind kind, int na, const uint8_t *row,
                         const qblock_q8_0 *const *y, const legacy_act_pair *pa,
                         size_t pa_stride, int64_t nb, float *out, size_t os)
{
    const size_t bb = kind == LEGACY_Q4_1     ? sizeof(qblock_q4_1)
                      : kind == LEGACY_Q5_0   ? sizeof(qblock_q5_0)
                      : kind == LEGACY_Q5_1   ? sizeof(qblock_q5_1)
                                              : sizeof(qblock_iq4_nl);
    const bool has_min = kind == LEGACY_Q4_1 || kind == LEGACY_Q5_1;
    const __m512i grid = _mm512_broadcast_i32x4(_mm_loadu_si128(
        (const __m128i *)(const void *)qb_iq4_grid));
    __m512 acc[MA], accm[MA];
#pragma GCC unroll 8
    for (int a = 0; a < na; a++)
        acc[a] = accm[a] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i += 2) {
        const uint8_t *x0 = row + (size_t)i * bb, *x1 = i + 1 < nb ? x0 + bb : NULL;
        /* d first in every struct, m after it; qh the 4 bytes before the
         * nibbles */
        __m256i hi = x1 ? nibbles32(x1 + bb - 16) : _mm256_setzero_si256();
        __m512i u = _mm512_inserti64x4(_mm512_castsi256_si512(nibbles32(x0 + bb - 16)), hi, 1);
        if (kind == LEGACY_Q5_0 || kind == LEGACY_Q5_1) {
            uint32_t h0, h1 = 0;
            memcpy(&h0, x0 + bb - 20, 4);
            if (x1)
                memcpy(&h1, x1 + bb - 20, 4);
            u = _mm512_mask_add_epi8(u, (__mmask64)h1 << 32 | h0, u, _mm512_set1_epi8(16));
        }
        if (kind == LEGACY_IQ4_NL)
            u = _mm512_xor_si512(_mm512_shuffle_epi8(grid, u), _mm512_set1_epi8((char)0x80));
        __m512 dw = f16_pair(x0, x1);
        __m512 mw = _mm512_setzero_ps();
        if (has_min)
            mw = f16_pair(x0 + 2, x1 ? x1 + 2 : NULL);
#pragma GCC unroll 8
        for (int a = 0; a < na; a++) {
            legacy_act_pair p = pa ? pa[(size_t)a * pa_stride + (size_t)i / 2]
                                   : legacy_act_pair_at(y[a], i, nb);
            __m512i start = _mm512_setzero_si512();
            if (!has_min)
                start = _mm512_sub_epi32(start,
                                         _mm512_slli_epi32(p.sum4, kind == LEGACY_Q5_0 ? 4 : 7));
            __m512i s = _mm512_dpbusd_epi32(start, u, p.q);
            acc[a] = _mm512_fmadd_ps(_mm512_mul_ps(dw, p.d), _mm512_cvtepi32_ps(s), acc[a]);
            if (has_min)
                accm[a] = _mm512_fmadd_ps(_mm512_mul_ps(mw, p.d), _mm512_cvtepi32_ps(p.sum4),
                                          accm[a]);
        }
    }
#pragma GCC unroll 8
    for (int a = 0; a < na; a++)
        out[(size_t)a * os] = _mm512_reduce_add_ps(acc[a]) + _mm512_reduce_add_ps(accm[a]);
}

INLINE void multi_legacy_rows(enum legacy_kind kind, int na, const uint8_t *w, size_t rb,
                              int64_t n_rows, const uint8_t *act, size_t as, int64_t nb,
                              float *out, size_t os)
{
    enum { STRIDE = LEGACY_ACT_MAX_N / 64 };
    const qblock_q8_0 *y[MA];
    legacy_act_pair pa[MA * STRIDE];
    bool buffered = nb * QB_32 <= LEGACY_ACT_MAX_N;
#pragma GCC unroll 8
    for (int a = 0; a < na; a++) {
        y[a] = (const qblock_q8_0 *)(const void *)(act + (size_t)a * as);
        for (int64_t i = 0; buffered && i < nb; i += 2)
            pa[(size_t)a * STRIDE + (size_t)i / 2] = legacy_act_pair_at(y[a], i, nb);
    }
    for (int64_t r = 0; r < n_rows; r++)
        multi_legacy(kind, na, w + (size_t)r * rb, y, buffered ? pa : NULL, STRIDE, nb, out + r,
                     os);
}

INLINE void multi_q4_1_rows(int na, const uint8_t *w, size_t rb, int64_t n_rows,
                            const uint8_t *act, size_t as, int64_t nb, float *out, size_t os)
{
    multi_legacy_rows(LEGACY_Q4_1, na, w, rb, n_rows, act, as, nb, out, os);
}

INLINE void multi_q5_0_rows(int na, const uint8_t *w, size_t rb, int64_t n_rows,
                            const uint8_t *act, size_t as, int64_t nb, float *out, size_t os)
{
    multi_legacy_rows(LEGACY_Q5_0, na, w, rb, n_rows, act, as, nb, out, os);
}

INLINE void multi_q5_1_rows(int na, const uint8_t *w, size_t rb, int64_t n_rows,
                            const uint8_t *act, size_t as, int64_t nb, float *out, size_t os)
{
    multi_legacy_rows(LEGACY_Q5_1, na, w, rb, n_rows, act, as, nb, out, os);
}

INLINE void multi_iq4_nl_rows(int na, const uint8_t *w, size_t rb, int64_t n_rows,
                              const uint8_t *act, size_t as, int64_t nb, float *out, size_t os)
{
    multi_legacy_rows(LEGACY_IQ4_NL, na, w, rb, n_rows, act, as, nb, out, os);
}

/*
 * IQ4_XS on Q8_K activations, one weight row at a time: a register holds two sub-blocks
 * of 32 (their signed grid values, in element order); maddubs multiplies their
 * magnitudes with the activation's quants, negated where the weight is negative (pair
 * sums of at most 2 * 127 * 127, no saturation), and vpdpwssd applies each sub-block's
 * 6-bit scale while widening and adding: the scalar kernel's integers per super-block,
 * scaled in f32. From L2 on one thread this reads 15.2 GB/s where offset weights in
 * vpdpbusd and a 32-bit multiply by the scale per lane read 10.0.
 */
INLINE void multi_iq4_xs(int na, const uint8_t *row, const qblock_q8_k *const *y, int64_t nb,
                         float *out, size_t os)
{
    const __m512i grid =
        _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)qb_iq4_grid));
    const __m512i m4 = _mm512_set1_epi8(0xF);
    const __m512i nib_shift = _mm512_broadcast_i64x4(
        _mm256_set_m128i(_mm_set1_epi16(4), _mm_setzero_si128())); /* per 16-bit word */
    __m512 acc[MA];
#pragma GCC unroll 8
    for (int a = 0; a < na; a++)
        acc[a] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const qblock_iq4_xs *x = (const qblock_iq4_xs *)(const void *)(row + (size_t)i * sizeof *x);
        __m512i wabs[4], sc[4];
        __mmask64 neg[4];
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            /* 128-bit lanes: the 16 bytes of sub-block 2 g twice, then those of 2 g + 1
             * twice, shifted to their low nibbles (elements 0-15) and high (16-31) */
            __m512i b = _mm512_castsi256_si512(
                _mm256_loadu_si256((const __m256i *)(const void *)(x->qs + 32 * g)));
            __m512i v = _mm512_and_si512(
                _mm512_srlv_epi16(_mm512_shuffle_i64x2(b, b, 0x50), nib_shift), m4);
            __m512i w = _mm512_shuffle_epi8(grid, v);
            wabs[g] = _mm512_abs_epi8(w);
            neg[g] = _mm512_movepi8_mask(w);
            sc[g] = _mm512_inserti64x4(_mm512_set1_epi16((short)qb_iq4_xs_scale(x, 2 * g)),
                                       _mm256_set1_epi16((short)qb_iq4_xs_scale(x, 2 * g + 1)), 1);
        }
        float dw = _cvtsh_ss(x->d);
#pragma GCC unroll 8
        for (int a = 0; a < na; a++) {
            __m512i sumi = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                __m512i q = _mm512_loadu_si512(y[a][i].qs + 64 * g);
                q = _mm512_mask_sub_epi8(q, neg[g], _mm512_setzero_si512(), q);
                sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(wabs[g], q), sc[g]);
            }
            __m512 d = _mm512_set1_ps(dw * y[a][i].d);
            acc[a] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi), acc[a]);
        }
    }
#pragma GCC unroll 8
    for (int a = 0; a < na; a++)
        out[(size_t)a * os] = _mm512_reduce_add_ps(acc[a]);
}

INLINE void multi_iq4_xs_rows(int na, const uint8_t *w, size_t rb, int64_t n_rows,
                              const uint8_t *act, size_t as, int64_t nb, float *out, size_t os)
{
    const qblock_q8_k *y[MA];
#pragma GCC unroll 8
    for (int a = 0; a < na; a++)
        y[a] = (const qblock_q8_k *)(const void *)(act + (size_t)a * as);
    for (int64_t r = 0; r < n_rows; r++)
        multi_iq4_xs(na, w + (size_t)r * rb, y, nb, out + r, os);
}

/*
 * Q4_K and Q5_K (five: a constant after inlining): one weight row at a time. A 64-byte
 * load of qs covers groups g and g + 1, so its low nibbles are the activation's chunks
 * (of 32 elements) 2 g and 2 g + 2 and its high nibbles chunks 2 g + 1 and 2 g + 3: a
 * super-block's weights take two loads and two masks and a shift each (Q5_K's fifth bits
 * added as 16 where a byte test of its qh bit sets them), and the activations, once per
 * call for all rows, are put in that order (k_act_regs). Values are unsigned, so maddubs
 * takes them as they are and vpdpwssd applies the sub-block scales while widening and
 * adding: the same integers as the scalar kernel. Decode of a Q4_K model on one thread
 * waits on this arithmetic about as long as on DRAM: from L2 it reads 26.0 GB/s where the
 * kernel that unpacked 32 bytes a register read 22.1.
 */
#define K_ACT_MAX_N 8192 /* activation elements a call reorders into its stack buffer */
/* With one activation the kernel asks for the bytes 4 KiB ahead in its own stream (past
 * the end of the row, into the next; an integer address, as past the matrix it points
 * nowhere): with the hardware prefetcher alone, arithmetic and DRAM take turns. A TinyLlama
 * Q4_K_M model's matrices mapped from the file, one thread: 20.1 and 18.7 GB/s with it,
 * 17.9 and 16.6 without (2 and 8 KiB ahead: 19.2 and 19.6). Q6_K's kernel measured no
 * faster with it (20.5 against 21.0) and has none. */
#define K_PREFETCH_AHEAD 4096

/* Register r of a super-block's activation quants: chunks (0, 2), (1, 3), (4, 6), (5, 7)
 * for r = 0..3, as the weights' registers hold them. */
INLINE void k_act_regs(const int8_t *qs, __m512i reg[4])
{
    const __m512i lo = _mm512_set_epi64(11, 10, 9, 8, 3, 2, 1, 0);
    const __m512i hi = _mm512_set_epi64(15, 14, 13, 12, 7, 6, 5, 4);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        __m512i a = _mm512_loadu_si512(qs + 128 * h), b = _mm512_loadu_si512(qs + 128 * h + 64);
        reg[2 * h] = _mm512_permutex2var_epi64(a, lo, b);
        reg[2 * h + 1] = _mm512_permutex2var_epi64(a, hi, b);
    }
}

/* Per half of register r (the chunks k_act_regs puts there): a byte 1 << chunk, the bit
 * of Q5_K's qh that holds the chunk's fifth bits. */
INLINE __m512i k_qh_bits(int r)
{
    int lo = r / 2 * 4 + r % 2, hi = lo + 2;
    return _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << lo)),
                              _mm256_set1_epi8((char)(1 << hi)), 1);
}

/* Per half of register r: the byte shuffle that spreads the chunk's scale word over it. */
INLINE __m512i k_scale_shuffle(int r)
{
    int lo = r / 2 * 4 + r % 2, hi = lo + 2;
    return _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * lo | (2 * lo + 1) << 8)),
                              _mm256_set1_epi16((short)(2 * hi | (2 * hi + 1) << 8)), 1);
}

INLINE void multi_k_affine(int five, int na, const uint8_t *row, const qblock_q8_k *const *y,
                           const __m512i *kact, size_t kact_stride, int64_t nb, float *out,
                           size_t os)
{
    /* the two layouts differ only in where qs starts and in Q5_K's qh before it */
    const size_t bb = five ? sizeof(qblock_q5_k) : sizeof(qblock_q4_k);
    const size_t qs_at = five ? offsetof(qblock_q5_k, qs) : offsetof(qblock_q4_k, qs);
    __m512 acc[MA];
    __m256 accm[MA];
#pragma GCC unroll 8
    for (int a = 0; a < na; a++) {
        acc[a] = _mm512_setzero_ps();
        accm[a] = _mm256_setzero_ps();
    }
    const __m512i m4 = _mm512_set1_epi8(0xF), sixteen = _mm512_set1_epi8(16);
    for (int64_t i = 0; i < nb; i++) {
        /* d, dmin and scales are where both structs keep them */
        const qblock_q4_k *x = (const qblock_q4_k *)(const void *)(row + (size_t)i * bb);
        const uint8_t *qs = row + (size_t)i * bb + qs_at;
        if (na == 1)
            for (size_t k = 0; k < bb; k += 64)
                _mm_prefetch((const char *)((uintptr_t)row + (size_t)i * bb + K_PREFETCH_AHEAD + k),
                             _MM_HINT_T0);
        uint64_t scw, m;
        qb_unpack_k_scales(x->scales, &scw, &m);
        __m128i m8 = _mm_cvtsi64_si128((long long)m);
        __m256i m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
        __m512i s16 = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)scw)));
        __m512i q[4], sc[4], qh = _mm512_setzero_si512();
        if (five)
            qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                (const __m256i *)(const void *)(row + (size_t)i * bb + offsetof(qblock_q5_k, qh))));
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            if (r % 2 == 0) {
                __m512i v = _mm512_loadu_si512(qs + 32 * r);
                q[r] = _mm512_and_si512(v, m4);
                q[r + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
            }
            if (five)
                q[r] = _mm512_mask_add_epi8(q[r], _mm512_test_epi8_mask(qh, k_qh_bits(r)),
                                            q[r], sixteen);
            sc[r] = _mm512_shuffle_epi8(s16, k_scale_shuffle(r));
        }
        float dw = _cvtsh_ss(x->d), dmin = _cvtsh_ss(x->dmin);
#pragma GCC unroll 8
        for (int a = 0; a < na; a++) {
            __m512i ar[4];
            if (kact) {
#pragma GCC unroll 4
                for (int r = 0; r < 4; r++)
                    ar[r] = _mm512_load_si512(kact + (size_t)a * kact_stride + 4 * (size_t)i + r);
            } else {
                k_act_regs(y[a][i].qs, ar);
            }
            __m512i sumi = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++)
                sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(q[r], ar[r]), sc[r]);
            acc[a] = _mm512_fmadd_ps(_mm512_set1_ps(dw * y[a][i].d), _mm512_cvtepi32_ps(sumi), acc[a]);
            __m256i bs = _mm256_loadu_si256(
                (const __m256i *)(const void *)((const uint8_t *)&y[a][i] + offsetof(qblock_q8_k, bsums)));
            accm[a] = _mm256_fmadd_ps(_mm256_set1_ps(dmin * y[a][i].d),
                                      _mm256_cvtepi32_ps(_mm256_madd_epi16(bs, m16)), accm[a]);
        }
    }
#pragma GCC unroll 8
    for (int a = 0; a < na; a++) {
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(accm[a]), _mm256_extractf128_ps(accm[a], 1));
        s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        s = _mm_add_ss(s, _mm_movehdup_ps(s));
        out[(size_t)a * os] = _mm512_reduce_add_ps(acc[a]) - _mm_cvtss_f32(s);
    }
}

/* All rows; the activations reordered once into a stack buffer where they fit, else per
 * super-block and row (the same registers either way, so the same results). */
INLINE void multi_k_affine_rows(int five, int na, const uint8_t *w, size_t rb, int64_t n_rows,
                                const uint8_t *act, size_t as, int64_t nb, float *out, size_t os)
{
    const qblock_q8_k *y[MA];
#pragma GCC unroll 8
    for (int a = 0; a < na; a++)
        y[a] = (const qblock_q8_k *)(const void *)(act + (size_t)a * as);
    enum { STRIDE = K_ACT_MAX_N / 64 };
    __m512i kact[MA * STRIDE];
    bool buffered = nb * 4 <= STRIDE;
    for (int a = 0; buffered && a < na; a++)
        for (int64_t i = 0; i < nb; i++)
            k_act_regs(y[a][i].qs, kact + (size_t)a * STRIDE + 4 * (size_t)i);
    for (int64_t r = 0; r < n_rows; r++)
        multi_k_affine(five, na, w + (size_t)r * rb, y, buffered ? kact : NULL, STRIDE, nb,
                       out + r, os);
}

INLINE void multi_q4_k_rows(int na, const uint8_t *w, size_t rb, int64_t n_rows,
                            const uint8_t *act, size_t as, int64_t nb, float *out, size_t os)
{
    multi_k_affine_rows(0, na, w, rb, n_rows, act, as, nb, out, os);
}

INLINE void multi_q5_k_rows(int na, const uint8_t *w, size_t rb, int64_t n_rows,
                            const uint8_t *act, size_t as, int64_t nb, float *out, size_t os)
{
    multi_k_affine_rows(1, na, w, rb, n_rows, act, as, nb, out, os);
}

/*
 * Q6_K, as Q4_K: one weight row at a time, its 6-bit values (stored as q + 32, so
 * unsigned as maddubs wants them) unpacked once per super-block, 64 per register in
 * element order, and its sixteen scales widened for up to MA activations; the + 32 comes
 * off through the activation's sums of 16; vpdpwssd applies the scales. The integers are
 * the scalar kernel's, and the lanes' sums those of the madd-and-add kernel before it, so
 * results are bit for bit what they were; from L2 it reads 31.8 GB/s where that one (which
 * also prefetched the next row) read 29.0, on one thread.
 * Q3_K the same way: its values q - 4 unpacked as q (0..7; two bits of qs and one of
 * hmask), the + 4 off through the sums, its 6-bit scales (sc - 32) in the place of Q6_K's
 * int8 ones. Q2_K too: its values (0..3) as they are, its 4-bit scales, and its 4-bit
 * mins times the activation's sums in an f32 accumulator of their own, as Q4_K's.
 */
enum k16_kind { K16_Q6, K16_Q3, K16_Q2 }; /* a constant after inlining */
/* Q6_K's values of a super-block, 64 a register in element order, and its scales. */
INLINE void q6_k_unpack(const qblock_q6_k *x, __m512i q[4], __m256i *sc16)
{
    const __m512i m4 = _mm512_set1_epi8(0xF), m30 = _mm512_set1_epi8(0x30);
    /* qh's bits for a register's two halves moved to bits 4-5: <<4 and <<2 (low nibbles),
     * >>0 and >>2 (high nibbles) */
    const __m512i lo_shift = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i hi_shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    *sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)x->scales));
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        /* low nibbles of ql are elements 0-63 of the half, high nibbles 64-127; their
         * top two bits sit in qh at bits 0-1 / 2-3 (low) and 4-5 / 6-7 (high) */
        __m512i l = _mm512_loadu_si512(x->ql + 64 * h);
        __m512i hb = _mm512_broadcast_i64x4(
            _mm256_loadu_si256((const __m256i *)(const void *)(x->qh + 32 * h)));
        q[2 * h] = _mm512_or_si512(_mm512_and_si512(l, m4),
                                   _mm512_and_si512(_mm512_sllv_epi16(hb, lo_shift), m30));
        q[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                       _mm512_and_si512(_mm512_srlv_epi16(hb, hi_shift), m30));
    }
}

/* Q3_K's values q (0..7) of a super-block, 64 a register in element order: register g
 * holds runs 2 g and 2 g + 1 of 32 (run 4 h + j: bits 2 j of qs[32 h ..], bit 4 h + j of
 * hmask), one in each half; and its scales less 32. */
INLINE void q3_k_unpack(const qblock_q3_k *x, __m512i q[4], __m256i *sc16)
{
    const __m512i m3 = _mm512_set1_epi8(3), four = _mm512_set1_epi8(4);
    *sc16 = _mm256_cvtepi8_epi16(qx_q3_k_scales(x->scales));
    __m512i hm =
        _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(const void *)x->hmask));
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++) {
        int h = g / 2, j = 2 * (g % 2); /* runs 4 h + j and 4 h + j + 1 */
        __m512i v = _mm512_broadcast_i64x4(
            _mm256_loadu_si256((const __m256i *)(const void *)(x->qs + 32 * h)));
        __m512i shift = _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * j)),
                                           _mm256_set1_epi16((short)(2 * j + 2)), 1);
        __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (4 * h + j))),
                                         _mm256_set1_epi8((char)(1 << (4 * h + j + 1))), 1);
        __m512i lo = _mm512_and_si512(_mm512_srlv_epi16(v, shift), m3);
        q[g] = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(hm, bit), lo, four);
    }
}

/* Q2_K's values (0..3) of a super-block, 64 a register in element order as Q3_K's, and
 * its scales and mins. */
INLINE void q2_k_unpack(const qblock_q2_k *x, __m512i q[4], __m256i *sc16, __m256i *m16)
{
    const __m512i m3 = _mm512_set1_epi8(3);
    __m128i s8 = _mm_loadu_si128((const __m128i *)(const void *)x->scales);
    *sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(s8, _mm_set1_epi8(0xF)));
    *m16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s8, 4), _mm_set1_epi8(0xF)));
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++) {
        int h = g / 2, j = 2 * (g % 2);
        __m512i v = _mm512_broadcast_i64x4(
            _mm256_loadu_si256((const __m256i *)(const void *)(x->qs + 32 * h)));
        __m512i shift = _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * j)),
                                           _mm256_set1_epi16((short)(2 * j + 2)), 1);
        q[g] = _mm512_and_si512(_mm512_srlv_epi16(v, shift), m3);
    }
}

INLINE void multi_k16(enum k16_kind kind, int na, const uint8_t *row, const uint8_t *act,
                        size_t as, int64_t nb, float *out, size_t os)
{
    const size_t bb = kind == K16_Q2   ? sizeof(qblock_q2_k)
                      : kind == K16_Q3 ? sizeof(qblock_q3_k)
                                     : sizeof(qblock_q6_k);
    const qblock_q8_k *y[MA];
    __m512 acc[MA];
    __m256 accm[MA];
#pragma GCC unroll 8
    for (int a = 0; a < na; a++) {
        y[a] = (const qblock_q8_k *)(const void *)(act + (size_t)a * as);
        acc[a] = _mm512_setzero_ps();
        accm[a] = _mm256_setzero_ps();
    }
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *blk = row + (size_t)i * bb;
        __m512i q[4], sc[4];
        __m256i sc16, m16 = _mm256_setzero_si256();
        float dw, dmin = 0;
        if (kind == K16_Q2) {
            const qblock_q2_k *x = (const qblock_q2_k *)(const void *)blk;
            q2_k_unpack(x, q, &sc16, &m16);
            dw = _cvtsh_ss(x->d);
            dmin = _cvtsh_ss(x->dmin);
        } else if (kind == K16_Q3) {
            const qblock_q3_k *x = (const qblock_q3_k *)(const void *)blk;
            q3_k_unpack(x, q, &sc16);
            dw = _cvtsh_ss(x->d);
        } else {
            const qblock_q6_k *x = (const qblock_q6_k *)(const void *)blk;
            q6_k_unpack(x, q, &sc16);
            dw = _cvtsh_ss(x->d);
        }
        __m512i s16 = _mm512_castsi256_si512(sc16);
        /* word w of register g's maddubs products belongs to sub-block 4 g + w / 8 */
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            __m512i idx = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_set_m128i(_mm_set1_epi16((short)(4 * g + 1)),
                                                        _mm_set1_epi16((short)(4 * g)))),
                _mm256_set_m128i(_mm_set1_epi16((short)(4 * g + 3)), _mm_set1_epi16((short)(4 * g + 2))),
                1);
            sc[g] = _mm512_permutexvar_epi16(idx, s16);
        }
#pragma GCC unroll 8
        for (int a = 0; a < na; a++) {
            __m256i bs = _mm256_loadu_si256(
                (const __m256i *)(const void *)((const uint8_t *)&y[a][i] + offsetof(qblock_q8_k, bsums)));
            /* the offset (32 or 4) times each sub-block's scale and activation sum; Q2_K's
             * mins times those sums */
            __m512i sumi = _mm512_setzero_si512();
            if (kind == K16_Q2) {
                accm[a] = _mm256_fmadd_ps(_mm256_set1_ps(dmin * y[a][i].d),
                                          _mm256_cvtepi32_ps(_mm256_madd_epi16(bs, m16)), accm[a]);
            } else {
                __m256i corr =
                    _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), kind == K16_Q3 ? 2 : 5);
                sumi = _mm512_zextsi256_si512(_mm256_sub_epi32(_mm256_setzero_si256(), corr));
            }
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                __m512i p = _mm512_maddubs_epi16(q[g], _mm512_loadu_si512(y[a][i].qs + 64 * g));
                sumi = _mm512_dpwssd_epi32(sumi, p, sc[g]);
            }
            acc[a] = _mm512_fmadd_ps(_mm512_set1_ps(dw * y[a][i].d), _mm512_cvtepi32_ps(sumi), acc[a]);
        }
    }
#pragma GCC unroll 8
    for (int a = 0; a < na; a++) {
        float m = 0;
        if (kind == K16_Q2) {
            __m128 s = _mm_add_ps(_mm256_castps256_ps128(accm[a]), _mm256_extractf128_ps(accm[a], 1));
            s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            m = _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
        }
        out[(size_t)a * os] = _mm512_reduce_add_ps(acc[a]) - m;
    }
}

INLINE void multi_q6_k_rows(int na, const uint8_t *w, size_t rb, int64_t n_rows,
                            const uint8_t *act, size_t as, int64_t nb, float *out, size_t os)
{
    for (int64_t r = 0; r < n_rows; r++)
        multi_k16(K16_Q6, na, w + (size_t)r * rb, act, as, nb, out + r, os);
}

INLINE void multi_q3_k_rows(int na, const uint8_t *w, size_t rb, int64_t n_rows,
                            const uint8_t *act, size_t as, int64_t nb, float *out, size_t os)
{
    for (int64_t r = 0; r < n_rows; r++)
        multi_k16(K16_Q3, na, w + (size_t)r * rb, act, as, nb, out + r, os);
}

INLINE void multi_q2_k_rows(int na, const uint8_t *w, size_t rb, int64_t n_rows,
                            const uint8_t *act, size_t as, int64_t nb, float *out, size_t os)
{
    for (int64_t r = 0; r < n_rows; r++)
        multi_k16(K16_Q2, na, w + (size_t)r * rb, act, as, nb, out + r, os);
}

/*
 * Q8_0 on packed activations: lanes are activations. vpdpbusd multiplies the 16
 * activations' bytes of one 4-byte group (a + 128, unsigned) by the same 4 weight bytes
 * broadcast from the row as it is stored (signed), so eight of them give one row's whole
 * block sum for 16 activations at once, and the scaling then costs three instructions
 * per block and row instead of three per block, row and activation. The offset is taken
 * back by starting the sum at -128 * (the block's weight sum), computed once per block
 * for eight rows. Blocks are added one after another as the scalar kernel does,
 * sum += (d_w * d_a) * (float)isum, so each result equals quant_dot_scalar bit for bit
 * (this file is compiled with -ffp-contract=off).
 *
 * Fewer activations would leave most lanes idle, so a last group of at most 8 (all of
 * them, for 3-8 streams) gives each activation L = 16 / width lanes (4 or 2): lane (a, j)
 * of the v-th product holds activation a's group L v + j, and the product's 4 L weight
 * bytes are spread over every lane, so 8 / L products cover a block. The offset is then
 * on the weights' side (w ^ 0x80) and taken back by starting each lane at -128 * (the
 * sum of its activation bytes), which the packing computes once per block for all rows.
 * Against quant_dot_rows_multi (4 instructions per 64 products per row and activation)
 * this measured, one thread, 5632 x 2048 in L3: 4 activations 51 -> 69 GMAC/s, 8 54 -> 100. Each lane holds a part of a block's integer sum
 * (exact), scaled and added in f32 per lane; the L lanes of an activation are added at
 * the end, so only the order of the f32 additions differs from quant_dot_scalar.
 */
#define PACK_LANES 16
#define PACK_ROWS 8

/* One block of 16 activations: their scales, then for each of the block's eight 4-byte
 * groups the 16 activations' bytes of it, offset by 128. */
typedef struct pack_block {
    float d[PACK_LANES];
    uint8_t q[8][PACK_LANES][4];
} pack_block;

/* A block of a narrow group (width 4 or 8 activations, L = 16 / width lanes each): the
 * lanes' starting sums, the activations' scales over their lanes, then 8 / L vectors of
 * activation bytes as they stand (signed). */
typedef struct narrow_head {
    int32_t init[PACK_LANES];
    float d[PACK_LANES];
} narrow_head;

INLINE size_t narrow_block_bytes(int width)
{
    return sizeof(narrow_head) + (size_t)width / 2 * 64;
}

/* Activations in the group starting with n_left of them still to pack: 16, or the
 * narrow widths for a last group of at most 8. */
INLINE int group_width(int n_left)
{
    return n_left >= 9 ? PACK_LANES : n_left > 4 ? 8 : 4;
}

INLINE size_t group_block_bytes(int width)
{
    return width == PACK_LANES ? sizeof(pack_block) : narrow_block_bytes(width);
}

size_t quant_avx512_packed_bytes(int n_act, int64_t n)
{
    size_t per_block = 0;
    for (int g0 = 0; g0 < n_act; g0 += PACK_LANES)
        per_block += group_block_bytes(group_width(n_act - g0));
    return per_block * (size_t)(n / QB_32);
}

INLINE const qblock_q8_0 *act_block(const void *act, size_t act_stride, int a, int64_t b)
{
    return (const qblock_q8_0 *)(const void *)((const uint8_t *)act + (size_t)a * act_stride) + b;
}

static void pack_wide(const void *act, size_t act_stride, int g0, int n_act, int64_t nb,
                      pack_block *p)
{
    for (int64_t b = 0; b < nb; b++, p++)
        for (int t = 0; t < PACK_LANES; t++) {
            if (g0 + t >= n_act) {
                /* a missing activation: zero scale, bytes that stand for 0 */
                p->d[t] = 0.0f;
                for (int g = 0; g < 8; g++)
                    memset(p->q[g][t], 0x80, 4);
                continue;
            }
            const qblock_q8_0 *y = act_block(act, act_stride, g0 + t, b);
            p->d[t] = _cvtsh_ss(y->d);
            for (int g = 0; g < 8; g++)
                for (int k = 0; k < 4; k++)
                    p->q[g][t][k] = (uint8_t)(y->qs[4 * g + k] ^ 0x80);
        }
}

static void pack_narrow(const void *act, size_t act_stride, int g0, int n_act, int width,
                        int64_t nb, uint8_t *p)
{
    const int L = PACK_LANES / width, n_vec = 8 / L;
    for (int64_t b = 0; b < nb; b++, p += narrow_block_bytes(width)) {
        narrow_head *h = (narrow_head *)(void *)p;
        uint8_t(*q)[PACK_LANES][4] = (uint8_t(*)[PACK_LANES][4])(void *)(p + sizeof *h);
        for (int l = 0; l < PACK_LANES; l++) {
            int a = g0 + l / L, j = l % L;
            /* a missing activation: zero scale and bytes */
            const qblock_q8_0 *y = a < n_act ? act_block(act, act_stride, a, b) : NULL;
            int32_t sum = 0;
            for (int v = 0; v < n_vec; v++)
                for (int k = 0; k < 4; k++) {
                    int8_t x = y ? y->qs[4 * (L * v + j) + k] : 0;
                    q[v][l][k] = (uint8_t)x;
                    sum += x;
                }
            h->init[l] = -128 * sum;
            h->d[l] = y ? _cvtsh_ss(y->d) : 0.0f;
        }
    }
}

void quant_avx512_pack_q8_0(const void *act, size_t act_stride, int n_act, int64_t n,
                            void *packed)
{
    int64_t nb = n / QB_32;
    uint8_t *p = packed;
    for (int g0 = 0; g0 < n_act; g0 += PACK_LANES) {
        int width = group_width(n_act - g0);
        if (width == PACK_LANES)
            pack_wide(act, act_stride, g0, n_act, nb, (pack_block *)(void *)p);
        else
            pack_narrow(act, act_stride, g0, n_act, width, nb, p);
        p += group_block_bytes(width) * (size_t)nb;
    }
}

/* The weights stream from DRAM once per step whatever the batch, and a pass over eight
 * rows is too short for the hardware prefetcher to run ahead: each block of a pass
 * fetches its share of the rows after the pass (integer addresses, as the last pass
 * prefetches past the matrix, which is harmless). Into L1 for 16 activations, into L2
 * for fewer, whose passes are shorter (measured, one thread, 5632 x 2048 matrices out
 * of L3: 4 activations 43 -> 51 GMAC/s with L2 against L1, 16 about even). */
#define PREFETCH_NEXT_ROWS_INIT(w, nr, rb, nb)                                                \
    const uintptr_t pf_base = (uintptr_t)(w) + (size_t)(nr) * (rb);                           \
    const size_t pf_step = (nb) ? ((size_t)(nr) * (rb) / (size_t)(nb) + 63) & ~(size_t)63 : 0
#define PREFETCH_NEXT_ROWS(b, hint)                                                           \
    for (size_t k = 0; k < pf_step; k += 64)                                                  \
    _mm_prefetch((const char *)(pf_base + (size_t)(b) * pf_step + k), hint)

/* -128 * the weight sum of block b of each of the (up to eight) rows. */
INLINE void block_offsets8(const qblock_q8_0 *const *x, int nr, int64_t b, int32_t corr[8])
{
    const __m256i ones = _mm256_set1_epi8(1), zero = _mm256_setzero_si256();
    __m256i s[PACK_ROWS];
#pragma GCC unroll 8
    for (int r = 0; r < PACK_ROWS; r++)
        s[r] = r < nr ? _mm256_dpbusd_epi32(
                            zero, ones, _mm256_loadu_si256((const __m256i *)(const void *)x[r][b].qs))
                      : zero;
    /* h0123 = [rows 0-3 of lanes 0-3 | rows 0-3 of lanes 4-7], likewise h4567 */
    __m256i h0123 = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
    __m256i h4567 = _mm256_hadd_epi32(_mm256_hadd_epi32(s[4], s[5]), _mm256_hadd_epi32(s[6], s[7]));
    __m256i tot = _mm256_add_epi32(_mm256_permute2x128_si256(h0123, h4567, 0x20),
                                   _mm256_permute2x128_si256(h0123, h4567, 0x31));
    _mm256_storeu_si256((__m256i *)(void *)corr, _mm256_sub_epi32(zero, _mm256_slli_epi32(tot, 7)));
}

/* Up to eight rows against one packed group of n_tok (<= 16) activations. */
INLINE void packed_q8_0_rows8(int nr, const uint8_t *w, size_t rb, const pack_block *pk,
                              int64_t nb, int n_tok, float *out, size_t os)
{
    const qblock_q8_0 *x[PACK_ROWS];
    __m512 acc[PACK_ROWS];
#pragma GCC unroll 8
    for (int r = 0; r < PACK_ROWS; r++) {
        x[r] = (const qblock_q8_0 *)(const void *)(w + (size_t)(r < nr ? r : 0) * rb);
        acc[r] = _mm512_setzero_ps();
    }
    PREFETCH_NEXT_ROWS_INIT(w, nr, rb, nb);
    for (int64_t b = 0; b < nb; b++) {
        PREFETCH_NEXT_ROWS(b, _MM_HINT_T0);
        int32_t corr[PACK_ROWS];
        block_offsets8(x, nr, b, corr);
        const pack_block *p = pk + b;
        __m512i a[8];
#pragma GCC unroll 8
        for (int g = 0; g < 8; g++)
            a[g] = _mm512_loadu_si512(p->q[g]);
        __m512 da = _mm512_loadu_ps(p->d);
#pragma GCC unroll 8
        for (int r = 0; r < PACK_ROWS; r++) {
            if (r >= nr)
                break;
            const int8_t *q = x[r][b].qs;
            __m512i s = _mm512_set1_epi32(corr[r]);
#pragma GCC unroll 8
            for (int g = 0; g < 8; g++) {
                int32_t w4;
                memcpy(&w4, q + 4 * g, 4);
                s = _mm512_dpbusd_epi32(s, a[g], _mm512_set1_epi32(w4));
            }
            __m512 m = _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(x[r][b].d)), da);
            acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(m, _mm512_cvtepi32_ps(s)));
        }
    }
    for (int r = 0; r < nr; r++) {
        float lane[PACK_LANES];
        _mm512_storeu_ps(lane, acc[r]);
        for (int t = 0; t < n_tok; t++)
            out[(size_t)t * os + r] = lane[t];
    }
}

/* The weight bytes of a block's products, offset by 128 (w ^ 0x80), each over every lane:
 * L = 4 loads and offsets the block at once and spreads its halves (measured 12% faster
 * than two broadcast loads and two offsets), L = 2 broadcasts 8 bytes a product (spreading
 * them by vpermq was no faster). */
INLINE void narrow_weights(int L, const int8_t *q, __m512i bias, __m512i wv[4])
{
    if (L == 4) {
        __m512i w = _mm512_castsi256_si512(_mm256_xor_si256(
            _mm256_loadu_si256((const __m256i *)(const void *)q), _mm512_castsi512_si256(bias)));
        wv[0] = _mm512_shuffle_i32x4(w, w, 0x00);
        wv[1] = _mm512_shuffle_i32x4(w, w, 0x55);
        return;
    }
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) {
        long long w8;
        memcpy(&w8, q + 8 * v, 8);
        wv[v] = _mm512_xor_si512(_mm512_set1_epi64(w8), bias);
    }
}

/* Up to PACK_ROWS rows against one narrow group (width 16 / L) of n_tok activations. */
INLINE void packed_q8_0_narrow(int L, int nr, const uint8_t *w, size_t rb, const uint8_t *pk,
                               int64_t nb, int n_tok, float *out, size_t os)
{
    const int n_vec = 8 / L;
    const size_t bb = narrow_block_bytes(PACK_LANES / L);
    const qblock_q8_0 *x[PACK_ROWS];
    __m512 acc[PACK_ROWS];
#pragma GCC unroll 8
    for (int r = 0; r < PACK_ROWS; r++) {
        x[r] = (const qblock_q8_0 *)(const void *)(w + (size_t)(r < nr ? r : 0) * rb);
        acc[r] = _mm512_setzero_ps();
    }
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    PREFETCH_NEXT_ROWS_INIT(w, nr, rb, nb);
    for (int64_t b = 0; b < nb; b++) {
        PREFETCH_NEXT_ROWS(b, _MM_HINT_T1);
        const uint8_t *p = pk + (size_t)b * bb;
        __m512i init = _mm512_loadu_si512(p), a[4];
        __m512 da = _mm512_loadu_ps(p + offsetof(narrow_head, d));
#pragma GCC unroll 4
        for (int v = 0; v < n_vec; v++)
            a[v] = _mm512_loadu_si512(p + sizeof(narrow_head) + 64 * (size_t)v);
#pragma GCC unroll 8
        for (int r = 0; r < PACK_ROWS; r++) {
            if (r >= nr)
                break;
            const int8_t *q = x[r][b].qs;
            __m512i s = init, wv[4];
            narrow_weights(L, q, bias, wv);
#pragma GCC unroll 4
            for (int v = 0; v < n_vec; v++)
                s = _mm512_dpbusd_epi32(s, wv[v], a[v]);
            __m512 m = _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(x[r][b].d)), da);
            acc[r] = _mm512_fmadd_ps(m, _mm512_cvtepi32_ps(s), acc[r]);
        }
    }
    for (int r = 0; r < nr; r++) {
        float lane[PACK_LANES];
        _mm512_storeu_ps(lane, acc[r]);
        for (int t = 0; t < n_tok; t++) {
            float s = 0.0f;
            for (int j = 0; j < L; j++)
                s += lane[t * L + j];
            out[(size_t)t * os + r] = s;
        }
    }
}

int quant_avx512_dot_rows_packed(uint32_t t, const void *weights, size_t row_bytes,
                                 int64_t n_rows, const void *packed, int n_act, int64_t n,
                                 float *out, size_t out_stride)
{
    if (t != QTYPE_Q8_0)
        return 0;
    const uint8_t *w = weights, *pk = packed;
    int64_t nb = n / QB_32;
    for (int g0 = 0; g0 < n_act; g0 += PACK_LANES) {
        int width = group_width(n_act - g0);
        int n_tok = n_act - g0 < width ? n_act - g0 : width;
        float *o = out + (size_t)g0 * out_stride;
        for (int64_t r = 0; r < n_rows; r += PACK_ROWS) {
            int nr = n_rows - r < PACK_ROWS ? (int)(n_rows - r) : PACK_ROWS;
            const uint8_t *wr = w + (size_t)r * row_bytes;
            if (width == PACK_LANES)
                packed_q8_0_rows8(nr, wr, row_bytes, (const pack_block *)(const void *)pk, nb,
                                  n_tok, o + r, out_stride);
            else if (width == 8)
                packed_q8_0_narrow(2, nr, wr, row_bytes, pk, nb, n_tok, o + r, out_stride);
            else
                packed_q8_0_narrow(4, nr, wr, row_bytes, pk, nb, n_tok, o + r, out_stride);
        }
        pk += group_block_bytes(width) * (size_t)nb;
    }
    return 1;
}

/*
 * F32, F16 and BF16 rows against one f32 activation (decode of a float model): one row
 * at a time from start to end, sixteen weights a step converted in registers, two
 * accumulators so that the adds do not wait on each other, and no software prefetch.
 * Decode is bound by how fast one core pulls the weights from DRAM, and on this machine
 * (AMD EPYC, AVX-512) a single sequential stream that the hardware prefetcher follows
 * reads fastest: on the 154 matrices of a TinyLlama-shaped F16 model mapped from its
 * file, one thread, this reads 23.8 GB/s where two rows at a time with the next two
 * prefetched over the pass read 19.3 (/tmp microbenchmark, interleaved, median of 7),
 * and BF16 (below) 23.7 against 12.9. Rows at a time or prefetch distances of 1-4 KiB
 * only read slower (several streams 4 KiB apart contend).
 */
/* The first min(left, 16) lanes. */
INLINE __mmask16 tail_mask16(int64_t left)
{
    return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
}

INLINE __m512 load16_float(uint32_t t, const void *row, int64_t i)
{
    if (t == QTYPE_F32)
        return _mm512_loadu_ps((const float *)row + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)((const uint16_t *)row + i));
    if (t == QTYPE_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/*
 * A row against k (<= FLOAT_GROUP) activations at once (batched decode, speculative
 * decoding's draft rows): the row's weights are read and widened once for the group
 * instead of once per activation, which on small float models made a step of four rows
 * cost seven single ones. Each activation is summed as it is alone (k = 1: the same
 * 32-element steps on two accumulators, the 16-element step on the first, the same
 * reduction and scalar tail), so batched results equal solo ones bit for bit.
 */
#define FLOAT_GROUP 8

INLINE void row_float_group(int k, uint32_t t, const void *x, const float *const *a,
                            int64_t n, float *out, size_t os)
{
    __m512 acc0[FLOAT_GROUP], acc1[FLOAT_GROUP];
#pragma GCC unroll 8
    for (int g = 0; g < k; g++)
        acc0[g] = acc1[g] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 w0 = load16_float(t, x, i), w1 = load16_float(t, x, i + 16);
#pragma GCC unroll 8
        for (int g = 0; g < k; g++) {
            acc0[g] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(a[g] + i), acc0[g]);
            acc1[g] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(a[g] + i + 16), acc1[g]);
        }
    }
    for (; i + 16 <= n; i += 16) {
        __m512 w0 = load16_float(t, x, i);
#pragma GCC unroll 8
        for (int g = 0; g < k; g++)
            acc0[g] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(a[g] + i), acc0[g]);
    }
#pragma GCC unroll 8
    for (int g = 0; g < k; g++) {
        float s = _mm512_reduce_add_ps(_mm512_add_ps(acc0[g], acc1[g]));
        for (int64_t j = i; j < n; j++)
            s += qb_load_float(t, x, j) * a[g][j];
        out[(size_t)g * os] = s;
    }
}

INLINE float row_float(uint32_t t, const void *x, const float *a, int64_t n)
{
    float s;
    row_float_group(1, t, x, &a, n, &s, 0);
    return s;
}

INLINE void rows_float_all(uint32_t t, const uint8_t *w, size_t rb, int64_t n_rows,
                           const float *a, int64_t n, float *out)
{
    for (int64_t r = 0; r < n_rows; r++)
        out[r] = row_float(t, w + (size_t)r * rb, a, n);
}

#define FLOAT_GROUP_CASE(k)                                                                   \
    case k:                                                                                   \
        for (int64_t r = 0; r < n_rows; r++)                                                  \
            row_float_group(k, t, w + (size_t)r * row_bytes, a, n,                            \
                            out + (size_t)a0 * out_stride + r, out_stride);                   \
        break;

/* Float rows against n_act f32 activations, FLOAT_GROUP at a time. */
static void rows_float_multi(uint32_t t, const uint8_t *w, size_t row_bytes, int64_t n_rows,
                             const uint8_t *act, size_t act_stride, int n_act, int64_t n,
                             float *out, size_t out_stride)
{
    for (int a0 = 0; a0 < n_act; a0 += FLOAT_GROUP) {
        int k = n_act - a0 < FLOAT_GROUP ? n_act - a0 : FLOAT_GROUP;
        const float *a[FLOAT_GROUP];
        for (int g = 0; g < k; g++)
            a[g] = (const float *)(const void *)(act + (size_t)(a0 + g) * act_stride);
        switch (k) {
            FLOAT_GROUP_CASE(1)
            FLOAT_GROUP_CASE(2)
            FLOAT_GROUP_CASE(3)
            FLOAT_GROUP_CASE(4)
            FLOAT_GROUP_CASE(5)
            FLOAT_GROUP_CASE(6)
            FLOAT_GROUP_CASE(7)
            FLOAT_GROUP_CASE(8)
        default:
            break;
        }
    }
}

/*
 * F16 rows longer than QUANT_F16_ROUND_MIN_N against activations rounded to f16 (see
 * quant_f16_rounds_activation for why), kept in f16 so that one, 11 KiB for a 5632-wide
 * row, stays in L1 beside the weight stream. Several (batched decode, compute-bound) go
 * F16H_GROUP at a time: a row's weights are read and widened once for the group, and
 * every activation is summed as it would be alone (the same products, two accumulators
 * taking alternate 16-element steps, the tail in the first), so batched results equal
 * solo ones. Against the exact path, which widened the row again for each activation,
 * batched TinyLlama F16 decode lost 2-4% (16 streams 46.0-46.2 against 47.7-48.2 tok/s,
 * two threads): kept for the 17-20% one stream gains. Groups of 2, or of 4 held as f32,
 * were slower still.
 */
#define F16H_GROUP 4

/* f16 weights at x against k (<= F16H_GROUP, constant after inlining) activations
 * rounded to f16 in af; out[a * os] for activation a. */
INLINE void rows_f16h_group(int k, const uint16_t *x, uint16_t (*af)[QUANT_F16_ROUND_MAX_N],
                            int64_t n, float *out, size_t os)
{
    __m512 acc0[F16H_GROUP], acc1[F16H_GROUP];
#pragma GCC unroll 4
    for (int a = 0; a < k; a++)
        acc0[a] = acc1[a] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 w0 = load16_float(QTYPE_F16, x, i), w1 = load16_float(QTYPE_F16, x, i + 16);
#pragma GCC unroll 4
        for (int a = 0; a < k; a++) {
            acc0[a] = _mm512_fmadd_ps(w0, load16_float(QTYPE_F16, af[a], i), acc0[a]);
            acc1[a] = _mm512_fmadd_ps(w1, load16_float(QTYPE_F16, af[a], i + 16), acc1[a]);
        }
    }
    for (; i < n; i += 16) {
        __mmask16 m = tail_mask16(n - i);
        __m512 w0 = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x + i));
#pragma GCC unroll 4
        for (int a = 0; a < k; a++)
            acc0[a] = _mm512_fmadd_ps(
                w0, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, af[a] + i)), acc0[a]);
    }
#pragma GCC unroll 4
    for (int a = 0; a < k; a++)
        out[(size_t)a * os] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[a], acc1[a]));
}

/* x (n f32) rounded to f16 (to nearest even) into h. */
INLINE void round_to_f16(const float *x, int64_t n, uint16_t *h)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(void *)(h + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(x + i),
                                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++)
        h[i] = _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

#define F16H_GROUP_CASE(k)                                                                    \
    case k:                                                                                   \
        for (int64_t r = 0; r < n_rows; r++)                                                  \
            rows_f16h_group(k, (const uint16_t *)(const void *)(w + (size_t)r * row_bytes),  \
                            af, n, out + (size_t)a0 * out_stride + r, out_stride);            \
        break;

int quant_avx512_f16_dot_rows_rounded(const void *weights, size_t row_bytes, int64_t n_rows,
                                      const void *act, size_t act_stride, int n_act, int64_t n,
                                      float *out, size_t out_stride)
{
    if (n <= QUANT_F16_ROUND_MIN_N || n > QUANT_F16_ROUND_MAX_N)
        return 0;
    const uint8_t *w = weights;
    uint16_t af[F16H_GROUP][QUANT_F16_ROUND_MAX_N]; /* 128 KiB of stack */
    for (int a0 = 0; a0 < n_act; a0 += F16H_GROUP) {
        int k = n_act - a0 < F16H_GROUP ? n_act - a0 : F16H_GROUP;
        for (int a = 0; a < k; a++)
            round_to_f16((const float *)(const void *)((const char *)act +
                                                       (size_t)(a0 + a) * act_stride),
                         n, af[a]);
        switch (k) {
            F16H_GROUP_CASE(1)
            F16H_GROUP_CASE(2)
            F16H_GROUP_CASE(3)
            F16H_GROUP_CASE(4)
        default:
            break;
        }
    }
    return 1;
}

/*
 * BF16 with AVX-512 BF16 (quant.c checks the CPU): vdpbf16ps multiplies 32 bf16 weights
 * by 32 bf16 activations and adds the pairs into 16 f32 lanes in one instruction, where
 * widening the weights by shifts takes three per 16. The activation is rounded to bf16
 * (to nearest even) once per call into a stack buffer: ops calls in with 16 rows at a
 * time, so that is 1/32 of the bytes the rows bring, read from L1. Products of two bf16
 * are exact in f32; vdpbf16ps adds them rounding to nearest even with denormal inputs and
 * results flushed to zero. The tail (n % 32) goes through the same instruction on
 * zero-masked loads, so a row's result does not depend on the rows around it. Rows go
 * one at a time, as the float rows above.
 */
#define QUANT_AVX512_BF16_MAX_N 16384 /* activation elements the stack buffer holds */
#define BF16_TARGET __attribute__((target("avx512bf16")))

BF16_TARGET INLINE __m512bh load32_bf16(const uint16_t *p)
{
    return (__m512bh)_mm512_loadu_si512(p);
}

BF16_TARGET INLINE float row_bf16_dp(const uint16_t *x, const __m512bh *ab, int64_t n)
{
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        acc0 = _mm512_dpbf16_ps(acc0, load32_bf16(x + i), ab[i / 32]);
        acc1 = _mm512_dpbf16_ps(acc1, load32_bf16(x + i + 32), ab[i / 32 + 1]);
    }
    for (; i < n; i += 32) {
        __mmask32 m = n - i >= 32 ? ~(__mmask32)0 : (__mmask32)((1u << (n - i)) - 1);
        acc0 = _mm512_dpbf16_ps(acc0, (__m512bh)_mm512_maskz_loadu_epi16(m, x + i), ab[i / 32]);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

BF16_TARGET int quant_avx512_bf16_dot_rows(const void *weights, size_t row_bytes,
                                           int64_t n_rows, const float *a, int64_t n,
                                           float *out)
{
    if (n > QUANT_AVX512_BF16_MAX_N)
        return 0;
    __m512bh ab[QUANT_AVX512_BF16_MAX_N / 32];
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        ab[i / 32] = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(a + i));
    if (i < n) {
        /* zeros past the end: the tail's masked weights meet zeros, not stale stack */
        int64_t left = n - i;
        __mmask16 lo = tail_mask16(left), hi = left > 16 ? tail_mask16(left - 16) : 0;
        ab[i / 32] = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, a + i + 16),
                                         _mm512_maskz_loadu_ps(lo, a + i));
    }
    const uint8_t *w = weights;
    for (int64_t r = 0; r < n_rows; r++)
        out[r] = row_bf16_dp((const uint16_t *)(const void *)(w + (size_t)r * row_bytes), ab, n);
    return 1;
}

/* Calls ROWS(na, ...) for the activations in groups of MA, na constant in each call. */
#define FOR_GROUPS(ROWS, nb)                                                                  \
    do {                                                                                      \
        int a = 0;                                                                            \
        for (; a + MA <= n_act; a += MA)                                                      \
            ROWS(MA, w, row_bytes, n_rows, y + (size_t)a * act_stride, act_stride, nb,        \
                 out + (size_t)a * out_stride, out_stride);                                   \
        if (n_act - a == 3)                                                                   \
            ROWS(3, w, row_bytes, n_rows, y + (size_t)a * act_stride, act_stride, nb,         \
                 out + (size_t)a * out_stride, out_stride);                                   \
        else if (n_act - a == 2)                                                              \
            ROWS(2, w, row_bytes, n_rows, y + (size_t)a * act_stride, act_stride, nb,         \
                 out + (size_t)a * out_stride, out_stride);                                   \
        else if (n_act - a == 1)                                                              \
            ROWS(1, w, row_bytes, n_rows, y + (size_t)a * act_stride, act_stride, nb,         \
                 out + (size_t)a * out_stride, out_stride);                                   \
    } while (0)

int quant_avx512_dot_rows_multi(uint32_t t, const void *weights, size_t row_bytes,
                                int64_t n_rows, const void *act, size_t act_stride, int n_act,
                                int64_t n, float *out, size_t out_stride)
{
    const uint8_t *w = weights, *y = act;
    switch (t) {
    case QTYPE_Q8_0:
        FOR_GROUPS(multi_q8_0_rows, n / QB_32);
        return 1;
    case QTYPE_Q4_0:
        FOR_GROUPS(multi_q4_0_rows, n / QB_32);
        return 1;
    case QTYPE_Q4_1:
        FOR_GROUPS(multi_q4_1_rows, n / QB_32);
        return 1;
    case QTYPE_Q5_0:
        FOR_GROUPS(multi_q5_0_rows, n / QB_32);
        return 1;
    case QTYPE_Q5_1:
        FOR_GROUPS(multi_q5_1_rows, n / QB_32);
        return 1;
    case QTYPE_IQ4_NL:
        FOR_GROUPS(multi_iq4_nl_rows, n / QB_32);
        return 1;
    case QTYPE_MXFP4:
        FOR_GROUPS(multi_mxfp4_rows, n / QB_32);
        return 1;
    case QTYPE_IQ4_XS:
        FOR_GROUPS(multi_iq4_xs_rows, n / QB_256);
        return 1;
    case QTYPE_Q4_K:
        FOR_GROUPS(multi_q4_k_rows, n / QB_256);
        return 1;
    case QTYPE_Q5_K:
        FOR_GROUPS(multi_q5_k_rows, n / QB_256);
        return 1;
    case QTYPE_Q6_K:
        FOR_GROUPS(multi_q6_k_rows, n / QB_256);
        return 1;
    case QTYPE_Q3_K:
        FOR_GROUPS(multi_q3_k_rows, n / QB_256);
        return 1;
    case QTYPE_Q2_K:
        FOR_GROUPS(multi_q2_k_rows, n / QB_256);
        return 1;
    case QTYPE_F32:
    case QTYPE_F16:
    case QTYPE_BF16:
        /* BF16 alone takes the bf16 dot kernel where the CPU has it (quant.c): several
         * go one at a time through that, so that batched results equal solo ones */
        if (n_act != 1) {
            if (t == QTYPE_BF16)
                return 0;
            rows_float_multi(t, w, row_bytes, n_rows, y, act_stride, n_act, n, out, out_stride);
            return 1;
        }
        if (t == QTYPE_F32)
            rows_float_all(QTYPE_F32, w, row_bytes, n_rows, act, n, out);
        else if (t == QTYPE_F16)
            rows_float_all(QTYPE_F16, w, row_bytes, n_rows, act, n, out);
        else
            rows_float_all(QTYPE_BF16, w, row_bytes, n_rows, act, n, out);
        return 1;
    default:
        return 0;
    }
}

#endif
