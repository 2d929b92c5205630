/* test_graph.c — workflow graphs: checks, conditions, templates, built-ins, runs. */
#include "daemon/graph/graph.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/test.h"

static const graph_limits lim = {.max_nodes = 16, .max_steps = 50};

/* A small graph built in a test: nodes and edges appended in order. */
typedef struct def {
    Llms__GraphDef d;
    Llms__GraphNode nodes[8], *np[8];
    Llms__GraphEdge edges[16], *ep[16];
    char *inputs[4];
} def;

static void def_init(def *x, const char *output)
{
    memset(x, 0, sizeof *x);
    llms__graph_def__init(&x->d);
    x->d.nodes = x->np;
    x->d.edges = x->ep;
    x->d.inputs = x->inputs;
    x->d.output = (char *)output;
}

static void def_input(def *x, const char *name)
{
    x->inputs[x->d.n_inputs++] = (char *)name;
}

static Llms__GraphNode *def_gen(def *x, const char *name, const char *output, const char *prompt)
{
    Llms__GraphNode *n = &x->nodes[x->d.n_nodes];
    llms__graph_node__init(n);
    n->name = (char *)name;
    n->output = (char *)output;
    n->kind = LLMS__GRAPH_NODE_KIND__GRAPH_GENERATE;
    n->prompt = (char *)prompt;
    x->np[x->d.n_nodes++] = n;
    return n;
}

static Llms__GraphNode *def_ret(def *x, const char *name, const char *output, const char *query)
{
    Llms__GraphNode *n = &x->nodes[x->d.n_nodes];
    llms__graph_node__init(n);
    n->name = (char *)name;
    n->output = (char *)output;
    n->kind = LLMS__GRAPH_NODE_KIND__GRAPH_RETRIEVE;
    n->kb = "docs";
    n->query = (char *)query;
    x->np[x->d.n_nodes++] = n;
    return n;
}

static void def_edge(def *x, const char *from, const char *to, const char *when)
{
    Llms__GraphEdge *e = &x->edges[x->d.n_edges];
    llms__graph_edge__init(e);
    e->from = (char *)from;
    e->to = (char *)to;
    e->when = (char *)when;
    x->ep[x->d.n_edges++] = e;
}

/* Whether compiling x is refused with a message containing want. */
static bool refused(def *x, const char *want)
{
    char err[ERR_MAX] = "";
    graph *g = graph_compile(&x->d, &lim, err);
    if (g) {
        fprintf(stderr, "    accepted, expected '%s'\n", want);
        graph_free(g);
        return false;
    }
    if (!strstr(err, want)) {
        fprintf(stderr, "    error '%s', expected '%s'\n", err, want);
        return false;
    }
    return true;
}

/* START -> ask -> END with input q. */
static void simple(def *x)
{
    def_init(x, "a");
    def_input(x, "q");
    def_gen(x, "ask", "a", "Q: {q}");
    def_edge(x, "START", "ask", NULL);
    def_edge(x, "ask", "END", NULL);
}

static void test_valid_simple(void)
{
    def x;
    simple(&x);
    char err[ERR_MAX];
    graph *g = graph_compile(&x.d, &lim, err);
    CHECK_MSG(g, "%s", err);
    Llms__GraphVar v, *vp = &v;
    llms__graph_var__init(&v);
    v.name = "q";
    v.value = "why {not}?";
    graph_run *r = graph_run_new(g, &vp, 1, 100, err);
    CHECK_MSG(r, "%s", err);
    CHECK_EQ(graph_run_ready(r), 0);
    size_t len;
    char *p = graph_run_render(r, GRAPH_FIELD_PROMPT, 100, &len);
    CHECK(p && strcmp(p, "Q: why {not}?") == 0); /* values are not templates */
    CHECK_EQ(len, 13);
    free(p);
    CHECK(!graph_run_render(r, GRAPH_FIELD_PROMPT, 12, &len)); /* over the limit */
    CHECK_EQ(len, 13);
    /* a generation has no query: empty, not a crash (found by tests/fuzz/fuzz_graph) */
    char *q = graph_run_render(r, GRAPH_FIELD_QUERY, 100, &len);
    CHECK(q && !q[0] && len == 0);
    free(q);
    CHECK_EQ(graph_run_feed(r, "because", 7), 0);
    CHECK_EQ(graph_run_ready(r), -1);
    q = graph_run_render(r, GRAPH_FIELD_PROMPT, 100, &len); /* the run is over */
    CHECK(q && !q[0] && len == 0);
    free(q);
    CHECK(!graph_run_capped(r));
    CHECK(strcmp(graph_run_var(r, "a"), "because") == 0);
    CHECK_EQ(graph_run_steps(r), 1);
    graph_run_free(r);
    graph_free(g);
}

