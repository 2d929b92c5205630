/*
 * Compressed KV chunks: round trips at each precision, conversions, reads, the pool's
 * byte accounting and reuse, and the tolerance-aware precision assignment.
 *
 * Error bound checked on every element: asymmetric codes of b bits over a group whose
 * values span [lo, hi] reconstruct within half a step, (hi - lo) / (2^b - 1) / 2. The
 * group's min sits on the block's grid at most one grid step (the block's span S / 255)
 * below lo, and its scale at most one scale step (S / (2^b - 1) / 255) above what it
 * needs, so half a step grows by at most S / (2^b - 1) / 255; plus the f16 rounding of
 * the grid: the bound used is 0.5 step + S / (2^b - 1) / 255 + 1e-3 (hi - lo).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kv/kv.h"
#include "engine/kv/kv_quant.h"
#include "engine/quant/quant.h"
#include "tests/support/test.h"

/* head_dim 80: V groups of 32, 32 and 16 */
static const kv_shape SHAPE = {.n_layer = 3, .n_head_kv = 2, .head_dim = 80};
#define HD 80
#define BLK (KV_CHUNK_TOKENS * HD)

static uint64_t rng_state = 42;

static float frand(void) /* uniform in [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((rng_state >> 40) / (double)(1 << 24)) * 2 - 1;
}

/* A chunk of n random entries: K channels of different scales (channel 5 an outlier, as
 * real keys have), V rows of different scales. */
static kv_chunk *random_chunk(kv_pool *p, int n)
{
    char err[ERR_MAX];
    kv_chunk *c = kv_chunk_new(p, err);
    if (!c)
        return NULL;
    c->n_tokens = n;
    for (int i = 0; i < n; i++)
        c->tokens[i] = i, c->positions[i] = i;
    for (int l = 0; l < SHAPE.n_layer; l++)
        for (int h = 0; h < SHAPE.n_head_kv; h++) {
            uint16_t *k = kv_chunk_k_f16(c, SHAPE, l, h), *v = kv_chunk_v_f16(c, SHAPE, l, h);
            memset(k, 0, BLK * 2);
            memset(v, 0, BLK * 2);
            for (int i = 0; i < n; i++)
                for (int j = 0; j < HD; j++) {
                    float ks = j == 5 ? 20.0f : 1.0f + (float)(j % 7), vs = 0.5f + (float)(i % 3);
                    k[i * HD + j] = quant_f32_to_f16(ks * frand());
                    v[i * HD + j] = quant_f32_to_f16(vs * frand());
                }
        }
    return c;
}

/* Largest |got - want| over the block divided by the bound of the element's group, for
 * the first n rows (K: channel over tokens; V: KV_QUANT_V_GROUP elements of a token, or
 * with v_block the whole block). */
static double worst_over_bound(const float *want, const float *got, int n, int bits, bool is_k,
                               bool v_block)
{
    int top = (1 << bits) - 1;
    double worst = 0;
    float all_lo = 1e30f, all_hi = -1e30f;
    for (int i = 0; i < n * HD; i++)
        all_lo = want[i] < all_lo ? want[i] : all_lo, all_hi = want[i] > all_hi ? want[i] : all_hi;
    double grid = (all_hi - all_lo) / top / 255.0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < HD; j++) {
            float lo = 1e30f, hi = -1e30f;
            if (is_k) {
                for (int t = 0; t < n; t++) {
                    float x = want[t * HD + j];
                    lo = x < lo ? x : lo, hi = x > hi ? x : hi;
                }
            } else if (v_block) {
                lo = all_lo, hi = all_hi;
            } else {
                int j0 = j / KV_QUANT_V_GROUP * KV_QUANT_V_GROUP;
                for (int e = j0; e < j0 + KV_QUANT_V_GROUP && e < HD; e++) {
                    float x = want[i * HD + e];
                    lo = x < lo ? x : lo, hi = x > hi ? x : hi;
                }
            }
            double bound = 0.5 * (hi - lo) / top + grid + 1e-3 * (hi - lo) + 1e-6;
            double r = fabs((double)got[i * HD + j] - want[i * HD + j]) / bound;
            worst = r > worst ? r : worst;
        }
    return worst;
}

