/*
 * multigen — two generate models in one llmsd against one llmsd per model, as JSON lines
 * on stdout.
 *
 *   multigen [--streams N] [--tokens N] [--runs N] [--threads N] [--llmsd PATH]
 *
 * Two random-weight llama models of the same shape but different weights (about 30M
 * parameters, Q8_0, on the llama SPM vocabulary of the test data when it is there), kept
 * in build/bench-models/. Three daemons of this build run side by side: "one" serves
 * both models (model = A, model.b = B), "two" is a daemon per model. Each run, in turn:
 *   one:   --streams (default 4) greedy Completes of --tokens (default 256) tokens on each
 *          model at once, in the daemon that serves both;
 *   two:   the same streams, each model's in its own daemon;
 *   alone: the streams of model A only, in the daemon that serves both (B idle).
 * Aggregate generated tokens/s per system, median of --runs (default 5) runs, the
 * systems interleaved within each run so that load from other processes falls on all
 * alike; one/two is the ratio (the median of each run's ratio, beside the ratio of the
 * medians), and alone/A-in-two says what an idle second model costs.
 * Greedy texts of "one" are compared with "two"'s (equal unless the batched rows of
 * the two daemons differ in float rounding).
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench/bench.h"
#include "client/llms.h"
#include "engine/gguf/gguf.h"
#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"

#define MAX_STREAMS 16

typedef struct stream {
    const char *sock;
    const char *model;   /* registry name, or NULL: the daemon's default */
    int index;
    int tokens;
    uint32_t generated;
    char *text;
    enum llms_status status;
} stream;

static void *stream_main(void *arg)
{
    stream *st = arg;
    llms_conn *c;
    char app[32], prompt[64];
    snprintf(app, sizeof app, "mg%d-%s", st->index, st->model ? st->model : "d");
    snprintf(prompt, sizeof prompt, "Story %d: once upon a time", st->index);
    st->status = llms_connect(st->sock, &c, NULL);
    if (st->status != LLMS_OK)
        return NULL;
    if ((st->status = llms_bind(c, app)) == LLMS_OK) {
        llms_params p;
        llms_params_init(&p);
        p.temperature = 0;
        p.max_tokens = st->tokens;
        p.model = st->model;
        llms_result r;
        st->status = llms_complete(c, prompt, NULL, 0, &p, NULL, NULL, &r);
        if (st->status == LLMS_OK) {
            st->generated = r.generated_tokens;
            st->text = strdup(r.text);
            llms_result_free(&r);
        }
    }
    llms_close(c);
    return NULL;
}

/* Runs n streams (socks[i], models[i]) at once: generated tokens per second, texts kept
 * in st (the caller frees them). -1 when a stream failed. */
static double run_streams(stream *st, int n)
{
    pthread_t th[2 * MAX_STREAMS];
    double t0 = bench_now_s();
    for (int i = 0; i < n; i++)
        pthread_create(&th[i], NULL, stream_main, &st[i]);
    uint64_t tokens = 0;
    bool ok = true;
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        tokens += st[i].generated;
        if (st[i].status != LLMS_OK) {
            fprintf(stderr, "multigen: stream %d: status %d\n", i, (int)st[i].status);
            ok = false;
        }
    }
    double s = bench_now_s() - t0;
    return ok && s > 0 ? (double)tokens / s : -1;
}

static void free_texts(stream *st, int n)
{
    for (int i = 0; i < n; i++) {
        free(st[i].text);
        st[i].text = NULL;
    }
}

static int make_models(char paths[2][1024])
{
    char vocab_path[1024], err[ERR_MAX];
    const char *dir = getenv("LLMS_TESTDATA") ? getenv("LLMS_TESTDATA") : "../shared/testdata";
    snprintf(vocab_path, sizeof vocab_path, "%s/vocab/ggml-vocab-llama-spm.gguf", dir);
    gguf_file *vocab = access(vocab_path, R_OK) == 0 ? gguf_open(vocab_path, err) : NULL;
    if (!vocab)
        fprintf(stderr, "multigen: %s is absent: synthetic vocabulary\n", vocab_path);
    int rc = 0;
    for (int m = 0; m < 2 && rc == 0; m++) {
        snprintf(paths[m], 1024, "build/bench-models/multigen-%s%c.gguf", vocab ? "" : "syn-",
                 'a' + m);
        modelgen_params mp = {.arch = "llama", .dim = 512, .n_layer = 6, .n_head = 8,
                              .n_head_kv = 8, .n_ff = 1536, .n_ctx = 1024,
                              .type = QTYPE_Q8_0, .seed = (uint64_t)(11 + m),
                              .n_vocab = 32000, .vocab = vocab, .n_threads = 2};
        rc = bench_generate_model("multigen", &mp, paths[m]);
    }
    gguf_close(vocab);
    return rc;
}

