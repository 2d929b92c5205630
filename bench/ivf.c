/*
 * bench/ivf — the IVF index (storage/ivf.h) against exact search and against FAISS's
 * IndexIVFFlat with the same nlist and nprobe, on one thread, in the same run.
 *
 *   build/bench/ivf [--n N] [--dim D] [--nlist L] [--nq Q] [--centers C] [--spread S]
 *                   [--runs R] [--dir DIR]
 *
 * Data: N unit vectors of D floats (default 100000 x 384) around C random directions
 * (default 1000; each vector is its direction plus Gaussian noise S times its length,
 * default 1: cosine about 0.7 to it), and Q queries (default 1000) drawn the same way. Exact top 10
 * by brute force is the truth. Both indexes train with 10 spherical k-means iterations on
 * at most 256 vectors per list (FAISS's defaults), then at nprobe 1, 8 and 32 each
 * searches the Q queries as one batch (one call) and one at a time (Q calls), runs
 * interleaved (ours, then FAISS's), R times (default 3); the median time gives queries/s.
 * FAISS runs in /usr/bin/python3 (bench/ivf_faiss.py, python3-faiss) on the same
 * vectors, written under DIR (default build/bench-ivf); without it the FAISS fields are
 * null and a message says why.
 *
 * Training in slices: the same training in steps of 256 rows, then the vectors added 256
 * at a time, as llmsd builds an index in idle time: the median and longest slice (how
 * long a request that comes waits) and the whole against one run.
 *
 * Similarity-aware search: each query's request retrieved before with a nearby query
 * (the query plus noise of a tenth of its length, k 20); the lists of those results are
 * its hints. The batch is searched plainly, with the early stop alone and with the
 * early stop and hints: lists and vectors scanned, queries/s, and whether the results
 * equal the plain search (they must).
 *
 * Hot lists: Q queries drawn around a tenth of the directions (a skewed workload) are
 * searched once to count list scans, then one at a time at nprobe 8 without and with a
 * hot copy of the most scanned lists (a tenth of the index's bytes), interleaved.
 *
 * One JSON object per line.
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench.h"
#include "engine/vdist.h"
#include "storage/ivf.h"

#define K 10
#define K_HIST 20
#define MAX_RUNS 15

typedef struct options {
    int64_t n;
    int dim, nlist, nq, centers, runs;
    float spread;
    const char *dir;
} options;

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static double uniform(void)
{
    return bench_uniform(&rng);
}

static float gauss(void)
{
    return (float)bench_gauss(&rng);
}

/* n rows around the directions dirs (n_dirs, d), noise spread times their length. */
static void draw(float *out, int64_t n, const float *dirs, int n_dirs, int d, float spread)
{
    float sigma = spread / sqrtf((float)d);
    for (int64_t i = 0; i < n; i++) {
        const float *c = dirs + (size_t)(uniform() * n_dirs) * d;
        float *x = out + (size_t)i * d;
        for (int t = 0; t < d; t++)
            x[t] = c[t] + sigma * gauss();
        vdist_normalize(x, d);
    }
}

/* Exact top K row numbers of each query (ties: lower row), by brute force. */
static int exact_top(const float *base, int64_t n, const float *q, int nq, int d, int64_t *truth)
{
    enum { QB = 64, XB = 4096 };
    float *sc = malloc(sizeof *sc * QB * XB), *best = malloc(sizeof *best * (size_t)nq * K);
    if (!sc || !best) {
        free(sc);
        free(best);
        return -1;
    }
    for (int i = 0; i < nq * K; i++) {
        best[i] = -INFINITY;
        truth[i] = -1;
    }
    for (int q0 = 0; q0 < nq; q0 += QB) {
        int m = nq - q0 < QB ? nq - q0 : QB;
        for (int64_t x0 = 0; x0 < n; x0 += XB) {
            int nb = n - x0 < XB ? (int)(n - x0) : XB;
            vdist_dot(q + (size_t)q0 * d, m, base + (size_t)x0 * d, nb, d, sc, XB);
            for (int a = 0; a < m; a++) {
                float *b = best + (size_t)(q0 + a) * K;
                int64_t *ids = truth + (size_t)(q0 + a) * K;
                for (int j = 0; j < nb; j++) {
                    float s = sc[(size_t)a * XB + j];
                    if (s <= b[K - 1])
                        continue;
                    int p = K - 1;
                    while (p > 0 && b[p - 1] < s) {
                        b[p] = b[p - 1];
                        ids[p] = ids[p - 1];
                        p--;
                    }
                    b[p] = s;
                    ids[p] = x0 + j;
                }
            }
        }
    }
    free(sc);
    free(best);
    return 0;
}

