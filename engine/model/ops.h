/*
 * ops.h — the numeric building blocks of a transformer layer on f32 rows, and the
 * matrix product of a (possibly quantized) weight matrix with a batch of activations.
 */
#ifndef LLMS_OPS_H
#define LLMS_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/err.h"
#include "engine/threadpool.h"

/* y = x / rms(x) * w over n elements (y may be x). */
void ops_rmsnorm(float *y, const float *x, const float *w, int n, float eps);

/* y = (x - mean(x)) / sqrt(var(x) + eps) * w + b over n elements (y may be x): a pre-norm
 * LayerNorm with bias (StableLM), or without one when b is NULL (Cohere's). */
void ops_layernorm(float *y, const float *x, const float *w, const float *b, int n, float eps);

/* In-place softmax over n elements. */
void ops_softmax(float *x, int n);

/* In-place softmax over the n elements and one more logit, sink, whose probability is
 * dropped: x[i] = e^x[i] / (sum of e^x[j] + e^sink), each shifted by the largest of them
 * all (gpt-oss's attention sinks: a logit per head that takes a share of the attention and
 * gives no value). sink = -INFINITY is ops_softmax, bit for bit. */
void ops_softmax_sink(float *x, int n, float sink);

/* g[i] = silu(g[i]) * u[i] (SwiGLU). */
void ops_silu_mul(float *g, const float *u, int n);

/* gpt-oss's clamped SwiGLU (OpenAI's, llama.cpp's swiglu_oai): with a = min(g[i], 7) and
 * b = clamp(u[i], -7, 7), g[i] = a * sigmoid(1.702 a) * (b + 1). */
void ops_swiglu_oai(float *g, const float *u, int n);

/* g[i] = gelu(g[i]) * u[i] (GeGLU) with gelu's tanh approximation, 0.5 x (1 + tanh(
 * sqrt(2/pi) (x + 0.044715 x^3))), as Gemma computes it (HF's gelu_pytorch_tanh); the AVX2
 * kernel evaluates it as x sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3)), the same function,
 * within 1e-6 relative. */
void ops_gelu_tanh_mul(float *g, const float *u, int n);

/* x[i] = gelu(x[i] + b[i]), gelu's tanh approximation as ops_gelu_tanh_mul's (the AVX2
 * kernel within 1e-6 relative): StarCoder2's non-gated feed-forward, c_fc's output plus its
 * bias through HF's gelu_pytorch_tanh. */
void ops_gelu_tanh_bias(float *x, const float *b, int n);

/* x[i] = cap * tanh(x[i] / cap) (Gemma 2's soft-capping of attention scores and logits);
 * the AVX2 kernel within 1e-6 of cap. */
void ops_softcap(float *x, int n, float cap);

/* y[i] += x[i]. */
void ops_add(float *y, const float *x, int n);

/* x[i] *= s. */
void ops_scale(float *x, float s, size_t n);

/* x = LayerNorm(x + a + c) * w + b over n elements (BERT's post-norm residual and its
 * embedding sum). */
void ops_add_layernorm(float *x, const float *a, const float *c, const float *w, const float *b,
                       int n, float eps);

/* x[i] = gelu(x[i] + b[i]) in the erf form BERT was trained with; the AVX2 kernel is within
 * 1.2e-7 relative of it (plus f32 rounding), see ops_avx2_gelu_bias. */
void ops_gelu_bias(float *x, const float *b, int n);

/* ---- rotary position embedding ---- */

enum ops_rope_style {
    OPS_ROPE_INTERLEAVED, /* rotates pairs (x[2i], x[2i+1]) (llama) */
    OPS_ROPE_HALVES,      /* rotates pairs (x[i], x[i + head_dim/2]) (neox, qwen) */
};

/* How a model scales its RoPE frequencies. Unscaled: OPS_ROPE_UNSCALED; linear by factor
 * s: freq_scale 1/s, the rest as unscaled; YaRN: ops_rope_yarn. */
