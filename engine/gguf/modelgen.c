/*
 * modelgen.c — random-weight model generator.
 *
 * Every row of every tensor has its own random stream (seed, tensor index, row), so
 * rows can be generated and quantized on several threads and the file is still
 * identical for a given seed whatever the thread count.
 */
#include "engine/gguf/modelgen.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/quant/quant.h"
#include "engine/threadpool.h"

typedef struct modelgen_tensor {
    char name[64];
    uint32_t type;
    uint32_t n_dims;
    int64_t ne[3];   /* cols, rows, matrices (3-D: the experts) */
    float std;       /* of the random part */
    float mean;      /* added to every element (1 for norm weights) */
    void *data;
} modelgen_tensor;

static uint64_t modelgen_hash(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

typedef struct modelgen_job {
    modelgen_tensor *t;
    uint64_t seed;
    int index;
    float *row_buf; /* (n_threads, max_cols) */
    int64_t max_cols;
} modelgen_job;

static void modelgen_rows_job(void *p, int ith, int nth)
{
    modelgen_job *j = p;
    modelgen_tensor *t = j->t;
    int64_t cols = t->ne[0], rows = t->n_dims == 1 ? 1 : t->ne[1] * (t->n_dims == 3 ? t->ne[2] : 1);
    size_t row_bytes = quant_row_bytes(t->type, cols);
    float *buf = j->row_buf + (size_t)ith * j->max_cols;
    /* uniform on [-a, a] has standard deviation a / sqrt(3) */
    float a = t->std * sqrtf(3.0f);
    long b, e;
    tp_split(rows, ith, nth, &b, &e);
    for (long r = b; r < e; r++) {
        uint64_t state =
            modelgen_hash(j->seed ^ modelgen_hash(((uint64_t)j->index << 32) | (uint64_t)r));
        for (int64_t c = 0; c < cols; c++) {
            state = modelgen_hash(state);
            float u = (float)((state >> 40) * (1.0 / (double)(1ull << 24))); /* [0, 1) */
            buf[c] = t->mean + a * (2.0f * u - 1.0f);
        }
        quant_quantize_row(t->type, buf, (char *)t->data + (size_t)r * row_bytes, cols);
    }
}

static int modelgen_synthetic_vocab(gguf_writer *w, int n_vocab)
{
    char **strs = calloc((size_t)n_vocab, sizeof *strs);
    float *scores = calloc((size_t)n_vocab, sizeof *scores);
    int32_t *types = calloc((size_t)n_vocab, sizeof *types);
    int rc = -1;
    if (!strs || !scores || !types)
        goto out;
    for (int i = 0; i < n_vocab; i++) {
        strs[i] = malloc(16);
        if (!strs[i])
            goto out;
        if (i == 0)
            strcpy(strs[i], "<unk>");
        else if (i == 1)
            strcpy(strs[i], "<s>");
        else if (i == 2)
            strcpy(strs[i], "</s>");
        else
            snprintf(strs[i], 16, "tok%d", i);
        scores[i] = -(float)i;
        types[i] = i == 0 ? 2 : i < 3 ? 3 : 1; /* unknown, control, normal */
    }
    if (gguf_writer_set_str(w, "tokenizer.ggml.model", "llama") < 0 ||
        gguf_writer_set_str_arr(w, "tokenizer.ggml.tokens", (const char *const *)strs,
                                (uint64_t)n_vocab) < 0 ||
        gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_FLOAT32, scores, (uint64_t)n_vocab) < 0 ||
        gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_INT32, types, (uint64_t)n_vocab) < 0 ||
        gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0) < 0 ||
        gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1) < 0 ||
        gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2) < 0)
        goto out;
    rc = 0;
out:
    for (int i = 0; strs && i < n_vocab; i++)
        free(strs[i]);
    free(strs);
    free(scores);
    free(types);
    return rc;
}

/* Copies tokenizer.* from the vocabulary file and returns its token count (or -1). */
static int modelgen_copy_vocab(gguf_writer *w, const gguf_file *v, char err[ERR_MAX])
{
    enum gguf_value_type et;
    uint64_t count;
    if (!gguf_get_arr(v, "tokenizer.ggml.tokens", &et, &count) || et != GGUF_STRING)
        return err_set(err, "vocabulary has no tokenizer.ggml.tokens string array");
    if (count < 1 || count > (1u << 24))
        return err_set(err, "vocabulary has %llu tokens", (unsigned long long)count);
    for (int64_t i = 0; i < gguf_n_kv(v); i++) {
        gguf_str k = gguf_key(v, i);
        if (k.len >= 10 && memcmp(k.ptr, "tokenizer.", 10) == 0 && gguf_writer_copy_kv(w, v, i) < 0)
            return err_set(err, "cannot copy metadata key %.*s", (int)k.len, k.ptr);
    }
    return (int)count;
}

/* Generates the n_t tensors' rows on a pool, adds them to w and writes the file. */
static int modelgen_emit(const modelgen_params *p, gguf_writer *w, modelgen_tensor *ts, int n_t,
                         const char *path, char err[ERR_MAX])
{
    int64_t max_cols = 1;
    for (int i = 0; i < n_t; i++)
        max_cols = ts[i].ne[0] > max_cols ? ts[i].ne[0] : max_cols;
    int rc = -1;
    float *row_buf = NULL;
    tp_pool *pool = tp_new(p->n_threads, err);
    if (!pool)
        goto out;
    row_buf = malloc((size_t)tp_n_threads(pool) * max_cols * sizeof(float));
    if (!row_buf) {
        err_set(err, "out of memory");
        goto out;
    }
    for (int i = 0; i < n_t; i++) {
        modelgen_tensor *t = &ts[i];
        int64_t rows = t->n_dims == 1 ? 1 : t->ne[1] * (t->n_dims == 3 ? t->ne[2] : 1);
        t->data = malloc(quant_row_bytes(t->type, t->ne[0]) * (size_t)rows);
        if (!t->data) {
            err_set(err, "out of memory for tensor '%s'", t->name);
            goto out;
        }
        modelgen_job j = {t, p->seed, i, row_buf, max_cols};
        tp_run(pool, modelgen_rows_job, &j);
        if (gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data) < 0) {
            err_set(err, "cannot add tensor '%s'", t->name);
            goto out;
        }
        if (p->progress)
            p->progress(i + 1, n_t, p->progress_user);
    }
    rc = gguf_writer_write(w, path, err);
out:
    for (int i = 0; i < n_t; i++)
        free(ts[i].data);
    free(row_buf);
    tp_free(pool);
    return rc;
}

/* llama.cpp's use_more_bits: the first and last eighth of the layers and every third
 * between get the wider type. */
static bool modelgen_more_bits(int layer, int n_layer)
{
    return layer < n_layer / 8 || layer >= 7 * n_layer / 8 || (layer - n_layer / 8) % 3 == 2;
}

static uint32_t modelgen_fallback_type(uint32_t t, int64_t cols);

uint32_t modelgen_mix_type(modelgen_mix mix, uint32_t type, const char *name, int64_t cols,
                           int n_layer, int n_gqa, bool has_output)
{
    if (mix == MODELGEN_MIX_NONE)
        return type;
    int layer = 0;
    sscanf(name, "blk.%d.", &layer);
    bool q3m = mix == MODELGEN_MIX_Q3_K_M, q3l = mix == MODELGEN_MIX_Q3_K_L;
    bool q2 = mix == MODELGEN_MIX_Q2_K;
    bool iq4 = mix == MODELGEN_MIX_IQ4_NL || mix == MODELGEN_MIX_IQ4_XS;
    bool km = mix == MODELGEN_MIX_Q4_K_M || mix == MODELGEN_MIX_Q5_K_M;
    uint32_t t = type;
    if (!strcmp(name, "output.weight") || (!has_output && !strcmp(name, "token_embd.weight"))) {
        const quant_traits *tr = quant_traits_of(type);
        t = cols % tr->block_size ? QTYPE_Q8_0 : type != QTYPE_Q8_0 ? QTYPE_Q6_K : type;
    } else if (strstr(name, "attn_v.weight")) {
        if (q2)
            t = n_gqa >= 4 ? QTYPE_Q4_K : QTYPE_Q3_K;
        else if (q3m)
            t = layer < 2 ? QTYPE_Q5_K : QTYPE_Q4_K;
        else if (q3l || (iq4 && n_gqa >= 4))
            t = QTYPE_Q5_K;
        else if (km && modelgen_more_bits(layer, n_layer))
            t = QTYPE_Q6_K;
    } else if (strstr(name, "ffn_down")) {
        if (q2)
            t = QTYPE_Q3_K;
        else if (q3m)
            t = layer < n_layer / 16 ? QTYPE_Q5_K : QTYPE_Q4_K;
        else if (q3l || (iq4 && layer < n_layer / 8))
            t = QTYPE_Q5_K;
        else if (km && modelgen_more_bits(layer, n_layer))
            t = QTYPE_Q6_K;
    } else if (strstr(name, "attn_output.weight")) {
        t = q2 ? QTYPE_Q3_K : q3m ? QTYPE_Q4_K : q3l ? QTYPE_Q5_K : t;
    } else if (strstr(name, "attn_qkv.weight")) {
        t = q3m || q3l                      ? QTYPE_Q4_K
            : mix == MODELGEN_MIX_Q4_K_M    ? QTYPE_Q5_K
            : mix == MODELGEN_MIX_Q5_K_M    ? QTYPE_Q6_K
                                            : t;
    }
    return modelgen_fallback_type(t, cols);
}

/* llama-quantize's fallbacks for type t where rows of cols are not whole blocks of it. */
static uint32_t modelgen_fallback_type(uint32_t t, int64_t cols)
{
    if (cols % quant_traits_of(t)->block_size == 0)
        return t;
    switch (t) {
    case QTYPE_Q2_K:
    case QTYPE_Q3_K:
    case QTYPE_IQ4_XS:
        t = QTYPE_IQ4_NL;
        break;
    case QTYPE_Q4_K:
        t = QTYPE_Q5_0;
        break;
    case QTYPE_Q5_K:
        t = QTYPE_Q5_1;
        break;
    case QTYPE_Q6_K:
        t = QTYPE_Q8_0;
        break;
    default:
        break;
    }
    return cols % quant_traits_of(t)->block_size ? QTYPE_F16 : t;
}

/* Gives each matrix of ts its type under the mix and checks that the engine can write
 * and multiply it. */
static int modelgen_set_types(const modelgen_params *p, modelgen_tensor *ts, int n_t,
                              char err[ERR_MAX])
{
    bool has_output = false;
    for (int i = 0; i < n_t; i++)
        has_output |= !strcmp(ts[i].name, "output.weight");
    for (int i = 0; i < n_t; i++) {
        modelgen_tensor *t = &ts[i];
        /* llama-quantize keeps routers in F32, and biases (gpt-oss's experts' are 2-D) and
         * norms (Command-R+'s per-head ones are 2-D) */
        if (t->n_dims == 1 || strstr(t->name, "ffn_gate_inp") || strstr(t->name, ".bias") ||
            strstr(t->name, "_norm.weight"))
            continue;
        if (p->mxfp4_experts && strstr(t->name, "_exps.weight"))
            t->type = QTYPE_MXFP4;
        else
            t->type = modelgen_mix_type(p->mix, p->type, t->name, t->ne[0], p->n_layer,
                                        p->n_head / p->n_head_kv, has_output);
        /* deepseek2's attn_k_b rows of qk_nope_dim and the like, as llama-quantize falls
         * back */
        if (!strcmp(p->arch, "deepseek2"))
            t->type = modelgen_fallback_type(t->type, t->ne[0]);
        const quant_traits *tr = quant_traits_of(t->type);
        if (!tr->computable)
            return err_set(err, "%s: type %s is not supported", t->name, tr->name);
        if (t->ne[0] % tr->block_size)
            return err_set(err, "%s: row length %lld is not a multiple of %s's block size %d",
                           t->name, (long long)t->ne[0], tr->name, tr->block_size);
    }
    return 0;
}

/* The decoder architectures modelgen writes (engine/model's, which this layer does not
 * include). */
static bool modelgen_name_in(const char *const *names, size_t n, const char *name, size_t len)
{
    for (size_t i = 0; i < n; i++)
        if (strlen(names[i]) == len && memcmp(names[i], name, len) == 0)
            return true;
    return false;
}

