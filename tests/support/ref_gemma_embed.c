/*
 * ref_gemma_embed.c — Gemma3TextModel with bidirectional attention, then mean/CLS/last
 * pooling, the Dense modules and Normalize, loops and doubles, as the Hugging Face and
 * sentence-transformers code computes them:
 *   h = embed_tokens(ids) * sqrt(hidden_size)
 *   per layer: h += post_attention_layernorm(attn(input_layernorm(h)))
 *              h += post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)))
 *   attn: q_norm / k_norm per head, rotate_half RoPE (rope_theta on full_attention
 *         layers, rope_local_base_freq on sliding ones), scores * query_pre_attn_scalar^-0.5
 *         (head_dim here, as llama.cpp reads no key for it), a sliding layer's query sees
 *         the keys with |q - k| < sliding_window, the config's window being the original
 *         one // 2 + 1 under use_bidirectional_attention (Gemma3TextConfig)
 *   mlp: down(gelu_tanh(gate(x)) * up(x));  Gemma3RMSNorm: x / rms * (1 + w), the file's
 *   weights being 1 + w already;  last_hidden_state = norm(h).
 */
#include "tests/support/ref_gemma_embed.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/ref_tensor.h"

#define ARCH "gemma-embedding"

typedef struct rg_layer {
    double *in_norm, *q, *k, *v, *o, *q_norm, *k_norm, *post_attn, *pre_ff, *gate, *up, *down,
        *post_ff;
    bool sliding;
} rg_layer;

struct ref_gemma_embed {
    int dim, n_layer, n_head, n_kv, hd, n_ff, window, pooling, n_dense;
    double eps, theta, theta_local;
    double *embd, *norm, *dense2, *dense3; /* dense: NULL when absent */
    rg_layer *layers;
};

static int rg_u32(const gguf_file *g, const char *suffix, int dflt)
{
    char key[128];
    uint32_t v;
    snprintf(key, sizeof key, ARCH ".%s", suffix);
    return gguf_get_u32(g, key, &v) ? (int)v : dflt;
}

static double rg_f32(const gguf_file *g, const char *suffix, double dflt)
{
    char key[128];
    float v;
    snprintf(key, sizeof key, ARCH ".%s", suffix);
    return gguf_get_f32(g, key, &v) ? v : dflt;
}

ref_gemma_embed *ref_gemma_embed_load(const gguf_file *g)
{
    ref_gemma_embed *m = calloc(1, sizeof *m);
    m->dim = rg_u32(g, "embedding_length", 0);
    m->n_layer = rg_u32(g, "block_count", 0);
    m->n_head = rg_u32(g, "attention.head_count", 0);
    m->n_kv = rg_u32(g, "attention.head_count_kv", m->n_head);
    m->hd = m->n_head ? rg_u32(g, "attention.key_length", m->dim / m->n_head) : 0;
    m->n_ff = rg_u32(g, "feed_forward_length", 0);
    m->window = rg_u32(g, "attention.sliding_window", 0) / 2 + 1;
    m->pooling = rg_u32(g, "pooling_type", 0);
    m->n_dense = rg_u32(g, "dense_2_feat_out", 0);
    m->eps = rg_f32(g, "attention.layer_norm_rms_epsilon", 1e-6);
    m->theta = rg_f32(g, "rope.freq_base", 10000);
    m->theta_local = rg_f32(g, "rope.freq_base_swa", 10000);
    int period = rg_u32(g, "attention.sliding_window_pattern", 6);
    m->embd = ref_tensor(g, "token_embd.weight", -1);
    m->norm = ref_tensor(g, "output_norm.weight", -1);
    m->dense2 = ref_tensor(g, "dense_2.weight", -1);
    m->dense3 = ref_tensor(g, "dense_3.weight", -1);
    m->layers = calloc((size_t)m->n_layer, sizeof *m->layers);
    bool ok = m->dim > 0 && m->n_layer > 0 && m->n_head > 0 && m->n_ff > 0 && m->embd &&
              m->norm && (m->pooling >= 1 && m->pooling <= 3) &&
              (!m->dense2 || (m->dense3 && m->n_dense > 0));
    for (int l = 0; ok && l < m->n_layer; l++) {
        rg_layer *L = &m->layers[l];
        char nm[96];
#define T(s) (snprintf(nm, sizeof nm, "blk.%d." s, l), ref_tensor(g, nm, -1))
        L->in_norm = T("attn_norm.weight");
        L->q = T("attn_q.weight");
        L->k = T("attn_k.weight");
        L->v = T("attn_v.weight");
        L->o = T("attn_output.weight");
        L->q_norm = T("attn_q_norm.weight");
        L->k_norm = T("attn_k_norm.weight");
        L->post_attn = T("post_attention_norm.weight");
        L->pre_ff = T("ffn_norm.weight");
        L->gate = T("ffn_gate.weight");
        L->up = T("ffn_up.weight");
        L->down = T("ffn_down.weight");
        L->post_ff = T("post_ffw_norm.weight");
#undef T
        L->sliding = (l + 1) % period != 0;
        ok = L->in_norm && L->q && L->k && L->v && L->o && L->q_norm && L->k_norm &&
             L->post_attn && L->pre_ff && L->gate && L->up && L->down && L->post_ff;
    }
    if (!ok) {
        ref_gemma_embed_free(m);
        return NULL;
    }
    return m;
}

