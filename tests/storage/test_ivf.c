/* Tests of the IVF index: recall against exact search, the step API against the one-shot
 * search, training in steps against one run, similarity-aware search with the early stop against the plain search,
 * persistence (ids stored, vectors given back on load), per-app isolation, hot lists and
 * bad input. */
#include <limits.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/vdist.h"
#include "storage/ivf.h"
#include "storage/kb.h"
#include "tests/support/test.h"

#define DIM 48
#define N 6000
#define NQ 40
#define NLIST 60
#define K 10

static float frand(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (float)((*s >> 8) & 0xFFFF) / 65536.0f * 2.0f - 1.0f;
}

/* n unit vectors around n_centers random directions (noise of the given size). */
static float *clustered(int n, int d, int n_centers, float noise, unsigned seed)
{
    float *c = malloc(sizeof *c * (size_t)n_centers * d), *v = malloc(sizeof *v * (size_t)n * d);
    if (!c || !v) {
        free(c);
        free(v);
        return NULL;
    }
    unsigned s = seed;
    for (int i = 0; i < n_centers * d; i++)
        c[i] = frand(&s);
    for (int i = 0; i < n; i++) {
        int k = (int)((unsigned)i * 2654435761u % (unsigned)n_centers);
        for (int t = 0; t < d; t++)
            v[(size_t)i * d + t] = c[(size_t)k * d + t] + noise * frand(&s);
        vdist_normalize(v + (size_t)i * d, d);
    }
    free(c);
    return v;
}

static int64_t id_of(int i)
{
    return 1000 + 7 * (int64_t)i;
}

/* A trained index of the first n of vecs (ids id_of(i)). */
static ivf *build(const float *vecs, int n, int nlist, char *err)
{
    ivf *ix = ivf_new(DIM, err);
    if (!ix)
        return NULL;
    int64_t *ids = malloc(sizeof *ids * (size_t)n);
    ivf_train_params tp = {.nlist = nlist, .iters = 8, .seed = 42};
    if (!ids || ivf_train(ix, vecs, n, DIM, &tp, err)) {
        free(ids);
        ivf_free(ix);
        return NULL;
    }
    for (int i = 0; i < n; i++)
        ids[i] = id_of(i);
    int rc = ivf_add(ix, ids, vecs, n, DIM, err);
    free(ids);
    if (rc) {
        ivf_free(ix);
        return NULL;
    }
    return ix;
}

/* The first n of vecs as the index keeps them (int8 and a scale each), with their ids:
 * what a caller gives ivf_load. Free with rows_free. */
static ivf_rows rows_of(const float *vecs, int n)
{
    int64_t *ids = malloc(sizeof *ids * (size_t)n);
    int8_t *q = malloc((size_t)n * DIM);
    float *scale = malloc(sizeof *scale * (size_t)n);
    for (int i = 0; ids && q && scale && i < n; i++) {
        ids[i] = id_of(i);
        store_vec_quantize(vecs + (size_t)i * DIM, DIM, q + (size_t)i * DIM, &scale[i]);
    }
    return (ivf_rows){ids, q, scale, ids && q && scale ? n : 0, DIM};
}

static void rows_free(ivf_rows *r)
{
    free((void *)r->ids);
    free((void *)r->q);
    free((void *)r->scale);
}

/* Exact top k of each query over vecs, as float32 (q8 false) or as the index scores them
 * (q8: int8 rows and the query quantized, the same kernel), ties to the lower id. */
static void exact(const float *vecs, int n, const float *q, int nq, bool q8, ivf_hit *out)
{
    float *sc = malloc(sizeof *sc * (size_t)n);
    ivf_rows r = rows_of(vecs, q8 ? n : 0);
    for (int a = 0; a < nq; a++) {
        int16_t qq[DIM];
        float qs;
        vdist_quantize_query(q + (size_t)a * DIM, DIM, qq, &qs);
        if (q8)
            vdist_dot_q8(qq, &qs, 1, r.q, r.scale, n, DIM, sc, (size_t)n);
        else
            vdist_dot(q + (size_t)a * DIM, 1, vecs, n, DIM, sc, (size_t)n);
        ivf_hit *h = out + (size_t)a * K;
        int m = 0;
        for (int i = 0; i < n; i++) {
            ivf_hit x = {id_of(i), sc[i], -1};
            int j = m < K ? m++ : K - 1;
            if (j == K - 1 && m == K && !(x.score > h[j].score || (x.score == h[j].score && x.id < h[j].id)))
                continue;
            while (j > 0 && (h[j - 1].score < x.score ||
                             (h[j - 1].score == x.score && h[j - 1].id > x.id))) {
                h[j] = h[j - 1];
                j--;
            }
            h[j] = x;
        }
    }
    rows_free(&r);
    free(sc);
}