static void test_refusals(void)
{
    def x;
    simple(&x);
    x.nodes[0].prompt = "Q: {nope}";
    CHECK(refused(&x, "node 'ask': prompt template: unknown variable 'nope'"));
    simple(&x);
    x.nodes[0].prompt = "Q: {q";
    CHECK(refused(&x, "node 'ask': prompt template: '{' at byte 3 is not closed"));
    simple(&x);
    x.nodes[0].prompt = NULL;
    CHECK(refused(&x, "node 'ask': a prompt is needed"));
    simple(&x);
    x.nodes[0].name = "END";
    CHECK(refused(&x, "node 'END': not a node name"));
    simple(&x);
    def_gen(&x, "ask", "b", "x");
    CHECK(refused(&x, "node 'ask' is defined twice"));
    simple(&x);
    x.edges[1].to = "ghost";
    CHECK(refused(&x, "node 'ask': edge 1 to unknown node 'ghost'"));
    simple(&x);
    x.edges[1].when = "q == 'x'";
    CHECK(refused(&x, "node 'ask': all its edges have conditions"));
    simple(&x);
    def_edge(&x, "ask", "END", NULL);
    CHECK(refused(&x, "node 'ask': its edge to 'END' comes after an unconditional edge"));
    simple(&x);
    x.d.output = "zzz";
    CHECK(refused(&x, "output 'zzz'"));
    simple(&x);
    def_gen(&x, "lonely", "b", "x");
    def_edge(&x, "lonely", "END", NULL);
    CHECK(refused(&x, "node 'lonely' cannot be reached from START"));
    simple(&x);
    x.edges[1].to = "ask"; /* ask -> ask: no way to END */
    x.d.has_max_steps = 1;
    x.d.max_steps = 5;
    CHECK(refused(&x, "END cannot be reached from START"));
    simple(&x);
    x.edges[1].when = "runs(ask) >= 2";
    def_edge(&x, "ask", "ask", NULL);
    CHECK(refused(&x, "node 'ask' is on a cycle and the graph has no max_steps"));
    x.d.has_max_steps = 1;
    x.d.max_steps = 51;
    CHECK(refused(&x, "max_steps 51: must be 1..50"));
    simple(&x);
    def_ret(&x, "look", "p", "{q}");
    x.nodes[1].has_top_k = 1;
    x.nodes[1].top_k = 0;
    x.edges[0].to = "look";
    def_edge(&x, "look", "ask", NULL);
    CHECK(refused(&x, "node 'look': top_k must be 1..64"));
    x.nodes[1].top_k = 3;
    x.nodes[1].kb = "{kbname}";
    CHECK(refused(&x, "node 'look': kb template: unknown variable 'kbname'"));
    simple(&x);
    x.edges[1].when = "q ==";
    def_edge(&x, "ask", "END", NULL);
    CHECK(refused(&x, "node 'ask': edge to 'END': condition: a value expected at its end"));
    x.edges[1].when = "runs(nobody) > 1";
    CHECK(refused(&x, "condition: unknown node 'nobody'"));
    x.edges[1].when = "q == 'a' and";
    CHECK(refused(&x, "condition: a value expected"));
    x.edges[1].when = "(q == 'a'";
    CHECK(refused(&x, "')' expected"));
    x.edges[1].when = "q == 'a' q";
    CHECK(refused(&x, "unexpected text"));
    x.edges[1].when = "system('rm -rf /')";
    CHECK(refused(&x, "unknown variable 'system'"));
    /* a node's answer is a variable's text: logprobs would have nowhere to go */
    simple(&x);
    Llms__GenerationParams lp = LLMS__GENERATION_PARAMS__INIT;
    lp.has_logprobs = 1;
    x.nodes[0].params = &lp;
    CHECK(refused(&x, "node 'ask': logprobs are given by Call and Complete"));
    /* a reply schema the engine cannot enforce is refused at creation, not at each run */
    simple(&x);
    Llms__GenerationParams js = LLMS__GENERATION_PARAMS__INIT;
    js.has_format = 1;
    js.format = LLMS__RESPONSE_FORMAT__FORMAT_JSON_SCHEMA;
    js.json_schema = "{\"type\":\"object\",\"properties\":{\"a\":{\"uniqueItems\":true}}}";
    x.nodes[0].params = &js;
    CHECK(refused(&x, "node 'ask': json schema: 'uniqueItems' at #/properties/a"));
    js.json_schema = NULL;
    CHECK(refused(&x, "node 'ask': format FORMAT_JSON_SCHEMA needs json_schema"));
    js.format = LLMS__RESPONSE_FORMAT__FORMAT_JSON_OBJECT;
    js.json_schema = "{\"type\":\"object\"}";
    CHECK(refused(&x, "node 'ask': json_schema is given without format FORMAT_JSON_SCHEMA"));
    js.format = LLMS__RESPONSE_FORMAT__FORMAT_JSON_SCHEMA;
    char err[ERR_MAX];
    graph *ok = graph_compile(&x.d, &(graph_limits){.max_nodes = 8, .max_steps = 10}, err);
    CHECK_MSG(ok, "%s", err);
    graph_free(ok);
    /* a grammar likewise */
    Llms__GenerationParams gb = LLMS__GENERATION_PARAMS__INIT;
    gb.has_format = 1;
    gb.format = LLMS__RESPONSE_FORMAT__FORMAT_GRAMMAR;
    gb.grammar = "root ::= item\n";
    x.nodes[0].params = &gb;
    CHECK(refused(&x, "node 'ask': grammar: "));
    CHECK(refused(&x, "'item'"));
    gb.grammar = "root ::= \"yes\" | \"no\"\n";
    ok = graph_compile(&x.d, &(graph_limits){.max_nodes = 8, .max_steps = 10}, err);
    CHECK_MSG(ok, "%s", err);
    graph_free(ok);
    gb.format = LLMS__RESPONSE_FORMAT__FORMAT_TEXT;
    CHECK(refused(&x, "node 'ask': grammar is given without format FORMAT_GRAMMAR"));
    x.nodes[0].params = &js;
    simple(&x);
    for (int i = 0; i < 7; i++)
        def_gen(&x, "n", "b", "x");
    graph_limits small = {.max_nodes = 4, .max_steps = 10};
    CHECK(!graph_compile(&x.d, &small, err) && strstr(err, "graph_max_nodes"));
}

