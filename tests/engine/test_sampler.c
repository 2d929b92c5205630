/* Tests of the token sampler and the stop-string matcher. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/sampler.h"
#include "engine/tok/stop.h"
#include "tests/support/test.h"

/* Parameters with every truncation off, temperature 1 and a fixed seed. */
static sampler_params plain_params(uint64_t seed)
{
    sampler_params p = sampler_params_default();
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = seed;
    return p;
}

/* Deterministic pseudo-random logits in [-scale, scale). */
static void fill_logits(float *l, int n, uint32_t seed, float scale)
{
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        l[i] = ((float)(seed >> 8) / (float)(1u << 24) * 2.0f - 1.0f) * scale;
    }
}

static void defaults_match_llama_cpp(void)
{
    sampler_params p = sampler_params_default();
    CHECK_NEAR(p.temperature, 0.8, 1e-6);
    CHECK_EQ(p.top_k, 40);
    CHECK_NEAR(p.top_p, 0.95, 1e-6);
    CHECK_NEAR(p.min_p, 0.05, 1e-6);
    CHECK_NEAR(p.repeat_penalty, 1.0, 0);
    CHECK_EQ(p.repeat_last_n, 64);
    CHECK(p.seed == SAMPLER_SEED_RANDOM);
}

static void greedy_picks_argmax_lowest_id_on_ties(void)
{
    sampler_params p = plain_params(1);
    p.temperature = 0.0f;
    char err[ERR_MAX];
    sampler *s = sampler_new(6, &p, err);
    CHECK_MSG(s, "%s", err);
    float l[6] = {0.5f, 2.0f, -1.0f, 3.0f, 3.0f, 1.0f};
    CHECK_EQ(sampler_sample(s, l, NULL, 0), 3);
    l[0] = 7.0f;
    CHECK_EQ(sampler_sample(s, l, NULL, 0), 0);
    sampler_free(s);
}

static void top_k_1_equals_greedy(void)
{
    enum { N = 5000 };
    static float l[N];
    sampler_params p = plain_params(7);
    p.top_k = 1;
    sampler *s = sampler_new(N, &p, NULL);
    sampler_params g = p;
    g.temperature = 0.0f;
    sampler *gs = sampler_new(N, &g, NULL);
    CHECK(s && gs);
    for (int round = 0; round < 50; round++) {
        fill_logits(l, N, 100u + (uint32_t)round, 10.0f);
        int32_t a = sampler_sample(s, l, NULL, 0), b = sampler_sample(gs, l, NULL, 0);
        CHECK_MSG(a == b, "round %d: top_k=1 gave %d, greedy %d", round, a, b);
    }
    sampler_free(s);
    sampler_free(gs);
}

static void same_seed_same_sequence_different_seed_differs(void)
{
    enum { N = 1000, STEPS = 200 };
    static float l[N];
    fill_logits(l, N, 3, 2.0f);
    sampler_params p = sampler_params_default();
    p.seed = 42;
    sampler *a = sampler_new(N, &p, NULL), *b = sampler_new(N, &p, NULL);
    p.seed = 43;
    sampler *c = sampler_new(N, &p, NULL);
    CHECK(a && b && c);
    int32_t first[STEPS];
    int differ = 0;
    for (int i = 0; i < STEPS; i++) {
        first[i] = sampler_sample(a, l, NULL, 0);
        CHECK_EQ(first[i], sampler_sample(b, l, NULL, 0));
        differ += first[i] != sampler_sample(c, l, NULL, 0);
    }
    CHECK_MSG(differ > STEPS / 4, "seeds 42 and 43 differ at only %d of %d steps", differ,
              STEPS);
    /* reset replays the stream from the start */
    sampler_reset(a, 42);
    for (int i = 0; i < STEPS; i++)
        CHECK_EQ(sampler_sample(a, l, NULL, 0), first[i]);
    CHECK(sampler_seed(a) == 42);
    sampler_free(a);
    sampler_free(b);
    sampler_free(c);
}

static void random_seed_is_reported_and_reproducible(void)
{
    enum { N = 100 };
    float l[N];
    fill_logits(l, N, 9, 1.0f);
    sampler_params p = plain_params(SAMPLER_SEED_RANDOM);
    sampler *a = sampler_new(N, &p, NULL);
    CHECK(a);
    CHECK(sampler_seed(a) != SAMPLER_SEED_RANDOM);
    p.seed = sampler_seed(a);
    sampler *b = sampler_new(N, &p, NULL);
    CHECK(b);
    for (int i = 0; i < 100; i++)
        CHECK_EQ(sampler_sample(a, l, NULL, 0), sampler_sample(b, l, NULL, 0));
    sampler_free(a);
    sampler_free(b);
}

/* 20000 draws at temperature 1 without truncation: each token's frequency must lie
 * within 5 standard deviations (sqrt(p(1-p)/n)) of its softmax probability. The seed is
 * fixed, so the outcome is deterministic; a wrong distribution (e.g. temperature applied
 * twice, an off-by-one in the cumulative walk) misses by far more. */
