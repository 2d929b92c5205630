/*
 * model.c — loading a llama / qwen2 / qwen3 / phi3 / granite / gemma / gemma2 / gemma3 /
 * olmo2 / smollm3 / exaone / exaone4 / stablelm / mistral3 / glm4 / chatglm / command-r /
 * cohere2 / seed_oss / hunyuan-dense / deepseek2 / gpt-oss model (or a mixture of experts of
 * llama, qwen2, qwen3, olmoe or granite) from GGUF and its forward pass.
 *
 * Matrices are used in place from the file mapping; only the small 1-D tensors (norm
 * weights and biases) are converted into one f32 array. The forward pass works on up to
 * max_batch stacked rows at a time — one batch's sub-batch, or the rows of several
 * sequences' batches (model_forward_batch) — layer by layer: every step over the rows
 * is either a matrix product (ops_matmul, one for all rows) or a per-row / per-head job
 * split over the runner's thread pool. K/V go straight into each sequence's chunks, and
 * attention reads them there, each row over its own sequence.
 */
#include "engine/model/model.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "engine/quant/blas.h"
#include "engine/model/lora.h"
#include "engine/model/offload.h"
#include "engine/model/ops.h"
#include "engine/quant/quant.h"
#include "engine/threadpool.h"

/* Sub-batches of at least this many tokens do attention with sgemm on K/V converted to
 * f32 once per layer (prefill); smaller ones (decode) read f16 chunks in place and
 * compressed ones decoded block by block. */
#define MODEL_ATTN_GEMM_MIN 16

/* Largest dimension accepted from a file: keeps every size product far from overflow. */
#define MODEL_MAX_DIM (1 << 20)

/* Most experts a layer may have (the largest published models have 256). */
#define MODEL_MAX_EXPERTS 1024

/* Weight matrices of one layer a forward multiplies with (model_layer_matrices). */
#define MODEL_LAYER_MATRICES 15

typedef struct model_layer {
    const float *attn_norm; /* (dim), or NULL (olmo2) */
    const float *ffn_norm;  /* (dim), or NULL (olmo2) */
    const float *attn_norm_b; /* (dim) LayerNorm's bias (stablelm), or NULL */
    const float *ffn_norm_b;  /* (dim) LayerNorm's bias (stablelm), or NULL */
    /* (dim) of the attention's and of the feed-forward's output (gemma2, gemma3, olmo2),
     * or NULL */
    const float *attn_post_norm;
    const float *ffn_post_norm;
    model_qkv_extras extras; /* q/k/v biases (qwen2), q/k norms (qwen3, olmoe, olmo2) */
    /* phi3 stores q, k and v as one attn_qkv matrix and gate, up as one ffn_up of 2 n_ff
     * rows (gate first), glm4 and chatglm the latter, chatglm the former too (and glm4 in
     * some files): these are views of their rows, so the forward is the same */
    ops_matrix wq;          /* (n_head * head_dim, dim); deepseek2: (n_head * (mla_qk_nope +
                               rope_dims), dim) attn_q, or (.., mla_q_rank) attn_q_b */
    ops_matrix wk;          /* (n_head_kv * head_dim, dim); absent in deepseek2 */
    ops_matrix wv;          /* (n_head_kv * head_dim, dim); absent in deepseek2 */
    ops_matrix wo;          /* (dim, n_head * head_dim); deepseek2: (dim, n_head * mla_v_dim) */
    /* deepseek2's multi-head latent attention (model_hparams), else absent (data NULL) */
    ops_matrix wq_a;        /* (mla_q_rank, dim) attn_q_a, absent without mla_q_rank */
    ops_matrix wkv_a;       /* (mla_kv_rank + rope_dims, dim) attn_kv_a_mqa: the latent, then
                               the part of k every head shares, before RoPE */
    ops_matrix wk_b;        /* (n_head * mla_kv_rank, mla_qk_nope) attn_k_b: head h's rows
                               h * mla_kv_rank.. map its unrotated query into the latent */
    ops_matrix wv_b;        /* (n_head * mla_v_dim, mla_kv_rank) attn_v_b: head h's rows take
                               its value out of its attention over the latent; in a file of
                               the older converter, the value rows of attn_kv_b, head h's
                               wv_b_stride rows after head h - 1's */
    int wv_b_stride;
    const float *q_a_norm;  /* (mla_q_rank) attn_q_a_norm, or NULL */
    const float *kv_a_norm; /* (mla_kv_rank) attn_kv_a_norm */
    const float *exp_probs_b; /* (n_expert) DeepSeek-V3's selection bias, or NULL */
    /* The dense feed-forward, (n_ff, dim) (n_ff, dim) (dim, n_ff); with experts, the shared
     * expert (qwen2moe's, granitemoe's; n_ff_shexp in place of n_ff), else absent (data
     * NULL). */
    ops_matrix w_gate;
    ops_matrix w_up;
    ops_matrix w_down;
    /* Mixture of experts (n_expert > 0). The merged tensors are one matrix of all the
     * experts' rows, each expert's back to back (model_rows takes one out). */
    ops_matrix router;      /* (n_expert, dim) ffn_gate_inp */
    ops_matrix gate_exps;   /* (n_expert * n_ff_exp, dim) */
    ops_matrix up_exps;     /* (n_expert * n_ff_exp, dim) */
    ops_matrix down_exps;   /* (n_expert * dim, n_ff_exp) */
    const float *shexp_gate; /* (dim) the shared expert's sigmoid gate (qwen2moe), or NULL */
    /* gpt-oss (NULL for the others): attention sinks, the output's and the experts' biases */
    const float *attn_sinks; /* (n_head) one logit per head in its softmax's denominator */
    const float *bo;         /* (dim) attn_output.bias */
    const float *router_b;   /* (n_expert) ffn_gate_inp.bias */
    const float *gate_exps_b; /* (n_expert, n_ff_exp) */
    const float *up_exps_b;   /* (n_expert, n_ff_exp) */
    const float *down_exps_b; /* (n_expert, dim) */
    /* starcoder2, phi2 (NULL for the others; their attn_output.bias is bo above) */
    const float *b_up;       /* (n_ff) ffn_up.bias */
    const float *b_down;     /* (dim) ffn_down.bias */
} model_layer;

struct model {
    model_hparams hp;
    int n_ctx_train;         /* {arch}.context_length (hp.n_ctx may be a window's) */
    gguf_file *owned;        /* the file when model_load opened it */
    const gguf_file *g;
    ops_matrix tok_embd;     /* (n_vocab, dim) */
    ops_matrix output;       /* (n_vocab, dim); tok_embd when the file ties them */
    const float *output_norm; /* (dim) */
    const float *output_norm_b; /* (dim) LayerNorm's bias (stablelm), or NULL */
    const float *output_b;   /* (n_vocab) output.bias (phi2), or NULL */
    const float *rope_freqs; /* (rope_dims/2) RoPE frequency divisors, or NULL */
    const float *rope_long;  /* (rope_dims/2) LongRoPE divisors beyond rope_orig_ctx, or NULL */
    const float *rope_short; /* (rope_dims/2) LongRoPE divisors within it, or NULL */
    model_layer *layers;     /* (n_layer) */
    float *vecs;             /* every 1-D tensor converted to f32, back to back */
    size_t vecs_used;
    size_t vecs_cap;
    bool mapped;             /* weights are a file mapping (they can stream) */
    void *repacked;          /* (repacked_bytes) private copy of the repacked matrices, or NULL */
    size_t repacked_bytes;
    size_t repack_given_back; /* bytes of copied weights' pages the copy replaced */
    /* A view with adapters (model_with_loras): the model whose matrices it reads (it has
     * none of its own: tok_embd, output and layers are the base's), else NULL. */
    const model *base;
    int n_lora;
    const lora *lora[MODEL_LORA_MAX];
    float lora_scale[MODEL_LORA_MAX]; /* the user's, times each pair's factor when applied */
    int lora_rank;           /* the largest rank of its adapters' pairs */
    /* deepseek2 files of the older converter (one attn_kv_b per layer): every layer's
     * attn_k_b as the newer converter writes it, the transpose of attn_kv_b's key rows, in
     * f32 (always resident: never a streamed fragment), or NULL */
    float *mla_k_b;          /* (n_layer, n_head, mla_kv_rank, mla_qk_nope) */
    bool mla_kv_b;           /* the file is of the older converter (mla_k_b is made) */
};

/* ---- loading ---- */

static const char *const model_arch_names[] = {
    [MODEL_ARCH_LLAMA] = "llama",       [MODEL_ARCH_QWEN2] = "qwen2",
    [MODEL_ARCH_QWEN3] = "qwen3",       [MODEL_ARCH_PHI3] = "phi3",
    [MODEL_ARCH_GRANITE] = "granite",   [MODEL_ARCH_QWEN2MOE] = "qwen2moe",
    [MODEL_ARCH_QWEN3MOE] = "qwen3moe", [MODEL_ARCH_OLMOE] = "olmoe",
    [MODEL_ARCH_GEMMA] = "gemma",       [MODEL_ARCH_GEMMA2] = "gemma2",
    [MODEL_ARCH_GEMMA3] = "gemma3",
    [MODEL_ARCH_OLMO2] = "olmo2",
    [MODEL_ARCH_GRANITEMOE] = "granitemoe",
    [MODEL_ARCH_SMOLLM3] = "smollm3",
    [MODEL_ARCH_EXAONE] = "exaone",
    [MODEL_ARCH_STABLELM] = "stablelm",
    [MODEL_ARCH_MISTRAL3] = "mistral3",
    [MODEL_ARCH_EXAONE4] = "exaone4",
    [MODEL_ARCH_GLM4] = "glm4",
    [MODEL_ARCH_CHATGLM] = "chatglm",
    [MODEL_ARCH_COMMAND_R] = "command-r",
    [MODEL_ARCH_COHERE2] = "cohere2",
    [MODEL_ARCH_STARCODER2] = "starcoder2",
    [MODEL_ARCH_PHI2] = "phi2",
    [MODEL_ARCH_SEED_OSS] = "seed_oss",
    [MODEL_ARCH_HUNYUAN_DENSE] = "hunyuan-dense",
    [MODEL_ARCH_DEEPSEEK2] = "deepseek2",
    [MODEL_ARCH_ERNIE4_5_MOE] = "ernie4_5-moe",
    [MODEL_ARCH_GLM4MOE] = "glm4moe",
    [MODEL_ARCH_GPTOSS] = "gpt-oss",
};

const char *model_arch_name(enum model_arch a)
{
    return (unsigned)a < sizeof model_arch_names / sizeof *model_arch_names ? model_arch_names[a]
                                                                           : "?";
}

/*
 * Files whose model is one of the architectures above under another name, computed as
 * that one on the file's own keys:
 * - llama.cpp's conversions of Qwen2-VL and Qwen2.5-VL, Qwen3-VL and Qwen3-VL-MoE (the
 *   language model, with the vision tower in a separate mmproj file). Their M-RoPE gives
 *   a text token the same position in every section, so that it rotates as the plain
 *   model's RoPE; images are not read.
 * - InternLM2 and 2.5, ERNIE 4.5 (the dense 0.3B) and XVERSE, whose layers llama.cpp
 *   builds as llama's (its interleaved RoPE, the optional biases below).
 */
typedef struct model_arch_alias {
    const char *name;
    enum model_arch as;
    bool mrope; /* a vision conversion's: rope.dimension_sections required */
} model_arch_alias;

static const model_arch_alias model_arch_aliases[] = {
    {"qwen2vl", MODEL_ARCH_QWEN2, true},     {"qwen3vl", MODEL_ARCH_QWEN3, true},
    {"qwen3vlmoe", MODEL_ARCH_QWEN3MOE, true}, {"internlm2", MODEL_ARCH_LLAMA, false},
    {"ernie4_5", MODEL_ARCH_LLAMA, false},   {"xverse", MODEL_ARCH_LLAMA, false},
};

/* The alias called name[0..len), or NULL. */
static const model_arch_alias *model_arch_alias_of(const char *name, size_t len)
{
    for (size_t i = 0; i < sizeof model_arch_aliases / sizeof *model_arch_aliases; i++)
        if (strlen(model_arch_aliases[i].name) == len &&
            memcmp(model_arch_aliases[i].name, name, len) == 0)
            return &model_arch_aliases[i];
    return NULL;
}

int model_arch_from_name(const char *name, size_t len)
{
    for (size_t i = 0; i < sizeof model_arch_names / sizeof *model_arch_names; i++)
        if (strlen(model_arch_names[i]) == len && memcmp(model_arch_names[i], name, len) == 0)
            return (int)i;
    const model_arch_alias *a = model_arch_alias_of(name, len);
    return a ? (int)a->as : -1;
}

/* A vision model's M-RoPE sections (dimension pairs per position component), which a
 * text token's equal positions make plain RoPE: read to refuse a file that has none or
 * more pairs than rope.dimension_count, as llama.cpp requires them. */
static int model_read_mrope_sections(const gguf_file *g, const char *arch,
                                     const model_hparams *hp, char err[ERR_MAX])
{
    const model_arch_alias *alias = model_arch_alias_of(arch, strlen(arch));
    if (!alias || !alias->mrope)
        return 0;
    char key[96];
    snprintf(key, sizeof key, "%s.rope.dimension_sections", arch);
    enum gguf_value_type et;
    uint64_t n;
    int32_t sections[4];
    if (!gguf_get_arr(g, key, &et, &n) || n < 1 || n > 4 || !gguf_arr_i32(g, key, sections, n))
        return err_set(err, "%s: missing or not an array of at most 4 integers", key);
    int64_t pairs = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (sections[i] < 0)
            return err_set(err, "%s[%llu] = %d is negative", key, (unsigned long long)i,
                           sections[i]);
        pairs += sections[i];
    }
    if (pairs * 2 > hp->rope_dims)
        return err_set(err, "%s: %lld dimension pairs, more than rope.dimension_count %d holds",
                       key, (long long)pairs, hp->rope_dims);
    return 0;
}

bool model_layer_has_experts(const model_hparams *hp, int layer)
{
    return hp->n_expert > 0 && layer >= hp->n_dense_lead;
}

int model_ff_max(const model_hparams *hp)
{
    int ff = hp->n_ff > hp->n_ff_exp ? hp->n_ff : hp->n_ff_exp;
    return ff > hp->n_ff_shexp ? ff : hp->n_ff_shexp;
}

model_widths model_widths_of(const model_hparams *hp)
{
    model_widths w = {
        .mla_in = hp->mla_qk_nope > hp->mla_kv_rank ? hp->mla_qk_nope : hp->mla_kv_rank,
        .mla_out = hp->mla_kv_rank > hp->mla_v_dim ? hp->mla_kv_rank : hp->mla_v_dim,
    };
    /* deepseek2's q_b and attn_output read inputs of their own widths */
    int widest[] = {hp->dim, model_ff_max(hp), hp->n_head * hp->head_dim, hp->mla_q_rank,
                    w.mla_in, hp->n_head * hp->mla_v_dim};
    for (size_t i = 0; i < sizeof widest / sizeof *widest; i++)
        w.max_cols = widest[i] > w.max_cols ? widest[i] : w.max_cols;
    return w;
}

int model_layer_window(const model_hparams *hp, int layer)
{
    if (hp->swa_window <= 0 || layer % hp->swa_pattern >= hp->swa_pattern - 1)
        return 0;
    return hp->swa_window;
}

bool model_layer_rotates(const model_hparams *hp, int layer)
{
    return hp->nope_step <= 0 || (layer + 1) % hp->nope_step != 0;
}

int model_get_dim(const gguf_file *g, const char *arch, const char *suffix, int dflt,
                         int *out, char err[ERR_MAX])
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int64_t v;
    if (gguf_find_key(g, key) < 0) {
        if (dflt < 0)
            return err_set(err, "missing metadata key '%s'", key);
        *out = dflt;
        return 0;
    }
    if (!gguf_get_i64(g, key, &v))
        return err_set(err, "metadata key '%s' is not an integer", key);
    if (v <= 0 || v > MODEL_MAX_DIM)
        return err_set(err, "metadata key '%s' out of range (%lld)", key, (long long)v);
    *out = (int)v;
    return 0;
}

int model_get_float(const gguf_file *g, const char *arch, const char *suffix, float dflt,
                    float *out, char err[ERR_MAX])
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (gguf_find_key(g, key) < 0) {
        *out = dflt;
        return 0;
    }
    if (!gguf_get_f32(g, key, out))
        return err_set(err, "metadata key '%s' is not a number", key);
    if (!(*out > 0) || !isfinite(*out))
        return err_set(err, "metadata key '%s' out of range (%g)", key, (double)*out);
    return 0;
}

/* RoPE scaling, {arch}.rope.scaling.type with .factor (or the older rope.scale_linear),
 * read as llama.cpp does: linear divides every position by the factor; yarn interpolates the
 * low frequencies, keeps the high ones (ops_rope_yarn) over .original_context_length
 * (default the model's context length), with .yarn_beta_fast, .yarn_beta_slow and
 * .yarn_ext_factor where a converter wrote them; .attn_factor multiplies cos and sin with any
 * kind. Another kind (longrope) reshapes the frequencies in ways this engine does not compute:
 * refused, as a file that loaded without it would answer as another model. */
static int model_read_rope_scale(const gguf_file *g, const char *arch, const model_hparams *hp,
                                 ops_rope_scaling *out, char err[ERR_MAX])
{
    char key[128];
    float factor = 1.0f, attn_factor;
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    gguf_str type = {"none", 4};
    if (gguf_find_key(g, key) >= 0 && !gguf_get_str(g, key, &type))
        return err_set(err, "metadata key '%s' is not a string", key);
    if (model_get_float(g, arch, "rope.scaling.attn_factor", 1.0f, &attn_factor, err) < 0)
        return -1;
    *out = (ops_rope_scaling){.freq_scale = 1.0f, .mscale = attn_factor};
    if (type.len == 4 && memcmp(type.ptr, "none", 4) == 0) {
        if (model_get_float(g, arch, "rope.scale_linear", 1.0f, &factor, err) < 0)
            return -1;
    } else if (type.len == 6 && memcmp(type.ptr, "linear", 6) == 0) {
        if (model_get_float(g, arch, "rope.scaling.factor", 1.0f, &factor, err) < 0)
            return -1;
    } else if (type.len == 4 && memcmp(type.ptr, "yarn", 4) == 0) {
        int orig_ctx;
        float beta_fast, beta_slow, ext_factor = 1.0f;
        if (model_get_float(g, arch, "rope.scaling.factor", 1.0f, &factor, err) < 0 ||
            model_get_dim(g, arch, "rope.scaling.original_context_length", hp->n_ctx, &orig_ctx,
                          err) < 0 ||
            model_get_float(g, arch, "rope.scaling.yarn_beta_fast", 32.0f, &beta_fast, err) < 0 ||
            model_get_float(g, arch, "rope.scaling.yarn_beta_slow", 1.0f, &beta_slow, err) < 0)
            return -1;
        /* 0 is meaningful here (every pair interpolated, no temperature), so not
         * model_get_float's positive range. */
        snprintf(key, sizeof key, "%s.rope.scaling.yarn_ext_factor", arch);
        if (gguf_find_key(g, key) >= 0 &&
            (!gguf_get_f32(g, key, &ext_factor) || !(ext_factor >= 0.0f && ext_factor <= 1.0f)))
            return err_set(err, "metadata key '%s' is not a number in [0, 1]", key);
        /* mistral3: cos and sin times mscale(1) / mscale(yarn_log_multiplier), HF's
         * get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) with mscale 1 as
         * llama.cpp takes it (1 for Ministral 3's), in place of the 1 + 0.1 ln factor
         * ops_rope_yarn applies */
        float log_mul = 0.0f;
        bool deepseek2 = hp->arch == MODEL_ARCH_DEEPSEEK2;
        snprintf(key, sizeof key, "%s.rope.scaling.yarn_log_multiplier", arch);
        if ((hp->arch == MODEL_ARCH_MISTRAL3 || deepseek2) && gguf_find_key(g, key) >= 0 &&
            (!gguf_get_f32(g, key, &log_mul) || !(log_mul >= 0.0f && log_mul <= 100.0f)))
            return err_set(err, "metadata key '%s' is not a number in [0, 100]", key);
        /* deepseek2: HF's mscale equals its mscale_all_dim, so cos and sin keep their scale
         * (model_read_deepseek2 puts YaRN's into the query scale) */
        if (log_mul != 0.0f && ext_factor != 0.0f && factor > 1.0f)
            attn_factor /= 1.0f + 0.1f * (deepseek2 ? 1.0f : log_mul) * logf(factor);
        /* gpt-oss: Hugging Face's config says "truncate": false, as OpenAI's own code
         * computes the ramp (llama.cpp truncates for every model) */
        *out = ops_rope_yarn(hp->rope_dims, hp->rope_base, factor, orig_ctx, beta_fast, beta_slow,
                             ext_factor, attn_factor, hp->arch != MODEL_ARCH_GPTOSS);
        return 0;
    } else {
        return err_set(err, "rope scaling '%.*s' is not supported (none, linear and yarn are)",
                       (int)(type.len > 32 ? 32 : type.len), type.ptr);
    }
    out->freq_scale = 1.0f / factor;
    return 0;
}

/* {arch}.pooling_type: -1 when absent; a value llama.cpp does not define is an error
 * (a vector pooled some unknown way would be silently wrong). */
static int model_read_pooling_type(const gguf_file *g, const char *arch, int *out,
                                   char err[ERR_MAX])
{
    char key[128];
    snprintf(key, sizeof key, "%s.pooling_type", arch);
    *out = -1;
    if (gguf_find_key(g, key) < 0)
        return 0;
    int64_t v;
    if (!gguf_get_i64(g, key, &v))
        return err_set(err, "metadata key '%s' is not an integer", key);
    if (v < 0 || v > 4)
        return err_set(err, "metadata key '%s' is %lld: none of 0 (none), 1 (mean), 2 (cls), "
                            "3 (last), 4 (rank)", key, (long long)v);
    *out = (int)v;
    return 0;
}

/* An error naming {arch}.suffix when the file has no such key: one llama.cpp requires of
 * the architecture (a default would answer as another model). */
static int model_require(const gguf_file *g, const char *arch, const char *suffix,
                         char err[ERR_MAX])
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return gguf_find_key(g, key) < 0 ? err_set(err, "missing metadata key '%s'", key) : 0;
}

/* phi3.attention.sliding_window (0: none, as converted Phi-4 files say). Files converted
 * before the key existed get llama.cpp's defaults: 2047 for Phi-3-mini/medium-4k, none
 * for the 128k models (their windows are at least their context); others are refused,
 * as llama.cpp refuses them. Window masking is not computed here: a window shorter than
 * the trained context caps n_ctx to it, which keeps every answer exact. */
static int model_read_window(const gguf_file *g, model_hparams *hp, char err[ERR_MAX])
{
    const char *key = "phi3.attention.sliding_window";
    int64_t v;
    if (gguf_find_key(g, key) < 0) {
        bool deep = hp->n_layer == 32 || hp->n_layer == 40;
        if (deep && hp->n_ctx == 4096)
            v = 2047;
        else if (deep && hp->n_ctx == 131072)
            v = 0;
        else
            return err_set(err, "missing metadata key '%s'", key);
    } else if (!gguf_get_i64(g, key, &v) || v < 0 || v > MODEL_MAX_DIM) {
        return err_set(err, "metadata key '%s' is not an integer in [0, %d]", key,
                       MODEL_MAX_DIM);
    }
    hp->sliding_window = (int)v;
    if (hp->sliding_window > 0 && hp->sliding_window < hp->n_ctx)
        hp->n_ctx = hp->sliding_window;
    return 0;
}

/*
 * The experts' keys, as llama.cpp reads them: {arch}.expert_count and expert_used_count
 * (qwen2moe and qwen3moe always have them; a llama file with them is Mixtral), an
 * expert's hidden size expert_feed_forward_length (default feed_forward_length for
 * llama and olmoe, where it is the experts', else feed_forward_length /
 * expert_used_count), the shared expert's expert_shared_feed_forward_length (qwen2moe;
 * default feed_forward_length; granitemoe's, Granite MoE Shared's ungated shared expert,
 * as later llama.cpp reads it: 0 when absent, no shared expert). Routing as each model's
 * published code: softmax over every expert then the k most probable, renormalised to sum
 * 1 for qwen3moe (norm_topk_prob), Mixtral, granitemoe and gpt-oss (their top-k then
 * softmax over the chosen is the same), not for qwen2moe and olmoe. gpt-oss requires
 * expert_feed_forward_length, as llama.cpp does.
 */
static int model_read_experts(const gguf_file *g, const char *arch, model_hparams *hp,
                              char err[ERR_MAX])
{
    bool qwen2moe = hp->arch == MODEL_ARCH_QWEN2MOE, granite = hp->arch == MODEL_ARCH_GRANITEMOE;
    bool gptoss = hp->arch == MODEL_ARCH_GPTOSS;
    if (hp->arch != MODEL_ARCH_LLAMA && hp->arch != MODEL_ARCH_QWEN2MOE &&
        hp->arch != MODEL_ARCH_QWEN3MOE && hp->arch != MODEL_ARCH_OLMOE && !granite && !gptoss)
        return 0;
    char key[128];
    snprintf(key, sizeof key, "%s.expert_count", arch);
    int64_t count;
    if (hp->arch == MODEL_ARCH_LLAMA &&
        (gguf_find_key(g, key) < 0 || (gguf_get_i64(g, key, &count) && count == 0)))
        return 0;
    if (model_get_dim(g, arch, "expert_count", -1, &hp->n_expert, err) < 0 ||
        model_get_dim(g, arch, "expert_used_count", -1, &hp->n_expert_used, err) < 0)
        return -1;
    if (hp->n_expert > MODEL_MAX_EXPERTS)
        return err_set(err, "metadata key '%s' is %d, above %d", key, hp->n_expert,
                       MODEL_MAX_EXPERTS);
    if (hp->n_expert_used > hp->n_expert)
        return err_set(err, "metadata key '%s.expert_used_count' is %d, more than the %d "
                            "experts of %s", arch, hp->n_expert_used, hp->n_expert, key);
    bool own_ff = hp->arch == MODEL_ARCH_LLAMA || hp->arch == MODEL_ARCH_OLMOE || granite;
    int dflt = gptoss ? -1 : own_ff ? hp->n_ff : hp->n_ff / hp->n_expert_used;
    if (model_get_dim(g, arch, "expert_feed_forward_length", dflt > 0 ? dflt : -1,
                      &hp->n_ff_exp, err) < 0 ||
        (qwen2moe && model_get_dim(g, arch, "expert_shared_feed_forward_length",
                                   hp->n_ff > 0 ? hp->n_ff : -1, &hp->n_ff_shexp, err) < 0) ||
        (granite && model_get_dim(g, arch, "expert_shared_feed_forward_length", 0,
                                  &hp->n_ff_shexp, err) < 0))
        return -1;
    hp->expert_norm = !qwen2moe && hp->arch != MODEL_ARCH_OLMOE;
    hp->n_ff = hp->n_ff_exp > hp->n_ff_shexp ? hp->n_ff_exp : hp->n_ff_shexp;
    return 0;
}

