/*
 * Tests of the quant module: f16/bf16 conversions, the exact GGUF block layouts (blocks
 * built byte by byte from the format description, so a layout mistake in the code cannot
 * hide behind the same mistake in the test), quantizer accuracy, and the dot-product and
 * dequantization kernels (scalar reference, AVX2 against scalar, rows against single dots).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "engine/quant/quant.h"
#include "tests/support/test.h"

/* ---- helpers ---- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rng_u32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}

static float rng_uniform(void) /* [0, 1) */
{
    return (float)(rng_u32() >> 8) * 0x1p-24f;
}

static float rng_gauss(void)
{
    float u = rng_uniform() + 0x1p-25f, v = rng_uniform();
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

static void fill_gauss(float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = rng_gauss();
}

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

/* IQ1_M keeps its f16 super-block scale in the top nibbles of its four scale words. */
static void put_iq1_m_d(uint8_t *block, uint16_t d)
{
    for (int i = 0; i < 4; i++)
        block[48 + 2 * i + 1] = (uint8_t)((block[48 + 2 * i + 1] & 0x0f) | ((d >> (4 * i)) & 0xf) << 4);
}

static uint32_t f32_bits(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    return x;
}

static float bits_f32(uint32_t x)
{
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

static const uint32_t dot_types[] = {
    QTYPE_F32,    QTYPE_F16,   QTYPE_BF16,    QTYPE_Q8_0,   QTYPE_Q4_0,  QTYPE_Q4_1,
    QTYPE_Q5_0,   QTYPE_Q5_1,  QTYPE_Q2_K,    QTYPE_Q3_K,   QTYPE_Q4_K,  QTYPE_Q5_K,
    QTYPE_Q6_K,   QTYPE_IQ4_NL, QTYPE_IQ4_XS, QTYPE_MXFP4,  QTYPE_IQ2_XXS, QTYPE_IQ2_XS,
    QTYPE_IQ2_S,  QTYPE_IQ3_XXS, QTYPE_IQ3_S, QTYPE_IQ1_S,  QTYPE_IQ1_M};
#define N_DOT_TYPES (sizeof dot_types / sizeof dot_types[0])

static bool have_avx2(void)
{
    return strcmp(quant_simd_name(), "avx2") == 0;
}

/* ---- f16 / bf16 ---- */

static void f16_special_values(void)
{
    CHECK(quant_f16_to_f32(0x0000) == 0.0f && !signbit(quant_f16_to_f32(0x0000)));
    CHECK(quant_f16_to_f32(0x8000) == 0.0f && signbit(quant_f16_to_f32(0x8000)));
    CHECK(quant_f16_to_f32(0x3c00) == 1.0f);
    CHECK(quant_f16_to_f32(0xc000) == -2.0f);
    CHECK(quant_f16_to_f32(0x0001) == 0x1p-24f);      /* smallest subnormal */
    CHECK(quant_f16_to_f32(0x03ff) == 1023 * 0x1p-24f); /* largest subnormal */
    CHECK(quant_f16_to_f32(0x0400) == 0x1p-14f);      /* smallest normal */
    CHECK(quant_f16_to_f32(0x7bff) == 65504.0f);
    CHECK(isinf(quant_f16_to_f32(0x7c00)) && quant_f16_to_f32(0x7c00) > 0);
    CHECK(isinf(quant_f16_to_f32(0xfc00)) && quant_f16_to_f32(0xfc00) < 0);
    CHECK(isnan(quant_f16_to_f32(0x7e00)));
    CHECK(isnan(quant_f16_to_f32(0x7c01))); /* signalling NaN stays a NaN */

    CHECK_EQ(quant_f32_to_f16(0.0f), 0x0000);
    CHECK_EQ(quant_f32_to_f16(-0.0f), 0x8000);
    CHECK_EQ(quant_f32_to_f16(1.0f), 0x3c00);
    CHECK_EQ(quant_f32_to_f16(65504.0f), 0x7bff);
    CHECK_EQ(quant_f32_to_f16(65519.0f), 0x7bff);
    CHECK_EQ(quant_f32_to_f16(65520.0f), 0x7c00); /* the tie goes to even: infinity */
    CHECK_EQ(quant_f32_to_f16(1e10f), 0x7c00);
    CHECK_EQ(quant_f32_to_f16(-INFINITY), 0xfc00);
    uint16_t nan = quant_f32_to_f16(NAN);
    CHECK((nan & 0x7c00) == 0x7c00 && (nan & 0x3ff) != 0);
    CHECK_EQ(quant_f32_to_f16(bits_f32(0x7f800001)) & 0x7e00, 0x7e00); /* tiny payload */
}

static void f16_rounds_to_nearest_even(void)
{
    CHECK_EQ(quant_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);     /* tie, even below */
    CHECK_EQ(quant_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02); /* tie, even above */
    CHECK_EQ(quant_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
    CHECK_EQ(quant_f32_to_f16(0x1p-25f), 0x0000);           /* tie with 0 */
    CHECK_EQ(quant_f32_to_f16(0x1p-25f * 1.0001f), 0x0001); /* just above the tie */
    CHECK_EQ(quant_f32_to_f16(3 * 0x1p-25f), 0x0002);       /* subnormal tie, even above */
    CHECK_EQ(quant_f32_to_f16(5 * 0x1p-25f), 0x0002);       /* subnormal tie, even below */
    CHECK_EQ(quant_f32_to_f16(0x1p-14f - 0x1p-26f), 0x0400); /* rounds up into normals */
    CHECK_EQ(quant_f32_to_f16(-1.5f * 0x1p-24f), 0x8002);

    /* Random finite values in the f16 range: no neighbour of the result is closer, and
     * on a tie the result is even. */
    for (int k = 0; k < 200000; k++) {
        float x = bits_f32((rng_u32() & 0x8fffffffu) | ((uint32_t)(96 + rng_u32() % 48) << 23));
        if (!(fabsf(x) < 65504.0f))
            continue;
        uint16_t h = quant_f32_to_f16(x);
        double e = fabs((double)quant_f16_to_f32(h) - x);
        uint16_t below = (h & 0x7fff) ? (uint16_t)(h - 1) : h, above = (uint16_t)(h + 1);
        double eb = fabs((double)quant_f16_to_f32(below) - x);
        double ea = fabs((double)quant_f16_to_f32(above) - x);
        CHECK_MSG(e <= eb && e <= ea, "x=%a -> %#x", (double)x, h);
        if (e == eb && below != h)
            CHECK_MSG((h & 1) == 0, "tie x=%a -> odd %#x", (double)x, h);
        if (e == ea)
            CHECK_MSG((h & 1) == 0, "tie x=%a -> odd %#x", (double)x, h);
    }
}

static void f16_round_trips_all_values(void)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = quant_f16_to_f32((uint16_t)h);
        uint16_t back = quant_f32_to_f16(f);
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) {
            CHECK_MSG(isnan(f) && (back & 0x7c00) == 0x7c00 && (back & 0x3ff) && (back & 0x8000) == (h & 0x8000),
                      "NaN %#x -> %#x", h, back);
            continue;
        }
        CHECK_MSG(back == h, "%#x -> %a -> %#x", h, (double)f, back);
    }
}

static void bf16_conversions(void)
{
    CHECK(quant_bf16_to_f32(0x3f80) == 1.0f);
    CHECK(quant_bf16_to_f32(0x0001) == 0x1p-133f); /* subnormal */
    CHECK(isinf(quant_bf16_to_f32(0xff80)));
    CHECK(isnan(quant_bf16_to_f32(0x7fc0)));
    CHECK_EQ(quant_f32_to_bf16(1.0f), 0x3f80);
    CHECK_EQ(quant_f32_to_bf16(-0.0f), 0x8000);
    CHECK_EQ(quant_f32_to_bf16(bits_f32(0x3f808000)), 0x3f80); /* tie, even below */
    CHECK_EQ(quant_f32_to_bf16(bits_f32(0x3f818000)), 0x3f82); /* tie, even above */
    CHECK_EQ(quant_f32_to_bf16(bits_f32(0x3f808001)), 0x3f81);
    CHECK_EQ(quant_f32_to_bf16(bits_f32(0x7f7fffff)), 0x7f80); /* max float rounds to inf */
    CHECK_EQ(quant_f32_to_bf16(bits_f32(0x00008000)), 0x0000); /* subnormal tie */
    CHECK(isnan(quant_bf16_to_f32(quant_f32_to_bf16(bits_f32(0x7f800001)))));
    for (uint32_t h = 0; h < 65536; h++) {
        float f = quant_bf16_to_f32((uint16_t)h);
        CHECK_EQ(f32_bits(f), h << 16);
        if (!isnan(f))
            CHECK_EQ(quant_f32_to_bf16(f), h);
    }
}

/* ---- hand-built blocks ---- */

static void q8_0_layout(void)
{
    uint8_t b[34];
    put16(b, 0x3800); /* d = 0.5 */
    for (int j = 0; j < 32; j++)
        b[2 + j] = (uint8_t)(int8_t)(j * 8 - 128);
    float y[32];
    quant_dequantize_row(QTYPE_Q8_0, b, y, 32);
    for (int j = 0; j < 32; j++)
        CHECK(y[j] == 0.5f * (float)(j * 8 - 128));
}

static void q4_0_layout(void)
{
    uint8_t b[18];
    put16(b, 0x4000); /* d = 2 */
    for (int j = 0; j < 16; j++)
        b[2 + j] = (uint8_t)((j * 7 + 3) & 0xFF);
    float y[32];
    quant_dequantize_row(QTYPE_Q4_0, b, y, 32);
    for (int j = 0; j < 16; j++) {
        CHECK(y[j] == 2.0f * (float)((b[2 + j] & 0xF) - 8));
        CHECK(y[j + 16] == 2.0f * (float)((b[2 + j] >> 4) - 8));
    }
}

/* x = d * q + m, q the nibbles as Q4_0's (element j < 16 low in qs[j], j + 16 high). */
static void q4_1_layout(void)
{
    uint8_t b[20];
    put16(b, 0x3400);     /* d = 0.25 */
    put16(b + 2, 0xbc00); /* m = -1 */
    for (int j = 0; j < 16; j++)
        b[4 + j] = (uint8_t)(j * 23 + 9);
    b[5] = 0xF0;
    float y[32];
    quant_dequantize_row(QTYPE_Q4_1, b, y, 32);
    for (int j = 0; j < 16; j++) {
        CHECK(y[j] == 0.25f * (float)(b[4 + j] & 0xF) - 1.0f);
        CHECK(y[j + 16] == 0.25f * (float)(b[4 + j] >> 4) - 1.0f);
    }
}