static void test_round_trip_bounds(void)
{
    char err[ERR_MAX];
    kv_pool *p = kv_pool_new(SHAPE, 0, err);
    CHECK(p);
    static float k1[BLK], v1[BLK];
    for (int prec = KV_INT_FIRST; prec < KV_PRECISION_END; prec++)
        for (int n = 1; n <= KV_CHUNK_TOKENS; n += 5) {
            kv_chunk *c = random_chunk(p, n);
            CHECK(c);
            static float k_ref[3][2][BLK], v_ref[3][2][BLK];
            for (int l = 0; l < SHAPE.n_layer; l++)
                for (int h = 0; h < SHAPE.n_head_kv; h++)
                    kv_chunk_read_f32(c, SHAPE, l, h, k_ref[l][h], v_ref[l][h]);
            CHECK_EQ(kv_chunk_convert(p, c, prec, err), 0);
            CHECK_EQ(c->precision, prec);
            CHECK_EQ(c->n_tokens, n);
            double wk = 0, wv = 0, rms = 0;
            for (int l = 0; l < SHAPE.n_layer; l++)
                for (int h = 0; h < SHAPE.n_head_kv; h++) {
                    kv_chunk_read_f32(c, SHAPE, l, h, k1, v1);
                    double a = worst_over_bound(k_ref[l][h], k1, n, kv_precision_k_bits(prec), true,
                                                false);
                    double b = worst_over_bound(v_ref[l][h], v1, n, kv_precision_v_bits(prec),
                                                false, kv_precision_v_block(prec));
                    wk = a > wk ? a : wk;
                    wv = b > wv ? b : wv;
                    for (int i = 0; i < n * HD; i++)
                        rms += (double)(v1[i] - v_ref[l][h][i]) * (v1[i] - v_ref[l][h][i]);
                }
            CHECK_MSG(wk <= 1 && wv <= 1, "%s n=%d: error / bound K %.3f V %.3f",
                      kv_precision_name(prec), n, wk, wv);
            if (n == KV_CHUNK_TOKENS && kv_precision_k_bits(prec) == kv_precision_v_bits(prec))
                printf("  %s: worst error / bound K %.2f V %.2f, V rms error %.4f\n",
                       kv_precision_name(prec), wk, wv,
                       sqrt(rms / (SHAPE.n_layer * SHAPE.n_head_kv * n * HD)));
            kv_chunk_free(p, c);
        }
    kv_pool_free(p);
}

/* Either output of read_f32 may be skipped; reading an f16 chunk gives its stored data. */
static void test_reads_agree(void)
{
    char err[ERR_MAX];
    kv_pool *p = kv_pool_new(SHAPE, 0, err);
    static float kf[BLK], vf[BLK], k1[BLK], v1[BLK];
    const int precs[] = {KV_F16, KV_INT8, KV_INT4, KV_INT2, kv_precision_of(5, 3),
                         kv_precision_of(3, 6)};
    for (size_t pi = 0; pi < sizeof precs / sizeof precs[0]; pi++) {
        int prec = precs[pi];
        kv_chunk *c = random_chunk(p, 13);
        CHECK(c);
        uint16_t stored_k[BLK];
        memcpy(stored_k, kv_chunk_k_f16(c, SHAPE, 2, 1), sizeof stored_k);
        CHECK_EQ(kv_chunk_convert(p, c, prec, err), 0);
        for (int l = 0; l < SHAPE.n_layer; l++)
            for (int h = 0; h < SHAPE.n_head_kv; h++) {
                kv_chunk_read_f32(c, SHAPE, l, h, kf, vf);
                memset(k1, 0, sizeof k1);
                memset(v1, 0, sizeof v1);
                kv_chunk_read_f32(c, SHAPE, l, h, k1, NULL);
                kv_chunk_read_f32(c, SHAPE, l, h, NULL, v1);
                CHECK(memcmp(kf, k1, 13 * HD * sizeof(float)) == 0);
                CHECK(memcmp(vf, v1, 13 * HD * sizeof(float)) == 0);
            }
        if (prec == KV_F16) {
            kv_chunk_read_f32(c, SHAPE, 2, 1, kf, NULL);
            for (int i = 0; i < 13 * HD; i++)
                CHECK(quant_f32_to_f16(kf[i]) == stored_k[i]);
        }
        kv_chunk_free(p, c);
    }
    kv_pool_free(p);
}

static void test_conversions(void)
{
    char err[ERR_MAX];
    kv_pool *p = kv_pool_new(SHAPE, 0, err);
    static float k8[BLK], v8[BLK], k[BLK], v[BLK], kd[BLK], vd[BLK];
    kv_chunk *c = random_chunk(p, 11);
    kv_chunk *d = random_chunk(p, 11);
    CHECK(c && d);
    /* same data in both */
    memcpy(d->data, c->data, kv_chunk_data_bytes(SHAPE, KV_F16));
    int32_t tok5 = c->tokens[5];

    /* F16 -> INT8 -> F16: f16 data equals the int8 values rounded, unused rows zero */
    CHECK_EQ(kv_chunk_convert(p, c, KV_INT8, err), 0);
    kv_chunk_read_f32(c, SHAPE, 1, 1, k8, v8);
    CHECK_EQ(kv_chunk_convert(p, c, KV_F16, err), 0);
    CHECK_EQ(c->precision, KV_F16);
    CHECK_EQ(c->tokens[5], tok5);
    uint16_t *kh = kv_chunk_k_f16(c, SHAPE, 1, 1), *vh = kv_chunk_v_f16(c, SHAPE, 1, 1);
    for (int i = 0; i < 11 * HD; i++)
        CHECK(kh[i] == quant_f32_to_f16(k8[i]) && vh[i] == quant_f32_to_f16(v8[i]));
    for (int i = 11 * HD; i < BLK; i++)
        CHECK(kh[i] == 0 && vh[i] == 0);
    /* same precision: nothing changes */
    uint8_t *before = c->data;
    CHECK_EQ(kv_chunk_convert(p, c, KV_F16, err), 0);
    CHECK(c->data == before);
    CHECK_EQ(kv_chunk_convert(p, c, (enum kv_precision)2, err), -1); /* earlier layout */
    CHECK_EQ(kv_chunk_convert(p, c, (enum kv_precision)KV_PRECISION_END, err), -1);

    /* INT8 -> INT4 (through f32) is close to F16 -> INT4 directly */
    CHECK_EQ(kv_chunk_convert(p, c, KV_INT8, err), 0);
    CHECK_EQ(kv_chunk_convert(p, c, KV_INT4, err), 0);
    CHECK_EQ(kv_chunk_convert(p, d, KV_INT4, err), 0);
    kv_chunk_read_f32(c, SHAPE, 2, 0, k, v);
    kv_chunk_read_f32(d, SHAPE, 2, 0, kd, vd);
    double worst = 0, step_k = 2 * 20.0 / 15; /* widest K channel spans <= 40 */
    for (int i = 0; i < 11 * HD; i++) {
        double e = fabs(k[i] - kd[i]);
        worst = e > worst ? e : worst;
    }
    CHECK(worst <= step_k * 1.01);
    /* INT4 -> INT2 -> INT8 keeps sizes and precision right */
    CHECK_EQ(kv_chunk_convert(p, d, KV_INT2, err), 0);
    CHECK_EQ(kv_chunk_convert(p, d, KV_INT8, err), 0);
    CHECK_EQ(d->precision, KV_INT8);
    CHECK_EQ(kv_pool_bytes_used(p), kv_chunk_data_bytes(SHAPE, KV_INT4) +
                                        kv_chunk_data_bytes(SHAPE, KV_INT8));
    kv_chunk_free(p, c);
    kv_chunk_free(p, d);
    kv_pool_free(p);
}

