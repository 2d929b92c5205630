/*
 * test_damaged.c — a real llmsd over a state directory where one context's stored data
 * is damaged: the daemon starts, logs the context (app, id) and why, answers its calls
 * FAILED_PRECONDITION saying so, lists it, deletes it, and leaves its rows alone; the
 * other contexts answer exactly as an uninterrupted run does. Damage is a hostile window
 * in the context's row, or a flipped byte in a turn's token blob (found by the turn's
 * checksum, instead of the history silently changing).
 */
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <string.h>

#include "storage/store_internal.h"
#include "tests/integration/llmsd_proc.h"

static char llmsd_path[1024];

/* Lossless chunks: a restored context must give the same greedy tokens. */
#define CONF "kv_compress = none\n"

static const char *const prompts[3] = {
    "Once upon a time, there was a little girl named Lily. She liked to play outside.",
    "One day she found a big red ball in the park.",
    "She ran home to show her mom",
};

static int run_turns(llms_conn *c, const char *id, int first, int last, char text[][2048])
{
    llms_params p = proc_greedy(24, NULL);
    p.raw = 1;
    for (int i = first; i < last; i++) {
        llms_result r;
        if (llms_call(c, id, prompts[i], &p, NULL, NULL, &r) != LLMS_OK) {
            fprintf(stderr, "turn %d: %s\n", i, llms_last_error(c));
            return -1;
        }
        snprintf(text[i], 2048, "%s", r.text);
        llms_result_free(&r);
    }
    return 0;
}

static sqlite3 *open_catalog(const llmsd_proc *d)
{
    char path[700];
    proc_fmt(path, sizeof path, "%s/state/llmsd.db", d->dir);
    sqlite3 *db;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL) != SQLITE_OK) {
        sqlite3_close(db);
        return NULL;
    }
    sqlite3_busy_timeout(db, 2000);
    return db;
}

/* Runs sql on d's catalog, then recomputes every row's checksum (the rows as a bug of
 * the daemon would have written them, not damaged on disk); the rows sql changed, -1 on
 * failure. */
static int tamper_sealed(const llmsd_proc *d, const char *sql)
{
    sqlite3 *db = open_catalog(d);
    if (!db)
        return -1;
    int rc = sqlite3_exec(db, sql, NULL, NULL, NULL), n = sqlite3_changes(db);
    if (rc == SQLITE_OK)
        rc = store_sql_functions(db);
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(db, STORE_SEAL_CONTEXTS STORE_SEAL_TURNS, NULL, NULL, NULL);
    if (rc != SQLITE_OK)
        fprintf(stderr, "tamper: %s\n", sqlite3_errmsg(db));
    sqlite3_close(db);
    return rc == SQLITE_OK ? n : -1;
}

/* The first column of sql's first row on d's catalog as an integer, -1 on failure. */
static long long query_int(const llmsd_proc *d, const char *sql)
{
    sqlite3 *db = open_catalog(d);
    sqlite3_stmt *st = NULL;
    long long v = -1;
    if (db && sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW)
        v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return v;
}

/* Flips bit 0 of the first token id of turn seq of context id in d's catalog, as a
 * damaged page would, leaving every other column as it was. 0, or -1. */
static int flip_first_token_bit(const llmsd_proc *d, const char *id, int seq)
{
    sqlite3 *db = open_catalog(d);
    sqlite3_stmt *st = NULL;
    unsigned char blob[65536];
    int n = -1, rc = -1;
    if (db && sqlite3_prepare_v2(db, "SELECT tokens FROM turns WHERE context_id = ? AND seq = ?",
                                 -1, &st, NULL) == SQLITE_OK &&
        sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC) == SQLITE_OK &&
        sqlite3_bind_int(st, 2, seq) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW) {
        n = sqlite3_column_bytes(st, 0);
        if (n >= 4 && n <= (int)sizeof blob)
            memcpy(blob, sqlite3_column_blob(st, 0), (size_t)n);
    }
    sqlite3_finalize(st);
    st = NULL;
    if (n >= 4 && n <= (int)sizeof blob) {
        blob[0] ^= 1;
        if (sqlite3_prepare_v2(db, "UPDATE turns SET tokens = ? WHERE context_id = ? AND seq = ?",
                               -1, &st, NULL) == SQLITE_OK &&
            sqlite3_bind_blob(st, 1, blob, n, SQLITE_STATIC) == SQLITE_OK &&
            sqlite3_bind_text(st, 2, id, -1, SQLITE_STATIC) == SQLITE_OK &&
            sqlite3_bind_int(st, 3, seq) == SQLITE_OK && sqlite3_step(st) == SQLITE_DONE &&
            sqlite3_changes(db) == 1)
            rc = 0;
    }
    sqlite3_finalize(st);
    sqlite3_close(db);
    return rc;
}

