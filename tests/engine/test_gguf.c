/* Tests of the GGUF reader and writer: real files, round trips, and malformed input. */
#include "engine/gguf/gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/quant/quant.h"
#include "tests/support/test.h"

/* ---- helpers ---- */

static bool contains(const char *s, const char *needle)
{
    return strstr(s, needle) != NULL;
}

static char *tmp_path(const char *name)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", test_tmpdir(), name);
    return path;
}

static unsigned char *read_whole(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *p = malloc(n > 0 ? (size_t)n : 1);
    if (p && fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    *size = (size_t)n;
    return p;
}

/* Raw little-endian byte builder, for files the writer would refuse to produce. */
typedef struct bytes {
    unsigned char p[4096];
    size_t n;
} bytes;

static void put(bytes *b, const void *src, size_t n)
{
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void put_u8(bytes *b, uint8_t v)
{
    put(b, &v, 1);
}

static void put_u32(bytes *b, uint32_t v)
{
    put(b, &v, 4);
}

static void put_u64(bytes *b, uint64_t v)
{
    put(b, &v, 8);
}

static void put_str(bytes *b, const char *s)
{
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}

static void patch_u32(bytes *b, size_t at, uint32_t v)
{
    memcpy(b->p + at, &v, 4);
}

static void patch_u64(bytes *b, size_t at, uint64_t v)
{
    memcpy(b->p + at, &v, 8);
}

/* Offsets of the fields of the base file that the corruption tests change. */
typedef struct marks {
    size_t version, n_tensors, n_kv;
    size_t kv0_strlen, kv0_type, kv1_value, kv2_count, kv3_key, kv4_key;
    size_t t0_name, t0_ndims, t0_ne0, t0_ne1, t0_type, t1_name, t1_ne0, t1_offset;
} marks;

/* A small valid file: 5 kvs, tensors t0 (F32, 4x2) and t1 (Q8_0, 32). */
static void base_file(bytes *b, marks *m)
{
    b->n = 0;
    put(b, "GGUF", 4);
    m->version = b->n;
    put_u32(b, 3);
    m->n_tensors = b->n;
    put_u64(b, 2);
    m->n_kv = b->n;
    put_u64(b, 5);

    put_str(b, "general.architecture");
    m->kv0_type = b->n;
    put_u32(b, GGUF_STRING);
    m->kv0_strlen = b->n;
    put_str(b, "llama");

    put_str(b, "general.alignment");
    put_u32(b, GGUF_UINT32);
    m->kv1_value = b->n;
    put_u32(b, 32);

    put_str(b, "tokenizer.ggml.tokens");
    put_u32(b, GGUF_ARRAY);
    put_u32(b, GGUF_STRING);
    m->kv2_count = b->n;
    put_u64(b, 2);
    put_str(b, "a");
    put_str(b, "bc");

    m->kv3_key = b->n + 8;
    put_str(b, "x.a");
    put_u32(b, GGUF_UINT8);
    put_u8(b, 7);
    m->kv4_key = b->n + 8;
    put_str(b, "x.b");
    put_u32(b, GGUF_INT8);
    put_u8(b, 0xff);

    m->t0_name = b->n + 8;
    put_str(b, "t0");
    m->t0_ndims = b->n;
    put_u32(b, 2);
    m->t0_ne0 = b->n;
    put_u64(b, 4);
    m->t0_ne1 = b->n;
    put_u64(b, 2);
    m->t0_type = b->n;
    put_u32(b, QTYPE_F32);
    put_u64(b, 0);

    m->t1_name = b->n + 8;
    put_str(b, "t1");
    put_u32(b, 1);
    m->t1_ne0 = b->n;
    put_u64(b, 32);
    put_u32(b, QTYPE_Q8_0);
    m->t1_offset = b->n;
    put_u64(b, 32);

    while (b->n % 32)
        put_u8(b, 0);
    for (int i = 0; i < 32 + 34; i++)
        put_u8(b, (uint8_t)i);
}

/* Opens b from an exactly-sized heap copy (so ASan sees any read past its end) and
 * reports whether it was rejected. */
static bool rejected(const bytes *b, char *err)
{
    unsigned char *copy = malloc(b->n ? b->n : 1);
    memcpy(copy, b->p, b->n);
    err[0] = '\0';
    gguf_file *g = gguf_open_memory(copy, b->n, err);
    gguf_close(g);
    free(copy);
    return g == NULL;
}

/* Expects opening b to fail with a message containing needle. */
#define CHECK_REJECTED(b, needle)                                                  \
    do {                                                                           \
        char err_[ERR_MAX];                                                        \
        CHECK_MSG(rejected(b, err_), "file was accepted, expected an error about '%s'", \
                  needle);                                                         \
        CHECK_MSG(contains(err_, needle), "error '%s' lacks '%s'", err_, needle);  \
    } while (0)

/* ---- real files ---- */

static gguf_file *open_testdata(const char *rel)
{
    const char *path = test_data_path(rel);
    if (!path)
        return NULL;
    char err[ERR_MAX];
    gguf_file *g = gguf_open(path, err);
    if (!g)
        printf("       %s: %s\n", rel, err);
    return g;
}

static void reads_llama_spm_vocab(void)
{
    if (!test_data_path("vocab/ggml-vocab-llama-spm.gguf"))
        SKIP("vocab/ggml-vocab-llama-spm.gguf not found (set LLMS_TESTDATA)");
    gguf_file *g = open_testdata("vocab/ggml-vocab-llama-spm.gguf");
    CHECK(g);
    gguf_str s;
    CHECK(gguf_get_str(g, "tokenizer.ggml.model", &s) && gguf_str_eq(s, "llama"));
    CHECK(gguf_get_str(g, "general.architecture", &s) && gguf_str_eq(s, "llama"));
    CHECK_EQ(gguf_version(g), 3);
    CHECK_EQ(gguf_n_kv(g), 22);
    CHECK_EQ(gguf_n_tensors(g), 0);
    enum gguf_value_type et;
    uint64_t count;
    CHECK(gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &count));
    CHECK_EQ(et, GGUF_STRING);
    CHECK_EQ(count, 32000);
    CHECK(gguf_arr_str(g, "tokenizer.ggml.tokens", 1, &s) && gguf_str_eq(s, "<s>"));
    CHECK(gguf_arr_str(g, "tokenizer.ggml.tokens", 450, &s) && gguf_str_eq(s, "\xe2\x96\x81The"));
    CHECK(!gguf_arr_str(g, "tokenizer.ggml.tokens", 32000, &s));
    static float scores[32000];
    CHECK(gguf_arr_f32(g, "tokenizer.ggml.scores", scores, 32000));
    CHECK_NEAR(scores[1000], -741.0f, 0);
    CHECK(!gguf_arr_f32(g, "tokenizer.ggml.scores", scores, 31999));
    static int32_t types[32000];
    CHECK(gguf_arr_i32(g, "tokenizer.ggml.token_type", types, 32000));
    CHECK_EQ(types[0], 2);
    CHECK_EQ(types[3], 6);
    uint32_t u;
    CHECK(gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &u) && u == 1);
    CHECK(gguf_get_u32(g, "llama.vocab_size", &u) && u == 32000);
    bool b;
    CHECK(gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b) && b);
    CHECK(gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &b) && !b);
    float f;
    CHECK(gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &f));
    CHECK_NEAR(f, 1e-5, 1e-12);
    /* Type mismatches are refused. */
    CHECK(!gguf_get_u32(g, "tokenizer.ggml.model", &u));
    CHECK(!gguf_get_str(g, "llama.vocab_size", &s));
    CHECK(!gguf_get_f32(g, "llama.vocab_size", &f));
    CHECK(!gguf_get_bool(g, "llama.vocab_size", &b));
    CHECK(!gguf_get_u32(g, "no.such.key", &u));
    CHECK_EQ(gguf_find_key(g, "no.such.key"), -1);
    gguf_close(g);
}

