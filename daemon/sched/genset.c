/*
 * genset.c — the generate models the worker serves (s->gm, slot 0 the default) and
 * lookups over all their contexts: which model a context or a registry entry runs on,
 * every context model by model, a model's start (at startup and LoadModel), the check
 * before UnloadModel, and each model's share of kv_budget_mb.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/sched/sched_internal.h"

/* The slot of the generate model whose contexts cm holds. */
static int gm_slot_of_cm(const sched *s, const ctxmgr *cm)
{
    for (int k = 0; k < SCHED_GEN_MAX; k++)
        if (s->gm[k] && s->gm[k]->cm == cm)
            return k;
    return -1;
}

int genset_slot(const sched *s, const genmodel *gm)
{
    return gm_slot_of_cm(s, gm->cm);
}

/* The running generate model of a registry entry, NULL when it has none. */
genmodel *genset_of_entry(const sched *s, const models_entry *me)
{
    for (int k = 0; k < SCHED_GEN_MAX; k++)
        if (s->gm[k] && s->gm[k]->me == me)
            return s->gm[k];
    return NULL;
}

genmodel *genset_of_ctx(const sched *s, const ctx_entry *c)
{
    return s->gm[gm_slot_of_cm(s, c->cm)];
}

/* The model a context belongs to (one from before the registry: the default's). */
const char *genset_ctx_model(const sched *s, const ctx_entry *c)
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

ctx_entry *genset_ctx_first(sched *s)
{
    return ctx_all_from(s, 0);
}

ctx_entry *genset_ctx_next(sched *s, const ctx_entry *c)
{
    return c->next ? c->next : ctx_all_from(s, gm_slot_of_cm(s, c->cm) + 1);
}

/* The context with this id of app (uid, app), or of any app when app is NULL. */
ctx_entry *genset_ctx_find(sched *s, const char *id, uint32_t uid, const char *app)
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

int genset_ctx_count_app(const sched *s, uint32_t uid, const char *app)
{
    int n = 0;
    for (int k = 0; k < SCHED_GEN_MAX; k++)
        n += s->gm[k] ? ctx_count_app(s->gm[k]->cm, uid, app) : 0;
    return n;
}

int genset_ctx_count(const sched *s)
{
    int n = 0;
    for (int k = 0; k < SCHED_GEN_MAX; k++)
        n += s->gm[k] ? ctx_count(s->gm[k]->cm) : 0;
    return n;
}

int genset_count(const sched *s)
{
    int n = 0;
    for (int k = 0; k < SCHED_GEN_MAX; k++)
        n += s->gm[k] != NULL;
    return n;
}

/* Each generate model's share of kv_budget_mb: equal parts, set again whenever one
 * comes or goes (a smaller share reclaims idle contexts' chunks at once). */
static void genset_split_budget(sched *s)
{
    size_t total = (size_t)s->env.cfg->kv_budget_mb << 20;
    int n = genset_count(s);
    for (int k = 0; k < SCHED_GEN_MAX; k++)
        if (s->gm[k]) {
            ctx_policy p = *ctx_get_policy(s->gm[k]->cm);
            p.budget_bytes = total / (size_t)n;
            ctx_set_policy(s->gm[k]->cm, &p);
            if (s->pcache[k])
                pcache_set_max(s->pcache[k], ((size_t)s->env.cfg->prompt_cache_mb << 20) /
                                                 (size_t)n);
            ctx_enforce_budget(s->gm[k]->cm);
        }
}

/* Starts serving the generate model me (its weights in the registry) in a free slot:
 * its runner, pool and the contexts that belong to it; tok lends its tokenizer (NULL:
 * loaded from the file). */
