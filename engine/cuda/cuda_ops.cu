/*
 * cuda_ops.cu — the forward pass's kernels other than weight products (cuda_ops.h).
 *
 * Element-wise kernels take one thread per element; reductions over a row (norms, the
 * greedy pick) one block per row. Attention is one block per (row, head): its warps take
 * tiles of 32 entries in turn, each lane scoring one entry of the tile against q with
 * 16-byte loads of its K row, then an online softmax over the tile and the tile's V rows
 * added in with the lanes across head_dim; the warps' partial sums are merged at the end.
 * Decode has few rows, so the warps of a block, not the rows, are what fill the GPU.
 */
#include "engine/cuda/cuda_ops.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

#define CUDA_ATTN_WARPS 8
/* (row, KV head) blocks from which a step's attention groups the query heads of a KV
 * head in one block (cuda_attention_group_kernel) */
#define CUDA_ATTN_GROUP_MIN_BLOCKS 64

static inline unsigned cuda_blocks(size_t n, unsigned threads)
{
    return (unsigned)((n + threads - 1) / threads);
}

__device__ static inline float cuda_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ static inline float cuda_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* The sum of v over a block of blockDim.x (a multiple of 32, at most 1024) threads, in
 * every thread. */
__device__ static float cuda_block_sum(float v)
{
    __shared__ float part[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    v = cuda_warp_sum(v);
    __syncthreads();
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    v = lane < n_warps ? part[lane] : 0.0f;
    return cuda_warp_sum(v);
}

__global__ static void cuda_rmsnorm_kernel(const float *x, const float *w, float *y, int dim,
                                           float eps)
{
    const float *xr = x + (size_t)blockIdx.x * dim;
    float *yr = y + (size_t)blockIdx.x * dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        ss += xr[i] * xr[i];
    ss = cuda_block_sum(ss);
    float scale = rsqrtf(ss / dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        yr[i] = xr[i] * scale * w[i];
}

cudaError_t cuda_rmsnorm(const float *x, const float *w, float *y, int n, int dim, float eps,
                         cudaStream_t s)
{
    cuda_rmsnorm_kernel<<<n, 256, 0, s>>>(x, w, y, dim, eps);
    return cudaGetLastError();
}

/* One warp per vector. */
__global__ static void cuda_head_rmsnorm_kernel(float *x, const float *w, int n_vec, int hd,
                                                float eps)
{
    int vec = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (vec >= n_vec)
        return;
    float *xv = x + (size_t)vec * hd;
    float ss = 0.0f;
    for (int i = lane; i < hd; i += 32)
        ss += xv[i] * xv[i];
    ss = cuda_warp_sum(ss);
    float scale = rsqrtf(ss / hd + eps);
    for (int i = lane; i < hd; i += 32)
        xv[i] = xv[i] * scale * w[i];
}

cudaError_t cuda_head_rmsnorm(float *x, const float *w, int n_vec, int hd, float eps,
                              cudaStream_t s)
{
    cuda_head_rmsnorm_kernel<<<cuda_blocks((size_t)n_vec, 8), 256, 0, s>>>(x, w, n_vec, hd,
                                                                          eps);
    return cudaGetLastError();
}

__global__ static void cuda_add_bias_kernel(float *x, const float *b, size_t n, int dim)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] += b[i % dim];
}

cudaError_t cuda_add_bias(float *x, const float *b, int n, int dim, cudaStream_t s)
{
    size_t total = (size_t)n * dim;
    cuda_add_bias_kernel<<<cuda_blocks(total, 256), 256, 0, s>>>(x, b, total, dim);
    return cudaGetLastError();
}

/* One thread per (row, head, pair), q's heads then k's. */
__global__ static void cuda_rope_kernel(float *q, float *k, const float *cs, int n, int n_head,
                                        int n_head_kv, int hd, int rope_dims, bool interleaved)
{
    int half = rope_dims / 2;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t q_pairs = (size_t)n * n_head * half;
    if (i >= q_pairs + (size_t)n * n_head_kv * half)
        return;
    bool is_k = i >= q_pairs;
    size_t j = is_k ? i - q_pairs : i;
    int heads = is_k ? n_head_kv : n_head;
    int pair = (int)(j % half);
    size_t head = j / half;
    int row = (int)(head / heads);
    float c = cs[((size_t)row * half + pair) * 2], sn = cs[((size_t)row * half + pair) * 2 + 1];
    float *xh = (is_k ? k : q) + head * hd;
    int a = interleaved ? 2 * pair : pair, b = interleaved ? 2 * pair + 1 : pair + half;
    float x0 = xh[a], x1 = xh[b];
    xh[a] = x0 * c - x1 * sn;
    xh[b] = x0 * sn + x1 * c;
}

