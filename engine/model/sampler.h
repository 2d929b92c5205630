/*
 * sampler.h — choosing the next token from a row of logits.
 *
 * The steps are llama.cpp's samplers (src/llama-sampling.cpp), and their default order
 * its common sampler's chain (common/sampling.cpp): logit biases, then penalties over the
 * recent history (repetition, then OpenAI's frequency and presence) -> DRY -> top-n-sigma
 * -> top-k -> locally typical -> top-p -> min-p -> XTC -> temperature (or dynamic
 * temperature) -> a draw from the softmax with the sampler's own seeded PRNG
 * (xoshiro256**). The steps before temperature therefore see probabilities at
 * temperature 1. A temperature <= 0 means greedy: the most likely token the steps before
 * it leave (ties go to the lowest id). An order of one's own (sampler_params.order, as
 * llama.cpp's `samplers` list) runs only the steps it names, in its order; a step after
 * the temperature sees the tempered distribution, as in llama.cpp, and the penalties
 * after it are subtracted in tempered units. Mirostat (v1 or v2) replaces the whole chain
 * as llama.cpp's common sampler does: logit biases, temperature, then Mirostat's own
 * truncation and draw; penalties, DRY and the truncation steps do not run.
 *
 * Where llmsd differs from llama.cpp: ties are broken by id (llama.cpp's sorts leave
 * them as they fall); a step that removes tokens removes them where llama.cpp may leave
 * them at -infinity (the distribution is the same); locally typical sampling counts a
 * token of probability 0 as the least typical, where llama.cpp's entropy becomes NaN;
 * probabilities and Mirostat's estimates are computed in double precision from logit
 * differences; and the random numbers are the sampler's own stream, so no seed gives
 * llama.cpp's text. Where llama.cpp changed, llmsd follows the later one: typical keeps
 * at least one token with min_keep 0 (the February 2025 one kept them all), and
 * top-n-sigma has its place in the chain, <= 0 off (it had replaced the chain). The
 * numbers of the steps are llama.cpp's; sampler.c says each one.
 *
 * A sampler owns scratch sized for the vocabulary (and DRY's window) when it is created;
 * sampling never allocates. One sampler serves one generation stream at a time (no
 * internal locking): Mirostat's state (mu) belongs to it and starts again with
 * sampler_reset.
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

/* Tokens of a DRY sequence breaker after its first (llama.cpp keeps at most 20). */
#define SAMPLER_BREAKER_TAIL_MAX 20

/* One of DRY's sequence breakers as tokens (engine/model/drybreak.h makes them from
 * text): a repetition is not followed back past the latest place where head is followed
 * by tail. A head with no tail is a token whose text contains a breaker; such a token is
 * never penalized itself. */
typedef struct sampler_breaker {
    int32_t head;
    int32_t n_tail;
    int32_t tail[SAMPLER_BREAKER_TAIL_MAX];
} sampler_breaker;

/* The steps of the chain, as llama.cpp's `samplers` names them (sampler.c says each). */
enum sampler_step {
    SAMPLER_PENALTIES,   /* "penalties": repetition, frequency, presence */
    SAMPLER_DRY,         /* "dry" */
    SAMPLER_TOP_N_SIGMA, /* "top_n_sigma" */
    SAMPLER_TOP_K,       /* "top_k" */
    SAMPLER_TYPICAL,     /* "typ_p" */
    SAMPLER_TOP_P,       /* "top_p" */
    SAMPLER_MIN_P,       /* "min_p" */
    SAMPLER_XTC,         /* "xtc" */
    SAMPLER_TEMPERATURE, /* "temperature" (with dynatemp_range: dynamic) */
    SAMPLER_STEPS
};

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
    /* top-p, min-p, locally typical and XTC keep at least this many tokens; 0 and 1: one */
    int min_keep;
    /* locally typical: the tokens whose surprise is closest to the entropy, until their
     * mass passes typical_p; (0, 1], 1 disables */
    float typical_p;
    /* top-n-sigma: drop the logits more than top_n_sigma standard deviations (of the
     * finite logits) below the best; <= 0 disables */
    float top_n_sigma;
    /* XTC (exclude top choices): with probability xtc_probability ([0, 1], 0 disables)
     * a step removes every token of probability >= xtc_threshold but the least likely of
     * them; a threshold above 0.5 disables it (no random number is drawn then) */
    float xtc_probability;
    float xtc_threshold;  /* [0, 1] */
    /* dynamic temperature: temperature +- dynatemp_range (>= 0, 0 disables), following
     * the candidates' entropy over its maximum raised to dynatemp_exponent (>= 0) */
    float dynatemp_range;
    float dynatemp_exponent;
    /* DRY (don't repeat yourself): a token that would extend a repetition of at least
     * dry_allowed_length (>= 0) tokens of the last dry_penalty_last_n (0 disables, -1
     * all, at most n_ctx) loses dry_multiplier * dry_base ^ (length - allowed) from its
     * logit; dry_multiplier >= 0 (0 disables), dry_base >= 1. */
    float dry_multiplier;
    float dry_base;
    int dry_allowed_length;
    int dry_penalty_last_n;
    const sampler_breaker *dry_breakers; /* (n_dry_breakers) copied by sampler_new */
    int n_dry_breakers;
    /* the longest history the sampler is given (the context window): DRY's window and
     * its scratch; > 0 when DRY is on */
    int n_ctx;
    /* Mirostat: 0 off, 1 (v1, its estimate over the 100 likeliest tokens) or 2 (v2),
     * aiming at a surprise of mirostat_tau bits (>= 0) with learning rate mirostat_eta
     * (>= 0); mu starts at 2 tau */
    int mirostat;
    float mirostat_tau;
    float mirostat_eta;
    /* n_order > 0: only these steps run, in this order, each at most once (llama.cpp's
     * samplers list); 0: the default order, every step */
    enum sampler_step order[SAMPLER_STEPS];
    int n_order;
    uint64_t seed;        /* SAMPLER_SEED_RANDOM for a random seed */
} sampler_params;

