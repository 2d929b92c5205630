/*
 * Workflow graphs end to end: a real llmsd of this build on the trained stories260K
 * model, through libllmsclient. Each built-in template runs (greedy: the same run twice
 * answers the same, and a generation node's output equals a plain Complete of its
 * rendered prompt, also when it starts from the KV of the run's previous generation node);
 * a conditional loop ends on its condition or at its step cap;
 * malformed graphs and runs are refused over the wire with the node named; another
 * app's graph is NOT_FOUND; graphs survive a restart; a cancelled run stops, and so does
 * the run of a client that disconnects.
 */
#include <signal.h>
#include <sqlite3.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/llms.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/integration/rawframe.h"
#include "tests/integration/story_kb.h"
#include "tests/support/test.h"

static char llmsd_path[1024];
static const char *stories;
static llmsd_proc daemon_, idle_daemon;
static int up;

#define CONF "temperature = 0\nmax_tokens = 8\nrag_top_k = 2\ngraph_max_per_app = 3\n" \
             "max_text_bytes = 4096\n" \
             "graph_max_steps = 20\nkb_passage_tokens = 24\nkb_overlap_tokens = 4\n"

#define NEED()                                                                     \
    do {                                                                           \
        if (!llmsd_path[0] || !stories)                                            \
            SKIP("llmsd or ../shared/testdata/models/stories260K.gguf is missing"); \
        if (!up)                                                                   \
            up = start() == 0 ? 1 : -1;                                            \
        CHECK_MSG(up == 1, "llmsd did not start");                                 \
    } while (0)

static int start(void)
{
    return proc_start(&daemon_, llmsd_path, "graph", stories, CONF);
}

typedef struct events {
    int started, finished;
    char last_node[64];
} events;

static int count_event(const llms_graph_event *ev, void *user)
{
    events *e = user;
    if (ev->finished)
        e->finished++;
    else
        e->started++;
    snprintf(e->last_node, sizeof e->last_node, "%s", ev->node);
    return 0;
}

static const char *state_of(const llms_graph_result *r, const char *name)
{
    for (size_t i = 0; i < r->n_state; i++)
        if (!strcmp(r->state_names[i], name))
            return r->state_values[i];
    return NULL;
}

static void builtin_templates(void)
{
    NEED();
    llms_conn *c = proc_connect(&daemon_, "tmpl");
    CHECK(c);
    CHECK_EQ(story_kb_make(c), 0);
    static const struct { const char *name; uint32_t steps; } want[] = {
        {"one-shot", 2}, {"hyde", 3}, {"multistep", 0}, {"irg", 6}, {"recomp", 3},
    };
    llms_graph_var in[2] = {{"question", "Where did Lily play with her dog?"}, {"kb", "stories"}};
    for (int t = 0; t < 5; t++) {
        llms_graph_result r1, r2;
        events ev = {0};
        enum llms_status s = llms_graph_run(c, want[t].name, in, 2, NULL, count_event, &ev, &r1);
        CHECK_MSG(s == LLMS_OK, "%s: %s", want[t].name, llms_last_error(c));
        CHECK_EQ(llms_graph_run(c, want[t].name, in, 2, NULL, NULL, NULL, &r2), LLMS_OK);
        CHECK_MSG(!strcmp(r1.output, r2.output), "%s: '%s' then '%s'", want[t].name, r1.output,
                  r2.output);
        CHECK_EQ(r1.steps, r2.steps);
        if (want[t].steps)
            CHECK_MSG(r1.steps == want[t].steps, "%s: %u steps", want[t].name, r1.steps);
        else /* multistep: retrieve, reason, and then answer, or around again (3 at most) */
            CHECK(r1.steps == 3 || r1.steps == 5 || r1.steps == 7);
        CHECK(!r1.capped);
        CHECK_EQ(ev.started, (int)r1.steps);
        CHECK_EQ(ev.finished, (int)r1.steps);
        CHECK(!strcmp(ev.last_node, strcmp(want[t].name, "irg") ? "answer" : "generate"));
        CHECK(r1.n_timings >= 2);
        const char *passages = state_of(&r1, "passages");
        CHECK(passages && *passages); /* the knowledge base answered */
        CHECK(*r1.output); /* greedy stories260K always says something here */
        llms_graph_result_free(&r1);
        llms_graph_result_free(&r2);
    }
    llms_close(c);
}

