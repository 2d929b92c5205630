/*
 * kb.c — knowledge bases, QA bank and QKV tree in the sqlite3 catalog.
 *
 * These calls are rare next to token generation (a knowledge base change, a query), so
 * statements are prepared per call rather than kept.
 */
#include "storage/kb.h"

#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "storage/crc32c.h"
#include "storage/store_internal.h"

#define KB_ZSTD_LEVEL 3
#define KB_MATCH_MAX 4096 /* bytes of an FTS5 query built from a question */


int store_kb_begin(store *s, char err[ERR_MAX])
{
    return store_exec_sql(s, "BEGIN IMMEDIATE", err);
}

int store_kb_commit(store *s, char err[ERR_MAX])
{
    if (store_exec_sql(s, "COMMIT", err) == 0)
        return 0;
    store_kb_rollback(s);
    return -1;
}

void store_kb_rollback(store *s)
{
    if (!sqlite3_get_autocommit(store_sqlite(s)))
        sqlite3_exec(store_sqlite(s), "ROLLBACK", NULL, NULL, NULL);
}

/* Runs body (which returns 0 or -1) in a transaction unless one is open already. */
#define IN_TX(s, err, body)                                                               \
    do {                                                                                  \
        bool own_ = sqlite3_get_autocommit(store_sqlite(s));                              \
        if (own_ && store_kb_begin(s, err))                                               \
            return -1;                                                                    \
        int rc_ = (body);                                                                 \
        if (rc_ == 0 && own_)                                                             \
            return store_kb_commit(s, err);                                               \
        if (rc_ != 0 && own_)                                                             \
            store_kb_rollback(s);                                                         \
        return rc_;                                                                       \
    } while (0)

static int kb_create_tx(store *s, int64_t app_id, const char *name, int ptok, int otok,
                        const char *embed_model, const char *embedder, int dim, bool share_uid, int64_t now_ms,
                        int64_t *kb_id, bool *exists, char *err)
{
    sqlite3_stmt *st = store_prepare(s, "SELECT id FROM kbs WHERE app_id = ? AND name = ?", err);
    if (!st)
        return -1;
    sqlite3_bind_int64(st, 1, app_id);
    sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
    *exists = sqlite3_step(st) == SQLITE_ROW;
    sqlite3_finalize(st);
    if (*exists)
        return 0;
    st = store_prepare(s, "INSERT INTO kbs (app_id, name, passage_tokens, overlap_tokens, embedder, dim,"
                 " created_ms, share_uid, embed_model) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", err);
    if (!st)
        return -1;
    sqlite3_bind_int64(st, 1, app_id);
    sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 3, ptok);
    sqlite3_bind_int(st, 4, otok);
    sqlite3_bind_text(st, 5, embedder, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 6, dim);
    sqlite3_bind_int64(st, 7, now_ms);
    sqlite3_bind_int(st, 8, share_uid);
    sqlite3_bind_text(st, 9, embed_model, -1, SQLITE_STATIC);
    if (store_step_once(s, st, "creating a knowledge base", err))
        return -1;
    *kb_id = sqlite3_last_insert_rowid(store_sqlite(s));
    char sql[128];
    /* contentless: the text is the passages' (kb.h), the table keeps only its index */
    snprintf(sql, sizeof sql, "CREATE VIRTUAL TABLE kbfts_%lld USING fts5(text, content='')",
             (long long)*kb_id);
    return store_exec_sql(s, sql, err);
}

int store_kb_create(store *s, int64_t app_id, const char *name, int passage_tokens,
                    int overlap_tokens, const char *embed_model, const char *embedder, int dim,
                    bool share_uid,
                    int64_t now_ms, int64_t *kb_id, bool *exists, char err[ERR_MAX])
{
    *kb_id = -1;
    *exists = false;
    IN_TX(s, err, kb_create_tx(s, app_id, name, passage_tokens, overlap_tokens, embed_model,
                               embedder, dim,
                               share_uid, now_ms, kb_id, exists, err));
}

#define KB_COLUMNS                                                                         \
    "SELECT k.id, k.name, k.passage_tokens, k.overlap_tokens, k.embedder, k.dim,"          \
    " (SELECT count(*) FROM kb_docs d WHERE d.kb_id = k.id AND d.state = 0),"              \
    " (SELECT coalesce(sum(n_passages), 0) FROM kb_docs d WHERE d.kb_id = k.id"            \
    "  AND d.state = 0),"                                                                  \
    " (SELECT coalesce(sum(bytes), 0) FROM kb_docs d WHERE d.kb_id = k.id AND d.state = 0)," \
    " (SELECT count(*) FROM qa_bank q WHERE q.kb_id = k.id), k.share_uid, k.embed_model"     \
    " FROM kbs k "

static int kb_rows(store *s, sqlite3_stmt *st, int (*fn)(void *, const store_kb *), void *arg,
                   int *n_rows, char *err)
{
    int rc, out = 0;
    *n_rows = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        store_kb kb = {
            .id = sqlite3_column_int64(st, 0),
            .name = (const char *)sqlite3_column_text(st, 1),
            .passage_tokens = sqlite3_column_int(st, 2),
            .overlap_tokens = sqlite3_column_int(st, 3),
            .embedder = (const char *)sqlite3_column_text(st, 4),
            .dim = sqlite3_column_int(st, 5),
            .n_docs = sqlite3_column_int64(st, 6),
            .n_passages = sqlite3_column_int64(st, 7),
            .bytes = sqlite3_column_int64(st, 8),
            .qa_entries = sqlite3_column_int64(st, 9),
            .share_uid = sqlite3_column_int(st, 10) != 0,
            .embed_model = (const char *)sqlite3_column_text(st, 11),
        };
        (*n_rows)++;
        if (fn && (out = fn(arg, &kb)) != 0)
            break;
    }
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        out = store_db_err(s, err, "listing knowledge bases");
    sqlite3_finalize(st);
    return out;
}

int store_kb_get(store *s, int64_t app_id, const char *name,
                 int (*fn)(void *arg, const store_kb *kb), void *arg, bool *found,
                 char err[ERR_MAX])
{
    *found = false;
    sqlite3_stmt *st = store_prepare(s, KB_COLUMNS "WHERE k.app_id = ? AND k.name = ?", err);
    if (!st)
        return -1;
    sqlite3_bind_int64(st, 1, app_id);
    sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
    int n;
    int rc = kb_rows(s, st, fn, arg, &n, err);
    *found = rc == 0 && n > 0;
    return rc;
}

int store_kb_list(store *s, int64_t app_id, int (*fn)(void *arg, const store_kb *kb),
                  void *arg, char err[ERR_MAX])
{
    sqlite3_stmt *st = store_prepare(s, KB_COLUMNS "WHERE (?1 < 0 OR k.app_id = ?1)"
                                   " AND k.name NOT LIKE '~%' ORDER BY k.name", err);
    if (!st)
        return -1;
    sqlite3_bind_int64(st, 1, app_id);
    int n;
    return kb_rows(s, st, fn, arg, &n, err);
}

static int kb_drop_tx(store *s, int64_t kb_id, char *err)
{
    char sql[256];
    snprintf(sql, sizeof sql,
             "DROP TABLE IF EXISTS kbfts_%lld; DELETE FROM kb_passages WHERE doc_id IN"
             " (SELECT id FROM kb_docs WHERE kb_id = %lld);"
             "DELETE FROM qa_bank WHERE kb_id = %lld; DELETE FROM kb_docs WHERE kb_id = %lld;"
             "DELETE FROM kbs WHERE id = %lld",
             (long long)kb_id, (long long)kb_id, (long long)kb_id, (long long)kb_id,
             (long long)kb_id);
    return store_exec_sql(s, sql, err);
}

int store_kb_drop(store *s, int64_t kb_id, char err[ERR_MAX])
{
    IN_TX(s, err, kb_drop_tx(s, kb_id, err));
}

int store_kb_hide(store *s, int64_t kb_id, char err[ERR_MAX])
{
    char sql[160];
    snprintf(sql, sizeof sql,
             "UPDATE kbs SET name = '~' || id WHERE id = %lld; DROP TABLE IF EXISTS kbfts_%lld",
             (long long)kb_id, (long long)kb_id);
    IN_TX(s, err, store_exec_sql(s, sql, err));
}

