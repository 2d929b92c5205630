/*
 * threadpool.c — N-1 workers wait on a generation counter; tp_run bumps it.
 *
 * Workers spin on the counter for a short while after each job (the next job of a
 * forward pass usually follows within microseconds), then sleep on it with a futex.
 * The caller wakes sleepers only when some are asleep, so back-to-back jobs cost no
 * system call.
 */
#include "engine/threadpool.h"

#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define tp_cpu_relax() _mm_pause()
#else
#define tp_cpu_relax() ((void)0)
#endif

/* Polls of the counter before sleeping: a few tens of microseconds. */
#define TP_SPIN 20000

typedef struct tp_worker {
    tp_pool *pool;
    int ith;
} tp_worker;

struct tp_pool {
    int n_threads;
    pthread_t *threads;   /* (n_threads - 1) */
    tp_worker *workers;   /* (n_threads - 1) */

    _Atomic uint32_t generation; /* futex word: bumped once per job */
    _Atomic int n_sleeping;      /* workers in (or entering) futex wait */
    _Atomic int pending;         /* workers that have not finished the current job */
    _Atomic int stop;

    tp_fn fn; /* current job, published before generation is bumped */
    void *arg;
};

static void tp_futex_wait(_Atomic uint32_t *addr, uint32_t expected)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static void tp_futex_wake_all(_Atomic uint32_t *addr)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
}

static void *tp_worker_main(void *p)
{
    tp_worker *w = p;
    tp_pool *pool = w->pool;
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
        pool->fn(pool->arg, w->ith, pool->n_threads);
        atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_release);
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
    tp_pool *pool = calloc(1, sizeof *pool);
    if (!pool) {
        err_set(err, "thread pool: out of memory");
        return NULL;
    }
    pool->n_threads = 1;
    pool->threads = calloc((size_t)n_threads, sizeof *pool->threads);
    pool->workers = calloc((size_t)n_threads, sizeof *pool->workers);
    if (!pool->threads || !pool->workers) {
        tp_free(pool);
        err_set(err, "thread pool: out of memory");
        return NULL;
    }
    for (int i = 1; i < n_threads; i++) {
        pool->workers[i - 1] = (tp_worker){pool, i};
        int rc = pthread_create(&pool->threads[i - 1], NULL, tp_worker_main,
                                &pool->workers[i - 1]);
        if (rc != 0) {
            tp_free(pool);
            err_set(err, "thread pool: cannot start thread %d of %d", i + 1, n_threads);
            return NULL;
        }
        pool->n_threads = i + 1;
    }
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
    free(pool->workers);
    free(pool);
}

int tp_n_threads(const tp_pool *pool)
{
    return pool->n_threads;
}

void tp_run(tp_pool *pool, tp_fn fn, void *arg)
{
    int n = pool->n_threads;
    if (n == 1) {
        fn(arg, 0, 1);
        return;
    }
    pool->fn = fn;
    pool->arg = arg;
    atomic_store_explicit(&pool->pending, n - 1, memory_order_relaxed);
    atomic_fetch_add(&pool->generation, 1); /* seq_cst: pairs with n_sleeping below */
    if (atomic_load(&pool->n_sleeping) > 0)
        tp_futex_wake_all(&pool->generation);

    fn(arg, 0, n);

    /* On a machine with more runnable threads than cores a worker may be descheduled:
     * stop spinning then, and give it the core. */
    int spins = 0;
    while (atomic_load_explicit(&pool->pending, memory_order_acquire) != 0) {
        if (++spins < TP_SPIN)
            tp_cpu_relax();
        else
            sched_yield();
    }
}

void tp_split(long n, int ith, int nth, long *begin, long *end)
{
    long per = n / nth, extra = n % nth;
    *begin = ith * per + (ith < extra ? ith : extra);
    *end = *begin + per + (ith < extra ? 1 : 0);
}