/* A generation node's output is what a raw Complete of its rendered prompt gives. */
static void generation_equals_complete(void)
{
    NEED();
    llms_conn *c = proc_connect(&daemon_, "equal");
    CHECK(c);
    CHECK_EQ(story_kb_make(c), 0);
    llms_graph_var in[2] = {{"question", "What did Tom see in the river?"}, {"kb", "stories"}};
    llms_graph_result r;
    CHECK_EQ(llms_graph_run(c, "one-shot", in, 2, NULL, NULL, NULL, &r), LLMS_OK);
    const char *passages = state_of(&r, "passages");
    CHECK(passages && strstr(passages, "Tom"));
    char prompt[2048];
    snprintf(prompt, sizeof prompt, "Passages:\n%s\n\nQuestion: %s\nAnswer:", passages,
             in[0].value);
    llms_result cr;
    CHECK_EQ(llms_complete(c, prompt, NULL, 0, NULL, NULL, NULL, &cr), LLMS_OK);
    CHECK_MSG(!strcmp(cr.text, r.output), "complete '%s', graph '%s'", cr.text, r.output);
    /* a run's answer is its output variable's text: logprobs have nowhere to go */
    llms_params lp = LLMS_PARAMS_INIT;
    lp.logprobs = 1;
    llms_graph_result refused;
    CHECK_EQ(llms_graph_run(c, "one-shot", in, 2, &lp, NULL, NULL, &refused),
             LLMS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(llms_last_error(c), "GraphRun"), "%s", llms_last_error(c));
    CHECK(cr.generated_tokens > 0);
    CHECK_EQ(r.timings[1].generated_tokens, cr.generated_tokens);
    llms_result_free(&cr);
    llms_graph_result_free(&r);
    llms_close(c);
}

/* A GraphRun's params may ask for a reply schema: its generation node answers with an
 * instance (an array of 1..3 integers in 1..9, which closes within the budget whatever
 * the model prefers). */
static void graph_run_follows_a_schema(void)
{
    NEED();
    llms_conn *c = proc_connect(&daemon_, "schema");
    CHECK(c);
    CHECK_EQ(story_kb_make(c), 0);
    llms_graph_var in[2] = {{"question", "How many fish did Tom see?"}, {"kb", "stories"}};
    llms_params p = LLMS_PARAMS_INIT;
    p.max_tokens = 300; /* 8 runs of at most 20 white space tokens, and 7 of structure */
    p.format = LLMS_FORMAT_JSON_SCHEMA;
    p.json_schema = "{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"minimum\":1,"
                    "\"maximum\":9},\"minItems\":1,\"maxItems\":3}";
    /* the node's stop strings (a blank line) would end a reply still in the white space
     * JSON may begin with: the run's list replaces them */
    const char *const stop[] = {"@@@"};
    p.stop = stop;
    p.n_stop = 1;
    llms_graph_result r;
    CHECK_EQ(llms_graph_run(c, "one-shot", in, 2, &p, NULL, NULL, &r), LLMS_OK);
    json_object *o = json_tokener_parse(r.output);
    size_t n = json_object_is_type(o, json_type_array) ? json_object_array_length(o) : 0;
    bool ok = n >= 1 && n <= 3;
    for (size_t i = 0; ok && i < n; i++) {
        json_object *x = json_object_array_get_idx(o, i);
        ok = json_object_is_type(x, json_type_int) && json_object_get_int(x) >= 1 &&
             json_object_get_int(x) <= 9;
    }
    CHECK_MSG(ok, "'%s' is not an instance", r.output);
    json_object_put(o);
    llms_graph_result_free(&r);
    llms_close(c);
}

/* A generation node that starts from the KV of the run's previous one (multistep's
 * answer after its last reasoning step: the same passages and question begin both
 * prompts) answers what a plain Complete of its prompt does, and what a daemon with
 * graph_reuse_kv = 0, which evaluates every prompt whole, answers. */