int store_kb_hidden(store *s, int64_t *kb_id, char err[ERR_MAX])
{
    *kb_id = -1;
    sqlite3_stmt *st = store_prepare(s, "SELECT id FROM kbs WHERE name LIKE '~%' LIMIT 1", err);
    if (!st)
        return -1;
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
        *kb_id = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : store_db_err(s, err, "finding a dropped knowledge base");
}

int store_kb_drop_step(store *s, int64_t kb_id, int max_rows, bool *done, char err[ERR_MAX])
{
    /* passages, then documents, then QA entries (each table by its kb_id index), each
     * slice its own transaction; the knowledge base's row goes last */
    static const char *const sqls[] = {
        ("DELETE FROM kb_passages WHERE id IN (SELECT p.id FROM kb_docs d JOIN kb_passages p"
         " ON p.doc_id = d.id WHERE d.kb_id = ?1 LIMIT ?2)"),
        "DELETE FROM kb_docs WHERE id IN (SELECT id FROM kb_docs WHERE kb_id = ?1 LIMIT ?2)",
        "DELETE FROM qa_bank WHERE id IN (SELECT id FROM qa_bank WHERE kb_id = ?1 LIMIT ?2)",
        "DELETE FROM kbs WHERE id = ?1",
    };
    *done = false;
    for (size_t i = 0; i < sizeof sqls / sizeof sqls[0]; i++) {
        sqlite3_stmt *st = store_prepare(s, sqls[i], err);
        if (!st)
            return -1;
        sqlite3_bind_int64(st, 1, kb_id);
        sqlite3_bind_int(st, 2, max_rows);
        if (store_step_once(s, st, "dropping a knowledge base", err))
            return -1;
        if (sqlite3_changes(store_sqlite(s)) > 0 && i + 1 < sizeof sqls / sizeof sqls[0])
            return 0;
    }
    *done = true;
    return 0;
}

int store_kb_uid_usage(store *s, uint32_t uid, int64_t *bytes, int64_t *passages,
                       char err[ERR_MAX])
{
    *bytes = *passages = 0;
    sqlite3_stmt *st = store_prepare(s,
        "SELECT (SELECT coalesce(sum(d.bytes), 0) FROM kb_docs d JOIN kbs k ON k.id = d.kb_id"
        " JOIN apps a ON a.id = k.app_id WHERE a.uid = ?1),"
        " (SELECT coalesce(sum(d.n_passages), 0) FROM kb_docs d JOIN kbs k ON k.id = d.kb_id"
        " JOIN apps a ON a.id = k.app_id WHERE a.uid = ?1)", err);
    if (!st)
        return -1;
    sqlite3_bind_int64(st, 1, uid);
    if (sqlite3_step(st) != SQLITE_ROW) {
        store_db_err(s, err, "summing a uid's knowledge bases");
        sqlite3_finalize(st);
        return -1;
    }
    *bytes = sqlite3_column_int64(st, 0);
    *passages = sqlite3_column_int64(st, 1);
    sqlite3_finalize(st);
    return 0;
}

void store_vec_quantize(const float *v, int dim, int8_t *q, float *scale)
{
    float m = 0;
    for (int i = 0; i < dim; i++)
        m = fmaxf(m, fabsf(v[i]));
    float inv = m > 0 ? 127.0f / m : 0;
    for (int i = 0; i < dim; i++)
        q[i] = (int8_t)lrintf(v[i] * inv);
    *scale = m / 127.0f;
}

/* The passages of a document from one on, as kb.h stores them: their heads joined in
 * buf, passage i's text at buf + at[i] (len[i] bytes) for the first covered; the rest
 * run past the heads written (a staged document cut short), so they were never
 * indexed. */
typedef struct doc_text {
    char *buf;
    size_t len, cap;
    int n, covered;
    int64_t *ids;
    int *seqs;
    size_t *at, *lens;
} doc_text;

static void doc_text_free(doc_text *t)
{
    free(t->buf);
    free(t->ids);
    free(t->seqs);
    free(t->at);
    free(t->lens);
    memset(t, 0, sizeof *t);
}

/* Reads up to max passages of doc_id with seq >= from, lowest first, with their texts,
 * into t (empty). */
static int doc_texts(store *s, int64_t doc_id, int from, int max, doc_text *t, char *err)
{
    memset(t, 0, sizeof *t);
    if (!(t->ids = malloc(sizeof *t->ids * (size_t)max)) ||
        !(t->seqs = malloc(sizeof *t->seqs * (size_t)max)) ||
        !(t->at = malloc(sizeof *t->at * (size_t)max)) ||
        !(t->lens = malloc(sizeof *t->lens * (size_t)max))) {
        doc_text_free(t);
        return err_set(err, "store: out of memory reading passages");
    }
    sqlite3_stmt *st = store_prepare(s, "SELECT id, seq, head, len FROM kb_passages"
                                        " WHERE doc_id = ? AND seq >= ? ORDER BY seq", err);
    if (!st) {
        doc_text_free(t);
        return -1;
    }
    sqlite3_bind_int64(st, 1, doc_id);
    sqlite3_bind_int(st, 2, from);
    int rc, out = 0;
    /* rows after the max-th only lend their heads to the passages before */
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (t->n > 0 && t->n == max && t->lens[t->n - 1] <= t->len - t->at[t->n - 1])
            break;
        const char *head = (const char *)sqlite3_column_text(st, 2);
        size_t hl = (size_t)sqlite3_column_bytes(st, 2);
        if (t->n < max) {
            t->ids[t->n] = sqlite3_column_int64(st, 0);
            t->seqs[t->n] = sqlite3_column_int(st, 1);
            t->at[t->n] = t->len;
            t->lens[t->n++] = (size_t)sqlite3_column_int64(st, 3);
        }
        if (t->len + hl + 1 > t->cap) {
            size_t cap = (t->len + hl + 1) * 2;
            char *b = realloc(t->buf, cap);
            if (!b) {
                out = err_set(err, "store: out of memory reading passages");
                break;
            }
            t->buf = b;
            t->cap = cap;
        }
        memcpy(t->buf + t->len, head ? head : "", hl);
        t->len += hl;
    }
    if (out == 0 && rc != SQLITE_ROW && rc != SQLITE_DONE)
        out = store_db_err(s, err, "reading passages");
    sqlite3_finalize(st);
    /* passage ends only grow: the covered ones are a prefix. A length is the catalog's
     * (a damaged one may be negative, read as a huge size_t): it is compared with the
     * text after the passage's start (at <= len), never added to it, so that no length
     * wraps around into a passage past the text. */
    while (out == 0 && t->covered < t->n && t->lens[t->covered] <= t->len - t->at[t->covered])
        t->covered++;
    if (out)
        doc_text_free(t);
    return out;
}

/* Whether kb_id still has its FTS table (a hidden one has not). */
static int has_fts(store *s, int64_t kb_id, bool *has, char *err)
{
    char name[40];
    snprintf(name, sizeof name, "kbfts_%lld", (long long)kb_id);
    sqlite3_stmt *st = store_prepare(s, "SELECT 1 FROM sqlite_master WHERE type = 'table'"
                                        " AND name = ?", err);
    if (!st)
        return -1;
    sqlite3_bind_text(st, 1, name, -1, SQLITE_TRANSIENT);
    int rc = sqlite3_step(st);
    *has = rc == SQLITE_ROW;
    sqlite3_finalize(st);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : store_db_err(s, err, "finding an FTS table");
}

/* Takes passages t->ids[0..t->n) out of kb_id's contentless FTS table: its 'delete'
 * command needs the very text each was indexed with. */
