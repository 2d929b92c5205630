/*
 * gemma_embed.c — EmbeddingGemma's loading and layer-by-layer forward (gemma_embed.h).
 *
 * Matrices are used in place from the mapping; the norm weights are converted to f32 once.
 * A layer is six dispatches over the stacked rows — q/k/v products, the per-head norms and
 * RoPE, attention per (sequence, head), the output product, gate/up, down — with the
 * residual RMSNorms split over the pool between them.
 */
#include "engine/encoder/gemma_embed.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/model.h"
#include "engine/model/ops.h"
#include "engine/quant/blas.h"
#include "engine/quant/quant.h"

#define GE_ARCH "gemma-embedding"
/* Keeps every size product of a file's dimensions far from overflow. */
#define GE_MAX_POS (1 << 16)
#define GE_MAX_LAYERS 4096

typedef struct ge_layer {
    ops_matrix wq;          /* (n_head * head_dim, dim) */
    ops_matrix wk, wv;      /* (n_head_kv * head_dim, dim) */
    ops_matrix wo;          /* (dim, n_head * head_dim) */
    ops_matrix gate, up;    /* (n_ff, dim) */
    ops_matrix down;        /* (dim, n_ff) */
    const float *attn_norm; /* (dim) */
    const float *q_norm, *k_norm; /* (head_dim) */
    const float *attn_post_norm;  /* (dim) post_attention_norm */
    const float *ffn_norm;        /* (dim) */
    const float *ffn_post_norm;   /* (dim) post_ffw_norm */
    bool slides;            /* a sliding layer (else global) */
} ge_layer;

struct gemma_embed {
    const gguf_file *g;
    bert_hparams *hp;       /* the bert_model's, filled here */
    int n_head_kv;
    int half_window;        /* a sliding layer's row sees positions within this distance */
    float rope_base_swa;
    float embd_scale;       /* sqrt(dim) */
    ops_matrix tok_embd;    /* (n_vocab, dim) */
    const float *out_norm;  /* (dim) output_norm */
    int n_dense;            /* dense_2's outputs = dense_3's inputs; 0 without dense layers */
    bool has_dense2, has_dense3;
    ops_matrix dense2;      /* (n_dense, dim) */
    ops_matrix dense3;      /* (dim, n_dense) */
    ge_layer *layers;       /* (n_layer) */
    float *vecs;            /* every norm weight, back to back */
    size_t vecs_used, vecs_cap;
};

/* ---- loading ---- */

static int ge_matrix(const gemma_embed *m, const char *name, int64_t rows, int64_t cols,
                     ops_matrix *out, char err[ERR_MAX])
{
    const gguf_tensor *t = model_gguf_tensor(m->g, name, 2, cols, rows, err);
    if (!t)
        return -1;
    *out = (ops_matrix){.type = t->type, .data = t->data, .rows = (int)rows, .cols = (int)cols,
                        .row_bytes = quant_row_bytes(t->type, cols)};
    return 0;
}

