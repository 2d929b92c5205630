/* graph.c — workflow graphs: checks, conditions, templates, built-ins, runs (graph.h). */
#include "daemon/graph/graph.h"

#include <ctype.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/replyformat.h"

#define GRAPH_MAX_INPUTS 32
#define GRAPH_MAX_EDGES_PER_NODE 8
#define EX_MAX 128               /* parsed terms of one condition */
#define NUM_TEXT 32              /* a number written as text */

enum ex_op {
    EX_OR, EX_AND, EX_NOT, EX_CMP, EX_TRUTH,
    EX_VAR, EX_STR, EX_NUM, EX_RUNS, EX_LEN, EX_STEPS,
};
enum ex_cmp { CMP_EQ, CMP_NE, CMP_LT, CMP_LE, CMP_GT, CMP_GE, CMP_CONTAINS };

typedef struct ex {
    uint8_t op, cmp;
    int a, b;                    /* operands: indices into the condition's terms */
    int idx;                     /* EX_VAR, EX_LEN: variable; EX_RUNS: node */
    double num;                  /* EX_NUM */
    char *str;                   /* EX_STR: NUL-terminated */
    size_t len;
} ex;

typedef struct cond {
    ex *t;
    int n;
    int root;
} cond;

typedef struct edge {
    int from, to;                /* node indices; START = -1, END = n_nodes */
    cond *when;                  /* NULL: always */
} edge;

struct graph {
    Llms__GraphDef *def;         /* own copy */
    int n_nodes;
    int n_vars;
    const char **vars;           /* inputs first, then node outputs not already named */
    int *node_var;               /* (n_nodes) the variable each node sets */
    int output_var;
    edge *edges;
    int n_edges;
    int max_steps;
};

struct graph_run {
    const graph *g;
    char **vals;                 /* (n_vars) malloc'ed, "" when unset */
    int *counts;                 /* (n_nodes) */
    int ready;                   /* node, or -1 when over */
    int steps, cap;
    bool capped;
    /* a trial feed's undo: the node fed and its variable's value before (graph_run_undo) */
    int trial_node;              /* -1: no trial in progress */
    char *trial_old;
};

static const char *const reserved_words[] = {
    "and", "or", "not", "contains", "runs", "len", "steps", "true", "false", "START", "END",
};

static bool ident_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > GRAPH_NAME_MAX || isdigit((unsigned char)s[0]))
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '_')
            return false;
    for (size_t i = 0; i < sizeof reserved_words / sizeof reserved_words[0]; i++)
        if (strcmp(s, reserved_words[i]) == 0)
            return false;
    return true;
}

bool graph_name_ok(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n > GRAPH_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)name[i]) && !strchr("._-", name[i]))
            return false;
    return true;
}

static int var_index(const graph *g, const char *name, size_t len)
{
    for (int i = 0; i < g->n_vars; i++)
        if (strlen(g->vars[i]) == len && memcmp(g->vars[i], name, len) == 0)
            return i;
    return -1;
}

static int node_index(const graph *g, const char *name, size_t len)
{
    for (int i = 0; i < g->n_nodes; i++)
        if (strlen(g->def->nodes[i]->name) == len && memcmp(g->def->nodes[i]->name, name, len) == 0)
            return i;
    return -1;
}

/* ---- templates ---- */

/* Walks template t: checks it (when g names the variables) and, with vals, writes the
 * rendering to out (NULL: only counts). Returns the rendered length, or -1 with err. */
static long tmpl_walk(const graph *g, const char *t, char *const *vals, char *out,
                      char err[ERR_MAX])
{
    long n = 0;
    for (const char *p = t; *p;) {
        if ((p[0] == '{' && p[1] == '{') || (p[0] == '}' && p[1] == '}')) {
            if (out)
                out[n] = p[0];
            n++;
            p += 2;
            continue;
        }
        if (*p == '}') {
            err_set(err, "template: a lone '}' at byte %ld (write '}}')", (long)(p - t));
            return -1;
        }
        if (*p != '{') {
            if (out)
                out[n] = *p;
            n++;
            p++;
            continue;
        }
        const char *end = strchr(p, '}');
        if (!end) {
            err_set(err, "template: '{' at byte %ld is not closed (write '{{' for a brace)",
                    (long)(p - t));
            return -1;
        }
        int v = var_index(g, p + 1, (size_t)(end - p - 1));
        if (v < 0) {
            err_set(err, "template: unknown variable '%.*s'",
                    (int)(end - p - 1 > GRAPH_NAME_MAX ? GRAPH_NAME_MAX : end - p - 1), p + 1);
            return -1;
        }
        if (vals) {
            size_t len = strlen(vals[v]);
            if (out)
                memcpy(out + n, vals[v], len);
            n += (long)len;
        }
        p = end + 1;
    }
    return n;
}

/* ---- conditions ---- */

typedef struct parser {
    const graph *g;
    const char *s, *p;
    cond *c;
    char *err;
} parser;

static void skip_space(parser *ps)
{
    while (isspace((unsigned char)*ps->p))
        ps->p++;
}

