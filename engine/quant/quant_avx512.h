/*
 * quant_avx512.h — AVX-512 VNNI kernels of the quant module. Internal: quant.c calls
 * these only on x86-64 and only after it has checked that the CPU has AVX-512 F, BW, DQ,
 * VL and VNNI (and AVX2/FMA/F16C). Arguments mean what they mean in quant.h.
 */
#ifndef LLMS_QUANT_AVX512_H
#define LLMS_QUANT_AVX512_H

#include <stddef.h>
#include <stdint.h>

/* quant_dot_rows_multi for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4, IQ4_XS and the
 * K-quants' weights (and F32/F16/BF16 with one activation); returns 0 without writing anything for
 * the others. Each (row, activation) result is the same whatever n_rows, n_act (1
 * included) and the position of the row or activation in them. */
int quant_avx512_dot_rows_multi(uint32_t t, const void *weights, size_t row_bytes,
                                int64_t n_rows, const void *act, size_t act_stride, int n_act,
                                int64_t n, float *out, size_t out_stride);

/* quant_dot_rows for BF16 weights with vdpbf16ps, the f32 activation a rounded to bf16
 * (to nearest even) first; returns 0 without writing anything when n is over the 16384
 * elements its stack buffer holds. Callable only where the CPU has AVX-512 BF16 too. */
int quant_avx512_bf16_dot_rows(const void *weights, size_t row_bytes, int64_t n_rows,
                               const float *a, int64_t n, float *out);

/* quant_dot_rows_multi for F16 rows longer than QUANT_F16_ROUND_MIN_N elements (and at
 * most QUANT_F16_ROUND_MAX_N), each f32 activation rounded to f16 (to nearest even)
 * first (see quant_f16_rounds_activation); returns 0 without writing anything for other
 * lengths.
 * Each (row, activation) result is the same whatever n_rows, n_act and positions. */
int quant_avx512_f16_dot_rows_rounded(const void *weights, size_t row_bytes, int64_t n_rows,
                                      const void *act, size_t act_stride, int n_act, int64_t n,
                                      float *out, size_t out_stride);

/* Packed activations for quant_avx512_dot_rows_packed (Q8_0 activations, groups of 16
 * and a last one of 4 or 8): the bytes n_act activations of n elements take, and packing
 * them. */
size_t quant_avx512_packed_bytes(int n_act, int64_t n);
void quant_avx512_pack_q8_0(const void *act, size_t act_stride, int n_act, int64_t n,
                            void *packed);

/* quant_dot_rows_packed for Q8_0 weights (returns 0 for other types), with its numerics
 * (quant.h). */
int quant_avx512_dot_rows_packed(uint32_t t, const void *weights, size_t row_bytes,
                                 int64_t n_rows, const void *packed, int n_act, int64_t n,
                                 float *out, size_t out_stride);

#endif
