/*
 * speculate — decode throughput with speculative decoding off, by prompt lookup, by a
 * draft model and both, as JSON lines on stdout.
 *
 *   speculate [--testdata DIR] [--runs R] [--requests N] [--tokens T] [--tinyllama]
 *             [--workload rag|free] [--streams 1|8] [--systems LIST]
 *
 * Starts llmsd of the same build with the trained documentation models of DIR
 * (../shared/testdata by default; skipped with a message when absent): docs-lm-21M-F16
 * generates, docs-draft-5M-F16 drafts (`draft_model`), docs-embed-5M-F16 embeds. Every
 * request names its speculation (llms_params.speculation), so the four systems share one
 * daemon, one set of requests and the same load. Two workloads, all greedy with
 * max_tokens T (96):
 *   rag   RagQuery over a knowledge base of the first 200 passages of
 *         docs/pairs-dev.tsv, its questions those passages' queries (top 2 passages;
 *         the QA bank and QKV tree off per request, so every answer is generated and
 *         no system reuses another's work): answers that quote their passages;
 *   free  Complete of 700-byte prefixes of docs/heldout.txt's paragraphs: text that
 *         rarely repeats its prompt.
 * Each runs single stream (N requests, 8 by default, one after another) and with 8
 * streams (8 connections, N requests each, concurrently). A cell (workload, streams,
 * system) is run R times (3), the systems in a rotating order within each run, and
 * reports the median tokens per second (generated tokens over wall time) and decode
 * tokens per second of a stream (over the daemon's decode time of its requests: the
 * prefill and retrieval left out), each with its ratio to off in the same run, the
 * daemon's counters for the cell (drafts proposed, accepted, the mean accepted per
 * proposal), and whether every answer equals off's (greedy: it must). With --tinyllama the same is run with random weights of TinyLlama-1.1B's shape
 * (Q8_0, generated under build/bench-models/ by mkmodel's code) and a 2-layer draft of
 * the same vocabulary: speed only (random weights repeat themselves, so acceptance says
 * little), free generation, fewer tokens. --workload, --streams and --systems (names,
 * comma-separated; off runs always) measure a part. The systems share the daemon's
 * measurements of which source pays (spec_gate), so a part may not give the figures it
 * gives in the whole run. Targets (issue 39): rag single-stream decode >= 1.8x with
 * lookup; never below 0.95x in any cell, end to end or decode.
 */
#include <libgen.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench/bench.h"
#include "client/llms.h"
#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"

#define N_SYS 4
#define STREAMS 8
#define MAX_REQ 64
#define N_PASSAGES 200

static const char *const sys_names[N_SYS] = {"off", "lookup", "draft", "both"};
static const int sys_modes[N_SYS] = {LLMS_SPECULATION_OFF, LLMS_SPECULATION_LOOKUP,
                                     LLMS_SPECULATION_DRAFT, LLMS_SPECULATION_BOTH};

typedef struct workload {
    const char *name;
    bool rag;
    char *prompts[MAX_REQ * STREAMS];
    int n;                 /* prompts: N per stream, STREAMS of them */
} workload;

/* One stream's run: its requests, the answers, the tokens. */
typedef struct stream {
    const char *sock;
    const workload *wl;
    int first, n;          /* its prompts */
    int mode, tokens;
    char **answers;        /* (n) */
    long generated;
    double decode_ms;      /* the daemon's decode time of its requests */
    int failed;
    pthread_t thread;
} stream;

static int ask(llms_conn *c, const workload *wl, const char *prompt, int mode, int tokens,
               char **answer, long *generated, double *decode_ms)
{
    llms_params p;
    llms_params_init(&p);
    p.temperature = 0;
    p.max_tokens = tokens;
    p.speculation = mode;
    if (wl->rag) {
        llms_rag_options o = {.top_k = 2, .params = &p, .no_qa = 1, .no_qkv = 1};
        llms_rag_result r;
        if (llms_rag_query(c, "docs", prompt, &o, NULL, NULL, &r) != LLMS_OK)
            return -1;
        *answer = strdup(r.text ? r.text : "");
        *generated += r.generated_tokens;
        *decode_ms += r.decode_ms;
        llms_rag_result_free(&r);
    } else {
        llms_result r;
        if (llms_complete(c, prompt, NULL, 0, &p, NULL, NULL, &r) != LLMS_OK)
            return -1;
        *answer = strdup(r.text ? r.text : "");
        *generated += r.generated_tokens;
        *decode_ms += r.decode_ms;
        llms_result_free(&r);
    }
    return *answer ? 0 : -1;
}

