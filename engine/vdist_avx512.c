/*
 * vdist_avx512.c — the AVX-512 inner-product kernel (see vdist_simd.h). Compiled with
 * the AVX-512 flags; vdist.c calls it only after checking the CPU.
 *
 * A tile of up to 4 queries by 4 rows keeps 16 accumulators in registers, so each load
 * feeds four multiply-adds; a dimension that is not a multiple of 16 ends with masked
 * loads. Rows are taken in blocks that stay in the L2 cache while every query of the
 * batch passes over them.
 *
 * The int8-row kernel widens 32 int8 of a row at a time to int16, once for the four
 * queries of a tile, and multiplies them with the int16 queries with VNNI's vpdpwssd
 * (pairs summed into int32, exactly). The 16 sums of a 4 x 4 tile are reduced together
 * by shuffles.
 */
#if defined(__x86_64__)

#include "engine/vdist_simd.h"

#include <immintrin.h>

/* Rows per block: 64 rows of 384 floats are 96 KiB, well inside a 1 MiB L2. */
#define VDIST_ROW_BLOCK 64

/* nq x nx products (both at most 4, constants after inlining) of q (rows d apart) and
 * x (rows d apart) into out (rows stride apart). */
static inline __attribute__((always_inline)) void tile(const float *q, const float *x, int d,
                                                       float *out, size_t stride, int nq,
                                                       int nx)
{
    __m512 acc[4][4];
    for (int a = 0; a < nq; a++)
        for (int b = 0; b < nx; b++)
            acc[a][b] = _mm512_setzero_ps();
    int t = 0;
    for (; t + 16 <= d; t += 16) {
        __m512 xv[4];
        for (int b = 0; b < nx; b++)
            xv[b] = _mm512_loadu_ps(x + (size_t)b * d + t);
        for (int a = 0; a < nq; a++) {
            __m512 qv = _mm512_loadu_ps(q + (size_t)a * d + t);
            for (int b = 0; b < nx; b++)
                acc[a][b] = _mm512_fmadd_ps(qv, xv[b], acc[a][b]);
        }
    }
    if (t < d) {
        __mmask16 m = (__mmask16)((1u << (d - t)) - 1);
        __m512 xv[4];
        for (int b = 0; b < nx; b++)
            xv[b] = _mm512_maskz_loadu_ps(m, x + (size_t)b * d + t);
        for (int a = 0; a < nq; a++) {
            __m512 qv = _mm512_maskz_loadu_ps(m, q + (size_t)a * d + t);
            for (int b = 0; b < nx; b++)
                acc[a][b] = _mm512_fmadd_ps(qv, xv[b], acc[a][b]);
        }
    }
    for (int a = 0; a < nq; a++)
        for (int b = 0; b < nx; b++)
            out[(size_t)a * stride + b] = _mm512_reduce_add_ps(acc[a][b]);
}

/* All queries against rows [x0, x1) with tiles of nq queries. */
static inline __attribute__((always_inline)) void rows(const float *q, const float *x, int x0,
                                                       int x1, int d, float *out,
                                                       size_t stride, int nq)
{
    int j = x0;
    for (; j + 4 <= x1; j += 4)
        tile(q, x + (size_t)j * d, d, out + j, stride, nq, 4);
    for (; j < x1; j++)
        tile(q, x + (size_t)j * d, d, out + j, stride, nq, 1);
}

void vdist_avx512_dot(const float *q, int n_q, const float *x, int n_x, int d, float *out,
                      size_t stride)
{
    for (int x0 = 0; x0 < n_x; x0 += VDIST_ROW_BLOCK) {
        int x1 = n_x - x0 < VDIST_ROW_BLOCK ? n_x : x0 + VDIST_ROW_BLOCK;
        int i = 0;
        for (; i + 4 <= n_q; i += 4)
            rows(q + (size_t)i * d, x, x0, x1, d, out + (size_t)i * stride, stride, 4);
        for (; i < n_q; i++)
            rows(q + (size_t)i * d, x, x0, x1, d, out + (size_t)i * stride, stride, 1);
    }
}

/* nq x nx products (both at most 4, constants after inlining) of q (int16 rows d apart,
 * scales qs) and x (int8 rows d apart, scales xs) into out (rows stride apart). */
