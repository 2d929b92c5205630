/*
 * bench/rerank — latency, peak memory and precision of the GRATING reranker against a
 * full forward of every candidate.
 *
 *   build/bench/rerank [-r RUNS] [--threads N] [-n N,N..] [-t TOKENS] [-k K,K..]
 *                      [--cv X,X..] [--mem MB] [MODEL.gguf ...]
 *
 * With no model given it uses the two: a Qwen3-0.6B-shaped random-weight model
 * (qwen3, dim 1024, 28 layers, 16 heads of 128, 8 KV heads, FFN 3072, the gpt-2
 * vocabulary, Q8_0), generated with build/mkmodel into build/bench-models/ on first use,
 * and the trained stories260K from the shared test data. Models whose vocabulary has no
 * "yes" / "no" tokens are scored on the fixed ids 300 / 301.
 *
 * Candidates are token sequences: a shared 32-token query prefix and a random document,
 * about TOKENS in all (+-20%) but at most the model's context length (the reranker
 * refuses longer pairs), deterministic in the seed. Systems, each in a child
 * process so its peak RSS is its own:
 *   full_resident     model_forward of every candidate, weights mapped (the usual way)
 *   full_layer_reads  the reranker with pruning off, weights read layer by layer
 *   grating           the reranker with pruning at each --cv threshold, per K
 * precision@K is against full_resident's own top-K. --mem sets the reranker's
 * memory_limit (activations of one chunk; below the candidates' hidden states they go
 * through a temporary file). full_resident also reports the dispersion (cv) of the
 * provisional scores after each layer and, per K, the first layer from which the
 * provisional top-K is already the final one ("topk_settled_layer": what an ideal
 * pruner could save). first_prune_layer is -1 when nothing stopped before the last
 * layer. One JSON object per line; latency is the median of the runs.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench.h"
#include "engine/gguf/gguf.h"
#include "engine/kv/kv.h"
#include "engine/model/model.h"
#include "engine/model/ops.h"
#include "engine/quant/quant.h"
#include "engine/encoder/rerank.h"
#include "engine/tok/tokenizer.h"

#define MAX_RUNS 15
#define MAX_LIST 8
#define PREFIX_TOKENS 32
#define FIXED_YES 300
#define FIXED_NO 301

typedef struct bench_options {
    int n_runs;
    int n_threads;
    int n_list[MAX_LIST], n_n;
    int tokens;
    int k_list[MAX_LIST], n_k;
    float cv_list[MAX_LIST];
    int n_cv;
    int mem_mb; /* memory_limit of the reranker, 0: its default */
} bench_options;

typedef struct workload {
    const char *model;
    int n;
    int32_t **tok;
    int *len;
    int32_t yes, no;
    int n_layer;
    int n_ctx;  /* the model's context length: the longest candidate */
    float *ref; /* (n) full forward scores, filled by the first system */
} workload;

static double peak_rss_mb(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0;
}

/* The yes / no ids: the vocabulary's "yes" / "no", else the fixed pair; the model's
 * layers and context length. */
static int answer_tokens(const char *path, int32_t *yes, int32_t *no, int *n_layer, int *n_ctx)
{
    char err[ERR_MAX];
    model *m = model_load(path, err);
    tokenizer *t = NULL;
    if (!m || tok_load(model_gguf(m), &t, err) < 0) {
        fprintf(stderr, "rerank: %s: %s\n", path, err);
        model_free(m);
        return -1;
    }
    *n_layer = model_hparams_of(m)->n_layer;
    *n_ctx = model_hparams_of(m)->n_ctx;
    *yes = tok_find(t, "yes", 3);
    *no = tok_find(t, "no", 2);
    if (*yes < 0 || *no < 0) {
        *yes = FIXED_YES;
        *no = FIXED_NO;
    }
    int n_vocab = model_hparams_of(m)->n_vocab;
    tok_free(t);
    model_free(m);
    return *yes < n_vocab && *no < n_vocab ? n_vocab : -1;
}

