/*
 * quant_avx2.c — AVX2/FMA/F16C dot-product, dequantization and activation-quantization
 * kernels (see quant_avx2.h). Compiled with -mavx2 -mfma -mf16c; quant.c calls in only
 * after checking the CPU.
 *
 * Dot products of quantized rows do exact integer arithmetic per block (the same integers
 * as the scalar kernels) and accumulate in f32 vectors, so they differ from the scalar
 * reference only by the order of f32 additions. Dequantization and activation
 * quantization give the scalar results bit for bit: each FMA there either has a zero
 * addend or a product that is exact in f32, so it rounds where the scalar code does.
 */
#if defined(__x86_64__)

#include "engine/quant/quant_avx2.h"

#include <immintrin.h>

#include "engine/quant/quant.h"
#include "engine/quant/quant_blocks.h"
#include "engine/quant/quant_iq.h"
#include "engine/quant/quant_x86.h"

#define INLINE static inline __attribute__((always_inline))

/* Rows processed per pass over the activation by the multi-row kernels. Eight rows stream
 * from DRAM faster than four on one thread (Q8_0 about 16 vs 13.7 GB/s in bench/quant_dot):
 * more independent streams keep more cache misses in flight. */
#define NR 8

INLINE float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

INLINE int hsum_i32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

INLINE __m256i load256(const void *p)
{
    return _mm256_loadu_si256((const __m256i *)p);
}

INLINE __m128i load128(const void *p)
{
    return _mm_loadu_si128((const __m128i *)p);
}

/* Sum of w[i] * a[i] over 32 signed bytes, as 8 int32 partial sums. maddubs wants an
 * unsigned first operand, so the signs of w move onto a; exact because quantized
 * activations never hold -128 (and |w| = 128 is fine as an unsigned byte). */
INLINE __m256i dot_i8x32(__m256i w, __m256i a)
{
    __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* The 32 nibbles (0..15, value + 8) of a Q4_0 block, in element order. */
INLINE __m256i unpack_q4_0(const uint8_t *qs)
{
    __m128i b = load128(qs);
    __m256i v = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
    return _mm256_and_si256(v, _mm256_set1_epi8(0xF));
}

/* 32 bytes, byte j 0xFF where bit j of the 32-bit h is set. */
INLINE __m256i bits_to_bytes(uint32_t h)
{
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h), spread);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

/* The 32 values (0..31) of a Q5_0 / Q5_1 block, in element order. */
INLINE __m256i unpack_q5(const uint8_t *qh, const uint8_t *qs)
{
    uint32_t h;
    memcpy(&h, qh, 4);
    __m256i fifth = _mm256_and_si256(bits_to_bytes(h), _mm256_set1_epi8(16));
    return _mm256_or_si256(unpack_q4_0(qs), fifth);
}

/*
 * Multi-row kernels take nr (1..NR, a constant after inlining) rows that share each
 * activation load. The arithmetic of a row is the same for every nr, so a row's result
 * does not depend on how rows were grouped.
 */

/* One accumulator per row: NR rows already give NR independent FMA chains, and a second
 * set would not fit the 16 ymm registers beside the activation. */
INLINE void rows_q8_0(int nr, const uint8_t *w, size_t rb, const qblock_q8_0 *y, int64_t nb,
                      float *out)
{
    const qblock_q8_0 *x[NR];
    __m256 acc[NR];
#pragma GCC unroll 8
    for (int r = 0; r < nr; r++) {
        x[r] = (const qblock_q8_0 *)(const void *)(w + (size_t)r * rb);
        acc[r] = _mm256_setzero_ps();
    }
    /* The next group of rows follows this one in memory: fetching it evenly over this
     * pass turns eight strided streams into one sequential stream ahead of them, which
     * the hardware prefetcher alone does not keep up with (2 threads: ~17 -> ~22 GB/s).
     * Integer addresses, as the last group prefetches past the matrix (harmless). */
    uintptr_t pf = (uintptr_t)w + (size_t)nr * rb;
    size_t pf_step = nb ? (size_t)nr * rb / (size_t)nb : 0;
    for (int64_t i = 0; i < nb; i++) {
        __m256i a = load256(y[i].qs);
        float da = _cvtsh_ss(y[i].d);
        for (size_t k = 0; k < pf_step; k += 64)
            _mm_prefetch((const char *)(pf + (size_t)i * pf_step + k), _MM_HINT_T0);
#pragma GCC unroll 8
        for (int r = 0; r < nr; r++) {
            __m256 p = _mm256_cvtepi32_ps(dot_i8x32(load256(x[r][i].qs), a));
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(x[r][i].d) * da), p, acc[r]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < nr; r++)
        out[r] = hsum(acc[r]);
}

INLINE void rows_q4_0(int nr, const uint8_t *w, size_t rb, const qblock_q8_0 *y, int64_t nb,
                      float *out)
{
    const qblock_q4_0 *x[NR];
    __m256 acc[NR];
#pragma GCC unroll 8
    for (int r = 0; r < nr; r++) {
        x[r] = (const qblock_q4_0 *)(const void *)(w + (size_t)r * rb);
        acc[r] = _mm256_setzero_ps();
    }
    /* the next group of rows fetched evenly over this pass, as rows_q8_0 does: without
     * it, one thread read 8.5 GB/s of Q4_0 rows from DRAM where they read 16.8 from L2 */
    uintptr_t pf = (uintptr_t)w + (size_t)nr * rb;
    size_t pf_step = nb ? (size_t)nr * rb / (size_t)nb : 0;
    for (int64_t i = 0; i < nb; i++) {
        for (size_t k = 0; k < pf_step; k += 64)
            _mm_prefetch((const char *)(pf + (size_t)i * pf_step + k), _MM_HINT_T0);
        /* sum (q - 8) a = sum q a - 8 sum a, with q unsigned as maddubs wants it; the
         * second sum is shared by all rows. */
        __m256i a = load256(y[i].qs);
        __m256i a8 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), a),
                                       _mm256_set1_epi16(8));
        float da = _cvtsh_ss(y[i].d);
#pragma GCC unroll 8
        for (int r = 0; r < nr; r++) {
            __m256i qa = _mm256_maddubs_epi16(unpack_q4_0(x[r][i].qs), a);
            __m256 p = _mm256_cvtepi32_ps(
                _mm256_sub_epi32(_mm256_madd_epi16(qa, _mm256_set1_epi16(1)), a8));
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(x[r][i].d) * da), p, acc[r]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < nr; r++)
        out[r] = hsum(acc[r]);
}

/* Eight consecutive weights of a float type t (F32, F16, BF16) starting at element i. */
INLINE __m256 load8_float(uint32_t t, const void *row, int64_t i)
{
    if (t == QTYPE_F32)
        return _mm256_loadu_ps((const float *)row + i);
    __m128i h = load128((const uint16_t *)row + i);
    if (t == QTYPE_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

INLINE void rows_float(uint32_t t, int nr, const uint8_t *w, size_t rb, const float *a,
                       int64_t n, float *out)
{
    const void *x[NR];
    __m256 acc[NR];
#pragma GCC unroll 8
    for (int r = 0; r < nr; r++) {
        x[r] = w + (size_t)r * rb;
        acc[r] = _mm256_setzero_ps();
    }
    /* prefetch the next group of rows evenly over this pass, as rows_q8_0 does */
    uintptr_t pf = (uintptr_t)w + (size_t)nr * rb;
    size_t pf_step = n >= 8 ? (size_t)nr * rb / (size_t)(n / 8) : 0;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 a0 = _mm256_loadu_ps(a + i);
        for (size_t k = 0; k < pf_step; k += 64)
            _mm_prefetch((const char *)(pf + (size_t)(i / 8) * pf_step + k), _MM_HINT_T0);
#pragma GCC unroll 8
        for (int r = 0; r < nr; r++)
            acc[r] = _mm256_fmadd_ps(load8_float(t, x[r], i), a0, acc[r]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < nr; r++) {
        float s = hsum(acc[r]);
        for (int64_t j = i; j < n; j++)
            s += qb_load_float(t, x[r], j) * a[j];
        out[r] = s;
    }
}

/* Per-sub-block 6-bit mins of a Q4_K/Q5_K super-block (bytes of m) times the activation's
 * pair sums of bsums: 8 int32 m[j] * (bsums[2j] + bsums[2j+1]). */
INLINE __m256i k_mins_dot(uint64_t m, const qblock_q8_k *y)
{
    __m128i m8 = _mm_cvtsi64_si128((long long)m);
    __m256i m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
    return _mm256_madd_epi16(load256((const uint8_t *)y + offsetof(qblock_q8_k, bsums)), m16);
}

/* The 8 bytes of a qb_unpack_k_scales word as int16, repeated in both 128-bit lanes. */
INLINE __m256i k_bytes16(uint64_t v)
{
    return _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)v)));
}

