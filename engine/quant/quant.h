/*
 * quant.h — tensor element types of GGUF files: their block layouts, conversion to
 * and from f32, and the dot-product kernels the matrix products are built on.
 *
 * Type ids are the ones GGUF files store (ggml's numbering), so a tensor's type field
 * can be used directly. Quantized types pack a fixed number of elements (the block
 * size) into a fixed number of bytes; a row of n elements is n / block_size blocks.
 */
#ifndef LLMS_QUANT_H
#define LLMS_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum qtype {
    QTYPE_F32 = 0,
    QTYPE_F16 = 1,
    QTYPE_Q4_0 = 2,
    QTYPE_Q4_1 = 3,
    QTYPE_Q5_0 = 6,
    QTYPE_Q5_1 = 7,
    QTYPE_Q8_0 = 8,
    QTYPE_Q8_1 = 9,
    QTYPE_Q2_K = 10,
    QTYPE_Q3_K = 11,
    QTYPE_Q4_K = 12,
    QTYPE_Q5_K = 13,
    QTYPE_Q6_K = 14,
    QTYPE_Q8_K = 15,
    QTYPE_IQ2_XXS = 16,
    QTYPE_IQ2_XS = 17,
    QTYPE_IQ3_XXS = 18,
    QTYPE_IQ1_S = 19,
    QTYPE_IQ4_NL = 20,
    QTYPE_IQ3_S = 21,
    QTYPE_IQ2_S = 22,
    QTYPE_IQ4_XS = 23,
    QTYPE_I8 = 24,
    QTYPE_I16 = 25,
    QTYPE_I32 = 26,
    QTYPE_I64 = 27,
    QTYPE_F64 = 28,
    QTYPE_IQ1_M = 29,
    QTYPE_BF16 = 30,
    QTYPE_TQ1_0 = 34,
    QTYPE_TQ2_0 = 35,
    QTYPE_MXFP4 = 39,
    QTYPE_COUNT = 40 /* one past the largest id; not every id below it exists */
};

/* Size facts of a type. */
typedef struct quant_traits {
    const char *name;   /* "Q4_K", as llama.cpp prints it */
    int block_size;     /* elements per block (1 for plain scalar types) */
    size_t block_bytes; /* bytes per block */
    bool computable;    /* this engine can dequantize it and multiply with it */
} quant_traits;

/* Traits of type id t, or NULL when t is not a known GGUF type id. */
const quant_traits *quant_traits_of(uint32_t t);

/* Bytes taken by n elements of type t, or 0 when t is unknown or n is not a whole
 * number of blocks. */
size_t quant_row_bytes(uint32_t t, int64_t n);

/* ---- scalar conversions ---- */

float quant_f16_to_f32(uint16_t h);
uint16_t quant_f32_to_f16(float f); /* round to nearest even */
float quant_bf16_to_f32(uint16_t h);
uint16_t quant_f32_to_bf16(float f); /* round to nearest even */

/* ---- rows (n elements, a whole number of blocks; t must be computable) ---- */

/* Expands n elements of type t into f32 (also accepts QTYPE_Q8_K); uses the AVX2 kernel
 * when the CPU has it. */
void quant_dequantize_row(uint32_t t, const void *src, float *dst, int64_t n);

/* The portable scalar version of quant_dequantize_row (same results, bit for bit). */
void quant_dequantize_row_scalar(uint32_t t, const void *src, float *dst, int64_t n);

/* Packs n f32 values into type t with the exact GGUF block layout (a reference
 * quantizer: round to nearest even; Q8_0 and Q4_0 scales and MXFP4's shared exponent
 * (floor(log2(absmax)) - 2, the OCP MX rule) as llama.cpp's reference code chooses them,
 * MXFP4's elements the nearest of its values (the lower code on ties), the other types'
 * scales and mins (and IQ4's grid points) by least-squares searches of this module's
 * own, so the bytes may differ from llama.cpp's while any GGUF
 * reader decodes them alike). Also accepts QTYPE_Q8_K. Used by the model generator and
 * the tests. */
void quant_quantize_row(uint32_t t, const float *src, void *dst, int64_t n);

/* ---- dot products (the inner loop of every matrix product) ---- */

/* The activation format the dot product of weight type t consumes: Q8_0 for the types of
 * 32-element blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4), Q8_K for those of
 * 256-element super-blocks (Q2_K .. Q6_K, IQ4_XS), F32 for F32/F16/BF16. */
uint32_t quant_dot_activation_type(uint32_t t);