static bool same_hits(const ivf_hit *a, const ivf_hit *b, int n)
{
    for (int i = 0; i < n; i++)
        if (a[i].id != b[i].id || memcmp(&a[i].score, &b[i].score, sizeof a[i].score) != 0)
            return false;
    return true;
}

/* Queries near the data: data vectors moved by noise. */
static float *queries_near(const float *data, float noise, unsigned seed)
{
    float *q = malloc(sizeof *q * NQ * DIM);
    if (!q)
        return NULL;
    unsigned s = seed;
    for (int a = 0; a < NQ; a++) {
        const float *x = data + (size_t)((unsigned)a * 7919u % N) * DIM;
        for (int t = 0; t < DIM; t++)
            q[a * DIM + t] = x[t] + noise * frand(&s);
        vdist_normalize(q + a * DIM, DIM);
    }
    return q;
}

static void test_recall_against_exact(void)
{
    char err[ERR_MAX];
    float *v = clustered(N, DIM, 40, 0.8f, 1), *q = v ? queries_near(v, 0.05f, 2) : NULL;
    CHECK(v && q);
    ivf *ix = build(v, N, NLIST, err);
    CHECK_MSG(ix, "%s", err);
    CHECK_EQ(ivf_count(ix), N);
    CHECK_EQ(ivf_nlist(ix), NLIST);
    static ivf_hit truth[NQ * K], got[NQ * K], f32[NQ * K];
    int n_hits[NQ];
    exact(v, N, q, NQ, true, truth);
    /* int8 rows keep the float32 neighbours (to their rounding) */
    exact(v, N, q, NQ, false, f32);
    int kept = 0;
    for (int a = 0; a < NQ; a++)
        for (int i = 0; i < K; i++)
            for (int j = 0; j < K; j++)
                kept += truth[a * K + i].id == f32[a * K + j].id;
    CHECK_MSG(kept >= NQ * K * 95 / 100, "int8 rows keep %d of %d float32 neighbours", kept,
              NQ * K);
    /* all lists: exactly the exact search of the rows held */
    ivf_search_params all = {.k = K, .nprobe = NLIST};
    CHECK_MSG(ivf_search_all(ix, q, NQ, DIM, &all, got, n_hits, err) == 0, "%s", err);
    for (int a = 0; a < NQ; a++) {
        CHECK_EQ(n_hits[a], K);
        CHECK_MSG(same_hits(got + a * K, truth + a * K, K), "query %d", a);
    }
    /* a sixth of the lists: most of the true neighbours, more with more lists */
    double recall[2];
    int probes[2] = {2, 10};
    for (int r = 0; r < 2; r++) {
        ivf_search_params p = {.k = K, .nprobe = probes[r]};
        CHECK_MSG(ivf_search_all(ix, q, NQ, DIM, &p, got, n_hits, err) == 0, "%s", err);
        int found = 0;
        for (int a = 0; a < NQ; a++)
            for (int i = 0; i < n_hits[a]; i++)
                for (int j = 0; j < K; j++)
                    found += got[a * K + i].id == truth[a * K + j].id;
        recall[r] = (double)found / (NQ * K);
    }
    CHECK_MSG(recall[1] >= 0.9 && recall[1] > recall[0], "recall %.3f at nprobe 2, %.3f at 10",
              recall[0], recall[1]);
    ivf_free(ix);
    free(v);
    free(q);
}

/* Results of a search run in steps of max_lists lists, with stats. */
static int run_steps(ivf *ix, const float *q, const ivf_search_params *p, const ivf_hints *h,
                     int max_lists, ivf_hit *out, ivf_search_stats *st, char *err)
{
    ivf_search *s = ivf_search_begin(ix, q, NQ, DIM, p, h, err);
    if (!s)
        return -1;
    int steps = 0;
    while (!ivf_search_step(s, max_lists))
        steps++;
    for (int a = 0; a < NQ; a++) {
        int n = ivf_search_results(s, a, out + a * p->k);
        for (int i = n; i < p->k; i++)
            out[a * p->k + i] = (ivf_hit){-1, 0, -1};
    }
    if (st)
        ivf_search_get_stats(s, st);
    ivf_search_free(s);
    return steps;
}

