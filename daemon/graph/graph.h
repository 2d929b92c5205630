/*
 * graph.h — RAG workflow graphs (HedraRAG): definition checks, the condition language,
 * prompt templates, the built-in templates and the state machine of one run.
 *
 * A graph (proto GraphDef) has generation and retrieval nodes, each setting one state
 * variable, and ordered edges from a node (or START) to a node (or END). After a node
 * runs, its edges are tried in order and the first whose condition holds is taken, so a
 * run has exactly one ready node at a time; the scheduler advances the ready node of
 * every running graph together (the wavefront across requests).
 *
 * Templates put variables in text: "{question}"; "{{" and "}}" are literal braces.
 *
 * Conditions ("when" of an edge) are expressions on the state, evaluated without
 * allocation and without any way to run code:
 *   expr    := or;  or := and ("or" and)*;  and := unary ("and" unary)*
 *   unary   := "not" unary | cmp
 *   cmp     := operand [("==" | "!=" | "<" | "<=" | ">" | ">=" | "contains") operand]
 *   operand := variable | 'string' | "string" | number | true | false
 *            | runs(node) | len(variable) | steps | "(" expr ")"
 * A variable is a graph input or a node's output (empty until set); runs(node) is how
 * many times node ran in this run, steps how many node runs there were in all. Two
 * operands that both read as numbers (not "nan") compare as numbers, otherwise as byte
 * strings; a contains b is whether b occurs in a. A bare operand holds when it is
 * neither empty nor "0" nor "false".
 *
 * A definition is refused, with a message naming the node (or edge), when: a name is
 * malformed, repeated or reserved; a node lacks what its kind needs; a template or a
 * condition names an unknown variable or node, or does not parse; an edge leaves END or
 * enters START, or names an unknown node; a node (or START) has no edge, or an edge after
 * an unconditional one (never taken), or only conditional ones (a run could stop there);
 * a node cannot be reached from START, or END cannot be reached from it; the graph has a
 * cycle and no max_steps; or a limit is passed.
 *
 * A run stops at END or when its step cap (max_steps, else the number of nodes: an
 * acyclic graph never runs more) is reached; the answer is the output variable's value.
 */
#ifndef LLMS_GRAPH_H
#define LLMS_GRAPH_H

#include <stdbool.h>
#include <stddef.h>

#include "engine/err.h"
#include "proto/llms.pb-c.h"

#define GRAPH_NAME_MAX 64        /* bytes of a node, variable or graph name */
#define GRAPH_TEXT_MAX 4096      /* bytes of a template or a condition */
#define GRAPH_TOP_K_MAX 64       /* passages of a retrieval node */

typedef struct graph_limits {
    int max_nodes;               /* nodes of a graph */
    int max_steps;               /* node runs of a graph run */
} graph_limits;

typedef struct graph graph;

/* Checks def and builds a graph holding its own copy of it. NULL with err (naming the
 * node) when def is refused or memory runs out. */
graph *graph_compile(const Llms__GraphDef *def, const graph_limits *lim, char err[ERR_MAX]);

void graph_free(graph *g);

/* The definition as compiled (valid until graph_free). */
const Llms__GraphDef *graph_def(const graph *g);

/* The built-in templates, usable by name: "one-shot", "hyde", "multistep", "irg",
 * "recomp". Each takes the inputs "question" and "kb" (a knowledge base name). */
#define GRAPH_N_BUILTINS 5
const char *graph_builtin_name(int i);

/* Compiles built-in template name; NULL with err when there is none of that name. */
graph *graph_builtin(const char *name, const graph_limits *lim, char err[ERR_MAX]);

/* Whether name is a valid graph name (1..64 bytes of [A-Za-z0-9._-]). */
bool graph_name_ok(const char *name);

/* ---- a run ---- */

typedef struct graph_run graph_run;

/* Starts a run of g (which must outlive it) with n inputs: each of g's inputs exactly
 * once, no other. max_steps (> 0) caps the run beside the graph's own cap. NULL with err
 * when the inputs do not fit or memory runs out. */
graph_run *graph_run_new(const graph *g, Llms__GraphVar *const *inputs, size_t n,
                         int max_steps, char err[ERR_MAX]);

void graph_run_free(graph_run *r);

/* The ready node (an index into graph_def(g)->nodes), or -1 when the run is over. */
int graph_run_ready(const graph_run *r);

/* The ready node's template field rendered with the state: the prompt of a generation
 * node, the kb or the query of a retrieval node, *len bytes. Malloc'ed; NULL when it
 * would be longer than max bytes (*len says how long) or memory runs out (*len <= max).
 * A field the node's kind does not have (a generation's query), or any field once the run
 * is over, is the empty text. */
enum graph_field { GRAPH_FIELD_PROMPT, GRAPH_FIELD_KB, GRAPH_FIELD_QUERY };
char *graph_run_render(const graph_run *r, enum graph_field f, size_t max, size_t *len);

/* Gives the ready node's output (n bytes): sets its variable, counts the run, takes the
 * first edge whose condition holds. -1 when out of memory. */
int graph_run_feed(graph_run *r, const char *out, size_t n);

/* Speculation: feeds out (n bytes) as graph_run_feed does, so that the node then ready
 * and its fields can be looked at (graph_run_ready, graph_run_render), then
 * graph_run_undo puts the run back exactly as it was. Nothing else may change the run
 * in between. -1 when out of memory (the run unchanged, no undo due). */
int graph_run_feed_trial(graph_run *r, const char *out, size_t n);
void graph_run_undo(graph_run *r);

/* Node runs so far. */
int graph_run_steps(const graph_run *r);

/* Whether the run ended at its step cap instead of END. */
bool graph_run_capped(const graph_run *r);

/* How many times node i ran. */
int graph_run_count(const graph_run *r, int node);

/* A variable's value ("" when unset; NULL when the graph has no such variable). */
const char *graph_run_var(const graph_run *r, const char *name);

/* The variables: n_vars of them, name and value of each (valid until the next feed). */
int graph_run_n_vars(const graph_run *r);
const char *graph_run_var_name(const graph_run *r, int i);
const char *graph_run_var_value(const graph_run *r, int i);

#endif
