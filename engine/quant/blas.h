/*
 * blas.h — the single-precision matrix product the engine takes from OpenBLAS.
 *
 * OpenBLAS is loaded at run time, not linked: it chooses its kernels once, while it
 * loads, from the processor it detects or from the OPENBLAS_CORETYPE variable, and
 * Debian 12's OpenBLAS (0.3.21) takes AMD processors with AVX-512 (Zen 4, Zen 5) for
 * Haswell and Intel ones it does not know (Emerald Rapids) for Prescott. Its AVX2
 * kernels reach about 55% of its AVX-512 (SkylakeX) ones (sgemm 512x2048x2048, one
 * thread: 115 against 205 GFLOP/s on a Zen 4) and its Prescott ones about 22% (32
 * against 148 on an Emerald Rapids), and prefill spends most of its time in sgemm.
 * Loading the library ourselves lets blas_init name the kernels the processor's features
 * call for before the library initialises.
 */
#ifndef LLMS_BLAS_H
#define LLMS_BLAS_H

#include <stdbool.h>

#include "engine/err.h"

/* Loads OpenBLAS (once; later calls return the first call's result) and makes its own
 * threading single, as the engine runs it on its own threads. -1 with err when the
 * library or a symbol is missing. Call it before other threads exist: unless the
 * variable is set already, it sets OPENBLAS_CORETYPE for the moment the library loads,
 * to SkylakeX where the CPU has AVX-512 F/DQ/CD/BW/VL, else to Haswell where it has AVX2
 * and FMA (Haswell also when LLMS_NO_AVX512 is set to a value other than "0"). */
int blas_init(char err[ERR_MAX]);

/* The kernels OpenBLAS runs ("Haswell", "SkylakeX", ...); "" before blas_init. */
const char *blas_core_name(void);

/* C (m, n) = alpha * A (m, k) * op(B) + beta * C, row-major, with op(B) = B^T when
 * b_transposed (B is then (n, k)), else B (k, n). blas_init must have succeeded. */
void blas_sgemm(bool b_transposed, int m, int n, int k, float alpha, const float *a, int lda,
                const float *b, int ldb, float beta, float *c, int ldc);

#endif
