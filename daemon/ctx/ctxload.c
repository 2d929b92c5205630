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

/* One attempt's plan: the missing chunks it reads from the store and those it
 * recomputes, with what it predicts. */
typedef struct load_plan {
    load_read *reads;   /* (n_reads) the chunks read, in index order */
    int n_reads;
    cand *cands;        /* (n_cands) the stored chunks that could be read */
    int n_cands;
    bool *to_rec;       /* (upto + 1) whether chunk i is recomputed */
    int *rec;           /* (n_rec) the chunks recomputed, ascending */
    int n_rec;
    kv_chunk **made;    /* (n_rec) their new chunks, until they take their slots */
    int64_t rec_tokens; /* tokens of the chunks that cannot be read */
    int last_rec;       /* the last of those (-1: none) */
    prediction pred;
} load_plan;

/* Drops the resident chunks of [0, upto] that are short of the history (their last
 * tokens were never evaluated), to be rebuilt like missing ones; returns how many
 * chunks are missing then. */
static int drop_short_and_count_missing(ctxmgr *cm, ctx_entry *c, int upto)
{
    int n_miss = 0;
    for (int i = 0; i <= upto; i++) {
        kv_chunk *k = c->seq.chunks[i];
        if (k && k->n_tokens != ctx_chunk_tokens(c->n_tokens, i)) {
            kv_chunk_free(cm->pool, k);
            c->seq.chunks[i] = NULL;
            c->map[i].dirty = true;
        }
        n_miss += c->seq.chunks[i] == NULL;
    }
    return n_miss;
}

static int plan_alloc(load_plan *p, int n_miss, int upto, char err[ERR_MAX])
{
    *p = (load_plan){.last_rec = -1};
    p->reads = calloc((size_t)n_miss, sizeof *p->reads);
    p->cands = calloc((size_t)n_miss, sizeof *p->cands);
    p->rec = calloc((size_t)n_miss, sizeof *p->rec);
    p->made = calloc((size_t)n_miss, sizeof *p->made);
    p->to_rec = calloc((size_t)upto + 1, sizeof *p->to_rec);
    if (!p->reads || !p->cands || !p->rec || !p->made || !p->to_rec)
        return err_set(err, "out of memory");
    return 0;
}

/* Frees the plan with the chunks and files it still holds. */
static void plan_free(ctxmgr *cm, load_plan *p)
{
    for (int j = 0; p->reads && j < p->n_reads; j++) {
        kv_chunk_free(cm->pool, p->reads[j].kv);
        store_chunk_close(p->reads[j].rd);
    }
    for (int j = 0; p->made && j < p->n_rec; j++)
        kv_chunk_free(cm->pool, p->made[j]);
    free(p->reads);
    free(p->cands);
    free(p->rec);
    free(p->made);
    free(p->to_rec);
}

/* Opens the stored copies of the missing chunks of [0, upto] that can be read (their
 * files, no data), each a candidate priced by the read lines; the others must be
 * recomputed. */
static void plan_open_stored(ctxmgr *cm, ctx_entry *c, int upto, load_plan *p)
{
    for (int i = 0; i <= upto; i++) {
        if (c->seq.chunks[i])
            continue;
        load_read *x = &p->reads[p->n_cands];
        store_chunk_reader *rd = NULL;
        if (c->map[i].disk_precision >= 0 && cm->policy.switch_mode != CTX_SWITCH_RECOMPUTE) {
            char e2[ERR_MAX];
            bool found;
            rd = store_chunk_open_deferred(cm->st, c->id, i, &found, e2);
            /* A mixed blob's table, unknown after a restart, is read now: the chunk is
             * allocated with its layers' sizes before the reader starts. */
            if (rd && ctx_disk_layers(cm, c, i, rd, x->layers)) {
                store_chunk_close(rd);
                rd = NULL;
            }
            if (!rd)
                forget_blob(cm, c, i, false);
        }
        if (!rd) {
            p->to_rec[i] = true;
            p->rec_tokens += ctx_chunk_tokens(c->n_tokens, i);
            p->last_rec = i;
            continue;
        }
        double bytes = (double)ctx_disk_data_bytes(cm, c, i);
        double cached = store_chunk_reader_cached(rd);
        /* unknown (-1): taken as cold, as the disk is the slower case */
        double share = cached > 0 ? cached : 0;
        const ctx_cost *k = &cm->cost;
        cand *d = &p->cands[p->n_cands++];
        x->index = i;
        x->rd = rd;
        d->index = i;
        d->tokens = ctx_chunk_tokens(c->n_tokens, i);
        d->warm = (io_work){share, share * bytes};
        d->cold = (io_work){1 - share, (1 - share) * bytes};
        d->read_ms = (k->warm_f * d->warm.chunks + k->warm_e * d->warm.bytes) *
                         ctx_cost_fix(cm, CTX_MODEL_WARM) +
                     (k->io_f * d->cold.chunks + k->io_e * d->cold.bytes) *
                         ctx_cost_fix(cm, CTX_MODEL_COLD);
    }
}

