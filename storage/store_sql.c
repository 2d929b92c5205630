/*
 * store_sql.c — the one-shot SQL helpers of store_internal.h, for the storage files
 * whose statements are prepared per call (kb.c, ivf.c).
 */
#include "storage/store_internal.h"

#include <stdio.h>

const char *store_db_message(sqlite3 *db, char *buf, size_t cap)
{
    int code = sqlite3_errcode(db) & 0xff;
    const char *file = sqlite3_db_filename(db, "main");
    if ((code != SQLITE_CORRUPT && code != SQLITE_NOTADB) || !file || !file[0])
        return sqlite3_errmsg(db);
    snprintf(buf, cap, "%s (%s)", sqlite3_errmsg(db), file);
    return buf;
}

int store_db_err(store *s, char *err, const char *what)
{
    char msg[ERR_MAX];
    return err_set(err, "store: %s: %s", what,
                   store_db_message(store_sqlite(s), msg, sizeof msg));
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
