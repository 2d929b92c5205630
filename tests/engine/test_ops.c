/* Row operations and the matrix product against straightforward double computations. */
#include <stdlib.h>
#include <string.h>

#include "engine/model/ops.h"
#include "engine/quant/quant.h"
#include "tests/support/test.h"

static float frand(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (float)((*s >> 8) & 0xFFFF) / 65536.0f * 2.0f - 1.0f;
}

static void test_rmsnorm_softmax_silu(void)
{
    float x[40], w[40], y[40];
    unsigned s = 1;
    double ss = 0;
    for (int i = 0; i < 40; i++) {
        x[i] = frand(&s);
        w[i] = 1 + frand(&s);
        ss += (double)x[i] * x[i];
    }
    ops_rmsnorm(y, x, w, 40, 1e-5f);
    for (int i = 0; i < 40; i++)
        CHECK_NEAR(y[i], x[i] / sqrt(ss / 40 + 1e-5) * w[i], 1e-5);

    float p[5] = {1, 2, -INFINITY, 0, 3};
    ops_softmax(p, 5);
    double z = exp(1) + exp(2) + exp(0) + exp(3);
    CHECK_NEAR(p[0], exp(1) / z, 1e-6);
    CHECK_EQ(p[2], 0);
    CHECK_NEAR(p[4], exp(3) / z, 1e-6);

    /* long rows take the vector path: compare with expf, masked entries exactly 0 */
    float row[37];
    double zz = 0;
    for (int i = 0; i < 37; i++) {
        row[i] = i % 5 == 0 ? -INFINITY : frand(&s) * 30;
        zz += i % 5 == 0 ? 0 : exp(row[i]);
    }
    float keep[37];
    memcpy(keep, row, sizeof row);
    ops_softmax(row, 37);
    double total = 0;
    for (int i = 0; i < 37; i++) {
        double want = i % 5 == 0 ? 0 : exp(keep[i]) / zz;
        CHECK_NEAR(row[i], want, 1e-5 * want + 1e-9);
        total += row[i];
    }
    CHECK_NEAR(total, 1, 1e-5);

    /* 19 values: the vector path and the scalar tail, large magnitudes both ways */
    float g[19], u[19], g0[19];
    for (int i = 0; i < 19; i++) {
        g[i] = g0[i] = (float)(i - 9) * (i % 2 ? 11.0f : 0.7f);
        u[i] = frand(&s);
    }
    ops_silu_mul(g, u, 19);
    for (int i = 0; i < 19; i++) {
        double want = g0[i] / (1 + exp(-(double)g0[i])) * u[i];
        CHECK_NEAR(g[i], want, 1e-5 * fabs(want) + 1e-7);
    }
}

/* gpt-oss's parts: the softmax with a sink (its share in the denominator only; -inf is
 * ops_softmax bit for bit, on both the vector path and the tail; a sink above every score
 * shifts by the sink), and the clamped SwiGLU against its formula over both clamps. */
static void test_sink_softmax_and_swiglu_oai(void)
{
    unsigned s = 7;
    float row[37], plain[37], keep[37];
    for (int i = 0; i < 37; i++)
        row[i] = plain[i] = keep[i] = i % 7 == 0 ? -INFINITY : frand(&s) * 20;
    ops_softmax(plain, 37);
    ops_softmax_sink(row, 37, -INFINITY);
    CHECK(memcmp(row, plain, sizeof row) == 0);
    const float sinks[] = {0.5f, 40.0f};
    for (int k = 0; k < 2; k++) {
        memcpy(row, keep, sizeof row);
        ops_softmax_sink(row, 37, sinks[k]);
        double mx = sinks[k], z = 0, total = 0;
        for (int i = 0; i < 37; i++)
            mx = keep[i] > mx ? keep[i] : mx;
        for (int i = 0; i < 37; i++)
            z += keep[i] == -INFINITY ? 0 : exp(keep[i] - mx);
        z += exp(sinks[k] - mx);
        for (int i = 0; i < 37; i++) {
            double want = keep[i] == -INFINITY ? 0 : exp(keep[i] - mx) / z;
            CHECK_MSG(fabs(row[i] - want) <= 1e-5 * want + 1e-12, "sink %g: %d %g %g",
                      (double)sinks[k], i, (double)row[i], want);
            total += row[i];
        }
        CHECK_NEAR(total, 1 - exp(sinks[k] - mx) / z, 1e-5);
    }
    float g[21], u[21];
    for (int i = 0; i < 21; i++) {
        g[i] = (float)(i - 10) * 1.1f; /* -11 .. 11: past the clamp at 7 */
        u[i] = (float)(10 - i) * 0.9f;
    }
    float g0[21];
    memcpy(g0, g, sizeof g);
    ops_swiglu_oai(g, u, 21);
    for (int i = 0; i < 21; i++) {
        double a = g0[i] < 7 ? g0[i] : 7, b = u[i] < -7 ? -7 : u[i] > 7 ? 7 : u[i];
        double want = a / (1 + exp(-1.702 * a)) * (b + 1);
        CHECK_NEAR(g[i], want, 1e-5 * fabs(want) + 1e-6);
    }
}