static void *stream_run(void *arg)
{
    stream *st = arg;
    llms_conn *c;
    if (llms_connect(st->sock, &c, NULL) != LLMS_OK || llms_bind(c, "bench-spec") != LLMS_OK) {
        st->failed = 1;
        return NULL;
    }
    for (int i = 0; i < st->n && !st->failed; i++)
        if (ask(c, st->wl, st->wl->prompts[st->first + i], st->mode, st->tokens,
                &st->answers[i], &st->generated, &st->decode_ms)) {
            fprintf(stderr, "speculate: %s\n", llms_last_error(c));
            st->failed = 1;
        }
    llms_close(c);
    return NULL;
}

/* The status counters of the drafts (lookup and draft model summed). */
static int counters(const char *sock, uint64_t v[3])
{
    llms_conn *c;
    llms_daemon_status st;
    if (llms_connect(sock, &c, NULL) != LLMS_OK)
        return -1;
    int rc = llms_status_get(c, &st) == LLMS_OK ? 0 : -1;
    if (rc == 0) {
        v[0] = st.spec_lookup_steps + st.spec_draft_steps;
        v[1] = st.spec_lookup_proposed + st.spec_draft_proposed;
        v[2] = st.spec_lookup_accepted + st.spec_draft_accepted;
        llms_daemon_status_free(&st);
    }
    llms_close(c);
    return rc;
}

typedef struct cell {
    double tps[16];        /* per run: generated tokens over the wall time */
    double decode_tps[16]; /* per run: a stream's tokens over its decode time */
    uint64_t steps, proposed, accepted;
    int same, answers;     /* answers equal to off's, of */
} cell;

/* One run of a system: streams x per_stream requests; tokens per second (over the wall
 * time, and a stream's over its requests' decode time: prefill and retrieval left out),
 * and the answers (answers[stream * per_stream + i], to free). */
static int run_system(const char *sock, const workload *wl, int streams, int per_stream,
                      int mode, int tokens, char **answers, double *tps, double *decode_tps)
{
    stream st[STREAMS];
    double t0 = bench_now_s();
    for (int s = 0; s < streams; s++) {
        st[s] = (stream){.sock = sock, .wl = wl, .first = s * per_stream, .n = per_stream,
                         .mode = mode, .tokens = tokens, .answers = answers + s * per_stream};
        if (pthread_create(&st[s].thread, NULL, stream_run, &st[s]))
            return -1;
    }
    long generated = 0;
    double decode_ms = 0;
    int failed = 0;
    for (int s = 0; s < streams; s++) {
        pthread_join(st[s].thread, NULL);
        generated += st[s].generated;
        decode_ms += st[s].decode_ms;
        failed |= st[s].failed;
    }
    *tps = generated / (bench_now_s() - t0);
    *decode_tps = decode_ms > 0 ? generated / (decode_ms / 1000) : 0;
    return failed ? -1 : 0;
}

/* What a run measures: the stream counts and systems (bits, 1 << index of sys_names;
 * off, the baseline, always). */
typedef struct selection {
    int streams;      /* 0: both 1 and STREAMS */
    unsigned systems;
} selection;

