/*
 * `make install` into a temporary DESTDIR (scripts/install.sh with this test's build
 * directory): the installed tree, the pkg-config file (an app compiled and linked
 * through it, shared and static), the systemd units under `systemd-analyze verify`, and
 * the sysusers snippet under `systemd-sysusers --root`.
 */
#include <libgen.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/config.h"
#include "tests/support/test.h"

#define PREFIX "/usr/local"

static char build[1024];   /* the build directory holding this test's programs */
static char srcdir[1024];  /* the source tree (the current directory under make) */
static char dest[1200];    /* DESTDIR of the install */
static int installed;      /* 1 installed, -1 llmsd not built, -2 install failed */
static char install_log[8192];
static char san_flags[64]; /* the sanitizer flags of this build, which its libraries need */

/* snprintf that aborts the program rather than run a truncated command or path. */
__attribute__((format(printf, 3, 4))) static void fmt(char *buf, size_t cap, const char *f, ...)
{
    va_list ap;
    va_start(ap, f);
    int n = vsnprintf(buf, cap, f, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= cap) {
        fprintf(stderr, "test_units: a path or command is too long\n");
        exit(1);
    }
}

/* Runs a shell command with stdout and stderr captured into out; returns its exit code. */
static int run_capture(const char *cmd, char *out, size_t cap)
{
    char full[8192];
    fmt(full, sizeof full, "( %s ) 2>&1", cmd);
    return test_run_capture(full, out, cap);
}

static int have_program(const char *name)
{
    char cmd[256], out[256];
    fmt(cmd, sizeof cmd, "command -v %s", name);
    return run_capture(cmd, out, sizeof out) == 0;
}

/* Installs once for all tests. */
static void install_once(void)
{
    if (installed)
        return;
    char path[1400];
    fmt(path, sizeof path, "%s/llmsd", build);
    if (access(path, X_OK) != 0) {
        installed = -1;
        return;
    }
    fmt(dest, sizeof dest, "%s/dest", test_tmpdir());
    char cmd[4096];
    fmt(cmd, sizeof cmd, "sh '%s/scripts/install.sh' '%s' '%s' '%s'", srcdir, dest, PREFIX,
             build);
    installed = run_capture(cmd, install_log, sizeof install_log) == 0 ? 1 : -2;
    char out[64];
    fmt(cmd, sizeof cmd, "nm -u '%s/libllmsclient.a' | grep -q __asan_", build);
    if (run_capture(cmd, out, sizeof out) == 0)
        fmt(san_flags, sizeof san_flags, "-fsanitize=address,undefined");
    fmt(cmd, sizeof cmd, "nm -u '%s/libllmsclient.a' | grep -q __tsan_", build);
    if (run_capture(cmd, out, sizeof out) == 0)
        fmt(san_flags, sizeof san_flags, "-fsanitize=thread");
}

#define NEED_INSTALL()                                                              \
    do {                                                                            \
        install_once();                                                             \
        if (installed == -1)                                                        \
            SKIP("%s/llmsd is not built (the daemon is not in this tree)", build);  \
        CHECK_MSG(installed == 1, "install.sh failed:\n%s", install_log);           \
    } while (0)

/* The installed path of a file below DESTDIR (valid until the next call). */
static const char *at(const char *rel)
{
    static char path[2048];
    fmt(path, sizeof path, "%s%s", dest, rel);
    return path;
}

static long file_mode(const char *rel)
{
    struct stat st;
    return lstat(at(rel), &st) == 0 ? (long)st.st_mode : -1;
}

static int file_contains(const char *rel, const char *needle)
{
    char cmd[4096], out[64];
    fmt(cmd, sizeof cmd, "grep -qF -e '%s' '%s'", needle, at(rel));
    return run_capture(cmd, out, sizeof out) == 0;
}

