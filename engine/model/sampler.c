/* sampler.c — logit biases, the chain of llama.cpp's samplers and the random draw (see
 * sampler.h). */
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
    /* (n_vocab) all zero between steps: the penalties' occurrences in their window, then
     * DRY's 1 + the longest repetition a token would extend */
    int32_t *count;
    sampler_bias *bias; /* (p.n_bias) the logit biases, owned (p.bias points here) */
    /* The chain: the steps in order (p.order, or every step), and whether each runs:
     * those that are off do not, nor, when the chain is greedy, those that never drop the
     * most likely token unless a step that may drop it follows them (then they would
     * change what that step sees). */
    enum sampler_step order[SAMPLER_STEPS];
    bool runs[SAMPLER_STEPS];
    int n_order;
    double mu;          /* Mirostat's: the surprise the next draw may have, in bits */
    /* DRY's, when it is on */
    sampler_breaker *brk; /* (p.n_dry_breakers) owned, by head then tail length */
    int32_t *dry_z;     /* (dry_window) the repetition lengths of the window's places */
    int dry_window;     /* history tokens DRY looks at, at most */
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
        .typical_p = 1.0f,
        .top_n_sigma = -1.0f,
        .xtc_threshold = 0.1f,
        .dynatemp_exponent = 1.0f,
        .dry_base = 1.75f,
        .dry_allowed_length = 2,
        .dry_penalty_last_n = -1,
        .mirostat_tau = 5.0f,
        .mirostat_eta = 0.1f,
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
    s->mu = 2.0 * s->p.mirostat_tau;
}

uint64_t sampler_seed(const sampler *s)
{
    return s->seed;
}

/* ---- construction ---- */

static bool finite_at_least(float x, float min)
{
    return isfinite(x) && x >= min;
}

static int check_dry(int n_vocab, const sampler_params *p, char *err)
{
    if (!finite_at_least(p->dry_multiplier, 0.0f))
        return err_set(err, "sampler: dry_multiplier must be a finite number >= 0 (got %g; 0 "
                            "disables DRY)", (double)p->dry_multiplier);
    if (p->dry_multiplier == 0.0f)
        return 0;
    if (!finite_at_least(p->dry_base, 1.0f))
        return err_set(err, "sampler: dry_base must be a finite number >= 1 (got %g)",
                       (double)p->dry_base);
    if (p->dry_allowed_length < 0)
        return err_set(err, "sampler: dry_allowed_length must be >= 0 (got %d)",
                       p->dry_allowed_length);
    if (p->dry_penalty_last_n < -1)
        return err_set(err, "sampler: dry_penalty_last_n must be >= -1 (got %d; -1: the whole "
                            "history, 0 disables DRY)", p->dry_penalty_last_n);
    if (p->dry_penalty_last_n != 0 && p->n_ctx <= 0)
        return err_set(err, "sampler: DRY needs n_ctx, the longest history (got %d)", p->n_ctx);
    if (p->n_dry_breakers < 0 || (p->n_dry_breakers > 0 && !p->dry_breakers))
        return err_set(err, "sampler: %d DRY sequence breakers and no array", p->n_dry_breakers);
    for (int i = 0; i < p->n_dry_breakers; i++) {
        const sampler_breaker *b = &p->dry_breakers[i];
        if (b->n_tail < 0 || b->n_tail > SAMPLER_BREAKER_TAIL_MAX)
            return err_set(err, "sampler: DRY sequence breaker %d has %d tokens after its "
                                "first, at most %d", i, b->n_tail, SAMPLER_BREAKER_TAIL_MAX);
        bool inside = b->head >= 0 && b->head < n_vocab;
        for (int k = 0; k < b->n_tail; k++)
            inside &= b->tail[k] >= 0 && b->tail[k] < n_vocab;
        if (!inside)
            return err_set(err, "sampler: DRY sequence breaker %d has a token outside the "
                                "vocabulary (0..%d)", i, n_vocab - 1);
    }
    return 0;
}

