/*
 * http — what the HTTP gateway adds to the native socket, as JSON lines on stdout.
 *
 *   http [--model PATH] [--iters N] [--tokens N] [--threads N] [--clients N]
 *
 * Starts llmsd of the same build with http_socket and http_listen (loopback TCP) on a
 * generated random-weight model (build/bench-models/: a tiny one for 1, one of about 60M
 * parameters for 2; --model: that one for both), then, each on one daemon:
 *   1. a short Complete (one generated token, greedy) --iters times over each path in
 *      turn, each on one kept-alive connection: the native socket (libllmsclient),
 *      HTTP on the Unix socket, HTTP on TCP: p50 and p99 of each and the p50 the HTTP
 *      paths add to the native one (target < 1 ms);
 *   2. --clients (16) concurrent streamed completions of --tokens tokens each: Server-
 *      Sent Events on TCP against the same number of native streaming clients:
 *      aggregate tokens/s of each and their ratio.
 */
#include <arpa/inet.h>
#include <fcntl.h>
#include <libgen.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench.h"
#include "client/llms.h"
#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"

#define PROMPT "Hello, how are you today?"
#define MAX_CLIENTS 64

static pid_t daemon_pid;
static char sock[600], hsock[600];
static int port;
static int n_tokens = 32;

static void stop_daemon(void)
{
    if (daemon_pid > 0) {
        kill(daemon_pid, SIGTERM);
        waitpid(daemon_pid, NULL, 0);
        daemon_pid = 0;
    }
}

static int pick_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int p = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        p = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return p;
}

static int start_daemon(const char *llmsd, const char *dir, const char *model, int threads)
{
    char conf[1024], log[1024];
    snprintf(sock, sizeof sock, "%s/s", dir);
    snprintf(hsock, sizeof hsock, "%s/h", dir);
    snprintf(conf, sizeof conf, "%s/llmsd.conf", dir);
    snprintf(log, sizeof log, "%s/llmsd.log", dir);
    port = pick_port();
    char tokens[1024];
    snprintf(tokens, sizeof tokens, "%s/tokens", dir);
    FILE *f = fopen(tokens, "w");
    if (!f)
        return -1;
    fprintf(f, "bench-token %u bench\n", (unsigned)getuid());
    fclose(f);
    f = fopen(conf, "w");
    if (!f || port < 0)
        return -1;
    fprintf(f, "model = %s\nsocket = %s\nstate_dir = %s/state\nthreads = %d\n"
               "max_queued_per_app = 64\nmax_queued_per_uid = 256\nkv_budget_mb = 0\n"
               "http_socket = %s\nhttp_listen = 127.0.0.1:%d\nhttp_tokens_file = %s\n"
               "log_level = warn\n",
            model, sock, dir, threads, hsock, port, tokens);
    fclose(f);
    daemon_pid = fork();
    if (daemon_pid < 0)
        return -1;
    if (daemon_pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execl(llmsd, "llmsd", "-c", conf, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 3000; i++) {
        llms_conn *c;
        if (access(hsock, F_OK) == 0 && llms_connect(sock, &c, NULL) == LLMS_OK) {
            llms_close(c);
            return 0;
        }
        if (waitpid(daemon_pid, NULL, WNOHANG) == daemon_pid) {
            fprintf(stderr, "http: llmsd exited at startup (log: %s)\n", log);
            daemon_pid = 0;
            return -1;
        }
        usleep(20000);
    }
    fprintf(stderr, "http: llmsd did not open its sockets (log: %s)\n", log);
    return -1;
}

static int http_connect(bool tcp)
{
    int fd;
    if (tcp) {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
            close(fd);
            return -1;
        }
        int one = 1;
        if (fd >= 0)
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    } else {
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        memcpy(a.sun_path, hsock, strlen(hsock) + 1);
        fd = socket(AF_UNIX, SOCK_STREAM, 0);
        if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
            close(fd);
            return -1;
        }
    }
    return fd;
}

static int send_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int post(int fd, const char *path, const char *body, bool keep_alive)
{
    char req[2048];
    int n = snprintf(req, sizeof req,
                     "POST %s HTTP/1.1\r\nHost: llmsd\r\nContent-Type: application/json\r\n"
                     "Authorization: Bearer bench-token\r\nX-Llmsd-App: bench\r\n"
                     "Content-Length: %zu\r\n%s\r\n%s",
                     path, strlen(body), keep_alive ? "" : "Connection: close\r\n", body);
    return n > 0 && (size_t)n < sizeof req ? send_all(fd, req, (size_t)n) : -1;
}

