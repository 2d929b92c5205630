/*
 * ref_forward.c — the textbook transformer, loops and doubles, no tricks. Mixtures of
 * experts as Hugging Face transformers' modeling code computes them (Qwen2MoeSparseMoeBlock,
 * Qwen3MoeSparseMoeBlock, MixtralSparseMoeBlock, OlmoeSparseMoeBlock): routing_weights =
 * softmax(router(x)), the top-k, divided by their sum where norm_topk_prob (Qwen3-MoE,
 * Mixtral; not Qwen2-MoE, OLMoE), the sum of routing_weight * expert(x), plus Qwen2-MoE's
 * sigmoid(shared_expert_gate(x)) * shared_expert(x). GraniteMoE (GraniteMoeMoE,
 * GraniteMoeTopKGating) takes the top-k router logits and a softmax over those alone, with
 * granite's multipliers around it; GraniteMoeShared adds its shared_mlp(x), ungated.
 * ERNIE 4.5's (Ernie4_5_MoeSparseMoeBlock) chooses by the probabilities plus its
 * e_score_correction_bias, weights the chosen by their probabilities renormalized, adds
 * its shared experts ungated, after moe_layer_start_index dense layers; GLM-4.5's
 * (Glm4MoeMoE) the same with the sigmoid of the router's logits, its weights normalized
 * where norm_topk_prob and times routed_scaling_factor.
 * OLMoE's attention normalizes all of q and all of k (OlmoeAttention's q_norm, k_norm)
 * before RoPE.
 *
 * The Gemma family follows HF transformers' modeling_gemma / modeling_gemma2 /
 * modeling_gemma3 (Gemma3ForCausalLM), with the GGUF's norm weights (the converter's +1
 * added): hidden = embedding * sqrt(hidden_size); per layer
 *     h = x + post_attention_layernorm(attn(input_layernorm(x)))
 *     x = h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)))
 * (gemma: no post norms), mlp = down(gelu_tanh(gate) * up), attention scores times
 * query_pre_attn_scalar^-0.5 (head_dim, but dim / n_head for the 27B models: 46 layers
 * gemma2, 62 gemma3), then (gemma2) tanh soft-capping, the causal mask and, on sliding
 * layers (gemma2: even layers; gemma3: layer i with (i + 1) % 6 != 0), the window
 * q_pos - W < k_pos; gemma3 normalizes q and k per head and rotates sliding layers with
 * rope_local_base_freq 10000 and global ones with rope_theta and its linear scaling;
 * gemma2's logits are soft-capped at the end.
 *
 * OLMo 2 follows modeling_olmo2 (Olmo2DecoderLayer, Olmo2Attention): no norm of a
 * sublayer's input,
 *     h = x + post_attention_layernorm(attn(x))
 *     x = h + post_feedforward_layernorm(mlp(h))
 * with q_norm over all of q_proj(x) and k_norm over all of k_proj(x), then rotate_half
 * RoPE.
 *
 * SmolLM3 (modeling_smollm3) is llama's layer whose attention rotates q and k only where
 * config.no_rope_layers[layer_idx] is 1: by default (no_rope_layer_interval 4) every
 * layer but those with (layer_idx + 1) % 4 == 0.
 *
 * StableLM (modeling_stablelm: StableLmDecoderLayer without use_parallel_residual or
 * qk_layernorm) is llama's layer with nn.LayerNorm (with bias, eps layer_norm_eps) for
 * every norm, q/k/v biases where use_qkv_bias, and rotate_half RoPE over the first
 * partial_rotary_factor of each head, computed here as qwen2's.
 *
 * StarCoder2 (modeling_starcoder2: Starcoder2DecoderLayer, Starcoder2Attention,
 * Starcoder2MLP) is StableLM's layer (nn.LayerNorm with bias, eps norm_epsilon) with
 * use_bias's biases on q/k/v and o_proj, rotate_half RoPE over the whole head, and an
 * ungated MLP: c_proj(gelu_pytorch_tanh(c_fc(x))), both Linear with bias (the GGUF's
 * ffn_up and ffn_down). Its sliding_window mask (4096) is not computed: the tests' prompts
 * are far shorter.
 *
 * Phi-2 (modeling_phi: PhiDecoderLayer, PhiAttention, PhiMLP, PhiForCausalLM without
 * qk_layernorm) reads one input_layernorm (nn.LayerNorm with bias) into both sublayers,
 *     x = x + dense(attn(input_layernorm(x))) + mlp(input_layernorm(x))
 * with q/k/v and dense (o_proj) biases, rotate_half RoPE over the first
 * partial_rotary_factor of each head, mlp = fc2(gelu_new(fc1 x)) (StarCoder2's, gelu's tanh
 * form), then final_layernorm and lm_head with its bias. Files converted from HF's older
 * Wqkv hold q, k and v as one attn_qkv (q's rows first) and its bias, split here.
 *
 * EXAONE (modeling_exaone: ExaoneAttention, ExaoneGatedMLP) is llama's layer with HF's
 * rotate_half RoPE on q and k as they are in the file (its converter does not permute them
 * into interleaved pairs, as it does llama's), computed here as qwen's.
 *
 * EXAONE 4.0 (modeling_exaone4: Exaone4DecoderLayer, Exaone4Attention) normalizes its
 * sublayers' outputs as OLMo 2 does, q and k per head as qwen3 does, and, where the config
 * has a sliding window, masks the layers layer_types calls "sliding_attention" (the
 * GGUF's sliding_window_pattern booleans) to it and rotates only those: the others attend
 * to everything without RoPE.
 *
 * GLM-4 follows modeling_glm4 (Glm4DecoderLayer, Glm4Attention, Glm4MLP): RMSNorms around
 * both sublayers,
 *     h = x + post_self_attn_layernorm(attn(input_layernorm(x)))
 *     x = h + post_mlp_layernorm(mlp(post_attention_layernorm(h)))
 * (the GGUF's attn_norm, post_attention_norm, ffn_norm and post_ffw_norm), q/k/v with
 * biases where attention_bias, gate_up_proj chunked into gate then up (split as phi3's),
 * and its own rotate_half, which pairs neighbours (x[2i], x[2i+1]), with cos and sin
 * repeated to match, over the first partial_rotary_factor of each head. ChatGLM
 * (THUDM's modeling_chatglm for GLM-4-9B-chat: GLMBlock with RMSNorm, SelfAttention,
 * MLP) is the same without the post norms, its query_key_value (with add_qkv_bias's
 * bias) split into q, k and v, and its rotary (pairs of neighbours over half of each
 * head, base 10000 * rope_ratio) the same.
 *
 * Cohere's command-r follows modeling_cohere (CohereDecoderLayer, CohereAttention): one
 * CohereLayerNorm (no bias, eps layer_norm_eps) whose output h both sublayers read,
 *     x = x + attn(h) + mlp(h)
 * with use_qk_norm's CohereLayerNorm of each head of q and k by that head's own weights
 * (where the file has them), Cohere's rotate_half (interleaved pairs: x[2i], x[2i+1])
 * on q and k as the file holds them, and logits = lm_head(norm(x)) * logit_scale, lm_head
 * tied to the embedding. cohere2 (modeling_cohere2) is that layer with layer_types
 * sliding for (i + 1) % sliding_window_pattern != 0 (4 by default): those layers attend
 * through sliding_window and rotate q and k, the others attend to every position and
 * rotate nothing.
 *
 * gpt-oss follows HF transformers' modeling_gpt_oss (GptOssForCausalLM) and its config:
 * per layer x += o_proj(attn(input_layernorm(x))) + o bias, x += mlp(post_attention_layernorm(x))
 * (the GGUF's attn_norm and post_attention_norm); q/k/v with biases, rotated by
 * _compute_yarn_parameters' inv_freq ("truncate": false: the ramp's ends as computed)
 * with cos and sin times 0.1 ln(factor) + 1; eager_attention_forward's sinks: each head's
 * scores, masked (causal, and the window on the even layers, layer_types beginning with
 * "sliding_attention"), joined by its sink logit, shifted by their max, softmaxed, the
 * sink's column dropped; GptOssTopKRouter: logits W x + b, the top k, softmax over those
 * k; GptOssExperts: gate and up (each + bias), gate clamped above at 7, up to [-7, 7],
 * (up + 1) * gate * sigmoid(1.702 gate), then down + bias, weighted by the router's scores.
 */
