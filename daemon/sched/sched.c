/*
 * sched.c — the worker: job inbox, per-app queues, and the step scheduler that advances
 * every running request together, plus the handlers of every request that touches
 * contexts or the engine.
 *
 * One cycle of the worker: take the inbox's jobs (light requests are answered at once),
 * drop cancelled and expired work, admit queued requests (one per app in turn), then run
 * one step. A step is one model_forward_batch over every sequence that has work: one
 * decode row for each generation past its prompt, plus slices of long work (prompt
 * prefills, Embed texts) shared out between apps by deficit round robin under
 * step_tokens rows; reranks advance on their own model by their share after the
 * forward. So the weights are read once per step for all streams, and a long request
 * delays the others by one slice per step, not by its whole length. Each generate model
 * has its own forward in the step (its runner, pool and contexts: genmodel.h); work on
 * one model never shares a forward with another's.
 */
#include "daemon/sched/sched.h"

#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon/ctx/ctxmgr.h"
#include "daemon/models/genmodel.h"
#include "daemon/graph/graph.h"
#include "daemon/graph/graphs.h"
#include "daemon/rag/kb.h"
#include "daemon/prompt.h"
#include "daemon/rag/predict.h"
#include "daemon/rag/rag.h"
#include "daemon/net/reply.h"
#include "daemon/reqlog.h"
#include "daemon/net/resp.h"
#include "daemon/rag/retrieval.h"
#include "daemon/sched/semantic.h"
#include "daemon/textbuf.h"
#include "daemon/net/tokreq.h"
#include "engine/kv/kv.h"
#include "engine/model/prefill.h"
#include "engine/model/sampler.h"
#include "engine/tok/stop.h"
#include "engine/tok/utf8.h"
#include "storage/kb.h"

#define SCHED_MAX_ACTIVE 64   /* requests running at once: generations and tasks */
#define SCHED_MIN_QUANTUM 16  /* fewest rows of long work an app is offered per round */
#define SCHED_LIST_PAGE 256   /* contexts per ListContexts reply at most */
#define SCHED_STATS 4096      /* steps remembered for the status (the last minute's) */
#define SCHED_STATS_NS 60000000000LL
#define PIECE_MAX 256
#define SCHED_TEMPLATE_TOKENS 64 /* tokens a chat template adds around a turn, at most */
#define SCHED_RETRIEVAL_MIN_NS 1000000 /* graph retrieval sub-stages per cycle, at least */
#define SCHED_GEN_MAX 8       /* generate models served at once */

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
    int n_eval;            /* tokens the prompt evaluation computed */
    const char *user_role;
    char *shown;           /* text released to the client (stop strings held back) */
    size_t shown_len, shown_cap;
    utf8_stream utf8;      /* a character a token left unfinished waits here */
    sampler *smp;
    stop_matcher stop;
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

/* A GraphRun: its graph, the run's state, and the ready node's work (a generation in
 * work.g or a retrieval here).
 * Speculation (at most one at a time): while the ready node is a retrieval, work.g may
 * be the generation of spec_node started on the retrieval's estimate; while the ready
 * node is a generation, spec_rt may be the retrieval of spec_node started on its first
 * graph_spec_tokens tokens (spec_kb and spec_query: what it was rendered with). When
 * the generation ends with another query, spec_rt's result becomes the real retrieval's
 * estimate (spec_seeded) and the speculation, with the generation started on that
 * estimate, stands or falls with it when the retrieval ends. */
typedef struct graph_work {
    graph *gph;
    graph_run *run;
    retrieval *rt;
    int node;              /* the node being run, -1 between nodes */
    int64_t t_start, node_t0;
    double *node_ms;       /* (nodes) over all runs of each */
    uint32_t *node_tokens; /* (nodes) generated */
    char *err;             /* (ERR_MAX) a node's failure, named */
    bool speculate;
    bool spec_tried;       /* the ready node's run has had its speculation */
    int spec_node;         /* -1: no speculation in flight */
    bool spec_seeded;      /* the ready retrieval's estimate is spec_rt's (pending) */
    int64_t spec_t0;
    retrieval *spec_rt;
    int spec_rt_stages;    /* sub-stages spec_rt has run */
    char *spec_kb, *spec_query;
    spec_stats spec;
    kb_hints hints;        /* the IVF lists of its last retrieval's candidates */
    kv_seq kept;           /* the KV of its last generation node (graph_reuse_kv): the
                              next one starts from the part its prompt begins with */
    long prompt_tokens;    /* of its generation nodes */
    long reused_tokens;    /* of those, taken from kept */
} graph_work;

/* What a graph generation node asks of gen_new; code and err come back on failure. */
typedef struct graph_gen {
    const char *prompt;
    bool chat;
    const Llms__GenerationParams *node_params, *run_params;
    Llms__ErrorCode code;
    char *err;
} graph_gen;

/* One admitted request. */
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
    size_t kv_reserved;    /* KV bytes admission counted for it on gm (kv_need) */
} work;

/* One sequence of a step's forward. */
typedef struct step_seq {
    work *w;
    kv_seq *seq;
    model_batch b;
    int from;              /* entries of the sequence before the step */
    int32_t last_row;      /* out row of a generation's batch */
    bool failed;
} step_seq;

typedef struct step_stat {
    int64_t end_ns;
    double ms;
    int rows;
    double stall_ms;       /* longest gap between two tokens of a stream, this step */
} step_stat;

struct sched {
    sched_env env;
    bool serial;           /* sched = serial: one forward per sequence, long work whole */
    /* Every generate model, slot 0 the default (the registry's first generate model:
     * decoder embeddings, RagQuery, GraphRun and prediction run on it), NULL where none;
     * each has its runner, pool, contexts and share of kv_budget_mb. */
    genmodel *gm[SCHED_GEN_MAX];
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
    bool pred_cached;      /* the predicted query just begun had nothing to compute */
    predict_task pred_task;
    sched_job pred_job;    /* its request, built here (pred_start) */
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
    double step_stall_ms;  /* longest token gap seen in the step running */
    spec_stats spec;       /* graph runs' speculation, summed */
};

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- replies ---- */

static void send_resp(sched *s, uint64_t conn_id, const Llms__Response *r, bool droppable)
{
    reply_send(s->env.out, s->env.cfg->max_frame_bytes, conn_id, r, droppable);
}