/* 16-bit element j of each lane, broadcast over the lane. */
INLINE __m256i pick16(__m256i v, int j)
{
    return _mm256_shuffle_epi8(v, _mm256_set1_epi16((short)(((2 * j + 1) << 8) | (2 * j))));
}

/* The K-quant kernels take one row per pass: a two-row version sharing the activation
 * loads measured no faster (those loads hit L1, and one super-block already has ample
 * independent work). */

static float dot_q4_k(const qblock_q4_k *x, const qblock_q8_k *y, int64_t nb)
{
    const __m256i m4 = _mm256_set1_epi8(0xF);
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        uint64_t scw, m;
        qb_unpack_k_scales(x[i].scales, &scw, &m);
        __m256i sc = k_bytes16(scw);
        __m256 dmin = _mm256_set1_ps(y[i].d * _cvtsh_ss(x[i].dmin));
        accm = _mm256_fmadd_ps(dmin, _mm256_cvtepi32_ps(k_mins_dot(m, &y[i])), accm);
        __m256i sumi = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int g = 0; g < 4; g++) {
            __m256i q = load256(x[i].qs + 32 * g);
            __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            __m256i p0 = _mm256_maddubs_epi16(lo, load256(y[i].qs + 64 * g));
            __m256i p1 = _mm256_maddubs_epi16(hi, load256(y[i].qs + 64 * g + 32));
            p0 = _mm256_madd_epi16(p0, pick16(sc, 2 * g));
            p1 = _mm256_madd_epi16(p1, pick16(sc, 2 * g + 1));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
        }
        __m256 d = _mm256_set1_ps(y[i].d * _cvtsh_ss(x[i].d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum(acc) - hsum(accm);
}

static float dot_q5_k(const qblock_q5_k *x, const qblock_q8_k *y, int64_t nb)
{
    const __m256i m4 = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        uint64_t scw, m;
        qb_unpack_k_scales(x[i].scales, &scw, &m);
        __m256i sc = k_bytes16(scw);
        __m256 dmin = _mm256_set1_ps(y[i].d * _cvtsh_ss(x[i].dmin));
        accm = _mm256_fmadd_ps(dmin, _mm256_cvtepi32_ps(k_mins_dot(m, &y[i])), accm);
        __m256i sumi = _mm256_setzero_si256(), hb = load256(x[i].qh);
#pragma GCC unroll 8
        for (int g = 0; g < 4; g++) {
            __m256i q = load256(x[i].qs + 32 * g);
            /* Bit 2g of each qh byte becomes bit 4 of a low-nibble value, bit 2g+1 of a
             * high-nibble one; hb is shifted down two bits per group. */
            __m256i b0 = _mm256_slli_epi16(_mm256_and_si256(hb, one), 4);
            __m256i b1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 1), one), 4);
            hb = _mm256_srli_epi16(hb, 2);
            __m256i lo = _mm256_or_si256(_mm256_and_si256(q, m4), b0);
            __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), b1);
            __m256i p0 = _mm256_maddubs_epi16(lo, load256(y[i].qs + 64 * g));
            __m256i p1 = _mm256_maddubs_epi16(hi, load256(y[i].qs + 64 * g + 32));
            p0 = _mm256_madd_epi16(p0, pick16(sc, 2 * g));
            p1 = _mm256_madd_epi16(p1, pick16(sc, 2 * g + 1));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
        }
        __m256 d = _mm256_set1_ps(y[i].d * _cvtsh_ss(x[i].d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum(acc) - hsum(accm);
}

/* A shuffle picking 16-bit element 2k of each 128-bit lane's scales for the low lane and
 * element 2k+1 for the high lane: the scales of the two 16-element halves of a 32-value
 * Q6_K or Q3_K run. */
INLINE __m256i sub16_scale_pick(int k)
{
    short lo = (short)(((4 * k + 1) << 8) | (4 * k)), hi = (short)(((4 * k + 3) << 8) | (4 * k + 2));
    return _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo));
}

static float dot_q6_k(const qblock_q6_k *x, const qblock_q8_k *y, int64_t nb)
{
    const __m256i m4 = _mm256_set1_epi8(0xF), m3 = _mm256_set1_epi8(0x03);
    const __m256i m0c = _mm256_set1_epi8(0x0C), m30 = _mm256_set1_epi8(0x30);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        /* q is stored as q + 32: the sum of sc * 32 * a is taken off through bsums. */
        __m256i sc16 = _mm256_cvtepi8_epi16(load128(x[i].scales));
        __m256i bs = load256((const uint8_t *)&y[i] + offsetof(qblock_q8_k, bsums));
        __m256i sumi = _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), 5);
        sumi = _mm256_sub_epi32(_mm256_setzero_si256(), sumi);
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = x[i].ql + 64 * h;
            const int8_t *a = y[i].qs + 128 * h;
            __m256i l0 = load256(ql), l1 = load256(ql + 32), qh = load256(x[i].qh + 32 * h);
            __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(
                _mm_loadl_epi64((const __m128i *)(const void *)(x[i].scales + 8 * h))));
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4),
                                   _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                   _mm256_slli_epi16(_mm256_and_si256(qh, m0c), 2));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                   _mm256_and_si256(qh, m30));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                   _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
#pragma GCC unroll 8
            for (int k = 0; k < 4; k++) {
                __m256i p = _mm256_maddubs_epi16(q[k], load256(a + 32 * k));
                __m256i s = _mm256_shuffle_epi8(sc, sub16_scale_pick(k));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, s));
            }
        }
        __m256 d = _mm256_set1_ps(y[i].d * _cvtsh_ss(x[i].d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum(acc);
}

/*
 * Q4_1, Q5_0 and Q5_1 (kind, a constant after inlining) on Q8_0 activations, one row at a
 * time: a block's values unsigned in element order (Q5_0's as q, its - 16 taken off
 * through the activation's sum), maddubs and madd to 8 exact int32 sums of four products,
 * and Q4_1/Q5_1's m times those of the activation in an f32 accumulator of their own.
 */
enum legacy_kind { LEGACY_Q4_1, LEGACY_Q5_0, LEGACY_Q5_1 };

INLINE float dot_legacy(enum legacy_kind kind, const uint8_t *x, const qblock_q8_0 *y, int64_t nb)
{
    const size_t bb = kind == LEGACY_Q4_1   ? sizeof(qblock_q4_1)
                      : kind == LEGACY_Q5_0 ? sizeof(qblock_q5_0)
                                            : sizeof(qblock_q5_1);
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, x += bb) {
        __m256i u, a = load256(y[i].qs);
        if (kind == LEGACY_Q4_1)
            u = unpack_q4_0(((const qblock_q4_1 *)(const void *)x)->qs);
        else /* qh, then the 16 bytes of nibbles that end the block */
            u = unpack_q5(x + bb - 20, x + bb - 16);
        __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), ones16);
        __m256i sa = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, a), ones16);
        uint16_t dh; /* first in every struct */
        memcpy(&dh, x, sizeof dh);
        float da = _cvtsh_ss(y[i].d), dw = _cvtsh_ss(dh);
        if (kind == LEGACY_Q5_0) {
            p = _mm256_sub_epi32(p, _mm256_slli_epi32(sa, 4));
        } else {
            uint16_t m; /* after d in both structs */
            memcpy(&m, x + 2, sizeof m);
            accm = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(m) * da), _mm256_cvtepi32_ps(sa), accm);
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dw * da), _mm256_cvtepi32_ps(p), acc);
    }
    return hsum(acc) + hsum(accm);
}

/* The grid's 16 values in both 128-bit lanes, for a byte shuffle to look nibbles up in. */
INLINE __m256i iq4_grid_lanes(void)
{
    return _mm256_broadcastsi128_si256(load128(qb_iq4_grid));
}

/* IQ4_NL: the nibbles looked up in the grid (signed values, |v| <= 127), then as Q8_0's
 * weights: exact int32 sums of four products, scaled per block. */