/* Reads one reply with a Content-Length body on a kept-alive connection; its status. */
static int read_reply(int fd, char *buf, size_t cap)
{
    size_t len = 0;
    char *end = NULL;
    while (!end) {
        ssize_t r = recv(fd, buf + len, cap - 1 - len, 0);
        if (r <= 0)
            return -1;
        len += (size_t)r;
        buf[len] = '\0';
        end = strstr(buf, "\r\n\r\n");
    }
    const char *cl = strcasestr(buf, "Content-Length:");
    size_t want = (size_t)(end + 4 - buf) + (cl ? strtoul(cl + 15, NULL, 10) : 0);
    while (len < want && len < cap - 1) {
        ssize_t r = recv(fd, buf + len, cap - 1 - len, 0);
        if (r <= 0)
            return -1;
        len += (size_t)r;
    }
    return atoi(buf + 9);
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(double *v, int n, double p)
{
    qsort(v, (size_t)n, sizeof *v, cmp);
    int i = (int)(p * (n - 1) + 0.5);
    return v[i];
}

static int latency(const char *model, int iters)
{
    llms_conn *c;
    if (llms_connect(sock, &c, NULL) != LLMS_OK || llms_bind(c, "bench") != LLMS_OK)
        return -1;
    int fd[2] = {http_connect(false), http_connect(true)};
    double *t[3];
    for (int k = 0; k < 3; k++)
        t[k] = malloc(sizeof(double) * (size_t)iters);
    if (fd[0] < 0 || fd[1] < 0 || !t[0] || !t[1] || !t[2])
        return -1;
    llms_params p = LLMS_PARAMS_INIT;
    p.temperature = 0;
    p.max_tokens = 1;
    const char *body = "{\"prompt\":\"" PROMPT "\",\"max_tokens\":1,\"temperature\":0}";
    static char buf[1 << 16];
    /* Warm-up, then the paths in turn so that drift hits all three alike. */
    for (int i = -10; i < iters; i++)
        for (int k = 0; k < 3; k++) {
            double t0 = bench_now_s();
            if (k == 0) {
                llms_result r;
                if (llms_complete(c, PROMPT, NULL, 0, &p, NULL, NULL, &r) != LLMS_OK) {
                    fprintf(stderr, "http: native: %s\n", llms_last_error(c));
                    return -1;
                }
                llms_result_free(&r);
            } else if (post(fd[k - 1], "/v1/completions", body, true) ||
                       read_reply(fd[k - 1], buf, sizeof buf) != 200) {
                fprintf(stderr, "http: request failed: %.300s\n", buf);
                return -1;
            }
            if (i >= 0)
                t[k][i] = (bench_now_s() - t0) * 1e3;
        }
    double p50[3], p99[3];
    for (int k = 0; k < 3; k++) {
        p99[k] = pct(t[k], iters, 0.99);
        p50[k] = pct(t[k], iters, 0.5);
    }
    const char *names[] = {"native", "http_unix", "http_tcp"};
    for (int k = 0; k < 3; k++)
        printf("{\"bench\":\"http_complete_latency\",\"model\":\"%s\",\"path\":\"%s\",\"iters\":%d,"
               "\"p50_ms\":%.3f,\"p99_ms\":%.3f,\"added_p50_ms\":%.3f,\"added_p99_ms\":%.3f}\n",
               model, names[k], iters, p50[k], p99[k], p50[k] - p50[0], p99[k] - p99[0]);
    fflush(stdout);
    for (int k = 0; k < 3; k++)
        free(t[k]);
    close(fd[0]);
    close(fd[1]);
    llms_close(c);
    return 0;
}

typedef struct client_arg {
    bool http;
    long tokens;
    int failed;
    pthread_barrier_t *start;
} client_arg;

static int count_piece(const char *text, size_t len, void *user)
{
    (void)text;
    (void)len;
    (void)user;
    return 0;
}

static void *stream_client(void *arg)
{
    client_arg *a = arg;
    llms_conn *c = NULL;
    int fd = -1;
    if (a->http)
        fd = http_connect(true);
    else if (llms_connect(sock, &c, NULL) != LLMS_OK || llms_bind(c, "bench") != LLMS_OK)
        c = NULL;
    pthread_barrier_wait(a->start);
    if (a->http) {
        char body[256], buf[8192];
        snprintf(body, sizeof body,
                 "{\"prompt\":\"" PROMPT "\",\"max_tokens\":%d,\"stream\":true,"
                 "\"stream_options\":{\"include_usage\":true}}", n_tokens);
        if (fd < 0 || post(fd, "/v1/completions", body, false)) {
            a->failed = 1;
        } else {
            /* The usage event carries the count; the events themselves are read as
             * they come, as a client would. */
            bool done = false;
            ssize_t r;
            while ((r = recv(fd, buf, sizeof buf - 1, 0)) > 0) {
                buf[r] = '\0';
                char *u = strstr(buf, "\"completion_tokens\":");
                if (u)
                    a->tokens = strtol(u + 20, NULL, 10);
                done |= strstr(buf, "data: [DONE]") != NULL;
            }
            a->failed = !done;
        }
        if (fd >= 0)
            close(fd);
    } else if (c) {
        llms_params p = LLMS_PARAMS_INIT;
        p.max_tokens = n_tokens;
        llms_result r;
        if (llms_complete(c, PROMPT, NULL, 0, &p, count_piece, NULL, &r) == LLMS_OK) {
            a->tokens = r.generated_tokens;
            llms_result_free(&r);
        } else {
            a->failed = 1;
        }
        llms_close(c);
    } else {
        a->failed = 1;
    }
    return NULL;
}

/* Aggregate tokens/s of n concurrent streams over HTTP (SSE) or the native socket. */
static double streams(bool http, int n, int *failed)
{
    pthread_t th[MAX_CLIENTS];
    client_arg args[MAX_CLIENTS];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)n + 1);
    for (int i = 0; i < n; i++) {
        args[i] = (client_arg){http, 0, 0, &start};
        pthread_create(&th[i], NULL, stream_client, &args[i]);
    }
    pthread_barrier_wait(&start);
    double t0 = bench_now_s();
    long total = 0;
    *failed = 0;
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        total += args[i].tokens;
        *failed += args[i].failed;
    }
    double s = bench_now_s() - t0;
    pthread_barrier_destroy(&start);
    return (double)total / s;
}

