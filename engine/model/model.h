/*
 * model.h — a decoder-only transformer loaded from GGUF, and its forward pass.
 *
 * Architectures (general.architecture): "llama", "qwen2" (q/k/v biases), "qwen3"
 * (per-head RMSNorm of q and k), "phi3" (Phi-3, Phi-3.5, Phi-4-mini: fused attn_qkv and
 * gate/up matrices read as views, partial rotary, LongRoPE factors; a sliding window caps
 * n_ctx), "granite" (llama with scaled embeddings, residuals, attention and logits),
 * mixtures of experts: "qwen2moe" (qwen2's attention, a sigmoid-gated shared expert),
 * "qwen3moe" (qwen3's attention), "llama" with {arch}.expert_count (Mixtral) and "olmoe"
 * (RMSNorm of all of q and of all of k), and Google's "gemma", "gemma2" and "gemma3" in
 * llama.cpp's layout (convert_hf_to_gguf.py has added 1 to every norm weight already, so
 * their RMSNorms are the plain x * w): the token embedding scaled by sqrt(dim), GeGLU
 * (gelu, tanh form, of gate times up), NEOX RoPE, the output tied to the embedding; gemma2
 * and gemma3 add norms of each sublayer's output before its residual add
 * (post_attention_norm, post_ffw_norm) and sliding-window attention on some layers
 * (model_layer_window); gemma2 soft-caps the attention scores and the logits
 * (cap * tanh(x / cap)); gemma3 has qwen3's per-head q/k norms and RoPE of base 10000,
 * unscaled, on its sliding layers; "olmo2" (OLMo 2: no norm before either sublayer, an
 * RMSNorm of each sublayer's output before its residual add, olmoe's RMSNorm of all of q
 * and of all of k); "granitemoe" (Granite 3.x MoE: granite's scales, its experts in
 * Mixtral's layout, Granite MoE Shared's ungated shared expert when the file has one);
 * "smollm3" (SmolLM3: llama with no RoPE on every fourth layer, model_layer_rotates);
 * "exaone" (EXAONE 3.0/3.5: llama's tensors, NEOX RoPE); "stablelm" (StableLM, StableLM 2
 * 1.6B/3B: LayerNorms with biases, partial NEOX rotary, q/k/v biases where the file has
 * them); "starcoder2" (StarCoder2 3B/7B/15B: LayerNorms with biases, q/k/v/o with biases,
 * NEOX RoPE, a non-gated feed-forward of ffn_up and ffn_down with biases through gelu's
 * tanh form); "phi2" (Phi-2: one LayerNorm with bias before the attention and the
 * feed-forward, which run side by side from it (parallel), starcoder2's biases and
 * ungated feed-forward, partial NEOX rotary, an output bias; q/k/v as three matrices or
 * one attn_qkv); "exaone4" (EXAONE 4.0: olmo2's norms with qwen3's per-head q/k norms, the 32B's
 * sliding layers beside global ones without RoPE); "mistral3" (Ministral 3: llama with
 * Llama 4's attention temperature on the queries); "glm4" (GLM-4-0414, GLM-Z1: gemma2's
 * norms around each sublayer, q/k/v biases
 * where the file has them, gate and up in one ffn_up as phi3's, interleaved RoPE over half
 * of each head), "chatglm" (GLM-4-9B-chat of 2024, ChatGLM3: glm4 without the norms of
 * the sublayers' outputs, q/k/v in one attn_qkv with its bias); OpenAI's "gpt-oss"
 * (gpt-oss-20b/120b in llama.cpp's layout): q/k/v/o with biases, NEOX RoPE with YaRN,
 * attention sinks (one learned logit per head in every softmax's denominator), a sliding
 * window on the even layers, and experts with biases (router included) and OpenAI's
 * clamped SwiGLU, routed by softmax over the top k of the router's logits; Cohere's
 * "command-r" (Command-R, Command-R+, Aya 23, Aya Expanse) and "cohere2" (Command R7B,
 * Command A): one LayerNorm without bias feeding attention and the feed-forward in
 * parallel (both outputs added to the residual), interleaved RoPE as the file holds q and
 * k, per-head q/k LayerNorms where the file has them (Command-R+), the output tied to the
 * embedding and multiplied by logit_scale; cohere2 slides three layers of four
 * (attention.sliding_window_pattern), the fourth attending globally without RoPE;
 * ByteDance's "seed_oss" (Seed-OSS-36B): llama's layer with NEOX RoPE, q/k/v biases and
 * the feed-forward's norm named after HF's post_attention_layernorm; Tencent's
 * "hunyuan-dense" (Hunyuan 0.5B-7B, Hunyuan-MT-7B): qwen3's layer with its q/k norms
 * after RoPE, whose base the NTK-aware rope.scaling.alpha raises; "deepseek2" (DeepSeek-V2,
 * V2-Lite, V2.5, V3, R1, Kimi-K2, GLM-4.7-Flash, Moonlight, as llama.cpp converts them):
 * multi-head latent attention (the mla_* hyper-parameters: the KV cache holds one latent
 * per token), leading dense layers, then experts with ungated shared experts, routed by
 * softmax or sigmoid, DeepSeek-V3's selection bias and expert groups; Baidu's
 * "ernie4_5-moe" (ERNIE-4.5-21B-A3B, 300B-A47B): llama's attention, a leading dense layer,
 * then experts routed by softmax with the selection bias, renormalized, and a shared
 * expert; "glm4moe" (GLM-4.5, GLM-4.5-Air, GLM-4.6): q/k/v biases, per-head q/k norms
 * where the file has them, partial NEOX RoPE, the feed-forward's norm named
 * post_attention_norm, leading dense layers, then deepseek2's routing without groups
 * (sigmoid, the selection bias, renormalized and scaled) and shared experts; the file's
 * trailing multi-token-prediction layers (nextn_predict_layers) are not run, as
 * llama.cpp does not run them. The language models of vision conversions load as their text architecture under their own
 * key prefix (model_arch_from_name): "qwen2vl" (Qwen2-VL, Qwen2.5-VL) as qwen2, "qwen3vl"
 * and "qwen3vlmoe" (Qwen3-VL) as qwen3 and qwen3moe, text only; "internlm2" (InternLM2,
 * 2.5), "ernie4_5" (ERNIE 4.5 0.3B) and "xverse" as llama. Every architecture takes q/k/v
 * biases (all three) and an output bias where the file has them, as llama.cpp's loader
 * does. Weights are used in place from the file mapping.
 *
 * The forward primitive evaluates a batch of tokens at ARBITRARY absolute positions
 * against a kv_seq: each batch token attends to every entry of the sequence (existing
 * chunks and the batch's own new entries) whose position is <= its own, and the batch's
 * K/V are appended to the sequence. This one operation serves prefill, decode, exact
 * recompute of interleaved chunks, reuse of saved KV, and scoring.
 */