/* Whether d's log has a line holding every one of the strings. */
static bool log_has_line(const llmsd_proc *d, const char *a, const char *b, const char *c)
{
    FILE *f = fopen(d->log, "r");
    char line[4096];
    bool found = false;
    while (f && !found && fgets(line, sizeof line, f))
        found = strstr(line, a) && strstr(line, b) && strstr(line, c);
    if (f)
        fclose(f);
    return found;
}

/* The app's listing: how many contexts, and the info of id (damage copied out). */
static int list_find(llms_conn *c, const char *id, size_t *n, char *damage, size_t cap)
{
    llms_context_info *infos;
    if (llms_context_list(c, &infos, n) != LLMS_OK)
        return -1;
    int found = 0;
    for (size_t i = 0; i < *n; i++)
        if (strcmp(infos[i].id, id) == 0) {
            found = 1;
            snprintf(damage, cap, "%s", infos[i].damage ? infos[i].damage : "");
        }
    llms_context_list_free(infos, *n);
    return found;
}

/* The row of one context holds a window no slide writes (a negative drop; its checksum
 * matches, as a bug of the daemon would have written it): llmsd
 * starts all the same, the other context of the app and a context of another app answer
 * byte for byte as in a run that never stopped, the damaged one is listed as damaged and
 * refused with why, and deleting it works. Before: llmsd refused to start ("window
 * (sink 16, dropped -5) does not fit"), every app losing service over one context. */