static void send_error(sched *s, const sched_job *j, Llms__ErrorCode code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void send_error(sched *s, const sched_job *j, Llms__ErrorCode code, const char *fmt, ...)
{
    uint8_t *buf;
    size_t len;
    va_list ap;
    char msg[ERR_MAX + 128];
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    reqlog_request(j->uid, j->app, j->req->body_case, -1,
                   (double)(mono_ns() - j->queued_ns) / 1e6, code, msg);
    if (resp_error(j->req->id, code, s->env.cfg->max_frame_bytes, &buf, &len, "%s", msg) == 0)
        outq_push(s->env.out, j->conn_id, buf, len, false);
}

static void send_ok(sched *s, const sched_job *j)
{
    Llms__Empty e = LLMS__EMPTY__INIT;
    Llms__Response r = LLMS__RESPONSE__INIT;
    r.id = j->req->id;
    r.final = 1;
    r.body_case = LLMS__RESPONSE__BODY_OK;
    r.ok = &e;
    send_resp(s, j->conn_id, &r, false);
}

static void job_free(sched_job *j)
{
    if (j) {
        if (j->req)
            llms__request__free_unpacked(j->req, NULL);
        free(j);
    }
}

/* ---- apps ---- */

static app_state *app_get(sched *s, uint32_t uid, const char *name)
{
    for (app_state *a = s->apps; a; a = a->next)
        if (a->uid == uid && strcmp(a->name, name) == 0)
            return a;
    app_state *a = calloc(1, sizeof *a);
    if (!a)
        return NULL;
    a->uid = uid;
    snprintf(a->name, sizeof a->name, "%s", name);
    a->next = s->apps;
    s->apps = a;
    return a;
}

/* Frees the record of an app that has no connection and no request left, so that
 * binding many names leaves nothing behind; its contexts do not need it (ListApps
 * lists apps with contexts from the contexts). Never called while a loop walks apps. */
static void app_reclaim(sched *s, app_state *a)
{
    if (a->n_conns > 0 || a->n_queued > 0 || a->pend_head)
        return;
    app_state **pp = &s->apps;
    while (*pp != a)
        pp = &(*pp)->next;
    *pp = a->next;
    if (s->rr == a)
        s->rr = NULL;
    for (int k = 0; k < SCHED_GEN_MAX; k++)
        if (s->drr_next[k] == a)
            s->drr_next[k] = NULL;
    free(a);
}

/* Requests queued or running of every app of uid. */
static int uid_queued(const sched *s, uint32_t uid)
{
    int n = 0;
    for (const app_state *a = s->apps; a; a = a->next)
        n += a->uid == uid ? a->n_queued : 0;
    return n;
}

/* ---- generate models and their contexts ---- */

/* The slot of the generate model whose contexts cm holds. */
static int gm_slot_of_cm(const sched *s, const ctxmgr *cm)
{
    for (int k = 0; k < SCHED_GEN_MAX; k++)
        if (s->gm[k] && s->gm[k]->cm == cm)
            return k;
    return -1;
}

static int gm_slot(const sched *s, const genmodel *gm)
{
    return gm_slot_of_cm(s, gm->cm);
}

/* The running generate model of a registry entry, NULL when it has none. */
static genmodel *gm_of_entry(const sched *s, const models_entry *me)
{
    for (int k = 0; k < SCHED_GEN_MAX; k++)
        if (s->gm[k] && s->gm[k]->me == me)
            return s->gm[k];
    return NULL;
}

static genmodel *gm_of_ctx(const sched *s, const ctx_entry *c)
{
    return s->gm[gm_slot_of_cm(s, c->cm)];
}

/* The model a context belongs to (one from before the registry: the default's). */
static const char *ctx_model_name(const sched *s, const ctx_entry *c)
{
    return c->model ? c->model : s->gm[0]->me->name;
}

/* Whether a stored context naming model belongs to the generate model me: its own, and
 * for the default also those of no model or of a model that is not loaded (their
 * history is kept and listed; calls on them are refused). */
static bool ctx_belongs(const sched *s, const models_entry *me, const char *model)
{
    if (model && strcmp(model, me->name) == 0)
        return true;
    if (me != models_generate(s->env.reg))
        return false;
    models_entry *has;
    char ignored[ERR_MAX];
    return !model ||
           models_resolve(s->env.reg, model, MODELS_GENERATE, &has, ignored) != LLMS__ERROR_CODE__OK;
}

typedef struct ctx_owner {
    const sched *s;
    const models_entry *me;
} ctx_owner;

static bool ctx_owner_owns(const char *model, void *arg)
{
    const ctx_owner *o = arg;
    return ctx_belongs(o->s, o->me, model);
}

/* Every context, model by model (slot order), each model's oldest first. */
static ctx_entry *ctx_all_from(sched *s, int slot)
{
    for (int k = slot; k < SCHED_GEN_MAX; k++)
        if (s->gm[k] && ctx_first(s->gm[k]->cm))
            return ctx_first(s->gm[k]->cm);
    return NULL;
}

static ctx_entry *ctx_all_first(sched *s)
{
    return ctx_all_from(s, 0);
}

static ctx_entry *ctx_all_next(sched *s, const ctx_entry *c)
{
    return c->next ? c->next : ctx_all_from(s, gm_slot_of_cm(s, c->cm) + 1);
}

/* The context with this id of app (uid, app), or of any app when app is NULL. */
static ctx_entry *ctx_find_all(sched *s, const char *id, uint32_t uid, const char *app)
{
    for (int k = 0; k < SCHED_GEN_MAX; k++) {
        ctx_entry *c = !s->gm[k] ? NULL
                       : app     ? ctx_find(s->gm[k]->cm, id, uid, app)
                                 : ctx_find_any(s->gm[k]->cm, id);
        if (c)
            return c;
    }
    return NULL;
}

static int ctx_count_all_app(const sched *s, uint32_t uid, const char *app)
{
    int n = 0;
    for (int k = 0; k < SCHED_GEN_MAX; k++)
        n += s->gm[k] ? ctx_count_app(s->gm[k]->cm, uid, app) : 0;
    return n;
}

static int ctx_count_all(const sched *s)
{
    int n = 0;
    for (int k = 0; k < SCHED_GEN_MAX; k++)
        n += s->gm[k] ? ctx_count(s->gm[k]->cm) : 0;
    return n;
}

/* ---- context info ---- */

static const char *history_role(const char *role)
{
    return strcmp(role, "raw") == 0 ? "user" : role;
}

/* Fills info from c; history (n_msgs + 1 messages) and hmsgs are caller storage. */
static void fill_info(sched *s, const ctx_entry *c, bool admin, bool history,
                      Llms__ContextInfo *info, Llms__Message **hist, Llms__Message *hmsgs)
{
    llms__context_info__init(info);
    info->context_id = (char *)c->id;
    if (admin) {
        info->app_name = c->app_name;
        info->has_uid = 1;
        info->uid = c->uid;
    }
    info->n_tokens = (uint32_t)c->n_tokens;
    info->created_unix_ms = (uint64_t)c->created_ms;
    info->last_used_unix_ms = (uint64_t)c->last_used_ms;
    info->memory = ctx_kv_bytes(c->cm, c) > 0 ? LLMS__MEMORY_STATE__MEMORY_RESIDENT
                   : ctx_on_disk(c)           ? LLMS__MEMORY_STATE__MEMORY_ON_DISK
                                              : LLMS__MEMORY_STATE__MEMORY_NONE;
    info->system_prompt = c->system_prompt;
    info->defaults = c->defaults;
    info->has_kv_bytes = 1;
    info->kv_bytes = ctx_kv_bytes(c->cm, c);
    info->has_overflow = info->has_window_slides = info->has_window_dropped_tokens = 1;
    info->overflow = c->overflow == CTX_OVERFLOW_REFUSE ? LLMS__OVERFLOW__OVERFLOW_REFUSE
                                                        : LLMS__OVERFLOW__OVERFLOW_WINDOW;
    info->window_slides = c->window_slides;
    info->window_dropped_tokens = (uint64_t)c->window_dropped;
    info->model = (char *)ctx_model_name(s, c);
    if (history) {
        size_t n = 0;
        if (c->system_prompt) {
            llms__message__init(&hmsgs[n]);
            hmsgs[n].role = "system";
            hmsgs[n].content = c->system_prompt;
            hist[n] = &hmsgs[n];
            n++;
        }
        for (int i = 0; i < c->n_msgs; i++, n++) {
            llms__message__init(&hmsgs[n]);
            hmsgs[n].role = (char *)history_role(c->msgs[i].role);
            hmsgs[n].content = c->msgs[i].text;
            hist[n] = &hmsgs[n];
        }
        info->n_history = n;
        info->history = hist;
    }
}

/* One page of the app's contexts (of all contexts with all), oldest first. */
static void send_contexts(sched *s, const sched_job *j, bool all)
{
    const Llms__ListContextsRequest *q =
        all ? j->req->list_all_contexts : j->req->list_contexts;
    uint32_t offset = q && q->has_offset ? q->offset : 0;
    uint32_t limit = q && q->has_limit && q->limit ? q->limit : SCHED_LIST_PAGE;
    if (limit > SCHED_LIST_PAGE)
        limit = SCHED_LIST_PAGE;
    uint32_t total = 0;
    for (ctx_entry *c = ctx_all_first(s); c; c = ctx_all_next(s, c))
        total += all || (c->uid == j->uid && strcmp(c->app_name, j->app) == 0);
    uint32_t n = offset < total ? total - offset : 0;
    if (n > limit)
        n = limit;
    Llms__ContextInfo *infos = calloc((size_t)n + 1, sizeof *infos);
    Llms__ContextInfo **ptrs = calloc((size_t)n + 1, sizeof *ptrs);
    if (!infos || !ptrs) {
        free(infos);
        free(ptrs);
        send_error(s, j, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        return;
    }
    uint32_t k = 0, seen = 0;
    for (ctx_entry *c = ctx_all_first(s); c && k < n; c = ctx_all_next(s, c)) {
        if (!all && (c->uid != j->uid || strcmp(c->app_name, j->app) != 0))
            continue;
        if (seen++ < offset)
            continue;
        fill_info(s, c, all, false, &infos[k], NULL, NULL);
        ptrs[k] = &infos[k];
        k++;
    }
    Llms__ListContextsResponse lr = LLMS__LIST_CONTEXTS_RESPONSE__INIT;
    lr.n_contexts = (size_t)k;
    lr.contexts = ptrs;
    lr.has_total = 1;
    lr.total = total;
    Llms__Response r = LLMS__RESPONSE__INIT;
    r.id = j->req->id;
    r.final = 1;
    r.body_case = LLMS__RESPONSE__BODY_CONTEXTS;
    r.contexts = &lr;
    send_resp(s, j->conn_id, &r, false);
    free(infos);
    free(ptrs);
}

static void handle_get_context(sched *s, const sched_job *j)
{
    Llms__GetContextRequest *g = j->req->get_context;
    bool any = g->has_any_app && g->any_app;
    if (any && !j->admin) {
        send_error(s, j, LLMS__ERROR_CODE__PERMISSION_DENIED, "any_app is an admin option");
        return;
    }
    ctx_entry *c = ctx_find_all(s, g->context_id, j->uid, any ? NULL : j->app);
    if (!c) {
        send_error(s, j, LLMS__ERROR_CODE__NOT_FOUND, "no context '%s'", g->context_id);
        return;
    }
    bool history = g->has_include_history && g->include_history;
    Llms__Message **hist = NULL;
    Llms__Message *hmsgs = NULL;
    if (history) {
        hist = calloc((size_t)c->n_msgs + 1, sizeof *hist);
        hmsgs = calloc((size_t)c->n_msgs + 1, sizeof *hmsgs);
        if (!hist || !hmsgs) {
            free(hist);
            free(hmsgs);
            send_error(s, j, LLMS__ERROR_CODE__INTERNAL, "out of memory");
            return;
        }
    }
    Llms__ContextInfo info;
    fill_info(s, c, any, history, &info, hist, hmsgs);
    Llms__ChunkInfo *chunks = calloc((size_t)c->n_map + 1, sizeof *chunks);
    Llms__ChunkInfo **cptrs = calloc((size_t)c->n_map + 1, sizeof *cptrs);
    if (chunks && cptrs) {
        for (int i = 0; i < c->n_map; i++) {
            const kv_chunk *k = c->seq.chunks[i];
            llms__chunk_info__init(&chunks[i]);
            chunks[i].index = (uint32_t)i;
            chunks[i].n_tokens = (uint32_t)ctx_chunk_n_tokens(c, i);
            chunks[i].resident = k != NULL;
            chunks[i].on_disk = c->map[i].disk_precision >= 0;
            chunks[i].bits = (uint32_t)ctx_chunk_bits(c, i);
            chunks[i].density = c->map[i].density;
            cptrs[i] = &chunks[i];
        }
        info.n_chunks = (size_t)c->n_map;
        info.chunks = cptrs;
    }
    Llms__Response r = LLMS__RESPONSE__INIT;
    r.id = j->req->id;
    r.final = 1;
    r.body_case = LLMS__RESPONSE__BODY_CONTEXT;
    r.context = &info;
    send_resp(s, j->conn_id, &r, false);
    free(hist);
    free(hmsgs);
    free(chunks);
    free(cptrs);
}

/* ---- simple requests ---- */

static void handle_create(sched *s, const sched_job *j)
{
    Llms__CreateContextRequest *cr = j->req->create_context;
    int have = ctx_count_all_app(s, j->uid, j->app);
    if (have >= s->env.cfg->max_contexts_per_app) {
        send_error(s, j, LLMS__ERROR_CODE__RESOURCE_EXHAUSTED,
                   "app has %d contexts, the limit (max_contexts_per_app)", have);
        return;
    }
    int of_uid = 0;
    for (const ctx_entry *c = ctx_all_first(s); c; c = ctx_all_next(s, c))
        of_uid += c->uid == j->uid;
    if (of_uid >= s->env.cfg->max_contexts_per_uid) {
        send_error(s, j, LLMS__ERROR_CODE__RESOURCE_EXHAUSTED,
                   "uid %u has %d contexts over all its apps, the limit (max_contexts_per_uid)",
                   j->uid, of_uid);
        return;
    }
    if (cr->defaults && cr->defaults->n_stop >= STOP_MAX) {
        send_error(s, j, LLMS__ERROR_CODE__INVALID_ARGUMENT, "at most %d stop strings",
                   STOP_MAX - 1);
        return;
    }
    if (cr->has_overflow && cr->overflow != LLMS__OVERFLOW__OVERFLOW_DEFAULT &&
        cr->overflow != LLMS__OVERFLOW__OVERFLOW_WINDOW &&
        cr->overflow != LLMS__OVERFLOW__OVERFLOW_REFUSE) {
        send_error(s, j, LLMS__ERROR_CODE__INVALID_ARGUMENT, "overflow %d is neither window "
                   "nor refuse", (int)cr->overflow);
        return;
    }
    bool refuse = cr->has_overflow && cr->overflow != LLMS__OVERFLOW__OVERFLOW_DEFAULT
                      ? cr->overflow == LLMS__OVERFLOW__OVERFLOW_REFUSE
                      : strcmp(s->env.cfg->overflow, "refuse") == 0;
    char err[ERR_MAX], ignored[ERR_MAX];
    models_entry *me;
    Llms__ErrorCode code = models_resolve(s->env.reg, cr->model, MODELS_GENERATE, &me, err);
    if (code != LLMS__ERROR_CODE__OK) {
        send_error(s, j, code, "%s", err);
        return;
    }
    ctxmgr *cm = gm_of_entry(s, me)->cm;
    ctx_entry *c;
    if (ctx_create(cm, j->uid, j->app, cr->system_prompt, cr->defaults, wall_ms(), &c, err)) {
        send_error(s, j, LLMS__ERROR_CODE__INTERNAL, "create context: %s", err);
        return;
    }
    if (ctx_set_model(cm, c, me->name, err) ||
        (refuse && ctx_set_overflow(cm, c, CTX_OVERFLOW_REFUSE, err))) {
        ctx_delete(cm, c, ignored);
        send_error(s, j, LLMS__ERROR_CODE__INTERNAL, "create context: %s", err);
        return;
    }
    atomic_store(&s->n_contexts, (unsigned)ctx_count_all(s));
    Llms__CreateContextResponse cc = LLMS__CREATE_CONTEXT_RESPONSE__INIT;
    cc.context_id = c->id;
    Llms__Response r = LLMS__RESPONSE__INIT;
    r.id = j->req->id;
    r.final = 1;
    r.body_case = LLMS__RESPONSE__BODY_CREATE_CONTEXT;
    r.create_context = &cc;
    send_resp(s, j->conn_id, &r, false);
}

static void handle_delete(sched *s, const sched_job *j)
{
    const char *id = j->req->delete_context->context_id;
    ctx_entry *c = ctx_find_all(s, id, j->uid, j->app);
    char err[ERR_MAX];
    if (!c)
        send_error(s, j, LLMS__ERROR_CODE__NOT_FOUND, "no context '%s'", id);
    else if (c->busy)
        send_error(s, j, LLMS__ERROR_CODE__FAILED_PRECONDITION, "context '%s' has a call running", id);
    else if (ctx_delete(c->cm, c, err))
        send_error(s, j, LLMS__ERROR_CODE__INTERNAL, "delete context: %s", err);
    else {
        atomic_store(&s->n_contexts, (unsigned)ctx_count_all(s));
        send_ok(s, j);
    }
}

static void handle_evict(sched *s, const sched_job *j)
{
    const char *id = j->req->evict_context->context_id;
    ctx_entry *c = ctx_find_all(s, id, 0, NULL);
    if (!c)
        send_error(s, j, LLMS__ERROR_CODE__NOT_FOUND, "no context '%s'", id);
    else if (c->busy)
        send_error(s, j, LLMS__ERROR_CODE__FAILED_PRECONDITION, "context '%s' has a call running", id);
    else {
        ctx_evict(c->cm, c);
        send_ok(s, j);
    }
}

static uint64_t rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long size, resident = 0;
    if (f) {
        if (fscanf(f, "%lu %lu", &size, &resident) != 2)
            resident = 0;
        fclose(f);
    }
    return (uint64_t)resident * (uint64_t)sysconf(_SC_PAGESIZE);
}

/* The scheduler's part of the status: what runs and waits, and the last minute's steps. */
static void sched_status(sched *s, Llms__StatusResponse *st)
{
    st->sched_mode = s->serial ? "serial" : "batched";
    st->sched_step_tokens = (uint32_t)s->gm[0]->step_tokens;
    st->has_sched_step_tokens = st->has_sched_active_sequences = 1;
    st->has_sched_queued_generate = st->has_sched_queued_embed = st->has_sched_queued_rerank = 1;
    st->has_sched_steps = st->has_sched_step_mean_ms = st->has_sched_rows_per_step = 1;
    st->has_sched_longest_stall_ms = 1;
    for (int i = 0; i < s->n_active; i++)
        st->sched_active_sequences += s->active[i]->g != NULL;
    for (app_state *a = s->apps; a; a = a->next)
        for (sched_job *j = a->pend_head; j; j = j->next)
            switch (j->req->body_case) {
            case LLMS__REQUEST__BODY_EMBED:
                st->sched_queued_embed++;
                break;
            case LLMS__REQUEST__BODY_RERANK:
            case LLMS__REQUEST__BODY_RERANK_CALIBRATE:
                st->sched_queued_rerank++;
                break;
            default:
                st->sched_queued_generate++;
                break;
            }
    st->sched_steps = s->n_steps;
    int64_t since = mono_ns() - SCHED_STATS_NS;
    double ms = 0, rows = 0, stall = 0;
    int n = 0;
    for (uint64_t k = 0; k < s->n_steps && k < SCHED_STATS; k++) {
        const step_stat *x = &s->stats[(s->n_steps - 1 - k) % SCHED_STATS];
        if (x->end_ns < since)
            break;
        ms += x->ms;
        rows += x->rows;
        stall = x->stall_ms > stall ? x->stall_ms : stall;
        n++;
    }
    st->sched_step_mean_ms = n ? ms / n : 0;
    st->sched_rows_per_step = n ? rows / n : 0;
    st->sched_longest_stall_ms = stall;
    st->has_graph_speculations = st->has_graph_spec_hits = st->has_graph_spec_rollbacks = 1;
    st->has_graph_spec_saved_ms = 1;
    st->graph_speculations = s->spec.started;
    st->graph_spec_hits = s->spec.hits;
    st->graph_spec_rollbacks = s->spec.rollbacks;
    st->graph_spec_saved_ms = s->spec.saved_ms;
}

/* The cost models and their record (proto CostModels). */
static void cost_models_fill(const ctxmgr *cm, Llms__CostModels *m)
{
    ctx_cost_report r;
    ctx_get_cost_report(cm, &r);
    llms__cost_models__init(m);
    m->rec_a = r.fit.rec_a;
    m->rec_b = r.fit.rec_b;
    m->rec_c = r.fit.rec_c;
    m->io_d = r.fit.io_d;
    m->io_e = r.fit.io_e;
    m->warm_d = r.fit.warm_d;
    m->warm_e = r.fit.warm_e;
    m->has_io_f = m->has_warm_f = 1;
    m->io_f = r.fit.io_f;
    m->warm_f = r.fit.warm_f;
    m->rec_resid = r.fit.rec_resid;
    m->io_resid = r.fit.io_resid;
    m->warm_resid = r.fit.warm_resid;
    m->samples = (uint32_t)r.fit.samples;
    m->has_rec_fix = m->has_cold_fix = m->has_warm_fix = m->has_rec_contention =
        m->has_read_contention = m->has_observed = 1;
    m->rec_fix = r.rec_fix;
    m->cold_fix = r.cold_fix;
    m->warm_fix = r.warm_fix;
    m->rec_contention = r.rec_contention;
    m->read_contention = r.read_contention;
    m->observed = r.observed;
    m->has_rec_ratio_median = m->has_rec_ratio_last = m->has_read_ratio_median =
        m->has_read_ratio_last = m->has_total_ratio_median = m->has_total_ratio_last = 1;
    m->rec_ratio_median = r.rec_median;
    m->rec_ratio_last = r.rec_last;
    m->read_ratio_median = r.read_median;
    m->read_ratio_last = r.read_last;
    m->total_ratio_median = r.total_median;
    m->total_ratio_last = r.total_last;
}

/* The registry as ModelInfo messages; the strings point into the registry. */
typedef struct model_infos {
    size_t n;
    Llms__ModelInfo *infos;
    Llms__ModelInfo **ptrs;
    char **strs;      /* (n * 6) role and default-role names of each */
} model_infos;

static void model_infos_free(model_infos *mi)
{
    free(mi->infos);
    free(mi->ptrs);
    free(mi->strs);
}

static int model_infos_fill(sched *s, model_infos *mi)
{
    models *reg = s->env.reg;
    memset(mi, 0, sizeof *mi);
    for (const models_entry *e = models_first(reg); e; e = e->next)
        mi->n++;
    mi->infos = calloc(mi->n, sizeof *mi->infos);
    mi->ptrs = calloc(mi->n, sizeof *mi->ptrs);
    mi->strs = calloc(mi->n * 6, sizeof *mi->strs);
    if (!mi->infos || !mi->ptrs || !mi->strs) {
        model_infos_free(mi);
        return -1;
    }
    size_t k = 0;
    for (models_entry *e = (models_entry *)models_first(reg); e; e = e->next, k++) {
        Llms__ModelInfo *x = &mi->infos[k];
        llms__model_info__init(x);
        x->name = e->name;
        x->path = e->path;
        x->arch = e->arch;
        x->type = (char *)models_type_name(e->type);
        x->file_bytes = e->file_bytes;
        x->roles = mi->strs + 6 * k;
        x->default_for = mi->strs + 6 * k + 3;
        for (unsigned bit = MODELS_GENERATE; bit <= MODELS_RERANK; bit <<= 1) {
            models_entry *has;
            char ignored[ERR_MAX];
            const char *role = models_role_name(bit);
            if (models_resolve(reg, e->name, bit, &has, ignored) == LLMS__ERROR_CODE__OK)
                x->roles[x->n_roles++] = (char *)role;
            if (models_is_default(reg, e, bit))
                x->default_for[x->n_default_for++] = (char *)role;
        }
        x->resident_bytes = models_resident_bytes(e);
        x->scratch_bytes = models_scratch_bytes(e);
        const genmodel *gm = gm_of_entry(s, e);
        x->running = (uint32_t)e->running;
        if (gm) {
            x->scratch_bytes += model_runner_scratch_bytes(gm->runner);
            for (int i = 0; i < s->n_active; i++)
                x->running += s->active[i]->gm == gm && s->active[i]->g;
            x->has_contexts = x->has_kv_bytes = x->has_kv_budget_bytes = 1;
            x->contexts = (uint32_t)ctx_count(gm->cm);
            x->kv_bytes = ctx_kv_bytes_total(gm->cm);
            x->kv_budget_bytes = ctx_get_policy(gm->cm)->budget_bytes;
        }
        mi->ptrs[k] = x;
    }
    return 0;
}

/* The memory side of the status, every generate model's together: contexts, resident
 * KV, the pools, the swap counters. */
static void status_memory(sched *s, Llms__StatusResponse *st)
{
    st->has_kv_budget_bytes = st->has_swap_bytes_written = st->has_swap_bytes_read = 1;
    st->has_swap_chunks_written = st->has_swap_chunks_read = st->has_swap_chunks_recomputed = 1;
    st->has_swap_faults = st->has_swap_bad_blobs = st->has_switch_ins = 1;
    st->has_switch_in_mean_ms = st->has_swap_chunks_promoted = st->has_swap_stale_blobs = 1;
    st->has_kv_f16_bytes = st->has_kv_int8_bytes = st->has_kv_int4_bytes =
        st->has_kv_int2_bytes = st->has_kv_spare_bytes = 1;
    st->has_window_slides = st->has_window_dropped_tokens = 1;
    st->has_kv_calibrated_models = st->has_kv_calib_forwards_left = st->has_kv_calibrations = 1;
    const kb_ivf_stats *ks = kb_get_ivf_stats(s->kb);
    st->has_kb_ivf_searches = st->has_kb_ivf_hinted_searches = st->has_kb_ivf_lists_scanned =
        st->has_kb_ivf_lists_skipped = st->has_kb_ivf_hot_bytes = st->has_kb_ivf_trained =
            st->has_kb_ivf_train_pending = 1;
    st->kb_ivf_trained = ks->trained;
    st->kb_ivf_train_pending = kb_ivf_train_pending(s->kb);
    st->kb_ivf_searches = ks->searches;
    st->kb_ivf_hinted_searches = ks->hinted;
    st->kb_ivf_lists_scanned = ks->lists_scanned;
    st->kb_ivf_lists_skipped = ks->lists_skipped;
    st->kb_ivf_hot_bytes = ks->hot_bytes;
    st->has_qkv_verify_misses = 1;
    int64_t kb_pass, kb_text, kb_disk;
    char kb_err[ERR_MAX];
    if (store_kb_disk(s->env.st, &kb_pass, &kb_text, &kb_disk, kb_err) == 0) {
        st->has_kb_passages = st->has_kb_text_bytes = st->has_kb_disk_bytes = 1;
        st->kb_passages = (uint64_t)kb_pass;
        st->kb_text_bytes = (uint64_t)kb_text;
        st->kb_disk_bytes = (uint64_t)kb_disk;
    }
    st->qkv_verify_misses = rag_verify_misses(s->rag);
    st->has_swap_writes_pending = st->has_swap_write_waits = st->has_swap_write_wait_ms =
        st->has_swap_write_failures = 1;
    double switch_in_ms = 0;
    for (int k = 0; k < SCHED_GEN_MAX; k++) {
        const genmodel *gm = s->gm[k];
        if (!gm)
            continue;
        st->n_contexts += (uint32_t)ctx_count(gm->cm);
        st->n_resident_contexts += (uint32_t)ctx_count_resident(gm->cm);
        st->kv_bytes_resident += ctx_kv_bytes_total(gm->cm);
        st->kv_budget_bytes += ctx_get_policy(gm->cm)->budget_bytes;
        const ctx_stats *cs = ctx_get_stats(gm->cm);
        st->swap_bytes_written += cs->bytes_written;
        st->swap_bytes_read += cs->bytes_read;
        st->swap_chunks_written += cs->chunks_written;
        st->swap_chunks_read += cs->chunks_read;
        st->swap_chunks_recomputed += cs->chunks_recomputed;
        st->swap_chunks_promoted += cs->chunks_promoted;
        st->swap_faults += cs->faults;
        st->swap_bad_blobs += cs->bad_blobs;
        st->swap_stale_blobs += cs->stale_blobs;
        st->switch_ins += cs->switch_ins;
        switch_in_ms += cs->switch_in_ms;
        st->window_slides += cs->window_slides;
        st->kv_calibrated_models += ctx_layers_calibrated(gm->cm);
        st->kv_calib_forwards_left += (uint32_t)ctx_calib_forwards_left(gm->cm);
        st->kv_calibrations += cs->calibrations;
        st->window_dropped_tokens += cs->window_dropped;
        st->swap_writes_pending += (uint32_t)ctx_writes_pending(gm->cm);
        st->swap_write_waits += cs->write_waits;
        st->swap_write_wait_ms += cs->write_wait_ms;
        st->swap_write_failures += cs->write_failures;
        st->kv_f16_bytes += kv_pool_bytes_at(gm->pool, KV_F16);
        for (int p = KV_INT_FIRST; p < KV_PRECISION_END; p++) {
            int bits = kv_precision_bits(p);
            uint64_t *to = bits >= 6   ? &st->kv_int8_bytes
                           : bits >= 3 ? &st->kv_int4_bytes
                                       : &st->kv_int2_bytes;
            *to += kv_pool_bytes_at(gm->pool, p);
        }
        st->kv_spare_bytes += kv_pool_spare_bytes(gm->pool);
    }
    st->switch_in_mean_ms = st->switch_ins ? switch_in_ms / (double)st->switch_ins : 0;
}

static void handle_status(sched *s, const sched_job *j)
{
    static const char *arch[] = {"llama", "qwen2", "qwen3"};
    const model_hparams *hp = model_hparams_of(s->env.m);
    Llms__StatusResponse st = LLMS__STATUS_RESPONSE__INIT;
    st.version = LLMS_VERSION;
    st.model_path = models_generate(s->env.reg)->path;
    st.model_arch = (char *)arch[hp->arch];
    const gguf_file *gf = model_gguf(s->env.m);
    for (int64_t i = 0; i < gguf_n_tensors(gf); i++)
        st.model_bytes += gguf_tensor_at(gf, i)->bytes;
    st.n_ctx = (uint32_t)s->env.cfg->n_ctx;
    st.threads = (uint32_t)model_runner_n_threads(s->gm[0]->runner);
    st.uptime_ms = (uint64_t)(wall_ms() - s->start_ms);
    st.n_connections = atomic_load(&s->n_connections);
    for (app_state *a = s->apps; a; a = a->next)
        st.n_apps++;
    st.queued_requests = (uint32_t)s->n_pending;
    st.running_requests = (uint32_t)s->n_active;
    st.rss_bytes = rss_bytes();
    status_memory(s, &st);
    sched_status(s, &st);
    Llms__CostModels cost;
    cost_models_fill(s->gm[0]->cm, &cost);
    st.cost_models = &cost;
    model_infos mi;
    if (model_infos_fill(s, &mi) < 0) {
        send_error(s, j, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        return;
    }
    st.n_models = mi.n;
    st.models = mi.ptrs;
    st.has_models_resident_bytes = st.has_models_scratch_bytes = 1;
    for (size_t i = 0; i < mi.n; i++) {
        st.models_resident_bytes += mi.infos[i].resident_bytes;
        st.models_scratch_bytes += mi.infos[i].scratch_bytes;
    }
    Llms__Response r = LLMS__RESPONSE__INIT;
    r.id = j->req->id;
    r.final = 1;
    r.body_case = LLMS__RESPONSE__BODY_STATUS;
    r.status = &st;
    send_resp(s, j->conn_id, &r, false);
    model_infos_free(&mi);
}

static void handle_list_models(sched *s, const sched_job *j)
{
    model_infos mi;
    if (model_infos_fill(s, &mi) < 0) {
        send_error(s, j, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        return;
    }
    Llms__ListModelsResponse lm = LLMS__LIST_MODELS_RESPONSE__INIT;
    lm.n_models = mi.n;
    lm.models = mi.ptrs;
    Llms__Response r = LLMS__RESPONSE__INIT;
    r.id = j->req->id;
    r.final = 1;
    r.body_case = LLMS__RESPONSE__BODY_MODELS;
    r.models = &lm;
    send_resp(s, j->conn_id, &r, false);
    model_infos_free(&mi);
}

static int gm_count(const sched *s)
{
    int n = 0;
    for (int k = 0; k < SCHED_GEN_MAX; k++)
        n += s->gm[k] != NULL;
    return n;
}

/* Each generate model's share of kv_budget_mb: equal parts, set again whenever one
 * comes or goes (a smaller share reclaims idle contexts' chunks at once). */
static void kv_budget_split(sched *s)
{
    size_t total = (size_t)s->env.cfg->kv_budget_mb << 20;
    int n = gm_count(s);
    for (int k = 0; k < SCHED_GEN_MAX; k++)
        if (s->gm[k]) {
            ctx_policy p = *ctx_get_policy(s->gm[k]->cm);
            p.budget_bytes = total / (size_t)n;
            ctx_set_policy(s->gm[k]->cm, &p);
            ctx_enforce_budget(s->gm[k]->cm);
        }
}

static void sched_writes_done(void *arg);

/* Starts serving the generate model me (its weights in the registry) in a free slot:
 * its runner, pool and the contexts that belong to it; tok lends its tokenizer (NULL:
 * loaded from the file). */
static int gm_add(sched *s, models_entry *me, const tokenizer *tok, char err[ERR_MAX])
{
    const config *cfg = s->env.cfg;
    int k = 0;
    while (k < SCHED_GEN_MAX && s->gm[k])
        k++;
    if (k == SCHED_GEN_MAX)
        return err_set(err, "llmsd serves at most %d generate models", SCHED_GEN_MAX);
    /* the new manager's chunk file collection must see every record committed */
    for (int i = 0; i < SCHED_GEN_MAX; i++)
        if (s->gm[i])
            ctx_flush_writes(s->gm[i]->cm);
    ctx_policy policy = {
        .budget_bytes = ((size_t)cfg->kv_budget_mb << 20) / (size_t)(gm_count(s) + 1),
        .compress = strcmp(cfg->kv_compress, "none") == 0   ? CTX_COMPRESS_NONE
                    : strcmp(cfg->kv_compress, "int8") == 0 ? CTX_COMPRESS_INT8
                                                            : CTX_COMPRESS_TOLERANCE,
        .compress_ratio = cfg->kv_compress_ratio,
        .calib_inline_ms = cfg->kv_calib_inline_ms,
        .swap = CTX_SWAP_AHEAD,
        .switch_mode = CTX_SWITCH_PLAN,
    };
    ctx_owner owner = {s, me};
    genmodel_opts o = {cfg, s->env.st, SCHED_MAX_ACTIVE, tok, &policy, ctx_owner_owns, &owner};
    genmodel *gm = genmodel_open(me, &o, err);
    if (!gm)
        return -1;
    if (gm->max_batch > s->max_batch) {
        step_seq *steps = realloc(s->steps, sizeof *steps * (size_t)gm->max_batch);
        if (steps)
            s->steps = steps;
        kv_seq **seqs = realloc(s->step_seqs, sizeof *seqs * (size_t)gm->max_batch);
        if (seqs)
            s->step_seqs = seqs;
        model_batch *batches = realloc(s->step_batches, sizeof *batches * (size_t)gm->max_batch);
        if (batches)
            s->step_batches = batches;
        if (!steps || !seqs || !batches) {
            genmodel_free(gm);
            return err_set(err, "out of memory");
        }
        s->max_batch = gm->max_batch;
    }
    ctx_set_write_notify(gm->cm, sched_writes_done, s);
    for (app_state *a = s->apps; a; a = a->next)
        a->deficit[k] = 0;
    s->drr_next[k] = NULL;
    s->gm[k] = gm;
    return 0;
}

/* A generate model loaded at run time: its contexts, kept by the default model while it
 * was not loaded, move to it (read again from the store). */
static int gm_load(sched *s, models_entry *me, char err[ERR_MAX])
{
    if (gm_add(s, me, NULL, err) < 0)
        return -1;
    ctxmgr *def = s->gm[0]->cm;
    for (ctx_entry *c = ctx_first(def), *next; c; c = next) {
        next = c->next;
        if (c->model && strcmp(c->model, me->name) == 0)
            ctx_forget(def, c);
    }
    kv_budget_split(s);
    atomic_store(&s->n_contexts, (unsigned)ctx_count_all(s));
    return 0;
}

/* Whether a generate model other than the default may go: no work running on it and no
 * context of it (its contexts would lose their model; deleting them, or a restart
 * without the model, which keeps them as history, are the ways). -1 + err naming them. */
static int gm_unload_check(const sched *s, const genmodel *gm, char err[ERR_MAX])
{
    int running = 0;
    for (int i = 0; i < s->n_active; i++)
        running += s->active[i]->gm == gm;
    if (running)
        return err_set(err, "model '%s' has %d request%s running: unload it after they end",
                       gm->me->name, running, running == 1 ? "" : "s");
    int n = ctx_count(gm->cm);
    if (n == 0)
        return 0;
    char ids[4 * (CTX_ID_LEN + 2) + 8];
    size_t len = 0;
    int k = 0;
    ids[0] = '\0';
    for (ctx_entry *c = ctx_first(gm->cm); c && k < 4; c = c->next, k++)
        len += (size_t)snprintf(ids + len, sizeof ids - len, "%s%s", k ? ", " : "", c->id);
    return err_set(err, "model '%s' has %d context%s (%s%s): delete them first, or restart "
                        "llmsd without the model to keep them as history", gm->me->name, n,
                   n == 1 ? "" : "s", ids, n > k ? ", ..." : "");
}

/* The tokenizer of a model by name: a generate model's, or an embed encoder's. NULL +
 * the error's code and err. */
static const tokenizer *model_tokenizer(sched *s, const char *name, Llms__ErrorCode *code,
                                        char err[ERR_MAX])
{
    models_entry *me;
    *code = models_resolve(s->env.reg, name, MODELS_GENERATE, &me, err);
    if (*code == LLMS__ERROR_CODE__OK)
        return gm_of_entry(s, me)->tok;
    if (*code != LLMS__ERROR_CODE__INVALID_ARGUMENT)
        return NULL;
    me = models_find(s->env.reg, name);
    if (me->enc_tok) {
        *code = LLMS__ERROR_CODE__OK;
        return me->enc_tok;
    }
    err_set(err, "model '%s' has no tokenizer loaded: name a generate or embed model", name);
    return NULL;
}

/* Tokenize and Detokenize that name a model (the loop answers the others). */
static void handle_tokens(sched *s, const sched_job *j)
{
    char err[ERR_MAX];
    Llms__ErrorCode code;
    const tokenizer *tok = model_tokenizer(s, tokreq_model(j->req), &code, err);
    tokreq_answer a;
    if (tok)
        code = tokreq_answer_build(tok, j->req, s->env.cfg->max_frame_bytes, &a, err);
    if (code != LLMS__ERROR_CODE__OK)
        send_error(s, j, code, "%s", err);
    else
        send_resp(s, j->conn_id, &a.r, false);
    if (tok)
        tokreq_answer_free(&a);
}

/* Loading maps the file and builds an encoder's runner on the worker: the steps wait
 * for it (milliseconds for a mapping, longer for a large encoder's scratch). A generate
 * model gets its runner, pool and contexts here. */
static void handle_load_model(sched *s, const sched_job *j)
{
    const Llms__LoadModelRequest *q = j->req->load_model;
    char err[ERR_MAX];
    unsigned roles = 0;
    for (size_t i = 0; i < q->n_roles; i++) {
        unsigned one;
        if (models_parse_roles(q->roles[i], &one, err) < 0 || !one || (roles & one)) {
            send_error(s, j, LLMS__ERROR_CODE__INVALID_ARGUMENT,
                       "role %zu: each of generate, embed, rerank at most once", i);
            return;
        }
        roles |= one;
    }
    if ((roles & MODELS_GENERATE) && gm_count(s) == SCHED_GEN_MAX) {
        send_error(s, j, LLMS__ERROR_CODE__RESOURCE_EXHAUSTED,
                   "load: llmsd serves at most %d generate models", SCHED_GEN_MAX);
        return;
    }
    Llms__ErrorCode code = models_load(s->env.reg, q->name, q->path, roles, err);
    if (code != LLMS__ERROR_CODE__OK) {
        send_error(s, j, code, "load: %s", err);
        return;
    }
    models_entry *me = models_find(s->env.reg, q->name);
    if ((me->roles & MODELS_GENERATE) && gm_load(s, me, err) < 0) {
        char ignored[ERR_MAX];
        models_unload(s->env.reg, q->name, ignored);
        send_error(s, j, LLMS__ERROR_CODE__INVALID_ARGUMENT, "load: %s", err);
        return;
    }
    if (reqlog_enabled(REQLOG_INFO))
        fprintf(stderr, "llmsd: info: model '%s' loaded from %s\n", q->name, q->path);
    send_ok(s, j);
}

static void handle_unload_model(sched *s, const sched_job *j)
{
    const char *name = j->req->unload_model->name;
    char err[ERR_MAX];
    models_entry *me = models_find(s->env.reg, name);
    genmodel *gm = me ? gm_of_entry(s, me) : NULL;
    if (gm && gm != s->gm[0] && me->running == 0) {
        if (gm_unload_check(s, gm, err) < 0) {
            send_error(s, j, LLMS__ERROR_CODE__FAILED_PRECONDITION, "unload: %s", err);
            return;
        }
        s->gm[gm_slot(s, gm)] = NULL;
        genmodel_free(gm);
        kv_budget_split(s);
    }
    Llms__ErrorCode code = models_unload(s->env.reg, name, err);
    if (code != LLMS__ERROR_CODE__OK) {
        send_error(s, j, code, "unload: %s", err);
        return;
    }
    if (reqlog_enabled(REQLOG_INFO))
        fprintf(stderr, "llmsd: info: model '%s' unloaded\n", name);
    send_ok(s, j);
}

static void handle_profile(sched *s, const sched_job *j)
{
    char err[ERR_MAX];
    ctx_cost k;
    if (ctx_profile(s->gm[0]->cm, &k, err)) {
        send_error(s, j, LLMS__ERROR_CODE__INTERNAL, "profile: %s", err);
        return;
    }
    Llms__ProfileResponse p = LLMS__PROFILE_RESPONSE__INIT;
    p.rec_a = k.rec_a;
    p.rec_b = k.rec_b;
    p.rec_c = k.rec_c;
    p.io_d = k.io_d;
    p.io_e = k.io_e;
    Llms__CostModels models;
    cost_models_fill(s->gm[0]->cm, &models);
    p.models = &models;
    Llms__Response r = LLMS__RESPONSE__INIT;
    r.id = j->req->id;
    r.final = 1;
    r.body_case = LLMS__RESPONSE__BODY_PROFILE;
    r.profile = &p;
    send_resp(s, j->conn_id, &r, false);
}

static void handle_plan(sched *s, const sched_job *j)
{
    const Llms__PlanRequest *q = j->req->plan;
    const config *cfg = s->env.cfg;
    char err[ERR_MAX], *text = NULL;
    size_t len = 0;
    prefill_plan p;
    models_entry *me;
    Llms__ErrorCode code = models_resolve(s->env.reg, q->model, MODELS_GENERATE, &me, err);
    if (code != LLMS__ERROR_CODE__OK) {
        send_error(s, j, code, "plan: %s", err);
        return;
    }
    if (q->prompt_tokens == 0 || q->prompt_tokens > (uint32_t)cfg->n_ctx) {
        send_error(s, j, LLMS__ERROR_CODE__INVALID_ARGUMENT,
                   "plan: a prompt of %u tokens; the context window (n_ctx) holds 1 to %d",
                   q->prompt_tokens, cfg->n_ctx);
        return;
    }
    if (genmodel_plan(gm_of_entry(s, me), cfg, (int)q->prompt_tokens, &p, err) < 0) {
        send_error(s, j, LLMS__ERROR_CODE__RESOURCE_EXHAUSTED, "plan: %s", err);
        return;
    }
    FILE *f = open_memstream(&text, &len);
    if (f) {
        prefill_plan_print(&p, f);
        if (fclose(f) != 0) {
            free(text);
            text = NULL;
        }
    }
    if (!text) {
        send_error(s, j, LLMS__ERROR_CODE__INTERNAL, "plan: out of memory");
        return;
    }
    Llms__PlanResponse pr = LLMS__PLAN_RESPONSE__INIT;
    pr.text = text;
    pr.rows = (uint32_t)p.est.rows;
    pr.attn_rows = (uint32_t)p.est.attn_rows;
    pr.working_bytes = p.est.working;
    pr.budget_bytes = p.req.budget;
    Llms__Response r = LLMS__RESPONSE__INIT;
    r.id = j->req->id;
    r.final = 1;
    r.body_case = LLMS__RESPONSE__BODY_PLAN;
    r.plan = &pr;
    send_resp(s, j->conn_id, &r, false);
    free(text);
}

static void handle_list_apps(sched *s, const sched_job *j)
{
    /* Apps that have contexts are listed even when none is connected. */
    for (ctx_entry *c = ctx_all_first(s); c; c = ctx_all_next(s, c))
        app_get(s, c->uid, c->app_name);
    size_t n = 0;
    for (app_state *a = s->apps; a; a = a->next)
        n++;
    Llms__AppInfo *infos = calloc(n + 1, sizeof *infos);
    Llms__AppInfo **ptrs = calloc(n + 1, sizeof *ptrs);
    if (!infos || !ptrs) {
        free(infos);
        free(ptrs);
        send_error(s, j, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        return;
    }
    size_t k = 0;
    for (app_state *a = s->apps; a; a = a->next, k++) {
        llms__app_info__init(&infos[k]);
        infos[k].uid = a->uid;
        infos[k].app_name = a->name;
        infos[k].n_contexts = (uint32_t)ctx_count_all_app(s, a->uid, a->name);
        infos[k].queued_requests = (uint32_t)a->n_queued;
        infos[k].n_connections = (uint32_t)a->n_conns;
        ptrs[k] = &infos[k];
    }
    Llms__ListAppsResponse la = LLMS__LIST_APPS_RESPONSE__INIT;
    la.n_apps = n;
    la.apps = ptrs;
    Llms__Response r = LLMS__RESPONSE__INIT;
    r.id = j->req->id;
    r.final = 1;
    r.body_case = LLMS__RESPONSE__BODY_APPS;
    r.apps = &la;
    send_resp(s, j->conn_id, &r, false);
    free(infos);
    free(ptrs);
    for (app_state *a = s->apps, *next; a; a = next) {
        next = a->next;
        app_reclaim(s, a);
    }
}

/* ---- generation ---- */

/* Sampling settings: the request's, else the context's defaults, else the config's. */
static void merge_params(const config *cfg, const Llms__GenerationParams *ctx_p,
                         const Llms__GenerationParams *req_p, sampler_params *sp,
                         int *max_tokens, const Llms__GenerationParams **stops)
{
    sp->temperature = cfg->temperature;
    sp->top_k = cfg->top_k;
    sp->top_p = cfg->top_p;
    sp->min_p = cfg->min_p;
    sp->repeat_penalty = cfg->repeat_penalty;
    sp->repeat_last_n = cfg->repeat_last_n;
    sp->seed = SAMPLER_SEED_RANDOM;
    *max_tokens = cfg->max_tokens;
    *stops = NULL;
    const Llms__GenerationParams *layers[2] = {ctx_p, req_p};
    for (int i = 0; i < 2; i++) {
        const Llms__GenerationParams *p = layers[i];
        if (!p)
            continue;
        if (p->has_temperature)
            sp->temperature = p->temperature;
        if (p->has_top_k)
            sp->top_k = p->top_k;
        if (p->has_top_p)
            sp->top_p = p->top_p;
        if (p->has_min_p)
            sp->min_p = p->min_p;
        if (p->has_repeat_penalty)
            sp->repeat_penalty = p->repeat_penalty;
        if (p->has_repeat_last_n)
            sp->repeat_last_n = p->repeat_last_n;
        if (p->has_seed)
            sp->seed = p->seed;
        if (p->has_max_tokens)
            *max_tokens = p->max_tokens;
        if (p->n_stop > 0)
            *stops = p;
    }
}

static void gen_free(gen *g)
{
    if (!g)
        return;
    if (g->seq == &g->own_seq)
        kv_seq_free(&g->own_seq);
    rag_query_free(g->rq);
    free(g->hist);
    free(g->turn);
    free(g->reply);
    free(g->shown);
    sampler_free(g->smp);
    free(g);
}

/* Builds the generation of a Call, Complete or RagQuery job, or with gg of a graph
 * generation node, on the generate model gm (a Call's: its context's). NULL after
 * answering the job with an error (gg: after putting the error in gg, the job
 * unanswered). */
static gen *gen_new(sched *s, genmodel *gm, const sched_job *j, ctx_entry *c, graph_gen *gg)
{
    const config *cfg = s->env.cfg;
    char err[ERR_MAX];
    gen *g = calloc(1, sizeof *g);
    int32_t *turn = NULL;
    int n_turn = 0;
    Llms__ErrorCode code = LLMS__ERROR_CODE__INTERNAL;
    if (!g) {
        err_set(err, "out of memory");
        goto fail;
    }
    g->gm = gm;
    g->c = c;
    g->t_start = mono_ns();

    const Llms__GenerationParams *req_p, *stops_p;
    sampler_params sp;
    bool templated;
    if (c) {
        Llms__CallRequest *cr = j->req->call;
        templated = !(cr->has_raw && cr->raw);
        req_p = cr->params;
        g->user_role = templated ? "user" : "raw";
        if (prompt_turn(gm->tok, gm->family, c, cr->prompt, !templated, &turn, &n_turn, err))
            goto fail;
        g->seq = &c->seq;
        g->n_base = c->n_tokens;
        g->limit = cfg->max_tokens_per_context;
        merge_params(cfg, c->defaults, req_p, &sp, &g->max_gen, &stops_p);
    } else if (j->req->body_case == LLMS__REQUEST__BODY_RAG_QUERY) {
        kv_seq_init(&g->own_seq, gm->pool);
        g->seq = &g->own_seq;
        g->switched_in = true;
        g->limit = cfg->n_ctx;
        bool cached = false;
        g->rq = j == &s->pred_job
                    ? rag_begin_predicted(s->rag, j->uid, j->app, j->req, &s->pred_task, g->seq,
                                          &cached)
                    : rag_begin(s->rag, j->conn_id, j->uid, j->app, j->req, g->seq, j->queued_ns);
        s->pred_cached = cached;
        if (!g->rq) {
            gen_free(g); /* answered: from the QA bank or with an error */
            return NULL;
        }
        const int32_t *pt = rag_prompt(g->rq, &n_turn);
        if (!(turn = malloc(sizeof *turn * (size_t)(n_turn ? n_turn : 1)))) {
            err_set(err, "out of memory");
            goto fail;
        }
        memcpy(turn, pt, sizeof *turn * (size_t)n_turn);
        templated = true;
        req_p = rag_params(g->rq);
        merge_params(cfg, NULL, req_p, &sp, &g->max_gen, &stops_p);
    } else {
        /* a Complete, or a graph node's prompt as a Complete of it would be */
        const Llms__CompleteRequest *cr = gg ? NULL : j->req->complete;
        const Llms__GenerationParams *node_p = gg ? gg->node_params : NULL;
        templated = gg ? gg->chat : cr->has_chat && cr->chat;
        req_p = gg ? gg->run_params : cr->params;
        char *text = prompt_complete_text(gm->family, gg ? gg->prompt : cr->prompt, templated,
                                          gg ? NULL : cr->system_prompt, err);
        if (!text)
            goto fail;
        int rc = prompt_tokenize(gm->tok, text, strlen(text), true, true, &turn, &n_turn, err);
        free(text);
        if (rc)
            goto fail;
        kv_seq_init(&g->own_seq, gm->pool);
        g->seq = &g->own_seq;
        g->switched_in = true;
        g->limit = cfg->n_ctx;
        merge_params(cfg, node_p, req_p, &sp, &g->max_gen, &stops_p);
    }
    code = LLMS__ERROR_CODE__INVALID_ARGUMENT;
    if (n_turn == 0) {
        err_set(err, "the prompt adds no tokens");
        goto fail;
    }
    if (g->max_gen < 1) {
        err_set(err, "max_tokens must be at least 1");
        goto fail;
    }
    if (c && c->overflow == CTX_OVERFLOW_WINDOW) {
        g->window = true;
        if (c->window_sink == 0)
            g->sink_want = prompt_sink_tokens(gm->tok, gm->family, c->system_prompt,
                                              cfg->window_sink);
    }
    /* A turn that does not fit beside the context: a WINDOW context slides at the
     * switch-in when the turn fits beside the sink (and the sink is all history). */
    int sink = g->window ? ctx_window_sink(c, g->sink_want, g->limit) : 0;
    if (g->n_base + n_turn >= g->limit &&
        !(g->window && g->n_base >= sink && sink + n_turn < g->limit)) {
        code = LLMS__ERROR_CODE__RESOURCE_EXHAUSTED;
        if (!c)
            err_set(err, "the prompt's %d tokens do not fit the window of %d tokens", n_turn,
                    g->limit);
        else if (!g->window)
            err_set(err, "context '%s' is full: it holds %d tokens, the turn adds %d and the "
                    "window is %d tokens (its overflow is refuse; delete it or start another)",
                    c->id, g->n_base, n_turn, g->limit);
        else
            err_set(err, "the turn's %d tokens do not fit the window of %d tokens beside the "
                    "%d it keeps from the start of the context", n_turn, g->limit, sink);
        goto fail;
    }
    const char *stops[STOP_MAX];
    int n_stops = 0;
    if (stops_p) {
        if (stops_p->n_stop >= STOP_MAX) {
            err_set(err, "at most %d stop strings", STOP_MAX - 1);
            goto fail;
        }
        for (size_t i = 0; i < stops_p->n_stop; i++)
            stops[n_stops++] = stops_p->stop[i];
    }
    /* The template's end of turn ends a reply even when the tokenizer does not mark
     * its token as end of generation. */
    if (templated)
        stops[n_stops++] = chat_stop_text(gm->family);
    if (stop_init(&g->stop, stops, n_stops, err))
        goto fail;
    g->smp = sampler_new(gm->n_vocab, &sp, err);
    if (!g->smp)
        goto fail;
    code = LLMS__ERROR_CODE__INTERNAL;
    /* A WINDOW context's turn may take hist past the limit until the switch-in slides. */
    g->hist = malloc(sizeof *g->hist * (size_t)(g->n_base + n_turn > g->limit ? g->n_base + n_turn
                                                                              : g->limit));
    g->reply_cap = g->max_gen < g->limit ? g->max_gen : g->limit;
    g->reply = malloc(sizeof *g->reply * (size_t)g->reply_cap);
    if (!g->hist || !g->reply) {
        err_set(err, "out of memory");
        goto fail;
    }
    if (c && c->n_tokens)
        memcpy(g->hist, c->tokens, sizeof *g->hist * (size_t)c->n_tokens);
    memcpy(g->hist + g->n_base, turn, sizeof *turn * (size_t)n_turn);
    g->turn = turn;
    g->n_turn = n_turn;
    g->n_hist = g->n_base + n_turn;
    if (c) {
        c->busy = true;
        c->last_used_ms = wall_ms();
    }
    return g;
fail:
    free(turn);
    if (gg) {
        gg->code = code;
        snprintf(gg->err, ERR_MAX, "%s", err);
    } else {
        send_error(s, j, code, "%s", err);
    }
    gen_free(g);
    return NULL;
}

/* Streams text (NUL-terminated) and the tokens that produced it. */
static void send_chunk(sched *s, const work *w, char *text, const int32_t *tok, int n_tok)
{
    if (w->quiet || w->gw) /* a graph streams node events, not tokens */
        return;
    Llms__CallChunk ch = LLMS__CALL_CHUNK__INIT;
    ch.text = text;
    ch.n_tokens = (size_t)n_tok;
    ch.tokens = (int32_t *)tok;
    Llms__Response r = LLMS__RESPONSE__INIT;
    r.id = w->job->req->id;
    r.final = 0;
    r.body_case = LLMS__RESPONSE__BODY_CHUNK;
    r.chunk = &ch;
    send_resp(s, w->job->conn_id, &r, true);
}

/* Releases text the stop strings let through as whole valid UTF-8 characters: kept as
 * the reply and streamed with the tokens that produced it. At the end of the reply
 * (last) a character left unfinished is released as U+FFFD; an end with no text sends
 * nothing. */
static void release_text(sched *s, const work *w, const char *text, size_t n, bool last,
                         const int32_t *tok, int n_tok)
{
    gen *g = w->g;
    char out[UTF8_OUT_CAP(STOP_OUT_CAP(PIECE_MAX) + STOP_MAX_LEN) + 1];
    size_t len = utf8_stream_feed(&g->utf8, text, n, out);
    if (last)
        len += utf8_stream_flush(&g->utf8, out + len);
    out[len] = '\0';
    if (last && len == 0)
        return;
    textbuf_append(&g->shown, &g->shown_len, &g->shown_cap, out, len);
    send_chunk(s, w, out, tok, n_tok);
}

static void finish(gen *g, Llms__StopReason reason)
{
    g->done = true;
    g->reason = reason;
}

static void work_fail(work *w, Llms__ErrorCode code, const char *msg);
static bool work_over(const work *w, int64_t now);

/* Slides a full window (a WINDOW context's), keeping at least keep_min recent tokens;
 * the kept tokens after the sink are then evaluated again as long work. Returns whether
 * it slid; a failure fails the work. */
static bool gen_slide(work *w, int keep_min)
{
    gen *g = w->g;
    if (!g->window)
        return false;
    /* Until the next slide at most limit more tokens are generated: room for them is
     * made now, not per token. */
    int want = g->n_gen + g->limit < g->max_gen ? g->n_gen + g->limit : g->max_gen;
    if (want > g->reply_cap) {
        int32_t *r = realloc(g->reply, sizeof *r * (size_t)want);
        if (!r) {
            work_fail(w, LLMS__ERROR_CODE__INTERNAL, "out of memory sliding the window");
            return true;
        }
        g->reply = r;
        g->reply_cap = want;
    }
    if (ctx_window_slide(g->c->cm, g->c, g->hist, &g->n_hist, g->limit, keep_min,
                         g->sink_want) == 0)
        return false;
    g->slides++;
    g->refill = true;
    return true;
}

/* Whether the generation adds one decode row per step (its prompt, or the tokens kept by
 * a slide, are evaluated). */
static bool gen_decoding(const gen *g)
{
    return g->prefilled && !g->refill;
}

/* Takes the token sampled from logits (n_vocab), the out row of the generation's last
 * evaluated token. */
static void take_token(sched *s, work *w, const float *logits)
{
    gen *g = w->g;
    int64_t now = mono_ns();
    if (g->t_last_token) {
        double gap = (double)(now - g->t_last_token) / 1e6;
        if (gap > s->step_stall_ms)
            s->step_stall_ms = gap;
    }
    g->t_last_token = now;
    int32_t next = sampler_sample(g->smp, logits, g->hist, g->n_hist);
    if (next < 0 || tok_is_eog(g->gm->tok, next)) {
        finish(g, LLMS__STOP_REASON__STOP_EOS);
        return;
    }
    g->hist[g->n_hist++] = next;
    g->reply[g->n_gen++] = next;
    char piece[PIECE_MAX], shown[STOP_OUT_CAP(PIECE_MAX) + 1];
    int len = tok_piece(g->gm->tok, next, piece, sizeof piece);
    if (len < 0)
        len = 0;
    if (len > PIECE_MAX - 1)
        len = PIECE_MAX - 1;
    long n = stop_feed(&g->stop, piece, (size_t)len, shown, sizeof shown - 1);
    release_text(s, w, shown, n < 0 ? 0 : (size_t)n, false, &next, 1);
    if (stop_hit(&g->stop) >= 0)
        finish(g, LLMS__STOP_REASON__STOP_STRING);
    else if (g->n_gen >= g->max_gen)
        finish(g, LLMS__STOP_REASON__STOP_MAX_TOKENS);
    else if (g->n_hist >= g->limit && !gen_slide(w, 1))
        finish(g, LLMS__STOP_REASON__STOP_CONTEXT_FULL);
}

/* A Call's switch-in: its chunks are read or recomputed until the KV holds the whole
 * history (a Complete starts empty). Then the KV beyond the context is dropped. -1 with
 * g->err_code on failure. */
static int gen_switch_in(gen *g, char err[ERR_MAX])
{
    int rc = ctx_call_begin(g->c->cm, g->c, g->limit, NULL, err);
    if (rc) {
        g->err_code = rc == CTX_E_BUDGET ? LLMS__ERROR_CODE__RESOURCE_EXHAUSTED
                                         : LLMS__ERROR_CODE__INTERNAL;
        return -1;
    }
    g->switched_in = true;
    if (kv_seq_n_tokens(g->seq) > g->n_base)
        kv_seq_truncate(g->seq, g->n_base);
    /* A turn that does not fit beside the context (gen_new checked it fits the window
     * beside the sink) slides it first, keeping the whole turn. */
    if (g->n_hist >= g->limit) {
        int drop = ctx_window_slide(g->c->cm, g->c, g->hist, &g->n_hist, g->limit, g->n_turn,
                                    g->sink_want);
        if (drop == 0) {
            g->err_code = LLMS__ERROR_CODE__RESOURCE_EXHAUSTED;
            return err_set(err, "the turn does not fit the window of %d tokens", g->limit);
        }
        g->slides++;
    }
    return 0;
}

/* Ends a generation: persists a Call's turn and sends the final result (or the error
 * engine_err). The caller frees the work. */
static void gen_end(sched *s, work *w, const char *engine_err)
{
    gen *g = w->g;
    char err[ERR_MAX];
    Llms__ErrorCode code = engine_err && g->err_code ? g->err_code : LLMS__ERROR_CODE__INTERNAL;
    bool failed = engine_err != NULL;
    if (engine_err)
        snprintf(err, sizeof err, "%s", engine_err);
    g->t_end = mono_ns();
    if (!failed && !g->prefilled) {
        /* Stopped before the prompt was evaluated: nothing to keep. */
        failed = true;
        if (s->shutting) {
            code = LLMS__ERROR_CODE__UNAVAILABLE;
            snprintf(err, sizeof err, "the daemon is shutting down");
        } else if (g->reason == LLMS__STOP_REASON__STOP_DEADLINE) {
            code = LLMS__ERROR_CODE__DEADLINE_EXCEEDED;
            snprintf(err, sizeof err, "the request's timeout passed before its prompt was "
                                      "evaluated");
        } else {
            code = LLMS__ERROR_CODE__CANCELLED;
            snprintf(err, sizeof err, "cancelled");
        }
    }
    if (!failed) {
        char tail[STOP_MAX_LEN + 1];
        release_text(s, w, tail, stop_flush(&g->stop, tail), true, NULL, 0);
    }
    if (g->c && !failed) {
        Llms__CallRequest *cr = w->job->req->call;
        if (ctx_commit_turn(g->c->cm, g->c, g->user_role, cr->prompt, g->turn, g->n_turn,
                            g->shown ? g->shown : "", g->reply, g->n_gen, wall_ms(), err)) {
            failed = true;
            code = LLMS__ERROR_CODE__INTERNAL;
        }
    }
    if (!w->quiet && !failed && g->rq) {
        Llms__RagResult res;
        rag_result(g->rq, &res);
        res.prompt_tokens = (uint32_t)g->n_hist - (uint32_t)g->n_gen;
        res.generated_tokens = (uint32_t)g->n_gen;
        res.prefill_ms = (double)(g->t_first - g->t_start) / 1e6;
        res.decode_ms = (double)(g->t_end - g->t_first) / 1e6;
        res.queue_ms = (double)(g->t_start - w->job->queued_ns) / 1e6;
        res.stop_reason = g->reason;
        res.text = g->shown ? g->shown : "";
        Llms__Response r = LLMS__RESPONSE__INIT;
        r.id = w->job->req->id;
        r.final = 1;
        r.body_case = LLMS__RESPONSE__BODY_RAG_RESULT;
        r.rag_result = &res;
        send_resp(s, w->job->conn_id, &r, false);
    } else if (!w->quiet) {
        if (failed) {
            send_error(s, w->job, code, "%s", err);
        } else {
            Llms__CallResult res = LLMS__CALL_RESULT__INIT;
            res.prompt_tokens = (uint32_t)g->n_eval;
            res.generated_tokens = (uint32_t)g->n_gen;
            res.context_tokens = g->c ? (uint32_t)g->c->n_tokens : 0;
            res.prefill_ms = (double)(g->t_first - g->t_start) / 1e6;
            res.decode_ms = (double)(g->t_end - g->t_first) / 1e6;
            res.queue_ms = (double)(g->t_start - w->job->queued_ns) / 1e6;
            res.stop_reason = g->reason;
            res.has_window_slides = g->slides > 0;
            res.window_slides = (uint32_t)g->slides;
            res.text = g->shown ? g->shown : "";
            Llms__Response r = LLMS__RESPONSE__INIT;
            r.id = w->job->req->id;
            r.final = 1;
            r.body_case = LLMS__RESPONSE__BODY_RESULT;
            r.result = &res;
            send_resp(s, w->job->conn_id, &r, false);
        }
    }
    /* the caches are written after the reply went out, off its latency; an answer cut
     * short (cancelled, deadline, shutdown) is no answer for the QA bank */
    if (!failed && g->rq) {
        bool whole = g->reason == LLMS__STOP_REASON__STOP_EOS ||
                     g->reason == LLMS__STOP_REASON__STOP_MAX_TOKENS ||
                     g->reason == LLMS__STOP_REASON__STOP_STRING;
        outq_wake(s->env.out);
        rag_populate(s->rag, g->rq, g->seq, whole && g->shown ? g->shown : "");
    }
    if (!failed)
        reqlog_request(w->job->uid, w->job->app, w->job->req->body_case, g->n_eval + g->n_gen,
                       (double)(g->t_end - w->job->queued_ns) / 1e6, LLMS__ERROR_CODE__OK,
                       protobuf_c_enum_descriptor_get_value(&llms__stop_reason__descriptor,
                                                            (int)g->reason)->name);
    /* After the reply is queued: the context's modified chunks are compressed and
     * written (ahead-of-time swap-out), or a failed call's extra KV dropped; then its
     * chunks are unlocked. */
    if (g->c) {
        outq_wake(s->env.out);
        ctx_call_end(g->c->cm, g->c, !failed);
    }
}

/* ---- work ---- */

static void spec_rt_drop(graph_work *gw)
{
    retrieval_free(gw->spec_rt);
    free(gw->spec_kb);
    free(gw->spec_query);
    gw->spec_rt = NULL;
    gw->spec_kb = gw->spec_query = NULL;
}

static void graph_work_free(graph_work *gw)
{
    if (!gw)
        return;
    retrieval_free(gw->rt);
    spec_rt_drop(gw);
    kv_seq_free(&gw->kept);
    graph_run_free(gw->run);
    graph_free(gw->gph);
    free(gw->node_ms);
    free(gw->node_tokens);
    free(gw->err);
    free(gw);
}

static void work_free(work *w)
{
    if (!w)
        return;
    gen_free(w->g);
    semantic_task_free(w->t);
    kb_task_free(w->kt);
    graph_work_free(w->gw);
    job_free(w->job);
    free(w);
}

/* Marks the work failed; the next reap answers it and ends it. */
static void work_fail(work *w, Llms__ErrorCode code, const char *msg)
{
    w->failed = true;
    w->fail_code = code;
    snprintf(w->fail_msg, sizeof w->fail_msg, "%s", msg);
    if (w->g) {
        w->g->err_code = code;
        w->g->done = true;
    }
}

/* ---- graph runs ---- */

/* Opens a GraphRun's graph and starts its run. NULL after answering the job. */
static graph_work *graph_work_new(sched *s, const sched_job *j)
{
    const Llms__GraphRunRequest *gr = j->req->graph_run;
    char err[ERR_MAX];
    Llms__ErrorCode code = LLMS__ERROR_CODE__INTERNAL;
    graph_work *gw = calloc(1, sizeof *gw);
    if (!gw || !(gw->err = malloc(ERR_MAX))) {
        err_set(err, "out of memory");
        goto fail;
    }
    gw->node = -1;
    gw->spec_node = -1;
    gw->t_start = mono_ns();
    gw->speculate = gr->has_speculate ? gr->speculate : s->env.cfg->graph_speculate;
    if (!(gw->gph = graphs_open(&s->graphs, j->uid, j->app, gr->graph, &code, err)))
        goto fail;
    size_t n = graph_def(gw->gph)->n_nodes;
    code = LLMS__ERROR_CODE__INTERNAL;
    gw->node_ms = calloc(n, sizeof *gw->node_ms);
    gw->node_tokens = calloc(n, sizeof *gw->node_tokens);
    if (!gw->node_ms || !gw->node_tokens) {
        err_set(err, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < gr->n_inputs; i++)
        if (strlen(gr->inputs[i]->value) > (size_t)s->env.cfg->max_text_bytes) {
            code = LLMS__ERROR_CODE__RESOURCE_EXHAUSTED;
            err_set(err, "input '%.64s' is %zu bytes, over max_text_bytes (%d)",
                    gr->inputs[i]->name, strlen(gr->inputs[i]->value),
                    s->env.cfg->max_text_bytes);
            goto fail;
        }
    code = LLMS__ERROR_CODE__INVALID_ARGUMENT;
    gw->run = graph_run_new(gw->gph, gr->inputs, gr->n_inputs, s->env.cfg->graph_max_steps, err);
    if (!gw->run)
        goto fail;
    return gw;
fail:
    send_error(s, j, code, "graph '%.64s': %s", gr->graph, err);
    graph_work_free(gw);
    return NULL;
}

static const Llms__GraphNode *graph_node_of(const graph_work *gw, int i)
{
    return graph_def(gw->gph)->nodes[i];
}

/* What became of a speculation on a node's output (SPEC_NONE: there was none). */
#define SPEC_NONE (-1)

/* Streams a node event: started, or finished with the variable it set (and spec, the
 * outcome of the speculation on it). */
static void graph_event(sched *s, const work *w, Llms__GraphEventKind kind, const char *value,
                        double ms, uint32_t tokens, int spec)
{
    if (w->quiet)
        return;
    const graph_work *gw = w->gw;
    const Llms__GraphNode *n = graph_node_of(gw, gw->node);
    Llms__GraphEvent ev = LLMS__GRAPH_EVENT__INIT;
    ev.kind = kind;
    ev.node = n->name;
    ev.step = (uint32_t)graph_run_steps(gw->run) + (kind == LLMS__GRAPH_EVENT_KIND__GRAPH_NODE_STARTED);
    if (kind == LLMS__GRAPH_EVENT_KIND__GRAPH_NODE_FINISHED) {
        ev.output = n->output;
        ev.value = (char *)value;
        ev.has_ms = 1;
        ev.ms = ms;
        ev.has_generated_tokens = n->kind == LLMS__GRAPH_NODE_KIND__GRAPH_GENERATE;
        ev.generated_tokens = tokens;
        ev.has_speculation = spec != SPEC_NONE;
        ev.speculation = spec == SPEC_NONE ? 0 : (Llms__GraphSpeculation)spec;
    }
    Llms__Response r = LLMS__RESPONSE__INIT;
    r.id = w->job->req->id;
    r.final = 0;
    r.body_case = LLMS__RESPONSE__BODY_GRAPH_EVENT;
    r.graph_event = &ev;
    send_resp(s, w->job->conn_id, &r, false);
}

/* Fails the graph work with a message naming its node. */
static void graph_fail(work *w, Llms__ErrorCode code, const char *msg)
{
    graph_work *gw = w->gw;
    char named[ERR_MAX];
    snprintf(named, sizeof named, "node '%s': %s", graph_node_of(gw, gw->node)->name, msg);
    work_fail(w, code, named);
}

/* The ready node's output is in: into the run's state, the node's event (spec: the
 * outcome of the speculation on it) and times. */
static int graph_node_done(sched *s, work *w, const char *out, size_t len, uint32_t tokens,
                           int spec)
{
    graph_work *gw = w->gw;
    double ms = (double)(mono_ns() - gw->node_t0) / 1e6;
    gw->node_ms[gw->node] += ms;
    gw->node_tokens[gw->node] += tokens;
    if (graph_run_feed(gw->run, out, len)) {
        graph_fail(w, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        return -1;
    }
    graph_event(s, w, LLMS__GRAPH_EVENT_KIND__GRAPH_NODE_FINISHED, out, ms, tokens, spec);
    gw->node = -1;
    gw->spec_tried = false;
    return 0;
}

/* Entries at the start of seq whose tokens and positions are tok[0..n). */
static int seq_common_prefix(const kv_seq *seq, const int32_t *tok, int n)
{
    int common = 0;
    for (int i = 0; i < seq->n_chunks; i++) {
        const kv_chunk *c = seq->chunks[i];
        if (!c)
            return common;
        for (int t = 0; t < c->n_tokens; t++, common++)
            if (common >= n || c->tokens[t] != tok[common] || c->positions[t] != common)
                return common;
    }
    return common;
}

/* A graph generation node's KV starts as the run's kept KV cut where its tokens leave
 * the prompt's: the same tokens at the same positions give the same entries (up to the
 * roundings of the batched slices they were computed in), so only the rest is evaluated
 * (a node after a retrieval whose passages begin as before, or an answer after a step
 * that read the same passages and question). The prompt's last
 * token is always evaluated: its logits start the reply. The kept KV is emptied either
 * way, so that a run never holds more than one generation's KV. */
static void gen_adopt_prefix(gen *g, kv_seq *kept, long *reused)
{
    int keep = seq_common_prefix(kept, g->turn, g->n_turn - 1);
    if (keep > 0) {
        kv_seq_truncate(kept, keep);
        g->own_seq = *kept;
        kv_seq_init(kept, g->own_seq.pool);
        *reused += keep;
    }
    kv_seq_free(kept);
}

/* The generation of node n on prompt: NULL with *code and gw->err. */
static gen *graph_gen_new(sched *s, work *w, const Llms__GraphNode *n, const char *prompt,
                          Llms__ErrorCode *code)
{
    graph_work *gw = w->gw;
    graph_gen gg = {prompt, n->has_chat && n->chat, n->params, w->job->req->graph_run->params,
                    LLMS__ERROR_CODE__INTERNAL, gw->err};
    gen *g = gen_new(s, w->gm, w->job, NULL, &gg);
    *code = gg.code;
    if (g) {
        gw->prompt_tokens += g->n_turn;
        if (s->env.cfg->graph_reuse_kv)
            gen_adopt_prefix(g, &gw->kept, &gw->reused_tokens);
    }
    return g;
}

/* The retrieval of node n: NULL with *code and gw->err. */
static retrieval *graph_retrieval_new(sched *s, work *w, const Llms__GraphNode *n,
                                      const char *kb, const char *query, Llms__ErrorCode *code)
{
    retrieval *r = retrieval_begin(s->kb, s->sem, s->env.st, w->job->uid, w->job->app, kb,
                                   query, n->has_top_k ? (int)n->top_k : s->env.cfg->rag_top_k,
                                   n->has_retrieval ? n->retrieval
                                                    : LLMS__RETRIEVAL__RETRIEVAL_RRF,
                                   code, w->gw->err);
    if (r)
        retrieval_use_hints(r, &w->gw->hints);
    return r;
}

/* ---- speculation ---- */

/* The head start of kept speculative work that has done something (progressed): how
 * long since it started. */
static double spec_ahead_ms(const graph_work *gw, bool progressed)
{
    return progressed ? (double)(mono_ns() - gw->spec_t0) / 1e6 : 0;
}

static void spec_count(sched *s, graph_work *gw, bool hit, double saved_ms)
{
    spec_stats *st[2] = {&gw->spec, &s->spec};
    for (int i = 0; i < 2; i++) {
        st[i]->hits += hit;
        st[i]->rollbacks += !hit;
        st[i]->saved_ms += hit ? saved_ms : 0;
    }
}

/* A speculation on node starts (a generation on a seeded estimate goes on the
 * speculation that seeded it, not counted again). */
static void spec_begin(sched *s, graph_work *gw, int node)
{
    gw->spec_node = node;
    gw->spec_t0 = mono_ns();
    gw->spec.started += !gw->spec_seeded;
    s->spec.started += !gw->spec_seeded;
}

/* While the ready node's retrieval runs: when it holds an estimate that leads to a
 * generation node, that node's generation starts on it (in work.g, joining the steps);
 * tried once per node run. Nothing is started when anything fails: the node then
 * starts, and fails, as usual. */
static void spec_gen_start(sched *s, work *w)
{
    graph_work *gw = w->gw;
    if (!gw->speculate || gw->spec_tried || w->g ||
        retrieval_estimate(gw->rt) == RETRIEVAL_ESTIMATE_NONE)
        return;
    char err[ERR_MAX];
    size_t len, max = (size_t)s->env.cfg->max_text_bytes;
    gw->spec_tried = true; /* once per node run: not again at every cycle */
    const char *text = retrieval_estimate_text(gw->rt, &len, err);
    if (!text || graph_run_feed_trial(gw->run, text, len))
        return;
    int node = graph_run_ready(gw->run);
    char *prompt = NULL;
    if (node >= 0 && graph_node_of(gw, node)->kind == LLMS__GRAPH_NODE_KIND__GRAPH_GENERATE)
        prompt = graph_run_render(gw->run, GRAPH_FIELD_PROMPT, max, &len);
    graph_run_undo(gw->run);
    if (!prompt)
        return;
    Llms__ErrorCode code;
    w->g = graph_gen_new(s, w, graph_node_of(gw, node), prompt, &code);
    free(prompt);
    if (w->g)
        spec_begin(s, gw, node);
}

/* The kb and query the node after the ready generation node would have if the
 * generation's output were out (n bytes): the node, or -1 when that is no retrieval
 * node or anything fails. */
static int spec_rt_render(sched *s, graph_work *gw, const char *out, size_t n, char **kb,
                          char **query)
{
    size_t max = (size_t)s->env.cfg->max_text_bytes, kb_len, len;
    *kb = *query = NULL;
    if (graph_run_feed_trial(gw->run, out, n))
        return -1;
    int node = graph_run_ready(gw->run);
    if (node >= 0 && graph_node_of(gw, node)->kind == LLMS__GRAPH_NODE_KIND__GRAPH_RETRIEVE) {
        *kb = graph_run_render(gw->run, GRAPH_FIELD_KB, max, &kb_len);
        *query = graph_run_render(gw->run, GRAPH_FIELD_QUERY, max, &len);
    }
    graph_run_undo(gw->run);
    if (!*kb || !*query) {
        free(*kb);
        free(*query);
        *kb = *query = NULL;
        return -1;
    }
    return node;
}

/* While the ready node's generation runs: once it has graph_spec_tokens tokens, the
 * retrieval node its text so far leads to starts on it (when it leads to one then);
 * then a sub-stage of that retrieval per call. A failing speculative retrieval is
 * dropped (a rollback). */
static void spec_rt_advance(sched *s, work *w)
{
    graph_work *gw = w->gw;
    gen *g = w->g;
    if (gw->spec_rt) {
        Llms__ErrorCode code;
        char err[ERR_MAX];
        if (retrieval_done(gw->spec_rt))
            return;
        if (retrieval_step(gw->spec_rt, &code, err) < 0) {
            spec_rt_drop(gw);
            spec_count(s, gw, false, 0);
            gw->spec_node = -1;
        }
        gw->spec_rt_stages++;
        return;
    }
    if (!gw->speculate || gw->spec_tried || g->n_gen < s->env.cfg->graph_spec_tokens)
        return;
    /* once, at graph_spec_tokens tokens: not again at every token */
    gw->spec_tried = true;
    char *kb, *query;
    int node = spec_rt_render(s, gw, g->shown ? g->shown : "", g->shown_len, &kb, &query);
    if (node < 0)
        return;
    Llms__ErrorCode code;
    gw->spec_rt = graph_retrieval_new(s, w, graph_node_of(gw, node), kb, query, &code);
    if (!gw->spec_rt) {
        free(kb);
        free(query);
        return;
    }
    gw->spec_kb = kb;
    gw->spec_query = query;
    gw->spec_rt_stages = 0;
    spec_begin(s, gw, node);
}

/* The ready generation node gave out (n bytes): whether the retrieval started on its
 * first tokens stands. It does when it got the same kb and query (a hit: it goes on as
 * the next node's retrieval); when only the query differs and it is done, its result
 * becomes the next retrieval's estimate and the outcome waits for that retrieval's end
 * (spec_seeded; SPEC_NONE here); else it is a rollback. SPEC_NONE when none was
 * started. */
static int spec_rt_outcome(sched *s, work *w, const char *out, size_t n)
{
    graph_work *gw = w->gw;
    if (gw->spec_node < 0)
        return SPEC_NONE;
    char *kb, *query;
    int node = spec_rt_render(s, gw, out, n, &kb, &query);
    bool same_kb = node == gw->spec_node && strcmp(kb, gw->spec_kb) == 0;
    bool hit = same_kb && strcmp(query, gw->spec_query) == 0;
    free(kb);
    free(query);
    if (!hit && same_kb && retrieval_done(gw->spec_rt)) {
        gw->spec_seeded = true;
        return SPEC_NONE;
    }
    spec_count(s, gw, hit, spec_ahead_ms(gw, gw->spec_rt_stages > 0));
    return hit ? LLMS__GRAPH_SPECULATION__GRAPH_SPEC_HIT
               : LLMS__GRAPH_SPECULATION__GRAPH_SPEC_ROLLBACK;
}

/* Starts the ready node: a generation (which then runs in the steps like any other) or
 * a retrieval (advanced by graph_advance, a sub-stage per cycle). */
static int graph_node_start(sched *s, work *w, int node)
{
    graph_work *gw = w->gw;
    const Llms__GraphNode *n = graph_node_of(gw, node);
    Llms__ErrorCode code = LLMS__ERROR_CODE__INTERNAL;
    gw->node = node;
    gw->node_t0 = mono_ns();
    graph_event(s, w, LLMS__GRAPH_EVENT_KIND__GRAPH_NODE_STARTED, NULL, 0, 0, SPEC_NONE);
    size_t max = (size_t)s->env.cfg->max_text_bytes, len;
    if (n->kind == LLMS__GRAPH_NODE_KIND__GRAPH_GENERATE) {
        spec_rt_drop(gw);
        char *prompt = graph_run_render(gw->run, GRAPH_FIELD_PROMPT, max, &len);
        if (!prompt) {
            if (len > max)
                snprintf(gw->err, ERR_MAX, "its prompt would be %zu bytes, over max_text_bytes "
                         "(%zu)", len, max);
            graph_fail(w, len > max ? LLMS__ERROR_CODE__RESOURCE_EXHAUSTED : code,
                       len > max ? gw->err : "out of memory");
            return -1;
        }
        w->g = graph_gen_new(s, w, n, prompt, &code);
        free(prompt);
        if (!w->g) {
            graph_fail(w, code, gw->err);
            return -1;
        }
        return 0;
    }
    size_t kb_len;
    char *kb = graph_run_render(gw->run, GRAPH_FIELD_KB, max, &kb_len);
    char *query = graph_run_render(gw->run, GRAPH_FIELD_QUERY, max, &len);
    if (kb_len > max || len > max) {
        code = LLMS__ERROR_CODE__RESOURCE_EXHAUSTED;
        err_set(gw->err, "its %s would be %zu bytes, over max_text_bytes (%zu)",
                kb_len > max ? "kb" : "query", kb_len > max ? kb_len : len, max);
    } else if (kb && query) {
        gw->rt = graph_retrieval_new(s, w, n, kb, query, &code);
        /* a retrieval started on the generation's first tokens gives its result as this
         * one's estimate */
        if (gw->rt && gw->spec_seeded)
            retrieval_seed(gw->rt, gw->spec_rt);
    } else {
        err_set(gw->err, "out of memory");
    }
    spec_rt_drop(gw);
    free(kb);
    free(query);
    if (!gw->rt) {
        graph_fail(w, code, gw->err);
        return -1;
    }
    return 0;
}

/* Sends a finished run's GraphResult. */
static void graph_send_result(sched *s, work *w)
{
    graph_work *gw = w->gw;
    const Llms__GraphDef *d = graph_def(gw->gph);
    int n_vars = graph_run_n_vars(gw->run);
    Llms__GraphNodeTiming *tm = calloc(d->n_nodes, sizeof *tm);
    Llms__GraphNodeTiming **tp = calloc(d->n_nodes, sizeof *tp);
    Llms__GraphVar *vars = calloc((size_t)n_vars, sizeof *vars);
    Llms__GraphVar **vp = calloc((size_t)n_vars, sizeof *vp);
    if (!tm || !tp || !vars || !vp) {
        send_error(s, w->job, LLMS__ERROR_CODE__INTERNAL, "out of memory");
    } else {
        Llms__GraphResult res = LLMS__GRAPH_RESULT__INIT;
        res.timings = tp;
        for (size_t i = 0; i < d->n_nodes; i++) {
            if (graph_run_count(gw->run, (int)i) == 0)
                continue;
            llms__graph_node_timing__init(&tm[i]);
            tm[i].node = d->nodes[i]->name;
            tm[i].runs = (uint32_t)graph_run_count(gw->run, (int)i);
            tm[i].ms = gw->node_ms[i];
            tm[i].generated_tokens = gw->node_tokens[i];
            tp[res.n_timings++] = &tm[i];
        }
        for (int i = 0; i < n_vars; i++) {
            llms__graph_var__init(&vars[i]);
            vars[i].name = (char *)graph_run_var_name(gw->run, i);
            vars[i].value = (char *)graph_run_var_value(gw->run, i);
            vp[i] = &vars[i];
        }
        res.n_state = (size_t)n_vars;
        res.state = vp;
        res.output = (char *)graph_run_var(gw->run, d->output);
        res.steps = (uint32_t)graph_run_steps(gw->run);
        res.capped = graph_run_capped(gw->run);
        res.has_speculations = res.has_spec_hits = res.has_spec_rollbacks = 1;
        res.has_spec_saved_ms = 1;
        res.speculations = (uint32_t)gw->spec.started;
        res.spec_hits = (uint32_t)gw->spec.hits;
        res.spec_rollbacks = (uint32_t)gw->spec.rollbacks;
        res.spec_saved_ms = gw->spec.saved_ms;
        res.has_prompt_tokens = res.has_reused_tokens = 1;
        res.prompt_tokens = (uint32_t)gw->prompt_tokens;
        res.reused_tokens = (uint32_t)gw->reused_tokens;
        int64_t now = mono_ns();
        res.total_ms = (double)(now - gw->t_start) / 1e6;
        res.queue_ms = (double)(gw->t_start - w->job->queued_ns) / 1e6;
        Llms__Response r = LLMS__RESPONSE__INIT;
        r.id = w->job->req->id;
        r.final = 1;
        r.body_case = LLMS__RESPONSE__BODY_GRAPH_RESULT;
        r.graph_result = &res;
        if (!w->quiet)
            send_resp(s, w->job->conn_id, &r, false);
    }
    free(tm);
    free(tp);
    free(vars);
    free(vp);
}

/* Moves a graph run on as far as it goes without the engine: a finished generation node
 * gives its output; a retrieval node runs one sub-stage; the next ready node starts;
 * an ended run is answered. */
static void graph_advance(sched *s, work *w)
{
    graph_work *gw = w->gw;
    while (!work_over(w, mono_ns())) {
        if (gw->rt) {
            spec_gen_start(s, w);
            Llms__ErrorCode code;
            int rc = retrieval_step(gw->rt, &code, gw->err);
            if (rc < 0)
                graph_fail(w, code, gw->err);
            if (rc == 0)
                spec_gen_start(s, w);
            if (rc <= 0)
                return;
            /* a generation started on the estimate stands when the passages are the
             * estimate's: the same prompt, so the same tokens; so does the retrieval
             * on a generation's first tokens that gave a seeded estimate */
            int spec = SPEC_NONE;
            if (gw->spec_node >= 0 || gw->spec_seeded) {
                bool hit = retrieval_estimate_held(gw->rt);
                spec = hit ? LLMS__GRAPH_SPECULATION__GRAPH_SPEC_HIT
                           : LLMS__GRAPH_SPECULATION__GRAPH_SPEC_ROLLBACK;
                spec_count(s, gw, hit,
                           spec_ahead_ms(gw, w->g && kv_seq_n_tokens(w->g->seq) > 0));
                if (!hit) {
                    gen_free(w->g);
                    w->g = NULL;
                }
                gw->spec_seeded = false;
            }
            size_t len;
            const char *text = retrieval_text(gw->rt, &len);
            rc = graph_node_done(s, w, text, len, 0, spec);
            retrieval_free(gw->rt);
            gw->rt = NULL;
            int node = gw->spec_node;
            gw->spec_node = -1;
            if (rc)
                return;
            if (w->g) {
                gw->node = node;
                gw->node_t0 = gw->spec_t0;
                graph_event(s, w, LLMS__GRAPH_EVENT_KIND__GRAPH_NODE_STARTED, NULL, 0, 0,
                            SPEC_NONE);
            }
            continue;
        }
        if (w->g) {
            gen *g = w->g;
            if (!g->done) {
                spec_rt_advance(s, w);
                return;
            }
            char tail[STOP_MAX_LEN + 1];
            release_text(s, w, tail, stop_flush(&g->stop, tail), true, NULL, 0);
            const char *out = g->shown ? g->shown : "";
            int spec = spec_rt_outcome(s, w, out, g->shown_len);
            int rc = graph_node_done(s, w, out, g->shown_len, (uint32_t)g->n_gen, spec);
            if (s->env.cfg->graph_reuse_kv) {
                kv_seq_free(&gw->kept);
                gw->kept = g->own_seq;
                kv_seq_init(&g->own_seq, g->gm->pool);
            }
            gen_free(g);
            w->g = NULL;
            int node = gw->spec_node;
            gw->spec_node = -1;
            if (rc)
                return;
            if (spec == LLMS__GRAPH_SPECULATION__GRAPH_SPEC_HIT) {
                gw->rt = gw->spec_rt;
                gw->spec_rt = NULL;
                spec_rt_drop(gw);
                gw->node = node;
                gw->node_t0 = gw->spec_t0;
                graph_event(s, w, LLMS__GRAPH_EVENT_KIND__GRAPH_NODE_STARTED, NULL, 0, 0,
                            SPEC_NONE);
            }
            continue;
        }
        int node = graph_run_ready(gw->run);
        if (node < 0) {
            graph_send_result(s, w);
            w->answered = true;
            return;
        }
        if (graph_node_start(s, w, node))
            return;
    }
}

/* Ends a graph run that is over: its error (a node's failure, a cancel, the deadline,
 * shutdown) when it was not answered, and the log line. */
static void graph_end(sched *s, work *w)
{
    graph_work *gw = w->gw;
    int64_t now = mono_ns();
    if (w->answered) {
        long tokens = 0;
        for (size_t i = 0; i < graph_def(gw->gph)->n_nodes; i++)
            tokens += gw->node_tokens[i];
        reqlog_request(w->job->uid, w->job->app, w->job->req->body_case, (int)tokens,
                       (double)(now - w->job->queued_ns) / 1e6, LLMS__ERROR_CODE__OK,
                       graph_run_capped(gw->run) ? "capped" : "end");
        return;
    }
    if (w->quiet)
        return;
    if (w->failed)
        send_error(s, w->job, w->fail_code, "graph '%.64s': %s", w->job->req->graph_run->graph,
                   w->fail_msg);
    else if (s->shutting)
        send_error(s, w->job, LLMS__ERROR_CODE__UNAVAILABLE, "the daemon is shutting down");
    else if (!w->cancelled)
        send_error(s, w->job, LLMS__ERROR_CODE__DEADLINE_EXCEEDED, "the request's timeout passed "
                   "after %d node runs", graph_run_steps(gw->run));
    else
        send_error(s, w->job, LLMS__ERROR_CODE__CANCELLED, "cancelled after %d node runs",
                   graph_run_steps(gw->run));
}

/* Whether the work is over: finished, failed, cancelled or past its deadline. */
static bool work_over(const work *w, int64_t now)
{
    bool expired = w->deadline_ns && now >= w->deadline_ns;
    if (w->failed || w->answered)
        return true;
    /* a graph's generation node ending is not the graph's end */
    return w->g && !w->gw ? w->g->done || w->cancelled || expired : w->cancelled || expired;
}

/* Ends an admitted request that is over: its answer (the result, the failure, or why it
 * stopped), and its place in the app's queue count. */
static void work_end(sched *s, work *w)
{
    if (w->gw) {
        graph_end(s, w);
    } else if (w->g) {
        if (!w->g->done)
            finish(w->g, !w->cancelled ? LLMS__STOP_REASON__STOP_DEADLINE
                         : s->shutting ? LLMS__STOP_REASON__STOP_SHUTDOWN
                                       : LLMS__STOP_REASON__STOP_CANCELLED);
        gen_end(s, w, w->failed ? w->fail_msg : NULL);
    } else if (w->answered) {
        reqlog_request(w->job->uid, w->job->app, w->job->req->body_case, -1,
                       (double)(mono_ns() - w->job->queued_ns) / 1e6, LLMS__ERROR_CODE__OK,
                       "answered");
    } else if (!w->quiet) {
        if (w->failed)
            send_error(s, w->job, w->fail_code, "%s", w->fail_msg);
        else if (s->shutting)
            send_error(s, w->job, LLMS__ERROR_CODE__UNAVAILABLE, "the daemon is shutting down");
        else if (!w->cancelled)
            send_error(s, w->job, LLMS__ERROR_CODE__DEADLINE_EXCEEDED,
                       "the request's timeout passed");
        else
            send_error(s, w->job, LLMS__ERROR_CODE__CANCELLED, "cancelled");
    }
    w->app->n_queued--;
    w->gm->kv_reserved -= w->kv_reserved;
    app_reclaim(s, w->app);
    work_free(w);
}

/* Whether the work still has long work (switch-in, prompt, texts, reranking) rather than
 * at most one decode row per step. */
static bool work_is_long(const work *w)
{
    if (w->kt)
        return true; /* until it is answered */
    if (!w->g && !w->t) /* a graph between generations */
        return false;
    return w->g ? !gen_decoding(w->g) : semantic_rows_left(w->t) > 0;
}

/* Rows of long work left: a generation's prompt tokens not yet evaluated. */
static long work_rows_left(const work *w)
{
    if (w->kt)
        return kb_task_rows_left(w->kt);
    if (!w->g)
        return semantic_rows_left(w->t);
    int have = w->g->switched_in ? kv_seq_n_tokens(w->g->seq) : w->g->n_base;
    return w->g->n_hist - have;
}

/* ---- queues ---- */

static void pend_push(app_state *a, sched_job *j)
{
    j->next = NULL;
    if (a->pend_tail)
        a->pend_tail->next = j;
    else
        a->pend_head = j;
    a->pend_tail = j;
}

static void pend_unlink(sched *s, app_state *a, sched_job **pp, sched_job *prev)
{
    sched_job *j = *pp;
    *pp = j->next;
    if (a->pend_tail == j)
        a->pend_tail = prev;
    s->n_pending--;
}

static int64_t job_deadline(const sched_job *j)
{
    return j->req->has_timeout_ms && j->req->timeout_ms
               ? j->queued_ns + (int64_t)j->req->timeout_ms * 1000000
               : 0;
}

/* Removes pending jobs matching (conn_id or any when 0, request id or any when all), or
 * with expired set those whose deadline has passed; answers each with code unless
 * quiet. Returns how many were removed. */
static int pend_remove(sched *s, uint64_t conn_id, bool all, uint64_t req_id, bool expired,
                       bool quiet, Llms__ErrorCode code, const char *msg)
{
    int removed = 0;
    int64_t now = expired ? mono_ns() : 0;
    for (app_state *a = s->apps; a; a = a->next) {
        sched_job **pp = &a->pend_head, *prev = NULL;
        while (*pp) {
            sched_job *j = *pp;
            bool match = expired ? job_deadline(j) && now >= job_deadline(j)
                                 : (conn_id == 0 || j->conn_id == conn_id) &&
                                       (all || j->req->id == req_id);
            if (!match) {
                prev = j;
                pp = &j->next;
                continue;
            }
            pend_unlink(s, a, pp, prev);
            a->n_queued--;
            removed++;
            if (!quiet)
                send_error(s, j, code, "%s", msg);
            job_free(j);
        }
    }
    return removed;
}

static bool is_engine_request(Llms__Request__BodyCase body)
{
    switch (body) {
    case LLMS__REQUEST__BODY_CALL:
    case LLMS__REQUEST__BODY_COMPLETE:
    case LLMS__REQUEST__BODY_EMBED:
    case LLMS__REQUEST__BODY_RERANK:
    case LLMS__REQUEST__BODY_RERANK_CALIBRATE:
    case LLMS__REQUEST__BODY_RAG_QUERY:
    case LLMS__REQUEST__BODY_GRAPH_RUN:
    case LLMS__REQUEST__BODY_KB_ADD:
    case LLMS__REQUEST__BODY_KB_DROP:
        return true;
    default:
        return false;
    }
}

/* Writes "a, b" (the generate models' names) into buf. */
static void gm_names(const sched *s, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int k = 0; k < SCHED_GEN_MAX && n < cap; k++)
        if (s->gm[k]) {
            int w = snprintf(buf + n, cap - n, "%s%s", n ? ", " : "", s->gm[k]->me->name);
            n += w > 0 ? (size_t)w : 0;
        }
}

/* Whether a Call may run on its context's model, or a Complete names a generate model
 * (or none); otherwise answers the error. A context of a model that is not loaded (the
 * daemon restarted without it) is kept, its calls refused; a Call that names a model
 * other than its context's is refused: a context's KV is its model's. */
static bool generate_model_ok(sched *s, const sched_job *j)
{
    char err[ERR_MAX];
    models_entry *me;
    if (j->req->body_case == LLMS__REQUEST__BODY_COMPLETE) {
        Llms__ErrorCode code =
            models_resolve(s->env.reg, j->req->complete->model, MODELS_GENERATE, &me, err);
        if (code != LLMS__ERROR_CODE__OK)
            send_error(s, j, code, "%s", err);
        return code == LLMS__ERROR_CODE__OK;
    }
    if (j->req->body_case != LLMS__REQUEST__BODY_CALL)
        return true;
    const Llms__CallRequest *cr = j->req->call;
    const ctx_entry *c = ctx_find_all(s, cr->context_id, j->uid, j->app);
    const char *model = ctx_model_name(s, c);
    if (cr->model && cr->model[0] && strcmp(cr->model, model) != 0) {
        send_error(s, j, LLMS__ERROR_CODE__FAILED_PRECONDITION,
                   "context '%s' belongs to model '%s', not '%.64s': a context runs on the "
                   "model it was created with", c->id, model, cr->model);
        return false;
    }
    if (strcmp(model, gm_of_ctx(s, c)->me->name) == 0)
        return true;
    char names[256];
    gm_names(s, names, sizeof names);
    send_error(s, j, LLMS__ERROR_CODE__FAILED_PRECONDITION,
               "context '%s' belongs to model '%s', which is not loaded (the generate models: "
               "%s); its history is kept", c->id, model, names);
    return false;
}

/* Queues a request that uses the engine, under the app's limit on requests of every
 * kind queued or running. */
static void handle_engine_request(sched *s, sched_job *j)
{
    /* the idle period ends; prediction work pauses until the next one */
    s->last_req_ns = mono_ns();
    predict_idle_end(s->predict);
    if (s->pred && !s->pred_paused) {
        s->pred_paused = true;
        predict_count_preempted(s->predict);
    }
    if (s->shutting) {
        send_error(s, j, LLMS__ERROR_CODE__UNAVAILABLE, "the daemon is shutting down");
        job_free(j);
        return;
    }
    app_state *a = app_get(s, j->uid, j->app);
    if (!a) {
        send_error(s, j, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        job_free(j);
        return;
    }
    if (j->req->body_case == LLMS__REQUEST__BODY_CALL &&
        !ctx_find_all(s, j->req->call->context_id, j->uid, j->app)) {
        send_error(s, j, LLMS__ERROR_CODE__NOT_FOUND, "no context '%s'", j->req->call->context_id);
        job_free(j);
        app_reclaim(s, a);
        return;
    }
    if (!generate_model_ok(s, j)) {
        job_free(j);
        app_reclaim(s, a);
        return;
    }
    if (a->n_queued >= s->env.cfg->max_queued_per_app) {
        send_error(s, j, LLMS__ERROR_CODE__RESOURCE_EXHAUSTED,
                   "app has %d requests queued or running, the limit (max_queued_per_app)",
                   a->n_queued);
        job_free(j);
        app_reclaim(s, a);
        return;
    }
    int of_uid = uid_queued(s, j->uid);
    if (of_uid >= s->env.cfg->max_queued_per_uid) {
        send_error(s, j, LLMS__ERROR_CODE__RESOURCE_EXHAUSTED,
                   "uid %u has %d requests queued or running over all its apps, the limit "
                   "(max_queued_per_uid)", j->uid, of_uid);
        job_free(j);
        app_reclaim(s, a);
        return;
    }
    a->n_queued++;
    s->n_pending++;
    pend_push(a, j);
}

static void handle_cancel(sched *s, sched_job *j)
{
    uint64_t target = j->req->cancel->request_id;
    bool found = pend_remove(s, j->conn_id, false, target, false, false,
                             LLMS__ERROR_CODE__CANCELLED, "cancelled") > 0;
    for (int i = 0; i < s->n_active; i++) {
        work *w = s->active[i];
        if (w->job->conn_id == j->conn_id && w->job->req->id == target) {
            w->cancelled = true;
            found = true;
        }
    }
    if (found)
        send_ok(s, j);
    else
        send_error(s, j, LLMS__ERROR_CODE__NOT_FOUND, "no request %llu in flight",
                   (unsigned long long)target);
}

static void handle_request(sched *s, sched_job *j)
{
    if (is_engine_request(j->req->body_case)) {
        handle_engine_request(s, j);
        return;
    }
    if (kb_is_request(j->req->body_case)) {
        kb_handle(s->kb, j->conn_id, j->uid, j->app, j->req);
        job_free(j);
        return;
    }
    if (graphs_is_request(j->req->body_case)) {
        graphs_handle(&s->graphs, j->conn_id, j->uid, j->app, j->req);
        job_free(j);
        return;
    }
    switch (j->req->body_case) {
    case LLMS__REQUEST__BODY_CREATE_CONTEXT:
        handle_create(s, j);
        break;
    case LLMS__REQUEST__BODY_CANCEL:
        handle_cancel(s, j);
        break;
    case LLMS__REQUEST__BODY_DELETE_CONTEXT:
        handle_delete(s, j);
        break;
    case LLMS__REQUEST__BODY_LIST_CONTEXTS:
        send_contexts(s, j, false);
        break;
    case LLMS__REQUEST__BODY_GET_CONTEXT:
        handle_get_context(s, j);
        break;
    case LLMS__REQUEST__BODY_STATUS:
        handle_status(s, j);
        break;
    case LLMS__REQUEST__BODY_LIST_APPS:
        handle_list_apps(s, j);
        break;
    case LLMS__REQUEST__BODY_LIST_ALL_CONTEXTS:
        send_contexts(s, j, true);
        break;
    case LLMS__REQUEST__BODY_EVICT_CONTEXT:
        handle_evict(s, j);
        break;
    case LLMS__REQUEST__BODY_PROFILE:
        handle_profile(s, j);
        break;
    case LLMS__REQUEST__BODY_PLAN:
        handle_plan(s, j);
        break;
    case LLMS__REQUEST__BODY_LIST_MODELS:
        handle_list_models(s, j);
        break;
    case LLMS__REQUEST__BODY_TOKENIZE:
    case LLMS__REQUEST__BODY_DETOKENIZE:
        handle_tokens(s, j);
        break;
    case LLMS__REQUEST__BODY_LOAD_MODEL:
        handle_load_model(s, j);
        break;
    case LLMS__REQUEST__BODY_UNLOAD_MODEL:
        handle_unload_model(s, j);
        break;
    case LLMS__REQUEST__BODY_CACHE:
    case LLMS__REQUEST__BODY_CACHE_CLEAR:
    case LLMS__REQUEST__BODY_CACHE_TUNE:
        rag_handle_cache(s->rag, j->conn_id, j->uid, j->app, j->admin, j->req);
        break;
    default:
        send_error(s, j, LLMS__ERROR_CODE__UNIMPLEMENTED, "request body %d is not handled here",
                   (int)j->req->body_case);
        break;
    }
    job_free(j);
}

static void cancel_conn(sched *s, uint64_t conn_id, bool quiet)
{
    pend_remove(s, conn_id, true, 0, false, quiet, LLMS__ERROR_CODE__CANCELLED,
                "cancelled: the client does not read its replies");
    for (int i = 0; i < s->n_active; i++) {
        work *w = s->active[i];
        if (w->job->conn_id == conn_id) {
            w->cancelled = true;
            w->quiet |= quiet;
        }
    }
}

static void handle_job(sched *s, sched_job *j)
{
    app_state *a;
    switch (j->kind) {
    case SCHED_REQUEST:
        handle_request(s, j);
        return;
    case SCHED_BOUND:
        if ((a = app_get(s, j->uid, j->app)))
            a->n_conns++;
        break;
    case SCHED_CLOSED:
        a = j->app[0] ? app_get(s, j->uid, j->app) : NULL;
        if (a)
            a->n_conns--;
        cancel_conn(s, j->conn_id, true);
        if (a)
            app_reclaim(s, a);
        break;
    case SCHED_CANCEL_STREAMS:
        cancel_conn(s, j->conn_id, false);
        break;
    case SCHED_SHUTDOWN:
        s->shutting = true;
        pend_remove(s, 0, true, 0, false, false, LLMS__ERROR_CODE__UNAVAILABLE,
                    "the daemon is shutting down");
        for (int i = 0; i < s->n_active; i++)
            s->active[i]->cancelled = true;
        break;
    }
    job_free(j);
}

/* ---- admission ---- */

/* Starts an admitted job on gm: a generation or a semantic task. NULL when the job was
 * answered instead (an error); the job is then freed. */
static work *work_start(sched *s, genmodel *gm, sched_job *j, app_state *a, ctx_entry *c)
{
    work *w = calloc(1, sizeof *w);
    if (!w) {
        send_error(s, j, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        job_free(j);
        return NULL;
    }
    w->job = j;
    w->app = a;
    w->gm = gm;
    w->deadline_ns = job_deadline(j);
    Llms__Request__BodyCase body = j->req->body_case;
    if (body == LLMS__REQUEST__BODY_CALL || body == LLMS__REQUEST__BODY_COMPLETE ||
        body == LLMS__REQUEST__BODY_RAG_QUERY)
        w->g = gen_new(s, gm, j, c, NULL);
    else if (body == LLMS__REQUEST__BODY_GRAPH_RUN)
        w->gw = graph_work_new(s, j);
    else if (body == LLMS__REQUEST__BODY_KB_ADD || body == LLMS__REQUEST__BODY_KB_DROP)
        w->kt = kb_begin(s->kb, j->conn_id, j->uid, j->app, j->req);
    else
        w->t = semantic_begin(s->sem, j->conn_id, j->req);
    if (!w->g && !w->t && !w->gw && !w->kt) {
        work_free(w);
        return NULL;
    }
    return w;
}

/* Whether a pending job may start now: a Call waits while its context runs another
 * call, a rerank while the reranker runs one. */
static bool job_can_start(sched *s, const sched_job *j, ctx_entry **c)
{
    *c = NULL;
    switch (j->req->body_case) {
    case LLMS__REQUEST__BODY_CALL:
        *c = ctx_find_all(s, j->req->call->context_id, j->uid, j->app);
        return !*c || !(*c)->busy;
    case LLMS__REQUEST__BODY_COMPLETE:
    case LLMS__REQUEST__BODY_RAG_QUERY:
    case LLMS__REQUEST__BODY_GRAPH_RUN:
        return true;
    default:
        return semantic_can_begin(s->sem, j->req);
    }
}

/* The generate model a job runs on: a Call's context's, a Complete's by name (NULL +
 * err when it is not loaded any more), the default for the rest. */
static genmodel *job_model(sched *s, const sched_job *j, const ctx_entry *c,
                           Llms__ErrorCode *code, char err[ERR_MAX])
{
    models_entry *me;
    if (j->req->body_case == LLMS__REQUEST__BODY_CALL && c)
        return gm_of_ctx(s, c);
    if (j->req->body_case != LLMS__REQUEST__BODY_COMPLETE)
        return s->gm[0];
    *code = models_resolve(s->env.reg, j->req->complete->model, MODELS_GENERATE, &me, err);
    return *code == LLMS__ERROR_CODE__OK ? gm_of_entry(s, me) : NULL;
}

/* The most KV a Call or Complete on gm can hold: the context, the prompt (a token is at
 * least one byte, the template adds a few), the reply, at f16 (the heaviest precision),
 * or int8 for the full chunks when the policy compresses; 0 for other work. */
static size_t kv_need(const sched *s, const genmodel *gm, const sched_job *j,
                      const ctx_entry *c)
{
    const config *cfg = s->env.cfg;
    const Llms__GenerationParams *p;
    long tokens, limit;
    if (j->req->body_case == LLMS__REQUEST__BODY_CALL && c) {
        p = j->req->call->params ? j->req->call->params : c->defaults;
        tokens = c->n_tokens + (long)strlen(j->req->call->prompt) + SCHED_TEMPLATE_TOKENS;
        limit = cfg->max_tokens_per_context;
    } else if (j->req->body_case == LLMS__REQUEST__BODY_COMPLETE) {
        const Llms__CompleteRequest *cr = j->req->complete;
        p = cr->params;
        tokens = (long)strlen(cr->prompt) + SCHED_TEMPLATE_TOKENS +
                 (cr->system_prompt ? (long)strlen(cr->system_prompt) : 0);
        limit = cfg->n_ctx;
    } else if (j->req->body_case == LLMS__REQUEST__BODY_RAG_QUERY) {
        /* passages as long as the daemon's default; a knowledge base of longer ones may
         * exceed this estimate by what the claim at each step then finds */
        const Llms__RagQueryRequest *rq = j->req->rag_query;
        p = rq->params;
        int k = rq->has_top_k ? (int)rq->top_k : cfg->rag_top_k;
        tokens = (long)strlen(rq->question) + 2 * SCHED_TEMPLATE_TOKENS +
                 (long)k * (cfg->kb_passage_tokens + 8) +
                 (rq->system_prompt ? (long)strlen(rq->system_prompt)
                                    : (long)strlen(cfg->rag_system_prompt));
        limit = cfg->n_ctx;
    } else if (j->req->body_case == LLMS__REQUEST__BODY_GRAPH_RUN) {
        /* one generation node at a time: its prompt holds the inputs, a template, the
         * passages of a retrieval or two and earlier nodes' outputs; a graph whose
         * prompts are longer may exceed this estimate by what the claim at each step
         * then finds */
        const Llms__GraphRunRequest *gr = j->req->graph_run;
        p = gr->params;
        tokens = 4 * SCHED_TEMPLATE_TOKENS + 2L * cfg->rag_top_k * (cfg->kb_passage_tokens + 8) +
                 (p && p->has_max_tokens ? p->max_tokens : cfg->max_tokens);
        for (size_t i = 0; i < gr->n_inputs; i++)
            tokens += (long)strlen(gr->inputs[i]->value);
        limit = cfg->n_ctx;
    } else {
        return 0;
    }
    tokens += p && p->has_max_tokens ? p->max_tokens : cfg->max_tokens;
    tokens = tokens < limit ? tokens : limit;
    size_t chunks = (size_t)(tokens + KV_CHUNK_TOKENS - 1) / KV_CHUNK_TOKENS;
    kv_shape shape = model_kv_shape(gm->me->m);
    size_t f16 = kv_chunk_data_bytes(shape, KV_F16);
    /* Under pressure the call keeps its full chunks in int8 (step_claim), all but those
     * one step appends and the one being filled. */
    size_t hot = (size_t)(gm->step_tokens / KV_CHUNK_TOKENS + 2);
    if (ctx_get_policy(gm->cm)->compress == CTX_COMPRESS_NONE || chunks <= hot)
        return chunks * f16;
    return (chunks - hot) * kv_chunk_data_bytes(shape, KV_INT8) + hot * f16;
}

enum kv_fit { KV_FITS, KV_WAIT, KV_NEVER, KV_WAITED };

/* Whether a job's KV fits beside what the running work on its model may reach (each
 * generate model has its share of the budget): admitted work then never finds the
 * budget full (idle contexts are reclaimed for it). One that does not fit waits for
 * running work to end, up to kv_wait_ms; one that needs more than the whole share is
 * refused at once. */
static enum kv_fit kv_fit(const sched *s, const genmodel *gm, const sched_job *j, size_t need,
                          int64_t now)
{
    size_t budget = ctx_get_policy(gm->cm)->budget_bytes;
    if (!budget || need == 0)
        return KV_FITS;
    if (need > budget)
        return KV_NEVER;
    if (gm->kv_reserved + need <= budget)
        return KV_FITS;
    return now - j->queued_ns > (int64_t)s->env.cfg->kv_wait_ms * 1000000 ? KV_WAITED : KV_WAIT;
}

/* Answers a job that cannot get its KV. */
static void kv_refuse(sched *s, const genmodel *gm, const sched_job *j, enum kv_fit fit,
                      size_t need)
{
    size_t budget = ctx_get_policy(gm->cm)->budget_bytes;
    if (fit == KV_NEVER)
        send_error(s, j, LLMS__ERROR_CODE__RESOURCE_EXHAUSTED,
                   "this call may need %zu KiB of KV (the context, the prompt and max_tokens), "
                   "more than kv_budget_mb allows (%zu KiB): lower max_tokens or raise "
                   "kv_budget_mb", need >> 10, budget >> 10);
    else
        send_error(s, j, LLMS__ERROR_CODE__RESOURCE_EXHAUSTED,
                   "waited kv_wait_ms (%d ms) for %zu KiB of KV memory; running calls hold "
                   "%zu of %zu KiB", s->env.cfg->kv_wait_ms, need >> 10, gm->kv_reserved >> 10,
                   budget >> 10);
}

static void pred_end(sched *s, bool complete);

/* Admits pending jobs, one per app in turn, while there is room. */
static void admit(sched *s)
{
    int64_t now = mono_ns();
    bool progress = true;
    while (progress && s->n_active < SCHED_MAX_ACTIVE && s->n_pending > 0) {
        progress = false;
        app_state *start = s->rr && s->rr->next ? s->rr->next : s->apps;
        app_state *a = start;
        do {
            if (s->n_active >= SCHED_MAX_ACTIVE)
                break;
            sched_job **pp = &a->pend_head, *prev = NULL;
            while (*pp) {
                sched_job *j = *pp;
                ctx_entry *c;
                genmodel *gm = NULL;
                size_t need = 0;
                enum kv_fit fit = KV_WAIT;
                Llms__ErrorCode code = LLMS__ERROR_CODE__OK;
                char err[ERR_MAX];
                if (job_can_start(s, j, &c)) {
                    gm = job_model(s, j, c, &code, err);
                    need = gm ? kv_need(s, gm, j, c) : 0;
                    fit = gm ? kv_fit(s, gm, j, need, now) : KV_FITS;
                    if (fit != KV_FITS && s->pred && gm == s->gm[0]) {
                        /* prediction never holds memory a real request waits for */
                        pred_end(s, false);
                        fit = kv_fit(s, gm, j, need, now);
                    }
                }
                if (fit == KV_WAIT) {
                    prev = j;
                    pp = &j->next;
                    continue;
                }
                pend_unlink(s, a, pp, prev);
                progress = true;
                s->rr = a;
                if (!gm || fit != KV_FITS) {
                    a->n_queued--;
                    if (gm)
                        kv_refuse(s, gm, j, fit, need);
                    else
                        send_error(s, j, code, "%s", err);
                    job_free(j);
                    break;
                }
                if (j->req->body_case == LLMS__REQUEST__BODY_CALL && !c) {
                    a->n_queued--;
                    send_error(s, j, LLMS__ERROR_CODE__NOT_FOUND, "no context '%s'",
                               j->req->call->context_id);
                    job_free(j);
                    break;
                }
                work *w = work_start(s, gm, j, a, c);
                if (w) {
                    w->kv_reserved = need;
                    gm->kv_reserved += need;
                    s->active[s->n_active++] = w;
                } else {
                    a->n_queued--;
                }
                break;
            }
            a = a->next ? a->next : s->apps;
        } while (a != start);
    }
    /* Jobs answered here may have been their app's last. */
    for (app_state *a = s->apps, *next; a; a = next) {
        next = a->next;
        app_reclaim(s, a);
    }
}

/* Ends cancelled, expired, failed and finished work, and removes it from the active
 * set; answers queued requests whose deadline passed. */
static void reap(sched *s)
{
    int64_t now = mono_ns();
    pend_remove(s, 0, true, 0, true, false, LLMS__ERROR_CODE__DEADLINE_EXCEEDED,
                "the request's timeout passed while it was queued");
    int k = 0;
    bool ended = false;
    for (int i = 0; i < s->n_active; i++) {
        work *w = s->active[i];
        if (work_over(w, now)) {
            work_end(s, w);
            ended = true;
        } else {
            s->active[k++] = w;
        }
    }
    s->n_active = k;
    for (int m = 0; ended && m < SCHED_GEN_MAX; m++)
        if (s->gm[m])
            ctx_enforce_budget(s->gm[m]->cm);
}

/* ---- steps ---- */

/* Adds rows [from, from + n) of a generation's history to the step; the last row's
 * logits are wanted when it is the last token of the history. */
static void step_add_gen(sched *s, int *n_seq, int *n_out, work *w, int from, int n)
{
    gen *g = w->g;
    step_seq *st = &s->steps[(*n_seq)++];
    *st = (step_seq){.w = w, .seq = g->seq, .from = from};
    st->b = (model_batch){.n_tokens = n, .tokens = g->hist + from,
                          .positions = s->positions + from};
    if (from + n == g->n_hist) {
        st->last_row = n - 1;
        st->b.n_out = 1;
        st->b.out_rows = &st->last_row;
        st->b.logits = g->gm->logits + (size_t)(*n_out)++ * g->gm->n_vocab;
    }
    if (g->c)
        st->b.attn_received = g->c->attn;
}

/* The KV the step's generations append (on the step's model gm). */
static size_t step_append_bytes(const sched *s, const genmodel *gm, int n_seq)
{
    size_t total = 0;
    for (int i = 0; i < n_seq; i++)
        if (s->steps[i].w->g)
            total += ctx_append_bytes(gm->cm, s->steps[i].seq, s->steps[i].b.n_tokens);
    return total;
}

/* Claims KV memory under the budget for every generation's rows of the step, all
 * together; when that does not fit, the step's generations keep the full chunks they
 * made in int8 (ctx_squeeze: a long prompt's KV then exceeds the budget's f16 worth
 * while its prefill goes on), and when it still does not fit, one by one in step order,
 * failing those that do not fit. */
static void step_claim(sched *s, genmodel *gm, int n_seq)
{
    char err[ERR_MAX];
    size_t total = step_append_bytes(s, gm, n_seq);
    if (total == 0 || ctx_claim(gm->cm, total, err) == 0)
        return;
    size_t freed = 0;
    for (int i = 0; i < n_seq; i++) {
        const gen *g = s->steps[i].w->g;
        if (g)
            freed += ctx_squeeze(gm->cm, g->seq,
                                 g->c && g->seq == &g->c->seq ? g->c->call_base / KV_CHUNK_TOKENS
                                                              : 0);
    }
    if (freed) {
        total = step_append_bytes(s, gm, n_seq);
        if (total == 0 || ctx_claim(gm->cm, total, err) == 0)
            return;
    }
    size_t claimed = 0;
    for (int i = 0; i < n_seq; i++) {
        step_seq *st = &s->steps[i];
        if (!st->w->g)
            continue;
        size_t bytes = ctx_append_bytes(gm->cm, st->seq, st->b.n_tokens);
        int rc = ctx_claim(gm->cm, claimed + bytes, err);
        if (rc == 0) {
            claimed += bytes;
            continue;
        }
        st->failed = true;
        work_fail(st->w, rc == CTX_E_BUDGET ? LLMS__ERROR_CODE__RESOURCE_EXHAUSTED
                                            : LLMS__ERROR_CODE__INTERNAL, err);
    }
}

/* Evaluates the step's sequences (those not failed) in one forward; when the batch
 * fails, each sequence alone, so that one bad sequence fails only its own work. True
 * when the forward stopped at the runner's abort flag (model_runner_set_abort): nothing
 * was computed, the sequences are as before. */
static bool step_forward(sched *s, genmodel *gm, int n_seq)
{
    char err[ERR_MAX];
    int n = 0;
    for (int i = 0; i < n_seq; i++)
        if (!s->steps[i].failed) {
            s->step_seqs[n] = s->steps[i].seq;
            s->step_batches[n++] = s->steps[i].b;
        }
    if (n == 0)
        return false;
    int rc = model_forward_batch(gm->runner, n, s->step_seqs, s->step_batches, err);
    if (rc == 0 || rc == MODEL_ABORTED)
        return rc == MODEL_ABORTED;
    for (int i = 0; i < n_seq; i++) {
        step_seq *st = &s->steps[i];
        if (st->failed || model_forward_batch(gm->runner, 1, &st->seq, &st->b, err) == 0)
            continue;
        st->failed = true;
        work_fail(st->w, LLMS__ERROR_CODE__INTERNAL, err);
    }
    return false;
}

/* What the forward produced: tokens for generations whose last row was evaluated,
 * attention statistics of contexts, pooled rows of Embed texts. */
static void step_collect(sched *s, int n_seq)
{
    for (int i = 0; i < n_seq; i++) {
        step_seq *st = &s->steps[i];
        work *w = st->w;
        if (st->failed)
            continue;
        if (!w->g) {
            /* a KbAdd's embedding ending is not its end: its write is the next slice */
            int done = semantic_slice_done(w->kt ? kb_task_embedding(w->kt) : w->t);
            w->answered |= !w->kt && done == 1;
            if (w->kt)
                kb_task_progress(w->kt);
            continue;
        }
        gen *g = w->g;
        if (g->c)
            ctx_forward_account(g->c->cm, g->c, st->from, st->b.n_tokens);
        if (!st->b.n_out)
            continue;
        if (!g->prefilled) {
            g->prefilled = true;
            g->t_first = mono_ns();
        }
        g->refill = false;
        take_token(s, w, st->b.logits);
    }
}

/* Gives long work a slice of take rows: a generation's switch-in and prompt rows, an
 * Embed's text rows (both added to the step), or a rerank's advance. Returns the rows
 * it took. */
static int step_add_long(sched *s, int *n_seq, int *n_out, work *w, int take)
{
    char err[ERR_MAX];
    sem_task *t = w->kt ? kb_task_embedding(w->kt) : w->t;
    if (w->kt && (!t || !semantic_uses_slices(t) || semantic_rows_left(t) == 0)) {
        w->answered = kb_task_advance(w->kt, take) == 1;
        return take;
    }
    if (t && !semantic_uses_slices(t)) {
        w->answered = semantic_advance(t, take) == 1;
        return take;
    }
    if (t) {
        step_seq *st = &s->steps[(*n_seq)++];
        *st = (step_seq){.w = w};
        semantic_slice(t, take, &st->seq, &st->b);
        return st->b.n_tokens;
    }
    gen *g = w->g;
    if (!g->switched_in && gen_switch_in(g, err)) {
        work_fail(w, g->err_code, err);
        return 0;
    }
    int from = kv_seq_n_tokens(g->seq);
    if (!g->prefilled && g->n_eval == 0)
        g->n_eval = g->n_hist - from;
    int n = g->n_hist - from < take ? g->n_hist - from : take;
    /* A RagQuery's prompt, from scratch or resumed after a cached prefix, is cut at the
     * same places, so each row goes through the same kernels and the reuse stays exact. */
    int slice_end = g->rq ? rag_slice_end(g->rq, from, g->gm->step_tokens) : from + n;
    if (n > slice_end - from)
        n = slice_end - from;
    step_add_gen(s, n_seq, n_out, w, from, n);
    return n;
}

/* Offers the step's long-work rows on gm to the apps that have long work there, deficit
 * round robin: each gets a quantum per round, spends it on its requests in arrival
 * order, and keeps what a full step left it for the next (each model keeps its own
 * deficits). */
static void step_share_long_work(sched *s, genmodel *gm, int *n_seq, int *n_out, int budget)
{
    int k = gm_slot(s, gm), n_apps = 0;
    for (app_state *a = s->apps; a; a = a->next) {
        bool has = false;
        for (int i = 0; i < s->n_active && !has; i++)
            has = s->active[i]->app == a && s->active[i]->gm == gm &&
                  work_is_long(s->active[i]);
        if (has)
            n_apps++;
        else
            a->deficit[k] = 0;
    }
    if (n_apps == 0)
        return;
    long quantum = budget / n_apps > SCHED_MIN_QUANTUM ? budget / n_apps : SCHED_MIN_QUANTUM;
    app_state *start = s->drr_next[k] ? s->drr_next[k] : s->apps;
    app_state *a = start;
    do {
        bool has = false;
        for (int i = 0; i < s->n_active && budget > 0; i++) {
            work *w = s->active[i];
            if (w->app != a || w->gm != gm || work_over(w, 0) || !work_is_long(w) ||
                (w->g && w->g->done))
                continue;
            if (!has) {
                has = true;
                a->deficit[k] += quantum;
                if (a->deficit[k] > 2L * gm->step_tokens)
                    a->deficit[k] = 2L * gm->step_tokens;
            }
            long left = work_rows_left(w);
            long take = left < a->deficit[k] ? left : a->deficit[k];
            take = take < budget ? take : budget;
            if (take <= 0)
                break;
            int used = step_add_long(s, n_seq, n_out, w, (int)take);
            a->deficit[k] -= used;
            budget -= used;
        }
        a = a->next ? a->next : s->apps;
        if (budget <= 0) {
            s->drr_next[k] = a;
            break;
        }
    } while (a != start);
}

static void step_record(sched *s, int64_t t0, int rows)
{
    int64_t now = mono_ns();
    s->stats[s->n_steps % SCHED_STATS] =
        (step_stat){.end_ns = now, .ms = (double)(now - t0) / 1e6, .rows = rows,
                    .stall_ms = s->step_stall_ms};
    s->n_steps++;
    s->step_stall_ms = 0;
}

static int step_rows(const sched *s, int n_seq)
{
    int rows = 0;
    for (int i = 0; i < n_seq; i++)
        rows += s->steps[i].failed ? 0 : s->steps[i].b.n_tokens;
    return rows;
}

/* Every running graph's wavefront: each moves on to its next generation node (which
 * joins this cycle's step) or runs a sub-stage of its retrieval node. Retrieval
 * sub-stages go round the graphs again while the cycle's retrieval time budget lasts:
 * as long as the last step took (at least SCHED_RETRIEVAL_MIN_NS), so that retrieval and
 * generation each get about half of the worker's time when both are waiting. */
static void advance_graphs(sched *s)
{
    int64_t t0 = mono_ns(), budget = SCHED_RETRIEVAL_MIN_NS;
    if (s->n_steps) {
        int64_t last = (int64_t)(s->stats[(s->n_steps - 1) % SCHED_STATS].ms * 1e6);
        budget = last > budget ? last : budget;
    }
    bool retrieving = true;
    for (int round = 0; retrieving && (round == 0 || mono_ns() - t0 < budget); round++) {
        retrieving = false;
        for (int i = 0; i < s->n_active; i++) {
            work *w = s->active[i];
            if (!w->gw || (round > 0 && !w->gw->rt))
                continue;
            graph_advance(s, w);
            retrieving |= w->gw->rt != NULL && !work_over(w, 0);
        }
    }
}

/* One step on gm: a decode row for every generation past its prompt there, the
 * shared-out long work, one forward for all of it. */
static void run_step_on(sched *s, genmodel *gm)
{
    int64_t t0 = mono_ns();
    int n_seq = 0, n_out = 0;
    for (int i = 0; i < s->n_active; i++) {
        work *w = s->active[i];
        if (w->gm == gm && w->g && gen_decoding(w->g) && !w->g->done && !work_over(w, 0))
            step_add_gen(s, &n_seq, &n_out, w, w->g->n_hist - 1, 1);
    }
    step_share_long_work(s, gm, &n_seq, &n_out, gm->step_tokens);
    step_claim(s, gm, n_seq);
    step_forward(s, gm, n_seq);
    step_collect(s, n_seq);
    if (n_seq)
        step_record(s, t0, step_rows(s, n_seq));
}

/* One step on every generate model that has work: each its own batched forward (its
 * weights, its KV), the models one after another. */
static void run_step(sched *s)
{
    for (int k = 0; k < SCHED_GEN_MAX; k++)
        if (s->gm[k])
            run_step_on(s, s->gm[k]);
}

/* sched = serial, the behaviour before the step scheduler: every request in turn gets its
 * own forward, and long work runs to completion. */
static void run_serial(sched *s)
{
    for (int i = 0; i < s->n_active; i++) {
        work *w = s->active[i];
        /* a graph between nodes, or whose node just finished, waits for advance_graphs */
        while (!work_over(w, mono_ns()) && (w->t || w->kt || (w->g && !w->g->done))) {
            int64_t t0 = mono_ns();
            int n_seq = 0, n_out = 0;
            if (w->g && gen_decoding(w->g))
                step_add_gen(s, &n_seq, &n_out, w, w->g->n_hist - 1, 1);
            else
                step_add_long(s, &n_seq, &n_out, w, w->gm->max_batch);
            step_claim(s, w->gm, n_seq);
            step_forward(s, w->gm, n_seq);
            step_collect(s, n_seq);
            if (n_seq)
                step_record(s, t0, step_rows(s, n_seq));
            if (w->g && gen_decoding(w->g))
                break; /* one token per generation per round */
        }
    }
}

/* The swap-out thread wrote a batch: the worker commits it when it next comes round. */
static void sched_writes_done(void *arg)
{
    sched *s = arg;
    pthread_mutex_lock(&s->lock);
    s->writes_done = true;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->lock);
}

/* ---- idle-time work: layer calibration, IVF training and hot copies, prediction ---- */

/* Whether idle-time work may run: nothing real queued or running, and no engine request
 * for idle_after_ms. */
static bool sched_idle(const sched *s, int64_t now)
{
    return !s->shutting && s->n_active == 0 && s->n_pending == 0 &&
           now - s->last_req_ns >= (int64_t)s->env.cfg->idle_after_ms * 1000000;
}

static bool pred_idle(const sched *s, int64_t now)
{
    return predict_enabled(s->predict) && sched_idle(s, now);
}

/* Whether the queue is empty; then the preempt flag is lowered for an idle-time forward
 * (a job submitted from now on raises it again). */
static bool idle_claim(sched *s)
{
    pthread_mutex_lock(&s->lock);
    bool queued = s->in_head != NULL;
    if (!queued)
        atomic_store(&s->idle_preempt, false);
    pthread_mutex_unlock(&s->lock);
    return !queued;
}

/* Whether one-off idle-time work (not prediction's) may run now: the daemon is idle, no
 * prediction task is half done, and the queue is empty (the preempt flag lowered). */
static bool idle_turn(sched *s)
{
    return sched_idle(s, mono_ns()) && !s->pred && idle_claim(s);
}

/* The generate model with a layer calibration waiting for idle time, or NULL. */
static genmodel *calib_waiting(const sched *s)
{
    for (int k = 0; k < SCHED_GEN_MAX; k++)
        if (s->gm[k] && ctx_calib_forwards_left(s->gm[k]->cm) > 0)
            return s->gm[k];
    return NULL;
}

/* Refreshes the hot copies of the IVF lists searched since the last refresh while the
 * daemon is idle (a copy of up to kb_ivf_hot_mb); whether it did. */
static bool hot_run(sched *s)
{
    if (!kb_ivf_hot_stale(s->kb) || !idle_turn(s))
        return false;
    kb_ivf_refresh_hot(s->kb);
    return true;
}

/* Deletes a slice of the rows a cut-short KbDrop left (a cancelled drop, a crash)
 * while the daemon is idle, a step's rows of work; whether it did. */
static bool drop_run(sched *s)
{
    if (!kb_drop_pending(s->kb) || !idle_turn(s))
        return false;
    kb_drop_idle(s->kb, s->gm[0]->step_tokens);
    return true;
}

/* Trains an IVF index a knowledge base waits for while the daemon is idle (the worker
 * is busy with it for its k-means; a request that comes meanwhile waits for the end);
 * whether it did. */
static bool train_run(sched *s)
{
    if (!kb_ivf_train_pending(s->kb) || !idle_turn(s))
        return false;
    kb_ivf_train_idle(s->kb);
    return true;
}

/* One forward of a layer calibration while the daemon is idle, on one thread and given
 * up at the next layer when a job comes (it runs again later); whether one ran. Before
 * prediction, which has a budget every idle period: a calibration happens once. */
static bool calib_run(sched *s)
{
    genmodel *gm = calib_waiting(s);
    if (!gm || !idle_turn(s))
        return false;
    model_runner_set_background(gm->runner, true);
    model_runner_set_abort(gm->runner, &s->idle_preempt);
    ctx_calib_idle_step(gm->cm);
    model_runner_set_abort(gm->runner, NULL);
    model_runner_set_background(gm->runner, false);
    return true;
}

/* Ends the prediction work: what it computed goes to the caches and the predictor
 * (complete), or is dropped. */
static void pred_end(sched *s, bool complete)
{
    work *w = s->pred;
    gen *g = w->g;
    enum predict_end how = PREDICT_DROPPED;
    if (complete && !w->failed && g->prefilled) {
        char tail[STOP_MAX_LEN + 1];
        release_text(s, w, tail, stop_flush(&g->stop, tail), true, NULL, 0);
        if (g->rq)
            rag_populate(s->rag, g->rq, g->seq, g->shown ? g->shown : "");
        how = PREDICT_RAN;
    }
    predict_done(s->predict, &s->pred_task, how, g->shown ? g->shown : "");
    predict_task_clear(&s->pred_task);
    genmodel *gm = w->gm;
    gm->kv_reserved -= w->kv_reserved;
    gen_free(g);
    free(w);
    s->pred = NULL;
    s->pred_paused = false;
    ctx_enforce_budget(gm->cm);
}

/* Builds the request of the predictor's task t in the scheduler's own slots. */
static void pred_request(sched *s, const predict_task *t)
{
    sched_job *j = &s->pred_job;
    memset(j, 0, sizeof *j);
    j->kind = SCHED_REQUEST;
    j->uid = t->uid;
    snprintf(j->app, sizeof j->app, "%s", t->app);
    j->queued_ns = mono_ns();
    j->req = &s->pred_req;
    llms__request__init(&s->pred_req);
    llms__generation_params__init(&s->pred_params);
    if (t->kind == PREDICT_QUERY || t->kind == PREDICT_WARM) {
        llms__rag_query_request__init(&s->pred_rag);
        s->pred_rag.kb = (char *)t->kb;
        s->pred_rag.question = t->text;
        /* decoded: the daemon's settings, as a real query without its own gets, so the
         * stored answer is the one it would get */
        if (!t->decode) {
            s->pred_params.has_max_tokens = 1;
            s->pred_params.max_tokens = 1;
            s->pred_rag.params = &s->pred_params;
        }
        s->pred_req.body_case = LLMS__REQUEST__BODY_RAG_QUERY;
        s->pred_req.rag_query = &s->pred_rag;
    } else {
        llms__complete_request__init(&s->pred_complete);
        s->pred_complete.prompt = t->text;
        s->pred_complete.has_chat = 1;
        s->pred_complete.chat = 1;
        s->pred_params.has_temperature = 1;
        s->pred_params.temperature = 0;
        s->pred_params.has_max_tokens = 1;
        s->pred_params.max_tokens = t->max_tokens;
        s->pred_complete.params = &s->pred_params;
        s->pred_req.body_case = LLMS__REQUEST__BODY_COMPLETE;
        s->pred_req.complete = &s->pred_complete;
    }
}

/* Starts the predictor's next task that has something to compute; false when none. */
static bool pred_start(sched *s)
{
    predict_task *t = &s->pred_task;
    while (predict_next(s->predict, rag_tau(s->rag), rag_qkv_room(s->rag), t)) {
        int64_t t0 = mono_ns();
        pred_request(s, t);
        genmodel *gm = s->gm[0];
        size_t need = kv_need(s, gm, &s->pred_job, NULL);
        work *w = kv_fit(s, gm, &s->pred_job, need, t0) == KV_FITS ? calloc(1, sizeof *w) : NULL;
        if (!w) {
            /* no room now: real work holds the memory */
            predict_done(s->predict, t, PREDICT_DROPPED, NULL);
            predict_task_clear(t);
            return false;
        }
        w->job = &s->pred_job;
        w->gm = gm;
        w->quiet = true;
        s->pred_cached = false;
        w->g = gen_new(s, gm, &s->pred_job, NULL, NULL);
        predict_count_ms(s->predict, (double)(mono_ns() - t0) / 1e6);
        if (!w->g) {
            free(w);
            predict_done(s->predict, t, s->pred_cached ? PREDICT_CACHED : PREDICT_DROPPED, NULL);
            predict_task_clear(t);
            continue;
        }
        w->kv_reserved = need;
        gm->kv_reserved += need;
        s->pred = w;
        return true;
    }
    return false;
}

/* One step of prediction work while the daemon is idle: a slice of its prompt or one
 * token, alone in the forward (a real request arriving meanwhile waits for this one
 * step at most). */
static void pred_run(sched *s)
{
    if (!pred_idle(s, mono_ns()) || !idle_claim(s) || (!s->pred && !pred_start(s)))
        return;
    s->pred_paused = false;
    work *w = s->pred;
    int64_t t0 = mono_ns();
    int n_seq = 0, n_out = 0;
    if (gen_decoding(w->g))
        step_add_gen(s, &n_seq, &n_out, w, w->g->n_hist - 1, 1);
    else
        step_add_long(s, &n_seq, &n_out, w, w->gm->step_tokens);
    step_claim(s, w->gm, n_seq);
    /* on one thread: a core stays free for a request that arrives, and the pool's
     * adaptation keeps what real steps taught it (with the cores all its own, idle-time
     * work made it share the real steps' jobs again, 5-6% slower on TinyStories-656K in
     * bench/rag) */
    model_runner_set_background(w->gm->runner, true);
    model_runner_set_abort(w->gm->runner, &s->idle_preempt);
    bool aborted = step_forward(s, w->gm, n_seq);
    model_runner_set_abort(w->gm->runner, NULL);
    model_runner_set_background(w->gm->runner, false);
    if (aborted) {
        predict_count_ms(s->predict, (double)(mono_ns() - t0) / 1e6);
        return;
    }
    step_collect(s, n_seq);
    if (n_seq) {
        step_record(s, t0, step_rows(s, n_seq));
        predict_count_step(s->predict, (double)(mono_ns() - t0) / 1e6);
    }
    if (work_over(w, mono_ns()))
        pred_end(s, true);
}

/* How long the worker may sleep before idle-time work is due: -1 until a job comes,
 * 0 none. */
static int64_t idle_wait_ns(sched *s)
{
    bool pred_work = predict_enabled(s->predict) &&
                     (s->pred || predict_has_work(s->predict, rag_tau(s->rag),
                                                  rag_qkv_room(s->rag)));
    if (s->shutting || (!pred_work && !calib_waiting(s) && !kb_ivf_hot_stale(s->kb) &&
                        !kb_ivf_train_pending(s->kb) && !kb_drop_pending(s->kb)))
        return -1;
    int64_t left = s->last_req_ns + (int64_t)s->env.cfg->idle_after_ms * 1000000 - mono_ns();
    return left > 0 ? left : 0;
}

static void *worker(void *arg)
{
    sched *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->lock);
        while (!s->in_head && s->n_active == 0 && s->n_pending == 0 && !s->shutting &&
               !s->writes_done) {
            int64_t wait = idle_wait_ns(s);
            if (wait == 0)
                break;
            if (wait < 0) {
                pthread_cond_wait(&s->wake, &s->lock);
                continue;
            }
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            int64_t ns = ts.tv_nsec + wait % 1000000000;
            ts.tv_sec += (time_t)(wait / 1000000000 + ns / 1000000000);
            ts.tv_nsec = (long)(ns % 1000000000);
            pthread_cond_timedwait(&s->wake, &s->lock, &ts);
        }
        sched_job *j = s->in_head;
        s->in_head = s->in_tail = NULL;
        s->writes_done = false;
        pthread_mutex_unlock(&s->lock);
        for (int k = 0; k < SCHED_GEN_MAX; k++)
            if (s->gm[k])
                ctx_collect_writes(s->gm[k]->cm);
        while (j) {
            sched_job *next = j->next;
            handle_job(s, j);
            j = next;
        }
        outq_wake(s->env.out);
        reap(s);
        admit(s);
        advance_graphs(s);
        if (s->serial)
            run_serial(s);
        else
            run_step(s);
        reap(s);
        if (s->n_active || s->n_pending)
            s->last_req_ns = mono_ns();
        if (!calib_run(s) && !drop_run(s) && !train_run(s) && !hot_run(s))
            pred_run(s);
        outq_wake(s->env.out);
        if (s->shutting && s->n_active == 0 && s->n_pending == 0)
            break;
    }
    if (s->pred)
        pred_end(s, false);
    outq_push_end(s->env.out);
    return NULL;
}

/* ---- lifecycle ---- */

sched *sched_new(const sched_env *env, char err[ERR_MAX])
{
    sched *s = calloc(1, sizeof *s);
    if (!s) {
        err_set(err, "out of memory");
        return NULL;
    }
    s->env = *env;
    const config *cfg = env->cfg;
    s->start_ms = wall_ms();
    s->last_req_ns = mono_ns();
    s->serial = strcmp(cfg->sched, "serial") == 0;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->wake, NULL);
    s->positions = malloc(sizeof *s->positions * (size_t)cfg->n_ctx);
    if (!s->positions) {
        err_set(err, "out of memory");
        goto fail;
    }
    for (int i = 0; i < cfg->n_ctx; i++)
        s->positions[i] = i;
    /* The default generate model first: it keeps the contexts of models not loaded. */
    for (models_entry *e = (models_entry *)models_first(env->reg); e; e = e->next)
        if ((e->roles & MODELS_GENERATE) &&
            gm_add(s, e, e == models_generate(env->reg) ? env->tok : NULL, err) < 0)
            goto fail;
    kv_budget_split(s);
    atomic_store(&s->n_contexts, (unsigned)ctx_count_all(s));
    semantic_env se = {cfg, env->reg, env->m, env->tok, s->gm[0]->runner, s->gm[0]->pool,
                       s->gm[0]->max_batch, env->st, env->out};
    s->sem = semantic_new(&se, err);
    if (!s->sem)
        goto fail;
    kb_env ke = {cfg, env->st, env->out, env->tok, s->sem};
    if (!(s->kb = kb_new(&ke, err)))
        goto fail;
    if (!(s->predict = predict_new(cfg, env->st, err)))
        goto fail;
    rag_env re = {cfg, models_generate(env->reg)->path, env->st, env->out, env->tok, env->family,
                  model_kv_shape(env->m), s->kb, s->sem, s->predict};
    if (!(s->rag = rag_new(&re, err)))
        goto fail;
    s->graphs = (graphs_env){cfg, env->st, env->out};
    return s;
fail:
    sched_free(s);
    return NULL;
}

int sched_start(sched *s, char err[ERR_MAX])
{
    int rc = pthread_create(&s->thread, NULL, worker, s);
    if (rc)
        return err_set(err, "pthread_create: %s", strerror(rc));
    s->started = true;
    return 0;
}

sched_job *sched_job_new(enum sched_job_kind kind, uint64_t conn_id)
{
    sched_job *j = calloc(1, sizeof *j);
    if (j) {
        j->kind = kind;
        j->conn_id = conn_id;
        j->queued_ns = mono_ns();
    }
    return j;
}

void sched_submit(sched *s, sched_job *j)
{
    j->next = NULL;
    pthread_mutex_lock(&s->lock);
    if (s->in_tail)
        s->in_tail->next = j;
    else
        s->in_head = j;
    s->in_tail = j;
    atomic_store(&s->idle_preempt, true);
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->lock);
}

void sched_set_connections(sched *s, unsigned n)
{
    atomic_store(&s->n_connections, n);
}

unsigned sched_n_contexts(const sched *s)
{
    return atomic_load(&((sched *)s)->n_contexts);
}

void sched_free(sched *s)
{
    if (!s)
        return;
    if (s->started)
        pthread_join(s->thread, NULL);
    for (int i = 0; i < s->n_active; i++)
        work_free(s->active[i]);
    pend_remove(s, 0, true, 0, false, true, LLMS__ERROR_CODE__UNAVAILABLE, "");
    sched_job *j = s->in_head;
    while (j) {
        sched_job *next = j->next;
        job_free(j);
        j = next;
    }
    app_state *a = s->apps;
    while (a) {
        app_state *next = a->next;
        free(a);
        a = next;
    }
    rag_free(s->rag);
    predict_free(s->predict);
    kb_free(s->kb);
    semantic_free(s->sem);
    for (int k = 0; k < SCHED_GEN_MAX; k++)
        genmodel_free(s->gm[k]);
    free(s->positions);
    free(s->steps);
    free(s->step_seqs);
    free(s->step_batches);
    pthread_cond_destroy(&s->wake);
    pthread_mutex_destroy(&s->lock);
    free(s);
}
