/*
 * bench/ctxswitch — context switch latency of the context memory against the
 * baselines and its own ablations, with the accuracy each keeps, on one trace of calls
 * over N active contexts.
 *
 *   build/bench/ctxswitch [--models smollm,tinystories,stories260k,docs,docs-q8]
 *                         [--model PATH]
 *                         [--contexts 8,16,32] [--calls N] [--idle-ms MEAN]
 *                         [--trace random|markov|gaussian] [--min-ctx T] [--max-ctx T]
 *                         [--prompt-min T] [--prompt-max T] [--budget-contexts X]
 *                         [--threads N] [--dir DIR] [--seed S] [--systems NAME,...]
 *
 * Models (--models, each run in turn):
 *   smollm       SmolLM2-135M's shape (dim 576, 30 layers, 9 heads, 3 KV heads, FFN
 *                1536, Q8_0, the gpt-2 vocabulary from ../shared/testdata) with random
 *                weights, generated into DIR on first use (or --model PATH): the latency
 *                figures of a phone-sized model. Its tokens are random, so its accuracy
 *                figures say only how far the KV moved, not what a reader would see.
 *   tinystories  ../shared/testdata/models/TinyStories-656K-Q8_0.gguf and
 *   stories260k  stories260K.gguf: trained models, prompts cut from the children's
 *                stories below and tokenized by the model's tokenizer: the accuracy
 *                figures. Their KV is tiny, so their switch latencies are small. A missing
 *                file is skipped with a message. Context sizes are scaled to the model's
 *                window n_ctx: contexts of n_ctx/8..n_ctx/2 tokens, prompts of
 *                4..n_ctx/8 (the --min-ctx ... --prompt-max options are smollm's).
 *   docs         ../shared/testdata/models/docs-lm-21M-F16.gguf (and docs-q8, its Q8_0
 *   docs-q8      copy): a trained model of real size (6 KiB of f16 KV per token) on
 *                text it reads well, so both its latency and its accuracy figures say
 *                what a reader would see. Prompts are cut from docs/heldout.txt,
 *                tokenized as one text by the model's tokenizer; each context begins
 *                (after BOS) at a paragraph, the contexts' beginnings at least n_ctx
 *                tokens apart, so that different contexts hold different documents.
 *                Contexts fill the model's window (n_ctx 2048, which no position
 *                passes: a context that would outgrow it is replaced): grown to
 *                3/4..7/8 n_ctx tokens (1536..1792), prompts of 8..n_ctx/16 (128), so
 *                that a called context holds 1536 to about 2040 tokens; the budget of
 *                --budget-contexts counts contexts of 1792. A missing file (model or
 *                text) is skipped with a message.
 *
 * For each model and N, every system gets a fresh store and the same trace: N contexts
 * grown to sizes drawn uniformly in [min-ctx, max-ctx]; then each call picks a context
 * (Random: uniform; Markov: the k-th most recently used with probability ~ 2^-k;
 * Gaussian: by size rank, normal around the median, so moderate contexts are likelier)
 * and adds a prompt of log-uniform length in [prompt-min, prompt-max] (a context that
 * would outgrow the runner is replaced by a fresh one, unmeasured). Calls are separated
 * by idle gaps drawn from an exponential distribution of mean idle-ms (Poisson
 * arrivals; 0: back to back), in which the ahead-of-time swap-out thread writes. The
 * systems are interleaved call by call (call k of every system, in an order rotated
 * with k, before call k + 1) so that load from elsewhere on the machine hits them
 * alike; each system's call is followed by its own gap, so that its writes never run
 * beside another system's call. Before each call the page cache of the context's chunk
 * files is dropped. The KV budget holds budget-contexts contexts of max-ctx tokens in
 * f16.
 *
 * Switch latency: the time of ctx_call_begin, from the call until its context's KV is
 * complete (waits for the context's writes, making room under the budget, reads and
 * recomputes). Writes still pending when a gap ends are waited for, and that wait is
 * added to the system's next switch latency (the daemon would wait only for the writes
 * that call needs: this charges more, never less). AoT write time: from the end of a
 * call until its background writes are done (calls that wrote anything).
 *
 * Accuracy: a reference copy of every context in f16 (never compressed, never
 * evicted) gets the same batches; after each call's prompt the logits of its last row
 * (the next-token distribution) are compared with the reference's: KL(reference ||
 * system) in nats and whether the most likely token is the same.
 *
 * Systems (daemon/ctx/ctxmgr.h policies, same trace):
 *   llms             tolerance-aware compression, ahead-of-time swap-out, LCTRU,
 *                    planned read/recompute pipeline
 *   llms-nocompress  llms without compression (f16 chunks)
 *   llms-nopipeline  llms with reads and recomputes one after the other (sequential)
 *   llms-nolctru     llms reclaiming whole contexts, least recently used first
 *   kill             kill and recompute: whole contexts dropped, everything recomputed
 *   ctx-swap         whole-context swap: written when evicted (whole), read back
 *   chunk-swap       chunked swap without compression (vLLM-like): written when evicted
 *   chunk-int8       chunked swap with uniform int8
 *
 * Prints per model a line with the profiled cost models, one JSON object per (system,
 * N): latency mean / p50 / p95, its ratios to kill and to the best swapping baseline
 * (the lowest mean of ctx-swap, chunk-swap, chunk-int8 in the same run), accuracy, AoT
 * writes and how the switch-in cost models did; one summary per N saying whether llms
 * meets the target (mean switch latency >= 10x below kill, >= 3x below the best
 * swapping baseline, top-1 agreement >= 99%); and per system the largest N whose mean
 * latency stays under 25 ms and 100 ms.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench.h"
#include "daemon/ctx/ctxmgr.h"
#include "engine/gguf/gguf.h"
#include "engine/kv/kv_calib.h"
#include "engine/model/model.h"
#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"
#include "engine/readall.h"
#include "engine/tok/tokenizer.h"
#include "storage/chunks.h"

#define MAX_N 8 /* entries of --contexts */
#define MAX_CTX 64
#define N_SYSTEMS 8
#define N_SWAP_BASELINES 3