static int fts_delete(store *s, int64_t kb_id, const doc_text *t, char *err)
{
    char sql[128];
    snprintf(sql, sizeof sql, "INSERT INTO kbfts_%lld (kbfts_%lld, rowid, text)"
                              " VALUES ('delete', ?, ?)", (long long)kb_id, (long long)kb_id);
    sqlite3_stmt *st = store_prepare(s, sql, err);
    if (!st)
        return -1;
    int out = 0;
    for (int i = 0; i < t->covered && out == 0; i++) {
        sqlite3_reset(st);
        sqlite3_bind_int64(st, 1, t->ids[i]);
        sqlite3_bind_text(st, 2, t->buf + t->at[i], (int)t->lens[i], SQLITE_STATIC);
        if (sqlite3_step(st) != SQLITE_DONE)
            out = store_db_err(s, err, "unindexing a passage");
    }
    sqlite3_finalize(st);
    return out;
}

int store_kb_stage_doc(store *s, int64_t kb_id, const char *doc, const char *metadata,
                       int64_t text_bytes, int n_passages, int64_t now_ms, int64_t *doc_id,
                       char err[ERR_MAX])
{
    *doc_id = -1;
    sqlite3_stmt *st = store_prepare(s, "INSERT INTO kb_docs (kb_id, doc, metadata, bytes,"
                                        " n_passages, created_ms, state)"
                                        " VALUES (?, ?, ?, ?, ?, ?, 1)", err);
    if (!st)
        return -1;
    sqlite3_bind_int64(st, 1, kb_id);
    sqlite3_bind_text(st, 2, doc, -1, SQLITE_STATIC);
    if (metadata)
        sqlite3_bind_text(st, 3, metadata, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, text_bytes);
    sqlite3_bind_int(st, 5, n_passages);
    sqlite3_bind_int64(st, 6, now_ms);
    if (store_step_once(s, st, "staging a document", err))
        return -1;
    *doc_id = sqlite3_last_insert_rowid(store_sqlite(s));
    return 0;
}

/* Indexes passages [lo, hi) of doc_id (written) in kb_id's FTS table: those from from
 * on have the ids ids[i - from], those before are looked up. */
static int fts_index(store *s, int64_t kb_id, int64_t doc_id, const char *text,
                     const store_span *sp, int lo, int hi, int from, const int64_t *ids,
                     char *err)
{
    char sql[96];
    snprintf(sql, sizeof sql, "INSERT INTO kbfts_%lld (rowid, text) VALUES (?, ?)",
             (long long)kb_id);
    sqlite3_stmt *st = store_prepare(s, sql, err);
    sqlite3_stmt *find = st ? store_prepare(s, "SELECT id FROM kb_passages WHERE doc_id = ?"
                                               " AND seq = ?", err) : NULL;
    int rc = st && find ? 0 : -1;
    for (int i = lo; i < hi && rc == 0; i++) {
        int64_t id = i >= from ? ids[i - from] : -1;
        if (id < 0) {
            sqlite3_reset(find);
            sqlite3_bind_int64(find, 1, doc_id);
            sqlite3_bind_int(find, 2, i);
            if (sqlite3_step(find) != SQLITE_ROW) {
                rc = store_db_err(s, err, "finding a passage to index");
                break;
            }
            id = sqlite3_column_int64(find, 0);
        }
        sqlite3_reset(st);
        sqlite3_bind_int64(st, 1, id);
        sqlite3_bind_text(st, 2, text + sp[i].off, (int)sp[i].len, SQLITE_STATIC);
        if (sqlite3_step(st) != SQLITE_DONE)
            rc = store_db_err(s, err, "indexing a passage");
    }
    sqlite3_finalize(st);
    sqlite3_finalize(find);
    return rc;
}

/* The first passage of sp whose text the heads of passages [0, written) do not hold. */
static int first_uncovered(const store_span *sp, int n_spans, int written)
{
    if (written >= n_spans)
        return n_spans;
    int i = written;
    while (i > 0 && sp[i - 1].off + sp[i - 1].len > sp[written].off)
        i--;
    return i;
}

static int put_passages_tx(store *s, int64_t kb_id, int64_t doc_id, const char *text,
                           const store_span *sp, int n_spans, int from, int n,
                           const float *vecs, int dim, int64_t *first_id, char *err)
{
    sqlite3_stmt *ins = store_prepare(s, "INSERT INTO kb_passages (doc_id, seq, head, len, vec)"
                                         " VALUES (?, ?, ?, ?, ?)", err);
    uint8_t *blob = malloc(STORE_VEC_BYTES(dim));
    int64_t *ids = malloc(sizeof *ids * (size_t)(n ? n : 1));
    int rc = ins ? 0 : -1;
    if (rc == 0 && (!blob || !ids))
        rc = err_set(err, "store: out of memory");
    for (int k = 0; k < n && rc == 0; k++) {
        int i = from + k;
        /* the head runs to the next passage's start: text between passages is kept, so
         * every passage is the heads from its own on, cut */
        size_t end = i + 1 < n_spans ? sp[i + 1].off : sp[i].off + sp[i].len;
        if (end < sp[i].off || (i + 1 < n_spans && sp[i + 1].off + sp[i + 1].len <
                                                        sp[i].off + sp[i].len)) {
            rc = err_set(err, "store: passage %d of a document is out of order", i);
            break;
        }
        float scale;
        store_vec_quantize(vecs + (size_t)k * dim, dim, (int8_t *)blob, &scale);
        memcpy(blob + dim, &scale, sizeof scale);
        sqlite3_reset(ins);
        sqlite3_bind_int64(ins, 1, doc_id);
        sqlite3_bind_int(ins, 2, i);
        sqlite3_bind_text(ins, 3, text + sp[i].off, (int)(end - sp[i].off), SQLITE_STATIC);
        sqlite3_bind_int64(ins, 4, (int64_t)sp[i].len);
        sqlite3_bind_blob(ins, 5, blob, (int)STORE_VEC_BYTES(dim), SQLITE_STATIC);
        if (sqlite3_step(ins) != SQLITE_DONE) {
            rc = store_db_err(s, err, "adding a passage");
            break;
        }
        ids[k] = sqlite3_last_insert_rowid(store_sqlite(s));
        if (k == 0 && first_id)
            *first_id = ids[k];
    }
    free(blob);
    sqlite3_finalize(ins);
    /* a passage is indexed once the heads written hold its text, so that a document cut
     * short can leave the FTS table by the 'delete' command (which needs that text) */
    if (rc == 0)
        rc = fts_index(s, kb_id, doc_id, text, sp, first_uncovered(sp, n_spans, from),
                       first_uncovered(sp, n_spans, from + n), from, ids, err);
    free(ids);
    return rc;
}

int store_kb_put_passages(store *s, int64_t kb_id, int64_t doc_id, const char *text,
                          const store_span *spans, int n_spans, int from, int n,
                          const float *vecs, int dim, int64_t *first_id, char err[ERR_MAX])
{
    if (first_id)
        *first_id = -1;
    if (from < 0 || n < 0 || from + n > n_spans)
        return err_set(err, "store: passages %d..%d of a document of %d", from, from + n,
                       n_spans);
    IN_TX(s, err, put_passages_tx(s, kb_id, doc_id, text, spans, n_spans, from, n, vecs, dim,
                                  first_id, err));
}

static int publish_tx(store *s, int64_t kb_id, const int64_t *doc_ids, int n, char *err)
{
    for (int i = 0; i < n; i++) {
        sqlite3_stmt *st = store_prepare(s, "UPDATE kb_docs SET state = 2 WHERE kb_id = ?1"
                                            " AND state = 0 AND doc = (SELECT doc FROM kb_docs"
                                            " WHERE id = ?2)", err);
        if (!st)
            return -1;
        sqlite3_bind_int64(st, 1, kb_id);
        sqlite3_bind_int64(st, 2, doc_ids[i]);
        if (store_step_once(s, st, "retiring a document", err))
            return -1;
        if (!(st = store_prepare(s, "UPDATE kb_docs SET state = 0 WHERE id = ? AND kb_id = ?"
                                    " AND state = 1", err)))
            return -1;
        sqlite3_bind_int64(st, 1, doc_ids[i]);
        sqlite3_bind_int64(st, 2, kb_id);
        if (store_step_once(s, st, "publishing a document", err))
            return -1;
        if (sqlite3_changes(store_sqlite(s)) != 1)
            return err_set(err, "store: staged document %lld is gone", (long long)doc_ids[i]);
    }
    return 0;
}

