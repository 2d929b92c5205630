/*
 * tok_spm.c — SentencePiece-style encoding ("llama" vocabularies).
 *
 * Spaces become '▁', the text is split into UTF-8 characters, and the adjacent pair
 * whose concatenation is a vocabulary token of highest score is merged (ties: the
 * leftmost) until no pair is a token. A remaining symbol that is not a token falls back
 * to its bytes' <0xXX> tokens. This is llama.cpp's algorithm, so the ids agree.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/tok/tok_internal.h"

typedef struct {
    int32_t prev, next; /* neighbours in the chain, -1 at the ends */
    uint32_t off, n;    /* bytes of the escaped text; n == 0 once merged away */
} spm_sym;

static int try_pair(const tokenizer *t, const char *esc, const spm_sym *syms, tok_merge_queue *h,
                    int32_t left, int32_t right)
{
    if (left < 0 || right < 0)
        return 0;
    uint32_t size = syms[left].n + syms[right].n;
    int32_t id = tok_lookup(t, esc + syms[left].off, size);
    if (id < 0)
        return 0;
    return tok_merge_queue_push(h, (tok_pair){t->scores[id], left, right, size});
}

int tok_spm_encode(const tokenizer *t, const char *text, size_t len, bool space_prefix, tok_out *o)
{
    static const char ws[3] = {'\xe2', '\x96', '\x81'}; /* U+2581 '▁' */
    size_t cap = (len + 1) * 3;
    char *esc = malloc(cap);
    spm_sym *syms = malloc(cap * sizeof *syms); /* invalid UTF-8 can split a '▁' */
    tok_merge_queue heap = {0};
    int rc = -1;
    if (!esc || !syms)
        goto done;

    size_t n = 0;
    if (space_prefix) {
        memcpy(esc, ws, 3);
        n = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(esc + n, ws, 3);
            n += 3;
        } else {
            esc[n++] = text[i];
        }
    }

    int32_t n_sym = 0;
    for (size_t off = 0; off < n;) {
        size_t l = tok_utf8_len((unsigned char)esc[off]);
        if (l > n - off)
            l = n - off;
        syms[n_sym] =
            (spm_sym){n_sym - 1, off + l == n ? -1 : n_sym + 1, (uint32_t)off, (uint32_t)l};
        n_sym++;
        off += l;
    }

    for (int32_t i = 1; i < n_sym; i++)
        if (try_pair(t, esc, syms, &heap, i - 1, i))
            goto done;

    while (heap.n > 0) {
        tok_pair p = tok_merge_queue_pop(&heap);
        spm_sym *l = &syms[p.left], *r = &syms[p.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != p.size)
            continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            syms[r->next].prev = p.left;
        if (try_pair(t, esc, syms, &heap, l->prev, p.left) ||
            try_pair(t, esc, syms, &heap, p.left, l->next))
            goto done;
    }

    for (int32_t i = n_sym > 0 ? 0 : -1; i >= 0; i = syms[i].next) {
        int32_t id = tok_lookup(t, esc + syms[i].off, syms[i].n);
        if (id >= 0) {
            tok_out_push(o, id);
            continue;
        }
        for (uint32_t j = 0; j < syms[i].n; j++) {
            int32_t b = t->byte_token[(unsigned char)esc[syms[i].off + j]];
            if (b >= 0)
                tok_out_push(o, b);
        }
    }
    rc = 0;
done:
    free(esc);
    free(syms);
    free(heap.v);
    return rc;
}
