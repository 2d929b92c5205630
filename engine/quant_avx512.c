/*
 * quant_avx512.c — AVX-512 VNNI kernels (see quant_avx512.h). Compiled with the
 * AVX-512 flags; quant.c calls in only after checking the CPU.
 *
 * Batched decode makes the Q8_0 dot product compute-bound: the AVX2 kernel spends six
 * instructions on each 32 elements of each (row, activation) pair. Here a 512-bit
 * register holds two blocks and vpdpbusd does the multiply-add in one instruction, so a
 * pair costs four instructions per 64 elements. vpdpbusd multiplies unsigned by signed
 * bytes: activations are offset to a + 128 (1..255, as they never hold -128) and the
 * accumulator starts at -128 * (sum of the weights of its four bytes), which makes each
 * block's integer sum exactly the one the scalar kernel computes; only the order of the
 * f32 additions differs from the AVX2 and scalar kernels. quant.c sends one activation
 * (decode) here too, so that a row's result is the same alone or batched.
 */
#if defined(__x86_64__)

#include "engine/quant_avx512.h"

#include <immintrin.h>
#include <stddef.h>

#include "engine/quant.h"
#include "engine/quant_blocks.h"

#define INLINE static inline __attribute__((always_inline))

/* Weight rows and activation rows per kernel call: 16 accumulators plus the weights,
 * their offsets and scales of 4 rows fit the 32 zmm registers. One activation takes
 * MR1 rows at once instead: more rows streaming from DRAM keep more misses in flight. */
#define MR 4
#define MA 4
#define MR1 8

/* The quants of blocks i and i + 1 (zero for the second when there is none). */
INLINE __m512i load_pair(const qblock_q8_0 *b, int64_t i, int64_t nb)
{
    __m256i lo = _mm256_loadu_si256((const __m256i *)(const void *)b[i].qs);
    __m256i hi = i + 1 < nb ? _mm256_loadu_si256((const __m256i *)(const void *)b[i + 1].qs)
                            : _mm256_setzero_si256();
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* Scales of blocks i and i + 1, each over 8 lanes (0 for a missing second block). */
INLINE __m512 scale_pair(const qblock_q8_0 *b, int64_t i, int64_t nb)
{
    float d0 = _cvtsh_ss(b[i].d), d1 = i + 1 < nb ? _cvtsh_ss(b[i + 1].d) : 0.0f;
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(d0)), _mm256_set1_ps(d1), 1);
}

INLINE void multi_q8_0(int nr, int na, const uint8_t *w, size_t rb, const uint8_t *act,
                       size_t as, int64_t nb, float *out, size_t os)
{
    const qblock_q8_0 *x[MR1], *y[MA];
    __m512 acc[MR1][MA];
#pragma GCC unroll 8
    for (int r = 0; r < nr; r++)
        x[r] = (const qblock_q8_0 *)(const void *)(w + (size_t)r * rb);
#pragma GCC unroll 8
    for (int a = 0; a < na; a++)
        y[a] = (const qblock_q8_0 *)(const void *)(act + (size_t)a * as);
#pragma GCC unroll 8
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 8
        for (int a = 0; a < na; a++)
            acc[r][a] = _mm512_setzero_ps();
    const __m512i ones = _mm512_set1_epi8(1), bias = _mm512_set1_epi8((char)0x80);
    /* One activation (decode) streams the weights from DRAM: fetch the next group of rows
     * evenly over this pass, as the AVX2 kernel does. Integer addresses, as the last
     * group prefetches past the matrix (harmless). */
    uintptr_t pf = (uintptr_t)w + (size_t)nr * rb;
    size_t pf_step = na == 1 && nb ? 2 * (size_t)nr * rb / (size_t)nb : 0;
    for (int64_t i = 0; i < nb; i += 2) {
        __m512i wq[MR1], wcorr[MR1];
        __m512 dw[MR1];
        for (size_t k = 0; k < pf_step; k += 64)
            _mm_prefetch((const char *)(pf + (size_t)i / 2 * pf_step + k), _MM_HINT_T0);
#pragma GCC unroll 8
        for (int r = 0; r < nr; r++) {
            wq[r] = load_pair(x[r], i, nb);
            __m512i wsum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, wq[r]);
            wcorr[r] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(wsum, 7));
            dw[r] = scale_pair(x[r], i, nb);
        }
