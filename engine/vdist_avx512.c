/*
 * vdist_avx512.c — the AVX-512 inner-product kernel (see vdist_simd.h). Compiled with
 * the AVX-512 flags; vdist.c calls it only after checking the CPU.
 *
 * A tile of up to 4 queries by 4 rows keeps 16 accumulators in registers, so each load
 * feeds four multiply-adds; a dimension that is not a multiple of 16 ends with masked
 * loads. Rows are taken in blocks that stay in the L2 cache while every query of the
 * batch passes over them.
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

#endif
