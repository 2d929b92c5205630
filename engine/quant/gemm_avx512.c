/*
 * gemm_avx512.c — BF16 and F16 weights times many activation rows (see gemm_avx512.h).
 * Compiled with the AVX-512 flags, the BF16 instructions enabled per function; ops.c
 * calls in only after checking the CPU.
 *
 * An accumulator is 16 weight rows of one activation row, so no lanes need adding up at
 * the end: the weights are repacked so that a 64-byte vector holds one step of 16 rows
 * and the activation's value for that step is broadcast to every lane. For BF16 a step
 * is a pair of columns (k, k + 1), which vdpbf16ps multiplies with the activation's pair
 * and adds into each f32 lane; for F16 a step is one column, converted to f32 while
 * packing (vcvtph2ps, once per panel rather than once per activation row) and multiplied
 * with the f32 activation by an FMA. Either way a step is 4 bytes of the activation row.
 * Quantized weights (and F16 ones where prefill opts in) take the BF16 kernel: a panel's
 * rows are dequantized to f32 and rounded to bf16 pairs before they are packed.
 * A tile is 8 activations by 48 rows (24 accumulators, 3 weight vectors and a broadcast
 * in the 32 registers): per step 3 vector loads and 8 broadcasts feed 24 multiply-adds.
 *
 * Cache blocking: the 48 rows are repacked PANEL_STEPS steps at a time into a 24 KiB
 * panel that stays in L1 while every activation row passes over it (a 512-byte read from
 * L2 or L3 per row and panel); the tiles' sums go to y between panels and come back for
 * the next, unchanged, so the blocking does not change any result.
 */
#if defined(__x86_64__)

#include "engine/quant/gemm_avx512.h"

#include <immintrin.h>

#include "engine/quant/quant.h"

#define INLINE static inline __attribute__((always_inline))
/* on every kernel function, as they share their code; the F16 ones, whose kind is a
 * constant, contain no BF16 instruction */
#define BF16_TARGET __attribute__((target("avx512bf16")))

#define PANEL_STEPS 128          /* steps of a panel: 256 BF16 columns, 128 F16 ones */
#define TILE_ACT 8               /* activation rows of a tile */
#define TILE_VEC (GEMM_AVX512_UNIT_ROWS / 16) /* 16-row groups of a tile */

/* the panel: TILE_VEC groups of 16 rows by PANEL_STEPS steps of 4 bytes */
#define PANEL_BYTES ((size_t)TILE_VEC * 16 * PANEL_STEPS * 4)
/* then the f32 columns of 16 dequantized rows */
_Static_assert(GEMM_AVX512_SCRATCH_BYTES == PANEL_BYTES + 16 * PANEL_STEPS * 2 * sizeof(float),
               "the scratch holds the panel and 16 dequantized rows");

enum kind { KIND_BF16, KIND_F16 };

