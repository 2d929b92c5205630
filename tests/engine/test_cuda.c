/*
 * The CUDA backend (engine/cuda/cuda.h) against the CPU path, on a GPU: logits of every
 * architecture it runs (llama, qwen2, qwen3) in every weight type it computes, through
 * prefill on cuBLAS, small batches on the matrix-vector kernels and one-token decodes;
 * sequences stacked in one step against each alone; a context written through to host
 * chunks and read back (f16, and compressed to int8); the trained documentation model's
 * perplexity and greedy text against the CPU's; refusals. Skips without a GPU or in a
 * build without CUDA (make CUDA=1).
 *
 * Tolerances, as the largest logit difference over the largest logit: TOL_FLOAT for
 * float weights (cuBLAS multiplies f16-rounded activations in prefill), TOL_QUANT for
 * quantized ones (the CPU's dot kernels round the activations to 8 bits, the GPU's keep
 * them in f32).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cuda/cuda.h"
#include "engine/gguf/gguf.h"
#include "engine/gguf/modelgen.h"
#include "engine/model/model.h"
#include "engine/quant/quant.h"
#include "engine/readall.h"
#include "engine/tok/tokenizer.h"
#include "tests/support/model_check.h"
#include "tests/support/test.h"

#define TOL_FLOAT 0.01
#define TOL_QUANT 0.05
#define N_VOCAB 300
#define MAX_ROWS 64

static bool have_gpu(void)
{
    char err[ERR_MAX];
    if (!cuda_built()) {
        test_skip("built without CUDA (make CUDA=1)");
        return false;
    }
    if (cuda_device_count(err) == 0) {
        test_skip("no GPU: %s", err);
        return false;
    }
    return true;
}

static const char *make_model(const char *arch, uint32_t type, const char *name)
{
    static char path[1024];
    char err[ERR_MAX];
    snprintf(path, sizeof path, "%s/%s.gguf", test_tmpdir(), name);
    modelgen_params p = {
        .arch = arch,
        .dim = 512,
        .n_layer = 2,
        .n_head = 8,
        .n_head_kv = 2,
        .n_ff = 1024,
        .n_ctx = 512,
        .type = type,
        .seed = 7,
        .n_vocab = N_VOCAB,
        .n_threads = 2,
    };
    if (modelgen_write(&p, path, err) < 0) {
        fprintf(stderr, "modelgen: %s\n", err);
        return NULL;
    }
    return path;
}

/* The three batches every comparison runs on one sequence: a 40-row prefill, a 20-row
 * batch and 6 one-token decodes; every row's logits. */
#define PLAN_ROWS 66
static const int PLAN[] = {40, 20, 1, 1, 1, 1, 1, 1};
#define PLAN_N (int)(sizeof PLAN / sizeof *PLAN)

static int32_t plan_token(int i)
{
    return (int32_t)((i * 37 + 11) % N_VOCAB);
}

/* One batch of the plan: its ids, positions and out rows, and the batch reading them. */
typedef struct plan_step {
    int32_t tok[MAX_ROWS], pos[MAX_ROWS], out[MAX_ROWS];
    model_batch b;
} plan_step;

/* Batch b of the plan, whose first row is entry `at`: every row out, its logits at their
 * place in logits (PLAN_ROWS, N_VOCAB). */
static const model_batch *plan_batch(plan_step *ps, int b, int at, float *logits)
{
    for (int t = 0; t < PLAN[b]; t++) {
        ps->tok[t] = plan_token(at + t);
        ps->pos[t] = at + t;
        ps->out[t] = t;
    }
    ps->b = (model_batch){.n_tokens = PLAN[b], .tokens = ps->tok, .positions = ps->pos,
                          .n_out = PLAN[b], .out_rows = ps->out,
                          .logits = logits + (size_t)at * N_VOCAB};
    return &ps->b;
}

