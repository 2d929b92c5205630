/*
 * ctxload.c — switch-in: bringing a context's missing chunks in, partly read from the
 * store and partly recomputed from their token ids, and faults.
 *
 * Plan: chunks the store lacks (or holds corrupt, stale or unreadable) must be
 * recomputed; of the stored ones, those dearest to read per token are recomputed too
 * while that lowers max(T_recompute, T_read) under the cost models (the two run at
 * once). A chunk's read cost depends on whether its file is in the page cache (measured
 * with mincore when it is opened, store_chunk_reader_cached): a cached chunk costs the
 * warm line, the rest of it the cold one.
 *
 * Measurement: every switch-in times its two parts, recompute as the forward's time less
 * its waits for reads, read as the time to open the chunks read plus the reader's, and
 * hands them with the plan's predictions to ctx_cost_observe (online refinement).
 *
 * Pipeline: chunks to read are allocated up front; a reader thread fills them layer by
 * layer (layer l of every chunk, then layer l + 1) while the worker runs one forward over
 * the tokens of all chunks to recompute, at their original positions, against a
 * sequence of the chunks before them; the forward's layer_ready hook waits for layer l of
 * the read chunks, so reading layer l + 1 overlaps computing layer l. Since every chunk
 * before the last one to recompute is full and each chunk to recompute except a partial
 * tail holds 16 tokens, the forward's new entries fill exactly one new chunk per chunk
 * recomputed, which then take their slots.
 *
 * A read that fails (checksum, size, I/O) invalidates the chunk and everything computed
 * from it: the chunk loses its stored copy and the plan is made again, so it is
 * recomputed. Wrong KV is never kept.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/ctxmem.h"
#include "storage/chunks.h"

typedef struct load_read {
    int index;
    kv_chunk *kv;              /* allocated at the stored precision, filled by the reader */
    store_chunk_reader *rd;
    bool failed;
} load_read;

typedef struct reader {
    load_read *reads;          /* (n) */
    int n;
    kv_shape shape;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int layers_done;           /* under mu: layers read (or given up) for every chunk */
    double ms;                 /* the reader's time, set when it is done */
    double wait_ms;            /* the forward's time blocked in layer_ready (its thread) */
} reader;

static void read_layer(reader *r, int l)
{
    char err[ERR_MAX];
    for (int k = 0; k < r->n; k++) {
        load_read *x = &r->reads[k];
        if (x->failed)
            continue;
        size_t bytes = kv_chunk_layer_bytes(r->shape, x->kv->precision);
        if (store_chunk_read_section(x->rd, l, kv_chunk_layer(x->kv, r->shape, l), bytes, err))
            x->failed = true;
    }
}

static void *reader_main(void *arg)
{
    reader *r = arg;
    double t0 = ctx_mono_ms();
    for (int l = 0; l < r->shape.n_layer; l++) {
        read_layer(r, l);
        pthread_mutex_lock(&r->mu);
        r->layers_done = l + 1;
        if (l + 1 == r->shape.n_layer)
            r->ms = ctx_mono_ms() - t0;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
    }
    return NULL;
}

static void layer_ready(void *arg, int layer)
{
    reader *r = arg;
    double t0 = ctx_mono_ms();
    pthread_mutex_lock(&r->mu);
    while (r->layers_done <= layer)
        pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
    r->wait_ms += ctx_mono_ms() - t0;
}

/* Opens chunk i's blob and checks it against the history: sizes of every section and
 * the token ids it was computed from. NULL when it cannot be used; *stale then says
 * whether the blob is sound but of other tokens (a history that moved on), not
 * corrupt or missing. */
