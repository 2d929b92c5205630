/*
 * ops.c — transformer row operations and the batched matrix product.
 */
#include "engine/model/ops.h"

#include <cpuid.h>
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "engine/quant/blas.h"
#include "engine/quant/gemm_avx512.h"
#include "engine/model/ops_avx2.h"
#include "engine/quant/quant.h"

/* Batches up to this many rows use the dot kernels when the weights are quantized,
 * larger ones sgemm on dequantized tiles (but where a packed kernel exists, below). Batched decode (one row per stream) lives
 * below it: with quant_dot_rows_multi, 32 and 64 rows take about half the time of
 * sgemm for Q8_0 and Q4_K on the TinyLlama-1.1B shapes (bench/matmul_batch, 2 threads,
 * AVX-512 VNNI). */
#define OPS_DOT_MAX_TOK 64
/* The same for f32/f16/bf16 weights, whose dot kernels have no multi-row form and
 * whose f32 tiles cost sgemm little or nothing. */
#define OPS_DOT_MAX_TOK_FLOAT 16
/* Rows of W one dot-kernel step works on: small enough to stay in L1/L2 while every
 * token of the batch passes over them. */
#define OPS_DOT_BLOCK 16
/* Rows of W dequantized per sgemm tile: sgemm repacks x for every tile, so tiles must
 * be wide enough to make that cheap (128 rows cost ~9% of a prefill, 256 about half). */
#define OPS_TILE_ROWS 256
/* Activation rows one pass of the BF16 GEMM converts to bf16: with the per-thread panels
 * they fit the scratch of the sgemm tiles, whatever the thread count. */
#define OPS_GEMM_CHUNK 256

static bool ops_have_avx2(void)
{
    static int have = -1;
    /* clang's __builtin_cpu_supports does not know "f16c" (make fuzz builds with clang),
     * so that bit comes from CPUID leaf 1 directly, as in quant.c. */
    unsigned eax, ebx, ecx, edx;
    if (have < 0)
        have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
    return have;
}

int ops_init(char err[ERR_MAX])
{
    (void)ops_have_avx2();
    return blas_init(err);
}

void ops_rmsnorm(float *y, const float *x, const float *w, int n, float eps)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    float scale = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++)
        y[i] = x[i] * scale * w[i];
}

void ops_softmax(float *x, int n)
{
    ops_softmax_sink(x, n, -INFINITY);
}

void ops_softmax_sink(float *x, int n, float sink)
{
    if (ops_have_avx2()) {
        ops_avx2_softmax_sink(x, n, sink);
        return;
    }
    float max = sink;
    for (int i = 0; i < n; i++)
        if (x[i] > max)
            max = x[i];
    float sum = 0;
    for (int i = 0; i < n; i++) {
        /* masked entries (-inf) are common in causal attention: skip their exp */
        x[i] = x[i] == -INFINITY ? 0.0f : expf(x[i] - max);
        sum += x[i];
    }
    if (sink != -INFINITY)
        sum += expf(sink - max);
    float inv = 1.0f / sum;
    for (int i = 0; i < n; i++)
        x[i] *= inv;
}

void ops_silu_mul(float *g, const float *u, int n)
{
    if (ops_have_avx2()) {
        ops_avx2_silu_mul(g, u, n);
        return;
    }
    for (int i = 0; i < n; i++)
        g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

void ops_swiglu_oai(float *g, const float *u, int n)
{
    const float alpha = 1.702f, limit = 7.0f;
    for (int i = 0; i < n; i++) {
        float a = g[i] < limit ? g[i] : limit;
        float b = u[i] < -limit ? -limit : u[i] > limit ? limit : u[i];
        g[i] = a / (1.0f + expf(-alpha * a)) * (b + 1.0f);
    }
}

void ops_gelu_tanh_mul(float *g, const float *u, int n)
{
    if (ops_have_avx2()) {
        ops_avx2_gelu_tanh_mul(g, u, n);
        return;
    }
    for (int i = 0; i < n; i++)
        g[i] = ops_gelu_tanh1(g[i]) * u[i];
}

void ops_gelu_tanh_bias(float *x, const float *b, int n)
{
    if (ops_have_avx2()) {
        ops_avx2_gelu_tanh_bias(x, b, n);
        return;
    }
    for (int i = 0; i < n; i++)
        x[i] = ops_gelu_tanh1(x[i] + b[i]);
}

void ops_softcap(float *x, int n, float cap)
{
    if (ops_have_avx2()) {
        ops_avx2_softcap(x, n, cap);
        return;
    }
    float inv = 1.0f / cap;
    for (int i = 0; i < n; i++)
        x[i] = cap * tanhf(x[i] * inv);
}

void ops_add(float *y, const float *x, int n)
{
    for (int i = 0; i < n; i++)
        y[i] += x[i];
}

void ops_scale(float *x, float s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] *= s;
}