static void test_steps_equal_one_shot(void)
{
    char err[ERR_MAX];
    float *v = clustered(N, DIM, 40, 0.8f, 3), *q = v ? queries_near(v, 0.05f, 4) : NULL;
    CHECK(v && q);
    ivf *ix = build(v, N, NLIST, err);
    CHECK_MSG(ix, "%s", err);
    static ivf_hit one[NQ * K], part[NQ * K];
    ivf_search_params p = {.k = K, .nprobe = 12};
    CHECK(run_steps(ix, q, &p, NULL, INT_MAX, one, NULL, err) >= 0);
    int sizes[] = {1, 3, 17};
    for (int t = 0; t < 3; t++) {
        int steps = run_steps(ix, q, &p, NULL, sizes[t], part, NULL, err);
        CHECK_MSG(steps >= 0, "%s", err);
        if (sizes[t] == 1)
            CHECK(steps >= 12);
        for (int a = 0; a < NQ; a++)
            CHECK_MSG(same_hits(one + a * K, part + a * K, K), "steps of %d, query %d", sizes[t], a);
    }
    /* partial results are the best of what was scanned so far: the one-step search's k-th
     * score bounds every partial k-th score from below */
    ivf_search *s = ivf_search_begin(ix, q, NQ, DIM, &p, NULL, err);
    CHECK(s);
    CHECK(!ivf_search_step(s, 1));
    ivf_hit h[K];
    int n = ivf_search_results(s, 0, h);
    for (int i = 0; i < n; i++)
        CHECK(h[i].score <= one[i].score);
    ivf_search_free(s);
    ivf_free(ix);
    free(v);
    free(q);
}

typedef struct {
    const float *vecs;
    int64_t asked; /* rows the trainer read */
} test_rows;

static void test_row(void *arg, int64_t i, float *out)
{
    test_rows *r = arg;
    memcpy(out, r->vecs + (size_t)i * DIM, sizeof *out * DIM);
    r->asked++;
}

/* Training in steps of any size gives ivf_train's centroids (the same lists for every
 * vector and query), the index untrained until the last step, and only the sample read. */
