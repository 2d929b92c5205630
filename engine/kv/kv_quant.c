/*
 * kv_quant.c — asymmetric integer codes for a chunk's (layer, head) blocks of K and V.
 */
#include "engine/kv/kv_quant.h"

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#include "engine/kv/kv.h"
#include "engine/kv/kv_quant_avx2.h"
#include "engine/quant/quant.h"

#define KV_GRID_U16 4   /* min0, min_step, scale_step, unused: a grid's f16 values */
#define KV_PARAM_TOP 255 /* largest 8-bit (min, scale) code */

size_t kv_quant_row_bytes(int head_dim, int bits)
{
    return ((size_t)head_dim * bits + 7) / 8;
}

static int kv_quant_groups(int head_dim)
{
    return (head_dim + KV_QUANT_V_GROUP - 1) / KV_QUANT_V_GROUP;
}

/* Where the parts of a block start (layout in kv_quant.h). */
typedef struct kv_block_layout {
    size_t k_row, v_row;  /* bytes of one row of K / V codes */
    size_t v_codes;       /* offset of V's codes */
    size_t k_grid, k_par; /* offsets of K's grid and (channel, 2) codes */
    size_t v_grid, v_par; /* offsets of V's grid and (token, group, 2) codes */
    size_t bytes;
} kv_block_layout;

/* Groups with their own V (min, scale) codes in a block. */
static int kv_v_params(int head_dim, bool v_block)
{
    return v_block ? 1 : KV_CHUNK_TOKENS * kv_quant_groups(head_dim);
}

static kv_block_layout kv_layout(int head_dim, kv_quant_format f)
{
    kv_block_layout l;
    l.k_row = kv_quant_row_bytes(head_dim, f.k_bits);
    l.v_row = kv_quant_row_bytes(head_dim, f.v_bits);
    l.v_codes = KV_CHUNK_TOKENS * l.k_row;
    l.k_grid = l.v_codes + KV_CHUNK_TOKENS * l.v_row;
    l.k_par = l.k_grid + KV_GRID_U16 * sizeof(uint16_t);
    l.v_grid = l.k_par + 2 * (size_t)head_dim;
    l.v_par = l.v_grid + KV_GRID_U16 * sizeof(uint16_t);
    l.bytes = f.v_bits ? l.v_par + 2 * (size_t)kv_v_params(head_dim, f.v_block) : l.v_grid;
    return l;
}

size_t kv_quant_block_bytes(int head_dim, kv_quant_format f)
{
    return kv_layout(head_dim, f).bytes;
}

/* The f16 nearest x from below / from above (x finite). */
static uint16_t f16_down(float x)
{
    uint16_t h = quant_f32_to_f16(x);
    if (quant_f16_to_f32(h) > x)
        h = (h & 0x8000) ? (uint16_t)(h + 1) : h == 0 ? 0x8001 : (uint16_t)(h - 1);
    return h;
}

static uint16_t f16_up(float x)
{
    uint16_t h = quant_f32_to_f16(x);
    if (quant_f16_to_f32(h) < x)
        h = (h & 0x8000) ? (h == 0x8000 ? 1 : (uint16_t)(h - 1)) : (uint16_t)(h + 1);
    return h;
}

static unsigned kv_clamp_code(float c, int top)
{
    return !(c > 0) ? 0 : c >= (float)top ? (unsigned)top : (unsigned)c;
}

/*
 * Puts n groups' (lo, hi) ranges on one grid: grid gets (min0, min_step, scale_step),
 * par the (min, scale) codes of each group, min and scale the values they decode to.
 */
static void kv_grid_fit(const float *lo, const float *hi, int n, int top, uint16_t *grid,
                        uint8_t *par, float *min, float *scale)
{
    float lo_min = lo[0], lo_max = lo[0];
    for (int g = 1; g < n; g++) {
        lo_min = lo[g] < lo_min ? lo[g] : lo_min;
        lo_max = lo[g] > lo_max ? lo[g] : lo_max;
    }
    grid[0] = f16_down(lo_min);
    float min0 = quant_f16_to_f32(grid[0]);
    grid[1] = lo_max > min0 ? f16_up((lo_max - min0) / KV_PARAM_TOP) : 0;
    float min_step = quant_f16_to_f32(grid[1]), need_max = 0;
    for (int g = 0; g < n; g++) {
        unsigned c = min_step > 0 ? kv_clamp_code(floorf((lo[g] - min0) / min_step),
                                                  KV_PARAM_TOP) : 0;
        par[2 * g] = (uint8_t)c;
        min[g] = min0 + (float)c * min_step;
        float need = (hi[g] - min[g]) / (float)top;
        need_max = need > need_max ? need : need_max;
    }
    grid[2] = need_max > 0 ? f16_up(need_max / KV_PARAM_TOP) : 0;
    grid[3] = 0;
    float scale_step = quant_f16_to_f32(grid[2]);
    for (int g = 0; g < n; g++) {
        float need = (hi[g] - min[g]) / (float)top;
        unsigned c = scale_step > 0 ? kv_clamp_code(ceilf(need / scale_step), KV_PARAM_TOP) : 0;
        par[2 * g + 1] = (uint8_t)c;
        scale[g] = (float)c * scale_step;
    }
}

