/* admin.c — libllmsclient: the daemon's status, apps, eviction, profiling and planning,
 * the model registry (list, load, unload) and shutdown. */
#include "client/llms.h"

#include <stdlib.h>
#include <string.h>

#include "client/client_internal.h"
#include "proto/frame.h"

/* ---- admin ---- */

void llms_daemon_status_free(llms_daemon_status *st)
{
    if (!st)
        return;
    free(st->version);
    free(st->model_path);
    free(st->model_arch);
    free(st->sched_mode);
    memset(st, 0, sizeof *st);
}

static void cost_models_from(const Llms__CostModels *m, llms_cost_models *out)
{
    if (!m) {
        memset(out, 0, sizeof *out);
        return;
    }
    *out = (llms_cost_models){
        .rec_a = m->rec_a,
        .rec_b = m->rec_b,
        .rec_c = m->rec_c,
        .io_d = m->io_d,
        .io_e = m->io_e,
        .warm_d = m->warm_d,
        .warm_e = m->warm_e,
        .io_f = m->io_f,
        .warm_f = m->warm_f,
        .rec_resid = m->rec_resid,
        .io_resid = m->io_resid,
        .warm_resid = m->warm_resid,
        .samples = m->samples,
        .rec_fix = m->rec_fix,
        .cold_fix = m->cold_fix,
        .warm_fix = m->warm_fix,
        .rec_contention = m->rec_contention,
        .read_contention = m->read_contention,
        .observed = m->observed,
        .rec_ratio_median = m->rec_ratio_median,
        .rec_ratio_last = m->rec_ratio_last,
        .read_ratio_median = m->read_ratio_median,
        .read_ratio_last = m->read_ratio_last,
        .total_ratio_median = m->total_ratio_median,
        .total_ratio_last = m->total_ratio_last,
    };
}