/* A graph whose only edge condition is cond, evaluated over a = va, b = vb. */
static int cond_holds(const char *cond, const char *va, const char *vb)
{
    def x;
    def_init(&x, "out");
    def_input(&x, "a");
    def_input(&x, "b");
    def_gen(&x, "first", "out", "{a}");
    def_gen(&x, "yes", "out", "{b}");
    def_edge(&x, "START", "first", NULL);
    def_edge(&x, "first", "yes", cond);
    def_edge(&x, "first", "END", NULL);
    def_edge(&x, "yes", "END", NULL);
    char err[ERR_MAX];
    graph *g = graph_compile(&x.d, &lim, err);
    if (!g) {
        fprintf(stderr, "    %s: %s\n", cond, err);
        return -1;
    }
    Llms__GraphVar v[2], *vp[2] = {&v[0], &v[1]};
    llms__graph_var__init(&v[0]);
    llms__graph_var__init(&v[1]);
    v[0].name = "a";
    v[0].value = (char *)va;
    v[1].name = "b";
    v[1].value = (char *)vb;
    graph_run *r = graph_run_new(g, vp, 2, 10, err);
    int holds = -1;
    if (r && graph_run_feed(r, "x", 1) == 0)
        holds = graph_run_ready(r) == 1;
    graph_run_free(r);
    graph_free(g);
    return holds;
}

