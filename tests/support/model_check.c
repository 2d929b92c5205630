/*
 * model_check.c — a model file's forward pass against the reference (model_check.h).
 */
#include "tests/support/model_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/quant/quant.h"
#include "tests/support/test.h"

/* Runs the batch with logits for every row; max |diff| against ref rows (n, n_vocab). */
static double run_and_compare(model_runner *r, kv_seq *seq, int n, const int32_t *tok,
                              const int32_t *pos, const double *ref, int n_vocab)
{
    int32_t rows[64];
    for (int i = 0; i < n; i++)
        rows[i] = i;
    float *logits = malloc((size_t)n * n_vocab * sizeof(float));
    model_batch b = {.n_tokens = n, .tokens = tok, .positions = pos, .n_out = n,
                     .out_rows = rows, .logits = logits};
    char err[ERR_MAX];
    double maxd = 1e9;
    if (model_forward(r, seq, &b, err) == 0) {
        maxd = 0;
        for (size_t i = 0; i < (size_t)n * n_vocab; i++) {
            double d = fabs(logits[i] - ref[i]);
            if (!(d <= maxd))
                maxd = isnan(d) ? 1e9 : d;
        }
    } else {
        fprintf(stderr, "forward: %s\n", err);
    }
    free(logits);
    return maxd;
}

double model_check_file(const char *path, int max_batch, int n_threads,
                        const model_check_plan *plan)
{
    char err[ERR_MAX];
    gguf_file *g = gguf_open(path, err);
    model *m = g ? model_from_gguf(g, err) : NULL;
    ref_model *rm = g ? ref_model_load(g) : NULL;
    if (!m || !rm) {
        fprintf(stderr, "load: %s\n", err);
        model_free(m);
        ref_model_free(rm);
        gguf_close(g);
        return 1e9;
    }
    int nv = model_hparams_of(m)->n_vocab, P = plan->n_prefill, N = plan->n_total;
    model_runner *r = model_runner_new(m, n_threads, max_batch, 0, err);
    kv_pool *pool = kv_pool_new(model_kv_shape(m), 0, err);
    kv_seq seq;
    kv_seq_init(&seq, pool);
    int32_t tok[64], pos[64];
    for (int i = 0; i < N; i++) {
        tok[i] = (int32_t)((i * 37 + 11) % nv);
        pos[i] = i;
    }
    double *ref = malloc((size_t)N * nv * sizeof(double));
    ref_forward(rm, N, tok, pos, ref, NULL, NULL);
    double worst = run_and_compare(r, &seq, P, tok, pos, ref, nv);
    for (int i = P; i < N; i++) {
        double d = run_and_compare(r, &seq, 1, tok + i, pos + i, ref + (size_t)i * nv, nv);
        worst = d > worst ? d : worst;
    }
    kv_seq_free(&seq);

    /* A: positions 0..7; B: gap_b.. (sees A); C: gap_c.. (sees A only, added after B) */
    kv_seq_init(&seq, pool);
    int32_t at[20], ap[20];
    for (int i = 0; i < 8; i++)
        at[i] = tok[i], ap[i] = i;
    for (int i = 0; i < 8; i++)
        at[8 + i] = tok[8 + i], ap[8 + i] = plan->gap_b + i;
    for (int i = 0; i < 4; i++)
        at[16 + i] = tok[16 + i], ap[16 + i] = plan->gap_c + i;
    ref_forward(rm, 16, at, ap, ref, NULL, NULL); /* A + B */
    double d = run_and_compare(r, &seq, 8, at, ap, ref, nv);
    worst = d > worst ? d : worst;
    d = run_and_compare(r, &seq, 8, at + 8, ap + 8, ref + (size_t)8 * nv, nv);
    worst = d > worst ? d : worst;
    int32_t ct[12], cp[12];
    memcpy(ct, at, 8 * sizeof *ct), memcpy(cp, ap, 8 * sizeof *cp);
    memcpy(ct + 8, at + 16, 4 * sizeof *ct), memcpy(cp + 8, ap + 16, 4 * sizeof *cp);
    ref_forward(rm, 12, ct, cp, ref, NULL, NULL); /* A + C */
    d = run_and_compare(r, &seq, 4, ct + 8, cp + 8, ref + (size_t)8 * nv, nv);
    worst = d > worst ? d : worst;
    if (kv_seq_n_tokens(&seq) != 20)
        worst = 1e9;

    kv_seq_free(&seq);
    kv_pool_free(pool);
    free(ref);
    model_runner_free(r);
    model_free(m);
    ref_model_free(rm);
    gguf_close(g);
    return worst;
}