void ops_layernorm(float *y, const float *x, const float *w, const float *b, int n, float eps)
{
    /* mean and variance in double: a residual stream grows with depth and sequential f32
     * sums of its squares lose digits */
    double mean = 0, var = 0;
    for (int i = 0; i < n; i++)
        mean += x[i];
    mean /= n;
    for (int i = 0; i < n; i++)
        var += (x[i] - mean) * (x[i] - mean);
    float s = (float)(1.0 / sqrt(var / n + eps)), mu = (float)mean;
    for (int i = 0; i < n; i++)
        y[i] = (x[i] - mu) * s * w[i] + (b ? b[i] : 0.0f);
}

void ops_add_layernorm(float *x, const float *a, const float *c, const float *w, const float *b,
                       int n, float eps)
{
    if (ops_have_avx2()) {
        ops_avx2_add_layernorm(x, a, c, w, b, n, eps);
        return;
    }
    for (int i = 0; i < n; i++)
        x[i] += a[i] + c[i];
    ops_layernorm(x, x, w, b, n, eps);
}

void ops_gelu_bias(float *x, const float *b, int n)
{
    if (ops_have_avx2()) {
        ops_avx2_gelu_bias(x, b, n);
        return;
    }
    for (int i = 0; i < n; i++) {
        float u = x[i] + b[i];
        x[i] = 0.5f * u * (1.0f + erff(u * 0.70710678f));
    }
}

ops_rope_scaling ops_rope_yarn(int head_dim, float base, float factor, int orig_ctx,
                               float beta_fast, float beta_slow, float ext_factor,
                               float attn_factor, bool truncate)
{
    /* The fractional pair index whose wavelength fits orig_ctx / beta times: solves
     * orig_ctx / (2*pi*base^(2i/head_dim)) = beta for i. */
    double lo = head_dim * log(orig_ctx / (beta_fast * 2.0 * M_PI)) / (2.0 * log(base));
    double hi = head_dim * log(orig_ctx / (beta_slow * 2.0 * M_PI)) / (2.0 * log(base));
    if (truncate) {
        lo = floor(lo);
        hi = ceil(hi);
    }
    ops_rope_scaling s = {
        .freq_scale = 1.0f / factor,
        .ext_factor = ext_factor,
        .ramp_low = (float)(lo < 0 ? 0 : lo),
        .ramp_high = (float)(hi > head_dim - 1 ? head_dim - 1 : hi),
        .mscale = attn_factor,
    };
    if (ext_factor != 0.0f)
        s.mscale *= 1.0f + 0.1f * logf(factor);
    return s;
}

void ops_rope_angles(float *cs, int pos, int head_dim, float base,
                     const ops_rope_scaling *scaling, const float *freq_factors)
{
    static const ops_rope_scaling unscaled = OPS_ROPE_UNSCALED;
    const ops_rope_scaling *sc = scaling ? scaling : &unscaled;
    double span = sc->ramp_high - sc->ramp_low;
    if (span < 0.001)
        span = 0.001;
    int half = head_dim / 2;
    for (int i = 0; i < half; i++) {
        double theta = (double)pos * pow((double)base, -2.0 * i / head_dim);
        if (freq_factors)
            theta /= freq_factors[i];
        double keep = 0.0; /* share of the unscaled frequency this pair keeps */
        if (sc->ext_factor != 0.0f) {
            double y = (i - sc->ramp_low) / span;
            keep = sc->ext_factor * (1.0 - (y < 0.0 ? 0.0 : y > 1.0 ? 1.0 : y));
        }
        theta = theta * sc->freq_scale * (1.0 - keep) + theta * keep;
        cs[2 * i] = (float)(sc->mscale * cos(theta));
        cs[2 * i + 1] = (float)(sc->mscale * sin(theta));
    }
}

