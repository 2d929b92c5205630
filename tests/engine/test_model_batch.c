/*
 * model_forward_batch against model_forward: every sequence of a batched step gives the
 * outputs (logits, hidden, hidden_last, attn_received) and appends the K/V it gives when
 * evaluated alone.
 *
 * Each sequence exists twice, built by identical prefills: one copy is advanced alone
 * with model_forward, the other in one model_forward_batch step with the others. With at
 * most 16 stacked rows (decode of several sequences) the matrix products use the per-row
 * dot kernels and everything is bit-equal, compressed chunks included (but for the
 * packed Q8_0 kernel from 3 rows on AVX-512 VNNI: within f32 rounding, test_decode_packed;
 * on repacked Q8_0 weights, model_repack_weights, every product is the scalar kernel's
 * at any row count, so batched = alone bit for bit there, mixed decode and prefill rows
 * included: test_decode_repacked). With more rows they use sgemm. Differences are then
 * relative to each output's largest magnitude (when above 1): for float weights they are rounding (TOL_MIXED_FLOAT, measured
 * ~1e-5 on logits); for quantized weights the lone decode rows were computed against
 * 8-bit quantized activations and the stacked ones are not, the difference test_model.c
 * bounds against the reference (TOL_MIXED_QUANT, measured up to 0.02 on logits, of the
 * trained Q8_0 model). K/V are stored in f16, so a rounding difference can flip one f16
 * step: TOL_KV_FLOAT (measured 2e-3) for float weights.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/model.h"
#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"
#include "tests/support/test.h"

#define TOL_MIXED_FLOAT 1e-3
#define TOL_MIXED_QUANT 0.1
#define TOL_KV_FLOAT 1e-2
#define MAX_SEQ 80
#define MAX_ROWS 32

/* A model, a runner and n sequences twice over: a[i] advanced alone, b[i] batched. */
typedef struct fixture {
    model *m;
    model_runner *r;
    kv_pool *pool;
    int nv, dim, n_layer;
    int n_seq;
    kv_seq a[MAX_SEQ], b[MAX_SEQ];
    int32_t base[MAX_SEQ]; /* position of each sequence's first entry */
} fixture;

static int32_t tok_of(const fixture *f, int seq, int i)
{
    return (int32_t)((i * 31 + seq * 7 + 3) % f->nv);
}

/* Loads the model (its weights repacked when repack says so, model_repack_weights) and
 * prefills sequence i with hist[i] entries (both copies). */
static int fixture_init(fixture *f, const char *path, bool repack, int n_threads, int max_batch,
                        int n_seq, const int *hist)
{
    char err[ERR_MAX];
    memset(f, 0, sizeof *f);
    f->m = model_load(path, err);
    if (f->m && repack && model_repack_weights(f->m, err) < 0) {
        model_free(f->m);
        f->m = NULL;
    }
    if (!f->m) {
        fprintf(stderr, "load: %s\n", err);
        return -1;
    }
    const model_hparams *hp = model_hparams_of(f->m);
    f->nv = hp->n_vocab, f->dim = hp->dim, f->n_layer = hp->n_layer;
    f->r = model_runner_new(f->m, n_threads, max_batch, 256, err);
    f->pool = kv_pool_new(model_kv_shape(f->m), 0, err);
    if (!f->r || !f->pool)
        return -1;
    f->n_seq = n_seq;
    for (int i = 0; i < n_seq; i++) {
        kv_seq_init(&f->a[i], f->pool);
        kv_seq_init(&f->b[i], f->pool);
        f->base[i] = i % 3 == 1 ? 50 : 0; /* some start later: positions need not be indices */
        int32_t tok[256], pos[256];
        for (int t = 0; t < hist[i]; t++)
            tok[t] = tok_of(f, i, t), pos[t] = f->base[i] + t;
        model_batch pre = {.n_tokens = hist[i], .tokens = tok, .positions = pos};
        if (model_forward(f->r, &f->a[i], &pre, err) < 0 ||
            model_forward(f->r, &f->b[i], &pre, err) < 0) {
            fprintf(stderr, "prefill: %s\n", err);
            return -1;
        }
    }
    return 0;
}

static void fixture_free(fixture *f)
{
    for (int i = 0; i < f->n_seq; i++) {
        kv_seq_free(&f->a[i]);
        kv_seq_free(&f->b[i]);
    }
    kv_pool_free(f->pool);
    model_runner_free(f->r);
    model_free(f->m);
}

/* Converts every full chunk of sequence i (both copies) to p. */
static int fixture_compress(fixture *f, int i, enum kv_precision p)
{
    char err[ERR_MAX];
    kv_seq *s[2] = {&f->a[i], &f->b[i]};
    for (int k = 0; k < 2; k++)
        for (int c = 0; c < s[k]->n_chunks; c++)
            if (s[k]->chunks[c]->n_tokens == KV_CHUNK_TOKENS &&
                kv_chunk_convert(f->pool, s[k]->chunks[c], p, err) < 0)
                return -1;
    return 0;
}

/* Largest |x - y| over n floats relative to the largest |x| when that is above 1 (trained
 * models' residuals reach hundreds); 1e9 for a NaN. */
static double max_diff(const float *x, const float *y, size_t n)
{
    double d = 0, scale = 1;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)x[i] - y[i]);
        d = e > d || isnan(e) ? (isnan(e) ? 1e9 : e) : d;
        scale = fabs(x[i]) > scale ? fabs(x[i]) : scale;
    }
    return d / scale;
}

/* Largest difference between the two copies' K/V (1e9 when ids, positions or chunk
 * counts differ). */