/* Whether the next token is the word w (not a prefix of a longer identifier). */
static bool at_word(parser *ps, const char *w)
{
    skip_space(ps);
    size_t n = strlen(w);
    return strncmp(ps->p, w, n) == 0 && !isalnum((unsigned char)ps->p[n]) && ps->p[n] != '_';
}

static int fail_at(parser *ps, const char *what)
{
    if (*ps->p)
        err_set(ps->err, "condition: %s at byte %ld ('%.16s')", what, (long)(ps->p - ps->s), ps->p);
    else
        err_set(ps->err, "condition: %s at its end", what);
    return -1;
}

static int term_new(parser *ps, uint8_t op)
{
    if (ps->c->n >= EX_MAX)
        return fail_at(ps, "too long");
    ex *e = &ps->c->t[ps->c->n];
    memset(e, 0, sizeof *e);
    e->op = op;
    e->a = e->b = e->idx = -1;
    return ps->c->n++;
}

static int parse_or(parser *ps, int depth);

/* An identifier's extent at ps->p (0 when none). */
static size_t ident_len(const char *p)
{
    size_t n = 0;
    if (isalpha((unsigned char)p[0]) || p[0] == '_')
        while (isalnum((unsigned char)p[n]) || p[n] == '_')
            n++;
    return n;
}

/* runs(node) or len(variable): the name inside the parentheses. */
static int parse_call(parser *ps, uint8_t op)
{
    skip_space(ps);
    if (*ps->p != '(')
        return fail_at(ps, "'(' expected");
    ps->p++;
    skip_space(ps);
    size_t n = ident_len(ps->p);
    if (n == 0)
        return fail_at(ps, "a name expected");
    int idx = op == EX_RUNS ? node_index(ps->g, ps->p, n) : var_index(ps->g, ps->p, n);
    if (idx < 0) {
        err_set(ps->err, "condition: unknown %s '%.*s'", op == EX_RUNS ? "node" : "variable",
                (int)(n > GRAPH_NAME_MAX ? GRAPH_NAME_MAX : n), ps->p);
        return -1;
    }
    ps->p += n;
    skip_space(ps);
    if (*ps->p != ')')
        return fail_at(ps, "')' expected");
    ps->p++;
    int t = term_new(ps, op);
    if (t >= 0)
        ps->c->t[t].idx = idx;
    return t;
}

static int parse_operand(parser *ps, int depth)
{
    skip_space(ps);
    const char *p = ps->p;
    if (*p == '(') {
        ps->p++;
        int t = parse_or(ps, depth + 1);
        if (t < 0)
            return -1;
        skip_space(ps);
        if (*ps->p != ')')
            return fail_at(ps, "')' expected");
        ps->p++;
        return t;
    }
    if (*p == '\'' || *p == '"') {
        const char *end = strchr(p + 1, *p);
        if (!end)
            return fail_at(ps, "unterminated string");
        int t = term_new(ps, EX_STR);
        if (t < 0)
            return -1;
        ex *e = &ps->c->t[t];
        e->len = (size_t)(end - p - 1);
        if (!(e->str = strndup(p + 1, e->len)))
            return err_set(ps->err, "out of memory");
        ps->p = end + 1;
        return t;
    }
    if (isdigit((unsigned char)*p) || ((*p == '-' || *p == '.') && isdigit((unsigned char)p[1]))) {
        char *end;
        double v = strtod(p, &end);
        if (ident_len(end) || *end == '.')
            return fail_at(ps, "malformed number");
        int t = term_new(ps, EX_NUM);
        if (t < 0)
            return -1;
        ps->c->t[t].num = v;
        ps->p = end;
        return t;
    }
    size_t n = ident_len(p);
    if (n == 0)
        return fail_at(ps, "a value expected");
    if (at_word(ps, "true") || at_word(ps, "false")) {
        int t = term_new(ps, EX_NUM);
        if (t >= 0)
            ps->c->t[t].num = *p == 't';
        ps->p += n;
        return t;
    }
    if (at_word(ps, "steps")) {
        ps->p += n;
        return term_new(ps, EX_STEPS);
    }
    if (at_word(ps, "runs") || at_word(ps, "len")) {
        ps->p += n;
        return parse_call(ps, *p == 'r' ? EX_RUNS : EX_LEN);
    }
    for (size_t i = 0; i < sizeof reserved_words / sizeof reserved_words[0]; i++)
        if (at_word(ps, reserved_words[i]))
            return fail_at(ps, "a value expected");
    int v = var_index(ps->g, p, n);
    if (v < 0) {
        err_set(ps->err, "condition: unknown variable '%.*s'",
                (int)(n > GRAPH_NAME_MAX ? GRAPH_NAME_MAX : n), p);
        return -1;
    }
    int t = term_new(ps, EX_VAR);
    if (t >= 0)
        ps->c->t[t].idx = v;
    ps->p += n;
    return t;
}

