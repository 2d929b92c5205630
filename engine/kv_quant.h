/*
 * kv_quant.h — integer codes for one (layer, KV head) block of a chunk (internal to kv.c).
 *
 * A block holds KV_CHUNK_TOKENS rows of head_dim for K and for V. Codes are asymmetric
 * (x = min + code * scale, scale and min as f16): K per channel over the block's tokens,
 * because keys have a few channels of large magnitude that a per-token scale would spread
 * over every channel; V per token in groups of KV_QUANT_V_GROUP elements, because the
 * attention output mixes value rows and an error in one token's row stays in that row.
 * Layout of a block of `bits` bits: K codes (KV_CHUNK_TOKENS rows of
 * kv_quant_row_bytes), V codes (same), then K's (scale, min) per channel, then V's
 * (scale, min) per (token, group). Rows >= n_tokens have zero codes and parameters.
 */
#ifndef LLMS_KV_QUANT_H
#define LLMS_KV_QUANT_H

#include <stddef.h>
#include <stdint.h>

/* Elements of a V row sharing one scale and min. */
#define KV_QUANT_V_GROUP 32

/* Bytes of one row of head_dim codes of `bits` (8, 4 or 2) bits. */
size_t kv_quant_row_bytes(int head_dim, int bits);

/* Bytes of one quantized (layer, head) block. */
size_t kv_quant_block_bytes(int head_dim, int bits);

/* Quantizes the first n_tokens rows of k and v (n_tokens, head_dim) into dst. */
void kv_quant_encode(uint8_t *dst, int head_dim, int bits, int n_tokens, const float *k,
                     const float *v);

/* Decodes the first n_tokens rows into k and v (n_tokens, head_dim); either may be NULL.
 * head_dim <= KV_MAX_HEAD_DIM. */
void kv_quant_decode(const uint8_t *src, int head_dim, int bits, int n_tokens, float *k,
                     float *v);

#endif
