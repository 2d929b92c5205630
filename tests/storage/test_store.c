/* Tests of the sqlite3 catalog: contexts, turns, durability, isolation and bad files. */
#include <errno.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "storage/store.h"
#include "storage/store_internal.h"
#include "tests/support/test.h"

/* A fresh state directory (not yet created) for one test. */
static const char *fresh_dir(const char *name)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s/state", test_tmpdir(), name);
    return path;
}

#define MAX_SEEN 8

/* What the callbacks saw, copied out of the store's scope. */
typedef struct seen {
    int n;
    char id[MAX_SEEN][64];
    char app_name[MAX_SEEN][64];
    char system_prompt[MAX_SEEN][64];
    bool has_prompt[MAX_SEEN];
    unsigned char params[MAX_SEEN][16];
    size_t params_len[MAX_SEEN];
    int64_t app_id[MAX_SEEN], created_ms[MAX_SEEN], last_used_ms[MAX_SEEN];
    int64_t n_tokens[MAX_SEEN], n_turns[MAX_SEEN];
    uint32_t uid[MAX_SEEN];
    bool damaged[MAX_SEEN];
    int stop_after; /* return 7 once this many were seen (0: never) */
} seen;

static int see_context(void *arg, const store_context *c)
{
    seen *s = arg;
    if (s->n < MAX_SEEN) {
        int i = s->n;
        snprintf(s->id[i], sizeof s->id[i], "%s", c->id);
        snprintf(s->app_name[i], sizeof s->app_name[i], "%s", c->app_name);
        s->has_prompt[i] = c->system_prompt != NULL;
        snprintf(s->system_prompt[i], sizeof s->system_prompt[i], "%s",
                 c->system_prompt ? c->system_prompt : "");
        s->params_len[i] = c->params_len;
        if (c->params && c->params_len <= sizeof s->params[i])
            memcpy(s->params[i], c->params, c->params_len);
        s->app_id[i] = c->app_id;
        s->uid[i] = c->uid;
        s->created_ms[i] = c->created_ms;
        s->last_used_ms[i] = c->last_used_ms;
        s->n_tokens[i] = c->n_tokens;
        s->n_turns[i] = c->n_turns;
        s->damaged[i] = c->damage != NULL;
    }
    s->n++;
    return s->stop_after && s->n >= s->stop_after ? 7 : 0;
}

/* Turns read back, concatenated. */
typedef struct history {
    int n_turns;
    char roles[16384];
    char texts[65536];
    int32_t tokens[65536];
    int n_tokens;
    bool overflow;
} history;

static int see_turn(void *arg, const store_turn *t)
{
    history *h = arg;
    size_t rl = strlen(h->roles), tl = strlen(h->texts);
    if (rl + strlen(t->role) + 2 > sizeof h->roles || tl + strlen(t->text) + 2 > sizeof h->texts ||
        h->n_tokens + t->n_tokens > (int)(sizeof h->tokens / sizeof h->tokens[0])) {
        h->overflow = true;
        return 0;
    }
    snprintf(h->roles + rl, sizeof h->roles - rl, "%s|", t->role);
    snprintf(h->texts + tl, sizeof h->texts - tl, "%s|", t->text);
    if (t->n_tokens)
        memcpy(h->tokens + h->n_tokens, t->tokens, (size_t)t->n_tokens * sizeof *t->tokens);
    h->n_tokens += t->n_tokens;
    h->n_turns++;
    return 0;
}

/* Opens the database file directly, beside the store, to do what the API cannot. */
static sqlite3 *raw_db(const char *dir)
{
    char path[600];
    snprintf(path, sizeof path, "%s/llmsd.db", dir);
    sqlite3 *db = NULL;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL) != SQLITE_OK) {
        sqlite3_close(db);
        return NULL;
    }
    sqlite3_busy_timeout(db, 2000);
    return db;
}

static void create_list_get_delete(void)
{
    char err[ERR_MAX] = "";
    const char *dir = fresh_dir("crud");
    store *s = store_open(dir, err);
    CHECK_MSG(s != NULL, "%s", err);
    struct stat st;
    CHECK(stat(dir, &st) == 0 && S_ISDIR(st.st_mode));
    mode_t mask = umask(0);
    umask(mask);
    CHECK_EQ(st.st_mode & 0777, 0750 & ~mask);

    int64_t app, again, other;
    CHECK_MSG(store_app_id(s, 1000, "notes", &app, err) == 0, "%s", err);
    CHECK_MSG(store_app_id(s, 1000, "notes", &again, err) == 0, "%s", err);
    CHECK_EQ(app, again);
    CHECK_MSG(store_app_id(s, 1001, "notes", &other, err) == 0, "%s", err);
    CHECK(other != app);

    const unsigned char params[] = {1, 0, 2, 0xff};
    CHECK_MSG(store_context_create(s, "ctx-a", app, "be brief", params, sizeof params, 100, err) == 0,
              "%s", err);
    CHECK_MSG(store_context_create(s, "ctx-b", app, NULL, NULL, 0, 200, err) == 0, "%s", err);
    CHECK(store_context_create(s, "ctx-a", app, NULL, NULL, 0, 300, err) == -1);
    CHECK_MSG(strstr(err, "ctx-a") && strstr(err, "UNIQUE"), "%s", err);
    CHECK(store_context_create(s, "ctx-c", 12345, NULL, NULL, 0, 300, err) == -1);
    CHECK_MSG(strstr(err, "FOREIGN KEY"), "%s", err);

    seen all = {0};
    CHECK_MSG(store_context_list(s, app, see_context, &all, err) == 0, "%s", err);
    CHECK_EQ(all.n, 2);
    CHECK(strcmp(all.id[0], "ctx-a") == 0 && strcmp(all.id[1], "ctx-b") == 0);
    CHECK(all.has_prompt[0] && strcmp(all.system_prompt[0], "be brief") == 0);
    CHECK(!all.has_prompt[1]);
    CHECK_EQ(all.params_len[0], sizeof params);
    CHECK(memcmp(all.params[0], params, sizeof params) == 0);
    CHECK_EQ(all.params_len[1], 0);
    CHECK_EQ(all.uid[0], 1000);
    CHECK(strcmp(all.app_name[0], "notes") == 0);
    CHECK_EQ(all.app_id[0], app);
    CHECK_EQ(all.created_ms[0], 100);
    CHECK_EQ(all.last_used_ms[1], 200);
    CHECK_EQ(all.n_tokens[0], 0);
    CHECK_EQ(all.n_turns[0], 0);

    seen first = {.stop_after = 1};
    CHECK_EQ(store_context_list(s, -1, see_context, &first, err), 7);
    CHECK_EQ(first.n, 1);

    seen one = {0};
    bool found = false;
    CHECK_MSG(store_context_get(s, "ctx-b", see_context, &one, &found, err) == 0, "%s", err);
    CHECK(found);
    CHECK_EQ(one.n, 1);
    CHECK(strcmp(one.id[0], "ctx-b") == 0);
    found = false;
    CHECK(store_context_get(s, "ctx-b", NULL, NULL, &found, err) == 0 && found);

    seen none = {0};
    found = true;
    CHECK_EQ(store_context_get(s, "ctx-zzz", see_context, &none, &found, err), 0);
    CHECK(!found);
    CHECK_EQ(none.n, 0);

    CHECK_MSG(store_context_delete(s, "ctx-a", &found, err) == 0, "%s", err);
    CHECK(found);
    CHECK_MSG(store_context_delete(s, "ctx-a", &found, err) == 0, "%s", err);
    CHECK(!found);
    seen left = {0};
    CHECK_MSG(store_context_list(s, -1, see_context, &left, err) == 0, "%s", err);
    CHECK_EQ(left.n, 1);
    CHECK(strcmp(left.id[0], "ctx-b") == 0);
    store_close(s);
}

