/*
 * logprob.c — log-softmax of a row of logits, for one token and the likeliest few.
 */
#include "engine/model/logprob.h"

#include <math.h>

/* A logit as the sampler takes it: NaN is -infinity. */
static inline float logit_at(const float *logits, int i)
{
    float v = logits[i];
    return isnan(v) ? -INFINITY : v;
}

void logprob_of_row(const float *logits, int n_vocab, int32_t chosen, int n_top,
                    logprob_step *out)
{
    if (n_top < 0)
        n_top = 0;
    if (n_top > LOGPROB_TOP_MAX)
        n_top = LOGPROB_TOP_MAX;
    if (n_top > n_vocab)
        n_top = n_vocab;
    out->token = chosen;
    out->n_top = 0;

    /* Pass 1: the maximum, and the top n_top kept sorted by insertion (most likely
     * first; a later token of an equal logit does not pass an earlier one). */
    float max = -INFINITY;
    for (int i = 0; i < n_vocab; i++) {
        float v = logit_at(logits, i);
        if (v > max)
            max = v;
        if (n_top == 0 || (out->n_top == n_top && !(v > out->top_logprob[n_top - 1])))
            continue;
        int at = out->n_top < n_top ? out->n_top++ : n_top - 1;
        while (at > 0 && v > out->top_logprob[at - 1]) {
            out->top_logprob[at] = out->top_logprob[at - 1];
            out->top_token[at] = out->top_token[at - 1];
            at--;
        }
        out->top_logprob[at] = v;
        out->top_token[at] = i;
    }
    if (max == -INFINITY) {
        out->logprob = -INFINITY;
        for (int k = 0; k < out->n_top; k++)
            out->top_logprob[k] = -INFINITY;
        return;
    }
    /* Pass 2: log of the normalizer, shifted by the maximum so exp cannot overflow. */
    double sum = 0;
    for (int i = 0; i < n_vocab; i++)
        sum += exp((double)(logit_at(logits, i) - max));
    float lse = max + (float)log(sum);
    out->logprob = chosen >= 0 && chosen < n_vocab ? logit_at(logits, chosen) - lse : -INFINITY;
    for (int k = 0; k < out->n_top; k++)
        out->top_logprob[k] -= lse;
}
