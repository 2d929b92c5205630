/*
 * ivf.c — the IVF-Flat index: k-means training, lists, the step search and its
 * persistence (see ivf.h).
 */
#include "storage/ivf.h"

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "engine/quant/blas.h"
#include "engine/vdist.h"
#include "storage/crc32c.h"
#include "storage/kb.h"
#include "storage/store_internal.h"

#define IVF_DEFAULT_ITERS 10
#define IVF_DEFAULT_POINTS_PER_LIST 256
/* Vectors scored against the centroids per kernel call (training and adding). */
#define IVF_ASSIGN_BLOCK 256
/* Batches from this many rows score centroids with sgemm (below, its packing costs more
 * than it saves). */
#define IVF_SGEMM_MIN_ROWS 16
/* Rows of a list scored per kernel call: a block (33 KiB at dim 128) stays in L1/L2 while
 * every query that probes the list scores it. */
#define IVF_SCAN_BLOCK 256
/* Queries scored per kernel call: their scores for a block of rows (32 KiB) stay in
 * cache until the heaps take them. */
#define IVF_SCAN_QUERIES 32
#define IVF_HUGE_PAGE ((size_t)2 << 20)

_Static_assert(IVF_DIM_MAX <= VDIST_Q8_DIM_MAX, "the int8 kernel's dot must fit int32");

typedef struct ivf_list {
    int64_t n, cap;
    int64_t *ids;  /* (n) */
    int8_t *q;     /* (n, dim) vector i is q[i] * scale[i] (storage/kb.h's format) */
    float *scale;  /* (n) */
    /* bounds on its vectors x (a removal leaves them as they were: looser, still true) */
    float radius;         /* >= |x - centroid| */
    float proj_lo, proj_hi; /* [lo, hi] holds every x . centroid */
    float norm_max;       /* >= |x| */
    bool dirty;    /* changed since it was last saved */
    int64_t hot_at; /* first row of its copy in the hot copy; -1: none */
} ivf_list;

struct ivf {
    int dim;
    int nlist;           /* 0 until trained */
    float *centroids;    /* (nlist, dim) unit length */
    ivf_list *lists;     /* (nlist) */
    uint64_t *uses;      /* (nlist) (query, list) scans */
    int8_t *hot;         /* (hot_rows, dim) the hottest lists' rows packed; NULL: none */
    float *hot_scale;    /* (hot_rows) their scales, in the same mapping */
    size_t hot_bytes;    /* its allocation */
    int64_t n;           /* vectors held */
    /* where it was last saved or loaded (only changed lists need writing there) */
    store *saved_in;
    int64_t saved_row;
};

static bool all_finite(const float *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(v[i]))
            return false;
    return true;
}

ivf *ivf_new(int dim, char err[ERR_MAX])
{
    if (dim < 1 || dim > IVF_DIM_MAX) {
        err_set(err, "ivf: dimension %d out of range 1..%d", dim, IVF_DIM_MAX);
        return NULL;
    }
    ivf *ix = calloc(1, sizeof *ix);
    if (!ix) {
        err_set(err, "out of memory");
        return NULL;
    }
    ix->dim = dim;
    ix->saved_row = -1;
    return ix;
}

static void hot_free(ivf *ix)
{
    if (ix->hot)
        munmap(ix->hot, ix->hot_bytes);
    ix->hot = NULL;
    ix->hot_scale = NULL;
    ix->hot_bytes = 0;
}

static void lists_free(ivf *ix)
{
    for (int c = 0; c < ix->nlist; c++) {
        free(ix->lists[c].ids);
        free(ix->lists[c].q);
        free(ix->lists[c].scale);
    }
    free(ix->lists);
    free(ix->centroids);
    free(ix->uses);
    hot_free(ix);
    ix->lists = NULL;
    ix->centroids = NULL;
    ix->uses = NULL;
    ix->nlist = 0;
    ix->n = 0;
}

void ivf_free(ivf *ix)
{
    if (!ix)
        return;
    lists_free(ix);
    free(ix);
}

int ivf_dim(const ivf *ix)
{
    return ix->dim;
}

int ivf_nlist(const ivf *ix)
{
    return ix->nlist;
}

int64_t ivf_count(const ivf *ix)
{
    return ix->n;
}

/* Gives ix nlist empty lists and room for centroids. */
static int lists_alloc(ivf *ix, int nlist, char *err)
{
    ix->centroids = malloc(sizeof *ix->centroids * (size_t)nlist * ix->dim);
    ix->lists = calloc((size_t)nlist, sizeof *ix->lists);
    ix->uses = calloc((size_t)nlist, sizeof *ix->uses);
    ix->nlist = nlist;
    for (int c = 0; ix->lists && c < nlist; c++)
        ix->lists[c].hot_at = -1;
    if (!ix->centroids || !ix->lists || !ix->uses) {
        lists_free(ix);
        return err_set(err, "out of memory");
    }
    return 0;
}

/*
 * scores (m, nlist) = the m rows of vecs against every centroid. Training, adding and
 * the coarse step of a batch search are a matrix product, which OpenBLAS's sgemm does
 * several times faster than the search kernel (used for small batches, and when
 * OpenBLAS does not load). Which lists a vector joins or a query probes needs no
 * particular rounding, and the early stop's bounds leave room for any.
 */
static void centroid_scores(const float *centroids, int nlist, int dim, const float *vecs,
                            int m, float *scores)
{
    char no_blas[ERR_MAX];
    if (m >= IVF_SGEMM_MIN_ROWS && blas_init(no_blas) == 0)
        blas_sgemm(true, m, nlist, dim, 1.0f, vecs, dim, centroids, dim, 0.0f, scores, nlist);
    else
        vdist_dot(vecs, m, centroids, nlist, dim, scores, (size_t)nlist);
}

/* best[i] = the one of nlist centroids scoring best with vecs row i, for n rows; scores
 * holds (IVF_ASSIGN_BLOCK, nlist) floats. */
static void assign(const float *centroids, int nlist, int dim, const float *vecs, int64_t n,
                   int32_t *best, float *scores)
{
    for (int64_t i0 = 0; i0 < n; i0 += IVF_ASSIGN_BLOCK) {
        int m = n - i0 < IVF_ASSIGN_BLOCK ? (int)(n - i0) : IVF_ASSIGN_BLOCK;
        centroid_scores(centroids, nlist, dim, vecs + (size_t)i0 * dim, m, scores);
        for (int i = 0; i < m; i++) {
            const float *row = scores + (size_t)i * nlist;
            int32_t b = 0;
            for (int c = 1; c < nlist; c++)
                if (row[c] > row[b])
                    b = c;
            best[i0 + i] = b;
        }
    }
}