int store_kb_publish(store *s, int64_t kb_id, const int64_t *doc_ids, int n, char err[ERR_MAX])
{
    IN_TX(s, err, publish_tx(s, kb_id, doc_ids, n, err));
}

static int unstage_tx(store *s, const int64_t *doc_ids, int n, char *err)
{
    for (int i = 0; i < n; i++) {
        sqlite3_stmt *st = store_prepare(s, "UPDATE kb_docs SET state = 2 WHERE id = ?"
                                            " AND state = 1", err);
        if (!st)
            return -1;
        sqlite3_bind_int64(st, 1, doc_ids[i]);
        if (store_step_once(s, st, "retiring a staged document", err))
            return -1;
    }
    return 0;
}

int store_kb_unstage(store *s, const int64_t *doc_ids, int n, char err[ERR_MAX])
{
    IN_TX(s, err, unstage_tx(s, doc_ids, n, err));
}

int store_kb_unstage_all(store *s, char err[ERR_MAX])
{
    return store_exec_sql(s, "UPDATE kb_docs SET state = 2 WHERE state = 1", err);
}

static int clean_tx(store *s, int max_rows, bool *done, char *err)
{
    sqlite3_stmt *st = store_prepare(s, "SELECT id, kb_id FROM kb_docs WHERE state = 2 LIMIT 1",
                                     err);
    if (!st)
        return -1;
    int rc = sqlite3_step(st);
    int64_t doc_id = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
    int64_t kb_id = rc == SQLITE_ROW ? sqlite3_column_int64(st, 1) : -1;
    sqlite3_finalize(st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return store_db_err(s, err, "finding a retired document");
    if (doc_id < 0) {
        *done = true;
        return 0;
    }
    doc_text t;
    bool fts;
    if (has_fts(s, kb_id, &fts, err) || doc_texts(s, doc_id, -1, max_rows, &t, err))
        return -1;
    int out = fts ? fts_delete(s, kb_id, &t, err) : 0;
    if (out == 0 && t.n > 0) {
        st = store_prepare(s, "DELETE FROM kb_passages WHERE doc_id = ? AND seq <= ?", err);
        if (!st)
            out = -1;
        else {
            sqlite3_bind_int64(st, 1, doc_id);
            sqlite3_bind_int(st, 2, t.seqs[t.n - 1]);
            out = store_step_once(s, st, "deleting passages", err);
        }
    } else if (out == 0) {
        if (!(st = store_prepare(s, "DELETE FROM kb_docs WHERE id = ?", err)))
            out = -1;
        else {
            sqlite3_bind_int64(st, 1, doc_id);
            out = store_step_once(s, st, "deleting a document", err);
        }
    }
    doc_text_free(&t);
    return out;
}

int store_kb_clean_step(store *s, int max_rows, bool *done, char err[ERR_MAX])
{
    *done = false;
    if (max_rows < 1)
        max_rows = 1;
    IN_TX(s, err, clean_tx(s, max_rows, done, err));
}

static int put_doc_tx(store *s, int64_t kb_id, const char *doc, const char *metadata,
                      const char *text, const store_span *spans, int n, const float *vecs,
                      int dim, int64_t now_ms, int64_t *first_id, char *err)
{
    int64_t doc_id;
    return store_kb_stage_doc(s, kb_id, doc, metadata, (int64_t)strlen(text), n, now_ms,
                              &doc_id, err) ||
                   put_passages_tx(s, kb_id, doc_id, text, spans, n, 0, n, vecs, dim,
                                   first_id, err) ||
                   publish_tx(s, kb_id, &doc_id, 1, err)
               ? -1
               : 0;
}

int store_kb_put_doc(store *s, int64_t kb_id, const char *doc, const char *metadata,
                     const char *text, const store_span *spans, int n, const float *vecs,
                     int dim, int64_t now_ms, int64_t *first_id, char err[ERR_MAX])
{
    *first_id = -1;
    IN_TX(s, err, put_doc_tx(s, kb_id, doc, metadata, text, spans, n, vecs, dim, now_ms,
                             first_id, err));
}

static int remove_doc_tx(store *s, int64_t kb_id, const char *doc, bool *found, char *err)
{
    sqlite3_stmt *st = store_prepare(s, "UPDATE kb_docs SET state = 2 WHERE kb_id = ? AND"
                                        " doc = ? AND state = 0", err);
    if (!st)
        return -1;
    sqlite3_bind_int64(st, 1, kb_id);
    sqlite3_bind_text(st, 2, doc, -1, SQLITE_STATIC);
    if (store_step_once(s, st, "removing a document", err))
        return -1;
    *found = sqlite3_changes(store_sqlite(s)) > 0;
    return 0;
}

int store_kb_remove_doc(store *s, int64_t kb_id, const char *doc, bool *found,
                        char err[ERR_MAX])
{
    *found = false;
    IN_TX(s, err, remove_doc_tx(s, kb_id, doc, found, err));
}

int store_kb_vectors(store *s, int64_t kb_id, int dim,
                     int (*fn)(void *arg, int64_t id, const int8_t *q, float scale),
                     void *arg, char err[ERR_MAX])
{
    sqlite3_stmt *st = store_prepare(s, "SELECT p.id, p.vec FROM kb_docs d JOIN kb_passages p"
                                        " ON p.doc_id = d.id WHERE d.kb_id = ? AND d.state = 0"
                                        " ORDER BY p.id", err);
    if (!st)
        return -1;
    sqlite3_bind_int64(st, 1, kb_id);
    int rc, out = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        const uint8_t *v = sqlite3_column_blob(st, 1);
        if (sqlite3_column_bytes(st, 1) != (int)STORE_VEC_BYTES(dim) || !v) {
            out = err_set(err, "store: passage %lld has a vector of %d bytes, not %zu",
                          (long long)sqlite3_column_int64(st, 0), sqlite3_column_bytes(st, 1),
                          STORE_VEC_BYTES(dim));
            break;
        }
        float scale;
        memcpy(&scale, v + dim, sizeof scale);
        if (!isfinite(scale)) {
            out = err_set(err, "store: passage %lld has a corrupt vector",
                          (long long)sqlite3_column_int64(st, 0));
            break;
        }
        if ((out = fn(arg, sqlite3_column_int64(st, 0), (const int8_t *)v, scale)) != 0)
            break;
    }
    if (out == 0 && rc != SQLITE_ROW && rc != SQLITE_DONE)
        out = store_db_err(s, err, "reading vectors");
    sqlite3_finalize(st);
    return out;
}

/* An FTS5 query matching any word of text: each run of letters and digits (and bytes of
 * multi-byte characters) quoted, joined by OR, so punctuation and FTS5 syntax in a
 * question are only text. */
static void match_expr(const char *text, char *out, size_t cap)
{
    size_t n = 0;
    out[0] = '\0';
    for (const unsigned char *p = (const unsigned char *)text; *p;) {
        if (!(isalnum(*p) || *p >= 0x80)) {
            p++;
            continue;
        }
        const unsigned char *w = p;
        while (*p && (isalnum(*p) || *p >= 0x80))
            p++;
        size_t len = (size_t)(p - w);
        if (n + len + 8 >= cap)
            break;
        n += (size_t)snprintf(out + n, cap - n, "%s\"%.*s\"", n ? " OR " : "", (int)len,
                              (const char *)w);
    }
}

