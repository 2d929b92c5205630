/*
 * service — what the service layer costs, as JSON lines on stdout.
 *
 *   service [--model PATH] [--iters N] [--tokens N] [--threads N]
 *
 * Starts llmsd of the same build on a temporary socket (a generated random-weight
 * model unless --model is given), then measures:
 *   1. a short Complete (one generated token) through the socket versus the same work
 *      done in-process with the engine: p50 of each and the added latency (target:
 *      under 1 ms at p50), and the p50 of a Tokenize round trip (transport alone);
 *   2. aggregate decode tokens/s with 1, 4 and 16 concurrent clients, each on its own
 *      connection and context (target: 16 clients together at least the 1-client rate).
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench.h"
#include "client/llms.h"
#include "engine/kv.h"
#include "engine/model.h"
#include "engine/modelgen.h"
#include "engine/quant.h"
#include "engine/tokenizer.h"

#define PROMPT "Hello, how are you today?"

static pid_t daemon_pid;

static void stop_daemon(void)
{
    if (daemon_pid > 0) {
        kill(daemon_pid, SIGTERM);
        waitpid(daemon_pid, NULL, 0);
        daemon_pid = 0;
    }
}

static int start_daemon(const char *llmsd, const char *dir, const char *model, int threads,
                        char *sock, size_t sock_cap)
{
    char conf[1024], log[1024];
    snprintf(sock, sock_cap, "%s/s", dir);
    snprintf(conf, sizeof conf, "%s/llmsd.conf", dir);
    snprintf(log, sizeof log, "%s/llmsd.log", dir);
    FILE *f = fopen(conf, "w");
    if (!f)
        return -1;
    fprintf(f, "model = %s\nsocket = %s\nstate_dir = %s/state\nthreads = %d\n"
               "max_contexts_per_app = 256\nmax_queued_per_app = 64\nkv_budget_mb = 0\n",
            model, sock, dir, threads);
    fclose(f);
    daemon_pid = fork();
    if (daemon_pid < 0)
        return -1;
    if (daemon_pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0)
            dup2(fd, 2);
        execl(llmsd, "llmsd", "--config", conf, (char *)NULL);
        _exit(127);
    }
    for (double end = bench_now_s() + 60; bench_now_s() < end; usleep(20000)) {
        if (waitpid(daemon_pid, NULL, WNOHANG) == daemon_pid) {
            daemon_pid = 0;
            fprintf(stderr, "service: llmsd exited at startup (log: %s)\n", log);
            return -1;
        }
        llms_conn *c;
        if (llms_connect(sock, &c, NULL) == LLMS_OK) {
            llms_close(c);
            return 0;
        }
    }
    fprintf(stderr, "service: llmsd did not open %s\n", sock);
    return -1;
}

/* The in-process equivalent of a one-token greedy Complete: tokenize, prefill, argmax. */
static int inprocess_latency(const char *path, int threads, int iters, double *out_p50)
{
    char err[ERR_MAX];
    model *m = model_load(path, err);
    tokenizer *tok = NULL;
    if (!m || tok_load(model_gguf(m), &tok, err)) {
        fprintf(stderr, "service: %s: %s\n", path, err);
        model_free(m);
        return -1;
    }
    int n_vocab = model_hparams_of(m)->n_vocab;
    model_runner *run = model_runner_new(m, threads, 0, 512, err);
    kv_pool *pool = run ? kv_pool_new(model_kv_shape(m), 0, err) : NULL;
    float *logits = malloc(sizeof *logits * (size_t)n_vocab);
    double *t = malloc(sizeof *t * (size_t)iters);
    int32_t ids[256], pos[256];
    int rc = -1;
    if (!pool || !logits || !t)
        goto out;
    kv_seq seq;
    kv_seq_init(&seq, pool);
    for (int i = -3; i < iters; i++) { /* three warm-up runs */
        double t0 = bench_now_s();
        int n = tok_encode(tok, PROMPT, strlen(PROMPT), true, false, ids, 256);
        int32_t last = n - 1;
        for (int j = 0; j < n; j++)
            pos[j] = j;
        model_batch b = {.n_tokens = n, .tokens = ids, .positions = pos, .n_out = 1,
                         .out_rows = &last, .logits = logits};
        kv_seq_truncate(&seq, 0);
        if (n <= 0 || model_forward(run, &seq, &b, err)) {
            fprintf(stderr, "service: in-process forward: %s\n", err);
            kv_seq_free(&seq);
            goto out;
        }
        int best = 0;
        for (int v = 1; v < n_vocab; v++)
            if (logits[v] > logits[best])
                best = v;
        char piece[64];
        tok_piece(tok, best, piece, sizeof piece);
        if (i >= 0)
            t[i] = bench_now_s() - t0;
    }
    kv_seq_free(&seq);
    *out_p50 = bench_median(t, iters);
    rc = 0;
out:
    free(t);
    free(logits);
    kv_pool_free(pool);
    model_runner_free(run);
    tok_free(tok);
    model_free(m);
    return rc;
}

