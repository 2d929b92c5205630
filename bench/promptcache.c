/*
 * promptcache — a multi-turn chat through the HTTP gateway with the prompt cache on and
 * off, as JSON lines on stdout.
 *
 *   promptcache [--turns N] [--runs N] [--threads N] [--llmsd PATH] [--model PATH]
 *
 * Two daemons of this build on the trained documentation model (test data
 * models/docs-lm-21M-F16.gguf, or --model): "cache" with the default prompt_cache_mb,
 * "off" with prompt_cache_mb = 0. Each run chats --turns (default 8) turns on each in
 * turn (a new app per run, so nothing is resumed from an earlier run): every turn adds a
 * user message of about 150 tokens to the conversation, resends it whole as chat clients
 * do, and appends the greedy reply (32 tokens at most). Per system: the median over
 * --runs (default 3) of the chat's wall time and of the prompt tokens evaluated
 * (prompt_tokens - usage.prompt_tokens_details.cached_tokens, summed over the turns);
 * then the ratios cache/off, and whether every reply was the same on both.
 *
 * Then the "shared" scenario: an app's requests that share a long system prompt (some
 * 1200 tokens) at the same time, as a batch job asks many questions under one set of
 * instructions. One request first, then SHARED_CLIENTS at once, each its own question;
 * the same medians and ratios for the concurrent ones (their wall time together). Then
 * the "burst" scenario: the same SHARED_CLIENTS requests at once with none before them
 * (the first to be evaluated leads, the others wait for it and resume its prompt).
 */
#include <json-c/json.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "bench/bench.h"

#define MAX_TURNS 16
#define MAX_RUNS 15
#define SHARED_CLIENTS 4

enum { CACHE, OFF, N_SYSTEMS };
static const char *const system_names[N_SYSTEMS] = {"cache", "off"};

typedef struct daemon_ {
    pid_t pid;
    char dir[512], sock[600], hsock[600];
} daemon_;

static daemon_ daemons[N_SYSTEMS];

static void stop_all(void)
{
    for (int k = 0; k < N_SYSTEMS; k++) {
        bench_llmsd_stop(daemons[k].pid);
        daemons[k].pid = 0;
    }
}

/* Starts d's daemon on model with the gateway on a socket, and extra settings. */
static int start(daemon_ *d, const char *llmsd, const char *model, int threads,
                 const char *extra)
{
    char conf[1400], dir[sizeof d->dir]; /* (a copy: d's paths are written from it) */
    memcpy(dir, d->dir, sizeof dir);
    snprintf(d->hsock, sizeof d->hsock, "%s/h", dir);
    snprintf(conf, sizeof conf, "model = %s\nthreads = %d\nn_ctx = 4096\nhttp_socket = %s\n"
             "log_level = warn\n%s", model, threads, d->hsock, extra);
    mkdir(dir, 0755);
    d->pid = bench_llmsd_start("promptcache", llmsd, dir, conf, d->sock, sizeof d->sock);
    if (d->pid < 0)
        return -1;
    /* the gateway's socket comes with the native one; wait for it all the same */
    for (int i = 0; i < 250 && access(d->hsock, F_OK) != 0; i++)
        usleep(20000);
    return access(d->hsock, F_OK) == 0 ? 0 : -1;
}