static float dot_iq4_nl(const qblock_iq4_nl *x, const qblock_q8_0 *y, int64_t nb)
{
    const __m256i grid = iq4_grid_lanes();
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        __m256i w = _mm256_shuffle_epi8(grid, unpack_q4_0(x[i].qs));
        __m256 p = _mm256_cvtepi32_ps(dot_i8x32(w, load256(y[i].qs)));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(x[i].d) * _cvtsh_ss(y[i].d)), p, acc);
    }
    return hsum(acc);
}

/* MXFP4: as IQ4_NL, on the grid of twice the E2M1 values, scaled by half the block's
 * E8M0 scale: the scalar kernel's integers. */
static float dot_mxfp4(const qblock_mxfp4 *x, const qblock_q8_0 *y, int64_t nb)
{
    const __m256i grid = _mm256_broadcastsi128_si256(load128(qb_mxfp4_grid));
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        __m256i w = _mm256_shuffle_epi8(grid, unpack_q4_0(x[i].qs));
        __m256 p = _mm256_cvtepi32_ps(dot_i8x32(w, load256(y[i].qs)));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(qb_e8m0_half(x[i].e) * _cvtsh_ss(y[i].d)), p, acc);
    }
    return hsum(acc);
}

/* IQ4_XS: each sub-block of 32 as IQ4_NL's block, its products' pair sums (at most
 * 2 * 127 * 127, so no saturation) scaled by its 6-bit scale in madd: the scalar kernel's
 * integers. */
static float dot_iq4_xs(const qblock_iq4_xs *x, const qblock_q8_k *y, int64_t nb)
{
    const __m256i grid = iq4_grid_lanes();
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        __m256i sumi = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            __m256i w = _mm256_shuffle_epi8(grid, unpack_q4_0(x[i].qs + 16 * k));
            __m256i a = load256(y[i].qs + 32 * k);
            __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
            __m256i sc = _mm256_set1_epi16((short)qb_iq4_xs_scale(&x[i], k));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, sc));
        }
        __m256 d = _mm256_set1_ps(y[i].d * _cvtsh_ss(x[i].d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum(acc);
}

/*
 * The i-quants below 4 bits (quant_iq.h). A sub-block of 32 is built in a register from
 * its four groups' codebook entries (one table load each; IQ3: eight) and, but for IQ1,
 * their signs (+-1 bytes from a table, or IQ2_S's and IQ3_S's 8-bit masks spread and
 * tested in registers), which move onto the activation (_mm256_sign_epi8), so that
 * maddubs multiplies the unsigned magnitudes (at most 62: no saturation). Each 16 values'
 * pair sums are scaled by their 2 s + 1 in madd: the scalar kernel's integers, summed per
 * super-block and added up in its order (quant_iq_block_sum), so the result is its bits.
 * The scales are a broadcast where they sit with the signs, and otherwise one byte
 * shuffle per sub-block of the super-block's 16, made once. IQ1's shift adds each 16
 * values' (2 s + 1) times the sum of their activations, each with its group's shift sign:
 * IQ1_S's one sign per sub-block takes it from the activation's sums of 16. Batched
 * decode builds each sub-block once for IQ_MA activations.
 */
#define IQ_MA 4

typedef struct {
    __m256i q;     /* magnitudes (IQ1: the signed entries) */
    __m256i signs; /* +-1 per value (IQ1_M: its group's shift sign; IQ1_S: unused) */
    int ls;        /* IQ2_XXS, IQ3_XXS, IQ1_S: 2 s + 1, read with the signs */
} iq_sub_block;

/* Types whose scale fields sit with their signs, one per sub-block of 32. */
INLINE bool iq_scale_with_signs(uint32_t t)
{
    return t == QTYPE_IQ2_XXS || t == QTYPE_IQ3_XXS || t == QTYPE_IQ1_S;
}

INLINE __m256i iq_entries(uint64_t e0, uint64_t e1, uint64_t e2, uint64_t e3)
{
    return _mm256_set_epi64x((long long)e3, (long long)e2, (long long)e1, (long long)e0);
}

INLINE uint32_t iq_u32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The 16 values of 2 s + 1 of the super-block at x (one per 16 values), as bytes in both
 * lanes, for one byte shuffle per sub-block to spread (but where iq_scale_with_signs). */
INLINE __m256i iq_scales(uint32_t t, const uint8_t *x)
{
    __m128i s;
    if (t == QTYPE_IQ2_XS || t == QTYPE_IQ2_S || t == QTYPE_IQ3_S) {
        /* a nibble each, the low one first */
        const uint8_t *sc = t == QTYPE_IQ2_XS ? ((const qblock_iq2_xs *)(const void *)x)->scales
                            : t == QTYPE_IQ2_S ? ((const qblock_iq2_s *)(const void *)x)->scales
                                               : ((const qblock_iq3_s *)(const void *)x)->scales;
        __m128i v = t == QTYPE_IQ3_S ? _mm_cvtsi32_si128((int)iq_u32(sc))
                                     : _mm_loadl_epi64((const __m128i *)(const void *)sc);
        __m128i m = _mm_set1_epi8(0xf);
        s = _mm_unpacklo_epi8(_mm_and_si128(v, m), _mm_and_si128(_mm_srli_epi16(v, 4), m));
        if (t == QTYPE_IQ3_S) /* one per sub-block of 32: each for both its halves */
            s = _mm_unpacklo_epi8(s, s);
    } else if (t == QTYPE_IQ1_M) {
        uint64_t w, lo = 0, hi = 0;
        memcpy(&w, ((const qblock_iq1_m *)(const void *)x)->scales, 8);
        for (int k = 0; k < 8; k++) { /* sub-block k: word k / 2, bits 6 (k % 2) */
            uint64_t f = w >> (16 * (k / 2) + 6 * (k % 2));
            uint64_t pair = (f & 7) | ((f >> 3) & 7) << 8;
            if (k < 4)
                lo |= pair << (16 * k);
            else
                hi |= pair << (16 * (k - 4));
        }
        s = _mm_set_epi64x((long long)hi, (long long)lo);
    } else {
        return _mm256_setzero_si256(); /* iq_scale_with_signs */
    }
    s = _mm_add_epi8(_mm_add_epi8(s, s), _mm_set1_epi8(1));
    return _mm256_broadcastsi128_si256(s);
}

/* The +-1 multipliers of 4 groups' 8-bit sign masks (4 bytes at sg), made in registers. */
INLINE __m256i iq_signs8(const uint8_t *sg)
{
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2,
                                            2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bits = _mm256_set1_epi64x(0x8040201008040201ll);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)iq_u32(sg)), spread);
    return _mm256_or_si256(_mm256_cmpeq_epi8(_mm256_and_si256(b, bits), bits),
                           _mm256_set1_epi8(1));
}

/* IQ2_XXS's and IQ3_XXS's word of four 7-bit sign patterns and a scale. */
INLINE void iq_signs_and_scale(uint32_t aux, const quant_iq_tables *g, iq_sub_block *r)
{
    r->signs = iq_entries(g->even_signs[aux & 127], g->even_signs[(aux >> 7) & 127],
                          g->even_signs[(aux >> 14) & 127], g->even_signs[(aux >> 21) & 127]);
    r->ls = 2 * (int)(aux >> 28) + 1;
}