#ifndef LLMS_MODEL_H
#define LLMS_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/err.h"
#include "engine/gguf/gguf.h"
#include "engine/kv/kv.h"
#include "engine/model/ops.h"

enum model_arch {
    MODEL_ARCH_LLAMA,
    MODEL_ARCH_QWEN2,
    MODEL_ARCH_QWEN3,
    MODEL_ARCH_PHI3,
    MODEL_ARCH_GRANITE,
    MODEL_ARCH_QWEN2MOE,
    MODEL_ARCH_QWEN3MOE,
    MODEL_ARCH_OLMOE,
    MODEL_ARCH_GEMMA,
    MODEL_ARCH_GEMMA2,
    MODEL_ARCH_GEMMA3,
    MODEL_ARCH_GPTOSS,
    MODEL_ARCH_OLMO2,
    MODEL_ARCH_GRANITEMOE,
    MODEL_ARCH_SMOLLM3,
    MODEL_ARCH_EXAONE,
    MODEL_ARCH_STABLELM,
    MODEL_ARCH_MISTRAL3,
    MODEL_ARCH_EXAONE4,
    MODEL_ARCH_GLM4,
    MODEL_ARCH_CHATGLM,
    MODEL_ARCH_COMMAND_R,
    MODEL_ARCH_COHERE2,
    MODEL_ARCH_STARCODER2,
    MODEL_ARCH_PHI2,
    MODEL_ARCH_SEED_OSS,
    MODEL_ARCH_HUNYUAN_DENSE,
    MODEL_ARCH_DEEPSEEK2,
    MODEL_ARCH_ERNIE4_5_MOE,
    MODEL_ARCH_GLM4MOE,
};

/* general.architecture's name of a ("llama", "phi3", "gemma2", ...). */
const char *model_arch_name(enum model_arch a);

/* The architecture called name[0..len) (general.architecture), or -1 for one this engine's
 * decoder does not run; a vision conversion's name gives its language model's ("qwen3vl":
 * MODEL_ARCH_QWEN3). */
int model_arch_from_name(const char *name, size_t len);

/* The feed-forward activation of gate, multiplied by up (but for the ungated one). */
enum model_ffn_act {
    MODEL_FFN_SILU,      /* SwiGLU: silu(gate) * up (llama, qwen) */
    MODEL_FFN_GELU_TANH, /* GeGLU: gelu(gate) * up, gelu's tanh approximation (gemma) */
    MODEL_FFN_SWIGLU_OAI, /* gpt-oss's experts: ops_swiglu_oai, clamped at 7 */
    MODEL_FFN_GELU_TANH_UNGATED, /* no gate: gelu(up + ffn_up.bias), tanh form, then down +
                                    ffn_down.bias (starcoder2, phi2) */
};

/* The sublayers' and the output's norm. */
enum model_norm {
    MODEL_NORM_RMS,   /* x / rms(x) * w */
    MODEL_NORM_LAYER, /* (x - mean) / std * w + b, LayerNorm with bias (stablelm,
                         starcoder2, phi2) or without (command-r, cohere2) */
};

/* How RoPE pairs up dimensions within a head. */
enum model_rope_style {
    MODEL_ROPE_INTERLEAVED, /* llama: rotates (x[2i], x[2i+1]) */
    MODEL_ROPE_HALVES,      /* neox / qwen / phi3: rotates (x[i], x[i + rope_dims/2]) */
};