double model_check_compressed(model *m, const ref_model *rm, enum kv_precision prec)
{
    enum { P = 40, N = 64 };
    char err[ERR_MAX];
    int nv = model_hparams_of(m)->n_vocab;
    int32_t tok[N], pos[N], rows[N];
    for (int i = 0; i < N; i++)
        tok[i] = (int32_t)((i * 29 + 5) % nv), pos[i] = i, rows[i] = i;
    double *ref = malloc((size_t)N * nv * sizeof(double));
    float *logits = malloc((size_t)N * nv * sizeof(float));
    ref_forward(rm, N, tok, pos, ref, NULL, NULL);
    model_runner *r = model_runner_new(m, 2, 0, 0, err);
    kv_pool *pool = kv_pool_new(model_kv_shape(m), 0, err);
    kv_seq s;
    kv_seq_init(&s, pool);
    double worst = 1e9;
    model_batch b = {.n_tokens = P, .tokens = tok, .positions = pos};
    if (model_forward(r, &s, &b, err) < 0)
        goto out;
    for (int c = 0; c < s.n_chunks; c++)
        if (kv_chunk_convert(pool, s.chunks[c], prec, err) < 0)
            goto out;
    worst = 0;
    for (int t = P; t < N; t += t < P + 4 ? 1 : 20) {
        int n = t < P + 4 ? 1 : 20;
        model_batch d = {.n_tokens = n, .tokens = tok + t, .positions = pos + t, .n_out = n,
                         .out_rows = rows, .logits = logits};
        if (model_forward(r, &s, &d, err) < 0) {
            worst = 1e9;
            goto out;
        }
        for (size_t i = 0; i < (size_t)n * nv; i++) {
            double e = fabs(logits[i] - ref[(size_t)t * nv + i]);
            worst = e > worst || isnan(e) ? e : worst;
        }
    }
    /* the compressed chunks stay compressed; the partial one took the new entries in f16 */
    if (s.chunks[0]->precision != prec || s.chunks[2]->precision != KV_F16 ||
        kv_seq_n_tokens(&s) != N)
        worst = 1e9;
out:
    if (worst >= 1e9)
        fprintf(stderr, "compressed forward: %s\n", err);
    kv_seq_free(&s);
    kv_pool_free(pool);
    model_runner_free(r);
    free(ref);
    free(logits);
    return worst;
}

double model_check_max_rel(const float *a, const float *b, size_t n)
{
    double d = 0, scale = 1;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        d = isnan(e) ? 1e9 : e > d ? e : d;
        scale = fabs(a[i]) > scale ? fabs(a[i]) : scale;
    }
    return d / scale;
}