enum llms_status llms_status_get(llms_conn *c, llms_daemon_status *out)
{
    memset(out, 0, sizeof *out);
    Llms__Empty e = LLMS__EMPTY__INIT;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_STATUS;
    req.status = &e;
    Llms__Response *r;
    enum llms_status s = client_unary(c, &req, LLMS__RESPONSE__BODY_STATUS, &r);
    if (s != LLMS_OK)
        return s;
    const Llms__StatusResponse *p = r->status;
    *out = (llms_daemon_status){
        .version = strdup(p->version),
        .model_path = strdup(p->model_path),
        .model_arch = strdup(p->model_arch),
        .model_bytes = p->model_bytes,
        .n_ctx = p->n_ctx,
        .threads = p->threads,
        .uptime_ms = p->uptime_ms,
        .n_connections = p->n_connections,
        .n_apps = p->n_apps,
        .n_contexts = p->n_contexts,
        .n_resident_contexts = p->n_resident_contexts,
        .kv_bytes_resident = p->kv_bytes_resident,
        .queued_requests = p->queued_requests,
        .running_requests = p->running_requests,
        .rss_bytes = p->rss_bytes,
        .kv_budget_bytes = p->kv_budget_bytes,
        .swap_bytes_written = p->swap_bytes_written,
        .swap_bytes_read = p->swap_bytes_read,
        .swap_chunks_written = p->swap_chunks_written,
        .swap_chunks_read = p->swap_chunks_read,
        .swap_chunks_recomputed = p->swap_chunks_recomputed,
        .swap_chunks_promoted = p->swap_chunks_promoted,
        .swap_faults = p->swap_faults,
        .swap_bad_blobs = p->swap_bad_blobs,
        .swap_stale_blobs = p->swap_stale_blobs,
        .kv_f16_bytes = p->kv_f16_bytes,
        .kv_int8_bytes = p->kv_int8_bytes,
        .kv_int4_bytes = p->kv_int4_bytes,
        .kv_int2_bytes = p->kv_int2_bytes,
        .kv_spare_bytes = p->kv_spare_bytes,
        .window_slides = p->window_slides,
        .window_dropped_tokens = p->window_dropped_tokens,
        .switch_ins = p->switch_ins,
        .switch_in_mean_ms = p->switch_in_mean_ms,
        .sched_mode = strdup(p->sched_mode ? p->sched_mode : ""),
        .sched_step_tokens = p->sched_step_tokens,
        .sched_active_sequences = p->sched_active_sequences,
        .sched_queued_generate = p->sched_queued_generate,
        .sched_queued_embed = p->sched_queued_embed,
        .sched_queued_rerank = p->sched_queued_rerank,
        .sched_steps = p->sched_steps,
        .sched_step_mean_ms = p->sched_step_mean_ms,
        .sched_rows_per_step = p->sched_rows_per_step,
        .sched_longest_stall_ms = p->sched_longest_stall_ms,
        .swap_writes_pending = p->swap_writes_pending,
        .swap_write_waits = p->swap_write_waits,
        .swap_write_wait_ms = p->swap_write_wait_ms,
        .swap_write_failures = p->swap_write_failures,
        .models_resident_bytes = p->models_resident_bytes,
        .models_scratch_bytes = p->models_scratch_bytes,
        .graph_speculations = p->graph_speculations,
        .graph_spec_hits = p->graph_spec_hits,
        .graph_spec_rollbacks = p->graph_spec_rollbacks,
        .graph_spec_saved_ms = p->graph_spec_saved_ms,
        .kv_calibrated_models = p->kv_calibrated_models,
        .kv_calib_forwards_left = p->kv_calib_forwards_left,
        .kv_calibrations = p->kv_calibrations,
        .kb_ivf_searches = p->kb_ivf_searches,
        .kb_ivf_hinted_searches = p->kb_ivf_hinted_searches,
        .kb_ivf_lists_scanned = p->kb_ivf_lists_scanned,
        .kb_ivf_lists_skipped = p->kb_ivf_lists_skipped,
        .kb_ivf_hot_bytes = p->kb_ivf_hot_bytes,
        .kb_ivf_trained = p->kb_ivf_trained,
        .kb_ivf_train_pending = p->kb_ivf_train_pending,
        .qkv_verify_misses = p->qkv_verify_misses,
        .kb_passages = p->kb_passages,
        .kb_text_bytes = p->kb_text_bytes,
        .kb_disk_bytes = p->kb_disk_bytes,
        .kb_disk_measured = p->has_kb_disk_bytes,
        .spec_lookup_steps = p->spec_lookup_steps,
        .spec_lookup_proposed = p->spec_lookup_proposed,
        .spec_lookup_accepted = p->spec_lookup_accepted,
        .spec_draft_steps = p->spec_draft_steps,
        .spec_draft_proposed = p->spec_draft_proposed,
        .spec_draft_accepted = p->spec_draft_accepted,
        .damaged_contexts = p->damaged_contexts,
        .prompt_cache_hits = p->prompt_cache_hits,
        .prompt_cache_misses = p->prompt_cache_misses,
        .prompt_cache_reused_tokens = p->prompt_cache_reused_tokens,
        .prompt_cache_bytes = p->prompt_cache_bytes,
        .prompt_cache_entries = p->prompt_cache_entries,
    };
    cost_models_from(p->cost_models, &out->cost);
    frame_free_response(r);
    if (!out->version || !out->model_path || !out->model_arch || !out->sched_mode) {
        llms_daemon_status_free(out);
        return client_fail(c, LLMS_ERR_INTERNAL, "out of memory");
    }
    return LLMS_OK;
}

void llms_app_list_free(llms_app_info *apps, size_t n)
{
    if (!apps)
        return;
    for (size_t i = 0; i < n; i++)
        free(apps[i].app_name);
    free(apps);
}