/* p50 of a Tokenize round trip: the transport and the event loop, no inference. */
static int roundtrip_latency(llms_conn *c, int iters, double *out_p50)
{
    double *t = malloc(sizeof *t * (size_t)iters);
    if (!t)
        return -1;
    for (int i = -3; i < iters; i++) {
        int32_t *ids;
        size_t n;
        double t0 = bench_now_s();
        if (llms_tokenize(c, PROMPT, 1, 0, &ids, &n) != LLMS_OK) {
            fprintf(stderr, "service: Tokenize: %s\n", llms_last_error(c));
            free(t);
            return -1;
        }
        if (i >= 0)
            t[i] = bench_now_s() - t0;
        free(ids);
    }
    *out_p50 = bench_median(t, iters);
    free(t);
    return 0;
}

static int socket_latency(const char *sock, int iters, double *out_p50, double *queue_p50,
                          double *rt_p50)
{
    llms_conn *c;
    char err[LLMS_ERROR_MAX];
    if (llms_connect(sock, &c, err) != LLMS_OK || llms_bind(c, "bench-latency") != LLMS_OK) {
        fprintf(stderr, "service: %s\n", err);
        return -1;
    }
    double *t = malloc(sizeof *t * (size_t)iters), *q = malloc(sizeof *q * (size_t)iters);
    llms_params p;
    llms_params_init(&p);
    p.temperature = 0;
    p.max_tokens = 1;
    int rc = 0;
    for (int i = -3; i < iters && t && q; i++) {
        llms_result r;
        double t0 = bench_now_s();
        enum llms_status s = llms_complete(c, PROMPT, NULL, 0, &p, NULL, NULL, &r);
        double dt = bench_now_s() - t0;
        if (s != LLMS_OK) {
            fprintf(stderr, "service: Complete: %s\n", llms_last_error(c));
            rc = -1;
            break;
        }
        if (i >= 0) {
            t[i] = dt;
            q[i] = r.queue_ms / 1000.0;
        }
        llms_result_free(&r);
    }
    if (rc == 0 && t && q) {
        *out_p50 = bench_median(t, iters);
        *queue_p50 = bench_median(q, iters);
        rc = roundtrip_latency(c, iters, rt_p50);
    }
    free(t);
    free(q);
    llms_close(c);
    return t && q ? rc : -1;
}

struct client {
    const char *sock;
    int tokens;
    pthread_barrier_t *start;
    uint64_t generated;
    int failed;
};

static void *client_main(void *arg)
{
    struct client *cl = arg;
    llms_conn *c;
    char id[LLMS_ID_MAX];
    int ready = llms_connect(cl->sock, &c, NULL) == LLMS_OK;
    ready = ready && llms_bind(c, "bench-decode") == LLMS_OK &&
            llms_context_create(c, NULL, NULL, id) == LLMS_OK;
    pthread_barrier_wait(cl->start);
    if (!ready) {
        cl->failed = 1;
        return NULL;
    }
    llms_params p;
    llms_params_init(&p);
    p.temperature = 0.8f;
    p.seed = 1;
    p.has_seed = 1;
    p.max_tokens = cl->tokens;
    llms_result r;
    if (llms_call(c, id, PROMPT, &p, NULL, NULL, &r) == LLMS_OK)
        cl->generated = r.generated_tokens;
    else
        cl->failed = 1;
    llms_result_free(&r);
    llms_context_delete(c, id);
    llms_close(c);
    return NULL;
}

