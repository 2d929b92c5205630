/*
 * ref_deepseek2.c — DeepSeek-V2/V3 as Hugging Face's modeling_deepseek.py computes them
 * (DeepseekV2Attention, DeepseekV2MoE with MoEGate, DeepseekV2MLP), from the GGUF layout
 * llama.cpp's converter writes, in double precision and in the plain, decompressed form:
 * no absorption of the key and value projections into the query and output.
 *
 * Per layer and token x:
 *     q = attn_q(n(x)), or attn_q_b(RMSNorm_q_a(attn_q_a(n(x))))    (n_head, nope + rope)
 *     [c_raw, k_pe] = attn_kv_a_mqa(n(x)); c = RMSNorm_kv_a(c_raw)  (kv_lora), (rope)
 *     per head h: k_h = [W_kb[h]^T c, RoPE(k_pe)], v_h = W_vb[h] c, q_h = [q_nope, RoPE(q_pe)]
 * where attn_k_b holds W_kb[h] as kv_lora rows of nope (the converter's kv_b_proj rows
 * for the keys, transposed) and attn_v_b W_vb[h] as v_head rows of kv_lora. RoPE rotates
 * the pairs (2i, 2i + 1) (HF's apply_rotary_pos_emb de-interleaves them before its
 * rotate_half; llama.cpp's NORM rotation is the same on the unpermuted weights) by
 * position * inv_freq[i], inv_freq HF's DeepseekV2YarnRotaryEmbedding's where the file
 * has YaRN (the truncated correction range, the linear ramp between interpolation and
 * extrapolation). Scores are q_h . k_h times kq_scale, causal softmax, and the output
 * attn_output(concat of the heads' sum_j p v_h). The scales are llama.cpp's: with
 * yarn_log_multiplier (the converter's 0.1 * mscale_all_dim) llama.cpp takes HF's mscale
 * equal to mscale_all_dim (DeepSeek-V2's and V3's configs have them equal), so that cos
 * and sin are unscaled and kq_scale = get_mscale(factor, mscale_all_dim)^2 / sqrt(nope +
 * rope), HF's softmax_scale; YaRN without it scales cos and sin by get_mscale(factor, 1)
 * and (llama.cpp's, not HF's) kq_scale by its square too; no YaRN: 1 / sqrt(nope + rope).
 *
 * Feed-forward after ffn_norm: SwiGLU of ffn_gate / ffn_up / ffn_down in the
 * leading_dense_block_count first layers; then MoEGate: probabilities softmax(router x)
 * (expert_gating_func 1 or absent) or sigmoid (2); selection scores those plus
 * exp_probs_b (V3's e_score_correction_bias) where the file has it; with
 * expert_group_count > 1 ("noaux_tc") each group scored by the sum of its two best
 * selection scores and all but the expert_group_used_count best groups masked out; the
 * expert_used_count best experts by selection score, weighted by their unbiased
 * probabilities, divided by their sum (at least 6.103515625e-5, llama.cpp's clamp) where
 * expert_weights_norm, times expert_weights_scale where written; plus the shared experts'
 * SwiGLU (ffn_*_shexp) unweighted. Then output_norm and output.
 */
#include "tests/support/ref_deepseek2.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/quant/quant.h"
#include "tests/support/ref_tensor.h"

#define REF_DS2_MAX_EXPERTS 1024

typedef struct ref_ds2_layer {
    double *attn_norm, *ffn_norm;     /* (dim) */
    double *wq;                       /* (n_head * (nope + rope), dim) or NULL (q_lora) */
    double *wq_a;                     /* (q_lora, dim) or NULL */
    double *q_a_norm;                 /* (q_lora) or NULL */
    double *wq_b;                     /* (n_head * (nope + rope), q_lora) or NULL */
    double *wkv_a;                    /* (kv_lora + rope, dim) */
    double *kv_a_norm;                /* (kv_lora) */
    double *wk_b;                     /* (n_head, kv_lora, nope) */
    double *wv_b;                     /* (n_head, v_head, kv_lora) */
    double *wo;                       /* (dim, n_head * v_head) */
    double *gate, *up, *down;         /* dense (n_ff, dim) x2, (dim, n_ff); or NULL */
    double *router;                   /* (n_expert, dim) or NULL */
    double *probs_b;                  /* (n_expert) or NULL */
    double *gate_exps, *up_exps;      /* (n_expert, n_ff_exp, dim) */
    double *down_exps;                /* (n_expert, dim, n_ff_exp) */
    double *gate_sh, *up_sh;          /* (n_ff_exp * n_shared, dim) */
    double *down_sh;                  /* (dim, n_ff_exp * n_shared) */
} ref_ds2_layer;