enum llms_status llms_list_apps(llms_conn *c, llms_app_info **out, size_t *n_out)
{
    *out = NULL;
    *n_out = 0;
    Llms__Empty e = LLMS__EMPTY__INIT;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_LIST_APPS;
    req.list_apps = &e;
    Llms__Response *r;
    enum llms_status s = client_unary(c, &req, LLMS__RESPONSE__BODY_APPS, &r);
    if (s != LLMS_OK)
        return s;
    size_t n = r->apps->n_apps;
    llms_app_info *apps = calloc(n ? n : 1, sizeof *apps);
    if (!apps) {
        frame_free_response(r);
        return client_fail(c, LLMS_ERR_INTERNAL, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        const Llms__AppInfo *a = r->apps->apps[i];
        apps[i] = (llms_app_info){
            .uid = a->uid,
            .app_name = strdup(a->app_name),
            .n_contexts = a->n_contexts,
            .queued_requests = a->queued_requests,
            .n_connections = a->n_connections,
        };
        if (!apps[i].app_name)
            s = LLMS_ERR_INTERNAL;
    }
    frame_free_response(r);
    if (s != LLMS_OK) {
        llms_app_list_free(apps, n);
        return client_fail(c, s, "out of memory");
    }
    *out = apps;
    *n_out = n;
    return LLMS_OK;
}

enum llms_status llms_evict(llms_conn *c, const char *context_id)
{
    enum llms_status s = client_check_str(c, context_id, "context_id");
    if (s != LLMS_OK)
        return s;
    Llms__EvictContextRequest ev = LLMS__EVICT_CONTEXT_REQUEST__INIT;
    ev.context_id = (char *)context_id;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_EVICT_CONTEXT;
    req.evict_context = &ev;
    return client_unary_ok(c, &req);
}

enum llms_status llms_profile(llms_conn *c, llms_profile_result *out)
{
    memset(out, 0, sizeof *out);
    Llms__Empty e = LLMS__EMPTY__INIT;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_PROFILE;
    req.profile = &e;
    Llms__Response *r;
    enum llms_status s = client_unary(c, &req, LLMS__RESPONSE__BODY_PROFILE, &r);
    if (s != LLMS_OK)
        return s;
    const Llms__ProfileResponse *p = r->profile;
    *out = (llms_profile_result){
        .rec_a = p->rec_a, .rec_b = p->rec_b, .rec_c = p->rec_c, .io_d = p->io_d, .io_e = p->io_e,
    };
    cost_models_from(p->models, &out->models);
    if (!p->models) {
        /* a daemon from before CostModels: the lines it has */
        out->models.rec_a = p->rec_a;
        out->models.rec_b = p->rec_b;
        out->models.rec_c = p->rec_c;
        out->models.io_d = p->io_d;
        out->models.io_e = p->io_e;
    }
    frame_free_response(r);
    return LLMS_OK;
}

enum llms_status llms_plan(llms_conn *c, uint32_t prompt_tokens, const char *model,
                           llms_plan_result *out)
{
    memset(out, 0, sizeof *out);
    Llms__PlanRequest pq = LLMS__PLAN_REQUEST__INIT;
    pq.prompt_tokens = prompt_tokens;
    pq.model = (char *)model;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_PLAN;
    req.plan = &pq;
    Llms__Response *r;
    enum llms_status s = client_unary(c, &req, LLMS__RESPONSE__BODY_PLAN, &r);
    if (s != LLMS_OK)
        return s;
    const Llms__PlanResponse *p = r->plan;
    char *text = strdup(p->text);
    *out = (llms_plan_result){text, p->rows, p->attn_rows, p->working_bytes, p->budget_bytes};
    frame_free_response(r);
    return text ? LLMS_OK : client_fail(c, LLMS_ERR_INTERNAL, "out of memory");
}

void llms_model_list_free(llms_model_info *models, size_t n)
{
    if (!models)
        return;
    for (size_t i = 0; i < n; i++) {
        free(models[i].name);
        free(models[i].path);
        free(models[i].arch);
        free(models[i].type);
        free(models[i].roles);
        free(models[i].default_for);
    }
    free(models);
}

/* "a,b,c" of n strings (never NULL on success). */
static char *join(char *const *s, size_t n)
{
    size_t len = 1;
    for (size_t i = 0; i < n; i++)
        len += strlen(s[i]) + 1;
    char *out = malloc(len);
    if (!out)
        return NULL;
    out[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        if (i)
            strcat(out, ",");
        strcat(out, s[i]);
    }
    return out;
}

enum llms_status llms_list_models(llms_conn *c, llms_model_info **out, size_t *n_out)
{
    *out = NULL;
    *n_out = 0;
    Llms__Empty e = LLMS__EMPTY__INIT;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_LIST_MODELS;
    req.list_models = &e;
    Llms__Response *r;
    enum llms_status s = client_unary(c, &req, LLMS__RESPONSE__BODY_MODELS, &r);
    if (s != LLMS_OK)
        return s;
    size_t n = r->models->n_models;
    llms_model_info *ms = calloc(n ? n : 1, sizeof *ms);
    if (!ms) {
        frame_free_response(r);
        return client_fail(c, LLMS_ERR_INTERNAL, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        const Llms__ModelInfo *m = r->models->models[i];
        ms[i] = (llms_model_info){
            .name = strdup(m->name),
            .path = strdup(m->path),
            .arch = strdup(m->arch),
            .type = strdup(m->type),
            .file_bytes = m->file_bytes,
            .roles = join(m->roles, m->n_roles),
            .default_for = join(m->default_for, m->n_default_for),
            .resident_bytes = m->resident_bytes,
            .scratch_bytes = m->scratch_bytes,
            .running = m->running,
            .generates = m->has_contexts,
            .contexts = m->contexts,
            .kv_bytes = m->kv_bytes,
            .kv_budget_bytes = m->kv_budget_bytes,
        };
        if (!ms[i].name || !ms[i].path || !ms[i].arch || !ms[i].type || !ms[i].roles ||
            !ms[i].default_for)
            s = LLMS_ERR_INTERNAL;
    }
    frame_free_response(r);
    if (s != LLMS_OK) {
        llms_model_list_free(ms, n);
        return client_fail(c, s, "out of memory");
    }
    *out = ms;
    *n_out = n;
    return LLMS_OK;
}

enum llms_status llms_model_load(llms_conn *c, const char *name, const char *path,
                                 const char *roles)
{
    enum llms_status s;
    if ((s = client_check_str(c, name, "name")) != LLMS_OK ||
        (s = client_check_str(c, path, "path")) != LLMS_OK)
        return s;
    char *list[3], buf[64];
    size_t n = 0;
    if (roles && roles[0]) {
        if (strlen(roles) >= sizeof buf)
            return client_fail(c, LLMS_ERR_INVALID_ARGUMENT,
                               "roles '%.64s': at most generate,embed,rerank", roles);
        strcpy(buf, roles);
        for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            if (n == 3)
                return client_fail(c, LLMS_ERR_INVALID_ARGUMENT, "roles '%s': at most three",
                                   roles);
            list[n++] = t;
        }
    }
    Llms__LoadModelRequest lm = LLMS__LOAD_MODEL_REQUEST__INIT;
    lm.name = (char *)name;
    lm.path = (char *)path;
    lm.n_roles = n;
    lm.roles = list;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_LOAD_MODEL;
    req.load_model = &lm;
    return client_unary_ok(c, &req);
}

enum llms_status llms_model_load_lora(llms_conn *c, const char *name, const char *base,
                                      const char *adapters)
{
    enum llms_status s;
    if ((s = client_check_str(c, name, "name")) != LLMS_OK ||
        (s = client_check_str(c, base, "base")) != LLMS_OK ||
        (s = client_check_str(c, adapters, "adapters")) != LLMS_OK)
        return s;
    Llms__LoadModelRequest lm = LLMS__LOAD_MODEL_REQUEST__INIT;
    lm.name = (char *)name;
    lm.path = (char *)base;
    lm.lora = (char *)adapters;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_LOAD_MODEL;
    req.load_model = &lm;
    return client_unary_ok(c, &req);
}

enum llms_status llms_model_unload(llms_conn *c, const char *name)
{
    enum llms_status s = client_check_str(c, name, "name");
    if (s != LLMS_OK)
        return s;
    Llms__UnloadModelRequest um = LLMS__UNLOAD_MODEL_REQUEST__INIT;
    um.name = (char *)name;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_UNLOAD_MODEL;
    req.unload_model = &um;
    return client_unary_ok(c, &req);
}

enum llms_status llms_shutdown(llms_conn *c)
{
    Llms__Empty e = LLMS__EMPTY__INIT;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_SHUTDOWN;
    req.shutdown = &e;
    return client_unary_ok(c, &req);
}
