/*
 * logprob.h — the log-probabilities a generation reports beside its tokens (OpenAI's
 * logprobs and top_logprobs, llama.cpp's n_probs).
 *
 * They are the model's own: the log-softmax of a row of logits as the model gave it, at
 * temperature 1, before logit biases, penalties and truncation (as vLLM and OpenAI report
 * them), so that they say what the model thought, whatever the sampler then did.
 */
#ifndef LLMS_LOGPROB_H
#define LLMS_LOGPROB_H

#include <stdint.h>

/* The most alternatives one step reports (OpenAI's top_logprobs bound). */
#define LOGPROB_TOP_MAX 20

/* One generated token's log-probability and its step's likeliest tokens. */
typedef struct logprob_step {
    int32_t token;                     /* the token generated */
    float logprob;                     /* its log-probability, <= 0 */
    int n_top;                         /* entries of top_* in use */
    int32_t top_token[LOGPROB_TOP_MAX]; /* (n_top) most likely first, ties to the lowest id */
    float top_logprob[LOGPROB_TOP_MAX]; /* (n_top) */
} logprob_step;

/*
 * Fills *out for token chosen from logits[n_vocab] with the n_top (0..LOGPROB_TOP_MAX)
 * likeliest tokens. NaN logits count as -infinity, as the sampler takes them; a row
 * with no finite logit gives -infinity throughout. Does not allocate: two passes over
 * the row, and n_top insertions at most per token that beats the current last.
 */
void logprob_of_row(const float *logits, int n_vocab, int32_t chosen, int n_top,
                    logprob_step *out);

#endif