double model_check_partitioned(const model *m, model_runner *whole, model_runner *part,
                               enum kv_precision hist_p)
{
    enum { N_HIST = MODEL_CHECK_HIST, N_PROMPT = MODEL_CHECK_PROMPT, N_OUT = 4 };
    char err[ERR_MAX];
    int n = N_HIST + N_PROMPT, dim = model_hparams_of(m)->dim;
    int n_vocab = model_hparams_of(m)->n_vocab;
    int32_t tok[N_HIST + N_PROMPT], pos[N_HIST + N_PROMPT], outs[] = {0, 37, 90, N_PROMPT - 1};
    for (int i = 0; i < n; i++)
        tok[i] = (int32_t)(((i * 5 + 2) * 37 + 11) % n_vocab), pos[i] = i;
    float *lw = malloc(sizeof(float) * N_OUT * n_vocab * 2), *lp = lw + N_OUT * n_vocab;
    float *hw = malloc(sizeof(float) * N_OUT * dim * 2), *hpart = hw + N_OUT * dim;
    kv_pool *pool = kv_pool_new(model_kv_shape(m), 0, err);
    kv_seq a, b;
    kv_seq_init(&a, pool);
    kv_seq_init(&b, pool);
    double d = 1e9;
    model_batch hist = {.n_tokens = N_HIST, .tokens = tok, .positions = pos};
    bool ok = model_forward(whole, &a, &hist, err) == 0 && model_forward(whole, &b, &hist, err) == 0;
    for (int i = 0; ok && hist_p != KV_F16 && i < a.n_chunks; i++)
        if (a.chunks[i]->n_tokens == KV_CHUNK_TOKENS)
            ok = kv_chunk_convert(pool, a.chunks[i], hist_p, err) == 0 &&
                 kv_chunk_convert(pool, b.chunks[i], hist_p, err) == 0;
    model_batch bw = {.n_tokens = N_PROMPT, .tokens = tok + N_HIST, .positions = pos + N_HIST,
                      .n_out = N_OUT, .out_rows = outs, .logits = lw, .hidden_last = hw};
    model_batch bp = bw;
    bp.logits = lp, bp.hidden_last = hpart;
    ok = ok && model_forward(whole, &a, &bw, err) == 0 && model_forward(part, &b, &bp, err) == 0;
    if (ok)
        d = fmax(model_check_max_rel(lw, lp, (size_t)N_OUT * n_vocab),
                 model_check_max_rel(hw, hpart, (size_t)N_OUT * dim));
    else
        fprintf(stderr, "forward: %s\n", err);
    kv_seq_free(&a);
    kv_seq_free(&b);
    kv_pool_free(pool);
    free(lw), free(hw);
    return d;
}

int model_check_run(model_runner *r, kv_pool *pool, int n_vocab, int n, const int32_t *tok,
                    const int32_t *pos, bool one_by_one, float *out)
{
    char err[ERR_MAX];
    kv_seq s;
    kv_seq_init(&s, pool);
    int32_t rows[64];
    for (int i = 0; i < n; i++)
        rows[i] = i;
    int rc = 0;
    for (int t = 0; t < n && rc == 0; t += one_by_one ? 1 : n) {
        int k = one_by_one ? 1 : n;
        model_batch b = {.n_tokens = k, .tokens = tok + t, .positions = pos + t, .n_out = k,
                         .out_rows = rows, .logits = out + (size_t)t * n_vocab};
        rc = model_forward(r, &s, &b, err);
    }
    if (rc < 0)
        fprintf(stderr, "forward: %s\n", err);
    kv_seq_free(&s);
    return rc;
}

int model_check_greedy(const char *path, const int32_t *prompt, int n, int32_t *out, float *lp,
                       int32_t *second, int n_out)
{
    char err[ERR_MAX];
    if (n < 1 || n + n_out > MODEL_CHECK_GREEDY_MAX)
        return -1;
    model *m = model_load(path, err);
    if (!m) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    int nv = model_hparams_of(m)->n_vocab, rc = -1;
    /* as the daemon loads it: its Q8_0 matrices repacked where the CPU has the kernels
     * (their products are the scalar kernel's bits; the others' differ in the order of
     * f32 additions, which flips the roundings of some 8-bit activations downstream) */
    if (model_repack_weights(m, err) < 0) {
        fprintf(stderr, "%s\n", err);
        model_free(m);
        return -1;
    }
    model_runner *r = model_runner_new(m, 1, 0, 256, err);
    kv_pool *pool = r ? kv_pool_new(model_kv_shape(m), 0, err) : NULL;
    float *logits = malloc((size_t)nv * sizeof(float));
    int32_t pos[MODEL_CHECK_GREEDY_MAX], last;
    kv_seq s;
    if (!pool || !logits)
        goto out;
    kv_seq_init(&s, pool);
    for (int i = 0; i < n; i++)
        pos[i] = i;
    last = n - 1;
    model_batch b = {.n_tokens = n, .tokens = prompt, .positions = pos, .n_out = 1,
                     .out_rows = &last, .logits = logits};
    rc = model_forward(r, &s, &b, err);
    for (int k = 0; k < n_out && rc == 0; k++) {
        int32_t best = 0, p = n + k, row = 0, sec = -1;
        for (int v = 1; v < nv; v++)
            best = logits[v] > logits[best] ? v : best;
        double z = 0;
        for (int v = 0; v < nv; v++) {
            z += exp((double)logits[v] - logits[best]);
            if (v != best && (sec < 0 || logits[v] > logits[sec]))
                sec = v;
        }
        out[k] = best;
        lp[k] = (float)-log(z);
        second[k] = sec;
        model_batch one = {.n_tokens = 1, .tokens = &best, .positions = &p, .n_out = 1,
                           .out_rows = &row, .logits = logits};
        if (k + 1 < n_out)
            rc = model_forward(r, &s, &one, err);
    }
    if (rc < 0)
        fprintf(stderr, "forward: %s\n", err);
    kv_seq_free(&s);
out:
    free(logits);
    kv_pool_free(pool);
    model_runner_free(r);
    model_free(m);
    return rc;
}

