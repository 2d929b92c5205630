/*
 * kb_store — a knowledge base's bytes on disk, write time, another app's latency during
 * a KbAdd, and vector retrieval quality, as JSON lines on stdout.
 *
 *   kb_store [--mb N] [--vocab docs|synthetic] [--quality-model PATH] [--no-quality]
 *
 * Each part starts llmsd of the same build on a temporary socket and state directory.
 *   1. size: a random-weight model of dim 128 with the documentation models' vocabulary
 *      (8192 tokens, so a 64-token passage is about 250 bytes of text; --vocab synthetic:
 *      300 made-up tokens, about 38 bytes, as test_abuse's ingest) embeds --mb MiB (10 by
 *      default) of ../shared/testdata/docs/heldout.txt repeated,
 *      in 1 MiB documents, 4 a KbAdd; the state directory's database once the daemon
 *      stopped (its log checkpointed), over the text bytes; ms of KbAdd per MiB. Then a
 *      vector search (kb_ivf_min_passages 10000, so from 10 MiB on an IVF index is trained
 *      in idle time and stored), and the database's bytes again with the index, and the
 *      mean time of the vector searches that follow (embedding included).
 *   2. latency: while a 1 MiB KbAdd runs on one connection, another app's Embed of a
 *      short text is sent again and again: its worst and median latency, and the same
 *      with no KbAdd running.
 *   3. drop: the database file's size before and once KbDrop of the knowledge base of
 *      part 1 is answered (the daemon running), and after the daemon stopped.
 *   4. quality: the docs embedding model (--quality-model, default
 *      ../shared/testdata/models/docs-embed-5M-F16.gguf; skipped when absent) embeds the
 *      passages of docs/pairs-dev.tsv, one document each; recall@1 and @10 of vector,
 *      BM25 and hybrid (RRF) retrieval for their queries (the passage of the query's own
 *      line is the answer), searched exactly, then through an IVF index (trained from
 *      100 passages on: about 125 lists, kb_ivf_nprobe 16 of them searched).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench/bench.h"
#include "engine/quant/quant.h"

#define DOCS_DIR "../shared/testdata/docs"

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) {
        b[n] = '\0';
        *len = (size_t)n;
    }
    return b;
}

static long long file_bytes(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long long)st.st_size : 0;
}

/* n bytes of text: src repeated, cut at a space (each document whole words). */
static char *repeat_text(const char *src, size_t src_len, size_t n)
{
    char *t = malloc(n + 1);
    if (!t)
        return NULL;
    for (size_t i = 0; i < n; i++)
        t[i] = src[i % src_len];
    while (n > 0 && t[n - 1] != ' ')
        n--;
    t[n] = '\0';
    return t;
}

typedef struct prober {
    const char *sock;
    atomic_bool stop;
    double worst_ms, lat[4096];
    int n;
    bool failed;
} prober;

static void *probe_loop(void *arg)
{
    prober *p = arg;
    llms_conn *c;
    if (llms_connect(p->sock, &c, NULL) != LLMS_OK || llms_bind(c, "other") != LLMS_OK) {
        p->failed = true;
        return NULL;
    }
    const char *text = "a short question about the weather";
    while (!atomic_load(&p->stop) && p->n < 4096) {
        llms_embeddings e;
        double t0 = bench_now_s();
        if (llms_embed(c, &text, 1, LLMS_POOLING_MEAN, &e) != LLMS_OK) {
            p->failed = true;
            break;
        }
        llms_embeddings_free(&e);
        double ms = (bench_now_s() - t0) * 1e3;
        p->lat[p->n++] = ms;
        if (ms > p->worst_ms)
            p->worst_ms = ms;
        usleep(5000);
    }
    llms_close(c);
    return NULL;
}

/* Searches kb once for a vector and waits until no IVF index is left to train (idle
 * time); *trained gets the daemon's count of trainings. */
static int train_index(llms_conn *c, const char *kb, uint64_t *trained)
{
    llms_kb_hit *h;
    size_t nh;
    if (llms_kb_search(c, kb, "a question to warm the index", 10, LLMS_RETRIEVAL_VECTOR, &h,
                       &nh) != LLMS_OK)
        return -1;
    llms_kb_hits_free(h, nh);
    for (int i = 0; i < 1200; i++) {
        llms_daemon_status st;
        if (llms_status_get(c, &st) != LLMS_OK)
            return -1;
        bool pending = st.kb_ivf_train_pending > 0;
        *trained = st.kb_ivf_trained;
        llms_daemon_status_free(&st);
        if (!pending)
            return 0;
        usleep(100000);
    }
    return -1;
}

