/*
 * quant.c — GGUF tensor types (see quant.h): the type table, f16/bf16 conversions, the
 * reference quantizers, the portable scalar kernels, and the choice between those and the
 * AVX2 kernels of quant_avx2.c.
 */
#include "engine/quant/quant.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "engine/quant/quant_avx2.h"
#include "engine/quant/quant_avx512.h"
#include "engine/quant/quant_blocks.h"
#include "engine/quant/quant_iq.h"
#include "engine/quant/quant_repack_avx512.h"

#if defined(__x86_64__)
#include <cpuid.h>
#define QUANT_HAVE_AVX2 1
#else
#define QUANT_HAVE_AVX2 0
#endif

static const quant_traits traits_by_id[QTYPE_COUNT] = {
    [QTYPE_F32] = {"F32", 1, 4, true},
    [QTYPE_F16] = {"F16", 1, 2, true},
    [QTYPE_Q4_0] = {"Q4_0", 32, 18, true},
    [QTYPE_Q4_1] = {"Q4_1", 32, 20, true},
    [QTYPE_Q5_0] = {"Q5_0", 32, 22, true},
    [QTYPE_Q5_1] = {"Q5_1", 32, 24, true},
    [QTYPE_Q8_0] = {"Q8_0", 32, 34, true},
    [QTYPE_Q8_1] = {"Q8_1", 32, 36, false},
    [QTYPE_Q2_K] = {"Q2_K", 256, 84, true},
    [QTYPE_Q3_K] = {"Q3_K", 256, 110, true},
    [QTYPE_Q4_K] = {"Q4_K", 256, 144, true},
    [QTYPE_Q5_K] = {"Q5_K", 256, 176, true},
    [QTYPE_Q6_K] = {"Q6_K", 256, 210, true},
    [QTYPE_Q8_K] = {"Q8_K", 256, 292, false},
    [QTYPE_IQ2_XXS] = {"IQ2_XXS", 256, 66, true},
    [QTYPE_IQ2_XS] = {"IQ2_XS", 256, 74, true},
    [QTYPE_IQ3_XXS] = {"IQ3_XXS", 256, 98, true},
    [QTYPE_IQ1_S] = {"IQ1_S", 256, 50, true},
    [QTYPE_IQ4_NL] = {"IQ4_NL", 32, 18, true},
    [QTYPE_IQ3_S] = {"IQ3_S", 256, 110, true},
    [QTYPE_IQ2_S] = {"IQ2_S", 256, 82, true},
    [QTYPE_IQ4_XS] = {"IQ4_XS", 256, 136, true},
    [QTYPE_I8] = {"I8", 1, 1, false},
    [QTYPE_I16] = {"I16", 1, 2, false},
    [QTYPE_I32] = {"I32", 1, 4, false},
    [QTYPE_I64] = {"I64", 1, 8, false},
    [QTYPE_F64] = {"F64", 1, 8, false},
    [QTYPE_IQ1_M] = {"IQ1_M", 256, 56, true},
    [QTYPE_BF16] = {"BF16", 1, 2, true},
    [QTYPE_TQ1_0] = {"TQ1_0", 256, 54, false},
    [QTYPE_TQ2_0] = {"TQ2_0", 256, 66, false},
    [QTYPE_MXFP4] = {"MXFP4", 32, 17, true},
};

const quant_traits *quant_traits_of(uint32_t t)
{
    if (t >= QTYPE_COUNT || traits_by_id[t].name == NULL)
        return NULL;
    return &traits_by_id[t];
}

size_t quant_row_bytes(uint32_t t, int64_t n)
{
    const quant_traits *tr = quant_traits_of(t);
    if (!tr || n < 0 || n % tr->block_size != 0)
        return 0;
    return (size_t)(n / tr->block_size) * tr->block_bytes;
}

/* ---- scalar conversions ---- */

float quant_f16_to_f32(uint16_t h)
{
    return qb_f16_to_f32(h);
}

uint16_t quant_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t a = x & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN: keep the top payload bits, force quiet so it stays NaN */
        return sign | 0x7e00 | (uint16_t)((a >> 13) & 0x3ff);
    if (a >= 0x477ff000u) /* 65520 and up round to infinity */
        return sign | 0x7c00;
    if (a < 0x38800000u) { /* below 2^-14: subnormal half, in units of 2^-24 */
        if (a <= 0x33000000u) /* at most 2^-25: ties to even zero */
            return sign;
        uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift = 126 - e;
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1)))
            r++;
        return sign | (uint16_t)r;
    }
    uint32_t r = (((a >> 23) - 112) << 10) | ((a >> 13) & 0x3ff), rem = a & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (r & 1)))
        r++; /* a carry out of the mantissa correctly bumps the exponent */
    return sign | (uint16_t)r;
}

float quant_bf16_to_f32(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

uint16_t quant_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fffu + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

/* ---- kernel choice ---- */

static pthread_once_t simd_once = PTHREAD_ONCE_INIT;
static bool simd_avx2;
static bool simd_avx512; /* AVX-512 F/BW/DQ/VL/VNNI on top of simd_avx2 */
static bool simd_avx512_bf16; /* and AVX-512 BF16 on top of simd_avx512 */
static bool simd_f16_as_bf16; /* prefill rounds F16 weights to bf16 (opt-in, quant.h) */

static void simd_detect(void)
{
    const char *off = getenv("LLMS_NO_SIMD");
    if (off && *off && strcmp(off, "0") != 0)
        return;
#if QUANT_HAVE_AVX2
    /* __builtin_cpu_supports also checks that the OS saves the YMM registers; clang's
     * does not know "f16c", so that bit comes from CPUID leaf 1 directly. */
    unsigned eax, ebx, ecx, edx;
    __builtin_cpu_init();
    simd_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
    simd_avx512 = simd_avx2 && __builtin_cpu_supports("avx512f") &&
                  __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                  __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
    /* to measure what a CPU without AVX-512 gets, on one that has it */
    const char *no512 = getenv("LLMS_NO_AVX512");
    if (no512 && *no512 && strcmp(no512, "0") != 0)
        simd_avx512 = false;
    /* AVX512_BF16 is CPUID leaf 7 subleaf 1, EAX bit 5 (not every compiler's
     * __builtin_cpu_supports knows it); LLMS_NO_AVX512_BF16 measures the shift-widening
     * BF16 kernel on a CPU that has it */
    const char *nobf16 = getenv("LLMS_NO_AVX512_BF16");
    simd_avx512_bf16 = simd_avx512 && __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) &&
                       (eax & (1u << 5)) && !(nobf16 && *nobf16 && strcmp(nobf16, "0") != 0);
    const char *f16bf16 = getenv("LLMS_F16_AS_BF16");
    simd_f16_as_bf16 = simd_avx512_bf16 && f16bf16 && *f16bf16 && strcmp(f16bf16, "0") != 0;
#endif
}

static bool use_avx512(void)
{
    pthread_once(&simd_once, simd_detect);
    return simd_avx512;
}

static bool use_avx512_bf16(void)
{
    pthread_once(&simd_once, simd_detect);
    return simd_avx512_bf16;
}

static bool use_avx2(void)
{
    pthread_once(&simd_once, simd_detect);
    return simd_avx2;
}

bool quant_bf16_rounds_activation(void)
{
    return use_avx512_bf16();
}

bool quant_avx512_enabled(void)
{
    return use_avx512();
}

bool quant_f16_rounds_activation(int64_t n)
{
    return use_avx512() && n > QUANT_F16_ROUND_MIN_N && n <= QUANT_F16_ROUND_MAX_N;
}

bool quant_f16_prefill_as_bf16(void)
{
    pthread_once(&simd_once, simd_detect);
    return simd_f16_as_bf16;
}

const char *quant_simd_name(void)
{
    return use_avx2() ? "avx2" : "scalar";
}

