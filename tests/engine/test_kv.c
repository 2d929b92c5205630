/* KV chunks: pool reuse and cap, sequence reserve / append / push / truncate. */
#include <string.h>

#include "engine/kv/kv.h"
#include "tests/support/test.h"

static const kv_shape SHAPE = {.n_layer = 3, .n_head_kv = 2, .head_dim = 8};

static void test_chunk_layout(void)
{
    char err[ERR_MAX];
    kv_pool *p = kv_pool_new(SHAPE, 0, err);
    CHECK(p);
    size_t layer = 2 * 2 * KV_CHUNK_TOKENS * 8 * 2;
    CHECK_EQ(kv_chunk_layer_bytes(SHAPE, KV_F16), layer);
    CHECK_EQ(kv_chunk_data_bytes(SHAPE, KV_F16), 3 * layer);
    kv_chunk *c = kv_chunk_new(p, err);
    CHECK(c);
    CHECK_EQ(c->precision, KV_F16);
    CHECK_EQ(c->n_tokens, 0);
    /* layer sections in order, K then V inside, heads in order */
    CHECK(kv_chunk_layer(c, SHAPE, 2) == c->data + 2 * layer);
    CHECK((uint8_t *)kv_chunk_k_f16(c, SHAPE, 1, 0) == c->data + layer);
    CHECK((uint8_t *)kv_chunk_k_f16(c, SHAPE, 1, 1) == c->data + layer + KV_CHUNK_TOKENS * 8 * 2);
    CHECK((uint8_t *)kv_chunk_v_f16(c, SHAPE, 1, 0) == c->data + layer + layer / 2);
    /* the last element of the data is V of the last layer and head (ASan checks bounds) */
    uint16_t *v = kv_chunk_v_f16(c, SHAPE, 2, 1);
    v[KV_CHUNK_TOKENS * 8 - 1] = 2;
    CHECK(&v[KV_CHUNK_TOKENS * 8 - 1] == (uint16_t *)(c->data + 3 * layer) - 1);
    kv_chunk_free(p, c);
    kv_pool_free(p);
}

static void test_pool_cap_and_reuse(void)
{
    char err[ERR_MAX];
    kv_pool *p = kv_pool_new(SHAPE, 2, err);
    kv_chunk *a = kv_chunk_new(p, err), *b = kv_chunk_new(p, err);
    CHECK(a && b);
    CHECK_EQ(kv_pool_n_used(p), 2);
    CHECK(kv_chunk_new(p, err) == NULL);
    CHECK(strstr(err, "in use") != NULL);
    a->n_tokens = 5;
    kv_chunk_free(p, a);
    kv_chunk *c = kv_chunk_new(p, err);
    CHECK(c == a);
    CHECK_EQ(c->n_tokens, 0);
    kv_chunk_free(p, b);
    kv_chunk_free(p, c);
    CHECK_EQ(kv_pool_n_used(p), 0);
    kv_pool_free(p);
    CHECK(kv_pool_new((kv_shape){.n_layer = 0, .n_head_kv = 1, .head_dim = 1}, 0, err) == NULL);
}

static void test_seq_append(void)
{
    char err[ERR_MAX];
    kv_pool *p = kv_pool_new(SHAPE, 0, err);
    kv_seq s;
    kv_seq_init(&s, p);
    CHECK_EQ(kv_seq_n_tokens(&s), 0);
    kv_chunk *c;
    int idx;
    CHECK_EQ(kv_seq_append(&s, 1, 0, &c, &idx), -1);
    CHECK_EQ(kv_seq_reserve(&s, 20, err), 0);
    CHECK_EQ(s.n_chunks, 2);
    for (int i = 0; i < 20; i++) {
        CHECK_EQ(kv_seq_append(&s, 100 + i, 7 * i, &c, &idx), 0);
        CHECK(c == s.chunks[i / KV_CHUNK_TOKENS]);
        CHECK_EQ(idx, i % KV_CHUNK_TOKENS);
        CHECK_EQ(c->tokens[idx], 100 + i);
        CHECK_EQ(c->positions[idx], 7 * i);
    }
    CHECK_EQ(kv_seq_n_tokens(&s), 20);
    /* reserving 12 fits in the last chunk; 13 needs a new one */
    CHECK_EQ(kv_seq_reserve(&s, 12, err), 0);
    CHECK_EQ(s.n_chunks, 2);
    CHECK_EQ(kv_seq_reserve(&s, 13, err), 0);
    CHECK_EQ(s.n_chunks, 3);

    kv_seq_truncate(&s, 18);
    CHECK_EQ(kv_seq_n_tokens(&s), 18);
    CHECK_EQ(s.n_chunks, 2);
    kv_seq_truncate(&s, 16);
    CHECK_EQ(s.n_chunks, 1);
    CHECK_EQ(kv_pool_n_used(p), 1);

    /* a pushed partial chunk is followed by new chunks, not refilled */
    kv_chunk *ext = kv_chunk_new(p, err);
    ext->n_tokens = 3;
    CHECK_EQ(kv_seq_push_chunk(&s, ext, err), 0);
    CHECK_EQ(kv_seq_n_tokens(&s), 19);
    CHECK_EQ(kv_seq_reserve(&s, 1, err), 0);
    CHECK_EQ(kv_seq_append(&s, 5, 99, &c, &idx), 0);
    CHECK(c == ext);
    CHECK_EQ(idx, 3);
    kv_seq_free(&s);
    CHECK_EQ(kv_pool_n_used(p), 0);
    kv_pool_free(p);
}

static void test_reserve_respects_cap(void)
{
    char err[ERR_MAX];
    kv_pool *p = kv_pool_new(SHAPE, 1, err);
    kv_seq s;
    kv_seq_init(&s, p);
    CHECK_EQ(kv_seq_reserve(&s, 16, err), 0);
    CHECK_EQ(kv_seq_reserve(&s, 17, err), -1);
    kv_seq_free(&s);
    kv_pool_free(p);
}

int main(void)
{
    RUN(test_chunk_layout);
    RUN(test_pool_cap_and_reuse);
    RUN(test_seq_append);
    RUN(test_reserve_respects_cap);
    return test_finish();
}
