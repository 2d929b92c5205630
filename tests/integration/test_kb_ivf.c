/*
 * Knowledge-base vector search through the IVF index, end to end: two llmsd of this build
 * on the same generated model, one searching through an index from 40 passages on
 * (kb_ivf_min_passages), one always by brute force. With every list visited the answers
 * are the same passages with the same scores, before and after a restart (the index is
 * loaded from the store), after documents are removed and added (the index follows), and
 * after a drop and re-create (no stale index answers); with one list in two visited the
 * answers keep most of the exact ones.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/llms.h"
#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/support/test.h"

#define BASE_CONF                                                                          \
    "temperature = 0\nmax_tokens = 8\nkb_passage_tokens = 24\nkb_overlap_tokens = 4\n"   \
    "idle_after_ms = 100\n"

static char llmsd_path[1024], model_path[1024];

static const char *const words[] = {"apple",  "rocket", "violin", "river", "mountain",
                                    "garden", "engine", "castle", "winter", "ocean",
                                    "forest", "market", "bridge", "desert", "island"};
#define N_WORDS 15
#define N_QUERIES 8
#define TOP 5

/* Documents first..first+n-1, each about three of the words. */
static int add_docs(llms_conn *c, int first, int n)
{
    char text[64][128], id[64][16];
    llms_kb_doc docs[64];
    for (int i = 0; i < n; i++) {
        int d = first + i;
        snprintf(id[i], sizeof id[i], "d%d", d);
        snprintf(text[i], sizeof text[i], "The %s near the %s and a %s.", words[d % N_WORDS],
                 words[(d * 7 + 3) % N_WORDS], words[(d * 11 + 5) % N_WORDS]);
        docs[i] = (llms_kb_doc){id[i], text[i], NULL};
    }
    return llms_kb_add(c, "kb", docs, (size_t)n, NULL) == LLMS_OK ? 0 : -1;
}

/* The top passages (document, seq, score) of each query. */
typedef struct answers {
    char doc[N_QUERIES][TOP][16];
    uint32_t seq[N_QUERIES][TOP];
    float score[N_QUERIES][TOP];
    size_t n[N_QUERIES];
} answers;

static int ask(llms_conn *c, answers *a)
{
    for (int q = 0; q < N_QUERIES; q++) {
        char text[64];
        snprintf(text, sizeof text, "a %s by the %s", words[q], words[(q * 5 + 2) % N_WORDS]);
        llms_kb_hit *hits;
        if (llms_kb_search(c, "kb", text, TOP, LLMS_RETRIEVAL_VECTOR, &hits, &a->n[q]) != LLMS_OK)
            return -1;
        for (size_t i = 0; i < a->n[q]; i++) {
            snprintf(a->doc[q][i], sizeof a->doc[q][i], "%s", hits[i].document);
            a->seq[q][i] = hits[i].seq;
            a->score[q][i] = hits[i].score;
        }
        llms_kb_hits_free(hits, a->n[q]);
    }
    return 0;
}

/* The same passages in the same order with the same scores: exact search and the index
 * both score the stored int8 rows against the same int16 query with vdist_dot_q8, so the
 * scores are equal to the bit. */
static bool same(const answers *a, const answers *b)
{
    for (int q = 0; q < N_QUERIES; q++) {
        if (a->n[q] != b->n[q])
            return false;
        for (size_t i = 0; i < a->n[q]; i++)
            if (strcmp(a->doc[q][i], b->doc[q][i]) || a->seq[q][i] != b->seq[q][i] ||
                a->score[q][i] != b->score[q][i])
                return false;
    }
    return true;
}

/* Share of b's passages that a found too. */
static double recall(const answers *a, const answers *b)
{
    int found = 0, total = 0;
    for (int q = 0; q < N_QUERIES; q++)
        for (size_t j = 0; j < b->n[q]; j++) {
            total++;
            for (size_t i = 0; i < a->n[q]; i++)
                found += !strcmp(a->doc[q][i], b->doc[q][j]) && a->seq[q][i] == b->seq[q][j];
        }
    return total ? (double)found / total : 0;
}

/* Asks once (a search that finds the index to be trained leaves it for idle time), then
 * waits until the daemon has trained `trained` indexes in all and none waits. 0, or -1
 * after 30 s. */