#include "tests/support/ref_forward.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/quant/quant.h"
#include "tests/support/ref_deepseek2.h"
#include "tests/support/ref_tensor.h"

#define REF_MAX_EXPERTS 1024

typedef struct ref_layer {
    double *attn_norm, *ffn_norm;     /* (dim) */
    double *attn_norm_b, *ffn_norm_b; /* (dim) StableLM's LayerNorm biases, or NULL */
    double *wq, *wk, *wv, *wo;        /* (out, in) row-major */
    double *bq, *bk, *bv;             /* or NULL */
    double *q_norm, *k_norm;          /* (head_dim), OLMoE's (q_dim) (kv_dim), or NULL */
    double *gate, *up, *down;         /* dense, or qwen2moe's shared expert */
    double *router;                   /* (n_expert, dim) or NULL */
    double *gate_exps, *up_exps;      /* (n_expert, n_ff_exp, dim) */
    double *down_exps;                /* (n_expert, dim, n_ff_exp) */
    double *shexp_gate;               /* (dim) or NULL */
    double *probs_b;                  /* (n_expert) ERNIE 4.5's e_score_correction_bias, or
                                         NULL */
    double *post_attn, *post_ffn;     /* (dim) or NULL (gemma2, gemma3) */
    /* gpt-oss, else NULL */
    double *sinks;                    /* (n_head) */
    double *bo;                       /* (dim) o_proj's bias */
    double *router_b;                 /* (n_expert) */
    double *gate_b, *up_b;            /* (n_expert, n_ff_exp) */
    double *down_b;                   /* (n_expert, dim) */
    /* StarCoder2's Starcoder2MLP biases (o_proj's is bo above), else NULL */
    double *c_fc_b;                   /* (n_ff) ffn_up.bias */
    double *c_proj_b;                 /* (dim) ffn_down.bias */
} ref_layer;

/* the architectures whose attention and feed-forward differ; a mixture of experts is its
 * dense family's */
enum { REF_LLAMA, REF_QWEN2, REF_QWEN3, REF_PHI3, REF_GRANITE, REF_GEMMA, REF_GEMMA2,
       REF_GEMMA3 };

struct ref_model {
    int arch; /* REF_* */
    int dim, n_layer, n_head, n_kv_head, head_dim, n_ff, n_vocab;
    int rotary_dim;              /* phi3: partial_rotary_factor * head_dim */
    int n_expert, n_expert_used, n_ff_exp, n_ff_shexp; /* n_expert 0: dense */
    bool norm_topk_prob;
    int n_dense_lead; /* ERNIE 4.5's, GLM-4.5's: the first n_dense_lead layers dense (n_ff) */
    /* GLM-4.5's router (Glm4MoeTopkRouter): sigmoid in place of the softmax, the chosen
     * experts' weights times expert_scale (0: 1) */
    bool sigmoid_router;
    double expert_scale;
    bool qk_norm_whole; /* OlmoeAttention, Olmo2Attention: q_norm and k_norm over the whole
                           projections */
    bool no_input_norms; /* Olmo2DecoderLayer, Exaone4DecoderLayer: attn_norm and ffn_norm
                            absent, the sublayers read the residual stream as it is */
    int no_rope_interval; /* SmolLM3: layers with (l + 1) % it == 0 have no RoPE; 0: none */
    bool glm4;          /* GLM-4, ChatGLM: gate and up in one ffn_up, RoPE in neighbouring
                           pairs */
    bool layer_norm;    /* StableLM, StarCoder2, Phi-2: nn.LayerNorm (with bias) where the
                           others have RMSNorm; Cohere: CohereLayerNorm (without) */
    bool ungated;       /* StarCoder2, Phi-2: c_proj(gelu_tanh(c_fc(x))), no gate */
    bool parallel;      /* Cohere, Phi-2: attention and the MLP both read the input norm's
                           output, and add to the same residual */
    bool sequential;    /* ref_model_sequential's: the MLP reads the norm after attention */
    double logit_scale; /* Cohere: multiplies the logits (1 for the others) */
    int *routes; /* ref_model_record_routes's, or NULL */
    double rope_base, eps;
    double *long_factor, *short_factor; /* phi3 LongRoPE (rotary_dim / 2) or NULL */
    bool use_long;
    double attention_factor;     /* LongRoPE: multiplies cos and sin */
    /* granite's multipliers (1, 1/sqrt(head_dim), 1 and 1 for the others) */
    double embedding_multiplier, attention_multiplier, residual_multiplier, logits_scaling;
    /* Gemma (and the neutral values for the others) */
    double attn_cap, final_cap; /* 0: none */
    int window, pattern;        /* 0: none; sliding layers: l % pattern < pattern - 1 */
    bool *slides;               /* (n_layer) exaone4: HF's layer_types, sliding ones true */
    double rope_factor;         /* gemma3's global layers: positions / factor */
    bool gptoss;
    bool seed_oss; /* Seed-OSS */
    bool post_attention_ffn_norm; /* Seed-OSS, GLM-4.5: the feed-forward's norm is
                                     post_attention_norm, as gpt-oss's */
    bool qk_norm_late; /* HunYuanDenseV1Attention: query/key_layernorm after the rotary */
    double *yarn_inv_freq;       /* gpt-oss, mistral3: (rotary_dim / 2) YaRN's, or NULL */
    double temp_beta;            /* mistral3: Llama 4's query scaling, 0: none */
    int temp_floor;              /* its positions per step */
    bool kv_f16;
    double *embd, *out, *out_norm;
    double *out_norm_b; /* (dim) StableLM's, or NULL */
    double *out_b;      /* (n_vocab) Phi-2's lm_head bias, or NULL */
    ref_layer *layers;
    ref_ds2 *ds2;       /* deepseek2: its own forward (ref_deepseek2.c), or NULL */
};

static int ref_u32(const gguf_file *g, const char *arch, const char *key, int dflt)
{
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    uint32_t v;
    return gguf_get_u32(g, k, &v) ? (int)v : dflt;
}

static double ref_f32(const gguf_file *g, const char *arch, const char *key, double dflt)
{
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    float v;
    return gguf_get_f32(g, k, &v) ? v : dflt;
}

/* Phi3Attention's qkv_proj output is q, k, v in that order; Phi3MLP's gate_up_proj is
 * chunked into gate, then up: copied apart into the layer's own matrices. */
