/* swapout.c — the swap-out thread (see swapout.h). */
#include "daemon/ctx/swapout.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct swapout {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t work;        /* a job was queued, or stop */
    pthread_cond_t progress;    /* a job is done */
    swapout_job *queue_head, *queue_tail;   /* waiting to be written */
    swapout_job *running;                   /* being written */
    swapout_job *done_head, *done_tail;     /* written, not taken */
    bool stop;
    store_chunk_encoder *enc;   /* the thread's compressor */
    void (*notify)(void *arg);
    void *notify_arg;
};

static void *swapout_main(void *arg)
{
    swapout *w = arg;
    pthread_mutex_lock(&w->lock);
    for (;;) {
        while (!w->queue_head && !w->stop)
            pthread_cond_wait(&w->work, &w->lock);
        swapout_job *j = w->queue_head;
        if (!j)
            break; /* stopping, and everything is written */
        w->queue_head = j->next;
        if (!w->queue_head)
            w->queue_tail = NULL;
        j->next = NULL;
        w->running = j;
        pthread_mutex_unlock(&w->lock);

        /* a failed write is seen by store_chunk_batch_end, which refuses to commit it */
        char err[ERR_MAX];
        store_chunk_batch_write(j->batch, w->enc, err);

        pthread_mutex_lock(&w->lock);
        w->running = NULL;
        if (w->done_tail)
            w->done_tail->next = j;
        else
            w->done_head = j;
        w->done_tail = j;
        pthread_cond_broadcast(&w->progress);
        if (w->notify) {
            pthread_mutex_unlock(&w->lock);
            w->notify(w->notify_arg);
            pthread_mutex_lock(&w->lock);
        }
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

swapout *swapout_new(void (*notify)(void *arg), void *arg, char err[ERR_MAX])
{
    swapout *w = calloc(1, sizeof *w);
    if (!w) {
        err_set(err, "out of memory for the swap-out thread");
        return NULL;
    }
    if (!(w->enc = store_chunk_encoder_new(err))) {
        free(w);
        return NULL;
    }
    w->notify = notify;
    w->notify_arg = arg;
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->work, NULL);
    pthread_cond_init(&w->progress, NULL);
    int rc = pthread_create(&w->thread, NULL, swapout_main, w);
    if (rc) {
        err_set(err, "starting the swap-out thread: %s", strerror(rc));
        pthread_cond_destroy(&w->progress);
        pthread_cond_destroy(&w->work);
        pthread_mutex_destroy(&w->lock);
        store_chunk_encoder_free(w->enc);
        free(w);
        return NULL;
    }
    return w;
}

void swapout_free(swapout *w)
{
    if (!w)
        return;
    pthread_mutex_lock(&w->lock);
    w->stop = true;
    pthread_cond_signal(&w->work);
    pthread_mutex_unlock(&w->lock);
    pthread_join(w->thread, NULL);
    pthread_cond_destroy(&w->progress);
    pthread_cond_destroy(&w->work);
    pthread_mutex_destroy(&w->lock);
    store_chunk_encoder_free(w->enc);
    free(w);
}

void swapout_submit(swapout *w, swapout_job *j)
{
    j->next = NULL;
    pthread_mutex_lock(&w->lock);
    if (w->queue_tail)
        w->queue_tail->next = j;
    else
        w->queue_head = j;
    w->queue_tail = j;
    pthread_cond_signal(&w->work);
    pthread_mutex_unlock(&w->lock);
}

swapout_job *swapout_take_done(swapout *w)
{
    pthread_mutex_lock(&w->lock);
    swapout_job *j = w->done_head;
    w->done_head = w->done_tail = NULL;
    pthread_mutex_unlock(&w->lock);
    return j;
}

/* Whether a job of owner (anyone's when NULL) is queued or running; under the lock. */
static bool owner_pending(const swapout *w, const void *owner)
{
    if (w->running && (!owner || w->running->owner == owner))
        return true;
    for (const swapout_job *j = w->queue_head; j; j = j->next)
        if (!owner || j->owner == owner)
            return true;
    return false;
}

void swapout_wait_owner(swapout *w, const void *owner)
{
    pthread_mutex_lock(&w->lock);
    while (owner_pending(w, owner))
        pthread_cond_wait(&w->progress, &w->lock);
    pthread_mutex_unlock(&w->lock);
}

int swapout_n_pending(swapout *w)
{
    pthread_mutex_lock(&w->lock);
    int n = w->running != NULL;
    for (const swapout_job *j = w->queue_head; j; j = j->next)
        n++;
    pthread_mutex_unlock(&w->lock);
    return n;
}