typedef struct ops_rope_scaling {
    float freq_scale; /* 1 / factor: multiplies the frequency of an interpolated pair */
    float ext_factor; /* YaRN: how much of its unscaled frequency a pair at or below ramp_low
                         keeps (1 all of it); 0 scales every pair by freq_scale */
    float ramp_low;   /* YaRN: pair index at and below which a pair keeps ext_factor of its
                         unscaled frequency */
    float ramp_high;  /* YaRN: pair index at and above which a pair is fully interpolated;
                         linear in between */
    float mscale;     /* multiplies every cos and sin: YaRN's attention temperature, else 1 */
} ops_rope_scaling;

/* The initializer of unscaled RoPE: every pair at its own frequency, cos and sin as they are. */
#define OPS_ROPE_UNSCALED {.freq_scale = 1.0f, .mscale = 1.0f}

/* YaRN (Peng et al. 2023) as llama.cpp computes it: pair i of wavelength
 * 2*pi*base^(2i/head_dim) rotating more than beta_fast times over orig_ctx positions keeps its
 * frequency, one rotating fewer than beta_slow times is divided by factor, linear in between;
 * the ramp's ends are those fractional pair indices floored and ceiled (kept as they are
 * when !truncate: Hugging Face's rope_scaling "truncate": false, which gpt-oss sets as
 * OpenAI's own code computes it), clamped to [0, head_dim - 1]. cos and sin are multiplied
 * by attn_factor * (1 + 0.1 ln factor), the last term only when ext_factor is not 0. */
ops_rope_scaling ops_rope_yarn(int head_dim, float base, float factor, int orig_ctx,
                               float beta_fast, float beta_slow, float ext_factor,
                               float attn_factor, bool truncate);

/* cs = mscale * (cos, sin) of pair i's angle for i < head_dim/2: theta = pos *
 * base^(-2i/head_dim) / freq_factors[i], then freq_scale * theta * (1 - w) + theta * w with w
 * = ext_factor * (1 - clamp((i - ramp_low) / max(ramp_high - ramp_low, 0.001), 0, 1)); computed
 * in double. scaling NULL: unscaled; freq_factors (head_dim/2) NULL: all 1. */
void ops_rope_angles(float *cs, int pos, int head_dim, float base,
                     const ops_rope_scaling *scaling,
                     const float *freq_factors); /* cs: (head_dim/2, 2) */

/* Rotates the first rope_dims (even, <= head_dim) dimensions of each of the n_head heads of
 * x (n_head, head_dim) by the angles of cs (ops_rope_angles of rope_dims), pairing them
 * within those dimensions (halves: x[i] with x[i + rope_dims/2]); the rest pass through,
 * as in partially rotary models (Phi-4-mini). */
void ops_rope(float *x, int n_head, int head_dim, int rope_dims, const float *cs,
              enum ops_rope_style style);

/* ---- half-float rows (KV cache) ---- */

/* dst[i] = f16(src[i]). */
void ops_f32_to_f16(uint16_t *dst, const float *src, int n);

/* ---- attention over f16 K/V blocks (rows of d elements, row i at k + i * d) ---- */

/* Largest head dimension the attention kernels accept: deepseek2's latent and rotated
 * part, 512 + 64, is the widest published. */
#define OPS_MAX_HEAD_DIM 576

/* scores[g * stride + i] = scale * dot(q_g, k_i) for the n_q query rows q (n_q, d) that
 * share this K block, and the n_k rows of k (n_k, d). Each K row is converted once. */
void ops_attn_scores(const float *q, int n_q, const uint16_t *k, int n_k, int d, float scale,
                     float *scores, size_t stride);

/* out_g += sum_i p[g * stride + i] * v_i for g < n_q: out (n_q, d), v (n_k, d). */
void ops_attn_accum(float *out, int n_q, const float *p, size_t stride, const uint16_t *v,
                    int n_k, int d);