/* Chooses the candidates to recompute as well (plan_split, dearest per token first),
 * closes their files, and lists every chunk to recompute. */
static void plan_choose(const ctxmgr *cm, const ctx_entry *c, int upto, load_plan *p)
{
    qsort(p->cands, (size_t)p->n_cands, sizeof *p->cands, cand_dearest_first);
    int n_extra = plan_split(cm, c, p->cands, p->n_cands, p->rec_tokens, p->last_rec,
                             cm->policy.switch_mode == CTX_SWITCH_PLAN, &p->pred);
    for (int j = 0; j < n_extra; j++)
        p->to_rec[p->cands[j].index] = true;
    /* reads[0, n_cands) is in index order; those recomputed leave it */
    for (int j = 0; j < p->n_cands; j++) {
        if (p->to_rec[p->reads[j].index])
            store_chunk_close(p->reads[j].rd);
        else
            p->reads[p->n_reads++] = p->reads[j];
    }
    for (int i = 0; i <= upto; i++)
        if (p->to_rec[i])
            p->rec[p->n_rec++] = i;
}

/* Memory the plan's chunks take once loaded: recomputed ones in f16, read ones at their
 * stored precisions. */
static size_t plan_bytes(const ctxmgr *cm, const ctx_entry *c, const load_plan *p)
{
    size_t need = (size_t)p->n_rec * kv_chunk_data_bytes(cm->shape, KV_F16);
    for (int j = 0; j < p->n_reads; j++)
        need += ctx_disk_data_bytes(cm, c, p->reads[j].index);
    return need;
}

/* Allocates the chunks to read, at their stored layers' precisions, with the history's
 * token ids and positions (which their blobs must hold). */
static int plan_alloc_read_chunks(ctxmgr *cm, const ctx_entry *c, load_plan *p,
                                  char err[ERR_MAX])
{
    for (int j = 0; j < p->n_reads; j++) {
        load_read *x = &p->reads[j];
        kv_chunk *k = kv_chunk_new_layers(cm->pool, x->layers, err);
        if (!k)
            return -1;
        k->n_tokens = ctx_chunk_tokens(c->n_tokens, x->index);
        for (int e = 0; e < k->n_tokens; e++) {
            k->positions[e] = x->index * KV_CHUNK_TOKENS + e;
            k->tokens[e] = c->tokens[k->positions[e]];
        }
        x->kv = k;
        x->tokens = c->tokens + x->index * KV_CHUNK_TOKENS;
    }
    return 0;
}

/* Reads and recomputes, at once on a reader thread (or the reads first, shared among
 * threads, under the sequential policy or when nothing is recomputed); obs gets the two
 * parts' times. Returns recompute's result. */
static int plan_run(ctxmgr *cm, ctx_entry *c, load_plan *p, ctx_cost_obs *obs,
                    char err[ERR_MAX])
{
    int n_rec = p->n_rec, n_reads = p->n_reads;
    reader rdr = {.reads = p->reads, .n = n_reads, .shape = cm->shape};
    while (n_rec > 0 && rdr.n_needed < n_reads &&
           p->reads[rdr.n_needed].index < p->rec[n_rec - 1])
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
    double t_rec = clock_mono_ms();
    int rc = n_rec ? recompute(cm, c, p->rec, n_rec, p->reads, n_reads,
                               threaded ? &rdr : NULL, p->made, err)
                   : 0;
    t_rec = clock_mono_ms() - t_rec;
    if (threaded) {
        pthread_join(th, NULL);
        pthread_mutex_destroy(&rdr.mu);
        pthread_cond_destroy(&rdr.cv);
    }
    obs->rec_ms = n_rec ? t_rec - rdr.wait_ms : -1;
    obs->read_ms = n_reads ? rdr.ms : -1;
    return rc;
}

