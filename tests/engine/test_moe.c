/*
 * Mixtures of experts (qwen3moe, qwen2moe, llama with experts: Mixtral) against the
 * double-precision reference forward (tests/support/ref_forward, written from Hugging
 * Face's Qwen3MoE, Qwen2MoE and Mixtral modeling code), and against themselves: a
 * prefill equals the same tokens decoded one by one, sequences batched together (their
 * rows routed to different experts in one step) equal each alone bit for bit, and a
 * model of one expert equals the dense model of the same weights. Files that are wrong
 * are refused at load with the key or tensor named, as are LoRA adapters of the experts.
 *
 * Models are random (modelgen) on a synthetic 260-token vocabulary: no shared test data.
 * Tolerances (max abs logit difference, logits of unit scale) as tests/engine/test_model.c:
 * TOL_FLOAT for f32/f16 weights, TOL_QUANT for Q8_0 (8-bit activations). Q8_0's models use
 * every expert: its activations' rounding moves router logits by ~1e-2, which flips a
 * near-tied choice the double-precision reference makes the other way (measured: a logit
 * off by 1.2 with 2 of 8 experts), so the choice itself is checked on float weights.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf/gguf.h"
#include "engine/gguf/modelgen.h"
#include "engine/model/lora.h"
#include "engine/model/model.h"
#include "engine/quant/quant.h"
#include "tests/support/model_check.h"
#include "tests/support/ref_forward.h"
#include "tests/support/test.h"

#define TOL_FLOAT 0.02
#define TOL_QUANT 0.2

static const char *ARCHS[] = {"qwen3moe", "qwen2moe", "llama", "olmoe"};

static modelgen_params moe_params(const char *arch, uint32_t type)
{
    /* llama's and olmoe's experts are feed_forward_length wide; olmoe has no GQA */
    bool own_ff = !strcmp(arch, "llama") || !strcmp(arch, "olmoe");
    return (modelgen_params){.arch = arch, .dim = 256, .n_layer = 2, .n_head = 4,
                             .n_head_kv = strcmp(arch, "olmoe") ? 2 : 4,
                             .n_ff = own_ff ? 256 : 512, .n_ctx = 128,
                             .type = type, .seed = 7, .n_vocab = 260, .n_threads = 1,
                             .n_expert = 8, .n_expert_used = 2, .n_ff_exp = own_ff ? 0 : 256,
                             .n_ff_shexp = 384};
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

/* Logits of every row of one batch at pos against seq into out (n, n_vocab), n <= 128. */
static int forward_all(model_runner *r, kv_seq *seq, int n, const int32_t *tok,
                       const int32_t *pos, float *out)
{
    int32_t rows[128];
    for (int i = 0; i < n; i++)
        rows[i] = i;
    model_batch b = {.n_tokens = n, .tokens = tok, .positions = pos, .n_out = n,
                     .out_rows = rows, .logits = out};
    char err[ERR_MAX];
    if (model_forward(r, seq, &b, err) < 0) {
        fprintf(stderr, "forward: %s\n", err);
        return -1;
    }
    return 0;
}

static void test_tokens(int n, int nv, int salt, int32_t *tok, int32_t *pos)
{
    for (int i = 0; i < n; i++) {
        tok[i] = (int32_t)((i * 37 + 11 + salt * 101) % nv);
        pos[i] = i;
    }
}

/* A prefill of 20 and 4 decodes, then a fresh sequence's gapped, out-of-order batches,
 * against the reference: the max |logit diff|. */
static double check_model(const char *path, int max_batch, int n_threads)
{
    static const model_check_plan plan = {.n_prefill = 20, .n_total = 24, .gap_b = 20,
                                          .gap_c = 12};
    return model_check_file(path, max_batch, n_threads, &plan);
}