/* Token i of the engine-path checks. */
static int32_t model_check_token(int i, int n_vocab)
{
    return (int32_t)((i * 37 + 11) % n_vocab);
}

double model_check_prefill_vs_decode(const char *path)
{
    enum { N = 48 };
    char err[ERR_MAX];
    double d = 1e9;
    model *m = model_load(path, err);
    model_runner *r = m ? model_runner_new(m, 2, 0, 0, err) : NULL;
    kv_pool *pool = r ? kv_pool_new(model_kv_shape(m), 0, err) : NULL;
    int n_vocab = m ? model_hparams_of(m)->n_vocab : 0;
    float *a = malloc(sizeof(float) * N * (size_t)n_vocab);
    float *b = malloc(sizeof(float) * N * (size_t)n_vocab);
    int32_t tok[N], pos[N];
    for (int i = 0; i < N; i++)
        tok[i] = model_check_token(i * 3 + 1, n_vocab > 0 ? n_vocab : 1), pos[i] = i;
    if (!pool || !a || !b)
        fprintf(stderr, "prefill vs decode: %s\n", m ? err : "cannot load the model");
    else if (model_check_run(r, pool, n_vocab, N, tok, pos, false, a) == 0 &&
             model_check_run(r, pool, n_vocab, N, tok, pos, true, b) == 0)
        d = model_check_max_rel(a, b, (size_t)N * (size_t)n_vocab);
    free(a), free(b);
    kv_pool_free(pool);
    model_runner_free(r);
    model_free(m);
    return d;
}

