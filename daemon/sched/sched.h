/*
 * sched.h — the worker thread that owns the engine, the contexts and the store.
 *
 * The event loop submits jobs (requests that need contexts or inference, and news about
 * connections); the worker answers through the outq, so the loop never waits on it.
 *
 * Scheduling: every request that uses the engine (Call, Complete, Embed, Rerank,
 * RerankCalibrate) waits in one FIFO per app and counts toward max_queued_per_app until
 * it ends. Admission takes one request per app in turn (round robin), skipping calls
 * whose context is busy, so calls on one context run one after another. Admitted work
 * advances in steps: each step is one forward pass over every running sequence (one
 * decode row per generation past its prompt) plus up to step_tokens rows of long work
 * (prompts, Embed texts, reranking), shared out between apps by deficit round robin, so
 * a short request's first token comes within a few steps however much long work waits.
 * With several generate models a step is one such forward per model that has work
 * (daemon/models/genmodel.h), one after another. Between steps the worker handles new jobs:
 * Cancel, a closed connection and a request's timeout_ms stop work within one step. sched = serial keeps the behaviour from before
 * (each sequence its own forward, long work to completion) for comparison.
 *
 * A finished Call is persisted in one store transaction: the user turn's tokens and the
 * reply's tokens. A cancelled Call (Cancel, a closed connection, shutdown) is persisted
 * the same way with the partial reply generated so far, so the stored history always
 * equals what the context's KV holds.
 */
#ifndef LLMS_SCHED_H
#define LLMS_SCHED_H

#include <stdbool.h>
#include <stdint.h>

#include "daemon/config.h"
#include "daemon/models/models.h"
#include "daemon/net/outq.h"
#include "engine/tok/chat.h"
#include "engine/err.h"
#include "engine/model/model.h"
#include "engine/tok/tokenizer.h"
#include "proto/llms.pb-c.h"
#include "storage/responses.h"
#include "storage/store.h"

#define SCHED_APP_MAX 64 /* bytes of an app name */
#define SCHED_MAX_ACTIVE 64 /* requests running at once: generations and tasks */

enum sched_job_kind {
    SCHED_REQUEST,        /* req for the worker to answer */
    SCHED_BOUND,          /* the connection bound to app (uid, app) */
    SCHED_CLOSED,         /* the connection is gone: drop its requests, no replies */
    SCHED_CANCEL_STREAMS, /* the client does not read: cancel its generations */
    SCHED_SHUTDOWN,       /* cancel everything, persist, push the end marker, exit */
    SCHED_RESPONSE_PUT,   /* write resp, a stored response of the Responses API, to the
                             store (responses_store = disk) */
    SCHED_RESPONSE_DELETE, /* delete resp->id of uid from the store */
};

typedef struct sched_job {
    enum sched_job_kind kind;
    uint64_t conn_id;
    uint32_t uid;
    char app[SCHED_APP_MAX + 1]; /* "" when the connection is not bound */
    bool admin;
    Llms__Request *req;          /* SCHED_REQUEST: owned by the job */
    store_response *resp;        /* SCHED_RESPONSE_*: owned by the job, its texts with it
                                    (sched_response_job) */
    int64_t queued_ns;           /* CLOCK_MONOTONIC when submitted */
    struct sched_job *next;
} sched_job;

/* What the worker needs; all of it outlives the scheduler. */
typedef struct sched_env {
    const config *cfg;           /* resolved: n_ctx and max_tokens_per_context set */
    models *reg;                 /* the registry: the worker's alone once started */
    const model *m;              /* the default generate model's (what runs on one model
                                    only: decoder embeddings, RAG, prediction) */
    const tokenizer *tok;
    enum chat_family family;
    store *st;
    outq *out;
} sched_env;

typedef struct sched sched;

/* Creates the runner and the KV pool and loads every context from the store. */
sched *sched_new(const sched_env *env, char err[ERR_MAX]);

/* Starts the worker thread. */
int sched_start(sched *s, char err[ERR_MAX]);

/* A job of the given kind for a connection (NULL when memory runs out). */
sched_job *sched_job_new(enum sched_job_kind kind, uint64_t conn_id);

/* A SCHED_RESPONSE_PUT or _DELETE job of r (its strings and texts copied; the uid is
 * r->uid); NULL when memory runs out. The worker writes puts under the budget of
 * responses_store_bytes, evicting the oldest, as the gateway's memory does. Jobs the
 * worker has not taken when it exits (responses that ended during the shutdown) are
 * written by sched_free. */
sched_job *sched_response_job(enum sched_job_kind kind, const store_response *r);

/* Hands a job to the worker (which frees it). */
void sched_submit(sched *s, sched_job *j);

/* Tells the worker how many connections are open (for Status). */
void sched_set_connections(sched *s, unsigned n);

/* Contexts known (for STATUS= lines); safe from any thread. */
unsigned sched_n_contexts(const sched *s);

/* Waits for the worker to exit (after SCHED_SHUTDOWN) and frees everything. */
void sched_free(sched *s);

#endif