BF16_TARGET void gemm_avx512_bf16_convert(const float *x, size_t x_stride, int n_tok, int cols,
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

/* Packs steps [s0, s0 + ns) (ns <= PANEL_STEPS) of n_rows rows into the panel: group g,
 * step p at panel + (g * PANEL_STEPS + p) * 16, rows past n_rows zero. A quantized type
 * (kind KIND_BF16, type other than QTYPE_BF16) is dequantized 16 rows at a time into
 * deq, each row's f32 columns rounded to bf16 pairs in place, then packed as BF16 rows. */
BF16_TARGET INLINE void pack_panel(enum kind kind, uint32_t type, const uint8_t *w,
                                   size_t row_bytes, int n_rows, int s0, int ns, uint32_t *panel,
                                   float *deq)
{
    const quant_traits *q = quant_traits_of(type);
    for (int g = 0; g * 16 < n_rows; g++) {
        const uint8_t *rows = w + (size_t)g * 16 * row_bytes;
        size_t stride = row_bytes;
        int step0 = s0;
        if (kind == KIND_BF16 && type != QTYPE_BF16) {
            /* steps [s0, s0 + ns) are columns [2 s0, 2 (s0 + ns)): whole blocks */
            size_t offset = (size_t)(2 * s0 / q->block_size) * q->block_bytes;
            for (int i = 0; i < 16 && g * 16 + i < n_rows; i++) {
                float *f = deq + (size_t)i * PANEL_STEPS * 2;
                quant_dequantize_row(type, rows + (size_t)i * row_bytes + offset, f, 2 * ns);
                /* in place: 32 values are read before their 64 bytes of bf16 are written */
                gemm_avx512_bf16_convert(f, 0, 1, 2 * ns, (uint16_t *)(void *)f, 0);
            }
            rows = (const uint8_t *)deq;
            stride = PANEL_STEPS * 2 * sizeof(float);
            step0 = 0;
        }
        for (int p = 0; p < ns; p += 16) {
            int np = ns - p < 16 ? ns - p : 16;
            __mmask16 m = (__mmask16)((1u << np) - 1);
            __m512i r[16];
            for (int i = 0; i < 16; i++) {
                const uint8_t *src = rows + (size_t)i * stride;
                if (g * 16 + i >= n_rows)
                    r[i] = _mm512_setzero_si512();
                else if (kind == KIND_BF16)
                    r[i] = _mm512_maskz_loadu_epi32(m, src + (size_t)(step0 + p) * 4);
                else
                    r[i] = _mm512_castps_si512(_mm512_cvtph_ps(
                        _mm256_maskz_loadu_epi16(m, src + (size_t)(step0 + p) * 2)));
            }
            transpose16(r);
            uint32_t *dst = panel + ((size_t)g * PANEL_STEPS + p) * 16;
            for (int i = 0; i < np; i++)
                _mm512_store_si512(dst + (size_t)i * 16, r[i]);
        }
    }
}

/* One tile: nm activation rows (x, their step values x_stride 4-byte words apart) by
 * nv groups of 16 rows over ns steps of the panel. first: the sums start at zero, else
 * from y. last: the lanes of group nv - 1 that are rows. */
BF16_TARGET INLINE void tile(enum kind kind, int nm, int nv, const uint32_t *panel, int ns,
                             const uint32_t *x, size_t x_stride, bool first, __mmask16 last,
                             float *y, size_t ldy)
{
    __m512 acc[TILE_ACT][TILE_VEC];
#pragma GCC unroll 8
    for (int m = 0; m < nm; m++)
#pragma GCC unroll 3
        for (int v = 0; v < nv; v++)
            acc[m][v] = first ? _mm512_setzero_ps()
                              : _mm512_maskz_loadu_ps(v == nv - 1 ? last : (__mmask16)0xFFFF,
                                                      y + (size_t)m * ldy + 16 * v);
    for (int p = 0; p < ns; p++) {
        __m512i b[TILE_VEC];
#pragma GCC unroll 3
        for (int v = 0; v < nv; v++)
            b[v] = _mm512_load_si512(panel + ((size_t)v * PANEL_STEPS + p) * 16);
#pragma GCC unroll 8
        for (int m = 0; m < nm; m++) {
            __m512i a = _mm512_set1_epi32((int)x[(size_t)m * x_stride + p]);
#pragma GCC unroll 3
            for (int v = 0; v < nv; v++)
                acc[m][v] = kind == KIND_BF16
                                ? _mm512_dpbf16_ps(acc[m][v], (__m512bh)a, (__m512bh)b[v])
                                : _mm512_fmadd_ps(_mm512_castsi512_ps(a),
                                                  _mm512_castsi512_ps(b[v]), acc[m][v]);
        }
    }
#pragma GCC unroll 8
    for (int m = 0; m < nm; m++)
#pragma GCC unroll 3
        for (int v = 0; v < nv; v++)
            _mm512_mask_storeu_ps(y + (size_t)m * ldy + 16 * v,
                                  v == nv - 1 ? last : (__mmask16)0xFFFF, acc[m][v]);
}

typedef void (*tile_fn)(const uint32_t *panel, int ns, const uint32_t *x, size_t x_stride,
                        bool first, __mmask16 last, float *y, size_t ldy);

#define TILE_FN(KIND, NM, NV)                                                               \
    static BF16_TARGET void tile_##KIND##_##NM##_##NV(const uint32_t *panel, int ns,        \
                                                      const uint32_t *x, size_t x_stride,   \
                                                      bool first, __mmask16 last, float *y, \
                                                      size_t ldy)                           \
    {                                                                                        \
        tile(KIND, NM, NV, panel, ns, x, x_stride, first, last, y, ldy);                     \
    }
