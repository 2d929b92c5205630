/*
 * ref_bert.c — the textbook BERT encoder, loops and doubles, no tricks; nomic-bert as
 * its paper and llama.cpp describe it (rotary q/k, SwiGLU, fused qkv, no position table).
 */
#include "tests/support/ref_bert.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/ref_tensor.h"

typedef struct rb_layer {
    double *wq, *wk, *wv, *wo, *bq, *bk, *bv, *bo;
    double *ln1_w, *ln1_b, *up, *b_up, *down, *b_down, *ln2_w, *ln2_b;
    double *qkv, *bqkv, *gate; /* nomic-bert (qkv NULL: separate q, k, v); absent biases NULL */
} rb_layer;

struct ref_bert {
    bool nomic;
    int dim, n_layer, n_head, n_ff;
    double eps, rope_base;
    double *embd, *pos, *types, *eln_w, *eln_b; /* nomic-bert: pos NULL, types maybe */
    double *cls, *cls_b, *cls_out, *cls_out_b; /* NULL when absent */
    int n_cls_out;
    rb_layer *layers;
};

/* Points wq, wk, wv (and the biases) at the row blocks of nomic-bert's fused matrix. */
static void rb_split_qkv(rb_layer *L, int d)
{
    L->wq = L->qkv;
    L->wk = L->qkv + (size_t)d * d;
    L->wv = L->qkv + (size_t)2 * d * d;
    if (L->bqkv) {
        L->bq = L->bqkv;
        L->bk = L->bqkv + d;
        L->bv = L->bqkv + 2 * d;
    }
}

ref_bert *ref_bert_load(const gguf_file *g)
{
    ref_bert *m = calloc(1, sizeof *m);
    uint32_t v;
    float f;
    gguf_str a;
    m->nomic = gguf_get_str(g, "general.architecture", &a) && gguf_str_eq(a, "nomic-bert");
    const char *arch = m->nomic ? "nomic-bert" : "bert";
    char key[96];
#define K(s) (snprintf(key, sizeof key, "%s." s, arch), key)
    m->dim = gguf_get_u32(g, K("embedding_length"), &v) ? (int)v : 0;
    m->n_layer = gguf_get_u32(g, K("block_count"), &v) ? (int)v : 0;
    m->n_head = gguf_get_u32(g, K("attention.head_count"), &v) ? (int)v : 0;
    m->n_ff = gguf_get_u32(g, K("feed_forward_length"), &v) ? (int)v : 0;
    m->eps = gguf_get_f32(g, K("attention.layer_norm_epsilon"), &f) ? f : 1e-12;
    m->rope_base = gguf_get_f32(g, K("rope.freq_base"), &f) ? f : 10000;
#undef K
    m->embd = ref_tensor(g, "token_embd.weight", -1);
    m->pos = ref_tensor(g, "position_embd.weight", -1);
    m->types = ref_tensor(g, "token_types.weight", -1);
    m->eln_w = ref_tensor(g, "token_embd_norm.weight", -1);
    m->eln_b = ref_tensor(g, "token_embd_norm.bias", -1);
    m->cls = ref_tensor(g, "cls.weight", -1);
    m->cls_b = ref_tensor(g, "cls.bias", -1);
    m->cls_out = ref_tensor(g, "cls.output.weight", -1);
    m->cls_out_b = ref_tensor(g, "cls.output.bias", -1);
    m->layers = calloc((size_t)m->n_layer, sizeof *m->layers);
    bool ok = m->dim && m->n_head && m->embd && (m->nomic || (m->pos && m->types)) && m->eln_w &&
              m->eln_b;
    for (int l = 0; ok && m->nomic && l < m->n_layer; l++) {
        rb_layer *L = &m->layers[l];
        char n[96];
#define T(s) (snprintf(n, sizeof n, "blk.%d." s, l), ref_tensor(g, n, -1))
        L->qkv = T("attn_qkv.weight");
        L->bqkv = T("attn_qkv.bias");
        if (!L->qkv) {
            L->wq = T("attn_q.weight");
            L->bq = T("attn_q.bias");
            L->wk = T("attn_k.weight");
            L->bk = T("attn_k.bias");
            L->wv = T("attn_v.weight");
            L->bv = T("attn_v.bias");
        }
        L->wo = T("attn_output.weight");
        L->bo = T("attn_output.bias");
        L->ln1_w = T("attn_output_norm.weight");
        L->ln1_b = T("attn_output_norm.bias");
        L->up = T("ffn_up.weight");
        L->gate = T("ffn_gate.weight");
        L->down = T("ffn_down.weight");
        L->ln2_w = T("layer_output_norm.weight");
        L->ln2_b = T("layer_output_norm.bias");
#undef T
        ok = (L->qkv || (L->wq && L->wk && L->wv)) && L->wo && L->ln1_w && L->ln1_b && L->up &&
             L->gate && L->down && L->ln2_w && L->ln2_b;
        if (ok && L->qkv)
            rb_split_qkv(L, m->dim);
    }
    for (int l = 0; ok && !m->nomic && l < m->n_layer; l++) {
        rb_layer *L = &m->layers[l];
        char n[96];
#define T(s) (snprintf(n, sizeof n, "blk.%d." s, l), ref_tensor(g, n, -1))
        L->wq = T("attn_q.weight");
        L->bq = T("attn_q.bias");
        L->wk = T("attn_k.weight");
        L->bk = T("attn_k.bias");
        L->wv = T("attn_v.weight");
        L->bv = T("attn_v.bias");
        L->wo = T("attn_output.weight");
        L->bo = T("attn_output.bias");
        L->ln1_w = T("attn_output_norm.weight");
        L->ln1_b = T("attn_output_norm.bias");
        L->up = T("ffn_up.weight");
        L->b_up = T("ffn_up.bias");
        L->down = T("ffn_down.weight");
        L->b_down = T("ffn_down.bias");
        L->ln2_w = T("layer_output_norm.weight");
        L->ln2_b = T("layer_output_norm.bias");
#undef T
        double *all[] = {L->wq, L->bq, L->wk, L->bk, L->wv, L->bv, L->wo, L->bo,
                         L->ln1_w, L->ln1_b, L->up, L->b_up, L->down, L->b_down, L->ln2_w, L->ln2_b};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            ok = ok && all[i];
    }
    if (!ok) {
        ref_bert_free(m);
        return NULL;
    }
    return m;
}

