/*
 * test_promptcache.c — the prompt cache's bookkeeping on sequences of a small pool (no
 * model: the KV's values do not matter here, only which entries move where): a take
 * resumes the owner's longest usable prefix, aligned and leaving a token to evaluate,
 * never another owner's; a put replaces what it extends and yields to what extends it;
 * compressed chunks are not kept; a take copies while the budget grants the bytes, and so
 * does a running generation's put; the cap and the shed evict least recently used first;
 * every chunk goes back to the pool.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/sched/promptcache.h"
#include "tests/support/test.h"

#define ALIGN 32

static kv_pool *pool;

/* A sequence of the first n tokens of the prompt 1, 2, 3, ... (tokens[i] = i + 1). */
static int seq_of(kv_seq *s, int n)
{
    char err[ERR_MAX];
    kv_seq_init(s, pool);
    if (kv_seq_reserve(s, n, err))
        return -1;
    for (int i = 0; i < n; i++) {
        kv_chunk *c;
        int index;
        if (kv_seq_append(s, i + 1, i, &c, &index))
            return -1;
    }
    return 0;
}

static int32_t prompt[512];

static void setup(void)
{
    for (int i = 0; i < 512; i++)
        prompt[i] = i + 1;
}

/* Puts the owner's prompt of n tokens. */
static int put(pcache *pc, uint32_t uid, const char *app, int n)
{
    kv_seq s;
    if (seq_of(&s, n))
        return -1;
    pcache_put(pc, uid, app, prompt, n, ALIGN, &s);
    int left = s.n_chunks;
    kv_seq_free(&s);
    return left; /* 0: moved in or given back */
}

static void take_resumes_the_owners_aligned_prefix(void)
{
    pcache *pc = pcache_new(pool, 1 << 20);
    CHECK(pc);
    kv_seq s;
    kv_seq_init(&s, pool);
    CHECK_EQ(pcache_take(pc, 1, "a", prompt, 200, ALIGN, NULL, NULL, &s), 0);
    CHECK_EQ(put(pc, 1, "a", 100), 0);
    CHECK_EQ(pcache_get_stats(pc).entries, 1);
    /* another app of the uid, another uid of the app: nothing */
    CHECK_EQ(pcache_take(pc, 1, "b", prompt, 200, ALIGN, NULL, NULL, &s), 0);
    CHECK_EQ(pcache_take(pc, 2, "a", prompt, 200, ALIGN, NULL, NULL, &s), 0);
    /* a prompt that differs at token 70: the 64 before */
    int32_t other[200];
    memcpy(other, prompt, sizeof other);
    other[70] = -5;
    CHECK_EQ(pcache_take(pc, 1, "a", other, 200, ALIGN, NULL, NULL, &s), 64);
    CHECK_EQ(kv_seq_n_tokens(&s), 64);
    CHECK_EQ(pcache_get_stats(pc).entries, 0);
    kv_seq_free(&s);
    /* the prompt the entry holds exactly (96 aligned): a token is left to evaluate */
    CHECK_EQ(put(pc, 1, "a", 96), 0);
    CHECK_EQ(pcache_take(pc, 1, "a", prompt, 96, ALIGN, NULL, NULL, &s), 64);
    kv_seq_free(&s);
    /* shorter than ALIGN shared: a miss, the entry stays */
    CHECK_EQ(put(pc, 1, "a", 96), 0);
    CHECK_EQ(pcache_take(pc, 1, "a", prompt, 20, ALIGN, NULL, NULL, &s), 0);
    CHECK_EQ(pcache_get_stats(pc).entries, 1);
    pcache_stats st = pcache_get_stats(pc);
    CHECK_EQ(st.hits, 2);
    CHECK_EQ(st.reused_tokens, 128);
    pcache_free(pc);
    CHECK_EQ(kv_pool_n_used(pool), 0);
}