/* Part 2: another app's Embed latency with and without a 1 MiB KbAdd running. */
static int latency(const char *sock, const char *text)
{
    llms_conn *c;
    if (llms_connect(sock, &c, NULL) != LLMS_OK || llms_bind(c, "ingester") != LLMS_OK ||
        llms_kb_create(c, "lat", 0, 0) != LLMS_OK)
        return -1;
    for (int busy = 0; busy < 2; busy++) {
        prober p = {.sock = sock};
        pthread_t th;
        pthread_create(&th, NULL, probe_loop, &p);
        double t0 = bench_now_s();
        if (busy) {
            llms_kb_doc d = {"one-mb", text, NULL};
            if (llms_kb_add(c, "lat", &d, 1, NULL) != LLMS_OK) {
                fprintf(stderr, "kb_store: %s\n", llms_last_error(c));
                p.failed = true;
            }
        } else {
            usleep(1500 * 1000);
        }
        double ms = (bench_now_s() - t0) * 1e3;
        atomic_store(&p.stop, true);
        pthread_join(th, NULL);
        if (p.failed)
            return -1;
        printf("{\"bench\":\"kb_other_app_latency\",\"kb_add_running\":%s,\"add_ms\":%.0f,"
               "\"probes\":%d,\"median_ms\":%.1f,\"p95_ms\":%.1f,\"worst_ms\":%.1f}\n",
               busy ? "true" : "false", busy ? ms : 0.0, p.n, bench_median(p.lat, p.n),
               bench_percentile(p.lat, p.n, 0.95), p.worst_ms);
    }
    llms_close(c);
    return 0;
}

