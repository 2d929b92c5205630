/*
 * sched_internal.h — what the worker's files share (the files of daemon/sched/, not the
 * rest of the daemon): the scheduler's state (struct sched), the apps it queues for, the
 * work it admits (work), a generation (gen), and the few functions one file calls in
 * another. Each file keeps the rest of its own static.
 *
 * The files, by concern:
 *   sched.c     the worker thread and its loop, the replies, one batched step
 *   admit.c     apps, their queues, the inbox's jobs, admission and reaping
 *   work.c      an admitted request's life: start, failure, end
 *   generate.c  a generation (Call, Complete, RagQuery, a graph's generation node)
 *   graphrun.c  GraphRun: its nodes and their speculation
 *   idle.c      idle-time work: layer calibration, IVF training and hot copies,
 *               prediction
 *   genset.c    the generate models served and lookups over all their contexts
 *   admin.c     the requests answered at once: contexts, status, models
 *   respsave.c  the Responses API's stored responses written to the store
 * Everything runs on the worker thread, except where a field says "under lock".
 */
#ifndef LLMS_SCHED_INTERNAL_H
#define LLMS_SCHED_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "daemon/ctx/ctxmgr.h"
#include "daemon/graph/graphs.h"
#include "daemon/models/genmodel.h"
#include "daemon/rag/kb.h"
#include "daemon/rag/predict.h"
#include "daemon/rag/rag.h"
#include "daemon/sched/sched.h"
#include "daemon/net/reply.h"
#include "daemon/sched/logprobs.h"
#include "daemon/sched/promptcache.h"
#include "daemon/sched/semantic.h"
#include "daemon/sched/speculate.h"
#include "engine/clock.h"
#include "engine/kv/kv.h"
#include "engine/model/grammar.h"
#include "engine/model/jsonmask.h"
#include "engine/model/model.h"
#include "engine/model/sampler.h"
#include "engine/tok/stop.h"
#include "engine/tok/utf8.h"

#define SCHED_STATS 4096      /* steps remembered for the status (the last minute's) */
#define SCHED_GEN_MAX 32      /* generate models served at once (adapter models too) */

typedef struct app_state {
    uint32_t uid;
    char name[SCHED_APP_MAX + 1];
    int n_conns;
    int n_queued;                  /* requests of every kind waiting or running */
    sched_job *pend_head, *pend_tail;
    long deficit[SCHED_GEN_MAX];   /* rows of long work it may still take on each generate
                                      model (round robin per model) */
    struct app_state *next;
} app_state;

