/*
 * threadpool.h — a fixed set of threads that run one function together.
 *
 * The pool has N-1 worker threads; the calling thread is the N-th. tp_run() is the main
 * operation: fn(arg, ith, nth) is called once for every task index ith in [0, nth), by
 * whichever threads (caller included) are running, and tp_run returns when all have
 * returned. Normally nth = N and each thread runs one task; a thread that is late (its
 * core taken by another process) leaves its task to the others, so one thread may run
 * several tasks one after another. Per-task scratch indexed by ith stays exclusive.
 * On a busy machine the pool may run jobs on fewer tasks (nth < N, see tp_n_active),
 * so fn must split its work by the nth it is given, never by tp_n_threads. A forward
 * pass calls tp_run a few hundred times per token, so dispatch is a generation counter
 * the workers spin on briefly before sleeping on a futex (idle workers do not burn CPU).
 *
 * tp_run must not be called concurrently on one pool, nor from inside fn.
 */
#ifndef LLMS_THREADPOOL_H
#define LLMS_THREADPOOL_H

#include "engine/err.h"

#include <stdbool.h>

#define TP_MAX_THREADS 1024

typedef struct tp_pool tp_pool;

/* The function a pool runs: ith is this thread's index, nth the number of threads. */
typedef void (*tp_fn)(void *arg, int ith, int nth);

/* A pool of n_threads threads in total (caller included); n_threads <= 0 means the number
 * of online CPUs. Returns NULL and fills err when threads cannot be started. */
tp_pool *tp_new(int n_threads, char err[ERR_MAX]);

/* Stops and joins the workers. NULL is allowed. */
void tp_free(tp_pool *pool);

/* Number of threads of the pool (workers + caller): the most tasks a job has. */
int tp_n_threads(const tp_pool *pool);

/* Tasks (threads) jobs run on now: tp_n_threads, or fewer while the pool finds that
 * more threads only wait for each other because other processes hold the cores; 1 for
 * background work. */
int tp_n_active(const tp_pool *pool);

/* Adaptation on (the default, unless the environment has LLMS_THREADS_FIXED=1) or off
 * (every job on tp_n_threads tasks). */
void tp_set_adaptive(tp_pool *pool, bool adaptive);

/* Background work on (or off): while on, jobs run on the caller alone (nth = 1) and
 * leave the adaptation as it was. Work nobody waits for then holds one core, not all of
 * them, and does not teach the pool what the jobs that people wait for will find. */
void tp_set_background(tp_pool *pool, bool background);

/* Runs fn(arg, ith, nth) for every task ith in [0, nth), nth = tp_n_active, and returns
 * when all calls have returned. */
void tp_run(tp_pool *pool, tp_fn fn, void *arg);

/* The [begin, end) share of thread ith out of nth when n items are split evenly. */
void tp_split(long n, int ith, int nth, long *begin, long *end);

#endif