/* ---- dequantization ---- */

static void dequant_q8_0(const qblock_q8_0 *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += QB_32) {
        float d = qb_f16_to_f32(b[i].d);
        for (int j = 0; j < QB_32; j++)
            y[j] = d * (float)b[i].qs[j];
    }
}

static void dequant_q4_0(const qblock_q4_0 *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += QB_32) {
        float d = qb_f16_to_f32(b[i].d);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)((b[i].qs[j] & 0xF) - 8);
            y[j + 16] = d * (float)((b[i].qs[j] >> 4) - 8);
        }
    }
}

static void dequant_q4_1(const qblock_q4_1 *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += QB_32) {
        float d = qb_f16_to_f32(b[i].d), m = qb_f16_to_f32(b[i].m);
        for (int j = 0; j < QB_32; j++)
            y[j] = d * (float)qb_nibble(b[i].qs, j) + m;
    }
}

static void dequant_q5_0(const qblock_q5_0 *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += QB_32) {
        float d = qb_f16_to_f32(b[i].d);
        for (int j = 0; j < QB_32; j++)
            y[j] = d * (float)(qb_q5(b[i].qh, b[i].qs, j) - 16);
    }
}

static void dequant_q5_1(const qblock_q5_1 *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += QB_32) {
        float d = qb_f16_to_f32(b[i].d), m = qb_f16_to_f32(b[i].m);
        for (int j = 0; j < QB_32; j++)
            y[j] = d * (float)qb_q5(b[i].qh, b[i].qs, j) + m;
    }
}

static void dequant_iq4_nl(const qblock_iq4_nl *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += QB_32) {
        float d = qb_f16_to_f32(b[i].d);
        for (int j = 0; j < QB_32; j++)
            y[j] = d * (float)qb_iq4_grid[qb_nibble(b[i].qs, j)];
    }
}

static void dequant_mxfp4(const qblock_mxfp4 *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += QB_32) {
        float d = qb_e8m0_half(b[i].e);
        for (int j = 0; j < QB_32; j++)
            y[j] = d * (float)qb_mxfp4_grid[qb_nibble(b[i].qs, j)];
    }
}

static void dequant_iq4_xs(const qblock_iq4_xs *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++) {
        float d = qb_f16_to_f32(b[i].d);
        for (int k = 0; k < 8; k++, y += 32) {
            int ls = qb_iq4_xs_scale(&b[i], k);
            for (int j = 0; j < 32; j++)
                y[j] = d * (float)(ls * qb_iq4_grid[qb_nibble(b[i].qs + 16 * k, j)]);
        }
    }
}

static void dequant_q4_k(const qblock_q4_k *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++) {
        float d = qb_f16_to_f32(b[i].d), dmin = qb_f16_to_f32(b[i].dmin);
        uint64_t sc, m;
        qb_unpack_k_scales(b[i].scales, &sc, &m);
        const uint8_t *q = b[i].qs;
        for (int g = 0; g < 4; g++, q += 32, y += 64) {
            float d1 = d * qb_k_byte(sc, 2 * g), m1 = dmin * qb_k_byte(m, 2 * g);
            float d2 = d * qb_k_byte(sc, 2 * g + 1), m2 = dmin * qb_k_byte(m, 2 * g + 1);
            for (int l = 0; l < 32; l++) {
                y[l] = d1 * (float)(q[l] & 0xF) - m1;
                y[l + 32] = d2 * (float)(q[l] >> 4) - m2;
            }
        }
    }
}

static void dequant_q5_k(const qblock_q5_k *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++) {
        float d = qb_f16_to_f32(b[i].d), dmin = qb_f16_to_f32(b[i].dmin);
        uint64_t sc, m;
        qb_unpack_k_scales(b[i].scales, &sc, &m);
        const uint8_t *q = b[i].qs, *qh = b[i].qh;
        for (int g = 0; g < 4; g++, q += 32, y += 64) {
            float d1 = d * qb_k_byte(sc, 2 * g), m1 = dmin * qb_k_byte(m, 2 * g);
            float d2 = d * qb_k_byte(sc, 2 * g + 1), m2 = dmin * qb_k_byte(m, 2 * g + 1);
            for (int l = 0; l < 32; l++) {
                int lo = (q[l] & 0xF) | (((qh[l] >> (2 * g)) & 1) << 4);
                int hi = (q[l] >> 4) | (((qh[l] >> (2 * g + 1)) & 1) << 4);
                y[l] = d1 * (float)lo - m1;
                y[l + 32] = d2 * (float)hi - m2;
            }
        }
    }
}

static void dequant_q6_k(const qblock_q6_k *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++) {
        float d = qb_f16_to_f32(b[i].d);
        for (int h = 0; h < 2; h++, y += 128) {
            const uint8_t *ql = b[i].ql + 64 * h, *qh = b[i].qh + 32 * h;
            const int8_t *sc = b[i].scales + 8 * h;
            for (int l = 0; l < 32; l++) {
                int s = l / 16;
                int q1 = (ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4);
                int q2 = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
                int q3 = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                int q4 = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
                y[l] = d * (float)sc[s] * (float)(q1 - 32);
                y[l + 32] = d * (float)sc[s + 2] * (float)(q2 - 32);
                y[l + 64] = d * (float)sc[s + 4] * (float)(q3 - 32);
                y[l + 96] = d * (float)sc[s + 6] * (float)(q4 - 32);
            }
        }
    }
}

/* Element 128 h + 32 j + l of a Q3_K or Q2_K super-block: its 2 low bits. */
static inline int q2_bits(const uint8_t qs[64], int e)
{
    int h = e / 128, j = e % 128 / 32, l = e % 32;
    return (qs[32 * h + l] >> (2 * j)) & 3;
}

/* Element e of a Q3_K super-block as the signed value q - 4, in [-4, 3]. */
static inline int q3_value(const qblock_q3_k *b, int e)
{
    int h = e / 128, j = e % 128 / 32, l = e % 32;
    return q2_bits(b->qs, e) + 4 * ((b->hmask[l] >> (4 * h + j)) & 1) - 4;
}

static void dequant_q3_k(const qblock_q3_k *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += QB_256) {
        float d = qb_f16_to_f32(b[i].d);
        int8_t sc[16];
        qb_q3_k_scales(b[i].scales, sc);
        for (int e = 0; e < QB_256; e++)
            y[e] = d * (float)(sc[e / 16] * q3_value(&b[i], e));
    }
}

static void dequant_q2_k(const qblock_q2_k *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += QB_256) {
        float d = qb_f16_to_f32(b[i].d), dmin = qb_f16_to_f32(b[i].dmin);
        for (int k = 0; k < 16; k++) {
            float dl = d * (float)(b[i].scales[k] & 0xF), ml = dmin * (float)(b[i].scales[k] >> 4);
            for (int l = 0; l < 16; l++)
                y[16 * k + l] = dl * (float)q2_bits(b[i].qs, 16 * k + l) - ml;
        }
    }
}

static void dequant_q8_k(const qblock_q8_k *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += QB_256)
        for (int j = 0; j < QB_256; j++)
            y[j] = b[i].d * (float)b[i].qs[j];
}

