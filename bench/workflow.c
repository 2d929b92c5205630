/*
 * workflow — RAG workflow graphs (HedraRAG) against running their stages from the
 * client, as JSON lines on stdout.
 *
 *   workflow [--model PATH | --docs] [--requests N] [--runs R] [--template NAME[,NAME]]
 *            [--threads T] [--reuse-kv 0|1]
 *
 * Starts llmsd of the same build with the trained
 * ../shared/testdata/models/TinyStories-656K-Q8_0.gguf (or --model; skipped with a
 * message when absent), which generates and embeds, and fills a knowledge base with
 * 96 generated children's stories (of 2 passages each at kb_passage_tokens 48); the
 * questions ask what a child found where.
 * --docs runs the documentation models instead (under ../shared/testdata, or
 * $LLMS_TESTDATA; skipped with a message when a file is absent): docs-lm-21M-F16
 * generates and docs-embed-5M-F16, a registry model of its own (model.docs ... embed),
 * embeds; the knowledge base holds the passages of the first 1000 lines of
 * docs/pairs-train-sample.tsv, one document and one passage each, and the questions are
 * those lines' queries (headings, option names, API signatures). A request costs about
 * 0.2-0.3 s there (TinyStories': 7-10 ms): on 2 cores `--docs --requests 16 --runs 3
 * --template multistep,irg` took 10 minutes with nothing else running, and a load of 2-3
 * other processes doubled that (the time is about proportional to requests x runs).
 * For each built-in template (one-shot, hyde, multistep, irg, recomp; --template picks
 * some) four systems answer the same questions (greedy, the same max_tokens):
 *   sequential  one request at a time, its stages in order, each stage a client call
 *               (KbSearch, Complete), as a LangChain loop would: the graph's own state
 *               machine (daemon/graph/graph.h) runs in the client and decides the next stage;
 *   naive       the same client loop, requests concurrent (16 connections), so stages
 *               of different requests overlap but each is an opaque call;
 *   graph       GraphRun of the built-in template, requests concurrent (16 connections):
 *               the daemon advances every running graph each cycle, and a generation
 *               node starts from the KV of its run's previous one where their prompts
 *               begin alike (kv_reused_share: of the prompt tokens; --reuse-kv 0 turns
 *               this off in the daemon, graph_reuse_kv); no speculation;
 *   graph_speculative  the same with speculation (a generation node starts on its
 *               retrieval's estimate, a retrieval on its generation's first tokens; each
 *               kept or redone): its hit and rollback rates and the time kept work ran
 *               ahead are reported beside the throughput.
 * Requests arrive open-loop (Poisson; every system of a (rate, run) gets the same arrival
 * times) at rates that are multiples of the sequential
 * system's closed-loop capacity (measured first, per template); each (rate, system)
 * cell is run --runs times, the systems interleaved, and the median of the runs'
 * throughput and p50/p95 latency (arrival to answer) is reported. Then, per template,
 * throughput at an equal p95 bound (the sequential system's p95 when requests arrive at
 * its capacity: the best throughput among the cells whose p95 stays under it), the saturated
 * throughput (every request queued at once) and the answers' agreement with the
 * sequential system's (greedy: equal unless batching changed a rounding), and of the
 * speculative graph runs with the plain ones.
 *
 * Similarity-aware search (HedraRAG), per template whose requests retrieve more than
 * once: the knowledge base's passages and every retrieval query of the sequential runs
 * are embedded by the daemon, put in an IVF index here (storage/ivf.h, n / 8 lists, of
 * which the daemon's kb_ivf_nprobe, 16, are probed: all 12 of TinyStories'), and each
 * request's second and later queries are searched plainly, with the exact early stop,
 * and with the early stop and the lists of the request's previous top 20 as hints:
 * lists and vectors scanned, and whether any result differs from the plain search.
 */
#include <libgen.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench.h"
#include "client/llms.h"
#include "daemon/graph/graph.h"

#define POOL 16          /* connections of the concurrent systems */
#define MAX_TOKENS 24
#define N_RATES 4
static const double rate_factors[N_RATES] = {0.5, 1, 2, 4};

enum system { SEQUENTIAL, NAIVE, GRAPH, GRAPH_SPEC, N_SYSTEMS };
static const char *const system_names[N_SYSTEMS] = {"sequential", "naive_async", "graph",
                                                    "graph_speculative"};
#define MAX_QUERIES 8    /* retrieval queries a request's run keeps (similarity search) */

static const char *const names[] = {"Lily", "Tom", "Sam", "Mia", "Ben", "Anna", "Max", "Sue"};
static const char *const things[] = {"a red ball", "a big boat", "a little kite", "a toy car",
                                     "a blue hat", "a sweet cake", "a shiny stone", "a puppy"};
static const char *const places[] = {"park", "garden", "river", "forest", "beach", "school"};
#define N(a) ((int)(sizeof a / sizeof a[0]))