static void reads_gpt2_vocab(void)
{
    if (!test_data_path("vocab/ggml-vocab-gpt-2.gguf"))
        SKIP("vocab/ggml-vocab-gpt-2.gguf not found (set LLMS_TESTDATA)");
    gguf_file *g = open_testdata("vocab/ggml-vocab-gpt-2.gguf");
    CHECK(g);
    gguf_str s;
    CHECK(gguf_get_str(g, "tokenizer.ggml.model", &s) && gguf_str_eq(s, "gpt2"));
    CHECK(gguf_get_str(g, "tokenizer.ggml.pre", &s) && gguf_str_eq(s, "gpt-2"));
    enum gguf_value_type et;
    uint64_t count;
    CHECK(gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &count) && count == 50257);
    CHECK(gguf_arr_str(g, "tokenizer.ggml.tokens", 0, &s) && gguf_str_eq(s, "!"));
    CHECK(gguf_arr_str(g, "tokenizer.ggml.tokens", 262, &s) && gguf_str_eq(s, "\xc4\xa0the"));
    CHECK(gguf_arr_str(g, "tokenizer.ggml.tokens", 50256, &s) && gguf_str_eq(s, "<|endoftext|>"));
    CHECK(gguf_get_arr(g, "tokenizer.ggml.merges", &et, &count) && et == GGUF_STRING);
    CHECK_EQ(count, 50000);
    CHECK(gguf_arr_str(g, "tokenizer.ggml.merges", 0, &s) && gguf_str_eq(s, "\xc4\xa0 t"));
    CHECK(gguf_arr_str(g, "tokenizer.ggml.merges", 49999, &s) &&
          gguf_str_eq(s, "\xc4\xa0g azed"));
    uint32_t u;
    CHECK(gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &u) && u == 50256);
    gguf_close(g);
}

static void reads_bert_vocab(void)
{
    if (!test_data_path("vocab/ggml-vocab-bert-bge.gguf"))
        SKIP("vocab/ggml-vocab-bert-bge.gguf not found (set LLMS_TESTDATA)");
    gguf_file *g = open_testdata("vocab/ggml-vocab-bert-bge.gguf");
    CHECK(g);
    gguf_str s;
    CHECK(gguf_get_str(g, "tokenizer.ggml.model", &s) && gguf_str_eq(s, "bert"));
    enum gguf_value_type et;
    uint64_t count;
    CHECK(gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &count) && count == 30522);
    CHECK(gguf_arr_str(g, "tokenizer.ggml.tokens", 0, &s) && gguf_str_eq(s, "[PAD]"));
    CHECK(gguf_arr_str(g, "tokenizer.ggml.tokens", 101, &s) && gguf_str_eq(s, "[CLS]"));
    CHECK(gguf_arr_str(g, "tokenizer.ggml.tokens", 102, &s) && gguf_str_eq(s, "[SEP]"));
    CHECK(gguf_arr_str(g, "tokenizer.ggml.tokens", 1996, &s) && gguf_str_eq(s, "\xe2\x96\x81the"));
    uint32_t u;
    CHECK(gguf_get_u32(g, "tokenizer.ggml.cls_token_id", &u) && u == 101);
    CHECK(gguf_get_u32(g, "bert.embedding_length", &u) && u == 384);
    bool b;
    CHECK(gguf_get_bool(g, "bert.attention.causal", &b) && !b);
    gguf_close(g);
}

