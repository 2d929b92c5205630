/*
 * service — what the service layer costs, as JSON lines on stdout.
 *
 *   service [--model PATH] [--iters N] [--tokens N] [--threads N] [--runs N]
 *           [--sched batched|serial|both] [--step-tokens N] [--shorts N]
 *
 * Starts llmsd of the same build on a temporary socket (a generated random-weight model
 * of about 100M parameters, kept in build/bench-models/, unless --model is given) once
 * per scheduler mode (both: the step scheduler and sched = serial, the behaviour before
 * it, in the same run), then measures in each:
 *   1. a short Complete (one generated token) through the socket versus the same work
 *      done in-process with the engine: p50 of each and the added latency, and the p50
 *      of a Tokenize round trip (transport alone);
 *   2. aggregate decode tokens/s with 1, 4 and 16 concurrent clients, each on its own
 *      connection and context, median of --runs runs (each run takes 1, 4 and 16 in
 *      turn), and the ratio to one client, of the medians and the median of each run's
 *      (targets on the TinyLlama-1.1B shape: 16 clients >= 6x, 4 clients >= 2.5x); once
 *      from the start to the last reply, prompts included, and once over the time all
 *      clients decode together (steady_decode_tok_s: what a step of decode rows gives);
 *   3. a flood: 16 streams decode while one app sends Embeds of long texts and a
 *      2000-token prompt and another app sends --shorts (default 20) short Completes one
 *      after another:
 *      time to first token of the short requests (p50, p99, and p99 in median step
 *      times: target <= 10) and the longest gap between two tokens of any stream
 *      against the median gap (target <= 3); --shorts 0 leaves the flood out.
 * With both modes, one more line per client count gives batched / serial.
 */
#include <errno.h>
#include <libgen.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench.h"
#include "client/llms.h"
#include "engine/gguf/gguf.h"
#include "engine/kv/kv.h"
#include "engine/model/model.h"
#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"
#include "engine/tok/tokenizer.h"

#define PROMPT "Hello, how are you today?"

static pid_t daemon_pid;

static void stop_daemon(void)
{
    bench_llmsd_stop(daemon_pid);
    daemon_pid = 0;
}

/* Starts llmsd in dir/<sched> (its own state per scheduling mode). */
static int start_daemon(const char *llmsd, const char *dir, const char *model, int threads,
                        const char *sched, int step_tokens, char *sock, size_t sock_cap)
{
    char sub[900], conf[2048];
    snprintf(sub, sizeof sub, "%s/%s", dir, sched);
    if (mkdir(sub, 0755) != 0 && errno != EEXIST)
        return -1;
    snprintf(conf, sizeof conf,
             "model = %s\nthreads = %d\nmax_contexts_per_app = 256\nmax_queued_per_app = 64\n"
             "kv_budget_mb = 0\nsched = %s\nstep_tokens = %d\nembed_max_texts = 16\n",
             model, threads, sched, step_tokens);
    daemon_pid = bench_llmsd_start("service", llmsd, sub, conf, sock, sock_cap);
    return daemon_pid > 0 ? 0 : -1;
}

/* The in-process equivalent of a one-token greedy Complete: tokenize, prefill, argmax
 * (the weights repacked, as llmsd repacks them). */
