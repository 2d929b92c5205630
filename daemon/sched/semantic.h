/*
 * semantic.h — the worker's Embed, Rerank and the admin RerankCalibrate, as tasks that
 * the step scheduler advances a slice at a time.
 *
 * Each request runs on the model it names, else its role's default (daemon/models/models.h);
 * an unknown name is NOT_FOUND, a model without the role INVALID_ARGUMENT. Embed on the
 * default generate model (a decoder): each step takes a slice of the current text as one
 * more sequence of the step's batched forward (semantic_slice, then semantic_slice_done
 * after the forward). Embed on a bert encoder, or on a decoder with a runner of its own
 * (models_embeds_apart: an embedding model beside the generator), advances by
 * semantic_advance instead, whole texts at a time. A text is pooled as the request says,
 * else as the file's {arch}.pooling_type says, else by its last token (a decoder) or CLS
 * (an encoder); a file whose pooling_type is none or rank gives no vector unless the
 * request names a pooling (INVALID_ARGUMENT). Rerank runs the model's reranker (engine/encoder/rerank.h), opened on its first call
 * and kept; its tasks advance by semantic_advance, a bounded number of rows at a time,
 * one rerank per reranker at a time; when the candidates' hidden states exceed
 * rerank_memory_mb (over three chunks) they go to an unlinked file in the daemon's
 * $TMPDIR (else /tmp). A calibration runs whole inside one
 * semantic_advance (an admin's rare call). Thresholds found by RerankCalibrate are kept
 * in the store's settings under "rerank.cv_threshold:<model path>:<precision>". A task
 * counts in its model's running while it exists, so that the model is not unloaded
 * under it.
 */
#ifndef LLMS_SEMANTIC_H
#define LLMS_SEMANTIC_H

#include <stdbool.h>
#include <stdint.h>

#include "daemon/config.h"
#include "daemon/models/models.h"
#include "daemon/net/outq.h"
#include "engine/err.h"
#include "engine/kv/kv.h"
#include "engine/model/model.h"
#include "engine/tok/tokenizer.h"
#include "proto/llms.pb-c.h"
#include "storage/store.h"

typedef struct semantic_env {
    const config *cfg;
    models *reg;          /* the worker's: embed and rerank models by name */
    const model *m;       /* the generate model (decoder embeddings) */
    const tokenizer *tok;
    model_runner *runner; /* the worker's */
    kv_pool *pool;        /* the worker's */
    int max_slice;        /* most rows semantic_slice is asked for */
    store *st;
    outq *out;
} semantic_env;

typedef struct semantic semantic;

/* Everything borrowed from env outlives the handlers. NULL + err on failure. */
semantic *semantic_new(const semantic_env *env, char err[ERR_MAX]);
void semantic_free(semantic *sm);

typedef struct sem_task sem_task;

/* Checks req (Embed, Rerank or RerankCalibrate; admin already checked) and prepares its
 * work. NULL when the request was answered at once (an error). */
sem_task *semantic_begin(semantic *sm, uint64_t conn_id, const Llms__Request *req);

/* Whether a task for req may begin now: reranks and calibrations of one reranker run
 * one task at a time. */
bool semantic_can_begin(const semantic *sm, const Llms__Request *req);

/* Whether the task's work is forward slices on the generate model (Embed) rather than
 * semantic_advance. */
bool semantic_uses_slices(const sem_task *t);

/* Embed: the next slice of at most max_rows (<= max_slice) tokens, as a batch on the
 * task's own sequence; *seq and b point into the task until semantic_slice_done. */
void semantic_slice(sem_task *t, int max_rows, kv_seq **seq, model_batch *b);

/* Embed, after the forward evaluated the slice: pools its rows; when the last text is
 * done, answers the request. 1 when the task is finished. */
int semantic_slice_done(sem_task *t);

/* Rerank and calibration: advances by about max_rows rows of work. 1 when the task is
 * finished, its request answered (with the result or an error), 0 when more remains. */
int semantic_advance(sem_task *t, int max_rows);

/* Rows of work the task still has at most (the scheduler's cost estimate). */
long semantic_rows_left(const sem_task *t);

/* Embed: texts whose vectors are made so far (a progress report's count); 0 for other
 * tasks. */
int semantic_texts_done(const sem_task *t);

/* The embed model of requests that name none (the registry's default), NULL + err when
 * there is none. */
models_entry *semantic_default_embedder(semantic *sm, char err[ERR_MAX]);

/* The worker's own embeddings (knowledge base passages, RAG questions): text embedded at
 * once with me, an embed model of the registry, pooled as its file says (a decoder whose
 * file names no pooling: the mean), into out (semantic_dim(me) floats, unit length). A
 * text longer than the model takes is cut to its first tokens (512 at most). A text with
 * no tokens, or a file whose pooling gives no vector, is an error. */
int semantic_embed_now(semantic *sm, models_entry *me, const char *text, float *out,
                       char err[ERR_MAX]);

/* The worker's own embeddings as a task the scheduler advances like an Embed on me,
 * with semantic_embed_now's pooling and cut, so that its vectors are the ones
 * semantic_embed_now makes: texts (n, borrowed until the task is freed) are tokenized
 * one at a time as the task reaches them; nothing is answered. Finished when
 * semantic_rows_left is 0. NULL + err when me's pooling gives no vector or memory runs
 * out. */
sem_task *semantic_embed_texts(semantic *sm, models_entry *me, const char *const *texts, int n,
                               char err[ERR_MAX]);

/* A finished semantic_embed_texts task's vectors ((n, semantic_dim), unit length, valid
 * until the task is freed), or NULL + err when it failed. */
const float *semantic_task_values(const sem_task *t, char err[ERR_MAX]);

/* Whether me's pooling gives the worker's own embeddings a vector per text: 0, or -1 +
 * err (its file's pooling_type is none or rank). */
int semantic_embed_check(const semantic *sm, const models_entry *me, char err[ERR_MAX]);

/* Length of me's vectors. */
int semantic_dim(const semantic *sm, const models_entry *me);

/* Frees a task at any point; an unfinished task's request is not answered (the caller
 * answers it: cancelled, deadline). NULL is allowed. */
void semantic_task_free(sem_task *t);

#endif