static void ref_split_phi3(const ref_model *m, ref_layer *L, double *qkv, double *gate_up)
{
    size_t d = (size_t)m->dim, qd = (size_t)m->n_head * m->head_dim,
           kvd = (size_t)m->n_kv_head * m->head_dim, ff = (size_t)m->n_ff;
    if (qkv) {
        L->wq = malloc(qd * d * sizeof(double));
        L->wk = malloc(kvd * d * sizeof(double));
        L->wv = malloc(kvd * d * sizeof(double));
        memcpy(L->wq, qkv, qd * d * sizeof(double));
        memcpy(L->wk, qkv + qd * d, kvd * d * sizeof(double));
        memcpy(L->wv, qkv + (qd + kvd) * d, kvd * d * sizeof(double));
    }
    if (gate_up) {
        L->gate = malloc(ff * d * sizeof(double));
        L->up = malloc(ff * d * sizeof(double));
        memcpy(L->gate, gate_up, ff * d * sizeof(double));
        memcpy(L->up, gate_up + ff * d, ff * d * sizeof(double));
    }
    free(qkv);
    free(gate_up);
}

/* Phi-2's and ChatGLM's attn_qkv.bias (q's, then k's, then v's), copied apart; NULL
 * frees nothing. */
static void ref_split_qkv_bias(const ref_model *m, ref_layer *L, double *b)
{
    size_t qd = (size_t)m->n_head * m->head_dim, kvd = (size_t)m->n_kv_head * m->head_dim;
    if (!b)
        return;
    L->bq = malloc(qd * sizeof(double));
    L->bk = malloc(kvd * sizeof(double));
    L->bv = malloc(kvd * sizeof(double));
    memcpy(L->bq, b, qd * sizeof(double));
    memcpy(L->bk, b + qd, kvd * sizeof(double));
    memcpy(L->bv, b + qd + kvd, kvd * sizeof(double));
    free(b);
}

/* GLM's fused tensors, split as phi3's: ChatGLM's query_key_value (q, k, v rows) and its
 * bias (NULL: GLM-4-0414's separate q, k, v), the gate_up_proj of both. */
static void ref_split_glm(const ref_model *m, ref_layer *L, double *qkv, double *bias,
                          double *gate_up)
{
    ref_split_phi3(m, L, qkv, gate_up);
    ref_split_qkv_bias(m, L, bias);
}

/* YaRN's inv_freq and attention factor from the GGUF's keys, as HF's
 * _compute_yarn_parameters computes them: the ramp's ends floored and ceiled where
 * truncate (its default; gpt-oss's config says false), the attention factor
 * get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) with mscale 1 and
 * mscale_all_dim the file's yarn_log_multiplier where it has one (mistral3), else
 * get_mscale(factor) = 0.1 ln(factor) + 1. -1 when the file has no YaRN. */
static int ref_yarn_load(const gguf_file *g, const char *arch, ref_model *m, bool truncate)
{
    char k[128];
    gguf_str st;
    snprintf(k, sizeof k, "%s.rope.scaling.type", arch);
    if (!gguf_get_str(g, k, &st) || !gguf_str_eq(st, "yarn"))
        return -1;
    double factor = ref_f32(g, arch, "rope.scaling.factor", 1.0);
    double orig = ref_u32(g, arch, "rope.scaling.original_context_length", 0);
    double beta_fast = ref_f32(g, arch, "rope.scaling.yarn_beta_fast", 32.0);
    double beta_slow = ref_f32(g, arch, "rope.scaling.yarn_beta_slow", 1.0);
    double mscale_all_dim = ref_f32(g, arch, "rope.scaling.yarn_log_multiplier", 0.0);
    int dim = m->rotary_dim;
    double base = m->rope_base;
    /* find_correction_dim: the dimension whose wavelength fits orig num_rotations times */
    double low = dim * log(orig / (beta_fast * 2 * M_PI)) / (2 * log(base));
    double high = dim * log(orig / (beta_slow * 2 * M_PI)) / (2 * log(base));
    if (truncate)
        low = floor(low), high = ceil(high);
    low = low > 0 ? low : 0;
    high = high < dim - 1 ? high : dim - 1;
    if (high == low)
        high += 0.001;
    m->yarn_inv_freq = malloc((size_t)(dim / 2) * sizeof(double));
    for (int i = 0; i < dim / 2; i++) {
        double pos_freq = pow(base, 2.0 * i / dim);
        double ramp = (i - low) / (high - low);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        double extrapolation = 1 - ramp;
        m->yarn_inv_freq[i] = 1.0 / (factor * pos_freq) * (1 - extrapolation) +
                              1.0 / pos_freq * extrapolation;
    }
    double mscale = factor <= 1 ? 1.0 : 0.1 * log(factor) + 1.0;
    double mscale_all = factor <= 1 ? 1.0 : 0.1 * mscale_all_dim * log(factor) + 1.0;
    m->attention_factor = mscale_all_dim != 0 ? mscale / mscale_all : mscale;
    return 0;
}

/* gpt-oss's config from the GGUF: the window on the even layers (HF's layer_types alternate
 * from "sliding_attention"), and YaRN with truncate false. -1 when the file lacks them. */
static int ref_gptoss_load(const gguf_file *g, const char *arch, ref_model *m)
{
    m->window = ref_u32(g, arch, "attention.sliding_window", 0);
    m->pattern = 2;
    if (m->window <= 0)
        return -1;
    return ref_yarn_load(g, arch, m, false);
}

/* Ministral 3 (modeling_ministral3): Mistral's layer, YaRN (truncated ramp), and
 * Ministral3Attention's query scaling after RoPE, Llama 4's
 * 1 + llama_4_scaling_beta * log(1 + floor(position / original_max_position_embeddings)).
 * -1 when the file lacks YaRN. */
static int ref_mistral3_load(const gguf_file *g, const char *arch, ref_model *m)
{
    m->temp_beta = ref_f32(g, arch, "attention.temperature_scale", 0.0);
    m->temp_floor = ref_u32(g, arch, "rope.scaling.original_context_length", 0);
    if (m->temp_beta != 0 && m->temp_floor <= 0)
        return -1;
    return ref_yarn_load(g, arch, m, true);
}

