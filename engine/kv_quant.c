/*
 * kv_quant.c — asymmetric integer codes for a chunk's (layer, head) blocks of K and V.
 */
#include "engine/kv_quant.h"

#include <math.h>
#include <string.h>

#include "engine/kv.h"
#include "engine/quant.h"

size_t kv_quant_row_bytes(int head_dim, int bits)
{
    return ((size_t)head_dim * bits + 7) / 8;
}

static int kv_quant_groups(int head_dim)
{
    return (head_dim + KV_QUANT_V_GROUP - 1) / KV_QUANT_V_GROUP;
}

size_t kv_quant_block_bytes(int head_dim, int bits)
{
    size_t codes = 2 * (size_t)KV_CHUNK_TOKENS * kv_quant_row_bytes(head_dim, bits);
    size_t params = 2 * sizeof(uint16_t) *
                    ((size_t)head_dim + (size_t)KV_CHUNK_TOKENS * kv_quant_groups(head_dim));
    return codes + params;
}

/* The f16 (scale, min) of values in [lo, hi] on levels 0..top, and their f32 values. */
static void kv_quant_params(float lo, float hi, int top, uint16_t *p, float *scale, float *min)
{
    p[1] = quant_f32_to_f16(lo);
    *min = quant_f16_to_f32(p[1]);
    p[0] = quant_f32_to_f16((hi - *min) / (float)top);
    *scale = quant_f16_to_f32(p[0]);
}

static unsigned kv_quant_code(float x, float scale, float min, int top)
{
    if (!(scale > 0))
        return 0;
    float c = nearbyintf((x - min) / scale);
    return c <= 0 ? 0 : c >= (float)top ? (unsigned)top : (unsigned)c;
}

static void kv_quant_put(uint8_t *row, int j, int bits, unsigned code)
{
    int bit = j * bits;
    row[bit / 8] |= (uint8_t)(code << (bit % 8));
}

void kv_quant_encode(uint8_t *dst, int head_dim, int bits, int n_tokens, const float *k,
                     const float *v)
{
    int top = (1 << bits) - 1, ng = kv_quant_groups(head_dim);
    size_t rb = kv_quant_row_bytes(head_dim, bits);
    memset(dst, 0, kv_quant_block_bytes(head_dim, bits));
    uint8_t *kc = dst, *vc = dst + KV_CHUNK_TOKENS * rb;
    uint16_t *kp = (uint16_t *)(vc + KV_CHUNK_TOKENS * rb); /* (head_dim, 2) */
    uint16_t *vp = kp + 2 * (size_t)head_dim;               /* (KV_CHUNK_TOKENS, ng, 2) */
    if (n_tokens <= 0)
        return;

    for (int j = 0; j < head_dim; j++) {
        float lo = k[j], hi = k[j], scale, min;
        for (int i = 1; i < n_tokens; i++) {
            float x = k[(size_t)i * head_dim + j];
            lo = x < lo ? x : lo;
            hi = x > hi ? x : hi;
        }
        kv_quant_params(lo, hi, top, kp + 2 * j, &scale, &min);
        for (int i = 0; i < n_tokens; i++)
            kv_quant_put(kc + i * rb, j, bits,
                         kv_quant_code(k[(size_t)i * head_dim + j], scale, min, top));
    }

    for (int i = 0; i < n_tokens; i++) {
        const float *row = v + (size_t)i * head_dim;
        for (int g = 0; g < ng; g++) {
            int j0 = g * KV_QUANT_V_GROUP;
            int j1 = j0 + KV_QUANT_V_GROUP < head_dim ? j0 + KV_QUANT_V_GROUP : head_dim;
            float lo = row[j0], hi = row[j0], scale, min;
            for (int j = j0 + 1; j < j1; j++) {
                lo = row[j] < lo ? row[j] : lo;
                hi = row[j] > hi ? row[j] : hi;
            }
            kv_quant_params(lo, hi, top, vp + 2 * ((size_t)i * ng + g), &scale, &min);
            for (int j = j0; j < j1; j++)
                kv_quant_put(vc + i * rb, j, bits, kv_quant_code(row[j], scale, min, top));
        }
    }
}

/* row[j] = min[j] + scale[j] * code j of the packed codes, for j < n. */
static void kv_quant_decode_row(const uint8_t *codes, int bits, int n, const float *scale,
                                const float *min, float *row)
{
    switch (bits) {
    case 8:
        for (int j = 0; j < n; j++)
            row[j] = min[j] + scale[j] * (float)codes[j];
        break;
    case 4:
        for (int j = 0; j < n; j++)
            row[j] = min[j] + scale[j] * (float)((codes[j >> 1] >> ((j & 1) * 4)) & 15);
        break;
    default:
        for (int j = 0; j < n; j++)
            row[j] = min[j] + scale[j] * (float)((codes[j >> 2] >> ((j & 3) * 2)) & 3);
        break;
    }
}

void kv_quant_decode(const uint8_t *src, int head_dim, int bits, int n_tokens, float *k,
                     float *v)
{
    int ng = kv_quant_groups(head_dim);
    size_t rb = kv_quant_row_bytes(head_dim, bits);
    const uint8_t *kc = src, *vc = src + KV_CHUNK_TOKENS * rb;
    const uint16_t *kp = (const uint16_t *)(vc + KV_CHUNK_TOKENS * rb);
    const uint16_t *vp = kp + 2 * (size_t)head_dim;
    float scale[KV_MAX_HEAD_DIM], min[KV_MAX_HEAD_DIM];
    if (k) {
        for (int j = 0; j < head_dim; j++) {
            scale[j] = quant_f16_to_f32(kp[2 * j]);
            min[j] = quant_f16_to_f32(kp[2 * j + 1]);
        }
        for (int i = 0; i < n_tokens; i++)
            kv_quant_decode_row(kc + i * rb, bits, head_dim, scale, min, k + (size_t)i * head_dim);
    }
    if (v)
        for (int i = 0; i < n_tokens; i++) {
            for (int g = 0; g < ng; g++) {
                const uint16_t *p = vp + 2 * ((size_t)i * ng + g);
                float s = quant_f16_to_f32(p[0]), m = quant_f16_to_f32(p[1]);
                int j0 = g * KV_QUANT_V_GROUP;
                int j1 = j0 + KV_QUANT_V_GROUP < head_dim ? j0 + KV_QUANT_V_GROUP : head_dim;
                for (int j = j0; j < j1; j++)
                    scale[j] = s, min[j] = m;
            }
            kv_quant_decode_row(vc + i * rb, bits, head_dim, scale, min, v + (size_t)i * head_dim);
        }
}
