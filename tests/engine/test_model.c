/*
 * Model forward pass against the double-precision reference (tests/support/ref_forward).
 *
 * Models are generated in the test's temp directory by modelgen on a synthetic
 * 260-token vocabulary, so these tests need no shared test data. Each architecture x
 * weight type is checked on a prefill, single-token decodes, and batches at
 * non-contiguous, out-of-order positions. Tolerances (max abs logit difference; logits
 * have unit scale): TOL_FLOAT for f32/f16/bf16 weights (f32 arithmetic and an f16 KV
 * cache; measured ~0.002), TOL_QUANT for quantized weights, whose small batches use
 * dot kernels on 8-bit quantized activations as llama.cpp does (measured 0.06-0.13;
 * large batches, sgemm on dequantized weights, stay at ~0.002). The architecture code
 * is the same for every type, so the tight float tolerance is what catches logic bugs.
 * With the prefix's KV chunks compressed (f32 weights): TOL_KV_INT8 (measured 0.024) and
 * TOL_KV_INT4 (measured 0.38); int2 (measured ~1.8) is only run.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf/gguf.h"
#include "engine/model/model.h"
#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"
#include "tests/support/model_check.h"
#include "tests/support/ref_forward.h"
#include "tests/support/test.h"

#define TOL_FLOAT 0.02
#define TOL_QUANT 0.2
#define TOL_KV_INT8 0.06
#define TOL_KV_INT4 0.8

static const uint32_t TYPES[] = {QTYPE_F32,  QTYPE_F16,  QTYPE_BF16, QTYPE_Q8_0, QTYPE_Q4_0,
                                 QTYPE_Q4_1, QTYPE_Q5_0, QTYPE_Q5_1, QTYPE_Q2_K, QTYPE_Q3_K,
                                 QTYPE_Q4_K, QTYPE_Q5_K, QTYPE_Q6_K, QTYPE_IQ4_NL, QTYPE_IQ4_XS,
                                 QTYPE_IQ2_XXS, QTYPE_IQ2_XS, QTYPE_IQ2_S, QTYPE_IQ3_XXS,
                                 QTYPE_IQ3_S, QTYPE_IQ1_S, QTYPE_IQ1_M};
static const char *ARCHS[] = {"llama", "qwen2", "qwen3"};

static modelgen_params small_params(const char *arch, uint32_t type)
{
    return (modelgen_params){.arch = arch, .dim = 256, .n_layer = 2, .n_head = 4, .n_head_kv = 2,
                             .n_ff = 512, .n_ctx = 128, .type = type, .seed = 7, .n_vocab = 260,
                             .n_threads = 1};
}

static const char *gen(const modelgen_params *p, const char *name)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s.gguf", test_tmpdir(), name);
    char err[ERR_MAX];
    if (modelgen_write(p, path, err) < 0) {
        fprintf(stderr, "modelgen: %s\n", err);
        return NULL;
    }
    return path;
}

/* Prefill of 20, 4 decodes, then a fresh sequence with gapped / out-of-order batches. */
static const model_check_plan PLAN = {.n_prefill = 20, .n_total = 24, .gap_b = 20, .gap_c = 10};

static double check_model(const char *path, int max_batch, int n_threads)
{
    return model_check_file(path, max_batch, n_threads, &PLAN);
}

static void test_all_archs_and_types(void)
{
    for (size_t a = 0; a < 3; a++)
        for (size_t t = 0; t < sizeof TYPES / sizeof TYPES[0]; t++) {
            modelgen_params p = small_params(ARCHS[a], TYPES[t]);
            const char *path = gen(&p, "m");
            CHECK(path);
            /* BF16 dots on AVX-512 BF16 round the activations to bf16 (8 significant
             * bits), as the quantized types round them to 8-bit integers */
            bool bf16_rounds = TYPES[t] == QTYPE_BF16 && quant_bf16_rounds_activation();
            double tol = (TYPES[t] == QTYPE_F32 || TYPES[t] == QTYPE_F16 || TYPES[t] == QTYPE_BF16) &&
                                 !bf16_rounds
                             ? TOL_FLOAT : TOL_QUANT;
            /* max_batch 512: the 20-token prefill takes the sgemm path; 8: dot kernels,
             * in three sub-batches */
            double d1 = check_model(path, 512, 2), d2 = check_model(path, 8, 1);
            printf("  %s %s: max |logit diff| %.4g (sgemm) %.4g (dot)\n", ARCHS[a],
                   quant_traits_of(TYPES[t])->name, d1, d2);
            CHECK_MSG(d1 <= tol && d2 <= tol, "%s %s: %g %g > %g", ARCHS[a],
                      quant_traits_of(TYPES[t])->name, d1, d2, tol);
        }
}

/* llama.cpp's mixes of a model whose rows are not whole super-blocks (dim 96, ffn 160, as
 * small real models have): llama-quantize's fallbacks (Q5_0, Q5_1, Q8_0, IQ4_NL) sit
 * beside the K-quants in one file, which loads and runs as the reference forward does. */
