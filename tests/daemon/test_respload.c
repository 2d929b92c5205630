/*
 * Tests of stored responses read back at start (daemon/respload.h): what the store holds
 * comes back into the gateway's memory, each response its own uid's; a damaged record,
 * one whose text is not its response and one over half the budget are skipped with a
 * warning and deleted from the store; a smaller budget keeps the newest on disk and in
 * memory alike, whatever the records say they take; responses_store = memory deletes
 * them all.
 */
#include <fcntl.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/config.h"
#include "daemon/net/respstore.h"
#include "daemon/respload.h"
#include "storage/responses.h"
#include "storage/store.h"
#include "tests/support/test.h"

static const char *dir_of(const char *name)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s/state", test_tmpdir(), name);
    return path;
}

/* Stores response resp_<n> of uid as the gateway would, its text naming text_id (NULL:
 * its own id) and padded with pad bytes; bytes < 0: what memory counts it for. */
static int put(store *s, int n, uint32_t uid, const char *text_id, size_t pad, int64_t bytes)
{
    char id[32], err[ERR_MAX], items[64];
    snprintf(id, sizeof id, "resp_%d", n);
    size_t cap = pad + 128;
    char *text = malloc(cap);
    if (!text)
        return -1;
    int tn = snprintf(text, cap, "{\"id\":\"%s\",\"object\":\"response\",\"pad\":\"%*s\"}",
                      text_id ? text_id : id, (int)pad, "");
    int in = snprintf(items, sizeof items, "[{\"id\":\"msg_%d\",\"type\":\"message\"}]", n);
    store_response r = {.id = id, .uid = uid, .created = 1700000000 + n, .response = text,
                        .response_len = (size_t)tn, .items = items, .items_len = (size_t)in,
                        .bytes = bytes >= 0 ? bytes
                                            : (int64_t)respstore_bytes_of((size_t)tn,
                                                                          (size_t)in)};
    int rc = store_response_put(s, &r, 1 << 30, err);
    if (rc)
        fprintf(stderr, "put %d: %s\n", n, err);
    free(text);
    return rc;
}

static bool has(const respstore *m, uint32_t uid, int n)
{
    char id[32];
    respstore_entry e;
    snprintf(id, sizeof id, "resp_%d", n);
    return respstore_get(m, uid, id, &e);
}

static int see_id(void *arg, const store_response *r)
{
    char *out = arg;
    size_t len = strlen(out);
    snprintf(out + len, 512 - len, "%s%s", len ? " " : "", r->id ? r->id : "(null)");
    return 0;
}

/* The ids the store holds, oldest first, joined with spaces into out (512 bytes). */
static void stored_ids(store *s, char *out)
{
    char err[ERR_MAX];
    out[0] = '\0';
    if (store_response_list(s, see_id, out, err))
        snprintf(out, 512, "(list failed: %s)", err);
}

/* respload with stderr caught into log (cap bytes). */
static void load_logged(store *s, respstore *m, const config *c, char *log, size_t cap)
{
    char path[600];
    snprintf(path, sizeof path, "%s/respload.log", test_tmpdir());
    fflush(stderr);
    int saved = dup(2), fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (saved >= 0 && fd >= 0)
        dup2(fd, 2);
    respload(s, m, c);
    fflush(stderr);
    if (saved >= 0) {
        dup2(saved, 2);
        close(saved);
    }
    ssize_t n = fd >= 0 ? pread(fd, log, cap - 1, 0) : -1;
    log[n > 0 ? n : 0] = '\0';
    if (fd >= 0)
        close(fd);
}

static config defaults(void)
{
    config c;
    char err[ERR_MAX];
    if (config_defaults(&c, err))
        fprintf(stderr, "config: %s\n", err);
    return c;
}

