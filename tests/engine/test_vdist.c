/* The inner-product kernels against a double reference, at every level this CPU runs,
 * on shapes that exercise each tile remainder and each dimension tail. */
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

int main(void)
{
    RUN(test_scalar);
    RUN(test_avx2);
    RUN(test_avx512);
    RUN(test_grouping_invariant);
    return test_finish();
}
