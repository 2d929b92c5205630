/*
 * rag — retrieval quality and RagQuery latency per cache level, as JSON lines on stdout.
 *
 *   rag [--model PATH] [--docs N] [--queries N] [--tau X] [--gap-ms MS] [--budget N]
 *       [--idle-ms MS]
 *
 * Starts llmsd of the same build on a temporary socket with the trained
 * ../shared/testdata/models/TinyStories-656K-Q8_0.gguf (or --model; skipped with a
 * message when absent), which generates and, as no embed_model is set, embeds. A
 * personal corpus is generated here: emails, meeting notes and chat logs (--docs, 600 by
 * default) about recurring people, places and topics, each holding one unique fact code.
 *   1. recall@1/@5 of hybrid RRF, hybrid normalised sum, BM25 and vector retrieval on
 *      labelled queries (the document holding a fact must come back for a question about
 *      its people, place and topic).
 *   2. a query trace (--queries, 60 by default: new questions, exact repeats and
 *      paraphrases, fixed seed; an idle gap of --gap-ms, 1500 by default, before the
 *      first query and after every sixth) run by five systems, each a daemon of its own
 *      with the same corpus: naive (no QA bank, no QKV tree), QKV prefix reuse only, QA
 *      bank only, both without prediction, and PerCache: both levels with idle-time
 *      prediction (predict_budget --budget, 24 by default, idle_after_ms --idle-ms, 300
 *      by default, so it predicts in the gaps). Each query goes to the five in turn, so
 *      load from other processes falls on all of them alike, in an order that rotates
 *      (after a gap, once PerCache's prediction is quiet); with a model whose queries
 *      take long, give --idle-ms above the time of one round of five queries, or
 *      PerCache predicts while the others answer and takes the cores from them
 *      (rounds_with_prediction counts the rounds during which it did). Per system: mean
 *      and p95 latency (of all queries, of those right after a gap and of the others, of
 *      each kind), mean retrieve, prefill and decode times (the QKV load is part of
 *      prefill), QA and QKV hit rates (of each kind too), the share of answers equal to
 *      naive's for the same query (greedy), of QA hits and of QKV hits alone too, and
 *      for PerCache the compute spent on population while idle (worker ms, steps,
 *      generations, predicted queries) and the hits on predicted entries.
 */
#include <libgen.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench.h"
#include "client/llms.h"

static const char *const people[] = {"Alice", "Bob", "Carol", "David", "Emma", "Frank",
                                     "Grace", "Henry", "Irene", "Jack", "Kate", "Leo"};
static const char *const places[] = {"Berlin", "the office", "the cafe", "Lisbon", "the lab",
                                     "Oslo", "the park", "the library"};
static const char *const topics[] = {"budget", "garden", "concert", "hiking trip", "new car",
                                     "birthday party", "server outage", "school play",
                                     "kitchen repair", "book club"};
static const char *const kinds[] = {"email", "meeting notes", "chat"};
#define N(a) ((int)(sizeof a / sizeof a[0]))

static uint64_t rng = 0x9e3779b97f4a7c15ULL;
static int rnd(int n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (int)(rng % (uint64_t)n);
}

typedef struct doc {
    int who, with, where, what, kind;
} doc;

static void doc_text(const doc *d, int i, char *out, size_t cap)
{
    const char *a = people[d->who], *b = people[d->with], *p = places[d->where],
               *t = topics[d->what];
    switch (d->kind) {
    case 0:
        snprintf(out, cap, "From %s to %s. Subject: the %s. Hi %s, about the %s: let us meet at "
                 "%s on day %d. The code for it is F%d. Regards, %s.", a, b, t, b, t, p, i % 28 + 1,
                 i, a);
        break;
    case 1:
        snprintf(out, cap, "Meeting notes, %s. Present: %s and %s. We discussed the %s. "
                 "Decision F%d was taken; %s will follow up on the %s next week.", p, a, b, t, i,
                 b, t);
        break;
    default:
        snprintf(out, cap, "%s: are you at %s? %s: yes, working on the %s. %s: ok, note F%d "
                 "for the %s. %s: thanks!", a, p, b, t, a, i, t, b);
    }
}