/* POSTs body to the chat route on hsock as app: the reply's JSON, NULL on failure. */
static json_object *post_chat(const char *hsock, const char *app, const char *body)
{
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", hsock);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    char head[512];
    size_t len = strlen(body);
    int n = snprintf(head, sizeof head,
                     "POST /v1/chat/completions HTTP/1.1\r\nHost: llmsd\r\nConnection: close\r\n"
                     "Content-Type: application/json\r\nX-Llmsd-App: %s\r\n"
                     "Content-Length: %zu\r\n\r\n", app, len);
    bool ok = send(fd, head, (size_t)n, MSG_NOSIGNAL) == n;
    for (size_t off = 0; ok && off < len;) {
        ssize_t w = send(fd, body + off, len - off, MSG_NOSIGNAL);
        ok = w > 0;
        off += ok ? (size_t)w : 0;
    }
    size_t cap = 1 << 16, got = 0;
    char *buf = malloc(cap);
    while (ok && buf) {
        if (got + 1 == cap) {
            char *more = realloc(buf, cap *= 2);
            if (!more)
                break;
            buf = more;
        }
        ssize_t r = read(fd, buf + got, cap - got - 1);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    json_object *o = NULL;
    if (buf) {
        buf[got] = '\0';
        const char *at = strstr(buf, "\r\n\r\n");
        o = at ? json_tokener_parse(at + 4) : NULL;
        free(buf);
    }
    return o;
}

/* The user's message of turn t: about 150 tokens of documentation-like questions. */
static void user_message(char *out, size_t cap, int t)
{
    static const char *const topics[] = {
        "the KV budget and how idle contexts give their chunks back",
        "the HTTP gateway and its bearer tokens",
        "knowledge bases, their passages and hybrid retrieval",
        "workflow graphs and their speculation",
        "speculative decoding with prompt lookup and a draft model",
        "the context window and what a slide keeps",
        "JSON mode and structured output with a schema",
        "the scheduler's steps and how long prompts are sliced",
    };
    snprintf(out, cap,
             "Question %d. I am writing an app for llmsd and I need to understand %s. "
             "Please explain which settings of the configuration file matter for it, what "
             "their defaults are and why, what the daemon does when a request asks for "
             "more than those settings allow, which errors my app should expect and how "
             "it should handle each of them, and how I can watch what happens with llmsctl "
             "status and the metrics of the gateway while my app runs on a laptop with "
             "two cores, so that I can tune it without reading the source code.",
             t + 1, topics[t % 8]);
}

/* A chat reply's text, prompt tokens and those resumed from the cache: false when o is
 * no such reply. */
static bool reply_fields(json_object *o, json_object **content, long *prompt, long *cached)
{
    json_object *choices, *choice, *msg, *usage, *pt, *det, *ct;
    if (!o || !json_object_object_get_ex(o, "choices", &choices) ||
        !(choice = json_object_array_get_idx(choices, 0)) ||
        !json_object_object_get_ex(choice, "message", &msg) ||
        !json_object_object_get_ex(msg, "content", content) ||
        !json_object_object_get_ex(o, "usage", &usage) ||
        !json_object_object_get_ex(usage, "prompt_tokens", &pt) ||
        !json_object_object_get_ex(usage, "prompt_tokens_details", &det) ||
        !json_object_object_get_ex(det, "cached_tokens", &ct))
        return false;
    *prompt = (long)json_object_get_int64(pt);
    *cached = (long)json_object_get_int64(ct);
    return true;
}

typedef struct chat_result {
    double seconds;
    long evaluated, prompt;
    char *replies[MAX_TURNS];
} chat_result;

/* One chat of turns turns on daemon d as app. 0, or -1 after a message. */
static int chat(const daemon_ *d, const char *app, int turns, chat_result *out)
{
    memset(out, 0, sizeof *out);
    json_object *msgs = json_object_new_array();
    json_object *sys = json_object_new_object();
    json_object_object_add(sys, "role", json_object_new_string("system"));
    json_object_object_add(sys, "content",
                           json_object_new_string("You answer questions about llmsd."));
    json_object_array_add(msgs, sys);
    double t0 = bench_now_s();
    int rc = 0;
    for (int t = 0; t < turns && rc == 0; t++) {
        char text[2048];
        user_message(text, sizeof text, t);
        json_object *m = json_object_new_object();
        json_object_object_add(m, "role", json_object_new_string("user"));
        json_object_object_add(m, "content", json_object_new_string(text));
        json_object_array_add(msgs, m);
        json_object *req = json_object_new_object();
        json_object_object_add(req, "messages", json_object_get(msgs));
        json_object_object_add(req, "temperature", json_object_new_double(0));
        json_object_object_add(req, "max_tokens", json_object_new_int(32));
        json_object *o = post_chat(d->hsock, app,
                                   json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN));
        json_object_put(req);
        json_object *content;
        long pt, ct;
        if (!reply_fields(o, &content, &pt, &ct)) {
            fprintf(stderr, "promptcache: turn %d failed: %s\n", t + 1,
                    o ? json_object_to_json_string(o) : "no reply");
            rc = -1;
        } else {
            out->prompt += pt;
            out->evaluated += pt - ct;
            out->replies[t] = strdup(json_object_get_string(content));
            json_object *a = json_object_new_object();
            json_object_object_add(a, "role", json_object_new_string("assistant"));
            json_object_object_add(a, "content", json_object_get(content));
            json_object_array_add(msgs, a);
        }
        json_object_put(o);
    }
    out->seconds = bench_now_s() - t0;
    json_object_put(msgs);
    return rc;
}

static void chat_free(chat_result *r)
{
    for (int t = 0; t < MAX_TURNS; t++)
        free(r->replies[t]);
}

/* One request of the shared scenario: question q under the long system prompt. */
typedef struct shared_ask {
    const daemon_ *d;
    const char *app;
    int q;
    long evaluated; /* -1: failed */
    char *reply;
} shared_ask;