/* logits (PLAN_ROWS, n_vocab) of the plan on the CPU. */
static int run_cpu(model *m, float *logits)
{
    char err[ERR_MAX];
    model_runner *r = model_runner_new(m, 2, MAX_ROWS, 256, err);
    kv_pool *pool = r ? kv_pool_new(model_kv_shape(m), 0, err) : NULL;
    if (!pool) {
        fprintf(stderr, "cpu: %s\n", err);
        model_runner_free(r);
        return -1;
    }
    kv_seq seq;
    kv_seq_init(&seq, pool);
    int at = 0, rc = 0;
    for (int b = 0; b < PLAN_N && rc == 0; b++) {
        plan_step ps;
        if ((rc = model_forward(r, &seq, plan_batch(&ps, b, at, logits), err)) < 0)
            fprintf(stderr, "cpu forward: %s\n", err);
        at += PLAN[b];
    }
    kv_seq_free(&seq);
    kv_pool_free(pool);
    model_runner_free(r);
    return rc;
}

/* The same on the GPU. */
static int run_gpu(cuda_model *cm, float *logits)
{
    char err[ERR_MAX];
    cuda_seq *s = cuda_seq_new(cm, err);
    if (!s) {
        fprintf(stderr, "gpu: %s\n", err);
        return -1;
    }
    int at = 0, rc = 0;
    for (int b = 0; b < PLAN_N && rc == 0; b++) {
        plan_step ps;
        if ((rc = cuda_forward_batch(cm, 1, &s, plan_batch(&ps, b, at, logits), NULL, NULL,
                                     err)) < 0)
            fprintf(stderr, "gpu forward: %s\n", err);
        at += PLAN[b];
    }
    cuda_seq_free(s);
    return rc;
}

static void test_logits_match_cpu(void)
{
    if (!have_gpu())
        return;
    static const char *const archs[] = {"llama", "qwen2", "qwen3"};
    static const uint32_t types[] = {QTYPE_F32,  QTYPE_F16,  QTYPE_BF16, QTYPE_Q8_0,
                                     QTYPE_Q4_0, QTYPE_Q4_K, QTYPE_Q5_K, QTYPE_Q6_K};
    size_t n = (size_t)PLAN_ROWS * N_VOCAB;
    float *cpu = malloc(n * sizeof(float)), *gpu = malloc(n * sizeof(float));
    CHECK(cpu && gpu);
    for (size_t a = 0; a < sizeof archs / sizeof *archs; a++)
        for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
            const char *tname = quant_traits_of(types[t])->name;
            char name[64], err[ERR_MAX];
            snprintf(name, sizeof name, "%s-%s", archs[a], tname);
            const char *path = make_model(archs[a], types[t], name);
            model *m = path ? model_load(path, err) : NULL;
            cuda_model *cm = m ? cuda_model_new(m, 0, MAX_ROWS, 256, err) : NULL;
            bool ok = cm && run_cpu(m, cpu) == 0 && run_gpu(cm, gpu) == 0;
            double rel = ok ? model_check_max_rel(cpu, gpu, n) : 1e9;
            /* the figure of the last decode row alone: decode runs the matrix-vector
             * kernels on every type */
            double rel_decode = ok ? model_check_max_rel(cpu + (n - N_VOCAB), gpu + (n - N_VOCAB),
                                                         N_VOCAB)
                                   : 1e9;
            printf("# %-14s max |logit diff| / max |logit|: %.2e (last decode row %.2e)\n", name,
                   rel, rel_decode);
            if (!cm)
                printf("#   %s\n", err);
            cuda_model_free(cm);
            model_free(m);
            bool is_float = types[t] == QTYPE_F32 || types[t] == QTYPE_F16 ||
                            types[t] == QTYPE_BF16;
            CHECK_MSG(rel < (is_float ? TOL_FLOAT : TOL_QUANT), "%s: %.3g", name, rel);
        }
    free(cpu);
    free(gpu);
}

/* Steps replayed from CUDA graphs give the bits of steps launched kernel by kernel. */
static void test_graphs_replay_the_same(void)
{
    if (!have_gpu())
        return;
    char err[ERR_MAX];
    const char *path = make_model("llama", QTYPE_Q4_K, "graphs");
    model *m = path ? model_load(path, err) : NULL;
    CHECK(m);
    cuda_model *cm = cuda_model_new(m, 0, MAX_ROWS, 256, err);
    CHECK_MSG(cm, "%s", err);
    size_t n = (size_t)PLAN_ROWS * N_VOCAB;
    float *with = malloc(n * sizeof(float)), *without = malloc(n * sizeof(float));
    CHECK(with && without);
    CHECK(run_gpu(cm, with) == 0);
    cuda_model_use_graphs(cm, false);
    CHECK(run_gpu(cm, without) == 0);
    CHECK(memcmp(with, without, n * sizeof(float)) == 0);
    free(with);
    free(without);
    cuda_model_free(cm);
    model_free(m);
}