/* llama.cpp's defaults: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, repetition
 * penalty off (1.0) over the last 64 tokens, typical_p 1, XTC off (threshold 0.1),
 * dynamic temperature off (exponent 1), DRY off (base 1.75, allowed length 2, the whole
 * window, no breakers: the caller makes llama.cpp's "\n", ":", "\"", "*" with
 * drybreak.h), Mirostat off (tau 5, eta 0.1), the default order, random seed. */
sampler_params sampler_params_default(void);

typedef struct sampler sampler;

/* Validates the parameters (the message names the bad one) and allocates the scratch for
 * a vocabulary of n_vocab tokens. Returns NULL and fills err on failure. */
sampler *sampler_new(int n_vocab, const sampler_params *p, char err[ERR_MAX]);

void sampler_free(sampler *s);

/*
 * Picks the next token from logits[n_vocab] (not modified). history holds the tokens
 * so far (prompt and generated), oldest first: of the last repeat_last_n of them, each
 * distinct id's logit is divided by repeat_penalty (multiplied when negative), then less
 * its count times frequency_penalty and presence_penalty, as llama.cpp's penalties
 * sampler does; DRY looks at the last dry_penalty_last_n (at most n_ctx); ids outside
 * the vocabulary are not penalized. NaN logits count as -infinity. Returns the token
 * id, or -1 when logits is NULL, n_history < 0, or n_history > 0 with history NULL.
 */
int32_t sampler_sample(sampler *s, const float *logits, const int32_t *history, int n_history);

/* Which tokens may come next: a grammar's, such as JSON mode's (engine/model/jsonmask.h).
 * allows(ctx, token) is asked about single tokens, as sampler_sample_allowed says. */
typedef struct sampler_constraint {
    bool (*allows)(const void *ctx, int32_t token);
    const void *ctx;
} sampler_constraint;

/*
 * sampler_sample drawing only tokens c allows. The chain runs as for sampler_sample; the
 * draw is among the tokens it keeps that c allows, in proportion to their probabilities
 * (at the temperature the chain chose, a dynamic one included): the chain's distribution
 * conditioned on c. Greedy gives the most likely of them. Only when the chain keeps no
 * allowed token is it run again over the allowed tokens alone (top-k then counts allowed
 * tokens only, top-p and typical their mass, Mirostat truncates them), and that is
 * drawn from.
 *
 * How: it first draws as sampler_sample does and keeps the token when c allows it (one
 * question to c, the usual case: llama.cpp's fast path); otherwise it draws again from
 * the kept tokens c allows. With p the chain's distribution and A the allowed set,
 * P(t) = p(t) + (1 - p(A)) p(t) / p(A) = p(t) / p(A): exact, where llama.cpp's second
 * draw runs its chain over the masked whole vocabulary instead (so its top-k, top-p,
 * typical set and Mirostat truncation differ after a rejection). XTC decides its removal
 * once per run of the chain. Mirostat learns once per call, from the surprise of the
 * token taken in the distribution it was drawn from (after a rejection: among the
 * allowed), where llama.cpp's two passes update mu twice. Only greedy's rejected argmax
 * over an untruncated chain and a chain with no allowed token ask c about the whole
 * vocabulary. The random stream advances once per draw, and once per run of the chain
 * with XTC on. Returns -1 as sampler_sample does, and when c allows no token of the
 * vocabulary.
 */
int32_t sampler_sample_allowed(sampler *s, const float *logits, const int32_t *history,
                               int n_history, const sampler_constraint *c);

/* Restarts the random stream from seed (SAMPLER_SEED_RANDOM for a random one). */
void sampler_reset(sampler *s, uint64_t seed);

/* The seed actually in use (the drawn one when a random seed was asked for), so a run
 * can be reproduced. */
uint64_t sampler_seed(const sampler *s);

#endif
