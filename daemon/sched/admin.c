/*
 * admin.c — the requests the worker answers at once, between steps: contexts (create,
 * delete, evict, list, get), Status, models (list, load, unload, Tokenize and Detokenize
 * naming one), Profile, Plan and ListApps; it hands the knowledge-base, graph and cache
 * requests to their modules.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/net/tokreq.h"
#include "daemon/reqlog.h"
#include "daemon/sched/sched_internal.h"
#include "engine/model/prefill.h"
#include "storage/kb.h"

#define SCHED_LIST_PAGE 256   /* contexts per ListContexts reply at most */
#define SCHED_STATS_NS 60000000000LL

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
    info->model = (char *)genset_ctx_model(s, c);
    info->damage = c->damage;
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
    for (ctx_entry *c = genset_ctx_first(s); c; c = genset_ctx_next(s, c))
        total += all || (c->uid == j->uid && strcmp(c->app_name, j->app) == 0);
    uint32_t n = offset < total ? total - offset : 0;
    if (n > limit)
        n = limit;
    Llms__ContextInfo *infos = calloc((size_t)n + 1, sizeof *infos);
    Llms__ContextInfo **ptrs = calloc((size_t)n + 1, sizeof *ptrs);
    if (!infos || !ptrs) {
        free(infos);
        free(ptrs);
        sched_reply_error(s, j, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        return;
    }
    uint32_t k = 0, seen = 0;
    for (ctx_entry *c = genset_ctx_first(s); c && k < n; c = genset_ctx_next(s, c)) {
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
    sched_reply(s, j->conn_id, &r, false);
    free(infos);
    free(ptrs);
}

static void handle_get_context(sched *s, const sched_job *j)
{
    Llms__GetContextRequest *g = j->req->get_context;
    bool any = g->has_any_app && g->any_app;
    if (any && !j->admin) {
        sched_reply_error(s, j, LLMS__ERROR_CODE__PERMISSION_DENIED, "any_app is an admin option");
        return;
    }
    ctx_entry *c = genset_ctx_find(s, g->context_id, j->uid, any ? NULL : j->app);
    if (!c) {
        sched_reply_error(s, j, LLMS__ERROR_CODE__NOT_FOUND, "no context '%s'", g->context_id);
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
            sched_reply_error(s, j, LLMS__ERROR_CODE__INTERNAL, "out of memory");
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
    sched_reply(s, j->conn_id, &r, false);
    free(hist);
    free(hmsgs);
    free(chunks);
    free(cptrs);
}

/* ---- simple requests ---- */

/* Contexts of uid (of its app app, or of all its apps when app is NULL), and how many of
 * them are damaged. */
static int count_contexts(sched *s, uint32_t uid, const char *app, int *damaged)
{
    int n = 0;
    *damaged = 0;
    for (const ctx_entry *c = genset_ctx_first(s); c; c = genset_ctx_next(s, c))
        if (c->uid == uid && (!app || strcmp(c->app_name, app) == 0)) {
            n++;
            *damaged += c->damage != NULL;
        }
    return n;
}

/* Damaged contexts count in the limits: their rows and files stay as they are until
 * deleted. A refusal says so, as those are the places the app can free. */
static void refuse_over_contexts(sched *s, const sched_job *j, const char *who, int have,
                                 const char *limit, int damaged)
{
    char of_them[200] = "";
    if (damaged)
        snprintf(of_them, sizeof of_them, "; %d of them damaged (their calls fail; `llms ctx "
                 "ls` marks them): deleting one frees its place (`llms ctx rm ID`, or an "
                 "admin's `llmsctl rm ID`)", damaged);
    sched_reply_error(s, j, LLMS__ERROR_CODE__RESOURCE_EXHAUSTED,
                      "%s has %d contexts, the limit (%s)%s", who, have, limit, of_them);
}

static void handle_create(sched *s, const sched_job *j)
{
    Llms__CreateContextRequest *cr = j->req->create_context;
    int damaged;
    int have = count_contexts(s, j->uid, j->app, &damaged);
    if (have >= s->env.cfg->max_contexts_per_app) {
        refuse_over_contexts(s, j, "app", have, "max_contexts_per_app", damaged);
        return;
    }
    int of_uid = count_contexts(s, j->uid, NULL, &damaged);
    if (of_uid >= s->env.cfg->max_contexts_per_uid) {
        char who[48];
        snprintf(who, sizeof who, "uid %u over all its apps", j->uid);
        refuse_over_contexts(s, j, who, of_uid, "max_contexts_per_uid", damaged);
        return;
    }
    if (cr->defaults && cr->defaults->n_stop >= STOP_MAX) {
        sched_reply_error(s, j, LLMS__ERROR_CODE__INVALID_ARGUMENT, "at most %d stop strings",
                          STOP_MAX - 1);
        return;
    }
    if (cr->has_overflow && cr->overflow != LLMS__OVERFLOW__OVERFLOW_DEFAULT &&
        cr->overflow != LLMS__OVERFLOW__OVERFLOW_WINDOW &&
        cr->overflow != LLMS__OVERFLOW__OVERFLOW_REFUSE) {
        sched_reply_error(s, j, LLMS__ERROR_CODE__INVALID_ARGUMENT, "overflow %d is neither window "
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
        sched_reply_error(s, j, code, "%s", err);
        return;
    }
    ctxmgr *cm = genset_of_entry(s, me)->cm;
    ctx_entry *c;
    if (ctx_create(cm, j->uid, j->app, cr->system_prompt, cr->defaults, clock_wall_ms(), &c, err)) {
        sched_reply_error(s, j, LLMS__ERROR_CODE__INTERNAL, "create context: %s", err);
        return;
    }
    if (ctx_set_model(cm, c, me->name, err) ||
        (refuse && ctx_set_overflow(cm, c, CTX_OVERFLOW_REFUSE, err))) {
        ctx_delete(cm, c, ignored);
        sched_reply_error(s, j, LLMS__ERROR_CODE__INTERNAL, "create context: %s", err);
        return;
    }
    atomic_store(&s->n_contexts, (unsigned)genset_ctx_count(s));
    Llms__CreateContextResponse cc = LLMS__CREATE_CONTEXT_RESPONSE__INIT;
    cc.context_id = c->id;
    Llms__Response r = LLMS__RESPONSE__INIT;
    r.id = j->req->id;
    r.final = 1;
    r.body_case = LLMS__RESPONSE__BODY_CREATE_CONTEXT;
    r.create_context = &cc;
    sched_reply(s, j->conn_id, &r, false);
}

static void handle_delete(sched *s, const sched_job *j)
{
    const Llms__DeleteContextRequest *d = j->req->delete_context;
    const char *id = d->context_id;
    /* an admin removes any app's: a damaged context whose app is gone, a stale one */
    bool any = d->has_any_app && d->any_app;
    if (any && !j->admin) {
        sched_reply_error(s, j, LLMS__ERROR_CODE__PERMISSION_DENIED, "any_app is an admin option");
        return;
    }
    ctx_entry *c = genset_ctx_find(s, id, any ? 0 : j->uid, any ? NULL : j->app);
    char err[ERR_MAX];
    if (!c)
        sched_reply_error(s, j, LLMS__ERROR_CODE__NOT_FOUND, "no context '%s'", id);
    else if (c->busy)
        sched_reply_error(s, j, LLMS__ERROR_CODE__FAILED_PRECONDITION,
                          "context '%s' has a call running", id);
    else if (ctx_delete(c->cm, c, err))
        sched_reply_error(s, j, LLMS__ERROR_CODE__INTERNAL, "delete context: %s", err);
    else {
        atomic_store(&s->n_contexts, (unsigned)genset_ctx_count(s));
        sched_reply_ok(s, j);
    }
}

static void handle_evict(sched *s, const sched_job *j)
{
    const char *id = j->req->evict_context->context_id;
    ctx_entry *c = genset_ctx_find(s, id, 0, NULL);
    if (!c)
        sched_reply_error(s, j, LLMS__ERROR_CODE__NOT_FOUND, "no context '%s'", id);
    else if (c->busy)
        sched_reply_error(s, j, LLMS__ERROR_CODE__FAILED_PRECONDITION,
                          "context '%s' has a call running", id);
    else {
        ctx_evict(c->cm, c);
        sched_reply_ok(s, j);
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
    st->has_sched_shared_steps = true;
    st->sched_shared_steps = s->shared_steps;
    int64_t since = clock_mono_ns() - SCHED_STATS_NS;
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
    st->has_spec_lookup_steps = st->has_spec_lookup_proposed = st->has_spec_lookup_accepted = 1;
    st->spec_lookup_steps = s->spec_lookup.steps;
    st->spec_lookup_proposed = s->spec_lookup.proposed;
    st->spec_lookup_accepted = s->spec_lookup.accepted;
    st->has_spec_draft_steps = st->has_spec_draft_proposed = st->has_spec_draft_accepted = 1;
    st->spec_draft_steps = s->spec_draft.steps;
    st->spec_draft_proposed = s->spec_draft.proposed;
    st->spec_draft_accepted = s->spec_draft.accepted;
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
    mi->strs = calloc(mi->n * 7, sizeof *mi->strs);
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
        x->roles = mi->strs + 7 * k;
        x->default_for = mi->strs + 7 * k + 4;
        for (unsigned bit = MODELS_GENERATE; bit <= MODELS_DRAFT; bit <<= 1) {
            models_entry *has;
            char ignored[ERR_MAX];
            const char *role = models_role_name(bit);
            if (models_resolve(reg, e->name, bit, &has, ignored) == LLMS__ERROR_CODE__OK)
                x->roles[x->n_roles++] = (char *)role;
            /* no request names a draft model: draft_model chose it */
            if (bit != MODELS_DRAFT && models_is_default(reg, e, bit))
                x->default_for[x->n_default_for++] = (char *)role;
        }
        x->resident_bytes = models_resident_bytes(e);
        x->scratch_bytes = models_scratch_bytes(e);
        const genmodel *gm = genset_of_entry(s, e);
        /* the drafter holds its model for the daemon's life: no request of its own */
        x->running = (uint32_t)(e->running - spec_drafter_uses(s->drafter, e));
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
    st->has_window_slides = st->has_window_dropped_tokens = st->has_damaged_contexts = 1;
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
    if (store_kb_totals(s->env.st, &kb_pass, &kb_text, kb_err) == 0) {
        st->has_kb_passages = st->has_kb_text_bytes = 1;
        st->kb_passages = (uint64_t)kb_pass;
        st->kb_text_bytes = (uint64_t)kb_text;
    }
    /* measured in idle time (kb_disk_measure_idle): absent until a first measurement */
    if (kb_disk_bytes(s->kb, &kb_disk)) {
        st->has_kb_disk_bytes = 1;
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
        st->damaged_contexts += (uint32_t)ctx_count_damaged(gm->cm);
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
    st->has_prompt_cache_hits = st->has_prompt_cache_misses = 1;
    st->has_prompt_cache_reused_tokens = st->has_prompt_cache_bytes = 1;
    st->has_prompt_cache_entries = 1;
    st->prompt_cache_hits = s->pcache_gone.hits;
    st->prompt_cache_misses = s->pcache_gone.misses;
    st->prompt_cache_reused_tokens = s->pcache_gone.reused_tokens;
    for (int k = 0; k < SCHED_GEN_MAX; k++)
        if (s->pcache[k]) {
            pcache_stats ps = pcache_get_stats(s->pcache[k]);
            st->prompt_cache_hits += ps.hits;
            st->prompt_cache_misses += ps.misses;
            st->prompt_cache_reused_tokens += ps.reused_tokens;
            st->prompt_cache_bytes += ps.bytes;
            st->prompt_cache_entries += (uint32_t)ps.entries;
        }
    /* the draft model's KV counts with the default generate model's (all f16) */
    const kv_pool *draft = s->drafter ? spec_drafter_pool(s->drafter) : NULL;
    if (draft) {
        st->kv_f16_bytes += kv_pool_bytes_at(draft, KV_F16);
        st->kv_spare_bytes += kv_pool_spare_bytes(draft);
    }
    st->switch_in_mean_ms = st->switch_ins ? switch_in_ms / (double)st->switch_ins : 0;
}

static void handle_status(sched *s, const sched_job *j)
{
    const model_hparams *hp = model_hparams_of(s->env.m);
    Llms__StatusResponse st = LLMS__STATUS_RESPONSE__INIT;
    st.version = LLMS_VERSION;
    st.model_path = models_generate(s->env.reg)->path;
    st.model_arch = (char *)hp->file_arch;
    const gguf_file *gf = model_gguf(s->env.m);
    for (int64_t i = 0; i < gguf_n_tensors(gf); i++)
        st.model_bytes += gguf_tensor_at(gf, i)->bytes;
    st.n_ctx = (uint32_t)s->env.cfg->n_ctx;
    st.threads = (uint32_t)model_runner_n_threads(s->gm[0]->runner);
    st.uptime_ms = (uint64_t)(clock_wall_ms() - s->start_ms);
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
        sched_reply_error(s, j, LLMS__ERROR_CODE__INTERNAL, "out of memory");
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
    sched_reply(s, j->conn_id, &r, false);
    model_infos_free(&mi);
}

static void handle_list_models(sched *s, const sched_job *j)
{
    model_infos mi;
    if (model_infos_fill(s, &mi) < 0) {
        sched_reply_error(s, j, LLMS__ERROR_CODE__INTERNAL, "out of memory");
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
    sched_reply(s, j->conn_id, &r, false);
    model_infos_free(&mi);
}

/* The tokenizer of a model by name: a generate model's, or an embed model's. NULL +
 * the error's code and err. */
static const tokenizer *model_tokenizer(sched *s, const char *name, Llms__ErrorCode *code,
                                        char err[ERR_MAX])
{
    models_entry *me;
    *code = models_resolve(s->env.reg, name, MODELS_GENERATE, &me, err);
    if (*code == LLMS__ERROR_CODE__OK)
        return genset_of_entry(s, me)->tok;
    if (*code != LLMS__ERROR_CODE__INVALID_ARGUMENT)
        return NULL;
    me = models_find(s->env.reg, name);
    if (me->embed_tok) {
        *code = LLMS__ERROR_CODE__OK;
        return me->embed_tok;
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
        sched_reply_error(s, j, code, "%s", err);
    else
        sched_reply(s, j->conn_id, &a.r, false);
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
            sched_reply_error(s, j, LLMS__ERROR_CODE__INVALID_ARGUMENT,
                              "role %zu: each of generate, embed, rerank at most once", i);
            return;
        }
        roles |= one;
    }
    if (q->lora && roles & ~MODELS_GENERATE) {
        sched_reply_error(s, j, LLMS__ERROR_CODE__INVALID_ARGUMENT,
                          "load: an adapter model generates, and has no other role");
        return;
    }
    if ((q->lora || (roles & MODELS_GENERATE)) && genset_count(s) == SCHED_GEN_MAX) {
        sched_reply_error(s, j, LLMS__ERROR_CODE__RESOURCE_EXHAUSTED,
                          "load: llmsd serves at most %d generate models", SCHED_GEN_MAX);
        return;
    }
    Llms__ErrorCode code = q->lora ? models_load_lora(s->env.reg, q->name, q->path, q->lora, err)
                                   : models_load(s->env.reg, q->name, q->path, roles, err);
    if (code != LLMS__ERROR_CODE__OK) {
        sched_reply_error(s, j, code, "load: %s", err);
        return;
    }
    models_entry *me = models_find(s->env.reg, q->name);
    if ((me->roles & MODELS_GENERATE) && genset_load(s, me, err) < 0) {
        char ignored[ERR_MAX];
        models_unload(s->env.reg, q->name, ignored);
        sched_reply_error(s, j, LLMS__ERROR_CODE__INVALID_ARGUMENT, "load: %s", err);
        return;
    }
    if (reqlog_enabled(REQLOG_INFO))
        fprintf(stderr, "llmsd: info: model '%s' loaded from %s%s%s\n", q->name, q->path,
                q->lora ? " with the adapters " : "", q->lora ? q->lora : "");
    sched_reply_ok(s, j);
}

static void handle_unload_model(sched *s, const sched_job *j)
{
    const char *name = j->req->unload_model->name;
    char err[ERR_MAX];
    models_entry *me = models_find(s->env.reg, name);
    if (me && spec_drafter_uses(s->drafter, me)) {
        sched_reply_error(s, j, LLMS__ERROR_CODE__FAILED_PRECONDITION,
                          "unload: model '%s' is the draft model (draft_model): restart "
                          "llmsd without it", name);
        return;
    }
    genmodel *gm = me ? genset_of_entry(s, me) : NULL;
    if (gm && gm != s->gm[0] && me->running == 0) {
        if (genset_unload(s, gm, err) < 0) {
            sched_reply_error(s, j, LLMS__ERROR_CODE__FAILED_PRECONDITION, "unload: %s", err);
            return;
        }
    }
    Llms__ErrorCode code = models_unload(s->env.reg, name, err);
    if (code != LLMS__ERROR_CODE__OK) {
        sched_reply_error(s, j, code, "unload: %s", err);
        return;
    }
    if (reqlog_enabled(REQLOG_INFO))
        fprintf(stderr, "llmsd: info: model '%s' unloaded\n", name);
    sched_reply_ok(s, j);
}

static void handle_profile(sched *s, const sched_job *j)
{
    char err[ERR_MAX];
    ctx_cost k;
    if (ctx_profile(s->gm[0]->cm, &k, err)) {
        sched_reply_error(s, j, LLMS__ERROR_CODE__INTERNAL, "profile: %s", err);
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
    sched_reply(s, j->conn_id, &r, false);
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
        sched_reply_error(s, j, code, "plan: %s", err);
        return;
    }
    if (q->prompt_tokens == 0 || q->prompt_tokens > (uint32_t)cfg->n_ctx) {
        sched_reply_error(s, j, LLMS__ERROR_CODE__INVALID_ARGUMENT,
                          "plan: a prompt of %u tokens; the context window (n_ctx) holds 1 to %d",
                          q->prompt_tokens, cfg->n_ctx);
        return;
    }
    if (genmodel_plan(genset_of_entry(s, me), cfg, (int)q->prompt_tokens, &p, err) < 0) {
        sched_reply_error(s, j, LLMS__ERROR_CODE__RESOURCE_EXHAUSTED, "plan: %s", err);
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
        sched_reply_error(s, j, LLMS__ERROR_CODE__INTERNAL, "plan: out of memory");
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
    sched_reply(s, j->conn_id, &r, false);
    free(text);
}

static void handle_list_apps(sched *s, const sched_job *j)
{
    /* Apps that have contexts are listed even when none is connected. */
    for (ctx_entry *c = genset_ctx_first(s); c; c = genset_ctx_next(s, c))
        admit_app(s, c->uid, c->app_name);
    size_t n = 0;
    for (app_state *a = s->apps; a; a = a->next)
        n++;
    Llms__AppInfo *infos = calloc(n + 1, sizeof *infos);
    Llms__AppInfo **ptrs = calloc(n + 1, sizeof *ptrs);
    if (!infos || !ptrs) {
        free(infos);
        free(ptrs);
        sched_reply_error(s, j, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        return;
    }
    size_t k = 0;
    for (app_state *a = s->apps; a; a = a->next, k++) {
        llms__app_info__init(&infos[k]);
        infos[k].uid = a->uid;
        infos[k].app_name = a->name;
        infos[k].n_contexts = (uint32_t)genset_ctx_count_app(s, a->uid, a->name);
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
    sched_reply(s, j->conn_id, &r, false);
    free(infos);
    free(ptrs);
    for (app_state *a = s->apps, *next; a; a = next) {
        next = a->next;
        admit_app_reclaim(s, a);
    }
}

void admin_handle(sched *s, sched_job *j)
{
    if (kb_is_request(j->req->body_case)) {
        kb_handle(s->kb, j->conn_id, j->uid, j->app, j->req);
        sched_job_free(j);
        return;
    }
    if (graphs_is_request(j->req->body_case)) {
        graphs_handle(&s->graphs, j->conn_id, j->uid, j->app, j->req);
        sched_job_free(j);
        return;
    }
    switch (j->req->body_case) {
    case LLMS__REQUEST__BODY_CREATE_CONTEXT:
        handle_create(s, j);
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
        sched_reply_error(s, j, LLMS__ERROR_CODE__UNIMPLEMENTED,
                          "request body %d is not handled here", (int)j->req->body_case);
        break;
    }
    sched_job_free(j);
}
