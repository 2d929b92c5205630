/*
 * bench/engine — prefill and decode speed of the engine, and its peak memory.
 *
 *   build/bench/engine [-t THREADS] [-r RUNS] [--prompt N] [--gen N] [--load copy|map|both]
 *                      [--llama-bench PATH] [--moe] [--mla] [--device cpu|cuda[:N]]
 *                      [MODEL.gguf ...]
 *
 * With no model given it benchmarks the reference shape — a TinyLlama-1.1B-shaped
 * llama (dim 2048, 22 layers, 32 heads, 4 KV heads, FFN 5632, the llama-spm vocabulary)
 * in Q8_0, F16, BF16, Q4_K_M and Q6_K (the types of issue 11's target), and the low-bit
 * mixes phones and edge boxes run, Q3_K_M and Q2_K (mkmodel's q2_k_mix) — generating the
 * files with build/mkmodel into build/bench-models/ on first use.
 *
 * --moe benchmarks a mixture of experts instead: 4 layers of a Qwen1.5-MoE-A2.7B-shaped
 * qwen2moe (dim 2048, 16 heads, 60 experts of FFN 1408 of which 4 are used, a shared expert
 * of FFN 5632, the llama-spm vocabulary) in Q4_K_M, made the same way (its 24 layers take
 * mkmodel 40 minutes on two cores; a layer's time is the same in both). A token's decode
 * reads only its experts' weights: for such a model the bandwidth figures count the
 * weights one token reads (active_weight_mb: every matrix but the experts', and
 * expert_used_count / expert_count of theirs), not the file.
 *
 * --mla benchmarks deepseek2's latent attention: 4 layers of a DeepSeek-V2-Lite-shaped
 * deepseek2 (dim 2048, 16 heads, a latent of 512 and 64 rotated dimensions, heads of 128 +
 * 64 and values of 128, a dense first layer of FFN 10944, then 64 experts of FFN 1408 of
 * which 6 are used and 2 shared ones, V2's YaRN) with V2's query latent of 1536 (llama.cpp
 * loads a file without one only at 26, 27 or 48 layers), in Q4_K_M.
 *
 * --llama-bench PATH names a llama.cpp llama-bench built elsewhere (never part of this
 * repository): each of our runs is paired with one llama-bench run on the same file and
 * thread count (-p prompt -n gen -r 1, weights mapped), the two alternating which goes
 * first, and the line gets llama.cpp's medians and our ratio to them.
 *
 * Each model runs in a child process so peak RSS is per model. A run is: prefill of a
 * prompt of random token ids into an empty context, then greedy decode of --gen tokens
 * after it (decode_after_prompt_tok_s), then greedy decode of --gen tokens from one token
 * into an empty context (decode_tok_s), as llama-bench's tg test decodes: the decode
 * ratio compares like with like (after a 512-token prompt attention costs our decode
 * 5-10% on TinyLlama's shape, which llama-bench's tg never pays).
 * Decode streams every weight once per token, and the memory bandwidth of these machines
 * varies from minute to minute, so just before each decode run a child process measures
 * the read bandwidth with the same number of threads (an AVX2 read of 1 GiB with software
 * prefetch); each model line reports the bandwidth its decode reached and, as the median
 * over runs, its share of the bandwidth measured next to it (with --llama-bench, llama.cpp's
 * decode gets the same share, against the read measured in its run's pair).
 *
 * --device cuda runs the models on a GPU (engine/cuda, a make CUDA=1 build) instead; with
 * no model given, TinyLlama's shape in F16, Q8_0 and Q4_K_M and a Llama-3-8B-shaped llama
 * (dim 4096, 32 layers, 32 heads, 8 KV heads, FFN 14336; the llama-spm vocabulary, as
 * every file here) in Q4_K_M and Q8_0. Each run is a prefill of --prompt tokens (one
 * step, the greedy id of the last row back), then greedy decodes of --gen tokens by
 * batches of 1, 8, 32 and 64 sequences from one token each (llama-bench's tg), every
 * step one forward of all of them with only the ids crossing the bus. The device's read
 * bandwidth is measured in the same process (cuda_read_bandwidth); each line reports
 * the decode's share of the bound that bandwidth sets (weight bytes / bandwidth per
 * step), batch 1's speed-up from replaying CUDA graphs over launching each kernel (the
 * same decode run both ways), the prefill's effective TFLOP/s (2 x weights x tokens /
 * time) and, for wider batches, the speed-up over batch 1. One JSON object per model and
 * batch. With --llama-bench (a CUDA build of llama.cpp's), each run is paired with one of
 * its runs on the same file with every layer on the GPU (-ngl 99), and the batch-1 line
 * gets its medians and our ratios to them.
 *
 * Prints one JSON object per model and load mode with the median of the runs. --load
 * picks how the weights come into memory (engine/gguf/gguf.h): mapped from the file (map, the
 * default of llms-run, llmsd and llama.cpp) or read into huge pages (copy, --no-mmap).
 */