/* GELU against double erfc (1 + erf cancels for negative u) over [-12, 12]: 2.4e-7 at
 * most, about an f32 ulp at the largest error's |u| ~ 4 (the libm erff form is 4.5e-7
 * off). The odd length runs the scalar tail too. */
static void test_gelu_bias(void)
{
    enum { N = 24001 };
    float *x = malloc(sizeof(float) * N), *b = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) {
        b[i] = i % 3 ? 0.25f : -0.5f;
        x[i] = -12.0f + 24.0f * (float)i / N - b[i];
    }
    float u[N];
    for (int i = 0; i < N; i++)
        u[i] = x[i] + b[i];
    ops_gelu_bias(x, b, N);
    for (int i = 0; i < N; i++)
        CHECK_NEAR(x[i], 0.5 * u[i] * erfc(-u[i] / sqrt(2.0)), 3e-7);
    free(x), free(b);
}

/* LayerNorm of a sum with a large common offset (a post-norm residual stream's mean) and
 * a length with a scalar tail. */
/* Gemma's GeGLU (gelu's tanh form) and soft-cap against double tanh over wide ranges; the
 * odd lengths run the scalar tails too. Soft-capping keeps -inf (a masked score) at -cap
 * and large scores within the cap. */
static void test_gelu_tanh_and_softcap(void)
{
    enum { N = 24001 };
    float *g = malloc(sizeof(float) * N), *u = malloc(sizeof(float) * N), *x0 = malloc(sizeof(float) * N);
    unsigned s = 3;
    for (int i = 0; i < N; i++) {
        g[i] = x0[i] = -12.0f + 24.0f * (float)i / N;
        u[i] = frand(&s);
    }
    ops_gelu_tanh_mul(g, u, N);
    double worst = 0;
    for (int i = 0; i < N; i++) {
        double x = x0[i], want = 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))) * u[i];
        worst = fmax(worst, fabs(g[i] - want) / (fabs(x * u[i]) + 1e-30));
    }
    CHECK_MSG(worst < 1e-6, "gelu: %g relative to |x u|", worst);
    for (int i = 0; i < N; i++)
        x0[i] = g[i] = -300.0f + 600.0f * (float)i / N;
    g[5] = -INFINITY, g[6] = INFINITY;
    ops_softcap(g, N, 30.0f);
    worst = 0;
    for (int i = 0; i < N; i++)
        if (i != 5 && i != 6)
            worst = fmax(worst, fabs(g[i] - 30.0 * tanh(x0[i] / 30.0)));
    CHECK_MSG(worst < 30 * 1e-6, "softcap: %g", worst);
    CHECK(g[5] == -30.0f && g[6] == 30.0f);
    free(g), free(u), free(x0);
}

static void test_add_layernorm(void)
{
    enum { N = 389 };
    float x[N], a[N], c[N], w[N], b[N];
    unsigned s = 7;
    for (int i = 0; i < N; i++) {
        x[i] = 300 + frand(&s) * 40;
        a[i] = frand(&s);
        c[i] = frand(&s);
        w[i] = 1 + frand(&s);
        b[i] = frand(&s);
    }
    double v[N], mean = 0, var = 0;
    for (int i = 0; i < N; i++)
        mean += v[i] = (double)x[i] + a[i] + c[i];
    mean /= N;
    for (int i = 0; i < N; i++)
        var += (v[i] - mean) * (v[i] - mean);
    double inv = 1 / sqrt(var / N + 1e-12);
    ops_add_layernorm(x, a, c, w, b, N, 1e-12f);
    for (int i = 0; i < N; i++)
        CHECK_NEAR(x[i], (v[i] - mean) * inv * w[i] + b[i], 2e-5);
}