cudaError_t cuda_rope(float *q, float *k, const float *cs, int n, int n_head, int n_head_kv,
                      int hd, int rope_dims, bool interleaved, cudaStream_t s)
{
    size_t total = (size_t)n * (n_head + n_head_kv) * (rope_dims / 2);
    cuda_rope_kernel<<<cuda_blocks(total, 256), 256, 0, s>>>(q, k, cs, n, n_head, n_head_kv, hd,
                                                            rope_dims, interleaved);
    return cudaGetLastError();
}

__global__ static void cuda_kv_append_kernel(const float *k, const float *v,
                                             const cuda_row *rows, int n, int kv_dim, int layer,
                                             int n_layer, int max_kv, uint16_t *out)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n * kv_dim)
        return;
    int r = (int)(i / kv_dim), e = (int)(i % kv_dim);
    const cuda_row row = rows[r];
    size_t dst = ((size_t)layer * max_kv + row.slot) * kv_dim + e;
    uint16_t kh = __half_as_ushort(__float2half_rn(k[i]));
    uint16_t vh = __half_as_ushort(__float2half_rn(v[i]));
    row.k[dst] = kh;
    row.v[dst] = vh;
    if (out) {
        uint16_t *o = out + ((size_t)r * n_layer + layer) * 2 * kv_dim + e;
        o[0] = kh;
        o[kv_dim] = vh;
    }
    if (layer == 0 && e == 0)
        row.pos[row.slot] = row.q_pos;
}

cudaError_t cuda_kv_append(const float *k, const float *v, const cuda_row *rows, int n,
                           int kv_dim, int layer, int n_layer, int max_kv, uint16_t *out,
                           cudaStream_t s)
{
    size_t total = (size_t)n * kv_dim;
    cuda_kv_append_kernel<<<cuda_blocks(total, 256), 256, 0, s>>>(k, v, rows, n, kv_dim, layer,
                                                                 n_layer, max_kv, out);
    return cudaGetLastError();
}

/* The scaled score of entry j against qs, -inf when the row may not see it. */
__device__ static inline float cuda_attn_score(const float *qs, const __half *K,
                                               const cuda_row &row, int j, int hd, int kv_dim)
{
    if (j >= row.n_kv || row.pos[j] > row.q_pos)
        return -INFINITY;
    const uint4 *kj = (const uint4 *)(K + (size_t)j * kv_dim);
    float dot = 0.0f;
    for (int c = 0; c < hd / 8; c++) {
        uint4 u = kj[c];
        const __half2 *h2 = (const __half2 *)&u;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float2 f = __half22float2(h2[e]);
            dot += qs[c * 8 + 2 * e] * f.x + qs[c * 8 + 2 * e + 1] * f.y;
        }
    }
    return dot;
}

/*
 * Block (head, row) of CUDA_ATTN_WARPS warps. NI = ceil(hd / 32): each lane holds
 * dimensions lane + 32 i of the output. The scaled q sits in shared memory, read by
 * every lane at once (a broadcast).
 */
