/*
 * Tests of the stored responses in the catalog (storage/responses.h): what is put comes
 * back whole after a reopen, oldest first, with its uid, time and link; the same id
 * again replaces it as the newest; a budget keeps the newest, evicting from the oldest,
 * in the put's own transaction, and a trim does the same (to nothing at 0); a delete
 * takes its uid's response alone; a row changed on disk is listed as damaged (the others
 * as they were) and deleted by its seq.
 */
#include <sqlite3.h>
#include <stdio.h>
#include <string.h>

#include "storage/responses.h"
#include "storage/store.h"
#include "tests/support/test.h"

#define MAX_SEEN 16

/* What a listing saw, copied out of the store's scope. */
typedef struct seen {
    int n, damaged;
    int64_t seq[MAX_SEEN];
    char id[MAX_SEEN][64];
    uint32_t uid[MAX_SEEN];
    int64_t created[MAX_SEEN], bytes[MAX_SEEN];
    char previous[MAX_SEEN][64]; /* "-" for none */
    char response[MAX_SEEN][128], items[MAX_SEEN][64];
} seen;

static int see(void *arg, const store_response *r)
{
    seen *s = arg;
    int i = s->n++;
    if (i >= MAX_SEEN)
        return 0;
    s->damaged += r->damage != NULL;
    s->seq[i] = r->seq;
    snprintf(s->id[i], sizeof s->id[i], "%s", r->id ? r->id : "(null)");
    s->uid[i] = r->uid;
    s->created[i] = r->created;
    s->bytes[i] = r->bytes;
    snprintf(s->previous[i], sizeof s->previous[i], "%s", r->previous ? r->previous : "-");
    snprintf(s->response[i], sizeof s->response[i], "%.*s", (int)r->response_len,
             (const char *)r->response);
    snprintf(s->items[i], sizeof s->items[i], "%.*s", (int)r->items_len,
             (const char *)r->items);
    return 0;
}

static const char *dir_of(const char *name)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s/state", test_tmpdir(), name);
    return path;
}

/* Puts response resp_<n> of uid, 100 bytes by the budget, after previous (or none). */
static int put(store *s, int n, uint32_t uid, const char *previous, int64_t budget)
{
    char id[32], text[64], items[32], err[ERR_MAX];
    snprintf(id, sizeof id, "resp_%d", n);
    int tn = snprintf(text, sizeof text, "{\"id\":\"%s\"}", id);
    int in = snprintf(items, sizeof items, "[{\"n\":%d}]", n);
    store_response r = {.id = id, .uid = uid, .created = 1700000000 + n, .previous = previous,
                        .response = text, .response_len = (size_t)tn, .items = items,
                        .items_len = (size_t)in, .bytes = 100};
    int rc = store_response_put(s, &r, budget, err);
    if (rc)
        fprintf(stderr, "put %d: %s\n", n, err);
    return rc;
}

static int list(store *s, seen *out)
{
    char err[ERR_MAX];
    memset(out, 0, sizeof *out);
    int rc = store_response_list(s, see, out, err);
    if (rc)
        fprintf(stderr, "list: %s\n", err);
    return rc;
}

/* The ids listed, joined with spaces. */
static const char *ids(const seen *s)
{
    static char out[512];
    out[0] = '\0';
    for (int i = 0; i < s->n && i < MAX_SEEN; i++)
        snprintf(out + strlen(out), sizeof out - strlen(out), "%s%s", i ? " " : "", s->id[i]);
    return out;
}

static void round_trip_after_reopen(void)
{
    char err[ERR_MAX];
    const char *dir = dir_of("trip");
    store *s = store_open(dir, err);
    CHECK_MSG(s, "%s", err);
    CHECK_EQ(put(s, 1, 1000, NULL, 1 << 20), 0);
    CHECK_EQ(put(s, 2, 1001, NULL, 1 << 20), 0);
    CHECK_EQ(put(s, 3, 1000, "resp_1", 1 << 20), 0);
    store_close(s);
    s = store_open(dir, err);
    CHECK_MSG(s, "%s", err);
    seen v;
    CHECK_EQ(list(s, &v), 0);
    CHECK_EQ(v.n, 3);
    CHECK_EQ(v.damaged, 0);
    CHECK_MSG(!strcmp(ids(&v), "resp_1 resp_2 resp_3"), "%s", ids(&v));
    CHECK(v.seq[0] < v.seq[1] && v.seq[1] < v.seq[2]);
    CHECK(v.uid[0] == 1000 && v.uid[1] == 1001 && v.uid[2] == 1000);
    CHECK(v.created[0] == 1700000001 && v.created[2] == 1700000003);
    CHECK(!strcmp(v.previous[0], "-") && !strcmp(v.previous[2], "resp_1"));
    CHECK_MSG(!strcmp(v.response[2], "{\"id\":\"resp_3\"}"), "%s", v.response[2]);
    CHECK_MSG(!strcmp(v.items[1], "[{\"n\":2}]"), "%s", v.items[1]);
    CHECK_EQ(v.bytes[1], 100);
    int64_t n, bytes;
    CHECK_EQ(store_response_count(s, &n, &bytes, err), 0);
    CHECK(n == 3 && bytes == 300);
    /* the same id again: replaced, and now the newest */
    CHECK_EQ(put(s, 1, 1002, NULL, 1 << 20), 0);
    CHECK_EQ(list(s, &v), 0);
    CHECK_MSG(!strcmp(ids(&v), "resp_2 resp_3 resp_1") && v.uid[2] == 1002, "%s", ids(&v));
    store_close(s);
}

