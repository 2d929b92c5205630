/*
 * generate.c — one generation (a Call's, Complete's, RagQuery's, or a graph generation
 * node's): its prompt and sampling settings, the tokens it takes from the steps, the
 * text it releases past the stop strings, a WINDOW context's slide, a Call's switch-in,
 * and its end (the turn persisted, the result answered).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/prompt.h"
#include "daemon/reqlog.h"
#include "daemon/sched/sched_internal.h"
#include "daemon/textbuf.h"
#include "engine/model/drybreak.h"

/* A generation's settings, merged from its layers. */
typedef struct merged_params {
    sampler_params sp;
    int max_tokens;
    const Llms__GenerationParams *stops; /* the layer whose stop strings apply, or NULL */
    const Llms__GenerationParams *bias;  /* the layer whose logit_bias applies, or NULL */
    const Llms__GenerationParams *breakers; /* the layer whose DRY breakers apply, or NULL */
    int logprobs;                        /* -1: none */
    unsigned speculate;
    bool json;                           /* FORMAT_JSON_OBJECT or _SCHEMA */
    const char *json_schema;             /* FORMAT_JSON_SCHEMA's schema, else NULL */
    const char *grammar;                 /* FORMAT_GRAMMAR's grammar, else NULL */
    bool ignore_eos;                     /* end-of-generation tokens are banned */
} merged_params;

/* llama.cpp's other samplers' settings of layer p into sp (the samplers order a list
 * that comes whole from the last layer that has one). */
static void merge_newer_samplers(const Llms__GenerationParams *p, sampler_params *sp)
{
    if (p->has_min_keep)
        sp->min_keep = p->min_keep;
    if (p->has_typical_p)
        sp->typical_p = p->typical_p;
    if (p->has_top_n_sigma)
        sp->top_n_sigma = p->top_n_sigma;
    if (p->has_xtc_probability)
        sp->xtc_probability = p->xtc_probability;
    if (p->has_xtc_threshold)
        sp->xtc_threshold = p->xtc_threshold;
    if (p->has_dynatemp_range)
        sp->dynatemp_range = p->dynatemp_range;
    if (p->has_dynatemp_exponent)
        sp->dynatemp_exponent = p->dynatemp_exponent;
    if (p->has_dry_multiplier)
        sp->dry_multiplier = p->dry_multiplier;
    if (p->has_dry_base)
        sp->dry_base = p->dry_base;
    if (p->has_dry_allowed_length)
        sp->dry_allowed_length = p->dry_allowed_length;
    if (p->has_dry_penalty_last_n)
        sp->dry_penalty_last_n = p->dry_penalty_last_n;
    if (p->has_mirostat)
        sp->mirostat = p->mirostat;
    if (p->has_mirostat_tau)
        sp->mirostat_tau = p->mirostat_tau;
    if (p->has_mirostat_eta)
        sp->mirostat_eta = p->mirostat_eta;
    static const enum sampler_step step_of[] = {
        [LLMS__SAMPLER_STEP__SAMPLER_PENALTIES] = SAMPLER_PENALTIES,
        [LLMS__SAMPLER_STEP__SAMPLER_DRY] = SAMPLER_DRY,
        [LLMS__SAMPLER_STEP__SAMPLER_TOP_N_SIGMA] = SAMPLER_TOP_N_SIGMA,
        [LLMS__SAMPLER_STEP__SAMPLER_TOP_K] = SAMPLER_TOP_K,
        [LLMS__SAMPLER_STEP__SAMPLER_TYPICAL] = SAMPLER_TYPICAL,
        [LLMS__SAMPLER_STEP__SAMPLER_TOP_P] = SAMPLER_TOP_P,
        [LLMS__SAMPLER_STEP__SAMPLER_MIN_P] = SAMPLER_MIN_P,
        [LLMS__SAMPLER_STEP__SAMPLER_XTC] = SAMPLER_XTC,
        [LLMS__SAMPLER_STEP__SAMPLER_TEMPERATURE] = SAMPLER_TEMPERATURE,
    };
    if (p->n_samplers > 0) {
        /* the session took each step once: at most SAMPLER_STEPS of them */
        sp->n_order = (int)p->n_samplers;
        for (size_t i = 0; i < p->n_samplers; i++)
            sp->order[i] = step_of[p->samplers[i]];
    }
}

/* Sampling settings: the request's, else the context's defaults, else the config's; a
 * list (stop strings, logit_bias, DRY's breakers, the samplers order) comes whole from
 * the last layer that has one. */
