/*
 * sched.c — the worker: job inbox, per-app queues, interleaved generations, and the
 * handlers of every request that touches contexts or the engine.
 */
#include "daemon/sched.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon/ctxmgr.h"
#include "daemon/prompt.h"
#include "daemon/resp.h"
#include "daemon/semantic.h"
#include "engine/kv.h"
#include "engine/sampler.h"
#include "engine/stop.h"

#define SCHED_MAX_ACTIVE 64 /* generations advancing together */
#define PIECE_MAX 256

typedef struct app_state {
    uint32_t uid;
    char name[SCHED_APP_MAX + 1];
    int n_conns;
    int n_queued;                  /* Call/Complete waiting or running */
    sched_job *pend_head, *pend_tail;
    struct app_state *next;
} app_state;

typedef struct gen {
    sched_job *job;
    app_state *app;
    ctx_entry *c;          /* NULL for Complete */
    kv_seq own_seq;        /* Complete's KV */
    kv_seq *seq;
    int32_t *hist;         /* (limit) the context's tokens, the turn's, the generated */
    int n_hist;
    int n_base;            /* tokens of the context before this call */
    int n_turn;            /* tokens the turn adds: hist[n_base .. n_base + n_turn) */
    int limit;             /* most tokens hist may reach */
    int max_gen, n_gen;
    bool prefilled;
    int n_eval;            /* tokens evaluated by the prefill step */
    const char *user_role;
    char *shown;           /* text released to the client (stop strings held back) */
    size_t shown_len, shown_cap;
    sampler *smp;
    stop_matcher stop;
    bool cancelled, quiet, done;
    Llms__ErrorCode err_code;  /* of a failed step */
    Llms__StopReason reason;
    int64_t t_start, t_first, t_end;
} gen;

struct sched {
    sched_env env;
    model_runner *runner;
    kv_pool *pool;
    ctxmgr *cm;
    semantic *sem;         /* Embed, Rerank, RerankCalibrate */
    float *logits;         /* (n_vocab) one step's output row */
    int32_t *positions;    /* (n_ctx) */

    pthread_t thread;
    bool started;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    sched_job *in_head, *in_tail; /* under lock */

    app_state *apps;
    app_state *rr;         /* the app admission starts after */
    gen *active[SCHED_MAX_ACTIVE];
    int n_active;
    int n_pending;
    bool shutting;
    int64_t start_ms;
    atomic_uint n_connections;
    atomic_uint n_contexts;
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
    uint8_t *buf;
    size_t len;
    if (resp_pack(r, s->env.cfg->max_frame_bytes, &buf, &len) == 0)
        outq_push(s->env.out, conn_id, buf, len, droppable);
}

