/*
 * ops_avx2.c — half-float row kernels with F16C conversion and FMA.
 */
#include "engine/model/ops_avx2.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "engine/model/ops.h"
#include "engine/quant/quant.h"

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

/* Lane r of the result is the sum of a[r]'s lanes, added in the same order for every r
 * ((0+1 + 2+3) + (4+5 + 6+7)): a K row's score does not depend on where in its block of
 * 8 it was computed, so it is the same whatever the number of rows around it. */
static __m256 ops_avx2_hsum8(const __m256 a[8])
{
    __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20),
                         _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* scores[g * stride + r] = scale * dot(q_g, k_r) for the first n_valid of 8 f32 K rows
 * (k: 8 rows, d apart). Each q vector is loaded once for the 8 rows, and their 8 sums are
 * reduced together (one horizontal sum per row cost as much as its products). */
static void ops_avx2_scores8(const float *q, int n_q, const float *k, int d, float scale,
                             float *scores, size_t stride, int n_valid)
{
    __m256 vscale = _mm256_set1_ps(scale);
    for (int g = 0; g < n_q; g++) {
        const float *qg = q + (size_t)g * d;
        __m256 a[8];
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++)
            a[r] = _mm256_setzero_ps();
        for (int j = 0; j < d; j += 8) {
            __m256 qv = _mm256_loadu_ps(qg + j);
#pragma GCC unroll 8
            for (int r = 0; r < 8; r++)
                a[r] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + (size_t)r * d + j), a[r]);
        }
        __m256 s = _mm256_mul_ps(ops_avx2_hsum8(a), vscale);
        float *dst = scores + (size_t)g * stride;
        if (n_valid == 8) {
            _mm256_storeu_ps(dst, s);
        } else {
            float all[8];
            _mm256_storeu_ps(all, s);
            memcpy(dst, all, (size_t)n_valid * sizeof(float));
        }
    }
}

/* o[0 .. 8 nv) += sum_i p[i] v_i[0 .. 8 nv) over n f32 V rows d apart: the accumulators
 * stay in registers across the rows, and every element gets its products in row order. */
static inline __attribute__((always_inline)) void
ops_avx2_accum_slab(float *o, const float *p, const float *v, int n, int d, const int nv)
{
    __m256 a[8];
#pragma GCC unroll 8
    for (int r = 0; r < nv; r++)
        a[r] = _mm256_loadu_ps(o + 8 * r);
    for (int i = 0; i < n; i++) {
        __m256 w = _mm256_set1_ps(p[i]);
#pragma GCC unroll 8
        for (int r = 0; r < nv; r++)
            a[r] = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + (size_t)i * d + 8 * r), a[r]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < nv; r++)
        _mm256_storeu_ps(o + 8 * r, a[r]);
}

/* out_g += sum_i p[g * stride + i] v_i over n f32 V rows (v: n rows, d apart). */
static void ops_avx2_accum_rows(float *out, int n_q, const float *p, size_t stride,
                                const float *v, int n, int d)
{
    for (int g = 0; g < n_q; g++) {
        float *o = out + (size_t)g * d;
        const float *pg = p + (size_t)g * stride;
        int j = 0;
        for (; j + 64 <= d; j += 64)
            ops_avx2_accum_slab(o + j, pg, v + j, n, d, 8);
        for (; j + 32 <= d; j += 32)
            ops_avx2_accum_slab(o + j, pg, v + j, n, d, 4);
        for (; j < d; j += 8)
            ops_avx2_accum_slab(o + j, pg, v + j, n, d, 1);
    }
}

/* Up to 8 f16 rows (d apart) as f32 rows into dst (8, d); rows past n are zero. */
static void ops_avx2_rows8_f32(float *dst, const uint16_t *h, int n, int d)
{
    for (int r = 0; r < n; r++)
        ops_avx2_row_f32(dst + (size_t)r * d, h + (size_t)r * d, d);
    memset(dst + (size_t)n * d, 0, (size_t)(8 - n) * d * sizeof(float));
}

void ops_avx2_attn_scores(const float *q, int n_q, const uint16_t *k, int n_k, int d,
                          float scale, float *scores, size_t stride)
{
    float kf[8 * OPS_MAX_HEAD_DIM] __attribute__((aligned(32)));
    for (int i = 0; i < n_k; i += 8) {
        int n = n_k - i < 8 ? n_k - i : 8;
        ops_avx2_rows8_f32(kf, k + (size_t)i * d, n, d);
        ops_avx2_scores8(q, n_q, kf, d, scale, scores + i, stride, n);
    }
}