/* StableLM's pre-norm LayerNorm: x (shifted far from 0, as a residual stream drifts) is
 * left as it is, y is the double computation's. */
static void test_layernorm(void)
{
    enum { N = 300 };
    float x[N], y[N], w[N], b[N];
    double mean = 0, var = 0;
    for (int i = 0; i < N; i++) {
        x[i] = 40.0f + (float)sin(i * 0.7) * 3.0f;
        w[i] = 1.0f + 0.01f * (float)(i % 7);
        b[i] = 0.1f * (float)(i % 5) - 0.2f;
        mean += x[i];
    }
    mean /= N;
    for (int i = 0; i < N; i++)
        var += (x[i] - mean) * (x[i] - mean);
    double inv = 1 / sqrt(var / N + 1e-5);
    ops_layernorm(y, x, w, b, N, 1e-5f);
    for (int i = 0; i < N; i++) {
        CHECK_NEAR(x[i], 40.0f + (float)sin(i * 0.7) * 3.0f, 0);
        CHECK_NEAR(y[i], (x[i] - mean) * inv * w[i] + b[i], 2e-5);
    }
    ops_layernorm(x, x, w, b, N, 1e-5f); /* in place */
    CHECK(memcmp(x, y, sizeof x) == 0);
}

static void test_rope_styles(void)
{
    enum { HD = 8 };
    float cs[HD], a[2 * HD], b[2 * HD];
    ops_rope_angles(cs, 5, HD, 10000.0f, NULL, NULL);
    for (int i = 0; i < HD / 2; i++) {
        double th = 5 * pow(10000.0, -2.0 * i / HD);
        CHECK_NEAR(cs[2 * i], cos(th), 1e-7);
        CHECK_NEAR(cs[2 * i + 1], sin(th), 1e-7);
    }
    for (int i = 0; i < 2 * HD; i++)
        a[i] = b[i] = (float)(i + 1);
    ops_rope(a, 2, HD, HD, cs, OPS_ROPE_INTERLEAVED);
    ops_rope(b, 2, HD, HD, cs, OPS_ROPE_HALVES);
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < HD / 2; i++) {
            double c = cs[2 * i], s = cs[2 * i + 1];
            /* interleaved: pair (2i, 2i+1) */
            double x0 = h * HD + 2 * i + 1, x1 = x0 + 1;
            CHECK_NEAR(a[h * HD + 2 * i], x0 * c - x1 * s, 1e-4);
            CHECK_NEAR(a[h * HD + 2 * i + 1], x0 * s + x1 * c, 1e-4);
            /* halves: pair (i, i + HD/2) */
            x0 = h * HD + i + 1, x1 = x0 + HD / 2;
            CHECK_NEAR(b[h * HD + i], x0 * c - x1 * s, 1e-4);
            CHECK_NEAR(b[h * HD + i + HD / 2], x0 * s + x1 * c, 1e-4);
        }
    /* position 0 is the identity */
    ops_rope_angles(cs, 0, HD, 10000.0f, NULL, NULL);
    float c[HD] = {1, 2, 3, 4, 5, 6, 7, 8};
    ops_rope(c, 1, HD, HD, cs, OPS_ROPE_HALVES);
    CHECK(c[0] == 1 && c[7] == 8);
    /* partial rotary: the first 4 of 8 dimensions rotate as a head of 4 (halves: pairs
     * (0, 2), (1, 3)); the last 4 pass */
    float p[HD] = {1, 2, 3, 4, 5, 6, 7, 8}, w[4] = {1, 2, 3, 4};
    ops_rope_angles(cs, 3, 4, 10000.0f, NULL, NULL);
    ops_rope(p, 1, HD, 4, cs, OPS_ROPE_HALVES);
    ops_rope(w, 1, 4, 4, cs, OPS_ROPE_HALVES);
    CHECK(memcmp(p, w, sizeof w) == 0 && p[4] == 5 && p[5] == 6 && p[6] == 7 && p[7] == 8);
    CHECK(p[0] != 1);
}

