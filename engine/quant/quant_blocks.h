/*
 * quant_blocks.h — the GGUF block layouts, shared by the scalar kernels (quant.c) and the
 * AVX2 kernels (quant_avx2.c). Internal to the quant module.
 *
 * The structs are packed because GGUF rows of 34-, 18- or 210-byte blocks are only
 * 2-byte aligned and a file may place a tensor at any offset: packed members can be read
 * at any address. Multi-byte fields are little-endian, as on every host this builds for.
 */
#ifndef LLMS_QUANT_BLOCKS_H
#define LLMS_QUANT_BLOCKS_H

#include <stdint.h>
#include <string.h>

#include "engine/quant/quant.h"

#define QB_32 32   /* elements per Q8_0 / Q4_0 block */
#define QB_256 256 /* elements per K-quant super-block */

/* x = d * qs[i] */
typedef struct __attribute__((packed)) {
    uint16_t d; /* f16 */
    int8_t qs[32];
} qblock_q8_0;

/* x = d * (nibble - 8); element j < 16 is the low nibble of qs[j], j + 16 the high one. */
typedef struct __attribute__((packed)) {
    uint16_t d; /* f16 */
    uint8_t qs[16];
} qblock_q4_0;

/* x = d * nibble + m, the nibbles as Q4_0's. */
typedef struct __attribute__((packed)) {
    uint16_t d; /* f16 */
    uint16_t m; /* f16 */
    uint8_t qs[16];
} qblock_q4_1;

/* x = d * (q - 16), q 5 bits: a nibble as Q4_0's plus 16 times bit j of qh (a
 * little-endian uint32) for element j. */
typedef struct __attribute__((packed)) {
    uint16_t d; /* f16 */
    uint8_t qh[4];
    uint8_t qs[16];
} qblock_q5_0;

/* x = d * q + m, q 5 bits as Q5_0's. */
typedef struct __attribute__((packed)) {
    uint16_t d; /* f16 */
    uint16_t m; /* f16 */
    uint8_t qh[4];
    uint8_t qs[16];
} qblock_q5_1;

/* x = d * qb_iq4_grid[nibble], the nibbles as Q4_0's. */
typedef struct __attribute__((packed)) {
    uint16_t d; /* f16 */
    uint8_t qs[16];
} qblock_iq4_nl;

/* MXFP4 (OCP Microscaling, FP4 elements): x = 2^(e - 127) * E2M1(nibble), E2M1 of bit 3
 * the sign and bits 0-2 the magnitude {0, 0.5, 1, 1.5, 2, 3, 4, 6}; the nibbles as Q4_0's.
 * Kept as llama.cpp keeps it: twice the E2M1 values as integers (qb_mxfp4_grid) times
 * half the scale (qb_e8m0_half), so that a block's dot product is integers as IQ4_NL's. */
typedef struct __attribute__((packed)) {
    uint8_t e; /* E8M0: the shared exponent + 127 */
    uint8_t qs[16];
} qblock_mxfp4;

/* 8 sub-blocks of 32: x = d * (ls - 32) * qb_iq4_grid[nibble], ls 6 bits: the low 4 of
 * sub-block k in scales_l[k / 2] (the high nibble for odd k), the top 2 at bits 2 k of
 * scales_h; sub-block k's nibbles in qs[16 k ..] as Q4_0's. */
typedef struct __attribute__((packed)) {
    uint16_t d; /* f16 */
    uint16_t scales_h;
    uint8_t scales_l[4];
    uint8_t qs[128];
} qblock_iq4_xs;

/* The non-linear grid of IQ4_NL and IQ4_XS: a nibble's value, denser near zero. */
static const int8_t qb_iq4_grid[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                       1,    13,   25,  38,  53,  69,  89,  113};