void ops_rope(float *x, int n_head, int head_dim, int rope_dims, const float *cs,
              enum ops_rope_style style)
{
    int half = rope_dims / 2;
    for (int h = 0; h < n_head; h++) {
        float *v = x + (size_t)h * head_dim;
        for (int i = 0; i < half; i++) {
            int a = style == OPS_ROPE_INTERLEAVED ? 2 * i : i;
            int b = style == OPS_ROPE_INTERLEAVED ? 2 * i + 1 : i + half;
            float c = cs[2 * i], s = cs[2 * i + 1];
            float x0 = v[a], x1 = v[b];
            v[a] = x0 * c - x1 * s;
            v[b] = x0 * s + x1 * c;
        }
    }
}

void ops_f32_to_f16(uint16_t *dst, const float *src, int n)
{
    if (ops_have_avx2()) {
        ops_avx2_f32_to_f16(dst, src, n);
        return;
    }
    for (int i = 0; i < n; i++)
        dst[i] = quant_f32_to_f16(src[i]);
}

void ops_attn_scores(const float *q, int n_q, const uint16_t *k, int n_k, int d, float scale,
                     float *scores, size_t stride)
{
    if (ops_have_avx2() && d % 8 == 0 && d <= OPS_MAX_HEAD_DIM) {
        ops_avx2_attn_scores(q, n_q, k, n_k, d, scale, scores, stride);
        return;
    }
    for (int i = 0; i < n_k; i++)
        for (int g = 0; g < n_q; g++) {
            float sum = 0;
            for (int j = 0; j < d; j++)
                sum += q[(size_t)g * d + j] * quant_f16_to_f32(k[(size_t)i * d + j]);
            scores[(size_t)g * stride + i] = scale * sum;
        }
}

void ops_attn_accum(float *out, int n_q, const float *p, size_t stride, const uint16_t *v,
                    int n_k, int d)
{
    if (ops_have_avx2() && d % 8 == 0 && d <= OPS_MAX_HEAD_DIM) {
        ops_avx2_attn_accum(out, n_q, p, stride, v, n_k, d);
        return;
    }
    for (int i = 0; i < n_k; i++)
        for (int g = 0; g < n_q; g++) {
            float w = p[(size_t)g * stride + i];
            for (int j = 0; w != 0.0f && j < d; j++)
                out[(size_t)g * d + j] += w * quant_f16_to_f32(v[(size_t)i * d + j]);
        }
}

void ops_attn_scores_f32(const float *q, int n_q, const float *k, int n_k, int d, float scale,
                         float *scores, size_t stride)
{
    if (ops_have_avx2() && d % 8 == 0 && d <= OPS_MAX_HEAD_DIM) {
        ops_avx2_attn_scores_f32(q, n_q, k, n_k, d, scale, scores, stride);
        return;
    }
    for (int i = 0; i < n_k; i++)
        for (int g = 0; g < n_q; g++) {
            float sum = 0;
            for (int j = 0; j < d; j++)
                sum += q[(size_t)g * d + j] * k[(size_t)i * d + j];
            scores[(size_t)g * stride + i] = scale * sum;
        }
}

void ops_attn_accum_f32(float *out, int n_q, const float *p, size_t stride, const float *v,
                        int n_k, int d)
{
    if (ops_have_avx2() && d % 8 == 0 && d <= OPS_MAX_HEAD_DIM) {
        ops_avx2_attn_accum_f32(out, n_q, p, stride, v, n_k, d);
        return;
    }
    for (int i = 0; i < n_k; i++)
        for (int g = 0; g < n_q; g++) {
            float w = p[(size_t)g * stride + i];
            for (int j = 0; w != 0.0f && j < d; j++)
                out[(size_t)g * d + j] += w * v[(size_t)i * d + j];
        }
}

/* ---- matrix product ---- */