static int inprocess_latency(const char *path, int threads, int iters, double *out_p50)
{
    char err[ERR_MAX];
    model *m = model_load(path, err);
    tokenizer *tok = NULL;
    if (!m || model_repack_weights(m, err) < 0 || tok_load(model_gguf(m), &tok, err)) {
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

/* ---- decode throughput ---- */

struct client {
    const char *sock;
    const char *app;
    int tokens;
    pthread_barrier_t *start;
    uint64_t generated;
    int failed;
    /* token times, for the gaps between tokens */
    double *times;        /* (cap_times) */
    int n_times, cap_times;
    atomic_int *stop;     /* decode again until set (flood), or once when NULL */
};

static int on_token(const char *text, size_t len, void *user)
{
    (void)text, (void)len;
    struct client *cl = user;
    if (cl->n_times < cl->cap_times)
        cl->times[cl->n_times++] = bench_now_s();
    return 0;
}

static void *client_main(void *arg)
{
    struct client *cl = arg;
    llms_conn *c;
    char id[LLMS_ID_MAX];
    int ready = llms_connect(cl->sock, &c, NULL) == LLMS_OK;
    ready = ready && llms_bind(c, cl->app) == LLMS_OK &&
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
    do {
        llms_result r;
        cl->n_times = 0;
        if (llms_call(c, id, PROMPT, &p, cl->times ? on_token : NULL, cl, &r) == LLMS_OK)
            cl->generated += r.generated_tokens;
        else
            cl->failed = 1;
        llms_result_free(&r);
    } while (cl->stop && !atomic_load(cl->stop) && !cl->failed);
    llms_context_delete(c, id);
    llms_close(c);
    return NULL;
}

/* Tokens/s of all clients together while every one of them decodes: from the moment the
 * last client got its first token to the moment the first client got its last, the
 * tokens all clients received in between over that time. Prompt prefill and the ramp up
 * and down are left out, which is what a decode step costs; 0 when the clients did not
 * decode at the same time (sched = serial finishes one request before the next). */
static double steady_decode_tok_s(const struct client *cl, int n_clients)
{
    double from = 0, to = 0;
    for (int i = 0; i < n_clients; i++) {
        if (cl[i].n_times < 2)
            return 0.0;
        double first = cl[i].times[0], last = cl[i].times[cl[i].n_times - 1];
        if (i == 0 || first > from)
            from = first;
        if (i == 0 || last < to)
            to = last;
    }
    int tokens = 0;
    for (int i = 0; i < n_clients; i++)
        for (int k = 0; k < cl[i].n_times; k++)
            tokens += cl[i].times[k] > from && cl[i].times[k] <= to;
    return to > from && tokens >= 2 * n_clients ? tokens / (to - from) : 0.0;
}

/* Aggregate tokens/s of n_clients concurrent generations of tokens each, once: from the
 * start to the last reply (prompts included), and while all decode (steady_decode_tok_s). */
static int decode_throughput(const char *sock, int n_clients, int tokens, double *out_tok_s,
                             double *out_steady_tok_s)
{
    struct client cl[16];
    pthread_t th[16];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)n_clients + 1);
    int failed = 0;
    for (int i = 0; i < n_clients; i++) {
        cl[i] = (struct client){.sock = sock, .app = "bench-decode", .tokens = tokens,
                                .start = &start, .cap_times = tokens + 1};
        cl[i].times = malloc(sizeof *cl[i].times * (size_t)cl[i].cap_times);
        if (!cl[i].times)
            cl[i].cap_times = 0;
        pthread_create(&th[i], NULL, client_main, &cl[i]);
    }
    pthread_barrier_wait(&start);
    double t0 = bench_now_s();
    uint64_t total = 0;
    for (int i = 0; i < n_clients; i++) {
        pthread_join(th[i], NULL);
        total += cl[i].generated;
        failed += cl[i].failed || !cl[i].times;
    }
    double wall = bench_now_s() - t0;
    pthread_barrier_destroy(&start);
    *out_steady_tok_s = failed ? 0.0 : steady_decode_tok_s(cl, n_clients);
    for (int i = 0; i < n_clients; i++)
        free(cl[i].times);
    if (failed) {
        fprintf(stderr, "service: %d of %d decode clients failed\n", failed, n_clients);
        return -1;
    }
    *out_tok_s = wall > 0 ? (double)total / wall : 0.0;
    return 0;
}

/* ---- the flood ---- */

#define FLOOD_STREAMS 16
#define FLOOD_TEXTS 8