static void test_mixes_with_fallbacks(void)
{
    static const struct {
        modelgen_mix mix;
        uint32_t type;
        const char *name;
    } mixes[] = {
        {MODELGEN_MIX_Q4_K_M, QTYPE_Q4_K, "Q4_K_M"},
        {MODELGEN_MIX_Q5_K_M, QTYPE_Q5_K, "Q5_K_M"},
        {MODELGEN_MIX_Q3_K_M, QTYPE_Q3_K, "Q3_K_M"},
        {MODELGEN_MIX_Q2_K, QTYPE_Q2_K, "Q2_K"},
    };
    for (size_t i = 0; i < sizeof mixes / sizeof *mixes; i++) {
        modelgen_params p = small_params("llama", mixes[i].type);
        p.dim = 96, p.n_ff = 160, p.n_head = 4, p.n_head_kv = 2, p.mix = mixes[i].mix;
        const char *path = gen(&p, "mix");
        CHECK(path);
        char err[ERR_MAX];
        gguf_file *g = gguf_open(path, err);
        CHECK_MSG(g, "%s", err);
        bool seen[QTYPE_COUNT] = {false};
        for (int64_t t = 0; t < gguf_n_tensors(g); t++)
            seen[gguf_tensor_at(g, t)->type] = true;
        gguf_close(g);
        bool fallback = seen[QTYPE_Q5_0] || seen[QTYPE_Q5_1] || seen[QTYPE_IQ4_NL];
        CHECK_MSG(seen[QTYPE_Q8_0] && fallback, "%s: no fallback types", mixes[i].name);
        double d1 = check_model(path, 512, 2), d2 = check_model(path, 8, 1);
        printf("  %s with fallbacks: max |logit diff| %.4g (prefill) %.4g (dot)\n",
               mixes[i].name, d1, d2);
        CHECK_MSG(d1 <= TOL_QUANT && d2 <= TOL_QUANT, "%s: %g %g", mixes[i].name, d1, d2);
    }
}

static void test_gqa_mqa_mha_and_tied(void)
{
    int kv[] = {1, 4};
    for (int i = 0; i < 2; i++) {
        modelgen_params p = small_params("llama", QTYPE_F32);
        p.n_head_kv = kv[i];
        p.tie_output = i == 1;
        const char *path = gen(&p, "gqa");
        CHECK(path);
        double d = check_model(path, 512, 2);
        CHECK_MSG(d <= TOL_FLOAT, "kv heads %d: %g", kv[i], d);
    }
    /* head_dim other than dim / n_head (qwen3 does this) */
    modelgen_params p = small_params("qwen3", QTYPE_F16);
    p.head_dim = 32;
    p.n_head = 8;
    const char *path = gen(&p, "hd");
    CHECK(path);
    CHECK(check_model(path, 512, 2) <= TOL_FLOAT);
}

/* Logits of the same batch with 1 and 2 threads are bit-identical. */
static void test_threads_identical(void)
{
    modelgen_params p = small_params("qwen2", QTYPE_Q4_K);
    const char *path = gen(&p, "thr");
    CHECK(path);
    char err[ERR_MAX];
    model *m = model_load(path, err);
    CHECK_MSG(m, "%s", err);
    int nv = model_hparams_of(m)->n_vocab;
    float *out[2];
    int32_t tok[30], pos[30], rows[30];
    for (int i = 0; i < 30; i++)
        tok[i] = (i * 13) % nv, pos[i] = i, rows[i] = i;
    for (int th = 0; th < 2; th++) {
        out[th] = malloc(31 * (size_t)nv * sizeof(float));
        model_runner *r = model_runner_new(m, th + 1, 0, 0, err);
        kv_pool *pool = kv_pool_new(model_kv_shape(m), 0, err);
        kv_seq s;
        kv_seq_init(&s, pool);
        model_batch b = {.n_tokens = 29, .tokens = tok, .positions = pos, .n_out = 29,
                         .out_rows = rows, .logits = out[th]};
        CHECK(model_forward(r, &s, &b, err) == 0);
        model_batch d = {.n_tokens = 1, .tokens = tok + 29, .positions = pos + 29, .n_out = 1,
                         .out_rows = rows, .logits = out[th] + (size_t)29 * nv};
        CHECK(model_forward(r, &s, &d, err) == 0);
        kv_seq_free(&s);
        kv_pool_free(pool);
        model_runner_free(r);
    }
    CHECK(memcmp(out[0], out[1], 30 * (size_t)nv * sizeof(float)) == 0);
    free(out[0]);
    free(out[1]);
    model_free(m);
}