/* Sub-block k of the super-block at x, of type t (a constant once inlined). */
INLINE iq_sub_block iq_load(uint32_t t, const uint8_t *x, int k, const quant_iq_tables *g)
{
    iq_sub_block r;
    r.ls = 0;
    switch (t) {
    case QTYPE_IQ2_XXS: {
        const qblock_iq2_xxs *b = (const void *)x;
        uint32_t e = iq_u32(b->qs + 8 * k), aux = iq_u32(b->qs + 8 * k + 4);
        r.q = iq_entries(g->iq2xxs[e & 255], g->iq2xxs[(e >> 8) & 255],
                         g->iq2xxs[(e >> 16) & 255], g->iq2xxs[e >> 24]);
        iq_signs_and_scale(aux, g, &r);
        break;
    }
    case QTYPE_IQ2_XS: {
        const qblock_iq2_xs *b = (const void *)x;
        uint64_t w;
        memcpy(&w, b->qs + 8 * k, 8);
        uint32_t w0 = w & 0xffff, w1 = (w >> 16) & 0xffff, w2 = (w >> 32) & 0xffff, w3 = w >> 48;
        r.q = iq_entries(g->iq2xs[w0 & 511], g->iq2xs[w1 & 511], g->iq2xs[w2 & 511],
                         g->iq2xs[w3 & 511]);
        r.signs = iq_entries(g->even_signs[w0 >> 9], g->even_signs[w1 >> 9],
                             g->even_signs[w2 >> 9], g->even_signs[w3 >> 9]);
        break;
    }
    case QTYPE_IQ2_S: {
        const qblock_iq2_s *b = (const void *)x;
        const uint8_t *q = b->qs + 4 * k, *sg = b->signs + 4 * k;
        unsigned h = b->qh[k];
        r.q = iq_entries(g->iq2s[q[0] | (h & 3) << 8], g->iq2s[q[1] | (h & 0xc) << 6],
                         g->iq2s[q[2] | (h & 0x30) << 4], g->iq2s[q[3] | (h & 0xc0) << 2]);
        r.signs = iq_signs8(sg);
        break;
    }
    case QTYPE_IQ3_XXS: {
        const qblock_iq3_xxs *b = (const void *)x;
        const uint8_t *q = b->qs + 8 * k;
        uint32_t aux = iq_u32(b->scales_signs + 4 * k);
        r.q = _mm256_setr_epi32((int)g->iq3xxs[q[0]], (int)g->iq3xxs[q[1]], (int)g->iq3xxs[q[2]],
                                (int)g->iq3xxs[q[3]], (int)g->iq3xxs[q[4]], (int)g->iq3xxs[q[5]],
                                (int)g->iq3xxs[q[6]], (int)g->iq3xxs[q[7]]);
        iq_signs_and_scale(aux, g, &r);
        break;
    }
    case QTYPE_IQ3_S: {
        const qblock_iq3_s *b = (const void *)x;
        const uint8_t *q = b->qs + 8 * k, *sg = b->signs + 4 * k;
        unsigned h = b->qh[k]; /* entry 2 l + m's ninth bit at bit 2 l + m */
        r.q = _mm256_setr_epi32(
            (int)g->iq3s[q[0] | (h << 8 & 256)], (int)g->iq3s[q[1] | (h << 7 & 256)],
            (int)g->iq3s[q[2] | (h << 6 & 256)], (int)g->iq3s[q[3] | (h << 5 & 256)],
            (int)g->iq3s[q[4] | (h << 4 & 256)], (int)g->iq3s[q[5] | (h << 3 & 256)],
            (int)g->iq3s[q[6] | (h << 2 & 256)], (int)g->iq3s[q[7] | (h << 1 & 256)]);
        r.signs = iq_signs8(sg);
        break;
    }
    case QTYPE_IQ1_S: {
        const qblock_iq1_s *b = (const void *)x;
        const uint8_t *q = b->qs + 4 * k;
        unsigned h = (unsigned)b->qh[2 * k] | (unsigned)b->qh[2 * k + 1] << 8;
        r.q = iq_entries(g->iq1s[q[0] | (h & 7) << 8], g->iq1s[q[1] | ((h >> 3) & 7) << 8],
                         g->iq1s[q[2] | ((h >> 6) & 7) << 8], g->iq1s[q[3] | ((h >> 9) & 7) << 8]);
        r.signs = _mm256_setzero_si256();
        r.ls = 2 * (int)((h >> 12) & 7) + 1;
        break;
    }
    default: { /* IQ1_M: a shift sign per group, bit 3 of its nibble */
        const qblock_iq1_m *b = (const void *)x;
        const uint8_t *q = b->qs + 4 * k;
        unsigned h = (unsigned)b->qh[2 * k] | (unsigned)b->qh[2 * k + 1] << 8;
        r.q = iq_entries(g->iq1s[q[0] | (h & 7) << 8], g->iq1s[q[1] | ((h >> 4) & 7) << 8],
                         g->iq1s[q[2] | ((h >> 8) & 7) << 8], g->iq1s[q[3] | ((h >> 12) & 7) << 8]);
        r.signs = iq_entries(g->signs[(h >> 3 & 1) * 255], g->signs[(h >> 7 & 1) * 255],
                             g->signs[(h >> 11 & 1) * 255], g->signs[(h >> 15 & 1) * 255]);
        break;
    }
    }
    return r;
}

/* IQ1_S's shift: its one sign per sub-block, so each sub-block's sum of activations,
 * from the activation's sums of 16. */
INLINE int32_t iq1_s_shifted(const qblock_iq1_s *b, const qblock_q8_k *y)
{
    int32_t shifted = 0;
    for (int k = 0; k < 8; k++) {
        unsigned h = (unsigned)b->qh[2 * k] | (unsigned)b->qh[2 * k + 1] << 8;
        int32_t a = y->bsums[2 * k] + y->bsums[2 * k + 1];
        shifted += (2 * (int32_t)((h >> 12) & 7) + 1) * (h & 0x8000 ? -a : a);
    }
    return shifted;
}

/* One row of type t against na activations (na a constant once inlined) y[a], each
 * summed as it would be alone: out[a * out_stride] gets its dot product. Each sub-block
 * is built once for all of them. */
INLINE void dot_iq_kind(uint32_t t, int na, const uint8_t *x, const qblock_q8_k *const *y,
                        int64_t nb, float *out, size_t out_stride)
{
    const quant_iq_tables *g = quant_iq_tables_get();
    const size_t bytes = quant_traits_of(t)->block_bytes;
    const bool iq1 = t == QTYPE_IQ1_S || t == QTYPE_IQ1_M;
    const __m256i one = _mm256_set1_epi8(1);
    /* picks byte 2 k (low lane) or 2 k + 1 (high lane) of the scales into each int16 */
    const __m256i pick = _mm256_setr_epi8(0, -128, 0, -128, 0, -128, 0, -128, 0, -128, 0, -128,
                                          0, -128, 0, -128, 1, -128, 1, -128, 1, -128, 1, -128,
                                          1, -128, 1, -128, 1, -128, 1, -128);
    float sum[IQ_MA] = {0};
    for (int64_t i = 0; i < nb; i++, x += bytes) {
        __m256i sumi[IQ_MA], shifted[IQ_MA];
        for (int a = 0; a < na; a++)
            sumi[a] = shifted[a] = _mm256_setzero_si256();
        __m256i scales = iq_scales(t, x);
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            iq_sub_block s = iq_load(t, x, k, g);
            __m256i sc =
                iq_scale_with_signs(t)
                    ? _mm256_set1_epi16((short)s.ls)
                    : _mm256_shuffle_epi8(scales,
                                          _mm256_add_epi8(pick, _mm256_set1_epi8((char)(2 * k))));
            __m256i magnitudes = iq1 ? _mm256_sign_epi8(s.q, s.q) : s.q;
            for (int a = 0; a < na; a++) {
                __m256i v = load256(y[a][i].qs + 32 * k);
                __m256i p = _mm256_maddubs_epi16(magnitudes,
                                                 _mm256_sign_epi8(v, iq1 ? s.q : s.signs));
                sumi[a] = _mm256_add_epi32(sumi[a], _mm256_madd_epi16(p, sc));
                if (t == QTYPE_IQ1_M) {
                    __m256i pa = _mm256_maddubs_epi16(one, _mm256_sign_epi8(v, s.signs));
                    shifted[a] = _mm256_add_epi32(shifted[a], _mm256_madd_epi16(pa, sc));
                }
            }
        }
        float d = quant_iq_d(t, x);
        for (int a = 0; a < na; a++) {
            int32_t sh = t == QTYPE_IQ1_S   ? iq1_s_shifted((const void *)x, &y[a][i])
                         : t == QTYPE_IQ1_M ? hsum_i32(shifted[a])
                                            : 0;
            sum[a] += quant_iq_block_sum(t, d, y[a][i].d, hsum_i32(sumi[a]), sh);
        }
    }
    for (int a = 0; a < na; a++)
        out[(size_t)a * out_stride] = quant_iq_row_factor(t) * sum[a];
}

#define IQ_KIND_CASE(T, NA)                                                                  \
    case T:                                                                                  \
        for (int64_t r = 0; r < n_rows; r++)                                                 \
            dot_iq_kind(T, NA, w + (size_t)r * row_bytes, y, nb, out + r, out_stride);       \
        break;