static void frequencies_match_softmax(void)
{
    enum { N = 8, DRAWS = 20000 };
    float l[N] = {1.0f, 2.0f, 0.5f, -1.0f, 3.0f, 0.0f, 2.5f, -INFINITY};
    sampler_params p = plain_params(12345);
    sampler *s = sampler_new(N, &p, NULL);
    CHECK(s);
    int count[N] = {0};
    for (int i = 0; i < DRAWS; i++) {
        int32_t t = sampler_sample(s, l, NULL, 0);
        CHECK(t >= 0 && t < N);
        count[t]++;
    }
    double sum = 0;
    for (int i = 0; i < N; i++)
        sum += exp(l[i]);
    for (int i = 0; i < N; i++) {
        double prob = exp(l[i]) / sum, freq = (double)count[i] / DRAWS;
        double tol = 5.0 * sqrt(prob * (1 - prob) / DRAWS) + 1e-9;
        CHECK_MSG(fabs(freq - prob) <= tol, "token %d: frequency %.4f, softmax %.4f (tol %.4f)",
                  i, freq, prob, tol);
    }
    CHECK_EQ(count[7], 0);
    sampler_free(s);
}

/* Temperature 0.5 doubles the logits: the frequencies must follow softmax(2 * l). */
static void temperature_sharpens(void)
{
    enum { N = 4, DRAWS = 20000 };
    float l[N] = {1.0f, 0.5f, 0.0f, -0.5f};
    sampler_params p = plain_params(99);
    p.temperature = 0.5f;
    sampler *s = sampler_new(N, &p, NULL);
    CHECK(s);
    int count[N] = {0};
    for (int i = 0; i < DRAWS; i++)
        count[sampler_sample(s, l, NULL, 0)]++;
    double sum = 0;
    for (int i = 0; i < N; i++)
        sum += exp(2.0 * l[i]);
    for (int i = 0; i < N; i++) {
        double prob = exp(2.0 * l[i]) / sum, freq = (double)count[i] / DRAWS;
        CHECK_NEAR(freq, prob, 5.0 * sqrt(prob * (1 - prob) / DRAWS));
    }
    sampler_free(s);
}

/* Draws many tokens and checks that exactly the tokens in `allowed` ever appear. */
static int draw_set(sampler *s, const float *l, int n, const bool *allowed, int draws)
{
    int seen[64] = {0};
    for (int i = 0; i < draws; i++) {
        int32_t t = sampler_sample(s, l, NULL, 0);
        if (t < 0 || t >= n || !allowed[t])
            return -1 - t;
        seen[t] = 1;
    }
    for (int i = 0; i < n; i++)
        if (allowed[i] && !seen[i])
            return 1000 + i;
    return 0;
}

static void top_k_keeps_the_k_best(void)
{
    enum { N = 10 };
    float l[N] = {0.1f, 0.3f, 0.2f, 0.9f, 0.8f, 0.0f, 0.7f, 0.4f, 0.6f, 0.5f};
    bool allowed[N] = {0};
    allowed[3] = allowed[4] = allowed[6] = true;
    sampler_params p = plain_params(5);
    p.top_k = 3;
    sampler *s = sampler_new(N, &p, NULL);
    CHECK(s);
    CHECK_EQ(draw_set(s, l, N, allowed, 3000), 0);
    sampler_free(s);
}

static void top_p_excludes_tokens_outside_the_nucleus(void)
{
    /* probabilities 0.5, 0.25, 0.125, 0.0625, 0.0625 (ids shuffled): the nucleus for
     * 0.8 is the three best (0.875 >= 0.8), and for 0.5 only the best */
    enum { N = 5 };
    float l[N] = {logf(0.125f), logf(0.0625f), logf(0.5f), logf(0.0625f), logf(0.25f)};
    bool allowed[N] = {false, false, true, false, true};
    sampler_params p = plain_params(11);
    p.top_p = 0.8f;
    sampler *s = sampler_new(N, &p, NULL);
    CHECK(s);
    allowed[0] = true;
    CHECK_EQ(draw_set(s, l, N, allowed, 5000), 0);
    sampler_free(s);

    p.top_p = 0.5f;
    s = sampler_new(N, &p, NULL);
    CHECK(s);
    bool only_best[N] = {false, false, true, false, false};
    CHECK_EQ(draw_set(s, l, N, only_best, 500), 0);
    sampler_free(s);
}

static void min_p_excludes_unlikely_tokens(void)
{
    /* relative to the best (p = 0.4): 0.3 and 0.2 pass min_p 0.3, 0.1 does not */
    enum { N = 4 };
    float l[N] = {logf(0.1f), logf(0.4f), logf(0.2f), logf(0.3f)};
    bool allowed[N] = {false, true, true, true};
    sampler_params p = plain_params(13);
    p.min_p = 0.3f;
    sampler *s = sampler_new(N, &p, NULL);
    CHECK(s);
    CHECK_EQ(draw_set(s, l, N, allowed, 5000), 0);
    sampler_free(s);
}

/* top-k on a large vocabulary agrees with a brute-force selection, including the
 * tie-break (lower id first) when more than k tokens share the best logit. */
static void top_k_large_vocab_matches_brute_force(void)
{
    enum { N = 32000, K = 40 };
    static float l[N];
    fill_logits(l, N, 77, 8.0f);
    for (int i = 1; i < N; i += 97)
        l[i] = 9.0f; /* 330 exact ties above everything else */
    l[5] = NAN;
    sampler_params p = plain_params(21);
    p.top_k = K;
    /* the K best under (logit desc, id asc) */
    static bool in_top[N];
    memset(in_top, 0, sizeof in_top);
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int i = 0; i < N; i++)
            if (!in_top[i] && !isnan(l[i]) && (best < 0 || l[i] > l[best]))
                best = i;
        in_top[best] = true;
    }
    sampler *s = sampler_new(N, &p, NULL);
    CHECK(s);
    static int count[N];
    memset(count, 0, sizeof count);
    for (int i = 0; i < 1000; i++) {
        int32_t t = sampler_sample(s, l, NULL, 0);
        CHECK_MSG(t >= 0 && in_top[t], "draw %d gave token %d outside the top %d", i, t, K);
        count[t]++;
    }
    for (int i = 0; i < N; i++)
        CHECK_MSG(!in_top[i] || count[i] > 0, "token %d of the top %d never drawn", i, K);
    sampler_free(s);
}