static void installed_tree(void)
{
    NEED_INSTALL();
    static const char *const exe[] = {PREFIX "/sbin/llmsd", PREFIX "/bin/llms",
                                      PREFIX "/bin/llmsctl", PREFIX "/bin/llms-run",
                                      PREFIX "/bin/mkmodel", PREFIX "/lib/libllmsclient.so.6"};
    for (size_t i = 0; i < sizeof exe / sizeof exe[0]; i++) {
        long m = file_mode(exe[i]);
        CHECK_MSG(m >= 0 && S_ISREG(m) && (m & 0111), "%s missing or not executable", exe[i]);
    }
    static const char *const data[] = {
        PREFIX "/lib/libllmsclient.a",           PREFIX "/include/llms.h",
        PREFIX "/lib/pkgconfig/llmsclient.pc",   PREFIX "/lib/systemd/system/llmsd.service",
        PREFIX "/lib/systemd/system/llmsd.socket", PREFIX "/lib/sysusers.d/llmsd.conf",
        PREFIX "/lib/tmpfiles.d/llmsd.conf",     "/etc/llmsd/llmsd.conf",
        PREFIX "/share/llmsd/http-tcp.conf",     PREFIX "/share/llmsd/cuda.conf"};
    for (size_t i = 0; i < sizeof data / sizeof data[0]; i++) {
        long m = file_mode(data[i]);
        CHECK_MSG(m >= 0 && S_ISREG(m), "%s missing", data[i]);
    }
    CHECK(S_ISLNK(file_mode(PREFIX "/lib/libllmsclient.so")));
    char target[256];
    ssize_t n = readlink(at(PREFIX "/lib/libllmsclient.so"), target, sizeof target - 1);
    CHECK(n > 0);
    target[n] = '\0';
    CHECK(strcmp(target, "libllmsclient.so.6") == 0);

    CHECK(file_contains(PREFIX "/lib/systemd/system/llmsd.service",
                        "ExecStart=" PREFIX "/sbin/llmsd --config /etc/llmsd/llmsd.conf"));
    CHECK(!file_contains(PREFIX "/lib/systemd/system/llmsd.service", "@SBINDIR@"));
    /* systemctl reload sends what llmsd reloads on (test_http: reload_reads_the_tokens_again) */
    CHECK(file_contains(PREFIX "/lib/systemd/system/llmsd.service",
                        "ExecReload=/bin/kill -HUP $MAINPID"));
    /* llmsd gives an http_socket the clients' socket's group, so it must be a member. */
    CHECK(file_contains(PREFIX "/lib/systemd/system/llmsd.socket", "SocketGroup=llms"));
    CHECK(file_contains(PREFIX "/lib/systemd/system/llmsd.service", "SupplementaryGroups=llms"));
    /* The header comment is the source's, word for word. */
    char cmd[4096], out[4096];
    fmt(cmd, sizeof cmd, "[ \"$(head -n 2 '%s/systemd/llmsd.service')\" = \"$(head -n 2 '%s')\" ]",
        srcdir, at(PREFIX "/lib/systemd/system/llmsd.service"));
    CHECK_MSG(run_capture(cmd, out, sizeof out) == 0, "the unit's header comment changed");
    CHECK(file_contains(PREFIX "/lib/pkgconfig/llmsclient.pc", "prefix=" PREFIX));
    CHECK(!file_contains(PREFIX "/lib/pkgconfig/llmsclient.pc", "@"));
    /* The installed archive carries the protocol code the static client needs (local to
     * it: static_library_exports_only_the_api): it defines frame_pack and leaves no
     * framing or message code for the app to supply. */
    fmt(cmd, sizeof cmd, "nm '%s' | grep -E ' [Tt] frame_pack$'", at(PREFIX "/lib/libllmsclient.a"));
    CHECK_MSG(run_capture(cmd, out, sizeof out) == 0, "the archive lacks frame_pack");
    fmt(cmd, sizeof cmd, "nm -u '%s' | grep -E ' U (frame_|llms__|client_)' | head -n 20",
        at(PREFIX "/lib/libllmsclient.a"));
    CHECK_EQ(run_capture(cmd, out, sizeof out), 0);
    CHECK_MSG(out[0] == '\0', "the archive needs from elsewhere:\n%s", out);
}