static bool modelgen_decoder_arch(const char *name, size_t len)
{
    static const char *const names[] = {"llama",    "qwen2",    "qwen3", "phi3",
                                        "granite",  "qwen2moe", "qwen3moe", "olmoe",
                                        "gemma",    "gemma2",   "gemma3",   "olmo2",
                                        "granitemoe", "smollm3", "exaone", "stablelm",
                                        "gpt-oss", "mistral3", "exaone4", "glm4", "chatglm",
                                        "command-r", "cohere2", "starcoder2", "phi2",
                                        "seed_oss", "hunyuan-dense", "deepseek2",
                                        "ernie4_5-moe", "glm4moe"};
    return modelgen_name_in(names, sizeof names / sizeof *names, name, len);
}

/* The bases modelgen_write_lora writes adapters for: decoders whose layer matrices are the
 * separate q, k, v, o, gate, up and down it adapts (phi3's are fused); granite and olmoe
 * are left out because no test writes adapters of them. */
static bool modelgen_lora_base_arch(const char *name, size_t len)
{
    static const char *const names[] = {"llama", "qwen2",  "qwen3",  "qwen2moe",
                                        "qwen3moe", "gemma", "gemma2", "gemma3"};
    return modelgen_name_in(names, sizeof names / sizeof *names, name, len);
}

/* key: a boolean per layer, true where the layer slides, as convert_hf_to_gguf.py writes
 * HF's layer_types: all but every period-th ("LLLG" for 4). 0 or -1. */
static int modelgen_write_swa_pattern(gguf_writer *w, const char *key, int n_layer, int period)
{
    bool *slides = malloc((size_t)n_layer * sizeof *slides);
    if (!slides)
        return -1;
    for (int l = 0; l < n_layer; l++)
        slides[l] = (l + 1) % period != 0;
    int rc = gguf_writer_set_arr(w, key, GGUF_BOOL, slides, (uint64_t)n_layer);
    free(slides);
    return rc;
}

/* deepseek2's shape (modelgen.h); its own checks in place of the others' (its heads have
 * no head_dim, its KV heads are one). */
static int modelgen_check_deepseek2(const modelgen_params *p, char err[ERR_MAX])
{
    const quant_traits *tr = quant_traits_of(p->type);
    if (!tr || !tr->computable)
        return err_set(err, "weight type %u is not supported", p->type);
    if (p->dim <= 0 || p->n_layer <= 0 || p->n_head <= 0 || p->n_ff <= 0 || p->n_ctx <= 0 ||
        p->kv_lora_rank <= 0 || p->qk_nope_dim <= 0 || p->v_head_dim <= 0 ||
        p->q_lora_rank < 0 || p->n_ff_exp < 0)
        return err_set(err, "dimensions must be positive (q_lora_rank, n_ff_exp >= 0)");
    if (p->qk_rope_dim <= 0 || p->qk_rope_dim % 2)
        return err_set(err, "deepseek2's rotary dimensions %d must be positive and even",
                       p->qk_rope_dim);
    if (p->n_expert <= 0 || p->n_expert_used <= 0 || p->n_expert_used > p->n_expert ||
        p->n_expert_shared <= 0)
        return err_set(err, "deepseek2 needs experts, 1 to all of them used, and a shared "
                            "one");
    if (p->n_dense_lead < 0 || p->n_dense_lead > p->n_layer)
        return err_set(err, "leading dense layers %d are not in 0..%d", p->n_dense_lead,
                       p->n_layer);
    if (p->expert_gating < 0 || p->expert_gating > 2)
        return err_set(err, "expert gating %d is not 0 (unwritten), 1 (softmax) or 2 (sigmoid)",
                       p->expert_gating);
    int g = p->n_expert_groups, gu = p->n_expert_groups_used;
    if ((g || gu) && (g < 2 || p->n_expert % g || p->n_expert / g < 2 || gu <= 0 || gu >= g ||
                      p->n_expert_used > gu * (p->n_expert / g)))
        return err_set(err, "expert groups %d (used %d) must divide the %d experts into groups "
                            "of 2 or more, 0 < used < groups, holding the %d used", g, gu,
                       p->n_expert, p->n_expert_used);
    if (!(p->expert_weights_scale >= 0) || !(p->yarn_factor >= 0) ||
        !(p->yarn_mscale_all_dim >= 0) || (p->yarn_mscale_all_dim > 0 && !p->yarn_factor))
        return err_set(err, "expert weights scale, YaRN factor and mscale_all_dim must not be "
                            "negative, mscale_all_dim only with a factor");
    if (p->rope_orig_ctx < 0 || (p->rope_orig_ctx && !p->yarn_factor) ||
        p->rope_orig_ctx > p->n_ctx)
        return err_set(err, "an original context is YaRN's, in [0, n_ctx]");
    if (p->tie_output || p->mxfp4_experts || p->head_dim || p->rope_dims || p->pooling_type ||
        p->n_dense || p->sliding_window || p->rope_linear || p->attn_softcap ||
        p->final_softcap || p->n_ff_shexp)
        return err_set(err, "deepseek2 has no tied output, MXFP4 experts, head_dim, rope_dims, "
                            "pooling, dense head, window, linear RoPE, soft-caps or n_ff_shexp");
    return 0;
}

static int modelgen_check(const modelgen_params *p, char err[ERR_MAX])
{
    if (p->arch && !strcmp(p->arch, "deepseek2"))
        return modelgen_check_deepseek2(p, err);
    /* ernie4_5-moe: leading dense layers and the selection bias; glm4moe: those, shared
     * experts, the gating, the weights' norm and scale, the prediction layers */
    bool ernie = p->arch && !strcmp(p->arch, "ernie4_5-moe");
    bool glm4moe = p->arch && !strcmp(p->arch, "glm4moe");
    if ((ernie || glm4moe) && (p->n_dense_lead < 0 || p->n_dense_lead > p->n_layer))
        return err_set(err, "%s's dense leading layers are 0..n_layer", p->arch);
    if (glm4moe && (p->n_expert_shared < 0 || p->expert_gating < 0 || p->expert_gating > 2 ||
                    !(p->expert_weights_scale >= 0) || p->nextn_layers < 0 || p->n_ff_shexp))
        return err_set(err, "glm4moe's shared experts and prediction layers are counts, its "
                            "gating 0, 1 or 2, its scale not negative, no n_ff_shexp");
    if ((p->nextn_layers || p->glm_qk_norm) && !glm4moe)
        return err_set(err, "prediction layers (nextn_layers) and glm_qk_norm are glm4moe's");
    if (p->q_lora_rank || p->kv_lora_rank || p->qk_nope_dim || p->qk_rope_dim || p->v_head_dim ||
        (p->n_expert_shared && !glm4moe) || (p->n_dense_lead && !ernie && !glm4moe) ||
        (p->expert_gating && !glm4moe) || (p->expert_weights_norm && !glm4moe) ||
        (p->expert_weights_scale && !glm4moe) || p->n_expert_groups ||
        p->n_expert_groups_used || (p->exp_probs_b && !ernie) || p->yarn_factor ||
        p->yarn_mscale_all_dim)
        return err_set(err, "latent attention, shared expert counts, dense leading layers, "
                            "expert gating, weights, groups and biases and YaRN factors are "
                            "deepseek2's");
    bool nomic = strcmp(p->arch, "nomic-bert") == 0, bert = nomic || !strcmp(p->arch, "bert");
    bool gemma_embed = !strcmp(p->arch, "gemma-embedding");
    bool phi3 = !strcmp(p->arch, "phi3");
    bool olmoe = !strcmp(p->arch, "olmoe"), granitemoe = !strcmp(p->arch, "granitemoe");
    bool gptoss = !strcmp(p->arch, "gpt-oss");
    bool moe = olmoe || granitemoe || gptoss || !strcmp(p->arch, "qwen2moe") ||
               !strcmp(p->arch, "qwen3moe") || !strcmp(p->arch, "ernie4_5-moe") ||
               !strcmp(p->arch, "glm4moe");
    /* gemma's window is ignored (it has none), as its tests write one for the family */
    bool windowed = phi3 || gptoss || !strncmp(p->arch, "gemma", 5) ||
                    !strcmp(p->arch, "exaone4") || !strcmp(p->arch, "cohere2");
    if (!modelgen_decoder_arch(p->arch, strlen(p->arch)) && !bert && !gemma_embed)
        return err_set(err, "unknown architecture '%s'", p->arch);
    if (gemma_embed && (p->pooling_type < 1 || p->pooling_type > 3))
        return err_set(err, "gemma-embedding pooling type %d is not 1 (mean), 2 (cls) or 3 "
                            "(last)", p->pooling_type);
    if (p->n_dense < 0 || (p->n_dense && !gemma_embed))
        return err_set(err, "dense layers (n_dense) are gemma-embedding's");
    if (p->sliding_window < 0 || !(p->attn_softcap >= 0) || !(p->final_softcap >= 0) ||
        !(p->rope_linear >= 0))
        return err_set(err, "sliding window, soft-caps and rope factor must not be negative");
    if (!phi3 && strcmp(p->arch, "mistral3") != 0 && p->rope_orig_ctx)
        return err_set(err, "an original context (LongRoPE, YaRN) is phi3's and mistral3's");
    if (!windowed && p->sliding_window)
        return err_set(err, "a sliding window is phi3's, the Gemma family's, gpt-oss's and "
                            "exaone4's and cohere2's");
    int ff_exp = p->n_ff_exp ? p->n_ff_exp : p->n_ff;
    if (p->mxfp4_experts && (!p->n_expert || p->dim % 32 || ff_exp % 32))
        return err_set(err, "MXFP4 experts need experts whose rows are whole blocks of 32");
    if (moe && p->n_expert <= 0)
        return err_set(err, "%s needs experts", p->arch);
    if (p->n_expert && strcmp(p->arch, "llama") != 0 && !moe)
        return err_set(err, "%s has no experts (llama, qwen2moe, qwen3moe, olmoe, granitemoe "
                            "and gpt-oss have)", p->arch);
    /* llama.cpp's olmoe has q and k norms of dim elements */
    if (olmoe &&
        (p->n_head_kv != p->n_head || (p->head_dim && p->head_dim * p->n_head != p->dim)))
        return err_set(err, "olmoe has as many KV heads as heads and head_dim = dim / heads");
    if (p->n_expert < 0 || p->n_expert_used < 0 || p->n_ff_exp < 0 || p->n_ff_shexp < 0 ||
        p->n_expert_used > p->n_expert || (p->n_expert && !p->n_expert_used))
        return err_set(err, "experts used (%d) must be from 1 to the experts (%d)",
                       p->n_expert_used, p->n_expert);
    if ((!strcmp(p->arch, "llama") || olmoe || granitemoe) && p->n_ff_exp &&
        p->n_ff_exp != p->n_ff)
        return err_set(err, "%s's experts have the feed-forward length (n_ff)", p->arch);
    /* llama.cpp's qwen2moe has attn_q and attn_output of dim x dim */
    if (!strcmp(p->arch, "qwen2moe") && p->head_dim && p->head_dim * p->n_head != p->dim)
        return err_set(err, "qwen2moe has head_dim = dim / heads");
    if (bert && (p->n_head_kv != p->n_head || (p->head_dim && p->head_dim * p->n_head != p->dim)))
        return err_set(err, "%s has as many KV heads as heads and head_dim = dim / heads",
                       p->arch);
    if (bert && p->pooling_type != 1 && p->pooling_type != 2 && (nomic || p->pooling_type != 4))
        return err_set(err, "%s pooling type %d is not 1 (mean), 2 (cls)%s", p->arch,
                       p->pooling_type, nomic ? "" : " or 4 (rank)");
    if (p->dim <= 0 || p->n_layer <= 0 || p->n_head <= 0 || p->n_head_kv <= 0 || p->n_ff <= 0 ||
        p->n_ctx <= 0 || p->head_dim < 0)
        return err_set(err, "dimensions must be positive");
    if (p->n_head % p->n_head_kv != 0)
        return err_set(err, "heads (%d) must be a multiple of KV heads (%d)", p->n_head, p->n_head_kv);
    const quant_traits *tr = quant_traits_of(p->type);
    if (!tr || !tr->computable)
        return err_set(err, "weight type %u is not supported", p->type);
    int hd = p->head_dim ? p->head_dim : p->dim / p->n_head;
    if (hd <= 0 || hd % 2)
        return err_set(err, "head dimension %d must be positive and even", hd);
    if (p->rope_dims < 0 || p->rope_dims % 2 || p->rope_dims > hd)
        return err_set(err, "rotary dimensions %d must be even and at most the head dimension %d",
                       p->rope_dims, hd);
    if (p->rope_orig_ctx < 0 || p->rope_orig_ctx > p->n_ctx || p->sliding_window < 0)
        return err_set(err, "the original context must be in [0, n_ctx], the window >= 0");
    return 0;
}