static void test_attention_kernels(void)
{
    /* 12: not a multiple of 8, the portable path; 104 = 64 + 32 + 8: every slab width of
     * the SIMD accumulation; 13 rows: a block of 8 and a partial one */
    int dims[] = {64, 104, 12};
    for (int di = 0; di < 3; di++) {
        int d = dims[di], nq = 3, nk = 13;
        unsigned s = 9;
        float q[3 * 104], kf[16 * 104], vf[16 * 104], p[3 * 20], out[3 * 104];
        uint16_t k[16 * 104], v[16 * 104];
        for (int i = 0; i < nq * d; i++)
            q[i] = frand(&s);
        for (int i = 0; i < nk * d; i++) {
            k[i] = quant_f32_to_f16(frand(&s));
            v[i] = quant_f32_to_f16(frand(&s));
            kf[i] = quant_f16_to_f32(k[i]);
            vf[i] = quant_f16_to_f32(v[i]);
        }
        ops_attn_scores(q, nq, k, nk, d, 0.5f, p, 20);
        for (int g = 0; g < nq; g++)
            for (int i = 0; i < nk; i++) {
                double e = 0;
                for (int j = 0; j < d; j++)
                    e += (double)q[g * d + j] * kf[i * d + j];
                CHECK_NEAR(p[g * 20 + i], 0.5 * e, 1e-5);
            }
        /* a row's score does not depend on the rows computed with it (a chunk's rows as
         * it fills up, batched rows against solo ones) */
        float p_few[3 * 20];
        ops_attn_scores(q, nq, k + 5 * d, 6, d, 0.5f, p_few, 20);
        for (int g = 0; g < nq; g++)
            for (int i = 0; i < 6; i++)
                CHECK(p_few[g * 20 + i] == p[g * 20 + 5 + i]);
        for (int i = 0; i < nq * d; i++)
            out[i] = 1;
        ops_attn_accum(out, nq, p, 20, v, nk, d);
        for (int g = 0; g < nq; g++)
            for (int j = 0; j < d; j++) {
                double e = 1;
                for (int i = 0; i < nk; i++)
                    e += (double)p[g * 20 + i] * vf[i * d + j];
                CHECK_NEAR(out[g * d + j], e, 1e-4);
            }
        /* the f32 kernels on the same rows give the same results */
        float p32[3 * 20], out32[3 * 104];
        ops_attn_scores_f32(q, nq, kf, nk, d, 0.5f, p32, 20);
        for (int g = 0; g < nq; g++)
            for (int i = 0; i < nk; i++)
                CHECK(p32[g * 20 + i] == p[g * 20 + i]);
        for (int i = 0; i < nq * d; i++)
            out32[i] = 1;
        ops_attn_accum_f32(out32, nq, p, 20, vf, nk, d);
        for (int i = 0; i < nq * d; i++)
            CHECK_NEAR(out32[i], out[i], 1e-5);
    }
    uint16_t h[19];
    float f[19];
    for (int i = 0; i < 19; i++)
        f[i] = i * 0.37f - 3;
    ops_f32_to_f16(h, f, 19);
    for (int i = 0; i < 19; i++)
        CHECK_EQ(h[i], quant_f32_to_f16(f[i]));
}

/* y = x W^T for each type on both paths (dot kernels for few tokens, sgemm for many:
 * above 16 for float weights, above 64 for quantized ones unless they have a packed
 * kernel) and fused, against double products with the dequantized weights. */
