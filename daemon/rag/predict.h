/*
 * predict.h — PerCache's idle-time query prediction and cache scheduler: the questions
 * the worker asks itself, as low-priority work, while no engine request has come for
 * idle_after_ms (daemon/sched/idle.c runs them; any real request pauses them within a step).
 *
 * Where predicted questions come from:
 *  - knowledge-based: after documents arrive, the model writes an abstract of the
 *    knowledge base from its previous abstract and the new passages (a batch: every
 *    predict_stride new passages, or the first ones when there is no abstract yet), then
 *    proposes a question for every predict_stride-th new passage from abstract + passage;
 *  - history-based: the model rewrites each real question in other words and proposes a
 *    follow-up to it;
 *  - warm-ups: each new passage (newest first, predict_warm per idle period, while the
 *    QKV tree has room) is prefilled as the first passage of a RagQuery prompt, so any
 *    later question that retrieves it first reuses its KV. It needs no question, so it
 *    helps where the model cannot propose the questions users will ask.
 * Each of these is a generation (PREDICT_GENERATE, greedy, predict_max_tokens); the first
 * line of its output is a predicted question. Predicted questions then run through
 * RagQuery's own path (PREDICT_QUERY) and fill the cache levels. The cache scheduler:
 * while tau_query >= tau_scheduler (a QA entry would rarely match another wording) a
 * predicted query is only prefilled (its passages' KV into the QKV tree), otherwise
 * prefilled and decoded (its answer into the QA bank too). When tau_query drops below
 * tau_scheduler, the questions that were only prefilled are decoded (QKV->QA, cheap: their
 * path is in the tree); while it is at or above and the QKV tree has room (below 90% of
 * qkv_cache_mb), the decoded ones are prefilled again where their path left the tree
 * (QA->QKV). The stores' own limits (qkv_cache_mb, qa_cache_mb) hold at every write.
 *
 * predict_budget tasks (generations and queries) and predict_warm warm-ups at most run
 * per idle period, which a real engine request ends. State (abstracts, queues) lives in memory: after a restart
 * prediction starts again from the documents and questions that come.
 *
 * Everything runs on the worker thread.
 */
#ifndef LLMS_PREDICT_H
#define LLMS_PREDICT_H

#include <stdbool.h>
#include <stdint.h>

#include "daemon/config.h"
#include "daemon/rag/kb.h"
#include "storage/store.h"

typedef enum predict_kind {
    PREDICT_GENERATE,   /* text (a user message) through the chat template: a proposal */
    PREDICT_QUERY,      /* text is a predicted question for knowledge base kb */
    PREDICT_WARM,       /* passage of kb prefilled as a prompt's first (QKV tree only) */
} predict_kind;

typedef struct predict_task {
    predict_kind kind;
    int purpose;        /* internal: what the output is for */
    uint32_t uid;       /* the knowledge base's app and name */
    char app[KB_NAME_MAX + 1];
    char kb[KB_NAME_MAX + 1];
    int64_t kb_id;
    char *text;         /* "" for PREDICT_WARM */
    int64_t passage;    /* PREDICT_WARM */
    bool decode;        /* PREDICT_QUERY: prefilled and decoded (QA), or only prefilled */
    int max_tokens;     /* PREDICT_GENERATE */
} predict_task;

/* How a task ended (predict_done). */
enum predict_end {
    PREDICT_RAN,        /* computed; a generation's output is given */
    PREDICT_CACHED,     /* a query with nothing to compute: its level holds it already */
    PREDICT_DROPPED,    /* failed or stopped (shutdown, memory); not retried */
};

typedef struct predict_stats {
    uint64_t predicted, prefilled, decoded, converted, generations, preempted, steps;
    uint64_t resumed;   /* forwards that went on from the layer a job stopped them at */
    uint64_t warmed;    /* passages warmed up */
    uint64_t qa_hits, qkv_hits;
    double ms;
    unsigned queued;
} predict_stats;

typedef struct predict predict;

predict *predict_new(const config *cfg, store *st, char err[ERR_MAX]);
void predict_free(predict *p);

/* Whether prediction is on (predict_budget > 0). */
bool predict_enabled(const predict *p);

/* A real RagQuery of knowledge base kb (found by kb_lookup) asked question. */
void predict_note_query(predict *p, const kb_ref *kb, const char *question);

/* A committed change of kb (kb_changed_fn's arguments): new passages from first_new, or
 * removals (-1). */
void predict_note_change(predict *p, const kb_ref *kb, int64_t first_new);

/* The QA entry of question in kb went stale with a change of kb (its passages, or the
 * ones it would retrieve now, changed) and was deleted: the question is queued again as
 * a predicted one, so the cache levels get it back for the passages of now (regenerated
 * in idle time, prefilled or decoded as the cache scheduler says). */
void predict_note_stale(predict *p, const kb_ref *kb, const char *question);

/* A real engine request arrived: the idle period (and its budget) ends. */
void predict_idle_end(predict *p);

/* Whether predict_next (same arguments) has something to give in this idle period. */
bool predict_has_work(const predict *p, float tau, bool qkv_room);

/* The next task of the idle period under the cache scheduler (tau the QA bank's
 * threshold now, qkv_room whether the QKV tree is below 90% of its budget), into t
 * (fresh strings, predict_task_clear frees them); false when there is none or the
 * period's budget is spent. */
bool predict_next(predict *p, float tau, bool qkv_room, predict_task *t);

/* t ended: how, and a generation's output (NULL unless PREDICT_RAN). */
void predict_done(predict *p, const predict_task *t, enum predict_end how, const char *output);

void predict_task_clear(predict_task *t);

/* Counters the scheduler and the RAG cache keep here for CacheResponse. */
void predict_count_step(predict *p, double ms);  /* a scheduler step of prediction work */
void predict_count_ms(predict *p, double ms);    /* other worker time: lookups, retrieval */
void predict_count_preempted(predict *p);

/* One more forward that went on from where a job stopped it, instead of starting over. */
void predict_count_resumed(predict *p);
void predict_count_hits(predict *p, bool qa, bool qkv);
void predict_get_stats(const predict *p, predict_stats *out);

#endif
