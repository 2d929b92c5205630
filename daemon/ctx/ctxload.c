/*
 * ctxload.c — switch-in: bringing a context's missing chunks in, partly read from the
 * store and partly recomputed from their token ids, and faults.
 *
 * Plan: chunks the store lacks (or holds corrupt, stale or unreadable) must be
 * recomputed; of the stored ones, those dearest to read per token are recomputed too
 * while that lowers the predicted time under the cost models (the two run at once:
 * predict() says how they combine). A chunk's read cost depends on whether its file is
 * in the page cache (cachestat or mincore when it is opened, store_chunk_reader_cached):
 * a cached chunk costs the warm line, the rest of it the cold one.
 *
 * Measurement: every switch-in times its two parts, recompute as the forward's time less
 * its waits for reads, read as the reader's time, and hands them with the plan's
 * predictions to ctx_cost_observe (online refinement).
 *
 * Pipeline: the worker only looks the stored chunks up and opens their files (nothing is
 * read from a file before the plan, so a chunk the plan recomputes costs no disk time);
 * chunks to read are allocated up front; a reader thread reads and checks their headers
 * and token ids, then fills them layer by layer (layer l of every chunk, then layer
 * l + 1) while the worker runs one forward over the tokens of all chunks to recompute,
 * at their original positions, against a sequence of the chunks before them; the
 * forward's layer_ready hook waits for layer l of the read chunks it attends to (those
 * before the last chunk recomputed, which the reader serves first), so reading layer
 * l + 1 overlaps computing layer l. Since every chunk before the last one to recompute
 * is full and each chunk to recompute except a partial tail holds 16 tokens, the
 * forward's new entries fill exactly one new chunk per chunk recomputed, which then
 * take their slots. Under the sequential policy (an ablation) the reader reads every
 * chunk first and the forward runs after it, and the plan prices that.
 *
 * Reads no forward waits for (a switch-in that recomputes nothing, or the sequential
 * policy's) are shared among CTX_READERS threads, so that the disk serves several chunk
 * files at once. The profile reads one file after another; the online corrections of
 * the read lines take up what the overlap saves.
 *
 * A read that fails (checksum, size, I/O, or a blob of other token ids: stale)
 * invalidates the chunk and everything computed from it: the chunk loses its stored copy
 * and the plan is made again, so it is recomputed. Wrong KV is never kept.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/ctx/ctxmem.h"
#include "engine/clock.h"
#include "storage/chunks.h"

typedef struct load_read {
    int index;
    uint8_t layers[KV_MAX_LAYERS]; /* (n_layer) the stored layers' precisions */
    kv_chunk *kv;              /* allocated at the stored precisions, filled by the reader */
    store_chunk_reader *rd;    /* opened, header not read yet */
    const int32_t *tokens;     /* (kv->n_tokens) the history's, which the blob must hold */
    bool failed;
    bool stale;                /* failed because the blob holds other token ids */
} load_read;

typedef struct reader {
    load_read *reads;          /* (n) in index order */
    int n;
    int n_needed;              /* reads[0, n_needed) come before a recomputed chunk: the
                                  forward attends to them, so they are read first */
    kv_shape shape;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int layers_done;           /* under mu: layers read (or given up) for every needed
                                  chunk */
    double ms;                 /* the reader's time, set when it is done */
    double wait_ms;            /* the forward's time blocked in layer_ready (its thread) */
} reader;

/* Reads x's header and token ids and checks them against the history: sizes of every
 * section (each layer's at its precision) and the token ids the blob was computed
 * from. */