template <int NI>
__global__ static void cuda_attention_kernel(const float *q, const cuda_row *rows, int n_head,
                                             int n_head_kv, int hd, size_t layer_off,
                                             float scale, float *out)
{
    __shared__ float qs[CUDA_ATTN_MAX_HEAD_DIM];
    __shared__ float warp_m[CUDA_ATTN_WARPS], warp_l[CUDA_ATTN_WARPS];
    __shared__ float warp_acc[CUDA_ATTN_WARPS][NI * 32];

    const int h = blockIdx.x, r = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const cuda_row row = rows[r];
    const int kv_dim = n_head_kv * hd;
    const int kvh = h / (n_head / n_head_kv);
    const __half *K = (const __half *)row.k + layer_off + (size_t)kvh * hd;
    const __half *V = (const __half *)row.v + layer_off + (size_t)kvh * hd;
    const float *qr = q + ((size_t)r * n_head + h) * hd;

    for (int d = threadIdx.x; d < hd; d += blockDim.x)
        qs[d] = qr[d] * scale;
    __syncthreads();

    float m = -INFINITY, l = 0.0f, acc[NI];
#pragma unroll
    for (int i = 0; i < NI; i++)
        acc[i] = 0.0f;

    const int n_tiles = (row.n_kv + 31) / 32;
    for (int tile = warp; tile < n_tiles; tile += CUDA_ATTN_WARPS) {
        int j0 = tile * 32;
        float score = cuda_attn_score(qs, K, row, j0 + lane, hd, kv_dim);
        float tile_max = cuda_warp_max(score);
        if (tile_max == -INFINITY)
            continue;
        float m_new = fmaxf(m, tile_max);
        float corr = expf(m - m_new);
        float p = score == -INFINITY ? 0.0f : expf(score - m_new);
        l = l * corr + cuda_warp_sum(p);
#pragma unroll
        for (int i = 0; i < NI; i++)
            acc[i] *= corr;
        /* the tile's V rows U at a time, their loads issued together (a branch per entry
         * would wait out each load's latency in turn); entries past the sequence read its
         * last row, times a probability of 0 */
        constexpr int U = NI <= 4 ? 8 : 4;
        const int last = row.n_kv - 1;
        for (int jj = 0; jj < 32; jj += U) {
            float pj[U], vv[U][NI];
#pragma unroll
            for (int u = 0; u < U; u++) {
                pj[u] = __shfl_sync(0xffffffffu, p, jj + u);
                const __half *vj = V + (size_t)min(j0 + jj + u, last) * kv_dim;
#pragma unroll
                for (int i = 0; i < NI; i++) {
                    int d = lane + 32 * i;
                    vv[u][i] = d < hd ? __half2float(vj[d]) : 0.0f;
                }
            }
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int i = 0; i < NI; i++)
                    acc[i] += pj[u] * vv[u][i];
        }
        m = m_new;
    }

    if (lane == 0) {
        warp_m[warp] = m;
        warp_l[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < NI; i++)
        warp_acc[warp][lane + 32 * i] = acc[i];
    __syncthreads();

    float m_all = -INFINITY;
    for (int w = 0; w < CUDA_ATTN_WARPS; w++)
        m_all = fmaxf(m_all, warp_m[w]);
    float l_all = 0.0f;
    for (int w = 0; w < CUDA_ATTN_WARPS; w++)
        if (warp_l[w] > 0.0f)
            l_all += warp_l[w] * expf(warp_m[w] - m_all);
    float *o = out + ((size_t)r * n_head + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float sum = 0.0f;
        for (int w = 0; w < CUDA_ATTN_WARPS; w++)
            if (warp_l[w] > 0.0f)
                sum += warp_acc[w][d] * expf(warp_m[w] - m_all);
        o[d] = sum / l_all;
    }
    /* the probabilities again, from the scores and the softmax's final max and sum */
    if (row.recv)
        for (int tile = warp; tile < n_tiles; tile += CUDA_ATTN_WARPS) {
            int j = tile * 32 + lane;
            float score = cuda_attn_score(qs, K, row, j, hd, kv_dim);
            if (score != -INFINITY)
                atomicAdd(row.recv + j, expf(score - m_all) / l_all);
        }
}

/*
 * Block (KV head, row): the g = n_head / n_head_kv query heads that share a KV head,
 * together. Each K and V row is then read once for all of them, not once per head: a
 * prefill's attention is bound by those loads' latency, which this divides by g. Lane j
 * scores entry j of its warp's tile against every head of the group; each head keeps its
 * own online softmax; the tile's probabilities go through shared memory to the V pass.
 * head_dim up to 128 (NI <= 4), groups up to GM heads.
 */
