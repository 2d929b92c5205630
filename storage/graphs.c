/* graphs.c — workflow graph definitions in the sqlite3 catalog (graphs.h). */
#include "storage/graphs.h"

#include <sqlite3.h>

#include "storage/store_internal.h"

int store_graph_put(store *s, int64_t app_id, const char *name, const void *def, size_t len,
                    int64_t now_ms, bool *exists, char err[ERR_MAX])
{
    sqlite3_stmt *st = store_prepare(s, "INSERT OR IGNORE INTO graphs (app_id, name, def, "
                                         "created_ms) VALUES (?, ?, ?, ?)", err);
    if (!st)
        return -1;
    sqlite3_bind_int64(st, 1, app_id);
    sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
    sqlite3_bind_blob(st, 3, def, (int)len, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, now_ms);
    if (store_step_once(s, st, "storing a graph", err))
        return -1;
    *exists = sqlite3_changes(store_sqlite(s)) == 0;
    return 0;
}

/* Calls fn for each row (name, def) of st, then finalizes it; *n rows seen. */
static int graph_rows(store *s, sqlite3_stmt *st,
                      int (*fn)(void *arg, const char *name, const void *def, size_t len),
                      void *arg, int *n, char *err)
{
    int rc;
    *n = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        const char *name = (const char *)sqlite3_column_text(st, 0);
        const void *def = sqlite3_column_blob(st, 1);
        size_t len = (size_t)sqlite3_column_bytes(st, 1);
        (*n)++;
        int r = name ? fn(arg, name, def ? def : "", len) : -1;
        if (r) {
            sqlite3_finalize(st);
            return name ? r : err_set(err, "store: a graph row without a name");
        }
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE)
        return store_db_err(s, err, "reading graphs");
    return 0;
}

int store_graph_get(store *s, int64_t app_id, const char *name,
                    int (*fn)(void *arg, const char *name, const void *def, size_t len),
                    void *arg, bool *found, char err[ERR_MAX])
{
    sqlite3_stmt *st = store_prepare(s, "SELECT name, def FROM graphs WHERE app_id = ? AND "
                                         "name = ?", err);
    if (!st)
        return -1;
    sqlite3_bind_int64(st, 1, app_id);
    sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
    int n;
    int rc = graph_rows(s, st, fn, arg, &n, err);
    *found = n > 0;
    return rc;
}

int store_graph_list(store *s, int64_t app_id,
                     int (*fn)(void *arg, const char *name, const void *def, size_t len),
                     void *arg, char err[ERR_MAX])
{
    sqlite3_stmt *st = store_prepare(s, "SELECT name, def FROM graphs WHERE app_id = ? "
                                         "ORDER BY name", err);
    if (!st)
        return -1;
    sqlite3_bind_int64(st, 1, app_id);
    int n;
    return graph_rows(s, st, fn, arg, &n, err);
}

int store_graph_count(store *s, int64_t app_id, int *n, char err[ERR_MAX])
{
    sqlite3_stmt *st = store_prepare(s, "SELECT count(*) FROM graphs WHERE app_id = ?", err);
    if (!st)
        return -1;
    sqlite3_bind_int64(st, 1, app_id);
    int rc = sqlite3_step(st);
    *n = rc == SQLITE_ROW ? sqlite3_column_int(st, 0) : 0;
    sqlite3_finalize(st);
    if (rc != SQLITE_ROW)
        return store_db_err(s, err, "counting graphs");
    return 0;
}

int store_graph_delete(store *s, int64_t app_id, const char *name, bool *found,
                       char err[ERR_MAX])
{
    sqlite3_stmt *st = store_prepare(s, "DELETE FROM graphs WHERE app_id = ? AND name = ?", err);
    if (!st)
        return -1;
    sqlite3_bind_int64(st, 1, app_id);
    sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
    if (store_step_once(s, st, "deleting a graph", err))
        return -1;
    *found = sqlite3_changes(store_sqlite(s)) > 0;
    return 0;
}
