/*
 * threadpool.c — N-1 workers wait on a generation counter; tp_run bumps it.
 *
 * Workers spin on the counter for a short while after each job (the next job of a
 * forward pass usually follows within microseconds), then sleep on it with a futex.
 * The caller wakes sleepers only when some are asleep, so back-to-back jobs cost no
 * system call.
 *
 * A job is nth tasks that any thread may claim: the caller and the workers take task
 * indexes from one counter until none is left, so a worker that the kernel has not
 * scheduled yet (another process has its core) costs nothing: its task is done by
 * whoever is running. A worker descheduled in the middle of a task still holds the job
 * up until it runs again, which on a busy machine happens on most jobs and makes every
 * extra thread a loss. The pool watches for that (adaptation): over each window of jobs
 * it estimates what the threads bought, from the time the caller spent on its own tasks
 * (and how many tasks that was) and the time it then waited for the others' tasks: when
 * one thread alone would have been about as fast (or, with more threads, one fewer) it
 * drops a thread, and from time to time it tries one more again, keeping it when it
 * pays.
 */
#include "engine/threadpool.h"

#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "engine/clock.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define tp_cpu_relax() _mm_pause()
#else
#define tp_cpu_relax() ((void)0)
#endif

/* Polls of the counter before sleeping: a few tens of microseconds. */
#define TP_SPIN 20000

/* Adaptation: jobs per measuring window; the speedup over one thread below which a
 * thread is dropped (of two), and for more threads the share of the ideal speedup of one
 * fewer; how long after a drop (doubling after each failed try, up to the last) one more
 * thread is tried again. */
#define TP_WINDOW 64
#define TP_MIN_SPEEDUP_OF_TWO 1.05
#define TP_MIN_EFFICIENCY 0.75
#define TP_RETRY_FIRST_NS 50000000LL
#define TP_RETRY_MAX_NS 1600000000LL

/* The claim word: generation (32 bits), tasks of the job (16), next task to claim (16),
 * read and changed as one so a late worker can never claim a task of a finished job. */
#define TP_WORD(gen, nth, next) ((uint64_t)(gen) << 32 | (uint64_t)(nth) << 16 | (uint64_t)(next))
#define TP_WORD_GEN(w) ((uint32_t)((w) >> 32))
#define TP_WORD_NTH(w) ((int)(((w) >> 16) & 0xffff))
#define TP_WORD_NEXT(w) ((int)((w) & 0xffff))

struct tp_pool {
    int n_threads;
    pthread_t *threads;   /* (n_threads - 1) */

    _Atomic uint32_t generation; /* futex word: bumped once per job */
    _Atomic uint64_t claim;      /* TP_WORD of the current job */
    _Atomic int n_done;          /* tasks of the current job finished */
    _Atomic int n_sleeping;      /* workers in (or entering) futex wait */
    _Atomic int stop;

    tp_fn fn; /* current job, published before generation is bumped */
    void *arg;

    /* adaptation; the caller's alone */
    bool adaptive;
    bool background;             /* tp_set_background: jobs on the caller alone */
    int n_use;                   /* threads (tasks) jobs run on now */
    int window_jobs;
    int64_t window_busy_ns, window_wait_ns;
    long window_tasks, window_caller_tasks;
    bool trying;                 /* this window tries n_use after a drop */
    int64_t retry_at_ns, retry_gap_ns;
};

static void tp_futex_wait(_Atomic uint32_t *addr, uint32_t expected)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static void tp_futex_wake_all(_Atomic uint32_t *addr)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
}