static void put_replaces_what_it_extends(void)
{
    pcache *pc = pcache_new(pool, 1 << 20);
    CHECK(pc);
    CHECK_EQ(put(pc, 1, "a", 70), 0);
    CHECK_EQ(put(pc, 1, "b", 70), 0);
    CHECK_EQ(put(pc, 1, "a", 140), 0); /* extends a's 64: replaces it */
    CHECK_EQ(pcache_get_stats(pc).entries, 2);
    CHECK_EQ(put(pc, 1, "a", 100), 0); /* a's 128 extends it: dropped */
    CHECK_EQ(pcache_get_stats(pc).entries, 2);
    CHECK_EQ(put(pc, 1, "a", 10), 0); /* under ALIGN: nothing to keep */
    CHECK_EQ(pcache_get_stats(pc).entries, 2);
    kv_seq s;
    kv_seq_init(&s, pool);
    CHECK_EQ(pcache_take(pc, 1, "a", prompt, 300, ALIGN, NULL, NULL, &s), 128);
    kv_seq_free(&s);
    pcache_free(pc);
    CHECK_EQ(kv_pool_n_used(pool), 0);
}

static void compressed_chunks_are_not_kept(void)
{
    char err[ERR_MAX];
    pcache *pc = pcache_new(pool, 1 << 20);
    CHECK(pc);
    kv_seq s;
    CHECK_EQ(seq_of(&s, 100), 0);
    /* chunk 3 (tokens 48..63) squeezed: only the 48 before are f16, 32 kept */
    CHECK_EQ(kv_chunk_convert(pool, s.chunks[3], KV_INT8, err), 0);
    pcache_put(pc, 1, "a", prompt, 100, ALIGN, &s);
    CHECK_EQ(s.n_chunks, 0);
    kv_seq_init(&s, pool);
    CHECK_EQ(pcache_take(pc, 1, "a", prompt, 200, ALIGN, NULL, NULL, &s), 32);
    kv_seq_free(&s);
    pcache_free(pc);
    CHECK_EQ(kv_pool_n_used(pool), 0);
}

/* A claim that grants the bytes it is asked (recording them); refused when *granted is
 * negative. */
static int claim_counting(void *arg, size_t bytes)
{
    long *granted = arg;
    if (*granted < 0)
        return -1;
    *granted += (long)bytes;
    return 0;
}

/* With room under the budget a take copies: the entry stays for the owner's prompts
 * running beside it, the copy holds the prefix's values, and a later put still replaces
 * it; without room the entry moves out as before. */
static void takes_copy_while_the_budget_has_room(void)
{
    pcache *pc = pcache_new(pool, 1 << 20);
    CHECK(pc);
    CHECK_EQ(put(pc, 1, "a", 100), 0); /* 96 kept: 6 chunks */
    size_t held = pcache_get_stats(pc).bytes;
    int used = kv_pool_n_used(pool);
    long granted = 0;
    kv_seq s[2];
    for (int i = 0; i < 2; i++) {
        kv_seq_init(&s[i], pool);
        CHECK_EQ(pcache_take(pc, 1, "a", prompt, 80, ALIGN, claim_counting, &granted, &s[i]),
                 64);
        CHECK_EQ(kv_seq_n_tokens(&s[i]), 64);
        CHECK_EQ(s[i].n_chunks, 4);
        CHECK_EQ(s[i].chunks[3]->tokens[15], 64); /* token 64 at position 63 */
    }
    CHECK_EQ(pcache_get_stats(pc).entries, 1);
    CHECK_EQ(pcache_get_stats(pc).bytes, held);
    CHECK_EQ(kv_pool_n_used(pool), used + 8);
    CHECK_EQ(granted, (long)(2 * kv_seq_prefix_bytes(&s[0], 64)));
    for (int i = 0; i < 2; i++)
        kv_seq_free(&s[i]);
    /* no room: moved out, cut to the prefix */
    granted = -1;
    kv_seq_init(&s[0], pool);
    CHECK_EQ(pcache_take(pc, 1, "a", prompt, 80, ALIGN, claim_counting, &granted, &s[0]), 64);
    CHECK_EQ(pcache_get_stats(pc).entries, 0);
    CHECK_EQ(kv_seq_n_tokens(&s[0]), 64);
    kv_seq_free(&s[0]);
    CHECK_EQ(pcache_get_stats(pc).hits, 3);
    pcache_free(pc);
    CHECK_EQ(kv_pool_n_used(pool), 0);
}