/*
 * The Gemma family's hyper-parameters, as llama.cpp reads them (llama-model.cpp's
 * load_hparams):
 *   - every one: embedding rows times sqrt(dim) (in f32, as llama.cpp's ggml_scale; HF
 *     rounds the factor to the weights' dtype), GeGLU, NEOX RoPE, query scale 1/sqrt(head_dim);
 *   - gemma2: post norms; sliding window {arch}.attention.sliding_window (4096 when absent)
 *     on the even layers; soft-caps attn_logit_softcapping (50 when absent) and
 *     final_logit_softcapping (30 when absent);
 *   - gemma3: post norms, per-head q/k norms (tensors); the window (required) on every layer
 *     but each sixth, whose RoPE is base 10000 unscaled while the others (global) take
 *     rope.freq_base and the file's rope scaling; no soft-caps (a final_logit_softcapping
 *     key, as later llama.cpp reads, is honoured);
 *   - the query scale of gemma2/gemma3's 27B (46 / 62 layers) is 1/sqrt(dim / n_head),
 *     HF's query_pre_attn_scalar there (144 and 168, where head_dim is 128); every other
 *     shape takes 1/sqrt(head_dim), as llama.cpp (whose model type is the layer count)
 *     does: no key in the file says which, so a file of another depth built with the 27B's
 *     scalar would be scaled as the others are.
 */
static int model_read_gemma(const gguf_file *g, const char *arch, model_hparams *hp,
                            char err[ERR_MAX])
{
    enum model_arch a = hp->arch;
    if (a != MODEL_ARCH_GEMMA && a != MODEL_ARCH_GEMMA2 && a != MODEL_ARCH_GEMMA3)
        return 0;
    hp->embd_scale = sqrtf((float)hp->dim);
    hp->ffn_act = MODEL_FFN_GELU_TANH;
    if (a == MODEL_ARCH_GEMMA)
        return 0;
    hp->post_norms = true;
    int n_27b = a == MODEL_ARCH_GEMMA2 ? 46 : 62;
    if (hp->n_layer == n_27b)
        hp->attn_scale = 1.0f / sqrtf((float)(hp->dim / hp->n_head));
    if (a == MODEL_ARCH_GEMMA2) {
        hp->swa_pattern = 2;
        if (model_get_dim(g, arch, "attention.sliding_window", 4096, &hp->swa_window, err) < 0 ||
            model_get_float(g, arch, "attn_logit_softcapping", 50.0f, &hp->attn_softcap, err) < 0 ||
            model_get_float(g, arch, "final_logit_softcapping", 30.0f, &hp->final_softcap, err) < 0)
            return -1;
        return 0;
    }
    hp->swa_pattern = 6;
    hp->rope_swa = true;
    hp->rope_base_swa = 10000.0f;
    if (model_get_dim(g, arch, "attention.sliding_window", -1, &hp->swa_window, err) < 0 ||
        model_get_float(g, arch, "final_logit_softcapping", 0.0f, &hp->final_softcap, err) < 0)
        return -1;
    return 0;
}

/* {arch}.attention.sliding_window_pattern into hp->swa_pattern: a period P (the layers
 * l with l % P < P - 1 slide), or a boolean per layer as convert_hf_to_gguf.py writes
 * HF's layer_types, which must be all but every P-th (a P past the last layer: all
 * slide); dflt without the key. 0, or -1 with err. */
static int model_read_swa_pattern(const gguf_file *g, const char *arch, int dflt,
                                  model_hparams *hp, char err[ERR_MAX])
{
    char key[128];
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", arch);
    enum gguf_value_type et;
    uint64_t n;
    if (!gguf_get_arr(g, key, &et, &n))
        return model_get_dim(g, arch, "attention.sliding_window_pattern", dflt,
                             &hp->swa_pattern, err);
    bool *slides = malloc((size_t)hp->n_layer * sizeof *slides);
    if (!slides)
        return err_set(err, "out of memory");
    if (!gguf_arr_bool(g, key, slides, (uint64_t)hp->n_layer)) {
        free(slides);
        return err_set(err, "metadata key '%s' is not %d booleans", key, hp->n_layer);
    }
    int period = 1;
    while (period <= hp->n_layer && slides[period - 1])
        period++;
    bool every_pth = true;
    for (int l = 0; every_pth && l < hp->n_layer; l++)
        every_pth = slides[l] == (l % period < period - 1);
    free(slides);
    if (!every_pth)
        return err_set(err, "metadata key '%s': only every p-th layer global is supported", key);
    hp->swa_pattern = period;
    return 0;
}

/*
 * gpt-oss's hyper-parameters, as llama.cpp reads them and Hugging Face's GptOssConfig
 * defines them: attention.sliding_window (required; 128 in the published models) on the
 * layers HF's layer_types make "sliding_attention", the even ones (swa_pattern 2, as
 * llama.cpp's; its optional attention.sliding_window_pattern is read too,
 * model_read_swa_pattern); a rope.freq_base_swa other than rope.freq_base (which
 * llama.cpp would apply to the sliding layers, YaRN-scaled) is refused, as this engine's
 * other base for sliding layers is gemma3's unscaled one;
 * attention.layer_norm_rms_epsilon required; the experts' clamped SwiGLU,
 * whose constants (alpha 1.702, limit 7) no key carries (llama.cpp and HF hard-code them).
 * The query scale is 1/sqrt(head_dim) and RoPE NEOX's halves, as for the others; YaRN's
 * ramp is not truncated (model_read_rope_scale).
 */
static int model_read_gptoss(const gguf_file *g, const char *arch, model_hparams *hp,
                             char err[ERR_MAX])
{
    if (hp->arch != MODEL_ARCH_GPTOSS)
        return 0;
    hp->ffn_act = MODEL_FFN_SWIGLU_OAI;
    float base_swa;
    if (model_require(g, arch, "attention.layer_norm_rms_epsilon", err) < 0 ||
        model_get_dim(g, arch, "attention.sliding_window", -1, &hp->swa_window, err) < 0 ||
        model_read_swa_pattern(g, arch, 2, hp, err) < 0 ||
        model_get_float(g, arch, "rope.freq_base_swa", hp->rope_base, &base_swa, err) < 0)
        return -1;
    if (base_swa != hp->rope_base)
        return err_set(err, "metadata key '%s.rope.freq_base_swa' is %g, not rope.freq_base's "
                            "%g: a RoPE base of the sliding layers' own is not supported",
                       arch, (double)base_swa, (double)hp->rope_base);
    return 0;
}

/*
 * OLMo 2 (olmo2), as llama.cpp reads it and HF's Olmo2DecoderLayer computes it: neither
 * sublayer normalizes its input; each one's output goes through an RMSNorm
 * (post_attention_norm, post_ffw_norm) before its residual add; q and k are normalized
 * whole (olmoe's q/k norms, tensors) before NEOX RoPE. The epsilon is required, as
 * llama.cpp requires it.
 */
static int model_read_olmo2(const gguf_file *g, const char *arch, model_hparams *hp,
                            char err[ERR_MAX])
{
    if (hp->arch != MODEL_ARCH_OLMO2)
        return 0;
    hp->pre_norms = false;
    hp->post_norms = true;
    return model_require(g, arch, "attention.layer_norm_rms_epsilon", err);
}

/*
 * StableLM (stablelm: StableLM-3B-4E1T, StableLM 2 1.6B/3B, Zephyr's), as llama.cpp reads
 * it and HF's StableLmForCausalLM computes it: LayerNorms with biases before each sublayer
 * and at the output, epsilon attention.layer_norm_epsilon (required, as llama.cpp
 * requires it), NEOX RoPE over rope.dimension_count of each head (partial_rotary_factor
 * 0.25 in the published models).
 */
static int model_read_stablelm(const gguf_file *g, const char *arch, model_hparams *hp,
                               char err[ERR_MAX])
{
    if (hp->arch != MODEL_ARCH_STABLELM)
        return 0;
    hp->norm = MODEL_NORM_LAYER;
    if (model_require(g, arch, "attention.layer_norm_epsilon", err) < 0 ||
        model_get_float(g, arch, "attention.layer_norm_epsilon", 1e-5f, &hp->norm_eps, err) < 0)
        return -1;
    return 0;
}

/* mistral3 (Ministral 3, and the Mistral files a newer converter writes with Llama 4's
 * attention scaling): llama's layer, with the attention temperature where the file has
 * attention.temperature_scale, over the YaRN original context as llama.cpp takes it. Its
 * experts (Mistral Large 3 is converted as deepseek2) are refused, as llama.cpp routes
 * them in a way this engine's llama experts do not. */
static int model_read_mistral3(const gguf_file *g, const char *arch, model_hparams *hp,
                               char err[ERR_MAX])
{
    if (hp->arch != MODEL_ARCH_MISTRAL3)
        return 0;
    if (hp->n_expert > 0)
        return err_set(err, "mistral3 with experts (%d) is not supported", hp->n_expert);
    char key[128];
    snprintf(key, sizeof key, "%s.attention.temperature_scale", arch);
    if (gguf_find_key(g, key) >= 0 &&
        (!gguf_get_f32(g, key, &hp->attn_temp_scale) || !isfinite(hp->attn_temp_scale)))
        return err_set(err, "metadata key '%s' is not a number", key);
    hp->attn_temp_floor = hp->rope_orig_ctx;
    return 0;
}

/*
 * EXAONE 4.0 (exaone4), as HF's Exaone4ForCausalLM computes it: OLMo 2's norms of the
 * sublayers' outputs and none of their inputs, qwen3's per-head q/k norms, NEOX RoPE. With
 * attention.sliding_window (the 32B; the 1.2B has none) the layers attention.
 * sliding_window_pattern marks (HF's layer_types, as the converter writes them: a boolean
 * per layer, or a period) slide and rotate, and the others (every fourth: "LLLG") attend
 * to everything and rotate nothing. A pattern that is not every p-th layer global, or a
 * rope.freq_base_swa of the sliding layers' own, is refused. llama.cpp of April 2026
 * slides only 64-layer files, with a window of 4096 and period 4 where the keys are
 * absent; the converter writes the keys for every model that has a window.
 */
static int model_read_exaone4(const gguf_file *g, const char *arch, model_hparams *hp,
                              char err[ERR_MAX])
{
    if (hp->arch != MODEL_ARCH_EXAONE4)
        return 0;
    hp->pre_norms = false;
    hp->post_norms = true;
    char key[128];
    snprintf(key, sizeof key, "%s.attention.sliding_window", arch);
    if (gguf_find_key(g, key) < 0)
        return 0;
    float base_swa;
    if (model_get_dim(g, arch, "attention.sliding_window", -1, &hp->swa_window, err) < 0 ||
        model_get_float(g, arch, "rope.freq_base_swa", hp->rope_base, &base_swa, err) < 0)
        return -1;
    if (base_swa != hp->rope_base)
        return err_set(err, "metadata key '%s.rope.freq_base_swa' is %g, not rope.freq_base's "
                            "%g: a RoPE base of the sliding layers' own is not supported",
                       arch, (double)base_swa, (double)hp->rope_base);
    if (model_read_swa_pattern(g, arch, 4, hp, err) < 0)
        return -1;
    hp->nope_step = hp->swa_pattern;
    return 0;
}

/*
 * GLM-4 (glm4: GLM-4-9B/32B-0414, GLM-Z1), as llama.cpp reads it and HF's Glm4DecoderLayer
 * computes it: RMSNorms before each sublayer and of each sublayer's output before its
 * residual add (post_attention_norm, post_ffw_norm), RoPE over rope.dimension_count of
 * each head (partial_rotary_factor 0.5) in interleaved pairs (Glm4's rotate_half pairs
 * neighbours, and its converter writes q and k as they are). The epsilon is required, as
 * llama.cpp requires it. Files of GLM-4.1V's language model (M-RoPE sections) and of
 * GLM-OCR (NextN layers after the others) are refused: rotating by sections and skipping
 * those layers are not computed here. ChatGLM (chatglm: GLM-4-9B-chat of 2024, ChatGLM3),
 * as llama.cpp reads it and THUDM's modeling_chatglm computes it, is the same without the
 * norms of the sublayers' outputs.
 */
static int model_read_glm4(const gguf_file *g, const char *arch, model_hparams *hp,
                           char err[ERR_MAX])
{
    if (hp->arch != MODEL_ARCH_GLM4 && hp->arch != MODEL_ARCH_CHATGLM)
        return 0;
    hp->post_norms = hp->arch == MODEL_ARCH_GLM4;
    static const char *const refused[] = {"rope.dimension_sections", "nextn_predict_layers"};
    char key[128];
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        snprintf(key, sizeof key, "%s.%s", arch, refused[i]);
        if (gguf_find_key(g, key) >= 0)
            return err_set(err, "metadata key '%s': GLM-4.1V's M-RoPE and GLM-OCR's NextN "
                                "layers are not supported", key);
    }
    return model_require(g, arch, "attention.layer_norm_rms_epsilon", err);
}

/*
 * Cohere's command-r (Command-R, Command-R+, Aya 23, Aya Expanse) and cohere2 (Command R7B,
 * Command A), as llama.cpp reads them and HF's CohereForCausalLM / Cohere2ForCausalLM
 * compute them: one LayerNorm without bias (attn_norm, epsilon
 * attention.layer_norm_epsilon, required) whose output both attention and the
 * feed-forward read, their outputs added to the layer's input; logits times logit_scale
 * (required of cohere2; command-r's unscaled without it, as llama.cpp reads them).
 * cohere2 slides the window attention.sliding_window (required) over the layers l with
 * l % P < P - 1 and rotates only those, the others attending globally without RoPE: P is
 * attention.sliding_window_pattern (model_read_swa_pattern), 4 without it (the models'
 * layer_types).
 */
static int model_read_cohere(const gguf_file *g, const char *arch, model_hparams *hp,
                             char err[ERR_MAX])
{
    if (hp->arch != MODEL_ARCH_COMMAND_R && hp->arch != MODEL_ARCH_COHERE2)
        return 0;
    hp->norm = MODEL_NORM_LAYER;
    hp->parallel = true;
    bool cohere2 = hp->arch == MODEL_ARCH_COHERE2;
    float logit_scale;
    if (model_require(g, arch, "attention.layer_norm_epsilon", err) < 0 ||
        model_get_float(g, arch, "attention.layer_norm_epsilon", 1e-5f, &hp->norm_eps, err) < 0 ||
        (cohere2 && model_require(g, arch, "logit_scale", err) < 0) ||
        model_get_float(g, arch, "logit_scale", 1.0f, &logit_scale, err) < 0)
        return -1;
    hp->logit_scale = 1.0f / logit_scale;
    if (cohere2) {
        if (model_get_dim(g, arch, "attention.sliding_window", -1, &hp->swa_window, err) < 0 ||
            model_read_swa_pattern(g, arch, 4, hp, err) < 0)
            return -1;
        hp->nope_step = hp->swa_pattern; /* the layers that do not slide */
    }
    return 0;
}

/*
 * StarCoder2 (starcoder2: StarCoder2 3B/7B/15B) and Phi-2 (phi2), as llama.cpp reads them
 * and HF's Starcoder2ForCausalLM and PhiForCausalLM compute them: LayerNorms with biases
 * (epsilon attention.layer_norm_epsilon, required, as llama.cpp requires it), NEOX RoPE
 * (their converters store q and k as HF has them; Phi-2 rotates rope.dimension_count, 32
 * of its 80), and the ungated feed-forward Starcoder2MLP and PhiMLP share: c_proj of
 * gelu's tanh form (gelu_pytorch_tanh, gelu_new) of c_fc, both with biases. StarCoder2
 * has a norm before each sublayer; Phi-2 one whose output both read, their outputs added
 * to the residual together (parallel), and an lm_head with its bias. HF masks
 * StarCoder2's attention beyond its sliding_window (4096 of the published models' 16384);
 * llama.cpp's converter writes no window and llama.cpp attends to every entry, as this
 * engine does: the two agree up to 4096 tokens.
 */
static int model_read_starcoder2_phi2(const gguf_file *g, const char *arch, model_hparams *hp,
                                      char err[ERR_MAX])
{
    if (hp->arch != MODEL_ARCH_STARCODER2 && hp->arch != MODEL_ARCH_PHI2)
        return 0;
    hp->norm = MODEL_NORM_LAYER;
    hp->ffn_act = MODEL_FFN_GELU_TANH_UNGATED;
    hp->parallel = hp->arch == MODEL_ARCH_PHI2;
    if (model_require(g, arch, "attention.layer_norm_epsilon", err) < 0 ||
        model_get_float(g, arch, "attention.layer_norm_epsilon", 1e-5f, &hp->norm_eps, err) < 0)
        return -1;
    return 0;
}

/*
 * Hunyuan's dense models (hunyuan-dense: Hunyuan 0.5B to 7B, Hunyuan-MT-7B), as llama.cpp
 * reads them and HF's HunYuanDenseV1ForCausalLM computes them: qwen3's layer with the
 * per-head q/k RMSNorms (query_layernorm, key_layernorm) of the rotated q and k, and the
 * RoPE base raised by the NTK-aware alpha where the file has rope.scaling.alpha:
 * base * alpha^(d / (d - 2)) over the head dimension d. HunyuanOCR's XD-RoPE sections are
 * refused.
 */
static int model_read_hunyuan(const gguf_file *g, const char *arch, model_hparams *hp,
                              char err[ERR_MAX])
{
    if (hp->arch != MODEL_ARCH_HUNYUAN_DENSE)
        return 0;
    hp->qk_norm_after_rope = true;
    char key[96];
    snprintf(key, sizeof key, "%s.rope.dimension_sections", arch);
    if (gguf_find_key(g, key) >= 0)
        return err_set(err, "%s: HunyuanOCR's XD-RoPE is not supported", key);
    float alpha;
    if (model_get_float(g, arch, "rope.scaling.alpha", 0.0f, &alpha, err) < 0)
        return -1;
    if (!(alpha >= 0.0f && alpha < 1e6f))
        return err_set(err, "%s.rope.scaling.alpha %g out of range (0..1e6)", arch, alpha);
    if (alpha > 0.0f && hp->head_dim > 2)
        hp->rope_base *= powf(alpha, (float)hp->head_dim / (float)(hp->head_dim - 2));
    return 0;
}

/* {arch}.suffix, an unsigned integer, as a boolean: absent is false. */
static int model_get_flag(const gguf_file *g, const char *arch, const char *suffix, bool *out,
                          char err[ERR_MAX])
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    *out = false;
    if (gguf_find_key(g, key) >= 0 && !gguf_get_bool(g, key, out))
        return err_set(err, "metadata key '%s' is not a boolean", key);
    return 0;
}

/* {arch}.suffix as a count of layers or experts, 0 to 4096: 0 when absent. */
static int model_get_count(const gguf_file *g, const char *arch, const char *suffix, int *out,
                           char err[ERR_MAX])
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int64_t v = 0;
    if (gguf_find_key(g, key) >= 0 && (!gguf_get_i64(g, key, &v) || v < 0 || v > 4096))
        return err_set(err, "metadata key '%s' is not an integer in [0, 4096]", key);
    *out = (int)v;
    return 0;
}

/* {arch}.expert_gating_func into hp->expert_sigmoid: 1 softmax, 2 sigmoid, dflt (1 or 2)
 * when absent or 0 (llama.cpp's "none"). */
static int model_read_gating(const gguf_file *g, const char *arch, uint32_t dflt,
                             model_hparams *hp, char err[ERR_MAX])
{
    char key[128];
    snprintf(key, sizeof key, "%s.expert_gating_func", arch);
    uint32_t gating = 0;
    if (gguf_find_key(g, key) >= 0 && (!gguf_get_u32(g, key, &gating) || gating > 2))
        return err_set(err, "metadata key '%s' is not 1 (softmax) or 2 (sigmoid)", key);
    hp->expert_sigmoid = (gating ? gating : dflt) == 2;
    return 0;
}

/* What deepseek2's, glm4moe's and ernie4_5-moe's readers share: expert_count,
 * expert_used_count and expert_feed_forward_length (required), leading_dense_block_count
 * (0 when absent), checked against each other and the layers; with `shared` experts
 * (expert_shared_count) the shared expert is one of n_ff_exp * shared. */
static int model_read_lead_experts(const gguf_file *g, const char *arch, int shared,
                                   model_hparams *hp, char err[ERR_MAX])
{
    if (model_get_dim(g, arch, "expert_count", -1, &hp->n_expert, err) < 0 ||
        model_get_dim(g, arch, "expert_used_count", -1, &hp->n_expert_used, err) < 0 ||
        model_get_dim(g, arch, "expert_feed_forward_length", -1, &hp->n_ff_exp, err) < 0 ||
        model_get_count(g, arch, "leading_dense_block_count", &hp->n_dense_lead, err) < 0)
        return -1;
    if (hp->n_expert > MODEL_MAX_EXPERTS || hp->n_expert_used > hp->n_expert)
        return err_set(err, "%s.expert_count %d / expert_used_count %d out of range (at most "
                            "%d experts)", arch, hp->n_expert, hp->n_expert_used,
                       MODEL_MAX_EXPERTS);
    if ((int64_t)shared * hp->n_ff_exp > MODEL_MAX_DIM)
        return err_set(err, "%s.expert_shared_count %d too large", arch, shared);
    if (shared)
        hp->n_ff_shexp = shared * hp->n_ff_exp;
    if (hp->n_dense_lead > hp->n_layer)
        return err_set(err, "%s.leading_dense_block_count %d is above the %d layers", arch,
                       hp->n_dense_lead, hp->n_layer);
    return 0;
}

/* deepseek2's experts (model_hparams): none where the file has no expert_count (a dense
 * model such as Youtu-LLM, every layer dense), else the counts, the shared experts as one
 * of n_ff_exp * expert_shared_count, the gating (llama.cpp's default for files without
 * expert_gating_func: softmax, but sigmoid for GLM-4.7-Flash's 47- and 48-layer shapes of
 * a 154880-token vocabulary), the weights' scale and renormalization, the groups. */
static int model_read_deepseek2_experts(const gguf_file *g, const char *arch, model_hparams *hp,
                                        char err[ERR_MAX])
{
    char key[128];
    snprintf(key, sizeof key, "%s.expert_count", arch);
    int64_t count = 0;
    if (gguf_find_key(g, key) >= 0 && !gguf_get_i64(g, key, &count))
        return err_set(err, "metadata key '%s' is not an integer", key);
    if (count == 0)
        return model_get_dim(g, arch, "leading_dense_block_count", hp->n_layer,
                             &hp->n_dense_lead, err);
    int shared, groups, groups_used;
    if (model_get_count(g, arch, "expert_shared_count", &shared, err) < 0 ||
        model_read_lead_experts(g, arch, shared, hp, err) < 0 ||
        model_get_float(g, arch, "expert_weights_scale", 0.0f, &hp->expert_scale, err) < 0 ||
        model_get_flag(g, arch, "expert_weights_norm", &hp->expert_norm, err) < 0 ||
        model_get_count(g, arch, "expert_group_count", &groups, err) < 0 ||
        model_get_count(g, arch, "expert_group_used_count", &groups_used, err) < 0)
        return -1;
    if (groups > 1) {
        if (hp->n_expert % groups != 0 || groups_used < 1 || groups_used > groups ||
            (int64_t)groups_used * (hp->n_expert / groups) < hp->n_expert_used ||
            hp->n_expert / groups < 2)
            return err_set(err, "%s.expert_group_count %d / expert_group_used_count %d do not "
                                "fit %d experts of which %d are used", arch, groups,
                           groups_used, hp->n_expert, hp->n_expert_used);
        hp->n_expert_groups = groups;
        hp->n_expert_groups_used = groups_used;
    }
    const gguf_tensor *emb = gguf_find_tensor(g, "token_embd.weight");
    bool glm47_flash = (hp->n_layer == 47 || hp->n_layer == 48) && emb && emb->ne[1] == 154880;
    return model_read_gating(g, arch, glm47_flash ? 2 : 1, hp, err);
}

/*
 * DeepSeek-V2 and V3 (deepseek2, also DeepSeek-R1, Kimi-K2, GLM-4.7-Flash, Moonlight), as
 * llama.cpp reads files of its current converter: multi-head latent attention with
 * attn_k_b and attn_v_b (model_hparams), RMS epsilon required, interleaved RoPE, the
 * experts (model_read_deepseek2_experts). The query scale is llama.cpp's: 1/sqrt of a
 * head's query/key dimensions times mscale^2, where YaRN with yarn_log_multiplier
 * (converted as 0.1 * HF's mscale_all_dim) gives mscale = 1 + 0.1 mscale_all_dim ln(factor)
 * and leaves cos and sin unscaled (model_read_rope_scale), as HF's DeepseekV2 computes
 * it. Files of the older converter (one attn_kv_b, no key_length_mla), which llama.cpp
 * computes without the latent cache, are computed as the newer ones. Mistral Large 3's
 * attention temperature is refused.
 */
