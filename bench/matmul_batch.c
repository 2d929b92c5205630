/*
 * matmul_batch — ops_matmul on a few activation rows at once, as batched decode runs it
 * (one row per active stream), on the TinyLlama-1.1B layer shapes, two pool threads.
 *
 * For Q8_0 and Q4_K and n_tok = 1, 4, 16, 32, 64, three ways to compute y = x W^T:
 *   "ops":       ops_matmul itself;
 *   "per_token": the dot path as it was before quant_dot_rows_multi (for each block of
 *                16 weight rows, quant_dot_rows once per token), activations prepared
 *                the same way;
 *   "multi":     the dot path with quant_dot_rows_multi at any n_tok (what ops_matmul
 *                does up to its crossover to sgemm), to place that crossover.
 * Each line: time per step (median of REPS), weight GB/s, and the aggregate speedup
 * t(1) * n / t(n) of that way against its own n_tok = 1 time; "vs_per_token" is
 * t(per_token) / t(this way) at the same n_tok. One JSON object per line.
 *
 * A single matrix below 32 MiB stays in L3 between steps; the "layers" lines run the
 * seven matrices of LAYERS decoder layers in turn, each its own memory (more than L3
 * for both types), so the weights come from DRAM as in real decode.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "engine/model/ops.h"
#include "engine/quant/quant.h"
#include "engine/threadpool.h"

enum { REPS = 7, DISTINCT_ROWS = 16, BLOCK = 16, N_WAYS = 4, MAX_TOK = 64, LAYERS = 2, N_SHAPES = 5 };

static const char *const way_names[N_WAYS] = {"ops", "per_token", "multi", "repacked"};
static const int n_toks[] = {1, 2, 4, 8, 16, 32, 64};
#define N_NTOK ((int)(sizeof n_toks / sizeof n_toks[0]))

typedef struct {
    const ops_matrix *w;
    const char *act; /* (n_tok, act_stride) prepared activations */
    size_t act_stride;
    int n_tok;
    int multi;
    float *y; /* (n_tok, w->rows) */
    _Atomic int next;
} dot_job;

static void dot_run(void *p, int ith, int nth)
{
    dot_job *j = p;
    const ops_matrix *w = j->w;
    (void)ith, (void)nth;
    for (;;) {
        int b = atomic_fetch_add_explicit(&j->next, BLOCK, memory_order_relaxed);
        if (b >= w->rows)
            return;
        int nb = w->rows - b < BLOCK ? w->rows - b : BLOCK;
        const char *rows = (const char *)w->data + (size_t)b * w->row_bytes;
        if (j->multi) {
            quant_dot_rows_multi(w->type, rows, w->row_bytes, nb, j->act, j->act_stride, j->n_tok,
                                 w->cols, j->y + b, (size_t)w->rows);
            continue;
        }
        for (int t = 0; t < j->n_tok; t++)
            quant_dot_rows(w->type, rows, w->row_bytes, nb, j->act + (size_t)t * j->act_stride,
                           w->cols, j->y + (size_t)t * w->rows + b);
    }
}

/* The TinyLlama-1.1B matrices (rows, cols): q and o, k and v, gate and up, down, and
 * the vocabulary output; a layer is q, k, v, o, gate, up, down. */
static const int shapes[N_SHAPES][2] = {{2048, 2048}, {256, 2048}, {5632, 2048}, {2048, 5632},
                                        {32000, 2048}};
static const int layer_shapes[] = {0, 1, 1, 0, 2, 2, 3};
#define LAYER_MATS ((int)(sizeof layer_shapes / sizeof layer_shapes[0]))

/* One product of the given way ("repacked" is ops_matmul on the matrix repacked). */
static void product(int way, tp_pool *pool, const ops_matrix *w, const float *x, int n_tok,
                    float *y, void *scratch, char *act)
{
    if (way == 0 || way == 3) {
        ops_matmul(pool, w, x, n_tok, y, scratch);
    } else {
        uint32_t at = quant_dot_activation_type(w->type);
        size_t stride = (quant_row_bytes(at, w->cols) + 63) & ~(size_t)63;
        for (int t = 0; t < n_tok; t++)
            quant_prepare_activation(at, x + (size_t)t * w->cols, act + (size_t)t * stride, w->cols);
        dot_job j = {.w = w, .act = act, .act_stride = stride, .n_tok = n_tok, .multi = way == 2,
                     .y = y};
        atomic_init(&j.next, 0);
        tp_run(pool, dot_run, &j);
    }
}

/* One step over n_mat matrices (wr: the same repacked); returns its seconds. */
static double step(int way, tp_pool *pool, const ops_matrix *w, const ops_matrix *wr, int n_mat,
                   const float *x, int n_tok, float *y, void *scratch, char *act)
{
    double t0 = bench_now_s();
    for (int i = 0; i < n_mat; i++)
        product(way, pool, way == 3 ? &wr[i] : &w[i], x, n_tok, y, scratch, act);
    return bench_now_s() - t0;
}

/* Fills the rows of w with copies of DISTINCT_ROWS quantized rows of x. */
static void fill_matrix(uint32_t t, uint8_t *w, int rows, int cols, const float *x)
{
    size_t rb = quant_row_bytes(t, cols);
    for (int r = 0; r < DISTINCT_ROWS; r++)
        quant_quantize_row(t, x + (size_t)r * cols, w + (size_t)r * rb, cols);
    for (int r = DISTINCT_ROWS; r < rows; r++)
        memcpy(w + (size_t)r * rb, w + (size_t)(r % DISTINCT_ROWS) * rb, rb);
}