static double kv_diff(const fixture *f, int i)
{
    const kv_seq *a = &f->a[i], *b = &f->b[i];
    if (a->n_chunks != b->n_chunks)
        return 1e9;
    kv_shape shape = kv_pool_shape(f->pool);
    size_t n = (size_t)KV_CHUNK_TOKENS * shape.head_dim;
    float *buf = malloc(4 * n * sizeof(float));
    double d = 0;
    for (int c = 0; c < a->n_chunks; c++) {
        const kv_chunk *x = a->chunks[c], *y = b->chunks[c];
        if (x->n_tokens != y->n_tokens || x->precision != y->precision ||
            memcmp(x->tokens, y->tokens, x->n_tokens * sizeof(int32_t)) ||
            memcmp(x->positions, y->positions, x->n_tokens * sizeof(int32_t))) {
            d = 1e9;
            break;
        }
        size_t m = (size_t)x->n_tokens * shape.head_dim;
        for (int l = 0; l < shape.n_layer; l++)
            for (int h = 0; h < shape.n_head_kv; h++) {
                kv_chunk_read_f32(x, shape, l, h, buf, buf + n);
                kv_chunk_read_f32(y, shape, l, h, buf + 2 * n, buf + 3 * n);
                double e = max_diff(buf, buf + 2 * n, m), e2 = max_diff(buf + n, buf + 3 * n, m);
                d = e > d ? e : d;
                d = e2 > d ? e2 : d;
            }
    }
    free(buf);
    return d;
}

/* Differences between the lone and the batched evaluation of one step. */
typedef struct step_diff {
    double logits, hidden, received, kv;
    bool identical; /* every output bit-equal */
} step_diff;

/*
 * One step: sequence i evaluates rows[i] new tokens, with every row out when all_out,
 * else its last. Alone (a copies) then batched (b copies); contiguous puts every
 * sequence's logits into one array, in order (otherwise each has its own). 0, or -1 when
 * a forward failed.
 */
static int step(fixture *f, const int *rows, bool all_out, bool contiguous, step_diff *d)
{
    char err[ERR_MAX];
    const model_hparams *hp = model_hparams_of(f->m);
    int n = f->n_seq, total_out = 0;
    int32_t *tok = malloc((size_t)n * MAX_ROWS * sizeof(int32_t));
    int32_t *pos = malloc((size_t)n * MAX_ROWS * sizeof(int32_t));
    int32_t out[MAX_ROWS];
    for (int t = 0; t < MAX_ROWS; t++)
        out[t] = t;
    model_batch *ba = calloc(n, sizeof *ba), *bb = calloc(n, sizeof *bb);
    kv_seq **seqs = malloc(n * sizeof *seqs);
    size_t *lo = malloc(n * sizeof *lo); /* first logits row of each sequence */
    for (int i = 0; i < n; i++) {
        int n_kv = kv_seq_n_tokens(&f->a[i]);
        for (int t = 0; t < rows[i]; t++) {
            tok[i * MAX_ROWS + t] = tok_of(f, i, n_kv + t);
            pos[i * MAX_ROWS + t] = f->base[i] + n_kv + t;
        }
        int n_out = all_out ? rows[i] : 1;
        lo[i] = total_out;
        total_out += n_out;
        ba[i] = (model_batch){.n_tokens = rows[i], .tokens = tok + i * MAX_ROWS,
                              .positions = pos + i * MAX_ROWS, .n_out = n_out,
                              .out_rows = all_out ? out : out + rows[i] - 1};
        seqs[i] = &f->b[i];
    }
    size_t n_recv = 0;
    for (int i = 0; i < n; i++)
        n_recv += kv_seq_n_tokens(&f->a[i]) + rows[i];
    size_t hid = (size_t)(f->n_layer + 1) * f->dim;
    float *logits[2], *hidden[2], *last[2], *recv[2];
    for (int k = 0; k < 2; k++) {
        logits[k] = malloc((size_t)total_out * f->nv * sizeof(float));
        hidden[k] = malloc((size_t)total_out * hid * sizeof(float));
        last[k] = malloc((size_t)total_out * f->dim * sizeof(float));
        recv[k] = malloc(n_recv * sizeof(float));
        for (size_t j = 0; j < n_recv; j++)
            recv[k][j] = 1.0f; /* attn_received adds to what is there */
    }
    /* separate logits arrays: each sequence's rows go to the other end of the array */
    size_t r_off = 0;
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < 2; k++) {
            model_batch *b = k ? &bb[i] : &ba[i];
            *b = ba[i];
            size_t lrow = contiguous || !k ? lo[i] : (size_t)total_out - lo[i] - b->n_out;
            b->logits = logits[k] + lrow * f->nv;
            b->hidden = hidden[k] + lo[i] * hid;
            b->hidden_last = last[k] + lo[i] * f->dim;
            b->attn_received = recv[k] + r_off;
        }
        r_off += kv_seq_n_tokens(&f->a[i]) + rows[i];
    }
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++)
        if (model_forward(f->r, &f->a[i], &ba[i], err) < 0)
            rc = -1;
    if (rc == 0 && model_forward_batch(f->r, n, seqs, bb, err) < 0)
        rc = -1;
    if (rc < 0) {
        fprintf(stderr, "forward: %s\n", err);
    } else {
        /* put the batched logits back in the lone order */
        float *lb = malloc((size_t)total_out * f->nv * sizeof(float));
        for (int i = 0; i < n; i++)
            memcpy(lb + lo[i] * f->nv, bb[i].logits, (size_t)bb[i].n_out * f->nv * sizeof(float));
        size_t nl = (size_t)total_out * f->nv;
        d->logits = max_diff(logits[0], lb, nl);
        d->hidden = max_diff(hidden[0], hidden[1], (size_t)total_out * hid);
        double dl = max_diff(last[0], last[1], (size_t)total_out * f->dim);
        d->hidden = dl > d->hidden ? dl : d->hidden;
        d->received = max_diff(recv[0], recv[1], n_recv);
        d->kv = 0;
        for (int i = 0; i < n; i++) {
            double e = kv_diff(f, i);
            d->kv = e > d->kv ? e : d->kv;
        }
        /* hidden_last is the last hidden slot */
        for (int i = 0; i < n; i++)
            for (int o = 0; o < ba[i].n_out; o++)
                if (memcmp(ba[i].hidden_last + (size_t)o * f->dim,
                           ba[i].hidden + ((size_t)hp->n_layer * ba[i].n_out + o) * f->dim,
                           (size_t)f->dim * sizeof(float)))
                    d->hidden = 1e9;
        d->identical = !memcmp(logits[0], lb, nl * sizeof(float)) &&
                       !memcmp(hidden[0], hidden[1], (size_t)total_out * hid * sizeof(float)) &&
                       !memcmp(last[0], last[1], (size_t)total_out * f->dim * sizeof(float)) &&
                       d->kv == 0;
        free(lb);
    }
    for (int k = 0; k < 2; k++)
        free(logits[k]), free(hidden[k]), free(last[k]), free(recv[k]);
    free(tok), free(pos), free(ba), free(bb), free(seqs), free(lo);
    return rc;
}

