/*
 * modelgen.h — writes a random-weight model GGUF of any shape (what tools/mkmodel and
 * the model tests use). Weights are deterministic in the seed: uniform with standard
 * deviation 1/sqrt(fan-in), so activations keep unit scale through every layer; norm
 * weights are near 1, biases small. 2-D tensors use the requested type; 1-D tensors
 * (norms, biases) stay F32 as llama.cpp writes them.
 */
#ifndef LLMS_MODELGEN_H
#define LLMS_MODELGEN_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/err.h"
#include "engine/gguf/gguf.h"

/* llama.cpp's quantization mixes (llama-quantize's file types): a type for most matrices
 * and, for some, another (modelgen_mix_type). */
typedef enum modelgen_mix {
    MODELGEN_MIX_NONE, /* every matrix in the one type (llama-quantize --pure) */
    MODELGEN_MIX_Q2_K,
    MODELGEN_MIX_Q3_K_S,
    MODELGEN_MIX_Q3_K_M,
    MODELGEN_MIX_Q3_K_L,
    MODELGEN_MIX_Q4_K_M,
    MODELGEN_MIX_Q5_K_M,
    MODELGEN_MIX_IQ4_NL,
    MODELGEN_MIX_IQ4_XS,
} modelgen_mix;

/*
 * The type llama-quantize gives the matrix called name (GGUF's tensor names), of rows of
 * cols elements, under mix with type its file type's default (Q3_K for the Q3_K mixes):
 * its rules for the output (token_embd where has_output is false), attn_v, attn_output,
 * attn_qkv and ffn_down by layer (the layer in the name, of n_layer) and, for the attn_v
 * of Q2_K and the IQ4 mixes, by n_gqa (attention heads per KV head), as without an
 * importance matrix; then its fallbacks for rows that are not whole blocks of that type
 * (Q2_K/Q3_K/IQ4_XS -> IQ4_NL, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, F16 where the
 * fallback's blocks do not fit either). MODELGEN_MIX_NONE: type.
 */
uint32_t modelgen_mix_type(modelgen_mix mix, uint32_t type, const char *name, int64_t cols,
                           int n_layer, int n_gqa, bool has_output);