/* Four sequences at different lengths advance in one step by step[i] rows each (decode
 * rows and a prefill slice), and each gives what it gives alone: bit for bit when every
 * product takes the same path both ways (at most 8 rows stacked: the matrix-vector
 * kernels), within TOL_QUANT when the stacked step's products go to cuBLAS and a lone
 * decode row's do not (f16 activations against 8-bit ones); the largest difference is
 * printed. */
static void check_stacked(cuda_model *cm, const int *step, bool exact)
{
    char err[ERR_MAX];
    enum { N_SEQ = 4, MAX_STEP = 24 };
    static const int prefix[N_SEQ] = {5, 17, 33, 9};
    cuda_seq *together[N_SEQ], *alone[N_SEQ];
    float *lt = malloc((size_t)N_SEQ * MAX_STEP * N_VOCAB * sizeof(float));
    float *la = malloc((size_t)MAX_STEP * N_VOCAB * sizeof(float));
    int32_t ids_t[N_SEQ * MAX_STEP], ids_a[MAX_STEP];
    CHECK(lt && la);
    int32_t tok[N_SEQ][64], pos[N_SEQ][64], out[N_SEQ][MAX_STEP];
    for (int i = 0; i < N_SEQ; i++) {
        together[i] = cuda_seq_new(cm, err);
        alone[i] = cuda_seq_new(cm, err);
        CHECK_MSG(together[i] && alone[i], "%s", err);
        for (int t = 0; t < prefix[i] + step[i]; t++) {
            tok[i][t] = plan_token(t * (i + 2));
            pos[i][t] = t;
        }
        model_batch pre = {.n_tokens = prefix[i], .tokens = tok[i], .positions = pos[i]};
        CHECK_MSG(cuda_forward_batch(cm, 1, &together[i], &pre, NULL, NULL, err) == 0, "%s", err);
        CHECK_MSG(cuda_forward_batch(cm, 1, &alone[i], &pre, NULL, NULL, err) == 0, "%s", err);
        for (int o = 0; o < step[i]; o++)
            out[i][o] = o;
    }
    model_batch steps[N_SEQ];
    float *dst = lt;
    int rows = 0;
    for (int i = 0; i < N_SEQ; i++) {
        steps[i] = (model_batch){.n_tokens = step[i], .tokens = tok[i] + prefix[i],
                                 .positions = pos[i] + prefix[i], .n_out = step[i],
                                 .out_rows = out[i], .logits = dst};
        dst += (size_t)step[i] * N_VOCAB;
        rows += step[i];
    }
    CHECK_MSG(cuda_forward_batch(cm, N_SEQ, together, steps, ids_t, NULL, err) == 0, "%s", err);
    double worst = 0;
    int k = 0;
    dst = lt;
    for (int i = 0; i < N_SEQ; i++) {
        model_batch one = steps[i];
        one.logits = la;
        CHECK_MSG(cuda_forward_batch(cm, 1, &alone[i], &one, ids_a, NULL, err) == 0, "%s", err);
        double rel = model_check_max_rel(la, dst, (size_t)step[i] * N_VOCAB);
        worst = rel > worst ? rel : worst;
        for (int o = 0; exact && o < step[i]; o++)
            CHECK_EQ(ids_t[k + o], ids_a[o]);
        k += step[i];
        dst += (size_t)step[i] * N_VOCAB;
        CHECK_EQ(cuda_seq_n_tokens(together[i]), prefix[i] + step[i]);
    }
    printf("# %d rows stacked against alone: %.2e\n", rows, worst);
    CHECK(exact ? worst == 0 : worst < TOL_QUANT);
    for (int i = 0; i < N_SEQ; i++) {
        cuda_seq_free(together[i]);
        cuda_seq_free(alone[i]);
    }
    free(lt);
    free(la);
}

static void test_batched_equals_alone(void)
{
    if (!have_gpu())
        return;
    char err[ERR_MAX];
    const char *path = make_model("qwen2", QTYPE_Q8_0, "batched");
    model *m = path ? model_load(path, err) : NULL;
    CHECK(m);
    cuda_model *cm = cuda_model_new(m, 0, MAX_ROWS, 256, err);
    CHECK_MSG(cm, "%s", err);
    static const int eight[] = {1, 1, 5, 1}, wide[] = {1, 1, 20, 2};
    check_stacked(cm, eight, true);
    check_stacked(cm, wide, false);
    cuda_model_free(cm);
    model_free(m);
}

