/*
 * sampler.h — choosing the next token from a row of logits.
 *
 * The steps and their order follow llama.cpp's default chain: logit biases -> penalties
 * over the recent history (repetition, then OpenAI's frequency and presence) -> top-k -> top-p -> min-p -> temperature -> a draw from the
 * softmax with the sampler's own seeded PRNG (xoshiro256**). Top-p and min-p therefore
 * see probabilities at temperature 1. A temperature <= 0 means greedy: the argmax after
 * the penalty (ties go to the lowest id).
 *
 * A sampler owns scratch sized for the vocabulary when it is created; sampling never
 * allocates. One sampler serves one generation stream at a time (no internal locking).
 */
#ifndef LLMS_SAMPLER_H
#define LLMS_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/err.h"

/* A seed that asks for a random one (taken from getrandom(), else the clock). */
#define SAMPLER_SEED_RANDOM UINT64_MAX

/* A number added to one token's logit before every other step (OpenAI's logit_bias; a
 * large negative one bans the token). */
typedef struct sampler_bias {
    int32_t token; /* within the vocabulary */
    float bias;    /* finite, or -INFINITY */
} sampler_bias;

typedef struct sampler_params {
    float temperature;    /* <= 0: greedy; otherwise logits are divided by it */
    int top_k;            /* keep the k most likely tokens; 0 disables */
    float top_p;          /* keep the smallest prefix whose mass reaches p; (0,1], 1 disables */
    float min_p;          /* drop tokens below min_p * p(most likely); [0,1], 0 disables */
    float repeat_penalty; /* > 0; 1 disables */
    /* OpenAI's, in [-2, 2]; 0 disables: subtracted from a token's logit once per time it
     * occurs in the window (frequency) and once if it occurs at all (presence) */
    float frequency_penalty;
    float presence_penalty;
    int repeat_last_n;    /* tokens of history penalized (all three); 0 disables, -1 all */
    const sampler_bias *bias; /* (n_bias) copied by sampler_new; one token's biases add up */
    int n_bias;
    uint64_t seed;        /* SAMPLER_SEED_RANDOM for a random seed */
} sampler_params;

/* llama.cpp's defaults: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, repetition
 * penalty off (1.0) over the last 64 tokens, random seed. */
sampler_params sampler_params_default(void);

typedef struct sampler sampler;

/* Validates the parameters (the message names the bad one) and allocates the scratch for
 * a vocabulary of n_vocab tokens. Returns NULL and fills err on failure. */
sampler *sampler_new(int n_vocab, const sampler_params *p, char err[ERR_MAX]);

void sampler_free(sampler *s);

/*
 * Picks the next token from logits[n_vocab] (not modified). history holds the tokens
 * so far (prompt and generated), oldest first; of the last repeat_last_n of them, each
 * distinct id's logit is divided by repeat_penalty (multiplied when negative), then less
 * its count times frequency_penalty and presence_penalty, as llama.cpp's penalties
 * sampler does; ids outside the vocabulary are ignored.
 * NaN logits count as -infinity. Returns the token id, or -1 when logits is NULL,
 * n_history < 0, or n_history > 0 with history NULL.
 */
int32_t sampler_sample(sampler *s, const float *logits, const int32_t *history, int n_history);

/* Which tokens may come next: a grammar's, such as JSON mode's (engine/model/jsonmask.h).
 * allows(ctx, token) is asked about single tokens, as sampler_sample_allowed says. */
typedef struct sampler_constraint {
    bool (*allows)(const void *ctx, int32_t token);
    const void *ctx;
} sampler_constraint;

/*
 * sampler_sample drawing only tokens c allows. Greedy gives the most likely allowed
 * token. Otherwise the draw is among the tokens the truncation (top-k, top-p, min-p) of
 * the unconstrained distribution keeps that c allows, in proportion to their
 * probabilities: the truncated distribution conditioned on c. Only when the truncation
 * keeps no allowed token is it made again over the allowed tokens alone (top-k then
 * counts allowed tokens only, top-p their mass), and that is drawn from.
 *
 * How: it first draws as sampler_sample does and keeps the token when c allows it (one
 * question to c, the usual case: llama.cpp's fast path); otherwise it draws again from
 * the kept tokens c allows. With p the truncated distribution and A the allowed set,
 * P(t) = p(t) + (1 - p(A)) p(t) / p(A) = p(t) / p(A): exact, where llama.cpp's second
 * draw truncates the masked whole vocabulary instead (so its top-k/top-p differ after a
 * rejection). Only greedy's rejected argmax and a truncation with no allowed token ask c
 * about the whole vocabulary. The random stream advances once per draw.
 * Returns -1 as sampler_sample does, and when c allows no token of the vocabulary.
 */
int32_t sampler_sample_allowed(sampler *s, const float *logits, const int32_t *history,
                               int n_history, const sampler_constraint *c);

/* Restarts the random stream from seed (SAMPLER_SEED_RANDOM for a random one). */
void sampler_reset(sampler *s, uint64_t seed);

/* The seed actually in use (the drawn one when a random seed was asked for), so a run
 * can be reproduced. */
uint64_t sampler_seed(const sampler *s);

#endif