/* Children's stories written for this benchmark: the trained models' prompts. */
static const char *const story[] = {
    "Once upon a time, there was a little girl named Lily who lived in a small house "
    "near the woods.",
    "Every morning she went outside to look at the flowers and say hello to the birds.",
    "One day, Lily found a tiny red ball under a big green tree.",
    "She picked it up and said, \"Who does this ball belong to?\"",
    "A little dog ran out from behind the tree and wagged his tail.",
    "\"That is my ball,\" said the dog. \"I lost it yesterday when I was playing.\"",
    "Lily smiled and gave the ball back to the dog.",
    "The dog was very happy and jumped up and down.",
    "From that day on, Lily and the dog played together in the park every day.",
    "Once there was a boy named Tim who loved to build things with his blocks.",
    "He built a tall tower that reached all the way up to the table.",
    "His mom came in and said, \"Wow, Tim, that is a very big tower!\"",
    "Tim was proud, but then his cat jumped on the table and the tower fell down.",
    "Tim was sad at first, but his mom helped him build an even bigger tower.",
    "They laughed together, and the cat watched them from the window.",
    "In a sunny garden, a small bunny wanted to find the biggest carrot.",
    "He hopped past the roses and the tall yellow sunflowers.",
    "He asked a wise old turtle, \"Do you know where the big carrot is?\"",
    "The turtle said, \"Be patient, little bunny, and look near the fence.\"",
    "The bunny looked near the fence and found a carrot as big as his head.",
    "He shared the carrot with his friends, and they had a happy lunch.",
    "One rainy day, Sue and her brother Ben stayed inside and played with a box.",
    "They pretended the box was a boat on a big blue sea.",
    "Ben said, \"Look, Sue, I can see a whale!\" and Sue clapped her hands.",
    "When the rain stopped, they went out and jumped in the puddles.",
    "Their shoes got wet and muddy, but they did not mind at all.",
    "Mom gave them warm soup, and they told her all about the whale.",
    "There was once a little bird who was afraid to fly.",
    "Her mother said, \"You are strong, and the wind will help you.\"",
    "The little bird opened her wings and jumped from the branch.",
    "At first she fell, but then she flapped hard and went up into the sky.",
    "She flew over the river and the hills and felt very brave.",
    "A kind old man lived in a house with a blue door and a big garden.",
    "Every day he gave apples to the children who walked past his gate.",
    "One day a girl named Anna brought him a picture she had drawn.",
    "It showed the old man, his blue door, and all the apple trees.",
    "The old man hung the picture on his wall and smiled every time he saw it.",
    "The moon was bright, and a small fox could not sleep.",
    "He walked to the pond and saw the moon shining in the water.",
    "\"Good night, moon,\" said the fox, and then he went home to bed.",
};
#define N_STORY (int)(sizeof story / sizeof *story)

typedef struct options {
    const char *models, *model, *dir, *trace;
    const char *systems; /* comma-separated names to run, NULL: all */
    int n_list[MAX_N], n_n;
    int calls, min_ctx, max_ctx, prompt_min, prompt_max, threads;
    double budget_contexts, idle_ms;
    uint64_t seed;
} options;

typedef struct system_def {
    const char *name;
    ctx_policy policy;
    bool swap_baseline; /* one of the swapping baselines the target compares with */
} system_def;

static const system_def systems[N_SYSTEMS] = {
    {"llms", {.compress = CTX_COMPRESS_TOLERANCE, .compress_ratio = 0.6, .swap = CTX_SWAP_AHEAD,
              .switch_mode = CTX_SWITCH_PLAN}, false},
    {"llms-nocompress", {.compress = CTX_COMPRESS_NONE, .swap = CTX_SWAP_AHEAD,
                         .switch_mode = CTX_SWITCH_PLAN}, false},
    {"llms-nopipeline", {.compress = CTX_COMPRESS_TOLERANCE, .compress_ratio = 0.6,
                         .swap = CTX_SWAP_AHEAD, .switch_mode = CTX_SWITCH_PLAN,
                         .sequential = true}, false},
    {"llms-nolctru", {.compress = CTX_COMPRESS_TOLERANCE, .compress_ratio = 0.6,
                      .swap = CTX_SWAP_AHEAD, .switch_mode = CTX_SWITCH_PLAN,
                      .whole_context = true}, false},
    {"kill", {.compress = CTX_COMPRESS_NONE, .swap = CTX_SWAP_NONE,
              .switch_mode = CTX_SWITCH_RECOMPUTE, .whole_context = true}, false},
    {"ctx-swap", {.compress = CTX_COMPRESS_NONE, .swap = CTX_SWAP_ON_RECLAIM,
                  .switch_mode = CTX_SWITCH_READ, .whole_context = true}, true},
    {"chunk-swap", {.compress = CTX_COMPRESS_NONE, .swap = CTX_SWAP_ON_RECLAIM,
                    .switch_mode = CTX_SWITCH_READ}, true},
    {"chunk-int8", {.compress = CTX_COMPRESS_INT8, .swap = CTX_SWAP_ON_RECLAIM,
                    .switch_mode = CTX_SWITCH_READ}, true},
};

static uint64_t rng;

static double uniform(void)
{
    return bench_uniform(&rng);
}

static int uniform_int(int lo, int hi)
{
    return lo + (int)(uniform() * (hi - lo + 1));
}

static double normal(void)
{
    return bench_gauss(&rng);
}

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* What a model's contexts hold. */
enum text_kind {
    TEXT_RANDOM,  /* random ids: the generated smollm shape */
    TEXT_STORIES, /* the children's stories above */
    TEXT_DOCS,    /* the held-out documentation text */
};