/* n_rows rows of the i-quant t against na activations y[a] (na 1 or IQ_MA). */
static void rows_iq(uint32_t t, int na, const uint8_t *w, size_t row_bytes, int64_t n_rows,
                    const qblock_q8_k *const *y, int64_t nb, float *out, size_t out_stride)
{
    if (na == IQ_MA) {
        switch (t) {
            IQ_KIND_CASE(QTYPE_IQ2_XXS, IQ_MA)
            IQ_KIND_CASE(QTYPE_IQ2_XS, IQ_MA)
            IQ_KIND_CASE(QTYPE_IQ2_S, IQ_MA)
            IQ_KIND_CASE(QTYPE_IQ3_XXS, IQ_MA)
            IQ_KIND_CASE(QTYPE_IQ3_S, IQ_MA)
            IQ_KIND_CASE(QTYPE_IQ1_S, IQ_MA)
            IQ_KIND_CASE(QTYPE_IQ1_M, IQ_MA)
        default:
            break;
        }
        return;
    }
    switch (t) {
        IQ_KIND_CASE(QTYPE_IQ2_XXS, 1)
        IQ_KIND_CASE(QTYPE_IQ2_XS, 1)
        IQ_KIND_CASE(QTYPE_IQ2_S, 1)
        IQ_KIND_CASE(QTYPE_IQ3_XXS, 1)
        IQ_KIND_CASE(QTYPE_IQ3_S, 1)
        IQ_KIND_CASE(QTYPE_IQ1_S, 1)
        IQ_KIND_CASE(QTYPE_IQ1_M, 1)
    default:
        break;
    }
}

/* quant_avx2_dot_rows_multi's i-quants: IQ_MA activations a pass, the rest one by one. */
static void multi_iq_rows(uint32_t t, const uint8_t *w, size_t row_bytes, int64_t n_rows,
                          const uint8_t *act, size_t act_stride, int n_act, int64_t nb,
                          float *out, size_t out_stride)
{
    for (int a = 0; a < n_act;) {
        int na = n_act - a >= IQ_MA ? IQ_MA : 1;
        const qblock_q8_k *y[IQ_MA];
        for (int b = 0; b < na; b++)
            y[b] = (const void *)(act + (size_t)(a + b) * act_stride);
        rows_iq(t, na, w, row_bytes, n_rows, y, nb, out + (size_t)a * out_stride, out_stride);
        a += na;
    }
}

/* Q3_K as Q6_K: the 3-bit values unpacked unsigned (q, stored as q - 4 + 4) 32 at a time in
 * element order, the + 4 taken off through bsums, the int8 scales (sc - 32) applied by
 * madd: the integers of the scalar kernel. */