/* The (min, scale) values of n groups from their grid and codes, as kv_grid_fit made them. */
static void kv_grid_values(const uint8_t *grid_bytes, const uint8_t *par, int n, float *min,
                           float *scale)
{
    uint16_t grid[KV_GRID_U16];
    memcpy(grid, grid_bytes, sizeof grid);
    float min0 = quant_f16_to_f32(grid[0]), min_step = quant_f16_to_f32(grid[1]);
    float scale_step = quant_f16_to_f32(grid[2]);
    for (int g = 0; g < n; g++) {
        min[g] = min0 + (float)par[2 * g] * min_step;
        scale[g] = (float)par[2 * g + 1] * scale_step;
    }
}

static void kv_quant_put(uint8_t *row, int j, int bits, unsigned code)
{
    int bit = j * bits, shift = bit % 8;
    row[bit / 8] |= (uint8_t)(code << shift);
    if (shift + bits > 8)
        row[bit / 8 + 1] |= (uint8_t)(code >> (8 - shift));
}

static unsigned kv_quant_get(const uint8_t *row, int j, int bits)
{
    int bit = j * bits, shift = bit % 8;
    unsigned w = row[bit / 8];
    if (shift + bits > 8)
        w |= (unsigned)row[bit / 8 + 1] << 8;
    return (w >> shift) & ((1u << bits) - 1);
}

static unsigned kv_quant_code(float x, float scale, float min, int top)
{
    return scale > 0 ? kv_clamp_code(nearbyintf((x - min) / scale), top) : 0;
}

void kv_quant_encode(uint8_t *dst, int head_dim, kv_quant_format f, int n_tokens,
                     const float *k, const float *v)
{
    kv_block_layout l = kv_layout(head_dim, f);
    int k_bits = f.k_bits, v_bits = f.v_bits;
    memset(dst, 0, l.bytes);
    if (n_tokens <= 0)
        return;
    float lo[KV_CHUNK_TOKENS * KV_MAX_HEAD_DIM / KV_QUANT_V_GROUP + KV_MAX_HEAD_DIM];
    float hi[sizeof lo / sizeof lo[0]], min[sizeof lo / sizeof lo[0]];
    float scale[sizeof lo / sizeof lo[0]];
    uint16_t grid[KV_GRID_U16];

    int top = (1 << k_bits) - 1;
    for (int j = 0; j < head_dim; j++) {
        lo[j] = hi[j] = k[j];
        for (int i = 1; i < n_tokens; i++) {
            float x = k[(size_t)i * head_dim + j];
            lo[j] = x < lo[j] ? x : lo[j];
            hi[j] = x > hi[j] ? x : hi[j];
        }
    }
    kv_grid_fit(lo, hi, head_dim, top, grid, dst + l.k_par, min, scale);
    memcpy(dst + l.k_grid, grid, sizeof grid);
    for (int i = 0; i < n_tokens; i++)
        for (int j = 0; j < head_dim; j++)
            kv_quant_put(dst + i * l.k_row, j, k_bits,
                         kv_quant_code(k[(size_t)i * head_dim + j], scale[j], min[j], top));

    if (!v_bits)
        return;
    /* V's group of element (i, j) is p = i * ng + j / KV_QUANT_V_GROUP, or 0 for the
     * block layout (ng 0) */
    int ng = f.v_block ? 0 : kv_quant_groups(head_dim);
    top = (1 << v_bits) - 1;
    for (int i = 0; i < n_tokens; i++)
        for (int j = 0; j < head_dim; j++) {
            int p = i * ng + (ng ? j / KV_QUANT_V_GROUP : 0);
            float x = v[(size_t)i * head_dim + j];
            bool first = f.v_block ? i == 0 && j == 0 : j % KV_QUANT_V_GROUP == 0;
            lo[p] = first || x < lo[p] ? x : lo[p];
            hi[p] = first || x > hi[p] ? x : hi[p];
        }
    kv_grid_fit(lo, hi, ng ? n_tokens * ng : 1, top, grid, dst + l.v_par, min, scale);
    memcpy(dst + l.v_grid, grid, sizeof grid);
    for (int i = 0; i < n_tokens; i++)
        for (int j = 0; j < head_dim; j++) {
            int p = i * ng + (ng ? j / KV_QUANT_V_GROUP : 0);
            kv_quant_put(dst + l.v_codes + i * l.v_row, j, v_bits,
                         kv_quant_code(v[(size_t)i * head_dim + j], scale[p], min[p], top));
        }
}