/* The same two kernels on f32 rows (compressed chunks decoded to f32). */
void ops_attn_scores_f32(const float *q, int n_q, const float *k, int n_k, int d, float scale,
                         float *scores, size_t stride);
void ops_attn_accum_f32(float *out, int n_q, const float *p, size_t stride, const float *v,
                        int n_k, int d);

/* ---- matrix product ---- */

/* A weight matrix of rows x cols elements of a computable quant type, rows row_bytes
 * apart (as stored in GGUF: ne[0] = cols). repacked: its whole groups of
 * QUANT_REPACK_ROWS rows are in quant_repack_rows' layout (rows past the last whole
 * group as stored); only where quant_repack_kernel(type). */
typedef struct ops_matrix {
    uint32_t type;
    const void *data;
    int rows;
    int cols;
    size_t row_bytes;
    bool repacked;
} ops_matrix;

/* Copies w's rows into dst (w->rows * w->row_bytes bytes) with its whole groups of
 * QUANT_REPACK_ROWS rows repacked, and describes the copy in *out (repacked). Only where
 * quant_repack_kernel(w->type). */
void ops_matrix_repack(const ops_matrix *w, void *dst, ops_matrix *out);

/* Scratch bytes ops_matmul needs for batches up to max_tok rows of up to max_cols
 * columns on n_threads threads. */
size_t ops_matmul_scratch_bytes(int max_tok, int max_cols, int n_threads);

/*
 * y = x W^T for a batch: x (n_tok, w->cols) f32, y (n_tok, w->rows) f32. pool NULL runs
 * it on the calling thread alone (the same results: a row's product never depends on
 * which thread computes it), for products too small to be worth waking the pool's
 * threads (a LoRA adapter's at decode). Small batches
 * use the quantized dot-product kernels (activations converted once, rows split over
 * threads); large batches the packed integer kernel (Q8_0 on AVX-512 VNNI), the AVX-512
 * GEMM (gemm_avx512.h: F16; BF16, Q4_0 and K-quants with AVX-512 BF16, activations and
 * weights rounded to bf16), or else dequantize tiles of W rows and multiply them with
 * sgemm.
 * scratch holds ops_matmul_scratch_bytes(>= n_tok, >= cols, tp_n_threads(pool)) bytes,
 * 64-byte aligned.
 */
void ops_matmul(tp_pool *pool, const ops_matrix *w, const float *x, int n_tok, float *y,
                void *scratch);

/* Up to OPS_MATMUL_MAX matrices applied to the same x in one dispatch (pool NULL: on the
 * calling thread): y[i] = x w[i]^T
 * (q, k and v; gate and up). The input is converted once and the threads share out the
 * rows of all of them, which saves dispatches and balances small matrices. */
#define OPS_MATMUL_MAX 4
void ops_matmul_n(tp_pool *pool, int n_mat, const ops_matrix *const *w, const float *x,
                  int n_tok, float *const *y, void *scratch);

/*
 * y += scale * x W^T for a batch: x (n_tok, w->cols) f32, y n_tok rows ldy floats apart,
 * of which the first w->rows are added to. The B product of a LoRA adapter (W its lora_b,
 * x the lora_a product, rank-wide): every type adds f32 products of W's values and x (F32
 * and F16 rows read by their dot kernels in place, others dequantized to f32 first). Up to
 * 16 tokens each result is a per-row dot product, the same bits at every token count
 * (batched rows get their solo results); above that sgemm adds into y. w must not be repacked. scratch as ops_matmul's for (n_tok, w->cols);
 * pool NULL: on the calling thread.
 */
void ops_matmul_add(tp_pool *pool, const ops_matrix *w, const float *x, int n_tok, float scale,
                    float *y, size_t ldy, void *scratch);

/* Loads OpenBLAS (blas_init) and settles the CPU feature checks, before any pool thread
 * reads them. Call it before starting threads. -1 with err when OpenBLAS cannot load. */
int ops_init(char err[ERR_MAX]);

#endif