static void *shared_ask_run(void *arg)
{
    shared_ask *a = arg;
    char system[8192] = "You answer questions about llmsd. What apps ask about:";
    for (int t = 0; t < 8; t++) {
        char text[1024];
        user_message(text, sizeof text, t);
        strncat(system, " ", sizeof system - strlen(system) - 1);
        strncat(system, text, sizeof system - strlen(system) - 1);
    }
    char question[128];
    snprintf(question, sizeof question, "In one sentence: what is question %d about?", a->q);
    json_object *req = json_object_new_object(), *msgs = json_object_new_array();
    const char *roles[2] = {"system", "user"}, *texts[2] = {system, question};
    for (int i = 0; i < 2; i++) {
        json_object *m = json_object_new_object();
        json_object_object_add(m, "role", json_object_new_string(roles[i]));
        json_object_object_add(m, "content", json_object_new_string(texts[i]));
        json_object_array_add(msgs, m);
    }
    json_object_object_add(req, "messages", msgs);
    json_object_object_add(req, "temperature", json_object_new_double(0));
    json_object_object_add(req, "max_tokens", json_object_new_int(16));
    json_object *o = post_chat(a->d->hsock, a->app,
                               json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN));
    json_object_put(req);
    json_object *content;
    long pt, ct;
    a->evaluated = -1;
    if (reply_fields(o, &content, &pt, &ct)) {
        a->evaluated = pt - ct;
        a->reply = strdup(json_object_get_string(content));
    } else {
        fprintf(stderr, "promptcache: shared question %d failed: %s\n", a->q,
                o ? json_object_to_json_string(o) : "no reply");
    }
    json_object_put(o);
    return NULL;
}

/* The shared scenario on d as app: the first request (unless burst), then SHARED_CLIENTS
 * at once; their wall time and prompt tokens evaluated together, and their replies (the
 * caller frees). 0, or -1 after a message. */
static int shared(const daemon_ *d, const char *app, bool burst, double *seconds,
                  long *evaluated, char *replies[SHARED_CLIENTS])
{
    shared_ask first = {.d = d, .app = app, .q = 0};
    if (!burst)
        shared_ask_run(&first);
    free(first.reply);
    if (!burst && first.evaluated < 0)
        return -1;
    shared_ask a[SHARED_CLIENTS];
    pthread_t t[SHARED_CLIENTS];
    double t0 = bench_now_s();
    int started = 0;
    for (int i = 0; i < SHARED_CLIENTS; i++) {
        a[i] = (shared_ask){.d = d, .app = app, .q = i + 1};
        started += pthread_create(&t[i], NULL, shared_ask_run, &a[i]) == 0;
    }
    for (int i = 0; i < started; i++)
        pthread_join(t[i], NULL);
    *seconds = bench_now_s() - t0;
    *evaluated = 0;
    int rc = started == SHARED_CLIENTS ? 0 : -1;
    for (int i = 0; i < SHARED_CLIENTS; i++) {
        replies[i] = i < started ? a[i].reply : NULL;
        rc |= i < started && a[i].evaluated >= 0 ? 0 : -1;
        *evaluated += i < started && a[i].evaluated > 0 ? a[i].evaluated : 0;
    }
    return rc;
}

/* The shared (or burst) scenario on both daemons, --runs times: its JSON lines. 0, or -1
 * after a message. */
static int shared_scenario(bool burst, int runs, int threads)
{
    const char *name = burst ? "burst" : "shared";
    double sh_secs[N_SYSTEMS][MAX_RUNS], sh_evald[N_SYSTEMS][MAX_RUNS];
    bool sh_same = true;
    int rc = 0;
    for (int r = 0; r < runs && rc == 0; r++) {
        char *replies[N_SYSTEMS][SHARED_CLIENTS] = {{NULL}};
        char app[32];
        snprintf(app, sizeof app, "%s%d", name, r);
        for (int k = 0; k < N_SYSTEMS && rc == 0; k++) {
            long e = 0;
            rc = shared(&daemons[k], app, burst, &sh_secs[k][r], &e, replies[k]);
            sh_evald[k][r] = (double)e;
        }
        for (int i = 0; i < SHARED_CLIENTS; i++) {
            sh_same &= rc == 0 && !strcmp(replies[CACHE][i], replies[OFF][i]);
            for (int k = 0; k < N_SYSTEMS; k++)
                free(replies[k][i]);
        }
    }
    if (rc)
        return -1;
    double med_s[N_SYSTEMS], med_e[N_SYSTEMS];
    for (int k = 0; k < N_SYSTEMS; k++) {
        med_s[k] = bench_median(sh_secs[k], runs);
        med_e[k] = bench_median(sh_evald[k], runs);
        printf("{\"bench\":\"promptcache\",\"scenario\":\"%s\",\"system\":\"%s\","
               "\"clients\":%d,\"runs\":%d,\"threads\":%d,\"evaluated_tokens\":%.0f,"
               "\"seconds\":%.3f}\n",
               name, system_names[k], SHARED_CLIENTS, runs, threads, med_e[k], med_s[k]);
    }
    printf("{\"bench\":\"promptcache\",\"scenario\":\"%s\",\"ratio\":\"cache/off\","
           "\"seconds\":%.3f,\"evaluated_tokens\":%.3f,\"same_replies\":%s}\n",
           name, med_s[CACHE] / med_s[OFF], med_e[CACHE] / med_e[OFF], sh_same ? "true" : "false");
    return 0;
}

