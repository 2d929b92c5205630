/*
 * threadpool.h — a fixed set of threads that run one function together.
 *
 * The pool has N-1 worker threads; the calling thread is the N-th. tp_run() is the only
 * operation: every thread (caller included) calls fn(arg, ith, nth) once with its own
 * index ith in [0, nth), and tp_run returns when all have returned. A forward pass calls
 * it a few hundred times per token, so dispatch is a generation counter the workers spin
 * on briefly before sleeping on a futex (idle workers do not burn CPU).
 *
 * tp_run must not be called concurrently on one pool, nor from inside fn.
 */
#ifndef LLMS_THREADPOOL_H
#define LLMS_THREADPOOL_H

#include "engine/err.h"

typedef struct tp_pool tp_pool;

/* The function a pool runs: ith is this thread's index, nth the number of threads. */
typedef void (*tp_fn)(void *arg, int ith, int nth);

/* A pool of n_threads threads in total (caller included); n_threads <= 0 means the number
 * of online CPUs. Returns NULL and fills err when threads cannot be started. */
tp_pool *tp_new(int n_threads, char err[ERR_MAX]);

/* Stops and joins the workers. NULL is allowed. */
void tp_free(tp_pool *pool);

/* Number of threads fn runs on (workers + caller). */
int tp_n_threads(const tp_pool *pool);

/* Runs fn(arg, ith, nth) on every thread and returns when all calls have returned. */
void tp_run(tp_pool *pool, tp_fn fn, void *arg);

/* The [begin, end) share of thread ith out of nth when n items are split evenly. */
void tp_split(long n, int ith, int nth, long *begin, long *end);

#endif
