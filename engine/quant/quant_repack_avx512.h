/*
 * quant_repack_avx512.h — the kernels of Q8_0 weights repacked for AVX-512 VNNI. Internal:
 * quant.c calls these only on x86-64 and only after it has checked that the CPU has
 * AVX-512 F, BW, DQ, VL and VNNI. Arguments mean what they mean in quant.h.
 */
#ifndef LLMS_QUANT_REPACK_AVX512_H
#define LLMS_QUANT_REPACK_AVX512_H

#include <stddef.h>
#include <stdint.h>

/* Repacks QUANT_REPACK_ROWS Q8_0 rows of n elements, row_bytes apart, into dst. */
void quant_avx512_repack_q8_0(const void *src, size_t row_bytes, int64_t n, void *dst);

size_t quant_avx512_repacked_act_bytes(int n_act, int64_t n);
void quant_avx512_repack_activations(const void *act, size_t act_stride, int a0, int a1,
                                     int n_act, int64_t n, void *packed);

/* quant_dot_rows_repacked for n_rows a multiple of QUANT_REPACK_ROWS. */
void quant_avx512_dot_rows_repacked(const void *weights, size_t row_bytes, int64_t n_rows,
                                    const void *packed, int n_act, int64_t n, float *out,
                                    size_t out_stride);

#endif