static store_chunk_reader *open_checked(ctxmgr *cm, ctx_entry *c, int i, bool *stale)
{
    char err[ERR_MAX];
    bool found;
    *stale = false;
    const ctx_chunk *k = &c->map[i];
    int nt = ctx_chunk_tokens(c->n_tokens, i), n_layer = cm->shape.n_layer;
    store_chunk_reader *rd = store_chunk_open(cm->st, c->id, i, &found, err);
    if (!rd)
        return NULL;
    const store_chunk *meta = store_chunk_reader_meta(rd);
    bool ok = meta->precision == k->disk_precision && meta->n_tokens == nt &&
              meta->n_sections == n_layer + 1 &&
              store_chunk_section_bytes(rd, n_layer) == sizeof(int32_t) * (size_t)nt;
    for (int l = 0; ok && l < n_layer; l++)
        ok = store_chunk_section_bytes(rd, l) ==
             kv_chunk_layer_bytes(cm->shape, (enum kv_precision)k->disk_precision);
    int32_t tokens[KV_CHUNK_TOKENS];
    size_t tbytes = sizeof *tokens * (size_t)nt;
    ok = ok && store_chunk_read_section(rd, n_layer, tokens, tbytes, err) == 0;
    *stale = ok && memcmp(tokens, c->tokens + i * KV_CHUNK_TOKENS, tbytes) != 0;
    if (!ok || *stale) {
        store_chunk_close(rd);
        return NULL;
    }
    return rd;
}

static enum kv_precision disk_prec(const ctx_entry *c, int i)
{
    return (enum kv_precision)c->map[i].disk_precision;
}

static void forget_blob(ctxmgr *cm, ctx_entry *c, int i, bool stale)
{
    c->map[i].disk_precision = -1;
    c->map[i].dirty = true;
    if (stale)
        cm->stats.stale_blobs++;
    else
        cm->stats.bad_blobs++;
}

/* A stored chunk that could be read. */
typedef struct cand {
    int index;
    int tokens;
    double warm_bytes, cold_bytes; /* its bytes split by the share in the page cache */
    double read_ms;                /* what reading it adds (corrected models) */
    double open_ms;                /* opening and checking it took */
} cand;

static int cand_dearest_first(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    double px = x->read_ms / x->tokens, py = y->read_ms / y->tokens;
    if (px != py)
        return px > py ? -1 : 1;
    return x->index - y->index;
}

/* What a plan predicts: the fitted lines per model, and the corrected whole. */
typedef struct prediction {
    double fitted[CTX_N_MODELS];
    double rec_ms, read_ms;
} prediction;

static void predict(const ctxmgr *cm, int64_t rec_tokens, int64_t ctx, double warm,
                    double cold, prediction *p)
{
    p->fitted[CTX_MODEL_REC] = ctx_cost_recompute(&cm->cost, rec_tokens, ctx);
    p->fitted[CTX_MODEL_COLD] = ctx_cost_read_cold(&cm->cost, cold);
    p->fitted[CTX_MODEL_WARM] = ctx_cost_read_warm(&cm->cost, warm);
    p->rec_ms = p->fitted[CTX_MODEL_REC] * ctx_cost_fix(cm, CTX_MODEL_REC);
    p->read_ms = p->fitted[CTX_MODEL_COLD] * ctx_cost_fix(cm, CTX_MODEL_COLD) +
                 p->fitted[CTX_MODEL_WARM] * ctx_cost_fix(cm, CTX_MODEL_WARM);
}

/* How many of the n stored candidates (dearest first) to recompute beside the
 * rec_tokens tokens that must be; with plan false none (but *pred is filled in). */
static int plan_split(const ctxmgr *cm, const ctx_entry *c, const cand *d, int n,
                      int64_t rec_tokens, bool plan, prediction *pred)
{
    double warm = 0, cold = 0;
    for (int j = 0; j < n; j++) {
        warm += d[j].warm_bytes;
        cold += d[j].cold_bytes;
    }
    int best = 0;
    double best_t = 0;
    for (int j = 0; j <= (plan ? n : 0); j++) {
        prediction p;
        predict(cm, rec_tokens, c->n_tokens, warm, cold, &p);
        double t = p.rec_ms > p.read_ms ? p.rec_ms : p.read_ms;
        if (j == 0 || t < best_t) {
            best = j;
            best_t = t;
            *pred = p;
        }
        if (j < n) {
            rec_tokens += d[j].tokens;
            /* the sums of the rest, not running differences: no rounding drift */
            warm = cold = 0;
            for (int i = j + 1; i < n; i++) {
                warm += d[i].warm_bytes;
                cold += d[i].cold_bytes;
            }
        }
    }
    return best;
}

/* Recomputes chunks rec[0..n_rec) (ascending) against the resident chunks and the
 * chunks being read before them; their new chunks go to out. */
