/*
 * rag — retrieval quality and RagQuery latency per cache level, as JSON lines on stdout.
 *
 *   rag [--model PATH] [--docs N] [--queries N] [--tau X] [--gap-ms MS] [--budget N]
 *       [--idle-ms MS]
 *   rag --doc-models [--recall | --percache] [--llamacpp-vectors QUERIES.json,PASSAGES.json]
 *       [--model PATH] [--docs N] [--queries N] [--tau X] [--gap-ms MS] [--budget N]
 *       [--idle-ms MS]
 *
 * Without --doc-models: starts llmsd of the same build on a temporary socket with the
 * trained ../shared/testdata/models/TinyStories-656K-Q8_0.gguf (or --model; skipped with
 * a message when absent), which generates and, as no embed_model is set, embeds. A
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
 *
 * With --doc-models: the documentation models of the test data ($LLMS_TESTDATA, else
 * ../shared/testdata; skipped with a message when a file is absent): docs-lm-21M-F16
 * generates (--model replaces it) and docs-embed-5M-F16, a registry member with the
 * embed role (`model.docs = ... embed`), embeds, mean pooled as its file says. Both
 * parts run unless one is named.
 *   --recall: one knowledge base of the 4000 passages of docs/pairs-train-sample.tsv,
 *      each a document whose id is its row (0 = the first after the header), with
 *      512-token passages and no overlap so that each document is exactly one passage
 *      (checked: passages == documents, reported). Every query is searched (KbSearch,
 *      top 10) by vector (the stored int8 vectors, exact search below
 *      kb_ivf_min_passages), BM25, RRF and normalised-sum fusion; recall@1 and @10 are
 *      the shares of queries whose own passage is first, in the top 10. As the file's
 *      name says, these are a sample of the embedding model's training pairs: its
 *      vectors find a query's passage far more often here than on held-out pairs
 *      (recall@10 0.99 against 0.64 on pairs-dev, where fusion with BM25 gains).
 *      Beside them the exact cosine recall of the daemon's own float vectors of the same
 *      texts (Embed: what the int8 storage changes), and, with --llamacpp-vectors, of
 *      llama.cpp's, made by
 *        llama-embedding -m docs-embed-5M-F16.gguf -f queries.txt --pooling mean
 *            --embd-output-format json -c 512 -b 512 -ub 512 --no-escape
 *      and the same for passages.txt, queries.txt and passages.txt being the tsv's two
 *      columns after the header, one text a line in row order. llama.cpp c392e5094 (Feb
 *      2025) reads pooling_type only from bert files, so mean pooling is named; and it
 *      reads escapes in a -f prompt unless given --no-escape (without it, the "\n" of 2
 *      queries and 8 passages split their lines: 4002 and 4010 vectors, refused here;
 *      21 queries and 44 passages more have other backslash sequences). The
 *      bench reads the files' "embedding" arrays itself (no JSON library), ranks all
 *      passages by exact cosine, and reports how close llama.cpp's vectors are to the
 *      daemon's. Targets printed: the daemon's dense recall@10 within 0.5 points of the
 *      llama.cpp vectors' recall@10, hybrid recall@10 above dense alone.
 *   --percache: the five systems above on a knowledge base of the first --docs (600)
 *      passages of the tsv, 512-token passages. A question stream of --queries (150)
 *      from those rows' queries, fixed seed: half new questions, a quarter exact repeats
 *      of earlier ones, a quarter near-duplicates (an earlier question with two
 *      neighbouring words swapped or, from three words on, one word left out); Poisson
 *      arrivals (exponential gaps, mean 400 ms), and before one query in eight on
 *      average a long idle gap of --idle-ms plus an exponential of mean --gap-ms (8000)
 *      in which PerCache predicts (idle_after_ms --idle-ms, 5000 by default: above the
 *      time between two of PerCache's queries when no long gap separates them).
 *      tau_query is chosen before the measured stream, on a tuning stream of 100
 *      questions from other rows of the same knowledge base (--tau X skips the choice):
 *      the QA-only system at each tau of 0.80, 0.85, 0.90, 0.95, 0.98, 0.99, 0.995 and
 *      0.999, an empty QA bank each: its QA hit rate and the share of QA hits equal to
 *      naive's answer; the smallest tau whose QA hits agree >= 95% is taken. PerCache's
 *      daemon starts once the choice is made, and the stream waits until its first idle
 *      period settles (the documents came well before the questions; predict_warm is
 *      the passage count, so every passage is prefilled as a prompt's first); the wait
 *      and the work done in it are reported. Targets printed: PerCache's mean and p95
 *      latency both at least 15% below the best baseline's (qkv_only, qa_only,
 *      qkv_and_qa; the best for each figure), every QKV-hit answer of every system equal
 *      to naive's (greedy), and PerCache's QA hits agreeing with naive's answers >= 95%.
 */
#include <ctype.h>
#include <errno.h>
#include <libgen.h>
#include <math.h>
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

/* The five systems' daemons, then the recall part's. */
#define NSYS 5
#define RECALL_DAEMON NSYS
static pid_t daemon_pid[NSYS + 1];

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
    for (int i = 0; i <= NSYS; i++)
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
 * earlier one reworded (a paraphrase, or a near-duplicate of a documentation query). */
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