static void reads_stories260k(void)
{
    if (!test_data_path("models/stories260K.gguf"))
        SKIP("models/stories260K.gguf not found (set LLMS_TESTDATA)");
    gguf_file *g = open_testdata("models/stories260K.gguf");
    CHECK(g);
    gguf_str s;
    CHECK(gguf_get_str(g, "general.architecture", &s) && gguf_str_eq(s, "llama"));
    uint32_t u;
    CHECK(gguf_get_u32(g, "llama.block_count", &u) && u == 5);
    CHECK(gguf_get_u32(g, "llama.embedding_length", &u) && u == 64);
    CHECK(gguf_get_u32(g, "llama.feed_forward_length", &u) && u == 172);
    CHECK(gguf_get_u32(g, "llama.attention.head_count", &u) && u == 8);
    CHECK(gguf_get_u32(g, "llama.attention.head_count_kv", &u) && u == 4);
    CHECK(gguf_get_u32(g, "llama.context_length", &u) && u == 512);
    float f;
    CHECK(gguf_get_f32(g, "llama.rope.freq_base", &f) && f == 10000.0f);
    CHECK_EQ(gguf_alignment(g), 32);
    /* token_embd, output_norm, output, and 9 per layer. */
    CHECK_EQ(gguf_n_tensors(g), 3 + 5 * 9);

    const gguf_tensor *t = gguf_find_tensor(g, "token_embd.weight");
    CHECK(t);
    CHECK_EQ(t->n_dims, 2);
    CHECK_EQ(t->ne[0], 64);
    CHECK_EQ(t->ne[1], 512);
    CHECK_EQ(t->ne[2], 1);
    CHECK_EQ(t->type, QTYPE_F32);
    CHECK_EQ(t->bytes, 64 * 512 * 4);
    CHECK_EQ((uintptr_t)t->data % 32, 0);
    t = gguf_find_tensor(g, "blk.4.ffn_down.weight");
    CHECK(t);
    CHECK_EQ(t->ne[0], 172);
    CHECK_EQ(t->ne[1], 64);
    t = gguf_find_tensor(g, "blk.0.attn_k.weight");
    CHECK(t && t->ne[0] == 64 && t->ne[1] == 32);
    CHECK(gguf_find_tensor(g, "blk.5.attn_k.weight") == NULL);
    CHECK(gguf_tensor_at(g, 0) == gguf_find_tensor(g, "token_embd.weight"));
    CHECK(gguf_tensor_at(g, 48) == NULL);

    /* Every weight of a trained model is finite and the norms are not all zero. */
    const gguf_tensor *norm = gguf_find_tensor(g, "output_norm.weight");
    CHECK(norm && norm->n_dims == 1 && norm->ne[0] == 64);
    float w[64];
    memcpy(w, norm->data, sizeof w);
    double sum = 0;
    for (int i = 0; i < 64; i++) {
        CHECK(isfinite(w[i]));
        sum += fabs(w[i]);
    }
    CHECK(sum > 0);
    gguf_close(g);
}

static void missing_file_names_the_path(void)
{
    char err[ERR_MAX];
    CHECK(gguf_open("/nonexistent/x.gguf", err) == NULL);
    CHECK(contains(err, "/nonexistent/x.gguf"));
    CHECK(gguf_open(test_tmpdir(), err) == NULL);
}

/* ---- round trip ---- */

static const char *const rt_strs[] = {"alpha", "", "\xe2\x96\x81unicode", "with\nnewline"};

/* Tensor payloads of the round-trip file. */
static float rt_f32[3 * 5 * 2];
static unsigned char rt_q8[34 * 3];
static unsigned char rt_q4k[144 * 2];
static uint16_t rt_f16[7];
static int8_t rt_i8[2 * 1 * 3 * 2];

static int write_roundtrip_file(const char *path, uint32_t alignment, char *err)
{
    for (size_t i = 0; i < sizeof rt_f32 / sizeof *rt_f32; i++)
        rt_f32[i] = (float)i * 0.5f - 3.0f;
    for (size_t i = 0; i < sizeof rt_q8; i++)
        rt_q8[i] = (unsigned char)(i * 7 + 1);
    for (size_t i = 0; i < sizeof rt_q4k; i++)
        rt_q4k[i] = (unsigned char)(i * 13 + 5);
    for (size_t i = 0; i < 7; i++)
        rt_f16[i] = (uint16_t)(0x3c00 + i * 0x111);
    for (size_t i = 0; i < sizeof rt_i8; i++)
        rt_i8[i] = (int8_t)(i - 10);

    gguf_writer *w = gguf_writer_new();
    if (!w)
        return -1;
    int rc = 0;
    rc |= gguf_writer_set_str(w, "general.architecture", "test");
    rc |= gguf_writer_set_u32(w, "u32", 4000000000u);
    rc |= gguf_writer_set_i32(w, "i32", -123456);
    rc |= gguf_writer_set_f32(w, "f32", 3.25f);
    rc |= gguf_writer_set_bool(w, "bool.t", true);
    rc |= gguf_writer_set_bool(w, "bool.f", false);
    rc |= gguf_writer_set_str(w, "str", "hello, world");
    rc |= gguf_writer_set_str(w, "replaced", "first");
    rc |= gguf_writer_set_u32(w, "replaced", 99);
    if (alignment)
        rc |= gguf_writer_set_u32(w, "general.alignment", alignment);

    const uint8_t a_u8[] = {0, 1, 255};
    const int8_t a_i8[] = {-128, 0, 127};
    const uint16_t a_u16[] = {0, 65535};
    const int16_t a_i16[] = {-32768, 32767};
    const uint32_t a_u32[] = {0, 4294967295u};
    const int32_t a_i32[] = {INT32_MIN, -1, INT32_MAX};
    const uint64_t a_u64[] = {0, UINT64_MAX};
    const int64_t a_i64[] = {INT64_MIN, 5};
    const float a_f32[] = {1.5f, -2.25f, 1e30f};
    const double a_f64[] = {0.1, -1e300};
    const bool a_bool[] = {true, false, true};
    rc |= gguf_writer_set_arr(w, "arr.u8", GGUF_UINT8, a_u8, 3);
    rc |= gguf_writer_set_arr(w, "arr.i8", GGUF_INT8, a_i8, 3);
    rc |= gguf_writer_set_arr(w, "arr.u16", GGUF_UINT16, a_u16, 2);
    rc |= gguf_writer_set_arr(w, "arr.i16", GGUF_INT16, a_i16, 2);
    rc |= gguf_writer_set_arr(w, "arr.u32", GGUF_UINT32, a_u32, 2);
    rc |= gguf_writer_set_arr(w, "arr.i32", GGUF_INT32, a_i32, 3);
    rc |= gguf_writer_set_arr(w, "arr.u64", GGUF_UINT64, a_u64, 2);
    rc |= gguf_writer_set_arr(w, "arr.i64", GGUF_INT64, a_i64, 2);
    rc |= gguf_writer_set_arr(w, "arr.f32", GGUF_FLOAT32, a_f32, 3);
    rc |= gguf_writer_set_arr(w, "arr.f64", GGUF_FLOAT64, a_f64, 2);
    rc |= gguf_writer_set_arr(w, "arr.bool", GGUF_BOOL, a_bool, 3);
    rc |= gguf_writer_set_arr(w, "arr.empty", GGUF_INT32, NULL, 0);
    rc |= gguf_writer_set_str_arr(w, "arr.str", rt_strs, 4);

    rc |= gguf_writer_add_tensor(w, "f32.3d", QTYPE_F32, 3, (const int64_t[]){3, 5, 2}, rt_f32);
    rc |= gguf_writer_add_tensor(w, "q8_0", QTYPE_Q8_0, 2, (const int64_t[]){32, 3}, rt_q8);
    rc |= gguf_writer_add_tensor(w, "f16", QTYPE_F16, 1, (const int64_t[]){7}, rt_f16);
    rc |= gguf_writer_add_tensor(w, "i8.4d", QTYPE_I8, 4, (const int64_t[]){2, 1, 3, 2}, rt_i8);
    /* Last, and a multiple of 32 bytes, so the file ends exactly with its data. */
    rc |= gguf_writer_add_tensor(w, "q4_k", QTYPE_Q4_K, 2, (const int64_t[]){256, 2}, rt_q4k);
    if (rc == 0)
        rc = gguf_writer_write(w, path, err);
    gguf_writer_free(w);
    return rc;
}

