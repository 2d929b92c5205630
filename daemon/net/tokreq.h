/*
 * tokreq.h — the answers of Tokenize and Detokenize with a given tokenizer: the loop
 * answers those for the default generate model, the worker those that name a model.
 */
#ifndef LLMS_TOKREQ_H
#define LLMS_TOKREQ_H

#include <stdint.h>

#include "engine/err.h"
#include "engine/tok/tokenizer.h"
#include "proto/llms.pb-c.h"

/* An answer and what it points to. */
typedef struct tokreq_answer {
    Llms__Response r;              /* final, ready to pack once tokreq_answer succeeded */
    Llms__TokenizeResponse tokenize;
    Llms__DetokenizeResponse detokenize;
    int32_t *ids;                  /* (tokenize.n_tokens) */
    ProtobufCBinaryData *pieces;   /* (tokenize.n_pieces) into text, when asked */
    char *text;                    /* a Detokenize's text, or the pieces' bytes */
} tokreq_answer;

/* Builds the answer of req (a Tokenize or a Detokenize) with tok; a text that would not
 * fit a reply of max_frame_bytes is refused. OK, or the error's code with err. Free the
 * answer with tokreq_answer_free either way. */
Llms__ErrorCode tokreq_answer_build(const tokenizer *tok, const Llms__Request *req,
                                    uint32_t max_frame_bytes, tokreq_answer *a,
                                    char err[ERR_MAX]);

void tokreq_answer_free(tokreq_answer *a);

/* The model a Tokenize or Detokenize names ("" or NULL: the default generate model's). */
const char *tokreq_model(const Llms__Request *req);

#endif
