/*
 * ctxtrace.h — synthetic call traces over many contexts, as in the LLMS paper's
 * evaluation (header-only: each benchmark source file is a program of its own).
 *
 * Calls arrive as a Poisson process. Each call goes to one of n active contexts, chosen
 * by one of three patterns, and adds a prompt whose length is log-uniform in
 * [TRACE_MIN_PROMPT, TRACE_MAX_PROMPT] tokens (most calls short, a few long).
 *   random:   every context equally likely;
 *   markov:   recently used contexts more likely (the k-th most recent with weight 2^-k);
 *   gaussian: contexts of moderate size more likely (weight exp(-z^2 / 2) where z is the
 *             context's size in standard deviations from the mean size).
 */
#ifndef LLMS_BENCH_CTXTRACE_H
#define LLMS_BENCH_CTXTRACE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define TRACE_MIN_PROMPT 10
#define TRACE_MAX_PROMPT 2000
#define TRACE_MAX_CONTEXTS 64

enum trace_kind { TRACE_RANDOM, TRACE_MARKOV, TRACE_GAUSSIAN };

static const char *const trace_kind_names[] = {"random", "markov", "gaussian"};

typedef struct trace_call {
    double arrival_s; /* since the trace started */
    int ctx;          /* 0 .. n_contexts-1 */
    int n_prompt;     /* tokens the call adds */
} trace_call;

/* xorshift64*: a small deterministic generator so traces repeat across systems. */
static inline double trace_uniform(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return (double)((x * 2685821657736338717ull) >> 11) * (1.0 / 9007199254740992.0);
}

/* Index drawn with probability proportional to w[i] (n > 0, weights >= 0, sum > 0). */
static inline int trace_pick(const double *w, int n, uint64_t *state)
{
    double total = 0;
    for (int i = 0; i < n; i++)
        total += w[i];
    double u = trace_uniform(state) * total;
    for (int i = 0; i < n; i++) {
        if (u < w[i])
            return i;
        u -= w[i];
    }
    return n - 1;
}

/*
 * Fills calls[0 .. n_calls) for n_contexts contexts (<= TRACE_MAX_CONTEXTS) whose sizes
 * in tokens are sizes[] (updated as calls add prompts), rate_hz calls per second.
 */
static inline void trace_generate(enum trace_kind kind, int n_contexts, int *sizes, int n_calls,
                                  double rate_hz, uint64_t seed, trace_call *calls)
{
    uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
    int recency[TRACE_MAX_CONTEXTS]; /* contexts, most recently used first */
    double w[TRACE_MAX_CONTEXTS];
    for (int i = 0; i < n_contexts; i++)
        recency[i] = i;
    double t = 0;
    for (int k = 0; k < n_calls; k++) {
        t += -log(1.0 - trace_uniform(&state)) / rate_hz;
        int ctx;
        if (kind == TRACE_RANDOM) {
            ctx = (int)(trace_uniform(&state) * n_contexts);
            if (ctx >= n_contexts)
                ctx = n_contexts - 1;
        } else if (kind == TRACE_MARKOV) {
            for (int i = 0; i < n_contexts; i++)
                w[i] = ldexp(1.0, -i);
            ctx = recency[trace_pick(w, n_contexts, &state)];
        } else {
            double mean = 0, var = 0;
            for (int i = 0; i < n_contexts; i++)
                mean += sizes[i];
            mean /= n_contexts;
            for (int i = 0; i < n_contexts; i++)
                var += (sizes[i] - mean) * (sizes[i] - mean);
            double sd = sqrt(var / n_contexts) + 1.0;
            for (int i = 0; i < n_contexts; i++) {
                double z = (sizes[i] - mean) / sd;
                w[i] = exp(-0.5 * z * z);
            }
            ctx = trace_pick(w, n_contexts, &state);
        }
        int pos = 0;
        while (recency[pos] != ctx)
            pos++;
        memmove(recency + 1, recency, (size_t)pos * sizeof *recency);
        recency[0] = ctx;
        double lo = log(TRACE_MIN_PROMPT), hi = log(TRACE_MAX_PROMPT);
        int n_prompt = (int)exp(lo + (hi - lo) * trace_uniform(&state));
        sizes[ctx] += n_prompt;
        calls[k] = (trace_call){t, ctx, n_prompt};
    }
}

#endif