int main(int argc, char **argv)
{
    const char *model = NULL;
    int iters = 200, threads = 2, clients = 16;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model"))
            model = argv[i + 1];
        else if (!strcmp(argv[i], "--iters"))
            iters = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--tokens"))
            n_tokens = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads"))
            threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--clients"))
            clients = atoi(argv[i + 1]);
        else
            break;
    }
    if (argc % 2 == 0 || iters < 1 || n_tokens < 1 || threads < 1 || clients < 1 ||
        clients > MAX_CLIENTS) {
        fprintf(stderr, "usage: http [--model PATH] [--iters N] [--tokens N] [--threads N] "
                        "[--clients N<=%d]\n", MAX_CLIENTS);
        return 2;
    }
    char self[1024], llmsd[1100];
    snprintf(self, sizeof self, "%s", argv[0]);
    snprintf(llmsd, sizeof llmsd, "%s/../llmsd", dirname(self));
    if (access(llmsd, X_OK) != 0) {
        fprintf(stderr, "http: %s is not built\n", llmsd);
        return 1;
    }
    /* Latency: a tiny model, so that the engine's share of a one-token Complete is
     * small next to the transport measured. Streams: a model where decode costs as in
     * practice (about 60M parameters). */
    const char *tiny = "build/bench-models/http-bench-tiny.gguf";
    const char *mid = "build/bench-models/http-bench-q8_0.gguf";
    modelgen_params tp = {
        .arch = "llama", .dim = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 128,
        .n_ctx = 512, .type = QTYPE_F32, .seed = 1, .n_vocab = 300, .n_threads = 2,
    };
    modelgen_params mp = {
        .arch = "llama", .dim = 512, .n_layer = 8, .n_head = 8, .n_head_kv = 4,
        .n_ff = 1536, .n_ctx = 2048, .type = QTYPE_Q8_0, .seed = 1, .n_vocab = 32000,
        .n_threads = 2,
    };
    if (!model && (bench_generate_model("http", &tp, tiny) || bench_generate_model("http", &mp, mid)))
        return 1;
    char dir[] = "/tmp/llms-bench-http-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    int rc = start_daemon(llmsd, dir, model ? model : tiny, threads) ? 1 : 0;
    if (!rc && latency(model ? model : tiny, iters))
        rc = 1;
    if (!rc && !model) {
        stop_daemon();
        rc = start_daemon(llmsd, dir, mid, threads) ? 1 : 0;
    }
    if (!model)
        model = mid;
    if (!rc) {
        int f_native, f_http;
        double native = streams(false, clients, &f_native);
        double http = streams(true, clients, &f_http);
        printf("{\"bench\":\"http_stream\",\"model\":\"%s\",\"clients\":%d,\"tokens\":%d,"
               "\"native_tok_s\":%.1f,\"sse_tok_s\":%.1f,\"ratio\":%.3f,\"failed\":%d}\n",
               model, clients, n_tokens, native, http, http / native, f_native + f_http);
        rc = f_native + f_http ? 1 : 0;
    }
    stop_daemon();
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "http: could not remove %s\n", dir);
    return rc;
}