static void listing_is_per_app(void)
{
    char err[ERR_MAX] = "";
    store *s = store_open(fresh_dir("apps"), err);
    CHECK_MSG(s != NULL, "%s", err);
    int64_t a, b, c;
    CHECK(store_app_id(s, 1000, "alpha", &a, err) == 0);
    CHECK(store_app_id(s, 1000, "beta", &b, err) == 0);
    CHECK(store_app_id(s, 1001, "alpha", &c, err) == 0);
    CHECK(a != b && b != c && a != c);
    CHECK(store_context_create(s, "a1", a, NULL, NULL, 0, 1, err) == 0);
    CHECK(store_context_create(s, "b1", b, NULL, NULL, 0, 2, err) == 0);
    CHECK(store_context_create(s, "a2", a, NULL, NULL, 0, 3, err) == 0);

    seen sa = {0}, sb = {0}, sc = {0}, all = {0};
    CHECK(store_context_list(s, a, see_context, &sa, err) == 0);
    CHECK(store_context_list(s, b, see_context, &sb, err) == 0);
    CHECK(store_context_list(s, c, see_context, &sc, err) == 0);
    CHECK(store_context_list(s, -1, see_context, &all, err) == 0);
    CHECK_EQ(sa.n, 2);
    CHECK(strcmp(sa.id[0], "a1") == 0 && strcmp(sa.id[1], "a2") == 0);
    CHECK_EQ(sb.n, 1);
    CHECK(strcmp(sb.id[0], "b1") == 0 && strcmp(sb.app_name[0], "beta") == 0);
    CHECK_EQ(sc.n, 0);
    CHECK_EQ(all.n, 3);
    CHECK(strcmp(all.id[0], "a1") == 0 && strcmp(all.id[1], "b1") == 0 &&
          strcmp(all.id[2], "a2") == 0);
    CHECK(store_context_list(s, -2, see_context, &all, err) == -1);
    store_close(s);
}

static void turns_and_tokens_round_trip(void)
{
    char err[ERR_MAX] = "";
    const char *dir = fresh_dir("turns");
    store *s = store_open(dir, err);
    CHECK_MSG(s != NULL, "%s", err);
    int64_t app;
    CHECK(store_app_id(s, 7, "chat", &app, err) == 0);
    CHECK(store_context_create(s, "c", app, "sys", NULL, 0, 10, err) == 0);

    const int32_t sys_tok[] = {1, 2, 3};
    const int32_t user_tok[] = {-1, 0, 0x7fffffff, (int32_t)0x80000000, 0x01020304, 255};
    store_turn first[] = {
        {"system", "sys", sys_tok, 3},
        {"user", "héllo ✓", user_tok, 6},
    };
    CHECK_MSG(store_context_append(s, "c", first, 2, 20, err) == 0, "%s", err);
    const int32_t reply_tok[] = {42};
    store_turn second[] = {{"assistant", "", reply_tok, 1}, {"raw", "x", NULL, 0}};
    CHECK_MSG(store_context_append(s, "c", second, 2, 30, err) == 0, "%s", err);

    history *h = calloc(1, sizeof *h);
    CHECK(h != NULL);
    int rc = store_context_turns(s, "c", see_turn, h, err);
    bool ok = rc == 0 && !h->overflow && h->n_turns == 4 &&
              strcmp(h->roles, "system|user|assistant|raw|") == 0 &&
              strcmp(h->texts, "sys|héllo ✓||x|") == 0 && h->n_tokens == 10 &&
              memcmp(h->tokens, sys_tok, sizeof sys_tok) == 0 &&
              memcmp(h->tokens + 3, user_tok, sizeof user_tok) == 0 && h->tokens[9] == 42;
    free(h);
    CHECK_MSG(ok, "rc %d: %s", rc, err);

    seen one = {0};
    bool found;
    CHECK(store_context_get(s, "c", see_context, &one, &found, err) == 0 && found);
    CHECK_EQ(one.n_turns[0], 4);
    CHECK_EQ(one.n_tokens[0], 10);
    CHECK_EQ(one.last_used_ms[0], 30);
    CHECK_EQ(one.created_ms[0], 10);

    /* The blob format is part of the contract: int32 little-endian. */
    sqlite3 *db = raw_db(dir);
    CHECK(db != NULL);
    sqlite3_stmt *st;
    CHECK(sqlite3_prepare_v2(db, "SELECT hex(tokens) FROM turns WHERE seq = 1", -1, &st, NULL) ==
          SQLITE_OK);
    CHECK(sqlite3_step(st) == SQLITE_ROW);
    ok = strcmp((const char *)sqlite3_column_text(st, 0),
                "FFFFFFFF00000000FFFFFF7F0000008004030201FF000000") == 0;
    sqlite3_finalize(st);
    sqlite3_close(db);
    CHECK(ok);
    store_close(s);
}

