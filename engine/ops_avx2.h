/*
 * ops_avx2.h — AVX2/FMA/F16C versions of ops.c's half-float row kernels. Internal to
 * ops.c, which calls them only after checking the CPU.
 */
#ifndef LLMS_OPS_AVX2_H
#define LLMS_OPS_AVX2_H

#include <stdint.h>

float ops_avx2_dot_f16(const float *x, const uint16_t *h, int n);
void ops_avx2_axpy_f16(float *y, float a, const uint16_t *h, int n);
void ops_avx2_f32_to_f16(uint16_t *dst, const float *src, int n);

#endif