static float dot_q3_k(const qblock_q3_k *x, const qblock_q8_k *y, int64_t nb)
{
    const __m256i m3 = _mm256_set1_epi8(0x03), one = _mm256_set1_epi8(1);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        __m128i sc8 = qx_q3_k_scales(x[i].scales);
        __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
        /* each half's 8 scales in both lanes */
        const __m256i sch[2] = {_mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(sc8)),
                                _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_srli_si128(sc8, 8)))};
        __m256i bs = load256((const uint8_t *)&y[i] + offsetof(qblock_q8_k, bsums));
        __m256i sumi = _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), 2);
        sumi = _mm256_sub_epi32(_mm256_setzero_si256(), sumi);
        __m256i hm = load256(x[i].hmask);
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256i v = load256(x[i].qs + 32 * h);
            const int8_t *a = y[i].qs + 128 * h;
            __m256i sc = sch[h];
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                /* bits move within 16-bit lanes; the masks keep each byte's own */
                __m256i lo = _mm256_and_si256(_mm256_srli_epi16(v, 2 * j), m3);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + j), one);
                __m256i q = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 2));
                __m256i p = _mm256_maddubs_epi16(q, load256(a + 32 * j));
                __m256i s = _mm256_shuffle_epi8(sc, sub16_scale_pick(j));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, s));
            }
        }
        __m256 d = _mm256_set1_ps(y[i].d * _cvtsh_ss(x[i].d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum(acc);
}

/* Q2_K as Q3_K without the third bit and the offset: the scales (low nibbles) applied by
 * madd, the mins (high nibbles) times the activation's sums of 16 in their own f32
 * accumulator, as Q4_K's. */
static float dot_q2_k(const qblock_q2_k *x, const qblock_q8_k *y, int64_t nb)
{
    const __m128i m4 = _mm_set1_epi8(0xF);
    const __m256i m3 = _mm256_set1_epi8(0x03);
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        __m128i s8 = load128(x[i].scales);
        __m256i sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(s8, m4));
        __m256i m16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s8, 4), m4));
        __m256i bs = load256((const uint8_t *)&y[i] + offsetof(qblock_q8_k, bsums));
        __m256 dmin = _mm256_set1_ps(y[i].d * _cvtsh_ss(x[i].dmin));
        accm = _mm256_fmadd_ps(dmin, _mm256_cvtepi32_ps(_mm256_madd_epi16(bs, m16)), accm);
        __m256i sumi = _mm256_setzero_si256();
        /* the scales of each half's 8 sub-blocks in both lanes */
        const __m256i sch[2] = {_mm256_permute2x128_si256(sc16, sc16, 0x00),
                                _mm256_permute2x128_si256(sc16, sc16, 0x11)};
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256i v = load256(x[i].qs + 32 * h);
            const int8_t *a = y[i].qs + 128 * h;
            __m256i sc = sch[h];
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                __m256i q = _mm256_and_si256(_mm256_srli_epi16(v, 2 * j), m3);
                __m256i p = _mm256_maddubs_epi16(q, load256(a + 32 * j));
                __m256i s = _mm256_shuffle_epi8(sc, sub16_scale_pick(j));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, s));
            }
        }
        __m256 d = _mm256_set1_ps(y[i].d * _cvtsh_ss(x[i].d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum(acc) - hsum(accm);
}

/*
 * Several activation rows at once (batched decode): each weight block is loaded, and
 * its signs taken, once for MA activations. Every (row, activation) pair keeps its own
 * accumulator and the same operations as rows_q8_0, so each result equals quant_dot's
 * bit for bit. MR x MA = 8 accumulators, plus the weights and one activation, fit the
 * 16 ymm registers.
 */
#define MR 2
#define MA 4

INLINE void multi_q8_0(int nr, int na, const uint8_t *w, size_t rb, const uint8_t *act,
                       size_t as, int64_t nb, float *out, size_t os)
{
    const qblock_q8_0 *x[MR], *y[MA];
    __m256 acc[MR][MA];
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
            acc[r][a] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        __m256i wq[MR], wabs[MR];
        float dw[MR];
#pragma GCC unroll 8
        for (int r = 0; r < nr; r++) {
            wq[r] = load256(x[r][i].qs);
            wabs[r] = _mm256_sign_epi8(wq[r], wq[r]);
            dw[r] = _cvtsh_ss(x[r][i].d);
        }
#pragma GCC unroll 8
        for (int a = 0; a < na; a++) {
            __m256i aq = load256(y[a][i].qs);
            float da = _cvtsh_ss(y[a][i].d);
#pragma GCC unroll 8
            for (int r = 0; r < nr; r++) {
                __m256i p = _mm256_maddubs_epi16(wabs[r], _mm256_sign_epi8(aq, wq[r]));
                __m256 s = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
                acc[r][a] = _mm256_fmadd_ps(_mm256_set1_ps(dw[r] * da), s, acc[r][a]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 8
        for (int a = 0; a < na; a++)
            out[(size_t)a * os + r] = hsum(acc[r][a]);
}

/* Rows of one group of up to MA activations, MR at a time; na is constant after inlining. */
INLINE void multi_q8_0_rows(int na, const uint8_t *w, size_t rb, int64_t n_rows,
                            const uint8_t *act, size_t as, int64_t nb, float *out, size_t os)
{
    int64_t r = 0;
    for (; r + MR <= n_rows; r += MR)
        multi_q8_0(MR, na, w + (size_t)r * rb, rb, act, as, nb, out + r, os);
    for (; r < n_rows; r++)
        multi_q8_0(1, na, w + (size_t)r * rb, rb, act, as, nb, out + r, os);
}

int quant_avx2_dot_rows_multi(uint32_t t, const void *weights, size_t row_bytes,
                              int64_t n_rows, const void *act, size_t act_stride, int n_act,
                              int64_t n, float *out, size_t out_stride)
{
    if (quant_iq_type(t)) {
        multi_iq_rows(t, weights, row_bytes, n_rows, act, act_stride, n_act, n / QB_256, out,
                      out_stride);
        return 1;
    }
    if (t != QTYPE_Q8_0)
        return 0;
    const uint8_t *w = weights, *y = act;
    int64_t nb = n / QB_32;
    int a = 0;
    for (; a + MA <= n_act; a += MA)
        multi_q8_0_rows(MA, w, row_bytes, n_rows, y + (size_t)a * act_stride, act_stride, nb,
                        out + (size_t)a * out_stride, out_stride);
    switch (n_act - a) {
    case 3:
        multi_q8_0_rows(3, w, row_bytes, n_rows, y + (size_t)a * act_stride, act_stride, nb,
                        out + (size_t)a * out_stride, out_stride);
        break;
    case 2:
        multi_q8_0_rows(2, w, row_bytes, n_rows, y + (size_t)a * act_stride, act_stride, nb,
                        out + (size_t)a * out_stride, out_stride);
        break;
    case 1:
        multi_q8_0_rows(1, w, row_bytes, n_rows, y + (size_t)a * act_stride, act_stride, nb,
                        out + (size_t)a * out_stride, out_stride);
        break;
    default:
        break;
    }
    return 1;
}

void quant_avx2_dot_rows(uint32_t t, const void *weights, size_t row_bytes, int64_t n_rows,
                         const void *activation, int64_t n, float *out)
{
    const uint8_t *w = weights;
    int64_t r = 0;
    switch (t) {
    case QTYPE_Q8_0:
        for (; r + NR <= n_rows; r += NR)
            rows_q8_0(NR, w + (size_t)r * row_bytes, row_bytes, activation, n / QB_32, out + r);
        for (; r < n_rows; r++)
            rows_q8_0(1, w + (size_t)r * row_bytes, row_bytes, activation, n / QB_32, out + r);
        break;
    case QTYPE_Q4_0:
        for (; r + NR <= n_rows; r += NR)
            rows_q4_0(NR, w + (size_t)r * row_bytes, row_bytes, activation, n / QB_32, out + r);
        for (; r < n_rows; r++)
            rows_q4_0(1, w + (size_t)r * row_bytes, row_bytes, activation, n / QB_32, out + r);
        break;
    case QTYPE_F32:
    case QTYPE_F16:
    case QTYPE_BF16:
        for (; r + NR <= n_rows; r += NR) {
            const uint8_t *x = w + (size_t)r * row_bytes;
            if (t == QTYPE_F32)
                rows_float(QTYPE_F32, NR, x, row_bytes, activation, n, out + r);
            else if (t == QTYPE_F16)
                rows_float(QTYPE_F16, NR, x, row_bytes, activation, n, out + r);
            else
                rows_float(QTYPE_BF16, NR, x, row_bytes, activation, n, out + r);
        }
        for (; r < n_rows; r++) {
            const uint8_t *x = w + (size_t)r * row_bytes;
            if (t == QTYPE_F32)
                rows_float(QTYPE_F32, 1, x, row_bytes, activation, n, out + r);
            else if (t == QTYPE_F16)
                rows_float(QTYPE_F16, 1, x, row_bytes, activation, n, out + r);
            else
                rows_float(QTYPE_BF16, 1, x, row_bytes, activation, n, out + r);
        }
        break;
    case QTYPE_Q4_1:
        for (; r < n_rows; r++)
            out[r] = dot_legacy(LEGACY_Q4_1, w + (size_t)r * row_bytes, activation, n / QB_32);
        break;
    case QTYPE_Q5_0:
        for (; r < n_rows; r++)
            out[r] = dot_legacy(LEGACY_Q5_0, w + (size_t)r * row_bytes, activation, n / QB_32);
        break;
    case QTYPE_Q5_1:
        for (; r < n_rows; r++)
            out[r] = dot_legacy(LEGACY_Q5_1, w + (size_t)r * row_bytes, activation, n / QB_32);
        break;
    case QTYPE_IQ4_NL:
        for (; r < n_rows; r++)
            out[r] = dot_iq4_nl((const void *)(w + (size_t)r * row_bytes), activation, n / QB_32);
        break;
    case QTYPE_MXFP4:
        for (; r < n_rows; r++)
            out[r] = dot_mxfp4((const void *)(w + (size_t)r * row_bytes), activation, n / QB_32);
        break;
    case QTYPE_IQ4_XS:
        for (; r < n_rows; r++)
            out[r] = dot_iq4_xs((const void *)(w + (size_t)r * row_bytes), activation, n / QB_256);
        break;
    case QTYPE_Q4_K:
        for (; r < n_rows; r++)
            out[r] = dot_q4_k((const void *)(w + (size_t)r * row_bytes), activation, n / QB_256);
        break;
    case QTYPE_Q5_K:
        for (; r < n_rows; r++)
            out[r] = dot_q5_k((const void *)(w + (size_t)r * row_bytes), activation, n / QB_256);
        break;
    case QTYPE_Q6_K:
        for (; r < n_rows; r++)
            out[r] = dot_q6_k((const void *)(w + (size_t)r * row_bytes), activation, n / QB_256);
        break;
    case QTYPE_Q3_K:
        for (; r < n_rows; r++)
            out[r] = dot_q3_k((const void *)(w + (size_t)r * row_bytes), activation, n / QB_256);
        break;
    case QTYPE_Q2_K:
        for (; r < n_rows; r++)
            out[r] = dot_q2_k((const void *)(w + (size_t)r * row_bytes), activation, n / QB_256);
        break;
    default:
        if (quant_iq_type(t)) {
            const qblock_q8_k *y[1] = {activation};
            rows_iq(t, 1, w, row_bytes, n_rows, y, n / QB_256, out, 1);
            break;
        }
        for (; r < n_rows; r++)
            out[r] = 0;
        break;
    }
}

/* ---- dequantization ---- */

/*
 * The dequantizers widen 8 bytes at a time straight from memory into int32 lanes and
 * rebuild the values there: cheaper than widening a 32-byte register, which takes
 * cross-lane shuffles.
 */

INLINE __m256i zx8(const uint8_t *p)
{
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)p));
}

/* y[0..8) = d * q - m */
INLINE void store8(float *y, __m256i q, __m256 d, __m256 m)
{
    _mm256_storeu_ps(y, _mm256_fmsub_ps(d, _mm256_cvtepi32_ps(q), m));
}

static void dequant_q4_0(const qblock_q4_0 *b, float *y, int64_t nb)
{
    const __m256i m4 = _mm256_set1_epi32(0xF), k8 = _mm256_set1_epi32(8);
    const __m256 zero = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, y += QB_32) {
        __m256 d = _mm256_set1_ps(_cvtsh_ss(b[i].d));
        for (int k = 0; k < 16; k += 8) {
            __m256i v = zx8(b[i].qs + k);
            store8(y + k, _mm256_sub_epi32(_mm256_and_si256(v, m4), k8), d, zero);
            store8(y + 16 + k, _mm256_sub_epi32(_mm256_srli_epi32(v, 4), k8), d, zero);
        }
    }
}

/* Q4_1 and Q5_1: d * q + m, Q5_0: d * (q - 16). The product of d and an integer below
 * 2^5 is exact in f32, so the fused form rounds once where the scalar one does, and zeros
 * keep the scalar code's signs. */
INLINE void dequant_legacy(enum legacy_kind kind, const uint8_t *x, float *y, int64_t nb)
{
    const size_t bb = kind == LEGACY_Q4_1   ? sizeof(qblock_q4_1)
                      : kind == LEGACY_Q5_0 ? sizeof(qblock_q5_0)
                                            : sizeof(qblock_q5_1);
    const __m256i m4 = _mm256_set1_epi32(0xF), b4 = _mm256_set1_epi32(0x10);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int64_t i = 0; i < nb; i++, x += bb, y += QB_32) {
        uint16_t dh, mh = 0;
        uint32_t h = 0;
        memcpy(&dh, x, sizeof dh);
        if (kind != LEGACY_Q5_0)
            memcpy(&mh, x + 2, sizeof mh);
        if (kind != LEGACY_Q4_1)
            memcpy(&h, x + (kind == LEGACY_Q5_0 ? 2 : 4), sizeof h);
        const uint8_t *qs = x + bb - 16;
        __m256 vd = _mm256_set1_ps(_cvtsh_ss(dh));
        __m256 vm = _mm256_set1_ps(kind == LEGACY_Q5_0 ? 0.0f : -_cvtsh_ss(mh));
        for (int k = 0; k < 16; k += 8) {
            __m256i v = zx8(qs + k), lo = _mm256_and_si256(v, m4), hi = _mm256_srli_epi32(v, 4);
            if (kind != LEGACY_Q4_1) { /* bit j of h to bit 4 of element j */
                __m256i hl = _mm256_srlv_epi32(_mm256_set1_epi32((int)(h >> k)), lane);
                __m256i hh = _mm256_srlv_epi32(_mm256_set1_epi32((int)(h >> (16 + k))), lane);
                lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi32(hl, 4), b4));
                hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi32(hh, 4), b4));
            }
            if (kind == LEGACY_Q5_0) {
                lo = _mm256_sub_epi32(lo, b4);
                hi = _mm256_sub_epi32(hi, b4);
            }
            store8(y + k, lo, vd, vm);
            store8(y + 16 + k, hi, vd, vm);
        }
    }
}