static const char *gen(const char *arch, uint32_t type, int n_head_kv)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s-%s-%d.gguf", test_tmpdir(), arch,
             quant_traits_of(type)->name, n_head_kv);
    modelgen_params p = {.arch = arch, .dim = 128, .n_layer = 2, .n_head = 4,
                         .n_head_kv = n_head_kv, .n_ff = 256, .n_ctx = 256, .type = type,
                         .seed = 11, .n_vocab = 300, .n_threads = 1};
    char err[ERR_MAX];
    if (modelgen_write(&p, path, err) < 0) {
        fprintf(stderr, "modelgen: %s\n", err);
        return NULL;
    }
    return path;
}

static const char *ARCHS[] = {"llama", "qwen2", "qwen3"};

#define TOL_PACKED 1e-4

/* Whether n stacked rows of f's model take the packed-activation kernel (Q8_0 weights
 * where the CPU has one), whose sums are ordered otherwise than the lone rows'. */
static bool takes_packed(const fixture *f, int n)
{
    const gguf_tensor *wq = gguf_find_tensor(model_gguf(f->m), "blk.0.attn_q.weight");
    return wq && quant_packed_kernel(wq->type) &&
           quant_packed_bytes(quant_dot_activation_type(wq->type), n, f->dim) > 0;
}

/* Whether the step is as it should be: bit-equal, or within f32 rounding where the
 * packed kernel ordered the sums otherwise (then attn_received too). */
static bool decode_agrees(const step_diff *d, bool packed)
{
    return packed ? d->logits <= TOL_PACKED && d->hidden <= TOL_PACKED &&
                        d->kv <= TOL_KV_FLOAT && d->received <= TOL_PACKED
                  : d->identical;
}

/* Five sequences of different histories each decode one row: bit-equal to alone, on 1
 * and 2 threads (within f32 rounding where the packed kernel takes the five rows:
 * TOL_PACKED; bit-equal again when the weights are repacked, whose kernel sums as the
 * scalar one does for any number of rows); attn_received too on 1 thread (on 2 the
 * per-thread sums are added in finishing order). Then again with some full chunks
 * compressed to int8, int4 and int2. */
static void check_decode(const char *path, const char *name, bool repack)
{
    static const int hist[] = {5, 16, 33, 47, 70}, ones[] = {1, 1, 1, 1, 1};
    for (int th = 1; th <= 2; th++) {
        fixture f;
        CHECK_MSG(fixture_init(&f, path, repack, th, 64, 5, hist) == 0, "%s", name);
        bool packed = !repack && takes_packed(&f, 5);
        step_diff d;
        for (int round = 0; round < 3; round++) {
            CHECK(step(&f, ones, false, round == 1, &d) == 0);
            CHECK_MSG(decode_agrees(&d, packed),
                      "%s, %d threads, round %d: logits %g hidden %g kv %g", name, th, round,
                      d.logits, d.hidden, d.kv);
            if (packed)
                continue;
            if (th == 1)
                CHECK_MSG(d.received == 0, "%s: received %g", name, d.received);
            else
                CHECK_MSG(d.received <= 1e-4, "%s: received %g", name, d.received);
        }
        if (packed) {
            /* the packed steps left the copies' K/V an f16 step apart here and there, which
             * 2-bit codes can turn into a whole code: start again from identical prefills */
            fixture_free(&f);
            CHECK_MSG(fixture_init(&f, path, repack, th, 64, 5, hist) == 0, "%s", name);
        }
        CHECK(fixture_compress(&f, 1, KV_INT8) == 0);
        CHECK(fixture_compress(&f, 2, KV_INT4) == 0);
        CHECK(fixture_compress(&f, 4, KV_INT2) == 0);
        CHECK(f.a[4].chunks[0]->precision == KV_INT2 && f.b[2].chunks[1]->precision == KV_INT4);
        for (int round = 0; round < 2; round++) {
            CHECK(step(&f, ones, false, false, &d) == 0);
            CHECK_MSG(decode_agrees(&d, packed),
                      "%s compressed, %d threads: logits %g hidden %g kv %g", name, th,
                      d.logits, d.hidden, d.kv);
            CHECK(packed || th == 2 || d.received == 0);
        }
        fixture_free(&f);
    }
}

static void test_decode_identical(void)
{
    for (int a = 0; a < 3; a++) {
        const char *path = gen(ARCHS[a], QTYPE_Q8_0, 2);
        CHECK(path);
        check_decode(path, ARCHS[a], false);
        check_decode(path, ARCHS[a], true);
    }
    /* float weights, MQA */
    const char *path = gen("qwen3", QTYPE_F16, 1);
    CHECK(path);
    check_decode(path, "qwen3 f16 mqa", false);
    check_decode(path, "qwen3 f16 mqa (nothing to repack)", true);
}

/* 3 sequences decoding one row, one prefilling 20 (sgemm attention) and one 5, with the
 * two prefills' chunks partly compressed: 28 stacked rows, within tolerance. */
static void check_mixed(const char *path, const char *name, double tol)
{
    static const int hist[] = {9, 40, 21, 3, 64}, rows[] = {1, 20, 1, 5, 1};
    fixture f;
    CHECK_MSG(fixture_init(&f, path, false, 2, 64, 5, hist) == 0, "%s", name);
    CHECK(fixture_compress(&f, 1, KV_INT4) == 0);
    CHECK(fixture_compress(&f, 4, KV_INT8) == 0);
    for (int round = 0; round < 2; round++) {
        step_diff d;
        CHECK(step(&f, rows, round == 0, round == 1, &d) == 0);
        printf("  %s mixed: max |diff| logits %.3g hidden %.3g received %.3g kv %.3g\n", name,
               d.logits, d.hidden, d.received, d.kv);
        CHECK_MSG(d.logits <= tol && d.hidden <= tol, "%s: logits %g hidden %g > %g", name,
                  d.logits, d.hidden, tol);
        CHECK_MSG(d.kv <= (tol > TOL_KV_FLOAT ? tol : TOL_KV_FLOAT), "%s: kv %g", name, d.kv);
        CHECK_MSG(d.received <= tol, "%s: received %g", name, d.received);
    }
    for (int i = 0; i < 5; i++)
        CHECK_EQ(kv_seq_n_tokens(&f.b[i]), hist[i] + 2 * rows[i]);
    fixture_free(&f);
}

