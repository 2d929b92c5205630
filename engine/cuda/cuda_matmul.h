/*
 * cuda_matmul.h — products with weight matrices kept on the GPU in their GGUF types.
 *
 * A matrix is uploaded as the file stores it (n_out rows of n_in elements, each row its
 * type's blocks) and is never expanded to a float copy for decode: the matrix-vector
 * kernels read each block once and decode it in registers for every activation row of
 * the call (the quantized types as integers, against int8 activations). Prefill's wide
 * products dequantize one matrix at a time into an f16 scratch for cuBLAS
 * (cuda_dequantize_f16). Internal to engine/cuda; C linkage so that tests written in C
 * can call it.
 */
#ifndef LLMS_CUDA_MATMUL_H
#define LLMS_CUDA_MATMUL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Activation rows one cuda_matvec call takes at most. */
#define CUDA_MATVEC_MAX_COLS 8

typedef struct cuda_weight {
    uint32_t type;     /* GGUF type: F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K or Q6_K */
    int64_t n_in;      /* elements per row (ne0), a multiple of the type's block and of 8 */
    int64_t n_out;     /* rows (ne1) */
    size_t row_bytes;  /* quant_row_bytes(type, n_in) */
    const void *data;  /* device memory (16-byte aligned): (n_out, row_bytes) as stored */
} cuda_weight;

/* Whether the kernels compute weights of GGUF type t. */
bool cuda_matmul_type_supported(uint32_t type);

/*
 * y (n_cols, n_out) = x (n_cols, n_in) . W^T, or y += that when accumulate: each output
 * the dot product of a weight row with an activation row, in f32, for 1 <= n_cols <=
 * CUDA_MATVEC_MAX_COLS. x and y are device memory, rows contiguous (x's stride n_in, y's
 * n_out), and must not overlap; x 16-byte aligned (rows are read as float4).
 *
 * F32, F16 and BF16 weights multiply the f32 activations. The quantized types (Q8_0,
 * Q4_0, Q4_K, Q5_K, Q6_K) take the activations rounded to int8 in blocks of 32, each with
 * an f32 scale (amax / 127), as the CPU's quantized dot products do: a first kernel writes
 * them to scratch (device memory, 16-byte aligned, at least cuda_matvec_scratch_bytes(n_in,
 * n_cols) bytes; may be NULL for the float types), the product kernel reads them after it
 * on the same stream, so one scratch serves every call on one stream.
 *
 * Enqueued on stream; returns the launch's error (cudaSuccess, or cudaErrorInvalidValue
 * for an unsupported type or n_cols, or a matrix, pointer or scratch the comments here
 * rule out).
 */
cudaError_t cuda_matvec(const cuda_weight *w, const float *x, int n_cols, float *y,
                        bool accumulate, void *scratch, cudaStream_t stream);

/* cuda_matvec for products that share their input (q, k and v; gate and up): with
 * *x_in_scratch true, scratch already holds x's 8-bit form, left there by an earlier call
 * of this x and n_cols on this stream, and x is not quantized again; a call that leaves
 * that form in scratch sets it (start with false for each new x). */
cudaError_t cuda_matvec_shared(const cuda_weight *w, const float *x, int n_cols, float *y,
                               bool accumulate, void *scratch, bool *x_in_scratch,
                               cudaStream_t stream);

/* Bytes of scratch cuda_matvec needs for n_cols activation rows of n_in elements (0 when
 * either is not positive). */
size_t cuda_matvec_scratch_bytes(int64_t n_in, int n_cols);

/* dst (n_out, n_in) f16 (IEEE binary16 bits, device memory, 16-byte aligned): W
 * dequantized, for a GEMM. Enqueued on stream; the launch's error. */
cudaError_t cuda_dequantize_f16(const cuda_weight *w, uint16_t *dst, cudaStream_t stream);

/* Test hook: out (n) = a row of type `type` in host memory dequantized on the host by the
 * kernels' own per-block code (so the tests check its bit layouts without a GPU). False
 * for an unsupported type or an n the kernels do not take. */
bool cuda_matmul_host_check(uint32_t type, const void *row, int64_t n, float *out);

/* Test hook: *dot = a row of type `type` (host memory, n elements) times x (n), computed on
 * the host by cuda_matvec's own per-chunk code: for the quantized types x rounded to int8
 * blocks by the kernels' quantizer and the quants dotted with them as __dp4a does (emulated),
 * the scales and mins applied as on the device. False for an unsupported type or n, or when
 * out of host memory. */
bool cuda_matvec_host_check(uint32_t type, const void *row, int64_t n, const float *x,
                            float *dot);

#ifdef __cplusplus
}
#endif

#endif