/* One rag_latency line per system; kind names the reworded questions ("paraphrase",
 * "near_duplicate"). */
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
    const char *model;      /* NULL: the mode's */
    int n_docs, n_queries, gap_ms, budget, idle_ms;
    double tau;             /* < 0: the mode's (--doc-models: chosen on a tuning stream) */
    bool doc_models, recall, percache;
    const char *llamacpp;   /* QUERIES.json,PASSAGES.json or NULL */
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

/* ---- the documentation models (--doc-models) ---- */

#define DOC_EMBED "docs"            /* the embed model's registry name */
#define DOC_PASSAGE_TOKENS 512      /* above the longest passage of the tsv: one a document */
#define DOC_TUNING 100              /* questions of the stream that chooses tau_query */
#define DOC_ARRIVAL_MS 400          /* mean gap of the Poisson arrivals */
#define DOC_LONG_EVERY 8            /* a long idle gap before one query in this many */
#define DOC_SETTLE_MAX_S 1800       /* PerCache's first idle period may take this long */

static const double doc_taus[] = {0.80, 0.85, 0.90, 0.95, 0.98, 0.99, 0.995, 0.999};

/* The whole file at path, NUL-terminated, or NULL (errno says why). */
static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *b = NULL;
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (b = malloc((size_t)n + 1))) {
        if (fread(b, 1, (size_t)n, f) == (size_t)n) {
            b[n] = '\0';
        } else {
            free(b);
            b = NULL;
            errno = EIO;
        }
    }
    fclose(f);
    return b;
}

/* The rows of a pairs file: a header line, then query<TAB>passage lines. */
typedef struct pairs {
    char *buf;
    char **query, **passage;
    int n;
} pairs;

static void pairs_free(pairs *p)
{
    free(p->buf);
    free(p->query);
    free(p->passage);
}