static int genset_add(sched *s, models_entry *me, const tokenizer *tok, char err[ERR_MAX])
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
        .budget_bytes = ((size_t)cfg->kv_budget_mb << 20) / (size_t)(genset_count(s) + 1),
        .compress = strcmp(cfg->kv_compress, "none") == 0   ? CTX_COMPRESS_NONE
                    : strcmp(cfg->kv_compress, "int8") == 0 ? CTX_COMPRESS_INT8
                                                            : CTX_COMPRESS_TOLERANCE,
        .compress_ratio = cfg->kv_compress_ratio,
        .calib_inline_ms = cfg->kv_calib_inline_ms,
        .swap = CTX_SWAP_AHEAD,
        .switch_mode = CTX_SWITCH_PLAN,
    };
    ctx_owner owner = {s, me};
    genmodel_opts o = {cfg, s->env.st, SCHED_MAX_ACTIVE, tok, &policy, ctx_owner_owns, &owner,
                       me->base ? genset_of_entry(s, me->base) : NULL};
    if (me->base && !o.share)
        return err_set(err, "model '%s': its base '%s' does not run", me->name, me->base->name);
    genmodel *gm = genmodel_open(me, &o, err);
    if (!gm)
        return -1;
    if (sched_step_room(s, gm->max_batch) < 0) {
        genmodel_free(gm);
        return err_set(err, "out of memory");
    }
    if (cfg->prompt_cache_mb > 0 && !s->serial) {
        /* its share is set with the KV budget's (genset_split_budget) */
        if (!(s->pcache[k] = pcache_new(gm->pool, 0))) {
            genmodel_free(gm);
            return err_set(err, "out of memory");
        }
        ctx_set_shed(gm->cm, pcache_shed, s->pcache[k]);
    }
    ctx_set_write_notify(gm->cm, sched_writes_done, s);
    gm->piece_max = logprobs_piece_max(gm->tok);
    for (app_state *a = s->apps; a; a = a->next)
        a->deficit[k] = 0;
    s->drr_next[k] = NULL;
    s->gm[k] = gm;
    return 0;
}

int genset_start(sched *s, char err[ERR_MAX])
{
    /* The default generate model first: it keeps the contexts of models not loaded. */
    models *reg = s->env.reg;
    for (models_entry *e = (models_entry *)models_first(reg); e; e = e->next)
        if ((e->roles & MODELS_GENERATE) &&
            genset_add(s, e, e == models_generate(reg) ? s->env.tok : NULL, err) < 0)
            return -1;
    genset_split_budget(s);
    atomic_store(&s->n_contexts, (unsigned)genset_ctx_count(s));
    return 0;
}

/* A generate model loaded at run time: its contexts, kept by the default model while it
 * was not loaded, move to it (read again from the store). */
int genset_load(sched *s, models_entry *me, char err[ERR_MAX])
{
    if (genset_add(s, me, NULL, err) < 0)
        return -1;
    ctxmgr *def = s->gm[0]->cm;
    for (ctx_entry *c = ctx_first(def), *next; c; c = next) {
        next = c->next;
        if (c->model && strcmp(c->model, me->name) == 0)
            ctx_forget(def, c);
    }
    genset_split_budget(s);
    atomic_store(&s->n_contexts, (unsigned)genset_ctx_count(s));
    return 0;
}

/* Whether a generate model other than the default may go: no work running on it and no
 * context of it (its contexts would lose their model; deleting them, or a restart
 * without the model, which keeps them as history, are the ways). -1 + err naming them. */
static int genset_unload_check(const sched *s, const genmodel *gm, char err[ERR_MAX])
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

int genset_unload(sched *s, genmodel *gm, char err[ERR_MAX])
{
    if (genset_unload_check(s, gm, err) < 0)
        return -1;
    int k = genset_slot(s, gm);
    s->gm[k] = NULL;
    /* its entries' chunks go back to the pool before the pool goes; its counts stay */
    if (s->pcache[k]) {
        pcache_stats ps = pcache_get_stats(s->pcache[k]);
        s->pcache_gone.hits += ps.hits;
        s->pcache_gone.misses += ps.misses;
        s->pcache_gone.reused_tokens += ps.reused_tokens;
    }
    pcache_free(s->pcache[k]);
    s->pcache[k] = NULL;
    genmodel_free(gm);
    genset_split_budget(s);
    return 0;
}