/* One model and the sizes its trace uses. */
typedef struct bench {
    const options *o;
    const char *name;
    enum text_kind text;
    bool trained; /* text != TEXT_RANDOM: the accuracy figures mean something */
    model *m;
    model_runner *runner;
    int n_vocab, max_kv;
    int min_ctx, max_ctx, prompt_min, prompt_max;
    int32_t *stream; /* trained: the text as tokens */
    int *starts;     /* (n_starts) where in stream a context may begin */
    int n_stream, n_starts;
    int32_t bos;
    int32_t *tok, *pos; /* (max_kv) */
    int64_t end_us;     /* when the last call began to end (its writes start) */
    float *logits, *ref_logits; /* (n_vocab) */
} bench;

/* Token j of the context of generation g (every context ever made has its own g):
 * trained models read their text from its g-th start on (after BOS), the random
 * model gets random ids. The same for every system. */
static int32_t token_at(const bench *b, int g, int j)
{
    if (!b->trained)
        return 3 + (int32_t)(mix64(((uint64_t)g << 32) ^ (uint64_t)j ^ b->o->seed) %
                             (uint64_t)(b->n_vocab - 3));
    if (j == 0)
        return b->bos;
    return b->stream[(b->starts[g % b->n_starts] + j - 1) % b->n_stream];
}

/* One call of the trace. */
typedef struct call_def {
    int ctx;       /* index of the context called */
    int replace;   /* > 0: the context is first replaced by a fresh one of this many
                      tokens (generation gen), unmeasured */
    int gen;
    int n_prompt;
    double gap_ms; /* idle time after the call */
} call_def;

/* The trace: initial sizes and generations, then the calls. */
typedef struct trace {
    int n;
    int init[MAX_CTX], gen0[MAX_CTX];
    call_def *calls;
} trace;

/* The index of the context the trace calls next. */
static int pick(const options *o, const int *n_tokens, int n, const int *recency)
{
    if (!strcmp(o->trace, "markov")) {
        for (int k = 0; k < n - 1; k++)
            if (uniform() < 0.5)
                return recency[k];
        return recency[n - 1];
    }
    if (!strcmp(o->trace, "gaussian")) {
        int order[MAX_CTX];
        for (int i = 0; i < n; i++)
            order[i] = i;
        for (int i = 1; i < n; i++)
            for (int j = i; j > 0 && n_tokens[order[j]] < n_tokens[order[j - 1]]; j--) {
                int t = order[j];
                order[j] = order[j - 1];
                order[j - 1] = t;
            }
        int r = (int)lround((n - 1) / 2.0 + normal() * n / 4.0);
        return order[r < 0 ? 0 : r >= n ? n - 1 : r];
    }
    return uniform_int(0, n - 1);
}

static void make_trace(const bench *b, int n, trace *t)
{
    const options *o = b->o;
    int n_tokens[MAX_CTX], recency[MAX_CTX], next_gen = 0;
    rng = o->seed * 7919 + (uint64_t)n;
    t->n = n;
    for (int i = 0; i < n; i++) {
        recency[i] = i;
        t->gen0[i] = next_gen++;
        t->init[i] = n_tokens[i] = uniform_int(b->min_ctx, b->max_ctx);
    }
    for (int k = 0; k < o->calls; k++) {
        call_def *c = &t->calls[k];
        int i = pick(o, n_tokens, n, recency);
        double lo = log(b->prompt_min), hi = log(b->prompt_max);
        *c = (call_def){.ctx = i, .n_prompt = (int)exp(lo + uniform() * (hi - lo))};
        c->gap_ms = o->idle_ms > 0 ? -o->idle_ms * log(uniform()) : 0;
        if (n_tokens[i] + c->n_prompt >= b->max_kv) {
            c->replace = n_tokens[i] = b->min_ctx;
            c->gen = next_gen++;
        }
        n_tokens[i] += c->n_prompt;
        int at = 0;
        while (recency[at] != i)
            at++;
        memmove(recency + 1, recency, sizeof *recency * (size_t)at);
        recency[0] = i;
    }
}

/* Whether name is one of the comma-separated names of list. */
static bool name_listed(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; *p; p += strcspn(p, ","), p += *p == ',') {
        if (strncmp(p, name, n) == 0 && (p[n] == ',' || p[n] == '\0'))
            return true;
    }
    return false;
}

static int64_t now_us(void)
{
    return (int64_t)(bench_now_s() * 1e6);
}

/* Fills b->tok / b->pos with tokens [from, from + n) of generation g. */
static void fill_batch(bench *b, int g, int from, int n, model_batch *mb, float *logits)
{
    for (int i = 0; i < n; i++) {
        b->tok[i] = token_at(b, g, from + i);
        b->pos[i] = from + i;
    }
    static int32_t last_row; /* static: the batch points to it after this returns */
    last_row = n - 1;
    *mb = (model_batch){.n_tokens = n, .tokens = b->tok, .positions = b->pos,
                        .n_out = logits ? 1 : 0, .out_rows = logits ? &last_row : NULL,
                        .logits = logits};
}

/* Appends tokens [from, from + n) of generation g to c as one call; st (NULL: not
 * measured) gets its switch-in, *ms the time of ctx_call_begin, logits (may be NULL)
 * the last row's. */
static int call(bench *b, ctxmgr *cm, ctx_entry *c, int g, int from, int n,
                ctx_load_stats *st, double *ms, float *logits, char err[ERR_MAX])
{
    b->end_us = 0;
    double t0 = bench_now_s();
    int rc = ctx_call_begin(cm, c, b->max_kv, st, err);
    if (ms)
        *ms = (bench_now_s() - t0) * 1e3;
    if (rc)
        return rc;
    model_batch mb;
    fill_batch(b, g, from, n, &mb, logits);
    rc = ctx_forward(cm, c, &mb, err);
    if (rc == 0 && ctx_commit_turn(cm, c, "raw", "", b->tok, n, "", NULL, 0, 1, err))
        rc = -1;
    b->end_us = now_us();
    ctx_call_end(cm, c, rc == 0);
    return rc;
}