static void question(const doc *d, int style, char *out, size_t cap)
{
    const char *a = people[d->who], *b = people[d->with], *p = places[d->where],
               *t = topics[d->what];
    if (style == 0)
        snprintf(out, cap, "What did %s tell %s about the %s at %s?", a, b, t, p);
    else
        snprintf(out, cap, "At %s, what did %s and %s say on the %s?", p, b, a, t);
}

#define NSYS 5
static pid_t daemon_pid[NSYS];

/* Starts daemon which in dir/which with the settings conf ("key = value" lines). */
static int start_daemon(const char *llmsd, const char *root, int which, const char *conf,
                        char *sock, size_t cap)
{
    char dir[700];
    snprintf(dir, sizeof dir, "%s/%d", root, which);
    if (mkdir(dir, 0755) != 0)
        return -1;
    daemon_pid[which] = bench_llmsd_start("rag", llmsd, dir, conf, sock, cap);
    if (daemon_pid[which] > 0)
        return 0;
    daemon_pid[which] = 0;
    return -1;
}

static void stop_daemons(void)
{
    for (int i = 0; i < NSYS; i++)
        if (daemon_pid[i] > 0) {
            bench_llmsd_stop(daemon_pid[i]);
            daemon_pid[i] = 0;
        }
}

static int recall(llms_conn *c, const doc *docs, int n_docs, int n_q, const char *model)
{
    static const char *const names[] = {"rrf", "sum", "bm25", "vector"};
    enum llms_retrieval modes[] = {LLMS_RETRIEVAL_RRF, LLMS_RETRIEVAL_SUM, LLMS_RETRIEVAL_BM25,
                                   LLMS_RETRIEVAL_VECTOR};
    for (int m = 0; m < 4; m++) {
        int at1 = 0, at5 = 0;
        rng = 12345;
        for (int i = 0; i < n_q; i++) {
            int d = rnd(n_docs);
            char q[256], want[32];
            question(&docs[d], i % 2, q, sizeof q);
            snprintf(want, sizeof want, "d%d", d);
            llms_kb_hit *hits;
            size_t n;
            if (llms_kb_search(c, "pim", q, 5, modes[m], &hits, &n) != LLMS_OK) {
                fprintf(stderr, "rag: search: %s\n", llms_last_error(c));
                return -1;
            }
            for (size_t h = 0; h < n; h++)
                if (!strcmp(hits[h].document, want)) {
                    at1 += h == 0;
                    at5++;
                    break;
                }
            llms_kb_hits_free(hits, n);
        }
        /* several documents share a question's people, place and topic at most by chance,
         * so a miss is the retriever's */
        printf("{\"bench\":\"rag_recall\",\"model\":\"%s\",\"retrieval\":\"%s\",\"docs\":%d,"
               "\"queries\":%d,\"recall_at_1\":%.3f,\"recall_at_5\":%.3f}\n",
               model, names[m], n_docs, n_q, (double)at1 / n_q, (double)at5 / n_q);
        fflush(stdout);
    }
    return 0;
}

/* What a trace query is: a new question, an exact repeat of an earlier one, or an
 * earlier one reworded. */
enum { Q_NEW, Q_EXACT, Q_REWORDED, Q_KINDS };

typedef struct trace_q {
    char text[256];
    int gap_ms;     /* no request before it for this long */
    bool idle;      /* a gap meant for idle-time work: PerCache's must be over before it */
    int kind;
} trace_q;