static char sock[1100];
static graph_limits limits = {.max_nodes = 32, .max_steps = 64};

/* The knowledge base: its name, the registry's embed model for it (NULL: the default),
 * its documents' texts and, in the documentation mode, each document's query (the
 * questions are those). */
static const char *kb_name = "stories", *embed_model;
static char **doc_text, **doc_query;
static int n_docs;

typedef struct request {
    char question[256];
    double arrival;      /* seconds after the cell's start */
    double latency;
    char *answer;
    int ok;
    char *queries[MAX_QUERIES]; /* sequential and naive: its retrievals' queries */
    int n_queries;
} request;

/* What a cell's graph runs report, summed (GraphResult's): speculation, and prompt
 * tokens of generation nodes with those taken from the run's previous node's KV. */
typedef struct graph_counts {
    atomic_long started, hits, rollbacks, saved_us;
    atomic_long prompt_tokens, reused_tokens;
} graph_counts;

typedef struct cell {
    enum system sys;
    const char *tmpl;
    request *req;
    int n;
    atomic_int next;
    double t0;
    graph_counts counts;
} cell;

/* The passages a retrieval node would give: KbSearch's texts, blank-line joined. */
static char *search(llms_conn *c, const char *query)
{
    const char *p = query;
    while (*p == ' ' || *p == '\n' || *p == '\t')
        p++;
    if (!*p)
        return strdup("");
    llms_kb_hit *hits;
    size_t n;
    if (llms_kb_search(c, kb_name, query, 0, LLMS_RETRIEVAL_RRF, &hits, &n) != LLMS_OK)
        return NULL;
    size_t len = 1;
    for (size_t i = 0; i < n; i++)
        len += strlen(hits[i].text ? hits[i].text : "") + 2;
    char *out = malloc(len);
    if (out) {
        out[0] = '\0';
        for (size_t i = 0; i < n; i++) {
            if (i)
                strcat(out, "\n\n");
            strcat(out, hits[i].text ? hits[i].text : "");
        }
    }
    llms_kb_hits_free(hits, n);
    return out;
}

/* A request's stages one client call each, the graph deciding the next (sequential and
 * naive); its retrieval queries are kept in rq. */
static int run_stages(llms_conn *c, const char *tmpl, request *rq)
{
    const char *question = rq->question;
    char **answer = &rq->answer;
    char err[ERR_MAX];
    graph *g = graph_builtin(tmpl, &limits, err);
    Llms__GraphVar v[2], *vp[2] = {&v[0], &v[1]};
    llms__graph_var__init(&v[0]);
    llms__graph_var__init(&v[1]);
    v[0].name = "question";
    v[0].value = (char *)question;
    v[1].name = "kb";
    v[1].value = (char *)kb_name;
    graph_run *r = g ? graph_run_new(g, vp, 2, limits.max_steps, err) : NULL;
    int node, rc = r ? 0 : -1;
    llms_params p;
    llms_params_init(&p);
    p.temperature = 0;
    p.max_tokens = MAX_TOKENS;
    while (rc == 0 && (node = graph_run_ready(r)) >= 0) {
        char *out = NULL;
        if (graph_def(g)->nodes[node]->kind == LLMS__GRAPH_NODE_KIND__GRAPH_RETRIEVE) {
            size_t len;
            char *query = graph_run_render(r, GRAPH_FIELD_QUERY, SIZE_MAX, &len);
            out = query ? search(c, query) : NULL;
            if (query && rq->n_queries < MAX_QUERIES)
                rq->queries[rq->n_queries++] = query;
            else
                free(query);
        } else {
            size_t len;
            char *prompt = graph_run_render(r, GRAPH_FIELD_PROMPT, SIZE_MAX, &len);
            llms_result res;
            if (prompt && llms_complete(c, prompt, NULL, 0, &p, NULL, NULL, &res) == LLMS_OK)
                out = res.text;
            free(prompt);
        }
        rc = out && graph_run_feed(r, out, strlen(out)) == 0 ? 0 : -1;
        free(out);
    }
    if (rc == 0)
        *answer = strdup(graph_run_var(r, "answer"));
    graph_run_free(r);
    graph_free(g);
    return rc == 0 && *answer ? 0 : -1;
}

static int run_graph(llms_conn *c, cell *cl, const char *question, char **answer)
{
    llms_graph_var in[2] = {{"question", question}, {"kb", kb_name}};
    llms_params p;
    llms_params_init(&p);
    p.temperature = 0;
    p.max_tokens = MAX_TOKENS;
    llms_graph_result r;
    if (llms_graph_run_speculate(c, cl->tmpl, in, 2, &p,
                                 cl->sys == GRAPH_SPEC ? LLMS_SPECULATE_ON : LLMS_SPECULATE_OFF,
                                 NULL, NULL, &r) != LLMS_OK)
        return -1;
    atomic_fetch_add(&cl->counts.started, r.speculations);
    atomic_fetch_add(&cl->counts.hits, r.spec_hits);
    atomic_fetch_add(&cl->counts.rollbacks, r.spec_rollbacks);
    atomic_fetch_add(&cl->counts.saved_us, (long)(r.spec_saved_ms * 1e3));
    atomic_fetch_add(&cl->counts.prompt_tokens, r.prompt_tokens);
    atomic_fetch_add(&cl->counts.reused_tokens, r.reused_tokens);
    *answer = r.output;
    r.output = NULL;
    llms_graph_result_free(&r);
    return 0;
}

