/*
 * outq.h — the queue that carries packed Response frames from the worker thread to the
 * event loop.
 *
 * The worker pushes; the loop is woken through an eventfd it watches and pops the
 * whole queue at once. The queue never blocks the worker for longer than a list
 * append under a mutex, so inference never waits on the loop.
 */
#ifndef LLMS_OUTQ_H
#define LLMS_OUTQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/err.h"

typedef struct outq_item {
    uint64_t conn_id;   /* the connection the frame goes to; 0 with data NULL: the worker
                           has finished (after shutdown) */
    uint8_t *data;      /* a whole frame (header and body), owned by the item */
    size_t len;
    bool droppable;     /* a streamed chunk, which a connection over its output cap may
                           drop (the final result still carries the whole text) */
    bool final;         /* the request's last frame: it is answered (chunks, graph events
                           and progress come before it) */
    struct outq_item *next;
} outq_item;

typedef struct outq outq;

/* A queue with its eventfd (non-blocking, close-on-exec). NULL + err on failure. */
outq *outq_new(char err[ERR_MAX]);

/* Frees the queue, its eventfd and any items left. */
void outq_free(outq *q);

/* The descriptor the loop watches for readability. */
int outq_fd(const outq *q);

/* Appends a frame (taking ownership of data, which is freed on failure). The loop is
 * not woken until outq_wake: the worker pushes a round's frames (one token of every
 * running generation) and wakes the loop once, which keeps wakeups from stealing the
 * engine's cores. Returns -1 only when memory runs out. */
int outq_push(outq *q, uint64_t conn_id, uint8_t *data, size_t len, bool droppable,
              bool final);

/* Wakes the loop when frames were pushed since the last wake. */
void outq_wake(outq *q);

/* Signals that the worker is done: an item with conn_id 0 and data NULL (and wakes
 * the loop). */
int outq_push_end(outq *q);

/* Clears the wakeup and takes every queued item, oldest first (NULL when empty). The
 * caller frees each item and its data with outq_item_free. */
outq_item *outq_pop_all(outq *q);

void outq_item_free(outq_item *it);

#endif