int model_check_batched_vs_alone(const char *path, double *diff)
{
    enum { N_SEQ = 3, N_ROWS = 7, N_TOK = 64 };
    const int hist[N_SEQ] = {30, 45, 12}, step[N_SEQ] = {1, 1, 5};
    char err[ERR_MAX];
    int rc = -1;
    *diff = 1e9;
    model *m = model_load(path, err);
    model_runner *r = m ? model_runner_new(m, 2, N_TOK, 128, err) : NULL;
    kv_pool *pool = r ? kv_pool_new(model_kv_shape(m), 0, err) : NULL;
    size_t n_vocab = m ? (size_t)model_hparams_of(m)->n_vocab : 0;
    float *alone = malloc(sizeof(float) * N_ROWS * n_vocab);
    float *stacked = malloc(sizeof(float) * N_ROWS * n_vocab);
    kv_seq seq[2][N_SEQ];
    int n_seq = 0;
    if (!pool || !alone || !stacked) {
        fprintf(stderr, "batched vs alone: %s\n", m ? err : "cannot load the model");
        goto out;
    }
    int32_t tok[N_SEQ][N_TOK], pos[N_SEQ][N_TOK], rows[5] = {0, 1, 2, 3, 4};
    for (int s = 0; s < N_SEQ; s++)
        for (int i = 0; i < N_TOK; i++)
            tok[s][i] = model_check_token(i * (s + 2) + s, (int)n_vocab), pos[s][i] = i;
    for (; n_seq < N_SEQ; n_seq++)
        for (int v = 0; v < 2; v++)
            kv_seq_init(&seq[v][n_seq], pool);
    for (int s = 0; s < N_SEQ; s++)
        for (int v = 0; v < 2; v++) {
            model_batch h = {.n_tokens = hist[s], .tokens = tok[s], .positions = pos[s]};
            if (model_forward(r, &seq[v][s], &h, err) < 0)
                goto engine_error;
        }
    model_batch bs[N_SEQ];
    for (int s = 0, off = 0; s < N_SEQ; off += step[s], s++) {
        bs[s] = (model_batch){.n_tokens = step[s], .tokens = tok[s] + hist[s],
                              .positions = pos[s] + hist[s], .n_out = step[s],
                              .out_rows = rows, .logits = alone + (size_t)off * n_vocab};
        if (model_forward(r, &seq[0][s], &bs[s], err) < 0)
            goto engine_error;
        bs[s].logits = stacked + (size_t)off * n_vocab;
    }
    kv_seq *ptrs[N_SEQ] = {&seq[1][0], &seq[1][1], &seq[1][2]};
    if (model_forward_batch(r, N_SEQ, ptrs, bs, err) < 0)
        goto engine_error;
    *diff = model_check_max_rel(alone, stacked, N_ROWS * n_vocab);
    rc = memcmp(alone, stacked, sizeof(float) * N_ROWS * n_vocab) == 0;
    goto out;
engine_error:
    fprintf(stderr, "batched vs alone: %s\n", err);
out:
    for (int s = 0; s < n_seq; s++)
        for (int v = 0; v < 2; v++)
            kv_seq_free(&seq[v][s]);
    free(alone), free(stacked);
    kv_pool_free(pool);
    model_runner_free(r);
    model_free(m);
    return rc;
}

double model_check_partitioned_shapes(const char *path, const enum kv_precision *hist,
                                      int n_hist)
{
    static const struct {
        int rows, attn_rows;
    } shapes[] = {{MODEL_CHECK_PROMPT, 4}, {MODEL_CHECK_PROMPT, 1}, {24, 4}, {33, 32}, {10, 10}};
    const int max_kv = MODEL_CHECK_HIST + MODEL_CHECK_PROMPT;
    char err[ERR_MAX];
    double worst = 0;
    model *m = model_load(path, err);
    model_runner_opts wo = {.n_threads = 2, .max_batch = MODEL_CHECK_PROMPT, .max_kv = max_kv,
                            .attn_rows = MODEL_CHECK_PROMPT};
    model_runner *whole = m ? model_runner_new_opts(m, &wo, err) : NULL;
    if (!whole) {
        fprintf(stderr, "partitioned: %s\n", err);
        worst = 1e9;
    }
    for (size_t k = 0; whole && k < sizeof shapes / sizeof *shapes; k++) {
        model_runner_opts po = {.n_threads = 2, .max_batch = shapes[k].rows, .max_kv = max_kv,
                                .attn_rows = shapes[k].attn_rows};
        model_runner *part = model_runner_new_opts(m, &po, err);
        if (!part) {
            fprintf(stderr, "partitioned: %s\n", err);
            worst = 1e9;
            break;
        }
        for (int h = 0; h < n_hist; h++)
            worst = fmax(worst, model_check_partitioned(m, whole, part, hist[h]));
        model_runner_free(part);
    }
    model_runner_free(whole);
    model_free(m);
    return worst;
}

