/*
 * bench/repack_decode — batched decode on Q8_0 weights as the file stores them against the
 * same weights repacked (model_repack_weights), the two alternating step by step in one
 * process, so that load from other processes falls on both alike.
 *
 *   build/bench/repack_decode --model FILE [-t THREADS] [--steps D] [--prefix P]
 *
 * The model is loaded twice (mapped: the file's pages are shared), once repacked. For N
 * in 1, 4 and 16 sequences, each holding a P-token prefix (default 32), D decode steps
 * (default 24) of one model_forward_batch of N rows, plain and repacked in turn (which
 * goes first alternates). Per N, one JSON object: the median step time of each, tokens/s,
 * the speedup (plain over repacked), and with -t 1 (the default) the same from the thread's
 * CPU time, which does not count the time other processes hold the core; and whether the
 * two gave the same logits (max_rel_diff, relative to the largest logit of the last step):
 * with 16 rows both sum as the scalar kernel does (0); with 1 and 4 the plain kernels order
 * the f32 additions otherwise, ~1e-7 on the trained TinyStories-656K-Q8_0, while the
 * random weights of generated models amplify that through the layers and steps to ~1-2%.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench.h"
#include "engine/kv/kv.h"
#include "engine/model/model.h"

#define MAX_N 16

static const int N_SEQ[] = {1, 4, 16};

/* One model, its runner and MAX_N sequences holding the same prefix. */
typedef struct side {
    model *m;
    model_runner *r;
    kv_pool *pool;
    kv_seq seq[MAX_N];
    int n_init;
    float *logits; /* (MAX_N, n_vocab) */
} side;

static double thread_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int side_open(side *s, const char *path, bool repack, int threads, int prefix, int steps)
{
    char err[ERR_MAX];
    memset(s, 0, sizeof *s);
    s->m = model_load(path, err);
    if (!s->m || (repack && model_repack_weights(s->m, err) < 0)) {
        fprintf(stderr, "repack_decode: %s\n", err);
        return -1;
    }
    int nv = model_hparams_of(s->m)->n_vocab;
    s->r = model_runner_new(s->m, threads, MAX_N, prefix + steps + 1, err);
    s->pool = s->r ? kv_pool_new(model_kv_shape(s->m), 0, err) : NULL;
    s->logits = malloc(sizeof(float) * MAX_N * (size_t)nv);
    int32_t *tok = malloc(sizeof *tok * (size_t)prefix), *pos = malloc(sizeof *pos * (size_t)prefix);
    int rc = s->pool && s->logits && tok && pos ? 0 : -1;
    for (int i = 0; i < prefix && rc == 0; i++)
        tok[i] = (int32_t)(3 + (i * 37) % (nv - 3)), pos[i] = i;
    for (; s->n_init < MAX_N && rc == 0; s->n_init++) {
        kv_seq_init(&s->seq[s->n_init], s->pool);
        model_batch b = {.n_tokens = prefix, .tokens = tok, .positions = pos};
        rc = model_forward(s->r, &s->seq[s->n_init], &b, err);
    }
    if (rc < 0)
        fprintf(stderr, "repack_decode: %s\n", err);
    free(tok);
    free(pos);
    return rc;
}

static void side_close(side *s)
{
    for (int i = 0; i < s->n_init; i++)
        kv_seq_free(&s->seq[i]);
    kv_pool_free(s->pool);
    model_runner_free(s->r);
    free(s->logits);
    model_free(s->m);
}