struct flooder {
    const char *sock;
    int text_tokens, prompt_tokens;
    atomic_int *stop;
    int embeds, prompts, failed;
};

/* Another app's long work until stop: Embeds of FLOOD_TEXTS long texts, and long
 * prompts (Complete of one token). */
static void *flooder_main(void *arg)
{
    struct flooder *f = arg;
    llms_conn *c;
    if (llms_connect(f->sock, &c, NULL) != LLMS_OK || llms_bind(c, "bench-flood") != LLMS_OK) {
        f->failed = 1;
        return NULL;
    }
    int n = f->prompt_tokens > f->text_tokens ? f->prompt_tokens : f->text_tokens;
    char *text = malloc((size_t)n * 6 + 1);
    char *texts[FLOOD_TEXTS];
    /* "w123 " is about one token of any vocabulary's words and digits, or a few */
    size_t len = 0;
    for (int i = 0; i < n; i++)
        len += (size_t)sprintf(text + len, "w%d ", i % 997);
    llms_params p;
    llms_params_init(&p);
    p.max_tokens = 1;
    while (!atomic_load(f->stop) && !f->failed) {
        for (int i = 0; i < FLOOD_TEXTS; i++) {
            size_t cut = len * (size_t)f->text_tokens / (size_t)n;
            texts[i] = strndup(text + (size_t)i % 7, cut);
        }
        llms_embeddings e;
        if (llms_embed(c, (const char *const *)texts, FLOOD_TEXTS, LLMS_POOLING_MEAN, &e) ==
            LLMS_OK) {
            f->embeds++;
            llms_embeddings_free(&e);
        } else {
            fprintf(stderr, "service: flood Embed: %s\n", llms_last_error(c));
            f->failed = 1;
        }
        for (int i = 0; i < FLOOD_TEXTS; i++)
            free(texts[i]);
        char *prompt = strndup(text, len * (size_t)f->prompt_tokens / (size_t)n);
        llms_result r;
        if (!atomic_load(f->stop) &&
            llms_complete(c, prompt, NULL, 0, &p, NULL, NULL, &r) == LLMS_OK) {
            f->prompts++;
            llms_result_free(&r);
        }
        free(prompt);
    }
    free(text);
    llms_close(c);
    return NULL;
}

static int first_token(const char *text, size_t len, void *user)
{
    (void)text, (void)len;
    double *t = user;
    if (*t == 0)
        *t = bench_now_s();
    return 0;
}