static void test_against_reference(void)
{
    static const uint32_t types[] = {QTYPE_F32, QTYPE_F16, QTYPE_Q8_0};
    for (size_t a = 0; a < sizeof ARCHS / sizeof *ARCHS; a++)
        for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
            modelgen_params p = moe_params(ARCHS[a], types[t]);
            if (types[t] == QTYPE_Q8_0)
                p.n_expert_used = p.n_expert;
            const char *path = gen(&p, "moe");
            CHECK(path);
            bool bf16_rounds = types[t] == QTYPE_F16 && quant_f16_rounds_activation(p.dim);
            double tol = types[t] == QTYPE_Q8_0 || bf16_rounds ? TOL_QUANT : TOL_FLOAT;
            /* max_batch 512: the prefill's experts of many rows take sgemm; 8: dot kernels */
            double d1 = check_model(path, 512, 2), d2 = check_model(path, 8, 1);
            printf("  %s %s, %d of %d experts: max |logit diff| %.4g (max batch 512) %.4g (8)\n",
                   ARCHS[a], quant_traits_of(types[t])->name, p.n_expert_used, p.n_expert, d1, d2);
            CHECK_MSG(d1 <= tol && d2 <= tol, "%s %s: %g %g > %g", ARCHS[a],
                      quant_traits_of(types[t])->name, d1, d2, tol);
        }
}

/* modelgen's router spreads tokens over the experts: in every layer the tokens' first
 * choices are at least half of the experts, and no expert is every token's first. */
static void test_routing_spreads(void)
{
    for (size_t a = 0; a < sizeof ARCHS / sizeof *ARCHS; a++) {
        modelgen_params p = moe_params(ARCHS[a], QTYPE_F32);
        const char *path = gen(&p, "spread");
        CHECK(path);
        char err[ERR_MAX];
        gguf_file *g = gguf_open(path, err);
        CHECK_MSG(g, "%s", err);
        ref_model *rm = ref_model_load(g);
        CHECK(rm);
        enum { N = 32 };
        int32_t tok[N], pos[N];
        test_tokens(N, p.n_vocab, 0, tok, pos);
        int k = p.n_expert_used;
        int *routes = malloc((size_t)p.n_layer * N * k * sizeof(int));
        double *logits = malloc((size_t)N * p.n_vocab * sizeof(double));
        ref_model_record_routes(rm, routes);
        ref_forward(rm, N, tok, pos, logits, NULL, NULL);
        for (int l = 0; l < p.n_layer; l++) {
            int count[64] = {0}, distinct = 0, most = 0;
            for (int t = 0; t < N; t++)
                count[routes[((size_t)l * N + t) * k]]++;
            for (int e = 0; e < p.n_expert; e++) {
                distinct += count[e] > 0;
                most = count[e] > most ? count[e] : most;
            }
            printf("  %s layer %d: %d of %d experts first for some token, at most %d of %d\n",
                   ARCHS[a], l, distinct, p.n_expert, most, N);
            CHECK_MSG(distinct >= p.n_expert / 2 && most < N, "%s layer %d: %d experts, %d",
                      ARCHS[a], l, distinct, most);
        }
        free(routes);
        free(logits);
        ref_model_free(rm);
        gguf_close(g);
    }
}

/* One forward of 24 tokens (experts over many rows) gives the logits of 24 forwards of
 * one token each. */
static void test_prefill_equals_decode(void)
{
    for (size_t a = 0; a < sizeof ARCHS / sizeof *ARCHS; a++) {
        modelgen_params p = moe_params(ARCHS[a], QTYPE_F32);
        const char *path = gen(&p, "prefill");
        CHECK(path);
        char err[ERR_MAX];
        model *m = model_load(path, err);
        CHECK_MSG(m, "%s", err);
        int nv = model_hparams_of(m)->n_vocab;
        model_runner *r = model_runner_new(m, 2, 64, 0, err);
        kv_pool *pool = kv_pool_new(model_kv_shape(m), 0, err);
        CHECK(r && pool);
        enum { N = 24 };
        int32_t tok[N], pos[N];
        test_tokens(N, nv, 1, tok, pos);
        float *pre = malloc((size_t)N * nv * sizeof(float));
        float *dec = malloc((size_t)N * nv * sizeof(float));
        kv_seq s1, s2;
        kv_seq_init(&s1, pool);
        kv_seq_init(&s2, pool);
        CHECK(forward_all(r, &s1, N, tok, pos, pre) == 0);
        for (int i = 0; i < N; i++)
            CHECK(forward_all(r, &s2, 1, tok + i, pos + i, dec + (size_t)i * nv) == 0);
        double worst = 0;
        for (size_t i = 0; i < (size_t)N * nv; i++)
            worst = fmax(worst, fabs(pre[i] - dec[i]));
        printf("  %s: prefill against decode: max |logit diff| %.3g\n", ARCHS[a], worst);
        CHECK_MSG(worst <= 1e-3, "%s: %g", ARCHS[a], worst);
        kv_seq_free(&s1);
        kv_seq_free(&s2);
        free(pre);
        free(dec);
        kv_pool_free(pool);
        model_runner_free(r);
        model_free(m);
    }
}