#include <errno.h>
#include <immintrin.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench.h"
#include "engine/cuda/cuda.h"
#include "engine/quant/blas.h"
#include "engine/kv/kv.h"
#include "engine/model/model.h"
#include "engine/quant/quant.h"

#define MAX_RUNS 15

typedef struct bench_options {
    int n_threads;
    int n_runs;
    int n_prompt;
    int n_gen;
    gguf_load load;
    const char *llama_bench; /* llama.cpp's llama-bench, or NULL */
    int device;              /* -1: the CPU, else the GPU's index */
} bench_options;

/* One llama-bench run: prompt and generation tokens/s (0 when not measured). */
typedef struct llama_run {
    double prefill_tok_s, decode_tok_s;
} llama_run;

/* Index of name among the n comma-separated, maybe quoted fields of a CSV header. */
static int csv_field_index(char **fields, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(fields[i], name))
            return i;
    return -1;
}

/* Splits line in place at commas, dropping double quotes and the newline. */
static int csv_split(char *line, char **fields, int cap)
{
    int n = 0;
    line[strcspn(line, "\r\n")] = '\0';
    for (char *p = line; n < cap;) {
        char *end = strchr(p, ',');
        if (end)
            *end = '\0';
        if (*p == '"') {
            p++;
            size_t len = strlen(p);
            if (len && p[len - 1] == '"')
                p[len - 1] = '\0';
        }
        fields[n++] = p;
        if (!end)
            break;
        p = end + 1;
    }
    return n;
}

/* Runs llama-bench once on path (its CSV output: one line per test) and reads the
 * tokens/s of its prompt test and of its generation test. */
static int run_llama_bench(const char *path, const bench_options *o, llama_run *out)
{
    *out = (llama_run){0};
    if (strchr(path, '\'') || strchr(o->llama_bench, '\'')) {
        fprintf(stderr, "engine: quotes in %s or %s\n", path, o->llama_bench);
        return -1;
    }
    char cmd[2048];
    /* on a GPU: every layer there (-ngl 99), llama.cpp's CUDA build */
    snprintf(cmd, sizeof cmd, "'%s' -m '%s' -p %d -n %d -t %d -r 1%s -o csv 2>/dev/null",
             o->llama_bench, path, o->n_prompt, o->n_gen, o->n_threads,
             o->device >= 0 ? " -ngl 99" : "");
    fflush(stdout);
    FILE *p = popen(cmd, "r");
    if (!p) {
        fprintf(stderr, "engine: cannot run %s\n", o->llama_bench);
        return -1;
    }
    char line[8192], *fields[128];
    int i_prompt = -1, i_gen = -1, i_ts = -1;
    bool header = true;
    while (fgets(line, sizeof line, p)) {
        int n = csv_split(line, fields, 128);
        if (header) {
            i_prompt = csv_field_index(fields, n, "n_prompt");
            i_gen = csv_field_index(fields, n, "n_gen");
            i_ts = csv_field_index(fields, n, "avg_ts");
            header = false;
            continue;
        }
        if (i_prompt < 0 || i_gen < 0 || i_ts < 0 || n <= i_prompt || n <= i_gen || n <= i_ts)
            continue;
        double ts = atof(fields[i_ts]);
        if (atoi(fields[i_prompt]) > 0 && atoi(fields[i_gen]) == 0)
            out->prefill_tok_s = ts;
        else if (atoi(fields[i_prompt]) == 0 && atoi(fields[i_gen]) > 0)
            out->decode_tok_s = ts;
    }
    int rc = pclose(p);
    if (rc != 0 || out->prefill_tok_s <= 0 || out->decode_tok_s <= 0) {
        fprintf(stderr, "engine: %s gave no prompt and generation figures for %s (%s)\n",
                o->llama_bench, path, cmd);
        return -1;
    }
    return 0;
}


