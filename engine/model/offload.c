/*
 * offload.c — a runner's forwards on a GPU (offload.h): the device copies of the host
 * sequences, and the step handed to the CUDA backend (engine/cuda/cuda.h).
 */
#include "engine/model/offload.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cuda/cuda.h"

/* Device sequences kept at most (each holds max_kv entries of every layer). */
#define OFFLOAD_MAX_COPIES 256

typedef struct offload_copy {
    const kv_seq *host; /* whose copy this is, or NULL when free */
    cuda_seq *dev;
    uint64_t used;      /* the step that last ran it */
} offload_copy;

struct offload {
    const model *m;
    cuda_model *cm;
    int max_batch;
    int n_vocab;
    uint64_t step;
    int32_t *slice_out;  /* (max_batch) a sub-batch's out rows (offload_slice) */
    int n_copies;
    offload_copy copies[OFFLOAD_MAX_COPIES];
};

offload *offload_new(const model *m, int device, int max_batch, int max_kv, char err[ERR_MAX])
{
    offload *o = calloc(1, sizeof *o);
    if (!o) {
        snprintf(err, ERR_MAX, "out of memory");
        return NULL;
    }
    o->m = m;
    o->n_vocab = model_hparams_of(m)->n_vocab;
    if (!(o->cm = cuda_model_new(m, device, max_batch, max_kv, err))) {
        free(o);
        return NULL;
    }
    o->max_batch = cuda_model_max_batch(o->cm);
    if (!(o->slice_out = malloc((size_t)o->max_batch * sizeof *o->slice_out))) {
        snprintf(err, ERR_MAX, "out of memory");
        offload_free(o);
        return NULL;
    }
    return o;
}

void offload_free(offload *o)
{
    if (!o)
        return;
    for (int i = 0; i < o->n_copies; i++)
        cuda_seq_free(o->copies[i].dev);
    cuda_model_free(o->cm);
    free(o->slice_out);
    free(o);
}

const char *offload_device_name(const offload *o)
{
    return cuda_model_device_name(o->cm);
}

bool offload_takes(const offload *o, int n_seq, const model_batch *batches)
{
    for (int i = 0; i < n_seq; i++)
        if (batches[i].hidden || batches[i].attn ||
            (batches[i].model && batches[i].model != o->m))
            return false;
    return true;
}

/* The device copy of host, made (or taken from the least recently used copy that no
 * sequence of this step holds) when it has none; NULL + err when none can be had. */
static offload_copy *offload_copy_of(offload *o, const kv_seq *host, char err[ERR_MAX])
{
    offload_copy *lru = NULL;
    for (int i = 0; i < o->n_copies; i++) {
        offload_copy *c = &o->copies[i];
        if (c->host == host)
            return c;
        if (c->used != o->step && (!lru || c->used < lru->used))
            lru = c;
    }
    if (o->n_copies < OFFLOAD_MAX_COPIES) {
        char why[ERR_MAX];
        cuda_seq *dev = cuda_seq_new(o->cm, why);
        if (dev) {
            offload_copy *c = &o->copies[o->n_copies++];
            *c = (offload_copy){.host = host, .dev = dev};
            return c;
        }
        if (!lru) {
            snprintf(err, ERR_MAX, "gpu: no room for another sequence: %.200s", why);
            return NULL;
        }
    }
    if (!lru) {
        snprintf(err, ERR_MAX, "gpu: more than %d sequences in one step", OFFLOAD_MAX_COPIES);
        return NULL;
    }
    lru->host = host;
    cuda_seq_truncate(lru->dev, 0);
    return lru;
}

/* Entries the copy shares with host's first n: its length, or the first whose token or
 * position differs. */
static int offload_common_prefix(const cuda_seq *dev, const int32_t *dev_tokens,
                                 const int32_t *dev_pos, const kv_seq *host, int n)
{
    int limit = cuda_seq_n_tokens(dev) < n ? cuda_seq_n_tokens(dev) : n, at = 0;
    for (int c = 0; c < host->n_chunks && at < limit; c++) {
        const kv_chunk *ch = host->chunks[c];
        for (int e = 0; e < ch->n_tokens && at < limit; e++, at++)
            if (ch->tokens[e] != dev_tokens[at] || ch->positions[e] != dev_pos[at])
                return at;
    }
    return at;
}

/* Brings the copy up to host's first n entries. */
static int offload_sync(offload_copy *c, const kv_seq *host, int n, char err[ERR_MAX])
{
    const int32_t *tokens, *positions;
    cuda_seq_entries(c->dev, &tokens, &positions);
    int same = offload_common_prefix(c->dev, tokens, positions, host, n);
    if (same == cuda_seq_n_tokens(c->dev) && same == n)
        return 0;
    cuda_seq_truncate(c->dev, same);
    return cuda_seq_from_host(c->dev, host, same, err);
}

/* Rows [t0, t0 + max_batch) of a single batch: its out rows in that range, shifted. */
static model_batch offload_slice(const model_batch *b, int t0, int n, int n_vocab, int dim,
                                 int32_t *out_rows)
{
    model_batch s = *b;
    s.n_tokens = n;
    s.tokens = b->tokens + t0;
    s.positions = b->positions + t0;
    int o0 = 0;
    while (o0 < b->n_out && b->out_rows[o0] < t0)
        o0++;
    s.n_out = 0;
    for (int o = o0; o < b->n_out && b->out_rows[o] < t0 + n; o++)
        out_rows[s.n_out++] = b->out_rows[o] - t0;
    s.out_rows = out_rows;
    s.logits = b->logits ? b->logits + (size_t)o0 * n_vocab : NULL;
    s.hidden_last = b->hidden_last ? b->hidden_last + (size_t)o0 * dim : NULL;
    return s;
}

int offload_forward_batch(offload *o, int n_seq, kv_seq *const *seqs,
                          const model_batch *batches, const int *n_before, char err[ERR_MAX])
{
    cuda_seq *devs[OFFLOAD_MAX_COPIES];
    if (n_seq > OFFLOAD_MAX_COPIES) {
        snprintf(err, ERR_MAX, "gpu: more than %d sequences in one step", OFFLOAD_MAX_COPIES);
        return -1;
    }
    o->step++;
    for (int i = 0; i < n_seq; i++) {
        offload_copy *c = offload_copy_of(o, seqs[i], err);
        if (!c)
            return -1;
        c->used = o->step;
        devs[i] = c->dev;
        /* the chunks' data complete before any is read: every layer at once */
        for (int l = 0; batches[i].layer_ready && l < model_hparams_of(o->m)->n_layer; l++)
            batches[i].layer_ready(batches[i].layer_ready_arg, l);
        if (offload_sync(c, seqs[i], n_before[i], err) < 0)
            return -1;
    }
    if (n_seq > 1 || batches[0].n_tokens <= o->max_batch)
        return cuda_forward_batch(o->cm, n_seq, devs, batches, NULL, seqs, err);

    const model_batch *b = &batches[0];
    int rc = 0, dim = model_hparams_of(o->m)->dim;
    for (int t0 = 0; t0 < b->n_tokens && rc == 0; t0 += o->max_batch) {
        int n = b->n_tokens - t0 < o->max_batch ? b->n_tokens - t0 : o->max_batch;
        model_batch s = offload_slice(b, t0, n, o->n_vocab, dim, o->slice_out);
        rc = cuda_forward_batch(o->cm, 1, devs, &s, NULL, seqs, err);
    }
    return rc;
}
