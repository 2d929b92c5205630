/*
 * gemm_bf16_avx512.c — BF16 weights times many activation rows with vdpbf16ps (see
 * gemm_bf16_avx512.h). Compiled with the AVX-512 flags, the BF16 instructions enabled
 * per function; ops.c calls in only after checking the CPU.
 *
 * vdpbf16ps adds, in each of 16 f32 lanes, the two products of a pair of bf16 values of
 * one operand with a pair of the other. Here a lane is one weight row: the weights are
 * repacked so that a 64-byte vector holds the pair (k, k + 1) of 16 rows, and the pair
 * of an activation row is broadcast to every lane, so an accumulator holds 16 finished
 * outputs and no lanes need adding up at the end. A tile is 8 activations by 48 rows
 * (24 accumulators, 3 weight vectors and a broadcast in the 32 registers): per k pair 3
 * vector loads and 8 broadcasts feed 24 vdpbf16ps.
 *
 * Cache blocking: the 48 rows are repacked PANEL_K columns at a time into a 24 KiB panel
 * that stays in L1 while every activation row passes over it (its PANEL_K columns, a
 * 512-byte read from L2 or L3 per row and panel); the tiles' sums go to y between panels
 * and come back for the next, unchanged, so the blocking does not change any result.
 */
#if defined(__x86_64__)

#include "engine/gemm_bf16_avx512.h"

#include <immintrin.h>
#include <stdbool.h>

#define INLINE static inline __attribute__((always_inline))
#define BF16_TARGET __attribute__((target("avx512bf16")))

#define PANEL_K 256              /* columns of a panel */
#define PANEL_KP (PANEL_K / 2)   /* column pairs: the 32-bit elements of a panel row */
#define TILE_ACT 8               /* activation rows of a tile */
#define TILE_VEC (GEMM_BF16_UNIT_ROWS / 16) /* 16-row groups of a tile */

_Static_assert(GEMM_BF16_PANEL_BYTES == (size_t)TILE_VEC * 16 * PANEL_KP * 4,
               "the panel holds TILE_VEC groups of 16 rows by PANEL_KP pairs");

BF16_TARGET void gemm_bf16_avx512_convert(const float *x, size_t x_stride, int n_tok, int cols,
                                          uint16_t *xb, size_t xb_stride)
{
    for (int t = 0; t < n_tok; t++) {
        const float *a = x + (size_t)t * x_stride;
        uint16_t *b = xb + (size_t)t * xb_stride;
        int k = 0;
        for (; k + 32 <= cols; k += 32)
            _mm512_storeu_si512(b + k, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(a + k + 16),
                                                                   _mm512_loadu_ps(a + k)));
        if (k < cols) {
            int left = cols - k;
            __mmask16 lo = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
            __mmask16 hi = left > 16 ? (__mmask16)((1u << (left - 16)) - 1) : 0;
            __m512bh v = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, a + k + 16),
                                             _mm512_maskz_loadu_ps(lo, a + k));
            _mm512_mask_storeu_epi16(b + k, (__mmask32)((1ull << left) - 1), (__m512i)v);
        }
    }
}

/* r[i] (row i, 16 32-bit elements) becomes column i. */
INLINE void transpose16(__m512i r[16])
{
    __m512i t[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    /* r[4i + c], 128-bit lane l: rows 4i..4i+3 of column 4l + c */
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        __m512i u0 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x44);
        __m512i u1 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xEE);
        __m512i u2 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x44);
        __m512i u3 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xEE);
        t[c] = _mm512_shuffle_i32x4(u0, u2, 0x88);
        t[4 + c] = _mm512_shuffle_i32x4(u0, u2, 0xDD);
        t[8 + c] = _mm512_shuffle_i32x4(u1, u3, 0x88);
        t[12 + c] = _mm512_shuffle_i32x4(u1, u3, 0xDD);
    }
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++)
        r[i] = t[i];
}

/* Packs columns [k0, k0 + kb) (kb even, <= PANEL_K) of n_rows rows into the panel:
 * group g, pair p at panel + (g * PANEL_KP + p) * 16, rows past n_rows zero. */
static void pack_panel(const uint8_t *w, size_t row_bytes, int n_rows, int k0, int kb,
                       uint32_t *panel)
{
    int kp = kb / 2;
    for (int g = 0; g * 16 < n_rows; g++) {
        for (int p = 0; p < kp; p += 16) {
            int np = kp - p < 16 ? kp - p : 16;
            __mmask16 m = (__mmask16)((1u << np) - 1);
            __m512i r[16];
            for (int i = 0; i < 16; i++) {
                int row = g * 16 + i;
                r[i] = row < n_rows ? _mm512_maskz_loadu_epi32(
                                          m, w + (size_t)row * row_bytes + (size_t)(k0 + 2 * p) * 2)
                                    : _mm512_setzero_si512();
            }
            transpose16(r);
            uint32_t *dst = panel + ((size_t)g * PANEL_KP + p) * 16;
            for (int i = 0; i < np; i++)
                _mm512_store_si512(dst + (size_t)i * 16, r[i]);
        }
    }
}