static void bad_arguments_are_refused(void)
{
    char err[ERR_MAX] = "";
    store *s = store_open(fresh_dir("args"), err);
    CHECK_MSG(s != NULL, "%s", err);
    int64_t app;
    bool found;
    CHECK(store_app_id(s, 1, "", &app, err) == -1);
    CHECK(store_app_id(s, 1, NULL, &app, err) == -1);
    CHECK(store_app_id(s, 1, "a", &app, err) == 0);
    CHECK(store_context_create(s, NULL, app, NULL, NULL, 0, 1, err) == -1);
    CHECK(store_context_create(s, "", app, NULL, NULL, 0, 1, err) == -1);
    CHECK(store_context_create(s, "c", app, NULL, NULL, 3, 1, err) == -1);
    CHECK(store_context_create(s, "c", app, NULL, NULL, 0, 1, err) == 0);
    CHECK(store_context_delete(s, "", &found, err) == -1 && !found);
    CHECK(store_context_get(s, NULL, see_context, NULL, &found, err) == -1 && !found);

    const int32_t tok[] = {5};
    store_turn good = {"user", "hi", tok, 1};
    store_turn bad_role = {"wizard", "hi", tok, 1};
    store_turn no_role = {NULL, "hi", tok, 1};
    store_turn no_text = {"user", NULL, tok, 1};
    store_turn neg = {"user", "hi", tok, -1};
    store_turn no_tokens = {"user", "hi", NULL, 2};
    CHECK(store_context_append(s, "c", &bad_role, 1, 2, err) == -1);
    CHECK_MSG(strstr(err, "wizard"), "%s", err);
    CHECK(store_context_append(s, "c", &no_role, 1, 2, err) == -1);
    CHECK(store_context_append(s, "c", &no_text, 1, 2, err) == -1);
    CHECK(store_context_append(s, "c", &neg, 1, 2, err) == -1);
    CHECK(store_context_append(s, "c", &no_tokens, 1, 2, err) == -1);
    CHECK(store_context_append(s, "c", &good, -1, 2, err) == -1);
    CHECK(store_context_append(s, "c", NULL, 1, 2, err) == -1);
    CHECK(store_context_append(s, NULL, &good, 1, 2, err) == -1);
    CHECK(store_context_append(s, "nope", &good, 1, 2, err) == -1);
    CHECK_MSG(strstr(err, "no context 'nope'"), "%s", err);
    history h0 = {0};
    CHECK(store_context_turns(s, "nope", see_turn, &h0, err) == -1);
    CHECK_MSG(strstr(err, "no context 'nope'"), "%s", err);
    CHECK(store_context_turns(s, "", see_turn, &h0, err) == -1);

    /* None of the refused appends wrote anything; an empty context reads as empty. */
    seen one = {0};
    CHECK(store_context_get(s, "c", see_context, &one, &found, err) == 0 && found);
    CHECK_EQ(one.n_turns[0], 0);
    CHECK_EQ(one.n_tokens[0], 0);
    CHECK_EQ(one.last_used_ms[0], 1);
    history *h = calloc(1, sizeof *h);
    CHECK(h != NULL);
    int rc = store_context_turns(s, "c", see_turn, h, err);
    int n = h->n_turns;
    free(h);
    CHECK_EQ(rc, 0);
    CHECK_EQ(n, 0);
    store_close(s);
}

static void committed_turns_survive_reopen(void)
{
    char err[ERR_MAX] = "";
    const char *dir = fresh_dir("reopen");
    store *s = store_open(dir, err);
    CHECK_MSG(s != NULL, "%s", err);
    int64_t app;
    CHECK(store_app_id(s, 5, "keep", &app, err) == 0);
    CHECK(store_context_create(s, "k", app, "p", "\x01\x02", 2, 1, err) == 0);
    const int32_t tok[] = {9, 8, 7};
    store_turn t = {"user", "remember", tok, 3};
    CHECK(store_context_append(s, "k", &t, 1, 2, err) == 0);
    store_close(s);

    s = store_open(dir, err);
    CHECK_MSG(s != NULL, "%s", err);
    int64_t app2;
    CHECK(store_app_id(s, 5, "keep", &app2, err) == 0);
    CHECK_EQ(app2, app);
    seen all = {0};
    CHECK(store_context_list(s, app, see_context, &all, err) == 0);
    CHECK_EQ(all.n, 1);
    CHECK(strcmp(all.id[0], "k") == 0 && strcmp(all.system_prompt[0], "p") == 0);
    CHECK_EQ(all.params_len[0], 2);
    CHECK(all.params[0][0] == 1 && all.params[0][1] == 2);
    CHECK_EQ(all.n_tokens[0], 3);
    history *h = calloc(1, sizeof *h);
    CHECK(h != NULL);
    int rc = store_context_turns(s, "k", see_turn, h, err);
    bool ok = rc == 0 && h->n_turns == 1 && strcmp(h->texts, "remember|") == 0 &&
              h->n_tokens == 3 && memcmp(h->tokens, tok, sizeof tok) == 0;
    free(h);
    CHECK_MSG(ok, "%s", err);
    store_close(s);
}