typedef struct model_hparams {
    enum model_arch arch;
    char file_arch[24]; /* general.architecture as the file names it: the prefix of its
                           keys, "qwen3vl" where arch is MODEL_ARCH_QWEN3 (model_arch_from_name) */
    enum model_rope_style rope_style;
    int n_vocab;
    int dim;        /* embedding length */
    int n_layer;
    int n_head;
    int n_head_kv;  /* grouped-query attention: n_head is a multiple of it */
    int head_dim;   /* attention.key_length */
    int n_ff;       /* feed-forward hidden size (with experts: the widest of an expert's
                       and the shared expert's, what the runner's scratch holds; deepseek2:
                       its dense layers', model_ff_max the widest) */
    /* Mixture of experts: each token's feed-forward is the weighted sum of the
     * n_expert_used experts its router ranks first, of n_expert (0: a dense model). */
    int n_expert;
    int n_expert_used;
    int n_ff_exp;      /* an expert's hidden size */
    int n_ff_shexp;    /* the shared expert's hidden size (qwen2moe, granitemoe), 0 when none */
    bool expert_norm;  /* the chosen experts' weights are renormalised to sum to 1 */
    int n_ctx;      /* context length the model was trained for; phi3 with a sliding
                       window shorter than it: the window (see sliding_window) */
    int rope_dims;  /* {arch}.rope.dimension_count: the first rope_dims of each head are
                       rotated, the rest pass through (Phi-4-mini: 96 of 128) */
    int rope_orig_ctx; /* {arch}.rope.scaling.original_context_length (n_ctx when absent):
                          LongRoPE's long factors apply to runners of a longer context */
    float rope_base;
    ops_rope_scaling rope_scaling; /* {arch}.rope.scaling.*: none, linear or yarn; mscale
                                      is LongRoPE's attention factor too */
    /* phi3: {arch}.attention.sliding_window, 0 when it has none (Phi-4). Window masking
     * is not computed: a window shorter than the trained context caps n_ctx to it, so
     * that no token ever has more than the window behind it and every answer is exact. */
    int sliding_window;
    float residual_scale; /* granite, granitemoe: each sublayer's output times it, else 1 */
    float logit_scale;    /* granite, granitemoe: logits divided by it; command-r, cohere2:
                             the reciprocal of their logit_scale, which multiplies; else 1 */
    float norm_eps;
    int pooling_type; /* {arch}.pooling_type, numbered as llama.cpp does (0 none, 1 mean,
                         2 cls, 3 last, 4 rank): how an embedding model pools; -1 when the
                         file has none (a plain generator) */

    /* What granite and the Gemma family add; the other architectures have the neutral
     * values (scale 1 / sqrt(head_dim), embedding scale 1, no caps, no window, SwiGLU, no
     * post norms, pre norms); so does olmo2 but for its norms. */
    float attn_scale;    /* multiplies q.k before the softmax (and the cap): granite's
                            attention.scale; llama.cpp's rule for gemma2/gemma3:
                            1 / sqrt(dim / n_head) for the 27B models (46 and 62 layers:
                            HF's query_pre_attn_scalar is dim / n_head there),
                            1 / sqrt(head_dim) for every other shape and architecture */
    float embd_scale;    /* multiplies the token embedding's rows: granite's
                            embedding_scale, sqrt(dim) for gemma, else 1 */
    float attn_softcap;  /* scores = cap * tanh(scores / cap) before the mask; 0: none */
    float final_softcap; /* logits = cap * tanh(logits / cap); 0: none */
    int swa_window;      /* sliding window: a sliding layer's row at position p attends to
                            the entries at positions p - swa_window < q <= p; 0: none */
    int swa_pattern;     /* layer l slides when l % swa_pattern < swa_pattern - 1 (gemma2:
                            2, the even layers; gemma3: 6, all but every sixth; cohere2:
                            4) */
    bool rope_swa;       /* sliding layers rotate by rope_base_swa, unscaled (gemma3) */
    int nope_step;       /* layer l rotates nothing when (l + 1) % nope_step == 0: smollm3's
                            4 (llama.cpp's n_no_rope_layer_step), the global layers
                            (swa_pattern) of exaone4 and cohere2 beside sliding ones; 0:
                            every layer rotates */
    float rope_base_swa;
    /* mistral3 (Ministral 3): Llama 4's attention temperature, q of a row at position p
     * times 1 + attn_temp_scale * ln(1 + floor(p / attn_temp_floor)) (llama.cpp's
     * attention.temperature_scale, over rope.scaling.original_context_length); 0: none */
    float attn_temp_scale;
    int attn_temp_floor;
    enum model_ffn_act ffn_act;
    enum model_norm norm; /* of attn_norm, ffn_norm and output_norm; norm_eps is
                             attention.layer_norm_epsilon for MODEL_NORM_LAYER */
    bool post_norms;     /* post_attention_norm / post_ffw_norm of each sublayer's output
                            (gemma2, gemma3, olmo2, exaone4, glm4; not chatglm) */
    bool pre_norms;      /* attn_norm / ffn_norm of each sublayer's input: all but olmo2
                            and exaone4, whose sublayers read the residual stream as it is */
    bool parallel;       /* command-r, cohere2, phi2: the feed-forward reads attn_norm's
                            output as attention does (no ffn_norm), both outputs added to
                            the residual stream of the layer's input */
    bool qk_norm_after_rope; /* hunyuan-dense: the per-head q/k norms of rotated q and k */

    /* deepseek2's multi-head latent attention (MLA), 0 for the other architectures. Every
     * head's keys and values are products of one latent vector per token, which is what
     * the KV cache holds: one KV head (n_head_kv 1) of head_dim = mla_kv_rank + rope_dims,
     * the latent (RMS-normalized) then the rotated part of k all heads share; V is the same
     * vector (stored once: model_kv_shape's shared_kv), of which attention's output keeps
     * the latent. Each head's query is mapped
     * into the latent by its block of attn_k_b and its output out of it by attn_v_b
     * (absorbed, as llama.cpp computes it): what it attends with is the latent's
     * mla_kv_rank dimensions plus its rope_dims rotated ones, scaled by attn_scale =
     * mscale^2 / sqrt(mla_qk_nope + rope_dims). */
    int mla_q_rank;  /* attention.q_lora_rank: q from attn_q_b of the RMS-normalized
                        attn_q_a product; 0: from attn_q (the lite models) */
    int mla_kv_rank; /* attention.kv_lora_rank */
    int mla_qk_nope; /* a head's unrotated query/key dimensions (key_length_mla - rope_dims) */
    int mla_v_dim;   /* a head's value dimensions (value_length_mla) */
    /* deepseek2's, glm4moe's and ernie4_5-moe's mixture of experts: the first n_dense_lead
     * layers have a dense feed-forward of n_ff (leading_dense_block_count); the others'
     * routing as llama.cpp computes it (ernie4_5-moe: softmax, the bias, renormalized): probabilities by softmax or sigmoid of the router's logits
     * (expert_gating_func), selection by them plus exp_probs_b where the file has it,
     * within the expert_group_used_count groups of experts (of n_expert_groups) whose two
     * best selection scores add up highest, each chosen expert weighted by its
     * probability, renormalized (expert_norm) and times expert_scale (when not 0). */
    int n_dense_lead;
    bool expert_sigmoid;
    float expert_scale;
    int n_expert_groups;      /* 0 or 1: no groups */
    int n_expert_groups_used;
} model_hparams;