/* The newer steps' parameters; those of a step that is off are not looked at. */
static int check_newer(int n_vocab, const sampler_params *p, char *err)
{
    if (p->min_keep < 0)
        return err_set(err, "sampler: min_keep must be >= 0 (got %d)", p->min_keep);
    if (!(p->typical_p > 0.0f && p->typical_p <= 1.0f))
        return err_set(err, "sampler: typical_p must be in (0, 1] (got %g; 1 disables it)",
                       (double)p->typical_p);
    if (!isfinite(p->top_n_sigma))
        return err_set(err, "sampler: top_n_sigma must be a finite number (<= 0 disables it)");
    if (!(p->xtc_probability >= 0.0f && p->xtc_probability <= 1.0f))
        return err_set(err, "sampler: xtc_probability must be in [0, 1] (got %g; 0 disables "
                            "XTC)", (double)p->xtc_probability);
    if (p->xtc_probability > 0.0f && !(p->xtc_threshold >= 0.0f && p->xtc_threshold <= 1.0f))
        return err_set(err, "sampler: xtc_threshold must be in [0, 1] (got %g; above 0.5 "
                            "disables XTC)", (double)p->xtc_threshold);
    if (!finite_at_least(p->dynatemp_range, 0.0f))
        return err_set(err, "sampler: dynatemp_range must be a finite number >= 0 (got %g; 0 "
                            "disables it)", (double)p->dynatemp_range);
    if (p->dynatemp_range > 0.0f && !finite_at_least(p->dynatemp_exponent, 0.0f))
        return err_set(err, "sampler: dynatemp_exponent must be a finite number >= 0 (got %g)",
                       (double)p->dynatemp_exponent);
    if (check_dry(n_vocab, p, err) < 0)
        return -1;
    if (p->mirostat < 0 || p->mirostat > 2)
        return err_set(err, "sampler: mirostat must be 0 (off), 1 or 2 (got %d)", p->mirostat);
    if (p->mirostat && !finite_at_least(p->mirostat_tau, 0.0f))
        return err_set(err, "sampler: mirostat_tau must be a finite number >= 0 (got %g)",
                       (double)p->mirostat_tau);
    if (p->mirostat && !finite_at_least(p->mirostat_eta, 0.0f))
        return err_set(err, "sampler: mirostat_eta must be a finite number >= 0 (got %g)",
                       (double)p->mirostat_eta);
    if (p->n_order < 0 || p->n_order > SAMPLER_STEPS)
        return err_set(err, "sampler: an order of %d steps: there are %d", p->n_order,
                       SAMPLER_STEPS);
    bool seen[SAMPLER_STEPS] = {false};
    for (int i = 0; i < p->n_order; i++) {
        if (p->order[i] < 0 || p->order[i] >= SAMPLER_STEPS)
            return err_set(err, "sampler: order[%d] is no step (%d)", i, (int)p->order[i]);
        if (seen[p->order[i]])
            return err_set(err, "sampler: order names a step twice (each runs at most once)");
        seen[p->order[i]] = true;
    }
    return 0;
}

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
    return check_newer(n_vocab, p, err);
}

/* Breakers by head, then by tail length: a head's first has the shortest tail. */
static int breaker_cmp(const void *a, const void *b)
{
    const sampler_breaker *x = a, *y = b;
    if (x->head != y->head)
        return x->head < y->head ? -1 : 1;
    return (x->n_tail > y->n_tail) - (x->n_tail < y->n_tail);
}

/* Whether step i of the order may be skipped when the chain is greedy: it never drops the
 * most likely token, and no step that may drop it follows it before the temperature (a
 * step that would see what it left). */
static bool greedy_skips(const sampler *s, int i)
{
    enum sampler_step st = s->order[i];
    if (st != SAMPLER_TOP_N_SIGMA && st != SAMPLER_TOP_K && st != SAMPLER_TOP_P &&
        st != SAMPLER_MIN_P)
        return false;
    for (int k = i + 1; k < s->n_order && s->order[k] != SAMPLER_TEMPERATURE; k++)
        if ((s->order[k] == SAMPLER_TYPICAL || s->order[k] == SAMPLER_XTC) && s->runs[k])
            return false;
    for (int k = i + 1; k < s->n_order; k++)
        if (s->order[k] == SAMPLER_TEMPERATURE)
            return s->p.temperature <= 0.0f && s->p.dynatemp_range <= 0.0f;
    return false;
}