static void test_expressions(void)
{
    CHECK_EQ(cond_holds("a == 'cat'", "cat", ""), 1);
    CHECK_EQ(cond_holds("a == \"cat\"", "dog", ""), 0);
    CHECK_EQ(cond_holds("a != 'cat'", "dog", ""), 1);
    CHECK_EQ(cond_holds("a < b", "9", "10"), 1);    /* numbers compare as numbers */
    CHECK_EQ(cond_holds("a < b", "9x", "10x"), 0);  /* strings as bytes */
    CHECK_EQ(cond_holds("a <= 2.5", "2.5", ""), 1);
    CHECK_EQ(cond_holds("a > -1", "0", ""), 1);
    CHECK_EQ(cond_holds("a >= b", "abc", "abd"), 0);
    CHECK_EQ(cond_holds("a contains 'DONE'", "we are DONE now", ""), 1);
    CHECK_EQ(cond_holds("a contains b", "haystack", "needle"), 0);
    CHECK_EQ(cond_holds("not a contains 'x'", "abc", ""), 1);
    CHECK_EQ(cond_holds("a == 'x' or b == 'y'", "q", "y"), 1);
    CHECK_EQ(cond_holds("a == 'x' and b == 'y'", "q", "y"), 0);
    CHECK_EQ(cond_holds("not (a == 'x' or b == 'y')", "q", "z"), 1);
    CHECK_EQ(cond_holds("a == 'x' or a == 'q' and b == 'no'", "x", "z"), 1); /* and binds tighter */
    CHECK_EQ(cond_holds("(a == 'x' or a == 'q') and b == 'no'", "x", "z"), 0);
    CHECK_EQ(cond_holds("len(a) == 3", "abc", ""), 1);
    CHECK_EQ(cond_holds("runs(first) == 1 and steps == 1", "", ""), 1);
    CHECK_EQ(cond_holds("out == 'x'", "", ""), 1);  /* the node's own output, just set */
    CHECK_EQ(cond_holds("a", "", ""), 0);            /* truth: empty, 0, false are false */
    CHECK_EQ(cond_holds("a", "0", ""), 0);
    CHECK_EQ(cond_holds("a", "yes", ""), 1);
    CHECK_EQ(cond_holds("true and not false", "", ""), 1);
    CHECK_EQ(cond_holds("a == 10", "1e1", ""), 1);
    /* strtod reads "nan", which is unordered: such a text compares as bytes, or it would
     * equal every number (a model's "NaN" == 5) and differ from none */
    CHECK_EQ(cond_holds("a == b", "nan", "5"), 0);
    CHECK_EQ(cond_holds("a != b", "NaN", "0"), 1);
    CHECK_EQ(cond_holds("a == 'nan'", "nan", ""), 1);
}

/* gen -> gen while runs(gen) < 3, then END; the run's cap and the graph's max_steps. */
static void test_loop_and_cap(void)
{
    def x;
    def_init(&x, "out");
    def_input(&x, "q");
    def_gen(&x, "gen", "out", "{q} {out}");
    def_edge(&x, "START", "gen", NULL);
    def_edge(&x, "gen", "gen", "runs(gen) < 3");
    def_edge(&x, "gen", "END", NULL);
    x.d.has_max_steps = 1;
    x.d.max_steps = 10;
    char err[ERR_MAX];
    graph *g = graph_compile(&x.d, &lim, err);
    CHECK_MSG(g, "%s", err);
    Llms__GraphVar v, *vp = &v;
    llms__graph_var__init(&v);
    v.name = "q";
    v.value = "go";
    graph_run *r = graph_run_new(g, &vp, 1, 100, err);
    CHECK(r);
    const char *outs[] = {"a", "b", "c"};
    for (int i = 0; i < 3; i++) {
        CHECK_EQ(graph_run_ready(r), 0);
        size_t len;
        char *p = graph_run_render(r, GRAPH_FIELD_PROMPT, 1000, &len);
        char want[32];
        snprintf(want, sizeof want, "go %s", i ? outs[i - 1] : "");
        CHECK_MSG(p && strcmp(p, want) == 0, "'%s' != '%s'", p ? p : "(null)", want);
        free(p);
        CHECK_EQ(graph_run_feed(r, outs[i], 1), 0);
    }
    CHECK_EQ(graph_run_ready(r), -1);
    CHECK(!graph_run_capped(r));
    CHECK_EQ(graph_run_count(r, 0), 3);
    graph_run_free(r);
    /* the run's own cap (the daemon's graph_max_steps) below the loop's length */
    r = graph_run_new(g, &vp, 1, 2, err);
    CHECK(r);
    CHECK_EQ(graph_run_feed(r, "a", 1), 0);
    CHECK_EQ(graph_run_ready(r), 0);
    CHECK_EQ(graph_run_feed(r, "b", 1), 0);
    CHECK_EQ(graph_run_ready(r), -1);
    CHECK(graph_run_capped(r));
    CHECK(strcmp(graph_run_var(r, "out"), "b") == 0);
    graph_run_free(r);
    /* an endless loop stops at the graph's max_steps */
    x.edges[1].when = "runs(gen) > 0";
    graph_free(g);
    g = graph_compile(&x.d, &lim, err);
    CHECK_MSG(g, "%s", err);
    r = graph_run_new(g, &vp, 1, 100, err);
    int steps = 0;
    while (graph_run_ready(r) >= 0 && steps < 100) {
        CHECK_EQ(graph_run_feed(r, "z", 1), 0);
        steps++;
    }
    CHECK_EQ(steps, 10);
    CHECK(graph_run_capped(r));
    graph_run_free(r);
    graph_free(g);
}