static int parse_cmp(parser *ps, int depth)
{
    static const struct { const char *op; uint8_t cmp; } ops[] = {
        {"==", CMP_EQ}, {"!=", CMP_NE}, {"<=", CMP_LE}, {">=", CMP_GE},
        {"<", CMP_LT}, {">", CMP_GT},
    };
    int a = parse_operand(ps, depth);
    if (a < 0)
        return -1;
    skip_space(ps);
    int cmp = -1;
    for (size_t i = 0; i < sizeof ops / sizeof ops[0] && cmp < 0; i++)
        if (strncmp(ps->p, ops[i].op, strlen(ops[i].op)) == 0) {
            cmp = ops[i].cmp;
            ps->p += strlen(ops[i].op);
        }
    if (cmp < 0 && at_word(ps, "contains")) {
        cmp = CMP_CONTAINS;
        ps->p += strlen("contains");
    }
    if (cmp < 0) {
        int t = term_new(ps, EX_TRUTH);
        if (t >= 0)
            ps->c->t[t].a = a;
        return t;
    }
    int b = parse_operand(ps, depth);
    if (b < 0)
        return -1;
    int t = term_new(ps, EX_CMP);
    if (t >= 0) {
        ps->c->t[t].cmp = (uint8_t)cmp;
        ps->c->t[t].a = a;
        ps->c->t[t].b = b;
    }
    return t;
}

static int parse_unary(parser *ps, int depth)
{
    if (depth > 32)
        return fail_at(ps, "nested too deeply");
    if (at_word(ps, "not")) {
        ps->p += 3;
        int a = parse_unary(ps, depth + 1);
        if (a < 0)
            return -1;
        int t = term_new(ps, EX_NOT);
        if (t >= 0)
            ps->c->t[t].a = a;
        return t;
    }
    return parse_cmp(ps, depth);
}

static int parse_binary(parser *ps, int depth, uint8_t op)
{
    const char *word = op == EX_OR ? "or" : "and";
    int a = op == EX_OR ? parse_binary(ps, depth, EX_AND) : parse_unary(ps, depth);
    while (a >= 0 && at_word(ps, word)) {
        ps->p += strlen(word);
        int b = op == EX_OR ? parse_binary(ps, depth, EX_AND) : parse_unary(ps, depth);
        if (b < 0)
            return -1;
        int t = term_new(ps, op);
        if (t < 0)
            return -1;
        ps->c->t[t].a = a;
        ps->c->t[t].b = b;
        a = t;
    }
    return a;
}

static int parse_or(parser *ps, int depth)
{
    if (depth > 32)
        return fail_at(ps, "nested too deeply");
    return parse_binary(ps, depth, EX_OR);
}

static void cond_free(cond *c)
{
    if (!c)
        return;
    for (int i = 0; i < c->n; i++)
        free(c->t[i].str);
    free(c->t);
    free(c);
}

static cond *cond_compile(const graph *g, const char *text, char err[ERR_MAX])
{
    cond *c = calloc(1, sizeof *c);
    if (!c || !(c->t = calloc(EX_MAX, sizeof *c->t))) {
        free(c);
        err_set(err, "out of memory");
        return NULL;
    }
    parser ps = {g, text, text, c, err};
    c->root = parse_or(&ps, 0);
    skip_space(&ps);
    if (c->root >= 0 && *ps.p)
        c->root = fail_at(&ps, "unexpected text");
    if (c->root < 0) {
        cond_free(c);
        return NULL;
    }
    return c;
}

typedef struct val {
    const char *s;               /* NULL: a number only */
    size_t len;
    double num;
    bool is_num;
} val;

static val val_text(const char *s, size_t len)
{
    val v = {s, len, 0, false};
    if (len > 0 && len < NUM_TEXT && !isspace((unsigned char)s[0])) {
        char buf[NUM_TEXT], *end;
        memcpy(buf, s, len);
        buf[len] = '\0';
        v.num = strtod(buf, &end);
        /* "nan" reads as a number that compares with none: it stays text */
        v.is_num = *end == '\0' && !isnan(v.num);
    }
    return v;
}

static val val_num(double x)
{
    return (val){NULL, 0, x, true};
}

/* v as text (a number is written into buf). */
static const char *val_str(const val *v, char buf[NUM_TEXT], size_t *len)
{
    if (v->s) {
        *len = v->len;
        return v->s;
    }
    *len = (size_t)snprintf(buf, NUM_TEXT, "%.15g", v->num);
    return buf;
}

static bool val_truth(const val *v)
{
    if (!v->s)
        return v->num != 0;
    return v->len > 0 && !(v->len == 1 && v->s[0] == '0') &&
           !(v->len == 5 && memcmp(v->s, "false", 5) == 0);
}

