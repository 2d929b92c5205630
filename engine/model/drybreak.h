/*
 * drybreak.h — DRY's sequence breakers, from text to the token sequences the sampler
 * follows (sampler_breaker), as llama.cpp makes them from its vocabulary
 * (get_overlapping_token_sequences in src/llama-sampling.cpp).
 *
 * A breaker is text ("\n", ":", a speaker's name...) that a repetition is not followed
 * back past. The sampler sees token ids, so each breaker becomes, for every token of the
 * vocabulary:
 *  - when the token's text contains it: that token alone (which DRY then never
 *    penalizes itself);
 *  - when the token's text ends with a proper start of it: that token, then the tokens
 *    of the breaker's rest as the tokenizer encodes it alone (without special tokens; at
 *    most SAMPLER_BREAKER_TAIL_MAX).
 * A token's text is what llama.cpp's detokenizer gives for it alone (tok_decode: special
 * tokens as written, SPM's leading space removed); a breaker is cut to its first
 * DRYBREAK_TEXT_MAX bytes and an empty one is left out, as llama.cpp does. Made before a
 * sampler is, never while sampling: it reads every token's text once (2 ms for a 32k SPM
 * vocabulary, 6 ms for GPT-2's 50k).
 */
#ifndef LLMS_DRYBREAK_H
#define LLMS_DRYBREAK_H

#include "engine/err.h"
#include "engine/model/sampler.h"
#include "engine/tok/tokenizer.h"

/* Bytes of a breaker taken, at most (llama.cpp's). */
#define DRYBREAK_TEXT_MAX 40

/* Breakers of one generation, at most: each reads every token's text once. */
#define DRYBREAK_MAX 64

/* llama.cpp's breakers when a request gives none: "\n", ":", "\"", "*". */
#define DRYBREAK_N_DEFAULT 4
extern const char *const drybreak_default[DRYBREAK_N_DEFAULT];

/* The sequences of the n breaker texts in tok's vocabulary, each once, into *out
 * (malloc'd; free() it), *n_out of them. 0, or -1 with err (out of memory, or the
 * tokenizer failing on a breaker's rest). */
int drybreak_tokens(const tokenizer *tok, const char *const *texts, int n,
                    sampler_breaker **out, int *n_out, char err[ERR_MAX]);

#endif