static int model_read_deepseek2(const gguf_file *g, const char *arch, model_hparams *hp,
                                char err[ERR_MAX])
{
    if (hp->arch != MODEL_ARCH_DEEPSEEK2)
        return 0;
    char key[128];
    snprintf(key, sizeof key, "%s.attention.temperature_scale", arch);
    if (gguf_find_key(g, key) >= 0)
        return err_set(err, "%s: deepseek2's attention temperature (Mistral Large 3) is not "
                            "supported", key);
    int k_mla, v_len;
    if (model_require(g, arch, "attention.kv_lora_rank", err) < 0 ||
        model_require(g, arch, "rope.dimension_count", err) < 0 ||
        model_require(g, arch, "attention.layer_norm_rms_epsilon", err) < 0 ||
        model_require(g, arch, "attention.key_length", err) < 0 ||
        model_require(g, arch, "attention.value_length", err) < 0 ||
        model_get_dim(g, arch, "attention.kv_lora_rank", -1, &hp->mla_kv_rank, err) < 0 ||
        model_get_dim(g, arch, "attention.q_lora_rank", 0, &hp->mla_q_rank, err) < 0 ||
        model_get_dim(g, arch, "attention.value_length", -1, &v_len, err) < 0)
        return -1;
    /* the older converter's files (attn_kv_b) give a head's key and value lengths where
     * the newer ones give the latent's, and have a KV head per query head: computed as the
     * newer (model_load_mla_kv_b) */
    snprintf(key, sizeof key, "%s.attention.key_length_mla", arch);
    if (gguf_find_key(g, key) < 0) {
        k_mla = hp->head_dim;
        hp->mla_v_dim = v_len;
        hp->head_dim = hp->mla_kv_rank + hp->rope_dims;
        hp->n_head_kv = 1;
        v_len = hp->mla_kv_rank;
        if (hp->head_dim > OPS_MAX_HEAD_DIM)
            return err_set(err, "%s.attention.kv_lora_rank %d is above %d less the rotated "
                                "dimensions", arch, hp->mla_kv_rank, OPS_MAX_HEAD_DIM);
    } else if (model_get_dim(g, arch, "attention.key_length_mla", -1, &k_mla, err) < 0 ||
               model_get_dim(g, arch, "attention.value_length_mla", -1, &hp->mla_v_dim, err) < 0) {
        return -1;
    }
    if (hp->n_head_kv != 1)
        return err_set(err, "%s.attention.head_count_kv is %d: multi-head latent attention "
                            "has one (the latent)", arch, hp->n_head_kv);
    if (hp->head_dim != hp->mla_kv_rank + hp->rope_dims || v_len != hp->mla_kv_rank)
        return err_set(err, "%s.attention.key_length %d and value_length %d: multi-head latent "
                            "attention's are kv_lora_rank + rope.dimension_count (%d) and "
                            "kv_lora_rank (%d)", arch, hp->head_dim, v_len,
                       hp->mla_kv_rank + hp->rope_dims, hp->mla_kv_rank);
    if (k_mla <= hp->rope_dims)
        return err_set(err, "%s.attention.key_length_mla %d is not above rope.dimension_count "
                            "%d", arch, k_mla, hp->rope_dims);
    if ((int64_t)hp->n_head * (k_mla > hp->mla_v_dim ? k_mla : hp->mla_v_dim) > MODEL_MAX_DIM)
        return err_set(err, "%s: head_count * key_length_mla too large", arch);
    hp->mla_qk_nope = k_mla - hp->rope_dims;
    hp->rope_style = MODEL_ROPE_INTERLEAVED;
    if (model_read_deepseek2_experts(g, arch, hp, err) < 0)
        return -1;
    if (hp->n_dense_lead > 0 && hp->n_ff <= 0)
        return err_set(err, "missing metadata key '%s.feed_forward_length' (the leading dense "
                            "layers')", arch);
    /* llama.cpp's query scale (deepseek2.cpp's kq_scale): the attention factor it gives
     * RoPE, times YaRN's 1 + 0.1 ln(factor) where RoPE did not apply it, times HF's
     * mscale of mscale_all_dim, squared */
    const ops_rope_scaling *sc = &hp->rope_scaling;
    float ln_factor = logf(1.0f / sc->freq_scale), log_mul = 0.0f;
    snprintf(key, sizeof key, "%s.rope.scaling.yarn_log_multiplier", arch);
    if (gguf_find_key(g, key) >= 0 &&
        (!gguf_get_f32(g, key, &log_mul) || !(log_mul >= 0.0f && log_mul <= 10.0f)))
        return err_set(err, "metadata key '%s' is not a number in [0, 10]", key);
    float attn_factor = sc->mscale * (sc->ext_factor != 0.0f ? 1.0f : 1.0f + 0.1f * ln_factor);
    float mscale = attn_factor * (1.0f + log_mul * ln_factor); /* 0.1 * mscale_all_dim */
    hp->attn_scale = mscale * mscale / sqrtf((float)k_mla);
    return 0;
}

/*
 * ERNIE 4.5's mixtures of experts (ernie4_5-moe: ERNIE-4.5-21B-A3B, 300B-A47B), as llama.cpp
 * reads them and HF's Ernie4_5_MoeForCausalLM computes them: llama's attention, the first
 * leading_dense_block_count layers dense (feed_forward_length), then experts of
 * expert_feed_forward_length routed by the softmax of the router's logits, chosen by those
 * plus exp_probs_b (HF's e_score_correction_bias) where the file has it, weighted by the
 * unbiased probabilities renormalized (no routed scaling: llama.cpp reads none for it, HF
 * has none); a shared expert of expert_shared_feed_forward_length added ungated where
 * that is not 0. llama.cpp builds the experts of every layer from the dense ones on and runs them
 * only where interleave_moe_layer_step divides the layer's number plus 1: a step other
 * than 1 (which the published models have) is refused.
 */
static int model_read_ernie_moe(const gguf_file *g, const char *arch, model_hparams *hp,
                                char err[ERR_MAX])
{
    if (hp->arch != MODEL_ARCH_ERNIE4_5_MOE)
        return 0;
    int step;
    char key[128];
    snprintf(key, sizeof key, "%s.expert_shared_feed_forward_length", arch);
    if (model_require(g, arch, "attention.layer_norm_rms_epsilon", err) < 0 ||
        model_read_lead_experts(g, arch, 0, hp, err) < 0 ||
        model_get_dim(g, arch, "interleave_moe_layer_step", -1, &step, err) < 0 ||
        (gguf_find_key(g, key) >= 0 &&
         model_get_dim(g, arch, "expert_shared_feed_forward_length", 0, &hp->n_ff_shexp, err) < 0))
        return -1;
    if (step != 1)
        return err_set(err, "%s.interleave_moe_layer_step %d: experts on every layer after the "
                            "dense ones (1) are supported", arch, step);
    hp->expert_norm = true;
    return 0;
}

/*
 * GLM-4.5, GLM-4.5-Air and GLM-4.6 (glm4moe), as llama.cpp reads them: the experts of
 * expert_feed_forward_length (required) with expert_shared_count shared ones in one
 * ffn_*_shexp, leading_dense_block_count dense layers, routing by expert_gating_func
 * (sigmoid when absent), the selection bias exp_probs_b (required), expert_weights_norm and
 * expert_weights_scale; no groups (llama.cpp reads none for it). block_count counts the
 * nextn_predict_layers multi-token-prediction layers at the end, which no forward runs:
 * the model is the layers before them. GLM-4.5V's M-RoPE sections are refused.
 */
static int model_read_glm4moe(const gguf_file *g, const char *arch, model_hparams *hp,
                              char err[ERR_MAX])
{
    if (hp->arch != MODEL_ARCH_GLM4MOE)
        return 0;
    char key[128];
    snprintf(key, sizeof key, "%s.rope.dimension_sections", arch);
    if (gguf_find_key(g, key) >= 0)
        return err_set(err, "%s: GLM-4.5V's M-RoPE is not supported", key);
    int shared, nextn;
    if (model_require(g, arch, "attention.layer_norm_rms_epsilon", err) < 0 ||
        model_require(g, arch, "expert_shared_count", err) < 0 ||
        model_get_count(g, arch, "expert_shared_count", &shared, err) < 0 ||
        model_get_count(g, arch, "nextn_predict_layers", &nextn, err) < 0)
        return -1;
    if (nextn >= hp->n_layer)
        return err_set(err, "%s.nextn_predict_layers %d is not below block_count %d", arch,
                       nextn, hp->n_layer);
    hp->n_layer -= nextn;
    if (model_read_lead_experts(g, arch, shared, hp, err) < 0 ||
        model_get_float(g, arch, "expert_weights_scale", 0.0f, &hp->expert_scale, err) < 0 ||
        model_get_flag(g, arch, "expert_weights_norm", &hp->expert_norm, err) < 0)
        return -1;
    return model_read_gating(g, arch, 2, hp, err);
}

static int model_read_hparams(model *m, char err[ERR_MAX])
{
    model_hparams *hp = &m->hp;
    gguf_str a;
    if (!gguf_get_str(m->g, "general.architecture", &a))
        return err_set(err, "missing metadata key 'general.architecture'");
    int ai = model_arch_from_name(a.ptr, a.len);
    if (ai < 0)
        return err_set(err, "unsupported architecture '%.*s'", (int)(a.len > 64 ? 64 : a.len),
                       a.ptr);
    hp->arch = (enum model_arch)ai;
    if (a.len >= sizeof hp->file_arch)
        return err_set(err, "architecture name of %zu bytes", a.len);
    memcpy(hp->file_arch, a.ptr, a.len);
    hp->file_arch[a.len] = '\0';
    const char *arch = hp->file_arch;
    bool granite = hp->arch == MODEL_ARCH_GRANITE || hp->arch == MODEL_ARCH_GRANITEMOE;
    /* llama.cpp's converter permutes their q and k rows (LlamaModel's): HF's halves become
     * interleaved pairs; Cohere's rotate_half pairs them so already (not permuted) */
    bool interleaved = hp->arch == MODEL_ARCH_LLAMA || granite || hp->arch == MODEL_ARCH_SMOLLM3 ||
                       hp->arch == MODEL_ARCH_MISTRAL3 ||
                       hp->arch == MODEL_ARCH_GLM4 || /* GLM's own rotary pairs neighbours */
                       hp->arch == MODEL_ARCH_CHATGLM || hp->arch == MODEL_ARCH_COMMAND_R ||
                       hp->arch == MODEL_ARCH_COHERE2 || hp->arch == MODEL_ARCH_ERNIE4_5_MOE;
    hp->rope_style = interleaved ? MODEL_ROPE_INTERLEAVED : MODEL_ROPE_HALVES;
    /* their experts' sizes have keys of their own: feed_forward_length is only a default */
    bool qwen_moe = hp->arch == MODEL_ARCH_QWEN2MOE || hp->arch == MODEL_ARCH_QWEN3MOE ||
                    hp->arch == MODEL_ARCH_GPTOSS || hp->arch == MODEL_ARCH_DEEPSEEK2;

    if (model_get_dim(m->g, arch, "embedding_length", -1, &hp->dim, err) < 0 ||
        model_get_dim(m->g, arch, "block_count", -1, &hp->n_layer, err) < 0 ||
        model_get_dim(m->g, arch, "feed_forward_length", qwen_moe ? 0 : -1, &hp->n_ff, err) < 0 ||
        model_get_dim(m->g, arch, "attention.head_count", -1, &hp->n_head, err) < 0 ||
        model_get_dim(m->g, arch, "attention.head_count_kv", hp->n_head, &hp->n_head_kv, err) < 0 ||
        model_get_dim(m->g, arch, "attention.key_length", hp->dim / hp->n_head, &hp->head_dim, err) < 0 ||
        model_get_dim(m->g, arch, "context_length", 2048, &hp->n_ctx, err) < 0)
        return -1;
    int value_length;
    if (model_get_dim(m->g, arch, "attention.value_length", hp->head_dim, &value_length, err) < 0)
        return -1;
    /* deepseek2's value is its latent, without the rotated dimensions of its key */
    if (value_length != hp->head_dim && hp->arch != MODEL_ARCH_DEEPSEEK2)
        return err_set(err, "attention.value_length %d differs from key_length %d", value_length,
                       hp->head_dim);
    if (model_get_dim(m->g, arch, "rope.dimension_count", hp->head_dim, &hp->rope_dims, err) < 0)
        return -1;
    if (hp->rope_dims > hp->head_dim || hp->rope_dims % 2 != 0)
        return err_set(err, "%s.rope.dimension_count %d is odd or above the head dimension %d",
                       arch, hp->rope_dims, hp->head_dim);
    if (model_read_mrope_sections(m->g, arch, hp, err) < 0)
        return -1;
    if (model_get_dim(m->g, arch, "rope.scaling.original_context_length", hp->n_ctx,
                      &hp->rope_orig_ctx, err) < 0)
        return -1;
    if (hp->n_layer > 4096)
        return err_set(err, "block_count %d out of range", hp->n_layer);
    if (hp->n_head % hp->n_head_kv != 0)
        return err_set(err, "head_count %d is not a multiple of head_count_kv %d", hp->n_head,
                       hp->n_head_kv);
    if (hp->head_dim % 2 != 0 || hp->head_dim > OPS_MAX_HEAD_DIM)
        return err_set(err, "head dimension %d is odd or above %d", hp->head_dim,
                       OPS_MAX_HEAD_DIM);
    if ((int64_t)hp->n_head * hp->head_dim > MODEL_MAX_DIM)
        return err_set(err, "head_count * key_length too large");
    float eps_default = hp->arch == MODEL_ARCH_LLAMA ? 1e-5f : 1e-6f;
    if (model_get_float(m->g, arch, "rope.freq_base", 10000.0f, &hp->rope_base, err) < 0 ||
        model_get_float(m->g, arch, "attention.layer_norm_rms_epsilon", eps_default,
                        &hp->norm_eps, err) < 0 ||
        model_read_rope_scale(m->g, arch, hp, &hp->rope_scaling, err) < 0 ||
        model_read_experts(m->g, arch, hp, err) < 0)
        return -1;
    hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
    hp->embd_scale = hp->residual_scale = hp->logit_scale = 1.0f;
    /* the epsilon llama.cpp requires of them */
    if ((hp->arch == MODEL_ARCH_PHI3 || granite || hp->arch == MODEL_ARCH_SMOLLM3 ||
         hp->arch == MODEL_ARCH_EXAONE || hp->arch == MODEL_ARCH_MISTRAL3 ||
         hp->arch == MODEL_ARCH_EXAONE4 || hp->arch == MODEL_ARCH_SEED_OSS ||
         hp->arch == MODEL_ARCH_HUNYUAN_DENSE) &&
        model_require(m->g, arch, "attention.layer_norm_rms_epsilon", err) < 0)
        return -1;
    /* SmolLM3's NoPE layers: HF's no_rope_layers default (no_rope_layer_interval 4), which
     * llama.cpp fixes at 4 with no key to read */
    if (hp->arch == MODEL_ARCH_SMOLLM3)
        hp->nope_step = 4;
    m->n_ctx_train = hp->n_ctx;
    if (hp->arch == MODEL_ARCH_PHI3 && model_read_window(m->g, hp, err) < 0)
        return -1;
    if (granite &&
        (model_require(m->g, arch, "embedding_scale", err) < 0 ||
         model_require(m->g, arch, "residual_scale", err) < 0 ||
         model_require(m->g, arch, "attention.scale", err) < 0 ||
         model_require(m->g, arch, "logit_scale", err) < 0 ||
         model_get_float(m->g, arch, "embedding_scale", 1.0f, &hp->embd_scale, err) < 0 ||
         model_get_float(m->g, arch, "residual_scale", 1.0f, &hp->residual_scale, err) < 0 ||
         model_get_float(m->g, arch, "attention.scale", 1.0f, &hp->attn_scale, err) < 0 ||
         model_get_float(m->g, arch, "logit_scale", 1.0f, &hp->logit_scale, err) < 0))
        return -1;
    hp->ffn_act = MODEL_FFN_SILU;
    hp->pre_norms = true;
    if (model_read_gemma(m->g, arch, hp, err) < 0 || model_read_gptoss(m->g, arch, hp, err) < 0 ||
        model_read_olmo2(m->g, arch, hp, err) < 0 || model_read_stablelm(m->g, arch, hp, err) < 0 ||
        model_read_mistral3(m->g, arch, hp, err) < 0 ||
        model_read_exaone4(m->g, arch, hp, err) < 0 || model_read_glm4(m->g, arch, hp, err) < 0 ||
        model_read_cohere(m->g, arch, hp, err) < 0 ||
        model_read_starcoder2_phi2(m->g, arch, hp, err) < 0 ||
        model_read_hunyuan(m->g, arch, hp, err) < 0 ||
        model_read_deepseek2(m->g, arch, hp, err) < 0 ||
        model_read_ernie_moe(m->g, arch, hp, err) < 0 ||
        model_read_glm4moe(m->g, arch, hp, err) < 0)
        return -1;
    return model_read_pooling_type(m->g, arch, &hp->pooling_type, err);
}

/* Finds a tensor and checks its type is computable and its shape is exactly (ne0[, ne1]). */
const gguf_tensor *model_gguf_tensor(const gguf_file *g, const char *name, int n_dims,
                                     int64_t ne0, int64_t ne1, char err[ERR_MAX])
{
    const gguf_tensor *t = gguf_find_tensor(g, name);
    if (!t) {
        err_set(err, "tensor '%s' is missing", name);
        return NULL;
    }
    const quant_traits *tr = quant_traits_of(t->type);
    if (!tr || !tr->computable) {
        err_set(err, "tensor '%s': type %s is not supported", name, tr ? tr->name : "unknown");
        return NULL;
    }
    bool ok = (int)t->n_dims == n_dims && t->ne[0] == ne0 && (n_dims == 1 || t->ne[1] == ne1);
    for (int d = n_dims; d < GGUF_MAX_DIMS; d++)
        ok = ok && t->ne[d] == 1;
    if (!ok) {
        if (n_dims == 1)
            err_set(err, "tensor '%s': shape [%lld, %lld] (%u dims), expected [%lld]", name,
                    (long long)t->ne[0], (long long)t->ne[1], t->n_dims, (long long)ne0);
        else
            err_set(err, "tensor '%s': shape [%lld, %lld] (%u dims), expected [%lld, %lld]", name,
                    (long long)t->ne[0], (long long)t->ne[1], t->n_dims, (long long)ne0,
                    (long long)ne1);
        return NULL;
    }
    size_t row = quant_row_bytes(t->type, ne0);
    int64_t rows = n_dims == 1 ? 1 : ne1;
    if (row == 0 || t->bytes < row * (size_t)rows) {
        err_set(err, "tensor '%s': %zu bytes do not hold %lld rows of %lld %s elements", name,
                t->bytes, (long long)rows, (long long)ne0, tr->name);
        return NULL;
    }
    return t;
}

static int model_matrix(const model *m, const char *name, int64_t rows, int64_t cols,
                        ops_matrix *out, char err[ERR_MAX])
{
    const gguf_tensor *t = model_gguf_tensor(m->g, name, 2, cols, rows, err);
    if (!t)
        return -1;
    *out = (ops_matrix){.type = t->type, .data = t->data, .rows = (int)rows, .cols = (int)cols,
                        .row_bytes = quant_row_bytes(t->type, cols)};
    return 0;
}

static int model_vector(model *m, const char *name, int64_t n, const float **out,
                        char err[ERR_MAX]);

/* The merged tensor name of n matrices of (rows, cols), ne [cols, rows, n] as llama.cpp's
 * converter writes experts (and deepseek2's per-head attn_k_b, attn_v_b), as one matrix of
 * n * rows rows; `what` names the n in errors ("experts"). */
static int model_stacked(const model *m, const char *name, int64_t n, const char *what,
                         int64_t rows, int64_t cols, ops_matrix *out, char err[ERR_MAX])
{
    const gguf_tensor *t = gguf_find_tensor(m->g, name);
    if (!t)
        return err_set(err, "tensor '%s' is missing", name);
    const quant_traits *tr = quant_traits_of(t->type);
    if (!tr || !tr->computable)
        return err_set(err, "tensor '%s': type %s is not supported", name,
                       tr ? tr->name : "unknown");
    if (t->n_dims != 3 || t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != n || t->ne[3] != 1)
        return err_set(err, "tensor '%s': shape [%lld, %lld, %lld] (%u dims), expected [%lld, "
                            "%lld, %lld] (%lld %s)", name, (long long)t->ne[0],
                       (long long)t->ne[1], (long long)t->ne[2], t->n_dims, (long long)cols,
                       (long long)rows, (long long)n, (long long)n, what);
    size_t row = quant_row_bytes(t->type, cols);
    if (row == 0 || t->bytes < row * (size_t)(rows * n))
        return err_set(err, "tensor '%s': %zu bytes do not hold %lld rows of %lld %s elements",
                       name, t->bytes, (long long)(rows * n), (long long)cols, tr->name);
    *out = (ops_matrix){.type = t->type, .data = t->data, .rows = (int)(rows * n),
                        .cols = (int)cols, .row_bytes = row};
    return 0;
}

static int model_experts(const model *m, const char *name, int64_t rows, int64_t cols,
                         ops_matrix *out, char err[ERR_MAX])
{
    return model_stacked(m, name, m->hp.n_expert, "experts", rows, cols, out, err);
}

/* Rows [r0, r0 + n) of w, as a matrix of their own (a view: no copy): one of
 * phi3's fused matrices, or expert e's of a merged tensor (rows e * n ..). */
static ops_matrix model_rows(const ops_matrix *w, int64_t r0, int64_t n)
{
    ops_matrix v = *w;
    v.data = (const char *)w->data + (size_t)r0 * w->row_bytes;
    v.rows = (int)n;
    return v;
}

/* A layer's feed-forward with experts: the router, the merged experts and the shared
 * expert (qwen2moe's, Granite MoE Shared's). Mixtral files of an older converter (one
 * tensor per expert) are refused: they would need a copy of every expert to be merged. */
static int model_load_experts(model *m, model_layer *L, int l, char err[ERR_MAX])
{
    const model_hparams *hp = &m->hp;
    char name[96];
#define NAME(s) (snprintf(name, sizeof name, "blk.%d." s, l), name)
    if (hp->arch == MODEL_ARCH_LLAMA && !gguf_find_tensor(m->g, NAME("ffn_gate_exps.weight")) &&
        gguf_find_tensor(m->g, NAME("ffn_gate.0.weight")))
        return err_set(err, "tensor '%s': experts stored one tensor each (an older Mixtral "
                            "conversion) are not supported; convert the model again with "
                            "llama.cpp's convert_hf_to_gguf.py (merged ffn_*_exps tensors)", name);
    if (model_matrix(m, NAME("ffn_gate_inp.weight"), hp->n_expert, hp->dim, &L->router, err) < 0 ||
        model_experts(m, NAME("ffn_gate_exps.weight"), hp->n_ff_exp, hp->dim, &L->gate_exps,
                      err) < 0 ||
        model_experts(m, NAME("ffn_up_exps.weight"), hp->n_ff_exp, hp->dim, &L->up_exps, err) < 0 ||
        model_experts(m, NAME("ffn_down_exps.weight"), hp->dim, hp->n_ff_exp, &L->down_exps,
                      err) < 0)
        return -1;
    /* deepseek2's and ernie4_5-moe's selection bias (HF's e_score_correction_bias) where the
     * file has it, glm4moe's always, as llama.cpp requires it */
    bool bias = hp->arch == MODEL_ARCH_DEEPSEEK2 || hp->arch == MODEL_ARCH_ERNIE4_5_MOE;
    if (((bias && gguf_find_tensor(m->g, NAME("exp_probs_b.bias"))) ||
         hp->arch == MODEL_ARCH_GLM4MOE) &&
        model_vector(m, NAME("exp_probs_b.bias"), hp->n_expert, &L->exp_probs_b, err) < 0)
        return -1;
    /* qwen2moe's shared expert has a gate of its own, granitemoe's, deepseek2's, glm4moe's
     * and ernie4_5-moe's none */
    if (hp->n_ff_shexp &&
        ((hp->arch == MODEL_ARCH_QWEN2MOE &&
          model_vector(m, NAME("ffn_gate_inp_shexp.weight"), hp->dim, &L->shexp_gate, err) < 0) ||
         model_matrix(m, NAME("ffn_gate_shexp.weight"), hp->n_ff_shexp, hp->dim, &L->w_gate,
                      err) < 0 ||
         model_matrix(m, NAME("ffn_up_shexp.weight"), hp->n_ff_shexp, hp->dim, &L->w_up, err) < 0 ||
         model_matrix(m, NAME("ffn_down_shexp.weight"), hp->dim, hp->n_ff_shexp, &L->w_down,
                      err) < 0))
        return -1;
#undef NAME
    return 0;
}

/* A 1-D tensor, converted to f32 into m->vecs. */
static int model_vector(model *m, const char *name, int64_t n, const float **out,
                        char err[ERR_MAX])
{
    const gguf_tensor *t = model_gguf_tensor(m->g, name, 1, n, 1, err);
    if (!t)
        return -1;
    if (m->vecs_used + (size_t)n > m->vecs_cap)
        return err_set(err, "tensor '%s': internal vector space exhausted", name);
    float *dst = m->vecs + m->vecs_used;
    quant_dequantize_row(t->type, t->data, dst, n);
    m->vecs_used += (size_t)n;
    *out = dst;
    return 0;
}

/* A small 2-D tensor of rows x cols (ne [cols, rows]), converted to f32 into m->vecs:
 * gpt-oss's per-expert biases, Command-R+'s per-head q/k norms. */
static int model_table(model *m, const char *name, int64_t rows, int64_t cols, const float **out,
                       char err[ERR_MAX])
{
    const gguf_tensor *t = model_gguf_tensor(m->g, name, 2, cols, rows, err);
    if (!t)
        return -1;
    size_t n = (size_t)(rows * cols);
    if (m->vecs_used + n > m->vecs_cap)
        return err_set(err, "tensor '%s': internal vector space exhausted", name);
    float *dst = m->vecs + m->vecs_used;
    quant_dequantize_row(t->type, t->data, dst, (int64_t)n);
    m->vecs_used += n;
    *out = dst;
    return 0;
}

/* The f32 values gpt-oss's small tensors take beyond the others' (model_load_gptoss). */
static size_t model_gptoss_vecs(const model_hparams *hp)
{
    if (hp->arch != MODEL_ARCH_GPTOSS)
        return 0;
    size_t per_layer = (size_t)hp->n_head + (size_t)hp->dim + (size_t)hp->n_expert +
                       (size_t)hp->n_expert * (2 * (size_t)hp->n_ff_exp + (size_t)hp->dim);
    return per_layer * (size_t)hp->n_layer;
}

/* The f32 values starcoder2's and phi2's biases take beyond their q/k/v ones:
 * attn_output's, ffn_up's and ffn_down's of each layer, and phi2's output.bias. */
