/* Thread pool: every task of a job runs exactly once, jobs run back to back, split;
 * a pool whose workers stall mid-task drops threads and takes them back once they keep
 * up again; background jobs run on the caller alone. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/threadpool.h"
#include "tests/support/test.h"

typedef struct job {
    _Atomic int calls;
    int seen[8];   /* calls per thread index */
    _Atomic int nth_seen; /* every thread of a job stores it */
    long sum;      /* over a split range, per job */
    _Atomic long total;
} job;

static void count_fn(void *p, int ith, int nth)
{
    job *j = p;
    atomic_fetch_add(&j->calls, 1);
    j->seen[ith]++;
    atomic_store(&j->nth_seen, nth);
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
        tp_set_adaptive(p, false);
        CHECK_EQ(tp_n_threads(p), n);
        job j;
        memset(&j, 0, sizeof j);
        for (int rep = 0; rep < 300; rep++)
            tp_run(p, count_fn, &j);
        CHECK_EQ(atomic_load(&j.calls), 300 * n);
        for (int i = 0; i < n; i++)
            CHECK_EQ(j.seen[i], 300);
        CHECK_EQ(atomic_load(&j.nth_seen), n);
        CHECK_EQ(atomic_load(&j.total), 300L * 999 * 1000 / 2);
        tp_free(p);
    }
}

static void test_wakes_after_sleep(void)
{
    char err[ERR_MAX];
    tp_pool *p = tp_new(3, err);
    CHECK(p);
    tp_set_adaptive(p, false);
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

/* A job whose tasks stall on the worker thread (as a worker does when the kernel gives
 * its core to another process in the middle of a task) and finish at once on the
 * caller's. */
typedef struct stall_job {
    _Atomic int calls;
    _Atomic long total;
    _Atomic int stall_us;  /* how long a task on the worker stalls; 0: no stall */
    pthread_t caller;
} stall_job;

static void stall_fn(void *p, int ith, int nth)
{
    stall_job *j = p;
    atomic_fetch_add(&j->calls, 1);
    long b, e, s = 0;
    tp_split(1000, ith, nth, &b, &e);
    for (long i = b; i < e; i++)
        s += i;
    atomic_fetch_add(&j->total, s);
    int us = atomic_load(&j->stall_us);
    (void)ith;
    /* some work, so that a spinning worker claims its task before the caller is done */
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do
        clock_gettime(CLOCK_MONOTONIC, &t);
    while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < 20000);
    if (us && !pthread_equal(pthread_self(), j->caller))
        usleep((useconds_t)us);
}

static void test_adapts_to_stalls(void)
{
    char err[ERR_MAX];
    tp_pool *p = tp_new(2, err);
    CHECK_MSG(p, "%s", err);
    stall_job j = {.caller = pthread_self()};
    atomic_store(&j.stall_us, 2000);
    int runs = 0;
    /* The worker's tasks stall the job: the pool ends up on one thread within a few
     * windows (a task the worker has not claimed in time is the caller's, no stall). */
    for (; runs < 2000 && tp_n_active(p) == 2; runs++)
        tp_run(p, stall_fn, &j);
    CHECK_EQ(tp_n_active(p), 1);
    /* On one thread nothing stalls and every sum is still whole. */
    for (int i = 0; i < 100; i++, runs++)
        tp_run(p, stall_fn, &j);
    CHECK_EQ(atomic_load(&j.total), (long)runs * 999 * 1000 / 2);
    /* Once the stalls end, a later try keeps the second thread. */
    atomic_store(&j.stall_us, 0);
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    double waited = 0;
    while (tp_n_active(p) == 1 && waited < 10) {
        for (int i = 0; i < 64; i++)
            tp_run(p, stall_fn, &j);
        usleep(1000);
        clock_gettime(CLOCK_MONOTONIC, &t);
        waited = (double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) / 1e9;
    }
    CHECK_MSG(tp_n_active(p) == 2, "still on one thread after %.1f s", waited);
    tp_free(p);
}

typedef struct background_job {
    pthread_t caller;
    int calls, not_caller, nth_max;
} background_job;

static void background_fn(void *p, int ith, int nth)
{
    background_job *j = p;
    (void)ith;
    j->calls++;
    j->not_caller += !pthread_equal(pthread_self(), j->caller);
    j->nth_max = nth > j->nth_max ? nth : j->nth_max;
    usleep(200); /* long enough to look like a stall, were it counted */
}

/* Background jobs run on the caller alone and leave the adaptation as it was. */
static void test_background(void)
{
    char err[ERR_MAX];
    tp_pool *p = tp_new(2, err);
    CHECK_MSG(p, "%s", err);
    background_job j = {.caller = pthread_self()};
    tp_set_background(p, true);
    CHECK_EQ(tp_n_active(p), 1);
    for (int i = 0; i < 300; i++)
        tp_run(p, background_fn, &j);
    CHECK_EQ(j.calls, 300);
    CHECK_EQ(j.not_caller, 0);
    CHECK_EQ(j.nth_max, 1);
    tp_set_background(p, false);
    CHECK_EQ(tp_n_active(p), 2);
    job k;
    memset(&k, 0, sizeof k);
    tp_run(p, count_fn, &k);
    CHECK_EQ(atomic_load(&k.nth_seen), 2);
    CHECK_EQ(atomic_load(&k.calls), 2);
    tp_free(p);
}

int main(void)
{
    RUN(test_runs_every_thread);
    RUN(test_wakes_after_sleep);
    RUN(test_default_threads);
    RUN(test_split);
    RUN(test_adapts_to_stalls);
    RUN(test_background);
    return test_finish();
}
