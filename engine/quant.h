/*
 * quant.h — tensor element types of GGUF files: their block layouts, conversion to
 * and from f32, and the dot-product kernels the matrix products are built on.
 *
 * Type ids are the ones GGUF files store (ggml's numbering), so a tensor's type field
 * can be used directly. Quantized types pack a fixed number of elements (the block
 * size) into a fixed number of bytes; a row of n elements is n / block_size blocks.
 */
#ifndef LLMS_QUANT_H
#define LLMS_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum qtype {
    QTYPE_F32 = 0,
    QTYPE_F16 = 1,
    QTYPE_Q4_0 = 2,
    QTYPE_Q4_1 = 3,
    QTYPE_Q5_0 = 6,
    QTYPE_Q5_1 = 7,
    QTYPE_Q8_0 = 8,
    QTYPE_Q8_1 = 9,
    QTYPE_Q2_K = 10,
    QTYPE_Q3_K = 11,
    QTYPE_Q4_K = 12,
    QTYPE_Q5_K = 13,
    QTYPE_Q6_K = 14,
    QTYPE_Q8_K = 15,
    QTYPE_IQ2_XXS = 16,
    QTYPE_IQ2_XS = 17,
    QTYPE_IQ3_XXS = 18,
    QTYPE_IQ1_S = 19,
    QTYPE_IQ4_NL = 20,
    QTYPE_IQ3_S = 21,
    QTYPE_IQ2_S = 22,
    QTYPE_IQ4_XS = 23,
    QTYPE_I8 = 24,
    QTYPE_I16 = 25,
    QTYPE_I32 = 26,
    QTYPE_I64 = 27,
    QTYPE_F64 = 28,
    QTYPE_IQ1_M = 29,
    QTYPE_BF16 = 30,
    QTYPE_TQ1_0 = 34,
    QTYPE_TQ2_0 = 35,
    QTYPE_COUNT = 36 /* one past the largest id; not every id below it exists */
};

/* Size facts of a type. */
typedef struct quant_traits {
    const char *name;   /* "Q4_K", as llama.cpp prints it */
    int block_size;     /* elements per block (1 for plain scalar types) */
    size_t block_bytes; /* bytes per block */
    bool computable;    /* this engine can dequantize it and multiply with it */
} quant_traits;

/* Traits of type id t, or NULL when t is not a known GGUF type id. */
const quant_traits *quant_traits_of(uint32_t t);

/* Bytes taken by n elements of type t, or 0 when t is unknown or n is not a whole
 * number of blocks. */
size_t quant_row_bytes(uint32_t t, int64_t n);

#endif