typedef struct modelgen_params {
    /* "llama", "qwen2", "qwen3", "phi3" (fused attn_qkv and gate/up ffn_up, as
     * convert_hf_to_gguf.py writes Phi-3 and Phi-4-mini), "granite" (llama with Granite
     * 3's embedding, residual, attention and logit scales), "qwen2moe", "qwen3moe",
     * "olmoe", "gemma", "gemma2", "gemma3", "olmo2" (OLMo 2: post_attention_norm and
     * post_ffw_norm, no attn_norm or ffn_norm, attn_q_norm / attn_k_norm of all of q and
     * k, OLMo 2's RoPE base 500000), "granitemoe" (granite's scales and experts of n_ff
     * in Mixtral's layout; with n_ff_shexp, Granite MoE Shared's ungated shared expert as
     * later llama.cpp converts it), "smollm3" (llama's tensors; its NoPE layers are no
     * tensor's or key's: llama.cpp and llmsd know them by the architecture), "exaone"
     * (llama's tensors, computed with NEOX RoPE: its converter does not permute q and k),
     * "stablelm" (StableLM 2 1.6B's layout: LayerNorms with biases, q/k/v biases, a
     * quarter of each head rotated unless rope_dims says otherwise), "glm4" (GLM-4-0414's
     * layout: q/k/v biases, post_attention_norm and post_ffw_norm besides attn_norm and
     * ffn_norm, gate and up in one ffn_up of 2 n_ff rows as phi3's, half of each head
     * rotated unless rope_dims says otherwise), "chatglm" (GLM-4-9B-chat's layout: glm4's
     * without the post norms, q, k, v in one attn_qkv with its bias), "starcoder2"
     * (StarCoder2's layout: LayerNorms with biases, q/k/v/o biases, ffn_up and ffn_down
     * with biases and no ffn_gate), "phi2" (Phi-2 as the converter writes today's HF
     * checkpoint: starcoder2's tensors without ffn_norm, output.weight (tie_output is
     * ignored) and output.bias, 0.4 of each head rotated unless rope_dims says otherwise),
     * "seed_oss" (Seed-OSS: qwen2's tensors with the feed-forward's norm named
     * post_attention_norm), "hunyuan-dense" (qwen3's tensors, rope.scaling.alpha 1000),
     * "ernie4_5-moe" (ERNIE-4.5-21B-A3B's layout: llama's tensors, n_dense_lead dense
     * layers of n_ff, then experts (required) of n_ff_exp with interleave_moe_layer_step 1,
     * with n_ff_shexp a shared expert in ffn_*_shexp, with exp_probs_b the selection
     * bias), "glm4moe" (GLM-4.5's layout: qwen2's tensors and biases, half of each head
     * rotated unless rope_dims says otherwise, post_attention_norm as the feed-forward's
     * norm, n_dense_lead dense layers of n_ff, then experts (required) of n_ff_exp with
     * exp_probs_b and n_expert_shared shared ones in one ffn_*_shexp, expert_gating,
     * expert_weights_norm and expert_weights_scale as deepseek2's, and nextn_layers
     * multi-token-prediction layers after the model's),
     * "gpt-oss" (below),
     * "bert" or "nomic-bert" (the encoders and olmoe: n_head_kv must equal n_head). The
     * Gemma family as llama.cpp's converter writes it: norm weights near 1 (the
     * converter's +1 already added), no output.weight (llama.cpp reads the token
     * embedding as the output and refuses a file with one, so tie_output is implied),
     * post_attention_norm / post_ffw_norm (gemma2, gemma3), per-head attn_q_norm /
     * attn_k_norm (gemma3), and the keys below. head_dim 0 gives dim / n_head, where the
     * query scale of gemma2/gemma3 is the same under both of llama.cpp's rules (model.h,
     * attn_scale). The 2025-02 llama.cpp runs gemma2 files of 26, 42 or 46 layers only
     * (it aborts on another depth), and no gemma3. "gpt-oss" as llama.cpp's converter
     * writes gpt-oss-20b/120b: experts (required) with biases (router's, and the 2-D
     * per-expert ones of gate, up and down, in F32), q/k/v/o biases, attn_sinks (one per
     * head), attn_norm and post_attention_norm (the feed-forward's), output.weight,
     * rope.freq_base 150000 and YaRN (factor 32 over an original context of 4096, betas 32
     * and 1), expert_feed_forward_length and attention.sliding_window (below, 128 when 0;
     * llama.cpp slides the even layers). "mistral3" as it writes Ministral 3: llama's
     * tensors (q and k permuted: interleaved RoPE), rope.freq_base 1e6, YaRN over an
     * original context of rope_orig_ctx (0: n_ctx / 16) to n_ctx with betas 32 and 1 and
     * yarn_log_multiplier 1, attention.temperature_scale 0.1. "exaone4" as it writes
     * EXAONE 4.0: OLMo 2's post_attention_norm and post_ffw_norm and no input norms,
     * qwen3's per-head attn_q_norm / attn_k_norm, rope.freq_base 1e6; with
     * sliding_window, the 32B's hybrid attention: attention.sliding_window and
     * attention.sliding_window_pattern, a boolean per layer, every fourth false.
     * "command-r" and "cohere2" as llama.cpp's converter writes Cohere's models: attn_norm
     * alone (a LayerNorm without bias, no ffn_norm), no output.weight (tied),
     * attention.layer_norm_epsilon, logit_scale 2; command-r with 64 layers or more has
     * Command-R+'s per-head attn_q_norm / attn_k_norm (head_dim x heads, F32); cohere2 has
     * attention.sliding_window (below, 4096 when 0, Command R7B's). "gemma-embedding" as
     * it writes EmbeddingGemma: gemma3's tensors and keys (norm weights near 1, no
     * output.weight, rope.freq_base 1e6 and no rope.freq_base_swa), pooling_type (1 mean, 2
     * cls or 3 last), attention.sliding_window (below, 512 when 0), no
     * sliding_window_pattern (llama.cpp's 6), and with n_dense the sentence-transformers
     * dense layers dense_2.weight (dim -> n_dense) and dense_3.weight (n_dense -> dim) with
     * their dense_*_feat_* keys. */
    const char *arch;
    int dim;
    int n_layer;
    int n_head;
    int n_head_kv;
    int head_dim;       /* 0: dim / n_head */
    int n_ff;
    int n_ctx;
    /* Mixture of experts (qwen2moe, qwen3moe, olmoe, granitemoe and gpt-oss need it; llama
     * with it is Mixtral):
     * n_expert experts of which each token uses n_expert_used, in llama.cpp's merged
     * tensors (ffn_gate_inp in F32, as llama-quantize keeps it; ffn_{gate,up,down}_exps
     * of ne [in, out, n_expert]). The router's weights are scaled so that its logits
     * have unit scale: tokens spread over the experts. */
    int n_expert;
    int n_expert_used;
    int n_ff_exp;       /* an expert's hidden size (qwen2moe, qwen3moe, gpt-oss; llama's,
                           olmoe's and granitemoe's are n_ff); 0: n_ff */
    int n_ff_shexp;     /* qwen2moe's shared expert's hidden size, 0: n_ff; granitemoe's,
                           0: none */
    uint32_t type;      /* enum qtype of the matrices, or with a mix its default */
    bool mxfp4_experts; /* ffn_{gate,up,down}_exps in MXFP4, as gpt-oss's files have them
                           (rows must be whole blocks of 32); the other matrices in type */
    /* The types of the matrices are modelgen_mix_type's (Q4_K_M is type Q4_K with
     * MODELGEN_MIX_Q4_K_M); each must be computable. */
    modelgen_mix mix;
    uint64_t seed;
    bool tie_output;    /* write no output.weight (the output reuses token_embd) */
    int rope_dims;      /* rope.dimension_count, even, <= head_dim (0: head_dim) */
    /* phi3: > 0 writes LongRoPE as Phi-3-mini-128k has it: random rope_factors_long and
     * rope_factors_short (rope_dims/2 each), rope.scaling.original_context_length and
     * rope.scaling.attn_factor as convert_hf_to_gguf.py computes it (from n_ctx / this);
     * 0: no factors, the original context n_ctx. mistral3: YaRN's original context. */
    int rope_orig_ctx;
    /* {arch}.pooling_type, llama.cpp's numbers. Encoders: 1 mean, 2 cls, bert also 4 rank,
     * which writes the cross-encoder head (cls dim x dim, cls.output 1 x dim). Decoders
     * (an embedding model such as Qwen3-Embedding): written as given when not 0, unchecked,
     * so that a test can write a value llmsd must refuse. */
    int pooling_type;
    /* gemma-embedding: the width between its two dense layers (EmbeddingGemma's 3072); 0
     * writes none. */
    int n_dense;
    /* {arch}.attention.sliding_window. phi3: 0 writes 0 (none, as Phi-4's files);
     * gemma2 / gemma3 / gpt-oss / cohere2: 0 writes the family's (4096 for gemma2, 1024
     * for gemma3, as Gemma 2 and Gemma 3 4B+ have it, 128 for gpt-oss, 4096 for cohere2);
     * exaone4: 0 writes none (the 1.2B's global attention); other architectures have
     * none. */
    int sliding_window;
    /* gemma2: {arch}.attn_logit_softcapping and final_logit_softcapping, 0: Gemma 2's 50
     * and 30. */
    float attn_softcap, final_softcap;
    /* {arch}.rope.scaling.type "linear" with this factor (gemma3's 4B+ have 8, which
     * llama.cpp applies to the global layers alone); 0: no scaling keys. */
    float rope_linear;
    /* "deepseek2" (DeepSeek-V2/V2-Lite/V3, Kimi-K2, ...) as llama.cpp's converter writes
     * it today: multi-head latent attention with attn_kv_a_mqa (kv_lora_rank latent +
     * qk_rope_dim shared rotary key), attn_kv_a_norm, the split attn_k_b (ne [qk_nope_dim,
     * kv_lora_rank, n_head]) and attn_v_b (ne [kv_lora_rank, v_head_dim, n_head]),
     * attn_q_a / attn_q_a_norm / attn_q_b or (q_lora_rank 0, V2-Lite's) attn_q;
     * head_count_kv 1, key_length kv_lora_rank + qk_rope_dim, value_length kv_lora_rank,
     * key_length_mla and value_length_mla the decompressed heads' (head_dim and n_head_kv
     * are not used); n_dense_lead dense SwiGLU layers of n_ff, then experts (required,
     * n_ff_exp each) with n_expert_shared shared ones in one ffn_*_shexp of
     * n_ff_exp * n_expert_shared (at least 1). Matrices whose rows are not whole blocks of
     * the type take modelgen_mix_type's fallbacks (attn_k_b's rows are qk_nope_dim long).
     * rope.freq_base 10000, RMS epsilon 1e-6. The fields below are deepseek2's. */
    int q_lora_rank;     /* attention.q_lora_rank; 0: attn_q and no key (V2-Lite) */
    int kv_lora_rank;    /* attention.kv_lora_rank */
    int qk_nope_dim;     /* a head's query/key dimensions without RoPE */
    int qk_rope_dim;     /* its rotated ones, rope.dimension_count (even) */
    int v_head_dim;      /* a head's value dimensions */
    int n_expert_shared; /* expert_shared_count */
    int n_dense_lead;    /* leading_dense_block_count: layers 0..n-1 dense, 0..n_layer
                            (ernie4_5-moe's too, as its exp_probs_b) */
    int expert_gating;   /* expert_gating_func: 1 softmax, 2 sigmoid; 0 writes none
                            (llama.cpp then takes softmax, as for old V2 files) */
    bool expert_weights_norm;   /* expert_weights_norm true (HF's norm_topk_prob); false
                                   writes no key */
    float expert_weights_scale; /* expert_weights_scale (routed_scaling_factor); 0: none */
    /* expert_group_count and expert_group_used_count (n_group, topk_group); 0: no keys.
     * Otherwise groups > 1 dividing n_expert into groups of 2 or more, 0 < used < groups. */
    int n_expert_groups, n_expert_groups_used;
    bool exp_probs_b;    /* blk.N.exp_probs_b.bias (F32, n_expert), DeepSeek-V3's
                            e_score_correction_bias, of the order of the router's
                            probabilities so that it moves selections */
    /* DeepSeek-V2's YaRN: rope.scaling.type "yarn", rope.scaling.factor yarn_factor,
     * original_context_length rope_orig_ctx (0: n_ctx / yarn_factor), yarn_beta_fast 32,
     * yarn_beta_slow 1; and with yarn_mscale_all_dim, rope.scaling.yarn_log_multiplier
     * 0.1 * it, as the converter writes it. yarn_factor 0: no scaling keys;
     * yarn_mscale_all_dim 0: no yarn_log_multiplier. */
    float yarn_factor, yarn_mscale_all_dim;
    /* glm4moe: nextn_predict_layers, layers after the model's with their nextn tensors
     * (eh_proj, enorm, hnorm, shared_head_norm), which no forward runs; 0: none */
    int nextn_layers;
    bool glm_qk_norm;    /* glm4moe: GLM-4.5 355B's per-head attn_q_norm / attn_k_norm */
    /* Vocabulary: all tokenizer.* metadata is copied from vocab and n_vocab is its token
     * count. With vocab NULL a synthetic vocabulary of n_vocab tokens is written
     * ("<unk>", "<s>", "</s>", then "tok3", "tok4", ...; BOS 1, EOS 2). */
    const gguf_file *vocab;
    int n_vocab;
    int n_threads;      /* threads generating and quantizing rows; <= 0: online CPUs */
    /* Called after each tensor is generated (done of total), for a large model takes
     * minutes; NULL: not called. */
    void (*progress)(int done, int total, void *user);
    void *progress_user;
} modelgen_params;

