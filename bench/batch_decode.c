/*
 * bench/batch_decode — aggregate decode throughput of N sequences advanced together.
 *
 *   build/bench/batch_decode [-t THREADS] [-r RUNS] [--steps D] [--prefix P]
 *                            [--model FILE | --dim N --layers N --heads N --kv-heads N
 *                             --ffn N --vocab N] [--prepare] [--no-serial] [--plain]
 *
 * For N in 1, 4 and 16 sequences, each holding a P-token prefix (default 128), D decode
 * steps (default 64); a step gives every sequence one new token (the argmax of
 * its last logits) either in ONE model_forward_batch of N rows ("batched": each weight
 * matrix read once per step) or in N separate model_forward calls ("serial": the
 * baseline, each call reading every weight; --no-serial leaves it out). A run does this
 * for each N in turn, the two kinds alternating which goes first; each figure is the
 * median over RUNS (default 3) of N * D / seconds.
 *
 * Prints one JSON object per N: batched_tok_s, serial_tok_s, batched_over_serial,
 * ratio_to_1 (batched_tok_s over the N = 1 batched figure of the same process; with
 * serial_ratio_to_1 likewise) and ratio_to_1_per_run (the median over runs of each run's
 * batched figure over that run's N = 1 one: on a shared machine the load moves both
 * figures of a run together, which the ratio of medians does not see).
 *
 * The weights are repacked (model_repack_weights) as llmsd does; --plain keeps them as
 * the file stores them (the layout before repacking, for a baseline in the same build).
 *
 * Without --model it generates a llama-shaped Q8_0 model of the given shape (default
 * dim 768, 12 layers, 12 heads, 4 KV heads, FFN 2048, 32000 tokens: ~125M parameters)
 * into build/bench-models/ on first use; --prepare only does that. The sequences'
 * prefixes are copies of one prefill, so setting up 16 of them costs one prefill.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench/bench.h"
#include "engine/kv/kv.h"
#include "engine/model/model.h"
#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"

#define MAX_RUNS 15
#define MAX_N 16

static const int N_SEQ[] = {1, 4, 16};

typedef struct options {
    int n_threads, n_runs, n_steps, n_prefix;
    const char *model;
    modelgen_params gen;
    bool prepare, serial, plain;
} options;

/* build/bench-models/batch-llama-DIMxLAYERS-...-q8_0.gguf, generated unless present. */
static int ensure_model(modelgen_params *p, char *path, size_t cap)
{
    snprintf(path, cap, "build/bench-models/batch-llama-%dx%d-h%d-kv%d-ff%d-v%d-q8_0.gguf",
             p->dim, p->n_layer, p->n_head, p->n_head_kv, p->n_ff, p->n_vocab);
    return bench_generate_model("batch_decode", p, path);
}

/* The state of N sequences decoding. */
typedef struct decode_state {
    model_runner *r;
    int n, nv;
    kv_seq *seq;        /* (MAX_N) */
    int32_t tok[MAX_N], pos[MAX_N];
    float *logits;      /* (MAX_N, n_vocab) */
} decode_state;

/* D steps over the first n sequences; seconds, or -1. The sequences are cut back to the
 * prefix afterwards. */
static double run_steps(decode_state *st, int n, int n_prefix, int n_steps, bool batched)
{
    char err[ERR_MAX];
    int32_t row0 = 0;
    model_batch b[MAX_N];
    kv_seq *seqs[MAX_N];
    for (int i = 0; i < n; i++) {
        st->tok[i] = (int32_t)(3 + (i * 101) % (st->nv - 3));
        st->pos[i] = n_prefix;
        seqs[i] = &st->seq[i];
    }
    double t0 = bench_now_s();
    for (int s = 0; s < n_steps; s++) {
        for (int i = 0; i < n; i++)
            b[i] = (model_batch){.n_tokens = 1, .tokens = &st->tok[i], .positions = &st->pos[i],
                                 .n_out = 1, .out_rows = &row0,
                                 .logits = st->logits + (size_t)i * st->nv};
        int rc = 0;
        if (batched)
            rc = model_forward_batch(st->r, n, seqs, b, err);
        else
            for (int i = 0; i < n && rc == 0; i++)
                rc = model_forward(st->r, seqs[i], &b[i], err);
        if (rc < 0) {
            fprintf(stderr, "batch_decode: forward: %s\n", err);
            return -1;
        }
        for (int i = 0; i < n; i++)
            st->tok[i] = bench_argmax(st->logits + (size_t)i * st->nv, st->nv), st->pos[i]++;
    }
    double dt = bench_now_s() - t0;
    for (int i = 0; i < n; i++)
        kv_seq_truncate(&st->seq[i], n_prefix);
    return dt;
}