static val cond_eval(const graph_run *r, const cond *c, int i)
{
    const ex *e = &c->t[i];
    switch (e->op) {
    case EX_OR:
    case EX_AND: {
        /* short-circuit: the right side is not evaluated when the left decides */
        val a = cond_eval(r, c, e->a);
        if (val_truth(&a) == (e->op == EX_OR))
            return val_num(e->op == EX_OR);
        val b = cond_eval(r, c, e->b);
        return val_num(val_truth(&b));
    }
    case EX_NOT: {
        val a = cond_eval(r, c, e->a);
        return val_num(!val_truth(&a));
    }
    case EX_TRUTH: {
        val a = cond_eval(r, c, e->a);
        return val_num(val_truth(&a));
    }
    case EX_VAR:
        return val_text(r->vals[e->idx], strlen(r->vals[e->idx]));
    case EX_STR:
        return val_text(e->str, e->len);
    case EX_NUM:
        return val_num(e->num);
    case EX_RUNS:
        return val_num(r->counts[e->idx]);
    case EX_LEN:
        return val_num((double)strlen(r->vals[e->idx]));
    case EX_STEPS:
        return val_num(r->steps);
    default: /* EX_CMP */
        break;
    }
    val a = cond_eval(r, c, e->a), b = cond_eval(r, c, e->b);
    char ba[NUM_TEXT], bb[NUM_TEXT];
    size_t la, lb;
    const char *sa = val_str(&a, ba, &la), *sb = val_str(&b, bb, &lb);
    if (e->cmp == CMP_CONTAINS)
        return val_num(lb == 0 || memmem(sa, la, sb, lb) != NULL);
    int d;
    if (a.is_num && b.is_num) {
        d = (a.num > b.num) - (a.num < b.num);
    } else {
        d = memcmp(sa, sb, la < lb ? la : lb);
        if (d == 0)
            d = (la > lb) - (la < lb);
    }
    switch (e->cmp) {
    case CMP_EQ: return val_num(d == 0);
    case CMP_NE: return val_num(d != 0);
    case CMP_LT: return val_num(d < 0);
    case CMP_LE: return val_num(d <= 0);
    case CMP_GT: return val_num(d > 0);
    default: return val_num(d >= 0);
    }
}

/* ---- checks ---- */

void graph_free(graph *g)
{
    if (!g)
        return;
    for (int i = 0; i < g->n_edges; i++)
        cond_free(g->edges[i].when);
    free(g->edges);
    free(g->vars);
    free(g->node_var);
    if (g->def)
        llms__graph_def__free_unpacked(g->def, NULL);
    free(g);
}

const Llms__GraphDef *graph_def(const graph *g)
{
    return g->def;
}

/* A generation node's reply format must be one the engine can run: a graph whose node
 * it cannot is refused when it is created, not at each run. */
static int check_reply_format(const Llms__GraphNode *n, char err[ERR_MAX])
{
    char why[ERR_MAX];
    if (replyformat_check(n->params, why))
        return err_set(err, "node '%s': %s", n->name, why);
    return 0;
}

/* A copy of def that g owns (packed and unpacked again). */
static Llms__GraphDef *def_copy(const Llms__GraphDef *def)
{
    size_t n = llms__graph_def__get_packed_size(def);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf)
        return NULL;
    llms__graph_def__pack(def, buf);
    Llms__GraphDef *copy = llms__graph_def__unpack(NULL, n, buf);
    free(buf);
    return copy;
}

static int check_template(const graph *g, const char *node, const char *field, const char *t,
                          char err[ERR_MAX])
{
    char why[ERR_MAX];
    if (!t || !*t)
        return err_set(err, "node '%s': a %s is needed", node, field);
    if (strlen(t) > GRAPH_TEXT_MAX)
        return err_set(err, "node '%s': its %s is over %d bytes", node, field, GRAPH_TEXT_MAX);
    if (tmpl_walk(g, t, NULL, NULL, why) < 0)
        return err_set(err, "node '%s': %s %s", node, field, why);
    return 0;
}