static void merge_params(const config *cfg, const Llms__GenerationParams *ctx_p,
                         const Llms__GenerationParams *req_p, merged_params *m)
{
    sampler_params *sp = &m->sp;
    *sp = (sampler_params){
        .temperature = cfg->temperature,
        .top_k = cfg->top_k,
        .top_p = cfg->top_p,
        .min_p = cfg->min_p,
        .repeat_penalty = cfg->repeat_penalty,
        .frequency_penalty = cfg->frequency_penalty,
        .presence_penalty = cfg->presence_penalty,
        .repeat_last_n = cfg->repeat_last_n,
        .min_keep = cfg->min_keep,
        .typical_p = cfg->typical_p,
        .top_n_sigma = cfg->top_n_sigma,
        .xtc_probability = cfg->xtc_probability,
        .xtc_threshold = cfg->xtc_threshold,
        .dynatemp_range = cfg->dynatemp_range,
        .dynatemp_exponent = cfg->dynatemp_exponent,
        .dry_multiplier = cfg->dry_multiplier,
        .dry_base = cfg->dry_base,
        .dry_allowed_length = cfg->dry_allowed_length,
        .dry_penalty_last_n = cfg->dry_penalty_last_n,
        .mirostat = cfg->mirostat,
        .mirostat_tau = cfg->mirostat_tau,
        .mirostat_eta = cfg->mirostat_eta,
        .seed = SAMPLER_SEED_RANDOM,
    };
    m->stops = m->bias = m->breakers = NULL;
    m->json = false;
    m->json_schema = NULL;
    m->grammar = NULL;
    m->ignore_eos = false;
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
        if (p->has_frequency_penalty)
            sp->frequency_penalty = p->frequency_penalty;
        if (p->has_presence_penalty)
            sp->presence_penalty = p->presence_penalty;
        if (p->has_repeat_last_n)
            sp->repeat_last_n = p->repeat_last_n;
        if (p->has_seed)
            sp->seed = p->seed;
        merge_newer_samplers(p, sp);
        if (p->n_dry_sequence_breakers > 0)
            m->breakers = p;
        if (p->n_stop > 0)
            m->stops = p;
        if (p->n_logit_bias > 0)
            m->bias = p;
        if (p->has_ignore_eos)
            m->ignore_eos = p->ignore_eos;
        if (p->has_format) {
            m->json = p->format == LLMS__RESPONSE_FORMAT__FORMAT_JSON_OBJECT ||
                      p->format == LLMS__RESPONSE_FORMAT__FORMAT_JSON_SCHEMA;
            m->json_schema =
                p->format == LLMS__RESPONSE_FORMAT__FORMAT_JSON_SCHEMA ? p->json_schema : NULL;
            m->grammar = p->format == LLMS__RESPONSE_FORMAT__FORMAT_GRAMMAR ? p->grammar : NULL;
        }
    }
    m->max_tokens = gen_max_tokens_of_params(cfg, layers, 2);
    m->logprobs = gen_logprobs_of_params(layers, 2);
    m->speculate = spec_mode_of_params(cfg, layers, 2);
}

int gen_logprobs_of_params(const Llms__GenerationParams *const *layers, int n)
{
    int logprobs = -1;
    for (int i = 0; i < n; i++)
        if (layers[i] && layers[i]->has_logprobs)
            logprobs = layers[i]->logprobs;
    return logprobs;
}

int gen_max_tokens_of_params(const config *cfg, const Llms__GenerationParams *const *layers,
                             int n)
{
    int max_tokens = cfg->max_tokens;
    for (int i = 0; i < n; i++)
        if (layers[i] && layers[i]->has_max_tokens)
            max_tokens = layers[i]->max_tokens;
    return max_tokens;
}

void gen_free(gen *g)
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
    free(g->piece);
    free(g->passed);
    free(g->released);
    free(g->lp);
    logprobs_pb_free(&g->lp_chunk);
    spec_gen_free(g);
    sampler_free(g->smp);
    jsonschema_free(g->schema);
    grammar_cursor_free(g->gram);
    grammar_free(g->grammar);
    free(g);
}

/* The prompt cache a generation may resume from and be kept in: a Complete's (a graph
 * node's prompt and idle-time prediction's are left alone) that does not draft with the
 * draft model (whose own KV of the prompt the cache does not hold), on its model; NULL
 * when none. */
static pcache *gen_pcache(const sched *s, const gen *g, const sched_job *j, bool graph)
{
    if (g->c || g->rq || graph || j == &s->pred_job || g->drafter)
        return NULL;
    return s->pcache[genset_slot(s, g->gm)];
}

/* Room under the KV budget for a copy of a cached prompt (pcache_claim_fn): the
 * generation would have made that KV itself, within what admission reserved for it. */
static int claim_kv(void *cm, size_t bytes)
{
    char err[ERR_MAX];
    return ctx_claim(cm, bytes, err) == 0 ? 0 : -1;
}

/* Room for a copy kept only in case (pcache_claim_fn): what is free under the budget,
 * never a context's chunk. */
static int free_room(void *cm, size_t bytes)
{
    return ctx_budget_room(cm) >= bytes ? 0 : -1;
}

void gen_prompt_evaluated(sched *s, work *w)
{
    gen *g = w->g;
    pcache *pc = gen_pcache(s, g, w->job, w->gw != NULL);
    if (pc)
        pcache_put_copy(pc, w->job->uid, w->job->app, g->turn, g->n_turn, g->gm->step_tokens,
                        g->seq, free_room, g->gm->cm);
}

/* Whether l, before w among the active work, is a Complete of w's app and model that
 * evaluates a prompt beginning as w's does, and will keep it in the prompt cache. The
 * tokens they share must be at least step_tokens and half of each prompt: waiting for
 * a long prompt to reuse a short start of it would delay w more than it saves. */
static bool evaluates_the_same_start(const sched *s, const work *l, const work *w)
{
    const gen *lg = l->g, *g = w->g;
    if (!lg || l->gm != w->gm || lg->prefilled || lg->done || l->job->uid != w->job->uid ||
        strcmp(l->job->app, w->job->app) != 0 || !gen_pcache(s, lg, l->job, l->gw != NULL))
        return false;
    int n = lg->n_turn < g->n_turn ? lg->n_turn : g->n_turn, shared = 0;
    while (shared < n && lg->turn[shared] == g->turn[shared])
        shared++;
    return shared >= g->gm->step_tokens && 2 * shared >= g->n_turn && 2 * shared >= lg->n_turn;
}

bool gen_waits_for_shared_prompt(const sched *s, work *w)
{
    gen *g = w->g;
    if (g->prefilled || g->n_turn < g->gm->step_tokens || kv_seq_n_tokens(g->seq) > 0 ||
        !gen_pcache(s, g, w->job, w->gw != NULL))
        return false;
    /* only earlier work leads: no two wait for each other */
    for (int i = 0; i < s->n_active && s->active[i] != w; i++)
        if (evaluates_the_same_start(s, s->active[i], w))
            return g->waited = true;
    return false;
}

