/* libFuzzer target for workflow graphs (daemon/graph/graph.h), which llmsd compiles from any
 * client's GraphCreate. The first input byte picks the mode:
 *   0 mod 4: the rest is a packed GraphDef, compiled as GraphCreate would;
 *   2 mod 4: a built-in template (the next byte picks which), so runs get deep quickly;
 *   odd:  the rest is split at the first NUL into a condition and a prompt template, put
 *         in a small looping graph (a node "think" over inputs "question" and "kb", an
 *         edge to END when the condition holds, else back to itself), so the condition
 *         language and the template syntax get inputs that reach their parsers.
 * Whatever compiles is run to its end: each ready node's fields are rendered, a trial
 * output fed and undone (speculation), then an output fed for real; the outputs are
 * slices of the input. A refusal must come with a message; nothing may crash or leak. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/graph/graph.h"

#define FUZZ_MAX_STEPS 32

static const graph_limits limits = {.max_nodes = 32, .max_steps = FUZZ_MAX_STEPS};

static void exercise(const graph *g, const uint8_t *data, size_t size)
{
    const Llms__GraphDef *d = graph_def(g);
    Llms__GraphVar vars[8], *vp[8];
    size_t n = d->n_inputs < 8 ? d->n_inputs : 8;
    if (n < d->n_inputs)
        return; /* the run would be refused: every input must be given */
    for (size_t i = 0; i < n; i++) {
        llms__graph_var__init(&vars[i]);
        vars[i].name = d->inputs[i];
        vars[i].value = i % 2 ? "Lily DONE" : "{x} 'q' \"7\"";
        vp[i] = &vars[i];
    }
    char err[ERR_MAX];
    graph_run *r = graph_run_new(g, vp, n, FUZZ_MAX_STEPS, err);
    if (!r) {
        if (!err[0])
            abort();
        return;
    }
    size_t at = 0;
    for (int node; (node = graph_run_ready(r)) >= 0;) {
        if ((size_t)node >= d->n_nodes)
            abort();
        for (int f = GRAPH_FIELD_PROMPT; f <= GRAPH_FIELD_QUERY; f++) {
            size_t len;
            free(graph_run_render(r, (enum graph_field)f, 1 << 16, &len));
        }
        size_t take = at < size ? (data[at] % 16) : 0;
        if (at + 1 + take > size)
            take = at + 1 < size ? size - at - 1 : 0;
        const char *out = at + 1 < size ? (const char *)data + at + 1 : "";
        int steps = graph_run_steps(r);
        if (graph_run_feed_trial(r, out, take) == 0) {
            graph_run_ready(r);
            graph_run_undo(r);
            if (graph_run_steps(r) != steps || graph_run_ready(r) != node)
                abort(); /* undo must put the run back exactly */
        }
        if (graph_run_feed(r, out, take) < 0)
            break;
        at += 1 + take;
    }
    for (int i = 0; i < graph_run_n_vars(r); i++)
        if (!graph_run_var_name(r, i) || !graph_run_var_value(r, i))
            abort();
    if (graph_run_steps(r) > FUZZ_MAX_STEPS)
        abort();
    graph_run_free(r);
}

/* Mode odd: a one-node loop whose edge condition and prompt come from the input. */
static graph *compile_condition(const uint8_t *data, size_t size, char err[ERR_MAX])
{
    char *text = malloc(size + 2);
    if (!text) {
        err_set(err, "out of memory");
        return NULL;
    }
    memcpy(text, data, size);
    text[size] = text[size + 1] = '\0';
    char *prompt = text + strlen(text) + (strlen(text) < size ? 1 : 0);
    if (prompt > text + size)
        prompt = text + size;

    static char *inputs[] = {"question", "kb"};
    Llms__GraphNode node = LLMS__GRAPH_NODE__INIT, *np = &node;
    node.name = "think";
    node.output = "thought";
    node.kind = LLMS__GRAPH_NODE_KIND__GRAPH_GENERATE;
    node.prompt = prompt;
    Llms__GraphEdge edges[3], *ep[3];
    for (int i = 0; i < 3; i++) {
        llms__graph_edge__init(&edges[i]);
        ep[i] = &edges[i];
    }
    edges[0].from = "START";
    edges[0].to = "think";
    edges[1].from = "think";
    edges[1].to = "END";
    edges[1].when = text;
    edges[2].from = "think";
    edges[2].to = "think";
    Llms__GraphDef d = LLMS__GRAPH_DEF__INIT;
    d.n_inputs = 2;
    d.inputs = inputs;
    d.n_nodes = 1;
    d.nodes = &np;
    d.n_edges = 3;
    d.edges = ep;
    d.output = "thought";
    d.has_max_steps = 1;
    d.max_steps = 6;
    graph *g = graph_compile(&d, &limits, err);
    free(text);
    return g;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    char err[ERR_MAX] = "";
    graph *g = NULL;
    if (data[0] % 4 == 2) {
        g = graph_builtin(graph_builtin_name(size > 1 ? data[1] % GRAPH_N_BUILTINS : 0), &limits,
                          err);
    } else if (data[0] % 2 == 0) {
        Llms__GraphDef *d = llms__graph_def__unpack(NULL, size - 1, data + 1);
        if (!d)
            return 0;
        g = graph_compile(d, &limits, err);
        llms__graph_def__free_unpacked(d, NULL);
    } else {
        g = compile_condition(data + 1, size - 1, err);
    }
    if (!g) {
        if (!err[0])
            abort(); /* a refusal always says why */
        return 0;
    }
    exercise(g, data, size);
    graph_free(g);
    return 0;
}