/* Names, variables and each node's fields. */
static int check_nodes(graph *g, const graph_limits *lim, char err[ERR_MAX])
{
    const Llms__GraphDef *d = g->def;
    if (d->n_nodes == 0)
        return err_set(err, "the graph has no nodes");
    if ((int)d->n_nodes > lim->max_nodes)
        return err_set(err, "the graph has %zu nodes, the limit (graph_max_nodes) is %d",
                       d->n_nodes, lim->max_nodes);
    if (d->n_inputs > GRAPH_MAX_INPUTS)
        return err_set(err, "the graph has %zu inputs, at most %d", d->n_inputs,
                       GRAPH_MAX_INPUTS);
    g->n_nodes = (int)d->n_nodes;
    g->vars = calloc(d->n_inputs + d->n_nodes, sizeof *g->vars);
    g->node_var = calloc(d->n_nodes, sizeof *g->node_var);
    if (!g->vars || !g->node_var)
        return err_set(err, "out of memory");
    for (size_t i = 0; i < d->n_inputs; i++) {
        if (!ident_ok(d->inputs[i]))
            return err_set(err, "input '%.64s': not a variable name (1..%d bytes of "
                           "[A-Za-z0-9_], not starting with a digit, not a keyword)",
                           d->inputs[i], GRAPH_NAME_MAX);
        if (var_index(g, d->inputs[i], strlen(d->inputs[i])) >= 0)
            return err_set(err, "input '%s' is named twice", d->inputs[i]);
        g->vars[g->n_vars++] = d->inputs[i];
    }
    for (int i = 0; i < g->n_nodes; i++) {
        const Llms__GraphNode *n = d->nodes[i];
        if (!ident_ok(n->name))
            return err_set(err, "node '%.64s': not a node name (1..%d bytes of [A-Za-z0-9_], "
                           "not starting with a digit, not START, END or a keyword)", n->name,
                           GRAPH_NAME_MAX);
        if (node_index(g, n->name, strlen(n->name)) < i)
            return err_set(err, "node '%s' is defined twice", n->name);
        if (!ident_ok(n->output))
            return err_set(err, "node '%s': output '%.64s' is not a variable name", n->name,
                           n->output);
        int v = var_index(g, n->output, strlen(n->output));
        if (v < 0) {
            v = g->n_vars;
            g->vars[g->n_vars++] = n->output;
        }
        g->node_var[i] = v;
    }
    for (int i = 0; i < g->n_nodes; i++) {
        const Llms__GraphNode *n = d->nodes[i];
        if (n->kind == LLMS__GRAPH_NODE_KIND__GRAPH_GENERATE) {
            if (check_template(g, n->name, "prompt", n->prompt, err))
                return -1;
            if (n->kb || n->query || n->has_top_k || n->has_retrieval)
                return err_set(err, "node '%s': a generation node has no kb, query, top_k or "
                               "retrieval", n->name);
            /* its answer is a variable's text: they would have nowhere to go */
            if (n->params && n->params->has_logprobs)
                return err_set(err, "node '%s': logprobs are given by Call and Complete, not "
                               "by a graph's generation", n->name);
            if (n->params && check_reply_format(n, err))
                return -1;
        } else if (n->kind == LLMS__GRAPH_NODE_KIND__GRAPH_RETRIEVE) {
            if (check_template(g, n->name, "kb", n->kb, err) ||
                check_template(g, n->name, "query", n->query, err))
                return -1;
            if (n->has_top_k && (n->top_k < 1 || n->top_k > GRAPH_TOP_K_MAX))
                return err_set(err, "node '%s': top_k must be 1..%d", n->name, GRAPH_TOP_K_MAX);
            if (n->has_retrieval && (n->retrieval < LLMS__RETRIEVAL__RETRIEVAL_RRF ||
                                     n->retrieval > LLMS__RETRIEVAL__RETRIEVAL_VECTOR))
                return err_set(err, "node '%s': unknown retrieval %d", n->name,
                               (int)n->retrieval);
            if (n->prompt || n->params || n->has_chat)
                return err_set(err, "node '%s': a retrieval node has no prompt, params or chat",
                               n->name);
        } else {
            return err_set(err, "node '%s': unknown kind %d", n->name, (int)n->kind);
        }
    }
    g->output_var = var_index(g, d->output, strlen(d->output));
    if (g->output_var < 0)
        return err_set(err, "the graph's output '%.64s' is no input and no node's output",
                       d->output);
    return 0;
}

static const char *end_name(const graph *g, int i)
{
    return i < 0 ? "START" : i >= g->n_nodes ? "END" : g->def->nodes[i]->name;
}

/* Edges: endpoints, conditions, and the order of each node's edges. */
static int check_edges(graph *g, char err[ERR_MAX])
{
    const Llms__GraphDef *d = g->def;
    if ((int)d->n_edges > (g->n_nodes + 1) * GRAPH_MAX_EDGES_PER_NODE)
        return err_set(err, "the graph has %zu edges, at most %d", d->n_edges,
                       (g->n_nodes + 1) * GRAPH_MAX_EDGES_PER_NODE);
    if (!(g->edges = calloc(d->n_edges ? d->n_edges : 1, sizeof *g->edges)))
        return err_set(err, "out of memory");
    for (size_t i = 0; i < d->n_edges; i++) {
        const Llms__GraphEdge *e = d->edges[i];
        edge *ed = &g->edges[g->n_edges++];
        ed->from = strcmp(e->from, "START") == 0 ? -1 : node_index(g, e->from, strlen(e->from));
        ed->to = strcmp(e->to, "END") == 0 ? g->n_nodes : node_index(g, e->to, strlen(e->to));
        if (strcmp(e->from, "END") == 0)
            return err_set(err, "edge %zu: no edge leaves END", i);
        if (strcmp(e->to, "START") == 0)
            return err_set(err, "node '%.64s': edge %zu enters START", e->from, i);
        if (ed->from < -1 || (ed->from == -1 && strcmp(e->from, "START") != 0))
            return err_set(err, "edge %zu: unknown node '%.64s'", i, e->from);
        if (ed->to < 0)
            return err_set(err, "node '%.64s': edge %zu to unknown node '%.64s'", e->from, i,
                           e->to);
        if (e->when) {
            char why[ERR_MAX];
            if (strlen(e->when) > GRAPH_TEXT_MAX)
                return err_set(err, "node '%s': the condition of its edge to '%s' is over %d "
                               "bytes", e->from, e->to, GRAPH_TEXT_MAX);
            if (!(ed->when = cond_compile(g, e->when, why)))
                return err_set(err, "node '%s': edge to '%s': %s", e->from, e->to, why);
        }
    }
    for (int from = -1; from < g->n_nodes; from++) {
        bool any = false, open = true;
        for (int i = 0; i < g->n_edges; i++) {
            if (g->edges[i].from != from)
                continue;
            if (!open)
                return err_set(err, "node '%s': its edge to '%s' comes after an unconditional "
                               "edge and is never taken", end_name(g, from),
                               end_name(g, g->edges[i].to));
            any = true;
            open = g->edges[i].when != NULL;
        }
        if (!any)
            return err_set(err, "node '%s' has no outgoing edge", end_name(g, from));
        if (open)
            return err_set(err, "node '%s': all its edges have conditions, so a run could "
                           "stop there; make the last one unconditional", end_name(g, from));
    }
    return 0;
}