/* Claims and runs tasks of generation gen until none is left; the number run. */
static int tp_run_tasks(tp_pool *pool, uint32_t gen)
{
    int ran = 0;
    uint64_t w = atomic_load_explicit(&pool->claim, memory_order_acquire);
    for (;;) {
        if (TP_WORD_GEN(w) != gen || TP_WORD_NEXT(w) >= TP_WORD_NTH(w))
            return ran;
        if (!atomic_compare_exchange_weak_explicit(&pool->claim, &w, w + 1,
                                                   memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        /* The job cannot end before this task does, so fn and arg are still its own. */
        pool->fn(pool->arg, TP_WORD_NEXT(w), TP_WORD_NTH(w));
        atomic_fetch_add_explicit(&pool->n_done, 1, memory_order_release);
        ran++;
        w = atomic_load_explicit(&pool->claim, memory_order_acquire);
    }
}

static void *tp_worker_main(void *p)
{
    tp_pool *pool = p;
    uint32_t seen = 0;

    for (;;) {
        uint32_t gen;
        int spins = 0;
        while ((gen = atomic_load_explicit(&pool->generation, memory_order_acquire)) == seen) {
            if (++spins < TP_SPIN) {
                tp_cpu_relax();
                continue;
            }
            atomic_fetch_add(&pool->n_sleeping, 1);
            tp_futex_wait(&pool->generation, seen);
            atomic_fetch_sub(&pool->n_sleeping, 1);
            spins = 0;
        }
        seen = gen;
        if (atomic_load_explicit(&pool->stop, memory_order_acquire))
            return NULL;
        tp_run_tasks(pool, gen);
    }
}

static int tp_online_cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

tp_pool *tp_new(int n_threads, char err[ERR_MAX])
{
    if (n_threads <= 0)
        n_threads = tp_online_cpus();
    if (n_threads > TP_MAX_THREADS)
        n_threads = TP_MAX_THREADS;
    tp_pool *pool = calloc(1, sizeof *pool);
    if (!pool) {
        err_set(err, "thread pool: out of memory");
        return NULL;
    }
    pool->n_threads = 1;
    pool->n_use = 1;
    /* LLMS_THREADS_FIXED=1: every job on every thread (benchmarks compare the two) */
    const char *fixed = getenv("LLMS_THREADS_FIXED");
    pool->adaptive = !(fixed && fixed[0] && strcmp(fixed, "0") != 0);
    pool->retry_gap_ns = TP_RETRY_FIRST_NS;
    pool->threads = calloc((size_t)n_threads, sizeof *pool->threads);
    if (!pool->threads) {
        tp_free(pool);
        err_set(err, "thread pool: out of memory");
        return NULL;
    }
    for (int i = 1; i < n_threads; i++) {
        int rc = pthread_create(&pool->threads[i - 1], NULL, tp_worker_main, pool);
        if (rc != 0) {
            tp_free(pool);
            err_set(err, "thread pool: cannot start thread %d of %d", i + 1, n_threads);
            return NULL;
        }
        pool->n_threads = i + 1;
    }
    pool->n_use = pool->n_threads;
    /* one thread has nothing to drop: no clock reads per job */
    pool->adaptive = pool->adaptive && pool->n_threads > 1;
    return pool;
}

void tp_free(tp_pool *pool)
{
    if (!pool)
        return;
    atomic_store(&pool->stop, 1);
    atomic_fetch_add(&pool->generation, 1);
    tp_futex_wake_all(&pool->generation);
    for (int i = 0; i < pool->n_threads - 1; i++)
        pthread_join(pool->threads[i], NULL);
    free(pool->threads);
    free(pool);
}

int tp_n_threads(const tp_pool *pool)
{
    return pool->n_threads;
}

int tp_n_active(const tp_pool *pool)
{
    return pool->background ? 1 : pool->n_use;
}

void tp_set_background(tp_pool *pool, bool background)
{
    pool->background = background;
}

void tp_set_adaptive(tp_pool *pool, bool adaptive)
{
    pool->adaptive = adaptive && pool->n_threads > 1;
    pool->n_use = pool->n_threads;
    pool->window_jobs = 0;
    pool->window_busy_ns = pool->window_wait_ns = 0;
    pool->window_tasks = pool->window_caller_tasks = 0;
    pool->trying = false;
    pool->retry_gap_ns = TP_RETRY_FIRST_NS;
}

/* After a job of n_tasks tasks, caller_tasks of them the caller's: at the end of a window,
 * drop a thread when the threads did not pay, and settle a try. One thread would have
 * spent about busy * tasks / caller_tasks; the threads took busy + wait. */
static void tp_adapt_after_job(tp_pool *pool, int64_t busy_ns, int64_t wait_ns, int caller_tasks,
                               int n_tasks, int64_t now)
{
    pool->window_busy_ns += busy_ns;
    pool->window_wait_ns += wait_ns;
    pool->window_caller_tasks += caller_tasks;
    pool->window_tasks += n_tasks;
    if (++pool->window_jobs < TP_WINDOW)
        return;
    double alone = (double)pool->window_busy_ns * (double)pool->window_tasks /
                   (double)(pool->window_caller_tasks ? pool->window_caller_tasks : 1);
    double speedup = alone / (double)(pool->window_busy_ns + pool->window_wait_ns + 1);
    double needed = pool->n_use == 2 ? TP_MIN_SPEEDUP_OF_TWO
                                     : TP_MIN_EFFICIENCY * (double)(pool->n_use - 1);
    bool waiting = speedup < needed;
    if (waiting) {
        pool->n_use--;
        /* a try that failed backs off; a drop from a settled count starts afresh */
        pool->retry_gap_ns = pool->trying && pool->retry_gap_ns * 2 <= TP_RETRY_MAX_NS
                                 ? pool->retry_gap_ns * 2
                             : pool->trying ? TP_RETRY_MAX_NS
                                            : TP_RETRY_FIRST_NS;
        pool->retry_at_ns = now + pool->retry_gap_ns;
    } else if (pool->trying) {
        pool->retry_gap_ns = TP_RETRY_FIRST_NS;
        pool->retry_at_ns = now + pool->retry_gap_ns;
    }
    pool->trying = false;
    pool->window_jobs = 0;
    pool->window_busy_ns = pool->window_wait_ns = 0;
    pool->window_tasks = pool->window_caller_tasks = 0;
}

/* Before a job: one more thread when a try is due. */
static void tp_adapt_before_job(tp_pool *pool, int64_t now)
{
    if (pool->n_use < pool->n_threads && !pool->trying && now >= pool->retry_at_ns) {
        pool->n_use++;
        pool->trying = true;
        pool->window_jobs = 0;
        pool->window_busy_ns = pool->window_wait_ns = 0;
    pool->window_tasks = pool->window_caller_tasks = 0;
    }
}

void tp_run(tp_pool *pool, tp_fn fn, void *arg)
{
    if (pool->background) {
        fn(arg, 0, 1);
        return;
    }
    int64_t t0 = pool->adaptive ? clock_mono_ns() : 0;
    if (pool->adaptive)
        tp_adapt_before_job(pool, t0);
    int n = pool->n_use;
    if (n == 1) {
        fn(arg, 0, 1);
        return;
    }
    pool->fn = fn;
    pool->arg = arg;
    atomic_store_explicit(&pool->n_done, 0, memory_order_relaxed);
    uint32_t gen = atomic_load_explicit(&pool->generation, memory_order_relaxed) + 1;
    atomic_store_explicit(&pool->claim, TP_WORD(gen, n, 0), memory_order_release);
    atomic_store(&pool->generation, gen); /* seq_cst: pairs with n_sleeping below */
    if (atomic_load(&pool->n_sleeping) > 0)
        tp_futex_wake_all(&pool->generation);

    int caller_tasks = tp_run_tasks(pool, gen);
    int64_t t1 = pool->adaptive ? clock_mono_ns() : 0;

    /* On a machine with more runnable threads than cores a worker may be descheduled in
     * the middle of its task: stop spinning then, and give it the core. */
    int spins = 0;
    while (atomic_load_explicit(&pool->n_done, memory_order_acquire) != n) {
        if (++spins < TP_SPIN)
            tp_cpu_relax();
        else
            sched_yield();
    }
    if (pool->adaptive) {
        int64_t t2 = spins ? clock_mono_ns() : t1;
        tp_adapt_after_job(pool, t1 - t0, t2 - t1, caller_tasks, n, t2);
    }
}

void tp_split(long n, int ith, int nth, long *begin, long *end)
{
    long per = n / nth, extra = n % nth;
    *begin = ith * per + (ith < extra ? ith : extra);
    *end = *begin + per + (ith < extra ? 1 : 0);
}
