/*
 * semantic.h — the worker's handlers of Embed, Rerank and the admin RerankCalibrate.
 *
 * Embed runs the daemon's model on the worker's runner (engine/embed.h). Rerank uses a
 * reranker (engine/rerank.h) on rerank_model, opened on the first Rerank call and kept.
 * Both run to completion inside the worker
 * between generation steps. Thresholds found by RerankCalibrate are kept in the store's
 * settings under "rerank.cv_threshold:<model path>:<precision>".
 */
#ifndef LLMS_SEMANTIC_H
#define LLMS_SEMANTIC_H

#include <stdbool.h>
#include <stdint.h>

#include "daemon/config.h"
#include "daemon/outq.h"
#include "engine/err.h"
#include "engine/kv.h"
#include "engine/model.h"
#include "engine/tokenizer.h"
#include "proto/llms.pb-c.h"
#include "storage/store.h"

typedef struct semantic_env {
    const config *cfg;
    const char *model_path;
    const model *m;
    const tokenizer *tok;
    model_runner *runner; /* the worker's */
    kv_pool *pool;        /* the worker's */
    store *st;
    outq *out;
} semantic_env;

typedef struct semantic semantic;

/* Everything borrowed from env outlives the handlers. NULL + err on failure. */
semantic *semantic_new(const semantic_env *env, char err[ERR_MAX]);
void semantic_free(semantic *sm);

/* Answers req (Embed, Rerank or RerankCalibrate, admin already checked) on conn_id with
 * one final Response. */
void semantic_handle(semantic *sm, uint64_t conn_id, const Llms__Request *req);

#endif