static void kv_reuse_between_nodes(void)
{
    NEED();
    llmsd_proc plain;
    CHECK_EQ(proc_start(&plain, llmsd_path, "graph-plain", stories, CONF "graph_reuse_kv = 0\n"),
             0);
    llms_conn *c = proc_connect(&daemon_, "reuse"), *p = proc_connect(&plain, "reuse");
    CHECK(c && p);
    CHECK_EQ(story_kb_make(c), 0);
    CHECK_EQ(story_kb_make(p), 0);
    static const char *const questions[] = {"Where did Lily play with her dog?",
                                            "What did Tom see in the river?"};
    for (int q = 0; q < 2; q++) {
        llms_graph_var in[2] = {{"question", questions[q]}, {"kb", "stories"}};
        llms_graph_result r, rp;
        CHECK_EQ(llms_graph_run(c, "multistep", in, 2, NULL, NULL, NULL, &r), LLMS_OK);
        CHECK_EQ(llms_graph_run(p, "multistep", in, 2, NULL, NULL, NULL, &rp), LLMS_OK);
        CHECK_MSG(!strcmp(r.output, rp.output), "reused '%s', whole '%s'", r.output, rp.output);
        CHECK_EQ(r.steps, rp.steps);
        CHECK_EQ(r.prompt_tokens, rp.prompt_tokens);
        CHECK_EQ(rp.reused_tokens, 0u);
        /* the answer reuses at least the passages of the last reasoning step */
        const char *passages = state_of(&r, "passages");
        CHECK(passages && *passages);
        CHECK_MSG(r.reused_tokens > strlen(passages) / 8 && r.reused_tokens < r.prompt_tokens,
                  "%u of %u prompt tokens reused", r.reused_tokens, r.prompt_tokens);
        char prompt[4096];
        snprintf(prompt, sizeof prompt, "Passages:\n%s\n\nQuestion: %s\nAnswer:", passages,
                 questions[q]);
        llms_result cr;
        CHECK_EQ(llms_complete(c, prompt, NULL, 0, NULL, NULL, NULL, &cr), LLMS_OK);
        CHECK_MSG(!strcmp(cr.text, r.output), "complete '%s', graph '%s'", cr.text, r.output);
        llms_result_free(&cr);
        llms_graph_result_free(&r);
        llms_graph_result_free(&rp);
    }
    llms_close(c);
    llms_close(p);
    if (proc_stop(&plain, SIGTERM) != 0)
        proc_print_log(&plain);
}

static const llms_graph_node loop_nodes[] = {
    {.name = "tell", .kind = LLMS_GRAPH_GENERATE, .output = "story",
     .prompt = "Once upon a time{story}"},
};

static void conditional_loop_and_cap(void)
{
    NEED();
    llms_conn *c = proc_connect(&daemon_, "loop");
    CHECK(c);
    const char *inputs[] = {"unused"};
    llms_graph_edge edges[] = {{"START", "tell", NULL},
                               {"tell", "END", "runs(tell) >= 3 or len(story) > 10000"},
                               {"tell", "tell", NULL}};
    llms_graph_def d = {inputs, 1, loop_nodes, 1, edges, 3, "story", 10};
    CHECK_EQ(llms_graph_create(c, "loop3", &d), LLMS_OK);
    llms_graph_var in = {"unused", ""};
    llms_graph_result r;
    CHECK_EQ(llms_graph_run(c, "loop3", &in, 1, NULL, NULL, NULL, &r), LLMS_OK);
    CHECK_EQ(r.steps, 3);
    CHECK(!r.capped);
    CHECK_EQ(r.n_timings, 1);
    CHECK_EQ(r.timings[0].runs, 3);
    llms_graph_result_free(&r);
    /* a condition that never holds: the graph's max_steps stops it */
    edges[1].when = "runs(tell) > 1000";
    d.max_steps = 4;
    CHECK_EQ(llms_graph_create(c, "capped", &d), LLMS_OK);
    CHECK_EQ(llms_graph_run(c, "capped", &in, 1, NULL, NULL, NULL, &r), LLMS_OK);
    CHECK_EQ(r.steps, 4);
    CHECK(r.capped);
    llms_graph_result_free(&r);
    CHECK_EQ(llms_graph_delete(c, "loop3"), LLMS_OK);
    CHECK_EQ(llms_graph_delete(c, "capped"), LLMS_OK);
    llms_close(c);
}