/* Four sequences' decode rows in one step, routed to different experts (the reference
 * says which), give each sequence's logits alone bit for bit. */
static void test_batched_equals_alone(void)
{
    enum { S = 4, P = 6 };
    for (size_t a = 0; a < sizeof ARCHS / sizeof *ARCHS; a++) {
        modelgen_params p = moe_params(ARCHS[a], QTYPE_F16);
        const char *path = gen(&p, "batch");
        CHECK(path);
        char err[ERR_MAX];
        gguf_file *g = gguf_open(path, err);
        CHECK_MSG(g, "%s", err);
        model *m = model_from_gguf(g, err);
        ref_model *rm = ref_model_load(g);
        CHECK_MSG(m && rm, "%s", err);
        int nv = model_hparams_of(m)->n_vocab, k = p.n_expert_used;
        model_runner *r = model_runner_new(m, 2, 64, 0, err);
        kv_pool *pool = kv_pool_new(model_kv_shape(m), 0, err);
        CHECK(r && pool);
        int32_t tok[S][P + 1], pos[S][P + 1];
        kv_seq alone[S], stacked[S];
        float *solo = malloc((size_t)S * nv * sizeof(float));
        float *both = malloc((size_t)S * nv * sizeof(float));
        float *pre = malloc((size_t)P * nv * sizeof(float));
        int routes[2 * (P + 1) * 8];
        int first[S];
        for (int i = 0; i < S; i++) {
            test_tokens(P + 1, nv, 3 + 5 * i, tok[i], pos[i]);
            kv_seq_init(&alone[i], pool);
            kv_seq_init(&stacked[i], pool);
            CHECK(forward_all(r, &alone[i], P, tok[i], pos[i], pre) == 0);
            CHECK(forward_all(r, &stacked[i], P, tok[i], pos[i], pre) == 0);
            CHECK(forward_all(r, &alone[i], 1, tok[i] + P, pos[i] + P, solo + (size_t)i * nv) == 0);
            double *lg = malloc((size_t)(P + 1) * nv * sizeof(double));
            ref_model_record_routes(rm, routes);
            ref_forward(rm, P + 1, tok[i], pos[i], lg, NULL, NULL);
            free(lg);
            first[i] = routes[P * k]; /* layer 0, the decode row's first choice */
        }
        int32_t rows[1] = {0};
        model_batch b[S];
        kv_seq *seqs[S];
        for (int i = 0; i < S; i++) {
            b[i] = (model_batch){.n_tokens = 1, .tokens = tok[i] + P, .positions = pos[i] + P,
                                 .n_out = 1, .out_rows = rows, .logits = both + (size_t)i * nv};
            seqs[i] = &stacked[i];
        }
        CHECK_MSG(model_forward_batch(r, S, seqs, b, err) == 0, "%s", err);
        int distinct = 0;
        for (int i = 0; i < S; i++) {
            bool seen = false;
            for (int j = 0; j < i; j++)
                seen |= first[j] == first[i];
            distinct += !seen;
        }
        printf("  %s: %d rows, %d different first experts in layer 0\n", ARCHS[a], S, distinct);
        CHECK_MSG(distinct >= 2, "%s: every row chose expert %d", ARCHS[a], first[0]);
        CHECK_MSG(memcmp(solo, both, (size_t)S * nv * sizeof(float)) == 0,
                  "%s: batched logits differ from alone", ARCHS[a]);
        for (int i = 0; i < S; i++) {
            kv_seq_free(&alone[i]);
            kv_seq_free(&stacked[i]);
        }
        free(solo);
        free(both);
        free(pre);
        kv_pool_free(pool);
        model_runner_free(r);
        model_free(m);
        ref_model_free(rm);
        gguf_close(g);
    }
}

