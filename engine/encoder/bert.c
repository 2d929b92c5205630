/*
 * bert.c — the BERT encoder: loading from GGUF and its layer-by-layer forward.
 *
 * Matrices are used in place from the mapping (ops_matmul handles every computable
 * type; nomic-bert's fused attn_qkv is used as three matrices of its rows); 1-D tensors
 * (biases, LayerNorm weights) and the small position and token-type tables are converted
 * to f32 once, and an absent bias or table row reads a row of zeros, so that both
 * architectures share every per-row kernel. A layer is five dispatches over the stacked
 * rows — the q/k/v products, attention per (sequence, head), the output product, the FFN
 * products — with the per-row work (biases, RoPE, residual, LayerNorm, GELU or SwiGLU)
 * split over the pool between them.
 */
#include "engine/encoder/bert.h"
#include "engine/encoder/gemma_embed.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/quant/blas.h"
#include "engine/model/model.h"
#include "engine/model/ops.h"
#include "engine/quant/quant.h"
#include "engine/threadpool.h"

/* Keeps every size product of a file's dimensions far from overflow. */
/* Most position rows accepted (XLM-R based rerankers have 8194). */
#define BERT_MAX_POS (1 << 16)
/* Default rows of a runner: a (sequence, head)'s score matrix is rows^2 floats per thread,
 * so a runner for every position of a long-context model is asked for explicitly. */
#define BERT_DEFAULT_ROWS 512

typedef struct bert_layer_w {
    ops_matrix wq, wk, wv;  /* (n_head * head_dim, dim); nomic-bert: often attn_qkv's row blocks */
    ops_matrix wo;          /* (dim, n_head * head_dim) */
    ops_matrix up;          /* (n_ff, dim) */
    ops_matrix gate;        /* (n_ff, dim) nomic-bert only */
    ops_matrix down;        /* (dim, n_ff) */
    const float *bq, *bk, *bv; /* (n_head * head_dim), zeros when absent */
    const float *bo;        /* (dim), zeros when absent */
    const float *attn_ln_w, *attn_ln_b; /* (dim) attn_output_norm */
    const float *b_up;      /* (n_ff) bert only */
    const float *b_down;    /* (dim), zeros for nomic-bert */
    const float *out_ln_w, *out_ln_b;   /* (dim) layer_output_norm */
} bert_layer_w;

struct bert_model {
    bert_hparams hp;
    gguf_file *owned;       /* the file when bert_load opened it */
    const gguf_file *g;
    gemma_embed *ge;        /* gemma-embedding's model; the fields below are bert's */
    ops_matrix tok_embd;    /* (n_vocab, dim) */
    const float *pos_embd;  /* (n_pos, dim); NULL for nomic-bert */
    const float *type_embd; /* (n_types, dim) */
    const float *zeros;     /* (dim) the absent biases, and the position row of nomic-bert */
    const float *emb_ln_w, *emb_ln_b; /* (dim) token_embd_norm */
    bool has_cls;           /* the head has the dense + tanh layer before cls.output */
    ops_matrix cls;         /* (dim, dim) when has_cls */
    const float *cls_b;     /* (dim) when has_cls */
    ops_matrix cls_out;     /* (n_cls_out, dim) when n_cls_out > 0 */
    const float *cls_out_b; /* (n_cls_out) */
    bert_layer_w *layers;   /* (n_layer) */
    float *vecs;            /* every converted tensor, back to back */
    size_t vecs_used, vecs_cap;
};

/* ---- loading ---- */

bool bert_is_encoder(const gguf_file *g)
{
    gguf_str a;
    return gguf_get_str(g, "general.architecture", &a) &&
           (gguf_str_eq(a, "bert") || gguf_str_eq(a, "nomic-bert") ||
            gguf_str_eq(a, "gemma-embedding"));
}

static const char *bert_arch_name(enum bert_arch a)
{
    return a == BERT_ARCH_NOMIC ? "nomic-bert" : "bert";
}

/* nomic-bert's keys beyond bert's: the longest sequence and the rotary embedding. */
static int bert_read_rope(bert_model *m, char err[ERR_MAX])
{
    bert_hparams *hp = &m->hp;
    int rot;
    if (model_get_dim(m->g, "nomic-bert", "context_length", -1, &hp->n_pos, err) < 0 ||
        model_get_dim(m->g, "nomic-bert", "rope.dimension_count", hp->head_dim, &rot, err) < 0 ||
        model_get_float(m->g, "nomic-bert", "rope.freq_base", 10000.0f, &hp->rope_base, err) < 0)
        return -1;
    if (hp->n_pos > BERT_MAX_POS)
        return err_set(err, "nomic-bert.context_length %d out of range (1..%d)", hp->n_pos,
                       BERT_MAX_POS);
    /* nomic-embed rotates whole heads (rotary_emb_fraction 1) */
    if (rot != hp->head_dim)
        return err_set(err, "nomic-bert.rope.dimension_count %d: only whole heads (%d) are "
                            "rotated", rot, hp->head_dim);
    if (hp->head_dim % 2)
        return err_set(err, "nomic-bert: head dimension %d is odd", hp->head_dim);
    return 0;
}

