/*
 * test.h — the tiny test harness every test program uses.
 *
 * A test program defines static test functions and calls RUN() for each from main(),
 * then returns test_finish(). Each test prints one line (ok / FAIL / skip); the program
 * ends with a machine-readable line "# result PASSED FAILED SKIPPED" that tests/run.sh
 * adds up. A CHECK that fails stops the current test only.
 */
#ifndef LLMS_TEST_H
#define LLMS_TEST_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Sanitizer builds. TEST_SANITIZED: AddressSanitizer or ThreadSanitizer, both of which run
 * the code several times slower and keep freed memory a while (ASan's quarantine, TSan's
 * allocator). TEST_RSS_BOUNDS_HOLD: false under ThreadSanitizer, whose shadow memory grows
 * with every page the program touches, to several times its size; a bound on a process's
 * RSS then measures the sanitizer, so such bounds hold in the other builds only. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TEST_SANITIZED 1
#endif
#ifdef __SANITIZE_THREAD__
#define TEST_RSS_BOUNDS_HOLD false
#else
#define TEST_RSS_BOUNDS_HOLD true
#endif

/* How many times longer than in the release build a wait for the daemon's own work (an
 * ingest, idle-time prediction) may take: ASan keeps within the release build's waits,
 * ThreadSanitizer runs the daemon 5-15 times slower. Bounds on responsiveness (another
 * app answered within so many ms) are not scaled: they are what a test checks. */
#ifdef __SANITIZE_THREAD__
#define TEST_TIME_SCALE 10
#else
#define TEST_TIME_SCALE 1
#endif

/* Runs one test function and records its outcome; with LLMS_TEST_ONLY set (test names,
 * comma-separated), only the tests it names run. */
void test_run(const char *name, void (*fn)(void));

/* Marks the running test failed with a located message; use through CHECK*. */
void test_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Marks the running test skipped with a reason; use through SKIP. */
void test_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Prints the result line and returns the process exit status (0 when nothing failed). */
int test_finish(void);

/*
 * Path of a file under the shared test data folder (../shared/testdata by default,
 * $LLMS_TESTDATA if set), or NULL when that file does not exist. The returned string
 * lives until the next call.
 */
const char *test_data_path(const char *relative);

/* A fresh private temporary directory for the running program (removed at exit). */
const char *test_tmpdir(void);

/* Runs a shell command, captures up to cap-1 bytes of its stdout into out (always
 * NUL-terminated; the rest is read and dropped), and returns its exit code (-1 when it
 * could not run or was killed). */
int test_run_capture(const char *cmd, char *out, size_t cap);

/* Random tests' generator (xorshift64): *state starts at the test's own constant, so every
 * run draws the same values, unless LLMS_RANDOM_SEED names another (nonzero) start, which
 * test_random_seed puts there. */
void test_random_seed(uint64_t *state);
uint64_t test_random(uint64_t *state);

#define RUN(fn) test_run(#fn, fn)

#define CHECK(cond)                                                        \
    do {                                                                   \
        if (!(cond)) {                                                     \
            test_fail(__FILE__, __LINE__, "%s", #cond);                    \
            return;                                                        \
        }                                                                  \
    } while (0)

#define CHECK_MSG(cond, ...)                                               \
    do {                                                                   \
        if (!(cond)) {                                                     \
            test_fail(__FILE__, __LINE__, __VA_ARGS__);                    \
            return;                                                        \
        }                                                                  \
    } while (0)

#define CHECK_EQ(a, b)                                                     \
    do {                                                                   \
        long long a_ = (long long)(a), b_ = (long long)(b);                \
        if (a_ != b_) {                                                    \
            test_fail(__FILE__, __LINE__, "%s == %s (%lld != %lld)", #a,   \
                      #b, a_, b_);                                         \
            return;                                                        \
        }                                                                  \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                              \
    do {                                                                   \
        double a_ = (double)(a), b_ = (double)(b);                         \
        if (!(fabs(a_ - b_) <= (tol))) {                                   \
            test_fail(__FILE__, __LINE__, "|%s - %s| <= %g (%g vs %g)",   \
                      #a, #b, (double)(tol), a_, b_);                      \
            return;                                                        \
        }                                                                  \
    } while (0)

#define SKIP(...)                                                          \
    do {                                                                   \
        test_skip(__VA_ARGS__);                                            \
        return;                                                            \
    } while (0)

#endif
