/*
 * graphrun.c — GraphRun: a run's nodes moved on between steps (a generation node's
 * generation joins the steps, a retrieval node runs a sub-stage at a time), its node
 * events and result, the KV kept between its generation nodes, and its speculation (a
 * generation on a retrieval's estimate, a retrieval on a generation's first tokens).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/graph/graph.h"
#include "daemon/rag/retrieval.h"
#include "daemon/reqlog.h"
#include "daemon/sched/sched_internal.h"

#define SCHED_RETRIEVAL_MIN_NS 1000000 /* graph retrieval sub-stages per cycle, at least */

/* A GraphRun: its graph, the run's state, and the ready node's work (a generation in
 * work.g or a retrieval here).
 * Speculation (at most one at a time): while the ready node is a retrieval, work.g may
 * be the generation of spec_node started on the retrieval's estimate; while the ready
 * node is a generation, spec_rt may be the retrieval of spec_node started on its first
 * graph_spec_tokens tokens (spec_kb and spec_query: what it was rendered with). When
 * the generation ends with another query, spec_rt's result becomes the real retrieval's
 * estimate (spec_seeded) and the speculation, with the generation started on that
 * estimate, stands or falls with it when the retrieval ends. */
struct graph_work {
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
};

static void spec_rt_drop(graph_work *gw)
{
    retrieval_free(gw->spec_rt);
    free(gw->spec_kb);
    free(gw->spec_query);
    gw->spec_rt = NULL;
    gw->spec_kb = gw->spec_query = NULL;
}

void graphrun_free(graph_work *gw)
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

/* Opens a GraphRun's graph and starts its run. NULL after answering the job. */
graph_work *graphrun_new(sched *s, const sched_job *j)
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
    gw->t_start = clock_mono_ns();
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
            code = LLMS__ERROR_CODE__INVALID_ARGUMENT;
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
    sched_reply_error(s, j, code, "graph '%.64s': %s", gr->graph, err);
    graphrun_free(gw);
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
    sched_reply(s, w->job->conn_id, &r, false);
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
    double ms = (double)(clock_mono_ns() - gw->node_t0) / 1e6;
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
    return progressed ? (double)(clock_mono_ns() - gw->spec_t0) / 1e6 : 0;
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
    gw->spec_t0 = clock_mono_ns();
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

/* ---- the run ---- */

/* Starts the ready node: a generation (which then runs in the steps like any other) or
 * a retrieval (advanced by graph_advance, a sub-stage per cycle). */
static int graph_node_start(sched *s, work *w, int node)
{
    graph_work *gw = w->gw;
    const Llms__GraphNode *n = graph_node_of(gw, node);
    Llms__ErrorCode code = LLMS__ERROR_CODE__INTERNAL;
    gw->node = node;
    gw->node_t0 = clock_mono_ns();
    graph_event(s, w, LLMS__GRAPH_EVENT_KIND__GRAPH_NODE_STARTED, NULL, 0, 0, SPEC_NONE);
    size_t max = (size_t)s->env.cfg->max_text_bytes, len;
    if (n->kind == LLMS__GRAPH_NODE_KIND__GRAPH_GENERATE) {
        spec_rt_drop(gw);
        char *prompt = graph_run_render(gw->run, GRAPH_FIELD_PROMPT, max, &len);
        if (!prompt) {
            if (len > max)
                snprintf(gw->err, ERR_MAX, "its prompt would be %zu bytes, over max_text_bytes "
                         "(%zu)", len, max);
            graph_fail(w, len > max ? LLMS__ERROR_CODE__INVALID_ARGUMENT : code,
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
        code = LLMS__ERROR_CODE__INVALID_ARGUMENT;
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
        sched_reply_error(s, w->job, LLMS__ERROR_CODE__INTERNAL, "out of memory");
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
        int64_t now = clock_mono_ns();
        res.total_ms = (double)(now - gw->t_start) / 1e6;
        res.queue_ms = (double)(gw->t_start - w->job->queued_ns) / 1e6;
        Llms__Response r = LLMS__RESPONSE__INIT;
        r.id = w->job->req->id;
        r.final = 1;
        r.body_case = LLMS__RESPONSE__BODY_GRAPH_RESULT;
        r.graph_result = &res;
        if (!w->quiet)
            sched_reply(s, w->job->conn_id, &r, false);
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
    while (!work_over(w, clock_mono_ns())) {
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
            if (!gen_flush(s, w))
                return; /* failed: graphrun_end answers the error */
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
void graphrun_end(sched *s, work *w)
{
    graph_work *gw = w->gw;
    int64_t now = clock_mono_ns();
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
        sched_reply_error(s, w->job, w->fail_code, "graph '%.64s': %s",
                          w->job->req->graph_run->graph, w->fail_msg);
    else if (s->shutting)
        sched_reply_error(s, w->job, LLMS__ERROR_CODE__UNAVAILABLE,
                          "the daemon is shutting down");
    else if (!w->cancelled)
        sched_reply_error(s, w->job, LLMS__ERROR_CODE__DEADLINE_EXCEEDED,
                          "the request's timeout passed after %d node runs",
                          graph_run_steps(gw->run));
    else
        sched_reply_error(s, w->job, LLMS__ERROR_CODE__CANCELLED, "cancelled after %d node runs",
                          graph_run_steps(gw->run));
}

/* Every running graph's wavefront: each moves on to its next generation node (which
 * joins this cycle's step) or runs a sub-stage of its retrieval node. Retrieval
 * sub-stages go round the graphs again while the cycle's retrieval time budget lasts:
 * as long as the last step took (at least SCHED_RETRIEVAL_MIN_NS), so that retrieval and
 * generation each get about half of the worker's time when both are waiting. */
void graphrun_advance_all(sched *s)
{
    int64_t t0 = clock_mono_ns(), budget = SCHED_RETRIEVAL_MIN_NS;
    if (s->n_steps) {
        int64_t last = (int64_t)(s->stats[(s->n_steps - 1) % SCHED_STATS].ms * 1e6);
        budget = last > budget ? last : budget;
    }
    bool retrieving = true;
    for (int round = 0; retrieving && (round == 0 || clock_mono_ns() - t0 < budget); round++) {
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
