/* test.c — implementation of the harness declared in test.h. */
#include "tests/support/test.h"

#include <errno.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

enum test_state { TEST_PASSED, TEST_FAILED, TEST_SKIPPED };

static enum test_state current_state;
static int n_passed, n_failed, n_skipped;
static char tmpdir_path[256];

/* Whether name is in LLMS_TEST_ONLY (a comma-separated list), or that is unset. */
static bool selected(const char *name)
{
    const char *only = getenv("LLMS_TEST_ONLY");
    size_t n = strlen(name);
    for (const char *p = only; p && *p; p += strcspn(p, ",") + (p[strcspn(p, ",")] == ',')) {
        if (strcspn(p, ",") == n && strncmp(p, name, n) == 0)
            return true;
    }
    return !only || !*only;
}

void test_run(const char *name, void (*fn)(void))
{
    if (!selected(name))
        return;
    current_state = TEST_PASSED;
    fn();
    switch (current_state) {
    case TEST_PASSED:
        n_passed++;
        printf("  ok   %s\n", name);
        break;
    case TEST_FAILED:
        n_failed++;
        printf("  FAIL %s\n", name);
        break;
    case TEST_SKIPPED:
        n_skipped++;
        printf("  skip %s\n", name);
        break;
    }
    fflush(stdout);
}

void test_fail(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    current_state = TEST_FAILED;
    printf("       %s:%d: ", file, line);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
}

void test_skip(const char *fmt, ...)
{
    va_list ap;
    current_state = TEST_SKIPPED;
    printf("       skipped: ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static void remove_tmpdir(void)
{
    if (tmpdir_path[0])
        nftw(tmpdir_path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

const char *test_tmpdir(void)
{
    if (!tmpdir_path[0]) {
        const char *base = getenv("TMPDIR");
        snprintf(tmpdir_path, sizeof tmpdir_path, "%s/llms-test-XXXXXX", base ? base : "/tmp");
        if (!mkdtemp(tmpdir_path)) {
            fprintf(stderr, "mkdtemp: %s\n", strerror(errno));
            exit(2);
        }
        atexit(remove_tmpdir);
    }
    return tmpdir_path;
}

const char *test_data_path(const char *relative)
{
    static char path[1024];
    const char *root = getenv("LLMS_TESTDATA");
    snprintf(path, sizeof path, "%s/%s", root ? root : "../shared/testdata", relative);
    return access(path, R_OK) == 0 ? path : NULL;
}

int test_finish(void)
{
    printf("# result %d %d %d\n", n_passed, n_failed, n_skipped);
    return n_failed ? 1 : 0;
}

int test_run_capture(const char *cmd, char *out, size_t cap)
{
    FILE *p = popen(cmd, "r");
    size_t len = 0;
    if (!p)
        return -1;
    while (len + 1 < cap) {
        size_t got = fread(out + len, 1, cap - 1 - len, p);
        if (got == 0)
            break;
        len += got;
    }
    if (cap > 0)
        out[len] = '\0';
    char sink[512];
    while (fread(sink, 1, sizeof sink, p) > 0)
        ;
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void test_random_seed(uint64_t *state)
{
    const char *seed = getenv("LLMS_RANDOM_SEED");
    if (seed && strtoull(seed, NULL, 0))
        *state = strtoull(seed, NULL, 0);
}

uint64_t test_random(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}
