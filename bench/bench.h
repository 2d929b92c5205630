/*
 * bench.h — timing and statistics the benchmark programs share (header-only, since every
 * benchmark source file is a program of its own).
 */
#ifndef LLMS_BENCH_H
#define LLMS_BENCH_H

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client/llms.h"
#include "engine/model/model.h"
#include "engine/gguf/modelgen.h"
#include "storage/ivf.h"

/* Seconds on the monotonic clock. */
static inline double bench_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline int bench_compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of n values (n > 0); sorts v in place. */
static inline double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, bench_compare_doubles);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* A uniform double in (0, 1) from the xorshift64 generator *state (never 0). */
static inline double bench_uniform(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return ((double)(*state >> 11) + 0.5) / 9007199254740992.0;
}

/* A standard normal deviate from *state (Box-Muller). */
static inline double bench_gauss(uint64_t *state)
{
    double radius = sqrt(-2.0 * log(bench_uniform(state)));
    return radius * cos(6.283185307179586 * bench_uniform(state));
}

/* The q-quantile (0..1, nearest rank) of n values (n > 0); sorts v in place. */
static inline double bench_percentile(double *v, int n, double q)
{
    qsort(v, (size_t)n, sizeof *v, bench_compare_doubles);
    int i = (int)(q * (n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

/* Searches queries (n_q, dim) of ix to the end under p with hints (NULL: none): each
 * query's p->k best into hits (n_q, p->k; id -1 past its results) and the work into st.
 * -1 with a message on stderr when the search cannot start. */
static inline int bench_ivf_search(ivf *ix, const float *q, int n_q, int dim,
                                   const ivf_search_params *p, const ivf_hints *hints,
                                   ivf_hit *hits, ivf_search_stats *st)
{
    char err[ERR_MAX];
    ivf_search *s = ivf_search_begin(ix, q, n_q, dim, p, hints, err);
    if (!s) {
        fprintf(stderr, "ivf search: %s\n", err);
        return -1;
    }
    while (!ivf_search_step(s, 1 << 30))
        ;
    for (int a = 0; a < n_q; a++) {
        int got = ivf_search_results(s, a, hits + (size_t)a * p->k);
        for (int i = got; i < p->k; i++)
            hits[(size_t)a * p->k + i] = (ivf_hit){-1, 0, -1};
    }
    ivf_search_get_stats(s, st);
    ivf_search_free(s);
    return 0;
}

/* Index of the largest of v[0..n) (greedy decoding). */
static inline int32_t bench_argmax(const float *v, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return best;
}

/* Greedy decode of n tokens onto seq, at positions from pos0 on, the first chosen from
 * logits (the last token's, which each step overwrites). 0, or -1 + err. */
static inline int bench_decode_greedy(model_runner *r, kv_seq *seq, float *logits,
                                      int n_vocab, int pos0, int n, char err[ERR_MAX])
{
    for (int i = 0; i < n; i++) {
        int32_t next = bench_argmax(logits, n_vocab), pos = pos0 + i, row = 0;
        model_batch d = {
            .n_tokens = 1, .tokens = &next, .positions = &pos,
            .n_out = 1, .out_rows = &row, .logits = logits,
        };
        if (model_forward(r, seq, &d, err))
            return -1;
    }
    return 0;
}

/* Makes the random-weight model p describes at path (under build/bench-models/) unless
 * it exists; prog names the benchmark in messages. 0, or -1 after saying why. */
static inline int bench_generate_model(const char *prog, const modelgen_params *p,
                                       const char *path)
{
    if (access(path, R_OK) == 0)
        return 0;
    if (mkdir("build/bench-models", 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "%s: build/bench-models: %s\n", prog, strerror(errno));
        return -1;
    }
    fprintf(stderr, "%s: generating %s\n", prog, path);
    char err[ERR_MAX];
    if (modelgen_write(p, path, err) < 0) {
        fprintf(stderr, "%s: %s\n", prog, err);
        unlink(path);
        return -1;
    }
    return 0;
}

/* Starts llmsd (path llmsd) with the settings conf (lines "key = value") plus a socket
 * and state under dir, its log in dir/llmsd.log; waits until it accepts connections.
 * The daemon's pid, or -1 after saying why (prog names the benchmark). */
static inline pid_t bench_llmsd_start(const char *prog, const char *llmsd, const char *dir,
                                      const char *conf, char *sock, size_t cap)
{
    char conf_path[1024], log[1024];
    snprintf(sock, cap, "%s/s", dir);
    snprintf(conf_path, sizeof conf_path, "%s/llmsd.conf", dir);
    snprintf(log, sizeof log, "%s/llmsd.log", dir);
    FILE *f = fopen(conf_path, "w");
    if (!f)
        return -1;
    fprintf(f, "socket = %s\nstate_dir = %s/state\n%s", sock, dir, conf);
    fclose(f);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        if (!freopen(log, "w", stderr))
            _exit(126);
        execl(llmsd, "llmsd", "--config", conf_path, (char *)NULL);
        _exit(127);
    }
    for (double end = bench_now_s() + 60; bench_now_s() < end; usleep(20000)) {
        if (waitpid(pid, NULL, WNOHANG) == pid) {
            fprintf(stderr, "%s: llmsd exited at startup (log: %s)\n", prog, log);
            return -1;
        }
        llms_conn *c;
        if (llms_connect(sock, &c, NULL) == LLMS_OK) {
            llms_close(c);
            return pid;
        }
    }
    fprintf(stderr, "%s: llmsd did not open %s (log: %s)\n", prog, sock, log);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

/* Stops a daemon bench_llmsd_start started (SIGTERM, then waits). */
static inline void bench_llmsd_stop(pid_t pid)
{
    if (pid > 0) {
        kill(pid, SIGTERM);
        waitpid(pid, NULL, 0);
    }
}

#endif
