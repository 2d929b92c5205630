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
 * cuda_matvec gives each weight row to one warp. A warp step covers 256 elements, lane l
 * the oct at 8 l: the warp's activation loads are then contiguous (two float4 per lane
 * and column) and its weight loads fall on a few consecutive blocks (a whole K-quant
 * super-block). Steps are unrolled so that several steps' loads are in flight before the
 * first is used; the lanes' partial sums meet through shuffles.
 */
#include "engine/cuda/cuda_matmul.h"

#include <cuda_fp16.h>
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

/* Accumulates weights w (elements e .. e + 7) times every column's activations. */
template <int NC>
__device__ inline void fma_oct(const float w[OCT], const float *__restrict__ x, int64_t n_in,
                               int64_t e, float acc[NC])
{
#pragma unroll
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
#pragma unroll
    for (int c = 0; c < NC; c++)
        acc[c] = 0.0f;

    constexpr int U = unroll_steps<NC>();
    int64_t n_full = n_in / (U * STEP) * (U * STEP);
    for (int64_t base = 0; base < n_full; base += U * STEP) {
        float wv[U][OCT];
#pragma unroll
        for (int u = 0; u < U; u++)
            dequant8<T>(row, base + u * STEP + OCT * lane, wv[u]);
#pragma unroll
        for (int u = 0; u < U; u++)
            fma_oct<NC>(wv[u], x, n_in, base + u * STEP + OCT * lane, acc);
    }
    for (int64_t e = n_full + OCT * lane; e < n_in; e += STEP) {
        float wv[OCT];
        dequant8<T>(row, e, wv);
        fma_oct<NC>(wv, x, n_in, e, acc);
    }

#pragma unroll
    for (int c = 0; c < NC; c++)
        for (int off = WARP / 2; off > 0; off /= 2)
            acc[c] += __shfl_xor_sync(0xffffffffu, acc[c], off);
    /* every lane holds the sums; lane c writes column c */
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

template <uint32_t T>
cudaError_t launch_matvec(const cuda_weight *w, const float *x, int n_cols, float *y,
                          bool accumulate, cudaStream_t stream)
{
    dim3 grid((unsigned)((w->n_out + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK));
    dim3 block(ROWS_PER_BLOCK * WARP);
    const uint8_t *data = static_cast<const uint8_t *>(w->data);
#define LLMS_MATVEC_CASE(nc)                                                                \
    case nc:                                                                                \
        matvec_kernel<T, nc><<<grid, block, 0, stream>>>(data, w->row_bytes, w->n_in,       \
                                                         w->n_out, x, y, accumulate);       \
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

extern "C" cudaError_t cuda_matvec(const cuda_weight *w, const float *x, int n_cols, float *y,
                                   bool accumulate, cudaStream_t stream)
{
    if (!weight_ok(w) || !x || !y || ((uintptr_t)x & 15) != 0 || n_cols < 1 ||
        n_cols > CUDA_MATVEC_MAX_COLS)
        return cudaErrorInvalidValue;
    return by_type(w->type, [&](auto t) {
        return launch_matvec<decltype(t)::value>(w, x, n_cols, y, accumulate, stream);
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