void gen_resume_after_wait(sched *s, work *w)
{
    gen *g = w->g;
    g->waited = false;
    pcache *pc = gen_pcache(s, g, w->job, w->gw != NULL);
    if (pc && kv_seq_n_tokens(g->seq) == 0)
        g->n_cached = pcache_take(pc, w->job->uid, w->job->app, g->turn, g->n_turn,
                                  g->gm->step_tokens, claim_kv, g->gm->cm, &g->own_seq);
}

/* A CallResult's bytes besides its text and logprobs: the Response's id and tags, the
 * token counts, timings, stop reason and string and window slides, at their widest. */
#define RESULT_FIXED_BYTES (128 + STOP_MAX_LEN)

/* Whether the CallResult of g's reply, with the logprobs it asks for, may outgrow
 * max_frame_bytes: it would be answered with an error after all its compute, so it is
 * refused before any (err says how many tokens fit). Every token counts at its widest:
 * its text and its alternatives' as long as the vocabulary's longest, its text in the
 * reply with every byte a U+FFFD. */
static bool logprobs_outgrow_frame(const config *cfg, const gen *g, int n_turn,
                                   char err[ERR_MAX])
{
    /* a WINDOW context's reply slides on to max_tokens; any other stops at the limit */
    long room_left = (long)g->limit - g->n_base - n_turn;
    long reply = g->window || g->max_gen < room_left ? g->max_gen : room_left;
    size_t per_token = logprobs_step_wire_bytes(g->logprobs, g->gm->piece_max) +
                       3 * g->gm->piece_max;
    size_t room = cfg->max_frame_bytes - RESULT_FIXED_BYTES; /* max_frame_bytes >= 1024 */
    if ((size_t)reply * per_token <= room)
        return false;
    err_set(err, "a reply of %ld tokens with %d logprobs alternatives each may take %zu bytes, "
                 "more than max_frame_bytes (%u) holds: at most %zu tokens fit (max_tokens), "
                 "or ask for fewer alternatives", reply, g->logprobs, (size_t)reply * per_token,
            cfg->max_frame_bytes, room / per_token);
    return true;
}

/* DRY's sequence breakers of mp as token sequences of gm's vocabulary, into mp->sp: a
 * layer's own into *out (to free once the sampler has its copy), llama.cpp's the model's
 * (made once); none when DRY is off. 0, or -1 with err. */
static int dry_breakers(genmodel *gm, merged_params *mp, sampler_breaker **out,
                        char err[ERR_MAX])
{
    sampler_params *sp = &mp->sp;
    const Llms__GenerationParams *b = mp->breakers;
    *out = NULL;
    if (sp->dry_multiplier == 0.0f || sp->dry_penalty_last_n == 0 || sp->mirostat)
        return 0;
    if (!b) {
        if (!gm->dry_default && drybreak_tokens(gm->tok, drybreak_default, DRYBREAK_N_DEFAULT,
                                                &gm->dry_default, &gm->n_dry_default, err))
            return -1;
        sp->dry_breakers = gm->dry_default;
        sp->n_dry_breakers = gm->n_dry_default;
        return 0;
    }
    if (drybreak_tokens(gm->tok, (const char *const *)b->dry_sequence_breakers,
                        (int)b->n_dry_sequence_breakers, out, &sp->n_dry_breakers, err))
        return -1;
    sp->dry_breakers = *out;
    return 0;
}

/* The generation's own sequence (not a context's), in the model's window. */
static void gen_use_own_seq(const config *cfg, gen *g)
{
    kv_seq_init(&g->own_seq, g->gm->pool);
    g->seq = &g->own_seq;
    g->switched_in = true;
    g->limit = cfg->n_ctx;
}

/* A Call's turn after context c's tokens, its parameters over c's defaults into mp. The
 * error's code, or OK. */
static Llms__ErrorCode gen_call_turn(const config *cfg, gen *g, const sched_job *j,
                                     ctx_entry *c, merged_params *mp, bool *templated,
                                     int32_t **turn, int *n_turn, char err[ERR_MAX])
{
    genmodel *gm = g->gm;
    const Llms__CallRequest *cr = j->req->call;
    *templated = !(cr->has_raw && cr->raw);
    g->user_role = *templated ? "user" : "raw";
    /* ids outside the vocabulary (its file replaced by another model's, a damaged store)
     * fail the forward of every recompute as INTERNAL: say why, once */
    for (int i = 0; i < c->n_tokens; i++)
        if (c->tokens[i] < 0 || c->tokens[i] >= gm->n_vocab) {
            err_set(err, "context '%s' holds token id %d, outside the model's vocabulary of "
                         "%d: it was made with another model file (delete it)",
                    c->id, c->tokens[i], gm->n_vocab);
            return LLMS__ERROR_CODE__FAILED_PRECONDITION;
        }
    if (prompt_turn(gm->tok, gm->family, c, cr->prompt, !*templated, turn, n_turn, err))
        return LLMS__ERROR_CODE__INTERNAL;
    g->seq = &c->seq;
    g->n_base = c->n_tokens;
    g->limit = cfg->max_tokens_per_context;
    merge_params(cfg, c->defaults, cr->params, mp);
    return LLMS__ERROR_CODE__OK;
}

/* A RagQuery's turn: the prompt its retrieval builds. OK with g->rq NULL when the query
 * was answered already (from the QA bank, or with an error). */