static int flood(const char *sock, const char *sched, const char *model, int tokens,
                 int text_tokens, int prompt_tokens, int n_short)
{
    atomic_int stop = 0, streams_stop = 0;
    struct client cl[FLOOD_STREAMS];
    pthread_t th[FLOOD_STREAMS], fth;
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, FLOOD_STREAMS + 1);
    for (int i = 0; i < FLOOD_STREAMS; i++) {
        cl[i] = (struct client){.sock = sock, .app = "bench-stream", .tokens = tokens,
                                .start = &start, .cap_times = tokens + 1,
                                .stop = &streams_stop};
        cl[i].times = malloc(sizeof *cl[i].times * (size_t)cl[i].cap_times);
        pthread_create(&th[i], NULL, client_main, &cl[i]);
    }
    pthread_barrier_wait(&start);
    usleep(300000);
    struct flooder f = {.sock = sock, .text_tokens = text_tokens,
                        .prompt_tokens = prompt_tokens, .stop = &stop};
    pthread_create(&fth, NULL, flooder_main, &f);
    usleep(300000);

    llms_conn *c;
    double *ttft = malloc(sizeof *ttft * (size_t)n_short);
    int rc = -1, n_ok = 0;
    if (llms_connect(sock, &c, NULL) == LLMS_OK && llms_bind(c, "bench-short") == LLMS_OK) {
        llms_params p;
        llms_params_init(&p);
        p.temperature = 0;
        p.max_tokens = 2;
        for (int i = 0; i < n_short; i++) {
            double t_first = 0, t0 = bench_now_s();
            llms_result r;
            if (llms_complete(c, "Hi", NULL, 0, &p, first_token, &t_first, &r) != LLMS_OK)
                break;
            llms_result_free(&r);
            ttft[n_ok++] = (t_first ? t_first : bench_now_s()) - t0;
        }
        rc = n_ok == n_short ? 0 : -1;
    }
    llms_daemon_status st = {0};
    int have_status = llms_status_get(c, &st) == LLMS_OK;
    llms_close(c);
    /* the gaps of the streams' last runs, which overlapped the flood */
    atomic_store(&streams_stop, 1);
    for (int i = 0; i < FLOOD_STREAMS; i++)
        pthread_join(th[i], NULL);
    atomic_store(&stop, 1);
    pthread_join(fth, NULL);
    pthread_barrier_destroy(&start);

    int n_gaps = 0;
    for (int i = 0; i < FLOOD_STREAMS; i++)
        n_gaps += cl[i].n_times > 1 ? cl[i].n_times - 1 : 0;
    double *gaps = malloc(sizeof *gaps * (size_t)(n_gaps + 1));
    n_gaps = 0;
    for (int i = 0; i < FLOOD_STREAMS; i++) {
        for (int k = 1; k < cl[i].n_times; k++)
            gaps[n_gaps++] = cl[i].times[k] - cl[i].times[k - 1];
        rc = cl[i].failed ? -1 : rc;
        free(cl[i].times);
    }
    if (rc == 0 && n_gaps > 0 && n_ok > 0) {
        double gap_p50 = bench_percentile(gaps, n_gaps, 0.5), gap_max = gaps[n_gaps - 1];
        double t50 = bench_percentile(ttft, n_ok, 0.5), t99 = bench_percentile(ttft, n_ok, 0.99);
        printf("{\"bench\":\"service_flood\",\"model\":\"%s\",\"sched\":\"%s\",\"streams\":%d,"
               "\"flood_embeds\":%d,\"flood_prompts\":%d,\"embed_text_tokens\":%d,"
               "\"prompt_tokens\":%d,\"short_requests\":%d,\"ttft_p50_ms\":%.1f,"
               "\"ttft_p99_ms\":%.1f,\"ttft_p99_steps\":%.2f,\"gap_p50_ms\":%.1f,"
               "\"gap_max_ms\":%.1f,\"gap_max_over_p50\":%.2f,\"daemon_step_mean_ms\":%.1f,"
               "\"daemon_rows_per_step\":%.1f,\"daemon_longest_stall_ms\":%.1f}\n",
               model, sched, FLOOD_STREAMS, f.embeds, f.prompts, text_tokens, prompt_tokens,
               n_ok, t50 * 1e3, t99 * 1e3, t99 / gap_p50, gap_p50 * 1e3, gap_max * 1e3,
               gap_max / gap_p50, have_status ? st.sched_step_mean_ms : 0,
               have_status ? st.sched_rows_per_step : 0,
               have_status ? st.sched_longest_stall_ms : 0);
        fflush(stdout);
    }
    if (have_status)
        llms_daemon_status_free(&st);
    free(gaps);
    free(ttft);
    return rc == 0 && !f.failed ? 0 : -1;
}

/* ---- main ---- */

/* Makes build/bench-models/service-100m.gguf (llama shape, Q8_0, about 130M parameters)
 * unless it exists, on the llama SPM vocabulary of the test data (32000 tokens), so that
 * prompts take as many tokens as they would on a real llama; without the test data on
 * 32000 synthetic tokens (service-100m-synthetic.gguf), where text is about a token a
 * letter and prompts are several times longer. */