static void failed_append_leaves_nothing(void)
{
    char err[ERR_MAX] = "";
    const char *dir = fresh_dir("rollback");
    store *s = store_open(dir, err);
    CHECK_MSG(s != NULL, "%s", err);
    int64_t app;
    CHECK(store_app_id(s, 5, "r", &app, err) == 0);
    CHECK(store_context_create(s, "r", app, NULL, NULL, 0, 1, err) == 0);

    /* Take the sequence number the second turn will need, so the append fails half way
     * through, after its first turn was inserted. */
    sqlite3 *db = raw_db(dir);
    CHECK(db != NULL);
    int rc = sqlite3_exec(db, "INSERT INTO turns (context_id, seq, role, text, tokens)"
                              " VALUES ('r', 1, 'user', 'squatter', x'')", NULL, NULL, NULL);
    sqlite3_close(db);
    CHECK_EQ(rc, SQLITE_OK);

    const int32_t tok[] = {1, 2};
    store_turn turns[] = {{"user", "one", tok, 2}, {"assistant", "two", tok, 2}};
    CHECK(store_context_append(s, "r", turns, 2, 50, err) == -1);
    CHECK_MSG(strstr(err, "UNIQUE") && strstr(err, "turn 1"), "%s", err);

    history *h = calloc(1, sizeof *h);
    CHECK(h != NULL);
    /* the squatter is no turn the store wrote: a turn 1 without a turn 0 */
    rc = store_context_turns(s, "r", see_turn, h, err);
    bool ok = rc == STORE_E_DAMAGED && h->n_turns == 0 && strstr(err, "turn 1");
    free(h);
    CHECK_MSG(ok, "%d: %s", rc, err);
    seen one = {0};
    bool found;
    CHECK(store_context_get(s, "r", see_context, &one, &found, err) == 0 && found);
    CHECK_EQ(one.n_turns[0], 0);
    CHECK_EQ(one.n_tokens[0], 0);
    CHECK_EQ(one.last_used_ms[0], 1);

    /* The store is still usable afterwards: no transaction was left open. */
    CHECK_MSG(store_context_create(s, "r2", app, NULL, NULL, 0, 2, err) == 0, "%s", err);
    CHECK_MSG(store_context_append(s, "r2", turns, 2, 3, err) == 0, "%s", err);
    store_close(s);
}

static void corrupt_token_blob_is_an_error(void)
{
    char err[ERR_MAX] = "";
    const char *dir = fresh_dir("corrupt");
    store *s = store_open(dir, err);
    CHECK_MSG(s != NULL, "%s", err);
    int64_t app;
    CHECK(store_app_id(s, 5, "x", &app, err) == 0);
    CHECK(store_context_create(s, "x", app, NULL, NULL, 0, 1, err) == 0);
    const int32_t tok[] = {1, 2};
    store_turn t = {"user", "one", tok, 2};
    CHECK(store_context_append(s, "x", &t, 1, 2, err) == 0);

    sqlite3 *db = raw_db(dir);
    CHECK(db != NULL);
    int rc = sqlite3_exec(db, "UPDATE turns SET tokens = x'01020304050607'", NULL, NULL, NULL);
    sqlite3_close(db);
    CHECK_EQ(rc, SQLITE_OK);

    history *h = calloc(1, sizeof *h);
    CHECK(h != NULL);
    rc = store_context_turns(s, "x", see_turn, h, err);
    int n = h->n_turns;
    free(h);
    CHECK_EQ(rc, STORE_E_DAMAGED);
    CHECK_EQ(n, 0);
    CHECK_MSG(strstr(err, "multiple of 4") && strstr(err, "'x'"), "%s", err);
    store_close(s);
}

static void garbage_file_is_an_error(void)
{
    char err[ERR_MAX] = "";
    const char *dir = fresh_dir("garbage");
    store *s = store_open(dir, err);
    CHECK_MSG(s != NULL, "%s", err);
    store_close(s);
    char path[600];
    snprintf(path, sizeof path, "%s/llmsd.db", dir);
    /* Remove the WAL files too so nothing but the garbage is left to read. */
    char side[620];
    snprintf(side, sizeof side, "%s-wal", path);
    unlink(side);
    snprintf(side, sizeof side, "%s-shm", path);
    unlink(side);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    for (int i = 0; i < 4096; i++)
        fputc((i * 7919 + 13) & 0xff, f);
    fclose(f);

    err[0] = '\0';
    s = store_open(dir, err);
    CHECK(s == NULL);
    CHECK_MSG(strstr(err, "llmsd.db") && strstr(err, "not a database"), "%s", err);

    /* A state "directory" that is a file is refused too. */
    CHECK(store_open(path, err) == NULL);
    CHECK_MSG(strstr(err, "not a directory"), "%s", err);
}

/* A database whose pages are damaged names its file in the error, so that an admin
 * knows what to restore (it said "list contexts: database disk image is malformed"). */
static void damaged_page_names_the_file(void)
{
    char err[ERR_MAX] = "";
    const char *dir = fresh_dir("damaged");
    store *s = store_open(dir, err);
    CHECK_MSG(s != NULL, "%s", err);
    int64_t app;
    CHECK(store_app_id(s, 5, "x", &app, err) == 0);
    CHECK(store_context_create(s, "x", app, NULL, NULL, 0, 1, err) == 0);
    store_close(s);
    sqlite3 *db = raw_db(dir);
    CHECK(db != NULL);
    sqlite3_stmt *st;
    int page = 0, page_size = 0;
    CHECK_EQ(sqlite3_exec(db, "PRAGMA wal_checkpoint(TRUNCATE)", NULL, NULL, NULL), SQLITE_OK);
    CHECK_EQ(sqlite3_prepare_v2(db, "SELECT rootpage FROM sqlite_master WHERE name = 'contexts'",
                                -1, &st, NULL), SQLITE_OK);
    if (sqlite3_step(st) == SQLITE_ROW)
        page = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    CHECK_EQ(sqlite3_prepare_v2(db, "PRAGMA page_size", -1, &st, NULL), SQLITE_OK);
    if (sqlite3_step(st) == SQLITE_ROW)
        page_size = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(db);
    CHECK(page > 1 && page_size > 0);
    char path[600];
    snprintf(path, sizeof path, "%s/llmsd.db", dir);
    int fd = open(path, O_WRONLY);
    CHECK(fd >= 0);
    char junk[65536];
    memset(junk, 0x5a, sizeof junk);
    CHECK_EQ(pwrite(fd, junk, (size_t)page_size, (off_t)(page - 1) * page_size), page_size);
    close(fd);
    err[0] = '\0';
    s = store_open(dir, err);
    if (s) {
        seen all = {0};
        CHECK(store_context_list(s, -1, see_context, &all, err) != 0);
        store_close(s);
    }
    CHECK_MSG(strstr(err, "malformed") && strstr(err, path), "%s", err);
}

