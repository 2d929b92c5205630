/*
 * abuse — how long another uid's request takes while one local user attacks llmsd, next
 * to the same request with no attack, in the same run (issue 40).
 *
 *   build/bench/abuse [rounds [attack...]]     (default: 7 rounds, every attack)
 *
 * Starts llmsd of this build with its HTTP gateway on a Unix socket, on
 * ../shared/testdata/models/TinyStories-656K-Q8_0.gguf (the model issue 40 was measured
 * on; exit 2 without it), with 1024 descriptors. Each attack runs from a forked
 * child that drops root for uid 61001, so the bench needs root (it says so and exits 2
 * without). While an attack holds, this process (uid 0, app "victim") sends `rounds`
 * (default 7) greedy 16-token completions, each on a new connection, each in a child
 * killed after 10 s (a failure). One JSON line per attack:
 *
 *   {"bench":"abuse","attack":...,"victim_ms_median":...,"victim_ms_max":...,
 *    "baseline_ms_median":...,"ratio":...,"victim_failures":...,"daemon_cpu_pct":...,
 *    "daemon_log_lines":...,"daemon_rss_growth_mb":...,"detail":...}
 *
 * ratio is the median under attack over the no-attack median measured first;
 * daemon_cpu_pct is the daemon's CPU time over the attack's wall time (100 = one core),
 * which includes work the attacker may legitimately ask for (a KbAdd's embedding).
 * Attacks, as issue 40 found them:
 *   kb_ingest       two connections each adding a 1 MB document again and again
 *   partial_frames  4 connections that announce 16 MB frames and send 4 KiB of each;
 *                   (the victim also sends an 80 KB Embed frame, its baseline too)
 *   http_slowloris  400 HTTP connections sending one header byte a second
 *   http_fd_flood   HTTP connections opened until the daemon's descriptors run out
 *   http_bodies     64 HTTP requests announcing 8 MB bodies (under http_max_body_bytes),
 *                   each sending 4 MB
 */
#include <fcntl.h>
#include <grp.h>
#include <libgen.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "bench.h"
#include "proto/frame.h"

#define ATTACKER_UID 61001
#define DAEMON_FDS 1024
#define PROBE_TIMEOUT_S 10
#define MAX_ROUNDS 64
#define MAX_ATTACK_FDS 4096

static char sock_path[1024];
static char http_path[1024];
static char log_path[1024];
static pid_t daemon_pid = -1;

/* ---- the daemon as a process ---- */

static double daemon_cpu_s(void)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)daemon_pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    unsigned long utime = 0, stime = 0;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime,
                     &stime) != 2)
        return -1;
    return (double)(utime + stime) / (double)sysconf(_SC_CLK_TCK);
}

static double daemon_rss_mb(void)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)daemon_pid);
    FILE *f = fopen(path, "r");
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmRSS:", 6) == 0)
            kb = strtol(line + 6, NULL, 10);
    if (f)
        fclose(f);
    return (double)kb / 1024.0;
}

static long log_lines(void)
{
    FILE *f = fopen(log_path, "r");
    long n = 0;
    for (int ch; f && (ch = getc(f)) != EOF;)
        n += ch == '\n';
    if (f)
        fclose(f);
    return n;
}

/* ---- sockets ---- */

/* A connection to path; with nonblock, one that fails at once (EAGAIN) where the
 * listener's backlog is full instead of waiting for the daemon to accept. */
static int unix_connect(const char *path, bool nonblock)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | (nonblock ? SOCK_NONBLOCK : 0), 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0)
        return fd;
    if (fd >= 0)
        close(fd);
    return -1;
}

static int send_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* ---- the victim ---- */

