/* The inner-product kernels against a double reference, at every level this CPU runs,
 * on shapes that exercise each tile remainder and each dimension tail; the int8-row
 * kernels bit for bit against 64-bit integer dot products. */
#include <stdlib.h>
#include <string.h>

#include "engine/vdist.h"
#include "tests/support/test.h"

static float frand(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (float)((*s >> 8) & 0xFFFF) / 65536.0f * 2.0f - 1.0f;
}

static const int dims[] = {1, 7, 8, 15, 16, 17, 33, 384, 385};

static void check_level(enum vdist_level level)
{
    enum { NQ = 9, NX = 70, D = 385, STRIDE = NX + 3 };
    float *q = malloc(sizeof *q * NQ * D), *x = malloc(sizeof *x * NX * D);
    float *out = malloc(sizeof *out * NQ * STRIDE);
    CHECK(q && x && out);
    unsigned s = 7;
    for (int i = 0; i < NQ * D; i++)
        q[i] = frand(&s);
    for (int i = 0; i < NX * D; i++)
        x[i] = frand(&s);
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        int d = dims[di];
        for (int n_q = 1; n_q <= NQ; n_q += 2)
            for (int n_x = 1; n_x <= NX; n_x += 23) {
                memset(out, 0xff, sizeof *out * NQ * STRIDE);
                vdist_dot_at(level, q, n_q, x, n_x, d, out, STRIDE);
                for (int i = 0; i < n_q; i++)
                    for (int j = 0; j < n_x; j++) {
                        double ref = 0, mag = 0;
                        for (int t = 0; t < d; t++) {
                            ref += (double)q[i * d + t] * x[j * d + t];
                            mag += fabs((double)q[i * d + t] * x[j * d + t]);
                        }
                        CHECK_MSG(fabs(out[i * STRIDE + j] - ref) <= 1e-6 * d * mag + 1e-7,
                                  "level %d d %d (%d x %d) [%d][%d]: %g vs %g", (int)level, d,
                                  n_q, n_x, i, j, out[i * STRIDE + j], ref);
                    }
            }
    }
    free(q);
    free(x);
    free(out);
}

static void test_scalar(void)
{
    check_level(VDIST_SCALAR);
}

static void test_avx2(void)
{
    if (vdist_level() < VDIST_AVX2)
        SKIP("AVX2/FMA kernel not in use (CPU lacks it or LLMS_NO_SIMD is set)");
    check_level(VDIST_AVX2);
}

static void test_avx512(void)
{
    if (vdist_level() < VDIST_AVX512)
        SKIP("AVX-512 kernel not in use (CPU lacks it or LLMS_NO_SIMD/LLMS_NO_AVX512 is set)");
    check_level(VDIST_AVX512);
}

/* A pair's score is bit for bit the same whatever block it is computed in: search
 * results must not depend on how queries were batched. */
static void test_grouping_invariant(void)
{
    enum { NQ = 7, NX = 131, D = 100 };
    static float q[NQ * D], x[NX * D], all[NQ * NX], one[NX];
    unsigned s = 3;
    for (int i = 0; i < NQ * D; i++)
        q[i] = frand(&s);
    for (int i = 0; i < NX * D; i++)
        x[i] = frand(&s);
    for (int level = VDIST_SCALAR; level <= (int)vdist_level(); level++) {
        vdist_dot_at((enum vdist_level)level, q, NQ, x, NX, D, all, NX);
        for (int i = 0; i < NQ; i++) {
            vdist_dot_at((enum vdist_level)level, q + i * D, 1, x, NX, D, one, NX);
            CHECK(memcmp(one, all + i * NX, sizeof one) == 0);
            for (int j = 0; j < NX; j += 13) {
                float single;
                vdist_dot_at((enum vdist_level)level, q + i * D, 1, x + j * D, 1, D, &single, 1);
                CHECK(memcmp(&single, &all[i * NX + j], sizeof single) == 0);
            }
        }
    }
}

static int8_t irand8(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (int8_t)(*s >> 16);
}

static int16_t irand16(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (int16_t)(*s >> 12);
}

/* (float)dot * (qs * xs) with the dot taken in 64 bits: what every int8-row kernel must
 * give. */
static float q8_ref(const int16_t *q, float qs, const int8_t *x, float xs, int d)
{
    int64_t s = 0;
    for (int t = 0; t < d; t++)
        s += q[t] * x[t];
    return (float)s * (qs * xs);
}

static const int dims_q8[] = {1, 3, 15, 16, 17, 31, 63, 64, 65, 100, 127, 128, 129, 200, 385};

/* Level's int8-row kernel on every shape up to 9 queries and 70 rows (each tile
 * remainder, row block edges), on rows holding -128 and 127, queries -32768 and 32767
 * (their dots fit int32 to 385 dimensions) and scales from 1e-20 to 1e15. */