ref_model *ref_model_load(const gguf_file *g)
{
    gguf_str a;
    if (!gguf_get_str(g, "general.architecture", &a))
        return NULL;
    if (gguf_str_eq(a, "deepseek2")) {
        ref_model *m = calloc(1, sizeof *m);
        if (m && !(m->ds2 = ref_ds2_load(g))) {
            free(m);
            return NULL;
        }
        return m;
    }
    static const char *const names[] = {"llama",  "qwen2",    "qwen3",    "phi3",
                                        "granite", "gemma",   "gemma2",   "gemma3",
                                        "qwen2moe", "qwen3moe", "olmoe",  "olmo2",
                                        "granitemoe", "smollm3", "exaone", "stablelm",
                                        "gpt-oss", "mistral3", "exaone4", "glm4", "chatglm",
                                        "command-r", "cohere2", "starcoder2", "phi2",
                                        "seed_oss", "hunyuan-dense", "ernie4_5-moe",
                                        "glm4moe"};
    int ai = -1;
    for (int i = 0; i < (int)(sizeof names / sizeof *names); i++)
        if (gguf_str_eq(a, names[i]))
            ai = i;
    if (ai < 0)
        return NULL;
    ref_model *m = calloc(1, sizeof *m);
    const char *arch = names[ai];
    /* the mixtures of experts compute their attention as their dense family does; OLMo's,
     * EXAONE's and StableLM's RoPE is rotate_half's, their feed-forward SwiGLU, as qwen's;
     * gpt-oss's attention is qwen2's (biases, halves) with its own parts (ref_gptoss_*) */
    bool qwen2moe = !strcmp(arch, "qwen2moe"), olmoe = !strcmp(arch, "olmoe");
    bool granitemoe = !strcmp(arch, "granitemoe");
    bool cohere2 = !strcmp(arch, "cohere2"), cohere = cohere2 || !strcmp(arch, "command-r");
    m->gptoss = !strcmp(arch, "gpt-oss");
    /* llama's SwiGLU and attention, with their own parts */
    m->glm4 = !strcmp(arch, "glm4") || !strcmp(arch, "chatglm");
    bool ernie = !strcmp(arch, "ernie4_5-moe");
    bool llama_layer =
        !strcmp(arch, "smollm3") || !strcmp(arch, "mistral3") || m->glm4 || cohere || ernie;
    /* StarCoder2's attention is qwen2's too (biases, halves), its norms StableLM's */
    bool phi2 = !strcmp(arch, "phi2");
    m->ungated = !strcmp(arch, "starcoder2") || phi2;
    /* Seed-OSS's layer is qwen2's (biases, halves), its feed-forward norm gpt-oss's name */
    m->seed_oss = !strcmp(arch, "seed_oss");
    /* GLM-4.5's layer is qwen2's (biases, halves over partial_rotary_factor), its
     * feed-forward norm named as Seed-OSS's */
    bool glm4moe = !strcmp(arch, "glm4moe");
    m->post_attention_ffn_norm = m->seed_oss || glm4moe;
    m->arch = ai <= REF_GEMMA3                                     ? ai
              : granitemoe                                         ? REF_GRANITE
              : llama_layer                                        ? REF_LLAMA
              : qwen2moe || m->gptoss || !strcmp(arch, "stablelm") ? REF_QWEN2
              : m->post_attention_ffn_norm                         ? REF_QWEN2
              : m->ungated                                         ? REF_QWEN2
                                                                   : REF_QWEN3;
    bool exaone4 = !strcmp(arch, "exaone4");
    m->no_input_norms = !strcmp(arch, "olmo2") || exaone4;
    /* SmolLM3Config's no_rope_layers default: use_rope = (layer_idx + 1) % 4 != 0 */
    m->no_rope_interval = !strcmp(arch, "smollm3") ? 4 : 0;
    m->layer_norm = !strcmp(arch, "stablelm") || cohere || m->ungated;
    /* Hunyuan's layer is qwen3's, its q/k norms after the rotary; HunYuanDenseV1's
     * rotary base rope_theta * alpha^(d / (d - 2)) */
    m->qk_norm_late = !strcmp(arch, "hunyuan-dense");
    m->parallel = cohere || phi2;
    m->qk_norm_whole = olmoe || !strcmp(arch, "olmo2");
    m->dim = ref_u32(g, arch, "embedding_length", 0);
    m->n_layer = ref_u32(g, arch, "block_count", 0);
    m->n_head = ref_u32(g, arch, "attention.head_count", 0);
    m->n_kv_head = ref_u32(g, arch, "attention.head_count_kv", m->n_head);
    m->head_dim = ref_u32(g, arch, "attention.key_length", m->dim / m->n_head);
    m->n_ff = ref_u32(g, arch, "feed_forward_length", 0);
    m->n_expert = ref_u32(g, arch, "expert_count", 0);
    m->n_expert_used = ref_u32(g, arch, "expert_used_count", 0);
    m->n_ff_exp = ref_u32(g, arch, "expert_feed_forward_length", m->n_ff);
    m->n_ff_shexp = qwen2moe ? ref_u32(g, arch, "expert_shared_feed_forward_length", m->n_ff)
                    : granitemoe || ernie
                        ? ref_u32(g, arch, "expert_shared_feed_forward_length", 0)
                        : 0;
    /* Ernie4_5_MoeModel: moe_layer_start_index's dense layers; Glm4MoeModel: first_k_dense_replace's,
     * its shared experts (n_shared_experts * moe_intermediate_size), its router; its
     * num_nextn_predict_layers after the model's (block_count counts them) are not run */
    m->n_dense_lead = ernie || glm4moe ? ref_u32(g, arch, "leading_dense_block_count", 0) : 0;
    if (glm4moe) {
        m->n_ff_shexp = m->n_ff_exp * ref_u32(g, arch, "expert_shared_count", 0);
        m->sigmoid_router = ref_u32(g, arch, "expert_gating_func", 2) != 1;
        m->expert_scale = ref_f32(g, arch, "expert_weights_scale", 0.0);
        bool norm = false;
        char key[96];
        snprintf(key, sizeof key, "%s.expert_weights_norm", arch);
        m->norm_topk_prob = gguf_get_bool(g, key, &norm) && norm;
        m->n_layer -= ref_u32(g, arch, "nextn_predict_layers", 0);
    }
    m->norm_topk_prob = !qwen2moe && !olmoe;
    if (m->n_expert > REF_MAX_EXPERTS) {
        free(m);
        return NULL;
    }
    m->rope_base = ref_f32(g, arch, "rope.freq_base", 10000.0);
    double alpha = m->qk_norm_late ? ref_f32(g, arch, "rope.scaling.alpha", 0.0) : 0.0;
    if (alpha > 0)
        m->rope_base *= pow(alpha, (double)m->head_dim / (m->head_dim - 2));
    m->eps = m->layer_norm ? ref_f32(g, arch, "attention.layer_norm_epsilon", 1e-5)
                           : ref_f32(g, arch, "attention.layer_norm_rms_epsilon",
                                     m->arch ? 1e-6 : 1e-5);
    m->rotary_dim = ref_u32(g, arch, "rope.dimension_count", m->head_dim);
    bool granite = m->arch == REF_GRANITE;
    m->embedding_multiplier = granite ? ref_f32(g, arch, "embedding_scale", 0) : 1.0;
    m->attention_multiplier = granite ? ref_f32(g, arch, "attention.scale", 0)
                                      : 1.0 / sqrt((double)m->head_dim);
    m->residual_multiplier = granite ? ref_f32(g, arch, "residual_scale", 0) : 1.0;
    m->logits_scaling = granite ? ref_f32(g, arch, "logit_scale", 0) : 1.0;
    m->logit_scale = cohere ? ref_f32(g, arch, "logit_scale", 0) : 1.0;
    if (cohere2) { /* sliding_window_pattern P (4): layers with (i + 1) % P != 0 slide and
                    * rotate, the others neither */
        m->window = ref_u32(g, arch, "attention.sliding_window", 0);
        m->pattern = m->no_rope_interval = ref_u32(g, arch, "attention.sliding_window_pattern", 4);
    }
    /* Phi3's _compute_longrope_parameters: factor = max / original positions */
    m->long_factor = ref_tensor(g, "rope_factors_long.weight", m->rotary_dim / 2);
    m->short_factor = ref_tensor(g, "rope_factors_short.weight", m->rotary_dim / 2);
    double orig = ref_u32(g, arch, "rope.scaling.original_context_length", 0);
    double factor = orig > 0 ? ref_u32(g, arch, "context_length", 0) / orig : 1.0;
    m->attention_factor = ref_f32(g, arch, "rope.scaling.attn_factor",
                                  factor > 1.0 ? sqrt(1 + log(factor) / log(orig)) : 1.0);
    m->rope_factor = 1.0;
    if (m->arch >= REF_GEMMA)
        m->embedding_multiplier = sqrt((double)m->dim);
    if (m->arch == REF_GEMMA2 || m->arch == REF_GEMMA3) {
        bool big = m->n_layer == (m->arch == REF_GEMMA2 ? 46 : 62);
        m->attention_multiplier =
            1.0 / sqrt(big ? (double)(m->dim / m->n_head) : (double)m->head_dim);
        m->window = ref_u32(g, arch, "attention.sliding_window", m->arch == REF_GEMMA2 ? 4096 : 0);
        m->pattern = m->arch == REF_GEMMA2 ? 2 : 6;
    }
    if (m->arch == REF_GEMMA2) {
        m->attn_cap = ref_f32(g, arch, "attn_logit_softcapping", 50.0);
        m->final_cap = ref_f32(g, arch, "final_logit_softcapping", 30.0);
    }
    if (exaone4 && (m->window = ref_u32(g, arch, "attention.sliding_window", 0)) > 0) {
        char k[128];
        snprintf(k, sizeof k, "%s.attention.sliding_window_pattern", arch);
        m->slides = malloc((size_t)m->n_layer * sizeof *m->slides);
        if (!gguf_arr_bool(g, k, m->slides, (uint64_t)m->n_layer)) {
            ref_model_free(m);
            return NULL;
        }
    }
    if ((m->gptoss && ref_gptoss_load(g, arch, m) < 0) ||
        (!strcmp(arch, "mistral3") && ref_mistral3_load(g, arch, m) < 0)) {
        ref_model_free(m);
        return NULL;
    }
    if (m->arch == REF_GEMMA3) {
        char k[128];
        gguf_str st;
        snprintf(k, sizeof k, "%s.rope.scaling.type", arch);
        if (gguf_get_str(g, k, &st) && gguf_str_eq(st, "linear"))
            m->rope_factor = ref_f32(g, arch, "rope.scaling.factor", 1.0);
    }
    const gguf_tensor *e = gguf_find_tensor(g, "token_embd.weight");
    m->n_vocab = e ? (int)e->ne[1] : 0;
    m->embd = ref_tensor(g, "token_embd.weight", (int64_t)m->dim * m->n_vocab);
    m->out = gguf_find_tensor(g, "output.weight") ? ref_tensor(g, "output.weight", -1) : m->embd;
    m->out_norm = ref_tensor(g, "output_norm.weight", m->dim);
    m->out_norm_b = ref_tensor(g, "output_norm.bias", m->dim);
    m->out_b = ref_tensor(g, "output.bias", m->n_vocab);
    m->layers = calloc((size_t)m->n_layer, sizeof *m->layers);
    for (int l = 0; l < m->n_layer; l++) {
        ref_layer *L = &m->layers[l];
        char n[96];
#define T(s) (snprintf(n, sizeof n, "blk.%d." s, l), ref_tensor(g, n, -1))
        L->attn_norm = T("attn_norm.weight");
        L->ffn_norm = T("ffn_norm.weight");
        L->attn_norm_b = T("attn_norm.bias");
        L->ffn_norm_b = T("ffn_norm.bias");
        L->wq = T("attn_q.weight");
        L->wk = T("attn_k.weight");
        L->wv = T("attn_v.weight");
        if (m->arch == REF_PHI3)
            ref_split_phi3(m, L, T("attn_qkv.weight"), T("ffn_up.weight"));
        L->wo = T("attn_output.weight");
        L->bq = T("attn_q.bias");
        L->bk = T("attn_k.bias");
        L->bv = T("attn_v.bias");
        L->bo = T("attn_output.bias"); /* any architecture's, where the file has it */
        if (m->glm4) { /* Glm4MLP's gate_up_proj, ChatGLM's query_key_value */
            double *qkv = T("attn_qkv.weight"), *qkv_b = T("attn_qkv.bias");
            ref_split_glm(m, L, qkv, qkv_b, T("ffn_up.weight"));
        }
        L->q_norm = T("attn_q_norm.weight");
        L->k_norm = T("attn_k_norm.weight");
        L->post_attn = T("post_attention_norm.weight");
        L->post_ffn = T("post_ffw_norm.weight");
        if (m->gptoss || m->post_attention_ffn_norm) { /* their post_attention_norm is the feed-forward's
                                           input norm */
            L->ffn_norm = L->post_attn;
            L->post_attn = NULL;
        }
        if (m->gptoss) {
            L->sinks = T("attn_sinks.weight");
            L->router_b = T("ffn_gate_inp.bias");
            L->gate_b = T("ffn_gate_exps.bias");
            L->up_b = T("ffn_up_exps.bias");
            L->down_b = T("ffn_down_exps.bias");
            if (!L->sinks || !L->bo || !L->router_b || !L->gate_b || !L->up_b || !L->down_b ||
                !L->ffn_norm) {
                ref_model_free(m);
                return NULL;
            }
        }
        if (m->n_expert && l >= m->n_dense_lead) {
            L->router = T("ffn_gate_inp.weight");
            L->probs_b = T("exp_probs_b.bias");
            L->gate_exps = T("ffn_gate_exps.weight");
            L->up_exps = T("ffn_up_exps.weight");
            L->down_exps = T("ffn_down_exps.weight");
            if (qwen2moe)
                L->shexp_gate = T("ffn_gate_inp_shexp.weight");
            if (m->n_ff_shexp) {
                L->gate = T("ffn_gate_shexp.weight");
                L->up = T("ffn_up_shexp.weight");
                L->down = T("ffn_down_shexp.weight");
            }
        } else {
            if (m->arch != REF_PHI3 && !m->glm4) {
                L->gate = m->ungated ? NULL : T("ffn_gate.weight");
                L->up = T("ffn_up.weight");
            }
            L->down = T("ffn_down.weight");
        }
        if (phi2 && !L->wq) { /* older conversions' attn_qkv */
            ref_split_phi3(m, L, T("attn_qkv.weight"), NULL);
            ref_split_qkv_bias(m, L, T("attn_qkv.bias"));
        }
        if (m->ungated) {
            L->c_fc_b = T("ffn_up.bias");
            L->c_proj_b = T("ffn_down.bias");
        }
#undef T
        bool ffn = m->n_expert && l >= m->n_dense_lead
                       ? L->router && L->gate_exps && L->up_exps && L->down_exps &&
                                     (!qwen2moe || L->shexp_gate) &&
                                     (!m->n_ff_shexp || (L->gate && L->up && L->down))
                   : m->ungated ? L->up && L->down && L->c_fc_b && L->c_proj_b
                                : L->gate && L->up && L->down;
        /* OLMo 2's post norms are computed where the file has them, as Gemma's */
        bool norms = m->no_input_norms ? L->q_norm && L->k_norm
                                       : L->attn_norm && (m->parallel || L->ffn_norm);
        norms = norms && (!m->layer_norm || cohere || (L->attn_norm_b &&
                                                      (m->parallel || L->ffn_norm_b)));
        norms = norms && !L->q_norm == !L->k_norm && (!m->parallel || !L->ffn_norm);
        if (!norms || !L->wq || !L->wk || !L->wv || !L->wo || !ffn) {
            ref_model_free(m);
            return NULL;
        }
    }
    if (!m->embd || !m->out || !m->out_norm || (m->layer_norm && !cohere && !m->out_norm_b) ||
        (cohere && m->logit_scale <= 0) || (cohere2 && m->window <= 0)) {
        ref_model_free(m);
        return NULL;
    }
    return m;
}

