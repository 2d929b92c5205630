/*
 * quant_dot — throughput of the quant kernels on a weight matrix larger than any cache.
 *
 * For each computable weight type: GB/s of weight bytes streamed by quant_dot_rows over a
 * matrix of 4096 columns and enough rows to fill 128 MiB, four times the 32 MiB L3 of
 * the machine this was written on, in 2 MiB pages where the kernel grants them (as the
 * engine keeps weights), so the weights come from DRAM as in decode (scalar
 * reference vs the SIMD kernels on one thread; and the SIMD kernels on two threads, each
 * taking half the rows), and the throughput of quant_dequantize_row over the same matrix
 * (scalar vs SIMD, one thread). Median of 5 passes.
 *
 * "quant_dot_rows_cached" runs the SIMD kernel on one thread over the first rows that fit
 * in 256 KiB, again and again, so they come from L2: what the kernel's arithmetic allows.
 * Where it is well above the DRAM line of the same type, decode of that type is bound by
 * memory, not by the kernel (gb_per_s_vs_dram says by how much).
 * Prints one JSON object per line.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "bench/bench.h"
#include "engine/quant/quant.h"

enum { COLS = 4096, REPS = 5, DISTINCT_ROWS = 16 };

#define MATRIX_BYTES ((size_t)128 << 20)
#define CACHED_BYTES ((size_t)256 << 10)
#define CACHED_PASSES 256

typedef enum { DOT_SCALAR, DOT_SIMD, DEQ_SCALAR, DEQ_SIMD } job_kind;

typedef struct {
    job_kind kind;
    uint32_t t;
    const uint8_t *w;
    size_t row_bytes;
    int64_t row0, n_rows;
    const void *act;
    float *out; /* (rows) dot results, or (COLS) scratch row for dequantization */
} job;

static void run_job(const job *j)
{
    const uint8_t *w = j->w + (size_t)j->row0 * j->row_bytes;
    switch (j->kind) {
    case DOT_SCALAR:
        for (int64_t r = 0; r < j->n_rows; r++)
            j->out[j->row0 + r] = quant_dot_scalar(j->t, w + (size_t)r * j->row_bytes, j->act, COLS);
        break;
    case DOT_SIMD:
        quant_dot_rows(j->t, w, j->row_bytes, j->n_rows, j->act, COLS, j->out + j->row0);
        break;
    case DEQ_SCALAR:
        for (int64_t r = 0; r < j->n_rows; r++)
            quant_dequantize_row_scalar(j->t, w + (size_t)r * j->row_bytes, j->out, COLS);
        break;
    case DEQ_SIMD:
        for (int64_t r = 0; r < j->n_rows; r++)
            quant_dequantize_row(j->t, w + (size_t)r * j->row_bytes, j->out, COLS);
        break;
    }
}

static void *job_thread(void *arg)
{
    run_job(arg);
    return NULL;
}

/* Median seconds of one pass over the matrix, split across n_threads threads. */
static double time_pass(job base, int64_t rows, int n_threads, float *scratch[2])
{
    double t[REPS];
    for (int rep = -1; rep < REPS; rep++) { /* rep -1 warms up */
        job jobs[2];
        pthread_t th[2];
        double t0 = bench_now_s();
        for (int k = 0; k < n_threads; k++) {
            jobs[k] = base;
            jobs[k].row0 = rows / n_threads * k;
            jobs[k].n_rows = rows / n_threads;
            if (base.kind == DEQ_SCALAR || base.kind == DEQ_SIMD)
                jobs[k].out = scratch[k];
            if (k > 0 && pthread_create(&th[k], NULL, job_thread, &jobs[k]) != 0) {
                fprintf(stderr, "quant_dot: pthread_create failed\n");
                exit(1);
            }
        }
        run_job(&jobs[0]);
        for (int k = 1; k < n_threads; k++)
            pthread_join(th[k], NULL);
        if (rep >= 0)
            t[rep] = bench_now_s() - t0;
    }
    return bench_median(t, REPS);
}

/* Median seconds of CACHED_PASSES passes of the SIMD kernel over base's first rows. */
static double time_cached_passes(job base, int64_t rows)
{
    double t[REPS];
    base.kind = DOT_SIMD;
    base.row0 = 0;
    base.n_rows = rows;
    for (int rep = -1; rep < REPS; rep++) { /* rep -1 brings the rows into the cache */
        double t0 = bench_now_s();
        for (int pass = 0; pass < CACHED_PASSES; pass++)
            run_job(&base);
        if (rep >= 0)
            t[rep] = bench_now_s() - t0;
    }
    return bench_median(t, REPS);
}