static size_t model_linear_bias_vecs(const model_hparams *hp)
{
    if (hp->arch != MODEL_ARCH_STARCODER2 && hp->arch != MODEL_ARCH_PHI2)
        return 0;
    return (2 * (size_t)hp->dim + (size_t)hp->n_ff) * (size_t)hp->n_layer +
           (hp->arch == MODEL_ARCH_PHI2 ? (size_t)hp->n_vocab : 0);
}

/* gpt-oss's tensors of layer l beyond llama's with experts (its q/k/v biases are qwen2's):
 * the attention sinks (attn_sinks.weight, one per head: a file without them would be
 * another model), the attention output's bias, the router's bias and each expert's
 * gate, up and down biases (2-D, one row per expert). */
static int model_load_gptoss(model *m, model_layer *L, int l, char err[ERR_MAX])
{
    const model_hparams *hp = &m->hp;
    char name[96];
#define NAME(s) (snprintf(name, sizeof name, "blk.%d." s, l), name)
    if (model_vector(m, NAME("attn_sinks.weight"), hp->n_head, &L->attn_sinks, err) < 0 ||
        model_vector(m, NAME("attn_output.bias"), hp->dim, &L->bo, err) < 0 ||
        model_vector(m, NAME("ffn_gate_inp.bias"), hp->n_expert, &L->router_b, err) < 0 ||
        model_table(m, NAME("ffn_gate_exps.bias"), hp->n_expert, hp->n_ff_exp, &L->gate_exps_b,
                    err) < 0 ||
        model_table(m, NAME("ffn_up_exps.bias"), hp->n_expert, hp->n_ff_exp, &L->up_exps_b,
                    err) < 0 ||
        model_table(m, NAME("ffn_down_exps.bias"), hp->n_expert, hp->dim, &L->down_exps_b,
                    err) < 0)
        return -1;
#undef NAME
    return 0;
}

/* A fused matrix of rows rows (what they are, for the message) of dim columns. */
static int model_fused(const model *m, const char *name, int64_t rows, const char *what,
                       ops_matrix *out, char err[ERR_MAX])
{
    const gguf_tensor *t = gguf_find_tensor(m->g, name);
    if (t && (t->n_dims != 2 || t->ne[0] != m->hp.dim || t->ne[1] != rows))
        return err_set(err, "tensor '%s': shape [%lld, %lld] (%u dims), expected [%d, %lld]: "
                            "its rows must add up to %s", name, (long long)t->ne[0],
                       (long long)t->ne[1], t->n_dims, m->hp.dim, (long long)rows, what);
    return model_matrix(m, name, rows, m->hp.dim, out, err);
}

/* Layer l's q, k and v in one attn_qkv (q's rows, then k's, then v's: Phi-2's older
 * conversions, ChatGLM's query_key_value), read as views of its rows, and its bias split
 * the same way: required where bias_required, else read where the file has it. */
static int model_load_fused_qkv(model *m, model_layer *L, int l, bool bias_required,
                                char err[ERR_MAX])
{
    const model_hparams *hp = &m->hp;
    int64_t q_dim = (int64_t)hp->n_head * hp->head_dim;
    int64_t kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    char name[96];
#define NAME(s) (snprintf(name, sizeof name, "blk.%d." s, l), name)
    ops_matrix qkv;
    if (model_fused(m, NAME("attn_qkv.weight"), q_dim + 2 * kv_dim,
                    "n_head * head_dim + 2 * n_head_kv * head_dim (q, k, v)", &qkv, err) < 0)
        return -1;
    L->wq = model_rows(&qkv, 0, q_dim);
    L->wk = model_rows(&qkv, q_dim, kv_dim);
    L->wv = model_rows(&qkv, q_dim + kv_dim, kv_dim);
    if (!bias_required && !gguf_find_tensor(m->g, NAME("attn_qkv.bias")))
        return 0;
    const float *b;
    if (model_vector(m, NAME("attn_qkv.bias"), q_dim + 2 * kv_dim, &b, err) < 0)
        return -1;
    L->extras.bq = b;
    L->extras.bk = b + q_dim;
    L->extras.bv = b + q_dim + kv_dim;
    return 0;
#undef NAME
}

/* LongRoPE (Phi-3-mini-128k, Phi-3.5-mini, Phi-4-mini): rope_factors_long.weight and
 * rope_factors_short.weight, both or neither, divide each pair's frequency; which of them
 * is the runner's choice. Their attention factor multiplies cos and sin: the file's
 * rope.scaling.attn_factor, else sqrt(1 + ln s / ln orig) for s = n_ctx / orig as
 * Hugging Face's Phi3 computes it (1 when s <= 1). */
static int model_read_longrope(model *m, char err[ERR_MAX])
{
    model_hparams *hp = &m->hp;
    bool has_long = gguf_find_tensor(m->g, "rope_factors_long.weight") != NULL;
    bool has_short = gguf_find_tensor(m->g, "rope_factors_short.weight") != NULL;
    if (!has_long && !has_short)
        return 0;
    if (has_long != has_short)
        return err_set(err, "tensor 'rope_factors_%s.weight' is missing (LongRoPE has long and "
                            "short factors)", has_long ? "short" : "long");
    if (m->rope_freqs)
        return err_set(err, "tensor 'rope_freqs.weight' beside LongRoPE's factors: one kind "
                            "of frequency factors, not both");
    if (hp->rope_scaling.freq_scale != 1.0f || hp->rope_scaling.ext_factor != 0.0f)
        return err_set(err, "LongRoPE factors beside rope scaling of another kind");
    if (model_vector(m, "rope_factors_long.weight", hp->rope_dims / 2, &m->rope_long, err) < 0 ||
        model_vector(m, "rope_factors_short.weight", hp->rope_dims / 2, &m->rope_short, err) < 0)
        return -1;
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.attn_factor", model_arch_name(hp->arch));
    double s = (double)m->n_ctx_train / hp->rope_orig_ctx;
    if (gguf_find_key(m->g, key) < 0 && s > 1.0 && hp->rope_orig_ctx > 1)
        hp->rope_scaling.mscale = (float)sqrt(1.0 + log(s) / log((double)hp->rope_orig_ctx));
    return 0;
}

/* GLM-4's (and ChatGLM's) q, k, v and feed-forward matrices of layer l, as llama.cpp
 * reads them: q, k, v separate, with biases where the file has them (all three or none:
 * GLM-4-0414's attention_bias), or one attn_qkv with an optional bias of q, k and v back
 * to back (ChatGLM's query_key_value, which llama.cpp reads for glm4 as well); gate and up
 * in one ffn_up of 2 n_ff rows, the gate's first (Glm4MLP's gate_up_proj, chunked in two),
 * read as views as phi3's. */
static int model_load_glm4(model *m, model_layer *L, int l, char err[ERR_MAX])
{
    const model_hparams *hp = &m->hp;
    int64_t q_dim = (int64_t)hp->n_head * hp->head_dim;
    int64_t kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    char name[96];
#define NAME(s) (snprintf(name, sizeof name, "blk.%d." s, l), name)
    ops_matrix gate_up;
    if (model_fused(m, NAME("ffn_up.weight"), 2 * (int64_t)hp->n_ff,
                    "2 * feed_forward_length (gate, up)", &gate_up, err) < 0 ||
        model_matrix(m, NAME("ffn_down.weight"), hp->dim, hp->n_ff, &L->w_down, err) < 0)
        return -1;
    L->w_gate = model_rows(&gate_up, 0, hp->n_ff);
    L->w_up = model_rows(&gate_up, hp->n_ff, hp->n_ff);
    if (gguf_find_tensor(m->g, NAME("attn_qkv.weight")))
        return model_load_fused_qkv(m, L, l, false, err);
    if (model_matrix(m, NAME("attn_q.weight"), q_dim, hp->dim, &L->wq, err) < 0 ||
        model_matrix(m, NAME("attn_k.weight"), kv_dim, hp->dim, &L->wk, err) < 0 ||
        model_matrix(m, NAME("attn_v.weight"), kv_dim, hp->dim, &L->wv, err) < 0)
        return -1;
    bool biases = gguf_find_tensor(m->g, NAME("attn_q.bias")) ||
                  gguf_find_tensor(m->g, NAME("attn_k.bias")) ||
                  gguf_find_tensor(m->g, NAME("attn_v.bias"));
    if (biases &&
        (model_vector(m, NAME("attn_q.bias"), q_dim, &L->extras.bq, err) < 0 ||
         model_vector(m, NAME("attn_k.bias"), kv_dim, &L->extras.bk, err) < 0 ||
         model_vector(m, NAME("attn_v.bias"), kv_dim, &L->extras.bv, err) < 0))
        return -1;
#undef NAME
    return 0;
}

/* A deepseek2 layer of the older converter: attn_kv_b (n_head * (mla_qk_nope + mla_v_dim),
 * mla_kv_rank), each head's key rows then its value rows, as HF's kv_b_proj. The value
 * rows are read in place (wv_b, a head every wv_b_stride rows); the key rows' transpose,
 * which maps the queries into the latent, is copied out in f32 (m->mla_k_b). */
static int model_load_mla_kv_b(model *m, model_layer *L, int l, char err[ERR_MAX])
{
    const model_hparams *hp = &m->hp;
    int nope = hp->mla_qk_nope, rank = hp->mla_kv_rank, stride = nope + hp->mla_v_dim;
    char name[96];
    snprintf(name, sizeof name, "blk.%d.attn_kv_b.weight", l);
    ops_matrix kv_b;
    if (model_matrix(m, name, (int64_t)hp->n_head * stride, rank, &kv_b, err) < 0)
        return -1;
    L->wv_b = model_rows(&kv_b, nope, (int64_t)hp->n_head * stride - nope);
    L->wv_b_stride = stride;
    /* made once the first layer's tensor showed that the file holds sizes of its order */
    size_t per_layer = (size_t)hp->n_head * rank * nope;
    if (!m->mla_k_b && !(m->mla_k_b = malloc((size_t)hp->n_layer * per_layer * sizeof(float))))
        return err_set(err, "out of memory for %zu bytes of attn_k_b",
                       (size_t)hp->n_layer * per_layer * sizeof(float));
    float *k_b = m->mla_k_b + (size_t)l * per_layer, *row = malloc(rank * sizeof *row);
    if (!row)
        return err_set(err, "out of memory");
    for (int h = 0; h < hp->n_head; h++)
        for (int c = 0; c < nope; c++) {
            const char *key_row = (const char *)kv_b.data + ((size_t)h * stride + c) * kv_b.row_bytes;
            quant_dequantize_row(kv_b.type, key_row, row, rank);
            for (int i = 0; i < rank; i++)
                k_b[((size_t)h * rank + i) * nope + c] = row[i];
        }
    free(row);
    L->wk_b = (ops_matrix){.type = QTYPE_F32, .data = k_b, .rows = hp->n_head * rank,
                           .cols = nope, .row_bytes = (size_t)nope * sizeof(float)};
    return 0;
}

/* deepseek2's attention tensors of layer l (model_layer). attn_k_b and attn_v_b are 3-D, a
 * matrix per head, read as one matrix of all the heads' rows (as merged experts). */
static int model_load_mla(model *m, model_layer *L, int l, char err[ERR_MAX])
{
    const model_hparams *hp = &m->hp;
    int64_t heads = hp->n_head, q_dim = heads * (hp->mla_qk_nope + hp->rope_dims);
    char name[96];
#define NAME(s) (snprintf(name, sizeof name, "blk.%d." s, l), name)
    if (hp->mla_q_rank > 0
            ? model_vector(m, NAME("attn_q_a_norm.weight"), hp->mla_q_rank, &L->q_a_norm,
                           err) < 0 ||
                  model_matrix(m, NAME("attn_q_a.weight"), hp->mla_q_rank, hp->dim, &L->wq_a,
                               err) < 0 ||
                  model_matrix(m, NAME("attn_q_b.weight"), q_dim, hp->mla_q_rank, &L->wq,
                               err) < 0
            : model_matrix(m, NAME("attn_q.weight"), q_dim, hp->dim, &L->wq, err) < 0)
        return -1;
    L->wv_b_stride = hp->mla_v_dim;
    if (m->mla_kv_b ? model_load_mla_kv_b(m, L, l, err) < 0
                   : model_stacked(m, NAME("attn_k_b.weight"), heads, "heads", hp->mla_kv_rank,
                                   hp->mla_qk_nope, &L->wk_b, err) < 0 ||
                         model_stacked(m, NAME("attn_v_b.weight"), heads, "heads",
                                       hp->mla_v_dim, hp->mla_kv_rank, &L->wv_b, err) < 0)
        return -1;
    if (model_vector(m, NAME("attn_kv_a_norm.weight"), hp->mla_kv_rank, &L->kv_a_norm, err) < 0 ||
        model_matrix(m, NAME("attn_kv_a_mqa.weight"), hp->mla_kv_rank + hp->rope_dims, hp->dim,
                     &L->wkv_a, err) < 0)
        return -1;
#undef NAME
    return 0;
}

/* StableLM's, StarCoder2's and Phi-2's LayerNorms have biases, Cohere's none. */
static bool model_norms_have_biases(const model_hparams *hp)
{
    return hp->norm == MODEL_NORM_LAYER && hp->arch != MODEL_ARCH_COMMAND_R &&
           hp->arch != MODEL_ARCH_COHERE2;
}

/* Whether layer l of a Phi-2 file fuses q, k and v in one matrix. */
static bool model_phi2_fused_qkv(const model *m, int l)
{
    char name[96];
    snprintf(name, sizeof name, "blk.%d.attn_qkv.weight", l);
    return m->hp.arch == MODEL_ARCH_PHI2 && gguf_find_tensor(m->g, name);
}

/* Layer l's norms and matrices: attention's and the feed-forward's (its experts'). */
static int model_load_layer_matrices(model *m, model_layer *L, int l, char err[ERR_MAX])
{
    const model_hparams *hp = &m->hp;
    int64_t q_dim = (int64_t)hp->n_head * hp->head_dim;
    int64_t kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    bool layer_norm = model_norms_have_biases(hp), gptoss = hp->arch == MODEL_ARCH_GPTOSS;
    bool gated = hp->ffn_act != MODEL_FFN_GELU_TANH_UNGATED;
    bool mla = hp->arch == MODEL_ARCH_DEEPSEEK2, phi2_qkv = model_phi2_fused_qkv(m, l);
    int64_t wo_cols = mla ? (int64_t)hp->n_head * hp->mla_v_dim : q_dim;
    char name[96];
#define NAME(s) (snprintf(name, sizeof name, "blk.%d." s, l), name)
    if ((hp->pre_norms &&
         (model_vector(m, NAME("attn_norm.weight"), hp->dim, &L->attn_norm, err) < 0 ||
          /* gpt-oss's and Seed-OSS's converters name the feed-forward's norm after
           * HF's post_attention_layernorm; a parallel layer has none */
          (!hp->parallel &&
           model_vector(m, gptoss || hp->arch == MODEL_ARCH_SEED_OSS ||
                                   hp->arch == MODEL_ARCH_GLM4MOE
                               ? NAME("post_attention_norm.weight")
                               : NAME("ffn_norm.weight"),
                        hp->dim, &L->ffn_norm, err) < 0))) ||
        (layer_norm &&
         (model_vector(m, NAME("attn_norm.bias"), hp->dim, &L->attn_norm_b, err) < 0 ||
          (!hp->parallel &&
           model_vector(m, NAME("ffn_norm.bias"), hp->dim, &L->ffn_norm_b, err) < 0))) ||
        model_matrix(m, NAME("attn_output.weight"), hp->dim, wo_cols, &L->wo, err) < 0)
        return -1;
    /* StableLM 2 12B: per-head q/k LayerNorms and a parallel residual (no ffn_norm,
     * which the line above requires), llama.cpp's optional tensors; not computed here */
    if (hp->arch == MODEL_ARCH_STABLELM && gguf_find_tensor(m->g, NAME("attn_q_norm.weight")))
        return err_set(err, "tensor '%s': StableLM 2 12B's per-head q/k LayerNorms are not "
                            "supported", name);
    if (hp->arch == MODEL_ARCH_GLM4 || hp->arch == MODEL_ARCH_CHATGLM) {
        if (model_load_glm4(m, L, l, err) < 0)
            return -1;
    } else if (hp->arch == MODEL_ARCH_PHI3) { /* fused q, k, v and gate, up */
        ops_matrix qkv, gate_up;
        if (model_fused(m, NAME("attn_qkv.weight"), q_dim + 2 * kv_dim,
                        "n_head * head_dim + 2 * n_head_kv * head_dim (q, k, v)", &qkv,
                        err) < 0 ||
            model_fused(m, NAME("ffn_up.weight"), 2 * (int64_t)hp->n_ff,
                        "2 * feed_forward_length (gate, up)", &gate_up, err) < 0 ||
            model_matrix(m, NAME("ffn_down.weight"), hp->dim, hp->n_ff, &L->w_down, err) < 0)
            return -1;
        L->wq = model_rows(&qkv, 0, q_dim);
        L->wk = model_rows(&qkv, q_dim, kv_dim);
        L->wv = model_rows(&qkv, q_dim + kv_dim, kv_dim);
        L->w_gate = model_rows(&gate_up, 0, hp->n_ff);
        L->w_up = model_rows(&gate_up, hp->n_ff, hp->n_ff);
    } else if ((mla        ? model_load_mla(m, L, l, err) < 0
                : phi2_qkv ? model_load_fused_qkv(m, L, l, true, err) < 0
                           : model_matrix(m, NAME("attn_q.weight"), q_dim, hp->dim, &L->wq,
                                          err) < 0 ||
                                 model_matrix(m, NAME("attn_k.weight"), kv_dim, hp->dim,
                                              &L->wk, err) < 0 ||
                                 model_matrix(m, NAME("attn_v.weight"), kv_dim, hp->dim,
                                              &L->wv, err) < 0) ||
               (model_layer_has_experts(hp, l) ? model_load_experts(m, L, l, err) < 0
                             : (gated && model_matrix(m, NAME("ffn_gate.weight"), hp->n_ff,
                                                      hp->dim, &L->w_gate, err) < 0) ||
                                   model_matrix(m, NAME("ffn_up.weight"), hp->n_ff, hp->dim,
                                                &L->w_up, err) < 0 ||
                                   model_matrix(m, NAME("ffn_down.weight"), hp->dim,
                                                hp->n_ff, &L->w_down, err) < 0))
        return -1;
#undef NAME
    return 0;
}

/* Layer l's vectors beside its matrices: biases, per-head and whole q/k norms, post
 * norms, gpt-oss's own; a gated feed-forward's biases refused. */
static int model_load_layer_extras(model *m, model_layer *L, int l, char err[ERR_MAX])
{
    const model_hparams *hp = &m->hp;
    int64_t q_dim = (int64_t)hp->n_head * hp->head_dim;
    int64_t kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    bool phi2 = hp->arch == MODEL_ARCH_PHI2, gptoss = hp->arch == MODEL_ARCH_GPTOSS;
    bool qwen2 = hp->arch == MODEL_ARCH_QWEN2 || hp->arch == MODEL_ARCH_QWEN2MOE || gptoss;
    bool qk_norm = hp->arch == MODEL_ARCH_QWEN3 || hp->arch == MODEL_ARCH_QWEN3MOE ||
                   hp->arch == MODEL_ARCH_GEMMA3 || hp->arch == MODEL_ARCH_EXAONE4 ||
                   hp->arch == MODEL_ARCH_HUNYUAN_DENSE;
    bool starcoder2 = hp->arch == MODEL_ARCH_STARCODER2;
    bool gated = hp->ffn_act != MODEL_FFN_GELU_TANH_UNGATED;
    bool mla = hp->arch == MODEL_ARCH_DEEPSEEK2, phi2_qkv = model_phi2_fused_qkv(m, l);
    char name[96];
#define NAME(s) (snprintf(name, sizeof name, "blk.%d." s, l), name)
    /* q/k/v biases: required of qwen2's family, StarCoder2's and Phi-2's; any other
     * architecture's where the file has them (all three: StableLM 2 1.6B's, InternLM2's,
     * llama conversions of models with attention_bias), as llama.cpp's loader takes them
     * for every architecture; GLM-4's and fused attn_qkv's are their loaders' */
    bool own_qkv = phi2_qkv || mla || hp->arch == MODEL_ARCH_GLM4 ||
                   hp->arch == MODEL_ARCH_CHATGLM;
    bool biases = qwen2 || starcoder2 || (phi2 && !phi2_qkv) ||
                  (!own_qkv && (gguf_find_tensor(m->g, NAME("attn_q.bias")) ||
                                gguf_find_tensor(m->g, NAME("attn_k.bias")) ||
                                gguf_find_tensor(m->g, NAME("attn_v.bias"))));
    if (biases &&
        (model_vector(m, NAME("attn_q.bias"), q_dim, &L->extras.bq, err) < 0 ||
         model_vector(m, NAME("attn_k.bias"), kv_dim, &L->extras.bk, err) < 0 ||
         model_vector(m, NAME("attn_v.bias"), kv_dim, &L->extras.bv, err) < 0))
        return -1;
    /* the output bias where the file has one (as llama.cpp's loader takes it) */
    if (!starcoder2 && !phi2 && !gptoss && gguf_find_tensor(m->g, NAME("attn_output.bias")) &&
        model_vector(m, NAME("attn_output.bias"), hp->dim, &L->bo, err) < 0)
        return -1;
    /* a gated feed-forward's biases (llama.cpp's optional ones) are not computed here:
     * refused rather than left out */
    static const char *const ffn_biases[] = {"ffn_gate.bias", "ffn_up.bias", "ffn_down.bias"};
    for (int i = 0; gated && !model_layer_has_experts(hp, l) && i < 3; i++) {
        snprintf(name, sizeof name, "blk.%d.%s", l, ffn_biases[i]);
        if (gguf_find_tensor(m->g, name))
            return err_set(err, "tensor '%s': biases of a gated feed-forward are not "
                                "supported", name);
    }
    /* GLM-4.5 355B's per-head q/k norms, optional as llama.cpp has them */
    bool glm4moe_norms = hp->arch == MODEL_ARCH_GLM4MOE &&
                         (gguf_find_tensor(m->g, NAME("attn_q_norm.weight")) ||
                          gguf_find_tensor(m->g, NAME("attn_k_norm.weight")));
    if ((qk_norm || glm4moe_norms) &&
        (model_vector(m, NAME("attn_q_norm.weight"), hp->head_dim, &L->extras.q_norm, err) < 0 ||
         model_vector(m, NAME("attn_k_norm.weight"), hp->head_dim, &L->extras.k_norm, err) < 0))
        return -1;
    /* in the space of qwen2's biases, which olmoe and olmo2 have not */
    if ((hp->arch == MODEL_ARCH_OLMOE || hp->arch == MODEL_ARCH_OLMO2) &&
        (model_vector(m, NAME("attn_q_norm.weight"), q_dim, &L->extras.q_norm_all, err) < 0 ||
         model_vector(m, NAME("attn_k_norm.weight"), kv_dim, &L->extras.k_norm_all, err) < 0))
        return -1;
    if (gptoss && model_load_gptoss(m, L, l, err) < 0)
        return -1;
    /* Command-R+'s per-head q/k LayerNorms ((head_dim, n_head) tensors): both or none,
     * as HF's use_qk_norm; llama.cpp requires them of 64 layers and more */
    if (hp->arch == MODEL_ARCH_COMMAND_R &&
        (hp->n_layer >= 64 || gguf_find_tensor(m->g, NAME("attn_q_norm.weight")) ||
         gguf_find_tensor(m->g, NAME("attn_k_norm.weight"))) &&
        (model_table(m, NAME("attn_q_norm.weight"), hp->n_head, hp->head_dim,
                     &L->extras.q_norm_heads, err) < 0 ||
         model_table(m, NAME("attn_k_norm.weight"), hp->n_head_kv, hp->head_dim,
                     &L->extras.k_norm_heads, err) < 0))
        return -1;
    /* every Linear of Starcoder2 (use_bias, as the published models and llama.cpp's
     * loader have them) and of Phi-2 has a bias */
    if ((starcoder2 || phi2) &&
        (model_vector(m, NAME("attn_output.bias"), hp->dim, &L->bo, err) < 0 ||
         model_vector(m, NAME("ffn_up.bias"), hp->n_ff, &L->b_up, err) < 0 ||
         model_vector(m, NAME("ffn_down.bias"), hp->dim, &L->b_down, err) < 0))
        return -1;
    if (hp->post_norms &&
        (model_vector(m, NAME("post_attention_norm.weight"), hp->dim, &L->attn_post_norm,
                      err) < 0 ||
         model_vector(m, NAME("post_ffw_norm.weight"), hp->dim, &L->ffn_post_norm, err) < 0))
        return -1;
#undef NAME
    return 0;
}