static void test_mixed_decode_prefill(void)
{
    for (int a = 0; a < 3; a++) {
        const char *path = gen(ARCHS[a], QTYPE_F32, 2);
        CHECK(path);
        check_mixed(path, ARCHS[a], TOL_MIXED_FLOAT);
        path = gen(ARCHS[a], QTYPE_Q8_0, 2);
        CHECK(path);
        check_mixed(path, ARCHS[a], TOL_MIXED_QUANT);
    }
}

/* 70 sequences decoding one row each: more logit rows than one staging product holds. */
static void test_many_sequences(void)
{
    const char *path = gen("llama", QTYPE_F32, 2);
    CHECK(path);
    int hist[70], rows[70];
    for (int i = 0; i < 70; i++)
        hist[i] = 1 + i % 13, rows[i] = 1;
    fixture f;
    CHECK(fixture_init(&f, path, false, 2, 128, 70, hist) == 0);
    step_diff d;
    CHECK(step(&f, rows, false, false, &d) == 0);
    CHECK_MSG(d.logits <= TOL_MIXED_FLOAT && d.kv <= TOL_KV_FLOAT, "logits %g kv %g",
              d.logits, d.kv);
    fixture_free(&f);
}

/* Twelve Q8_0 sequences decoding together: where the CPU has the packed-activation
 * kernel (AVX-512 VNNI) the stacked rows sum each dot product in the scalar kernel's
 * order and the lone rows in the SIMD kernel's lane order, so they agree to f32 rounding
 * (TOL_PACKED, measured ~1e-6 on logits); elsewhere they are bit-equal. */
static void test_decode_packed(void)
{
    const char *path = gen("llama", QTYPE_Q8_0, 2);
    CHECK(path);
    int hist[12], rows[12];
    for (int i = 0; i < 12; i++)
        hist[i] = 3 + 5 * i, rows[i] = 1;
    fixture f;
    CHECK(fixture_init(&f, path, false, 2, 64, 12, hist) == 0);
    step_diff d;
    for (int round = 0; round < 3; round++) {
        CHECK(step(&f, rows, false, false, &d) == 0);
        bool packed = quant_packed_bytes(QTYPE_Q8_0, 12, 64) > 0;
        CHECK_MSG(packed ? d.logits <= TOL_PACKED && d.kv <= TOL_KV_FLOAT : d.identical,
                  "round %d: logits %g hidden %g kv %g", round, d.logits, d.hidden, d.kv);
        if (round == 0)
            printf("  12 sequences (%s): max |diff| logits %.3g hidden %.3g kv %.3g\n",
                   packed ? "packed" : "per-row", d.logits, d.hidden, d.kv);
    }
    fixture_free(&f);
}

/* 4, 12 and 16 Q8_0 sequences decoding together on repacked weights (where the CPU has
 * the repacked kernels): bit-equal to each alone, the output matrix's 12 rows past its
 * last whole group of 16 (300 tokens) included; and 28 rows of decode and prefill
 * mixed (check_mixed's step, which on weights as stored differs by f32 rounding). */
static void test_decode_repacked(void)
{
    if (!quant_repack_kernel(QTYPE_Q8_0)) {
        SKIP("no repacked Q8_0 kernel on this CPU (AVX-512 VNNI, or LLMS_NO_SIMD / LLMS_NO_AVX512 set)");
        return;
    }
    const char *path = gen("qwen2", QTYPE_Q8_0, 2);
    CHECK(path);
    static const int counts[] = {4, 12, 16};
    for (int c = 0; c < 3; c++) {
        int n = counts[c], hist[16], rows[16];
        for (int i = 0; i < n; i++)
            hist[i] = 2 + 7 * i, rows[i] = 1;
        fixture f;
        CHECK(fixture_init(&f, path, true, 2, 64, n, hist) == 0);
        CHECK(model_repacked_bytes(f.m) > 0);
        for (int round = 0; round < 2; round++) {
            step_diff d;
            CHECK(step(&f, rows, false, round == 1, &d) == 0);
            CHECK_MSG(d.identical, "%d sequences, round %d: logits %g hidden %g kv %g", n, round,
                      d.logits, d.hidden, d.kv);
        }
        fixture_free(&f);
    }
    static const int hist[] = {9, 40, 21, 3, 64}, rows[] = {1, 20, 1, 5, 1};
    fixture f;
    CHECK(fixture_init(&f, path, true, 2, 64, 5, hist) == 0);
    step_diff d;
    CHECK(step(&f, rows, true, false, &d) == 0);
    CHECK_MSG(d.identical, "repacked mixed: logits %g hidden %g kv %g", d.logits, d.hidden, d.kv);
    fixture_free(&f);
}

/* Logits of a 6-token prompt's last row on m (f32 to logits). */
static int prompt_logits(model *m, float *logits, char err[ERR_MAX])
{
    model_runner *r = model_runner_new(m, 2, 16, 64, err);
    kv_pool *pool = kv_pool_new(model_kv_shape(m), 0, err);
    int rc = -1;
    if (r && pool) {
        kv_seq seq;
        kv_seq_init(&seq, pool);
        int32_t tok[] = {5, 77, 3, 120, 9, 250}, pos[] = {0, 1, 2, 3, 4, 5}, out[] = {5};
        model_batch b = {.n_tokens = 6, .tokens = tok, .positions = pos, .n_out = 1,
                         .out_rows = out, .logits = logits};
        rc = model_forward(r, &seq, &b, err);
        kv_seq_free(&seq);
    }
    kv_pool_free(pool);
    model_runner_free(r);
    return rc;
}