static void make_candidates(workload *w, int n_vocab, int tokens)
{
    w->tok = calloc((size_t)w->n, sizeof *w->tok);
    w->len = calloc((size_t)w->n, sizeof *w->len);
    w->ref = calloc((size_t)w->n, sizeof *w->ref);
    uint64_t x = 88172645463325252ull;
    int32_t prefix[PREFIX_TOKENS];
    for (int t = 0; t < PREFIX_TOKENS; t++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        prefix[t] = (int32_t)(3 + x % (uint64_t)(n_vocab - 4));
    }
    for (int i = 0; i < w->n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int len = tokens - tokens / 5 + (int)(x % (uint64_t)(2 * (tokens / 5) + 1));
        if (len > w->n_ctx)
            len = w->n_ctx;
        if (len < PREFIX_TOKENS + 1)
            len = PREFIX_TOKENS + 1;
        w->len[i] = len;
        w->tok[i] = malloc((size_t)len * sizeof(int32_t));
        memcpy(w->tok[i], prefix, sizeof prefix);
        for (int t = PREFIX_TOKENS; t < len; t++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            w->tok[i][t] = (int32_t)(3 + x % (uint64_t)(n_vocab - 4));
        }
    }
}

static void free_candidates(workload *w)
{
    for (int i = 0; i < w->n; i++)
        free(w->tok[i]);
    free(w->tok);
    free(w->len);
    free(w->ref);
}

static int cmp_desc(const void *a, const void *b, void *arg)
{
    const float *s = arg;
    int i = *(const int *)a, j = *(const int *)b;
    if (s[i] != s[j])
        return s[i] > s[j] ? -1 : 1;
    return (i > j) - (i < j);
}

/* |top_k(ref) intersect got| / k. */
static double precision(const workload *w, int k, const int *got, int n_got)
{
    int *idx = malloc((size_t)w->n * sizeof *idx);
    for (int i = 0; i < w->n; i++)
        idx[i] = i;
    qsort_r(idx, (size_t)w->n, sizeof *idx, cmp_desc, w->ref);
    if (k > w->n)
        k = w->n;
    int hit = 0;
    for (int i = 0; i < k; i++)
        for (int j = 0; j < n_got; j++)
            hit += got[j] == idx[i];
    free(idx);
    return (double)hit / k;
}

/* Provisional score of every candidate after every layer (scores (n, n_layer)) from the
 * hidden outputs of the full forward: their dispersion per layer, and for each K the
 * first layer from which the provisional top-K set is the final one at every later
 * layer (how early the scores "diverge"). Printed as extra fields of the JSON line. */
static void print_divergence(const workload *w, const bench_options *o, const float *scores,
                             int n_layer)
{
    printf(",\"cv_by_layer\":[");
    for (int l = 0; l < n_layer; l++) {
        double mean = 0, var = 0;
        for (int i = 0; i < w->n; i++)
            mean += scores[(size_t)i * n_layer + l];
        mean /= w->n;
        for (int i = 0; i < w->n; i++) {
            double d = scores[(size_t)i * n_layer + l] - mean;
            var += d * d;
        }
        printf("%s%.3f", l ? "," : "", mean > 0 ? sqrt(var / w->n) / mean : 0.0);
    }
    printf("],\"topk_settled_layer\":{");
    int *idx = malloc((size_t)w->n * sizeof *idx);
    char *in_final = calloc((size_t)w->n, 1);
    float *col = malloc((size_t)w->n * sizeof *col);
    for (int ki = 0; ki < o->n_k; ki++) {
        int k = o->k_list[ki] < w->n ? o->k_list[ki] : w->n, settled = n_layer - 1;
        for (int l = n_layer - 1; l >= 0; l--) {
            for (int i = 0; i < w->n; i++) {
                col[i] = scores[(size_t)i * n_layer + l];
                idx[i] = i;
            }
            qsort_r(idx, (size_t)w->n, sizeof *idx, cmp_desc, col);
            if (l == n_layer - 1) {
                memset(in_final, 0, (size_t)w->n);
                for (int i = 0; i < k; i++)
                    in_final[idx[i]] = 1;
                continue;
            }
            int same = 1;
            for (int i = 0; i < k; i++)
                same &= in_final[idx[i]];
            if (!same)
                break;
            settled = l;
        }
        printf("%s\"%d\":%d", ki ? "," : "", o->k_list[ki], settled);
    }
    printf("}");
    free(idx);
    free(in_final);
    free(col);
}

