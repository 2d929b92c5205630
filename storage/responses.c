/* responses.c — the Responses API's stored responses in the sqlite3 catalog (responses.h). */
#include "storage/responses.h"

#include <sqlite3.h>

#include "storage/kb.h"
#include "storage/store_internal.h"

/* A row's bytes as the budget counts them: a damaged row's negative count as none. */
#define ROW_BYTES "max(bytes, 0)"

static int trim_tx(store *s, int64_t budget, int *evicted, char *err)
{
    sqlite3_stmt *st = store_prepare(s, "SELECT coalesce(sum(" ROW_BYTES "), 0) FROM responses",
                                     err);
    if (!st)
        return -1;
    int rc = sqlite3_step(st);
    int64_t total = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    sqlite3_finalize(st);
    if (rc != SQLITE_ROW)
        return store_db_err(s, err, "measuring stored responses");
    if (evicted)
        *evicted = 0;
    if (total <= budget)
        return 0;
    /* the oldest rows that must go: up to the first after which the rest fit */
    if (!(st = store_prepare(s, "SELECT seq, " ROW_BYTES " FROM responses ORDER BY seq", err)))
        return -1;
    int64_t last = -1;
    while (total > budget && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        last = sqlite3_column_int64(st, 0);
        total -= sqlite3_column_int64(st, 1);
    }
    sqlite3_finalize(st);
    if (total > budget && rc != SQLITE_DONE)
        return store_db_err(s, err, "reading stored responses");
    if (!(st = store_prepare(s, "DELETE FROM responses WHERE seq <= ?", err)))
        return -1;
    sqlite3_bind_int64(st, 1, last);
    if (store_step_once(s, st, "evicting stored responses", err))
        return -1;
    if (evicted)
        *evicted = sqlite3_changes(store_sqlite(s));
    return 0;
}

static int put_tx(store *s, const store_response *r, int64_t budget, char *err)
{
    sqlite3_stmt *st = store_prepare(s, "DELETE FROM responses WHERE id = ?", err);
    if (!st)
        return -1;
    sqlite3_bind_text(st, 1, r->id, -1, SQLITE_STATIC);
    if (store_step_once(s, st, "replacing a stored response", err))
        return -1;
    st = store_prepare(s, "INSERT INTO responses (id, uid, created, previous, response, items,"
                          " bytes, crc) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, "
                          STORE_RESPONSE_CRC("?1", "?2", "?3", "?4", "?5", "?6", "?7") ")",
                       err);
    if (!st)
        return -1;
    sqlite3_bind_text(st, 1, r->id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, r->uid);
    sqlite3_bind_int64(st, 3, r->created);
    if (r->previous)
        sqlite3_bind_text(st, 4, r->previous, -1, SQLITE_STATIC);
    sqlite3_bind_blob64(st, 5, r->response_len ? r->response : "", r->response_len,
                        SQLITE_STATIC);
    sqlite3_bind_blob64(st, 6, r->items_len ? r->items : "", r->items_len, SQLITE_STATIC);
    sqlite3_bind_int64(st, 7, r->bytes);
    if (store_step_once(s, st, "storing a response", err))
        return -1;
    return trim_tx(s, budget, NULL, err);
}

int store_response_put(store *s, const store_response *r, int64_t budget, char err[ERR_MAX])
{
    if (!r->id || r->bytes < 0)
        return err_set(err, "store: a response needs an id and bytes >= 0");
    if (store_cache_begin(s, err))
        return -1;
    if (put_tx(s, r, budget, err)) {
        store_kb_rollback(s);
        store_cache_end(s);
        return -1;
    }
    return store_cache_commit(s, err);
}

int store_response_delete(store *s, uint32_t uid, const char *id, bool *found,
                          char err[ERR_MAX])
{
    *found = false;
    sqlite3_stmt *st = store_prepare(s, "DELETE FROM responses WHERE id = ? AND uid = ?", err);
    if (!st)
        return -1;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, uid);
    if (store_step_once(s, st, "deleting a stored response", err))
        return -1;
    *found = sqlite3_changes(store_sqlite(s)) > 0;
    return 0;
}

int store_response_delete_seq(store *s, int64_t seq, char err[ERR_MAX])
{
    sqlite3_stmt *st = store_prepare(s, "DELETE FROM responses WHERE seq = ?", err);
    if (!st)
        return -1;
    sqlite3_bind_int64(st, 1, seq);
    return store_step_once(s, st, "deleting a stored response", err);
}

int store_response_trim(store *s, int64_t budget, int *evicted, char err[ERR_MAX])
{
    if (evicted)
        *evicted = 0;
    if (store_cache_begin(s, err))
        return -1;
    if (trim_tx(s, budget, evicted, err)) {
        store_kb_rollback(s);
        store_cache_end(s);
        return -1;
    }
    return store_cache_commit(s, err);
}

/* A column's text, or NULL when it is not text (a damaged row's). */
static const char *text_column(sqlite3_stmt *st, int i)
{
    return sqlite3_column_type(st, i) == SQLITE_TEXT ? (const char *)sqlite3_column_text(st, i)
                                                     : NULL;
}

int store_response_list(store *s, int (*fn)(void *arg, const store_response *r), void *arg,
                        char err[ERR_MAX])
{
    sqlite3_stmt *st = store_prepare(
        s, "SELECT seq, id, uid, created, previous, response, items, bytes, crc = "
           STORE_RESPONSE_CRC("id", "uid", "created", "previous", "response", "items", "bytes")
           " FROM responses ORDER BY seq", err);
    if (!st)
        return -1;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        store_response r = {
            .seq = sqlite3_column_int64(st, 0),
            .id = text_column(st, 1),
            .uid = (uint32_t)sqlite3_column_int64(st, 2),
            .created = sqlite3_column_int64(st, 3),
            .previous = text_column(st, 4),
            .response = sqlite3_column_blob(st, 5),
            .response_len = (size_t)sqlite3_column_bytes(st, 5),
            .items = sqlite3_column_blob(st, 6),
            .items_len = (size_t)sqlite3_column_bytes(st, 6),
            .bytes = sqlite3_column_int64(st, 7),
        };
        if (!sqlite3_column_int(st, 8))
            r.damage = "the row does not match its checksum";
        else if (!r.id || (!r.response && r.response_len) || (!r.items && r.items_len))
            r.damage = "a column cannot be read";
        if (!r.response_len)
            r.response = "";
        if (!r.items_len)
            r.items = "";
        int stop = fn(arg, &r);
        if (stop) {
            sqlite3_finalize(st);
            return stop;
        }
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE)
        return store_db_err(s, err, "reading stored responses");
    return 0;
}

int store_response_count(store *s, int64_t *n, int64_t *bytes, char err[ERR_MAX])
{
    sqlite3_stmt *st = store_prepare(s, "SELECT count(*), coalesce(sum(" ROW_BYTES "), 0) FROM "
                                        "responses", err);
    if (!st)
        return -1;
    int rc = sqlite3_step(st);
    *n = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    *bytes = rc == SQLITE_ROW ? sqlite3_column_int64(st, 1) : 0;
    sqlite3_finalize(st);
    if (rc != SQLITE_ROW)
        return store_db_err(s, err, "counting stored responses");
    return 0;
}