/* x = d * (q - 16), q a nibble as Q4_0's plus 16 times bit j of the little-endian
 * 32-bit qh for element j (0..31). */
static void q5_0_layout(void)
{
    uint8_t b[22];
    put16(b, 0x4000); /* d = 2 */
    const uint8_t qh[4] = {0xA5, 0x0F, 0xF0, 0x81};
    memcpy(b + 2, qh, 4);
    for (int j = 0; j < 16; j++)
        b[6 + j] = (uint8_t)(j * 37 + 1);
    float y[32];
    quant_dequantize_row(QTYPE_Q5_0, b, y, 32);
    for (int e = 0; e < 32; e++) {
        int nib = e < 16 ? b[6 + e] & 0xF : b[6 + e - 16] >> 4;
        int q = nib + 16 * ((qh[e / 8] >> (e % 8)) & 1);
        CHECK_MSG(y[e] == 2.0f * (float)(q - 16), "element %d: %g", e, (double)y[e]);
    }
}

/* x = d * q + m, q 5 bits as Q5_0's. */
static void q5_1_layout(void)
{
    uint8_t b[24];
    put16(b, 0x3800);     /* d = 0.5 */
    put16(b + 2, 0x4200); /* m = 3 */
    const uint8_t qh[4] = {0x3C, 0xFF, 0x00, 0x96};
    memcpy(b + 4, qh, 4);
    for (int j = 0; j < 16; j++)
        b[8 + j] = (uint8_t)(j * 59 + 4);
    float y[32];
    quant_dequantize_row(QTYPE_Q5_1, b, y, 32);
    for (int e = 0; e < 32; e++) {
        int nib = e < 16 ? b[8 + e] & 0xF : b[8 + e - 16] >> 4;
        int q = nib + 16 * ((qh[e / 8] >> (e % 8)) & 1);
        CHECK_MSG(y[e] == 0.5f * (float)q + 3.0f, "element %d: %g", e, (double)y[e]);
    }
}

/* The 16 values of IQ4_NL's and IQ4_XS's non-linear grid, indexed by a nibble. */
static const int iq4_grid[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                 1,    13,   25,  38,  53,  69,  89,  113};

/* x = d * grid[nibble], the nibbles as Q4_0's. */
static void iq4_nl_layout(void)
{
    uint8_t b[18];
    put16(b, 0xb400); /* d = -0.25 */
    for (int j = 0; j < 16; j++)
        b[2 + j] = (uint8_t)(j * 17 + 0x0F * (j & 1)); /* every nibble, both halves */
    float y[32];
    quant_dequantize_row(QTYPE_IQ4_NL, b, y, 32);
    for (int j = 0; j < 16; j++) {
        CHECK_MSG(y[j] == -0.25f * (float)iq4_grid[b[2 + j] & 0xF], "element %d: %g", j, (double)y[j]);
        CHECK_MSG(y[j + 16] == -0.25f * (float)iq4_grid[b[2 + j] >> 4], "element %d: %g", j + 16,
                  (double)y[j + 16]);
    }
}

/* Each IQ4_NL element is the grid point nearest its value for the scale as stored (the
 * lower one on a tie), checked against every point of the grid. */
static void iq4_nl_picks_the_nearest_grid_point(void)
{
    enum { N = 32 * 64 };
    float x[N];
    fill_gauss(x, N);
    for (int j = 0; j < N; j += 5)
        x[j] *= 8.0f; /* outliers put many values near the grid's inner midpoints */
    uint8_t b[18 * (N / 32)];
    quant_quantize_row(QTYPE_IQ4_NL, x, b, N);
    for (int blk = 0; blk < N / 32; blk++) {
        const uint8_t *q = b + 18 * blk;
        float d = quant_f16_to_f32((uint16_t)(q[0] | q[1] << 8));
        for (int j = 0; j < 32; j++) {
            int nib = j < 16 ? q[2 + j] & 0xF : q[2 + j - 16] >> 4, want = 0;
            float v = x[32 * blk + j];
            for (int k = 1; k < 16; k++)
                if (fabsf(v - d * (float)iq4_grid[k]) < fabsf(v - d * (float)iq4_grid[want]))
                    want = k;
            CHECK_MSG(nib == want || fabsf(v - d * (float)iq4_grid[nib]) ==
                                         fabsf(v - d * (float)iq4_grid[want]),
                      "block %d element %d: %g at d %g took %d, nearest %d", blk, j, (double)v,
                      (double)d, nib, want);
        }
    }
}

/* MXFP4 as the OCP MX spec and ggml lay it out: byte 0 the E8M0 exponent e (scale
 * 2^(e - 127)), then 16 bytes of E2M1 codes, element j < 16 the low nibble of byte 1 + j
 * and j + 16 its high nibble; a code's bit 3 is its sign, bits 0-2 index the magnitudes
 * {0, 0.5, 1, 1.5, 2, 3, 4, 6}. Written from the spec's table, not the kernels' grid. */
