/*
 * swapout.h — the swap-out thread: writes prepared chunk batches (store_chunk_batch) in
 * submission order, off the worker thread, so that compressing, writing and syncing the
 * chunks a call modified (ahead-of-time swap-out) never delays the next step.
 *
 * The worker begins a batch (store_chunk_batch_begin), submits it, and goes on; the
 * thread writes its files and tells the worker through notify; the worker takes the
 * finished jobs (swapout_take_done) and commits their catalog rows
 * (store_chunk_batch_end), so the store stays single-threaded. Whoever must touch the
 * memory a batch reads (freeing a chunk, appending to it) first waits for its owner's
 * jobs (swapout_wait_owner).
 */
#ifndef LLMS_SWAPOUT_H
#define LLMS_SWAPOUT_H

#include "engine/err.h"
#include "storage/chunks.h"

typedef struct swapout_job {
    store_chunk_batch *batch;  /* begun by the caller; written by the thread */
    const void *owner;         /* whose memory the batch reads (a context) */
    struct swapout_job *next;
} swapout_job;

typedef struct swapout swapout;

/* Starts the thread. notify(arg) is called on it after each job is done (it must not
 * call back into the swapout); notify may be NULL. NULL + err on failure. */
swapout *swapout_new(void (*notify)(void *arg), void *arg, char err[ERR_MAX]);

/* Waits for every job, then stops the thread and frees the swapout. The caller takes
 * the finished jobs first (swapout_wait_owner(w, NULL), then swapout_take_done). */
void swapout_free(swapout *w);

/* Queues a job (owned by the caller until it comes back from swapout_take_done). */
void swapout_submit(swapout *w, swapout_job *j);

/* The jobs done since the last call, in submission order (NULL when none). */
swapout_job *swapout_take_done(swapout *w);

/* Blocks until no job of owner (of anyone when NULL) is queued or being written. */
void swapout_wait_owner(swapout *w, const void *owner);

/* Jobs queued or being written. */
int swapout_n_pending(swapout *w);

#endif