static void *worker(void *arg)
{
    cell *cl = arg;
    llms_conn *c;
    if (llms_connect(sock, &c, NULL) != LLMS_OK)
        return NULL;
    if (llms_bind(c, "bench") != LLMS_OK) {
        llms_close(c);
        return NULL;
    }
    int i;
    while ((i = atomic_fetch_add(&cl->next, 1)) < cl->n) {
        request *rq = &cl->req[i];
        double wait = cl->t0 + rq->arrival - bench_now_s();
        if (wait > 0)
            usleep((useconds_t)(wait * 1e6));
        int rc = cl->sys >= GRAPH ? run_graph(c, cl, rq->question, &rq->answer)
                                  : run_stages(c, cl->tmpl, rq);
        rq->latency = bench_now_s() - (cl->t0 + rq->arrival);
        rq->ok = rc == 0;
        if (rc)
            fprintf(stderr, "workflow: %s %s: %s\n", system_names[cl->sys], cl->tmpl,
                    llms_last_error(c));
    }
    llms_close(c);
    return NULL;
}

/* xorshift64 on *state (nonzero) */
static double uniform(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return (double)(*state >> 11) / 9007199254740992.0;
}

/* The documentation mode's questions are the queries of documents spread over the
 * knowledge base (the pairs file groups its sources). */
static void make_questions(request *req, int n, int seed)
{
    for (int i = 0; i < n; i++) {
        if (doc_query) {
            snprintf(req[i].question, sizeof req[i].question, "%s",
                     doc_query[(i * 37 + seed * 13) % n_docs]);
            continue;
        }
        int k = (i * 7 + seed * 13) % (N(names) * N(places));
        snprintf(req[i].question, sizeof req[i].question, "What did %s find in the %s?",
                 names[k % N(names)], places[k / N(names) % N(places)]);
    }
}

typedef struct outcome {
    double throughput, p50, p95;
    int failed;
    long spec_started, spec_hits, spec_rollbacks;
    double spec_saved_ms;
    long prompt_tokens, reused_tokens;
} outcome;

/* Runs n requests arriving at rate (req/s; 0: all at once) on sys; answers stay in req.
 * The arrivals come from seed, so the systems of one (rate, run) face the same ones. */
static outcome run_cell(enum system sys, const char *tmpl, request *req, int n, double rate,
                        uint64_t seed)
{
    cell cl = {.sys = sys, .tmpl = tmpl, .req = req, .n = n};
    uint64_t rng = 0x2545f4914f6cdd1dULL ^ (seed * 0x9e3779b97f4a7c15ULL);
    double t = 0;
    for (int i = 0; i < n; i++) {
        free(req[i].answer);
        req[i].answer = NULL;
        req[i].ok = 0;
        for (int q = 0; q < req[i].n_queries; q++)
            free(req[i].queries[q]);
        req[i].n_queries = 0;
        req[i].arrival = t;
        if (rate > 0)
            t += -log(1 - uniform(&rng)) / rate;
    }
    int threads = sys == SEQUENTIAL ? 1 : POOL;
    pthread_t th[POOL];
    cl.t0 = bench_now_s() + 0.01;
    for (int i = 0; i < threads; i++)
        pthread_create(&th[i], NULL, worker, &cl);
    for (int i = 0; i < threads; i++)
        pthread_join(th[i], NULL);
    outcome o = {.spec_started = cl.counts.started, .spec_hits = cl.counts.hits,
                 .spec_rollbacks = cl.counts.rollbacks, .spec_saved_ms = cl.counts.saved_us / 1e3,
                 .prompt_tokens = cl.counts.prompt_tokens, .reused_tokens = cl.counts.reused_tokens};
    double lat[n > 0 ? n : 1], end = 0;
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (!req[i].ok) {
            o.failed++;
            continue;
        }
        lat[k++] = req[i].latency;
        if (req[i].arrival + req[i].latency > end)
            end = req[i].arrival + req[i].latency;
    }
    if (k) {
        o.throughput = k / end;
        o.p50 = bench_percentile(lat, k, 0.5);
        o.p95 = bench_percentile(lat, k, 0.95);
    }
    return o;
}

