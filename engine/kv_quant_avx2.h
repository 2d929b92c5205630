/*
 * kv_quant_avx2.h — AVX2/FMA/F16C decoding of kv_quant blocks. Internal to kv_quant.c,
 * which calls these only on x86-64 after checking the CPU, with the block already split
 * into its K or V codes and parameters (layout in kv_quant.h).
 */
#ifndef LLMS_KV_QUANT_AVX2_H
#define LLMS_KV_QUANT_AVX2_H

#include <stddef.h>
#include <stdint.h>

/* k (n_tokens, head_dim) from rows of codes row_bytes apart and the f16 (scale, min) of
 * each channel, params (head_dim, 2). */
void kv_quant_avx2_decode_k(const uint8_t *codes, size_t row_bytes, const uint16_t *params,
                            int head_dim, int bits, int n_tokens, float *k);

/* v (n_tokens, head_dim) from rows of codes row_bytes apart and the f16 (scale, min) of
 * each token's groups of KV_QUANT_V_GROUP elements, params (n_tokens, n_groups, 2). */
void kv_quant_avx2_decode_v(const uint8_t *codes, size_t row_bytes, const uint16_t *params,
                            int head_dim, int bits, int n_tokens, float *v);

#endif