static int recompute(ctxmgr *cm, ctx_entry *c, const int *rec, int n_rec, load_read *reads,
                     int n_reads, reader *rdr, kv_chunk **out, char err[ERR_MAX])
{
    int last = rec[n_rec - 1], n_tok = 0;
    for (int j = 0; j < n_rec; j++)
        n_tok += ctx_chunk_tokens(c->n_tokens, rec[j]);
    int32_t *pos = malloc(sizeof *pos * (size_t)n_tok);
    int32_t *tok = malloc(sizeof *tok * (size_t)n_tok);
    kv_seq tmp;
    kv_seq_init(&tmp, cm->pool);
    int rc = -1;
    if (!pos || !tok) {
        err_set(err, "out of memory");
        goto out;
    }
    for (int j = 0, t = 0; j < n_rec; j++)
        for (int e = 0; e < ctx_chunk_tokens(c->n_tokens, rec[j]); e++, t++) {
            pos[t] = rec[j] * KV_CHUNK_TOKENS + e;
            tok[t] = c->tokens[pos[t]];
        }
    for (int i = 0, r = 0; i < last; i++) {
        while (r < n_reads && reads[r].index < i)
            r++;
        kv_chunk *k = c->seq.chunks[i];
        if (!k && r < n_reads && reads[r].index == i)
            k = reads[r].kv;
        if (k && kv_seq_push_chunk(&tmp, k, err))
            goto out;
    }
    int n_before = tmp.n_chunks;
    model_batch b = {
        .n_tokens = n_tok,
        .tokens = tok,
        .positions = pos,
        .layer_ready = rdr ? layer_ready : NULL,
        .layer_ready_arg = rdr,
    };
    if (model_forward(cm->runner, &tmp, &b, err))
        goto out;
    if (tmp.n_chunks - n_before != n_rec) {
        for (int j = n_before; j < tmp.n_chunks; j++)
            kv_chunk_free(cm->pool, tmp.chunks[j]);
        err_set(err, "recompute made %d chunks for %d", tmp.n_chunks - n_before, n_rec);
        goto out;
    }
    for (int j = 0; j < n_rec; j++)
        out[j] = tmp.chunks[n_before + j];
    rc = 0;
out:
    /* The sequence borrowed every chunk: detach them before freeing it. */
    tmp.n_chunks = 0;
    kv_seq_free(&tmp);
    free(pos);
    free(tok);
    return rc;
}

/* One attempt: 0 done, 1 a read failed (its chunk lost its stored copy: plan again),
 * -1 / CTX_E_BUDGET failure. obs gets the plan's predictions and the parts' times
 * (obs->total_ms stays < 0 when nothing was missing). */