/* hidden states and attention probabilities of a prefill match the reference's. */
static void test_hidden_and_attention(void)
{
    modelgen_params p = small_params("llama", QTYPE_F32);
    const char *path = gen(&p, "ha");
    CHECK(path);
    char err[ERR_MAX];
    model *m = model_load(path, err);
    CHECK(m);
    ref_model *rm = ref_model_load(model_gguf(m));
    CHECK(rm);
    const model_hparams *hp = model_hparams_of(m);
    enum { N = 18 };
    int32_t tok[N], pos[N], rows[2] = {3, 17};
    for (int i = 0; i < N; i++)
        tok[i] = (i * 7 + 3) % hp->n_vocab, pos[i] = i;
    size_t nh = (size_t)(hp->n_layer + 1) * N * hp->dim, na = (size_t)hp->n_layer * hp->n_head * N * N;
    double *rl = malloc((size_t)N * hp->n_vocab * sizeof(double)), *rh = malloc(nh * sizeof(double)),
           *ra = malloc(na * sizeof(double));
    ref_forward(rm, N, tok, pos, rl, rh, ra);
    float *hidden = malloc((size_t)(hp->n_layer + 1) * 2 * hp->dim * sizeof(float));
    float *attn = malloc(na * sizeof(float));
    float *logits = malloc(2 * (size_t)hp->n_vocab * sizeof(float));
    /* max batch 8: three sub-batches, attention on the chunks; 512: one batch, attention
     * with sgemm */
    for (int mb = 8; mb <= 512; mb *= 64) {
        model_runner *r = model_runner_new(m, 2, mb, 0, err);
        kv_pool *pool = kv_pool_new(model_kv_shape(m), 0, err);
        kv_seq s;
        kv_seq_init(&s, pool);
        model_batch b = {.n_tokens = N, .tokens = tok, .positions = pos, .n_out = 2,
                         .out_rows = rows, .logits = logits, .hidden = hidden, .attn = attn};
        CHECK(model_forward(r, &s, &b, err) == 0);
        for (int l = 0; l <= hp->n_layer; l++)
            for (int o = 0; o < 2; o++)
                for (int i = 0; i < hp->dim; i++)
                    CHECK_NEAR(hidden[((size_t)l * 2 + o) * hp->dim + i],
                               rh[((size_t)l * N + rows[o]) * hp->dim + i], 0.01);
        for (size_t i = 0; i < na; i++)
            CHECK_NEAR(attn[i], ra[i], 2e-3);
        for (int o = 0; o < 2; o++)
            for (int v = 0; v < hp->n_vocab; v++)
                CHECK_NEAR(logits[(size_t)o * hp->n_vocab + v],
                           rl[(size_t)rows[o] * hp->n_vocab + v], TOL_FLOAT);
        kv_seq_free(&s);
        kv_pool_free(pool);
        model_runner_free(r);
    }
    free(rl), free(rh), free(ra), free(hidden), free(attn), free(logits);
    ref_model_free(rm);
    model_free(m);
}

/* ---- compressed KV chunks, attention received, layer_ready, faults ---- */

static void test_compressed_chunks(void)
{
    modelgen_params p = small_params("qwen2", QTYPE_F32);
    const char *path = gen(&p, "kvq");
    CHECK(path);
    char err[ERR_MAX];
    model *m = model_load(path, err);
    CHECK(m);
    ref_model *rm = ref_model_load(model_gguf(m));
    CHECK(rm);
    double e[KV_PRECISION_END];
    const int precs[] = {KV_F16, KV_INT8, KV_INT4, KV_INT2};
    for (int i = 0; i < 4; i++)
        e[precs[i]] = model_check_compressed(m, rm, precs[i]);
    printf("  max |logit diff| vs exact KV: f16 %.4f int8 %.4f int4 %.4f int2 %.4f\n",
           e[KV_F16], e[KV_INT8], e[KV_INT4], e[KV_INT2]);
    CHECK(e[KV_F16] <= TOL_FLOAT);
    CHECK(e[KV_INT8] <= TOL_KV_INT8);
    CHECK(e[KV_INT4] <= TOL_KV_INT4);
    CHECK(e[KV_INT2] < 1e9); /* runs; its error is what the benchmark measures */
    CHECK(e[KV_INT8] < e[KV_INT4] && e[KV_INT4] < e[KV_INT2]);
    ref_model_free(rm);
    model_free(m);
}

/* attn_received is the sum of attn over layers, heads and rows, added to the input; on
 * both attention paths and with compressed chunks. */