/* A trial feed shows the node its output leads to, rendered with it, and the undo puts
 * the run back: the same ready node, counts, steps, state and routes as before. */
static void test_trial_feed(void)
{
    def x;
    def_init(&x, "answer");
    def_input(&x, "q");
    def_gen(&x, "think", "thought", "{q}?");
    def_ret(&x, "look", "passages", "{q} {thought}");
    def_gen(&x, "answer", "answer", "{passages}|{thought}");
    def_edge(&x, "START", "think", NULL);
    def_edge(&x, "think", "answer", "thought contains 'DONE'");
    def_edge(&x, "think", "look", NULL);
    def_edge(&x, "look", "answer", NULL);
    def_edge(&x, "answer", "END", NULL);
    char err[ERR_MAX];
    graph *g = graph_compile(&x.d, &lim, err);
    CHECK_MSG(g, "%s", err);
    Llms__GraphVar v, *vp = &v;
    llms__graph_var__init(&v);
    v.name = "q";
    v.value = "why";
    graph_run *r = graph_run_new(g, &vp, 1, 3, err);
    CHECK(r);
    size_t len;
    /* a partial thought leads to the retrieval, a finished one past it */
    CHECK_EQ(graph_run_feed_trial(r, "the sky", 7), 0);
    CHECK_EQ(graph_run_ready(r), 1);
    char *q = graph_run_render(r, GRAPH_FIELD_QUERY, 100, &len);
    CHECK(q && strcmp(q, "why the sky") == 0);
    free(q);
    CHECK_EQ(graph_run_steps(r), 1);
    graph_run_undo(r);
    CHECK_EQ(graph_run_ready(r), 0);
    CHECK_EQ(graph_run_steps(r), 0);
    CHECK_EQ(graph_run_count(r, 0), 0);
    CHECK(strcmp(graph_run_var(r, "thought"), "") == 0);
    CHECK_EQ(graph_run_feed_trial(r, "DONE", 4), 0);
    CHECK_EQ(graph_run_ready(r), 2);
    graph_run_undo(r);
    CHECK_EQ(graph_run_ready(r), 0);
    /* the real feed routes as if no trial had been made */
    CHECK_EQ(graph_run_feed(r, "blue", 4), 0);
    CHECK_EQ(graph_run_ready(r), 1);
    /* a trial of the retrieval's output: the answer's prompt with it */
    CHECK_EQ(graph_run_feed_trial(r, "P1", 2), 0);
    CHECK_EQ(graph_run_ready(r), 2);
    char *p = graph_run_render(r, GRAPH_FIELD_PROMPT, 100, &len);
    CHECK(p && strcmp(p, "P1|blue") == 0);
    free(p);
    graph_run_undo(r);
    CHECK_EQ(graph_run_ready(r), 1);
    CHECK(strcmp(graph_run_var(r, "passages"), "") == 0);
    CHECK_EQ(graph_run_count(r, 1), 0);
    /* a trial that ends the run, and the undo that reopens it */
    CHECK_EQ(graph_run_feed(r, "P2", 2), 0);
    CHECK_EQ(graph_run_feed_trial(r, "A", 1), 0);
    CHECK_EQ(graph_run_ready(r), -1);
    graph_run_undo(r);
    CHECK_EQ(graph_run_ready(r), 2);
    CHECK(!graph_run_capped(r));
    CHECK_EQ(graph_run_feed(r, "A", 1), 0);
    CHECK_EQ(graph_run_ready(r), -1);
    CHECK(!graph_run_capped(r));
    CHECK(strcmp(graph_run_var(r, "answer"), "A") == 0);
    graph_run_free(r);
    /* a run freed in the middle of a trial frees both values */
    r = graph_run_new(g, &vp, 1, 3, err);
    CHECK(r);
    CHECK_EQ(graph_run_feed_trial(r, "x", 1), 0);
    graph_run_free(r);
    graph_free(g);
}