static Llms__ErrorCode gen_rag_turn(sched *s, gen *g, const sched_job *j, merged_params *mp,
                                    int32_t **turn, int *n_turn, char err[ERR_MAX])
{
    gen_use_own_seq(s->env.cfg, g);
    /* before the query starts: a QA entry answers only a query of its reply length, and
     * only a free-text one */
    merge_params(s->env.cfg, NULL, j->req->rag_query->params, mp);
    bool cached = false;
    g->rq = j == &s->pred_job
                ? rag_begin_predicted(s->rag, j->uid, j->app, j->req, mp->max_tokens,
                                      &s->pred_task, g->seq, &cached)
                : rag_begin(s->rag, j->conn_id, j->uid, j->app, j->req, mp->max_tokens,
                            mp->json || mp->grammar, g->seq, j->queued_ns);
    s->pred_cached = cached;
    if (!g->rq)
        return LLMS__ERROR_CODE__OK;
    const int32_t *pt = rag_prompt(g->rq, n_turn);
    if (!(*turn = malloc(sizeof **turn * (size_t)(*n_turn ? *n_turn : 1)))) {
        err_set(err, "out of memory");
        return LLMS__ERROR_CODE__INTERNAL;
    }
    memcpy(*turn, pt, sizeof **turn * (size_t)*n_turn);
    return LLMS__ERROR_CODE__OK;
}

/* A Complete's turn, or with gg a graph node's prompt as a Complete of it would be. */
static Llms__ErrorCode gen_complete_turn(const config *cfg, gen *g, const sched_job *j,
                                         const graph_gen *gg, merged_params *mp,
                                         bool *templated, int32_t **turn, int *n_turn,
                                         char err[ERR_MAX])
{
    genmodel *gm = g->gm;
    const Llms__CompleteRequest *cr = gg ? NULL : j->req->complete;
    *templated = gg ? gg->chat : cr->has_chat && cr->chat;
    if (cr && cr->n_prompt_parts) {
        for (size_t i = 0; i < cr->n_prompt_parts; i++)
            for (size_t k = 0; k < cr->prompt_parts[i]->n_tokens; k++)
                if (cr->prompt_parts[i]->tokens[k] >= gm->n_vocab) {
                    err_set(err, "prompt_parts[%zu]: token id %d is outside the model's "
                                 "vocabulary of %d", i, cr->prompt_parts[i]->tokens[k],
                            gm->n_vocab);
                    return LLMS__ERROR_CODE__INVALID_ARGUMENT;
                }
        if (prompt_parts_tokens(gm->tok, cr->prompt_parts, cr->n_prompt_parts, turn, n_turn,
                                err))
            return LLMS__ERROR_CODE__INTERNAL;
    } else {
        bool thinking = !cr || !cr->has_enable_thinking || cr->enable_thinking;
        char *text = prompt_complete_text(gm->family, gg ? gg->prompt : cr->prompt, *templated,
                                          gg ? NULL : cr->system_prompt, thinking, err);
        if (!text)
            return LLMS__ERROR_CODE__INTERNAL;
        int rc = prompt_tokenize(gm->tok, text, strlen(text), true, true, turn, n_turn, err);
        free(text);
        if (rc)
            return LLMS__ERROR_CODE__INTERNAL;
    }
    gen_use_own_seq(cfg, g);
    merge_params(cfg, gg ? gg->node_params : NULL, gg ? gg->run_params : cr->params, mp);
    return LLMS__ERROR_CODE__OK;
}

/* Whether a turn of n_turn tokens can run as asked: logprobs where they have a place,
 * max_tokens, and room in the window (a WINDOW context's sink found here). The error's
 * code, or OK. */
static Llms__ErrorCode gen_check_turn(const config *cfg, gen *g, const ctx_entry *c,
                                      bool graph, int n_turn, char err[ERR_MAX])
{
    /* a RagQuery's or graph's answer has nowhere to put them (the session refuses a
     * RagQuery's own; a graph's may come from its stored nodes) */
    if (g->logprobs >= 0 && (graph || g->rq)) {
        err_set(err, "logprobs are given by Call and Complete, not by a %s",
                graph ? "graph's generation" : "RagQuery");
        return LLMS__ERROR_CODE__INVALID_ARGUMENT;
    }
    if (n_turn == 0) {
        err_set(err, "the prompt adds no tokens");
        return LLMS__ERROR_CODE__INVALID_ARGUMENT;
    }
    if (g->max_gen < 1) {
        err_set(err, "max_tokens must be at least 1");
        return LLMS__ERROR_CODE__INVALID_ARGUMENT;
    }
    if (c && c->overflow == CTX_OVERFLOW_WINDOW) {
        g->window = true;
        if (c->window_sink == 0)
            g->sink_want = prompt_sink_tokens(g->gm->tok, g->gm->family, c->system_prompt,
                                              cfg->window_sink);
    }
    /* A turn that does not fit beside the context: a WINDOW context slides at the
     * switch-in when the turn fits beside the sink (and the sink is all history). */
    int sink = g->window ? ctx_window_sink(c, g->sink_want, g->limit) : 0;
    if (g->n_base + n_turn >= g->limit &&
        !(g->window && g->n_base >= sink && sink + n_turn < g->limit)) {
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
        /* Only a full context can take the turn once its state changes (deleted and
         * started again); the other two never fit as sent. */
        return c && !g->window ? LLMS__ERROR_CODE__FAILED_PRECONDITION
                               : LLMS__ERROR_CODE__INVALID_ARGUMENT;
    }
    if (g->logprobs >= 0 && logprobs_outgrow_frame(cfg, g, n_turn, err))
        return LLMS__ERROR_CODE__INVALID_ARGUMENT;
    return LLMS__ERROR_CODE__OK;
}