static void test_pool_bytes_and_reuse(void)
{
    char err[ERR_MAX];
    /* layer bytes: per head, 16 rows of K codes and of V codes, two grids of 4 halves,
     * 8-bit (min, scale) codes per K channel and per V (token, group of 32): head_dim 80
     * has 3 groups; in the V block layout one V pair */
    for (int prec = KV_INT_FIRST; prec < KV_PRECISION_END; prec++) {
        size_t head = KV_CHUNK_TOKENS * ((HD * kv_precision_k_bits(prec) + 7) / 8 +
                                         (HD * kv_precision_v_bits(prec) + 7) / 8) +
                      2 * 8 + 2 * HD +
                      2 * (kv_precision_v_block(prec) ? 1 : KV_CHUNK_TOKENS * 3);
        CHECK_EQ(kv_chunk_layer_bytes(SHAPE, prec), 2 * head);
    }
    CHECK_EQ(kv_precision_of(4, 4), KV_INT4);
    CHECK_EQ(kv_precision_of(7, 4), -1);
    CHECK_EQ(kv_precision_k_bits(kv_precision_of(6, 3)), 6);
    CHECK_EQ(kv_precision_v_bits(kv_precision_of(6, 3)), 3);
    CHECK(strcmp(kv_precision_name(kv_precision_of(6, 3)), "k6v3") == 0);
    int k4v5b = kv_precision_layout_of(4, 5, true);
    CHECK(k4v5b >= KV_VBLOCK_FIRST && kv_precision_v_block(k4v5b) &&
          !kv_precision_v_block(kv_precision_of(4, 5)));
    CHECK(kv_precision_k_bits(k4v5b) == 4 && kv_precision_v_bits(k4v5b) == 5);
    CHECK(strcmp(kv_precision_name(k4v5b), "k4v5b") == 0);
    CHECK(strcmp(kv_precision_name(KV_PRECISION_END - 1), "k8v8b") == 0);
    CHECK_EQ(kv_precision_layout_of(4, 5, false), kv_precision_of(4, 5));
    CHECK(!kv_precision_valid(1) && !kv_precision_valid(KV_PRECISION_END));
    CHECK(kv_chunk_data_bytes(SHAPE, KV_INT2) < kv_chunk_data_bytes(SHAPE, KV_INT4));
    CHECK(kv_chunk_data_bytes(SHAPE, KV_INT4) < kv_chunk_data_bytes(SHAPE, KV_INT8));
    CHECK(kv_chunk_data_bytes(SHAPE, KV_INT8) < kv_chunk_data_bytes(SHAPE, KV_F16));
    CHECK_EQ(kv_precision_bits(KV_INT4), 4);
    CHECK(strcmp(kv_precision_name(KV_INT2), "int2") == 0);

    kv_pool *p = kv_pool_new(SHAPE, 4, err);
    CHECK(p);
    CHECK_EQ(kv_pool_bytes_used(p), 0);
    /* two rounds of the same work: the second allocates nothing (every struct and data
     * buffer it gets is one the first round had) */
    void *seen[32];
    int n_seen = 0;
    for (int round = 0; round < 2; round++) {
        bool fresh = false;
#define TRACK(ptr)                                                    \
    do {                                                              \
        bool found = false;                                           \
        for (int j = 0; j < n_seen; j++)                              \
            found |= seen[j] == (void *)(ptr);                        \
        if (round == 0 && !found)                                     \
            seen[n_seen++] = (void *)(ptr);                           \
        fresh |= round == 1 && !found;                                \
    } while (0)
        kv_chunk *c[4];
        for (int i = 0; i < 3; i++) {
            CHECK((c[i] = random_chunk(p, 16)) != NULL);
            TRACK(c[i]);
            TRACK(c[i]->data);
        }
        c[3] = kv_chunk_new_precision(p, KV_INT2, err);
        CHECK(c[3]);
        TRACK(c[3]);
        TRACK(c[3]->data);
        CHECK_EQ(c[3]->precision, KV_INT2);
        CHECK_EQ(c[3]->n_tokens, 0);
        CHECK(kv_chunk_new(p, err) == NULL); /* the cap counts chunks of any precision */
        CHECK_EQ(kv_chunk_convert(p, c[0], KV_INT8, err), 0);
        TRACK(c[0]->data);
        CHECK_EQ(kv_chunk_convert(p, c[1], KV_INT4, err), 0);
        TRACK(c[1]->data);
        CHECK_EQ(kv_pool_bytes_used(p),
                 kv_chunk_data_bytes(SHAPE, KV_INT8) + kv_chunk_data_bytes(SHAPE, KV_INT4) +
                     kv_chunk_data_bytes(SHAPE, KV_F16) + kv_chunk_data_bytes(SHAPE, KV_INT2));
        CHECK_EQ(kv_chunk_convert(p, c[1], KV_F16, err), 0);
        TRACK(c[1]->data);
        CHECK_EQ(kv_pool_bytes_used(p),
                 kv_chunk_data_bytes(SHAPE, KV_INT8) + 2 * kv_chunk_data_bytes(SHAPE, KV_F16) +
                     kv_chunk_data_bytes(SHAPE, KV_INT2));
#undef TRACK
        CHECK_MSG(!fresh, "the warm round took new memory");
        for (int i = 0; i < 4; i++)
            kv_chunk_free(p, c[i]);
        CHECK_EQ(kv_pool_bytes_used(p), 0);
        CHECK_EQ(kv_pool_n_used(p), 0);
    }
    kv_pool_free(p);
}