/* What rewrite changes on its way from one file to another. */
typedef struct rewrite_edit {
    const char *key;        /* an integer key given the value u32, or NULL */
    uint32_t u32;
    const char *drop_keys[2]; /* keys left out, or NULL */
    const char *drop;       /* a tensor left out, or NULL */
    const char *shrink;     /* a 3-D tensor given one expert fewer, or NULL */
    const char *split;      /* "blk.N." whose merged experts go one tensor each, or NULL */
    bool to_dense;          /* qwen3moe of one expert as qwen3, its expert as the dense FFN */
    const char *nan;        /* an F32 tensor whose every value becomes NaN, or NULL */
} rewrite_edit;

/* The name a tensor has in the rewritten file, into buf; false: left out. */
static bool rewrite_name(const rewrite_edit *e, gguf_str name, char *buf, size_t cap)
{
    snprintf(buf, cap, "%.*s", (int)name.len, name.ptr);
    if (e->drop && !strcmp(buf, e->drop))
        return false;
    if (!e->to_dense)
        return true;
    if (strstr(buf, "ffn_gate_inp"))
        return false;
    char *x = strstr(buf, "_exps.weight");
    if (x)
        memmove(x, x + 5, strlen(x + 5) + 1);
    return true;
}

static int rewrite(const char *src, const char *dst, const rewrite_edit *e)
{
    char err[ERR_MAX];
    gguf_file *g = gguf_open(src, err);
    gguf_writer *w = gguf_writer_new();
    if (!g || !w)
        return -1;
    for (int64_t i = 0; i < gguf_n_kv(g); i++) {
        gguf_str k = gguf_key(g, i);
        char key[128];
        snprintf(key, sizeof key, "%.*s", (int)k.len, k.ptr);
        if ((e->drop_keys[0] && !strcmp(key, e->drop_keys[0])) ||
            (e->drop_keys[1] && !strcmp(key, e->drop_keys[1])))
            continue;
        int rc;
        if (e->key && !strcmp(key, e->key))
            rc = gguf_writer_set_u32(w, key, e->u32);
        else if (e->to_dense && !strcmp(key, "general.architecture"))
            rc = gguf_writer_set_str(w, key, "qwen3");
        else if (e->to_dense && !strncmp(key, "qwen3moe.", 9)) {
            char dense[128];
            snprintf(dense, sizeof dense, "qwen3.%s", key + 9);
            uint32_t u;
            float f;
            if (strstr(key, ".expert_"))
                rc = 0;
            else if (gguf_kv_type(g, i) == GGUF_UINT32 && gguf_get_u32(g, key, &u))
                rc = gguf_writer_set_u32(w, dense, u);
            else if (gguf_kv_type(g, i) == GGUF_FLOAT32 && gguf_get_f32(g, key, &f))
                rc = gguf_writer_set_f32(w, dense, f);
            else
                rc = -1;
        } else
            rc = gguf_writer_copy_kv(w, g, i);
        if (rc < 0)
            return -1;
    }
    float *nans = NULL;
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        char name[128];
        if (!rewrite_name(e, t->name, name, sizeof name))
            continue;
        const void *data = t->data;
        if (e->nan && !strcmp(name, e->nan) && t->type == QTYPE_F32 && !nans) {
            nans = malloc(t->bytes);
            for (size_t j = 0; j < t->bytes / sizeof(float); j++)
                nans[j] = NAN;
            data = nans;
        }
        int64_t ne[GGUF_MAX_DIMS] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
        uint32_t n_dims = t->n_dims;
        if (e->shrink && !strcmp(name, e->shrink))
            ne[2]--;
        if (e->to_dense && n_dims == 3)
            n_dims = 2;
        if (e->split && !strncmp(name, e->split, strlen(e->split)) && n_dims == 3) {
            size_t each = t->bytes / (size_t)t->ne[2];
            char *end = strstr(name, "_exps.weight");
            for (int64_t x = 0; x < t->ne[2]; x++) {
                char one[160];
                snprintf(one, sizeof one, "%.*s.%lld.weight", (int)(end - name), name,
                         (long long)x);
                if (gguf_writer_add_tensor(w, one, t->type, 2, ne,
                                           (const char *)t->data + x * each) < 0)
                    return -1;
            }
            continue;
        }
        if (gguf_writer_add_tensor(w, name, t->type, n_dims, ne, data) < 0)
            return -1;
    }
    int rc = gguf_writer_write(w, dst, err);
    free(nans);
    gguf_writer_free(w);
    gguf_close(g);
    return rc;
}