/* full_resident: scores every candidate with model_forward; writes them to fd. */
static int run_full_resident(const workload *w, const bench_options *o, int fd)
{
    char err[ERR_MAX];
    int max_len = 0;
    for (int i = 0; i < w->n; i++)
        max_len = w->len[i] > max_len ? w->len[i] : max_len;
    model *m = model_load(w->model, err);
    model_runner *r = m ? model_runner_new(m, o->n_threads, 512, max_len, err) : NULL;
    kv_pool *pool = r ? kv_pool_new(model_kv_shape(m), 0, err) : NULL;
    if (!pool) {
        fprintf(stderr, "rerank: %s\n", err);
        return 1;
    }
    const model_hparams *hp = model_hparams_of(m);
    int n_vocab = hp->n_vocab, dim = hp->dim, nl = hp->n_layer;
    float *logits = malloc((size_t)n_vocab * sizeof(float));
    float *hidden = malloc((size_t)(nl + 1) * dim * sizeof(float));
    float *layer_scores = malloc((size_t)w->n * nl * sizeof(float));
    /* final norm and the yes / no output rows, for the scores after each layer */
    const gguf_file *g = model_gguf(m);
    const gguf_tensor *norm = gguf_find_tensor(g, "output_norm.weight");
    const gguf_tensor *out = gguf_find_tensor(g, "output.weight");
    if (!out)
        out = gguf_find_tensor(g, "token_embd.weight");
    size_t rb = quant_row_bytes(out->type, dim);
    float *nw = malloc((size_t)dim * 4), *wy = malloc((size_t)dim * 4),
          *wn = malloc((size_t)dim * 4), *xn = malloc((size_t)dim * 4);
    quant_dequantize_row(norm->type, norm->data, nw, dim);
    quant_dequantize_row(out->type, (const char *)out->data + (size_t)w->yes * rb, wy, dim);
    quant_dequantize_row(out->type, (const char *)out->data + (size_t)w->no * rb, wn, dim);
    int32_t *pos = malloc((size_t)max_len * sizeof(int32_t));
    for (int t = 0; t < max_len; t++)
        pos[t] = t;
    double ms[MAX_RUNS];
    float *scores = malloc((size_t)w->n * sizeof(float));
    for (int run = 0; run < o->n_runs; run++) {
        double t0 = bench_now_s();
        for (int i = 0; i < w->n; i++) {
            kv_seq seq;
            kv_seq_init(&seq, pool);
            int32_t last = w->len[i] - 1;
            model_batch b = {.n_tokens = w->len[i], .tokens = w->tok[i], .positions = pos,
                             .n_out = 1, .out_rows = &last, .logits = logits,
                             .hidden = run + 1 == o->n_runs ? hidden : NULL};
            if (model_forward(r, &seq, &b, err) < 0) {
                fprintf(stderr, "rerank: forward: %s\n", err);
                return 1;
            }
            kv_seq_free(&seq);
            scores[i] = 1.0f / (1.0f + expf(-(logits[w->yes] - logits[w->no])));
            for (int l = 0; l < nl && run + 1 == o->n_runs; l++) {
                ops_rmsnorm(xn, hidden + (size_t)(l + 1) * dim, nw, dim, hp->norm_eps);
                double y = 0, no = 0;
                for (int j = 0; j < dim; j++)
                    y += (double)xn[j] * wy[j], no += (double)xn[j] * wn[j];
                layer_scores[(size_t)i * nl + l] = (float)(1.0 / (1.0 + exp(-(y - no))));
            }
        }
        ms[run] = (bench_now_s() - t0) * 1e3;
    }
    if (write(fd, scores, (size_t)w->n * sizeof(float)) != (ssize_t)(w->n * sizeof(float)))
        return 1;
    printf("{\"model\":\"%s\",\"system\":\"full_resident\",\"n\":%d,\"tokens\":%d,"
           "\"ms\":%.1f,\"peak_rss_mb\":%.1f,\"precision\":1.0,\"layers_saved\":0.0",
           w->model, w->n, o->tokens, bench_median(ms, o->n_runs), peak_rss_mb());
    print_divergence(w, o, layer_scores, nl);
    printf("}\n");
    fflush(stdout);
    free(nw);
    free(wy);
    free(wn);
    free(xn);
    free(layer_scores);
    free(hidden);
    free(scores);
    free(pos);
    free(logits);
    kv_pool_free(pool);
    model_runner_free(r);
    model_free(m);
    return 0;
}