static int run_workload(const char *model, const char *sock, const workload *wl, int runs,
                        int per_stream, int tokens, const selection *sel)
{
    static const int stream_counts[] = {1, STREAMS};
    for (int sc = 0; sc < 2; sc++) {
        int streams = stream_counts[sc], n = streams * per_stream;
        if (sel->streams && sel->streams != streams)
            continue;
        cell cells[N_SYS] = {0};
        char **answers[N_SYS];
        for (int k = 0; k < N_SYS; k++)
            if (!(answers[k] = calloc((size_t)n, sizeof *answers[k])))
                return -1;
        for (int r = 0; r < runs; r++)
            for (int j = 0; j < N_SYS; j++) {
                int k = (j + r) % N_SYS;
                uint64_t before[3], after[3];
                if (!(sel->systems & 1u << k))
                    continue;
                for (int i = 0; i < n; i++) {
                    free(answers[k][i]);
                    answers[k][i] = NULL;
                }
                if (counters(sock, before) ||
                    run_system(sock, wl, streams, per_stream, sys_modes[k], tokens, answers[k],
                               &cells[k].tps[r], &cells[k].decode_tps[r]) ||
                    counters(sock, after))
                    return -1;
                cells[k].steps += after[0] - before[0];
                cells[k].proposed += after[1] - before[1];
                cells[k].accepted += after[2] - before[2];
            }
        double off = bench_median(cells[0].tps, runs),
               off_decode = bench_median(cells[0].decode_tps, runs);
        bool never_below = true;
        for (int k = 0; k < N_SYS; k++) {
            cell *c = &cells[k];
            if (!(sel->systems & 1u << k))
                continue;
            for (int i = 0; i < n; i++) {
                c->answers++;
                c->same += answers[k][i] && answers[0][i] && !strcmp(answers[k][i], answers[0][i]);
            }
            double tps = bench_median(c->tps, runs), ratio = off > 0 ? tps / off : 0;
            double dtps = bench_median(c->decode_tps, runs),
                   dratio = off_decode > 0 ? dtps / off_decode : 0;
            never_below &= k == 0 || (ratio >= 0.95 && dratio >= 0.95);
            printf("{\"bench\":\"speculate\",\"model\":\"%s\",\"workload\":\"%s\",\"streams\":%d,"
                   "\"system\":\"%s\",\"runs\":%d,\"requests\":%d,\"max_tokens\":%d,"
                   "\"tokens_per_s\":%.1f,\"vs_off\":%.3f,\"decode_tokens_per_s_per_stream\":%.1f,"
                   "\"decode_vs_off\":%.3f,\"proposals\":%llu,\"drafts\":%llu,"
                   "\"accepted\":%llu,\"acceptance\":%.3f,\"mean_accepted\":%.2f,"
                   "\"answers_equal_off\":%.3f}\n",
                   model, wl->name, streams, sys_names[k], runs, n, tokens, tps, ratio, dtps,
                   dratio, (unsigned long long)c->steps, (unsigned long long)c->proposed,
                   (unsigned long long)c->accepted,
                   c->proposed ? (double)c->accepted / c->proposed : 0.0,
                   c->steps ? (double)c->accepted / c->steps : 0.0,
                   (double)c->same / c->answers);
            fflush(stdout);
        }
        double lookup = off_decode > 0 ? bench_median(cells[1].decode_tps, runs) / off_decode : 0;
        printf("{\"bench\":\"speculate_target\",\"model\":\"%s\",\"workload\":\"%s\","
               "\"streams\":%d,\"never_below_0.95\":%s",
               model, wl->name, streams, never_below ? "true" : "false");
        if (sel->systems & 1u << 1)
            printf(",\"lookup_decode_vs_off\":%.3f%s", lookup,
                   wl->rag && streams == 1
                       ? lookup >= 1.8 ? ",\"rag_single_stream_1.8x\":true"
                                       : ",\"rag_single_stream_1.8x\":false"
                       : "");
        printf("}\n");
        fflush(stdout);
        for (int k = 0; k < N_SYS; k++) {
            for (int i = 0; i < n; i++)
                free(answers[k][i]);
            free(answers[k]);
        }
    }
    return 0;
}

/* The file's text (NUL-terminated), or NULL. */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s)
        s[n] = '\0';
    fclose(f);
    return s;
}

/* The rag workload: the kb's passages added through c, its questions into wl. */
static int rag_workload(llms_conn *c, const char *pairs_path, workload *wl, int n)
{
    char *pairs = slurp(pairs_path);
    if (!pairs)
        return -1;
    static char ids[N_PASSAGES][16];
    llms_kb_doc docs[N_PASSAGES];
    char *queries[N_PASSAGES];
    int m = 0;
    char *line = strchr(pairs, '\n'); /* the header */
    while (line && m < N_PASSAGES) {
        char *q = line + 1, *tab = strchr(q, '\t'), *end = tab ? strchr(tab, '\n') : NULL;
        if (!tab || !end)
            break;
        *tab = *end = '\0';
        snprintf(ids[m], sizeof ids[m], "p%d", m);
        docs[m] = (llms_kb_doc){ids[m], tab + 1, NULL};
        queries[m++] = q;
        line = end;
    }
    int rc = llms_kb_create(c, "docs", 512, 0) == LLMS_OK &&
                     llms_kb_add(c, "docs", docs, (size_t)m, NULL) == LLMS_OK
                 ? 0
                 : -1;
    if (rc)
        fprintf(stderr, "speculate: knowledge base: %s\n", llms_last_error(c));
    wl->name = "rag";
    wl->rag = true;
    /* every 7th question, so that the streams ask different ones */
    for (int i = 0; rc == 0 && i < n; i++)
        if (!(wl->prompts[wl->n++] = strdup(queries[(i * 7) % m])))
            rc = -1;
    free(pairs);
    return rc;
}

