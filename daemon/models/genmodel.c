/*
 * genmodel.c — a generate model's runner, KV pool and contexts, built for the scheduler.
 */
#include "daemon/models/genmodel.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/reqlog.h"
#include "engine/cuda/cuda.h"

int genmodel_plan(const genmodel *g, const config *cfg, int n_prompt, prefill_plan *p,
                  char err[ERR_MAX])
{
    prefill_request req = {
        .n_prompt = n_prompt, .max_rows = g->max_batch, .max_kv = cfg->n_ctx,
        .n_threads = model_runner_n_threads(g->runner), .kv = KV_F16,
        .budget = (size_t)cfg->prefill_budget_mb << 20,
        .resident_small = cfg->resident_small_mb < 0 ? SIZE_MAX
                                                     : (size_t)cfg->resident_small_mb << 20,
    };
    return prefill_plan_make(g->me->m, &req, p, err);
}

/* Replaces the runner by one whose steps fit the prompt of n_ctx tokens under the
 * prefill budget, with weights resident by size when resident_small_mb asks. */
static int plan_runner(genmodel *g, const genmodel_opts *o, char err[ERR_MAX])
{
    const config *cfg = o->cfg;
    const model *m = g->me->m;
    prefill_plan p;
    if (genmodel_plan(g, cfg, cfg->n_ctx, &p, err) < 0)
        return -1;
    if (p.est.rows < o->max_active + 16)
        return err_set(err, "prefill_budget_mb %d: steps of %d rows are below the scheduler's "
                            "%d decode rows + 16; %.1f MiB are needed", cfg->prefill_budget_mb,
                       p.est.rows, o->max_active,
                       (double)prefill_estimate_of(model_hparams_of(m), o->max_active + 16,
                                                   MODEL_ATTN_ROWS_DEFAULT, cfg->n_ctx,
                                                   p.req.n_threads, KV_F16).working /
                           (1 << 20));
    g->max_batch = p.est.rows;
    if (g->step_tokens > g->max_batch - o->max_active)
        g->step_tokens = g->max_batch - o->max_active;
    model_runner_free(g->runner);
    model_runner_opts ro = prefill_runner_opts(&p);
    if (!(g->runner = model_runner_new_opts(m, &ro, err)))
        return -1;
    if (cfg->resident_small_mb >= 0 &&
        model_runner_stream_weights(g->runner, p.req.resident_small, err) < 0)
        return -1;
    return 0;
}

/* An adapter model's runner, logits and tokenizer: its base's (o->share), its runner's
 * steps as many rows. */
static int share_parts(genmodel *g, const genmodel_opts *o, char err[ERR_MAX])
{
    const genmodel *b = o->share;
    g->tok = b->tok;
    g->family = g->me->family;
    g->n_vocab = b->n_vocab;
    g->step_tokens = b->step_tokens;
    g->max_batch = b->max_batch;
    g->logits = b->logits;
    /* the base's runner runs this model's rows too in steps shared with the base
     * (daemon/sched/sched.c, run_step_shared): room for its adapters there */
    int rank = 0;
    for (int i = 0; i < g->me->n_lora; i++)
        rank = lora_max_rank(g->me->lora[i]) > rank ? lora_max_rank(g->me->lora[i]) : rank;
    if (model_runner_reserve_lora(b->runner, rank, err) < 0 ||
        !(g->runner = model_runner_new_shared(g->me->m, b->runner, err)) ||
        !(g->pool = kv_pool_new(model_kv_shape(g->me->m), 0, err)))
        return -1;
    g->cm = ctx_open_owned(o->st, g->pool, g->runner, g->me->m, o->policy, o->owns, o->owns_arg,
                           err);
    return g->cm ? 0 : -1;
}

/* The runner on the configured GPU; a model or a machine the GPU cannot take stays on the
 * CPU, said in the log (config.c: device). */
static void use_device(genmodel *g, const config *cfg)
{
    char err[ERR_MAX];
    int device;
    if (cuda_parse_device(cfg->device, &device, err) < 0 || device < 0)
        return;
    if (model_runner_use_gpu(g->runner, device, err) < 0) {
        if (reqlog_enabled(REQLOG_WARN))
            fprintf(stderr, "llmsd: warn: model %s stays on the CPU: %s\n", g->me->name, err);
        return;
    }
    if (reqlog_enabled(REQLOG_INFO))
        fprintf(stderr, "llmsd: model %s runs on %s\n", g->me->name,
                model_runner_gpu_name(g->runner));
}

static int open_parts(genmodel *g, const genmodel_opts *o, char err[ERR_MAX])
{
    const config *cfg = o->cfg;
    const model *m = g->me->m;
    if (o->share)
        return share_parts(g, o, err);
    if (o->tok) {
        g->tok = o->tok;
    } else {
        if (tok_load(model_gguf(m), &g->own_tok, err))
            return -1;
        g->tok = g->own_tok;
    }
    g->family = g->me->family;
    g->n_vocab = model_hparams_of(m)->n_vocab;
    g->step_tokens = cfg->step_tokens;
    /* Prompts evaluated whole (switch-in recompute, serial mode) go in sub-batches of
     * max_batch: at least 512 rows keeps sgemm efficient. */
    g->max_batch = o->max_active + g->step_tokens > 512 ? o->max_active + g->step_tokens : 512;
    if (!(g->runner = model_runner_new(m, cfg->threads, g->max_batch, cfg->n_ctx, err)))
        return -1;
    /* sized for the longest prompt, so that every prompt the window admits fits */
    if ((cfg->prefill_budget_mb > 0 || cfg->resident_small_mb >= 0) && plan_runner(g, o, err))
        return -1;
    use_device(g, cfg);
    if (!(g->pool = kv_pool_new(model_kv_shape(m), 0, err)))
        return -1;
    /* one out row per running request, and the draft rows speculation may add */
    size_t out_rows = (size_t)o->max_active + (size_t)o->cfg->speculate_rows;
    if (!(g->logits = g->own_logits = malloc(sizeof *g->logits * (size_t)g->n_vocab * out_rows)))
        return err_set(err, "out of memory");
    g->cm = ctx_open_owned(o->st, g->pool, g->runner, m, o->policy, o->owns, o->owns_arg, err);
    return g->cm ? 0 : -1;
}

genmodel *genmodel_open(models_entry *me, const genmodel_opts *o, char err[ERR_MAX])
{
    char why[ERR_MAX];
    genmodel *g = calloc(1, sizeof *g);
    if (!g) {
        err_set(err, "out of memory");
        return NULL;
    }
    g->me = me;
    if (open_parts(g, o, why)) {
        err_set(err, "model '%s': %s", me->name, why);
        genmodel_free(g);
        return NULL;
    }
    return g;
}

void genmodel_free(genmodel *g)
{
    if (!g)
        return;
    ctx_close(g->cm);
    free(g->own_logits);
    kv_pool_free(g->pool);
    model_pause_free(g->idle_pause);
    model_runner_free(g->runner);
    tok_free(g->own_tok);
    jsonmask_vocab_free(g->json_vocab);
    grammar_vocab_free(g->grammar_vocab);
    free(g->dry_default);
    free(g);
}