/* V's (min, scale) per (token, group) of the first n_tokens rows, (n_tokens, n_groups),
 * for either layout: the block layout's one pair repeated. */
static void kv_v_values(const uint8_t *src, kv_block_layout l, int head_dim, bool v_block,
                        int n_tokens, float *min, float *scale)
{
    int n = n_tokens * kv_quant_groups(head_dim);
    kv_grid_values(src + l.v_grid, src + l.v_par, v_block ? (n > 0) : n, min, scale);
    for (int p = 1; v_block && p < n; p++) {
        min[p] = min[0];
        scale[p] = scale[0];
    }
}

void kv_quant_decode_scalar(const uint8_t *src, int head_dim, kv_quant_format f,
                            int n_tokens, float *k, float *v)
{
    kv_block_layout l = kv_layout(head_dim, f);
    int k_bits = f.k_bits, v_bits = f.v_bits;
    float min[KV_CHUNK_TOKENS * KV_MAX_HEAD_DIM / KV_QUANT_V_GROUP + KV_MAX_HEAD_DIM];
    float scale[sizeof min / sizeof min[0]];
    if (k) {
        kv_grid_values(src + l.k_grid, src + l.k_par, head_dim, min, scale);
        for (int i = 0; i < n_tokens; i++)
            for (int j = 0; j < head_dim; j++)
                k[(size_t)i * head_dim + j] =
                    fmaf(scale[j], (float)kv_quant_get(src + i * l.k_row, j, k_bits), min[j]);
    }
    if (v && v_bits) {
        int ng = kv_quant_groups(head_dim);
        kv_v_values(src, l, head_dim, f.v_block, n_tokens, min, scale);
        for (int i = 0; i < n_tokens; i++)
            for (int j = 0; j < head_dim; j++) {
                int p = i * ng + j / KV_QUANT_V_GROUP;
                unsigned c = kv_quant_get(src + l.v_codes + i * l.v_row, j, v_bits);
                v[(size_t)i * head_dim + j] = fmaf(scale[p], (float)c, min[p]);
            }
    }
}

static pthread_once_t kv_quant_once = PTHREAD_ONCE_INIT;
static bool kv_quant_avx2;

/* The AVX2 decoder runs where the quant module's AVX2 kernels do: same CPU check, and
 * LLMS_NO_SIMD turns both off. */
static void kv_quant_detect(void)
{
    kv_quant_avx2 = strcmp(quant_simd_name(), "avx2") == 0;
}

void kv_quant_decode(const uint8_t *src, int head_dim, kv_quant_format f, int n_tokens,
                     float *k, float *v)
{
#if defined(__x86_64__)
    pthread_once(&kv_quant_once, kv_quant_detect);
    if (kv_quant_avx2) {
        kv_block_layout l = kv_layout(head_dim, f);
        float min[KV_CHUNK_TOKENS * KV_MAX_HEAD_DIM / KV_QUANT_V_GROUP + KV_MAX_HEAD_DIM];
        float scale[sizeof min / sizeof min[0]];
        if (k) {
            kv_grid_values(src + l.k_grid, src + l.k_par, head_dim, min, scale);
            kv_quant_avx2_decode_k(src, l.k_row, min, scale, head_dim, f.k_bits, n_tokens, k);
        }
        if (v && f.v_bits) {
            kv_v_values(src, l, head_dim, f.v_block, n_tokens, min, scale);
            kv_quant_avx2_decode_v(src + l.v_codes, l.v_row, min, scale, head_dim, f.v_bits,
                                   n_tokens, v);
        }
        return;
    }
#endif
    kv_quant_decode_scalar(src, head_dim, f, n_tokens, k, v);
}