void ref_model_free(ref_model *m)
{
    if (!m)
        return;
    for (int l = 0; m->layers && l < m->n_layer; l++) {
        ref_layer *L = &m->layers[l];
        double *all[] = {L->attn_norm, L->ffn_norm, L->wq,        L->wk,      L->wv,
                         L->wo,        L->bq,       L->bk,        L->bv,      L->q_norm,
                         L->k_norm,    L->gate,     L->up,        L->down,    L->router,
                         L->gate_exps, L->up_exps,  L->down_exps, L->shexp_gate, L->probs_b,
                         L->post_attn,
                         L->post_ffn,  L->attn_norm_b, L->ffn_norm_b, L->sinks, L->bo,
                         L->router_b,  L->gate_b,   L->up_b,      L->down_b,  L->c_fc_b,
                         L->c_proj_b};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            free(all[i]);
    }
    free(m->layers);
    ref_ds2_free(m->ds2);
    free(m->yarn_inv_freq);
    free(m->slides);
    free(m->long_factor);
    free(m->short_factor);
    if (m->out != m->embd)
        free(m->out);
    free(m->embd);
    free(m->out_norm);
    free(m->out_norm_b);
    free(m->out_b);
    free(m);
}

void ref_model_longrope_long(ref_model *m, bool on)
{
    m->use_long = on;
}