static inline __attribute__((always_inline)) void tile_q8(const int16_t *q, const float *qs,
                                                          const int8_t *x, const float *xs,
                                                          int d, float *out, size_t stride,
                                                          int nq, int nx)
{
    __m512i acc[4][4];
    #pragma GCC unroll 4
    for (int a = 0; a < 4; a++)
        #pragma GCC unroll 4
        for (int b = 0; b < 4; b++)
            acc[a][b] = _mm512_setzero_si512();
    for (int t = 0; t < d; t += 32) {
        /* a dimension's tail loads zeros past its end, which add nothing */
        __mmask32 m = d - t >= 32 ? ~(__mmask32)0 : ((__mmask32)1 << (d - t)) - 1;
        __m512i xv[4];
        #pragma GCC unroll 4
        for (int b = 0; b < nx; b++)
            xv[b] = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(m, x + (size_t)b * d + t));
        #pragma GCC unroll 4
        for (int a = 0; a < nq; a++) {
            __m512i qv = _mm512_maskz_loadu_epi16(m, q + (size_t)a * d + t);
            #pragma GCC unroll 4
            for (int b = 0; b < nx; b++)
                acc[a][b] = _mm512_dpwssd_epi32(acc[a][b], xv[b], qv);
        }
    }
    /* per query a, r[a]'s 128-bit lane L holds lane L's partial sums of rows 0..3 */
    __m512i r[4];
    #pragma GCC unroll 4
    for (int a = 0; a < 4; a++) {
        __m512i s01 = _mm512_add_epi32(_mm512_unpacklo_epi32(acc[a][0], acc[a][1]),
                                       _mm512_unpackhi_epi32(acc[a][0], acc[a][1]));
        __m512i s23 = _mm512_add_epi32(_mm512_unpacklo_epi32(acc[a][2], acc[a][3]),
                                       _mm512_unpackhi_epi32(acc[a][2], acc[a][3]));
        r[a] = _mm512_add_epi32(_mm512_unpacklo_epi64(s01, s23),
                                _mm512_unpackhi_epi64(s01, s23));
    }
    /* the four lanes of each r[a] added: lane a of sum = the dots of query a, rows 0..3 */
    __m512i u01 = _mm512_add_epi32(_mm512_shuffle_i32x4(r[0], r[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_i32x4(r[0], r[1], _MM_SHUFFLE(3, 2, 3, 2)));
    __m512i u23 = _mm512_add_epi32(_mm512_shuffle_i32x4(r[2], r[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_i32x4(r[2], r[3], _MM_SHUFFLE(3, 2, 3, 2)));
    __m512i sum = _mm512_add_epi32(_mm512_shuffle_i32x4(u01, u23, _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_i32x4(u01, u23, _MM_SHUFFLE(3, 1, 3, 1)));
    __m128 xs4 = _mm_maskz_loadu_ps((__mmask8)((1u << nx) - 1), xs);
    __m128 qs4 = _mm_maskz_loadu_ps((__mmask8)((1u << nq) - 1), qs);
    __m512 qsv = _mm512_permutexvar_ps(
        _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
        _mm512_castps128_ps512(qs4));
    __m512 scale = _mm512_mul_ps(qsv, _mm512_broadcast_f32x4(xs4));
    float res[16];
    _mm512_storeu_ps(res, _mm512_mul_ps(_mm512_cvtepi32_ps(sum), scale));
    #pragma GCC unroll 4
    for (int a = 0; a < nq; a++)
        #pragma GCC unroll 4
        for (int b = 0; b < nx; b++)
            out[(size_t)a * stride + b] = res[4 * a + b];
}

/* Queries q (nq of them) against rows [x0, x1). */
static inline __attribute__((always_inline)) void rows_q8(const int16_t *q, const float *qs,
                                                          const int8_t *x, const float *xs,
                                                          int x0, int x1, int d, float *out,
                                                          size_t stride, int nq)
{
    int j = x0;
    for (; j + 4 <= x1; j += 4)
        tile_q8(q, qs, x + (size_t)j * d, xs + j, d, out + j, stride, nq, 4);
    for (; j < x1; j++)
        tile_q8(q, qs, x + (size_t)j * d, xs + j, d, out + j, stride, nq, 1);
}

void vdist_avx512_dot_q8(const int16_t *q, const float *q_scale, int n_q, const int8_t *x,
                         const float *x_scale, int n_x, int d, float *out, size_t stride)
{
    for (int x0 = 0; x0 < n_x; x0 += VDIST_ROW_BLOCK) {
        int x1 = n_x - x0 < VDIST_ROW_BLOCK ? n_x : x0 + VDIST_ROW_BLOCK;
        int i = 0;
        for (; i + 4 <= n_q; i += 4)
            rows_q8(q + (size_t)i * d, q_scale + i, x, x_scale, x0, x1, d,
                    out + (size_t)i * stride, stride, 4);
        for (; i < n_q; i++)
            rows_q8(q + (size_t)i * d, q_scale + i, x, x_scale, x0, x1, d,
                    out + (size_t)i * stride, stride, 1);
    }
}

#endif