/* The stop strings of mp (and the template's end of turn when templated) and the
 * sampler: the layer's logit_bias, then ignore_eos' bans, and DRY's breakers. */
static Llms__ErrorCode gen_sampling_init(gen *g, merged_params *mp, bool templated,
                                         char err[ERR_MAX])
{
    genmodel *gm = g->gm;
    const char *stops[STOP_MAX];
    int n_stops = 0;
    if (mp->stops) {
        if (mp->stops->n_stop >= STOP_MAX) {
            err_set(err, "at most %d stop strings", STOP_MAX - 1);
            return LLMS__ERROR_CODE__INVALID_ARGUMENT;
        }
        for (size_t i = 0; i < mp->stops->n_stop; i++)
            stops[n_stops++] = mp->stops->stop[i];
    }
    /* The template's end of turn ends a reply even when the tokenizer does not mark
     * its token as end of generation. */
    if (templated)
        stops[n_stops++] = chat_stop_text(gm->family);
    if (stop_init(&g->stop, stops, n_stops, err))
        return LLMS__ERROR_CODE__INVALID_ARGUMENT;
    const int32_t *eog = NULL;
    size_t n_user = mp->bias ? mp->bias->n_logit_bias : 0;
    size_t n_eog = mp->ignore_eos ? (size_t)tok_eog_tokens(gm->tok, &eog) : 0;
    sampler_bias *bias = NULL;
    if (n_user + n_eog > 0) {
        if (!(bias = malloc(sizeof *bias * (n_user + n_eog)))) {
            err_set(err, "out of memory");
            return LLMS__ERROR_CODE__INTERNAL;
        }
        for (size_t i = 0; i < n_user; i++)
            bias[i] = (sampler_bias){mp->bias->logit_bias[i]->token,
                                     mp->bias->logit_bias[i]->bias};
        for (size_t i = 0; i < n_eog; i++)
            bias[n_user + i] = (sampler_bias){eog[i], -INFINITY};
        mp->sp.bias = bias;
        mp->sp.n_bias = (int)(n_user + n_eog);
    }
    /* DRY looks back at most over the window */
    sampler_breaker *brk = NULL;
    mp->sp.n_ctx = g->limit;
    if (dry_breakers(gm, mp, &brk, err)) {
        free(bias);
        return LLMS__ERROR_CODE__INTERNAL;
    }
    /* the sampler keeps a copy of the biases and breakers */
    g->smp = sampler_new(gm->n_vocab, &mp->sp, err);
    free(bias);
    free(brk);
    return g->smp ? LLMS__ERROR_CODE__OK : LLMS__ERROR_CODE__INVALID_ARGUMENT;
}

/* The reply format of mp: a JSON cursor over its schema (or any object), or a grammar's
 * cursor. The session compiled both once already: a compile fails here only on a stored
 * context's defaults from a version that took more, or out of memory. */
static Llms__ErrorCode gen_format_init(gen *g, const merged_params *mp, char err[ERR_MAX])
{
    genmodel *gm = g->gm;
    if (mp->json) {
        /* the table of the model's token bytes is built once, by its first JSON reply */
        if (!gm->json_vocab && jsonmask_vocab_new(gm->tok, &gm->json_vocab, err))
            return LLMS__ERROR_CODE__INTERNAL;
        if (mp->json_schema &&
            jsonschema_compile(mp->json_schema, strlen(mp->json_schema), &g->schema, err))
            return LLMS__ERROR_CODE__INVALID_ARGUMENT;
        jsonmask_cursor_init_schema(&g->json, gm->json_vocab,
                                    g->schema ? g->schema : jsonschema_any_object());
    }
    if (mp->grammar) {
        if (!gm->grammar_vocab && grammar_vocab_new(gm->tok, &gm->grammar_vocab, err))
            return LLMS__ERROR_CODE__INTERNAL;
        if (grammar_compile(mp->grammar, strlen(mp->grammar), &g->grammar, err))
            return LLMS__ERROR_CODE__INVALID_ARGUMENT;
        if (grammar_cursor_new(g->grammar, gm->grammar_vocab, &g->gram, err))
            return LLMS__ERROR_CODE__INTERNAL;
    }
    return LLMS__ERROR_CODE__OK;
}

/* The history (c's tokens, then the turn's), the reply's and the log-probabilities'
 * buffers and the speculation's state. 0, or -1 out of memory. */
static int gen_buffers_init(sched *s, gen *g, const merged_params *mp, const ctx_entry *c,
                            const int32_t *turn, int n_turn)
{
    /* A WINDOW context's turn may take hist past the limit until the switch-in slides. */
    int n_hist = g->n_base + n_turn > g->limit ? g->n_base + n_turn : g->limit;
    g->hist = malloc(sizeof *g->hist * (size_t)n_hist);
    g->reply_cap = g->max_gen < g->limit ? g->max_gen : g->limit;
    g->reply = malloc(sizeof *g->reply * (size_t)g->reply_cap);
    if (g->logprobs >= 0)
        g->lp = malloc(sizeof *g->lp * (size_t)g->reply_cap);
    if (!g->hist || !g->reply || (g->logprobs >= 0 && !g->lp) ||
        (mp->speculate && spec_gen_init(g, s->env.cfg, mp->speculate,
                                        g->gm == s->gm[0] ? s->drafter : NULL) < 0))
        return -1;
    if (c && c->n_tokens)
        memcpy(g->hist, c->tokens, sizeof *g->hist * (size_t)c->n_tokens);
    memcpy(g->hist + g->n_base, turn, sizeof *turn * (size_t)n_turn);
    g->n_hist = g->n_base + n_turn;
    return 0;
}

