/*
 * The AVX-512 BF16 GEMM of prefill against a scalar reference: bf16 rounding of the
 * activations bit for bit as quant_f32_to_bf16, products of every shape (tails of rows,
 * activations and columns, panels of 256 columns and more) within f32 summation error of
 * double sums of the same bf16 products, and each result the same bits whatever else is
 * computed with it, through ops_matmul_n as well. Skips on a CPU without AVX-512 BF16.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/ops.h"
#include "engine/quant/quant.h"
#include "engine/threadpool.h"
#include "tests/support/test.h"

#if defined(__x86_64__)
#include "engine/quant/gemm_avx512.h"

static float frand(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (float)((*s >> 8) & 0xFFFF) / 65536.0f * 2.0f - 1.0f;
}

static bool have_bf16(void)
{
    if (quant_bf16_rounds_activation())
        return true;
    test_skip("the CPU has no AVX-512 BF16 (or LLMS_NO_AVX512[_BF16] is set)");
    return false;
}

static bool have_avx512(void)
{
    if (quant_avx512_enabled())
        return true;
    test_skip("the CPU has no AVX-512 (or LLMS_NO_AVX512 is set)");
    return false;
}

/* Whether the CPU runs the GEMM of weight type wt: the F16 one needs no AVX-512 BF16. */
static bool have_kind(uint32_t wt)
{
    return wt == QTYPE_F16 || quant_bf16_rounds_activation();
}

static void test_convert(void)
{
    if (!have_bf16())
        return;
    enum { N = 70, STRIDE = 80 };
    float x[3 * STRIDE];
    uint16_t xb[3 * STRIDE];
    unsigned s = 3;
    for (int i = 0; i < 3 * STRIDE; i++)
        x[i] = frand(&s) * 1000.0f;
    x[5] = 1.0f + 0x1p-8f; /* a tie: rounds to even */
    x[6] = 1.0f + 0x1p-8f + 0x1p-7f;
    for (int cols = 1; cols <= N; cols++) {
        memset(xb, 0xAB, sizeof xb);
        gemm_avx512_bf16_convert(x, STRIDE, 3, cols, xb, STRIDE);
        for (int t = 0; t < 3; t++)
            for (int i = 0; i < STRIDE; i++)
                CHECK_MSG(xb[t * STRIDE + i] ==
                              (i < cols ? quant_f32_to_bf16(x[t * STRIDE + i]) : 0xABAB),
                          "cols %d row %d element %d: %#x", cols, t, i, xb[t * STRIDE + i]);
    }
}

enum { MAX_TOK = 21, MAX_COLS = 600, LDY = 60, PAD = 6 };

/* Weights of either type in 16 bits (wt: QTYPE_BF16 or QTYPE_F16) and activations: bf16
 * in xb for BF16 weights, f32 in x for F16 ones; the GEMM of that type on them. */
typedef struct operands {
    uint32_t wt;
    const uint16_t *w;
    size_t w_stride; /* elements */
    const uint16_t *xb;
    const float *x;
    size_t x_stride; /* elements */
} operands;

static void gemm(const operands *o, int row0, int nr, int tok0, int nt, int cols, float *y,
                 size_t ldy, void *panel)
{
    const uint16_t *w = o->w + (size_t)row0 * o->w_stride;
    if (o->wt == QTYPE_BF16)
        gemm_avx512_bf16_rows(QTYPE_BF16, w, o->w_stride * 2, nr, o->xb + (size_t)tok0 * o->x_stride,
                              o->x_stride, nt, cols, y, ldy, panel);
    else
        gemm_avx512_f16_rows(w, o->w_stride * 2, nr, o->x + (size_t)tok0 * o->x_stride,
                             o->x_stride, nt, cols, y, ldy, panel);
}

static double weight(const operands *o, int r, int k)
{
    uint16_t h = o->w[(size_t)r * o->w_stride + k];
    return o->wt == QTYPE_BF16 ? quant_bf16_to_f32(h) : quant_f16_to_f32(h);
}