/* Twice the E2M1 value of each nibble (-0 is 0). */
static const int8_t qb_mxfp4_grid[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* Half of E8M0 e's scale, 2^(e - 128), exactly (2^-128 and 2^-127 are subnormal); e = 255,
 * NaN to the spec, is 2^127 as llama.cpp reads it. */
static inline float qb_e8m0_half(uint8_t e)
{
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/*
 * The i-quants below 4 bits (see quant_iq.h): a super-block of 256 is 32 groups of 8
 * whose magnitudes are one entry of a codebook of lattice points (IQ3: two entries of 4),
 * with sign bits and scale fields beside them.
 */

/* IQ2_XXS: sub-block k of 32 is qs[4 k .. 4 k + 3] read as two little-endian uint32: the
 * first holds its 4 groups' entries of the 256-entry codebook (a byte each), the second
 * their 7-bit sign patterns (group l at bits 7 l; the eighth sign makes the count of
 * negatives even) and the scale s in its top 4 bits: x = d * (0.5 + s) / 4 * entry. */
typedef struct __attribute__((packed)) {
    uint16_t d; /* f16 */
    uint8_t qs[64];
} qblock_iq2_xxs;

/* IQ2_XS: little-endian uint16 4 k + l of qs is group l of sub-block k: its entry of 512
 * in bits 0-8, its 7-bit sign pattern (as IQ2_XXS's) in bits 9-15; scales[k]'s low nibble
 * is the scale of the sub-block's first 16 elements, the high one of the last 16. */
typedef struct __attribute__((packed)) {
    uint16_t d; /* f16 */
    uint8_t qs[64];
    uint8_t scales[8];
} qblock_iq2_xs;

/* IQ2_S: group l of sub-block k has entry qs[4 k + l] plus 256 times bits 2 l, 2 l + 1 of
 * qh[k] (of 1024), all 8 signs in signs[4 k + l]; scales as IQ2_XS's. */
typedef struct __attribute__((packed)) {
    uint16_t d; /* f16 */
    uint8_t qs[32];
    uint8_t signs[32];
    uint8_t qh[8];
    uint8_t scales[8];
} qblock_iq2_s;

/* IQ3_XXS: group l of sub-block k is entries qs[8 k + 2 l] and qs[8 k + 2 l + 1] of a
 * 256-entry codebook of 4 values; scales_signs[4 k ..] as a little-endian uint32 holds the
 * sign patterns and scale as IQ2_XXS's second word: x = d * (0.5 + s) / 2 * entry. */
typedef struct __attribute__((packed)) {
    uint16_t d; /* f16 */
    uint8_t qs[64];
    uint8_t scales_signs[32];
} qblock_iq3_xxs;

/* IQ3_S: group l of sub-block k is entries qs[8 k + 2 l] and qs[8 k + 2 l + 1] (of 512,
 * their ninth bits at bits 2 l and 2 l + 1 of qh[k]), all 8 signs in signs[4 k + l];
 * sub-block k's scale s is a nibble of scales[k / 2] (the high one for odd k):
 * x = d * (1 + 2 s) * entry. */
typedef struct __attribute__((packed)) {
    uint16_t d; /* f16 */
    uint8_t qs[64];
    uint8_t qh[8];
    uint8_t signs[32];
    uint8_t scales[4];
} qblock_iq3_s;

/* IQ1_S: group l of sub-block k has entry qs[4 k + l] plus 256 times bits 3 l .. 3 l + 2
 * of h, little-endian uint16 k of qh (of 2048 entries of -1, 0, 1); h's bits 12-14 are the
 * scale s, bit 15 the sign of the shift: x = d * (2 s + 1) * (entry +- 1/8). */
typedef struct __attribute__((packed)) {
    uint16_t d; /* f16 */
    uint8_t qs[32];
    uint8_t qh[16];
} qblock_iq1_s;

/* IQ1_M: as IQ1_S with a shift per group: qh[2 k + h] holds groups 2 h and 2 h + 1 of
 * sub-block k, each a nibble of 3 entry bits and the shift's sign. scales as 4 uint16: a
 * 3-bit scale per 16 elements (sub-block k's at bits 6 (k % 2) of word k / 2, then 3 more),
 * and the f16 d in the words' top nibbles (word 0 the lowest). */
typedef struct __attribute__((packed)) {
    uint8_t qs[32];
    uint8_t qh[16];
    uint8_t scales[8];
} qblock_iq1_m;

/* 8 sub-blocks of 32: x = d * sc[j] * nibble - dmin * m[j] (sc, m: 6 bits, packed in
 * scales, see qb_unpack_k_scales). qs[32 g + l] holds element 64 g + l in its low nibble
 * and element 64 g + 32 + l in its high nibble. */
typedef struct __attribute__((packed)) {
    uint16_t d;    /* f16 */
    uint16_t dmin; /* f16 */
    uint8_t scales[12];
    uint8_t qs[128];
} qblock_q4_k;

/* Q4_K plus a fifth bit per value: bit 2 g of qh[l] for element 64 g + l, bit 2 g + 1 for
 * element 64 g + 32 + l. */
typedef struct __attribute__((packed)) {
    uint16_t d;    /* f16 */
    uint16_t dmin; /* f16 */
    uint8_t scales[12];
    uint8_t qh[32];
    uint8_t qs[128];
} qblock_q5_k;

/* 16 sub-blocks of 16: x = d * scales[j] * (q - 32), q 6 bits: low 4 in ql, high 2 in qh
 * (two halves of 128 elements, each spread over 64 ql bytes and 32 qh bytes). */
typedef struct __attribute__((packed)) {
    uint8_t ql[128];
    uint8_t qh[64];
    int8_t scales[16];
    uint16_t d; /* f16 */
} qblock_q6_k;

/* 16 sub-blocks of 16: x = d * (sc[j] - 32) * (q - 4), q 3 bits: the low 2 of element
 * 128 h + 32 j + l at bits 2 j of qs[32 h + l], the third at bit 4 h + j of hmask[l];
 * sc 6 bits, see qb_q3_k_scales. */
typedef struct __attribute__((packed)) {
    uint8_t hmask[32];
    uint8_t qs[64];
    uint8_t scales[12];
    uint16_t d; /* f16 */
} qblock_q3_k;

/* 16 sub-blocks of 16: x = d * sc[j] * q - dmin * m[j], sc and m the low and high
 * nibbles of scales[j], q 2 bits as Q3_K's low ones (element 128 h + 32 j + l at bits 2 j
 * of qs[32 h + l]). */
typedef struct __attribute__((packed)) {
    uint8_t scales[16];
    uint8_t qs[64];
    uint16_t d;    /* f16 */
    uint16_t dmin; /* f16 */
} qblock_q2_k;

/* Activations for the K-quant dot products: x = d * qs[i], bsums[j] = sum of qs[16 j ..]. */
typedef struct __attribute__((packed)) {
    float d;
    int8_t qs[256];
    int16_t bsums[16];
} qblock_q8_k;

_Static_assert(sizeof(qblock_q8_0) == 34, "Q8_0 block");
_Static_assert(sizeof(qblock_q4_0) == 18, "Q4_0 block");
_Static_assert(sizeof(qblock_q4_1) == 20, "Q4_1 block");
_Static_assert(sizeof(qblock_q5_0) == 22, "Q5_0 block");
_Static_assert(sizeof(qblock_q5_1) == 24, "Q5_1 block");
_Static_assert(sizeof(qblock_iq4_nl) == 18, "IQ4_NL block");
_Static_assert(sizeof(qblock_iq4_xs) == 136, "IQ4_XS block");
_Static_assert(sizeof(qblock_mxfp4) == 17, "MXFP4 block");
_Static_assert(sizeof(qblock_iq2_xxs) == 66, "IQ2_XXS block");
_Static_assert(sizeof(qblock_iq2_xs) == 74, "IQ2_XS block");
_Static_assert(sizeof(qblock_iq2_s) == 82, "IQ2_S block");
_Static_assert(sizeof(qblock_iq3_xxs) == 98, "IQ3_XXS block");
_Static_assert(sizeof(qblock_iq3_s) == 110, "IQ3_S block");
_Static_assert(sizeof(qblock_iq1_s) == 50, "IQ1_S block");
_Static_assert(sizeof(qblock_iq1_m) == 56, "IQ1_M block");
_Static_assert(sizeof(qblock_q4_k) == 144, "Q4_K block");
_Static_assert(sizeof(qblock_q5_k) == 176, "Q5_K block");
_Static_assert(sizeof(qblock_q6_k) == 210, "Q6_K block");
_Static_assert(sizeof(qblock_q3_k) == 110, "Q3_K block");
_Static_assert(sizeof(qblock_q2_k) == 84, "Q2_K block");
_Static_assert(sizeof(qblock_q8_k) == 292, "Q8_K block");

/* Element i of a row of 16-bit or 32-bit values at any address (rows of F16/BF16/F32
 * tensors need not be aligned to their element size). */
static inline uint16_t qb_load_u16(const void *row, int64_t i)
{
    uint16_t v;
    memcpy(&v, (const uint8_t *)row + 2 * i, sizeof v);
    return v;
}

static inline float qb_load_f32(const void *row, int64_t i)
{
    float v;
    memcpy(&v, (const uint8_t *)row + 4 * i, sizeof v);
    return v;
}

static inline void qb_store_u16(void *row, int64_t i, uint16_t v)
{
    memcpy((uint8_t *)row + 2 * i, &v, sizeof v);
}

static inline float qb_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff, x;
    if (e == 0) {
        float f = (float)m * 0x1p-24f; /* zero or subnormal: m units of 2^-24 */
        return sign ? -f : f;
    }
    if (e == 31) /* infinity, or NaN made quiet as the F16C instruction does */
        x = sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0);
    else
        x = sign | ((e + 112) << 23) | (m << 13);
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

/* Element i of a row of float type t (QTYPE_F32, QTYPE_F16 or QTYPE_BF16), as f32: the
 * tails the SIMD float kernels leave. */
static inline float qb_load_float(uint32_t t, const void *row, int64_t i)
{
    if (t == QTYPE_F32)
        return qb_load_f32(row, i);
    uint16_t h = qb_load_u16(row, i);
    return t == QTYPE_F16 ? qb_f16_to_f32(h) : quant_bf16_to_f32(h);
}

/* The 6-bit scales and mins of a Q4_K / Q5_K super-block, as 8 bytes each (byte j for
 * sub-block j, in a little-endian uint64). Sub-blocks 0-3 keep theirs in the low 6 bits of
 * bytes 0-3 (scales) / 4-7 (mins); sub-blocks 4-7 keep their low 4 bits in the low / high
 * nibbles of bytes 8-11 and their top 2 bits in the top bits of bytes 0-3 / 4-7. */
static inline void qb_unpack_k_scales(const uint8_t s[12], uint64_t *sc, uint64_t *m)
{
    uint32_t s0, s1, s2;
    memcpy(&s0, s, 4);
    memcpy(&s1, s + 4, 4);
    memcpy(&s2, s + 8, 4);
    uint32_t sc_lo = s0 & 0x3f3f3f3fu, m_lo = s1 & 0x3f3f3f3fu;
    uint32_t sc_hi = (s2 & 0x0f0f0f0fu) | ((s0 >> 2) & 0x30303030u);
    uint32_t m_hi = ((s2 >> 4) & 0x0f0f0f0fu) | ((s1 >> 2) & 0x30303030u);
    *sc = (uint64_t)sc_hi << 32 | sc_lo;
    *m = (uint64_t)m_hi << 32 | m_lo;
}

/* Element j (0..31) of a 32-element block's nibbles (Q4_0, Q4_1, Q5_0, Q5_1): the low
 * nibble of qs[j] for j < 16, the high one of qs[j - 16] after. */
static inline int qb_nibble(const uint8_t qs[16], int j)
{
    return j < 16 ? qs[j] & 0xF : qs[j - 16] >> 4;
}

/* Element j of a Q5_0 / Q5_1 block: its nibble plus 16 times bit j of qh. */
static inline int qb_q5(const uint8_t qh[4], const uint8_t qs[16], int j)
{
    uint32_t h;
    memcpy(&h, qh, 4);
    return qb_nibble(qs, j) | (int)((h >> j) & 1) << 4;
}

/* Sub-block k's 6-bit scale of an IQ4_XS super-block, less 32. */
static inline int qb_iq4_xs_scale(const qblock_iq4_xs *b, int k)
{
    int lo = (b->scales_l[k / 2] >> (4 * (k % 2))) & 0xF, hi = (b->scales_h >> (2 * k)) & 3;
    return (lo | hi << 4) - 32;
}

/* The 16 6-bit scales of a Q3_K super-block, less 32 (so in [-32, 31]), into sc. Sub-block
 * k keeps its low 4 bits in byte k % 8 (the low nibble for k < 8, the high one after) and
 * its top 2 in byte 8 + k % 4, at bits 2 (k / 4). */
static inline void qb_q3_k_scales(const uint8_t s[12], int8_t sc[16])
{
    uint32_t lo[2], hi;
    memcpy(lo, s, 8);
    memcpy(&hi, s + 8, 4);
    uint32_t w[4] = {
        (lo[0] & 0x0f0f0f0fu) | ((hi << 4) & 0x30303030u),
        (lo[1] & 0x0f0f0f0fu) | ((hi << 2) & 0x30303030u),
        ((lo[0] >> 4) & 0x0f0f0f0fu) | (hi & 0x30303030u),
        ((lo[1] >> 4) & 0x0f0f0f0fu) | ((hi >> 2) & 0x30303030u),
    };
    uint8_t u[16];
    memcpy(u, w, 16);
    for (int k = 0; k < 16; k++)
        sc[k] = (int8_t)(u[k] - 32);
}

/* Byte j of a value from qb_unpack_k_scales. */
static inline int qb_k_byte(uint64_t v, int j)
{
    return (int)((v >> (8 * j)) & 0xff);
}

#endif