static void newer_schema_is_refused(void)
{
    char err[ERR_MAX] = "";
    const char *dir = fresh_dir("future");
    store *s = store_open(dir, err);
    CHECK_MSG(s != NULL, "%s", err);
    store_close(s);
    sqlite3 *db = raw_db(dir);
    CHECK(db != NULL);
    int rc = sqlite3_exec(db, "PRAGMA user_version = 99", NULL, NULL, NULL);
    sqlite3_close(db);
    CHECK_EQ(rc, SQLITE_OK);
    CHECK(store_open(dir, err) == NULL);
    CHECK_MSG(strstr(err, "schema version 99"), "%s", err);
}

/* A second opener of a state directory is refused while the first holds it. */
static void state_dir_is_locked(void)
{
    char err[ERR_MAX] = "";
    const char *dir = fresh_dir("locked");
    store *s = store_open(dir, err);
    CHECK_MSG(s != NULL, "%s", err);
    CHECK(store_open(dir, err) == NULL);
    CHECK_MSG(strstr(err, "in use by another llmsd") && strstr(err, "llmsd.lock"), "%s", err);
    store_close(s);
    s = store_open(dir, err);
    CHECK_MSG(s != NULL, "after the first closed: %s", err);
    store_close(s);
}

static long file_size(const char *dir, const char *name)
{
    char path[700];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return stat(path, &st) == 0 ? (long)st.st_size : 0;
}

/* Deleting large contexts gives their space back: the catalog and its log shrink
 * rather than keep the pages of rows long gone. */
static void deletes_give_space_back(void)
{
    char err[ERR_MAX] = "";
    const char *dir = fresh_dir("vacuum");
    store *s = store_open(dir, err);
    CHECK_MSG(s != NULL, "%s", err);
    int64_t app;
    CHECK(store_app_id(s, 5, "big", &app, err) == 0);
    enum { N = 8, BYTES = 1 << 20 };
    char *prompt = malloc(BYTES + 1);
    CHECK(prompt);
    for (int i = 0; i < BYTES; i++)
        prompt[i] = (char)('a' + (int)((unsigned)i * 7919u % 26u));
    prompt[BYTES] = '\0';
    char id[16];
    int ok = 1;
    for (int i = 0; i < N; i++) {
        snprintf(id, sizeof id, "big-%d", i);
        ok &= store_context_create(s, id, app, prompt, NULL, 0, 1, err) == 0;
    }
    free(prompt);
    CHECK_MSG(ok, "%s", err);
    long full = file_size(dir, "llmsd.db") + file_size(dir, "llmsd.db-wal");
    for (int i = 0; i < N; i++) {
        bool found;
        snprintf(id, sizeof id, "big-%d", i);
        CHECK_MSG(store_context_delete(s, id, &found, err) == 0 && found, "%s", err);
    }
    long after = file_size(dir, "llmsd.db") + file_size(dir, "llmsd.db-wal");
    store_close(s);
    CHECK_MSG(full > N * BYTES, "%ld bytes with the contexts", full);
    CHECK_MSG(after < 6 << 20, "%ld bytes with the contexts, %ld after deleting them", full,
              after);
}

/* A commit that takes the write-ahead log past 1000 pages leaves its checkpoint (the
 * pages copied into the database file, and its fsync) to the store's own thread: the
 * file holds the rows soon after, though the committing connection checkpointed
 * nothing. */
static void checkpoints_run_on_their_own_thread(void)
{
    char err[ERR_MAX] = "";
    const char *dir = fresh_dir("checkpoint");
    store *s = store_open(dir, err);
    CHECK_MSG(s != NULL, "%s", err);
    store_checkpointer *c = store_checkpointer_of(s);
    CHECK(c != NULL);
    long before = file_size(dir, "llmsd.db");
    uint64_t done = store_checkpointer_done(c);
    /* 6 MB, as a RagQuery's QKV node of 512 tokens of the documentation model */
    CHECK(store_exec_sql(s, "CREATE TABLE big (b BLOB);"
                            "INSERT INTO big VALUES (randomblob(6 << 20))", err) == 0);
    long wal = file_size(dir, "llmsd.db-wal");
    for (int i = 0; i < 500 && store_checkpointer_done(c) == done; i++)
        usleep(10 * 1000);
    long after = file_size(dir, "llmsd.db");
    CHECK_MSG(store_checkpointer_done(c) > done, "no checkpoint in 5 s");
    CHECK_MSG(wal > 6 << 20, "the log has %ld bytes after the commit", wal);
    CHECK_MSG(after > before + (6 << 20), "the file grew from %ld to %ld bytes", before, after);
    store_close(s);
}

/* A disk that fills up right after a commit: once armed, the next commit to the
 * write-ahead log (sqlite's WAL hook on every connection the store opens) fills it, and
 * from then on every write sqlite makes fails with ENOSPC. Disarmed, the hooks pass
 * everything through. */
static enum { DISK_OK, DISK_ARMED, DISK_FULL } disk_state;
static sqlite3_syscall_ptr real_write, real_pwrite, real_pwrite64;

static ssize_t full_write(int fd, const void *buf, size_t n)
{
    if (disk_state == DISK_FULL) {
        errno = ENOSPC;
        return -1;
    }
    return ((ssize_t(*)(int, const void *, size_t))real_write)(fd, buf, n);
}

static ssize_t full_pwrite(int fd, const void *buf, size_t n, off_t off)
{
    if (disk_state == DISK_FULL) {
        errno = ENOSPC;
        return -1;
    }
    return ((ssize_t(*)(int, const void *, size_t, off_t))real_pwrite)(fd, buf, n, off);
}

static ssize_t full_pwrite64(int fd, const void *buf, size_t n, off_t off)
{
    if (disk_state == DISK_FULL) {
        errno = ENOSPC;
        return -1;
    }
    return ((ssize_t(*)(int, const void *, size_t, off_t))real_pwrite64)(fd, buf, n, off);
}

static int fill_disk_on_commit(void *arg, sqlite3 *db, const char *name, int n_frames)
{
    (void)arg, (void)db, (void)name, (void)n_frames;
    if (disk_state == DISK_ARMED)
        disk_state = DISK_FULL;
    return SQLITE_OK;
}

/* sqlite sets its own WAL hook (the auto-checkpoint) once a connection is open: ours
 * goes in as each statement starts. */