/* Step k of n sequences (token and position from k): wall and thread CPU seconds. */
static int step(side *s, int n, int prefix, int k, double *wall, double *cpu)
{
    char err[ERR_MAX];
    int nv = model_hparams_of(s->m)->n_vocab;
    model_batch b[MAX_N];
    kv_seq *seqs[MAX_N];
    int32_t tok[MAX_N], pos[MAX_N], row0 = 0;
    for (int i = 0; i < n; i++) {
        tok[i] = (int32_t)(3 + (i * 101 + k * 7) % (nv - 3));
        pos[i] = prefix + k;
        seqs[i] = &s->seq[i];
        b[i] = (model_batch){.n_tokens = 1, .tokens = &tok[i], .positions = &pos[i], .n_out = 1,
                             .out_rows = &row0, .logits = s->logits + (size_t)i * nv};
    }
    double w0 = bench_now_s(), c0 = thread_cpu_s();
    if (model_forward_batch(s->r, n, seqs, b, err) < 0) {
        fprintf(stderr, "repack_decode: forward: %s\n", err);
        return -1;
    }
    *cpu = thread_cpu_s() - c0;
    *wall = bench_now_s() - w0;
    return 0;
}

int main(int argc, char **argv)
{
    const char *path = NULL;
    int threads = 1, steps = 24, prefix = 32;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model"))
            path = argv[i + 1];
        else if (!strcmp(argv[i], "-t"))
            threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps"))
            steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--prefix"))
            prefix = atoi(argv[i + 1]);
        else
            path = NULL, i = argc;
    }
    if (!path || threads < 1 || steps < 1 || steps > 4096 || prefix < 1 || prefix > 4096) {
        fprintf(stderr, "usage: repack_decode --model FILE [-t THREADS] [--steps D] [--prefix P]\n");
        return 2;
    }
    side sd[2]; /* 0: as stored, 1: repacked */
    memset(sd, 0, sizeof sd);
    int rc = side_open(&sd[0], path, false, threads, prefix, steps);
    if (rc == 0)
        rc = side_open(&sd[1], path, true, threads, prefix, steps);
    double *t = malloc(sizeof *t * 4 * (size_t)steps);
    if (rc == 0 && !t)
        rc = -1;
    int nv = rc == 0 ? model_hparams_of(sd[0].m)->n_vocab : 0;
    for (size_t ni = 0; rc == 0 && ni < sizeof N_SEQ / sizeof N_SEQ[0]; ni++) {
        int n = N_SEQ[ni];
        double *wall[2] = {t, t + steps}, *cpu[2] = {t + 2 * steps, t + 3 * steps};
        double diff = 0, scale = 0;
        for (int k = 0; k < steps && rc == 0; k++)
            for (int j = 0; j < 2 && rc == 0; j++) {
                int v = (k + j) % 2;
                rc = step(&sd[v], n, prefix, k, &wall[v][k], &cpu[v][k]);
            }
        for (size_t i = 0; rc == 0 && i < (size_t)n * nv; i++) {
            double d = fabs((double)sd[0].logits[i] - sd[1].logits[i]);
            diff = d > diff ? d : diff;
            scale = fabs(sd[0].logits[i]) > scale ? fabs(sd[0].logits[i]) : scale;
        }
        for (int v = 0; v < 2; v++)
            for (int i = 0; i < n; i++)
                kv_seq_truncate(&sd[v].seq[i], prefix);
        if (rc < 0)
            break;
        double wp = bench_median(wall[0], steps), wr = bench_median(wall[1], steps);
        double cp = bench_median(cpu[0], steps), cr = bench_median(cpu[1], steps);
        printf("{\"bench\":\"repack_decode\",\"model\":\"%s\",\"threads\":%d,\"steps\":%d,"
               "\"prefix\":%d,\"n_seq\":%d,\"plain_ms\":%.2f,\"repacked_ms\":%.2f,"
               "\"plain_tok_s\":%.2f,\"repacked_tok_s\":%.2f,\"speedup\":%.3f",
               path, threads, steps, prefix, n, wp * 1e3, wr * 1e3, n / wp, n / wr, wp / wr);
        if (threads == 1)
            printf(",\"plain_cpu_ms\":%.2f,\"repacked_cpu_ms\":%.2f,\"cpu_speedup\":%.3f",
                   cp * 1e3, cr * 1e3, cp / cr);
        printf(",\"max_rel_diff\":%.3g}\n", scale > 0 ? diff / scale : diff);
        fflush(stdout);
    }
    free(t);
    side_close(&sd[0]);
    side_close(&sd[1]);
    return rc == 0 ? 0 : 1;
}