/* Prints one result; gb_s_dram > 0 adds its ratio to that DRAM figure. Returns GB/s. */
static double report(const char *bench, uint32_t t, const char *path, int threads, int64_t rows,
                     size_t bytes, double secs, double gb_s_dram)
{
    double gb_s = (double)bytes / secs * 1e-9;
    printf("{\"bench\":\"%s\",\"type\":\"%s\",\"path\":\"%s\",\"threads\":%d,\"rows\":%lld,"
           "\"cols\":%d,\"weight_bytes\":%zu,\"median_ms\":%.3f,\"gb_per_s\":%.2f,"
           "\"gelem_per_s\":%.3f",
           bench, quant_traits_of(t)->name, path, threads, (long long)rows, COLS, bytes, secs * 1e3,
           gb_s, (double)rows * COLS / secs * 1e-9);
    if (gb_s_dram > 0)
        printf(",\"gb_per_s_vs_dram\":%.2f", gb_s / gb_s_dram);
    printf("}\n");
    fflush(stdout);
    return gb_s;
}

int main(void)
{
    static const uint32_t types[] = {QTYPE_F32,  QTYPE_F16,    QTYPE_BF16,  QTYPE_Q8_0,
                                     QTYPE_Q4_0, QTYPE_Q4_1,   QTYPE_Q5_0,  QTYPE_Q5_1,
                                     QTYPE_Q2_K, QTYPE_Q3_K,   QTYPE_Q4_K,  QTYPE_Q5_K,
                                     QTYPE_Q6_K, QTYPE_IQ4_NL, QTYPE_IQ4_XS, QTYPE_MXFP4,
                                     QTYPE_IQ3_S, QTYPE_IQ3_XXS, QTYPE_IQ2_S, QTYPE_IQ2_XS,
                                     QTYPE_IQ2_XXS, QTYPE_IQ1_M, QTYPE_IQ1_S};
    /* the name of the kernels quant_dot_rows runs (quant_simd_name says only AVX2 or not) */
    const char *simd = quant_avx512_enabled() ? "avx512" : quant_simd_name();
    float *x = malloc(COLS * sizeof *x), *out = malloc(MATRIX_BYTES / 64 * sizeof *out);
    float *scratch[2] = {malloc(COLS * sizeof(float)), malloc(COLS * sizeof(float))};
    void *act = malloc(COLS * sizeof(float));
    if (!x || !out || !scratch[0] || !scratch[1] || !act) {
        fprintf(stderr, "quant_dot: out of memory\n");
        return 1;
    }
    srand(1);
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        uint32_t t = types[k];
        size_t rb = quant_row_bytes(t, COLS);
        int64_t rows = (int64_t)(MATRIX_BYTES / rb) & ~(int64_t)7;
        size_t bytes = rb * (size_t)rows;
        uint8_t *w = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (w == MAP_FAILED) {
            fprintf(stderr, "quant_dot: out of memory\n");
            return 1;
        }
        (void)madvise(w, bytes, MADV_HUGEPAGE);
        /* A few distinct random rows repeated: the content does not change the speed. */
        for (int64_t r = 0; r < rows; r++) {
            if (r < DISTINCT_ROWS) {
                for (int i = 0; i < COLS; i++)
                    x[i] = (float)rand() / (float)RAND_MAX * 2.0f - 1.0f;
                quant_quantize_row(t, x, w + (size_t)r * rb, COLS);
            } else {
                memcpy(w + (size_t)r * rb, w + (size_t)(r % DISTINCT_ROWS) * rb, rb);
            }
        }
        for (int i = 0; i < COLS; i++)
            x[i] = (float)rand() / (float)RAND_MAX * 2.0f - 1.0f;
        quant_prepare_activation(quant_dot_activation_type(t), x, act, COLS);

        job base = {.t = t, .w = w, .row_bytes = rb, .act = act, .out = out};
        base.kind = DOT_SCALAR;
        report("quant_dot_rows", t, "scalar", 1, rows, bytes, time_pass(base, rows, 1, scratch), 0);
        base.kind = DOT_SIMD;
        double dram = report("quant_dot_rows", t, simd, 1, rows, bytes,
                             time_pass(base, rows, 1, scratch), 0);
        report("quant_dot_rows", t, simd, 2, rows, bytes, time_pass(base, rows, 2, scratch), 0);
        int64_t cached_rows = (int64_t)(CACHED_BYTES / rb);
        report("quant_dot_rows_cached", t, simd, 1, cached_rows,
               rb * (size_t)cached_rows * CACHED_PASSES, time_cached_passes(base, cached_rows),
               dram);
        base.kind = DEQ_SCALAR;
        report("dequantize_row", t, "scalar", 1, rows, bytes, time_pass(base, rows, 1, scratch), 0);
        base.kind = DEQ_SIMD;
        report("dequantize_row", t, simd, 1, rows, bytes, time_pass(base, rows, 1, scratch), 0);
        munmap(w, bytes);
    }
    free(x);
    free(out);
    free(scratch[0]);
    free(scratch[1]);
    free(act);
    return 0;
}