static int write_file(const char *path, const void *p, size_t bytes)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = fwrite(p, 1, bytes, f);
    return fclose(f) == 0 && w == bytes ? 0 : -1;
}

/* FAISS in a child process answering "<mode> <nprobe>" lines. */
typedef struct faiss_proc {
    pid_t pid;
    FILE *to, *from;
    double train_s, add_s;
} faiss_proc;

static int faiss_start(faiss_proc *fp, const options *o, const char *base, const char *queries,
                       const char *truth)
{
    if (system("/usr/bin/python3 -c 'import faiss' >/dev/null 2>&1") != 0) {
        fprintf(stderr, "ivf: FAISS column skipped: /usr/bin/python3 cannot import faiss "
                        "(apt-get install python3-faiss)\n");
        return -1;
    }
    int in[2], out[2];
    if (pipe(in) || pipe(out))
        return -1;
    char dim[16], nlist[16], k[16];
    snprintf(dim, sizeof dim, "%d", o->dim);
    snprintf(nlist, sizeof nlist, "%d", o->nlist);
    snprintf(k, sizeof k, "%d", K);
    fp->pid = fork();
    if (fp->pid < 0)
        return -1;
    if (fp->pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[1]);
        close(out[0]);
        execl("/usr/bin/python3", "python3", "bench/ivf_faiss.py", base, queries, truth, dim,
              nlist, k, (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    fp->to = fdopen(in[1], "w");
    fp->from = fdopen(out[0], "r");
    if (!fp->to || !fp->from || fscanf(fp->from, "ready %lf %lf", &fp->train_s, &fp->add_s) != 2) {
        fprintf(stderr, "ivf: FAISS column skipped: bench/ivf_faiss.py did not start\n");
        return -1;
    }
    return 0;
}

static int faiss_run(faiss_proc *fp, const char *mode, int nprobe, double *seconds, double *recall)
{
    fprintf(fp->to, "%s %d\n", mode, nprobe);
    fflush(fp->to);
    return fscanf(fp->from, "%lf %lf", seconds, recall) == 2 ? 0 : -1;
}

static void faiss_stop(faiss_proc *fp)
{
    if (fp->to)
        fclose(fp->to);
    if (fp->from)
        fclose(fp->from);
    if (fp->pid > 0)
        waitpid(fp->pid, NULL, 0);
}

static double recall_of(const ivf_hit *hits, const int *n_hits, int k, const int64_t *truth, int nq)
{
    int64_t found = 0;
    for (int a = 0; a < nq; a++)
        for (int i = 0; i < n_hits[a] && i < K; i++)
            for (int j = 0; j < K; j++)
                found += hits[(size_t)a * k + i].id == truth[(size_t)a * K + j];
    return (double)found / ((double)nq * K);
}

/* Seconds for the queries in one batch (single: one search per query). */
static double ours_run(ivf *ix, const float *q, const options *o, int nprobe, bool single,
                       ivf_hit *hits, int *n_hits)
{
    ivf_search_params p = {.k = K, .nprobe = nprobe};
    char err[ERR_MAX];
    double t0 = bench_now_s();
    if (single) {
        for (int a = 0; a < o->nq; a++)
            if (ivf_search_all(ix, q + (size_t)a * o->dim, 1, o->dim, &p, hits + (size_t)a * K,
                               n_hits + a, err))
                return -1;
    } else if (ivf_search_all(ix, q, o->nq, o->dim, &p, hits, n_hits, err)) {
        return -1;
    }
    return bench_now_s() - t0;
}

/* One similarity-aware search of the batch; seconds, stats and hits (k K_HIST). */
static double aware_run(ivf *ix, const float *q, const options *o, int nprobe, bool stop,
                        const ivf_hints *hints, ivf_hit *hits, ivf_search_stats *st)
{
    ivf_search_params p = {.k = K_HIST, .nprobe = nprobe, .early_stop = stop};
    double t0 = bench_now_s();
    if (bench_ivf_search(ix, q, o->nq, o->dim, &p, hints, hits, st))
        return -1;
    return bench_now_s() - t0;
}

static void similarity_aware(ivf *ix, const float *q, const options *o, int nprobe)
{
    size_t nh = (size_t)o->nq * K_HIST;
    float *prev = malloc(sizeof *prev * (size_t)o->nq * o->dim);
    ivf_hit *h_prev = malloc(sizeof *h_prev * nh), *h_plain = malloc(sizeof *h_plain * nh),
            *h_fast = malloc(sizeof *h_fast * nh);
    int32_t *lists = malloc(sizeof *lists * nh);
    ivf_hints *hints = malloc(sizeof *hints * (size_t)o->nq);
    if (!prev || !h_prev || !h_plain || !h_fast || !lists || !hints)
        goto out;
    float sigma = 0.1f / sqrtf((float)o->dim);
    for (int a = 0; a < o->nq; a++) {
        for (int t = 0; t < o->dim; t++)
            prev[(size_t)a * o->dim + t] = q[(size_t)a * o->dim + t] + sigma * gauss();
        vdist_normalize(prev + (size_t)a * o->dim, o->dim);
    }
    ivf_search_stats st[3];
    if (aware_run(ix, prev, o, nprobe, false, NULL, h_prev, &st[0]) < 0)
        goto out;
    for (int a = 0; a < o->nq; a++) {
        for (int i = 0; i < K_HIST; i++)
            lists[(size_t)a * K_HIST + i] = h_prev[(size_t)a * K_HIST + i].list;
        hints[a] = (ivf_hints){lists + (size_t)a * K_HIST, K_HIST};
    }
    static const char *const names[3] = {"plain", "early_stop", "early_stop_hints"};
    double t[3][MAX_RUNS];
    int mismatches[3] = {0, 0, 0};
    for (int r = 0; r < o->runs; r++)
        for (int m = 0; m < 3; m++) {
            ivf_hit *dst = m == 0 ? h_plain : h_fast;
            t[m][r] = aware_run(ix, q, o, nprobe, m > 0, m == 2 ? hints : NULL, dst, &st[m]);
            if (m > 0)
                for (size_t i = 0; i < nh; i++)
                    mismatches[m] += h_fast[i].id != h_plain[i].id ||
                                     h_fast[i].score != h_plain[i].score;
        }
    double plain_s = bench_median(t[0], o->runs);
    for (int m = 0; m < 3; m++) {
        double s = m == 0 ? plain_s : bench_median(t[m], o->runs);
        printf("{\"bench\":\"ivf_similarity\",\"n\":%lld,\"dim\":%d,\"nlist\":%d,\"nprobe\":%d,"
               "\"k\":%d,\"mode\":\"%s\",\"qps\":%.1f,\"qps_ratio_to_plain\":%.3f,"
               "\"lists_scanned\":%lld,\"lists_skipped\":%lld,\"vectors_scanned\":%lld,"
               "\"vectors_ratio_to_plain\":%.3f,\"results_differing_from_plain\":%d}\n",
               (long long)o->n, o->dim, o->nlist, nprobe, K_HIST, names[m], o->nq / s,
               plain_s / s, (long long)st[m].lists_scanned, (long long)st[m].lists_skipped,
               (long long)st[m].vectors_scanned,
               (double)st[m].vectors_scanned / (double)st[0].vectors_scanned, mismatches[m]);
        fflush(stdout);
    }
out:
    free(prev);
    free(h_prev);
    free(h_plain);
    free(h_fast);
    free(lists);
    free(hints);
}

static void hot_lists(ivf *ix, const float *dirs, const options *o, ivf_hit *hits, int *n_hits)
{
    int n_dirs = o->centers / 10 > 0 ? o->centers / 10 : 1;
    float *q = malloc(sizeof *q * (size_t)o->nq * o->dim);
    if (!q)
        return;
    draw(q, o->nq, dirs, n_dirs, o->dim, o->spread);
    char err[ERR_MAX];
    size_t budget = sizeof(float) * (size_t)o->n * o->dim / 10;
    double t[2][MAX_RUNS];
    if (ours_run(ix, q, o, 8, true, hits, n_hits) < 0)
        goto out;
    for (int r = 0; r < o->runs; r++)
        for (int h = 0; h < 2; h++) {
            if (ivf_hot_refresh(ix, h ? budget : 0, err)) {
                fprintf(stderr, "ivf: %s\n", err);
                goto out;
            }
            t[h][r] = ours_run(ix, q, o, 8, true, hits, n_hits);
        }
    size_t held = ivf_hot_bytes(ix);
    double cold = bench_median(t[0], o->runs), hot = bench_median(t[1], o->runs);
    printf("{\"bench\":\"ivf_hot\",\"n\":%lld,\"dim\":%d,\"nlist\":%d,\"nprobe\":8,"
           "\"queries\":\"one_per_call\",\"directions\":%d,\"hot_mb\":%.1f,"
           "\"index_mb\":%.1f,\"qps_without\":%.1f,\"qps_with\":%.1f,\"ratio\":%.3f}\n",
           (long long)o->n, o->dim, o->nlist, n_dirs, held / 1048576.0,
           sizeof(float) * (double)o->n * o->dim / 1048576.0, o->nq / cold, o->nq / hot,
           cold / hot);
    fflush(stdout);
    ivf_hot_refresh(ix, 0, err);
out:
    free(q);
}

static int parse(int argc, char **argv, options *o)
{
    *o = (options){.n = 100000, .dim = 384, .nlist = 1024, .nq = 1000, .centers = 1000,
                   .runs = 3, .spread = 1.0f, .dir = "build/bench-ivf"};
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "--n"))
            o->n = atoll(v);
        else if (!strcmp(a, "--dim"))
            o->dim = atoi(v);
        else if (!strcmp(a, "--nlist"))
            o->nlist = atoi(v);
        else if (!strcmp(a, "--nq"))
            o->nq = atoi(v);
        else if (!strcmp(a, "--centers"))
            o->centers = atoi(v);
        else if (!strcmp(a, "--spread"))
            o->spread = (float)atof(v);
        else if (!strcmp(a, "--runs"))
            o->runs = atoi(v);
        else if (!strcmp(a, "--dir"))
            o->dir = v;
        else
            return -1;
    }
    if (argc % 2 == 0 || o->n < o->nlist || o->dim < 1 || o->nq < 1 || o->centers < 1 ||
        o->runs < 1 || o->runs > MAX_RUNS || !(o->spread >= 0))
        return -1;
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct {
    const float *base;
    int dim;
} base_rows;