/* Marks in seen (n_nodes + 2: START at 0, node i at i + 1, END at n_nodes + 1) what is
 * reachable from START (forward) or what reaches END (backward). */
static void reach(const graph *g, bool forward, bool *seen)
{
    int n = g->n_nodes + 2;
    seen[forward ? 0 : n - 1] = true;
    for (bool grew = true; grew;) {
        grew = false;
        for (int i = 0; i < g->n_edges; i++) {
            int a = g->edges[i].from + 1, b = g->edges[i].to + 1;
            int src = forward ? a : b, dst = forward ? b : a;
            if (seen[src] && !seen[dst])
                grew = seen[dst] = true;
        }
    }
}

/* A node on a cycle, or -1 (depth-first search; state 1: on the path, 2: done). */
static int find_cycle(const graph *g, int v, uint8_t *state)
{
    state[v] = 1;
    for (int i = 0; i < g->n_edges; i++) {
        if (g->edges[i].from != v || g->edges[i].to >= g->n_nodes)
            continue;
        int w = g->edges[i].to;
        if (state[w] == 1)
            return w;
        if (state[w] == 0) {
            int c = find_cycle(g, w, state);
            if (c >= 0)
                return c;
        }
    }
    state[v] = 2;
    return -1;
}

static int check_shape(graph *g, const graph_limits *lim, char err[ERR_MAX])
{
    int n = g->n_nodes;
    bool *fwd = calloc((size_t)n + 2, sizeof *fwd), *bwd = calloc((size_t)n + 2, sizeof *bwd);
    uint8_t *state = calloc((size_t)n, 1);
    int rc = -1;
    if (!fwd || !bwd || !state) {
        err_set(err, "out of memory");
        goto out;
    }
    reach(g, true, fwd);
    reach(g, false, bwd);
    if (!fwd[n + 1]) {
        err_set(err, "END cannot be reached from START");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        if (!fwd[i + 1]) {
            err_set(err, "node '%s' cannot be reached from START", end_name(g, i));
            goto out;
        }
        if (!bwd[i + 1]) {
            err_set(err, "node '%s': END cannot be reached from it", end_name(g, i));
            goto out;
        }
    }
    int cyc = -1;
    for (int i = 0; i < n && cyc < 0; i++)
        if (state[i] == 0)
            cyc = find_cycle(g, i, state);
    uint32_t cap = g->def->has_max_steps ? g->def->max_steps : 0;
    if (cyc >= 0 && cap == 0) {
        err_set(err, "node '%s' is on a cycle and the graph has no max_steps", end_name(g, cyc));
        goto out;
    }
    if (g->def->has_max_steps && (cap < 1 || cap > (uint32_t)lim->max_steps)) {
        err_set(err, "max_steps %u: must be 1..%d (graph_max_steps)", cap, lim->max_steps);
        goto out;
    }
    g->max_steps = cap ? (int)cap : n;
    rc = 0;
out:
    free(fwd);
    free(bwd);
    free(state);
    return rc;
}

graph *graph_compile(const Llms__GraphDef *def, const graph_limits *lim, char err[ERR_MAX])
{
    graph *g = calloc(1, sizeof *g);
    if (!g || !(g->def = def_copy(def))) {
        err_set(err, "out of memory");
        graph_free(g);
        return NULL;
    }
    if (check_nodes(g, lim, err) || check_edges(g, err) || check_shape(g, lim, err)) {
        graph_free(g);
        return NULL;
    }
    return g;
}

/* ---- built-in templates ---- */

#define ANSWER_PROMPT "Passages:\n{passages}\n\nQuestion: {question}\nAnswer:"

typedef struct builtin_node {
    const char *name, *output, *prompt, *query; /* query set: a retrieval node */
} builtin_node;

typedef struct builtin_edge {
    const char *from, *to, *when;
} builtin_edge;

typedef struct builtin {
    const char *name;
    builtin_node nodes[4];
    builtin_edge edges[6];
    uint32_t max_steps;          /* 0: acyclic */
} builtin;