int main(int argc, char **argv)
{
    int turns = 8, runs = 3, threads = 1;
    const char *llmsd = "build/llmsd", *model = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--turns") && i + 1 < argc)
            turns = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--runs") && i + 1 < argc)
            runs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--llmsd") && i + 1 < argc)
            llmsd = argv[++i];
        else if (!strcmp(argv[i], "--model") && i + 1 < argc)
            model = argv[++i];
        else {
            fprintf(stderr, "usage: promptcache [--turns N] [--runs N] [--threads N] "
                            "[--llmsd PATH] [--model PATH]\n");
            return 2;
        }
    }
    if (turns < 1 || turns > MAX_TURNS || runs < 1 || runs > MAX_RUNS) {
        fprintf(stderr, "promptcache: --turns 1..%d, --runs 1..%d\n", MAX_TURNS, MAX_RUNS);
        return 2;
    }
    static char found[1024];
    if (!model) {
        const char *root = getenv("LLMS_TESTDATA");
        snprintf(found, sizeof found, "%s/models/docs-lm-21M-F16.gguf",
                 root ? root : "../shared/testdata");
        model = found;
    }
    if (access(model, R_OK) != 0) {
        fprintf(stderr, "promptcache: no model %s (--model)\n", model);
        return 1;
    }
    char tmpl[] = "/tmp/llmsd-bench-pcache-XXXXXX";
    if (!mkdtemp(tmpl))
        return 1;
    const char *extras[N_SYSTEMS] = {"", "prompt_cache_mb = 0\n"};
    for (int k = 0; k < N_SYSTEMS; k++) {
        snprintf(daemons[k].dir, sizeof daemons[k].dir, "%s/%s", tmpl, system_names[k]);
        if (start(&daemons[k], llmsd, model, threads, extras[k])) {
            stop_all();
            return 1;
        }
    }
    double secs[N_SYSTEMS][MAX_RUNS], evald[N_SYSTEMS][MAX_RUNS];
    long prompt = 0;
    bool same = true;
    int rc = 0;
    for (int r = 0; r < runs && rc == 0; r++) {
        chat_result res[N_SYSTEMS];
        char app[32];
        snprintf(app, sizeof app, "chat%d", r);
        for (int k = 0; k < N_SYSTEMS && rc == 0; k++) {
            rc = chat(&daemons[k], app, turns, &res[k]);
            secs[k][r] = res[k].seconds;
            evald[k][r] = (double)res[k].evaluated;
            prompt = res[k].prompt;
        }
        for (int t = 0; rc == 0 && t < turns; t++)
            same &= !strcmp(res[CACHE].replies[t], res[OFF].replies[t]);
        for (int k = 0; k < N_SYSTEMS; k++)
            chat_free(&res[k]);
    }
    if (rc) {
        stop_all();
        return 1;
    }
    double med_s[N_SYSTEMS], med_e[N_SYSTEMS];
    for (int k = 0; k < N_SYSTEMS; k++) {
        med_s[k] = bench_median(secs[k], runs);
        med_e[k] = bench_median(evald[k], runs);
        printf("{\"bench\":\"promptcache\",\"scenario\":\"chat\",\"system\":\"%s\","
               "\"turns\":%d,\"runs\":%d,"
               "\"threads\":%d,\"prompt_tokens\":%ld,\"evaluated_tokens\":%.0f,"
               "\"seconds\":%.3f}\n",
               system_names[k], turns, runs, threads, prompt, med_e[k], med_s[k]);
    }
    printf("{\"bench\":\"promptcache\",\"scenario\":\"chat\",\"ratio\":\"cache/off\","
           "\"seconds\":%.3f,"
           "\"evaluated_tokens\":%.3f,\"same_replies\":%s}\n",
           med_s[CACHE] / med_s[OFF], med_e[CACHE] / med_e[OFF], same ? "true" : "false");
    for (int burst = 0; burst < 2 && rc == 0; burst++)
        rc = shared_scenario(burst, runs, threads);
    stop_all();
    return rc ? 1 : 0;
}
