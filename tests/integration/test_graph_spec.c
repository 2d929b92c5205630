/*
 * Speculation in workflow graphs end to end: a real llmsd of this build on the trained
 * stories260K model, through libllmsclient. Each graph runs with speculation off and on
 * (greedy): the answer and every state variable must be the same, and the run's counts
 * and node events must say what happened:
 *   - a generation started on a retrieval's estimate (BM25 before the embedding) that
 *     holds (top_k 1: the one passage with the query's word leads BM25 and the fusion)
 *     is a hit, and one that cannot hold (top_k 2: BM25 finds one passage, the fusion
 *     two) a rollback;
 *   - a retrieval started on a generation's first tokens is a hit when its query does
 *     not depend on them, and a rollback when the generation ends before it does; when
 *     its query is the generated text itself its result is the real retrieval's estimate
 *     and it is counted once, with the generation started on that, when the retrieval
 *     ends;
 * and llmsctl status's counters add the runs' up.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/llms.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/integration/story_kb.h"
#include "tests/support/test.h"

static char llmsd_path[1024];
static const char *stories;
static llmsd_proc daemon_;
static int up;

/* graph_spec_tokens 2 of max_tokens 8: a generation's retrieval starts well before the
 * generation ends */
#define CONF "temperature = 0\nmax_tokens = 8\nrag_top_k = 2\ngraph_spec_tokens = 2\n" \
             "kb_passage_tokens = 48\nkb_overlap_tokens = 4\n"

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
    return proc_start(&daemon_, llmsd_path, "graphspec", stories, CONF);
}

typedef struct spec_events {
    int hits, rollbacks;
} spec_events;

static int count_spec(const llms_graph_event *ev, void *user)
{
    spec_events *e = user;
    e->hits += ev->finished && ev->speculation == LLMS_GRAPH_SPEC_HIT;
    e->rollbacks += ev->finished && ev->speculation == LLMS_GRAPH_SPEC_ROLLBACK;
    return 0;
}

/* Totals of the runs, to hold llmsctl status's counters to. */
static uint64_t total_started, total_hits, total_rollbacks;

/* Runs graph on question with speculation off and on: the same answer and state; the
 * speculative run's hits and rollbacks, as its result and its events count them, into
 * *hits and *rollbacks. */
static void run_both(llms_conn *c, const char *graph, const char *question, uint32_t *hits,
                     uint32_t *rollbacks)
{
    llms_graph_var in[2] = {{"question", question}, {"kb", "stories"}};
    llms_graph_result off, on;
    spec_events ev_off = {0}, ev_on = {0};
    CHECK_MSG(llms_graph_run_speculate(c, graph, in, 2, NULL, LLMS_SPECULATE_OFF, count_spec,
                                       &ev_off, &off) == LLMS_OK,
              "%s: %s", graph, llms_last_error(c));
    CHECK_MSG(llms_graph_run_speculate(c, graph, in, 2, NULL, LLMS_SPECULATE_ON, count_spec,
                                       &ev_on, &on) == LLMS_OK,
              "%s: %s", graph, llms_last_error(c));
    CHECK_MSG(!strcmp(off.output, on.output), "%s: '%s' without speculation, '%s' with",
              graph, off.output, on.output);
    CHECK(*on.output);
    CHECK_EQ(off.steps, on.steps);
    CHECK_EQ(off.n_state, on.n_state);
    for (size_t i = 0; i < off.n_state && i < on.n_state; i++) {
        CHECK(!strcmp(off.state_names[i], on.state_names[i]));
        CHECK_MSG(!strcmp(off.state_values[i], on.state_values[i]), "%s: %s differs", graph,
                  off.state_names[i]);
    }
    CHECK_EQ(off.speculations, 0);
    CHECK_EQ(ev_off.hits + ev_off.rollbacks, 0);
    CHECK_EQ(on.spec_hits + on.spec_rollbacks, on.speculations);
    CHECK_EQ((uint32_t)ev_on.hits, on.spec_hits);
    CHECK_EQ((uint32_t)ev_on.rollbacks, on.spec_rollbacks);
    CHECK(on.spec_saved_ms >= 0);
    if (!on.spec_hits)
        CHECK(on.spec_saved_ms == 0);
    total_started += on.speculations;
    total_hits += on.spec_hits;
    total_rollbacks += on.spec_rollbacks;
    *hits = on.spec_hits;
    *rollbacks = on.spec_rollbacks;
    llms_graph_result_free(&off);
    llms_graph_result_free(&on);
}

