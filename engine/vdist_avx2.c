/*
 * vdist_avx2.c — the AVX2/FMA inner-product kernel (see vdist_simd.h). Compiled with
 * the AVX2 flags; vdist.c calls it only after checking the CPU.
 *
 * The same tiling as vdist_avx512.c on 8 lanes; a dimension that is not a multiple of 8
 * ends with masked loads.
 *
 * The int8-row kernel widens 16 int8 of a row at a time to int16 and multiplies them with
 * the int16 query in pairs summed into int32 (vpmaddwd), exactly. A tile of 4 queries by
 * 4 rows widens each row chunk once for the four queries.
 */
#if defined(__x86_64__)

#include "engine/vdist_simd.h"

#include <immintrin.h>
#include <string.h>

#define VDIST_ROW_BLOCK 64

static inline float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __attribute__((always_inline)) void tile(const float *q, const float *x, int d,
                                                       float *out, size_t stride, int nq,
                                                       int nx)
{
    __m256 acc[4][4];
    for (int a = 0; a < nq; a++)
        for (int b = 0; b < nx; b++)
            acc[a][b] = _mm256_setzero_ps();
    int t = 0;
    for (; t + 8 <= d; t += 8) {
        __m256 xv[4];
        for (int b = 0; b < nx; b++)
            xv[b] = _mm256_loadu_ps(x + (size_t)b * d + t);
        for (int a = 0; a < nq; a++) {
            __m256 qv = _mm256_loadu_ps(q + (size_t)a * d + t);
            for (int b = 0; b < nx; b++)
                acc[a][b] = _mm256_fmadd_ps(qv, xv[b], acc[a][b]);
        }
    }
    if (t < d) {
        __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(d - t),
                                       _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        __m256 xv[4];
        for (int b = 0; b < nx; b++)
            xv[b] = _mm256_maskload_ps(x + (size_t)b * d + t, m);
        for (int a = 0; a < nq; a++) {
            __m256 qv = _mm256_maskload_ps(q + (size_t)a * d + t, m);
            for (int b = 0; b < nx; b++)
                acc[a][b] = _mm256_fmadd_ps(qv, xv[b], acc[a][b]);
        }
    }
    for (int a = 0; a < nq; a++)
        for (int b = 0; b < nx; b++)
            out[(size_t)a * stride + b] = hsum(acc[a][b]);
}

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

void vdist_avx2_dot(const float *q, int n_q, const float *x, int n_x, int d, float *out,
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


/* The 16 int8 at p widened to int16; only n (< 16: a dimension's tail) are read, the
 * rest are zeros, which add nothing to a dot product. */
static inline __m256i widen(const int8_t *p, int n)
{
    if (n >= 16)
        return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
    int8_t buf[16] = {0};
    memcpy(buf, p, (size_t)n);
    return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)buf));
}

/* The 16 int16 at p, the same way. */
static inline __m256i load16(const int16_t *p, int n)
{
    if (n >= 16)
        return _mm256_loadu_si256((const __m256i *)p);
    int16_t buf[16] = {0};
    memcpy(buf, p, sizeof *p * (size_t)n);
    return _mm256_loadu_si256((const __m256i *)buf);
}

/* nq x nx products (both at most 4, constants after inlining) of q (int16 rows d apart,
 * scales qs) and x (int8 rows d apart, scales xs) into out (rows stride apart). */
static inline __attribute__((always_inline)) void tile_q8(const int16_t *q, const float *qs,
                                                          const int8_t *x, const float *xs,
                                                          int d, float *out, size_t stride,
                                                          int nq, int nx)
{
    __m256i acc[4][4];
    #pragma GCC unroll 4
    for (int a = 0; a < 4; a++)
        #pragma GCC unroll 4
        for (int b = 0; b < 4; b++)
            acc[a][b] = _mm256_setzero_si256();
    for (int t = 0; t < d; t += 16) {
        int n = d - t;
        __m256i xv[4];
        #pragma GCC unroll 4
        for (int b = 0; b < nx; b++)
            xv[b] = widen(x + (size_t)b * d + t, n);
        #pragma GCC unroll 4
        for (int a = 0; a < nq; a++) {
            __m256i qv = load16(q + (size_t)a * d + t, n);
            #pragma GCC unroll 4
            for (int b = 0; b < nx; b++)
                acc[a][b] = _mm256_add_epi32(acc[a][b], _mm256_madd_epi16(qv, xv[b]));
        }
    }
    #pragma GCC unroll 4
    for (int a = 0; a < nq; a++) {
        /* the four rows' sums side by side: s[b] = the dot with row b */
        __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(acc[a][0], acc[a][1]),
                                      _mm256_hadd_epi32(acc[a][2], acc[a][3]));
        __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
        float *o = out + (size_t)a * stride;
        if (nx == 4) {
            __m128 sc = _mm_mul_ps(_mm_set1_ps(qs[a]), _mm_loadu_ps(xs));
            _mm_storeu_ps(o, _mm_mul_ps(_mm_cvtepi32_ps(s), sc));
        } else {
            int32_t v[4];
            _mm_storeu_si128((__m128i *)v, s);
            #pragma GCC unroll 4
            for (int b = 0; b < nx; b++)
                o[b] = (float)v[b] * (qs[a] * xs[b]);
        }
    }
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

void vdist_avx2_dot_q8(const int16_t *q, const float *q_scale, int n_q, const int8_t *x,
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