/* Observed / predicted of one part of each switch-in that ran it. */
typedef struct ratios {
    double *v;
    int n;
} ratios;

/* Their median, 0 when there are none. */
static double ratio_median(ratios *r)
{
    return r->n ? bench_median(r->v, r->n) : 0;
}

static void ratio_add(ratios *r, double observed, double predicted)
{
    if (predicted > 0 && observed > 0)
        r->v[r->n++] = observed / predicted;
}

static void print_cost(const char *model, const ctx_cost_report *r)
{
    const ctx_cost *k = &r->fit;
    printf("{\"bench\":\"ctxswitch\",\"model\":\"%s\",\"cost_models\":{\"rec_a_ms\":%.4g,"
           "\"rec_b_ms_per_token\":%.4g,\"rec_c_ms_per_token_ctx\":%.4g,\"cold_d_ms\":%.4g,"
           "\"cold_mb_s\":%.1f,\"warm_d_ms\":%.4g,\"warm_mb_s\":%.1f,\"cold_ms_per_file\":%.4g,"
           "\"warm_ms_per_file\":%.4g,\"rec_resid\":%.3f,\"cold_resid\":%.3f,"
           "\"warm_resid\":%.3f,\"samples\":%g}}\n",
           model, k->rec_a, k->rec_b, k->rec_c, k->io_d, k->io_e > 0 ? 1e-3 / k->io_e : 0,
           k->warm_d, k->warm_e > 0 ? 1e-3 / k->warm_e : 0, k->io_f, k->warm_f, k->rec_resid,
           k->io_resid, k->warm_resid, k->samples);
}

/* One system's store, manager and contexts, and what its calls measured. */
typedef struct sys_run {
    const system_def *def;
    char dir[1024];
    store *st;
    kv_pool *pool;
    ctxmgr *cm;
    ctx_entry *ctxs[MAX_CTX];
    _Atomic int64_t write_done_us; /* when the swap-out thread last finished a write */
    double carried_ms;             /* pending writes waited for after the last gap */
    double *lat, *kl, *aot;        /* (calls) */
    int n_aot, n_pending, agree;
    double predicted;
    ratios whole, rec, rd;
    int64_t bytes_read;
    int n_read, n_rec;
    double mean_ms, p50_ms, p95_ms;
} sys_run;

static void write_done(void *arg)
{
    sys_run *s = arg;
    atomic_store(&s->write_done_us, now_us());
}

static int sys_open(bench *b, sys_run *s, const system_def *def, int n, char err[ERR_MAX])
{
    const options *o = b->o;
    s->def = def;
    snprintf(s->dir, sizeof s->dir, "%s/run-%s-%s-%d", o->dir, b->name, def->name, n);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s->dir);
    if (system(cmd) != 0)
        return err_set(err, "cannot remove %s", s->dir);
    kv_shape shape = model_kv_shape(b->m);
    ctx_policy pol = def->policy;
    int ctx_chunks = (b->max_ctx + KV_CHUNK_TOKENS - 1) / KV_CHUNK_TOKENS;
    pol.budget_bytes = (size_t)(o->budget_contexts * ctx_chunks *
                                (double)kv_chunk_data_bytes(shape, KV_F16));
    s->st = store_open(s->dir, err);
    s->pool = s->st ? kv_pool_new(shape, 0, err) : NULL;
    s->cm = s->pool ? ctx_open(s->st, s->pool, b->runner, b->m, &pol, err) : NULL;
    size_t calls = (size_t)o->calls;
    s->lat = calloc(calls, sizeof *s->lat);
    s->kl = calloc(calls, sizeof *s->kl);
    s->aot = calloc(calls, sizeof *s->aot);
    s->whole.v = calloc(calls, sizeof(double));
    s->rec.v = calloc(calls, sizeof(double));
    s->rd.v = calloc(calls, sizeof(double));
    if (!s->cm)
        return -1;
    if (!s->lat || !s->kl || !s->aot || !s->whole.v || !s->rec.v || !s->rd.v)
        return err_set(err, "out of memory");
    ctx_set_write_notify(s->cm, write_done, s);
    return 0;
}

static int sys_close(sys_run *s)
{
    free(s->lat);
    free(s->kl);
    free(s->aot);
    free(s->whole.v);
    free(s->rec.v);
    free(s->rd.v);
    if (s->cm)
        ctx_flush_writes(s->cm);
    ctx_close(s->cm);
    kv_pool_free(s->pool);
    store_close(s->st);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s->dir);
    return system(cmd) != 0 ? -1 : 0;
}

/* A fresh context of n tokens of generation g in slot i. */
static int sys_grow(bench *b, sys_run *s, int i, int g, int n, char err[ERR_MAX])
{
    if (ctx_create(s->cm, 0, "bench", NULL, NULL, 1, &s->ctxs[i], err))
        return -1;
    return call(b, s->cm, s->ctxs[i], g, 0, n, NULL, NULL, NULL, err);
}

