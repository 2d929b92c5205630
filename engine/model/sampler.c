/* sampler.c — penalties, truncation and the random draw (see sampler.h). */
#include "engine/model/sampler.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

typedef struct cand {
    int32_t id;
    float logit;
    float w; /* unnormalized probability, set by weigh() */
} cand;

struct sampler {
    sampler_params p;
    int n_vocab;
    uint64_t seed;     /* the seed in use, never SAMPLER_SEED_RANDOM */
    uint64_t rng[4];   /* xoshiro256** state */
    cand *cand;        /* (n_vocab) candidates of the current step */
    int32_t *count;    /* (n_vocab) all zero between calls; occurrences in the window */
    sampler_bias *bias; /* (p.n_bias) the logit biases, owned (p.bias points here) */
};

sampler_params sampler_params_default(void)
{
    return (sampler_params){
        .temperature = 0.8f,
        .top_k = 40,
        .top_p = 0.95f,
        .min_p = 0.05f,
        .repeat_penalty = 1.0f,
        .repeat_last_n = 64,
        .seed = SAMPLER_SEED_RANDOM,
    };
}

/* ---- random numbers ---- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t rng_next(uint64_t st[4])
{
    uint64_t result = rotl(st[1] * 5, 7) * 9;
    uint64_t t = st[1] << 17;
    st[2] ^= st[0];
    st[3] ^= st[1];
    st[1] ^= st[2];
    st[0] ^= st[3];
    st[2] ^= t;
    st[3] = rotl(st[3], 45);
    return result;
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_uniform(uint64_t st[4])
{
    return (double)(rng_next(st) >> 11) * 0x1.0p-53;
}

static uint64_t random_seed(void)
{
    uint64_t seed;
    if (getrandom(&seed, sizeof seed, 0) != (ssize_t)sizeof seed) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        seed = ((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec) ^
               ((uint64_t)getpid() << 32);
    }
    /* The sentinel must not be reported as the seed in use: it could not reproduce. */
    return seed == SAMPLER_SEED_RANDOM ? seed - 1 : seed;
}

void sampler_reset(sampler *s, uint64_t seed)
{
    s->seed = seed == SAMPLER_SEED_RANDOM ? random_seed() : seed;
    uint64_t x = s->seed;
    for (int i = 0; i < 4; i++)
        s->rng[i] = splitmix64(&x);
}

uint64_t sampler_seed(const sampler *s)
{
    return s->seed;
}

/* ---- construction ---- */

