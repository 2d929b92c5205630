/* Tests of engine/cuda/cuda_matmul.cu: the kernels' block layouts against the engine's
 * dequantizers and their integer dot products against a double-precision one (on the
 * host, no GPU needed), then cuda_matvec and cuda_dequantize_f16 against a
 * double-precision product on the CPU, with bandwidth prints per type. */
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

/* Whether cuda_matvec rounds the activations of type t's products to int8. */
static bool int8_activations(uint32_t t)
{
    return t != QTYPE_F32 && t != QTYPE_F16 && t != QTYPE_BF16;
}

/* x (n, a multiple of 32) as cuda_matvec's quantized products see it, into xq: each block of
 * 32 with d = amax / 127, every value d times the nearest integer (ties to even) of x / d,
 * that quotient taken as x * (1 / d) as the kernel does. */
static void quantize_activations(const float *x, int64_t n, double *xq)
{
    for (int64_t b = 0; b < n; b += 32) {
        float amax = 0.0f;
        for (int i = 0; i < 32; i++)
            amax = fmaxf(amax, fabsf(x[b + i]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int i = 0; i < 32; i++)
            xq[b + i] = (double)d * rintf(x[b + i] * id);
    }
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

/*
 * cuda_matvec's per-chunk code run on the host (the quantizer, __dp4a emulated, the scales
 * and mins applied) gives for every type the double-precision dot product of the engine's
 * dequantized row with the activations rounded as quantize_activations does, within 1e-5
 * of the sum of |w x|, and the product with the f32 activations within 2e-2 of it. The
 * activations have blocks of every magnitude, one all zero (a zero scale), one with a
 * value exactly halfway between two steps (a tie).
 */
static void host_int_dot_matches_reference(void)
{
    enum { N = 4 * 256, ROWS = 5 };
    uint64_t state = 13;
    test_random_seed(&state);
    static float w[N], x[N];
    static double xq[N];
    for (int k = 0; k < N_TYPES; k++) {
        uint32_t t = types[k];
        uint8_t *rows = random_rows(t, N, ROWS, &state);
        CHECK(rows);
        size_t row_bytes = quant_row_bytes(t, N);
        for (int r = 0; r < ROWS && rows; r++) {
            for (int i = 0; i < N; i++)
                x[i] = random_float(&state, (float)(1 + i / 32 % 5) / (float)(1 + r));
            for (int i = 64; i < 96; i++)
                x[i] = 0.0f;
            x[128] = 127.0f, x[129] = 0.5f; /* block 4: d = 1, a tie (rounds to 0) */
            if (int8_activations(t))
                quantize_activations(x, N, xq);
            else
                for (int i = 0; i < N; i++)
                    xq[i] = x[i];
            quant_dequantize_row(t, rows + (size_t)r * row_bytes, w, N);
            double want = 0, mag = 0, want_f = 0, mag_f = 0;
            for (int i = 0; i < N; i++) {
                want += (double)w[i] * xq[i];
                mag += fabs((double)w[i] * xq[i]);
                want_f += (double)w[i] * x[i];
                mag_f += fabs((double)w[i] * x[i]);
            }
            float got = 0;
            bool ok = cuda_matvec_host_check(t, rows + (size_t)r * row_bytes, N, x, &got);
            CHECK_MSG(ok, "host dot refused %s", quant_traits_of(t)->name);
            CHECK_MSG(fabs(got - want) <= 1e-5 * mag, "%s row %d: %.9g, want %.9g (mag %g)",
                      quant_traits_of(t)->name, r, (double)got, want, mag);
            CHECK_MSG(fabs(got - want_f) <= 2e-2 * mag_f,
                      "%s row %d: %.9g, f32 activations give %.9g (mag %g)",
                      quant_traits_of(t)->name, r, (double)got, want_f, mag_f);
        }
        free(rows);
    }
    CHECK(!cuda_matvec_host_check(QTYPE_Q5_0, x, 256, x, &x[0]));
    CHECK(!cuda_matvec_host_check(QTYPE_Q4_K, x, 128, x, &x[0])); /* not whole super-blocks */
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
    void *d_scratch;   /* cuda_matvec_scratch_bytes(n_in, 8) device */
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
    cudaFree(b->d_scratch);
    memset(b, 0, sizeof *b);
}

static const float POISON = -1.2345e30f;

/*
 * One matrix of type t, (n_out, n_in), whose rows repeat every n_distinct (a big matrix
 * is a few random rows copied, so the CPU's share stays small): cuda_matvec for n_cols up
 * to max_cols, with and without accumulate, against the double-precision product, every
 * output written and nothing past it (for the quantized types, whose activations the
 * kernels round to int8, within 1e-5 of the product with the activations rounded so and
 * within 2e-2 of the f32 one); cuda_dequantize_f16 against the engine's values rounded to
 * f16 when check_f16; then, when time_it, the n_cols = 1 and 8 bandwidths printed.
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
        err = cudaMalloc(&b.d_scratch, cuda_matvec_scratch_bytes(n_in, CUDA_MATVEC_MAX_COLS));
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

    /* the exact products, (8, n_distinct), and the sums of |w x| that bound f32's error:
     * with the activations as the kernels take them (rounded to int8 for the quantized
     * types), then with the f32 ones */
    size_t n_want = (size_t)(CUDA_MATVEC_MAX_COLS * n_distinct);
    double *want = malloc(n_want * sizeof(double)), *mag = malloc(n_want * sizeof(double));
    double *want_f = malloc(n_want * sizeof(double)), *mag_f = malloc(n_want * sizeof(double));
    double *xq = malloc((size_t)n_in * sizeof(double));
    if (!want || !mag || !want_f || !mag_f || !xq) {
        free(want);
        free(mag);
        free(want_f);
        free(mag_f);
        free(xq);
        free_case(&b);
        test_fail(__FILE__, __LINE__, "out of host memory");
        return false;
    }
    bool int8 = int8_activations(t);
    for (int c = 0; c < CUDA_MATVEC_MAX_COLS; c++) {
        const float *xc = b.x + c * n_in;
        if (int8)
            quantize_activations(xc, n_in, xq);
        else
            for (int64_t i = 0; i < n_in; i++)
                xq[i] = xc[i];
        for (int64_t r = 0; r < n_distinct; r++) {
            double s = 0, m = 0, sf = 0, mf = 0;
            for (int64_t i = 0; i < n_in; i++) {
                double wi = b.wf[r * n_in + i];
                s += wi * xq[i];
                m += fabs(wi * xq[i]);
                sf += wi * xc[i];
                mf += fabs(wi * xc[i]);
            }
            want[c * n_distinct + r] = s;
            mag[c * n_distinct + r] = m;
            want_f[c * n_distinct + r] = sf;
            mag_f[c * n_distinct + r] = mf;
        }
    }
    free(xq);

    char failure[256] = "";
    for (int nc = 1; nc <= max_cols && !failure[0]; nc++)
        for (int acc = 0; acc < 2 && !failure[0]; acc++) {
            for (size_t i = 0; i < y_count; i++)
                b.y0[i] = acc && i < (size_t)(nc * n_out) ? random_float(state, 4.0f) : POISON;
            err = cudaMemcpy(b.d_y, b.y0, y_count * sizeof(float), cudaMemcpyHostToDevice);
            if (err == cudaSuccess)
                err = cuda_matvec(&w, b.d_x, nc, b.d_y, acc, b.d_scratch, 0);
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
                double expect_f = want_f[k] + (acc ? b.y0[i] : 0.0);
                double tol_f = 2e-2 * (mag_f[k] + (acc ? fabs(b.y0[i]) : 0.0)) + 1e-30;
                if (!(fabs(b.y[i] - expect) <= tol))
                    snprintf(failure, sizeof failure,
                             "n_cols %d accumulate %d: y[%lld][%lld] = %.9g, want %.9g (tol %g)",
                             nc, acc, (long long)c, (long long)r, (double)b.y[i], expect, tol);
                else if (!(fabs(b.y[i] - expect_f) <= tol_f))
                    snprintf(failure, sizeof failure,
                             "n_cols %d accumulate %d: y[%lld][%lld] = %.9g, f32 activations "
                             "give %.9g (tol %g)",
                             nc, acc, (long long)c, (long long)r, (double)b.y[i], expect_f,
                             tol_f);
            }
        }
    free(want);
    free(mag);
    free(want_f);
    free(mag_f);

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

    static const int timed_cols[] = {1, CUDA_MATVEC_MAX_COLS};
    for (size_t tc = 0; tc < sizeof timed_cols / sizeof *timed_cols && !failure[0] && time_it;
         tc++) {
        enum { RUNS = 20 };
        int nc = timed_cols[tc];
        float ms[RUNS];
        cudaEvent_t start = NULL, stop = NULL;
        err = cudaEventCreate(&start);
        if (err == cudaSuccess)
            err = cudaEventCreate(&stop);
        for (int i = 0; i < 3 && err == cudaSuccess; i++) /* warm-up */
            err = cuda_matvec(&w, b.d_x, nc, b.d_y, false, b.d_scratch, 0);
        for (int i = 0; i < RUNS && err == cudaSuccess; i++) {
            err = cudaEventRecord(start, 0);
            if (err == cudaSuccess)
                err = cuda_matvec(&w, b.d_x, nc, b.d_y, false, b.d_scratch, 0);
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
            printf("bandwidth: cuda_matvec %-4s %5lld x %5lld n_cols=%d: %8.1f us %7.0f GB/s\n",
                   name, (long long)n_out, (long long)n_in, nc, sec * 1e6,
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
    CHECK_CUDA(cudaMalloc(&d, 16384));
    float *f = d;
    w.data = d;
    float *scratch = f + 2048; /* 8192 bytes, room for cuda_matvec_scratch_bytes(256, 8) */
    CHECK(cuda_matvec_scratch_bytes(256, CUDA_MATVEC_MAX_COLS) <= 8192);
    bool ok = cuda_matvec(&w, f, 0, f + 512, false, scratch, 0) == cudaErrorInvalidValue &&
              cuda_matvec(&w, f, 9, f + 512, false, scratch, 0) == cudaErrorInvalidValue &&
              cuda_matvec(&w, f + 1, 1, f + 512, false, scratch, 0) == cudaErrorInvalidValue &&
              cuda_matvec(&w, f, 1, f + 512, false, NULL, 0) == cudaErrorInvalidValue &&
              cuda_matvec(&w, f, 1, f + 512, false, scratch + 1, 0) == cudaErrorInvalidValue;
    w.type = QTYPE_Q5_0;
    ok = ok && cuda_matvec(&w, f, 1, f + 512, false, scratch, 0) == cudaErrorInvalidValue;
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
    RUN(host_int_dot_matches_reference);
    RUN(matvec_refuses_bad_input);
    RUN(matvec_matches_the_cpu);
    RUN(matvec_bandwidth);
#else
    RUN(cuda_matmul_tests);
#endif
    return test_finish();
}
