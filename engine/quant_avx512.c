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
 * f32 additions differs from quant_dot.
 */
#if defined(__x86_64__)

#include "engine/quant_avx512.h"

#include <immintrin.h>

#include "engine/quant.h"
#include "engine/quant_blocks.h"

#define INLINE static inline __attribute__((always_inline))

/* Weight rows and activation rows per kernel call: 16 accumulators plus the weights,
 * their offsets and scales of 4 rows fit the 32 zmm registers. */
#define MR 4
#define MA 4

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
    float d0 = _cvtsh_ss(b[i].d), d1 = i + 1 < nb ? _cvtsh_ss(b[i + 1].d) : 0.0f;
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(d0)), _mm256_set1_ps(d1), 1);
}

INLINE void multi_q8_0(int nr, int na, const uint8_t *w, size_t rb, const uint8_t *act,
                       size_t as, int64_t nb, float *out, size_t os)
{
    const qblock_q8_0 *x[MR], *y[MA];
    __m512 acc[MR][MA];
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
    for (int64_t i = 0; i < nb; i += 2) {
        __m512i wq[MR], wcorr[MR];
        __m512 dw[MR];
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

/* All rows for one group of na (constant after inlining) activations. */
INLINE void multi_q8_0_rows(int na, const uint8_t *w, size_t rb, int64_t n_rows,
                            const uint8_t *act, size_t as, int64_t nb, float *out, size_t os)
{
    int64_t r = 0;
    for (; r + MR <= n_rows; r += MR)
        multi_q8_0(MR, na, w + (size_t)r * rb, rb, act, as, nb, out + r, os);
    for (; r < n_rows; r++)
        multi_q8_0(1, na, w + (size_t)r * rb, rb, act, as, nb, out + r, os);
}

int quant_avx512_dot_rows_multi(uint32_t t, const void *weights, size_t row_bytes,
                                int64_t n_rows, const void *act, size_t act_stride, int n_act,
                                int64_t n, float *out, size_t out_stride)
{
    if (t != QTYPE_Q8_0)
        return 0;
    const uint8_t *w = weights, *y = act;
    int64_t nb = n / QB_32;
    int a = 0;
    for (; a + MA <= n_act; a += MA)
        multi_q8_0_rows(MA, w, row_bytes, n_rows, y + (size_t)a * act_stride, act_stride, nb,
                        out + (size_t)a * out_stride, out_stride);
    switch (n_act - a) {
    case 3:
        multi_q8_0_rows(3, w, row_bytes, n_rows, y + (size_t)a * act_stride, act_stride, nb,
                        out + (size_t)a * out_stride, out_stride);
        break;
    case 2:
        multi_q8_0_rows(2, w, row_bytes, n_rows, y + (size_t)a * act_stride, act_stride, nb,
                        out + (size_t)a * out_stride, out_stride);
        break;
    case 1:
        multi_q8_0_rows(1, w, row_bytes, n_rows, y + (size_t)a * act_stride, act_stride, nb,
                        out + (size_t)a * out_stride, out_stride);
        break;
    default:
        break;
    }
    return 1;
}

#endif