/* Builds the generation of a Call, Complete or RagQuery job, or with gg of a graph
 * generation node, on the generate model gm (a Call's: its context's). NULL after
 * answering the job with an error (gg: after putting the error in gg, the job
 * unanswered). */
gen *gen_new(sched *s, genmodel *gm, const sched_job *j, ctx_entry *c, graph_gen *gg)
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
    g->t_start = clock_mono_ns();
    g->piece_cap = tok_max_piece_len(gm->tok) + 1;
    g->piece = malloc(g->piece_cap);
    g->passed = malloc(STOP_OUT_CAP(g->piece_cap) + 1);
    g->released = malloc(UTF8_OUT_CAP(STOP_OUT_CAP(g->piece_cap) + STOP_MAX_LEN) + 1);
    if (!g->piece || !g->passed || !g->released) {
        err_set(err, "out of memory");
        goto fail;
    }
    merged_params mp;
    bool templated = true;
    bool rag_query = !c && j->req->body_case == LLMS__REQUEST__BODY_RAG_QUERY;
    code = c           ? gen_call_turn(cfg, g, j, c, &mp, &templated, &turn, &n_turn, err)
           : rag_query ? gen_rag_turn(s, g, j, &mp, &turn, &n_turn, err)
                       : gen_complete_turn(cfg, g, j, gg, &mp, &templated, &turn, &n_turn,
                                           err);
    if (code != LLMS__ERROR_CODE__OK)
        goto fail;
    if (rag_query && !g->rq) {
        gen_free(g); /* answered: from the QA bank or with an error */
        return NULL;
    }
    g->max_gen = mp.max_tokens;
    g->logprobs = mp.logprobs;
    if ((code = gen_check_turn(cfg, g, c, gg != NULL, n_turn, err)) != LLMS__ERROR_CODE__OK ||
        (code = gen_sampling_init(g, &mp, templated, err)) != LLMS__ERROR_CODE__OK ||
        (code = gen_format_init(g, &mp, err)) != LLMS__ERROR_CODE__OK)
        goto fail;
    if (gen_buffers_init(s, g, &mp, c, turn, n_turn) < 0) {
        code = LLMS__ERROR_CODE__INTERNAL;
        err_set(err, "out of memory");
        goto fail;
    }
    g->turn = turn;
    g->n_turn = n_turn;
    if (c) {
        c->busy = true;
        c->last_used_ms = clock_wall_ms();
    }
    /* the prompt resumes after the longest prefix the app's last prompts share with it */
    pcache *pc = gen_pcache(s, g, j, gg != NULL);
    if (pc)
        g->n_cached = pcache_take(pc, j->uid, j->app, g->turn, g->n_turn, gm->step_tokens,
                                  claim_kv, gm->cm, &g->own_seq);
    return g;
fail:
    free(turn);
    if (gg) {
        gg->code = code;
        snprintf(gg->err, ERR_MAX, "%s", err);
    } else {
        sched_reply_error(s, j, code, "%s", err);
    }
    gen_free(g);
    return NULL;
}

/* Streams text (NUL-terminated) and the tokens that produced it, with lp their
 * log-probabilities (NULL: none asked). false when those could not be packed (the work
 * failed then). */
static bool send_chunk(sched *s, work *w, char *text, const int32_t *tok, int n_tok,
                       const logprob_step *lp)
{
    if (w->quiet || w->gw) /* a graph streams node events, not tokens */
        return true;
    Llms__CallChunk ch = LLMS__CALL_CHUNK__INIT;
    ch.text = text;
    ch.n_tokens = (size_t)n_tok;
    ch.tokens = (int32_t *)tok;
    if (lp && n_tok > 0) {
        if (logprobs_pack(w->g->gm->tok, lp, (size_t)n_tok, &w->g->lp_chunk)) {
            work_fail(w, LLMS__ERROR_CODE__INTERNAL, "out of memory for logprobs");
            return false;
        }
        ch.n_logprobs = (size_t)n_tok;
        ch.logprobs = w->g->lp_chunk.ptrs;
    }
    Llms__Response r = LLMS__RESPONSE__INIT;
    r.id = w->job->req->id;
    r.final = 0;
    r.body_case = LLMS__RESPONSE__BODY_CHUNK;
    r.chunk = &ch;
    sched_reply(s, w->job->conn_id, &r, true);
    return true;
}

/* Releases text the stop strings let through as whole valid UTF-8 characters: kept as
 * the reply and streamed with the tokens that produced it. At the end of the reply
 * (last) a character left unfinished is released as U+FFFD; an end with no text sends
 * nothing. false when the reply cannot keep the text: the work fails then, as a reply
 * that lost text would differ from its stream (and be stored so in a context). */
static bool gen_release(sched *s, work *w, const char *text, size_t n, bool last,
                        const int32_t *tok, int n_tok, const logprob_step *lp)
{
    gen *g = w->g;
    char *out = g->released;
    size_t len = utf8_stream_feed(&g->utf8, text, n, out);
    if (last)
        len += utf8_stream_flush(&g->utf8, out + len);
    out[len] = '\0';
    if (last && len == 0)
        return true;
    if (textbuf_append(&g->shown, &g->shown_len, &g->shown_cap, out, len)) {
        work_fail(w, LLMS__ERROR_CODE__INTERNAL, "out of memory keeping the reply");
        return false;
    }
    return send_chunk(s, w, out, tok, n_tok, lp);
}

bool gen_flush(sched *s, work *w)
{
    char tail[STOP_MAX_LEN + 1];
    return gen_release(s, w, tail, stop_flush(&w->g->stop, tail), true, NULL, 0, NULL);
}