template <int NI, int GM>
__global__ static void cuda_attention_group_kernel(const float *q, const cuda_row *rows,
                                                   int n_head, int n_head_kv, int hd,
                                                   size_t layer_off, float scale, float *out)
{
    __shared__ float qs[GM][NI * 32];
    __shared__ float warp_m[CUDA_ATTN_WARPS][GM], warp_l[CUDA_ATTN_WARPS][GM];
    __shared__ float warp_acc[CUDA_ATTN_WARPS][GM][NI * 32];
    __shared__ float warp_p[CUDA_ATTN_WARPS][GM][32];
    __shared__ float fin_m[GM], fin_l[GM];

    const int kvh = blockIdx.x, r = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = n_head / n_head_kv;
    const cuda_row row = rows[r];
    const int kv_dim = n_head_kv * hd;
    const __half *K = (const __half *)row.k + layer_off + (size_t)kvh * hd;
    const __half *V = (const __half *)row.v + layer_off + (size_t)kvh * hd;
    const float *qr = q + ((size_t)r * n_head + (size_t)kvh * g) * hd;

    for (int i = threadIdx.x; i < g * hd; i += blockDim.x)
        qs[i / hd][i % hd] = qr[i] * scale;
    __syncthreads();

    float m[GM], l[GM], acc[GM][NI];
#pragma unroll
    for (int h = 0; h < GM; h++) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
#pragma unroll
        for (int i = 0; i < NI; i++)
            acc[h][i] = 0.0f;
    }

    const int n_tiles = (row.n_kv + 31) / 32;
    const int last = row.n_kv - 1;
    for (int tile = warp; tile < n_tiles; tile += CUDA_ATTN_WARPS) {
        int j0 = tile * 32, j = j0 + lane;
        bool seen = j < row.n_kv && row.pos[j] <= row.q_pos;
        if (!__any_sync(0xffffffffu, seen))
            continue;
        float sc[GM];
#pragma unroll
        for (int h = 0; h < GM; h++)
            sc[h] = 0.0f;
        if (seen) {
            const uint4 *kj = (const uint4 *)(K + (size_t)j * kv_dim);
            for (int c = 0; c < hd / 8; c++) {
                uint4 u = kj[c];
                const __half2 *h2 = (const __half2 *)&u;
                float f[8];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float2 t = __half22float2(h2[e]);
                    f[2 * e] = t.x;
                    f[2 * e + 1] = t.y;
                }
#pragma unroll
                for (int h = 0; h < GM; h++)
                    if (h < g)
#pragma unroll
                        for (int e = 0; e < 8; e++)
                            sc[h] += qs[h][c * 8 + e] * f[e];
            }
        }
#pragma unroll
        for (int h = 0; h < GM; h++) {
            if (h >= g)
                break;
            float s = seen ? sc[h] : -INFINITY;
            float m_new = fmaxf(m[h], cuda_warp_max(s));
            float corr = expf(m[h] - m_new);
            float p = seen ? expf(s - m_new) : 0.0f;
            l[h] = l[h] * corr + cuda_warp_sum(p);
#pragma unroll
            for (int i = 0; i < NI; i++)
                acc[h][i] *= corr;
            m[h] = m_new;
            warp_p[warp][h][lane] = p;
        }
        __syncwarp();
        constexpr int U = 4;
        for (int jj = 0; jj < 32; jj += U) {
            float vv[U][NI];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const __half *vj = V + (size_t)min(j0 + jj + u, last) * kv_dim;
#pragma unroll
                for (int i = 0; i < NI; i++) {
                    int d = lane + 32 * i;
                    vv[u][i] = d < hd ? __half2float(vj[d]) : 0.0f;
                }
            }
#pragma unroll
            for (int h = 0; h < GM; h++)
                if (h < g)
#pragma unroll
                    for (int u = 0; u < U; u++) {
                        float pj = warp_p[warp][h][jj + u];
#pragma unroll
                        for (int i = 0; i < NI; i++)
                            acc[h][i] += pj * vv[u][i];
                    }
        }
        __syncwarp();
    }