static int decode_throughput(const char *sock, int n_clients, int tokens, const char *model)
{
    struct client cl[16];
    pthread_t th[16];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)n_clients + 1);
    for (int i = 0; i < n_clients; i++) {
        cl[i] = (struct client){.sock = sock, .tokens = tokens, .start = &start};
        pthread_create(&th[i], NULL, client_main, &cl[i]);
    }
    pthread_barrier_wait(&start);
    double t0 = bench_now_s();
    uint64_t total = 0;
    int failed = 0;
    for (int i = 0; i < n_clients; i++) {
        pthread_join(th[i], NULL);
        total += cl[i].generated;
        failed += cl[i].failed;
    }
    double wall = bench_now_s() - t0;
    pthread_barrier_destroy(&start);
    printf("{\"bench\":\"service_decode\",\"model\":\"%s\",\"clients\":%d,\"max_tokens\":%d,"
           "\"generated_tokens\":%llu,\"failed_clients\":%d,\"wall_s\":%.3f,"
           "\"aggregate_tok_s\":%.1f}\n",
           model, n_clients, tokens, (unsigned long long)total, failed, wall,
           wall > 0 ? (double)total / wall : 0.0);
    fflush(stdout);
    return failed ? -1 : 0;
}

int main(int argc, char **argv)
{
    const char *model = NULL;
    int iters = 200, tokens = 64, threads = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model"))
            model = argv[i + 1];
        else if (!strcmp(argv[i], "--iters"))
            iters = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--tokens"))
            tokens = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads"))
            threads = atoi(argv[i + 1]);
        else
            break;
    }
    if (argc % 2 == 0 || iters < 1 || tokens < 1 || threads < 1) {
        fprintf(stderr, "usage: service [--model PATH] [--iters N] [--tokens N] "
                        "[--threads N]\n");
        return 2;
    }
    char self[1024], llmsd[1100];
    snprintf(self, sizeof self, "%s", argv[0]);
    snprintf(llmsd, sizeof llmsd, "%s/../llmsd", dirname(self));
    if (access(llmsd, X_OK) != 0) {
        fprintf(stderr, "service: %s is not built\n", llmsd);
        return 1;
    }
    char dir[] = "/tmp/llms-bench-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    char gen[256], err[ERR_MAX];
    if (!model) {
        snprintf(gen, sizeof gen, "%s/model.gguf", dir);
        modelgen_params mp = {
            .arch = "llama", .dim = 256, .n_layer = 4, .n_head = 8, .n_head_kv = 4,
            .n_ff = 768, .n_ctx = 1024, .type = QTYPE_Q8_0, .seed = 1, .n_vocab = 4096,
        };
        if (modelgen_write(&mp, gen, err) < 0) {
            fprintf(stderr, "service: modelgen: %s\n", err);
            return 1;
        }
        model = gen;
    }

    int rc = 1;
    double in_p50 = 0, sock_p50 = 0, queue_p50 = 0, rt_p50 = 0;
    char sock[1100];
    if (inprocess_latency(model, threads, iters, &in_p50) == 0 &&
        start_daemon(llmsd, dir, model, threads, sock, sizeof sock) == 0 &&
        socket_latency(sock, iters, &sock_p50, &queue_p50, &rt_p50) == 0) {
        printf("{\"bench\":\"service_complete_latency\",\"model\":\"%s\",\"prompt\":\"%s\","
               "\"max_tokens\":1,\"iters\":%d,\"p50_inprocess_ms\":%.3f,"
               "\"p50_socket_ms\":%.3f,\"p50_queue_ms\":%.3f,\"added_p50_ms\":%.3f,"
               "\"p50_tokenize_roundtrip_ms\":%.3f}\n",
               model, PROMPT, iters, in_p50 * 1e3, sock_p50 * 1e3, queue_p50 * 1e3,
               (sock_p50 - in_p50) * 1e3, rt_p50 * 1e3);
        fflush(stdout);
        rc = 0;
        static const int clients[] = {1, 4, 16};
        for (int i = 0; i < 3 && rc == 0; i++)
            rc = decode_throughput(sock, clients[i], tokens, model) ? 1 : 0;
    }
    stop_daemon();
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "service: could not remove %s\n", dir);
    return rc;
}