static void test_matmul(void)
{
    const uint32_t types[] = {QTYPE_F32,  QTYPE_F16,  QTYPE_BF16, QTYPE_Q8_0, QTYPE_Q4_0,
                              QTYPE_Q4_1, QTYPE_Q5_0, QTYPE_Q5_1, QTYPE_Q2_K, QTYPE_Q3_K,
                              QTYPE_Q4_K, QTYPE_Q5_K, QTYPE_Q6_K, QTYPE_IQ4_NL, QTYPE_IQ4_XS,
                              QTYPE_IQ2_XXS, QTYPE_IQ2_XS, QTYPE_IQ2_S, QTYPE_IQ3_XXS,
                              QTYPE_IQ3_S, QTYPE_IQ1_S, QTYPE_IQ1_M};
    enum { ROWS = 300, COLS = 512, MAXT = 72 };
    char err[ERR_MAX];
    tp_pool *pool = tp_new(2, err);
    CHECK(pool);
    CHECK(ops_init(err) == 0);
    float *wf = malloc(ROWS * COLS * sizeof(float)), *deq = malloc(COLS * sizeof(float));
    float *x = malloc(MAXT * COLS * sizeof(float));
    float *y = malloc(MAXT * ROWS * sizeof(float)), *y2 = malloc(MAXT * 40 * sizeof(float));
    double *ref = malloc(MAXT * ROWS * sizeof(double));
    char *w = malloc(ROWS * quant_row_bytes(QTYPE_F32, COLS));
    void *scratch = aligned_alloc(64, ops_matmul_scratch_bytes(MAXT, COLS, 2));
    unsigned s = 5;
    for (int i = 0; i < ROWS * COLS; i++)
        wf[i] = frand(&s) * 0.05f;
    for (int i = 0; i < MAXT * COLS; i++)
        x[i] = frand(&s);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        uint32_t t = types[ti];
        size_t rb = quant_row_bytes(t, COLS);
        for (int r = 0; r < ROWS; r++)
            quant_quantize_row(t, wf + r * COLS, w + r * rb, COLS);
        for (int r = 0; r < ROWS; r++) {
            quant_dequantize_row(t, w + r * rb, deq, COLS);
            for (int n = 0; n < MAXT; n++) {
                double e = 0;
                for (int c = 0; c < COLS; c++)
                    e += (double)deq[c] * x[n * COLS + c];
                ref[n * ROWS + r] = e;
            }
        }
        ops_matrix m = {.type = t, .data = w, .rows = ROWS, .cols = COLS, .row_bytes = rb};
        /* the 8-bit activations of the dot kernels cost ~0.5% of a row's magnitude */
        double tol = t == QTYPE_F32 || t == QTYPE_F16 || t == QTYPE_BF16 ? 1e-4 : 0.03;
        /* AVX-512 BF16 rounds the activations to bf16: up to 2^-8 of the sum of |products|,
         * in its dot kernel and in its GEMM (BF16 above 16 rows, quantized weights without
         * a packed kernel above 64, rounded to bf16 too) alike */
        /* Q8_0 on AVX-512 VNNI: every row count through the packed dot kernel */
        bool packed = quant_packed_kernel(t);
        /* F16 too above 16 rows where LLMS_F16_AS_BF16 opts in */
        bool f16_rounds = t == QTYPE_F16 && quant_f16_prefill_as_bf16();
        bool bf16_rounds = quant_bf16_rounds_activation() && t != QTYPE_F32 &&
                           (t != QTYPE_F16 || f16_rounds) && !packed;
        if (t == QTYPE_BF16 && bf16_rounds)
            tol = 0.01;
        int ntoks[] = {1, 5, 40, 64, MAXT};
        for (int k = 0; k < 5; k++) {
            int nt = ntoks[k];
            bool sgemm = ((nt > 64 && !packed) || (nt > 16 && tol < 1e-3)) && !bf16_rounds;
            double tol_nt = f16_rounds && nt > 16 ? 0.01 : tol;
            ops_matmul(pool, &m, x, nt, y, scratch);
            for (int i = 0; i < nt * ROWS; i++)
                CHECK_MSG(fabs(y[i] - ref[i]) <= (sgemm ? 1e-4 : tol_nt),
                          "%s n=%d i=%d: %g vs %g", quant_traits_of(t)->name, nt, i, y[i], ref[i]);
        }
        /* fused: rows [0, 300) and a 40-row matrix made of rows [100, 140) */
        ops_matrix m2 = {.type = t, .data = w + 100 * rb, .rows = 40, .cols = COLS, .row_bytes = rb};
        const ops_matrix *ws[] = {&m, &m2};
        float *ys[] = {y, y2};
        for (int k = 0; k < 3; k++) {
            int nt = k == 2 ? MAXT : k ? 40 : 3;
            bool sgemm = ((nt > 64 && !packed) || (nt > 16 && tol < 1e-3)) && !bf16_rounds;
            ops_matmul_n(pool, 2, ws, x, nt, ys, scratch);
            for (int n = 0; n < nt; n++)
                for (int r = 0; r < 40; r++)
                    /* dot kernels give the same bits per row however rows are grouped;
                     * sgemm's edge kernels may sum in another order */
                    CHECK_NEAR(y2[n * 40 + r], y[n * ROWS + 100 + r], sgemm ? 1e-5 : 0);
        }
    }
    free(wf), free(deq), free(x), free(y), free(y2), free(ref), free(w), free(scratch);
    tp_free(pool);
}