static int bench(const char *path, const options *o)
{
    char err[ERR_MAX];
    int status = 1;
    model *m = model_load(path, err);
    if (m && !o->plain && model_repack_weights(m, err) < 0) {
        model_free(m);
        m = NULL;
    }
    if (!m) {
        fprintf(stderr, "batch_decode: %s\n", err);
        return 1;
    }
    const model_hparams *hp = model_hparams_of(m);
    decode_state st = {.nv = hp->n_vocab};
    kv_seq seqs[MAX_N];
    int n_init = 0;
    int32_t *tok = malloc((size_t)o->n_prefix * sizeof *tok);
    int32_t *pos = malloc((size_t)o->n_prefix * sizeof *pos);
    st.logits = malloc((size_t)MAX_N * hp->n_vocab * sizeof(float));
    st.r = model_runner_new(m, o->n_threads, 64, o->n_prefix + o->n_steps + 1, err);
    kv_pool *pool = st.r ? kv_pool_new(model_kv_shape(m), 0, err) : NULL;
    if (!pool || !tok || !pos || !st.logits) {
        fprintf(stderr, "batch_decode: %s\n", err);
        goto out;
    }
    st.seq = seqs;
    for (int i = 0; i < o->n_prefix; i++)
        tok[i] = (int32_t)(3 + (i * 7919) % (hp->n_vocab - 3)), pos[i] = i;
    for (; n_init < MAX_N; n_init++) {
        kv_seq_init(&seqs[n_init], pool);
        model_batch pre = {.n_tokens = o->n_prefix, .tokens = tok, .positions = pos};
        if (n_init == 0 ? model_forward(st.r, &seqs[0], &pre, err)
                        : kv_seq_copy(&seqs[n_init], &seqs[0], err)) {
            fprintf(stderr, "batch_decode: prefix: %s\n", err);
            n_init++;
            goto out;
        }
    }
    /* one untimed step of each kind: page in the weights, warm the pool */
    if (run_steps(&st, MAX_N, o->n_prefix, 1, true) < 0 ||
        run_steps(&st, MAX_N, o->n_prefix, 1, false) < 0)
        goto out;

    /* Each run takes every N in turn, so that the machine's drift (other processes come
     * and go) reaches the N = 1 figure the ratios divide by as much as the others. */
    enum { N_N = sizeof N_SEQ / sizeof *N_SEQ };
    double tb[N_N][MAX_RUNS], ts[N_N][MAX_RUNS];
    for (int run = 0; run < o->n_runs; run++)
        for (int k = 0; k < N_N; k++) {
            int n = N_SEQ[k];
            /* alternate which goes first, so that drift of the machine favours neither */
            double b = 0, s = 0;
            if (run % 2 && o->serial)
                s = run_steps(&st, n, o->n_prefix, o->n_steps, false);
            b = run_steps(&st, n, o->n_prefix, o->n_steps, true);
            if (run % 2 == 0 && o->serial)
                s = run_steps(&st, n, o->n_prefix, o->n_steps, false);
            if (b < 0 || s < 0)
                goto out;
            tb[k][run] = (double)n * o->n_steps / b;
            ts[k][run] = s > 0 ? (double)n * o->n_steps / s : 0;
        }
    /* per-run ratios (before the medians sort tb): a run's N = 1 figure was taken within
     * seconds of its others, under the same load */
    double run_ratio[N_N][MAX_RUNS];
    for (int k = 0; k < N_N; k++)
        for (int run = 0; run < o->n_runs; run++)
            run_ratio[k][run] = tb[k][run] / tb[0][run];
    double base_b = bench_median(tb[0], o->n_runs), base_s = bench_median(ts[0], o->n_runs);
    const gguf_tensor *wq = gguf_find_tensor(model_gguf(m), "blk.0.attn_q.weight");
    for (int k = 0; k < N_N; k++) {
        double mb = bench_median(tb[k], o->n_runs), ms = bench_median(ts[k], o->n_runs);
        printf("{\"bench\":\"batch_decode\",\"model\":\"%s\",\"type\":\"%s\",\"dim\":%d,"
               "\"layers\":%d,\"heads\":%d,\"kv_heads\":%d,\"ffn\":%d,\"vocab\":%d,"
               "\"threads\":%d,\"runs\":%d,\"prefix\":%d,\"steps\":%d,\"n_seq\":%d,"
               "\"batched_tok_s\":%.2f,\"ratio_to_1\":%.3f,\"ratio_to_1_per_run\":%.3f",
               path, wq ? quant_traits_of(wq->type)->name : "?", hp->dim, hp->n_layer,
               hp->n_head, hp->n_head_kv, hp->n_ff, hp->n_vocab, model_runner_n_threads(st.r),
               o->n_runs, o->n_prefix, o->n_steps, N_SEQ[k], mb, mb / base_b,
               bench_median(run_ratio[k], o->n_runs));
        if (o->serial)
            printf(",\"serial_tok_s\":%.2f,\"batched_over_serial\":%.3f,"
                   "\"serial_ratio_to_1\":%.3f",
                   ms, mb / ms, ms / base_s);
        printf("}\n");
        fflush(stdout);
    }
    status = 0;
out:
    for (int i = 0; i < n_init; i++)
        kv_seq_free(&seqs[i]);
    kv_pool_free(pool);
    model_runner_free(st.r);
    free(st.logits);
    free(tok);
    free(pos);
    model_free(m);
    return status;
}

