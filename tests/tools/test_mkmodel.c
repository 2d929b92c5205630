/*
 * test_mkmodel.c — mkmodel --from: converting a model file's weights to another type, with
 * LoRA adapters merged; mkmodel --lora-of: random adapters in llama.cpp's format;
 * mkmodel --arch phi3 / granite: their keys and tensors as llama.cpp reads them.
 * mkmodel --experts: mixtures of experts in llama.cpp's layout; --arch gpt-oss: its experts
 * in MXFP4 (or --type), its biases, sinks and keys; --arch gemma-embedding: EmbeddingGemma
 * with its dense layers; --arch deepseek2: its latent attention, experts and YaRN options
 * as the keys and tensors llama.cpp reads.
 */
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/encoder/bert.h"
#include "engine/gguf/gguf.h"
#include "engine/gguf/modelgen.h"
#include "engine/model/model.h"
#include "engine/quant/quant.h"
#include "tests/support/test.h"

static char mkmodel_path[1024], llms_run_path[1024];
static char q8_path[1100], f32_path[1100], back_path[1100];

/* Runs mkmodel with args; its exit status, its stderr in err. */
static int mkmodel(const char *args, char *err, size_t cap)
{
    char cmd[6144];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1 >/dev/null", mkmodel_path, args);
    return test_run_capture(cmd, err, cap);
}

/* A Q8_0 model converted to F32 holds exactly the dequantized values, its norms and
 * metadata unchanged; converted back to Q8_0 it is the original, byte for byte (a Q8_0
 * block's maximum decodes to 127 * d exactly, so quantizing again finds the same d). */
static void q8_0_to_f32_and_back(void)
{
    char args[4096], err[1024];
    snprintf(args, sizeof args, "-o '%s' --from '%s' --type f32", f32_path, q8_path);
    CHECK_MSG(mkmodel(args, err, sizeof err) == 0, "mkmodel: %s", err);
    snprintf(args, sizeof args, "-o '%s' --from '%s' --type q8_0", back_path, f32_path);
    CHECK_MSG(mkmodel(args, err, sizeof err) == 0, "mkmodel: %s", err);

    char e[ERR_MAX];
    gguf_file *q = gguf_open(q8_path, e), *f = gguf_open(f32_path, e), *b = gguf_open(back_path, e);
    CHECK_MSG(q && f && b, "%s", e);
    CHECK_EQ(gguf_n_kv(f), gguf_n_kv(q));
    CHECK_EQ(gguf_n_tensors(f), gguf_n_tensors(q));
    int converted = 0;
    float row[4096];
    for (int64_t i = 0; i < gguf_n_tensors(q); i++) {
        const gguf_tensor *tq = gguf_tensor_at(q, i), *tf = gguf_tensor_at(f, i),
                          *tb = gguf_tensor_at(b, i);
        CHECK(tq->name.len == tf->name.len && !memcmp(tq->name.ptr, tf->name.ptr, tq->name.len));
        CHECK(tq->n_dims == tf->n_dims && !memcmp(tq->ne, tf->ne, sizeof tq->ne));
        CHECK_EQ(tb->type, tq->type);
        CHECK_MSG(tb->bytes == tq->bytes && !memcmp(tb->data, tq->data, tq->bytes),
                  "%.*s differs after the round trip", (int)tq->name.len, tq->name.ptr);
        if (tq->type != QTYPE_Q8_0) {
            CHECK(tf->type == tq->type && !memcmp(tf->data, tq->data, tq->bytes));
            continue;
        }
        CHECK_EQ(tf->type, QTYPE_F32);
        int64_t n = tq->ne[0], rows = tq->ne[1];
        CHECK(n <= (int64_t)(sizeof row / sizeof row[0]));
        for (int64_t r = 0; r < rows; r++) {
            quant_dequantize_row_scalar(QTYPE_Q8_0,
                                        (const uint8_t *)tq->data + r * quant_row_bytes(QTYPE_Q8_0, n),
                                        row, n);
            CHECK(!memcmp(row, (const float *)tf->data + r * n, sizeof(float) * (size_t)n));
        }
        converted++;
    }
    CHECK_MSG(converted >= 9, "only %d matrices were Q8_0", converted);
    gguf_close(q), gguf_close(f), gguf_close(b);
}

/* Whether the files at a and b hold the same bytes. */
static bool same_bytes(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    bool same = fa && fb;
    while (same) {
        int ca = getc(fa), cb = getc(fb);
        same = ca == cb;
        if (ca == EOF)
            break;
    }
    if (fa)
        fclose(fa);
    if (fb)
        fclose(fb);
    return same;
}

/* Rows are converted, and adapters merged, on several threads, and the file does not
 * depend on how many. */
static void conversions_do_not_depend_on_threads(void)
{
    char lora[1100], args[4096], err[1024];
    snprintf(lora, sizeof lora, "%s/threads-lora.gguf", test_tmpdir());
    snprintf(args, sizeof args, "-o '%s' --lora-of '%s' --rank 8 --targets q,down,token_embd",
             lora, f32_path);
    CHECK_MSG(mkmodel(args, err, sizeof err) == 0, "mkmodel: %s", err);
    static const char *const conversions[] = {"--type q4_k_m", "--type iq3_s",
                                              "--type q5_k_m --lora-scaled '%s' 0.75"};
    for (size_t i = 0; i < sizeof conversions / sizeof conversions[0]; i++) {
        char one[1100], three[1100], conversion[1200];
        snprintf(one, sizeof one, "%s/threads1.gguf", test_tmpdir());
        snprintf(three, sizeof three, "%s/threads3.gguf", test_tmpdir());
        snprintf(conversion, sizeof conversion, conversions[i], lora);
        snprintf(args, sizeof args, "-o '%s' --from '%s' %s --threads 1", one, f32_path,
                 conversion);
        CHECK_MSG(mkmodel(args, err, sizeof err) == 0, "mkmodel: %s", err);
        snprintf(args, sizeof args, "-o '%s' --from '%s' %s --threads 3", three, f32_path,
                 conversion);
        CHECK_MSG(mkmodel(args, err, sizeof err) == 0, "mkmodel: %s", err);
        CHECK_MSG(same_bytes(one, three), "%s: 1 and 3 threads wrote different files",
                  conversion);
    }
}

/* Mistakes are refused with a message, and nothing is left behind. */
static void bad_conversions_are_refused(void)
{
    char args[4096], err[1024], out[1100];
    snprintf(out, sizeof out, "%s/never.gguf", test_tmpdir());
    snprintf(args, sizeof args, "-o '%s' --from '%s/missing.gguf' --type f32", out, test_tmpdir());
    CHECK_EQ(mkmodel(args, err, sizeof err), 1);
    CHECK_MSG(strstr(err, "missing.gguf"), "%s", err);
    snprintf(args, sizeof args, "-o '%s' --from '%s' --type q9_k", out, q8_path);
    CHECK_EQ(mkmodel(args, err, sizeof err), 2);
    snprintf(args, sizeof args, "-o '%s' --from '%s' --type f32 --arch llama", out, q8_path);
    CHECK_EQ(mkmodel(args, err, sizeof err), 2);
    snprintf(args, sizeof args, "-o '%s' --from '%s'", out, q8_path);
    CHECK_EQ(mkmodel(args, err, sizeof err), 2);
    FILE *left = fopen(out, "r");
    CHECK(left == NULL);
}