#pragma unroll
    for (int h = 0; h < GM; h++) {
        if (lane == 0) {
            warp_m[warp][h] = m[h];
            warp_l[warp][h] = l[h];
        }
#pragma unroll
        for (int i = 0; i < NI; i++)
            warp_acc[warp][h][lane + 32 * i] = acc[h][i];
    }
    __syncthreads();
    if (threadIdx.x < g) {
        int h = threadIdx.x;
        float m_all = -INFINITY, l_all = 0.0f;
        for (int w = 0; w < CUDA_ATTN_WARPS; w++)
            m_all = fmaxf(m_all, warp_m[w][h]);
        for (int w = 0; w < CUDA_ATTN_WARPS; w++)
            if (warp_l[w][h] > 0.0f)
                l_all += warp_l[w][h] * expf(warp_m[w][h] - m_all);
        fin_m[h] = m_all;
        fin_l[h] = l_all;
    }
    __syncthreads();
    float *o = out + ((size_t)r * n_head + (size_t)kvh * g) * hd;
    for (int i = threadIdx.x; i < g * hd; i += blockDim.x) {
        int h = i / hd, d = i % hd;
        float sum = 0.0f;
        for (int w = 0; w < CUDA_ATTN_WARPS; w++)
            if (warp_l[w][h] > 0.0f)
                sum += warp_acc[w][h][d] * expf(warp_m[w][h] - fin_m[h]);
        o[i] = sum / fin_l[h];
    }
    /* the probabilities again, from the scores and each head's final max and sum */
    if (row.recv)
        for (int tile = warp; tile < n_tiles; tile += CUDA_ATTN_WARPS) {
            int j = tile * 32 + lane;
            float got = 0.0f;
            for (int h = 0; h < g; h++) {
                float s = cuda_attn_score(qs[h], K, row, j, hd, kv_dim);
                if (s != -INFINITY)
                    got += expf(s - fin_m[h]) / fin_l[h];
            }
            if (got > 0.0f)
                atomicAdd(row.recv + j, got);
        }
}

template <int NI>
static void cuda_attention_group(dim3 grid, int g, const float *q, const cuda_row *rows,
                                 int n_head, int n_head_kv, int hd, size_t layer_off,
                                 float scale, float *out, cudaStream_t s)
{
    dim3 block(32 * CUDA_ATTN_WARPS);
    if (g <= 2)
        cuda_attention_group_kernel<NI, 2><<<grid, block, 0, s>>>(q, rows, n_head, n_head_kv,
                                                                  hd, layer_off, scale, out);
    else if (g <= 4)
        cuda_attention_group_kernel<NI, 4><<<grid, block, 0, s>>>(q, rows, n_head, n_head_kv,
                                                                  hd, layer_off, scale, out);
    else
        cuda_attention_group_kernel<NI, 8><<<grid, block, 0, s>>>(q, rows, n_head, n_head_kv,
                                                                  hd, layer_off, scale, out);
}

cudaError_t cuda_attention(const float *q, const cuda_row *rows, int n, int n_head,
                           int n_head_kv, int hd, size_t layer_off, float scale, float *out,
                           cudaStream_t s)
{
    if (hd <= 0 || hd % 8 || hd > CUDA_ATTN_MAX_HEAD_DIM || n_head % n_head_kv)
        return cudaErrorInvalidValue;
    /* the grouped kernel where its blocks still fill the GPU (prefill, wide steps); a
     * decode of a few rows keeps a block per head */
    int g = n_head / n_head_kv;
    if (hd <= 128 && g > 1 && g <= 8 && (size_t)n * n_head_kv >= CUDA_ATTN_GROUP_MIN_BLOCKS) {
        dim3 grid((unsigned)n_head_kv, (unsigned)n);
        switch ((hd + 31) / 32) {
        case 1:
            cuda_attention_group<1>(grid, g, q, rows, n_head, n_head_kv, hd, layer_off, scale,
                                    out, s);
            break;
        case 2:
            cuda_attention_group<2>(grid, g, q, rows, n_head, n_head_kv, hd, layer_off, scale,
                                    out, s);
            break;
        case 3:
            cuda_attention_group<3>(grid, g, q, rows, n_head, n_head_kv, hd, layer_off, scale,
                                    out, s);
            break;
        default:
            cuda_attention_group<4>(grid, g, q, rows, n_head, n_head_kv, hd, layer_off, scale,
                                    out, s);
            break;
        }
        return cudaGetLastError();
    }
    dim3 grid((unsigned)n_head, (unsigned)n), block(32 * CUDA_ATTN_WARPS);
    switch ((hd + 31) / 32) {
    case 1:
        cuda_attention_kernel<1><<<grid, block, 0, s>>>(q, rows, n_head, n_head_kv, hd,
                                                        layer_off, scale, out);
        break;
    case 2:
        cuda_attention_kernel<2><<<grid, block, 0, s>>>(q, rows, n_head, n_head_kv, hd,
                                                        layer_off, scale, out);
        break;
    case 3:
        cuda_attention_kernel<3><<<grid, block, 0, s>>>(q, rows, n_head, n_head_kv, hd,
                                                        layer_off, scale, out);
        break;
    case 4:
        cuda_attention_kernel<4><<<grid, block, 0, s>>>(q, rows, n_head, n_head_kv, hd,
                                                        layer_off, scale, out);
        break;
    default:
        cuda_attention_kernel<8><<<grid, block, 0, s>>>(q, rows, n_head, n_head_kv, hd,
                                                        layer_off, scale, out);
        break;
    }
    return cudaGetLastError();
}