/* Appends one tensor description to ts[*n] (1-D tensors as F32). */
static void modelgen_add(modelgen_tensor *ts, int *n, const char *name, uint32_t n_dims,
                         int64_t cols, int64_t rows, uint32_t type, float std, float mean)
{
    modelgen_tensor *t = &ts[(*n)++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = n_dims;
    t->type = n_dims == 1 ? QTYPE_F32 : type;
    t->ne[0] = cols;
    t->ne[1] = rows;
    t->std = std;
    t->mean = mean;
}

/* A bert or nomic-bert encoder as llama.cpp's converter writes one (names, metadata), two
 * token types (one on a "t5" vocabulary, as XLM-RoBERTa's files have). nomic-bert as nomic-embed-text: fused attn_qkv, SwiGLU, no biases but the
 * LayerNorms', RoPE base 1000. */
static int modelgen_write_bert(const modelgen_params *p, gguf_writer *w, int n_vocab,
                               const char *path, char err[ERR_MAX])
{
    bool nomic = strcmp(p->arch, "nomic-bert") == 0;
    gguf_str tok_model;
    int n_types = p->vocab && gguf_get_str(p->vocab, "tokenizer.ggml.model", &tok_model) &&
                          gguf_str_eq(tok_model, "t5")
                      ? 1
                      : 2;
    char key[96];
#define KEY(s) (snprintf(key, sizeof key, "%s." s, p->arch), key)
    if (gguf_writer_set_str(w, "general.architecture", p->arch) < 0 ||
        gguf_writer_set_str(w, "general.name", "random weights (mkmodel)") < 0 ||
        gguf_writer_set_u32(w, KEY("context_length"), (uint32_t)p->n_ctx) < 0 ||
        gguf_writer_set_u32(w, KEY("embedding_length"), (uint32_t)p->dim) < 0 ||
        gguf_writer_set_u32(w, KEY("block_count"), (uint32_t)p->n_layer) < 0 ||
        gguf_writer_set_u32(w, KEY("feed_forward_length"), (uint32_t)p->n_ff) < 0 ||
        gguf_writer_set_u32(w, KEY("attention.head_count"), (uint32_t)p->n_head) < 0 ||
        gguf_writer_set_f32(w, KEY("attention.layer_norm_epsilon"), 1e-12f) < 0 ||
        gguf_writer_set_bool(w, KEY("attention.causal"), false) < 0 ||
        gguf_writer_set_u32(w, KEY("pooling_type"), (uint32_t)p->pooling_type) < 0 ||
        (nomic && gguf_writer_set_f32(w, KEY("rope.freq_base"), 1000.0f) < 0) ||
        gguf_writer_set_u32(w, "tokenizer.ggml.token_type_count", (uint32_t)n_types) < 0)
        return err_set(err, "cannot set metadata");
#undef KEY
    int n_t = 0;
    /* bert: 5 input tensors, 16 per layer, 4 of the head (nomic-bert fewer) */
    modelgen_tensor *ts = calloc((size_t)(9 + p->n_layer * 16), sizeof *ts);
    if (!ts)
        return err_set(err, "out of memory");
    int64_t d = p->dim, ff = p->n_ff;
    float s_dim = 1.0f / sqrtf((float)d), s_ff = 1.0f / sqrtf((float)ff);
    modelgen_add(ts, &n_t, "token_embd.weight", 2, d, n_vocab, p->type, 1.0f, 0.0f);
    if (!nomic)
        modelgen_add(ts, &n_t, "position_embd.weight", 2, d, p->n_ctx, p->type, 0.5f, 0.0f);
    modelgen_add(ts, &n_t, "token_types.weight", 2, d, n_types, p->type, 0.5f, 0.0f);
    modelgen_add(ts, &n_t, "token_embd_norm.weight", 1, d, 1, 0, 0.1f, 1.0f);
    modelgen_add(ts, &n_t, "token_embd_norm.bias", 1, d, 1, 0, 0.1f, 0.0f);
    for (int l = 0; nomic && l < p->n_layer; l++) {
        char nm[64];
#define N(s) (snprintf(nm, sizeof nm, "blk.%d." s, l), nm)
        modelgen_add(ts, &n_t, N("attn_qkv.weight"), 2, d, 3 * d, p->type, s_dim, 0.0f);
        modelgen_add(ts, &n_t, N("attn_output.weight"), 2, d, d, p->type, s_dim, 0.0f);
        modelgen_add(ts, &n_t, N("attn_output_norm.weight"), 1, d, 1, 0, 0.1f, 1.0f);
        modelgen_add(ts, &n_t, N("attn_output_norm.bias"), 1, d, 1, 0, 0.1f, 0.0f);
        modelgen_add(ts, &n_t, N("ffn_up.weight"), 2, d, ff, p->type, s_dim, 0.0f);
        modelgen_add(ts, &n_t, N("ffn_gate.weight"), 2, d, ff, p->type, s_dim, 0.0f);
        modelgen_add(ts, &n_t, N("ffn_down.weight"), 2, ff, d, p->type, s_ff, 0.0f);
        modelgen_add(ts, &n_t, N("layer_output_norm.weight"), 1, d, 1, 0, 0.1f, 1.0f);
        modelgen_add(ts, &n_t, N("layer_output_norm.bias"), 1, d, 1, 0, 0.1f, 0.0f);
#undef N
    }
    for (int l = 0; !nomic && l < p->n_layer; l++) {
        char nm[64];
#define N(s) (snprintf(nm, sizeof nm, "blk.%d." s, l), nm)
        modelgen_add(ts, &n_t, N("attn_q.weight"), 2, d, d, p->type, s_dim, 0.0f);
        modelgen_add(ts, &n_t, N("attn_q.bias"), 1, d, 1, 0, 0.1f, 0.0f);
        modelgen_add(ts, &n_t, N("attn_k.weight"), 2, d, d, p->type, s_dim, 0.0f);
        modelgen_add(ts, &n_t, N("attn_k.bias"), 1, d, 1, 0, 0.1f, 0.0f);
        modelgen_add(ts, &n_t, N("attn_v.weight"), 2, d, d, p->type, s_dim, 0.0f);
        modelgen_add(ts, &n_t, N("attn_v.bias"), 1, d, 1, 0, 0.1f, 0.0f);
        modelgen_add(ts, &n_t, N("attn_output.weight"), 2, d, d, p->type, s_dim, 0.0f);
        modelgen_add(ts, &n_t, N("attn_output.bias"), 1, d, 1, 0, 0.1f, 0.0f);
        modelgen_add(ts, &n_t, N("attn_output_norm.weight"), 1, d, 1, 0, 0.1f, 1.0f);
        modelgen_add(ts, &n_t, N("attn_output_norm.bias"), 1, d, 1, 0, 0.1f, 0.0f);
        modelgen_add(ts, &n_t, N("ffn_up.weight"), 2, d, ff, p->type, s_dim, 0.0f);
        modelgen_add(ts, &n_t, N("ffn_up.bias"), 1, ff, 1, 0, 0.1f, 0.0f);
        modelgen_add(ts, &n_t, N("ffn_down.weight"), 2, ff, d, p->type, s_ff, 0.0f);
        modelgen_add(ts, &n_t, N("ffn_down.bias"), 1, d, 1, 0, 0.1f, 0.0f);
        modelgen_add(ts, &n_t, N("layer_output_norm.weight"), 1, d, 1, 0, 0.1f, 1.0f);
        modelgen_add(ts, &n_t, N("layer_output_norm.bias"), 1, d, 1, 0, 0.1f, 0.0f);
#undef N
    }
    if (p->pooling_type == 4) {
        modelgen_add(ts, &n_t, "cls.weight", 2, d, d, p->type, s_dim, 0.0f);
        modelgen_add(ts, &n_t, "cls.bias", 1, d, 1, 0, 0.1f, 0.0f);
        modelgen_add(ts, &n_t, "cls.output.weight", 2, d, 1, p->type, s_dim, 0.0f);
        modelgen_add(ts, &n_t, "cls.output.bias", 1, 1, 1, 0, 0.1f, 0.0f);
    }
    int rc = modelgen_set_types(p, ts, n_t, err) < 0 ? -1 : modelgen_emit(p, w, ts, n_t, path, err);
    free(ts);
    return rc;
}

/* EmbeddingGemma as llama.cpp's converter writes it (names, metadata; see modelgen.h). */
static int modelgen_write_gemma_embed(const modelgen_params *p, gguf_writer *w, int n_vocab,
                                      const char *path, char err[ERR_MAX])
{
    int hd = p->head_dim ? p->head_dim : p->dim / p->n_head;
    int64_t d = p->dim, ff = p->n_ff, q_dim = (int64_t)p->n_head * hd;
    int64_t kv_dim = (int64_t)p->n_head_kv * hd;
    char key[96];
#define KEY(s) (snprintf(key, sizeof key, "gemma-embedding." s), key)
    if (gguf_writer_set_str(w, "general.architecture", "gemma-embedding") < 0 ||
        gguf_writer_set_str(w, "general.name", "random weights (mkmodel)") < 0 ||
        gguf_writer_set_u32(w, KEY("context_length"), (uint32_t)p->n_ctx) < 0 ||
        gguf_writer_set_u32(w, KEY("embedding_length"), (uint32_t)p->dim) < 0 ||
        gguf_writer_set_u32(w, KEY("block_count"), (uint32_t)p->n_layer) < 0 ||
        gguf_writer_set_u32(w, KEY("feed_forward_length"), (uint32_t)p->n_ff) < 0 ||
        gguf_writer_set_u32(w, KEY("attention.head_count"), (uint32_t)p->n_head) < 0 ||
        gguf_writer_set_u32(w, KEY("attention.head_count_kv"), (uint32_t)p->n_head_kv) < 0 ||
        gguf_writer_set_u32(w, KEY("attention.key_length"), (uint32_t)hd) < 0 ||
        gguf_writer_set_u32(w, KEY("attention.value_length"), (uint32_t)hd) < 0 ||
        gguf_writer_set_f32(w, KEY("rope.freq_base"), 1000000.0f) < 0 ||
        gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), 1e-6f) < 0 ||
        gguf_writer_set_u32(w, KEY("attention.sliding_window"),
                            (uint32_t)(p->sliding_window ? p->sliding_window : 512)) < 0 ||
        gguf_writer_set_u32(w, KEY("pooling_type"), (uint32_t)p->pooling_type) < 0 ||
        (p->n_dense &&
         (gguf_writer_set_u32(w, KEY("dense_2_feat_in"), (uint32_t)p->dim) < 0 ||
          gguf_writer_set_u32(w, KEY("dense_2_feat_out"), (uint32_t)p->n_dense) < 0 ||
          gguf_writer_set_u32(w, KEY("dense_3_feat_in"), (uint32_t)p->n_dense) < 0 ||
          gguf_writer_set_u32(w, KEY("dense_3_feat_out"), (uint32_t)p->dim) < 0)))
        return err_set(err, "cannot set metadata");