/* The sliding window of layer l: hp->swa_window for a sliding layer, 0 (the whole
 * sequence) for the others and for every layer of a model without one. The KV of every
 * entry is kept whatever the window: it only bounds what attention reads. */
int model_layer_window(const model_hparams *hp, int layer);

/* Whether layer l's feed-forward is a mixture of experts: every layer of a model with
 * experts but deepseek2's leading dense ones. */
bool model_layer_has_experts(const model_hparams *hp, int layer);

/* The widest feed-forward hidden size of any layer: dense, an expert's or the shared
 * expert's (the rows of the runner's gate and up scratch). */
int model_ff_max(const model_hparams *hp);

/* The widths a runner's scratch is sized by (and engine/model/prefill.c's estimate of it):
 * the widest input of any matrix product, and deepseek2's per-head products' rows in
 * (max(mla_qk_nope, mla_kv_rank)) and out (max(mla_kv_rank, mla_v_dim)), 0 for the other
 * architectures. */
typedef struct model_widths {
    int max_cols;
    int mla_in, mla_out;
} model_widths;
model_widths model_widths_of(const model_hparams *hp);

/* Whether layer l rotates q and k (RoPE): every layer but smollm3's NoPE ones. */
bool model_layer_rotates(const model_hparams *hp, int layer);

typedef struct model model;
typedef struct lora lora; /* engine/model/lora.h */

/* One layer's small per-head tensors, applied to q, k and v after their matrix products
 * (NULL when the architecture has none). */
typedef struct model_qkv_extras {
    const float *bq;     /* (n_head * head_dim), qwen2 */
    const float *bk;     /* (n_head_kv * head_dim), qwen2 */
    const float *bv;     /* (n_head_kv * head_dim), qwen2 */
    const float *q_norm; /* (head_dim), qwen3 */
    const float *k_norm; /* (head_dim), qwen3 */
    const float *q_norm_all; /* (n_head * head_dim), olmoe, olmo2: one RMSNorm over all of q */
    const float *k_norm_all; /* (n_head_kv * head_dim), olmoe, olmo2 */
    /* command-r (Command-R+): a LayerNorm without bias of each head by its own row */
    const float *q_norm_heads; /* (n_head, head_dim) */
    const float *k_norm_heads; /* (n_head_kv, head_dim) */
} model_qkv_extras;

/* Finishes one token's q (n_head, head_dim), k and v (n_head_kv, head_dim) at position
 * pos: biases, per-head norms of q and k (after RoPE where qk_norm_after_rope), then RoPE
 * of q and k by cs, the (cos, sin) pairs
 * of the token's position (ops_rope_angles), or none when cs is NULL (a layer that does
 * not rotate, model_layer_rotates), and the attention temperature of q. Shared by every
 * forward pass over these layers. */
void model_qkv_finish(const model_hparams *hp, const model_qkv_extras *x, const float *cs,
                      int32_t pos, float *q, float *k, float *v);

/* Maps and validates a GGUF model file: architecture, hyper-parameters, and every
 * tensor's presence, type and shape (errors name the tensor). NULL + err on failure. */
model *model_load(const char *path, char err[ERR_MAX]);

/* Same, bringing the weights into memory as `how` says (model_load maps them). */
model *model_load_as(const char *path, gguf_load how, char err[ERR_MAX]);