/* Repacking copied weights gives their pages back (model_repacked_bytes well below the
 * mapped model's copy) and computes the same logits as repacking mapped ones; repacked
 * weights refuse to stream, and a second call repacks nothing more. */
static void test_repack_load_modes(void)
{
    if (!quant_repack_kernel(QTYPE_Q8_0)) {
        SKIP("no repacked Q8_0 kernel on this CPU (AVX-512 VNNI, or LLMS_NO_SIMD / LLMS_NO_AVX512 set)");
        return;
    }
    const char *path = gen("llama", QTYPE_Q8_0, 2);
    CHECK(path);
    char err[ERR_MAX];
    model *map = model_load(path, err), *copy = model_load_as(path, GGUF_LOAD_COPY, err);
    CHECK(map && copy);
    CHECK(model_repack_weights(map, err) == 0 && model_repack_weights(copy, err) == 0);
    size_t mapped = model_repacked_bytes(map);
    CHECK(mapped > 0);
    CHECK_MSG(model_repacked_bytes(copy) < mapped / 2, "copy %zu of %zu",
              model_repacked_bytes(copy), mapped);
    CHECK(model_repack_weights(map, err) == 0 && model_repacked_bytes(map) == mapped);
    float a[300], b[300];
    CHECK(prompt_logits(map, a, err) == 0 && prompt_logits(copy, b, err) == 0);
    CHECK(memcmp(a, b, sizeof a) == 0);
    model_runner *r = model_runner_new(map, 1, 16, 64, err);
    CHECK(r);
    CHECK(model_runner_stream_weights(r, 1 << 20, err) < 0);
    CHECK_MSG(strstr(err, "repacked"), "%s", err);
    model_runner_free(r);
    model_free(map);
    model_free(copy);
}

/* The trained models of the test data: decode bit-equal, mixed within tolerance. */
static void test_trained_models(void)
{
    const char *names[] = {"models/stories260K.gguf", "models/TinyStories-656K-Q8_0.gguf"};
    int found = 0;
    for (int i = 0; i < 2; i++) {
        const char *p = test_data_path(names[i]);
        if (!p)
            continue;
        char path[1024];
        snprintf(path, sizeof path, "%s", p);
        found++;
        check_decode(path, names[i], false);
        check_decode(path, names[i], true);
        check_mixed(path, names[i], i == 0 ? TOL_MIXED_FLOAT : TOL_MIXED_QUANT);
    }
    if (!found)
        SKIP("stories260K.gguf and TinyStories-656K-Q8_0.gguf not in LLMS_TESTDATA");
}

/* Sequence lengths, chunk pointers and pool use, to check a failed step changed nothing. */
static void snapshot(const fixture *f, int *out)
{
    for (int i = 0; i < f->n_seq; i++)
        out[2 * i] = kv_seq_n_tokens(&f->b[i]), out[2 * i + 1] = f->b[i].n_chunks;
    out[2 * f->n_seq] = kv_pool_n_used(f->pool);
}

static void test_errors(void)
{
    const char *path = gen("llama", QTYPE_Q8_0, 2);
    CHECK(path);
    static const int hist[] = {16, 3, 20, 7};
    fixture f;
    CHECK(fixture_init(&f, path, false, 2, 8, 4, hist) == 0);
    char err[ERR_MAX];
    int32_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8}, pos[4][8];
    model_batch b[4];
    kv_seq *seqs[4];
    for (int i = 0; i < 4; i++) {
        for (int t = 0; t < 8; t++)
            pos[i][t] = f.base[i] + hist[i] + t;
        b[i] = (model_batch){.n_tokens = 2, .tokens = tok, .positions = pos[i]};
        seqs[i] = &f.b[i];
    }
    int before[9], after[9];
    snapshot(&f, before);

    b[3].n_tokens = 3; /* 9 rows > max batch 8 */
    CHECK(model_forward_batch(f.r, 4, seqs, b, err) < 0);
    CHECK_MSG(strstr(err, "9") && strstr(err, "8"), "%s", err);
    b[3].n_tokens = 2;
    seqs[3] = &f.b[1];
    CHECK(model_forward_batch(f.r, 4, seqs, b, err) < 0);
    CHECK_MSG(strstr(err, "same sequence"), "%s", err);
    seqs[3] = &f.b[3];
    int32_t bad[2] = {1, 300};
    b[2].tokens = bad;
    CHECK(model_forward_batch(f.r, 4, seqs, b, err) < 0);
    CHECK_MSG(strstr(err, "batch 2") && strstr(err, "out of range"), "%s", err);
    b[2].tokens = tok;
    int32_t rows[1] = {0};
    float attn[4096];
    b[1].attn = attn, b[1].n_out = 1, b[1].out_rows = rows;
    CHECK(model_forward_batch(f.r, 4, seqs, b, err) < 0);
    CHECK_MSG(strstr(err, "attn"), "%s", err);
    b[1].attn = NULL;
    b[0].n_tokens = 0;
    CHECK(model_forward_batch(f.r, 4, seqs, b, err) < 0 && strstr(err, "empty"));
    b[0].n_tokens = 2;
    /* the last sequence would pass the runner's 256 entries: the others were reserved
     * first and are given back */
    int32_t far[2];
    b[3].n_tokens = 2;
    snapshot(&f, after);
    CHECK(memcmp(before, after, sizeof before) == 0);
    CHECK(model_forward_batch(f.r, 3, seqs, b, err) == 0);
    for (int i = 0; i < 3; i++)
        for (int t = 0; t < 2; t++)
            pos[i][t] += 2;
    kv_seq big;
    kv_seq_init(&big, f.pool);
    int32_t ptok[255], ppos[255];
    for (int t = 0; t < 255; t++)
        ptok[t] = t % 300, ppos[t] = t;
    model_batch pre = {.n_tokens = 255, .tokens = ptok, .positions = ppos};
    CHECK(model_forward(f.r, &big, &pre, err) == 0);
    snapshot(&f, before);
    far[0] = 255, far[1] = 256;
    b[3].positions = far;
    seqs[3] = &big;
    CHECK(model_forward_batch(f.r, 4, seqs, b, err) < 0);
    CHECK_MSG(strstr(err, "batch 3") && strstr(err, "exceed"), "%s", err);
    CHECK_EQ(kv_seq_n_tokens(&big), 255);
    snapshot(&f, after);
    CHECK(memcmp(before, after, sizeof before) == 0);
    kv_seq_free(&big);
    fixture_free(&f);
}

