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
    int64_t ne[2];   /* cols, rows */
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
    int64_t cols = t->ne[0], rows = t->n_dims == 1 ? 1 : t->ne[1];
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
        int64_t rows = t->n_dims == 1 ? 1 : t->ne[1];
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
        if (t->n_dims != 2)
            continue;
        t->type = modelgen_mix_type(p->mix, p->type, t->name, t->ne[0], p->n_layer,
                                    p->n_head / p->n_head_kv, has_output);
        const quant_traits *tr = quant_traits_of(t->type);
        if (!tr->computable)
            return err_set(err, "%s: type %s is not supported", t->name, tr->name);
        if (t->ne[0] % tr->block_size)
            return err_set(err, "%s: row length %lld is not a multiple of %s's block size %d",
                           t->name, (long long)t->ne[0], tr->name, tr->block_size);
    }
    return 0;
}

static int modelgen_check(const modelgen_params *p, char err[ERR_MAX])
{
    bool nomic = strcmp(p->arch, "nomic-bert") == 0, bert = nomic || !strcmp(p->arch, "bert");
    if (strcmp(p->arch, "llama") != 0 && strcmp(p->arch, "qwen2") != 0 &&
        strcmp(p->arch, "qwen3") != 0 && !bert)
        return err_set(err, "unknown architecture '%s'", p->arch);
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
 * token types. nomic-bert as nomic-embed-text: fused attn_qkv, SwiGLU, no biases but the
 * LayerNorms', RoPE base 1000. */
static int modelgen_write_bert(const modelgen_params *p, gguf_writer *w, int n_vocab,
                               const char *path, char err[ERR_MAX])
{
    bool nomic = strcmp(p->arch, "nomic-bert") == 0;
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
        gguf_writer_set_u32(w, "tokenizer.ggml.token_type_count", 2) < 0)
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
    modelgen_add(ts, &n_t, "token_types.weight", 2, d, 2, p->type, 0.5f, 0.0f);
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

int modelgen_write(const modelgen_params *p, const char *path, char err[ERR_MAX])
{
    if (modelgen_check(p, err) < 0)
        return -1;
    int hd = p->head_dim ? p->head_dim : p->dim / p->n_head;
    int64_t q_dim = (int64_t)p->n_head * hd, kv_dim = (int64_t)p->n_head_kv * hd;
    bool qwen2 = strcmp(p->arch, "qwen2") == 0, qwen3 = strcmp(p->arch, "qwen3") == 0;

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

    char key[128];
#define KEY(s) (snprintf(key, sizeof key, "%s." s, p->arch), key)
    if (gguf_writer_set_str(w, "general.architecture", p->arch) < 0 ||
        gguf_writer_set_str(w, "general.name", "random weights (mkmodel)") < 0 ||
        gguf_writer_set_u32(w, KEY("vocab_size"), (uint32_t)n_vocab) < 0 ||
        gguf_writer_set_u32(w, KEY("context_length"), (uint32_t)p->n_ctx) < 0 ||
        gguf_writer_set_u32(w, KEY("embedding_length"), (uint32_t)p->dim) < 0 ||
        gguf_writer_set_u32(w, KEY("block_count"), (uint32_t)p->n_layer) < 0 ||
        gguf_writer_set_u32(w, KEY("feed_forward_length"), (uint32_t)p->n_ff) < 0 ||
        gguf_writer_set_u32(w, KEY("attention.head_count"), (uint32_t)p->n_head) < 0 ||
        gguf_writer_set_u32(w, KEY("attention.head_count_kv"), (uint32_t)p->n_head_kv) < 0 ||
        gguf_writer_set_u32(w, KEY("attention.key_length"), (uint32_t)hd) < 0 ||
        gguf_writer_set_u32(w, KEY("attention.value_length"), (uint32_t)hd) < 0 ||
        gguf_writer_set_u32(w, KEY("rope.dimension_count"), (uint32_t)hd) < 0 ||
        gguf_writer_set_f32(w, KEY("rope.freq_base"), qwen2 || qwen3 ? 1000000.0f : 10000.0f) < 0 ||
        gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), qwen2 || qwen3 ? 1e-6f : 1e-5f) < 0 ||
        (p->pooling_type &&
         gguf_writer_set_u32(w, KEY("pooling_type"), (uint32_t)p->pooling_type) < 0)) {
        err_set(err, "cannot set metadata");
        goto out;
    }
#undef KEY

    int max_t = 3 + p->n_layer * 14;
    ts = calloc((size_t)max_t, sizeof *ts);
    if (!ts) {
        err_set(err, "out of memory");
        goto out;
    }
#define ADD(nm, dims, c, r, sd, mu)                                                    \
    do {                                                                               \
        modelgen_tensor *t_ = &ts[n_t++];                                              \
        snprintf(t_->name, sizeof t_->name, "%s", nm);                                 \
        t_->n_dims = dims;                                                             \
        t_->type = (dims) == 1 ? QTYPE_F32 : p->type;                                  \
        t_->ne[0] = c;                                                                 \
        t_->ne[1] = r;                                                                 \
        t_->std = sd;                                                                  \
        t_->mean = mu;                                                                 \
    } while (0)
    float s_dim = 1.0f / sqrtf((float)p->dim), s_q = 1.0f / sqrtf((float)q_dim),
          s_ff = 1.0f / sqrtf((float)p->n_ff);
    ADD("token_embd.weight", 2, p->dim, n_vocab, s_dim, 0.0f);
    ADD("output_norm.weight", 1, p->dim, 1, 0.1f, 1.0f);
    if (!p->tie_output) {
        ADD("output.weight", 2, p->dim, n_vocab, s_dim, 0.0f);
    }
    for (int l = 0; l < p->n_layer; l++) {
        char nm[64];
#define N(s) (snprintf(nm, sizeof nm, "blk.%d." s, l), nm)
        ADD(N("attn_norm.weight"), 1, p->dim, 1, 0.1f, 1.0f);
        ADD(N("attn_q.weight"), 2, p->dim, q_dim, s_dim, 0.0f);
        ADD(N("attn_k.weight"), 2, p->dim, kv_dim, s_dim, 0.0f);
        ADD(N("attn_v.weight"), 2, p->dim, kv_dim, s_dim, 0.0f);
        if (qwen2) {
            ADD(N("attn_q.bias"), 1, q_dim, 1, 0.1f, 0.0f);
            ADD(N("attn_k.bias"), 1, kv_dim, 1, 0.1f, 0.0f);
            ADD(N("attn_v.bias"), 1, kv_dim, 1, 0.1f, 0.0f);
        }
        if (qwen3) {
            ADD(N("attn_q_norm.weight"), 1, hd, 1, 0.1f, 1.0f);
            ADD(N("attn_k_norm.weight"), 1, hd, 1, 0.1f, 1.0f);
        }
        ADD(N("attn_output.weight"), 2, q_dim, p->dim, s_q, 0.0f);
        ADD(N("ffn_norm.weight"), 1, p->dim, 1, 0.1f, 1.0f);
        ADD(N("ffn_gate.weight"), 2, p->dim, p->n_ff, s_dim, 0.0f);
        ADD(N("ffn_up.weight"), 2, p->dim, p->n_ff, s_dim, 0.0f);
        ADD(N("ffn_down.weight"), 2, p->n_ff, p->dim, s_ff, 0.0f);
#undef N
    }
#undef ADD

    if (modelgen_set_types(p, ts, n_t, err) == 0)
        rc = modelgen_emit(p, w, ts, n_t, path, err);
out:
    free(ts);
    gguf_writer_free(w);
    return rc;
}
