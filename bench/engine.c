/*
 * bench/engine — prefill and decode speed of the engine, and its peak memory.
 *
 *   build/bench/engine [-t THREADS] [-r RUNS] [--prompt N] [--gen N] [MODEL.gguf ...]
 *
 * With no model given it benchmarks the reference shape — a TinyLlama-1.1B-shaped
 * llama (dim 2048, 22 layers, 32 heads, 4 KV heads, FFN 5632, the llama-spm vocabulary)
 * in Q8_0 and F16 — generating the files with build/mkmodel into build/bench-models/
 * on first use, and compares with llama.cpp's figures for the same shapes on this
 * machine kind (2 threads).
 *
 * Each model runs in a child process so peak RSS is per model. A run is: prefill of a
 * prompt of random token ids into an empty context, then greedy decode of --gen tokens.
 * Prints one JSON object per model with the median of the runs.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench.h"
#include "engine/kv.h"
#include "engine/model.h"
#include "engine/quant.h"

#define MAX_RUNS 15

typedef struct bench_options {
    int n_threads;
    int n_runs;
    int n_prompt;
    int n_gen;
} bench_options;

/* llama.cpp on this machine kind, 2 threads, TinyLlama-1.1B shape (issue #2). */
typedef struct baseline {
    const char *type;
    double prefill_tok_s;
    double decode_tok_s;
} baseline;

static const baseline llamacpp_baselines[] = {
    {"Q8_0", 67.0, 24.8},
    {"F16", 88.0, 15.0},
};

static int32_t argmax(const float *v, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return best;
}

/* The dominant weight type: that of the first layer's attention query. */
static const char *model_weight_type(const model *m)
{
    const gguf_tensor *t = gguf_find_tensor(model_gguf(m), "blk.0.attn_q.weight");
    const quant_traits *tr = t ? quant_traits_of(t->type) : NULL;
    return tr ? tr->name : "?";
}

/* Runs the benchmark of one model in this process and prints its JSON line. */
static int bench_model(const char *path, const bench_options *o)
{
    char err[ERR_MAX];
    int status = 1;
    model *m = model_load(path, err);
    if (!m) {
        fprintf(stderr, "engine: %s: %s\n", path, err);
        return 1;
    }
    const model_hparams *hp = model_hparams_of(m);
    const int n_kv = o->n_prompt + o->n_gen;
    model_runner *r = model_runner_new(m, o->n_threads, o->n_prompt, n_kv, err);
    kv_pool *pool = r ? kv_pool_new(model_kv_shape(m), 0, err) : NULL;
    int32_t *tokens = malloc(sizeof *tokens * (size_t)o->n_prompt);
    int32_t *positions = malloc(sizeof *positions * (size_t)o->n_prompt);
    float *logits = malloc(sizeof *logits * (size_t)hp->n_vocab);
    double prefill[MAX_RUNS], decode[MAX_RUNS];
    size_t kv_bytes = 0;
    kv_seq seq;

    if (!r || !pool || !tokens || !positions || !logits) {
        fprintf(stderr, "engine: %s: %s\n", path, r && pool ? "out of memory" : err);
        goto out;
    }
    kv_seq_init(&seq, pool);
    srand(1234);
    for (int i = 0; i < o->n_prompt; i++) {
        tokens[i] = 3 + rand() % (hp->n_vocab - 3);
        positions[i] = i;
    }

    for (int run = 0; run < o->n_runs; run++) {
        int32_t last = o->n_prompt - 1;
        model_batch b = {
            .n_tokens = o->n_prompt, .tokens = tokens, .positions = positions,
            .n_out = 1, .out_rows = &last, .logits = logits,
        };
        kv_seq_truncate(&seq, 0);
        double t0 = bench_now_s();
        if (model_forward(r, &seq, &b, err)) {
            fprintf(stderr, "engine: prefill: %s\n", err);
            kv_seq_free(&seq);
            goto out;
        }
        prefill[run] = o->n_prompt / (bench_now_s() - t0);

        t0 = bench_now_s();
        for (int i = 0; i < o->n_gen; i++) {
            int32_t next = argmax(logits, hp->n_vocab), pos = o->n_prompt + i, row = 0;
            model_batch d = {
                .n_tokens = 1, .tokens = &next, .positions = &pos,
                .n_out = 1, .out_rows = &row, .logits = logits,
            };
            if (model_forward(r, &seq, &d, err)) {
                fprintf(stderr, "engine: decode: %s\n", err);
                kv_seq_free(&seq);
                goto out;
            }
        }
        decode[run] = o->n_gen / (bench_now_s() - t0);
        kv_bytes = kv_pool_bytes_used(seq.pool);
    }
    kv_seq_free(&seq);

    struct rusage ru;
    struct stat st;
    getrusage(RUSAGE_SELF, &ru);
    stat(path, &st);
    const double mib = 1024.0 * 1024.0;
    const double rss_mb = ru.ru_maxrss / 1024.0;
    const double model_mb = st.st_size / mib, kv_mb = kv_bytes / mib;
    const char *type = model_weight_type(m);
    double prefill_med = bench_median(prefill, o->n_runs), decode_med = bench_median(decode, o->n_runs);

    printf("{\"bench\":\"engine\",\"model\":\"%s\",\"type\":\"%s\",\"dim\":%d,\"layers\":%d,"
           "\"threads\":%d,\"runs\":%d,\"prompt_tokens\":%d,\"gen_tokens\":%d,"
           "\"prefill_tok_s\":%.2f,\"decode_tok_s\":%.2f,"
           "\"peak_rss_mb\":%.1f,\"model_mb\":%.1f,\"kv_mb\":%.1f,\"rss_over_model_kv\":%.3f",
           path, type, hp->dim, hp->n_layer, model_runner_n_threads(r), o->n_runs, o->n_prompt,
           o->n_gen, prefill_med, decode_med, rss_mb, model_mb, kv_mb,
           rss_mb / (model_mb + kv_mb));
    for (size_t i = 0; i < sizeof llamacpp_baselines / sizeof *llamacpp_baselines; i++) {
        const baseline *b = &llamacpp_baselines[i];
        if (strcmp(b->type, type) == 0 && hp->dim == 2048 && hp->n_layer == 22)
            printf(",\"llamacpp_prefill_tok_s\":%.1f,\"llamacpp_decode_tok_s\":%.1f,"
                   "\"prefill_ratio\":%.3f,\"decode_ratio\":%.3f",
                   b->prefill_tok_s, b->decode_tok_s, prefill_med / b->prefill_tok_s,
                   decode_med / b->decode_tok_s);
    }
    printf("}\n");
    fflush(stdout);
    status = 0;
out:
    free(logits);
    free(positions);
    free(tokens);
    kv_pool_free(pool);
    model_runner_free(r);
    model_free(m);
    return status;
}

