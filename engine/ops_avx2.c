/*
 * ops_avx2.c — half-float row kernels with F16C conversion and FMA.
 */
#include "engine/ops_avx2.h"

#include <immintrin.h>

#include "engine/quant.h"

float ops_avx2_dot_f16(const float *x, const uint16_t *h, int n)
{
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 h0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i)));
        __m256 h1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i + 8)));
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), h0, acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), h1, acc1);
    }
    for (; i + 8 <= n; i += 8) {
        __m256 h0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i)));
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), h0, acc0);
    }
    acc0 = _mm256_add_ps(acc0, acc1);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc0), _mm256_extractf128_ps(acc0, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    float sum = _mm_cvtss_f32(s);
    for (; i < n; i++)
        sum += x[i] * quant_f16_to_f32(h[i]);
    return sum;
}

void ops_avx2_axpy_f16(float *y, float a, const uint16_t *h, int n)
{
    __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 hv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i)));
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, hv, _mm256_loadu_ps(y + i)));
    }
    for (; i < n; i++)
        y[i] += a * quant_f16_to_f32(h[i]);
}

void ops_avx2_f32_to_f16(uint16_t *dst, const float *src, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i hv = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128((__m128i *)(dst + i), hv);
    }
    for (; i < n; i++)
        dst[i] = quant_f32_to_f16(src[i]);
}