/* A router of NaN weights (a broken file) still routes every row of a full batch, and
 * the forward ends. */
static void test_nan_router(void)
{
    modelgen_params p = moe_params("qwen3moe", QTYPE_F16);
    const char *path = gen(&p, "nan");
    CHECK(path);
    char src[512], dst[512], err[ERR_MAX];
    snprintf(src, sizeof src, "%s", path);
    snprintf(dst, sizeof dst, "%s/nan-router.gguf", test_tmpdir());
    CHECK(rewrite(src, dst, &(rewrite_edit){.nan = "blk.0.ffn_gate_inp.weight"}) == 0);
    model *m = model_load(dst, err);
    CHECK_MSG(m, "%s", err);
    enum { N = 16 };
    model_runner *r = model_runner_new(m, 2, N, 0, err);
    kv_pool *pool = kv_pool_new(model_kv_shape(m), 0, err);
    CHECK(r && pool);
    int32_t tok[N], pos[N];
    test_tokens(N, p.n_vocab, 7, tok, pos);
    float *out = malloc((size_t)N * p.n_vocab * sizeof(float));
    kv_seq seq;
    kv_seq_init(&seq, pool);
    CHECK(forward_all(r, &seq, N, tok, pos, out) == 0);
    kv_seq_free(&seq);
    free(out);
    kv_pool_free(pool);
    model_runner_free(r);
    model_free(m);
}

/* A model of one expert, used by every token with weight 1, is the dense model of that
 * expert's weights: qwen3moe against the same file rewritten as qwen3. */
static void test_one_expert_is_dense(void)
{
    modelgen_params p = moe_params("qwen3moe", QTYPE_F16);
    p.n_expert = p.n_expert_used = 1;
    p.n_ff_exp = p.n_ff;
    const char *path = gen(&p, "one");
    CHECK(path);
    char moe_path[512], dense_path[512], err[ERR_MAX];
    snprintf(moe_path, sizeof moe_path, "%s", path);
    snprintf(dense_path, sizeof dense_path, "%s/dense.gguf", test_tmpdir());
    rewrite_edit e = {.to_dense = true};
    CHECK(rewrite(moe_path, dense_path, &e) == 0);
    model *mm = model_load(moe_path, err), *md = model_load(dense_path, err);
    CHECK_MSG(mm && md, "%s", err);
    CHECK(model_hparams_of(mm)->n_expert == 1 && model_hparams_of(md)->n_expert == 0);
    int nv = model_hparams_of(mm)->n_vocab;
    enum { N = 20 };
    int32_t tok[N], pos[N];
    test_tokens(N, nv, 2, tok, pos);
    float *a = malloc((size_t)N * nv * sizeof(float)), *b = malloc((size_t)N * nv * sizeof(float));
    model *ms[2] = {mm, md};
    float *outs[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        model_runner *r = model_runner_new(ms[i], 2, 64, 0, err);
        kv_pool *pool = kv_pool_new(model_kv_shape(ms[i]), 0, err);
        kv_seq seq;
        kv_seq_init(&seq, pool);
        CHECK(forward_all(r, &seq, N - 4, tok, pos, outs[i]) == 0);
        for (int t = N - 4; t < N; t++)
            CHECK(forward_all(r, &seq, 1, tok + t, pos + t, outs[i] + (size_t)t * nv) == 0);
        kv_seq_free(&seq);
        kv_pool_free(pool);
        model_runner_free(r);
    }
    CHECK_MSG(memcmp(a, b, (size_t)N * nv * sizeof(float)) == 0,
              "one expert's logits differ from the dense model's");
    free(a);
    free(b);
    model_free(mm);
    model_free(md);
}

/* A rewritten file is refused at load with a message holding want. */
static void check_refused(const char *src, const rewrite_edit *e, const char *want)
{
    char dst[512], err[ERR_MAX];
    snprintf(dst, sizeof dst, "%s/bad.gguf", test_tmpdir());
    CHECK(rewrite(src, dst, e) == 0);
    model *m = model_load(dst, err);
    CHECK_MSG(!m, "a file with %s loaded", want);
    printf("  refused: %s\n", err);
    CHECK_MSG(strstr(err, want), "'%s' does not name %s", err, want);
}