void ref_model_sequential(ref_model *m, bool on)
{
    m->sequential = on;
}

void ref_model_record_routes(ref_model *m, int *routes)
{
    m->routes = routes;
}

void ref_model_round_kv_f16(ref_model *m, bool on)
{
    m->kv_f16 = on;
}

static double ref_round_f16(double x)
{
    return quant_f16_to_f32(quant_f32_to_f16((float)x));
}

int ref_model_n_vocab(const ref_model *m)
{
    if (m->ds2)
        return ref_ds2_n_vocab(m->ds2);
    return m->n_vocab;
}

static void ref_rmsnorm(double *y, const double *x, const double *w, int n, double eps)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += x[i] * x[i];
    double s = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++)
        y[i] = x[i] * s * w[i];
}

/* StableLmDecoderLayer's input_layernorm, post_attention_layernorm and the final norm:
 * torch's nn.LayerNorm, (x - mean) / sqrt(var + eps) * w + b (biased variance); Cohere's
 * CohereLayerNorm is the same without b (NULL). */
static void ref_layernorm(double *y, const double *x, const double *w, const double *b, int n,
                          double eps)
{
    double mean = 0, var = 0;
    for (int i = 0; i < n; i++)
        mean += x[i];
    mean /= n;
    for (int i = 0; i < n; i++)
        var += (x[i] - mean) * (x[i] - mean);
    double s = 1.0 / sqrt(var / n + eps);
    for (int i = 0; i < n; i++)
        y[i] = (x[i] - mean) * s * w[i] + (b ? b[i] : 0);
}

/* The model's norm of a sublayer's input or of the output: LayerNorm (StableLM, Cohere)
 * or RMSNorm. */
static void ref_norm(const ref_model *m, double *y, const double *x, const double *w,
                     const double *b)
{
    if (m->layer_norm)
        ref_layernorm(y, x, w, b, m->dim, m->eps);
    else
        ref_rmsnorm(y, x, w, m->dim, m->eps);
}

/* y (rows) = W (rows, cols) x (cols) [+ b] */
static void ref_matvec(double *y, const double *w, const double *x, const double *b, int rows, int cols)
{
    for (int r = 0; r < rows; r++) {
        double s = b ? b[r] : 0;
        for (int c = 0; c < cols; c++)
            s += w[(size_t)r * cols + c] * x[c];
        y[r] = s;
    }
}

/* Whether layer l attends through the sliding window. */
static bool ref_sliding(const ref_model *m, int l)
{
    if (m->slides)
        return m->window > 0 && m->slides[l];
    return m->window > 0 && l % m->pattern < m->pattern - 1;
}

/* rotate_half over the first rotary_dim of each head (the rest passes, as Phi3's
 * partial rotary); inv_freq divided by LongRoPE's ext_factors, cos and sin times its
 * attention_factor. llama and granite GGUF files hold q/k permuted by the converter, so
 * that HF's halves are interleaved pairs there; GLM-4's rotate_half pairs neighbours in
 * HF's own code. */
/* Qwen3RMSNorm of each head of one row's q (n_head, head_dim) and k (n_kv_head, head_dim). */
static void ref_head_norms(const ref_model *m, const ref_layer *L, double *q, double *k)
{
    int hd = m->head_dim;
    for (int h = 0; h < m->n_head; h++)
        ref_rmsnorm(q + h * hd, q + h * hd, L->q_norm, hd, m->eps);
    for (int h = 0; h < m->n_kv_head; h++)
        ref_rmsnorm(k + h * hd, k + h * hd, L->k_norm, hd, m->eps);
}

static void ref_rope(const ref_model *m, int l, double *x, int n_heads, int pos)
{
    int hd = m->head_dim, rd = m->rotary_dim;
    bool interleaved = m->arch == REF_LLAMA || m->arch == REF_GRANITE;
    const double *ext = m->use_long ? m->long_factor : m->short_factor;
    /* gemma3's sliding layers: base 10000 unscaled; its global ones the file's base with
     * positions divided by the linear factor (HF's "linear" rope_type) */
    bool local = m->arch == REF_GEMMA3 && ref_sliding(m, l);
    double base = local ? 10000.0 : m->rope_base, p = local ? pos : pos / m->rope_factor;
    for (int h = 0; h < n_heads; h++) {
        double *v = x + h * hd;
        for (int i = 0; i < rd / 2; i++) {
            double inv_freq = m->yarn_inv_freq ? m->yarn_inv_freq[i]
                                               : 1.0 / ((ext ? ext[i] : 1.0) * pow(base, 2.0 * i / rd));
            double ang = p * inv_freq;
            double c = cos(ang) * m->attention_factor, s = sin(ang) * m->attention_factor;
            int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + rd / 2;
            double x0 = v[a], x1 = v[b];
            v[a] = x0 * c - x1 * s;
            v[b] = x0 * s + x1 * c;
        }
    }
}

/* y (dim) = the gated feed-forward of xn (dim) by gate, up (ff, dim) and down (dim, ff):
 * SwiGLU, or GeGLU (gelu's tanh form) for Gemma; g and u hold ff doubles. */
static void ref_mlp(const ref_model *m, double *y, const double *xn, const double *gate,
                    const double *up, const double *down, int ff, double *g, double *u)
{
    ref_matvec(g, gate, xn, NULL, ff, m->dim);
    ref_matvec(u, up, xn, NULL, ff, m->dim);
    bool gelu = m->arch >= REF_GEMMA;
    for (int i = 0; i < ff; i++)
        g[i] = gelu ? 0.5 * g[i] * (1 + tanh(sqrt(2 / M_PI) * (g[i] + 0.044715 * g[i] * g[i] * g[i])))
                          * u[i]
                    : g[i] / (1 + exp(-g[i])) * u[i];
    ref_matvec(y, down, g, NULL, m->dim, ff);
}