void ops_avx2_attn_accum(float *out, int n_q, const float *p, size_t stride, const uint16_t *v,
                         int n_k, int d)
{
    float vf[8 * OPS_MAX_HEAD_DIM] __attribute__((aligned(32)));
    for (int i = 0; i < n_k; i += 8) {
        int n = n_k - i < 8 ? n_k - i : 8;
        ops_avx2_rows8_f32(vf, v + (size_t)i * d, n, d);
        ops_avx2_accum_rows(out, n_q, p + i, stride, vf, n, d);
    }
}

void ops_avx2_attn_scores_f32(const float *q, int n_q, const float *k, int n_k, int d,
                              float scale, float *scores, size_t stride)
{
    int whole = n_k / 8 * 8;
    for (int i = 0; i < whole; i += 8)
        ops_avx2_scores8(q, n_q, k + (size_t)i * d, d, scale, scores + i, stride, 8);
    if (whole < n_k) {
        float kf[8 * OPS_MAX_HEAD_DIM] __attribute__((aligned(32)));
        int n = n_k - whole;
        memcpy(kf, k + (size_t)whole * d, (size_t)n * d * sizeof(float));
        memset(kf + (size_t)n * d, 0, (size_t)(8 - n) * d * sizeof(float));
        ops_avx2_scores8(q, n_q, kf, d, scale, scores + whole, stride, n);
    }
}

void ops_avx2_attn_accum_f32(float *out, int n_q, const float *p, size_t stride, const float *v,
                             int n_k, int d)
{
    ops_avx2_accum_rows(out, n_q, p, stride, v, n_k, d);
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

void ops_avx2_softmax_sink(float *x, int n, float sink)
{
    __m256 vmax = _mm256_set1_ps(sink);
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
    if (sink != -INFINITY)
        sum += expf(sink - max);
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

/* gelu(x) = 0.5 x (1 + tanh(z / 2)) = x sigmoid(z), z = 2 sqrt(2/pi) (x + 0.044715 x^3),
 * the sigmoid taken as silu's is (t = e^-|z| <= 1): 1 / (1 + t) for z >= 0, t / (1 + t)
 * below. */
static inline __m256 ops_avx2_gelu_tanh(__m256 x)
{
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    const __m256 c2 = _mm256_set1_ps(2.0f * 0.7978845608028654f), k = _mm256_set1_ps(0.044715f);
    __m256 z = _mm256_mul_ps(c2, _mm256_fmadd_ps(_mm256_mul_ps(k, x), _mm256_mul_ps(x, x), x));
    __m256 t = ops_avx2_exp_neg(_mm256_or_ps(z, sign));
    __m256 num = _mm256_blendv_ps(one, t, z); /* z's sign bit picks t */
    return _mm256_div_ps(_mm256_mul_ps(x, num), _mm256_add_ps(one, t));
}

void ops_avx2_gelu_tanh_mul(float *g, const float *u, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 s = ops_avx2_gelu_tanh(_mm256_loadu_ps(g + i));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++)
        g[i] = ops_gelu_tanh1(g[i]) * u[i];
}

void ops_avx2_gelu_tanh_bias(float *x, const float *b, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(b + i));
        _mm256_storeu_ps(x + i, ops_avx2_gelu_tanh(v));
    }
    for (; i < n; i++)
        x[i] = ops_gelu_tanh1(x[i] + b[i]);
}

/* cap tanh(x / cap) with tanh(y) = sign(y) (1 - t) / (1 + t), t = e^(-2|y|) <= 1. -inf
 * (a masked score) gives -cap, as tanhf does. */
void ops_avx2_softcap(float *x, int n, float cap)
{
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    const __m256 vcap = _mm256_set1_ps(cap), m2 = _mm256_set1_ps(-2.0f / cap);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256 s = _mm256_and_ps(v, sign);
        __m256 t = ops_avx2_exp_neg(_mm256_mul_ps(m2, _mm256_andnot_ps(sign, v)));
        __m256 th = _mm256_div_ps(_mm256_sub_ps(one, t), _mm256_add_ps(one, t));
        _mm256_storeu_ps(x + i, _mm256_mul_ps(vcap, _mm256_or_ps(th, s)));
    }
    float inv = 1.0f / cap;
    for (; i < n; i++)
        x[i] = cap * tanhf(x[i] * inv);
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
