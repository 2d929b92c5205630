/*
 * rag.h — RagQuery and its two cache levels (PerCache's QA bank and QKV prefix tree).
 *
 * A query: the question is embedded; the QA bank of its knowledge base is searched and
 * a stored question with cosine >= tau_query answers at once (after checking that every
 * passage the stored answer came from still exists), with the stop reason and generated
 * tokens of that answer's generation. Otherwise hybrid retrieval picks
 * the top-k passages and the prompt is built as separately tokenized segments:
 *   [template head + system prompt + "Passages:"] [passage 1] ... [passage k]
 *   ["Question: ..." + template tail]
 * so a segment's tokens never depend on its neighbours, and the token sequence up to
 * the end of passage i depends only on (system prompt, passage 1..i).
 *
 * QKV prefix tree: node i of a prompt holds the KV chunks (16 tokens, f16, exactly as the
 * forward computed them) that the prefix up to the end of segment i completes and its
 * parent's prefix did not; its key is BLAKE2b-256 of the model, the owner and that whole
 * token prefix, its parent the node of the prefix one segment shorter. The owner is the
 * app, or the uid's apps together for a knowledge base made with share_uid: a query only
 * ever meets its owner's nodes, and its reply's outcome and counts only ever describe
 * them. The store keeps each node's owner and prefix and compares them with the query's
 * before its KV is used (a mismatch is a miss, counted: rag_verify_misses). A path of nodes present from
 * the root is loaded into the query's KV and prefill computes the rest, which is exact
 * because KV at a position depends only on the tokens before it. After a generation
 * the missing nodes of its path are stored, and least frequently used leaves are
 * evicted: the owner's own over cache_owner_max_mb or cache_owner_max_entries, then the
 * largest owner's while the tree is over qkv_cache_mb. Each generated answer goes into
 * the QA bank (the same two evictions, oldest first, under qa_cache_mb).
 *
 * Invalidation: after a KbAdd, each stored question of the knowledge base is retrieved
 * again (hybrid, top k_refresh); an entry whose list now holds a new passage is deleted.
 * After a KbRemove, entries citing a removed passage are deleted. An answer whose
 * generation overlapped any knowledge base change is not stored.
 *
 * Everything runs on the worker thread.
 */
#ifndef LLMS_RAG_H
#define LLMS_RAG_H

#include <stdbool.h>
#include <stdint.h>

#include "daemon/config.h"
#include "daemon/rag/kb.h"
#include "daemon/net/outq.h"
#include "daemon/rag/predict.h"
#include "daemon/sched/semantic.h"
#include "engine/tok/chat.h"
#include "engine/kv/kv.h"
#include "engine/tok/tokenizer.h"
#include "proto/llms.pb-c.h"
#include "storage/store.h"

typedef struct rag_env {
    const config *cfg;
    const char *model_path;   /* part of every QKV key */
    store *st;
    outq *out;
    const tokenizer *tok;
    enum chat_family family;
    kv_shape shape;
    kbm *kb;
    semantic *sem;
    predict *pred;            /* told of real queries and knowledge base changes */
} rag_env;

typedef struct rag rag;
typedef struct rag_query rag_query;

rag *rag_new(const rag_env *env, char err[ERR_MAX]);
void rag_free(rag *r);

/* Starts RagQuery req of app (uid, app). NULL when the request was answered already:
 * from the QA bank, or with an error. Otherwise the prompt's tokens are ready
 * (rag_prompt) and seq (empty, the generation's) holds the KV of the longest cached
 * prefix. queued_ns is when the request arrived (CLOCK_MONOTONIC). max_tokens is the
 * reply length the generation asks for: a QA entry answers only a query of its length.
 * constrained: the reply must be JSON or a sentence of a grammar (any format but
 * FORMAT_TEXT); the QA bank's answers are free text, so such a query neither reads nor
 * fills it. */
rag_query *rag_begin(rag *r, uint64_t conn_id, uint32_t uid, const char *app,
                     const Llms__Request *req, int max_tokens, bool constrained, kv_seq *seq,
                     int64_t queued_ns);

/* Starts the predictor's task t (PREDICT_QUERY or PREDICT_WARM): req's RagQuery for app
 * (uid, app), answered to nobody. A query with t->decode puts its answer in the QA bank,
 * else it is only prefilled (max_tokens should then be 1). A warm-up's prompt is the
 * head and passage t->passage as passage 1, nothing retrieved or embedded. NULL with
 * *cached true when there is nothing to compute (a QA entry within tau_query answers it,
 * or, prefill only, its whole QKV path is stored), with *cached false on failure
 * (logged). What it stores is marked predicted, and hits of real queries on it are
 * counted (predict_count_hits). max_tokens as for rag_begin. */
rag_query *rag_begin_predicted(rag *r, uint32_t uid, const char *app, const Llms__Request *req,
                               int max_tokens, const predict_task *t, kv_seq *seq,
                               bool *cached);

/* Where the prefill slice of the prompt that starts at token from ends, for slices of
 * at most step_tokens: at every node's end (the chunks it completes), then every
 * step_tokens after it. A row's bits depend on the slice it is computed in (its
 * attention block, the row count of each matrix product), and a prompt resumed after a
 * cached prefix starts at a node's end, so cutting a prefill from scratch at the same
 * places computes every later row as the resumed one does: the reuse is exact. */
int rag_slice_end(const rag_query *q, int from, int step_tokens);

/* The QA bank's threshold now (tau_query, or what CacheTune set). */
float rag_tau(const rag *r);

/* Whether the QKV tree is below 90% of qkv_cache_mb. */
bool rag_qkv_room(rag *r);

/* The prompt's tokens (valid until rag_query_free). */
const int32_t *rag_prompt(const rag_query *q, int *n);

/* After a generation over the prompt ended without failure: fills res (a RagResult whose
 * pointers stay valid until rag_query_free) with the passages, the outcome and the
 * retrieval time; the caller adds the generation's numbers and sends it. */
void rag_result(const rag_query *q, Llms__RagResult *res);

/* Then, after the reply is sent: counts the uses of the nodes loaded, stores the
 * prompt's missing QKV nodes from seq (which still holds the prompt's KV) and the answer
 * in the QA bank with why it stopped and its n_generated tokens (a hit reports them),
 * evicting under qkv_cache_mb and qa_cache_mb, in one cache transaction
 * (store_cache_begin). A cache that cannot be written is logged, not an error. */
void rag_populate(rag *r, rag_query *q, const kv_seq *seq, const char *answer,
                  Llms__StopReason stop, int n_generated);

void rag_query_free(rag_query *q);

/* Cache (statistics) and CacheClear of the caches proto CacheRequest names, asked by
 * (uid, app) ("" when unbound), admin or not; CacheTune (admin). */
void rag_handle_cache(rag *r, uint64_t conn_id, uint32_t uid, const char *app, bool admin,
                      const Llms__Request *req);

/* QKV nodes found under a query's key whose owner or token prefix was not the query's,
 * since the daemon started (each was used as a miss). */
uint64_t rag_verify_misses(const rag *r);

#endif