/* Adds the corpus docs (generated on the first call) to knowledge base "pim". */
static int add_corpus(llms_conn *c, doc *docs, int n_docs, bool generate)
{
    for (int i = 0; i < n_docs; i += 50) {
        llms_kb_doc batch[50];
        char ids[50][16], texts[50][512];
        int n = n_docs - i < 50 ? n_docs - i : 50;
        for (int j = 0; j < n; j++) {
            doc *d = &docs[i + j];
            if (generate) {
                d->who = rnd(N(people));
                d->with = (d->who + 1 + rnd(N(people) - 1)) % N(people);
                d->where = rnd(N(places));
                d->what = rnd(N(topics));
                d->kind = rnd(N(kinds));
            }
            snprintf(ids[j], sizeof ids[j], "d%d", i + j);
            doc_text(d, i + j, texts[j], sizeof texts[j]);
            batch[j] = (llms_kb_doc){ids[j], texts[j], kinds[d->kind]};
        }
        if (llms_kb_add(c, "pim", batch, (size_t)n, NULL) != LLMS_OK) {
            fprintf(stderr, "rag: add: %s\n", llms_last_error(c));
            return -1;
        }
    }
    return 0;
}

static const char *const sys_names[NSYS] = {"naive", "qkv_only", "qa_only", "qkv_and_qa",
                                           "percache"};

typedef struct sys_result {
    double *lat;
    char **answers;
    int *outcome;   /* enum llms_rag_outcome of each query */
    double mean, p95, retrieve, prefill, decode;
    double after_gap_mean, other_mean; /* over the queries right after an idle gap, the rest */
    double kind_mean[Q_KINDS];
    int qa, qkv, same, generated;
    int qa_kind[Q_KINDS], qkv_kind[Q_KINDS];
    int qa_same, qkv_same;  /* QA hits, QKV hits whose answer is naive's */
    double reused, prompt;
} sys_result;

static int sys_alloc(sys_result *r, int n)
{
    memset(r, 0, sizeof *r);
    r->lat = calloc((size_t)n, sizeof *r->lat);
    r->answers = calloc((size_t)n, sizeof *r->answers);
    r->outcome = calloc((size_t)n, sizeof *r->outcome);
    return r->lat && r->answers && r->outcome ? 0 : -1;
}

static void sys_free(sys_result *r, int n)
{
    for (int i = 0; r->answers && i < n; i++)
        free(r->answers[i]);
    free(r->answers);
    free(r->lat);
    free(r->outcome);
    memset(r, 0, sizeof *r);
}

/* Asks trace query i on c with options o into r's slot i. */
static int ask(llms_conn *c, const char *kb, const trace_q *q, int i,
               const llms_rag_options *o, sys_result *r)
{
    llms_rag_result res;
    double a = bench_now_s();
    if (llms_rag_query(c, kb, q->text, o, NULL, NULL, &res) != LLMS_OK) {
        fprintf(stderr, "rag: query: %s\n", llms_last_error(c));
        return -1;
    }
    r->lat[i] = (bench_now_s() - a) * 1e3;
    r->outcome[i] = res.outcome;
    r->qa += res.outcome == LLMS_RAG_QA_HIT;
    r->qkv += res.outcome == LLMS_RAG_QKV_HIT;
    r->reused += res.reused_tokens;
    r->prompt += res.prompt_tokens;
    r->retrieve += res.retrieve_ms;
    if (res.outcome != LLMS_RAG_QA_HIT) {
        r->prefill += res.prefill_ms;
        r->decode += res.decode_ms;
        r->generated++;
    }
    free(r->answers[i]);
    r->answers[i] = strdup(res.text ? res.text : "");
    llms_rag_result_free(&res);
    return r->answers[i] ? 0 : -1;
}

/* A request the daemon's event loop answers itself (Tokenize with no model named). */
static int wake(llms_conn *c)
{
    int32_t *ids;
    size_t n;
    if (llms_tokenize(c, "wake", 0, 0, &ids, &n) != LLMS_OK) {
        fprintf(stderr, "rag: tokenize: %s\n", llms_last_error(c));
        return -1;
    }
    free(ids);
    return 0;
}

/* c's idle-time prediction steps so far (an admin's figure: the bench runs as root). */
static int predict_steps(llms_conn *c, unsigned long long *steps)
{
    llms_cache_stats st;
    if (llms_cache_stats_get(c, &st) != LLMS_OK) {
        fprintf(stderr, "rag: cache stats: %s\n", llms_last_error(c));
        return -1;
    }
    *steps = st.predict_steps;
    return 0;
}