/*
 * The installed libllmsclient.so exports llms.h's API (llms_*) and nothing else: not the
 * protocol code it carries (frame_*, the generated llms__*). An exported name binds to
 * the app's own function of that name when there is one (an app's frame_pack took the
 * library's place, and every request failed), and every name is ABI.
 */
static void shared_library_exports_only_the_api(void)
{
    NEED_INSTALL();
    if (!have_program("nm"))
        SKIP("nm is not installed");
    char cmd[4096], out[8192];
    fmt(cmd, sizeof cmd, "nm -D --defined-only '%s' | awk '{ print $3 }' | sort",
        at(PREFIX "/lib/libllmsclient.so.6"));
    CHECK_EQ(run_capture(cmd, out, sizeof out), 0);
    CHECK_MSG(strstr(out, "llms_connect\n") && strstr(out, "llms_call\n"), "exports: %.500s",
              out);
    fmt(cmd, sizeof cmd,
        "nm -D --defined-only '%s' | awk '{ print $3 }' | grep -v '^llms_[a-z]' | head -n 20",
        at(PREFIX "/lib/libllmsclient.so.6"));
    CHECK_EQ(run_capture(cmd, out, sizeof out), 0);
    CHECK_MSG(out[0] == '\0', "exported beyond the API:\n%s", out);
}

/*
 * The same for the static archive, installed and built: an app that links libllmsclient.a
 * sees llms.h's API (llms_*) as its only globals. The client's internals (client_*), the
 * framing (frame_*) and protoc-c's llms__* would otherwise clash with an app's own
 * function of the same name (a duplicate definition at link time) or take its place.
 */
static void static_library_exports_only_the_api(void)
{
    NEED_INSTALL();
    if (!have_program("nm"))
        SKIP("nm is not installed");
    char cmd[4096], out[8192], lib[1400];
    for (int built = 0; built <= 1; built++) {
        if (built)
            fmt(lib, sizeof lib, "%s/libllmsclient.a", build);
        else
            fmt(lib, sizeof lib, "%s", at(PREFIX "/lib/libllmsclient.a"));
        fmt(cmd, sizeof cmd,
            "nm -g --defined-only '%s' | awk 'NF == 3 { print $3 }' | grep -v '^llms_[^_]' "
            "| head -n 20",
            lib);
        CHECK_EQ(run_capture(cmd, out, sizeof out), 0);
        CHECK_MSG(out[0] == '\0', "%s defines beyond the API:\n%s", lib, out);
        fmt(cmd, sizeof cmd,
            "nm -g --defined-only '%s' | awk 'NF == 3 { print $3 }' "
            "| grep -x -e llms_connect -e llms_call | sort -u",
            lib);
        CHECK_EQ(run_capture(cmd, out, sizeof out), 0);
        CHECK_MSG(strcmp(out, "llms_call\nllms_connect\n") == 0, "%s defines: %s", lib, out);
    }
    /* The very names the shared library exports. */
    fmt(cmd, sizeof cmd,
        "nm -g --defined-only '%s' | awk 'NF == 3 { print $3 }' | sort >'%s/static.syms' && "
        "nm -D --defined-only '%s' | awk '{ print $3 }' | sort >'%s/shared.syms' && "
        "diff '%s/static.syms' '%s/shared.syms' | head -n 20",
        lib, test_tmpdir(), at(PREFIX "/lib/libllmsclient.so.6"), test_tmpdir(), test_tmpdir(),
        test_tmpdir());
    CHECK_EQ(run_capture(cmd, out, sizeof out), 0);
    CHECK_MSG(out[0] == '\0', "static (<) and shared (>) APIs differ:\n%s", out);
}

/* An app with its own frame_pack, linked statically: it links, and the library's calls
 * still use the library's framing (a request is packed and sent to a peer that has gone). */