static const builtin builtins[GRAPH_N_BUILTINS] = {
    {"one-shot",
     {{"retrieve", "passages", NULL, "{question}"}, {"answer", "answer", ANSWER_PROMPT, NULL}},
     {{"START", "retrieve", NULL}, {"retrieve", "answer", NULL}, {"answer", "END", NULL}},
     0},
    {"hyde",
     {{"hypothesize", "hypothesis",
       "Write a short passage that answers the question.\nQuestion: {question}\nPassage:", NULL},
      {"retrieve", "passages", NULL, "{hypothesis}"},
      {"answer", "answer", ANSWER_PROMPT, NULL}},
     {{"START", "hypothesize", NULL}, {"hypothesize", "retrieve", NULL},
      {"retrieve", "answer", NULL}, {"answer", "END", NULL}},
     0},
    {"multistep",
     {{"retrieve", "passages", NULL, "{question} {thought}"},
      {"reason", "thought",
       "Passages:\n{passages}\n\nQuestion: {question}\nWhat is still unknown? Write it, or "
       "DONE when the passages answer the question.\nUnknown:", NULL},
      {"answer", "answer", ANSWER_PROMPT, NULL}},
     {{"START", "retrieve", NULL}, {"retrieve", "reason", NULL},
      {"reason", "answer", "thought contains 'DONE' or runs(reason) >= 3"},
      {"reason", "retrieve", NULL}, {"answer", "END", NULL}},
     7},
    {"irg",
     {{"retrieve", "passages", NULL, "{question} {answer}"},
      {"generate", "answer", ANSWER_PROMPT, NULL}},
     {{"START", "retrieve", NULL}, {"retrieve", "generate", NULL},
      {"generate", "END", "runs(generate) >= 3"}, {"generate", "retrieve", NULL}},
     6},
    {"recomp",
     {{"retrieve", "passages", NULL, "{question}"},
      {"compress", "summary",
       "Passages:\n{passages}\n\nSummarize what the passages say about: {question}\nSummary:",
       NULL},
      {"answer", "answer", "Summary: {summary}\n\nQuestion: {question}\nAnswer:", NULL}},
     {{"START", "retrieve", NULL}, {"retrieve", "compress", NULL}, {"compress", "answer", NULL},
      {"answer", "END", NULL}},
     0},
};

const char *graph_builtin_name(int i)
{
    return i >= 0 && i < GRAPH_N_BUILTINS ? builtins[i].name : NULL;
}

graph *graph_builtin(const char *name, const graph_limits *lim, char err[ERR_MAX])
{
    const builtin *b = NULL;
    for (int i = 0; i < GRAPH_N_BUILTINS && !b; i++)
        if (strcmp(builtins[i].name, name) == 0)
            b = &builtins[i];
    if (!b) {
        err_set(err, "no built-in graph '%s'", name);
        return NULL;
    }
    static char *const inputs[] = {"question", "kb"};
    Llms__GraphNode nodes[4], *np[4];
    Llms__GraphEdge edges[6], *ep[6];
    Llms__GraphDef d = LLMS__GRAPH_DEF__INIT;
    d.n_inputs = 2;
    d.inputs = (char **)inputs;
    d.output = "answer";
    d.has_max_steps = b->max_steps > 0;
    d.max_steps = b->max_steps;
    d.nodes = np;
    d.edges = ep;
    for (int i = 0; i < 4 && b->nodes[i].name; i++) {
        const builtin_node *bn = &b->nodes[i];
        llms__graph_node__init(&nodes[i]);
        nodes[i].name = (char *)bn->name;
        nodes[i].output = (char *)bn->output;
        if (bn->query) {
            nodes[i].kind = LLMS__GRAPH_NODE_KIND__GRAPH_RETRIEVE;
            nodes[i].kb = "{kb}";
            nodes[i].query = (char *)bn->query;
        } else {
            nodes[i].kind = LLMS__GRAPH_NODE_KIND__GRAPH_GENERATE;
            nodes[i].prompt = (char *)bn->prompt;
        }
        np[d.n_nodes++] = &nodes[i];
    }
    for (int i = 0; i < 6 && b->edges[i].from; i++) {
        llms__graph_edge__init(&edges[i]);
        edges[i].from = (char *)b->edges[i].from;
        edges[i].to = (char *)b->edges[i].to;
        edges[i].when = (char *)b->edges[i].when;
        ep[d.n_edges++] = &edges[i];
    }
    return graph_compile(&d, lim, err);
}

/* ---- runs ---- */

void graph_run_free(graph_run *r)
{
    if (!r)
        return;
    if (r->vals)
        for (int i = 0; i < r->g->n_vars; i++)
            free(r->vals[i]);
    free(r->vals);
    free(r->counts);
    free(r->trial_old);
    free(r);
}

/* The first edge from node from (-1: START) whose condition holds: the next node. */
static int next_node(const graph_run *r, int from)
{
    const graph *g = r->g;
    for (int i = 0; i < g->n_edges; i++) {
        const edge *e = &g->edges[i];
        if (e->from != from)
            continue;
        if (!e->when)
            return e->to;
        val v = cond_eval(r, e->when, e->when->root);
        if (val_truth(&v))
            return e->to;
    }
    return g->n_nodes; /* not reached: the last edge of every node is unconditional */
}

