/*
 * longprompt — long prompts under a prefill memory budget (engine/model/prefill.h, HyperGen).
 *
 * For each budget: the longest prompt whose unpartitioned prefill (the whole prompt in one
 * step, one score block per head) fits, the longest the planner's partitioning fits, and
 * the ratio; then a run of the partitioned path at min(4x the unpartitioned maximum,
 * --verify-max) tokens with weights streamed, to show it completes, with its peak RSS.
 * Then the time to first token (prefill of the prompt and the last row's logits) at each
 * length: unpartitioned without a budget against partitioned under each budget, --repeat
 * runs of each alternating (unpartitioned, then each budget, then again), so that a slow
 * moment of a shared machine falls on both sides; the medians and their ratio are printed.
 * An unpartitioned run whose working memory exceeds --max-unpartitioned-mb is not made
 * (at 32K tokens it would want gigabytes of scores), and says so.
 *
 * Every run is a child process (its peak RSS, VmHWM, starts fresh): it maps the model,
 * builds the runner of the plan and evaluates random tokens. The model by default is
 * build/bench-models/longprompt-llama.gguf, a TinyLlama-1.1B-like shape made small
 * enough for two cores (dim 512, 4 layers, 8 heads sharing 1 KV head as TinyLlama's 32
 * share 4, head 64, FFN 1408, Q8_0, llama vocabulary); --arch qwen2 makes
 * longprompt-qwen2.gguf instead, Qwen2-0.5B's layer (dim 896, 14 heads sharing 2 KV
 * heads, head 64, FFN 4864, bias on Q/K/V, rope base 1e6) in 4 layers with a 32K
 * context and the GPT-2 vocabulary; --model takes any other file.
 *
 *   build/bench/longprompt [--model M.gguf | --arch llama|qwen2] [--threads N]
 *                          [--budgets 16,64] [--lengths 1024,2048,4096,8192]
 *                          [--verify-max 8192] [--repeat 3] [--max-unpartitioned-mb 4096]
 *
 * One JSON object per result line.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench.h"
#include "engine/model/model.h"
#include "engine/model/prefill.h"
#include "engine/quant/quant.h"

#define MAX_LIST 16
#define LP_LIMIT (1 << 20)

typedef struct lp_options {
    const char *model;
    const char *arch; /* of the default model */
    int threads;
    int repeat;
    int max_unpartitioned_mb;
    int budgets[MAX_LIST], n_budgets; /* MiB */
    int lengths[MAX_LIST], n_lengths;
    int verify_max;
    int resident_small_mb;
} lp_options;

/* What a child reports. */
typedef struct lp_result {
    int ok;
    double ttft_s;
    double base_rss_mb; /* after mapping the model, before the runner */
    double peak_rss_mb; /* VmHWM at the end */
    double scratch_mb;  /* the runner's allocation */
    char err[ERR_MAX];
} lp_result;

/* A field of /proc/self/status in MiB (VmRSS, VmHWM); -1 when absent. */
static double lp_status_mb(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double v = -1;
    size_t n = strlen(field);
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, field, n) == 0 && line[n] == ':')
            v = strtod(line + n + 1, NULL) / 1024.0;
    if (f)
        fclose(f);
    return v;
}

/* The child: prefill n tokens with the runner opts say; streams weights when
 * resident_small is not SIZE_MAX. */
static void lp_child(const char *path, const model_runner_opts *opts, int n,
                     size_t resident_small, lp_result *res)
{
    char err[ERR_MAX] = "";
    model *m = model_load(path, err);
    model_runner *r = NULL;
    kv_pool *pool = NULL;
    int32_t *tok = NULL, *pos = NULL;
    float *logits = NULL;
    kv_seq seq;
    bool have_seq = false;
    if (!m)
        goto out;
    const model_hparams *hp = model_hparams_of(m);
    res->base_rss_mb = lp_status_mb("VmRSS");
    r = model_runner_new_opts(m, opts, err);
    if (!r || (resident_small != SIZE_MAX && model_runner_stream_weights(r, resident_small, err) < 0))
        goto out;
    pool = kv_pool_new(model_kv_shape(m), 0, err);
    tok = malloc(sizeof *tok * (size_t)n);
    pos = malloc(sizeof *pos * (size_t)n);
    logits = malloc(sizeof *logits * (size_t)hp->n_vocab);
    if (!pool || !tok || !pos || !logits) {
        snprintf(err, sizeof err, "out of memory");
        goto out;
    }
    srand(7);
    for (int i = 0; i < n; i++)
        tok[i] = 3 + rand() % (hp->n_vocab - 3), pos[i] = i;
    kv_seq_init(&seq, pool);
    have_seq = true;
    int32_t last = n - 1;
    model_batch b = {.n_tokens = n, .tokens = tok, .positions = pos, .n_out = 1,
                     .out_rows = &last, .logits = logits};
    double t0 = bench_now_s();
    if (model_forward(r, &seq, &b, err) < 0)
        goto out;
    res->ttft_s = bench_now_s() - t0;
    res->peak_rss_mb = lp_status_mb("VmHWM");
    res->scratch_mb = (double)model_runner_scratch_bytes(r) / (1 << 20);
    res->ok = 1;
out:
    snprintf(res->err, sizeof res->err, "%s", err);
    if (have_seq)
        kv_seq_free(&seq);
    free(tok), free(pos), free(logits);
    kv_pool_free(pool);
    model_runner_free(r);
    model_free(m);
}