void quant_dequantize_row_scalar(uint32_t t, const void *src, float *dst, int64_t n)
{
    switch (t) {
    case QTYPE_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        break;
    case QTYPE_F16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = qb_f16_to_f32(qb_load_u16(src, i));
        break;
    case QTYPE_BF16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = quant_bf16_to_f32(qb_load_u16(src, i));
        break;
    case QTYPE_Q8_0:
        dequant_q8_0(src, dst, n / QB_32);
        break;
    case QTYPE_Q4_0:
        dequant_q4_0(src, dst, n / QB_32);
        break;
    case QTYPE_Q4_1:
        dequant_q4_1(src, dst, n / QB_32);
        break;
    case QTYPE_Q5_0:
        dequant_q5_0(src, dst, n / QB_32);
        break;
    case QTYPE_Q5_1:
        dequant_q5_1(src, dst, n / QB_32);
        break;
    case QTYPE_IQ4_NL:
        dequant_iq4_nl(src, dst, n / QB_32);
        break;
    case QTYPE_MXFP4:
        dequant_mxfp4(src, dst, n / QB_32);
        break;
    case QTYPE_IQ4_XS:
        dequant_iq4_xs(src, dst, n / QB_256);
        break;
    case QTYPE_Q4_K:
        dequant_q4_k(src, dst, n / QB_256);
        break;
    case QTYPE_Q5_K:
        dequant_q5_k(src, dst, n / QB_256);
        break;
    case QTYPE_Q6_K:
        dequant_q6_k(src, dst, n / QB_256);
        break;
    case QTYPE_Q3_K:
        dequant_q3_k(src, dst, n / QB_256);
        break;
    case QTYPE_Q2_K:
        dequant_q2_k(src, dst, n / QB_256);
        break;
    case QTYPE_Q8_K:
        dequant_q8_k(src, dst, n / QB_256);
        break;
    default:
        if (quant_iq_type(t))
            quant_iq_dequantize(t, src, dst, n / QB_256);
        break;
    }
}

void quant_dequantize_row(uint32_t t, const void *src, float *dst, int64_t n)
{
#if QUANT_HAVE_AVX2
    if (use_avx2()) {
        quant_avx2_dequantize_row(t, src, dst, n);
        return;
    }
#endif
    quant_dequantize_row_scalar(t, src, dst, n);
}

/* ---- quantization ---- */

static int clampi(int v, int lo, int hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* v rounded to the nearest integer (ties to even) and clamped to [lo, hi]; NaN gives lo.
 * Adding and removing 1.5 * 2^23 rounds in the FPU's default mode without a libm call,
 * which matters because activations are quantized on every token. */
static int round_clamp(float v, int lo, int hi)
{
    if (!(v >= (float)lo))
        return lo;
    if (v > (float)hi)
        return hi;
    return (int)((v + 0x1.8p23f) - 0x1.8p23f);
}

/* The value of largest magnitude, with its sign. */
static float signed_absmax(const float *x, int n)
{
    float best = 0, amax = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            best = x[i];
        }
    return best;
}

static void quantize_q8_0(const float *x, qblock_q8_0 *b, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += QB_32) {
        float d = fabsf(signed_absmax(x, QB_32)) / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
        b[i].d = quant_f32_to_f16(d);
        for (int j = 0; j < QB_32; j++)
            b[i].qs[j] = (int8_t)round_clamp(x[j] * id, -127, 127);
    }
}

static void quantize_q4_0(const float *x, qblock_q4_0 *b, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += QB_32) {
        /* The largest-magnitude value maps to nibble 0 (-8), the one extra negative step. */
        float d = signed_absmax(x, QB_32) / -8.0f, id = d != 0 ? 1.0f / d : 0.0f;
        b[i].d = quant_f32_to_f16(d);
        for (int j = 0; j < 16; j++) {
            int lo = clampi((int)floorf(x[j] * id + 8.5f), 0, 15);
            int hi = clampi((int)floorf(x[j + 16] * id + 8.5f), 0, 15);
            b[i].qs[j] = (uint8_t)(lo | (hi << 4));
        }
    }
}

/*
 * Fits x[0..n) (n <= 32) ≈ scale * q - min with integers q in [0, nmax] and scale >= 0; with
 * min_positive also min >= 0 (the K-quant sub-block model: its offset never exceeds
 * zero), without it any min (Q4_1, Q5_1). Tries grid spacings around (max - min) / nmax;
 * for each, rounds, then solves least squares for scale and offset given those q, and
 * keeps the pair with the smallest squared error.
 */
static void fit_scale_min(const float *x, int n, int nmax, bool min_positive, float *scale,
                          float *min)
{
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) {
        lo = fminf(lo, x[i]);
        hi = fmaxf(hi, x[i]);
    }
    if (min_positive)
        lo = fminf(lo, 0.0f);
    *scale = (hi - lo) / (float)nmax;
    *min = -lo;
    if (!(hi > lo))
        return;
    double best_err = INFINITY;
    uint8_t q[QB_32]; /* (n) the rounding of one trial */
    for (int k = -10; k <= 10; k++) {
        float iscale = ((float)nmax + 0.1f * (float)k) / (hi - lo);
        double sq = 0, sqq = 0, sx = 0, sqx = 0;
        for (int i = 0; i < n; i++) {
            q[i] = (uint8_t)round_clamp((x[i] - lo) * iscale, 0, nmax);
            sq += q[i];
            sqq += (double)q[i] * q[i];
            sx += x[i];
            sqx += (double)q[i] * x[i];
        }
        double den = n * sqq - sq * sq;
        if (den <= 0)
            continue;
        double a = (n * sqx - sq * sx) / den, b = (sx - a * sq) / n;
        if (min_positive && b > 0) {
            b = 0;
            a = sqx / sqq;
        }
        if (a <= 0)
            continue;
        double err = 0;
        for (int i = 0; i < n; i++) {
            double e = a * q[i] + b - x[i];
            err += e * e;
        }
        if (err < best_err) {
            best_err = err;
            *scale = (float)a;
            *min = (float)-b;
        }
    }
}

/* Q4_1 and Q5_1 (nmax 15 or 31): x ≈ d * q + m with any m, the values rounded with d and
 * m as stored; q[32] gets them. */
static void quantize_affine32(const float *x, int nmax, uint16_t *d_out, uint16_t *m_out,
                              uint8_t q[QB_32])
{
    float scale, min;
    fit_scale_min(x, QB_32, nmax, false, &scale, &min);
    *d_out = quant_f32_to_f16(scale);
    *m_out = quant_f32_to_f16(-min);
    float d = qb_f16_to_f32(*d_out), m = qb_f16_to_f32(*m_out), id = d > 0 ? 1.0f / d : 0.0f;
    for (int j = 0; j < QB_32; j++)
        q[j] = (uint8_t)round_clamp((x[j] - m) * id, 0, nmax);
}

/* The nibbles of 32 values below 16, as Q4_0 packs them. */
static void pack_nibbles(const uint8_t q[QB_32], uint8_t qs[16])
{
    for (int j = 0; j < 16; j++)
        qs[j] = (uint8_t)(q[j] | (q[j + 16] << 4));
}

static void quantize_q4_1(const float *x, qblock_q4_1 *b, int64_t nb)
{
    uint8_t q[QB_32];
    for (int64_t i = 0; i < nb; i++, x += QB_32) {
        uint16_t d, m;
        quantize_affine32(x, 15, &d, &m, q);
        b[i].d = d;
        b[i].m = m;
        pack_nibbles(q, b[i].qs);
    }
}