/* Parts 1-3 on the random-weight model. */
static int size_latency_drop(const char *prog, const char *llmsd, int mb, bool docs_vocab)
{
    modelgen_params mp = {
        .arch = "llama", .dim = 128, .n_layer = 1, .n_head = 4, .n_head_kv = 2, .n_ff = 128,
        .n_ctx = 512, .type = QTYPE_F32, .seed = 3, .n_vocab = 300, .n_threads = 1,
    };
    const char *model = docs_vocab ? "build/bench-models/kb-store-d128-tok8k.gguf"
                                   : "build/bench-models/kb-store-d128.gguf";
    char err[ERR_MAX];
    gguf_file *vocab = NULL;
    if (docs_vocab && !(vocab = gguf_open("../shared/testdata/models/docs-embed-5M-F16.gguf",
                                          err))) {
        fprintf(stderr, "%s: %s\n", prog, err);
        return -1;
    }
    mp.vocab = vocab;
    size_t src_len;
    char *src = read_file(DOCS_DIR "/heldout.txt", &src_len);
    int gen = bench_generate_model(prog, &mp, model);
    gguf_close(vocab);
    if (!src || gen)
        return -1;
    char dir[] = "/tmp/llms-kbstore-XXXXXX", sock[1100], conf[2048], db[1200];
    if (!mkdtemp(dir))
        return -1;
    snprintf(conf, sizeof conf, "model = %s\nkb_max_mb_per_uid = 4096\n"
                                "kb_max_passages_per_uid = 100000000\n", model);
    snprintf(db, sizeof db, "%s/state/llmsd.db", dir);
    pid_t pid = bench_llmsd_start(prog, llmsd, dir, conf, sock, sizeof sock);
    llms_conn *c;
    if (pid < 0 || llms_connect(sock, &c, NULL) != LLMS_OK || llms_bind(c, "bench") != LLMS_OK ||
        llms_kb_create(c, "big", 0, 0) != LLMS_OK)
        return -1;
    long long text = 0;
    uint32_t passages = 0;
    double add_s = 0;
    char *docs[4];
    char ids[4][32];
    for (int i = 0; i < 4; i++)
        docs[i] = repeat_text(src + i * 1000, src_len - (size_t)i * 1000, 1u << 20);
    for (int at = 0; at < mb; at += 4) {
        llms_kb_doc d[4];
        int n = mb - at < 4 ? mb - at : 4;
        for (int i = 0; i < n; i++) {
            snprintf(ids[i], sizeof ids[i], "doc%d", at + i);
            d[i] = (llms_kb_doc){ids[i], docs[i], NULL};
            text += (long long)strlen(docs[i]);
        }
        uint32_t np;
        double t0 = bench_now_s();
        if (llms_kb_add(c, "big", d, (size_t)n, &np) != LLMS_OK) {
            fprintf(stderr, "%s: %s\n", prog, llms_last_error(c));
            return -1;
        }
        add_s += bench_now_s() - t0;
        passages += np;
    }
    llms_close(c);
    bench_llmsd_stop(pid);
    long long disk = file_bytes(db);
    printf("{\"bench\":\"kb_size\",\"text_bytes\":%lld,\"passages\":%u,\"db_bytes\":%lld,"
           "\"db_over_text\":%.2f,\"bytes_per_passage\":%.0f,\"add_ms_per_mb\":%.0f}\n",
           text, passages, disk, (double)disk / (double)text, (double)disk / passages,
           add_s * 1e3 / ((double)text / (1 << 20)));
    /* the IVF index counts too: trained and stored once searched */
    uint64_t trained = 0;
    enum { SEARCHES = 50 };
    pid = bench_llmsd_start(prog, llmsd, dir, conf, sock, sizeof sock);
    if (pid < 0 || llms_connect(sock, &c, NULL) != LLMS_OK || llms_bind(c, "bench") != LLMS_OK ||
        train_index(c, "big", &trained))
        return -1;
    double t0 = bench_now_s();
    for (int i = 0; i < SEARCHES; i++) {
        char query[64];
        snprintf(query, sizeof query, "the question number %d about the documents", i);
        llms_kb_hit *h;
        size_t nh;
        if (llms_kb_search(c, "big", query, 10, LLMS_RETRIEVAL_VECTOR, &h, &nh) != LLMS_OK)
            return -1;
        llms_kb_hits_free(h, nh);
    }
    double search_ms = (bench_now_s() - t0) * 1e3 / SEARCHES;
    llms_close(c);
    bench_llmsd_stop(pid);
    disk = file_bytes(db);
    printf("{\"bench\":\"kb_size_with_index\",\"ivf_trained\":%llu,\"db_bytes\":%lld,"
           "\"db_over_text\":%.2f,\"bytes_per_passage\":%.0f,\"vector_search_ms\":%.2f}\n",
           (unsigned long long)trained, disk, (double)disk / (double)text,
           (double)disk / passages, search_ms);
    pid = bench_llmsd_start(prog, llmsd, dir, conf, sock, sizeof sock);
    if (pid < 0 || latency(sock, docs[0]))
        return -1;
    long long before = file_bytes(db);
    if (llms_connect(sock, &c, NULL) != LLMS_OK || llms_bind(c, "bench") != LLMS_OK ||
        llms_kb_drop(c, "big") != LLMS_OK)
        return -1;
    long long after = file_bytes(db);
    llms_close(c);
    bench_llmsd_stop(pid);
    printf("{\"bench\":\"kb_drop\",\"db_bytes_before\":%lld,\"db_bytes_after_drop\":%lld,"
           "\"db_bytes_after_stop\":%lld}\n", before, after, file_bytes(db));
    for (int i = 0; i < 4; i++)
        free(docs[i]);
    free(src);
    return 0;
}

/* Part 4: recall of vector, BM25 and hybrid retrieval on pairs-dev with the docs
 * embedding model, exact and through an IVF index. */