double model_check_part_matters(const char *path, const gguf_edit *e, bool sequential)
{
    enum { N = 40 };
    char err[ERR_MAX], dst[1100];
    snprintf(dst, sizeof dst, "%s.mutated.gguf", path);
    if (gguf_copy_edited(path, dst, e, err) < 0) {
        fprintf(stderr, "part matters: %s\n", err);
        return -1;
    }
    gguf_file *gp = gguf_open(path, err), *gq = gguf_open(dst, err);
    ref_model *rp = gp ? ref_model_load(gp) : NULL, *rq = gq ? ref_model_load(gq) : NULL;
    int n_vocab = rp ? ref_model_n_vocab(rp) : 0;
    double *with = malloc(sizeof(double) * N * (size_t)n_vocab);
    double *without = malloc(sizeof(double) * N * (size_t)n_vocab);
    double d = -1;
    if (rp && rq && with && without && ref_model_n_vocab(rq) == n_vocab) {
        int32_t tok[N], pos[N];
        for (int i = 0; i < N; i++)
            tok[i] = model_check_token(i, n_vocab), pos[i] = i;
        ref_model_sequential(rq, sequential);
        ref_forward(rp, N, tok, pos, with, NULL, NULL);
        ref_forward(rq, N, tok, pos, without, NULL, NULL);
        d = 0;
        for (size_t i = 0; i < (size_t)N * (size_t)n_vocab; i++)
            d = fmax(d, fabs(with[i] - without[i]));
    } else {
        fprintf(stderr, "part matters: the reference cannot read %s or %s\n", path, dst);
    }
    free(with), free(without);
    ref_model_free(rp), ref_model_free(rq);
    gguf_close(gp), gguf_close(gq);
    return d;
}

int model_check_type(modelgen_params p, uint32_t type, const char *name,
                     const model_check_plan *plan, double tol)
{
    char path[1024], err[ERR_MAX];
    snprintf(path, sizeof path, "%s/%s.gguf", test_tmpdir(), name);
    p.type = type;
    if (modelgen_write(&p, path, err) < 0) {
        fprintf(stderr, "modelgen: %s\n", err);
        return 1;
    }
    double d1 = model_check_file(path, 512, 2, plan), d2 = model_check_file(path, 8, 1, plan);
    printf("  %s: max |logit diff| %.4g (sgemm) %.4g (per row), tolerance %g\n", name, d1, d2,
           tol);
    return !(d1 <= tol && d2 <= tol);
}

int model_check_types(modelgen_params p, const char *name, const model_check_plan *plan,
                      double tol_float, double tol_quant)
{
    static const uint32_t types[] = {QTYPE_F32, QTYPE_F16, QTYPE_Q8_0};
    int failed = 0;
    for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
        char file[256];
        snprintf(file, sizeof file, "%s-%s", name, quant_traits_of(types[t])->name);
        bool f16_rounds = types[t] == QTYPE_F16 && quant_f16_rounds_activation(p.dim);
        bool exact = types[t] == QTYPE_F32 || (types[t] == QTYPE_F16 && !f16_rounds);
        failed += model_check_type(p, types[t], file, plan, exact ? tol_float : tol_quant);
    }
    return failed;
}

int model_check_refused(const char *src, const char *name, const gguf_edit *e, const char *named,
                        const char *says)
{
    char dst[1024], err[ERR_MAX] = "";
    snprintf(dst, sizeof dst, "%s/%s-broken.gguf", test_tmpdir(), name);
    if (gguf_copy_edited(src, dst, e, err) < 0) {
        fprintf(stderr, "%s: %s\n", dst, err);
        return 1;
    }
    err[0] = '\0';
    model *m = model_load(dst, err);
    if (m) {
        model_free(m);
        fprintf(stderr, "  %s: loads, where %s should be refused\n", dst, named);
        return 1;
    }
    printf("  refused: %s\n", err);
    return !(strstr(err, named) && strstr(err, says));
}

int model_check_compressed_file(const char *path, const double tol[3])
{
    char err[ERR_MAX];
    model *m = model_load(path, err);
    if (!m) {
        fprintf(stderr, "%s: %s\n", path, err);
        return 3;
    }
    ref_model *rm = ref_model_load(model_gguf(m));
    static const enum kv_precision precs[3] = {KV_F16, KV_INT8, KV_INT4};
    double e[3];
    int failed = 0;
    for (int i = 0; i < 3; i++) {
        e[i] = rm ? model_check_compressed(m, rm, precs[i]) : 1e9;
        failed += !(e[i] <= tol[i]);
    }
    printf("  max |logit diff| vs exact KV: f16 %.4f int8 %.4f int4 %.4f\n", e[0], e[1], e[2]);
    ref_model_free(rm);
    model_free(m);
    return failed;
}