static int bert_read_hparams(bert_model *m, char err[ERR_MAX])
{
    bert_hparams *hp = &m->hp;
    const gguf_file *g = m->g;
    gguf_str an;
    if (!bert_is_encoder(g) || !gguf_get_str(g, "general.architecture", &an))
        return err_set(err, "not a bert model (general.architecture)");
    hp->arch = gguf_str_eq(an, "nomic-bert") ? BERT_ARCH_NOMIC : BERT_ARCH_BERT;
    const char *arch = bert_arch_name(hp->arch);
    char key[96];
#define KEY(s) (snprintf(key, sizeof key, "%s." s, arch), key)
    if (model_get_dim(g, arch, "embedding_length", -1, &hp->dim, err) < 0 ||
        model_get_dim(g, arch, "block_count", -1, &hp->n_layer, err) < 0 ||
        model_get_dim(g, arch, "feed_forward_length", -1, &hp->n_ff, err) < 0 ||
        model_get_dim(g, arch, "attention.head_count", -1, &hp->n_head, err) < 0)
        return -1;
    if (hp->n_layer > 4096)
        return err_set(err, "block_count %d out of range", hp->n_layer);
    if (hp->dim % hp->n_head != 0)
        return err_set(err, "embedding_length %d is not a multiple of head_count %d", hp->dim,
                       hp->n_head);
    hp->head_dim = hp->dim / hp->n_head;
    int kv_heads, key_len;
    if (model_get_dim(g, arch, "attention.head_count_kv", hp->n_head, &kv_heads, err) < 0 ||
        model_get_dim(g, arch, "attention.key_length", hp->head_dim, &key_len, err) < 0)
        return -1;
    if (kv_heads != hp->n_head || key_len != hp->head_dim)
        return err_set(err, "%s with head_count_kv %d or key_length %d other than %d / %d",
                       arch, kv_heads, key_len, hp->n_head, hp->head_dim);
    if (model_get_float(g, arch, "attention.layer_norm_epsilon", 1e-12f, &hp->norm_eps, err) < 0)
        return -1;
    bool causal;
    if (gguf_get_bool(g, KEY("attention.causal"), &causal) && causal)
        return err_set(err, "%s is true: a causal %s is not supported", key, arch);
    hp->pooling = BERT_POOL_CLS;
    if (gguf_find_key(g, KEY("pooling_type")) >= 0) {
        uint32_t p;
        if (!gguf_get_u32(g, key, &p) || p > BERT_POOL_RANK)
            return err_set(err, "metadata key '%s' is bad", key);
        hp->pooling = (enum bert_pooling)p;
    }
#undef KEY
    return hp->arch == BERT_ARCH_NOMIC ? bert_read_rope(m, err) : 0;
}

static int bert_matrix(const bert_model *m, const char *name, int64_t rows, int64_t cols,
                       ops_matrix *out, char err[ERR_MAX])
{
    const gguf_tensor *t = model_gguf_tensor(m->g, name, 2, cols, rows, err);
    if (!t)
        return -1;
    *out = (ops_matrix){.type = t->type, .data = t->data, .rows = (int)rows, .cols = (int)cols,
                        .row_bytes = quant_row_bytes(t->type, cols)};
    return 0;
}

/* A tensor of rows x n elements (rows 1: 1-D) converted to f32 into m->vecs. */
static int bert_rows(bert_model *m, const char *name, int n_dims, int64_t n, int64_t rows,
                     const float **out, char err[ERR_MAX])
{
    const gguf_tensor *t = model_gguf_tensor(m->g, name, n_dims, n, rows, err);
    if (!t)
        return -1;
    if (m->vecs_used + (size_t)(n * rows) > m->vecs_cap)
        return err_set(err, "tensor '%s': internal vector space exhausted", name);
    float *dst = m->vecs + m->vecs_used;
    size_t rb = quant_row_bytes(t->type, n);
    for (int64_t r = 0; r < rows; r++)
        quant_dequantize_row(t->type, (const char *)t->data + (size_t)r * rb, dst + r * n, n);
    m->vecs_used += (size_t)(n * rows);
    *out = dst;
    return 0;
}

static int bert_vecs(bert_model *m, const char *name, int64_t n, int64_t rows,
                     const float **out, char err[ERR_MAX])
{
    return bert_rows(m, name, rows == 1 ? 1 : 2, n, rows, out, err);
}

/* A table of embeddings, 2-D even with one row (XLM-RoBERTa's one token type). */
static int bert_table(bert_model *m, const char *name, int64_t n, int64_t rows, const float **out,
                      char err[ERR_MAX])
{
    return bert_rows(m, name, 2, n, rows, out, err);
}

