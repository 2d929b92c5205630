/*
 * ops_avx2.c — half-float row kernels with F16C conversion and FMA.
 */
#include "engine/ops_avx2.h"

#include <immintrin.h>
#include <math.h>

#include "engine/quant.h"

/* Converts an f16 row to f32; d is a multiple of 8 here. */
static void ops_avx2_row_f32(float *dst, const uint16_t *h, int d)
{
    for (int i = 0; i < d; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
}

static float ops_avx2_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* scores[g * stride] = scale * dot(q_g, k) for one f32 K row. */
static void ops_avx2_scores_row(const float *q, int n_q, const float *k, int d, float scale,
                                float *scores, size_t stride)
{
    for (int g = 0; g < n_q; g++) {
        const float *qg = q + (size_t)g * d;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        int j = 0;
        for (; j + 16 <= d; j += 16) {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qg + j), _mm256_loadu_ps(k + j), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(qg + j + 8), _mm256_loadu_ps(k + j + 8), a1);
        }
        if (j < d)
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qg + j), _mm256_loadu_ps(k + j), a0);
        scores[(size_t)g * stride] = scale * ops_avx2_hsum(_mm256_add_ps(a0, a1));
    }
}

/* out_g += p[g * stride] * v for one f32 V row. */
static void ops_avx2_accum_row(float *out, int n_q, const float *p, size_t stride,
                               const float *v, int d)
{
    for (int g = 0; g < n_q; g++) {
        float w = p[(size_t)g * stride];
        if (w == 0.0f)
            continue;
        __m256 vw = _mm256_set1_ps(w);
        float *o = out + (size_t)g * d;
        for (int j = 0; j < d; j += 8)
            _mm256_storeu_ps(o + j, _mm256_fmadd_ps(vw, _mm256_loadu_ps(v + j), _mm256_loadu_ps(o + j)));
    }
}

void ops_avx2_attn_scores(const float *q, int n_q, const uint16_t *k, int n_k, int d,
                          float scale, float *scores, size_t stride)
{
    float kf[512] __attribute__((aligned(32)));
    for (int i = 0; i < n_k; i++) {
        ops_avx2_row_f32(kf, k + (size_t)i * d, d);
        ops_avx2_scores_row(q, n_q, kf, d, scale, scores + i, stride);
    }
}

void ops_avx2_attn_accum(float *out, int n_q, const float *p, size_t stride, const uint16_t *v,
                         int n_k, int d)
{
    float vf[512] __attribute__((aligned(32)));
    for (int i = 0; i < n_k; i++) {
        ops_avx2_row_f32(vf, v + (size_t)i * d, d);
        ops_avx2_accum_row(out, n_q, p + i, stride, vf, d);
    }
}

void ops_avx2_attn_scores_f32(const float *q, int n_q, const float *k, int n_k, int d,
                              float scale, float *scores, size_t stride)
{
    for (int i = 0; i < n_k; i++)
        ops_avx2_scores_row(q, n_q, k + (size_t)i * d, d, scale, scores + i, stride);
}

void ops_avx2_attn_accum_f32(float *out, int n_q, const float *p, size_t stride, const float *v,
                             int n_k, int d)
{
    for (int i = 0; i < n_k; i++)
        ops_avx2_accum_row(out, n_q, p + i, stride, v + (size_t)i * d, d);
}

/* e^x for x <= 0 (softmax arguments after subtracting the max): x = k ln2 + r with
 * |r| <= ln2 / 2, e^r by its degree-6 Taylor polynomial (relative error < 2e-7), 2^k
 * through the exponent bits. Arguments below -87 (and -inf) give 0. */