static size_t ops_align(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

/* Bytes of one activation row converted for the dot kernels, the largest over types. */
static size_t ops_act_row_bytes(int cols)
{
    size_t q8k = quant_row_bytes(QTYPE_Q8_K, cols);
    size_t q80 = quant_row_bytes(QTYPE_Q8_0, cols);
    size_t b = q8k > q80 ? q8k : q80;
    return ops_align(b ? b : (size_t)cols * sizeof(float));
}

_Static_assert(OPS_DOT_BLOCK % QUANT_REPACK_ROWS == 0, "dot blocks hold whole repacked groups");

void ops_matrix_repack(const ops_matrix *w, void *dst, ops_matrix *out)
{
    size_t group = QUANT_REPACK_ROWS * w->row_bytes;
    int whole = w->rows / QUANT_REPACK_ROWS * QUANT_REPACK_ROWS;
    for (int r = 0; r < whole; r += QUANT_REPACK_ROWS)
        quant_repack_rows(w->type, (const char *)w->data + (size_t)r * w->row_bytes, w->row_bytes,
                          w->cols, (char *)dst + (size_t)r / QUANT_REPACK_ROWS * group);
    memcpy((char *)dst + (size_t)whole * w->row_bytes,
           (const char *)w->data + (size_t)whole * w->row_bytes,
           (size_t)(w->rows - whole) * w->row_bytes);
    *out = *w;
    out->data = dst;
    out->repacked = true;
}

size_t ops_matmul_scratch_bytes(int max_tok, int max_cols, int n_threads)
{
    int dot_tok = max_tok < OPS_DOT_MAX_TOK ? max_tok : OPS_DOT_MAX_TOK;
    size_t act = (size_t)dot_tok * ops_act_row_bytes(max_cols) +
                 ops_align(quant_packed_bytes(QTYPE_Q8_0, dot_tok, max_cols)) +
                 ops_align(quant_repacked_act_bytes(dot_tok, max_cols));
    size_t tiles = (size_t)n_threads * ops_align((size_t)OPS_TILE_ROWS * max_cols * sizeof(float));
    return act > tiles ? act : tiles;
}

/* Work units are claimed from a shared counter, so a thread that was descheduled on a
 * busy machine does not hold the others up. */
typedef struct ops_matmul_job {
    int n_mat;
    const ops_matrix *w[OPS_MATMUL_MAX];
    float *y[OPS_MATMUL_MAX];    /* (n_tok, w[i]->rows) */
    int unit_start[OPS_MATMUL_MAX + 1]; /* first work unit of each matrix; last: total */
    int unit_rows;               /* rows of W per work unit */
    const float *x;              /* (n_tok, cols) */
    int n_tok;
    const char *act;             /* (n_tok, act_stride) converted activations */
    size_t act_stride;
    uint32_t act_type;
    const void *packed;          /* the activations packed for quant_dot_rows_packed, or NULL */
    void *repacked_act;          /* for quant_dot_rows_repacked, or NULL (no matrix repacked) */
    uint16_t *xb;                /* (n_tok, cols) the activations in bf16 for the BF16 GEMM */
    bool f16_fma;                /* F16 weights take the GEMM's f32 FMA kernel on x */
    char *scratch;
    size_t tile_stride;
    _Atomic int next_unit;
} ops_matmul_job;

static void ops_prepare_job(void *p, int ith, int nth)
{
    ops_matmul_job *j = p;
    int cols = j->w[0]->cols;
    long b, e;
    tp_split(j->n_tok, ith, nth, &b, &e);
    for (long t = b; t < e; t++)
        quant_prepare_activation(j->act_type, j->x + t * cols, (char *)j->act + t * j->act_stride,
                                 cols);
    /* each thread its own rows: on the caller alone this was a serial stretch of every
     * batched product, the other threads waiting */
    if (j->repacked_act)
        quant_repack_activations(j->act, j->act_stride, (int)b, (int)e, j->n_tok, cols,
                                 j->repacked_act);
}

/* Claims the next work unit: matrix *m, rows [*r0, *r0 + *n). False when none is left. */
static bool ops_next_unit(ops_matmul_job *j, int *m, int *r0, int *n)
{
    int u = atomic_fetch_add_explicit(&j->next_unit, 1, memory_order_relaxed);
    if (u >= j->unit_start[j->n_mat])
        return false;
    int i = 0;
    while (u >= j->unit_start[i + 1])
        i++;
    *m = i;
    *r0 = (u - j->unit_start[i]) * j->unit_rows;
    *n = j->w[i]->rows - *r0 < j->unit_rows ? j->w[i]->rows - *r0 : j->unit_rows;
    return true;
}

static void ops_dot_job(void *p, int ith, int nth)
{
    ops_matmul_job *j = p;
    int m, r0, n;
    (void)ith, (void)nth;
    while (ops_next_unit(j, &m, &r0, &n)) {
        const ops_matrix *w = j->w[m];
        /* one activation reuses nothing from cache between blocks: the unit in one call,
         * so kernels that prepare the activation (BF16 rounds it) do so once a unit */
        if (j->n_tok == 1 && !w->repacked) {
            quant_dot_rows(w->type, (const char *)w->data + (size_t)r0 * w->row_bytes,
                           w->row_bytes, n, j->act, w->cols, j->y[m] + r0);
            continue;
        }
        for (int b = r0; b < r0 + n; b += OPS_DOT_BLOCK) {
            int nb = r0 + n - b < OPS_DOT_BLOCK ? r0 + n - b : OPS_DOT_BLOCK;
            const char *rows = (const char *)w->data + (size_t)b * w->row_bytes;
            if (w->repacked && nb == QUANT_REPACK_ROWS) {
                quant_dot_rows_repacked(w->type, rows, w->row_bytes, nb, j->repacked_act, j->n_tok,
                                        w->cols, j->y[m] + b, (size_t)w->rows);
                continue;
            }
            /* a repacked matrix's last rows: by the kernel whose results do not depend on
             * n_tok, as the repacked rows' do not */
            if (!j->packed || w->repacked ||
                !quant_dot_rows_packed(w->type, rows, w->row_bytes, nb, j->packed, j->n_tok,
                                       w->cols, j->y[m] + b, (size_t)w->rows))
                quant_dot_rows_multi(w->type, rows, w->row_bytes, nb, j->act, j->act_stride,
                                     j->n_tok, w->cols, j->y[m] + b, (size_t)w->rows);
        }
    }
}

static void ops_sgemm_job(void *p, int ith, int nth)
{
    ops_matmul_job *j = p;
    float *tile = (float *)(j->scratch + (size_t)ith * j->tile_stride);
    int m, r0, n;
    (void)nth;
    while (ops_next_unit(j, &m, &r0, &n)) {
        const ops_matrix *w = j->w[m];
        const float *b;
        if (w->type == QTYPE_F32) {
            b = (const float *)((const char *)w->data + (size_t)r0 * w->row_bytes);
        } else {
            for (int r = 0; r < n; r++)
                quant_dequantize_row(w->type, (const char *)w->data + (size_t)(r0 + r) * w->row_bytes,
                                     tile + (size_t)r * w->cols, w->cols);
            b = tile;
        }
        blas_sgemm(true, j->n_tok, n, w->cols, 1.0f, j->x, w->cols, b, w->cols, 0.0f,
                   j->y[m] + r0, w->rows);
    }
}

#if defined(__x86_64__)
static void ops_bf16_convert_job(void *p, int ith, int nth)
{
    ops_matmul_job *j = p;
    int cols = j->w[0]->cols;
    long b, e;
    tp_split(j->n_tok, ith, nth, &b, &e);
    gemm_avx512_bf16_convert(j->x + b * cols, (size_t)cols, (int)(e - b), cols,
                             j->xb + b * cols, (size_t)cols);
}

static void ops_gemm_job(void *p, int ith, int nth)
{
    ops_matmul_job *j = p;
    void *panel = j->scratch + (size_t)ith * GEMM_AVX512_SCRATCH_BYTES;
    int m, r0, n;
    (void)nth;
    while (ops_next_unit(j, &m, &r0, &n)) {
        const ops_matrix *w = j->w[m];
        const char *rows = (const char *)w->data + (size_t)r0 * w->row_bytes;
        if (j->f16_fma)
            gemm_avx512_f16_rows(rows, w->row_bytes, n, j->x, (size_t)w->cols, j->n_tok,
                                 w->cols, j->y[m] + r0, (size_t)w->rows, panel);
        else
            gemm_avx512_bf16_rows(w->type, rows, w->row_bytes, n, j->xb, (size_t)w->cols,
                                  j->n_tok, w->cols, j->y[m] + r0, (size_t)w->rows, panel);
    }
}

/* Whether the AVX-512 GEMM takes this product (more rows than the dot kernels take, which
 * for quantized weights means more than batched decode has): all
 * weights F16, or all BF16 or quantized without a packed kernel of their own (every
 * quantized type but Q8_0) where the CPU has AVX-512 BF16. The latter have the BF16 decode kernel's
 * numerics, activations rounded to bf16, and quantized weights are rounded to bf16 after
 * dequantization (2^-9 of each at most, where their quantization moved them by 2^-5 to
 * 2^-8 of their block's range); 1.4-2x the speed of sgemm on dequantized tiles. F16
 * weights go that way too where quant_f16_prefill_as_bf16 opts in. */
static bool ops_avx512_gemm(int n_mat, const ops_matrix *const *w, int n_tok)
{
    bool f16 = w[0]->type == QTYPE_F16 && !quant_f16_prefill_as_bf16();
    bool float_weights = w[0]->type == QTYPE_F16 || w[0]->type == QTYPE_BF16;
    if (n_tok <= (float_weights ? OPS_DOT_MAX_TOK_FLOAT : OPS_DOT_MAX_TOK) ||
        !quant_avx512_enabled())
        return false;
    for (int i = 0; i < n_mat; i++) {
        uint32_t t = w[i]->type;
        /* the panels read rows as stored, not repacked ones (Q8_0's, which never come here) */
        bool ok = !w[i]->repacked &&
                  (f16 ? t == QTYPE_F16
                       : quant_bf16_rounds_activation() && !quant_packed_kernel(t) &&
                             (t != QTYPE_F16 || quant_f16_prefill_as_bf16()) &&
                             gemm_avx512_bf16_takes(t, w[i]->cols));
        if (!ok)
            return false;
    }
    return true;
}
#endif

/* A job on the pool's threads, or on the calling thread alone when pool is NULL. */
static void ops_run(tp_pool *pool, tp_fn fn, void *arg)
{
    if (pool)
        tp_run(pool, fn, arg);
    else
        fn(arg, 0, 1);
}

static void ops_set_units(ops_matmul_job *j, int unit_rows)
{
    j->unit_rows = unit_rows;
    j->unit_start[0] = 0;
    for (int i = 0; i < j->n_mat; i++)
        j->unit_start[i + 1] = j->unit_start[i] + (j->w[i]->rows + unit_rows - 1) / unit_rows;
    atomic_store_explicit(&j->next_unit, 0, memory_order_relaxed);
}

void ops_matmul_n(tp_pool *pool, int n_mat, const ops_matrix *const *w, const float *x,
                  int n_tok, float *const *y, void *scratch)
{
    ops_matmul_job j = {.n_mat = n_mat, .x = x, .n_tok = n_tok, .scratch = scratch};
    uint32_t act_type = quant_dot_activation_type(w[0]->type);
    for (int i = 0; i < n_mat; i++) {
        j.w[i] = w[i];
        j.y[i] = y[i];
        /* matrices that want their input in different forms go one at a time */
        if (quant_dot_activation_type(w[i]->type) != act_type && n_tok <= OPS_DOT_MAX_TOK) {
            for (int k = 0; k < n_mat; k++)
                ops_matmul(pool, w[k], x, n_tok, y[k], scratch);
            return;
        }
    }
    int nth = pool ? tp_n_threads(pool) : 1;
#if defined(__x86_64__)
    if (ops_avx512_gemm(n_mat, w, n_tok)) {
        /* the panels first, then (but for F16's FMA kernel) the activations in bf16 */
        int cols = w[0]->cols;
        j.f16_fma = w[0]->type == QTYPE_F16 && !quant_f16_prefill_as_bf16();
        j.scratch = scratch;
        j.xb = (uint16_t *)(void *)((char *)scratch + ops_align((size_t)nth * GEMM_AVX512_SCRATCH_BYTES));
        for (int t0 = 0; t0 < n_tok; t0 += OPS_GEMM_CHUNK) {
            j.n_tok = n_tok - t0 < OPS_GEMM_CHUNK ? n_tok - t0 : OPS_GEMM_CHUNK;
            j.x = x + (size_t)t0 * cols;
            for (int i = 0; i < n_mat; i++)
                j.y[i] = y[i] + (size_t)t0 * w[i]->rows;
            if (!j.f16_fma)
                ops_run(pool, ops_bf16_convert_job, &j);
            ops_set_units(&j, GEMM_AVX512_UNIT_ROWS);
            ops_run(pool, ops_gemm_job, &j);
        }
        return;
    }
#endif
    /* Where every matrix has a packed-activation kernel, prefill takes it too,
     * OPS_DOT_MAX_TOK rows at a time: integer products on 8-bit activations as in decode
     * (and as llama.cpp computes them), 1.7-2.6x the speed of sgemm on dequantized tiles
     * for Q8_0 on AVX-512 VNNI (2048 x 5632, 128-512 rows, 2 threads). */
    bool packed = n_tok > OPS_DOT_MAX_TOK &&
                  quant_packed_bytes(act_type, OPS_DOT_MAX_TOK, w[0]->cols) > 0;
    for (int i = 0; i < n_mat && packed; i++)
        packed = quant_packed_kernel(w[i]->type);
    if (packed) {
        for (int t0 = 0; t0 < n_tok; t0 += OPS_DOT_MAX_TOK) {
            int nt = n_tok - t0 < OPS_DOT_MAX_TOK ? n_tok - t0 : OPS_DOT_MAX_TOK;
            float *ys[OPS_MATMUL_MAX];
            for (int i = 0; i < n_mat; i++)
                ys[i] = y[i] + (size_t)t0 * w[i]->rows;
            ops_matmul_n(pool, n_mat, w, x + (size_t)t0 * w[0]->cols, nt, ys, scratch);
        }
        return;
    }
    if (n_tok > (act_type == QTYPE_F32 ? OPS_DOT_MAX_TOK_FLOAT : OPS_DOT_MAX_TOK)) {
        j.tile_stride = ops_align((size_t)OPS_TILE_ROWS * w[0]->cols * sizeof(float));
        ops_set_units(&j, OPS_TILE_ROWS);
        ops_run(pool, ops_sgemm_job, &j);
        return;
    }
    j.act_type = act_type;
    if (j.act_type == QTYPE_F32) {
        j.act = (const char *)x;
        j.act_stride = (size_t)w[0]->cols * sizeof(float);
    } else {
        j.act = scratch;
        j.act_stride = ops_act_row_bytes(w[0]->cols);
        bool repacked = false, plain = false;
        for (int i = 0; i < n_mat; i++)
            repacked |= w[i]->repacked, plain |= !w[i]->repacked;
        char *packed = (char *)scratch + ops_align((size_t)n_tok * j.act_stride);
        size_t packed_bytes = quant_packed_bytes(act_type, n_tok, w[0]->cols);
        if (repacked)
            j.repacked_act = packed + ops_align(packed_bytes);
        if (n_tok == 1)
            ops_prepare_job(&j, 0, 1);
        else
            ops_run(pool, ops_prepare_job, &j);
        if (packed_bytes && plain) {
            quant_pack_activations(act_type, j.act, j.act_stride, n_tok, w[0]->cols, packed);
            j.packed = packed;
        }
    }
    /* about 8 units per thread: fine enough to rebalance, coarse enough to keep the
     * counter cheap; a multiple of the block so blocks stay whole */
    long rows = 0;
    for (int i = 0; i < n_mat; i++)
        rows += w[i]->rows;
    long unit = rows / (8L * nth);
    unit = (unit + OPS_DOT_BLOCK - 1) / OPS_DOT_BLOCK * OPS_DOT_BLOCK;
    ops_set_units(&j, unit < OPS_DOT_BLOCK ? OPS_DOT_BLOCK : (int)unit);
    ops_run(pool, ops_dot_job, &j);
}

void ops_matmul(tp_pool *pool, const ops_matrix *w, const float *x, int n_tok, float *y,
                void *scratch)
{
    ops_matmul_n(pool, 1, &w, x, n_tok, &y, scratch);
}

/* Rows of W per work unit of ops_matmul_add: a unit's rows in f32 and their dot products,
 * OPS_ADD_UNIT_ROWS * (cols + 1) floats, fit a thread's tile of ops_matmul's scratch
 * (OPS_TILE_ROWS * cols floats). */
#define OPS_ADD_UNIT_ROWS (OPS_TILE_ROWS / 2)

typedef struct ops_add_job {
    const ops_matrix *w;
    const float *x;  /* (n_tok, w->cols) */
    int n_tok;
    float scale;
    float *y;        /* n_tok rows ldy apart */
    size_t ldy;
    char *scratch;
    size_t tile_stride;
    int n_units;
    /* F32 and F16 rows (no longer than the F16 kernel takes f32 activations for) are read
     * in place by their own dot kernels, f32 products of the same values: decode's rank-8
     * rows cost their conversion's calls otherwise. Other types are dequantized first. */
    bool in_place;
    _Atomic int next_unit;
} ops_add_job;

static void ops_add_job_run(void *p, int ith, int nth)
{
    ops_add_job *j = p;
    const ops_matrix *w = j->w;
    int cols = w->cols;
    float *tile = (float *)(j->scratch + (size_t)ith * j->tile_stride); /* (unit, cols) */
    float *dots = tile + (size_t)OPS_ADD_UNIT_ROWS * cols;              /* (unit) */
    int u;
    (void)nth;
    while ((u = atomic_fetch_add_explicit(&j->next_unit, 1, memory_order_relaxed)) < j->n_units) {
        int r0 = u * OPS_ADD_UNIT_ROWS;
        int n = w->rows - r0 < OPS_ADD_UNIT_ROWS ? w->rows - r0 : OPS_ADD_UNIT_ROWS;
        const char *rows = (const char *)w->data + (size_t)r0 * w->row_bytes;
        if (!j->in_place)
            for (int r = 0; r < n; r++)
                quant_dequantize_row(w->type, rows + (size_t)r * w->row_bytes,
                                     tile + (size_t)r * cols, cols);
        if (j->n_tok > OPS_DOT_MAX_TOK_FLOAT) {
            blas_sgemm(true, j->n_tok, n, cols, j->scale, j->x, cols, tile, cols, 1.0f,
                       j->y + r0, (int)j->ldy);
            continue;
        }
        for (int t = 0; t < j->n_tok; t++) {
            if (j->in_place)
                quant_dot_rows(w->type, rows, w->row_bytes, n, j->x + (size_t)t * cols, cols, dots);
            else
                quant_dot_rows(QTYPE_F32, tile, (size_t)cols * sizeof(float), n,
                               j->x + (size_t)t * cols, cols, dots);
            float *yt = j->y + (size_t)t * j->ldy + r0;
            for (int r = 0; r < n; r++)
                yt[r] += j->scale * dots[r];
        }
    }
}

void ops_matmul_add(tp_pool *pool, const ops_matrix *w, const float *x, int n_tok, float scale,
                    float *y, size_t ldy, void *scratch)
{
    ops_add_job j = {.w = w, .x = x, .n_tok = n_tok, .scale = scale, .y = y, .ldy = ldy,
                     .scratch = scratch,
                     .tile_stride = ops_align((size_t)OPS_ADD_UNIT_ROWS * (w->cols + 1) * sizeof(float)),
                     .n_units = (w->rows + OPS_ADD_UNIT_ROWS - 1) / OPS_ADD_UNIT_ROWS,
                     .in_place = n_tok <= OPS_DOT_MAX_TOK_FLOAT &&
                                 (w->type == QTYPE_F32 ||
                                  (w->type == QTYPE_F16 && !quant_f16_rounds_activation(w->cols)))};
    atomic_store_explicit(&j.next_unit, 0, memory_order_relaxed);
    ops_run(j.n_units == 1 ? NULL : pool, ops_add_job_run, &j);
}