/* Runs lp_child in a fresh process; 0 with *res filled, or -1. */
static int lp_run(const char *path, const model_runner_opts *opts, int n, size_t resident_small,
                  lp_result *res)
{
    int fds[2];
    memset(res, 0, sizeof *res);
    if (pipe(fds) < 0)
        return -1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]), close(fds[1]);
        return -1;
    }
    if (pid == 0) {
        close(fds[0]);
        lp_result r = {0};
        lp_child(path, opts, n, resident_small, &r);
        ssize_t w = write(fds[1], &r, sizeof r);
        _exit(w == (ssize_t)sizeof r ? 0 : 1);
    }
    close(fds[1]);
    ssize_t got = read(fds[0], res, sizeof *res);
    close(fds[0]);
    int wstatus = 0;
    if (waitpid(pid, &wstatus, 0) < 0 || got != (ssize_t)sizeof *res) {
        snprintf(res->err, sizeof res->err, "child died (%s)",
                 WIFSIGNALED(wstatus) ? strsignal(WTERMSIG(wstatus)) : "no result");
        res->ok = 0;
    }
    return res->ok ? 0 : -1;
}

static model_runner_opts lp_whole_opts(const lp_options *o, int n)
{
    return (model_runner_opts){.n_threads = o->threads, .max_batch = n, .max_kv = n,
                               .attn_rows = n};
}

/* The longest prompt the unpartitioned path fits in budget bytes. */
static int lp_whole_max(const model_hparams *hp, int threads, size_t budget)
{
    int lo = 0, hi = LP_LIMIT;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (prefill_estimate_of(hp, mid, mid, mid, threads, KV_F16).working <= budget)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

static const char *lp_pressure(enum prefill_pressure p)
{
    return p == PREFILL_WHOLE ? "none" : p == PREFILL_MODERATE ? "moderate" : "severe";
}

static int lp_parse_list(const char *s, int *out, int *n)
{
    *n = 0;
    while (*s && *n < MAX_LIST) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v <= 0 || v > LP_LIMIT)
            return -1;
        out[(*n)++] = (int)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return -1;
    }
    return *n > 0 ? 0 : -1;
}

static int lp_parse(int argc, char **argv, lp_options *o)
{
    *o = (lp_options){.arch = "llama", .threads = 2, .verify_max = 8192, .resident_small_mb = 1,
                      .repeat = 3, .max_unpartitioned_mb = 4096};
    lp_parse_list("16,64", o->budgets, &o->n_budgets);
    lp_parse_list("1024,2048,4096,8192", o->lengths, &o->n_lengths);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = v ? 0 : -1;
        if (!strcmp(a, "--model") && v)
            o->model = v;
        else if (!strcmp(a, "--arch") && v)
            rc = !strcmp(v, "llama") || !strcmp(v, "qwen2") ? (o->arch = v, 0) : -1;
        else if (!strcmp(a, "--repeat") && v)
            rc = (o->repeat = atoi(v)) > 0 && o->repeat <= MAX_LIST ? 0 : -1;
        else if (!strcmp(a, "--max-unpartitioned-mb") && v)
            rc = (o->max_unpartitioned_mb = atoi(v)) > 0 ? 0 : -1;
        else if (!strcmp(a, "--threads") && v)
            rc = (o->threads = atoi(v)) > 0 ? 0 : -1;
        else if (!strcmp(a, "--verify-max") && v)
            rc = (o->verify_max = atoi(v)) > 0 ? 0 : -1;
        else if (!strcmp(a, "--resident-small-mb") && v)
            rc = (o->resident_small_mb = atoi(v)) >= 0 ? 0 : -1;
        else if (!strcmp(a, "--budgets") && v)
            rc = lp_parse_list(v, o->budgets, &o->n_budgets);
        else if (!strcmp(a, "--lengths") && v)
            rc = lp_parse_list(v, o->lengths, &o->n_lengths);
        else
            rc = -1;
        if (rc < 0) {
            fprintf(stderr, "usage: longprompt [--model M.gguf | --arch llama|qwen2] [--threads N] "
                            "[--budgets MiB,..] [--lengths N,..] [--verify-max N] "
                            "[--resident-small-mb N] [--repeat N] [--max-unpartitioned-mb N]\n");
            return -1;
        }
        i++;
    }
    return 0;
}