static int ensure_default_model(char *path, size_t cap)
{
    const char *dir = getenv("LLMS_TESTDATA") ? getenv("LLMS_TESTDATA") : "../shared/testdata";
    char vocab_path[1024];
    snprintf(vocab_path, sizeof vocab_path, "%s/vocab/ggml-vocab-llama-spm.gguf", dir);
    bool real_vocab = access(vocab_path, R_OK) == 0;
    snprintf(path, cap, real_vocab ? "build/bench-models/service-100m.gguf"
                                   : "build/bench-models/service-100m-synthetic.gguf");
    if (access(path, R_OK) == 0)
        return 0;
    if (mkdir("build/bench-models", 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "service: build/bench-models: %s\n", strerror(errno));
        return -1;
    }
    char err[ERR_MAX];
    gguf_file *vocab = NULL;
    if (real_vocab && !(vocab = gguf_open(vocab_path, err))) {
        fprintf(stderr, "service: %s: %s\n", vocab_path, err);
        return -1;
    }
    if (!vocab)
        fprintf(stderr, "service: %s is absent: synthetic vocabulary\n", vocab_path);
    modelgen_params mp = {
        .arch = "llama", .dim = 768, .n_layer = 12, .n_head = 12, .n_head_kv = 4,
        .n_ff = 2048, .n_ctx = 4096, .type = QTYPE_Q8_0, .seed = 1, .n_vocab = 32000,
        .vocab = vocab,
    };
    fprintf(stderr, "service: generating %s\n", path);
    int rc = modelgen_write(&mp, path, err);
    gguf_close(vocab);
    if (rc < 0) {
        fprintf(stderr, "service: modelgen: %s\n", err);
        unlink(path);
        return -1;
    }
    return 0;
}

typedef struct mode_result {
    double tok_s[3]; /* 1, 4, 16 clients */
    int ok;
} mode_result;

static const int bench_clients[] = {1, 4, 16};

