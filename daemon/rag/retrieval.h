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
 *
 * Estimates (speculation, HedraRAG): before it is done a retrieval may hold an estimate
 * of its passages, on which the scheduler can start the next node. A hybrid retrieval
 * (RRF, SUM) searches BM25 first, before it embeds its query, and BM25's own top_k is
 * its estimate; a retrieval seeded with another one's result (the same node's retrieval
 * started on a generation's first tokens) holds that result instead. Once done, whether
 * the final passages (ids, in order) equal the estimate says whether the speculative work
 * stands; when they do, the estimate's texts (already read) are the result.
 */
#ifndef LLMS_RETRIEVAL_H
#define LLMS_RETRIEVAL_H

#include <stdint.h>

#include "daemon/rag/kb.h"
#include "daemon/sched/semantic.h"
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

bool retrieval_done(const retrieval *r);

/* The passages' texts once done (valid until retrieval_free). */
const char *retrieval_text(const retrieval *r, size_t *len);

enum retrieval_estimate {
    RETRIEVAL_ESTIMATE_NONE,     /* none (yet), or the retrieval is done */
    RETRIEVAL_ESTIMATE_BM25,     /* BM25's top_k of a hybrid retrieval */
    RETRIEVAL_ESTIMATE_SEED,     /* retrieval_seed's */
};

/* Where the estimate comes from while the retrieval is not done. */
enum retrieval_estimate retrieval_estimate(const retrieval *r);

/* The estimate's texts, joined as the result's are (read from the store on first use;
 * valid until the next step). NULL with err when they cannot be read; the retrieval then
 * holds no estimate. */
const char *retrieval_estimate_text(retrieval *r, size_t *len, char err[ERR_MAX]);

/* Takes from's result (from done) as r's estimate, in place of any other. */
void retrieval_seed(retrieval *r, const retrieval *from);

/* The request's similarity hints (kb.h: kb_hints): its vector search reads them and
 * leaves its own candidates' lists there for the request's next retrieval. hints must
 * outlive r; NULL: none. */
void retrieval_use_hints(retrieval *r, kb_hints *hints);

/* Once done: whether it held an estimate and the final passages equal it. */
bool retrieval_estimate_held(const retrieval *r);

void retrieval_free(retrieval *r);

#endif