/* The nibbles and fifth bits of 32 5-bit values. */
static void pack_q5(const uint8_t q[QB_32], uint8_t qh[4], uint8_t qs[16])
{
    uint32_t h = 0;
    for (int j = 0; j < 16; j++)
        qs[j] = (uint8_t)((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
    for (int j = 0; j < QB_32; j++)
        h |= (uint32_t)(q[j] >> 4) << j;
    memcpy(qh, &h, 4);
}

static void quantize_q5_1(const float *x, qblock_q5_1 *b, int64_t nb)
{
    uint8_t q[QB_32];
    for (int64_t i = 0; i < nb; i++, x += QB_32) {
        uint16_t d, m;
        quantize_affine32(x, 31, &d, &m, q);
        b[i].d = d;
        b[i].m = m;
        pack_q5(q, b[i].qh, b[i].qs);
    }
}

/*
 * The shared part of Q4_K and Q5_K: per-sub-block scale and min, quantized to 6 bits
 * against f16 super-block factors, then the values q[256] in [0, nmax] re-rounded with
 * the scales as stored, so what a reader dequantizes is what the rounding aimed at.
 */
static void quantize_k_affine(const float *x, int nmax, uint16_t *d_out, uint16_t *dmin_out,
                              uint8_t scales[12], uint8_t q[QB_256])
{
    float sc[8], mn[8], max_sc = 0, max_mn = 0;
    for (int j = 0; j < 8; j++) {
        fit_scale_min(x + 32 * j, 32, nmax, true, &sc[j], &mn[j]);
        max_sc = fmaxf(max_sc, sc[j]);
        max_mn = fmaxf(max_mn, mn[j]);
    }
    *d_out = quant_f32_to_f16(max_sc / 63.0f);
    *dmin_out = quant_f32_to_f16(max_mn / 63.0f);
    float d = qb_f16_to_f32(*d_out), dmin = qb_f16_to_f32(*dmin_out);
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; j++) {
        ls[j] = (uint8_t)(d > 0 ? round_clamp(sc[j] / d, 0, 63) : 0);
        lm[j] = (uint8_t)(dmin > 0 ? round_clamp(mn[j] / dmin, 0, 63) : 0);
    }
    for (int j = 0; j < 4; j++) {
        scales[j] = (uint8_t)(ls[j] | ((ls[j + 4] >> 4) << 6));
        scales[j + 4] = (uint8_t)(lm[j] | ((lm[j + 4] >> 4) << 6));
        scales[j + 8] = (uint8_t)((ls[j + 4] & 0xF) | ((lm[j + 4] & 0xF) << 4));
    }
    for (int j = 0; j < 8; j++) {
        float s = d * ls[j], m = dmin * lm[j], is = s > 0 ? 1.0f / s : 0.0f;
        for (int i = 0; i < 32; i++)
            q[32 * j + i] = (uint8_t)round_clamp((x[32 * j + i] + m) * is, 0, nmax);
    }
}

static void quantize_q4_k(const float *x, qblock_q4_k *b, int64_t nb)
{
    uint8_t q[QB_256];
    for (int64_t i = 0; i < nb; i++, x += QB_256) {
        uint16_t d, dmin;
        quantize_k_affine(x, 15, &d, &dmin, b[i].scales, q);
        b[i].d = d;
        b[i].dmin = dmin;
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++)
                b[i].qs[32 * g + l] = (uint8_t)(q[64 * g + l] | (q[64 * g + 32 + l] << 4));
    }
}

static void quantize_q5_k(const float *x, qblock_q5_k *b, int64_t nb)
{
    uint8_t q[QB_256];
    for (int64_t i = 0; i < nb; i++, x += QB_256) {
        uint16_t d, dmin;
        quantize_k_affine(x, 31, &d, &dmin, b[i].scales, q);
        b[i].d = d;
        b[i].dmin = dmin;
        memset(b[i].qh, 0, sizeof b[i].qh);
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++) {
                int lo = q[64 * g + l], hi = q[64 * g + 32 + l];
                b[i].qs[32 * g + l] = (uint8_t)((lo & 0xF) | ((hi & 0xF) << 4));
                b[i].qh[l] |= (uint8_t)(((lo >> 4) << (2 * g)) | ((hi >> 4) << (2 * g + 1)));
            }
    }
}

/* Fits x[0..n) (n <= 32) ≈ scale * q with integers q in [-nneg, nneg - 1]: tries spacings
 * that map the largest-magnitude value near -nneg (the one extra negative step), refits the
 * scale by least squares for each rounding, and keeps the one with the smallest squared
 * error. */
static float fit_scale_sym(const float *x, int n, int nneg)
{
    float mx = signed_absmax(x, n), best = 0;
    if (mx == 0)
        return 0;
    double best_err = INFINITY;
    int8_t q[QB_32]; /* (n) the rounding of one trial */
    for (int k = -9; k <= 9; k++) {
        float iscale = -((float)nneg + 0.1f * (float)k) / mx;
        double sqq = 0, sqx = 0;
        for (int i = 0; i < n; i++) {
            q[i] = (int8_t)round_clamp(x[i] * iscale, -nneg, nneg - 1);
            sqq += (double)q[i] * q[i];
            sqx += (double)q[i] * x[i];
        }
        if (sqq == 0)
            continue;
        double a = sqx / sqq, err = 0;
        for (int i = 0; i < n; i++) {
            double e = a * q[i] - x[i];
            err += e * e;
        }
        if (err < best_err) {
            best_err = err;
            best = (float)a;
        }
    }
    return best;
}

