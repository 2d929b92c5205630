/*
 * Who may reach the HTTP gateway (daemon/net/http.h): its Unix socket gets the clients'
 * group and socket_mode, so a member of that group connects and reads nothing of the
 * state directory, and a user outside it cannot connect; the TCP gateway's tokens file
 * is refused (llmsd does not start, the error names the file and line) when it is unsafe
 * to trust: a uid outside uid_t, a short or repeated token, a file others may read or
 * anyone but its owner may write, or owned by another user.
 *
 * The socket tests act as a second uid, which needs root: without it they skip.
 */
#include <errno.h>
#include <dirent.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"
#include "tests/integration/httpc.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/support/test.h"

#define MEMBER_UID 61011   /* no account needed: root may take any uid and gid */
#define MEMBER_GID 61012
#define GOOD_TOKEN "good-token-0123456789abcdef"

static char llmsd_path[1024], model_path[1024];

/* A group that exists and is neither root's nor the test's (getgrnam must find it). */
static const struct group *other_group(void)
{
    static const char *const names[] = {"nogroup", "users", "daemon"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        struct group *g = getgrnam(names[i]);
        if (g && g->gr_gid != 0 && g->gr_gid != getgid())
            return g;
    }
    return NULL;
}

/*
 * In a child that drops root to MEMBER_UID, with supplementary_gid as its one extra
 * group (none when (gid_t)-1): the HTTP status of GET /health on the socket (0 when it
 * could not connect), and whether it could list the state directory (exit code bit 8).
 */
static int as_member(const char *sock, const char *state_dir, gid_t supplementary_gid,
                     int *listed_state)
{
    pid_t pid = fork();
    if (pid == 0) {
        gid_t groups[1] = {supplementary_gid};
        if (setgroups(supplementary_gid == (gid_t)-1 ? 0 : 1, groups) != 0 ||
            setresgid(MEMBER_GID, MEMBER_GID, MEMBER_GID) != 0 ||
            setresuid(MEMBER_UID, MEMBER_UID, MEMBER_UID) != 0)
            _exit(255);
        httpc_reply r;
        int status = httpc_do(sock, 0, "GET", "/health", NULL, NULL, &r) == 0 ? r.status : 0;
        if (status)
            httpc_reply_free(&r);
        int code = status == 200 ? 1 : 0;
        if (opendir(state_dir))
            code |= 2;
        _exit(code);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(st) || WEXITSTATUS(st) == 255)
        return -1;
    *listed_state = (WEXITSTATUS(st) & 2) != 0;
    return WEXITSTATUS(st) & 1 ? 200 : 0;
}

static void socket_takes_group_and_mode(void)
{
    if (!llmsd_path[0] || !model_path[0])
        SKIP("llmsd or its model is missing");
    if (geteuid() != 0)
        SKIP("needs root to act as a member of the socket's group (a second uid)");
    const struct group *g = other_group();
    if (!g)
        SKIP("no group other than root's and the test's exists here");
    gid_t gid = g->gr_gid;
    char gname[64];
    snprintf(gname, sizeof gname, "%s", g->gr_name);

    chmod(test_tmpdir(), 0755);
    char hsock[700], extra[1024];
    proc_fmt(hsock, sizeof hsock, "%s/grp/h.sock", test_tmpdir());
    proc_fmt(extra, sizeof extra, "http_socket = %s\nhttp_socket_group = %s\nsocket_mode = 0660\n",
             hsock, gname);
    llmsd_proc d;
    CHECK_MSG(proc_start(&d, llmsd_path, "grp", model_path, extra) == 0, "llmsd did not start");
    chmod(d.dir, 0755);
    char hdir[700], state[700];
    proc_fmt(hdir, sizeof hdir, "%s/grp", test_tmpdir());
    chmod(hdir, 0755);
    proc_fmt(state, sizeof state, "%s/state", d.dir);

    struct stat st;
    CHECK_EQ(stat(hsock, &st), 0);
    CHECK_MSG(st.st_gid == gid, "the socket's group is %u, not %s (%u)", (unsigned)st.st_gid,
              gname, (unsigned)gid);
    CHECK_MSG((st.st_mode & 0777) == 0660, "the socket's mode is %04o", (unsigned)(st.st_mode & 0777));

    int listed = 0;
    CHECK_EQ(as_member(hsock, state, gid, &listed), 200);
    CHECK_MSG(!listed, "a member of %s could list llmsd's state directory", gname);
    CHECK_EQ(as_member(hsock, state, (gid_t)-1, &listed), 0);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

/* Without http_socket_group the socket has the group of the clients' socket: the
 * daemon's own when llmsd made that socket itself (not socket-activated). */
static void socket_group_defaults_to_the_clients_socket(void)
{
    if (!llmsd_path[0] || !model_path[0])
        SKIP("llmsd or its model is missing");
    char hsock[700], extra[1024];
    proc_fmt(hsock, sizeof hsock, "%s/dflt-h.sock", test_tmpdir());
    proc_fmt(extra, sizeof extra, "http_socket = %s\n", hsock);
    llmsd_proc d;
    CHECK_MSG(proc_start(&d, llmsd_path, "dflt", model_path, extra) == 0, "llmsd did not start");
    struct stat hs, cs;
    CHECK_EQ(stat(hsock, &hs), 0);
    CHECK_EQ(stat(d.sock, &cs), 0);
    CHECK_EQ(hs.st_gid, cs.st_gid);
    CHECK_EQ(hs.st_mode & 0777, cs.st_mode & 0777);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);

    char cmd[4096], out[4096];
    proc_fmt(cmd, sizeof cmd,
             "'%s' --model '%s' --socket '%s/ng.sock' --state_dir '%s/ng' --threads 1 "
             "--http_socket '%s/ng-h.sock' --http_socket_group no-such-group-llmsd 2>&1",
             llmsd_path, model_path, test_tmpdir(), test_tmpdir(), test_tmpdir());
    CHECK_EQ(test_run_capture(cmd, out, sizeof out), 1);
    CHECK_MSG(strstr(out, "http_socket_group: no group 'no-such-group-llmsd'"), "%s", out);
}

