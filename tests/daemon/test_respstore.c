/*
 * Tests of the stored responses (daemon/net/respstore.h): a response comes back as it was
 * put, for its uid alone; the budget holds the newest ones, evicting from the oldest; one
 * over half the budget is refused without evicting anything; a store of budget 0 keeps
 * nothing; ids are checked; counts and bytes follow every change and the budget bounds
 * them under random puts and deletes.
 */
#include <stdio.h>
#include <string.h>

#include "daemon/net/respstore.h"
#include "tests/support/test.h"

/* Puts response i of uid with texts that name it. */
static int put(respstore *s, uid_t uid, int i, size_t pad)
{
    char id[32], resp[4096], items[64];
    snprintf(id, sizeof id, "resp_%04d", i);
    int n = snprintf(resp, sizeof resp, "{\"id\":\"%s\",\"pad\":\"%*s\"}", id, (int)pad, "");
    int m = snprintf(items, sizeof items, "[{\"id\":\"msg_%d\"}]", i);
    return respstore_put(s, uid, id, resp, (size_t)n, items, (size_t)m);
}

static bool has(const respstore *s, uid_t uid, int i)
{
    char id[32];
    respstore_entry e;
    snprintf(id, sizeof id, "resp_%04d", i);
    return respstore_get(s, uid, id, &e);
}

static void put_get_is_the_same(void)
{
    respstore *s = respstore_new(1 << 20);
    CHECK(s && respstore_on(s));
    CHECK_EQ(respstore_put(s, 7, "resp_ab-C_9", "{\"a\":1}", 7, "[]", 2), 0);
    respstore_entry e;
    CHECK(respstore_get(s, 7, "resp_ab-C_9", &e));
    CHECK(e.response_len == 7 && !strcmp(e.response, "{\"a\":1}"));
    CHECK(e.items_len == 2 && !strcmp(e.items, "[]"));
    /* another uid, or an id never put: not there, alike */
    CHECK(!respstore_get(s, 8, "resp_ab-C_9", &e));
    CHECK(!respstore_get(s, 7, "resp_ab-C_8", &e));
    CHECK(!respstore_delete(s, 8, "resp_ab-C_9"));
    CHECK(respstore_get(s, 7, "resp_ab-C_9", &e));
    /* the same id again replaces it */
    CHECK_EQ(respstore_put(s, 7, "resp_ab-C_9", "{\"a\":2}", 7, "[1]", 3), 0);
    CHECK(respstore_get(s, 7, "resp_ab-C_9", &e) && !strcmp(e.response, "{\"a\":2}"));
    CHECK_EQ(respstore_count(s), 1);
    CHECK(respstore_delete(s, 7, "resp_ab-C_9"));
    CHECK(!respstore_get(s, 7, "resp_ab-C_9", &e));
    CHECK_EQ(respstore_count(s), 0);
    CHECK_EQ(respstore_bytes(s), 0);
    respstore_free(s);
}

static void ids_are_checked(void)
{
    static const char *const good[] = {"resp_0", "resp_abcDEF012_-"};
    static const char *const bad[] = {"", "resp_", "resp", "msg_0", "resp_a/b", "resp_a b",
                                      "resp_\xc3\xa9", "resp_a.b", "resp_%2F"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        CHECK_MSG(respstore_id_valid(good[i], strlen(good[i])), "'%s'", good[i]);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK_MSG(!respstore_id_valid(bad[i], strlen(bad[i])), "'%s'", bad[i]);
    /* RESPSTORE_ID_MAX bytes at most */
    char id[RESPSTORE_ID_MAX + 2] = "resp_";
    memset(id + 5, 'a', RESPSTORE_ID_MAX - 5);
    CHECK(respstore_id_valid(id, RESPSTORE_ID_MAX));
    id[RESPSTORE_ID_MAX] = 'a';
    CHECK(!respstore_id_valid(id, RESPSTORE_ID_MAX + 1));
    /* the length given counts, not the NUL */
    CHECK(!respstore_id_valid("resp_ab", 5));
    CHECK(respstore_id_valid("resp_ab/cd", 7));
}

static void oldest_go_first(void)
{
    respstore *s = respstore_new(8192);
    CHECK(s);
    for (int i = 0; i < 40; i++)
        CHECK_EQ(put(s, 1, i, 200), 0);
    size_t kept = respstore_count(s);
    CHECK_MSG(kept > 2 && kept < 40, "%zu kept", kept);
    CHECK(respstore_bytes(s) <= 8192);
    /* the newest ones, in a row */
    for (int i = 0; i < 40; i++)
        CHECK_MSG(has(s, 1, i) == (i >= 40 - (int)kept), "%d of 40 (%zu kept)", i, kept);
    /* one over half the budget is refused, and evicts nothing */
    size_t bytes = respstore_bytes(s);
    CHECK(put(s, 1, 100, 4096) != 0);
    CHECK(!has(s, 1, 100));
    CHECK_EQ(respstore_count(s), kept);
    CHECK_EQ(respstore_bytes(s), bytes);
    respstore_free(s);
}

static void off_keeps_nothing(void)
{
    respstore *s = respstore_new(0);
    CHECK(s && !respstore_on(s));
    CHECK(put(s, 1, 0, 0) != 0);
    CHECK(!has(s, 1, 0));
    CHECK_EQ(respstore_count(s), 0);
    respstore_free(s);
}

/* Random puts and deletes of several uids against a model of what must be there: what
 * get finds is what was last put and not deleted since nor evicted (evictions only take
 * from the oldest), and the bytes stay within the budget. */
static void random_changes_keep_the_bounds(void)
{
    uint64_t rng;
    test_random_seed(&rng);
    enum { N = 300 };
    respstore *s = respstore_new(64 << 10);
    CHECK(s);
    int owner[N];       /* the uid of id i when put, -1 when not */
    for (int i = 0; i < N; i++)
        owner[i] = -1;
    for (int step = 0; step < 20000; step++) {
        int i = (int)(test_random(&rng) % N);
        uid_t uid = (uid_t)(test_random(&rng) % 3);
        if (test_random(&rng) % 4) {
            CHECK_EQ(put(s, uid, i, (size_t)(test_random(&rng) % 2000)), 0);
            owner[i] = (int)uid;
        } else {
            bool found = has(s, uid, i);
            CHECK_MSG(!found || owner[i] == (int)uid, "step %d: %d found for uid %u", step, i,
                      (unsigned)uid);
            if (found) {
                char id[32];
                snprintf(id, sizeof id, "resp_%04d", i);
                CHECK(respstore_delete(s, uid, id));
                owner[i] = -1;
            }
        }
        CHECK(respstore_bytes(s) <= 64 << 10);
    }
    size_t n = 0;
    for (int i = 0; i < N; i++)
        n += owner[i] >= 0 && has(s, (uid_t)owner[i], i);
    CHECK_EQ(n, respstore_count(s));
    respstore_free(s);
}

int main(void)
{
    RUN(put_get_is_the_same);
    RUN(ids_are_checked);
    RUN(oldest_go_first);
    RUN(off_keeps_nothing);
    RUN(random_changes_keep_the_bounds);
    return test_finish();
}
