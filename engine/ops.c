/*
 * ops.c — transformer row operations and the batched matrix product.
 */
#include "engine/ops.h"

#include <cblas.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "engine/ops_avx2.h"
#include "engine/quant.h"

/* Batches up to this many rows use the quantized dot kernels; larger ones sgemm. */
#define OPS_DOT_MAX_TOK 16
/* Rows of W one dot-kernel step works on: small enough to stay in L1/L2 while every
 * token of the batch passes over them. */
#define OPS_DOT_BLOCK 16
/* Rows of W dequantized per sgemm tile. */
#define OPS_TILE_ROWS 128

static bool ops_have_avx2(void)
{
    static int have = -1;
    if (have < 0)
        have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("f16c");
    return have;
}

void ops_init(void)
{
    openblas_set_num_threads(1);
    (void)ops_have_avx2();
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
    float max = -INFINITY;
    for (int i = 0; i < n; i++)
        if (x[i] > max)
            max = x[i];
    float sum = 0;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    float inv = 1.0f / sum;
    for (int i = 0; i < n; i++)
        x[i] *= inv;
}

void ops_silu_mul(float *g, const float *u, int n)
{
    for (int i = 0; i < n; i++)
        g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

void ops_add(float *y, const float *x, int n)
{
    for (int i = 0; i < n; i++)
        y[i] += x[i];
}

void ops_rope_angles(float *cs, int pos, int head_dim, float base)
{
    int half = head_dim / 2;
    for (int i = 0; i < half; i++) {
        double theta = (double)pos * pow((double)base, -2.0 * i / head_dim);
        cs[2 * i] = (float)cos(theta);
        cs[2 * i + 1] = (float)sin(theta);
    }
}

void ops_rope(float *x, int n_head, int head_dim, const float *cs, enum ops_rope_style style)
{
    int half = head_dim / 2;
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

float ops_dot_f16(const float *x, const uint16_t *h, int n)
{
    if (ops_have_avx2())
        return ops_avx2_dot_f16(x, h, n);
    float sum = 0;
    for (int i = 0; i < n; i++)
        sum += x[i] * quant_f16_to_f32(h[i]);
    return sum;
}

void ops_axpy_f16(float *y, float a, const uint16_t *h, int n)
{
    if (ops_have_avx2()) {
        ops_avx2_axpy_f16(y, a, h, n);
        return;
    }
    for (int i = 0; i < n; i++)
        y[i] += a * quant_f16_to_f32(h[i]);
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

size_t ops_matmul_scratch_bytes(int max_tok, int max_cols, int n_threads)
{
    int dot_tok = max_tok < OPS_DOT_MAX_TOK ? max_tok : OPS_DOT_MAX_TOK;
    size_t act = (size_t)dot_tok * ops_act_row_bytes(max_cols);
    size_t tiles = (size_t)n_threads * ops_align((size_t)OPS_TILE_ROWS * max_cols * sizeof(float));
    return act > tiles ? act : tiles;
}

typedef struct ops_matmul_job {
    const ops_matrix *w;
    const float *x; /* (n_tok, cols) */
    int n_tok;
    float *y;       /* (n_tok, rows) */
    const char *act; /* (n_tok, act_stride) converted activations */
    size_t act_stride;
    uint32_t act_type;
    char *scratch;
    size_t tile_stride;
} ops_matmul_job;

static void ops_prepare_job(void *p, int ith, int nth)
{
    ops_matmul_job *j = p;
    long b, e;
    tp_split(j->n_tok, ith, nth, &b, &e);
    for (long t = b; t < e; t++)
        quant_prepare_activation(j->act_type, j->x + t * j->w->cols,
                                 (char *)j->act + t * j->act_stride, j->w->cols);
}

static void ops_dot_job(void *p, int ith, int nth)
{
    ops_matmul_job *j = p;
    const ops_matrix *w = j->w;
    long b, e;
    tp_split(w->rows, ith, nth, &b, &e);
    for (long r = b; r < e; r += OPS_DOT_BLOCK) {
        long n = e - r < OPS_DOT_BLOCK ? e - r : OPS_DOT_BLOCK;
        const char *rows = (const char *)w->data + r * w->row_bytes;
        for (int t = 0; t < j->n_tok; t++)
            quant_dot_rows(w->type, rows, w->row_bytes, n, j->act + t * j->act_stride, w->cols,
                           j->y + (size_t)t * w->rows + r);
    }
}

static void ops_sgemm_job(void *p, int ith, int nth)
{
    ops_matmul_job *j = p;
    const ops_matrix *w = j->w;
    float *tile = (float *)(j->scratch + (size_t)ith * j->tile_stride);
    int n_tiles = (w->rows + OPS_TILE_ROWS - 1) / OPS_TILE_ROWS;
    for (int t = ith; t < n_tiles; t += nth) {
        int r0 = t * OPS_TILE_ROWS;
        int n = w->rows - r0 < OPS_TILE_ROWS ? w->rows - r0 : OPS_TILE_ROWS;
        const float *b;
        if (w->type == QTYPE_F32) {
            b = (const float *)((const char *)w->data + (size_t)r0 * w->row_bytes);
        } else {
            for (int r = 0; r < n; r++)
                quant_dequantize_row(w->type, (const char *)w->data + (size_t)(r0 + r) * w->row_bytes,
                                     tile + (size_t)r * w->cols, w->cols);
            b = tile;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, j->n_tok, n, w->cols, 1.0f, j->x,
                    w->cols, b, w->cols, 0.0f, j->y + r0, w->rows);
    }
}

void ops_matmul(tp_pool *pool, const ops_matrix *w, const float *x, int n_tok, float *y,
                void *scratch)
{
    ops_matmul_job j = {.w = w, .x = x, .n_tok = n_tok, .y = y, .scratch = scratch};
    if (n_tok > OPS_DOT_MAX_TOK) {
        j.tile_stride = ops_align((size_t)OPS_TILE_ROWS * w->cols * sizeof(float));
        tp_run(pool, ops_sgemm_job, &j);
        return;
    }
    j.act_type = quant_dot_activation_type(w->type);
    if (j.act_type == QTYPE_F32) {
        j.act = (const char *)x;
        j.act_stride = (size_t)w->cols * sizeof(float);
    } else {
        j.act = scratch;
        j.act_stride = ops_act_row_bytes(w->cols);
        if (n_tok == 1)
            ops_prepare_job(&j, 0, 1);
        else
            tp_run(pool, ops_prepare_job, &j);
    }
    tp_run(pool, ops_dot_job, &j);
}
