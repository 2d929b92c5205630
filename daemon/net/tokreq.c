/*
 * tokreq.c — Tokenize and Detokenize answered with a tokenizer.
 */
#include "daemon/net/tokreq.h"

#include <stdlib.h>
#include <string.h>

#include "daemon/prompt.h"

const char *tokreq_model(const Llms__Request *req)
{
    return req->body_case == LLMS__REQUEST__BODY_TOKENIZE ? req->tokenize->model
                                                          : req->detokenize->model;
}

static Llms__ErrorCode build_tokenize(const tokenizer *tok, const Llms__TokenizeRequest *t,
                                      tokreq_answer *a, char err[ERR_MAX])
{
    int n;
    if (prompt_tokenize(tok, t->text, strlen(t->text), t->has_add_special && t->add_special,
                        t->has_parse_special && t->parse_special, &a->ids, &n, err))
        return LLMS__ERROR_CODE__INTERNAL;
    llms__tokenize_response__init(&a->tokenize);
    a->tokenize.n_tokens = (size_t)n;
    a->tokenize.tokens = a->ids;
    a->r.body_case = LLMS__RESPONSE__BODY_TOKENIZE;
    a->r.tokenize = &a->tokenize;
    return LLMS__ERROR_CODE__OK;
}

static Llms__ErrorCode build_detokenize(const tokenizer *tok, const Llms__DetokenizeRequest *d,
                                        uint32_t max_frame_bytes, tokreq_answer *a,
                                        char err[ERR_MAX])
{
    int n = (int)d->n_tokens;
    int need = tok_decode(tok, d->tokens, n, false, false, NULL, 0);
    if (need < 0) {
        err_set(err, "a token id is outside the vocabulary (0..%d)", tok_n_vocab(tok) - 1);
        return LLMS__ERROR_CODE__INVALID_ARGUMENT;
    }
    /* The reply's framing takes a few bytes beside the text. */
    if ((size_t)need + 64 > max_frame_bytes) {
        err_set(err, "the text is %d bytes, more than a reply of max_frame_bytes (%u) holds",
                need, max_frame_bytes);
        return LLMS__ERROR_CODE__INVALID_ARGUMENT;
    }
    if (!(a->text = malloc((size_t)need + 1))) {
        err_set(err, "out of memory");
        return LLMS__ERROR_CODE__INTERNAL;
    }
    tok_decode(tok, d->tokens, n, false, false, a->text, (size_t)need + 1);
    /* protobuf-c strings are C strings: text after an embedded NUL byte is cut. */
    llms__detokenize_response__init(&a->detokenize);
    a->detokenize.text = a->text;
    a->r.body_case = LLMS__RESPONSE__BODY_DETOKENIZE;
    a->r.detokenize = &a->detokenize;
    return LLMS__ERROR_CODE__OK;
}

Llms__ErrorCode tokreq_answer_build(const tokenizer *tok, const Llms__Request *req,
                                    uint32_t max_frame_bytes, tokreq_answer *a,
                                    char err[ERR_MAX])
{
    memset(a, 0, sizeof *a);
    llms__response__init(&a->r);
    a->r.id = req->id;
    a->r.final = 1;
    return req->body_case == LLMS__REQUEST__BODY_TOKENIZE
               ? build_tokenize(tok, req->tokenize, a, err)
               : build_detokenize(tok, req->detokenize, max_frame_bytes, a, err);
}

void tokreq_answer_free(tokreq_answer *a)
{
    free(a->ids);
    free(a->text);
}