static int load_once(ctxmgr *cm, ctx_entry *c, int upto, ctx_load_stats *st,
                     ctx_cost_obs *obs, char err[ERR_MAX])
{
    int n_miss = 0;
    for (int i = 0; i <= upto; i++) {
        kv_chunk *k = c->seq.chunks[i];
        if (k && k->n_tokens != ctx_chunk_tokens(c->n_tokens, i)) {
            /* Resident but short of the history (its last tokens were never
             * evaluated): rebuilt like a missing one. */
            kv_chunk_free(cm->pool, k);
            c->seq.chunks[i] = NULL;
            c->map[i].dirty = true;
        }
        n_miss += c->seq.chunks[i] == NULL;
    }
    if (n_miss == 0)
        return 0;
    load_read *reads = calloc((size_t)n_miss, sizeof *reads);
    cand *d = calloc((size_t)n_miss, sizeof *d);
    int *rec = calloc((size_t)n_miss, sizeof *rec);
    kv_chunk **made = calloc((size_t)n_miss, sizeof *made);
    bool *to_rec = calloc((size_t)upto + 1, sizeof *to_rec);
    int rc = -1, n_d = 0, n_reads = 0, n_rec = 0;
    int64_t rec_tokens = 0;
    if (!reads || !d || !rec || !made || !to_rec) {
        err_set(err, "out of memory");
        goto out;
    }
    /* Which stored chunks can be read at all. */
    for (int i = 0; i <= upto; i++) {
        if (c->seq.chunks[i])
            continue;
        store_chunk_reader *rd = NULL;
        double t0 = ctx_mono_ms();
        if (c->map[i].disk_precision >= 0 && cm->policy.switch_mode != CTX_SWITCH_RECOMPUTE) {
            bool stale;
            rd = open_checked(cm, c, i, &stale);
            if (!rd)
                forget_blob(cm, c, i, stale);
        }
        if (rd) {
            double bytes = (double)kv_chunk_data_bytes(cm->shape, disk_prec(c, i));
            double cached = store_chunk_reader_cached(rd);
            cand *x = &d[n_d];
            reads[n_d].index = i;
            reads[n_d].rd = rd;
            x->index = i;
            x->tokens = ctx_chunk_tokens(c->n_tokens, i);
            /* unknown (-1): taken as cold, as the disk is the slower case */
            x->warm_bytes = cached > 0 ? cached * bytes : 0;
            x->cold_bytes = bytes - x->warm_bytes;
            x->read_ms = cm->cost.warm_e * ctx_cost_fix(cm, CTX_MODEL_WARM) * x->warm_bytes +
                         cm->cost.io_e * ctx_cost_fix(cm, CTX_MODEL_COLD) * x->cold_bytes;
            x->open_ms = ctx_mono_ms() - t0;
            n_d++;
        } else {
            to_rec[i] = true;
            rec_tokens += ctx_chunk_tokens(c->n_tokens, i);
        }
    }
    qsort(d, (size_t)n_d, sizeof *d, cand_dearest_first);
    prediction pred;
    int n_extra = plan_split(cm, c, d, n_d, rec_tokens,
                             cm->policy.switch_mode == CTX_SWITCH_PLAN, &pred);
    double open_ms = 0;
    for (int j = 0; j < n_d; j++) {
        if (j < n_extra)
            to_rec[d[j].index] = true;
        else
            open_ms += d[j].open_ms;
    }
    /* reads[] is in index order; keep those not chosen for recompute. */
    for (int j = 0; j < n_d; j++) {
        if (to_rec[reads[j].index])
            store_chunk_close(reads[j].rd);
        else
            reads[n_reads++] = reads[j];
    }
    for (int i = 0; i <= upto; i++)
        if (to_rec[i])
            rec[n_rec++] = i;
    size_t need = (size_t)n_rec * kv_chunk_data_bytes(cm->shape, KV_F16);
    for (int j = 0; j < n_reads; j++)
        need += kv_chunk_data_bytes(cm->shape, disk_prec(c, reads[j].index));
    rc = ctx_claim(cm, need, err);
    if (rc)
        goto out;
    rc = -1;
    for (int j = 0; j < n_reads; j++) {
        int i = reads[j].index;
        kv_chunk *k = kv_chunk_new_precision(cm->pool, disk_prec(c, i), err);
        if (!k)
            goto out;
        k->n_tokens = ctx_chunk_tokens(c->n_tokens, i);
        for (int e = 0; e < k->n_tokens; e++) {
            k->positions[e] = i * KV_CHUNK_TOKENS + e;
            k->tokens[e] = c->tokens[k->positions[e]];
        }
        reads[j].kv = k;
    }
    reader rdr = {.reads = reads, .n = n_reads, .shape = cm->shape};
    bool threaded = n_reads > 0 && n_rec > 0;
    pthread_t th;
    if (threaded) {
        pthread_mutex_init(&rdr.mu, NULL);
        pthread_cond_init(&rdr.cv, NULL);
        if (pthread_create(&th, NULL, reader_main, &rdr)) {
            pthread_mutex_destroy(&rdr.mu);
            pthread_cond_destroy(&rdr.cv);
            threaded = false;
        }
    }
    if (!threaded) {
        double t0 = ctx_mono_ms();
        for (int l = 0; l < cm->shape.n_layer; l++)
            read_layer(&rdr, l);
        rdr.ms = ctx_mono_ms() - t0;
    }
    reader *hook = threaded ? &rdr : NULL;
    double t_rec = ctx_mono_ms();
    int rrc = n_rec ? recompute(cm, c, rec, n_rec, reads, n_reads, hook, made, err) : 0;
    t_rec = ctx_mono_ms() - t_rec;
    if (threaded) {
        pthread_join(th, NULL);
        pthread_mutex_destroy(&rdr.mu);
        pthread_cond_destroy(&rdr.cv);
    }
    memcpy(obs->fitted, pred.fitted, sizeof obs->fitted);
    obs->rec_ms = n_rec ? t_rec - rdr.wait_ms : -1;
    obs->read_ms = n_reads ? open_ms + rdr.ms : -1;
    obs->total_ms = 0;
    st->predicted_ms = pred.rec_ms > pred.read_ms ? pred.rec_ms : pred.read_ms;
    st->rec_predicted_ms = n_rec ? pred.rec_ms : 0;
    st->read_predicted_ms = n_reads ? pred.read_ms : 0;
    st->rec_ms = n_rec ? obs->rec_ms : 0;
    st->read_ms = n_reads ? obs->read_ms : 0;
    bool bad_before_last = false;
    int n_bad = 0;
    for (int j = 0; j < n_reads; j++) {
        int i = reads[j].index;
        st->bytes_read += store_chunk_reader_bytes_read(reads[j].rd);
        if (reads[j].failed) {
            forget_blob(cm, c, i, false);
            kv_chunk_free(cm->pool, reads[j].kv);
            n_bad++;
            bad_before_last |= n_rec > 0 && i < rec[n_rec - 1];
        } else {
            c->seq.chunks[i] = reads[j].kv;
            st->chunks_read++;
        }
        reads[j].kv = NULL;
    }
    if (rrc || bad_before_last) {
        /* Recomputed chunks that attended to a failed read are wrong: dropped. */
        for (int j = 0; j < n_rec; j++)
            kv_chunk_free(cm->pool, made[j]);
        rc = rrc ? rrc : 1;
        goto out;
    }
    for (int j = 0; j < n_rec; j++) {
        /* A chunk the store holds compressed is used at that precision, so that the
         * context's KV does not depend on whether it was read or recomputed. */
        int p = c->map[rec[j]].disk_precision;
        if (p > KV_F16)
            kv_chunk_convert(cm->pool, made[j], (enum kv_precision)p, err);
        c->seq.chunks[rec[j]] = made[j];
        st->chunks_recomputed++;
    }
    rc = n_bad ? 1 : 0;
out:
    for (int j = 0; reads && j < n_reads; j++) {
        kv_chunk_free(cm->pool, reads[j].kv);
        store_chunk_close(reads[j].rd);
    }
    free(reads);
    free(d);
    free(rec);
    free(made);
    free(to_rec);
    return rc;
}