static void mxfp4_layout(void)
{
    static const float e2m1[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    static const uint8_t exps[] = {127, 130, 120, 1, 0, 200};
    for (size_t c = 0; c < sizeof exps; c++) {
        uint8_t b[17];
        b[0] = exps[c];
        for (int j = 0; j < 16; j++)
            b[1 + j] = (uint8_t)(j | (15 - j) << 4); /* every code, in both halves */
        float y[32], ys[32];
        quant_dequantize_row(QTYPE_MXFP4, b, y, 32);
        quant_dequantize_row_scalar(QTYPE_MXFP4, b, ys, 32);
        double scale = ldexp(1.0, exps[c] - 127);
        for (int e = 0; e < 32; e++) {
            int code = e < 16 ? b[1 + e] & 0xF : b[1 + e - 16] >> 4;
            double want = (code & 8 ? -1 : 1) * e2m1[code & 7] * scale;
            CHECK_MSG((double)y[e] == want && y[e] == ys[e], "e %d element %d: %g, want %g",
                      exps[c], e, (double)y[e], want);
        }
    }
    /* the quantizer: exponent floor(log2(absmax)) - 2 (absmax 5 -> 2^0, so 5 takes the
     * nearer of 4 and 6 on a tie: the lower code, 4), values past 6 times the scale
     * saturate, halfway cases go to the lower code, zeros to +0 */
    float x[32] = {5.0f, -5.0f, 0.25f, 0.75f, -1.25f, 2.5f, 3.4f, 0.0f, -0.0f, 0.1f};
    for (int j = 10; j < 32; j++)
        x[j] = (float)(j % 5) * 0.5f - 1.0f;
    uint8_t q[17];
    quant_quantize_row(QTYPE_MXFP4, x, q, 32);
    CHECK_EQ(q[0], 127);
    float y[32];
    quant_dequantize_row(QTYPE_MXFP4, q, y, 32);
    const float want[10] = {4.0f, -4.0f, 0.0f, 0.5f, -1.0f, 2.0f, 3.0f, 0.0f, 0.0f, 0.0f};
    for (int j = 0; j < 10; j++)
        CHECK_MSG(y[j] == want[j] && !signbit(y[j]) == !signbit(want[j]), "x %g -> %g, want %g",
                  (double)x[j], (double)y[j], (double)want[j]);
    for (int j = 10; j < 32; j++)
        CHECK_MSG(y[j] == x[j], "x %g -> %g", (double)x[j], (double)y[j]);
    x[0] = 100.0f; /* 2^6: exponent 4, scale 16: 100 -> 96 (6 * 16), -5 -> -8 */
    quant_quantize_row(QTYPE_MXFP4, x, q, 32);
    quant_dequantize_row(QTYPE_MXFP4, q, y, 32);
    CHECK_EQ(q[0], 131);
    CHECK(y[0] == 96.0f && y[1] == -8.0f);
}

/* 8 sub-blocks of 32: x = d * (ls - 32) * grid[nibble], ls 6 bits: the low 4 of
 * sub-block k in scales_l[k / 2] (the high nibble for odd k), the top 2 at bits 2 k of
 * the little-endian scales_h; sub-block k's nibbles in qs[16 k ..] as Q4_0's. */
static void iq4_xs_layout(void)
{
    uint8_t b[136];
    put16(b, 0x3400);     /* d = 0.25 */
    put16(b + 2, 0xC71B); /* scales_h */
    const uint8_t sl[4] = {0x0F, 0xF0, 0x5A, 0x00};
    memcpy(b + 4, sl, 4);
    for (int k = 0; k < 128; k++)
        b[8 + k] = (uint8_t)(k * 73 + 5);
    float y[256];
    quant_dequantize_row(QTYPE_IQ4_XS, b, y, 256);
    for (int e = 0; e < 256; e++) {
        int k = e / 32, j = e % 32;
        int ls = ((sl[k / 2] >> (4 * (k % 2))) & 0xF) | (((0xC71B >> (2 * k)) & 3) << 4);
        int nib = j < 16 ? b[8 + 16 * k + j] & 0xF : b[8 + 16 * k + j - 16] >> 4;
        float want = 0.25f * (float)((ls - 32) * iq4_grid[nib]);
        CHECK_MSG(y[e] == want, "element %d: %g, want %g", e, (double)y[e], (double)want);
    }
}

/* Packed 6-bit scales and mins with every bit position in use, and what they decode to. */
static const uint8_t k_scales[12] = {0x41, 0x82, 0xC3, 0x04, 0x45, 0x86,
                                     0xC7, 0x08, 0x21, 0x43, 0x65, 0x87};
static const int k_sc[8] = {1, 2, 3, 4, 17, 35, 53, 7};
static const int k_m[8] = {5, 6, 7, 8, 18, 36, 54, 8};

static void q4_k_layout(void)
{
    uint8_t b[144];
    put16(b, 0x3c00);     /* d = 1 */
    put16(b + 2, 0x3800); /* dmin = 0.5 */
    memcpy(b + 4, k_scales, 12);
    const uint8_t *qs = b + 16;
    for (int k = 0; k < 128; k++)
        b[16 + k] = (uint8_t)(k * 7 + 3);
    float y[256];
    quant_dequantize_row(QTYPE_Q4_K, b, y, 256);
    for (int e = 0; e < 256; e++) {
        int g = e / 64, hi = (e % 64) >= 32, l = e % 32, sub = 2 * g + hi;
        int nib = hi ? qs[32 * g + l] >> 4 : qs[32 * g + l] & 0xF;
        CHECK_MSG(y[e] == (float)(k_sc[sub] * nib) - 0.5f * (float)k_m[sub], "element %d: %g", e,
                  (double)y[e]);
    }
}

static void q5_k_layout(void)
{
    uint8_t b[176];
    put16(b, 0x3400);     /* d = 0.25 */
    put16(b + 2, 0x3c00); /* dmin = 1 */
    memcpy(b + 4, k_scales, 12);
    const uint8_t *qh = b + 16, *qs = b + 48;
    for (int l = 0; l < 32; l++)
        b[16 + l] = (uint8_t)(l * 37 + 11);
    for (int k = 0; k < 128; k++)
        b[48 + k] = (uint8_t)(k * 13 + 5);
    float y[256];
    quant_dequantize_row(QTYPE_Q5_K, b, y, 256);
    for (int e = 0; e < 256; e++) {
        int g = e / 64, hi = (e % 64) >= 32, l = e % 32, sub = 2 * g + hi;
        int nib = hi ? qs[32 * g + l] >> 4 : qs[32 * g + l] & 0xF;
        int v = nib + 16 * ((qh[l] >> (2 * g + hi)) & 1);
        CHECK_MSG(y[e] == 0.25f * (float)(k_sc[sub] * v) - (float)k_m[sub], "element %d: %g", e,
                  (double)y[e]);
    }
}

static void q6_k_layout(void)
{
    static const int8_t sc[16] = {-3, 5, 7, -128, 127, 1, 2, -1, 9, -9, 11, 0, 33, -64, 100, 4};
    uint8_t b[210];
    const uint8_t *ql = b, *qh = b + 128;
    for (int k = 0; k < 128; k++)
        b[k] = (uint8_t)(k * 13 + 5);
    for (int k = 0; k < 64; k++)
        b[128 + k] = (uint8_t)(k * 29 + 1);
    memcpy(b + 192, sc, 16);
    put16(b + 208, 0x3400); /* d = 0.25, at the end of the block */
    float y[256];
    quant_dequantize_row(QTYPE_Q6_K, b, y, 256);
    for (int e = 0; e < 256; e++) {
        int h = e / 128, r = e % 128, quarter = r / 32, l = r % 32;
        int lo = quarter & 1 ? ql[64 * h + l + 32] : ql[64 * h + l];
        int nib = quarter >= 2 ? lo >> 4 : lo & 0xF;
        int q = nib | (((qh[32 * h + l] >> (2 * quarter)) & 3) << 4);
        float want = 0.25f * (float)sc[8 * h + l / 16 + 2 * quarter] * (float)(q - 32);
        CHECK_MSG(y[e] == want, "element %d: %g, want %g", e, (double)y[e], (double)want);
    }
}

/* 16 sub-blocks of 16: x = d * (sc - 32) * q, q = the 2 low bits in qs (element
 * 128 h + 32 j + l at bits 2 j of qs[32 h + l]) plus 4 when bit 4 h + j of hmask[l] is
 * set, less 4; sc 6 bits, the low 4 of sub-block k in byte k % 8 (the high nibble from
 * k = 8 on), the top 2 in byte 8 + k % 4 (bits 2 (k / 4)). */
static void q3_k_layout(void)
{
    uint8_t b[110];
    const uint8_t *hm = b, *qs = b + 32, *s = b + 96;
    for (int k = 0; k < 96; k++)
        b[k] = (uint8_t)(k * 29 + 7);
    static const uint8_t sc[12] = {0x10, 0x2f, 0xf3, 0x84, 0x0c, 0xfb, 0xe6, 0x59,
                                   0x18, 0xe4, 0x36, 0xc9};
    memcpy(b + 96, sc, 12);
    put16(b + 108, 0x3400); /* d = 0.25, at the end of the block */
    float y[256];
    quant_dequantize_row(QTYPE_Q3_K, b, y, 256);
    int seen_lo = 0, seen_hi = 0;
    for (int e = 0; e < 256; e++) {
        int h = e / 128, j = e % 128 / 32, l = e % 32, k = e / 16;
        int q = ((qs[32 * h + l] >> (2 * j)) & 3) + 4 * ((hm[l] >> (4 * h + j)) & 1) - 4;
        int scale = ((s[k % 8] >> (4 * (k / 8))) & 0xF) | (((s[8 + k % 4] >> (2 * (k / 4))) & 3) << 4);
        seen_lo |= scale == 0, seen_hi |= scale == 63;
        float want = 0.25f * (float)((scale - 32) * q);
        CHECK_MSG(y[e] == want, "element %d: %g, want %g", e, (double)y[e], (double)want);
    }
    CHECK(seen_lo && seen_hi); /* the scale bytes reach both ends of the 6-bit range */
}

/* 16 sub-blocks of 16: x = d * sc * q - dmin * m, sc and m the low and high nibbles of
 * scales[k], q 2 bits (element 128 h + 32 j + l at bits 2 j of qs[32 h + l]); d and dmin
 * after the quants. */
static void q2_k_layout(void)
{
    uint8_t b[84];
    const uint8_t *sc = b, *qs = b + 16;
    for (int k = 0; k < 80; k++)
        b[k] = (uint8_t)(k * 53 + 17);
    b[3] = 0xF0, b[9] = 0x0F; /* nibbles at both ends */
    put16(b + 80, 0x3400); /* d = 0.25 */
    put16(b + 82, 0x3800); /* dmin = 0.5 */
    float y[256];
    quant_dequantize_row(QTYPE_Q2_K, b, y, 256);
    for (int e = 0; e < 256; e++) {
        int h = e / 128, j = e % 128 / 32, l = e % 32, k = e / 16;
        int q = (qs[32 * h + l] >> (2 * j)) & 3;
        float want = 0.25f * (float)((sc[k] & 0xF) * q) - 0.5f * (float)(sc[k] >> 4);
        CHECK_MSG(y[e] == want, "element %d: %g, want %g", e, (double)y[e], (double)want);
    }
}

static void float_rows_layout(void)
{
    uint8_t b[8];
    put16(b, 0x3c00);
    put16(b + 2, 0xc200); /* -3 */
    put16(b + 4, 0x0001);
    put16(b + 6, 0x7bff);
    float y[4];
    quant_dequantize_row(QTYPE_F16, b, y, 4);
    CHECK(y[0] == 1.0f && y[1] == -3.0f && y[2] == 0x1p-24f && y[3] == 65504.0f);
    put16(b, 0x3f80);
    put16(b + 2, 0xc040); /* -3 */
    put16(b + 4, 0x4049); /* 3.140625 */
    put16(b + 6, 0x0000);
    quant_dequantize_row(QTYPE_BF16, b, y, 4);
    CHECK(y[0] == 1.0f && y[1] == -3.0f && y[2] == 3.140625f && y[3] == 0.0f);
}

/* ---- quantizers ---- */

/* Root-mean-square error of quantize -> dequantize on N(0, 1) data, relative to the
 * data's RMS. Bounds are about 1.3x what these quantizers reach (F16 2.1e-4, BF16 1.7e-3,
 * Q8_0 0.0053, Q8_K 0.0069, Q4_0 0.086, Q4_K 0.071, Q5_K 0.036, Q6_K 0.017, Q3_K 0.144,
 * Q2_K 0.271, Q4_1 0.071, Q5_0 0.040, Q5_1 0.034, IQ4_NL 0.074, IQ4_XS 0.075, MXFP4 0.115
 * (llama.cpp's own rule, which MXFP4 follows), IQ2_XXS 0.335, IQ2_XS 0.290, IQ2_S 0.243,
 * IQ3_XXS 0.177, IQ3_S 0.130, IQ1_S 0.454, IQ1_M 0.419 (those 1.1x); llama.cpp's
 * reference quantizer reaches Q3_K 0.151, Q2_K 0.296, Q4_1 0.078, Q5_0 0.043, Q5_1 0.038,
 * IQ4_NL 0.076 and IQ4_XS 0.077 on such rows, and with unit importance weights IQ2_XXS
 * 0.345, IQ2_XS 0.300, IQ2_S 0.248, IQ3_XXS 0.181, IQ3_S 0.137, IQ1_S 0.485, IQ1_M 0.452). */
static void quantize_error_is_bounded(void)
{
    static const struct {
        uint32_t t;
        double max_rel_rms;
    } cases[] = {
        {QTYPE_F32, 0},     {QTYPE_F16, 3e-4},  {QTYPE_BF16, 2.2e-3}, {QTYPE_Q8_0, 0.007},
        {QTYPE_Q8_K, 0.009}, {QTYPE_Q4_0, 0.11}, {QTYPE_Q4_K, 0.095},  {QTYPE_Q5_K, 0.047},
        {QTYPE_Q6_K, 0.023}, {QTYPE_Q3_K, 0.19}, {QTYPE_Q2_K, 0.35}, {QTYPE_Q4_1, 0.092},
        {QTYPE_Q5_0, 0.053}, {QTYPE_Q5_1, 0.045}, {QTYPE_IQ4_NL, 0.096}, {QTYPE_IQ4_XS, 0.097},
        {QTYPE_MXFP4, 0.15}, {QTYPE_IQ2_XXS, 0.37}, {QTYPE_IQ2_XS, 0.32}, {QTYPE_IQ2_S, 0.27},
        {QTYPE_IQ3_XXS, 0.195}, {QTYPE_IQ3_S, 0.145}, {QTYPE_IQ1_S, 0.5}, {QTYPE_IQ1_M, 0.46},
    };
    enum { N = 8192 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    void *q = malloc(quant_row_bytes(QTYPE_F32, N));
    CHECK(x && y && q);
    fill_gauss(x, N);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        quant_quantize_row(cases[c].t, x, q, N);
        quant_dequantize_row(cases[c].t, q, y, N);
        double se = 0, sx = 0;
        for (int i = 0; i < N; i++) {
            se += (double)(y[i] - x[i]) * (y[i] - x[i]);
            sx += (double)x[i] * x[i];
        }
        double rel = sqrt(se / sx);
        CHECK_MSG(rel <= cases[c].max_rel_rms, "%s: relative RMS error %.5f > %.5f",
                  quant_traits_of(cases[c].t)->name, rel, cases[c].max_rel_rms);
    }
    free(x);
    free(y);
    free(q);
}

/* A zero row of type t stays zero (no NaN from a zero scale) and a row of -0.75 comes
 * back within tol. */
static void zero_and_constant_rows(uint32_t t, float tol)
{
    const char *name = quant_traits_of(t)->name;
    float x[256], y[256];
    uint8_t q[512];
    memset(x, 0, sizeof x);
    quant_quantize_row(t, x, q, 256);
    quant_dequantize_row(t, q, y, 256);
    for (int i = 0; i < 256; i++)
        CHECK_MSG(y[i] == 0.0f, "%s zero row: y[%d] = %g", name, i, (double)y[i]);
    for (int i = 0; i < 256; i++)
        x[i] = -0.75f;
    quant_quantize_row(t, x, q, 256);
    quant_dequantize_row(t, q, y, 256);
    for (int i = 0; i < 256; i++)
        CHECK_MSG(fabsf(y[i] + 0.75f) <= tol, "%s constant row: y[%d] = %g", name, i,
                  (double)y[i]);
}

/*
 * The i-quants' codebooks are the format's (ggml's tables): a block whose first group is
 * entry k, under scale 1, every scale field 0 and no signs, dequantizes to entry k's
 * values times the type's smallest step (IQ1: plus the 1/8 shift); every entry of every
 * codebook, read back in order, hashes (FNV-1a 64 of the entries' bytes, little-endian, as
 * ggml's tables hold them) to the hash of ggml's table, computed from ggml-common.h.
 */
static void iq_codebooks_are_ggml_tables(void)
{
    static const struct {
        uint32_t t;
        int entries, dim;
        float step;
        uint64_t fnv;
    } books[] = {
        {QTYPE_IQ2_XXS, 256, 8, 0.125f, 0xbb4ee025b5ac6e8eull},
        {QTYPE_IQ2_XS, 512, 8, 0.125f, 0xc9b1ee61e79909bdull},
        {QTYPE_IQ2_S, 1024, 8, 0.125f, 0x123edd38a3b62b90ull},
        {QTYPE_IQ3_XXS, 256, 4, 0.25f, 0xdfa5dc83d6a155d5ull},
        {QTYPE_IQ3_S, 512, 4, 1.0f, 0xfa37020c25b44829ull},
        {QTYPE_IQ1_S, 2048, 8, 1.0f, 0x6703ed863501ae2eull},
        {QTYPE_IQ1_M, 2048, 8, 1.0f, 0x6703ed863501ae2eull},
    };
    for (size_t c = 0; c < sizeof books / sizeof books[0]; c++) {
        uint32_t t = books[c].t;
        size_t bytes = quant_traits_of(t)->block_bytes;
        uint64_t h = 0xcbf29ce484222325ull;
        bool exact = true;
        for (int k = 0; k < books[c].entries; k++) {
            uint8_t b[128] = {0};
            float y[256];
            switch (t) {
            case QTYPE_IQ2_XXS:
            case QTYPE_IQ3_XXS:
                b[2] = (uint8_t)k;
                break;
            case QTYPE_IQ2_XS:
                put16(b + 2, (uint16_t)k);
                break;
            case QTYPE_IQ2_S:
            case QTYPE_IQ3_S: /* qh after the 32 + 32 or 64 bytes of qs and signs */
                b[2] = (uint8_t)k;
                b[66] = (uint8_t)(k >> 8);
                break;
            case QTYPE_IQ1_S:
                b[2] = (uint8_t)k;
                b[34] = (uint8_t)(k >> 8);
                break;
            default: /* IQ1_M */
                b[0] = (uint8_t)k;
                b[32] = (uint8_t)(k >> 8);
                break;
            }
            if (t == QTYPE_IQ1_M)
                put_iq1_m_d(b, 0x3c00);
            else
                put16(b, 0x3c00);
            quant_dequantize_row(t, b, y, 256);
            for (int j = 0; j < books[c].dim; j++) {
                float v = y[j] / books[c].step - (t == QTYPE_IQ1_S || t == QTYPE_IQ1_M ? 0.125f : 0);
                exact = exact && v == rintf(v);
                h = (h ^ (uint8_t)(int)rintf(v)) * 0x100000001b3ull;
            }
            (void)bytes;
        }
        CHECK_MSG(exact, "%s: an entry is not whole steps", quant_traits_of(t)->name);
        CHECK_MSG(h == books[c].fnv, "%s: codebook hash %#llx", quant_traits_of(t)->name,
                  (unsigned long long)h);
    }
}

/* The i-quants' sign bits and scale fields, read from hand-made IQ2_XXS and IQ3_S blocks:
 * a 7-bit pattern's eighth sign is its parity, a scale field s is (2 s + 1) steps. */
static void iq_signs_and_scales(void)
{
    uint8_t b[110] = {0};
    float y[256];
    put16(b, 0x3c00);
    b[2] = 1; /* group 0: entry 1, (43 8 8 8 8 8 8 8) */
    uint32_t aux = 1u | 7u << 28; /* group 0: the first sign, so the eighth too; scale 7 */
    memcpy(b + 6, &aux, 4);
    quant_dequantize_row(QTYPE_IQ2_XXS, b, y, 256);
    CHECK(y[0] == -43 * 7.5f * 0.25f && y[1] == 8 * 7.5f * 0.25f && y[7] == -8 * 7.5f * 0.25f);
    CHECK(y[8] == 8 * 7.5f * 0.25f); /* group 1: entry 0, no signs */
    memset(b, 0, sizeof b);
    put16(b, 0x3c00);
    b[2] = 1;             /* group 0's first half: entry 1 of IQ3_S, (3 1 1 1) */
    b[74] = 0x81;         /* its signs: values 0 and 7 negative, no parity */
    b[106] = 0x3 | 0x50;  /* scales: sub-block 0 is 3, sub-block 1 is 5 */
    quant_dequantize_row(QTYPE_IQ3_S, b, y, 256);
    CHECK(y[0] == -3 * 7.0f && y[1] == 7.0f && y[7] == -7.0f && y[32] == 11.0f);
}

/* The i-quants' SIMD dot products are the scalar kernel's bits (the same integers per
 * super-block, combined by one function), on blocks of random bytes (every entry, sign
 * and scale field) and full-scale activations. */
static void iq_simd_dot_is_scalar_bits(void)
{
    if (!have_avx2())
        SKIP("AVX2 kernels not in use (CPU lacks AVX2/FMA/F16C or LLMS_NO_SIMD is set)");
    static const uint32_t types[] = {QTYPE_IQ2_XXS, QTYPE_IQ2_XS, QTYPE_IQ2_S, QTYPE_IQ3_XXS,
                                     QTYPE_IQ3_S,   QTYPE_IQ1_S,  QTYPE_IQ1_M};
    enum { N = 2048 };
    uint8_t w[N / 256 * 110], act[N / 256 * 292];
    float x[N];
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        uint32_t t = types[k];
        size_t bb = quant_traits_of(t)->block_bytes;
        for (int trial = 0; trial < 20; trial++) {
            for (size_t i = 0; i < sizeof w; i++)
                w[i] = (uint8_t)rng_u32();
            for (int b = 0; b < N / 256; b++) {
                if (t == QTYPE_IQ1_M)
                    put_iq1_m_d(w + b * bb, 0x2400);
                else
                    put16(w + b * bb, 0x2400);
            }
            for (int i = 0; i < N; i++)
                x[i] = trial & 1 ? (i % 3 ? 1.0f : -1.0f) : rng_gauss();
            quant_prepare_activation(QTYPE_Q8_K, x, act, N);
            float got = quant_dot(t, w, act, N), ref = quant_dot_scalar(t, w, act, N);
            CHECK_MSG(memcmp(&got, &ref, sizeof got) == 0, "%s trial %d: simd %g scalar %g",
                      quant_traits_of(t)->name, trial, (double)got, (double)ref);
        }
    }
}

