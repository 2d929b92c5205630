/*
 * cuda_matmul.cu — matrix-vector products and f16 expansion of GGUF weight matrices.
 *
 * Every kernel works in "octs": 8 consecutive elements of a row, which never straddle a
 * block, a K-quant sub-block or a Q6_K scale group (all multiples of 8 elements), so one
 * scale lookup serves 8 weights. dequant8 turns an oct into floats, exactly as the
 * engine's dequantizers do (the quants extracted a 64-bit word at a time, turned into
 * floats without integer conversions, see byte_minus); it runs on the host
 * too (cuda_matmul_host_check), which lets the tests compare its bit layouts with the
 * engine's scalar dequantizers on a machine without a GPU.
 *
 * cuda_matvec gives each weight row to one warp. For F32 / F16 / BF16 a warp step covers
 * 256 elements, lane l the oct at 8 l: the warp's activation loads are then contiguous
 * (two float4 per lane and column) and its weight loads fall on consecutive bytes. Steps
 * are unrolled so that several steps' loads are in flight before the first is used; the
 * lanes' partial sums meet through shuffles.
 *
 * The quantized types take the integer path instead: quantize_act_kernel rounds the
 * activation rows to int8 blocks of 32 (scale amax / 127, and the block's sum of int8
 * values for the mins and Q4_0's -8), and matvec_int_kernel decodes a chunk of weights
 * (a block, or a quarter K-quant super-block) per lane into signed bytes, dotted with the
 * activations four at a time by __dp4a, the scales applied once per 16 or 32 elements.
 * That is a few integer instructions per weight and column where the float path needs a
 * conversion and an FMA per weight and column: extra columns come cheap. decode_chunk and
 * chunk_dot run on the host too (cuda_matvec_host_check, __dp4a emulated).
 */
#include "engine/cuda/cuda_matmul.h"

#include <cuda_fp16.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

extern "C" {
#include "engine/quant/quant.h"
}

/* Block sizes of engine/quant/quant_blocks.h (its packed C structs and _Static_asserts do
 * not compile as C++; the offsets below are those structs' members). */