static void check_roundtrip(gguf_file *g, size_t alignment)
{
    CHECK_EQ(gguf_version(g), 3);
    CHECK_EQ(gguf_alignment(g), alignment);
    uint32_t u;
    int64_t i;
    float f;
    bool b;
    gguf_str s;
    CHECK(gguf_get_str(g, "general.architecture", &s) && gguf_str_eq(s, "test"));
    CHECK(gguf_get_u32(g, "u32", &u) && u == 4000000000u);
    CHECK(gguf_get_i64(g, "u32", &i) && i == 4000000000);
    CHECK(gguf_get_i64(g, "i32", &i) && i == -123456);
    CHECK(!gguf_get_u32(g, "i32", &u));
    CHECK(gguf_get_f32(g, "f32", &f) && f == 3.25f);
    CHECK(gguf_get_bool(g, "bool.t", &b) && b);
    CHECK(gguf_get_bool(g, "bool.f", &b) && !b);
    CHECK(gguf_get_str(g, "str", &s) && gguf_str_eq(s, "hello, world"));
    CHECK(!gguf_str_eq(s, "hello, worl"));
    CHECK(gguf_get_u32(g, "replaced", &u) && u == 99);
    /* The replaced key kept its place (second-to-last setter before alignment). */
    CHECK_EQ(gguf_find_key(g, "replaced"), 7);
    CHECK(gguf_str_eq(gguf_key(g, 7), "replaced"));
    CHECK_EQ(gguf_kv_type(g, 7), GGUF_UINT32);

    enum gguf_value_type et;
    uint64_t n;
    CHECK(gguf_get_arr(g, "arr.u8", &et, &n) && et == GGUF_UINT8 && n == 3);
    int32_t iv[3];
    float fv[3];
    CHECK(gguf_arr_i32(g, "arr.u8", iv, 3) && iv[0] == 0 && iv[1] == 1 && iv[2] == 255);
    CHECK(gguf_arr_i32(g, "arr.i8", iv, 3) && iv[0] == -128 && iv[2] == 127);
    CHECK(gguf_arr_i32(g, "arr.u16", iv, 2) && iv[1] == 65535);
    CHECK(gguf_arr_i32(g, "arr.i16", iv, 2) && iv[0] == -32768 && iv[1] == 32767);
    CHECK(!gguf_arr_i32(g, "arr.u32", iv, 2)); /* 4294967295 does not fit */
    CHECK(gguf_arr_f32(g, "arr.u32", fv, 2) && fv[1] == 4294967295.0f);
    CHECK(gguf_arr_i32(g, "arr.i32", iv, 3) && iv[0] == INT32_MIN && iv[1] == -1 &&
          iv[2] == INT32_MAX);
    CHECK(!gguf_arr_i32(g, "arr.u64", iv, 2));
    CHECK(gguf_arr_f32(g, "arr.u64", fv, 2) && fv[0] == 0.0f);
    CHECK(gguf_arr_f32(g, "arr.i64", fv, 2) && fv[1] == 5.0f);
    CHECK(gguf_arr_f32(g, "arr.f32", fv, 3) && fv[0] == 1.5f && fv[1] == -2.25f && fv[2] == 1e30f);
    CHECK(!gguf_arr_i32(g, "arr.f32", iv, 3)); /* 1.5 is not an integer */
    CHECK(gguf_arr_f32(g, "arr.f64", fv, 2) && fv[0] == 0.1f);
    CHECK(gguf_get_arr(g, "arr.bool", &et, &n) && et == GGUF_BOOL && n == 3);
    CHECK(!gguf_arr_f32(g, "arr.bool", fv, 3));
    bool bv[3];
    CHECK(!gguf_arr_bool(g, "arr.bool", bv, 2));
    CHECK(!gguf_arr_bool(g, "arr.u8", bv, 3));
    CHECK(gguf_arr_bool(g, "arr.bool", bv, 3) && bv[0] && !bv[1] && bv[2]);
    CHECK(gguf_get_arr(g, "arr.empty", &et, &n) && et == GGUF_INT32 && n == 0);
    CHECK(gguf_arr_i32(g, "arr.empty", iv, 0));
    CHECK(gguf_get_arr(g, "arr.str", &et, &n) && et == GGUF_STRING && n == 4);
    for (uint64_t k = 0; k < 4; k++)
        CHECK(gguf_arr_str(g, "arr.str", k, &s) && gguf_str_eq(s, rt_strs[k]));
    CHECK(!gguf_arr_str(g, "arr.str", 4, &s));
    CHECK(!gguf_arr_str(g, "arr.u8", 0, &s));
    CHECK(!gguf_arr_f32(g, "arr.str", fv, 4));
    CHECK(!gguf_get_arr(g, "str", &et, &n));

    CHECK_EQ(gguf_n_tensors(g), 5);
    struct {
        const char *name;
        uint32_t type, n_dims;
        int64_t ne[4];
        const void *data;
        size_t bytes;
    } want[] = {
        {"f32.3d", QTYPE_F32, 3, {3, 5, 2, 1}, rt_f32, sizeof rt_f32},
        {"q8_0", QTYPE_Q8_0, 2, {32, 3, 1, 1}, rt_q8, sizeof rt_q8},
        {"f16", QTYPE_F16, 1, {7, 1, 1, 1}, rt_f16, sizeof rt_f16},
        {"i8.4d", QTYPE_I8, 4, {2, 1, 3, 2}, rt_i8, sizeof rt_i8},
        {"q4_k", QTYPE_Q4_K, 2, {256, 2, 1, 1}, rt_q4k, sizeof rt_q4k},
    };
    for (int k = 0; k < 5; k++) {
        const gguf_tensor *t = gguf_find_tensor(g, want[k].name);
        CHECK_MSG(t, "tensor %s missing", want[k].name);
        CHECK(t == gguf_tensor_at(g, k));
        CHECK_EQ(t->type, want[k].type);
        CHECK_EQ(t->n_dims, want[k].n_dims);
        for (int d = 0; d < 4; d++)
            CHECK_EQ(t->ne[d], want[k].ne[d]);
        CHECK_EQ(t->bytes, want[k].bytes);
        CHECK_EQ(t->offset % alignment, 0);
        CHECK(memcmp(t->data, want[k].data, want[k].bytes) == 0);
    }
}

