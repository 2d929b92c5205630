/*
 * bench/ctxswitch — context switch latency of the context memory against the
 * baselines, on one trace of calls over N active contexts.
 *
 *   build/bench/ctxswitch [--model PATH] [--contexts 2,4,8,16] [--calls N]
 *                         [--trace random|markov|gaussian] [--min-ctx T] [--max-ctx T]
 *                         [--prompt-min T] [--prompt-max T] [--budget-contexts X]
 *                         [--threads N] [--dir DIR] [--seed S] [--systems NAME,...]
 *
 * Model: --model, or by default a SmolLM2-135M-shaped llama (dim 576, 30 layers, 9
 * heads, 3 KV heads, FFN 1536, Q8_0, the gpt-2 vocabulary from ../shared/testdata)
 * generated into DIR on first use.
 *
 * For each N and each system, a fresh store: N contexts are grown to sizes drawn
 * uniformly in [min-ctx, max-ctx]; then the trace is replayed: each call picks a context
 * (Random: uniform; Markov: the k-th most recently used with probability ~ 2^-k;
 * Gaussian: by size rank, normal around the median, so moderate contexts are likelier)
 * and adds a prompt of log-uniform length in [prompt-min, prompt-max] (a context that
 * would outgrow the runner is replaced by a fresh one, unmeasured). Before each call the
 * page cache of the context's chunk files is dropped. The switch latency is the time of
 * ctx_call_begin: from the call until its context's KV is complete (arrivals are
 * replayed back to back, so no queueing is counted; ahead-of-time writes happen after
 * the previous call, as in idle time). The KV budget holds budget-contexts contexts of
 * max-ctx tokens in f16.
 *
 * Systems (daemon/ctxmgr.h policies, same trace):
 *   llms          tolerance-aware compression, ahead-of-time swap-out, LCTRU, planned
 *                 read/recompute pipeline
 *   kill          kill and recompute: whole contexts dropped, everything recomputed
 *   ctx-swap      whole-context swap: written when evicted (whole), read back
 *   chunk-swap    chunked swap without compression (vLLM-like): written when evicted
 *   chunk-int8    chunked swap with uniform int8
 *
 * Prints one JSON object per (system, N) and one per system with the largest N whose
 * mean latency stays under 25 ms and 100 ms. Each (system, N) line also says how the
 * switch-in cost models (daemon/ctxmgr.h) did: the mean prediction, the median of
 * observed / predicted over its switch-ins (the load, which leaves out making room
 * under the budget; its recompute part; its read part) and the corrections learned by
 * the end; before the first run a line gives the profiled models.
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench/bench.h"
#include "daemon/ctxmgr.h"
#include "engine/gguf.h"
#include "engine/model.h"
#include "engine/modelgen.h"
#include "engine/quant.h"
#include "storage/chunks.h"

#define MAX_N 8 /* entries of --contexts */
#define N_SYSTEMS 5

typedef struct options {
    const char *model, *dir, *trace;
    const char *systems; /* comma-separated names to run, NULL: all */
    int n_list[MAX_N], n_n;
    int calls, min_ctx, max_ctx, prompt_min, prompt_max, threads;
    double budget_contexts;
    uint64_t seed;
} options;

typedef struct system_def {
    const char *name;
    ctx_policy policy;
} system_def;

static const system_def systems[N_SYSTEMS] = {
    {"llms", {.compress = CTX_COMPRESS_TOLERANCE, .compress_ratio = 0.5, .swap = CTX_SWAP_AHEAD,
              .switch_mode = CTX_SWITCH_PLAN}},
    {"kill", {.compress = CTX_COMPRESS_NONE, .swap = CTX_SWAP_NONE,
              .switch_mode = CTX_SWITCH_RECOMPUTE, .whole_context = true}},
    {"ctx-swap", {.compress = CTX_COMPRESS_NONE, .swap = CTX_SWAP_ON_RECLAIM,
                  .switch_mode = CTX_SWITCH_READ, .whole_context = true}},
    {"chunk-swap", {.compress = CTX_COMPRESS_NONE, .swap = CTX_SWAP_ON_RECLAIM,
                    .switch_mode = CTX_SWITCH_READ}},
    {"chunk-int8", {.compress = CTX_COMPRESS_INT8, .swap = CTX_SWAP_ON_RECLAIM,
                    .switch_mode = CTX_SWITCH_READ}},
};