static void base_row(void *arg, int64_t i, float *out)
{
    const base_rows *r = arg;
    memcpy(out, r->base + (size_t)i * r->dim, sizeof *out * (size_t)r->dim);
}

/* Training and adding in slices of 256 rows, as llmsd builds an index in idle time
 * (stopping between two slices when a request comes): how long a slice takes, which is
 * how long a request can wait, and the whole against one run's train_s. */
static int train_in_slices(const float *base, const options *o, double train_s, char *err)
{
    enum { SLICE = 256 };
    ivf *ix = ivf_new(o->dim, err);
    ivf_train_params tp = {.nlist = o->nlist, .seed = 1};
    base_rows r = {base, o->dim};
    ivf_trainer *t = ix ? ivf_trainer_new(ix, o->n, &tp, base_row, &r, err) : NULL;
    int64_t n_slices = 0, cap = 10 * ((o->n + SLICE - 1) / SLICE) + 16;
    double *ms = malloc(sizeof *ms * (size_t)cap);
    int64_t *ids = malloc(sizeof *ids * SLICE);
    if (!t || !ms || !ids) {
        if (ix && t)
            err_set(err, "out of memory");
        free(ms);
        free(ids);
        ivf_trainer_free(t);
        ivf_free(ix);
        return -1;
    }
    double t0 = bench_now_s(), add_max = 0;
    int rc;
    do {
        double s0 = bench_now_s();
        rc = ivf_trainer_step(t, SLICE, err);
        if (n_slices < cap)
            ms[n_slices++] = (bench_now_s() - s0) * 1e3;
    } while (rc == 0);
    double stepped_s = bench_now_s() - t0;
    for (int64_t i0 = 0; rc == 1 && i0 < o->n; i0 += SLICE) {
        int64_t m = o->n - i0 < SLICE ? o->n - i0 : SLICE;
        for (int64_t i = 0; i < m; i++)
            ids[i] = i0 + i;
        double s0 = bench_now_s();
        if (ivf_add(ix, ids, base + (size_t)i0 * o->dim, m, o->dim, err))
            rc = -1;
        double a = (bench_now_s() - s0) * 1e3;
        add_max = a > add_max ? a : add_max;
    }
    if (rc == 1) {
        qsort(ms, (size_t)n_slices, sizeof *ms, cmp_double);
        printf("{\"bench\":\"ivf_train_in_slices\",\"n\":%lld,\"dim\":%d,\"nlist\":%d,"
               "\"slice_rows\":%d,\"slices\":%lld,\"slice_ms_median\":%.2f,"
               "\"slice_ms_max\":%.2f,\"add_slice_ms_max\":%.2f,\"train_s\":%.2f,"
               "\"ratio_to_one_run\":%.3f}\n",
               (long long)o->n, o->dim, o->nlist, SLICE, (long long)n_slices,
               ms[n_slices / 2], ms[n_slices - 1], add_max, stepped_s, stepped_s / train_s);
        fflush(stdout);
    }
    free(ms);
    free(ids);
    ivf_trainer_free(t);
    ivf_free(ix);
    return rc == 1 ? 0 : -1;
}