static void quantize_q6_k(const float *x, qblock_q6_k *b, int64_t nb)
{
    uint8_t q[QB_256];
    for (int64_t i = 0; i < nb; i++, x += QB_256) {
        float sc[16];
        for (int j = 0; j < 16; j++)
            sc[j] = fit_scale_sym(x + 16 * j, 16, 32);
        float mx = signed_absmax(sc, 16);
        /* The largest-magnitude scale maps to -128, the one extra negative step of int8. */
        b[i].d = quant_f32_to_f16(mx / -128.0f);
        float d = qb_f16_to_f32(b[i].d);
        for (int j = 0; j < 16; j++) {
            b[i].scales[j] = (int8_t)(d != 0 ? round_clamp(sc[j] / d, -128, 127) : 0);
            float s = d * b[i].scales[j], is = s != 0 ? 1.0f / s : 0.0f;
            for (int l = 0; l < 16; l++)
                q[16 * j + l] = (uint8_t)(round_clamp(x[16 * j + l] * is, -32, 31) + 32);
        }
        for (int h = 0; h < 2; h++) {
            uint8_t *ql = b[i].ql + 64 * h, *qh = b[i].qh + 32 * h;
            const uint8_t *qq = q + 128 * h;
            for (int l = 0; l < 32; l++) {
                int q1 = qq[l], q2 = qq[l + 32], q3 = qq[l + 64], q4 = qq[l + 96];
                ql[l] = (uint8_t)((q1 & 0xF) | ((q3 & 0xF) << 4));
                ql[l + 32] = (uint8_t)((q2 & 0xF) | ((q4 & 0xF) << 4));
                qh[l] = (uint8_t)((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
            }
        }
    }
}

/* Q5_0: a least-squares scale for q in [-16, 15], the values rounded with it as stored. */
static void quantize_q5_0(const float *x, qblock_q5_0 *b, int64_t nb)
{
    uint8_t q[QB_32];
    for (int64_t i = 0; i < nb; i++, x += QB_32) {
        b[i].d = quant_f32_to_f16(fit_scale_sym(x, QB_32, 16));
        float d = qb_f16_to_f32(b[i].d), id = d != 0 ? 1.0f / d : 0.0f;
        for (int j = 0; j < QB_32; j++)
            q[j] = (uint8_t)(round_clamp(x[j] * id, -16, 15) + 16);
        pack_q5(q, b[i].qh, b[i].qs);
    }
}

/* The midpoints between adjacent points of qb_iq4_grid (half-integers, exact in f32),
 * written out: computed in the search they cost it a third of its speed. test_quant's
 * iq4_nl_picks_the_nearest_grid_point holds them to the grid. */
static const float iq4_midpoint[15] = {
    -115.5f, -93.5f, -74.0f, -57.0f, -42.0f, -28.5f, -16.0f, -4.5f,
    7.0f,    19.0f,  31.5f,  45.5f,  61.0f,  79.0f,  101.0f,
};

/* The grid index nearest v, the lower one on a tie: the count of midpoints below v, found
 * by a binary search without branches (it is the inner loop of the IQ4 scale search). */
static int iq4_nearest(float v)
{
    int k = 0;
    for (int half = 8; half > 0; half /= 2)
        k += half * (v > iq4_midpoint[k + half - 1]);
    return k;
}

/*
 * Fits x[0..n) (n <= 32) ≈ scale * grid value on the non-linear grid: tries spacings that
 * map the largest-magnitude value near either end of the grid (-127 or 113, so either
 * sign of the scale), picks each value's nearest grid point, refits the scale by least
 * squares for those points, and keeps the fit with the smallest squared error.
 */
static float fit_scale_iq4(const float *x, int n)
{
    float mx = signed_absmax(x, n), best = 0;
    if (mx == 0)
        return 0;
    double best_err = INFINITY;
    uint8_t idx[QB_32];
    for (int end = 0; end < 2; end++)
        for (int k = -8; k <= 8; k++) {
            float g = (float)(end ? qb_iq4_grid[15] : qb_iq4_grid[0]) + (float)k;
            float is = g / mx;
            double sqq = 0, sqx = 0;
            for (int i = 0; i < n; i++) {
                idx[i] = (uint8_t)iq4_nearest(x[i] * is);
                double q = qb_iq4_grid[idx[i]];
                sqq += q * q;
                sqx += q * x[i];
            }
            double a = sqx / sqq, err = 0; /* the grid has no 0: sqq > 0 */
            for (int i = 0; i < n; i++) {
                double e = a * qb_iq4_grid[idx[i]] - x[i];
                err += e * e;
            }
            if (err < best_err) {
                best_err = err;
                best = (float)a;
            }
        }
    return best;
}

/* IQ4_NL: the block's scale fitted on the grid, then each value's nearest grid point for
 * the scale as stored. */
static void quantize_iq4_nl(const float *x, qblock_iq4_nl *b, int64_t nb)
{
    uint8_t q[QB_32];
    for (int64_t i = 0; i < nb; i++, x += QB_32) {
        b[i].d = quant_f32_to_f16(fit_scale_iq4(x, QB_32));
        float d = qb_f16_to_f32(b[i].d), id = d != 0 ? 1.0f / d : 0.0f;
        for (int j = 0; j < QB_32; j++)
            q[j] = (uint8_t)iq4_nearest(x[j] * id);
        pack_nibbles(q, b[i].qs);
    }
}

/* MXFP4, as llama.cpp's reference quantizer and the OCP MX spec choose: the shared
 * exponent floor(log2(absmax)) - 2 (E2M1's largest exponent), so that absmax / scale lies
 * in [4, 8) and values past 6 times the scale saturate to 6; each element the nearest of
 * the grid's values times the half scale, the lowest code on ties (so +0, never -0). The
 * exponent is kept within E8M0's finite range [0, 254]. */
static void quantize_mxfp4(const float *x, qblock_mxfp4 *b, int64_t nb)
{
    uint8_t q[QB_32];
    for (int64_t i = 0; i < nb; i++, x += QB_32) {
        float amax = 0.0f;
        for (int j = 0; j < QB_32; j++)
            amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        int e = amax > 0.0f ? (int)floorf(log2f(amax)) - 2 + 127 : 0;
        b[i].e = (uint8_t)(e < 0 ? 0 : e > 254 ? 254 : e);
        float d = qb_e8m0_half(b[i].e);
        for (int j = 0; j < QB_32; j++) {
            int best = 0;
            float best_err = fabsf((float)qb_mxfp4_grid[0] * d - x[j]);
            for (int k = 1; k < 16; k++) {
                float err = fabsf((float)qb_mxfp4_grid[k] * d - x[j]);
                if (err < best_err) {
                    best = k;
                    best_err = err;
                }
            }
            q[j] = (uint8_t)best;
        }
        pack_nibbles(q, b[i].qs);
    }
}

/* IQ4_XS: each sub-block's scale fitted on the grid, the largest-magnitude one mapped to
 * -32 (the extra negative step of the 6-bit scales) by the f16 super-block factor, then
 * each value's nearest grid point for its scale as stored. */
static void quantize_iq4_xs(const float *x, qblock_iq4_xs *b, int64_t nb)
{
    uint8_t q[QB_32];
    for (int64_t i = 0; i < nb; i++, x += QB_256) {
        float sc[8];
        for (int k = 0; k < 8; k++)
            sc[k] = fit_scale_iq4(x + 32 * k, 32);
        b[i].d = quant_f32_to_f16(signed_absmax(sc, 8) / -32.0f);
        float d = qb_f16_to_f32(b[i].d);
        b[i].scales_h = 0;
        memset(b[i].scales_l, 0, sizeof b[i].scales_l);
        for (int k = 0; k < 8; k++) {
            int l = d != 0 ? round_clamp(sc[k] / d, -32, 31) : 0, ls = l + 32;
            b[i].scales_l[k / 2] |= (uint8_t)((ls & 0xF) << (4 * (k % 2)));
            b[i].scales_h |= (uint16_t)((ls >> 4) << (2 * k));
            float s = d * (float)l, is = s != 0 ? 1.0f / s : 0.0f;
            for (int j = 0; j < 32; j++)
                q[j] = (uint8_t)iq4_nearest(x[32 * k + j] * is);
            pack_nibbles(q, b[i].qs + 16 * k);
        }
    }
}

/* Q3_K: each sub-block's scale fitted alone, the largest-magnitude one mapped to -32 (the
 * extra negative step of the 6-bit scales) by the f16 super-block factor, then the values
 * rounded with the scales as stored. */
static void quantize_q3_k(const float *x, qblock_q3_k *b, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += QB_256) {
        float sc[16];
        for (int j = 0; j < 16; j++)
            sc[j] = fit_scale_sym(x + 16 * j, 16, 4);
        b[i].d = quant_f32_to_f16(signed_absmax(sc, 16) / -32.0f);
        float d = qb_f16_to_f32(b[i].d);
        uint8_t ls[16];
        memset(b[i].hmask, 0, sizeof b[i].hmask);
        memset(b[i].qs, 0, sizeof b[i].qs);
        for (int j = 0; j < 16; j++) {
            int l = d != 0 ? round_clamp(sc[j] / d, -32, 31) : 0;
            ls[j] = (uint8_t)(l + 32);
            float s = d * (float)l, is = s != 0 ? 1.0f / s : 0.0f;
            for (int k = 0; k < 16; k++) {
                int e = 16 * j + k, h = e / 128, g = e % 128 / 32, p = e % 32;
                int q = round_clamp(x[e] * is, -4, 3) + 4;
                b[i].qs[32 * h + p] |= (uint8_t)((q & 3) << (2 * g));
                b[i].hmask[p] |= (uint8_t)((q >> 2) << (4 * h + g));
            }
        }
        for (int k = 0; k < 8; k++)
            b[i].scales[k] = (uint8_t)((ls[k] & 0xF) | ((ls[k + 8] & 0xF) << 4));
        for (int k = 0; k < 4; k++)
            b[i].scales[8 + k] = (uint8_t)((ls[k] >> 4) | ((ls[k + 4] >> 4) << 2) |
                                           ((ls[k + 8] >> 4) << 4) | ((ls[k + 12] >> 4) << 6));
    }
}

/* Q2_K: each sub-block's scale and min fitted as Q4_K's, both quantized to 4 bits against
 * f16 super-block factors, then the values rounded with them as stored. */
static void quantize_q2_k(const float *x, qblock_q2_k *b, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += QB_256) {
        float sc[16], mn[16], max_sc = 0, max_mn = 0;
        for (int j = 0; j < 16; j++) {
            fit_scale_min(x + 16 * j, 16, 3, true, &sc[j], &mn[j]);
            max_sc = fmaxf(max_sc, sc[j]);
            max_mn = fmaxf(max_mn, mn[j]);
        }
        b[i].d = quant_f32_to_f16(max_sc / 15.0f);
        b[i].dmin = quant_f32_to_f16(max_mn / 15.0f);
        float d = qb_f16_to_f32(b[i].d), dmin = qb_f16_to_f32(b[i].dmin);
        memset(b[i].qs, 0, sizeof b[i].qs);
        for (int j = 0; j < 16; j++) {
            int ls = d > 0 ? round_clamp(sc[j] / d, 0, 15) : 0;
            int lm = dmin > 0 ? round_clamp(mn[j] / dmin, 0, 15) : 0;
            b[i].scales[j] = (uint8_t)(ls | (lm << 4));
            float s = d * (float)ls, m = dmin * (float)lm, is = s > 0 ? 1.0f / s : 0.0f;
            for (int k = 0; k < 16; k++) {
                int e = 16 * j + k, h = e / 128, g = e % 128 / 32, p = e % 32;
                int q = round_clamp((x[e] + m) * is, 0, 3);
                b[i].qs[32 * h + p] |= (uint8_t)(q << (2 * g));
            }
        }
    }
}

