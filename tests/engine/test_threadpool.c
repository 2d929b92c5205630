/* Thread pool: every thread runs each job exactly once, jobs run back to back, split. */
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "engine/threadpool.h"
#include "tests/support/test.h"

typedef struct job {
    _Atomic int calls;
    int seen[8];   /* calls per thread index */
    int nth_seen;
    long sum;      /* over a split range, per job */
    _Atomic long total;
} job;

static void count_fn(void *p, int ith, int nth)
{
    job *j = p;
    atomic_fetch_add(&j->calls, 1);
    j->seen[ith]++;
    j->nth_seen = nth;
    long b, e, s = 0;
    tp_split(1000, ith, nth, &b, &e);
    for (long i = b; i < e; i++)
        s += i;
    atomic_fetch_add(&j->total, s);
}

static void test_runs_every_thread(void)
{
    for (int n = 1; n <= 4; n++) {
        char err[ERR_MAX];
        tp_pool *p = tp_new(n, err);
        CHECK_MSG(p, "%s", err);
        CHECK_EQ(tp_n_threads(p), n);
        job j;
        memset(&j, 0, sizeof j);
        for (int rep = 0; rep < 300; rep++)
            tp_run(p, count_fn, &j);
        CHECK_EQ(atomic_load(&j.calls), 300 * n);
        for (int i = 0; i < n; i++)
            CHECK_EQ(j.seen[i], 300);
        CHECK_EQ(j.nth_seen, n);
        CHECK_EQ(atomic_load(&j.total), 300L * 999 * 1000 / 2);
        tp_free(p);
    }
}

static void test_wakes_after_sleep(void)
{
    char err[ERR_MAX];
    tp_pool *p = tp_new(3, err);
    CHECK(p);
    job j;
    memset(&j, 0, sizeof j);
    tp_run(p, count_fn, &j);
    usleep(50 * 1000); /* long enough for the workers to go to sleep on the futex */
    tp_run(p, count_fn, &j);
    CHECK_EQ(atomic_load(&j.calls), 6);
    tp_free(p);
}

static void test_default_threads(void)
{
    char err[ERR_MAX];
    tp_pool *p = tp_new(0, err);
    CHECK(p);
    CHECK_EQ(tp_n_threads(p), sysconf(_SC_NPROCESSORS_ONLN));
    tp_free(p);
    tp_free(NULL);
}

static void test_split(void)
{
    long b, e, next = 0;
    for (int i = 0; i < 3; i++) {
        tp_split(10, i, 3, &b, &e);
        CHECK_EQ(b, next);
        CHECK(e - b == 3 || e - b == 4);
        next = e;
    }
    CHECK_EQ(next, 10);
    tp_split(2, 3, 4, &b, &e);
    CHECK_EQ(e - b, 0);
}

int main(void)
{
    RUN(test_runs_every_thread);
    RUN(test_wakes_after_sleep);
    RUN(test_default_threads);
    RUN(test_split);
    return test_finish();
}