static int quality(const char *prog, const char *llmsd, const char *model)
{
    size_t len;
    char *tsv = read_file(DOCS_DIR "/pairs-dev.tsv", &len);
    if (!tsv)
        return -1;
    enum { MAXP = 1100 };
    static char *q[MAXP], *p[MAXP];
    int n = 0;
    char *line = strchr(tsv, '\n');
    while (line && n < MAXP) {
        char *s = line + 1, *tab = strchr(s, '\t'), *end = strchr(s, '\n');
        if (!tab || (end && tab > end))
            break;
        *tab = '\0';
        if (end)
            *end = '\0';
        q[n] = s;
        p[n++] = tab + 1;
        line = end;
    }
    static char ids[MAXP][16];
    llms_kb_doc *d = calloc((size_t)n, sizeof *d);
    if (!d)
        return -1;
    for (int i = 0; i < n; i++) {
        snprintf(ids[i], sizeof ids[i], "%d", i);
        d[i] = (llms_kb_doc){ids[i], p[i], NULL};
    }
    static const struct {
        const char *name;
        enum llms_retrieval r;
    } modes[] = {{"vector", LLMS_RETRIEVAL_VECTOR}, {"bm25", LLMS_RETRIEVAL_BM25},
                 {"hybrid", LLMS_RETRIEVAL_RRF}};
    for (int use_ivf = 0; use_ivf < 2; use_ivf++) {
        char dir[] = "/tmp/llms-kbquality-XXXXXX", sock[1100], conf[1200];
        if (!mkdtemp(dir))
            return -1;
        snprintf(conf, sizeof conf, "model = %s\nkb_passage_tokens = 512\n"
                                    "kb_ivf_min_passages = %d\n", model, use_ivf ? 100 : 0);
        pid_t pid = bench_llmsd_start(prog, llmsd, dir, conf, sock, sizeof sock);
        llms_conn *c;
        if (pid < 0 || llms_connect(sock, &c, NULL) != LLMS_OK ||
            llms_bind(c, "bench") != LLMS_OK || llms_kb_create(c, "pairs", 512, 0) != LLMS_OK)
            return -1;
        double t0 = bench_now_s();
        if (llms_kb_add(c, "pairs", d, (size_t)n, NULL) != LLMS_OK) {
            fprintf(stderr, "%s: %s\n", prog, llms_last_error(c));
            return -1;
        }
        fprintf(stderr, "%s: %d passages embedded in %.1f s\n", prog, n, bench_now_s() - t0);
        uint64_t trained = 0;
        if (use_ivf && train_index(c, "pairs", &trained))
            return -1;
        for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
            if (use_ivf && modes[m].r == LLMS_RETRIEVAL_BM25)
                continue;
            int at1 = 0, at10 = 0;
            for (int i = 0; i < n; i++) {
                llms_kb_hit *h;
                size_t nh;
                if (llms_kb_search(c, "pairs", q[i], 10, modes[m].r, &h, &nh) != LLMS_OK)
                    return -1;
                for (size_t j = 0; j < nh; j++)
                    if (atoi(h[j].document) == i) {
                        at1 += j == 0;
                        at10++;
                    }
                llms_kb_hits_free(h, nh);
            }
            printf("{\"bench\":\"kb_%s_recall\",\"ivf\":%s,\"pairs\":%d,"
                   "\"recall_at_1\":%.3f,\"recall_at_10\":%.3f}\n", modes[m].name,
                   use_ivf ? "true" : "false", n, (double)at1 / n, (double)at10 / n);
        }
        llms_close(c);
        bench_llmsd_stop(pid);
    }
    free(d);
    free(tsv);
    return 0;
}

int main(int argc, char **argv)
{
    int mb = 10;
    bool want_quality = true, docs_vocab = true;
    const char *qmodel = "../shared/testdata/models/docs-embed-5M-F16.gguf";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mb") && i + 1 < argc)
            mb = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quality-model") && i + 1 < argc)
            qmodel = argv[++i];
        else if (!strcmp(argv[i], "--vocab") && i + 1 < argc)
            docs_vocab = strcmp(argv[++i], "synthetic") != 0;
        else if (!strcmp(argv[i], "--no-quality"))
            want_quality = false;
        else {
            fprintf(stderr, "usage: kb_store [--mb N] [--vocab docs|synthetic] [--quality-model PATH]"
                            " [--no-quality]\n");
            return 2;
        }
    }
    if (mb < 1 || mb > 256) {
        fprintf(stderr, "kb_store: --mb 1..256\n");
        return 2;
    }
    char llmsd[1100];
    snprintf(llmsd, sizeof llmsd, "%.1000s", argv[0]);
    char *slash = strrchr(llmsd, '/');
    snprintf(slash ? slash + 1 : llmsd, 64, "../llmsd");
    if (access(llmsd, X_OK) != 0) {
        fprintf(stderr, "kb_store: %s is not built\n", llmsd);
        return 1;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (size_latency_drop("kb_store", llmsd, mb, docs_vocab))
        return 1;
    if (want_quality && access(qmodel, R_OK) == 0 && quality("kb_store", llmsd, qmodel))
        return 1;
    return 0;
}