/* The reranker at threshold cv (0: full_layer_reads) for each K of the list. */
static int run_grating(const workload *w, const bench_options *o, float cv)
{
    char err[ERR_MAX];
    rerank_options ro = rerank_default_options();
    ro.cv_threshold = cv;
    ro.yes_token = w->yes;
    ro.no_token = w->no;
    ro.n_threads = o->n_threads;
    ro.stream_weights = true;
    ro.memory_limit = (size_t)o->mem_mb << 20;
    const char *tmp = getenv("TMPDIR");
    ro.scratch_dir = tmp && *tmp ? tmp : "/tmp";
    reranker *rr = rerank_open(w->model, &ro, err);
    if (!rr) {
        fprintf(stderr, "rerank: %s\n", err);
        return 1;
    }
    int n_k = cv > 0 ? o->n_k : 1;
    for (int ki = 0; ki < n_k; ki++) {
        ro.top_k = cv > 0 ? o->k_list[ki] : w->n;
        double ms[MAX_RUNS];
        rerank_result res = {0};
        for (int run = 0; run < o->n_runs; run++) {
            rerank_result_free(&res);
            if (rerank_run_tokens(rr, (const int32_t *const *)w->tok, w->len, w->n, &ro, &res,
                                  err) < 0) {
                fprintf(stderr, "rerank: %s\n", err);
                rerank_close(rr);
                return 1;
            }
            ms[run] = res.ms;
        }
        long done = 0;
        for (int i = 0; i < w->n; i++)
            done += res.layers_computed[i];
        double saved = 1.0 - (double)done / ((double)w->n * w->n_layer);
        int first = -1;
        for (int l = 0; l + 1 < res.n_layer && first < 0; l++)
            if (res.pruned_at_layer[l])
                first = l;
        if (cv > 0) {
            printf("{\"model\":\"%s\",\"system\":\"grating\",\"cv\":%.3g,\"n\":%d,\"tokens\":%d,"
                   "\"k\":%d,\"ms\":%.1f,\"peak_rss_mb\":%.1f,\"peak_bytes_mb\":%.1f,"
                   "\"precision\":%.3f,\"layers_saved\":%.3f,\"first_prune_layer\":%d}\n",
                   w->model, cv, w->n, o->tokens, ro.top_k, bench_median(ms, o->n_runs),
                   peak_rss_mb(), res.peak_bytes / 1048576.0,
                   precision(w, ro.top_k, res.index, res.n), saved, first);
        } else {
            double p = 1;
            for (int i = 0; i < o->n_k; i++) {
                double pi = precision(w, o->k_list[i], res.index,
                                      o->k_list[i] < res.n ? o->k_list[i] : res.n);
                p = pi < p ? pi : p;
            }
            printf("{\"model\":\"%s\",\"system\":\"full_layer_reads\",\"n\":%d,\"tokens\":%d,"
                   "\"ms\":%.1f,\"peak_rss_mb\":%.1f,\"peak_bytes_mb\":%.1f,"
                   "\"precision\":%.3f,\"layers_saved\":0.0}\n",
                   w->model, w->n, o->tokens, bench_median(ms, o->n_runs), peak_rss_mb(),
                   res.peak_bytes / 1048576.0, p);
        }
        fflush(stdout);
        rerank_result_free(&res);
    }
    rerank_close(rr);
    return 0;
}

/* Runs one system in a child; the full forward's scores come back through a pipe. */
static int in_child(workload *w, const bench_options *o, int system, float cv)
{
    int fds[2];
    if (pipe(fds) < 0)
        return -1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        close(fds[0]);
        _exit(system == 0 ? run_full_resident(w, o, fds[1]) : run_grating(w, o, cv));
    }
    close(fds[1]);
    if (system == 0) {
        size_t want = (size_t)w->n * sizeof(float), got = 0;
        while (got < want) {
            ssize_t r = read(fds[0], (char *)w->ref + got, want - got);
            if (r <= 0)
                break;
            got += (size_t)r;
        }
    }
    close(fds[0]);
    int st;
    if (waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        return -1;
    return 0;
}

static const char *testdata(const char *rel, char *buf, size_t cap)
{
    const char *root = getenv("LLMS_TESTDATA");
    snprintf(buf, cap, "%s/%s", root && *root ? root : "../shared/testdata", rel);
    return access(buf, R_OK) == 0 ? buf : NULL;
}

