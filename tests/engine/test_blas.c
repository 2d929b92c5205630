/* Tests of engine/quant/blas.c: OpenBLAS loaded at run time, with kernels fit for the CPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/quant/blas.h"
#include "tests/support/test.h"

/* C = A (m, k) * op(B), in double, row-major. */
static void naive_product(bool b_transposed, int m, int n, int k, const float *a,
                          const float *b, double *c)
{
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int p = 0; p < k; p++)
                s += (double)a[i * k + p] * (b_transposed ? b[j * k + p] : b[p * n + j]);
            c[i * n + j] = s;
        }
}

static void sgemm_matches_a_naive_product(void)
{
    enum { M = 37, N = 53, K = 129 };
    char err[ERR_MAX];
    CHECK_MSG(blas_init(err) == 0, "%s", err);
    CHECK(strlen(blas_core_name()) > 0);
    static float a[M * K], b[N * K], c[M * N];
    static double want[M * N];
    srand(7);
    for (int i = 0; i < M * K; i++)
        a[i] = (float)rand() / RAND_MAX - 0.5f;
    for (int i = 0; i < N * K; i++)
        b[i] = (float)rand() / RAND_MAX - 0.5f;
    for (int t = 0; t < 2; t++) {
        bool transposed = t == 1;
        naive_product(transposed, M, N, K, a, b, want);
        for (int i = 0; i < M * N; i++)
            c[i] = 1.0f; /* beta = 0 must ignore it */
        blas_sgemm(transposed, M, N, K, 2.0f, a, K, b, transposed ? K : N, 0.0f, c, N);
        for (int i = 0; i < M * N; i++)
            CHECK_NEAR(c[i], 2 * want[i], 1e-4);
    }
}

/* The kernels a fresh process gets with OPENBLAS_CORETYPE set to `core` ("" = unset). */
static int core_of_child(const char *core, char *out, size_t cap)
{
    char cmd[256];
    if (*core)
        snprintf(cmd, sizeof cmd, "OPENBLAS_CORETYPE=%s /proc/%d/exe --print-core", core,
                 (int)getpid());
    else
        snprintf(cmd, sizeof cmd, "env -u OPENBLAS_CORETYPE /proc/%d/exe --print-core",
                 (int)getpid());
    return test_run_capture(cmd, out, cap);
}

static void a_named_core_stands(void)
{
    char out[64];
    CHECK_EQ(core_of_child("Haswell", out, sizeof out), 0);
    CHECK_MSG(strcmp(out, "Haswell\n") == 0, "got '%s'", out);
}

/* The kernels the CPU's features call for, whatever OpenBLAS's own detection makes of
 * it (AMD with AVX-512 it takes for Haswell, Intel newer than it for Prescott); with
 * LLMS_NO_AVX512 the AVX2 ones. */
static void kernels_follow_the_cpu_features(void)
{
    __builtin_cpu_init();
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                  __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                  __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512cd");
    if (!avx2)
        SKIP("this CPU has no AVX2/FMA: OpenBLAS's own choice stands");
    char out[64];
    CHECK_EQ(core_of_child("", out, sizeof out), 0);
    CHECK_MSG(strcmp(out, avx512 ? "SkylakeX\n" : "Haswell\n") == 0, "got '%s'", out);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "env -u OPENBLAS_CORETYPE LLMS_NO_AVX512=1 /proc/%d/exe --print-core",
             (int)getpid());
    CHECK_EQ(test_run_capture(cmd, out, sizeof out), 0);
    CHECK_MSG(strcmp(out, "Haswell\n") == 0, "LLMS_NO_AVX512: got '%s'", out);
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--print-core") == 0) {
        char err[ERR_MAX];
        if (blas_init(err) < 0) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        printf("%s\n", blas_core_name());
        return 0;
    }
    RUN(sgemm_matches_a_naive_product);
    RUN(a_named_core_stands);
    RUN(kernels_follow_the_cpu_features);
    return test_finish();
}