static void refusals_over_the_wire(void)
{
    NEED();
    llms_conn *c = proc_connect(&daemon_, "refuse");
    CHECK(c);
    const char *inputs[] = {"q"};
    llms_graph_node n = {.name = "ask", .kind = LLMS_GRAPH_GENERATE, .output = "a",
                         .prompt = "{q} {nope}"};
    llms_graph_edge e[] = {{"START", "ask", NULL}, {"ask", "END", NULL}};
    llms_graph_def d = {inputs, 1, &n, 1, e, 2, "a", 0};
    CHECK_EQ(llms_graph_create(c, "bad", &d), LLMS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(llms_last_error(c), "node 'ask'") &&
              strstr(llms_last_error(c), "unknown variable 'nope'"), "%s", llms_last_error(c));
    n.prompt = "{q}";
    e[1].to = "ask"; /* a cycle with no way out and no cap */
    CHECK_EQ(llms_graph_create(c, "bad", &d), LLMS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(llms_last_error(c), "END cannot be reached"), "%s", llms_last_error(c));
    e[1].to = "END";
    e[1].when = "q = 'x'";
    CHECK_EQ(llms_graph_create(c, "bad", &d), LLMS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(llms_last_error(c), "node 'ask': edge to 'END': condition"), "%s",
              llms_last_error(c));
    e[1].when = NULL;
    CHECK_EQ(llms_graph_create(c, "bad name", &d), LLMS_ERR_INVALID_ARGUMENT);
    CHECK_EQ(llms_graph_create(c, "hyde", &d), LLMS_ERR_FAILED_PRECONDITION);
    CHECK_EQ(llms_graph_create(c, "g1", &d), LLMS_OK);
    CHECK_EQ(llms_graph_create(c, "g1", &d), LLMS_ERR_FAILED_PRECONDITION);
    CHECK_EQ(llms_graph_create(c, "g2", &d), LLMS_OK);
    CHECK_EQ(llms_graph_create(c, "g3", &d), LLMS_OK);
    CHECK_EQ(llms_graph_create(c, "g4", &d), LLMS_ERR_RESOURCE_EXHAUSTED);
    llms_graph_var in[2] = {{"q", "x"}, {"zz", "y"}};
    CHECK_EQ(llms_graph_run(c, "g1", in, 0, NULL, NULL, NULL, NULL), LLMS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(llms_last_error(c), "input 'q' is missing"), "%s", llms_last_error(c));
    CHECK_EQ(llms_graph_run(c, "g1", in, 2, NULL, NULL, NULL, NULL), LLMS_ERR_INVALID_ARGUMENT);
    CHECK_EQ(llms_graph_run(c, "nope", in, 1, NULL, NULL, NULL, NULL), LLMS_ERR_NOT_FOUND);
    /* a retrieval from a knowledge base the app does not have fails naming the node */
    llms_graph_var kin[2] = {{"question", "q"}, {"kb", "missing"}};
    CHECK_EQ(llms_graph_run(c, "one-shot", kin, 2, NULL, NULL, NULL, NULL), LLMS_ERR_NOT_FOUND);
    CHECK_MSG(strstr(llms_last_error(c), "node 'retrieve'"), "%s", llms_last_error(c));
    /* inputs and rendered texts are held to max_text_bytes */
    static char big[5000];
    memset(big, 'a', sizeof big - 1);
    in[0].value = big;
    CHECK_EQ(llms_graph_run(c, "g1", in, 1, NULL, NULL, NULL, NULL), LLMS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(llms_last_error(c), "input 'q'"), "%s", llms_last_error(c));
    n.prompt = "{q}{q}{q}";
    CHECK_EQ(llms_graph_create(c, "thrice", &d), LLMS_ERR_RESOURCE_EXHAUSTED); /* 4th graph */
    CHECK_EQ(llms_graph_delete(c, "g3"), LLMS_OK);
    CHECK_EQ(llms_graph_create(c, "g3", &d), LLMS_OK);
    big[2000] = '\0';
    CHECK_EQ(llms_graph_run(c, "g3", in, 1, NULL, NULL, NULL, NULL), LLMS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(llms_last_error(c), "node 'ask': its prompt would be 6000 bytes"), "%s",
              llms_last_error(c));
    CHECK_EQ(llms_graph_delete(c, "one-shot"), LLMS_ERR_FAILED_PRECONDITION);
    for (int i = 1; i <= 3; i++) {
        char name[16];
        snprintf(name, sizeof name, "g%d", i);
        CHECK_EQ(llms_graph_delete(c, name), LLMS_OK);
    }
    CHECK_EQ(llms_graph_delete(c, "g1"), LLMS_ERR_NOT_FOUND);
    /* the daemon still answers */
    CHECK_EQ(llms_graph_run(c, "capped", in, 1, NULL, NULL, NULL, NULL), LLMS_ERR_NOT_FOUND);
    llms_close(c);
}