/* A Q8_0 matrix repacked (where the CPU has the repacked kernel): every product, at any
 * token count, equals quant_dot_scalar of the row as stored with the token's prepared
 * activation bit for bit, the 12 rows past the last whole group of 16 (300 rows) apart,
 * which give the same bits at every token count; fused with a matrix as stored, that
 * one's results are unchanged. */
static void test_matmul_repacked(void)
{
    if (!quant_repack_kernel(QTYPE_Q8_0))
        SKIP("no repacked Q8_0 kernel on this CPU (AVX-512 VNNI, or LLMS_NO_SIMD / LLMS_NO_AVX512 set)");
    enum { ROWS = 300, COLS = 512, MAXT = 70, WHOLE = ROWS / QUANT_REPACK_ROWS * QUANT_REPACK_ROWS };
    char err[ERR_MAX];
    tp_pool *pool = tp_new(2, err);
    CHECK(pool);
    size_t rb = quant_row_bytes(QTYPE_Q8_0, COLS), ab = quant_row_bytes(QTYPE_Q8_0, COLS);
    float *wf = malloc(ROWS * COLS * sizeof(float)), *x = malloc(MAXT * COLS * sizeof(float));
    float *y = malloc(MAXT * ROWS * sizeof(float)), *y1 = malloc(ROWS * sizeof(float));
    float *yp = malloc(MAXT * ROWS * sizeof(float)), *yq = malloc(MAXT * ROWS * sizeof(float));
    char *w = malloc(ROWS * rb), *wr = malloc(ROWS * rb), *act = malloc(ab);
    void *scratch = aligned_alloc(64, ops_matmul_scratch_bytes(MAXT, COLS, 2));
    unsigned s = 9;
    for (int i = 0; i < ROWS * COLS; i++)
        wf[i] = frand(&s) * 0.05f;
    for (int i = 0; i < MAXT * COLS; i++)
        x[i] = frand(&s);
    for (int r = 0; r < ROWS; r++)
        quant_quantize_row(QTYPE_Q8_0, wf + r * COLS, w + r * rb, COLS);
    ops_matrix m = {.type = QTYPE_Q8_0, .data = w, .rows = ROWS, .cols = COLS, .row_bytes = rb},
               mr;
    ops_matrix_repack(&m, wr, &mr);
    CHECK(mr.repacked && mr.data == wr);
    CHECK(memcmp(wr + WHOLE * rb, w + WHOLE * rb, (ROWS - WHOLE) * rb) == 0);
    int ntoks[] = {1, 2, 3, 7, 16, 17, 40, MAXT};
    for (int k = 0; k < 8; k++) {
        int nt = ntoks[k];
        ops_matmul(pool, &mr, x, nt, y, scratch);
        for (int n = 0; n < nt; n++) {
            quant_prepare_activation(QTYPE_Q8_0, x + n * COLS, act, COLS);
            for (int r = 0; r < WHOLE; r++) {
                float ref = quant_dot_scalar(QTYPE_Q8_0, w + r * rb, act, COLS);
                CHECK_MSG(y[n * ROWS + r] == ref, "n_tok %d token %d row %d: %.9g vs %.9g", nt, n,
                          r, y[n * ROWS + r], ref);
            }
        }
        if (k == 0)
            memcpy(y1, y, ROWS * sizeof(float));
        for (int r = WHOLE; r < ROWS; r++)
            CHECK_MSG(y[r] == y1[r], "n_tok %d row %d: %.9g vs %.9g alone", nt, r, y[r], y1[r]);
    }
    /* fused with the matrix as stored: its results are what it gives alone */
    const ops_matrix *ws[] = {&mr, &m};
    float *ys[] = {y, yp};
    ops_matmul_n(pool, 2, ws, x, 5, ys, scratch);
    ops_matmul(pool, &m, x, 5, yq, scratch);
    CHECK(memcmp(yp, yq, 5 * ROWS * sizeof(float)) == 0);
    free(wf), free(x), free(y), free(y1), free(yp), free(yq), free(w), free(wr), free(act);
    free(scratch);
    tp_free(pool);
}

/* y += scale x W^T (a LoRA adapter's B product: rank-wide rows) for each adapter type, rank
 * widths down to 3 (F32), y strided, against double products with the dequantized weights;
 * up to 16 tokens a row's result has the same bits at every token count (per-row f32 dot
 * products), above that sgemm adds into y. */
