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
 */
#ifndef LLMS_VDIST_H
#define LLMS_VDIST_H

#include <stddef.h>

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

/* out[j] = scale[j] * dot(q, x_j) for one query q (d floats) and the n_x rows x_j of x
 * (n_x, d) int8 (vectors stored as int8 with a scale each, storage/kb.h), with the best
 * kernel: no float copy of the rows is made. */
void vdist_dot_q8(const float *q, const signed char *x, const float *scale, int n_x, int d,
                  float *out);

/* Scales v (d floats) to unit length; a zero vector stays zero. */
void vdist_normalize(float *v, int d);

/* The same with kernel level (at most vdist_level(); a higher one runs the best). */
void vdist_dot_at(enum vdist_level level, const float *q, int n_q, const float *x, int n_x,
                  int d, float *out, size_t stride);

#endif