static void quantize_q8_k(const float *x, qblock_q8_k *b, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += QB_256) {
        float d = fabsf(signed_absmax(x, QB_256)) / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
        b[i].d = d;
        for (int j = 0; j < QB_256; j++)
            b[i].qs[j] = (int8_t)round_clamp(x[j] * id, -127, 127);
        for (int j = 0; j < 16; j++) {
            int s = 0;
            for (int l = 0; l < 16; l++)
                s += b[i].qs[16 * j + l];
            b[i].bsums[j] = (int16_t)s;
        }
    }
}

void quant_quantize_row(uint32_t t, const float *src, void *dst, int64_t n)
{
    switch (t) {
    case QTYPE_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        break;
    case QTYPE_F16:
        for (int64_t i = 0; i < n; i++)
            qb_store_u16(dst, i, quant_f32_to_f16(src[i]));
        break;
    case QTYPE_BF16:
        for (int64_t i = 0; i < n; i++)
            qb_store_u16(dst, i, quant_f32_to_bf16(src[i]));
        break;
    case QTYPE_Q8_0:
        quantize_q8_0(src, dst, n / QB_32);
        break;
    case QTYPE_Q4_0:
        quantize_q4_0(src, dst, n / QB_32);
        break;
    case QTYPE_Q4_1:
        quantize_q4_1(src, dst, n / QB_32);
        break;
    case QTYPE_Q5_0:
        quantize_q5_0(src, dst, n / QB_32);
        break;
    case QTYPE_Q5_1:
        quantize_q5_1(src, dst, n / QB_32);
        break;
    case QTYPE_IQ4_NL:
        quantize_iq4_nl(src, dst, n / QB_32);
        break;
    case QTYPE_MXFP4:
        quantize_mxfp4(src, dst, n / QB_32);
        break;
    case QTYPE_IQ4_XS:
        quantize_iq4_xs(src, dst, n / QB_256);
        break;
    case QTYPE_Q4_K:
        quantize_q4_k(src, dst, n / QB_256);
        break;
    case QTYPE_Q5_K:
        quantize_q5_k(src, dst, n / QB_256);
        break;
    case QTYPE_Q6_K:
        quantize_q6_k(src, dst, n / QB_256);
        break;
    case QTYPE_Q3_K:
        quantize_q3_k(src, dst, n / QB_256);
        break;
    case QTYPE_Q2_K:
        quantize_q2_k(src, dst, n / QB_256);
        break;
    case QTYPE_Q8_K:
        quantize_q8_k(src, dst, n / QB_256);
        break;
    default:
        if (quant_iq_type(t))
            quant_iq_quantize(t, src, dst, n / QB_256);
        break;
    }
}

/* ---- dot products ---- */

uint32_t quant_dot_activation_type(uint32_t t)
{
    switch (t) {
    case QTYPE_Q8_0:
    case QTYPE_Q4_0:
    case QTYPE_Q4_1:
    case QTYPE_Q5_0:
    case QTYPE_Q5_1:
    case QTYPE_IQ4_NL:
    case QTYPE_MXFP4:
        return QTYPE_Q8_0;
    case QTYPE_Q2_K:
    case QTYPE_Q3_K:
    case QTYPE_Q4_K:
    case QTYPE_Q5_K:
    case QTYPE_Q6_K:
    case QTYPE_IQ4_XS:
        return QTYPE_Q8_K;
    default:
        return quant_iq_type(t) ? QTYPE_Q8_K : QTYPE_F32;
    }
}

void quant_prepare_activation(uint32_t act_type, const float *src, void *dst, int64_t n)
{
#if QUANT_HAVE_AVX2
    if (use_avx2() && (act_type == QTYPE_Q8_0 || act_type == QTYPE_Q8_K)) {
        quant_avx2_quantize_activation(act_type, src, dst, n);
        return;
    }
#endif
    quant_quantize_row(act_type, src, dst, n);
}

static float dot_q8_0(const qblock_q8_0 *x, const qblock_q8_0 *y, int64_t nb)
{
    float sum = 0;
    for (int64_t i = 0; i < nb; i++) {
        int s = 0;
        for (int j = 0; j < QB_32; j++)
            s += x[i].qs[j] * y[i].qs[j];
        sum += qb_f16_to_f32(x[i].d) * qb_f16_to_f32(y[i].d) * (float)s;
    }
    return sum;
}

static float dot_q4_0(const qblock_q4_0 *x, const qblock_q8_0 *y, int64_t nb)
{
    float sum = 0;
    for (int64_t i = 0; i < nb; i++) {
        int s = 0;
        for (int j = 0; j < 16; j++)
            s += ((x[i].qs[j] & 0xF) - 8) * y[i].qs[j] + ((x[i].qs[j] >> 4) - 8) * y[i].qs[j + 16];
        sum += qb_f16_to_f32(x[i].d) * qb_f16_to_f32(y[i].d) * (float)s;
    }
    return sum;
}

/* Q4_1 / Q5_1 (five: 5-bit values): d q a + m a per element, the second through the sum
 * of the block's activation quants; llama.cpp takes that sum as Q8_1 keeps it, d_a times
 * it rounded to f16, where this has the exact integer. */
static float dot_affine32(int five, const void *x, const qblock_q8_0 *y, int64_t nb)
{
    const size_t bytes = five ? sizeof(qblock_q5_1) : sizeof(qblock_q4_1);
    float sum = 0;
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *b = (const uint8_t *)x + (size_t)i * bytes;
        const qblock_q5_1 *x5 = (const void *)b;
        const qblock_q4_1 *x4 = (const void *)b;
        int s = 0, sa = 0;
        for (int j = 0; j < QB_32; j++) {
            int q = five ? qb_q5(x5->qh, x5->qs, j) : qb_nibble(x4->qs, j);
            s += q * y[i].qs[j];
            sa += y[i].qs[j];
        }
        /* d and m are where both structs keep them */
        float da = qb_f16_to_f32(y[i].d);
        sum += qb_f16_to_f32(x4->d) * da * (float)s + qb_f16_to_f32(x4->m) * da * (float)sa;
    }
    return sum;
}

static float dot_q5_0(const qblock_q5_0 *x, const qblock_q8_0 *y, int64_t nb)
{
    float sum = 0;
    for (int64_t i = 0; i < nb; i++) {
        int s = 0;
        for (int j = 0; j < QB_32; j++)
            s += (qb_q5(x[i].qh, x[i].qs, j) - 16) * y[i].qs[j];
        sum += qb_f16_to_f32(x[i].d) * qb_f16_to_f32(y[i].d) * (float)s;
    }
    return sum;
}