static void hostile_row_damages_one_context(void)
{
    if (!llmsd_path[0])
        SKIP("llmsd is not built in this tree");
    const char *stories = test_data_path("models/stories260K.gguf");
    if (!stories)
        SKIP("../shared/testdata/models/stories260K.gguf is absent");
    char model[1024], ref[3][2048] = {{0}}, good[3][2048] = {{0}}, other[3][2048] = {{0}};
    char bad_text[3][2048], good_id[LLMS_ID_MAX], bad_id[LLMS_ID_MAX], other_id[LLMS_ID_MAX];
    snprintf(model, sizeof model, "%s", stories);

    llmsd_proc d;
    CHECK_MSG(proc_start(&d, llmsd_path, "damaged-ref", model, CONF) == 0, "llmsd did not start");
    llms_conn *c = proc_connect(&d, "ref");
    bool ok = c && llms_context_create(c, NULL, NULL, good_id) == LLMS_OK &&
              run_turns(c, good_id, 0, 3, ref) == 0;
    llms_close(c);
    proc_stop(&d, SIGTERM);
    CHECK_MSG(ok, "the reference run failed");

    CHECK_MSG(proc_start(&d, llmsd_path, "damaged-row", model, CONF) == 0, "llmsd did not start");
    c = proc_connect(&d, "app");
    llms_conn *o = proc_connect(&d, "other");
    ok = c && o && llms_context_create(c, NULL, NULL, good_id) == LLMS_OK &&
         run_turns(c, good_id, 0, 2, good) == 0 &&
         llms_context_create(c, NULL, NULL, bad_id) == LLMS_OK &&
         run_turns(c, bad_id, 0, 2, bad_text) == 0 &&
         llms_context_create(o, NULL, NULL, other_id) == LLMS_OK &&
         run_turns(o, other_id, 0, 2, other) == 0;
    llms_close(c);
    llms_close(o);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
    CHECK_MSG(ok, "the first run failed");
    char sql[256];
    proc_fmt(sql, sizeof sql,
             "UPDATE contexts SET window_sink = 16, window_dropped = -5 WHERE id = '%s'", bad_id);
    CHECK_EQ(tamper_sealed(&d, sql), 1);

    CHECK_MSG(proc_start(&d, llmsd_path, "damaged-row", model, CONF) == 0,
              "llmsd did not start over one damaged context");
    CHECK_MSG(log_has_line(&d, bad_id, "/app id=", "window"), "the log does not name %s", bad_id);
    c = proc_connect(&d, "app");
    o = proc_connect(&d, "other");
    CHECK(c && o);
    CHECK_EQ(run_turns(c, good_id, 2, 3, good), 0);
    CHECK_MSG(strcmp(good[2], ref[2]) == 0, "'%s' vs '%s'", good[2], ref[2]);
    CHECK_EQ(run_turns(o, other_id, 2, 3, other), 0);
    CHECK_MSG(strcmp(other[2], ref[2]) == 0, "'%s' vs '%s'", other[2], ref[2]);

    llms_params p = proc_greedy(4, NULL);
    CHECK_EQ(llms_call(c, bad_id, "more", &p, NULL, NULL, NULL), LLMS_ERR_FAILED_PRECONDITION);
    const char *why = llms_last_error(c);
    CHECK_MSG(strstr(why, bad_id) && strstr(why, "damaged") && strstr(why, "window") &&
                  strstr(why, "deleting the context clears it"),
              "%s", why);
    size_t n;
    char damage[512] = "";
    CHECK_EQ(list_find(c, bad_id, &n, damage, sizeof damage), 1);
    CHECK_EQ(n, 2);
    CHECK_MSG(strstr(damage, "window"), "listed damage: '%s'", damage);
    CHECK_EQ(list_find(c, good_id, &n, damage, sizeof damage), 1);
    CHECK_MSG(damage[0] == '\0', "the good context listed as damaged: '%s'", damage);
    llms_context_info info;
    CHECK_EQ(llms_context_get(c, bad_id, 1, &info), LLMS_OK);
    CHECK(info.damage && strstr(info.damage, "window"));
    llms_context_info_free(&info);
    llms_daemon_status st;
    CHECK_EQ(proc_status(c, &st), 0);
    CHECK_EQ(st.n_contexts, 3);
    CHECK_EQ(st.damaged_contexts, 1);
    llms_daemon_status_free(&st);
    /* its rows stay until it is deleted */
    proc_fmt(sql, sizeof sql, "SELECT count(*) FROM turns WHERE context_id = '%s'", bad_id);
    CHECK_EQ(query_int(&d, sql), 4); /* two calls: prompt and reply each */
    CHECK_EQ(llms_context_delete(c, bad_id), LLMS_OK);
    CHECK_EQ(query_int(&d, sql), 0);
    CHECK_EQ(list_find(c, bad_id, &n, damage, sizeof damage), 0);
    CHECK_EQ(n, 1);
    CHECK_EQ(proc_status(c, &st), 0);
    CHECK_EQ(st.damaged_contexts, 0);
    llms_daemon_status_free(&st);
    llms_close(c);
    llms_close(o);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

/* Runs llmsd name on model until app has two contexts (id: two turns, keep_id: one),
 * stops it and flips bit 0 of the first id of id's second turn (stories260K: 512 ids,
 * so it stays in the vocabulary). 0, or -1 when a step failed. */
static int two_contexts_one_flipped(llmsd_proc *d, const char *name, const char *model,
                                    const char *app, char id[LLMS_ID_MAX],
                                    char keep_id[LLMS_ID_MAX])
{
    char text[3][2048];
    if (proc_start(d, llmsd_path, name, model, CONF))
        return -1;
    llms_conn *c = proc_connect(d, app);
    int rc = c && llms_context_create(c, NULL, NULL, id) == LLMS_OK &&
                     run_turns(c, id, 0, 2, text) == 0 &&
                     llms_context_create(c, NULL, NULL, keep_id) == LLMS_OK &&
                     run_turns(c, keep_id, 0, 1, text) == 0
                 ? 0
                 : -1;
    llms_close(c);
    if (proc_stop(d, SIGTERM) != 0)
        return -1;
    return rc == 0 ? flip_first_token_bit(d, id, 1) : -1;
}

/* One byte of a stored turn's token ids flipped (an id still in the vocabulary, so
 * nothing else notices): the turn's checksum no longer matches and the context is
 * damaged, its calls refused, rather than answering from another history. Before: the
 * call ran on the altered history. The rows stay as they were until it is deleted. */
static void flipped_token_byte_is_damage(void)
{
    if (!llmsd_path[0])
        SKIP("llmsd is not built in this tree");
    const char *stories = test_data_path("models/stories260K.gguf");
    if (!stories)
        SKIP("../shared/testdata/models/stories260K.gguf is absent");
    char model[1024], id[LLMS_ID_MAX], keep_id[LLMS_ID_MAX];
    snprintf(model, sizeof model, "%s", stories);
    llmsd_proc d;
    CHECK_MSG(two_contexts_one_flipped(&d, "damaged-turn", model, "app", id, keep_id) == 0,
              "setting up the damaged context failed");

    CHECK_MSG(proc_start(&d, llmsd_path, "damaged-turn", model, CONF) == 0,
              "llmsd did not start over one damaged context");
    llms_conn *c = proc_connect(&d, "app");
    CHECK(c);
    llms_params p = proc_greedy(4, NULL);
    CHECK_EQ(llms_call(c, id, "more", &p, NULL, NULL, NULL), LLMS_ERR_FAILED_PRECONDITION);
    const char *why = llms_last_error(c);
    CHECK_MSG(strstr(why, id) && strstr(why, "checksum") &&
                  strstr(why, "deleting the context clears it"),
              "%s", why);
    CHECK_MSG(log_has_line(&d, id, "/app id=", "checksum"), "the log does not name %s", id);
    CHECK_EQ(llms_call(c, keep_id, "more", &p, NULL, NULL, NULL), LLMS_OK);
    llms_close(c);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
    /* the damaged rows are as the flip left them: nothing rewrote or deleted them */
    CHECK_EQ(flip_first_token_bit(&d, id, 1), 0);
    CHECK_MSG(proc_start(&d, llmsd_path, "damaged-turn", model, CONF) == 0, "llmsd did not start");
    c = proc_connect(&d, "app");
    CHECK(c);
    CHECK_EQ(llms_call(c, id, "more", &p, NULL, NULL, NULL), LLMS_OK);
    llms_close(c);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

/* An administrator removes a damaged context of an app (llmsctl rm): before, only the
 * owning app could, so one whose app was gone stayed damaged for good. */
static void admin_removes_a_damaged_context(void)
{
    if (!llmsd_path[0])
        SKIP("llmsd is not built in this tree");
    const char *stories = test_data_path("models/stories260K.gguf");
    if (!stories)
        SKIP("../shared/testdata/models/stories260K.gguf is absent");
    char model[1024], id[LLMS_ID_MAX], keep_id[LLMS_ID_MAX];
    snprintf(model, sizeof model, "%s", stories);
    llmsd_proc d;
    CHECK_MSG(two_contexts_one_flipped(&d, "damaged-rm", model, "gone-app", id, keep_id) == 0,
              "setting up the damaged context failed");

    CHECK_MSG(proc_start(&d, llmsd_path, "damaged-rm", model, CONF) == 0, "llmsd did not start");
    llms_conn *admin;
    CHECK(llms_connect(d.sock, &admin, NULL) == LLMS_OK);
    CHECK_EQ(llms_admin_context_delete(admin, id), LLMS_OK);
    CHECK_EQ(llms_admin_context_delete(admin, id), LLMS_ERR_NOT_FOUND);
    llms_daemon_status st;
    CHECK_EQ(llms_status_get(admin, &st), LLMS_OK);
    CHECK_EQ(st.damaged_contexts, 0);
    llms_daemon_status_free(&st);
    llms_close(admin);
    llms_conn *c = proc_connect(&d, "gone-app");
    CHECK(c);
    llms_params p = proc_greedy(4, NULL);
    CHECK_EQ(llms_call(c, id, "more", &p, NULL, NULL, NULL), LLMS_ERR_NOT_FOUND);
    CHECK_EQ(llms_call(c, keep_id, "more", &p, NULL, NULL, NULL), LLMS_OK);
    llms_close(c);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

/* A damaged context keeps its place under max_contexts_per_app (its rows and files stay
 * until it is deleted), and the refusal says how many of the app's contexts are damaged
 * and how to delete them; deleting the damaged one makes room. Before: the refusal said
 * only "app has 2 contexts, the limit", leaving the app to guess that one it cannot use
 * held a place. */
static void damaged_contexts_count_and_say_so(void)
{
    if (!llmsd_path[0])
        SKIP("llmsd is not built in this tree");
    const char *stories = test_data_path("models/stories260K.gguf");
    if (!stories)
        SKIP("../shared/testdata/models/stories260K.gguf is absent");
    char model[1024], id[LLMS_ID_MAX], keep_id[LLMS_ID_MAX], new_id[LLMS_ID_MAX];
    snprintf(model, sizeof model, "%s", stories);
    llmsd_proc d;
    CHECK_MSG(two_contexts_one_flipped(&d, "damaged-limit", model, "app", id, keep_id) == 0,
              "setting up the damaged context failed");

    CHECK_MSG(proc_start(&d, llmsd_path, "damaged-limit", model,
                         CONF "max_contexts_per_app = 2\n") == 0,
              "llmsd did not start");
    llms_conn *c = proc_connect(&d, "app");
    CHECK(c);
    CHECK_EQ(llms_context_create(c, NULL, NULL, new_id), LLMS_ERR_RESOURCE_EXHAUSTED);
    const char *why = llms_last_error(c);
    CHECK_MSG(strstr(why, "max_contexts_per_app") && strstr(why, "1 of them damaged") &&
                  strstr(why, "llms ctx rm") && strstr(why, "llmsctl rm"),
              "%s", why);
    CHECK_EQ(llms_context_delete(c, id), LLMS_OK);
    CHECK_EQ(llms_context_create(c, NULL, NULL, new_id), LLMS_OK);
    CHECK_EQ(llms_context_create(c, NULL, NULL, new_id), LLMS_ERR_RESOURCE_EXHAUSTED);
    CHECK_MSG(!strstr(llms_last_error(c), "damaged"), "%s", llms_last_error(c));
    llms_close(c);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

int main(int argc, char **argv)
{
    (void)argc;
    signal(SIGPIPE, SIG_IGN);
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    RUN(hostile_row_damages_one_context);
    RUN(flipped_token_byte_is_damage);
    RUN(admin_removes_a_damaged_context);
    RUN(damaged_contexts_count_and_say_so);
    return test_finish();
}