static int bench_mode(const char *llmsd, const char *dir, const char *model, int threads,
                      const char *sched, int step_tokens, int iters, int tokens, int runs,
                      int n_short, mode_result *res)
{
    double in_p50 = 0, sock_p50 = 0, queue_p50 = 0, rt_p50 = 0;
    char sock[1100];
    if (start_daemon(llmsd, dir, model, threads, sched, step_tokens, sock, sizeof sock) != 0)
        return -1;
    int rc = -1;
    if (inprocess_latency(model, threads, iters, &in_p50) == 0 &&
        socket_latency(sock, iters, &sock_p50, &queue_p50, &rt_p50) == 0) {
        printf("{\"bench\":\"service_complete_latency\",\"model\":\"%s\",\"sched\":\"%s\","
               "\"prompt\":\"%s\",\"max_tokens\":1,\"iters\":%d,\"p50_inprocess_ms\":%.3f,"
               "\"p50_socket_ms\":%.3f,\"p50_queue_ms\":%.3f,\"added_p50_ms\":%.3f,"
               "\"p50_tokenize_roundtrip_ms\":%.3f}\n",
               model, sched, PROMPT, iters, in_p50 * 1e3, sock_p50 * 1e3, queue_p50 * 1e3,
               (sock_p50 - in_p50) * 1e3, rt_p50 * 1e3);
        fflush(stdout);
        rc = 0;
        /* each run takes 1, 4 and 16 clients in turn, so that the load of a shared
         * machine reaches the one-client figure the ratios divide by as much as the
         * others; per run ratios pair figures taken under the same load */
        double agg[3][16], ratio[3][16], steady[3][16], steady_ratio[3][16];
        for (int run = 0; run < runs && rc == 0; run++)
            for (int i = 0; i < 3 && rc == 0; i++)
                rc = decode_throughput(sock, bench_clients[i], tokens, &agg[i][run],
                                       &steady[i][run]);
        for (int i = 0; i < 3 && rc == 0; i++)
            for (int run = 0; run < runs; run++) {
                ratio[i][run] = agg[i][run] / agg[0][run];
                steady_ratio[i][run] = steady[0][run] > 0 ? steady[i][run] / steady[0][run] : 0;
            }
        for (int i = 0; i < 3 && rc == 0; i++)
            res->tok_s[i] = bench_median(agg[i], runs);
        for (int i = 0; i < 3 && rc == 0; i++) {
            printf("{\"bench\":\"service_decode\",\"model\":\"%s\",\"sched\":\"%s\","
                   "\"threads\":%d,\"clients\":%d,\"max_tokens\":%d,\"runs\":%d,"
                   "\"aggregate_tok_s\":%.1f,\"ratio_to_1_client\":%.2f,"
                   "\"ratio_to_1_client_per_run\":%.2f,\"steady_decode_tok_s\":%.1f,"
                   "\"steady_ratio_to_1_client_per_run\":%.2f}\n",
                   model, sched, threads, bench_clients[i], tokens, runs, res->tok_s[i],
                   res->tok_s[i] / res->tok_s[0], bench_median(ratio[i], runs),
                   bench_median(steady[i], runs), bench_median(steady_ratio[i], runs));
            fflush(stdout);
        }
        if (rc == 0 && n_short > 0)
            rc = flood(sock, sched, model, tokens, 480, 2000, n_short);
    }
    stop_daemon();
    res->ok = rc == 0;
    return rc;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *sched = "both";
    int iters = 100, tokens = 48, threads = 2, runs = 3, step_tokens = 64, n_short = 20;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model"))
            model = argv[i + 1];
        else if (!strcmp(argv[i], "--iters"))
            iters = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--tokens"))
            tokens = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads"))
            threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--runs"))
            runs = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--sched"))
            sched = argv[i + 1];
        else if (!strcmp(argv[i], "--step-tokens"))
            step_tokens = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--shorts"))
            n_short = atoi(argv[i + 1]);
        else
            break;
    }
    bool modes_ok = !strcmp(sched, "both") || !strcmp(sched, "batched") ||
                    !strcmp(sched, "serial");
    if (argc % 2 == 0 || iters < 1 || tokens < 1 || threads < 1 || runs < 1 || runs > 16 ||
        n_short < 0 || n_short > 1000 || !modes_ok) {
        fprintf(stderr, "usage: service [--model PATH] [--iters N] [--tokens N] "
                        "[--threads N] [--runs N] [--sched batched|serial|both] "
                        "[--step-tokens N] [--shorts N]\n");
        return 2;
    }
    char self[1024], llmsd[1100];
    snprintf(self, sizeof self, "%s", argv[0]);
    snprintf(llmsd, sizeof llmsd, "%s/../llmsd", dirname(self));
    if (access(llmsd, X_OK) != 0) {
        fprintf(stderr, "service: %s is not built\n", llmsd);
        return 1;
    }
    char gen[256];
    if (!model) {
        if (ensure_default_model(gen, sizeof gen) != 0)
            return 1;
        model = gen;
    }
    char dir[] = "/tmp/llms-bench-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    mode_result batched = {0}, serial = {0};
    int rc = 0;
    if (strcmp(sched, "serial") != 0)
        rc |= bench_mode(llmsd, dir, model, threads, "batched", step_tokens, iters, tokens, runs,
                         n_short, &batched);
    if (strcmp(sched, "batched") != 0)
        rc |= bench_mode(llmsd, dir, model, threads, "serial", step_tokens, iters, tokens, runs,
                         n_short, &serial);
    for (int i = 0; i < 3 && batched.ok && serial.ok; i++)
        printf("{\"bench\":\"service_decode_batched_vs_serial\",\"model\":\"%s\","
               "\"clients\":%d,\"batched_tok_s\":%.1f,\"serial_tok_s\":%.1f,\"ratio\":%.2f}\n",
               model, bench_clients[i], batched.tok_s[i], serial.tok_s[i],
               batched.tok_s[i] / serial.tok_s[i]);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "service: could not remove %s\n", dir);
    return rc ? 1 : 0;
}