static double activation(const operands *o, int t, int k)
{
    size_t i = (size_t)t * o->x_stride + k;
    return o->wt == QTYPE_BF16 ? quant_bf16_to_f32(o->xb[i]) : o->x[i];
}

/* Random operands of type wt, rows x cols weights and toks x cols activations, stride
 * elements a row; free with free_operands. */
static operands make_operands(uint32_t wt, int rows, int toks, size_t stride, unsigned seed)
{
    uint16_t *w = malloc(rows * stride * 2), *xb = malloc(toks * stride * 2);
    float *x = malloc(toks * stride * sizeof(float));
    for (size_t i = 0; i < rows * stride; i++) {
        float v = frand(&seed) * 0.05f;
        w[i] = wt == QTYPE_BF16 ? quant_f32_to_bf16(v) : quant_f32_to_f16(v);
    }
    for (size_t i = 0; i < toks * stride; i++) {
        x[i] = frand(&seed) * 3.0f;
        xb[i] = quant_f32_to_bf16(x[i]);
    }
    return (operands){wt, w, stride, xb, x, stride};
}

static void free_operands(operands *o)
{
    free((void *)o->w), free((void *)o->xb), free((void *)o->x);
}

static const uint32_t kinds[] = {QTYPE_BF16, QTYPE_F16};

/* y = x W^T for every shape below against double sums of the same products; the f32
 * sums of the kernel may differ from those by their rounding, bounded here by 2^-16 of
 * the sum of |products| (2^-24 per addition, a few hundred additions). y's cells past
 * n_rows keep their value. */
static void test_rows(void)
{
    if (!have_avx512())
        return;
    const int rows_list[] = {1, 15, 16, 17, 33, 47, 48};
    const int tok_list[] = {1, 7, 8, 9, MAX_TOK};
    const int cols_list[] = {2, 30, 64, 128, 130, 256, 258, 530, MAX_COLS};
    float *y = malloc(MAX_TOK * LDY * sizeof(float));
    void *panel = aligned_alloc(64, GEMM_AVX512_SCRATCH_BYTES);
    for (int ki = 0; ki < 2; ki++) {
        if (!have_kind(kinds[ki]))
            continue;
        operands o = make_operands(kinds[ki], GEMM_AVX512_UNIT_ROWS, MAX_TOK, MAX_COLS + PAD, 11);
        const char *name = quant_traits_of(o.wt)->name;
        for (size_t ri = 0; ri < sizeof rows_list / sizeof *rows_list; ri++)
            for (size_t ti = 0; ti < sizeof tok_list / sizeof *tok_list; ti++)
                for (size_t ci = 0; ci < sizeof cols_list / sizeof *cols_list; ci++) {
                    int nr = rows_list[ri], nt = tok_list[ti], cols = cols_list[ci];
                    for (int i = 0; i < MAX_TOK * LDY; i++)
                        y[i] = -7.0f;
                    gemm(&o, 0, nr, 0, nt, cols, y, LDY, panel);
                    for (int t = 0; t < nt; t++)
                        for (int r = 0; r < LDY; r++) {
                            float got = y[t * LDY + r];
                            if (r >= nr) {
                                CHECK_MSG(got == -7.0f, "%s rows %d: y[%d][%d] written", name,
                                          nr, t, r);
                                continue;
                            }
                            double sum = 0, mag = 0;
                            for (int k = 0; k < cols; k++) {
                                double p = weight(&o, r, k) * activation(&o, t, k);
                                sum += p;
                                mag += fabs(p);
                            }
                            CHECK_MSG(fabs(got - sum) <= 0x1p-16 * mag,
                                      "%s rows %d tok %d cols %d: y[%d][%d] = %.9g, "
                                      "reference %.9g",
                                      name, nr, nt, cols, t, r, got, sum);
                        }
                }
        free_operands(&o);
    }
    free(y), free(panel);
}