static void test_training_in_steps_equals_one_run(void)
{
    char err[ERR_MAX];
    float *v = clustered(N, DIM, 40, 0.8f, 5), *q = v ? queries_near(v, 0.05f, 6) : NULL;
    CHECK(v && q);
    ivf *one = build(v, N, NLIST, err);
    CHECK_MSG(one, "%s", err);
    static ivf_hit want[NQ * K], got[NQ * K];
    ivf_search_params p = {.k = K, .nprobe = 2};
    CHECK(run_steps(one, q, &p, NULL, INT_MAX, want, NULL, err) >= 0);
    int64_t *ids = malloc(sizeof *ids * N);
    CHECK(ids);
    for (int i = 0; i < N; i++)
        ids[i] = id_of(i);
    /* a sample smaller than the vectors, so that not every row is read */
    int per = 50;
    ivf_train_params tp = {.nlist = NLIST, .iters = 8, .max_points_per_list = per, .seed = 42};
    ivf *small_one = ivf_new(DIM, err);
    CHECK(small_one && ivf_train(small_one, v, N, DIM, &tp, err) == 0 &&
          ivf_add(small_one, ids, v, N, DIM, err) == 0);
    static ivf_hit want_small[NQ * K];
    CHECK(run_steps(small_one, q, &p, NULL, INT_MAX, want_small, NULL, err) >= 0);
    int64_t sizes[] = {1, 300, 1000, INT64_MAX};
    for (int t = 0; t < 4; t++) {
        for (int small = 0; small < 2; small++) {
            ivf_train_params sp = {.nlist = NLIST, .iters = 8, .seed = 42};
            if (small)
                sp.max_points_per_list = per;
            ivf *ix = ivf_new(DIM, err);
            CHECK(ix);
            test_rows r = {v, 0};
            ivf_trainer *tr = ivf_trainer_new(ix, N, &sp, test_row, &r, err);
            CHECK_MSG(tr, "%s", err);
            int64_t m = small ? (int64_t)NLIST * per : N;
            CHECK_EQ(r.asked, m);
            int steps = 0, rc;
            while ((rc = ivf_trainer_step(tr, sizes[t], err)) == 0) {
                CHECK_EQ(ivf_nlist(ix), 0);
                steps++;
            }
            CHECK_MSG(rc == 1, "%s", err);
            ivf_trainer_free(tr);
            /* a step of 1 row scores one block of 256 */
            if (sizes[t] == 1)
                CHECK_EQ(steps + 1, 8 * (int)((m + 255) / 256));
            CHECK_EQ(ivf_nlist(ix), NLIST);
            CHECK(ivf_add(ix, ids, v, N, DIM, err) == 0);
            CHECK(run_steps(ix, q, &p, NULL, INT_MAX, got, NULL, err) >= 0);
            const ivf_hit *w = small ? want_small : want;
            for (int a = 0; a < NQ; a++)
                CHECK_MSG(same_hits(w + a * K, got + a * K, K),
                          "steps of %lld rows, sample of %lld, query %d", (long long)sizes[t],
                          (long long)m, a);
            for (int i = 0; i < NQ * K; i++)
                CHECK_EQ(got[i].list, w[i].list);
            ivf_free(ix);
        }
    }
    /* a trained index is refused, and so is a non-finite sampled row */
    test_rows r = {v, 0};
    CHECK(!ivf_trainer_new(one, N, &tp, test_row, &r, err));
    float *bad = malloc(sizeof *bad * N * DIM);
    CHECK(bad);
    memcpy(bad, v, sizeof *bad * N * DIM);
    bad[(size_t)7 * DIM + 3] = NAN;
    ivf *ix = ivf_new(DIM, err);
    test_rows rb = {bad, 0};
    CHECK(!ivf_trainer_new(ix, N, &(ivf_train_params){.nlist = NLIST, .seed = 1}, test_row,
                           &rb, err));
    CHECK(strstr(err, "not finite"));
    ivf_free(ix);
    free(bad);
    free(ids);
    ivf_free(small_one);
    ivf_free(one);
    free(v);
    free(q);
}

static void test_similarity_aware_equals_plain(void)
{
    char err[ERR_MAX];
    float *v = clustered(N, DIM, 40, 0.3f, 5), *q = v ? queries_near(v, 0.05f, 6) : NULL;
    CHECK(v && q);
    ivf *ix = build(v, N, NLIST, err);
    CHECK_MSG(ix, "%s", err);
    enum { KH = 20 };
    static ivf_hit plain[NQ * KH], fast[NQ * KH], prev[NQ * KH];
    static float q2[NQ * DIM];
    /* the request's previous retrieval: a nearby query; its results' lists are the hints */
    unsigned s = 9;
    for (int i = 0; i < NQ * DIM; i++)
        q2[i] = q[i] + 0.05f * frand(&s);
    ivf_search_params p = {.k = KH, .nprobe = 16};
    CHECK(run_steps(ix, q2, &p, NULL, INT_MAX, prev, NULL, err) >= 0);
    static int32_t lists[NQ][KH], junk[NQ][3];
    ivf_hints hints[NQ], bad[NQ];
    for (int a = 0; a < NQ; a++) {
        for (int i = 0; i < KH; i++)
            lists[a][i] = prev[a * KH + i].list;
        hints[a] = (ivf_hints){lists[a], KH};
        /* stale hints: lists out of range or not among the query's */
        junk[a][0] = -5;
        junk[a][1] = NLIST + 3;
        junk[a][2] = (a * 7) % NLIST;
        bad[a] = (ivf_hints){junk[a], 3};
    }
    ivf_search_stats st_plain, st_stop, st_hint, st_bad;
    CHECK(run_steps(ix, q, &p, NULL, INT_MAX, plain, &st_plain, err) >= 0);
    p.early_stop = true;
    CHECK(run_steps(ix, q, &p, NULL, 1, fast, &st_stop, err) >= 0);
    for (int a = 0; a < NQ; a++)
        CHECK_MSG(same_hits(plain + a * KH, fast + a * KH, KH), "early stop, query %d", a);
    CHECK(run_steps(ix, q, &p, hints, 2, fast, &st_hint, err) >= 0);
    for (int a = 0; a < NQ; a++)
        CHECK_MSG(same_hits(plain + a * KH, fast + a * KH, KH), "hints, query %d", a);
    CHECK(run_steps(ix, q, &p, bad, INT_MAX, fast, &st_bad, err) >= 0);
    for (int a = 0; a < NQ; a++)
        CHECK_MSG(same_hits(plain + a * KH, fast + a * KH, KH), "stale hints, query %d", a);
    CHECK_EQ(st_plain.lists_skipped, 0);
    CHECK_EQ(st_plain.lists_scanned, NQ * 16);
    CHECK_EQ(st_hint.lists_scanned + st_hint.lists_skipped, NQ * 16);
    /* the early stop saves work, with hints or without (hints only reorder, so which saves
     * more depends on the data) */
    CHECK_MSG(st_stop.vectors_scanned < st_plain.vectors_scanned &&
                  st_hint.vectors_scanned < st_plain.vectors_scanned && st_stop.lists_skipped > 0 &&
                  st_hint.lists_skipped > 0,
              "vectors scanned: plain %lld, stop %lld, hints %lld",
              (long long)st_plain.vectors_scanned, (long long)st_stop.vectors_scanned,
              (long long)st_hint.vectors_scanned);
    ivf_free(ix);
    free(v);
    free(q);
}