static void test_attn_received(void)
{
    modelgen_params p = small_params("llama", QTYPE_F32);
    const char *path = gen(&p, "recv");
    CHECK(path);
    char err[ERR_MAX];
    model *m = model_load(path, err);
    CHECK(m);
    const model_hparams *hp = model_hparams_of(m);
    enum { N = 45 };
    int32_t tok[N], pos[N];
    for (int i = 0; i < N; i++)
        tok[i] = (i * 11 + 2) % hp->n_vocab, pos[i] = i;
    float *attn = malloc((size_t)hp->n_layer * hp->n_head * 20 * N * sizeof(float));
    float recv[N];
    for (int mb = 8; mb <= 512; mb *= 64) {
        model_runner *r = model_runner_new(m, 2, mb, 0, err);
        kv_pool *pool = kv_pool_new(model_kv_shape(m), 0, err);
        kv_seq s;
        kv_seq_init(&s, pool);
        /* 20 tokens, 5 with chunk 0 compressed, 20 more */
        int steps[] = {20, 5, 20}, t0 = 0;
        for (int st = 0; st < 3; st++) {
            int n = steps[st], n_kv = t0 + n;
            for (int j = 0; j < n_kv; j++)
                recv[j] = 1.0f;
            model_batch b = {.n_tokens = n, .tokens = tok + t0, .positions = pos + t0,
                             .attn = attn, .attn_received = recv};
            CHECK(model_forward(r, &s, &b, err) == 0);
            double total = 0;
            for (int j = 0; j < n_kv; j++) {
                double want = 1;
                for (size_t lh = 0; lh < (size_t)hp->n_layer * hp->n_head; lh++)
                    for (int t = 0; t < n; t++)
                        want += attn[(lh * n + t) * n_kv + j];
                CHECK_NEAR(recv[j], want, 1e-4 * want);
                total += recv[j] - 1;
            }
            CHECK_NEAR(total, (double)hp->n_layer * hp->n_head * n, 1e-3 * total);
            if (st == 0)
                CHECK(kv_chunk_convert(pool, s.chunks[0], KV_INT4, err) == 0);
            t0 += n;
        }
        kv_seq_free(&s);
        kv_pool_free(pool);
        model_runner_free(r);
    }
    free(attn);
    model_free(m);
}

typedef struct hook_state {
    kv_pool *pool;
    kv_seq *seq;
    kv_chunk *saved[4]; /* copies of the sequence's chunks */
    int n_saved;
    int calls[16];
    int n_calls;
    int faults;
    bool fail;
} hook_state;

/* A copy of c from pool: data, ids, positions. */
static kv_chunk *chunk_copy(kv_pool *pool, const kv_chunk *c)
{
    char err[ERR_MAX];
    kv_chunk *d = kv_chunk_new_precision(pool, c->precision, err);
    if (!d)
        return NULL;
    memcpy(d->data, c->data, kv_chunk_data_bytes(kv_pool_shape(pool), c->precision));
    memcpy(d->tokens, c->tokens, sizeof d->tokens);
    memcpy(d->positions, c->positions, sizeof d->positions);
    d->n_tokens = c->n_tokens;
    return d;
}

/* layer_ready: layer l of every existing chunk "arrives" (is restored from the copy). */
static void hook_layer_ready(void *arg, int layer)
{
    hook_state *h = arg;
    kv_shape shape = kv_pool_shape(h->pool);
    if (h->n_calls < 16)
        h->calls[h->n_calls] = layer;
    h->n_calls++;
    for (int c = 0; c < h->n_saved; c++)
        memcpy(kv_chunk_layer(h->seq->chunks[c], shape, layer),
               kv_chunk_layer(h->saved[c], shape, layer),
               kv_chunk_layer_bytes(shape, h->saved[c]->precision));
}

static int hook_fault(void *arg, kv_seq *seq, int index, char err[ERR_MAX])
{
    hook_state *h = arg;
    h->faults++;
    if (h->fail)
        return err_set(err, "fault: chunk %d unreadable", index);
    seq->chunks[index] = h->saved[index];
    h->saved[index] = NULL;
    return 0;
}

/* A decode after a 40-token prefill gives the same logits when chunks arrive layer by
 * layer through layer_ready, or are faulted in; a missing chunk with no fault fails. */
