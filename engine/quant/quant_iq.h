/*
 * quant_iq.h — the i-quants below 4 bits: IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS
 * and IQ3_S, the types of llama.cpp's IQ1_S ... IQ3_M files (and of the layers that its
 * Q2_K and Q3_K_S mixes and many published low-bit files keep in them).
 *
 * A super-block of 256 elements is 32 groups of 8. A group's magnitudes are one entry of
 * a codebook of lattice points (IQ2: 8 values each 8, 25 or 43; IQ3: two entries of 4
 * values in 8 levels; IQ1: 8 values each -1, 0 or 1, no signs, shifted by +-1/8), its
 * signs are bits beside it, and a scale field per 16 or 32 elements multiplies a
 * super-block scale. The scalar kernels here first unpack a super-block into an iq_block
 * (the signed grid values as bytes and the scale fields); the AVX2 kernels (quant_avx2.c)
 * read the same layouts straight into registers through quant_iq_tables.
 *
 * Results follow llama.cpp's definitions: dequantized values are its to_float's
 * arithmetic, and dot products with Q8_K activations its integer sums per super-block,
 * scaled as it scales them. Internal to the quant module.
 */
#ifndef LLMS_QUANT_IQ_H
#define LLMS_QUANT_IQ_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/quant/quant_blocks.h"

/* One super-block unpacked. */
typedef struct iq_block {
    int8_t q[256];     /* (256) each element's grid value with its sign (IQ1: -1, 0, 1) */
    uint8_t scale[16]; /* (16) the scale field s of each 16 elements; the step is 2 s + 1 */
    int8_t delta[32];  /* (32) IQ1_S / IQ1_M: each group's shift in eighths, +1 or -1;
                        * 0 for the other types */
    float d;           /* the super-block scale */
} iq_block;

/* The codebooks as the kernels read them: entry k's values as bytes, value j in byte j
 * (little-endian, as every host this builds for), and sign masks for them. */
typedef struct quant_iq_tables {
    uint64_t iq2xxs[256], iq2xs[512], iq2s[1024], iq1s[2048];
    uint32_t iq3xxs[256], iq3s[512];
    uint64_t signs[256];      /* byte j is -1 where bit j of the index is set, else +1 */
    uint64_t even_signs[128]; /* the same for a 7-bit pattern and its eighth sign, which
                               * makes the count of negatives even */
} quant_iq_tables;

const quant_iq_tables *quant_iq_tables_get(void);

/* The super-block scale of `block`, a super-block of type t: an f16 first, but for
 * IQ1_M, which keeps it in the top nibbles of its 4 little-endian scale words. */
static inline float quant_iq_d(uint32_t t, const void *block)
{
    const uint8_t *b = block;
    if (t == QTYPE_IQ1_M) {
        const uint8_t *sc = ((const qblock_iq1_m *)block)->scales;
        return qb_f16_to_f32((uint16_t)(sc[1] >> 4 | (sc[3] & 0xf0) | (sc[5] & 0xf0) << 4 |
                                        (sc[7] & 0xf0) << 8));
    }
    return qb_f16_to_f32((uint16_t)(b[0] | b[1] << 8));
}

/* True for the seven types of this file. */
bool quant_iq_type(uint32_t t);

/* Unpacks super-block `block` of type t. */
void quant_iq_unpack(uint32_t t, const void *block, iq_block *b);

/* nb super-blocks of type t into 256 nb floats. */
void quant_iq_dequantize(uint32_t t, const void *src, float *dst, int64_t nb);

/* What a super-block of scale dx adds to its row's dot product with Q8_K activations of
 * scale dy, from two exact integers (however a kernel adds them up): sumi, the sum over
 * its 16-value parts of (2 s + 1) times the part's sum of q * a, and for IQ1 shifted, the
 * same with each q replaced by its group's shift sign. The row's result is
 * quant_iq_row_factor(t) times the sum of these over its super-blocks, in order. The
 * empty asm keeps the product rounded before it is added (GCC fuses a multiply and an
 * add across statements where FMA is enabled, as in the x86 ISA files), so every kernel
 * rounds alike. */
static inline float quant_iq_block_sum(uint32_t t, float dx, float dy, int32_t sumi,
                                       int32_t shifted)
{
    float d = dx * dy;
    /* 0.125 * shifted is exact, so a fused add rounds as the unfused one */
    float term = t == QTYPE_IQ1_S || t == QTYPE_IQ1_M ? d * ((float)sumi + 0.125f * (float)shifted)
                                                      : d * (float)sumi;
#if defined(__x86_64__)
    __asm__("" : "+x"(term));
#endif
    return term;
}

/* The constant a row's sum of quant_iq_block_sum terms is multiplied by at the end:
 * llama.cpp's 1/8 (IQ2), 1/4 (IQ3_XXS) or 1. */
float quant_iq_row_factor(uint32_t t);

/* The scalar dot product of nb super-blocks of type t with Q8_K activations. */
float quant_iq_dot(uint32_t t, const void *x, const qblock_q8_k *y, int64_t nb);

/* nb super-blocks of 256 floats into type t: for each group the codebook entry nearest
 * its values (among a few candidates around their nearest lattice point), the scales by
 * least squares. A plain reference quantizer without an importance matrix: the bytes
 * differ from llama-quantize's, and below 3 bits a model loses more than with its files
 * made with one; any reader decodes them alike. */
void quant_iq_quantize(uint32_t t, const float *src, void *dst, int64_t nb);

#endif
