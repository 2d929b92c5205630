/*
 * store_sql.c — the one-shot SQL helpers of store_internal.h, for the storage files
 * whose statements are prepared per call (kb.c, ivf.c).
 */
#include "storage/store_internal.h"

int store_db_err(store *s, char *err, const char *what)
{
    return err_set(err, "store: %s: %s", what, sqlite3_errmsg(store_sqlite(s)));
}

sqlite3_stmt *store_prepare(store *s, const char *sql, char *err)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(store_sqlite(s), sql, -1, &st, NULL) != SQLITE_OK) {
        store_db_err(s, err, sql);
        return NULL;
    }
    return st;
}

int store_step_once(store *s, sqlite3_stmt *st, const char *what, char *err)
{
    int rc = sqlite3_step(st);
    if (rc != SQLITE_DONE && rc != SQLITE_ROW) {
        store_db_err(s, err, what);
        sqlite3_finalize(st);
        return -1;
    }
    sqlite3_finalize(st);
    return 0;
}

int store_exec_sql(store *s, const char *sql, char *err)
{
    char *msg = NULL;
    if (sqlite3_exec(store_sqlite(s), sql, NULL, NULL, &msg) != SQLITE_OK) {
        err_set(err, "store: %s: %s", sql, msg ? msg : sqlite3_errmsg(store_sqlite(s)));
        sqlite3_free(msg);
        return -1;
    }
    return 0;
}