/* Rows of a 2-D table whose ne[0] is dim (position and token-type embeddings). */
static int bert_table_rows(const bert_model *m, const char *name, int max, int *out,
                           char err[ERR_MAX])
{
    const gguf_tensor *t = gguf_find_tensor(m->g, name);
    if (!t)
        return err_set(err, "tensor '%s' is missing", name);
    if (t->n_dims != 2 || t->ne[0] != m->hp.dim || t->ne[1] < 1 || t->ne[1] > max)
        return err_set(err, "tensor '%s': shape [%lld, %lld] (%u dims), expected [%d, 1..%d]",
                       name, (long long)t->ne[0], (long long)t->ne[1], t->n_dims, m->hp.dim, max);
    *out = (int)t->ne[1];
    return 0;
}

/* nomic-bert's q, k and v: the fused attn_qkv split into its row blocks (and its bias),
 * or, as llama.cpp also takes, separate attn_q/k/v (and biases) when there is no attn_qkv
 * but an attn_q. */
static int bert_load_nomic_qkv(bert_model *m, bert_layer_w *L, int l, char err[ERR_MAX])
{
    int64_t dim = m->hp.dim;
    char name[96];
#define NAME(s) (snprintf(name, sizeof name, "blk.%d." s, l), name)
    if (!gguf_find_tensor(m->g, NAME("attn_qkv.weight")) &&
        gguf_find_tensor(m->g, NAME("attn_q.weight"))) {
        const char *w[] = {"attn_q.weight", "attn_k.weight", "attn_v.weight"};
        const char *b[] = {"attn_q.bias", "attn_k.bias", "attn_v.bias"};
        ops_matrix *mat[] = {&L->wq, &L->wk, &L->wv};
        const float **bias[] = {&L->bq, &L->bk, &L->bv};
        for (int i = 0; i < 3; i++) {
            snprintf(name, sizeof name, "blk.%d.%s", l, w[i]);
            if (bert_matrix(m, name, dim, dim, mat[i], err) < 0)
                return -1;
            snprintf(name, sizeof name, "blk.%d.%s", l, b[i]);
            if (gguf_find_tensor(m->g, name) && bert_vecs(m, name, dim, 1, bias[i], err) < 0)
                return -1;
        }
        return 0;
    }
    ops_matrix qkv;
    if (bert_matrix(m, NAME("attn_qkv.weight"), 3 * dim, dim, &qkv, err) < 0)
        return -1;
    ops_matrix *part[] = {&L->wq, &L->wk, &L->wv};
    for (int i = 0; i < 3; i++) {
        *part[i] = qkv;
        part[i]->rows = (int)dim;
        part[i]->data = (const char *)qkv.data + (size_t)i * dim * qkv.row_bytes;
    }
    if (gguf_find_tensor(m->g, NAME("attn_qkv.bias"))) {
        const float *b;
        if (bert_vecs(m, name, 3 * dim, 1, &b, err) < 0)
            return -1;
        L->bq = b;
        L->bk = b + dim;
        L->bv = b + 2 * dim;
    }
#undef NAME
    return 0;
}

/* nomic-bert's attention and FFN: q, k, v as bert_load_nomic_qkv finds them, biases when
 * present (zeros otherwise: the nomic-embed files have none), SwiGLU without biases. */
static int bert_load_nomic_layer(bert_model *m, bert_layer_w *L, int l, char err[ERR_MAX])
{
    int64_t dim = m->hp.dim, ff = m->hp.n_ff;
    L->bq = L->bk = L->bv = L->bo = L->b_down = m->zeros;
    if (bert_load_nomic_qkv(m, L, l, err) < 0)
        return -1;
    char name[96];
#define NAME(s) (snprintf(name, sizeof name, "blk.%d." s, l), name)
    if ((gguf_find_tensor(m->g, NAME("attn_output.bias")) &&
         bert_vecs(m, name, dim, 1, &L->bo, err) < 0) ||
        bert_matrix(m, NAME("ffn_gate.weight"), ff, dim, &L->gate, err) < 0)
        return -1;
#undef NAME
    return 0;
}

/* bert's separate q, k, v with biases and its GELU FFN's biases. */
static int bert_load_bert_layer(bert_model *m, bert_layer_w *L, int l, char err[ERR_MAX])
{
    int64_t dim = m->hp.dim, ff = m->hp.n_ff;
    char name[96];
#define NAME(s) (snprintf(name, sizeof name, "blk.%d." s, l), name)
    if (bert_matrix(m, NAME("attn_q.weight"), dim, dim, &L->wq, err) < 0 ||
        bert_matrix(m, NAME("attn_k.weight"), dim, dim, &L->wk, err) < 0 ||
        bert_matrix(m, NAME("attn_v.weight"), dim, dim, &L->wv, err) < 0 ||
        bert_vecs(m, NAME("attn_q.bias"), dim, 1, &L->bq, err) < 0 ||
        bert_vecs(m, NAME("attn_k.bias"), dim, 1, &L->bk, err) < 0 ||
        bert_vecs(m, NAME("attn_v.bias"), dim, 1, &L->bv, err) < 0 ||
        bert_vecs(m, NAME("attn_output.bias"), dim, 1, &L->bo, err) < 0 ||
        bert_vecs(m, NAME("ffn_up.bias"), ff, 1, &L->b_up, err) < 0 ||
        bert_vecs(m, NAME("ffn_down.bias"), dim, 1, &L->b_down, err) < 0)
        return -1;
#undef NAME
    return 0;
}

