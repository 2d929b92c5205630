/*
 * genmodel.h — one generate model as the scheduler runs it: its registry entry, its
 * tokenizer and chat template, a model runner whose rows per step are planned under
 * prefill_budget_mb, a KV pool, the context manager of the contexts that belong to it,
 * and the logits of its steps. The scheduler holds one per generate model of the
 * registry and runs one batched forward per model that has work in each step.
 *
 * Only the worker thread touches a genmodel after genmodel_open returns.
 */
#ifndef LLMS_GENMODEL_H
#define LLMS_GENMODEL_H

#include <stddef.h>

#include "daemon/config.h"
#include "daemon/ctx/ctxmgr.h"
#include "daemon/models/models.h"
#include "engine/tok/chat.h"
#include "engine/err.h"
#include "engine/kv/kv.h"
#include "engine/model/grammar.h"
#include "engine/model/jsonmask.h"
#include "engine/model/model.h"
#include "engine/model/prefill.h"
#include "engine/model/sampler.h"
#include "engine/tok/tokenizer.h"
#include "storage/store.h"

typedef struct genmodel {
    models_entry *me;        /* the registry's entry: name, weights (me->m) */
    const tokenizer *tok;    /* own_tok, or the caller's (genmodel_opts.tok) */
    tokenizer *own_tok;      /* loaded here; NULL when the caller lent one */
    enum chat_family family; /* from the file's tokenizer.chat_template */
    model_runner *runner;
    kv_pool *pool;
    ctxmgr *cm;              /* the contexts of this model */
    int max_batch;           /* rows of one forward: decode rows + step_tokens at least */
    int step_tokens;         /* rows of long work per step (the plan may lower the setting) */
    int n_vocab;
    float *logits;           /* (max_active + speculate_rows, n_vocab) the out rows of a
                                step: one per request, and speculation's draft rows (an
                                adapter model's are its base's: steps run one at a time) */
    float *own_logits;       /* logits when it allocated them, else NULL */
    size_t kv_reserved;      /* KV bytes admission counted for the work running on it */
    jsonmask_vocab *json_vocab; /* every token's bytes, for JSON mode: built by its first
                                   JSON-mode generation (NULL before) */
    grammar_vocab *grammar_vocab; /* the same for grammars: built by the first generation
                                     with a grammar (NULL before) */
    sampler_breaker *dry_default; /* llama.cpp's DRY breakers as token sequences: built by
                                     the first generation with DRY and no breakers of its
                                     own (NULL before; drybreak.h) */
    int n_dry_default;
    size_t piece_max;        /* the longest token text a TokenLogprob carries (set by the
                                scheduler at load): what a reply's logprobs may take */
    model_pause *idle_pause; /* keeps the idle-time forward a job stopped, so that it goes
                                on from there (model.h): made by the first prediction step
                                on this model (NULL before) */
} genmodel;

typedef struct genmodel_opts {
    const config *cfg;          /* resolved: n_ctx set */
    store *st;
    int max_active;             /* decode rows a step may hold (one per running request) */
    const tokenizer *tok;       /* the model's tokenizer when the caller has one; NULL:
                                   loaded from the file */
    const ctx_policy *policy;   /* its budget_bytes is this model's share */
    ctx_owns_fn owns;           /* which stored contexts are this model's */
    void *owns_arg;
    /* An adapter model's base (me->base), running: its runner's pool and scratch, its
     * logits and tokenizer serve this model too (engine/model/model.h,
     * model_runner_new_shared: the worker runs one model's forward at a time), so an
     * adapter model costs its adapters' scratch, not a runner's; NULL otherwise. */
    const struct genmodel *share;
} genmodel_opts;

/* Builds the runner (planned when prefill_budget_mb or resident_small_mb is set; an
 * adapter model's on its base's, o->share), the pool and the context manager of me, a
 * model of the registry with the generate role. NULL + err (naming the model) on
 * failure. */
genmodel *genmodel_open(models_entry *me, const genmodel_opts *o, char err[ERR_MAX]);

/* NULL is allowed. Closes the context manager (its writes flushed) and frees the rest;
 * the registry entry stays. */
void genmodel_free(genmodel *g);

/* The prefill plan of a prompt of n_prompt tokens on g's runner under cfg's budgets. */
int genmodel_plan(const genmodel *g, const config *cfg, int n_prompt, prefill_plan *p,
                  char err[ERR_MAX]);

#endif