/* Time to first token at n tokens: unpartitioned without a budget, and partitioned under
 * each budget, o->repeat rounds alternating between them; prints one line per budget with
 * the medians. 0, or 1 when a run failed. */
static int lp_ttft_at(const lp_options *o, const model *m, const char *path, int n)
{
    const model_hparams *hp = model_hparams_of(m);
    prefill_estimate we = prefill_estimate_of(hp, n, n, n, o->threads, KV_F16);
    bool whole_runs = we.working <= (size_t)o->max_unpartitioned_mb << 20;
    model_runner_opts wo = lp_whole_opts(o, n);
    prefill_plan plans[MAX_LIST];
    bool planned[MAX_LIST];
    char err[ERR_MAX];
    for (int b = 0; b < o->n_budgets; b++) {
        prefill_request req = {.n_prompt = n, .n_threads = o->threads, .kv = KV_F16,
                               .budget = (size_t)o->budgets[b] << 20, .resident_small = SIZE_MAX};
        planned[b] = prefill_plan_make(m, &req, &plans[b], err) == 0;
    }
    double whole_s[MAX_LIST], part_s[MAX_LIST][MAX_LIST];
    double whole_rss = -1, part_rss[MAX_LIST];
    int n_whole = 0, n_part[MAX_LIST] = {0}, status = 0;
    for (int b = 0; b < o->n_budgets; b++)
        part_rss[b] = -1;
    for (int round = 0; round < o->repeat; round++) {
        lp_result r;
        if (whole_runs) {
            if (lp_run(path, &wo, n, SIZE_MAX, &r) == 0)
                whole_s[n_whole++] = r.ttft_s, whole_rss = r.peak_rss_mb;
            else
                status = 1;
        }
        for (int b = 0; b < o->n_budgets; b++) {
            if (!planned[b])
                continue;
            model_runner_opts po = prefill_runner_opts(&plans[b]);
            if (lp_run(path, &po, n, SIZE_MAX, &r) == 0)
                part_s[b][n_part[b]++] = r.ttft_s, part_rss[b] = r.peak_rss_mb;
            else
                status = 1;
        }
    }
    double whole = n_whole ? bench_median(whole_s, n_whole) : -1;
    for (int b = 0; b < o->n_budgets; b++) {
        const prefill_plan *plan = &plans[b];
        double part = n_part[b] ? bench_median(part_s[b], n_part[b]) : -1;
        printf("{\"bench\":\"longprompt\",\"kind\":\"ttft\",\"tokens\":%d,\"budget_mb\":%d,"
               "\"runs\":%d,\"unpartitioned_ttft_s\":%.3f,\"unpartitioned_working_mb\":%.1f,"
               "\"unpartitioned_run\":%s,\"unpartitioned_fits_budget\":%s,"
               "\"unpartitioned_peak_rss_mb\":%.1f,\"partitioned_ttft_s\":%.3f,"
               "\"pressure\":\"%s\",\"rows\":%d,\"attn_rows\":%d,"
               "\"partitioned_working_mb\":%.1f,\"partitioned_peak_rss_mb\":%.1f,"
               "\"ttft_ratio\":%.3f}\n",
               n, o->budgets[b], o->repeat, whole, (double)we.working / (1 << 20),
               whole_runs ? "true" : "false",
               we.working <= (size_t)o->budgets[b] << 20 ? "true" : "false", whole_rss, part,
               planned[b] ? lp_pressure(plan->pressure) : "refused",
               planned[b] ? plan->est.rows : 0, planned[b] ? plan->est.attn_rows : 0,
               planned[b] ? (double)plan->est.working / (1 << 20) : -1.0, part_rss[b],
               whole > 0 && part > 0 ? part / whole : -1.0);
        status |= !planned[b];
    }
    return status;
}

/* Makes the default model of arch unless it exists. */
static int lp_default_model(const char *arch, char *path, size_t cap)
{
    bool qwen2 = strcmp(arch, "qwen2") == 0;
    const char *vocab = qwen2 ? "../shared/testdata/vocab/ggml-vocab-gpt-2.gguf"
                              : "../shared/testdata/vocab/ggml-vocab-llama-spm.gguf";
    snprintf(path, cap, "build/bench-models/longprompt-%s.gguf", arch);
    if (access(path, R_OK) == 0)
        return 0;
    char err[ERR_MAX];
    gguf_file *g = gguf_open(vocab, err);
    if (!g) {
        fprintf(stderr, "longprompt: %s: %s\n", vocab, err);
        return -1;
    }
    modelgen_params p = {.arch = "llama", .dim = 512, .n_layer = 4, .n_head = 8, .n_head_kv = 1,
                         .n_ff = 1408, .n_ctx = 65536, .type = QTYPE_Q8_0, .seed = 1,
                         .vocab = g};
    if (qwen2)
        p = (modelgen_params){.arch = "qwen2", .dim = 896, .n_layer = 4, .n_head = 14,
                              .n_head_kv = 2, .n_ff = 4864, .n_ctx = 32768,
                              .type = QTYPE_Q8_0, .seed = 1, .vocab = g};
    int rc = bench_generate_model("longprompt", &p, path);
    gguf_close(g);
    return rc;
}

