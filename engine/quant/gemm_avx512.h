/*
 * gemm_avx512.h — the matrix product of many activation rows (prefill) with BF16 or F16
 * weights on AVX-512. Internal to ops.c, which calls in only on x86-64 and only where
 * the CPU has AVX-512 F/BW/DQ/VL/VNNI and no environment switch turned them off
 * (quant_avx512_enabled), for BF16 also AVX-512 BF16 (quant_bf16_rounds_activation).
 *
 * BF16 has the numerics of the BF16 dot kernel of decode (quant.h): activations rounded
 * to bf16 (to nearest even), products exact, sums in f32 (vdpbf16ps). Quantized weights
 * take the same kernel, dequantized and rounded to bf16 once per panel. F16 multiplies
 * the weights, widened to f32, with the f32 activations by FMA, as sgemm on dequantized
 * weights does. Each lane of a register sums one (activation, row) pair over k in order,
 * so a result does not depend on how many activations or rows are computed with it, nor
 * on their positions.
 */
#ifndef LLMS_GEMM_AVX512_H
#define LLMS_GEMM_AVX512_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Weight rows one gemm_avx512_*_rows call takes at most: the width of its panel. */
#define GEMM_AVX512_UNIT_ROWS 48

/* Bytes of scratch gemm_avx512_*_rows needs (64-byte aligned, one per thread): the
 * panel of repacked weights and 16 dequantized rows. */
#define GEMM_AVX512_SCRATCH_BYTES ((size_t)GEMM_AVX512_UNIT_ROWS * 128 * 4 + 16 * 256 * 4)

/* Rounds n_tok rows of cols f32 values (x_stride floats apart) to bf16 into xb
 * (xb_stride elements apart), to nearest even as quant_f32_to_bf16. */
void gemm_avx512_bf16_convert(const float *x, size_t x_stride, int n_tok, int cols,
                              uint16_t *xb, size_t xb_stride);

/* Whether gemm_avx512_bf16_rows takes weights of type t in rows of cols elements: BF16
 * or F16 (rounded to bf16 like a quantized type) with cols even, or a computable
 * quantized type whose blocks tile 256 columns (blocks of 32 or 256 elements). */
bool gemm_avx512_bf16_takes(uint32_t t, int cols);

/* y[t * ldy + r] = sum over k of xb[t * xb_stride + k] * w_r[k] for the n_rows
 * (<= GEMM_AVX512_UNIT_ROWS) weight rows w_r of type t, row_bytes apart from w, and the
 * n_tok bf16 activation rows of xb (4-byte aligned; xb_stride even). Weights of a
 * quantized type are dequantized (quant_dequantize_row) and rounded to bf16 (to nearest
 * even) first, a relative change of at most 2^-9 each. scratch:
 * GEMM_AVX512_SCRATCH_BYTES, 64-byte aligned. */
void gemm_avx512_bf16_rows(uint32_t t, const void *w, size_t row_bytes, int n_rows,
                           const uint16_t *xb, size_t xb_stride, int n_tok, int cols, float *y,
                           size_t ldy, void *scratch);

/* The same for F16 weight rows and f32 activation rows (x_stride floats apart); any cols. */
void gemm_avx512_f16_rows(const void *w, size_t row_bytes, int n_rows, const float *x,
                          size_t x_stride, int n_tok, int cols, float *y, size_t ldy,
                          void *scratch);

#endif