static void test_layer_ready_and_fault(void)
{
    modelgen_params p = small_params("llama", QTYPE_Q8_0);
    const char *path = gen(&p, "hooks");
    CHECK(path);
    char err[ERR_MAX];
    model *m = model_load(path, err);
    CHECK(m);
    const model_hparams *hp = model_hparams_of(m);
    int nv = hp->n_vocab;
    enum { P = 40 };
    int32_t tok[P + 1], pos[P + 1], row0 = 0;
    for (int i = 0; i <= P; i++)
        tok[i] = (i * 17 + 1) % nv, pos[i] = i;
    float *want = malloc((size_t)nv * sizeof(float)), *got = malloc((size_t)nv * sizeof(float));
    model_runner *r = model_runner_new(m, 2, 8, 0, err);
    kv_pool *pool = kv_pool_new(model_kv_shape(m), 0, err);
    model_batch pre = {.n_tokens = P, .tokens = tok, .positions = pos};
    model_batch dec = {.n_tokens = 1, .tokens = tok + P, .positions = pos + P, .n_out = 1,
                       .out_rows = &row0, .logits = want};

    kv_seq a;
    kv_seq_init(&a, pool);
    hook_state h = {.pool = pool, .seq = &a};
    /* layer_ready on a prefill in sub-batches of 8: once per layer, in order */
    pre.layer_ready = hook_layer_ready, pre.layer_ready_arg = &h;
    CHECK(model_forward(r, &a, &pre, err) == 0);
    CHECK_EQ(h.n_calls, hp->n_layer);
    for (int l = 0; l < hp->n_layer; l++)
        CHECK_EQ(h.calls[l], l);
    pre.layer_ready = NULL;
    CHECK(kv_chunk_convert(pool, a.chunks[1], KV_INT8, err) == 0);
    kv_seq b;
    kv_seq_init(&b, pool);
    for (int c = 0; c < a.n_chunks; c++)
        CHECK(kv_seq_push_chunk(&b, chunk_copy(pool, a.chunks[c]), err) == 0);
    CHECK(model_forward(r, &a, &dec, err) == 0);

    /* layer by layer: every existing chunk's data is garbage until its layer is ready */
    h = (hook_state){.pool = pool, .seq = &b, .n_saved = b.n_chunks};
    for (int c = 0; c < b.n_chunks; c++) {
        h.saved[c] = chunk_copy(pool, b.chunks[c]);
        CHECK(h.saved[c]);
        memset(b.chunks[c]->data, 0x7e,
               kv_chunk_data_bytes(model_kv_shape(m), b.chunks[c]->precision));
    }
    dec.logits = got, dec.layer_ready = hook_layer_ready, dec.layer_ready_arg = &h;
    CHECK(model_forward(r, &b, &dec, err) == 0);
    CHECK_EQ(h.n_calls, hp->n_layer);
    CHECK(memcmp(got, want, (size_t)nv * sizeof(float)) == 0);
    for (int c = 0; c < h.n_saved; c++)
        kv_chunk_free(pool, h.saved[c]);
    dec.layer_ready = NULL;
    kv_seq_free(&b);

    /* faults: chunk 1 of a fresh copy of the prefill is not resident */
    kv_seq_init(&b, pool);
    CHECK(model_forward(r, &b, &pre, err) == 0);
    CHECK(kv_chunk_convert(pool, b.chunks[1], KV_INT8, err) == 0);
    h = (hook_state){.pool = pool, .seq = &b};
    h.saved[1] = b.chunks[1];
    b.chunks[1] = NULL;
    kv_chunk *c0 = b.chunks[0], *c2 = b.chunks[2];
    CHECK(model_forward(r, &b, &dec, err) < 0 && strstr(err, "not resident"));
    CHECK(b.n_chunks == 3 && b.chunks[0] == c0 && !b.chunks[1] && b.chunks[2] == c2);
    CHECK_EQ(c2->n_tokens, P - 32);
    b.fault = hook_fault, b.fault_arg = &h, h.fail = true;
    CHECK(model_forward(r, &b, &dec, err) < 0 && strstr(err, "unreadable"));
    CHECK(b.n_chunks == 3 && !b.chunks[1] && c2->n_tokens == P - 32);
    h.fail = false;
    CHECK(model_forward(r, &b, &dec, err) == 0);
    CHECK_EQ(h.faults, 2);
    CHECK(memcmp(got, want, (size_t)nv * sizeof(float)) == 0);
    CHECK_EQ(kv_seq_n_tokens(&b), P + 1);

    kv_seq_free(&a);
    kv_seq_free(&b);
    CHECK_EQ(kv_pool_n_used(pool), 0);
    kv_pool_free(pool);
    model_runner_free(r);
    free(want);
    free(got);
    model_free(m);
}

static void test_bad_batches(void)
{
    modelgen_params p = small_params("llama", QTYPE_Q8_0);
    const char *path = gen(&p, "bad");
    CHECK(path);
    char err[ERR_MAX];
    model *m = model_load(path, err);
    CHECK(m);
    model_runner *r = model_runner_new(m, 1, 4, 32, err);
    kv_pool *pool = kv_pool_new(model_kv_shape(m), 0, err);
    kv_seq s;
    kv_seq_init(&s, pool);
    int32_t tok[40] = {0}, pos[40], rows[2] = {1, 1};
    for (int i = 0; i < 40; i++)
        pos[i] = i;
    model_batch b = {.n_tokens = 2, .tokens = tok, .positions = pos};
    tok[1] = 260;
    CHECK(model_forward(r, &s, &b, err) < 0 && strstr(err, "out of range"));
    tok[1] = 0;
    pos[1] = -1;
    CHECK(model_forward(r, &s, &b, err) < 0);
    pos[1] = 1;
    b.n_out = 2, b.out_rows = rows;
    CHECK(model_forward(r, &s, &b, err) < 0 && strstr(err, "increasing"));
    b.n_out = 0;
    b.n_tokens = 33;
    CHECK(model_forward(r, &s, &b, err) < 0 && strstr(err, "exceed"));
    b.n_tokens = 6;
    pos[5] = 2; /* decreasing positions across a sub-batch boundary (max_batch 4) */
    CHECK(model_forward(r, &s, &b, err) < 0 && strstr(err, "non-decreasing"));
    CHECK_EQ(kv_seq_n_tokens(&s), 0);
    pos[5] = 5;
    CHECK(model_forward(r, &s, &b, err) == 0);
    CHECK_EQ(kv_seq_n_tokens(&s), 6);
    kv_seq_free(&s);
    kv_pool_free(pool);
    model_runner_free(r);
    model_free(m);
}

/* Puts g's metadata and tensors in w, without tensor `drop` and with tensor `reshape`
 * given shape ne (either NULL: none). */