/* The i-quants' degenerate rows: zeros stay zeros (no NaN from a zero scale), a
 * constant row comes back within 2%, and a single spike stays the row's largest value
 * with its sign and at least 40% of its size (IQ2/IQ3 codebooks have no zero, so the
 * zeros beside it cost as much as it does: IQ2_XXS keeps 2.41 of 5, IQ3_S 4.40). */
static void iq_quantize_degenerate_blocks(void)
{
    static const uint32_t types[] = {QTYPE_IQ2_XXS, QTYPE_IQ2_XS, QTYPE_IQ2_S, QTYPE_IQ3_XXS,
                                     QTYPE_IQ3_S,   QTYPE_IQ1_S,  QTYPE_IQ1_M};
    float x[256], y[256];
    uint8_t q[128];
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        uint32_t t = types[k];
        const char *name = quant_traits_of(t)->name;
        zero_and_constant_rows(t, 0.015f);
        memset(x, 0, sizeof x);
        x[100] = -5.0f;
        quant_quantize_row(t, x, q, 256);
        quant_dequantize_row(t, q, y, 256);
        for (int i = 0; i < 256; i++)
            CHECK_MSG(i == 100 || fabsf(y[i]) < fabsf(y[100]), "%s spike: y[%d] = %g, spike %g",
                      name, i, (double)y[i], (double)y[100]);
        CHECK_MSG(y[100] < -2.0f, "%s spike: %g", name, (double)y[100]);
    }
}

/* Zero rows stay zero (no NaN from a zero scale); a block of one repeated negative value
 * and a block with a single spike come back close. */
