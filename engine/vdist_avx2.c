/*
 * vdist_avx2.c — the AVX2/FMA inner-product kernel (see vdist_simd.h). Compiled with
 * the AVX2 flags; vdist.c calls it only after checking the CPU.
 *
 * The same tiling as vdist_avx512.c on 8 lanes; a dimension that is not a multiple of 8
 * ends with masked loads.
 */
#if defined(__x86_64__)

#include "engine/vdist_simd.h"

#include <immintrin.h>

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

#endif

void vdist_avx2_dot_q8(const float *q, const signed char *x, const float *scale, int n_x,
                       int d, float *out)
{
    for (int j = 0; j < n_x; j++) {
        const signed char *b = x + (size_t)j * d;
        __m256 acc = _mm256_setzero_ps();
        int t = 0;
        for (; t + 8 <= d; t += 8) {
            __m128i b8 = _mm_loadl_epi64((const __m128i *)(b + t));
            __m256 bf = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b8));
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + t), bf, acc);
        }
        float s = hsum(acc);
        for (; t < d; t++)
            s += q[t] * (float)b[t];
        out[j] = s * scale[j];
    }
}