static const char own_frame_pack_source[] =
    "#include <llms.h>\n"
    "#include <stdio.h>\n"
    "#include <string.h>\n"
    "#include <sys/socket.h>\n"
    "#include <sys/un.h>\n"
    "#include <unistd.h>\n"
    "static int taken;\n"
    "int frame_pack(const void *msg, unsigned max, void **out, size_t *len);\n"
    "int frame_pack(const void *msg, unsigned max, void **out, size_t *len) {\n"
    "    (void)msg; (void)max; (void)out; (void)len;\n"
    "    taken = 1;\n"
    "    return -1;\n"
    "}\n"
    "int main(int argc, char **argv) {\n"
    "    struct sockaddr_un a = {.sun_family = AF_UNIX};\n"
    "    char err[LLMS_ERROR_MAX];\n"
    "    llms_conn *c;\n"
    "    if (argc != 2 || strlen(argv[1]) >= sizeof a.sun_path) return 2;\n"
    "    strcpy(a.sun_path, argv[1]);\n"
    "    int l = socket(AF_UNIX, SOCK_STREAM, 0);\n"
    "    if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 1) < 0) return 3;\n"
    "    if (llms_connect(argv[1], &c, err) != LLMS_OK) return 4;\n"
    "    int peer = accept(l, NULL, NULL);\n"
    "    if (peer < 0) return 5;\n"
    "    close(peer);\n"
    "    enum llms_status s = llms_bind(c, \"own-frame-pack\");\n"
    "    printf(\"%s %s\\n\", llms_status_name(s), taken ? \"taken\" : \"kept\");\n"
    "    llms_close(c);\n"
    "    return 0;\n"
    "}\n";

static void static_app_may_define_library_internals(void)
{
    NEED_INSTALL();
    if (!have_program("pkg-config"))
        SKIP("pkg-config is not installed");
    char pc_dir[1400], app[1400], cmd[8192], out[4096];
    fmt(pc_dir, sizeof pc_dir, "%s", at(PREFIX "/lib/pkgconfig"));
    fmt(app, sizeof app, "%s/own_frame_pack.c", test_tmpdir());
    FILE *f = fopen(app, "w");
    CHECK(f);
    fputs(own_frame_pack_source, f);
    fclose(f);
    fmt(cmd, sizeof cmd,
        "flags=$(PKG_CONFIG_PATH='%s' pkg-config --define-variable=prefix='%s%s' --static "
        "--cflags --libs llmsclient) && cc -std=gnu99 -Wall -Werror %s -o '%s/own-frame-pack' "
        "'%s' $(echo $flags | sed 's/-lllmsclient/-l:libllmsclient.a/') "
        "&& '%s/own-frame-pack' '%s/own-frame-pack.sock'",
        pc_dir, dest, PREFIX, san_flags, test_tmpdir(), app, test_tmpdir(), test_tmpdir());
    CHECK_MSG(run_capture(cmd, out, sizeof out) == 0, "static build with frame_pack: %s", out);
    CHECK_MSG(strcmp(out, "IO kept\n") == 0, "app printed: %s", out);
}

static void existing_config_is_kept(void)
{
    NEED_INSTALL();
    FILE *f = fopen(at("/etc/llmsd/llmsd.conf"), "a");
    CHECK(f);
    fputs("# edited by the administrator\n", f);
    fclose(f);
    char cmd[4096], out[4096];
    fmt(cmd, sizeof cmd, "sh '%s/scripts/install.sh' '%s' '%s' '%s'", srcdir, dest, PREFIX,
             build);
    CHECK_MSG(run_capture(cmd, out, sizeof out) == 0, "reinstall failed: %s", out);
    CHECK(file_contains("/etc/llmsd/llmsd.conf", "# edited by the administrator"));
}

