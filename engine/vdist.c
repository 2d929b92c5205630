/*
 * vdist.c — kernel choice and the scalar reference of vdist.h.
 */
#include "engine/vdist.h"

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "engine/vdist_simd.h"

static pthread_once_t level_once = PTHREAD_ONCE_INIT;
static enum vdist_level best = VDIST_SCALAR;
static enum vdist_level best_q8 = VDIST_SCALAR;

static bool env_set(const char *name)
{
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

static void level_detect(void)
{
#if defined(__x86_64__)
    if (env_set("LLMS_NO_SIMD"))
        return;
    /* __builtin_cpu_supports also checks that the OS saves the wide registers */
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
        return;
    best = VDIST_AVX2;
    best_q8 = VDIST_AVX2;
    if (__builtin_cpu_supports("avx512f") && !env_set("LLMS_NO_AVX512")) {
        best = VDIST_AVX512;
        if (__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
            __builtin_cpu_supports("avx512vnni"))
            best_q8 = VDIST_AVX512;
    }
#endif
}

enum vdist_level vdist_level(void)
{
    pthread_once(&level_once, level_detect);
    return best;
}

enum vdist_level vdist_level_q8(void)
{
    pthread_once(&level_once, level_detect);
    return best_q8;
}

static void dot_scalar(const float *q, int n_q, const float *x, int n_x, int d, float *out,
                       size_t stride)
{
    for (int i = 0; i < n_q; i++)
        for (int j = 0; j < n_x; j++) {
            const float *a = q + (size_t)i * d, *b = x + (size_t)j * d;
            float s = 0;
            for (int t = 0; t < d; t++)
                s += a[t] * b[t];
            out[(size_t)i * stride + j] = s;
        }
}

void vdist_dot_at(enum vdist_level level, const float *q, int n_q, const float *x, int n_x,
                  int d, float *out, size_t stride)
{
    if (level > vdist_level())
        level = vdist_level();
#if defined(__x86_64__)
    if (level == VDIST_AVX512) {
        vdist_avx512_dot(q, n_q, x, n_x, d, out, stride);
        return;
    }
    if (level == VDIST_AVX2) {
        vdist_avx2_dot(q, n_q, x, n_x, d, out, stride);
        return;
    }
#endif
    dot_scalar(q, n_q, x, n_x, d, out, stride);
}

/* The reference: each product's exact integer dot, then the scales, as every kernel. */
static void dot_q8_scalar(const int16_t *q, const float *q_scale, int n_q, const int8_t *x,
                          const float *x_scale, int n_x, int d, float *out, size_t stride)
{
    for (int i = 0; i < n_q; i++)
        for (int j = 0; j < n_x; j++) {
            const int16_t *a = q + (size_t)i * d;
            const int8_t *b = x + (size_t)j * d;
            int32_t s = 0;
            for (int t = 0; t < d; t++)
                s += a[t] * b[t];
            out[(size_t)i * stride + j] = (float)s * (q_scale[i] * x_scale[j]);
        }
}

void vdist_dot_q8_at(enum vdist_level level, const int16_t *q, const float *q_scale, int n_q,
                     const int8_t *x, const float *x_scale, int n_x, int d, float *out,
                     size_t stride)
{
    if (level > vdist_level_q8())
        level = vdist_level_q8();
#if defined(__x86_64__)
    if (level == VDIST_AVX512) {
        vdist_avx512_dot_q8(q, q_scale, n_q, x, x_scale, n_x, d, out, stride);
        return;
    }
    if (level == VDIST_AVX2) {
        vdist_avx2_dot_q8(q, q_scale, n_q, x, x_scale, n_x, d, out, stride);
        return;
    }
#endif
    dot_q8_scalar(q, q_scale, n_q, x, x_scale, n_x, d, out, stride);
}

void vdist_dot_q8(const int16_t *q, const float *q_scale, int n_q, const int8_t *x,
                  const float *x_scale, int n_x, int d, float *out, size_t stride)
{
    vdist_dot_q8_at(vdist_level_q8(), q, q_scale, n_q, x, x_scale, n_x, d, out, stride);
}

void vdist_quantize_query(const float *v, int d, int16_t *q, float *scale)
{
    int32_t top = INT32_MAX / (128 * d) < INT16_MAX ? INT32_MAX / (128 * d) : INT16_MAX;
    float m = 0;
    for (int t = 0; t < d; t++)
        m = fmaxf(m, fabsf(v[t]));
    float inv = m > 0 ? (float)top / m : 0;
    for (int t = 0; t < d; t++)
        q[t] = (int16_t)lrintf(v[t] * inv);
    *scale = m / (float)top;
}

void vdist_normalize(float *v, int d)
{
    double ss = 0;
    for (int i = 0; i < d; i++)
        ss += (double)v[i] * v[i];
    float inv = ss > 0 ? (float)(1.0 / sqrt(ss)) : 0.0f;
    for (int i = 0; i < d; i++)
        v[i] *= inv;
}

void vdist_dot(const float *q, int n_q, const float *x, int n_x, int d, float *out,
               size_t stride)
{
    vdist_dot_at(vdist_level(), q, n_q, x, n_x, d, out, stride);
}