struct ref_ds2 {
    int dim, n_layer, n_head, n_vocab, n_ff;
    int q_lora, kv_lora, nope, rope, v_head;
    int n_expert, n_used, n_ff_exp, n_shared, n_dense;
    int gating;                  /* 1 softmax, 2 sigmoid */
    bool norm_w;
    double w_scale;              /* 0: none */
    int n_groups, n_groups_used; /* n_groups <= 1: no groups */
    double eps;
    double *inv_freq;            /* (rope / 2) */
    double rope_mul;             /* multiplies cos and sin */
    double kq_scale;
    double *embd, *out_norm, *out; /* (n_vocab, dim), (dim), (n_vocab, dim) */
    ref_ds2_layer *layers;
};

static int ref_ds2_u32(const gguf_file *g, const char *key, int dflt)
{
    char k[128];
    snprintf(k, sizeof k, "deepseek2.%s", key);
    uint32_t v;
    return gguf_get_u32(g, k, &v) ? (int)v : dflt;
}

static double ref_ds2_f32(const gguf_file *g, const char *key, double dflt)
{
    char k[128];
    snprintf(k, sizeof k, "deepseek2.%s", key);
    float v;
    return gguf_get_f32(g, k, &v) ? v : dflt;
}

/* modeling_deepseek's yarn_get_mscale */
static double ref_ds2_mscale(double scale, double mscale)
{
    return scale <= 1 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

/* inv_freq and the scales (the file comment); -1 on a bad key. */
static int ref_ds2_rope(const gguf_file *g, ref_ds2 *m)
{
    double base = ref_ds2_f32(g, "rope.freq_base", 10000.0);
    int dim = m->rope;
    m->inv_freq = malloc((size_t)(dim / 2) * sizeof(double));
    if (!m->inv_freq)
        return -1;
    for (int i = 0; i < dim / 2; i++)
        m->inv_freq[i] = 1.0 / pow(base, 2.0 * i / dim);
    double sqrt_dk = sqrt((double)(m->nope + m->rope));
    gguf_str st;
    m->rope_mul = 1.0;
    m->kq_scale = 1.0 / sqrt_dk;
    if (!gguf_get_str(g, "deepseek2.rope.scaling.type", &st) || gguf_str_eq(st, "none"))
        return 0;
    if (!gguf_str_eq(st, "yarn"))
        return -1;
    double factor = ref_ds2_f32(g, "rope.scaling.factor", 0.0);
    double orig = ref_ds2_u32(g, "rope.scaling.original_context_length", 0);
    double beta_fast = ref_ds2_f32(g, "rope.scaling.yarn_beta_fast", 32.0);
    double beta_slow = ref_ds2_f32(g, "rope.scaling.yarn_beta_slow", 1.0);
    double mscale_all_dim = ref_ds2_f32(g, "rope.scaling.yarn_log_multiplier", 0.0) / 0.1;
    if (!(factor > 0) || orig <= 0)
        return -1;
    /* yarn_find_correction_range, yarn_linear_ramp_mask */
    double low = floor(dim * log(orig / (beta_fast * 2 * M_PI)) / (2 * log(base)));
    double high = ceil(dim * log(orig / (beta_slow * 2 * M_PI)) / (2 * log(base)));
    low = low > 0 ? low : 0;
    high = high < dim - 1 ? high : dim - 1;
    if (high == low)
        high += 0.001;
    for (int i = 0; i < dim / 2; i++) {
        double ramp = (i - low) / (high - low);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        double extra_mask = 1 - ramp; /* inv_freq_mask with extrapolation_factor 1 */
        double freq_extra = m->inv_freq[i], freq_inter = m->inv_freq[i] / factor;
        m->inv_freq[i] = freq_inter * (1 - extra_mask) + freq_extra * extra_mask;
    }
    double attn_factor = ref_ds2_f32(g, "rope.scaling.attn_factor", 1.0);
    m->rope_mul = attn_factor * (mscale_all_dim != 0 ? 1.0 : ref_ds2_mscale(factor, 1.0));
    double ms = m->rope_mul * ref_ds2_mscale(factor, mscale_all_dim);
    m->kq_scale = ms * ms / sqrt_dk;
    return 0;
}

ref_ds2 *ref_ds2_load(const gguf_file *g)
{
    ref_ds2 *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->dim = ref_ds2_u32(g, "embedding_length", 0);
    m->n_layer = ref_ds2_u32(g, "block_count", 0);
    m->n_head = ref_ds2_u32(g, "attention.head_count", 0);
    m->n_ff = ref_ds2_u32(g, "feed_forward_length", 0);
    m->q_lora = ref_ds2_u32(g, "attention.q_lora_rank", 0);
    m->kv_lora = ref_ds2_u32(g, "attention.kv_lora_rank", 0);
    m->rope = ref_ds2_u32(g, "rope.dimension_count", 0);
    m->nope = ref_ds2_u32(g, "attention.key_length_mla", 0) - m->rope;
    m->v_head = ref_ds2_u32(g, "attention.value_length_mla", 0);
    m->n_expert = ref_ds2_u32(g, "expert_count", 0);
    m->n_used = ref_ds2_u32(g, "expert_used_count", 0);
    m->n_ff_exp = ref_ds2_u32(g, "expert_feed_forward_length", 0);
    m->n_shared = ref_ds2_u32(g, "expert_shared_count", 0);
    m->n_dense = ref_ds2_u32(g, "leading_dense_block_count", 0);
    m->gating = ref_ds2_u32(g, "expert_gating_func", 1);
    bool norm_w = false;
    gguf_get_bool(g, "deepseek2.expert_weights_norm", &norm_w);
    m->norm_w = norm_w;
    m->w_scale = ref_ds2_f32(g, "expert_weights_scale", 0.0);
    m->n_groups = ref_ds2_u32(g, "expert_group_count", 0);
    m->n_groups_used = ref_ds2_u32(g, "expert_group_used_count", 0);
    m->eps = ref_ds2_f32(g, "attention.layer_norm_rms_epsilon", 1e-6);
    const gguf_tensor *e = gguf_find_tensor(g, "token_embd.weight");
    m->n_vocab = e ? (int)e->ne[1] : 0;
    bool ok = m->dim > 0 && m->n_layer > 0 && m->n_head > 0 && m->kv_lora > 0 && m->nope > 0 &&
              m->rope > 0 && m->rope % 2 == 0 && m->v_head > 0 && m->n_vocab > 0 &&
              m->n_dense >= 0 && m->n_dense <= m->n_layer && (m->gating == 1 || m->gating == 2) &&
              m->n_expert >= 0 && m->n_expert <= REF_DS2_MAX_EXPERTS &&
              m->n_used <= m->n_expert &&
              (m->n_dense == m->n_layer || (m->n_used > 0 && m->n_ff_exp > 0 && m->n_shared > 0));
    if (ok && m->n_groups > 1)
        ok = m->n_expert % m->n_groups == 0 && m->n_expert / m->n_groups >= 2 &&
             m->n_groups_used > 0 && m->n_groups_used <= m->n_groups;
    if (!ok || ref_ds2_rope(g, m) < 0) {
        ref_ds2_free(m);
        return NULL;
    }
    int64_t d = m->dim, nh = m->n_head, qk = m->nope + m->rope, kv = m->kv_lora;
    int64_t ffs = (int64_t)m->n_ff_exp * m->n_shared, ne = m->n_expert;
    m->embd = ref_tensor(g, "token_embd.weight", d * m->n_vocab);
    m->out_norm = ref_tensor(g, "output_norm.weight", d);
    m->out = gguf_find_tensor(g, "output.weight") ? ref_tensor(g, "output.weight", d * m->n_vocab)
                                                  : m->embd;
    m->layers = calloc((size_t)m->n_layer, sizeof *m->layers);
    ok = m->embd && m->out_norm && m->out && m->layers;
    for (int l = 0; ok && l < m->n_layer; l++) {
        ref_ds2_layer *L = &m->layers[l];
        char n[96];
#define T(s, want) (snprintf(n, sizeof n, "blk.%d." s, l), ref_tensor(g, n, want))
        L->attn_norm = T("attn_norm.weight", d);
        L->ffn_norm = T("ffn_norm.weight", d);
        if (m->q_lora) {
            L->wq_a = T("attn_q_a.weight", m->q_lora * d);
            L->q_a_norm = T("attn_q_a_norm.weight", m->q_lora);
            L->wq_b = T("attn_q_b.weight", nh * qk * m->q_lora);
        } else {
            L->wq = T("attn_q.weight", nh * qk * d);
        }
        L->wkv_a = T("attn_kv_a_mqa.weight", (kv + m->rope) * d);
        L->kv_a_norm = T("attn_kv_a_norm.weight", kv);
        L->wk_b = T("attn_k_b.weight", nh * kv * m->nope);
        L->wv_b = T("attn_v_b.weight", nh * m->v_head * kv);
        L->wo = T("attn_output.weight", d * nh * m->v_head);
        bool ffn;
        if (l < m->n_dense) {
            L->gate = T("ffn_gate.weight", (int64_t)m->n_ff * d);
            L->up = T("ffn_up.weight", (int64_t)m->n_ff * d);
            L->down = T("ffn_down.weight", (int64_t)m->n_ff * d);
            ffn = L->gate && L->up && L->down;
        } else {
            L->router = T("ffn_gate_inp.weight", ne * d);
            L->probs_b = T("exp_probs_b.bias", ne);
            L->gate_exps = T("ffn_gate_exps.weight", ne * m->n_ff_exp * d);
            L->up_exps = T("ffn_up_exps.weight", ne * m->n_ff_exp * d);
            L->down_exps = T("ffn_down_exps.weight", ne * m->n_ff_exp * d);
            L->gate_sh = T("ffn_gate_shexp.weight", ffs * d);
            L->up_sh = T("ffn_up_shexp.weight", ffs * d);
            L->down_sh = T("ffn_down_shexp.weight", ffs * d);
            ffn = L->router && L->gate_exps && L->up_exps && L->down_exps && L->gate_sh &&
                  L->up_sh && L->down_sh;
        }
#undef T
        ok = ffn && L->attn_norm && L->ffn_norm && L->wkv_a && L->kv_a_norm && L->wk_b &&
             L->wv_b && L->wo && (m->q_lora ? L->wq_a && L->q_a_norm && L->wq_b : L->wq != NULL);
    }
    if (!ok) {
        ref_ds2_free(m);
        return NULL;
    }
    return m;
}

void ref_ds2_free(ref_ds2 *m)
{
    if (!m)
        return;
    for (int l = 0; m->layers && l < m->n_layer; l++) {
        ref_ds2_layer *L = &m->layers[l];
        double *all[] = {L->attn_norm, L->ffn_norm, L->wq,      L->wq_a,      L->q_a_norm,
                         L->wq_b,      L->wkv_a,    L->kv_a_norm, L->wk_b,    L->wv_b,
                         L->wo,        L->gate,     L->up,      L->down,      L->router,
                         L->probs_b,   L->gate_exps, L->up_exps, L->down_exps, L->gate_sh,
                         L->up_sh,     L->down_sh};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            free(all[i]);
    }
    free(m->layers);
    if (m->out != m->embd)
        free(m->out);
    free(m->embd);
    free(m->out_norm);
    free(m->inv_freq);
    free(m);
}

int ref_ds2_n_vocab(const ref_ds2 *m)
{
    return m->n_vocab;
}

static void ref_ds2_rmsnorm(double *y, const double *x, const double *w, int n, double eps)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += x[i] * x[i];
    double s = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++)
        y[i] = x[i] * s * w[i];
}