static char *ingest_text(size_t n, uint32_t seed)
{
    static const char *words[] = {"the", "little", "dog", "ran", "to", "a", "big", "tree",
                                  "and", "saw", "bird", "that", "sang", "happy", "song",
                                  "in", "warm", "sun", "with", "friends"};
    char *t = malloc(n + 1);
    if (!t)
        return NULL;
    size_t i = 0;
    uint64_t s = 0x9e3779b97f4a7c15ull ^ seed;
    while (i < n) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        const char *w = words[s % 20];
        for (size_t k = 0; w[k] && i < n; k++)
            t[i++] = w[k];
        if (i < n)
            t[i++] = (s >> 32) % 12 == 0 ? '.' : ' ';
    }
    t[n] = '\0';
    return t;
}


/* One request of the victim: connect, bind, a 16-token completion (and with big, an
 * Embed of 100 texts of 800 bytes, a frame over 64 KiB), in a child killed after
 * PROBE_TIMEOUT_S. Milliseconds, or -1 when it failed or timed out. */
static double victim_request(bool big)
{
    double t0 = bench_now_s();
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        alarm(PROBE_TIMEOUT_S);
        llms_conn *c;
        if (llms_connect(sock_path, &c, NULL) != LLMS_OK)
            _exit(1);
        llms_params p;
        llms_params_init(&p);
        p.temperature = 0;
        p.max_tokens = 16;
        enum llms_status s = llms_bind(c, "victim");
        if (s == LLMS_OK)
            s = llms_complete(c, "Once upon a time", NULL, 0, &p, NULL, NULL, NULL);
        if (s == LLMS_OK && big) {
            char *text = ingest_text(800, 3);
            const char *texts[100];
            for (int i = 0; i < 100; i++)
                texts[i] = text;
            llms_embeddings e;
            s = text ? llms_embed(c, texts, 100, LLMS_POOLING_MEAN, &e) : LLMS_ERR_IO;
            if (s == LLMS_OK)
                llms_embeddings_free(&e);
        }
        llms_close(c);
        _exit(s == LLMS_OK ? 0 : 1);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    return ok ? (bench_now_s() - t0) * 1000 : -1;
}

typedef struct victim_figures {
    double median_ms, max_ms; /* of the requests answered */
    int failures;
} victim_figures;

static victim_figures victim_rounds(int rounds, bool big)
{
    double ms[MAX_ROUNDS];
    int n = 0;
    victim_figures v = {0};
    for (int i = 0; i < rounds; i++) {
        double t = victim_request(big);
        if (t < 0)
            v.failures++;
        else
            ms[n++] = t;
        usleep(100 * 1000);
    }
    for (int i = 0; i < n; i++)
        v.max_ms = ms[i] > v.max_ms ? ms[i] : v.max_ms;
    v.median_ms = n ? bench_median(ms, n) : -1;
    return v;
}

/* ---- the attacker ---- */

/* An attack: runs as the attacker until killed; writes one byte to ready once in place
 * (and may write a detail line before it, at most 200 bytes). */
typedef void (*attack_fn)(int ready);

static void attack_ready(int ready, const char *detail)
{
    char line[201] = "";
    snprintf(line, sizeof line, "%s", detail ? detail : "");
    if (write(ready, line, sizeof line) != (ssize_t)sizeof line)
        _exit(1);
}

static void hold_forever(void)
{
    for (;;)
        pause();
}

static void kb_ingest(int ready)
{
    for (int i = 0; i < 2; i++) {
        pid_t pid = fork();
        if (pid < 0)
            _exit(1);
        if (pid > 0)
            continue;
        char *text = ingest_text(1 << 20, 7u + (uint32_t)i);
        llms_conn *c;
        if (!text || llms_connect(sock_path, &c, NULL) != LLMS_OK || llms_bind(c, "ingest"))
            _exit(1);
        char kb[16];
        snprintf(kb, sizeof kb, "kb%d", i);
        llms_kb_create(c, kb, 0, 0);
        llms_kb_doc doc = {"doc", text, NULL};
        for (;;)
            llms_kb_add(c, kb, &doc, 1, NULL);
    }
    sleep(1);
    attack_ready(ready, NULL);
    hold_forever();
}