/* The plan's predictions beside the measured times, for ctx_cost_observe and the
 * caller's statistics. */
static void plan_report(const load_plan *p, ctx_cost_obs *obs, ctx_load_stats *st)
{
    memcpy(obs->fitted, p->pred.fitted, sizeof obs->fitted);
    obs->rec_predicted_ms = p->pred.rec_ms;
    obs->read_predicted_ms = p->pred.read_ms;
    obs->total_predicted_ms = p->pred.total_ms;
    st->predicted_ms = p->pred.total_ms;
    st->rec_predicted_ms = p->n_rec ? p->pred.rec_ms : 0;
    st->read_predicted_ms = p->n_reads ? p->pred.read_ms : 0;
    st->rec_ms = p->n_rec ? obs->rec_ms : 0;
    st->read_ms = p->n_reads ? obs->read_ms : 0;
}

/* The chunks read take their slots; one whose read failed loses its stored copy.
 * Returns how many failed; *bad_before_last: one of them came before the last chunk
 * recomputed, which attended to it. */
static int adopt_reads(ctxmgr *cm, ctx_entry *c, load_plan *p, ctx_load_stats *st,
                       bool *bad_before_last)
{
    int n_bad = 0, last = p->n_rec > 0 ? p->rec[p->n_rec - 1] : -1;
    *bad_before_last = false;
    for (int j = 0; j < p->n_reads; j++) {
        load_read *x = &p->reads[j];
        st->bytes_read += store_chunk_reader_bytes_read(x->rd);
        if (x->failed) {
            forget_blob(cm, c, x->index, x->stale);
            kv_chunk_free(cm->pool, x->kv);
            n_bad++;
            *bad_before_last |= x->index < last;
        } else {
            c->seq.chunks[x->index] = x->kv;
            st->chunks_read++;
        }
        x->kv = NULL;
    }
    return n_bad;
}

/* The recomputed chunks take their slots. One the store holds compressed is used at
 * that precision, so that the context's KV does not depend on whether it was read or
 * recomputed (a mixed blob's table is known: read when its file was opened). */
static void adopt_recomputed(ctxmgr *cm, ctx_entry *c, load_plan *p, ctx_load_stats *st,
                             char err[ERR_MAX])
{
    for (int j = 0; j < p->n_rec; j++) {
        int i = p->rec[j];
        uint8_t layers[KV_MAX_LAYERS];
        if (c->map[i].disk_precision > KV_F16 && ctx_disk_layers(cm, c, i, NULL, layers) == 0)
            kv_chunk_convert_layers(cm->pool, p->made[j], layers, err);
        c->seq.chunks[i] = p->made[j];
        p->made[j] = NULL;
        st->chunks_recomputed++;
    }
}

/* One attempt: 0 done, 1 a read failed (its chunk lost its stored copy: plan again),
 * -1 / CTX_E_BUDGET failure. obs gets the plan's predictions and the parts' times
 * (obs->total_ms stays < 0 when nothing was missing). */
static int load_once(ctxmgr *cm, ctx_entry *c, int upto, ctx_load_stats *st,
                     ctx_cost_obs *obs, char err[ERR_MAX])
{
    int n_miss = drop_short_and_count_missing(cm, c, upto);
    if (n_miss == 0)
        return 0;
    load_plan p;
    int rc = plan_alloc(&p, n_miss, upto, err);
    if (rc)
        goto out;
    plan_open_stored(cm, c, upto, &p);
    plan_choose(cm, c, upto, &p);
    rc = ctx_claim(cm, plan_bytes(cm, c, &p), err);
    if (rc)
        goto out;
    rc = -1;
    /* What the plan predicts starts here: making room (reclaim, writes) is not its. */
    double t_load = clock_mono_ms();
    if (plan_alloc_read_chunks(cm, c, &p, err))
        goto out;
    int rec_rc = plan_run(cm, c, &p, obs, err);
    plan_report(&p, obs, st);
    bool bad_before_last;
    int n_bad = adopt_reads(cm, c, &p, st, &bad_before_last);
    if (rec_rc || bad_before_last) {
        /* Recomputed chunks that attended to a failed read are wrong: plan_free drops
         * them. */
        rc = rec_rc ? rec_rc : 1;
        goto out;
    }
    adopt_recomputed(cm, c, &p, st, err);
    obs->total_ms = st->load_ms = clock_mono_ms() - t_load;
    rc = n_bad ? 1 : 0;
out:
    plan_free(cm, &p);
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
