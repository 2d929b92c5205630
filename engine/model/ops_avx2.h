/*
 * ops_avx2.h — AVX2/FMA/F16C versions of ops.c's half-float row and attention kernels. Internal to
 * ops.c, which calls them only after checking the CPU.
 */
#ifndef LLMS_OPS_AVX2_H
#define LLMS_OPS_AVX2_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* gelu's tanh approximation of one value: ops.c's scalar kernels and the AVX2 kernels'
 * tails. */
static inline float ops_gelu_tanh1(float x)
{
    const float c = 0.7978845608028654f; /* sqrt(2 / pi) */
    return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

void ops_avx2_attn_scores(const float *q, int n_q, const uint16_t *k, int n_k, int d,
                          float scale, float *scores, size_t stride);
void ops_avx2_attn_accum(float *out, int n_q, const float *p, size_t stride, const uint16_t *v,
                         int n_k, int d);
void ops_avx2_attn_scores_f32(const float *q, int n_q, const float *k, int n_k, int d,
                              float scale, float *scores, size_t stride);
void ops_avx2_attn_accum_f32(float *out, int n_q, const float *p, size_t stride, const float *v,
                             int n_k, int d);
void ops_avx2_softmax_sink(float *x, int n, float sink);
void ops_avx2_silu_mul(float *g, const float *u, int n);
void ops_avx2_gelu_tanh_mul(float *g, const float *u, int n);
void ops_avx2_gelu_tanh_bias(float *x, const float *b, int n);
void ops_avx2_softcap(float *x, int n, float cap);
void ops_avx2_add_layernorm(float *x, const float *a, const float *c, const float *w,
                            const float *b, int n, float eps);
void ops_avx2_gelu_bias(float *x, const float *b, int n);
void ops_avx2_f32_to_f16(uint16_t *dst, const float *src, int n);

#endif