/* Bytes of weights one decode step reads, as the bandwidth figures count them: a dense
 * model's file; of a mixture of experts every tensor but the token embedding (a token
 * reads a row of it, unless the output is tied to it) and expert_used_count /
 * expert_count of the merged experts'. */
static double model_active_bytes(const model *m, double file_bytes)
{
    const model_hparams *hp = model_hparams_of(m);
    if (!hp->n_expert)
        return file_bytes;
    const gguf_file *g = model_gguf(m);
    double bytes = 0;
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        bool experts = t->n_dims == 3;
        bool embd = t->name.len == 17 && !memcmp(t->name.ptr, "token_embd.weight", 17) &&
                    gguf_find_tensor(g, "output.weight");
        if (!embd)
            bytes += experts ? (double)t->bytes * hp->n_expert_used / hp->n_expert
                             : (double)t->bytes;
    }
    return bytes;
}

/* The dominant weight type: that of the first layer's attention query. */
static const char *model_weight_type(const model *m)
{
    const gguf_tensor *t = gguf_find_tensor(model_gguf(m), "blk.0.attn_q.weight");
    const quant_traits *tr = t ? quant_traits_of(t->type) : NULL;
    return tr ? tr->name : "?";
}

#define READ_BYTES ((size_t)1 << 30)
#define READ_MAX_THREADS 64
#define READ_PREFETCH 4096 /* bytes ahead */

typedef struct read_share {
    const __m256i *from; /* (n) */
    size_t n;
    long long sum; /* kept so the reads are not optimised away */
} read_share;

__attribute__((target("avx2"))) static void *read_share_run(void *p)
{
    read_share *r = p;
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 4 <= r->n; i += 4) {
        /* prefetching ahead, as the dot kernels do, finds the bandwidth they can reach */
        _mm_prefetch((const char *)(r->from + i) + READ_PREFETCH, _MM_HINT_T0);
        _mm_prefetch((const char *)(r->from + i) + READ_PREFETCH + 64, _MM_HINT_T0);
        a0 = _mm256_add_epi64(a0, _mm256_load_si256(r->from + i));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256(r->from + i + 1));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256(r->from + i + 2));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256(r->from + i + 3));
    }
    __m256i a = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    long long lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, a);
    r->sum = lanes[0] + lanes[1] + lanes[2] + lanes[3];
    return NULL;
}

/* Read bandwidth in GB/s of n_threads threads each reading its share of a 1 GiB buffer on
 * huge pages (as the weights are with GGUF_LOAD_COPY), median of 5; 0 when it cannot be
 * measured. */
static double measure_read_gb_s(int n_threads)
{
    if (!__builtin_cpu_supports("avx2") || n_threads > READ_MAX_THREADS)
        return 0;
    void *buf = mmap(NULL, READ_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED)
        return 0;
    madvise(buf, READ_BYTES, MADV_HUGEPAGE);
    memset(buf, 1, READ_BYTES);
    size_t n_vec = READ_BYTES / sizeof(__m256i), per = n_vec / (size_t)n_threads;
    read_share shares[READ_MAX_THREADS];
    pthread_t threads[READ_MAX_THREADS];
    double gb_s[5];
    int ok = 1;
    for (int run = 0; run < 5 && ok; run++) {
        double t0 = bench_now_s();
        int started = 0;
        for (int i = 0; i < n_threads; i++) {
            shares[i] = (read_share){.from = (const __m256i *)buf + (size_t)i * per, .n = per};
            if (i > 0 && pthread_create(&threads[i], NULL, read_share_run, &shares[i]) != 0) {
                ok = 0;
                break;
            }
            started = i + 1;
        }
        if (ok)
            read_share_run(&shares[0]);
        for (int i = 1; i < started; i++)
            pthread_join(threads[i], NULL);
        gb_s[run] = (double)per * n_threads * sizeof(__m256i) / (bench_now_s() - t0) / 1e9;
    }
    munmap(buf, READ_BYTES);
    return ok ? bench_median(gb_s, 5) : 0;
}