static int pairs_read(const char *path, pairs *p)
{
    memset(p, 0, sizeof *p);
    if (!(p->buf = read_file(path))) {
        fprintf(stderr, "rag: %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t lines = 1;
    for (const char *s = p->buf; (s = strchr(s, '\n')); s++)
        lines++;
    p->query = calloc(lines, sizeof *p->query);
    p->passage = calloc(lines, sizeof *p->passage);
    char *line = strchr(p->buf, '\n');
    if (!p->query || !p->passage || !line) {
        fprintf(stderr, "rag: %s: no rows\n", path);
        return -1;
    }
    for (line++; *line;) {
        char *end = strchr(line, '\n'), *tab = strchr(line, '\t');
        if (end)
            *end = '\0';
        if (!tab || strchr(tab + 1, '\t')) {
            fprintf(stderr, "rag: %s: row %d is not query<TAB>passage\n", path, p->n);
            return -1;
        }
        *tab = '\0';
        p->query[p->n] = line;
        p->passage[p->n++] = tab + 1;
        if (!end)
            break;
        line = end + 1;
    }
    return 0;
}

static float dot(const float *a, const float *b, int dim)
{
    float s = 0;
    for (int i = 0; i < dim; i++)
        s += a[i] * b[i];
    return s;
}

static void normalise(float *v, int n, int dim)
{
    for (int i = 0; i < n; i++) {
        float *r = v + (size_t)i * dim, len = sqrtf(dot(r, r, dim));
        for (int j = 0; len > 0 && j < dim; j++)
            r[j] /= len;
    }
}

/* Exact cosine search of n unit query rows over n unit passage rows, query i's answer
 * being passage i: *at1, *at10 count the queries whose passage ranks first, in the top
 * 10 (fewer than 10 passages closer). */
static void exact_recall(const float *q, const float *p, int n, int dim, int *at1, int *at10)
{
    *at1 = *at10 = 0;
    for (int i = 0; i < n; i++) {
        const float *qi = q + (size_t)i * dim;
        float own = dot(qi, p + (size_t)i * dim, dim);
        int closer = 0;
        for (int j = 0; j < n && closer < 10; j++)
            closer += j != i && dot(qi, p + (size_t)j * dim, dim) > own;
        *at1 += closer == 0;
        *at10 += closer < 10;
    }
}

/* The n vectors of dim floats in a file of llama.cpp's `llama-embedding
 * --embd-output-format json`: objects {"object": "embedding", "index": I, "embedding":
 * [x, ...]} in its "data" array, I from 0 to n - 1 once each; made unit length. NULL
 * after saying why. */
static float *read_llamacpp(const char *path, int n, int dim)
{
    char *buf = read_file(path), *p = buf, *e;
    float *v = calloc((size_t)n * (size_t)dim, sizeof *v);
    bool *seen = calloc((size_t)n, sizeof *seen);
    const char *why = !buf ? strerror(errno) : !v || !seen ? "out of memory" : NULL;
    int rows = 0;
    while (!why && (p = strstr(p, "\"index\":"))) {
        long at = strtol(p + 8, &e, 10);
        if (e == p + 8 || at < 0 || at >= n || seen[at]) {
            /* made without --no-escape, llama-embedding splits a text at each "\n" */
            why = at >= n ? "more embeddings than texts (made without --no-escape?)"
                          : "an index missing or twice";
            break;
        }
        if (!(p = strstr(e, "\"embedding\":")) || !(p = strchr(p, '['))) {
            why = "an index without an embedding array";
            break;
        }
        int k = 0;
        for (p++;; p++) {
            while (isspace((unsigned char)*p))
                p++;
            if (*p == ']')
                break;
            float x = strtof(p, &e);
            if (e == p || k == dim) {
                why = k == dim ? "an embedding longer than the daemon's" : "not a number";
                break;
            }
            v[(size_t)at * dim + k++] = x;
            for (p = e; isspace((unsigned char)*p); p++)
                ;
            if (*p != ',' && *p != ']') {
                why = "no ',' or ']' after a number";
                break;
            }
            if (*p == ']')
                break;
        }
        if (!why && k != dim)
            why = "an embedding shorter than the daemon's";
        seen[at] = true;
        rows++;
    }
    if (!why && rows != n)
        why = "fewer embeddings than texts";
    free(buf);
    free(seen);
    if (why) {
        fprintf(stderr, "rag: %s: %s (%d of %d rows of %d floats read)\n", path, why, rows, n,
                dim);
        free(v);
        return NULL;
    }
    normalise(v, n, dim);
    return v;
}

/* The daemon's float vectors of n texts by the docs embedding model: (n, *dim). */
static float *embed_all(llms_conn *c, char *const *texts, int n, uint32_t *dim)
{
    float *v = NULL;
    for (int i = 0; i < n; i += 256) {
        int m = n - i < 256 ? n - i : 256;
        llms_embeddings e;
        if (llms_embed_model(c, DOC_EMBED, (const char *const *)(texts + i), (size_t)m,
                             LLMS_POOLING_MODEL, &e) != LLMS_OK) {
            fprintf(stderr, "rag: embed: %s\n", llms_last_error(c));
            free(v);
            return NULL;
        }
        if (!v) {
            *dim = e.dim;
            v = malloc(sizeof *v * (size_t)n * e.dim);
        }
        if (v)
            memcpy(v + (size_t)i * *dim, e.values, sizeof *v * (size_t)m * *dim);
        llms_embeddings_free(&e);
        if (!v)
            return NULL;
    }
    return v;
}

/* Creates knowledge base "docs" on c, embedded by the docs model, and adds rows [0, n)
 * of pp to it, each passage a document whose id is its row; *passages gets the passages
 * they made. */
static int doc_kb(llms_conn *c, const pairs *pp, int n, uint32_t *passages)
{
    llms_kb_options ko = {.passage_tokens = DOC_PASSAGE_TOKENS, .embed_model = DOC_EMBED};
    if (llms_kb_create_opts(c, "docs", &ko) != LLMS_OK) {
        fprintf(stderr, "rag: kb create: %s\n", llms_last_error(c));
        return -1;
    }
    *passages = 0;
    for (int i = 0; i < n; i += 200) {
        llms_kb_doc batch[200];
        char ids[200][16];
        int m = n - i < 200 ? n - i : 200;
        for (int j = 0; j < m; j++) {
            snprintf(ids[j], sizeof ids[j], "%d", i + j);
            batch[j] = (llms_kb_doc){ids[j], pp->passage[i + j], NULL};
        }
        uint32_t got;
        if (llms_kb_add(c, "docs", batch, (size_t)m, &got) != LLMS_OK) {
            fprintf(stderr, "rag: kb add: %s\n", llms_last_error(c));
            return -1;
        }
        *passages += got;
    }
    return 0;
}

/* Recall@1 and @10 of KbSearch with retrieval r over the n queries of pp, query i's
 * answer being document i; *ms gets the mean time of a search. */
static int kb_recall(llms_conn *c, const pairs *pp, enum llms_retrieval r, int *at1,
                     int *at10, double *ms)
{
    *at1 = *at10 = 0;
    double t0 = bench_now_s();
    for (int i = 0; i < pp->n; i++) {
        llms_kb_hit *hits;
        size_t n;
        if (llms_kb_search(c, "docs", pp->query[i], 10, r, &hits, &n) != LLMS_OK) {
            fprintf(stderr, "rag: search: %s\n", llms_last_error(c));
            return -1;
        }
        for (size_t h = 0; h < n; h++)
            if (atoi(hits[h].document) == i) {
                *at1 += h == 0;
                ++*at10;
                break;
            }
        llms_kb_hits_free(hits, n);
    }
    *ms = (bench_now_s() - t0) * 1e3 / pp->n;
    return 0;
}

/* Part 3 of the issue: retrieval recall over all rows of pp. */
static int doc_recall(const char *llmsd, const char *root, const char *models, const pairs *pp,
                      const char *llamacpp)
{
    static const char *const names[] = {"vector", "bm25", "rrf", "sum"};
    static const enum llms_retrieval modes[] = {LLMS_RETRIEVAL_VECTOR, LLMS_RETRIEVAL_BM25,
                                                LLMS_RETRIEVAL_RRF, LLMS_RETRIEVAL_SUM};
    char conf[3000], sock[800];
    /* overlap 0 is the daemon's setting (a KbCreate's 0 means the default) */
    daemon_conf(conf, sizeof conf, models, 0.85, "kb_overlap_tokens = 0\n");
    llms_conn *c = NULL;
    float *qv = NULL, *pv = NULL, *lq = NULL, *lp = NULL;
    int rc = -1, n = pp->n, at1[4], at10[4];
    if (start_daemon(llmsd, root, RECALL_DAEMON, conf, sock, sizeof sock) ||
        llms_connect(sock, &c, NULL) != LLMS_OK || llms_bind(c, "bench-rag") != LLMS_OK) {
        fprintf(stderr, "rag: could not start llmsd for the recall part\n");
        goto out;
    }
    double t0 = bench_now_s();
    uint32_t passages;
    if (doc_kb(c, pp, n, &passages))
        goto out;
    /* every document makes at least one passage: as many passages as documents is one
     * each, so a hit's document is its passage */
    printf("{\"bench\":\"rag_docs_kb\",\"embed_model\":\"docs-embed-5M-F16\",\"documents\":%d,"
           "\"passages\":%u,\"passage_tokens\":%d,\"overlap_tokens\":0,"
           "\"one_passage_per_document\":%s,\"add_s\":%.1f}\n",
           n, passages, DOC_PASSAGE_TOKENS, passages == (uint32_t)n ? "true" : "false",
           bench_now_s() - t0);
    fflush(stdout);
    for (int m = 0; m < 4; m++) {
        double ms;
        if (kb_recall(c, pp, modes[m], &at1[m], &at10[m], &ms))
            goto out;
        printf("{\"bench\":\"rag_docs_recall\",\"vectors\":\"llmsd_kb_int8\",\"retrieval\":\"%s\","
               "\"queries\":%d,\"passages\":%d,\"recall_at_1\":%.4f,\"recall_at_10\":%.4f,"
               "\"search_ms\":%.2f}\n",
               names[m], n, n, (double)at1[m] / n, (double)at10[m] / n, ms);
        fflush(stdout);
    }
    uint32_t dim = 0, pdim = 0;
    if (!(qv = embed_all(c, pp->query, n, &dim)) || !(pv = embed_all(c, pp->passage, n, &pdim)))
        goto out;
    int f1, f10;
    exact_recall(qv, pv, n, (int)dim, &f1, &f10);
    printf("{\"bench\":\"rag_docs_recall\",\"vectors\":\"llmsd_float\",\"retrieval\":"
           "\"exact_cosine\",\"queries\":%d,\"passages\":%d,\"dim\":%u,\"recall_at_1\":%.4f,"
           "\"recall_at_10\":%.4f}\n",
           n, n, dim, (double)f1 / n, (double)f10 / n);
    fflush(stdout);
    char qpath[1024] = "", *ppath = NULL;
    double l10 = -1;
    if (llamacpp) {
        snprintf(qpath, sizeof qpath, "%s", llamacpp);
        if ((ppath = strchr(qpath, ',')))
            *ppath++ = '\0';
        if (!ppath || !(lq = read_llamacpp(qpath, n, (int)dim)) ||
            !(lp = read_llamacpp(ppath, n, (int)dim))) {
            if (!ppath)
                fprintf(stderr, "rag: --llamacpp-vectors QUERIES.json,PASSAGES.json\n");
            goto out;
        }
        int l1, l10n;
        exact_recall(lq, lp, n, (int)dim, &l1, &l10n);
        l10 = (double)l10n / n;
        /* how far the daemon's vectors are from llama.cpp's, text by text */
        double sum = 0, min = 2;
        for (int i = 0; i < 2 * n; i++) {
            const float *a = i < n ? qv + (size_t)i * dim : pv + (size_t)(i - n) * dim;
            const float *b = i < n ? lq + (size_t)i * dim : lp + (size_t)(i - n) * dim;
            double cs = dot(a, b, (int)dim);
            sum += cs;
            min = cs < min ? cs : min;
        }
        printf("{\"bench\":\"rag_docs_recall\",\"vectors\":\"llamacpp\",\"retrieval\":"
               "\"exact_cosine\",\"queries\":%d,\"passages\":%d,\"recall_at_1\":%.4f,"
               "\"recall_at_10\":%.4f,\"cosine_to_llmsd_mean\":%.6f,"
               "\"cosine_to_llmsd_min\":%.6f}\n",
               n, n, (double)l1 / n, l10, sum / (2 * n), min);
    }
    double dense = (double)at10[0] / n;
    printf("{\"bench\":\"rag_docs_recall_target\",\"llmsd_dense_recall_at_10\":%.4f,", dense);
    if (l10 >= 0)
        printf("\"llamacpp_dense_recall_at_10\":%.4f,\"difference_points\":%.2f,"
               "\"target_dense_within_0.5_points_of_llamacpp\":%s,",
               l10, (dense - l10) * 100, fabs(dense - l10) * 100 <= 0.5 ? "true" : "false");
    else
        printf("\"llamacpp_dense_recall_at_10\":null,"
               "\"target_dense_within_0.5_points_of_llamacpp\":null,");
    printf("\"rrf_recall_at_10\":%.4f,\"sum_recall_at_10\":%.4f,"
           "\"target_rrf_above_dense\":%s,\"target_sum_above_dense\":%s}\n",
           (double)at10[2] / n, (double)at10[3] / n, at10[2] > at10[0] ? "true" : "false",
           at10[3] > at10[0] ? "true" : "false");
    fflush(stdout);
    rc = 0;
out:
    if (c)
        llms_close(c);
    bench_llmsd_stop(daemon_pid[RECALL_DAEMON]);
    daemon_pid[RECALL_DAEMON] = 0;
    free(qv);
    free(pv);
    free(lq);
    free(lp);
    return rc;
}

/* An index below n from *st. */
static int pick(uint64_t *st, int n)
{
    int i = (int)(bench_uniform(st) * n);
    return i < n ? i : n - 1;
}

/* A near-duplicate of question q into out (cap above q's length): two neighbouring
 * words swapped or, from three words on, one left out (even odds). false when q has one
 * word or the result is q. */
static bool near_duplicate(const char *q, char *out, size_t cap, uint64_t *st)
{
    char buf[256], *w[64], *save;
    int n = 0;
    snprintf(buf, sizeof buf, "%s", q);
    for (char *tok = strtok_r(buf, " ", &save); tok && n < 64; tok = strtok_r(NULL, " ", &save))
        w[n++] = tok;
    if (n < 2)
        return false;
    int drop = -1;
    if (n >= 3 && bench_uniform(st) < 0.5) {
        drop = pick(st, n);
    } else {
        int a = pick(st, n - 1);
        char *x = w[a];
        w[a] = w[a + 1];
        w[a + 1] = x;
    }
    size_t len = 0;
    out[0] = '\0';
    for (int i = 0; i < n && len < cap; i++)
        if (i != drop)
            len += (size_t)snprintf(out + len, cap - len, "%s%s", len ? " " : "", w[i]);
    return strcmp(out, q) != 0;
}

/* -mean ln(u): an exponential gap of that mean, in ms. */
static int exp_ms(uint64_t *st, double mean)
{
    return (int)(-mean * log(bench_uniform(st)));
}

/* Fills t[0..n) with questions from the queries of rows[0..n_rows) of pp, seeded by
 * seed: new ones (half) in row order, exact repeats (a quarter) and near-duplicates (a
 * quarter; an exact repeat when no earlier question has two words) of earlier new ones.
 * With idle_ms > 0, Poisson arrivals: gaps exponential of mean DOC_ARRIVAL_MS, and
 * before one query in DOC_LONG_EVERY on average an idle gap of idle_ms plus an
 * exponential of mean gap_ms; the first query comes after an idle period of its own.
 * *used gets the rows taken; -1 when they run out. */
static int doc_stream(trace_q *t, int n, const pairs *pp, const int *rows, int n_rows,
                      uint64_t seed, int idle_ms, int gap_ms, int *used)
{
    uint64_t st = seed;
    int *fresh = malloc(sizeof *fresh * (size_t)n), n_new = 0;
    if (!fresh)
        return -1;
    *used = 0;
    for (int i = 0; i < n; i++) {
        double u = bench_uniform(&st);
        int kind = i == 0 || u < 0.5 ? Q_NEW : u < 0.75 ? Q_EXACT : Q_REWORDED;
        if (kind == Q_REWORDED) {
            bool made = false;
            for (int tries = 0; tries < 20 && !made; tries++)
                made = near_duplicate(t[fresh[pick(&st, n_new)]].text, t[i].text,
                                      sizeof t[i].text, &st);
            kind = made ? Q_REWORDED : Q_EXACT;
        }
        if (kind == Q_EXACT)
            snprintf(t[i].text, sizeof t[i].text, "%s", t[fresh[pick(&st, n_new)]].text);
        if (kind == Q_NEW) {
            if (*used == n_rows) {
                fprintf(stderr, "rag: --docs too small for --queries: new questions need "
                                "more rows\n");
                free(fresh);
                return -1;
            }
            snprintf(t[i].text, sizeof t[i].text, "%s", pp->query[rows[(*used)++]]);
            fresh[n_new++] = i;
        }
        t[i].kind = kind;
        if (idle_ms > 0) {
            t[i].idle = i == 0 || bench_uniform(&st) < 1.0 / DOC_LONG_EVERY;
            t[i].gap_ms = i == 0 ? 0 : t[i].idle ? idle_ms + exp_ms(&st, gap_ms)
                                                  : exp_ms(&st, DOC_ARRIVAL_MS);
        }
    }
    free(fresh);
    return 0;
}

/* The QA-only system (qa) at each tau of doc_taus on stream t, an empty QA bank each:
 * its QA hit rate and the share of hits whose answer is naive's (from naive). *chosen
 * gets the smallest tau whose hits agree >= 95% (no hit: nothing wrong), else the
 * largest. */
static int tau_sweep(llms_conn *naive, llms_conn *qa, const trace_q *t, int n, double *chosen)
{
    sys_result ref = {0}, r = {0};
    int rc = -1;
    bool found = false;
    llms_rag_options no_cache = {.no_qa = 1, .no_qkv = 1}, qa_only = {.no_qkv = 1};
    if (sys_alloc(&ref, n) || sys_alloc(&r, n))
        goto out;
    for (int i = 0; i < n; i++)
        if (ask(naive, "docs", &t[i], i, &no_cache, &ref))
            goto out;
    *chosen = doc_taus[N(doc_taus) - 1];
    for (int k = 0; k < N(doc_taus); k++) {
        if (llms_cache_clear(qa) != LLMS_OK ||
            llms_cache_tune(qa, (float)doc_taus[k]) != LLMS_OK) {
            fprintf(stderr, "rag: cache: %s\n", llms_last_error(qa));
            goto out;
        }
        int hits = 0, agree = 0, near_hits = 0, near = 0;
        for (int i = 0; i < n; i++) {
            if (ask(qa, "docs", &t[i], i, &qa_only, &r))
                goto out;
            bool hit = r.outcome[i] == LLMS_RAG_QA_HIT;
            hits += hit;
            agree += hit && !strcmp(r.answers[i], ref.answers[i]);
            near += t[i].kind == Q_REWORDED;
            near_hits += hit && t[i].kind == Q_REWORDED;
        }
        double agreement = hits ? (double)agree / hits : 1;
        bool take = !found && agreement >= 0.95;
        if (take) {
            *chosen = doc_taus[k];
            found = true;
        }
        printf("{\"bench\":\"rag_docs_tau\",\"stream\":\"tuning\",\"queries\":%d,"
               "\"tau_query\":%g,\"qa_hit_rate\":%.3f,\"qa_hits\":%d,"
               "\"near_duplicate_qa_hits\":%d,\"near_duplicates\":%d,"
               "\"qa_hits_agree_with_naive\":%.3f,\"chosen\":%s}\n",
               n, doc_taus[k], (double)hits / n, hits, near_hits, near, agreement,
               take ? "true" : "false");
        fflush(stdout);
    }
    if (!found)
        printf("{\"bench\":\"rag_docs_tau\",\"stream\":\"tuning\",\"none_agrees_95pct\":true,"
               "\"tau_query\":%g,\"chosen\":true}\n", *chosen);
    rc = 0;
out:
    sys_free(&ref, n);
    sys_free(&r, n);
    return rc;
}

/* Waits for c's first idle period (idle_ms after its last request) to settle: no
 * prediction step for 2 s. *waited gets the seconds; -1 on error or past
 * DOC_SETTLE_MAX_S. */
static int prediction_settled(llms_conn *c, int idle_ms, double *waited)
{
    double t0 = bench_now_s();
    unsigned long long last = ~0ULL, steps;
    usleep((useconds_t)(idle_ms + 1000) * 1000);
    for (;;) {
        if (predict_steps(c, &steps))
            return -1;
        if (steps == last)
            break;
        if (bench_now_s() - t0 > DOC_SETTLE_MAX_S) {
            fprintf(stderr, "rag: PerCache's prediction still runs after %d s\n",
                    DOC_SETTLE_MAX_S);
            return -1;
        }
        last = steps;
        sleep(2);
    }
    *waited = bench_now_s() - t0;
    return 0;
}

/* Part 4 of the issue: the five systems on the documentation models. */
static int doc_percache(const opts *o, const char *llmsd, const char *root, const char *models,
                        const char *model_name, const pairs *pp)
{
    int n_docs = o->n_docs, n = o->n_queries, rc = -1, used, used_tuning;
    char pconf[400], conf[3000], sock[NSYS][800];
    /* the knowledge base's rows in a fixed random order: the tuning stream's new
     * questions from the front, the measured stream's after them */
    int *rows = malloc(sizeof *rows * (size_t)n_docs);
    trace_q *tune = calloc(DOC_TUNING, sizeof *tune), *trace = calloc((size_t)n, sizeof *trace);
    sys_result res[NSYS] = {0};
    llms_conn *c[NSYS] = {0};
    if (!rows || !tune || !trace)
        goto out;
    uint64_t st = 4242;
    for (int i = 0; i < n_docs; i++)
        rows[i] = i;
    for (int i = n_docs - 1; i > 0; i--) {
        int j = pick(&st, i + 1), x = rows[i];
        rows[i] = rows[j];
        rows[j] = x;
    }
    if (doc_stream(tune, DOC_TUNING, pp, rows, n_docs, 99, 0, 0, &used_tuning) ||
        doc_stream(trace, n, pp, rows + used_tuning, n_docs - used_tuning, 777, o->idle_ms,
                   o->gap_ms, &used))
        goto out;
    /* every system may keep the whole tree: QKV nodes of this model are 12 KiB a token */
    const char *kb_conf = "kb_overlap_tokens = 0\nqkv_cache_mb = 2048\ncache_owner_max_mb = 0\n";
    double tau = o->tau >= 0 ? o->tau : 0.85;
    daemon_conf(conf, sizeof conf, models, tau, kb_conf);
    double t0 = bench_now_s();
    for (int s = 0; s < NSYS; s++) {
        uint32_t passages;
        if (sys_alloc(&res[s], n))
            goto out;
        if (s == 4)
            continue;
        if (start_daemon(llmsd, root, s, conf, sock[s], sizeof sock[s]) ||
            llms_connect(sock[s], &c[s], NULL) != LLMS_OK ||
            llms_bind(c[s], "bench-rag") != LLMS_OK || doc_kb(c[s], pp, n_docs, &passages)) {
            fprintf(stderr, "rag: could not start llmsd %d\n", s);
            goto out;
        }
    }
    fprintf(stderr, "rag: %d passages added to 4 daemons in %.1f s\n", n_docs,
            bench_now_s() - t0);
    if (o->tau < 0) {
        t0 = bench_now_s();
        if (tau_sweep(c[0], c[2], tune, DOC_TUNING, &tau))
            goto out;
        fprintf(stderr, "rag: tau_query %g chosen in %.1f s\n", tau, bench_now_s() - t0);
    }
    if (llms_cache_clear(c[2]) != LLMS_OK || llms_cache_tune(c[2], (float)tau) != LLMS_OK ||
        llms_cache_tune(c[3], (float)tau) != LLMS_OK) {
        fprintf(stderr, "rag: cache: %s\n", llms_last_error(c[3]));
        goto out;
    }
    /* PerCache comes last, its documents well before the questions: its first idle
     * period prefills every passage as a prompt's first (predict_warm) */
    snprintf(pconf, sizeof pconf, "%spredict_budget = %d\nidle_after_ms = %d\n"
                                  "predict_stride = 8\npredict_max_tokens = 24\n"
                                  "predict_warm = %d\n", kb_conf, o->budget, o->idle_ms, n_docs);
    daemon_conf(conf, sizeof conf, models, tau, pconf);
    uint32_t passages;
    double settle_s;
    llms_cache_stats cs;
    if (start_daemon(llmsd, root, 4, conf, sock[4], sizeof sock[4]) ||
        llms_connect(sock[4], &c[4], NULL) != LLMS_OK ||
        llms_bind(c[4], "bench-rag") != LLMS_OK || doc_kb(c[4], pp, n_docs, &passages) ||
        prediction_settled(c[4], o->idle_ms, &settle_s) ||
        llms_cache_stats_get(c[4], &cs) != LLMS_OK) {
        fprintf(stderr, "rag: PerCache's llmsd: %s\n", c[4] ? llms_last_error(c[4]) : "");
        goto out;
    }
    printf("{\"bench\":\"rag_docs_first_idle\",\"system\":\"percache\",\"docs\":%d,"
           "\"passages\":%u,\"settled_s\":%.1f,\"predict_warmed\":%llu,\"predicted\":%llu,"
           "\"predict_generations\":%llu,\"population_idle_ms\":%.1f,\"qkv_nodes\":%u,"
           "\"qkv_mib\":%.2f,\"qa_entries\":%u}\n",
           n_docs, passages, settle_s, (unsigned long long)cs.predict_warmed,
           (unsigned long long)cs.predicted, (unsigned long long)cs.predict_generations,
           cs.predict_ms, cs.qkv_nodes, cs.qkv_bytes / 1048576.0, cs.qa_entries);
    fflush(stdout);
    int overran, busy;
    t0 = bench_now_s();
    if (run_trace(c, "docs", trace, n, res, &overran, &busy))
        goto out;
    fprintf(stderr, "rag: %d queries on 5 systems in %.1f s\n", n, bench_now_s() - t0);
    int best_mean = 1, best_p95 = 1, qkv = 0, qkv_same = 0;
    for (int s = 0; s < NSYS; s++) {
        summarise(&res[s], &res[0], trace, n);
        qkv += res[s].qkv;
        qkv_same += res[s].qkv_same;
    }
    for (int s = 2; s < 4; s++) {
        best_mean = res[s].mean < res[best_mean].mean ? s : best_mean;
        best_p95 = res[s].p95 < res[best_p95].p95 ? s : best_p95;
    }
    if (print_latency(c, res, model_name, n_docs, trace, n, "near_duplicate", o->gap_ms, tau))
        goto out;
    const sys_result *pc = &res[4];
    double vs_mean = pc->mean / res[best_mean].mean, vs_p95 = pc->p95 / res[best_p95].p95;
    double qa_agree = share(pc->qa_same, pc->qa);
    printf("{\"bench\":\"rag_docs_target\",\"model\":\"%s\",\"tau_query\":%g,"
           "\"tau_chosen_by\":\"%s\",\"percache_mean_ms\":%.2f,\"best_baseline_mean_ms\":%.2f,"
           "\"best_baseline_for_mean\":\"%s\",\"percache_vs_best_mean\":%.3f,"
           "\"percache_p95_ms\":%.2f,\"best_baseline_p95_ms\":%.2f,"
           "\"best_baseline_for_p95\":\"%s\",\"percache_vs_best_p95\":%.3f,"
           "\"prediction_overran_gaps\":%d,\"rounds_with_prediction\":%d,"
           "\"target_mean_and_p95_15pct_below_best\":%s,\"qkv_hits_all_systems\":%d,"
           "\"qkv_hits_equal_naive\":%d,\"target_qkv_answers_equal_naive\":%s,"
           "\"percache_qa_hits\":%d,\"percache_qa_hits_agree_with_naive\":%.3f,"
           "\"target_qa_agree_95pct\":%s}\n",
           model_name, tau, o->tau >= 0 ? "--tau" : "tuning stream", pc->mean,
           res[best_mean].mean, sys_names[best_mean], vs_mean, pc->p95, res[best_p95].p95,
           sys_names[best_p95], vs_p95, overran, busy,
           vs_mean <= 0.85 && vs_p95 <= 0.85 ? "true" : "false", qkv, qkv_same,
           qkv_same == qkv ? "true" : "false", pc->qa, qa_agree,
           qa_agree >= 0.95 ? "true" : "false");
    fflush(stdout);
    rc = 0;
out:
    for (int s = 0; s < NSYS; s++) {
        if (c[s])
            llms_close(c[s]);
        sys_free(&res[s], n);
    }
    stop_daemons();
    free(rows);
    free(tune);
    free(trace);
    return rc;
}

/* The documentation models' parts; skipped when the test data lacks a file. */
static int doc_main(const opts *o, const char *llmsd)
{
    const char *data = getenv("LLMS_TESTDATA") ? getenv("LLMS_TESTDATA") : "../shared/testdata";
    char gen[1024], emb[1024], tsv[1024], models[2200], name[256];
    if (o->model)
        snprintf(gen, sizeof gen, "%s", o->model);
    else
        snprintf(gen, sizeof gen, "%s/models/docs-lm-21M-F16.gguf", data);
    snprintf(emb, sizeof emb, "%s/models/docs-embed-5M-F16.gguf", data);
    snprintf(tsv, sizeof tsv, "%s/docs/pairs-train-sample.tsv", data);
    const char *need[] = {gen, emb, tsv};
    for (int i = 0; i < 3; i++)
        if (access(need[i], R_OK) != 0) {
            fprintf(stderr, "rag: skipped: %s is absent (set LLMS_TESTDATA to the test data)\n",
                    need[i]);
            return 0;
        }
    /* the generator's registry name: its file name without .gguf */
    const char *base = strrchr(gen, '/') ? strrchr(gen, '/') + 1 : gen;
    size_t len = strlen(base);
    if (len > 5 && !strcmp(base + len - 5, ".gguf"))
        len -= 5;
    snprintf(name, sizeof name, "%.*s", (int)len, base);
    snprintf(models, sizeof models, "model = %s\nmodel." DOC_EMBED " = %s embed\n", gen, emb);
    pairs pp;
    if (pairs_read(tsv, &pp)) {
        pairs_free(&pp);
        return 1;
    }
    if (o->n_docs > pp.n) {
        fprintf(stderr, "rag: --docs %d: the tsv has %d rows\n", o->n_docs, pp.n);
        pairs_free(&pp);
        return 2;
    }
    char root[] = "/tmp/llms-bench-XXXXXX";
    if (!mkdtemp(root)) {
        fprintf(stderr, "rag: no temporary directory\n");
        pairs_free(&pp);
        return 1;
    }
    int rc = 0;
    double t0 = bench_now_s();
    if (o->recall) {
        rc = doc_recall(llmsd, root, models, &pp, o->llamacpp);
        fprintf(stderr, "rag: recall part %.1f s\n", bench_now_s() - t0);
    }
    if (rc == 0 && o->percache) {
        t0 = bench_now_s();
        rc = doc_percache(o, llmsd, root, models, name, &pp);
        fprintf(stderr, "rag: PerCache part %.1f s\n", bench_now_s() - t0);
    }
    stop_daemons();
    pairs_free(&pp);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0)
        fprintf(stderr, "rag: could not remove %s\n", root);
    return rc ? 1 : 0;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: rag [--model PATH] [--docs N] [--queries N] [--tau X] [--gap-ms MS]\n"
            "           [--budget N] [--idle-ms MS]\n"
            "       rag --doc-models [--recall | --percache]\n"
            "           [--llamacpp-vectors QUERIES.json,PASSAGES.json] [--model PATH]\n"
            "           [--docs N] [--queries N] [--tau X] [--gap-ms MS] [--budget N]\n"
            "           [--idle-ms MS]\n");
}

