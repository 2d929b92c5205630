/* Tests of engine/cuda/cuda_matmul.cu: the kernels' block layouts against the engine's
 * dequantizers (on the host, no GPU needed), then cuda_matvec and cuda_dequantize_f16
 * against a double-precision product on the CPU, with a bandwidth print per type. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/quant/quant.h"
#include "tests/support/test.h"

#ifdef LLMS_CUDA
#include <cuda_runtime_api.h>

#include "engine/cuda/cuda_matmul.h"

static const uint32_t types[] = {QTYPE_F32,  QTYPE_F16,  QTYPE_BF16, QTYPE_Q8_0,
                                 QTYPE_Q4_0, QTYPE_Q4_K, QTYPE_Q5_K, QTYPE_Q6_K};
enum { N_TYPES = sizeof types / sizeof types[0] };

/* Uniform in [-scale, scale). */
static float random_float(uint64_t *state, float scale)
{
    return scale * ((float)(test_random(state) >> 40) * 0x1p-23f - 1.0f);
}

/* n_rows rows of n random values, quantized to type t: (n_rows, quant_row_bytes(t, n)),
 * malloc'd. Each row has its own scale, and each 32 elements their own spread and offset,
 * so that K-quant sub-blocks get scales and mins of every size (all 6 bits in use). */
static uint8_t *random_rows(uint32_t t, int64_t n, int64_t n_rows, uint64_t *state)
{
    size_t row_bytes = quant_row_bytes(t, n);
    uint8_t *q = malloc(row_bytes * (size_t)n_rows);
    float *f = malloc((size_t)n * sizeof *f);
    if (!q || !f) {
        free(q);
        free(f);
        return NULL;
    }
    for (int64_t r = 0; r < n_rows; r++) {
        float scale = 0.25f + (float)(r % 7);
        for (int64_t i = 0; i < n; i++) {
            int64_t sub = i / 32;
            float spread = (float)(1 + (sub * 5 + r) % 9) / 9.0f;
            float offset = (float)((sub * 3 + r) % 7 - 3) / 4.0f;
            f[i] = scale * (offset + random_float(state, spread));
        }
        quant_quantize_row(t, f, q + (size_t)r * row_bytes, n);
    }
    free(f);
    return q;
}

/* The kernels' per-block code, run on the host, gives what the engine's dequantizer
 * gives (up to a fused multiply-add's rounding) for every type, over several super-blocks
 * so that Q6_K's blocks at both 4-byte alignments are read. */
static void host_dequant_matches_engine(void)
{
    enum { N = 4 * 256 };
    uint64_t state = 11;
    test_random_seed(&state);
    static float want[N], got[N];
    for (int k = 0; k < N_TYPES; k++) {
        uint32_t t = types[k];
        CHECK(cuda_matmul_type_supported(t));
        uint8_t *row = random_rows(t, N, 1, &state);
        CHECK(row);
        quant_dequantize_row(t, row, want, N);
        bool ok = cuda_matmul_host_check(t, row, N, got);
        free(row);
        CHECK_MSG(ok, "host check refused %s", quant_traits_of(t)->name);
        float amax = 0;
        for (int i = 0; i < N; i++)
            amax = fmaxf(amax, fabsf(want[i]));
        for (int i = 0; i < N; i++)
            CHECK_MSG(fabsf(got[i] - want[i]) <= 1e-6f * amax, "%s element %d: %g, want %g",
                      quant_traits_of(t)->name, i, (double)got[i], (double)want[i]);
    }
    CHECK(!cuda_matmul_type_supported(QTYPE_Q5_0));
    CHECK(!cuda_matmul_type_supported(QTYPE_IQ4_XS));
    CHECK(!cuda_matmul_host_check(QTYPE_Q4_K, got, 128, got)); /* not whole super-blocks */
}

/* Whether a device is visible; the reason in why when not. */
static bool have_device(char *why, size_t cap)
{
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        snprintf(why, cap, "no CUDA device: %s", cudaGetErrorString(err));
        return false;
    }
    if (n == 0) {
        snprintf(why, cap, "no CUDA device visible");
        return false;
    }
    return true;
}

#define CHECK_CUDA(call)                                                                  \
    do {                                                                                  \
        cudaError_t e_ = (call);                                                          \
        CHECK_MSG(e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));            \
    } while (0)

