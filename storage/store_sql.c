/*
 * store_sql.c — the one-shot SQL helpers of store_internal.h, for the storage files
 * whose statements are prepared per call (kb.c, ivf.c).
 */
#include "storage/store_internal.h"

#include <stdio.h>
#include <string.h>

#include "storage/crc32c.h"

/* llmsd_crc(...): each argument as its type (one byte), 8 bytes little-endian (an
 * integer, a real's bits, or the length of a text or blob) and a text's or blob's bytes,
 * so that no two different argument lists give the same input to the CRC. */
static void sql_crc(sqlite3_context *ctx, int n, sqlite3_value **v)
{
    uint32_t crc = 0;
    for (int i = 0; i < n; i++) {
        int type = sqlite3_value_type(v[i]);
        const void *bytes = NULL;
        uint64_t word = 0;
        if (type == SQLITE_INTEGER) {
            word = (uint64_t)sqlite3_value_int64(v[i]);
        } else if (type == SQLITE_FLOAT) {
            double d = sqlite3_value_double(v[i]);
            memcpy(&word, &d, sizeof word);
        } else if (type == SQLITE_TEXT || type == SQLITE_BLOB) {
            bytes = type == SQLITE_TEXT ? (const void *)sqlite3_value_text(v[i])
                                        : sqlite3_value_blob(v[i]);
            word = (uint64_t)sqlite3_value_bytes(v[i]);
            if (!bytes && word) {
                sqlite3_result_error_nomem(ctx);
                return;
            }
        }
        uint8_t head[9] = {(uint8_t)type};
        for (int b = 0; b < 8; b++)
            head[1 + b] = (uint8_t)(word >> (8 * b));
        crc = crc32c(crc, head, sizeof head);
        if (bytes)
            crc = crc32c(crc, bytes, (size_t)word);
    }
    sqlite3_result_int64(ctx, crc);
}

int store_sql_functions(sqlite3 *db)
{
    return sqlite3_create_function_v2(db, "llmsd_crc", -1,
                                      SQLITE_UTF8 | SQLITE_DETERMINISTIC | SQLITE_DIRECTONLY,
                                      NULL, sql_crc, NULL, NULL, NULL);
}

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