int store_kb_bm25(store *s, int64_t kb_id, const char *query, int k, int64_t *ids,
                  float *scores, int *n, char err[ERR_MAX])
{
    *n = 0;
    char match[KB_MATCH_MAX];
    match_expr(query, match, sizeof match);
    if (!match[0] || k <= 0)
        return 0;
    /* the FTS table indexes staged and retired passages too: a knowledge base that has
     * any (rarely) has its matches checked against their documents' state */
    sqlite3_stmt *st = store_prepare(s, "SELECT 1 FROM kb_docs WHERE kb_id = ? AND state != 0"
                                        " LIMIT 1", err);
    if (!st)
        return -1;
    sqlite3_bind_int64(st, 1, kb_id);
    int rc = sqlite3_step(st);
    bool hidden = rc == SQLITE_ROW;
    sqlite3_finalize(st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return store_db_err(s, err, "BM25 search");
    char sql[400], filter[160] = "";
    long long id = (long long)kb_id;
    if (hidden)
        snprintf(filter, sizeof filter, " AND NOT EXISTS (SELECT 1 FROM kb_passages p JOIN"
                 " kb_docs d ON d.id = p.doc_id WHERE p.id = kbfts_%lld.rowid AND d.state != 0)",
                 id);
    snprintf(sql, sizeof sql,
             "SELECT rowid, bm25(kbfts_%lld) FROM kbfts_%lld WHERE kbfts_%lld MATCH ?%s"
             " ORDER BY bm25(kbfts_%lld) LIMIT ?", id, id, id, filter, id);
    if (!(st = store_prepare(s, sql, err)))
        return -1;
    sqlite3_bind_text(st, 1, match, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 2, k);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW && *n < k) {
        ids[*n] = sqlite3_column_int64(st, 0);
        scores[*n] = (float)-sqlite3_column_double(st, 1);
        (*n)++;
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return store_db_err(s, err, "BM25 search");
    return 0;
}

int store_kb_passage(store *s, int64_t kb_id, int64_t id,
                     int (*fn)(void *arg, const store_passage *p), void *arg, bool *found,
                     char err[ERR_MAX])
{
    *found = false;
    sqlite3_stmt *st = store_prepare(s, "SELECT d.doc, p.seq, d.metadata, p.doc_id FROM"
                                        " kb_passages p JOIN kb_docs d ON d.id = p.doc_id"
                                        " WHERE d.kb_id = ? AND p.id = ? AND d.state = 0", err);
    if (!st)
        return -1;
    sqlite3_bind_int64(st, 1, kb_id);
    sqlite3_bind_int64(st, 2, id);
    int rc = sqlite3_step(st), out = 0;
    if (rc == SQLITE_ROW) {
        *found = true;
        doc_text t;
        if (!fn) {
            out = 0;
        } else if (doc_texts(s, sqlite3_column_int64(st, 3), sqlite3_column_int(st, 1), 1, &t,
                             err) == 0) {
            if (t.covered == 1) {
                t.buf[t.at[0] + t.lens[0]] = '\0';
                store_passage p = {id, (const char *)sqlite3_column_text(st, 0),
                                   sqlite3_column_int(st, 1), t.buf + t.at[0],
                                   (const char *)sqlite3_column_text(st, 2)};
                out = fn(arg, &p);
            } else {
                out = err_set(err, "store: passage %lld has no text", (long long)id);
            }
            doc_text_free(&t);
        } else {
            out = -1;
        }
    } else if (rc != SQLITE_DONE) {
        out = store_db_err(s, err, "reading a passage");
    }
    sqlite3_finalize(st);
    return out;
}

/* ---- QA bank ---- */

int store_qa_put(store *s, int64_t kb_id, const char *question, const float *vec, int dim,
                 const char *answer, int stop, int n_tokens, const int64_t *passages,
                 int n_passages, bool predicted, int64_t now_ms, char err[ERR_MAX])
{
    sqlite3_stmt *st = store_prepare(s, "INSERT INTO qa_bank (kb_id, question, vec, answer, passages,"
                               " created_ms, predicted, stop_reason, generated_tokens)"
                               " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", err);
    if (!st)
        return -1;
    sqlite3_bind_int64(st, 1, kb_id);
    sqlite3_bind_text(st, 2, question, -1, SQLITE_STATIC);
    sqlite3_bind_blob(st, 3, vec, (int)(sizeof(float) * (size_t)dim), SQLITE_STATIC);
    sqlite3_bind_text(st, 4, answer, -1, SQLITE_STATIC);
    sqlite3_bind_blob(st, 5, n_passages ? (const void *)passages : "",
                      (int)(sizeof(int64_t) * (size_t)n_passages), SQLITE_STATIC);
    sqlite3_bind_int64(st, 6, now_ms);
    sqlite3_bind_int(st, 7, predicted);
    sqlite3_bind_int(st, 8, stop);
    sqlite3_bind_int(st, 9, n_tokens);
    return store_step_once(s, st, "adding a QA entry", err);
}

int store_qa_list(store *s, int64_t kb_id, int dim,
                  int (*fn)(void *arg, const store_qa *q), void *arg, char err[ERR_MAX])
{
    sqlite3_stmt *st = store_prepare(s, "SELECT id, question, vec, answer, passages, created_ms,"
                               " predicted, stop_reason, generated_tokens FROM qa_bank"
                               " WHERE kb_id = ? ORDER BY id", err);
    if (!st)
        return -1;
    sqlite3_bind_int64(st, 1, kb_id);
    int rc, out = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        int pb = sqlite3_column_bytes(st, 4);
        const void *pv = sqlite3_column_blob(st, 4);
        const void *v = sqlite3_column_blob(st, 2);
        int64_t stop = sqlite3_column_int64(st, 7), n_tokens = sqlite3_column_int64(st, 8);
        if (sqlite3_column_bytes(st, 2) != (int)(sizeof(float) * (size_t)dim) || !v ||
            pb % (int)sizeof(int64_t) || stop < 0 || stop > INT_MAX || n_tokens < 0 ||
            n_tokens > INT_MAX) {
            out = err_set(err, "store: QA entry %lld is malformed",
                          (long long)sqlite3_column_int64(st, 0));
            break;
        }
        store_qa q = {sqlite3_column_int64(st, 0), (const char *)sqlite3_column_text(st, 1), v,
                      (const char *)sqlite3_column_text(st, 3), (int)stop, (int)n_tokens, pv,
                      pb / (int)sizeof(int64_t), sqlite3_column_int64(st, 5),
                      sqlite3_column_int(st, 6) != 0};
        if ((out = fn(arg, &q)) != 0)
            break;
    }
    if (out == 0 && rc != SQLITE_ROW && rc != SQLITE_DONE)
        out = store_db_err(s, err, "reading the QA bank");
    sqlite3_finalize(st);
    return out;
}

int store_qa_delete(store *s, int64_t id, char err[ERR_MAX])
{
    sqlite3_stmt *st = store_prepare(s, "DELETE FROM qa_bank WHERE id = ?", err);
    if (!st)
        return -1;
    sqlite3_bind_int64(st, 1, id);
    return store_step_once(s, st, "deleting a QA entry", err);
}

int store_qa_asked(store *s, int64_t id, char err[ERR_MAX])
{
    sqlite3_stmt *st = store_prepare(s, "UPDATE qa_bank SET predicted = 0 WHERE id = ?", err);
    if (!st)
        return -1;
    sqlite3_bind_int64(st, 1, id);
    return store_step_once(s, st, "marking a QA entry asked", err);
}

/* ---- owners ---- */

/* Binds a filter as (?uid, ?scope): uid -1 for every owner, scope NULL for every scope. */
static void bind_filter(sqlite3_stmt *st, int at, const store_owner *f)
{
    sqlite3_bind_int64(st, at, f ? (int64_t)f->uid : -1);
    if (f && f->scope)
        sqlite3_bind_text(st, at + 1, f->scope, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, at + 1);
}

/* Steps a statement returning one row of two integers. */
static int two_counts(store *s, sqlite3_stmt *st, const char *what, int64_t *a, int64_t *b,
                      char *err)
{
    if (sqlite3_step(st) != SQLITE_ROW) {
        store_db_err(s, err, what);
        sqlite3_finalize(st);
        return -1;
    }
    *a = sqlite3_column_int64(st, 0);
    *b = sqlite3_column_int64(st, 1);
    sqlite3_finalize(st);
    return 0;
}

int store_kb_totals(store *s, int64_t *passages, int64_t *text_bytes, char err[ERR_MAX])
{
    *passages = *text_bytes = 0;
    sqlite3_stmt *st = store_prepare(s, "SELECT coalesce(sum(n_passages), 0),"
                                        " coalesce(sum(bytes), 0) FROM kb_docs WHERE state = 0",
                                     err);
    return st ? two_counts(s, st, "counting passages", passages, text_bytes, err) : -1;
}

