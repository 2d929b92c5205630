/*
 * cuda_ops.h — the forward pass's kernels other than weight products: norms, RoPE, the
 * KV append, attention, SwiGLU, conversions for cuBLAS and the greedy pick. Internal to
 * engine/cuda; each launcher enqueues on a stream and returns the launch's error.
 */
#ifndef LLMS_CUDA_OPS_H
#define LLMS_CUDA_OPS_H

#include <stdbool.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {

#endif

/* Largest head_dim attention takes (a multiple of 8 up to this). */
#define CUDA_ATTN_MAX_HEAD_DIM 256

/* Where one row of a step reads and writes its sequence's KV. The cache of a sequence is
 * (n_layer, max_kv, n_head_kv, head_dim) f16 for K and the same for V; a layer's part
 * starts layer * max_kv * n_head_kv * head_dim halves in. */
typedef struct cuda_row {
    uint16_t *k;      /* the sequence's K cache (layer 0) */
    uint16_t *v;      /* its V cache */
    int32_t *pos;     /* (max_kv) the position of each of its entries */
    int32_t slot;     /* entry this row's K/V go to */
    int32_t n_kv;     /* entries attention reads: the sequence's after the step's append */
    int32_t q_pos;    /* this row's position: it sees the entries at positions <= q_pos */
    int32_t pad;
    float *recv;      /* (max_kv) attention each entry receives, added to; NULL: not wanted */
} cuda_row;

/* y (n, dim) = x / rms(x) * w, per row. */
cudaError_t cuda_rmsnorm(const float *x, const float *w, float *y, int n, int dim, float eps,
                         cudaStream_t s);

/* x (n_vec, hd): each vector RMS-normalised in place and times w (hd): qwen3's q/k norms. */
cudaError_t cuda_head_rmsnorm(float *x, const float *w, int n_vec, int hd, float eps,
                              cudaStream_t s);

/* x (n, dim) += b (dim) per row. */
cudaError_t cuda_add_bias(float *x, const float *b, int n, int dim, cudaStream_t s);

/* Rotates the first rope_dims of each head of q (n, n_head, hd) and k (n, n_head_kv, hd)
 * by cs (n, rope_dims / 2, 2) (cos, sin) pairs, in one launch; pairs (2i, 2i+1) when
 * interleaved, else (i, i + rope_dims / 2). */
cudaError_t cuda_rope(float *q, float *k, const float *cs, int n, int n_head, int n_head_kv,
                      int hd, int rope_dims, bool interleaved, cudaStream_t s);

/* Writes rows' k and v (n, kv_dim) as f16 into their slots of layer `layer`'s cache
 * (layer * max_kv * kv_dim halves in), and at layer 0 each row's position into pos[slot].
 * out, when not NULL, gets the same halves as (n, n_layer, 2, kv_dim), K before V: the
 * step's new entries in one piece for the host. */
cudaError_t cuda_kv_append(const float *k, const float *v, const cuda_row *rows, int n,
                           int kv_dim, int layer, int n_layer, int max_kv, uint16_t *out,
                           cudaStream_t s);

/* out (n, n_head, hd) = softmax(scale * q . K^T, masked by position) . V for every row and
 * head, over its sequence's cache at layer_off; grouped-query heads share K/V head
 * h / (n_head / n_head_kv). q (n, n_head, hd). hd a multiple of 8, at most
 * CUDA_ATTN_MAX_HEAD_DIM. Rows with recv add each entry's probability there (atomically:
 * the order of the additions varies). */
cudaError_t cuda_attention(const float *q, const cuda_row *rows, int n, int n_head,
                           int n_head_kv, int hd, size_t layer_off, float scale, float *out,
                           cudaStream_t s);

/* gate (n) = silu(gate) * up. */
cudaError_t cuda_swiglu(float *gate, const float *up, size_t n, cudaStream_t s);

/* dst (n) = src as f16 (bf16 when bf16) bits, round to nearest even. */
cudaError_t cuda_f32_to_half(const float *src, uint16_t *dst, size_t n, bool bf16,
                             cudaStream_t s);

/* dst (n_idx, dim) = src rows idx[i] (n_idx). */
cudaError_t cuda_gather_rows(const float *src, const int32_t *idx, int n_idx, int dim,
                             float *dst, cudaStream_t s);

/* out[r] = the index of row r's largest value (the first of equal ones), x (n, n_cols). */
cudaError_t cuda_argmax(const float *x, int n, int n_cols, int32_t *out, cudaStream_t s);

/* Reads n16 16-byte words of src and adds them into *sink (which keeps the reads from
 * being optimised away): the bandwidth probe. */
cudaError_t cuda_read_all(const void *src, size_t n16, unsigned long long *sink,
                          cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