/* Whether a step does anything with the parameters p. */
static bool step_on(const sampler_params *p, enum sampler_step st)
{
    switch (st) {
    case SAMPLER_PENALTIES:
        return (p->repeat_penalty != 1.0f || p->frequency_penalty != 0.0f ||
                p->presence_penalty != 0.0f) && p->repeat_last_n != 0;
    case SAMPLER_DRY: return p->dry_multiplier != 0.0f && p->dry_penalty_last_n != 0;
    case SAMPLER_TOP_N_SIGMA: return p->top_n_sigma > 0.0f;
    case SAMPLER_TOP_K: return p->top_k > 0;
    case SAMPLER_TYPICAL: return p->typical_p < 1.0f;
    case SAMPLER_TOP_P: return p->top_p < 1.0f;
    case SAMPLER_MIN_P: return p->min_p > 0.0f;
    case SAMPLER_XTC: return p->xtc_probability > 0.0f && p->xtc_threshold <= 0.5f;
    default: return true; /* the temperature */
    }
}

/* The chain of s: its order and the steps that run (s->p set). */
static void plan_chain(sampler *s)
{
    s->n_order = s->p.n_order ? s->p.n_order : SAMPLER_STEPS;
    for (int i = 0; i < s->n_order; i++) {
        s->order[i] = s->p.n_order ? s->p.order[i] : (enum sampler_step)i;
        s->runs[i] = step_on(&s->p, s->order[i]);
    }
    /* greedy_skips reads whether the steps that may drop a token run: decided above */
    for (int i = 0; i < s->n_order; i++)
        s->runs[i] &= !greedy_skips(s, i);
}

sampler *sampler_new(int n_vocab, const sampler_params *p, char err[ERR_MAX])
{
    if (!p) {
        err_set(err, "sampler: no parameters given");
        return NULL;
    }
    if (check_params(n_vocab, p, err) < 0)
        return NULL;
    bool dry = !p->mirostat && step_on(p, SAMPLER_DRY);
    int window = p->dry_penalty_last_n < 0 || p->dry_penalty_last_n > p->n_ctx
                     ? p->n_ctx : p->dry_penalty_last_n;
    size_t n_brk = (size_t)(dry ? p->n_dry_breakers : 0);
    sampler *s = calloc(1, sizeof *s);
    if (s) {
        s->cand = malloc((size_t)n_vocab * sizeof *s->cand);
        s->count = calloc((size_t)n_vocab, sizeof *s->count);
        if (p->n_bias > 0 && (s->bias = malloc(sizeof *s->bias * (size_t)p->n_bias)))
            memcpy(s->bias, p->bias, sizeof *s->bias * (size_t)p->n_bias);
        if (n_brk > 0 && (s->brk = malloc(sizeof *s->brk * n_brk)))
            memcpy(s->brk, p->dry_breakers, sizeof *s->brk * n_brk);
        if (dry)
            s->dry_z = malloc(sizeof *s->dry_z * (size_t)window);
    }
    if (!s || !s->cand || !s->count || (p->n_bias > 0 && !s->bias) || (n_brk > 0 && !s->brk) ||
        (dry && !s->dry_z)) {
        sampler_free(s);
        err_set(err, "sampler: out of memory for a vocabulary of %d", n_vocab);
        return NULL;
    }
    s->p = *p;
    s->p.bias = s->bias;
    s->p.dry_breakers = s->brk;
    s->p.n_dry_breakers = (int)n_brk;
    if (n_brk > 0)
        qsort(s->brk, n_brk, sizeof *s->brk, breaker_cmp);
    s->dry_window = dry ? window : 0;
    s->n_vocab = n_vocab;
    plan_chain(s);
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
    free(s->brk);
    free(s->dry_z);
    free(s);
}