/* Element (row, col) of a 2-D tensor as f32. */
static float elem(const gguf_tensor *t, int64_t row, int64_t col)
{
    float buf[4096];
    quant_dequantize_row_scalar(t->type,
                                (const uint8_t *)t->data + row * quant_row_bytes(t->type, t->ne[0]),
                                buf, t->ne[0]);
    return buf[col];
}

static const gguf_tensor *tensor(const gguf_file *g, const char *name)
{
    const gguf_tensor *t = gguf_find_tensor(g, name);
    if (!t)
        printf("       no tensor %s\n", name);
    return t;
}

/* --lora-of writes llama.cpp's adapter format: its metadata, a pair per adapted matrix
 * with A [in, rank] and B [rank, out] (the token embedding's flipped: A [rank, n_vocab],
 * B [rank, dim]), alpha the rank unless given, deterministic in the seed. */
static void lora_of_writes_llama_cpp_adapters(void)
{
    char args[4096], err[1024], a[1100], b[1100];
    snprintf(a, sizeof a, "%s/a.gguf", test_tmpdir());
    snprintf(b, sizeof b, "%s/b.gguf", test_tmpdir());
    snprintf(args, sizeof args, "-o '%s' --lora-of '%s' --rank 8 --targets q,v,down,output,token_embd",
             a, q8_path);
    CHECK_MSG(mkmodel(args, err, sizeof err) == 0, "mkmodel: %s", err);
    snprintf(args, sizeof args, "-o '%s' --lora-of '%s' --rank 32 --alpha 4 --type q8_0 --seed 9",
             b, q8_path);
    CHECK_MSG(mkmodel(args, err, sizeof err) == 0, "mkmodel: %s", err);
    char e[ERR_MAX];
    gguf_file *ga = gguf_open(a, e), *gb = gguf_open(b, e);
    CHECK_MSG(ga && gb, "%s", e);
    gguf_str s;
    float alpha;
    CHECK(gguf_get_str(ga, "general.type", &s) && gguf_str_eq(s, "adapter"));
    CHECK(gguf_get_str(ga, "general.architecture", &s) && gguf_str_eq(s, "llama"));
    CHECK(gguf_get_str(ga, "adapter.type", &s) && gguf_str_eq(s, "lora"));
    CHECK(gguf_get_f32(ga, "adapter.lora.alpha", &alpha) && alpha == 8.0f);
    CHECK(gguf_get_f32(gb, "adapter.lora.alpha", &alpha) && alpha == 4.0f);
    CHECK_EQ(gguf_n_tensors(ga), 2 * (2 * 3 + 2));
    CHECK_EQ(gguf_n_tensors(gb), 2 * 2 * 7);
    const gguf_tensor *qa = tensor(ga, "blk.1.attn_q.weight.lora_a"),
                      *qb = tensor(ga, "blk.1.attn_q.weight.lora_b"),
                      *da = tensor(ga, "blk.0.ffn_down.weight.lora_a"),
                      *ea = tensor(ga, "token_embd.weight.lora_a"),
                      *eb = tensor(ga, "token_embd.weight.lora_b"),
                      *kb = tensor(gb, "blk.0.attn_k.weight.lora_b");
    CHECK(qa && qb && da && ea && eb && kb);
    CHECK(qa->ne[0] == 64 && qa->ne[1] == 8 && qb->ne[0] == 8 && qb->ne[1] == 64);
    CHECK(da->ne[0] == 128 && da->ne[1] == 8);
    CHECK(ea->ne[0] == 8 && ea->ne[1] == 300 && eb->ne[0] == 8 && eb->ne[1] == 64);
    CHECK(qa->type == QTYPE_F16 && kb->type == QTYPE_Q8_0 && kb->ne[0] == 32 && kb->ne[1] == 32);
    CHECK(!gguf_find_tensor(ga, "blk.0.attn_k.weight.lora_a"));
    gguf_close(ga), gguf_close(gb);
}

/* --from with --lora-scaled merges W + scale * alpha / rank * B A (the token embedding's
 * W + s A B^T, row per token) in double, converting what it does not adapt as before. */
static void from_merges_adapters(void)
{
    char args[4096], err[1024], a[1100], m[1100];
    snprintf(a, sizeof a, "%s/ma.gguf", test_tmpdir());
    snprintf(m, sizeof m, "%s/merged.gguf", test_tmpdir());
    snprintf(args, sizeof args, "-o '%s' --lora-of '%s' --rank 4 --alpha 6 --type f32 "
             "--targets q,token_embd", a, q8_path);
    CHECK_MSG(mkmodel(args, err, sizeof err) == 0, "mkmodel: %s", err);
    snprintf(args, sizeof args, "-o '%s' --from '%s' --type f32 --lora-scaled '%s' -0.5", m,
             q8_path, a);
    CHECK_MSG(mkmodel(args, err, sizeof err) == 0, "mkmodel: %s", err);
    char e[ERR_MAX];
    gguf_file *ga = gguf_open(a, e), *gm = gguf_open(m, e), *gq = gguf_open(q8_path, e);
    CHECK_MSG(ga && gm && gq, "%s", e);
    double s = -0.5 * 6 / 4;
    const gguf_tensor *w = tensor(gq, "blk.1.attn_q.weight"), *wm = tensor(gm, "blk.1.attn_q.weight"),
                      *A = tensor(ga, "blk.1.attn_q.weight.lora_a"),
                      *B = tensor(ga, "blk.1.attn_q.weight.lora_b");
    CHECK(w && wm && A && B && wm->type == QTYPE_F32);
    int rows[] = {0, 17, 63}, cols[] = {0, 5, 63};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) {
            double d = 0;
            for (int k = 0; k < 4; k++)
                d += (double)elem(B, rows[i], k) * elem(A, k, cols[j]);
            CHECK_NEAR(elem(wm, rows[i], cols[j]), elem(w, rows[i], cols[j]) + s * d, 1e-6);
        }
    const gguf_tensor *e0 = tensor(gq, "token_embd.weight"), *em = tensor(gm, "token_embd.weight"),
                      *EA = tensor(ga, "token_embd.weight.lora_a"),
                      *EB = tensor(ga, "token_embd.weight.lora_b");
    CHECK(e0 && em && EA && EB);
    int toks[] = {0, 123, 299};
    for (int i = 0; i < 3; i++) {
        double d = 0;
        for (int k = 0; k < 4; k++)
            d += (double)elem(EA, toks[i], k) * elem(EB, 7, k);
        CHECK_NEAR(elem(em, toks[i], 7), elem(e0, toks[i], 7) + s * d, 1e-6);
    }
    const gguf_tensor *k0 = tensor(gq, "blk.1.attn_k.weight"), *km = tensor(gm, "blk.1.attn_k.weight");
    CHECK(k0 && km && km->type == QTYPE_F32 && elem(km, 3, 9) == elem(k0, 3, 9));
    gguf_close(ga), gguf_close(gm), gguf_close(gq);
}