static void test_bad_files_refused(void)
{
    modelgen_params p = moe_params("qwen3moe", QTYPE_F16);
    const char *path = gen(&p, "good");
    CHECK(path);
    char src[512];
    snprintf(src, sizeof src, "%s", path);
    check_refused(src, &(rewrite_edit){.key = "qwen3moe.expert_used_count", .u32 = 9},
                  "expert_used_count");
    check_refused(src, &(rewrite_edit){.shrink = "blk.1.ffn_up_exps.weight"},
                  "'blk.1.ffn_up_exps.weight': shape");
    check_refused(src, &(rewrite_edit){.drop = "blk.0.ffn_gate_inp.weight"},
                  "'blk.0.ffn_gate_inp.weight' is missing");
    check_refused(src, &(rewrite_edit){.drop = "blk.1.ffn_down_exps.weight"},
                  "'blk.1.ffn_down_exps.weight' is missing");
    check_refused(src, &(rewrite_edit){.key = "qwen3moe.expert_count", .u32 = 0},
                  "expert_count");
    /* feed_forward_length is only a default of the experts' sizes: without it a qwen3moe
     * file loads, a qwen2moe one needs its shared expert's size */
    char dst[512], err[ERR_MAX];
    snprintf(dst, sizeof dst, "%s/no-ff.gguf", test_tmpdir());
    CHECK(rewrite(src, dst, &(rewrite_edit){.drop_keys = {"qwen3moe.feed_forward_length"}}) == 0);
    model *m = model_load(dst, err);
    CHECK_MSG(m && model_hparams_of(m)->n_ff_exp == p.n_ff_exp, "%s", err);
    model_free(m);
    p = moe_params("qwen2moe", QTYPE_F16);
    path = gen(&p, "shexp");
    CHECK(path);
    snprintf(src, sizeof src, "%s", path);
    check_refused(src,
                  &(rewrite_edit){.drop_keys = {"qwen2moe.feed_forward_length",
                                                "qwen2moe.expert_shared_feed_forward_length"}},
                  "'qwen2moe.expert_shared_feed_forward_length'");
    /* an older Mixtral conversion: one tensor per expert */
    p = moe_params("llama", QTYPE_F16);
    path = gen(&p, "mixtral");
    CHECK(path);
    snprintf(src, sizeof src, "%s", path);
    check_refused(src, &(rewrite_edit){.split = "blk.0."}, "one tensor each");
}

/* An adapter of the experts or the router is refused with what it adapts; one of the
 * attention loads, changes the outputs, and at scale 0 gives the base's bit for bit. */
