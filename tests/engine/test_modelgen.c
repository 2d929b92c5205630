/* Tests of the random-weight model generator: determinism and what it writes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf/gguf.h"
#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"
#include "tests/support/test.h"

static modelgen_params small_params(uint64_t seed, int n_threads)
{
    return (modelgen_params){
        .arch = "qwen2", .dim = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2,
        .n_ff = 96, .n_ctx = 128, .type = QTYPE_Q8_0,
        .seed = seed, .n_vocab = 300, .n_threads = n_threads,
    };
}

/* Reads a whole file; NULL on failure. */
static unsigned char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)n);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static int write_model(uint64_t seed, int n_threads, const char *name, char *path, size_t cap)
{
    char err[ERR_MAX];
    modelgen_params p = small_params(seed, n_threads);
    snprintf(path, cap, "%s/%s", test_tmpdir(), name);
    if (modelgen_write(&p, path, err)) {
        printf("       modelgen_write: %s\n", err);
        return -1;
    }
    return 0;
}

static void same_seed_gives_identical_files_whatever_the_threads(void)
{
    char a[512], b[512], c[512];
    size_t na, nb, nc;
    CHECK(write_model(42, 1, "a.gguf", a, sizeof a) == 0);
    CHECK(write_model(42, 2, "b.gguf", b, sizeof b) == 0);
    CHECK(write_model(43, 2, "c.gguf", c, sizeof c) == 0);
    unsigned char *fa = slurp(a, &na), *fb = slurp(b, &nb), *fc = slurp(c, &nc);
    CHECK(fa && fb && fc);
    bool same_ab = na == nb && memcmp(fa, fb, na) == 0;
    bool same_ac = na == nc && memcmp(fa, fc, na) == 0;
    free(fa);
    free(fb);
    free(fc);
    CHECK_MSG(same_ab, "seed 42 with 1 and 2 threads wrote different files");
    CHECK_MSG(!same_ac, "seeds 42 and 43 wrote the same file");
}

static void written_model_has_the_requested_shape(void)
{
    char path[512], err[ERR_MAX];
    CHECK(write_model(7, 2, "shape.gguf", path, sizeof path) == 0);
    gguf_file *g = gguf_open(path, err);
    CHECK_MSG(g != NULL, "%s", err);
    gguf_str arch;
    uint32_t dim = 0, layers = 0;
    bool ok = gguf_get_str(g, "general.architecture", &arch) && gguf_str_eq(arch, "qwen2") &&
              gguf_get_u32(g, "qwen2.embedding_length", &dim) &&
              gguf_get_u32(g, "qwen2.block_count", &layers);
    const gguf_tensor *q = gguf_find_tensor(g, "blk.1.attn_q.weight");
    const gguf_tensor *qb = gguf_find_tensor(g, "blk.1.attn_q.bias");
    const gguf_tensor *norm = gguf_find_tensor(g, "blk.0.attn_norm.weight");
    bool shapes = q && q->type == QTYPE_Q8_0 && q->ne[0] == 64 && q->ne[1] == 64 && qb &&
                  qb->type == QTYPE_F32 && norm && norm->type == QTYPE_F32;
    gguf_close(g);
    CHECK(ok);
    CHECK_EQ(dim, 64);
    CHECK_EQ(layers, 2);
    CHECK_MSG(shapes, "unexpected tensor types or shapes");
}

/* The _M mix over 22 layers (TinyLlama's count) puts Q6_K where llama.cpp's quantize
 * does for Q4_K_M: the output, and attn_v and ffn_down of layers 0-1, 4, 7, 10, 13, 16
 * and 19-21; everything else stays Q4_K. */