/* A pool cap that the third sequence's new chunk exceeds: the chunks the first two took
 * are given back and nothing is appended anywhere. */
static void test_reserve_rollback(void)
{
    const char *path = gen("qwen2", QTYPE_F32, 2);
    CHECK(path);
    char err[ERR_MAX];
    model *m = model_load(path, err);
    CHECK(m);
    model_runner *r = model_runner_new(m, 1, 64, 0, err);
    kv_pool *pool = kv_pool_new(model_kv_shape(m), 4, err);
    CHECK(r && pool);
    kv_seq s[3];
    kv_seq *seqs[3] = {&s[0], &s[1], &s[2]};
    int32_t tok[KV_CHUNK_TOKENS + 1] = {0}, pos[KV_CHUNK_TOKENS + 1];
    for (int t = 0; t <= KV_CHUNK_TOKENS; t++)
        pos[t] = t;
    model_batch b[3];
    for (int i = 0; i < 3; i++) {
        kv_seq_init(&s[i], pool);
        b[i] = (model_batch){.n_tokens = KV_CHUNK_TOKENS, .tokens = tok, .positions = pos};
    }
    CHECK(model_forward_batch(r, 2, seqs, b, err) == 0); /* one full chunk each */
    CHECK_EQ(kv_pool_n_used(pool), 2);
    model_batch d[3];
    for (int i = 0; i < 3; i++)
        d[i] = (model_batch){.n_tokens = 1, .tokens = tok, .positions = pos + KV_CHUNK_TOKENS};
    d[2].positions = pos;
    CHECK(model_forward_batch(r, 3, seqs, d, err) < 0); /* 0 and 1 take chunks 3 and 4 */
    CHECK_EQ(kv_pool_n_used(pool), 2);
    for (int i = 0; i < 3; i++)
        CHECK_EQ(kv_seq_n_tokens(&s[i]), i < 2 ? KV_CHUNK_TOKENS : 0);
    CHECK(model_forward_batch(r, 2, seqs, d, err) == 0);
    CHECK_EQ(kv_pool_n_used(pool), 4);
    for (int i = 0; i < 3; i++)
        kv_seq_free(&s[i]);
    kv_pool_free(pool);
    model_runner_free(r);
    model_free(m);
}

/* The fault callback's state: the chunk it puts back, and a sequence whose chunk it drops
 * (as a context manager making room might). */
typedef struct fault_state {
    kv_chunk *saved;
    kv_seq *victim;
    int calls;
} fault_state;

static int put_back(void *arg, kv_seq *seq, int index, char err[ERR_MAX])
{
    fault_state *fs = arg;
    (void)err;
    fs->calls++;
    seq->chunks[index] = fs->saved;
    fs->saved = NULL;
    if (fs->victim) {
        fs->saved = fs->victim->chunks[0];
        fs->victim->chunks[0] = NULL;
    }
    return 0;
}

/* A non-resident chunk of the third sequence is faulted in before the step, which then
 * equals the lone evaluation (within f32 rounding where the packed kernel takes it); a fault that drops another sequence's chunk fails the step. */
static void test_fault_in_batch(void)
{
    const char *path = gen("qwen3", QTYPE_Q8_0, 2);
    CHECK(path);
    static const int hist[] = {20, 35, 40}, ones[] = {1, 1, 1};
    fixture f;
    CHECK(fixture_init(&f, path, false, 2, 64, 3, hist) == 0);
    fault_state fs = {.saved = f.b[2].chunks[1]};
    f.b[2].chunks[1] = NULL;
    f.b[2].fault = put_back, f.b[2].fault_arg = &fs;
    step_diff d;
    CHECK(step(&f, ones, false, false, &d) == 0);
    CHECK_EQ(fs.calls, 1);
    CHECK(decode_agrees(&d, takes_packed(&f, 3)));

    char err[ERR_MAX];
    int32_t tok[3] = {1, 2, 3}, pos[3] = {100, 100, 100};
    model_batch b[3];
    kv_seq *seqs[3];
    for (int i = 0; i < 3; i++) {
        b[i] = (model_batch){.n_tokens = 1, .tokens = tok + i, .positions = pos + i};
        seqs[i] = &f.b[i];
    }
    fs.saved = f.b[2].chunks[0];
    f.b[2].chunks[0] = NULL;
    fs.victim = &f.b[0];
    CHECK(model_forward_batch(f.r, 3, seqs, b, err) < 0);
    CHECK_MSG(strstr(err, "dropped"), "%s", err);
    CHECK_EQ(kv_seq_n_tokens(&f.b[1]), hist[1] + 1);
    f.b[0].chunks[0] = fs.saved;
    fixture_free(&f);
}

/* A forward whose abort flag is set stops with MODEL_ABORTED and leaves every sequence
 * (entries, chunks) as it was, a split single batch too; with the flag clear, a runner
 * that has one computes what one without it does, bit for bit. */