/* A context written through to host chunks and read back into a fresh device sequence
 * gives the next token's logits bit for bit (f16 chunks), and close to them after its
 * chunks were compressed to int8. */
static void test_host_tier_round_trip(void)
{
    if (!have_gpu())
        return;
    char err[ERR_MAX];
    const char *path = make_model("llama", QTYPE_Q4_K, "tier");
    model *m = path ? model_load(path, err) : NULL;
    CHECK(m);
    cuda_model *cm = cuda_model_new(m, 0, MAX_ROWS, 256, err);
    CHECK_MSG(cm, "%s", err);
    kv_pool *pool = kv_pool_new(model_kv_shape(m), 0, err);
    CHECK(pool);
    kv_seq host;
    kv_seq_init(&host, pool);
    cuda_seq *a = cuda_seq_new(cm, err), *b = cuda_seq_new(cm, err), *c = cuda_seq_new(cm, err);
    CHECK(a && b && c);
    int32_t tok[50], pos[50], last = 0;
    for (int t = 0; t < 50; t++) {
        tok[t] = plan_token(t);
        pos[t] = t;
    }
    model_batch pre = {.n_tokens = 37, .tokens = tok, .positions = pos};
    CHECK_MSG(cuda_forward_batch(cm, 1, &a, &pre, NULL, NULL, err) == 0, "%s", err);
    CHECK_MSG(cuda_seq_to_host(a, 0, &host, err) == 0, "%s", err);
    CHECK_EQ(kv_seq_n_tokens(&host), 37);
    /* the next step written through as it runs */
    model_batch more = {.n_tokens = 3, .tokens = tok + 37, .positions = pos + 37};
    kv_seq *hosts[] = {&host};
    CHECK_MSG(cuda_forward_batch(cm, 1, &a, &more, NULL, hosts, err) == 0, "%s", err);
    CHECK_EQ(kv_seq_n_tokens(&host), 40);
    CHECK_EQ(host.chunks[2]->tokens[39 - 32], tok[39]);
    CHECK_EQ(host.chunks[2]->positions[39 - 32], 39);

    CHECK_MSG(cuda_seq_from_host(b, &host, 0, err) == 0, "%s", err);
    CHECK_EQ(cuda_seq_n_tokens(b), 40);
    float *la = malloc(N_VOCAB * sizeof(float)), *lb = malloc(N_VOCAB * sizeof(float));
    float *lc = malloc(N_VOCAB * sizeof(float));
    CHECK(la && lb && lc);
    model_batch next = {.n_tokens = 1, .tokens = tok + 40, .positions = pos + 40, .n_out = 1,
                        .out_rows = &last};
    next.logits = la;
    CHECK_MSG(cuda_forward_batch(cm, 1, &a, &next, NULL, NULL, err) == 0, "%s", err);
    next.logits = lb;
    CHECK_MSG(cuda_forward_batch(cm, 1, &b, &next, NULL, NULL, err) == 0, "%s", err);
    CHECK(memcmp(la, lb, N_VOCAB * sizeof(float)) == 0);
    /* brought up to date from entry 20 on: the same bits again */
    cuda_seq_truncate(b, 20);
    CHECK_MSG(cuda_seq_from_host(b, &host, 20, err) == 0, "%s", err);
    CHECK_EQ(cuda_seq_n_tokens(b), 40);
    next.logits = lc;
    CHECK_MSG(cuda_forward_batch(cm, 1, &b, &next, NULL, NULL, err) == 0, "%s", err);
    CHECK(memcmp(la, lc, N_VOCAB * sizeof(float)) == 0);

    for (int i = 0; i < host.n_chunks; i++)
        if (host.chunks[i]->n_tokens == KV_CHUNK_TOKENS)
            CHECK_MSG(kv_chunk_convert(pool, host.chunks[i], KV_INT8, err) == 0, "%s", err);
    CHECK_MSG(cuda_seq_from_host(c, &host, 0, err) == 0, "%s", err);
    next.logits = lc;
    CHECK_MSG(cuda_forward_batch(cm, 1, &c, &next, NULL, NULL, err) == 0, "%s", err);
    double rel = model_check_max_rel(la, lc, N_VOCAB);
    printf("# int8 chunks against f16: %.2e\n", rel);
    CHECK(rel > 0 && rel < TOL_QUANT);

    cuda_seq_truncate(a, 10);
    CHECK_EQ(cuda_seq_n_tokens(a), 10);
    free(la);
    free(lb);
    free(lc);
    cuda_seq_free(a);
    cuda_seq_free(b);
    cuda_seq_free(c);
    kv_seq_free(&host);
    kv_pool_free(pool);
    cuda_model_free(cm);
    model_free(m);
}