static int model_load_tensors(model *m, char err[ERR_MAX])
{
    const model_hparams *hp = &m->hp;
    int64_t q_dim = (int64_t)hp->n_head * hp->head_dim;
    int64_t kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;

    const gguf_tensor *emb = gguf_find_tensor(m->g, "token_embd.weight");
    if (!emb)
        return err_set(err, "tensor 'token_embd.weight' is missing");
    if (emb->n_dims != 2 || emb->ne[1] <= 0 || emb->ne[1] > INT32_MAX / 2)
        return err_set(err, "tensor 'token_embd.weight': bad shape");
    m->hp.n_vocab = (int)emb->ne[1];
    if (model_matrix(m, "token_embd.weight", hp->n_vocab, hp->dim, &m->tok_embd, err) < 0)
        return -1;

    /* per layer q_dim + 2 kv_dim: qwen2's biases, or command-r's per-head q/k norms; one
     * dim of them the output bias any file may have */
    m->vecs_cap = 2 * (size_t)hp->dim + 3 * (size_t)(hp->rope_dims / 2) +
                  (size_t)hp->n_layer * (5 * hp->dim + q_dim + 2 * kv_dim + 2 * hp->head_dim) +
                  (size_t)hp->n_layer * (hp->mla_q_rank + hp->mla_kv_rank + hp->n_expert) +
                  model_gptoss_vecs(hp) + model_linear_bias_vecs(hp);
    m->vecs = malloc(m->vecs_cap * sizeof(float));
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->vecs || !m->layers)
        return err_set(err, "out of memory");
    char key[96];
    snprintf(key, sizeof key, "%s.attention.key_length_mla", hp->file_arch);
    m->mla_kv_b = hp->arch == MODEL_ARCH_DEEPSEEK2 && gguf_find_key(m->g, key) < 0;

    if (model_vector(m, "output_norm.weight", hp->dim, &m->output_norm, err) < 0 ||
        (model_norms_have_biases(hp) &&
         model_vector(m, "output_norm.bias", hp->dim, &m->output_norm_b, err) < 0))
        return -1;
    /* Llama 3.1 and later: each dimension pair's RoPE frequency is divided by its factor,
     * as llama.cpp's rope_factors do; ignored, every position rotated as in another model. */
    if (gguf_find_tensor(m->g, "rope_freqs.weight") &&
        model_vector(m, "rope_freqs.weight", hp->rope_dims / 2, &m->rope_freqs, err) < 0)
        return -1;
    if (model_read_longrope(m, err) < 0)
        return -1;
    bool phi2 = hp->arch == MODEL_ARCH_PHI2;
    /* Phi-2's lm_head has a bias: its own matrix, required (as llama.cpp requires it) */
    if (phi2 && model_vector(m, "output.bias", hp->n_vocab, &m->output_b, err) < 0)
        return -1;
    if (phi2 || gguf_find_tensor(m->g, "output.weight")) {
        if (model_matrix(m, "output.weight", hp->n_vocab, hp->dim, &m->output, err) < 0)
            return -1;
    } else {
        m->output = m->tok_embd;
    }
    for (int l = 0; l < hp->n_layer; l++)
        if (model_load_layer_matrices(m, &m->layers[l], l, err) < 0 ||
            model_load_layer_extras(m, &m->layers[l], l, err) < 0)
            return -1;
    return 0;
}

model *model_from_gguf(const gguf_file *g, char err[ERR_MAX])
{
    model *m = calloc(1, sizeof *m);
    if (!m) {
        err_set(err, "out of memory");
        return NULL;
    }
    m->g = g;
    if (model_read_hparams(m, err) < 0 || model_load_tensors(m, err) < 0) {
        model_free(m);
        return NULL;
    }
    return m;
}

model *model_load(const char *path, char err[ERR_MAX])
{
    return model_load_as(path, GGUF_LOAD_MAP, err);
}

model *model_load_as(const char *path, gguf_load how, char err[ERR_MAX])
{
    gguf_file *g = gguf_open_as(path, how, err);
    if (!g)
        return NULL;
    model *m = model_from_gguf(g, err);
    if (!m) {
        gguf_close(g);
        return NULL;
    }
    m->owned = g;
    m->mapped = how == GGUF_LOAD_MAP;
    return m;
}

/* The weight matrices of layer L that it has into w (at most MODEL_LAYER_MATRICES), the
 * stacked ones (merged experts, deepseek2's per-head attn_k_b and attn_v_b), which the
 * forward reads in slices, only when `stacked`; how many. */
static int model_layer_matrices(model_layer *L, bool stacked, ops_matrix **w)
{
    ops_matrix *all[] = {&L->wq,        &L->wk,      &L->wv,        &L->wo,
                         &L->w_gate,    &L->w_up,    &L->w_down,    &L->router,
                         &L->wq_a,      &L->wkv_a,   &L->gate_exps, &L->up_exps,
                         &L->down_exps, &L->wk_b,    &L->wv_b};
    size_t n_all = sizeof all / sizeof all[0] - (stacked ? 0 : 5); /* the stacked ones last */
    int k = 0;
    for (size_t i = 0; i < n_all; i++)
        if (all[i]->data)
            w[k++] = all[i];
    return k;
}

/* Every weight matrix m multiplies with (the token embedding is read by rows: when the
 * file ties the output matrix to it, the output is a matrix of its own here) but the
 * merged experts, whose experts are taken out of the file's layout (model_rows); *n
 * set. */
static ops_matrix **model_matrices(model *m, ops_matrix **w, int *n)
{
    int k = 0;
    w[k++] = &m->output;
    for (int l = 0; l < m->hp.n_layer; l++)
        k += model_layer_matrices(&m->layers[l], false, w + k);
    *n = k;
    return w;
}

/* Matrices worth repacking: a kernel for their type and at least one whole group. */
static bool model_repackable(const ops_matrix *w)
{
    return quant_repack_kernel(w->type) && w->rows >= QUANT_REPACK_ROWS && !w->repacked;
}

int model_repack_weights(model *m, char err[ERR_MAX])
{
    if (m->base)
        return err_set(err, "a model with adapters reads its base's weights: repack the base");
    if (m->repacked)
        return 0;
    ops_matrix **w = malloc((1 + MODEL_LAYER_MATRICES * (size_t)m->hp.n_layer) * sizeof *w);
    if (!w)
        return err_set(err, "out of memory");
    int n;
    model_matrices(m, w, &n);
    size_t bytes = 0;
    for (int i = 0; i < n; i++)
        if (model_repackable(w[i]))
            bytes += ((size_t)w[i]->rows * w[i]->row_bytes + 63) & ~(size_t)63;
    if (bytes == 0) {
        free(w);
        return 0;
    }
    /* huge pages, as GGUF_LOAD_COPY gives the weights: decode streams them every token */
    void *dst = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (dst == MAP_FAILED) {
        free(w);
        return err_set(err, "repacking weights: %zu bytes: out of memory", bytes);
    }
    (void)madvise(dst, bytes, MADV_HUGEPAGE);
    long page = sysconf(_SC_PAGESIZE);
    char *p = dst;
    for (int i = 0; i < n; i++) {
        if (!model_repackable(w[i]))
            continue;
        const void *src = w[i]->data;
        size_t size = (size_t)w[i]->rows * w[i]->row_bytes;
        ops_matrix_repack(w[i], p, w[i]);
        p += (size + 63) & ~(size_t)63;
        /* a copy the model owns is read by nothing else (but a tied token embedding):
         * give back its pages (whole pages inside the matrix; a mapping's stay in the
         * page cache, reclaimable) */
        if (m->owned && !m->mapped && src != m->tok_embd.data) {
            uintptr_t a = ((uintptr_t)src + (uintptr_t)page - 1) & ~(uintptr_t)(page - 1);
            uintptr_t e = ((uintptr_t)src + size) & ~(uintptr_t)(page - 1);
            if (e > a && madvise((void *)a, e - a, MADV_DONTNEED) == 0)
                m->repack_given_back += e - a;
        }
    }
    (void)mprotect(dst, bytes, PROT_READ);
    free(w);
    m->repacked = dst;
    m->repacked_bytes = bytes;
    return 0;
}

size_t model_repacked_bytes(const model *m)
{
    return m->repacked_bytes - m->repack_given_back;
}

void model_free(model *m)
{
    if (!m)
        return;
    if (m->repacked)
        munmap(m->repacked, m->repacked_bytes);
    gguf_close(m->owned);
    free(m->layers);
    free(m->vecs);
    free(m->mla_k_b);
    free(m);
}

model *model_with_loras(const model *base, int n, const lora *const *adapters,
                        const float *scales, char err[ERR_MAX])
{
    if (base->base) {
        err_set(err, "the model already has adapters: give model_with_loras the model loaded "
                     "from the file, with all of them");
        return NULL;
    }
    if (n < 0 || n > MODEL_LORA_MAX) {
        err_set(err, "%d adapters: a model takes at most %d adapters", n, MODEL_LORA_MAX);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        if (!isfinite(scales[i])) {
            err_set(err, "the scale of adapter %d is not a number", i);
            return NULL;
        }
        if (lora_base(adapters[i]) != base) {
            err_set(err, "adapter %d was checked against another base model", i);
            return NULL;
        }
    }
    model *v = calloc(1, sizeof *v);
    if (!v) {
        err_set(err, "out of memory");
        return NULL;
    }
    /* what a view reads of its own: the base's, fixed once loaded (not its matrices, which
     * model_repack_weights may replace later: those are read from base) */
    v->hp = base->hp;
    v->g = base->g;
    v->output_norm = base->output_norm;
    v->output_norm_b = base->output_norm_b;
    v->rope_freqs = base->rope_freqs;
    v->rope_long = base->rope_long;
    v->rope_short = base->rope_short;
    v->mapped = base->mapped;
    v->base = base;
    v->n_lora = n;
    for (int i = 0; i < n; i++) {
        v->lora[i] = adapters[i];
        v->lora_scale[i] = scales[i];
        if (lora_max_rank(adapters[i]) > v->lora_rank)
            v->lora_rank = lora_max_rank(adapters[i]);
    }
    return v;
}

const model *model_base(const model *m)
{
    return m->base ? m->base : m;
}

int model_n_loras(const model *m)
{
    return m->n_lora;
}

const model_hparams *model_hparams_of(const model *m)
{
    return &m->hp;
}

const float *model_rope_freqs(const model *m)
{
    return m->rope_freqs;
}

const gguf_file *model_gguf(const model *m)
{
    return m->g;
}

/* y = the norm of x (dim) by w and, for a LayerNorm, b: the model's kind (hp->norm). */
static void model_norm_row(const model_hparams *hp, float *y, const float *x, const float *w,
                           const float *b)
{
    if (hp->norm == MODEL_NORM_LAYER)
        ops_layernorm(y, x, w, b, hp->dim, hp->norm_eps);
    else
        ops_rmsnorm(y, x, w, hp->dim, hp->norm_eps);
}

void model_layer_tensors_of(const model *m, int layer, model_layer_tensors *out)
{
    const model_layer *L = &model_base(m)->layers[layer];
    *out = (model_layer_tensors){
        .attn_norm = L->attn_norm,
        .ffn_norm = L->ffn_norm,
        .extras = L->extras,
        .wq = L->wq,
        .wk = L->wk,
        .wv = L->wv,
        .wo = L->wo,
        .w_gate = L->w_gate,
        .w_up = L->w_up,
        .w_down = L->w_down,
        .bo = L->bo,
    };
}

const ops_matrix *model_token_embedding(const model *m)
{
    return &model_base(m)->tok_embd;
}

const ops_matrix *model_output_matrix(const model *m)
{
    return &model_base(m)->output;
}

const float *model_output_norm_weight(const model *m)
{
    return model_base(m)->output_norm;
}

void model_output_norm(const model *m, const float *x, float *y)
{
    model_norm_row(&m->hp, y, x, m->output_norm, m->output_norm_b);
}

kv_shape model_kv_shape(const model *m)
{
    return (kv_shape){m->hp.n_layer, m->hp.n_head_kv, m->hp.head_dim, m->hp.mla_kv_rank > 0};
}

/* ---- runner ---- */

/* One sequence's share of a forward step: rows [t0, t0 + n) of batch b, evaluated against
 * seq as the stacked rows [r0, r0 + n). */
typedef struct model_part {
    kv_seq *seq;
    const model_batch *b;
    const model *m; /* the model its rows run as: b->model, or the runner's */
    int t0, n, r0;
    int o0, o1;     /* its out rows in this step: b->out_rows[o0 .. o1) */
    int n_before;   /* entries of seq before the forward */
    int n_kv;       /* entries of seq once this step's rows are appended */
    int n_kv_total; /* entries once the whole batch is appended (attn's row length) */
} model_part;

/* Logit rows per output matrix product when the out rows' destinations are not one
 * contiguous array (several sequences): bounds the staging buffer, not the batch. */
#define MODEL_LOGITS_STAGE 64

/* One weight matrix, for residency by size (model_runner_stream_weights). */
typedef struct model_frag {
    const void *data;
    size_t bytes;
    int layer;     /* -1: token embedding and output */
    bool streamed; /* released after use, prefetched before */
} model_frag;

struct model_runner {
    const model *m; /* the model it runs: with a view's adapters (model_with_loras) */
    const model *w; /* whose matrices it reads: model_base(m) */
    /* A runner of model_runner_new_shared: the runner whose pool and scratch it uses (the
     * pointers below are that runner's, but lora_t when it is own_t), else NULL. */
    const model_runner *owner;
    float *own_t;   /* lora_t when model_runner_reserve_lora made it, else NULL */
    size_t own_bytes;
    tp_pool *pool;
    offload *gpu;              /* model_runner_use_gpu's GPU, or NULL */
    const _Atomic bool *abort; /* model_runner_set_abort's flag, or NULL */
    bool aborted;              /* the last model_forward_rows stopped at *abort */
    model_pause *pause;        /* model_runner_set_pause's, or NULL */
    model_pause *keeping;      /* the pause the forward under way stops into, or NULL */
    int first_layer;           /* the layer it starts at: > 0 when it goes on from keeping */
    int max_batch;
    int max_kv;
    int attn_rows;   /* query rows per batched-attention block */
    /* (rope_dims/2) RoPE frequency divisors of its positions: the file's rope_freqs, or
     * LongRoPE's long or short factors by max_kv (as llama.cpp chooses them by its
     * context), or NULL */
    const float *rope_freqs;
    size_t mem_bytes;
    char *mem; /* one allocation holding every buffer below; the attention buffers (q, k,
                  v, att, scores, kv_f32, blk_scores, blk_f32, received) and the
                  feed-forward's (gate, up and the experts') overlap, as they are never
                  live together */
    model_frag *frags; /* (n_frags) every weight matrix, when streaming */
    int n_frags;

    /* A forward step stacks the rows of every sequence it advances: "rows" below are
     * stacked rows, up to max_batch of them. */
    float *x;      /* (max_batch, dim) residual stream */
    float *xn;     /* (max_batch, dim) normalized input of a block */
    float *q;      /* (max_batch, n_head * head_dim) */
    float *k;      /* (max_batch, n_head_kv * head_dim) */
    float *v;      /* (max_batch, n_head_kv * head_dim) */
    float *att;    /* (max_batch, n_head * head_dim) attention output */
    float *proj;   /* (max_batch, dim) output of attn_output / ffn_down */
    float *gate;   /* (max_batch, model_ff_max) */
    float *up;     /* (max_batch, model_ff_max) */
    /* deepseek2's multi-head latent attention (no bytes for the others) */
    float *mla_qa;  /* (max_batch, mla_q_rank) attn_q_a's product, then its norm */
    float *mla_qf;  /* (max_batch, n_head * (mla_qk_nope + rope_dims)) the heads' queries
                       before they are mapped into the latent */
    float *mla_in;  /* (n_threads, max_batch, mla_in_width) a thread's head's rows gathered */
    float *mla_out; /* (n_threads, max_batch, mla_out_width) their product by its matrix */
    char *mla_mm;   /* (n_threads, mla_mm_bytes) a thread's ops_matmul scratch for them */
    float *mla_v;   /* (max_batch, n_head * mla_v_dim) the heads' values: attn_output's input */
    int mla_in_width;    /* max(mla_qk_nope, mla_kv_rank) */
    int mla_out_width;   /* max(mla_kv_rank, mla_v_dim) */
    size_t mla_mm_bytes; /* ops_matmul_scratch_bytes(max_batch, mla_in_width, 1), aligned */
    /* mixture of experts (n_expert > 0; empty otherwise) */
    float *ex_in;      /* (max_batch, dim) the normalized rows routed to one expert */
    float *ex_out;     /* (max_batch, dim) an expert's (or the shared expert's) output */
    float *router;     /* (max_batch, n_expert) router logits, then probabilities */
    int32_t *sel;      /* (max_batch, n_expert_used) each row's experts, first ranked first */
    float *sel_w;      /* (max_batch, n_expert_used) their weights */
    int32_t *ex_rows;  /* (max_batch * n_expert_used) the entries of sel of one expert */
    float *rope;   /* (max_batch, head_dim) cos/sin pairs of each row's position */
    float *rope_swa; /* (max_batch, head_dim) the same for the sliding layers when their RoPE
                        differs (hparams.rope_swa), else unused (no bytes) */
    float *scores; /* (n_threads, n_head / n_head_kv, max_kv) attention scores */
    /* batched attention (a sequence with at least MODEL_ATTN_GEMM_MIN rows in the step) */
    float *kv_f32;     /* (2, max_kv, head_dim) K then V of one layer and KV head, as f32 */
    int32_t *kv_pos;   /* (max_kv) position of every entry of the sequence, in order */
    int *chunk_base;   /* (max_chunks + 1) index of each chunk's first entry */
    int max_chunks;
    float *blk_scores; /* (n_threads, attn_rows, max_kv) */
    float *blk_f32;    /* (n_threads, KV_CHUNK_TOKENS, head_dim) a compressed chunk's K or
                          V block decoded, for decode attention */
    float *received;   /* (n_threads, max_kv) attention each entry of one sequence
                          received, per thread */
    pthread_mutex_t recv_lock; /* serializes adding per-thread sums into a batch's */
    kv_chunk **slot_chunk; /* (max_batch) where each row's K/V go */
    int *slot_index;       /* (max_batch) */
    void *mm_scratch;      /* ops_matmul scratch (wide enough for adapters' products: a
                              rank is at most its matrix's smaller side, lora.h) */
    model_part *parts;     /* (max_batch) the sequences of the step; each has >= 1 row */
    int *row_part;         /* (max_batch) index into parts of each row */
    int32_t *row_pos;      /* (max_batch) position of each row */
    int *item_rows;        /* (max_batch) rows whose attention runs per (row, KV head) */
    float **out_dst;       /* (max_batch) where each out row's logits go */
    float *logits_stage;   /* (min(max_batch, MODEL_LOGITS_STAGE), n_vocab) */
    int32_t *row_tok;      /* (max_batch) token of each row, for the embedding's adapters */
    const model **out_model; /* (max_batch) the model each out row runs as */
    float *lora_t;         /* (3, max_batch, lora_cap) A products of up to three matrices
                              (their rows of rank floats), for the adapters */
    int lora_cap;          /* the largest rank lora_t holds (model_runner_reserve_lora) */
};

static size_t model_align(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

model_runner *model_runner_new(const model *m, int n_threads, int max_batch, int max_kv,
                               char err[ERR_MAX])
{
    model_runner_opts o = {.n_threads = n_threads, .max_batch = max_batch, .max_kv = max_kv};
    return model_runner_new_opts(m, &o, err);
}

/* Lays the buffers of ptrs (sizes bytes each) out from base, 64-byte aligned; returns the
 * bytes used (base NULL: only counts). */
static size_t model_layout(char *base, void **const *ptrs, const size_t *sizes, size_t n)
{
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        if (base)
            *ptrs[i] = base + off;
        off += model_align(sizes[i]);
    }
    return off;
}