/* Same, from an already open file; the model borrows g, which must outlive it. */
model *model_from_gguf(const gguf_file *g, char err[ERR_MAX]);

/* Reads {arch}.suffix as a positive integer no larger than 2^20: dflt when absent (an
 * error when dflt < 0). For every architecture's loader (model.c, bert.c). */
int model_get_dim(const gguf_file *g, const char *arch, const char *suffix, int dflt,
                  int *out, char err[ERR_MAX]);

/* Reads {arch}.suffix as a positive finite number (a norm epsilon, a RoPE base): dflt when
 * absent. */
int model_get_float(const gguf_file *g, const char *arch, const char *suffix, float dflt,
                    float *out, char err[ERR_MAX]);

/* The tensor name of exactly (ne0[, ne1]) elements (n_dims 1 or 2) of a type the kernels
 * compute, with bytes enough for it; NULL + err naming it otherwise. */
const gguf_tensor *model_gguf_tensor(const gguf_file *g, const char *name, int n_dims,
                                     int64_t ne0, int64_t ne1, char err[ERR_MAX]);

/*
 * Repacks the weight matrices whose type has repacked kernels on this CPU
 * (quant_repack_kernel: Q8_0 with AVX-512 VNNI) into a private copy of the same size, in
 * the layout those kernels read: a matrix product runs ~1.1x (one activation row) to
 * ~1.4-1.7x (4 to 32 rows) as fast (one thread, 5632 x 2048 matrices from DRAM; whole
 * decode steps: bench/repack_decode), and every product equals the scalar kernel's bit
 * for bit, so batched rows give exactly their solo results. The token embedding stays as
 * stored (an output matrix tied to it gets a repacked copy of its own). Copied weights
 * (GGUF_LOAD_COPY) give their replaced pages back, so that they are not held twice;
 * mapped ones keep the file in the page cache, reclaimable, beside
 * model_repacked_bytes of private memory. A repacked
 * model's weights cannot stream (model_runner_stream_weights refuses): streaming runners
 * read the file's layout. Does nothing on other CPUs, with LLMS_NO_SIMD or
 * LLMS_NO_AVX512, or when called again. -1 + err when the memory cannot be had, or for
 * a model with adapters (repack its base: the view reads the base's matrices as they are
 * when it runs).
 */
int model_repack_weights(model *m, char err[ERR_MAX]);
/* Private memory repacking added: the copy less the copied weights' pages it gave back
 * (about 0 for copied weights; 0 when nothing was repacked). */
size_t model_repacked_bytes(const model *m);

/* Frees the model (and closes the file when model_load opened it). NULL is allowed. */
void model_free(model *m);

/*
 * LoRA adapters (engine/model/lora.h), applied unmerged.
 *
 * A model with adapters is a view of a model loaded from a file: it reads that model's
 * weights, which stay as they are and are shared by every view of them, and its forward
 * adds each adapter's delta to the products of the matrices it adapts, y = W x + sum of
 * s_i B_i (A_i x) with s_i = scales[i] * alpha_i / rank (llama.cpp's scale), the token
 * embedding's rows too. An adapter at scale 0 is not computed, so such a view gives its
 * base's outputs bit for bit. Runners, KV pools and everything else take a view as a
 * model; a runner of one holds the adapters' scratch (rows of the largest rank) besides
 * the base's. The A products of the matrices that share an input run in one dispatch
 * with the usual kernels (8-bit activations for a Q8_0 adapter, as llama.cpp's); the B
 * products add f32 dot products into the base's (ops_matmul_add), so that with at most
 * 16 stacked rows a sequence's outputs are its solo ones bit for bit, as without
 * adapters.
 *
 * base: a model loaded from a file, which must outlive the view, as must the adapters,
 * each checked against it (lora_load); 0..MODEL_LORA_MAX adapters, scales finite. NULL
 * + err otherwise.
 */
#define MODEL_LORA_MAX 8
model *model_with_loras(const model *base, int n, const lora *const *adapters,
                        const float *scales, char err[ERR_MAX]);

/* The model whose weights m reads: its base when it has adapters, else m itself. */
const model *model_base(const model *m);

/* The adapters of a model made by model_with_loras (0 for others). */
int model_n_loras(const model *m);

const model_hparams *model_hparams_of(const model *m);

/* The file's RoPE frequency divisors, rope_freqs.weight (rope_dims/2; Llama 3.1 and
 * later), or NULL when it has none; they live as long as m. LongRoPE's factors are the
 * runner's choice (model_runner_new): not these. */
const float *model_rope_freqs(const model *m);

/* The file the model was loaded from (tokenizer metadata lives there too). */
const gguf_file *model_gguf(const model *m);

/* The final RMSNorm (output_norm) applied to one residual row x (dim) into y (dim), as
 * before the output matrix; x and y may be the same. For embeddings and intermediate
 * scores taken from model_batch.hidden. */
void model_output_norm(const model *m, const float *x, float *y);

/* The tensors one layer's forward reads, as the file stores them (matrices in their GGUF
 * types, ops_matrix.repacked set where model_repack_weights changed their layout), for a
 * backend that keeps its own copy of the weights (engine/cuda). Shapes as in a dense
 * llama layer; w_gate/w_up/w_down have data NULL in a model with experts. */