/* Waits until c's idle-time prediction is quiet: its step count the same over 50 ms.
 * 1 when it already was, 0 when it had to wait, -1 on error. */
static int prediction_quiet(llms_conn *c)
{
    unsigned long long last = ~0ULL;
    for (int polls = 0;; polls++) {
        unsigned long long steps;
        if (predict_steps(c, &steps))
            return -1;
        if (steps == last)
            return polls == 1;
        last = steps;
        usleep(50 * 1000);
    }
}

/* Sends each query of trace to the five systems c[] (on knowledge base kb) into res.
 * Each query goes to every system in turn (each system its own daemon, so no cache is
 * shared). The first system of a round is slower: a copy of "both" in PerCache's
 * place, first in every round, measured 1.03-1.04x of "both" on TinyStories-656K (the
 * cores and the daemons' threads wake from the idle gaps on its query), and after
 * the 15 s gaps of a 100M model the first system's 32-token decode took up to 1.2x
 * the last one's. So the order rotates from round to round, gaps or not, and after
 * an idle gap every daemon is first woken, untimed, with a Tokenize, which the event
 * loop answers and which does not end the idle period. PerCache's idle-time prediction
 * must not run beside the others' queries: after an idle gap the round waits until its
 * step count stops moving (*overran counts the gaps where it had to wait), and *busy
 * counts the rounds during which it moved all the same (idle_after_ms too short for
 * the time between two of PerCache's queries). */
static int run_trace(llms_conn *const c[NSYS], const char *kb, const trace_q *trace, int n,
                     sys_result *res, int *overran, int *busy)
{
    static const int cycle[NSYS] = {4, 0, 1, 2, 3};
    *overran = *busy = 0;
    for (int i = 0; i < n; i++) {
        if (trace[i].gap_ms)
            usleep((useconds_t)trace[i].gap_ms * 1000);
        if (trace[i].idle) {
            int quiet = prediction_quiet(c[4]);
            if (quiet < 0)
                return -1;
            *overran += quiet == 0;
            for (int s = 0; s < NSYS; s++)
                if (wake(c[s]))
                    return -1;
        }
        unsigned long long before, after;
        if (predict_steps(c[4], &before))
            return -1;
        for (int k = 0; k < NSYS; k++) {
            int s = cycle[(k + i) % NSYS];
            llms_rag_options o = {.no_qa = s == 0 || s == 1, .no_qkv = s == 0 || s == 2};
            if (ask(c[s], kb, &trace[i], i, &o, &res[s]))
                return -1;
        }
        if (predict_steps(c[4], &after))
            return -1;
        *busy += after != before;
    }
    return 0;
}

/* The share a of b, 0 when b is. */
static double share(double a, double b)
{
    return b ? a / b : 0;
}

static void summarise(sys_result *r, const sys_result *naive, const trace_q *trace, int n)
{
    double sum = 0, gap_sum = 0, kind_sum[Q_KINDS] = {0};
    int n_gap = 0, n_kind[Q_KINDS] = {0};
    for (int i = 0; i < n; i++) {
        bool same = !strcmp(r->answers[i], naive->answers[i]);
        int k = trace[i].kind;
        sum += r->lat[i];
        if (trace[i].idle)
            gap_sum += r->lat[i], n_gap++;
        kind_sum[k] += r->lat[i];
        n_kind[k]++;
        r->same += same;
        if (r->outcome[i] == LLMS_RAG_QA_HIT)
            r->qa_kind[k]++, r->qa_same += same;
        if (r->outcome[i] == LLMS_RAG_QKV_HIT)
            r->qkv_kind[k]++, r->qkv_same += same;
    }
    r->mean = sum / n;
    r->after_gap_mean = n_gap ? gap_sum / n_gap : 0;
    r->other_mean = n > n_gap ? (sum - gap_sum) / (n - n_gap) : 0;
    for (int k = 0; k < Q_KINDS; k++)
        r->kind_mean[k] = n_kind[k] ? kind_sum[k] / n_kind[k] : 0;
    r->retrieve /= n;
    r->prefill = share(r->prefill, r->generated);
    r->decode = share(r->decode, r->generated);
    double *sorted = malloc(sizeof *sorted * (size_t)n);
    if (sorted) {
        memcpy(sorted, r->lat, sizeof *sorted * (size_t)n);
        qsort(sorted, (size_t)n, sizeof *sorted, bench_compare_doubles);
        r->p95 = sorted[(int)(0.95 * (n - 1))];
        free(sorted);
    }
}