#define TILE_FNS(KIND, NM) TILE_FN(KIND, NM, 1) TILE_FN(KIND, NM, 2) TILE_FN(KIND, NM, 3)
#define TILE_ROW(KIND, NM) {tile_##KIND##_##NM##_1, tile_##KIND##_##NM##_2, tile_##KIND##_##NM##_3}
/* KIND##_tiles[nm - 1][nv - 1] */
#define TILE_TABLE(KIND)                                                                     \
    TILE_FNS(KIND, 1) TILE_FNS(KIND, 2) TILE_FNS(KIND, 3) TILE_FNS(KIND, 4)                  \
    TILE_FNS(KIND, 5) TILE_FNS(KIND, 6) TILE_FNS(KIND, 7) TILE_FNS(KIND, 8)                  \
    static const tile_fn KIND##_tiles[TILE_ACT][TILE_VEC] = {                                \
        TILE_ROW(KIND, 1), TILE_ROW(KIND, 2), TILE_ROW(KIND, 3), TILE_ROW(KIND, 4),          \
        TILE_ROW(KIND, 5), TILE_ROW(KIND, 6), TILE_ROW(KIND, 7), TILE_ROW(KIND, 8),          \
    };
TILE_TABLE(KIND_BF16)
TILE_TABLE(KIND_F16)

/* n_steps steps of n_rows weight rows against n_tok activation rows of 4-byte steps. */
BF16_TARGET INLINE void gemm_rows(enum kind kind, uint32_t type, const tile_fn tiles[TILE_ACT][TILE_VEC],
                      const void *w, size_t row_bytes, int n_rows, const uint32_t *x,
                      size_t x_stride, int n_tok, int n_steps, float *y, size_t ldy,
                      void *scratch)
{
    uint32_t *panel = scratch;
    float *deq = (float *)((char *)scratch + PANEL_BYTES);
    int nv = (n_rows + 15) / 16;
    __mmask16 last = n_rows % 16 ? (__mmask16)((1u << (n_rows % 16)) - 1) : (__mmask16)0xFFFF;
    for (int s0 = 0; s0 < n_steps; s0 += PANEL_STEPS) {
        int ns = n_steps - s0 < PANEL_STEPS ? n_steps - s0 : PANEL_STEPS;
        pack_panel(kind, type, w, row_bytes, n_rows, s0, ns, panel, deq);
        for (int t = 0; t < n_tok; t += TILE_ACT) {
            int nm = n_tok - t < TILE_ACT ? n_tok - t : TILE_ACT;
            tiles[nm - 1][nv - 1](panel, ns, x + (size_t)t * x_stride + s0, x_stride, s0 == 0,
                                  last, y + (size_t)t * ldy, ldy);
        }
    }
}

BF16_TARGET void gemm_avx512_bf16_rows(uint32_t type, const void *w, size_t row_bytes,
                                       int n_rows, const uint16_t *xb, size_t xb_stride,
                                       int n_tok, int cols, float *y, size_t ldy,
                                       void *scratch)
{
    gemm_rows(KIND_BF16, type, KIND_BF16_tiles, w, row_bytes, n_rows,
              (const uint32_t *)(const void *)xb, xb_stride / 2, n_tok, cols / 2, y, ldy,
              scratch);
}

bool gemm_avx512_bf16_takes(uint32_t type, int cols)
{
    const quant_traits *q = quant_traits_of(type);
    if (type == QTYPE_BF16 || type == QTYPE_F16)
        return cols % 2 == 0;
    return q && q->computable && q->block_size > 1 && PANEL_STEPS * 2 % q->block_size == 0 &&
           cols % q->block_size == 0;
}

BF16_TARGET void gemm_avx512_f16_rows(const void *w, size_t row_bytes, int n_rows, const float *x,
                          size_t x_stride, int n_tok, int cols, float *y, size_t ldy,
                          void *scratch)
{
    gemm_rows(KIND_F16, QTYPE_F16, KIND_F16_tiles, w, row_bytes, n_rows,
              (const uint32_t *)(const void *)x, x_stride, n_tok, cols, y, ldy, scratch);
}

#endif