static void copy_into(gguf_writer *w, const gguf_file *g, const char *drop, const char *reshape,
                      const int64_t *ne)
{
    for (int64_t i = 0; i < gguf_n_kv(g); i++)
        gguf_writer_copy_kv(w, g, i);
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        if (drop && !strcmp(name, drop))
            continue;
        gguf_writer_add_tensor(w, name, t->type, t->n_dims,
                               reshape && !strcmp(name, reshape) ? ne : t->ne, t->data);
    }
}

/* Rewrites src without tensor `drop`, or with tensor `reshape` given shape ne. */
static int rewrite(const char *src, const char *dst, const char *drop, const char *reshape,
                   const int64_t *ne)
{
    char err[ERR_MAX];
    gguf_file *g = gguf_open(src, err);
    if (!g)
        return -1;
    gguf_writer *w = gguf_writer_new();
    copy_into(w, g, drop, reshape, ne);
    int rc = gguf_writer_write(w, dst, err);
    gguf_writer_free(w);
    gguf_close(g);
    return rc;
}

static void test_validation_errors(void)
{
    modelgen_params p = small_params("qwen2", QTYPE_F16);
    char src[512], dst[512], err[ERR_MAX];
    snprintf(src, sizeof src, "%s", gen(&p, "valid"));
    snprintf(dst, sizeof dst, "%s/broken.gguf", test_tmpdir());
    model *m = model_load(src, err);
    CHECK_MSG(m, "%s", err);
    model_free(m);

    const char *required[] = {"blk.1.attn_k.weight", "blk.0.attn_q.bias", "output_norm.weight",
                              "blk.1.ffn_down.weight", "token_embd.weight"};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        CHECK(rewrite(src, dst, required[i], NULL, NULL) == 0);
        CHECK(model_load(dst, err) == NULL);
        CHECK_MSG(strstr(err, required[i]) && strstr(err, "missing"), "%s", err);
    }
    /* wrong shapes: same element count, transposed; and a short norm */
    int64_t t1[2] = {128, 256};
    CHECK(rewrite(src, dst, NULL, "blk.0.attn_v.weight", t1) == 0);
    CHECK(model_load(dst, err) == NULL);
    CHECK_MSG(strstr(err, "blk.0.attn_v.weight") && strstr(err, "shape"), "%s", err);
    int64_t t2[1] = {128};
    CHECK(rewrite(src, dst, NULL, "blk.1.ffn_norm.weight", t2) == 0);
    CHECK(model_load(dst, err) == NULL);
    CHECK_MSG(strstr(err, "blk.1.ffn_norm.weight"), "%s", err);
    /* the qwen3 per-head norms are required for qwen3 */
    p = small_params("qwen3", QTYPE_F32);
    snprintf(src, sizeof src, "%s", gen(&p, "q3"));
    CHECK(rewrite(src, dst, "blk.0.attn_k_norm.weight", NULL, NULL) == 0);
    CHECK(model_load(dst, err) == NULL);
    CHECK_MSG(strstr(err, "attn_k_norm"), "%s", err);
}

/* Logits of n tokens of a fresh sequence at positions pos (n <= 16). */
static int logits_at(const char *path, int n, const int32_t *tok, const int32_t *pos,
                     float *logits, char err[ERR_MAX])
{
    model *m = model_load(path, err);
    if (!m)
        return -1;
    model_runner *r = model_runner_new(m, 1, 16, 64, err);
    kv_pool *pool = r ? kv_pool_new(model_kv_shape(m), 0, err) : NULL;
    int rc = -1;
    if (pool) {
        kv_seq seq;
        kv_seq_init(&seq, pool);
        int32_t rows[16];
        for (int i = 0; i < n; i++)
            rows[i] = i;
        model_batch b = {.n_tokens = n, .tokens = tok, .positions = pos, .n_out = n,
                         .out_rows = rows, .logits = logits};
        rc = model_forward(r, &seq, &b, err);
        kv_seq_free(&seq);
        kv_pool_free(pool);
    }
    model_runner_free(r);
    model_free(m);
    return rc;
}

/* What a rope test adds to a copy of a model; a zero field is not written. */
typedef struct rope_meta {
    const char *scaling_type; /* llama.rope.scaling.type */
    float factor;             /* llama.rope.scaling.factor */
    float freq_factor;        /* rope_freqs.weight, every factor this */
    uint32_t orig_ctx;        /* llama.rope.scaling.original_context_length */
    float attn_factor;        /* llama.rope.scaling.attn_factor */
    bool ext_factor_zero;     /* llama.rope.scaling.yarn_ext_factor = 0 */
} rope_meta;