static uint64_t rng;

static double uniform(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return ((double)(rng >> 11) + 0.5) / 9007199254740992.0;
}

static int uniform_int(int lo, int hi)
{
    return lo + (int)(uniform() * (hi - lo + 1));
}

static double normal(void)
{
    return sqrt(-2 * log(uniform())) * cos(2 * M_PI * uniform());
}

typedef struct bench {
    const options *o;
    model *m;
    model_runner *runner;
    int n_vocab, max_kv;
    int32_t *tok, *pos; /* (max_kv) */
} bench;

/* Appends n tokens to c as one call (not measured unless st is given). */
static int call(bench *b, ctxmgr *cm, ctx_entry *c, int n, ctx_load_stats *st,
                char err[ERR_MAX])
{
    int rc = ctx_call_begin(cm, c, b->max_kv, st, err);
    if (rc)
        return rc;
    for (int i = 0; i < n; i++) {
        b->tok[i] = 3 + (int32_t)(uniform() * (b->n_vocab - 3));
        b->pos[i] = c->n_tokens + i;
    }
    model_batch mb = {.n_tokens = n, .tokens = b->tok, .positions = b->pos};
    rc = ctx_forward(cm, c, &mb, err);
    if (rc == 0 && ctx_commit_turn(cm, c, "raw", "", b->tok, n, "", NULL, 0, 1, err))
        rc = -1;
    ctx_call_end(cm, c, rc == 0);
    return rc;
}