static void test_inputs(void)
{
    def x;
    simple(&x);
    char err[ERR_MAX];
    graph *g = graph_compile(&x.d, &lim, err);
    CHECK(g);
    Llms__GraphVar v[2], *vp[2] = {&v[0], &v[1]};
    llms__graph_var__init(&v[0]);
    llms__graph_var__init(&v[1]);
    v[0].name = "q";
    v[0].value = "x";
    v[1].name = "a";
    v[1].value = "y";
    CHECK(!graph_run_new(g, vp, 0, 10, err) && strstr(err, "input 'q' is missing"));
    CHECK(!graph_run_new(g, vp, 2, 10, err) && strstr(err, "input 'a': the graph has no such"));
    v[1].name = "q";
    CHECK(!graph_run_new(g, vp, 2, 10, err) && strstr(err, "input 'q' is given twice"));
    graph_free(g);
}

/* Runs built-in name with fixed node outputs: each node's output is its own name, and
 * "reason" answers DONE at its second run; returns the sequence of node names. */
static int walk_builtin(const char *name, char *seq, size_t cap)
{
    char err[ERR_MAX];
    graph *g = graph_builtin(name, &lim, err);
    if (!g) {
        fprintf(stderr, "    %s\n", err);
        return -1;
    }
    Llms__GraphVar v[2], *vp[2] = {&v[0], &v[1]};
    llms__graph_var__init(&v[0]);
    llms__graph_var__init(&v[1]);
    v[0].name = "question";
    v[0].value = "who?";
    v[1].name = "kb";
    v[1].value = "notes";
    graph_run *r = graph_run_new(g, vp, 2, 50, err);
    seq[0] = '\0';
    int node, rc = 0;
    while (r && (node = graph_run_ready(r)) >= 0) {
        const Llms__GraphNode *n = graph_def(g)->nodes[node];
        snprintf(seq + strlen(seq), cap - strlen(seq), "%s%s", *seq ? " " : "", n->name);
        if (n->kind == LLMS__GRAPH_NODE_KIND__GRAPH_RETRIEVE) {
            size_t len;
            char *kb = graph_run_render(r, GRAPH_FIELD_KB, 100, &len);
            rc |= !kb || strcmp(kb, "notes") != 0;
            free(kb);
        }
        const char *out = strcmp(n->name, "reason") == 0 && graph_run_count(r, node) == 1
                              ? "DONE" : n->name;
        graph_run_feed(r, out, strlen(out));
    }
    /* every template's answer comes from its last generation node */
    const char *last = strcmp(name, "irg") == 0 ? "generate" : "answer";
    rc |= !r || strcmp(graph_run_var(r, "answer"), last) != 0;
    graph_run_free(r);
    graph_free(g);
    return rc;
}

static void test_builtins(void)
{
    char seq[256];
    CHECK_EQ(walk_builtin("one-shot", seq, sizeof seq), 0);
    CHECK_MSG(strcmp(seq, "retrieve answer") == 0, "%s", seq);
    CHECK_EQ(walk_builtin("hyde", seq, sizeof seq), 0);
    CHECK_MSG(strcmp(seq, "hypothesize retrieve answer") == 0, "%s", seq);
    CHECK_EQ(walk_builtin("multistep", seq, sizeof seq), 0);
    CHECK_MSG(strcmp(seq, "retrieve reason retrieve reason answer") == 0, "%s", seq);
    CHECK_EQ(walk_builtin("irg", seq, sizeof seq), 0);
    CHECK_MSG(strcmp(seq, "retrieve generate retrieve generate retrieve generate") == 0, "%s", seq);
    CHECK_EQ(walk_builtin("recomp", seq, sizeof seq), 0);
    CHECK_MSG(strcmp(seq, "retrieve compress answer") == 0, "%s", seq);
    for (int i = 0; i < GRAPH_N_BUILTINS; i++)
        CHECK(graph_builtin_name(i));
    CHECK(!graph_builtin_name(GRAPH_N_BUILTINS));
    char err[ERR_MAX];
    CHECK(!graph_builtin("nope", &lim, err) && strstr(err, "no built-in graph 'nope'"));
}

static void test_names(void)
{
    CHECK(graph_name_ok("my-graph.v2_x"));
    CHECK(!graph_name_ok(""));
    CHECK(!graph_name_ok("a/b"));
    CHECK(!graph_name_ok("a b"));
}

int main(void)
{
    RUN(test_valid_simple);
    RUN(test_refusals);
    RUN(test_expressions);
    RUN(test_loop_and_cap);
    RUN(test_trial_feed);
    RUN(test_inputs);
    RUN(test_builtins);
    RUN(test_names);
    return test_finish();
}