/* What both architectures share: the output matrix, the FFN's up and down, the norms. */
static int bert_load_layer(bert_model *m, int l, char err[ERR_MAX])
{
    int64_t dim = m->hp.dim, ff = m->hp.n_ff;
    bert_layer_w *L = &m->layers[l];
    if ((m->hp.arch == BERT_ARCH_NOMIC ? bert_load_nomic_layer(m, L, l, err)
                                       : bert_load_bert_layer(m, L, l, err)) < 0)
        return -1;
    char name[96];
#define NAME(s) (snprintf(name, sizeof name, "blk.%d." s, l), name)
    if (bert_matrix(m, NAME("attn_output.weight"), dim, dim, &L->wo, err) < 0 ||
        bert_matrix(m, NAME("ffn_up.weight"), ff, dim, &L->up, err) < 0 ||
        bert_matrix(m, NAME("ffn_down.weight"), dim, ff, &L->down, err) < 0 ||
        bert_vecs(m, NAME("attn_output_norm.weight"), dim, 1, &L->attn_ln_w, err) < 0 ||
        bert_vecs(m, NAME("attn_output_norm.bias"), dim, 1, &L->attn_ln_b, err) < 0 ||
        bert_vecs(m, NAME("layer_output_norm.weight"), dim, 1, &L->out_ln_w, err) < 0 ||
        bert_vecs(m, NAME("layer_output_norm.bias"), dim, 1, &L->out_ln_b, err) < 0)
        return -1;
#undef NAME
    return 0;
}

/* The bert cross-encoder's head, when the file has one. */
static int bert_load_head(bert_model *m, char err[ERR_MAX])
{
    bert_hparams *hp = &m->hp;
    int64_t dim = hp->dim;
    if (m->has_cls && (bert_matrix(m, "cls.weight", dim, dim, &m->cls, err) < 0 ||
                       bert_vecs(m, "cls.bias", dim, 1, &m->cls_b, err) < 0))
        return -1;
    if (hp->n_cls_out > 0 &&
        (bert_matrix(m, "cls.output.weight", hp->n_cls_out, dim, &m->cls_out, err) < 0 ||
         bert_vecs(m, "cls.output.bias", hp->n_cls_out, 1, &m->cls_out_b, err) < 0))
        return -1;
    return 0;
}

static int bert_load_tensors(bert_model *m, char err[ERR_MAX])
{
    bert_hparams *hp = &m->hp;
    bool nomic = hp->arch == BERT_ARCH_NOMIC;
    int64_t dim = hp->dim, ff = hp->n_ff;
    const gguf_tensor *emb = gguf_find_tensor(m->g, "token_embd.weight");
    if (!emb)
        return err_set(err, "tensor 'token_embd.weight' is missing");
    if (emb->n_dims != 2 || emb->ne[1] <= 0 || emb->ne[1] > INT32_MAX / 2)
        return err_set(err, "tensor 'token_embd.weight': bad shape");
    hp->n_vocab = (int)emb->ne[1];
    if (bert_matrix(m, "token_embd.weight", hp->n_vocab, dim, &m->tok_embd, err) < 0)
        return -1;
    /* llama.cpp reads nomic-bert's token types when present and no position table */
    bool has_types = !nomic || gguf_find_tensor(m->g, "token_types.weight");
    hp->n_types = 1;
    if ((!nomic && bert_table_rows(m, "position_embd.weight", BERT_MAX_POS, &hp->n_pos, err) < 0) ||
        (has_types && bert_table_rows(m, "token_types.weight", 16, &hp->n_types, err) < 0))
        return -1;
    if (!nomic) {
        const gguf_tensor *co = gguf_find_tensor(m->g, "cls.output.weight");
        if (co) {
            if (co->n_dims != 2 || co->ne[1] < 1 || co->ne[1] > 1024)
                return err_set(err, "tensor 'cls.output.weight': bad shape");
            hp->n_cls_out = (int)co->ne[1];
        }
        m->has_cls = gguf_find_tensor(m->g, "cls.weight") != NULL;
    }

    size_t pos_rows = nomic ? 0 : (size_t)hp->n_pos;
    m->vecs_cap = (size_t)dim * (1 + pos_rows + hp->n_types + 3) + (size_t)hp->n_cls_out +
                  (size_t)hp->n_layer * (10 * dim + ff);
    m->vecs = calloc(m->vecs_cap, sizeof(float));
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->vecs || !m->layers)
        return err_set(err, "out of memory");
    m->zeros = m->vecs;
    m->vecs_used = (size_t)dim;
    m->type_embd = m->zeros;
    if ((!nomic && bert_table(m, "position_embd.weight", dim, hp->n_pos, &m->pos_embd, err) < 0) ||
        (has_types &&
         bert_table(m, "token_types.weight", dim, hp->n_types, &m->type_embd, err) < 0) ||
        bert_vecs(m, "token_embd_norm.weight", dim, 1, &m->emb_ln_w, err) < 0 ||
        bert_vecs(m, "token_embd_norm.bias", dim, 1, &m->emb_ln_b, err) < 0 ||
        bert_load_head(m, err) < 0)
        return -1;
    if (hp->pooling == BERT_POOL_RANK && hp->n_cls_out == 0)
        return err_set(err, "%s.pooling_type is rank but the file has no 'cls.output.weight'%s",
                       bert_arch_name(hp->arch), nomic ? " (read for bert only)" : "");
    for (int l = 0; l < hp->n_layer; l++)
        if (bert_load_layer(m, l, err) < 0)
            return -1;
    return 0;
}