model_runner *model_runner_new_opts(const model *m, const model_runner_opts *opts,
                                    char err[ERR_MAX])
{
    const model_hparams *hp = &m->hp;
    int max_batch = opts->max_batch > 0 ? opts->max_batch : 512;
    int max_kv = opts->max_kv > 0 ? opts->max_kv : hp->n_ctx;
    int attn_rows = opts->attn_rows > 0 ? opts->attn_rows : MODEL_ATTN_ROWS_DEFAULT;
    if (attn_rows > max_batch)
        attn_rows = max_batch;
    if (max_batch > 1 << 16 || max_kv > 1 << 24) {
        err_set(err, "runner: max_batch %d or max_kv %d too large", max_batch, max_kv);
        return NULL;
    }
    if (hp->sliding_window > 0 && max_kv > hp->n_ctx) {
        err_set(err, "runner: a context of %d is above the model's sliding window of %d "
                     "(window masking is not computed)", max_kv, hp->n_ctx);
        return NULL;
    }
    model_runner *r = calloc(1, sizeof *r);
    if (!r) {
        err_set(err, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&r->recv_lock, NULL);
    if (ops_init(err) < 0) {
        model_runner_free(r);
        return NULL;
    }
    r->m = m;
    r->w = model_base(m);
    r->max_batch = max_batch;
    r->max_kv = max_kv;
    r->attn_rows = attn_rows;
    r->rope_freqs = m->rope_freqs;
    if (m->rope_long)
        r->rope_freqs = max_kv > hp->rope_orig_ctx ? m->rope_long : m->rope_short;
    r->pool = tp_new(opts->n_threads, err);
    if (!r->pool) {
        model_runner_free(r);
        return NULL;
    }
    int nt = tp_n_threads(r->pool);
    size_t B = (size_t)max_batch, q_dim = (size_t)hp->n_head * hp->head_dim,
           kv_dim = (size_t)hp->n_head_kv * hp->head_dim;
    size_t stage = B < MODEL_LOGITS_STAGE ? B : MODEL_LOGITS_STAGE;
    size_t ff = (size_t)model_ff_max(hp);
    size_t mla_q = (size_t)hp->n_head * (hp->mla_qk_nope + hp->rope_dims) * (hp->mla_kv_rank > 0);
    model_widths widths = model_widths_of(hp);
    size_t mla_in = (size_t)widths.mla_in, mla_out = (size_t)widths.mla_out;
    size_t mla_v = (size_t)hp->n_head * hp->mla_v_dim;
    size_t mla_mm = mla_in ? model_align(ops_matmul_scratch_bytes(max_batch, (int)mla_in, 1)) : 0;
    r->mla_in_width = (int)mla_in;
    r->mla_out_width = (int)mla_out;
    r->mla_mm_bytes = mla_mm;
    size_t every[] = {
        B * hp->dim * 4, B * hp->dim * 4, B * hp->dim * 4, B * hp->head_dim * 4,
        hp->rope_swa ? B * hp->head_dim * 4 : 0,
        (size_t)max_kv * 4, ((size_t)max_kv + max_batch / KV_CHUNK_TOKENS + 3) * sizeof(int),
        B * sizeof(kv_chunk *), B * sizeof(int),
        ops_matmul_scratch_bytes(max_batch, widths.max_cols, nt),
        B * sizeof(model_part), B * sizeof(int), B * sizeof(int32_t), B * sizeof(int),
        B * sizeof(float *), stage * hp->n_vocab * 4, B * sizeof(int32_t),
        B * sizeof(const model *), 3 * B * (size_t)m->lora_rank * 4,
    };
    void **every_ptrs[] = {
        (void **)&r->x, (void **)&r->xn, (void **)&r->proj, (void **)&r->rope,
        (void **)&r->rope_swa, (void **)&r->kv_pos, (void **)&r->chunk_base,
        (void **)&r->slot_chunk, (void **)&r->slot_index, &r->mm_scratch, (void **)&r->parts,
        (void **)&r->row_part,
        (void **)&r->row_pos, (void **)&r->item_rows, (void **)&r->out_dst,
        (void **)&r->logits_stage, (void **)&r->row_tok, (void **)&r->out_model,
        (void **)&r->lora_t,
    };
    size_t attn[] = {
        B * q_dim * 4, B * kv_dim * 4, B * kv_dim * 4, B * q_dim * 4,
        (size_t)nt * (hp->n_head / hp->n_head_kv) * max_kv * 4,
        2 * (size_t)max_kv * hp->head_dim * 4, (size_t)nt * attn_rows * max_kv * 4,
        (size_t)nt * KV_CHUNK_TOKENS * hp->head_dim * 4, (size_t)nt * max_kv * 4,
        B * hp->mla_q_rank * 4, B * mla_q * 4, nt * B * mla_in * 4, nt * B * mla_out * 4,
        nt * mla_mm, B * mla_v * 4,
    };
    void **attn_ptrs[] = {
        (void **)&r->q, (void **)&r->k, (void **)&r->v, (void **)&r->att, (void **)&r->scores,
        (void **)&r->kv_f32, (void **)&r->blk_scores, (void **)&r->blk_f32,
        (void **)&r->received, (void **)&r->mla_qa, (void **)&r->mla_qf, (void **)&r->mla_in,
        (void **)&r->mla_out, (void **)&r->mla_mm, (void **)&r->mla_v,
    };
    size_t moe = hp->n_expert > 0, K = (size_t)hp->n_expert_used;
    size_t mlp[] = {B * ff * 4, B * ff * 4, moe * B * hp->dim * 4,
                    moe * B * hp->dim * 4, B * hp->n_expert * 4, B * K * 4, B * K * 4,
                    B * K * 4};
    void **mlp_ptrs[] = {(void **)&r->gate, (void **)&r->up, (void **)&r->ex_in,
                         (void **)&r->ex_out, (void **)&r->router, (void **)&r->sel,
                         (void **)&r->sel_w, (void **)&r->ex_rows};
#define N_OF(a) (sizeof a / sizeof a[0])
    size_t n_every = model_layout(NULL, every_ptrs, every, N_OF(every));
    size_t n_attn = model_layout(NULL, attn_ptrs, attn, N_OF(attn));
    size_t n_mlp = model_layout(NULL, mlp_ptrs, mlp, N_OF(mlp));
    r->mem_bytes = n_every + (n_attn > n_mlp ? n_attn : n_mlp);
    r->mem = aligned_alloc(64, r->mem_bytes);
    if (!r->mem) {
        model_runner_free(r);
        err_set(err, "runner: out of memory for %zu bytes of scratch", r->mem_bytes);
        return NULL;
    }
    model_layout(r->mem, every_ptrs, every, N_OF(every));
    model_layout(r->mem + n_every, attn_ptrs, attn, N_OF(attn));
    model_layout(r->mem + n_every, mlp_ptrs, mlp, N_OF(mlp));
#undef N_OF
    r->lora_cap = m->lora_rank;
    /* non-empty chunks hold >= 1 entry; empty ones are at most the reserve's tail */
    r->max_chunks = max_kv + max_batch / KV_CHUNK_TOKENS + 2;
    return r;
}

model_runner *model_runner_new_shared(const model *m, model_runner *owner, char err[ERR_MAX])
{
    if (model_base(m) != owner->w || owner->owner) {
        err_set(err, "runner: a shared runner's model reads the weights of its owner's, and "
                     "its owner owns its scratch");
        return NULL;
    }
    model_runner *r = malloc(sizeof *r);
    if (!r) {
        err_set(err, "out of memory");
        return NULL;
    }
    *r = *owner;
    r->m = m;
    r->owner = owner;
    r->abort = NULL;
    r->aborted = false;
    r->frags = NULL;
    r->n_frags = 0;
    r->mem = NULL;
    r->mem_bytes = 0;
    pthread_mutex_init(&r->recv_lock, NULL);
    r->own_t = NULL;
    r->own_bytes = 0;
    r->lora_t = NULL;
    r->lora_cap = 0;
    if (model_runner_reserve_lora(r, m->lora_rank, err) < 0) {
        model_runner_free(r);
        return NULL;
    }
    return r;
}

int model_runner_reserve_lora(model_runner *r, int rank, char err[ERR_MAX])
{
    if (rank <= r->lora_cap)
        return 0;
    if (rank > LORA_MAX_RANK)
        return err_set(err, "runner: rank %d above %d", rank, LORA_MAX_RANK);
    size_t bytes = model_align(3 * (size_t)r->max_batch * (size_t)rank * sizeof(float));
    float *t = aligned_alloc(64, bytes);
    if (!t)
        return err_set(err, "runner: out of memory for the adapters' scratch (rank %d)", rank);
    free(r->own_t);
    r->own_t = r->lora_t = t;
    r->own_bytes = bytes;
    r->lora_cap = rank;
    return 0;
}

size_t model_runner_scratch_bytes(const model_runner *r)
{
    return r->mem_bytes + r->own_bytes;
}

void model_runner_free(model_runner *r)
{
    if (!r)
        return;
    if (!r->owner)
        tp_free(r->pool);
    offload_free(r->gpu);
    pthread_mutex_destroy(&r->recv_lock);
    free(r->mem);
    free(r->own_t);
    free(r->frags);
    free(r);
}

int model_runner_use_gpu(model_runner *r, int device, char err[ERR_MAX])
{
    if (r->gpu)
        return err_set(err, "the runner is on a GPU already");
    if (r->owner)
        return err_set(err, "a shared runner runs on its owner's device");
    if (r->n_frags)
        return err_set(err, "a runner whose weights stream stays on the CPU");
    return (r->gpu = offload_new(r->m, device, r->max_batch, r->max_kv, err)) ? 0 : -1;
}

const char *model_runner_gpu_name(const model_runner *r)
{
    return r->gpu ? offload_device_name(r->gpu) : NULL;
}

int model_runner_n_threads(const model_runner *r)
{
    return tp_n_threads(r->pool);
}

int model_runner_n_threads_active(const model_runner *r)
{
    return tp_n_active(r->pool);
}

void model_runner_set_background(model_runner *r, bool background)
{
    tp_set_background(r->pool, background);
}

void model_runner_set_abort(model_runner *r, const _Atomic bool *abort)
{
    r->abort = abort;
}

/* ---- stopped forwards kept (model_pause) ---- */

struct model_pause {
    const model_runner *r;
    int max_rows;
    int layers; /* layers done of the forward kept; 0: none kept */
    uint64_t resumed; /* forwards that went on from a kept one */
    /* The forward under way, or the one kept: its batch against seq as it stood. */
    const kv_seq *seq;
    const kv_chunk *last_chunk; /* seq's last chunk then, or NULL */
    int n_before, n_chunks;
    const model *m;
    int n_tokens, n_out;
    int32_t *tokens;    /* (max_rows) */
    int32_t *positions; /* (max_rows) */
    int32_t *out_rows;  /* (max_rows) */
    float *x;           /* (max_rows, dim) residual stream after its last layer done */
    uint16_t *kv;       /* (n_layer, max_rows, 2, n_head_kv * head_dim) each row's K then V
                           (model_kv_shape's) */
};

model_pause *model_pause_new(const model_runner *r, int max_rows, char err[ERR_MAX])
{
    if (max_rows < 1 || max_rows > r->max_batch) {
        err_set(err, "pause: %d rows outside 1 .. the runner's max batch %d", max_rows,
                r->max_batch);
        return NULL;
    }
    kv_shape shape = model_kv_shape(r->m);
    size_t rows = (size_t)max_rows, kv_dim = (size_t)shape.n_head_kv * shape.head_dim;
    model_pause *p = calloc(1, sizeof *p);
    if (p) {
        p->tokens = malloc(rows * sizeof *p->tokens);
        p->positions = malloc(rows * sizeof *p->positions);
        p->out_rows = malloc(rows * sizeof *p->out_rows);
        p->x = malloc(rows * (size_t)r->m->hp.dim * sizeof *p->x);
        p->kv = malloc((size_t)shape.n_layer * rows * 2 * kv_dim * sizeof *p->kv);
    }
    if (!p || !p->tokens || !p->positions || !p->out_rows || !p->x || !p->kv) {
        model_pause_free(p);
        err_set(err, "pause: out of memory for %d rows", max_rows);
        return NULL;
    }
    p->r = r;
    p->max_rows = max_rows;
    return p;
}

void model_pause_free(model_pause *p)
{
    if (!p)
        return;
    free(p->tokens);
    free(p->positions);
    free(p->out_rows);
    free(p->x);
    free(p->kv);
    free(p);
}

int model_pause_layers(const model_pause *p)
{
    return p->layers;
}

uint64_t model_pause_resumed(const model_pause *p)
{
    return p->resumed;
}

void model_pause_clear(model_pause *p)
{
    p->layers = 0;
}

int model_runner_set_pause(model_runner *r, model_pause *p, char err[ERR_MAX])
{
    if (p && p->r != r)
        return err_set(err, "pause: made for another runner");
    r->pause = p;
    return 0;
}

/* Whether the forward of batches against seqs is one the runner's pause may keep. */
static bool model_pause_takes(const model_runner *r, int n_seq, const model_batch *batches)
{
    const model_batch *b = &batches[0];
    return r->pause && n_seq == 1 && b->n_tokens <= r->pause->max_rows &&
           b->n_tokens <= r->max_batch && !b->attn && !b->hidden && !b->attn_received &&
           !b->layer_ready;
}

/* Makes p's forward the one of b against seq (as it stands, before its entries are
 * appended) and returns the layer it starts at: where p's kept forward stopped when it
 * was this one, else 0. */
static int model_pause_begin(model_pause *p, const kv_seq *seq, const model_batch *b,
                             const model *m)
{
    const kv_chunk *last = seq->n_chunks ? seq->chunks[seq->n_chunks - 1] : NULL;
    size_t n = (size_t)b->n_tokens, n_out = (size_t)b->n_out;
    bool same = p->layers > 0 && p->seq == seq && p->last_chunk == last &&
                p->n_before == kv_seq_n_tokens(seq) && p->n_chunks == seq->n_chunks &&
                p->m == m && p->n_tokens == b->n_tokens && p->n_out == b->n_out &&
                memcmp(p->tokens, b->tokens, n * sizeof *b->tokens) == 0 &&
                memcmp(p->positions, b->positions, n * sizeof *b->positions) == 0 &&
                (n_out == 0 || memcmp(p->out_rows, b->out_rows, n_out * sizeof *b->out_rows) == 0);
    int first = same ? p->layers : 0;
    p->resumed += same;
    p->layers = 0;
    if (!same) {
        p->seq = seq;
        p->last_chunk = last;
        p->n_before = kv_seq_n_tokens(seq);
        p->n_chunks = seq->n_chunks;
        p->m = m;
        p->n_tokens = b->n_tokens;
        p->n_out = b->n_out;
        memcpy(p->tokens, b->tokens, n * sizeof *b->tokens);
        memcpy(p->positions, b->positions, n * sizeof *b->positions);
        if (n_out)
            memcpy(p->out_rows, b->out_rows, n_out * sizeof *b->out_rows);
    }
    return first;
}

/* A row's K (value: V) of (layer, head) in p's buffer. */
static uint16_t *model_pause_kv(const model_pause *p, kv_shape shape, int layer, int row,
                                bool value, int head)
{
    size_t hd = (size_t)shape.head_dim, kv_dim = (size_t)shape.n_head_kv * hd;
    return p->kv + (((size_t)layer * p->max_rows + row) * 2 + value) * kv_dim + (size_t)head * hd;
}

/* Copies the residual stream of the forward's n rows and the K/V its layers before
 * `layers` wrote into the keeping pause (the forward stops there), or back (it goes on). */
static void model_pause_move(model_runner *r, int n, int layers, bool keep)
{
    model_pause *p = r->keeping;
    kv_shape shape = model_kv_shape(r->m);
    size_t hd = (size_t)shape.head_dim, x_bytes = (size_t)n * r->m->hp.dim * sizeof(float);
    if (keep)
        memcpy(p->x, r->x, x_bytes);
    else
        memcpy(r->x, p->x, x_bytes);
    for (int l = 0; l < layers; l++)
        for (int t = 0; t < n; t++)
            for (int h = 0; h < shape.n_head_kv; h++)
                for (int value = 0; value < 2; value++) {
                    const kv_chunk *c = r->slot_chunk[t];
                    uint16_t *slot = (value ? kv_chunk_v_f16(c, shape, l, h)
                                            : kv_chunk_k_f16(c, shape, l, h)) +
                                     (size_t)r->slot_index[t] * hd;
                    uint16_t *kept = model_pause_kv(p, shape, l, t, value, h);
                    memcpy(keep ? kept : slot, keep ? slot : kept, hd * sizeof *slot);
                }
    if (keep)
        p->layers = layers;
}

int model_runner_max_kv(const model_runner *r)
{
    return r->max_kv;
}

/* ---- weight residency ---- */

/* Every weight matrix of m into f (MODEL_N_FRAGS entries; the tied output is not listed
 * twice, merged experts are one fragment each); returns how many. */
#define MODEL_N_FRAGS(m) (2 + MODEL_LAYER_MATRICES * (size_t)(m)->hp.n_layer)
static int model_list_frags(const model *m, model_frag *f)
{
    int n = 0;
    f[n++] = (model_frag){m->tok_embd.data, (size_t)m->tok_embd.rows * m->tok_embd.row_bytes, -1, false};
    if (m->output.data != m->tok_embd.data)
        f[n++] = (model_frag){m->output.data, (size_t)m->output.rows * m->output.row_bytes, -1, false};
    for (int l = 0; l < m->hp.n_layer; l++) {
        ops_matrix *w[MODEL_LAYER_MATRICES];
        int k = model_layer_matrices(&m->layers[l], true, w);
        for (int i = 0; i < k; i++)
            /* a copy of the older deepseek2 files' attn_k_b is no file's page to release */
            if (!m->mla_kv_b || w[i] != &m->layers[l].wk_b)
                f[n++] = (model_frag){w[i]->data, (size_t)w[i]->rows * w[i]->row_bytes, l, false};
    }
    return n;
}

static int model_frag_cmp(const void *a, const void *b)
{
    const model_frag *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes < y->bytes ? -1 : 1;
    return x->data < y->data ? -1 : x->data > y->data;
}

/* Marks the smallest fragments of f resident up to resident_bytes, the others streamed;
 * f ends up sorted by size. */
static model_residency model_assign_residency(const model *m, model_frag *f, int n,
                                              size_t resident_bytes)
{
    qsort(f, (size_t)n, sizeof *f, model_frag_cmp);
    model_residency res = {0};
    size_t *per_layer = calloc((size_t)m->hp.n_layer + 1, sizeof *per_layer);
    for (int i = 0; i < n; i++) {
        f[i].streamed = res.resident + f[i].bytes > resident_bytes;
        if (!f[i].streamed) {
            res.resident += f[i].bytes;
            res.n_resident++;
            continue;
        }
        res.streamed += f[i].bytes;
        res.n_streamed++;
        if (per_layer)
            per_layer[f[i].layer + 1] += f[i].bytes;
    }
    for (int l = 0; per_layer && l <= m->hp.n_layer; l++)
        res.layer_max = per_layer[l] > res.layer_max ? per_layer[l] : res.layer_max;
    if (!per_layer) /* the bound without the per-layer split: all of it */
        res.layer_max = res.streamed;
    free(per_layer);
    return res;
}

model_residency model_weight_residency(const model *m, size_t resident_bytes)
{
    m = model_base(m);
    model_frag *f = malloc(MODEL_N_FRAGS(m) * sizeof *f);
    if (!f) /* everything counted as streamed from one window: the pessimistic bound */
        return (model_residency){.streamed = SIZE_MAX / 4, .layer_max = SIZE_MAX / 4};
    int n = model_list_frags(m, f);
    model_residency res = model_assign_residency(m, f, n, resident_bytes);
    free(f);
    return res;
}

int model_runner_stream_weights(model_runner *r, size_t resident_bytes, char err[ERR_MAX])
{
    free(r->frags);
    r->frags = NULL;
    r->n_frags = 0;
    if (resident_bytes == SIZE_MAX)
        return 0;
    if (!r->w->mapped)
        return err_set(err, "weight streaming needs mapped weights (they were copied)");
    if (r->w->repacked)
        return err_set(err, "weight streaming needs the weights as the file stores them "
                            "(they were repacked)");
    model_frag *f = malloc(MODEL_N_FRAGS(r->w) * sizeof *f);
    if (!f)
        return err_set(err, "out of memory");
    int n = model_list_frags(r->w, f);
    model_assign_residency(r->w, f, n, resident_bytes);
    r->frags = f;
    r->n_frags = n;
    return 0;
}

/* Advice on the streamed fragments of layer (-1: embedding and output). Prefetch rounds
 * the range out to whole pages; release rounds it in, so that a resident neighbour
 * sharing a page keeps it. Advice only: when the kernel refuses it, memory use changes,
 * results do not, so the return value is not needed. */
static void model_advise_layer(const model_runner *r, int layer, bool release)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    for (int i = 0; i < r->n_frags; i++) {
        const model_frag *f = &r->frags[i];
        if (!f->streamed || f->layer != layer)
            continue;
        uintptr_t a = (uintptr_t)f->data, e = a + f->bytes;
        if (release) {
            a = (a + page - 1) & ~(page - 1);
            e &= ~(page - 1);
        } else {
            a &= ~(page - 1);
            e = (e + page - 1) & ~(page - 1);
        }
        if (e > a)
            (void)madvise((void *)a, e - a, release ? MADV_DONTNEED : MADV_WILLNEED);
    }
}

/* ---- forward ---- */

/* What the per-row and per-head jobs of one step share. */
typedef struct model_step {
    model_runner *r;
    const model_layer *L;
    int layer;
    int n;                   /* stacked rows */
    const model_part *parts; /* (n_parts) */
    int n_parts;
    int n_item_rows;         /* rows in r->item_rows */
    int head_split;          /* per-row attention: the query heads of a KV head in this many
                                items (model_attention) */
    const float *norm_w;     /* model_norm_job: (dim) */
    const float *norm_b;     /* model_norm_job: (dim) a LayerNorm's bias, or NULL */
    /* attention items are claimed one by one: with causal masking later tokens cost more */
    _Atomic long next_item;
    const model_part *part;  /* batched attention: the sequence being processed */
    int kv_head;             /* batched attention: the KV head being processed */
    int n_kv;                /* batched attention: entries in r->kv_pos */
    int c0;                  /* batched attention: the part's first chunk any row may see */
    const float *rope;       /* this layer's cos/sin pairs: r->rope or r->rope_swa; NULL
                                where it does not rotate (smollm3's NoPE layers) */
    int window;              /* this layer's sliding window (model_layer_window), 0: none */
} model_step;

/* The lowest position a row at pos sees through a layer's window of `window` positions;
 * with none (0) every position, so that a model without one masks exactly as before. */
static inline int32_t model_window_lo(int32_t pos, int window)
{
    return window > 0 ? pos - window + 1 : INT32_MIN;
}

/* xn = the norm of x by s->norm_w (and s->norm_b: a LayerNorm's), or x as it is without
 * one (olmo2's sublayers read the residual stream unnormalized). */
static void model_norm_job(void *p, int ith, int nth)
{
    model_step *s = p;
    int dim = s->r->m->hp.dim;
    long b, e;
    tp_split(s->n, ith, nth, &b, &e);
    if (!s->norm_w) {
        memcpy(s->r->xn + b * dim, s->r->x + b * dim, (size_t)(e - b) * dim * sizeof(float));
        return;
    }
    for (long t = b; t < e; t++)
        model_norm_row(&s->r->m->hp, s->r->xn + t * dim, s->r->x + t * dim, s->norm_w,
                       s->norm_b);
}

/* qwen3's per-head RMSNorms of q and k. */
static void model_qk_head_norms(const model_hparams *hp, const model_qkv_extras *x, float *q,
                                float *k)
{
    int hd = hp->head_dim;
    for (int h = 0; h < hp->n_head; h++)
        ops_rmsnorm(q + h * hd, q + h * hd, x->q_norm, hd, hp->norm_eps);
    for (int h = 0; h < hp->n_head_kv; h++)
        ops_rmsnorm(k + h * hd, k + h * hd, x->k_norm, hd, hp->norm_eps);
}

void model_qkv_finish(const model_hparams *hp, const model_qkv_extras *x, const float *cs,
                      int32_t pos, float *q, float *k, float *v)
{
    int hd = hp->head_dim, q_dim = hp->n_head * hd, kv_dim = hp->n_head_kv * hd;
    enum ops_rope_style style =
        hp->rope_style == MODEL_ROPE_INTERLEAVED ? OPS_ROPE_INTERLEAVED : OPS_ROPE_HALVES;
    if (x->bq) {
        ops_add(q, x->bq, q_dim);
        ops_add(k, x->bk, kv_dim);
        ops_add(v, x->bv, kv_dim);
    }
    if (x->q_norm_all) {
        ops_rmsnorm(q, q, x->q_norm_all, q_dim, hp->norm_eps);
        ops_rmsnorm(k, k, x->k_norm_all, kv_dim, hp->norm_eps);
    }
    if (x->q_norm && !hp->qk_norm_after_rope)
        model_qk_head_norms(hp, x, q, k);
    if (x->q_norm_heads) {
        for (int h = 0; h < hp->n_head; h++)
            ops_layernorm(q + h * hd, q + h * hd, x->q_norm_heads + h * hd, NULL, hd,
                          hp->norm_eps);
        for (int h = 0; h < hp->n_head_kv; h++)
            ops_layernorm(k + h * hd, k + h * hd, x->k_norm_heads + h * hd, NULL, hd,
                          hp->norm_eps);
    }
    if (hp->attn_temp_scale != 0.0f)
        ops_scale(q, 1.0f + hp->attn_temp_scale * logf(1.0f + (float)(pos / hp->attn_temp_floor)),
                  (size_t)q_dim);
    if (cs) {
        ops_rope(q, hp->n_head, hd, hp->rope_dims, cs, style);
        ops_rope(k, hp->n_head_kv, hd, hp->rope_dims, cs, style);
    }
    if (x->q_norm && hp->qk_norm_after_rope)
        model_qk_head_norms(hp, x, q, k);
}

/* q/k/v finishing, then K/V of each row into its chunk slot. */
static void model_qkv_job(void *p, int ith, int nth)
{
    model_step *s = p;
    model_runner *r = s->r;
    const model_hparams *hp = &r->m->hp;
    const model_layer *L = s->L;
    int hd = hp->head_dim, q_dim = hp->n_head * hd, kv_dim = hp->n_head_kv * hd;
    kv_shape shape = model_kv_shape(r->m);
    long b, e;
    tp_split(s->n, ith, nth, &b, &e);
    for (long t = b; t < e; t++) {
        float *q = r->q + t * q_dim, *k = r->k + t * kv_dim, *v = r->v + t * kv_dim;
        model_qkv_finish(hp, &L->extras, s->rope ? s->rope + t * hd : NULL, r->row_pos[t], q,
                         k, v);
        kv_chunk *c = r->slot_chunk[t];
        int slot = r->slot_index[t];
        for (int h = 0; h < hp->n_head_kv; h++) {
            ops_f32_to_f16(kv_chunk_k_f16(c, shape, s->layer, h) + (size_t)slot * hd, k + h * hd, hd);
            ops_f32_to_f16(kv_chunk_v_f16(c, shape, s->layer, h) + (size_t)slot * hd, v + h * hd, hd);
        }
    }
}

/* scores over one chunk's K block: read in place when f16, decoded into buf otherwise;
 * soft-capped when cap > 0. */
static void model_chunk_scores(const kv_chunk *ch, kv_shape shape, int layer, int head,
                               const float *q, int group, float scale, float cap,
                               float *scores, size_t stride, float *buf)
{
    int hd = shape.head_dim;
    if (ch->precision == KV_F16) {
        ops_attn_scores(q, group, kv_chunk_k_f16(ch, shape, layer, head), ch->n_tokens, hd,
                        scale, scores, stride);
    } else {
        kv_chunk_read_f32(ch, shape, layer, head, buf, NULL);
        ops_attn_scores_f32(q, group, buf, ch->n_tokens, hd, scale, scores, stride);
    }
    for (int g = 0; cap > 0 && g < group; g++)
        ops_softcap(scores + g * stride, ch->n_tokens, cap);
}

/* out += p V over one chunk's V block, read like model_chunk_scores. */
static void model_chunk_accum(const kv_chunk *ch, kv_shape shape, int layer, int head,
                              float *out, int group, const float *p, size_t stride, float *buf)
{
    int hd = shape.head_dim;
    if (ch->precision == KV_F16) {
        ops_attn_accum(out, group, p, stride, kv_chunk_v_f16(ch, shape, layer, head),
                       ch->n_tokens, hd);
        return;
    }
    kv_chunk_read_f32(ch, shape, layer, head, NULL, buf);
    ops_attn_accum_f32(out, group, p, stride, buf, ch->n_tokens, hd);
}

/* Chunks ahead of the one being read whose K (or V) block of a (layer, head) is asked for:
 * decode attention reads 2-4 KB from each chunk, too little for the hardware prefetcher
 * to get ahead of, so without this each chunk waited on memory in turn (the KV of 16
 * sequences does not stay in cache from one layer to the next). */
#define MODEL_KV_PREFETCH 2

/* Asks for chunk c's K (value: V) block of (layer, head) when c exists and is f16. */
static void model_prefetch_block(const kv_seq *seq, int c, kv_shape shape, int layer, int head,
                                 bool value)
{
    if (c >= seq->n_chunks || seq->chunks[c]->precision != KV_F16)
        return;
    const kv_chunk *ch = seq->chunks[c];
    const char *p = (const char *)(value ? kv_chunk_v_f16(ch, shape, layer, head)
                                         : kv_chunk_k_f16(ch, shape, layer, head));
    size_t bytes = (size_t)ch->n_tokens * shape.head_dim * sizeof(uint16_t);
    for (size_t off = 0; off < bytes; off += 64)
        __builtin_prefetch(p + off);
}

/*
 * A thread's sums of the attention each entry received, for one sequence at a time: a
 * dispatch covers rows of several sequences, so when the thread moves on to another
 * sequence (and when its job ends) it adds its sums into the batch's attn_received,
 * one thread at a time.
 */
typedef struct model_recv {
    float *acc;             /* (max_kv) the thread's row of r->received */
    const model_part *part; /* whose sums acc holds, or NULL */
} model_recv;

static void model_recv_flush(model_runner *r, model_recv *a)
{
    if (!a->part)
        return;
    pthread_mutex_lock(&r->recv_lock);
    ops_add(a->part->b->attn_received, a->acc, a->part->n_kv);
    pthread_mutex_unlock(&r->recv_lock);
    a->part = NULL;
}

/* Adds the attention rows p (n_rows, n) stride apart of the part's sequence to the sums
 * of entries [j0, j0 + n). */
static void model_recv_add(model_runner *r, model_recv *a, const model_part *part,
                           const float *p, int n_rows, size_t stride, int j0, int n)
{
    if (!part->b->attn_received)
        return;
    if (a->part != part) {
        model_recv_flush(r, a);
        memset(a->acc, 0, (size_t)part->n_kv * sizeof(float));
        a->part = part;
    }
    for (int g = 0; g < n_rows; g++)
        ops_add(a->acc + j0, p + g * stride, n);
}

/*
 * One (row, KV head) pair per item, over the rows of every sequence taking this path:
 * the `group` query heads sharing that KV head are done together so each K/V row is
 * converted once (in s->head_split items of a part of them each where there are fewer
 * pairs than threads to share them: deepseek2's one KV head of 16-128 query heads at
 * decode would run on one thread). Scores of every entry of the row's sequence, masked by position (and
 * by the layer's window: a chunk holding nothing the row sees is not read), softmax per
 * head, then the probability-weighted sum of V rows. Compressed chunks are decoded to f32
 * once per pass (scores, then values).
 */
static void model_attn_job(void *p, int ith, int nth)
{
    model_step *s = p;
    model_runner *r = s->r;
    const model_hparams *hp = &r->m->hp;
    int hd = hp->head_dim, heads = hp->n_head / hp->n_head_kv, split = s->head_split;
    int part_heads = (heads + split - 1) / split;
    kv_shape shape = model_kv_shape(r->m);
    float scale = hp->attn_scale, cap = hp->attn_softcap;
    size_t stride = (size_t)r->max_kv;
    float *scores = r->scores + (size_t)ith * heads * stride; /* (group, max_kv) */
    float *buf = r->blk_f32 + (size_t)ith * KV_CHUNK_TOKENS * hd;
    model_recv recv = {.acc = r->received + (size_t)ith * r->max_kv};
    long n_pairs = (long)s->n_item_rows * hp->n_head_kv, item;
    (void)nth;
    while ((item = atomic_fetch_add_explicit(&s->next_item, 1, memory_order_relaxed)) <
           n_pairs * split) {
        long pair = item / split;
        int t = r->item_rows[pair / hp->n_head_kv], kvh = (int)(pair % hp->n_head_kv);
        int first = (int)(item % split) * part_heads;
        int group = heads - first < part_heads ? heads - first : part_heads;
        if (group <= 0)
            continue;
        int h0 = kvh * heads + first;
        const model_part *part = &s->parts[r->row_part[t]];
        const kv_seq *seq = part->seq;
        const float *q = r->q + ((size_t)t * hp->n_head + h0) * hd;   /* (group, hd) */
        float *out = r->att + ((size_t)t * hp->n_head + h0) * hd;     /* (group, hd) */
        int32_t pos = r->row_pos[t], lo = model_window_lo(pos, s->window);
        for (int c = 0; c < MODEL_KV_PREFETCH; c++)
            model_prefetch_block(seq, c, shape, s->layer, kvh, false);

        int n_kv = 0;
        for (int c = 0; c < seq->n_chunks; c++) {
            const kv_chunk *ch = seq->chunks[c];
            model_prefetch_block(seq, c + MODEL_KV_PREFETCH, shape, s->layer, kvh, false);
            int visible = 0;
            for (int i = 0; i < ch->n_tokens; i++)
                visible += ch->positions[i] <= pos && ch->positions[i] >= lo;
            if (visible)
                model_chunk_scores(ch, shape, s->layer, kvh, q, group, scale, cap,
                                   scores + n_kv, stride, buf);
            for (int i = 0; i < ch->n_tokens; i++)
                if (ch->positions[i] > pos || ch->positions[i] < lo)
                    for (int g = 0; g < group; g++)
                        scores[g * stride + n_kv + i] = -INFINITY;
            n_kv += ch->n_tokens;
        }
        for (int c = 0; c < MODEL_KV_PREFETCH; c++)
            model_prefetch_block(seq, c, shape, s->layer, kvh, true);
        const float *sinks = s->L->attn_sinks;
        for (int g = 0; g < group; g++)
            ops_softmax_sink(scores + g * stride, n_kv, sinks ? sinks[h0 + g] : -INFINITY);
        memset(out, 0, (size_t)group * hd * sizeof(float));
        int j = 0;
        for (int c = 0; c < seq->n_chunks; c++) {
            const kv_chunk *ch = seq->chunks[c];
            model_prefetch_block(seq, c + MODEL_KV_PREFETCH, shape, s->layer, kvh, true);
            bool visible = false;
            for (int i = 0; i < ch->n_tokens && !visible; i++)
                visible = ch->positions[i] <= pos && ch->positions[i] >= lo;
            if (visible)
                model_chunk_accum(ch, shape, s->layer, kvh, out, group, scores + j, stride, buf);
            j += ch->n_tokens;
        }
        model_recv_add(r, &recv, part, scores, group, stride, 0, n_kv);
        const model_batch *b = part->b;
        if (b->attn)
            for (int g = 0; g < group; g++) {
                float *row = b->attn + (((size_t)s->layer * hp->n_head + h0 + g) * b->n_tokens +
                                        part->t0 + t - part->r0) * part->n_kv_total;
                memcpy(row, scores + g * stride, (size_t)n_kv * sizeof(float));
            }
    }
    model_recv_flush(r, &recv);
}