/* One rag_latency line per system; reworded names the reworded questions. */
static int print_latency(llms_conn *const c[NSYS], const sys_result *res, const char *model,
                         int n_docs, const trace_q *trace, int n, const char *reworded,
                         int gap_ms, double tau)
{
    int n_kind[Q_KINDS] = {0};
    for (int i = 0; i < n; i++)
        n_kind[trace[i].kind]++;
    for (int s = 0; s < NSYS; s++) {
        const sys_result *sr = &res[s];
        llms_cache_stats st;
        if (llms_cache_stats_get(c[s], &st) != LLMS_OK) {
            fprintf(stderr, "rag: cache stats: %s\n", llms_last_error(c[s]));
            return -1;
        }
        printf("{\"bench\":\"rag_latency\",\"model\":\"%s\",\"system\":\"%s\",\"docs\":%d,"
               "\"queries\":%d,\"new\":%d,\"exact\":%d,\"%s\":%d,\"gap_ms\":%d,"
               "\"tau_query\":%g,\"mean_ms\":%.2f,\"after_gap_mean_ms\":%.2f,"
               "\"other_mean_ms\":%.2f,\"p95_ms\":%.2f,\"new_mean_ms\":%.2f,"
               "\"exact_mean_ms\":%.2f,\"%s_mean_ms\":%.2f,\"retrieve_ms\":%.2f,"
               "\"prefill_ms\":%.2f,\"decode_ms\":%.2f,\"qa_hit_rate\":%.3f,"
               "\"qkv_hit_rate\":%.3f,"
               "\"qa_hits_new_exact_%s\":[%d,%d,%d],\"qkv_hits_new_exact_%s\":[%d,%d,%d],"
               "\"reused_token_share\":%.3f,\"agree_with_naive\":%.3f,"
               "\"qa_hits_agree_with_naive\":%.3f,\"qkv_hits_agree_with_naive\":%.3f,"
               "\"mean_vs_naive\":%.3f,\"qa_entries\":%u,\"qkv_nodes\":%u,"
               "\"qkv_mib\":%.2f,\"predicted\":%llu,\"predict_prefilled\":%llu,"
               "\"predict_decoded\":%llu,\"predict_generations\":%llu,\"predict_warmed\":%llu,"
               "\"predict_steps\":%llu,\"population_idle_ms\":%.1f,"
               "\"predict_qa_hits\":%llu,\"predict_qkv_hits\":%llu}\n",
               model, sys_names[s], n_docs, n, n_kind[Q_NEW], n_kind[Q_EXACT], reworded,
               n_kind[Q_REWORDED], gap_ms, tau, sr->mean, sr->after_gap_mean, sr->other_mean,
               sr->p95, sr->kind_mean[Q_NEW], sr->kind_mean[Q_EXACT], reworded,
               sr->kind_mean[Q_REWORDED], sr->retrieve, sr->prefill, sr->decode,
               (double)sr->qa / n,
               (double)sr->qkv / n, reworded, sr->qa_kind[Q_NEW], sr->qa_kind[Q_EXACT],
               sr->qa_kind[Q_REWORDED], reworded, sr->qkv_kind[Q_NEW], sr->qkv_kind[Q_EXACT],
               sr->qkv_kind[Q_REWORDED], share(sr->reused, sr->prompt), (double)sr->same / n,
               share(sr->qa_same, sr->qa), share(sr->qkv_same, sr->qkv),
               sr->mean / res[0].mean, st.qa_entries, st.qkv_nodes, st.qkv_bytes / 1048576.0,
               (unsigned long long)st.predicted, (unsigned long long)st.predict_prefilled,
               (unsigned long long)st.predict_decoded,
               (unsigned long long)st.predict_generations,
               (unsigned long long)st.predict_warmed, (unsigned long long)st.predict_steps,
               st.predict_ms, (unsigned long long)st.predict_qa_hits,
               (unsigned long long)st.predict_qkv_hits);
    }
    fflush(stdout);
    return 0;
}