static int train_index(llms_conn *c, uint64_t trained)
{
    static answers warm;
    if (ask(c, &warm))
        return -1;
    for (int i = 0; i < 300; i++) {
        llms_daemon_status st;
        if (proc_status(c, &st))
            return -1;
        bool done = st.kb_ivf_trained >= trained && st.kb_ivf_train_pending == 0;
        llms_daemon_status_free(&st);
        if (done)
            return 0;
        usleep(100000);
    }
    fprintf(stderr, "the IVF index was not trained in idle time\n");
    return -1;
}

static void index_answers_equal_exact(void)
{
    if (!llmsd_path[0] || !model_path[0])
        SKIP("llmsd or the generated model is missing");
    llmsd_proc ix, ex, lo;
    CHECK(proc_start(&ix, llmsd_path, "kbivf", model_path,
                     BASE_CONF "kb_ivf_min_passages = 40\nkb_ivf_nprobe = 64\n") == 0);
    CHECK(proc_start(&ex, llmsd_path, "kbexact", model_path,
                     BASE_CONF "kb_ivf_min_passages = 0\n") == 0);
    CHECK(proc_start(&lo, llmsd_path, "kbivf-lo", model_path,
                     BASE_CONF "kb_ivf_min_passages = 40\nkb_ivf_nprobe = 3\n") == 0);
    llms_conn *ci = proc_connect(&ix, "app"), *ce = proc_connect(&ex, "app"),
              *cl = proc_connect(&lo, "app");
    CHECK(ci && ce && cl);
    llms_conn *all[3] = {ci, ce, cl};
    for (int i = 0; i < 3; i++) {
        CHECK_EQ(llms_kb_create(all[i], "kb", 0, 0), LLMS_OK);
        CHECK(add_docs(all[i], 0, 60) == 0);
    }
    /* until its index is trained (in idle time) a knowledge base is searched exactly */
    CHECK(train_index(ci, 1) == 0 && train_index(cl, 1) == 0);
    static answers a, e, l;
    CHECK(ask(ci, &a) == 0 && ask(ce, &e) == 0 && ask(cl, &l) == 0);
    CHECK(e.n[0] == TOP);
    CHECK(same(&a, &e));
    /* 60 passages make 7 lists: 3 visited keep most of the exact answers */
    double r = recall(&l, &e);
    CHECK_MSG(r >= 0.6, "recall@%d with 3 of 7 lists: %.2f", TOP, r);

    /* restart: the stored index is loaded and answers the same */
    llms_close(ci);
    proc_stop(&ix, SIGTERM);
    CHECK(proc_start(&ix, llmsd_path, "kbivf", model_path,
                     BASE_CONF "kb_ivf_min_passages = 40\nkb_ivf_nprobe = 64\n") == 0);
    ci = proc_connect(&ix, "app");
    CHECK(ci);
    int asked = ask(ci, &a);
    if (asked)
        proc_print_log(&ix);
    CHECK_MSG(asked == 0, "%s", llms_last_error(ci));
    CHECK(same(&a, &e));

    /* documents removed and added: the index follows */
    const char *gone[] = {"d3", "d10", "d11", "d40", "d59"};
    uint32_t removed;
    CHECK_EQ(llms_kb_remove(ci, "kb", gone, 5, &removed), LLMS_OK);
    CHECK_EQ(llms_kb_remove(ce, "kb", gone, 5, &removed), LLMS_OK);
    CHECK(add_docs(ci, 60, 12) == 0 && add_docs(ce, 60, 12) == 0);
    CHECK(ask(ci, &a) == 0 && ask(ce, &e) == 0);
    CHECK(same(&a, &e));

    /* dropped and made again (SQLite may hand out the same id): no stale index answers */
    for (int i = 0; i < 2; i++) {
        llms_conn *c = i ? ce : ci;
        CHECK_EQ(llms_kb_drop(c, "kb"), LLMS_OK);
        CHECK_EQ(llms_kb_create(c, "kb", 0, 0), LLMS_OK);
        CHECK(add_docs(c, 100, 50) == 0);
    }
    CHECK(train_index(ci, 1) == 0);
    CHECK(ask(ci, &a) == 0 && ask(ce, &e) == 0);
    CHECK(same(&a, &e));
    llms_close(ci);
    llms_close(ce);
    llms_close(cl);
    proc_stop(&ix, SIGTERM);
    proc_stop(&ex, SIGTERM);
    proc_stop(&lo, SIGTERM);
}