/* Mean negative log-likelihood of text[1..n) given the tokens before, from logits (n,
 * n_vocab) of text[0..n). */
static double mean_nll(const float *logits, const int32_t *text, int n, int n_vocab)
{
    double sum = 0;
    for (int t = 0; t + 1 < n; t++) {
        const float *row = logits + (size_t)t * n_vocab;
        double mx = row[0], z = 0;
        for (int v = 1; v < n_vocab; v++)
            mx = row[v] > mx ? row[v] : mx;
        for (int v = 0; v < n_vocab; v++)
            z += exp(row[v] - mx);
        sum += mx + log(z) - row[text[t + 1]];
    }
    return sum / (n - 1);
}

#define DOC_TOKENS 512
#define DOC_GREEDY 64

/* The trained documentation model as published (Q8_0) and converted to F16 and to
 * Q4_K_M (llama-quantize's mix): perplexity on held-out text within 0.5% of the CPU's,
 * and the greedy continuation of a 64-token prompt for 64 tokens, both paths continuing
 * from the CPU's choice at every step so that one near tie does not hide later agreement:
 * the same tokens in Q8_0 and F16, at most 4 differences in Q4_K_M, where the CPU's 8-bit
 * activations meet 4-bit weights (printed, with the first one). */
static void check_docs_file(const char *mpath, const char *label, int max_greedy_diff)
{
    char err[ERR_MAX];
    const char *tpath = test_data_path("docs/heldout.txt");
    CHECK_MSG(tpath, "../shared/testdata/docs/heldout.txt not found");
    size_t len;
    char *text = readall_file(tpath, &len, err);
    CHECK_MSG(text, "%s", err);
    model *m = model_load(mpath, err);
    CHECK_MSG(m, "%s", err);
    int n_vocab = model_hparams_of(m)->n_vocab;
    tokenizer *tk = NULL;
    CHECK_MSG(tok_load(model_gguf(m), &tk, err) == 0, "%s", err);
    int32_t *ids = malloc((size_t)(DOC_TOKENS + DOC_GREEDY) * sizeof *ids);
    CHECK(ids);
    int n = tok_encode(tk, text, len, false, false, ids, DOC_TOKENS);
    tok_free(tk);
    free(text);
    CHECK(n >= DOC_TOKENS);

    float *lc = malloc((size_t)DOC_TOKENS * n_vocab * sizeof(float));
    float *lg = malloc((size_t)DOC_TOKENS * n_vocab * sizeof(float));
    int32_t pos[DOC_TOKENS + DOC_GREEDY], out[DOC_TOKENS];
    CHECK(lc && lg);
    for (int t = 0; t < DOC_TOKENS + DOC_GREEDY; t++)
        pos[t] = t;
    for (int t = 0; t < DOC_TOKENS; t++)
        out[t] = t;
    model_batch all = {.n_tokens = DOC_TOKENS, .tokens = ids, .positions = pos,
                       .n_out = DOC_TOKENS, .out_rows = out};

    model_runner *r = model_runner_new(m, 2, DOC_TOKENS, DOC_TOKENS + DOC_GREEDY, err);
    CHECK_MSG(r, "%s", err);
    kv_pool *pool = kv_pool_new(model_kv_shape(m), 0, err);
    CHECK(pool);
    kv_seq seq;
    kv_seq_init(&seq, pool);
    all.logits = lc;
    CHECK_MSG(model_forward(r, &seq, &all, err) == 0, "%s", err);
    cuda_model *cm = cuda_model_new(m, 0, DOC_TOKENS, DOC_TOKENS + DOC_GREEDY, err);
    CHECK_MSG(cm, "%s", err);
    cuda_seq *s = cuda_seq_new(cm, err);
    CHECK(s);
    all.logits = lg;
    CHECK_MSG(cuda_forward_batch(cm, 1, &s, &all, NULL, NULL, err) == 0, "%s", err);
    double ppl_c = exp(mean_nll(lc, ids, DOC_TOKENS, n_vocab));
    double ppl_g = exp(mean_nll(lg, ids, DOC_TOKENS, n_vocab));
    printf("# docs-lm-21M %-6s %d held-out tokens: perplexity CPU %.4f, GPU %.4f (%.3f%%)\n",
           label, DOC_TOKENS, ppl_c, ppl_g, 100 * fabs(ppl_g / ppl_c - 1));
    CHECK(fabs(ppl_g / ppl_c - 1) < 0.005);

    /* greedy continuation of the first 64 tokens: the prompt again on fresh sequences */
    kv_seq_free(&seq);
    kv_seq_init(&seq, pool);
    cuda_seq_truncate(s, 0);
    int32_t gen_c[DOC_GREEDY], gen_g[DOC_GREEDY], last_row;
    int prompt = 64;
    model_batch p = {.n_tokens = prompt, .tokens = ids, .positions = pos, .n_out = 1,
                     .out_rows = &last_row, .logits = lc};
    last_row = prompt - 1;
    int32_t cur[1];
    int diverged = -1, differ = 0;
    for (int i = 0; i < DOC_GREEDY; i++) {
        CHECK_MSG(model_forward(r, &seq, &p, err) == 0, "%s", err);
        int best = 0;
        for (int v = 1; v < n_vocab; v++)
            best = lc[v] > lc[best] ? v : best;
        gen_c[i] = best;
        model_batch pg = p;
        pg.logits = NULL;
        CHECK_MSG(cuda_forward_batch(cm, 1, &s, &pg, &gen_g[i], NULL, err) == 0, "%s", err);
        if (gen_c[i] != gen_g[i] && differ++ == 0)
            diverged = i;
        cur[0] = gen_c[i];
        last_row = 0;
        p = (model_batch){.n_tokens = 1, .tokens = cur, .positions = pos + prompt + i,
                          .n_out = 1, .out_rows = &last_row, .logits = lc};
    }
    printf("# docs-lm-21M %-6s greedy: %d of %d tokens the same (first difference at %d)\n",
           label, DOC_GREEDY - differ, DOC_GREEDY, diverged);
    CHECK(differ <= max_greedy_diff);

    cuda_seq_free(s);
    cuda_model_free(cm);
    kv_seq_free(&seq);
    kv_pool_free(pool);
    model_runner_free(r);
    free(lc);
    free(lg);
    free(ids);
    model_free(m);
}