static void writer_round_trips_every_type(void)
{
    char err[ERR_MAX] = "";
    const char *path = tmp_path("rt.gguf");
    CHECK_MSG(write_roundtrip_file(path, 0, err) == 0, "write: %s", err);
    gguf_file *g = gguf_open(path, err);
    CHECK_MSG(g, "open: %s", err);
    check_roundtrip(g, 32);
    CHECK_EQ((uintptr_t)gguf_tensor_at(g, 0)->data % 32, 0);
    gguf_close(g);
}

static void writer_honours_alignment(void)
{
    char err[ERR_MAX] = "";
    const char *path = tmp_path("rt64.gguf");
    CHECK_MSG(write_roundtrip_file(path, 256, err) == 0, "write: %s", err);
    gguf_file *g = gguf_open(path, err);
    CHECK_MSG(g, "open: %s", err);
    check_roundtrip(g, 256);
    for (int64_t k = 0; k < gguf_n_tensors(g); k++)
        CHECK_EQ((uintptr_t)gguf_tensor_at(g, k)->data % 256, 0);
    gguf_close(g);
}

/* A file read into memory (GGUF_LOAD_COPY) reads exactly as the mapped file, read-only
 * and at least as aligned; a malformed one is rejected the same way. */
static void copied_file_reads_as_mapped(void)
{
    char err[ERR_MAX] = "";
    const char *path = tmp_path("rtcopy.gguf");
    CHECK_MSG(write_roundtrip_file(path, 64, err) == 0, "write: %s", err);
    gguf_file *g = gguf_open_as(path, GGUF_LOAD_COPY, err);
    CHECK_MSG(g, "open: %s", err);
    check_roundtrip(g, 64);
    for (int64_t k = 0; k < gguf_n_tensors(g); k++)
        CHECK_EQ((uintptr_t)gguf_tensor_at(g, k)->data % 64, 0);
    gguf_close(g);

    CHECK(gguf_open_as("/nonexistent/x.gguf", GGUF_LOAD_COPY, err) == NULL);
    CHECK(contains(err, "/nonexistent/x.gguf"));
    FILE *f = fopen(path, "r+b");
    CHECK(f && fwrite("GGUX", 1, 4, f) == 4);
    fclose(f);
    CHECK(gguf_open_as(path, GGUF_LOAD_COPY, err) == NULL);
    CHECK_MSG(contains(err, "magic"), "%s", err);
}

/* Scalars of every width (which the writer has no setters for) survive copy_kv. */
static void copy_kv_copies_every_scalar_type(void)
{
    bytes b = {.n = 0};
    put(&b, "GGUF", 4);
    put_u32(&b, 2); /* version 2 is read as well */
    put_u64(&b, 0);
    put_u64(&b, 11);
    put_str(&b, "u8");
    put_u32(&b, GGUF_UINT8);
    put_u8(&b, 200);
    put_str(&b, "i8");
    put_u32(&b, GGUF_INT8);
    put_u8(&b, 0x80);
    put_str(&b, "u16");
    put_u32(&b, GGUF_UINT16);
    put(&b, (const uint16_t[]){60000}, 2);
    put_str(&b, "i16");
    put_u32(&b, GGUF_INT16);
    put(&b, (const int16_t[]){-300}, 2);
    put_str(&b, "u64");
    put_u32(&b, GGUF_UINT64);
    put_u64(&b, UINT64_MAX);
    put_str(&b, "i64");
    put_u32(&b, GGUF_INT64);
    put(&b, (const int64_t[]){-5000000000ll}, 8);
    put_str(&b, "f64");
    put_u32(&b, GGUF_FLOAT64);
    put(&b, (const double[]){2.5}, 8);
    put_str(&b, "bool");
    put_u32(&b, GGUF_BOOL);
    put_u8(&b, 1);
    put_str(&b, "nested");
    put_u32(&b, GGUF_ARRAY);
    put_u32(&b, GGUF_ARRAY);
    put_u64(&b, 2);
    put_u32(&b, GGUF_INT32);
    put_u64(&b, 1);
    put_u32(&b, 42);
    put_u32(&b, GGUF_STRING);
    put_u64(&b, 1);
    put_str(&b, "deep");
    put_str(&b, "u64.small");
    put_u32(&b, GGUF_UINT64);
    put_u64(&b, 77);
    put_str(&b, "f32");
    put_u32(&b, GGUF_FLOAT32);
    put(&b, (const float[]){-0.75f}, 4);

    char err[ERR_MAX] = "";
    gguf_file *src = gguf_open_memory(b.p, b.n, err);
    CHECK_MSG(src, "open: %s", err);
    CHECK_EQ(gguf_version(src), 2);
    gguf_writer *w = gguf_writer_new();
    for (int64_t k = 0; k < gguf_n_kv(src); k++)
        CHECK(gguf_writer_copy_kv(w, src, k) == 0);
    const char *path = tmp_path("scalars.gguf");
    int rc = gguf_writer_write(w, path, err);
    gguf_writer_free(w);
    gguf_close(src);
    CHECK_MSG(rc == 0, "write: %s", err);
    gguf_file *g = gguf_open(path, err);
    CHECK_MSG(g, "open: %s", err);

    uint32_t u;
    int64_t i;
    float f;
    bool bo;
    CHECK_EQ(gguf_n_kv(g), 11);
    CHECK(gguf_get_u32(g, "u8", &u) && u == 200);
    CHECK(gguf_get_i64(g, "i8", &i) && i == -128);
    CHECK(!gguf_get_u32(g, "i8", &u));
    CHECK(gguf_get_u32(g, "u16", &u) && u == 60000);
    CHECK(gguf_get_i64(g, "i16", &i) && i == -300);
    CHECK(!gguf_get_u32(g, "u64", &u));
    CHECK(!gguf_get_i64(g, "u64", &i));
    CHECK(gguf_get_u32(g, "u64.small", &u) && u == 77);
    CHECK(gguf_get_i64(g, "i64", &i) && i == -5000000000ll);
    CHECK(gguf_get_f32(g, "f64", &f) && f == 2.5f);
    CHECK(gguf_get_f32(g, "f32", &f) && f == -0.75f);
    CHECK(!gguf_get_u32(g, "f32", &u));
    CHECK(gguf_get_bool(g, "bool", &bo) && bo);
    CHECK(!gguf_get_u32(g, "bool", &u));
    enum gguf_value_type et;
    uint64_t n;
    CHECK(gguf_get_arr(g, "nested", &et, &n) && et == GGUF_ARRAY && n == 2);
    gguf_str s;
    CHECK(!gguf_arr_str(g, "nested", 0, &s));
    CHECK_EQ(gguf_kv_type(g, gguf_find_key(g, "i64")), GGUF_INT64);
    gguf_close(g);
}

