/* graph.c — libllmsclient: workflow graphs (create, delete, list, run, speculative runs). */
#include "client/llms.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "client/client_internal.h"
#include "proto/frame.h"

/* ---- workflow graphs ---- */

enum llms_status llms_graph_create(llms_conn *c, const char *name, const llms_graph_def *def)
{
    enum llms_status s = client_check_str(c, name, "name");
    if (s != LLMS_OK)
        return s;
    if (!def || (def->n_nodes && !def->nodes) || (def->n_edges && !def->edges) ||
        (def->n_inputs && !def->inputs) || !def->output)
        return client_fail(c, LLMS_ERR_INVALID_ARGUMENT, "incomplete graph definition");
    Llms__GraphNode *nodes = calloc(def->n_nodes + 1, sizeof *nodes);
    Llms__GraphNode **np = calloc(def->n_nodes + 1, sizeof *np);
    client_params_pb *params = calloc(def->n_nodes + 1, sizeof *params);
    Llms__GraphEdge *edges = calloc(def->n_edges + 1, sizeof *edges);
    Llms__GraphEdge **ep = calloc(def->n_edges + 1, sizeof *ep);
    if (!nodes || !np || !params || !edges || !ep) {
        s = client_fail(c, LLMS_ERR_INTERNAL, "out of memory");
        goto out;
    }
    Llms__GraphDef d = LLMS__GRAPH_DEF__INIT;
    d.n_inputs = def->n_inputs;
    d.inputs = (char **)def->inputs;
    d.output = (char *)def->output;
    d.has_max_steps = def->max_steps != 0;
    d.max_steps = def->max_steps;
    for (size_t i = 0; i < def->n_nodes; i++) {
        const llms_graph_node *n = &def->nodes[i];
        if (!n->name || !n->output) {
            s = client_fail(c, LLMS_ERR_INVALID_ARGUMENT,
                            "node %zu: a name and an output are needed", i);
            goto out;
        }
        llms__graph_node__init(&nodes[i]);
        nodes[i].name = (char *)n->name;
        nodes[i].output = (char *)n->output;
        nodes[i].kind = (Llms__GraphNodeKind)n->kind;
        if (n->kind == LLMS_GRAPH_GENERATE) {
            nodes[i].prompt = (char *)n->prompt;
            if ((s = client_params_pack(c, n->params, &params[i])) != LLMS_OK)
                goto out;
            nodes[i].params = client_params_packed(&params[i]);
            nodes[i].has_chat = n->chat != 0;
            nodes[i].chat = n->chat != 0;
        } else {
            nodes[i].kb = (char *)n->kb;
            nodes[i].query = (char *)n->query;
            nodes[i].has_top_k = n->top_k != 0;
            nodes[i].top_k = n->top_k;
            nodes[i].has_retrieval = n->retrieval != LLMS_RETRIEVAL_RRF;
            nodes[i].retrieval = (Llms__Retrieval)n->retrieval;
        }
        np[i] = &nodes[i];
    }
    for (size_t i = 0; i < def->n_edges; i++) {
        if (!def->edges[i].from || !def->edges[i].to) {
            s = client_fail(c, LLMS_ERR_INVALID_ARGUMENT, "edge %zu: from and to are needed", i);
            goto out;
        }
        llms__graph_edge__init(&edges[i]);
        edges[i].from = (char *)def->edges[i].from;
        edges[i].to = (char *)def->edges[i].to;
        edges[i].when = (char *)def->edges[i].when;
        ep[i] = &edges[i];
    }
    d.n_nodes = def->n_nodes;
    d.nodes = np;
    d.n_edges = def->n_edges;
    d.edges = ep;
    Llms__GraphCreateRequest gc = LLMS__GRAPH_CREATE_REQUEST__INIT;
    gc.name = (char *)name;
    gc.graph = &d;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_GRAPH_CREATE;
    req.graph_create = &gc;
    s = client_unary_ok(c, &req);
out:
    for (size_t i = 0; params && i < def->n_nodes; i++)
        client_params_pb_free(&params[i]);
    free(nodes);
    free(np);
    free(params);
    free(edges);
    free(ep);
    return s;
}

enum llms_status llms_graph_delete(llms_conn *c, const char *name)
{
    enum llms_status s = client_check_str(c, name, "name");
    if (s != LLMS_OK)
        return s;
    Llms__GraphDeleteRequest gd = LLMS__GRAPH_DELETE_REQUEST__INIT;
    gd.name = (char *)name;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_GRAPH_DELETE;
    req.graph_delete = &gd;
    return client_unary_ok(c, &req);
}