static void test_abort(void)
{
    const char *path = gen("llama", QTYPE_F32, 2);
    CHECK(path);
    fixture f;
    int hist[2] = {20, 33};
    CHECK(fixture_init(&f, path, false, 1, 16, 2, hist) == 0);
    char err[ERR_MAX];
    _Atomic bool abort = true;
    int32_t tok[40], pos[2][40];
    for (int t = 0; t < 40; t++) {
        tok[t] = tok_of(&f, 0, t + 100);
        pos[0][t] = f.base[0] + hist[0] + t;
        pos[1][t] = f.base[1] + hist[1] + t;
    }
    int out[2] = {0, 4};
    float *la = malloc(sizeof(float) * 2 * (size_t)f.nv), *lb = malloc(sizeof(float) * 2 * (size_t)f.nv);
    CHECK(la && lb);
    model_batch ba[2], bb[2];
    kv_seq *seqs[2] = {&f.b[0], &f.b[1]};
    for (int i = 0; i < 2; i++) {
        ba[i] = (model_batch){.n_tokens = i ? 5 : 1, .tokens = tok, .positions = pos[i],
                              .n_out = 1, .out_rows = &out[i], .logits = la + (size_t)i * f.nv};
        bb[i] = ba[i];
        bb[i].logits = lb + (size_t)i * f.nv;
    }
    size_t used = kv_pool_n_used(f.pool);
    model_runner_set_abort(f.r, &abort);
    CHECK_EQ(model_forward_batch(f.r, 2, seqs, bb, err), MODEL_ABORTED);
    for (int i = 0; i < 2; i++)
        CHECK_EQ(kv_seq_n_tokens(&f.b[i]), hist[i]);
    model_batch split = {.n_tokens = 40, .tokens = tok, .positions = pos[1]};
    CHECK_EQ(model_forward(f.r, &f.b[1], &split, err), MODEL_ABORTED);
    CHECK_EQ(kv_seq_n_tokens(&f.b[1]), hist[1]);
    CHECK_EQ(kv_pool_n_used(f.pool), used);

    abort = false;
    CHECK(model_forward_batch(f.r, 2, seqs, bb, err) == 0);
    model_runner_set_abort(f.r, NULL);
    for (int i = 0; i < 2; i++)
        CHECK(model_forward(f.r, &f.a[i], &ba[i], err) == 0);
    CHECK(memcmp(la, lb, sizeof(float) * 2 * (size_t)f.nv) == 0);
    for (int i = 0; i < 2; i++)
        CHECK(kv_diff(&f, i) == 0);
    free(la);
    free(lb);
    fixture_free(&f);
}

/* Appends n tokens (from token index `from` of sequence i's stream) to both copies of
 * sequence i without a pause: a request's forward, between the stops of another. */
static int advance_both(fixture *f, int i, int from, int n)
{
    char err[ERR_MAX];
    int32_t tok[16], pos[16];
    int n0 = kv_seq_n_tokens(&f->a[i]);
    for (int t = 0; t < n; t++)
        tok[t] = tok_of(f, i, from + t), pos[t] = f->base[i] + n0 + t;
    model_batch b = {.n_tokens = n, .tokens = tok, .positions = pos};
    return model_forward(f->r, &f->a[i], &b, err) < 0 || model_forward(f->r, &f->b[i], &b, err) < 0
               ? -1
               : 0;
}

/* Fills the unused rows of seq's last chunk (f16) with other values: what a stopped
 * forward wrote there is gone, as when its chunk went back to the pool and came back as
 * another sequence's. */
static void scribble_unused_rows(const kv_seq *seq)
{
    kv_shape shape = kv_pool_shape(seq->pool);
    const kv_chunk *c = seq->chunks[seq->n_chunks - 1];
    size_t hd = (size_t)shape.head_dim;
    for (int l = 0; l < shape.n_layer; l++)
        for (int h = 0; h < shape.n_head_kv; h++)
            for (size_t i = (size_t)c->n_tokens * hd; i < KV_CHUNK_TOKENS * hd; i++) {
                kv_chunk_k_f16(c, shape, l, h)[i] = 0x3c00; /* 1.0 */
                kv_chunk_v_f16(c, shape, l, h)[i] = 0xbc00; /* -1.0 */
            }
}

/*
 * A forward stopped at the abort flag and kept by the runner's pause goes on from the
 * layer it reached: stopped after every layer in turn, with other sequences' forwards
 * through the runner between the stops, it gives the logits and K/V of one forward that
 * never stopped, bit for bit. Another batch, or the same one on a sequence changed
 * meanwhile, starts over (and still gives the right answer); what a pause cannot keep
 * stops as before, with nothing kept.
 */