#undef KEY
    int n_t = 0;
    /* token_embd, output_norm, two dense layers, 13 per layer */
    modelgen_tensor *ts = calloc((size_t)(4 + p->n_layer * 13), sizeof *ts);
    if (!ts)
        return err_set(err, "out of memory");
    float s_dim = 1.0f / sqrtf((float)d), s_ff = 1.0f / sqrtf((float)ff);
    float s_q = 1.0f / sqrtf((float)q_dim);
    modelgen_add(ts, &n_t, "token_embd.weight", 2, d, n_vocab, p->type, s_dim, 0.0f);
    modelgen_add(ts, &n_t, "output_norm.weight", 1, d, 1, 0, 0.1f, 1.0f);
    for (int l = 0; l < p->n_layer; l++) {
        char nm[64];
#define N(s) (snprintf(nm, sizeof nm, "blk.%d." s, l), nm)
        modelgen_add(ts, &n_t, N("attn_norm.weight"), 1, d, 1, 0, 0.1f, 1.0f);
        modelgen_add(ts, &n_t, N("attn_q.weight"), 2, d, q_dim, p->type, s_dim, 0.0f);
        modelgen_add(ts, &n_t, N("attn_k.weight"), 2, d, kv_dim, p->type, s_dim, 0.0f);
        modelgen_add(ts, &n_t, N("attn_v.weight"), 2, d, kv_dim, p->type, s_dim, 0.0f);
        modelgen_add(ts, &n_t, N("attn_q_norm.weight"), 1, hd, 1, 0, 0.1f, 1.0f);
        modelgen_add(ts, &n_t, N("attn_k_norm.weight"), 1, hd, 1, 0, 0.1f, 1.0f);
        modelgen_add(ts, &n_t, N("attn_output.weight"), 2, q_dim, d, p->type, s_q, 0.0f);
        modelgen_add(ts, &n_t, N("post_attention_norm.weight"), 1, d, 1, 0, 0.1f, 1.0f);
        modelgen_add(ts, &n_t, N("ffn_norm.weight"), 1, d, 1, 0, 0.1f, 1.0f);
        modelgen_add(ts, &n_t, N("ffn_gate.weight"), 2, d, ff, p->type, s_dim, 0.0f);
        modelgen_add(ts, &n_t, N("ffn_up.weight"), 2, d, ff, p->type, s_dim, 0.0f);
        modelgen_add(ts, &n_t, N("ffn_down.weight"), 2, ff, d, p->type, s_ff, 0.0f);
        modelgen_add(ts, &n_t, N("post_ffw_norm.weight"), 1, d, 1, 0, 0.1f, 1.0f);
#undef N
    }
    if (p->n_dense) {
        modelgen_add(ts, &n_t, "dense_2.weight", 2, d, p->n_dense, p->type, s_dim, 0.0f);
        modelgen_add(ts, &n_t, "dense_3.weight", 2, p->n_dense, d, p->type,
                     1.0f / sqrtf((float)p->n_dense), 0.0f);
    }
    int rc = modelgen_set_types(p, ts, n_t, err) < 0 ? -1 : modelgen_emit(p, w, ts, n_t, path, err);
    free(ts);
    return rc;
}

/* deepseek2 as llama.cpp's converter writes it (names, metadata; see modelgen.h). */
static int modelgen_write_deepseek2(const modelgen_params *p, gguf_writer *w, int n_vocab,
                                    const char *path, char err[ERR_MAX])
{
    int64_t d = p->dim, nh = p->n_head, kv_lora = p->kv_lora_rank, q_lora = p->q_lora_rank;
    int64_t nope = p->qk_nope_dim, rope = p->qk_rope_dim, vd = p->v_head_dim;
    int64_t ff_exp = p->n_ff_exp ? p->n_ff_exp : p->n_ff, ff_sh = ff_exp * p->n_expert_shared;
    int orig_ctx = p->rope_orig_ctx ? p->rope_orig_ctx
                                    : (int)((float)p->n_ctx / (p->yarn_factor ? p->yarn_factor
                                                                              : 1.0f));
    char key[96];
#define KEY(s) (snprintf(key, sizeof key, "deepseek2." s), key)
#define U32(s, v) (gguf_writer_set_u32(w, KEY(s), (uint32_t)(v)) < 0)
    if (gguf_writer_set_str(w, "general.architecture", "deepseek2") < 0 ||
        gguf_writer_set_str(w, "general.name", "random weights (mkmodel)") < 0 ||
        U32("vocab_size", n_vocab) || U32("context_length", p->n_ctx) ||
        U32("embedding_length", d) || U32("block_count", p->n_layer) ||
        U32("feed_forward_length", p->n_ff) || U32("attention.head_count", nh) ||
        U32("attention.head_count_kv", 1) ||
        gguf_writer_set_f32(w, KEY("rope.freq_base"), 10000.0f) < 0 ||
        gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), 1e-6f) < 0 ||
        U32("expert_count", p->n_expert) || U32("expert_used_count", p->n_expert_used) ||
        (p->n_expert_groups && (U32("expert_group_count", p->n_expert_groups) ||
                                U32("expert_group_used_count", p->n_expert_groups_used))) ||
        (p->expert_gating && U32("expert_gating_func", p->expert_gating)) ||
        U32("leading_dense_block_count", p->n_dense_lead) ||
        (q_lora && U32("attention.q_lora_rank", q_lora)) ||
        U32("attention.kv_lora_rank", kv_lora) ||
        U32("attention.key_length", kv_lora + rope) || U32("attention.value_length", kv_lora) ||
        U32("attention.key_length_mla", nope + rope) || U32("attention.value_length_mla", vd) ||
        U32("expert_feed_forward_length", ff_exp) ||
        U32("expert_shared_count", p->n_expert_shared) ||
        (p->expert_weights_scale > 0 &&
         gguf_writer_set_f32(w, KEY("expert_weights_scale"), p->expert_weights_scale) < 0) ||
        (p->expert_weights_norm && gguf_writer_set_bool(w, KEY("expert_weights_norm"), true) < 0) ||
        U32("rope.dimension_count", rope) ||
        (p->yarn_factor > 0 &&
         (gguf_writer_set_str(w, KEY("rope.scaling.type"), "yarn") < 0 ||
          gguf_writer_set_f32(w, KEY("rope.scaling.factor"), p->yarn_factor) < 0 ||
          U32("rope.scaling.original_context_length", orig_ctx > 0 ? orig_ctx : 1) ||
          gguf_writer_set_f32(w, KEY("rope.scaling.yarn_beta_fast"), 32.0f) < 0 ||
          gguf_writer_set_f32(w, KEY("rope.scaling.yarn_beta_slow"), 1.0f) < 0)) ||
        (p->yarn_mscale_all_dim > 0 &&
         gguf_writer_set_f32(w, KEY("rope.scaling.yarn_log_multiplier"),
                             0.1f * p->yarn_mscale_all_dim) < 0))
        return err_set(err, "cannot set metadata");
#undef U32
#undef KEY
    int n_t = 0;
    /* token_embd, output_norm, output; at most 18 per layer */
    modelgen_tensor *ts = calloc((size_t)(3 + p->n_layer * 18), sizeof *ts);
    if (!ts)
        return err_set(err, "out of memory");
    float s_dim = 1.0f / sqrtf((float)d), s_kv = 1.0f / sqrtf((float)kv_lora);
    modelgen_add(ts, &n_t, "token_embd.weight", 2, d, n_vocab, p->type, s_dim, 0.0f);
    modelgen_add(ts, &n_t, "output_norm.weight", 1, d, 1, 0, 0.1f, 1.0f);
    modelgen_add(ts, &n_t, "output.weight", 2, d, n_vocab, p->type, s_dim, 0.0f);
    for (int l = 0; l < p->n_layer; l++) {
        char nm[64];
#define N(s) (snprintf(nm, sizeof nm, "blk.%d." s, l), nm)
        modelgen_add(ts, &n_t, N("attn_norm.weight"), 1, d, 1, 0, 0.1f, 1.0f);
        if (q_lora) {
            modelgen_add(ts, &n_t, N("attn_q_a_norm.weight"), 1, q_lora, 1, 0, 0.1f, 1.0f);
            modelgen_add(ts, &n_t, N("attn_q_a.weight"), 2, d, q_lora, p->type, s_dim, 0.0f);
            modelgen_add(ts, &n_t, N("attn_q_b.weight"), 2, q_lora, nh * (nope + rope), p->type,
                         1.0f / sqrtf((float)q_lora), 0.0f);
        } else {
            modelgen_add(ts, &n_t, N("attn_q.weight"), 2, d, nh * (nope + rope), p->type, s_dim,
                         0.0f);
        }
        modelgen_add(ts, &n_t, N("attn_kv_a_norm.weight"), 1, kv_lora, 1, 0, 0.1f, 1.0f);
        modelgen_add(ts, &n_t, N("attn_kv_a_mqa.weight"), 2, d, kv_lora + rope, p->type, s_dim,
                     0.0f);
        /* per head: k_nope = W^T c and v = W c of the latent c (kv_lora_rank elements) */
        modelgen_add(ts, &n_t, N("attn_k_b.weight"), 3, nope, kv_lora, p->type, s_kv, 0.0f);
        ts[n_t - 1].ne[2] = nh;
        modelgen_add(ts, &n_t, N("attn_v_b.weight"), 3, kv_lora, vd, p->type, s_kv, 0.0f);
        ts[n_t - 1].ne[2] = nh;
        modelgen_add(ts, &n_t, N("attn_output.weight"), 2, nh * vd, d, p->type,
                     1.0f / sqrtf((float)(nh * vd)), 0.0f);
        modelgen_add(ts, &n_t, N("ffn_norm.weight"), 1, d, 1, 0, 0.1f, 1.0f);
        if (l < p->n_dense_lead) {
            modelgen_add(ts, &n_t, N("ffn_gate.weight"), 2, d, p->n_ff, p->type, s_dim, 0.0f);
            modelgen_add(ts, &n_t, N("ffn_up.weight"), 2, d, p->n_ff, p->type, s_dim, 0.0f);
            modelgen_add(ts, &n_t, N("ffn_down.weight"), 2, p->n_ff, d, p->type,
                         1.0f / sqrtf((float)p->n_ff), 0.0f);
            continue;
        }
        modelgen_add(ts, &n_t, N("ffn_gate_inp.weight"), 2, d, p->n_expert, QTYPE_F32, s_dim,
                     0.0f);
        /* the spread of the router's probabilities (softmax ~1/n_expert, sigmoid ~0.2) */
        if (p->exp_probs_b)
            modelgen_add(ts, &n_t, N("exp_probs_b.bias"), 1, p->n_expert, 1, 0, 0.1f, 0.0f);
        static const char *const exps[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
        for (int k = 0; k < 3; k++) {
            snprintf(nm, sizeof nm, "blk.%d.%s.weight", l, exps[k]);
            modelgen_add(ts, &n_t, nm, 3, k < 2 ? d : ff_exp, k < 2 ? ff_exp : d, p->type,
                         k < 2 ? s_dim : 1.0f / sqrtf((float)ff_exp), 0.0f);
            ts[n_t - 1].ne[2] = p->n_expert;
        }
        modelgen_add(ts, &n_t, N("ffn_gate_shexp.weight"), 2, d, ff_sh, p->type, s_dim, 0.0f);
        modelgen_add(ts, &n_t, N("ffn_up_shexp.weight"), 2, d, ff_sh, p->type, s_dim, 0.0f);
        modelgen_add(ts, &n_t, N("ffn_down_shexp.weight"), 2, ff_sh, d, p->type,
                     1.0f / sqrtf((float)ff_sh), 0.0f);
#undef N
    }
    /* the file's one KV head, for the mixes' attn_v rules */
    modelgen_params tp = *p;
    tp.n_head_kv = 1;
    int rc = modelgen_set_types(&tp, ts, n_t, err) < 0 ? -1 : modelgen_emit(p, w, ts, n_t, path, err);
    free(ts);
    return rc;
}

/* A decoder architecture's file as modelgen_write draws it: llama's tensors and keys,
 * and what each architecture adds or leaves out (each flag names the architectures that
 * have the feature). */
typedef struct decoder_arch {
    int hd;                 /* a head's dimensions */
    int64_t q_dim, kv_dim;  /* heads * hd, KV heads * hd */
    int rope_dims;          /* of each head's, rotated */
    int ff_exp, ff_shexp;   /* an expert's hidden size, the shared expert's */
    int n_blocks;           /* n_layer, and glm4moe's prediction layers after */
    float rope_base, eps;
    bool qwen2moe, qwen3moe, qwen2, hunyuan, qwen3, olmoe, olmo2, stablelm, glm4, chatglm;
    bool glm;               /* GLM-4's layers, ChatGLM's without the post norms */
    bool starcoder2, phi2;
    bool layer_norm;        /* LayerNorms with biases */
    bool granitemoe, phi3, granite, gemma2, gemma3, gemma, gptoss, cohere2, cohere, seed_oss;
    bool mistral3, exaone4;
    /* ERNIE 4.5's experts: llama's layer, dense leading layers, then experts with the
     * selection bias and, with n_ff_shexp, a shared expert */
    bool ernie;
    /* GLM-4.5's: qwen2's attention with half of each head rotated, post_attention_norm as
     * the feed-forward's norm, dense leading layers, experts with the selection bias (always)
     * and expert_shared_count shared ones, and nextn_layers prediction layers after the
     * model's (their nextn tensors beside a layer's own, as its converter writes them) */
    bool glm4moe;
    /* Command-R+'s per-head q/k norms: llama.cpp's command-r has them at 64 layers and more */
    bool qk_heads;
    bool shexp;             /* a shared expert */
    /* OLMo 2 and EXAONE 4 normalize their sublayers' outputs, not their inputs */
    bool post_norms_only;
} decoder_arch;