#pragma GCC unroll 8
        for (int a = 0; a < na; a++) {
            __m512i au = _mm512_xor_si512(load_pair(y[a], i, nb), bias);
            __m512 da = scale_pair(y[a], i, nb);
#pragma GCC unroll 8
            for (int r = 0; r < nr; r++) {
                __m512 s = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(wcorr[r], au, wq[r]));
                acc[r][a] = _mm512_fmadd_ps(_mm512_mul_ps(dw[r], da), s, acc[r][a]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 8
        for (int a = 0; a < na; a++)
            out[(size_t)a * os + r] = _mm512_reduce_add_ps(acc[r][a]);
}

/* All rows for one group of na (constant after inlining) activations. */
INLINE void multi_q8_0_rows(int na, const uint8_t *w, size_t rb, int64_t n_rows,
                            const uint8_t *act, size_t as, int64_t nb, float *out, size_t os)
{
    const int mr = na == 1 ? MR1 : MR;
    int64_t r = 0;
    for (; r + mr <= n_rows; r += mr)
        multi_q8_0(mr, na, w + (size_t)r * rb, rb, act, as, nb, out + r, os);
    for (; r < n_rows; r++)
        multi_q8_0(1, na, w + (size_t)r * rb, rb, act, as, nb, out + r, os);
}

/*
 * Q4_K: one weight row at a time, its nibbles unpacked (64 per register, matching 64
 * consecutive activation bytes) and its sub-block scales widened once per super-block
 * for up to MA activations. Nibbles are unsigned, so maddubs takes them as they are and
 * madd applies the scales while widening: the same integers as the scalar kernel.
 */
INLINE void multi_q4_k(int na, const qblock_q4_k *x, const uint8_t *act, size_t as, int64_t nb,
                       float *out, size_t os)
{
    const qblock_q8_k *y[MA];
    __m512 acc[MA];
    __m256 accm[MA];
#pragma GCC unroll 8
    for (int a = 0; a < na; a++) {
        y[a] = (const qblock_q8_k *)(const void *)(act + (size_t)a * as);
        acc[a] = _mm512_setzero_ps();
        accm[a] = _mm256_setzero_ps();
    }
    const __m512i m4 = _mm512_set1_epi8(0xF);
    const uint8_t *next_row = (const uint8_t *)(x + nb);
    for (int64_t i = 0; i < nb; i++) {
        if (na == 1)
            for (size_t k = 0; k < sizeof *x; k += 64)
                _mm_prefetch((const char *)(next_row + (size_t)i * sizeof *x + k), _MM_HINT_T0);
        uint64_t scw, m;
        qb_unpack_k_scales(x[i].scales, &scw, &m);
        __m128i m8 = _mm_cvtsi64_si128((long long)m);
        __m256i m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
        __m512i q[4], sc[4];
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            __m256i b = _mm256_loadu_si256((const __m256i *)(const void *)(x[i].qs + 32 * g));
            __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(b), _mm256_srli_epi16(b, 4), 1);
            q[g] = _mm512_and_si512(v, m4);
            sc[g] = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_set1_epi16((short)((scw >> (16 * g)) & 0xFF))),
                _mm256_set1_epi16((short)((scw >> (16 * g + 8)) & 0xFF)), 1);
        }
        float dw = _cvtsh_ss(x[i].d), dmin = _cvtsh_ss(x[i].dmin);
#pragma GCC unroll 8
        for (int a = 0; a < na; a++) {
            __m512i sumi = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                __m512i p = _mm512_maddubs_epi16(q[g], _mm512_loadu_si512(y[a][i].qs + 64 * g));
                sumi = _mm512_add_epi32(sumi, _mm512_madd_epi16(p, sc[g]));
            }
            acc[a] = _mm512_fmadd_ps(_mm512_set1_ps(dw * y[a][i].d), _mm512_cvtepi32_ps(sumi), acc[a]);
            __m256i bs = _mm256_loadu_si256(
                (const __m256i *)(const void *)((const uint8_t *)&y[a][i] + offsetof(qblock_q8_k, bsums)));
            accm[a] = _mm256_fmadd_ps(_mm256_set1_ps(dmin * y[a][i].d),
                                      _mm256_cvtepi32_ps(_mm256_madd_epi16(bs, m16)), accm[a]);
        }
    }
#pragma GCC unroll 8
    for (int a = 0; a < na; a++) {
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(accm[a]), _mm256_extractf128_ps(accm[a], 1));
        s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        s = _mm_add_ss(s, _mm_movehdup_ps(s));
        out[(size_t)a * os] = _mm512_reduce_add_ps(acc[a]) - _mm_cvtss_f32(s);
    }
}

INLINE void multi_q4_k_rows(int na, const uint8_t *w, size_t rb, int64_t n_rows,
                            const uint8_t *act, size_t as, int64_t nb, float *out, size_t os)
{
    for (int64_t r = 0; r < n_rows; r++)
        multi_q4_k(na, (const qblock_q4_k *)(const void *)(w + (size_t)r * rb), act, as, nb, out + r, os);
}

/* Calls ROWS(na, ...) for the activations in groups of MA, na constant in each call. */
#define FOR_GROUPS(ROWS, nb)                                                                  \
    do {                                                                                      \
        int a = 0;                                                                            \
        for (; a + MA <= n_act; a += MA)                                                      \
            ROWS(MA, w, row_bytes, n_rows, y + (size_t)a * act_stride, act_stride, nb,        \
                 out + (size_t)a * out_stride, out_stride);                                   \
        if (n_act - a == 3)                                                                   \
            ROWS(3, w, row_bytes, n_rows, y + (size_t)a * act_stride, act_stride, nb,         \
                 out + (size_t)a * out_stride, out_stride);                                   \
        else if (n_act - a == 2)                                                              \
            ROWS(2, w, row_bytes, n_rows, y + (size_t)a * act_stride, act_stride, nb,         \
                 out + (size_t)a * out_stride, out_stride);                                   \
        else if (n_act - a == 1)                                                              \
            ROWS(1, w, row_bytes, n_rows, y + (size_t)a * act_stride, act_stride, nb,         \
                 out + (size_t)a * out_stride, out_stride);                                   \
    } while (0)

int quant_avx512_dot_rows_multi(uint32_t t, const void *weights, size_t row_bytes,
                                int64_t n_rows, const void *act, size_t act_stride, int n_act,
                                int64_t n, float *out, size_t out_stride)
{
    const uint8_t *w = weights, *y = act;
    switch (t) {
    case QTYPE_Q8_0:
        FOR_GROUPS(multi_q8_0_rows, n / QB_32);
        return 1;
    case QTYPE_Q4_K:
        FOR_GROUPS(multi_q4_k_rows, n / QB_256);
        return 1;
    default:
        return 0;
    }
}

#endif