static void test_docs_model(void)
{
    if (!have_gpu())
        return;
    const char *path = test_data_path("models/docs-lm-21M-Q8_0.gguf");
    if (!path) {
        test_skip("../shared/testdata/models/docs-lm-21M-Q8_0.gguf not found");
        return;
    }
    char err[ERR_MAX], q8[1024], f16[1024], q4km[1024];
    snprintf(q8, sizeof q8, "%s", path);
    snprintf(f16, sizeof f16, "%s/docs-f16.gguf", test_tmpdir());
    snprintf(q4km, sizeof q4km, "%s/docs-q4_k_m.gguf", test_tmpdir());
    CHECK_MSG(modelgen_convert(q8, f16, QTYPE_F16, MODELGEN_MIX_NONE, 0, NULL, NULL, 0, err) == 0,
              "%s", err);
    CHECK_MSG(modelgen_convert(q8, q4km, QTYPE_Q4_K, MODELGEN_MIX_Q4_K_M, 0, NULL, NULL, 0,
                               err) == 0,
              "%s", err);
    check_docs_file(q8, "Q8_0", 0);
    check_docs_file(f16, "F16", 0);
    check_docs_file(q4km, "Q4_K_M", 4);
}

/* A CPU runner moved to the GPU (model_runner_use_gpu): the plan's logits as the CPU
 * path's, every entry in the host sequence, attention received as the CPU counts it; a
 * host sequence cut back and continued differently brings the device copy back in line;
 * a batch that asks for attention probabilities runs on the CPU, on the same sequence. */