static void quantize_degenerate_blocks(void)
{
    static const uint32_t types[] = {QTYPE_Q8_0, QTYPE_Q4_0, QTYPE_Q4_1, QTYPE_Q5_0,
                                     QTYPE_Q5_1, QTYPE_Q2_K, QTYPE_Q3_K, QTYPE_Q4_K,
                                     QTYPE_Q5_K, QTYPE_Q6_K, QTYPE_IQ4_NL, QTYPE_IQ4_XS,
                                     QTYPE_MXFP4, QTYPE_Q8_K};
    float x[256], y[256];
    uint8_t q[512];
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        uint32_t t = types[k];
        const char *name = quant_traits_of(t)->name;
        zero_and_constant_rows(t, 0.01f);
        memset(x, 0, sizeof x);
        x[100] = 5.0f;
        quant_quantize_row(t, x, q, 256);
        quant_dequantize_row(t, q, y, 256);
        /* MXFP4's grid has no 5: it lies halfway between E2M1's 4 and 6 at scale 1 */
        float spike_tol = t == QTYPE_MXFP4 ? 1.0f : 0.05f;
        CHECK_MSG(fabsf(y[100] - 5.0f) <= spike_tol, "%s spike: %g", name, (double)y[100]);
        CHECK_MSG(fabsf(y[101]) <= 0.05f, "%s next to spike: %g", name, (double)y[101]);
    }
}

static void q8_k_activation_layout(void)
{
    float x[512];
    fill_gauss(x, 512);
    uint8_t q[2 * 292];
    quant_prepare_activation(QTYPE_Q8_K, x, q, 512);
    for (int blk = 0; blk < 2; blk++) {
        const uint8_t *b = q + 292 * blk;
        float d;
        memcpy(&d, b, sizeof d);
        CHECK(d > 0);
        for (int j = 0; j < 16; j++) {
            int s = 0;
            for (int l = 0; l < 16; l++) {
                int v = (int8_t)b[4 + 16 * j + l];
                CHECK(v >= -127 && v <= 127);
                CHECK_NEAR(d * (float)v, x[256 * blk + 16 * j + l], 0.5f * d + 1e-6f);
                s += v;
            }
            int16_t bsum;
            memcpy(&bsum, b + 260 + 2 * j, sizeof bsum);
            CHECK_EQ(bsum, s);
        }
    }
}

/* Activations are quantized exactly like quant_quantize_row does it (whichever kernel
 * runs), including ties (x / d = k + 0.5 rounds to even) and a zero block. */
static void prepare_activation_matches_reference(void)
{
    enum { N = 2048 };
    float *x = malloc(N * sizeof *x);
    uint8_t *a = malloc(N * 4), *b = malloc(N * 4);
    CHECK(x && a && b);
    fill_gauss(x, N);
    for (int i = 0; i < 256; i++) /* first block: max 127, so d = 1 and halves are ties */
        x[i] = i == 0 ? 127.0f : (float)(i % 64) - 31.5f;
    for (int i = 256; i < 512; i++)
        x[i] = 0.0f;
    static const uint32_t types[] = {QTYPE_Q8_0, QTYPE_Q8_K, QTYPE_F32};
    for (size_t k = 0; k < 3; k++) {
        size_t bytes = quant_row_bytes(types[k], N);
        memset(a, 0x55, N * 4);
        memset(b, 0xaa, N * 4);
        quant_prepare_activation(types[k], x, a, N);
        quant_quantize_row(types[k], x, b, N);
        CHECK_MSG(memcmp(a, b, bytes) == 0, "%s", quant_traits_of(types[k])->name);
    }
    quant_prepare_activation(QTYPE_Q8_0, x, a, N);
    CHECK_EQ((int8_t)a[2 + 1], -30); /* x[1] = -30.5, d = 1: tie to even */
    CHECK_EQ((int8_t)a[2 + 2], -30); /* -29.5 */
    CHECK_EQ((int8_t)a[2 + 4], -28); /* -27.5 */
    free(x);
    free(a);
    free(b);
}

/* ---- dot products ---- */

/* A random weight row of type t and a prepared activation, both n long, plus their
 * dequantized values (f32) and the f32 data they were made from. */
typedef struct {
    uint32_t t, act_t;
    int64_t n;
    float *x, *a;        /* the f32 originals */
    float *xq, *aq;      /* what the packed rows dequantize to */
    uint8_t *w, *act;    /* packed */
} dot_case;

static bool dot_case_make(dot_case *c, uint32_t t, int64_t n)
{
    c->t = t;
    c->act_t = quant_dot_activation_type(t);
    c->n = n;
    c->x = malloc((size_t)n * sizeof(float));
    c->a = malloc((size_t)n * sizeof(float));
    c->xq = malloc((size_t)n * sizeof(float));
    c->aq = malloc((size_t)n * sizeof(float));
    c->w = malloc(quant_row_bytes(t, n));
    c->act = malloc(quant_row_bytes(c->act_t, n));
    if (!c->x || !c->a || !c->xq || !c->aq || !c->w || !c->act)
        return false;
    fill_gauss(c->x, n);
    fill_gauss(c->a, n);
    quant_quantize_row(t, c->x, c->w, n);
    quant_prepare_activation(c->act_t, c->a, c->act, n);
    quant_dequantize_row(t, c->w, c->xq, n);
    quant_dequantize_row(c->act_t, c->act, c->aq, n);
    return true;
}

static void dot_case_free(dot_case *c)
{
    free(c->x);
    free(c->a);
    free(c->xq);
    free(c->aq);
    free(c->w);
    free(c->act);
}

/* Exact dot of the dequantized rows, and the sum of |products| that scales rounding. */
static double dot_exact(const dot_case *c, double *abs_sum)
{
    double s = 0, sa = 0;
    for (int64_t i = 0; i < c->n; i++) {
        s += (double)c->xq[i] * c->aq[i];
        sa += fabs((double)c->xq[i] * c->aq[i]);
    }
    *abs_sum = sa;
    return s;
}

static int64_t block_of(uint32_t t)
{
    return quant_traits_of(t)->block_size == 1 ? 32 : 256;
}

/* Where quant_bf16_rounds_activation says so, quant_dot of a BF16 row rounds the f32
 * activation to bf16 first: its results stand 2^-8 of the sum of |products| further from
 * the f32 ones (quant.h), and the scalar kernel run on the rounded activation is their
 * reference. */
static bool bf16_rounded(uint32_t t, int64_t n)
{
    return t == QTYPE_BF16 && quant_bf16_rounds_activation() && n <= 16384;
}

static void bf16_rounded_reference(const dot_case *c, float *ref)
{
    float *r = malloc((size_t)c->n * sizeof *r);
    CHECK(r);
    for (int64_t i = 0; i < c->n; i++)
        r[i] = quant_bf16_to_f32(quant_f32_to_bf16(c->aq[i]));
    *ref = quant_dot_scalar(c->t, c->w, r, c->n);
    free(r);
}

/* The kernels compute exactly what the dequantized rows give, up to f32 rounding
 * (relative tolerance 2e-5 of the sum of |products|; BF16 as above), and that is close to the dot of
 * the unquantized data (within the weight and activation quantization error). */
static void dot_matches_dequantized_rows(void)
{
    static const double quant_tol[] = {1e-6, 1e-3, 5e-3, 0.015, 0.13, 0.13, 0.07, 0.07,
                                       0.45, 0.25, 0.12, 0.06, 0.03, 0.13, 0.13, 0.2,
                                       0.5,  0.45, 0.4,  0.3,  0.25, 0.6,  0.6};
    for (size_t k = 0; k < N_DOT_TYPES; k++) {
        uint32_t t = dot_types[k];
        const char *name = quant_traits_of(t)->name;
        for (int64_t n = block_of(t); n <= 4096; n *= 4) {
            dot_case c;
            CHECK(dot_case_make(&c, t, n));
            double sa, want = dot_exact(&c, &sa);
            float got = quant_dot(t, c.w, c.act, n), ref = quant_dot_scalar(t, c.w, c.act, n);
            double xx = 0, aa = 0, truth = 0;
            for (int64_t i = 0; i < n; i++) {
                xx += (double)c.x[i] * c.x[i];
                aa += (double)c.a[i] * c.a[i];
                truth += (double)c.x[i] * c.a[i];
            }
            dot_case_free(&c);
            CHECK_MSG(fabs(ref - want) <= 2e-5 * sa, "%s n=%lld scalar %g vs %g", name, (long long)n,
                      (double)ref, want);
            double tol = (bf16_rounded(t, n) ? 0x1p-8 + 2e-5 : 2e-5) * sa;
            CHECK_MSG(fabs(got - want) <= tol, "%s n=%lld %g vs %g", name, (long long)n,
                      (double)got, want);
            CHECK_MSG(fabs(got - truth) <= quant_tol[k] * sqrt(xx * aa), "%s n=%lld %g vs unquantized %g",
                      name, (long long)n, (double)got, truth);
        }
    }
}

/* AVX2 and scalar kernels agree to f32 rounding: |simd - scalar| <= 1e-5 * sum |products|. */
static void simd_dot_matches_scalar(void)
{
    if (!have_avx2())
        SKIP("AVX2 kernels not in use (CPU lacks AVX2/FMA/F16C or LLMS_NO_SIMD is set)");
    /* float lengths: every tail the kernels mask, and one past the AVX-512 BF16 kernel's
     * 16384-element buffer (the shift-widening kernel takes it) */
    static const int64_t float_lengths[] = {1, 7, 8, 15, 16, 17, 31, 33, 63, 65, 1000, 4096, 5000, 16400};
    /* 8288: past the 8192 elements the AVX-512 Q8_0 and Q4_0 kernels put in order on
     * their stacks, with an odd block count */
    static const int64_t q32_lengths[] = {32, 96, 256, 4096, 5632, 8288};
    /* 8448: past the 8192 elements the AVX-512 Q4_K/Q5_K kernel reorders on its stack
     * (it reorders each super-block in registers instead) */
    static const int64_t q256_lengths[] = {256, 512, 2048, 5632, 8448};
    for (size_t k = 0; k < N_DOT_TYPES; k++) {
        uint32_t t = dot_types[k];
        int bs = quant_traits_of(t)->block_size;
        const int64_t *lens = bs == 1 ? float_lengths : bs == 32 ? q32_lengths : q256_lengths;
        size_t nl = bs == 1    ? sizeof float_lengths / sizeof float_lengths[0]
                    : bs == 32 ? sizeof q32_lengths / sizeof q32_lengths[0]
                               : sizeof q256_lengths / sizeof q256_lengths[0];
        for (size_t li = 0; li < nl; li++) {
            dot_case c;
            CHECK(dot_case_make(&c, t, lens[li]));
            double sa;
            dot_exact(&c, &sa);
            float got = quant_dot(t, c.w, c.act, c.n), ref = 0;
            if (bf16_rounded(t, c.n))
                bf16_rounded_reference(&c, &ref);
            else
                ref = quant_dot_scalar(t, c.w, c.act, c.n);
            dot_case_free(&c);
            CHECK_MSG(fabs(got - ref) <= 1e-5 * sa + 1e-30, "%s n=%lld avx2 %g scalar %g",
                      quant_traits_of(t)->name, (long long)lens[li], (double)got, (double)ref);
        }
    }
}