/* y (rows) = W (rows, cols) x (cols) */
static void ref_ds2_matvec(double *y, const double *w, const double *x, int rows, int cols)
{
    for (int r = 0; r < rows; r++) {
        double s = 0;
        for (int c = 0; c < cols; c++)
            s += w[(size_t)r * cols + c] * x[c];
        y[r] = s;
    }
}

/* Rotates the pairs (2i, 2i + 1) of x (rope) at pos. */
static void ref_ds2_rotate(const ref_ds2 *m, double *x, int pos)
{
    for (int i = 0; i < m->rope / 2; i++) {
        double ang = pos * m->inv_freq[i];
        double c = cos(ang) * m->rope_mul, s = sin(ang) * m->rope_mul;
        double x0 = x[2 * i], x1 = x[2 * i + 1];
        x[2 * i] = x0 * c - x1 * s;
        x[2 * i + 1] = x0 * s + x1 * c;
    }
}

/* y (dim) = down(silu(gate xn) * up xn), ff wide; g and u hold ff doubles. */
static void ref_ds2_mlp(const ref_ds2 *m, double *y, const double *xn, const double *gate,
                        const double *up, const double *down, int ff, double *g, double *u)
{
    ref_ds2_matvec(g, gate, xn, ff, m->dim);
    ref_ds2_matvec(u, up, xn, ff, m->dim);
    for (int i = 0; i < ff; i++)
        g[i] = g[i] / (1 + exp(-g[i])) * u[i];
    ref_ds2_matvec(y, down, g, m->dim, ff);
}