bert_model *bert_from_gguf(const gguf_file *g, char err[ERR_MAX])
{
    bert_model *m = calloc(1, sizeof *m);
    if (!m) {
        err_set(err, "out of memory");
        return NULL;
    }
    m->g = g;
    gguf_str a;
    if (gguf_get_str(g, "general.architecture", &a) && gguf_str_eq(a, "gemma-embedding")) {
        if (!(m->ge = gemma_embed_from_gguf(g, &m->hp, err))) {
            bert_free(m);
            return NULL;
        }
        return m;
    }
    if (bert_read_hparams(m, err) < 0 || bert_load_tensors(m, err) < 0) {
        bert_free(m);
        return NULL;
    }
    return m;
}

bert_model *bert_load(const char *path, char err[ERR_MAX])
{
    gguf_file *g = gguf_open(path, err);
    if (!g)
        return NULL;
    bert_model *m = bert_from_gguf(g, err);
    if (!m) {
        gguf_close(g);
        return NULL;
    }
    m->owned = g;
    return m;
}

void bert_free(bert_model *m)
{
    if (!m)
        return;
    gguf_close(m->owned);
    gemma_embed_free(m->ge);
    free(m->layers);
    free(m->vecs);
    free(m);
}

const bert_hparams *bert_hparams_of(const bert_model *m)
{
    return &m->hp;
}

const gguf_file *bert_gguf(const bert_model *m)
{
    return m->g;
}

/* ---- forward ---- */

struct bert_runner {
    const bert_model *m;
    tp_pool *pool;
    int max_rows;
    gemma_embed_runner *ge; /* gemma-embedding's scratch (x is its rows; the rest unused) */
    char *mem;       /* one allocation holding every buffer below */
    size_t mem_bytes;
    float *x;        /* (max_rows, dim) bert_embed's rows */
    float *q, *k, *v; /* (max_rows, dim) */
    float *att;      /* (max_rows, dim) attention output, heads side by side */
    float *proj;     /* (max_rows, dim) output of attn_output / ffn_down / cls */
    float *ff;       /* (max_rows, n_ff) */
    float *ff2;      /* (max_rows, n_ff) nomic-bert: up(x), beside gate(x) in ff */
    int max_len;     /* longest sequence: min(n_pos, max_rows) */
    float *rope;     /* (max_len, head_dim / 2, 2) nomic-bert: cos, sin of each position */
    int *row_pos;    /* (max_rows) nomic-bert: each row's position in its sequence */
    float *scores;   /* (n_threads, max_len, max_len) one (sequence, head)'s attention */
    int *seq_start;  /* (max_rows + 1) first row of each sequence of the call */
    void *mm_scratch; /* ops_matmul scratch */
};