static const float *g_logits; /* for by_logit_desc */

static int by_logit_desc(const void *a, const void *b)
{
    int i = *(const int *)a, j = *(const int *)b;
    if (g_logits[i] != g_logits[j])
        return g_logits[i] > g_logits[j] ? -1 : 1;
    return i - j;
}

/* top-p without top-k on a vocabulary far larger than the nucleus (about 430 of 5000
 * tokens hold half the mass): draws stay inside a brute-force nucleus. */
static void top_p_large_vocab_matches_brute_force(void)
{
    enum { N = 5000 };
    static float l[N];
    static int order[N];
    static bool in_nucleus[N];
    fill_logits(l, N, 31, 4.0f);
    for (int i = 0; i < N; i++)
        order[i] = i;
    g_logits = l;
    qsort(order, N, sizeof order[0], by_logit_desc);
    double total = 0, cum = 0;
    for (int i = 0; i < N; i++)
        total += exp(l[i]);
    memset(in_nucleus, 0, sizeof in_nucleus);
    int size = 0;
    while (cum < 0.5 * total) {
        cum += exp(l[order[size]]);
        in_nucleus[order[size++]] = true;
    }
    CHECK(size > 256 && size < 1024);
    sampler_params p = plain_params(17);
    p.top_p = 0.5f;
    sampler *s = sampler_new(N, &p, NULL);
    CHECK(s);
    int distinct = 0;
    static bool seen[N];
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < 2000; i++) {
        int32_t t = sampler_sample(s, l, NULL, 0);
        CHECK_MSG(t >= 0 && in_nucleus[t], "draw %d gave token %d outside the nucleus", i, t);
        distinct += !seen[t];
        seen[t] = true;
    }
    CHECK_MSG(distinct > size * 3 / 4, "only %d of %d nucleus tokens drawn", distinct, size);
    sampler_free(s);
}

static void repetition_penalty_changes_argmax(void)
{
    enum { N = 5 };
    float l[N] = {1.0f, 3.0f, 2.5f, -1.0f, 0.0f};
    int32_t hist[] = {1, 3, 1, 1};
    sampler_params p = plain_params(1);
    p.temperature = 0.0f;
    p.repeat_penalty = 1.5f;
    sampler *s = sampler_new(N, &p, NULL);
    CHECK(s);
    /* 3.0 / 1.5 = 2.0 < 2.5, once however often token 1 repeats */
    CHECK_EQ(sampler_sample(s, l, hist, 4), 2);
    sampler_free(s);

    /* negative logits are multiplied: token 3 at -1 falls below token 4 at -1.2 */
    float neg[N] = {-5.0f, -5.0f, -5.0f, -1.0f, -1.2f};
    p.repeat_penalty = 1.5f;
    s = sampler_new(N, &p, NULL);
    CHECK(s);
    CHECK_EQ(sampler_sample(s, neg, NULL, 0), 3);
    int32_t h3[] = {3};
    CHECK_EQ(sampler_sample(s, neg, h3, 1), 4);
    sampler_free(s);

    /* only the last repeat_last_n tokens count */
    p.repeat_last_n = 1;
    s = sampler_new(N, &p, NULL);
    CHECK(s);
    int32_t old1[] = {1, 0};
    CHECK_EQ(sampler_sample(s, l, old1, 2), 1);
    int32_t bad[] = {-7, 1000};
    CHECK_EQ(sampler_sample(s, l, bad, 2), 1);
    sampler_free(s);
}

/* OpenAI's penalties after the repetition penalty, as llama.cpp applies them: logit / rep
 * - count * frequency - presence, over the same window, each distinct token once. */
static void frequency_and_presence_penalties(void)
{
    enum { N = 5 };
    float l[N] = {1.0f, 3.0f, 2.5f, -1.0f, 0.0f};
    int32_t hist[] = {1, 3, 1, 1}; /* token 1 three times */
    struct {
        float rep, freq, pres;
        int32_t want;
    } cases[] = {
        {1.0f, 0.1f, 0.0f, 1},  /* 3.0 - 3 x 0.1 = 2.7 > 2.5 */
        {1.0f, 0.2f, 0.0f, 2},  /* 3.0 - 3 x 0.2 = 2.4: the count multiplies */
        {1.0f, 0.0f, 0.4f, 1},  /* 3.0 - 0.4 = 2.6: presence counts once */
        {1.0f, 0.0f, 0.6f, 2},  /* 2.4 */
        {1.2f, 0.0f, 0.0f, 1},  /* 3.0 / 1.2 = 2.5 ties token 2: the lower id */
        {1.2f, 0.01f, 0.0f, 2}, /* 2.5 - 0.03: subtracted after the division */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        sampler_params p = plain_params(1);
        p.temperature = 0.0f;
        p.repeat_penalty = cases[i].rep;
        p.frequency_penalty = cases[i].freq;
        p.presence_penalty = cases[i].pres;
        sampler *s = sampler_new(N, &p, NULL);
        CHECK(s);
        CHECK_MSG(sampler_sample(s, l, hist, 4) == cases[i].want, "case %zu", i);
        /* the counts are gone by the next call */
        CHECK_EQ(sampler_sample(s, l, NULL, 0), 1);
        CHECK_MSG(sampler_sample(s, l, hist, 4) == cases[i].want, "case %zu again", i);
        sampler_free(s);
    }
    /* a negative frequency penalty favours what was said */
    float two[2] = {2.0f, 1.9f};
    int32_t ones[] = {1, 1};
    sampler_params p = plain_params(1);
    p.temperature = 0.0f;
    p.frequency_penalty = -0.1f;
    sampler *s = sampler_new(2, &p, NULL);
    CHECK(s);
    CHECK_EQ(sampler_sample(s, two, ones, 2), 1);
    /* outside the window nothing is counted */
    sampler_free(s);
    p.repeat_last_n = 1;
    p.frequency_penalty = 2.0f;
    s = sampler_new(N, &p, NULL);
    CHECK(s);
    int32_t old[] = {1, 1, 1, 0};
    CHECK_EQ(sampler_sample(s, l, old, 4), 1);
    sampler_free(s);
}

