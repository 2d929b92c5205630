/*
 * kv_quant.h — integer codes for one (layer, KV head) block of a chunk (internal to kv.c).
 *
 * A block holds KV_CHUNK_TOKENS rows of head_dim for K and for V. Codes are asymmetric
 * (x = min + scale * code): K per channel over the block's tokens, because keys have a
 * few channels of large magnitude that a per-token scale would spread over every channel;
 * V per token in groups of KV_QUANT_V_GROUP elements, because the attention output mixes
 * value rows and an error in one token's row stays in that row. K and V have their own
 * width (2, 3, 4, 5, 6 or 8 bits), since how much each costs in accuracy differs by model.
 *
 * The (min, scale) of a group are two 8-bit codes on a grid the block shares, (min0 +
 * i * min_step, j * scale_step) with the three grid values as f16: on 16-token chunks a
 * pair of f16 per group would cost 2 bits per element at head_dim 16, 8-bit codes half
 * that, and bench/kvquant measured no loss of accuracy from them. min is rounded down
 * and scale up on the grid, so every value stays inside the codes' range.
 *
 * V may instead share one (min, scale) over the whole block ("V block" layout): at
 * head_dim 16 a token's group is 16 values and its two codes cost 1 bit per value, and
 * bench/kvquant measured V at 5 bits on one block-wide range beat 4 bits on per-token
 * ranges (same bytes) on both TinyStories-656K models; with larger heads or uneven token
 * norms per-token ranges win, so the precision says which (kv.h) and kv_assign_precisions
 * chooses per chunk from the values' spreads.
 *
 * Layout: K codes (KV_CHUNK_TOKENS rows of kv_quant_row_bytes(head_dim, k_bits), codes
 * packed LSB first), V codes (same with v_bits), K's grid (4 u16: min0, min_step,
 * scale_step, 0) and (min, scale) codes per channel (head_dim, 2), V's grid and codes per
 * (token, group) (KV_CHUNK_TOKENS, n_groups, 2), or for the V block layout one code pair
 * (1, 2). Rows >= n_tokens have zero codes.
 */
#ifndef LLMS_KV_QUANT_H
#define LLMS_KV_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Elements of a V row sharing one scale and min. */
#define KV_QUANT_V_GROUP 32

/* Bytes of one row of head_dim codes of `bits` bits. */
size_t kv_quant_row_bytes(int head_dim, int bits);

/* A block's code widths and V layout. */
typedef struct kv_quant_format {
    int k_bits, v_bits; /* 2, 3, 4, 5, 6 or 8; v_bits 0: the block holds K alone (a shape
                           whose V is its K, kv.h) and V is neither encoded nor decoded */
    bool v_block;       /* V on one (min, scale) for the block, not one per token group */
} kv_quant_format;

/* Bytes of one quantized (layer, head) block. */
size_t kv_quant_block_bytes(int head_dim, kv_quant_format f);

/* Quantizes the first n_tokens rows of k and v (n_tokens, head_dim) into dst. */
void kv_quant_encode(uint8_t *dst, int head_dim, kv_quant_format f, int n_tokens,
                     const float *k, const float *v);

/* Decodes the first n_tokens rows into k and v (n_tokens, head_dim); either may be NULL
 * (v is left as it is without V's codes, v_bits 0).
 * head_dim <= KV_MAX_HEAD_DIM. Uses AVX2/FMA where the CPU has them (and LLMS_NO_SIMD is
 * not set); the result equals kv_quant_decode_scalar's bit for bit. */
void kv_quant_decode(const uint8_t *src, int head_dim, kv_quant_format f, int n_tokens,
                     float *k, float *v);

/* kv_quant_decode in portable C: the reference the vector path is tested against. */
void kv_quant_decode_scalar(const uint8_t *src, int head_dim, kv_quant_format f,
                            int n_tokens, float *k, float *v);

#endif