static void test_lora(void)
{
    modelgen_params p = moe_params("qwen3moe", QTYPE_F16);
    const char *path = gen(&p, "base");
    CHECK(path);
    char base_path[512], ad_path[512], err[ERR_MAX];
    snprintf(base_path, sizeof base_path, "%s", path);
    model *m = model_load(base_path, err);
    CHECK_MSG(m, "%s", err);

    /* the experts: a pair on blk.0.ffn_up_exps, as a converter of a MoE adapter writes */
    snprintf(ad_path, sizeof ad_path, "%s/experts.gguf", test_tmpdir());
    gguf_writer *w = gguf_writer_new();
    int64_t a_ne[2] = {p.dim, 4}, b_ne[2] = {4, p.n_ff_exp};
    float *zeros = calloc((size_t)p.dim * p.n_ff_exp, sizeof(float));
    CHECK(gguf_writer_set_str(w, "general.type", "adapter") == 0 &&
          gguf_writer_set_str(w, "general.architecture", "qwen3moe") == 0 &&
          gguf_writer_set_str(w, "adapter.type", "lora") == 0 &&
          gguf_writer_set_f32(w, "adapter.lora.alpha", 4.0f) == 0 &&
          gguf_writer_add_tensor(w, "blk.0.ffn_up_exps.weight.lora_a", QTYPE_F32, 2, a_ne,
                                 zeros) == 0 &&
          gguf_writer_add_tensor(w, "blk.0.ffn_up_exps.weight.lora_b", QTYPE_F32, 2, b_ne,
                                 zeros) == 0 &&
          gguf_writer_write(w, ad_path, err) == 0);
    gguf_writer_free(w);
    free(zeros);
    lora *bad = lora_load(m, ad_path, err);
    CHECK_MSG(!bad, "an adapter of the experts loaded");
    printf("  refused: %s\n", err);
    CHECK_MSG(strstr(err, "ffn_up_exps") && strstr(err, "experts"), "%s", err);

    /* the attention */
    gguf_file *g = gguf_open(base_path, err);
    CHECK_MSG(g, "%s", err);
    snprintf(ad_path, sizeof ad_path, "%s/attn.gguf", test_tmpdir());
    modelgen_lora_params lp = {.base = g, .rank = 8, .alpha = 8, .type = QTYPE_F16,
                               .targets = MODELGEN_LORA_Q | MODELGEN_LORA_K | MODELGEN_LORA_V |
                                          MODELGEN_LORA_O,
                               .seed = 3, .n_threads = 1};
    CHECK_MSG(modelgen_write_lora(&lp, ad_path, err) == 0, "%s", err);
    lp.targets = MODELGEN_LORA_GATE;
    char ffn_path[512];
    snprintf(ffn_path, sizeof ffn_path, "%s/ffn.gguf", test_tmpdir());
    CHECK_MSG(modelgen_write_lora(&lp, ffn_path, err) < 0, "an adapter of no matrix was written");
    gguf_close(g);
    lora *ad = lora_load(m, ad_path, err);
    CHECK_MSG(ad, "%s", err);
    int nv = model_hparams_of(m)->n_vocab;
    enum { N = 12 };
    int32_t tok[N], pos[N];
    test_tokens(N, nv, 4, tok, pos);
    float scales[3] = {0.0f, 1.0f, 0.0f};
    float *out[3];
    for (int i = 0; i < 3; i++) {
        const lora *ads[1] = {ad};
        model *v = i == 2 ? m : model_with_loras(m, 1, ads, &scales[i], err);
        CHECK_MSG(v, "%s", err);
        model_runner *r = model_runner_new(v, 1, 16, 0, err);
        kv_pool *pool = kv_pool_new(model_kv_shape(v), 0, err);
        kv_seq seq;
        kv_seq_init(&seq, pool);
        out[i] = malloc((size_t)N * nv * sizeof(float));
        CHECK(forward_all(r, &seq, N, tok, pos, out[i]) == 0);
        kv_seq_free(&seq);
        kv_pool_free(pool);
        model_runner_free(r);
        if (v != m)
            model_free(v);
    }
    double moved = 0;
    for (size_t i = 0; i < (size_t)N * nv; i++)
        moved = fmax(moved, fabs(out[1][i] - out[2][i]));
    printf("  attention adapter: logits move by up to %.3g at scale 1\n", moved);
    CHECK(memcmp(out[0], out[2], (size_t)N * nv * sizeof(float)) == 0);
    CHECK(moved > 0.05);
    for (int i = 0; i < 3; i++)
        free(out[i]);
    lora_free(ad);
    model_free(m);
}

/* Logits of N tokens (one prefill of N - 4, then 4 decodes) of m into out (N, n_vocab),
 * its weights streamed when stream (every matrix a streamed fragment). */
static int run_tokens(const model *m, bool stream, int n, const int32_t *tok,
                      const int32_t *pos, float *out)
{
    char err[ERR_MAX];
    int nv = model_hparams_of(m)->n_vocab, rc = 0;
    model_runner *r = model_runner_new(m, 2, 128, 0, err);
    kv_pool *pool = r ? kv_pool_new(model_kv_shape(m), 0, err) : NULL;
    if (!pool || (stream && model_runner_stream_weights(r, 0, err) < 0)) {
        fprintf(stderr, "%s\n", err);
        model_runner_free(r);
        return -1;
    }
    kv_seq seq;
    kv_seq_init(&seq, pool);
    rc |= forward_all(r, &seq, n - 4, tok, pos, out);
    for (int t = n - 4; t < n; t++)
        rc |= forward_all(r, &seq, 1, tok + t, pos + t, out + (size_t)t * nv);
    kv_seq_free(&seq);
    kv_pool_free(pool);
    model_runner_free(r);
    return rc;
}