/* Logit biases come first (before the penalties), the sampler keeps its own copy, and
 * one token's biases add up; -infinity bans a token. */
static void logit_biases(void)
{
    enum { N = 5 };
    float l[N] = {1.0f, 3.0f, 2.5f, -1.0f, 0.0f};
    sampler_bias b[2] = {{1, -0.6f}, {4, 0.0f}};
    sampler_params p = plain_params(1);
    p.temperature = 0.0f;
    p.bias = b;
    p.n_bias = 2;
    sampler *s = sampler_new(N, &p, NULL);
    CHECK(s);
    b[0].bias = 0.0f; /* the sampler's copy is not the caller's array */
    CHECK_EQ(sampler_sample(s, l, NULL, 0), 2); /* 3.0 - 0.6 < 2.5 */
    sampler_free(s);
    float close[N] = {2.45f, 3.0f, 2.3f, -1.0f, 0.0f};
    b[0].bias = -0.4f;
    p.n_bias = 1;
    s = sampler_new(N, &p, NULL);
    CHECK(s);
    CHECK_EQ(sampler_sample(s, close, NULL, 0), 1); /* 2.6 > 2.45 */
    sampler_free(s);
    b[1] = (sampler_bias){1, -0.2f}; /* token 1 twice: -0.6 in all */
    p.n_bias = 2;
    s = sampler_new(N, &p, NULL);
    CHECK(s);
    CHECK_EQ(sampler_sample(s, close, NULL, 0), 0); /* 2.4 < 2.45 */
    sampler_free(s);
    b[0] = (sampler_bias){2, -INFINITY};
    b[1] = (sampler_bias){1, -INFINITY};
    s = sampler_new(N, &p, NULL);
    CHECK(s);
    CHECK_EQ(sampler_sample(s, l, NULL, 0), 0);
    p.temperature = 1.0f;
    sampler_free(s);
    s = sampler_new(N, &p, NULL);
    CHECK(s);
    for (int i = 0; i < 200; i++) {
        int32_t t = sampler_sample(s, l, NULL, 0);
        CHECK_MSG(t != 1 && t != 2, "banned token %d drawn", t);
    }
    sampler_free(s);
    char err[ERR_MAX];
    b[0] = (sampler_bias){N, 1.0f};
    CHECK(sampler_new(N, &p, err) == NULL);
    CHECK_MSG(strstr(err, "vocabulary"), "%s", err);
    b[0] = (sampler_bias){0, NAN};
    CHECK(sampler_new(N, &p, err) == NULL);
    CHECK_MSG(strstr(err, "logit_bias"), "%s", err);
    p.bias = NULL;
    CHECK(sampler_new(N, &p, err) == NULL);
}

static void invalid_params_are_rejected_with_messages(void)
{
    char err[ERR_MAX];
    sampler_params p = sampler_params_default();
    p.top_k = -1;
    CHECK(sampler_new(100, &p, err) == NULL);
    CHECK_MSG(strstr(err, "top_k"), "%s", err);

    p = sampler_params_default();
    p.top_p = 0.0f;
    CHECK(sampler_new(100, &p, err) == NULL);
    CHECK_MSG(strstr(err, "top_p"), "%s", err);
    p.top_p = 1.5f;
    CHECK(sampler_new(100, &p, err) == NULL);
    CHECK_MSG(strstr(err, "top_p"), "%s", err);

    p = sampler_params_default();
    p.min_p = -0.1f;
    CHECK(sampler_new(100, &p, err) == NULL);
    CHECK_MSG(strstr(err, "min_p"), "%s", err);

    p = sampler_params_default();
    p.repeat_penalty = 0.0f;
    CHECK(sampler_new(100, &p, err) == NULL);
    CHECK_MSG(strstr(err, "repeat_penalty"), "%s", err);

    const float bad_penalties[] = {2.5f, -2.01f, NAN, INFINITY};
    for (size_t i = 0; i < sizeof bad_penalties / sizeof *bad_penalties; i++) {
        p = sampler_params_default();
        p.frequency_penalty = bad_penalties[i];
        CHECK(sampler_new(100, &p, err) == NULL);
        CHECK_MSG(strstr(err, "frequency_penalty"), "%s", err);
        p = sampler_params_default();
        p.presence_penalty = bad_penalties[i];
        CHECK(sampler_new(100, &p, err) == NULL);
        CHECK_MSG(strstr(err, "presence_penalty"), "%s", err);
    }

    p = sampler_params_default();
    p.repeat_last_n = -2;
    CHECK(sampler_new(100, &p, err) == NULL);
    CHECK_MSG(strstr(err, "repeat_last_n"), "%s", err);

    p = sampler_params_default();
    p.temperature = NAN;
    CHECK(sampler_new(100, &p, err) == NULL);
    CHECK_MSG(strstr(err, "temperature"), "%s", err);

    p = sampler_params_default();
    CHECK(sampler_new(0, &p, err) == NULL);
    CHECK_MSG(strstr(err, "n_vocab"), "%s", err);

    sampler *s = sampler_new(4, &p, err);
    CHECK(s);
    float l[4] = {0};
    CHECK_EQ(sampler_sample(s, NULL, NULL, 0), -1);
    CHECK_EQ(sampler_sample(s, l, NULL, 3), -1);
    CHECK_EQ(sampler_sample(s, l, NULL, -1), -1);
    sampler_free(s);
}