static void responses_come_back_per_uid(void)
{
    char err[ERR_MAX], ids[512], log[4096];
    const char *dir = dir_of("uids");
    store *s = store_open(dir, err);
    CHECK_MSG(s, "%s", err);
    CHECK_EQ(put(s, 1, 1000, NULL, 0, -1), 0);
    CHECK_EQ(put(s, 2, 1001, NULL, 0, -1), 0);
    CHECK_EQ(put(s, 3, 1000, "resp_other", 0, -1), 0); /* not its own response */
    CHECK_EQ(put(s, 4, 1000, NULL, 0, -1), 0);
    store_close(s);
    /* a byte of resp_4's text changed on disk */
    char path[600];
    snprintf(path, sizeof path, "%s/llmsd.db", dir);
    sqlite3 *db = NULL;
    CHECK(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL) == SQLITE_OK);
    CHECK(sqlite3_exec(db, "UPDATE responses SET response = CAST(replace(CAST(response AS "
                           "TEXT), 'response', 'respXnse') AS BLOB) WHERE id = 'resp_4'",
                       NULL, NULL, NULL) == SQLITE_OK);
    sqlite3_close(db);
    s = store_open(dir, err);
    CHECK_MSG(s, "%s", err);
    config c = defaults();
    respstore *m = respstore_new((size_t)c.responses_store_bytes);
    CHECK(m);
    load_logged(s, m, &c, log, sizeof log);
    CHECK_EQ(respstore_count(m), 2);
    CHECK(has(m, 1000, 1) && has(m, 1001, 2));
    /* each its own uid's: another uid finds nothing */
    CHECK(!has(m, 1001, 1) && !has(m, 1000, 2));
    CHECK(!has(m, 1000, 3) && !has(m, 1000, 4));
    respstore_entry e;
    CHECK(respstore_get(m, 1000, "resp_1", &e) && strstr(e.response, "\"id\":\"resp_1\"") &&
          !strcmp(e.items, "[{\"id\":\"msg_1\",\"type\":\"message\"}]"));
    CHECK_MSG(strstr(log, "resp_3") && strstr(log, "not the response object") &&
                  strstr(log, "resp_4") && strstr(log, "checksum") && strstr(log, "skipped"),
              "%s", log);
    /* the skipped ones are gone from the store, the others kept */
    stored_ids(s, ids);
    CHECK_MSG(!strcmp(ids, "resp_1 resp_2"), "%s", ids);
    respstore_free(m);
    store_close(s);
}

static void budget_holds_on_disk_and_in_memory(void)
{
    char err[ERR_MAX], ids[512], log[4096];
    const char *dir = dir_of("budget");
    store *s = store_open(dir, err);
    CHECK_MSG(s, "%s", err);
    for (int i = 1; i <= 6; i++)
        CHECK_EQ(put(s, i, 1000, NULL, 900, -1), 0);
    /* one of more than half the budget below */
    CHECK_EQ(put(s, 7, 1000, NULL, 3000, -1), 0);
    config c = defaults();
    c.responses_store_bytes = (int)respstore_bytes_of(1000, 40) * 5;
    respstore *m = respstore_new((size_t)c.responses_store_bytes);
    CHECK(m);
    load_logged(s, m, &c, log, sizeof log);
    /* the store was trimmed first: 7 takes about 3 of the 5, so 6 and 5 fit beside it,
     * and 7 itself is refused by memory (over half) and deleted */
    CHECK_MSG(has(m, 1000, 5) && has(m, 1000, 6) && !has(m, 1000, 7) && !has(m, 1000, 4),
              "%zu kept: %s", respstore_count(m), log);
    stored_ids(s, ids);
    CHECK_MSG(!strcmp(ids, "resp_5 resp_6"), "%s", ids);
    CHECK_MSG(strstr(log, "resp_7") && strstr(log, "more than half"), "%s", log);
    respstore_free(m);
    /* records that say they take less than memory counts: memory evicts, and the store
     * follows it */
    CHECK_EQ(store_response_trim(s, 0, NULL, err), 0);
    for (int i = 1; i <= 6; i++)
        CHECK_EQ(put(s, i, 1000, NULL, 900, 1), 0);
    m = respstore_new((size_t)c.responses_store_bytes);
    CHECK(m);
    load_logged(s, m, &c, log, sizeof log);
    size_t kept = respstore_count(m);
    CHECK_MSG(kept >= 2 && kept < 6, "%zu kept", kept);
    char want[512] = "";
    for (int i = 7 - (int)kept; i <= 6; i++) {
        CHECK(has(m, 1000, i));
        snprintf(want + strlen(want), sizeof want - strlen(want), "%sresp_%d",
                 want[0] ? " " : "", i);
    }
    stored_ids(s, ids);
    CHECK_MSG(!strcmp(ids, want), "stored %s, kept %s", ids, want);
    respstore_free(m);
    store_close(s);
}

static void memory_mode_deletes_them(void)
{
    char err[ERR_MAX], ids[512], log[4096];
    store *s = store_open(dir_of("memory"), err);
    CHECK_MSG(s, "%s", err);
    CHECK_EQ(put(s, 1, 1000, NULL, 0, -1), 0);
    config c = defaults();
    snprintf(c.responses_store, sizeof c.responses_store, "memory");
    respstore *m = respstore_new((size_t)c.responses_store_bytes);
    CHECK(m);
    load_logged(s, m, &c, log, sizeof log);
    CHECK_EQ(respstore_count(m), 0);
    stored_ids(s, ids);
    CHECK_MSG(!ids[0], "%s", ids);
    respstore_free(m);
    store_close(s);
}

int main(void)
{
    RUN(responses_come_back_per_uid);
    RUN(budget_holds_on_disk_and_in_memory);
    RUN(memory_mode_deletes_them);
    return test_finish();
}