/* Median of each field over runs. */
static outcome median_outcome(outcome *o, int runs)
{
    double v[16];
    outcome m = {0};
    for (int f = 0; f < 3; f++) {
        for (int r = 0; r < runs; r++)
            v[r] = f == 0 ? o[r].throughput : f == 1 ? o[r].p50 : o[r].p95;
        double x = bench_median(v, runs);
        *(f == 0 ? &m.throughput : f == 1 ? &m.p50 : &m.p95) = x;
    }
    for (int r = 0; r < runs; r++) {
        m.failed += o[r].failed;
        m.spec_started += o[r].spec_started;
        m.spec_hits += o[r].spec_hits;
        m.spec_rollbacks += o[r].spec_rollbacks;
        m.spec_saved_ms += o[r].spec_saved_ms;
        m.prompt_tokens += o[r].prompt_tokens;
        m.reused_tokens += o[r].reused_tokens;
    }
    return m;
}

enum { STORIES = 96, DOC_PASSAGES = 1000 };

/* The knowledge base's documents of the TinyStories mode: generated stories (the
 * knowledge base cuts each into 2 passages at kb_passage_tokens 48). */
static int make_stories(void)
{
    doc_text = calloc(STORIES, sizeof *doc_text);
    if (!doc_text)
        return -1;
    for (int i = 0; i < STORIES; i++) {
        char text[256];
        snprintf(text, sizeof text,
                 "%s went to the %s. There %s found %s. %s was very happy and played with it "
                 "all day.", names[i % N(names)], places[i / N(names) % N(places)],
                 i % 2 ? "he" : "she", things[(i * 3) % N(things)], names[i % N(names)]);
        if (!(doc_text[n_docs++] = strdup(text)))
            return -1;
    }
    return 0;
}

/* The documentation mode's documents: the first DOC_PASSAGES lines of path
 * (query<TAB>passage after a header line), a passage a document, its query kept. */