/* y (dim) = DeepseekV2MoE of xn (the file comment); tmp holds dim doubles, g and u the
 * widest of n_ff_exp * n_shared; route (n_used) or NULL. */
static void ref_ds2_moe(const ref_ds2 *m, const ref_ds2_layer *L, double *y, const double *xn,
                        double *tmp, double *g, double *u, int *route)
{
    int ne = m->n_expert, dim = m->dim;
    double prob[REF_DS2_MAX_EXPERTS], sel[REF_DS2_MAX_EXPERTS];
    ref_ds2_matvec(prob, L->router, xn, ne, dim);
    if (m->gating == 2) {
        for (int e = 0; e < ne; e++)
            prob[e] = 1 / (1 + exp(-prob[e]));
    } else {
        double max = -INFINITY, sum = 0;
        for (int e = 0; e < ne; e++)
            max = prob[e] > max ? prob[e] : max;
        for (int e = 0; e < ne; e++)
            sum += prob[e] = exp(prob[e] - max);
        for (int e = 0; e < ne; e++)
            prob[e] /= sum;
    }
    for (int e = 0; e < ne; e++)
        sel[e] = prob[e] + (L->probs_b ? L->probs_b[e] : 0);
    if (m->n_groups > 1) { /* MoEGate's group_limited / noaux_tc selection */
        int per = ne / m->n_groups;
        double score[REF_DS2_MAX_EXPERTS];
        bool kept[REF_DS2_MAX_EXPERTS] = {false};
        for (int gi = 0; gi < m->n_groups; gi++) {
            double a = -INFINITY, b = -INFINITY; /* the best two */
            for (int e = gi * per; e < (gi + 1) * per; e++) {
                if (sel[e] > a)
                    b = a, a = sel[e];
                else if (sel[e] > b)
                    b = sel[e];
            }
            score[gi] = a + b;
        }
        for (int k = 0; k < m->n_groups_used; k++) {
            int best = -1;
            for (int gi = 0; gi < m->n_groups; gi++)
                if (!kept[gi] && (best < 0 || score[gi] > score[best]))
                    best = gi;
            kept[best] = true;
        }
        for (int e = 0; e < ne; e++)
            if (!kept[e / per])
                sel[e] = -INFINITY;
    }
    int idx[REF_DS2_MAX_EXPERTS];
    bool chosen[REF_DS2_MAX_EXPERTS] = {false};
    double wsum = 0;
    for (int k = 0; k < m->n_used; k++) {
        int best = -1;
        for (int e = 0; e < ne; e++)
            if (!chosen[e] && (best < 0 || sel[e] > sel[best]))
                best = e;
        chosen[best] = true;
        idx[k] = best;
        wsum += prob[best];
        if (route)
            route[k] = best;
    }
    if (wsum < 6.103515625e-5)
        wsum = 6.103515625e-5;
    ref_ds2_mlp(m, y, xn, L->gate_sh, L->up_sh, L->down_sh, m->n_ff_exp * m->n_shared, g, u);
    size_t in = (size_t)m->n_ff_exp * dim;
    for (int k = 0; k < m->n_used; k++) {
        int e = idx[k];
        double w = prob[e];
        if (m->norm_w)
            w /= wsum;
        if (m->w_scale != 0)
            w *= m->w_scale;
        ref_ds2_mlp(m, tmp, xn, L->gate_exps + e * in, L->up_exps + e * in,
                    L->down_exps + e * in, m->n_ff_exp, g, u);
        for (int i = 0; i < dim; i++)
            y[i] += w * tmp[i];
    }
}