/* A graph run whose retrievals search the IVF index: each retrieval after a run's first
 * brings the run's hint lists (similarity-aware search), and the answer is the one a
 * daemon searching by brute force gives (hints and the early stop change the work, not
 * the results); in idle time the hot copy of the searched lists is made, and searches
 * read it with the same answers. */
static void graph_hints_and_hot_copy(void)
{
    if (!llmsd_path[0] || !model_path[0])
        SKIP("llmsd or the generated model is missing");
    llmsd_proc ix, ex;
    CHECK(proc_start(&ix, llmsd_path, "kbivf-hints", model_path,
                     BASE_CONF "kb_ivf_min_passages = 40\nkb_ivf_nprobe = 64\n"
                               "kb_ivf_hot_mb = 1\n") == 0);
    CHECK(proc_start(&ex, llmsd_path, "kbexact-hints", model_path,
                     BASE_CONF "kb_ivf_min_passages = 0\n") == 0);
    llms_conn *ci = proc_connect(&ix, "app"), *ce = proc_connect(&ex, "app");
    CHECK(ci && ce);
    llms_conn *both[2] = {ci, ce};
    char *answer[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) {
        CHECK_EQ(llms_kb_create(both[i], "kb", 0, 0), LLMS_OK);
        CHECK(add_docs(both[i], 0, 60) == 0);
        CHECK(i == 1 || train_index(both[i], 1) == 0);
        llms_graph_var in[2] = {{"question", "where is the rocket by the river"},
                                {"kb", "kb"}};
        llms_params p = proc_greedy(8, NULL);
        llms_graph_result r;
        CHECK_MSG(llms_graph_run(both[i], "irg", in, 2, &p, NULL, NULL, &r) == LLMS_OK, "%s",
                  llms_last_error(both[i]));
        answer[i] = r.output;
        r.output = NULL;
        llms_graph_result_free(&r);
    }
    CHECK(answer[0] && answer[1] && strcmp(answer[0], answer[1]) == 0);
    free(answer[0]);
    free(answer[1]);
    llms_daemon_status st;
    CHECK(proc_status(ci, &st) == 0);
    printf("  %llu IVF searches (irg last), %llu hinted, %llu lists scanned, %llu skipped\n",
           (unsigned long long)st.kb_ivf_searches, (unsigned long long)st.kb_ivf_hinted_searches,
           (unsigned long long)st.kb_ivf_lists_scanned,
           (unsigned long long)st.kb_ivf_lists_skipped);
    CHECK(st.kb_ivf_searches >= 3);
    CHECK_EQ(st.kb_ivf_hinted_searches, 2);
    CHECK(st.kb_ivf_lists_scanned > 0);
    llms_daemon_status_free(&st);

    /* idle: the searched lists get their hot copy; answers stay the exact ones */
    uint64_t hot = 0;
    for (int i = 0; i < 100 && hot == 0; i++) {
        usleep(100000);
        CHECK(proc_status(ci, &st) == 0);
        hot = st.kb_ivf_hot_bytes;
        llms_daemon_status_free(&st);
    }
    printf("  hot copy: %llu bytes\n", (unsigned long long)hot);
    CHECK(hot > 0 && hot <= (1u << 20));
    static answers a, e;
    CHECK(ask(ci, &a) == 0 && ask(ce, &e) == 0);
    CHECK(same(&a, &e));
    llms_close(ci);
    llms_close(ce);
    proc_stop(&ix, SIGTERM);
    proc_stop(&ex, SIGTERM);
}

int main(int argc, char **argv)
{
    (void)argc;
    signal(SIGPIPE, SIG_IGN);
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    modelgen_params mp = {
        .arch = "qwen3", .dim = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 128,
        .n_ctx = 512, .type = QTYPE_F32, .seed = 7, .n_vocab = 300, .n_threads = 1,
    };
    proc_generate_model(model_path, sizeof model_path, "kbivf.gguf", &mp);
    RUN(index_answers_equal_exact);
    RUN(graph_hints_and_hot_copy);
    return test_finish();
}