/* A compressed partial last chunk is converted to f16 when entries are appended. */
static void test_reserve_converts_partial(void)
{
    char err[ERR_MAX];
    kv_pool *p = kv_pool_new(SHAPE, 0, err);
    kv_seq s;
    kv_seq_init(&s, p);
    kv_chunk *full = random_chunk(p, 16), *part = random_chunk(p, 9);
    CHECK(full && part);
    CHECK_EQ(kv_chunk_convert(p, full, KV_INT4, err), 0);
    CHECK_EQ(kv_chunk_convert(p, part, KV_INT8, err), 0);
    CHECK_EQ(kv_seq_push_chunk(&s, full, err), 0);
    CHECK_EQ(kv_seq_push_chunk(&s, part, err), 0);
    static float k8[9 * HD];
    kv_chunk_read_f32(part, SHAPE, 0, 0, k8, NULL);
    CHECK_EQ(kv_seq_reserve(&s, 3, err), 0);
    CHECK_EQ(part->precision, KV_F16);
    CHECK_EQ(full->precision, KV_INT4);
    CHECK_EQ(s.n_chunks, 2);
    CHECK(kv_chunk_k_f16(part, SHAPE, 0, 0)[8 * HD + 3] == quant_f32_to_f16(k8[8 * HD + 3]));
    kv_chunk *c;
    int idx;
    CHECK_EQ(kv_seq_append(&s, 7, 9, &c, &idx), 0);
    CHECK(c == part && idx == 9);

    /* NULL slots: count as full, are dropped whole by a cut inside them */
    CHECK_EQ(kv_seq_push_chunk(&s, NULL, err), 0);
    CHECK_EQ(kv_seq_n_tokens(&s), 16 + 10 + 16);
    kv_seq_truncate(&s, 30);
    CHECK_EQ(s.n_chunks, 2);
    CHECK_EQ(kv_seq_n_tokens(&s), 26);
    kv_seq_free(&s);
    CHECK_EQ(kv_pool_bytes_used(p), 0);
    kv_pool_free(p);
}

/* ---- vector decoding ---- */

/* Same bits, or both NaN (the two paths may carry different NaN payloads). */
static bool same_floats(const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof a[i]) != 0 && !(isnan(a[i]) && isnan(b[i])))
            return false;
    return true;
}

/* kv_quant_decode (AVX2 here) against kv_quant_decode_scalar for every width, head_dims
 * that are and are not multiples of 8, 16, 32, partial chunks, and blocks both encoded
 * from data and of random bytes (every code, and scales and mins that are subnormal,
 * infinite or NaN). Blocks are allocated to their exact size so ASan sees any over-read;
 * rows past n_tokens must stay untouched. */