/* Converts an f32 activation row of n elements into act_type (quant_row_bytes(act_type, n)
 * bytes at dst); for F32 it is a copy. Quantized activations stay within [-127, 127],
 * which the SIMD kernels rely on. */
void quant_prepare_activation(uint32_t act_type, const float *src, void *dst, int64_t n);

/* Dot product of one weight row of type t with one activation row already converted
 * by quant_prepare_activation; uses the AVX2/FMA kernel when the CPU has it. */
float quant_dot(uint32_t t, const void *weights, const void *activation, int64_t n);

/* The portable scalar version of quant_dot: the reference SIMD kernels are tested against. */
float quant_dot_scalar(uint32_t t, const void *weights, const void *activation, int64_t n);

/* Computes out[r] = quant_dot(t, row r, activation) for n_rows rows that are
 * row_bytes apart: the form matrix-vector products use, so kernels can work on
 * several rows per pass over the activation. Each out[r] is bit-identical to
 * quant_dot of that row, so splitting rows among threads does not change results. */
void quant_dot_rows(uint32_t t, const void *weights, size_t row_bytes, int64_t n_rows,
                    const void *activation, int64_t n, float *out);

/* Computes out[a * out_stride + r] = row r . activation a for n_rows weight rows
 * row_bytes apart and n_act activation rows act_stride bytes apart (each prepared by
 * quant_prepare_activation): the form batched decode uses, one activation row per
 * stream. Kernels load and unpack each weight block once for several activations.
 * Each result is bit-identical to quant_dot, except with n_act > 1 on the quantized
 * types when the CPU has AVX-512 (F/BW/DQ/VL/VNNI): there the per-block integer sums are
 * the same but the f32 additions may be ordered differently, and each result still does
 * not depend on n_rows, n_act or the positions of its row and activation in them. */
void quant_dot_rows_multi(uint32_t t, const void *weights, size_t row_bytes, int64_t n_rows,
                          const void *act, size_t act_stride, int n_act, int64_t n,
                          float *out, size_t out_stride);

/*
 * Many activations at once (batched decode of several streams, short prompts): where the
 * CPU has a kernel that keeps activations in the lanes of its registers (AVX-512 VNNI,
 * Q8_0 weights), the activations are packed for it once per matrix product and every
 * row block then reads them from there.
 * quant_packed_bytes: the bytes n_act activations of n elements (each prepared as
 * act_type) take packed, or 0 when there is no such kernel for them on this CPU (or for
 * fewer than QUANT_PACKED_MIN_ACT activations, where quant_dot_rows_multi is faster).
 * quant_pack_activations: packs them (n_act rows act_stride bytes apart) into packed.
 * quant_dot_rows_packed: out[a * out_stride + r] = row r . activation a, as
 * quant_dot_rows_multi computes it; returns false, writing nothing, when weight type t
 * has no packed kernel. Activations go in groups of 16, and a last group of at most 8
 * (all of them when n_act <= 8) gives each activation several lanes: in a group of 16
 * each result equals quant_dot_scalar's bit for bit; in a last group of at most 8 its
 * per-block integer sums are the scalar kernel's and only the order of the f32 additions
 * differs, so a result may depend on n_act (whether its activation is in such a group)
 * but not on n_rows or the position of its row.
 */
#define QUANT_PACKED_MIN_ACT 3
bool quant_packed_kernel(uint32_t t); /* weight type t has a packed kernel on this CPU */
size_t quant_packed_bytes(uint32_t act_type, int n_act, int64_t n);
void quant_pack_activations(uint32_t act_type, const void *act, size_t act_stride, int n_act,
                            int64_t n, void *packed);
bool quant_dot_rows_packed(uint32_t t, const void *weights, size_t row_bytes, int64_t n_rows,
                           const void *packed, int n_act, int64_t n, float *out,
                           size_t out_stride);