/* ---- candidates ---- */

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

/* The index of the best candidate of c[0..n) (n > 0). */
static int best_index(const cand *c, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (better(&c[i], &c[best]))
            best = i;
    return best;
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

/* Sorts, best first, a prefix of c[0..n) of at least min_len whose weight reaches
 * target, and returns its length. Nuclei are usually small, so growing selections beat
 * sorting everything. */
static int sort_prefix_holding(cand *c, int n, double target, int min_len)
{
    for (int m = 64; m < n; m *= 4) {
        select_best(c, n, m);
        sort_best_first(c, m);
        double mass = 0;
        for (int i = 0; i < m; i++)
            mass += c[i].w;
        if (m >= min_len && mass >= target)
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

/* Sorts the best k of c[0..n) first (0 < k <= n): the rest follow in no order. */
static void sort_best(cand *c, int n, int k)
{
    if (k < n)
        select_best(c, n, k);
    sort_best_first(c, k);
}

/* Uniform in [0, total) walked over c[0..n)'s weights (weigh's): the index drawn. */
static int draw_index(sampler *s, const cand *c, int n, double total)
{
    double u = rng_uniform(s->rng) * total, cum = 0;
    int last = 0;
    for (int i = 0; i < n; i++) {
        if (c[i].w > 0)
            last = i;
        cum += c[i].w;
        if (u < cum)
            return i;
    }
    return last; /* rounding left u just above the total */
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

/* ---- the chain ---- */

/* The candidates s->cand[0..n) as the steps leave them. */
typedef struct chain {
    int n;
    bool sorted; /* best first */
    bool by_id;  /* cand[i].id == i for every i: the whole vocabulary, nothing moved */
    bool greedy; /* the temperature step said <= 0: the best of them is the token */
    float temp;  /* the draw's temperature, and the scale of every later step (1 before the
                  * temperature step): a penalty after it is subtracted in tempered units */
} chain;

/* min_keep as a count of c's candidates (llama.cpp's 0 keeps one, as 1 does). */
static int min_keep(const sampler *s, const chain *ch)
{
    int k = s->p.min_keep > 1 ? s->p.min_keep : 1;
    return k < ch->n ? k : ch->n;
}

/* A logit less sub (in the units of temperature 1) in the chain's units. */
static void subtract(float *logit, float sub, const chain *ch)
{
    *logit -= ch->temp == 1.0f ? sub : sub * ch->temp;
}

/* Penalizes each distinct token of the window once (llama.cpp's penalties sampler): the
 * counts are taken first, and a token's count goes back to zero once it is applied. */
static void step_penalties(sampler *s, chain *ch, const int32_t *history, int n_history)
{
    float rep = s->p.repeat_penalty, freq = s->p.frequency_penalty,
          pres = s->p.presence_penalty;
    int w = s->p.repeat_last_n;
    if (n_history == 0)
        return;
    if (w < 0 || w > n_history)
        w = n_history;
    const int32_t *h = history + n_history - w;
    for (int i = 0; i < w; i++)
        if (h[i] >= 0 && h[i] < s->n_vocab)
            s->count[h[i]]++;
    /* indexed by id, the window's tokens are found directly; otherwise every candidate
     * looks its count up, and the counts are cleared after */
    int n = ch->by_id ? w : ch->n;
    for (int i = 0; i < n; i++) {
        int32_t t = ch->by_id ? h[i] : s->cand[i].id;
        if (t < 0 || t >= s->n_vocab || s->count[t] == 0)
            continue;
        float *l = &s->cand[ch->by_id ? t : i].logit;
        *l = *l > 0.0f ? *l / rep : *l * rep;
        subtract(l, (float)s->count[t] * freq + pres, ch);
        if (ch->by_id)
            s->count[t] = 0;
    }
    for (int i = 0; !ch->by_id && i < w; i++)
        if (h[i] >= 0 && h[i] < s->n_vocab)
            s->count[h[i]] = 0;
    ch->sorted = false;
}

/* The longest tail of a breaker headed by w[at] that follows it within w[0..n), or -1
 * when none does (s->brk is sorted by head, then tail length). */
static int breaker_at(const sampler *s, const int32_t *w, int n, int at)
{
    int lo = 0, hi = s->p.n_dry_breakers;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (s->brk[mid].head < w[at])
            lo = mid + 1;
        else
            hi = mid;
    }
    int longest = -1;
    for (int i = lo; i < s->p.n_dry_breakers && s->brk[i].head == w[at]; i++) {
        const sampler_breaker *b = &s->brk[i];
        if (at + b->n_tail >= n)
            break; /* this tail, and the longer ones after it, do not fit */
        bool match = true;
        for (int k = 0; k < b->n_tail && match; k++)
            match = b->tail[k] == w[at + 1 + k];
        if (match)
            longest = b->n_tail;
    }
    return longest;
}

/* Whether t's own text holds a breaker (a breaker with no tail): DRY never penalizes it. */
static bool breaks_alone(const sampler *s, int32_t t)
{
    int32_t one = t;
    return breaker_at(s, &one, 1, 0) == 0;
}

/*
 * DRY, as llama.cpp's (after koboldcpp's): in the window w of the last tokens, the end
 * is followed back to the latest sequence breaker (limit: how many tokens after it);
 * then for each earlier place where the window's end repeats (the Z-function of the
 * window read backwards: z[k] tokens from the end equal those k before them), the token
 * that followed that place would extend a repetition of min(z[k], limit) tokens. Each
 * token that would extend one of at least dry_allowed_length loses dry_multiplier *
 * dry_base ^ (longest - allowed), the exponent held where the power would pass float's
 * range as llama.cpp holds it; a token whose text holds a breaker is spared.
 */
static void step_dry(sampler *s, chain *ch, const int32_t *history, int n_history)
{
    const sampler_params *p = &s->p;
    int n = n_history < s->dry_window ? n_history : s->dry_window;
    int allowed = p->dry_allowed_length;
    if (n <= allowed)
        return;
    const int32_t *w = history + n_history - n;
    int limit = n;
    for (int i = 0; i < n; i++) {
        int tail = breaker_at(s, w, n, n - 1 - i);
        if (tail >= 0) {
            limit = i - tail;
            break;
        }
    }
    if (limit < allowed)
        return;
    int32_t *z = s->dry_z, *len = s->count;
    for (int k = 1, lo = 0, hi = 0; k < n; k++) {
        int m = k < hi ? (hi - k < z[k - lo] ? hi - k : z[k - lo]) : 0;
        while (k + m < n && w[n - 1 - m] == w[n - 1 - k - m])
            m++;
        z[k] = m;
        if (k + m > hi)
            lo = k, hi = k + m;
    }
    for (int k = 1; k < n; k++) {
        int m = z[k] < limit ? z[k] : limit;
        int32_t t = w[n - k];
        if (m >= allowed && t >= 0 && t < s->n_vocab && m + 1 > len[t])
            len[t] = m + 1;
    }
    int max_exp = p->dry_base > 1.000001f ? (int)(88.7228391f / logf(p->dry_base)) : 0;
    int m_cand = ch->by_id ? n - 1 : ch->n;
    for (int i = 0; i < m_cand; i++) {
        int32_t t = ch->by_id ? w[n - 1 - i] : s->cand[i].id;
        if (t < 0 || t >= s->n_vocab || len[t] == 0)
            continue;
        int x = len[t] - 1 - allowed;
        if (max_exp > 0 && x > max_exp)
            x = max_exp;
        if (!breaks_alone(s, t))
            subtract(&s->cand[ch->by_id ? t : i].logit,
                     (float)(p->dry_multiplier * pow(p->dry_base, x)), ch);
        if (ch->by_id)
            len[t] = 0;
    }
    for (int k = 1; !ch->by_id && k < n; k++)
        if (w[n - k] >= 0 && w[n - k] < s->n_vocab)
            len[w[n - k]] = 0;
    ch->sorted = false;
}

/* Top-n-sigma: drops the logits more than n standard deviations (of the finite logits)
 * below the best; order kept. */
static void step_top_n_sigma(sampler *s, chain *ch)
{
    cand *c = s->cand;
    double max = -INFINITY, sum = 0, acc = 0;
    int finite = 0;
    if (ch->n <= 1)
        return;
    for (int i = 0; i < ch->n; i++)
        if (c[i].logit != -INFINITY) {
            max = c[i].logit > max ? c[i].logit : max;
            sum += c[i].logit;
            finite++;
        }
    if (finite == 0)
        return;
    double mean = sum / finite;
    for (int i = 0; i < ch->n; i++)
        if (c[i].logit != -INFINITY)
            acc += (c[i].logit - mean) * (c[i].logit - mean);
    double cut = max - s->p.top_n_sigma * sqrt(acc / finite);
    if (isnan(cut))
        return; /* an infinite logit: no spread to measure */
    int kept = 0;
    for (int i = 0; i < ch->n; i++)
        if (c[i].logit >= cut)
            c[kept++] = c[i];
    ch->by_id &= kept == ch->n;
    ch->n = kept;
}

static void step_top_k(sampler *s, chain *ch)
{
    if (s->p.top_k >= ch->n)
        return;
    keep_best(s->cand, ch->n, s->p.top_k);
    ch->n = s->p.top_k;
    sort_best_first(s->cand, ch->n);
    ch->sorted = true;
    ch->by_id = false;
}

/* Locally typical sampling: the tokens whose surprise (-ln p) is nearest the entropy
 * first, kept until their mass passes typical_p (at least min_keep). A token of
 * probability 0 is the least typical. */
static void step_typical(sampler *s, chain *ch)
{
    cand *c = s->cand;
    int n = ch->n;
    double total = weigh(c, n, ch->temp), h = 0;
    for (int i = 0; i < n; i++)
        if (c[i].w > 0)
            h -= c[i].w / total * log(c[i].w / total);
    /* sorted by that distance through the best-first sort: its negation stands in the
     * logit meanwhile (ties then go to the lower id), the logit in w */
    for (int i = 0; i < n; i++) {
        double p = c[i].w / total;
        float d = p > 0 ? (float)fabs(-log(p) - h) : INFINITY;
        c[i].w = c[i].logit;
        c[i].logit = -d;
    }
    sort_best_first(c, n);
    for (int i = 0; i < n; i++)
        c[i].logit = c[i].w;
    double target = s->p.typical_p * weigh(c, n, ch->temp), cum = 0;
    int keep = min_keep(s, ch);
    for (int i = 0; i < n; i++) {
        cum += c[i].w;
        if (cum > target && i + 1 >= keep) {
            n = i + 1;
            break;
        }
    }
    ch->n = n;
    ch->sorted = ch->by_id = false;
}

static void step_top_p(sampler *s, chain *ch)
{
    int keep = min_keep(s, ch);
    double target = s->p.top_p * weigh(s->cand, ch->n, ch->temp);
    int n = ch->sorted ? ch->n : sort_prefix_holding(s->cand, ch->n, target, keep);
    n = nucleus(s->cand, n, target);
    ch->n = n > keep ? n : keep;
    ch->sorted = true;
    ch->by_id = false;
}

/* Keeps, in order, the candidates with p >= min_p * p(best); when fewer than min_keep
 * are left, the best min_keep. */
static void step_min_p(sampler *s, chain *ch)
{
    cand *c = s->cand;
    float min_p = s->p.min_p;
    weigh(c, ch->n, ch->temp);
    int pass = 0, keep = min_keep(s, ch);
    for (int i = 0; i < ch->n; i++)
        pass += c[i].w >= min_p;
    if (pass < keep) {
        if (!ch->sorted)
            sort_best(c, ch->n, keep);
        ch->n = keep;
        ch->sorted = true;
        ch->by_id = false;
        return;
    }
    int kept = 0;
    for (int i = 0; i < ch->n; i++)
        if (c[i].w >= min_p)
            c[kept++] = c[i];
    ch->by_id &= kept == ch->n;
    ch->n = kept;
}

/* XTC: with probability xtc_probability (a number of the stream drawn each time), the
 * tokens of probability >= xtc_threshold go but the least likely of them, unless fewer
 * than two are above it or fewer than min_keep tokens would be left. */
static void step_xtc(sampler *s, chain *ch)
{
    cand *c = s->cand;
    if (ch->n < 2 || rng_uniform(s->rng) > s->p.xtc_probability)
        return;
    double cut = s->p.xtc_threshold * weigh(c, ch->n, ch->temp);
    int above = 0;
    for (int i = 0; i < ch->n; i++)
        above += c[i].w >= cut;
    if (above < 2 || ch->n - (above - 1) < (s->p.min_keep > 1 ? s->p.min_keep : 1))
        return;
    if (!ch->sorted) {
        /* those above first, the least likely of them last */
        if (above < ch->n)
            select_best(c, ch->n, above);
        int worst = 0;
        for (int i = 1; i < above; i++)
            if (better(&c[worst], &c[i]))
                worst = i;
        swap(&c[worst], &c[above - 1]);
    }
    memmove(c, c + above - 1, sizeof *c * (size_t)(ch->n - above + 1));
    ch->n -= above - 1;
    ch->by_id = false;
}

/* The temperature, or the dynamic one: base +- range by the candidates' entropy over its
 * maximum (ln n) raised to dynatemp_exponent. <= 0 makes the chain greedy. */
static void step_temperature(sampler *s, chain *ch)
{
    float t = s->p.temperature;
    if (s->p.dynatemp_range > 0.0f && ch->n > 1) {
        cand *c = s->cand;
        double total = weigh(c, ch->n, 1.0f), h = 0;
        for (int i = 0; i < ch->n; i++)
            if (c[i].w > 0)
                h -= c[i].w / total * log(c[i].w / total);
        double lo = t - s->p.dynatemp_range > 0.0f ? t - s->p.dynatemp_range : 0.0;
        double hi = t + s->p.dynatemp_range;
        t = (float)(lo + (hi - lo) * pow(h / log(ch->n), s->p.dynatemp_exponent));
    }
    if (t <= 0.0f)
        ch->greedy = true;
    else
        ch->temp = t;
}

/* Mirostat v2's truncation: the tokens of surprise -log2 p <= mu, at least the best. */
static void mirostat2_truncate(sampler *s, chain *ch)
{
    cand *c = s->cand;
    double cut = weigh(c, ch->n, ch->temp) * exp2(-s->mu);
    cand best = c[best_index(c, ch->n)];
    int kept = 0;
    for (int i = 0; i < ch->n; i++)
        if (c[i].w >= cut)
            c[kept++] = c[i];
    if (kept == 0)
        c[kept++] = best;
    ch->n = kept;
}

/* Mirostat v1's truncation: Zipf's exponent s estimated over the 100 likeliest tokens,
 * then the top k whose expected surprise is mu (k from llama.cpp's formula, at least 1;
 * where it is NaN, 1, as llama.cpp's conversion gives on x86). */
static void mirostat1_truncate(sampler *s, chain *ch)
{
    cand *c = s->cand;
    int n = ch->n, m = n < 100 ? n : 100;
    sort_best(c, n, m);
    double num = 0, den = 0;
    for (int i = 0; i + 1 < m; i++) {
        double t = log((i + 2.0) / (i + 1.0));
        double b = ((double)c[i].logit - c[i + 1].logit) / ch->temp; /* ln(p_i / p_i+1) */
        num += t * b;
        den += t * t;
    }
    double zipf = num / den, eps = zipf - 1;
    double k = pow(eps * exp2(s->mu) / (1 - pow(s->n_vocab, -eps)), 1 / zipf);
    int kept = !(k >= 1) ? 1 : k >= n ? n : (int)k;
    if (kept > m)
        sort_best(c + m, n - m, kept - m);
    ch->n = kept;
    ch->sorted = true;
    ch->by_id = false;
}

/* The steps over s->cand[0..ch->n), until one makes the chain greedy; with Mirostat, its
 * temperature and truncation. */
static void run_chain(sampler *s, chain *ch, const int32_t *history, int n_history)
{
    if (s->p.mirostat) {
        if (s->p.temperature <= 0.0f) {
            ch->greedy = true;
            return;
        }
        ch->temp = s->p.temperature;
        if (s->p.mirostat == 1)
            mirostat1_truncate(s, ch);
        else
            mirostat2_truncate(s, ch);
        return;
    }
    for (int i = 0; i < s->n_order && !ch->greedy; i++) {
        if (!s->runs[i])
            continue;
        switch (s->order[i]) {
        case SAMPLER_PENALTIES: step_penalties(s, ch, history, n_history); break;
        case SAMPLER_DRY: step_dry(s, ch, history, n_history); break;
        case SAMPLER_TOP_N_SIGMA: step_top_n_sigma(s, ch); break;
        case SAMPLER_TOP_K: step_top_k(s, ch); break;
        case SAMPLER_TYPICAL: step_typical(s, ch); break;
        case SAMPLER_TOP_P: step_top_p(s, ch); break;
        case SAMPLER_MIN_P: step_min_p(s, ch); break;
        case SAMPLER_XTC: step_xtc(s, ch); break;
        default: step_temperature(s, ch); break;
        }
    }
}

/* c[0..n_vocab), indexed by id: the logits (NaN as -infinity), biased. false when the
 * arguments are bad. */
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
    return true;
}

/* The candidates sampler_sample draws from: the biased logits through the chain. false
 * when the arguments are bad. */
static bool prepare(sampler *s, const float *logits, const int32_t *history, int n_history,
                    chain *ch)
{
    if (!fill(s, logits, history, n_history))
        return false;
    *ch = (chain){.n = s->n_vocab, .by_id = true, .temp = 1.0f};
    run_chain(s, ch, history, n_history);
    return true;
}

/* The index of the token of the chain's candidates: the best when greedy, else drawn;
 * *p its probability among them (1 when greedy). */
static int choose(sampler *s, const chain *ch, double *p)
{
    if (ch->greedy) {
        *p = 1.0;
        return best_index(s->cand, ch->n);
    }
    double total = weigh(s->cand, ch->n, ch->temp);
    int i = draw_index(s, s->cand, ch->n, total);
    *p = s->cand[i].w / total;
    return i;
}

/* The token taken, of probability p where it was drawn: Mirostat learns its surprise. */
static int32_t take(sampler *s, const chain *ch, int i, double p)
{
    if (s->p.mirostat && !ch->greedy)
        s->mu -= s->p.mirostat_eta * (-log2(p) - s->p.mirostat_tau);
    return s->cand[i].id;
}

int32_t sampler_sample(sampler *s, const float *logits, const int32_t *history, int n_history)
{
    chain ch;
    double p;
    if (!prepare(s, logits, history, n_history, &ch))
        return -1;
    int i = choose(s, &ch, &p);
    return take(s, &ch, i, p);
}

int32_t sampler_sample_allowed(sampler *s, const float *logits, const int32_t *history,
                               int n_history, const sampler_constraint *con)
{
    chain ch;
    double p;
    if (!con || !con->allows || !prepare(s, logits, history, n_history, &ch))
        return -1;
    int i = choose(s, &ch, &p);
    if (con->allows(con->ctx, s->cand[i].id))
        return take(s, &ch, i, p);
    bool truncated = ch.n < s->n_vocab;
    ch.n = keep_allowed(s->cand, ch.n, con);
    ch.by_id = false;
    if (ch.n == 0 && truncated) {
        /* the chain kept no allowed token: it runs again over the allowed alone */
        fill(s, logits, history, n_history);
        ch = (chain){.n = keep_allowed(s->cand, s->n_vocab, con), .temp = 1.0f};
        if (ch.n > 0)
            run_chain(s, &ch, history, n_history);
    }
    if (ch.n == 0)
        return -1;
    i = choose(s, &ch, &p);
    return take(s, &ch, i, p);
}