static int check_params(int n_vocab, const sampler_params *p, char *err)
{
    if (n_vocab <= 0)
        return err_set(err, "sampler: n_vocab must be > 0 (got %d)", n_vocab);
    if (isnan(p->temperature) || isinf(p->temperature))
        return err_set(err, "sampler: temperature must be a finite number");
    if (p->top_k < 0)
        return err_set(err, "sampler: top_k must be >= 0 (got %d; 0 disables it)", p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return err_set(err, "sampler: top_p must be in (0, 1] (got %g)", (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return err_set(err, "sampler: min_p must be in [0, 1] (got %g)", (double)p->min_p);
    if (!(p->repeat_penalty > 0.0f) || isinf(p->repeat_penalty))
        return err_set(err, "sampler: repeat_penalty must be a finite number > 0 (got %g)",
                       (double)p->repeat_penalty);
    if (!(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f))
        return err_set(err, "sampler: frequency_penalty must be in [-2, 2] (got %g)",
                       (double)p->frequency_penalty);
    if (!(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f))
        return err_set(err, "sampler: presence_penalty must be in [-2, 2] (got %g)",
                       (double)p->presence_penalty);
    if (p->repeat_last_n < -1)
        return err_set(err, "sampler: repeat_last_n must be >= -1 (got %d)", p->repeat_last_n);
    if (p->n_bias < 0 || (p->n_bias > 0 && !p->bias))
        return err_set(err, "sampler: %d logit biases and no array", p->n_bias);
    for (int i = 0; i < p->n_bias; i++) {
        const sampler_bias *b = &p->bias[i];
        if (b->token < 0 || b->token >= n_vocab)
            return err_set(err, "sampler: logit_bias token %d is outside the vocabulary "
                                "(0..%d)", b->token, n_vocab - 1);
        if (isnan(b->bias) || b->bias == INFINITY)
            return err_set(err, "sampler: logit_bias of token %d must be a number", b->token);
    }
    return 0;
}

sampler *sampler_new(int n_vocab, const sampler_params *p, char err[ERR_MAX])
{
    if (!p) {
        err_set(err, "sampler: no parameters given");
        return NULL;
    }
    if (check_params(n_vocab, p, err) < 0)
        return NULL;
    sampler *s = calloc(1, sizeof *s);
    if (s) {
        s->cand = malloc((size_t)n_vocab * sizeof *s->cand);
        s->count = calloc((size_t)n_vocab, sizeof *s->count);
        if (p->n_bias > 0 && (s->bias = malloc(sizeof *s->bias * (size_t)p->n_bias)))
            memcpy(s->bias, p->bias, sizeof *s->bias * (size_t)p->n_bias);
    }
    if (!s || !s->cand || !s->count || (p->n_bias > 0 && !s->bias)) {
        sampler_free(s);
        err_set(err, "sampler: out of memory for a vocabulary of %d", n_vocab);
        return NULL;
    }
    s->p = *p;
    s->p.bias = s->bias;
    s->n_vocab = n_vocab;
    sampler_reset(s, p->seed);
    return s;
}

void sampler_free(sampler *s)
{
    if (!s)
        return;
    free(s->cand);
    free(s->count);
    free(s->bias);
    free(s);
}

/* ---- steps ---- */

/* The order every step agrees on: higher logit first, then lower id, so results do not
 * depend on how the selection happened to permute the array. */
static bool better(const cand *a, const cand *b)
{
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static void swap(cand *a, cand *b)
{
    cand t = *a;
    *a = *b;
    *b = t;
}

/* Penalizes each distinct token of the window once, while c is still indexed by id: the
 * counts are taken first, and a token's count goes back to zero once it is applied. */
static void apply_penalty(sampler *s, const int32_t *history, int n_history)
{
    float rep = s->p.repeat_penalty, freq = s->p.frequency_penalty,
          pres = s->p.presence_penalty;
    int w = s->p.repeat_last_n;
    if ((rep == 1.0f && freq == 0.0f && pres == 0.0f) || w == 0 || n_history == 0)
        return;
    if (w < 0 || w > n_history)
        w = n_history;
    const int32_t *h = history + n_history - w;
    for (int i = 0; i < w; i++)
        if (h[i] >= 0 && h[i] < s->n_vocab)
            s->count[h[i]]++;
    for (int i = 0; i < w; i++) {
        int32_t t = h[i];
        if (t < 0 || t >= s->n_vocab || s->count[t] == 0)
            continue;
        float *l = &s->cand[t].logit;
        *l = *l > 0.0f ? *l / rep : *l * rep;
        *l -= (float)s->count[t] * freq + pres;
        s->count[t] = 0;
    }
}

static int32_t argmax(const cand *c, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (better(&c[i], &c[best]))
            best = i;
    return c[best].id;
}

/* Quickselect: afterwards c[0..k) hold the k best of c[0..n) in no particular order.
 * Expected O(n); needs 0 < k < n. */
static void select_best(cand *c, int n, int k)
{
    int lo = 0, hi = n - 1;
    while (hi > lo) {
        int mid = lo + (hi - lo) / 2;
        if (better(&c[mid], &c[lo]))
            swap(&c[mid], &c[lo]);
        if (better(&c[hi], &c[lo]))
            swap(&c[hi], &c[lo]);
        if (better(&c[hi], &c[mid]))
            swap(&c[hi], &c[mid]);
        swap(&c[mid], &c[hi]); /* the median of three becomes the pivot */
        int store = lo;
        for (int i = lo; i < hi; i++)
            if (better(&c[i], &c[hi]))
                swap(&c[i], &c[store++]);
        swap(&c[store], &c[hi]);
        if (store == k || store == k - 1)
            return;
        if (store > k)
            hi = store - 1;
        else
            lo = store + 1;
    }
}

/* Heap whose root is the worst candidate; sift-down of element i in c[0..n). */
static void sift_down(cand *c, int n, int i)
{
    for (;;) {
        int w = i, l = 2 * i + 1, r = l + 1;
        if (l < n && better(&c[w], &c[l]))
            w = l;
        if (r < n && better(&c[w], &c[r]))
            w = r;
        if (w == i)
            return;
        swap(&c[i], &c[w]);
        i = w;
    }
}

/* Afterwards c[0..k) hold the k best of c[0..n) in no particular order (0 < k < n), as
 * select_best's, in one pass: c[0..k) is kept as a heap whose root is the worst of them,
 * and a later candidate enters only when it beats the root, which over a vocabulary is
 * rare (about k ln(n / k) times for logits in random order): 3-5x faster than quickselect
 * for top-k 40 of 32000, and the serial part of every step that samples many streams. */
static void keep_best(cand *c, int n, int k)
{
    for (int i = k / 2 - 1; i >= 0; i--)
        sift_down(c, k, i);
    for (int i = k; i < n; i++)
        if (c[i].logit >= c[0].logit && better(&c[i], &c[0])) {
            c[0] = c[i];
            sift_down(c, k, 0);
        }
}

/* Heapsort, best first; in place and without allocation (unlike some qsort()s). */
static void sort_best_first(cand *c, int n)
{
    for (int i = n / 2 - 1; i >= 0; i--)
        sift_down(c, n, i);
    for (int end = n - 1; end > 0; end--) {
        swap(&c[0], &c[end]);
        sift_down(c, end, 0);
    }
}

/* Sets each w to exp((logit - max) / temp) and returns their sum. The maximum itself
 * weighs exactly 1, so all -inf (or several +inf) logits still give a distribution. */
static double weigh(cand *c, int n, float temp)
{
    float max = c[0].logit;
    for (int i = 1; i < n; i++)
        if (c[i].logit > max)
            max = c[i].logit;
    double sum = 0;
    for (int i = 0; i < n; i++) {
        c[i].w = c[i].logit == max ? 1.0f : expf((c[i].logit - max) / temp);
        sum += c[i].w;
    }
    return sum;
}

/* Sorts, best first, a prefix of c[0..n) whose weight reaches target and returns its
 * length. Nuclei are usually small, so growing selections beat sorting everything. */
static int sort_prefix_holding(cand *c, int n, double target)
{
    for (int m = 64; m < n; m *= 4) {
        select_best(c, n, m);
        sort_best_first(c, m);
        double mass = 0;
        for (int i = 0; i < m; i++)
            mass += c[i].w;
        if (mass >= target)
            return m;
    }
    sort_best_first(c, n);
    return n;
}

/* Length of the shortest best-first prefix whose weight reaches target (at least 1). */
static int nucleus(const cand *c, int n, double target)
{
    double cum = 0;
    for (int i = 0; i < n; i++) {
        cum += c[i].w;
        if (cum >= target)
            return i + 1;
    }
    return n;
}

/* Keeps, in order, the candidates with p >= min_p * p(best); returns how many. */
static int min_p_filter(cand *c, int n, float min_p)
{
    weigh(c, n, 1.0f);
    int kept = 0;
    for (int i = 0; i < n; i++)
        if (c[i].w >= min_p)
            c[kept++] = c[i];
    return kept;
}

static int32_t draw(sampler *s, cand *c, int n, float temp)
{
    double u = rng_uniform(s->rng) * weigh(c, n, temp), cum = 0;
    int last = 0;
    for (int i = 0; i < n; i++) {
        if (c[i].w > 0)
            last = i;
        cum += c[i].w;
        if (u < cum)
            return c[i].id;
    }
    return c[last].id; /* rounding left u just above the total */
}

/* c[0..n_vocab), indexed by id: the logits (NaN as -infinity), biased and penalized.
 * false when the arguments are bad. */
static bool fill(sampler *s, const float *logits, const int32_t *history, int n_history)
{
    if (!logits || n_history < 0 || (n_history > 0 && !history))
        return false;
    cand *c = s->cand;
    for (int i = 0; i < s->n_vocab; i++) {
        c[i].id = i;
        c[i].logit = isnan(logits[i]) ? -INFINITY : logits[i];
    }
    for (int i = 0; i < s->p.n_bias; i++)
        c[s->p.bias[i].token].logit += s->p.bias[i].bias;
    apply_penalty(s, history, n_history);
    return true;
}

/* Top-k, top-p and min-p over c[0..n) (n > 0): the kept candidates are c[0..returned). */
static int truncate_cands(sampler *s, cand *c, int n)
{
    bool sorted = false; /* whether c[0..n) is in best-first order */
    if (s->p.top_k > 0 && s->p.top_k < n) {
        keep_best(c, n, s->p.top_k);
        n = s->p.top_k;
        sort_best_first(c, n);
        sorted = true;
    }
    if (s->p.top_p < 1.0f) {
        double target = s->p.top_p * weigh(c, n, 1.0f);
        if (!sorted)
            n = sort_prefix_holding(c, n, target);
        n = nucleus(c, n, target);
    }
    if (s->p.min_p > 0.0f)
        n = min_p_filter(c, n, s->p.min_p);
    return n;
}

/* The candidates sampler_sample draws from, in c[0..n): penalized, truncated; *n their
 * count. -1 when the arguments are bad; 1 when greedy (c is the whole vocabulary). */
static int prepare(sampler *s, const float *logits, const int32_t *history, int n_history,
                   int *n_out)
{
    if (!fill(s, logits, history, n_history))
        return -1;
    *n_out = s->n_vocab;
    if (s->p.temperature <= 0.0f)
        return 1;
    *n_out = truncate_cands(s, s->cand, s->n_vocab);
    return 0;
}

int32_t sampler_sample(sampler *s, const float *logits, const int32_t *history, int n_history)
{
    int n, rc = prepare(s, logits, history, n_history, &n);
    if (rc < 0)
        return -1;
    return rc == 1 ? argmax(s->cand, n) : draw(s, s->cand, n, s->p.temperature);
}

/* Keeps, in order, the candidates of c[0..n) the constraint allows; returns how many. */
static int keep_allowed(cand *c, int n, const sampler_constraint *con)
{
    int kept = 0;
    for (int i = 0; i < n; i++)
        if (con->allows(con->ctx, c[i].id))
            c[kept++] = c[i];
    return kept;
}

int32_t sampler_sample_allowed(sampler *s, const float *logits, const int32_t *history,
                               int n_history, const sampler_constraint *con)
{
    int n, rc = con && con->allows ? prepare(s, logits, history, n_history, &n) : -1;
    if (rc < 0)
        return -1;
    bool greedy = rc == 1;
    float temp = s->p.temperature;
    int32_t t = greedy ? argmax(s->cand, n) : draw(s, s->cand, n, temp);
    if (con->allows(con->ctx, t))
        return t;
    n = keep_allowed(s->cand, n, con);
    if (n == 0 && !greedy) {
        /* the truncation kept no allowed token: it is made again over the allowed alone */
        fill(s, logits, history, n_history);
        n = keep_allowed(s->cand, s->n_vocab, con);
        if (n > 0)
            n = truncate_cands(s, s->cand, n);
    }
    if (n == 0)
        return -1;
    return greedy ? argmax(s->cand, n) : draw(s, s->cand, n, temp);
}
