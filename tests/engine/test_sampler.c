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
    /* the newer steps off, their numbers llama.cpp's (common/common.h) */
    CHECK_NEAR(p.typical_p, 1.0, 0);
    CHECK_EQ(p.min_keep, 0);
    CHECK(p.top_n_sigma <= 0);
    CHECK_NEAR(p.xtc_probability, 0, 0);
    CHECK_NEAR(p.xtc_threshold, 0.1, 1e-6);
    CHECK_NEAR(p.dynatemp_range, 0, 0);
    CHECK_NEAR(p.dynatemp_exponent, 1, 0);
    CHECK_NEAR(p.dry_multiplier, 0, 0);
    CHECK_NEAR(p.dry_base, 1.75, 0);
    CHECK_EQ(p.dry_allowed_length, 2);
    CHECK_EQ(p.dry_penalty_last_n, -1);
    CHECK_EQ(p.mirostat, 0);
    CHECK_NEAR(p.mirostat_tau, 5, 0);
    CHECK_NEAR(p.mirostat_eta, 0.1, 1e-6);
    CHECK_EQ(p.n_order, 0);
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
    int count[64] = {0};
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

/* ---- llama.cpp's other samplers, against references written here ---- */

/* Softmax of l[0..n) at temperature t, in double. */
static void softmax_ref(const float *l, int n, double t, double *p)
{
    double max = -INFINITY, sum = 0;
    for (int i = 0; i < n; i++)
        if (l[i] > max)
            max = l[i];
    for (int i = 0; i < n; i++)
        sum += p[i] = l[i] == -INFINITY ? 0.0 : exp((l[i] - max) / t);
    for (int i = 0; i < n; i++)
        p[i] /= sum;
}

/* Draws many tokens from s and checks their frequencies against prob[] (zero: never),
 * within 5 standard deviations; the draws need no history. */
