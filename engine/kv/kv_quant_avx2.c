/*
 * kv_quant_avx2.c — kv_quant blocks decoded eight codes at a time (see kv_quant_avx2.h).
 *
 * Equal to the scalar decoding bit for bit: both compute fma(scale, code, min) with one
 * rounding (fmaf there, vfmadd here) from the same f32 scale and min.
 */
#if defined(__x86_64__)

#include "engine/kv/kv_quant_avx2.h"

#include <immintrin.h>
#include <string.h>

#include "engine/kv/kv.h"
#include "engine/kv/kv_quant.h"

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
    } else if (bits == 2) {
        uint16_t w;
        memcpy(&w, row + j / 4, sizeof w);
        c = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(w),
                                               _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
                             _mm256_set1_epi32(3));
    } else {
        /* 3, 5 or 6 bits: the 8 codes fill `bits` bytes, shifted out of one 64-bit word */
        uint64_t w = 0;
        memcpy(&w, row + j * bits / 8, (size_t)bits);
        __m256i wv = _mm256_set1_epi64x((long long)w);
        __m256i mask = _mm256_set1_epi64x((1 << bits) - 1);
        __m256i lo = _mm256_and_si256(
            _mm256_srlv_epi64(wv, _mm256_setr_epi64x(0, bits, 2 * bits, 3 * bits)), mask);
        __m256i hi = _mm256_and_si256(
            _mm256_srlv_epi64(wv, _mm256_setr_epi64x(4 * bits, 5 * bits, 6 * bits, 7 * bits)),
            mask);
        /* each 64-bit lane holds one code in its low half: gather the low halves */
        __m256i pick = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
        c = _mm256_blend_epi32(_mm256_permutevar8x32_epi32(lo, pick),
                               _mm256_permutevar8x32_epi32(hi, pick), 0xf0);
    }
    return _mm256_cvtepi32_ps(c);
}

/* Code j of a row, for the last head_dim % 8 elements. */
INLINE float code1(const uint8_t *row, int j, int bits)
{
    int bit = j * bits, shift = bit % 8;
    unsigned w = row[bit / 8];
    if (shift + bits > 8)
        w |= (unsigned)row[bit / 8 + 1] << 8;
    return (float)((w >> shift) & ((1u << bits) - 1));
}

/* One channel group's parameters stay in registers over all the block's tokens. */
INLINE void decode_k(const uint8_t *codes, size_t rb, const float *min, const float *scale,
                     int hd, int bits, int n, float *k)
{
    int j = 0;
    for (; j + 8 <= hd; j += 8) {
        __m256 s = _mm256_loadu_ps(scale + j), m = _mm256_loadu_ps(min + j);
        for (int i = 0; i < n; i++)
            _mm256_storeu_ps(k + (size_t)i * hd + j,
                             _mm256_fmadd_ps(s, codes8(codes + i * rb, j, bits), m));
    }
    for (; j < hd; j++)
        for (int i = 0; i < n; i++)
            k[(size_t)i * hd + j] = __builtin_fmaf(scale[j], code1(codes + i * rb, j, bits),
                                                   min[j]);
}

INLINE void decode_v(const uint8_t *codes, size_t rb, const float *min, const float *scale,
                     int hd, int bits, int n, float *v)
{
    int ng = (hd + KV_QUANT_V_GROUP - 1) / KV_QUANT_V_GROUP;
    for (int i = 0; i < n; i++, codes += rb, v += hd) {
        const float *si = scale + i * ng, *mi = min + i * ng;
        int j = 0;
        for (; j + 8 <= hd; j += 8) {
            int g = j / KV_QUANT_V_GROUP;
            __m256 s = _mm256_broadcast_ss(si + g), m = _mm256_broadcast_ss(mi + g);
            _mm256_storeu_ps(v + j, _mm256_fmadd_ps(s, codes8(codes, j, bits), m));
        }
        for (; j < hd; j++) {
            int g = j / KV_QUANT_V_GROUP;
            v[j] = __builtin_fmaf(si[g], code1(codes, j, bits), mi[g]);
        }
    }
}

/* Separate instances per width let the compiler drop the bits switch from the loops. */
#define KV_DISPATCH(fn, bits, ...)                    \
    switch (bits) {                                   \
    case 8: fn(__VA_ARGS__, 8, n_tokens, out); break; \
    case 6: fn(__VA_ARGS__, 6, n_tokens, out); break; \
    case 5: fn(__VA_ARGS__, 5, n_tokens, out); break; \
    case 4: fn(__VA_ARGS__, 4, n_tokens, out); break; \
    case 3: fn(__VA_ARGS__, 3, n_tokens, out); break; \
    default: fn(__VA_ARGS__, 2, n_tokens, out); break; \
    }

void kv_quant_avx2_decode_k(const uint8_t *codes, size_t row_bytes, const float *min,
                            const float *scale, int head_dim, int bits, int n_tokens, float *k)
{
    float *out = k;
    KV_DISPATCH(decode_k, bits, codes, row_bytes, min, scale, head_dim)
}

void kv_quant_avx2_decode_v(const uint8_t *codes, size_t row_bytes, const float *min,
                            const float *scale, int head_dim, int bits, int n_tokens, float *v)
{
    float *out = v;
    KV_DISPATCH(decode_v, bits, codes, row_bytes, min, scale, head_dim)
}

#endif
