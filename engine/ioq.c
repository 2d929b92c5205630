/* ioq.c — ordered background preads and pwrites (see ioq.h). */
#include "engine/ioq.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define IOQ_CAP 64

typedef struct ioq_job {
    int fd;
    void *buf;
    size_t len;
    off_t off;
    bool write;
} ioq_job;

struct ioq {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv_job;  /* a job was queued, or stop */
    pthread_cond_t cv_done; /* a job finished, or a slot freed */
    ioq_job jobs[IOQ_CAP];
    uint64_t submitted, done;
    bool stop;
    int failed_errno;       /* 0, or errno of the first failure (EIO for a short read) */
};

static int ioq_do(const ioq_job *j)
{
    size_t pos = 0;
    while (pos < j->len) {
        ssize_t r = j->write ? pwrite(j->fd, (char *)j->buf + pos, j->len - pos, j->off + (off_t)pos)
                             : pread(j->fd, (char *)j->buf + pos, j->len - pos, j->off + (off_t)pos);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return errno;
        if (r == 0)
            return EIO;
        pos += (size_t)r;
    }
    return 0;
}

static void *ioq_main(void *arg)
{
    ioq *q = arg;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!q->stop && q->done == q->submitted)
            pthread_cond_wait(&q->cv_job, &q->mu);
        if (q->done == q->submitted)
            break;
        ioq_job j = q->jobs[q->done % IOQ_CAP];
        pthread_mutex_unlock(&q->mu);
        int e = ioq_do(&j);
        pthread_mutex_lock(&q->mu);
        if (e && !q->failed_errno)
            q->failed_errno = e;
        q->done++;
        pthread_cond_broadcast(&q->cv_done);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

ioq *ioq_new(char err[ERR_MAX])
{
    ioq *q = calloc(1, sizeof *q);
    if (!q) {
        err_set(err, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv_job, NULL);
    pthread_cond_init(&q->cv_done, NULL);
    int e = pthread_create(&q->thread, NULL, ioq_main, q);
    if (e) {
        err_set(err, "I/O thread: %s", strerror(e));
        pthread_cond_destroy(&q->cv_done);
        pthread_cond_destroy(&q->cv_job);
        pthread_mutex_destroy(&q->mu);
        free(q);
        return NULL;
    }
    return q;
}

void ioq_free(ioq *q)
{
    if (!q)
        return;
    pthread_mutex_lock(&q->mu);
    q->stop = true;
    pthread_cond_signal(&q->cv_job);
    pthread_mutex_unlock(&q->mu);
    pthread_join(q->thread, NULL);
    pthread_cond_destroy(&q->cv_done);
    pthread_cond_destroy(&q->cv_job);
    pthread_mutex_destroy(&q->mu);
    free(q);
}

uint64_t ioq_submit(ioq *q, int fd, void *buf, size_t len, off_t off, bool write)
{
    pthread_mutex_lock(&q->mu);
    while (q->submitted - q->done >= IOQ_CAP)
        pthread_cond_wait(&q->cv_done, &q->mu);
    q->jobs[q->submitted % IOQ_CAP] = (ioq_job){fd, buf, len, off, write};
    uint64_t ticket = ++q->submitted;
    pthread_cond_signal(&q->cv_job);
    pthread_mutex_unlock(&q->mu);
    return ticket;
}

int ioq_wait(ioq *q, uint64_t ticket, char err[ERR_MAX])
{
    pthread_mutex_lock(&q->mu);
    while (q->done < ticket)
        pthread_cond_wait(&q->cv_done, &q->mu);
    int e = q->failed_errno;
    pthread_mutex_unlock(&q->mu);
    if (e)
        return err_set(err, "background I/O failed: %s", e == EIO ? "short read or I/O error"
                                                                   : strerror(e));
    return 0;
}

int ioq_drain(ioq *q, char err[ERR_MAX])
{
    pthread_mutex_lock(&q->mu);
    while (q->done < q->submitted)
        pthread_cond_wait(&q->cv_done, &q->mu);
    int e = q->failed_errno;
    q->failed_errno = 0;
    pthread_mutex_unlock(&q->mu);
    if (e)
        return err_set(err, "background I/O failed: %s", e == EIO ? "short read or I/O error"
                                                                   : strerror(e));
    return 0;
}