static int bind_raw(int fd, const char *app)
{
    Llms__BindRequest b = LLMS__BIND_REQUEST__INIT;
    b.app_name = (char *)app;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.id = 1;
    req.body_case = LLMS__REQUEST__BODY_BIND;
    req.bind = &b;
    uint8_t *buf, h[FRAME_HEADER_BYTES];
    size_t len;
    if (frame_pack(&req.base, UINT32_MAX, &buf, &len) < 0)
        return -1;
    int rc = send_all(fd, buf, len);
    free(buf);
    /* the Bind answer: a header and a short body, read whole */
    if (rc == 0 && recv(fd, h, sizeof h, MSG_WAITALL) != (ssize_t)sizeof h)
        return -1;
    uint32_t n = (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 |
                 (uint32_t)h[3] << 24;
    char body[512];
    return rc == 0 && n <= sizeof body && recv(fd, body, n, MSG_WAITALL) == (ssize_t)n ? 0 : -1;
}

static void partial_frames(int ready)
{
    static char junk[4096];
    int held = 0;
    for (int i = 0; i < 4; i++) {
        int fd = unix_connect(sock_path, false);
        uint8_t h[FRAME_HEADER_BYTES];
        frame_put_header(h, 16u << 20);
        if (fd >= 0 && bind_raw(fd, "frames") == 0 && send_all(fd, h, sizeof h) == 0 &&
            send_all(fd, junk, sizeof junk) == 0)
            held++;
    }
    char detail[64];
    snprintf(detail, sizeof detail, "%d partial 16 MB frames held", held);
    attack_ready(ready, detail);
    hold_forever();
}

/* Opens up to n connections to the HTTP socket (nonblock: until its backlog is full),
 * each sending prefix; how many opened. */
static int http_open(int *fds, int n, const char *prefix, bool nonblock)
{
    int opened = 0;
    for (int i = 0; i < n; i++) {
        int fd = unix_connect(http_path, nonblock);
        if (fd < 0)
            break;
        if (prefix && send_all(fd, prefix, strlen(prefix)) != 0) {
            close(fd);
            break;
        }
        fds[opened++] = fd;
    }
    return opened;
}

static void http_slowloris(int ready)
{
    static int fds[400];
    int n = http_open(fds, 400, "POST /v1/completions HTTP/1.1\r\n", false);
    char detail[64];
    snprintf(detail, sizeof detail, "%d connections trickling headers", n);
    attack_ready(ready, detail);
    for (;;) {
        sleep(1);
        for (int i = 0; i < n; i++)
            send(fds[i], "X", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
}

static void http_fd_flood(int ready)
{
    /* non-blocking connects, retried while the listener's backlog is full, until past
     * the daemon's descriptors or 5 s */
    static int fds[MAX_ATTACK_FDS];
    int n = 0;
    for (double end = bench_now_s() + 5; n < DAEMON_FDS + 200 && bench_now_s() < end;) {
        int got = http_open(fds + n, DAEMON_FDS + 200 - n, NULL, true);
        n += got;
        if (!got)
            usleep(1000);
    }
    char detail[64];
    snprintf(detail, sizeof detail, "%d connections opened", n);
    attack_ready(ready, detail);
    hold_forever();
}

static void http_bodies(int ready)
{
    static int fds[64];
    static char chunk[1 << 16];
    memset(chunk, ' ', sizeof chunk);
    const char *head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                       "Content-Type: application/json\r\nContent-Length: 8000000\r\n\r\n";
    int n = http_open(fds, 64, head, false), refused = 0, too_large = 0;
    long sent = 0;
    for (int i = 0; i < n; i++) {
        /* 4 MB each, unless the gateway stops reading (or answered) for 1 s */
        struct timeval tv = {1, 0};
        setsockopt(fds[i], SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        for (int k = 0; k < 64; k++) {
            ssize_t w = send(fds[i], chunk, sizeof chunk, MSG_NOSIGNAL);
            if (w <= 0)
                break;
            sent += w;
        }
    }
    usleep(300 * 1000);
    for (int i = 0; i < n; i++) {
        char answer[16] = "";
        ssize_t r = recv(fds[i], answer, sizeof answer - 1, MSG_DONTWAIT);
        refused += r > 12 && (strncmp(answer + 9, "429", 3) == 0 ||
                              strncmp(answer + 9, "503", 3) == 0);
        too_large += r > 12 && strncmp(answer + 9, "413", 3) == 0;
    }
    char detail[128];
    snprintf(detail, sizeof detail,
             "%d bodies started, %ld MB sent, %d answered 429/503, %d answered 413", n,
             sent >> 20, refused, too_large);
    attack_ready(ready, detail);
    hold_forever();
}

/* Forks the attacker (uid ATTACKER_UID, descriptors raised) running fn; its pid and the
 * detail it reported once in place, or -1. */
static pid_t attacker_start(attack_fn fn, char *detail, size_t cap)
{
    int p[2];
    if (pipe(p) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        setpgid(0, 0);
        struct rlimit rl = {MAX_ATTACK_FDS, MAX_ATTACK_FDS};
        setrlimit(RLIMIT_NOFILE, &rl);
        if (setgroups(0, NULL) != 0 || setgid(ATTACKER_UID) != 0 || setuid(ATTACKER_UID) != 0)
            _exit(1);
        fn(p[1]);
        _exit(0);
    }
    close(p[1]);
    char line[201] = "";
    struct pollfd pf = {.fd = p[0], .events = POLLIN};
    bool ok = pid > 0 && poll(&pf, 1, 60 * 1000) == 1 &&
              read(p[0], line, sizeof line) == (ssize_t)sizeof line;
    close(p[0]);
    line[200] = '\0';
    snprintf(detail, cap, "%s", line);
    if (!ok && pid > 0) {
        kill(-pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return -1;
    }
    return pid;
}

static void attacker_stop(pid_t pid)
{
    kill(-pid, SIGKILL);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
}

/* ---- main ---- */

static int run_attack(const char *name, attack_fn fn, bool big, int rounds, double base_ms)
{
    double rss0 = daemon_rss_mb();
    long lines0 = log_lines();
    char detail[201];
    pid_t pid = attacker_start(fn, detail, sizeof detail);
    if (pid < 0) {
        fprintf(stderr, "abuse: %s: the attack did not get in place\n", name);
        return -1;
    }
    double t0 = bench_now_s(), cpu0 = daemon_cpu_s(), rss_peak = daemon_rss_mb();
    victim_figures v = victim_rounds(rounds, big);
    double wall = bench_now_s() - t0, cpu = daemon_cpu_s() - cpu0;
    double rss = daemon_rss_mb();
    rss_peak = rss > rss_peak ? rss : rss_peak;
    long lines = log_lines() - lines0;
    attacker_stop(pid);
    printf("{\"bench\":\"abuse\",\"attack\":\"%s\",\"victim_ms_median\":%.1f,"
           "\"victim_ms_max\":%.1f,\"baseline_ms_median\":%.1f,\"ratio\":%.2f,"
           "\"victim_failures\":%d,\"rounds\":%d,\"daemon_cpu_pct\":%.0f,"
           "\"daemon_log_lines\":%ld,\"daemon_rss_growth_mb\":%.1f,\"detail\":\"%s\"}\n",
           name, v.median_ms, v.max_ms, base_ms, v.median_ms > 0 ? v.median_ms / base_ms : -1,
           v.failures, rounds, 100 * cpu / wall, lines, rss_peak - rss0, detail);
    fflush(stdout);
    /* the daemon closes the attacker's connections and finishes its work before the next */
    for (double end = bench_now_s() + 60; bench_now_s() < end; usleep(200 * 1000))
        if (victim_request(false) >= 0)
            break;
    return 0;
}

/* Whether the command line (after the rounds) names attack, or names none. */
static bool chosen(int argc, char **argv, const char *attack)
{
    for (int i = 2; i < argc; i++)
        if (strcmp(argv[i], attack) == 0)
            return true;
    return argc <= 2;
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 7;
    if (rounds < 1 || rounds > MAX_ROUNDS) {
        fprintf(stderr, "usage: %s [rounds 1..%d]\n", argv[0], MAX_ROUNDS);
        return 2;
    }
    if (geteuid() != 0) {
        fprintf(stderr, "abuse: needs root, to run the attacker as a second uid\n");
        return 2;
    }
    char self[1024], llmsd[1100];
    snprintf(self, sizeof self, "%s", argv[0]);
    snprintf(llmsd, sizeof llmsd, "%s/../llmsd", dirname(self));
    if (access(llmsd, X_OK) != 0) {
        fprintf(stderr, "abuse: %s is not built\n", llmsd);
        return 2;
    }
    const char *model = "../shared/testdata/models/TinyStories-656K-Q8_0.gguf";
    if (access(model, R_OK) != 0) {
        fprintf(stderr, "abuse: %s is absent (run from the repository, ../shared beside it)\n",
                model);
        return 2;
    }
    char dir[] = "/tmp/llms-abuse-XXXXXX";
    if (!mkdtemp(dir) || chmod(dir, 0755) != 0) {
        fprintf(stderr, "abuse: temporary directory: %s\n", strerror(errno));
        return 1;
    }
    char conf[2048];
    snprintf(http_path, sizeof http_path, "%s/http", dir);
    snprintf(log_path, sizeof log_path, "%s/llmsd.log", dir);
    snprintf(conf, sizeof conf,
             "model = %s\nhttp_socket = %s\nsocket_mode = 0666\nlog_level = warn\n", model,
             http_path);
    daemon_pid = bench_llmsd_start("abuse", llmsd, dir, conf, sock_path, sizeof sock_path);
    if (daemon_pid < 0)
        return 1;
    struct rlimit rl = {DAEMON_FDS, DAEMON_FDS};
    if (prlimit(daemon_pid, RLIMIT_NOFILE, &rl, NULL) != 0)
        fprintf(stderr, "abuse: prlimit: %s\n", strerror(errno));

    /* the no-attack baselines: the completion alone, and with the 80 KB Embed */
    victim_figures base[2];
    int rc = 0;
    for (int big = 0; big < 2; big++) {
        base[big] = victim_rounds(rounds, big);
        printf("{\"bench\":\"abuse\",\"attack\":\"none\",\"victim\":\"%s\","
               "\"victim_ms_median\":%.1f,\"victim_ms_max\":%.1f,\"victim_failures\":%d,"
               "\"rounds\":%d,\"model\":\"%s\"}\n",
               big ? "complete+embed 80 KB" : "complete", base[big].median_ms,
               base[big].max_ms, base[big].failures, rounds, model);
        rc |= base[big].failures ? 1 : 0;
    }
    static const struct {
        const char *name;
        attack_fn fn;
        bool big;
    } attacks[] = {{"kb_ingest", kb_ingest, false},
                   {"partial_frames", partial_frames, true},
                   {"http_slowloris", http_slowloris, false},
                   {"http_fd_flood", http_fd_flood, false},
                   {"http_bodies", http_bodies, false}};
    for (size_t i = 0; rc == 0 && i < sizeof attacks / sizeof *attacks; i++)
        if (chosen(argc, argv, attacks[i].name) && run_attack(attacks[i].name, attacks[i].fn, attacks[i].big, rounds,
                       base[attacks[i].big].median_ms) != 0)
            rc = 1;
    bench_llmsd_stop(daemon_pid);
    char cmd[1100];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "abuse: could not remove %s\n", dir);
    return rc;
}