/* measure_read_gb_s in a child process, so that its buffer stays out of this process's
 * peak RSS; 0 when it cannot be measured. */
static double measure_read_gb_s_apart(int n_threads)
{
    int fds[2];
    double gb_s = 0;
    if (pipe(fds) != 0)
        return 0;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        gb_s = measure_read_gb_s(n_threads);
        _exit(write(fds[1], &gb_s, sizeof gb_s) == (ssize_t)sizeof gb_s ? 0 : 1);
    }
    close(fds[1]);
    if (pid < 0 || read(fds[0], &gb_s, sizeof gb_s) != (ssize_t)sizeof gb_s)
        gb_s = 0;
    close(fds[0]);
    if (pid > 0)
        waitpid(pid, NULL, 0);
    return gb_s;
}

/* Runs the benchmark of one model in this process and prints its JSON line. */
static int bench_model(const char *path, const bench_options *o)
{
    char err[ERR_MAX];
    int status = 1;
    model *m = model_load_as(path, o->load, err);
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
    double prefill[MAX_RUNS], decode[MAX_RUNS], read_gb_s[MAX_RUNS], share[MAX_RUNS];
    double decode_after_prompt[MAX_RUNS];
    double their_prefill[MAX_RUNS], their_decode[MAX_RUNS];
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
        /* llama.cpp before ours on even runs, after on odd ones: drift favours neither */
        llama_run theirs;
        if (o->llama_bench && run % 2 == 0) {
            if (run_llama_bench(path, o, &theirs))
                goto out_seq;
            their_prefill[run] = theirs.prefill_tok_s;
            their_decode[run] = theirs.decode_tok_s;
        }
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
        if (bench_decode_greedy(r, &seq, logits, hp->n_vocab, o->n_prompt, o->n_gen, err)) {
            fprintf(stderr, "engine: decode: %s\n", err);
            kv_seq_free(&seq);
            goto out;
        }
        decode_after_prompt[run] = o->n_gen / (bench_now_s() - t0);
        kv_bytes = kv_pool_bytes_used(seq.pool);
        /* as llama-bench's tg: from one token into an empty context */
        kv_seq_truncate(&seq, 0);
        memset(logits, 0, sizeof *logits * (size_t)hp->n_vocab);
        logits[tokens[0]] = 1;
        read_gb_s[run] = measure_read_gb_s_apart(o->n_threads);
        t0 = bench_now_s();
        if (bench_decode_greedy(r, &seq, logits, hp->n_vocab, 0, o->n_gen, err)) {
            fprintf(stderr, "engine: decode: %s\n", err);
            kv_seq_free(&seq);
            goto out;
        }
        decode[run] = o->n_gen / (bench_now_s() - t0);
        if (o->llama_bench && run % 2 == 1) {
            if (run_llama_bench(path, o, &theirs))
                goto out_seq;
            their_prefill[run] = theirs.prefill_tok_s;
            their_decode[run] = theirs.decode_tok_s;
        }
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
    const double active = model_active_bytes(m, (double)st.st_size);
    double prefill_med = bench_median(prefill, o->n_runs), decode_med = bench_median(decode, o->n_runs);

    printf("{\"bench\":\"engine\",\"model\":\"%s\",\"type\":\"%s\",\"load\":\"%s\","
           "\"blas\":\"%s\",\"dim\":%d,\"layers\":%d,\"threads\":%d,\"runs\":%d,"
           "\"prompt_tokens\":%d,\"gen_tokens\":%d,\"prefill_tok_s\":%.2f,\"decode_tok_s\":%.2f,"
           "\"peak_rss_mb\":%.1f,\"model_mb\":%.1f,\"kv_mb\":%.1f,\"rss_over_model_kv\":%.3f",
           path, type, o->load == GGUF_LOAD_COPY ? "copy" : "map", blas_core_name(), hp->dim,
           hp->n_layer, model_runner_n_threads(r), o->n_runs, o->n_prompt, o->n_gen, prefill_med,
           decode_med, rss_mb, model_mb, kv_mb, rss_mb / (model_mb + kv_mb));
    if (hp->n_expert)
        printf(",\"experts\":%d,\"experts_used\":%d,\"active_weight_mb\":%.1f", hp->n_expert,
               hp->n_expert_used, active / mib);
    int n_shares = 0;
    for (int run = 0; run < o->n_runs; run++)
        if (read_gb_s[run] > 0)
            share[n_shares++] = decode[run] * active / 1e9 / read_gb_s[run];
    if (n_shares > 0)
        printf(",\"decode_read_gb_s\":%.1f,\"machine_read_gb_s\":%.1f,"
               "\"decode_share_of_read\":%.3f",
               decode_med * active / 1e9, bench_median(read_gb_s, o->n_runs),
               bench_median(share, n_shares));
    if (o->llama_bench) {
        double tp = bench_median(their_prefill, o->n_runs), td = bench_median(their_decode, o->n_runs);
        printf(",\"llamacpp_prefill_tok_s\":%.2f,\"llamacpp_decode_tok_s\":%.2f,"
               "\"prefill_ratio\":%.3f,\"decode_ratio\":%.3f",
               tp, td, prefill_med / tp, decode_med / td);
        /* the same share for llama.cpp, against the read measured in its run's pair: where
         * both sit near 1, decode is at the memory wall and neither can pull ahead */
        n_shares = 0;
        for (int run = 0; run < o->n_runs; run++)
            if (read_gb_s[run] > 0)
                share[n_shares++] = their_decode[run] * active / 1e9 / read_gb_s[run];
        if (n_shares > 0)
            printf(",\"llamacpp_decode_share_of_read\":%.3f", bench_median(share, n_shares));
    }
    printf(",\"decode_after_prompt_tok_s\":%.2f}\n", bench_median(decode_after_prompt, o->n_runs));
    fflush(stdout);
    status = 0;
    goto out;
out_seq:
    kv_seq_free(&seq);
out:
    free(logits);
    free(positions);
    free(tokens);
    kv_pool_free(pool);
    model_runner_free(r);
    model_free(m);
    return status;
}