static int copy_with_rope(const char *src, const char *dst, const rope_meta *rm,
                          char err[ERR_MAX])
{
    gguf_file *g = gguf_open(src, err);
    if (!g)
        return -1;
    gguf_writer *w = gguf_writer_new();
    copy_into(w, g, NULL, NULL, NULL);
    if (rm->scaling_type)
        gguf_writer_set_str(w, "llama.rope.scaling.type", rm->scaling_type);
    if (rm->factor > 0)
        gguf_writer_set_f32(w, "llama.rope.scaling.factor", rm->factor);
    if (rm->orig_ctx > 0)
        gguf_writer_set_u32(w, "llama.rope.scaling.original_context_length", rm->orig_ctx);
    if (rm->attn_factor > 0)
        gguf_writer_set_f32(w, "llama.rope.scaling.attn_factor", rm->attn_factor);
    if (rm->ext_factor_zero)
        gguf_writer_set_f32(w, "llama.rope.scaling.yarn_ext_factor", 0.0f);
    float factors[32];
    int64_t ne[1] = {32}; /* head_dim 64 / 2 */
    for (int i = 0; i < 32; i++)
        factors[i] = rm->freq_factor;
    if (rm->freq_factor > 0)
        gguf_writer_add_tensor(w, "rope_freqs.weight", QTYPE_F32, 1, ne, factors);
    int rc = gguf_writer_write(w, dst, err);
    gguf_writer_free(w);
    gguf_close(g);
    return rc;
}

/* Positions 0, 2, 4, ... of a model whose RoPE turns at half the rate (every frequency
 * divided by 2 through rope_freqs.weight, linear rope scaling of factor 2, or YaRN of
 * factor 2 with yarn_ext_factor 0, which interpolates every pair and adds no temperature)
 * give the plain model's logits at 0, 1, 2, ...: a property of RoPE, which needs no
 * reference. */
static void test_rope_scaled_by_two(void)
{
    modelgen_params p = small_params("llama", QTYPE_F32);
    char src[512], scaled_files[3][512], err[ERR_MAX];
    snprintf(src, sizeof src, "%s", gen(&p, "rope_plain"));
    const rope_meta metas[3] = {
        {.freq_factor = 2.0f},
        {.scaling_type = "linear", .factor = 2.0f},
        {.scaling_type = "yarn", .factor = 2.0f, .orig_ctx = 4096, .ext_factor_zero = true},
    };
    for (int f = 0; f < 3; f++) {
        snprintf(scaled_files[f], sizeof scaled_files[f], "%s/rope_scaled%d.gguf", test_tmpdir(),
                 f);
        CHECK_MSG(copy_with_rope(src, scaled_files[f], &metas[f], err) == 0, "%s", err);
    }

    enum { N = 12, V = 260 };
    int32_t tok[N], pos[N], pos2[N];
    for (int i = 0; i < N; i++) {
        tok[i] = (int32_t)((i * 37 + 11) % V);
        pos[i] = i;
        pos2[i] = 2 * i;
    }
    static float plain[N * V], scaled[N * V];
    CHECK_MSG(logits_at(src, N, tok, pos, plain, err) == 0, "%s", err);
    for (int f = 0; f < 3; f++) {
        CHECK_MSG(logits_at(scaled_files[f], N, tok, pos2, scaled, err) == 0, "%s", err);
        double md = 0;
        for (int i = 0; i < N * V; i++)
            md = fmax(md, fabs((double)plain[i] - scaled[i]));
        CHECK_MSG(md < 1e-4, "%s: max |logit diff| %g", scaled_files[f], md);
    }
}

/* YaRN read from a file (factor s = 4, original context L = 4096, attn_factor 1.25, betas
 * at their defaults 32 and 1) gives the angles of the paper's formulas, computed here in
 * double: pair i of wavelength lambda_i = 2*pi*base^(2i/d) makes r_i = L / lambda_i turns
 * over L; a pair with r_i above beta_fast keeps its frequency theta_i, one below
 * beta_slow takes theta_i / s, one between mixes them by a ramp linear in i between the
 * fractional indices where r equals beta_fast (floored) and beta_slow (ceiled), as
 * llama.cpp places it; cos and sin are multiplied by attn_factor * (0.1 ln s + 1). The
 * checked pairs are asserted to lie at both ramp ends and inside it, so a wrong ramp, a
 * missing temperature or an ignored key fails. */