/* The index of the context the trace calls next. */
static int pick(const options *o, ctx_entry **ctxs, int n, const int *recency)
{
    if (!strcmp(o->trace, "markov")) {
        for (int k = 0; k < n - 1; k++)
            if (uniform() < 0.5)
                return recency[k];
        return recency[n - 1];
    }
    if (!strcmp(o->trace, "gaussian")) {
        int order[64];
        for (int i = 0; i < n; i++)
            order[i] = i;
        for (int i = 1; i < n; i++)
            for (int j = i; j > 0 && ctxs[order[j]]->n_tokens < ctxs[order[j - 1]]->n_tokens; j--) {
                int t = order[j];
                order[j] = order[j - 1];
                order[j - 1] = t;
            }
        int r = (int)lround((n - 1) / 2.0 + normal() * n / 4.0);
        return order[r < 0 ? 0 : r >= n ? n - 1 : r];
    }
    return uniform_int(0, n - 1);
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

typedef struct result {
    double avg_ms, p95_ms;
} result;

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

static void print_cost(const ctx_cost_report *r)
{
    const ctx_cost *k = &r->fit;
    printf("{\"bench\":\"ctxswitch\",\"cost_models\":{\"rec_a_ms\":%.4g,"
           "\"rec_b_ms_per_token\":%.4g,\"rec_c_ms_per_token_ctx\":%.4g,\"cold_d_ms\":%.4g,"
           "\"cold_mb_s\":%.1f,\"warm_d_ms\":%.4g,\"warm_mb_s\":%.1f,\"cold_ms_per_file\":%.4g,"
           "\"warm_ms_per_file\":%.4g,\"rec_resid\":%.3f,\"cold_resid\":%.3f,"
           "\"warm_resid\":%.3f,\"samples\":%g}}\n",
           k->rec_a, k->rec_b, k->rec_c, k->io_d, k->io_e > 0 ? 1e-3 / k->io_e : 0, k->warm_d,
           k->warm_e > 0 ? 1e-3 / k->warm_e : 0, k->io_f, k->warm_f, k->rec_resid, k->io_resid,
           k->warm_resid,
           k->samples);
}

/* One system on the trace with n contexts. */
static int run_system(bench *b, const system_def *sys, int n, result *res)
{
    const options *o = b->o;
    char dir[1024], cmd[1200], err[ERR_MAX];
    snprintf(dir, sizeof dir, "%s/run-%s-%d", o->dir, sys->name, n);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        return -1;
    kv_shape shape = model_kv_shape(b->m);
    ctx_policy pol = sys->policy;
    int ctx_chunks = (o->max_ctx + KV_CHUNK_TOKENS - 1) / KV_CHUNK_TOKENS;
    pol.budget_bytes = (size_t)(o->budget_contexts * ctx_chunks *
                                (double)kv_chunk_data_bytes(shape, KV_F16));
    store *st = store_open(dir, err);
    kv_pool *pool = st ? kv_pool_new(shape, 0, err) : NULL;
    ctxmgr *cm = pool ? ctx_open(st, pool, b->runner, b->m, &pol, err) : NULL;
    ctx_entry *ctxs[64];
    int recency[64], rc = -1;
    double *lat = malloc(sizeof *lat * (size_t)o->calls);
    ratios whole = {malloc(sizeof(double) * (size_t)o->calls), 0};
    ratios rec = {malloc(sizeof(double) * (size_t)o->calls), 0};
    ratios rd = {malloc(sizeof(double) * (size_t)o->calls), 0};
    double predicted = 0;
    if (!cm || !lat || !whole.v || !rec.v || !rd.v)
        goto out;
    static bool cost_printed;
    if (!cost_printed) {
        ctx_cost_report cr;
        ctx_get_cost_report(cm, &cr);
        print_cost(&cr);
        cost_printed = true;
    }
    rng = o->seed * 7919 + (uint64_t)n;
    for (int i = 0; i < n; i++) {
        recency[i] = i;
        if (ctx_create(cm, 0, "bench", NULL, NULL, 1, &ctxs[i], err) ||
            call(b, cm, ctxs[i], uniform_int(o->min_ctx, o->max_ctx), NULL, err))
            goto out;
    }
    int64_t bytes_read = 0;
    double read_ms = 0;
    int n_read = 0, n_rec = 0;
    for (int k = 0; k < o->calls; k++) {
        int i = pick(o, ctxs, n, recency);
        double lo = log(o->prompt_min), hi = log(o->prompt_max);
        int p = (int)exp(lo + uniform() * (hi - lo));
        if (ctxs[i]->n_tokens + p >= b->max_kv) {
            if (ctx_delete(cm, ctxs[i], err) ||
                ctx_create(cm, 0, "bench", NULL, NULL, 1, &ctxs[i], err) ||
                call(b, cm, ctxs[i], o->min_ctx, NULL, err))
                goto out;
        }
        if (store_chunk_drop_cache(st, ctxs[i]->id, err))
            goto out;
        ctx_load_stats ls;
        if (call(b, cm, ctxs[i], p, &ls, err))
            goto out;
        lat[k] = ls.ms;
        predicted += ls.predicted_ms;
        ratio_add(&whole, ls.load_ms, ls.predicted_ms);
        ratio_add(&rec, ls.rec_ms, ls.rec_predicted_ms);
        ratio_add(&rd, ls.read_ms, ls.read_predicted_ms);
        bytes_read += ls.bytes_read;
        n_read += ls.chunks_read;
        n_rec += ls.chunks_recomputed;
        if (ls.chunks_read)
            read_ms += ls.ms;
        int at = 0;
        while (recency[at] != i)
            at++;
        memmove(recency + 1, recency, sizeof *recency * (size_t)at);
        recency[0] = i;
    }
    double sum = 0;
    for (int k = 0; k < o->calls; k++)
        sum += lat[k];
    qsort(lat, (size_t)o->calls, sizeof *lat, bench_compare_doubles);
    res->avg_ms = sum / o->calls;
    res->p95_ms = lat[(int)ceil(0.95 * o->calls) - 1];
    const ctx_stats *cs = ctx_get_stats(cm);
    printf("{\"bench\":\"ctxswitch\",\"system\":\"%s\",\"trace\":\"%s\",\"contexts\":%d,"
           "\"calls\":%d,\"avg_ms\":%.3f,\"p95_ms\":%.3f,\"budget_bytes\":%zu,"
           "\"chunks_read\":%d,\"chunks_recomputed\":%d,\"bytes_read\":%lld,"
           "\"read_mb_s\":%.1f,\"bytes_written\":%llu,\"bad_blobs\":%llu,\"faults\":%llu}\n",
           sys->name, o->trace, n, o->calls, res->avg_ms, res->p95_ms, pol.budget_bytes, n_read,
           n_rec, (long long)bytes_read, read_ms > 0 ? (double)bytes_read / 1e3 / read_ms : 0,
           (unsigned long long)cs->bytes_written, (unsigned long long)cs->bad_blobs,
           (unsigned long long)cs->faults);
    ctx_cost_report cr;
    ctx_get_cost_report(cm, &cr);
    printf("{\"bench\":\"ctxswitch\",\"system\":\"%s\",\"contexts\":%d,\"predicted_avg_ms\":%.3f,"
           "\"observed_over_predicted\":%.3f,\"recompute_observed_over_predicted\":%.3f,"
           "\"read_observed_over_predicted\":%.3f,\"rec_fix\":%.3f,\"cold_fix\":%.3f,"
           "\"warm_fix\":%.3f,\"rec_contention\":%.3f,\"read_contention\":%.3f}\n",
           sys->name, n, predicted / o->calls, ratio_median(&whole), ratio_median(&rec),
           ratio_median(&rd), cr.rec_fix, cr.cold_fix, cr.warm_fix, cr.rec_contention,
           cr.read_contention);
    fflush(stdout);
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "ctxswitch: %s, %d contexts: %s\n", sys->name, n, err);
    free(lat);
    free(whole.v);
    free(rec.v);
    free(rd.v);
    ctx_close(cm);
    kv_pool_free(pool);
    store_close(st);
    if (system(cmd) != 0)
        rc = -1;
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

static void usage(void)
{
    fprintf(stderr, "usage: ctxswitch [--model PATH] [--contexts 2,4,8,16] [--calls N] "
                    "[--trace random|markov|gaussian] [--min-ctx T] [--max-ctx T] "
                    "[--prompt-min T] [--prompt-max T] [--budget-contexts X] [--threads N] "
                    "[--dir DIR] [--seed S] [--systems NAME,...]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    options o = {.dir = "build/bench-ctxswitch", .trace = "markov", .n_list = {2, 4, 8, 16},
                 .n_n = 4, .calls = 40, .min_ctx = 1024, .max_ctx = 4096, .prompt_min = 10,
                 .prompt_max = 2000, .threads = 2, .budget_contexts = 2, .seed = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            usage();
        i++;
        if (!strcmp(a, "--model"))
            o.model = v;
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
        if (o.n_list[i] < 1 || o.n_list[i] > 64)
            usage();
    if (o.calls < 1 || o.min_ctx < 16 || o.max_ctx < o.min_ctx || o.prompt_min < 1 ||
        o.prompt_max < o.prompt_min || o.budget_contexts <= 0)
        usage();
    char err[ERR_MAX], path[1024];
    mkdir(o.dir, 0755);
    if (!o.model) {
        if (default_model(&o, path, sizeof path, err)) {
            fprintf(stderr, "ctxswitch: default model: %s\n", err);
            return 1;
        }
        o.model = path;
    }
    bench b = {.o = &o};
    b.max_kv = o.max_ctx + o.prompt_max + o.min_ctx;
    b.m = model_load(o.model, err);
    b.runner = b.m ? model_runner_new(b.m, o.threads, 512, b.max_kv, err) : NULL;
    b.tok = malloc(sizeof *b.tok * (size_t)b.max_kv);
    b.pos = malloc(sizeof *b.pos * (size_t)b.max_kv);
    if (!b.runner || !b.tok || !b.pos) {
        fprintf(stderr, "ctxswitch: %s\n", b.runner ? "out of memory" : err);
        return 1;
    }
    b.n_vocab = model_hparams_of(b.m)->n_vocab;
    int rc = 0;
    for (int s = 0; s < N_SYSTEMS; s++) {
        if (o.systems && !name_listed(o.systems, systems[s].name))
            continue;
        int best25 = 0, best100 = 0;
        for (int i = 0; i < o.n_n; i++) {
            result r;
            if (run_system(&b, &systems[s], o.n_list[i], &r)) {
                rc = 1;
                continue;
            }
            if (r.avg_ms < 25 && o.n_list[i] > best25)
                best25 = o.n_list[i];
            if (r.avg_ms < 100 && o.n_list[i] > best100)
                best100 = o.n_list[i];
        }
        printf("{\"bench\":\"ctxswitch\",\"system\":\"%s\",\"trace\":\"%s\","
               "\"max_contexts_under_25ms\":%d,\"max_contexts_under_100ms\":%d}\n",
               systems[s].name, o.trace, best25, best100);
        fflush(stdout);
    }
    free(b.tok);
    free(b.pos);
    model_runner_free(b.runner);
    model_free(b.m);
    return rc;
}
