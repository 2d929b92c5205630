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

/* The bytes of each of a's n tokens (tok_piece's: what llama.cpp's server shows as a
 * token's piece) into a->pieces, pointing into one buffer (a->text). 0, or -1 with err. */
static int build_pieces(const tokenizer *tok, tokreq_answer *a, int n, char err[ERR_MAX])
{
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        int len = tok_piece(tok, a->ids[i], NULL, 0);
        if (len < 0)
            return err_set(err, "token %d is outside the vocabulary", a->ids[i]);
        total += (size_t)len;
    }
    a->pieces = calloc(n ? (size_t)n : 1, sizeof *a->pieces);
    a->text = malloc(total + 1);
    if (!a->pieces || !a->text)
        return err_set(err, "out of memory");
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        /* each piece's NUL lands where the next one begins, the last one's in the spare
         * byte */
        int len = tok_piece(tok, a->ids[i], a->text + at, total + 1 - at);
        a->pieces[i].data = (uint8_t *)a->text + at;
        a->pieces[i].len = (size_t)len;
        at += (size_t)len;
    }
    a->tokenize.pieces = a->pieces;
    a->tokenize.n_pieces = (size_t)n;
    return 0;
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
    if (t->has_with_pieces && t->with_pieces && build_pieces(tok, a, n, err))
        return LLMS__ERROR_CODE__INTERNAL;
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
    free(a->pieces);
    free(a->text);
}
