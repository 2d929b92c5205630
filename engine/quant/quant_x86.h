/*
 * quant_x86.h — inline helpers shared by the ISA kernels (quant_avx2.c, quant_avx512.c).
 * Internal to the quant module; include only from files compiled with AVX2 flags.
 */
#ifndef LLMS_QUANT_X86_H
#define LLMS_QUANT_X86_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* The 16 scales of a Q3_K super-block less 32, as int8 in sub-block order (the layout of
 * qb_q3_k_scales, which does this a byte at a time through memory: in a kernel that cost
 * more than the rest of the super-block). The low 4 bits come from bytes k % 8 (high
 * nibbles from k = 8), the top 2 from byte 8 + k % 4 shifted by 2 (k / 4): each 32-bit lane
 * of the broadcast high bytes takes its own shift. Reads only the 12 bytes at s. */
static inline __m128i qx_q3_k_scales(const uint8_t s[12])
{
    uint32_t hi;
    memcpy(&hi, s + 8, 4);
    __m128i lo8 = _mm_loadl_epi64((const __m128i *)(const void *)s);
    __m128i l = _mm_and_si128(_mm_unpacklo_epi64(lo8, _mm_srli_epi16(lo8, 4)), _mm_set1_epi8(0xF));
    __m128i h = _mm_srlv_epi32(_mm_set1_epi32((int)hi), _mm_setr_epi32(0, 2, 4, 6));
    h = _mm_and_si128(h, _mm_set1_epi8(3));
    return _mm_sub_epi8(_mm_or_si128(l, _mm_slli_epi16(h, 4)), _mm_set1_epi8(32));
}

#endif