static __m256 ops_avx2_exp_neg(__m256 x)
{
    const __m256 lo = _mm256_set1_ps(-87.0f);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(x, lo);
    __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    /* r = x - k ln2, with ln2 split in two for precision */
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

void ops_avx2_softmax(float *x, int n)
{
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(x + i));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    float max = _mm_cvtss_f32(m4);
    for (; i < n; i++)
        max = x[i] > max ? x[i] : max;

    __m256 vm = _mm256_set1_ps(max), vsum = _mm256_setzero_ps();
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 e = ops_avx2_exp_neg(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
        _mm256_storeu_ps(x + i, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    float sum = ops_avx2_hsum(vsum);
    for (; i < n; i++) {
        x[i] = x[i] == -INFINITY ? 0.0f : expf(x[i] - max);
        sum += x[i];
    }
    __m256 inv = _mm256_set1_ps(1.0f / sum);
    for (i = 0; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
    for (; i < n; i++)
        x[i] *= 1.0f / sum;
}

/* silu(x) = x / (1 + e^-x), evaluated with t = e^-|x| <= 1 so the exp never
 * overflows: x / (1 + t) for x >= 0, x t / (1 + t) for x < 0. */
void ops_avx2_silu_mul(float *g, const float *u, int n)
{
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i);
        __m256 t = ops_avx2_exp_neg(_mm256_or_ps(x, sign));
        __m256 num = _mm256_blendv_ps(x, _mm256_mul_ps(x, t), x); /* sign bit picks x t */
        __m256 s = _mm256_div_ps(num, _mm256_add_ps(one, t));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++)
        g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

void ops_avx2_add_layernorm(float *x, const float *a, const float *c, const float *w,
                            const float *b, int n, float eps)
{
    /* Two passes (mean, then squares of x - mean) keep f32 lanes accurate however large
     * the residual stream grows: each lane sums n/8 terms, and the lanes meet in double. */
    __m256 vs = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_add_ps(_mm256_loadu_ps(x + i),
                                 _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(c + i)));
        _mm256_storeu_ps(x + i, v);
        vs = _mm256_add_ps(vs, v);
    }
    double sum = ops_avx2_hsum(vs);
    for (; i < n; i++) {
        x[i] += a[i] + c[i];
        sum += x[i];
    }
    float mu = (float)(sum / n);
    __m256 vmu = _mm256_set1_ps(mu), vq = _mm256_setzero_ps();
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + i), vmu);
        vq = _mm256_fmadd_ps(d, d, vq);
    }
    double sq = ops_avx2_hsum(vq);
    for (; i < n; i++)
        sq += (double)(x[i] - mu) * (x[i] - mu);
    float s = (float)(1.0 / sqrt(sq / n + eps));
    __m256 vsc = _mm256_set1_ps(s);
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 d = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmu), vsc);
        _mm256_storeu_ps(x + i, _mm256_fmadd_ps(d, _mm256_loadu_ps(w + i), _mm256_loadu_ps(b + i)));
    }
    for (; i < n; i++)
        x[i] = (x[i] - mu) * s * w[i] + b[i];
}

/* gelu(u) = u/2 (1 + erf(u/sqrt2)) through erfc(z), z = |u|/sqrt2, so the negative side,
 * u/2 erfc(z), keeps its relative precision instead of cancelling in 1 + erf:
 * erfc(z) = t exp(-z^2 + P(t)), t = 1/(1 + z/2), the Chebyshev fit of Numerical Recipes
 * (erfcc, fractional error below 1.2e-7 for every z >= 0). exp of an argument below -87
 * flushes to 0, where gelu(u) < 1e-37 anyway. */
void ops_avx2_gelu_bias(float *x, const float *b, int n)
{
    static const float P[10] = {0.17087277f,  -0.82215223f, 1.48851587f, -1.13520398f,
                                0.27886807f,  -0.18628806f, 0.09678418f, 0.37409196f,
                                1.00002368f,  -1.26551223f};
    const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f),
                 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 u = _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(b + i));
        __m256 z = _mm256_mul_ps(_mm256_and_ps(u, abs_mask), _mm256_set1_ps(0.70710678f));
        __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(z, half, one));
        __m256 p = _mm256_set1_ps(P[0]);
        for (int k = 1; k < 10; k++)
            p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(P[k]));
        __m256 e = _mm256_mul_ps(t, ops_avx2_exp_neg(_mm256_fnmadd_ps(z, z, p)));
        __m256 h = _mm256_mul_ps(_mm256_mul_ps(half, u), e);
        /* u >= 0: u - u/2 erfc(z); u < 0: u/2 erfc(z) (the sign bit of u picks) */
        _mm256_storeu_ps(x + i, _mm256_blendv_ps(_mm256_sub_ps(u, h), h, u));
    }
    for (; i < n; i++) {
        float u = x[i] + b[i];
        x[i] = 0.5f * u * (1.0f + erff(u * 0.70710678f));
    }
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