static double ref_ds2_round_f16(double x)
{
    return quant_f16_to_f32(quant_f32_to_f16((float)x));
}

void ref_ds2_forward(const ref_ds2 *m, int n, const int32_t *tokens, const int32_t *positions,
                     double *logits, double *hidden, double *attn, int *routes, bool kv_f16)
{
    int dim = m->dim, nh = m->n_head, nope = m->nope, rope = m->rope, qk = nope + rope;
    int kv = m->kv_lora, vd = m->v_head;
    int ff = m->n_ff > m->n_ff_exp * m->n_shared ? m->n_ff : m->n_ff_exp * m->n_shared;
    ff = ff > m->n_ff_exp ? ff : m->n_ff_exp;
    int qa = m->q_lora > kv + rope ? m->q_lora : kv + rope;
    double *x = malloc((size_t)n * dim * sizeof(double));
    double *xn = malloc((size_t)dim * sizeof(double));
    double *qa_buf = malloc((size_t)qa * sizeof(double));
    double *q = malloc((size_t)n * nh * qk * sizeof(double));     /* (n, n_head, qk) */
    double *k = malloc((size_t)n * nh * qk * sizeof(double));     /* (n, n_head, qk) */
    double *v = malloc((size_t)n * nh * vd * sizeof(double));     /* (n, n_head, v_head) */
    double *c = malloc((size_t)kv * sizeof(double));
    double *o = malloc((size_t)nh * vd * sizeof(double));
    double *tmp = malloc((size_t)dim * sizeof(double));
    double *tmp2 = malloc((size_t)dim * sizeof(double));
    double *g = malloc((size_t)ff * sizeof(double));
    double *u = malloc((size_t)ff * sizeof(double));
    double *p = malloc((size_t)n * sizeof(double));

    for (int t = 0; t < n; t++)
        memcpy(x + (size_t)t * dim, m->embd + (size_t)tokens[t] * dim, (size_t)dim * sizeof(double));
    if (hidden)
        memcpy(hidden, x, (size_t)n * dim * sizeof(double));
    for (int l = 0; l < m->n_layer; l++) {
        const ref_ds2_layer *L = &m->layers[l];
        for (int t = 0; t < n; t++) {
            double *qt = q + (size_t)t * nh * qk, *kt = k + (size_t)t * nh * qk;
            double *vt = v + (size_t)t * nh * vd;
            ref_ds2_rmsnorm(xn, x + (size_t)t * dim, L->attn_norm, dim, m->eps);
            if (m->q_lora) {
                ref_ds2_matvec(qa_buf, L->wq_a, xn, m->q_lora, dim);
                ref_ds2_rmsnorm(qa_buf, qa_buf, L->q_a_norm, m->q_lora, m->eps);
                ref_ds2_matvec(qt, L->wq_b, qa_buf, nh * qk, m->q_lora);
            } else {
                ref_ds2_matvec(qt, L->wq, xn, nh * qk, dim);
            }
            for (int h = 0; h < nh; h++)
                ref_ds2_rotate(m, qt + h * qk + nope, positions[t]);
            ref_ds2_matvec(qa_buf, L->wkv_a, xn, kv + rope, dim);
            ref_ds2_rmsnorm(c, qa_buf, L->kv_a_norm, kv, m->eps);
            double *k_pe = qa_buf + kv;
            ref_ds2_rotate(m, k_pe, positions[t]);
            for (int i = 0; kv_f16 && i < kv; i++)
                c[i] = ref_ds2_round_f16(c[i]);
            for (int i = 0; kv_f16 && i < rope; i++)
                k_pe[i] = ref_ds2_round_f16(k_pe[i]);
            for (int h = 0; h < nh; h++) {
                const double *wk = L->wk_b + (size_t)h * kv * nope;
                const double *wv = L->wv_b + (size_t)h * vd * kv;
                for (int i = 0; i < nope; i++) {
                    double s = 0;
                    for (int r = 0; r < kv; r++)
                        s += wk[(size_t)r * nope + i] * c[r];
                    kt[h * qk + i] = s;
                }
                memcpy(kt + h * qk + nope, k_pe, (size_t)rope * sizeof(double));
                ref_ds2_matvec(vt + h * vd, wv, c, vd, kv);
            }
        }
        for (int t = 0; t < n; t++) {
            for (int h = 0; h < nh; h++) {
                const double *qh = q + ((size_t)t * nh + h) * qk;
                double max = -INFINITY, sum = 0;
                for (int j = 0; j < n; j++) {
                    if (positions[j] > positions[t]) {
                        p[j] = -INFINITY;
                        continue;
                    }
                    const double *kh = k + ((size_t)j * nh + h) * qk;
                    double s = 0;
                    for (int i = 0; i < qk; i++)
                        s += qh[i] * kh[i];
                    p[j] = s * m->kq_scale;
                    max = p[j] > max ? p[j] : max;
                }
                for (int j = 0; j < n; j++) {
                    p[j] = p[j] == -INFINITY ? 0 : exp(p[j] - max);
                    sum += p[j];
                }
                for (int i = 0; i < vd; i++)
                    o[h * vd + i] = 0;
                for (int j = 0; j < n; j++) {
                    p[j] /= sum;
                    for (int i = 0; i < vd; i++)
                        o[h * vd + i] += p[j] * v[((size_t)j * nh + h) * vd + i];
                }
                if (attn)
                    memcpy(attn + (((size_t)l * nh + h) * n + t) * n, p, (size_t)n * sizeof(double));
            }
            /* token t's residual is not read again by this layer's attention */
            ref_ds2_matvec(tmp, L->wo, o, dim, nh * vd);
            for (int i = 0; i < dim; i++)
                x[(size_t)t * dim + i] += tmp[i];
        }
        for (int t = 0; t < n; t++) {
            ref_ds2_rmsnorm(xn, x + (size_t)t * dim, L->ffn_norm, dim, m->eps);
            int *route = routes ? routes + ((size_t)l * n + t) * m->n_used : NULL;
            if (l < m->n_dense) {
                ref_ds2_mlp(m, tmp, xn, L->gate, L->up, L->down, m->n_ff, g, u);
                for (int j = 0; route && j < m->n_used; j++)
                    route[j] = -1;
            } else {
                ref_ds2_moe(m, L, tmp, xn, tmp2, g, u, route);
            }
            for (int i = 0; i < dim; i++)
                x[(size_t)t * dim + i] += tmp[i];
        }
        if (hidden)
            memcpy(hidden + (size_t)(l + 1) * n * dim, x, (size_t)n * dim * sizeof(double));
    }
    for (int t = 0; t < n; t++) {
        ref_ds2_rmsnorm(xn, x + (size_t)t * dim, m->out_norm, dim, m->eps);
        ref_ds2_matvec(logits + (size_t)t * m->n_vocab, m->out, xn, m->n_vocab, dim);
    }
    free(x), free(xn), free(qa_buf), free(q), free(k), free(v), free(c), free(o), free(tmp);
    free(tmp2), free(g), free(u), free(p);
}