static bool arch_is(const modelgen_params *p, const char *name)
{
    return strcmp(p->arch, name) == 0;
}

static decoder_arch decoder_arch_of(const modelgen_params *p)
{
    decoder_arch a = {0};
    a.hd = p->head_dim ? p->head_dim : p->dim / p->n_head;
    a.q_dim = (int64_t)p->n_head * a.hd;
    a.kv_dim = (int64_t)p->n_head_kv * a.hd;
    a.qwen2moe = arch_is(p, "qwen2moe");
    a.qwen3moe = arch_is(p, "qwen3moe");
    a.qwen2 = arch_is(p, "qwen2") || a.qwen2moe;
    a.hunyuan = arch_is(p, "hunyuan-dense"); /* qwen3's tensors */
    a.qwen3 = arch_is(p, "qwen3") || a.qwen3moe || a.hunyuan;
    a.olmoe = arch_is(p, "olmoe");
    a.olmo2 = arch_is(p, "olmo2");
    a.stablelm = arch_is(p, "stablelm");
    a.glm4 = arch_is(p, "glm4");
    a.chatglm = arch_is(p, "chatglm");
    a.glm = a.glm4 || a.chatglm;
    a.starcoder2 = arch_is(p, "starcoder2");
    a.phi2 = arch_is(p, "phi2");
    a.layer_norm = a.stablelm || a.starcoder2 || a.phi2;
    a.granitemoe = arch_is(p, "granitemoe");
    a.phi3 = arch_is(p, "phi3");
    a.granite = arch_is(p, "granite") || a.granitemoe;
    a.gemma2 = arch_is(p, "gemma2");
    a.gemma3 = arch_is(p, "gemma3");
    a.gemma = a.gemma2 || a.gemma3 || arch_is(p, "gemma");
    a.gptoss = arch_is(p, "gpt-oss");
    a.cohere2 = arch_is(p, "cohere2");
    a.cohere = a.cohere2 || arch_is(p, "command-r");
    a.seed_oss = arch_is(p, "seed_oss");
    a.ernie = arch_is(p, "ernie4_5-moe");
    a.glm4moe = arch_is(p, "glm4moe");
    a.mistral3 = arch_is(p, "mistral3");
    a.exaone4 = arch_is(p, "exaone4");
    a.qk_heads = a.cohere && !a.cohere2 && p->n_layer >= 64;
    /* StableLM's partial_rotary_factor 0.25, GLM-4's and ChatGLM's 0.5 */
    a.rope_dims = p->rope_dims            ? p->rope_dims
                  : a.stablelm            ? (a.hd / 4 + 1) / 2 * 2
                  : a.glm || a.glm4moe    ? (a.hd / 2 + 1) / 2 * 2
                                          : a.hd;
    /* Phi-2's partial_rotary_factor 0.4, as its converter rounds it (32 of 80) */
    if (a.phi2 && !p->rope_dims)
        a.rope_dims = (int)(0.4 * p->dim) / p->n_head / 2 * 2;
    a.ff_exp = p->n_ff_exp ? p->n_ff_exp : p->n_ff;
    a.ff_shexp = a.glm4moe       ? a.ff_exp * p->n_expert_shared
                 : p->n_ff_shexp ? p->n_ff_shexp
                                 : p->n_ff;
    /* Granite MoE Shared's shared expert only when asked for */
    a.shexp = a.qwen2moe || ((a.granitemoe || a.ernie) && p->n_ff_shexp > 0) ||
              (a.glm4moe && p->n_expert_shared > 0);
    a.n_blocks = p->n_layer + p->nextn_layers;
    /* RoPE base: qwen's 1e6; gemma3's of its global layers 1e6 (rope_theta), its local
     * layers' 10000 being fixed; llama's and gemma/gemma2's 10000 */
    a.rope_base = a.qwen2 || a.qwen3 || a.gemma3 ? 1000000.0f : a.gptoss ? 150000.0f : 10000.0f;
    a.eps = a.qwen2 || a.qwen3 || a.gemma ? 1e-6f : 1e-5f;
    /* OLMo 2's and SmolLM3's rope_theta and rms_norm_eps, EXAONE's layer_norm_epsilon */
    if (a.olmo2)
        a.rope_base = 500000.0f, a.eps = 1e-6f;
    if (arch_is(p, "smollm3"))
        a.rope_base = 5000000.0f, a.eps = 1e-6f;
    /* EXAONE 3.5's, EXAONE 4.0's, Ministral 3's and StarCoder2-7B's rope_theta and epsilon */
    if (arch_is(p, "exaone") || a.exaone4 || a.mistral3 || a.starcoder2)
        a.rope_base = 1000000.0f, a.eps = 1e-5f;
    a.post_norms_only = a.olmo2 || a.exaone4;
    if (a.cohere) /* Aya Expanse 8B's and Command R7B's rope_theta, their layer_norm_eps */
        a.rope_base = a.cohere2 ? 50000.0f : 10000.0f, a.eps = 1e-5f;
    if (a.seed_oss) /* Seed-OSS-36B's */
        a.rope_base = 10000000.0f, a.eps = 1e-6f;
    if (a.hunyuan) /* Hunyuan-7B's rope_theta (raised by its alpha, below) and epsilon */
        a.rope_base = 10000.0f, a.eps = 1e-5f;
    return a;
}

/* The decoder's metadata under "{arch}.": llama's keys and each architecture's own.
 * 0, or -1 when the writer is out of memory. */
static int decoder_write_metadata(const modelgen_params *p, const decoder_arch *a,
                                  gguf_writer *w, int n_vocab)
{
    char key[128];
#define KEY(s) (snprintf(key, sizeof key, "%s." s, p->arch), key)
    if (gguf_writer_set_str(w, "general.architecture", p->arch) < 0 ||
        gguf_writer_set_str(w, "general.name", "random weights (mkmodel)") < 0 ||
        gguf_writer_set_u32(w, KEY("vocab_size"), (uint32_t)n_vocab) < 0 ||
        gguf_writer_set_u32(w, KEY("context_length"), (uint32_t)p->n_ctx) < 0 ||
        gguf_writer_set_u32(w, KEY("embedding_length"), (uint32_t)p->dim) < 0 ||
        gguf_writer_set_u32(w, KEY("block_count"), (uint32_t)a->n_blocks) < 0 ||
        gguf_writer_set_u32(w, KEY("feed_forward_length"), (uint32_t)p->n_ff) < 0 ||
        gguf_writer_set_u32(w, KEY("attention.head_count"), (uint32_t)p->n_head) < 0 ||
        gguf_writer_set_u32(w, KEY("attention.head_count_kv"), (uint32_t)p->n_head_kv) < 0 ||
        gguf_writer_set_u32(w, KEY("attention.key_length"), (uint32_t)a->hd) < 0 ||
        gguf_writer_set_u32(w, KEY("attention.value_length"), (uint32_t)a->hd) < 0 ||
        gguf_writer_set_u32(w, KEY("rope.dimension_count"), (uint32_t)a->rope_dims) < 0 ||
        gguf_writer_set_f32(w, KEY("rope.freq_base"), a->rope_base) < 0 ||
        gguf_writer_set_f32(w,
                            a->layer_norm || a->cohere ? KEY("attention.layer_norm_epsilon")
                                                       : KEY("attention.layer_norm_rms_epsilon"),
                            a->eps) < 0 ||
        (p->pooling_type &&
         gguf_writer_set_u32(w, KEY("pooling_type"), (uint32_t)p->pooling_type) < 0) ||
        (p->n_expert &&
         (gguf_writer_set_u32(w, KEY("expert_count"), (uint32_t)p->n_expert) < 0 ||
          gguf_writer_set_u32(w, KEY("expert_used_count"), (uint32_t)p->n_expert_used) < 0)) ||
        ((a->qwen2moe || a->qwen3moe || a->gptoss || a->ernie || a->glm4moe) &&
         gguf_writer_set_u32(w, KEY("expert_feed_forward_length"), (uint32_t)a->ff_exp) < 0) ||
        (a->glm4moe &&
         (gguf_writer_set_u32(w, KEY("expert_shared_count"), (uint32_t)p->n_expert_shared) < 0 ||
          gguf_writer_set_u32(w, KEY("leading_dense_block_count"), (uint32_t)p->n_dense_lead) < 0 ||
          (p->nextn_layers && gguf_writer_set_u32(w, KEY("nextn_predict_layers"),
                                                  (uint32_t)p->nextn_layers) < 0) ||
          (p->expert_gating &&
           gguf_writer_set_u32(w, KEY("expert_gating_func"), (uint32_t)p->expert_gating) < 0) ||
          (p->expert_weights_norm && gguf_writer_set_bool(w, KEY("expert_weights_norm"), true) < 0) ||
          (p->expert_weights_scale > 0 &&
           gguf_writer_set_f32(w, KEY("expert_weights_scale"), p->expert_weights_scale) < 0))) ||
        (a->ernie && (gguf_writer_set_u32(w, KEY("interleave_moe_layer_step"), 1) < 0 ||
                      gguf_writer_set_u32(w, KEY("leading_dense_block_count"),
                                          (uint32_t)p->n_dense_lead) < 0)) ||
        (a->shexp && gguf_writer_set_u32(w, KEY("expert_shared_feed_forward_length"),
                                         (uint32_t)a->ff_shexp) < 0) ||
        ((a->gemma2 || a->gemma3) &&
         gguf_writer_set_u32(w, KEY("attention.sliding_window"),
                             (uint32_t)(p->sliding_window ? p->sliding_window
                                                          : a->gemma2 ? 4096 : 1024)) < 0) ||
        (a->gemma2 && (gguf_writer_set_f32(w, KEY("attn_logit_softcapping"),
                                           p->attn_softcap > 0 ? p->attn_softcap : 50.0f) < 0 ||
                       gguf_writer_set_f32(w, KEY("final_logit_softcapping"),
                                           p->final_softcap > 0 ? p->final_softcap : 30.0f) < 0)) ||
        (p->rope_linear > 0 &&
         (gguf_writer_set_str(w, KEY("rope.scaling.type"), "linear") < 0 ||
          gguf_writer_set_f32(w, KEY("rope.scaling.factor"), p->rope_linear) < 0)) ||
        /* Hunyuan-7B's NTK-aware alpha */
        (a->hunyuan && gguf_writer_set_f32(w, KEY("rope.scaling.alpha"), 1000.0f) < 0))
        return -1;
    /* phi3 as convert_hf_to_gguf.py's Phi3MiniModel writes it; granite with Granite 3.x's
     * multipliers (the 2B's) */
    int orig_ctx = p->rope_orig_ctx ? p->rope_orig_ctx : p->n_ctx;
    double scale = (double)p->n_ctx / orig_ctx;
    float attn_factor = scale > 1.0 ? (float)sqrt(1.0 + log(scale) / log((double)orig_ctx)) : 1.0f;
    /* Ministral 3's YaRN: 16 times its original context of 16384 */
    int yarn_orig_ctx = p->rope_orig_ctx ? p->rope_orig_ctx : p->n_ctx >= 16 ? p->n_ctx / 16 : 1;
    if ((a->phi3 &&
         (gguf_writer_set_u32(w, KEY("rope.scaling.original_context_length"),
                              (uint32_t)orig_ctx) < 0 ||
          gguf_writer_set_u32(w, KEY("attention.sliding_window"),
                              (uint32_t)p->sliding_window) < 0 ||
          (p->rope_orig_ctx &&
           gguf_writer_set_f32(w, KEY("rope.scaling.attn_factor"), attn_factor) < 0))) ||
        (a->gptoss &&
         (gguf_writer_set_u32(w, KEY("attention.sliding_window"),
                              (uint32_t)(p->sliding_window ? p->sliding_window : 128)) < 0 ||
          gguf_writer_set_str(w, KEY("rope.scaling.type"), "yarn") < 0 ||
          gguf_writer_set_f32(w, KEY("rope.scaling.factor"), 32.0f) < 0 ||
          gguf_writer_set_u32(w, KEY("rope.scaling.original_context_length"), 4096) < 0 ||
          gguf_writer_set_f32(w, KEY("rope.scaling.yarn_beta_fast"), 32.0f) < 0 ||
          gguf_writer_set_f32(w, KEY("rope.scaling.yarn_beta_slow"), 1.0f) < 0)) ||
        (a->exaone4 && p->sliding_window &&
         (gguf_writer_set_u32(w, KEY("attention.sliding_window"),
                              (uint32_t)p->sliding_window) < 0 ||
          modelgen_write_swa_pattern(w, KEY("attention.sliding_window_pattern"), p->n_layer,
                                     4) < 0)) ||
        (a->mistral3 &&
         (gguf_writer_set_str(w, KEY("rope.scaling.type"), "yarn") < 0 ||
          gguf_writer_set_f32(w, KEY("rope.scaling.factor"),
                              (float)p->n_ctx / (float)yarn_orig_ctx) < 0 ||
          gguf_writer_set_u32(w, KEY("rope.scaling.original_context_length"),
                              (uint32_t)yarn_orig_ctx) < 0 ||
          gguf_writer_set_f32(w, KEY("rope.scaling.yarn_beta_fast"), 32.0f) < 0 ||
          gguf_writer_set_f32(w, KEY("rope.scaling.yarn_beta_slow"), 1.0f) < 0 ||
          gguf_writer_set_f32(w, KEY("rope.scaling.yarn_log_multiplier"), 1.0f) < 0 ||
          gguf_writer_set_f32(w, KEY("attention.temperature_scale"), 0.1f) < 0)) ||
        (a->granite &&
         (gguf_writer_set_f32(w, KEY("embedding_scale"), 12.0f) < 0 ||
          gguf_writer_set_f32(w, KEY("residual_scale"), 0.22f) < 0 ||
          gguf_writer_set_f32(w, KEY("attention.scale"), 0.015625f) < 0 ||
          gguf_writer_set_f32(w, KEY("logit_scale"), 8.0f) < 0)) ||
        /* Cohere's logit_scale: 2, where the published models' 0.0625 to 0.25 would
         * shrink a random model's logits under the tests' absolute tolerances */
        (a->cohere && gguf_writer_set_f32(w, KEY("logit_scale"), 2.0f) < 0) ||
        (a->cohere2 && gguf_writer_set_u32(w, KEY("attention.sliding_window"),
                                           (uint32_t)(p->sliding_window ? p->sliding_window
                                                                        : 4096)) < 0))
        return -1;
#undef KEY
    return 0;
}

