/*
 * outq.c — a mutex-protected FIFO list and an eventfd as the wakeup.
 */
#include "daemon/net/outq.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

struct outq {
    pthread_mutex_t lock;
    outq_item *head, *tail;
    int efd;
    bool unsignalled; /* items pushed since the last wake (worker thread only) */
};

outq *outq_new(char err[ERR_MAX])
{
    outq *q = calloc(1, sizeof *q);
    if (!q) {
        err_set(err, "out of memory");
        return NULL;
    }
    q->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (q->efd < 0) {
        err_set(err, "eventfd: %s", strerror(errno));
        free(q);
        return NULL;
    }
    pthread_mutex_init(&q->lock, NULL);
    return q;
}

void outq_item_free(outq_item *it)
{
    if (it) {
        free(it->data);
        free(it);
    }
}

void outq_free(outq *q)
{
    if (!q)
        return;
    outq_item *it = q->head;
    while (it) {
        outq_item *next = it->next;
        outq_item_free(it);
        it = next;
    }
    close(q->efd);
    pthread_mutex_destroy(&q->lock);
    free(q);
}

int outq_fd(const outq *q)
{
    return q->efd;
}

static int push(outq *q, outq_item *it)
{
    pthread_mutex_lock(&q->lock);
    if (q->tail)
        q->tail->next = it;
    else
        q->head = it;
    q->tail = it;
    pthread_mutex_unlock(&q->lock);
    q->unsignalled = true;
    return 0;
}

void outq_wake(outq *q)
{
    if (!q->unsignalled)
        return;
    q->unsignalled = false;
    uint64_t one = 1;
    /* A full counter (EAGAIN) still leaves the fd readable, so the wakeup is not lost. */
    ssize_t w = write(q->efd, &one, sizeof one);
    (void)w;
}

int outq_push(outq *q, uint64_t conn_id, uint8_t *data, size_t len, bool droppable,
              bool final)
{
    outq_item *it = malloc(sizeof *it);
    if (!it) {
        free(data);
        return -1;
    }
    *it = (outq_item){.conn_id = conn_id, .data = data, .len = len, .droppable = droppable,
                      .final = final};
    return push(q, it);
}

int outq_push_end(outq *q)
{
    outq_item *it = calloc(1, sizeof *it);
    if (!it)
        return -1;
    push(q, it);
    outq_wake(q);
    return 0;
}

outq_item *outq_pop_all(outq *q)
{
    uint64_t v;
    ssize_t r = read(q->efd, &v, sizeof v);
    (void)r;
    pthread_mutex_lock(&q->lock);
    outq_item *head = q->head;
    q->head = q->tail = NULL;
    pthread_mutex_unlock(&q->lock);
    return head;
}