int ctx_load_range(ctxmgr *cm, ctx_entry *c, int upto, ctx_load_stats *st, char err[ERR_MAX])
{
    ctx_load_stats got = {0};
    ctx_cost_obs obs = {.total_ms = -1};
    for (int i = 0; i <= upto; i++)
        got.chunks_resident += c->seq.chunks[i] != NULL;
    double t0 = ctx_mono_ms();
    int rc;
    while ((rc = load_once(cm, c, upto, &got, &obs, err)) == 1)
        ;
    if (rc == 0 && obs.total_ms >= 0) {
        obs.total_ms = ctx_mono_ms() - t0;
        ctx_cost_observe(cm, &obs);
    }
    cm->stats.bytes_read += (uint64_t)got.bytes_read;
    cm->stats.chunks_read += (uint64_t)got.chunks_read;
    cm->stats.chunks_recomputed += (uint64_t)got.chunks_recomputed;
    if (st) {
        st->predicted_ms = got.predicted_ms;
        st->rec_ms = got.rec_ms;
        st->rec_predicted_ms = got.rec_predicted_ms;
        st->read_ms = got.read_ms;
        st->read_predicted_ms = got.read_predicted_ms;
        st->bytes_read += got.bytes_read;
        st->chunks_read += got.chunks_read;
        st->chunks_recomputed += got.chunks_recomputed;
        st->chunks_resident += got.chunks_resident;
    }
    return rc;
}

int ctx_fault(void *arg, kv_seq *seq, int index, char err[ERR_MAX])
{
    ctx_entry *c = arg;
    ctxmgr *cm = c->cm;
    (void)seq;
    cm->stats.faults++;
    if (index >= c->n_map)
        return err_set(err, "context %s: chunk %d is beyond the history", c->id, index);
    /* Locked while it loads, so that making room does not drop its own chunks. */
    bool was_busy = c->busy;
    c->busy = true;
    int rc = ctx_load_range(cm, c, index, NULL, err);
    c->busy = was_busy;
    return rc ? -1 : 0;
}