static int read_pairs(const char *path)
{
    FILE *f = fopen(path, "r");
    doc_text = calloc(DOC_PASSAGES, sizeof *doc_text);
    doc_query = calloc(DOC_PASSAGES, sizeof *doc_query);
    if (!f || !doc_text || !doc_query) {
        fprintf(stderr, "workflow: %s: cannot read it\n", path);
        if (f)
            fclose(f);
        return -1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    bool header = true, ok = true;
    while (ok && n_docs < DOC_PASSAGES && (len = getline(&line, &cap, f)) > 0) {
        if (line[len - 1] == '\n')
            line[len - 1] = '\0';
        char *tab = strchr(line, '\t');
        if (header || !tab) {
            header = false;
            continue;
        }
        *tab = '\0';
        doc_query[n_docs] = strdup(line);
        doc_text[n_docs] = strdup(tab + 1);
        n_docs++;
        ok = doc_query[n_docs - 1] && doc_text[n_docs - 1];
    }
    free(line);
    fclose(f);
    if (!ok || n_docs < 2) {
        fprintf(stderr, "workflow: %s: %s\n", path,
                ok ? "fewer than 2 query<TAB>passage lines" : "out of memory");
        return -1;
    }
    return 0;
}

static void free_docs(void)
{
    for (int i = 0; i < n_docs; i++) {
        free(doc_text[i]);
        free(doc_query ? doc_query[i] : NULL);
    }
    free(doc_text);
    free(doc_query);
}

/* Creates the knowledge base (with its embed model) and adds every document, one call. */
static int fill_kb(void)
{
    llms_conn *c;
    if (llms_connect(sock, &c, NULL) != LLMS_OK || llms_bind(c, "bench") != LLMS_OK)
        return -1;
    llms_kb_options opt = {.embed_model = embed_model};
    int rc = llms_kb_create_opts(c, kb_name, &opt) == LLMS_OK ? 0 : -1;
    char (*id)[16] = calloc((size_t)n_docs, sizeof *id);
    llms_kb_doc *docs = calloc((size_t)n_docs, sizeof *docs);
    if (!id || !docs)
        rc = -1;
    for (int i = 0; rc == 0 && i < n_docs; i++) {
        snprintf(id[i], sizeof id[i], "d%d", i);
        docs[i] = (llms_kb_doc){id[i], doc_text[i], NULL};
    }
    double t0 = bench_now_s();
    uint32_t passages = 0;
    if (rc == 0 && llms_kb_add(c, kb_name, docs, (size_t)n_docs, &passages) != LLMS_OK)
        rc = -1;
    if (rc)
        fprintf(stderr, "workflow: knowledge base: %s\n", llms_last_error(c));
    else
        fprintf(stderr, "workflow: %d documents, %u passages, added in %.1f s\n", n_docs,
                passages, bench_now_s() - t0);
    free(id);
    free(docs);
    llms_close(c);
    return rc;
}

#define HINT_K 20        /* a request's recent results whose lists are its hints */
#define NPROBE 16        /* the daemon's kb_ivf_nprobe (above the lists: all) */

static int ivf_run(ivf *ix, const float *q, int n_q, int dim, bool early_stop,
                   const ivf_hints *hints, ivf_hit *hits, ivf_search_stats *st)
{
    ivf_search_params p = {.k = HINT_K, .nprobe = NPROBE, .early_stop = early_stop};
    return bench_ivf_search(ix, q, n_q, dim, &p, hints, hits, st);
}

/* The similarity-aware search savings on the template's requests' retrieval queries
 * (those of req, from the sequential system). */
static void similarity_savings(const char *tmpl, const request *req, int n)
{
    int n_q = 0, n_later = 0;
    for (int i = 0; i < n; i++) {
        n_q += req[i].n_queries;
        n_later += req[i].n_queries > 1 ? req[i].n_queries - 1 : 0;
    }
    if (n_later == 0) {
        printf("{\"bench\": \"workflow\", \"template\": \"%s\", \"similarity_search\": "
               "true, \"later_queries\": 0, \"note\": \"one retrieval per request: no "
               "hints\"}\n", tmpl);
        return;
    }
    llms_conn *c = NULL;
    llms_embeddings pe = {0}, qe = {0};
    const char **texts = malloc(sizeof *texts * (size_t)(n_q > n_docs ? n_q : n_docs));
    int64_t *ids = malloc(sizeof *ids * (size_t)n_docs);
    ivf *ix = NULL;
    float *later = NULL;
    ivf_hit *prev = NULL, *h[3] = {NULL, NULL, NULL};
    int32_t *lists = NULL;
    ivf_hints *hints = NULL;
    char err[ERR_MAX];
    if (!texts || !ids || llms_connect(sock, &c, NULL) != LLMS_OK ||
        llms_bind(c, "bench") != LLMS_OK)
        goto out;
    for (int i = 0; i < n_docs; i++)
        texts[i] = doc_text[i];
    if (llms_embed_model(c, embed_model, texts, (size_t)n_docs, LLMS_POOLING_MEAN, &pe) !=
        LLMS_OK)
        goto out;
    int k = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < req[i].n_queries; j++)
            texts[k++] = req[i].queries[j];
    if (llms_embed_model(c, embed_model, texts, (size_t)n_q, LLMS_POOLING_MEAN, &qe) != LLMS_OK)
        goto out;
    int dim = (int)pe.dim;
    for (int i = 0; i < n_docs; i++)
        ids[i] = i;
    ivf_train_params tp = {.nlist = n_docs / 8, .seed = 1};
    if (!(ix = ivf_new(dim, err)) || ivf_train(ix, pe.values, n_docs, dim, &tp, err) ||
        ivf_add(ix, ids, pe.values, n_docs, dim, err)) {
        fprintf(stderr, "workflow: ivf: %s\n", err);
        goto out;
    }
    /* each later query, and the one before it in its request (whose results hint) */
    later = malloc(sizeof *later * (size_t)n_later * dim * 2);
    prev = malloc(sizeof *prev * (size_t)n_later * HINT_K);
    lists = malloc(sizeof *lists * (size_t)n_later * HINT_K);
    hints = malloc(sizeof *hints * (size_t)n_later);
    for (int m = 0; m < 3; m++)
        h[m] = malloc(sizeof *h[m] * (size_t)n_later * HINT_K);
    if (!later || !prev || !lists || !hints || !h[0] || !h[1] || !h[2])
        goto out;
    float *before = later + (size_t)n_later * dim;
    int a = 0;
    k = 0;
    for (int i = 0; i < n; i++) {
        for (int j = 1; j < req[i].n_queries; j++, a++) {
            memcpy(later + (size_t)a * dim, qe.values + (size_t)(k + j) * dim,
                   sizeof *later * (size_t)dim);
            memcpy(before + (size_t)a * dim, qe.values + (size_t)(k + j - 1) * dim,
                   sizeof *later * (size_t)dim);
        }
        k += req[i].n_queries;
    }
    ivf_search_stats st[4];
    if (ivf_run(ix, before, n_later, dim, false, NULL, prev, &st[3]))
        goto out;
    for (a = 0; a < n_later; a++) {
        int nl = 0;
        for (int i = 0; i < HINT_K && prev[(size_t)a * HINT_K + i].id >= 0; i++)
            lists[(size_t)a * HINT_K + nl++] = prev[(size_t)a * HINT_K + i].list;
        hints[a] = (ivf_hints){lists + (size_t)a * HINT_K, nl};
    }
    static const char *const modes[3] = {"plain", "early_stop", "early_stop_hints"};
    int differ[3] = {0, 0, 0};
    for (int m = 0; m < 3; m++) {
        if (ivf_run(ix, later, n_later, dim, m > 0, m == 2 ? hints : NULL, h[m], &st[m]))
            goto out;
        for (size_t i = 0; i < (size_t)n_later * HINT_K; i++)
            differ[m] += h[m][i].id != h[0][i].id;
    }
    for (int m = 0; m < 3; m++)
        printf("{\"bench\": \"workflow\", \"template\": \"%s\", \"similarity_search\": "
               "true, \"mode\": \"%s\", \"passages\": %d, \"nlist\": %d, \"k\": %d, "
               "\"later_queries\": %d, \"lists_scanned\": %lld, \"lists_skipped\": %lld, "
               "\"vectors_scanned\": %lld, \"lists_ratio_to_plain\": %.3f, "
               "\"vectors_ratio_to_plain\": %.3f, \"results_differing_from_plain\": %d}\n",
               tmpl, modes[m], n_docs, ivf_nlist(ix), HINT_K, n_later,
               (long long)st[m].lists_scanned, (long long)st[m].lists_skipped,
               (long long)st[m].vectors_scanned,
               (double)st[m].lists_scanned / (double)st[0].lists_scanned,
               (double)st[m].vectors_scanned / (double)st[0].vectors_scanned, differ[m]);
    fflush(stdout);
out:
    if (c && !ix)
        fprintf(stderr, "workflow: similarity search: %s\n", llms_last_error(c));
    llms_close(c);
    llms_embeddings_free(&pe);
    llms_embeddings_free(&qe);
    ivf_free(ix);
    free(texts);
    free(ids);
    free(later);
    free(prev);
    free(lists);
    free(hints);
    for (int m = 0; m < 3; m++)
        free(h[m]);
}