/*
 * Q8_0 weights repacked (where the CPU has AVX-512 VNNI): a matrix's rows in groups of
 * QUANT_REPACK_ROWS, each group's blocks interleaved so that one instruction multiplies
 * four bytes of one activation with four bytes of each of the group's rows, every
 * register lane a whole (row, activation) sum: the weights are loaded once per block for
 * all activations, and one activation (decode) costs no more than on rows as stored.
 * A group takes exactly the bytes of its rows, so group g sits where row
 * QUANT_REPACK_ROWS * g did. Each result equals quant_dot_scalar's on the rows as stored
 * bit for bit, whatever n_act.
 * quant_repack_kernel: weight type t has repacked kernels on this CPU (Q8_0 where the
 * AVX-512 kernels are chosen, see quant_simd_name; never with LLMS_NO_SIMD or
 * LLMS_NO_AVX512), so only then may a matrix be repacked.
 * quant_repack_rows: repacks QUANT_REPACK_ROWS rows of n elements, row_bytes apart, at
 * src into dst (QUANT_REPACK_ROWS * row_bytes bytes, not overlapping src).
 * quant_repacked_act_bytes / quant_repack_activations: of n_act activations (act_stride
 * bytes apart from act, each prepared by quant_prepare_activation as Q8_0), those in
 * [a0, a1) into their places in the form the kernel reads (threads may each convert the
 * activations they prepared).
 * quant_dot_rows_repacked: out[a * out_stride + r] = row r . activation a for n_rows (a
 * multiple of QUANT_REPACK_ROWS) repacked rows starting at a group.
 */
#define QUANT_REPACK_ROWS 16
bool quant_repack_kernel(uint32_t t);
void quant_repack_rows(uint32_t t, const void *src, size_t row_bytes, int64_t n, void *dst);
size_t quant_repacked_act_bytes(int n_act, int64_t n);
void quant_repack_activations(const void *act, size_t act_stride, int a0, int a1, int n_act,
                              int64_t n, void *packed);
void quant_dot_rows_repacked(uint32_t t, const void *weights, size_t row_bytes, int64_t n_rows,
                             const void *packed, int n_act, int64_t n, float *out,
                             size_t out_stride);

/* True when BF16 dot products round the f32 activation to bf16 before multiplying (the
 * AVX-512 BF16 kernel, taken where the CPU has AVX-512 F/BW/DQ/VL/VNNI and BF16 unless
 * LLMS_NO_AVX512 or LLMS_NO_AVX512_BF16 is set to a value other than "0", for rows of at
 * most 16384 elements), as llama.cpp does; quant_dot_scalar keeps the f32 activation, so
 * a result may then differ from it by 2^-8 of the sum of |products| (bf16 keeps 8
 * significant bits, so rounding moves each activation by at most 2^-8 of itself) plus
 * f32 rounding. */
bool quant_bf16_rounds_activation(void);

/* Row lengths in (QUANT_F16_ROUND_MIN_N, QUANT_F16_ROUND_MAX_N]: see
 * quant_f16_rounds_activation. */
#define QUANT_F16_ROUND_MIN_N 4096
#define QUANT_F16_ROUND_MAX_N 16384

/* True when F16 dot products of rows of n elements round the f32 activation to f16
 * before multiplying: where the AVX-512 kernels are in use (quant_avx512_enabled) and
 * QUANT_F16_ROUND_MIN_N < n <= QUANT_F16_ROUND_MAX_N, as llama.cpp does for every F16
 * row. Decode reads each row once from DRAM, and beside a longer row's stream its f32
 * activation (over 16 KiB) keeps being evicted from L1: rows of 5632 read at 17.8 GB/s
 * with it and at 30.6 GB/s with the f16 one (11 KiB; one thread, this AMD EPYC).
 * quant_dot_scalar keeps the f32 activation, so a result may then differ from it by
 * 2^-11 of the sum of |products| (f16 keeps 11 significant bits) plus f32 rounding. */
bool quant_f16_rounds_activation(int64_t n);

/* True when the AVX-512 kernels are in use: the CPU has AVX-512 F/BW/DQ/VL/VNNI (and
 * AVX2/FMA/F16C) and neither LLMS_NO_SIMD nor LLMS_NO_AVX512 is set to a value other
 * than "0". */
bool quant_avx512_enabled(void);

/* True when prefill multiplies F16 weights as BF16 ones (ops.h), rounded to bf16 with
 * the activations: about 1.6x the speed of the exact F32 FMA product, at a relative rms
 * error of ~2e-3 in its results where the exact one has ~1e-6. Opt-in: the environment
 * variable LLMS_F16_AS_BF16 set to a value other than "0", where
 * quant_bf16_rounds_activation is true. */
bool quant_f16_prefill_as_bf16(void);

/* Which kernels quant_dot, quant_dot_rows, quant_dequantize_row and
 * quant_prepare_activation use: "avx2" when the CPU has AVX2, FMA and F16C (decided once
 * per process; Q8_0 and K-quant dot products then take AVX-512 kernels where the CPU
 * has those too, unless the environment variable LLMS_NO_AVX512 is set to a value other
 * than "0"), "scalar" otherwise or when LLMS_NO_SIMD is set to a value other than "0". */
const char *quant_simd_name(void);

#endif
