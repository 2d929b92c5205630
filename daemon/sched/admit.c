/*
 * admit.c — the apps and their queues: the inbox's jobs (requests, bound and closed
 * connections, shutdown), a FIFO per app under the per-app and per-uid limits, Cancel,
 * admission (one request per app in turn, when its context is free and its KV fits its
 * model's share of the budget) and reaping the work that is over.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/prompt.h"
#include "daemon/sched/sched_internal.h"

#define SCHED_TEMPLATE_TOKENS 64 /* tokens a chat template adds around a turn, at most */

/* ---- apps ---- */

app_state *admit_app(sched *s, uint32_t uid, const char *name)
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
void admit_app_reclaim(sched *s, app_state *a)
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

int64_t admit_job_deadline(const sched_job *j)
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
    int64_t now = expired ? clock_mono_ns() : 0;
    for (app_state *a = s->apps; a; a = a->next) {
        sched_job **pp = &a->pend_head, *prev = NULL;
        while (*pp) {
            sched_job *j = *pp;
            bool match = expired ? admit_job_deadline(j) && now >= admit_job_deadline(j)
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
                sched_reply_error(s, j, code, "%s", msg);
            sched_job_free(j);
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

bool admit_job_needs_engine(const sched_job *j)
{
    if (j->kind == SCHED_SHUTDOWN)
        return true;
    if (j->kind != SCHED_REQUEST)
        return false;
    return is_engine_request(j->req->body_case);
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
            sched_reply_error(s, j, code, "%s", err);
        return code == LLMS__ERROR_CODE__OK;
    }
    if (j->req->body_case != LLMS__REQUEST__BODY_CALL)
        return true;
    const Llms__CallRequest *cr = j->req->call;
    const ctx_entry *c = genset_ctx_find(s, cr->context_id, j->uid, j->app);
    const char *model = genset_ctx_model(s, c);
    if (cr->model && cr->model[0] && strcmp(cr->model, model) != 0) {
        sched_reply_error(s, j, LLMS__ERROR_CODE__FAILED_PRECONDITION,
                          "context '%s' belongs to model '%s', not '%.64s': a context runs on the "
                          "model it was created with", c->id, model, cr->model);
        return false;
    }
    if (strcmp(model, genset_of_ctx(s, c)->me->name) == 0)
        return true;
    char names[256];
    gm_names(s, names, sizeof names);
    sched_reply_error(s, j, LLMS__ERROR_CODE__FAILED_PRECONDITION,
                      "context '%s' belongs to model '%s', which is not loaded (the generate "
                      "models: %s); its history is kept", c->id, model, names);
    return false;
}

/* Queues a request that uses the engine, under the app's limit on requests of every
 * kind queued or running. */
static void handle_engine_request(sched *s, sched_job *j)
{
    idle_end(s);
    if (s->shutting) {
        sched_reply_error(s, j, LLMS__ERROR_CODE__UNAVAILABLE, "the daemon is shutting down");
        sched_job_free(j);
        return;
    }
    app_state *a = admit_app(s, j->uid, j->app);
    if (!a) {
        sched_reply_error(s, j, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        sched_job_free(j);
        return;
    }
    const ctx_entry *c = j->req->body_case == LLMS__REQUEST__BODY_CALL
                             ? genset_ctx_find(s, j->req->call->context_id, j->uid, j->app)
                             : NULL;
    if (j->req->body_case == LLMS__REQUEST__BODY_CALL && (!c || c->damage)) {
        /* a damaged context stays damaged: the state must change (its deletion) first */
        if (!c)
            sched_reply_error(s, j, LLMS__ERROR_CODE__NOT_FOUND, "no context '%s'",
                              j->req->call->context_id);
        else
            sched_reply_error(s, j, LLMS__ERROR_CODE__FAILED_PRECONDITION,
                              "context '%s' is damaged, so its calls fail; its stored data "
                              "is kept as it is, and deleting the context clears it. %s",
                              c->id, c->damage);
        sched_job_free(j);
        admit_app_reclaim(s, a);
        return;
    }
    if (!generate_model_ok(s, j)) {
        sched_job_free(j);
        admit_app_reclaim(s, a);
        return;
    }
    if (a->n_queued >= s->env.cfg->max_queued_per_app) {
        sched_reply_error(s, j, LLMS__ERROR_CODE__RESOURCE_EXHAUSTED,
                          "app has %d requests queued or running, the limit (max_queued_per_app)",
                          a->n_queued);
        sched_job_free(j);
        admit_app_reclaim(s, a);
        return;
    }
    int of_uid = uid_queued(s, j->uid);
    if (of_uid >= s->env.cfg->max_queued_per_uid) {
        sched_reply_error(s, j, LLMS__ERROR_CODE__RESOURCE_EXHAUSTED,
                          "uid %u has %d requests queued or running over all its apps, the limit "
                          "(max_queued_per_uid)", j->uid, of_uid);
        sched_job_free(j);
        admit_app_reclaim(s, a);
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
        sched_reply_ok(s, j);
    else
        sched_reply_error(s, j, LLMS__ERROR_CODE__NOT_FOUND, "no request %llu in flight",
                          (unsigned long long)target);
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

void admit_job(sched *s, sched_job *j)
{
    app_state *a;
    switch (j->kind) {
    case SCHED_REQUEST:
        if (is_engine_request(j->req->body_case)) {
            handle_engine_request(s, j);
            return;
        }
        if (j->req->body_case != LLMS__REQUEST__BODY_CANCEL) {
            admin_handle(s, j);
            return;
        }
        handle_cancel(s, j);
        break;
    case SCHED_BOUND:
        if ((a = admit_app(s, j->uid, j->app)))
            a->n_conns++;
        break;
    case SCHED_CLOSED:
        a = j->app[0] ? admit_app(s, j->uid, j->app) : NULL;
        if (a)
            a->n_conns--;
        cancel_conn(s, j->conn_id, true);
        if (a)
            admit_app_reclaim(s, a);
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
    case SCHED_RESPONSE_PUT:
    case SCHED_RESPONSE_DELETE:
        respsave_run(s, j);
        break;
    }
    sched_job_free(j);
}

/* ---- admission ---- */

/* Whether a pending job may start now: a Call waits while its context runs another
 * call, a rerank while the reranker runs one. */
static bool job_can_start(sched *s, const sched_job *j, ctx_entry **c)
{
    *c = NULL;
    switch (j->req->body_case) {
    case LLMS__REQUEST__BODY_CALL:
        *c = genset_ctx_find(s, j->req->call->context_id, j->uid, j->app);
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
        return genset_of_ctx(s, c);
    if (j->req->body_case != LLMS__REQUEST__BODY_COMPLETE)
        return s->gm[0];
    *code = models_resolve(s->env.reg, j->req->complete->model, MODELS_GENERATE, &me, err);
    return *code == LLMS__ERROR_CODE__OK ? genset_of_entry(s, me) : NULL;
}

/* What a Call's or Complete's log-probabilities may take, 0 when it asks for none: each
 * reply token's step (a WINDOW context's reply goes on past its window, keeping every
 * step), and the reply's messages and CallResult packed at its end. Counted in the KV
 * budget, as they grow with max_tokens as the KV does. */
static size_t logprobs_need(const genmodel *gm, const Llms__GenerationParams *const *layers,
                            long max_tokens, long limit, bool window)
{
    int n_top = gen_logprobs_of_params(layers, 2);
    if (n_top < 0)
        return 0;
    long steps = window || max_tokens < limit ? max_tokens : limit;
    return (size_t)steps * logprobs_step_mem_bytes(n_top, gm->piece_max);
}

/* The most KV a Call or Complete on gm can hold: the context, the prompt (a token is at
 * least one byte, the template adds a few), the reply, at f16 (the heaviest precision),
 * or int8 for the full chunks when the policy compresses, and the draft model's KV when
 * it drafts, with its logprobs' memory; 0 for other work. */
size_t admit_kv_need(const sched *s, const genmodel *gm, const sched_job *j,
                     const ctx_entry *c, size_t *logprobs)
{
    if (logprobs)
        *logprobs = 0;
    const config *cfg = s->env.cfg;
    /* the params layers the generation will read: a Call's context defaults, the request's */
    const Llms__GenerationParams *layers[2] = {NULL, NULL}, *p = NULL;
    long tokens, limit;
    if (j->req->body_case == LLMS__REQUEST__BODY_CALL && c) {
        layers[0] = c->defaults;
        p = j->req->call->params;
        tokens = c->n_tokens + (long)strlen(j->req->call->prompt) + SCHED_TEMPLATE_TOKENS;
        limit = cfg->max_tokens_per_context;
    } else if (j->req->body_case == LLMS__REQUEST__BODY_COMPLETE) {
        const Llms__CompleteRequest *cr = j->req->complete;
        p = cr->params;
        tokens = (long)strlen(cr->prompt) + SCHED_TEMPLATE_TOKENS +
                 (cr->system_prompt ? (long)strlen(cr->system_prompt) : 0) +
                 (long)prompt_parts_weight(cr->prompt_parts, cr->n_prompt_parts);
        limit = cfg->n_ctx;
    } else if (j->req->body_case == LLMS__REQUEST__BODY_RAG_QUERY) {
        /* passages as long as the daemon's default; a knowledge base of longer ones may
         * exceed this estimate by what the claim at each step then finds */
        const Llms__RagQueryRequest *rq = j->req->rag_query;
        p = rq->params;
        /* top_k is not checked yet (rag_begin refuses one out of range): as an int, one
         * past INT32_MAX would be negative and the estimate nonsense */
        long k = rq->has_top_k ? (long)rq->top_k : cfg->rag_top_k;
        tokens = (long)strlen(rq->question) + 2 * SCHED_TEMPLATE_TOKENS +
                 k * (cfg->kb_passage_tokens + 8) +
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
                 gen_max_tokens_of_params(cfg, &p, 1);
        for (size_t i = 0; i < gr->n_inputs; i++)
            tokens += (long)strlen(gr->inputs[i]->value);
        limit = cfg->n_ctx;
    } else {
        return 0;
    }
    layers[1] = p;
    long max_tokens = gen_max_tokens_of_params(cfg, layers, 2);
    tokens += max_tokens;
    tokens = tokens < limit ? tokens : limit;
    size_t chunks = (size_t)(tokens + KV_CHUNK_TOKENS - 1) / KV_CHUNK_TOKENS;
    kv_shape shape = model_kv_shape(gm->me->m);
    size_t f16 = kv_chunk_data_bytes(shape, KV_F16);
    /* Under pressure the call keeps its full chunks in int8 (step_claim), all but those
     * one step appends and the one being filled. */
    size_t hot = (size_t)(gm->step_tokens / KV_CHUNK_TOKENS + 2);
    size_t need = ctx_get_policy(gm->cm)->compress == CTX_COMPRESS_NONE || chunks <= hot
                      ? chunks * f16
                      : (chunks - hot) * kv_chunk_data_bytes(shape, KV_INT8) + hot * f16;
    /* a generation that drafts with the draft model holds its KV too (idle-time work
     * does not draft) */
    if (s->drafter && gm == s->gm[0] && j != &s->pred_job &&
        (spec_mode_of_params(cfg, layers, 2) & SPEC_DRAFT))
        need += spec_drafter_kv_need(s->drafter, tokens);
    if (j->req->body_case == LLMS__REQUEST__BODY_CALL ||
        j->req->body_case == LLMS__REQUEST__BODY_COMPLETE) {
        size_t lp = logprobs_need(gm, layers, max_tokens, limit,
                                  c && c->overflow == CTX_OVERFLOW_WINDOW);
        need += lp;
        if (logprobs)
            *logprobs = lp;
    }
    return need;
}

/* Whether a job's KV fits beside what the running work on its model may reach (each
 * generate model has its share of the budget): admitted work then never finds the
 * budget full (idle contexts are reclaimed for it). One that does not fit waits for
 * running work to end, up to kv_wait_ms; one that needs more than the whole share is
 * refused at once. */
enum admit_kv_fit admit_kv_fit(const sched *s, const genmodel *gm, const sched_job *j,
                               size_t need, int64_t now)
{
    size_t budget = ctx_get_policy(gm->cm)->budget_bytes;
    if (!budget || need == 0)
        return ADMIT_KV_FITS;
    if (need > budget)
        return ADMIT_KV_NEVER;
    if (gm->kv_reserved + need <= budget)
        return ADMIT_KV_FITS;
    return now - j->queued_ns > (int64_t)s->env.cfg->kv_wait_ms * 1000000 ? ADMIT_KV_WAITED
                                                                          : ADMIT_KV_WAIT;
}

/* Answers a job that cannot get its KV (need bytes, logprobs of them its logprobs'). */
static void kv_refuse(sched *s, const genmodel *gm, const sched_job *j, enum admit_kv_fit fit,
                      size_t need, size_t logprobs)
{
    size_t budget = ctx_get_policy(gm->cm)->budget_bytes;
    char of_logprobs[96] = "";
    if (logprobs)
        snprintf(of_logprobs, sizeof of_logprobs, " (%zu KiB of them for logprobs over max_tokens)",
                 logprobs >> 10);
    if (fit == ADMIT_KV_NEVER)
        sched_reply_error(s, j, LLMS__ERROR_CODE__INVALID_ARGUMENT,
                          "this call may need %zu KiB of KV (the context, the prompt and "
                          "max_tokens)%s, more than kv_budget_mb allows (%zu KiB): lower "
                          "max_tokens or raise kv_budget_mb", need >> 10, of_logprobs,
                          budget >> 10);
    else
        sched_reply_error(s, j, LLMS__ERROR_CODE__RESOURCE_EXHAUSTED,
                          "waited kv_wait_ms (%d ms) for %zu KiB of KV memory%s; running calls "
                          "hold %zu of %zu KiB", s->env.cfg->kv_wait_ms, need >> 10, of_logprobs,
                          gm->kv_reserved >> 10, budget >> 10);
}

/* Admits pending jobs, one per app in turn, while there is room. */
void admit_pending(sched *s)
{
    int64_t now = clock_mono_ns();
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
                size_t need = 0, logprobs = 0;
                enum admit_kv_fit fit = ADMIT_KV_WAIT;
                Llms__ErrorCode code = LLMS__ERROR_CODE__OK;
                char err[ERR_MAX];
                if (job_can_start(s, j, &c)) {
                    gm = job_model(s, j, c, &code, err);
                    need = gm ? admit_kv_need(s, gm, j, c, &logprobs) : 0;
                    fit = gm ? admit_kv_fit(s, gm, j, need, now) : ADMIT_KV_FITS;
                    if (fit != ADMIT_KV_FITS && s->pred && gm == s->gm[0]) {
                        /* prediction never holds memory a real request waits for */
                        idle_pred_end(s, false);
                        fit = admit_kv_fit(s, gm, j, need, now);
                    }
                }
                if (fit == ADMIT_KV_WAIT) {
                    prev = j;
                    pp = &j->next;
                    continue;
                }
                pend_unlink(s, a, pp, prev);
                progress = true;
                s->rr = a;
                if (!gm || fit != ADMIT_KV_FITS) {
                    a->n_queued--;
                    if (gm)
                        kv_refuse(s, gm, j, fit, need, logprobs);
                    else
                        sched_reply_error(s, j, code, "%s", err);
                    sched_job_free(j);
                    break;
                }
                if (j->req->body_case == LLMS__REQUEST__BODY_CALL && !c) {
                    a->n_queued--;
                    sched_reply_error(s, j, LLMS__ERROR_CODE__NOT_FOUND, "no context '%s'",
                                      j->req->call->context_id);
                    sched_job_free(j);
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
        admit_app_reclaim(s, a);
    }
}

/* Ends cancelled, expired, failed and finished work, and removes it from the active
 * set; answers queued requests whose deadline passed. */
void admit_reap(sched *s)
{
    int64_t now = clock_mono_ns();
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

void admit_free(sched *s)
{
    pend_remove(s, 0, true, 0, false, true, LLMS__ERROR_CODE__UNAVAILABLE, "");
    app_state *a = s->apps;
    while (a) {
        app_state *next = a->next;
        free(a);
        a = next;
    }
    s->apps = NULL;
}