namespace {

constexpr int QK_32 = 32;   /* elements per Q8_0 / Q4_0 block */
constexpr int QK_256 = 256; /* elements per K-quant super-block */
constexpr size_t Q8_0_BYTES = 34;  /* d f16, qs[32] */
constexpr size_t Q4_0_BYTES = 18;  /* d f16, qs[16] */
constexpr size_t Q4_K_BYTES = 144; /* d, dmin f16, scales[12], qs[128] */
constexpr size_t Q5_K_BYTES = 176; /* d, dmin f16, scales[12], qh[32], qs[128] */
constexpr size_t Q6_K_BYTES = 210; /* ql[128], qh[64], scales[16] int8, d f16 */
static_assert(Q8_0_BYTES == 2 + QK_32, "Q8_0 block");
static_assert(Q4_0_BYTES == 2 + QK_32 / 2, "Q4_0 block");
static_assert(Q4_K_BYTES == 4 + 12 + QK_256 / 2, "Q4_K block");
static_assert(Q5_K_BYTES == 4 + 12 + QK_256 / 8 + QK_256 / 2, "Q5_K block");
static_assert(Q6_K_BYTES == QK_256 / 2 + QK_256 / 4 + QK_256 / 16 + 2, "Q6_K block");

constexpr int OCT = 8;                 /* elements per oct */
constexpr int WARP = 32;
constexpr int STEP = WARP * OCT;       /* elements per warp step */
constexpr int ROWS_PER_BLOCK = 4;      /* warps (= rows) per thread block */

/* ---- loads: __ldg on the device, memcpy (any alignment) on the host ---- */

__host__ __device__ inline uint16_t ld_u16(const uint8_t *p)
{
#ifdef __CUDA_ARCH__
    return __ldg(reinterpret_cast<const unsigned short *>(p));
#else
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
#endif
}

__host__ __device__ inline uint32_t ld_u32(const uint8_t *p) /* p 4-byte aligned */
{
#ifdef __CUDA_ARCH__
    return __ldg(reinterpret_cast<const unsigned int *>(p));
#else
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
#endif
}

__host__ __device__ inline uint64_t ld_u64(const uint8_t *p) /* p 8-byte aligned */
{
#ifdef __CUDA_ARCH__
    return __ldg(reinterpret_cast<const unsigned long long *>(p));
#else
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
#endif
}

/* 8 bytes at a 2-byte aligned address, little-endian. */
__host__ __device__ inline uint64_t ld_8_a2(const uint8_t *p)
{
    return (uint64_t)ld_u16(p) | (uint64_t)ld_u16(p + 2) << 16 |
           (uint64_t)ld_u16(p + 4) << 32 | (uint64_t)ld_u16(p + 6) << 48;
}

/* 8 bytes at a 2-byte aligned address p, read as the three 4-byte words from p rounded
 * down to 4 (so up to 4 bytes past p + 8 are read: callers keep them within the block)
 * and shifted into place: no branch on the alignment, so the loads of several steps can
 * be in flight together (Q6_K's super-blocks alternate between the two alignments). */
__host__ __device__ inline uint64_t ld_8_a2_words(const uint8_t *p)
{
    const uint8_t *a = p - ((uintptr_t)p & 3);
    uint32_t w0 = ld_u32(a), w1 = ld_u32(a + 4), w2 = ld_u32(a + 8);
    uint32_t shift = 8 * (uint32_t)((uintptr_t)p & 3);
#ifdef __CUDA_ARCH__
    uint32_t lo = __funnelshift_r(w0, w1, shift), hi = __funnelshift_r(w1, w2, shift);
#else
    uint32_t lo = (uint32_t)(((uint64_t)w1 << 32 | w0) >> shift);
    uint32_t hi = (uint32_t)(((uint64_t)w2 << 32 | w1) >> shift);
#endif
    return (uint64_t)hi << 32 | lo;
}

__host__ __device__ inline float f16_to_f32(uint16_t h)
{
#ifdef __CUDA_ARCH__
    return __half2float(__ushort_as_half(h));
#else
    return quant_f16_to_f32(h);
#endif
}

__host__ __device__ inline float bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Byte i of v (the K-quant scales' bytes). */
__host__ __device__ inline int byte_of(uint64_t v, int i)
{
    return (int)((v >> (8 * i)) & 0xff);
}

/*
 * Byte i of word, less bias, as a float, exactly. On the device without an integer
 * conversion (whose throughput, a quarter of an FMA's, would bound the 4-bit kernels):
 * the byte is placed in the mantissa of 2^23 by a byte permutation, and 2^23 + bias
 * subtracted, exact for integers this small.
 */
__host__ __device__ inline float byte_minus(uint32_t word, int i, float bias)
{
    /* result bytes: word's byte i, 0, 0, 0x4B (bytes 4..7 are 0x4B000000's) */
    uint32_t selector = 0x7440u | (uint32_t)i;
#ifdef __CUDA_ARCH__
    uint32_t bits = __byte_perm(word, 0x4B000000u, selector);
#else
    /* the permutation as the device does it, so that the host check tests the selector */
    uint64_t pool = (uint64_t)0x4B000000u << 32 | word;
    uint32_t bits = 0;
    for (int k = 0; k < 4; k++)
        bits |= (uint32_t)((pool >> (8 * ((selector >> (4 * k)) & 7))) & 0xff) << (8 * k);
#endif
    float f;
    memcpy(&f, &bits, sizeof f);
    return f - (8388608.0f + bias);
}

/* Sub-block j's 6-bit scale and min of a Q4_K / Q5_K super-block whose 12 scale bytes are
 * s[0..2] (little-endian words): quant_blocks.h's qb_unpack_k_scales, for one j. */
__host__ __device__ inline void k_scale_min(const uint32_t s[3], int j, int *sc, int *m)
{
    uint64_t lo = (uint64_t)s[1] << 32 | s[0]; /* bytes 0..7 */
    if (j < 4) {
        *sc = byte_of(lo, j) & 63;
        *m = byte_of(lo, j + 4) & 63;
    } else {
        int hi = byte_of(s[2], j - 4); /* byte j + 4 */
        *sc = (hi & 0xF) | (byte_of(lo, j - 4) >> 6) << 4;
        *m = (hi >> 4) | (byte_of(lo, j) >> 6) << 4;
    }
}

/*
 * Elements e .. e + 7 (e a multiple of 8) of a row of type T starting at row, into w.
 * Alignment the kernels rely on (cuda_matvec checks the base; row sizes give the rest):
 * F32 / F16 / BF16 rows and Q4_K / Q5_K blocks are 16-byte aligned, the other blocks 2.
 */
template <uint32_t T>
__host__ __device__ inline void dequant8(const uint8_t *row, int64_t e, float w[OCT])
{
    if constexpr (T == QTYPE_F32) {
        const uint8_t *p = row + 4 * e;
#ifdef __CUDA_ARCH__
        float4 a = __ldg(reinterpret_cast<const float4 *>(p));
        float4 b = __ldg(reinterpret_cast<const float4 *>(p) + 1);
        w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w;
        w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
#else
        memcpy(w, p, OCT * sizeof(float));
#endif
    } else if constexpr (T == QTYPE_F16 || T == QTYPE_BF16) {
        const uint8_t *p = row + 2 * e;
        uint32_t v[4];
#ifdef __CUDA_ARCH__
        uint4 q = __ldg(reinterpret_cast<const uint4 *>(p));
        v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
#else
        memcpy(v, p, sizeof v);
#endif
        for (int i = 0; i < 4; i++) {
            uint16_t lo = (uint16_t)(v[i] & 0xffff), hi = (uint16_t)(v[i] >> 16);
            w[2 * i] = T == QTYPE_F16 ? f16_to_f32(lo) : bf16_to_f32(lo);
            w[2 * i + 1] = T == QTYPE_F16 ? f16_to_f32(hi) : bf16_to_f32(hi);
        }
    } else if constexpr (T == QTYPE_Q8_0) {
        const uint8_t *blk = row + (e / QK_32) * Q8_0_BYTES;
        int o = (int)(e % QK_32);
        float d = f16_to_f32(ld_u16(blk));
        uint64_t q = ld_8_a2(blk + 2 + o) ^ 0x8080808080808080u; /* int8 + 128 */
        uint32_t v[2] = {(uint32_t)q, (uint32_t)(q >> 32)};
        for (int i = 0; i < OCT; i++)
            w[i] = d * byte_minus(v[i / 4], i % 4, 128.0f);
    } else if constexpr (T == QTYPE_Q4_0) {
        /* element j < 16: low nibble of qs[j]; j >= 16: high nibble of qs[j - 16] */
        const uint8_t *blk = row + (e / QK_32) * Q4_0_BYTES;
        int o = (int)(e % QK_32);
        float d = f16_to_f32(ld_u16(blk));
        uint64_t q = ld_8_a2(blk + 2 + (o & 15)) >> (o < 16 ? 0 : 4) & 0x0F0F0F0F0F0F0F0Fu;
        uint32_t v[2] = {(uint32_t)q, (uint32_t)(q >> 32)};
        for (int i = 0; i < OCT; i++)
            w[i] = d * byte_minus(v[i / 4], i % 4, 8.0f);
    } else if constexpr (T == QTYPE_Q4_K || T == QTYPE_Q5_K) {
        /* sub-block j = o / 32 of group g = j / 2: qs[32 g + l], the low nibble for even j,
         * the high one for odd j; Q5_K's fifth bit is bit j of qh[l] */
        constexpr size_t bytes = T == QTYPE_Q4_K ? Q4_K_BYTES : Q5_K_BYTES;
        constexpr int qs_at = T == QTYPE_Q4_K ? 16 : 48;
        const uint8_t *blk = row + (e / QK_256) * bytes;
        int o = (int)(e % QK_256), j = o / 32, l = o % 32;
        uint32_t dm = ld_u32(blk);
        uint32_t s[3] = {ld_u32(blk + 4), ld_u32(blk + 8), ld_u32(blk + 12)};
        int sc, m;
        k_scale_min(s, j, &sc, &m);
        float d1 = f16_to_f32((uint16_t)(dm & 0xffff)) * byte_minus((uint32_t)sc, 0, 0.0f);
        float m1 = f16_to_f32((uint16_t)(dm >> 16)) * byte_minus((uint32_t)m, 0, 0.0f);
        uint64_t q = ld_u64(blk + qs_at + 32 * (j / 2) + l) >> (4 * (j & 1)) &
                     0x0F0F0F0F0F0F0F0Fu;
        if constexpr (T == QTYPE_Q5_K)
            q |= (ld_u64(blk + 16 + l) >> j & 0x0101010101010101u) << 4;
        uint32_t v[2] = {(uint32_t)q, (uint32_t)(q >> 32)};
        for (int i = 0; i < OCT; i++)
            w[i] = d1 * byte_minus(v[i / 4], i % 4, 0.0f) - m1;
    } else if constexpr (T == QTYPE_Q6_K) {
        /* half h = o / 128, quarter k = (o / 32) % 4, l = o % 32: low 4 bits in
         * ql[64 h + 32 (k & 1) + l] (the high nibble for k >= 2), high 2 at bits 2 k of
         * qh[32 h + l], scale scales[8 h + 2 k + l / 16] */
        const uint8_t *blk = row + (e / QK_256) * Q6_K_BYTES;
        int o = (int)(e % QK_256), h = o / 128, k = (o / 32) % 4, l = o % 32;
        /* the words read past ql's and qh's 8 bytes are still the block's (qh, scales) */
        uint64_t ql = ld_8_a2_words(blk + 64 * h + 32 * (k & 1) + l);
        uint64_t qh = ld_8_a2_words(blk + 128 + 32 * h + l);
        uint32_t sc = ld_u16(blk + 192 + 8 * h + 2 * k) >> (8 * (l / 16)); /* int8 */
        float d = f16_to_f32(ld_u16(blk + 208)) * byte_minus(sc ^ 0x80, 0, 128.0f);
        uint64_t q = (ql >> (4 * (k >> 1)) & 0x0F0F0F0F0F0F0F0Fu) |
                     (qh >> (2 * k) & 0x0303030303030303u) << 4;
        uint32_t v[2] = {(uint32_t)q, (uint32_t)(q >> 32)};
        for (int i = 0; i < OCT; i++)
            w[i] = d * byte_minus(v[i / 4], i % 4, 32.0f);
    }
}

/* ---- the integer path: int8 activations dotted with the quants by dp4a ---- */

/* #pragma unroll in the functions that run on the host too (gcc does not know it). The
 * loops it marks index register arrays: unrolled, they stay in registers. */
#ifdef __CUDA_ARCH__
#define UNROLL _Pragma("unroll")
#else
#define UNROLL
#endif

constexpr int ACT_BLOCK = 32; /* activations per int8 block, one f32 scale each */

/* Activation block scale d = amax / 127 and its inverse (0 for an all-zero block). The
 * test quantizes with the same two IEEE operations and gets the same bits. */
__host__ __device__ inline void act_scale(float amax, float *d, float *id)
{
    *d = amax / 127.0f;
    *id = *d != 0.0f ? 1.0f / *d : 0.0f;
}

/* An activation as int8: round to nearest (ties to even) of v / d. */
__host__ __device__ inline int act_quant(float v, float id)
{
    return (int)rintf(v * id);
}

/* c + the dot product of a's and b's four signed bytes: __dp4a, emulated on the host. */
__host__ __device__ inline int dot4(uint32_t a, uint32_t b, int c)
{
#ifdef __CUDA_ARCH__
    return __dp4a((int)a, (int)b, c);
#else
    for (int i = 0; i < 4; i++)
        c += (int)(int8_t)(uint8_t)(a >> (8 * i)) * (int)(int8_t)(uint8_t)(b >> (8 * i));
    return c;
#endif
}

/* N words of the bytes at the 2-byte aligned p: the words from p rounded down to 4,
 * shifted into place. When p is not 4-byte aligned the last 2 bytes asked for lie past
 * those N words and are read as a 2-byte word, so nothing past p + 4 N is read (a block at
 * the end of the matrix may end there). */
template <int N>
__host__ __device__ inline void ld_words_a2(const uint8_t *p, uint32_t out[N])
{
    const uint8_t *a = p - ((uintptr_t)p & 3);
    uint32_t shift = 8 * (uint32_t)((uintptr_t)p & 3);
    uint32_t w[N + 1];
    UNROLL
    for (int i = 0; i < N; i++)
        w[i] = ld_u32(a + 4 * i);
    w[N] = shift ? ld_u16(a + 4 * N) : 0;
    UNROLL
    for (int i = 0; i < N; i++) {
#ifdef __CUDA_ARCH__
        out[i] = __funnelshift_r(w[i], w[i + 1], shift);
#else
        out[i] = (uint32_t)(((uint64_t)w[i + 1] << 32 | w[i]) >> shift);
#endif
    }
}

/* 4 N words at the 16-byte aligned p. */
template <int N>
__host__ __device__ inline void ld_words_a16(const uint8_t *p, uint32_t out[4 * N])
{
    UNROLL
    for (int i = 0; i < N; i++) {
#ifdef __CUDA_ARCH__
        uint4 v = __ldg(reinterpret_cast<const uint4 *>(p) + i);
        out[4 * i] = v.x, out[4 * i + 1] = v.y, out[4 * i + 2] = v.z, out[4 * i + 3] = v.w;
#else
        memcpy(out + 4 * i, p + 16 * i, 16);
#endif
    }
}

/*
 * A chunk: the elements one lane takes at a time on the integer path, whole 32-element
 * activation blocks (one or two, "halves"): a Q8_0 / Q4_0 block; for the K-quants 64
 * elements, a quarter of a super-block (Q4_K / Q5_K: sub-blocks 2 g and 2 g + 1, which
 * share the qs bytes; Q6_K: quarters a and a + 2 of half h, which share the ql bytes).
 */
template <uint32_t T> __host__ __device__ constexpr int chunk_elems()
{
    return T == QTYPE_Q8_0 || T == QTYPE_Q4_0 ? 32 : 64;
}

/* A chunk's weights as signed bytes (or unsigned ones below 128, minus a min elsewhere)
 * with their scales, all indexed by compile-time constants only. */
struct wchunk {
    uint32_t q[16]; /* 4 quants a word: half 0's 32 elements in q[0..7], half 1's in q[8..15] */
    float d;        /* the block's (super-block's) scale */
    float dmin;     /* Q4_K / Q5_K: the super-block's min scale */
    int sc[4];      /* Q4_K / Q5_K: the halves' 6-bit scales, then their mins; Q6_K: the
                       four 16-element groups' int8 scales */
};

/* The activation block (index within the row) of half h of chunk ci. */
template <uint32_t T> __host__ __device__ inline int64_t chunk_act_block(int64_t ci, int h)
{
    if constexpr (T == QTYPE_Q6_K) /* super-block ci / 4, half ci / 2 % 2, quarter a = ci % 2 */
        return ci / 4 * 8 + (ci / 2 % 2) * 4 + ci % 2 + 2 * h;
    else
        return (chunk_elems<T>() / ACT_BLOCK) * ci + h;
}

template <uint32_t T>
__host__ __device__ inline void decode_chunk(const uint8_t *row, int64_t ci, wchunk &w)
{
    constexpr uint32_t LO4 = 0x0F0F0F0Fu;
    if constexpr (T == QTYPE_Q8_0) {
        const uint8_t *blk = row + ci * Q8_0_BYTES;
        w.d = f16_to_f32(ld_u16(blk));
        ld_words_a2<8>(blk + 2, w.q);
    } else if constexpr (T == QTYPE_Q4_0) {
        /* unsigned 0..15 here; the -8 comes off through the activations' block sum */
        const uint8_t *blk = row + ci * Q4_0_BYTES;
        w.d = f16_to_f32(ld_u16(blk));
        uint32_t raw[4];
        ld_words_a2<4>(blk + 2, raw);
        UNROLL
        for (int i = 0; i < 4; i++) {
            w.q[i] = raw[i] & LO4;
            w.q[4 + i] = raw[i] >> 4 & LO4;
        }
    } else if constexpr (T == QTYPE_Q4_K || T == QTYPE_Q5_K) {
        /* quarter g: qs[32 g + l], low nibbles sub-block 2 g, high ones 2 g + 1; Q5_K's
         * fifth bits are bits 2 g and 2 g + 1 of qh[l] */
        constexpr size_t bytes = T == QTYPE_Q4_K ? Q4_K_BYTES : Q5_K_BYTES;
        constexpr int qs_at = T == QTYPE_Q4_K ? 16 : 48;
        const uint8_t *blk = row + ci / 4 * bytes;
        int g = (int)(ci % 4);
        uint32_t dm = ld_u32(blk);
        uint32_t s[3] = {ld_u32(blk + 4), ld_u32(blk + 8), ld_u32(blk + 12)};
        w.d = f16_to_f32((uint16_t)(dm & 0xffff));
        w.dmin = f16_to_f32((uint16_t)(dm >> 16));
        k_scale_min(s, 2 * g, &w.sc[0], &w.sc[2]);
        k_scale_min(s, 2 * g + 1, &w.sc[1], &w.sc[3]);
        uint32_t raw[8];
        ld_words_a16<2>(blk + qs_at + 32 * g, raw);
        UNROLL
        for (int i = 0; i < 8; i++) {
            w.q[i] = raw[i] & LO4;
            w.q[8 + i] = raw[i] >> 4 & LO4;
        }
        if constexpr (T == QTYPE_Q5_K) {
            uint32_t qh[8];
            ld_words_a16<2>(blk + 16, qh);
            UNROLL
            for (int i = 0; i < 8; i++) {
                w.q[i] |= (qh[i] >> (2 * g) & 0x01010101u) << 4;
                w.q[8 + i] |= (qh[i] >> (2 * g + 1) & 0x01010101u) << 4;
            }
        }
    } else if constexpr (T == QTYPE_Q6_K) {
        /* half h, quarters a and a + 2: ql[64 h + 32 a + l] low and high nibbles, the high
         * 2 bits at bits 2 a and 2 a + 4 of qh[32 h + l]; scales[8 h + 2 k + l / 16] */
        const uint8_t *blk = row + ci / 4 * Q6_K_BYTES;
        int h = (int)(ci / 2 % 2), a = (int)(ci % 2);
        uint32_t ql[8], qh[8];
        ld_words_a2<8>(blk + 64 * h + 32 * a, ql);
        ld_words_a2<8>(blk + 128 + 32 * h, qh);
        uint32_t s01 = ld_u16(blk + 192 + 8 * h + 2 * a);
        uint32_t s23 = ld_u16(blk + 192 + 8 * h + 2 * a + 4);
        w.sc[0] = (int8_t)(uint8_t)(s01 & 0xff);
        w.sc[1] = (int8_t)(uint8_t)(s01 >> 8);
        w.sc[2] = (int8_t)(uint8_t)(s23 & 0xff);
        w.sc[3] = (int8_t)(uint8_t)(s23 >> 8);
        w.d = f16_to_f32(ld_u16(blk + 208));
        UNROLL
        for (int i = 0; i < 8; i++) {
            uint32_t lo = (ql[i] & LO4) | (qh[i] >> (2 * a) & 0x03030303u) << 4;
            uint32_t hi = (ql[i] >> 4 & LO4) | (qh[i] >> (2 * a + 4) & 0x03030303u) << 4;
            /* 0..63 less 32 as signed bytes: + 96 stays below 256 in every byte (no carry
             * between them), and flipping bit 7 takes 128 off modulo 256 */
            w.q[i] = (lo + 0x60606060u) ^ 0x80808080u;
            w.q[8 + i] = (hi + 0x60606060u) ^ 0x80808080u;
        }
    }
}

/* The dot product of chunk ci's weights w with one activation row: xq (n_in) int8, xs
 * (n_in / 32) per block {scale, sum of its int8 values}. */
template <uint32_t T>
__host__ __device__ inline float chunk_dot(const wchunk &w, int64_t ci, const int8_t *xq,
                                           const float2 *xs)
{
    constexpr int HALVES = chunk_elems<T>() / ACT_BLOCK;
    int sum[HALVES][2]; /* integer dots of each half's two 16-element groups */
    float xd[HALVES], xsum[HALVES];
    UNROLL
    for (int h = 0; h < HALVES; h++) {
        int64_t b = chunk_act_block<T>(ci, h);
        uint32_t x[8];
        ld_words_a16<2>(reinterpret_cast<const uint8_t *>(xq + b * ACT_BLOCK), x);
#ifdef __CUDA_ARCH__
        float2 s = __ldg(xs + b);
#else
        float2 s = xs[b];
#endif
        xd[h] = s.x;
        xsum[h] = s.y;
        UNROLL
        for (int k = 0; k < 2; k++) {
            int acc = 0;
            UNROLL
            for (int i = 0; i < 4; i++)
                acc = dot4(w.q[8 * h + 4 * k + i], x[4 * k + i], acc);
            sum[h][k] = acc;
        }
    }
    if constexpr (T == QTYPE_Q8_0) {
        return w.d * xd[0] * (float)(sum[0][0] + sum[0][1]);
    } else if constexpr (T == QTYPE_Q4_0) {
        return w.d * xd[0] * ((float)(sum[0][0] + sum[0][1]) - 8.0f * xsum[0]);
    } else if constexpr (T == QTYPE_Q4_K || T == QTYPE_Q5_K) {
        /* sub-block weight d sc q - dmin m: its dot d sc (q . x) - dmin m (sum of x) */
        float dot = xd[0] * (float)(w.sc[0] * (sum[0][0] + sum[0][1])) +
                    xd[1] * (float)(w.sc[1] * (sum[1][0] + sum[1][1]));
        float mins = xd[0] * ((float)w.sc[2] * xsum[0]) + xd[1] * ((float)w.sc[3] * xsum[1]);
        return w.d * dot - w.dmin * mins;
    } else {
        static_assert(T == QTYPE_Q6_K, "an integer-path type");
        return w.d * (xd[0] * (float)(w.sc[0] * sum[0][0] + w.sc[1] * sum[0][1]) +
                      xd[1] * (float)(w.sc[2] * sum[1][0] + w.sc[3] * sum[1][1]));
    }
}

template <uint32_t T> __host__ __device__ constexpr bool integer_path()
{
    return T == QTYPE_Q8_0 || T == QTYPE_Q4_0 || T == QTYPE_Q4_K || T == QTYPE_Q5_K ||
           T == QTYPE_Q6_K;
}

/* Accumulates weights w (elements e .. e + 7) times every column's activations. */
template <int NC>
__device__ inline void fma_oct(const float w[OCT], const float *__restrict__ x, int64_t n_in,
                               int64_t e, float acc[NC])
{
    UNROLL
    for (int c = 0; c < NC; c++) {
        const float4 *xp = reinterpret_cast<const float4 *>(x + c * n_in + e);
        float4 a = __ldg(xp), b = __ldg(xp + 1);
        acc[c] += w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x +
                  w[5] * b.y + w[6] * b.z + w[7] * b.w;
    }
}

/* Steps unrolled per loop trip: enough loads in flight at one or two columns, fewer
 * registers at more (where each weight byte serves several activation rows' FMAs). */
template <int NC> __host__ __device__ constexpr int unroll_steps()
{
    return NC <= 2 ? 4 : 2;
}

/* No __launch_bounds__: with it (128 threads) ptxas capped some kernels near 48
 * registers and spilled; without, none uses more than 76 and none spills. */

template <uint32_t T, int NC>
__global__ void
    matvec_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int64_t n_in, int64_t n_out,
                  const float *__restrict__ x, float *__restrict__ y, bool accumulate)
{
    int lane = threadIdx.x % WARP;
    int64_t r = (int64_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP;
    if (r >= n_out)
        return;
    const uint8_t *row = w + r * row_bytes;
    float acc[NC];
    UNROLL
    for (int c = 0; c < NC; c++)
        acc[c] = 0.0f;

    constexpr int U = unroll_steps<NC>();
    int64_t n_full = n_in / (U * STEP) * (U * STEP);
    for (int64_t base = 0; base < n_full; base += U * STEP) {
        float wv[U][OCT];
        UNROLL
        for (int u = 0; u < U; u++)
            dequant8<T>(row, base + u * STEP + OCT * lane, wv[u]);
        UNROLL
        for (int u = 0; u < U; u++)
            fma_oct<NC>(wv[u], x, n_in, base + u * STEP + OCT * lane, acc);
    }
    for (int64_t e = n_full + OCT * lane; e < n_in; e += STEP) {
        float wv[OCT];
        dequant8<T>(row, e, wv);
        fma_oct<NC>(wv, x, n_in, e, acc);
    }

    UNROLL
    for (int c = 0; c < NC; c++)
        for (int off = WARP / 2; off > 0; off /= 2)
            acc[c] += __shfl_xor_sync(0xffffffffu, acc[c], off);
    /* every lane holds the sums; lane c writes column c */
    UNROLL
    for (int c = 0; c < NC; c++)
        if (lane == c) {
            float *out = y + c * n_out + r;
            *out = accumulate ? *out + acc[c] : acc[c];
        }
}

/* Activation rows x (n_blocks * 32 f32, rows contiguous, each a whole number of blocks) to
 * int8: a warp per block, lane l its element l. */
__global__ void quantize_act_kernel(const float *__restrict__ x, int64_t n_blocks,
                                    int8_t *__restrict__ xq, float2 *__restrict__ xs)
{
    int lane = threadIdx.x % WARP;
    int64_t b = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / WARP;
    if (b >= n_blocks) /* the whole warp: b is the same in its lanes */
        return;
    float v = __ldg(x + b * ACT_BLOCK + lane);
    float amax = fabsf(v);
    for (int off = WARP / 2; off > 0; off /= 2)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    float d, id;
    act_scale(amax, &d, &id);
    int q = act_quant(v, id);
    int sum = q;
    for (int off = WARP / 2; off > 0; off /= 2)
        sum += __shfl_xor_sync(0xffffffffu, sum, off);
    xq[b * ACT_BLOCK + lane] = (int8_t)q;
    if (lane == 0)
        xs[b] = make_float2(d, (float)sum);
}

/* Chunks unrolled per loop trip, their weight loads in flight together. */
constexpr int CHUNK_UNROLL = 2;

/* cuda_matvec's integer path: a warp per row as matvec_kernel, lane l taking chunks
 * l, l + 32, ...; each chunk's weights decoded once for every column. */
template <uint32_t T, int NC>
__global__ void matvec_int_kernel(const uint8_t *__restrict__ w, size_t row_bytes,
                                  int64_t n_in, int64_t n_out, const int8_t *__restrict__ xq,
                                  const float2 *__restrict__ xs, float *__restrict__ y,
                                  bool accumulate)
{
    int lane = threadIdx.x % WARP;
    int64_t r = (int64_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP;
    if (r >= n_out)
        return;
    const uint8_t *row = w + r * row_bytes;
    int64_t n_chunks = n_in / chunk_elems<T>(), n_blocks = n_in / ACT_BLOCK;
    float acc[NC];
#pragma unroll
    for (int c = 0; c < NC; c++)
        acc[c] = 0.0f;

    int64_t ci = lane;
    for (; ci + WARP * (CHUNK_UNROLL - 1) < n_chunks; ci += WARP * CHUNK_UNROLL) {
        wchunk wc[CHUNK_UNROLL];
#pragma unroll
        for (int u = 0; u < CHUNK_UNROLL; u++)
            decode_chunk<T>(row, ci + WARP * u, wc[u]);
#pragma unroll
        for (int u = 0; u < CHUNK_UNROLL; u++)
#pragma unroll
            for (int c = 0; c < NC; c++)
                acc[c] += chunk_dot<T>(wc[u], ci + WARP * u, xq + c * n_in, xs + c * n_blocks);
    }
    for (; ci < n_chunks; ci += WARP) {
        wchunk wc;
        decode_chunk<T>(row, ci, wc);
#pragma unroll
        for (int c = 0; c < NC; c++)
            acc[c] += chunk_dot<T>(wc, ci, xq + c * n_in, xs + c * n_blocks);
    }

#pragma unroll
    for (int c = 0; c < NC; c++)
        for (int off = WARP / 2; off > 0; off /= 2)
            acc[c] += __shfl_xor_sync(0xffffffffu, acc[c], off);
#pragma unroll
    for (int c = 0; c < NC; c++)
        if (lane == c) {
            float *out = y + c * n_out + r;
            *out = accumulate ? *out + acc[c] : acc[c];
        }
}

/* One thread per oct of the matrix: coalesced weight loads and 16-byte f16 stores. */
template <uint32_t T>
__global__ void dequantize_f16_kernel(const uint8_t *__restrict__ w, size_t row_bytes,
                                      int64_t n_in, int64_t n_octs, __half *__restrict__ dst)
{
    int64_t octs_per_row = n_in / OCT;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_octs;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / octs_per_row, e = (i % octs_per_row) * OCT;
        float v[OCT];
        dequant8<T>(w + r * row_bytes, e, v);
        __half2 h[4];
        for (int k = 0; k < 4; k++)
            h[k] = __floats2half2_rn(v[2 * k], v[2 * k + 1]);
        uint4 out;
        memcpy(&out, h, sizeof out);
        *reinterpret_cast<uint4 *>(dst + r * n_in + e) = out;
    }
}

/* The integer path's scratch: xq (n_cols, n_in) int8, then xs (n_cols, n_in / 32) float2
 * {scale, sum of the block's int8 values}; n_in a multiple of 32, so xs is 16-byte aligned. */
size_t act_bytes(int64_t n_in, int n_cols)
{
    size_t n = (size_t)(n_in + ACT_BLOCK - 1) / ACT_BLOCK * ACT_BLOCK;
    return (size_t)n_cols * (n + n / ACT_BLOCK * sizeof(float2));
}

template <uint32_t T>
cudaError_t launch_matvec(const cuda_weight *w, const float *x, int n_cols, float *y,
                          bool accumulate, void *scratch, bool quantize, cudaStream_t stream)
{
    dim3 grid((unsigned)((w->n_out + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK));
    dim3 block(ROWS_PER_BLOCK * WARP);
    const uint8_t *data = static_cast<const uint8_t *>(w->data);
    int8_t *xq = static_cast<int8_t *>(scratch);
    float2 *xs = integer_path<T>() ? reinterpret_cast<float2 *>(xq + (size_t)n_cols * w->n_in)
                                   : nullptr;
    if (integer_path<T>() && quantize) {
        int64_t n_blocks = n_cols * w->n_in / ACT_BLOCK;
        int threads = 256, blocks_per = threads / WARP;
        quantize_act_kernel<<<(unsigned)((n_blocks + blocks_per - 1) / blocks_per), threads, 0,
                              stream>>>(x, n_blocks, xq, xs);
    }
#define LLMS_MATVEC_CASE(nc)                                                                \
    case nc:                                                                                \
        if constexpr (integer_path<T>())                                                    \
            matvec_int_kernel<T, nc><<<grid, block, 0, stream>>>(                           \
                data, w->row_bytes, w->n_in, w->n_out, xq, xs, y, accumulate);              \
        else                                                                                \
            matvec_kernel<T, nc><<<grid, block, 0, stream>>>(data, w->row_bytes, w->n_in,   \
                                                             w->n_out, x, y, accumulate);   \
        break;
    switch (n_cols) {
        LLMS_MATVEC_CASE(1)
        LLMS_MATVEC_CASE(2)
        LLMS_MATVEC_CASE(3)
        LLMS_MATVEC_CASE(4)
        LLMS_MATVEC_CASE(5)
        LLMS_MATVEC_CASE(6)
        LLMS_MATVEC_CASE(7)
        LLMS_MATVEC_CASE(8)
    default:
        return cudaErrorInvalidValue;
    }
#undef LLMS_MATVEC_CASE
    return cudaGetLastError();
}

template <uint32_t T>
cudaError_t launch_dequantize(const cuda_weight *w, uint16_t *dst, cudaStream_t stream)
{
    int64_t n_octs = w->n_out * (w->n_in / OCT);
    int threads = 256;
    int64_t blocks = (n_octs + threads - 1) / threads;
    if (blocks > 65536) /* the rest by the grid-stride loop */
        blocks = 65536;
    dequantize_f16_kernel<T><<<(unsigned)blocks, threads, 0, stream>>>(
        static_cast<const uint8_t *>(w->data), w->row_bytes, w->n_in, n_octs,
        reinterpret_cast<__half *>(dst));
    return cudaGetLastError();
}

/* The integer path's dot product of one row with x (n), on the host: x quantized by the
 * kernels' own functions into xq (n) and xs (n / 32), then the chunks' sum. */
template <uint32_t T>
void host_dot(const uint8_t *row, int64_t n, const float *x, int8_t *xq, float2 *xs,
              float *dot)
{
    if constexpr (integer_path<T>()) {
        for (int64_t b = 0; b < n / ACT_BLOCK; b++) {
            float amax = 0.0f, d, id;
            for (int l = 0; l < ACT_BLOCK; l++)
                amax = fmaxf(amax, fabsf(x[b * ACT_BLOCK + l]));
            act_scale(amax, &d, &id);
            int sum = 0;
            for (int l = 0; l < ACT_BLOCK; l++) {
                int q = act_quant(x[b * ACT_BLOCK + l], id);
                xq[b * ACT_BLOCK + l] = (int8_t)q;
                sum += q;
            }
            xs[b] = make_float2(d, (float)sum);
        }
        float acc = 0.0f;
        for (int64_t ci = 0; ci < n / chunk_elems<T>(); ci++) {
            wchunk w;
            decode_chunk<T>(row, ci, w);
            acc += chunk_dot<T>(w, ci, xq, xs);
        }
        *dot = acc;
    } else {
        float w[OCT];
        double acc = 0.0;
        for (int64_t e = 0; e < n; e += OCT) {
            dequant8<T>(row, e, w);
            for (int i = 0; i < OCT; i++)
                acc += (double)w[i] * x[e + i];
        }
        *dot = (float)acc;
    }
}

template <uint32_t T> void host_dequant(const uint8_t *row, int64_t n, float *out)
{
    for (int64_t e = 0; e < n; e += OCT)
        dequant8<T>(row, e, out + e);
}

/* Whether w describes a matrix the kernels take: a supported type, whole blocks (and whole
 * octs), the row size of the type, a 16-byte aligned base. */
bool weight_ok(const cuda_weight *w)
{
    if (!w || !cuda_matmul_type_supported(w->type) || w->n_in <= 0 || w->n_out <= 0 ||
        w->n_in % OCT != 0 || !w->data || ((uintptr_t)w->data & 15) != 0)
        return false;
    size_t bytes = quant_row_bytes(w->type, w->n_in);
    return bytes != 0 && bytes == w->row_bytes;
}

/* Calls F<T>(args...) for w's type; f is a generic lambda taking a type tag. */
template <typename F> cudaError_t by_type(uint32_t type, F f)
{
    switch (type) {
    case QTYPE_F32:
        return f(std::integral_constant<uint32_t, QTYPE_F32>());
    case QTYPE_F16:
        return f(std::integral_constant<uint32_t, QTYPE_F16>());
    case QTYPE_BF16:
        return f(std::integral_constant<uint32_t, QTYPE_BF16>());
    case QTYPE_Q8_0:
        return f(std::integral_constant<uint32_t, QTYPE_Q8_0>());
    case QTYPE_Q4_0:
        return f(std::integral_constant<uint32_t, QTYPE_Q4_0>());
    case QTYPE_Q4_K:
        return f(std::integral_constant<uint32_t, QTYPE_Q4_K>());
    case QTYPE_Q5_K:
        return f(std::integral_constant<uint32_t, QTYPE_Q5_K>());
    case QTYPE_Q6_K:
        return f(std::integral_constant<uint32_t, QTYPE_Q6_K>());
    default:
        return cudaErrorInvalidValue;
    }
}

} /* namespace */

extern "C" bool cuda_matmul_type_supported(uint32_t type)
{
    switch (type) {
    case QTYPE_F32:
    case QTYPE_F16:
    case QTYPE_BF16:
    case QTYPE_Q8_0:
    case QTYPE_Q4_0:
    case QTYPE_Q4_K:
    case QTYPE_Q5_K:
    case QTYPE_Q6_K:
        return true;
    default:
        return false;
    }
}

extern "C" size_t cuda_matvec_scratch_bytes(int64_t n_in, int n_cols)
{
    return n_in > 0 && n_cols > 0 ? act_bytes(n_in, n_cols) : 0;
}

extern "C" cudaError_t cuda_matvec(const cuda_weight *w, const float *x, int n_cols, float *y,
                                   bool accumulate, void *scratch, cudaStream_t stream)
{
    bool x_in_scratch = false;
    return cuda_matvec_shared(w, x, n_cols, y, accumulate, scratch, &x_in_scratch, stream);
}

extern "C" cudaError_t cuda_matvec_shared(const cuda_weight *w, const float *x, int n_cols,
                                          float *y, bool accumulate, void *scratch,
                                          bool *x_in_scratch, cudaStream_t stream)
{
    if (!weight_ok(w) || !x || !y || ((uintptr_t)x & 15) != 0 || n_cols < 1 ||
        n_cols > CUDA_MATVEC_MAX_COLS)
        return cudaErrorInvalidValue;
    return by_type(w->type, [&](auto t) {
        constexpr uint32_t T = decltype(t)::value;
        if (integer_path<T>() &&
            (!scratch || ((uintptr_t)scratch & 15) != 0 || w->n_in % ACT_BLOCK != 0))
            return cudaErrorInvalidValue;
        cudaError_t e =
            launch_matvec<T>(w, x, n_cols, y, accumulate, scratch, !*x_in_scratch, stream);
        if (integer_path<T>() && e == cudaSuccess)
            *x_in_scratch = true;
        return e;
    });
}

extern "C" cudaError_t cuda_dequantize_f16(const cuda_weight *w, uint16_t *dst,
                                           cudaStream_t stream)
{
    if (!weight_ok(w) || !dst || ((uintptr_t)dst & 15) != 0)
        return cudaErrorInvalidValue;
    return by_type(w->type, [&](auto t) {
        return launch_dequantize<decltype(t)::value>(w, dst, stream);
    });
}

extern "C" bool cuda_matmul_host_check(uint32_t type, const void *row, int64_t n, float *out)
{
    if (!cuda_matmul_type_supported(type) || n <= 0 || n % OCT != 0 ||
        quant_row_bytes(type, n) == 0)
        return false;
    const uint8_t *p = static_cast<const uint8_t *>(row);
    return by_type(type, [&](auto t) {
               host_dequant<decltype(t)::value>(p, n, out);
               return cudaSuccess;
           }) == cudaSuccess;
}

extern "C" bool cuda_matvec_host_check(uint32_t type, const void *row, int64_t n,
                                       const float *x, float *dot)
{
    if (!cuda_matmul_type_supported(type) || n <= 0 || n % OCT != 0 ||
        quant_row_bytes(type, n) == 0)
        return false;
    bool integer = type != QTYPE_F32 && type != QTYPE_F16 && type != QTYPE_BF16;
    int8_t *xq = NULL;
    float2 *xs = NULL;
    if (integer) {
        if (n % ACT_BLOCK != 0)
            return false;
        xq = static_cast<int8_t *>(malloc((size_t)n));
        xs = static_cast<float2 *>(malloc((size_t)n / ACT_BLOCK * sizeof(float2)));
        if (!xq || !xs) {
            free(xq);
            free(xs);
            return false;
        }
    }
    const uint8_t *p = static_cast<const uint8_t *>(row);
    by_type(type, [&](auto t) {
        host_dot<decltype(t)::value>(p, n, x, xq, xs, dot);
        return cudaSuccess;
    });
    free(xq);
    free(xs);
    return true;
}