typedef struct opts {
    const char *model;      /* NULL: TinyStories-656K */
    int n_docs, n_queries, gap_ms, budget, idle_ms;
    double tau;
} opts;

/* The settings every system's daemon shares, model lines first; extra after them. */
static void daemon_conf(char *out, size_t cap, const char *models, double tau,
                        const char *extra)
{
    snprintf(out, cap,
             "%sthreads = 2\ntemperature = 0\nmax_tokens = 32\nrag_top_k = 3\n"
             "tau_query = %g\nkb_max_passages_per_uid = 100000\nkb_max_mb_per_uid = 256\n"
             "kb_max_add_bytes = 4194304\n%s",
             models, tau, extra);
}

/* The generated personal corpus on TinyStories-656K (or --model). */
static int story_main(const opts *o, const char *llmsd)
{
    const char *model = o->model ? o->model
                                 : "../shared/testdata/models/TinyStories-656K-Q8_0.gguf";
    int n_docs = o->n_docs, n_queries = o->n_queries, gap_ms = o->gap_ms;
    double tau = o->tau;
    if (access(model, R_OK) != 0) {
        fprintf(stderr, "rag: skipped: %s is absent\n", model);
        return 0;
    }
    char dir[] = "/tmp/llms-bench-XXXXXX", sock[NSYS][800], pconf[256], models[1100];
    char conf[NSYS][3000];
    snprintf(pconf, sizeof pconf, "predict_budget = %d\nidle_after_ms = %d\n"
                                  "predict_stride = 8\npredict_max_tokens = 24\n", o->budget,
             o->idle_ms);
    snprintf(models, sizeof models, "model = %s\n", model);
    for (int s = 0; s < NSYS; s++) {
        char extra[512];
        snprintf(extra, sizeof extra, "kb_passage_tokens = 96\nkb_overlap_tokens = 0\n"
                                      "qkv_cache_mb = 512\n%s", s == 4 ? pconf : "");
        daemon_conf(conf[s], sizeof conf[s], models, tau, extra);
    }
    int rc = 1;
    doc *docs = calloc((size_t)n_docs, sizeof *docs);
    trace_q *trace = calloc((size_t)n_queries, sizeof *trace);
    sys_result res[NSYS] = {0};
    llms_conn *c[NSYS] = {0};
    if (!mkdtemp(dir)) {
        fprintf(stderr, "rag: no temporary directory\n");
        return 1;
    }
    for (int s = 0; s < NSYS; s++) {
        if (sys_alloc(&res[s], n_queries) ||
            start_daemon(llmsd, dir, s, conf[s], sock[s], sizeof sock[s]) ||
            llms_connect(sock[s], &c[s], NULL) != LLMS_OK ||
            llms_bind(c[s], "bench-rag") != LLMS_OK ||
            llms_kb_create(c[s], "pim", 0, 0) != LLMS_OK) {
            fprintf(stderr, "rag: could not start llmsd %d\n", s);
            goto out;
        }
    }
    if (!docs || !trace)
        goto out;
    double t0 = bench_now_s();
    for (int s = 0; s < NSYS; s++)
        if (add_corpus(c[s], docs, n_docs, s == 0))
            goto out;
    fprintf(stderr, "rag: %d documents added to %d daemons in %.1f s\n", n_docs, NSYS,
            bench_now_s() - t0);
    if (recall(c[0], docs, n_docs, 200, model))
        goto out;
    /* the trace: a new question half the time, else an earlier one again (exact) or
     * reworded (paraphrase: same people, place and topic, other word order) */
    rng = 777;
    int *asked = calloc((size_t)n_queries, sizeof *asked);
    if (!asked)
        goto out;
    for (int i = 0; i < n_queries; i++) {
        int r = i ? rnd(10) : 0;
        trace[i].gap_ms = i % 6 == 0 ? gap_ms : 0;
        trace[i].idle = i % 6 == 0;
        if (r < 5) {
            asked[i] = rnd(n_docs);
            question(&docs[asked[i]], 0, trace[i].text, sizeof trace[i].text);
            trace[i].kind = Q_NEW;
        } else {
            int j = rnd(i);
            asked[i] = asked[j];
            question(&docs[asked[i]], r < 8 ? 0 : 1, trace[i].text, sizeof trace[i].text);
            trace[i].kind = r < 8 ? Q_EXACT : Q_REWORDED;
        }
    }
    free(asked);
    int overran, busy;
    if (run_trace(c, "pim", trace, n_queries, res, &overran, &busy))
        goto out;
    double best_baseline = 1e30;
    for (int s = 0; s < NSYS; s++) {
        summarise(&res[s], &res[0], trace, n_queries);
        if (s < 4 && res[s].mean < best_baseline)
            best_baseline = res[s].mean;
    }
    if (print_latency(c, res, model, n_docs, trace, n_queries, "paraphrase", gap_ms, tau))
        goto out;
    printf("{\"bench\":\"rag_target\",\"model\":\"%s\",\"tau_query\":%g,"
           "\"percache_vs_naive\":%.3f,\"percache_vs_best_baseline\":%.3f,"
           "\"prediction_overran_gaps\":%d,\"rounds_with_prediction\":%d,"
           "\"target_35pct_below_naive_and_below_best\":%s}\n",
           model, tau, res[4].mean / res[0].mean, res[4].mean / best_baseline, overran, busy,
           res[4].mean <= 0.65 * res[0].mean && res[4].mean < best_baseline ? "true" : "false");
    rc = 0;
out:
    for (int s = 0; s < NSYS; s++) {
        if (c[s])
            llms_close(c[s]);
        sys_free(&res[s], n_queries);
    }
    stop_daemons();
    free(trace);
    free(docs);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "rag: could not remove %s\n", dir);
    return rc;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: rag [--model PATH] [--docs N] [--queries N] [--tau X] [--gap-ms MS]\n"
            "           [--budget N] [--idle-ms MS]\n");
}