static void copy_kv_copies_a_vocabulary(void)
{
    const char *vpath = test_data_path("vocab/ggml-vocab-gpt-2.gguf");
    if (!vpath)
        SKIP("vocab/ggml-vocab-gpt-2.gguf not found (set LLMS_TESTDATA)");
    char err[ERR_MAX] = "";
    gguf_file *v = gguf_open(vpath, err);
    CHECK_MSG(v, "open: %s", err);
    gguf_writer *w = gguf_writer_new();
    int copied = 0;
    for (int64_t k = 0; k < gguf_n_kv(v); k++) {
        gguf_str key = gguf_key(v, k);
        if (key.len > 10 && memcmp(key.ptr, "tokenizer.", 10) == 0) {
            CHECK(gguf_writer_copy_kv(w, v, k) == 0);
            copied++;
        }
    }
    CHECK(copied >= 5);
    CHECK(gguf_writer_set_str(w, "general.architecture", "llama") == 0);
    float emb[8 * 4] = {0};
    CHECK(gguf_writer_add_tensor(w, "token_embd.weight", QTYPE_F32, 2, (const int64_t[]){8, 4}, emb) == 0);
    const char *path = tmp_path("vocab-copy.gguf");
    int rc = gguf_writer_write(w, path, err);
    gguf_writer_free(w);
    CHECK_MSG(rc == 0, "write: %s", err);
    gguf_file *g = gguf_open(path, err);
    CHECK_MSG(g, "open: %s", err);
    CHECK_EQ(gguf_n_kv(g), copied + 1);
    enum gguf_value_type et;
    uint64_t n;
    CHECK(gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n) && et == GGUF_STRING && n == 50257);
    for (uint64_t k = 0; k < n; k += 97) {
        gguf_str a, b;
        CHECK(gguf_arr_str(v, "tokenizer.ggml.tokens", k, &a));
        CHECK(gguf_arr_str(g, "tokenizer.ggml.tokens", k, &b));
        CHECK(a.len == b.len && memcmp(a.ptr, b.ptr, a.len) == 0);
    }
    gguf_str s;
    CHECK(gguf_arr_str(g, "tokenizer.ggml.merges", 49999, &s) && gguf_str_eq(s, "\xc4\xa0g azed"));
    CHECK(gguf_get_str(g, "tokenizer.ggml.model", &s) && gguf_str_eq(s, "gpt2"));
    CHECK(gguf_find_tensor(g, "token_embd.weight") != NULL);
    gguf_close(g);
    gguf_close(v);
}

static void writer_reports_bad_input(void)
{
    char err[ERR_MAX] = "";
    gguf_writer *w = gguf_writer_new();
    float d[32] = {0};
    CHECK(gguf_writer_add_tensor(w, "a", QTYPE_F32, 1, (const int64_t[]){32}, d) == 0);
    CHECK(gguf_writer_add_tensor(w, "a", QTYPE_F32, 1, (const int64_t[]){32}, d) == -1);
    int rc = gguf_writer_write(w, tmp_path("bad.gguf"), err);
    gguf_writer_free(w);
    CHECK(rc == -1);
    CHECK_MSG(contains(err, "duplicate tensor"), "%s", err);

    w = gguf_writer_new();
    CHECK(gguf_writer_set_arr(w, "s", GGUF_STRING, d, 1) == -1);
    CHECK(gguf_writer_add_tensor(w, "q", QTYPE_Q8_0, 1, (const int64_t[]){33}, d) == -1);
    CHECK(gguf_writer_add_tensor(w, "u", 4, 1, (const int64_t[]){1}, d) == -1);
    CHECK(gguf_writer_add_tensor(w, "z", QTYPE_F32, 0, (const int64_t[]){1}, d) == -1);
    CHECK(gguf_writer_add_tensor(w, "z", QTYPE_F32, 5, (const int64_t[]){1, 1, 1, 1, 1}, d) == -1);
    gguf_writer_free(w);

    w = gguf_writer_new();
    CHECK(gguf_writer_set_u32(w, "general.alignment", 48) == 0);
    rc = gguf_writer_write(w, tmp_path("bad.gguf"), err);
    CHECK(rc == -1);
    CHECK_MSG(contains(err, "power of two"), "%s", err);
    CHECK(gguf_writer_set_u32(w, "general.alignment", 64) == 0);
    rc = gguf_writer_write(w, "/nonexistent/dir/x.gguf", err);
    gguf_writer_free(w);
    CHECK(rc == -1);
    CHECK_MSG(contains(err, "/nonexistent/dir/x.gguf"), "%s", err);
}