/* A 1-D tensor of n elements converted to f32 into m->vecs. */
static int ge_vec(gemma_embed *m, const char *name, int64_t n, const float **out,
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

/* {arch}.attention.sliding_window_pattern: a period P (layer l slides when l % P < P - 1,
 * llama.cpp's set_swa_pattern; 6 when absent) or a boolean per layer. */
static int ge_read_pattern(gemma_embed *m, char err[ERR_MAX])
{
    const char *key = GE_ARCH ".attention.sliding_window_pattern";
    int n_layer = m->hp->n_layer;
    enum gguf_value_type et;
    uint64_t n;
    if (gguf_get_arr(m->g, key, &et, &n)) {
        bool *slides = malloc((size_t)n_layer * sizeof *slides);
        if (!slides)
            return err_set(err, "out of memory");
        bool ok = gguf_arr_bool(m->g, key, slides, (uint64_t)n_layer);
        for (int l = 0; ok && l < n_layer; l++)
            m->layers[l].slides = slides[l];
        free(slides);
        return ok ? 0 : err_set(err, "metadata key '%s' is not %d booleans", key, n_layer);
    }
    int period;
    if (model_get_dim(m->g, GE_ARCH, "attention.sliding_window_pattern", 6, &period, err) < 0)
        return -1;
    for (int l = 0; l < n_layer; l++)
        m->layers[l].slides = l % period < period - 1;
    return 0;
}

static int ge_read_hparams(gemma_embed *m, char err[ERR_MAX])
{
    bert_hparams *hp = m->hp;
    const gguf_file *g = m->g;
    int key_len, val_len, rot, window;
    float eps;
    /* llama.cpp requires the epsilon of the architecture */
    if (gguf_find_key(g, GE_ARCH ".attention.layer_norm_rms_epsilon") < 0)
        return err_set(err, "missing metadata key '" GE_ARCH
                            ".attention.layer_norm_rms_epsilon'");
    if (model_get_dim(g, GE_ARCH, "embedding_length", -1, &hp->dim, err) < 0 ||
        model_get_dim(g, GE_ARCH, "block_count", -1, &hp->n_layer, err) < 0 ||
        model_get_dim(g, GE_ARCH, "feed_forward_length", -1, &hp->n_ff, err) < 0 ||
        model_get_dim(g, GE_ARCH, "attention.head_count", -1, &hp->n_head, err) < 0 ||
        model_get_dim(g, GE_ARCH, "attention.head_count_kv", hp->n_head, &m->n_head_kv, err) < 0 ||
        model_get_dim(g, GE_ARCH, "context_length", -1, &hp->n_pos, err) < 0 ||
        model_get_dim(g, GE_ARCH, "attention.key_length", hp->dim / hp->n_head, &key_len,
                      err) < 0 ||
        model_get_dim(g, GE_ARCH, "attention.value_length", key_len, &val_len, err) < 0 ||
        model_get_dim(g, GE_ARCH, "rope.dimension_count", key_len, &rot, err) < 0 ||
        model_get_dim(g, GE_ARCH, "attention.sliding_window", -1, &window, err) < 0 ||
        model_get_float(g, GE_ARCH, "attention.layer_norm_rms_epsilon", 1e-6f, &eps, err) < 0 ||
        model_get_float(g, GE_ARCH, "rope.freq_base", 10000.0f, &hp->rope_base, err) < 0 ||
        model_get_float(g, GE_ARCH, "rope.freq_base_swa", 10000.0f, &m->rope_base_swa, err) < 0)
        return -1;
    if (hp->n_layer > GE_MAX_LAYERS || hp->n_pos > GE_MAX_POS)
        return err_set(err, GE_ARCH ": block_count %d or context_length %d out of range",
                       hp->n_layer, hp->n_pos);
    if (hp->n_head % m->n_head_kv)
        return err_set(err, GE_ARCH ": head_count %d is not a multiple of head_count_kv %d",
                       hp->n_head, m->n_head_kv);
    if (key_len < 2 || val_len != key_len || rot != key_len || key_len % 2)
        return err_set(err, GE_ARCH ": key_length %d, value_length %d and rope.dimension_count "
                            "%d must be one even head dimension", key_len, val_len, rot);
    gguf_str s;
    if (gguf_get_str(g, GE_ARCH ".rope.scaling.type", &s) && !gguf_str_eq(s, "none"))
        return err_set(err, "metadata key '" GE_ARCH ".rope.scaling.type': scaled RoPE is not "
                            "supported");
    hp->arch = BERT_ARCH_GEMMA_EMBED;
    hp->head_dim = key_len;
    hp->norm_eps = eps;
    hp->n_types = 1;
    hp->n_cls_out = 0;
    m->half_window = window / 2;
    m->embd_scale = sqrtf((float)hp->dim);
    /* llama.cpp's default: none, which gives no embedding */
    hp->pooling = BERT_POOL_NONE;
    if (gguf_find_key(g, GE_ARCH ".pooling_type") >= 0) {
        uint32_t p;
        if (!gguf_get_u32(g, GE_ARCH ".pooling_type", &p) || p > BERT_POOL_LAST)
            return err_set(err, "metadata key '" GE_ARCH ".pooling_type' is bad (none, mean, "
                                "cls or last)");
        hp->pooling = (enum bert_pooling)p;
    }
    return 0;
}

/* dense_2 (dim -> n_dense) and dense_3 (n_dense -> dim), each optional, with the
 * dense_*_feat_* keys that give their shapes (required with the tensor, as llama.cpp
 * sizes the tensors from them); the pooled vector must come out with dim elements. */
static int ge_load_dense(gemma_embed *m, char err[ERR_MAX])
{
    int dim = m->hp->dim, d2_in = 0, d2_out = 0, d3_in = 0, d3_out = 0;
    m->has_dense2 = gguf_find_tensor(m->g, "dense_2.weight") != NULL;
    m->has_dense3 = gguf_find_tensor(m->g, "dense_3.weight") != NULL;
    if ((m->has_dense2 &&
         (model_get_dim(m->g, GE_ARCH, "dense_2_feat_in", dim, &d2_in, err) < 0 ||
          model_get_dim(m->g, GE_ARCH, "dense_2_feat_out", -1, &d2_out, err) < 0)) ||
        (m->has_dense3 &&
         (model_get_dim(m->g, GE_ARCH, "dense_3_feat_in", -1, &d3_in, err) < 0 ||
          model_get_dim(m->g, GE_ARCH, "dense_3_feat_out", dim, &d3_out, err) < 0)))
        return -1;
    if ((m->has_dense2 && d2_in != dim) || (m->has_dense3 && d3_out != dim))
        return err_set(err, GE_ARCH ": dense_2_feat_in %d and dense_3_feat_out %d must be "
                            "embedding_length %d", d2_in, d3_out, dim);
    if (m->has_dense2 && m->has_dense3 && d2_out != d3_in)
        return err_set(err, GE_ARCH ": dense_2_feat_out %d is not dense_3_feat_in %d", d2_out,
                       d3_in);
    /* one dense layer alone must keep the vector's width (bert.h's embeddings are dim long) */
    if ((m->has_dense2 && !m->has_dense3 && d2_out != dim) ||
        (m->has_dense3 && !m->has_dense2 && d3_in != dim))
        return err_set(err, GE_ARCH ": a single dense layer must map %d to %d elements", dim,
                       dim);
    m->n_dense = m->has_dense2 ? d2_out : m->has_dense3 ? d3_in : 0;
    if ((m->has_dense2 && ge_matrix(m, "dense_2.weight", m->n_dense, dim, &m->dense2, err) < 0) ||
        (m->has_dense3 && ge_matrix(m, "dense_3.weight", dim, m->n_dense, &m->dense3, err) < 0))
        return -1;
    return 0;
}

static int ge_load_layer(gemma_embed *m, int l, char err[ERR_MAX])
{
    const bert_hparams *hp = m->hp;
    int64_t dim = hp->dim, hd = hp->head_dim, ff = hp->n_ff;
    int64_t q_dim = (int64_t)hp->n_head * hd, kv_dim = (int64_t)m->n_head_kv * hd;
    ge_layer *L = &m->layers[l];
    char name[96];
#define NAME(s) (snprintf(name, sizeof name, "blk.%d." s, l), name)
    if (ge_matrix(m, NAME("attn_q.weight"), q_dim, dim, &L->wq, err) < 0 ||
        ge_matrix(m, NAME("attn_k.weight"), kv_dim, dim, &L->wk, err) < 0 ||
        ge_matrix(m, NAME("attn_v.weight"), kv_dim, dim, &L->wv, err) < 0 ||
        ge_matrix(m, NAME("attn_output.weight"), dim, q_dim, &L->wo, err) < 0 ||
        ge_matrix(m, NAME("ffn_gate.weight"), ff, dim, &L->gate, err) < 0 ||
        ge_matrix(m, NAME("ffn_up.weight"), ff, dim, &L->up, err) < 0 ||
        ge_matrix(m, NAME("ffn_down.weight"), dim, ff, &L->down, err) < 0 ||
        ge_vec(m, NAME("attn_norm.weight"), dim, &L->attn_norm, err) < 0 ||
        ge_vec(m, NAME("attn_q_norm.weight"), hd, &L->q_norm, err) < 0 ||
        ge_vec(m, NAME("attn_k_norm.weight"), hd, &L->k_norm, err) < 0 ||
        ge_vec(m, NAME("post_attention_norm.weight"), dim, &L->attn_post_norm, err) < 0 ||
        ge_vec(m, NAME("ffn_norm.weight"), dim, &L->ffn_norm, err) < 0 ||
        ge_vec(m, NAME("post_ffw_norm.weight"), dim, &L->ffn_post_norm, err) < 0)
        return -1;
#undef NAME
    return 0;
}

static int ge_load(gemma_embed *m, char err[ERR_MAX])
{
    bert_hparams *hp = m->hp;
    if (ge_read_hparams(m, err) < 0)
        return -1;
    const gguf_tensor *te = gguf_find_tensor(m->g, "token_embd.weight");
    if (!te)
        return err_set(err, "tensor 'token_embd.weight' is missing");
    if (te->n_dims != 2 || te->ne[1] < 1 || te->ne[1] > (1 << 24))
        return err_set(err, "tensor 'token_embd.weight': bad shape");
    hp->n_vocab = (int)te->ne[1];
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    m->vecs_cap = (size_t)hp->dim + (size_t)hp->n_layer * (4 * (size_t)hp->dim + 2 * hp->head_dim);
    m->vecs = malloc(m->vecs_cap * sizeof(float));
    if (!m->layers || !m->vecs)
        return err_set(err, "out of memory");
    if (ge_read_pattern(m, err) < 0 ||
        ge_matrix(m, "token_embd.weight", hp->n_vocab, hp->dim, &m->tok_embd, err) < 0 ||
        ge_vec(m, "output_norm.weight", hp->dim, &m->out_norm, err) < 0 ||
        ge_load_dense(m, err) < 0)
        return -1;
    for (int l = 0; l < hp->n_layer; l++)
        if (ge_load_layer(m, l, err) < 0)
            return -1;
    return 0;
}

gemma_embed *gemma_embed_from_gguf(const gguf_file *g, bert_hparams *hp, char err[ERR_MAX])
{
    gemma_embed *m = calloc(1, sizeof *m);
    if (!m) {
        err_set(err, "out of memory");
        return NULL;
    }
    m->g = g;
    m->hp = hp;
    if (ge_load(m, err) < 0) {
        gemma_embed_free(m);
        return NULL;
    }
    return m;
}

void gemma_embed_free(gemma_embed *m)
{
    if (!m)
        return;
    free(m->layers);
    free(m->vecs);
    free(m);
}

/* ---- forward ---- */

struct gemma_embed_runner {
    const gemma_embed *m;
    tp_pool *pool;          /* borrowed */
    int max_rows;
    int max_len;            /* longest sequence: min(n_pos, max_rows) */
    char *mem;              /* one allocation holding every buffer below */
    size_t mem_bytes;
    float *x;               /* (max_rows, dim) bert_embed's rows */
    float *xn;              /* (max_rows, dim) a sublayer's normalised input */
    float *q;               /* (max_rows, n_head * head_dim) */
    float *k, *v;           /* (max_rows, n_head_kv * head_dim) */
    float *att;             /* (max_rows, n_head * head_dim) heads side by side */
    float *proj;            /* (max_rows, dim) attn_output / ffn_down */
    float *ff, *ff2;        /* (max_rows, n_ff) gate(x), up(x) */
    float *rope_global;     /* (max_len, head_dim / 2, 2) cos, sin at rope.freq_base */
    float *rope_swa;        /* (max_len, head_dim / 2, 2) at rope.freq_base_swa */
    int *row_pos;           /* (max_rows) each row's position in its sequence */
    float *scores;          /* (n_threads, max_len, max_len) one (sequence, head)'s attention */
    int *seq_start;         /* (max_rows + 1) first row of each sequence of the call */
    float *dense_mid;       /* (n_dense) dense_2's output */
    void *mm_scratch;       /* ops_matmul scratch */
};

static size_t ge_align(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

gemma_embed_runner *gemma_embed_runner_new(const gemma_embed *m, tp_pool *pool, int max_rows,
                                           char err[ERR_MAX])
{
    const bert_hparams *hp = m->hp;
    gemma_embed_runner *r = calloc(1, sizeof *r);
    if (!r) {
        err_set(err, "out of memory");
        return NULL;
    }
    r->m = m;
    r->pool = pool;
    r->max_rows = max_rows;
    r->max_len = hp->n_pos < max_rows ? hp->n_pos : max_rows;
    int nt = tp_n_threads(pool);
    size_t R = (size_t)max_rows, D = (size_t)hp->dim, F = (size_t)hp->n_ff;
    size_t QD = (size_t)hp->n_head * hp->head_dim, KD = (size_t)m->n_head_kv * hp->head_dim;
    size_t L = (size_t)r->max_len;
    int max_cols = hp->dim;
    int cols[] = {hp->n_ff, (int)QD, m->n_dense};
    for (size_t i = 0; i < sizeof cols / sizeof *cols; i++)
        max_cols = cols[i] > max_cols ? cols[i] : max_cols;
    size_t sizes[] = {
        R * D * 4, R * D * 4, R * QD * 4, R * KD * 4, R * KD * 4, R * QD * 4, R * D * 4,
        R * F * 4, R * F * 4, L * hp->head_dim * 4, L * hp->head_dim * 4, R * sizeof(int),
        (size_t)nt * L * L * 4, (R + 1) * sizeof(int), (size_t)m->n_dense * 4,
        ops_matmul_scratch_bytes(max_rows, max_cols, nt),
    };
    void **ptrs[] = {
        (void **)&r->x, (void **)&r->xn, (void **)&r->q, (void **)&r->k, (void **)&r->v,
        (void **)&r->att, (void **)&r->proj, (void **)&r->ff, (void **)&r->ff2,
        (void **)&r->rope_global, (void **)&r->rope_swa, (void **)&r->row_pos,
        (void **)&r->scores, (void **)&r->seq_start, (void **)&r->dense_mid, &r->mm_scratch,
    };
    size_t n = sizeof sizes / sizeof sizes[0], total = 0;
    for (size_t i = 0; i < n; i++)
        total += ge_align(sizes[i]);
    r->mem = aligned_alloc(64, total);
    r->mem_bytes = total;
    if (!r->mem) {
        gemma_embed_runner_free(r);
        err_set(err, GE_ARCH " runner: out of memory for %zu bytes of scratch", total);
        return NULL;
    }
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        *ptrs[i] = r->mem + off;
        off += ge_align(sizes[i]);
    }
    for (int p = 0; p < r->max_len; p++) {
        ops_rope_angles(r->rope_global + (size_t)p * hp->head_dim, p, hp->head_dim,
                        hp->rope_base, NULL, NULL);
        ops_rope_angles(r->rope_swa + (size_t)p * hp->head_dim, p, hp->head_dim,
                        m->rope_base_swa, NULL, NULL);
    }
    return r;
}

void gemma_embed_runner_free(gemma_embed_runner *r)
{
    if (!r)
        return;
    free(r->mem);
    free(r);
}

size_t gemma_embed_runner_scratch_bytes(const gemma_embed_runner *r)
{
    return r->mem_bytes;
}

float *gemma_embed_runner_rows(gemma_embed_runner *r)
{
    return r->x;
}

int gemma_embed_input(const gemma_embed *m, int n_seq, const int *lens, const int32_t *tokens,
                      float *x, char err[ERR_MAX])
{
    const bert_hparams *hp = m->hp;
    size_t row = 0;
    for (int s = 0; s < n_seq; s++) {
        if (lens[s] < 1 || lens[s] > hp->n_pos)
            return err_set(err, GE_ARCH ": sequence %d has %d tokens (the model takes 1..%d)",
                           s, lens[s], hp->n_pos);
        for (int p = 0; p < lens[s]; p++, row++) {
            int32_t tok = tokens[row];
            if (tok < 0 || tok >= hp->n_vocab)
                return err_set(err, GE_ARCH ": token id %d out of range [0, %d)", tok,
                               hp->n_vocab);
            float *xr = x + row * hp->dim;
            quant_dequantize_row(m->tok_embd.type,
                                 (const char *)m->tok_embd.data +
                                     (size_t)tok * m->tok_embd.row_bytes,
                                 xr, hp->dim);
            ops_scale(xr, m->embd_scale, (size_t)hp->dim);
        }
    }
    return 0;
}

typedef struct ge_step {
    gemma_embed_runner *r;
    const ge_layer *L;
    float *x;
    int n_rows, n_seq;
} ge_step;

/* xn = RMSNorm(x) * attn_norm. */
static void ge_attn_norm_job(void *p, int ith, int nth)
{
    ge_step *s = p;
    const bert_hparams *hp = s->r->m->hp;
    long b, e;
    tp_split(s->n_rows, ith, nth, &b, &e);
    for (long t = b; t < e; t++)
        ops_rmsnorm(s->r->xn + t * hp->dim, s->x + t * hp->dim, s->L->attn_norm, hp->dim,
                    hp->norm_eps);
}

/* Each head of q and k through its RMSNorm, then RoPE at the row's position with the
 * layer's base. */
static void ge_qk_job(void *p, int ith, int nth)
{
    ge_step *s = p;
    gemma_embed_runner *r = s->r;
    const bert_hparams *hp = r->m->hp;
    int hd = hp->head_dim, n_kv = r->m->n_head_kv;
    const float *table = s->L->slides ? r->rope_swa : r->rope_global;
    long b, e;
    tp_split(s->n_rows, ith, nth, &b, &e);
    for (long t = b; t < e; t++) {
        float *q = r->q + t * hp->n_head * hd, *k = r->k + t * n_kv * hd;
        for (int h = 0; h < hp->n_head; h++)
            ops_rmsnorm(q + h * hd, q + h * hd, s->L->q_norm, hd, hp->norm_eps);
        for (int h = 0; h < n_kv; h++)
            ops_rmsnorm(k + h * hd, k + h * hd, s->L->k_norm, hd, hp->norm_eps);
        const float *cs = table + (size_t)r->row_pos[t] * hd;
        ops_rope(q, hp->n_head, hd, hd, cs, OPS_ROPE_HALVES);
        ops_rope(k, n_kv, hd, hd, cs, OPS_ROPE_HALVES);
    }
}

/* One (sequence, head) per item: scores against the head's KV head, the softmax of each
 * row over the positions it sees (a sliding layer: within half_window on either side, the
 * rest weighted 0), then the weighted sum of V into the head's columns of att. */
static void ge_attn_job(void *p, int ith, int nth)
{
    ge_step *s = p;
    gemma_embed_runner *r = s->r;
    const gemma_embed *m = r->m;
    const bert_hparams *hp = m->hp;
    int hd = hp->head_dim, n_kv = m->n_head_kv, group = hp->n_head / n_kv;
    int qs = hp->n_head * hd, ks = n_kv * hd;
    float scale = 1.0f / sqrtf((float)hd);
    float *sc = r->scores + (size_t)ith * r->max_len * r->max_len;
    long b, e;
    tp_split((long)s->n_seq * hp->n_head, ith, nth, &b, &e);
    for (long item = b; item < e; item++) {
        int sq = (int)(item / hp->n_head), h = (int)(item % hp->n_head), kh = h / group;
        int r0 = r->seq_start[sq], n = r->seq_start[sq + 1] - r0;
        const float *q = r->q + (size_t)r0 * qs + (size_t)h * hd;
        const float *k = r->k + (size_t)r0 * ks + (size_t)kh * hd;
        const float *v = r->v + (size_t)r0 * ks + (size_t)kh * hd;
        blas_sgemm(true, n, n, hd, scale, q, qs, k, ks, 0.0f, sc, n);
        for (int t = 0; t < n; t++) {
            float *row = sc + (size_t)t * n;
            int lo = 0, hi = n - 1;
            if (s->L->slides) {
                lo = t - m->half_window > 0 ? t - m->half_window : 0;
                hi = t + m->half_window < n - 1 ? t + m->half_window : n - 1;
            }
            ops_softmax(row + lo, hi - lo + 1);
            memset(row, 0, (size_t)lo * sizeof *row);
            memset(row + hi + 1, 0, (size_t)(n - 1 - hi) * sizeof *row);
        }
        blas_sgemm(false, n, hd, n, 1.0f, sc, n, v, ks, 0.0f, r->att + (size_t)r0 * qs + h * hd,
                   qs);
    }
}

/* x += RMSNorm(proj) * post_w; then xn = RMSNorm(x) * next_w (the FFN's input norm), or
 * after the last layer's FFN x = RMSNorm(x) * output_norm. */
typedef struct ge_post {
    ge_step *s;
    const float *post_w, *next_w;
    float *next_out;
} ge_post;

static void ge_post_job(void *p, int ith, int nth)
{
    ge_post *po = p;
    ge_step *s = po->s;
    const bert_hparams *hp = s->r->m->hp;
    int dim = hp->dim;
    long b, e;
    tp_split(s->n_rows, ith, nth, &b, &e);
    for (long t = b; t < e; t++) {
        float *pr = s->r->proj + t * dim, *x = s->x + t * dim;
        ops_rmsnorm(pr, pr, po->post_w, dim, hp->norm_eps);
        ops_add(x, pr, dim);
        if (po->next_w)
            ops_rmsnorm(po->next_out + t * dim, x, po->next_w, dim, hp->norm_eps);
    }
}

/* ff = gelu_tanh(gate(x)) * up(x). */
static void ge_geglu_job(void *p, int ith, int nth)
{
    ge_step *s = p;
    int n_ff = s->r->m->hp->n_ff;
    long b, e;
    tp_split(s->n_rows, ith, nth, &b, &e);
    for (long t = b; t < e; t++)
        ops_gelu_tanh_mul(s->r->ff + t * n_ff, s->r->ff2 + t * n_ff, n_ff);
}

int gemma_embed_layer(gemma_embed_runner *r, int l, int n_seq, const int *lens, float *x,
                      char err[ERR_MAX])
{
    const gemma_embed *m = r->m;
    const bert_hparams *hp = m->hp;
    int n = 0;
    r->seq_start[0] = 0;
    for (int s = 0; s < n_seq; s++) {
        if (lens[s] < 1 || lens[s] > hp->n_pos || n_seq > r->max_rows ||
            n + lens[s] > r->max_rows)
            return err_set(err, GE_ARCH ": sequences of %d tokens do not fit %d rows (or one "
                                "is empty or longer than %d)", n + lens[s], r->max_rows,
                           hp->n_pos);
        for (int t = 0; t < lens[s]; t++)
            r->row_pos[n + t] = t;
        n += lens[s];
        r->seq_start[s + 1] = n;
    }
    const ge_layer *L = &m->layers[l];
    ge_step s = {.r = r, .L = L, .x = x, .n_rows = n, .n_seq = n_seq};

    tp_run(r->pool, ge_attn_norm_job, &s);
    const ops_matrix *qkv[] = {&L->wq, &L->wk, &L->wv};
    float *qkv_out[] = {r->q, r->k, r->v};
    ops_matmul_n(r->pool, 3, qkv, r->xn, n, qkv_out, r->mm_scratch);
    tp_run(r->pool, ge_qk_job, &s);
    tp_run(r->pool, ge_attn_job, &s);
    ops_matmul(r->pool, &L->wo, r->att, n, r->proj, r->mm_scratch);
    ge_post post = {&s, L->attn_post_norm, L->ffn_norm, r->xn};
    tp_run(r->pool, ge_post_job, &post);

    const ops_matrix *gate_up[] = {&L->gate, &L->up};
    float *gate_up_out[] = {r->ff, r->ff2};
    ops_matmul_n(r->pool, 2, gate_up, r->xn, n, gate_up_out, r->mm_scratch);
    tp_run(r->pool, ge_geglu_job, &s);
    ops_matmul(r->pool, &L->down, r->ff, n, r->proj, r->mm_scratch);
    bool last = l == hp->n_layer - 1;
    post = (ge_post){&s, L->ffn_post_norm, last ? m->out_norm : NULL, x};
    tp_run(r->pool, ge_post_job, &post);
    return 0;
}

void gemma_embed_dense(gemma_embed_runner *r, float *vec)
{
    const gemma_embed *m = r->m;
    size_t dim = (size_t)m->hp->dim;
    if (m->has_dense2)
        ops_matmul(r->pool, &m->dense2, vec, 1, r->dense_mid, r->mm_scratch);
    else if (m->has_dense3)
        memcpy(r->dense_mid, vec, dim * sizeof *vec);
    if (m->has_dense3)
        ops_matmul(r->pool, &m->dense3, r->dense_mid, 1, vec, r->mm_scratch);
    else if (m->has_dense2)
        memcpy(vec, r->dense_mid, dim * sizeof *vec);
}