static float dot_iq4_nl(const qblock_iq4_nl *x, const qblock_q8_0 *y, int64_t nb)
{
    float sum = 0;
    for (int64_t i = 0; i < nb; i++) {
        int s = 0;
        for (int j = 0; j < QB_32; j++)
            s += qb_iq4_grid[qb_nibble(x[i].qs, j)] * y[i].qs[j];
        sum += qb_f16_to_f32(x[i].d) * qb_f16_to_f32(y[i].d) * (float)s;
    }
    return sum;
}

/* MXFP4 as llama.cpp's vec_dot: the integers of twice the E2M1 values, times half the
 * block's scale. */
static float dot_mxfp4(const qblock_mxfp4 *x, const qblock_q8_0 *y, int64_t nb)
{
    float sum = 0;
    for (int64_t i = 0; i < nb; i++) {
        int s = 0;
        for (int j = 0; j < QB_32; j++)
            s += qb_mxfp4_grid[qb_nibble(x[i].qs, j)] * y[i].qs[j];
        sum += qb_e8m0_half(x[i].e) * qb_f16_to_f32(y[i].d) * (float)s;
    }
    return sum;
}

static float dot_iq4_xs(const qblock_iq4_xs *x, const qblock_q8_k *y, int64_t nb)
{
    float sum = 0;
    for (int64_t i = 0; i < nb; i++) {
        int32_t sumi = 0;
        for (int k = 0; k < 8; k++) {
            int32_t s = 0;
            for (int j = 0; j < 32; j++)
                s += qb_iq4_grid[qb_nibble(x[i].qs + 16 * k, j)] * y[i].qs[32 * k + j];
            sumi += qb_iq4_xs_scale(&x[i], k) * s;
        }
        sum += qb_f16_to_f32(x[i].d) * y[i].d * (float)sumi;
    }
    return sum;
}

/* Q4_K / Q5_K: sum d*sc*q*a - dmin*m*a over a super-block, where the min term needs only
 * the activation's per-16 sums. */
static float k_affine_block(float d, float dmin, const uint8_t scales[12], const int32_t sums[8],
                            const qblock_q8_k *y)
{
    uint64_t sc, m;
    qb_unpack_k_scales(scales, &sc, &m);
    int32_t sumi = 0, summ = 0;
    for (int j = 0; j < 8; j++) {
        sumi += qb_k_byte(sc, j) * sums[j];
        summ += qb_k_byte(m, j) * (y->bsums[2 * j] + y->bsums[2 * j + 1]);
    }
    return y->d * (d * (float)sumi - dmin * (float)summ);
}

static float dot_q4_k(const qblock_q4_k *x, const qblock_q8_k *y, int64_t nb)
{
    float sum = 0;
    for (int64_t i = 0; i < nb; i++) {
        int32_t sums[8] = {0};
        const uint8_t *q = x[i].qs;
        const int8_t *a = y[i].qs;
        for (int g = 0; g < 4; g++, q += 32, a += 64)
            for (int l = 0; l < 32; l++) {
                sums[2 * g] += (q[l] & 0xF) * a[l];
                sums[2 * g + 1] += (q[l] >> 4) * a[l + 32];
            }
        sum += k_affine_block(qb_f16_to_f32(x[i].d), qb_f16_to_f32(x[i].dmin), x[i].scales, sums,
                              &y[i]);
    }
    return sum;
}

static float dot_q5_k(const qblock_q5_k *x, const qblock_q8_k *y, int64_t nb)
{
    float sum = 0;
    for (int64_t i = 0; i < nb; i++) {
        int32_t sums[8] = {0};
        const uint8_t *q = x[i].qs, *qh = x[i].qh;
        const int8_t *a = y[i].qs;
        for (int g = 0; g < 4; g++, q += 32, a += 64)
            for (int l = 0; l < 32; l++) {
                int lo = (q[l] & 0xF) | (((qh[l] >> (2 * g)) & 1) << 4);
                int hi = (q[l] >> 4) | (((qh[l] >> (2 * g + 1)) & 1) << 4);
                sums[2 * g] += lo * a[l];
                sums[2 * g + 1] += hi * a[l + 32];
            }
        sum += k_affine_block(qb_f16_to_f32(x[i].d), qb_f16_to_f32(x[i].dmin), x[i].scales, sums,
                              &y[i]);
    }
    return sum;
}

static float dot_q6_k(const qblock_q6_k *x, const qblock_q8_k *y, int64_t nb)
{
    float sum = 0;
    for (int64_t i = 0; i < nb; i++) {
        int32_t sums[16] = {0}; /* per 16-element sub-block, in element order */
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = x[i].ql + 64 * h, *qh = x[i].qh + 32 * h;
            const int8_t *a = y[i].qs + 128 * h;
            int32_t *s = sums + 8 * h;
            for (int l = 0; l < 32; l++) {
                int k = l / 16;
                int q1 = (ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4);
                int q2 = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
                int q3 = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                int q4 = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
                s[k] += (q1 - 32) * a[l];
                s[k + 2] += (q2 - 32) * a[l + 32];
                s[k + 4] += (q3 - 32) * a[l + 64];
                s[k + 6] += (q4 - 32) * a[l + 96];
            }
        }
        int32_t sumi = 0;
        for (int j = 0; j < 16; j++)
            sumi += x[i].scales[j] * sums[j];
        sum += qb_f16_to_f32(x[i].d) * y[i].d * (float)sumi;
    }
    return sum;
}

/* Q3_K: per sub-block of 16 the sum of (q - 4) a, as sum q a - 4 * bsum, scaled by sc - 32
 * in integers. */
static float dot_q3_k(const qblock_q3_k *x, const qblock_q8_k *y, int64_t nb)
{
    float sum = 0;
    for (int64_t i = 0; i < nb; i++) {
        int8_t sc[16];
        qb_q3_k_scales(x[i].scales, sc);
        int32_t sumi = 0;
        for (int k = 0; k < 16; k++) {
            int32_t s = 0;
            for (int l = 0; l < 16; l++)
                s += q3_value(&x[i], 16 * k + l) * y[i].qs[16 * k + l];
            sumi += sc[k] * s;
        }
        sum += qb_f16_to_f32(x[i].d) * y[i].d * (float)sumi;
    }
    return sum;
}

/* Q2_K: sum d sc q a - dmin m a per sub-block of 16, the min term through bsums. */
static float dot_q2_k(const qblock_q2_k *x, const qblock_q8_k *y, int64_t nb)
{
    float sum = 0;
    for (int64_t i = 0; i < nb; i++) {
        int32_t sumi = 0, summ = 0;
        for (int k = 0; k < 16; k++) {
            int32_t s = 0;
            for (int l = 0; l < 16; l++)
                s += q2_bits(x[i].qs, 16 * k + l) * y[i].qs[16 * k + l];
            sumi += (x[i].scales[k] & 0xF) * s;
            summ += (x[i].scales[k] >> 4) * y[i].bsums[k];
        }
        float d = qb_f16_to_f32(x[i].d), dmin = qb_f16_to_f32(x[i].dmin);
        sum += y[i].d * (d * (float)sumi - dmin * (float)summ);
    }
    return sum;
}

