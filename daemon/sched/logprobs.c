/*
 * logprobs.c — TokenLogprob messages of a generation's steps.
 *
 * The token texts go into one buffer first and are pointed at afterwards, as the buffer
 * moves while it grows. A stream packs one token at a time into the same logprobs_pb,
 * which then allocates only while it grows.
 */
#include "daemon/sched/logprobs.h"

#include <stdlib.h>
#include <string.h>

#include "daemon/textbuf.h"

/* The longest token text kept; longer ones (none in real vocabularies) are cut. */
#define LOGPROBS_PIECE_MAX 256

/* Appends token id's text to pb's pieces; its length, or -1 out of memory. */
static long append_piece(const tokenizer *tok, int32_t id, logprobs_pb *pb)
{
    char piece[LOGPROBS_PIECE_MAX];
    int n = tok_piece(tok, id, piece, sizeof piece);
    if (n < 0)
        n = 0;
    if (n > LOGPROBS_PIECE_MAX - 1)
        n = LOGPROBS_PIECE_MAX - 1;
    if (textbuf_append(&pb->pieces, &pb->pieces_len, &pb->pieces_cap, piece, (size_t)n))
        return -1;
    return n;
}

static void init_msg(Llms__TokenLogprob *m, int32_t token, float logprob)
{
    llms__token_logprob__init(m);
    m->token = token;
    m->logprob = logprob;
}

/* Room for n_msgs messages, exactly (a stream packs the same count each token, a reply
 * once), so that logprobs_step_mem_bytes holds: 0, or -1 out of memory (pb as it was). */
static int reserve(logprobs_pb *pb, size_t n_msgs)
{
    if (n_msgs <= pb->msgs_cap)
        return 0;
    size_t cap = n_msgs;
    Llms__TokenLogprob *msgs = realloc(pb->msgs, cap * sizeof *msgs);
    if (!msgs)
        return -1;
    pb->msgs = msgs;
    Llms__TokenLogprob **ptrs = realloc(pb->ptrs, cap * sizeof *ptrs);
    if (!ptrs)
        return -1;
    pb->ptrs = ptrs;
    size_t *at = realloc(pb->piece_at, cap * sizeof *at);
    if (!at)
        return -1;
    pb->piece_at = at;
    pb->msgs_cap = cap;
    return 0;
}

int logprobs_pack(const tokenizer *tok, const logprob_step *steps, size_t n, logprobs_pb *pb)
{
    size_t n_msgs = n;
    for (size_t i = 0; i < n; i++)
        n_msgs += (size_t)steps[i].n_top;
    pb->n_steps = pb->n_msgs = 0;
    pb->pieces_len = 0;
    if (reserve(pb, n_msgs))
        return -1;
    /* steps first (ptrs[0..n) is what a reply lists), their alternatives after */
    size_t top = n;
    for (size_t i = 0; i < n; i++) {
        const logprob_step *st = &steps[i];
        init_msg(&pb->msgs[i], st->token, st->logprob);
        pb->piece_at[i] = pb->pieces_len;
        long w = append_piece(tok, st->token, pb);
        if (w < 0)
            return -1;
        pb->msgs[i].piece.len = (size_t)w;
        pb->msgs[i].n_top = (size_t)st->n_top;
        pb->msgs[i].top = &pb->ptrs[top];
        for (int k = 0; k < st->n_top; k++, top++) {
            init_msg(&pb->msgs[top], st->top_token[k], st->top_logprob[k]);
            pb->piece_at[top] = pb->pieces_len;
            if ((w = append_piece(tok, st->top_token[k], pb)) < 0)
                return -1;
            pb->msgs[top].piece.len = (size_t)w;
        }
    }
    for (size_t m = 0; m < n_msgs; m++) {
        pb->msgs[m].piece.data = (uint8_t *)pb->pieces + pb->piece_at[m];
        pb->ptrs[m] = &pb->msgs[m];
    }
    pb->n_steps = n;
    pb->n_msgs = n_msgs;
    return 0;
}

size_t logprobs_piece_max(const tokenizer *tok)
{
    size_t longest = tok_max_piece_len(tok);
    return longest < LOGPROBS_PIECE_MAX - 1 ? longest : LOGPROBS_PIECE_MAX - 1;
}

/* A TokenLogprob as an element of a repeated field: its tag and length (2 bytes: a step
 * with 20 alternatives of 255-byte texts is under 16 KiB), the token's tag and varint (an
 * id >= 0: 5 bytes at most), the logprob's tag and fixed32, the piece's tag, length
 * (2 bytes) and text. */
#define LOGPROBS_MSG_WIRE_FIXED (1 + 2 + 1 + 5 + 1 + 4 + 1 + 2)

size_t logprobs_step_wire_bytes(int n_top, size_t piece_max)
{
    return (size_t)(1 + n_top) * (LOGPROBS_MSG_WIRE_FIXED + piece_max);
}

size_t logprobs_step_mem_bytes(int n_top, size_t piece_max)
{
    /* a message, its pointer and its text's offset each; the texts' buffer grows by
     * doubling, so up to twice their bytes */
    size_t per_msg = sizeof(Llms__TokenLogprob) + sizeof(Llms__TokenLogprob *) +
                     sizeof(size_t) + 2 * piece_max;
    return sizeof(logprob_step) + (size_t)(1 + n_top) * per_msg +
           logprobs_step_wire_bytes(n_top, piece_max);
}

void logprobs_pb_free(logprobs_pb *pb)
{
    free(pb->msgs);
    free(pb->ptrs);
    free(pb->piece_at);
    free(pb->pieces);
    memset(pb, 0, sizeof *pb);
}