static void expect_frequencies(sampler *s, const float *l, int n, const double *prob, int draws,
                               const char *what)
{
    static int count[256];
    memset(count, 0, sizeof count);
    for (int i = 0; i < draws; i++) {
        int32_t t = sampler_sample(s, l, NULL, 0);
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

/* The locally typical set, as the paper (and llama.cpp) defines it: tokens by |surprise
 * - entropy| ascending (ties: the lower id), until their mass passes q, at least
 * min_keep; in[] marks it. */
static void typical_ref(const double *p, int n, double q, int min_keep, bool *in)
{
    double h = 0, score[64];
    int order[64];
    for (int i = 0; i < n; i++)
        if (p[i] > 0)
            h -= p[i] * log(p[i]);
    for (int i = 0; i < n; i++) {
        score[i] = p[i] > 0 ? fabs(-log(p[i]) - h) : INFINITY;
        order[i] = i;
    }
    for (int i = 1; i < n; i++) /* insertion sort: stable, so ties stay by id */
        for (int j = i; j > 0 && score[order[j]] < score[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    double cum = 0;
    for (int i = 0; i < n; i++)
        in[i] = false;
    for (int i = 0; i < n; i++) {
        in[order[i]] = true;
        cum += p[order[i]];
        if (cum > q && i + 1 >= min_keep)
            break;
    }
}

static void typical_keeps_the_locally_typical_set(void)
{
    enum { N = 24 };
    float l[N];
    double p[N], want[N];
    bool in[N];
    /* one likely token and a tail of near-equals: the tail is the typical part */
    l[0] = 2.2f;
    for (int i = 1; i < N; i++)
        l[i] = -0.02f * (float)i;
    const struct {
        float q;
        int min_keep;
    } cases[] = {{0.5f, 0}, {0.2f, 0}, {0.9f, 0}, {0.05f, 6}, {0.99f, 1}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        softmax_ref(l, N, 1.0, p);
        typical_ref(p, N, cases[c].q, cases[c].min_keep, in);
        double mass = 0;
        for (int i = 0; i < N; i++)
            mass += in[i] ? p[i] : 0;
        for (int i = 0; i < N; i++)
            want[i] = in[i] ? p[i] / mass : 0;
        sampler_params sp = plain_params(31 + c);
        sp.typical_p = cases[c].q;
        sp.min_keep = cases[c].min_keep;
        char err[ERR_MAX];
        sampler *s = sampler_new(N, &sp, err);
        CHECK_MSG(s, "%s", err);
        char what[64];
        snprintf(what, sizeof what, "typical_p %.2f min_keep %d", (double)cases[c].q,
                 cases[c].min_keep);
        expect_frequencies(s, l, N, want, 20000, what);
        sampler_free(s);
    }
    /* greedy takes the most likely typical token, which here is not the most likely */
    softmax_ref(l, N, 1.0, p);
    typical_ref(p, N, 0.5, 0, in);
    CHECK(!in[0]);
    int32_t best = -1;
    for (int i = 0; i < N; i++)
        if (in[i] && (best < 0 || l[i] > l[best]))
            best = i;
    sampler_params sp = plain_params(3);
    sp.temperature = 0.0f;
    sp.typical_p = 0.5f;
    sampler *s = sampler_new(N, &sp, NULL);
    CHECK(s);
    CHECK_EQ(sampler_sample(s, l, NULL, 0), best);
    sampler_free(s);
}

/* XTC as llama.cpp defines it: with probability xtc_probability, every token of
 * probability >= threshold but the least likely of them goes, unless fewer than min_keep
 * would remain or only one is above. */
static void xtc_excludes_the_top_choices(void)
{
    enum { N = 8, DRAWS = 20000 };
    /* probabilities 0.4, 0.25, 0.15, 0.1, 0.05, 0.03, 0.015, 0.005 (ids shuffled) */
    const double pr[N] = {0.15, 0.4, 0.005, 0.1, 0.25, 0.015, 0.05, 0.03};
    float l[N];
    for (int i = 0; i < N; i++)
        l[i] = logf((float)pr[i]);
    const struct {
        float prob, thr;
        int min_keep;
    } cases[] = {
        {1.0f, 0.09f, 0}, {1.0f, 0.2f, 0}, {1.0f, 0.09f, 5}, {1.0f, 0.09f, 6},
        {0.3f, 0.09f, 0}, {1.0f, 0.45f, 0}, {1.0f, 0.0f, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        /* the tokens above the threshold, the least likely of them kept */
        bool removed[N] = {false};
        int above = 0, last = -1;
        for (int i = 0; i < N; i++)
            if (pr[i] >= cases[c].thr) {
                above++;
                if (last < 0 || pr[i] < pr[last])
                    last = i;
            }
        bool applies = above >= 2 && N - (above - 1) >= cases[c].min_keep;
        double kept = 0, want[N];
        for (int i = 0; i < N; i++) {
            removed[i] = applies && pr[i] >= cases[c].thr && i != last;
            kept += removed[i] ? 0 : pr[i];
        }
        for (int i = 0; i < N; i++)
            want[i] = (1 - cases[c].prob) * pr[i] +
                      cases[c].prob * (removed[i] ? 0 : pr[i] / kept);
        sampler_params sp = plain_params(40 + c);
        sp.xtc_probability = cases[c].prob;
        sp.xtc_threshold = cases[c].thr;
        sp.min_keep = cases[c].min_keep;
        sampler *s = sampler_new(N, &sp, NULL);
        CHECK(s);
        char what[64];
        snprintf(what, sizeof what, "xtc %.2f threshold %.2f min_keep %d",
                 (double)cases[c].prob, (double)cases[c].thr, cases[c].min_keep);
        expect_frequencies(s, l, N, want, DRAWS, what);
        sampler_free(s);
    }
    /* a threshold above 0.5 turns it off without drawing: the stream is XTC-less's */
    sampler_params sp = plain_params(9), off = sp;
    sp.xtc_probability = 1.0f;
    sp.xtc_threshold = 0.6f;
    sampler *a = sampler_new(N, &sp, NULL), *b = sampler_new(N, &off, NULL);
    CHECK(a && b);
    for (int i = 0; i < 200; i++)
        CHECK_EQ(sampler_sample(a, l, NULL, 0), sampler_sample(b, l, NULL, 0));
    sampler_free(a);
    sampler_free(b);
}

/* ---- DRY ---- */

#define DRY_N 16
#define DRY_PROBE 15 /* a token no test history holds */

/* The penalty DRY gives token t after hist[0..n), measured through greedy draws: the
 * logit of the probe token (the only other finite one, a higher id) at which t stops
 * winning, found by bisection. */
static double measured_dry(sampler *s, int32_t t, const int32_t *hist, int n)
{
    float l[DRY_N];
    double lo = -200, hi = 200; /* t (logit 0, less its penalty) wins at lo, loses at hi */
    for (int it = 0; it < 80; it++) {
        double mid = (lo + hi) / 2;
        for (int i = 0; i < DRY_N; i++)
            l[i] = -INFINITY;
        l[t] = 0.0f;
        l[DRY_PROBE] = (float)mid;
        if (sampler_sample(s, l, hist, n) == t)
            lo = mid;
        else
            hi = mid;
    }
    return -lo;
}

/* DRY as llama.cpp defines it, by brute force: pen[t] for every token t. */
static void dry_ref(const int32_t *hist, int n_hist, const sampler_params *p, double *pen)
{
    for (int t = 0; t < DRY_N; t++)
        pen[t] = 0;
    int last_n = p->dry_penalty_last_n < 0 || p->dry_penalty_last_n > p->n_ctx
                     ? p->n_ctx : p->dry_penalty_last_n;
    int n = n_hist < last_n ? n_hist : last_n, allowed = p->dry_allowed_length;
    const int32_t *w = hist + n_hist - n;
    if (p->dry_multiplier == 0 || n <= allowed)
        return;
    /* the latest breaker: its head i tokens from the end, its tail after it */
    int limit = n;
    for (int i = 0; i < n && limit == n; i++) {
        int longest = -1;
        for (int b = 0; b < p->n_dry_breakers; b++) {
            const sampler_breaker *br = &p->dry_breakers[b];
            if (br->head != w[n - 1 - i] || br->n_tail > i || br->n_tail <= longest)
                continue;
            bool match = true;
            for (int k = 0; k < br->n_tail; k++)
                match &= br->tail[k] == w[n - i + k];
            if (match)
                longest = br->n_tail;
        }
        if (longest >= 0)
            limit = i - longest;
    }
    if (limit < allowed)
        return;
    int len[DRY_N];
    for (int t = 0; t < DRY_N; t++)
        len[t] = -1;
    /* each earlier place the text's end repeats: the token that followed it */
    for (int e = 0; e + 1 < n; e++) {
        int m = 0;
        while (m <= e && w[e - m] == w[n - 1 - m])
            m++;
        if (m > limit)
            m = limit;
        if (m >= allowed && w[e + 1] >= 0 && w[e + 1] < DRY_N && m > len[w[e + 1]])
            len[w[e + 1]] = m;
    }
    double max_exp = p->dry_base > 1.000001 ? floor(88.7228391 / log(p->dry_base)) : INFINITY;
    for (int t = 0; t < DRY_N; t++) {
        bool alone = false;
        for (int b = 0; b < p->n_dry_breakers; b++)
            alone |= p->dry_breakers[b].head == t && p->dry_breakers[b].n_tail == 0;
        if (len[t] < 0 || alone)
            continue;
        double x = len[t] - allowed;
        pen[t] = p->dry_multiplier * pow(p->dry_base, x < max_exp ? x : max_exp);
    }
}

static sampler_params dry_params(float mult, float base, int allowed, int last_n)
{
    sampler_params p = plain_params(1);
    p.temperature = 0.0f;
    p.dry_multiplier = mult;
    p.dry_base = base;
    p.dry_allowed_length = allowed;
    p.dry_penalty_last_n = last_n;
    p.n_ctx = 64;
    return p;
}

/* Every token's measured penalty after hist against the reference's. */
static void expect_dry(const sampler_params *p, const int32_t *hist, int n, const char *what)
{
    double want[DRY_N];
    dry_ref(hist, n, p, want);
    char err[ERR_MAX];
    sampler *s = sampler_new(DRY_N, p, err);
    CHECK_MSG(s, "%s: %s", what, err);
    for (int32_t t = 0; t < DRY_PROBE; t++) {
        double got = measured_dry(s, t, hist, n);
        CHECK_MSG(fabs(got - want[t]) <= 1e-4 * (1 + want[t]), "%s: token %d: penalty %g, want %g",
                  what, t, got, want[t]);
    }
    sampler_free(s);
}

enum { A, B, C, D, E, X, Y, Z };

static void dry_penalizes_what_would_extend_a_repetition(void)
{
    /* a b c d a b c: d would make "a b c" four tokens again: 0.8 * 1.75^(3 - 2) */
    const int32_t h1[] = {A, B, C, D, A, B, C};
    sampler_params p = dry_params(0.8f, 1.75f, 2, -1);
    double want[DRY_N];
    dry_ref(h1, 7, &p, want);
    CHECK_NEAR(want[D], 0.8 * 1.75, 1e-6);
    CHECK_NEAR(want[A] + want[B] + want[C] + want[E], 0, 0);
    expect_dry(&p, h1, 7, "a b c d a b c");
    /* below the allowed length nothing: "c" alone repeats */
    const int32_t h2[] = {C, D, E, A, C};
    expect_dry(&p, h2, 5, "c d e a c");
    p.dry_allowed_length = 1;
    expect_dry(&p, h2, 5, "c d e a c, allowed 1");
    p.dry_allowed_length = 0;
    expect_dry(&p, h2, 5, "c d e a c, allowed 0");
    /* the longest repeat a token would extend counts, from several earlier places */
    const int32_t h3[] = {A, B, X, C, A, B, Y, B, A, B};
    p = dry_params(1.0f, 2.0f, 1, -1);
    expect_dry(&p, h3, 10, "a b x c a b y b a b");
    /* only the window counts */
    p.dry_penalty_last_n = 4;
    expect_dry(&p, h1, 7, "window 4");
    p.dry_penalty_last_n = 0;
    expect_dry(&p, h1, 7, "window 0: off");
    p = dry_params(1.0f, 1.75f, 2, -1);
    p.n_ctx = 5;
    expect_dry(&p, h1, 7, "n_ctx 5");
}

static void dry_breakers_cut_repetitions(void)
{
    /* a X c d e a X c d: the repeat "a X c d" is cut at X, 2 tokens from the end */
    const int32_t h1[] = {A, X, C, D, E, A, X, C, D};
    sampler_breaker br[3] = {{.head = X}};
    sampler_params p = dry_params(1.0f, 2.0f, 2, -1);
    p.dry_breakers = br;
    p.n_dry_breakers = 1;
    double want[DRY_N];
    dry_ref(h1, 9, &p, want);
    CHECK_NEAR(want[E], 1.0, 1e-9);
    expect_dry(&p, h1, 9, "single-token breaker");
    /* nearer the end than the allowed length: no penalty at all */
    const int32_t h2[] = {A, B, C, D, A, B, X, C};
    p.dry_allowed_length = 2;
    expect_dry(&p, h2, 8, "breaker 1 token from the end");
    /* a single-token breaker is never penalized itself */
    const int32_t h3[] = {A, B, X, C, A, B};
    dry_ref(h3, 6, &p, want);
    CHECK_NEAR(want[X], 0, 0);
    expect_dry(&p, h3, 6, "the breaker would extend the repeat");
    /* a breaker of two tokens, Y then Z: only the pair cuts */
    br[0] = (sampler_breaker){.head = Y, .n_tail = 1, .tail = {Z}};
    const int32_t h4[] = {A, Y, Z, B, C, A, Y, Z, B};
    expect_dry(&p, h4, 9, "two-token breaker");
    const int32_t h5[] = {A, Y, B, C, D, A, Y, B, C};
    expect_dry(&p, h5, 9, "two-token breaker's head alone");
    /* the longest sequence whose head is where the scan stops */
    br[1] = (sampler_breaker){.head = Y, .n_tail = 2, .tail = {Z, B}};
    br[2] = (sampler_breaker){.head = C};
    p.n_dry_breakers = 3;
    expect_dry(&p, h4, 9, "breakers sharing a head");
    /* base 1e10: the exponent is held to llama.cpp's float range (3 here) */
    const int32_t h6[] = {A, B, C, D, E, A, B, C, D, E, A, B, C, D};
    p = dry_params(1e-30f, 1e10f, 0, -1);
    dry_ref(h6, 14, &p, want);
    CHECK_NEAR(want[E], 1.0, 1e-6);
    expect_dry(&p, h6, 14, "exponent held");
}

/* Random histories over a few tokens (repeats everywhere) with random breakers and
 * settings: every token's penalty is the reference's. */
static void dry_matches_the_reference_on_random_histories(void)
{
    uint64_t r = 0x5eed;
    test_random_seed(&r);
    for (int round = 0; round < 60; round++) {
        int32_t hist[48];
        int n = 4 + (int)(test_random(&r) % 44);
        for (int i = 0; i < n; i++)
            hist[i] = (int32_t)(test_random(&r) % 5);
        sampler_breaker br[2];
        int n_br = (int)(test_random(&r) % 3);
        for (int b = 0; b < n_br; b++) {
            br[b] = (sampler_breaker){.head = (int32_t)(test_random(&r) % 5)};
            br[b].n_tail = (int32_t)(test_random(&r) % 3);
            for (int k = 0; k < br[b].n_tail; k++)
                br[b].tail[k] = (int32_t)(test_random(&r) % 5);
        }
        int last_n = (int)(test_random(&r) % 50) - 1;
        sampler_params p = dry_params(0.5f + (float)(test_random(&r) % 4), 1.25f,
                                      (int)(test_random(&r) % 4), last_n ? last_n : -1);
        p.dry_breakers = br;
        p.n_dry_breakers = n_br;
        char what[32];
        snprintf(what, sizeof what, "round %d", round);
        expect_dry(&p, hist, n, what);
    }
}

/* ---- Mirostat ---- */

/* Mirostat v2's truncation (llama.cpp): the tokens of surprise -log2 p <= mu, at least
 * the most likely one; in[] marks them, their mass returned. */
static double mirostat2_ref(const double *p, int n, double mu, bool *in)
{
    double mass = 0;
    int best = 0;
    for (int i = 0; i < n; i++) {
        in[i] = -log2(p[i]) <= mu;
        mass += in[i] ? p[i] : 0;
        if (p[i] > p[best])
            best = i;
    }
    if (mass == 0) {
        in[best] = true;
        mass = p[best];
    }
    return mass;
}

/* Mirostat v1's k (llama.cpp, m = 100): Zipf's exponent estimated over the m likeliest
 * tokens (p sorted descending here), then the k whose expected surprise is mu. */
static int mirostat1_k_ref(const double *p, int n_vocab, int n, double mu)
{
    double num = 0, den = 0;
    for (int i = 0; i < 99 && i < n - 1; i++) {
        double t = log((i + 2.0) / (i + 1.0)), b = log(p[i] / p[i + 1]);
        num += t * b;
        den += t * t;
    }
    double s = num / den, eps = s - 1;
    double k = pow(eps * pow(2, mu) / (1 - pow(n_vocab, -eps)), 1 / s);
    return isnan(k) || k < 1 ? 1 : k > n ? n : (int)k;
}

/* v2 with eta 0 keeps mu at 2 tau: the draws follow the fixed truncation. */
static void mirostat2_truncates_at_mu(void)
{
    enum { N = 20 };
    float l[N];
    double p[N], want[N];
    bool in[N];
    for (int i = 0; i < N; i++)
        l[i] = -0.7f * (float)i; /* surprise grows about one bit per token */
    softmax_ref(l, N, 1.0, p);
    double mass = mirostat2_ref(p, N, 2 * 1.8, in);
    for (int i = 0; i < N; i++)
        want[i] = in[i] ? p[i] / mass : 0;
    sampler_params sp = plain_params(5);
    sp.mirostat = 2;
    sp.mirostat_tau = 1.8f;
    sp.mirostat_eta = 0.0f;
    sampler *s = sampler_new(N, &sp, NULL);
    CHECK(s);
    expect_frequencies(s, l, N, want, 20000, "mirostat 2, eta 0");
    sampler_free(s);
    /* at temperature 2 the truncation sees the tempered distribution */
    softmax_ref(l, N, 2.0, p);
    mass = mirostat2_ref(p, N, 2 * 1.8, in);
    for (int i = 0; i < N; i++)
        want[i] = in[i] ? p[i] / mass : 0;
    sp.temperature = 2.0f;
    CHECK((s = sampler_new(N, &sp, NULL)));
    expect_frequencies(s, l, N, want, 20000, "mirostat 2, temperature 2");
    sampler_free(s);
}

/* With a learning rate mu moves after every token by eta (tau - its surprise): each
 * token drawn lies in the truncation the reference's own mu gives, step after step, and
 * sampler_reset starts mu again. */
static void mirostat2_mu_follows_the_surprise(void)
{
    enum { N = 20, STEPS = 300 };
    float l[N];
    double p[N];
    bool in[N];
    for (int i = 0; i < N; i++)
        l[i] = -0.7f * (float)i;
    softmax_ref(l, N, 1.0, p);
    sampler_params sp = plain_params(77);
    sp.mirostat = 2;
    sp.mirostat_tau = 2.5f;
    sp.mirostat_eta = 0.8f;
    sampler *s = sampler_new(N, &sp, NULL);
    CHECK(s);
    int32_t first[STEPS];
    double mu = 2 * 2.5, lo = mu, hi = mu, best = 0, best_var = 0;
    int n_best = 0;
    for (int step = 0; step < STEPS; step++) {
        double mass = mirostat2_ref(p, N, mu, in);
        int32_t t = first[step] = sampler_sample(s, l, NULL, 0);
        CHECK_MSG(t >= 0 && t < N && in[t], "step %d: token %d outside the truncation at mu %g",
                  step, t, mu);
        /* how often the most likely token comes, against the truncations' own odds */
        best += p[0] / mass;
        best_var += p[0] / mass * (1 - p[0] / mass);
        n_best += t == 0;
        mu -= 0.8 * (-log2(p[t] / mass) - 2.5);
        lo = mu < lo ? mu : lo;
        hi = mu > hi ? mu : hi;
    }
    CHECK_MSG(hi - lo > 2, "mu stayed within [%g, %g]", lo, hi);
    CHECK_MSG(fabs(n_best - best) <= 5 * sqrt(best_var), "token 0 came %d times, expected %.1f",
              n_best, best);
    sampler_reset(s, 77);
    for (int step = 0; step < STEPS; step++)
        CHECK_EQ(sampler_sample(s, l, NULL, 0), first[step]);
    sampler_free(s);
}

/* Three tokens of (all but) no surprise raise mu from 2 tau = 2 by eta tau each, to 3.5:
 * the next truncation then keeps the tokens of surprise up to 3.5 bits (three here, two
 * at the first mu), over 3000 samplers of their own seeds. */
static void mirostat2_mu_learns_from_each_token(void)
{
    enum { N = 20, RUNS = 3000 };
    float sure[N], l[N];
    double p[N], want[N] = {0};
    bool in[N];
    for (int i = 0; i < N; i++) {
        sure[i] = i == 0 ? 20.0f : 0.0f;
        l[i] = -0.7f * (float)i;
    }
    softmax_ref(l, N, 1.0, p);
    double mass = mirostat2_ref(p, N, 3.5, in);
    CHECK(in[2] && !in[3]);
    for (int i = 0; i < N; i++)
        want[i] = in[i] ? p[i] / mass : 0;
    int count[N] = {0};
    for (int run = 0; run < RUNS; run++) {
        sampler_params sp = plain_params(1000 + run);
        sp.mirostat = 2;
        sp.mirostat_tau = 1.0f;
        sp.mirostat_eta = 0.5f;
        sampler *s = sampler_new(N, &sp, NULL);
        CHECK(s);
        for (int i = 0; i < 3; i++)
            CHECK_EQ(sampler_sample(s, sure, NULL, 0), 0);
        count[sampler_sample(s, l, NULL, 0)]++;
        sampler_free(s);
    }
    for (int i = 0; i < N; i++)
        CHECK_MSG(fabs((double)count[i] / RUNS - want[i]) <=
                      5 * sqrt(want[i] * (1 - want[i]) / RUNS) + 1e-9,
                  "token %d: frequency %.4f, want %.4f", i, (double)count[i] / RUNS, want[i]);
}

/* v1: the top k of its estimate, k following mu: fixed with eta 0 (frequencies), moving
 * with the reference's mu otherwise (each draw within its top k). */
static void mirostat1_follows_its_estimate(void)
{
    enum { N = 200 };
    float l[N];
    double p[N], want[N];
    for (int i = 0; i < N; i++)
        l[i] = -1.1f * logf((float)(i + 1)) - 0.004f * (float)i; /* about Zipf */
    softmax_ref(l, N, 1.0, p);
    int k = mirostat1_k_ref(p, N, N, 2 * 3.0);
    CHECK_MSG(k > 2 && k < 100, "k %d", k);
    double mass = 0;
    for (int i = 0; i < k; i++)
        mass += p[i];
    for (int i = 0; i < N; i++)
        want[i] = i < k ? p[i] / mass : 0;
    sampler_params sp = plain_params(8);
    sp.mirostat = 1;
    sp.mirostat_tau = 3.0f;
    sp.mirostat_eta = 0.0f;
    sampler *s = sampler_new(N, &sp, NULL);
    CHECK(s);
    expect_frequencies(s, l, N, want, 20000, "mirostat 1, eta 0");
    sampler_free(s);
    sp.mirostat_eta = 0.5f;
    CHECK((s = sampler_new(N, &sp, NULL)));
    double mu = 6.0, best = 0, best_var = 0;
    int k_lo = N, k_hi = 0, n_best = 0;
    for (int step = 0; step < 300; step++) {
        k = mirostat1_k_ref(p, N, N, mu);
        k_lo = k < k_lo ? k : k_lo;
        k_hi = k > k_hi ? k : k_hi;
        int32_t t = sampler_sample(s, l, NULL, 0);
        CHECK_MSG(t >= 0 && t < k, "step %d: token %d outside the top %d at mu %g", step, t, k,
                  mu);
        mass = 0;
        for (int i = 0; i < k; i++)
            mass += p[i];
        best += p[0] / mass;
        best_var += p[0] / mass * (1 - p[0] / mass);
        n_best += t == 0;
        mu -= 0.5 * (-log2(p[t] / mass) - 3.0);
    }
    CHECK_MSG(k_hi > k_lo, "k stayed %d", k_lo);
    CHECK_MSG(fabs(n_best - best) <= 5 * sqrt(best_var), "token 0 came %d times, expected %.1f",
              n_best, best);
    sampler_free(s);
}

/* Mirostat replaces the chain as llama.cpp's common sampler does: the biases count, the
 * penalties and truncation steps do not; greedy stays greedy. */
static void mirostat_replaces_the_chain(void)
{
    enum { N = 6 };
    float l[N] = {3.0f, 2.9f, 0.0f, -1.0f, -2.0f, -3.0f};
    const int32_t hist[] = {0, 0, 0};
    sampler_bias b = {1, 0.2f};
    sampler_params sp = plain_params(1);
    sp.temperature = 0.0f;
    sp.mirostat = 2;
    sp.repeat_penalty = 5.0f;
    sp.top_k = 1;
    sp.bias = &b;
    sp.n_bias = 1;
    sampler *s = sampler_new(N, &sp, NULL);
    CHECK(s);
    CHECK_EQ(sampler_sample(s, l, hist, 3), 1); /* the bias counts: 3.1 > 3.0 */
    b.bias = -0.05f;
    sampler_free(s);
    CHECK((s = sampler_new(N, &sp, NULL)));
    CHECK_EQ(sampler_sample(s, l, hist, 3), 0); /* 2.85 < 3.0: the penalty did not count */
    sampler_free(s);
}

/* ---- dynamic temperature, top-n-sigma, min_keep ---- */

/* The temperature is base +- range by the candidates' normalised entropy raised to the
 * exponent: the draws follow softmax(l / that), not softmax(l / base). */
static void dynatemp_follows_the_entropy(void)
{
    enum { N = 10 };
    float l[N] = {2.5f, 1.0f, 0.8f, 0.1f, -0.5f, -1.0f, -1.2f, -2.0f, -2.5f, -3.0f};
    double p[N], want[N];
    const struct {
        float t, range, exponent;
    } cases[] = {{1.0f, 0.9f, 2.0f}, {1.0f, 0.9f, 3.0f}, {0.5f, 1.0f, 0.5f}, {2.0f, 0.5f, 0.0f}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        softmax_ref(l, N, 1.0, p);
        double h = 0;
        for (int i = 0; i < N; i++)
            h -= p[i] * log(p[i]);
        double lo = cases[c].t - cases[c].range < 0 ? 0 : cases[c].t - cases[c].range;
        double hi = cases[c].t + cases[c].range;
        double t = lo + (hi - lo) * pow(h / log(N), cases[c].exponent);
        CHECK_MSG(fabs(t - cases[c].t) > 0.2, "case %zu: %g is too near the base", c, t);
        softmax_ref(l, N, t, want);
        sampler_params sp = plain_params(60 + c);
        sp.temperature = cases[c].t;
        sp.dynatemp_range = cases[c].range;
        sp.dynatemp_exponent = cases[c].exponent;
        sampler *s = sampler_new(N, &sp, NULL);
        CHECK(s);
        char what[64];
        snprintf(what, sizeof what, "dynatemp case %zu (temperature %.3f)", c, t);
        expect_frequencies(s, l, N, want, 30000, what);
        sampler_free(s);
    }
}

/* Only the logits within n standard deviations (of the finite ones) of the best stay. */
static void top_n_sigma_keeps_the_logits_near_the_best(void)
{
    enum { N = 12 };
    float l[N] = {4.0f, 3.5f, 3.1f, 2.0f, 1.0f, 0.5f, 0.0f, -1.0f, -2.0f, -3.0f, -INFINITY, -5.0f};
    const float ns[] = {0.3f, 0.8f, 1.5f};
    for (size_t c = 0; c < sizeof ns / sizeof *ns; c++) {
        double mean = 0, var = 0, max = 4.0;
        int n = 0;
        for (int i = 0; i < N; i++)
            if (l[i] != -INFINITY)
                mean += l[i], n++;
        mean /= n;
        for (int i = 0; i < N; i++)
            if (l[i] != -INFINITY)
                var += (l[i] - mean) * (l[i] - mean);
        double cut = max - ns[c] * sqrt(var / n), p[N], mass = 0;
        softmax_ref(l, N, 1.0, p);
        for (int i = 0; i < N; i++)
            mass += l[i] >= cut ? p[i] : 0;
        double want[N];
        for (int i = 0; i < N; i++)
            want[i] = l[i] >= cut ? p[i] / mass : 0;
        sampler_params sp = plain_params(70 + c);
        sp.top_n_sigma = ns[c];
        sampler *s = sampler_new(N, &sp, NULL);
        CHECK(s);
        char what[32];
        snprintf(what, sizeof what, "top_n_sigma %.1f", (double)ns[c]);
        expect_frequencies(s, l, N, want, 20000, what);
        sampler_free(s);
    }
}

/* min_keep holds top-p and min-p open to that many tokens, as llama.cpp's does. */
static void min_keep_keeps_that_many(void)
{
    enum { N = 6 };
    float l[N] = {logf(0.5f), logf(0.3f), logf(0.1f), logf(0.05f), logf(0.03f), logf(0.02f)};
    bool allowed[N] = {true, true, true, true, false, false};
    sampler_params sp = plain_params(4);
    sp.top_p = 0.5f;
    sp.min_keep = 4;
    sampler *s = sampler_new(N, &sp, NULL);
    CHECK(s);
    CHECK_EQ(draw_set(s, l, N, allowed, 3000), 0);
    sampler_free(s);
    sp = plain_params(4);
    sp.min_p = 0.9f;
    sp.min_keep = 4;
    CHECK((s = sampler_new(N, &sp, NULL)));
    CHECK_EQ(draw_set(s, l, N, allowed, 3000), 0);
    sampler_free(s);
    /* 0 and 1 keep one */
    bool best[N] = {true};
    for (int mk = 0; mk < 2; mk++) {
        sp.min_keep = mk;
        CHECK((s = sampler_new(N, &sp, NULL)));
        CHECK_EQ(draw_set(s, l, N, best, 300), 0);
        sampler_free(s);
    }
}

/* ---- an order of one's own ---- */

static void orders_of_ones_own(void)
{
    enum { N = 5 };
    /* probabilities 0.5, 0.25, 0.125, 0.0625, 0.0625 */
    float l[N] = {logf(0.5f), logf(0.25f), logf(0.125f), logf(0.0625f), logf(0.0625f)};
    /* top-p 0.7 keeps two at temperature 1; after temperature 2 (flatter) it keeps three */
    sampler_params sp = plain_params(12);
    sp.temperature = 2.0f;
    sp.top_p = 0.7f;
    bool two[N] = {true, true}, three[N] = {true, true, true};
    sampler *s = sampler_new(N, &sp, NULL);
    CHECK(s);
    CHECK_EQ(draw_set(s, l, N, two, 3000), 0);
    sampler_free(s);
    sp.order[0] = SAMPLER_TEMPERATURE;
    sp.order[1] = SAMPLER_TOP_P;
    sp.n_order = 2;
    CHECK((s = sampler_new(N, &sp, NULL)));
    CHECK_EQ(draw_set(s, l, N, three, 3000), 0);
    sampler_free(s);
    /* without the temperature step the draw is at temperature 1, even when it says 0 */
    sp.temperature = 0.0f;
    sp.order[0] = SAMPLER_TOP_K;
    sp.n_order = 1;
    sp.top_k = 3;
    CHECK((s = sampler_new(N, &sp, NULL)));
    CHECK_EQ(draw_set(s, l, N, three, 3000), 0);
    sampler_free(s);
    /* penalties after the temperature subtract in tempered units: greedy at temperature
     * 0.5 after a presence penalty of 0.5 is the same as 1.0 at temperature 1 */
    float m[N] = {1.0f, 0.8f, 0.4f, 0.0f, -1.0f};
    const int32_t hist[] = {0};
    sp = plain_params(1);
    sp.presence_penalty = 0.5f;
    sp.order[0] = SAMPLER_TEMPERATURE;
    sp.order[1] = SAMPLER_PENALTIES;
    sp.order[2] = SAMPLER_TOP_K;
    sp.n_order = 3;
    sp.temperature = 0.5f;
    sp.top_k = 1;
    CHECK((s = sampler_new(N, &sp, NULL)));
    CHECK_EQ(sampler_sample(s, m, hist, 1), 1); /* 1.0 - 0.5 * 0.5 = 0.75 < 0.8 */
    sampler_free(s);
    sp.temperature = 2.0f;
    CHECK((s = sampler_new(N, &sp, NULL)));
    CHECK_EQ(sampler_sample(s, m, hist, 1), 1); /* 1.0 - 0.5 * 2 = 0 */
    sampler_free(s);
    sp.temperature = 0.2f;
    CHECK((s = sampler_new(N, &sp, NULL)));
    CHECK_EQ(sampler_sample(s, m, hist, 1), 0); /* 1.0 - 0.1 = 0.9 > 0.8 */
    sampler_free(s);
    /* greedy takes the most likely token XTC leaves when XTC comes before it */
    float x[N] = {logf(0.4f), logf(0.3f), logf(0.2f), logf(0.06f), logf(0.04f)};
    sp = plain_params(2);
    sp.temperature = 0.0f;
    sp.xtc_probability = 1.0f;
    sp.xtc_threshold = 0.1f;
    CHECK((s = sampler_new(N, &sp, NULL)));
    CHECK_EQ(sampler_sample(s, x, NULL, 0), 2);
    sampler_free(s);
    sp.order[0] = SAMPLER_TEMPERATURE;
    sp.order[1] = SAMPLER_XTC;
    sp.n_order = 2;
    CHECK((s = sampler_new(N, &sp, NULL)));
    CHECK_EQ(sampler_sample(s, x, NULL, 0), 0);
    sampler_free(s);
}

/* Case i of newer_params_are_checked: a bad setting of p, and the word its refusal
 * names; NULL past the last case. */
static const char *bad_newer_param(int i, sampler_params *p)
{
    static sampler_breaker outside = {.head = 100}, long_tail = {.head = 1, .n_tail = 21};
    if (i >= 9 && i <= 15)
        p->dry_multiplier = 1.0f, p->n_ctx = 8; /* DRY on */
    switch (i) {
    case 0: p->typical_p = 0.0f; return "typical_p";
    case 1: p->typical_p = 1.5f; return "typical_p";
    case 2: p->min_keep = -1; return "min_keep";
    case 3: p->top_n_sigma = NAN; return "top_n_sigma";
    case 4: p->xtc_probability = 1.5f; return "xtc_probability";
    case 5: p->xtc_probability = -0.1f; return "xtc_probability";
    case 6: p->xtc_probability = 0.5f, p->xtc_threshold = 2.0f; return "xtc_threshold";
    case 7: p->dynatemp_range = -1.0f; return "dynatemp_range";
    case 8: p->dynatemp_range = 0.5f, p->dynatemp_exponent = -1.0f; return "dynatemp_exponent";
    case 9: p->dry_multiplier = -1.0f; return "dry_multiplier";
    case 10: p->dry_base = 0.5f; return "dry_base";
    case 11: p->dry_allowed_length = -1; return "dry_allowed_length";
    case 12: p->dry_penalty_last_n = -2; return "dry_penalty_last_n";
    case 13: p->n_ctx = 0; return "n_ctx";
    case 14: p->dry_breakers = &outside, p->n_dry_breakers = 1; return "breaker";
    case 15: p->dry_breakers = &long_tail, p->n_dry_breakers = 1; return "breaker";
    case 16: p->mirostat = 3; return "mirostat";
    case 17: p->mirostat = 2, p->mirostat_tau = -1.0f; return "mirostat_tau";
    case 18: p->mirostat = 1, p->mirostat_eta = NAN; return "mirostat_eta";
    case 19:
        p->n_order = 2, p->order[0] = SAMPLER_TOP_K, p->order[1] = SAMPLER_TOP_K;
        return "order";
    case 20: p->n_order = 1, p->order[0] = SAMPLER_STEPS; return "order";
    case 21: p->n_order = SAMPLER_STEPS + 1; return "order";
    default: return NULL;
    }
}

static void newer_params_are_checked(void)
{
    char err[ERR_MAX];
    sampler_params p = sampler_params_default();
    for (int i = 0; bad_newer_param(i, &p); i++) {
        p = sampler_params_default();
        const char *want = bad_newer_param(i, &p);
        sampler *s = sampler_new(100, &p, err);
        CHECK_MSG(!s && strstr(err, want), "case %d: %s", i, s ? "taken" : err);
    }
    /* the parameters of a step that is off are not looked at */
    p = sampler_params_default();
    p.dry_base = 0.0f;
    p.mirostat_tau = -1.0f;
    p.xtc_threshold = 5.0f;
    p.dynatemp_exponent = -1.0f;
    sampler *s = sampler_new(100, &p, err);
    CHECK_MSG(s, "%s", err);
    sampler_free(s);
}

/* The newer steps keep the constraint's exactness: the draw is the chain's distribution
 * conditioned on the allowed tokens (typical's set here, Mirostat's truncation), and the
 * chain runs again over the allowed tokens alone when it keeps none of them. */
static void constrained_draws_condition_the_newer_steps(void)
{
    enum { N = 24, DRAWS = 20000 };
    float l[N];
    double p[N], want[N];
    bool in[N];
    l[0] = 2.2f;
    for (int i = 1; i < N; i++)
        l[i] = -0.02f * (float)i;
    softmax_ref(l, N, 1.0, p);
    typical_ref(p, N, 0.5, 0, in);
    allow_set a = {{0}, 0};
    double mass = 0;
    for (int i = 0; i < N; i += 3) {
        allow(&a, i);
        mass += in[i] ? p[i] : 0;
    }
    for (int i = 0; i < N; i++)
        want[i] = in[i] && i % 3 == 0 ? p[i] / mass : 0;
    sampler_constraint con = {set_allows, &a};
    sampler_params sp = plain_params(91);
    sp.typical_p = 0.5f;
    sampler *s = sampler_new(N, &sp, NULL);
    CHECK(s);
    check_frequencies(s, l, N, &con, want, DRAWS, "typical, allowed");
    sampler_free(s);
    /* Mirostat v2 at mu 3.6 keeps 0, 1, 2: of them 0 and 2 are allowed */
    enum { M = 12 };
    float m[M];
    for (int i = 0; i < M; i++)
        m[i] = -0.7f * (float)i;
    softmax_ref(m, M, 1.0, p);
    a = (allow_set){{0}, 0};
    for (int i = 0; i < M; i += 2)
        allow(&a, i);
    memset(want, 0, sizeof want);
    want[0] = p[0] / (p[0] + p[2]);
    want[2] = p[2] / (p[0] + p[2]);
    sp = plain_params(92);
    sp.mirostat = 2;
    sp.mirostat_tau = 1.8f;
    sp.mirostat_eta = 0.0f;
    CHECK((s = sampler_new(M, &sp, NULL)));
    check_frequencies(s, m, M, &con, want, DRAWS, "mirostat 2, allowed");
    /* none of them allowed: Mirostat over 5 and 7 alone, where both pass */
    a = (allow_set){{0}, 0};
    allow(&a, 5);
    allow(&a, 7);
    memset(want, 0, sizeof want);
    want[5] = p[5] / (p[5] + p[7]);
    want[7] = p[7] / (p[5] + p[7]);
    check_frequencies(s, m, M, &con, want, DRAWS, "mirostat 2, none of its truncation allowed");
    sampler_free(s);
}

/* ---- no allocation ---- */

/* test_sampler is linked with --wrap=malloc,calloc,realloc (the Makefile), so that every
 * allocation of its objects and the engine's is counted here. */
void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
static long n_allocs;

void *__wrap_malloc(size_t n)
{
    n_allocs++;
    return __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t size)
{
    n_allocs++;
    return __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t n)
{
    n_allocs++;
    return __real_realloc(p, n);
}

/* Every step on (DRY with breakers, typical, XTC, top-n-sigma, dynamic temperature,
 * min_keep), Mirostat v1 and v2, constrained and greedy: sampling allocates nothing. */
static void sampling_never_allocates(void)
{
    enum { N = 4000 };
    static float l[N];
    static int32_t hist[512];
    for (int i = 0; i < 512; i++)
        hist[i] = (int32_t)((i * 7 + i / 13) % 40);
    sampler_breaker br[2] = {{.head = 3}, {.head = 5, .n_tail = 2, .tail = {6, 7}}};
    allow_set a = {{~0ull, 0x5555555555555555ull}, 0};
    sampler_constraint con = {set_allows, &a};
    long before = n_allocs;
    CHECK((l[0] = 1.0f) > 0 && n_allocs == before); /* the counter counts nothing itself */
    for (int variant = 0; variant < 6; variant++) {
        sampler_params p = sampler_params_default();
        p.seed = 5;
        p.repeat_penalty = 1.1f;
        p.n_ctx = 512;
        if (variant < 4) {
            p.dry_multiplier = 0.8f;
            p.dry_breakers = br;
            p.n_dry_breakers = 2;
            p.typical_p = 0.9f;
            p.xtc_probability = 0.5f;
            p.top_n_sigma = 2.0f;
            p.dynatemp_range = 0.5f;
            p.min_keep = 3;
            p.top_k = variant == 1 ? 0 : 40;
            p.temperature = variant == 2 ? 0.0f : 0.8f;
        } else {
            p.mirostat = variant - 3;
        }
        if (variant == 3) {
            p.order[0] = SAMPLER_TEMPERATURE;
            p.order[1] = SAMPLER_DRY;
            p.order[2] = SAMPLER_TYPICAL;
            p.order[3] = SAMPLER_XTC;
            p.n_order = 4;
        }
        char err[ERR_MAX];
        sampler *s = sampler_new(N, &p, err);
        CHECK_MSG(s, "%s", err);
        before = n_allocs;
        for (int step = 0; step < 40; step++) {
            fill_logits(l, N, 500u + (uint32_t)step, 5.0f);
            CHECK(sampler_sample(s, l, hist, 200 + step) >= 0);
            CHECK(sampler_sample_allowed(s, l, hist, 200 + step, &con) >= 0);
        }
        CHECK_MSG(n_allocs == before, "variant %d: %ld allocations while sampling", variant,
                  n_allocs - before);
        sampler_free(s);
    }
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
    RUN(typical_keeps_the_locally_typical_set);
    RUN(xtc_excludes_the_top_choices);
    RUN(dry_penalizes_what_would_extend_a_repetition);
    RUN(dry_breakers_cut_repetitions);
    RUN(dry_matches_the_reference_on_random_histories);
    RUN(mirostat2_truncates_at_mu);
    RUN(mirostat2_mu_follows_the_surprise);
    RUN(mirostat2_mu_learns_from_each_token);
    RUN(mirostat1_follows_its_estimate);
    RUN(mirostat_replaces_the_chain);
    RUN(dynatemp_follows_the_entropy);
    RUN(top_n_sigma_keeps_the_logits_near_the_best);
    RUN(min_keep_keeps_that_many);
    RUN(orders_of_ones_own);
    RUN(newer_params_are_checked);
    RUN(constrained_draws_condition_the_newer_steps);
    RUN(sampling_never_allocates);
    RUN(stop_string_split_across_pieces);
    RUN(false_prefix_is_released);
    RUN(held_tail_is_flushed_at_the_end);
    RUN(split_utf8_character_is_held_until_complete);
    RUN(multiple_stop_strings_earliest_wins);
    RUN(stop_init_rejects_bad_strings);
    return test_finish();
}