/* Makes build/bench-models/tinyllama-TYPE.gguf with mkmodel unless it exists. */
static int ensure_reference_model(const char *type, char *path, size_t cap)
{
    const char *vocab = "../shared/testdata/vocab/ggml-vocab-llama-spm.gguf";
    snprintf(path, cap, "build/bench-models/tinyllama-%s.gguf", type);
    if (access(path, R_OK) == 0)
        return 0;
    if (access(vocab, R_OK) != 0) {
        fprintf(stderr, "engine: %s is needed to build the reference models\n", vocab);
        return -1;
    }
    if (mkdir("build/bench-models", 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "engine: build/bench-models: %s\n", strerror(errno));
        return -1;
    }
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "build/mkmodel -o %s --arch llama --dim 2048 --layers 22 --heads 32 "
             "--kv-heads 4 --ffn 5632 --ctx 2048 --type %s --vocab %s --seed 1",
             path, type, vocab);
    fprintf(stderr, "engine: generating %s\n", path);
    if (system(cmd) != 0) {
        fprintf(stderr, "engine: mkmodel failed: %s\n", cmd);
        unlink(path);
        return -1;
    }
    return 0;
}

static int bench_in_child(const char *path, const bench_options *o)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "engine: fork: %s\n", strerror(errno));
        return -1;
    }
    if (pid == 0)
        _exit(bench_model(path, o));
    int wstatus;
    if (waitpid(pid, &wstatus, 0) < 0 || !WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0)
        return -1;
    return 0;
}

static int parse_count(const char *flag, const char *s, int min, int max, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < min || v > max) {
        fprintf(stderr, "engine: %s wants an integer in [%d, %d]\n", flag, min, max);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int main(int argc, char **argv)
{
    bench_options o = {.n_threads = 2, .n_runs = 3, .n_prompt = 512, .n_gen = 64};
    const char *models[64];
    int n_models = 0, failures = 0;

    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : "";
        int rc = 0;
        if (!strcmp(argv[i], "-t"))
            rc = parse_count("-t", v, 1, 256, &o.n_threads), i++;
        else if (!strcmp(argv[i], "-r"))
            rc = parse_count("-r", v, 1, MAX_RUNS, &o.n_runs), i++;
        else if (!strcmp(argv[i], "--prompt"))
            rc = parse_count("--prompt", v, 1, 8192, &o.n_prompt), i++;
        else if (!strcmp(argv[i], "--gen"))
            rc = parse_count("--gen", v, 1, 8192, &o.n_gen), i++;
        else if (argv[i][0] == '-' || n_models == 64)
            rc = -1, fprintf(stderr, "usage: engine [-t N] [-r N] [--prompt N] [--gen N] "
                                     "[MODEL.gguf ...]\n");
        else
            models[n_models++] = argv[i];
        if (rc)
            return 2;
    }

    if (n_models == 0) {
        static char paths[2][256];
        const char *types[2] = {"q8_0", "f16"};
        for (int i = 0; i < 2; i++) {
            if (ensure_reference_model(types[i], paths[i], sizeof paths[i]))
                return 1;
            models[n_models++] = paths[i];
        }
    }
    for (int i = 0; i < n_models; i++)
        if (bench_in_child(models[i], &o))
            failures++;
    return failures ? 1 : 0;
}