static void test_matmul_add(void)
{
    const uint32_t types[] = {QTYPE_F32, QTYPE_F16, QTYPE_BF16, QTYPE_Q8_0};
    const int ranks[] = {3, 8, 32, 64};
    enum { ROWS = 300, LDY = 310, MAXT = 40, MAXR = 64 };
    char err[ERR_MAX];
    tp_pool *pool = tp_new(2, err);
    CHECK(pool);
    CHECK(ops_init(err) == 0);
    float *wf = malloc(ROWS * MAXR * sizeof(float)), *deq = malloc(MAXR * sizeof(float));
    float *x = malloc(MAXT * MAXR * sizeof(float)), *y0 = malloc(MAXT * LDY * sizeof(float));
    float *y = malloc(MAXT * LDY * sizeof(float)), *y1 = malloc(LDY * sizeof(float));
    double *ref = malloc(MAXT * ROWS * sizeof(double));
    char *w = malloc(ROWS * quant_row_bytes(QTYPE_F32, MAXR));
    void *scratch = aligned_alloc(64, ops_matmul_scratch_bytes(MAXT, MAXR, 2));
    unsigned s = 7;
    const float scale = 0.75f;
    for (int i = 0; i < ROWS * MAXR; i++)
        wf[i] = frand(&s) * 0.1f;
    for (int i = 0; i < MAXT * MAXR; i++)
        x[i] = frand(&s);
    for (int i = 0; i < MAXT * LDY; i++)
        y0[i] = frand(&s);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (size_t ri = 0; ri < sizeof ranks / sizeof ranks[0]; ri++) {
            uint32_t t = types[ti];
            int cols = ranks[ri];
            size_t rb = quant_row_bytes(t, cols);
            if (rb == 0) /* Q8_0 rows are blocks of 32 */
                continue;
            for (int r = 0; r < ROWS; r++) {
                quant_quantize_row(t, wf + r * MAXR, w + r * rb, cols);
                quant_dequantize_row(t, w + r * rb, deq, cols);
                for (int n = 0; n < MAXT; n++) {
                    double e = 0;
                    for (int c = 0; c < cols; c++)
                        e += (double)deq[c] * x[n * cols + c];
                    ref[n * ROWS + r] = y0[n * LDY + r] + scale * e;
                }
            }
            ops_matrix m = {.type = t, .data = w, .rows = ROWS, .cols = cols, .row_bytes = rb};
            int ntoks[] = {1, 5, 16, 17, MAXT};
            for (int k = 0; k < 5; k++) {
                int nt = ntoks[k];
                memcpy(y, y0, MAXT * LDY * sizeof(float));
                ops_matmul_add(pool, &m, x, nt, scale, y, LDY, scratch);
                for (int n = 0; n < MAXT; n++)
                    for (int r = 0; r < LDY; r++) {
                        size_t i = (size_t)n * LDY + r;
                        if (n >= nt || r >= ROWS)
                            CHECK_MSG(y[i] == y0[i], "%s rank %d n=%d: token %d col %d touched",
                                      quant_traits_of(t)->name, cols, nt, n, r);
                        else
                            CHECK_MSG(fabs(y[i] - ref[n * ROWS + r]) <= 1e-5,
                                      "%s rank %d n=%d token %d row %d: %g vs %g",
                                      quant_traits_of(t)->name, cols, nt, n, r, y[i],
                                      ref[n * ROWS + r]);
                    }
                if (k == 0)
                    memcpy(y1, y, LDY * sizeof(float));
                else if (nt <= 16)
                    CHECK_MSG(memcmp(y, y1, ROWS * sizeof(float)) == 0,
                              "%s rank %d: token 0 differs with %d tokens",
                              quant_traits_of(t)->name, cols, nt);
            }
        }
    free(wf), free(deq), free(x), free(y0), free(y), free(y1), free(ref), free(w), free(scratch);
    tp_free(pool);
}

int main(void)
{
    RUN(test_rmsnorm_softmax_silu);
    RUN(test_sink_softmax_and_swiglu_oai);
    RUN(test_gelu_bias);
    RUN(test_gelu_tanh_and_softcap);
    RUN(test_add_layernorm);
    RUN(test_layernorm);
    RUN(test_rope_styles);
    RUN(test_attention_kernels);
    RUN(test_matmul);
    RUN(test_matmul_repacked);
    RUN(test_matmul_add);
    return test_finish();
}