/*
 * Writes a tokens file of the given text and mode (and owner, when owner is not
 * (uid_t)-1) and starts llmsd with it: its exit code, with its output in out. A daemon
 * that starts is stopped and counts as exit code 0.
 */
static int start_with_tokens(const char *name, const char *text, mode_t mode, uid_t owner,
                             char *out, size_t cap)
{
    char path[700], cmd[4096];
    proc_fmt(path, sizeof path, "%s/%s.tokens", test_tmpdir(), name);
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fputs(text, f);
    fclose(f);
    if (chmod(path, mode) != 0 || (owner != (uid_t)-1 && chown(path, owner, (gid_t)-1) != 0))
        return -1;
    /* A daemon that starts is told to stop at once: `timeout` ends it after 20 s at most. */
    proc_fmt(cmd, sizeof cmd,
             "timeout -s TERM 20 '%s' --model '%s' --socket '%s/%s.sock' --state_dir '%s/%s' "
             "--threads 1 --http_listen 127.0.0.1:0 --http_tokens_file '%s' 2>&1 & pid=$!; "
             "for i in $(seq 200); do [ -S '%s/%s.sock' ] && break; kill -0 $pid 2>/dev/null || break; "
             "sleep 0.05; done; kill -TERM $pid 2>/dev/null; wait $pid",
             llmsd_path, model_path, test_tmpdir(), name, test_tmpdir(), name, path, test_tmpdir(),
             name);
    return test_run_capture(cmd, out, cap);
}

static void tokens_file_refused_when_unsafe(void)
{
    if (!llmsd_path[0] || !model_path[0])
        SKIP("llmsd or its model is missing");
    char out[8192];
    static const struct {
        const char *name, *text;
        mode_t mode;
        const char *expect;
    } bad[] = {
        {"uid-wraps", GOOD_TOKEN " 4294967296 app\n", 0600, ":1: '4294967296' is not a uid"},
        {"uid-minus-one", "# c\n" GOOD_TOKEN " 4294967295 app\n", 0600, ":2: '4294967295' is not a uid"},
        {"uid-negative", GOOD_TOKEN " -1 app\n", 0600, ":1: no user '-1'"},
        {"uid-junk", GOOD_TOKEN " 12x app\n", 0600, ":1: '12x' is not a uid"},
        {"short-token", "x 1000 app\n", 0600, ":1: a token must be at least 16 bytes"},
        {"fifteen", "0123456789abcde 1000 app\n", 0600, ":1: a token must be at least 16 bytes"},
        {"repeated", GOOD_TOKEN " 1000 a\n" GOOD_TOKEN " 1001 b\n", 0600,
         ":2: the same token as an earlier line"},
        {"world-readable", GOOD_TOKEN " 1000 app\n", 0644, "readable by others"},
        {"group-writable", GOOD_TOKEN " 1000 app\n", 0620, "writable by its group or others"},
        {"world-writable", GOOD_TOKEN " 1000 app\n", 0602, "writable by its group or others"},
        {"bad-app", GOOD_TOKEN " 1000 a/b\n", 0600, ":1: app must be"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = start_with_tokens(bad[i].name, bad[i].text, bad[i].mode, (uid_t)-1, out,
                                   sizeof out);
        CHECK_MSG(rc == 1, "%s: exit %d:\n%s", bad[i].name, rc, out);
        CHECK_MSG(strstr(out, bad[i].expect) && strstr(out, bad[i].name),
                  "%s: the error does not say '%s':\n%s", bad[i].name, bad[i].expect, out);
    }
    /* A safe file starts: 0600, and 0640 (read by llmsd's group). */
    CHECK_MSG(start_with_tokens("good", GOOD_TOKEN " 1000 app admin\n", 0600, (uid_t)-1, out,
                                sizeof out) == 0, "a safe tokens file was refused:\n%s", out);
    CHECK_MSG(start_with_tokens("good-group", GOOD_TOKEN " 1000 app\n", 0640, (uid_t)-1, out,
                                sizeof out) == 0, "a 0640 tokens file was refused:\n%s", out);
    if (geteuid() != 0)
        SKIP("needs root to give a tokens file to another user");
    int rc = start_with_tokens("other-owner", GOOD_TOKEN " 0 app\n", 0600, MEMBER_UID, out,
                               sizeof out);
    CHECK_MSG(rc == 1 && strstr(out, "owned by uid 61011"), "exit %d:\n%s", rc, out);
}

int main(int argc, char **argv)
{
    (void)argc;
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    modelgen_params mp = {
        .arch = "llama", .dim = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 128,
        .n_ctx = 512, .type = QTYPE_F32, .seed = 9, .n_vocab = 300, .n_threads = 1,
    };
    proc_generate_model(model_path, sizeof model_path, "access.gguf", &mp);
    RUN(socket_takes_group_and_mode);
    RUN(socket_group_defaults_to_the_clients_socket);
    RUN(tokens_file_refused_when_unsafe);
    return test_finish();
}