static void budget_evicts_the_oldest(void)
{
    char err[ERR_MAX];
    store *s = store_open(dir_of("evict"), err);
    CHECK_MSG(s, "%s", err);
    /* 100 bytes each under 350: the newest three stay after every put */
    for (int i = 1; i <= 6; i++)
        CHECK_EQ(put(s, i, 1000, NULL, 350), 0);
    seen v;
    CHECK_EQ(list(s, &v), 0);
    CHECK_MSG(!strcmp(ids(&v), "resp_4 resp_5 resp_6"), "%s", ids(&v));
    /* exactly the budget fits */
    CHECK_EQ(put(s, 7, 1000, NULL, 300), 0);
    CHECK_EQ(list(s, &v), 0);
    CHECK_MSG(!strcmp(ids(&v), "resp_5 resp_6 resp_7"), "%s", ids(&v));
    int evicted;
    CHECK_EQ(store_response_trim(s, 150, &evicted, err), 0);
    CHECK_EQ(evicted, 2);
    CHECK_EQ(list(s, &v), 0);
    CHECK_MSG(!strcmp(ids(&v), "resp_7"), "%s", ids(&v));
    CHECK_EQ(store_response_trim(s, 150, &evicted, err), 0);
    CHECK_EQ(evicted, 0);
    CHECK_EQ(store_response_trim(s, 0, &evicted, err), 0);
    CHECK_EQ(evicted, 1);
    CHECK_EQ(list(s, &v), 0);
    CHECK_EQ(v.n, 0);
    store_close(s);
    /* and it stays so on disk */
    s = store_open(dir_of("evict"), err);
    CHECK_MSG(s, "%s", err);
    int64_t n, bytes;
    CHECK_EQ(store_response_count(s, &n, &bytes, err), 0);
    CHECK(n == 0 && bytes == 0);
    store_close(s);
}

static void delete_is_its_uids(void)
{
    char err[ERR_MAX];
    const char *dir = dir_of("delete");
    store *s = store_open(dir, err);
    CHECK_MSG(s, "%s", err);
    CHECK_EQ(put(s, 1, 1000, NULL, 1 << 20), 0);
    CHECK_EQ(put(s, 2, 1000, NULL, 1 << 20), 0);
    bool found;
    CHECK_EQ(store_response_delete(s, 1001, "resp_1", &found, err), 0);
    CHECK(!found);
    CHECK_EQ(store_response_delete(s, 1000, "resp_1", &found, err), 0);
    CHECK(found);
    CHECK_EQ(store_response_delete(s, 1000, "resp_1", &found, err), 0);
    CHECK(!found);
    store_close(s);
    s = store_open(dir, err);
    CHECK_MSG(s, "%s", err);
    seen v;
    CHECK_EQ(list(s, &v), 0);
    CHECK_MSG(!strcmp(ids(&v), "resp_2"), "%s", ids(&v));
    CHECK_EQ(store_response_delete_seq(s, v.seq[0], err), 0);
    CHECK_EQ(list(s, &v), 0);
    CHECK_EQ(v.n, 0);
    store_close(s);
}

/* Runs sql on the catalog of dir, beside the store (closed). */
static int raw_exec(const char *dir, const char *sql)
{
    char path[600];
    snprintf(path, sizeof path, "%s/llmsd.db", dir);
    sqlite3 *db = NULL;
    int rc = sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(db, sql, NULL, NULL, NULL);
    sqlite3_close(db);
    return rc == SQLITE_OK ? 0 : -1;
}

static void changed_row_is_damaged(void)
{
    char err[ERR_MAX];
    const char *dir = dir_of("damage");
    static const char *const changes[] = {
        "UPDATE responses SET response = CAST('{\"id\":\"resp_2\",\"x\":1}' AS BLOB) "
        "WHERE id = 'resp_2'",
        "UPDATE responses SET uid = 1001 WHERE id = 'resp_2'",
        "UPDATE responses SET previous = 'resp_9' WHERE id = 'resp_2'",
        "UPDATE responses SET bytes = 1 WHERE id = 'resp_2'",
        "UPDATE responses SET id = 'resp_9' WHERE id = 'resp_2'",
        "UPDATE responses SET items = 'x' WHERE id = 'resp_2'",
    };
    for (size_t c = 0; c < sizeof changes / sizeof changes[0]; c++) {
        store *s = store_open(dir, err);
        CHECK_MSG(s, "%s", err);
        CHECK_EQ(store_response_trim(s, 0, NULL, err), 0);
        for (int i = 1; i <= 3; i++)
            CHECK_EQ(put(s, i, 1000, NULL, 1 << 20), 0);
        store_close(s);
        CHECK_MSG(raw_exec(dir, changes[c]) == 0, "%s", changes[c]);
        s = store_open(dir, err);
        CHECK_MSG(s, "%s", err);
        seen v;
        CHECK_EQ(list(s, &v), 0);
        CHECK_EQ(v.n, 3);
        CHECK_MSG(v.damaged == 1, "%s: %d damaged", changes[c], v.damaged);
        CHECK(!strcmp(v.id[0], "resp_1") && !strcmp(v.id[2], "resp_3"));
        CHECK_EQ(store_response_delete_seq(s, v.seq[1], err), 0);
        CHECK_EQ(list(s, &v), 0);
        CHECK_MSG(v.damaged == 0 && !strcmp(ids(&v), "resp_1 resp_3"), "%s", ids(&v));
        store_close(s);
    }
}

int main(void)
{
    RUN(round_trip_after_reopen);
    RUN(budget_evicts_the_oldest);
    RUN(delete_is_its_uids);
    RUN(changed_row_is_damaged);
    return test_finish();
}
