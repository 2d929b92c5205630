/*
 * kv_quant_avx2.c — kv_quant blocks decoded eight codes at a time (see kv_quant_avx2.h).
 *
 * Equal to the scalar decoding bit for bit: a code has at most 8 bits and a scale, an
 * f16, at most 11 significant bits, so scale * code is exact in f32 and the FMA rounds
 * only where the scalar min + scale * code does; F16C converts halves exactly as
 * quant_f16_to_f32 does.
 */
#if defined(__x86_64__)

#include "engine/kv_quant_avx2.h"

#include <immintrin.h>
#include <string.h>

#include "engine/kv.h"
#include "engine/kv_quant.h"

#define INLINE static inline __attribute__((always_inline))

/* Codes j..j+7 of a row as floats; j is a multiple of 8, so they start on a byte. */
INLINE __m256 codes8(const uint8_t *row, int j, int bits)
{
    __m256i c;
    if (bits == 8) {
        c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(row + j)));
    } else if (bits == 4) {
        uint32_t w;
        memcpy(&w, row + j / 2, sizeof w);
        c = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)w),
                                               _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                             _mm256_set1_epi32(15));
    } else {
        uint16_t w;
        memcpy(&w, row + j / 4, sizeof w);
        c = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(w),
                                               _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
                             _mm256_set1_epi32(3));
    }
    return _mm256_cvtepi32_ps(c);
}

/* Code j of a row, for the last head_dim % 8 elements. */
INLINE float code1(const uint8_t *row, int j, int bits)
{
    int bit = j * bits;
    return (float)((row[bit / 8] >> (bit % 8)) & ((1 << bits) - 1));
}

INLINE float half(uint16_t h)
{
    return _cvtsh_ss(h);
}

/* The scales (low half) and mins (high half) of 8 consecutive (scale, min) pairs. */
INLINE void params8(const uint16_t *p, __m256 *scale, __m256 *min)
{
    __m256i pairs = _mm256_loadu_si256((const __m256i *)p);
    __m256i s = _mm256_and_si256(pairs, _mm256_set1_epi32(0xffff));
    __m256i m = _mm256_srli_epi32(pairs, 16);
    /* per 128-bit lane: s0..s3 m0..m3 | s4..s7 m4..m7, then s0..s7 | m0..m7 */
    __m256i sm = _mm256_permute4x64_epi64(_mm256_packus_epi32(s, m), _MM_SHUFFLE(3, 1, 2, 0));
    *scale = _mm256_cvtph_ps(_mm256_castsi256_si128(sm));
    *min = _mm256_cvtph_ps(_mm256_extracti128_si256(sm, 1));
}

/* One channel group's parameters stay in registers over all the block's tokens. */
INLINE void decode_k(const uint8_t *codes, size_t rb, const uint16_t *params, int hd,
                     int bits, int n, float *k)
{
    int j = 0;
    for (; j + 8 <= hd; j += 8) {
        __m256 s, m;
        params8(params + 2 * j, &s, &m);
        for (int i = 0; i < n; i++)
            _mm256_storeu_ps(k + (size_t)i * hd + j,
                             _mm256_fmadd_ps(s, codes8(codes + i * rb, j, bits), m));
    }
    for (; j < hd; j++) {
        float s = half(params[2 * j]), m = half(params[2 * j + 1]);
        for (int i = 0; i < n; i++)
            k[(size_t)i * hd + j] = m + s * code1(codes + i * rb, j, bits);
    }
}

/* v = min + scale * code with the block's (token, group) parameters converted up front, so
 * each group only broadcasts two floats from memory. */
INLINE void decode_v(const uint8_t *codes, size_t rb, const uint16_t *params, int hd,
                     int bits, int n, float *v)
{
    int ng = (hd + KV_QUANT_V_GROUP - 1) / KV_QUANT_V_GROUP, full = hd / KV_QUANT_V_GROUP;
    float scale[KV_CHUNK_TOKENS * KV_MAX_HEAD_DIM / KV_QUANT_V_GROUP]; /* (n, ng) */
    float min[KV_CHUNK_TOKENS * KV_MAX_HEAD_DIM / KV_QUANT_V_GROUP];
    int np = n * ng, p = 0;
    for (; p + 8 <= np; p += 8) {
        __m256 s, m;
        params8(params + 2 * p, &s, &m);
        _mm256_storeu_ps(scale + p, s);
        _mm256_storeu_ps(min + p, m);
    }
    for (; p < np; p++)
        scale[p] = half(params[2 * p]), min[p] = half(params[2 * p + 1]);

    for (int i = 0; i < n; i++, codes += rb, v += hd) {
        const float *si = scale + i * ng, *mi = min + i * ng;
        int g = 0;
        for (; g < full; g++) {
            __m256 s = _mm256_broadcast_ss(si + g), m = _mm256_broadcast_ss(mi + g);
            for (int j = g * KV_QUANT_V_GROUP; j < (g + 1) * KV_QUANT_V_GROUP; j += 8)
                _mm256_storeu_ps(v + j, _mm256_fmadd_ps(s, codes8(codes, j, bits), m));
        }
        if (g < ng) {
            __m256 s = _mm256_broadcast_ss(si + g), m = _mm256_broadcast_ss(mi + g);
            int j = g * KV_QUANT_V_GROUP;
            for (; j + 8 <= hd; j += 8)
                _mm256_storeu_ps(v + j, _mm256_fmadd_ps(s, codes8(codes, j, bits), m));
            for (; j < hd; j++)
                v[j] = mi[g] + si[g] * code1(codes, j, bits);
        }
    }
}

/* Separate instances per width let the compiler drop the bits switch from the loops. */
void kv_quant_avx2_decode_k(const uint8_t *codes, size_t row_bytes, const uint16_t *params,
                            int head_dim, int bits, int n_tokens, float *k)
{
    if (bits == 8)
        decode_k(codes, row_bytes, params, head_dim, 8, n_tokens, k);
    else if (bits == 4)
        decode_k(codes, row_bytes, params, head_dim, 4, n_tokens, k);
    else
        decode_k(codes, row_bytes, params, head_dim, 2, n_tokens, k);
}

void kv_quant_avx2_decode_v(const uint8_t *codes, size_t row_bytes, const uint16_t *params,
                            int head_dim, int bits, int n_tokens, float *v)
{
    if (bits == 8)
        decode_v(codes, row_bytes, params, head_dim, 8, n_tokens, v);
    else if (bits == 4)
        decode_v(codes, row_bytes, params, head_dim, 4, n_tokens, v);
    else
        decode_v(codes, row_bytes, params, head_dim, 2, n_tokens, v);
}

#endif