static int bench_template(const char *tmpl, int n, int runs)
{
    request *req[N_SYSTEMS];
    for (int s = 0; s < N_SYSTEMS; s++) {
        req[s] = calloc((size_t)n, sizeof *req[s]);
        if (!req[s])
            return -1;
        make_questions(req[s], n, 1);
    }
    /* capacity of the sequential system: closed loop (all requests queued at once) */
    outcome cap[16];
    for (int r = 0; r < runs; r++)
        cap[r] = run_cell(SEQUENTIAL, tmpl, req[SEQUENTIAL], n, 0, 0);
    outcome seq_cap = median_outcome(cap, runs);
    /* the p95 bound: the sequential system's p95 when requests arrive at its capacity */
    double bound = 0;
    double at_bound[N_SYSTEMS] = {0}, saturated[N_SYSTEMS] = {0};
    int agree = 0, compared = 0, spec_agree = 0, spec_compared = 0;
    outcome spec_total = {0};
    static outcome results[N_RATES + 1][N_SYSTEMS][16];
    for (int k = 0; k < N_RATES + 1; k++) {
        /* the last "rate" is closed loop: every request queued at once (saturation) */
        double rate = k < N_RATES ? rate_factors[k] * seq_cap.throughput : 0;
        outcome o[N_SYSTEMS][16];
        for (int r = 0; r < runs; r++)
            for (int s = 0; s < N_SYSTEMS; s++)
                o[s][r] = run_cell((enum system)s, tmpl, req[s], n, rate,
                                   (uint64_t)(k * 16 + r + 1));
        outcome med[N_SYSTEMS];
        for (int s = 0; s < N_SYSTEMS; s++)
            med[s] = median_outcome(o[s], runs);
        if (k < N_RATES && rate_factors[k] == 1)
            bound = med[SEQUENTIAL].p95;
        for (int s = 0; s < N_SYSTEMS; s++) {
            outcome m = med[s];
            printf("{\"bench\": \"workflow\", \"template\": \"%s\", \"system\": \"%s\", "
                   "\"rate_rps\": %.3f, \"rate_x_sequential\": %.2f, \"requests\": %d, "
                   "\"runs\": %d, \"throughput_rps\": %.3f, \"p50_ms\": %.1f, \"p95_ms\": %.1f, "
                   "\"failed\": %d",
                   tmpl, system_names[s], rate, k < N_RATES ? rate_factors[k] : 0.0, n, runs,
                   m.throughput, m.p50 * 1e3, m.p95 * 1e3, m.failed);
            if (s == GRAPH_SPEC)
                printf(", \"speculations\": %ld, \"spec_hit_rate\": %.3f, "
                       "\"spec_rollback_rate\": %.3f, \"spec_saved_ms_per_request\": %.2f",
                       m.spec_started,
                       m.spec_started ? (double)m.spec_hits / (double)m.spec_started : 0,
                       m.spec_started ? (double)m.spec_rollbacks / (double)m.spec_started : 0,
                       m.spec_saved_ms / (double)(n * runs));
            if (s == GRAPH || s == GRAPH_SPEC)
                printf(", \"kv_reused_share\": %.3f",
                       m.prompt_tokens ? (double)m.reused_tokens / (double)m.prompt_tokens : 0);
            printf("}\n");
            spec_total.spec_started += s == GRAPH_SPEC ? m.spec_started : 0;
            spec_total.spec_hits += s == GRAPH_SPEC ? m.spec_hits : 0;
            spec_total.spec_rollbacks += s == GRAPH_SPEC ? m.spec_rollbacks : 0;
            if (k == N_RATES)
                saturated[s] = m.throughput;
        }
        for (int r = 0; r < runs; r++)
            for (int s = 0; s < N_SYSTEMS; s++)
                results[k][s][r] = o[s][r];
        for (int i = 0; i < n; i++) {
            for (int s = NAIVE; s < N_SYSTEMS; s++)
                if (req[SEQUENTIAL][i].ok && req[s][i].ok) {
                    compared++;
                    agree += !strcmp(req[SEQUENTIAL][i].answer, req[s][i].answer);
                }
            if (req[GRAPH][i].ok && req[GRAPH_SPEC][i].ok) {
                spec_compared++;
                spec_agree += !strcmp(req[GRAPH][i].answer, req[GRAPH_SPEC][i].answer);
            }
        }
        fflush(stdout);
    }
    for (int k = 0; k < N_RATES + 1; k++)
        for (int s = 0; s < N_SYSTEMS; s++) {
            outcome m = median_outcome(results[k][s], runs);
            if (m.failed == 0 && m.p95 <= bound && m.throughput > at_bound[s])
                at_bound[s] = m.throughput;
        }
    printf("{\"bench\": \"workflow\", \"template\": \"%s\", \"summary\": true, "
           "\"sequential_capacity_rps\": %.3f, \"p95_bound_ms\": %.1f, "
           "\"throughput_at_bound_rps\": {\"sequential\": %.3f, \"naive_async\": %.3f, "
           "\"graph\": %.3f}, \"graph_vs_sequential\": %.2f, \"graph_vs_naive_async\": %.2f, "
           "\"saturated_rps\": {\"sequential\": %.3f, \"naive_async\": %.3f, \"graph\": %.3f}, "
           "\"saturated_graph_vs_sequential\": %.2f, \"saturated_graph_vs_naive_async\": %.2f, "
           "\"answers_equal_to_sequential\": %.3f, ",
           tmpl, seq_cap.throughput, bound * 1e3, at_bound[SEQUENTIAL], at_bound[NAIVE],
           at_bound[GRAPH], at_bound[SEQUENTIAL] > 0 ? at_bound[GRAPH] / at_bound[SEQUENTIAL] : 0,
           at_bound[NAIVE] > 0 ? at_bound[GRAPH] / at_bound[NAIVE] : 0, saturated[SEQUENTIAL],
           saturated[NAIVE], saturated[GRAPH],
           saturated[SEQUENTIAL] > 0 ? saturated[GRAPH] / saturated[SEQUENTIAL] : 0,
           saturated[NAIVE] > 0 ? saturated[GRAPH] / saturated[NAIVE] : 0,
           compared ? (double)agree / compared : 0);
    printf("\"graph_speculative_rps\": {\"at_bound\": %.3f, \"saturated\": %.3f}, "
           "\"speculative_vs_graph\": {\"at_bound\": %.2f, \"saturated\": %.2f}, "
           "\"speculations\": %ld, \"spec_hit_rate\": %.3f, \"spec_rollback_rate\": %.3f, "
           "\"speculative_answers_equal_to_graph\": %.3f}\n",
           at_bound[GRAPH_SPEC], saturated[GRAPH_SPEC],
           at_bound[GRAPH] > 0 ? at_bound[GRAPH_SPEC] / at_bound[GRAPH] : 0,
           saturated[GRAPH] > 0 ? saturated[GRAPH_SPEC] / saturated[GRAPH] : 0,
           spec_total.spec_started,
           spec_total.spec_started ? (double)spec_total.spec_hits / spec_total.spec_started : 0,
           spec_total.spec_started ? (double)spec_total.spec_rollbacks / spec_total.spec_started
                                   : 0,
           spec_compared ? (double)spec_agree / spec_compared : 0);
    fflush(stdout);
    similarity_savings(tmpl, req[SEQUENTIAL], n);
    for (int s = 0; s < N_SYSTEMS; s++) {
        for (int i = 0; i < n; i++) {
            free(req[s][i].answer);
            for (int q = 0; q < req[s][i].n_queries; q++)
                free(req[s][i].queries[q]);
        }
        free(req[s]);
    }
    return 0;
}