void ref_bert_free(ref_bert *m)
{
    if (!m)
        return;
    for (int l = 0; m->layers && l < m->n_layer; l++) {
        rb_layer *L = &m->layers[l];
        if (m->nomic) {
            double *all[] = {L->qkv, L->bqkv, L->wo, L->bo, L->ln1_w, L->ln1_b, L->up, L->gate,
                             L->down, L->ln2_w, L->ln2_b};
            for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
                free(all[i]);
            double *sep[] = {L->wq, L->bq, L->wk, L->bk, L->wv, L->bv};
            for (size_t i = 0; !L->qkv && i < sizeof sep / sizeof sep[0]; i++)
                free(sep[i]);
            continue;
        }
        double *all[] = {L->wq, L->bq, L->wk, L->bk, L->wv, L->bv, L->wo, L->bo,
                         L->ln1_w, L->ln1_b, L->up, L->b_up, L->down, L->b_down, L->ln2_w, L->ln2_b};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            free(all[i]);
    }
    free(m->layers);
    double *top[] = {m->embd, m->pos, m->types, m->eln_w, m->eln_b, m->cls, m->cls_b,
                     m->cls_out, m->cls_out_b};
    for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
        free(top[i]);
    free(m);
}

static void rb_layernorm(double *x, const double *w, const double *b, int n, double eps)
{
    double mean = 0, var = 0;
    for (int i = 0; i < n; i++)
        mean += x[i];
    mean /= n;
    for (int i = 0; i < n; i++)
        var += (x[i] - mean) * (x[i] - mean);
    double s = 1.0 / sqrt(var / n + eps);
    for (int i = 0; i < n; i++)
        x[i] = (x[i] - mean) * s * w[i] + b[i];
}

/* y (rows) = W (rows, cols) x (cols) + b */
static void rb_matvec(double *y, const double *w, const double *x, const double *b, int rows,
                      int cols)
{
    for (int r = 0; r < rows; r++) {
        double s = b ? b[r] : 0;
        for (int c = 0; c < cols; c++)
            s += w[(size_t)r * cols + c] * x[c];
        y[r] = s;
    }
}

/* Rotates each head of row x (dim) by position t, pairing element i with i + hd/2. */
static void rb_rope(double *x, int n_head, int hd, int t, double base)
{
    for (int h = 0; h < n_head; h++) {
        double *v = x + (size_t)h * hd;
        for (int i = 0; i < hd / 2; i++) {
            double th = t / pow(base, 2.0 * i / hd), a = v[i], b = v[i + hd / 2];
            v[i] = a * cos(th) - b * sin(th);
            v[i + hd / 2] = a * sin(th) + b * cos(th);
        }
    }
}