static void check_blob(reader *r, load_read *x)
{
    char err[ERR_MAX];
    int n_layer = r->shape.n_layer, nt = x->kv->n_tokens;
    bool mixed = x->kv->precision == KV_MIXED;
    const store_chunk *meta = store_chunk_reader_meta(x->rd);
    bool ok = store_chunk_read_header(x->rd, err) == 0 &&
              meta->precision == (int)x->kv->precision && meta->n_tokens == nt &&
              meta->n_sections == n_layer + 1 + mixed &&
              store_chunk_section_bytes(x->rd, n_layer) == sizeof(int32_t) * (size_t)nt;
    for (int l = 0; ok && l < n_layer; l++)
        ok = store_chunk_section_bytes(x->rd, l) == kv_chunk_section_bytes(x->kv, r->shape, l);
    int32_t tokens[KV_CHUNK_TOKENS];
    size_t tbytes = sizeof *tokens * (size_t)nt;
    ok = ok && store_chunk_read_section(x->rd, n_layer, tokens, tbytes, err) == 0;
    x->stale = ok && memcmp(tokens, x->tokens, tbytes) != 0;
    x->failed = !ok || x->stale;
}

static void read_layer(reader *r, int l, int from, int to)
{
    char err[ERR_MAX];
    for (int k = from; k < to; k++) {
        load_read *x = &r->reads[k];
        if (x->failed)
            continue;
        size_t bytes = kv_chunk_section_bytes(x->kv, r->shape, l);
        if (store_chunk_read_section(x->rd, l, kv_chunk_layer(x->kv, r->shape, l), bytes, err))
            x->failed = true;
    }
}