static const char *fresh_dir(const char *name)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s/state", test_tmpdir(), name);
    return path;
}

static void test_persistence(void)
{
    char err[ERR_MAX];
    float *v = clustered(N, DIM, 40, 0.8f, 7), *q = v ? queries_near(v, 0.05f, 8) : NULL;
    CHECK(v && q);
    const char *dir = fresh_dir("persist");
    store *st = store_open(dir, err);
    CHECK_MSG(st, "%s", err);
    int64_t app;
    CHECK(store_app_id(st, 1000, "notes", &app, err) == 0);
    ivf *ix = build(v, N / 2, NLIST, err);
    CHECK_MSG(ix, "%s", err);
    CHECK_MSG(ivf_save(st, app, "kb:1", ix, err) == 0, "%s", err);
    /* a second save writes only the lists that changed */
    static int64_t more_ids[N / 2];
    for (int i = 0; i < N / 2; i++)
        more_ids[i] = id_of(N / 2 + i);
    CHECK(ivf_add(ix, more_ids, v + (size_t)(N / 2) * DIM, N / 2, DIM, err) == 0);
    int64_t removed;
    CHECK(ivf_remove(ix, more_ids, 10, &removed, err) == 0);
    CHECK_EQ(removed, 10);
    CHECK_MSG(ivf_save(st, app, "kb:1", ix, err) == 0, "%s", err);
    static ivf_hit before[NQ * K], after[NQ * K];
    int nb[NQ], na[NQ];
    ivf_search_params p = {.k = K, .nprobe = 8};
    CHECK(ivf_search_all(ix, q, NQ, DIM, &p, before, nb, err) == 0);
    for (int a = 0; a < NQ; a++)
        for (int i = 0; i < nb[a]; i++)
            CHECK(before[a * K + i].id < more_ids[0] || before[a * K + i].id > more_ids[9]);
    ivf_free(ix);
    store_close(st);

    st = store_open(dir, err);
    CHECK_MSG(st, "%s", err);
    bool found;
    ivf_rows rows = rows_of(v, N);
    CHECK_EQ(rows.n, N);
    CHECK_MSG(ivf_load(st, app, "kb:1", &rows, &ix, &found, err) == 0 && found, "%s", err);
    CHECK_EQ(ivf_count(ix), N - 10);
    CHECK(ivf_search_all(ix, q, NQ, DIM, &p, after, na, err) == 0);
    for (int a = 0; a < NQ; a++) {
        CHECK_EQ(na[a], nb[a]);
        CHECK_MSG(same_hits(before + a * K, after + a * K, nb[a]), "query %d", a);
    }
    /* an id the caller no longer has is left out, and its list written again */
    ivf_free(ix);
    ivf_rows fewer = rows;
    fewer.n = N / 2;
    CHECK_MSG(ivf_load(st, app, "kb:1", &fewer, &ix, &found, err) == 0 && found, "%s", err);
    CHECK_EQ(ivf_count(ix), N / 2);
    CHECK_MSG(ivf_save(st, app, "kb:1", ix, err) == 0, "%s", err);
    ivf_free(ix);
    CHECK(ivf_load(st, app, "kb:1", &rows, &ix, &found, err) == 0 && found);
    CHECK_EQ(ivf_count(ix), N / 2);
    ivf_free(ix);
    /* rows of another dimension are refused */
    ivf_rows wrong = rows;
    wrong.dim = DIM + 1;
    CHECK(ivf_load(st, app, "kb:1", &wrong, &ix, &found, err) == -1 && !ix);
    CHECK_MSG(strstr(err, "dimensions"), "%s", err);
    /* a retrained index under the same name replaces the old one */
    ivf *small = build(v, 500, 5, err);
    CHECK(small);
    CHECK_MSG(ivf_save(st, app, "kb:1", small, err) == 0, "%s", err);
    ivf_free(small);
    CHECK(ivf_load(st, app, "kb:1", &rows, &ix, &found, err) == 0 && found);
    CHECK_EQ(ivf_nlist(ix), 5);
    CHECK_EQ(ivf_count(ix), 500);
    ivf_free(ix);
    CHECK(ivf_drop(st, app, "kb:1", &found, err) == 0 && found);
    CHECK(ivf_load(st, app, "kb:1", &rows, &ix, &found, err) == 0 && !found && !ix);
    rows_free(&rows);
    CHECK(ivf_drop(st, app, "kb:1", &found, err) == 0 && !found);
    store_close(st);
    free(v);
    free(q);
}