/* retrieve (hybrid, top_k) -> answer */
static int create_answer_graph(llms_conn *c, const char *name, uint32_t top_k)
{
    static const char *const inputs[] = {"question", "kb"};
    llms_graph_node nodes[] = {
        {.name = "retrieve", .kind = LLMS_GRAPH_RETRIEVE, .output = "passages", .kb = "{kb}",
         .query = "{question}", .top_k = top_k, .retrieval = LLMS_RETRIEVAL_RRF},
        {.name = "answer", .kind = LLMS_GRAPH_GENERATE, .output = "answer",
         .prompt = "Passages:\n{passages}\n\nQuestion: {question}\nAnswer:"},
    };
    llms_graph_edge edges[] = {{"START", "retrieve", NULL}, {"retrieve", "answer", NULL},
                               {"answer", "END", NULL}};
    llms_graph_def d = {inputs, 2, nodes, 2, edges, 3, "answer", 0};
    return llms_graph_create(c, name, &d) == LLMS_OK ? 0 : -1;
}

static void generation_on_estimate(void)
{
    NEED();
    llms_conn *c = proc_connect(&daemon_, "specgen");
    CHECK(c);
    CHECK_EQ(story_kb_make(c), 0);
    CHECK_EQ(create_answer_graph(c, "top1", 1), 0);
    CHECK_EQ(create_answer_graph(c, "top2", 2), 0);
    uint32_t hits, rollbacks;
    run_both(c, "top1", "boat", &hits, &rollbacks);
    CHECK_MSG(hits == 1 && rollbacks == 0, "top1: %u hits, %u rollbacks", hits, rollbacks);
    run_both(c, "top2", "boat", &hits, &rollbacks);
    CHECK_MSG(hits == 0 && rollbacks == 1, "top2: %u hits, %u rollbacks", hits, rollbacks);
    /* the built-in templates, whatever their estimates give */
    static const char *const tmpl[] = {"one-shot", "hyde", "multistep", "irg", "recomp"};
    for (int t = 0; t < 5; t++)
        run_both(c, tmpl[t], "Where did Lily play with her dog?", &hits, &rollbacks);
    llms_close(c);
}

/* think (generate, max_tokens tokens: 0 the daemon's) -> retrieve (query) -> answer */
static int create_think_graph(llms_conn *c, const char *name, const char *query,
                              int max_tokens)
{
    static const char *const inputs[] = {"question", "kb"};
    llms_params p = proc_greedy(max_tokens, NULL);
    llms_graph_node nodes[] = {
        {.name = "think", .kind = LLMS_GRAPH_GENERATE, .output = "thought",
         .prompt = "Question: {question}\nThought:", .params = max_tokens ? &p : NULL},
        {.name = "retrieve", .kind = LLMS_GRAPH_RETRIEVE, .output = "passages", .kb = "{kb}",
         .query = query, .top_k = 2, .retrieval = LLMS_RETRIEVAL_RRF},
        {.name = "answer", .kind = LLMS_GRAPH_GENERATE, .output = "answer",
         .prompt = "Passages:\n{passages}\n\nQuestion: {question}\nAnswer:"},
    };
    llms_graph_edge edges[] = {{"START", "think", NULL}, {"think", "retrieve", NULL},
                               {"retrieve", "answer", NULL}, {"answer", "END", NULL}};
    llms_graph_def d = {inputs, 2, nodes, 3, edges, 4, "answer", 0};
    return llms_graph_create(c, name, &d) == LLMS_OK ? 0 : -1;
}

/* The speculation outcomes the think and the retrieve nodes' events give. */
typedef struct node_spec {
    spec_events think, retrieve;
} node_spec;

static int count_node_spec(const llms_graph_event *ev, void *user)
{
    node_spec *e = user;
    spec_events *x = !strcmp(ev->node, "think") ? &e->think : &e->retrieve;
    if (ev->finished && strcmp(ev->node, "answer")) {
        x->hits += ev->speculation == LLMS_GRAPH_SPEC_HIT;
        x->rollbacks += ev->speculation == LLMS_GRAPH_SPEC_ROLLBACK;
    }
    return 0;
}

/* A speculative run of graph: its result's counts into the totals, the nodes' events'
 * into *ev. */
static void run_spec(llms_conn *c, const char *graph, node_spec *ev, llms_graph_result *r)
{
    llms_graph_var in[2] = {{"question", "Who had a boat?"}, {"kb", "stories"}};
    memset(ev, 0, sizeof *ev);
    CHECK_EQ(llms_graph_run_speculate(c, graph, in, 2, NULL, LLMS_SPECULATE_ON, count_node_spec,
                                      ev, r), LLMS_OK);
    total_started += r->speculations;
    total_hits += r->spec_hits;
    total_rollbacks += r->spec_rollbacks;
}

