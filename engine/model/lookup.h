/*
 * lookup.h — prompt-lookup drafts for speculative decoding: the tokens that followed the
 * latest earlier occurrence of a sequence's last n tokens, where generated text copies
 * spans from its own context (retrieved passages, code, the conversation). They cost no
 * model evaluation; the target model verifies them in one batched forward.
 */
#ifndef LLMS_LOOKUP_H
#define LLMS_LOOKUP_H

#include <stdint.h>

/* The n-gram lengths tried, longest first: a longer match predicts better, a shorter one
 * matches more often. */
#define LOOKUP_NGRAM_MAX 4
#define LOOKUP_NGRAM_MIN 2

/* Writes up to k (>= 0) draft tokens for what follows hist[0..n) into out: for the
 * longest n-gram (LOOKUP_NGRAM_MAX down to LOOKUP_NGRAM_MIN) ending hist that occurs
 * earlier in hist, the tokens after its latest earlier occurrence. Returns how many were
 * written (0: no match). Scans hist once per n-gram length; allocates nothing. */
int lookup_propose(const int32_t *hist, int n, int k, int32_t *out);

#endif