static const char app_source[] =
    "#include <llms.h>\n"
    "#include <stdio.h>\n"
    "#include <string.h>\n"
    "int main(void) {\n"
    "    llms_params p = LLMS_PARAMS_INIT;\n"
    "    llms_conn *c;\n"
    "    char err[LLMS_ERROR_MAX];\n"
    "    if (llms_connect(\"/nonexistent/llmsd.sock\", &c, err) != LLMS_ERR_IO) return 1;\n"
    "    puts(llms_status_name(LLMS_ERR_NOT_FOUND));\n"
    "    return p.top_k == LLMS_UNSET ? 0 : 1;\n"
    "}\n";

/* An app built the documented way: cc app.c $(pkg-config --cflags --libs llmsclient). */
static void pkg_config_builds_an_app(void)
{
    NEED_INSTALL();
    if (!have_program("pkg-config"))
        SKIP("pkg-config is not installed");
    char pc_dir[1400], out[4096], cmd[8192], app[1400];
    fmt(pc_dir, sizeof pc_dir, "%s", at(PREFIX "/lib/pkgconfig"));
    fmt(cmd, sizeof cmd, "PKG_CONFIG_PATH='%s' pkg-config --cflags --libs llmsclient",
             pc_dir);
    CHECK_MSG(run_capture(cmd, out, sizeof out) == 0, "pkg-config: %s", out);
    CHECK_MSG(strstr(out, "-lllmsclient") && strstr(out, "-L" PREFIX "/lib"), "got: %s", out);

    fmt(app, sizeof app, "%s/app.c", test_tmpdir());
    FILE *f = fopen(app, "w");
    CHECK(f);
    fputs(app_source, f);
    fclose(f);
    /* The tree sits under DESTDIR, so the prefix is moved there for the build. */
    fmt(cmd, sizeof cmd,
             "flags=$(PKG_CONFIG_PATH='%s' pkg-config --define-variable=prefix='%s%s' "
             "--cflags --libs llmsclient) && cc -std=c99 -Wall -Werror %s -o '%s/app' '%s' $flags "
             "&& LD_LIBRARY_PATH='%s%s/lib' '%s/app'",
             pc_dir, dest, PREFIX, san_flags, test_tmpdir(), app, dest, PREFIX, test_tmpdir());
    CHECK_MSG(run_capture(cmd, out, sizeof out) == 0, "shared build: %s", out);
    CHECK_MSG(strcmp(out, "NOT_FOUND\n") == 0, "app printed: %s", out);

    fmt(cmd, sizeof cmd,
             "flags=$(PKG_CONFIG_PATH='%s' pkg-config --define-variable=prefix='%s%s' --static "
             "--cflags --libs llmsclient) && cc -std=c99 %s -o '%s/app-static' '%s' "
             "$(echo $flags | sed 's/-lllmsclient/-l:libllmsclient.a/') && '%s/app-static'",
             pc_dir, dest, PREFIX, san_flags, test_tmpdir(), app, test_tmpdir());
    CHECK_MSG(run_capture(cmd, out, sizeof out) == 0, "static build: %s", out);
    CHECK_MSG(strcmp(out, "NOT_FOUND\n") == 0, "app printed: %s", out);
}

/*
 * systemd-analyze verify on the installed units, alone and with the installed TCP
 * drop-in in place (verify reads a unit's NAME.d/ beside it). It checks that ExecStart's
 * program exists, so it looks at copies whose ExecStart points into DESTDIR. Any output
 * is a complaint (verify returns 0 for unknown keys and other warnings).
 */