static uint64_t next_rand(uint64_t *s)
{
    /* splitmix64: any seed, 0 included, gives a good sequence */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

struct ivf_trainer {
    ivf *ix;           /* gets the centroids when the last iteration ends */
    int dim, nlist, iters;
    int64_t m;         /* sample rows */
    float *sample;     /* (m, dim) */
    float *centroids;  /* (nlist, dim) unit length: the last iteration's */
    int32_t *best;     /* (IVF_ASSIGN_BLOCK) a block's lists */
    float *scores;     /* (IVF_ASSIGN_BLOCK, nlist) */
    int64_t *count;    /* (nlist) the iteration's members so far */
    double *sum;       /* (nlist, dim) their sums */
    uint64_t rs;       /* the random state, for lists that end empty */
    int it;            /* the iteration under way */
    int64_t at;        /* its next sample row, a multiple of IVF_ASSIGN_BLOCK */
};

void ivf_trainer_free(ivf_trainer *t)
{
    if (!t)
        return;
    free(t->sample);
    free(t->centroids);
    free(t->best);
    free(t->scores);
    free(t->count);
    free(t->sum);
    free(t);
}

ivf_trainer *ivf_trainer_new(ivf *ix, int64_t n, const ivf_train_params *p, ivf_row_fn row,
                             void *arg, char err[ERR_MAX])
{
    int dim = ix->dim;
    if (ix->nlist) {
        err_set(err, "ivf: the index is trained already");
        return NULL;
    }
    if (p->nlist < 1 || p->nlist > IVF_NLIST_MAX) {
        err_set(err, "ivf: nlist %d out of range 1..%d", p->nlist, IVF_NLIST_MAX);
        return NULL;
    }
    if (n < p->nlist) {
        err_set(err, "ivf: %lld training vectors for %d lists", (long long)n, p->nlist);
        return NULL;
    }
    int64_t per = p->max_points_per_list > 0 ? p->max_points_per_list : IVF_DEFAULT_POINTS_PER_LIST;
    ivf_trainer *t = calloc(1, sizeof *t);
    int64_t *pick = malloc(sizeof *pick * (size_t)n);
    if (!t || !pick)
        goto oom;
    t->ix = ix;
    t->dim = dim;
    t->nlist = p->nlist;
    t->iters = p->iters > 0 ? p->iters : IVF_DEFAULT_ITERS;
    t->m = (int64_t)p->nlist * per < n ? (int64_t)p->nlist * per : n;
    t->sample = malloc(sizeof *t->sample * (size_t)t->m * dim);
    t->centroids = malloc(sizeof *t->centroids * (size_t)p->nlist * dim);
    t->best = malloc(sizeof *t->best * IVF_ASSIGN_BLOCK);
    t->scores = malloc(sizeof *t->scores * (size_t)IVF_ASSIGN_BLOCK * p->nlist);
    t->count = calloc((size_t)p->nlist, sizeof *t->count);
    t->sum = calloc((size_t)p->nlist * dim, sizeof *t->sum);
    if (!t->sample || !t->centroids || !t->best || !t->scores || !t->count || !t->sum)
        goto oom;
    /* the sample: the first m of a seeded partial shuffle of the row numbers */
    t->rs = p->seed;
    for (int64_t i = 0; i < n; i++)
        pick[i] = i;
    for (int64_t i = 0; i < t->m; i++) {
        int64_t j = i + (int64_t)(next_rand(&t->rs) % (uint64_t)(n - i));
        int64_t x = pick[i];
        pick[i] = pick[j];
        pick[j] = x;
        row(arg, pick[i], t->sample + (size_t)i * dim);
    }
    free(pick);
    if (!all_finite(t->sample, (size_t)t->m * dim)) {
        err_set(err, "ivf: training vectors hold a value that is not finite");
        ivf_trainer_free(t);
        return NULL;
    }
    /* the first nlist of the sample start as centroids */
    for (int c = 0; c < p->nlist; c++) {
        memcpy(t->centroids + (size_t)c * dim, t->sample + (size_t)c * dim,
               sizeof *t->sample * dim);
        vdist_normalize(t->centroids + (size_t)c * dim, dim);
    }
    return t;
oom:
    free(pick);
    ivf_trainer_free(t);
    err_set(err, "out of memory");
    return NULL;
}

/* Ends an iteration: each centroid becomes the unit-length mean of its members. */
static void trainer_update_centroids(ivf_trainer *t)
{
    int dim = t->dim;
    for (int c = 0; c < t->nlist; c++) {
        float *ce = t->centroids + (size_t)c * dim;
        if (t->count[c] == 0) {
            /* an empty list restarts from a random sample vector */
            memcpy(ce, t->sample + (size_t)(next_rand(&t->rs) % (uint64_t)t->m) * dim,
                   sizeof *ce * dim);
        } else {
            for (int d = 0; d < dim; d++)
                ce[d] = (float)t->sum[(size_t)c * dim + d];
        }
        vdist_normalize(ce, dim);
    }
    memset(t->count, 0, sizeof *t->count * (size_t)t->nlist);
    memset(t->sum, 0, sizeof *t->sum * (size_t)t->nlist * dim);
}

int ivf_trainer_step(ivf_trainer *t, int64_t rows, char err[ERR_MAX])
{
    int dim = t->dim;
    int64_t done = 0;
    /* whole blocks from the iteration's start, so that every block is scored as in one
     * run whatever the steps */
    while (t->it < t->iters && done < rows) {
        int64_t m = t->m - t->at < IVF_ASSIGN_BLOCK ? t->m - t->at : IVF_ASSIGN_BLOCK;
        const float *x = t->sample + (size_t)t->at * dim;
        assign(t->centroids, t->nlist, dim, x, m, t->best, t->scores);
        for (int64_t i = 0; i < m; i++) {
            t->count[t->best[i]]++;
            double *s = t->sum + (size_t)t->best[i] * dim;
            for (int d = 0; d < dim; d++)
                s[d] += x[(size_t)i * dim + d];
        }
        t->at += m;
        done += m;
        if (t->at == t->m) {
            trainer_update_centroids(t);
            t->at = 0;
            t->it++;
        }
    }
    if (t->it < t->iters)
        return 0;
    if (!t->ix->nlist) {
        if (lists_alloc(t->ix, t->nlist, err))
            return -1;
        memcpy(t->ix->centroids, t->centroids, sizeof *t->centroids * (size_t)t->nlist * dim);
    }
    return 1;
}

/* ivf_train's rows: a copy of row i of the floats it was given. */
typedef struct {
    const float *vecs;
    int dim;
} float_rows;

static void float_row(void *arg, int64_t i, float *out)
{
    const float_rows *r = arg;
    memcpy(out, r->vecs + (size_t)i * r->dim, sizeof *out * r->dim);
}

int ivf_train(ivf *ix, const float *vecs, int64_t n, int dim, const ivf_train_params *p,
              char err[ERR_MAX])
{
    if (dim != ix->dim)
        return err_set(err, "ivf: vectors of %d floats for an index of %d", dim, ix->dim);
    if (!all_finite(vecs, (size_t)n * dim))
        return err_set(err, "ivf: training vectors hold a value that is not finite");
    float_rows r = {vecs, dim};
    ivf_trainer *t = ivf_trainer_new(ix, n, p, float_row, &r, err);
    if (!t)
        return -1;
    int rc;
    while ((rc = ivf_trainer_step(t, INT64_MAX, err)) == 0)
        ;
    ivf_trainer_free(t);
    return rc < 0 ? -1 : 0;
}

/* Widens list c's bounds to cover its member q * scale. */
static void widen(ivf *ix, int c, const int8_t *q, float scale)
{
    ivf_list *l = &ix->lists[c];
    const float *ce = ix->centroids + (size_t)c * ix->dim;
    double dd = 0, proj = 0, xx = 0;
    for (int t = 0; t < ix->dim; t++) {
        double x = (double)q[t] * scale, d = x - ce[t];
        dd += d * d;
        proj += x * ce[t];
        xx += x * x;
    }
    /* rounded outwards, so that f32 never narrows a bound */
    bool first = l->n == 1;
    float r = nextafterf((float)sqrt(dd), INFINITY), norm = nextafterf((float)sqrt(xx), INFINITY);
    float lo = nextafterf((float)proj, -INFINITY), hi = nextafterf((float)proj, INFINITY);
    l->radius = first || r > l->radius ? r : l->radius;
    l->norm_max = first || norm > l->norm_max ? norm : l->norm_max;
    l->proj_lo = first || lo < l->proj_lo ? lo : l->proj_lo;
    l->proj_hi = first || hi > l->proj_hi ? hi : l->proj_hi;
}

static int list_reserve(ivf_list *l, int64_t want, int dim)
{
    if (want <= l->cap)
        return 0;
    int64_t cap = l->cap ? l->cap : 16;
    while (cap < want)
        cap *= 2;
    int64_t *ids = realloc(l->ids, sizeof *ids * (size_t)cap);
    if (!ids)
        return -1;
    l->ids = ids;
    int8_t *q = realloc(l->q, (size_t)cap * dim);
    if (!q)
        return -1;
    l->q = q;
    float *scale = realloc(l->scale, sizeof *scale * (size_t)cap);
    if (!scale)
        return -1;
    l->scale = scale;
    l->cap = cap;
    return 0;
}

/* Appends (id, q * scale) to list c, widening its bounds to cover it. */
static void list_append(ivf *ix, int c, int64_t id, const int8_t *q, float scale)
{
    ivf_list *l = &ix->lists[c];
    l->ids[l->n] = id;
    memcpy(l->q + (size_t)l->n * ix->dim, q, (size_t)ix->dim);
    l->scale[l->n] = scale;
    l->n++;
    widen(ix, c, q, scale);
    l->dirty = true;
    l->hot_at = -1;
    ix->n++;
}

/* Whether scales are usable: finite and not negative. */
static bool scales_ok(const float *scale, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (!(isfinite(scale[i]) && scale[i] >= 0))
            return false;
    return true;
}

/* Adds n rows (ids, q, scale) to a trained index: each joins the list of its best
 * centroid, scored on its widened floats a block at a time. */
static int add_rows(ivf *ix, const int64_t *ids, const int8_t *q, const float *scale,
                    int64_t n, char *err)
{
    int dim = ix->dim;
    int32_t *best = malloc(sizeof *best * (size_t)n);
    int64_t *grow = calloc((size_t)ix->nlist, sizeof *grow);
    float *scores = malloc(sizeof *scores * (size_t)IVF_ASSIGN_BLOCK * ix->nlist);
    float *wide = malloc(sizeof *wide * (size_t)IVF_ASSIGN_BLOCK * dim);
    int rc = 0;
    if (!best || !grow || !scores || !wide) {
        rc = err_set(err, "out of memory");
        goto out;
    }
    for (int64_t i0 = 0; i0 < n; i0 += IVF_ASSIGN_BLOCK) {
        int64_t m = n - i0 < IVF_ASSIGN_BLOCK ? n - i0 : IVF_ASSIGN_BLOCK;
        for (int64_t i = 0; i < m; i++)
            for (int t = 0; t < dim; t++)
                wide[(size_t)i * dim + t] = (float)q[(size_t)(i0 + i) * dim + t] * scale[i0 + i];
        assign(ix->centroids, ix->nlist, dim, wide, m, best + i0, scores);
    }
    /* room first, so that a failure leaves the index as it was */
    for (int64_t i = 0; i < n; i++)
        grow[best[i]]++;
    for (int c = 0; c < ix->nlist; c++)
        if (grow[c] && list_reserve(&ix->lists[c], ix->lists[c].n + grow[c], dim)) {
            rc = err_set(err, "out of memory");
            goto out;
        }
    for (int64_t i = 0; i < n; i++)
        list_append(ix, best[i], ids[i], q + (size_t)i * dim, scale[i]);
out:
    free(best);
    free(grow);
    free(scores);
    free(wide);
    return rc;
}

int ivf_add(ivf *ix, const int64_t *ids, const float *vecs, int64_t n, int dim,
            char err[ERR_MAX])
{
    if (dim != ix->dim)
        return err_set(err, "ivf: vectors of %d floats for an index of %d", dim, ix->dim);
    if (!ix->nlist)
        return err_set(err, "ivf: the index is not trained");
    if (n <= 0)
        return 0;
    if (!all_finite(vecs, (size_t)n * dim))
        return err_set(err, "ivf: vectors hold a value that is not finite");
    int8_t *q = malloc((size_t)n * dim);
    float *scale = malloc(sizeof *scale * (size_t)n);
    int rc;
    if (!q || !scale) {
        rc = err_set(err, "out of memory");
    } else {
        for (int64_t i = 0; i < n; i++)
            store_vec_quantize(vecs + (size_t)i * dim, dim, q + (size_t)i * dim, &scale[i]);
        rc = add_rows(ix, ids, q, scale, n, err);
    }
    free(q);
    free(scale);
    return rc;
}

int ivf_add_q8(ivf *ix, const int64_t *ids, const int8_t *q, const float *scale, int64_t n,
               int dim, char err[ERR_MAX])
{
    if (dim != ix->dim)
        return err_set(err, "ivf: vectors of %d components for an index of %d", dim, ix->dim);
    if (!ix->nlist)
        return err_set(err, "ivf: the index is not trained");
    if (n <= 0)
        return 0;
    if (!scales_ok(scale, n))
        return err_set(err, "ivf: a vector's scale is negative or not finite");
    return add_rows(ix, ids, q, scale, n, err);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

void ivf_ids(const ivf *ix, int64_t *ids)
{
    for (int c = 0; c < ix->nlist; c++)
        if (ix->lists[c].n) {
            memcpy(ids, ix->lists[c].ids, sizeof *ids * (size_t)ix->lists[c].n);
            ids += ix->lists[c].n;
        }
    qsort(ids - ix->n, (size_t)ix->n, sizeof *ids, cmp_i64);
}

int ivf_remove(ivf *ix, const int64_t *ids, int64_t n, int64_t *removed, char err[ERR_MAX])
{
    if (removed)
        *removed = 0;
    if (n <= 0)
        return 0;
    int64_t *sorted = malloc(sizeof *sorted * (size_t)n);
    if (!sorted)
        return err_set(err, "out of memory");
    memcpy(sorted, ids, sizeof *sorted * (size_t)n);
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_i64);
    int64_t gone = 0;
    for (int c = 0; c < ix->nlist; c++) {
        ivf_list *l = &ix->lists[c];
        int64_t w = 0;
        for (int64_t i = 0; i < l->n; i++) {
            if (bsearch(&l->ids[i], sorted, (size_t)n, sizeof *sorted, cmp_i64))
                continue;
            if (w != i) {
                l->ids[w] = l->ids[i];
                memmove(l->q + (size_t)w * ix->dim, l->q + (size_t)i * ix->dim,
                        (size_t)ix->dim);
                l->scale[w] = l->scale[i];
            }
            w++;
        }
        if (w != l->n) {
            /* the bounds stay: still true, if looser */
            gone += l->n - w;
            l->n = w;
            l->dirty = true;
            l->hot_at = -1;
        }
    }
    ix->n -= gone;
    free(sorted);
    if (removed)
        *removed = gone;
    return 0;
}

/* ---- search ---- */

enum { PAIR_PENDING, PAIR_SCANNED, PAIR_SKIPPED };

struct ivf_search {
    ivf *ix;
    int n_q, k, nprobe;
    bool early_stop;
    float *queries;    /* (n_q, dim) the queries as scored: qi times q_scale */
    int16_t *qi;       /* (n_q, dim) the queries quantized (vdist_quantize_query) */
    float *q_scale;    /* (n_q) */
    int32_t *order;    /* (n_q, nprobe) each query's lists, in the order it searches them */
    float *bound;      /* (n_q, nprobe) the highest score a vector of that list can have */
    uint8_t *state;    /* (n_q, nprobe) PAIR_* */
    int *next;         /* (n_q) first position of order not yet scanned or skipped */
    int cursor;        /* the query a step starts choosing lists from (turns round, so that
                        * small steps serve every query in turn) */
    ivf_hit *heap;     /* (n_q, k) each query's results so far, a heap with the worst on top */
    int *heap_n;       /* (n_q) */
    /* which (query, position) pairs probe each list, grouped by list */
    int *probe_start;  /* (nlist + 1) list c's pairs are probe_pair[probe_start[c]..[c+1]) */
    int *probe_pair;   /* (n_q * nprobe) query * nprobe + position */
    /* one step's scratch */
    int32_t *step_lists;   /* (nlist) lists chosen for this step */
    int *step_mark;        /* (nlist) the step that last chose the list */
    int *members;          /* (n_q) query * nprobe + position of the queries scanning a list */
    int16_t *gather;       /* (n_q, dim) their quantized queries side by side, a kernel block */
    float *gather_scale;   /* (n_q) */
    float *scores;         /* (IVF_SCAN_QUERIES, IVF_SCAN_BLOCK) */
    ivf_search_stats stats;
};

/* Whether a is a better result than b: higher score, then lower id. */
static bool better(const ivf_hit *a, const ivf_hit *b)
{
    return a->score > b->score || (a->score == b->score && a->id < b->id);
}

static void heap_down(ivf_hit *h, int n, int i)
{
    for (;;) {
        int l = 2 * i + 1, w = i;
        if (l < n && better(&h[w], &h[l]))
            w = l;
        if (l + 1 < n && better(&h[w], &h[l + 1]))
            w = l + 1;
        if (w == i)
            return;
        ivf_hit t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

/* Offers hit to a query's heap of at most k. */
static void heap_offer(ivf_hit *h, int *n, int k, const ivf_hit *hit)
{
    if (*n < k) {
        int i = (*n)++;
        h[i] = *hit;
        while (i > 0 && better(&h[(i - 1) / 2], &h[i])) {
            ivf_hit t = h[i];
            h[i] = h[(i - 1) / 2];
            h[(i - 1) / 2] = t;
            i = (i - 1) / 2;
        }
    } else if (better(hit, &h[0])) {
        h[0] = *hit;
        heap_down(h, *n, 0);
    }
}

void ivf_search_free(ivf_search *s)
{
    if (!s)
        return;
    free(s->queries);
    free(s->qi);
    free(s->q_scale);
    free(s->order);
    free(s->bound);
    free(s->state);
    free(s->next);
    free(s->heap);
    free(s->heap_n);
    free(s->probe_start);
    free(s->probe_pair);
    free(s->step_lists);
    free(s->step_mark);
    free(s->members);
    free(s->gather);
    free(s->gather_scale);
    free(s->scores);
    free(s);
}

/*
 * The highest score a vector x of list l can have with a query q, given qc = q . c for
 * its unit centroid c and qq = |q|^2. Two bounds, the lower taken:
 *  - the ball: q . x = q . c + q . (x - c) <= qc + |q| radius;
 *  - the cone: with a = x . c and q_perp, x_perp the parts orthogonal to c,
 *    q . x = qc a + q_perp . x_perp <= qc a + |q_perp| sqrt(norm_max^2 - a^2), a concave
 *    function of a whose maximum over [proj_lo, proj_hi] is at the unconstrained
 *    maximum a = norm_max qc / |q| moved into the interval.
 * Both are widened for f32 rounding (of the kernel's dot products, the norms and the
 * stored bounds), so that a bound never falls below a score the kernel computes.
 */
static float list_bound(const ivf_list *l, float qc, double qq, int dim)
{
    if (l->n == 0)
        return -INFINITY;
    double qn = sqrt(qq), R = l->norm_max;
    double ball = qc + qn * l->radius;
    double qp = sqrt(qq - (double)qc * qc > 0 ? qq - (double)qc * qc : 0);
    double a = qn > 0 ? R * qc / qn : 0;
    a = a < l->proj_lo ? l->proj_lo : a > l->proj_hi ? l->proj_hi : a;
    double rest = R * R - a * a;
    double cone = qc * a + qp * sqrt(rest > 0 ? rest : 0);
    double b = cone < ball ? cone : ball;
    double slack = 8.0 * dim * FLT_EPSILON * qn * (R + l->radius + 1.0) + FLT_MIN;
    return (float)(b + slack);
}

/* Fills query i's order and bounds from its centroid scores cs (nlist): its nprobe
 * best lists, hinted ones first, each group best centroid first. top is (nprobe)
 * scratch. */
static void plan_query(ivf_search *s, int i, const float *cs, const ivf_hints *h, int32_t *top)
{
    const ivf *ix = s->ix;
    int np = s->nprobe, n = 0;
    /* the nprobe best centroids by insertion into a sorted array (ties: lower list) */
    for (int c = 0; c < ix->nlist; c++) {
        if (n == np && cs[c] <= cs[top[n - 1]])
            continue;
        int j = n < np ? n++ : np - 1;
        while (j > 0 && cs[top[j - 1]] < cs[c]) {
            top[j] = top[j - 1];
            j--;
        }
        top[j] = c;
    }
    int32_t *ord = s->order + (size_t)i * np;
    int w = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int j = 0; j < np; j++) {
            bool hinted = false;
            for (int t = 0; h && t < h->n && !hinted; t++)
                hinted = h->lists[t] == top[j];
            if (hinted == (pass == 0))
                ord[w++] = top[j];
        }
    const float *q = s->queries + (size_t)i * ix->dim;
    double qq = 0;
    for (int t = 0; t < ix->dim; t++)
        qq += (double)q[t] * q[t];
    for (int j = 0; j < np; j++)
        s->bound[(size_t)i * np + j] = list_bound(&ix->lists[ord[j]], cs[ord[j]], qq, ix->dim);
}

ivf_search *ivf_search_begin(ivf *ix, const float *queries, int n_q, int dim,
                             const ivf_search_params *p, const ivf_hints *hints,
                             char err[ERR_MAX])
{
    if (dim != ix->dim) {
        err_set(err, "ivf: queries of %d floats for an index of %d", dim, ix->dim);
        return NULL;
    }
    if (!ix->nlist) {
        err_set(err, "ivf: the index is not trained (empty)");
        return NULL;
    }
    if (n_q < 1) {
        err_set(err, "ivf: no queries");
        return NULL;
    }
    if (p->k < 1 || p->k > IVF_K_MAX) {
        err_set(err, "ivf: k %d out of range 1..%d", p->k, IVF_K_MAX);
        return NULL;
    }
    if (p->nprobe < 1) {
        err_set(err, "ivf: nprobe %d must be at least 1", p->nprobe);
        return NULL;
    }
    if (!all_finite(queries, (size_t)n_q * dim)) {
        err_set(err, "ivf: a query holds a value that is not finite");
        return NULL;
    }
    ivf_search *s = calloc(1, sizeof *s);
    if (!s) {
        err_set(err, "out of memory");
        return NULL;
    }
    s->ix = ix;
    s->n_q = n_q;
    s->k = p->k;
    s->nprobe = p->nprobe < ix->nlist ? p->nprobe : ix->nlist;
    s->early_stop = p->early_stop;
    size_t pairs = (size_t)n_q * s->nprobe;
    s->queries = malloc(sizeof *s->queries * (size_t)n_q * dim);
    s->qi = malloc(sizeof *s->qi * (size_t)n_q * dim);
    s->q_scale = malloc(sizeof *s->q_scale * (size_t)n_q);
    s->order = malloc(sizeof *s->order * pairs);
    s->bound = malloc(sizeof *s->bound * pairs);
    s->state = calloc(pairs, sizeof *s->state);
    s->next = calloc((size_t)n_q, sizeof *s->next);
    s->heap = malloc(sizeof *s->heap * (size_t)n_q * s->k);
    s->heap_n = calloc((size_t)n_q, sizeof *s->heap_n);
    s->probe_start = calloc((size_t)ix->nlist + 1, sizeof *s->probe_start);
    s->probe_pair = malloc(sizeof *s->probe_pair * pairs);
    s->step_lists = malloc(sizeof *s->step_lists * (size_t)ix->nlist);
    s->step_mark = calloc((size_t)ix->nlist, sizeof *s->step_mark);
    s->members = malloc(sizeof *s->members * (size_t)n_q);
    s->gather = malloc(sizeof *s->gather * (size_t)n_q * dim);
    s->gather_scale = malloc(sizeof *s->gather_scale * (size_t)n_q);
    s->scores = malloc(sizeof *s->scores * (size_t)IVF_SCAN_QUERIES * IVF_SCAN_BLOCK);
    int qblock = n_q < IVF_ASSIGN_BLOCK ? n_q : IVF_ASSIGN_BLOCK;
    float *cs = malloc(sizeof *cs * (size_t)qblock * ix->nlist);
    int32_t *top = malloc(sizeof *top * (size_t)s->nprobe);
    if (!s->queries || !s->qi || !s->q_scale || !s->gather || !s->gather_scale || !s->order || !s->bound || !s->state || !s->next || !s->heap ||
        !s->heap_n || !s->probe_start || !s->probe_pair || !s->step_lists || !s->step_mark ||
        !s->members || !s->scores || !cs || !top) {
        free(cs);
        free(top);
        ivf_search_free(s);
        err_set(err, "out of memory");
        return NULL;
    }
    /* the rows are scored against the quantized queries; the centroids and the early
     * stop's bounds see the same vectors, so that a bound holds for the scores computed */
    for (int i = 0; i < n_q; i++) {
        int16_t *qi = s->qi + (size_t)i * dim;
        float *qf = s->queries + (size_t)i * dim;
        vdist_quantize_query(queries + (size_t)i * dim, dim, qi, &s->q_scale[i]);
        for (int t = 0; t < dim; t++)
            qf[t] = (float)qi[t] * s->q_scale[i];
    }
    for (int i0 = 0; i0 < n_q; i0 += qblock) {
        int m = n_q - i0 < qblock ? n_q - i0 : qblock;
        centroid_scores(ix->centroids, ix->nlist, dim, s->queries + (size_t)i0 * dim, m, cs);
        for (int i = 0; i < m; i++)
            plan_query(s, i0 + i, cs + (size_t)i * ix->nlist, hints ? &hints[i0 + i] : NULL,
                       top);
    }
    free(cs);
    free(top);
    /* group the pairs by list (a counting sort) */
    for (size_t pr = 0; pr < pairs; pr++)
        s->probe_start[s->order[pr] + 1]++;
    for (int c = 0; c < ix->nlist; c++)
        s->probe_start[c + 1] += s->probe_start[c];
    for (size_t pr = 0; pr < pairs; pr++)
        s->probe_pair[s->probe_start[s->order[pr]]++] = (int)pr;
    for (int c = ix->nlist; c > 0; c--)
        s->probe_start[c] = s->probe_start[c - 1];
    s->probe_start[0] = 0;
    return s;
}

/* Whether the early stop may leave out pair pr (query i): its list cannot beat the
 * query's k-th result. */
static bool prunable(const ivf_search *s, int i, size_t pr)
{
    return s->early_stop && s->heap_n[i] == s->k && s->bound[pr] < s->heap[(size_t)i * s->k].score;
}

/* Scans list c for the m member pairs of s->members: their quantized queries side by
 * side, scored by blocks of queries against blocks of its int8 rows (each row read once
 * for a block of queries, no float copy). */
static void scan_list(ivf_search *s, int c, int m)
{
    ivf *ix = s->ix;
    const ivf_list *l = &ix->lists[c];
    int dim = ix->dim;
    bool hot = l->hot_at >= 0;
    const int8_t *rows = hot ? ix->hot + (size_t)l->hot_at * dim : l->q;
    const float *scale = hot ? ix->hot_scale + l->hot_at : l->scale;
    for (int a = 0; a < m; a++) {
        int i = s->members[a] / s->nprobe;
        memcpy(s->gather + (size_t)a * dim, s->qi + (size_t)i * dim,
               sizeof *s->gather * (size_t)dim);
        s->gather_scale[a] = s->q_scale[i];
    }
    for (int64_t x0 = 0; x0 < l->n; x0 += IVF_SCAN_BLOCK) {
        int nb = l->n - x0 < IVF_SCAN_BLOCK ? (int)(l->n - x0) : IVF_SCAN_BLOCK;
        for (int a0 = 0; a0 < m; a0 += IVF_SCAN_QUERIES) {
            int mq = m - a0 < IVF_SCAN_QUERIES ? m - a0 : IVF_SCAN_QUERIES;
            vdist_dot_q8(s->gather + (size_t)a0 * dim, s->gather_scale + a0, mq,
                         rows + (size_t)x0 * dim, scale + x0, nb, dim, s->scores,
                         IVF_SCAN_BLOCK);
            for (int a = 0; a < mq; a++) {
                int i = s->members[a0 + a] / s->nprobe;
                const float *sc = s->scores + (size_t)a * IVF_SCAN_BLOCK;
                ivf_hit *h = s->heap + (size_t)i * s->k;
                for (int j = 0; j < nb; j++) {
                    if (s->heap_n[i] == s->k && sc[j] < h[0].score)
                        continue;
                    ivf_hit hit = {l->ids[x0 + j], sc[j], c};
                    heap_offer(h, &s->heap_n[i], s->k, &hit);
                }
            }
        }
    }
    for (int a = 0; a < m; a++)
        s->state[s->members[a]] = PAIR_SCANNED;
    s->stats.lists_scanned += m;
    s->stats.vectors_scanned += (int64_t)m * l->n;
    s->stats.list_reads++;
    ix->uses[c] += (uint64_t)m;
}

/* Moves query i's next position past the pairs scanned or skipped, skipping those the
 * early stop now rules out. */
static void advance(ivf_search *s, int i)
{
    size_t base = (size_t)i * s->nprobe;
    while (s->next[i] < s->nprobe) {
        size_t pr = base + s->next[i];
        if (s->state[pr] == PAIR_PENDING && prunable(s, i, pr)) {
            s->state[pr] = PAIR_SKIPPED;
            s->stats.lists_skipped++;
        }
        if (s->state[pr] == PAIR_PENDING)
            return;
        s->next[i]++;
    }
}

bool ivf_search_step(ivf_search *s, int max_lists)
{
    int np = s->nprobe, n_sel = 0, stamp = ++s->stats.steps;
    if (max_lists < 1)
        max_lists = 1;
    /* each query names the next list it needs; the first max_lists named from the cursor
     * on are chosen */
    for (int t = 0; t < s->n_q && n_sel < max_lists; t++) {
        int i = (s->cursor + t) % s->n_q;
        if (s->next[i] == np)
            continue;
        s->cursor = (i + 1) % s->n_q;
        int c = s->order[(size_t)i * np + s->next[i]];
        if (s->step_mark[c] != stamp) {
            s->step_mark[c] = stamp;
            s->step_lists[n_sel++] = c;
        }
    }
    /* each chosen list is read once for every query that still needs it */
    for (int t = 0; t < n_sel; t++) {
        int c = s->step_lists[t], m = 0;
        for (int e = s->probe_start[c]; e < s->probe_start[c + 1]; e++) {
            int pr = s->probe_pair[e], i = pr / np;
            if (s->state[pr] != PAIR_PENDING)
                continue;
            if (prunable(s, i, (size_t)pr)) {
                s->state[pr] = PAIR_SKIPPED;
                s->stats.lists_skipped++;
                continue;
            }
            s->members[m++] = pr;
        }
        if (m)
            scan_list(s, c, m);
    }
    bool done = true;
    for (int i = 0; i < s->n_q; i++) {
        advance(s, i);
        done = done && s->next[i] == np;
    }
    return done;
}

static int cmp_hit(const void *a, const void *b)
{
    return better(a, b) ? -1 : better(b, a) ? 1 : 0;
}

int ivf_search_results(const ivf_search *s, int q, ivf_hit *hits)
{
    if (q < 0 || q >= s->n_q)
        return 0;
    int n = s->heap_n[q];
    memcpy(hits, s->heap + (size_t)q * s->k, sizeof *hits * (size_t)n);
    qsort(hits, (size_t)n, sizeof *hits, cmp_hit);
    return n;
}

void ivf_search_get_stats(const ivf_search *s, ivf_search_stats *st)
{
    *st = s->stats;
}

int ivf_search_all(ivf *ix, const float *queries, int n_q, int dim, const ivf_search_params *p,
                   ivf_hit *hits, int *n_hits, char err[ERR_MAX])
{
    ivf_search *s = ivf_search_begin(ix, queries, n_q, dim, p, NULL, err);
    if (!s)
        return -1;
    while (!ivf_search_step(s, INT_MAX))
        ;
    for (int q = 0; q < n_q; q++)
        n_hits[q] = ivf_search_results(s, q, hits + (size_t)q * p->k);
    ivf_search_free(s);
    return 0;
}

/* ---- hot lists ---- */

int ivf_hot_lists(const ivf *ix, int n, int32_t *lists)
{
    int got = 0;
    for (int c = 0; c < ix->nlist; c++) {
        if (!ix->uses[c] || (got == n && ix->uses[c] <= ix->uses[lists[got - 1]]))
            continue;
        int j = got < n ? got++ : n - 1;
        while (j > 0 && ix->uses[lists[j - 1]] < ix->uses[c]) {
            lists[j] = lists[j - 1];
            j--;
        }
        lists[j] = c;
    }
    return got;
}

int ivf_hot_refresh(ivf *ix, size_t max_bytes, char err[ERR_MAX])
{
    int32_t *order = malloc(sizeof *order * (size_t)(ix->nlist ? ix->nlist : 1));
    if (!order)
        return err_set(err, "out of memory");
    int n_used = ivf_hot_lists(ix, ix->nlist, order), n_hot = 0;
    size_t row_bytes = STORE_VEC_BYTES(ix->dim), bytes = 0;
    while (n_hot < n_used &&
           bytes + (size_t)ix->lists[order[n_hot]].n * row_bytes <= max_bytes)
        bytes += (size_t)ix->lists[order[n_hot++]].n * row_bytes;
    hot_free(ix);
    for (int c = 0; c < ix->nlist; c++)
        ix->lists[c].hot_at = -1;
    int rc = 0;
    if (bytes) {
        /* its own mapping, in 2 MiB pages where the kernel gives them: a scan of a packed
         * list then walks a handful of TLB entries, not one per 4 KiB */
        size_t len = (bytes + 3 + IVF_HUGE_PAGE - 1) / IVF_HUGE_PAGE * IVF_HUGE_PAGE;
        void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            rc = err_set(err, "ivf: hot copy of %zu bytes: out of memory", bytes);
        } else {
            madvise(p, len, MADV_HUGEPAGE);
            ix->hot = p;
            ix->hot_bytes = len;
            /* the rows, then their scales (4-byte aligned) */
            size_t rows = bytes / row_bytes;
            ix->hot_scale = (float *)((char *)p + (rows * ix->dim + 3) / 4 * 4);
            int64_t row = 0;
            for (int h = 0; h < n_hot; h++) {
                ivf_list *l = &ix->lists[order[h]];
                if (!l->n)
                    continue;
                memcpy(ix->hot + (size_t)row * ix->dim, l->q, (size_t)l->n * ix->dim);
                memcpy(ix->hot_scale + row, l->scale, sizeof *l->scale * (size_t)l->n);
                l->hot_at = row;
                row += l->n;
            }
        }
    }
    free(order);
    return rc;
}

size_t ivf_hot_bytes(const ivf *ix)
{
    size_t bytes = 0;
    for (int c = 0; c < ix->nlist; c++)
        if (ix->lists[c].hot_at >= 0)
            bytes += STORE_VEC_BYTES(ix->dim) * (size_t)ix->lists[c].n;
    return bytes;
}

/* ---- persistence ---- */

/* The row id of app_id's index name; *row -1 when there is none. */
static int find_row(store *s, int64_t app_id, const char *name, int64_t *row, char *err)
{
    *row = -1;
    sqlite3_stmt *st =
        store_prepare(s, "SELECT id FROM ivf_indexes WHERE app_id = ? AND name = ?", err);
    if (!st)
        return -1;
    sqlite3_bind_int64(st, 1, app_id);
    sqlite3_bind_text(st, 2, name, -1, SQLITE_TRANSIENT);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
        *row = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return store_db_err(s, err, "finding a vector index");
    return 0;
}

static uint32_t list_crc(const ivf_list *l)
{
    return crc32c(0, l->ids, sizeof *l->ids * (size_t)l->n);
}

/* The most bytes n ids take encoded. */
#define IDS_BYTES_MAX(n) ((size_t)(n) * 10)

/* Encodes ids[0..n) as the varints of their zigzagged differences (each from the one
 * before, the first from 0): a list's ids ascend, so most take a byte or two. Returns the
 * bytes written to out (IDS_BYTES_MAX(n) of room). */
static size_t ids_encode(const int64_t *ids, int64_t n, uint8_t *out)
{
    size_t at = 0;
    uint64_t prev = 0;
    for (int64_t i = 0; i < n; i++) {
        uint64_t d = (uint64_t)ids[i] - prev;
        uint64_t z = (d << 1) ^ (uint64_t)-(int64_t)(d >> 63);
        prev = (uint64_t)ids[i];
        while (z >= 0x80) {
            out[at++] = (uint8_t)(z | 0x80);
            z >>= 7;
        }
        out[at++] = (uint8_t)z;
    }
    return at;
}

/* Decodes exactly n ids from the len bytes of in into ids; -1 when the bytes do not hold
 * exactly n. */
static int ids_decode(const uint8_t *in, size_t len, int64_t n, int64_t *ids)
{
    size_t at = 0;
    uint64_t prev = 0;
    for (int64_t i = 0; i < n; i++) {
        uint64_t z = 0;
        for (int shift = 0;; shift += 7) {
            if (at == len || shift > 63)
                return -1;
            uint8_t b = in[at++];
            z |= (uint64_t)(b & 0x7f) << shift;
            if (!(b & 0x80))
                break;
        }
        prev += (z >> 1) ^ (uint64_t)-(int64_t)(z & 1);
        ids[i] = (int64_t)prev;
    }
    return at == len ? 0 : -1;
}

/* Writes list c: its ids only, the vectors being the caller's (ivf_load's rows). */
static int save_list(store *s, int64_t row, const ivf *ix, int c, char *err)
{
    const ivf_list *l = &ix->lists[c];
    uint8_t *buf = malloc(IDS_BYTES_MAX(l->n) + 1);
    if (!buf)
        return err_set(err, "out of memory");
    size_t len = ids_encode(l->ids, l->n, buf);
    sqlite3_stmt *st = store_prepare(s,
                                     "INSERT OR REPLACE INTO ivf_lists (index_id, list, n, crc,"
                                     " ids) VALUES (?, ?, ?, ?, ?)",
                                     err);
    if (!st) {
        free(buf);
        return -1;
    }
    sqlite3_bind_int64(st, 1, row);
    sqlite3_bind_int(st, 2, c);
    sqlite3_bind_int64(st, 3, l->n);
    sqlite3_bind_int64(st, 4, list_crc(l));
    sqlite3_bind_blob64(st, 5, buf, len, SQLITE_STATIC);
    int rc = store_step_once(s, st, "writing a vector list", err);
    free(buf);
    return rc;
}

static int save_all(store *s, int64_t app_id, const char *name, ivf *ix, int64_t *row,
                    char *err)
{
    int64_t old;
    if (find_row(s, app_id, name, &old, err))
        return -1;
    bool same = old >= 0 && ix->saved_in == s && ix->saved_row == old;
    if (!same) {
        if (old >= 0) {
            sqlite3_stmt *st = store_prepare(s, "DELETE FROM ivf_indexes WHERE id = ?", err);
            if (!st)
                return -1;
            sqlite3_bind_int64(st, 1, old);
            if (store_step_once(s, st, "replacing a vector index", err))
                return -1;
        }
        sqlite3_stmt *st = store_prepare(s,
                                         "INSERT INTO ivf_indexes (app_id, name, dim, nlist,"
                                         " centroids) VALUES (?, ?, ?, ?, ?)",
                                         err);
        if (!st)
            return -1;
        sqlite3_bind_int64(st, 1, app_id);
        sqlite3_bind_text(st, 2, name, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int(st, 3, ix->dim);
        sqlite3_bind_int(st, 4, ix->nlist);
        sqlite3_bind_blob64(st, 5, ix->centroids, sizeof *ix->centroids * (size_t)ix->nlist * ix->dim,
                            SQLITE_STATIC);
        if (store_step_once(s, st, "writing a vector index", err))
            return -1;
        old = sqlite3_last_insert_rowid(store_sqlite(s));
    }
    for (int c = 0; c < ix->nlist; c++)
        if ((!same || ix->lists[c].dirty) && save_list(s, old, ix, c, err))
            return -1;
    *row = old;
    return 0;
}

int ivf_save(store *s, int64_t app_id, const char *name, ivf *ix, char err[ERR_MAX])
{
    if (!ix->nlist)
        return err_set(err, "ivf: an untrained index cannot be saved");
    if (store_exec_sql(s, "SAVEPOINT ivf_save", err))
        return -1;
    int64_t row;
    if (save_all(s, app_id, name, ix, &row, err)) {
        char ignored[ERR_MAX];
        store_exec_sql(s, "ROLLBACK TO ivf_save; RELEASE ivf_save", ignored);
        return -1;
    }
    if (store_exec_sql(s, "RELEASE ivf_save", err))
        return -1;
    for (int c = 0; c < ix->nlist; c++)
        ix->lists[c].dirty = false;
    ix->saved_in = s;
    ix->saved_row = row;
    return 0;
}

/* The row of rows holding id; -1 when none. */
static int64_t row_of(const ivf_rows *rows, int64_t id)
{
    int64_t lo = 0, hi = rows->n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (rows->ids[mid] < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < rows->n && rows->ids[lo] == id ? lo : -1;
}

/* Reads the lists of index row into ix, checking each, with their vectors from rows; ids
 * rows lacks are left out (their lists then differ from the stored ones: dirty). */
static int load_lists(store *s, int64_t row, const ivf_rows *rows, ivf *ix, char *err)
{
    sqlite3_stmt *st = store_prepare(s, "SELECT list, n, crc, ids FROM ivf_lists"
                                        " WHERE index_id = ?", err);
    if (!st)
        return -1;
    sqlite3_bind_int64(st, 1, row);
    int rc, out = 0;
    int dim = ix->dim;
    while (out == 0 && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        int64_t c = sqlite3_column_int64(st, 0), n = sqlite3_column_int64(st, 1);
        const uint8_t *ids = sqlite3_column_blob(st, 3);
        int64_t ids_bytes = sqlite3_column_bytes(st, 3);
        /* an id takes one byte at least */
        if (c < 0 || c >= ix->nlist || n < 0 || n > ids_bytes || ix->lists[c].n ||
            ix->lists[c].dirty) {
            out = err_set(err, "ivf: stored list %lld of index %lld does not check out",
                          (long long)c, (long long)row);
            break;
        }
        ivf_list *l = &ix->lists[c];
        if (n && list_reserve(l, n, dim)) {
            out = err_set(err, "out of memory");
            break;
        }
        l->n = n;
        if ((n && ids_decode(ids, (size_t)ids_bytes, n, l->ids)) ||
            list_crc(l) != (uint32_t)sqlite3_column_int64(st, 2)) {
            l->n = 0;
            out = err_set(err, "ivf: stored list %lld of index %lld fails its checksum",
                          (long long)c, (long long)row);
            break;
        }
        l->n = 0;
        for (int64_t i = 0; i < n; i++) {
            int64_t r = row_of(rows, l->ids[i]);
            if (r >= 0)
                list_append(ix, (int)c, l->ids[i], rows->q + (size_t)r * dim, rows->scale[r]);
        }
        l->dirty = l->n != n;
    }
    if (out == 0 && rc != SQLITE_ROW && rc != SQLITE_DONE)
        out = store_db_err(s, err, "reading vector lists");
    sqlite3_finalize(st);
    return out;
}

int ivf_load(store *s, int64_t app_id, const char *name, const ivf_rows *rows, ivf **out,
             bool *found, char err[ERR_MAX])
{
    *out = NULL;
    *found = false;
    sqlite3_stmt *st = store_prepare(s,
                                     "SELECT id, dim, nlist, centroids FROM ivf_indexes"
                                     " WHERE app_id = ? AND name = ?",
                                     err);
    if (!st)
        return -1;
    sqlite3_bind_int64(st, 1, app_id);
    sqlite3_bind_text(st, 2, name, -1, SQLITE_TRANSIENT);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_DONE) {
        sqlite3_finalize(st);
        return 0;
    }
    if (rc != SQLITE_ROW) {
        store_db_err(s, err, "reading a vector index");
        sqlite3_finalize(st);
        return -1;
    }
    int64_t row = sqlite3_column_int64(st, 0), dim = sqlite3_column_int64(st, 1),
            nlist = sqlite3_column_int64(st, 2);
    const void *cent = sqlite3_column_blob(st, 3);
    int64_t cent_bytes = sqlite3_column_bytes(st, 3);
    ivf *ix = NULL;
    if (dim < 1 || dim > IVF_DIM_MAX || nlist < 1 || nlist > IVF_NLIST_MAX ||
        cent_bytes != nlist * dim * (int64_t)sizeof(float) || !cent) {
        err_set(err, "ivf: stored index '%s' (%lld) does not check out", name, (long long)row);
        goto fail;
    }
    if (!(ix = ivf_new((int)dim, err)) || lists_alloc(ix, (int)nlist, err))
        goto fail;
    memcpy(ix->centroids, cent, (size_t)cent_bytes);
    /* the early stop's bounds take centroids to be unit vectors (or zero) */
    for (int64_t c = 0; c < nlist; c++) {
        const float *ce = ix->centroids + (size_t)c * dim;
        double ss = 0;
        for (int64_t t = 0; t < dim; t++)
            ss += (double)ce[t] * ce[t];
        if (!(ss == 0 || fabs(ss - 1) < 1e-4)) {
            err_set(err, "ivf: stored index '%s' (%lld) has a centroid that is not a unit vector",
                    name, (long long)row);
            goto fail;
        }
    }
    sqlite3_finalize(st);
    st = NULL;
    if (dim != rows->dim) {
        err_set(err, "ivf: stored index '%s' has %lld dimensions, its rows %d", name,
                (long long)dim, rows->dim);
        goto fail;
    }
    if (!scales_ok(rows->scale, rows->n)) {
        err_set(err, "ivf: a vector's scale is negative or not finite");
        goto fail;
    }
    if (load_lists(s, row, rows, ix, err))
        goto fail;
    ix->saved_in = s;
    ix->saved_row = row;
    *out = ix;
    *found = true;
    return 0;
fail:
    sqlite3_finalize(st);
    ivf_free(ix);
    return -1;
}

int ivf_drop(store *s, int64_t app_id, const char *name, bool *found, char err[ERR_MAX])
{
    *found = false;
    int64_t row;
    if (find_row(s, app_id, name, &row, err))
        return -1;
    if (row < 0)
        return 0;
    sqlite3_stmt *st = store_prepare(s, "DELETE FROM ivf_indexes WHERE id = ?", err);
    if (!st)
        return -1;
    sqlite3_bind_int64(st, 1, row);
    if (store_step_once(s, st, "deleting a vector index", err))
        return -1;
    *found = true;
    return 0;
}