void ref_bert_forward(const ref_bert *m, int n, const int32_t *tokens, const int32_t *types,
                      double *hidden)
{
    int d = m->dim, hd = d / m->n_head;
    double *x = malloc((size_t)n * d * sizeof(double));
    double *q = malloc((size_t)n * d * sizeof(double));
    double *k = malloc((size_t)n * d * sizeof(double));
    double *v = malloc((size_t)n * d * sizeof(double));
    double *att = malloc((size_t)n * d * sizeof(double));
    double *tmp = malloc((size_t)d * sizeof(double));
    double *ff = malloc((size_t)m->n_ff * sizeof(double));
    double *gt = malloc((size_t)m->n_ff * sizeof(double));
    double *p = malloc((size_t)n * sizeof(double));
    for (int t = 0; t < n; t++) {
        int ty = types ? types[t] : 0;
        for (int i = 0; i < d; i++)
            x[t * d + i] = m->embd[(size_t)tokens[t] * d + i] +
                           (m->pos ? m->pos[(size_t)t * d + i] : 0) +
                           (m->types ? m->types[(size_t)ty * d + i] : 0);
        rb_layernorm(x + t * d, m->eln_w, m->eln_b, d, m->eps);
    }
    memcpy(hidden, x, (size_t)n * d * sizeof(double));
    for (int l = 0; l < m->n_layer; l++) {
        const rb_layer *L = &m->layers[l];
        for (int t = 0; t < n; t++) {
            rb_matvec(q + t * d, L->wq, x + t * d, L->bq, d, d);
            rb_matvec(k + t * d, L->wk, x + t * d, L->bk, d, d);
            rb_matvec(v + t * d, L->wv, x + t * d, L->bv, d, d);
            if (m->nomic) {
                rb_rope(q + t * d, m->n_head, hd, t, m->rope_base);
                rb_rope(k + t * d, m->n_head, hd, t, m->rope_base);
            }
        }
        for (int h = 0; h < m->n_head; h++)
            for (int t = 0; t < n; t++) {
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j < n; j++) {
                    double s = 0;
                    for (int i = 0; i < hd; i++)
                        s += q[t * d + h * hd + i] * k[j * d + h * hd + i];
                    p[j] = s / sqrt((double)hd);
                    mx = p[j] > mx ? p[j] : mx;
                }
                for (int j = 0; j < n; j++)
                    sum += p[j] = exp(p[j] - mx);
                for (int i = 0; i < hd; i++) {
                    double s = 0;
                    for (int j = 0; j < n; j++)
                        s += p[j] / sum * v[j * d + h * hd + i];
                    att[t * d + h * hd + i] = s;
                }
            }
        for (int t = 0; t < n; t++) {
            double *xt = x + t * d;
            rb_matvec(tmp, L->wo, att + t * d, L->bo, d, d);
            for (int i = 0; i < d; i++)
                xt[i] += tmp[i];
            rb_layernorm(xt, L->ln1_w, L->ln1_b, d, m->eps);
            rb_matvec(ff, L->up, xt, L->b_up, m->n_ff, d);
            if (m->nomic) {
                rb_matvec(gt, L->gate, xt, NULL, m->n_ff, d);
                for (int i = 0; i < m->n_ff; i++)
                    ff[i] *= gt[i] / (1.0 + exp(-gt[i]));
            } else {
                for (int i = 0; i < m->n_ff; i++)
                    ff[i] = 0.5 * ff[i] * (1.0 + erf(ff[i] / sqrt(2.0)));
            }
            rb_matvec(tmp, L->down, ff, L->b_down, d, m->n_ff);
            for (int i = 0; i < d; i++)
                xt[i] += tmp[i];
            rb_layernorm(xt, L->ln2_w, L->ln2_b, d, m->eps);
        }
        memcpy(hidden + (size_t)(l + 1) * n * d, x, (size_t)n * d * sizeof(double));
    }
    free(x);
    free(q);
    free(k);
    free(v);
    free(att);
    free(tmp);
    free(ff);
    free(gt);
    free(p);
}

double ref_bert_head(const ref_bert *m, const double *cls_row)
{
    int d = m->dim;
    double *y = malloc((size_t)d * sizeof(double));
    memcpy(y, cls_row, (size_t)d * sizeof(double));
    if (m->cls) {
        rb_matvec(y, m->cls, cls_row, m->cls_b, d, d);
        for (int i = 0; i < d; i++)
            y[i] = tanh(y[i]);
    }
    double s = m->cls_out_b ? m->cls_out_b[0] : 0;
    for (int i = 0; m->cls_out && i < d; i++)
        s += m->cls_out[i] * y[i];
    free(y);
    return s;
}