static void all_negative_infinity_still_gives_a_token(void)
{
    float l[3] = {-INFINITY, -INFINITY, -INFINITY};
    sampler_params p = sampler_params_default();
    p.seed = 3;
    sampler *s = sampler_new(3, &p, NULL);
    CHECK(s);
    int32_t t = sampler_sample(s, l, NULL, 0);
    CHECK(t >= 0 && t < 3);
    sampler_free(s);
}

/* ---- constrained sampling ---- */

/* A constraint allowing the ids whose bit is set, counting the questions asked. */
typedef struct allow_set {
    uint64_t bits[2]; /* (128 bits) */
    int asked;
} allow_set;

static bool set_allows(const void *ctx, int32_t token)
{
    allow_set *a = (allow_set *)ctx;
    a->asked++;
    return token >= 0 && token < 128 && ((a->bits[token >> 6] >> (token & 63)) & 1);
}

static void allow(allow_set *a, int32_t token)
{
    a->bits[token >> 6] |= 1ull << (token & 63);
}

static void greedy_takes_the_best_allowed_token(void)
{
    enum { N = 100 };
    float l[N];
    fill_logits(l, N, 4242u, 5.0f);
    sampler_params p = plain_params(3);
    p.temperature = 0.0f;
    sampler *s = sampler_new(N, &p, NULL);
    CHECK(s);
    int32_t best = sampler_sample(s, l, NULL, 0);
    allow_set a = {{0}, 0};
    allow(&a, best);
    allow(&a, 7);
    sampler_constraint con = {set_allows, &a};
    CHECK_EQ(sampler_sample_allowed(s, l, NULL, 0, &con), best);
    CHECK_EQ(a.asked, 1); /* the argmax was allowed: one question */
    a = (allow_set){{0}, 0};
    int32_t want = -1;
    for (int32_t i = 0; i < N; i += 3)
        if (i != best) {
            allow(&a, i);
            if (want < 0 || l[i] > l[want])
                want = i;
        }
    CHECK_EQ(sampler_sample_allowed(s, l, NULL, 0, &con), want);
    /* nothing allowed: no token */
    a = (allow_set){{0}, 0};
    CHECK_EQ(sampler_sample_allowed(s, l, NULL, 0, &con), -1);
    sampler_free(s);
}

/* Draws with con from s and checks the frequencies against prob[] (zero: never). */
static void check_frequencies(sampler *s, const float *l, int n, const sampler_constraint *con,
                              const double *prob, int draws, const char *what)
{
    int count[16] = {0};
    for (int i = 0; i < draws; i++) {
        int32_t t = sampler_sample_allowed(s, l, NULL, 0, con);
        CHECK_MSG(t >= 0 && t < n, "%s: token %d", what, t);
        count[t]++;
    }
    for (int i = 0; i < n; i++) {
        double freq = (double)count[i] / draws;
        double tol = 5.0 * sqrt(prob[i] * (1 - prob[i]) / draws) + 1e-9;
        CHECK_MSG(fabs(freq - prob[i]) <= tol, "%s: token %d: frequency %.4f, want %.4f", what,
                  i, freq, prob[i]);
    }
}

/* The draw is the truncated distribution conditioned on the allowed set, though most
 * first draws are rejected here; with no allowed token in the truncation, the
 * truncation is made over the allowed tokens alone. */