/* Blocks of random bytes cover what a quantizer rarely produces (Q8_0 weights of -128,
 * all-ones nibbles, 6-bit scales and mins of 63, negative Q6_K scales): the AVX2 integer
 * arithmetic must not saturate or lose signs there. Scale fields hold f16 1/64; the
 * activation has full-scale +-127 entries. */
static void simd_dot_matches_scalar_on_random_blocks(void)
{
    if (!have_avx2())
        SKIP("AVX2 kernels not in use (CPU lacks AVX2/FMA/F16C or LLMS_NO_SIMD is set)");
    static const uint32_t types[] = {
        QTYPE_Q8_0,   QTYPE_Q4_0,   QTYPE_Q4_1,    QTYPE_Q5_0,  QTYPE_Q5_1,    QTYPE_Q2_K,
        QTYPE_Q3_K,   QTYPE_Q4_K,   QTYPE_Q5_K,    QTYPE_Q6_K,  QTYPE_IQ4_NL,  QTYPE_IQ4_XS,
        QTYPE_MXFP4,  QTYPE_IQ2_XXS, QTYPE_IQ2_XS, QTYPE_IQ2_S, QTYPE_IQ3_XXS, QTYPE_IQ3_S,
        QTYPE_IQ1_S,  QTYPE_IQ1_M};
    enum { N = 1024 };
    uint8_t *w = malloc(N * 2), *act = malloc(N * 2);
    float *x = malloc(N * sizeof *x), *wf = malloc(N * sizeof *wf), *af = malloc(N * sizeof *af);
    CHECK(w && act && x && wf && af);
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        uint32_t t = types[k], at = quant_dot_activation_type(t);
        const quant_traits *tr = quant_traits_of(t);
        for (int trial = 0; trial < 8; trial++) {
            size_t bytes = quant_row_bytes(t, N);
            for (size_t i = 0; i < bytes; i++)
                w[i] = (uint8_t)rng_u32();
            for (size_t b = 0; b < bytes; b += tr->block_bytes) {
                if (t == QTYPE_Q6_K || t == QTYPE_Q3_K) {
                    put16(w + b + tr->block_bytes - 2, 0x2400); /* d last */
                } else if (t == QTYPE_Q2_K) {
                    put16(w + b + 80, 0x2400);
                    put16(w + b + 82, 0x2400);
                } else if (t == QTYPE_MXFP4) {
                    w[b] = 121; /* 2^-6 */
                } else if (t == QTYPE_IQ1_M) {
                    put_iq1_m_d(w + b, 0x2400);
                } else {
                    put16(w + b, 0x2400);
                    if (t == QTYPE_Q4_K || t == QTYPE_Q5_K || t == QTYPE_Q4_1 || t == QTYPE_Q5_1)
                        put16(w + b + 2, 0x2400); /* dmin, m */
                }
            }
            for (int i = 0; i < N; i++)
                x[i] = trial & 1 ? (i % 3 ? 1.0f : -1.0f) : rng_gauss();
            quant_prepare_activation(at, x, act, N);
            quant_dequantize_row(t, w, wf, N);
            quant_dequantize_row(at, act, af, N);
            double sa = 0;
            for (int i = 0; i < N; i++)
                sa += fabs((double)wf[i] * af[i]);
            float got = quant_dot(t, w, act, N), ref = quant_dot_scalar(t, w, act, N);
            CHECK_MSG(fabs(got - ref) <= 1e-5 * sa + 1e-30, "%s trial %d: avx2 %g scalar %g",
                      tr->name, trial, (double)got, (double)ref);
        }
    }
    free(w);
    free(act);
    free(x);
    free(wf);
    free(af);
}

/* Every E8M0 exponent, the subnormal halves (e 0, 1) and e 255 included, scales an MXFP4
 * block in the SIMD kernels exactly as in the scalar one: one non-zero weight, in a block
 * of a whole step and in the tail, makes each kernel's sum a single product. */
static void simd_mxfp4_scales_match_scalar(void)
{
    enum { NB = 5, N = NB * 32 };
    uint8_t w[NB * 17], act[NB * 34];
    float x[N];
    for (int i = 0; i < N; i++)
        x[i] = 1.0f;
    quant_prepare_activation(quant_dot_activation_type(QTYPE_MXFP4), x, act, N);
    for (int blk = 2; blk < NB; blk += 2)
        for (int e = 0; e < 256; e++) {
            memset(w, 0, sizeof w);
            w[blk * 17] = (uint8_t)e;
            w[blk * 17 + 1 + 3] = 0x07; /* element 3: code 7, 6 times the scale */
            float got = quant_dot(QTYPE_MXFP4, w, act, N);
            float ref = quant_dot_scalar(QTYPE_MXFP4, w, act, N);
            CHECK_MSG(memcmp(&got, &ref, sizeof got) == 0, "block %d e %d: simd %g scalar %g",
                      blk, e, (double)got, (double)ref);
        }
}

/* quant_dot_rows gives each row exactly what quant_dot gives it, whatever the row's
 * position in the groups the kernel works on; bytes between rows are never read (they
 * hold NaN patterns that would show). */
static void dot_rows_equal_single_dots(void)
{
    enum { ROWS = 11 };
    for (size_t k = 0; k < N_DOT_TYPES; k++) {
        uint32_t t = dot_types[k];
        int64_t n = block_of(t) == 32 ? 1024 : 1024 + 256;
        if (quant_traits_of(t)->block_size == 1)
            n += 3;
        size_t rb = quant_row_bytes(t, n), stride = rb + 6;
        uint8_t *w = malloc(stride * ROWS);
        dot_case c;
        CHECK(w && dot_case_make(&c, t, n));
        memset(w, 0xff, stride * ROWS);
        float *x = malloc((size_t)n * sizeof(float));
        CHECK(x);
        for (int r = 0; r < ROWS; r++) {
            fill_gauss(x, n);
            quant_quantize_row(t, x, w + (size_t)r * stride, n);
        }
        float out[ROWS];
        quant_dot_rows(t, w, stride, ROWS, c.act, n, out);
        bool ok = true;
        for (int r = 0; r < ROWS; r++) {
            float one = quant_dot(t, w + (size_t)r * stride, c.act, n);
            if (memcmp(&one, &out[r], sizeof one) != 0 || isnan(one))
                ok = false;
        }
        free(x);
        free(w);
        dot_case_free(&c);
        CHECK_MSG(ok, "%s: quant_dot_rows differs from quant_dot", quant_traits_of(t)->name);
    }
}

/* quant_dot_rows_multi gives each (row, activation) pair what quant_dot gives it: bit
 * for bit, or (Q8_0 on AVX-512 VNNI, more than one activation) within f32 rounding and
 * then the same bits whatever the count of rows and activations (one included) and the
 * pair's position among them. Outputs between the written ones (out_stride > n_rows) and bytes
 * between rows (NaN patterns) are left alone. */
static void dot_rows_multi_match_single_dots(void)
{
    enum { ROWS = 7, MAX_ACT = 9, OUT_STRIDE = ROWS + 2 };
    /* every type at one length; the 32-element block types also past the 8192 elements
     * the AVX-512 Q8_0 and Q4_0 kernels put in order on their stacks (they then work from
     * the activation as stored) */
    for (size_t kl = 0; kl < 2 * N_DOT_TYPES; kl++) {
        size_t k = kl % N_DOT_TYPES;
        bool long_row = kl >= N_DOT_TYPES;
        if (long_row && block_of(dot_types[k]) != 32)
            continue;
        uint32_t t = dot_types[k], at = quant_dot_activation_type(t);
        int64_t n = long_row ? 8192 + 96 : block_of(t) == 32 ? 1024 + 32 : 1024 + 256;
        if (quant_traits_of(t)->block_size == 1)
            n += 3;
        size_t rb = quant_row_bytes(t, n), stride = rb + 6;
        size_t ab = quant_row_bytes(at, n), astride = ab + 12; /* float activations stay aligned */
        uint8_t *w = malloc(stride * ROWS), *act = malloc(astride * MAX_ACT);
        float *x = malloc((size_t)n * sizeof(float)), *wf = malloc((size_t)n * sizeof(float));
        float *af = malloc((size_t)n * sizeof(float));
        CHECK(w && act && x && wf && af);
        memset(w, 0xff, stride * ROWS);
        memset(act, 0xff, astride * MAX_ACT);
        for (int r = 0; r < ROWS; r++) {
            fill_gauss(x, n);
            quant_quantize_row(t, x, w + (size_t)r * stride, n);
        }
        for (int a = 0; a < MAX_ACT; a++) {
            fill_gauss(x, n);
            quant_prepare_activation(at, x, act + (size_t)a * astride, n);
        }
        float all[MAX_ACT * OUT_STRIDE];
        quant_dot_rows_multi(t, w, stride, ROWS, act, astride, MAX_ACT, n, all, OUT_STRIDE);
        bool ok = true, same = true, batched_as_alone = true;
        for (int a = 0; a < MAX_ACT; a++) {
            quant_dequantize_row(at, act + (size_t)a * astride, af, n);
            for (int r = 0; r < ROWS; r++) {
                quant_dequantize_row(t, w + (size_t)r * stride, wf, n);
                double sa = 0;
                for (int64_t i = 0; i < n; i++)
                    sa += fabs((double)wf[i] * af[i]);
                const void *wr = w + (size_t)r * stride, *ar = act + (size_t)a * astride;
                float one = quant_dot(t, wr, ar, n), got = all[a * OUT_STRIDE + r], alone;
                quant_dot_rows_multi(t, wr, stride, 1, ar, astride, 1, n, &alone, 1);
                if (isnan(got) || fabs(got - one) > 1e-5 * sa || memcmp(&alone, &one, sizeof one))
                    ok = false;
                /* a sequence's logits do not depend on whether it is decoded in a batch */
                batched_as_alone = batched_as_alone && !memcmp(&got, &alone, sizeof got);
            }
        }
        /* fewer activations, and the rows shifted by one, regroup every pair */
        for (int na = 2; na < MAX_ACT; na++) {
            float out[MAX_ACT * OUT_STRIDE];
            for (int i = 0; i < MAX_ACT * OUT_STRIDE; i++)
                out[i] = -7.0f;
            quant_dot_rows_multi(t, w + stride, stride, ROWS - 1, act + astride, astride, na, n,
                                 out, OUT_STRIDE);
            for (int a = 0; a < MAX_ACT; a++)
                for (int r = 0; r < OUT_STRIDE; r++) {
                    float got = out[a * OUT_STRIDE + r];
                    if (a >= na || r >= ROWS - 1)
                        same = same && got == -7.0f;
                    else
                        same = same && !memcmp(&got, &all[(a + 1) * OUT_STRIDE + r + 1], sizeof got);
                }
        }
        free(x);
        free(wf);
        free(af);
        free(w);
        free(act);
        CHECK_MSG(ok, "%s n=%lld: quant_dot_rows_multi differs from quant_dot",
                  quant_traits_of(t)->name, (long long)n);
        CHECK_MSG(same, "%s n=%lld: quant_dot_rows_multi depends on grouping",
                  quant_traits_of(t)->name, (long long)n);
        CHECK_MSG(batched_as_alone, "%s n=%lld: a batched result differs from the same pair alone",
                  quant_traits_of(t)->name, (long long)n);
    }
}