static void check_level_q8(enum vdist_level level)
{
    enum { NQ = 9, NX = 70, D = 385, STRIDE = NX + 3 };
    int16_t *q = malloc(sizeof *q * NQ * D);
    int8_t *x = malloc(NX * D);
    float qs[NQ], xs[NX];
    float *out = malloc(sizeof *out * NQ * STRIDE);
    CHECK(q && x && out);
    unsigned s = 11;
    for (int i = 0; i < NQ * D; i++)
        q[i] = irand16(&s);
    for (int i = 0; i < NX * D; i++)
        x[i] = irand8(&s);
    /* saturated rows and queries: the extremes of both operands meet */
    memset(x, -128, D);
    memset(x + 2 * D, 127, D);
    for (int t = 0; t < D; t++) {
        q[t] = INT16_MIN;
        q[3 * D + t] = INT16_MAX;
    }
    static const float scales[] = {1e-20f, 3e-3f, 1.0f, 0.0078740157f, 7.5f, 1e15f};
    for (int i = 0; i < NQ; i++)
        qs[i] = scales[i % 6];
    for (int j = 0; j < NX; j++)
        xs[j] = scales[(j * 5 + 1) % 6] * (1.0f + (float)j / 64);
    for (size_t di = 0; di < sizeof dims_q8 / sizeof dims_q8[0]; di++) {
        int d = dims_q8[di];
        for (int n_q = 1; n_q <= NQ; n_q++)
            for (int n_x = 1; n_x <= NX; n_x += n_x < 9 ? 1 : 15) {
                memset(out, 0xff, sizeof *out * NQ * STRIDE);
                vdist_dot_q8_at(level, q, qs, n_q, x, xs, n_x, d, out, STRIDE);
                for (int i = 0; i < NQ; i++)
                    for (int j = 0; j < STRIDE; j++) {
                        float o = out[i * STRIDE + j];
                        if (i >= n_q || j >= n_x) {
                            uint32_t bits;
                            memcpy(&bits, &o, sizeof bits);
                            CHECK_MSG(bits == 0xffffffffu,
                                      "level %d d %d (%d x %d) wrote [%d][%d]", (int)level,
                                      d, n_q, n_x, i, j);
                            continue;
                        }
                        float ref = q8_ref(q + i * d, qs[i], x + j * d, xs[j], d);
                        CHECK_MSG(memcmp(&o, &ref, sizeof o) == 0,
                                  "level %d d %d (%d x %d) [%d][%d]: %.9g vs %.9g", (int)level,
                                  d, n_q, n_x, i, j, o, ref);
                    }
            }
    }
    free(q);
    free(x);
    free(out);
}

/* The largest dimension with every term at its extreme (queries +-255, the step
 * vdist_quantize_query takes there): the dots (+-255 * 2^23, +-32385 * 2^16) are exact
 * and just fit int32. */
static void check_level_q8_dim_max(enum vdist_level level)
{
    enum { D = VDIST_Q8_DIM_MAX };
    int16_t *q = malloc(sizeof *q * 2 * D);
    int8_t *x = malloc(2 * D);
    CHECK(q && x);
    for (int t = 0; t < D; t++) {
        q[t] = -255;
        q[D + t] = 255;
    }
    memset(x, -128, D);
    memset(x + D, 127, D);
    float one[2] = {1.0f, 1.0f}, out[4];
    vdist_dot_q8_at(level, q, one, 2, x, one, 2, D, out, 2);
    CHECK_MSG(out[0] == 2139095040.0f && out[1] == -2122383360.0f &&
                  out[2] == -2139095040.0f && out[3] == 2122383360.0f,
              "level %d: %.9g %.9g %.9g %.9g", (int)level, out[0], out[1], out[2], out[3]);
    free(q);
    free(x);
}

static void test_q8_scalar(void)
{
    check_level_q8(VDIST_SCALAR);
    check_level_q8_dim_max(VDIST_SCALAR);
}

static void test_q8_avx2(void)
{
    if (vdist_level_q8() < VDIST_AVX2)
        SKIP("AVX2 int8-row kernel not in use (CPU lacks it or LLMS_NO_SIMD is set)");
    check_level_q8(VDIST_AVX2);
    check_level_q8_dim_max(VDIST_AVX2);
}

static void test_q8_avx512(void)
{
    if (vdist_level_q8() < VDIST_AVX512)
        SKIP("AVX-512 VNNI int8-row kernel not in use (CPU lacks it or LLMS_NO_SIMD/"
             "LLMS_NO_AVX512 is set)");
    check_level_q8(VDIST_AVX512);
    check_level_q8_dim_max(VDIST_AVX512);
}

/* Query quantization: the largest magnitude maps to the step's top (32767, less from
 * 513 dimensions on, so that dots fit int32), each value is rounded to the nearest step,
 * and a zero vector stays zero. */
static void test_quantize_query(void)
{
    float v[5] = {0.5f, -2.0f, 1.0f, 0.0f, 0.00787f}, scale;
    int16_t q[5];
    vdist_quantize_query(v, 5, q, &scale);
    CHECK(scale == 2.0f / 32767.0f);
    CHECK(q[0] == 8192 && q[1] == -32767 && q[2] == 16384 && q[3] == 0 && q[4] == 129);
    float z[3] = {0, 0, 0};
    vdist_quantize_query(z, 3, q, &scale);
    CHECK(scale == 0 && q[0] == 0 && q[1] == 0 && q[2] == 0);
    static const int dims[][2] = {{512, 32767}, {513, 32704}, {16384, 1023}, {65536, 255}};
    static float big[65536];
    static int16_t out[65536];
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        big[0] = -3.0f;
        vdist_quantize_query(big, dims[i][0], out, &scale);
        CHECK_MSG(out[0] == -dims[i][1] && scale == 3.0f / (float)dims[i][1],
                  "d %d: %d, scale %g", dims[i][0], out[0], scale);
    }
}

int main(void)
{
    RUN(test_scalar);
    RUN(test_avx2);
    RUN(test_avx512);
    RUN(test_grouping_invariant);
    RUN(test_q8_scalar);
    RUN(test_q8_avx2);
    RUN(test_q8_avx512);
    RUN(test_quantize_query);
    return test_finish();
}