static void gen_finish(gen *g, Llms__StopReason reason)
{
    g->done = true;
    g->reason = reason;
}

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
        if (g->lp) {
            logprob_step *lp = realloc(g->lp, sizeof *lp * (size_t)want);
            if (!lp) {
                work_fail(w, LLMS__ERROR_CODE__INTERNAL, "out of memory sliding the window");
                return true;
            }
            g->lp = lp;
        }
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
bool gen_decoding(const gen *g)
{
    return g->prefilled && !g->refill;
}

/* Takes the token sampled from logits (n_vocab), the out row of the generation's last
 * evaluated token. */
void gen_note_token_time(sched *s, gen *g)
{
    int64_t now = clock_mono_ns();
    if (g->t_last_token) {
        double gap = (double)(now - g->t_last_token) / 1e6;
        if (gap > s->step_stall_ms)
            s->step_stall_ms = gap;
    }
    g->t_last_token = now;
}

static bool json_allows(const void *cursor, int32_t token)
{
    return jsonmask_allows(cursor, token);
}

static bool grammar_allows_token(const void *cursor, int32_t token)
{
    return grammar_allows(cursor, token);
}

int32_t gen_sample(gen *g, const float *logits)
{
    sampler_constraint allowed;
    if (g->json.vocab)
        allowed = (sampler_constraint){json_allows, &g->json};
    else if (g->gram)
        allowed = (sampler_constraint){grammar_allows_token, g->gram};
    else
        return sampler_sample(g->smp, logits, g->hist, g->n_hist);
    return sampler_sample_allowed(g->smp, logits, g->hist, g->n_hist, &allowed);
}

void gen_take_token(sched *s, work *w, const float *logits)
{
    gen *g = w->g;
    gen_note_token_time(s, g);
    gen_push_token(s, w, gen_sample(g, logits), logits);
}

bool gen_push_token(sched *s, work *w, int32_t next, const float *logits)
{
    gen *g = w->g;
    /* gen_sample drew among the allowed tokens: -1 when the vocabulary has none */
    if (g->json.vocab && jsonmask_take(&g->json, next) < 0) {
        work_fail(w, LLMS__ERROR_CODE__FAILED_PRECONDITION,
                  "JSON mode: no token of the model's vocabulary continues the reply as JSON");
        return false;
    }
    if (g->gram && grammar_take(g->gram, next) < 0) {
        work_fail(w, LLMS__ERROR_CODE__FAILED_PRECONDITION,
                  "grammar: no token of the model's vocabulary continues the reply as a "
                  "sentence of the grammar");
        return false;
    }
    if (next < 0 || tok_is_eog(g->gm->tok, next)) {
        gen_finish(g, LLMS__STOP_REASON__STOP_EOS);
        return false;
    }
    const logprob_step *lp = NULL;
    if (g->lp) {
        logprob_of_row(logits, g->gm->n_vocab, next, g->logprobs, &g->lp[g->n_gen]);
        lp = &g->lp[g->n_gen];
    }
    g->hist[g->n_hist++] = next;
    g->reply[g->n_gen++] = next;
    int len = tok_piece(g->gm->tok, next, g->piece, g->piece_cap);
    if (len < 0)
        len = 0;
    long n = stop_feed(&g->stop, g->piece, (size_t)len, g->passed, STOP_OUT_CAP(g->piece_cap));
    if (!gen_release(s, w, g->passed, n < 0 ? 0 : (size_t)n, false, &next, 1, lp))
        return false;
    if (stop_hit(&g->stop) >= 0)
        gen_finish(g, LLMS__STOP_REASON__STOP_STRING);
    else if (g->json.vocab && jsonmask_complete(&g->json.state))
        gen_finish(g, LLMS__STOP_REASON__STOP_EOS); /* the object closed: the reply ends */
    else if (g->gram && grammar_finished(g->gram))
        gen_finish(g, LLMS__STOP_REASON__STOP_EOS); /* nothing may follow: the reply ends */
    else if (g->n_gen >= g->max_gen)
        gen_finish(g, LLMS__STOP_REASON__STOP_MAX_TOKENS);
    else if (g->n_hist >= g->limit && !gen_slide(w, 1))
        gen_finish(g, LLMS__STOP_REASON__STOP_CONTEXT_FULL);
    return true;
}

/* A Call's switch-in: its chunks are read or recomputed until the KV holds the whole
 * history (a Complete starts empty). Then the KV beyond the context is dropped. -1 with
 * g->err_code on failure. */
int gen_switch_in(gen *g, char err[ERR_MAX])
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
            g->err_code = LLMS__ERROR_CODE__INVALID_ARGUMENT;
            return err_set(err, "the turn does not fit the window of %d tokens", g->limit);
        }
        g->slides++;
    }
    return 0;
}

/* Whether w's generation ended well: not when the engine failed, the prompt was never
 * evaluated (nothing to keep), the reply could not be flushed or a call's turn could
 * not be committed to its context; then *code and err say why. */