int store_kb_disk_btree(store *s, int index, int64_t *bytes, bool *done, char err[ERR_MAX])
{
    *bytes = 0;
    *done = false;
    sqlite3_stmt *name = store_prepare(s, "SELECT name FROM sqlite_master WHERE name IN"
                                          " ('kb_docs', 'kb_passages', 'kb_docs_visible',"
                                          " 'kb_docs_by_kb', 'kb_passages_by_doc') OR (name GLOB"
                                          " 'kbfts_[0-9]*_*' AND type = 'table')"
                                          " ORDER BY name LIMIT 1 OFFSET ?", err);
    if (!name)
        return -1;
    sqlite3_bind_int(name, 1, index);
    int rc = sqlite3_step(name);
    if (rc != SQLITE_ROW) {
        sqlite3_finalize(name);
        *done = rc == SQLITE_DONE;
        return *done ? 0 : store_db_err(s, err, "listing the knowledge bases' tables");
    }
    /* dbstat visits only the btree its name constraint names */
    sqlite3_stmt *st = store_prepare(s, "SELECT coalesce(sum(pgsize), 0) FROM dbstat('main', 1)"
                                        " WHERE name = ?", err);
    int out = -1;
    if (st) {
        sqlite3_bind_text(st, 1, (const char *)sqlite3_column_text(name, 0), -1,
                          SQLITE_TRANSIENT);
        if (sqlite3_step(st) == SQLITE_ROW) {
            *bytes = sqlite3_column_int64(st, 0);
            out = 0;
        } else {
            out = store_db_err(s, err, "measuring knowledge bases");
        }
    }
    sqlite3_finalize(st);
    sqlite3_finalize(name);
    return out;
}

#define QA_BYTES "(length(q.question) + length(q.vec) + length(q.answer) + length(q.passages))"
#define QA_OWNED                                                                           \
    " FROM qa_bank q JOIN kbs k ON k.id = q.kb_id JOIN apps a ON a.id = k.app_id"
#define QA_FILTER " WHERE (?1 < 0 OR a.uid = ?1) AND (?2 IS NULL OR a.name = ?2)"

int store_qa_stats(store *s, const store_owner *filter, int64_t *n, int64_t *bytes,
                   char err[ERR_MAX])
{
    sqlite3_stmt *st = store_prepare(s, "SELECT count(*), coalesce(sum(" QA_BYTES "), 0)"
                                        QA_OWNED QA_FILTER, err);
    if (!st)
        return -1;
    bind_filter(st, 1, filter);
    return two_counts(s, st, "counting the QA bank", n, bytes, err);
}

/* Deletes the oldest QA entry of app app_id. */
static int qa_evict_one(store *s, int64_t app_id, char *err)
{
    sqlite3_stmt *st = store_prepare(s, "DELETE FROM qa_bank WHERE id = (SELECT min(q.id) FROM"
                                        " qa_bank q JOIN kbs k ON k.id = q.kb_id"
                                        " WHERE k.app_id = ?)", err);
    if (!st)
        return -1;
    sqlite3_bind_int64(st, 1, app_id);
    return store_step_once(s, st, "evicting a QA entry", err);
}

int store_qa_evict(store *s, int64_t budget, int *evicted, char err[ERR_MAX])
{
    if (evicted)
        *evicted = 0;
    for (;;) {
        int64_t n, bytes;
        if (store_qa_stats(s, NULL, &n, &bytes, err))
            return -1;
        if (bytes <= budget || n == 0)
            return 0;
        sqlite3_stmt *st = store_prepare(s, "SELECT k.app_id, sum(" QA_BYTES ") AS b FROM"
                                            " qa_bank q JOIN kbs k ON k.id = q.kb_id"
                                            " GROUP BY k.app_id ORDER BY b DESC LIMIT 1", err);
        int64_t app_id, b;
        if (!st || two_counts(s, st, "finding the largest QA owner", &app_id, &b, err) ||
            qa_evict_one(s, app_id, err))
            return -1;
        if (evicted)
            (*evicted)++;
    }
}

int store_qa_evict_owner(store *s, uint32_t uid, const char *app, int64_t max_bytes,
                         int64_t max_entries, int *evicted, char err[ERR_MAX])
{
    if (evicted)
        *evicted = 0;
    store_owner o = {uid, app};
    for (;;) {
        int64_t n, bytes, app_id;
        if (store_qa_stats(s, &o, &n, &bytes, err))
            return -1;
        if (n == 0 || ((max_bytes <= 0 || bytes <= max_bytes) &&
                       (max_entries <= 0 || n <= max_entries)))
            return 0;
        if (store_app_id(s, uid, app, &app_id, err) || qa_evict_one(s, app_id, err))
            return -1;
        if (evicted)
            (*evicted)++;
    }
}

/* ---- QKV tree ---- */

#define QKV_BYTES "(length(blob) + length(tokens))"

int store_qkv_put(store *s, const uint8_t key[STORE_QKV_KEY_BYTES], const uint8_t *parent,
                  const store_owner *o, const int32_t *prefix, int n_prefix, int n_tokens,
                  const void *raw, size_t raw_bytes, bool predicted, int64_t now_ms,
                  char err[ERR_MAX])
{
    if (!o || !o->scope || n_prefix < 0)
        return err_set(err, "store: a QKV node needs an owner and a prefix");
    size_t cap = ZSTD_compressBound(raw_bytes);
    void *comp = malloc(cap ? cap : 1);
    if (!comp)
        return err_set(err, "store: out of memory compressing a QKV node");
    size_t len = ZSTD_compress(comp, cap, raw, raw_bytes, KB_ZSTD_LEVEL);
    if (ZSTD_isError(len)) {
        free(comp);
        return err_set(err, "store: zstd: %s", ZSTD_getErrorName(len));
    }
    sqlite3_stmt *st = store_prepare(s, "INSERT OR REPLACE INTO qkv_nodes (key, parent, uid, scope,"
                               " tokens, n_tokens, raw_bytes, crc, blob, uses, last_used_ms,"
                               " predicted) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?, ?)", err);
    if (!st) {
        free(comp);
        return -1;
    }
    sqlite3_bind_blob(st, 1, key, STORE_QKV_KEY_BYTES, SQLITE_STATIC);
    if (parent)
        sqlite3_bind_blob(st, 2, parent, STORE_QKV_KEY_BYTES, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, 2);
    sqlite3_bind_int64(st, 3, o->uid);
    sqlite3_bind_text(st, 4, o->scope, -1, SQLITE_STATIC);
    sqlite3_bind_blob(st, 5, n_prefix ? (const void *)prefix : "",
                      (int)(sizeof *prefix * (size_t)n_prefix), SQLITE_STATIC);
    sqlite3_bind_int(st, 6, n_tokens);
    sqlite3_bind_int64(st, 7, (int64_t)raw_bytes);
    sqlite3_bind_int64(st, 8, crc32c(0, raw, raw_bytes));
    sqlite3_bind_blob(st, 9, comp, (int)len, SQLITE_STATIC);
    sqlite3_bind_int64(st, 10, now_ms);
    sqlite3_bind_int(st, 11, predicted);
    int rc = store_step_once(s, st, "storing a QKV node", err);
    free(comp);
    return rc;
}

/* Whether the row st is on (uid, scope, tokens in columns 0-2) is o's node made from
 * prefix. */
static bool qkv_row_matches(sqlite3_stmt *st, const store_owner *o, const int32_t *prefix,
                            int n_prefix)
{
    const char *scope = (const char *)sqlite3_column_text(st, 1);
    const void *toks = sqlite3_column_blob(st, 2);
    size_t len = (size_t)sqlite3_column_bytes(st, 2);
    return o && o->scope && scope && sqlite3_column_int64(st, 0) == (int64_t)o->uid &&
           strcmp(scope, o->scope) == 0 && len == sizeof *prefix * (size_t)n_prefix &&
           (len == 0 || (toks && memcmp(toks, prefix, len) == 0));
}

/* The first 8 bytes of key in hex, for an error that names its node. */
static const char *key_hex(const uint8_t key[STORE_QKV_KEY_BYTES], char hex[17])
{
    for (int i = 0; i < 8; i++)
        snprintf(hex + 2 * i, 3, "%02x", key[i]);
    return hex;
}