static void sampling_is_conditioned_on_the_allowed_tokens(void)
{
    enum { N = 8, DRAWS = 40000 };
    float l[N] = {1.0f, 2.0f, 0.5f, -1.0f, 3.0f, 0.0f, 2.5f, 1.5f};
    sampler_params p = plain_params(99);
    sampler *s = sampler_new(N, &p, NULL);
    CHECK(s);
    allow_set a = {{0}, 0};
    allow(&a, 0);
    allow(&a, 2);
    allow(&a, 5);
    sampler_constraint con = {set_allows, &a};
    double prob[N] = {0}, sum = exp(1.0) + exp(0.5) + exp(0.0);
    prob[0] = exp(1.0) / sum, prob[2] = exp(0.5) / sum, prob[5] = exp(0.0) / sum;
    check_frequencies(s, l, N, &con, prob, DRAWS, "no truncation");
    sampler_free(s);

    /* top-k 4 keeps 4, 6, 1, 7: of them 1 and 7 are allowed */
    p.top_k = 4;
    CHECK((s = sampler_new(N, &p, NULL)));
    a = (allow_set){{0}, 0};
    allow(&a, 1);
    allow(&a, 7);
    allow(&a, 0);
    memset(prob, 0, sizeof prob);
    sum = exp(2.0) + exp(1.5);
    prob[1] = exp(2.0) / sum, prob[7] = exp(1.5) / sum;
    check_frequencies(s, l, N, &con, prob, DRAWS, "top-k");

    sampler_free(s);
    /* top-k 3 keeps 4, 6, 1, none allowed: top-k 3 of the allowed 0, 2, 3, 5 is 0, 2, 5 */
    p.top_k = 3;
    CHECK((s = sampler_new(N, &p, NULL)));
    a = (allow_set){{0}, 0};
    allow(&a, 0);
    allow(&a, 2);
    allow(&a, 3);
    allow(&a, 5);
    memset(prob, 0, sizeof prob);
    sum = exp(1.0) + exp(0.5) + exp(0.0);
    prob[0] = exp(1.0) / sum, prob[2] = exp(0.5) / sum, prob[5] = exp(0.0) / sum;
    check_frequencies(s, l, N, &con, prob, DRAWS, "top-k over the allowed");
    sampler_free(s);
}

/* A seeded constrained sampler repeats itself (here most first draws fall outside the
 * allowed ids, and top-k keeps none of them: the slow path), and an allowed first draw
 * costs one question however large the vocabulary. */
static void constrained_is_reproducible_and_cheap_when_allowed(void)
{
    enum { N = 50000 };
    static float l[N];
    fill_logits(l, N, 77u, 8.0f);
    sampler_params p = sampler_params_default();
    p.seed = 5;
    sampler *s1 = sampler_new(N, &p, NULL), *s2 = sampler_new(N, &p, NULL);
    CHECK(s1 && s2);
    allow_set a = {{~0ull, ~0ull}, 0};
    sampler_constraint con = {set_allows, &a};
    int32_t t1[20], t2[20];
    for (int i = 0; i < 20; i++) {
        t1[i] = sampler_sample_allowed(s1, l, NULL, 0, &con);
        t2[i] = sampler_sample_allowed(s2, l, NULL, 0, &con);
        CHECK_EQ(t1[i], t2[i]);
        CHECK(t1[i] >= 0 && t1[i] < 128);
    }
    sampler_free(s1);
    sampler_free(s2);
    sampler *s = sampler_new(N, &p, NULL);
    CHECK(s);
    allow_set all = {{~0ull, ~0ull}, 0};
    sampler_constraint any = {set_allows, &all};
    /* the logits of 0..127 raised far above the rest: the first draw is always allowed */
    for (int32_t i = 0; i < 128; i++)
        l[i] += 100.0f;
    for (int i = 0; i < 10; i++)
        CHECK(sampler_sample_allowed(s, l, NULL, 0, &any) < 128);
    CHECK_EQ(all.asked, 10);
    sampler_free(s);
}

/* ---- the chain with every newer step off ---- */

/* FNV-1a over the tokens of a run. */
static uint64_t hash_tokens(uint64_t h, int32_t t)
{
    for (int i = 0; i < 4; i++) {
        h ^= (uint64_t)((uint32_t)t >> (8 * i) & 0xff);
        h *= 0x100000001b3ull;
    }
    return h;
}

/* A constraint allowing the ids divisible by 3 or 7. */
static bool sparse_allows(const void *ctx, int32_t token)
{
    (void)ctx;
    return token % 3 == 0 || token % 7 == 0;
}

/* 300 steps of s over pseudo-random logits (each step's own) and a history that grows
 * by the drawn tokens, hashed; constrained with sparse_allows when con. */
static uint64_t run_hash(sampler *s, int n, bool con)
{
    static float l[32000];
    static int32_t hist[400];
    int n_hist = 0;
    uint64_t h = 0xcbf29ce484222325ull;
    sampler_constraint c = {sparse_allows, NULL};
    for (int step = 0; step < 300; step++) {
        fill_logits(l, n, 1000u + (uint32_t)step, 6.0f);
        int32_t t = con ? sampler_sample_allowed(s, l, hist, n_hist, &c)
                        : sampler_sample(s, l, hist, n_hist);
        h = hash_tokens(h, t);
        hist[n_hist++] = t < 0 ? 0 : t;
    }
    return h;
}

/* With the newer steps (typical, XTC, DRY, Mirostat, dynamic temperature, top-n-sigma,
 * min_keep, an order of one's own) at their off values, every draw is the one the chain
 * made before they were added: these hashes were taken from that chain, for defaults,
 * greedy with penalties, top-p alone (a vocabulary of 32000: the growing selections),
 * top-k with min-p and biases, and constrained draws. */