/* Batched attention, step 1: K and V of KV head s->kv_head of this layer, every entry of
 * s->part's sequence from chunk s->c0 on (the ones before are outside every row's window),
 * into r->kv_f32; chunks are split over threads. */
static void model_kv_f32_job(void *p, int ith, int nth)
{
    model_step *s = p;
    model_runner *r = s->r;
    const kv_seq *seq = s->part->seq;
    int hd = r->m->hp.head_dim;
    kv_shape shape = model_kv_shape(r->m);
    /* a shape whose V is its K (deepseek2) reads K alone: model_attn_gemm_job's V is it */
    float *kf = r->kv_f32, *vf = shape.shared_kv ? NULL : r->kv_f32 + (size_t)r->max_kv * hd;
    long b, e;
    tp_split(seq->n_chunks - s->c0, ith, nth, &b, &e);
    for (long c = s->c0 + b; c < s->c0 + e; c++) {
        const kv_chunk *ch = seq->chunks[c];
        size_t base = (size_t)r->chunk_base[c] * hd;
        kv_chunk_read_f32(ch, shape, s->layer, s->kv_head, kf + base, vf ? vf + base : NULL);
    }
}

/* Batched attention, step 2: one item is (query head of the group, block of the part's
 * rows): scores = Q K^T with sgemm over the entries from the first to the last one any
 * row of the block may see (the first is 0 without a window), mask by position and
 * window, softmax, then P V with sgemm over the same entries. */
static void model_attn_gemm_job(void *p, int ith, int nth)
{
    model_step *s = p;
    model_runner *r = s->r;
    const model_part *pt = s->part;
    const model_batch *b = pt->b;
    const model_hparams *hp = &r->m->hp;
    int hd = hp->head_dim, group = hp->n_head / hp->n_head_kv, ld_q = hp->n_head * hd;
    float scale = hp->attn_scale, cap = hp->attn_softcap;
    const float *kf = r->kv_f32;
    const float *vf = model_kv_shape(r->m).shared_kv ? kf : kf + (size_t)r->max_kv * hd;
    const int32_t *positions = r->row_pos + pt->r0;
    float *sc = r->blk_scores + (size_t)ith * r->attn_rows * r->max_kv;
    model_recv recv = {.acc = r->received + (size_t)ith * r->max_kv};
    int blk = r->attn_rows;
    long n_blocks = (pt->n + blk - 1) / blk, item;
    (void)nth;
    while ((item = atomic_fetch_add_explicit(&s->next_item, 1, memory_order_relaxed)) <
           n_blocks * group) {
        int h = s->kv_head * group + (int)(item % group);
        int t0 = (int)(item / group) * blk;
        float sink = s->L->attn_sinks ? s->L->attn_sinks[h] : -INFINITY;
        int nt = pt->n - t0 < blk ? pt->n - t0 : blk;
        int32_t max_pos = 0, min_pos = INT32_MAX;
        for (int t = t0; t < t0 + nt; t++) {
            max_pos = positions[t] > max_pos ? positions[t] : max_pos;
            min_pos = positions[t] < min_pos ? positions[t] : min_pos;
        }
        int nv = s->n_kv, j0 = 0;
        while (nv > 0 && r->kv_pos[nv - 1] > max_pos)
            nv--;
        /* entries before the block's lowest window bound are seen by none of its rows;
         * they lie past the part's first chunk s->c0, which kv_f32 holds from on */
        int32_t block_lo = model_window_lo(min_pos, s->window);
        while (j0 < nv && r->kv_pos[j0] < block_lo)
            j0++;
        /* every row sees its own entry, so j0 < nv */
        int w = nv - j0;
        size_t row0 = (size_t)(pt->r0 + t0) * ld_q + (size_t)h * hd;
        blas_sgemm(true, nt, w, hd, scale, r->q + row0, ld_q, kf + (size_t)j0 * hd, hd, 0.0f,
                   sc + j0, r->max_kv);
        for (int t = 0; t < nt; t++) {
            float *row = sc + (size_t)t * r->max_kv;
            int32_t pos = positions[t0 + t], lo = model_window_lo(pos, s->window);
            if (cap > 0)
                ops_softcap(row + j0, w, cap);
            for (int j = j0; j < nv; j++)
                if (r->kv_pos[j] > pos || r->kv_pos[j] < lo)
                    row[j] = -INFINITY;
            ops_softmax_sink(row + j0, w, sink);
            model_recv_add(r, &recv, pt, row + j0, 1, 0, j0, w);
            if (b->attn)
                memcpy(b->attn + (((size_t)s->layer * hp->n_head + h) * b->n_tokens + pt->t0 +
                                  t0 + t) * pt->n_kv_total + j0,
                       row + j0, (size_t)w * sizeof(float));
        }
        blas_sgemm(false, nt, hd, w, 1.0f, sc + j0, r->max_kv, vf + (size_t)j0 * hd, hd, 0.0f,
                   r->att + row0, ld_q);
    }
    model_recv_flush(r, &recv);
}

/* Attention of every row over its own sequence: the rows of all sequences with fewer
 * than MODEL_ATTN_GEMM_MIN rows in one dispatch, then the others one by one. */
static void model_attention(model_runner *r, model_step *s)
{
    if (s->n_item_rows > 0) {
        long pairs = (long)s->n_item_rows * r->m->hp.n_head_kv;
        int heads = r->m->hp.n_head / r->m->hp.n_head_kv, threads = tp_n_threads(r->pool);
        s->head_split = 1;
        while (s->head_split < heads && pairs * s->head_split < 2L * threads)
            s->head_split *= 2;
        atomic_store_explicit(&s->next_item, 0, memory_order_relaxed);
        tp_run(r->pool, model_attn_job, s);
    }
    for (int i = 0; i < s->n_parts; i++) {
        const model_part *pt = &s->parts[i];
        if (pt->n < MODEL_ATTN_GEMM_MIN)
            continue;
        /* the lowest window bound of the part's rows: a run of leading chunks wholly below
         * it is seen by no row, and is not decoded */
        int32_t min_pos = INT32_MAX;
        for (int t = 0; t < pt->n; t++)
            min_pos = r->row_pos[pt->r0 + t] < min_pos ? r->row_pos[pt->r0 + t] : min_pos;
        int32_t part_lo = model_window_lo(min_pos, s->window);
        int j = 0, c0 = 0;
        bool below = true;
        for (int c = 0; c < pt->seq->n_chunks; c++) {
            const kv_chunk *ch = pt->seq->chunks[c];
            r->chunk_base[c] = j;
            for (int e = 0; e < ch->n_tokens; e++) {
                below = below && ch->positions[e] < part_lo;
                r->kv_pos[j++] = ch->positions[e];
            }
            c0 = below ? c + 1 : c0;
        }
        s->part = pt;
        s->n_kv = j;
        s->c0 = c0;
        for (int h = 0; h < r->m->hp.n_head_kv; h++) {
            s->kv_head = h;
            tp_run(r->pool, model_kv_f32_job, s);
            atomic_store_explicit(&s->next_item, 0, memory_order_relaxed);
            tp_run(r->pool, model_attn_gemm_job, s);
        }
    }
}

/* r->gate's rows (n_ff each) = the activation of gate times up, or (ungated) of up's
 * product and bias, which the ungated feed-forward writes where the gate's goes. */
static void model_ffn_act_job(void *p, int ith, int nth)
{
    model_step *s = p;
    int n_ff = s->r->m->hp.n_ff;
    bool gelu = s->r->m->hp.ffn_act == MODEL_FFN_GELU_TANH;
    bool ungated = s->r->m->hp.ffn_act == MODEL_FFN_GELU_TANH_UNGATED;
    long b, e;
    tp_split(s->n, ith, nth, &b, &e);
    for (long t = b; t < e; t++) {
        if (ungated)
            ops_gelu_tanh_bias(s->r->gate + t * n_ff, s->L->b_up, n_ff);
        else if (gelu)
            ops_gelu_tanh_mul(s->r->gate + t * n_ff, s->r->up + t * n_ff, n_ff);
        else
            ops_silu_mul(s->r->gate + t * n_ff, s->r->up + t * n_ff, n_ff);
    }
}

/* Gemma2/gemma3/olmo2: r->proj's rows (a sublayer's output) through the RMSNorm s->norm_w, in
 * place, before the residual add. */
static void model_post_norm_job(void *p, int ith, int nth)
{
    model_step *s = p;
    int dim = s->r->m->hp.dim;
    long b, e;
    tp_split(s->n, ith, nth, &b, &e);
    for (long t = b; t < e; t++)
        ops_rmsnorm(s->r->proj + t * dim, s->r->proj + t * dim, s->norm_w, dim,
                    s->r->m->hp.norm_eps);
}

/* Gemma2: the logit rows r->out_dst[0 .. s->n) soft-capped. */
static void model_softcap_job(void *p, int ith, int nth)
{
    model_step *s = p;
    const model_hparams *hp = &s->r->m->hp;
    long b, e;
    tp_split(s->n, ith, nth, &b, &e);
    for (long i = b; i < e; i++)
        ops_softcap(s->r->out_dst[i], hp->n_vocab, hp->final_softcap);
}

static void model_run(model_runner *r, tp_fn fn, model_step *s)
{
    /* A dispatch costs more than one row's worth of these small jobs. */
    if (s->n == 1)
        fn(s, 0, 1);
    else
        tp_run(r->pool, fn, s);
}

/* ---- multi-head latent attention (deepseek2) ---- */

/* Every head's block of a stacked matrix (attn_k_b, attn_v_b) times that head's slice of
 * each row: out[t * out_ld + h * out_step ..] (rows wide) = W_h in[t * in_ld + h * in_step
 * ..] (w->cols wide) for t < n, W_h the rows rows of w from row h * stride. Heads are claimed by the pool's threads, each
 * gathering its head's rows into its own r->mla_in and multiplying them at once on its
 * own (a head's product is a few hundred thousand multiply-adds at decode, too small to
 * split). */
typedef struct model_mla_heads {
    model_runner *r;
    const ops_matrix *w;
    int rows, stride; /* a head's block: rows rows of w from row h * stride */
    int n;
    const float *in;
    size_t in_ld, in_step;
    float *out;
    size_t out_ld, out_step;
    _Atomic int next_head;
} model_mla_heads;

static void model_mla_heads_job(void *p, int ith, int nth)
{
    model_mla_heads *j = p;
    model_runner *r = j->r;
    int n_head = r->m->hp.n_head, rows = j->rows, cols = j->w->cols;
    float *in = r->mla_in + (size_t)ith * r->max_batch * r->mla_in_width;
    float *out = r->mla_out + (size_t)ith * r->max_batch * r->mla_out_width;
    void *scratch = r->mla_mm + (size_t)ith * r->mla_mm_bytes;
    int h;
    (void)nth;
    while ((h = atomic_fetch_add_explicit(&j->next_head, 1, memory_order_relaxed)) < n_head) {
        for (int t = 0; t < j->n; t++)
            memcpy(in + (size_t)t * cols, j->in + t * j->in_ld + h * j->in_step,
                   (size_t)cols * sizeof(float));
        ops_matrix wh = model_rows(j->w, (int64_t)h * j->stride, rows);
        ops_matmul(NULL, &wh, in, j->n, out, scratch);
        for (int t = 0; t < j->n; t++)
            memcpy(j->out + t * j->out_ld + h * j->out_step, out + (size_t)t * rows,
                   (size_t)rows * sizeof(float));
    }
}

static void model_mla_per_head(model_runner *r, const ops_matrix *w, int rows, int stride,
                               int n, const float *in, size_t in_ld, size_t in_step, float *out,
                               size_t out_ld, size_t out_step)
{
    model_mla_heads j = {.r = r, .w = w, .rows = rows, .stride = stride, .n = n, .in = in,
                         .in_ld = in_ld, .in_step = in_step, .out = out, .out_ld = out_ld,
                         .out_step = out_step};
    atomic_store_explicit(&j.next_head, 0, memory_order_relaxed);
    tp_run(r->pool, model_mla_heads_job, &j);
}

/* The step's n normalized rows r->xn into deepseek2's queries and latents: the heads'
 * queries (attn_q, or attn_q_b of attn_q_a's normalized product) into r->mla_qf, the
 * latent and the rotated part of k before RoPE into r->k, and each head's unrotated query
 * mapped into the latent by attn_k_b as the first mla_kv_rank dimensions of its row of
 * r->q (model_mla_kv_job adds the rotated rest). */
static void model_mla_project(model_runner *r, const model_layer *L, int n)
{
    const model_hparams *hp = &r->m->hp;
    size_t qk = (size_t)hp->mla_qk_nope + hp->rope_dims, hd = (size_t)hp->head_dim;
    const ops_matrix *first[] = {L->wq_a.data ? &L->wq_a : &L->wq, &L->wkv_a};
    float *first_out[] = {L->wq_a.data ? r->mla_qa : r->mla_qf, r->k};
    ops_matmul_n(r->pool, 2, first, r->xn, n, first_out, r->mm_scratch);
    if (L->wq_a.data) {
        for (int t = 0; t < n; t++) {
            float *qa = r->mla_qa + (size_t)t * hp->mla_q_rank;
            ops_rmsnorm(qa, qa, L->q_a_norm, hp->mla_q_rank, hp->norm_eps);
        }
        ops_matmul(r->pool, &L->wq, r->mla_qa, n, r->mla_qf, r->mm_scratch);
    }
    model_mla_per_head(r, &L->wk_b, hp->mla_kv_rank, hp->mla_kv_rank, n, r->mla_qf,
                       hp->n_head * qk, qk, r->q, hp->n_head * hd, hd);
}

/* Per row: the latent RMS-normalized and k's shared part rotated (r->k, one KV head of
 * head_dim), written as the row's K, which is its V too; each head's rotated query part
 * after its latent query in r->q. */
static void model_mla_kv_job(void *p, int ith, int nth)
{
    model_step *s = p;
    model_runner *r = s->r;
    const model_hparams *hp = &r->m->hp;
    const model_layer *L = s->L;
    int hd = hp->head_dim, rank = hp->mla_kv_rank, rd = hp->rope_dims;
    int qk = hp->mla_qk_nope + rd;
    kv_shape shape = model_kv_shape(r->m);
    long b, e;
    tp_split(s->n, ith, nth, &b, &e);
    for (long t = b; t < e; t++) {
        float *kv = r->k + t * hd, *q = r->q + t * hp->n_head * hd;
        const float *qf = r->mla_qf + t * hp->n_head * qk;
        const float *cs = s->rope + t * hd;
        ops_rmsnorm(kv, kv, L->kv_a_norm, rank, hp->norm_eps);
        ops_rope(kv + rank, 1, rd, rd, cs, OPS_ROPE_INTERLEAVED);
        for (int h = 0; h < hp->n_head; h++)
            memcpy(q + h * hd + rank, qf + h * qk + hp->mla_qk_nope, (size_t)rd * sizeof(float));
        ops_rope(q + rank, hp->n_head, hd, rd, cs, OPS_ROPE_INTERLEAVED);
        kv_chunk *c = r->slot_chunk[t];
        int slot = r->slot_index[t];
        /* V is K (model_kv_shape's shared_kv) */
        ops_f32_to_f16(kv_chunk_k_f16(c, shape, s->layer, 0) + (size_t)slot * hd, kv, hd);
    }
}

/* Each head's value from its attention over the latent (the first mla_kv_rank
 * dimensions of its row of r->att) by attn_v_b, into r->mla_v: attn_output's input. */
static void model_mla_values(model_runner *r, const model_layer *L, int n)
{
    const model_hparams *hp = &r->m->hp;
    size_t hd = (size_t)hp->head_dim, v = (size_t)hp->mla_v_dim;
    model_mla_per_head(r, &L->wv_b, hp->mla_v_dim, L->wv_b_stride, n, r->att, hp->n_head * hd,
                       hd, r->mla_v, hp->n_head * v, v);
}

/* ---- mixture of experts ---- */

/* The best of score[0..n) that is not -inf (the lower index first on ties), or -1. */
static int model_best_of(const float *score, int n)
{
    int best = -1;
    for (int e = 0; e < n; e++)
        if (score[e] != -INFINITY && (best < 0 || score[e] > score[best]))
            best = e;
    return best;
}

/* deepseek2's groups (model_hparams): the selection scores of every expert outside the
 * n_expert_groups_used groups whose two best scores add up highest become -inf. */
static void model_route_groups(const model_hparams *hp, float *score)
{
    int per = hp->n_expert / hp->n_expert_groups;
    float group_score[MODEL_MAX_EXPERTS / 2];
    bool keep[MODEL_MAX_EXPERTS / 2] = {false};
    for (int g = 0; g < hp->n_expert_groups; g++) {
        const float *s = score + (size_t)g * per;
        int a = model_best_of(s, per), b = -1;
        for (int e = 0; e < per; e++)
            if (e != a && (b < 0 || s[e] > s[b]))
                b = e;
        group_score[g] = (a < 0 ? -INFINITY : s[a]) + s[b];
    }
    for (int i = 0; i < hp->n_expert_groups_used; i++) {
        int best = model_best_of(group_score, hp->n_expert_groups);
        if (best < 0)
            break;
        keep[best] = true;
        group_score[best] = -INFINITY;
    }
    for (int g = 0; g < hp->n_expert_groups; g++)
        for (int e = 0; !keep[g] && e < per; e++)
            score[(size_t)g * per + e] = -INFINITY;
}

/* A row's experts from its router logits p (n_expert, made probabilities here: softmax,
 * or deepseek2's sigmoid): the n_expert_used of the highest selection scores (the
 * probabilities, plus bias where DeepSeek-V3 has it, within deepseek2's groups; the lower
 * index first on ties) into sel, first ranked first, and their probabilities into w,
 * renormalised and scaled where the model says so. */
static void model_route(const model_hparams *hp, float *p, const float *bias, int32_t *sel,
                        float *w)
{
    int k = hp->n_expert_used;
    float score[MODEL_MAX_EXPERTS];
    if (hp->expert_sigmoid)
        for (int e = 0; e < hp->n_expert; e++)
            p[e] = 1.0f / (1.0f + expf(-p[e]));
    else
        ops_softmax(p, hp->n_expert);
    for (int e = 0; e < hp->n_expert; e++)
        score[e] = bias ? p[e] + bias[e] : p[e];
    if (hp->n_expert_groups > 1)
        model_route_groups(hp, score);
    float sum = 0.0f;
    for (int j = 0; j < k; j++) {
        /* a chosen expert's score becomes -inf, which no score is (NaN ones from a broken
         * file included: they fall to the first expert left), so that no expert is chosen
         * twice: the scratch holds each row once per expert */
        int best = model_best_of(score, hp->n_expert);
        /* NaN group scores of a broken file may leave fewer than k: the first expert not
         * chosen yet */
        for (int e = 0; best < 0 && e < hp->n_expert; e++) {
            bool chosen = false;
            for (int i = 0; i < j; i++)
                chosen = chosen || sel[i] == e;
            best = chosen ? -1 : e;
        }
        sel[j] = best;
        w[j] = p[best];
        sum += p[best];
        score[best] = -INFINITY;
    }
    /* as llama.cpp clamps the sum (sigmoid probabilities can all be near 0) */
    for (int j = 0; hp->expert_norm && j < k; j++)
        w[j] /= sum > 6.103515625e-5f ? sum : 6.103515625e-5f;
    for (int j = 0; hp->expert_scale != 0.0f && j < k; j++)
        w[j] *= hp->expert_scale;
}

/*
 * The feed-forward of a layer with experts over the step's n normalized rows r->xn into
 * r->proj: each row routed (model_route, on the router's logits plus gpt-oss's bias), then
 * expert by expert the rows routed to it gathered into one block, so that each expert's
 * matrices are read once for all of them, and w * down(silu(gate x) * up x) added into
 * their rows (gpt-oss: each product plus its expert's bias, and ops_swiglu_oai for silu);
 * then the shared expert over every row, scaled by sigmoid(shexp_gate . x) (qwen2moe) or
 * added as it is (granitemoe). A row's terms are added in the order of its experts'
 * indices whatever other rows the step holds, so a sequence batched with others gets its
 * solo sums.
 */
static void model_moe(model_runner *r, const model_layer *L, int n)
{
    const model_hparams *hp = &r->m->hp;
    int dim = hp->dim, k = hp->n_expert_used, ff = hp->n_ff_exp;
    ops_matmul(r->pool, &L->router, r->xn, n, r->router, r->mm_scratch);
    for (int t = 0; L->router_b && t < n; t++)
        ops_add(r->router + (size_t)t * hp->n_expert, L->router_b, hp->n_expert);
    for (int t = 0; t < n; t++)
        model_route(hp, r->router + (size_t)t * hp->n_expert, L->exp_probs_b,
                    r->sel + (size_t)t * k, r->sel_w + (size_t)t * k);
    memset(r->proj, 0, (size_t)n * dim * sizeof(float));
    for (int e = 0; e < hp->n_expert; e++) {
        int c = 0;
        for (int i = 0; i < n * k; i++)
            if (r->sel[i] == e)
                r->ex_rows[c++] = i;
        if (c == 0)
            continue;
        for (int i = 0; i < c; i++)
            memcpy(r->ex_in + (size_t)i * dim, r->xn + (size_t)(r->ex_rows[i] / k) * dim,
                   (size_t)dim * sizeof(float));
        ops_matrix gate = model_rows(&L->gate_exps, (int64_t)e * ff, ff);
        ops_matrix up = model_rows(&L->up_exps, (int64_t)e * ff, ff);
        ops_matrix down = model_rows(&L->down_exps, (int64_t)e * dim, dim);
        const ops_matrix *gate_up[] = {&gate, &up};
        float *gate_up_out[] = {r->gate, r->up};
        ops_matmul_n(r->pool, 2, gate_up, r->ex_in, c, gate_up_out, r->mm_scratch);
        for (int i = 0; i < c; i++) {
            float *g = r->gate + (size_t)i * ff, *u = r->up + (size_t)i * ff;
            if (L->gate_exps_b) {
                ops_add(g, L->gate_exps_b + (size_t)e * ff, ff);
                ops_add(u, L->up_exps_b + (size_t)e * ff, ff);
            }
            if (hp->ffn_act == MODEL_FFN_SWIGLU_OAI)
                ops_swiglu_oai(g, u, ff);
            else
                ops_silu_mul(g, u, ff);
        }
        ops_matmul(r->pool, &down, r->gate, c, r->ex_out, r->mm_scratch);
        for (int i = 0; L->down_exps_b && i < c; i++)
            ops_add(r->ex_out + (size_t)i * dim, L->down_exps_b + (size_t)e * dim, dim);
        for (int i = 0; i < c; i++) {
            float w = r->sel_w[r->ex_rows[i]], *y = r->proj + (size_t)(r->ex_rows[i] / k) * dim;
            const float *o = r->ex_out + (size_t)i * dim;
            for (int j = 0; j < dim; j++)
                y[j] += w * o[j];
        }
    }
    if (!hp->n_ff_shexp)
        return;
    int fs = hp->n_ff_shexp;
    const ops_matrix *gate_up[] = {&L->w_gate, &L->w_up};
    float *gate_up_out[] = {r->gate, r->up};
    ops_matmul_n(r->pool, 2, gate_up, r->xn, n, gate_up_out, r->mm_scratch);
    for (int t = 0; t < n; t++)
        ops_silu_mul(r->gate + (size_t)t * fs, r->up + (size_t)t * fs, fs);
    ops_matmul(r->pool, &L->w_down, r->gate, n, r->ex_out, r->mm_scratch);
    for (int t = 0; t < n; t++) {
        const float *x = r->xn + (size_t)t * dim, *o = r->ex_out + (size_t)t * dim;
        float dot = 0.0f, *y = r->proj + (size_t)t * dim;
        for (int j = 0; L->shexp_gate && j < dim; j++)
            dot += L->shexp_gate[j] * x[j];
        float g = L->shexp_gate ? 1.0f / (1.0f + expf(-dot)) : 1.0f;
        for (int j = 0; j < dim; j++)
            y[j] += g * o[j];
    }
}

/* ---- adapters ---- */

/* Multiply-adds below which an adapter's product runs on the calling thread: waking the
 * pool costs more than it saves (decode with a rank-8 adapter ran at 0.78 of the base's
 * speed with every product dispatched, on a machine whose cores other processes took
 * too). */
#define MODEL_LORA_INLINE_MACS (1L << 19)

static tp_pool *model_lora_pool(const model_runner *r, long macs)
{
    return macs <= MODEL_LORA_INLINE_MACS ? NULL : r->pool;
}

/*
 * Adds the deltas of m's adapters for the matrices of slots (up to 3, sharing the input
 * x) to their products ys, over rows [r0, r0 + n) of both (x rows of the matrices' input
 * width, ys rows of each one's output width): s B (A x), the A products of an adapter's
 * matrices in one dispatch into r->lora_t, then each B product added into its y. An
 * adapter at scale 0 is skipped, so its view's outputs are its base's.
 */