/* Block l's tensors (a GLM-4.5 prediction layer's own first, past n_layer) into ts. */
static void decoder_add_block(const modelgen_params *p, const decoder_arch *a,
                              modelgen_tensor *ts, int *n_t, int l)
{
    float s_dim = 1.0f / sqrtf((float)p->dim), s_q = 1.0f / sqrtf((float)a->q_dim),
          s_ff = 1.0f / sqrtf((float)p->n_ff);
    char nm[64];
#define ADD(name, dims, c, r, sd, mu) modelgen_add(ts, n_t, name, dims, c, r, p->type, sd, mu)
    /* n_expert matrices of (r, c) in one tensor */
#define ADD_EXPERTS(name, c, r, sd)                                                    \
    do {                                                                               \
        ADD(name, 3, c, r, sd, 0.0f);                                                  \
        ts[*n_t - 1].ne[2] = p->n_expert;                                              \
    } while (0)
#define N(s) (snprintf(nm, sizeof nm, "blk.%d." s, l), nm)
    if (l >= p->n_layer) { /* GLM-4.5's multi-token prediction: its own tensors too */
        ADD(N("nextn.eh_proj.weight"), 2, 2 * p->dim, p->dim, s_dim, 0.0f);
        ADD(N("nextn.enorm.weight"), 1, p->dim, 1, 0.1f, 1.0f);
        ADD(N("nextn.hnorm.weight"), 1, p->dim, 1, 0.1f, 1.0f);
        ADD(N("nextn.shared_head_norm.weight"), 1, p->dim, 1, 0.1f, 1.0f);
    }
    if (!a->post_norms_only)
        ADD(N("attn_norm.weight"), 1, p->dim, 1, 0.1f, 1.0f);
    if (a->layer_norm)
        ADD(N("attn_norm.bias"), 1, p->dim, 1, 0.1f, 0.0f);
    if (a->phi3 || a->chatglm) {
        ADD(N("attn_qkv.weight"), 2, p->dim, a->q_dim + 2 * a->kv_dim, s_dim, 0.0f);
        if (a->chatglm) /* ChatGLM's query_key_value has a bias */
            ADD(N("attn_qkv.bias"), 1, a->q_dim + 2 * a->kv_dim, 1, 0.1f, 0.0f);
    } else {
        ADD(N("attn_q.weight"), 2, p->dim, a->q_dim, s_dim, 0.0f);
        ADD(N("attn_k.weight"), 2, p->dim, a->kv_dim, s_dim, 0.0f);
        ADD(N("attn_v.weight"), 2, p->dim, a->kv_dim, s_dim, 0.0f);
    }
    /* StableLM 2 1.6B's q/k/v biases, StarCoder2's, Phi-2's, GLM-4-0414's, Seed-OSS's */
    if (a->qwen2 || a->gptoss || a->layer_norm || a->glm4 || a->seed_oss || a->glm4moe) {
        ADD(N("attn_q.bias"), 1, a->q_dim, 1, 0.1f, 0.0f);
        ADD(N("attn_k.bias"), 1, a->kv_dim, 1, 0.1f, 0.0f);
        ADD(N("attn_v.bias"), 1, a->kv_dim, 1, 0.1f, 0.0f);
    }
    if (a->qwen3 || a->gemma3 || a->exaone4 || (a->glm4moe && p->glm_qk_norm)) {
        ADD(N("attn_q_norm.weight"), 1, a->hd, 1, 0.1f, 1.0f);
        ADD(N("attn_k_norm.weight"), 1, a->hd, 1, 0.1f, 1.0f);
    }
    if (a->olmoe || a->olmo2) {
        ADD(N("attn_q_norm.weight"), 1, a->q_dim, 1, 0.1f, 1.0f);
        ADD(N("attn_k_norm.weight"), 1, a->kv_dim, 1, 0.1f, 1.0f);
    }
    if (a->qk_heads) { /* one row per head, F32 as the converter keeps norms */
        ADD(N("attn_q_norm.weight"), 2, a->hd, p->n_head, 0.1f, 1.0f);
        ts[*n_t - 1].type = QTYPE_F32;
        ADD(N("attn_k_norm.weight"), 2, a->hd, p->n_head_kv, 0.1f, 1.0f);
        ts[*n_t - 1].type = QTYPE_F32;
    }
    ADD(N("attn_output.weight"), 2, a->q_dim, p->dim, s_q, 0.0f);
    if (a->gptoss) {
        /* sinks of about e^1 times one entry's weight: a share of the attention that
         * shows in the logits */
        ADD(N("attn_output.bias"), 1, p->dim, 1, 0.1f, 0.0f);
        ADD(N("attn_sinks.weight"), 1, p->n_head, 1, 1.0f, 1.0f);
    }
    /* gpt-oss's and Seed-OSS's feed-forward norm, named after HF's
     * post_attention_layernorm */
    if (a->gptoss || a->seed_oss || a->glm4moe)
        ADD(N("post_attention_norm.weight"), 1, p->dim, 1, 0.1f, 1.0f);
    if (a->gemma2 || a->gemma3 || a->post_norms_only || a->glm4)
        ADD(N("post_attention_norm.weight"), 1, p->dim, 1, 0.1f, 1.0f);
    /* Cohere's and Phi-2's feed-forward read attn_norm's output */
    if (!a->post_norms_only && !a->gptoss && !a->cohere && !a->phi2 && !a->seed_oss &&
        !a->glm4moe)
        ADD(N("ffn_norm.weight"), 1, p->dim, 1, 0.1f, 1.0f);
    if (a->layer_norm && !a->phi2)
        ADD(N("ffn_norm.bias"), 1, p->dim, 1, 0.1f, 0.0f);
    /* Starcoder2MLP: c_fc (ffn_up), c_proj (ffn_down), no gate; PhiMLP's fc1, fc2 */
    if (a->starcoder2 || a->phi2) {
        ADD(N("attn_output.bias"), 1, p->dim, 1, 0.1f, 0.0f);
        ADD(N("ffn_up.weight"), 2, p->dim, p->n_ff, s_dim, 0.0f);
        ADD(N("ffn_up.bias"), 1, p->n_ff, 1, 0.1f, 0.0f);
        ADD(N("ffn_down.weight"), 2, p->n_ff, p->dim, s_ff, 0.0f);
        ADD(N("ffn_down.bias"), 1, p->dim, 1, 0.1f, 0.0f);
        return;
    }
    /* the gate's rows, then the up's, as Phi3MLP and Glm4MLP chunk them */
    if (a->phi3 || a->glm) {
        ADD(N("ffn_up.weight"), 2, p->dim, 2 * p->n_ff, s_dim, 0.0f);
        ADD(N("ffn_down.weight"), 2, p->n_ff, p->dim, s_ff, 0.0f);
        if (a->glm4)
            ADD(N("post_ffw_norm.weight"), 1, p->dim, 1, 0.1f, 1.0f);
        return;
    }
    if (!p->n_expert || l < p->n_dense_lead) {
        ADD(N("ffn_gate.weight"), 2, p->dim, p->n_ff, s_dim, 0.0f);
        ADD(N("ffn_up.weight"), 2, p->dim, p->n_ff, s_dim, 0.0f);
        ADD(N("ffn_down.weight"), 2, p->n_ff, p->dim, s_ff, 0.0f);
        if (a->gemma2 || a->gemma3 || a->post_norms_only)
            ADD(N("post_ffw_norm.weight"), 1, p->dim, 1, 0.1f, 1.0f);
        return;
    }
    ADD(N("ffn_gate_inp.weight"), 2, p->dim, p->n_expert, s_dim, 0.0f);
    ts[*n_t - 1].type = QTYPE_F32;
    ADD_EXPERTS(N("ffn_gate_exps.weight"), p->dim, a->ff_exp, s_dim);
    ADD_EXPERTS(N("ffn_up_exps.weight"), p->dim, a->ff_exp, s_dim);
    ADD_EXPERTS(N("ffn_down_exps.weight"), a->ff_exp, p->dim, 1.0f / sqrtf((float)a->ff_exp));
    if (a->gptoss) { /* F32, 2-D ones one row per expert (modelgen_set_types keeps them) */
        ADD(N("ffn_gate_inp.bias"), 1, p->n_expert, 1, 0.5f, 0.0f);
        ADD(N("ffn_gate_exps.bias"), 2, a->ff_exp, p->n_expert, 0.1f, 0.0f);
        ts[*n_t - 1].type = QTYPE_F32;
        ADD(N("ffn_up_exps.bias"), 2, a->ff_exp, p->n_expert, 0.1f, 0.0f);
        ts[*n_t - 1].type = QTYPE_F32;
        ADD(N("ffn_down_exps.bias"), 2, p->dim, p->n_expert, 0.1f, 0.0f);
        ts[*n_t - 1].type = QTYPE_F32;
    }
    if (a->qwen2moe)
        ADD(N("ffn_gate_inp_shexp.weight"), 1, p->dim, 1, s_dim, 0.0f);
    /* of the order of the router's probabilities (~1/n_expert): it moves selections */
    if (p->exp_probs_b || a->glm4moe)
        ADD(N("exp_probs_b.bias"), 1, p->n_expert, 1, 0.5f / (float)p->n_expert, 0.0f);
    if (a->shexp) {
        ADD(N("ffn_gate_shexp.weight"), 2, p->dim, a->ff_shexp, s_dim, 0.0f);
        ADD(N("ffn_up_shexp.weight"), 2, p->dim, a->ff_shexp, s_dim, 0.0f);
        ADD(N("ffn_down_shexp.weight"), 2, a->ff_shexp, p->dim, 1.0f / sqrtf((float)a->ff_shexp),
            0.0f);
    }
#undef N
#undef ADD_EXPERTS
#undef ADD
}

