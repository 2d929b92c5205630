/*
 * llmsd_proc.h — starting and stopping a real llmsd for the integration tests.
 *
 * Each daemon gets a directory under test_tmpdir() holding its config, log, socket and
 * state; starting again with the same name reuses the state (restart after a crash).
 * Header-only (static inline) because the Makefile links tests only with
 * tests/support, and these helpers are for the integration tests alone.
 */
#ifndef LLMS_TESTS_LLMSD_PROC_H
#define LLMS_TESTS_LLMSD_PROC_H

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client/llms.h"
#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"
#include "tests/support/test.h"

/* The frame limit every test daemon is configured with. */
#define LLMSD_PROC_MAX_FRAME 65536

typedef struct llmsd_proc {
    pid_t pid;
    char dir[512];   /* its config, log, socket and state live here */
    char sock[600];
    char log[600];
} llmsd_proc;

/* snprintf that ends the program rather than use a truncated path or command. */
__attribute__((format(printf, 3, 4))) static inline void proc_fmt(char *buf, size_t cap,
                                                                  const char *f, ...)
{
    va_list ap;
    va_start(ap, f);
    int n = vsnprintf(buf, cap, f, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= cap) {
        fprintf(stderr, "a test path or command is too long\n");
        exit(1);
    }
}

static inline double proc_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Finds llmsd beside the test program's build (argv0 = BUILD/tests/x/test_y); writes ""
 * when it is not built. */
static inline void proc_find_llmsd(const char *argv0, char *out, size_t cap)
{
    char self[1024];
    proc_fmt(self, sizeof self, "%s", argv0);
    char *slash = strrchr(self, '/');
    if (slash)
        *slash = '\0';
    proc_fmt(out, cap, "%s/../../llmsd", slash ? self : ".");
    if (access(out, X_OK) != 0)
        out[0] = '\0';
}

/* Writes the random-weight model mp into test_tmpdir()/name and its path into path;
 * on failure says why and leaves path empty (the tests that need it then skip). */
static inline void proc_generate_model(char *path, size_t cap, const char *name,
                                       const modelgen_params *mp)
{
    char err[ERR_MAX];
    proc_fmt(path, cap, "%s/%s", test_tmpdir(), name);
    if (modelgen_write(mp, path, err) < 0) {
        fprintf(stderr, "modelgen: %s\n", err);
        path[0] = '\0';
    }
}

/* Greedy sampling of at most max_tokens on model (NULL: the default). */
static inline llms_params proc_greedy(int max_tokens, const char *model)
{
    llms_params p;
    llms_params_init(&p);
    p.temperature = 0;
    p.max_tokens = max_tokens;
    p.model = model;
    return p;
}

/* A small bert encoder (32 wide, 2 layers, F16, mean pooling) on vocab: what the tests
 * that embed with a registry model generate; change the fields for other shapes. */
static inline modelgen_params proc_bert_params(const gguf_file *vocab)
{
    return (modelgen_params){.arch = "bert", .dim = 32, .n_layer = 2, .n_head = 2,
                             .n_head_kv = 2, .n_ff = 64, .n_ctx = 128, .type = QTYPE_F16,
                             .seed = 2, .vocab = vocab, .n_threads = 1, .pooling_type = 1};
}

static inline void proc_print_log(const llmsd_proc *d)
{
    FILE *f = fopen(d->log, "r");
    char line[512];
    if (!f)
        return;
    fprintf(stderr, "---- llmsd log (%s)\n", d->log);
    while (fgets(line, sizeof line, f))
        fprintf(stderr, "     %s", line);
    fclose(f);
}

/* Daemons this program started: a failed CHECK returns before the test's proc_stop, and
 * its daemon must not outlive the test program (it ran on with parent 1). */
static pid_t proc_started[64];

/* At exit: kills and reaps the started daemons still this program's children (a pid
 * the test reaped itself is no child any more, and is left alone whoever has it now). */
static inline void proc_kill_leftovers(void)
{
    for (size_t i = 0; i < sizeof proc_started / sizeof *proc_started; i++) {
        pid_t pid = proc_started[i];
        int status;
        if (pid <= 0 || waitpid(pid, &status, WNOHANG) != 0)
            continue;
        kill(pid, SIGKILL);
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
            ;
    }
}

/* Puts pid in the slot of in_place_of (0: a free slot; proc_stop frees its own). A
 * daemon the test reaped itself keeps its slot, and is never reaped here: the test's own
 * waitpid must find it. */
