/*
 * quant_avx2.h — AVX2/FMA/F16C versions of the quant kernels. Internal to the quant
 * module: quant.c calls these only on x86-64 and only after it has checked that the CPU
 * has all three extensions. Arguments mean what they mean in quant.h; t is one of the
 * computable types (plus QTYPE_Q8_K for dequantization).
 */
#ifndef LLMS_QUANT_AVX2_H
#define LLMS_QUANT_AVX2_H

#include <stddef.h>
#include <stdint.h>

void quant_avx2_dot_rows(uint32_t t, const void *weights, size_t row_bytes, int64_t n_rows,
                         const void *activation, int64_t n, float *out);

/* quant_dot_rows_multi for the types that have a multi-activation kernel (Q8_0 and the
 * i-quants below 4 bits); returns 0 without writing anything for the others. */
int quant_avx2_dot_rows_multi(uint32_t t, const void *weights, size_t row_bytes,
                              int64_t n_rows, const void *act, size_t act_stride, int n_act,
                              int64_t n, float *out, size_t out_stride);

void quant_avx2_dequantize_row(uint32_t t, const void *src, float *dst, int64_t n);

/* quant_prepare_activation for Q8_0 and Q8_K (other types are left to the scalar code);
 * writes the same bytes as quant_quantize_row. */
void quant_avx2_quantize_activation(uint32_t t, const float *src, void *dst, int64_t n);

#endif