/* build/bench-models/qwen3-0.6b-q8_0.gguf, generated unless it exists. */
static const char *reference_model(void)
{
    static char path[256] = "build/bench-models/qwen3-0.6b-q8_0.gguf";
    char vocab[512];
    if (access(path, R_OK) == 0)
        return path;
    if (!testdata("vocab/ggml-vocab-gpt-2.gguf", vocab, sizeof vocab)) {
        fprintf(stderr, "rerank: vocab/ggml-vocab-gpt-2.gguf not found (set LLMS_TESTDATA)\n");
        return NULL;
    }
    if (mkdir("build/bench-models", 0755) != 0 && errno != EEXIST)
        return NULL;
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "build/mkmodel -o %s --arch qwen3 --dim 1024 --layers 28 --heads 16 --kv-heads 8 "
             "--head-dim 128 --ffn 3072 --ctx 4096 --type q8_0 --vocab %s --seed 1",
             path, vocab);
    fprintf(stderr, "rerank: generating %s\n", path);
    if (system(cmd) != 0) {
        unlink(path);
        return NULL;
    }
    return path;
}

static int parse_list(const char *s, int *out, float *fout, int *n, double min, double max)
{
    *n = 0;
    while (*s && *n < MAX_LIST) {
        char *end;
        double v = strtod(s, &end);
        if (end == s || v < min || v > max)
            return -1;
        if (out)
            out[*n] = (int)v;
        else
            fout[*n] = (float)v;
        (*n)++;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return -1;
    }
    return *n ? 0 : -1;
}

int main(int argc, char **argv)
{
    bench_options o = {.n_runs = 3, .n_threads = 2, .n_list = {20, 60}, .n_n = 2,
                       .tokens = 500, .k_list = {1, 5, 10}, .n_k = 3,
                       .cv_list = {0.1f, 0.3f}, .n_cv = 2};
    const char *models[16];
    int n_models = 0;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : "";
        int rc = 0, nn;
        if (!strcmp(argv[i], "-r"))
            rc = parse_list(v, &o.n_runs, NULL, &nn, 1, MAX_RUNS) || nn != 1, i++;
        else if (!strcmp(argv[i], "--threads"))
            rc = parse_list(v, &o.n_threads, NULL, &nn, 1, 256) || nn != 1, i++;
        else if (!strcmp(argv[i], "-n"))
            rc = parse_list(v, o.n_list, NULL, &o.n_n, 1, 10000), i++;
        else if (!strcmp(argv[i], "-t"))
            rc = parse_list(v, &o.tokens, NULL, &nn, PREFIX_TOKENS + 1, 100000) || nn != 1, i++;
        else if (!strcmp(argv[i], "-k"))
            rc = parse_list(v, o.k_list, NULL, &o.n_k, 1, 10000), i++;
        else if (!strcmp(argv[i], "--mem"))
            rc = parse_list(v, &o.mem_mb, NULL, &nn, 1, 1 << 20) || nn != 1, i++;
        else if (!strcmp(argv[i], "--cv"))
            rc = parse_list(v, NULL, o.cv_list, &o.n_cv, 1e-6, 100), i++;
        else if (argv[i][0] == '-' || n_models == 16)
            rc = -1;
        else
            models[n_models++] = argv[i];
        if (rc) {
            fprintf(stderr, "usage: rerank [-r RUNS] [--threads N] [-n N,N..] [-t TOKENS] "
                            "[-k K,K..] [--cv X,X..] [--mem MB] [MODEL.gguf ...]\n");
            return 2;
        }
    }
    static char stories[512];
    if (n_models == 0) {
        const char *q = reference_model();
        if (!q)
            return 1;
        models[n_models++] = q;
        if (testdata("models/stories260K.gguf", stories, sizeof stories))
            models[n_models++] = stories;
        else
            fprintf(stderr, "rerank: models/stories260K.gguf not found, skipped\n");
    }
    int failures = 0;
    for (int mi = 0; mi < n_models; mi++) {
        workload w = {.model = models[mi]};
        int n_vocab = answer_tokens(w.model, &w.yes, &w.no, &w.n_layer, &w.n_ctx);
        if (n_vocab < 0) {
            failures++;
            continue;
        }
        for (int ni = 0; ni < o.n_n; ni++) {
            w.n = o.n_list[ni];
            make_candidates(&w, n_vocab, o.tokens);
            if (in_child(&w, &o, 0, 0) < 0) {
                failures++;
            } else {
                failures += in_child(&w, &o, 1, 0) < 0;
                for (int c = 0; c < o.n_cv; c++)
                    failures += in_child(&w, &o, 1, o.cv_list[c]) < 0;
            }
            free_candidates(&w);
        }
    }
    return failures ? 1 : 0;
}