static void test_rope_yarn_angles(void)
{
    modelgen_params p = small_params("llama", QTYPE_F32);
    char src[512], yarn[512], err[ERR_MAX];
    snprintf(src, sizeof src, "%s", gen(&p, "rope_plain"));
    snprintf(yarn, sizeof yarn, "%s/rope_yarn.gguf", test_tmpdir());
    const rope_meta rm = {.scaling_type = "yarn", .factor = 4.0f, .orig_ctx = 4096,
                          .attn_factor = 1.25f};
    CHECK_MSG(copy_with_rope(src, yarn, &rm, err) == 0, "%s", err);
    model *m = model_load(yarn, err);
    CHECK_MSG(m, "%s", err);
    if (!m)
        return;
    const model_hparams *hp = model_hparams_of(m);
    const int d = hp->head_dim;
    const double s = 4.0, L = 4096.0, base = hp->rope_base, beta_fast = 32.0, beta_slow = 1.0;
    /* the fractional pair index where r_i = beta: L / (2*pi*base^(2i/d)) = beta */
    double i_fast = floor(d / 2.0 * log(L / (2.0 * M_PI * beta_fast)) / log(base));
    double i_slow = ceil(d / 2.0 * log(L / (2.0 * M_PI * beta_slow)) / log(base));
    CHECK_MSG(i_fast >= 2 && i_slow <= d / 2 - 2 && i_slow - i_fast >= 4,
              "ramp [%g, %g] leaves no pair on each side", i_fast, i_slow);
    const int pairs[] = {0, (int)i_fast - 1, (int)i_fast, (int)(i_fast + i_slow) / 2,
                         (int)i_slow - 1, (int)i_slow, d / 2 - 1};
    const int positions[] = {1, 37, 3000};
    double mscale = 1.25 * (0.1 * log(s) + 1.0);
    float cs[OPS_MAX_HEAD_DIM];
    for (size_t k = 0; k < sizeof positions / sizeof *positions; k++) {
        ops_rope_angles(cs, positions[k], d, hp->rope_base, &hp->rope_scaling, NULL);
        for (size_t j = 0; j < sizeof pairs / sizeof *pairs; j++) {
            int i = pairs[j];
            double theta = pow(base, -2.0 * i / d);
            double r = L / (2.0 * M_PI / theta);
            double gamma = i <= i_fast ? 1.0 : i >= i_slow ? 0.0 : (i_slow - i) / (i_slow - i_fast);
            if (i < i_fast)
                CHECK_MSG(r > beta_fast, "pair %d: r %g", i, r);
            if (i > i_slow)
                CHECK_MSG(r < beta_slow, "pair %d: r %g", i, r);
            double freq = (1.0 - gamma) * theta / s + gamma * theta;
            double want_c = mscale * cos(positions[k] * freq);
            double want_s = mscale * sin(positions[k] * freq);
            CHECK_MSG(fabs(cs[2 * i] - want_c) < 2e-6 && fabs(cs[2 * i + 1] - want_s) < 2e-6,
                      "pos %d pair %d: (%g, %g), want (%g, %g)", positions[k], i,
                      (double)cs[2 * i], (double)cs[2 * i + 1], want_c, want_s);
        }
    }
    model_free(m);
}

/* A kind of rope scaling the engine does not compute (longrope) is refused at load, naming
 * it: loaded without it, the model would answer as another one. */
static void test_rope_scaling_refused(void)
{
    modelgen_params p = small_params("llama", QTYPE_F32);
    char src[512], longrope[512], err[ERR_MAX] = "";
    snprintf(src, sizeof src, "%s", gen(&p, "rope_plain"));
    snprintf(longrope, sizeof longrope, "%s/rope_longrope.gguf", test_tmpdir());
    const rope_meta rm = {.scaling_type = "longrope", .factor = 4.0f};
    CHECK_MSG(copy_with_rope(src, longrope, &rm, err) == 0, "%s", err);
    model *m = model_load(longrope, err);
    CHECK(m == NULL);
    CHECK_MSG(strstr(err, "rope scaling 'longrope'"), "%s", err);
    model_free(m);
}

static void test_metadata(void)
{
    modelgen_params p = small_params("qwen3", QTYPE_Q6_K);
    p.tie_output = true;
    char err[ERR_MAX];
    model *m = model_load(gen(&p, "meta"), err);
    CHECK_MSG(m, "%s", err);
    const model_hparams *hp = model_hparams_of(m);
    CHECK_EQ(hp->arch, MODEL_ARCH_QWEN3);
    CHECK_EQ(hp->rope_style, MODEL_ROPE_HALVES);
    CHECK_EQ(hp->n_vocab, 260);
    CHECK_EQ(hp->dim, 256);
    CHECK_EQ(hp->n_layer, 2);
    CHECK_EQ(hp->n_head, 4);
    CHECK_EQ(hp->n_head_kv, 2);
    CHECK_EQ(hp->head_dim, 64);
    CHECK_EQ(hp->n_ff, 512);
    CHECK_EQ(hp->n_ctx, 128);
    CHECK_NEAR(hp->rope_base, 1e6, 1);
    CHECK_NEAR(hp->norm_eps, 1e-6, 1e-9);
    kv_shape ks = model_kv_shape(m);
    CHECK(ks.n_layer == 2 && ks.n_head_kv == 2 && ks.head_dim == 64);
    CHECK(model_load("/nonexistent/model.gguf", err) == NULL);
    model_free(m);
}

int main(void)
{
    RUN(test_metadata);
    RUN(test_all_archs_and_types);
    RUN(test_mixes_with_fallbacks);
    RUN(test_gqa_mqa_mha_and_tied);
    RUN(test_threads_identical);
    RUN(test_hidden_and_attention);
    RUN(test_bad_batches);
    RUN(test_compressed_chunks);
    RUN(test_attn_received);
    RUN(test_layer_ready_and_fault);
    RUN(test_validation_errors);
    RUN(test_rope_scaled_by_two);
    RUN(test_rope_yarn_angles);
    RUN(test_rope_scaling_refused);
    return test_finish();
}