int store_qkv_get(store *s, const uint8_t key[STORE_QKV_KEY_BYTES], const store_owner *o,
                  const int32_t *prefix, int n_prefix, void *dst, size_t dst_cap,
                  size_t *raw_bytes, int *n_tokens, bool *predicted, bool *found,
                  bool *mismatch, char err[ERR_MAX])
{
    *found = *mismatch = false;
    sqlite3_stmt *st = store_prepare(s, "SELECT uid, scope, tokens, n_tokens, raw_bytes, crc, blob,"
                                        " predicted FROM qkv_nodes WHERE key = ?", err);
    if (!st)
        return -1;
    sqlite3_bind_blob(st, 1, key, STORE_QKV_KEY_BYTES, SQLITE_STATIC);
    int rc = sqlite3_step(st), out = 0;
    char hex[17];
    if (rc == SQLITE_ROW && !qkv_row_matches(st, o, prefix, n_prefix)) {
        *mismatch = true;
    } else if (rc == SQLITE_ROW) {
        size_t raw = (size_t)sqlite3_column_int64(st, 4);
        uint32_t crc = (uint32_t)sqlite3_column_int64(st, 5);
        const void *blob = sqlite3_column_blob(st, 6);
        size_t len = (size_t)sqlite3_column_bytes(st, 6);
        *n_tokens = sqlite3_column_int(st, 3);
        if (predicted)
            *predicted = sqlite3_column_int(st, 7) != 0;
        size_t got = raw <= dst_cap && blob ? ZSTD_decompress(dst, dst_cap, blob, len) : 0;
        if (raw > dst_cap)
            out = err_set(err, "store: QKV node %s holds %zu bytes, more than %zu",
                          key_hex(key, hex), raw, dst_cap);
        else if (ZSTD_isError(got) || got != raw || crc32c(0, dst, raw) != crc)
            out = err_set(err, "store: QKV node %s is corrupt", key_hex(key, hex));
        else {
            *raw_bytes = raw;
            *found = true;
        }
    } else if (rc != SQLITE_DONE) {
        out = store_db_err(s, err, "reading a QKV node");
    }
    sqlite3_finalize(st);
    return out;
}

int store_qkv_touch(store *s, const uint8_t key[STORE_QKV_KEY_BYTES], bool real,
                    int64_t now_ms, char err[ERR_MAX])
{
    sqlite3_stmt *st = store_prepare(s, "UPDATE qkv_nodes SET uses = uses + 1, last_used_ms = ?,"
                               " predicted = predicted AND ? WHERE key = ?", err);
    if (!st)
        return -1;
    sqlite3_bind_int64(st, 1, now_ms);
    sqlite3_bind_int(st, 2, !real);
    sqlite3_bind_blob(st, 3, key, STORE_QKV_KEY_BYTES, SQLITE_STATIC);
    return store_step_once(s, st, "counting a QKV use", err);
}