/* ---- malformed files ---- */

static void base_file_is_valid(void)
{
    bytes b;
    marks m;
    base_file(&b, &m);
    char err[ERR_MAX] = "";
    gguf_file *g = gguf_open_memory(b.p, b.n, err);
    CHECK_MSG(g, "%s", err);
    CHECK_EQ(gguf_n_kv(g), 5);
    CHECK_EQ(gguf_n_tensors(g), 2);
    const gguf_tensor *t = gguf_find_tensor(g, "t1");
    CHECK(t && t->bytes == 34 && t->offset == 32);
    CHECK_EQ(((const unsigned char *)t->data)[0], 32);
    gguf_close(g);
}

static void every_truncation_is_rejected(void)
{
    char err[ERR_MAX] = "";
    const char *path = tmp_path("trunc.gguf");
    CHECK_MSG(write_roundtrip_file(path, 0, err) == 0, "write: %s", err);
    size_t size;
    unsigned char *full = read_whole(path, &size);
    CHECK(full);
    gguf_file *g = gguf_open_memory(full, size, err);
    CHECK_MSG(g, "%s", err);
    gguf_close(g);
    for (size_t n = 0; n < size; n++) {
        unsigned char *p = malloc(n ? n : 1);
        memcpy(p, full, n);
        err[0] = '\0';
        g = gguf_open_memory(p, n, err);
        free(p);
        if (g) {
            gguf_close(g);
            free(full);
            CHECK_MSG(false, "prefix of %zu of %zu bytes was accepted", n, size);
        }
        if (err[0] == '\0') {
            free(full);
            CHECK_MSG(false, "prefix of %zu bytes: no error message", n);
        }
    }
    /* A truncated file on disk is refused too, naming the file. */
    FILE *f = fopen(path, "wb");
    CHECK(f);
    CHECK(fwrite(full, 1, size / 2, f) == size / 2);
    fclose(f);
    free(full);
    CHECK(gguf_open(path, err) == NULL);
    CHECK_MSG(contains(err, path), "%s", err);
}

static void bad_magic(void)
{
    bytes b;
    marks m;
    base_file(&b, &m);
    b.p[0] = 'X';
    CHECK_REJECTED(&b, "magic");
}

static void unsupported_versions(void)
{
    bytes b;
    marks m;
    base_file(&b, &m);
    patch_u32(&b, m.version, 1);
    CHECK_REJECTED(&b, "version 1");
    patch_u32(&b, m.version, 4);
    CHECK_REJECTED(&b, "version 4");
    patch_u32(&b, m.version, 0x03000000);
    CHECK_REJECTED(&b, "big-endian");
}

static void absurd_counts(void)
{
    bytes b;
    marks m;
    base_file(&b, &m);
    patch_u64(&b, m.n_kv, 1ull << 62);
    CHECK_REJECTED(&b, "n_kv");
    base_file(&b, &m);
    patch_u64(&b, m.n_tensors, 1ull << 62);
    CHECK_REJECTED(&b, "n_tensors");
    base_file(&b, &m);
    patch_u64(&b, m.n_tensors, UINT64_MAX);
    CHECK_REJECTED(&b, "n_tensors");
    base_file(&b, &m);
    patch_u64(&b, m.kv0_strlen, 1ull << 62);
    CHECK_REJECTED(&b, "string length");
    base_file(&b, &m);
    patch_u64(&b, m.kv0_strlen, UINT64_MAX);
    CHECK_REJECTED(&b, "string length");
    base_file(&b, &m);
    patch_u64(&b, m.kv2_count, 1ull << 62);
    CHECK_REJECTED(&b, "array count");
    base_file(&b, &m);
    patch_u64(&b, m.kv2_count, UINT64_MAX / 8 + 1);
    CHECK_REJECTED(&b, "array count");
    /* More kvs than the file holds (but few enough to pass the size bound). */
    base_file(&b, &m);
    patch_u64(&b, m.n_kv, 7);
    CHECK_REJECTED(&b, "");
}

static void unknown_types(void)
{
    bytes b;
    marks m;
    base_file(&b, &m);
    patch_u32(&b, m.kv0_type, 13);
    CHECK_REJECTED(&b, "value type 13");
    base_file(&b, &m);
    patch_u32(&b, m.t0_type, 4);
    CHECK_REJECTED(&b, "tensor type 4");
    base_file(&b, &m);
    patch_u32(&b, m.t0_type, 1000);
    CHECK_REJECTED(&b, "tensor type 1000");
}

static void bad_dimensions(void)
{
    bytes b;
    marks m;
    base_file(&b, &m);
    patch_u32(&b, m.t0_ndims, 0);
    CHECK_REJECTED(&b, "n_dims 0");
    base_file(&b, &m);
    patch_u32(&b, m.t0_ndims, 5);
    CHECK_REJECTED(&b, "n_dims 5");
    base_file(&b, &m);
    patch_u64(&b, m.t0_ne1, 1ull << 62);
    CHECK_REJECTED(&b, "overflow");
    base_file(&b, &m);
    patch_u64(&b, m.t0_ne1, UINT64_MAX);
    CHECK_REJECTED(&b, "negative");
    base_file(&b, &m);
    patch_u64(&b, m.t1_ne0, 33);
    CHECK_REJECTED(&b, "block size");
}

static void bad_tensor_placement(void)
{
    bytes b;
    marks m;
    base_file(&b, &m);
    patch_u64(&b, m.t1_offset, 33);
    CHECK_REJECTED(&b, "not aligned");
    base_file(&b, &m);
    patch_u64(&b, m.t1_offset, 64);
    CHECK_REJECTED(&b, "past end of file");
    base_file(&b, &m);
    patch_u64(&b, m.t1_offset, UINT64_MAX - 31);
    CHECK_REJECTED(&b, "'t1'");
    base_file(&b, &m);
    patch_u64(&b, m.t1_ne0, 64);
    CHECK_REJECTED(&b, "past end of file");
    base_file(&b, &m);
    b.n -= 1;
    CHECK_REJECTED(&b, "'t1': data [");
}