/* The AVX2 dequantizers give the scalar results bit for bit. */
/* Packed activations (Q8_0 on AVX-512 VNNI), for any count of rows and activations
 * (partial groups, blocks of 8 rows, narrow last groups of at most 8 included): in a group
 * of 16 every (row, activation) result equals quant_dot_scalar bit for bit; in a narrow
 * group the integer block sums are exact and only the f32 additions move, so the result
 * is within f32 rounding of the sum of its blocks' |terms|, and bit-equal again when
 * every scale is 1 (all terms and partial sums are then integers below 2^24). Elsewhere
 * there is no packed kernel and the test says so. */
static bool packed_in_wide_group(int a, int n_act)
{
    return a < n_act / 16 * 16 || n_act % 16 > 8;
}

/* Q8_0 rows repacked: every (row, activation) result of quant_dot_rows_repacked equals
 * quant_dot_scalar's on the rows as stored, bit for bit, for 1 to 33 activations (every
 * width a pass takes, and a second and third pass), extreme blocks included; the rows
 * are written where out_stride says and nothing else is. */
static void dot_rows_repacked_match_scalar(void)
{
    enum { ROWS = 2 * QUANT_REPACK_ROWS, MAX_ACT = 33, OUT_STRIDE = ROWS + 3 };
    const uint32_t t = QTYPE_Q8_0;
    const int64_t n = 1024 + 32; /* an odd count of blocks */
    if (!quant_repack_kernel(t)) {
        printf("       no repacked kernel on this CPU (%s): nothing to compare\n",
               quant_simd_name());
        return;
    }
    CHECK(!quant_repack_kernel(QTYPE_Q4_K));
    size_t rb = quant_row_bytes(t, n), ab = quant_row_bytes(QTYPE_Q8_0, n);
    uint8_t *w = malloc(rb * ROWS), *wr = malloc(rb * ROWS), *act = malloc(ab * MAX_ACT);
    void *packed = malloc(quant_repacked_act_bytes(MAX_ACT, n));
    float *x = malloc((size_t)n * sizeof(float));
    float *out = malloc(sizeof(float) * MAX_ACT * OUT_STRIDE);
    CHECK(w && wr && act && packed && x && out);
    for (int r = 0; r < ROWS; r++) {
        fill_gauss(x, n);
        if (r == 3 || r == 20) /* full-range bytes in a block */
            for (int64_t i = 32; i < 64; i++)
                x[i] = i % 2 ? 1e3f : -1e3f;
        quant_quantize_row(t, x, w + (size_t)r * rb, n);
    }
    for (int g = 0; g < ROWS / QUANT_REPACK_ROWS; g++)
        quant_repack_rows(t, w + (size_t)g * QUANT_REPACK_ROWS * rb, rb, n,
                          wr + (size_t)g * QUANT_REPACK_ROWS * rb);
    for (int a = 0; a < MAX_ACT; a++) {
        fill_gauss(x, n);
        if (a == 5)
            for (int64_t i = 32; i < 64; i++)
                x[i] = i % 3 ? 1e3f : -1e3f;
        quant_prepare_activation(QTYPE_Q8_0, x, act + (size_t)a * ab, n);
    }
    bool exact = true, untouched = true;
    for (int na = 1; na <= MAX_ACT; na++) {
        for (int i = 0; i < MAX_ACT * OUT_STRIDE; i++)
            out[i] = -7.0f;
        /* in two ranges, as two threads convert them */
        quant_repack_activations(act, ab, 0, na / 2, na, n, packed);
        quant_repack_activations(act, ab, na / 2, na, na, n, packed);
        quant_dot_rows_repacked(t, wr, rb, ROWS, packed, na, n, out, OUT_STRIDE);
        for (int a = 0; a < MAX_ACT; a++)
            for (int r = 0; r < OUT_STRIDE; r++) {
                float got = out[a * OUT_STRIDE + r];
                if (a >= na || r >= ROWS) {
                    untouched &= got == -7.0f;
                    continue;
                }
                float ref = quant_dot_scalar(t, w + (size_t)r * rb, act + (size_t)a * ab, n);
                if (got != ref && exact) {
                    printf("       %d activations: row %d act %d: %.9g vs %.9g\n", na, r, a, got,
                           ref);
                    exact = false;
                }
            }
    }
    CHECK(exact);
    CHECK(untouched);
    free(w), free(wr), free(act), free(packed), free(x), free(out);
}

static void dot_rows_packed_match_scalar(void)
{
    enum { ROWS = 19, MAX_ACT = 40, OUT_STRIDE = ROWS + 3 };
    const uint32_t t = QTYPE_Q8_0;
    const int64_t n = 1024 + 32; /* an odd count of blocks */
    const int64_t nb = n / 32;
    if (!quant_packed_bytes(QTYPE_Q8_0, QUANT_PACKED_MIN_ACT, n)) {
        printf("       no packed kernel on this CPU (%s): nothing to compare\n",
               quant_simd_name());
        return;
    }
    CHECK_EQ(quant_packed_bytes(QTYPE_Q8_0, QUANT_PACKED_MIN_ACT - 1, n), 0);
    CHECK_EQ(quant_packed_bytes(QTYPE_Q8_K, 16, 1024), 0);
    size_t rb = quant_row_bytes(t, n), stride = rb + 5, ab = quant_row_bytes(QTYPE_Q8_0, n);
    uint8_t *w = malloc(stride * ROWS), *act = malloc(ab * MAX_ACT);
    void *packed = malloc(quant_packed_bytes(QTYPE_Q8_0, MAX_ACT, n));
    float *x = malloc((size_t)n * sizeof(float));
    float *out = malloc(sizeof(float) * MAX_ACT * OUT_STRIDE);
    CHECK(w && act && packed && x && out);
    for (int r = 0; r < ROWS; r++) {
        fill_gauss(x, n);
        /* a few extreme blocks: full-range bytes */
        if (r == 3)
            for (int64_t i = 0; i < 32; i++)
                x[i] = i % 2 ? 1e3f : -1e3f;
        quant_quantize_row(t, x, w + (size_t)r * stride, n);
    }
    for (int a = 0; a < MAX_ACT; a++) {
        fill_gauss(x, n);
        quant_prepare_activation(QTYPE_Q8_0, x, act + (size_t)a * ab, n);
    }
    static const int n_acts[] = {3, 4, 5, 8, 9, 16, 17, 21, 25, 31, 40};
    static const int n_rows[] = {1, 5, 8, 13, 19};
    for (int unit = 0; unit < 2; unit++) {
        if (unit) {
            /* every scale 1: the narrow groups' results become exact too */
            for (int r = 0; r < ROWS; r++)
                for (int64_t k = 0; k < nb; k++)
                    put16(w + (size_t)r * stride + (size_t)k * 34, 0x3C00);
            for (int a = 0; a < MAX_ACT; a++)
                for (int64_t k = 0; k < nb; k++)
                    put16(act + (size_t)a * ab + (size_t)k * 34, 0x3C00);
        }
        bool exact = true, close = true, untouched = true;
        for (size_t i = 0; i < sizeof n_acts / sizeof *n_acts; i++)
            for (size_t k = 0; k < sizeof n_rows / sizeof *n_rows; k++) {
                int na = n_acts[i], nr = n_rows[k];
                for (int q = 0; q < MAX_ACT * OUT_STRIDE; q++)
                    out[q] = -7.0f;
                quant_pack_activations(QTYPE_Q8_0, act, ab, na, n, packed);
                CHECK(quant_dot_rows_packed(t, w, stride, nr, packed, na, n, out, OUT_STRIDE));
                for (int a = 0; a < MAX_ACT; a++)
                    for (int r = 0; r < OUT_STRIDE; r++) {
                        float got = out[a * OUT_STRIDE + r];
                        if (a >= na || r >= nr) {
                            untouched = untouched && got == -7.0f;
                            continue;
                        }
                        const uint8_t *wr = w + (size_t)r * stride, *ar = act + (size_t)a * ab;
                        float want = quant_dot_scalar(t, wr, ar, n);
                        if (unit || packed_in_wide_group(a, na)) {
                            if (memcmp(&got, &want, sizeof got) != 0) {
                                if (exact)
                                    fprintf(stderr, "       %d acts, %d rows: (%d, %d) %.9g vs %.9g\n",
                                            na, nr, r, a, got, want);
                                exact = false;
                            }
                            continue;
                        }
                        double mag = 0;
                        for (int64_t kb = 0; kb < nb; kb++)
                            mag += fabs(quant_dot_scalar(t, wr + kb * 34, ar + kb * 34, 32));
                        if (fabs((double)got - want) > 1e-5 * mag) {
                            if (close)
                                fprintf(stderr, "       %d acts, %d rows: (%d, %d) %.9g vs %.9g (sum |terms| %g)\n",
                                        na, nr, r, a, got, want, mag);
                            close = false;
                        }
                    }
            }
        CHECK_MSG(exact, "packed results differ from quant_dot_scalar (%s scales)",
                  unit ? "unit" : "random");
        CHECK_MSG(close, "narrow packed results not within rounding of quant_dot_scalar");
        CHECK_MSG(untouched, "packed kernel wrote outside its rows and activations");
    }
    /* other weight types have no packed kernel */
    CHECK(!quant_dot_rows_packed(QTYPE_Q4_0, w, stride, 1, packed, 8, n, out, OUT_STRIDE));
    free(w);
    free(act);
    free(packed);
    free(x);
    free(out);
}