void llms_graph_list_free(llms_graph_info *graphs, size_t n)
{
    if (!graphs)
        return;
    for (size_t i = 0; i < n; i++) {
        free(graphs[i].name);
        free(graphs[i].output);
        for (size_t k = 0; k < graphs[i].n_inputs; k++)
            free(graphs[i].inputs[k]);
        free(graphs[i].inputs);
    }
    free(graphs);
}

enum llms_status llms_graph_list(llms_conn *c, llms_graph_info **out, size_t *n_out)
{
    *out = NULL;
    *n_out = 0;
    Llms__Empty e = LLMS__EMPTY__INIT;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_GRAPH_LIST;
    req.graph_list = &e;
    Llms__Response *r;
    enum llms_status s = client_unary(c, &req, LLMS__RESPONSE__BODY_GRAPH_LIST, &r);
    if (s != LLMS_OK)
        return s;
    const Llms__GraphListResponse *l = r->graph_list;
    llms_graph_info *g = calloc(l->n_graphs + 1, sizeof *g);
    bool ok = g != NULL;
    for (size_t i = 0; ok && i < l->n_graphs; i++) {
        const Llms__GraphDef *d = l->graphs[i]->graph;
        g[i].name = strdup(l->graphs[i]->name);
        g[i].builtin = l->graphs[i]->builtin;
        g[i].output = strdup(d->output);
        g[i].inputs = calloc(d->n_inputs + 1, sizeof *g[i].inputs);
        ok = g[i].name && g[i].output && g[i].inputs;
        for (size_t k = 0; ok && k < d->n_inputs; k++, g[i].n_inputs++)
            ok = (g[i].inputs[k] = strdup(d->inputs[k])) != NULL;
        g[i].n_nodes = d->n_nodes;
        g[i].n_edges = d->n_edges;
        g[i].max_steps = d->has_max_steps ? d->max_steps : 0;
    }
    if (!ok) {
        llms_graph_list_free(g, l->n_graphs);
        frame_free_response(r);
        return client_fail(c, LLMS_ERR_INTERNAL, "out of memory");
    }
    *out = g;
    *n_out = l->n_graphs;
    frame_free_response(r);
    return LLMS_OK;
}

void llms_graph_result_free(llms_graph_result *r)
{
    if (!r)
        return;
    free(r->output);
    for (size_t i = 0; i < r->n_timings; i++)
        free(r->timings[i].node);
    free(r->timings);
    for (size_t i = 0; i < r->n_state; i++) {
        free(r->state_names[i]);
        free(r->state_values[i]);
    }
    free(r->state_names);
    free(r->state_values);
    memset(r, 0, sizeof *r);
}

static enum llms_status graph_result_from(llms_conn *c, const Llms__GraphResult *p,
                                          llms_graph_result *out)
{
    *out = (llms_graph_result){
        .output = strdup(p->output),
        .steps = p->steps,
        .capped = p->capped,
        .timings = calloc(p->n_timings + 1, sizeof *out->timings),
        .state_names = calloc(p->n_state + 1, sizeof *out->state_names),
        .state_values = calloc(p->n_state + 1, sizeof *out->state_values),
        .total_ms = p->total_ms,
        .queue_ms = p->queue_ms,
        .speculations = p->speculations,
        .spec_hits = p->spec_hits,
        .spec_rollbacks = p->spec_rollbacks,
        .spec_saved_ms = p->spec_saved_ms,
        .prompt_tokens = p->prompt_tokens,
        .reused_tokens = p->reused_tokens,
    };
    bool ok = out->output && out->timings && out->state_names && out->state_values;
    for (size_t i = 0; ok && i < p->n_timings; i++, out->n_timings++) {
        const Llms__GraphNodeTiming *t = p->timings[i];
        out->timings[i] = (llms_graph_timing){strdup(t->node), t->runs, t->ms,
                                              t->generated_tokens};
        ok = out->timings[i].node != NULL;
    }
    for (size_t i = 0; ok && i < p->n_state; i++, out->n_state++) {
        out->state_names[i] = strdup(p->state[i]->name);
        out->state_values[i] = strdup(p->state[i]->value);
        ok = out->state_names[i] && out->state_values[i];
    }
    if (!ok) {
        llms_graph_result_free(out);
        return client_fail(c, LLMS_ERR_INTERNAL, "out of memory");
    }
    return LLMS_OK;
}