static void k_m_mix_widens_the_tensors_llama_cpp_widens(void)
{
    char err[ERR_MAX], path[512];
    modelgen_params p = {
        .arch = "llama", .dim = 256, .n_layer = 22, .n_head = 4, .n_head_kv = 2, .n_ff = 512,
        .n_ctx = 64, .type = QTYPE_Q4_K, .mix = MODELGEN_MIX_Q4_K_M, .seed = 3, .n_vocab = 300,
        .n_threads = 2,
    };
    snprintf(path, sizeof path, "%s/q4_k_m.gguf", test_tmpdir());
    CHECK_MSG(modelgen_write(&p, path, err) == 0, "%s", err);
    gguf_file *g = gguf_open(path, err);
    CHECK_MSG(g != NULL, "%s", err);
    static const int wide[] = {0, 1, 4, 7, 10, 13, 16, 19, 20, 21};
    bool ok = true;
    for (int l = 0; l < p.n_layer; l++) {
        bool w = false;
        for (size_t i = 0; i < sizeof wide / sizeof *wide; i++)
            w = w || wide[i] == l;
        static const char *const names[] = {"attn_q", "attn_k", "attn_v", "attn_output",
                                            "ffn_gate", "ffn_up", "ffn_down"};
        for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
            char nm[64];
            snprintf(nm, sizeof nm, "blk.%d.%s.weight", l, names[k]);
            const gguf_tensor *t = gguf_find_tensor(g, nm);
            bool mixed = !strcmp(names[k], "attn_v") || !strcmp(names[k], "ffn_down");
            uint32_t want = w && mixed ? QTYPE_Q6_K : QTYPE_Q4_K;
            if (!t || t->type != want) {
                printf("       %s: type %d, want %d\n", nm, t ? (int)t->type : -1, (int)want);
                ok = false;
            }
        }
    }
    const gguf_tensor *out = gguf_find_tensor(g, "output.weight");
    const gguf_tensor *emb = gguf_find_tensor(g, "token_embd.weight");
    ok = ok && out && out->type == QTYPE_Q6_K && emb && emb->type == QTYPE_Q4_K;
    gguf_close(g);
    CHECK_MSG(ok, "unexpected tensor types");
}

/* llama-quantize's choices, per mix, for a 22-layer model (TinyLlama's count) whose
 * attention has 2 heads a KV head, rows whole super-blocks: the tensors a mix gives
 * another type than its own, and those it leaves. */