int store_qkv_has(store *s, const uint8_t key[STORE_QKV_KEY_BYTES], const store_owner *o,
                  const int32_t *prefix, int n_prefix, bool *found, bool *mismatch,
                  char err[ERR_MAX])
{
    *found = *mismatch = false;
    sqlite3_stmt *st = store_prepare(s, "SELECT uid, scope, tokens FROM qkv_nodes WHERE key = ?",
                                     err);
    if (!st)
        return -1;
    sqlite3_bind_blob(st, 1, key, STORE_QKV_KEY_BYTES, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        *found = qkv_row_matches(st, o, prefix, n_prefix);
        *mismatch = !*found;
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return store_db_err(s, err, "looking up a QKV node");
    return 0;
}

int store_qkv_stats(store *s, const store_owner *filter, int64_t *n, int64_t *bytes,
                    char err[ERR_MAX])
{
    sqlite3_stmt *st = store_prepare(s, "SELECT count(*), coalesce(sum(" QKV_BYTES "), 0) FROM"
                                        " qkv_nodes WHERE (?1 < 0 OR uid = ?1) AND"
                                        " (?2 IS NULL OR scope = ?2)", err);
    if (!st)
        return -1;
    bind_filter(st, 1, filter);
    return two_counts(s, st, "counting the QKV tree", n, bytes, err);
}

/* Evicts owner (uid, scope)'s least used leaf: removing an inner node would strand its
 * children's paths, whoever's they are (a uid's shared system prompt node has children of
 * its apps). *gone: whether the owner had a leaf. */
static int qkv_evict_leaf(store *s, int64_t uid, const char *scope, bool *gone, char *err)
{
    sqlite3_stmt *st = store_prepare(s, "DELETE FROM qkv_nodes WHERE key = (SELECT q.key FROM"
                               " qkv_nodes q WHERE q.uid = ? AND q.scope = ? AND NOT EXISTS"
                               " (SELECT 1 FROM qkv_nodes c WHERE c.parent = q.key)"
                               " ORDER BY q.uses, q.last_used_ms LIMIT 1)", err);
    if (!st)
        return -1;
    sqlite3_bind_int64(st, 1, uid);
    sqlite3_bind_text(st, 2, scope, -1, SQLITE_TRANSIENT);
    if (store_step_once(s, st, "evicting a QKV node", err))
        return -1;
    *gone = sqlite3_changes(store_sqlite(s)) > 0;
    return 0;
}

int store_qkv_evict(store *s, int64_t budget, int *evicted, char err[ERR_MAX])
{
    if (evicted)
        *evicted = 0;
    for (;;) {
        int64_t n, bytes;
        if (store_qkv_stats(s, NULL, &n, &bytes, err))
            return -1;
        if (bytes <= budget || n == 0)
            return 0;
        /* the largest owner that has a leaf: a uid's shared nodes may all be parents of
         * its apps' nodes, and go once those have */
        sqlite3_stmt *st = store_prepare(s, "SELECT uid, scope, sum(" QKV_BYTES ") AS b FROM"
                                            " qkv_nodes q GROUP BY uid, scope HAVING max(NOT"
                                            " EXISTS (SELECT 1 FROM qkv_nodes c WHERE c.parent"
                                            " = q.key)) ORDER BY b DESC LIMIT 1", err);
        if (!st)
            return -1;
        if (sqlite3_step(st) != SQLITE_ROW) {
            store_db_err(s, err, "finding the largest QKV owner");
            sqlite3_finalize(st);
            return -1;
        }
        bool gone;
        int rc = qkv_evict_leaf(s, sqlite3_column_int64(st, 0),
                                (const char *)sqlite3_column_text(st, 1), &gone, err);
        sqlite3_finalize(st);
        if (rc)
            return -1;
        if (!gone)
            return err_set(err, "store: QKV tree over budget with no leaf to evict");
        if (evicted)
            (*evicted)++;
    }
}

int store_qkv_evict_owner(store *s, const store_owner *o, int64_t max_bytes,
                          int64_t max_entries, int *evicted, char err[ERR_MAX])
{
    if (evicted)
        *evicted = 0;
    if (!o || !o->scope)
        return err_set(err, "store: QKV eviction needs one owner");
    for (;;) {
        int64_t n, bytes;
        if (store_qkv_stats(s, o, &n, &bytes, err))
            return -1;
        if (n == 0 || ((max_bytes <= 0 || bytes <= max_bytes) &&
                       (max_entries <= 0 || n <= max_entries)))
            return 0;
        bool gone;
        if (qkv_evict_leaf(s, o->uid, o->scope, &gone, err))
            return -1;
        /* what is left of the owner's are prefixes of others' paths: they go after those */
        if (!gone)
            return 0;
        if (evicted)
            (*evicted)++;
    }
}

int store_cache_begin(store *s, char err[ERR_MAX])
{
    if (store_exec_sql(s, "PRAGMA synchronous = NORMAL", err))
        return -1;
    if (store_kb_begin(s, err) == 0)
        return 0;
    store_cache_end(s);
    return -1;
}

int store_cache_commit(store *s, char err[ERR_MAX])
{
    int rc = store_kb_commit(s, err);
    store_cache_end(s);
    return rc;
}

void store_cache_end(store *s)
{
    sqlite3_exec(store_sqlite(s), "PRAGMA synchronous = FULL", NULL, NULL, NULL);
}

static int rag_clear_tx(store *s, const store_owner *filter, char *err)
{
    sqlite3_stmt *st = store_prepare(s, "DELETE FROM qkv_nodes WHERE (?1 < 0 OR uid = ?1) AND"
                                        " (?2 IS NULL OR scope = ?2)", err);
    if (!st)
        return -1;
    bind_filter(st, 1, filter);
    if (store_step_once(s, st, "clearing the QKV tree", err))
        return -1;
    st = store_prepare(s, "DELETE FROM qa_bank WHERE id IN (SELECT q.id" QA_OWNED QA_FILTER ")",
                       err);
    if (!st)
        return -1;
    bind_filter(st, 1, filter);
    return store_step_once(s, st, "clearing the QA bank", err);
}

int store_rag_clear(store *s, const store_owner *filter, char err[ERR_MAX])
{
    IN_TX(s, err, rag_clear_tx(s, filter, err));
}

/* ---- migration 11 ---- */

/* A passage of the old table waiting for the next of its document, which decides its
 * head. */
typedef struct old_passage {
    int64_t id, doc_id, kb_id;
    int seq, dim;
    char *text;
    size_t len;
    void *vec;
    size_t vec_bytes;
} old_passage;

static void old_passage_clear(old_passage *p)
{
    free(p->text);
    free(p->vec);
    memset(p, 0, sizeof *p);
}

/* Writes p with the head that runs to next's start (next NULL: the document's last).
 * The old rows keep no offsets: the overlap is the longest end of p's text that starts
 * next's; any such end rebuilds p exactly, as next's text follows it. */
static int migrate_put(store *s, sqlite3_stmt *ins, const old_passage *p, const char *next,
                       size_t next_len, char *err)
{
    size_t k = next ? (p->len < next_len ? p->len : next_len) : 0;
    while (k > 0 && memcmp(p->text + p->len - k, next, k) != 0)
        k--;
    uint8_t *blob = NULL;
    size_t blob_bytes = p->vec_bytes;
    /* a vector of the wrong size is kept as it is: reading it stays the error it was */
    if (p->vec_bytes == sizeof(float) * (size_t)p->dim && p->dim > 0) {
        float *f = malloc(p->vec_bytes);
        blob = malloc(STORE_VEC_BYTES(p->dim));
        if (!f || !blob) {
            free(f);
            free(blob);
            return err_set(err, "store: out of memory migrating passages");
        }
        memcpy(f, p->vec, p->vec_bytes);
        float scale;
        store_vec_quantize(f, p->dim, (int8_t *)blob, &scale);
        memcpy(blob + p->dim, &scale, sizeof scale);
        blob_bytes = STORE_VEC_BYTES(p->dim);
        free(f);
    }
    sqlite3_reset(ins);
    sqlite3_bind_int64(ins, 1, p->id);
    sqlite3_bind_int64(ins, 2, p->doc_id);
    sqlite3_bind_int(ins, 3, p->seq);
    sqlite3_bind_text(ins, 4, p->text, (int)(p->len - k), SQLITE_STATIC);
    sqlite3_bind_int64(ins, 5, (int64_t)p->len);
    sqlite3_bind_blob(ins, 6, blob ? (const void *)blob : p->vec ? p->vec : "",
                      (int)blob_bytes, SQLITE_STATIC);
    int rc = sqlite3_step(ins) == SQLITE_DONE ? 0 : store_db_err(s, err, "migrating a passage");
    free(blob);
    return rc;
}

/* Indexes p in its knowledge base's new FTS table, when it has one. */
static int migrate_index(store *s, const old_passage *p, int64_t *fts_kb, bool *fts, char *err)
{
    if (p->kb_id != *fts_kb) {
        *fts_kb = p->kb_id;
        if (has_fts(s, p->kb_id, fts, err))
            return -1;
    }
    if (!*fts)
        return 0;
    char sql[96];
    snprintf(sql, sizeof sql, "INSERT INTO kbfts_%lld (rowid, text) VALUES (?, ?)",
             (long long)p->kb_id);
    sqlite3_stmt *st = store_prepare(s, sql, err);
    if (!st)
        return -1;
    sqlite3_bind_int64(st, 1, p->id);
    sqlite3_bind_text(st, 2, p->text, (int)p->len, SQLITE_STATIC);
    return store_step_once(s, st, "indexing a migrated passage", err);
}

int store_kb_migrate_11(store *s, char *err)
{
    /* every knowledge base with an FTS table (a hidden one has none) gets a contentless
     * one, filled below */
    sqlite3_stmt *st = store_prepare(s, "SELECT id FROM kbs", err);
    if (!st)
        return -1;
    int rc, out = 0, n_ids = 0;
    int64_t *ids = NULL;
    /* listed first: a table cannot be dropped while a read is open */
    while (out == 0 && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        int64_t kb_id = sqlite3_column_int64(st, 0);
        bool fts;
        int64_t *g = realloc(ids, sizeof *ids * (size_t)(n_ids + 1));
        if (!g)
            out = err_set(err, "store: out of memory migrating");
        else if ((ids = g, has_fts(s, kb_id, &fts, err)))
            out = -1;
        else if (fts)
            ids[n_ids++] = kb_id;
    }
    sqlite3_finalize(st);
    for (int i = 0; i < n_ids && out == 0; i++) {
        char sql[160];
        snprintf(sql, sizeof sql, "DROP TABLE kbfts_%lld; CREATE VIRTUAL TABLE kbfts_%lld USING"
                 " fts5(text, content='')", (long long)ids[i], (long long)ids[i]);
        out = store_exec_sql(s, sql, err);
    }
    free(ids);
    if (out)
        return -1;
    st = store_prepare(s, "SELECT p.id, n.id, p.seq, p.text, p.vec, k.dim, k.id FROM kb_passages p"
                          " JOIN kb_docs_v11 n ON n.kb_id = p.kb_id AND n.doc = p.doc"
                          " JOIN kbs k ON k.id = p.kb_id ORDER BY n.id, p.seq", err);
    sqlite3_stmt *ins = st ? store_prepare(s, "INSERT INTO kb_passages_v11 (id, doc_id, seq, head,"
                                              " len, vec) VALUES (?, ?, ?, ?, ?, ?)", err)
                           : NULL;
    old_passage prev = {0};
    bool have = false, fts = false;
    int64_t fts_kb = -1;
    out = st && ins ? 0 : -1;
    while (out == 0 && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        old_passage p = {
            .id = sqlite3_column_int64(st, 0),
            .doc_id = sqlite3_column_int64(st, 1),
            .seq = sqlite3_column_int(st, 2),
            .len = (size_t)sqlite3_column_bytes(st, 3),
            .vec_bytes = (size_t)sqlite3_column_bytes(st, 4),
            .dim = sqlite3_column_int(st, 5),
            .kb_id = sqlite3_column_int64(st, 6),
        };
        const char *text = (const char *)sqlite3_column_text(st, 3);
        const void *vec = sqlite3_column_blob(st, 4);
        p.text = malloc(p.len + 1);
        p.vec = malloc(p.vec_bytes + 1);
        if (!p.text || !p.vec) {
            old_passage_clear(&p);
            out = err_set(err, "store: out of memory migrating passages");
            break;
        }
        memcpy(p.text, text ? text : "", p.len);
        if (p.vec_bytes)
            memcpy(p.vec, vec, p.vec_bytes);
        bool same_doc = have && prev.doc_id == p.doc_id;
        if (have && migrate_put(s, ins, &prev, same_doc ? p.text : NULL, p.len, err))
            out = -1;
        old_passage_clear(&prev);
        prev = p;
        have = true;
        if (out == 0)
            out = migrate_index(s, &p, &fts_kb, &fts, err);
    }
    if (out == 0 && st && rc != SQLITE_DONE)
        out = store_db_err(s, err, "reading passages to migrate");
    if (out == 0 && have)
        out = migrate_put(s, ins, &prev, NULL, 0, err);
    old_passage_clear(&prev);
    sqlite3_finalize(st);
    sqlite3_finalize(ins);
    return out;
}