/* The free workload: prefixes of held-out paragraphs. */
static int free_workload(const char *heldout_path, workload *wl, int n)
{
    char *text = slurp(heldout_path);
    if (!text)
        return -1;
    size_t len = strlen(text);
    wl->name = "free";
    for (int i = 0; i < n; i++) {
        size_t at = (len - 800) / (size_t)n * (size_t)i;
        /* from the start of a line */
        while (at > 0 && text[at - 1] != '\n')
            at--;
        char *p = strndup(text + at, 700);
        if (!p) {
            free(text);
            return -1;
        }
        wl->prompts[wl->n++] = p;
    }
    free(text);
    return 0;
}

static void workload_free(workload *wl)
{
    for (int i = 0; i < wl->n; i++)
        free(wl->prompts[i]);
    wl->n = 0;
}

/* TinyLlama-1.1B's shape in Q8_0 and a 2-layer draft on the same vocabulary, random
 * weights: their paths, generated on first use. */
static int tinyllama_models(const char *vocab_path, char *target, char *draft, size_t cap)
{
    char err[ERR_MAX];
    snprintf(target, cap, "build/bench-models/tinyllama-shape-q8_0.gguf");
    snprintf(draft, cap, "build/bench-models/tinyllama-draft-q8_0.gguf");
    gguf_file *v = gguf_open(vocab_path, err);
    if (!v) {
        fprintf(stderr, "speculate: %s: %s\n", vocab_path, err);
        return -1;
    }
    modelgen_params t = {.arch = "llama", .dim = 2048, .n_layer = 22, .n_head = 32,
                         .n_head_kv = 4, .n_ff = 5632, .n_ctx = 2048, .type = QTYPE_Q8_0,
                         .seed = 11, .vocab = v, .n_threads = 2};
    modelgen_params d = t;
    d.dim = 256;
    d.n_layer = 2;
    d.n_head = 4;
    d.n_head_kv = 2;
    d.n_ff = 768;
    d.seed = 12;
    int rc = bench_generate_model("speculate", &t, target) ||
                     bench_generate_model("speculate", &d, draft)
                 ? -1
                 : 0;
    gguf_close(v);
    return rc;
}

/* The systems of a comma-separated list of names (off is always run), or 0 when a name
 * is none of sys_names. */
static unsigned systems_of(const char *list)
{
    unsigned out = 1;
    char buf[128];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save, *name = strtok_r(buf, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
        int k = 0;
        while (k < N_SYS && strcmp(name, sys_names[k]))
            k++;
        if (k == N_SYS)
            return 0;
        out |= 1u << k;
    }
    return out;
}