static void mixes_choose_llama_cpp_types(void)
{
    static const struct {
        modelgen_mix mix;
        uint32_t type;
        const char *name;
        int n_gqa;
        bool has_output;
        uint32_t want;
    } cases[] = {
        {MODELGEN_MIX_Q3_K_M, QTYPE_Q3_K, "blk.0.attn_v.weight", 2, true, QTYPE_Q5_K},
        {MODELGEN_MIX_Q3_K_M, QTYPE_Q3_K, "blk.1.attn_v.weight", 2, true, QTYPE_Q5_K},
        {MODELGEN_MIX_Q3_K_M, QTYPE_Q3_K, "blk.2.attn_v.weight", 2, true, QTYPE_Q4_K},
        {MODELGEN_MIX_Q3_K_M, QTYPE_Q3_K, "blk.0.ffn_down.weight", 2, true, QTYPE_Q5_K},
        {MODELGEN_MIX_Q3_K_M, QTYPE_Q3_K, "blk.1.ffn_down.weight", 2, true, QTYPE_Q4_K},
        {MODELGEN_MIX_Q3_K_M, QTYPE_Q3_K, "blk.21.ffn_down.weight", 2, true, QTYPE_Q4_K},
        {MODELGEN_MIX_Q3_K_M, QTYPE_Q3_K, "blk.5.attn_output.weight", 2, true, QTYPE_Q4_K},
        {MODELGEN_MIX_Q3_K_M, QTYPE_Q3_K, "blk.5.attn_q.weight", 2, true, QTYPE_Q3_K},
        {MODELGEN_MIX_Q3_K_M, QTYPE_Q3_K, "blk.5.attn_k.weight", 2, true, QTYPE_Q3_K},
        {MODELGEN_MIX_Q3_K_M, QTYPE_Q3_K, "blk.5.ffn_up.weight", 2, true, QTYPE_Q3_K},
        {MODELGEN_MIX_Q3_K_M, QTYPE_Q3_K, "blk.5.ffn_gate.weight", 2, true, QTYPE_Q3_K},
        {MODELGEN_MIX_Q3_K_M, QTYPE_Q3_K, "blk.5.attn_qkv.weight", 2, true, QTYPE_Q4_K},
        {MODELGEN_MIX_Q3_K_M, QTYPE_Q3_K, "output.weight", 2, true, QTYPE_Q6_K},
        {MODELGEN_MIX_Q3_K_M, QTYPE_Q3_K, "token_embd.weight", 2, true, QTYPE_Q3_K},
        /* no output.weight: the embedding is the output, and gets its type */
        {MODELGEN_MIX_Q3_K_M, QTYPE_Q3_K, "token_embd.weight", 2, false, QTYPE_Q6_K},
        {MODELGEN_MIX_Q3_K_L, QTYPE_Q3_K, "blk.9.attn_v.weight", 2, true, QTYPE_Q5_K},
        {MODELGEN_MIX_Q3_K_L, QTYPE_Q3_K, "blk.9.ffn_down.weight", 2, true, QTYPE_Q5_K},
        {MODELGEN_MIX_Q3_K_L, QTYPE_Q3_K, "blk.9.attn_output.weight", 2, true, QTYPE_Q5_K},
        {MODELGEN_MIX_Q3_K_L, QTYPE_Q3_K, "blk.9.ffn_up.weight", 2, true, QTYPE_Q3_K},
        {MODELGEN_MIX_Q3_K_S, QTYPE_Q3_K, "blk.0.attn_v.weight", 2, true, QTYPE_Q3_K},
        {MODELGEN_MIX_Q3_K_S, QTYPE_Q3_K, "blk.0.ffn_down.weight", 2, true, QTYPE_Q3_K},
        {MODELGEN_MIX_Q3_K_S, QTYPE_Q3_K, "blk.0.attn_output.weight", 2, true, QTYPE_Q3_K},
        {MODELGEN_MIX_Q3_K_S, QTYPE_Q3_K, "output.weight", 2, true, QTYPE_Q6_K},
        {MODELGEN_MIX_Q4_K_M, QTYPE_Q4_K, "blk.4.attn_v.weight", 2, true, QTYPE_Q6_K},
        {MODELGEN_MIX_Q4_K_M, QTYPE_Q4_K, "blk.5.attn_v.weight", 2, true, QTYPE_Q4_K},
        {MODELGEN_MIX_Q4_K_M, QTYPE_Q4_K, "blk.5.attn_qkv.weight", 2, true, QTYPE_Q5_K},
        {MODELGEN_MIX_Q5_K_M, QTYPE_Q5_K, "blk.21.ffn_down.weight", 2, true, QTYPE_Q6_K},
        {MODELGEN_MIX_Q5_K_M, QTYPE_Q5_K, "blk.5.attn_qkv.weight", 2, true, QTYPE_Q6_K},
        {MODELGEN_MIX_Q2_K, QTYPE_Q2_K, "blk.3.attn_v.weight", 2, true, QTYPE_Q3_K},
        {MODELGEN_MIX_Q2_K, QTYPE_Q2_K, "blk.3.attn_v.weight", 4, true, QTYPE_Q4_K},
        {MODELGEN_MIX_Q2_K, QTYPE_Q2_K, "blk.3.ffn_down.weight", 2, true, QTYPE_Q3_K},
        {MODELGEN_MIX_Q2_K, QTYPE_Q2_K, "blk.3.attn_output.weight", 2, true, QTYPE_Q3_K},
        {MODELGEN_MIX_Q2_K, QTYPE_Q2_K, "blk.3.ffn_up.weight", 2, true, QTYPE_Q2_K},
        {MODELGEN_MIX_Q2_K, QTYPE_Q2_K, "blk.3.attn_k.weight", 2, true, QTYPE_Q2_K},
        {MODELGEN_MIX_Q2_K, QTYPE_Q2_K, "output.weight", 2, true, QTYPE_Q6_K},
        {MODELGEN_MIX_Q2_K, QTYPE_Q2_K, "token_embd.weight", 2, true, QTYPE_Q2_K},
        {MODELGEN_MIX_IQ4_XS, QTYPE_IQ4_XS, "blk.3.attn_v.weight", 2, true, QTYPE_IQ4_XS},
        {MODELGEN_MIX_IQ4_XS, QTYPE_IQ4_XS, "blk.3.attn_v.weight", 4, true, QTYPE_Q5_K},
        {MODELGEN_MIX_IQ4_NL, QTYPE_IQ4_NL, "blk.1.ffn_down.weight", 2, true, QTYPE_Q5_K},
        {MODELGEN_MIX_IQ4_NL, QTYPE_IQ4_NL, "blk.3.ffn_down.weight", 2, true, QTYPE_IQ4_NL},
        {MODELGEN_MIX_IQ4_NL, QTYPE_IQ4_NL, "output.weight", 2, true, QTYPE_Q6_K},
        {MODELGEN_MIX_IQ4_NL, QTYPE_IQ4_NL, "blk.3.attn_output.weight", 2, true, QTYPE_IQ4_NL},
        {MODELGEN_MIX_NONE, QTYPE_Q4_K, "output.weight", 2, true, QTYPE_Q4_K},
        {MODELGEN_MIX_NONE, QTYPE_Q3_K, "blk.0.attn_v.weight", 2, true, QTYPE_Q3_K},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        uint32_t got = modelgen_mix_type(cases[i].mix, cases[i].type, cases[i].name, 2048, 22,
                                         cases[i].n_gqa, cases[i].has_output);
        CHECK_MSG(got == cases[i].want, "case %zu, %s: %s, want %s", i, cases[i].name,
                  quant_traits_of(got)->name, quant_traits_of(cases[i].want)->name);
    }
}