#define CUDA_BATCHES 4
static const int cuda_batches[CUDA_BATCHES] = {1, 8, 32, 64};

/* n_seq sequences each decode n_gen greedy tokens from one token, all in one step each;
 * 0 or -1 + err. */
static int cuda_decode_batch(cuda_model *cm, cuda_seq **seqs, int n_seq, int n_gen,
                             int n_vocab, char err[ERR_MAX])
{
    int32_t tok[64], pos[64], row = 0;
    model_batch b[64];
    for (int i = 0; i < n_seq; i++) {
        cuda_seq_truncate(seqs[i], 0);
        tok[i] = 3 + (i * 7919) % (n_vocab - 3);
    }
    for (int step = 0; step < n_gen; step++) {
        for (int i = 0; i < n_seq; i++) {
            pos[i] = step;
            b[i] = (model_batch){.n_tokens = 1, .tokens = &tok[i], .positions = &pos[i],
                                 .n_out = 1, .out_rows = &row};
        }
        if (cuda_forward_batch(cm, n_seq, seqs, b, tok, NULL, err) < 0)
            return -1;
    }
    return 0;
}

static int bench_model_cuda(const char *path, const bench_options *o)
{
    char err[ERR_MAX];
    int status = 1, max_seq = cuda_batches[CUDA_BATCHES - 1];
    model *m = model_load(path, err);
    cuda_model *cm = NULL;
    cuda_seq *seqs[64] = {0};
    int32_t *tokens = NULL, *positions = NULL;
    double gb_s = 0;
    if (!m || cuda_read_bandwidth(o->device, &gb_s, err) < 0 ||
        !(cm = cuda_model_new(m, o->device, o->n_prompt > max_seq ? o->n_prompt : max_seq,
                              o->n_prompt + o->n_gen, err))) {
        fprintf(stderr, "engine: %s: %s\n", path, err);
        goto out;
    }
    const model_hparams *hp = model_hparams_of(m);
    for (int i = 0; i < max_seq; i++)
        if (!(seqs[i] = cuda_seq_new(cm, err))) {
            fprintf(stderr, "engine: %s: %s\n", path, err);
            goto out;
        }
    tokens = malloc(sizeof *tokens * (size_t)o->n_prompt);
    positions = malloc(sizeof *positions * (size_t)o->n_prompt);
    if (!tokens || !positions)
        goto out;
    srand(1234);
    for (int i = 0; i < o->n_prompt; i++) {
        tokens[i] = 3 + rand() % (hp->n_vocab - 3);
        positions[i] = i;
    }
    double prefill[MAX_RUNS], decode[CUDA_BATCHES][MAX_RUNS], decode_launched[MAX_RUNS];
    double their_prefill[MAX_RUNS], their_decode[MAX_RUNS];
    /* one run's worth first: cuBLAS picks its kernels and the clocks rise */
    for (int run = -1; run < o->n_runs; run++) {
        /* llama.cpp's run of the same file beside each of ours (its model on the GPU
         * while ours is too: the card has room for both) */
        llama_run theirs;
        if (o->llama_bench && run >= 0) {
            if (run_llama_bench(path, o, &theirs))
                goto out;
            their_prefill[run] = theirs.prefill_tok_s;
            their_decode[run] = theirs.decode_tok_s;
        }
        int32_t last = o->n_prompt - 1, id;
        model_batch b = {.n_tokens = o->n_prompt, .tokens = tokens, .positions = positions,
                         .n_out = 1, .out_rows = &last};
        cuda_seq_truncate(seqs[0], 0);
        double t0 = bench_now_s();
        if (cuda_forward_batch(cm, 1, seqs, &b, &id, NULL, err) < 0) {
            fprintf(stderr, "engine: prefill: %s\n", err);
            goto out;
        }
        if (run >= 0)
            prefill[run] = o->n_prompt / (bench_now_s() - t0);
        for (int k = 0; k < CUDA_BATCHES; k++) {
            t0 = bench_now_s();
            if (cuda_decode_batch(cm, seqs, cuda_batches[k], o->n_gen, hp->n_vocab, err) < 0) {
                fprintf(stderr, "engine: decode: %s\n", err);
                goto out;
            }
            if (run >= 0)
                decode[k][run] = (double)cuda_batches[k] * o->n_gen / (bench_now_s() - t0);
        }
        /* the baseline of the graphs: batch 1 with every kernel launched by itself */
        cuda_model_use_graphs(cm, false);
        t0 = bench_now_s();
        if (cuda_decode_batch(cm, seqs, 1, o->n_gen, hp->n_vocab, err) < 0) {
            fprintf(stderr, "engine: decode: %s\n", err);
            goto out;
        }
        if (run >= 0)
            decode_launched[run] = o->n_gen / (bench_now_s() - t0);
        cuda_model_use_graphs(cm, true);
    }
    /* every matrix's weights, what one decode step reads: the embedding only when the
     * output is tied to it (its rows are looked up on the host otherwise) */
    double weight_bytes = (double)cuda_model_weight_bytes(cm);
    double params = 0;
    for (int l = 0; l < hp->n_layer; l++) {
        model_layer_tensors t;
        model_layer_tensors_of(m, l, &t);
        const ops_matrix *w[] = {&t.wq, &t.wk, &t.wv, &t.wo, &t.w_gate, &t.w_up, &t.w_down};
        for (int i = 0; i < 7; i++)
            params += (double)w[i]->rows * w[i]->cols;
    }
    params += (double)hp->n_vocab * hp->dim;
    double prefill_med = bench_median(prefill, o->n_runs);
    double dec1 = 0;
    for (int k = 0; k < CUDA_BATCHES; k++) {
        double dec = bench_median(decode[k], o->n_runs);
        if (k == 0)
            dec1 = dec;
        printf("{\"bench\":\"engine\",\"device\":\"cuda\",\"gpu\":\"%s\",\"model\":\"%s\","
               "\"type\":\"%s\",\"dim\":%d,\"layers\":%d,\"runs\":%d,\"weight_mb\":%.1f,"
               "\"device_read_gb_s\":%.0f,\"batch\":%d,\"gen_tokens\":%d,"
               "\"decode_tok_s\":%.1f",
               cuda_model_device_name(cm), path, model_weight_type(m), hp->dim, hp->n_layer,
               o->n_runs, weight_bytes / 1048576.0, gb_s, cuda_batches[k], o->n_gen, dec);
        if (k == 0)
            printf(",\"bound_tok_s\":%.1f,\"decode_share_of_bound\":%.3f,"
                   "\"decode_tok_s_without_graphs\":%.1f,\"graphs_speedup\":%.2f,"
                   "\"prompt_tokens\":%d,\"prefill_tok_s\":%.1f,\"prefill_tflop_s\":%.1f",
                   gb_s * 1e9 / weight_bytes, dec * weight_bytes / (gb_s * 1e9),
                   bench_median(decode_launched, o->n_runs),
                   dec / bench_median(decode_launched, o->n_runs), o->n_prompt, prefill_med,
                   2 * params * prefill_med / 1e12);
        if (k == 0 && o->llama_bench) {
            double tp = bench_median(their_prefill, o->n_runs);
            double td = bench_median(their_decode, o->n_runs);
            printf(",\"llamacpp_prefill_tok_s\":%.1f,\"llamacpp_decode_tok_s\":%.1f,"
                   "\"prefill_ratio\":%.3f,\"decode_ratio\":%.3f",
                   tp, td, prefill_med / tp, dec / td);
        }
        else
            printf(",\"speedup_over_batch1\":%.2f", dec / dec1);
        printf("}\n");
    }
    fflush(stdout);
    status = 0;
out:
    for (int i = 0; i < max_seq; i++)
        cuda_seq_free(seqs[i]);
    free(tokens);
    free(positions);
    cuda_model_free(cm);
    model_free(m);
    return status;
}