static void set_layers_done(reader *r, int n)
{
    pthread_mutex_lock(&r->mu);
    r->layers_done = n;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* Reads [from, to): headers and token ids, then layer by layer; with signal each layer
 * done is announced to layer_ready. */
static void read_range(reader *r, int from, int to, bool signal)
{
    for (int k = from; k < to; k++)
        check_blob(r, &r->reads[k]);
    for (int l = 0; l < r->shape.n_layer; l++) {
        read_layer(r, l, from, to);
        if (signal)
            set_layers_done(r, l + 1);
    }
}

/* Threads that share reads no forward waits for. A cold chunk file costs mostly the
 * disk's latency, which requests in flight together overlap: 100 cold files of 36 KiB
 * (docs-lm-21M chunks) read in 0.3-0.7 ms each by one thread, in 0.14-0.24 ms by four
 * on the 2-core virtual machine bench/ctxswitch was run on. */
#define CTX_READERS 4

/* A part of the reads, for one thread. */
typedef struct read_slice {
    reader *r;
    int from, to;
    bool started; /* on a thread of its own */
    pthread_t th;
} read_slice;

static void *read_slice_main(void *arg)
{
    read_slice *s = arg;
    read_range(s->r, s->from, s->to, false);
    return NULL;
}

/* Reads every chunk of r, in up to CTX_READERS slices of at least two chunks: this
 * thread reads the first (and any whose thread could not start), one thread each the
 * others. */
static void read_shared(reader *r)
{
    read_slice s[CTX_READERS];
    int n = r->n / 2 < CTX_READERS ? r->n / 2 : CTX_READERS;
    if (n < 1)
        n = 1;
    for (int t = 0; t < n; t++) {
        s[t] = (read_slice){.r = r, .from = r->n * t / n, .to = r->n * (t + 1) / n};
        if (t > 0)
            s[t].started = pthread_create(&s[t].th, NULL, read_slice_main, &s[t]) == 0;
    }
    for (int t = 0; t < n; t++)
        if (!s[t].started)
            read_range(r, s[t].from, s[t].to, false);
    for (int t = 1; t < n; t++)
        if (s[t].started)
            pthread_join(s[t].th, NULL);
}

/* The needed chunks first, layer by layer as the forward waits for them, then the
 * others (which only have to be complete when the forward is). */
static void *reader_main(void *arg)
{
    reader *r = arg;
    double t0 = clock_mono_ms();
    read_range(r, 0, r->n_needed, true);
    if (r->n_needed == 0)
        set_layers_done(r, r->shape.n_layer);
    read_range(r, r->n_needed, r->n, false);
    r->ms = clock_mono_ms() - t0;
    return NULL;
}

static void layer_ready(void *arg, int layer)
{
    reader *r = arg;
    double t0 = clock_mono_ms();
    pthread_mutex_lock(&r->mu);
    while (r->layers_done <= layer)
        pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
    r->wait_ms += clock_mono_ms() - t0;
}

size_t ctx_disk_data_bytes(const ctxmgr *cm, const ctx_entry *c, int i)
{
    const ctx_chunk *k = &c->map[i];
    if (k->disk_precision != KV_MIXED)
        return kv_chunk_data_bytes(cm->shape, (enum kv_precision)k->disk_precision);
    return (size_t)k->disk_bytes - sizeof(int32_t) * (size_t)ctx_chunk_tokens(c->n_tokens, i) -
           (size_t)cm->shape.n_layer;
}

int ctx_disk_layers(ctxmgr *cm, ctx_entry *c, int i, store_chunk_reader *rd,
                    uint8_t *layers)
{
    ctx_chunk *k = &c->map[i];
    int n_layer = cm->shape.n_layer;
    uint8_t *known = c->disk_layers + (size_t)i * n_layer;
    if (k->disk_precision != KV_MIXED) {
        memset(layers, k->disk_precision, (size_t)n_layer);
        return 0;
    }
    if (!k->disk_layers_known) {
        char err[ERR_MAX];
        if (!rd || store_chunk_read_header(rd, err) ||
            store_chunk_section_bytes(rd, n_layer + 1) != (size_t)n_layer ||
            store_chunk_read_section(rd, n_layer + 1, known, (size_t)n_layer, err))
            return -1;
        for (int l = 0; l < n_layer; l++)
            if (!kv_precision_valid(known[l]))
                return -1;
        if (kv_layers_data_bytes(cm->shape, known) != ctx_disk_data_bytes(cm, c, i))
            return -1;
        k->disk_layers_known = true;
    }
    memcpy(layers, known, (size_t)n_layer);
    return 0;
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

/* Reading: files (counted by their share) and bytes, out of or in the page cache. */
typedef struct io_work {
    double chunks, bytes;
} io_work;

static void io_add(io_work *to, const io_work *w)
{
    to->chunks += w->chunks;
    to->bytes += w->bytes;
}

/* A stored chunk that could be read. */
typedef struct cand {
    int index;
    int tokens;
    io_work warm, cold;            /* the chunk split by its share in the page cache */
    double read_ms;                /* what reading it adds (corrected models) */
} cand;

static int cand_dearest_first(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    double px = x->read_ms / x->tokens, py = y->read_ms / y->tokens;
    if (px != py)
        return px > py ? -1 : 1;
    return x->index - y->index;
}

/* What a plan predicts: the fitted lines per model (all its reads), and with
 * corrections its parts and its whole. */
typedef struct prediction {
    double fitted[CTX_N_MODELS];
    double rec_ms, read_ms, total_ms;
} prediction;

/* Corrected read time of warm and cold work; fitted (may be NULL) gets the lines'. */
static double read_ms(const ctxmgr *cm, const io_work *warm, const io_work *cold,
                      double *fitted)
{
    double c = ctx_cost_read_cold(&cm->cost, cold->chunks, cold->bytes);
    double w = ctx_cost_read_warm(&cm->cost, warm->chunks, warm->bytes);
    if (fitted) {
        fitted[CTX_MODEL_COLD] = c;
        fitted[CTX_MODEL_WARM] = w;
    }
    return c * ctx_cost_fix(cm, CTX_MODEL_COLD) + w * ctx_cost_fix(cm, CTX_MODEL_WARM);
}

/*
 * The plan that recomputes d[0, j) beside the chunks that must be (rec_tokens in all
 * then, the last of them at index last) and reads d[j, n). The forward attends to the
 * chunks before the last one it recomputes, so it cannot finish before those are read:
 * with reads that front-load their cost (a cold file's first access fetches most of it)
 * that is read(needed) + recompute, and the whole is never less than read(all).
 */
static void predict(const ctxmgr *cm, const ctx_entry *c, const cand *d, int j, int n,
                    int64_t rec_tokens, int last, prediction *p)
{
    io_work warm = {0, 0}, cold = {0, 0}, warm_needed = {0, 0}, cold_needed = {0, 0};
    for (int i = j; i < n; i++) {
        io_add(&warm, &d[i].warm);
        io_add(&cold, &d[i].cold);
        if (d[i].index < last) {
            io_add(&warm_needed, &d[i].warm);
            io_add(&cold_needed, &d[i].cold);
        }
    }
    p->fitted[CTX_MODEL_REC] = ctx_cost_recompute(&cm->cost, rec_tokens, c->n_tokens);
    p->rec_ms = p->fitted[CTX_MODEL_REC] * ctx_cost_fix(cm, CTX_MODEL_REC);
    p->read_ms = read_ms(cm, &warm, &cold, p->fitted);
    double needed = read_ms(cm, &warm_needed, &cold_needed, NULL);
    if (p->rec_ms > 0 && p->read_ms > 0 && !cm->policy.sequential) {
        double read_slower = ctx_cost_contention(cm, CTX_PART_READ);
        p->rec_ms *= ctx_cost_contention(cm, CTX_PART_REC);
        p->read_ms *= read_slower;
        needed *= read_slower;
    }
    double chain = p->rec_ms > 0 ? needed + p->rec_ms : 0;
    p->total_ms = chain > p->read_ms ? chain : p->read_ms;
    if (cm->policy.sequential) /* one part after the other, no contention */
        p->total_ms = p->rec_ms + p->read_ms;
}

/* How many of the n stored candidates (dearest first) to recompute beside the
 * rec_tokens tokens that must be, the last of them at index last (-1: none); with plan
 * false none (but *pred is filled in). */
static int plan_split(const ctxmgr *cm, const ctx_entry *c, const cand *d, int n,
                      int64_t rec_tokens, int last, bool plan, prediction *pred)
{
    int best = 0;
    for (int j = 0; j <= (plan ? n : 0); j++) {
        prediction p;
        predict(cm, c, d, j, n, rec_tokens, last, &p);
        if (j == 0 || p.total_ms < pred->total_ms) {
            best = j;
            *pred = p;
        }
        if (j < n) {
            rec_tokens += d[j].tokens;
            last = d[j].index > last ? d[j].index : last;
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
    int rc = -1, n_d = 0, n_reads = 0, n_rec = 0, last_rec = -1;
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
        if (c->map[i].disk_precision >= 0 && cm->policy.switch_mode != CTX_SWITCH_RECOMPUTE) {
            char e2[ERR_MAX];
            bool found;
            rd = store_chunk_open_deferred(cm->st, c->id, i, &found, e2);
            /* A mixed blob's table, unknown after a restart, is read now: the chunk is
             * allocated with its layers' sizes before the reader starts. */
            if (rd && ctx_disk_layers(cm, c, i, rd, reads[n_d].layers)) {
                store_chunk_close(rd);
                rd = NULL;
            }
            if (!rd)
                forget_blob(cm, c, i, false);
        }
        if (rd) {
            double bytes = (double)ctx_disk_data_bytes(cm, c, i);
            double cached = store_chunk_reader_cached(rd);
            cand *x = &d[n_d];
            reads[n_d].index = i;
            reads[n_d].rd = rd;
            x->index = i;
            x->tokens = ctx_chunk_tokens(c->n_tokens, i);
            /* unknown (-1): taken as cold, as the disk is the slower case */
            double share = cached > 0 ? cached : 0;
            const ctx_cost *k = &cm->cost;
            x->warm = (io_work){share, share * bytes};
            x->cold = (io_work){1 - share, (1 - share) * bytes};
            x->read_ms = (k->warm_f * x->warm.chunks + k->warm_e * x->warm.bytes) *
                             ctx_cost_fix(cm, CTX_MODEL_WARM) +
                         (k->io_f * x->cold.chunks + k->io_e * x->cold.bytes) *
                             ctx_cost_fix(cm, CTX_MODEL_COLD);
            n_d++;
        } else {
            to_rec[i] = true;
            rec_tokens += ctx_chunk_tokens(c->n_tokens, i);
            last_rec = i;
        }
    }
    qsort(d, (size_t)n_d, sizeof *d, cand_dearest_first);
    prediction pred = {.total_ms = 0};
    int n_extra = plan_split(cm, c, d, n_d, rec_tokens, last_rec,
                             cm->policy.switch_mode == CTX_SWITCH_PLAN, &pred);
    for (int j = 0; j < n_extra; j++)
        to_rec[d[j].index] = true;
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
        need += ctx_disk_data_bytes(cm, c, reads[j].index);
    rc = ctx_claim(cm, need, err);
    if (rc)
        goto out;
    rc = -1;
    /* What the plan predicts starts here: making room (reclaim, writes) is not its. */
    double t_load = clock_mono_ms();
    for (int j = 0; j < n_reads; j++) {
        int i = reads[j].index;
        kv_chunk *k = kv_chunk_new_layers(cm->pool, reads[j].layers, err);
        if (!k)
            goto out;
        k->n_tokens = ctx_chunk_tokens(c->n_tokens, i);
        for (int e = 0; e < k->n_tokens; e++) {
            k->positions[e] = i * KV_CHUNK_TOKENS + e;
            k->tokens[e] = c->tokens[k->positions[e]];
        }
        reads[j].kv = k;
        reads[j].tokens = c->tokens + i * KV_CHUNK_TOKENS;
    }
    reader rdr = {.reads = reads, .n = n_reads, .shape = cm->shape};
    while (n_rec > 0 && rdr.n_needed < n_reads && reads[rdr.n_needed].index < rec[n_rec - 1])
        rdr.n_needed++;
    bool threaded = n_reads > 0 && n_rec > 0 && !cm->policy.sequential;
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
        double t0 = clock_mono_ms();
        read_shared(&rdr);
        rdr.ms = clock_mono_ms() - t0;
    }
    reader *hook = threaded ? &rdr : NULL;
    double t_rec = clock_mono_ms();
    int rrc = n_rec ? recompute(cm, c, rec, n_rec, reads, n_reads, hook, made, err) : 0;
    t_rec = clock_mono_ms() - t_rec;
    if (threaded) {
        pthread_join(th, NULL);
        pthread_mutex_destroy(&rdr.mu);
        pthread_cond_destroy(&rdr.cv);
    }
    memcpy(obs->fitted, pred.fitted, sizeof obs->fitted);
    obs->rec_ms = n_rec ? t_rec - rdr.wait_ms : -1;
    obs->read_ms = n_reads ? rdr.ms : -1;
    obs->rec_predicted_ms = pred.rec_ms;
    obs->read_predicted_ms = pred.read_ms;
    obs->total_predicted_ms = pred.total_ms;
    st->predicted_ms = pred.total_ms;
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
            forget_blob(cm, c, i, reads[j].stale);
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
         * context's KV does not depend on whether it was read or recomputed. A mixed
         * blob's table is known: read when its file was opened. */
        uint8_t layers[KV_MAX_LAYERS];
        if (c->map[rec[j]].disk_precision > KV_F16 &&
            ctx_disk_layers(cm, c, rec[j], NULL, layers) == 0)
            kv_chunk_convert_layers(cm->pool, made[j], layers, err);
        c->seq.chunks[rec[j]] = made[j];
        st->chunks_recomputed++;
    }
    obs->total_ms = st->load_ms = clock_mono_ms() - t_load;
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
    int rc;
    while ((rc = load_once(cm, c, upto, &got, &obs, err)) == 1)
        ;
    if (rc == 0 && obs.total_ms >= 0)
        ctx_cost_observe(cm, &obs);
    cm->stats.bytes_read += (uint64_t)got.bytes_read;
    cm->stats.chunks_read += (uint64_t)got.chunks_read;
    cm->stats.chunks_recomputed += (uint64_t)got.chunks_recomputed;
    if (st) {
        st->load_ms = got.load_ms;
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