static bool gen_succeeded(sched *s, work *w, Llms__ErrorCode *code, char err[ERR_MAX])
{
    gen *g = w->g;
    if (w->failed) {
        *code = g->err_code ? g->err_code : LLMS__ERROR_CODE__INTERNAL;
        snprintf(err, ERR_MAX, "%s", w->fail_msg);
        return false;
    }
    if (!g->prefilled) {
        if (s->shutting) {
            *code = LLMS__ERROR_CODE__UNAVAILABLE;
            snprintf(err, ERR_MAX, "the daemon is shutting down");
        } else if (g->reason == LLMS__STOP_REASON__STOP_DEADLINE) {
            *code = LLMS__ERROR_CODE__DEADLINE_EXCEEDED;
            snprintf(err, ERR_MAX, "the request's timeout passed before its prompt was "
                                   "evaluated");
        } else {
            *code = LLMS__ERROR_CODE__CANCELLED;
            snprintf(err, ERR_MAX, "cancelled");
        }
        return false;
    }
    if (!gen_flush(s, w)) {
        *code = w->fail_code;
        snprintf(err, ERR_MAX, "%s", w->fail_msg);
        return false;
    }
    if (g->c) {
        Llms__CallRequest *cr = w->job->req->call;
        if (ctx_commit_turn(g->c->cm, g->c, g->user_role, cr->prompt, g->turn, g->n_turn,
                            g->shown ? g->shown : "", g->reply, g->n_gen, clock_wall_ms(), err)) {
            *code = LLMS__ERROR_CODE__INTERNAL;
            return false;
        }
    }
    return true;
}

/* A RagQuery's final answer: the passages and the generation's figures. */
static void reply_rag_result(sched *s, work *w)
{
    gen *g = w->g;
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
    sched_reply(s, w->job->conn_id, &r, false);
}

/* A Call's or Complete's final answer: the text, the stop, the figures and any
 * logprobs. */
static void reply_call_result(sched *s, work *w)
{
    gen *g = w->g;
    Llms__CallResult res = LLMS__CALL_RESULT__INIT;
    res.prompt_tokens = (uint32_t)(g->n_eval + g->n_cached);
    res.generated_tokens = (uint32_t)g->n_gen;
    res.context_tokens = g->c ? (uint32_t)g->c->n_tokens : 0;
    res.prefill_ms = (double)(g->t_first - g->t_start) / 1e6;
    res.decode_ms = (double)(g->t_end - g->t_first) / 1e6;
    res.queue_ms = (double)(g->t_start - w->job->queued_ns) / 1e6;
    res.stop_reason = g->reason;
    res.has_cached_tokens = g->n_cached > 0;
    res.cached_tokens = (uint32_t)g->n_cached;
    res.has_window_slides = g->slides > 0;
    res.window_slides = (uint32_t)g->slides;
    res.text = g->shown ? g->shown : "";
    char stop_string[STOP_MAX_LEN + 1];
    if (stop_hit_text(&g->stop, stop_string))
        res.stop_string = stop_string;
    logprobs_pb lp = {0};
    bool lp_failed = g->lp && logprobs_pack(g->gm->tok, g->lp, (size_t)g->n_gen, &lp);
    res.n_logprobs = lp.n_steps;
    res.logprobs = lp.ptrs;
    Llms__Response r = LLMS__RESPONSE__INIT;
    r.id = w->job->req->id;
    r.final = 1;
    r.body_case = LLMS__RESPONSE__BODY_RESULT;
    r.result = &res;
    if (lp_failed)
        sched_reply_error(s, w->job, LLMS__ERROR_CODE__INTERNAL,
                          "out of memory for the reply's logprobs");
    else
        sched_reply(s, w->job->conn_id, &r, false);
    logprobs_pb_free(&lp);
}

/* What a generation that ended well leaves for later, after its reply went out (off its
 * latency): the RAG caches, the prompt's KV for the app's next prompt (a whole reply's
 * only: a cut-short one's end says the app may not come back to it), the request log. */
static void gen_keep(sched *s, work *w)
{
    gen *g = w->g;
    if (g->rq) {
        outq_wake(s->env.out);
        rag_populate(s->rag, g->rq, g->seq, g->shown ? g->shown : "", g->reason, g->n_gen);
    }
    pcache *pc = gen_pcache(s, g, w->job, w->gw != NULL);
    if (pc && (g->reason == LLMS__STOP_REASON__STOP_EOS ||
               g->reason == LLMS__STOP_REASON__STOP_STRING ||
               g->reason == LLMS__STOP_REASON__STOP_MAX_TOKENS ||
               g->reason == LLMS__STOP_REASON__STOP_CONTEXT_FULL))
        pcache_put(pc, w->job->uid, w->job->app, g->turn, g->n_turn, g->gm->step_tokens,
                   &g->own_seq);
    reqlog_request(w->job->uid, w->job->app, w->job->req->body_case, g->n_eval + g->n_gen,
                   (double)(g->t_end - w->job->queued_ns) / 1e6, LLMS__ERROR_CODE__OK,
                   protobuf_c_enum_descriptor_get_value(&llms__stop_reason__descriptor,
                                                        (int)g->reason)->name);
}

void gen_end(sched *s, work *w)
{
    gen *g = w->g;
    if (!g->done)
        gen_finish(g, !w->cancelled ? LLMS__STOP_REASON__STOP_DEADLINE
                      : s->shutting ? LLMS__STOP_REASON__STOP_SHUTDOWN
                                    : LLMS__STOP_REASON__STOP_CANCELLED);
    g->t_end = clock_mono_ns();
    char err[ERR_MAX];
    Llms__ErrorCode code;
    bool ok = gen_succeeded(s, w, &code, err);
    if (!w->quiet && !ok)
        sched_reply_error(s, w->job, code, "%s", err);
    else if (!w->quiet && g->rq)
        reply_rag_result(s, w);
    else if (!w->quiet)
        reply_call_result(s, w);
    if (ok)
        gen_keep(s, w);
    /* After the reply is queued: the context's modified chunks are compressed and
     * written (ahead-of-time swap-out), or a failed call's extra KV dropped; then its
     * chunks are unlocked. */
    if (g->c) {
        outq_wake(s->env.out);
        ctx_call_end(g->c->cm, g->c, ok);
    }
}
