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

#include "engine/ops.h"
#include "engine/quant.h"
#include "engine/threadpool.h"
#include "tests/support/test.h"

#if defined(__x86_64__)
#include "engine/gemm_bf16_avx512.h"

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
        gemm_bf16_avx512_convert(x, STRIDE, 3, cols, xb, STRIDE);
        for (int t = 0; t < 3; t++)
            for (int i = 0; i < STRIDE; i++)
                CHECK_MSG(xb[t * STRIDE + i] ==
                              (i < cols ? quant_f32_to_bf16(x[t * STRIDE + i]) : 0xABAB),
                          "cols %d row %d element %d: %#x", cols, t, i, xb[t * STRIDE + i]);
    }
}

enum { MAX_TOK = 21, MAX_COLS = 600, LDY = 60, PAD = 6 };

/* y = xb W^T for every shape below against double sums of the same bf16 products; the
 * f32 sums of the kernel may differ from those by their rounding, bounded here by 2^-16
 * of the sum of |products| (2^-24 per addition, a few hundred additions). y's cells past
 * n_rows keep their value. */
static void test_rows(void)
{
    if (!have_bf16())
        return;
    const int rows_list[] = {1, 15, 16, 17, 33, 47, 48};
    const int tok_list[] = {1, 7, 8, 9, MAX_TOK};
    const int cols_list[] = {2, 30, 64, 256, 258, 530, MAX_COLS};
    size_t xs = MAX_COLS + PAD, rb = (MAX_COLS + PAD) * 2;
    uint16_t *w = malloc(GEMM_BF16_UNIT_ROWS * rb), *xb = malloc(MAX_TOK * xs * 2);
    float *y = malloc(MAX_TOK * LDY * sizeof(float));
    void *panel = aligned_alloc(64, GEMM_BF16_PANEL_BYTES);
    unsigned s = 11;
    for (size_t i = 0; i < GEMM_BF16_UNIT_ROWS * rb / 2; i++)
        w[i] = quant_f32_to_bf16(frand(&s) * 0.05f);
    for (size_t i = 0; i < MAX_TOK * xs; i++)
        xb[i] = quant_f32_to_bf16(frand(&s));
    for (size_t ri = 0; ri < sizeof rows_list / sizeof *rows_list; ri++)
        for (size_t ti = 0; ti < sizeof tok_list / sizeof *tok_list; ti++)
            for (size_t ci = 0; ci < sizeof cols_list / sizeof *cols_list; ci++) {
                int nr = rows_list[ri], nt = tok_list[ti], cols = cols_list[ci];
                for (int i = 0; i < MAX_TOK * LDY; i++)
                    y[i] = -7.0f;
                gemm_bf16_avx512_rows(w, rb, nr, xb, xs, nt, cols, y, LDY, panel);
                for (int t = 0; t < nt; t++)
                    for (int r = 0; r < LDY; r++) {
                        float got = y[t * LDY + r];
                        if (r >= nr) {
                            CHECK_MSG(got == -7.0f, "rows %d: y[%d][%d] written", nr, t, r);
                            continue;
                        }
                        double sum = 0, mag = 0;
                        for (int k = 0; k < cols; k++) {
                            double p = (double)quant_bf16_to_f32(w[r * rb / 2 + k]) *
                                       quant_bf16_to_f32(xb[t * xs + k]);
                            sum += p;
                            mag += fabs(p);
                        }
                        CHECK_MSG(fabs(got - sum) <= 0x1p-16 * mag,
                                  "rows %d tok %d cols %d: y[%d][%d] = %.9g, reference %.9g",
                                  nr, nt, cols, t, r, got, sum);
                    }
            }
    free(w), free(xb), free(y), free(panel);
}

/* One row and one activation alone give the bits they give inside the largest call. */
static void test_same_bits_alone(void)
{
    if (!have_bf16())
        return;
    enum { ROWS = 48, TOK = 19, COLS = 530 };
    uint16_t *w = malloc(ROWS * COLS * 2), *xb = malloc(TOK * COLS * 2);
    float *y = malloc(TOK * ROWS * sizeof(float));
    void *panel = aligned_alloc(64, GEMM_BF16_PANEL_BYTES);
    unsigned s = 29;
    for (int i = 0; i < ROWS * COLS; i++)
        w[i] = quant_f32_to_bf16(frand(&s));
    for (int i = 0; i < TOK * COLS; i++)
        xb[i] = quant_f32_to_bf16(frand(&s) * 3.0f);
    gemm_bf16_avx512_rows(w, COLS * 2, ROWS, xb, COLS, TOK, COLS, y, ROWS, panel);
    for (int t = 0; t < TOK; t += 5)
        for (int r = 0; r < ROWS; r += 7) {
            float one;
            gemm_bf16_avx512_rows(w + r * COLS, COLS * 2, 1, xb + t * COLS, COLS, 1, COLS, &one,
                                  1, panel);
            CHECK_MSG(memcmp(&one, &y[t * ROWS + r], sizeof one) == 0,
                      "row %d tok %d: %.9g alone, %.9g in the batch", r, t, one, y[t * ROWS + r]);
        }
    free(w), free(xb), free(y), free(panel);
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
    ops_matrix m = {QTYPE_BF16, w, ROWS, COLS, COLS * 2};
    ops_matrix m2 = {QTYPE_BF16, w + ROWS * COLS, ROWS2, COLS, COLS * 2};
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
    RUN(test_ops_batches);
#endif
    return test_finish();
}