static inline void proc_track(pid_t pid, pid_t in_place_of)
{
    static bool registered;
    if (!registered)
        registered = atexit(proc_kill_leftovers) == 0;
    for (size_t i = 0; i < sizeof proc_started / sizeof *proc_started; i++)
        if (proc_started[i] == in_place_of) {
            proc_started[i] = pid;
            return;
        }
}

/*
 * Starts the llmsd program with a config naming model, the state directory of name and
 * extra "key = value" lines; waits (up to 60 s: sanitizer builds load slowly) until it
 * accepts connections. 0, or -1 after printing its log.
 */
static inline int proc_start(llmsd_proc *d, const char *llmsd, const char *name,
                             const char *model, const char *extra)
{
    memset(d, 0, sizeof *d);
    proc_fmt(d->dir, sizeof d->dir, "%s/%s", test_tmpdir(), name);
    mkdir(d->dir, 0755);
    proc_fmt(d->sock, sizeof d->sock, "%s/s", d->dir);
    proc_fmt(d->log, sizeof d->log, "%s/llmsd.log", d->dir);
    char conf[700];
    proc_fmt(conf, sizeof conf, "%s/llmsd.conf", d->dir);
    FILE *f = fopen(conf, "w");
    if (!f)
        return -1;
    fprintf(f, "model = %s\nsocket = %s\nstate_dir = %s/state\nthreads = 1\nn_ctx = 512\n"
               "max_frame_bytes = %d\nkv_budget_mb = 64\n%s",
            model, d->sock, d->dir, LLMSD_PROC_MAX_FRAME, extra ? extra : "");
    fclose(f);

    d->pid = fork();
    if (d->pid < 0)
        return -1;
    if (d->pid == 0) {
        int fd = open(d->log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execl(llmsd, "llmsd", "--config", conf, (char *)NULL);
        _exit(127);
    }
    proc_track(d->pid, 0);
    double deadline = proc_now() + 60;
    while (proc_now() < deadline) {
        int status;
        if (waitpid(d->pid, &status, WNOHANG) == d->pid) {
            d->pid = 0;
            proc_print_log(d);
            return -1;
        }
        llms_conn *c;
        if (llms_connect(d->sock, &c, NULL) == LLMS_OK) {
            llms_close(c);
            return 0;
        }
        usleep(20000);
    }
    proc_print_log(d);
    return -1;
}

/* Sends sig and waits for the exit: its exit status, or -1 when a signal ended it. */
static inline int proc_stop(llmsd_proc *d, int sig)
{
    if (d->pid <= 0)
        return -1;
    kill(d->pid, sig);
    int status;
    while (waitpid(d->pid, &status, 0) < 0 && errno == EINTR)
        ;
    proc_track(0, d->pid);
    d->pid = 0;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The test that ends a file whose tests share one daemon started on first use (*up: 1
 * running, -1 it failed to start, 0 not started): SIGTERM ends it with status 0, so that
 * under the sanitizers nothing leaked or went wrong in it (its log says what did). Skips
 * when it did not run. */
static inline void proc_check_clean_exit(llmsd_proc *d, int *up)
{
    if (*up != 1)
        SKIP("the daemon did not run");
    *up = 0;
    int rc = proc_stop(d, SIGTERM);
    if (rc != 0)
        proc_print_log(d);
    CHECK_EQ(rc, 0);
}

/* The daemon's status (the connection must be admin's); 0, or -1 after a message. */
static inline int proc_status(llms_conn *c, llms_daemon_status *st)
{
    if (llms_status_get(c, st) != LLMS_OK) {
        fprintf(stderr, "status: %s\n", llms_last_error(c));
        return -1;
    }
    return 0;
}

/* A connection to d bound to app (not bound when app is NULL); NULL after a message. */
static inline llms_conn *proc_connect(const llmsd_proc *d, const char *app)
{
    llms_conn *c;
    char err[LLMS_ERROR_MAX];
    if (llms_connect(d->sock, &c, err) != LLMS_OK) {
        fprintf(stderr, "connect: %s\n", err);
        return NULL;
    }
    if (app && llms_bind(c, app) != LLMS_OK) {
        fprintf(stderr, "bind %s: %s\n", app, llms_last_error(c));
        llms_close(c);
        return NULL;
    }
    return c;
}

/* Whether d still takes a new client of app and answers it (a Tokenize): what the abuse
 * tests check once they are done. */
static inline bool proc_still_answers(const llmsd_proc *d, const char *app)
{
    llms_conn *c = proc_connect(d, app);
    int32_t *toks = NULL;
    size_t n;
    bool ok = c && llms_tokenize(c, "still here", 1, 0, &toks, &n) == LLMS_OK;
    free(toks);
    if (c)
        llms_close(c);
    return ok;
}

#endif