/* Whether name is one of the comma-separated names of list (NULL: all). */
static bool picked(const char *list, const char *name)
{
    if (!list)
        return true;
    size_t len = strlen(name);
    for (const char *p = list;; p++) {
        if (!strncmp(p, name, len) && (p[len] == ',' || p[len] == '\0'))
            return true;
        if (!(p = strchr(p, ',')))
            return false;
    }
}

int main(int argc, char **argv)
{
    const char *model = NULL, *only = NULL;
    int n = 32, runs = 3, threads = 2, reuse_kv = 1, docs = 0, bad = 0;
    for (int i = 1; i < argc && !bad; i++) {
        const char *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--docs")) {
            docs = 1;
            continue;
        }
        if (!value)
            bad = 1;
        else if (!strcmp(argv[i], "--model"))
            model = value;
        else if (!strcmp(argv[i], "--requests"))
            n = atoi(value);
        else if (!strcmp(argv[i], "--runs"))
            runs = atoi(value);
        else if (!strcmp(argv[i], "--template"))
            only = value;
        else if (!strcmp(argv[i], "--threads"))
            threads = atoi(value);
        else if (!strcmp(argv[i], "--reuse-kv"))
            reuse_kv = atoi(value) != 0;
        else
            bad = 1;
        i++;
    }
    if (bad || (docs && model)) {
        fprintf(stderr, "usage: workflow [--model PATH | --docs] [--requests N] [--runs R] "
                        "[--template NAME[,NAME]] [--threads T] [--reuse-kv 0|1]\n");
        return 2;
    }
    int listed = 1, known = 0;
    for (const char *p = only; p && (p = strchr(p, ',')); p++)
        listed++;
    for (int t = 0; t < GRAPH_N_BUILTINS; t++)
        known += picked(only, graph_builtin_name(t));
    if (only && known != listed) {
        fprintf(stderr, "workflow: --template: built-in templates, each once:");
        for (int t = 0; t < GRAPH_N_BUILTINS; t++)
            fprintf(stderr, " %s", graph_builtin_name(t));
        fputc('\n', stderr);
        return 2;
    }
    if (n < 2 || runs < 1 || runs > 16 || threads < 1 || (docs && n > DOC_PASSAGES)) {
        fprintf(stderr, "workflow: --requests >= 2 (--docs: <= %d), --runs 1..16, "
                        "--threads >= 1\n", DOC_PASSAGES);
        return 2;
    }
    const char *testdata = getenv("LLMS_TESTDATA") ? getenv("LLMS_TESTDATA")
                                                   : "../shared/testdata";
    char model_buf[1024], embed_buf[1024], pairs[1024], models[2200];
    if (docs) {
        snprintf(model_buf, sizeof model_buf, "%s/models/docs-lm-21M-F16.gguf", testdata);
        snprintf(embed_buf, sizeof embed_buf, "%s/models/docs-embed-5M-F16.gguf", testdata);
        snprintf(pairs, sizeof pairs, "%s/docs/pairs-train-sample.tsv", testdata);
        const char *need[] = {model_buf, embed_buf, pairs};
        for (int i = 0; i < N(need); i++)
            if (access(need[i], R_OK) != 0) {
                fprintf(stderr, "workflow: skipped: %s is absent\n", need[i]);
                return 0;
            }
        /* docs-lm-21M generates; docs-embed-5M, a registry member of its own, embeds
         * the knowledge base's passages and the retrievals' queries */
        snprintf(models, sizeof models, "model = %s\nmodel.docs = %s embed\n", model_buf,
                 embed_buf);
        kb_name = "docs";
        embed_model = "docs";
        if (read_pairs(pairs))
            return 1;
    } else {
        if (!model) {
            snprintf(model_buf, sizeof model_buf, "%s/models/TinyStories-656K-Q8_0.gguf",
                     testdata);
            model = model_buf;
        }
        if (access(model, R_OK) != 0) {
            fprintf(stderr, "workflow: skipped: %s is absent\n", model);
            return 0;
        }
        snprintf(models, sizeof models, "model = %s\n", model);
        if (make_stories())
            return 1;
    }
    char self[1024], llmsd[1100], dir[] = "/tmp/llms-workflow-XXXXXX", conf[2600];
    if (!realpath(argv[0], self))
        snprintf(self, sizeof self, "%s", argv[0]);
    snprintf(llmsd, sizeof llmsd, "%s/../llmsd", dirname(self));
    if (access(llmsd, X_OK) != 0) {
        fprintf(stderr, "workflow: %s is not built\n", llmsd);
        return 1;
    }
    /* --docs: a document is one passage (the pairs' passages are at most 216 tokens of
     * tok8k); the similarity search embeds every document, and every query, in one call */
    snprintf(conf, sizeof conf,
             "%sthreads = %d\ntemperature = 0\nmax_tokens = %d\nrag_top_k = 2\n"
             "kb_passage_tokens = %d\nkb_overlap_tokens = 0\nmax_queued_per_app = 64\n"
             "max_queued_per_uid = 64\ntau_query = 2\nqkv_cache_mb = 0\ngraph_reuse_kv = %d\n"
             "embed_max_texts = %d\n",
             models, threads, MAX_TOKENS, docs ? 256 : 48, reuse_kv,
             n_docs > n * MAX_QUERIES ? n_docs : n * MAX_QUERIES);
    pid_t pid = mkdtemp(dir) ? bench_llmsd_start("workflow", llmsd, dir, conf, sock, sizeof sock)
                             : -1;
    if (pid < 0 || fill_kb()) {
        bench_llmsd_stop(pid);
        free_docs();
        return 1;
    }
    int rc = 0;
    for (int t = 0; t < GRAPH_N_BUILTINS && rc == 0; t++)
        if (picked(only, graph_builtin_name(t)))
            rc = bench_template(graph_builtin_name(t), n, runs);
    bench_llmsd_stop(pid);
    free_docs();
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "workflow: could not remove %s\n", dir);
    return rc ? 1 : 0;
}