__global__ static void cuda_swiglu_kernel(float *gate, const float *up, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

cudaError_t cuda_swiglu(float *gate, const float *up, size_t n, cudaStream_t s)
{
    cuda_swiglu_kernel<<<cuda_blocks(n, 256), 256, 0, s>>>(gate, up, n);
    return cudaGetLastError();
}

__global__ static void cuda_f32_to_half_kernel(const float *src, uint16_t *dst, size_t n,
                                               bool bf16)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        dst[i] = bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(src[i]))
                      : __half_as_ushort(__float2half_rn(src[i]));
}

cudaError_t cuda_f32_to_half(const float *src, uint16_t *dst, size_t n, bool bf16,
                             cudaStream_t s)
{
    cuda_f32_to_half_kernel<<<cuda_blocks(n, 256), 256, 0, s>>>(src, dst, n, bf16);
    return cudaGetLastError();
}

__global__ static void cuda_gather_rows_kernel(const float *src, const int32_t *idx,
                                               int n_idx, int dim, float *dst)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n_idx * dim)
        return;
    size_t r = i / dim;
    dst[i] = src[(size_t)idx[r] * dim + i % dim];
}

cudaError_t cuda_gather_rows(const float *src, const int32_t *idx, int n_idx, int dim,
                             float *dst, cudaStream_t s)
{
    size_t total = (size_t)n_idx * dim;
    cuda_gather_rows_kernel<<<cuda_blocks(total, 256), 256, 0, s>>>(src, idx, n_idx, dim, dst);
    return cudaGetLastError();
}

__global__ static void cuda_argmax_kernel(const float *x, int n_cols, int32_t *out)
{
    __shared__ float best_v[32];
    __shared__ int best_i[32];
    const float *xr = x + (size_t)blockIdx.x * n_cols;
    float v = -INFINITY;
    int idx = 0;
    for (int i = threadIdx.x; i < n_cols; i += blockDim.x)
        if (xr[i] > v) {
            v = xr[i];
            idx = i;
        }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, v, o);
        int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (ov > v || (ov == v && oi < idx)) {
            v = ov;
            idx = oi;
        }
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        best_v[warp] = v;
        best_i[warp] = idx;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++)
            if (best_v[w] > v || (best_v[w] == v && best_i[w] < idx)) {
                v = best_v[w];
                idx = best_i[w];
            }
        out[blockIdx.x] = idx;
    }
}

cudaError_t cuda_argmax(const float *x, int n, int n_cols, int32_t *out, cudaStream_t s)
{
    cuda_argmax_kernel<<<n, 256, 0, s>>>(x, n_cols, out);
    return cudaGetLastError();
}

/* A grid-stride loop, four independent 16-byte loads in flight per thread. */
__global__ static void cuda_read_all_kernel(const uint4 *src, size_t n, unsigned long long *sink)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    unsigned acc = 0;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        uint4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
        acc ^= a.x ^ a.w ^ b.y ^ b.z ^ c.x ^ c.w ^ d.y ^ d.z;
    }
    for (; i < n; i += stride)
        acc ^= src[i].x;
    if (acc == 0x9e3779b9u)
        atomicAdd(sink, 1ull);
}

cudaError_t cuda_read_all(const void *src, size_t n16, unsigned long long *sink,
                          cudaStream_t s)
{
    int device = 0, n_sm = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, device);
    cuda_read_all_kernel<<<n_sm * 8, 512, 0, s>>>((const uint4 *)src, n16, sink);
    return cudaGetLastError();
}
