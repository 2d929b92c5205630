/*
 * vdist_simd.h — the AVX2 and AVX-512 kernels of vdist.h. Internal to the vdist module:
 * vdist.c calls each only after checking that the CPU has its extensions. Arguments
 * mean what they mean for vdist_dot and vdist_dot_q8.
 */
#ifndef LLMS_VDIST_SIMD_H
#define LLMS_VDIST_SIMD_H

#include <stddef.h>
#include <stdint.h>

void vdist_avx2_dot(const float *q, int n_q, const float *x, int n_x, int d, float *out,
                    size_t stride);
void vdist_avx512_dot(const float *q, int n_q, const float *x, int n_x, int d, float *out,
                      size_t stride);

void vdist_avx2_dot_q8(const int16_t *q, const float *q_scale, int n_q, const int8_t *x,
                       const float *x_scale, int n_x, int d, float *out, size_t stride);
void vdist_avx512_dot_q8(const int16_t *q, const float *q_scale, int n_q, const int8_t *x,
                         const float *x_scale, int n_x, int d, float *out, size_t stride);

#endif