static void simd_dequantize_matches_scalar(void)
{
    if (!have_avx2())
        SKIP("AVX2 kernels not in use (CPU lacks AVX2/FMA/F16C or LLMS_NO_SIMD is set)");
    static const uint32_t types[] = {QTYPE_F32,  QTYPE_F16,  QTYPE_BF16, QTYPE_Q8_0,
                                     QTYPE_Q4_0, QTYPE_Q4_1, QTYPE_Q5_0, QTYPE_Q5_1,
                                     QTYPE_Q2_K, QTYPE_Q3_K, QTYPE_Q4_K, QTYPE_Q5_K,
                                     QTYPE_Q6_K, QTYPE_IQ4_NL, QTYPE_IQ4_XS, QTYPE_MXFP4,
                                     QTYPE_Q8_K, QTYPE_IQ2_XXS, QTYPE_IQ2_XS, QTYPE_IQ2_S,
                                     QTYPE_IQ3_XXS, QTYPE_IQ3_S, QTYPE_IQ1_S, QTYPE_IQ1_M};
    enum { N = 4096 };
    float *x = malloc(N * sizeof *x), *y1 = malloc(N * sizeof *y1), *y2 = malloc(N * sizeof *y2);
    uint8_t *q = malloc(N * 4);
    CHECK(x && y1 && y2 && q);
    fill_gauss(x, N);
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        uint32_t t = types[k];
        quant_quantize_row(t, x, q, N);
        quant_dequantize_row(t, q, y1, N);
        quant_dequantize_row_scalar(t, q, y2, N);
        CHECK_MSG(memcmp(y1, y2, N * sizeof *y1) == 0, "%s", quant_traits_of(t)->name);
    }
    /* Every f16 and bf16 bit pattern (NaNs, subnormals), at lengths with ragged tails. */
    uint16_t *h = (uint16_t *)q;
    for (int pass = 0; pass < 16; pass++) {
        for (int i = 0; i < N; i++)
            h[i] = (uint16_t)(pass * N + i);
        for (int t = 0; t < 2; t++) {
            uint32_t type = t ? QTYPE_BF16 : QTYPE_F16;
            int64_t n = N - pass;
            quant_dequantize_row(type, h, y1, n);
            quant_dequantize_row_scalar(type, h, y2, n);
            CHECK_MSG(memcmp(y1, y2, (size_t)n * sizeof *y1) == 0, "%s pass %d",
                      quant_traits_of(type)->name, pass);
        }
    }
    free(x);
    free(y1);
    free(y2);
    free(q);
}

static void activation_types(void)
{
    CHECK_EQ(quant_dot_activation_type(QTYPE_Q8_0), QTYPE_Q8_0);
    CHECK_EQ(quant_dot_activation_type(QTYPE_Q4_0), QTYPE_Q8_0);
    CHECK_EQ(quant_dot_activation_type(QTYPE_Q4_K), QTYPE_Q8_K);
    CHECK_EQ(quant_dot_activation_type(QTYPE_Q5_K), QTYPE_Q8_K);
    CHECK_EQ(quant_dot_activation_type(QTYPE_Q6_K), QTYPE_Q8_K);
    CHECK_EQ(quant_dot_activation_type(QTYPE_Q3_K), QTYPE_Q8_K);
    CHECK_EQ(quant_dot_activation_type(QTYPE_Q2_K), QTYPE_Q8_K);
    /* the legacy types' sums of activation quants come from the Q8_0 blocks themselves */
    CHECK_EQ(quant_dot_activation_type(QTYPE_Q4_1), QTYPE_Q8_0);
    CHECK_EQ(quant_dot_activation_type(QTYPE_Q5_0), QTYPE_Q8_0);
    CHECK_EQ(quant_dot_activation_type(QTYPE_Q5_1), QTYPE_Q8_0);
    CHECK_EQ(quant_dot_activation_type(QTYPE_IQ4_NL), QTYPE_Q8_0);
    CHECK_EQ(quant_dot_activation_type(QTYPE_MXFP4), QTYPE_Q8_0);
    CHECK_EQ(quant_dot_activation_type(QTYPE_IQ4_XS), QTYPE_Q8_K);
    CHECK_EQ(quant_dot_activation_type(QTYPE_F16), QTYPE_F32);
    CHECK_EQ(quant_dot_activation_type(QTYPE_BF16), QTYPE_F32);
    CHECK_EQ(quant_dot_activation_type(QTYPE_F32), QTYPE_F32);
}

/* F16 rows longer than QUANT_F16_ROUND_MIN_N (quant_f16_rounds_activation): each
 * result is the scalar kernel's on the activation rounded to f16 (within f32 rounding,
 * 2e-5 of the sum of |products|), within 2^-11 of that sum of the exact one, and the
 * same bits in a batch of activations as alone. Without the AVX-512 kernels nothing is
 * rounded. Row lengths: one whole, one with a 16-element tail, one with a 17-element
 * one, and the longest rounded. */
static void f16_long_rows_round_activation(void)
{
    enum { ROWS = 3, N_ACT = 6 };
    static const int64_t lengths[] = {5632, QUANT_F16_ROUND_MIN_N + 16, QUANT_F16_ROUND_MIN_N + 17,
                                      16384};
    for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++) {
        int64_t n = lengths[li];
        size_t rb = quant_row_bytes(QTYPE_F16, n);
        uint8_t *w = malloc(rb * ROWS);
        float *act = malloc(sizeof *act * (size_t)n * N_ACT), *x = malloc(sizeof *x * (size_t)n);
        float *rounded = malloc(sizeof *rounded * (size_t)n), *wf = malloc(sizeof *wf * (size_t)n);
        CHECK(w && act && x && rounded && wf);
        for (int r = 0; r < ROWS; r++) {
            fill_gauss(x, n);
            quant_quantize_row(QTYPE_F16, x, w + (size_t)r * rb, n);
        }
        fill_gauss(act, n * N_ACT);
        float batch[N_ACT * ROWS];
        quant_dot_rows_multi(QTYPE_F16, w, rb, ROWS, act, (size_t)n * sizeof *act, N_ACT, n, batch,
                             ROWS);
        bool rounds = quant_f16_rounds_activation(n);
        for (int a = 0; a < N_ACT; a++) {
            const float *av = act + (size_t)a * n;
            float alone[ROWS];
            quant_dot_rows(QTYPE_F16, w, rb, ROWS, av, n, alone);
            for (int64_t i = 0; i < n; i++)
                rounded[i] = rounds ? quant_f16_to_f32(quant_f32_to_f16(av[i])) : av[i];
            for (int r = 0; r < ROWS; r++) {
                quant_dequantize_row(QTYPE_F16, w + (size_t)r * rb, wf, n);
                double sa = 0;
                for (int64_t i = 0; i < n; i++)
                    sa += fabs((double)wf[i] * av[i]);
                float ref = quant_dot_scalar(QTYPE_F16, w + (size_t)r * rb, rounded, n);
                float exact = quant_dot_scalar(QTYPE_F16, w + (size_t)r * rb, av, n);
                CHECK_MSG(fabs(alone[r] - ref) <= 2e-5 * sa, "n=%lld row %d: %g vs %g", (long long)n,
                          r, (double)alone[r], (double)ref);
                CHECK_MSG(fabs(alone[r] - exact) <= (0x1p-11 + 2e-5) * sa,
                          "n=%lld row %d: %g vs exact %g", (long long)n, r, (double)alone[r],
                          (double)exact);
                CHECK_MSG(!memcmp(&batch[a * ROWS + r], &alone[r], sizeof alone[r]),
                          "n=%lld row %d activation %d: batched %g, alone %g", (long long)n, r, a,
                          (double)batch[a * ROWS + r], (double)alone[r]);
            }
        }
        free(w);
        free(act);
        free(x);
        free(rounded);
        free(wf);
    }
    CHECK(!quant_f16_rounds_activation(QUANT_F16_ROUND_MIN_N));
}

int main(void)
{
    RUN(f16_special_values);
    RUN(f16_rounds_to_nearest_even);
    RUN(f16_round_trips_all_values);
    RUN(bf16_conversions);
    RUN(q8_0_layout);
    RUN(q4_0_layout);
    RUN(q4_1_layout);
    RUN(q5_0_layout);
    RUN(q5_1_layout);
    RUN(q4_k_layout);
    RUN(q5_k_layout);
    RUN(q6_k_layout);
    RUN(q3_k_layout);
    RUN(q2_k_layout);
    RUN(iq4_nl_layout);
    RUN(iq4_nl_picks_the_nearest_grid_point);
    RUN(iq4_xs_layout);
    RUN(mxfp4_layout);
    RUN(float_rows_layout);
    RUN(quantize_error_is_bounded);
    RUN(iq_codebooks_are_ggml_tables);
    RUN(iq_signs_and_scales);
    RUN(iq_simd_dot_is_scalar_bits);
    RUN(iq_quantize_degenerate_blocks);
    RUN(quantize_degenerate_blocks);
    RUN(q8_k_activation_layout);
    RUN(activation_types);
    RUN(prepare_activation_matches_reference);
    RUN(dot_matches_dequantized_rows);
    RUN(simd_dot_matches_scalar);
    RUN(simd_dot_matches_scalar_on_random_blocks);
    RUN(simd_mxfp4_scales_match_scalar);
    RUN(dot_rows_equal_single_dots);
    RUN(dot_rows_multi_match_single_dots);
    RUN(f16_long_rows_round_activation);
    RUN(dot_rows_packed_match_scalar);
    RUN(dot_rows_repacked_match_scalar);
    RUN(simd_dequantize_matches_scalar);
    return test_finish();
}