static void test_per_app_isolation(void)
{
    char err[ERR_MAX];
    float *v = clustered(2000, DIM, 10, 0.5f, 11), *w = clustered(1000, DIM, 10, 0.5f, 12);
    CHECK(v && w);
    store *st = store_open(fresh_dir("apps"), err);
    CHECK_MSG(st, "%s", err);
    int64_t a1, a2;
    CHECK(store_app_id(st, 1000, "mail", &a1, err) == 0);
    CHECK(store_app_id(st, 1001, "mail", &a2, err) == 0);
    ivf *x1 = build(v, 2000, 10, err), *x2 = build(w, 1000, 7, err);
    CHECK(x1 && x2);
    CHECK(ivf_save(st, a1, "docs", x1, err) == 0);
    CHECK(ivf_save(st, a2, "docs", x2, err) == 0);
    ivf *l1, *l2;
    bool found;
    ivf_rows r1 = rows_of(v, 2000), r2 = rows_of(w, 1000);
    CHECK(ivf_load(st, a1, "docs", &r1, &l1, &found, err) == 0 && found);
    CHECK(ivf_load(st, a2, "docs", &r2, &l2, &found, err) == 0 && found);
    CHECK_EQ(ivf_count(l1), 2000);
    CHECK_EQ(ivf_count(l2), 1000);
    CHECK_EQ(ivf_nlist(l2), 7);
    CHECK(ivf_drop(st, a2, "docs", &found, err) == 0 && found);
    ivf_free(l1);
    CHECK(ivf_load(st, a1, "docs", &r1, &l1, &found, err) == 0 && found);
    CHECK_EQ(ivf_count(l1), 2000);
    ivf *none;
    CHECK(ivf_load(st, a2, "docs", &r2, &none, &found, err) == 0 && !found);
    rows_free(&r1);
    rows_free(&r2);
    ivf_free(l1);
    ivf_free(l2);
    ivf_free(x1);
    ivf_free(x2);
    store_close(st);
    free(v);
    free(w);
}

