/*
 * retrieval.h — one retrieval node run of a workflow graph, in sub-stages.
 *
 * A retrieval looks up the app's knowledge base, then advances one sub-stage per call
 * of retrieval_step: embed the query (unless BM25 only), search (kb_retrieve: BM25 and
 * vectors fused), read the passages' texts. The scheduler runs sub-stages of every graph
 * run at a retrieval node under a time budget per cycle, so retrievals of many runs
 * interleave with the generation steps instead of holding the worker for whole searches;
 * a search that itself comes in pieces (an IVF index's cluster batches) adds sub-stages
 * here.
 *
 * The result is the passages' texts, best first, joined by blank lines; a blank query
 * finds nothing (an empty text), rather than failing the run.
 */
#ifndef LLMS_RETRIEVAL_H
#define LLMS_RETRIEVAL_H

#include <stdint.h>

#include "daemon/kb.h"
#include "daemon/semantic.h"
#include "engine/err.h"
#include "proto/llms.pb-c.h"
#include "storage/store.h"

typedef struct retrieval retrieval;

/* Starts a retrieval of top_k passages of app (uid, app)'s knowledge base kb_name for
 * query under mode. NULL with *code (NOT_FOUND for another app's or a missing knowledge
 * base, INVALID_ARGUMENT, INTERNAL) and err. */
retrieval *retrieval_begin(kbm *k, semantic *sem, store *st, uint32_t uid, const char *app,
                           const char *kb_name, const char *query, int top_k,
                           Llms__Retrieval mode, Llms__ErrorCode *code, char err[ERR_MAX]);

/* Runs the next sub-stage: 1 when the retrieval is done, 0 when sub-stages remain, -1
 * with *code and err on failure. */
int retrieval_step(retrieval *r, Llms__ErrorCode *code, char err[ERR_MAX]);

/* The passages' texts once done (valid until retrieval_free). */
const char *retrieval_text(const retrieval *r, size_t *len);

void retrieval_free(retrieval *r);

#endif