static void test_avx2_decode_matches_scalar(void)
{
    if (strcmp(quant_simd_name(), "avx2") != 0)
        SKIP("AVX2 decoding not in use (CPU lacks AVX2/FMA/F16C or LLMS_NO_SIMD is set)");
    static const int dims[] = {8, 12, 20, 64, 72, 80, 128, 200};
    static const int lens[] = {1, 3, 8, 15, 16};
    enum { MAXD = 200 };
    static float k[KV_CHUNK_TOKENS * MAXD], v[KV_CHUNK_TOKENS * MAXD];
    static float ka[KV_CHUNK_TOKENS * MAXD + 1], va[KV_CHUNK_TOKENS * MAXD + 1];
    static float ks[KV_CHUNK_TOKENS * MAXD + 1], vs[KV_CHUNK_TOKENS * MAXD + 1];
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
        for (int prec = KV_INT_FIRST; prec < KV_PRECISION_END; prec++)
            for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
                for (int random_bytes = 0; random_bytes < 2; random_bytes++) {
                    int hd = dims[di], n = lens[li];
                    kv_quant_format f = {kv_precision_k_bits(prec), kv_precision_v_bits(prec),
                                         kv_precision_v_block(prec)};
                    size_t bytes = kv_quant_block_bytes(hd, f);
                    uint8_t *blk = malloc(bytes);
                    CHECK(blk);
                    if (random_bytes) {
                        for (size_t b = 0; b < bytes; b++)
                            blk[b] = (uint8_t)(frand() * 128 + 128);
                    } else {
                        for (int i = 0; i < n * hd; i++)
                            k[i] = (1.0f + (float)(i % hd % 5) * 3) * frand(),
                            v[i] = (0.25f + (float)(i / hd % 4)) * frand();
                        kv_quant_encode(blk, hd, f, n, k, v);
                    }
                    size_t used = (size_t)n * hd, all = KV_CHUNK_TOKENS * MAXD + 1;
                    for (size_t i = 0; i < all; i++)
                        ka[i] = va[i] = ks[i] = vs[i] = -7.0f;
                    kv_quant_decode(blk, hd, f, n, ka, va);
                    kv_quant_decode_scalar(blk, hd, f, n, ks, vs);
                    CHECK_MSG(same_floats(ka, ks, all) && same_floats(va, vs, all),
                              "hd %d %s n %d %s: avx2 differs from scalar", hd,
                              kv_precision_name(prec), n,
                              random_bytes ? "random bytes" : "encoded");
                    CHECK(ka[used] == -7.0f && va[used] == -7.0f);
                    /* each half alone gives the same */
                    for (size_t i = 0; i < used; i++)
                        ka[i] = va[i] = -7.0f;
                    kv_quant_decode(blk, hd, f, n, ka, NULL);
                    kv_quant_decode(blk, hd, f, n, NULL, va);
                    CHECK(same_floats(ka, ks, used) && same_floats(va, vs, used));
                    free(blk);
                }
}

/* A chunk whose layers differ: each layer reads back exactly what a chunk converted to
 * that layer's precision alone reads, sections sit one after the other at their own
 * sizes, the pool counts each layer's bytes at its precision, and converting to other
 * layers (mixed or uniform) and back to f16 keeps every layer's values. */
static void test_mixed_layers(void)
{
    char err[ERR_MAX];
    kv_pool *p = kv_pool_new(SHAPE, 0, err);
    static float k[BLK], v[BLK], kw[BLK], vw[BLK];
    kv_chunk *c = random_chunk(p, 13);
    kv_chunk *ref = random_chunk(p, 13);
    CHECK(c && ref);
    memcpy(ref->data, c->data, kv_chunk_data_bytes(SHAPE, KV_F16));
    const uint8_t layers[3] = {KV_INT8, (uint8_t)kv_precision_layout_of(3, 5, true), KV_F16};
    uint8_t bad[3] = {KV_INT8, 2, KV_F16};
    CHECK_EQ(kv_chunk_convert_layers(p, c, bad, err), -1); /* 2: not a precision */
    CHECK_EQ(c->precision, KV_F16);
    size_t before = kv_pool_bytes_used(p);
    CHECK_EQ(kv_chunk_convert_layers(p, c, layers, err), 0);
    CHECK_EQ(c->precision, KV_MIXED);
    CHECK(kv_chunk_has_layers(c, SHAPE, layers));
    size_t want = 0;
    for (int l = 0; l < 3; l++) {
        CHECK(kv_chunk_layer(c, SHAPE, l) == c->data + want);
        CHECK_EQ(kv_chunk_section_bytes(c, SHAPE, l), kv_chunk_layer_bytes(SHAPE, layers[l]));
        want += kv_chunk_layer_bytes(SHAPE, layers[l]);
    }
    CHECK_EQ(kv_chunk_bytes(SHAPE, c), want);
    CHECK_EQ(kv_layers_data_bytes(SHAPE, layers), want);
    CHECK_EQ(kv_pool_bytes_used(p), before - kv_chunk_data_bytes(SHAPE, KV_F16) + want);
    CHECK_EQ(kv_pool_bytes_at(p, KV_INT8), kv_chunk_layer_bytes(SHAPE, KV_INT8));
    CHECK_EQ(kv_pool_bytes_at(p, KV_F16),
             kv_chunk_data_bytes(SHAPE, KV_F16) + kv_chunk_layer_bytes(SHAPE, KV_F16));
    for (int l = 0; l < 3; l++) {
        kv_chunk *one = random_chunk(p, 13);
        CHECK(one);
        memcpy(one->data, ref->data, kv_chunk_data_bytes(SHAPE, KV_F16));
        CHECK_EQ(kv_chunk_convert(p, one, layers[l], err), 0);
        for (int h = 0; h < SHAPE.n_head_kv; h++) {
            kv_chunk_read_f32(c, SHAPE, l, h, k, v);
            kv_chunk_read_f32(one, SHAPE, l, h, kw, vw);
            CHECK(same_floats(k, kw, 13 * HD) && same_floats(v, vw, 13 * HD));
        }
        kv_chunk_free(p, one);
    }
    /* a copy of a sequence keeps the layers and the bytes */
    kv_seq a, b;
    kv_seq_init(&a, p);
    kv_seq_init(&b, p);
    CHECK_EQ(kv_seq_push_chunk(&a, c, err), 0);
    CHECK_EQ(kv_seq_copy(&b, &a, err), 0);
    CHECK(b.n_chunks == 1 && kv_chunk_has_layers(b.chunks[0], SHAPE, layers));
    CHECK(memcmp(b.chunks[0]->data, c->data, want) == 0);
    kv_seq_free(&b);
    /* to another mix, then to a uniform precision: layer 2 (f16 all along) unchanged */
    const uint8_t other[3] = {KV_INT4, KV_INT4, KV_F16};
    CHECK_EQ(kv_chunk_convert_layers(p, c, other, err), 0);
    CHECK_EQ(c->precision, KV_MIXED);
    CHECK_EQ(kv_chunk_convert(p, c, KV_F16, err), 0);
    CHECK_EQ(c->precision, KV_F16);
    CHECK(memcmp(kv_chunk_layer(c, SHAPE, 2), kv_chunk_layer(ref, SHAPE, 2),
                 kv_chunk_layer_bytes(SHAPE, KV_F16)) == 0);
    kv_seq_free(&a);
    kv_chunk_free(p, ref);
    CHECK_EQ(kv_pool_bytes_used(p), 0);
    for (int q = 0; q < KV_PRECISION_END; q++)
        CHECK_EQ(kv_pool_bytes_at(p, (enum kv_precision)q), 0);
    /* a chunk allocated with mixed layers (as a load from disk does) */
    kv_chunk *n = kv_chunk_new_layers(p, layers, err);
    CHECK(n && n->precision == KV_MIXED && kv_pool_bytes_used(p) == want);
    kv_chunk_free(p, n);
    CHECK(!kv_chunk_new_layers(p, bad, err));
    kv_pool_free(p);
}