/* y (dim) = Starcoder2MLP of xn (dim): c_proj(gelu_pytorch_tanh(c_fc(xn))), u holding
 * n_ff doubles. */
static void ref_ungated_mlp(const ref_model *m, const ref_layer *L, double *y, const double *xn,
                            double *u)
{
    ref_matvec(u, L->up, xn, L->c_fc_b, m->n_ff, m->dim);
    for (int i = 0; i < m->n_ff; i++)
        u[i] = 0.5 * u[i] * (1 + tanh(sqrt(2 / M_PI) * (u[i] + 0.044715 * u[i] * u[i] * u[i])));
    ref_matvec(y, L->down, u, L->c_proj_b, m->dim, m->n_ff);
}

/* y (dim) = GptOssMLP of xn (dim): GptOssTopKRouter, then GptOssExperts; g and u hold
 * n_ff_exp doubles, tmp dim. */
static void ref_gptoss_moe(const ref_model *m, const ref_layer *L, double *y, const double *xn,
                           double *tmp, double *g, double *u, int *route)
{
    int dim = m->dim, ne = m->n_expert, ff = m->n_ff_exp, k = m->n_expert_used;
    double logit[REF_MAX_EXPERTS], top[REF_MAX_EXPERTS];
    int idx[REF_MAX_EXPERTS];
    bool chosen[REF_MAX_EXPERTS] = {false};
    ref_matvec(logit, L->router, xn, L->router_b, ne, dim);
    for (int j = 0; j < k; j++) { /* torch.topk: descending */
        int best = -1;
        for (int e = 0; e < ne; e++)
            if (!chosen[e] && (best < 0 || logit[e] > logit[best]))
                best = e;
        chosen[best] = true;
        idx[j] = best;
        top[j] = logit[best];
        if (route)
            route[j] = best;
    }
    double sum = 0, max = top[0];
    for (int j = 0; j < k; j++)
        sum += top[j] = exp(top[j] - max);
    for (int i = 0; i < dim; i++)
        y[i] = 0;
    const double alpha = 1.702, limit = 7.0;
    for (int j = 0; j < k; j++) {
        int e = idx[j];
        size_t in = (size_t)ff * dim;
        ref_matvec(g, L->gate_exps + e * in, xn, L->gate_b + (size_t)e * ff, ff, dim);
        ref_matvec(u, L->up_exps + e * in, xn, L->up_b + (size_t)e * ff, ff, dim);
        for (int i = 0; i < ff; i++) {
            double gate = g[i] < limit ? g[i] : limit;
            double up = u[i] < -limit ? -limit : u[i] > limit ? limit : u[i];
            g[i] = (up + 1) * (gate / (1 + exp(-gate * alpha)));
        }
        ref_matvec(tmp, L->down_exps + e * in, g, L->down_b + (size_t)e * dim, dim, ff);
        for (int i = 0; i < dim; i++)
            y[i] += top[j] / sum * tmp[i];
    }
}

/* y (dim) = the sparse MoE block of xn (dim) as the Hugging Face models compute it;
 * tmp holds dim doubles, g and u max(n_ff_exp, n_ff_shexp). */
static void ref_moe(const ref_model *m, const ref_layer *L, double *y, const double *xn,
                    double *tmp, double *g, double *u, int *route)
{
    int dim = m->dim, ne = m->n_expert, ff = m->n_ff_exp;
    double prob[REF_MAX_EXPERTS];
    bool chosen[REF_MAX_EXPERTS] = {false};
    ref_matvec(prob, L->router, xn, NULL, ne, dim);
    double max = -INFINITY, sum = 0;
    for (int e = 0; e < ne; e++)
        max = prob[e] > max ? prob[e] : max;
    for (int e = 0; e < ne; e++)
        sum += prob[e] = m->sigmoid_router ? 1 / (1 + exp(-prob[e])) : exp(prob[e] - max);
    for (int e = 0; !m->sigmoid_router && e < ne; e++)
        prob[e] /= sum;
    /* Ernie4_5_MoeStatics: the choice by the probabilities plus the correction bias, the
     * weights the probabilities */
    double score[REF_MAX_EXPERTS];
    for (int e = 0; e < ne; e++)
        score[e] = prob[e] + (L->probs_b ? L->probs_b[e] : 0);
    double top_sum = 0;
    for (int j = 0; j < m->n_expert_used; j++) {
        int best = -1;
        for (int e = 0; e < ne; e++)
            if (!chosen[e] && (best < 0 || score[e] > score[best]))
                best = e;
        chosen[best] = true;
        top_sum += prob[best];
        if (route)
            route[j] = best;
    }
    for (int i = 0; i < dim; i++)
        y[i] = 0;
    for (int e = 0; e < ne; e++) {
        if (!chosen[e])
            continue;
        double w = m->norm_topk_prob ? prob[e] / top_sum : prob[e];
        if (m->expert_scale > 0)
            w *= m->expert_scale;
        size_t in = (size_t)ff * dim;
        ref_mlp(m, tmp, xn, L->gate_exps + e * in, L->up_exps + e * in, L->down_exps + e * in, ff,
                g, u);
        for (int i = 0; i < dim; i++)
            y[i] += w * tmp[i];
    }
    if (!m->n_ff_shexp)
        return;
    ref_mlp(m, tmp, xn, L->gate, L->up, L->down, m->n_ff_shexp, g, u);
    double s = 0;
    for (int i = 0; L->shexp_gate && i < dim; i++)
        s += L->shexp_gate[i] * xn[i];
    s = L->shexp_gate ? 1 / (1 + exp(-s)) : 1.0;
    for (int i = 0; i < dim; i++)
        y[i] += s * tmp[i];
}

