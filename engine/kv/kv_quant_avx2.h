/*
 * kv_quant_avx2.h — AVX2/FMA decoding of kv_quant blocks. Internal to kv_quant.c, which
 * calls these only on x86-64 after checking the CPU, with the block already split into
 * its K or V codes and each group's (min, scale) already decoded from the block's grid
 * (layout in kv_quant.h).
 */
#ifndef LLMS_KV_QUANT_AVX2_H
#define LLMS_KV_QUANT_AVX2_H

#include <stddef.h>
#include <stdint.h>

/* k (n_tokens, head_dim) = min + scale * code from rows of codes row_bytes apart, with
 * min and scale per channel, (head_dim). */
void kv_quant_avx2_decode_k(const uint8_t *codes, size_t row_bytes, const float *min,
                            const float *scale, int head_dim, int bits, int n_tokens, float *k);

/* v (n_tokens, head_dim) likewise with min and scale per token's group of
 * KV_QUANT_V_GROUP elements, (n_tokens, n_groups). */
void kv_quant_avx2_decode_v(const uint8_t *codes, size_t row_bytes, const float *min,
                            const float *scale, int head_dim, int bits, int n_tokens, float *v);

#endif