/* ---- precision assignment ---- */

static const kv_shape ASHAPE = {.n_layer = 2, .n_head_kv = 2, .head_dim = 64};

/* The documented objective (lower is better). */
static double assignment_error(const kv_chunk_stats *st, const enum kv_precision *a, int n)
{
    double mean = 0, v = 0;
    for (int i = 0; i < n; i++)
        mean += st[i].density / n;
    for (int i = 0; i < n; i++) {
        double ek = 1.0 / ((1 << kv_precision_k_bits(a[i])) - 1);
        double ev = 1.0 / ((1 << kv_precision_v_bits(a[i])) - 1);
        double vs = kv_precision_v_block(a[i]) ? st[i].vb_spread : st[i].v_spread;
        v += (st[i].density + mean / 2) * (2 * st[i].k_spread * ek * ek + vs * ev * ev);
    }
    return v;
}

static size_t assignment_bytes(const enum kv_precision *a, int n)
{
    size_t b = 0;
    for (int i = 0; i < n; i++)
        b += kv_chunk_data_bytes(ASHAPE, a[i]);
    return b;
}

/* Against every assignment of three chunks (with v_block, over both V layouts): within
 * the budget, and within a few percent of the best (greedy on error saved per byte can
 * miss the optimum only at the budget's edge, by less than one step's worth). */
static void assign_near_brute_force(bool v_block, int trials)
{
    enum { N = 3 };
    int L = v_block ? KV_PRECISION_END - KV_INT_FIRST : KV_N_WIDTHS * KV_N_WIDTHS;
    kv_chunk_stats st[N];
    enum kv_precision got[N], all[N];
    double worst = 1;
    for (int trial = 0; trial < trials; trial++) {
        for (int i = 0; i < N; i++) {
            st[i] = (kv_chunk_stats){.density = trial % 2 ? expf(4 * frand()) : 1,
                                     .k_spread = expf(3 * frand()),
                                     .v_spread = expf(3 * frand())};
            st[i].vb_spread = st[i].v_spread * expf(1.5f * frand() + 1);
        }
        size_t lo = N * kv_chunk_data_bytes(ASHAPE, KV_INT2),
               hi = N * kv_chunk_data_bytes(ASHAPE, KV_INT8);
        size_t budget = lo + (size_t)((frand() + 1) / 2 * (double)(hi - lo));
        kv_assign_precisions(ASHAPE, st, N, budget, v_block, got);
        CHECK(assignment_bytes(got, N) <= budget);
        for (int i = 0; i < N; i++)
            CHECK(v_block || !kv_precision_v_block(got[i]));
        double best = 1e300;
        for (int code = 0; code < L * L * L; code++) {
            for (int i = 0, c = code; i < N; i++, c /= L)
                all[i] = (enum kv_precision)(KV_INT_FIRST + c % L);
            if (assignment_bytes(all, N) <= budget) {
                double v = assignment_error(st, all, N);
                best = v < best ? v : best;
            }
        }
        double r = assignment_error(st, got, N) / best;
        worst = r > worst ? r : worst;
    }
    printf("  %s: greedy error / best error, worst of %d: %.3f\n",
           v_block ? "both V layouts" : "V per token", trials, worst);
    CHECK_MSG(worst <= 1.5, "greedy error %.3f x the best", worst);
}