int main(int argc, char **argv)
{
    opts o = {.n_docs = 600, .n_queries = 60, .gap_ms = 1500, .budget = 24, .idle_ms = 300,
              .tau = 0.85};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool more = i + 1 < argc;
        if (!strcmp(a, "--model") && more)
            o.model = argv[++i];
        else if (!strcmp(a, "--docs") && more)
            o.n_docs = atoi(argv[++i]);
        else if (!strcmp(a, "--queries") && more)
            o.n_queries = atoi(argv[++i]);
        else if (!strcmp(a, "--tau") && more)
            o.tau = atof(argv[++i]);
        else if (!strcmp(a, "--gap-ms") && more)
            o.gap_ms = atoi(argv[++i]);
        else if (!strcmp(a, "--budget") && more)
            o.budget = atoi(argv[++i]);
        else if (!strcmp(a, "--idle-ms") && more)
            o.idle_ms = atoi(argv[++i]);
        else {
            usage();
            return 2;
        }
    }
    if (o.n_docs < 10 || o.n_docs > 5000 || o.n_queries < 4 || o.n_queries > 2000 ||
        o.gap_ms < 0 || o.gap_ms > 60000 || o.budget < 1 || o.idle_ms < 1) {
        fprintf(stderr, "rag: --docs 10..5000, --queries 4..2000, --gap-ms 0..60000, "
                        "--budget >= 1, --idle-ms >= 1\n");
        return 2;
    }
    char self[1024], llmsd[1100];
    snprintf(self, sizeof self, "%s", argv[0]);
    snprintf(llmsd, sizeof llmsd, "%s/../llmsd", dirname(self));
    if (access(llmsd, X_OK) != 0) {
        fprintf(stderr, "rag: %s is not built\n", llmsd);
        return 1;
    }
    return story_main(&o, llmsd);
}
