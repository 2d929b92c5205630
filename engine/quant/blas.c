/* blas.c — OpenBLAS loaded at run time with kernels fit for the processor (see blas.h). */
#include "engine/quant/blas.h"

#include <cblas.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* The library's soname: Debian's alternatives point it at the pthread, OpenMP or serial
 * build, which share this interface. */
#define BLAS_LIBRARY "libopenblas.so.0"

typedef void blas_sgemm_fn(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE,
                           blasint, blasint, blasint, float, const float *, blasint,
                           const float *, blasint, float, float *, blasint);
typedef void blas_set_threads_fn(int);
typedef char *blas_core_name_fn(void);

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static char blas_error[ERR_MAX];
static blas_sgemm_fn *blas_sgemm_ptr;
static blas_core_name_fn *blas_core_name_ptr;

/* The kernels this processor's features call for: SkylakeX with the AVX-512 subsets they
 * need, Haswell with AVX2 and FMA, NULL (OpenBLAS's own choice) otherwise. For sgemm,
 * the only routine used, OpenBLAS's Cooperlake and SapphireRapids kernels are SkylakeX's
 * and its Zen ones Haswell's, so naming them loses nothing where its detection is right,
 * and fixes where it is not: AMD processors with AVX-512, and Intel ones newer than the
 * library (Debian 12's 0.3.21 takes Emerald Rapids, family 6 model 207, for Prescott). */
static const char *blas_core_for_cpu(bool avx2_only)
{
    __builtin_cpu_init();
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (!avx2_only && avx2 && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512cd") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
        return "SkylakeX";
    return avx2 ? "Haswell" : NULL;
}

static void blas_load(void)
{
    /* A choice made by whoever runs us stands. */
    const char *chosen = getenv("OPENBLAS_CORETYPE");
    /* LLMS_NO_AVX512, as the quant kernels read it: measuring a CPU without AVX-512 */
    const char *no512 = getenv("LLMS_NO_AVX512");
    bool avx2_only = no512 && *no512 && strcmp(no512, "0") != 0;
    const char *core = chosen && *chosen ? NULL : blas_core_for_cpu(avx2_only);
    if (core)
        setenv("OPENBLAS_CORETYPE", core, 1);
    void *lib = dlopen(BLAS_LIBRARY, RTLD_NOW | RTLD_LOCAL);
    /* the library read it while loading; children need not inherit it */
    if (core)
        unsetenv("OPENBLAS_CORETYPE");
    if (!lib) {
        err_set(blas_error, "OpenBLAS: %s", dlerror());
        return;
    }
    blas_sgemm_fn *sgemm = (blas_sgemm_fn *)dlsym(lib, "cblas_sgemm");
    blas_set_threads_fn *set_threads =
        (blas_set_threads_fn *)dlsym(lib, "openblas_set_num_threads");
    blas_core_name_fn *core_name = (blas_core_name_fn *)dlsym(lib, "openblas_get_corename");
    if (!sgemm || !set_threads || !core_name) {
        err_set(blas_error, "OpenBLAS: %s lacks cblas_sgemm, openblas_set_num_threads or "
                            "openblas_get_corename", BLAS_LIBRARY);
        return;
    }
    set_threads(1);
    blas_core_name_ptr = core_name;
    blas_sgemm_ptr = sgemm;
}

int blas_init(char err[ERR_MAX])
{
    pthread_once(&blas_once, blas_load);
    if (!blas_sgemm_ptr) {
        err_set(err, "%s", blas_error);
        return -1;
    }
    return 0;
}

const char *blas_core_name(void)
{
    const char *name = blas_core_name_ptr ? blas_core_name_ptr() : NULL;
    return name ? name : "";
}

void blas_sgemm(bool b_transposed, int m, int n, int k, float alpha, const float *a, int lda,
                const float *b, int ldb, float beta, float *c, int ldc)
{
    blas_sgemm_ptr(CblasRowMajor, CblasNoTrans, b_transposed ? CblasTrans : CblasNoTrans, m, n,
                   k, alpha, a, lda, b, ldb, beta, c, ldc);
}