static size_t bert_align(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

bert_runner *bert_runner_new(const bert_model *m, int n_threads, int max_rows, char err[ERR_MAX])
{
    const bert_hparams *hp = &m->hp;
    if (max_rows <= 0)
        max_rows = hp->n_pos < BERT_DEFAULT_ROWS ? hp->n_pos : BERT_DEFAULT_ROWS;
    if (max_rows > 1 << 16) {
        err_set(err, "bert runner: max_rows %d too large", max_rows);
        return NULL;
    }
    bert_runner *r = calloc(1, sizeof *r);
    if (!r) {
        err_set(err, "out of memory");
        return NULL;
    }
    r->m = m;
    r->max_rows = max_rows;
    r->max_len = hp->n_pos < max_rows ? hp->n_pos : max_rows;
    if (ops_init(err) < 0 || !(r->pool = tp_new(n_threads, err))) {
        bert_runner_free(r);
        return NULL;
    }
    if (m->ge) {
        if (!(r->ge = gemma_embed_runner_new(m->ge, r->pool, max_rows, err))) {
            bert_runner_free(r);
            return NULL;
        }
        r->x = gemma_embed_runner_rows(r->ge);
        return r;
    }
    int nt = tp_n_threads(r->pool);
    bool nomic = hp->arch == BERT_ARCH_NOMIC;
    size_t R = (size_t)max_rows, D = (size_t)hp->dim;
    int max_cols = hp->dim > hp->n_ff ? hp->dim : hp->n_ff;
    size_t sizes[] = {
        R * D * 4, R * D * 4, R * D * 4, R * D * 4, R * D * 4, R * D * 4, R * hp->n_ff * 4,
        nomic ? R * hp->n_ff * 4 : 0, nomic ? (size_t)r->max_len * hp->head_dim * 4 : 0,
        nomic ? R * sizeof(int) : 0,
        (size_t)nt * r->max_len * r->max_len * 4, (R + 1) * sizeof(int),
        ops_matmul_scratch_bytes(max_rows, max_cols, nt),
    };
    void **ptrs[] = {
        (void **)&r->x, (void **)&r->q, (void **)&r->k, (void **)&r->v, (void **)&r->att,
        (void **)&r->proj, (void **)&r->ff, (void **)&r->ff2, (void **)&r->rope,
        (void **)&r->row_pos, (void **)&r->scores, (void **)&r->seq_start, &r->mm_scratch,
    };
    size_t n = sizeof sizes / sizeof sizes[0], total = 0;
    for (size_t i = 0; i < n; i++)
        total += bert_align(sizes[i]);
    r->mem = aligned_alloc(64, total);
    r->mem_bytes = total;
    if (!r->mem) {
        bert_runner_free(r);
        err_set(err, "bert runner: out of memory for %zu bytes of scratch", total);
        return NULL;
    }
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        *ptrs[i] = r->mem + off;
        off += bert_align(sizes[i]);
    }
    for (int p = 0; nomic && p < r->max_len; p++)
        ops_rope_angles(r->rope + (size_t)p * hp->head_dim, p, hp->head_dim, hp->rope_base,
                        NULL, NULL);
    return r;
}

void bert_runner_free(bert_runner *r)
{
    if (!r)
        return;
    gemma_embed_runner_free(r->ge);
    tp_free(r->pool);
    free(r->mem);
    free(r);
}

size_t bert_runner_scratch_bytes(const bert_runner *r)
{
    return r->ge ? gemma_embed_runner_scratch_bytes(r->ge) : r->mem_bytes;
}

int bert_runner_max_rows(const bert_runner *r)
{
    return r->max_rows;
}

int bert_input(const bert_model *m, int n_seq, const int *lens, const int32_t *tokens,
               const int32_t *types, float *x, char err[ERR_MAX])
{
    const bert_hparams *hp = &m->hp;
    int dim = hp->dim;
    if (n_seq <= 0 || !lens || !tokens || !x)
        return err_set(err, "bert: no sequences");
    if (m->ge) {
        size_t rows = 0;
        for (int s = 0; s < n_seq; s++)
            rows += lens[s] > 0 ? (size_t)lens[s] : 0;
        for (size_t i = 0; types && i < rows; i++)
            if (types[i] != 0)
                return err_set(err, "bert: token type %d out of range [0, 1)", types[i]);
        return gemma_embed_input(m->ge, n_seq, lens, tokens, x, err);
    }
    size_t row = 0;
    for (int s = 0; s < n_seq; s++) {
        if (lens[s] < 1 || lens[s] > hp->n_pos)
            return err_set(err, "bert: sequence %d has %d tokens (the model takes 1..%d)", s,
                           lens[s], hp->n_pos);
        for (int p = 0; p < lens[s]; p++, row++) {
            int32_t tok = tokens[row], ty = types ? types[row] : 0;
            if (tok < 0 || tok >= hp->n_vocab)
                return err_set(err, "bert: token id %d out of range [0, %d)", tok, hp->n_vocab);
            if (ty < 0 || ty >= hp->n_types)
                return err_set(err, "bert: token type %d out of range [0, %d)", ty, hp->n_types);
            float *xr = x + row * dim;
            quant_dequantize_row(m->tok_embd.type,
                                 (const char *)m->tok_embd.data + (size_t)tok * m->tok_embd.row_bytes,
                                 xr, dim);
            ops_add_layernorm(xr, m->pos_embd ? m->pos_embd + (size_t)p * dim : m->zeros,
                              m->type_embd + (size_t)ty * dim, m->emb_ln_w, m->emb_ln_b, dim,
                              hp->norm_eps);
        }
    }
    return 0;
}

typedef struct bert_step {
    bert_runner *r;
    const bert_layer_w *L;
    float *x;
    int n_rows, n_seq;
} bert_step;