/* Host and device copies of one test matrix and its activations. */
typedef struct case_buffers {
    uint8_t *w;        /* (n_out, row_bytes) host */
    float *wf;         /* (n_distinct, n_in) host, rows dequantized by the engine */
    float *x;          /* (8, n_in) host */
    float *y0;         /* (8 + 1, n_out) host: the initial y, a guard row after */
    float *y;          /* (8 + 1, n_out) host: the result */
    uint16_t *h;       /* (n_out, n_in) host, cuda_dequantize_f16's result */
    void *d_w;         /* (n_out, row_bytes) device */
    float *d_x;        /* (8, n_in) device */
    float *d_y;        /* (8 + 1, n_out) device */
    uint16_t *d_h;     /* (n_out, n_in) device */
} case_buffers;

static void free_case(case_buffers *b)
{
    free(b->w);
    free(b->wf);
    free(b->x);
    free(b->y0);
    free(b->y);
    free(b->h);
    cudaFree(b->d_w);
    cudaFree(b->d_x);
    cudaFree(b->d_y);
    cudaFree(b->d_h);
    memset(b, 0, sizeof *b);
}

static const float POISON = -1.2345e30f;

/*
 * One matrix of type t, (n_out, n_in), whose rows repeat every n_distinct (a big matrix
 * is a few random rows copied, so the CPU's share stays small): cuda_matvec for n_cols up
 * to max_cols, with and without accumulate, against the double-precision product, every
 * output written and nothing past it; cuda_dequantize_f16 against the engine's values
 * rounded to f16 when check_f16; then, when time_it, the n_cols = 1 bandwidth printed.
 * Marks the test failed and returns false at the first difference.
 */