int main(int argc, char **argv)
{
    opts o = {.n_docs = -1, .n_queries = -1, .gap_ms = -1, .budget = 24, .idle_ms = -1,
              .tau = -1};
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
        else if (!strcmp(a, "--llamacpp-vectors") && more)
            o.llamacpp = argv[++i];
        else if (!strcmp(a, "--doc-models"))
            o.doc_models = true;
        else if (!strcmp(a, "--recall"))
            o.recall = true;
        else if (!strcmp(a, "--percache"))
            o.percache = true;
        else {
            usage();
            return 2;
        }
    }
    if (!o.doc_models && (o.recall || o.percache || o.llamacpp)) {
        usage();
        return 2;
    }
    if (!o.recall && !o.percache)
        o.recall = o.percache = true;
    if (o.n_docs < 0)
        o.n_docs = 600;
    if (o.n_queries < 0)
        o.n_queries = o.doc_models ? 150 : 60;
    if (o.gap_ms < 0)
        o.gap_ms = o.doc_models ? 8000 : 1500;
    if (o.idle_ms < 0)
        o.idle_ms = o.doc_models ? 5000 : 300;
    if (o.tau < 0 && !o.doc_models)
        o.tau = 0.85;
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
    return o.doc_models ? doc_main(&o, llmsd) : story_main(&o, llmsd);
}