int main(int argc, char **argv)
{
    const char *testdata = "../shared/testdata";
    int runs = 3, per_stream = 8, tokens = 96;
    bool tinyllama = false;
    const char *only = NULL; /* a workload's name, or all */
    selection sel = {0, (1u << N_SYS) - 1};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--testdata") && i + 1 < argc)
            testdata = argv[++i];
        else if (!strcmp(argv[i], "--runs") && i + 1 < argc)
            runs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--requests") && i + 1 < argc)
            per_stream = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc)
            tokens = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tinyllama"))
            tinyllama = true;
        else if (!strcmp(argv[i], "--workload") && i + 1 < argc &&
                 (!strcmp(argv[i + 1], "rag") || !strcmp(argv[i + 1], "free")))
            only = argv[++i];
        else if (!strcmp(argv[i], "--streams") && i + 1 < argc &&
                 (atoi(argv[i + 1]) == 1 || atoi(argv[i + 1]) == STREAMS))
            sel.streams = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--systems") && i + 1 < argc &&
                 (sel.systems = systems_of(argv[i + 1])) != 0)
            i++;
        else {
            fprintf(stderr, "usage: speculate [--testdata DIR] [--runs R] [--requests N] "
                            "[--tokens T] [--tinyllama] [--workload rag|free] "
                            "[--streams 1|%d] [--systems lookup,draft,both]\n", STREAMS);
            return 2;
        }
    }
    if (runs < 1 || runs > 16 || per_stream < 1 || per_stream > MAX_REQ || tokens < 1) {
        fprintf(stderr, "speculate: --runs 1..16, --requests 1..%d, --tokens >= 1\n", MAX_REQ);
        return 2;
    }
    char lm[1024], small[1024], emb[1024], pairs[1024], heldout[1024];
    snprintf(lm, sizeof lm, "%s/models/docs-lm-21M-F16.gguf", testdata);
    snprintf(small, sizeof small, "%s/models/docs-draft-5M-F16.gguf", testdata);
    snprintf(emb, sizeof emb, "%s/models/docs-embed-5M-F16.gguf", testdata);
    snprintf(pairs, sizeof pairs, "%s/docs/pairs-dev.tsv", testdata);
    snprintf(heldout, sizeof heldout, "%s/docs/heldout.txt", testdata);
    const char *need[] = {lm, small, emb, pairs, heldout};
    for (int i = 0; i < 5; i++)
        if (access(need[i], R_OK) != 0) {
            fprintf(stderr, "speculate: skipped: %s is absent\n", need[i]);
            return 0;
        }
    char self[1024], llmsd[1100];
    snprintf(self, sizeof self, "%s", argv[0]);
    snprintf(llmsd, sizeof llmsd, "%s/../llmsd", dirname(self));
    if (access(llmsd, X_OK) != 0) {
        fprintf(stderr, "speculate: %s is not built\n", llmsd);
        return 1;
    }
    char dir[] = "/tmp/llms-bench-XXXXXX", sub[600], sock[800], conf[4096];
    if (!mkdtemp(dir))
        return 1;
    int rc = 1;
    workload rag = {0}, text = {0};
    llms_conn *c = NULL;
    snprintf(sub, sizeof sub, "%s/docs", dir);
    mkdir(sub, 0755);
    snprintf(conf, sizeof conf,
             "model = %s\nmodel.small = %s draft\nmodel.docs = %s embed\ndraft_model = small\n"
             "threads = 2\nspeculate = off\nkv_budget_mb = 1024\nmax_queued_per_app = 64\n",
             lm, small, emb);
    pid_t pid = bench_llmsd_start("speculate", llmsd, sub, conf, sock, sizeof sock);
    if (pid < 0)
        goto out;
    if (llms_connect(sock, &c, NULL) != LLMS_OK || llms_bind(c, "bench-spec") != LLMS_OK ||
        rag_workload(c, pairs, &rag, per_stream * STREAMS) ||
        free_workload(heldout, &text, per_stream * STREAMS))
        goto stop;
    if ((!only || !strcmp(only, "rag")) &&
        run_workload("docs-lm-21M-F16", sock, &rag, runs, per_stream, tokens, &sel))
        goto stop;
    if ((!only || !strcmp(only, "free")) &&
        run_workload("docs-lm-21M-F16", sock, &text, runs, per_stream, tokens, &sel))
        goto stop;
    if (tinyllama) {
        char target[1024], draft[1024];
        bench_llmsd_stop(pid);
        pid = -1;
        snprintf(sub, sizeof sub, "%s/tinyllama", dir);
        mkdir(sub, 0755);
        snprintf(heldout, sizeof heldout, "%s/vocab/ggml-vocab-llama-spm.gguf", testdata);
        if (tinyllama_models(heldout, target, draft, sizeof target))
            goto stop;
        snprintf(conf, sizeof conf,
                 "model = %s\nmodel.small = %s draft\ndraft_model = small\nthreads = 2\n"
                 "speculate = off\nmax_queued_per_app = 64\n", target, draft);
        if ((pid = bench_llmsd_start("speculate", llmsd, sub, conf, sock, sizeof sock)) < 0 ||
            run_workload("tinyllama-shape-q8_0", sock, &text, 1, 1, 32 < tokens ? 32 : tokens,
                         &sel))
            goto stop;
    }
    rc = 0;
stop:
    if (c)
        llms_close(c);
    bench_llmsd_stop(pid);
out:
    workload_free(&rag);
    workload_free(&text);
    snprintf(conf, sizeof conf, "rm -rf '%s'", dir);
    if (system(conf) != 0)
        fprintf(stderr, "speculate: could not remove %s\n", dir);
    return rc;
}