static bool check_case(uint32_t t, int64_t n_in, int64_t n_out, int64_t n_distinct,
                       int max_cols, bool check_f16, bool time_it, uint64_t *state)
{
    const char *name = quant_traits_of(t)->name;
    size_t row_bytes = quant_row_bytes(t, n_in);
    size_t w_bytes = row_bytes * (size_t)n_out;
    size_t y_count = (size_t)(CUDA_MATVEC_MAX_COLS + 1) * (size_t)n_out;
    case_buffers b = {0};
    b.w = malloc(w_bytes);
    b.wf = malloc((size_t)(n_distinct * n_in) * sizeof(float));
    b.x = malloc((size_t)(CUDA_MATVEC_MAX_COLS * n_in) * sizeof(float));
    b.y0 = malloc(y_count * sizeof(float));
    b.y = malloc(y_count * sizeof(float));
    if (check_f16)
        b.h = malloc((size_t)(n_out * n_in) * sizeof(uint16_t));
    uint8_t *distinct = random_rows(t, n_in, n_distinct, state);
    bool ok = b.w && b.wf && b.x && b.y0 && b.y && (!check_f16 || b.h) && distinct;
    if (!ok) {
        free(distinct);
        free_case(&b);
        test_fail(__FILE__, __LINE__, "out of host memory");
        return false;
    }
    for (int64_t r = 0; r < n_out; r++)
        memcpy(b.w + (size_t)r * row_bytes, distinct + (size_t)(r % n_distinct) * row_bytes,
               row_bytes);
    for (int64_t r = 0; r < n_distinct; r++)
        quant_dequantize_row(t, distinct + (size_t)r * row_bytes, b.wf + r * n_in, n_in);
    free(distinct);
    for (int64_t i = 0; i < CUDA_MATVEC_MAX_COLS * n_in; i++)
        b.x[i] = random_float(state, 1.0f);

    cudaError_t err = cudaMalloc(&b.d_w, w_bytes);
    if (err == cudaSuccess)
        err = cudaMalloc((void **)&b.d_x, (size_t)(CUDA_MATVEC_MAX_COLS * n_in) * sizeof(float));
    if (err == cudaSuccess)
        err = cudaMalloc((void **)&b.d_y, y_count * sizeof(float));
    if (err == cudaSuccess && check_f16)
        err = cudaMalloc((void **)&b.d_h, (size_t)(n_out * n_in) * sizeof(uint16_t));
    if (err == cudaSuccess)
        err = cudaMemcpy(b.d_w, b.w, w_bytes, cudaMemcpyHostToDevice);
    if (err == cudaSuccess)
        err = cudaMemcpy(b.d_x, b.x, (size_t)(CUDA_MATVEC_MAX_COLS * n_in) * sizeof(float),
                         cudaMemcpyHostToDevice);
    if (err != cudaSuccess) {
        free_case(&b);
        test_fail(__FILE__, __LINE__, "%s %lldx%lld: upload: %s", name, (long long)n_out,
                  (long long)n_in, cudaGetErrorString(err));
        return false;
    }
    cuda_weight w = {.type = t, .n_in = n_in, .n_out = n_out, .row_bytes = row_bytes,
                     .data = b.d_w};

    /* the exact products, (8, n_distinct), and the sums of |w x| that bound f32's error */
    double *want = malloc((size_t)(CUDA_MATVEC_MAX_COLS * n_distinct) * sizeof(double));
    double *mag = malloc((size_t)(CUDA_MATVEC_MAX_COLS * n_distinct) * sizeof(double));
    if (!want || !mag) {
        free(want);
        free(mag);
        free_case(&b);
        test_fail(__FILE__, __LINE__, "out of host memory");
        return false;
    }
    for (int c = 0; c < CUDA_MATVEC_MAX_COLS; c++)
        for (int64_t r = 0; r < n_distinct; r++) {
            double s = 0, m = 0;
            for (int64_t i = 0; i < n_in; i++) {
                double p = (double)b.wf[r * n_in + i] * b.x[c * n_in + i];
                s += p;
                m += fabs(p);
            }
            want[c * n_distinct + r] = s;
            mag[c * n_distinct + r] = m;
        }

    char failure[256] = "";
    for (int nc = 1; nc <= max_cols && !failure[0]; nc++)
        for (int acc = 0; acc < 2 && !failure[0]; acc++) {
            for (size_t i = 0; i < y_count; i++)
                b.y0[i] = acc && i < (size_t)(nc * n_out) ? random_float(state, 4.0f) : POISON;
            err = cudaMemcpy(b.d_y, b.y0, y_count * sizeof(float), cudaMemcpyHostToDevice);
            if (err == cudaSuccess)
                err = cuda_matvec(&w, b.d_x, nc, b.d_y, acc, 0);
            if (err == cudaSuccess)
                err = cudaMemcpy(b.y, b.d_y, y_count * sizeof(float), cudaMemcpyDeviceToHost);
            if (err != cudaSuccess) {
                snprintf(failure, sizeof failure, "n_cols %d: %s", nc, cudaGetErrorString(err));
                break;
            }
            for (size_t i = 0; i < y_count && !failure[0]; i++) {
                int64_t c = (int64_t)i / n_out, r = (int64_t)i % n_out;
                if (c >= nc) {
                    if (memcmp(&b.y[i], &POISON, sizeof POISON) != 0)
                        snprintf(failure, sizeof failure,
                                 "n_cols %d: y[%lld] past the columns written", nc,
                                 (long long)i);
                    continue;
                }
                size_t k = (size_t)(c * n_distinct + r % n_distinct);
                double expect = want[k] + (acc ? b.y0[i] : 0.0);
                double tol = 1e-5 * (mag[k] + (acc ? fabs(b.y0[i]) : 0.0)) + 1e-30;
                if (!(fabs(b.y[i] - expect) <= tol))
                    snprintf(failure, sizeof failure,
                             "n_cols %d accumulate %d: y[%lld][%lld] = %.9g, want %.9g (tol %g)",
                             nc, acc, (long long)c, (long long)r, (double)b.y[i], expect, tol);
            }
        }
    free(want);
    free(mag);

    if (!failure[0] && check_f16) {
        err = cudaMemset(b.d_h, 0xff, (size_t)(n_out * n_in) * sizeof(uint16_t));
        if (err == cudaSuccess)
            err = cuda_dequantize_f16(&w, b.d_h, 0);
        if (err == cudaSuccess)
            err = cudaMemcpy(b.h, b.d_h, (size_t)(n_out * n_in) * sizeof(uint16_t),
                             cudaMemcpyDeviceToHost);
        if (err != cudaSuccess)
            snprintf(failure, sizeof failure, "f16: %s", cudaGetErrorString(err));
        for (int64_t i = 0; i < n_out * n_in && !failure[0]; i++) {
            int64_t r = i / n_in, e = i % n_in;
            uint16_t ref = quant_f32_to_f16(b.wf[(r % n_distinct) * n_in + e]), got = b.h[i];
            bool same_sign = (ref & 0x8000) == (got & 0x8000);
            bool near = got == ref || (same_sign && abs((int)got - (int)ref) <= 1) ||
                        ((ref & 0x7fff) == 0 && (got & 0x7fff) <= 1) ||
                        ((got & 0x7fff) == 0 && (ref & 0x7fff) <= 1);
            if (!near)
                snprintf(failure, sizeof failure, "f16[%lld][%lld] = 0x%04x, want 0x%04x",
                         (long long)r, (long long)e, got, ref);
        }
    }

    if (!failure[0] && time_it) {
        enum { RUNS = 20 };
        float ms[RUNS];
        cudaEvent_t start = NULL, stop = NULL;
        err = cudaEventCreate(&start);
        if (err == cudaSuccess)
            err = cudaEventCreate(&stop);
        for (int i = 0; i < 3 && err == cudaSuccess; i++) /* warm-up */
            err = cuda_matvec(&w, b.d_x, 1, b.d_y, false, 0);
        for (int i = 0; i < RUNS && err == cudaSuccess; i++) {
            err = cudaEventRecord(start, 0);
            if (err == cudaSuccess)
                err = cuda_matvec(&w, b.d_x, 1, b.d_y, false, 0);
            if (err == cudaSuccess)
                err = cudaEventRecord(stop, 0);
            if (err == cudaSuccess)
                err = cudaEventSynchronize(stop);
            if (err == cudaSuccess)
                err = cudaEventElapsedTime(&ms[i], start, stop);
        }
        if (start)
            cudaEventDestroy(start);
        if (stop)
            cudaEventDestroy(stop);
        if (err != cudaSuccess) {
            snprintf(failure, sizeof failure, "timing: %s", cudaGetErrorString(err));
        } else {
            for (int i = 1; i < RUNS; i++) /* insertion sort for the median */
                for (int j = i; j > 0 && ms[j] < ms[j - 1]; j--) {
                    float s = ms[j];
                    ms[j] = ms[j - 1];
                    ms[j - 1] = s;
                }
            double sec = ms[RUNS / 2] * 1e-3;
            printf("bandwidth: cuda_matvec %-4s %5lld x %5lld n_cols=1: %8.1f us %7.0f GB/s\n",
                   name, (long long)n_out, (long long)n_in, sec * 1e6,
                   (double)w_bytes / sec / 1e9);
        }
    }
    free_case(&b);
    if (failure[0])
        test_fail(__FILE__, __LINE__, "%s %lldx%lld: %s", name, (long long)n_out,
                  (long long)n_in, failure);
    return !failure[0];
}