/* A Call's, Complete's, RagQuery's or graph generation node's generation. */
typedef struct gen {
    genmodel *gm;          /* the model it runs on */
    ctx_entry *c;          /* NULL for Complete and RagQuery */
    rag_query *rq;         /* RagQuery: its passages, prompt and caches */
    kv_seq own_seq;        /* Complete's KV */
    kv_seq *seq;
    int32_t *hist;         /* (limit or more) what the model sees: the context's window, the
                              turn's tokens, the generated (a slide cuts the middle) */
    int n_hist;
    int n_base;            /* tokens of the context before this call */
    int32_t *turn;         /* (n_turn) the tokens the turn adds */
    int n_turn;
    int32_t *reply;        /* (reply_cap) every generated token, also those a slide
                              took out of hist */
    int reply_cap;
    int limit;             /* most tokens hist may reach */
    int max_gen, n_gen;
    bool window;           /* a full hist slides (the context's overflow is WINDOW) */
    int sink_want;         /* tokens the window's sink should hold (prompt_sink_tokens) */
    int slides;            /* of the window, in this call */
    bool refill;           /* after a slide: the kept tokens are evaluated again (long
                              work) before the next decode row */
    bool switched_in;      /* a Call's chunks are all resident and locked */
    bool prefilled;        /* the prompt is evaluated: one decode row per step */
    bool waited;           /* held back while an earlier prompt of its app that begins
                              the same was evaluated (gen_waits_for_shared_prompt) */
    int n_eval;            /* tokens the prompt evaluation computed */
    int n_cached;          /* a Complete's prompt tokens resumed from the prompt cache */
    const char *user_role;
    char *shown;           /* text released to the client (stop strings held back) */
    size_t shown_len, shown_cap;
    /* A token's text on its way out, sized at gen_new for the vocabulary's longest piece
     * (tok_max_piece_len + 1 = piece_cap), so that no token's text is cut: */
    char *piece;           /* (piece_cap) its bytes */
    char *passed;          /* (STOP_OUT_CAP(piece_cap) + 1) what the stop strings let by */
    char *released;        /* (UTF8_OUT_CAP(STOP_OUT_CAP(piece_cap) + STOP_MAX_LEN) + 1)
                              the whole characters of that, sent to the client */
    size_t piece_cap;
    utf8_stream utf8;      /* a character a token left unfinished waits here */
    sampler *smp;
    int logprobs;          /* alternatives reported beside each token; -1: no logprobs */
    logprob_step *lp;      /* (reply_cap) each reply token's, when logprobs >= 0 */
    logprobs_pb lp_chunk;  /* a streamed chunk's messages, kept between tokens */
    jsonmask_cursor json;  /* JSON mode (FORMAT_JSON_OBJECT, _SCHEMA) when json.vocab is
                              set: the reply so far, which only allowed tokens extend */
    jsonschema *schema;    /* FORMAT_JSON_SCHEMA's, compiled: the cursor follows it */
    grammar *grammar;      /* FORMAT_GRAMMAR's, compiled, else NULL */
    grammar_cursor *gram;  /* the reply so far against grammar, which only allowed tokens
                              extend (with grammar) */
    stop_matcher stop;
    /* Speculative decoding (speculate.h), when spec_rows is not NULL. */
    int32_t *spec_rows;    /* (1 + speculate_max) a step's rows: the last token, drafts */
    unsigned spec_mode;    /* enum spec_source bits */
    int spec_k;            /* drafts it may propose next (adapts to acceptance) */
    int spec_misses;       /* proposals in a row that had none accepted */
    int spec_rest;         /* steps to wait before proposing again */
    int n_draft;           /* drafts in the step being evaluated; 0: a plain row */
    enum spec_source draft_from; /* where the step's drafts came from */
    int draft_want;        /* asks the draft model for this many drafts (0: no) */
    spec_drafter *drafter; /* the draft model, when it drafts for this generation */
    kv_seq draft_seq;      /* its KV: history from draft_base, then fed drafts */
    int draft_base;        /* the history position of its first entry */
    int draft_n;           /* history tokens [draft_base, draft_n) it holds */
    int draft_fed;         /* of the step's drafts, those in its KV (all but the last) */
    int draft_slides;      /* the window's slides its KV was made after */
    bool done;
    Llms__ErrorCode err_code;  /* of a failed step */
    Llms__StopReason reason;
    int64_t t_start, t_first, t_end, t_last_token;
} gen;

/* Speculation counts: of a run, and of the daemon since it started. */
typedef struct spec_stats {
    uint64_t started, hits, rollbacks;
    double saved_ms;       /* how long kept work that had done something (a generation
                              with KV, a retrieval past a sub-stage) ran before its input
                              was final */
} spec_stats;

/* What a graph generation node asks of gen_new; code and err come back on failure. */
typedef struct graph_gen {
    const char *prompt;
    bool chat;
    const Llms__GenerationParams *node_params, *run_params;
    Llms__ErrorCode code;
    char *err;
} graph_gen;

/* One admitted request. */
/* A GraphRun's state (graphrun.c). */
typedef struct graph_work graph_work;