/* Rows that are not whole super-blocks take llama-quantize's fallbacks: Q4_K -> Q5_0,
 * Q5_K -> Q5_1, Q6_K -> Q8_0, Q2_K/Q3_K/IQ4_XS -> IQ4_NL, and F16 where no 32-element block fits
 * either; the output of such a model is Q8_0. Whole rows keep their type. */
static void mixes_fall_back_where_rows_are_not_whole_blocks(void)
{
    static const struct {
        modelgen_mix mix;
        uint32_t type;
        const char *name;
        int64_t cols;
        uint32_t want;
    } cases[] = {
        {MODELGEN_MIX_Q3_K_M, QTYPE_Q3_K, "blk.5.attn_q.weight", 288, QTYPE_IQ4_NL},
        {MODELGEN_MIX_Q2_K, QTYPE_Q2_K, "blk.5.ffn_up.weight", 288, QTYPE_IQ4_NL},
        {MODELGEN_MIX_Q2_K, QTYPE_Q2_K, "blk.5.attn_v.weight", 288, QTYPE_IQ4_NL},
        {MODELGEN_MIX_IQ4_XS, QTYPE_IQ4_XS, "blk.5.ffn_up.weight", 288, QTYPE_IQ4_NL},
        {MODELGEN_MIX_Q3_K_M, QTYPE_Q3_K, "blk.5.attn_output.weight", 288, QTYPE_Q5_0},
        {MODELGEN_MIX_Q3_K_L, QTYPE_Q3_K, "blk.5.ffn_down.weight", 288, QTYPE_Q5_1},
        {MODELGEN_MIX_Q4_K_M, QTYPE_Q4_K, "blk.0.attn_v.weight", 288, QTYPE_Q8_0},
        {MODELGEN_MIX_Q4_K_M, QTYPE_Q4_K, "blk.5.attn_q.weight", 288, QTYPE_Q5_0},
        {MODELGEN_MIX_Q3_K_M, QTYPE_Q3_K, "output.weight", 288, QTYPE_Q8_0},
        {MODELGEN_MIX_Q3_K_M, QTYPE_Q3_K, "blk.5.attn_q.weight", 40, QTYPE_F16},
        {MODELGEN_MIX_Q3_K_M, QTYPE_Q3_K, "blk.5.attn_q.weight", 1280, QTYPE_Q3_K},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        uint32_t got = modelgen_mix_type(cases[i].mix, cases[i].type, cases[i].name,
                                         cases[i].cols, 22, 2, true);
        CHECK_MSG(got == cases[i].want, "case %zu, %s of %lld: %s, want %s", i, cases[i].name,
                  (long long)cases[i].cols, quant_traits_of(got)->name,
                  quant_traits_of(cases[i].want)->name);
    }
}