static void usage(void)
{
    fprintf(stderr, "usage: multigen [--streams N] [--tokens N] [--runs N] [--threads N] "
                    "[--llmsd PATH]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    int n_streams = 4, tokens = 256, runs = 5, threads = 0;
    char llmsd[1024];
    snprintf(llmsd, sizeof llmsd, "build/llmsd");
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc)
            usage();
        int v = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--llmsd"))
            snprintf(llmsd, sizeof llmsd, "%s", argv[i + 1]);
        else if (!strcmp(argv[i], "--streams") && v > 0 && v <= MAX_STREAMS)
            n_streams = v;
        else if (!strcmp(argv[i], "--tokens") && v > 0)
            tokens = v;
        else if (!strcmp(argv[i], "--runs") && v > 0)
            runs = v;
        else if (!strcmp(argv[i], "--threads") && v >= 0)
            threads = v;
        else
            usage();
        i++;
    }
    if (access(llmsd, X_OK) != 0) {
        fprintf(stderr, "multigen: run from the repository root after make (no %s)\n", llmsd);
        return 1;
    }
    char paths[2][1024];
    if (make_models(paths))
        return 1;
    char dir[] = "/tmp/llms-multigen-XXXXXX";
    if (!mkdtemp(dir)) {
        fprintf(stderr, "multigen: mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    /* daemon 0 serves both; 1 and 2 one model each */
    pid_t pid[3] = {0, 0, 0};
    char socks[3][600];
    int rc = 1;
    for (int d = 0; d < 3; d++) {
        char sub[512], conf[3000];
        snprintf(sub, sizeof sub, "%s/d%d", dir, d);
        mkdir(sub, 0755);
        snprintf(conf, sizeof conf,
                 "model = %s\n%s%s%sthreads = %d\nkv_budget_mb = 0\nmax_tokens = %d\n",
                 paths[d == 2 ? 1 : 0], d == 0 ? "model.b = " : "", d == 0 ? paths[1] : "",
                 d == 0 ? "\n" : "", threads, tokens);
        if ((pid[d] = bench_llmsd_start("multigen", llmsd, sub, conf, socks[d],
                                        sizeof socks[d])) <= 0)
            goto out;
    }
    double one[64], two[64], alone[64], a_in_two[64], r_two[64], r_alone[64];
    int equal = 0, compared = 0;
    if (runs > 64)
        runs = 64;
    for (int r = 0; r < runs; r++) {
        stream s1[2 * MAX_STREAMS], s2[2 * MAX_STREAMS], s3[MAX_STREAMS], s4[MAX_STREAMS];
        for (int i = 0; i < 2 * n_streams; i++) {
            bool b = i >= n_streams;
            int k = i % n_streams;
            s1[i] = (stream){.sock = socks[0], .model = b ? "b" : NULL, .index = k,
                             .tokens = tokens};
            s2[i] = (stream){.sock = socks[b ? 2 : 1], .index = k, .tokens = tokens};
        }
        for (int i = 0; i < n_streams; i++) {
            s3[i] = (stream){.sock = socks[0], .index = i, .tokens = tokens};
            s4[i] = (stream){.sock = socks[1], .index = i, .tokens = tokens};
        }
        one[r] = run_streams(s1, 2 * n_streams);
        two[r] = run_streams(s2, 2 * n_streams);
        alone[r] = run_streams(s3, n_streams);
        a_in_two[r] = run_streams(s4, n_streams);
        for (int i = 0; i < 2 * n_streams; i++, compared++)
            equal += s1[i].text && s2[i].text && strcmp(s1[i].text, s2[i].text) == 0;
        free_texts(s1, 2 * n_streams);
        free_texts(s2, 2 * n_streams);
        free_texts(s3, n_streams);
        free_texts(s4, n_streams);
        if (one[r] < 0 || two[r] < 0 || alone[r] < 0 || a_in_two[r] < 0)
            goto out;
        r_two[r] = one[r] / two[r];
        r_alone[r] = alone[r] / a_in_two[r];
        fprintf(stderr, "multigen: run %d: one %.1f, two %.1f, alone %.1f, A's daemon %.1f "
                        "tok/s\n", r + 1, one[r], two[r], alone[r], a_in_two[r]);
    }
    double m_one = bench_median(one, runs), m_two = bench_median(two, runs);
    double m_alone = bench_median(alone, runs), m_a = bench_median(a_in_two, runs);
    printf("{\"bench\":\"multigen\",\"system\":\"one_daemon_two_models\",\"streams_per_model\":%d,"
           "\"tokens\":%d,\"runs\":%d,\"tokens_per_s\":%.1f,\"ratio_vs_two_daemons\":%.3f,"
           "\"median_run_ratio\":%.3f,\"greedy_equal\":%d,\"greedy_compared\":%d}\n",
           n_streams, tokens, runs, m_one, m_two > 0 ? m_one / m_two : 0,
           bench_median(r_two, runs), equal, compared);
    printf("{\"bench\":\"multigen\",\"system\":\"two_daemons\",\"streams_per_model\":%d,"
           "\"tokens\":%d,\"runs\":%d,\"tokens_per_s\":%.1f}\n",
           n_streams, tokens, runs, m_two);
    printf("{\"bench\":\"multigen\",\"system\":\"model_a_beside_idle_b\",\"streams\":%d,"
           "\"tokens\":%d,\"runs\":%d,\"tokens_per_s\":%.1f,\"ratio_vs_a_alone\":%.3f,"
           "\"median_run_ratio\":%.3f}\n",
           n_streams, tokens, runs, m_alone, m_a > 0 ? m_alone / m_a : 0,
           bench_median(r_alone, runs));
    rc = 0;
out:
    for (int d = 0; d < 3; d++)
        bench_llmsd_stop(pid[d]);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "multigen: could not remove %s\n", dir);
    return rc;
}