void ref_gemma_embed_free(ref_gemma_embed *m)
{
    if (!m)
        return;
    for (int l = 0; m->layers && l < m->n_layer; l++) {
        rg_layer *L = &m->layers[l];
        double *ps[] = {L->in_norm, L->q, L->k, L->v, L->o, L->q_norm, L->k_norm,
                        L->post_attn, L->pre_ff, L->gate, L->up, L->down, L->post_ff};
        for (size_t i = 0; i < sizeof ps / sizeof *ps; i++)
            free(ps[i]);
    }
    free(m->layers);
    free(m->embd);
    free(m->norm);
    free(m->dense2);
    free(m->dense3);
    free(m);
}

/* Gemma3RMSNorm of n values into y (w NULL: no weight). */
static void rg_rmsnorm(double *y, const double *x, const double *w, int n, double eps)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += x[i] * x[i];
    double inv = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++)
        y[i] = x[i] * inv * (w ? w[i] : 1.0);
}

/* y (rows) = W (rows, cols) x */
static void rg_linear(double *y, const double *w, const double *x, int rows, int cols)
{
    for (int r = 0; r < rows; r++) {
        double acc = 0;
        for (int c = 0; c < cols; c++)
            acc += w[(size_t)r * cols + c] * x[c];
        y[r] = acc;
    }
}

/* rotate_half: x * cos + rotate_half(x) * sin over a head of hd values at position pos. */
static void rg_rope(double *x, int hd, int pos, double theta)
{
    int half = hd / 2;
    for (int i = 0; i < half; i++) {
        double inv_freq = 1.0 / pow(theta, (2.0 * i) / hd);
        double a = pos * inv_freq, c = cos(a), s = sin(a);
        double x1 = x[i], x2 = x[i + half];
        x[i] = x1 * c - x2 * s;
        x[i + half] = x2 * c + x1 * s;
    }
}

static double rg_gelu_tanh(double x)
{
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

static void rg_attention(const ref_gemma_embed *m, const rg_layer *L, int n, const double *xn,
                         const ref_gemma_embed_skip *skip, double *out)
{
    int hd = m->hd, qd = m->n_head * hd, kd = m->n_kv * hd, group = m->n_head / m->n_kv;
    double *q = malloc(sizeof(double) * (size_t)n * qd), *k = malloc(sizeof(double) * (size_t)n * kd);
    double *v = malloc(sizeof(double) * (size_t)n * kd), *att = malloc(sizeof(double) * (size_t)n * qd);
    double *w = malloc(sizeof(double) * (size_t)n);
    double theta = L->sliding ? m->theta_local : m->theta;
    for (int t = 0; t < n; t++) {
        const double *x = xn + (size_t)t * m->dim;
        rg_linear(q + (size_t)t * qd, L->q, x, qd, m->dim);
        rg_linear(k + (size_t)t * kd, L->k, x, kd, m->dim);
        rg_linear(v + (size_t)t * kd, L->v, x, kd, m->dim);
        for (int h = 0; h < m->n_head; h++) {
            double *qh = q + (size_t)t * qd + h * hd;
            if (!skip->qk_norm)
                rg_rmsnorm(qh, qh, L->q_norm, hd, m->eps);
            rg_rope(qh, hd, t, theta);
        }
        for (int h = 0; h < m->n_kv; h++) {
            double *kh = k + (size_t)t * kd + h * hd;
            if (!skip->qk_norm)
                rg_rmsnorm(kh, kh, L->k_norm, hd, m->eps);
            rg_rope(kh, hd, t, theta);
        }
    }
    double scaling = 1.0 / sqrt((double)hd);
    for (int h = 0; h < m->n_head; h++) {
        int kh = h / group;
        for (int i = 0; i < n; i++) {
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j < n; j++) {
                bool seen = !L->sliding || skip->swa_mask || abs(i - j) < m->window;
                double s = 0;
                for (int d = 0; d < hd; d++)
                    s += q[(size_t)i * qd + h * hd + d] * k[(size_t)j * kd + kh * hd + d];
                w[j] = seen ? s * scaling : -INFINITY;
                mx = fmax(mx, w[j]);
            }
            for (int j = 0; j < n; j++)
                sum += w[j] = exp(w[j] - mx);
            for (int d = 0; d < hd; d++) {
                double acc = 0;
                for (int j = 0; j < n; j++)
                    acc += w[j] / sum * v[(size_t)j * kd + kh * hd + d];
                att[(size_t)i * qd + h * hd + d] = acc;
            }
        }
    }
    for (int t = 0; t < n; t++)
        rg_linear(out + (size_t)t * m->dim, L->o, att + (size_t)t * qd, m->dim, qd);
    free(q);
    free(k);
    free(v);
    free(att);
    free(w);
}