int main(int argc, char **argv)
{
    lp_options o;
    char path[512], err[ERR_MAX];
    if (lp_parse(argc, argv, &o) < 0)
        return 2;
    if (o.model)
        snprintf(path, sizeof path, "%s", o.model);
    else if (lp_default_model(o.arch, path, sizeof path) < 0)
        return 1;
    model *m = model_load(path, err);
    if (!m) {
        fprintf(stderr, "longprompt: %s: %s\n", path, err);
        return 1;
    }
    const model_hparams *hp = model_hparams_of(m);
    char shape[160];
    snprintf(shape, sizeof shape, "dim %d, %d layers, %d/%d heads, head %d, ffn %d, vocab %d",
             hp->dim, hp->n_layer, hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_ff, hp->n_vocab);
    size_t rs = (size_t)o.resident_small_mb << 20;
    int status = 0;

    for (int b = 0; b < o.n_budgets; b++) {
        size_t budget = (size_t)o.budgets[b] << 20;
        prefill_request req = {.n_threads = o.threads, .kv = KV_F16, .budget = budget,
                               .resident_small = rs};
        int whole = lp_whole_max(hp, o.threads, budget);
        int part = prefill_max_prompt(m, &req, LP_LIMIT);
        printf("{\"bench\":\"longprompt\",\"kind\":\"max_prompt\",\"model\":\"%s\",\"shape\":\"%s\","
               "\"threads\":%d,\"budget_mb\":%d,\"unpartitioned_max\":%d,\"partitioned_max\":%d,"
               "\"searched_to\":%d,\"ratio\":%.2f,\"source\":\"plan\"}\n",
               path, shape, o.threads, o.budgets[b], whole, part, LP_LIMIT,
               whole ? (double)part / whole : 0.0);

        int n = 4 * whole < o.verify_max ? 4 * whole : o.verify_max;
        n = n < part ? n : part;
        prefill_plan plan;
        req.n_prompt = n;
        if (n <= 0 || prefill_plan_make(m, &req, &plan, err) < 0) {
            fprintf(stderr, "longprompt: budget %d MiB: %s\n", o.budgets[b], n ? err : "no plan");
            status = 1;
            continue;
        }
        model_runner_opts ro = prefill_runner_opts(&plan);
        lp_result r;
        int rc = lp_run(path, &ro, n, rs, &r);
        double weights_mb = (double)(plan.weights.resident + plan.weights_window) / (1 << 20);
        double bound = (double)budget / (1 << 20) + weights_mb + (double)plan.kv_bytes / (1 << 20);
        printf("{\"bench\":\"longprompt\",\"kind\":\"verify\",\"budget_mb\":%d,\"tokens\":%d,"
               "\"x_unpartitioned_max\":%.2f,\"pressure\":\"%s\",\"rows\":%d,\"attn_rows\":%d,"
               "\"completed\":%s,\"ttft_s\":%.3f,\"plan_working_mb\":%.2f,\"scratch_mb\":%.2f,"
               "\"kv_mb\":%.2f,\"weights_resident_mb\":%.2f,\"weights_window_mb\":%.2f,"
               "\"base_rss_mb\":%.1f,\"peak_rss_mb\":%.1f,\"rss_growth_mb\":%.1f,"
               "\"budget_plus_weights_kv_mb\":%.1f,\"growth_within\":%s%s%s%s}\n",
               o.budgets[b], n, whole ? (double)n / whole : 0.0, lp_pressure(plan.pressure),
               plan.est.rows, plan.est.attn_rows, rc == 0 ? "true" : "false", r.ttft_s,
               (double)plan.est.working / (1 << 20), r.scratch_mb,
               (double)plan.kv_bytes / (1 << 20), (double)plan.weights.resident / (1 << 20),
               (double)plan.weights_window / (1 << 20), r.base_rss_mb, r.peak_rss_mb,
               r.peak_rss_mb - r.base_rss_mb, bound,
               r.peak_rss_mb - r.base_rss_mb <= bound ? "true" : "false",
               rc ? ",\"error\":\"" : "", rc ? r.err : "", rc ? "\"" : "");
        status |= rc != 0;
    }

    for (int l = 0; l < o.n_lengths; l++)
        status |= lp_ttft_at(&o, m, path, o.lengths[l]);
    model_free(m);
    return status;
}
