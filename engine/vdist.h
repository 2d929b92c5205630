/*
 * vdist.h — inner products of a block of query vectors with a block of stored vectors,
 * the kernel of vector search (storage/ivf.c) and its k-means training.
 *
 * A query block (n_q rows) is multiplied with a row block (n_x rows) of the same
 * dimension d: each row is read from memory once for every query of the block, so a
 * batch of queries that search the same vectors costs little more than one. Three
 * kernels, chosen once at run time: AVX-512 F (16 lanes), AVX2/FMA (8 lanes) and a
 * scalar reference. Every kernel computes a pair's product the same way wherever the
 * pair sits in the blocks, so a score never depends on how queries and rows were
 * grouped; between kernels results differ by f32 rounding only.
 *
 * The int8-row kernels (vdist_dot_q8) score int16 queries against int8 rows, each with a
 * float scale (storage/kb.h's format): the dot products are exact integers, so every
 * kernel gives the same bits for a pair, in any block. Their AVX-512 kernel uses VNNI.
 */
#ifndef LLMS_VDIST_H
#define LLMS_VDIST_H

#include <stddef.h>
#include <stdint.h>

enum vdist_level {
    VDIST_SCALAR,
    VDIST_AVX2,   /* AVX2 and FMA */
    VDIST_AVX512, /* AVX-512 F on top of AVX2 */
};

/* The best kernel this CPU runs; LLMS_NO_SIMD (scalar) and LLMS_NO_AVX512 (AVX2 at
 * most), set to a value other than "0", lower it. */
enum vdist_level vdist_level(void);

/* out[i * stride + j] = dot(q_i, x_j) for the rows q_i of q (n_q, d) and x_j of x
 * (n_x, d), with the best kernel. */
void vdist_dot(const float *q, int n_q, const float *x, int n_x, int d, float *out,
               size_t stride);

/* Largest dimension of the int8-row kernels. */
#define VDIST_Q8_DIM_MAX 65536

/* Quantizes a query v (d floats, d 1..VDIST_Q8_DIM_MAX) for vdist_dot_q8: q[t] =
 * v[t] / *scale rounded to nearest, *scale = max |v[t]| / m (0 for a zero vector), with m
 * = min(32767, (2^31 - 1) / (128 d)): as fine a step as int16 allows while any dot
 * product with int8 rows fits int32 (m is 32767 to 512 dimensions, 1023 at 16384). int8
 * queries would add the rows' own rounding once more: recall@10 on bench/ivf fell from
 * 0.991 to 0.987; at this step it does not move. */
void vdist_quantize_query(const float *v, int d, int16_t *q, float *scale);

/* out[i * stride + j] = (float)dot(q_i, x_j) * (q_scale[i] * x_scale[j]) for the int16
 * rows q_i of q (n_q, d; from vdist_quantize_query, or any whose sum of |q_i[t]| * 128 is
 * below 2^31) and the int8 rows x_j of x (n_x, d), with the best int8-row kernel: the
 * vectors q_i * q_scale[i] and x_j * x_scale[j] scored without a float copy, each row of
 * x read once for a tile of queries. The dot is computed exactly. */
void vdist_dot_q8(const int16_t *q, const float *q_scale, int n_q, const int8_t *x,
                  const float *x_scale, int n_x, int d, float *out, size_t stride);

/* The best int8-row kernel this CPU runs: VDIST_AVX512 also needs AVX-512 BW, VL and
 * VNNI (vpdpwssd); at most vdist_level(). */
enum vdist_level vdist_level_q8(void);

/* Scales v (d floats) to unit length; a zero vector stays zero. */
void vdist_normalize(float *v, int d);

/* The same with kernel level (at most vdist_level(); a higher one runs the best). */
void vdist_dot_at(enum vdist_level level, const float *q, int n_q, const float *x, int n_x,
                  int d, float *out, size_t stride);

/* vdist_dot_q8 with kernel level (at most vdist_level_q8(); a higher one runs the best). */
void vdist_dot_q8_at(enum vdist_level level, const int16_t *q, const float *q_scale, int n_q,
                     const int8_t *x, const float *x_scale, int n_x, int d, float *out,
                     size_t stride);

#endif