static void test_hot_lists(void)
{
    char err[ERR_MAX];
    float *v = clustered(N, DIM, 40, 0.8f, 13), *q = v ? queries_near(v, 0.05f, 14) : NULL;
    CHECK(v && q);
    ivf *ix = build(v, N, NLIST, err);
    CHECK(ix);
    int32_t hot[NLIST];
    CHECK_EQ(ivf_hot_lists(ix, 4, hot), 0);
    /* the same query three times, another once: the first one's lists lead */
    static ivf_hit h[3 * K];
    int n[3];
    ivf_search_params p = {.k = K, .nprobe = 1};
    static float three[3 * DIM];
    for (int i = 0; i < 3; i++)
        memcpy(three + i * DIM, q, sizeof(float) * DIM);
    CHECK(ivf_search_all(ix, three, 3, DIM, &p, h, n, err) == 0);
    CHECK(ivf_search_all(ix, q + 5 * DIM, 1, DIM, &p, h, n, err) == 0);
    int got = ivf_hot_lists(ix, 4, hot);
    CHECK(got >= 1 && got <= 2);
    ivf_search *s = ivf_search_begin(ix, q, 1, DIM, &p, NULL, err);
    CHECK(s);
    ivf_search_step(s, 1);
    ivf_hit first[K];
    CHECK(ivf_search_results(s, 0, first) > 0);
    CHECK_EQ(hot[0], first[0].list);
    ivf_search_free(s);

    /* the hot copy: at most its budget, the hottest list first, the same results */
    static ivf_hit cold[NQ * K], warm[NQ * K];
    int nc[NQ], nw[NQ];
    ivf_search_params all = {.k = K, .nprobe = 6};
    CHECK(ivf_search_all(ix, q, NQ, DIM, &all, cold, nc, err) == 0);
    size_t budget = (size_t)N / 4 * STORE_VEC_BYTES(DIM);
    CHECK_MSG(ivf_hot_refresh(ix, budget, err) == 0, "%s", err);
    size_t held = ivf_hot_bytes(ix);
    CHECK(held > 0 && held <= budget);
    /* a refresh between the steps of a search changes nothing either */
    s = ivf_search_begin(ix, q, NQ, DIM, &all, NULL, err);
    CHECK(s);
    ivf_search_step(s, 2);
    CHECK(ivf_hot_refresh(ix, budget / 2, err) == 0);
    while (!ivf_search_step(s, 2))
        ;
    for (int a = 0; a < NQ; a++) {
        nw[a] = ivf_search_results(s, a, warm + a * K);
        CHECK_EQ(nw[a], nc[a]);
        CHECK_MSG(same_hits(cold + a * K, warm + a * K, nc[a]), "query %d", a);
    }
    ivf_search_free(s);
    /* a change to a hot list takes it out of the copy */
    size_t before = ivf_hot_bytes(ix);
    int64_t one = 99;
    CHECK(ivf_add(ix, &one, q, 1, DIM, err) == 0);
    CHECK(ivf_hot_bytes(ix) < before);
    CHECK(ivf_hot_refresh(ix, 0, err) == 0);
    CHECK_EQ(ivf_hot_bytes(ix), 0);
    ivf_free(ix);
    free(v);
    free(q);
}

/* Runs sql on the closed store's database. */
static bool poke(const char *dir, const char *sql)
{
    char path[600];
    snprintf(path, sizeof path, "%s/llmsd.db", dir);
    sqlite3 *db;
    if (sqlite3_open(path, &db) != SQLITE_OK)
        return false;
    bool ok = sqlite3_exec(db, sql, NULL, NULL, NULL) == SQLITE_OK && sqlite3_changes(db) > 0;
    sqlite3_close(db);
    return ok;
}