static int has_graph(llms_conn *c, const char *name, int *builtins)
{
    llms_graph_info *g;
    size_t n;
    int found = 0;
    *builtins = 0;
    if (llms_graph_list(c, &g, &n) != LLMS_OK)
        return -1;
    for (size_t i = 0; i < n; i++) {
        found |= !strcmp(g[i].name, name);
        *builtins += g[i].builtin;
    }
    llms_graph_list_free(g, n);
    return found;
}

static void isolation_and_restart(void)
{
    NEED();
    llms_conn *a = proc_connect(&daemon_, "iso-a"), *b = proc_connect(&daemon_, "iso-b");
    CHECK(a && b);
    const char *inputs[] = {"unused"};
    llms_graph_edge edges[] = {{"START", "tell", NULL}, {"tell", "END", NULL}};
    llms_graph_def d = {inputs, 1, loop_nodes, 1, edges, 2, "story", 0};
    CHECK_EQ(llms_graph_create(a, "mine", &d), LLMS_OK);
    int builtins;
    CHECK_EQ(has_graph(a, "mine", &builtins), 1);
    CHECK_EQ(builtins, 5);
    CHECK_EQ(has_graph(b, "mine", &builtins), 0);
    llms_graph_var in = {"unused", ""};
    CHECK_EQ(llms_graph_run(b, "mine", &in, 1, NULL, NULL, NULL, NULL), LLMS_ERR_NOT_FOUND);
    CHECK_EQ(llms_graph_delete(b, "mine"), LLMS_ERR_NOT_FOUND);
    llms_graph_result before, after;
    CHECK_EQ(llms_graph_run(a, "mine", &in, 1, NULL, NULL, NULL, &before), LLMS_OK);
    llms_close(a);
    llms_close(b);
    CHECK_EQ(proc_stop(&daemon_, SIGTERM), 0);
    up = start() == 0 ? 1 : -1;
    CHECK(up == 1);
    a = proc_connect(&daemon_, "iso-a");
    CHECK(a);
    CHECK_EQ(has_graph(a, "mine", &builtins), 1);
    CHECK_EQ(llms_graph_run(a, "mine", &in, 1, NULL, NULL, NULL, &after), LLMS_OK);
    CHECK(!strcmp(before.output, after.output));
    llms_graph_result_free(&before);
    llms_graph_result_free(&after);
    CHECK_EQ(llms_graph_delete(a, "mine"), LLMS_OK);
    llms_close(a);
}

/* A stored definition that no longer decodes (a damaged state directory) is left out of
 * the listing, which lists the app's other graphs (it answered INTERNAL "listing graphs:
 * out of memory"); running it says what is wrong, and deleting it works. */