/* q, k, v += their biases; nomic-bert then rotates q and k by each row's position. */
static void bert_qkv_job(void *p, int ith, int nth)
{
    bert_step *s = p;
    const bert_hparams *hp = &s->r->m->hp;
    int dim = hp->dim;
    long b, e;
    tp_split(s->n_rows, ith, nth, &b, &e);
    for (long t = b; t < e; t++) {
        float *q = s->r->q + t * dim, *k = s->r->k + t * dim, *v = s->r->v + t * dim;
        for (int i = 0; i < dim; i++) {
            q[i] += s->L->bq[i];
            k[i] += s->L->bk[i];
            v[i] += s->L->bv[i];
        }
        if (hp->arch == BERT_ARCH_NOMIC) {
            const float *cs = s->r->rope + (size_t)s->r->row_pos[t] * hp->head_dim;
            ops_rope(q, hp->n_head, hp->head_dim, hp->head_dim, cs, OPS_ROPE_HALVES);
            ops_rope(k, hp->n_head, hp->head_dim, hp->head_dim, cs, OPS_ROPE_HALVES);
        }
    }
}

/* One (sequence, head) per item: scores with sgemm over the strided head columns,
 * softmax, then the weighted sum of V into the head's columns of att. */
static void bert_attn_job(void *p, int ith, int nth)
{
    bert_step *s = p;
    bert_runner *r = s->r;
    const bert_hparams *hp = &r->m->hp;
    int dim = hp->dim, hd = hp->head_dim;
    float scale = 1.0f / sqrtf((float)hd);
    float *sc = r->scores + (size_t)ith * r->max_len * r->max_len;
    long b, e;
    tp_split((long)s->n_seq * hp->n_head, ith, nth, &b, &e);
    for (long item = b; item < e; item++) {
        int sq = (int)(item / hp->n_head), h = (int)(item % hp->n_head);
        int r0 = r->seq_start[sq], n = r->seq_start[sq + 1] - r0;
        size_t off = (size_t)r0 * dim + (size_t)h * hd;
        blas_sgemm(true, n, n, hd, scale, r->q + off, dim, r->k + off, dim, 0.0f, sc, n);
        for (int t = 0; t < n; t++)
            ops_softmax(sc + (size_t)t * n, n);
        blas_sgemm(false, n, hd, n, 1.0f, sc, n, r->v + off, dim, 0.0f, r->att + off, dim);
    }
}

/* x = LN(x + proj + bias): the residual and post-norm after attention or the FFN. */
typedef struct bert_post {
    bert_step *s;
    const float *bias, *ln_w, *ln_b;
} bert_post;

static void bert_post_job(void *p, int ith, int nth)
{
    bert_post *po = p;
    bert_step *s = po->s;
    const bert_hparams *hp = &s->r->m->hp;
    int dim = hp->dim;
    long b, e;
    tp_split(s->n_rows, ith, nth, &b, &e);
    for (long t = b; t < e; t++) {
        ops_add_layernorm(s->x + t * dim, s->r->proj + t * dim, po->bias, po->ln_w, po->ln_b, dim,
                          hp->norm_eps);
    }
}

/* ff = gelu(ff + b_up), GELU with erf as BERT was trained (llama.cpp's tanh form differs
 * by up to ~1e-3 per element; ops_gelu_bias's erfc fit by ~1e-7). */
static void bert_gelu_job(void *p, int ith, int nth)
{
    bert_step *s = p;
    int n_ff = s->r->m->hp.n_ff;
    long b, e;
    tp_split(s->n_rows, ith, nth, &b, &e);
    for (long t = b; t < e; t++)
        ops_gelu_bias(s->r->ff + t * n_ff, s->L->b_up, n_ff);
}

/* ff = silu(ff) * ff2: nomic-bert's SwiGLU of gate(x) and up(x). */
static void bert_swiglu_job(void *p, int ith, int nth)
{
    bert_step *s = p;
    int n_ff = s->r->m->hp.n_ff;
    long b, e;
    tp_split(s->n_rows, ith, nth, &b, &e);
    for (long t = b; t < e; t++)
        ops_silu_mul(s->r->ff + t * n_ff, s->r->ff2 + t * n_ff, n_ff);
}