int main(int argc, char **argv)
{
    options o;
    if (parse(argc, argv, &o)) {
        fprintf(stderr, "usage: ivf [--n N] [--dim D] [--nlist L] [--nq Q] [--centers C] "
                        "[--spread S] [--runs R (1..%d)] [--dir DIR]\n", MAX_RUNS);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    size_t nb = (size_t)o.n * o.dim;
    float *dirs = malloc(sizeof *dirs * (size_t)o.centers * o.dim);
    float *base = malloc(sizeof *base * nb), *q = malloc(sizeof *q * (size_t)o.nq * o.dim);
    int64_t *truth = malloc(sizeof *truth * (size_t)o.nq * K), *ids = malloc(sizeof *ids * (size_t)o.n);
    ivf_hit *hits = malloc(sizeof *hits * (size_t)o.nq * K);
    int *n_hits = malloc(sizeof *n_hits * (size_t)o.nq);
    if (!dirs || !base || !q || !truth || !ids || !hits || !n_hits) {
        fprintf(stderr, "ivf: out of memory\n");
        return 1;
    }
    for (int i = 0; i < o.centers; i++) {
        for (int t = 0; t < o.dim; t++)
            dirs[(size_t)i * o.dim + t] = gauss();
        vdist_normalize(dirs + (size_t)i * o.dim, o.dim);
    }
    draw(base, o.n, dirs, o.centers, o.dim, o.spread);
    draw(q, o.nq, dirs, o.centers, o.dim, o.spread);
    double t0 = bench_now_s();
    if (exact_top(base, o.n, q, o.nq, o.dim, truth)) {
        fprintf(stderr, "ivf: out of memory\n");
        return 1;
    }
    double exact_s = bench_now_s() - t0;

    char base_path[512], query_path[512], truth_path[512];
    snprintf(base_path, sizeof base_path, "%s/base.f32", o.dir);
    snprintf(query_path, sizeof query_path, "%s/queries.f32", o.dir);
    snprintf(truth_path, sizeof truth_path, "%s/truth.i64", o.dir);
    faiss_proc fp = {0};
    bool have_faiss = false;
    if ((mkdir(o.dir, 0755) == 0 || errno == EEXIST) &&
        write_file(base_path, base, sizeof *base * nb) == 0 &&
        write_file(query_path, q, sizeof *q * (size_t)o.nq * o.dim) == 0 &&
        write_file(truth_path, truth, sizeof *truth * (size_t)o.nq * K) == 0)
        have_faiss = faiss_start(&fp, &o, base_path, query_path, truth_path) == 0;
    else
        fprintf(stderr, "ivf: FAISS column skipped: cannot write the vectors under %s\n", o.dir);

    char err[ERR_MAX];
    ivf *ix = ivf_new(o.dim, err);
    ivf_train_params tp = {.nlist = o.nlist, .seed = 1};
    t0 = bench_now_s();
    if (!ix || ivf_train(ix, base, o.n, o.dim, &tp, err)) {
        fprintf(stderr, "ivf: %s\n", err);
        return 1;
    }
    double train_s = bench_now_s() - t0;
    for (int64_t i = 0; i < o.n; i++)
        ids[i] = i;
    t0 = bench_now_s();
    if (ivf_add(ix, ids, base, o.n, o.dim, err)) {
        fprintf(stderr, "ivf: %s\n", err);
        return 1;
    }
    double add_s = bench_now_s() - t0;
    printf("{\"bench\":\"ivf_build\",\"n\":%lld,\"dim\":%d,\"nlist\":%d,\"spread\":%.2f,\"kernel\":%d,"
           "\"exact_s\":%.2f,\"train_s\":%.2f,\"add_s\":%.2f,\"faiss_train_s\":",
           (long long)o.n, o.dim, o.nlist, o.spread, (int)vdist_level(), exact_s, train_s, add_s);
    if (have_faiss)
        printf("%.2f,\"faiss_add_s\":%.2f}\n", fp.train_s, fp.add_s);
    else
        printf("null,\"faiss_add_s\":null}\n");
    fflush(stdout);

    if (train_in_slices(base, &o, train_s, err)) {
        fprintf(stderr, "ivf: %s\n", err);
        return 1;
    }

    static const int nprobes[] = {1, 8, 32};
    for (size_t pi = 0; pi < sizeof nprobes / sizeof nprobes[0]; pi++)
        for (int single = 0; single < 2; single++) {
            double ours[MAX_RUNS], theirs[MAX_RUNS], recall = 0, f_recall = 0;
            for (int r = 0; r < o.runs; r++) {
                ours[r] = ours_run(ix, q, &o, nprobes[pi], single, hits, n_hits);
                if (ours[r] < 0) {
                    fprintf(stderr, "ivf: search failed\n");
                    return 1;
                }
                recall = recall_of(hits, n_hits, K, truth, o.nq);
                if (have_faiss &&
                    faiss_run(&fp, single ? "single" : "batch", nprobes[pi], &theirs[r], &f_recall)) {
                    fprintf(stderr, "ivf: FAISS stopped answering\n");
                    have_faiss = false;
                }
            }
            double qps = o.nq / bench_median(ours, o.runs);
            printf("{\"bench\":\"ivf\",\"n\":%lld,\"dim\":%d,\"nlist\":%d,\"nprobe\":%d,"
                   "\"queries\":\"%s\",\"threads\":1,\"recall10\":%.4f,\"qps\":%.1f,",
                   (long long)o.n, o.dim, o.nlist, nprobes[pi], single ? "one_per_call" : "batch",
                   recall, qps);
            if (have_faiss) {
                double f_qps = o.nq / bench_median(theirs, o.runs);
                printf("\"faiss_recall10\":%.4f,\"faiss_qps\":%.1f,\"qps_ratio_to_faiss\":%.2f}\n",
                       f_recall, f_qps, qps / f_qps);
            } else {
                printf("\"faiss_recall10\":null,\"faiss_qps\":null,\"qps_ratio_to_faiss\":null}\n");
            }
            fflush(stdout);
        }
    if (have_faiss)
        faiss_stop(&fp);
    similarity_aware(ix, q, &o, 8);
    similarity_aware(ix, q, &o, 32);
    hot_lists(ix, dirs, &o, hits, n_hits);
    ivf_free(ix);
    free(dirs);
    free(base);
    free(q);
    free(truth);
    free(ids);
    free(hits);
    free(n_hits);
    return 0;
}