graph_run *graph_run_new(const graph *g, Llms__GraphVar *const *inputs, size_t n, int max_steps,
                         char err[ERR_MAX])
{
    graph_run *r = calloc(1, sizeof *r);
    if (!r || !(r->vals = calloc((size_t)g->n_vars, sizeof *r->vals)) ||
        !(r->counts = calloc((size_t)g->n_nodes, sizeof *r->counts))) {
        free(r);
        err_set(err, "out of memory");
        return NULL;
    }
    r->g = g;
    r->trial_node = -1;
    for (size_t i = 0; i < n; i++) {
        const char *name = inputs[i]->name;
        int v = var_index(g, name, strlen(name));
        if (v < 0 || v >= (int)g->def->n_inputs) {
            err_set(err, "input '%.64s': the graph has no such input", name);
            goto fail;
        }
        if (r->vals[v]) {
            err_set(err, "input '%s' is given twice", name);
            goto fail;
        }
        if (!(r->vals[v] = strdup(inputs[i]->value))) {
            err_set(err, "out of memory");
            goto fail;
        }
    }
    for (int v = 0; v < g->n_vars; v++) {
        if (!r->vals[v] && v < (int)g->def->n_inputs) {
            err_set(err, "input '%s' is missing", g->vars[v]);
            goto fail;
        }
        if (!r->vals[v] && !(r->vals[v] = strdup(""))) {
            err_set(err, "out of memory");
            goto fail;
        }
    }
    r->cap = g->max_steps < max_steps ? g->max_steps : max_steps;
    r->ready = next_node(r, -1);
    if (r->ready >= g->n_nodes)
        r->ready = -1;
    return r;
fail:
    graph_run_free(r);
    return NULL;
}

int graph_run_ready(const graph_run *r)
{
    return r->ready;
}

char *graph_run_render(const graph_run *r, enum graph_field f, size_t max, size_t *len)
{
    const Llms__GraphNode *n = r->ready >= 0 ? r->g->def->nodes[r->ready] : NULL;
    const char *t = !n                        ? NULL
                    : f == GRAPH_FIELD_PROMPT ? n->prompt
                    : f == GRAPH_FIELD_KB     ? n->kb
                                              : n->query;
    if (!t)
        t = ""; /* a field the node's kind lacks, or no ready node: the empty text */
    char err[ERR_MAX];
    /* measured first: a template may name a long variable many times */
    long need = tmpl_walk(r->g, t, r->vals, NULL, err);
    *len = need > 0 ? (size_t)need : 0;
    if (*len > max)
        return NULL;
    char *out = malloc(*len + 1);
    if (out) {
        tmpl_walk(r->g, t, r->vals, out, err);
        out[*len] = '\0';
    }
    return out;
}

/* Sets the ready node's output to v (taking it) and moves on; the old value goes to
 * *old (freed when old is NULL). */
static void feed(graph_run *r, char *v, char **old)
{
    const graph *g = r->g;
    int node = r->ready;
    if (old)
        *old = r->vals[g->node_var[node]];
    else
        free(r->vals[g->node_var[node]]);
    r->vals[g->node_var[node]] = v;
    r->counts[node]++;
    r->steps++;
    int next = next_node(r, node);
    if (next >= g->n_nodes) {
        r->ready = -1;
    } else if (r->steps >= r->cap) {
        r->ready = -1;
        r->capped = true;
    } else {
        r->ready = next;
    }
}

int graph_run_feed(graph_run *r, const char *out, size_t n)
{
    char *v = strndup(out, n);
    if (!v)
        return -1;
    feed(r, v, NULL);
    return 0;
}

int graph_run_feed_trial(graph_run *r, const char *out, size_t n)
{
    char *v = strndup(out, n);
    if (!v)
        return -1;
    r->trial_node = r->ready;
    feed(r, v, &r->trial_old);
    return 0;
}

void graph_run_undo(graph_run *r)
{
    int node = r->trial_node;
    int var = r->g->node_var[node];
    free(r->vals[var]);
    r->vals[var] = r->trial_old;
    r->trial_old = NULL;
    r->trial_node = -1;
    r->counts[node]--;
    r->steps--;
    r->capped = false;
    r->ready = node;
}

int graph_run_steps(const graph_run *r)
{
    return r->steps;
}

bool graph_run_capped(const graph_run *r)
{
    return r->capped;
}

int graph_run_count(const graph_run *r, int node)
{
    return r->counts[node];
}

const char *graph_run_var(const graph_run *r, const char *name)
{
    int v = var_index(r->g, name, strlen(name));
    return v < 0 ? NULL : r->vals[v];
}

int graph_run_n_vars(const graph_run *r)
{
    return r->g->n_vars;
}

const char *graph_run_var_name(const graph_run *r, int i)
{
    return r->g->vars[i];
}

const char *graph_run_var_value(const graph_run *r, int i)
{
    return r->vals[i];
}