static void model_lora_apply(model_runner *r, const model *m, int n_mat, const int *slots,
                             const float *x, int r0, int n, float *const *ys)
{
    for (int i = 0; i < m->n_lora; i++) {
        if (m->lora_scale[i] == 0.0f)
            continue;
        const ops_matrix *a[3];
        const lora_pair *p[3];
        float *t[3], *y[3];
        int k = 0;
        for (int j = 0; j < n_mat; j++) {
            const lora_pair *lp = lora_pair_at(m->lora[i], slots[j]);
            if (!lp)
                continue;
            p[k] = lp;
            a[k] = &lp->a;
            t[k] = r->lora_t + (size_t)k * r->max_batch * r->lora_cap;
            y[k++] = ys[j] + (size_t)r0 * lp->b.rows;
        }
        if (k == 0)
            continue;
        long macs = 0;
        for (int j = 0; j < k; j++)
            macs += (long)a[j]->rows * a[j]->cols;
        ops_matmul_n(model_lora_pool(r, macs * n), k, a, x + (size_t)r0 * a[0]->cols, n, t,
                     r->mm_scratch);
        for (int j = 0; j < k; j++)
            ops_matmul_add(model_lora_pool(r, (long)n * p[j]->b.rows * p[j]->b.cols), &p[j]->b,
                           t[j], n, m->lora_scale[i] * p[j]->factor, y[j],
                           (size_t)p[j]->b.rows, r->mm_scratch);
    }
}

/* The end of the run of parts from i on that run as one model (parts[i].m). */
static int model_run_end(const model_part *parts, int n_parts, int i)
{
    int j = i + 1;
    while (j < n_parts && parts[j].m == parts[i].m)
        j++;
    return j;
}

/* model_lora_apply over the step's rows, each run of parts with its own model's
 * adapters. */
static void model_lora_add(model_runner *r, int n_parts, int n_mat, const int *slots,
                           const float *x, float *const *ys)
{
    const model_part *parts = r->parts;
    for (int i = 0, j; i < n_parts; i = j) {
        j = model_run_end(parts, n_parts, i);
        int r0 = parts[i].r0;
        model_lora_apply(r, parts[i].m, n_mat, slots, x, r0, parts[j - 1].r0 + parts[j - 1].n - r0,
                         ys);
    }
}

/* The token embedding's adapters over the step's rows of r->x, each run of parts with its
 * own model's: each row's token's row of A (rank), through B, added to the row. */
static void model_lora_embed(model_runner *r, int n_parts)
{
    const model_part *parts = r->parts;
    int dim = r->m->hp.dim;
    for (int i0 = 0, i1; i0 < n_parts; i0 = i1) {
        i1 = model_run_end(parts, n_parts, i0);
        const model *m = parts[i0].m;
        int r0 = parts[i0].r0, n = parts[i1 - 1].r0 + parts[i1 - 1].n - r0;
        for (int i = 0; i < m->n_lora; i++) {
            const lora_pair *p = lora_pair_at(m->lora[i], LORA_SLOT_TOKEN_EMBD);
            if (!p || m->lora_scale[i] == 0.0f)
                continue;
            int rank = p->a.cols;
            for (int t = 0; t < n; t++)
                quant_dequantize_row(p->a.type,
                                     (const char *)p->a.data + (size_t)r->row_tok[r0 + t] * p->a.row_bytes,
                                     r->lora_t + (size_t)t * rank, rank);
            ops_matmul_add(model_lora_pool(r, (long)n * p->b.rows * rank), &p->b, r->lora_t, n,
                           m->lora_scale[i] * p->factor, r->x + (size_t)r0 * dim, (size_t)dim,
                           r->mm_scratch);
        }
    }
}

/* The output matrix's adapters over logit rows [i0, i0 + n) of r->xn into y (their
 * logits, n_vocab apart), each run of rows of one model (r->out_model) with its own. */
static void model_lora_logits(model_runner *r, int i0, int n, float *y)
{
    const int out_slot = LORA_SLOT_OUTPUT;
    int nv = r->m->hp.n_vocab;
    for (int i = i0, j; i < i0 + n; i = j) {
        for (j = i + 1; j < i0 + n && r->out_model[j] == r->out_model[i]; j++)
            ;
        float *yi = y + (size_t)(i - i0) * nv;
        model_lora_apply(r, r->out_model[i], 1, &out_slot, r->xn + (size_t)i * r->m->hp.dim, 0,
                         j - i, &yi);
    }
}

/* Copies the residual rows of the part's out rows in this step into dst (n_out, dim). */
static void model_save_rows(const model_runner *r, const model_part *pt, float *dst)
{
    int dim = r->m->hp.dim;
    for (int o = pt->o0; o < pt->o1; o++)
        memcpy(dst + (size_t)o * dim, r->x + (size_t)(pt->r0 + pt->b->out_rows[o] - pt->t0) * dim,
               (size_t)dim * sizeof(float));
}

/* Logits of the n normalized out rows in r->xn into r->out_dst: one product straight into
 * the destination when it is one array (a single batch), otherwise through the staging
 * buffer, MODEL_LOGITS_STAGE rows per product. */
static void model_logits(model_runner *r, int n)
{
    const model *w = r->w;
    int nv = w->hp.n_vocab, dim = w->hp.dim;
    bool contiguous = true;
    for (int i = 1; i < n && contiguous; i++)
        contiguous = r->out_dst[i] == r->out_dst[i - 1] + (size_t)nv;
    /* granite divides its logits by logit_scale (times the reciprocal, as llama.cpp);
     * Cohere's multiply by theirs, whose reciprocal hp.logit_scale holds */
    float inv = 1.0f / r->m->hp.logit_scale;
    if (contiguous) {
        ops_matmul(r->pool, &w->output, r->xn, n, r->out_dst[0], r->mm_scratch);
        model_lora_logits(r, 0, n, r->out_dst[0]);
        for (int i = 0; w->output_b && i < n; i++)
            ops_add(r->out_dst[0] + (size_t)i * nv, w->output_b, nv);
        if (inv != 1.0f)
            ops_scale(r->out_dst[0], inv, (size_t)n * nv);
        return;
    }
    int stage = r->max_batch < MODEL_LOGITS_STAGE ? r->max_batch : MODEL_LOGITS_STAGE;
    for (int i = 0; i < n; i += stage) {
        int g = n - i < stage ? n - i : stage;
        ops_matmul(r->pool, &w->output, r->xn + (size_t)i * dim, g, r->logits_stage,
                   r->mm_scratch);
        model_lora_logits(r, i, g, r->logits_stage);
        for (int j = 0; w->output_b && j < g; j++)
            ops_add(r->logits_stage + (size_t)j * nv, w->output_b, nv);
        if (inv != 1.0f)
            ops_scale(r->logits_stage, inv, (size_t)g * nv);
        for (int j = 0; j < g; j++)
            memcpy(r->out_dst[i + j], r->logits_stage + (size_t)j * nv, (size_t)nv * sizeof(float));
    }
}

/* x += scale * y (n): granite scales each sublayer's output; others add it as it is. */
static void model_residual(float *x, float *y, float scale, int n)
{
    if (scale != 1.0f)
        ops_scale(y, scale, (size_t)n);
    ops_add(x, y, n);
}

/* The embeddings of parts' rows stacked in r->x (adapters' rows and the embedding scale
 * applied), with each row's RoPE angles, and their KV entries appended to the parts'
 * sequences; the rows of parts too short for attention by GEMM listed in
 * r->item_rows. Returns the rows; *n_items the listed ones. */
static int model_embed_rows(model_runner *r, int n_parts, int *n_items)
{
    const model *w = r->w;
    const model_hparams *hp = &r->m->hp;
    int dim = hp->dim, n = 0;
    *n_items = 0;
    for (int i = 0; i < n_parts; i++) {
        model_part *pt = &r->parts[i];
        const model_batch *b = pt->b;
        pt->r0 = n;
        pt->o0 = 0;
        while (pt->o0 < b->n_out && b->out_rows[pt->o0] < pt->t0)
            pt->o0++;
        pt->o1 = pt->o0;
        while (pt->o1 < b->n_out && b->out_rows[pt->o1] < pt->t0 + pt->n)
            pt->o1++;
        for (int t = pt->t0; t < pt->t0 + pt->n; t++, n++) {
            int32_t tok = b->tokens[t];
            quant_dequantize_row(w->tok_embd.type,
                                 (const char *)w->tok_embd.data + (size_t)tok * w->tok_embd.row_bytes,
                                 r->x + (size_t)n * dim, dim);
            r->row_tok[n] = tok;
            ops_rope_angles(r->rope + (size_t)n * hp->head_dim, b->positions[t], hp->rope_dims,
                            hp->rope_base, &hp->rope_scaling, r->rope_freqs);
            if (hp->rope_swa) {
                const ops_rope_scaling unscaled = OPS_ROPE_UNSCALED;
                ops_rope_angles(r->rope_swa + (size_t)n * hp->head_dim, b->positions[t],
                                hp->rope_dims, hp->rope_base_swa, &unscaled, NULL);
            }
            r->row_part[n] = i;
            r->row_pos[n] = b->positions[t];
            kv_seq_append(pt->seq, tok, b->positions[t], &r->slot_chunk[n], &r->slot_index[n]);
            if (pt->n < MODEL_ATTN_GEMM_MIN)
                r->item_rows[(*n_items)++] = n;
        }
        pt->n_kv = kv_seq_n_tokens(pt->seq);
    }
    model_lora_embed(r, n_parts);
    /* granite, gemma: after the adapters' rows, as llama.cpp scales the embedding it
     * looked up */
    if (hp->embd_scale != 1.0f)
        ops_scale(r->x, hp->embd_scale, (size_t)n * dim);
    return n;
}

/* Layer s->layer's attention over s->n rows: x += attention(norm(x)). */
static void model_attention_sublayer(model_runner *r, model_step *s)
{
    const model_hparams *hp = &r->m->hp;
    const model_layer *L = s->L;
    int l = s->layer, n = s->n, n_parts = s->n_parts, dim = hp->dim;
    const model_part *parts = s->parts;
    s->norm_w = L->attn_norm;
    s->norm_b = L->attn_norm_b;
    model_run(r, model_norm_job, s);
    /* deepseek2's adapters are refused (lora.c): its matrices are not the slots' */
    bool mla = hp->mla_kv_rank > 0;
    if (mla) {
        model_mla_project(r, L, n);
    } else {
        const ops_matrix *qkv[] = {&L->wq, &L->wk, &L->wv};
        float *qkv_out[] = {r->q, r->k, r->v};
        ops_matmul_n(r->pool, 3, qkv, r->xn, n, qkv_out, r->mm_scratch);
        const int qkv_slots[] = {LORA_SLOT(l, LORA_Q), LORA_SLOT(l, LORA_K),
                                 LORA_SLOT(l, LORA_V)};
        model_lora_add(r, n_parts, 3, qkv_slots, r->xn, qkv_out);
    }
    /* before the new entries are written: they may go into an existing chunk */
    for (int i = 0; i < n_parts; i++)
        if (parts[i].b->layer_ready && parts[i].t0 == 0)
            parts[i].b->layer_ready(parts[i].b->layer_ready_arg, l);
    model_run(r, mla ? model_mla_kv_job : model_qkv_job, s);
    model_attention(r, s);
    if (mla) {
        model_mla_values(r, L, n);
        ops_matmul(r->pool, &L->wo, r->mla_v, n, r->proj, r->mm_scratch);
    } else {
        ops_matmul(r->pool, &L->wo, r->att, n, r->proj, r->mm_scratch);
        const int o_slot = LORA_SLOT(l, LORA_O);
        model_lora_add(r, n_parts, 1, &o_slot, r->att, &r->proj);
    }
    for (int t = 0; L->bo && t < n; t++)
        ops_add(r->proj + (size_t)t * dim, L->bo, dim);
    if (L->attn_post_norm) {
        s->norm_w = L->attn_post_norm;
        model_run(r, model_post_norm_job, s);
    }
    model_residual(r->x, r->proj, hp->residual_scale, n * dim);
}

/* Layer s->layer's feed-forward (its experts', or a dense one) over s->n rows:
 * x += ffn(norm(x)). */
static void model_ffn_sublayer(model_runner *r, model_step *s)
{
    const model_hparams *hp = &r->m->hp;
    const model_layer *L = s->L;
    int l = s->layer, n = s->n, n_parts = s->n_parts, dim = hp->dim;
    /* a parallel layer's feed-forward (command-r, cohere2, phi2) reads r->xn as
     * attention read it */
    s->norm_w = L->ffn_norm;
    s->norm_b = L->ffn_norm_b;
    if (!hp->parallel)
        model_run(r, model_norm_job, s);
    if (model_layer_has_experts(hp, l)) {
        model_moe(r, L, n);
    } else {
        /* starcoder2's and phi2's ungated feed-forward: up's product alone, into
         * r->gate */
        bool gated = hp->ffn_act != MODEL_FFN_GELU_TANH_UNGATED;
        const ops_matrix *gate_up[] = {gated ? &L->w_gate : &L->w_up, &L->w_up};
        float *gate_up_out[] = {r->gate, r->up};
        ops_matmul_n(r->pool, gated ? 2 : 1, gate_up, r->xn, n, gate_up_out, r->mm_scratch);
        const int gate_up_slots[] = {LORA_SLOT(l, gated ? LORA_GATE : LORA_UP),
                                     LORA_SLOT(l, LORA_UP)};
        model_lora_add(r, n_parts, gated ? 2 : 1, gate_up_slots, r->xn, gate_up_out);
        model_run(r, model_ffn_act_job, s);
        ops_matmul(r->pool, &L->w_down, r->gate, n, r->proj, r->mm_scratch);
        const int down_slot = LORA_SLOT(l, LORA_DOWN);
        model_lora_add(r, n_parts, 1, &down_slot, r->gate, &r->proj);
        for (int t = 0; L->b_down && t < n; t++)
            ops_add(r->proj + (size_t)t * dim, L->b_down, dim);
    }
    if (L->ffn_post_norm) {
        s->norm_w = L->ffn_post_norm;
        model_run(r, model_post_norm_job, s);
    }
    model_residual(r->x, r->proj, hp->residual_scale, n * dim);
}

/* The final norm of the rows whose logits the parts' batches ask for, then their logits
 * (softcapped where the model says) into the batches; the last hidden rows saved. */
static void model_output_rows(model_runner *r, model_step *s, bool stream)
{
    const model *m = r->m;
    const model_hparams *hp = &m->hp;
    int dim = hp->dim, n_logits = 0;
    for (int i = 0; i < s->n_parts; i++) {
        const model_part *pt = &s->parts[i];
        const model_batch *b = pt->b;
        if (b->hidden_last)
            model_save_rows(r, pt, b->hidden_last);
        if (!b->logits)
            continue;
        for (int o = pt->o0; o < pt->o1; o++, n_logits++) {
            model_norm_row(hp, r->xn + (size_t)n_logits * dim,
                           r->x + (size_t)(pt->r0 + b->out_rows[o] - pt->t0) * dim,
                           m->output_norm, m->output_norm_b);
            r->out_dst[n_logits] = b->logits + (size_t)o * hp->n_vocab;
            r->out_model[n_logits] = pt->m;
        }
    }
    if (n_logits == 0)
        return;
    if (stream)
        model_advise_layer(r, -1, false);
    model_logits(r, n_logits);
    if (stream)
        model_advise_layer(r, -1, true);
    if (hp->final_softcap > 0) {
        s->n = n_logits;
        model_run(r, model_softcap_job, s);
    }
}

/* One step over r->parts[0 .. n_parts), whose seq, b, t0, n, n_kv_total are set and
 * whose rows fit in max_batch: appends their entries and evaluates all rows stacked. */
static void model_forward_rows(model_runner *r, int n_parts)
{
    const model *w = r->w;
    const model_hparams *hp = &r->m->hp;
    int dim = hp->dim;
    model_part *parts = r->parts;
    int n_items;
    int n = model_embed_rows(r, n_parts, &n_items);
    for (int i = 0; i < n_parts; i++)
        if (parts[i].b->hidden)
            model_save_rows(r, &parts[i], parts[i].b->hidden);

    /* decode rows would fault every streamed weight back in per token: only prefill streams */
    bool stream = r->n_frags > 0 && n >= MODEL_STREAM_MIN_ROWS;
    if (stream) {
        model_advise_layer(r, -1, true);
        model_advise_layer(r, 0, false);
    }
    model_step s = {.r = r, .n = n, .parts = parts, .n_parts = n_parts, .n_item_rows = n_items};
    bool may_abort = r->abort && !stream && !parts[0].b->attn && !parts[0].b->layer_ready;
    int first = r->first_layer;
    if (first > 0)
        model_pause_move(r, n, first, false);
    for (int l = first; l < hp->n_layer; l++) {
        /* a forward its pause keeps does a layer before it stops: stopped again and
         * again, it still moves on */
        if (may_abort && (l > first || !r->keeping) &&
            atomic_load_explicit(r->abort, memory_order_relaxed)) {
            if (r->keeping)
                model_pause_move(r, n, l, true);
            r->aborted = true;
            return;
        }
        s.L = &w->layers[l];
        s.layer = l;
        s.window = model_layer_window(hp, l);
        s.rope = !model_layer_rotates(hp, l)      ? NULL
                 : hp->rope_swa && s.window > 0 ? r->rope_swa
                                                : r->rope;
        if (stream && l + 1 < hp->n_layer)
            model_advise_layer(r, l + 1, false);
        model_attention_sublayer(r, &s);
        model_ffn_sublayer(r, &s);
        for (int i = 0; i < n_parts; i++)
            if (parts[i].b->hidden)
                model_save_rows(r, &parts[i],
                                parts[i].b->hidden + (size_t)(l + 1) * parts[i].b->n_out * dim);
        if (stream)
            model_advise_layer(r, l, true);
    }
    model_output_rows(r, &s, stream);
}

/* model_forward's rules for one batch against its sequence; `what` names it in errors. */
static int model_check_batch(const model_runner *r, const kv_seq *seq, const model_batch *b,
                             const char *what, char err[ERR_MAX])
{
    const model_hparams *hp = &r->m->hp;
    int n = b->n_tokens;
    if (!seq)
        return err_set(err, "%s: no sequence", what);
    if (!b->tokens || !b->positions)
        return err_set(err, "%s: tokens or positions missing", what);
    if (b->model && model_base(b->model) != r->w)
        return err_set(err, "%s: its model reads other weights than the runner's", what);
    if (b->model && b->model->lora_rank > r->lora_cap)
        return err_set(err, "%s: its adapters' rank %d is above the runner's room for %d "
                            "(model_runner_reserve_lora)", what, b->model->lora_rank, r->lora_cap);
    kv_shape want = model_kv_shape(r->m), have = kv_pool_shape(seq->pool);
    if (want.n_layer != have.n_layer || want.n_head_kv != have.n_head_kv ||
        want.head_dim != have.head_dim)
        return err_set(err, "%s: KV pool shape does not match the model", what);
    for (int i = 0; i < n; i++) {
        if (b->tokens[i] < 0 || b->tokens[i] >= hp->n_vocab)
            return err_set(err, "%s: token %d id %d out of range [0, %d)", what, i, b->tokens[i],
                           hp->n_vocab);
        if (b->positions[i] < 0)
            return err_set(err, "%s: token %d has negative position %d", what, i,
                           b->positions[i]);
        if (n > r->max_batch && i > 0 && b->positions[i] < b->positions[i - 1])
            return err_set(err, "%s: batch of %d tokens (> max batch %d) must have "
                                "non-decreasing positions", what, n, r->max_batch);
    }
    if (b->n_out < 0 || (b->n_out > 0 && !b->out_rows))
        return err_set(err, "%s: bad out rows", what);
    for (int o = 0; o < b->n_out; o++)
        if (b->out_rows[o] < 0 || b->out_rows[o] >= n || (o > 0 && b->out_rows[o] <= b->out_rows[o - 1]))
            return err_set(err, "%s: out rows must be strictly increasing batch indices", what);
    return 0;
}

/* Brings every non-resident chunk of seq in through its fault callback. */
static int model_fault_in(kv_seq *seq, const char *what, char err[ERR_MAX])
{
    for (int c = 0; c < seq->n_chunks; c++) {
        if (seq->chunks[c])
            continue;
        if (!seq->fault)
            return err_set(err, "%s: chunk %d is not resident", what, c);
        if (seq->fault(seq->fault_arg, seq, c, err) < 0)
            return -1;
        if (c >= seq->n_chunks || !seq->chunks[c])
            return err_set(err, "%s: fault left chunk %d missing", what, c);
    }
    return 0;
}

static void model_name_batch(char *what, size_t cap, int n_seq, int i)
{
    if (n_seq == 1)
        snprintf(what, cap, "forward");
    else
        snprintf(what, cap, "forward: batch %d", i);
}

int model_forward_batch(model_runner *r, int n_seq, kv_seq *const *seqs,
                        const model_batch *batches, char err[ERR_MAX])
{
    const model_hparams *hp = &r->m->hp;
    char what[48];
    if (n_seq <= 0 || !seqs || !batches)
        return err_set(err, "forward: no batches");
    long total = 0;
    for (int i = 0; i < n_seq; i++) {
        model_name_batch(what, sizeof what, n_seq, i);
        if (batches[i].n_tokens <= 0)
            return err_set(err, "%s: empty batch", what);
        total += batches[i].n_tokens;
    }
    if (n_seq > 1 && total > r->max_batch)
        return err_set(err, "forward: %ld rows in %d batches exceed the runner's max batch %d",
                       total, n_seq, r->max_batch);
    for (int i = 0; i < n_seq; i++) {
        model_name_batch(what, sizeof what, n_seq, i);
        if (model_check_batch(r, seqs[i], &batches[i], what, err) < 0)
            return -1;
        if (n_seq > 1 && (batches[i].attn || batches[i].layer_ready))
            return err_set(err, "%s: attn and layer_ready need a single batch", what);
        for (int j = 0; j < i; j++)
            if (seqs[j] == seqs[i])
                return err_set(err, "forward: batches %d and %d have the same sequence", j, i);
    }
    /* faults may run forwards on this runner: they come before its scratch is used, and
     * run to their end whatever the abort flag says (a fault that stopped would fail),
     * leaving the pause's forward to this one */
    const _Atomic bool *abort = r->abort;
    model_pause *pause = r->pause;
    r->abort = NULL;
    r->pause = NULL;
    for (int i = 0; i < n_seq; i++) {
        model_name_batch(what, sizeof what, n_seq, i);
        if (model_fault_in(seqs[i], what, err) < 0) {
            r->abort = abort;
            r->pause = pause;
            return -1;
        }
    }
    r->abort = abort;
    r->pause = pause;
    /* a fault may have made room by dropping another sequence's chunk */
    for (int i = 0; i < n_seq; i++)
        for (int c = 0; c < seqs[i]->n_chunks; c++)
            if (!seqs[i]->chunks[c])
                return err_set(err, "forward: chunk %d of batch %d's sequence was dropped while "
                                    "faulting in another's", c, i);

    /* whether the runner's pause may keep this forward, and where it starts: where the
     * pause's forward stopped when it was this one; any other takes the pause's place */
    r->keeping = NULL;
    r->first_layer = 0;
    if (r->pause && !r->gpu && model_pause_takes(r, n_seq, batches)) {
        r->keeping = r->pause;
        r->first_layer = model_pause_begin(r->pause, seqs[0], &batches[0],
                                           batches[0].model ? batches[0].model : r->m);
    } else if (r->pause) {
        model_pause_clear(r->pause);
    }

    model_part *parts = r->parts;
    for (int i = 0; i < n_seq; i++) {
        kv_seq *seq = seqs[i];
        int n = batches[i].n_tokens, n_before = kv_seq_n_tokens(seq), rc = 0;
        parts[i] = (model_part){.seq = seq, .b = &batches[i],
                                .m = batches[i].model ? batches[i].model : r->m,
                                .n_before = n_before,
                                .n_kv_total = n_before + n};
        model_name_batch(what, sizeof what, n_seq, i);
        if (n_before + n > r->max_kv)
            rc = err_set(err, "%s: %d + %d KV entries exceed the runner's %d", what, n_before, n,
                         r->max_kv);
        else if (kv_seq_reserve(seq, n, err) < 0)
            rc = -1;
        else if (seq->n_chunks > r->max_chunks)
            rc = err_set(err, "%s: sequence has %d chunks, more than the runner's %d", what,
                         seq->n_chunks, r->max_chunks);
        if (rc < 0) {
            for (int j = 0; j <= i; j++)
                kv_seq_truncate(seqs[j], parts[j].n_before);
            return -1;
        }
    }

    if (r->gpu && offload_takes(r->gpu, n_seq, batches)) {
        int n_before[n_seq];
        for (int i = 0; i < n_seq; i++)
            n_before[i] = parts[i].n_before;
        if (offload_forward_batch(r->gpu, n_seq, seqs, batches, n_before, err) < 0) {
            for (int i = 0; i < n_seq; i++)
                kv_seq_truncate(seqs[i], n_before[i]);
            return -1;
        }
        return 0;
    }
    for (int i = 0; i < n_seq; i++)
        if (batches[i].attn)
            memset(batches[i].attn, 0, (size_t)hp->n_layer * hp->n_head * batches[i].n_tokens *
                                           parts[i].n_kv_total * sizeof(float));
    /* several batches fit in max_batch together; a single one may be split */
    r->aborted = false;
    for (int t0 = 0; t0 < batches[0].n_tokens && !r->aborted; t0 += r->max_batch) {
        for (int i = 0; i < n_seq; i++) {
            int left = batches[i].n_tokens - t0;
            parts[i].t0 = t0;
            parts[i].n = left < r->max_batch ? left : r->max_batch;
        }
        model_forward_rows(r, n_seq);
    }
    if (r->aborted) {
        for (int i = 0; i < n_seq; i++)
            kv_seq_truncate(seqs[i], parts[i].n_before);
        return MODEL_ABORTED;
    }
    return 0;
}

int model_forward(model_runner *r, kv_seq *seq, const model_batch *b, char err[ERR_MAX])
{
    return model_forward_batch(r, 1, &seq, b, err);
}