enum llms_status llms_graph_run(llms_conn *c, const char *graph, const llms_graph_var *inputs,
                                size_t n, const llms_params *params, llms_graph_event_cb on_event,
                                void *user, llms_graph_result *out)
{
    return llms_graph_run_speculate(c, graph, inputs, n, params, LLMS_SPECULATE_DEFAULT,
                                    on_event, user, out);
}

enum llms_status llms_graph_run_speculate(llms_conn *c, const char *graph,
                                          const llms_graph_var *inputs, size_t n,
                                          const llms_params *params, enum llms_speculate spec,
                                          llms_graph_event_cb on_event, void *user,
                                          llms_graph_result *out)
{
    if (out)
        memset(out, 0, sizeof *out);
    enum llms_status s = client_check_str(c, graph, "graph");
    if (s != LLMS_OK)
        return s;
    Llms__GraphVar *vars = calloc(n + 1, sizeof *vars);
    Llms__GraphVar **vp = calloc(n + 1, sizeof *vp);
    if (!vars || !vp) {
        free(vars);
        free(vp);
        return client_fail(c, LLMS_ERR_INTERNAL, "out of memory");
    }
    for (size_t i = 0; i < n && s == LLMS_OK; i++) {
        if (!inputs[i].name || !inputs[i].value)
            s = client_fail(c, LLMS_ERR_INVALID_ARGUMENT,
                            "input %zu: a name and a value are needed", i);
        llms__graph_var__init(&vars[i]);
        vars[i].name = (char *)inputs[i].name;
        vars[i].value = (char *)inputs[i].value;
        vp[i] = &vars[i];
    }
    client_params_pb pb = {0};
    if (s == LLMS_OK)
        s = client_params_pack(c, params, &pb);
    Llms__GraphRunRequest gr = LLMS__GRAPH_RUN_REQUEST__INIT;
    gr.graph = (char *)graph;
    gr.n_inputs = n;
    gr.inputs = vp;
    gr.params = client_params_packed(&pb);
    gr.has_speculate = spec != LLMS_SPECULATE_DEFAULT;
    gr.speculate = spec == LLMS_SPECULATE_ON;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_GRAPH_RUN;
    req.graph_run = &gr;
    uint64_t id;
    if (s == LLMS_OK)
        s = client_send_request(c, &req, &id);
    client_params_pb_free(&pb);
    free(vars);
    free(vp);
    if (s != LLMS_OK)
        return s;
    int cancelled = 0;
    for (;;) {
        Llms__Response *r;
        if ((s = client_next_answer(c, id, cancelled, &r)) != LLMS_OK)
            return s;
        if (r->body_case == LLMS__RESPONSE__BODY_GRAPH_EVENT && !r->final) {
            const Llms__GraphEvent *e = r->graph_event;
            llms_graph_event ev = {
                .finished = e->kind == LLMS__GRAPH_EVENT_KIND__GRAPH_NODE_FINISHED,
                .node = e->node, .step = e->step, .output = e->output, .value = e->value,
                .ms = e->has_ms ? e->ms : 0,
                .generated_tokens = e->has_generated_tokens ? e->generated_tokens : 0,
                .speculation = !e->has_speculation ? LLMS_GRAPH_SPEC_NONE
                               : e->speculation == LLMS__GRAPH_SPECULATION__GRAPH_SPEC_HIT
                                   ? LLMS_GRAPH_SPEC_HIT
                                   : LLMS_GRAPH_SPEC_ROLLBACK,
            };
            int stop = 0;
            if (!cancelled && on_event) {
                c->in_callback = 1;
                stop = on_event(&ev, user);
                c->in_callback = 0;
            }
            if (stop) {
                cancelled = 1;
                if ((s = client_send_cancel(c, id)) != LLMS_OK) {
                    frame_free_response(r);
                    return s;
                }
            }
            frame_free_response(r);
            continue;
        }
        if (r->body_case != LLMS__RESPONSE__BODY_GRAPH_RESULT || !r->final) {
            frame_free_response(r);
            return client_fail(c, LLMS_ERR_PROTOCOL, "unexpected frame in a graph run");
        }
        s = out ? graph_result_from(c, r->graph_result, out) : LLMS_OK;
        frame_free_response(r);
        if (s == LLMS_OK && cancelled)
            return client_fail(c, LLMS_ERR_CANCELLED, "cancelled by the caller");
        if (s == LLMS_OK)
            c->err[0] = '\0';
        return s;
    }
}
