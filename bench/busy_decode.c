/*
 * bench/busy_decode — decode speed when other processes use the cores.
 *
 *   build/bench/busy_decode [-t THREADS] [-r RUNS] [-n TOKENS] [--model FILE]
 *
 * A laptop or phone running llmsd also runs other programs. This measures one sequence's
 * decode tokens/s (a 16-token prompt, then TOKENS greedy tokens, default 128) with:
 *   - 1 thread on an idle machine (the baseline every ratio is to),
 *   - THREADS threads (default: online cores) on an idle machine,
 *   - 1 thread and THREADS threads while one busy process spins on a core,
 * the THREADS cases both with the pool's adaptation (the default) and with every job on
 * every thread (LLMS_THREADS_FIXED=1, the behaviour before it). Target: with the defaults
 * and one busy process, at least 0.6 of the 1-thread idle speed.
 * Runs of all cases alternate; each figure is the median over RUNS (default 3). One JSON
 * object per case: tok_s, ratio_to_1_thread_idle, threads_active (the pool's thread
 * count at the end of the last run).
 *
 * Without --model it generates the llama-shaped Q8_0 model of bench/batch_decode (~125M
 * parameters) into build/bench-models/ on first use.
 */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench.h"
#include "engine/kv/kv.h"
#include "engine/model/model.h"
#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"

#define MAX_RUNS 15
#define PROMPT 16

typedef struct bench_case {
    const char *name;
    bool all_threads;  /* THREADS threads, else 1 */
    bool busy;         /* one busy process beside it */
    bool fixed;        /* LLMS_THREADS_FIXED=1 */
    double tok_s[MAX_RUNS];
    int threads_active;
} bench_case;

static int ensure_model(char *path, size_t cap)
{
    modelgen_params p = {.arch = "llama", .dim = 768, .n_layer = 12, .n_head = 12,
                         .n_head_kv = 4, .n_ff = 2048, .n_ctx = 2048, .type = QTYPE_Q8_0,
                         .seed = 1, .n_vocab = 32000};
    snprintf(path, cap, "build/bench-models/batch-llama-%dx%d-h%d-kv%d-ff%d-v%d-q8_0.gguf",
             p.dim, p.n_layer, p.n_head, p.n_head_kv, p.n_ff, p.n_vocab);
    return bench_generate_model("busy_decode", &p, path);
}

/* A child that spins until it is killed (or its parent dies). */
static pid_t start_busy(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        volatile unsigned long x = 0;
        for (;;)
            x++;
    }
    return pid;
}