/* Q8_0 weights repacked (the attention's and the output's; the experts are read as the
 * file stores them) give the logits of the file's layout, up to the f32 order of the
 * repacked kernel's sums; streamed weights (the merged experts one fragment each, a
 * prefill of 64 rows or more) give them bit for bit. */
static void test_repacked_and_streamed(void)
{
    modelgen_params p = moe_params("qwen3moe", QTYPE_Q8_0);
    const char *path = gen(&p, "repack");
    CHECK(path);
    char err[ERR_MAX];
    model *m = model_load(path, err);
    CHECK_MSG(m, "%s", err);
    int nv = model_hparams_of(m)->n_vocab;
    enum { N = 72 };
    int32_t tok[N], pos[N];
    test_tokens(N, nv, 6, tok, pos);
    float *plain = malloc((size_t)N * nv * sizeof(float));
    float *other = malloc((size_t)N * nv * sizeof(float));
    CHECK(run_tokens(m, false, N, tok, pos, plain) == 0);
    CHECK(run_tokens(m, true, N, tok, pos, other) == 0);
    CHECK_MSG(memcmp(plain, other, (size_t)N * nv * sizeof(float)) == 0,
              "streamed weights changed the logits");
    CHECK_MSG(model_repack_weights(m, err) == 0, "%s", err);
    CHECK(run_tokens(m, false, N, tok, pos, other) == 0);
    double worst = 0;
    for (size_t i = 0; i < (size_t)N * nv; i++)
        worst = fmax(worst, fabs(plain[i] - other[i]));
    printf("  repacked (%zu bytes): max |logit diff| %.3g\n", model_repacked_bytes(m), worst);
    CHECK_MSG(worst <= 1e-3, "repacked: %g", worst);
    free(plain);
    free(other);
    model_free(m);
}

/* ---- no allocation per token ---- */

/* test_moe is linked with --wrap=malloc,calloc,realloc (the Makefile), as test_lora is,
 * so that every allocation of the engine is counted here. */
void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
static _Atomic long n_allocs;

void *__wrap_malloc(size_t n)
{
    n_allocs++;
    return __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t size)
{
    n_allocs++;
    return __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t n)
{
    n_allocs++;
    return __real_realloc(p, n);
}

/* Decode steps and a short prompt of a qwen2moe model (experts and the shared expert),
 * within chunks the sequence has, allocate nothing: routing has its scratch. */
static void forward_never_allocates(void)
{
    modelgen_params p = moe_params("qwen2moe", QTYPE_F16);
    const char *path = gen(&p, "alloc");
    CHECK(path);
    char err[ERR_MAX];
    model *m = model_load(path, err);
    CHECK_MSG(m, "%s", err);
    model_runner *r = model_runner_new(m, 2, 64, 256, err);
    kv_pool *pool = kv_pool_new(model_kv_shape(m), 0, err);
    CHECK(r && pool);
    kv_seq seq;
    kv_seq_init(&seq, pool);
    static float logits[8 * 260];
    int32_t tok[8], pos[8];
    test_tokens(8, p.n_vocab, 5, tok, pos);
    CHECK(forward_all(r, &seq, 1, tok, pos, logits) == 0); /* the sequence's first chunk */
    CHECK_MSG(n_allocs > 0, "allocations are not counted (the Makefile's --wrap)");
    long before = n_allocs;
    for (int i = 1; i < 6; i++)
        CHECK(forward_all(r, &seq, 1, tok + i, pos + i, logits) == 0);
    for (int i = 0; i < 8; i++)
        pos[i] = 6 + i;
    CHECK(forward_all(r, &seq, 8, tok, pos, logits) == 0);
    CHECK_MSG(n_allocs == before, "%ld allocations", n_allocs - before);
    kv_seq_free(&seq);
    kv_pool_free(pool);
    model_runner_free(r);
    model_free(m);
}

int main(void)
{
    RUN(test_against_reference);
    RUN(test_routing_spreads);
    RUN(test_prefill_equals_decode);
    RUN(test_batched_equals_alone);
    RUN(test_one_expert_is_dense);
    RUN(test_bad_files_refused);
    RUN(test_nan_router);
    RUN(test_lora);
    RUN(test_repacked_and_streamed);
    RUN(forward_never_allocates);
    return test_finish();
}