static void test_runner_on_gpu(void)
{
    if (!have_gpu())
        return;
    char err[ERR_MAX];
    const char *path = make_model("qwen3", QTYPE_Q6_K, "runner");
    model *m = path ? model_load(path, err) : NULL;
    CHECK(m);
    size_t n = (size_t)PLAN_ROWS * N_VOCAB;
    float *cpu = malloc(n * sizeof(float)), *gpu = malloc(n * sizeof(float));
    CHECK(cpu && gpu);
    CHECK(run_cpu(m, cpu) == 0);

    model_runner *r = model_runner_new(m, 2, MAX_ROWS, 256, err);
    CHECK_MSG(r, "%s", err);
    CHECK_MSG(model_runner_use_gpu(r, 0, err) == 0, "%s", err);
    CHECK(model_runner_gpu_name(r) != NULL);
    kv_pool *pool = kv_pool_new(model_kv_shape(m), 0, err);
    CHECK(pool);
    kv_seq seq;
    kv_seq_init(&seq, pool);
    int at = 0;
    for (int b = 0; b < PLAN_N; b++) {
        plan_step ps;
        CHECK_MSG(model_forward(r, &seq, plan_batch(&ps, b, at, gpu), err) == 0, "%s", err);
        at += PLAN[b];
        CHECK_EQ(kv_seq_n_tokens(&seq), at);
    }
    double rel = model_check_max_rel(cpu, gpu, n);
    printf("# runner on the GPU against the CPU: %.2e\n", rel);
    CHECK(rel < TOL_QUANT);

    /* cut back to 30 and continued with other tokens: the copy follows the host */
    kv_seq_truncate(&seq, 30);
    int32_t tok2[8], pos2[8], last = 7;
    for (int t = 0; t < 8; t++) {
        tok2[t] = plan_token(100 + t);
        pos2[t] = 30 + t;
    }
    float *received = calloc(64, sizeof(float)), *received_cpu = calloc(64, sizeof(float));
    CHECK(received && received_cpu);
    model_batch cont = {.n_tokens = 8, .tokens = tok2, .positions = pos2, .n_out = 1,
                        .out_rows = &last, .logits = gpu, .attn_received = received};
    CHECK_MSG(model_forward(r, &seq, &cont, err) == 0, "%s", err);

    model_runner *rc = model_runner_new(m, 2, MAX_ROWS, 256, err);
    CHECK(rc);
    kv_seq ref;
    kv_seq_init(&ref, pool);
    int32_t tok3[38], pos3[38];
    for (int t = 0; t < 38; t++) {
        tok3[t] = t < 30 ? plan_token(t) : tok2[t - 30];
        pos3[t] = t;
    }
    model_batch pre = {.n_tokens = 30, .tokens = tok3, .positions = pos3};
    CHECK_MSG(model_forward(rc, &ref, &pre, err) == 0, "%s", err);
    model_batch cont_cpu = cont;
    cont_cpu.logits = cpu;
    cont_cpu.attn_received = received_cpu;
    CHECK_MSG(model_forward(rc, &ref, &cont_cpu, err) == 0, "%s", err);
    rel = model_check_max_rel(cpu, gpu, N_VOCAB);
    double recv_rel = model_check_max_rel(received_cpu, received, 38);
    printf("# after a cut: logits %.2e, attention received %.2e\n", rel, recv_rel);
    CHECK(rel < TOL_QUANT);
    CHECK(recv_rel < TOL_QUANT);

    /* attention probabilities: the CPU path, which appends to the same sequence */
    float *attn = malloc((size_t)2 * 8 * 1 * 39 * sizeof(float));
    CHECK(attn);
    int32_t t1 = plan_token(200), p1 = 38, o1 = 0;
    model_batch probe = {.n_tokens = 1, .tokens = &t1, .positions = &p1, .n_out = 1,
                         .out_rows = &o1, .logits = gpu, .attn = attn};
    CHECK_MSG(model_forward(r, &seq, &probe, err) == 0, "%s", err);
    CHECK_EQ(kv_seq_n_tokens(&seq), 39);
    /* and the next GPU step sees that entry */
    int32_t t2 = plan_token(201), p2 = 39;
    model_batch after = {.n_tokens = 1, .tokens = &t2, .positions = &p2, .n_out = 1,
                         .out_rows = &o1, .logits = gpu};
    CHECK_MSG(model_forward(r, &seq, &after, err) == 0, "%s", err);
    model_batch probe_cpu = probe, after_cpu = after;
    probe_cpu.attn = NULL;
    probe_cpu.logits = cpu;
    after_cpu.logits = cpu;
    CHECK_MSG(model_forward(rc, &ref, &probe_cpu, err) == 0, "%s", err);
    CHECK_MSG(model_forward(rc, &ref, &after_cpu, err) == 0, "%s", err);
    rel = model_check_max_rel(cpu, gpu, N_VOCAB);
    printf("# after a CPU step in between: %.2e\n", rel);
    CHECK(rel < TOL_QUANT);

    free(attn);
    free(received);
    free(received_cpu);
    kv_seq_free(&ref);
    kv_seq_free(&seq);
    kv_pool_free(pool);
    model_runner_free(rc);
    model_runner_free(r);
    free(cpu);
    free(gpu);
    model_free(m);
}