static int hook_commits_now(unsigned what, void *arg, void *stmt, void *sql)
{
    (void)what, (void)arg, (void)sql;
    sqlite3_wal_hook(sqlite3_db_handle(stmt), fill_disk_on_commit, NULL);
    return 0;
}

static int hook_commits(sqlite3 *db, char **msg, const void *api)
{
    (void)msg, (void)api;
    sqlite3_trace_v2(db, SQLITE_TRACE_STMT, hook_commits_now, NULL);
    return SQLITE_OK;
}

/* Routes sqlite's writes through the full_* wrappers (on) or back (off). */
static void disk_can_fill(bool on)
{
    sqlite3_vfs *vfs = sqlite3_vfs_find(NULL);
    disk_state = DISK_OK;
    if (!on) {
        vfs->xSetSystemCall(vfs, NULL, NULL);
        sqlite3_reset_auto_extension();
        return;
    }
    real_write = vfs->xGetSystemCall(vfs, "write");
    real_pwrite = vfs->xGetSystemCall(vfs, "pwrite");
    real_pwrite64 = vfs->xGetSystemCall(vfs, "pwrite64");
    if (real_write)
        vfs->xSetSystemCall(vfs, "write", (sqlite3_syscall_ptr)full_write);
    if (real_pwrite)
        vfs->xSetSystemCall(vfs, "pwrite", (sqlite3_syscall_ptr)full_pwrite);
    if (real_pwrite64)
        vfs->xSetSystemCall(vfs, "pwrite64", (sqlite3_syscall_ptr)full_pwrite64);
    sqlite3_auto_extension((void (*)(void))hook_commits);
}

/* A delete that commits and then finds the disk full while it gives the freed pages
 * back has still deleted the context: it says so (0, found), as the daemon keeps its
 * view of the store by what the call returns. */
static void delete_on_a_full_disk(void)
{
    char err[ERR_MAX] = "";
    const char *dir = fresh_dir("delete-full");
    disk_can_fill(true);
    store *s = store_open(dir, err);
    CHECK_MSG(s != NULL, "%s", err);
    int64_t app;
    CHECK(store_app_id(s, 5, "full", &app, err) == 0);
    enum { BYTES = 6 << 20 };
    char *prompt = malloc(BYTES + 1);
    CHECK(prompt);
    memset(prompt, 'x', BYTES);
    prompt[BYTES] = '\0';
    int rc = store_context_create(s, "big", app, prompt, NULL, 0, 1, err);
    free(prompt);
    CHECK_MSG(rc == 0, "%s", err);
    CHECK(store_context_create(s, "kept", app, "small", NULL, 0, 1, err) == 0);

    disk_state = DISK_ARMED;
    bool found;
    rc = store_context_delete(s, "big", &found, err);
    bool filled = disk_state == DISK_FULL;
    disk_state = DISK_OK;
    CHECK(filled); /* the delete committed, then the disk was full */
    CHECK_MSG(rc == 0 && found, "rc %d, found %d: %s", rc, found, err);
    CHECK(store_context_get(s, "big", NULL, NULL, &found, err) == 0 && !found);
    store_close(s);

    s = store_open(dir, err);
    CHECK_MSG(s != NULL, "%s", err);
    seen all = {0};
    CHECK(store_context_list(s, -1, see_context, &all, err) == 0);
    CHECK_EQ(all.n, 1);
    CHECK(strcmp(all.id[0], "kept") == 0);
    /* the pages the full disk kept go back with the next delete */
    long before = file_size(dir, "llmsd.db");
    CHECK(store_context_delete(s, "kept", &found, err) == 0 && found);
    store_close(s);
    disk_can_fill(false);
    CHECK_MSG(before > BYTES && file_size(dir, "llmsd.db") < (2 << 20), "%ld bytes, then %ld",
              before, file_size(dir, "llmsd.db"));
}

static void deleting_a_context_deletes_its_turns(void)
{
    char err[ERR_MAX] = "";
    const char *dir = fresh_dir("cascade");
    store *s = store_open(dir, err);
    CHECK_MSG(s != NULL, "%s", err);
    int64_t app;
    CHECK(store_app_id(s, 5, "d", &app, err) == 0);
    CHECK(store_context_create(s, "gone", app, NULL, NULL, 0, 1, err) == 0);
    CHECK(store_context_create(s, "kept", app, NULL, NULL, 0, 1, err) == 0);
    const int32_t tok[] = {3};
    store_turn t[] = {{"user", "a", tok, 1}, {"assistant", "b", tok, 1}};
    CHECK(store_context_append(s, "gone", t, 2, 2, err) == 0);
    CHECK(store_context_append(s, "kept", t, 1, 2, err) == 0);
    bool found;
    CHECK(store_context_delete(s, "gone", &found, err) == 0 && found);

    sqlite3 *db = raw_db(dir);
    CHECK(db != NULL);
    sqlite3_stmt *st;
    CHECK(sqlite3_prepare_v2(db, "SELECT count(*), sum(context_id = 'kept') FROM turns", -1, &st,
                             NULL) == SQLITE_OK);
    int rc = sqlite3_step(st);
    int total = sqlite3_column_int(st, 0), kept = sqlite3_column_int(st, 1);
    sqlite3_finalize(st);
    sqlite3_close(db);
    CHECK_EQ(rc, SQLITE_ROW);
    CHECK_EQ(total, 1);
    CHECK_EQ(kept, 1);

    /* A context created again under the old id starts empty. */
    CHECK(store_context_create(s, "gone", app, NULL, NULL, 0, 3, err) == 0);
    history h = {0};
    CHECK(store_context_turns(s, "gone", see_turn, &h, err) == 0);
    CHECK_EQ(h.n_turns, 0);
    store_close(s);
}