static void all_off_is_the_chain_as_before(void)
{
    sampler_bias b[3] = {{5, 2.5f}, {17, -INFINITY}, {2999, 1.0f}};
    struct {
        const char *name;
        int n;
        bool con;
        uint64_t want;
    } cases[] = {
        {"defaults", 3000, false, 0xc034c97ce1132429ull},
        {"greedy and penalties", 3000, false, 0x0bb1cc6f97f7bd0dull},
        {"top-p alone", 32000, false, 0x35f08fe72933fb1eull},
        {"top-k, min-p, biases", 3000, false, 0xed2e1e7564907f97ull},
        {"constrained defaults", 3000, true, 0xd298d9f423e32b5eull},
        {"constrained greedy", 3000, true, 0xbbe78da29515b423ull},
    };
    uint64_t got[sizeof cases / sizeof *cases];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        sampler_params p = sampler_params_default();
        p.seed = 77 + i;
        if (i == 1 || i == 5) {
            p.temperature = 0.0f;
            p.repeat_penalty = 1.3f;
            p.frequency_penalty = 0.5f;
            p.presence_penalty = 0.2f;
            p.repeat_last_n = 32;
        } else if (i == 2) {
            p.temperature = 1.2f;
            p.top_k = 0;
            p.top_p = 0.9f;
            p.min_p = 0.0f;
        } else if (i == 3) {
            p.temperature = 0.7f;
            p.top_k = 100;
            p.min_p = 0.1f;
            p.bias = b;
            p.n_bias = 3;
        }
        char err[ERR_MAX];
        sampler *s = sampler_new(cases[i].n, &p, err);
        CHECK_MSG(s, "%s", err);
        got[i] = run_hash(s, cases[i].n, cases[i].con);
        sampler_free(s);
    }
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        CHECK_MSG(got[i] == cases[i].want, "%s: hash 0x%016llx", cases[i].name,
                  (unsigned long long)got[i]);
}

/* ---- stop strings ---- */

/* Feeds pieces through the matcher and collects the emitted text (NUL-terminated). */
static int feed_all(stop_matcher *m, const char *const *pieces, int n, char *text, bool flush)
{
    size_t used = 0;
    char out[256];
    for (int i = 0; i < n; i++) {
        long k = stop_feed(m, pieces[i], strlen(pieces[i]), out, sizeof out);
        if (k < 0)
            return -1;
        memcpy(text + used, out, (size_t)k);
        used += (size_t)k;
    }
    if (flush)
        used += stop_flush(m, text + used);
    text[used] = '\0';
    return (int)used;
}

static void stop_string_split_across_pieces(void)
{
    stop_matcher m;
    const char *stops[] = {"<|im_end|>"};
    char err[ERR_MAX];
    CHECK_MSG(stop_init(&m, stops, 1, err) == 0, "%s", err);
    char out[64];
    CHECK_EQ(stop_feed(&m, "Hello", 5, out, sizeof out), 5);
    CHECK_EQ(stop_feed(&m, " world<|im", 10, out, sizeof out), 6);
    CHECK(memcmp(out, " world", 6) == 0);
    CHECK_EQ(stop_hit(&m), -1);
    CHECK_EQ(stop_feed(&m, "_e", 2, out, sizeof out), 0);
    CHECK_EQ(stop_feed(&m, "nd|>tail", 8, out, sizeof out), 0);
    CHECK_EQ(stop_hit(&m), 0);
    CHECK_EQ(stop_feed(&m, "more", 4, out, sizeof out), 0);
    CHECK_EQ(stop_flush(&m, out), 0);
}

static void false_prefix_is_released(void)
{
    stop_matcher m;
    const char *stops[] = {"STOP"};
    CHECK(stop_init(&m, stops, 1, NULL) == 0);
    char text[128];
    const char *pieces[] = {"a ST", "O", "P", "x"}; /* ends up complete */
    CHECK_EQ(feed_all(&m, pieces, 4, text, true), 2);
    CHECK(strcmp(text, "a ") == 0);

    stop_reset(&m);
    const char *near[] = {"a ST", "O", "p!", " SS", "TO"};
    CHECK_EQ(feed_all(&m, near, 5, text, false), 9);
    CHECK_MSG(strcmp(text, "a STOp! S") == 0, "got '%s'", text);
    char out[STOP_MAX_LEN];
    CHECK_EQ(stop_flush(&m, out), 3);
    CHECK(memcmp(out, "STO", 3) == 0);
}

static void held_tail_is_flushed_at_the_end(void)
{
    stop_matcher m;
    const char *stops[] = {"\nUser:"};
    CHECK(stop_init(&m, stops, 1, NULL) == 0);
    char text[128];
    const char *pieces[] = {"answer", "\n", "Us"};
    CHECK_EQ(feed_all(&m, pieces, 3, text, false), 6);
    CHECK(strcmp(text, "answer") == 0);
    char out[STOP_MAX_LEN];
    CHECK_EQ(stop_flush(&m, out), 3);
    CHECK(memcmp(out, "\nUs", 3) == 0);
}

static void split_utf8_character_is_held_until_complete(void)
{
    stop_matcher m;
    CHECK(stop_init(&m, NULL, 0, NULL) == 0);
    char out[64];
    /* "é" is C3 A9, "€" is E2 82 AC: pieces cut them between their bytes. */
    CHECK_EQ(stop_feed(&m, "caf\xc3", 4, out, sizeof out), 3);
    CHECK(memcmp(out, "caf", 3) == 0);
    CHECK_EQ(stop_feed(&m, "\xa9 \xe2", 3, out, sizeof out), 3);
    CHECK(memcmp(out, "\xc3\xa9 ", 3) == 0);
    CHECK_EQ(stop_feed(&m, "\x82", 1, out, sizeof out), 0);
    CHECK_EQ(stop_feed(&m, "\xac!", 2, out, sizeof out), 4);
    CHECK(memcmp(out, "\xe2\x82\xac!", 4) == 0);
    /* At the end an incomplete character is released as it is. */
    CHECK_EQ(stop_feed(&m, "\xf0\x9f", 2, out, sizeof out), 0);
    CHECK_EQ(stop_flush(&m, out), 2);
}