/* Adapters that do not fit, and options out of place, are refused with a message. */
static void bad_adapters_are_refused(void)
{
    char args[4096], err[1024], out[1100], qwen[1100], qa[1100];
    snprintf(out, sizeof out, "%s/never.gguf", test_tmpdir());
    snprintf(qwen, sizeof qwen, "%s/qwen.gguf", test_tmpdir());
    snprintf(qa, sizeof qa, "%s/qa.gguf", test_tmpdir());
    modelgen_params mp = {.arch = "qwen2", .dim = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2,
                          .n_ff = 128, .n_ctx = 256, .type = QTYPE_F16, .seed = 3,
                          .n_vocab = 300, .n_threads = 1};
    char e[ERR_MAX];
    CHECK_MSG(modelgen_write(&mp, qwen, e) == 0, "%s", e);
    snprintf(args, sizeof args, "-o '%s' --lora-of '%s' --rank 8", qa, qwen);
    CHECK_MSG(mkmodel(args, err, sizeof err) == 0, "mkmodel: %s", err);
    /* a qwen2 adapter merged into a llama model */
    snprintf(args, sizeof args, "-o '%s' --from '%s' --type f32 --lora '%s'", out, q8_path, qa);
    CHECK_EQ(mkmodel(args, err, sizeof err), 1);
    CHECK_MSG(strstr(err, "architecture"), "%s", err);
    /* a model given as an adapter */
    snprintf(args, sizeof args, "-o '%s' --from '%s' --type f32 --lora '%s'", out, q8_path, qwen);
    CHECK_EQ(mkmodel(args, err, sizeof err), 1);
    CHECK_MSG(strstr(err, "not an adapter"), "%s", err);
    /* a rank that is no whole Q8_0 block */
    snprintf(args, sizeof args, "-o '%s' --lora-of '%s' --rank 8 --type q8_0", out, q8_path);
    CHECK_EQ(mkmodel(args, err, sizeof err), 1);
    CHECK_MSG(strstr(err, "block size 32"), "%s", err);
    /* options out of place */
    snprintf(args, sizeof args, "-o '%s' --lora-of '%s'", out, q8_path);
    CHECK_EQ(mkmodel(args, err, sizeof err), 2);
    snprintf(args, sizeof args, "-o '%s' --from '%s' --type f32 --rank 4", out, q8_path);
    CHECK_EQ(mkmodel(args, err, sizeof err), 2);
    snprintf(args, sizeof args, "-o '%s' --lora '%s' --arch llama --type f32", out, qa);
    CHECK_EQ(mkmodel(args, err, sizeof err), 2);
    snprintf(args, sizeof args, "-o '%s' --lora-of '%s' --rank 4 --targets q,x", out, q8_path);
    CHECK_EQ(mkmodel(args, err, sizeof err), 2);
    FILE *left = fopen(out, "r");
    CHECK(left == NULL);
}

/* llms-run's perplexity of text (256-token chunks, as llama-perplexity -c 256) under
 * model, or -1 when it fails. */
static double perplexity(const char *model, const char *text)
{
    char cmd[4096], out[256];
    double ppl;
    snprintf(cmd, sizeof cmd, "'%s' -m '%s' --perplexity '%s' -c 256 -t 2 2>/dev/null",
             llms_run_path, model, text);
    if (test_run_capture(cmd, out, sizeof out) != 0 || sscanf(out, "PPL = %lf", &ppl) != 1)
        return -1;
    return ppl;
}

/*
 * llama.cpp's mixes made by mkmodel --from from the trained documentation model (F16),
 * scored on the first 32000 bytes of its held-out text: each within its bound of the F16
 * model's perplexity (16.57). On this text llama-quantize's Q2_K (q2_k_mix) gives 1.087x
 * it, Q3_K_S 1.040x, Q3_K_M 1.020x, Q3_K_L 1.019x, IQ4_NL 1.007x, IQ4_XS 1.007x, and every
 * matrix in Q5_0 (llama-quantize's fallback for Q4_K rows) 1.002x, every matrix (the
 * tied output's embedding too) in IQ3_S 1.057x and in IQ2_S 1.226x, with this project's
 * quantizer, which takes no importance matrix (llama-quantize's IQ3_S mix, the output and
 * embedding in Q6_K, 1.056x; its IQ2_S and IQ2_M mixes, which it makes only with an
 * importance matrix, 1.121x and 1.098x); llama.cpp's own files
 * score as close or worse (on the whole held-out text its Q3_K_M 1.0226x where mkmodel's
 * is 1.0207x, its Q2_K 1.111x where mkmodel's is 1.093x, each file read by llmsd and by
 * llama-perplexity alike). The bounds leave 1-3 points over what is measured.
 */
static void mixes_keep_docs_lm_perplexity(void)
{
    static const struct {
        const char *mix;
        const char *tensor; /* one matrix the mix widens */
        uint32_t tensor_type;
        double max_ratio;
    } mixes[] = {
        {"q3_k_m", "blk.0.attn_v.weight", QTYPE_Q5_K, 1.035},
        {"q2_k_mix", "blk.0.ffn_down.weight", QTYPE_Q3_K, 1.115},
        {"q3_k_s", "blk.0.ffn_up.weight", QTYPE_Q3_K, 1.06},
        {"q3_k_l", "blk.0.ffn_down.weight", QTYPE_Q5_K, 1.035},
        {"iq4_nl_mix", "token_embd.weight", QTYPE_Q6_K, 1.025},
        {"iq4_xs_mix", "token_embd.weight", QTYPE_Q6_K, 1.025},
        {"q5_0", "blk.0.attn_q.weight", QTYPE_Q5_0, 1.015},
        {"iq3_s", "blk.0.attn_q.weight", QTYPE_IQ3_S, 1.075},
        {"iq2_s", "token_embd.weight", QTYPE_IQ2_S, 1.25},
    };
    const char *f16 = test_data_path("models/docs-lm-21M-F16.gguf");
    char model[1100], text[1100], err[1024], args[4096];
    snprintf(model, sizeof model, "%s", f16 ? f16 : "");
    const char *held = test_data_path("docs/heldout.txt");
    if (!f16 || !held)
        SKIP("../shared/testdata/models/docs-lm-21M-F16.gguf or docs/heldout.txt is absent");
    /* the first 32000 bytes, cut at a line's end */
    FILE *in = fopen(held, "r");
    snprintf(text, sizeof text, "%s/heldout.txt", test_tmpdir());
    FILE *out = fopen(text, "w");
    CHECK(in && out);
    char line[4096];
    for (long n = 0; n < 32000 && fgets(line, sizeof line, in);)
        n += fputs(line, out) >= 0 ? (long)strlen(line) : 32000;
    fclose(in);
    fclose(out);
    double base = perplexity(model, text);
    CHECK_MSG(base > 1 && base < 30, "F16 perplexity %g", base);
    size_t n_mixes = sizeof mixes / sizeof *mixes;
#ifdef TEST_SANITIZED
    /* the first alone: the others take the same paths, and a sanitized build takes
     * minutes for each */
    n_mixes = 1;
#endif
    for (size_t i = 0; i < n_mixes; i++) {
        char path[1100];
        snprintf(path, sizeof path, "%s/docs-%s.gguf", test_tmpdir(), mixes[i].mix);
        snprintf(args, sizeof args, "-o '%s' --from '%s' --type %s", path, model, mixes[i].mix);
        CHECK_MSG(mkmodel(args, err, sizeof err) == 0, "mkmodel: %s", err);
        char e[ERR_MAX];
        gguf_file *g = gguf_open(path, e);
        CHECK_MSG(g, "%s", e);
        const gguf_tensor *t = gguf_find_tensor(g, mixes[i].tensor);
        CHECK_MSG(t && t->type == mixes[i].tensor_type, "%s: %s is not %s", mixes[i].mix,
                  mixes[i].tensor, quant_traits_of(mixes[i].tensor_type)->name);
        gguf_close(g);
        double ppl = perplexity(path, text);
        printf("       %s: perplexity %.4f, %.4fx F16's %.4f\n", mixes[i].mix, ppl, ppl / base,
               base);
        CHECK_MSG(ppl > 0 && ppl <= mixes[i].max_ratio * base, "%s: perplexity %g, F16 %g",
                  mixes[i].mix, ppl, base);
        remove(path);
    }
}