float quant_dot_scalar(uint32_t t, const void *weights, const void *activation, int64_t n)
{
    const float *a = activation;
    float sum = 0;
    switch (t) {
    case QTYPE_F32:
        for (int64_t i = 0; i < n; i++)
            sum += qb_load_f32(weights, i) * a[i];
        return sum;
    case QTYPE_F16:
        for (int64_t i = 0; i < n; i++)
            sum += qb_f16_to_f32(qb_load_u16(weights, i)) * a[i];
        return sum;
    case QTYPE_BF16:
        for (int64_t i = 0; i < n; i++)
            sum += quant_bf16_to_f32(qb_load_u16(weights, i)) * a[i];
        return sum;
    case QTYPE_Q8_0:
        return dot_q8_0(weights, activation, n / QB_32);
    case QTYPE_Q4_0:
        return dot_q4_0(weights, activation, n / QB_32);
    case QTYPE_Q4_1:
        return dot_affine32(0, weights, activation, n / QB_32);
    case QTYPE_Q5_0:
        return dot_q5_0(weights, activation, n / QB_32);
    case QTYPE_Q5_1:
        return dot_affine32(1, weights, activation, n / QB_32);
    case QTYPE_IQ4_NL:
        return dot_iq4_nl(weights, activation, n / QB_32);
    case QTYPE_MXFP4:
        return dot_mxfp4(weights, activation, n / QB_32);
    case QTYPE_IQ4_XS:
        return dot_iq4_xs(weights, activation, n / QB_256);
    case QTYPE_Q4_K:
        return dot_q4_k(weights, activation, n / QB_256);
    case QTYPE_Q5_K:
        return dot_q5_k(weights, activation, n / QB_256);
    case QTYPE_Q6_K:
        return dot_q6_k(weights, activation, n / QB_256);
    case QTYPE_Q3_K:
        return dot_q3_k(weights, activation, n / QB_256);
    case QTYPE_Q2_K:
        return dot_q2_k(weights, activation, n / QB_256);
    default:
        return quant_iq_type(t) ? quant_iq_dot(t, weights, activation, n / QB_256) : 0;
    }
}

float quant_dot(uint32_t t, const void *weights, const void *activation, int64_t n)
{
    float out;
    quant_dot_rows(t, weights, 0, 1, activation, n, &out);
    return out;
}

void quant_dot_rows(uint32_t t, const void *weights, size_t row_bytes, int64_t n_rows,
                    const void *activation, int64_t n, float *out)
{
#if QUANT_HAVE_AVX2
    /* the AVX-512 kernels take decode too: a row then sums in the same order alone as in
     * a batch, so batched sequences get the logits they would get alone */
    if (t == QTYPE_BF16 && use_avx512_bf16() &&
        quant_avx512_bf16_dot_rows(weights, row_bytes, n_rows, activation, n, out))
        return;
    if (t == QTYPE_F16 && quant_f16_rounds_activation(n) &&
        quant_avx512_f16_dot_rows_rounded(weights, row_bytes, n_rows, activation, 0, 1, n, out,
                                          0))
        return;
    if (use_avx512() &&
        quant_avx512_dot_rows_multi(t, weights, row_bytes, n_rows, activation, 0, 1, n, out, 0))
        return;
    if (use_avx2()) {
        quant_avx2_dot_rows(t, weights, row_bytes, n_rows, activation, n, out);
        return;
    }
#endif
    const uint8_t *w = weights;
    for (int64_t r = 0; r < n_rows; r++)
        out[r] = quant_dot_scalar(t, w + (size_t)r * row_bytes, activation, n);
}

bool quant_packed_kernel(uint32_t t)
{
#if QUANT_HAVE_AVX2
    return t == QTYPE_Q8_0 && use_avx512();
#else
    (void)t;
    return false;
#endif
}

size_t quant_packed_bytes(uint32_t act_type, int n_act, int64_t n)
{
#if QUANT_HAVE_AVX2
    if (act_type == QTYPE_Q8_0 && n_act >= QUANT_PACKED_MIN_ACT && n % QB_32 == 0 &&
        use_avx512())
        return quant_avx512_packed_bytes(n_act, n);
#else
    (void)act_type, (void)n_act, (void)n;
#endif
    return 0;
}

void quant_pack_activations(uint32_t act_type, const void *act, size_t act_stride, int n_act,
                            int64_t n, void *packed)
{
#if QUANT_HAVE_AVX2
    if (quant_packed_bytes(act_type, n_act, n))
        quant_avx512_pack_q8_0(act, act_stride, n_act, n, packed);
#else
    (void)act, (void)act_stride, (void)packed;
#endif
}

bool quant_dot_rows_packed(uint32_t t, const void *weights, size_t row_bytes, int64_t n_rows,
                           const void *packed, int n_act, int64_t n, float *out,
                           size_t out_stride)
{
#if QUANT_HAVE_AVX2
    if (quant_packed_bytes(quant_dot_activation_type(t), n_act, n))
        return quant_avx512_dot_rows_packed(t, weights, row_bytes, n_rows, packed, n_act, n, out,
                                            out_stride);
#else
    (void)weights, (void)row_bytes, (void)n_rows, (void)packed, (void)out, (void)out_stride;
#endif
    return false;
}

bool quant_repack_kernel(uint32_t t)
{
    return quant_packed_kernel(t);
}

/* The repacked kernels are reached only through matrices repacked where
 * quant_repack_kernel said yes, so these need no CPU check of their own. */
void quant_repack_rows(uint32_t t, const void *src, size_t row_bytes, int64_t n, void *dst)
{
#if QUANT_HAVE_AVX2
    if (t == QTYPE_Q8_0)
        quant_avx512_repack_q8_0(src, row_bytes, n, dst);
#else
    (void)t, (void)src, (void)row_bytes, (void)n, (void)dst;
#endif
}

size_t quant_repacked_act_bytes(int n_act, int64_t n)
{
#if QUANT_HAVE_AVX2
    return quant_avx512_repacked_act_bytes(n_act, n);
#else
    (void)n_act, (void)n;
    return 0;
#endif
}

void quant_repack_activations(const void *act, size_t act_stride, int a0, int a1, int n_act,
                              int64_t n, void *packed)
{
#if QUANT_HAVE_AVX2
    quant_avx512_repack_activations(act, act_stride, a0, a1, n_act, n, packed);
#else
    (void)act, (void)act_stride, (void)a0, (void)a1, (void)n_act, (void)n, (void)packed;
#endif
}

void quant_dot_rows_repacked(uint32_t t, const void *weights, size_t row_bytes, int64_t n_rows,
                             const void *packed, int n_act, int64_t n, float *out,
                             size_t out_stride)
{
#if QUANT_HAVE_AVX2
    if (t == QTYPE_Q8_0)
        quant_avx512_dot_rows_repacked(weights, row_bytes, n_rows, packed, n_act, n, out,
                                       out_stride);
#else
    (void)t, (void)weights, (void)row_bytes, (void)n_rows, (void)packed, (void)n_act, (void)n,
        (void)out, (void)out_stride;
#endif
}

void quant_dot_rows_multi(uint32_t t, const void *weights, size_t row_bytes, int64_t n_rows,
                          const void *act, size_t act_stride, int n_act, int64_t n,
                          float *out, size_t out_stride)
{
#if QUANT_HAVE_AVX2
    /* before the one-activation shortcut: a row gives each activation what it gives it
     * alone, so batched decode keeps the logits of decode alone */
    if (t == QTYPE_F16 && quant_f16_rounds_activation(n) &&
        quant_avx512_f16_dot_rows_rounded(weights, row_bytes, n_rows, act, act_stride, n_act, n,
                                          out, out_stride))
        return;
#endif
    /* one activation: the single-activation paths prefetch the rows ahead */
    if (n_act == 1) {
        quant_dot_rows(t, weights, row_bytes, n_rows, act, n, out);
        return;
    }
#if QUANT_HAVE_AVX2
    if (use_avx512() &&
        quant_avx512_dot_rows_multi(t, weights, row_bytes, n_rows, act, act_stride, n_act, n, out,
                                    out_stride))
        return;
    if (use_avx2() &&
        quant_avx2_dot_rows_multi(t, weights, row_bytes, n_rows, act, act_stride, n_act, n, out,
                                  out_stride))
        return;
#endif
    for (int a = 0; a < n_act; a++)
        quant_dot_rows(t, weights, row_bytes, n_rows, (const char *)act + (size_t)a * act_stride,
                       n, out + (size_t)a * out_stride);
}