static void multiple_stop_strings_earliest_wins(void)
{
    stop_matcher m;
    const char *stops[] = {"</s>", "###", "\n\n\n"};
    CHECK(stop_init(&m, stops, 3, NULL) == 0);
    char text[128];
    const char *pieces[] = {"one #", "# two ##", "# three </s>"};
    CHECK(feed_all(&m, pieces, 3, text, true) >= 0);
    CHECK_MSG(strcmp(text, "one ## two ") == 0, "got '%s'", text);
    CHECK_EQ(stop_hit(&m), 1);
    /* the one that matched, as text */
    char hit[STOP_MAX_LEN + 1];
    CHECK_EQ(stop_hit_text(&m, hit), 3);
    CHECK(strcmp(hit, "###") == 0);

    /* two candidates in one piece: the one that starts first ends the text */
    stop_reset(&m);
    const char *one[] = {"x</s>###"};
    CHECK(feed_all(&m, one, 1, text, true) >= 0);
    CHECK(strcmp(text, "x") == 0);
    CHECK_EQ(stop_hit(&m), 0);

    /* overlapping prefixes: "\n\n" is held, then released when a letter follows */
    stop_reset(&m);
    const char *nl[] = {"a\n", "\n", "b", "\n\n\nc"};
    CHECK(feed_all(&m, nl, 4, text, true) >= 0);
    CHECK_MSG(strcmp(text, "a\n\nb") == 0, "got '%s'", text);
    CHECK_EQ(stop_hit(&m), 2);

    /* the held tail moves from one stop string's prefix to another's: "ab" (of "abX")
     * becomes "bc" (of "bcY") when "c" arrives, releasing only "a" */
    const char *ab[] = {"abX", "bcY"};
    CHECK(stop_init(&m, ab, 2, NULL) == 0);
    const char *abc[] = {"ab", "c", "Y"};
    CHECK(feed_all(&m, abc, 3, text, true) >= 0);
    CHECK_MSG(strcmp(text, "a") == 0, "got '%s'", text);
    CHECK_EQ(stop_hit(&m), 1);
    CHECK_EQ(stop_hit_text(&m, hit), 3);
    CHECK(strcmp(hit, "bcY") == 0);
    /* none matched: "" */
    stop_reset(&m);
    CHECK(feed_all(&m, abc, 1, text, true) >= 0);
    CHECK_EQ(stop_hit_text(&m, hit), 0);
    CHECK(hit[0] == '\0');
}

static void stop_init_rejects_bad_strings(void)
{
    stop_matcher m;
    char err[ERR_MAX];
    const char *empty[] = {"ok", ""};
    CHECK(stop_init(&m, empty, 2, err) < 0);
    CHECK_MSG(strstr(err, "empty"), "%s", err);
    char longs[STOP_MAX_LEN + 2];
    memset(longs, 'a', sizeof longs - 1);
    longs[sizeof longs - 1] = '\0';
    const char *too_long[] = {longs};
    CHECK(stop_init(&m, too_long, 1, err) < 0);
    CHECK_MSG(strstr(err, "bytes"), "%s", err);
    const char *many[STOP_MAX + 1];
    for (int i = 0; i <= STOP_MAX; i++)
        many[i] = "x";
    CHECK(stop_init(&m, many, STOP_MAX + 1, err) < 0);
    /* no stop strings: everything passes straight through */
    CHECK(stop_init(&m, NULL, 0, err) == 0);
    char out[16];
    CHECK_EQ(stop_feed(&m, "abc", 3, out, sizeof out), 3);
    /* a too-small output buffer is refused without losing state */
    const char *s1[] = {"zz"};
    CHECK(stop_init(&m, s1, 1, err) == 0);
    CHECK_EQ(stop_feed(&m, "az", 2, out, sizeof out), 1);
    CHECK_EQ(stop_feed(&m, "bcdef", 5, out, 3), -1);
    CHECK_EQ(stop_feed(&m, "bcdef", 5, out, sizeof out), 6);
    CHECK(memcmp(out, "zbcdef", 6) == 0);
}

int main(void)
{
    RUN(defaults_match_llama_cpp);
    RUN(greedy_picks_argmax_lowest_id_on_ties);
    RUN(top_k_1_equals_greedy);
    RUN(same_seed_same_sequence_different_seed_differs);
    RUN(random_seed_is_reported_and_reproducible);
    RUN(frequencies_match_softmax);
    RUN(temperature_sharpens);
    RUN(top_k_keeps_the_k_best);
    RUN(top_p_excludes_tokens_outside_the_nucleus);
    RUN(min_p_excludes_unlikely_tokens);
    RUN(top_k_large_vocab_matches_brute_force);
    RUN(top_p_large_vocab_matches_brute_force);
    RUN(repetition_penalty_changes_argmax);
    RUN(frequency_and_presence_penalties);
    RUN(logit_biases);
    RUN(invalid_params_are_rejected_with_messages);
    RUN(all_negative_infinity_still_gives_a_token);
    RUN(greedy_takes_the_best_allowed_token);
    RUN(sampling_is_conditioned_on_the_allowed_tokens);
    RUN(constrained_is_reproducible_and_cheap_when_allowed);
    RUN(all_off_is_the_chain_as_before);
    RUN(stop_string_split_across_pieces);
    RUN(false_prefix_is_released);
    RUN(held_tail_is_flushed_at_the_end);
    RUN(split_utf8_character_is_held_until_complete);
    RUN(multiple_stop_strings_earliest_wins);
    RUN(stop_init_rejects_bad_strings);
    return test_finish();
}