int modelgen_write(const modelgen_params *p, const char *path, char err[ERR_MAX])
{
    if (modelgen_check(p, err) < 0)
        return -1;
    gguf_writer *w = gguf_writer_new();
    modelgen_tensor *ts = NULL;
    int n_t = 0, rc = -1;
    if (!w) {
        err_set(err, "out of memory");
        goto out;
    }
    int n_vocab = p->n_vocab;
    if (p->vocab) {
        n_vocab = modelgen_copy_vocab(w, p->vocab, err);
        if (n_vocab < 0)
            goto out;
    } else if (n_vocab < 3) {
        err_set(err, "a synthetic vocabulary needs at least 3 tokens");
        goto out;
    } else if (modelgen_synthetic_vocab(w, n_vocab) < 0) {
        err_set(err, "out of memory");
        goto out;
    }

    if (!strcmp(p->arch, "bert") || !strcmp(p->arch, "nomic-bert")) {
        rc = modelgen_write_bert(p, w, n_vocab, path, err);
        goto out;
    }
    if (!strcmp(p->arch, "gemma-embedding")) {
        rc = modelgen_write_gemma_embed(p, w, n_vocab, path, err);
        goto out;
    }
    if (!strcmp(p->arch, "deepseek2")) {
        rc = modelgen_write_deepseek2(p, w, n_vocab, path, err);
        goto out;
    }

    decoder_arch a = decoder_arch_of(p);
    if (decoder_write_metadata(p, &a, w, n_vocab) < 0) {
        err_set(err, "cannot set metadata");
        goto out;
    }
    ts = calloc((size_t)(5 + a.n_blocks * 24), sizeof *ts);
    if (!ts) {
        err_set(err, "out of memory");
        goto out;
    }
    float s_dim = 1.0f / sqrtf((float)p->dim);
    modelgen_add(ts, &n_t, "token_embd.weight", 2, p->dim, n_vocab, p->type, s_dim, 0.0f);
    modelgen_add(ts, &n_t, "output_norm.weight", 1, p->dim, 1, 0, 0.1f, 1.0f);
    if (a.layer_norm) /* its LayerNorms have biases */
        modelgen_add(ts, &n_t, "output_norm.bias", 1, p->dim, 1, 0, 0.1f, 0.0f);
    if ((!p->tie_output && !a.gemma && !a.cohere) || a.phi2)
        modelgen_add(ts, &n_t, "output.weight", 2, p->dim, n_vocab, p->type, s_dim, 0.0f);
    if (a.phi2) /* lm_head's bias */
        modelgen_add(ts, &n_t, "output.bias", 1, n_vocab, 1, 0, 0.1f, 0.0f);
    /* Phi-3-mini-128k's short factors are 1 to ~3, its long ones 1 to ~50 */
    if (a.phi3 && p->rope_orig_ctx) {
        modelgen_add(ts, &n_t, "rope_factors_long.weight", 1, a.rope_dims / 2, 1, 0, 1.5f, 4.0f);
        modelgen_add(ts, &n_t, "rope_factors_short.weight", 1, a.rope_dims / 2, 1, 0, 0.1f, 1.2f);
    }
    for (int l = 0; l < a.n_blocks; l++)
        decoder_add_block(p, &a, ts, &n_t, l);
    if (modelgen_set_types(p, ts, n_t, err) == 0)
        rc = modelgen_emit(p, w, ts, n_t, path, err);
out:
    free(ts);
    gguf_writer_free(w);
    return rc;
}

/* ---- LoRA adapters ---- */

/* The matrices of a decoder layer an adapter may adapt, by target bit. */
static const struct {
    unsigned bit;
    const char *name;
} modelgen_lora_layer[] = {
    {MODELGEN_LORA_Q, "attn_q.weight"},      {MODELGEN_LORA_K, "attn_k.weight"},
    {MODELGEN_LORA_V, "attn_v.weight"},      {MODELGEN_LORA_O, "attn_output.weight"},
    {MODELGEN_LORA_GATE, "ffn_gate.weight"}, {MODELGEN_LORA_UP, "ffn_up.weight"},
    {MODELGEN_LORA_DOWN, "ffn_down.weight"},
};
#define MODELGEN_LORA_PER_LAYER (int)(sizeof modelgen_lora_layer / sizeof modelgen_lora_layer[0])

/* Appends the pair of base tensor name (ne [in, out]) to ts: a with a_std, b with b_std,
 * lora_a of ne (a0, a1) and lora_b of ne (b0, b1). -1 + err when a row is not whole
 * blocks of type. */
static int modelgen_lora_pair(modelgen_tensor *ts, int *n, const char *name, uint32_t type,
                              int64_t a0, int64_t a1, float a_std, int64_t b0, int64_t b1,
                              float b_std, char err[ERR_MAX])
{
    if (quant_row_bytes(type, a0) == 0 || quant_row_bytes(type, b0) == 0)
        return err_set(err, "%s: rows of %lld and %lld elements are not whole blocks of %s "
                            "(the rank must be a multiple of its block size %d)", name,
                       (long long)a0, (long long)b0, quant_traits_of(type)->name,
                       quant_traits_of(type)->block_size);
    char nm[64]; /* base names are at most blk.4095.ffn_gate.weight */
    snprintf(nm, sizeof nm, "%.56s.lora_a", name);
    modelgen_add(ts, n, nm, 2, a0, a1, type, a_std, 0.0f);
    snprintf(nm, sizeof nm, "%.56s.lora_b", name);
    modelgen_add(ts, n, nm, 2, b0, b1, type, b_std, 0.0f);
    return 0;
}

int modelgen_write_lora(const modelgen_lora_params *p, const char *path, char err[ERR_MAX])
{
    gguf_str a;
    char arch[16], key[96];
    if (!gguf_get_str(p->base, "general.architecture", &a) ||
        !modelgen_lora_base_arch(a.ptr, a.len))
        return err_set(err, "the base is no llama, qwen2, qwen3, qwen2moe, qwen3moe, gemma, "
                            "gemma2 or gemma3 decoder");
    snprintf(arch, sizeof arch, "%.*s", (int)a.len, a.ptr);
    const quant_traits *tr = quant_traits_of(p->type);
    if (!tr || !tr->computable)
        return err_set(err, "adapter type %u is not supported", p->type);
    if (p->rank < 1 || p->rank > 65536)
        return err_set(err, "rank %d is not in 1..65536", p->rank);
    if (!isfinite(p->alpha))
        return err_set(err, "alpha is not a number");
    if (!(p->targets & (MODELGEN_LORA_LAYERS | MODELGEN_LORA_OUTPUT | MODELGEN_LORA_TOKEN_EMBD)))
        return err_set(err, "no matrix to adapt");
    int64_t n_layer;
    snprintf(key, sizeof key, "%s.block_count", arch);
    if (!gguf_get_i64(p->base, key, &n_layer) || n_layer < 1 || n_layer > 4096)
        return err_set(err, "the base has no %s in 1..4096", key);

    int max_t = 2 * (2 + (int)n_layer * MODELGEN_LORA_PER_LAYER), n_t = 0, rc = -1;
    modelgen_tensor *ts = calloc((size_t)max_t, sizeof *ts);
    gguf_writer *w = gguf_writer_new();
    if (!ts || !w) {
        err_set(err, "out of memory");
        goto out;
    }
    /* B's scale: s B (A x) about 0.2 per element at scale 1 (A x has unit elements) */
    float factor = p->alpha != 0.0f ? p->alpha / (float)p->rank : 1.0f, r = (float)p->rank;
    float b_std = 0.2f / sqrtf(r) / fabsf(factor);
    for (int64_t l = -1; l < n_layer; l++) {
        for (int k = 0; k < (l < 0 ? 2 : MODELGEN_LORA_PER_LAYER); k++) {
            char name[64];
            unsigned bit;
            if (l < 0) {
                bit = k == 0 ? MODELGEN_LORA_TOKEN_EMBD : MODELGEN_LORA_OUTPUT;
                snprintf(name, sizeof name, "%s", k == 0 ? "token_embd.weight" : "output.weight");
            } else {
                bit = modelgen_lora_layer[k].bit;
                snprintf(name, sizeof name, "blk.%lld.%s", (long long)l, modelgen_lora_layer[k].name);
            }
            if (!(p->targets & bit))
                continue;
            const gguf_tensor *bt = gguf_find_tensor(p->base, name);
            if (!bt) {
                err_set(err, "the base has no tensor '%s'%s", name,
                        bit == MODELGEN_LORA_OUTPUT ? " (it ties its output to token_embd)" : "");
                goto out;
            }
            if (bt->n_dims != 2) {
                err_set(err, "base tensor '%s' is not a matrix", name);
                goto out;
            }
            int64_t in = bt->ne[0], outs = bt->ne[1];
            int prc = bit == MODELGEN_LORA_TOKEN_EMBD
                          /* flipped: a row of A per token, B maps it to the embedding */
                          ? modelgen_lora_pair(ts, &n_t, name, p->type, r, outs, 1.0f, r, in,
                                               b_std / sqrtf((float)in), err)
                          : modelgen_lora_pair(ts, &n_t, name, p->type, in, r,
                                               1.0f / sqrtf((float)in), r, outs, b_std, err);
            if (prc < 0)
                goto out;
        }
    }
    if (gguf_writer_set_str(w, "general.architecture", arch) < 0 ||
        gguf_writer_set_str(w, "general.type", "adapter") < 0 ||
        gguf_writer_set_str(w, "general.name", "random LoRA adapter (mkmodel)") < 0 ||
        gguf_writer_set_str(w, "adapter.type", "lora") < 0 ||
        gguf_writer_set_f32(w, "adapter.lora.alpha", p->alpha) < 0) {
        err_set(err, "cannot set metadata");
        goto out;
    }
    modelgen_params gp = {.seed = p->seed, .n_threads = p->n_threads};
    rc = modelgen_emit(&gp, w, ts, n_t, path, err);
out:
    free(ts);
    gguf_writer_free(w);
    return rc;
}

/* One adapter being merged (modelgen_convert). */
typedef struct modelgen_merge {
    const char *path;
    gguf_file *g;
    float scale;   /* the user's */
    float alpha;   /* adapter.lora.alpha; 0: none */
} modelgen_merge;

static int modelgen_merge_open(modelgen_merge *a, const gguf_file *in, char err[ERR_MAX])
{
    char why[ERR_MAX];
    gguf_str s, arch;
    if (!(a->g = gguf_open(a->path, why)))
        return err_set(err, "%s: %s", a->path, why);
    if (!gguf_get_str(a->g, "general.type", &s) || !gguf_str_eq(s, "adapter"))
        return err_set(err, "%s: not an adapter (general.type is not 'adapter')", a->path);
    if (!gguf_get_str(a->g, "adapter.type", &s) || !gguf_str_eq(s, "lora"))
        return err_set(err, "%s: adapter.type is not 'lora'", a->path);
    if (!gguf_get_str(a->g, "general.architecture", &s) ||
        !gguf_get_str(in, "general.architecture", &arch) || s.len != arch.len ||
        memcmp(s.ptr, arch.ptr, s.len) != 0)
        return err_set(err, "%s: its architecture is not the model's", a->path);
    a->alpha = 0.0f;
    if (gguf_find_key(a->g, "adapter.lora.alpha") >= 0 &&
        (!gguf_get_f32(a->g, "adapter.lora.alpha", &a->alpha) || !isfinite(a->alpha)))
        return err_set(err, "%s: adapter.lora.alpha is not a number", a->path);
    /* a tensor merged into nothing would be part of the adapter silently dropped */
    for (int64_t k = 0; k < gguf_n_tensors(a->g); k++) {
        gguf_str n = gguf_tensor_at(a->g, k)->name;
        bool pair = n.len > 7 && (memcmp(n.ptr + n.len - 7, ".lora_a", 7) == 0 ||
                                  memcmp(n.ptr + n.len - 7, ".lora_b", 7) == 0);
        char base[160];
        snprintf(base, sizeof base, "%.*s", (int)(pair && n.len < sizeof base ? n.len - 7 : 0),
                 n.ptr);
        if (!pair || !gguf_find_tensor(in, base))
            return err_set(err, "%s: tensor '%.*s' adapts no matrix of the model", a->path,
                           (int)(n.len > 96 ? 96 : n.len), n.ptr);
    }
    return 0;
}