void ref_gemma_embed_forward(const ref_gemma_embed *m, int n, const int32_t *tokens,
                             const ref_gemma_embed_skip *skip, double *out)
{
    static const ref_gemma_embed_skip none;
    if (!skip)
        skip = &none;
    int dim = m->dim;
    double *h = malloc(sizeof(double) * (size_t)n * dim);
    double *xn = malloc(sizeof(double) * (size_t)n * dim);
    double *y = malloc(sizeof(double) * (size_t)n * dim);
    double *g = malloc(sizeof(double) * (size_t)m->n_ff), *u = malloc(sizeof(double) * (size_t)m->n_ff);
    double scale = skip->embd_scale ? 1.0 : sqrt((double)dim);
    for (int t = 0; t < n; t++)
        for (int i = 0; i < dim; i++)
            h[(size_t)t * dim + i] = m->embd[(size_t)tokens[t] * dim + i] * scale;
    for (int l = 0; l < m->n_layer; l++) {
        const rg_layer *L = &m->layers[l];
        for (int t = 0; t < n; t++)
            rg_rmsnorm(xn + (size_t)t * dim, h + (size_t)t * dim, L->in_norm, dim, m->eps);
        rg_attention(m, L, n, xn, skip, y);
        for (int t = 0; t < n; t++) {
            double *yt = y + (size_t)t * dim, *ht = h + (size_t)t * dim;
            if (!skip->post_norms)
                rg_rmsnorm(yt, yt, L->post_attn, dim, m->eps);
            for (int i = 0; i < dim; i++)
                ht[i] += yt[i];
            rg_rmsnorm(xn, ht, L->pre_ff, dim, m->eps);
            rg_linear(g, L->gate, xn, m->n_ff, dim);
            rg_linear(u, L->up, xn, m->n_ff, dim);
            for (int i = 0; i < m->n_ff; i++)
                g[i] = rg_gelu_tanh(g[i]) * u[i];
            rg_linear(yt, L->down, g, dim, m->n_ff);
            if (!skip->post_norms)
                rg_rmsnorm(yt, yt, L->post_ff, dim, m->eps);
            for (int i = 0; i < dim; i++)
                ht[i] += yt[i];
        }
    }
    for (int t = 0; t < n; t++)
        rg_rmsnorm(h + (size_t)t * dim, h + (size_t)t * dim, m->norm, dim, m->eps);
    /* sentence-transformers' Pooling: mean over the tokens, or the first, or the last */
    double *pooled = calloc((size_t)dim, sizeof(double));
    int first = m->pooling == 3 ? n - 1 : 0, last = m->pooling == 1 ? n : first + 1;
    for (int t = first; t < last; t++)
        for (int i = 0; i < dim; i++)
            pooled[i] += h[(size_t)t * dim + i] / (last - first);
    if (m->dense2 && !skip->dense) {
        double *mid = malloc(sizeof(double) * (size_t)m->n_dense);
        rg_linear(mid, m->dense2, pooled, m->n_dense, dim);
        rg_linear(pooled, m->dense3, mid, dim, m->n_dense);
        free(mid);
    }
    double ss = 0;
    for (int i = 0; i < dim; i++)
        ss += pooled[i] * pooled[i];
    for (int i = 0; i < dim; i++)
        out[i] = pooled[i] / sqrt(ss);
    free(pooled);
    free(h);
    free(xn);
    free(y);
    free(g);
    free(u);
}