static void many_turns(void)
{
    char err[ERR_MAX] = "";
    store *s = store_open(fresh_dir("many"), err);
    CHECK_MSG(s != NULL, "%s", err);
    int64_t app;
    CHECK(store_app_id(s, 5, "m", &app, err) == 0);
    CHECK(store_context_create(s, "m", app, NULL, NULL, 0, 1, err) == 0);
    enum { N = 1000, PER = 16 };
    int32_t tok[PER];
    /* Several turns per transaction, as a Call appends a prompt and its reply. */
    for (int i = 0; i < N; i += 2) {
        char a[32], b[32];
        snprintf(a, sizeof a, "q%d", i);
        snprintf(b, sizeof b, "a%d", i + 1);
        int32_t tok2[PER];
        for (int j = 0; j < PER; j++) {
            tok[j] = i * PER + j;
            tok2[j] = (i + 1) * PER + j;
        }
        store_turn t[] = {{"user", a, tok, PER}, {"assistant", b, tok2, PER}};
        CHECK_MSG(store_context_append(s, "m", t, 2, 2 + i, err) == 0, "%s", err);
    }
    history *h = calloc(1, sizeof *h);
    CHECK(h != NULL);
    int rc = store_context_turns(s, "m", see_turn, h, err);
    bool ok = rc == 0 && !h->overflow && h->n_turns == N && h->n_tokens == N * PER;
    for (int i = 0; ok && i < N * PER; i++)
        ok = h->tokens[i] == i;
    ok = ok && strncmp(h->texts, "q0|a1|q2|a3|", 12) == 0;
    free(h);
    CHECK_MSG(ok, "rc %d: %s", rc, err);
    seen one = {0};
    bool found;
    CHECK(store_context_get(s, "m", see_context, &one, &found, err) == 0 && found);
    CHECK_EQ(one.n_turns[0], N);
    CHECK_EQ(one.n_tokens[0], N * PER);
    store_close(s);
}

/* Runs sql on the catalog of dir beside the store; with reseal, then recomputes every
 * row's checksum, as a row written by the store itself would have it. */
static int raw_exec(const char *dir, const char *sql, bool reseal)
{
    sqlite3 *db = raw_db(dir);
    if (!db)
        return -1;
    int rc = sqlite3_exec(db, sql, NULL, NULL, NULL);
    if (rc == SQLITE_OK && reseal)
        rc = store_sql_functions(db) != SQLITE_OK
                 ? -1
                 : sqlite3_exec(db, STORE_SEAL_TURNS STORE_SEAL_CONTEXTS, NULL, NULL, NULL);
    sqlite3_close(db);
    return rc == SQLITE_OK ? 0 : -1;
}

/* Flips bit 0 of byte `byte` of turn seq's tokens blob of context id, nothing else. */
static int flip_token_bit(const char *dir, const char *id, int seq, int byte)
{
    sqlite3 *db = raw_db(dir);
    sqlite3_stmt *st = NULL;
    uint8_t blob[256];
    int n = -1, rc = -1;
    if (db && sqlite3_prepare_v2(db, "SELECT tokens FROM turns WHERE context_id = ?1 AND seq = ?2",
                                 -1, &st, NULL) == SQLITE_OK &&
        sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC) == SQLITE_OK &&
        sqlite3_bind_int(st, 2, seq) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW) {
        n = sqlite3_column_bytes(st, 0);
        if (n > byte && n <= (int)sizeof blob)
            memcpy(blob, sqlite3_column_blob(st, 0), (size_t)n);
    }
    sqlite3_finalize(st);
    st = NULL;
    if (n > byte && n <= (int)sizeof blob) {
        blob[byte] ^= 1;
        if (sqlite3_prepare_v2(db, "UPDATE turns SET tokens = ?3"
                                   " WHERE context_id = ?1 AND seq = ?2", -1, &st, NULL) ==
                SQLITE_OK &&
            sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC) == SQLITE_OK &&
            sqlite3_bind_int(st, 2, seq) == SQLITE_OK &&
            sqlite3_bind_blob(st, 3, blob, n, SQLITE_STATIC) == SQLITE_OK &&
            sqlite3_step(st) == SQLITE_DONE && sqlite3_changes(db) == 1)
            rc = 0;
    }
    sqlite3_finalize(st);
    sqlite3_close(db);
    return rc;
}

/* Two contexts of two turns each, "a" and "b", in a fresh store at dir. */
static int two_contexts(const char *dir)
{
    char err[ERR_MAX];
    store *s = store_open(dir, err);
    int64_t app;
    const int32_t tok[] = {100, 200, 300, 400};
    store_turn t[] = {{"user", "question", tok, 3}, {"assistant", "answer", tok + 1, 3}};
    int rc = !s || store_app_id(s, 5, "app", &app, err) ||
             store_context_create(s, "a", app, "sys", "pp", 2, 1, err) ||
             store_context_append(s, "a", t, 2, 2, err) ||
             store_context_create(s, "b", app, NULL, NULL, 0, 3, err) ||
             store_context_append(s, "b", t, 2, 4, err);
    if (rc)
        fprintf(stderr, "two_contexts: %s\n", err);
    store_close(s);
    return rc ? -1 : 0;
}

/* What store_context_turns gives for id: its return, with the history in *h. */
static int read_turns(store *s, const char *id, history *h, char *err)
{
    memset(h, 0, sizeof *h);
    return store_context_turns(s, id, see_turn, h, err);
}

/* A flipped bit in a turn's tokens (or any change of its role or text, a lost turn,
 * counters that disagree with the turns) is STORE_E_DAMAGED naming the context and the
 * turn, the other context reading as written; a context row changed behind the store's
 * back is listed with its damage. Before: the history read back silently changed. */