/* phi3 with partial rotary, LongRoPE, a window and the output tied; granite: the keys
 * llama.cpp requires, the tensors it reads, and a model that loads as written. */
static void phi3_and_granite(void)
{
    char args[4096], err[1024], out[1100], e[ERR_MAX];
    snprintf(out, sizeof out, "%s/phi3.gguf", test_tmpdir());
    snprintf(args, sizeof args, "-o '%s' --arch phi3 --dim 64 --layers 2 --heads 4 "
             "--kv-heads 2 --ffn 96 --ctx 256 --type f16 --vocab '%s' --rope-dims 12 "
             "--rope-orig-ctx 64 --sliding-window 200 --tied", out, q8_path);
    CHECK_MSG(mkmodel(args, err, sizeof err) == 0, "mkmodel: %s", err);
    gguf_file *g = gguf_open(out, e);
    CHECK_MSG(g, "%s", e);
    const char *present[] = {"blk.1.attn_qkv.weight", "blk.1.ffn_up.weight",
                             "rope_factors_long.weight", "rope_factors_short.weight"};
    for (size_t i = 0; i < sizeof present / sizeof *present; i++)
        CHECK_MSG(gguf_find_tensor(g, present[i]), "%s missing", present[i]);
    CHECK(!gguf_find_tensor(g, "output.weight") && !gguf_find_tensor(g, "blk.0.ffn_gate.weight"));
    CHECK_EQ(gguf_find_tensor(g, "blk.0.ffn_up.weight")->ne[1], 192);
    CHECK_EQ(gguf_find_tensor(g, "rope_factors_long.weight")->ne[0], 6);
    uint32_t v = 0;
    CHECK(gguf_get_u32(g, "phi3.attention.sliding_window", &v) && v == 200);
    CHECK(gguf_get_u32(g, "phi3.rope.scaling.original_context_length", &v) && v == 64);
    float f = 0;
    CHECK(gguf_get_f32(g, "phi3.rope.scaling.attn_factor", &f));
    CHECK_NEAR(f, sqrt(1 + log(4.0) / log(64.0)), 1e-6);
    model *m = model_from_gguf(g, e);
    CHECK_MSG(m, "%s", e);
    const model_hparams *hp = model_hparams_of(m);
    CHECK(hp->arch == MODEL_ARCH_PHI3 && hp->rope_dims == 12 && hp->n_ctx == 200 &&
          hp->n_ff == 96);
    model_free(m);
    gguf_close(g);

    snprintf(out, sizeof out, "%s/granite.gguf", test_tmpdir());
    snprintf(args, sizeof args, "-o '%s' --arch granite --dim 64 --layers 2 --heads 4 "
             "--kv-heads 2 --ffn 96 --ctx 256 --type q8_0 --vocab '%s'", out, q8_path);
    CHECK_MSG(mkmodel(args, err, sizeof err) == 0, "mkmodel: %s", err);
    g = gguf_open(out, e);
    CHECK_MSG(g, "%s", e);
    const char *keys[] = {"granite.embedding_scale", "granite.residual_scale",
                          "granite.attention.scale", "granite.logit_scale"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        CHECK_MSG(gguf_get_f32(g, keys[i], &f) && f > 0, "%s", keys[i]);
    m = model_from_gguf(g, e);
    CHECK_MSG(m, "%s", e);
    CHECK_EQ(model_hparams_of(m)->arch, MODEL_ARCH_GRANITE);
    model_free(m);
    gguf_close(g);

    /* LongRoPE and windows are phi3's */
    snprintf(args, sizeof args, "-o '%s' --arch granite --dim 64 --layers 2 --heads 4 "
             "--kv-heads 2 --ffn 96 --ctx 256 --type f32 --vocab '%s' --sliding-window 8", out,
             q8_path);
    CHECK(mkmodel(args, err, sizeof err) != 0);
    CHECK_MSG(strstr(err, "phi3"), "%s", err);
}

/* --experts writes every key and tensor llama.cpp's loader reads for qwen3moe (its
 * router F32, the merged experts 3-D, in the mix's types), the engine loads it, --from
 * keeps that layout, and wrong expert counts are refused. */
static void experts_in_llama_cpp_layout(void)
{
    const char *vocab = test_data_path("vocab/ggml-vocab-llama-spm.gguf");
    if (!vocab)
        SKIP("test data vocab/ggml-vocab-llama-spm.gguf is absent");
    char args[4096], err[1024], path[1100], f32[1100];
    snprintf(path, sizeof path, "%s/moe.gguf", test_tmpdir());
    snprintf(f32, sizeof f32, "%s/moe-f32.gguf", test_tmpdir());
    const char *shape = "--dim 256 --layers 2 --heads 4 --kv-heads 2 --ffn 512 --ctx 256";
    snprintf(args, sizeof args, "-o '%s' --arch qwen3moe %s --experts 8 --experts-used 2 "
             "--expert-ffn 256 --type q4_k_m --vocab '%s'", path, shape, vocab);
    CHECK_MSG(mkmodel(args, err, sizeof err) == 0, "mkmodel: %s", err);
    snprintf(args, sizeof args, "-o '%s' --from '%s' --type f32", f32, path);
    CHECK_MSG(mkmodel(args, err, sizeof err) == 0, "mkmodel: %s", err);
    const char *files[] = {path, f32};
    for (int f = 0; f < 2; f++) {
        char e[ERR_MAX];
        gguf_file *g = gguf_open(files[f], e);
        CHECK_MSG(g, "%s", e);
        uint32_t n = 0, used = 0, ff = 0;
        CHECK(gguf_get_u32(g, "qwen3moe.expert_count", &n) && n == 8);
        CHECK(gguf_get_u32(g, "qwen3moe.expert_used_count", &used) && used == 2);
        CHECK(gguf_get_u32(g, "qwen3moe.expert_feed_forward_length", &ff) && ff == 256);
        const gguf_tensor *router = gguf_find_tensor(g, "blk.1.ffn_gate_inp.weight");
        CHECK(router && router->type == QTYPE_F32 && router->ne[0] == 256 && router->ne[1] == 8);
        const gguf_tensor *down = gguf_find_tensor(g, "blk.1.ffn_down_exps.weight");
        CHECK(down && down->n_dims == 3 && down->ne[0] == 256 && down->ne[1] == 256 &&
              down->ne[2] == 8);
        CHECK_MSG(down->type == (f ? QTYPE_F32 : QTYPE_Q6_K) || down->type == QTYPE_Q4_K,
                  "ffn_down_exps is %s", quant_traits_of(down->type)->name);
        CHECK(gguf_find_tensor(g, "blk.0.ffn_up_exps.weight") &&
              gguf_find_tensor(g, "blk.0.ffn_gate_exps.weight") &&
              !gguf_find_tensor(g, "blk.0.ffn_up.weight"));
        model *m = model_from_gguf(g, e);
        CHECK_MSG(m, "%s", e);
        CHECK(model_hparams_of(m)->n_expert == 8 && model_hparams_of(m)->n_expert_used == 2);
        model_free(m);
        gguf_close(g);
    }
    static const struct {
        const char *arch, *experts, *says;
    } bad[] = {
        {"qwen3moe", "", "needs experts"},
        {"qwen2", "--experts 4 --experts-used 2", "has no experts"},
        {"qwen2moe", "--experts 4 --experts-used 5", "experts used (5)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(args, sizeof args, "-o '%s/bad.gguf' --arch %s %s %s --type f16 --vocab '%s'",
                 test_tmpdir(), bad[i].arch, shape, bad[i].experts, vocab);
        CHECK_EQ(mkmodel(args, err, sizeof err), 1);
        CHECK_MSG(strstr(err, bad[i].says), "%s: %s", bad[i].arch, err);
    }
}

/* --arch gemma / gemma2 / gemma3 write what llama.cpp reads (its LLM_ARCH_GEMMA* tensors
 * and keys): no output.weight (llama.cpp reads the token embedding as the output and
 * refuses an unused tensor), post norms and (gemma3) q/k norms per layer, the sliding
 * window, gemma2's soft-caps, gemma3's rope scaling, as the options give them. */
static void gemma_files(void)
{
    const char *vocab = test_data_path("vocab/ggml-vocab-llama-spm.gguf");
    if (!vocab) {
        SKIP("no vocab/ggml-vocab-llama-spm.gguf in the test data");
        return;
    }
    static const char *const archs[] = {"gemma", "gemma2", "gemma3"};
    for (int a = 0; a < 3; a++) {
        char out[1100], args[4096], err[1024], e[ERR_MAX], key[96];
        snprintf(out, sizeof out, "%s/%s.gguf", test_tmpdir(), archs[a]);
        snprintf(args, sizeof args,
                 "-o '%s' --arch %s --dim 64 --layers 7 --heads 4 --kv-heads 2 --ffn 128 "
                 "--ctx 256 --type q8_0 --vocab '%s' %s", out, archs[a], vocab,
                 a == 1   ? "--sliding-window 32 --attn-softcap 20 --final-softcap 10"
                 : a == 2 ? "--sliding-window 512 --rope-linear 8"
                          : "");
        CHECK_MSG(mkmodel(args, err, sizeof err) == 0, "mkmodel: %s", err);
        gguf_file *g = gguf_open(out, e);
        CHECK_MSG(g, "%s", e);
        gguf_str s;
        uint32_t u;
        float f;
        CHECK(gguf_get_str(g, "general.architecture", &s) && gguf_str_eq(s, archs[a]));
        CHECK(gguf_find_tensor(g, "token_embd.weight") && !gguf_find_tensor(g, "output.weight"));
        for (int l = 0; l < 7; l++) {
            const char *per[] = {"post_attention_norm", "post_ffw_norm", "attn_q_norm", "attn_k_norm"};
            for (int k = 0; k < 4; k++) {
                snprintf(key, sizeof key, "blk.%d.%s.weight", l, per[k]);
                bool want = k < 2 ? a > 0 : a == 2;
                CHECK_MSG((gguf_find_tensor(g, key) != NULL) == want, "%s: %s", archs[a], key);
            }
        }
        snprintf(key, sizeof key, "%s.attention.sliding_window", archs[a]);
        CHECK(a == 0 ? gguf_find_key(g, key) < 0 : gguf_get_u32(g, key, &u) && u == (a == 1 ? 32u : 512u));
        snprintf(key, sizeof key, "%s.attn_logit_softcapping", archs[a]);
        CHECK(a == 1 ? gguf_get_f32(g, key, &f) && f == 20.0f : gguf_find_key(g, key) < 0);
        snprintf(key, sizeof key, "%s.final_logit_softcapping", archs[a]);
        CHECK(a == 1 ? gguf_get_f32(g, key, &f) && f == 10.0f : gguf_find_key(g, key) < 0);
        snprintf(key, sizeof key, "%s.rope.scaling.type", archs[a]);
        CHECK(a == 2 ? gguf_get_str(g, key, &s) && gguf_str_eq(s, "linear") : gguf_find_key(g, key) < 0);
        snprintf(key, sizeof key, "%s.rope.freq_base", archs[a]);
        CHECK(gguf_get_f32(g, key, &f) && f == (a == 2 ? 1e6f : 1e4f));
        gguf_close(g);
    }
}

/* --arch gpt-oss writes what llama.cpp reads (its LLM_ARCH_OPENAI_MOE tensors and keys):
 * the experts in MXFP4 unless --expert-type type, their biases F32 and 2-D (a row per
 * expert), the router's bias, attn_sinks (a logit per head), q/k/v/o biases,
 * post_attention_norm and no ffn_norm, YaRN and the window; a file llmsd loads.
 * --expert-type without experts is refused. */
static void gptoss_files(void)
{
    const char *vocab = test_data_path("vocab/ggml-vocab-gpt-2.gguf");
    if (!vocab)
        SKIP("test data vocab/ggml-vocab-gpt-2.gguf is absent");
    const char *shape = "--dim 64 --layers 2 --heads 4 --kv-heads 2 --head-dim 32 --ffn 64 "
                        "--ctx 256 --experts 4 --experts-used 2";
    for (int k = 0; k < 2; k++) {
        char out[1100], args[4096], err[1024], e[ERR_MAX];
        snprintf(out, sizeof out, "%s/gpt-oss-%d.gguf", test_tmpdir(), k);
        snprintf(args, sizeof args, "-o '%s' --arch gpt-oss %s %s --type q8_0 --vocab '%s'", out,
                 shape, k ? "--expert-type type" : "", vocab);
        CHECK_MSG(mkmodel(args, err, sizeof err) == 0, "mkmodel: %s", err);
        gguf_file *g = gguf_open(out, e);
        CHECK_MSG(g, "%s", e);
        const gguf_tensor *t = gguf_find_tensor(g, "blk.1.ffn_down_exps.weight");
        CHECK(t && t->type == (k ? QTYPE_Q8_0 : QTYPE_MXFP4) && t->ne[2] == 4);
        t = gguf_find_tensor(g, "blk.1.ffn_gate_exps.bias");
        CHECK(t && t->type == QTYPE_F32 && t->n_dims == 2 && t->ne[0] == 64 && t->ne[1] == 4);
        t = gguf_find_tensor(g, "blk.0.attn_sinks.weight");
        CHECK(t && t->type == QTYPE_F32 && t->ne[0] == 4);
        t = gguf_find_tensor(g, "blk.0.attn_q.weight");
        CHECK(t && t->type == QTYPE_Q8_0 && t->ne[1] == 128);
        CHECK(gguf_find_tensor(g, "blk.0.ffn_gate_inp.bias") &&
              gguf_find_tensor(g, "blk.0.attn_output.bias") &&
              gguf_find_tensor(g, "blk.0.post_attention_norm.weight") &&
              !gguf_find_tensor(g, "blk.0.ffn_norm.weight") && gguf_find_tensor(g, "output.weight"));
        gguf_str s;
        uint32_t u;
        CHECK(gguf_get_str(g, "gpt-oss.rope.scaling.type", &s) && gguf_str_eq(s, "yarn"));
        CHECK(gguf_get_u32(g, "gpt-oss.attention.sliding_window", &u) && u == 128);
        model *m = model_from_gguf(g, e);
        CHECK_MSG(m, "%s", e);
        CHECK(model_hparams_of(m)->arch == MODEL_ARCH_GPTOSS);
        model_free(m);
        gguf_close(g);
    }
    char args[4096], err[1024];
    snprintf(args, sizeof args, "-o '%s/bad.gguf' --arch qwen2 --dim 64 --layers 2 --heads 4 "
             "--ffn 64 --ctx 256 --expert-type mxfp4 --type f16 --vocab '%s'", test_tmpdir(), vocab);
    CHECK_EQ(mkmodel(args, err, sizeof err), 2);
    CHECK_MSG(strstr(err, "--expert-type"), "%s", err);
}

/* The smaller architectures (--arch olmo2, granitemoe, smollm3, exaone, stablelm, glm4,
 * chatglm, mistral3, exaone4, command-r, cohere2, starcoder2, phi2, seed_oss, hunyuan-dense,
 * ernie4_5-moe, glm4moe)
 * write what llama.cpp's loader reads of them, and what llmsd loads: OLMo 2's post norms
 * and whole q/k norms, no input norms; Granite MoE's router and merged experts, its shared
 * expert with --shared-ffn alone; GLM-4's post norms and fused gate/up; ChatGLM's fused
 * q/k/v with its bias; Ministral 3's YaRN over --rope-orig-ctx without LongRoPE's factors;
 * EXAONE 4's post norms and per-head q/k norms, its window and pattern with
 * --sliding-window; Cohere's attn_norm alone, the output tied; StarCoder2's biases and no
 * gate; Phi-2's output bias and no ffn_norm; Seed-OSS's q/k/v biases and
 * post_attention_norm for the feed-forward's norm; Hunyuan's per-head q/k norms; ERNIE 4.5's
 * dense first layer, then experts with the selection bias and a shared expert; GLM-4.5's
 * post_attention_norm, bias and prediction layer after the model's. */
static void small_arch_files(void)
{
    const char *vocab = test_data_path("vocab/ggml-vocab-llama-spm.gguf");
    if (!vocab) {
        SKIP("no vocab/ggml-vocab-llama-spm.gguf in the test data");
        return;
    }
    const struct {
        const char *arch, *extra, *has[3], *lacks[2];
    } cases[] = {
        {"olmo2", "", {"blk.2.post_attention_norm.weight", "blk.2.post_ffw_norm.weight",
                       "blk.2.attn_q_norm.weight"},
         {"blk.0.attn_norm.weight", "blk.0.ffn_norm.weight"}},
        {"granitemoe", "--experts 4 --experts-used 2",
         {"blk.3.ffn_gate_inp.weight", "blk.3.ffn_up_exps.weight", "blk.0.attn_norm.weight"},
         {"blk.0.ffn_up_shexp.weight", "blk.0.ffn_gate.weight"}},
        {"granitemoe", "--experts 4 --experts-used 2 --shared-ffn 64",
         {"blk.3.ffn_down_exps.weight", "blk.3.ffn_gate_shexp.weight",
          "blk.1.ffn_down_shexp.weight"},
         {"blk.0.ffn_gate_inp_shexp.weight", "blk.0.ffn_down.weight"}},
        {"smollm3", "",
         {"blk.3.attn_q.weight", "blk.3.attn_norm.weight", "blk.3.ffn_gate.weight"},
         {"blk.0.attn_q_norm.weight", "blk.0.post_ffw_norm.weight"}},
        {"exaone", "", {"blk.1.attn_k.weight", "blk.1.ffn_norm.weight", "output.weight"},
         {"blk.0.attn_qkv.weight", "blk.0.attn_q.bias"}},
        {"stablelm", "", {"output_norm.bias", "blk.3.ffn_norm.bias", "blk.3.attn_v.bias"},
         {"blk.0.attn_q_norm.weight", "blk.0.post_ffw_norm.weight"}},
        {"glm4", "", {"blk.3.post_ffw_norm.weight", "blk.3.attn_q.bias", "blk.0.ffn_up.weight"},
         {"blk.0.ffn_gate.weight", "blk.0.attn_qkv.weight"}},
        {"chatglm", "", {"blk.3.attn_qkv.bias", "blk.3.attn_qkv.weight", "blk.0.ffn_up.weight"},
         {"blk.0.post_ffw_norm.weight", "blk.0.attn_q.weight"}},
        {"mistral3", "--rope-orig-ctx 16",
         {"blk.3.attn_q.weight", "blk.3.ffn_norm.weight", "output.weight"},
         {"blk.0.attn_q_norm.weight", "rope_factors_long.weight"}},
        {"exaone4", "--sliding-window 32",
         {"blk.3.post_ffw_norm.weight", "blk.3.attn_q_norm.weight", "blk.0.ffn_gate.weight"},
         {"blk.0.attn_norm.weight", "blk.0.ffn_norm.weight"}},
        {"command-r", "", {"blk.3.attn_norm.weight", "blk.3.ffn_gate.weight", "output_norm.weight"},
         {"blk.0.ffn_norm.weight", "output.weight"}},
        {"cohere2", "--sliding-window 64",
         {"blk.3.attn_norm.weight", "blk.0.attn_k.weight", "token_embd.weight"},
         {"blk.0.ffn_norm.weight", "output.weight"}},
        {"starcoder2", "", {"blk.3.ffn_up.bias", "blk.3.attn_output.bias", "output_norm.bias"},
         {"blk.0.ffn_gate.weight", "blk.0.attn_q_norm.weight"}},
        {"phi2", "", {"output.bias", "blk.3.attn_norm.bias", "blk.3.ffn_up.bias"},
         {"blk.0.ffn_norm.weight", "blk.0.ffn_gate.weight"}},
        {"seed_oss", "",
         {"blk.3.post_attention_norm.weight", "blk.3.attn_v.bias", "blk.3.ffn_gate.weight"},
         {"blk.0.ffn_norm.weight", "blk.0.attn_output.bias"}},
        {"hunyuan-dense", "",
         {"blk.3.attn_q_norm.weight", "blk.3.attn_k_norm.weight", "blk.3.ffn_norm.weight"},
         {"blk.0.attn_q.bias", "blk.0.post_attention_norm.weight"}},
        {"ernie4_5-moe",
         "--experts 4 --experts-used 2 --expert-ffn 32 --shared-ffn 64 --dense-lead 1 "
         "--exp-probs-b",
         {"blk.0.ffn_gate.weight", "blk.3.exp_probs_b.bias", "blk.3.ffn_up_shexp.weight"},
         {"blk.0.ffn_gate_inp.weight", "blk.3.ffn_gate.weight"}},
        {"glm4moe",
         "--experts 4 --experts-used 2 --expert-ffn 32 --shared-experts 1 --dense-lead 1 "
         "--norm-weights --weights-scale 2.5 --nextn 1",
         {"blk.3.exp_probs_b.bias", "blk.3.post_attention_norm.weight",
          "blk.4.nextn.eh_proj.weight"},
         {"blk.0.ffn_gate_inp.weight", "blk.1.ffn_norm.weight"}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        char out[1100], args[4096], err[1024], e[ERR_MAX];
        snprintf(out, sizeof out, "%s/%s.gguf", test_tmpdir(), cases[c].arch);
        snprintf(args, sizeof args,
                 "-o '%s' --arch %s --dim 64 --layers 4 --heads 4 --ffn 128 --ctx 256 "
                 "--type q8_0 --vocab '%s' %s", out, cases[c].arch, vocab, cases[c].extra);
        CHECK_MSG(mkmodel(args, err, sizeof err) == 0, "mkmodel: %s", err);
        gguf_file *g = gguf_open(out, e);
        CHECK_MSG(g, "%s", e);
        gguf_str s;
        CHECK(gguf_get_str(g, "general.architecture", &s) && gguf_str_eq(s, cases[c].arch));
        for (int i = 0; i < 3 && cases[c].has[i]; i++)
            CHECK_MSG(gguf_find_tensor(g, cases[c].has[i]), "%s: %s", cases[c].arch,
                      cases[c].has[i]);
        for (int i = 0; i < 2 && cases[c].lacks[i]; i++)
            CHECK_MSG(!gguf_find_tensor(g, cases[c].lacks[i]), "%s: %s", cases[c].arch,
                      cases[c].lacks[i]);
        model *m = model_from_gguf(g, e);
        CHECK_MSG(m && !strcmp(model_arch_name(model_hparams_of(m)->arch), cases[c].arch),
                  "%s: %s", cases[c].arch, e);
        const model_hparams *hp = model_hparams_of(m);
        if (!strcmp(cases[c].arch, "mistral3"))
            CHECK(hp->attn_temp_floor == 16 && hp->rope_scaling.freq_scale == 1.0f / 16);
        if (!strcmp(cases[c].arch, "exaone4"))
            CHECK(hp->swa_window == 32 && hp->swa_pattern == 4 && hp->nope_step == 4);
        model_free(m);
        gguf_close(g);
    }
}

/* --arch gemma-embedding writes EmbeddingGemma as llama.cpp reads it: gemma3's tensors
 * without output.weight, the window (512 by default), mean pooling by default, and with
 * --dense the dense_2/dense_3 layers and their feature keys; the encoder loads it. --dense
 * is gemma-embedding's, and rank pooling a bert's. */
static void gemma_embedding_files(void)
{
    const char *vocab = test_data_path("vocab/ggml-vocab-llama-spm.gguf");
    if (!vocab) {
        SKIP("no vocab/ggml-vocab-llama-spm.gguf in the test data");
        return;
    }
    char out[1100], args[4096], err[1024], e[ERR_MAX];
    const char *shape = "--dim 64 --layers 7 --heads 4 --kv-heads 2 --head-dim 32 --ffn 96 "
                        "--ctx 256 --type f16";
    snprintf(out, sizeof out, "%s/gemma-embedding.gguf", test_tmpdir());
    snprintf(args, sizeof args, "-o '%s' --arch gemma-embedding %s --dense 128 --vocab '%s'",
             out, shape, vocab);
    CHECK_MSG(mkmodel(args, err, sizeof err) == 0, "mkmodel: %s", err);
    gguf_file *g = gguf_open(out, e);
    CHECK_MSG(g, "%s", e);
    uint32_t u;
    static const struct {
        const char *key;
        uint32_t value;
    } keys[] = {
        {"gemma-embedding.attention.sliding_window", 512},
        {"gemma-embedding.pooling_type", 1},
        {"gemma-embedding.dense_2_feat_in", 64},
        {"gemma-embedding.dense_2_feat_out", 128},
        {"gemma-embedding.dense_3_feat_in", 128},
        {"gemma-embedding.dense_3_feat_out", 64},
        {"gemma-embedding.attention.key_length", 32},
    };
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        CHECK_MSG(gguf_get_u32(g, keys[i].key, &u) && u == keys[i].value, "%s", keys[i].key);
    const gguf_tensor *d2 = gguf_find_tensor(g, "dense_2.weight");
    const gguf_tensor *d3 = gguf_find_tensor(g, "dense_3.weight");
    CHECK(d2 && d2->ne[0] == 64 && d2->ne[1] == 128 && d3 && d3->ne[0] == 128 && d3->ne[1] == 64);
    CHECK(!gguf_find_tensor(g, "output.weight") &&
          gguf_find_tensor(g, "blk.6.attn_q_norm.weight") &&
          gguf_find_tensor(g, "blk.6.post_ffw_norm.weight"));
    bert_model *m = bert_from_gguf(g, e);
    CHECK_MSG(m, "%s", e);
    bert_free(m);
    gguf_close(g);
    snprintf(args, sizeof args, "-o '%s' --arch gemma3 %s --dense 128 --vocab '%s'", out, shape,
             vocab);
    CHECK(mkmodel(args, err, sizeof err) != 0);
    CHECK_MSG(strstr(err, "dense"), "%s", err);
    snprintf(args, sizeof args, "-o '%s' --arch gemma-embedding %s --pooling rank --vocab '%s'",
             out, shape, vocab);
    CHECK(mkmodel(args, err, sizeof err) != 0);
    CHECK_MSG(strstr(err, "pooling"), "%s", err);
}

/* deepseek2's options reach the file: V3's shape (q_lora, sigmoid gating, groups, the
 * selection bias, norm and scale, two shared experts) and V2's YaRN, then V2-Lite's
 * (attn_q, no optional keys); bad shapes are refused naming what is wrong. */
static void deepseek2_files(void)
{
    const char *vocab = test_data_path("vocab/ggml-vocab-gpt-2.gguf");
    if (!vocab)
        SKIP("test data vocab/ggml-vocab-gpt-2.gguf is absent");
    const char *shape = "--arch deepseek2 --dim 64 --layers 2 --heads 2 --ffn 96 --ctx 256 "
                        "--experts 4 --experts-used 2 --expert-ffn 32 --shared-experts 2 "
                        "--kv-lora 32 --qk-nope 32 --qk-rope 16 --v-head 32 --dense-lead 1";
    char out[1100], args[4096], err[1024], e[ERR_MAX];
    snprintf(out, sizeof out, "%s/deepseek2.gguf", test_tmpdir());
    snprintf(args, sizeof args, "-o '%s' %s --q-lora 32 --gating sigmoid --norm-weights "
             "--weights-scale 2.5 --expert-groups 2 --groups-used 1 --exp-probs-b "
             "--yarn-factor 4 --mscale-all-dim 0.707 --type q8_0 --vocab '%s'", out, shape, vocab);
    CHECK_MSG(mkmodel(args, err, sizeof err) == 0, "mkmodel: %s", err);
    gguf_file *g = gguf_open(out, e);
    CHECK_MSG(g, "%s", e);
    uint32_t u;
    float f;
    bool b;
    gguf_str s;
    CHECK(gguf_get_u32(g, "deepseek2.attention.q_lora_rank", &u) && u == 32);
    CHECK(gguf_get_u32(g, "deepseek2.attention.key_length", &u) && u == 48);
    CHECK(gguf_get_u32(g, "deepseek2.attention.key_length_mla", &u) && u == 48);
    CHECK(gguf_get_u32(g, "deepseek2.expert_gating_func", &u) && u == 2);
    CHECK(gguf_get_u32(g, "deepseek2.expert_group_count", &u) && u == 2);
    CHECK(gguf_get_u32(g, "deepseek2.expert_group_used_count", &u) && u == 1);
    CHECK(gguf_get_u32(g, "deepseek2.expert_shared_count", &u) && u == 2);
    CHECK(gguf_get_u32(g, "deepseek2.leading_dense_block_count", &u) && u == 1);
    CHECK(gguf_get_u32(g, "deepseek2.rope.scaling.original_context_length", &u) && u == 64);
    CHECK(gguf_get_bool(g, "deepseek2.expert_weights_norm", &b) && b);
    CHECK(gguf_get_f32(g, "deepseek2.expert_weights_scale", &f) && f == 2.5f);
    CHECK(gguf_get_f32(g, "deepseek2.rope.scaling.yarn_log_multiplier", &f) &&
          fabsf(f - 0.0707f) < 1e-6f);
    CHECK(gguf_get_str(g, "deepseek2.rope.scaling.type", &s) && gguf_str_eq(s, "yarn"));
    const gguf_tensor *t = gguf_find_tensor(g, "blk.1.attn_k_b.weight");
    CHECK(t && t->n_dims == 3 && t->ne[0] == 32 && t->ne[1] == 32 && t->ne[2] == 2 &&
          t->type == QTYPE_Q8_0);
    t = gguf_find_tensor(g, "blk.1.ffn_up_shexp.weight");
    CHECK(t && t->ne[0] == 64 && t->ne[1] == 64);
    CHECK(gguf_find_tensor(g, "blk.1.exp_probs_b.bias") && gguf_find_tensor(g, "blk.0.attn_q_b.weight") &&
          gguf_find_tensor(g, "blk.0.ffn_gate.weight") && !gguf_find_tensor(g, "blk.0.attn_q.weight"));
    gguf_close(g);

    snprintf(args, sizeof args, "-o '%s' %s --type q8_0 --vocab '%s'", out, shape, vocab);
    CHECK_MSG(mkmodel(args, err, sizeof err) == 0, "mkmodel: %s", err);
    g = gguf_open(out, e);
    CHECK_MSG(g, "%s", e);
    CHECK(gguf_find_tensor(g, "blk.0.attn_q.weight") && !gguf_find_tensor(g, "blk.0.attn_q_a.weight"));
    CHECK(gguf_find_key(g, "deepseek2.attention.q_lora_rank") < 0 &&
          gguf_find_key(g, "deepseek2.expert_gating_func") < 0 &&
          gguf_find_key(g, "deepseek2.expert_group_count") < 0 &&
          gguf_find_key(g, "deepseek2.rope.scaling.type") < 0 &&
          !gguf_find_tensor(g, "blk.1.exp_probs_b.bias"));
    gguf_close(g);

    snprintf(args, sizeof args, "-o '%s' %s --expert-groups 3 --groups-used 1 --type q8_0 "
             "--vocab '%s'", out, shape, vocab);
    CHECK(mkmodel(args, err, sizeof err) != 0);
    CHECK_MSG(strstr(err, "expert groups"), "%s", err);
    snprintf(args, sizeof args, "-o '%s' %s --gating relu --type q8_0 --vocab '%s'", out, shape,
             vocab);
    CHECK_EQ(mkmodel(args, err, sizeof err), 2);
    CHECK_MSG(strstr(err, "--gating"), "%s", err);
    snprintf(args, sizeof args, "-o '%s' --arch llama --dim 64 --layers 2 --heads 2 --ffn 96 "
             "--ctx 256 --kv-lora 32 --type q8_0 --vocab '%s'", out, vocab);
    CHECK(mkmodel(args, err, sizeof err) != 0);
    CHECK_MSG(strstr(err, "deepseek2's"), "%s", err);
}

int main(int argc, char **argv)
{
    (void)argc;
    char self[1024];
    snprintf(self, sizeof self, "%s", argv[0]);
    /* build/tests/tools/test_mkmodel -> build/mkmodel */
    const char *dir = dirname(self);
    snprintf(mkmodel_path, sizeof mkmodel_path, "%s/../../mkmodel", dir);
    snprintf(llms_run_path, sizeof llms_run_path, "%s/../../llms-run", dir);
    snprintf(q8_path, sizeof q8_path, "%s/q8.gguf", test_tmpdir());
    snprintf(f32_path, sizeof f32_path, "%s/f32.gguf", test_tmpdir());
    snprintf(back_path, sizeof back_path, "%s/back.gguf", test_tmpdir());
    modelgen_params mp = {.arch = "llama", .dim = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2,
                          .n_ff = 128, .n_ctx = 256, .type = QTYPE_Q8_0, .seed = 3,
                          .n_vocab = 300, .n_threads = 1};
    char err[ERR_MAX];
    if (modelgen_write(&mp, q8_path, err) < 0) {
        fprintf(stderr, "modelgen: %s\n", err);
        return 1;
    }
    RUN(q8_0_to_f32_and_back);
    RUN(conversions_do_not_depend_on_threads);
    RUN(bad_conversions_are_refused);
    RUN(lora_of_writes_llama_cpp_adapters);
    RUN(from_merges_adapters);
    RUN(bad_adapters_are_refused);
    RUN(mixes_keep_docs_lm_perplexity);
    RUN(phi3_and_granite);
    RUN(experts_in_llama_cpp_layout);
    RUN(gemma_files);
    RUN(gptoss_files);
    RUN(small_arch_files);
    RUN(gemma_embedding_files);
    RUN(deepseek2_files);
    return test_finish();
}