static void matvec_matches_the_cpu(void)
{
    char why[160];
    if (!have_device(why, sizeof why))
        SKIP("%s", why);
    uint64_t state = 23;
    test_random_seed(&state);
    /* (n_in, n_out): one super-block; odd row counts; n_in not a multiple of the unrolled
     * steps (the tail loop), 32-element blocks past the last whole 256 */
    static const int64_t shapes[][2] = {{256, 67}, {2816, 67}, {4096, 33}, {1024, 1}};
    for (int k = 0; k < N_TYPES; k++) {
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            if (!check_case(types[k], shapes[s][0], shapes[s][1], shapes[s][1],
                            CUDA_MATVEC_MAX_COLS, true, false, &state))
                return;
        }
        if (types[k] == QTYPE_Q8_0 || types[k] == QTYPE_Q4_0) {
            if (!check_case(types[k], 96, 5, 5, CUDA_MATVEC_MAX_COLS, true, false, &state))
                return;
        }
    }
}

static void matvec_bandwidth(void)
{
    char why[160];
    if (!have_device(why, sizeof why))
        SKIP("%s", why);
    uint64_t state = 31;
    test_random_seed(&state);
    static const int64_t shapes[][2] = {{4096, 4096}, {4096, 14336}, {14336, 4096}};
    for (int k = 0; k < N_TYPES; k++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            if (!check_case(types[k], shapes[s][0], shapes[s][1], 61, 2, s == 0, true, &state))
                return;
        }
}

static void matvec_refuses_bad_input(void)
{
    char why[160];
    if (!have_device(why, sizeof why))
        SKIP("%s", why);
    cuda_weight w = {.type = QTYPE_Q4_K, .n_in = 256, .n_out = 4,
                     .row_bytes = quant_row_bytes(QTYPE_Q4_K, 256), .data = NULL};
    void *d = NULL;
    CHECK_CUDA(cudaMalloc(&d, 4096));
    float *f = d;
    w.data = d;
    bool ok = cuda_matvec(&w, f, 0, f + 512, false, 0) == cudaErrorInvalidValue &&
              cuda_matvec(&w, f, 9, f + 512, false, 0) == cudaErrorInvalidValue &&
              cuda_matvec(&w, f + 1, 1, f + 512, false, 0) == cudaErrorInvalidValue;
    w.type = QTYPE_Q5_0;
    ok = ok && cuda_matvec(&w, f, 1, f + 512, false, 0) == cudaErrorInvalidValue;
    w.type = QTYPE_Q4_K;
    w.row_bytes++;
    ok = ok && cuda_dequantize_f16(&w, d, 0) == cudaErrorInvalidValue;
    CHECK_CUDA(cudaFree(d));
    CHECK(ok);
}
#else
static void cuda_matmul_tests(void)
{
    SKIP("built without CUDA: make CUDA=1");
}
#endif

int main(void)
{
#ifdef LLMS_CUDA
    RUN(host_dequant_matches_engine);
    RUN(matvec_refuses_bad_input);
    RUN(matvec_matches_the_cpu);
    RUN(matvec_bandwidth);
#else
    RUN(cuda_matmul_tests);
#endif
    return test_finish();
}