/* Offsets that stay aligned and inside the file but make two tensors share bytes (a
 * flipped offset bit, a grown shape) are refused; disjoint tensors in any order are
 * not. The base file has t0 at [0, 32) and t1 at [32, 66). */
static void overlapping_tensors(void)
{
    bytes b;
    marks m;
    base_file(&b, &m);
    patch_u64(&b, m.t1_offset, 0);
    CHECK_REJECTED(&b, "overlap");
    base_file(&b, &m);
    patch_u64(&b, m.t0_ne1, 3); /* t0 grows to [0, 48) */
    CHECK_REJECTED(&b, "tensors 't0' [0, 48) and 't1' [32, 66) overlap");
    base_file(&b, &m);
    patch_u64(&b, m.t1_offset, 0);
    patch_u64(&b, m.t0_ne1, 1); /* t0 [0, 16) inside t1 [0, 34) */
    CHECK_REJECTED(&b, "overlap");
    base_file(&b, &m);
    patch_u64(&b, m.t1_offset, 64);
    for (int i = 0; i < 64; i++)
        put_u8(&b, 0);
    patch_u64(&b, m.t0_ne1, 1); /* t0 [0, 16), a gap, then t1 [64, 98): fine */
    char err[ERR_MAX];
    gguf_file *g = gguf_open_memory(b.p, b.n, err);
    CHECK_MSG(g, "%s", err);
    gguf_close(g);
}

/* A real model file (tensors packed one after another): every single-bit change of any
 * tensor's offset leaves it unaligned, past the end or on top of another tensor, so no
 * such file loads with moved weights. */
static void stories260k_offset_flips_are_refused(void)
{
    const char *path = test_data_path("models/stories260K.gguf");
    if (!path)
        SKIP("models/stories260K.gguf not found (set LLMS_TESTDATA)");
    size_t size;
    unsigned char *file = read_whole(path, &size);
    CHECK(file);
    char err[ERR_MAX];
    gguf_file *g = gguf_open_memory(file, size, err);
    CHECK_MSG(g, "%s", err);
    int64_t n = gguf_n_tensors(g);
    size_t *at = calloc((size_t)n, sizeof *at);
    CHECK(at);
    for (int64_t i = 0; i < n; i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        /* name, n_dims, the dimensions, the type, then the offset */
        at[i] = (size_t)((const unsigned char *)t->name.ptr - file) + t->name.len + 4 +
                8 * t->n_dims + 4;
        uint64_t off;
        memcpy(&off, file + at[i], 8);
        CHECK_EQ(off, t->offset);
    }
    gguf_close(g);
    int loaded = 0, tried = 0;
    char first[ERR_MAX + 64] = "";
    for (int64_t i = 0; i < n; i++)
        for (int bit = 0; bit < 64; bit++) {
            file[at[i] + bit / 8] ^= (unsigned char)(1u << (bit % 8));
            g = gguf_open_memory(file, size, err);
            tried++;
            if (g && !first[0])
                snprintf(first, sizeof first, "tensor %lld bit %d", (long long)i, bit);
            loaded += g != NULL;
            gguf_close(g);
            file[at[i] + bit / 8] ^= (unsigned char)(1u << (bit % 8));
        }
    free(at);
    free(file);
    CHECK_MSG(loaded == 0, "%d of %d offset flips loaded, first %s", loaded, tried, first);
}

static void duplicate_names(void)
{
    bytes b;
    marks m;
    base_file(&b, &m);
    b.p[m.t1_name + 1] = '0';
    CHECK_REJECTED(&b, "duplicate tensor name 't0'");
    base_file(&b, &m);
    b.p[m.kv4_key + 2] = 'a';
    CHECK_REJECTED(&b, "duplicate key 'x.a'");
    base_file(&b, &m);
    patch_u64(&b, m.t0_name - 8, 0);
    CHECK_REJECTED(&b, "empty name");
}

static void bad_alignment(void)
{
    bytes b;
    marks m;
    base_file(&b, &m);
    patch_u32(&b, m.kv1_value, 48);
    CHECK_REJECTED(&b, "power of two");
    patch_u32(&b, m.kv1_value, 0);
    CHECK_REJECTED(&b, "power of two");
    /* 16 is legal, and the data then starts at the next multiple of 16. */
    base_file(&b, &m);
    patch_u32(&b, m.kv1_value, 16);
    char err[ERR_MAX];
    gguf_file *g = gguf_open_memory(b.p, b.n, err);
    CHECK_MSG(g, "%s", err);
    CHECK_EQ(gguf_alignment(g), 16);
    gguf_close(g);
}

static void deep_nesting_is_rejected(void)
{
    bytes b = {.n = 0};
    put(&b, "GGUF", 4);
    put_u32(&b, 3);
    put_u64(&b, 0);
    put_u64(&b, 1);
    put_str(&b, "deep");
    put_u32(&b, GGUF_ARRAY);
    for (int i = 0; i < 100; i++) {
        put_u32(&b, GGUF_ARRAY);
        put_u64(&b, 1);
    }
    put_u32(&b, GGUF_UINT8);
    put_u64(&b, 0);
    CHECK_REJECTED(&b, "nested");
}

int main(void)
{
    RUN(reads_llama_spm_vocab);
    RUN(reads_gpt2_vocab);
    RUN(reads_bert_vocab);
    RUN(reads_stories260k);
    RUN(missing_file_names_the_path);
    RUN(writer_round_trips_every_type);
    RUN(writer_honours_alignment);
    RUN(copied_file_reads_as_mapped);
    RUN(copy_kv_copies_every_scalar_type);
    RUN(copy_kv_copies_a_vocabulary);
    RUN(writer_reports_bad_input);
    RUN(base_file_is_valid);
    RUN(every_truncation_is_rejected);
    RUN(bad_magic);
    RUN(unsupported_versions);
    RUN(absurd_counts);
    RUN(unknown_types);
    RUN(bad_dimensions);
    RUN(bad_tensor_placement);
    RUN(overlapping_tensors);
    RUN(stories260k_offset_flips_are_refused);
    RUN(duplicate_names);
    RUN(bad_alignment);
    RUN(deep_nesting_is_rejected);
    return test_finish();
}