static void retrieval_on_partial_generation(void)
{
    NEED();
    llms_conn *c = proc_connect(&daemon_, "specrt");
    CHECK(c);
    CHECK_EQ(story_kb_make(c), 0);
    CHECK_EQ(create_think_graph(c, "fixed", "{question}", 0), 0);
    CHECK_EQ(create_think_graph(c, "late", "{thought}", 3), 0);
    CHECK_EQ(create_think_graph(c, "hyde2", "{thought}", 0), 0);
    uint32_t hits, rollbacks;
    run_both(c, "fixed", "Who had a boat?", &hits, &rollbacks);
    CHECK(hits >= 1);
    run_both(c, "late", "Who had a boat?", &hits, &rollbacks);
    CHECK(rollbacks >= 1);
    run_both(c, "hyde2", "Who had a boat?", &hits, &rollbacks);
    CHECK(hits + rollbacks >= 1);
    node_spec ev;
    llms_graph_result r;
    /* the query does not depend on the thought: the speculative retrieval is the real
     * one, and the answer starts on its BM25 estimate (2 passages) or after it */
    run_spec(c, "fixed", &ev, &r);
    CHECK_MSG(ev.think.hits == 1 && ev.think.rollbacks == 0, "fixed query: %d hits, %d "
              "rollbacks", ev.think.hits, ev.think.rollbacks);
    CHECK_EQ(r.spec_hits + r.spec_rollbacks, r.speculations);
    llms_graph_result_free(&r);
    /* the thought ends at its third token, one step after the retrieval started on two:
     * that retrieval has not finished, and is dropped */
    run_spec(c, "late", &ev, &r);
    CHECK_MSG(ev.think.hits == 0 && ev.think.rollbacks == 1, "late: %d hits, %d rollbacks",
              ev.think.hits, ev.think.rollbacks);
    CHECK(r.n_timings == 3 && r.timings[0].generated_tokens == 3);
    llms_graph_result_free(&r);
    /* the query is the thought: the retrieval on its first two tokens finishes first and
     * seeds the real one; one speculation, decided when the real retrieval ends */
    run_spec(c, "hyde2", &ev, &r);
    CHECK(r.n_timings == 3 && r.timings[0].generated_tokens > 2);
    CHECK_EQ(ev.think.hits + ev.think.rollbacks, 0);
    CHECK_EQ(ev.retrieve.hits + ev.retrieve.rollbacks, 1);
    CHECK_EQ(r.speculations, 1);
    CHECK_EQ(r.spec_hits, (uint32_t)ev.retrieve.hits);
    llms_graph_result_free(&r);
    llms_close(c);
}

static int cancel_at_event(const llms_graph_event *ev, void *user)
{
    (void)ev;
    return --*(int *)user == 0;
}

/* Runs cancelled at each of their node events, speculative work in flight or not: each
 * is CANCELLED, and the daemon then answers as before (its KV and retrievals freed:
 * the ASan build's daemon checks at exit). */
static void cancel_while_speculating(void)
{
    NEED();
    llms_conn *c = proc_connect(&daemon_, "specrt");
    CHECK(c);
    llms_graph_var in[2] = {{"question", "Who had a boat?"}, {"kb", "stories"}};
    llms_graph_result before, after;
    CHECK_EQ(llms_graph_run_speculate(c, "hyde2", in, 2, NULL, LLMS_SPECULATE_OFF, NULL, NULL,
                                      &before), LLMS_OK);
    for (int at = 1; at <= 5; at++) {
        int left = at;
        CHECK_EQ(llms_graph_run_speculate(c, "hyde2", in, 2, NULL, LLMS_SPECULATE_ON,
                                          cancel_at_event, &left, NULL), LLMS_ERR_CANCELLED);
        CHECK_EQ(left, 0);
    }
    CHECK_EQ(llms_graph_run_speculate(c, "hyde2", in, 2, NULL, LLMS_SPECULATE_ON, NULL, NULL,
                                      &after), LLMS_OK);
    CHECK(!strcmp(before.output, after.output));
    llms_graph_result_free(&before);
    llms_graph_result_free(&after);
    llms_close(c);
}

static void status_counts(void)
{
    NEED();
    llms_conn *c = proc_connect(&daemon_, "status");
    CHECK(c);
    llms_daemon_status st;
    CHECK_EQ(llms_status_get(c, &st), LLMS_OK);
    CHECK(total_started > 0 && total_hits > 0 && total_rollbacks > 0);
    CHECK_EQ(st.graph_speculations, total_started);
    CHECK_EQ(st.graph_spec_hits, total_hits);
    CHECK_EQ(st.graph_spec_rollbacks, total_rollbacks);
    CHECK(st.graph_spec_saved_ms > 0);
    llms_daemon_status_free(&st);
    llms_close(c);
}

int main(int argc, char **argv)
{
    (void)argc;
    signal(SIGPIPE, SIG_IGN);
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    stories = test_data_path("models/stories260K.gguf");
    RUN(generation_on_estimate);
    RUN(retrieval_on_partial_generation);
    RUN(status_counts); /* before the cancelled runs, whose counts the client never sees */
    RUN(cancel_while_speculating);
    if (daemon_.pid > 0 && proc_stop(&daemon_, SIGTERM) != 0)
        proc_print_log(&daemon_);
    return test_finish();
}