static void units_verify(void)
{
    NEED_INSTALL();
    if (!have_program("systemd-analyze"))
        SKIP("systemd-analyze is not installed");
    char dir[1400], cmd[8192], out[8192], service[2048], socket[2048];
    fmt(dir, sizeof dir, "%s/units", test_tmpdir());
    fmt(service, sizeof service, "%s", at(PREFIX "/lib/systemd/system/llmsd.service"));
    fmt(socket, sizeof socket, "%s", at(PREFIX "/lib/systemd/system/llmsd.socket"));
    mkdir(dir, 0755);

    /* First a unit that is surely valid: if that fails, verify cannot run here. */
    fmt(cmd, sizeof cmd,
             "printf '[Unit]\\nDescription=probe\\n[Service]\\nExecStart=/bin/true\\n' "
             ">'%s/llms-probe.service' && systemd-analyze verify '%s/llms-probe.service'",
             dir, dir);
    if (run_capture(cmd, out, sizeof out) != 0 || out[0])
        SKIP("systemd-analyze verify cannot run in this environment: %.200s", out);

    fmt(cmd, sizeof cmd,
             "sed 's|^ExecStart=%s/|ExecStart=%s%s/|' '%s' >'%s/llmsd.service' && "
             "cp '%s' '%s/llmsd.socket' && "
             "systemd-analyze verify '%s/llmsd.service' '%s/llmsd.socket'",
             PREFIX, dest, PREFIX, service, dir, socket, dir, dir, dir);
    int rc = run_capture(cmd, out, sizeof out);
    CHECK_MSG(rc == 0 && out[0] == '\0', "systemd-analyze verify (exit %d):\n%s", rc, out);

    fmt(cmd, sizeof cmd,
             "mkdir -p '%s/llmsd.service.d' && cp '%s' '%s/llmsd.service.d/http-tcp.conf' && "
             "systemd-analyze verify '%s/llmsd.service'",
             dir, at(PREFIX "/share/llmsd/http-tcp.conf"), dir, dir);
    rc = run_capture(cmd, out, sizeof out);
    CHECK_MSG(rc == 0 && out[0] == '\0', "systemd-analyze verify with http-tcp.conf (exit %d):\n%s",
              rc, out);

    fmt(cmd, sizeof cmd,
             "cp '%s' '%s/llmsd.service.d/cuda.conf' && systemd-analyze verify '%s/llmsd.service'",
             at(PREFIX "/share/llmsd/cuda.conf"), dir, dir);
    rc = run_capture(cmd, out, sizeof out);
    CHECK_MSG(rc == 0 && out[0] == '\0', "systemd-analyze verify with cuda.conf (exit %d):\n%s",
              rc, out);
}

/* systemd-sysusers applied to an empty root creates the user and both groups. */
static void sysusers_creates_accounts(void)
{
    NEED_INSTALL();
    if (!have_program("systemd-sysusers"))
        SKIP("systemd-sysusers is not installed");
    char root[1400], cmd[8192], out[4096];
    fmt(root, sizeof root, "%s/sysroot", test_tmpdir());
    fmt(cmd, sizeof cmd, "mkdir -p '%s/etc' && systemd-sysusers --root='%s' '%s'", root,
             root, at(PREFIX "/lib/sysusers.d/llmsd.conf"));
    if (run_capture(cmd, out, sizeof out) != 0)
        SKIP("systemd-sysusers --root cannot run in this environment: %.200s", out);
    fmt(cmd, sizeof cmd,
             "grep -q '^llmsd:' '%s/etc/passwd' && grep -q '^llms:' '%s/etc/group' && "
             "grep -q '^llms-admin:' '%s/etc/group'",
             root, root, root);
    CHECK_MSG(run_capture(cmd, out, sizeof out) == 0, "accounts missing in %s/etc", root);
}

/*
 * The unit's syscall allow-list (SystemCallFilter=, its @groups expanded by
 * systemd-analyze) has the syscalls llmsd makes outside @system-service: mincore, for
 * a model's resident bytes (ListModels, Status) and a stored chunk's cached share
 * (switch-in planning, where cachestat is refused or missing). Refused (EPERM), every
 * mapped model reads 0 bytes resident and every chunk is planned as a cold read.
 */