/* The generator writes each matrix in the type the mix gives it (Q3_K_M over 22 layers,
 * the output tied: the embedding in Q6_K). */
static void generator_writes_the_mix(void)
{
    char err[ERR_MAX], path[512];
    modelgen_params p = {
        .arch = "llama", .dim = 256, .n_layer = 22, .n_head = 4, .n_head_kv = 2, .n_ff = 512,
        .n_ctx = 64, .type = QTYPE_Q3_K, .mix = MODELGEN_MIX_Q3_K_M, .seed = 3, .n_vocab = 300,
        .n_threads = 2, .tie_output = true,
    };
    snprintf(path, sizeof path, "%s/q3_k_m.gguf", test_tmpdir());
    CHECK_MSG(modelgen_write(&p, path, err) == 0, "%s", err);
    gguf_file *g = gguf_open(path, err);
    CHECK_MSG(g != NULL, "%s", err);
    int checked = 0;
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        if (t->n_dims != 2)
            continue;
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        uint32_t want = modelgen_mix_type(p.mix, p.type, name, t->ne[0], p.n_layer, 2, false);
        CHECK_MSG(t->type == want, "%s: %s, want %s", name, quant_traits_of(t->type)->name,
                  quant_traits_of(want)->name);
        checked++;
    }
    CHECK_EQ(checked, 1 + 7 * p.n_layer);
    const gguf_tensor *emb = gguf_find_tensor(g, "token_embd.weight");
    CHECK(emb && emb->type == QTYPE_Q6_K);
    gguf_close(g);
}

static void bad_parameters_are_refused(void)
{
    char err[ERR_MAX], path[512];
    snprintf(path, sizeof path, "%s/bad.gguf", test_tmpdir());
    modelgen_params p = small_params(1, 1);
    p.n_head = 3; /* 64 is not divisible by 3 */
    CHECK(modelgen_write(&p, path, err) != 0);
    p = small_params(1, 1);
    p.arch = "gpt-j";
    CHECK(modelgen_write(&p, path, err) != 0);
    CHECK(strstr(err, "gpt-j") != NULL);
}

typedef struct progress_seen {
    int calls, last_done, total;
    int in_order; /* every call was the one after the last */
} progress_seen;

static void record_progress(int done, int total, void *user)
{
    progress_seen *ps = user;
    ps->in_order &= done == ps->last_done + 1 && (ps->calls == 0 || total == ps->total);
    ps->calls++;
    ps->last_done = done;
    ps->total = total;
}

/* Progress is reported once per tensor, in order, ending at the total: 3 global tensors
 * (qwen2) plus 12 per layer. */
static void progress_counts_every_tensor(void)
{
    char err[ERR_MAX], path[512];
    modelgen_params p = small_params(1, 1);
    progress_seen ps = {.in_order = 1};
    p.progress = record_progress;
    p.progress_user = &ps;
    snprintf(path, sizeof path, "%s/progress.gguf", test_tmpdir());
    CHECK_MSG(modelgen_write(&p, path, err) == 0, "%s", err);
    CHECK(ps.in_order);
    CHECK_EQ(ps.total, 3 + 12 * p.n_layer);
    CHECK_EQ(ps.calls, ps.total);
    CHECK_EQ(ps.last_done, ps.total);
}

int main(void)
{
    RUN(progress_counts_every_tensor);
    RUN(same_seed_gives_identical_files_whatever_the_threads);
    RUN(written_model_has_the_requested_shape);
    RUN(k_m_mix_widens_the_tensors_llama_cpp_widens);
    RUN(mixes_choose_llama_cpp_types);
    RUN(mixes_fall_back_where_rows_are_not_whole_blocks);
    RUN(generator_writes_the_mix);
    RUN(bad_parameters_are_refused);
    return test_finish();
}