static void pause_on(const modelgen_params *mp)
{
    char path[512], err[ERR_MAX];
    snprintf(path, sizeof path, "%s/%s-pause.gguf", test_tmpdir(), mp->arch);
    CHECK_MSG(modelgen_write(mp, path, err) == 0, "%s", err);
    fixture f;
    int hist[2] = {20, 40}; /* the 12 rows fill sequence 1's last chunk and start another */
    CHECK(fixture_init(&f, path, false, 1, 16, 2, hist) == 0);
    const int n_layer = f.n_layer;
    model_pause *p = model_pause_new(f.r, 12, err);
    CHECK_MSG(p, "%s", err);
    _Atomic bool raised = true;
    int32_t tok[12], pos[12], out;
    float *la = malloc(sizeof(float) * (size_t)f.nv), *lb = malloc(sizeof(float) * (size_t)f.nv);
    CHECK(la && lb);
    int next = 100; /* token index of the next batch */
    model_batch ba, bb;
#define NEXT_BATCH(n_tok)                                                                   \
    do {                                                                                    \
        int n0_ = kv_seq_n_tokens(&f.a[1]);                                                 \
        for (int t = 0; t < (n_tok); t++)                                                   \
            tok[t] = tok_of(&f, 1, next + t), pos[t] = f.base[1] + n0_ + t;                 \
        next += (n_tok);                                                                    \
        out = (n_tok) - 1;                                                                  \
        ba = (model_batch){.n_tokens = (n_tok), .tokens = tok, .positions = pos, .n_out = 1, \
                           .out_rows = &out, .logits = la};                                 \
        bb = ba;                                                                            \
        bb.logits = lb;                                                                     \
    } while (0)

    /* stopped after each layer in turn, a request's forward between the stops */
    NEXT_BATCH(12);
    CHECK(model_forward(f.r, &f.a[1], &ba, err) == 0);
    for (int k = 1; k < n_layer; k++) {
        CHECK(model_runner_set_pause(f.r, p, err) == 0);
        model_runner_set_abort(f.r, &raised);
        CHECK_EQ(model_forward(f.r, &f.b[1], &bb, err), MODEL_ABORTED);
        CHECK_EQ(model_pause_layers(p), k);
        CHECK_EQ(kv_seq_n_tokens(&f.b[1]), hist[1]);
        scribble_unused_rows(&f.b[1]);
        model_runner_set_abort(f.r, NULL);
        CHECK(model_runner_set_pause(f.r, NULL, err) == 0);
        CHECK(advance_both(&f, 0, 200 + k, 3) == 0);
        CHECK_EQ(model_pause_layers(p), k);
    }
    CHECK(model_runner_set_pause(f.r, p, err) == 0);
    model_runner_set_abort(f.r, &raised);
    CHECK(model_forward(f.r, &f.b[1], &bb, err) == 0); /* its last layer, flag still raised */
    CHECK_EQ(model_pause_layers(p), 0);
    CHECK(memcmp(la, lb, sizeof(float) * (size_t)f.nv) == 0);
    CHECK(kv_diff(&f, 1) == 0);
    CHECK(kv_diff(&f, 0) == 0);

    /* another batch after a stop starts over */
    NEXT_BATCH(12);
    CHECK_EQ(model_forward(f.r, &f.b[1], &bb, err), MODEL_ABORTED);
    CHECK_EQ(model_pause_layers(p), 1);
    NEXT_BATCH(7);
    raised = false;
    CHECK_MSG(model_forward(f.r, &f.b[1], &bb, err) == 0, "%s", err);
    CHECK(model_forward(f.r, &f.a[1], &ba, err) == 0);
    CHECK(memcmp(la, lb, sizeof(float) * (size_t)f.nv) == 0);
    CHECK(kv_diff(&f, 1) == 0);

    /* the same batch on a sequence changed since the stop starts over */
    NEXT_BATCH(12);
    raised = true;
    CHECK_EQ(model_forward(f.r, &f.b[1], &bb, err), MODEL_ABORTED);
    CHECK_EQ(model_pause_layers(p), 1);
    kv_seq_truncate(&f.a[1], kv_seq_n_tokens(&f.a[1]) - 1);
    kv_seq_truncate(&f.b[1], kv_seq_n_tokens(&f.b[1]) - 1);
    for (int t = 0; t < 12; t++)
        pos[t]--;
    raised = false;
    CHECK(model_forward(f.r, &f.b[1], &bb, err) == 0);
    model_runner_set_pause(f.r, NULL, err);
    CHECK(model_forward(f.r, &f.a[1], &ba, err) == 0);
    CHECK(memcmp(la, lb, sizeof(float) * (size_t)f.nv) == 0);
    CHECK(kv_diff(&f, 1) == 0);

    /* what the pause cannot keep stops before its first layer, nothing kept: more rows
     * than it has room for, attention statistics, two sequences; a stop it could keep is
     * dropped by a forward it cannot */
    CHECK(model_runner_set_pause(f.r, p, err) == 0);
    raised = true;
    int n0 = kv_seq_n_tokens(&f.b[1]);
    NEXT_BATCH(12);
    CHECK_EQ(model_forward(f.r, &f.b[1], &bb, err), MODEL_ABORTED);
    CHECK_EQ(model_pause_layers(p), 1);
    float received[64] = {0};
    model_batch stats = {.n_tokens = 4, .tokens = tok, .positions = pos,
                         .attn_received = received};
    CHECK_EQ(model_forward(f.r, &f.b[1], &stats, err), MODEL_ABORTED);
    CHECK_EQ(model_pause_layers(p), 0);
    for (int i = 0; i < 64; i++)
        CHECK(received[i] == 0);
    model_batch big = {.n_tokens = 13, .tokens = tok, .positions = pos};
    int32_t big_tok[13] = {0}, big_pos[13];
    for (int t = 0; t < 13; t++)
        big_pos[t] = pos[0] + t;
    big.tokens = big_tok, big.positions = big_pos;
    CHECK_EQ(model_forward(f.r, &f.b[1], &big, err), MODEL_ABORTED);
    CHECK_EQ(model_pause_layers(p), 0);
    CHECK_EQ(kv_seq_n_tokens(&f.b[1]), n0);

    /* a pause is its runner's; its size is checked */
    model_runner *other = model_runner_new(f.m, 1, 16, 256, err);
    CHECK_MSG(other, "%s", err);
    CHECK(model_runner_set_pause(other, p, err) < 0);
    CHECK(model_pause_new(f.r, 0, err) == NULL);
    CHECK(model_pause_new(f.r, 17, err) == NULL);
    model_runner_free(other);
#undef NEXT_BATCH
    model_runner_set_abort(f.r, NULL);
    model_runner_set_pause(f.r, NULL, err);
    model_pause_free(p);
    free(la);
    free(lb);
    fixture_free(&f);
}

/* qwen3; deepseek2, whose entries are one latent vector (K alone, read as V too) and
 * whose layers after the first route through experts. */
static void test_pause(void)
{
    modelgen_params qwen3 = {.arch = "qwen3", .dim = 128, .n_layer = 5, .n_head = 4,
                             .n_head_kv = 2, .n_ff = 256, .n_ctx = 256, .type = QTYPE_Q8_0,
                             .seed = 5, .n_vocab = 300, .n_threads = 1};
    pause_on(&qwen3);
    modelgen_params deepseek2 = {
        .arch = "deepseek2", .dim = 128, .n_layer = 4, .n_head = 4, .n_head_kv = 1,
        .n_ff = 256, .n_ctx = 256, .type = QTYPE_F32, .seed = 31, .n_vocab = 300,
        .n_threads = 1, .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 64,
        .n_expert_shared = 1, .n_dense_lead = 1, .q_lora_rank = 64, .kv_lora_rank = 64,
        .qk_nope_dim = 32, .qk_rope_dim = 16, .v_head_dim = 32, .expert_gating = 2,
        .expert_weights_norm = true, .expert_weights_scale = 2.5f, .n_expert_groups = 4,
        .n_expert_groups_used = 2, .exp_probs_b = true};
    pause_on(&deepseek2);
}

int main(void)
{
    RUN(test_decode_identical);
    RUN(test_mixed_decode_prefill);
    RUN(test_many_sequences);
    RUN(test_decode_packed);
    RUN(test_decode_repacked);
    RUN(test_repack_load_modes);
    RUN(test_trained_models);
    RUN(test_errors);
    RUN(test_reserve_rollback);
    RUN(test_fault_in_batch);
    RUN(test_abort);
    RUN(test_pause);
    return test_finish();
}
