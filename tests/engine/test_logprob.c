/* Tests of the log-probabilities reported beside generated tokens. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "engine/model/logprob.h"
#include "tests/support/test.h"

/* Deterministic pseudo-random logits in [-scale, scale). */
static void fill_logits(float *l, int n, uint32_t seed, float scale)
{
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        l[i] = ((float)(seed >> 8) / (float)(1u << 24) * 2.0f - 1.0f) * scale;
    }
}

/* The log-softmax computed the slow way, in long double. */
static double brute_logprob(const float *l, int n, int i)
{
    long double max = -INFINITY, sum = 0;
    for (int k = 0; k < n; k++)
        if (l[k] > max)
            max = l[k];
    for (int k = 0; k < n; k++)
        sum += expl((long double)l[k] - max);
    return (double)((long double)l[i] - max - logl(sum));
}

static void matches_the_log_softmax(void)
{
    enum { N = 50000 };
    float *l = malloc(sizeof *l * N);
    CHECK(l);
    fill_logits(l, N, 7, 30.0f);
    logprob_step st;
    logprob_of_row(l, N, 1234, LOGPROB_TOP_MAX, &st);
    CHECK_EQ(st.token, 1234);
    CHECK_MSG(fabs(st.logprob - brute_logprob(l, N, 1234)) < 1e-3, "%g vs %g", st.logprob,
              brute_logprob(l, N, 1234));
    CHECK_EQ(st.n_top, LOGPROB_TOP_MAX);
    /* the top list is the n likeliest, in order, each with its own log-probability */
    int above = 0;
    for (int i = 0; i < N; i++)
        above += l[i] > l[st.top_token[LOGPROB_TOP_MAX - 1]];
    CHECK_EQ(above, LOGPROB_TOP_MAX - 1);
    double mass = 0;
    for (int k = 0; k < st.n_top; k++) {
        CHECK(k == 0 || st.top_logprob[k] <= st.top_logprob[k - 1]);
        CHECK_MSG(fabs(st.top_logprob[k] - brute_logprob(l, N, st.top_token[k])) < 1e-3, "%d", k);
        mass += exp(st.top_logprob[k]);
    }
    CHECK(mass > 0 && mass <= 1.0 + 1e-5);
    free(l);
}

static void probabilities_sum_to_one(void)
{
    float l[8] = {1, 2, 3, 4, -1, 0.5f, 2, -30};
    double sum = 0;
    for (int i = 0; i < 8; i++) {
        logprob_step st;
        logprob_of_row(l, 8, i, 0, &st);
        CHECK_EQ(st.n_top, 0);
        CHECK(st.logprob <= 0);
        sum += exp(st.logprob);
    }
    CHECK_MSG(fabs(sum - 1.0) < 1e-5, "%g", sum);
}

static void ties_go_to_the_lowest_id(void)
{
    float l[6] = {1, 5, 5, 0, 5, 2};
    logprob_step st;
    logprob_of_row(l, 6, 4, 2, &st);
    CHECK_EQ(st.n_top, 2);
    CHECK_EQ(st.top_token[0], 1);
    CHECK_EQ(st.top_token[1], 2);
    CHECK(st.top_logprob[0] == st.top_logprob[1]);
    CHECK(st.logprob == st.top_logprob[0]);
}

static void odd_rows(void)
{
    /* NaN is -infinity, as the sampler takes it */
    float l[4] = {NAN, 0, 0, -INFINITY};
    logprob_step st;
    logprob_of_row(l, 4, 1, 4, &st);
    CHECK_MSG(fabsf(st.logprob - logf(0.5f)) < 1e-6, "%g", st.logprob);
    CHECK_EQ(st.n_top, 4);
    CHECK(st.top_token[0] == 1 && st.top_token[1] == 2);
    CHECK(isinf(st.top_logprob[2]) && st.top_logprob[2] < 0);
    logprob_of_row(l, 4, 0, 0, &st);
    CHECK(isinf(st.logprob) && st.logprob < 0);
    /* more alternatives asked than there are tokens, or than the bound */
    logprob_of_row(l, 4, 1, 99, &st);
    CHECK_EQ(st.n_top, 4);
    float none[3] = {-INFINITY, NAN, -INFINITY};
    logprob_of_row(none, 3, 0, 2, &st);
    CHECK(isinf(st.logprob) && st.n_top == 2 && isinf(st.top_logprob[0]));
    /* a token outside the row */
    logprob_of_row(l, 4, 9, 1, &st);
    CHECK(isinf(st.logprob));
}

int main(void)
{
    RUN(matches_the_log_softmax);
    RUN(probabilities_sum_to_one);
    RUN(ties_go_to_the_lowest_id);
    RUN(odd_rows);
    return test_finish();
}