static void undecodable_definition_left_out(void)
{
    NEED();
    llms_conn *a = proc_connect(&daemon_, "damaged");
    CHECK(a);
    const char *inputs[] = {"unused"};
    llms_graph_edge edges[] = {{"START", "tell", NULL}, {"tell", "END", NULL}};
    llms_graph_def d = {inputs, 1, loop_nodes, 1, edges, 2, "story", 0};
    CHECK_EQ(llms_graph_create(a, "good", &d), LLMS_OK);
    CHECK_EQ(llms_graph_create(a, "bad", &d), LLMS_OK);
    char path[700];
    snprintf(path, sizeof path, "%s/state/llmsd.db", daemon_.dir);
    sqlite3 *db;
    CHECK_EQ(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
    CHECK_EQ(sqlite3_busy_timeout(db, 5000), SQLITE_OK);
    CHECK_EQ(sqlite3_exec(db, "UPDATE graphs SET def = x'ffffffff' WHERE name = 'bad'", NULL,
                          NULL, NULL), SQLITE_OK);
    CHECK_EQ(sqlite3_changes(db), 1);
    sqlite3_close(db);
    int builtins;
    CHECK_MSG(has_graph(a, "good", &builtins) == 1, "%s", llms_last_error(a));
    CHECK_EQ(has_graph(a, "bad", &builtins), 0);
    llms_graph_var in = {"unused", ""};
    CHECK(llms_graph_run(a, "bad", &in, 1, NULL, NULL, NULL, NULL) != LLMS_OK);
    CHECK_MSG(strstr(llms_last_error(a), "does not decode"), "%s", llms_last_error(a));
    CHECK_EQ(llms_graph_delete(a, "bad"), LLMS_OK);
    CHECK_EQ(llms_graph_delete(a, "good"), LLMS_OK);
    llms_close(a);
}

static int cancel_at_first_event(const llms_graph_event *ev, void *user)
{
    (void)ev;
    (*(int *)user)++;
    return 1;
}

static void cancel_stops_run(void)
{
    NEED();
    llms_conn *c = proc_connect(&daemon_, "cancel");
    CHECK(c);
    const char *inputs[] = {"unused"};
    llms_graph_edge edges[] = {{"START", "tell", NULL}, {"tell", "tell", NULL}};
    edges[1].when = "runs(tell) < 1000";
    llms_graph_edge all[] = {edges[0], edges[1], {"tell", "END", NULL}};
    llms_graph_def d = {inputs, 1, loop_nodes, 1, all, 3, "story", 20};
    CHECK_EQ(llms_graph_create(c, "long", &d), LLMS_OK);
    llms_params p;
    llms_params_init(&p);
    p.max_tokens = 200;
    int seen = 0;
    llms_graph_var in = {"unused", ""};
    CHECK_EQ(llms_graph_run(c, "long", &in, 1, &p, cancel_at_first_event, &seen, NULL),
             LLMS_ERR_CANCELLED);
    CHECK_EQ(seen, 1);
    /* the connection and the daemon go on */
    llms_graph_result r;
    p.max_tokens = 2;
    CHECK_EQ(llms_graph_run(c, "long", &in, 1, &p, NULL, NULL, &r), LLMS_OK);
    CHECK(r.capped);
    CHECK_EQ(r.steps, 20);
    llms_graph_result_free(&r);
    CHECK_EQ(llms_graph_delete(c, "long"), LLMS_OK);
    llms_close(c);
}

/* A run whose client goes away stops within a fraction of the same run's whole time. */
static void disconnect_stops_run(void)
{
    NEED();
    llms_conn *c = proc_connect(&daemon_, "leaver");
    CHECK(c);
    const char *inputs[] = {"unused"};
    llms_graph_edge edges[] = {{"START", "tell", NULL}, {"tell", "tell", "runs(tell) < 1000"},
                               {"tell", "END", NULL}};
    llms_graph_def d = {inputs, 1, loop_nodes, 1, edges, 3, "story", 20};
    CHECK_EQ(llms_graph_create(c, "long", &d), LLMS_OK);
    llms_params p;
    llms_params_init(&p);
    p.max_tokens = 400;
    llms_graph_var in = {"unused", ""};
    llms_graph_result r;
    double t0 = proc_now();
    CHECK_EQ(llms_graph_run(c, "long", &in, 1, &p, NULL, NULL, &r), LLMS_OK);
    double whole = proc_now() - t0;
    CHECK_EQ(r.steps, 20);
    llms_graph_result_free(&r);

    int fd = raw_connect(&daemon_);
    CHECK(fd >= 0);
    CHECK(raw_bind(fd, "leaver") == 0);
    Llms__GenerationParams gp = LLMS__GENERATION_PARAMS__INIT;
    gp.has_max_tokens = 1;
    gp.max_tokens = 400;
    Llms__GraphVar v = LLMS__GRAPH_VAR__INIT, *vp = &v;
    v.name = "unused";
    v.value = "";
    Llms__GraphRunRequest gr = LLMS__GRAPH_RUN_REQUEST__INIT;
    gr.graph = "long";
    gr.n_inputs = 1;
    gr.inputs = &vp;
    gr.params = &gp;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.id = 7;
    req.body_case = LLMS__REQUEST__BODY_GRAPH_RUN;
    req.graph_run = &gr;
    CHECK(raw_send(fd, &req) == 0);
    usleep((useconds_t)(whole * 1e6 / 10));
    close(fd);
    double t1 = proc_now(), stopped = -1;
    while (stopped < 0 && proc_now() - t1 < whole) {
        llms_daemon_status st;
        CHECK_EQ(llms_status_get(c, &st), LLMS_OK);
        if (st.running_requests == 0 && st.queued_requests == 0)
            stopped = proc_now() - t1;
        llms_daemon_status_free(&st);
        usleep(2000);
    }
    CHECK_MSG(stopped >= 0 && stopped < whole / 2,
              "the run went on %.3f s after its client left (a whole run: %.3f s)", stopped,
              whole);
    CHECK_EQ(llms_graph_delete(c, "long"), LLMS_OK);
    llms_close(c);
}

/* A run is a request in flight until its result, not until its first node event: a
 * connection waiting for a run whose generation node is silent for longer than
 * idle_timeout_ms is not closed as idle (each event ended a request in the count, so
 * the silence after the first one closed the connection and cancelled the run). */
static void run_is_in_flight_until_its_result(void)
{
    const char *lm = test_data_path("models/docs-lm-21M-Q8_0.gguf");
    if (!llmsd_path[0] || !lm)
        SKIP("llmsd or ../shared/testdata/models/docs-lm-21M-Q8_0.gguf is missing");
    /* 400 tokens of this model take several times the timeout */
    CHECK_MSG(proc_start(&idle_daemon, llmsd_path, "graph-idle", lm,
                         CONF "idle_timeout_ms = 100\n") == 0, "llmsd did not start");
    llms_conn *c = proc_connect(&idle_daemon, "quiet");
    CHECK(c);
    const char *inputs[] = {"unused"};
    llms_graph_edge edges[] = {{"START", "tell", NULL}, {"tell", "END", NULL}};
    llms_graph_def d = {inputs, 1, loop_nodes, 1, edges, 2, "story", 0};
    CHECK_EQ(llms_graph_create(c, "quiet", &d), LLMS_OK);
    llms_params p;
    llms_params_init(&p);
    p.max_tokens = 400;
    llms_graph_var in = {"unused", ""};
    llms_graph_result r;
    double t0 = proc_now();
    int rc = llms_graph_run(c, "quiet", &in, 1, &p, NULL, NULL, &r);
    CHECK_MSG(rc == LLMS_OK, "the run ended after %.3f s: %s", proc_now() - t0,
              llms_last_error(c));
    CHECK(r.n_timings == 1 && r.timings[0].generated_tokens > 0);
    llms_graph_result_free(&r);
    llms_close(c);
}

int main(int argc, char **argv)
{
    (void)argc;
    signal(SIGPIPE, SIG_IGN);
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    stories = test_data_path("models/stories260K.gguf");
    RUN(builtin_templates);
    RUN(generation_equals_complete);
    RUN(graph_run_follows_a_schema);
    RUN(kv_reuse_between_nodes);
    RUN(conditional_loop_and_cap);
    RUN(refusals_over_the_wire);
    RUN(isolation_and_restart);
    RUN(undecodable_definition_left_out);
    RUN(cancel_stops_run);
    RUN(disconnect_stops_run);
    RUN(run_is_in_flight_until_its_result);
    if (daemon_.pid > 0 && proc_stop(&daemon_, SIGTERM) != 0)
        proc_print_log(&daemon_);
    if (idle_daemon.pid > 0 && proc_stop(&idle_daemon, SIGTERM) != 0)
        proc_print_log(&idle_daemon);
    return test_finish();
}