/* Times every way at every n_tok over the n_mat matrices and prints the lines; wr holds
 * them repacked, or is NULL where the CPU has no repacked kernel for their type. */
static void measure(tp_pool *pool, const char *name, const ops_matrix *w, const ops_matrix *wr,
                    int n_mat, const float *x, float *y, void *scratch, char *act)
{
    int n_ways = wr ? N_WAYS : N_WAYS - 1;
    double med[N_WAYS][N_NTOK], bytes = 0;
    for (int i = 0; i < n_mat; i++)
        bytes += (double)w[i].row_bytes * w[i].rows;
    /* the ways take turns, so that load from other processes falls on all alike */
    for (int ni = 0; ni < N_NTOK; ni++) {
        double s[N_WAYS][REPS];
        for (int way = 0; way < n_ways; way++) /* warm-up */
            step(way, pool, w, wr, n_mat, x, n_toks[ni], y, scratch, act);
        for (int k = 0; k < REPS; k++)
            for (int way = 0; way < n_ways; way++)
                s[way][k] = step(way, pool, w, wr, n_mat, x, n_toks[ni], y, scratch, act);
        for (int way = 0; way < n_ways; way++)
            med[way][ni] = bench_median(s[way], REPS);
    }
    for (int ni = 0; ni < N_NTOK; ni++)
        for (int way = 0; way < n_ways; way++) {
            int n = n_toks[ni];
            double t = med[way][ni];
            printf("{\"bench\":\"matmul_batch\",\"type\":\"%s\",\"shape\":\"%s\","
                   "\"n_tok\":%d,\"way\":\"%s\",\"ms\":%.4f,\"weight_gb_s\":%.2f,"
                   "\"agg_speedup\":%.2f,\"vs_per_token\":%.2f}\n",
                   quant_traits_of(w[0].type)->name, name, n, way_names[way], t * 1e3,
                   bytes / t * 1e-9, med[way][0] * n / t, med[1][ni] / t);
        }
    fflush(stdout);
}

int main(void)
{
    static const uint32_t types[] = {QTYPE_Q8_0, QTYPE_Q4_K};
    char err[ERR_MAX];
    tp_pool *pool = tp_new(2, err);
    if (!pool || ops_init(err) != 0) {
        fprintf(stderr, "matmul_batch: %s\n", err);
        return 1;
    }
    enum { MAX_COLS = 5632, MAX_ROWS = 32000 };
    size_t layer_bytes = 0;
    for (int i = 0; i < LAYER_MATS; i++)
        layer_bytes += quant_row_bytes(QTYPE_Q8_0, shapes[layer_shapes[i]][1]) *
                       (size_t)shapes[layer_shapes[i]][0];
    size_t out_bytes = quant_row_bytes(QTYPE_Q8_0, 2048) * (size_t)MAX_ROWS;
    size_t max_bytes = LAYERS * layer_bytes > out_bytes ? LAYERS * layer_bytes : out_bytes;
    uint8_t *wbuf = malloc(max_bytes), *rbuf = malloc(max_bytes);
    float *x = malloc((size_t)MAX_TOK * MAX_COLS * sizeof(float));
    float *y = malloc((size_t)MAX_TOK * MAX_ROWS * sizeof(float));
    char *act = malloc((size_t)MAX_TOK * (quant_row_bytes(QTYPE_Q8_K, MAX_COLS) + 64));
    void *scratch = malloc(ops_matmul_scratch_bytes(MAX_TOK, MAX_COLS, 2));
    if (!wbuf || !rbuf || !x || !y || !act || !scratch) {
        fprintf(stderr, "matmul_batch: out of memory\n");
        return 1;
    }
    srand(1);
    for (size_t i = 0; i < (size_t)MAX_TOK * MAX_COLS; i++)
        x[i] = (float)rand() / RAND_MAX - 0.5f;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        uint32_t t = types[ti];
        bool repack = quant_repack_kernel(t);
        for (int si = 0; si < N_SHAPES; si++) {
            int rows = shapes[si][0], cols = shapes[si][1];
            char name[32];
            fill_matrix(t, wbuf, rows, cols, x);
            ops_matrix w = {.type = t, .data = wbuf, .rows = rows, .cols = cols,
                            .row_bytes = quant_row_bytes(t, cols)}, wr;
            if (repack)
                ops_matrix_repack(&w, rbuf, &wr);
            snprintf(name, sizeof name, "%dx%d", rows, cols);
            measure(pool, name, &w, repack ? &wr : NULL, 1, x, y, scratch, act);
        }
        ops_matrix ws[LAYERS * LAYER_MATS], wrs[LAYERS * LAYER_MATS];
        uint8_t *p = wbuf;
        for (int i = 0; i < LAYERS * LAYER_MATS; i++) {
            int rows = shapes[layer_shapes[i % LAYER_MATS]][0];
            int cols = shapes[layer_shapes[i % LAYER_MATS]][1];
            fill_matrix(t, p, rows, cols, x);
            ws[i] = (ops_matrix){.type = t, .data = p, .rows = rows, .cols = cols,
                                 .row_bytes = quant_row_bytes(t, cols)};
            if (repack)
                ops_matrix_repack(&ws[i], rbuf + (p - wbuf), &wrs[i]);
            p += ws[i].row_bytes * (size_t)rows;
        }
        measure(pool, "layers", ws, repack ? wrs : NULL, LAYERS * LAYER_MATS, x, y, scratch, act);
    }
    free(wbuf);
    free(rbuf);
    free(x);
    free(y);
    free(act);
    free(scratch);
    tp_free(pool);
    return 0;
}