typedef struct model_layer_tensors {
    const float *attn_norm;  /* (dim), NULL for olmo2 */
    const float *ffn_norm;   /* (dim), NULL for olmo2 */
    model_qkv_extras extras; /* q/k/v biases (qwen2), q/k norms (qwen3) */
    ops_matrix wq;           /* (n_head * head_dim, dim) */
    ops_matrix wk;           /* (n_head_kv * head_dim, dim) */
    ops_matrix wv;           /* (n_head_kv * head_dim, dim) */
    ops_matrix wo;           /* (dim, n_head * head_dim) */
    ops_matrix w_gate;       /* (n_ff, dim) */
    ops_matrix w_up;         /* (n_ff, dim) */
    ops_matrix w_down;       /* (dim, n_ff) */
    const float *bo;         /* (dim) attn_output.bias, NULL where the file has none */
} model_layer_tensors;

/* Layer `layer` (< n_layer) of m's base. */
void model_layer_tensors_of(const model *m, int layer, model_layer_tensors *out);

/* The token embedding (n_vocab, dim), the output matrix (n_vocab, dim: the embedding
 * itself when the file ties them) and the output norm's weight (dim) of m's base. */
const ops_matrix *model_token_embedding(const model *m);
const ops_matrix *model_output_matrix(const model *m);
const float *model_output_norm_weight(const model *m);

/* The shape of this model's KV chunks, for kv_pool_new. */
kv_shape model_kv_shape(const model *m);

/*
 * A runner owns what evaluating the model needs: the thread pool and all scratch memory,
 * sized for batches of up to max_batch tokens against at most max_kv KV entries, so
 * that model_forward allocates nothing (except new KV chunks taken from the sequence's
 * pool). A runner is used by one thread at a time.
 */
typedef struct model_runner model_runner;

/* n_threads <= 0: online CPUs. max_batch <= 0: 512. max_kv <= 0: the model's n_ctx.
 * A model with a sliding window (phi3) refuses a max_kv above its n_ctx (the window).
 * LongRoPE (rope_factors_long/short.weight): the long factors when max_kv is above
 * rope_orig_ctx, the short ones otherwise, as llama.cpp chooses by its context size.
 * Makes OpenBLAS single-threaded for the whole process (the runner's pool splits the
 * work instead). */
model_runner *model_runner_new(const model *m, int n_threads, int max_batch, int max_kv,
                               char err[ERR_MAX]);

/* Query rows per block of batched attention when a runner is not told otherwise. */
#define MODEL_ATTN_ROWS_DEFAULT 32

/* Everything a runner can be sized by (model_runner_new fills the first three). */
typedef struct model_runner_opts {
    int n_threads; /* <= 0: online CPUs */
    int max_batch; /* <= 0: 512 */
    int max_kv;    /* <= 0: the model's n_ctx */
    /* Query rows whose attention scores (one row of max_kv floats each) a thread holds at
     * once: max_batch is the unpartitioned path, fewer rows block the scores, softmax and
     * output (engine/model/prefill.h plans it). <= 0: MODEL_ATTN_ROWS_DEFAULT. */
    int attn_rows;
} model_runner_opts;

/* A runner sized by opts. The attention buffers and the MLP's gate/up share one region
 * (they are never live together), so the scratch is the larger of the two plus what
 * every step uses: model_runner_scratch_bytes. */
model_runner *model_runner_new_opts(const model *m, const model_runner_opts *opts,
                                    char err[ERR_MAX]);
void model_runner_free(model_runner *r);

/*
 * A runner for m that uses owner's thread pool and scratch: runners of a base and of its
 * views with adapters (model_with_loras) cost one runner's working memory, not one each,
 * when one thread runs them one at a time (as the daemon's worker runs its generate
 * models), never two at once. It has owner's sizes (max_batch, max_kv, attention rows);
 * its own memory is its adapters' A products (3 * max_batch * rank floats). m must read
 * owner's model's weights (model_base(m) == model_base of owner's model), owner must not
 * be a shared runner itself and must outlive it. Setting the pool to background work
 * (model_runner_set_background) sets it for both. NULL + err.
 */
model_runner *model_runner_new_shared(const model *m, model_runner *owner, char err[ERR_MAX]);

/* Room in r for batches of models whose adapters have ranks up to rank
 * (model_batch.model): the A products' scratch grows to it (a no-op when it holds as
 * much). Not while a forward runs. -1 + err when memory runs out. */
int model_runner_reserve_lora(model_runner *r, int rank, char err[ERR_MAX]);

/* Bytes of scratch the runner allocated (its working memory, KV and weights apart; a
 * shared runner's own, not its owner's). */
size_t model_runner_scratch_bytes(const model_runner *r);

/*
 * Weight residency by size for mapped weights (model_load, model_load_as with
 * GGUF_LOAD_MAP): every matrix is a fragment; sorted by size, the smallest stay resident
 * up to resident_bytes, the others stream per layer during forwards of at least
 * MODEL_STREAM_MIN_ROWS rows (prefill): the next layer's are prefetched (MADV_WILLNEED,
 * read ahead by the kernel while this layer computes) and a layer's are released
 * (MADV_DONTNEED: the pages leave this process, the page cache may keep them) once it
 * is done, so about two layers of large fragments are in memory at once.
 * SIZE_MAX turns streaming off (the default). -1 + err when the weights are not mapped.
 */