static void test_assign_near_brute_force(void)
{
    assign_near_brute_force(false, 40);
    assign_near_brute_force(true, 10);
}

/* With the V block layout allowed, a chunk whose V rows share one range takes it (its
 * codes cost fewer bytes for the same error); one whose rows differ keeps V per token. */
static void test_assign_chooses_v_layout(void)
{
    enum { N = 8 };
    kv_chunk_stats st[N];
    enum kv_precision a[N];
    for (int i = 0; i < N; i++)
        st[i] = (kv_chunk_stats){.density = 1, .k_spread = 1, .v_spread = 1,
                                 .vb_spread = i % 2 ? 1.2f : 40};
    size_t budget = N * kv_chunk_data_bytes(ASHAPE, KV_INT4);
    kv_assign_precisions(ASHAPE, st, N, budget, true, a);
    CHECK(assignment_bytes(a, N) <= budget);
    for (int i = 0; i < N; i++)
        CHECK_MSG(kv_precision_v_block(a[i]) == (i % 2 == 1), "chunk %d: %s", i,
                  kv_precision_name(a[i]));
    kv_assign_precisions(ASHAPE, st, N, budget, false, a);
    for (int i = 0; i < N; i++)
        CHECK(!kv_precision_v_block(a[i]));
}

static void test_assign_limits_and_order(void)
{
    enum { N = 200 };
    kv_chunk_stats st[N];
    enum kv_precision a[N];
    for (int i = 0; i < N; i++)
        st[i] = (kv_chunk_stats){.density = (float)(frand() + 1.5), .k_spread = 4,
                                 .v_spread = 1};
    kv_assign_precisions(ASHAPE, st, N, N * kv_chunk_data_bytes(ASHAPE, KV_INT8), false, a);
    for (int i = 0; i < N; i++)
        CHECK_EQ(a[i], KV_INT8);
    kv_assign_precisions(ASHAPE, st, N, 0, false, a); /* below everything: all at the narrowest */
    for (int i = 0; i < N; i++)
        CHECK_EQ(a[i], KV_INT2);
    kv_assign_precisions(ASHAPE, st, 0, 0, true, a);
    size_t int4 = kv_chunk_data_bytes(ASHAPE, KV_INT4);
    for (double f = 0.7; f < 1.6; f += 0.2) {
        size_t budget = (size_t)(f * N * int4);
        kv_assign_precisions(ASHAPE, st, N, budget, false, a);
        size_t used = assignment_bytes(a, N);
        CHECK(used <= budget);
        CHECK(used + kv_chunk_data_bytes(ASHAPE, KV_INT8) > budget); /* the budget is used */
        /* same spreads: the denser chunk never gets narrower codes */
        for (int i = 0; i < N; i++)
            for (int j = 0; j < N; j++)
                if (st[i].density > st[j].density)
                    CHECK(kv_precision_k_bits(a[i]) >= kv_precision_k_bits(a[j]) &&
                          kv_precision_v_bits(a[i]) >= kv_precision_v_bits(a[j]));
    }
    /* the side whose values spread more gets the wider codes */
    for (int i = 0; i < N; i++)
        st[i] = (kv_chunk_stats){.density = 1, .k_spread = 1, .v_spread = 100};
    kv_assign_precisions(ASHAPE, st, N, N * int4, false, a);
    CHECK(kv_precision_v_bits(a[0]) > kv_precision_k_bits(a[0]));
}

/* Per (chunk, layer): within the budget; the layer whose spreads are scaled up (as a
 * calibration does for the layer the output follows) gets wider codes than the others
 * in every chunk, where the per-chunk assignment cannot tell the layers apart; with the
 * same statistics in every layer the sections of a chunk get the same precision. */
static void test_assign_layers(void)
{
    enum { N = 40, L = 2 };
    kv_chunk_stats st[N * L];
    uint8_t a[N * L];
    for (int i = 0; i < N; i++)
        for (int l = 0; l < L; l++) {
            float scale = l == 0 ? 30 : 1;
            st[i * L + l] = (kv_chunk_stats){.density = (float)(frand() + 1.5),
                                             .k_spread = scale, .v_spread = scale,
                                             .vb_spread = 3 * scale};
        }
    size_t budget = N * kv_chunk_data_bytes(ASHAPE, KV_INT4);
    kv_assign_layer_precisions(ASHAPE, st, N, budget, true, a);
    size_t used = 0;
    for (int i = 0; i < N; i++) {
        used += kv_layers_data_bytes(ASHAPE, a + i * L);
        CHECK_MSG(kv_precision_bits(a[i * L]) > kv_precision_bits(a[i * L + 1]),
                  "chunk %d: layer 0 %s, layer 1 %s", i, kv_precision_name(a[i * L]),
                  kv_precision_name(a[i * L + 1]));
    }
    CHECK(used <= budget);
    CHECK(used + kv_chunk_layer_bytes(ASHAPE, KV_INT8) > budget);
    for (int i = 0; i < N; i++)
        st[i * L] = st[i * L + 1];
    kv_assign_layer_precisions(ASHAPE, st, N, budget, false, a);
    int differ = 0;
    for (int i = 0; i < N; i++)
        differ += a[i * L] != a[i * L + 1];
    CHECK_MSG(differ <= 1, "%d chunks split their layers on equal statistics", differ);
    kv_assign_layer_precisions(ASHAPE, st, 0, 0, true, a);
}