void ref_forward(const ref_model *m, int n, const int32_t *tokens, const int32_t *positions,
                 double *logits, double *hidden, double *attn)
{
    if (m->ds2) {
        ref_ds2_forward(m->ds2, n, tokens, positions, logits, hidden, attn, m->routes, m->kv_f16);
        return;
    }
    int dim = m->dim, hd = m->head_dim, qd = m->n_head * hd, kvd = m->n_kv_head * hd;
    double *x = calloc((size_t)n * dim, sizeof(double));
    double *xn = malloc((size_t)dim * sizeof(double));
    double *q = malloc((size_t)n * qd * sizeof(double));
    double *k = malloc((size_t)n * kvd * sizeof(double));
    double *v = malloc((size_t)n * kvd * sizeof(double));
    double *o = malloc((size_t)qd * sizeof(double));
    int ff = m->n_ff;
    if (m->n_expert) {
        int exp_ff = m->n_ff_exp > m->n_ff_shexp ? m->n_ff_exp : m->n_ff_shexp;
        ff = m->n_dense_lead && m->n_ff > exp_ff ? m->n_ff : exp_ff;
    }
    double *tmp = malloc((size_t)(dim > ff ? dim : ff) * sizeof(double));
    double *tmp2 = malloc((size_t)dim * sizeof(double));
    double *g = malloc((size_t)ff * sizeof(double));
    double *u = malloc((size_t)ff * sizeof(double));
    double *p = malloc((size_t)n * sizeof(double));
    /* Cohere, Phi-2: each layer's input, which its MLP normalizes as its attention did */
    double *x_in = m->parallel ? malloc((size_t)n * dim * sizeof(double)) : NULL;

    for (int t = 0; t < n; t++)
        for (int i = 0; i < dim; i++)
            x[(size_t)t * dim + i] = m->embd[(size_t)tokens[t] * dim + i] * m->embedding_multiplier;
    if (hidden)
        memcpy(hidden, x, (size_t)n * dim * sizeof(double));

    for (int l = 0; l < m->n_layer; l++) {
        const ref_layer *L = &m->layers[l];
        if (x_in)
            memcpy(x_in, x, (size_t)n * dim * sizeof(double));
        for (int t = 0; t < n; t++) {
            if (m->no_input_norms)
                memcpy(xn, x + (size_t)t * dim, (size_t)dim * sizeof(double));
            else
                ref_norm(m, xn, x + (size_t)t * dim, L->attn_norm, L->attn_norm_b);
            ref_matvec(q + (size_t)t * qd, L->wq, xn, L->bq, qd, dim);
            ref_matvec(k + (size_t)t * kvd, L->wk, xn, L->bk, kvd, dim);
            ref_matvec(v + (size_t)t * kvd, L->wv, xn, L->bv, kvd, dim);
            if (L->q_norm && m->parallel) { /* CohereLayerNorm over (heads, head_dim) */
                for (int h = 0; h < m->n_head; h++)
                    ref_layernorm(q + (size_t)t * qd + h * hd, q + (size_t)t * qd + h * hd,
                                  L->q_norm + h * hd, NULL, hd, m->eps);
                for (int h = 0; h < m->n_kv_head; h++)
                    ref_layernorm(k + (size_t)t * kvd + h * hd, k + (size_t)t * kvd + h * hd,
                                  L->k_norm + h * hd, NULL, hd, m->eps);
            } else if (L->q_norm && m->qk_norm_whole) {
                double *qt = q + (size_t)t * qd, *kt = k + (size_t)t * kvd;
                ref_rmsnorm(qt, qt, L->q_norm, qd, m->eps);
                ref_rmsnorm(kt, kt, L->k_norm, kvd, m->eps);
            } else if (L->q_norm && !m->qk_norm_late) {
                ref_head_norms(m, L, q + (size_t)t * qd, k + (size_t)t * kvd);
            }
            /* Exaone4Attention rotates where the model has no window or the layer slides */
            bool exaone4_global = m->slides && !ref_sliding(m, l);
            if ((!m->no_rope_interval || (l + 1) % m->no_rope_interval != 0) && !exaone4_global) {
                ref_rope(m, l, q + (size_t)t * qd, m->n_head, positions[t]);
                ref_rope(m, l, k + (size_t)t * kvd, m->n_kv_head, positions[t]);
            }
            if (L->q_norm && m->qk_norm_late)
                ref_head_norms(m, L, q + (size_t)t * qd, k + (size_t)t * kvd);
            for (int i = 0; m->temp_beta != 0 && i < qd; i++)
                q[(size_t)t * qd + i] *= 1 + m->temp_beta * log(1 + floor((double)positions[t] /
                                                                          m->temp_floor));
            for (int i = 0; m->kv_f16 && i < kvd; i++) {
                k[(size_t)t * kvd + i] = ref_round_f16(k[(size_t)t * kvd + i]);
                v[(size_t)t * kvd + i] = ref_round_f16(v[(size_t)t * kvd + i]);
            }
        }
        for (int t = 0; t < n; t++) {
            for (int h = 0; h < m->n_head; h++) {
                int kh = h / (m->n_head / m->n_kv_head);
                /* gpt-oss: the sink joins the logits (max and sum), its column dropped */
                double max = L->sinks ? L->sinks[h] : -INFINITY, sum = 0;
                for (int j = 0; j < n; j++) {
                    if (positions[j] > positions[t] ||
                        (ref_sliding(m, l) && positions[t] - positions[j] >= m->window)) {
                        p[j] = -INFINITY;
                        continue;
                    }
                    double s = 0;
                    for (int i = 0; i < hd; i++)
                        s += q[(size_t)t * qd + h * hd + i] * k[(size_t)j * kvd + kh * hd + i];
                    p[j] = s * m->attention_multiplier;
                    if (m->attn_cap > 0)
                        p[j] = m->attn_cap * tanh(p[j] / m->attn_cap);
                    if (p[j] > max)
                        max = p[j];
                }
                for (int j = 0; j < n; j++) {
                    p[j] = p[j] == -INFINITY ? 0 : exp(p[j] - max);
                    sum += p[j];
                }
                if (L->sinks)
                    sum += exp(L->sinks[h] - max);
                for (int i = 0; i < hd; i++)
                    o[h * hd + i] = 0;
                for (int j = 0; j < n; j++) {
                    p[j] /= sum;
                    for (int i = 0; i < hd; i++)
                        o[h * hd + i] += p[j] * v[(size_t)j * kvd + kh * hd + i];
                }
                if (attn)
                    memcpy(attn + (((size_t)l * m->n_head + h) * n + t) * n, p, (size_t)n * sizeof(double));
            }
            /* the residual of token t is not read again by this layer's attention */
            ref_matvec(tmp, L->wo, o, L->bo, dim, qd);
            if (L->post_attn)
                ref_rmsnorm(tmp, tmp, L->post_attn, dim, m->eps);
            for (int i = 0; i < dim; i++)
                x[(size_t)t * dim + i] += tmp[i] * m->residual_multiplier;
        }
        for (int t = 0; t < n; t++) {
            if (m->no_input_norms)
                memcpy(xn, x + (size_t)t * dim, (size_t)dim * sizeof(double));
            else if (m->parallel)
                ref_norm(m, xn, (m->sequential ? x : x_in) + (size_t)t * dim, L->attn_norm,
                         L->attn_norm_b);
            else
                ref_norm(m, xn, x + (size_t)t * dim, L->ffn_norm, L->ffn_norm_b);
            int *route = m->routes ? m->routes + ((size_t)l * n + t) * m->n_expert_used : NULL;
            if (m->gptoss)
                ref_gptoss_moe(m, L, tmp, xn, tmp2, g, u, route);
            else if (m->n_expert && l >= m->n_dense_lead)
                ref_moe(m, L, tmp, xn, tmp2, g, u, route);
            else if (m->ungated)
                ref_ungated_mlp(m, L, tmp, xn, u);
            else
                ref_mlp(m, tmp, xn, L->gate, L->up, L->down, m->n_ff, g, u);
            if (L->post_ffn)
                ref_rmsnorm(tmp, tmp, L->post_ffn, dim, m->eps);
            for (int i = 0; i < dim; i++)
                x[(size_t)t * dim + i] += tmp[i] * m->residual_multiplier;
        }
        if (hidden)
            memcpy(hidden + (size_t)(l + 1) * n * dim, x, (size_t)n * dim * sizeof(double));
    }
    for (int t = 0; t < n; t++) {
        ref_norm(m, xn, x + (size_t)t * dim, m->out_norm, m->out_norm_b);
        ref_matvec(logits + (size_t)t * m->n_vocab, m->out, xn, m->out_b, m->n_vocab, dim);
        for (int i = 0; i < m->n_vocab; i++) {
            double *z = &logits[(size_t)t * m->n_vocab + i];
            *z = *z / m->logits_scaling * m->logit_scale;
            if (m->final_cap > 0)
                *z = m->final_cap * tanh(*z / m->final_cap);
        }
    }
    free(x), free(xn), free(q), free(k), free(v), free(o), free(tmp), free(tmp2), free(g), free(u);
    free(p);
    free(x_in);
}