typedef struct work {
    sched_job *job;
    app_state *app;
    int64_t deadline_ns;   /* CLOCK_MONOTONIC; 0: none */
    bool cancelled;        /* Cancel, a closed connection, shutdown */
    bool quiet;            /* nobody to answer: the connection is gone */
    bool answered;         /* a task finished and answered its request */
    bool failed;           /* the engine failed it: answer fail_code, fail_msg */
    Llms__ErrorCode fail_code;
    char fail_msg[ERR_MAX];
    gen *g;                /* Call, Complete, RagQuery, a GraphRun's generation node */
    sem_task *t;           /* Embed, Rerank, RerankCalibrate */
    kb_task *kt;           /* KbAdd, KbDrop */
    graph_work *gw;        /* GraphRun */
    genmodel *gm;          /* the model its forwards run on (tasks: the default's) */
    size_t kv_reserved;    /* KV bytes admission counted for it on gm (admit_kv_need) */
} work;

/* One sequence of a step's forward (sched.c). */
typedef struct step_seq step_seq;

typedef struct step_stat {
    int64_t end_ns;
    double ms;
    int rows;
    double stall_ms;       /* longest gap between two tokens of a stream, this step */
} step_stat;

struct sched {
    sched_env env;
    reply_to to;           /* env's reply queue and largest frame */
    bool serial;           /* sched = serial: one forward per sequence, long work whole */
    /* Every generate model, slot 0 the default (the registry's first generate model:
     * decoder embeddings, RagQuery, GraphRun and prediction run on it), NULL where none;
     * each has its runner, pool, contexts and share of kv_budget_mb. */
    genmodel *gm[SCHED_GEN_MAX];
    /* Each one's prompt cache (promptcache.h), same slot; NULL when prompt_cache_mb is 0
     * or sched is serial (its prompts are not sliced where the cache's entries end). */
    pcache *pcache[SCHED_GEN_MAX];
    pcache_stats pcache_gone; /* the counts of the caches of models unloaded since */
    int max_batch;         /* the largest of their runners' rows: the step arrays' size */
    semantic *sem;         /* Embed, Rerank, RerankCalibrate */
    kbm *kb;               /* knowledge bases */
    rag *rag;              /* RagQuery and its caches */
    graphs_env graphs;     /* apps' workflow graphs */
    predict *predict;      /* idle-time prediction (predict.h) */
    /* The prediction work: one at a time, outside the active set, stepped only while no
     * engine request is queued or running and none came for idle_after_ms. */
    work *pred;
    bool pred_paused;      /* a real request came while it was unfinished */
    /* A job was submitted: an idle-time forward running (prediction, a layer
     * calibration) stops at its next layer (the worker then answers the job, and the
     * forward runs again later). Set by sched_submit, cleared by idle_claim under lock
     * with the queue empty. */
    _Atomic bool idle_preempt;
    /* Jobs that need no forward (Status, cache statistics, a connection's news) stop an
     * idle-time forward too, for their answer's sake, but not twice in a row: a forward
     * that one stopped runs the next time shielded from them (idle_claim), so idle-time
     * work moves on however often a monitor polls. */
    bool idle_shielded;    /* the idle-time forward running stops for engine jobs only
                              (under lock) */
    bool idle_given_up;    /* the last idle-time forward stopped before its end (worker) */
    bool pred_cached;      /* the predicted query just begun had nothing to compute */
    predict_task pred_task;
    sched_job pred_job;    /* its request, built in place (idle.c) */
    Llms__Request pred_req;
    Llms__RagQueryRequest pred_rag;
    Llms__CompleteRequest pred_complete;
    Llms__GenerationParams pred_params;
    int64_t last_req_ns;   /* the last engine request came or ended (CLOCK_MONOTONIC) */
    int32_t *positions;    /* (n_ctx) 0, 1, 2, ... */
    step_seq *steps;       /* (max_batch) */
    kv_seq **step_seqs;    /* (max_batch) */
    model_batch *step_batches; /* (max_batch) */

    pthread_t thread;
    bool started;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    sched_job *in_head, *in_tail; /* under lock */
    bool writes_done;             /* under lock: a background chunk write is done */