static void test_bad_input(void)
{
    char err[ERR_MAX];
    float *v = clustered(1000, DIM, 10, 0.5f, 15);
    CHECK(v);
    CHECK(!ivf_new(0, err));
    CHECK(!ivf_new(IVF_DIM_MAX + 1, err));
    ivf *ix = ivf_new(DIM, err);
    CHECK(ix);
    int64_t ids[2] = {1, 2};
    ivf_search_params p = {.k = K, .nprobe = 4};
    ivf_hit h[K];
    int n;
    /* empty (untrained) index */
    CHECK(ivf_search_all(ix, v, 1, DIM, &p, h, &n, err) == -1);
    CHECK_MSG(strstr(err, "not trained"), "%s", err);
    CHECK(ivf_add(ix, ids, v, 2, DIM, err) == -1);
    ivf_train_params tp = {.nlist = 10, .seed = 1};
    /* dimension mismatch, too few vectors, nlist out of range */
    CHECK(ivf_train(ix, v, 1000, DIM - 1, &tp, err) == -1);
    CHECK_MSG(strstr(err, "47 floats"), "%s", err);
    CHECK(ivf_train(ix, v, 5, DIM, &tp, err) == -1);
    tp.nlist = 0;
    CHECK(ivf_train(ix, v, 1000, DIM, &tp, err) == -1);
    tp.nlist = 10;
    CHECK_MSG(ivf_train(ix, v, 1000, DIM, &tp, err) == 0, "%s", err);
    CHECK(ivf_train(ix, v, 1000, DIM, &tp, err) == -1);
    CHECK(ivf_add(ix, ids, v, 2, DIM + 1, err) == -1);
    CHECK(ivf_search_all(ix, v, 1, DIM + 1, &p, h, &n, err) == -1);
    CHECK_MSG(strstr(err, "queries of 49 floats"), "%s", err);
    /* trained but empty: no results, no error */
    CHECK(ivf_search_all(ix, v, 1, DIM, &p, h, &n, err) == 0);
    CHECK_EQ(n, 0);
    /* non-finite vectors and queries, k out of range */
    static float bad[2 * DIM];
    memcpy(bad, v, sizeof bad);
    bad[DIM + 3] = NAN;
    CHECK(ivf_add(ix, ids, bad, 2, DIM, err) == -1);
    CHECK_EQ(ivf_count(ix), 0);
    CHECK(ivf_search_all(ix, bad + DIM, 1, DIM, &p, h, &n, err) == -1);
    p.k = 0;
    CHECK(ivf_search_all(ix, v, 1, DIM, &p, h, &n, err) == -1);
    p.k = IVF_K_MAX + 1;
    CHECK(ivf_search_all(ix, v, 1, DIM, &p, h, &n, err) == -1);
    ivf_free(ix);

    /* corrupt rows: each load fails with an error, never a crash or wrong vectors */
    const char *dir = fresh_dir("corrupt");
    const char *pokes[] = {
        "UPDATE ivf_lists SET ids = substr(ids, 1, length(ids) - 1) WHERE list = 0",
        "UPDATE ivf_lists SET ids = zeroblob(3) WHERE list = 1",
        "UPDATE ivf_lists SET ids = ids || x'00' WHERE list = 5",
        "UPDATE ivf_lists SET ids = x'ffffffffffffffffffffff' || substr(ids, 12) WHERE list = 6",
        "UPDATE ivf_lists SET crc = crc + 1 WHERE list = 2",
        "UPDATE ivf_lists SET list = 99 WHERE list = 3",
        "UPDATE ivf_lists SET n = -1 WHERE list = 4",
        "UPDATE ivf_indexes SET centroids = zeroblob(8)",
        "UPDATE ivf_indexes SET centroids = zeroblob(length(centroids) - 4) || x'0000c07f'",
        "UPDATE ivf_indexes SET centroids = x'0000803f' || substr(centroids, 5)",
        "UPDATE ivf_indexes SET dim = 0",
        "UPDATE ivf_indexes SET nlist = 100000",
    };
    ivf_rows rows = rows_of(v, 1000);
    for (size_t i = 0; i < sizeof pokes / sizeof pokes[0]; i++) {
        store *st = store_open(dir, err);
        CHECK_MSG(st, "%s", err);
        int64_t app;
        CHECK(store_app_id(st, 1000, "a", &app, err) == 0);
        ivf *good = build(v, 1000, 10, err);
        CHECK(good);
        CHECK_MSG(ivf_save(st, app, "x", good, err) == 0, "%s", err);
        ivf_free(good);
        store_close(st);
        CHECK_MSG(poke(dir, pokes[i]), "%s", pokes[i]);
        st = store_open(dir, err);
        CHECK(st);
        bool found;
        ivf *loaded = NULL;
        CHECK_MSG(ivf_load(st, app, "x", &rows, &loaded, &found, err) == -1 && !loaded && !found,
                  "%s was loaded", pokes[i]);
        CHECK_MSG(strstr(err, "ivf:"), "%s", err);
        CHECK(ivf_drop(st, app, "x", &found, err) == 0 && found);
        store_close(st);
    }
    /* rows with a bad scale are refused, by ivf_add_q8 too */
    ivf *good = build(v, 1000, 10, err);
    CHECK(good);
    ((float *)rows.scale)[7] = NAN;
    CHECK(ivf_add_q8(good, rows.ids, rows.q, rows.scale, 10, DIM, err) == -1);
    CHECK_EQ(ivf_count(good), 1000);
    ivf_free(good);
    rows_free(&rows);
    free(v);
}

int main(void)
{
    RUN(test_recall_against_exact);
    RUN(test_steps_equal_one_shot);
    RUN(test_training_in_steps_equals_one_run);
    RUN(test_similarity_aware_equals_plain);
    RUN(test_persistence);
    RUN(test_per_app_isolation);
    RUN(test_hot_lists);
    RUN(test_bad_input);
    return test_finish();
}