/* Writes the model to path. 0, or -1 with err. */
int modelgen_write(const modelgen_params *p, const char *path, char err[ERR_MAX]);

/* The base matrices a LoRA adapter adapts (modelgen_lora_params.targets). */
enum modelgen_lora_target {
    MODELGEN_LORA_Q = 1,
    MODELGEN_LORA_K = 2,
    MODELGEN_LORA_V = 4,
    MODELGEN_LORA_O = 8,
    MODELGEN_LORA_GATE = 16,
    MODELGEN_LORA_UP = 32,
    MODELGEN_LORA_DOWN = 64,
    MODELGEN_LORA_OUTPUT = 128,     /* output.weight (a base that ties it has none) */
    MODELGEN_LORA_TOKEN_EMBD = 256, /* token_embd.weight */
};
/* PEFT's "all-linear" of a decoder layer: attention and feed-forward. */
#define MODELGEN_LORA_LAYERS 127

typedef struct modelgen_lora_params {
    const gguf_file *base; /* the model it adapts: a llama, qwen2, qwen3, qwen2moe or
                              qwen3moe decoder (with experts: no feed-forward targets) */
    int rank;
    float alpha;           /* adapter.lora.alpha (0: the scale is the user's alone) */
    uint32_t type;         /* of lora_a and lora_b: computable, rank and the adapted
                              matrices' widths whole blocks of it */
    unsigned targets;      /* enum modelgen_lora_target bits: those the base has */
    uint64_t seed;
    int n_threads;         /* <= 0: online CPUs */
} modelgen_lora_params;

