/*
 * logprobs.h — a generation's log-probabilities (engine/model/logprob.h) as the
 * protocol's TokenLogprob messages, each with its token's text.
 */
#ifndef LLMS_LOGPROBS_H
#define LLMS_LOGPROBS_H

#include "engine/model/logprob.h"
#include "engine/tok/tokenizer.h"
#include "proto/llms.pb-c.h"

/* The messages of n steps; every array and piece belongs to it, and is kept for the next
 * pack (a stream packs each token's as it goes, allocating only to grow). Zero it to
 * start. */
typedef struct logprobs_pb {
    Llms__TokenLogprob *msgs;  /* (msgs_cap) each step's, then every alternative's */
    Llms__TokenLogprob **ptrs; /* (msgs_cap) the steps' first, then their tops' */
    size_t *piece_at;          /* (msgs_cap) where each message's text starts in pieces */
    size_t msgs_cap;
    size_t n_steps, n_msgs;
    char *pieces;              /* every token's text, one after another */
    size_t pieces_len, pieces_cap;
} logprobs_pb;

/* Builds the messages of steps[0..n) with the tokens' text from tok, over what pb held:
 * pb->ptrs[0..n) are the steps' (a CallChunk's or CallResult's logprobs). 0, or -1 out
 * of memory. */
int logprobs_pack(const tokenizer *tok, const logprob_step *steps, size_t n, logprobs_pb *pb);

void logprobs_pb_free(logprobs_pb *pb);

/* The longest token text of tok's vocabulary as a TokenLogprob carries it (cut as
 * logprobs_pack cuts it): what the sizes below take for every token. */
size_t logprobs_piece_max(const tokenizer *tok);

/* The most bytes one step's messages add to a CallResult on the wire: the token and its
 * n_top alternatives, each text at most piece_max bytes. */
size_t logprobs_step_wire_bytes(int n_top, size_t piece_max);

/* The most memory one step's log-probabilities take: its logprob_step, kept while the
 * reply is generated, then its messages and texts (logprobs_pack of the whole reply)
 * and its bytes of the packed CallResult at the reply's end. */
size_t logprobs_step_mem_bytes(int n_top, size_t piece_max);

#endif