/* A tensor of an adapter as an f32 matrix of ne[1] rows of ne[0]; NULL + err. */
static float *modelgen_merge_matrix(const modelgen_merge *a, const gguf_tensor *t,
                                    char err[ERR_MAX])
{
    const quant_traits *tr = quant_traits_of(t->type);
    size_t rb = quant_row_bytes(t->type, t->ne[0]);
    if (t->n_dims != 2 || !tr || !tr->computable || rb == 0 || t->bytes < rb * (size_t)t->ne[1]) {
        err_set(err, "%s: tensor '%.*s' is not a matrix of a computable type", a->path,
                (int)t->name.len, t->name.ptr);
        return NULL;
    }
    float *m = malloc((size_t)t->ne[0] * (size_t)t->ne[1] * sizeof *m);
    if (!m) {
        err_set(err, "out of memory");
        return NULL;
    }
    for (int64_t r = 0; r < t->ne[1]; r++)
        quant_dequantize_row(t->type, (const char *)t->data + (size_t)r * rb,
                             m + (size_t)r * t->ne[0], t->ne[0]);
    return m;
}

/* One adapter's pair for the matrix being merged, dequantized: B A added to the matrix's
 * rows of cols, or for the token embedding A B^T, a row per token. */
typedef struct merge_pair {
    float *A;     /* (rank, cols); token_embd: (rows, rank) */
    float *B;     /* (rows, rank); token_embd: (cols, rank) */
    int64_t rank;
    double scale; /* the user's scale * alpha / rank */
    bool embd;
} merge_pair;

/* Loads adapter a's pair for name into *p (p->A NULL where a has none; the caller frees A
 * and B, on failure too). 0, or -1 + err. */
static int modelgen_merge_pair_load(const modelgen_merge *a, const char *name, int64_t rows,
                                    int64_t cols, merge_pair *p, char err[ERR_MAX])
{
    char an[160], bn[160];
    snprintf(an, sizeof an, "%s.lora_a", name);
    snprintf(bn, sizeof bn, "%s.lora_b", name);
    const gguf_tensor *ta = gguf_find_tensor(a->g, an), *tb = gguf_find_tensor(a->g, bn);
    *p = (merge_pair){0};
    if (!ta && !tb)
        return 0;
    if (!ta || !tb)
        return err_set(err, "%s: '%s' has only one of lora_a and lora_b", a->path, name);
    p->embd = strcmp(name, "token_embd.weight") == 0;
    p->rank = tb->ne[0];
    bool fits = p->embd ? ta->ne[0] == p->rank && ta->ne[1] == rows && tb->ne[1] == cols
                        : ta->ne[0] == cols && ta->ne[1] == p->rank && tb->ne[1] == rows;
    if (!fits)
        return err_set(err, "%s: the shapes of '%s' (lora_a [%lld, %lld], lora_b [%lld, %lld]) "
                            "do not fit the model's [%lld, %lld]", a->path, name,
                       (long long)ta->ne[0], (long long)ta->ne[1], (long long)tb->ne[0],
                       (long long)tb->ne[1], (long long)cols, (long long)rows);
    p->scale = (double)a->scale * (a->alpha != 0.0f ? (double)a->alpha / (double)p->rank : 1.0);
    p->A = modelgen_merge_matrix(a, ta, err);
    p->B = p->A ? modelgen_merge_matrix(a, tb, err) : NULL;
    return p->B ? 0 : -1;
}

/* One tensor's rows dequantized from one type and quantized to another, every adapter's
 * pair added in double on the way, split among a pool's threads: the quantizers' searches
 * make conversion CPU-bound. A row's sums run in one order, so the bytes do not depend on
 * the number of threads. */
typedef struct convert_job {
    uint32_t from, to;
    const uint8_t *src; /* (rows, in_rb bytes) */
    uint8_t *dst;       /* (rows, out_rb bytes) */
    size_t in_rb, out_rb;
    int64_t rows, cols;
    const merge_pair *pairs; /* (n_pairs); a pair with no A adds nothing */
    int n_pairs;
    double *acc; /* (n_threads, cols); NULL with no pairs */
    float *row;  /* (n_threads, cols) */
} convert_job;

/* Adds the adapters' pairs to row o, acc (cols), in double. */
static void convert_add_pairs(const convert_job *j, int64_t o, double *acc)
{
    int64_t cols = j->cols;
    for (int i = 0; i < j->n_pairs; i++) {
        const merge_pair *pr = &j->pairs[i];
        if (!pr->A)
            continue;
        if (pr->embd) { /* token o: A's row o through B (cols rows of rank) */
            const float *ao = pr->A + (size_t)o * pr->rank;
            for (int64_t d = 0; d < cols; d++) {
                const float *bd = pr->B + (size_t)d * pr->rank;
                double dot = 0;
                for (int64_t k = 0; k < pr->rank; k++)
                    dot += (double)ao[k] * bd[k];
                acc[d] += pr->scale * dot;
            }
            continue;
        }
        for (int64_t k = 0; k < pr->rank; k++) {
            double bk = pr->scale * pr->B[(size_t)o * pr->rank + k];
            const float *ak = pr->A + (size_t)k * cols;
            for (int64_t c = 0; c < cols; c++)
                acc[c] += bk * ak[c];
        }
    }
}

static void convert_rows_job(void *p, int ith, int nth)
{
    convert_job *j = p;
    int64_t cols = j->cols;
    float *row = j->row + (size_t)ith * (size_t)cols;
    long b, e;
    tp_split(j->rows, ith, nth, &b, &e);
    for (long o = b; o < e; o++) {
        quant_dequantize_row(j->from, j->src + (size_t)o * j->in_rb, row, cols);
        if (j->acc) {
            double *acc = j->acc + (size_t)ith * (size_t)cols;
            for (int64_t c = 0; c < cols; c++)
                acc[c] = row[c];
            convert_add_pairs(j, o, acc);
            for (int64_t c = 0; c < cols; c++)
                row[c] = (float)acc[c];
        }
        quant_quantize_row(j->to, row, j->dst + (size_t)o * j->out_rb, cols);
    }
}

/* Tensor t (rows of ne[0]) converted to type on pool into *dst (malloc'd), with every
 * adapter's pair added where adapted (then rounded to F32 when its rows are not whole
 * blocks of type); *dst_type set. 0, or -1 + err. */
static int modelgen_convert_tensor(const gguf_tensor *t, const char *name, bool adapted,
                                   modelgen_merge *ad, int n_ad, uint32_t type, tp_pool *pool,
                                   void **dst, uint32_t *dst_type, char err[ERR_MAX])
{
    int64_t cols = t->ne[0], rows = 1;
    for (uint32_t d = 1; d < t->n_dims; d++)
        rows *= t->ne[d];
    const quant_traits *tr = quant_traits_of(t->type);
    if (adapted && (t->n_dims != 2 || !tr || !tr->computable))
        return err_set(err, "%s: adapted, but not a matrix of a computable type", name);
    if (!tr || !tr->computable)
        return err_set(err, "%s: type %u cannot be read", name, t->type);
    if (!quant_traits_of(type)->computable)
        return err_set(err, "%s: type %s cannot be written", name, quant_traits_of(type)->name);
    *dst_type = !adapted || quant_row_bytes(type, cols) ? type : QTYPE_F32;
    size_t nth = (size_t)tp_n_threads(pool);
    convert_job job = {.from = t->type, .to = *dst_type, .src = t->data,
                       .in_rb = quant_row_bytes(t->type, cols),
                       .out_rb = quant_row_bytes(*dst_type, cols), .rows = rows, .cols = cols};
    merge_pair *pairs = adapted ? calloc((size_t)n_ad, sizeof *pairs) : NULL;
    job.acc = adapted ? malloc(nth * (size_t)cols * sizeof *job.acc) : NULL;
    job.row = malloc(nth * (size_t)cols * sizeof *job.row);
    job.dst = *dst = malloc(job.out_rb * (size_t)rows);
    int rc = -1;
    if ((adapted && (!pairs || !job.acc)) || !job.row || !*dst) {
        err_set(err, "%s: out of memory", name);
        goto out;
    }
    for (int i = 0; adapted && i < n_ad; i++)
        if (modelgen_merge_pair_load(&ad[i], name, rows, cols, &pairs[i], err) < 0)
            goto out;
    job.pairs = pairs;
    job.n_pairs = adapted ? n_ad : 0;
    tp_run(pool, convert_rows_job, &job);
    rc = 0;
out:
    for (int i = 0; pairs && i < n_ad; i++)
        free(pairs[i].A), free(pairs[i].B);
    free(pairs), free(job.acc), free(job.row);
    return rc;
}

/* Whether any adapter has a tensor of name's pair. */
static bool modelgen_adapted(const modelgen_merge *ad, int n_ad, const char *name)
{
    char an[160], bn[160];
    snprintf(an, sizeof an, "%s.lora_a", name);
    snprintf(bn, sizeof bn, "%s.lora_b", name);
    for (int i = 0; i < n_ad; i++)
        if (gguf_find_tensor(ad[i].g, an) || gguf_find_tensor(ad[i].g, bn))
            return true;
    return false;
}

/* The value of the u32 key "{arch}.suffix" of g, or 0 where there is none. */
static uint32_t arch_u32(const gguf_file *g, const char *suffix)
{
    gguf_str arch;
    char key[160];
    uint32_t v = 0;
    if (gguf_get_str(g, "general.architecture", &arch) && arch.len < 100) {
        snprintf(key, sizeof key, "%.*s.%s", (int)arch.len, arch.ptr, suffix);
        gguf_get_u32(g, key, &v);
    }
    return v;
}

int modelgen_convert(const char *in, const char *out, uint32_t type, modelgen_mix mix,
                     int n_lora, const char *const *lora, const float *scales, int n_threads,
                     char err[ERR_MAX])
{
    const quant_traits *tt = quant_traits_of(type);
    if (!tt || !tt->computable)
        return err_set(err, "type %u is not supported", type);
    gguf_file *g = gguf_open(in, err);
    if (!g)
        return -1;
    gguf_writer *w = gguf_writer_new();
    int64_t n_tensors = gguf_n_tensors(g);
    void **bufs = calloc((size_t)n_tensors + 1, sizeof *bufs);
    modelgen_merge *ad = calloc((size_t)n_lora + 1, sizeof *ad);
    tp_pool *pool = NULL; /* made by the first matrix to convert */
    int rc = -1;
    if (!w || !bufs || !ad) {
        err_set(err, "out of memory");
        goto out;
    }
    for (int i = 0; i < n_lora; i++) {
        ad[i].path = lora[i];
        ad[i].scale = scales[i];
        if (modelgen_merge_open(&ad[i], g, err) < 0)
            goto out;
    }
    for (int64_t i = 0; i < gguf_n_kv(g); i++)
        if (gguf_writer_copy_kv(w, g, i) < 0) {
            err_set(err, "copying metadata: out of memory");
            goto out;
        }
    int n_layer = (int)arch_u32(g, "block_count");
    uint32_t heads = arch_u32(g, "attention.head_count");
    uint32_t kv = arch_u32(g, "attention.head_count_kv");
    int n_gqa = heads && kv ? (int)(heads / kv) : 1;
    bool has_output = gguf_find_tensor(g, "output.weight") != NULL;
    for (int64_t i = 0; i < n_tensors; i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        char name[128]; /* GGUF names are at most 64 bytes by convention; messages cut longer */
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        int64_t n = t->ne[0];
        const void *data = t->data;
        uint32_t to = t->type, want = t->type;
        /* a mix's type per matrix, its fallbacks for rows of no whole super-block included;
         * routers stay as they are, as llama-quantize keeps them */
        if (t->n_dims >= 2 && !strstr(name, "ffn_gate_inp") &&
            (mix != MODELGEN_MIX_NONE || n % tt->block_size == 0))
            want = modelgen_mix_type(mix, type, name, n, n_layer, n_gqa, has_output);
        bool adapted = modelgen_adapted(ad, n_lora, name);
        if ((adapted || want != t->type) && !pool && !(pool = tp_new(n_threads, err)))
            goto out;
        if (adapted || want != t->type) {
            if (modelgen_convert_tensor(t, name, adapted, ad, n_lora,
                                        adapted && want == t->type ? type : want, pool, &bufs[i],
                                        &to, err) < 0)
                goto out;
            data = bufs[i];
        }
        if (gguf_writer_add_tensor(w, name, to, t->n_dims, t->ne, data) < 0) {
            err_set(err, "%s: out of memory", name);
            goto out;
        }
    }
    rc = gguf_writer_write(w, out, err);
out:
    for (int64_t i = 0; bufs && i < n_tensors; i++)
        free(bufs[i]);
    for (int i = 0; ad && i < n_lora; i++)
        gguf_close(ad[i].g);
    tp_free(pool);
    free(bufs), free(ad);
    gguf_writer_free(w);
    gguf_close(g);
    return rc;
}