/* A running generation's prompt goes in as a copy: its own KV stays whole; a prefix the
 * owner's entries hold already, or a refused claim, adds nothing. */
static void put_copy_leaves_the_generation_its_kv(void)
{
    pcache *pc = pcache_new(pool, 1 << 20);
    CHECK(pc);
    kv_seq s;
    CHECK_EQ(seq_of(&s, 100), 0);
    long granted = -1;
    pcache_put_copy(pc, 1, "a", prompt, 100, ALIGN, &s, claim_counting, &granted);
    CHECK_EQ(pcache_get_stats(pc).entries, 0);
    granted = 0;
    pcache_put_copy(pc, 1, "a", prompt, 100, ALIGN, &s, claim_counting, &granted);
    CHECK_EQ(kv_seq_n_tokens(&s), 100);
    CHECK_EQ(pcache_get_stats(pc).entries, 1);
    CHECK_EQ(granted, (long)kv_seq_prefix_bytes(&s, 96));
    pcache_put_copy(pc, 1, "a", prompt, 80, ALIGN, &s, claim_counting, &granted);
    CHECK_EQ(pcache_get_stats(pc).entries, 1); /* its 64 are held by the 96 */
    /* the generation's end puts the same prompt: the copy already holds it */
    pcache_put(pc, 1, "a", prompt, 100, ALIGN, &s);
    CHECK_EQ(s.n_chunks, 0);
    CHECK_EQ(pcache_get_stats(pc).entries, 1);
    kv_seq_init(&s, pool);
    CHECK_EQ(pcache_take(pc, 1, "a", prompt, 200, ALIGN, NULL, NULL, &s), 96);
    kv_seq_free(&s);
    pcache_free(pc);
    CHECK_EQ(kv_pool_n_used(pool), 0);
}

static void cap_and_shed_evict_least_recent(void)
{
    pcache *pc = pcache_new(pool, 1 << 20);
    CHECK(pc);
    CHECK_EQ(put(pc, 1, "a", 64), 0);
    size_t one = pcache_get_stats(pc).bytes;
    CHECK(one > 0);
    pcache_set_max(pc, one * 2);
    CHECK_EQ(put(pc, 1, "b", 64), 0);
    CHECK_EQ(put(pc, 1, "c", 64), 0); /* over the cap: a goes */
    CHECK_EQ(pcache_get_stats(pc).entries, 2);
    kv_seq s;
    kv_seq_init(&s, pool);
    CHECK_EQ(pcache_take(pc, 1, "a", prompt, 100, ALIGN, NULL, NULL, &s), 0);
    CHECK_EQ(pcache_shed(pc, 1), one); /* b, the least recent */
    CHECK_EQ(pcache_take(pc, 1, "b", prompt, 100, ALIGN, NULL, NULL, &s), 0);
    CHECK_EQ(pcache_take(pc, 1, "c", prompt, 100, ALIGN, NULL, NULL, &s), 64);
    kv_seq_free(&s);
    CHECK_EQ(pcache_shed(pc, 1 << 30), 0);
    pcache_set_max(pc, 0); /* off: nothing kept */
    CHECK_EQ(put(pc, 1, "a", 64), 0);
    CHECK_EQ(pcache_get_stats(pc).entries, 0);
    CHECK_EQ(pcache_get_stats(pc).bytes, 0);
    pcache_free(pc);
    CHECK_EQ(kv_pool_n_used(pool), 0);
}

int main(void)
{
    char err[ERR_MAX];
    setup();
    pool = kv_pool_new((kv_shape){.n_layer = 2, .n_head_kv = 2, .head_dim = 16}, 0, err);
    if (!pool) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    RUN(take_resumes_the_owners_aligned_prefix);
    RUN(put_replaces_what_it_extends);
    RUN(compressed_chunks_are_not_kept);
    RUN(takes_copy_while_the_budget_has_room);
    RUN(put_copy_leaves_the_generation_its_kv);
    RUN(cap_and_shed_evict_least_recent);
    kv_pool_free(pool);
    return test_finish();
}