#define MODEL_STREAM_MIN_ROWS 64
int model_runner_stream_weights(model_runner *r, size_t resident_bytes, char err[ERR_MAX]);

/* Bytes of weight matrices that stay resident / stream under resident_bytes, and the
 * largest one layer streams (what the plan counts as the window: two of these). */
typedef struct model_residency {
    size_t resident;
    size_t streamed;
    size_t layer_max;
    int n_resident, n_streamed; /* fragments */
} model_residency;
model_residency model_weight_residency(const model *m, size_t resident_bytes);

/*
 * Runs this runner's forwards on GPU `device` (engine/cuda: a make CUDA=1 build; llama,
 * qwen2 and qwen3 in F32, F16, BF16, Q8_0, Q4_0 and the K-quants Q4_K, Q5_K, Q6_K). The
 * weights are uploaded once; each sequence's K/V live on the device while it runs, and
 * every step's new entries are also appended to its kv_seq, so that the host sequences
 * stay whole and everything that reads, stores, compresses or swaps them works as before
 * (engine/model/offload.h). Batches that ask for per-layer hidden states, attention
 * probabilities or adapter views' rows still run on the CPU. Numerics: products of up to
 * 8 rows round the activations of quantized weights to 8 bits (as the CPU's dot kernels
 * do, differently), wider ones run on cuBLAS with f16 activations, so logits differ from
 * the CPU path's by rounding (engine/cuda/README.md, tests/engine/test_cuda.c). -1 + err when the backend refuses the model, the device
 * or its memory (the runner then stays on the CPU), and for shared or streaming runners.
 */
int model_runner_use_gpu(model_runner *r, int device, char err[ERR_MAX]);

/* The GPU's name ("NVIDIA H200") when the runner uses one, else NULL. */
const char *model_runner_gpu_name(const model_runner *r);

int model_runner_n_threads(const model_runner *r);

/* Threads its jobs run on now: fewer than model_runner_n_threads while the pool finds
 * other processes holding the cores (threadpool.h). */
int model_runner_n_threads_active(const model_runner *r);

/* Forward passes on one thread for work nobody waits for (background), or on the pool
 * again: see tp_set_background. */
void model_runner_set_background(model_runner *r, bool background);

/* While abort is set (not NULL), a forward reads *abort before each layer and, once it
 * is true, stops: the sequences are as before the call and model_forward_batch returns
 * MODEL_ABORTED. Lets work nobody waits for give the runner up to a request within a
 * layer, not a whole step. Not for batches with attn or layer_ready, nor while weights
 * stream (model_runner_stream_weights), where a forward always runs to its end. NULL:
 * forwards always run to their end (the default). */
#define MODEL_ABORTED 1
void model_runner_set_abort(model_runner *r, const _Atomic bool *abort);

/*
 * Room to keep a forward that stopped at the abort flag, so that it goes on from the
 * layer it reached instead of starting over: the residual stream of its rows and the K/V
 * of the layers it finished ((dim * 4 + 4 * n_layer * n_head_kv * head_dim) bytes per
 * row). Work nobody waits for then loses nothing to a request, however often requests
 * come, and a request waits for one layer, not one forward.
 *
 * While p is the runner's pause (model_runner_set_pause), a forward of one batch of at
 * most max_rows rows (and max_batch), without attn, hidden, attn_received or
 * layer_ready, that stops at the flag finishes the layer it is in, keeps what it has, and
 * returns MODEL_ABORTED with the sequence as before the call. The next forward with p
 * set takes what p kept: when it is the same batch (tokens, positions, out rows, model)
 * against the same sequence, unchanged meanwhile, it starts at the first layer the
 * stopped one did not finish, and its outputs and K/V are those of a forward that never
 * stopped, bit for bit; otherwise it starts at the first layer and p's forward is gone.
 * Either way it runs at least one layer before it reads the flag, so repeated stops still
 * move the forward on. Forwards while p is not set (requests between the stop and the
 * resume) neither read nor change it. The sequence must not change between the stop and
 * the resume but through this forward: p checks the sequence's length and chunks, not
 * the K/V in them.
 */
typedef struct model_pause model_pause;

/* A pause of runner r for forwards of up to max_rows rows (1 .. r's max_batch). NULL +
 * err on bad arguments or no memory. */
model_pause *model_pause_new(const model_runner *r, int max_rows, char err[ERR_MAX]);
void model_pause_free(model_pause *p);

/* Layers of the forward p keeps that are done; 0 when it keeps none. */
int model_pause_layers(const model_pause *p);

/* Forwards that went on from where p's kept forward stopped, since p was made. */
uint64_t model_pause_resumed(const model_pause *p);

/* Forgets the forward p keeps (its work is wanted no more). */
void model_pause_clear(model_pause *p);

/* Makes p (one of r's, model_pause_new) the pause of r's forwards, or none (NULL). -1 +
 * err when p is another runner's. */
int model_runner_set_pause(model_runner *r, model_pause *p, char err[ERR_MAX]);

int model_runner_max_kv(const model_runner *r);