    app_state *apps;
    app_state *rr;         /* the app admission starts after */
    app_state *drr_next[SCHED_GEN_MAX]; /* the app each model's long work goes to first */
    work *active[SCHED_MAX_ACTIVE];
    int n_active;
    int n_pending;
    bool shutting;
    int64_t start_ms;
    atomic_uint n_connections;
    atomic_uint n_contexts;

    step_stat stats[SCHED_STATS]; /* ring */
    uint64_t n_steps;
    uint64_t shared_steps; /* of them, run_step_shared's */
    double step_stall_ms;  /* longest token gap seen in the step running */
    spec_stats spec;       /* graph runs' speculation, summed */
    spec_drafter *drafter;   /* draft_model's, NULL when none */
    spec_counts spec_lookup; /* speculative decoding: prompt-lookup drafts */
    spec_counts spec_draft;  /* and the draft model's */
    gen *spec_gens[SCHED_MAX_ACTIVE]; /* a step's decoding generations */
    int spec_gen_tokens[SCHED_MAX_ACTIVE]; /* their replies' tokens before the step */
    spec_gate spec_gate[SCHED_GEN_MAX]; /* whether speculation pays, per generate model */
};

/* Whether a job's KV fits its model's share of the budget now (admit_kv_fit). */
enum admit_kv_fit { ADMIT_KV_FITS, ADMIT_KV_WAIT, ADMIT_KV_NEVER, ADMIT_KV_WAITED };

/* ---- sched.c ---- */

/* Queues a reply for the connection (droppable: a stream's chunk a slow reader may lose). */
void sched_reply(sched *s, uint64_t conn_id, const Llms__Response *r, bool droppable);