/* What the backend does not run is refused with a reason; a bad batch changes nothing. */
static void test_refusals(void)
{
    if (!have_gpu())
        return;
    char err[ERR_MAX];
    const char *path = make_model("gemma2", QTYPE_F16, "gemma2");
    model *m = path ? model_load(path, err) : NULL;
    CHECK(m);
    CHECK(cuda_model_new(m, 0, 8, 64, err) == NULL);
    CHECK_MSG(strstr(err, "gemma2"), "%s", err);
    model_free(m);

    path = make_model("llama", QTYPE_Q8_0, "refusals");
    m = path ? model_load(path, err) : NULL;
    CHECK(m);
    CHECK(cuda_model_new(m, 99, 8, 64, err) == NULL);
    CHECK_MSG(strstr(err, "device 99"), "%s", err);
    cuda_model *cm = cuda_model_new(m, 0, 8, 16, err);
    CHECK_MSG(cm, "%s", err);
    cuda_seq *s = cuda_seq_new(cm, err);
    CHECK(s);
    int32_t tok[12], pos[12];
    for (int t = 0; t < 12; t++) {
        tok[t] = t;
        pos[t] = t;
    }
    model_batch b = {.n_tokens = 12, .tokens = tok, .positions = pos};
    CHECK(cuda_forward_batch(cm, 1, &s, &b, NULL, NULL, err) < 0); /* more rows than max_batch */
    b.n_tokens = 8;
    tok[3] = N_VOCAB;
    CHECK(cuda_forward_batch(cm, 1, &s, &b, NULL, NULL, err) < 0);
    CHECK_EQ(cuda_seq_n_tokens(s), 0);
    tok[3] = 3;
    CHECK_MSG(cuda_forward_batch(cm, 1, &s, &b, NULL, NULL, err) == 0, "%s", err);
    b.positions = pos + 4;
    CHECK_MSG(cuda_forward_batch(cm, 1, &s, &b, NULL, NULL, err) == 0, "%s", err);
    b.n_tokens = 1;
    CHECK(cuda_forward_batch(cm, 1, &s, &b, NULL, NULL, err) < 0); /* past max_kv */
    CHECK_MSG(strstr(err, "exceed"), "%s", err);
    CHECK_EQ(cuda_seq_n_tokens(s), 16);
    cuda_seq_free(s);
    cuda_model_free(cm);
    model_free(m);
}

/* The device setting's syntax, the same in every build. */
static void test_parse_device(void)
{
    char err[ERR_MAX];
    int d = 7;
    CHECK(cuda_parse_device("cpu", &d, err) == 0 && d == -1);
    CHECK(cuda_parse_device("cuda", &d, err) == 0 && d == 0);
    CHECK(cuda_parse_device("cuda:3", &d, err) == 0 && d == 3);
    static const char *const bad[] = {"gpu", "cuda:", "cuda:x", "cuda:1x", "cuda:-1",
                                      "cuda:99999", "CUDA", ""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK_MSG(cuda_parse_device(bad[i], &d, err) < 0, "'%s' accepted", bad[i]);
        CHECK(strstr(err, "expected cpu, cuda or cuda:N"));
    }
}

int main(void)
{
    RUN(test_parse_device);
    RUN(test_logits_match_cpu);
    RUN(test_graphs_replay_the_same);
    RUN(test_batched_equals_alone);
    RUN(test_host_tier_round_trip);
    RUN(test_runner_on_gpu);
    RUN(test_docs_model);
    RUN(test_refusals);
    return test_finish();
}