/* One row and one activation alone give the bits they give inside the largest call. */
static void test_same_bits_alone(void)
{
    if (!have_avx512())
        return;
    enum { ROWS = 48, TOK = 19, COLS = 530 };
    float *y = malloc(TOK * ROWS * sizeof(float));
    void *panel = aligned_alloc(64, GEMM_AVX512_SCRATCH_BYTES);
    for (int ki = 0; ki < 2; ki++) {
        if (!have_kind(kinds[ki]))
            continue;
        operands o = make_operands(kinds[ki], ROWS, TOK, COLS, 29);
        gemm(&o, 0, ROWS, 0, TOK, COLS, y, ROWS, panel);
        for (int t = 0; t < TOK; t += 5)
            for (int r = 0; r < ROWS; r += 7) {
                float one;
                gemm(&o, r, 1, t, 1, COLS, &one, 1, panel);
                CHECK_MSG(memcmp(&one, &y[t * ROWS + r], sizeof one) == 0,
                          "%s row %d tok %d: %.9g alone, %.9g in the batch",
                          quant_traits_of(o.wt)->name, r, t, one, y[t * ROWS + r]);
            }
        free_operands(&o);
    }
    free(y), free(panel);
}

/* Quantized (and F16) weights: dequantized, rounded to bf16, and multiplied as BF16 ones, against
 * double sums of those same products (tolerance as in test_rows); gemm_avx512_bf16_takes
 * says which types and widths the kernel takes. */
static void test_quantized(void)
{
    if (!have_bf16())
        return;
    /* F16 as prefill takes it with LLMS_F16_AS_BF16 */
    const uint32_t types[] = {QTYPE_F16,  QTYPE_Q8_0, QTYPE_Q4_0, QTYPE_Q4_1, QTYPE_Q5_0,
                              QTYPE_Q5_1, QTYPE_Q2_K, QTYPE_Q3_K, QTYPE_Q4_K, QTYPE_Q5_K,
                              QTYPE_Q6_K, QTYPE_IQ4_NL, QTYPE_IQ4_XS};
    enum { ROWS = 40, TOK = 11, COLS = 768 };
    float *wf = malloc(ROWS * COLS * sizeof(float)), *x = malloc(TOK * COLS * sizeof(float));
    float *deq = malloc(COLS * sizeof(float)), *y = malloc(TOK * ROWS * sizeof(float));
    uint16_t *xb = malloc(TOK * COLS * 2);
    char *w = malloc(ROWS * quant_row_bytes(QTYPE_F16, COLS)); /* the widest of the types */
    void *scratch = aligned_alloc(64, GEMM_AVX512_SCRATCH_BYTES);
    unsigned s = 53;
    for (int i = 0; i < ROWS * COLS; i++)
        wf[i] = frand(&s) * 0.1f;
    for (int i = 0; i < TOK * COLS; i++) {
        x[i] = frand(&s);
        xb[i] = quant_f32_to_bf16(x[i]);
    }
    CHECK(gemm_avx512_bf16_takes(QTYPE_BF16, 2) && !gemm_avx512_bf16_takes(QTYPE_BF16, 3));
    CHECK(!gemm_avx512_bf16_takes(QTYPE_F32, 256) && !gemm_avx512_bf16_takes(QTYPE_F16, 3));
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
        uint32_t t = types[ti];
        const char *name = quant_traits_of(t)->name;
        size_t rb = quant_row_bytes(t, COLS);
        /* 288: a last panel of one 32-column block */
        int cols_list[] = {256, COLS, 288};
        for (int r = 0; r < ROWS; r++)
            quant_quantize_row(t, wf + r * COLS, w + r * rb, COLS);
        for (int ci = 0; ci < 3; ci++) {
            int cols = cols_list[ci];
            bool block32 = quant_traits_of(t)->block_size <= 32;
            CHECK_MSG(gemm_avx512_bf16_takes(t, cols) == (cols % 256 == 0 || block32), "%s %d",
                      name, cols);
            if (!gemm_avx512_bf16_takes(t, cols))
                continue;
            /* rows of a cols-wide matrix: the first cols columns of each row, whole blocks */
            gemm_avx512_bf16_rows(t, w, rb, ROWS, xb, COLS, TOK, cols, y, ROWS, scratch);
            for (int r = 0; r < ROWS; r++) {
                quant_dequantize_row(t, w + r * rb, deq, COLS);
                for (int n = 0; n < TOK; n++) {
                    double sum = 0, mag = 0;
                    for (int k = 0; k < cols; k++) {
                        double p = (double)quant_bf16_to_f32(quant_f32_to_bf16(deq[k])) *
                                   quant_bf16_to_f32(xb[n * COLS + k]);
                        sum += p;
                        mag += fabs(p);
                    }
                    CHECK_MSG(fabs(y[n * ROWS + r] - sum) <= 0x1p-16 * mag,
                              "%s cols %d: y[%d][%d] = %.9g, reference %.9g", name, cols, n, r,
                              y[n * ROWS + r], sum);
                }
            }
        }
    }
    free(wf), free(x), free(deq), free(y), free(xb), free(w), free(scratch);
}