static void sleep_ms(double ms)
{
    if (ms <= 0)
        return;
    struct timespec ts = {(time_t)(ms / 1e3), (long)(fmod(ms, 1e3) * 1e6)};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

/* Call k of the trace on s (the reference's logits of it in b->ref_logits). */
static int sys_call(bench *b, sys_run *s, const call_def *c, int k, int gen,
                    char err[ERR_MAX])
{
    if (c->replace) {
        if (ctx_delete(s->cm, s->ctxs[c->ctx], err) ||
            sys_grow(b, s, c->ctx, c->gen, c->replace, err))
            return -1;
        ctx_flush_writes(s->cm);
        ctx_collect_writes(s->cm);
    }
    ctx_entry *e = s->ctxs[c->ctx];
    if (store_chunk_drop_cache(s->st, e->id, err))
        return -1;
    ctx_load_stats ls = {0};
    double ms;
    if (call(b, s->cm, e, gen, e->n_tokens, c->n_prompt, &ls, &ms, b->logits, err))
        return -1;
    int64_t end_us = b->end_us;
    s->lat[k] = ms + s->carried_ms;
    s->kl[k] = kv_calib_logits_kl(b->ref_logits, b->logits, b->n_vocab);
    s->agree += bench_argmax(b->ref_logits, b->n_vocab) == bench_argmax(b->logits, b->n_vocab);
    s->predicted += ls.predicted_ms;
    ratio_add(&s->whole, ls.load_ms, ls.predicted_ms);
    ratio_add(&s->rec, ls.rec_ms, ls.rec_predicted_ms);
    ratio_add(&s->rd, ls.read_ms, ls.read_predicted_ms);
    s->bytes_read += ls.bytes_read;
    s->n_read += ls.chunks_read;
    s->n_rec += ls.chunks_recomputed;
    /* Idle time: the swap-out thread writes; what it has not done by the end is
     * waited for now and charged to the next call. */
    sleep_ms(c->gap_ms);
    s->carried_ms = 0;
    if (ctx_writes_pending(s->cm) > 0) {
        double t0 = bench_now_s();
        ctx_flush_writes(s->cm);
        s->carried_ms = (bench_now_s() - t0) * 1e3;
        s->n_pending++;
    }
    ctx_collect_writes(s->cm);
    int64_t done = atomic_load(&s->write_done_us);
    if (done > end_us)
        s->aot[s->n_aot++] = (double)(done - end_us) / 1e3;
    return 0;
}

/* Mean, p50 and p95 of s's latencies. */
static void latency_summary(sys_run *s, int calls)
{
    double sum = 0;
    for (int k = 0; k < calls; k++)
        sum += s->lat[k];
    s->mean_ms = sum / calls;
    qsort(s->lat, (size_t)calls, sizeof *s->lat, bench_compare_doubles);
    s->p50_ms = bench_median(s->lat, calls);
    s->p95_ms = s->lat[(int)ceil(0.95 * calls) - 1];
}

static double mean(const double *v, int n)
{
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += v[i];
    return n ? sum / n : 0;
}

static void print_system(const bench *b, sys_run *s, int n, double kill_ms, double swap_ms)
{
    const options *o = b->o;
    const ctx_stats *cs = ctx_get_stats(s->cm);
    ctx_cost_report cr;
    ctx_get_cost_report(s->cm, &cr);
    double aot_mean = mean(s->aot, s->n_aot), aot_p50 = s->n_aot ? bench_median(s->aot, s->n_aot)
                                                                   : 0;
    printf("{\"bench\":\"ctxswitch\",\"model\":\"%s\",\"system\":\"%s\",\"trace\":\"%s\","
           "\"contexts\":%d,\"calls\":%d,\"idle_ms\":%g,\"mean_ms\":%.3f,\"p50_ms\":%.3f,"
           "\"p95_ms\":%.3f,\"kill_over_this\":%.2f,\"best_swap_over_this\":%.2f,"
           "\"kl_mean\":%.3g,\"top1_agreement\":%.4f,\"accuracy_meaningful\":%s,"
           "\"aot_write_ms_mean\":%.3f,\"aot_write_ms_p50\":%.3f,\"calls_writing\":%d,"
           "\"writes_pending_at_next_call\":%d,\"budget_bytes\":%zu,\"chunks_read\":%d,"
           "\"chunks_recomputed\":%d,\"bytes_read\":%lld,\"bytes_written\":%llu,"
           "\"bad_blobs\":%llu,\"faults\":%llu,\"predicted_mean_ms\":%.3f,"
           "\"observed_over_predicted\":%.3f,\"recompute_observed_over_predicted\":%.3f,"
           "\"read_observed_over_predicted\":%.3f,\"rec_fix\":%.3f,\"cold_fix\":%.3f,"
           "\"warm_fix\":%.3f,\"rec_contention\":%.3f,\"read_contention\":%.3f}\n",
           b->name, s->def->name, o->trace, n, o->calls, o->idle_ms, s->mean_ms, s->p50_ms,
           s->p95_ms, kill_ms > 0 ? kill_ms / s->mean_ms : 0,
           swap_ms > 0 ? swap_ms / s->mean_ms : 0, mean(s->kl, o->calls),
           (double)s->agree / o->calls, b->trained ? "true" : "false", aot_mean, aot_p50,
           s->n_aot, s->n_pending, ctx_get_policy(s->cm)->budget_bytes, s->n_read, s->n_rec,
           (long long)s->bytes_read, (unsigned long long)cs->bytes_written,
           (unsigned long long)cs->bad_blobs, (unsigned long long)cs->faults,
           s->predicted / o->calls, ratio_median(&s->whole), ratio_median(&s->rec),
           ratio_median(&s->rd), cr.rec_fix, cr.cold_fix, cr.warm_fix, cr.rec_contention,
           cr.read_contention);
}

/* The reference contexts: f16, in their own pool, outside any budget. */
typedef struct reference {
    kv_pool *pool;
    kv_seq seq[MAX_CTX];
    int n;
} reference;

static int ref_forward(bench *b, reference *r, int i, int g, int from, int n, float *logits,
                       char err[ERR_MAX])
{
    model_batch mb;
    fill_batch(b, g, from, n, &mb, logits);
    return model_forward(b->runner, &r->seq[i], &mb, err);
}

/* Every selected system on the trace with n contexts; mean latencies to means[]. */
static int run_n(bench *b, int n, double means[N_SYSTEMS])
{
    const options *o = b->o;
    char err[ERR_MAX] = "";
    trace t = {.calls = calloc((size_t)o->calls, sizeof(call_def))};
    sys_run *runs = calloc(N_SYSTEMS, sizeof *runs);
    reference ref = {.n = 0};
    int n_runs = 0, rc = -1, gen[MAX_CTX];
    if (!t.calls || !runs) {
        err_set(err, "out of memory");
        goto out;
    }
    make_trace(b, n, &t);
    ref.pool = kv_pool_new(model_kv_shape(b->m), 0, err);
    if (!ref.pool)
        goto out;
    for (; ref.n < n; ref.n++) {
        kv_seq_init(&ref.seq[ref.n], ref.pool);
        gen[ref.n] = t.gen0[ref.n];
        if (ref_forward(b, &ref, ref.n, gen[ref.n], 0, t.init[ref.n], NULL, err))
            goto out;
    }
    for (int s = 0; s < N_SYSTEMS; s++) {
        if (o->systems && !name_listed(o->systems, systems[s].name))
            continue;
        sys_run *r = &runs[n_runs++];
        if (sys_open(b, r, &systems[s], n, err))
            goto out;
        static const bench *cost_printed;
        if (cost_printed != b) {
            ctx_cost_report cr;
            ctx_get_cost_report(r->cm, &cr);
            print_cost(b->name, &cr);
            cost_printed = b;
        }
        for (int i = 0; i < n; i++)
            if (sys_grow(b, r, i, t.gen0[i], t.init[i], err))
                goto out;
        ctx_flush_writes(r->cm);
        ctx_collect_writes(r->cm);
    }
    for (int k = 0; k < o->calls; k++) {
        const call_def *c = &t.calls[k];
        kv_seq *rs = &ref.seq[c->ctx];
        if (c->replace) {
            kv_seq_truncate(rs, 0);
            gen[c->ctx] = c->gen;
            if (ref_forward(b, &ref, c->ctx, c->gen, 0, c->replace, NULL, err))
                goto out;
        }
        if (ref_forward(b, &ref, c->ctx, gen[c->ctx], kv_seq_n_tokens(rs), c->n_prompt,
                        b->ref_logits, err))
            goto out;
        for (int j = 0; j < n_runs; j++) {
            sys_run *r = &runs[(k + j) % n_runs];
            if (sys_call(b, r, c, k, gen[c->ctx], err)) {
                fprintf(stderr, "ctxswitch: %s: %s, %d contexts, call %d: %s\n", b->name,
                        r->def->name, n, k, err);
                goto out;
            }
        }
    }
    double kill_ms = 0, swap_ms = 0;
    for (int j = 0; j < n_runs; j++) {
        latency_summary(&runs[j], o->calls);
        if (!strcmp(runs[j].def->name, "kill"))
            kill_ms = runs[j].mean_ms;
        if (runs[j].def->swap_baseline && (swap_ms == 0 || runs[j].mean_ms < swap_ms))
            swap_ms = runs[j].mean_ms;
    }
    for (int j = 0; j < n_runs; j++) {
        print_system(b, &runs[j], n, kill_ms, swap_ms);
        means[runs[j].def - systems] = runs[j].mean_ms;
        if (runs[j].def == &systems[0]) {
            sys_run *l = &runs[j];
            double top1 = (double)l->agree / o->calls;
            bool met = kill_ms > 0 && swap_ms > 0 && kill_ms >= 10 * l->mean_ms &&
                       swap_ms >= 3 * l->mean_ms && top1 >= 0.99;
            printf("{\"bench\":\"ctxswitch\",\"model\":\"%s\",\"summary\":\"target\","
                   "\"contexts\":%d,\"llms_mean_ms\":%.3f,\"kill_mean_ms\":%.3f,"
                   "\"best_swap_mean_ms\":%.3f,\"kill_over_llms\":%.2f,"
                   "\"best_swap_over_llms\":%.2f,\"llms_top1_agreement\":%.4f,"
                   "\"accuracy_meaningful\":%s,\"target_met\":%s}\n",
                   b->name, n, l->mean_ms, kill_ms, swap_ms, kill_ms / l->mean_ms,
                   swap_ms / l->mean_ms, top1, b->trained ? "true" : "false",
                   met ? "true" : "false");
        }
    }
    fflush(stdout);
    rc = 0;
out:
    if (rc && err[0])
        fprintf(stderr, "ctxswitch: %s, %d contexts: %s\n", b->name, n, err);
    for (int j = 0; j < n_runs; j++)
        if (sys_close(&runs[j]))
            rc = -1;
    for (int i = 0; i < ref.n; i++)
        kv_seq_free(&ref.seq[i]);
    kv_pool_free(ref.pool);
    free(runs);
    free(t.calls);
    return rc;
}

/* The default model: SmolLM2-135M's shape on the gpt-2 vocabulary, generated once. */
static int default_model(const options *o, char *path, size_t cap, char err[ERR_MAX])
{
    snprintf(path, cap, "%s/smollm2-135m-shape-q8_0.gguf", o->dir);
    if (access(path, R_OK) == 0)
        return 0;
    const char *base = getenv("LLMS_TESTDATA") ? getenv("LLMS_TESTDATA") : "../shared/testdata";
    char vpath[1024];
    snprintf(vpath, sizeof vpath, "%s/vocab/ggml-vocab-gpt-2.gguf", base);
    gguf_file *v = gguf_open(vpath, err);
    if (!v)
        return -1;
    modelgen_params p = {
        .arch = "llama", .dim = 576, .n_layer = 30, .n_head = 9, .n_head_kv = 3, .n_ff = 1536,
        .n_ctx = 8192, .type = QTYPE_Q8_0, .seed = 135, .tie_output = true, .vocab = v,
        .n_threads = o->threads,
    };
    int rc = modelgen_write(&p, path, err);
    gguf_close(v);
    return rc;
}

/* The stories as b's tokens: sentence after sentence, each with its leading space, and
 * a context may begin at every sentence. */
static int tokenize_stories(bench *b, const tokenizer *tk, char err[ERR_MAX])
{
    int cap = 0;
    for (int i = 0; i < N_STORY; i++)
        cap += (int)strlen(story[i]) + 2;
    b->stream = malloc(sizeof *b->stream * (size_t)cap);
    b->starts = malloc(sizeof *b->starts * N_STORY);
    if (!b->stream || !b->starts)
        return err_set(err, "out of memory");
    char buf[512];
    for (int i = 0; i < N_STORY; i++) {
        snprintf(buf, sizeof buf, " %s", story[i]);
        b->starts[b->n_starts++] = b->n_stream;
        int got = tok_encode(tk, buf, strlen(buf), false, false, b->stream + b->n_stream,
                             cap - b->n_stream);
        if (got < 0 || got > cap - b->n_stream)
            return err_set(err, "cannot tokenize the stories");
        b->n_stream += got;
    }
    return 0;
}

/* The text of path as b's tokens, tokenized in one piece as a reader of the whole text
 * (llama.cpp's perplexity, the model's training) sees it. A context begins at a
 * paragraph (after a blank line), the beginnings at least max_kv tokens apart, so that
 * no two contexts of the first generations share text. */
static int tokenize_docs(bench *b, const tokenizer *tk, const char *path, char err[ERR_MAX])
{
    size_t len;
    char *text = readall_file(path, &len, err);
    if (!text)
        return -1;
    int rc = -1, n = tok_encode(tk, text, len, false, false, NULL, 0);
    b->stream = n > 0 ? malloc(sizeof *b->stream * (size_t)n) : NULL;
    b->starts = n > 0 ? malloc(sizeof *b->starts * (size_t)(n / b->max_kv + 1)) : NULL;
    if (n < 0 || !b->stream || !b->starts) {
        err_set(err, n < 0 ? "cannot tokenize %s" : "out of memory", path);
        goto out;
    }
    b->n_stream = tok_encode(tk, text, len, false, false, b->stream, n);
    if (b->n_stream <= b->max_kv) {
        err_set(err, "%s is shorter than a context (%d tokens)", path, b->n_stream);
        goto out;
    }
    /* Token i's text begins at byte at - prefix of the text: the pieces are the text's
     * bytes after the space the encoder may put before it. */
    int64_t pieces = 0;
    for (int i = 0; i < b->n_stream; i++)
        pieces += tok_piece(tk, b->stream[i], NULL, 0);
    int64_t prefix = pieces - (int64_t)len, at = 0;
    for (int i = 0; i < b->n_stream; i++) {
        int64_t byte = at - prefix;
        bool para = i == 0 || (byte >= 2 && text[byte - 1] == '\n' && text[byte - 2] == '\n');
        if (para && (b->n_starts == 0 || i - b->starts[b->n_starts - 1] >= b->max_kv))
            b->starts[b->n_starts++] = i;
        at += tok_piece(tk, b->stream[i], NULL, 0);
    }
    rc = 0;
out:
    free(text);
    return rc;
}

/* b's text as its tokens; BOS is every context's first token. */
static int load_text(bench *b, const char *text_path, char err[ERR_MAX])
{
    tokenizer *tk;
    if (tok_load(model_gguf(b->m), &tk, err))
        return -1;
    int rc = b->text == TEXT_DOCS ? tokenize_docs(b, tk, text_path, err)
                                  : tokenize_stories(b, tk, err);
    int32_t bos = tok_bos(tk);
    b->bos = bos >= 0 ? bos : rc == 0 ? b->stream[0] : 0;
    tok_free(tk);
    return rc;
}

/* Runs one model through every N; its contexts hold text of the kind given, docs read
 * from text_path. 1: skipped (said why), 0 done, -1 failed. */
static int run_model(const options *o, const char *name, const char *path, enum text_kind text,
                     const char *text_path)
{
    char err[ERR_MAX];
    bench b = {.o = o, .name = name, .text = text, .trained = text != TEXT_RANDOM};
    const char *absent = b.trained && access(path, R_OK) != 0                 ? path
                         : text == TEXT_DOCS && access(text_path, R_OK) != 0 ? text_path
                                                                             : NULL;
    if (absent) {
        fprintf(stderr, "ctxswitch: %s: %s is absent, skipped\n", name, absent);
        return 1;
    }
    b.m = model_load(path, err);
    if (!b.m) {
        fprintf(stderr, "ctxswitch: %s: %s\n", path, err);
        return -1;
    }
    const model_hparams *hp = model_hparams_of(b.m);
    b.n_vocab = hp->n_vocab;
    if (text == TEXT_STORIES) {
        b.min_ctx = hp->n_ctx / 8;
        b.max_ctx = hp->n_ctx / 2;
        b.prompt_min = 4;
        b.prompt_max = hp->n_ctx / 8;
    } else if (text == TEXT_DOCS) {
        b.min_ctx = hp->n_ctx * 3 / 4;
        b.max_ctx = hp->n_ctx * 7 / 8;
        b.prompt_min = 8;
        b.prompt_max = hp->n_ctx / 16;
    } else {
        b.min_ctx = o->min_ctx;
        b.max_ctx = o->max_ctx;
        b.prompt_min = o->prompt_min;
        b.prompt_max = o->prompt_max;
    }
    /* Docs contexts stay inside the window the model was trained on; the others have
     * room to grow by a fresh context's size before they are replaced. */
    b.max_kv = text == TEXT_DOCS ? hp->n_ctx : b.max_ctx + b.prompt_max + b.min_ctx;
    int rc = -1;
    b.runner = model_runner_new(b.m, o->threads, 512, b.max_kv, err);
    b.tok = malloc(sizeof *b.tok * (size_t)b.max_kv);
    b.pos = malloc(sizeof *b.pos * (size_t)b.max_kv);
    b.logits = malloc(sizeof *b.logits * (size_t)b.n_vocab);
    b.ref_logits = malloc(sizeof *b.ref_logits * (size_t)b.n_vocab);
    if (!b.runner || !b.tok || !b.pos || !b.logits || !b.ref_logits) {
        fprintf(stderr, "ctxswitch: %s: %s\n", name, b.runner ? "out of memory" : err);
        goto out;
    }
    if (b.trained && load_text(&b, text_path, err)) {
        fprintf(stderr, "ctxswitch: %s: %s\n", name, err);
        goto out;
    }
    double means[MAX_N][N_SYSTEMS] = {{0}};
    rc = 0;
    for (int i = 0; i < o->n_n; i++)
        if (run_n(&b, o->n_list[i], means[i]))
            rc = -1;
    for (int s = 0; s < N_SYSTEMS; s++) {
        if (o->systems && !name_listed(o->systems, systems[s].name))
            continue;
        int best25 = 0, best100 = 0;
        for (int i = 0; i < o->n_n; i++) {
            double m = means[i][s];
            if (m > 0 && m < 25 && o->n_list[i] > best25)
                best25 = o->n_list[i];
            if (m > 0 && m < 100 && o->n_list[i] > best100)
                best100 = o->n_list[i];
        }
        printf("{\"bench\":\"ctxswitch\",\"model\":\"%s\",\"system\":\"%s\",\"trace\":\"%s\","
               "\"max_contexts_under_25ms\":%d,\"max_contexts_under_100ms\":%d}\n",
               name, systems[s].name, o->trace, best25, best100);
    }
    fflush(stdout);
out:
    free(b.stream);
    free(b.starts);
    free(b.tok);
    free(b.pos);
    free(b.logits);
    free(b.ref_logits);
    model_runner_free(b.runner);
    model_free(b.m);
    return rc;
}

static void usage(void)
{
    fprintf(stderr, "usage: ctxswitch [--models smollm,tinystories,stories260k,docs,docs-q8] "
                    "[--model PATH] "
                    "[--contexts 8,16,32] [--calls N] [--idle-ms MEAN] "
                    "[--trace random|markov|gaussian] [--min-ctx T] [--max-ctx T] "
                    "[--prompt-min T] [--prompt-max T] [--budget-contexts X] [--threads N] "
                    "[--dir DIR] [--seed S] [--systems NAME,...]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    options o = {.models = "smollm,tinystories,stories260k", .dir = "build/bench-ctxswitch",
                 .trace = "markov", .n_list = {8, 16, 32}, .n_n = 3, .calls = 40,
                 .min_ctx = 1024, .max_ctx = 4096, .prompt_min = 10, .prompt_max = 2000,
                 .threads = 2, .budget_contexts = 2, .idle_ms = 200, .seed = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            usage();
        i++;
        if (!strcmp(a, "--model"))
            o.model = v;
        else if (!strcmp(a, "--models"))
            o.models = v;
        else if (!strcmp(a, "--dir"))
            o.dir = v;
        else if (!strcmp(a, "--trace") &&
                 (!strcmp(v, "random") || !strcmp(v, "markov") || !strcmp(v, "gaussian")))
            o.trace = v;
        else if (!strcmp(a, "--contexts")) {
            o.n_n = 0;
            for (const char *p = v; *p && o.n_n < MAX_N; p += strspn(p, ","))
                o.n_list[o.n_n++] = (int)strtol(p, (char **)&p, 10);
        } else if (!strcmp(a, "--calls"))
            o.calls = atoi(v);
        else if (!strcmp(a, "--idle-ms"))
            o.idle_ms = atof(v);
        else if (!strcmp(a, "--min-ctx"))
            o.min_ctx = atoi(v);
        else if (!strcmp(a, "--max-ctx"))
            o.max_ctx = atoi(v);
        else if (!strcmp(a, "--prompt-min"))
            o.prompt_min = atoi(v);
        else if (!strcmp(a, "--prompt-max"))
            o.prompt_max = atoi(v);
        else if (!strcmp(a, "--budget-contexts"))
            o.budget_contexts = atof(v);
        else if (!strcmp(a, "--threads"))
            o.threads = atoi(v);
        else if (!strcmp(a, "--systems"))
            o.systems = v;
        else if (!strcmp(a, "--seed"))
            o.seed = (uint64_t)atoll(v);
        else
            usage();
    }
    for (int i = 0; i < o.n_n; i++)
        if (o.n_list[i] < 1 || o.n_list[i] > MAX_CTX)
            usage();
    if (o.calls < 1 || o.min_ctx < 16 || o.max_ctx < o.min_ctx || o.prompt_min < 1 ||
        o.prompt_max < o.prompt_min || o.budget_contexts <= 0 || o.idle_ms < 0)
        usage();
    mkdir(o.dir, 0755);
    const char *base = getenv("LLMS_TESTDATA") ? getenv("LLMS_TESTDATA") : "../shared/testdata";
    static const struct {
        const char *name, *file;
        enum text_kind text;
    } trained[] = {{"tinystories", "TinyStories-656K-Q8_0.gguf", TEXT_STORIES},
                   {"stories260k", "stories260K.gguf", TEXT_STORIES},
                   {"docs", "docs-lm-21M-F16.gguf", TEXT_DOCS},
                   {"docs-q8", "docs-lm-21M-Q8_0.gguf", TEXT_DOCS}};
    char text_path[1024];
    snprintf(text_path, sizeof text_path, "%s/docs/heldout.txt", base);
    int rc = 0;
    if (name_listed(o.models, "smollm")) {
        char err[ERR_MAX], path[1024];
        if (!o.model && default_model(&o, path, sizeof path, err)) {
            fprintf(stderr, "ctxswitch: default model: %s\n", err);
            return 1;
        }
        if (run_model(&o, "smollm", o.model ? o.model : path, TEXT_RANDOM, NULL) < 0)
            rc = 1;
    }
    for (size_t i = 0; i < sizeof trained / sizeof *trained; i++) {
        if (!name_listed(o.models, trained[i].name))
            continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/models/%s", base, trained[i].file);
        if (run_model(&o, trained[i].name, path, trained[i].text, text_path) < 0)
            rc = 1;
    }
    return rc;
}
