/*
 * cuda.h — the CUDA backend: a decoder's forward pass on an NVIDIA GPU.
 *
 * A cuda_model holds a copy of a model's weights in device memory, each matrix in its
 * GGUF type (F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K: Q4_K_M and Q5_K_M files mix
 * these), and the scratch one forward of up to max_batch rows needs. A cuda_seq is one
 * sequence's KV cache on the device (f16, room for max_kv entries). cuda_forward_batch
 * is model_forward_batch's operation on the GPU: the rows of many sequences (decode rows
 * and prefill slices together) stacked so that each weight matrix is read once per step,
 * attention per sequence over its own entries and positions.
 *
 * Products of up to CUDA_MATVEC_MAX_COLS rows dequantize the weights in registers
 * (engine/cuda/cuda_matmul.h); wider ones dequantize a matrix at a time to f16 and run
 * cuBLAS on the tensor cores. The token embedding is looked up and the RoPE angles are
 * computed on the host, as the CPU path computes them (any RoPE scaling the file has),
 * and travel with the step's other inputs.
 *
 * Architectures: llama (and Mistral), qwen2 and qwen3; other models are refused at load
 * with a message naming what the backend lacks, so that a caller can keep them on the
 * CPU. Built without CUDA (the default: make CUDA=1 builds it), every function fails
 * with "built without CUDA" and cuda_device_count is 0.
 */
#ifndef LLMS_CUDA_H
#define LLMS_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/err.h"
#include "engine/kv/kv.h"
#include "engine/model/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cuda_model cuda_model;
typedef struct cuda_seq cuda_seq;

/* Whether this build has the backend (make CUDA=1). */
bool cuda_built(void);

/* GPUs the driver shows: 0 with err saying why (no driver, no device, built without
 * CUDA). */
int cuda_device_count(char err[ERR_MAX]);

/* The read bandwidth of GPU `device` in GB/s: a kernel summing a 2 GiB buffer with
 * 16-byte loads, median of 5 after a warm-up (what a decode's weight reads can reach). -1
 * + err. */
int cuda_read_bandwidth(int device, double *gb_s, char err[ERR_MAX]);

/* Parses a device setting: "cpu" is -1, "cuda" device 0, "cuda:N" device N. -1 + err for
 * anything else (out: the device, or -1 for the CPU). */
int cuda_parse_device(const char *text, int *out, char err[ERR_MAX]);

/*
 * Uploads m's weights to GPU `device`, with scratch for forwards of up to max_batch rows
 * (<= 0: 512) against sequences of up to max_kv entries (<= 0: the model's n_ctx).
 * m must outlive the result (the token embedding is read from it on the host).
 * NULL + err for an architecture or feature the backend does not run, a weight type it
 * does not compute, a repacked model (model_repack_weights: load it without), a view
 * with adapters, a missing device, or device memory that runs out.
 */
cuda_model *cuda_model_new(const model *m, int device, int max_batch, int max_kv,
                           char err[ERR_MAX]);
void cuda_model_free(cuda_model *cm);

/* The device's name ("NVIDIA H200") and the bytes of weights uploaded. */
const char *cuda_model_device_name(const cuda_model *cm);
size_t cuda_model_weight_bytes(const cuda_model *cm);
int cuda_model_max_kv(const cuda_model *cm);
int cuda_model_max_batch(const cuda_model *cm);

/* Steps of up to 64 rows replay their layers' kernels as a CUDA graph, captured at the
 * first step of each row count (on by default); off, every kernel is launched by itself
 * (what bench/engine compares them with). */
void cuda_model_use_graphs(cuda_model *cm, bool on);

/* An empty sequence: max_kv entries of K and V for every layer in device memory
 * (n_layer * max_kv * n_head_kv * head_dim * 4 bytes). NULL + err when it does not fit. */
cuda_seq *cuda_seq_new(cuda_model *cm, char err[ERR_MAX]);
void cuda_seq_free(cuda_seq *s);
int cuda_seq_n_tokens(const cuda_seq *s);
/* Keeps the first n entries (n <= cuda_seq_n_tokens). */
void cuda_seq_truncate(cuda_seq *s, int n);
/* The token and the position of each of its entries (cuda_seq_n_tokens of each), valid
 * until its next change. */
void cuda_seq_entries(const cuda_seq *s, const int32_t **tokens, const int32_t **positions);

/*
 * Evaluates batches[i] against seqs[i] for i < n_seq and appends their K/V, as
 * model_forward_batch does on the CPU: each row attends to the entries of its sequence
 * at positions <= its own. Outputs: logits and hidden_last of the out rows (host
 * memory, as model_batch says) and attn_received (added to, as on the CPU); hidden, attn,
 * layer_ready and a model other than the one loaded are refused. argmax, when not NULL,
 * receives (sum of n_out) the greedy token of each out row in order, computed on the
 * device (logits may then be NULL: only the ids cross the bus). hosts, when not NULL,
 * are n_seq host sequences of the model's kv_shape, each as long as its device sequence:
 * the step's new entries are appended to them too (write-through, one transfer for the
 * whole step), so that a context's host record stays whole. The rows add up to at most
 * max_batch; no sequence twice. Everything is checked before anything runs: on failure
 * no sequence has changed. 0, or -1 + err (a failing CUDA call is named).
 */
int cuda_forward_batch(cuda_model *cm, int n_seq, cuda_seq *const *seqs,
                       const model_batch *batches, int32_t *argmax, kv_seq *const *hosts,
                       char err[ERR_MAX]);

/*
 * The host tier. cuda_seq_to_host appends the device sequence's entries [from, n) to
 * host, a kv_seq of the same model's kv_shape whose length is from, as f16 chunks with
 * their tokens and positions: a context written through to host memory can be stored,
 * swapped and compressed as any other. cuda_seq_from_host makes s equal to host given
 * that its first `from` entries (<= its length) are host's already: host's entries from
 * there on are uploaded (their chunks resident; compressed ones are decoded to f16 on
 * the way). A context moved GPU -> host -> store -> GPU attends to the same K/V bits as
 * one that never moved, when its chunks stayed f16. -1 + err (s then keeps its first
 * `from` entries).
 */
int cuda_seq_to_host(const cuda_seq *s, int from, kv_seq *host, char err[ERR_MAX]);
int cuda_seq_from_host(cuda_seq *s, const kv_seq *host, int from, char err[ERR_MAX]);

#ifdef __cplusplus
}
#endif

#endif