static void unit_allows_its_syscalls(void)
{
    if (!have_program("systemd-analyze"))
        SKIP("systemd-analyze is not installed");
    static const char *const needed[] = {"mincore"};
    char cmd[4096], out[4096];
    for (size_t i = 0; i < sizeof needed / sizeof needed[0]; i++) {
        fmt(cmd, sizeof cmd,
            "expand() { for s; do case $s in @*) expand $(systemd-analyze syscall-filter "
            "\"$s\" | sed -n 's/^    \\([@a-z0-9_-]*\\)$/\\1/p');; *) echo \"$s\";; esac; "
            "done; }; expand $(sed -n 's/^SystemCallFilter=//p' '%s/systemd/llmsd.service') "
            "| grep -qx '%s'",
            srcdir, needed[i]);
        CHECK_MSG(run_capture(cmd, out, sizeof out) == 0,
                  "llmsd.service's SystemCallFilter= refuses %s %s", needed[i], out);
    }
}

/* The example config is valid for this daemon and documents every key it knows. */
static void example_config_matches_daemon(void)
{
    char path[1100], err[ERR_MAX];
    fmt(path, sizeof path, "%s/systemd/llmsd.conf", srcdir);
    config cfg;
    CHECK_MSG(config_defaults(&cfg, err) == 0, "%s", err);
    CHECK_MSG(config_load(&cfg, path, err) == 0, "%s", err);
    CHECK_MSG(config_check(&cfg, err) == 0, "%s", err);

    char keys_path[1100];
    fmt(keys_path, sizeof keys_path, "%s/keys.txt", test_tmpdir());
    FILE *f = fopen(keys_path, "w+");
    CHECK(f);
    config_print_keys(f);
    rewind(f);
    char line[512];
    int n_keys = 0;
    while (fgets(line, sizeof line, f)) {
        char key[64];
        if (sscanf(line, " --%63[a-zA-Z_.]", key) != 1)
            continue;
        n_keys++;
        char cmd[2048], out[64];
        /* a key of lines (model.NAME, lora.NAME) is documented by commented examples */
        char *named = strstr(key, ".NAME");
        if (named)
            named[1] = '\0';
        fmt(cmd, sizeof cmd, named ? "grep -q '^#\\?%s[a-z]' '%s'" : "grep -q '^%s = ' '%s'",
            key, path);
        if (run_capture(cmd, out, sizeof out) != 0) {
            fclose(f);
            CHECK_MSG(0, "llmsd.conf does not set key '%s'", key);
        }
    }
    fclose(f);
    CHECK_MSG(n_keys >= 19, "only %d keys listed by config_print_keys", n_keys);
}

int main(int argc, char **argv)
{
    (void)argc;
    char self[1024];
    fmt(self, sizeof self, "%s", argv[0]);
    char *abs = realpath(dirname(self), NULL);
    if (!abs || !getcwd(srcdir, sizeof srcdir)) {
        fprintf(stderr, "cannot resolve the build directory\n");
        return 1;
    }
    fmt(build, sizeof build, "%s/../..", abs);
    free(abs);
    char *b = realpath(build, NULL);
    if (b) {
        fmt(build, sizeof build, "%s", b);
        free(b);
    }
    /* tests/run.sh runs from the source tree; find it from the build dir otherwise. */
    char probe[2048];
    fmt(probe, sizeof probe, "%s/scripts/install.sh", srcdir);
    for (int up = 1; up <= 2 && access(probe, R_OK) != 0; up++) {
        fmt(srcdir, sizeof srcdir, "%s%s", build, up == 1 ? "/.." : "/../..");
        fmt(probe, sizeof probe, "%s/scripts/install.sh", srcdir);
    }

    RUN(example_config_matches_daemon);
    RUN(unit_allows_its_syscalls);
    RUN(installed_tree);
    RUN(shared_library_exports_only_the_api);
    RUN(static_library_exports_only_the_api);
    RUN(static_app_may_define_library_internals);
    RUN(existing_config_is_kept);
    RUN(pkg_config_builds_an_app);
    RUN(units_verify);
    RUN(sysusers_creates_accounts);
    return test_finish();
}