static void changed_rows_are_damage(void)
{
    char err[ERR_MAX] = "";
    const char *dir = fresh_dir("checksums");
    CHECK_EQ(two_contexts(dir), 0);
    CHECK_EQ(flip_token_bit(dir, "a", 1, 4), 0);
    store *s = store_open(dir, err);
    CHECK_MSG(s, "%s", err);
    history *h = calloc(1, sizeof *h);
    CHECK(h);
    CHECK_EQ(read_turns(s, "a", h, err), STORE_E_DAMAGED);
    CHECK_MSG(strstr(err, "'a'") && strstr(err, "turn 1") && strstr(err, "checksum"), "%s", err);
    CHECK_EQ(read_turns(s, "b", h, err), 0);
    CHECK(h->n_turns == 2 && h->n_tokens == 6 && h->tokens[3] == 200 && h->tokens[5] == 400);
    seen all = {0};
    CHECK_EQ(store_context_list(s, -1, see_context, &all, err), 0);
    CHECK(all.n == 2 && !all.damaged[0] && !all.damaged[1]);
    store_close(s);

    static const struct {
        const char *sql, *why;
    } cases[] = {
        {"UPDATE turns SET text = 'answer!' WHERE context_id = 'b' AND seq = 1", "checksum"},
        {"UPDATE turns SET role = 'user' WHERE context_id = 'b' AND seq = 1", "checksum"},
        {"UPDATE turns SET seq = 7 WHERE context_id = 'b' AND seq = 1", "turn 7"},
        {"DELETE FROM turns WHERE context_id = 'b' AND seq = 1", "counts 2 turns of 6"},
        {"UPDATE contexts SET n_tokens = 5 WHERE id = 'b'", "counts 2 turns of 5"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "checksums%zu", i);
        dir = fresh_dir(name);
        CHECK_EQ(two_contexts(dir), 0);
        CHECK_EQ(raw_exec(dir, cases[i].sql, false), 0);
        s = store_open(dir, err);
        CHECK_MSG(s, "%s", err);
        CHECK_EQ(read_turns(s, "a", h, err), 0);
        int rc = read_turns(s, "b", h, err);
        store_close(s);
        CHECK_MSG(rc == STORE_E_DAMAGED && strstr(err, "'b'") && strstr(err, cases[i].why),
                  "%s: %d %s", cases[i].sql, rc, err);
    }
    free(h);

    /* The context row: its prompt changed is damage; written by the store (resealed),
     * the same change is no damage. */
    dir = fresh_dir("row-checksum");
    CHECK_EQ(two_contexts(dir), 0);
    CHECK_EQ(raw_exec(dir, "UPDATE contexts SET system_prompt = 'other' WHERE id = 'a'", false), 0);
    s = store_open(dir, err);
    CHECK_MSG(s, "%s", err);
    all = (seen){0};
    CHECK_EQ(store_context_list(s, -1, see_context, &all, err), 0);
    CHECK(all.n == 2 && all.damaged[0] && !all.damaged[1]);
    store_close(s);
    CHECK_EQ(raw_exec(dir, "SELECT 1", true), 0);
    s = store_open(dir, err);
    CHECK_MSG(s, "%s", err);
    all = (seen){0};
    CHECK_EQ(store_context_list(s, -1, see_context, &all, err), 0);
    CHECK(all.n == 2 && !all.damaged[0] && !strcmp(all.system_prompt[0], "other"));
    /* the store's own writes keep the checksum right */
    store_window w = {.overflow = 1, .sink = 16, .dropped = 3, .slides = 1};
    CHECK_EQ(store_context_set_window(s, "a", &w, err), 0);
    CHECK_EQ(store_context_set_model(s, "b", "m", err), 0);
    all = (seen){0};
    CHECK_EQ(store_context_list(s, -1, see_context, &all, err), 0);
    CHECK(all.n == 2 && !all.damaged[0] && !all.damaged[1]);
    store_close(s);
}

/* Schema 14 -> 15: the turns and contexts stored before get checksums of what they hold
 * (read back as before), which then find a changed byte. */
static void migration_15_checksums(void)
{
    char err[ERR_MAX] = "";
    const char *dir = fresh_dir("migrate-15");
    CHECK_EQ(two_contexts(dir), 0);
    CHECK_EQ(raw_exec(dir, "DROP TABLE responses;"
                           "ALTER TABLE turns DROP COLUMN crc;"
                           "ALTER TABLE contexts DROP COLUMN crc;"
                           "PRAGMA user_version = 14;", false), 0);
    store *s = store_open(dir, err);
    CHECK_MSG(s, "%s", err);
    history *h = calloc(1, sizeof *h);
    CHECK(h);
    CHECK_EQ(read_turns(s, "a", h, err), 0);
    CHECK(h->n_turns == 2 && h->n_tokens == 6 && h->tokens[0] == 100 && h->tokens[5] == 400 &&
          !strcmp(h->texts, "question|answer|"));
    seen all = {0};
    CHECK_EQ(store_context_list(s, -1, see_context, &all, err), 0);
    CHECK(all.n == 2 && !all.damaged[0] && !all.damaged[1]);
    store_close(s);
    sqlite3 *db = raw_db(dir);
    sqlite3_stmt *st = NULL;
    CHECK(db);
    CHECK(sqlite3_prepare_v2(db, "SELECT (SELECT count(*) FROM turns WHERE crc = 0) +"
                                 " (SELECT count(*) FROM contexts WHERE crc = 0)",
                             -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW);
    CHECK_EQ(sqlite3_column_int(st, 0), 0);
    sqlite3_finalize(st);
    CHECK(sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, NULL) == SQLITE_OK &&
          sqlite3_step(st) == SQLITE_ROW);
    CHECK_EQ(sqlite3_column_int(st, 0), store_schema_version());
    sqlite3_finalize(st);
    sqlite3_close(db);
    CHECK_EQ(flip_token_bit(dir, "b", 0, 0), 0);
    s = store_open(dir, err);
    CHECK_MSG(s, "%s", err);
    CHECK_EQ(read_turns(s, "b", h, err), STORE_E_DAMAGED);
    CHECK_MSG(strstr(err, "turn 0") && strstr(err, "checksum"), "%s", err);
    free(h);
    store_close(s);
}

int main(void)
{
    RUN(create_list_get_delete);
    RUN(listing_is_per_app);
    RUN(turns_and_tokens_round_trip);
    RUN(bad_arguments_are_refused);
    RUN(committed_turns_survive_reopen);
    RUN(failed_append_leaves_nothing);
    RUN(corrupt_token_blob_is_an_error);
    RUN(garbage_file_is_an_error);
    RUN(damaged_page_names_the_file);
    RUN(newer_schema_is_refused);
    RUN(state_dir_is_locked);
    RUN(deletes_give_space_back);
    RUN(checkpoints_run_on_their_own_thread);
    RUN(delete_on_a_full_disk);
    RUN(deleting_a_context_deletes_its_turns);
    RUN(many_turns);
    RUN(changed_rows_are_damage);
    RUN(migration_15_checksums);
    return test_finish();
}