/* One batch to evaluate. Outputs are caller-provided; optional ones are NULL when off. */
typedef struct model_batch {
    int n_tokens;
    const int32_t *tokens;    /* (n_tokens) token ids, each < n_vocab */
    const int32_t *positions; /* (n_tokens) absolute positions, >= 0 */

    /* Rows whose outputs are wanted: n_out strictly increasing indices into the batch. */
    int n_out;
    const int32_t *out_rows;  /* (n_out) */

    float *logits;            /* (n_out, n_vocab), or NULL */
    /* Residual stream of the out rows: hidden[0] is the token embedding (times
     * embd_scale), hidden[l + 1] the output of layer l (the last one before the final
     * norm). */
    float *hidden;            /* (n_layer + 1, n_out, dim), or NULL */
    /* Residual stream of the out rows after the last layer (before the final norm):
     * hidden's last slot without the others. */
    float *hidden_last;       /* (n_out, dim), or NULL */
    /* Attention probabilities of every batch token over the sequence's entries after
     * the append (n_kv = entries before + n_tokens, in chunk order then entry order);
     * entries a token may not see are 0. */
    float *attn;              /* (n_layer, n_head, n_tokens, n_kv), or NULL */
    /* Attention each entry of the sequence receives (same order as attn), summed over
     * layers, heads and the batch's tokens; added to (not overwritten), so the caller
     * can accumulate it over calls. Cheap enough to keep on for every call. */
    float *attn_received;     /* (n_kv after the append), or NULL */

    /* Called before layer l reads any K/V of the sequence's existing chunks: lets their
     * data arrive layer by layer (read from disk by another thread) while earlier layers
     * compute. The chunks' precision, ids and positions must be set before the forward.
     * Called once per layer and forward, in layer order, before the batch's new entries of
     * that layer are written (they may go into the last existing chunk). A partial
     * compressed last chunk is converted to f16 before the first layer (new entries go
     * there), so its data must be complete when the forward starts. */
    void (*layer_ready)(void *arg, int layer);
    void *layer_ready_arg;

    /* The model these rows run as, NULL: the runner's. Another view of the runner's
     * model's base (model_with_loras), or that base: one model_forward_batch then stacks
     * the rows of a base and of its adapter models, every weight matrix read once for
     * all of them and each row's delta its own model's adapters' (vLLM's multi-LoRA
     * batching). The runner must have room for its adapters' rank
     * (model_runner_reserve_lora). */
    const model *model;
} model_batch;

/*
 * Evaluates the batch against seq and appends its K/V (with ids and positions) to seq.
 * Batches longer than the runner's max_batch are evaluated in consecutive sub-batches,
 * which is exact when positions within the batch do not decrease (otherwise it is
 * refused). Fails without changing seq on bad ids, positions or out rows, when the
 * sequence would exceed max_kv entries, or when its pool refuses the chunks needed.
 * 0, -1 + err, or MODEL_ABORTED (seq unchanged) while model_runner_set_abort's flag is
 * raised.
 */
int model_forward(model_runner *r, kv_seq *seq, const model_batch *batch, char err[ERR_MAX]);

/*
 * Evaluates n_seq batches at once: batches[i] against seqs[i], each exactly as
 * model_forward would (same outputs, same K/V appended), but with the rows of all of
 * them stacked so that every weight matrix is read once for all rows: a step of the
 * daemon's scheduler advancing many contexts (decode rows and prefill slices) together.
 * Attention stays per sequence, over its own chunks and positions.
 *
 * The batches' n_tokens must add up to at most the runner's max_batch (n_seq == 1 is
 * model_forward itself: one batch may be longer). Each batch follows model_forward's
 * rules; attn and layer_ready are accepted only when n_seq == 1, and no sequence may
 * appear twice. Everything is checked, non-resident chunks faulted in and the KV space
 * of every sequence reserved before anything is computed; on failure no sequence has
 * gained entries.
 *
 * Numerics: a sequence's outputs are bit-equal to evaluating it alone when the stacked
 * rows number at most 16 (the matrix products then use per-row dot kernels) and it takes
 * the same attention path (fewer than 16 rows of its own: per-row attention; at least
 * 16: sgemm, as alone). One exception: from QUANT_PACKED_MIN_ACT (3) stacked rows on,
 * Q8_0 products on CPUs with AVX-512 VNNI use the packed-activation kernel, which adds a
 * dot product's blocks in another order than the lone row's SIMD lanes (f32 rounding,
 * ~1e-7 of the logits' scale); not on repacked weights (model_repack_weights), whose
 * products are the scalar kernel's at any row count, so outputs are bit-equal there with
 * more stacked rows too (tests/engine/test_model_batch.c: 28 rows of decode and prefill
 * mixed). Otherwise, with more stacked rows, the products
 * go through sgemm on f32 activations instead: for float weights outputs then differ
 * from solo by rounding (~1e-5 of their scale), for quantized weights by the 8-bit
 * quantization of the activations that the lone rows' dot kernels apply (up to ~2% of
 * the logits' scale;
 * tests/engine/test_model_batch.c). attn_received is summed per thread and added in
 * whatever order threads finish, as in model_forward, so it is bit-equal only with one
 * thread.
 */
int model_forward_batch(model_runner *r, int n_seq, kv_seq *const *seqs,
                        const model_batch *batches, char err[ERR_MAX]);

#endif