/* 16 nibbles of IQ4_NL / IQ4_XS (MXFP4: of its grid), elements k .. k + 7 (low) and
 * k + 16 .. (high), as their grid_values times s, in int32: the integers the scalar code
 * multiplies d by. */
INLINE void iq4_values8(const int8_t grid_values[16], const uint8_t *qs, int k, int s,
                        __m256i *lo, __m256i *hi)
{
    const __m128i grid = load128(grid_values), m4 = _mm_set1_epi8(0xF);
    __m128i v = _mm_loadl_epi64((const __m128i *)(const void *)(qs + k));
    __m128i gl = _mm_shuffle_epi8(grid, _mm_and_si128(v, m4));
    __m128i gh = _mm_shuffle_epi8(grid, _mm_and_si128(_mm_srli_epi16(v, 4), m4));
    *lo = _mm256_mullo_epi32(_mm256_cvtepi8_epi32(gl), _mm256_set1_epi32(s));
    *hi = _mm256_mullo_epi32(_mm256_cvtepi8_epi32(gh), _mm256_set1_epi32(s));
}

/* IQ4_NL (a scale of 1) and IQ4_XS: d times the integers, as the scalar code rounds it. */
static void dequant_iq4_nl(const qblock_iq4_nl *b, float *y, int64_t nb)
{
    const __m256 zero = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, y += QB_32) {
        __m256 d = _mm256_set1_ps(_cvtsh_ss(b[i].d));
        for (int k = 0; k < 16; k += 8) {
            __m256i lo, hi;
            iq4_values8(qb_iq4_grid, b[i].qs, k, 1, &lo, &hi);
            store8(y + k, lo, d, zero);
            store8(y + 16 + k, hi, d, zero);
        }
    }
}

/* MXFP4: half the scale times twice the E2M1 values, exact as the scalar product. */
static void dequant_mxfp4(const qblock_mxfp4 *b, float *y, int64_t nb)
{
    const __m256 zero = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, y += QB_32) {
        __m256 d = _mm256_set1_ps(qb_e8m0_half(b[i].e));
        for (int k = 0; k < 16; k += 8) {
            __m256i lo, hi;
            iq4_values8(qb_mxfp4_grid, b[i].qs, k, 1, &lo, &hi);
            store8(y + k, lo, d, zero);
            store8(y + 16 + k, hi, d, zero);
        }
    }
}

static void dequant_iq4_xs(const qblock_iq4_xs *b, float *y, int64_t nb)
{
    const __m256 zero = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        __m256 d = _mm256_set1_ps(_cvtsh_ss(b[i].d));
        for (int sb = 0; sb < 8; sb++, y += 32) {
            int s = qb_iq4_xs_scale(&b[i], sb);
            for (int k = 0; k < 16; k += 8) {
                __m256i lo, hi;
                iq4_values8(qb_iq4_grid, b[i].qs + 16 * sb, k, s, &lo, &hi);
                store8(y + k, lo, d, zero);
                store8(y + 16 + k, hi, d, zero);
            }
        }
    }
}

/* The factors of a K-quant super-block as floats in memory, to be broadcast from there
 * (a broadcast load costs no ALU work): out[j] = f * byte j of v. */
INLINE void k_factors(float out[8], float f, uint64_t v)
{
    __m256 x = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)v)));
    _mm256_store_ps(out, _mm256_mul_ps(_mm256_set1_ps(f), x));
}

static void dequant_q4_k(const qblock_q4_k *b, float *y, int64_t nb)
{
    const __m256i m4 = _mm256_set1_epi32(0xF);
    float ds[8] __attribute__((aligned(32))), ms[8] __attribute__((aligned(32)));
    for (int64_t i = 0; i < nb; i++) {
        uint64_t sc, m;
        qb_unpack_k_scales(b[i].scales, &sc, &m);
        k_factors(ds, _cvtsh_ss(b[i].d), sc);
        k_factors(ms, _cvtsh_ss(b[i].dmin), m);
        for (int g = 0; g < 4; g++, y += 64) {
            __m256 d1 = _mm256_broadcast_ss(&ds[2 * g]), d2 = _mm256_broadcast_ss(&ds[2 * g + 1]);
            __m256 m1 = _mm256_broadcast_ss(&ms[2 * g]), m2 = _mm256_broadcast_ss(&ms[2 * g + 1]);
#pragma GCC unroll 8
            for (int k = 0; k < 32; k += 8) {
                __m256i v = zx8(b[i].qs + 32 * g + k);
                store8(y + k, _mm256_and_si256(v, m4), d1, m1);
                store8(y + 32 + k, _mm256_srli_epi32(v, 4), d2, m2);
            }
        }
    }
}

static void dequant_q5_k(const qblock_q5_k *b, float *y, int64_t nb)
{
    const __m256i m4 = _mm256_set1_epi32(0xF), b4 = _mm256_set1_epi32(0x10);
    float ds[8] __attribute__((aligned(32))), ms[8] __attribute__((aligned(32)));
    for (int64_t i = 0; i < nb; i++, y += QB_256) {
        uint64_t sc, m;
        qb_unpack_k_scales(b[i].scales, &sc, &m);
        k_factors(ds, _cvtsh_ss(b[i].d), sc);
        k_factors(ms, _cvtsh_ss(b[i].dmin), m);
        for (int k = 0; k < 32; k += 8) {
            /* Bit 2g of qh[l] is bit 4 of element 64g + l, bit 2g+1 of element 64g+32+l;
             * h moves down two bits per group, so the bits wanted sit at 4 and 5 after a
             * shift left by 4. */
            __m256i h = _mm256_slli_epi32(zx8(b[i].qh + k), 4);
#pragma GCC unroll 8
            for (int g = 0; g < 4; g++) {
                __m256i v = zx8(b[i].qs + 32 * g + k);
                __m256i lo = _mm256_or_si256(_mm256_and_si256(v, m4), _mm256_and_si256(h, b4));
                __m256i hi = _mm256_or_si256(_mm256_srli_epi32(v, 4),
                                             _mm256_and_si256(_mm256_srli_epi32(h, 1), b4));
                store8(y + 64 * g + k, lo, _mm256_broadcast_ss(&ds[2 * g]),
                       _mm256_broadcast_ss(&ms[2 * g]));
                store8(y + 64 * g + 32 + k, hi, _mm256_broadcast_ss(&ds[2 * g + 1]),
                       _mm256_broadcast_ss(&ms[2 * g + 1]));
                h = _mm256_srli_epi32(h, 2);
            }
        }
    }
}

static void dequant_q6_k(const qblock_q6_k *b, float *y, int64_t nb)
{
    const __m256i m4 = _mm256_set1_epi32(0xF), m30 = _mm256_set1_epi32(0x30);
    const __m256i k32 = _mm256_set1_epi32(32);
    const __m256 zero = _mm256_setzero_ps();
    float ds[16] __attribute__((aligned(32)));
    for (int64_t i = 0; i < nb; i++) {
        __m256 d = _mm256_set1_ps(_cvtsh_ss(b[i].d));
        for (int k = 0; k < 16; k += 8) {
            __m128i s8 = _mm_loadl_epi64((const __m128i *)(const void *)(b[i].scales + k));
            _mm256_store_ps(ds + k, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(s8))));
        }
        for (int h = 0; h < 2; h++, y += 128) {
            const uint8_t *ql = b[i].ql + 64 * h, *qh = b[i].qh + 32 * h;
            const float *sc = ds + 8 * h;
#pragma GCC unroll 8
            for (int l = 0; l < 32; l += 8) {
                int s = l / 16;
                __m256i l0 = zx8(ql + l), l1 = zx8(ql + 32 + l), hb = zx8(qh + l);
                __m256i q1 = _mm256_or_si256(_mm256_and_si256(l0, m4),
                                             _mm256_and_si256(_mm256_slli_epi32(hb, 4), m30));
                __m256i q2 = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                             _mm256_and_si256(_mm256_slli_epi32(hb, 2), m30));
                __m256i q3 = _mm256_or_si256(_mm256_srli_epi32(l0, 4), _mm256_and_si256(hb, m30));
                __m256i q4 = _mm256_or_si256(_mm256_srli_epi32(l1, 4),
                                             _mm256_and_si256(_mm256_srli_epi32(hb, 2), m30));
                store8(y + l, _mm256_sub_epi32(q1, k32), _mm256_broadcast_ss(&sc[s]), zero);
                store8(y + l + 32, _mm256_sub_epi32(q2, k32), _mm256_broadcast_ss(&sc[s + 2]), zero);
                store8(y + l + 64, _mm256_sub_epi32(q3, k32), _mm256_broadcast_ss(&sc[s + 4]), zero);
                store8(y + l + 96, _mm256_sub_epi32(q4, k32), _mm256_broadcast_ss(&sc[s + 6]), zero);
            }
        }
    }
}