static int parse_count(const char *flag, const char *s, int min, int max, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < min || v > max) {
        fprintf(stderr, "batch_decode: %s wants an integer in [%d, %d]\n", flag, min, max);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int main(int argc, char **argv)
{
    options o = {.n_runs = 3, .n_steps = 64, .n_prefix = 128, .serial = true,
                 .gen = {.arch = "llama", .dim = 768, .n_layer = 12, .n_head = 12,
                         .n_head_kv = 4, .n_ff = 2048, .n_ctx = 2048, .type = QTYPE_Q8_0,
                         .seed = 1, .n_vocab = 32000}};
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : "";
        int rc = 0;
        if (!strcmp(argv[i], "-t"))
            rc = parse_count("-t", v, 1, 256, &o.n_threads), i++;
        else if (!strcmp(argv[i], "-r"))
            rc = parse_count("-r", v, 1, MAX_RUNS, &o.n_runs), i++;
        else if (!strcmp(argv[i], "--steps"))
            rc = parse_count("--steps", v, 1, 4096, &o.n_steps), i++;
        else if (!strcmp(argv[i], "--prefix"))
            rc = parse_count("--prefix", v, 1, 8192, &o.n_prefix), i++;
        else if (!strcmp(argv[i], "--model") && *v)
            o.model = v, i++;
        else if (!strcmp(argv[i], "--dim"))
            rc = parse_count("--dim", v, 32, 16384, &o.gen.dim), i++;
        else if (!strcmp(argv[i], "--layers"))
            rc = parse_count("--layers", v, 1, 256, &o.gen.n_layer), i++;
        else if (!strcmp(argv[i], "--heads"))
            rc = parse_count("--heads", v, 1, 256, &o.gen.n_head), i++;
        else if (!strcmp(argv[i], "--kv-heads"))
            rc = parse_count("--kv-heads", v, 1, 256, &o.gen.n_head_kv), i++;
        else if (!strcmp(argv[i], "--ffn"))
            rc = parse_count("--ffn", v, 32, 65536, &o.gen.n_ff), i++;
        else if (!strcmp(argv[i], "--vocab"))
            rc = parse_count("--vocab", v, 16, 1 << 18, &o.gen.n_vocab), i++;
        else if (!strcmp(argv[i], "--prepare"))
            o.prepare = true;
        else if (!strcmp(argv[i], "--no-serial"))
            o.serial = false;
        else if (!strcmp(argv[i], "--plain"))
            o.plain = true;
        else
            rc = -1, fprintf(stderr, "usage: batch_decode [-t N] [-r N] [--steps D] "
                                     "[--prefix P] [--model FILE | --dim N --layers N "
                                     "--heads N --kv-heads N --ffn N --vocab N] [--prepare] "
                                     "[--no-serial] [--plain]\n");
        if (rc)
            return 2;
    }
    char path[512];
    if (!o.model) {
        if (ensure_model(&o.gen, path, sizeof path) < 0)
            return 1;
        o.model = path;
    }
    return o.prepare ? 0 : bench(o.model, &o);
}