int bert_layer(bert_runner *r, int l, int n_seq, const int *lens, float *x, char err[ERR_MAX])
{
    const bert_model *m = r->m;
    const bert_hparams *hp = &m->hp;
    if (l < 0 || l >= hp->n_layer)
        return err_set(err, "bert: layer %d out of range [0, %d)", l, hp->n_layer);
    if (n_seq <= 0 || !lens || !x)
        return err_set(err, "bert: no sequences");
    if (r->ge)
        return gemma_embed_layer(r->ge, l, n_seq, lens, x, err);
    int n = 0;
    r->seq_start[0] = 0;
    for (int s = 0; s < n_seq; s++) {
        if (lens[s] < 1 || lens[s] > hp->n_pos || n_seq > r->max_rows ||
            n + lens[s] > r->max_rows)
            return err_set(err, "bert: sequences of %d tokens do not fit %d rows (or one is "
                                "empty or longer than %d)", n + lens[s], r->max_rows, hp->n_pos);
        for (int t = 0; hp->arch == BERT_ARCH_NOMIC && t < lens[s]; t++)
            r->row_pos[n + t] = t;
        n += lens[s];
        r->seq_start[s + 1] = n;
    }
    const bert_layer_w *L = &m->layers[l];
    bert_step s = {.r = r, .L = L, .x = x, .n_rows = n, .n_seq = n_seq};

    const ops_matrix *qkv[] = {&L->wq, &L->wk, &L->wv};
    float *qkv_out[] = {r->q, r->k, r->v};
    ops_matmul_n(r->pool, 3, qkv, x, n, qkv_out, r->mm_scratch);
    tp_run(r->pool, bert_qkv_job, &s);
    tp_run(r->pool, bert_attn_job, &s);
    ops_matmul(r->pool, &L->wo, r->att, n, r->proj, r->mm_scratch);
    bert_post post = {&s, L->bo, L->attn_ln_w, L->attn_ln_b};
    tp_run(r->pool, bert_post_job, &post);

    if (hp->arch == BERT_ARCH_NOMIC) {
        const ops_matrix *gate_up[] = {&L->gate, &L->up};
        float *gate_up_out[] = {r->ff, r->ff2};
        ops_matmul_n(r->pool, 2, gate_up, x, n, gate_up_out, r->mm_scratch);
        tp_run(r->pool, bert_swiglu_job, &s);
    } else {
        ops_matmul(r->pool, &L->up, x, n, r->ff, r->mm_scratch);
        tp_run(r->pool, bert_gelu_job, &s);
    }
    ops_matmul(r->pool, &L->down, r->ff, n, r->proj, r->mm_scratch);
    post = (bert_post){&s, L->b_down, L->out_ln_w, L->out_ln_b};
    tp_run(r->pool, bert_post_job, &post);
    return 0;
}

int bert_head(bert_runner *r, int n, const float *cls_rows, float *out, char err[ERR_MAX])
{
    const bert_model *m = r->m;
    const bert_hparams *hp = &m->hp;
    if (hp->n_cls_out == 0)
        return err_set(err, "bert: the model has no classification head (cls.output)");
    if (n < 1 || n > r->max_rows)
        return err_set(err, "bert: %d rows for the head (1..%d)", n, r->max_rows);
    const float *in = cls_rows;
    if (m->has_cls) {
        ops_matmul(r->pool, &m->cls, cls_rows, n, r->proj, r->mm_scratch);
        for (size_t i = 0; i < (size_t)n * hp->dim; i++)
            r->proj[i] = tanhf(r->proj[i] + m->cls_b[i % hp->dim]);
        in = r->proj;
    }
    ops_matmul(r->pool, &m->cls_out, in, n, out, r->mm_scratch);
    for (size_t i = 0; i < (size_t)n * hp->n_cls_out; i++)
        out[i] += m->cls_out_b[i % hp->n_cls_out];
    return 0;
}

int bert_pool(bert_runner *r, const float *x, int len, enum bert_pooling how, float *out,
              char err[ERR_MAX])
{
    int dim = r->m->hp.dim;
    if (len < 1)
        return err_set(err, "bert: nothing to pool");
    switch (how) {
    case BERT_POOL_CLS:
    case BERT_POOL_LAST:
        memcpy(out, x + (how == BERT_POOL_CLS ? 0 : (size_t)(len - 1) * dim),
               (size_t)dim * sizeof(float));
        break;
    case BERT_POOL_MEAN:
        for (int i = 0; i < dim; i++) {
            double acc = 0;
            for (int t = 0; t < len; t++)
                acc += x[(size_t)t * dim + i];
            out[i] = (float)(acc / len);
        }
        break;
    default:
        return err_set(err, "bert: pooling %d does not give an embedding", (int)how);
    }
    if (r->ge)
        gemma_embed_dense(r->ge, out);
    double ss = 0;
    for (int i = 0; i < dim; i++)
        ss += (double)out[i] * out[i];
    float inv = ss > 0 ? (float)(1.0 / sqrt(ss)) : 0.0f;
    for (int i = 0; i < dim; i++)
        out[i] *= inv;
    return 0;
}

int bert_embed(bert_runner *r, int n_seq, const int *lens, const int32_t *tokens,
               const int32_t *types, enum bert_pooling how, float *out, char err[ERR_MAX])
{
    const bert_model *m = r->m;
    if (how != BERT_POOL_CLS && how != BERT_POOL_MEAN && how != BERT_POOL_LAST)
        return err_set(err, "bert: pooling %d does not give an embedding", (int)how);
    long n = 0;
    for (int s = 0; lens && s < n_seq; s++)
        n += lens[s];
    if (n > r->max_rows)
        return err_set(err, "bert: %ld rows exceed the runner's %d", n, r->max_rows);
    if (bert_input(m, n_seq, lens, tokens, types, r->x, err) < 0)
        return -1;
    for (int l = 0; l < m->hp.n_layer; l++)
        if (bert_layer(r, l, n_seq, lens, r->x, err) < 0)
            return -1;
    size_t row = 0;
    for (int s = 0; s < n_seq; s++) {
        if (bert_pool(r, r->x + row * m->hp.dim, lens[s], how, out + (size_t)s * m->hp.dim,
                      err) < 0)
            return -1;
        row += (size_t)lens[s];
    }
    return 0;
}