static void dequant_q3_k(const qblock_q3_k *b, float *y, int64_t nb)
{
    const __m256i m3 = _mm256_set1_epi32(3), one = _mm256_set1_epi32(1), k4 = _mm256_set1_epi32(4);
    const __m256 zero = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        __m256 d = _mm256_set1_ps(_cvtsh_ss(b[i].d));
        int8_t sc[16];
        _mm_storeu_si128((__m128i *)(void *)sc, qx_q3_k_scales(b[i].scales));
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 4; j++, y += 32)
#pragma GCC unroll 4
                for (int l = 0; l < 32; l += 8) {
                    __m256i v = zx8(b[i].qs + 32 * h + l), hb = zx8(b[i].hmask + l);
                    __m256i lo = _mm256_and_si256(_mm256_srli_epi32(v, 2 * j), m3);
                    __m256i hi = _mm256_and_si256(_mm256_srli_epi32(hb, 4 * h + j), one);
                    __m256i q = _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 2)), k4);
                    /* sc * q in integers first, as the scalar code: the product rounds alike */
                    __m256i s = _mm256_set1_epi32(sc[8 * h + 2 * j + l / 16]);
                    __m256i sq = _mm256_mullo_epi32(q, s);
                    store8(y + l, sq, d, zero);
                }
    }
}

static void dequant_q2_k(const qblock_q2_k *b, float *y, int64_t nb)
{
    const __m256i m3 = _mm256_set1_epi32(3);
    for (int64_t i = 0; i < nb; i++) {
        float d = _cvtsh_ss(b[i].d), dmin = _cvtsh_ss(b[i].dmin);
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 4; j++, y += 32)
#pragma GCC unroll 4
                for (int l = 0; l < 32; l += 8) {
                    int k = 8 * h + 2 * j + l / 16;
                    /* d sc q is exact in f32, so the fused subtraction rounds as the
                     * scalar one */
                    __m256 dl = _mm256_set1_ps(d * (float)(b[i].scales[k] & 0xF));
                    __m256 ml = _mm256_set1_ps(dmin * (float)(b[i].scales[k] >> 4));
                    __m256i v = zx8(b[i].qs + 32 * h + l);
                    store8(y + l, _mm256_and_si256(_mm256_srli_epi32(v, 2 * j), m3), dl, ml);
                }
    }
}

/* y[0..32) = d * q for 32 signed bytes at q. */
INLINE void store_i8_32(float *y, const int8_t *q, __m256 d)
{
#pragma GCC unroll 8
    for (int k = 0; k < 32; k += 8) {
        __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(q + k)));
        _mm256_storeu_ps(y + k, _mm256_mul_ps(d, _mm256_cvtepi32_ps(v)));
    }
}

/* F16 or BF16 (t, a constant after inlining) to f32. */
INLINE void dequant_half(uint32_t t, const void *src, float *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
#pragma GCC unroll 8
        for (int k = 0; k < 32; k += 8)
            _mm256_storeu_ps(dst + i + k, load8_float(t, src, i + k));
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, load8_float(t, src, i));
    for (; i < n; i++)
        dst[i] = qb_load_float(t, src, i);
}

void quant_avx2_dequantize_row(uint32_t t, const void *src, float *dst, int64_t n)
{
    switch (t) {
    case QTYPE_F16:
        dequant_half(QTYPE_F16, src, dst, n);
        break;
    case QTYPE_BF16:
        dequant_half(QTYPE_BF16, src, dst, n);
        break;
    case QTYPE_Q8_0: {
        const qblock_q8_0 *b = src;
        for (int64_t k = 0; k < n / QB_32; k++) {
            __m256 d = _mm256_set1_ps(_cvtsh_ss(b[k].d));
            store_i8_32(dst + QB_32 * k, b[k].qs, d);
        }
        break;
    }
    case QTYPE_Q4_0:
        dequant_q4_0(src, dst, n / QB_32);
        break;
    case QTYPE_Q4_1:
        dequant_legacy(LEGACY_Q4_1, src, dst, n / QB_32);
        break;
    case QTYPE_Q5_0:
        dequant_legacy(LEGACY_Q5_0, src, dst, n / QB_32);
        break;
    case QTYPE_Q5_1:
        dequant_legacy(LEGACY_Q5_1, src, dst, n / QB_32);
        break;
    case QTYPE_IQ4_NL:
        dequant_iq4_nl(src, dst, n / QB_32);
        break;
    case QTYPE_MXFP4:
        dequant_mxfp4(src, dst, n / QB_32);
        break;
    case QTYPE_IQ4_XS:
        dequant_iq4_xs(src, dst, n / QB_256);
        break;
    case QTYPE_Q8_K: {
        const qblock_q8_k *b = src;
        for (int64_t k = 0; k < n / QB_256; k++) {
            __m256 d = _mm256_set1_ps(b[k].d);
            for (int j = 0; j < QB_256; j += 32)
                store_i8_32(dst + QB_256 * k + j, b[k].qs + j, d);
        }
        break;
    }
    case QTYPE_Q4_K:
        dequant_q4_k(src, dst, n / QB_256);
        break;
    case QTYPE_Q5_K:
        dequant_q5_k(src, dst, n / QB_256);
        break;
    case QTYPE_Q6_K:
        dequant_q6_k(src, dst, n / QB_256);
        break;
    case QTYPE_Q3_K:
        dequant_q3_k(src, dst, n / QB_256);
        break;
    case QTYPE_Q2_K:
        dequant_q2_k(src, dst, n / QB_256);
        break;
    default:
        quant_dequantize_row_scalar(t, src, dst, n);
        break;
    }
}

/* ---- activation quantization ---- */

INLINE float hmax(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* Largest |x| over n (a multiple of 32) floats. */
INLINE float absmax(const float *x, int n)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m0 = _mm256_setzero_ps(), m1 = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 16) {
        m0 = _mm256_max_ps(m0, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
        m1 = _mm256_max_ps(m1, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i + 8)));
    }
    return hmax(_mm256_max_ps(m0, m1));
}

/* Rounds x[0..32) * id to the nearest integer (ties to even, as the scalar quantizer) and
 * stores them as 32 bytes; |x * id| <= 127 by the choice of id. Returns the four int32
 * vectors through q (elements 0-7, 8-15, ...) for callers that need sums. */
INLINE void quantize32(const float *x, __m256 id, int8_t *dst, __m256i q[4])
{
    for (int k = 0; k < 4; k++)
        q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), id));
    /* The packs work per 128-bit lane; the permute puts the 4-byte groups back in order. */
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)(void *)dst, p);
}

void quant_avx2_quantize_activation(uint32_t t, const float *src, void *dst, int64_t n)
{
    __m256i q[4];
    if (t == QTYPE_Q8_0) {
        qblock_q8_0 *b = dst;
        for (int64_t i = 0; i < n / QB_32; i++, src += QB_32) {
            float d = absmax(src, QB_32) / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
            b[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT); /* as quant_f32_to_f16 */
            quantize32(src, _mm256_set1_ps(id), b[i].qs, q);
        }
    } else if (t == QTYPE_Q8_K) {
        qblock_q8_k *b = dst;
        for (int64_t i = 0; i < n / QB_256; i++, src += QB_256) {
            float d = absmax(src, QB_256) / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
            b[i].d = d;
            for (int j = 0; j < QB_256; j += 32) {
                quantize32(src + j, _mm256_set1_ps(id), b[i].qs + j, q);
                b[i].bsums[j / 16] = (int16_t)hsum_i32(_mm256_add_epi32(q[0], q[1]));
                b[i].bsums[j / 16 + 1] = (int16_t)hsum_i32(_mm256_add_epi32(q[2], q[3]));
            }
        }
    }
}

#endif