/* ops_matmul_n on BF16 weights through this GEMM, over more activation rows than one
 * bf16 conversion pass takes (two threads, two matrices): every row of the batch gives
 * the bits that row gives in a batch of 17 (the fewest the GEMM takes) at the start. */
static void test_ops_batches(void)
{
    if (!have_bf16())
        return;
    enum { ROWS = 100, ROWS2 = 37, COLS = 320, TOK = 300, SMALL = 17 };
    char err[ERR_MAX];
    tp_pool *pool = tp_new(2, err);
    CHECK(pool);
    CHECK(ops_init(err) == 0);
    uint16_t *w = malloc((ROWS + ROWS2) * COLS * 2);
    float *x = malloc(TOK * COLS * sizeof(float)), *y = malloc(TOK * ROWS * sizeof(float));
    float *y2 = malloc(TOK * ROWS2 * sizeof(float)), *ys = malloc(SMALL * ROWS * sizeof(float));
    float *ys2 = malloc(SMALL * ROWS2 * sizeof(float));
    void *scratch = aligned_alloc(64, ops_matmul_scratch_bytes(TOK, COLS, 2));
    unsigned s = 41;
    for (int i = 0; i < (ROWS + ROWS2) * COLS; i++)
        w[i] = quant_f32_to_bf16(frand(&s) * 0.1f);
    for (int i = 0; i < TOK * COLS; i++)
        x[i] = frand(&s);
    ops_matrix m = {QTYPE_BF16, w, ROWS, COLS, COLS * 2, false};
    ops_matrix m2 = {QTYPE_BF16, w + ROWS * COLS, ROWS2, COLS, COLS * 2, false};
    const ops_matrix *ws[] = {&m, &m2};
    ops_matmul_n(pool, 2, ws, x, TOK, (float *const[]){y, y2}, scratch);
    for (int t0 = 0; t0 + SMALL <= TOK; t0 += 3 * SMALL) {
        ops_matmul_n(pool, 2, ws, x + t0 * COLS, SMALL, (float *const[]){ys, ys2}, scratch);
        CHECK_MSG(memcmp(ys, y + t0 * ROWS, sizeof(float) * SMALL * ROWS) == 0, "rows from %d",
                  t0);
        CHECK_MSG(memcmp(ys2, y2 + t0 * ROWS2, sizeof(float) * SMALL * ROWS2) == 0,
                  "second matrix, rows from %d", t0);
    }
    free(w), free(x), free(y), free(y2), free(ys), free(ys2), free(scratch);
    tp_free(pool);
}
#endif

int main(void)
{
#if defined(__x86_64__)
    RUN(test_convert);
    RUN(test_rows);
    RUN(test_same_bits_alone);
    RUN(test_quantized);
    RUN(test_ops_batches);
#endif
    return test_finish();
}