/* A shape whose V is its K (deepseek2's latent): chunks hold K alone, half the f16 bytes
 * and K's codes alone at an integer precision, whatever its V width; V reads give K's
 * values at every precision, in the bounds of K's codes, alone or with K; and the
 * assignment spends its bytes on K, as V widths cost none. */
static void test_shared_kv(void)
{
    const kv_shape shared = {.n_layer = 3, .n_head_kv = 2, .head_dim = 80, .shared_kv = true};
    char err[ERR_MAX];
    CHECK_EQ(kv_chunk_layer_bytes(shared, KV_F16) * 2, kv_chunk_layer_bytes(SHAPE, KV_F16));
    enum kv_precision k4v2 = kv_precision_of(4, 2), k4v8 = kv_precision_of(4, 8);
    CHECK_EQ(kv_chunk_layer_bytes(shared, k4v2), kv_chunk_layer_bytes(shared, k4v8));
    CHECK_EQ(kv_chunk_layer_bytes(shared, k4v2),
             (size_t)shared.n_head_kv * kv_quant_block_bytes(HD, (kv_quant_format){4, 0, false}));
    CHECK(kv_chunk_layer_bytes(shared, KV_INT8) < kv_chunk_layer_bytes(SHAPE, KV_INT8) * 6 / 10);
    kv_pool *p = kv_pool_new(shared, 0, err);
    CHECK(p);
    static float k[BLK], v[BLK], v_only[BLK], k_ref[BLK];
    for (int bits = 2; bits <= 8; bits++) {
        enum kv_precision prec = kv_precision_of(bits, bits == 8 ? 2 : 8);
        if ((int)prec < 0)
            continue;
        kv_chunk *c = kv_chunk_new(p, err);
        CHECK(c);
        c->n_tokens = 13;
        for (int i = 0; i < c->n_tokens; i++)
            c->tokens[i] = i, c->positions[i] = i;
        for (int l = 0; l < shared.n_layer; l++)
            for (int h = 0; h < shared.n_head_kv; h++) {
                uint16_t *kd = kv_chunk_k_f16(c, shared, l, h);
                CHECK(kv_chunk_v_f16(c, shared, l, h) == kd);
                for (int i = 0; i < BLK; i++)
                    kd[i] = quant_f32_to_f16(i < c->n_tokens * HD ? (1 + i % 5) * frand() : 0);
            }
        kv_chunk_read_f32(c, shared, 1, 1, k_ref, v);
        CHECK(!memcmp(k_ref, v, (size_t)c->n_tokens * HD * sizeof(float)));
        CHECK_EQ(kv_chunk_convert(p, c, prec, err), 0);
        CHECK_EQ(kv_chunk_bytes(shared, c), (size_t)shared.n_layer * kv_chunk_layer_bytes(shared, prec));
        kv_chunk_read_f32(c, shared, 1, 1, k, v);
        kv_chunk_read_f32(c, shared, 1, 1, NULL, v_only);
        size_t n = (size_t)c->n_tokens * HD * sizeof(float);
        CHECK_MSG(!memcmp(k, v, n) && !memcmp(k, v_only, n), "%d bits", bits);
        CHECK_MSG(worst_over_bound(k_ref, k, c->n_tokens, bits, true, false) <= 1.0, "%d bits",
                  bits);
        kv_chunk_free(p, c);
    }
    kv_pool_free(p);
    /* the budget of int4 chunks on the shared shape gives K 4 bits */
    kv_chunk_stats st[4];
    for (int i = 0; i < 4; i++)
        st[i] = (kv_chunk_stats){.density = 1, .k_spread = 1, .v_spread = 1, .vb_spread = 1};
    enum kv_precision out[4];
    kv_assign_precisions(shared, st, 4, 4 * kv_chunk_data_bytes(shared, KV_INT4), false, out);
    for (int i = 0; i < 4; i++)
        CHECK_MSG(kv_precision_k_bits(out[i]) == 4, "chunk %d: %s", i, kv_precision_name(out[i]));
}

int main(void)
{
    RUN(test_round_trip_bounds);
    RUN(test_reads_agree);
    RUN(test_conversions);
    RUN(test_pool_bytes_and_reuse);
    RUN(test_reserve_converts_partial);
    RUN(test_avx2_decode_matches_scalar);
    RUN(test_assign_near_brute_force);
    RUN(test_assign_chooses_v_layout);
    RUN(test_assign_limits_and_order);
    RUN(test_mixed_layers);
    RUN(test_assign_layers);
    RUN(test_shared_kv);
    return test_finish();
}
