/*
 * ioq.h — a queue of positioned reads and writes done in order by one background thread,
 * so that file I/O (weights of the next layer, offloaded activations) overlaps compute.
 *
 * Jobs run strictly in submission order: a read submitted after a write of the same
 * bytes sees the written data, and a buffer may be reused for a read once the write
 * from it was submitted. Used by one thread at a time.
 */
#ifndef LLMS_IOQ_H
#define LLMS_IOQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "engine/err.h"

typedef struct ioq ioq;

/* Starts the I/O thread. NULL + err on failure. */
ioq *ioq_new(char err[ERR_MAX]);

/* Waits for every submitted job, then stops the thread. NULL is allowed. */
void ioq_free(ioq *q);

/* Queues a pread (write false) or pwrite of len bytes at offset off of fd into / from
 * buf, which must stay valid until the job is done. Blocks while the queue is full.
 * Returns the job's ticket (increasing from 1). */
uint64_t ioq_submit(ioq *q, int fd, void *buf, size_t len, off_t off, bool write);

/* Waits until every job up to ticket is done. -1 + err when any job so far failed (short
 * read, I/O error); the failure stays reported until ioq_drain. */
int ioq_wait(ioq *q, uint64_t ticket, char err[ERR_MAX]);

/* Waits for every submitted job, then reports (-1 + err) and clears a recorded failure. */
int ioq_drain(ioq *q, char err[ERR_MAX]);

#endif