/* Answers the job's request with an error, and logs it. */
void sched_reply_error(sched *s, const sched_job *j, Llms__ErrorCode code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Answers the job's request with Ok. */
void sched_reply_ok(sched *s, const sched_job *j);

/* Frees a job and its request (NULL is fine). */
void sched_job_free(sched_job *j);

/* One step of w alone, its own forward: its decode row, or take rows of its long work.
 * With abort (idle-time work) the forward runs on one thread and gives up at that flag:
 * -1, the step's sequences as before; the layers it finished are kept in pause, when
 * given (model.h: the same step next time goes on from there). Else the sequences the
 * step ran (0: none). */
int sched_step_alone(sched *s, work *w, int take, _Atomic bool *abort, model_pause *pause);

/* Room in the step's arrays for rows sequences (a generate model's max_batch). */
int sched_step_room(sched *s, int rows);

/* The swap-out thread's notice that a write is done (ctx_set_write_notify). */
void sched_writes_done(void *arg);

/* ---- admit.c ---- */

/* The record of app (uid, name), made when there is none; NULL when memory runs out. */
app_state *admit_app(sched *s, uint32_t uid, const char *name);

/* Frees an app's record once it has no connection and no request. */
void admit_app_reclaim(sched *s, app_state *a);

/* A job's deadline (CLOCK_MONOTONIC), 0 when it has no timeout. */
int64_t admit_job_deadline(const sched_job *j);

/* Whether a job needs the engine (a request that runs forwards, or shutdown): such a job
 * always stops an idle-time forward (sched_submit); the rest are answered between them. */
bool admit_job_needs_engine(const sched_job *j);

/* One job of the inbox: a request queued (when it uses the engine) or answered, news of
 * a connection, a stored response to write or delete, or shutdown. Frees the job. */
void admit_job(sched *s, sched_job *j);

/* The most KV a Call, Complete, RagQuery or GraphRun on gm may hold, with what a Call's or
 * Complete's logprobs may take (*logprobs, also counted in the result; logprobs may be
 * NULL); 0 for other work. */
size_t admit_kv_need(const sched *s, const genmodel *gm, const sched_job *j, const ctx_entry *c,
                     size_t *logprobs);

/* Whether need bytes of KV fit beside what gm's running work may reach. */
enum admit_kv_fit admit_kv_fit(const sched *s, const genmodel *gm, const sched_job *j,
                               size_t need, int64_t now);

/* Admits pending jobs, one per app in turn, while there is room. */
void admit_pending(sched *s);

/* Ends work that is over and answers queued requests whose deadline passed. */
void admit_reap(sched *s);

/* Frees the queued jobs, unanswered, and the apps' records (sched_free). */
void admit_free(sched *s);

/* ---- respsave.c ---- */

/* Writes (SCHED_RESPONSE_PUT) or deletes (SCHED_RESPONSE_DELETE) j's stored response in
 * the store; a failure is logged. */
void respsave_run(sched *s, const sched_job *j);

/* ---- work.c ---- */

/* Starts an admitted job on gm; NULL when it was answered instead (and freed). */
work *work_start(sched *s, genmodel *gm, sched_job *j, app_state *a, ctx_entry *c);

void work_free(work *w);

/* Marks the work failed; the next reap answers it and ends it. */
void work_fail(work *w, Llms__ErrorCode code, const char *msg);

/* Whether the work is over: finished, failed, cancelled or past its deadline (now). */
bool work_over(const work *w, int64_t now);

/* Ends work that is over: its answer, its place in the app's count; frees it. */
void work_end(sched *s, work *w);

/* Whether the work still has long work rather than at most one decode row per step. */
bool work_is_long(const work *w);

/* Rows of long work the work has left. */
long work_rows_left(const work *w);

/* ---- generate.c ---- */

/* A Call's, Complete's or RagQuery's generation, or with gg a graph node's; NULL after
 * answering the job (gg: with the error in gg). */
gen *gen_new(sched *s, genmodel *gm, const sched_job *j, ctx_entry *c, graph_gen *gg);

void gen_free(gen *g);

/* The end of w's reply: the text the stop strings held back and a character left
 * unfinished (as U+FFFD) are released to the reply and the stream. false when memory
 * ran out for the reply's text: w has failed. */
bool gen_flush(sched *s, work *w);

/* The reply length a generation reads from its n params layers (a Call's: its context's
 * defaults, then the request's; NULL ones skipped): the last that sets max_tokens, else
 * the config's. Admission's KV estimate reads it so too. */
int gen_max_tokens_of_params(const config *cfg, const Llms__GenerationParams *const *layers,
                             int n);

/* The alternatives beside each token that the last of n params layers setting logprobs
 * asks for, -1 when none asks for logprobs (admission reads them so too). */
int gen_logprobs_of_params(const Llms__GenerationParams *const *layers, int n);

/* Whether the generation adds one decode row per step. */
bool gen_decoding(const gen *g);

/* The next token of g from a row of logits: sampler_sample, or in JSON mode among the
 * tokens that keep the reply a prefix of a JSON object (-1 when there is none). */
int32_t gen_sample(gen *g, const float *logits);

/* Takes the token sampled from logits. */
void gen_take_token(sched *s, work *w, const float *logits);

/* The prompt is evaluated (its first token comes next): a Complete's prompt KV goes into
 * the prompt cache as a copy, for the app's prompts that come while the reply runs, when
 * the KV budget has that room free (no context gives a chunk up for it). */
void gen_prompt_evaluated(sched *s, work *w);

/* Whether w, a Complete whose prompt is not evaluated and that holds no KV yet, waits
 * this step for an earlier Complete of its app on its model that is being evaluated and
 * whose prompt shares its start with w's (at least step_tokens tokens, and half of each
 * prompt): that one's KV goes into the prompt cache once evaluated, and w resumes from it
 * (gen_resume_after_wait) rather than evaluating the same rows beside it, as n choices
 * of one prompt, or a burst of requests under one system prompt, would. */
bool gen_waits_for_shared_prompt(const sched *s, work *w);

/* Before w's prompt rows, when it waited: what the prompt cache now holds of its prompt
 * (nothing, when the earlier prompt failed or its copy found no room). */
void gen_resume_after_wait(sched *s, work *w);

/* A token came for g now: the step's longest gap between two tokens of one stream. */
void gen_note_token_time(sched *s, gen *g);

/* Takes a token chosen from logits (n_vocab, the row it was sampled from, whose
 * log-probabilities are reported when asked): appends it (true), unless it ends the
 * generation (end of generation: false, nothing appended); streams the text the stop
 * strings let through and ends the generation at a stop string, a JSON-mode reply's
 * complete object, max_tokens or a full window. false too when memory ran out for the
 * reply's text, or JSON mode does not allow the token (-1: no token was), and w has
 * failed. */
bool gen_push_token(sched *s, work *w, int32_t token, const float *logits);

/* A Call's switch-in; -1 with g->err_code and err on failure. */
int gen_switch_in(gen *g, char err[ERR_MAX]);

/* Ends w's generation when w is over (finished, failed, cancelled, past its deadline,
 * shutdown): persists a Call's turn and answers with the result or why it stopped. The
 * caller frees the work. */
void gen_end(sched *s, work *w);

/* ---- graphrun.c ---- */

/* Opens a GraphRun's graph and starts its run; NULL after answering the job. */
graph_work *graphrun_new(sched *s, const sched_job *j);

void graphrun_free(graph_work *gw);

/* Ends a graph run that is over: its error when unanswered, the log line. */
void graphrun_end(sched *s, work *w);

/* Moves every running graph on as far as it goes without the engine. */
void graphrun_advance_all(sched *s);

/* ---- idle.c ---- */

/* One piece of idle-time work when the daemon is idle: a layer calibration's forward, a
 * slice of a cut-short KbDrop, an IVF training, the hot copies' refresh, else a step of
 * prediction. */
void idle_run(sched *s);

/* An engine request came: the idle period ends, and prediction work pauses until the
 * next one. */
void idle_end(sched *s);

/* Ends the prediction work: kept (complete) or dropped. */
void idle_pred_end(sched *s, bool complete);

/* How long the worker may sleep before idle-time work is due: -1 until a job comes. */
int64_t idle_wait_ns(sched *s);

/* ---- genset.c ---- */

/* The slot of a generate model in s->gm. */
int genset_slot(const sched *s, const genmodel *gm);

/* The running generate model of a registry entry, NULL when it has none. */
genmodel *genset_of_entry(const sched *s, const models_entry *me);

/* The generate model a context belongs to. */
genmodel *genset_of_ctx(const sched *s, const ctx_entry *c);

/* The name of the model a context belongs to. */
const char *genset_ctx_model(const sched *s, const ctx_entry *c);

/* Every context, model by model, each model's oldest first. */
ctx_entry *genset_ctx_first(sched *s);
ctx_entry *genset_ctx_next(sched *s, const ctx_entry *c);

/* The context with this id of app (uid, app), or of any app when app is NULL. */
ctx_entry *genset_ctx_find(sched *s, const char *id, uint32_t uid, const char *app);

int genset_ctx_count_app(const sched *s, uint32_t uid, const char *app);
int genset_ctx_count(const sched *s);

/* Generate models served. */
int genset_count(const sched *s);

/* Serves every generate model of the registry, each with its runner, KV pool, contexts
 * and an equal share of kv_budget_mb (sched_new). */
int genset_start(sched *s, char err[ERR_MAX]);

/* Serves a generate model loaded at run time; its contexts, kept by the default model
 * while it was not loaded, move to it. */
int genset_load(sched *s, models_entry *me, char err[ERR_MAX]);

/* Stops serving a generate model other than the default, when no work runs on it and it
 * has no context; -1 + err naming what holds it. The others share kv_budget_mb again. */
int genset_unload(sched *s, genmodel *gm, char err[ERR_MAX]);

/* ---- admin.c ---- */

/* Answers a request that does not use the engine, or hands it to its module (kb, graphs,
 * the RAG cache). Frees the job. */
void admin_handle(sched *s, sched_job *j);

#endif