/* The reference models bench/engine generates. */
enum bench_shape { BENCH_TINYLLAMA, BENCH_LLAMA8B, BENCH_MOE, BENCH_MLA };

/* Makes build/bench-models/tinyllama-TYPE.gguf (the other shapes: llama8b-, qwen2moe-a2.7b-4l-,
 * deepseek2-v2lite-4l-TYPE.gguf) with mkmodel unless it exists. */
static int ensure_reference_model(const char *type, enum bench_shape shape, char *path,
                                  size_t cap)
{
    static const char *const names[] = {[BENCH_TINYLLAMA] = "tinyllama",
                                        [BENCH_LLAMA8B] = "llama8b",
                                        [BENCH_MOE] = "qwen2moe-a2.7b-4l",
                                        [BENCH_MLA] = "deepseek2-v2lite-4l"};
    bool moe = shape == BENCH_MOE, llama8b = shape == BENCH_LLAMA8B;
    const char *vocab = "../shared/testdata/vocab/ggml-vocab-llama-spm.gguf";
    snprintf(path, cap, "build/bench-models/%s-%s.gguf", names[shape], type);
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
    if (llama8b)
        snprintf(cmd, sizeof cmd,
                 "build/mkmodel -o %s --arch llama --dim 4096 --layers 32 --heads 32 "
                 "--kv-heads 8 --ffn 14336 --ctx 8192 --type %s --vocab %s --seed 1",
                 path, type, vocab);
    else if (shape == BENCH_MLA)
        snprintf(cmd, sizeof cmd,
                 "build/mkmodel -o %s --arch deepseek2 --dim 2048 --layers 4 --heads 16 "
                 "--kv-heads 1 --ffn 10944 --experts 64 --experts-used 6 --expert-ffn 1408 "
                 "--shared-experts 2 --dense-lead 1 --kv-lora 512 --qk-nope 128 --qk-rope 64 "
                 "--v-head 128 --q-lora 1536 --ctx 163840 --rope-orig-ctx 4096 "
                 "--yarn-factor 40 --mscale-all-dim 0.707 --type %s --vocab %s --seed 1",
                 path, type, vocab);
    else if (moe)
        snprintf(cmd, sizeof cmd,
                 "build/mkmodel -o %s --arch qwen2moe --dim 2048 --layers 4 --heads 16 "
                 "--kv-heads 16 --ffn 5632 --experts 60 --experts-used 4 --expert-ffn 1408 "
                 "--shared-ffn 5632 --ctx 2048 --type %s --vocab %s --seed 1", path, type, vocab);
    else
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
        _exit(o->device >= 0 ? bench_model_cuda(path, o) : bench_model(path, o));
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
    bench_options o = {.n_threads = 2, .n_runs = 3, .n_prompt = 512, .n_gen = 64, .device = -1};
    const char *models[64];
    int n_models = 0, failures = 0;
    bool load_copy = true, load_map = true, moe = false, mla = false;

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
        else if (!strcmp(argv[i], "--load") && (!strcmp(v, "copy") || !strcmp(v, "map") ||
                                                 !strcmp(v, "both")))
            load_copy = strcmp(v, "map") != 0, load_map = strcmp(v, "copy") != 0, i++;
        else if (!strcmp(argv[i], "--llama-bench") && *v)
            o.llama_bench = v, i++;
        else if (!strcmp(argv[i], "--moe"))
            moe = true;
        else if (!strcmp(argv[i], "--mla"))
            mla = true;
        else if (!strcmp(argv[i], "--device") && *v) {
            char err[ERR_MAX];
            if (cuda_parse_device(v, &o.device, err) < 0)
                rc = -1, fprintf(stderr, "engine: %s\n", err);
            i++;
        }
        else if (argv[i][0] == '-' || n_models == 64)
            rc = -1, fprintf(stderr, "usage: engine [-t N] [-r N] [--prompt N] [--gen N] "
                                     "[--load copy|map|both] [--llama-bench PATH] [--moe] "
                                     "[--mla] "
                                     "[--device cpu|cuda[:N]] "
                                     "[MODEL.gguf ...]\n");
        else
            models[n_models++] = argv[i];
        if (rc)
            return 2;
    }

    if (n_models == 0 && (moe || mla)) {
        static char path[256];
        if (ensure_reference_model("q4_k_m", mla ? BENCH_MLA : BENCH_MOE, path, sizeof path))
            return 1;
        models[n_models++] = path;
    } else if (n_models == 0 && o.device >= 0) {
        static const char *const types[] = {"f16", "q8_0", "q4_k_m", "q4_k_m", "q8_0"};
        static char paths[5][256];
        for (int i = 0; i < 5; i++) {
            if (ensure_reference_model(types[i], i >= 3 ? BENCH_LLAMA8B : BENCH_TINYLLAMA,
                                       paths[i], sizeof paths[i]))
                return 1;
            models[n_models++] = paths[i];
        }
    } else if (n_models == 0) {
        static const char *const types[] = {"q8_0", "f16",    "bf16",    "q4_k_m",
                                            "q6_k", "q3_k_m", "q2_k_mix"};
        enum { N_TYPES = sizeof types / sizeof types[0] };
        static char paths[N_TYPES][256];
        for (int i = 0; i < N_TYPES; i++) {
            if (ensure_reference_model(types[i], BENCH_TINYLLAMA, paths[i], sizeof paths[i]))
                return 1;
            models[n_models++] = paths[i];
        }
    }
    for (int i = 0; i < n_models && o.device >= 0; i++)
        if (bench_in_child(models[i], &o))
            failures++;
    for (int i = 0; i < n_models && o.device < 0; i++) {
        o.load = GGUF_LOAD_COPY;
        if (load_copy && bench_in_child(models[i], &o))
            failures++;
        o.load = GGUF_LOAD_MAP;
        if (load_map && bench_in_child(models[i], &o))
            failures++;
    }
    return failures ? 1 : 0;
}