static void send_error(sched *s, const sched_job *j, Llms__ErrorCode code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void send_error(sched *s, const sched_job *j, Llms__ErrorCode code, const char *fmt, ...)
{
    uint8_t *buf;
    size_t len;
    va_list ap;
    va_start(ap, fmt);
    if (resp_error_v(j->req->id, code, s->env.cfg->max_frame_bytes, &buf, &len, fmt, ap) == 0)
        outq_push(s->env.out, j->conn_id, buf, len, false);
    va_end(ap);
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
    info->memory = ctx_kv_bytes(s->cm, c) > 0 ? LLMS__MEMORY_STATE__MEMORY_RESIDENT
                   : ctx_on_disk(c)           ? LLMS__MEMORY_STATE__MEMORY_ON_DISK
                                              : LLMS__MEMORY_STATE__MEMORY_NONE;
    info->system_prompt = c->system_prompt;
    info->defaults = c->defaults;
    info->has_kv_bytes = 1;
    info->kv_bytes = ctx_kv_bytes(s->cm, c);
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

static void send_contexts(sched *s, const sched_job *j, bool all)
{
    int n = 0;
    for (ctx_entry *c = ctx_first(s->cm); c; c = c->next)
        n += all || (c->uid == j->uid && strcmp(c->app_name, j->app) == 0);
    Llms__ContextInfo *infos = calloc((size_t)n + 1, sizeof *infos);
    Llms__ContextInfo **ptrs = calloc((size_t)n + 1, sizeof *ptrs);
    if (!infos || !ptrs) {
        free(infos);
        free(ptrs);
        send_error(s, j, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        return;
    }
    int k = 0;
    for (ctx_entry *c = ctx_first(s->cm); c; c = c->next) {
        if (!all && (c->uid != j->uid || strcmp(c->app_name, j->app) != 0))
            continue;
        fill_info(s, c, all, false, &infos[k], NULL, NULL);
        ptrs[k] = &infos[k];
        k++;
    }
    Llms__ListContextsResponse lr = LLMS__LIST_CONTEXTS_RESPONSE__INIT;
    lr.n_contexts = (size_t)k;
    lr.contexts = ptrs;
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
    ctx_entry *c = any ? ctx_find_any(s->cm, g->context_id)
                       : ctx_find(s->cm, g->context_id, j->uid, j->app);
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
            int p = k ? (int)k->precision : c->map[i].disk_precision;
            chunks[i].bits = p >= 0 ? (uint32_t)kv_precision_bits((enum kv_precision)p) : 0;
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
    int have = ctx_count_app(s->cm, j->uid, j->app);
    if (have >= s->env.cfg->max_contexts_per_app) {
        send_error(s, j, LLMS__ERROR_CODE__RESOURCE_EXHAUSTED,
                   "app has %d contexts, the limit (max_contexts_per_app)", have);
        return;
    }
    if (cr->defaults && cr->defaults->n_stop >= STOP_MAX) {
        send_error(s, j, LLMS__ERROR_CODE__INVALID_ARGUMENT, "at most %d stop strings",
                   STOP_MAX - 1);
        return;
    }
    char err[ERR_MAX];
    ctx_entry *c;
    if (ctx_create(s->cm, j->uid, j->app, cr->system_prompt, cr->defaults, wall_ms(), &c, err)) {
        send_error(s, j, LLMS__ERROR_CODE__INTERNAL, "create context: %s", err);
        return;
    }
    atomic_store(&s->n_contexts, (unsigned)ctx_count(s->cm));
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
    ctx_entry *c = ctx_find(s->cm, id, j->uid, j->app);
    char err[ERR_MAX];
    if (!c)
        send_error(s, j, LLMS__ERROR_CODE__NOT_FOUND, "no context '%s'", id);
    else if (c->busy)
        send_error(s, j, LLMS__ERROR_CODE__FAILED_PRECONDITION, "context '%s' has a call running", id);
    else if (ctx_delete(s->cm, c, err))
        send_error(s, j, LLMS__ERROR_CODE__INTERNAL, "delete context: %s", err);
    else {
        atomic_store(&s->n_contexts, (unsigned)ctx_count(s->cm));
        send_ok(s, j);
    }
}

static void handle_evict(sched *s, const sched_job *j)
{
    const char *id = j->req->evict_context->context_id;
    ctx_entry *c = ctx_find_any(s->cm, id);
    if (!c)
        send_error(s, j, LLMS__ERROR_CODE__NOT_FOUND, "no context '%s'", id);
    else if (c->busy)
        send_error(s, j, LLMS__ERROR_CODE__FAILED_PRECONDITION, "context '%s' has a call running", id);
    else {
        ctx_evict(s->cm, c);
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

static void handle_status(sched *s, const sched_job *j)
{
    static const char *arch[] = {"llama", "qwen2", "qwen3"};
    const model_hparams *hp = model_hparams_of(s->env.m);
    Llms__StatusResponse st = LLMS__STATUS_RESPONSE__INIT;
    st.version = "0.1";
    st.model_path = (char *)s->env.model_path;
    st.model_arch = (char *)arch[hp->arch];
    const gguf_file *gf = model_gguf(s->env.m);
    for (int64_t i = 0; i < gguf_n_tensors(gf); i++)
        st.model_bytes += gguf_tensor_at(gf, i)->bytes;
    st.n_ctx = (uint32_t)s->env.cfg->n_ctx;
    st.threads = (uint32_t)model_runner_n_threads(s->runner);
    st.uptime_ms = (uint64_t)(wall_ms() - s->start_ms);
    st.n_connections = atomic_load(&s->n_connections);
    for (app_state *a = s->apps; a; a = a->next)
        st.n_apps++;
    st.n_contexts = (uint32_t)ctx_count(s->cm);
    st.n_resident_contexts = (uint32_t)ctx_count_resident(s->cm);
    st.kv_bytes_resident = ctx_kv_bytes_total(s->cm);
    st.queued_requests = (uint32_t)s->n_pending;
    st.running_requests = (uint32_t)s->n_active;
    st.rss_bytes = rss_bytes();
    const ctx_stats *cs = ctx_get_stats(s->cm);
    st.has_kv_budget_bytes = st.has_swap_bytes_written = st.has_swap_bytes_read = 1;
    st.has_swap_chunks_written = st.has_swap_chunks_read = st.has_swap_chunks_recomputed = 1;
    st.has_swap_faults = st.has_swap_bad_blobs = st.has_switch_ins = st.has_switch_in_mean_ms = 1;
    st.kv_budget_bytes = ctx_get_policy(s->cm)->budget_bytes;
    st.swap_bytes_written = cs->bytes_written;
    st.swap_bytes_read = cs->bytes_read;
    st.swap_chunks_written = cs->chunks_written;
    st.swap_chunks_read = cs->chunks_read;
    st.swap_chunks_recomputed = cs->chunks_recomputed;
    st.swap_faults = cs->faults;
    st.swap_bad_blobs = cs->bad_blobs;
    st.switch_ins = cs->switch_ins;
    st.switch_in_mean_ms = cs->switch_ins ? cs->switch_in_ms / (double)cs->switch_ins : 0;
    Llms__Response r = LLMS__RESPONSE__INIT;
    r.id = j->req->id;
    r.final = 1;
    r.body_case = LLMS__RESPONSE__BODY_STATUS;
    r.status = &st;
    send_resp(s, j->conn_id, &r, false);
}

static void handle_profile(sched *s, const sched_job *j)
{
    char err[ERR_MAX];
    ctx_cost k;
    if (ctx_profile(s->cm, &k, err)) {
        send_error(s, j, LLMS__ERROR_CODE__INTERNAL, "profile: %s", err);
        return;
    }
    Llms__ProfileResponse p = LLMS__PROFILE_RESPONSE__INIT;
    p.rec_a = k.rec_a;
    p.rec_b = k.rec_b;
    p.rec_c = k.rec_c;
    p.io_d = k.io_d;
    p.io_e = k.io_e;
    Llms__Response r = LLMS__RESPONSE__INIT;
    r.id = j->req->id;
    r.final = 1;
    r.body_case = LLMS__RESPONSE__BODY_PROFILE;
    r.profile = &p;
    send_resp(s, j->conn_id, &r, false);
}

static void handle_list_apps(sched *s, const sched_job *j)
{
    /* Apps that have contexts are listed even when none is connected. */
    for (ctx_entry *c = ctx_first(s->cm); c; c = c->next)
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
        infos[k].n_contexts = (uint32_t)ctx_count_app(s->cm, a->uid, a->name);
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
    if (!g->c)
        kv_seq_free(&g->own_seq);
    free(g->hist);
    free(g->shown);
    sampler_free(g->smp);
    job_free(g->job);
    free(g);
}

static int append_text(char **buf, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 256;
        while (c < *len + n + 1)
            c *= 2;
        char *p = realloc(*buf, c);
        if (!p)
            return -1;
        *buf = p;
        *cap = c;
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = '\0';
    return 0;
}

/*
 * Builds a generation for a Call or Complete job. Returns NULL after answering the job
 * with an error (and freeing it).
 */
static gen *gen_new(sched *s, sched_job *j, app_state *app, ctx_entry *c)
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
    g->job = j;
    g->app = app;
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
        if (prompt_turn(s->env.tok, s->env.family, c, cr->prompt, !templated, &turn, &n_turn, err))
            goto fail;
        g->seq = &c->seq;
        g->n_base = c->n_tokens;
        g->limit = cfg->max_tokens_per_context;
        merge_params(cfg, c->defaults, req_p, &sp, &g->max_gen, &stops_p);
    } else {
        Llms__CompleteRequest *cr = j->req->complete;
        templated = cr->has_chat && cr->chat;
        req_p = cr->params;
        char *text = prompt_complete_text(s->env.family, cr->prompt, templated, cr->system_prompt, err);
        if (!text)
            goto fail;
        int rc = prompt_tokenize(s->env.tok, text, strlen(text), true, true, &turn, &n_turn, err);
        free(text);
        if (rc)
            goto fail;
        kv_seq_init(&g->own_seq, s->pool);
        g->seq = &g->own_seq;
        g->limit = cfg->n_ctx;
        merge_params(cfg, NULL, req_p, &sp, &g->max_gen, &stops_p);
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
    if (g->n_base + n_turn >= g->limit) {
        code = LLMS__ERROR_CODE__RESOURCE_EXHAUSTED;
        err_set(err, "context would hold %d tokens, the limit is %d", g->n_base + n_turn + 1,
                g->limit);
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
        stops[n_stops++] = chat_stop_text(s->env.family);
    if (stop_init(&g->stop, stops, n_stops, err))
        goto fail;
    g->smp = sampler_new(model_hparams_of(s->env.m)->n_vocab, &sp, err);
    if (!g->smp)
        goto fail;
    code = LLMS__ERROR_CODE__INTERNAL;
    g->hist = malloc(sizeof *g->hist * (size_t)g->limit);
    if (!g->hist) {
        err_set(err, "out of memory");
        goto fail;
    }
    if (c && c->n_tokens)
        memcpy(g->hist, c->tokens, sizeof *g->hist * (size_t)c->n_tokens);
    memcpy(g->hist + g->n_base, turn, sizeof *turn * (size_t)n_turn);
    g->n_turn = n_turn;
    g->n_hist = g->n_base + n_turn;
    free(turn);
    if (c) {
        c->busy = true;
        c->last_used_ms = wall_ms();
    }
    return g;
fail:
    free(turn);
    send_error(s, j, code, "%s", err);
    if (g) {
        if (g->seq == &g->own_seq)
            kv_seq_free(&g->own_seq);
        free(g->hist);
        sampler_free(g->smp);
        free(g);
    }
    job_free(j);
    return NULL;
}

/* Streams text (NUL-terminated) and the tokens that produced it. */
static void send_chunk(sched *s, gen *g, char *text, const int32_t *tok, int n_tok)
{
    if (g->quiet)
        return;
    Llms__CallChunk ch = LLMS__CALL_CHUNK__INIT;
    ch.text = text;
    ch.n_tokens = (size_t)n_tok;
    ch.tokens = (int32_t *)tok;
    Llms__Response r = LLMS__RESPONSE__INIT;
    r.id = g->job->req->id;
    r.final = 0;
    r.body_case = LLMS__RESPONSE__BODY_CHUNK;
    r.chunk = &ch;
    send_resp(s, g->job->conn_id, &r, true);
}

static void finish(gen *g, Llms__StopReason reason)
{
    g->done = true;
    g->reason = reason;
}

/* Takes the token sampled from the logits of the last step. */
static void take_token(sched *s, gen *g)
{
    int32_t next = sampler_sample(g->smp, s->logits, g->hist, g->n_hist);
    if (next < 0 || tok_is_eog(s->env.tok, next)) {
        finish(g, LLMS__STOP_REASON__STOP_EOS);
        return;
    }
    g->hist[g->n_hist++] = next;
    g->n_gen++;
    char piece[PIECE_MAX], shown[STOP_OUT_CAP(PIECE_MAX) + 1];
    int len = tok_piece(s->env.tok, next, piece, sizeof piece);
    if (len < 0)
        len = 0;
    if (len > PIECE_MAX - 1)
        len = PIECE_MAX - 1;
    long n = stop_feed(&g->stop, piece, (size_t)len, shown, sizeof shown - 1);
    if (n < 0)
        n = 0;
    shown[n] = '\0';
    append_text(&g->shown, &g->shown_len, &g->shown_cap, shown, (size_t)n);
    send_chunk(s, g, shown, &next, 1);
    if (stop_hit(&g->stop) >= 0)
        finish(g, LLMS__STOP_REASON__STOP_STRING);
    else if (g->n_gen >= g->max_gen)
        finish(g, LLMS__STOP_REASON__STOP_MAX_TOKENS);
    else if (g->n_hist >= g->limit)
        finish(g, LLMS__STOP_REASON__STOP_CONTEXT_FULL);
}

/* Evaluates hist[from .. n_hist) and keeps the last row's logits. A Call's context
 * memory claims the KV under the budget and records the attention its chunks receive. */
static int eval(sched *s, gen *g, int from, char err[ERR_MAX])
{
    int n = g->n_hist - from;
    int32_t last = n - 1;
    for (int i = 0; i < n; i++)
        s->positions[i] = from + i;
    model_batch b = {
        .n_tokens = n,
        .tokens = g->hist + from,
        .positions = s->positions,
        .n_out = 1,
        .out_rows = &last,
        .logits = s->logits,
    };
    int rc = g->c ? ctx_forward(s->cm, g->c, &b, err) : ctx_claim_append(s->cm, g->seq, n, err);
    if (rc == 0 && !g->c)
        rc = model_forward(s->runner, g->seq, &b, err);
    if (rc)
        g->err_code = rc == CTX_E_BUDGET ? LLMS__ERROR_CODE__RESOURCE_EXHAUSTED
                                         : LLMS__ERROR_CODE__INTERNAL;
    return rc ? -1 : 0;
}

/* One step of a generation: the prompt evaluation, or one token. -1 on an engine error
 * (already answered). */
static int step(sched *s, gen *g, char err[ERR_MAX])
{
    if (g->cancelled) {
        finish(g, LLMS__STOP_REASON__STOP_CANCELLED);
        return 0;
    }
    if (!g->prefilled) {
        /* Switch-in: a Call's chunks are read or recomputed until the KV holds the
         * whole history; a Complete starts empty. */
        if (g->c) {
            int rc = ctx_call_begin(s->cm, g->c, g->limit, NULL, err);
            if (rc) {
                g->err_code = rc == CTX_E_BUDGET ? LLMS__ERROR_CODE__RESOURCE_EXHAUSTED
                                                 : LLMS__ERROR_CODE__INTERNAL;
                return -1;
            }
        }
        int from = kv_seq_n_tokens(g->seq);
        if (from > g->n_base) {
            kv_seq_truncate(g->seq, g->n_base);
            from = g->n_base;
        }
        g->n_eval = g->n_hist - from;
        if (eval(s, g, from, err))
            return -1;
        g->prefilled = true;
        g->t_first = mono_ns();
    } else if (eval(s, g, g->n_hist - 1, err)) {
        return -1;
    }
    take_token(s, g);
    return 0;
}

/* Ends a generation: persists a Call's turn, sends the final result, frees it. */
static void gen_end(sched *s, gen *g, const char *engine_err)
{
    char err[ERR_MAX];
    Llms__ErrorCode code = engine_err && g->err_code ? g->err_code : LLMS__ERROR_CODE__INTERNAL;
    bool failed = engine_err != NULL;
    if (engine_err)
        snprintf(err, sizeof err, "%s", engine_err);
    g->t_end = mono_ns();
    if (!failed && !g->prefilled) {
        /* Cancelled before anything was evaluated: nothing to keep. */
        failed = true;
        code = s->shutting ? LLMS__ERROR_CODE__UNAVAILABLE : LLMS__ERROR_CODE__CANCELLED;
        snprintf(err, sizeof err, "%s", s->shutting ? "the daemon is shutting down" : "cancelled");
    }
    if (!failed) {
        char tail[STOP_MAX_LEN + 1];
        size_t n = stop_flush(&g->stop, tail);
        tail[n] = '\0';
        if (n) {
            append_text(&g->shown, &g->shown_len, &g->shown_cap, tail, n);
            send_chunk(s, g, tail, NULL, 0);
        }
    }
    if (g->c && !failed) {
        Llms__CallRequest *cr = g->job->req->call;
        if (ctx_commit_turn(s->cm, g->c, g->user_role, cr->prompt, g->hist + g->n_base,
                            g->n_turn, g->shown ? g->shown : "", g->hist + g->n_base + g->n_turn,
                            g->n_gen, wall_ms(), err)) {
            failed = true;
            code = LLMS__ERROR_CODE__INTERNAL;
        }
    }
    g->app->n_queued--;
    if (!g->quiet) {
        if (failed) {
            send_error(s, g->job, code, "%s", err);
        } else {
            Llms__CallResult res = LLMS__CALL_RESULT__INIT;
            res.prompt_tokens = (uint32_t)g->n_eval;
            res.generated_tokens = (uint32_t)g->n_gen;
            res.context_tokens = g->c ? (uint32_t)g->c->n_tokens : 0;
            res.prefill_ms = (double)(g->t_first - g->t_start) / 1e6;
            res.decode_ms = (double)(g->t_end - g->t_first) / 1e6;
            res.queue_ms = (double)(g->t_start - g->job->queued_ns) / 1e6;
            res.stop_reason = g->reason;
            res.text = g->shown ? g->shown : "";
            Llms__Response r = LLMS__RESPONSE__INIT;
            r.id = g->job->req->id;
            r.final = 1;
            r.body_case = LLMS__RESPONSE__BODY_RESULT;
            r.result = &res;
            send_resp(s, g->job->conn_id, &r, false);
        }
    }
    /* After the reply is queued: the context's modified chunks are compressed and
     * written (ahead-of-time swap-out), or a failed call's extra KV dropped; then its
     * chunks are unlocked. */
    if (g->c) {
        outq_wake(s->env.out);
        ctx_call_end(s->cm, g->c, !failed);
    }
    gen_free(g);
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

/* Removes pending jobs matching (conn_id, request id or any when all); answers each
 * with code unless quiet. Returns how many were removed. */
static int pend_remove(sched *s, uint64_t conn_id, bool all, uint64_t req_id, bool quiet,
                       Llms__ErrorCode code, const char *msg)
{
    int removed = 0;
    for (app_state *a = s->apps; a; a = a->next) {
        sched_job **pp = &a->pend_head, *prev = NULL;
        while (*pp) {
            sched_job *j = *pp;
            bool match = (conn_id == 0 || j->conn_id == conn_id) && (all || j->req->id == req_id);
            if (!match) {
                prev = j;
                pp = &j->next;
                continue;
            }
            *pp = j->next;
            if (a->pend_tail == j)
                a->pend_tail = prev;
            a->n_queued--;
            s->n_pending--;
            removed++;
            if (!quiet)
                send_error(s, j, code, "%s", msg);
            job_free(j);
        }
    }
    return removed;
}

static void handle_generate(sched *s, sched_job *j)
{
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
        !ctx_find(s->cm, j->req->call->context_id, j->uid, j->app)) {
        send_error(s, j, LLMS__ERROR_CODE__NOT_FOUND, "no context '%s'", j->req->call->context_id);
        job_free(j);
        return;
    }
    if (a->n_queued >= s->env.cfg->max_queued_per_app) {
        send_error(s, j, LLMS__ERROR_CODE__RESOURCE_EXHAUSTED,
                   "app has %d requests queued or running, the limit (max_queued_per_app)",
                   a->n_queued);
        job_free(j);
        return;
    }
    a->n_queued++;
    s->n_pending++;
    pend_push(a, j);
}

static void handle_cancel(sched *s, sched_job *j)
{
    uint64_t target = j->req->cancel->request_id;
    bool found = pend_remove(s, j->conn_id, false, target, false, LLMS__ERROR_CODE__CANCELLED,
                             "cancelled") > 0;
    for (int i = 0; i < s->n_active; i++) {
        gen *g = s->active[i];
        if (g->job->conn_id == j->conn_id && g->job->req->id == target) {
            g->cancelled = true;
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
    bool keep = false;
    switch (j->req->body_case) {
    case LLMS__REQUEST__BODY_CREATE_CONTEXT:
        handle_create(s, j);
        break;
    case LLMS__REQUEST__BODY_CALL:
    case LLMS__REQUEST__BODY_COMPLETE:
        handle_generate(s, j);
        keep = true;
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
    case LLMS__REQUEST__BODY_EMBED:
    case LLMS__REQUEST__BODY_RERANK:
    case LLMS__REQUEST__BODY_RERANK_CALIBRATE:
        semantic_handle(s->sem, j->conn_id, j->req);
        break;
    default:
        send_error(s, j, LLMS__ERROR_CODE__UNIMPLEMENTED, "request body %d is not handled here",
                   (int)j->req->body_case);
        break;
    }
    if (!keep)
        job_free(j);
}

static void cancel_conn(sched *s, uint64_t conn_id, bool quiet)
{
    pend_remove(s, conn_id, true, 0, quiet, LLMS__ERROR_CODE__CANCELLED,
                "cancelled: the client does not read its replies");
    for (int i = 0; i < s->n_active; i++) {
        gen *g = s->active[i];
        if (g->job->conn_id == conn_id) {
            g->cancelled = true;
            g->quiet |= quiet;
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
        if (j->app[0] && (a = app_get(s, j->uid, j->app)))
            a->n_conns--;
        cancel_conn(s, j->conn_id, true);
        break;
    case SCHED_CANCEL_STREAMS:
        cancel_conn(s, j->conn_id, false);
        break;
    case SCHED_SHUTDOWN:
        s->shutting = true;
        pend_remove(s, 0, true, 0, false, LLMS__ERROR_CODE__UNAVAILABLE,
                    "the daemon is shutting down");
        for (int i = 0; i < s->n_active; i++)
            s->active[i]->cancelled = true;
        break;
    }
    job_free(j);
}

/* Admits pending jobs, one per app in turn, while there is room. */
static void admit(sched *s)
{
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
                ctx_entry *c = NULL;
                if (j->req->body_case == LLMS__REQUEST__BODY_CALL) {
                    c = ctx_find(s->cm, j->req->call->context_id, j->uid, j->app);
                    if (c && c->busy) {
                        prev = j;
                        pp = &j->next;
                        continue;
                    }
                }
                *pp = j->next;
                if (a->pend_tail == j)
                    a->pend_tail = prev;
                s->n_pending--;
                progress = true;
                s->rr = a;
                if (j->req->body_case == LLMS__REQUEST__BODY_CALL && !c) {
                    a->n_queued--;
                    send_error(s, j, LLMS__ERROR_CODE__NOT_FOUND, "no context '%s'",
                               j->req->call->context_id);
                    job_free(j);
                    break;
                }
                gen *g = gen_new(s, j, a, c);
                if (g)
                    s->active[s->n_active++] = g;
                else
                    a->n_queued--;
                break;
            }
            a = a->next ? a->next : s->apps;
        } while (a != start);
    }
}

static void run_steps(sched *s)
{
    char err[ERR_MAX];
    for (int i = 0; i < s->n_active; i++) {
        gen *g = s->active[i];
        if (!g->done && step(s, g, err)) {
            g->done = true;
            gen_end(s, g, err);
            s->active[i] = NULL;
        }
    }
    int k = 0;
    for (int i = 0; i < s->n_active; i++) {
        gen *g = s->active[i];
        if (g && g->done)
            gen_end(s, g, NULL);
        else if (g)
            s->active[k++] = g;
    }
    if (k < s->n_active)
        ctx_enforce_budget(s->cm);
    s->n_active = k;
}

static void *worker(void *arg)
{
    sched *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->lock);
        while (!s->in_head && s->n_active == 0 && s->n_pending == 0 && !s->shutting)
            pthread_cond_wait(&s->wake, &s->lock);
        sched_job *j = s->in_head;
        s->in_head = s->in_tail = NULL;
        pthread_mutex_unlock(&s->lock);
        while (j) {
            sched_job *next = j->next;
            handle_job(s, j);
            j = next;
        }
        outq_wake(s->env.out);
        admit(s);
        run_steps(s);
        outq_wake(s->env.out);
        if (s->shutting && s->n_active == 0 && s->n_pending == 0)
            break;
    }
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
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->wake, NULL);
    s->runner = model_runner_new(env->m, cfg->threads, 0, cfg->n_ctx, err);
    if (!s->runner)
        goto fail;
    s->pool = kv_pool_new(model_kv_shape(env->m), 0, err);
    if (!s->pool)
        goto fail;
    s->logits = malloc(sizeof *s->logits * (size_t)model_hparams_of(env->m)->n_vocab);
    s->positions = malloc(sizeof *s->positions * (size_t)cfg->n_ctx);
    if (!s->logits || !s->positions) {
        err_set(err, "out of memory");
        goto fail;
    }
    ctx_policy policy = {
        .budget_bytes = (size_t)cfg->kv_budget_mb << 20,
        .compress = strcmp(cfg->kv_compress, "none") == 0   ? CTX_COMPRESS_NONE
                    : strcmp(cfg->kv_compress, "int8") == 0 ? CTX_COMPRESS_INT8
                                                            : CTX_COMPRESS_TOLERANCE,
        .compress_ratio = cfg->kv_compress_ratio,
        .swap = CTX_SWAP_AHEAD,
        .switch_mode = CTX_SWITCH_PLAN,
    };
    s->cm = ctx_open(env->st, s->pool, s->runner, env->m, &policy, err);
    if (!s->cm)
        goto fail;
    atomic_store(&s->n_contexts, (unsigned)ctx_count(s->cm));
    semantic_env se = {cfg, env->model_path, env->m, env->tok, s->runner, s->pool, env->st,
                       env->out};
    s->sem = semantic_new(&se, err);
    if (!s->sem)
        goto fail;
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
        gen_free(s->active[i]);
    pend_remove(s, 0, true, 0, true, LLMS__ERROR_CODE__UNAVAILABLE, "");
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
    semantic_free(s->sem);
    ctx_close(s->cm);
    free(s->logits);
    free(s->positions);
    kv_pool_free(s->pool);
    model_runner_free(s->runner);
    pthread_cond_destroy(&s->wake);
    pthread_mutex_destroy(&s->lock);
    free(s);
}