/*
 * Writes a random LoRA adapter of base in llama.cpp's format (convert_lora_to_gguf.py's):
 * general.type "adapter", general.architecture the base's, adapter.type "lora",
 * adapter.lora.alpha, and for each adapted matrix W of ne [in, out] the tensors
 * "<W>.lora_a" of ne [in, rank] and "<W>.lora_b" of ne [rank, out], so that the adapted
 * product is W x + s B (A x) with s = scale * alpha / rank (scale * 1 when alpha is 0);
 * the token embedding's pair is flipped, as llama.cpp reads it: lora_a [rank, n_vocab]
 * (a row per token) and lora_b [rank, dim]. A has unit-scale products; B is scaled so that
 * at scale 1 each adapted product moves by about a fifth of modelgen's own weights'
 * scale: the adapted model answers differently and still works. Deterministic in the
 * seed. 0, or -1 with err.
 */
int modelgen_write_lora(const modelgen_lora_params *p, const char *path, char err[ERR_MAX]);

/*
 * Writes in's model to out with every matrix whose rows are whole blocks of type
 * converted to it (dequantized, quantized again), or with a mix to the type
 * modelgen_mix_type gives it, norms, biases and metadata copied, as llama.cpp's
 * llama-quantize does; with n_lora adapters (files in modelgen_write_lora's
 * format, lora[i] at scale scales[i]) merged into the matrices they adapt first, as
 * llama-export-lora does: W + sum of s B A computed in double from the dequantized
 * weights, then rounded to type. An adapter of another architecture, with a pair
 * missing, a shape that does not fit its matrix or a tensor of no matrix of in's is an
 * error. Rows are converted on n_threads threads (<= 0: online CPUs); the bytes written do
 * not depend on how many. 0, or -1 with err.
 */
int modelgen_convert(const char *in, const char *out, uint32_t type, modelgen_mix mix,
                     int n_lora, const char *const *lora, const float *scales, int n_threads,
                     char err[ERR_MAX]);

#endif