/* One tile: nm activation rows by nv groups of 16 rows over kp column pairs of the
 * panel. first: the sums start at zero, else from y. last: the lanes of group nv - 1
 * that are rows. */
BF16_TARGET INLINE void tile(int nm, int nv, const uint32_t *panel, int kp, const uint16_t *xb,
                             size_t xb_stride, bool first, __mmask16 last, float *y, size_t ldy)
{
    __m512 acc[TILE_ACT][TILE_VEC];
    const uint32_t *a[TILE_ACT];
#pragma GCC unroll 8
    for (int m = 0; m < nm; m++) {
        a[m] = (const uint32_t *)(const void *)(xb + (size_t)m * xb_stride);
#pragma GCC unroll 3
        for (int v = 0; v < nv; v++)
            acc[m][v] = first ? _mm512_setzero_ps()
                              : _mm512_maskz_loadu_ps(v == nv - 1 ? last : (__mmask16)0xFFFF,
                                                      y + (size_t)m * ldy + 16 * v);
    }
    for (int p = 0; p < kp; p++) {
        __m512bh b[TILE_VEC];
#pragma GCC unroll 3
        for (int v = 0; v < nv; v++)
            b[v] = (__m512bh)_mm512_load_si512(panel + ((size_t)v * PANEL_KP + p) * 16);
#pragma GCC unroll 8
        for (int m = 0; m < nm; m++) {
            __m512bh x = (__m512bh)_mm512_set1_epi32((int)a[m][p]);
#pragma GCC unroll 3
            for (int v = 0; v < nv; v++)
                acc[m][v] = _mm512_dpbf16_ps(acc[m][v], x, b[v]);
        }
    }
#pragma GCC unroll 8
    for (int m = 0; m < nm; m++)
#pragma GCC unroll 3
        for (int v = 0; v < nv; v++)
            _mm512_mask_storeu_ps(y + (size_t)m * ldy + 16 * v,
                                  v == nv - 1 ? last : (__mmask16)0xFFFF, acc[m][v]);
}

typedef void (*tile_fn)(const uint32_t *panel, int kp, const uint16_t *xb, size_t xb_stride,
                        bool first, __mmask16 last, float *y, size_t ldy);

#define TILE_FN(NM, NV)                                                                      \
    static BF16_TARGET void tile_##NM##_##NV(const uint32_t *panel, int kp,                 \
                                             const uint16_t *xb, size_t xb_stride,           \
                                             bool first, __mmask16 last, float *y,           \
                                             size_t ldy)                                      \
    {                                                                                         \
        tile(NM, NV, panel, kp, xb, xb_stride, first, last, y, ldy);                          \
    }
#define TILE_FNS(NM) TILE_FN(NM, 1) TILE_FN(NM, 2) TILE_FN(NM, 3)
TILE_FNS(1)
TILE_FNS(2)
TILE_FNS(3)
TILE_FNS(4)
TILE_FNS(5)
TILE_FNS(6)
TILE_FNS(7)
TILE_FNS(8)

#define TILE_ROW(NM) {tile_##NM##_1, tile_##NM##_2, tile_##NM##_3}
/* tiles[nm - 1][nv - 1] */
static const tile_fn tiles[TILE_ACT][TILE_VEC] = {
    TILE_ROW(1), TILE_ROW(2), TILE_ROW(3), TILE_ROW(4),
    TILE_ROW(5), TILE_ROW(6), TILE_ROW(7), TILE_ROW(8),
};

void gemm_bf16_avx512_rows(const void *w, size_t row_bytes, int n_rows, const uint16_t *xb,
                           size_t xb_stride, int n_tok, int cols, float *y, size_t ldy,
                           void *panel)
{
    int nv = (n_rows + 15) / 16;
    __mmask16 last = n_rows % 16 ? (__mmask16)((1u << (n_rows % 16)) - 1) : (__mmask16)0xFFFF;
    for (int k0 = 0; k0 < cols; k0 += PANEL_K) {
        int kb = cols - k0 < PANEL_K ? cols - k0 : PANEL_K;
        pack_panel(w, row_bytes, n_rows, k0, kb, panel);
        for (int t = 0; t < n_tok; t += TILE_ACT) {
            int nm = n_tok - t < TILE_ACT ? n_tok - t : TILE_ACT;
            tiles[nm - 1][nv - 1](panel, kb / 2, xb + (size_t)t * xb_stride + k0, xb_stride,
                                  k0 == 0, last, y + (size_t)t * ldy, ldy);
        }
    }
}

#endif