static void stop_busy(pid_t pid)
{
    if (pid <= 0)
        return;
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* One run of a case: a fresh runner (so that the pool starts as a daemon's would), the
 * prompt, then n_tokens decode steps; tokens/s of the decode, or -1. */
static double run_case(const model *m, bench_case *bc, int n_threads, int n_tokens)
{
    char err[ERR_MAX];
    if (bc->fixed)
        setenv("LLMS_THREADS_FIXED", "1", 1);
    else
        unsetenv("LLMS_THREADS_FIXED");
    const model_hparams *hp = model_hparams_of(m);
    model_runner *r = model_runner_new(m, bc->all_threads ? n_threads : 1, 64,
                                       PROMPT + n_tokens + 1, err);
    kv_pool *pool = r ? kv_pool_new(model_kv_shape(m), 0, err) : NULL;
    float *logits = malloc(sizeof *logits * (size_t)hp->n_vocab);
    double tok_s = -1;
    kv_seq seq;
    bool seq_init = false;
    pid_t busy = -1;
    if (!pool || !logits) {
        fprintf(stderr, "busy_decode: %s\n", pool ? "out of memory" : err);
        goto out;
    }
    kv_seq_init(&seq, pool);
    seq_init = true;
    int32_t tok[PROMPT], pos[PROMPT], last = PROMPT - 1;
    for (int i = 0; i < PROMPT; i++)
        tok[i] = (int32_t)(3 + (i * 7919) % (hp->n_vocab - 3)), pos[i] = i;
    model_batch pre = {.n_tokens = PROMPT, .tokens = tok, .positions = pos, .n_out = 1,
                       .out_rows = &last, .logits = logits};
    if (bc->busy && (busy = start_busy()) < 0) {
        fprintf(stderr, "busy_decode: fork: %s\n", strerror(errno));
        goto out;
    }
    if (model_forward(r, &seq, &pre, err) < 0) {
        fprintf(stderr, "busy_decode: prompt: %s\n", err);
        goto out;
    }
    double t0 = bench_now_s();
    if (bench_decode_greedy(r, &seq, logits, hp->n_vocab, PROMPT, n_tokens, err) < 0) {
        fprintf(stderr, "busy_decode: decode: %s\n", err);
        goto out;
    }
    tok_s = n_tokens / (bench_now_s() - t0);
    bc->threads_active = model_runner_n_threads_active(r);
out:
    stop_busy(busy);
    if (seq_init)
        kv_seq_free(&seq);
    kv_pool_free(pool);
    model_runner_free(r);
    free(logits);
    unsetenv("LLMS_THREADS_FIXED");
    return tok_s;
}

static int parse_count(const char *flag, const char *s, int min, int max, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < min || v > max) {
        fprintf(stderr, "busy_decode: %s wants a number in [%d, %d], not '%s'\n", flag, min,
                max, s);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int main(int argc, char **argv)
{
    int n_threads = (int)sysconf(_SC_NPROCESSORS_ONLN), n_runs = 3, n_tokens = 128;
    const char *model_path = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (!strcmp(a, "-t") && v)
            rc = parse_count(a, v, 1, 1024, &n_threads), i++;
        else if (!strcmp(a, "-r") && v)
            rc = parse_count(a, v, 1, MAX_RUNS, &n_runs), i++;
        else if (!strcmp(a, "-n") && v)
            rc = parse_count(a, v, 1, 1 << 16, &n_tokens), i++;
        else if (!strcmp(a, "--model") && v)
            model_path = v, i++;
        else {
            fprintf(stderr, "usage: busy_decode [-t THREADS] [-r RUNS] [-n TOKENS] "
                            "[--model FILE]\n");
            return 2;
        }
        if (rc)
            return 2;
    }
    char path[512], err[ERR_MAX];
    if (!model_path) {
        if (ensure_model(path, sizeof path))
            return 1;
        model_path = path;
    }
    model *m = model_load(model_path, err);
    if (!m) {
        fprintf(stderr, "busy_decode: %s\n", err);
        return 1;
    }
    bench_case cases[] = {
        {.name = "1_thread_idle"},
        {.name = "threads_idle", .all_threads = true},
        {.name = "threads_idle_fixed", .all_threads = true, .fixed = true},
        {.name = "1_thread_busy", .busy = true},
        {.name = "threads_busy", .all_threads = true, .busy = true},
        {.name = "threads_busy_fixed", .all_threads = true, .busy = true, .fixed = true},
    };
    int n_cases = (int)(sizeof cases / sizeof *cases);
    bench_case warm = {.all_threads = true};
    if (run_case(m, &warm, n_threads, 16) < 0) {
        model_free(m);
        return 1;
    }
    for (int run = 0; run < n_runs; run++)
        for (int k = 0; k < n_cases; k++)
            if ((cases[k].tok_s[run] = run_case(m, &cases[k], n_threads, n_tokens)) < 0) {
                model_free(m);
                return 1;
            }
    double base = 0;
    for (int k = 0; k < n_cases; k++) {
        double med = bench_median(cases[k].tok_s, n_runs);
        if (k == 0)
            base = med;
        printf("{\"bench\":\"busy_decode\",\"model\":\"%s\",\"case\":\"%s\",\"threads\":%d,"
               "\"busy_procs\":%d,\"adaptive\":%s,\"runs\":%d,\"tokens\":%d,\"tok_s\":%.2f,"
               "\"ratio_to_1_thread_idle\":%.3f,\"threads_active\":%d}\n",
               model_path, cases[k].name, cases[k].all_threads ? n_threads : 1,
               cases[k].busy ? 1 : 0, cases[k].fixed ? "false" : "true", n_runs, n_tokens,
               med, med / base, cases[k].threads_active);
        fflush(stdout);
    }
    model_free(m);
    return 0;
}
