/* store.c — the sqlite3 catalog of apps, contexts and turns (see store.h). */
#include "storage/store.h"
#include "storage/store_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/clock.h"

#define STORE_FILE "llmsd.db"
#define STORE_LOCK_FILE "llmsd.lock"
#define STORE_BUSY_TIMEOUT_MS 5000
/* Free pages worth giving back to the file system after a delete: below this the next
 * inserts reuse them anyway. */
#define STORE_VACUUM_BYTES (4 << 20)
/* Size the write-ahead log is cut back to after a checkpoint. */
#define STORE_WAL_LIMIT_BYTES (16 << 20)

/*
 * Schema migrations: entry i moves a database from user_version i to i + 1, in one
 * transaction together with the version bump, so a crash mid-migration leaves the
 * previous version intact.
 */
static const char *const store_migrations[] = {
    "CREATE TABLE apps ("
    "  id INTEGER PRIMARY KEY,"
    "  uid INTEGER NOT NULL,"
    "  name TEXT NOT NULL,"
    "  created_ms INTEGER NOT NULL,"
    "  UNIQUE (uid, name));"
    "CREATE TABLE contexts ("
    "  id TEXT PRIMARY KEY,"
    "  app_id INTEGER NOT NULL REFERENCES apps(id),"
    "  system_prompt TEXT,"
    "  params BLOB,"
    "  created_ms INTEGER NOT NULL,"
    "  last_used_ms INTEGER NOT NULL,"
    "  n_tokens INTEGER NOT NULL DEFAULT 0,"
    "  n_turns INTEGER NOT NULL DEFAULT 0);"
    "CREATE INDEX contexts_by_app ON contexts (app_id, created_ms);"
    "CREATE TABLE turns ("
    "  context_id TEXT NOT NULL REFERENCES contexts(id) ON DELETE CASCADE,"
    "  seq INTEGER NOT NULL,"
    "  role TEXT NOT NULL,"
    "  text TEXT NOT NULL,"
    "  tokens BLOB NOT NULL," /* int32 little-endian each */
    "  PRIMARY KEY (context_id, seq));",

    /* Chunk blobs (chunks.h): a row per stored chunk naming its file's generation, and
     * small named settings (doubles, little-endian IEEE 754 each). */
    "CREATE TABLE chunks ("
    "  context_id TEXT NOT NULL REFERENCES contexts(id) ON DELETE CASCADE,"
    "  idx INTEGER NOT NULL,"
    "  precision INTEGER NOT NULL,"
    "  n_tokens INTEGER NOT NULL,"
    "  n_sections INTEGER NOT NULL,"
    "  raw_bytes INTEGER NOT NULL,"
    "  file_bytes INTEGER NOT NULL,"
    "  generation INTEGER NOT NULL,"
    "  density REAL NOT NULL,"
    "  last_used_ms INTEGER NOT NULL,"
    "  PRIMARY KEY (context_id, idx));"
    "CREATE TABLE settings ("
    "  key TEXT PRIMARY KEY,"
    "  vals BLOB NOT NULL);",

    /* A context's sliding window (store_window). */
    "ALTER TABLE contexts ADD COLUMN overflow INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE contexts ADD COLUMN window_sink INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE contexts ADD COLUMN window_dropped INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE contexts ADD COLUMN window_slides INTEGER NOT NULL DEFAULT 0;",

    /* The generate model a context belongs to (daemon/models/models.h); NULL for contexts from
     * before the registry. */
    "ALTER TABLE contexts ADD COLUMN model TEXT;",

    /* Knowledge bases, their documents and passages (storage/kb.h): each knowledge base
     * has its own FTS5 table kbfts_<id> (created with it), so BM25 statistics never mix
     * apps. The QA bank and the QKV prefix tree of RAG. */
    "CREATE TABLE kbs ("
    "  id INTEGER PRIMARY KEY,"
    "  app_id INTEGER NOT NULL REFERENCES apps(id),"
    "  name TEXT NOT NULL,"
    "  passage_tokens INTEGER NOT NULL,"
    "  overlap_tokens INTEGER NOT NULL,"
    "  embedder TEXT NOT NULL,"
    "  dim INTEGER NOT NULL,"
    "  created_ms INTEGER NOT NULL,"
    "  UNIQUE (app_id, name));"
    "CREATE TABLE kb_docs ("
    "  kb_id INTEGER NOT NULL REFERENCES kbs(id) ON DELETE CASCADE,"
    "  doc TEXT NOT NULL,"
    "  metadata TEXT,"
    "  bytes INTEGER NOT NULL,"
    "  n_passages INTEGER NOT NULL,"
    "  created_ms INTEGER NOT NULL,"
    "  PRIMARY KEY (kb_id, doc));"
    "CREATE TABLE kb_passages ("
    "  id INTEGER PRIMARY KEY,"
    "  kb_id INTEGER NOT NULL,"
    "  doc TEXT NOT NULL,"
    "  seq INTEGER NOT NULL,"
    "  text TEXT NOT NULL,"
    "  vec BLOB NOT NULL," /* dim float32 little-endian */
    "  FOREIGN KEY (kb_id, doc) REFERENCES kb_docs(kb_id, doc) ON DELETE CASCADE);"
    "CREATE INDEX kb_passages_by_doc ON kb_passages (kb_id, doc);"
    "CREATE TABLE qa_bank ("
    "  id INTEGER PRIMARY KEY,"
    "  kb_id INTEGER NOT NULL REFERENCES kbs(id) ON DELETE CASCADE,"
    "  question TEXT NOT NULL,"
    "  vec BLOB NOT NULL,"
    "  answer TEXT NOT NULL,"
    "  passages BLOB NOT NULL," /* int64 little-endian each */
    "  created_ms INTEGER NOT NULL);"
    "CREATE INDEX qa_by_kb ON qa_bank (kb_id);"
    "CREATE TABLE qkv_nodes ("
    "  key INTEGER PRIMARY KEY,"
    "  parent INTEGER NOT NULL,"
    "  n_tokens INTEGER NOT NULL,"
    "  raw_bytes INTEGER NOT NULL,"
    "  crc INTEGER NOT NULL,"
    "  blob BLOB NOT NULL,"
    "  uses INTEGER NOT NULL,"
    "  last_used_ms INTEGER NOT NULL);"
    "CREATE INDEX qkv_by_parent ON qkv_nodes (parent);",

    /* Vector indexes (storage/ivf.h): per app and name, the centroids, and each list's
     * ids (int64 little-endian each) and vectors (dim float32 little-endian each) with a
     * CRC-32C of the two. */
    "CREATE TABLE ivf_indexes ("
    "  id INTEGER PRIMARY KEY,"
    "  app_id INTEGER NOT NULL REFERENCES apps(id),"
    "  name TEXT NOT NULL,"
    "  dim INTEGER NOT NULL,"
    "  nlist INTEGER NOT NULL,"
    "  centroids BLOB NOT NULL," /* (nlist, dim) float32 */
    "  UNIQUE (app_id, name));"
    "CREATE TABLE ivf_lists ("
    "  index_id INTEGER NOT NULL REFERENCES ivf_indexes(id) ON DELETE CASCADE,"
    "  list INTEGER NOT NULL,"
    "  n INTEGER NOT NULL,"
    "  crc INTEGER NOT NULL,"
    "  ids BLOB NOT NULL,"
    "  vecs BLOB NOT NULL,"
    "  PRIMARY KEY (index_id, list));",

    /* Workflow graphs (storage/graphs.h): an app's graph definitions, each a packed
     * GraphDef. */
    "CREATE TABLE graphs ("
    "  app_id INTEGER NOT NULL REFERENCES apps(id),"
    "  name TEXT NOT NULL,"
    "  def BLOB NOT NULL,"
    "  created_ms INTEGER NOT NULL,"
    "  PRIMARY KEY (app_id, name));",

    /* PerCache's prediction: which QA entries and QKV nodes a predicted query made, so
     * that hits on them are counted */
    ("ALTER TABLE qa_bank ADD COLUMN predicted INTEGER NOT NULL DEFAULT 0;"
     "ALTER TABLE qkv_nodes ADD COLUMN predicted INTEGER NOT NULL DEFAULT 0;"),

    /* The context memory's attention statistics of a context's tokens (opaque bytes,
     * store_context_set_stats), kept with the context so that densities survive a
     * restart exactly */
    "ALTER TABLE contexts ADD COLUMN stats BLOB;",

    /* Every RAG cache entry belongs to an owner (storage/kb.h, store_owner). A QKV node
     * is keyed by a 32-byte BLAKE2b of (model, owner, token prefix) and keeps its owner
     * and prefix, which a read compares with the request's. The nodes from before were
     * keyed by a 64-bit hash with no owner: nobody can say whose KV they hold, so they
     * go. A QA entry's owner is its knowledge base's app: entries whose app is known stay.
     * kbs.share_uid: the knowledge base's caches are shared by every app of its uid. */
    "DROP TABLE qkv_nodes;"
    "CREATE TABLE qkv_nodes ("
    "  key BLOB PRIMARY KEY,"
    "  parent BLOB,"          /* NULL: a root */
    "  uid INTEGER NOT NULL,"
    "  scope TEXT NOT NULL,"  /* the app's name, or '*': every app of the uid */
    "  tokens BLOB NOT NULL," /* the whole prefix, int32 little-endian each */
    "  n_tokens INTEGER NOT NULL,"
    "  raw_bytes INTEGER NOT NULL,"
    "  crc INTEGER NOT NULL,"
    "  blob BLOB NOT NULL,"
    "  uses INTEGER NOT NULL,"
    "  last_used_ms INTEGER NOT NULL,"
    "  predicted INTEGER NOT NULL DEFAULT 0);"
    "CREATE INDEX qkv_by_parent ON qkv_nodes (parent);"
    "CREATE INDEX qkv_by_owner ON qkv_nodes (uid, scope);"
    "DELETE FROM qa_bank WHERE kb_id NOT IN (SELECT k.id FROM kbs k JOIN apps a"
    " ON a.id = k.app_id);"
    "ALTER TABLE kbs ADD COLUMN share_uid INTEGER NOT NULL DEFAULT 0;",

    /* Compact knowledge bases (storage/kb.h): a document's text once (each passage keeps
     * its head, the bytes up to the next passage's start, and its length), int8 vectors
     * with a float scale, contentless FTS5 tables; a document is staged (state 1) until
     * published (0) and retired (2) until its rows are deleted. Passages name their
     * document by row. The passages are converted by store_kb_migrate_11 (C: heads from
     * the overlaps, vectors quantized, FTS tables rebuilt) between this and the tail
     * below; the stored IVF indexes (float32 lists, derived data) go, to be rebuilt. */
    "CREATE TABLE kb_docs_v11 ("
    "  id INTEGER PRIMARY KEY,"
    "  kb_id INTEGER NOT NULL REFERENCES kbs(id) ON DELETE CASCADE,"
    "  doc TEXT NOT NULL,"
    "  metadata TEXT,"
    "  bytes INTEGER NOT NULL,"
    "  n_passages INTEGER NOT NULL,"
    "  created_ms INTEGER NOT NULL,"
    "  state INTEGER NOT NULL DEFAULT 0);"
    "CREATE TABLE kb_passages_v11 ("
    "  id INTEGER PRIMARY KEY,"
    "  doc_id INTEGER NOT NULL REFERENCES kb_docs_v11(id) ON DELETE CASCADE,"
    "  seq INTEGER NOT NULL,"
    "  head TEXT NOT NULL,"
    "  len INTEGER NOT NULL,"
    "  vec BLOB NOT NULL);" /* dim int8, then a float32 scale */
    "INSERT INTO kb_docs_v11 (kb_id, doc, metadata, bytes, n_passages, created_ms)"
    " SELECT kb_id, doc, metadata, bytes, n_passages, created_ms FROM kb_docs;"
    "DELETE FROM ivf_indexes;",

    /* Compact vector indexes (storage/ivf.h): a stored IVF list keeps its ids only
     * (varints of their differences), its vectors being the passages'. The stored IVF
     * indexes (derived data) go, to be trained again. The QA bank keeps float32 vectors:
     * tau_query compares questions near a cosine of 1, where int8 rounding moves the
     * cosine of a question with itself below 0.999. */
    "DROP TABLE ivf_lists;"
    "DELETE FROM ivf_indexes;"
    "CREATE TABLE ivf_lists ("
    "  index_id INTEGER NOT NULL REFERENCES ivf_indexes(id) ON DELETE CASCADE,"
    "  list INTEGER NOT NULL,"
    "  n INTEGER NOT NULL,"
    "  crc INTEGER NOT NULL," /* CRC-32C of the ids, int64 little-endian each */
    "  ids BLOB NOT NULL,"
    "  PRIMARY KEY (index_id, list));",

    /* The registry name of the model that embeds a knowledge base (its vectors are that
     * model's, so it is kept for the knowledge base's life); '' in knowledge bases made
     * before, which use the default embed model when its file is still the embedder. */
    "ALTER TABLE kbs ADD COLUMN embed_model TEXT NOT NULL DEFAULT '';",

    /* Why a QA entry's answer stopped (the caller's code: the daemon's StopReason) and
     * its generated tokens, which a hit reports as the answer first did. Entries stored
     * before say 0 and 0: an end of turn of no tokens, what their hits reported. */
    ("ALTER TABLE qa_bank ADD COLUMN stop_reason INTEGER NOT NULL DEFAULT 0;"
     "ALTER TABLE qa_bank ADD COLUMN generated_tokens INTEGER NOT NULL DEFAULT 0;"),

    /* A checksum per turn and per context (store_internal.h, STORE_TURN_CRC and
     * STORE_CONTEXT_CRC): a byte changed on disk makes the context damaged instead of
     * silently changing its history. The rows stored before get theirs from what they
     * hold now. */
    ("ALTER TABLE turns ADD COLUMN crc INTEGER NOT NULL DEFAULT 0;"
     "ALTER TABLE contexts ADD COLUMN crc INTEGER NOT NULL DEFAULT 0;"
     STORE_SEAL_TURNS STORE_SEAL_CONTEXTS),

    /* The Responses API's stored responses (storage/responses.h): seq is the order they
     * were stored in, which a budget evicts from; crc is STORE_RESPONSE_CRC of the row. */
    "CREATE TABLE responses ("
    "  seq INTEGER PRIMARY KEY,"
    "  id TEXT NOT NULL UNIQUE,"
    "  uid INTEGER NOT NULL,"
    "  created INTEGER NOT NULL,"
    "  previous TEXT,"
    "  response BLOB NOT NULL,"
    "  items BLOB NOT NULL,"
    "  bytes INTEGER NOT NULL,"
    "  crc INTEGER NOT NULL);"
    /* a budget's sums and evictions read this, not the rows with their texts */
    "CREATE INDEX responses_by_age ON responses (seq, bytes);",
};

/* The tail of migration 11, after store_kb_migrate_11. */
static const char store_migration_11_tail[] =
    "DROP TABLE kb_passages;"
    "DROP TABLE kb_docs;"
    "ALTER TABLE kb_docs_v11 RENAME TO kb_docs;"
    "ALTER TABLE kb_passages_v11 RENAME TO kb_passages;"
    "CREATE UNIQUE INDEX kb_docs_visible ON kb_docs (kb_id, doc) WHERE state = 0;"
    "CREATE INDEX kb_docs_by_kb ON kb_docs (kb_id, state);"
    "CREATE INDEX kb_passages_by_doc ON kb_passages (doc_id, seq);";
#define STORE_SCHEMA_VERSION ((int)(sizeof store_migrations / sizeof store_migrations[0]))

/* The last column says whether the row matches its checksum. */
#define CONTEXT_COLUMNS                                                                    \
    "SELECT c.id, c.app_id, a.uid, a.name, c.system_prompt, c.params, c.created_ms,"     \
    " c.last_used_ms, c.n_tokens, c.n_turns, c.overflow, c.window_sink, c.window_dropped,"  \
    " c.window_slides, c.model, c.crc = "                                                 \
    STORE_CONTEXT_CRC("c.id", "a.uid", "a.name", "c.system_prompt", "c.params", "c.model",  \
                      "c.overflow", "c.window_sink", "c.window_dropped", "c.window_slides")  \
    " FROM contexts c JOIN apps a ON a.id = c.app_id "

enum store_stmt {
    ST_BEGIN,
    ST_COMMIT,
    ST_ROLLBACK,
    ST_APP_INSERT,
    ST_APP_SELECT,
    ST_CTX_INSERT,
    ST_CTX_DELETE,
    ST_CTX_GET,
    ST_CTX_LIST_APP,
    ST_CTX_LIST_ALL,
    ST_CTX_TURNS,
    ST_CTX_TOUCH,
    ST_CTX_WINDOW,
    ST_CTX_MODEL,
    ST_CTX_STATS_PUT,
    ST_CTX_STATS_GET,
    ST_TURN_INSERT,
    ST_TURN_SELECT,
    ST_SETTING_PUT,
    ST_SETTING_GET,
    ST_COUNT
};

static const char *const store_sql[ST_COUNT] = {
    [ST_BEGIN] = "BEGIN IMMEDIATE",
    [ST_COMMIT] = "COMMIT",
    [ST_ROLLBACK] = "ROLLBACK",
    [ST_APP_INSERT] = "INSERT OR IGNORE INTO apps (uid, name, created_ms) VALUES (?, ?, ?)",
    [ST_APP_SELECT] = "SELECT id FROM apps WHERE uid = ? AND name = ?",
    [ST_CTX_INSERT] = "INSERT INTO contexts (id, app_id, system_prompt, params, created_ms,"
                      " last_used_ms, crc) VALUES (?1, ?2, ?3, ?4, ?5, ?6, "
                      STORE_CONTEXT_CRC("?1", STORE_APP_UID("?2"), STORE_APP_NAME("?2"), "?3",
                                        "?4", "NULL", "0", "0", "0", "0") ")",
    [ST_CTX_DELETE] = "DELETE FROM contexts WHERE id = ?",
    [ST_CTX_GET] = CONTEXT_COLUMNS "WHERE c.id = ?",
    [ST_CTX_LIST_APP] = CONTEXT_COLUMNS "WHERE c.app_id = ? ORDER BY c.created_ms, c.rowid",
    [ST_CTX_LIST_ALL] = CONTEXT_COLUMNS "ORDER BY c.created_ms, c.rowid",
    [ST_CTX_TURNS] = "SELECT n_turns, n_tokens FROM contexts WHERE id = ?",
    [ST_CTX_TOUCH] = "UPDATE contexts SET n_tokens = n_tokens + ?, n_turns = n_turns + ?,"
                     " last_used_ms = ? WHERE id = ?",
    [ST_CTX_WINDOW] = "UPDATE contexts SET overflow = ?1, window_sink = ?2, window_dropped = ?3,"
                      " window_slides = ?4, crc = "
                      STORE_CONTEXT_CRC("id", STORE_APP_UID("contexts.app_id"),
                                        STORE_APP_NAME("contexts.app_id"), "system_prompt",
                                        "params", "model", "?1", "?2", "?3", "?4")
                      " WHERE id = ?5",
    [ST_CTX_MODEL] = "UPDATE contexts SET model = ?1, crc = "
                     STORE_CONTEXT_CRC("id", STORE_APP_UID("contexts.app_id"),
                                       STORE_APP_NAME("contexts.app_id"), "system_prompt",
                                       "params", "?1", "overflow", "window_sink",
                                       "window_dropped", "window_slides")
                     " WHERE id = ?2",
    [ST_CTX_STATS_PUT] = "UPDATE contexts SET stats = ? WHERE id = ?",
    [ST_CTX_STATS_GET] = "SELECT stats FROM contexts WHERE id = ?",
    [ST_TURN_INSERT] = "INSERT INTO turns (context_id, seq, role, text, tokens, crc)"
                       " VALUES (?1, ?2, ?3, ?4, ?5, "
                       STORE_TURN_CRC("?1", "?2", "?3", "?4", "?5") ")",
    /* the last column: whether the row matches its checksum */
    [ST_TURN_SELECT] = "SELECT seq, role, text, tokens, crc = "
                       STORE_TURN_CRC("context_id", "seq", "role", "text", "tokens")
                       " FROM turns WHERE context_id = ? ORDER BY seq",
    [ST_SETTING_PUT] = "INSERT OR REPLACE INTO settings (key, vals) VALUES (?, ?)",
    [ST_SETTING_GET] = "SELECT vals FROM settings WHERE key = ?",
};

struct store {
    sqlite3 *db;
    int lock_fd;       /* <dir>/llmsd.lock, flock()ed while the store is open */
    char *dir;
    char *path;
    store_chunks *chunks;
    sqlite3_stmt *st[ST_COUNT];
    uint8_t *blob;     /* scratch for encoding tokens: (blob_cap) bytes */
    size_t blob_cap;
    int32_t *tokens;   /* scratch for decoding tokens: (tokens_cap) ids */
    size_t tokens_cap;
    store_checkpointer *ckpt;
};

/* Creates dir and its missing parents with mode 0750. */
static int make_dirs(const char *dir, char *err)
{
    char path[PATH_MAX];
    size_t n = strlen(dir);
    if (n >= sizeof path)
        return err_set(err, "store: state directory path too long");
    memcpy(path, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (path[i] != '/' && path[i] != '\0')
            continue;
        char c = path[i];
        path[i] = '\0';
        if (mkdir(path, 0750) != 0 && errno != EEXIST)
            return err_set(err, "store: creating directory %s: %s", path, strerror(errno));
        path[i] = c;
    }
    struct stat st;
    if (stat(dir, &st) != 0)
        return err_set(err, "store: %s: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return err_set(err, "store: %s is not a directory", dir);
    return 0;
}

/* Runs SQL that returns no rows (or whose rows do not matter). */
static int exec(store *s, const char *sql, const char *what, char *err)
{
    char *msg = NULL;
    if (sqlite3_exec(s->db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        err_set(err, "store: %s: %s: %s", s->path, what, msg ? msg : sqlite3_errmsg(s->db));
        sqlite3_free(msg);
        return -1;
    }
    return 0;
}

/* Runs a pragma (or any one-row query) and returns its first column as an integer
 * or, when text is given, copies it as text. */
static int query_one(store *s, const char *sql, int64_t *num, char *text, size_t text_cap,
                     char *err)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(s->db, sql, -1, &st, NULL) != SQLITE_OK)
        return err_set(err, "store: %s: %s: %s", s->path, sql, sqlite3_errmsg(s->db));
    int rc = sqlite3_step(st);
    if (rc != SQLITE_ROW) {
        err_set(err, "store: %s: %s: %s", s->path, sql,
                rc == SQLITE_DONE ? "no result" : sqlite3_errmsg(s->db));
        sqlite3_finalize(st);
        return -1;
    }
    if (num)
        *num = sqlite3_column_int64(st, 0);
    if (text) {
        const unsigned char *t = sqlite3_column_text(st, 0);
        snprintf(text, text_cap, "%s", t ? (const char *)t : "");
    }
    sqlite3_finalize(st);
    return 0;
}

static int migrate(store *s, char *err)
{
    int64_t version;
    if (query_one(s, "PRAGMA user_version", &version, NULL, 0, err) != 0)
        return -1;
    if (version < 0 || version > STORE_SCHEMA_VERSION)
        return err_set(err, "store: %s: schema version %lld is not one this llmsd knows "
                       "(0..%d)", s->path, (long long)version, STORE_SCHEMA_VERSION);
    for (int v = (int)version; v < STORE_SCHEMA_VERSION; v++) {
        char bump[64], what[64];
        snprintf(bump, sizeof bump, "PRAGMA user_version = %d", v + 1);
        snprintf(what, sizeof what, "migrating schema to version %d", v + 1);
        if (exec(s, "BEGIN IMMEDIATE", what, err) != 0)
            return -1;
        if (exec(s, store_migrations[v], what, err) != 0 ||
            (v + 1 == 11 && (store_kb_migrate_11(s, err) != 0 ||
                             exec(s, store_migration_11_tail, what, err) != 0)) ||
            exec(s, bump, what, err) != 0 || exec(s, "COMMIT", what, err) != 0) {
            sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
            return -1;
        }
    }
    /* a conversion leaves the old tables' pages free: the file shrinks at once */
    if (version < 12 && version > 0 &&
        exec(s, "PRAGMA incremental_vacuum", "vacuum after migrating", err) != 0)
        return -1;
    return 0;
}

static int configure(store *s, char *err)
{
    char mode[16];
    int64_t on;
    /* The first read of the file happens here, so a non-database fails on this line. */
    if (query_one(s, "PRAGMA journal_mode = WAL", NULL, mode, sizeof mode, err) != 0)
        return -1;
    if (strcmp(mode, "wal") != 0)
        return err_set(err, "store: %s: cannot use WAL journal mode (got '%s')", s->path, mode);
    if (exec(s, "PRAGMA synchronous = FULL", "setting synchronous", err) != 0 ||
        exec(s, "PRAGMA foreign_keys = ON", "enabling foreign keys", err) != 0)
        return -1;
    if (query_one(s, "PRAGMA foreign_keys", &on, NULL, 0, err) != 0)
        return -1;
    if (on != 1)
        return err_set(err, "store: sqlite3 was built without foreign key support");
    if (sqlite3_busy_timeout(s->db, STORE_BUSY_TIMEOUT_MS) != SQLITE_OK)
        return store_db_err(s, err, "setting busy timeout");
    char limit[64];
    snprintf(limit, sizeof limit, "PRAGMA journal_size_limit = %d", STORE_WAL_LIMIT_BYTES);
    if (exec(s, limit, "limiting the log's size", err) != 0)
        return -1;
    /* Incremental auto-vacuum lets deleted rows' pages leave the file (store_reclaim)
     * without rewriting the whole database. A new file takes the setting as is; one
     * made before it is converted by one VACUUM. */
    int64_t av;
    if (exec(s, "PRAGMA auto_vacuum = INCREMENTAL", "setting auto_vacuum", err) != 0 ||
        query_one(s, "PRAGMA auto_vacuum", &av, NULL, 0, err) != 0)
        return -1;
    if (av != 2 && exec(s, "VACUUM", "converting to incremental auto_vacuum", err) != 0)
        return -1;
    return 0;
}

/* Copies the whole log into the file and cuts it to nothing, the checkpoint thread held
 * off meanwhile. */
static int checkpoint_truncate(store *s, char *err)
{
    store_checkpointer_hold(s->ckpt);
    int rc = exec(s, "PRAGMA wal_checkpoint(TRUNCATE)", "checkpoint", err);
    store_checkpointer_release(s->ckpt);
    return rc;
}

/* Gives the pages of deleted rows back to the file system once they pass
 * STORE_VACUUM_BYTES, and cuts the log back: a client that creates and deletes large
 * contexts must not grow the state directory for good. */
static int store_reclaim(store *s, char *err)
{
    int64_t free_pages, page_size;
    if (query_one(s, "PRAGMA freelist_count", &free_pages, NULL, 0, err) != 0 ||
        query_one(s, "PRAGMA page_size", &page_size, NULL, 0, err) != 0)
        return -1;
    if (free_pages * page_size < STORE_VACUUM_BYTES)
        return 0;
    return exec(s, "PRAGMA incremental_vacuum", "vacuum", err) ||
                   checkpoint_truncate(s, err)
               ? -1
               : 0;
}

int store_vacuum_step(store *s, int max_pages, bool *done, char err[ERR_MAX])
{
    int64_t free_pages, page_size;
    *done = false;
    if (query_one(s, "PRAGMA freelist_count", &free_pages, NULL, 0, err) != 0 ||
        query_one(s, "PRAGMA page_size", &page_size, NULL, 0, err) != 0)
        return -1;
    if (free_pages * page_size >= STORE_VACUUM_BYTES) {
        char sql[64];
        snprintf(sql, sizeof sql, "PRAGMA incremental_vacuum(%d)", max_pages < 1 ? 1 : max_pages);
        if (exec(s, sql, "vacuum", err) != 0)
            return -1;
        if (free_pages > max_pages)
            return 0;
    }
    /* the file itself shrinks when the log's moves are checkpointed */
    *done = true;
    return checkpoint_truncate(s, err);
}

store *store_open(const char *dir, char err[ERR_MAX])
{
    if (!dir || !dir[0]) {
        err_set(err, "store: no state directory given");
        return NULL;
    }
    if (make_dirs(dir, err) != 0)
        return NULL;
    store *s = calloc(1, sizeof *s);
    if (!s || !(s->dir = strdup(dir)) || asprintf(&s->path, "%s/%s", dir, STORE_FILE) < 0) {
        if (s)
            free(s->dir);
        free(s);
        err_set(err, "store: out of memory");
        return NULL;
    }
    /* Two daemons on one state directory would each trust their own view of it (one
     * deletes a context the other appends to): the second is refused. The lock goes
     * with the process, so a crash never leaves it held. */
    char *lock_path = NULL;
    s->lock_fd = asprintf(&lock_path, "%s/%s", dir, STORE_LOCK_FILE) < 0
                     ? -1
                     : open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0640);
    if (s->lock_fd < 0 || flock(s->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        if (!lock_path)
            err_set(err, "store: out of memory");
        else if (s->lock_fd >= 0 && errno == EWOULDBLOCK)
            err_set(err, "store: %s is in use by another llmsd (%s is locked)", dir, lock_path);
        else
            err_set(err, "store: %s: %s", lock_path, strerror(errno));
        if (s->lock_fd >= 0)
            close(s->lock_fd);
        free(lock_path);
        free(s->path);
        free(s->dir);
        free(s);
        return NULL;
    }
    free(lock_path);
    /* Create the file ourselves so conversations are not world-readable whatever the
     * umask; sqlite gives its -wal and -shm files the database file's mode. */
    int fd = open(s->path, O_RDWR | O_CREAT | O_CLOEXEC, 0640);
    if (fd < 0) {
        err_set(err, "store: %s: %s", s->path, strerror(errno));
        free(s->path);
        free(s->dir);
        free(s);
        return NULL;
    }
    close(fd);
    int rc = sqlite3_open_v2(s->path, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX,
                             NULL);
    if (rc != SQLITE_OK) {
        err_set(err, "store: opening %s: %s", s->path,
                s->db ? sqlite3_errmsg(s->db) : sqlite3_errstr(rc));
        store_close(s);
        return NULL;
    }
    sqlite3_extended_result_codes(s->db, 1);
    if (store_sql_functions(s->db) != SQLITE_OK) {
        err_set(err, "store: %s: registering its functions: %s", s->path, sqlite3_errmsg(s->db));
        store_close(s);
        return NULL;
    }
    if (configure(s, err) != 0 || migrate(s, err) != 0) {
        store_close(s);
        return NULL;
    }
    for (int i = 0; i < ST_COUNT; i++) {
        if (sqlite3_prepare_v3(s->db, store_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &s->st[i],
                               NULL) != SQLITE_OK) {
            err_set(err, "store: %s: preparing '%s': %s", s->path, store_sql[i],
                    sqlite3_errmsg(s->db));
            store_close(s);
            return NULL;
        }
    }
    if (!(s->ckpt = store_checkpointer_start(s->db, s->path, err))) {
        store_close(s);
        return NULL;
    }
    return s;
}

void store_close(store *s)
{
    if (!s)
        return;
    store_checkpointer_stop(s->ckpt, s->db);
    store_chunks_free(s->chunks);
    for (int i = 0; i < ST_COUNT; i++)
        sqlite3_finalize(s->st[i]);
    /* close_v2 cannot fail with BUSY: every statement is finalized above. */
    sqlite3_close_v2(s->db);
    close(s->lock_fd);
    free(s->blob);
    free(s->tokens);
    free(s->path);
    free(s->dir);
    free(s);
}

store_checkpointer *store_checkpointer_of(store *s)
{
    return s->ckpt;
}

const char *store_dir(const store *s)
{
    return s->dir;
}

int store_schema_version(void)
{
    return STORE_SCHEMA_VERSION;
}

sqlite3 *store_sqlite(store *s)
{
    return s->db;
}

store_chunks **store_chunks_slot(store *s)
{
    return &s->chunks;
}

/* A prepared statement, reset and unbound, ready for new bindings. */
static sqlite3_stmt *stmt(store *s, enum store_stmt which)
{
    sqlite3_stmt *st = s->st[which];
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    return st;
}

/* Steps a statement that returns no rows. */
static int run(store *s, sqlite3_stmt *st, const char *what, char *err)
{
    int rc = sqlite3_step(st);
    if (rc != SQLITE_DONE) {
        store_db_err(s, err, what);
        sqlite3_reset(st);
        return -1;
    }
    sqlite3_reset(st);
    return 0;
}

static int bind_text(sqlite3_stmt *st, int i, const char *v)
{
    return v ? sqlite3_bind_text(st, i, v, -1, SQLITE_STATIC) : sqlite3_bind_null(st, i);
}

int store_app_id(store *s, uint32_t uid, const char *name, int64_t *app_id, char err[ERR_MAX])
{
    if (!name || !name[0])
        return err_set(err, "store: app id: empty app name");
    sqlite3_stmt *ins = stmt(s, ST_APP_INSERT);
    if (sqlite3_bind_int64(ins, 1, uid) != SQLITE_OK || bind_text(ins, 2, name) != SQLITE_OK ||
        sqlite3_bind_int64(ins, 3, clock_wall_ms()) != SQLITE_OK)
        return store_db_err(s, err, "app id: binding");
    if (run(s, ins, "app id: inserting", err) != 0)
        return -1;
    sqlite3_stmt *sel = stmt(s, ST_APP_SELECT);
    if (sqlite3_bind_int64(sel, 1, uid) != SQLITE_OK || bind_text(sel, 2, name) != SQLITE_OK)
        return store_db_err(s, err, "app id: binding");
    int rc = sqlite3_step(sel);
    if (rc != SQLITE_ROW) {
        if (rc == SQLITE_DONE)
            err_set(err, "store: app id: app (%u, '%s') missing after insert", uid, name);
        else
            store_db_err(s, err, "app id: selecting");
        sqlite3_reset(sel);
        return -1;
    }
    *app_id = sqlite3_column_int64(sel, 0);
    sqlite3_reset(sel);
    return 0;
}

int store_context_create(store *s, const char *id, int64_t app_id, const char *system_prompt,
                         const void *params, size_t params_len, int64_t now_ms,
                         char err[ERR_MAX])
{
    if (!id || !id[0])
        return err_set(err, "store: create context: empty context id");
    if (app_id < 0)
        return err_set(err, "store: create context '%s': negative app id", id);
    if (!params && params_len > 0)
        return err_set(err, "store: create context '%s': params length without params", id);
    sqlite3_stmt *st = stmt(s, ST_CTX_INSERT);
    if (sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC) != SQLITE_OK ||
        sqlite3_bind_int64(st, 2, app_id) != SQLITE_OK ||
        bind_text(st, 3, system_prompt) != SQLITE_OK ||
        (params ? sqlite3_bind_blob64(st, 4, params, params_len, SQLITE_STATIC)
                : sqlite3_bind_null(st, 4)) != SQLITE_OK ||
        sqlite3_bind_int64(st, 5, now_ms) != SQLITE_OK ||
        sqlite3_bind_int64(st, 6, now_ms) != SQLITE_OK)
        return store_db_err(s, err, "create context: binding");
    char what[96];
    snprintf(what, sizeof what, "create context '%.40s'", id);
    return run(s, st, what, err);
}

int store_context_delete(store *s, const char *id, bool *found, char err[ERR_MAX])
{
    *found = false;
    if (!id || !id[0])
        return err_set(err, "store: delete context: empty context id");
    sqlite3_stmt *st = stmt(s, ST_CTX_DELETE);
    if (sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC) != SQLITE_OK)
        return store_db_err(s, err, "delete context: binding");
    char what[96];
    snprintf(what, sizeof what, "delete context '%.40s'", id);
    if (run(s, st, what, err) != 0)
        return -1;
    *found = sqlite3_changes(s->db) > 0;
    if (!*found)
        return 0;
    /* The chunk rows went with the context (ON DELETE CASCADE); their files follow. */
    store_chunks_remove_context(s, id);
    /* The delete is committed: a give-back that fails (a full disk) must not report it
     * failed, or the daemon would keep a context the store no longer has. The free
     * pages stay for new rows, and the next delete gives them back. */
    char ignored[ERR_MAX];
    store_reclaim(s, ignored);
    return 0;
}

/* Walks the rows of a context query, calling fn on each; *n gets the row count. */
static int walk_contexts(store *s, sqlite3_stmt *st, int (*fn)(void *, const store_context *),
                         void *arg, int *n, const char *what, char *err)
{
    int rc;
    *n = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        store_context c = {
            .id = (const char *)sqlite3_column_text(st, 0),
            .app_id = sqlite3_column_int64(st, 1),
            .uid = (uint32_t)sqlite3_column_int64(st, 2),
            .app_name = (const char *)sqlite3_column_text(st, 3),
            .system_prompt = (const char *)sqlite3_column_text(st, 4),
            .params = sqlite3_column_blob(st, 5),
            .params_len = (size_t)sqlite3_column_bytes(st, 5),
            .created_ms = sqlite3_column_int64(st, 6),
            .last_used_ms = sqlite3_column_int64(st, 7),
            .n_tokens = sqlite3_column_int64(st, 8),
            .n_turns = sqlite3_column_int64(st, 9),
            .window = {.overflow = sqlite3_column_int(st, 10),
                       .sink = sqlite3_column_int64(st, 11),
                       .dropped = sqlite3_column_int64(st, 12),
                       .slides = sqlite3_column_int64(st, 13)},
            .model = (const char *)sqlite3_column_text(st, 14),
            .damage = sqlite3_column_int(st, 15) ? NULL
                                                 : "its catalog row does not match its checksum",
        };
        /* The schema forbids these NULLs, so they mean corruption or no memory. */
        if (!c.id || !c.app_name ||
            (!c.system_prompt && sqlite3_column_type(st, 4) != SQLITE_NULL)) {
            err_set(err, "store: %s: unreadable context row", what);
            sqlite3_reset(st);
            return -1;
        }
        if (!c.params)
            c.params_len = 0;
        (*n)++;
        int stop = fn ? fn(arg, &c) : 0;
        if (stop) {
            sqlite3_reset(st);
            return stop;
        }
    }
    if (rc != SQLITE_DONE) {
        store_db_err(s, err, what);
        sqlite3_reset(st);
        return -1;
    }
    sqlite3_reset(st);
    return 0;
}

int store_context_list(store *s, int64_t app_id,
                       int (*fn)(void *arg, const store_context *c), void *arg,
                       char err[ERR_MAX])
{
    sqlite3_stmt *st;
    if (app_id >= 0) {
        st = stmt(s, ST_CTX_LIST_APP);
        if (sqlite3_bind_int64(st, 1, app_id) != SQLITE_OK)
            return store_db_err(s, err, "list contexts: binding");
    } else if (app_id == -1) {
        st = stmt(s, ST_CTX_LIST_ALL);
    } else {
        return err_set(err, "store: list contexts: app id %lld is neither an app nor -1",
                       (long long)app_id);
    }
    int n;
    return walk_contexts(s, st, fn, arg, &n, "list contexts", err);
}

int store_context_get(store *s, const char *id,
                      int (*fn)(void *arg, const store_context *c), void *arg, bool *found,
                      char err[ERR_MAX])
{
    *found = false;
    if (!id || !id[0])
        return err_set(err, "store: get context: empty context id");
    sqlite3_stmt *st = stmt(s, ST_CTX_GET);
    if (sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC) != SQLITE_OK)
        return store_db_err(s, err, "get context: binding");
    int n;
    int rc = walk_contexts(s, st, fn, arg, &n, "get context", err);
    *found = n > 0;
    return rc;
}

/* Encodes tokens as int32 little-endian into the store's scratch buffer. */
static int encode_tokens(store *s, const int32_t *tokens, int n, char *err)
{
    size_t bytes = (size_t)n * 4;
    if (bytes > s->blob_cap) {
        uint8_t *b = realloc(s->blob, bytes);
        if (!b)
            return err_set(err, "store: out of memory for %d tokens", n);
        s->blob = b;
        s->blob_cap = bytes;
    }
    for (int i = 0; i < n; i++) {
        uint32_t v = (uint32_t)tokens[i];
        s->blob[4 * i] = (uint8_t)v;
        s->blob[4 * i + 1] = (uint8_t)(v >> 8);
        s->blob[4 * i + 2] = (uint8_t)(v >> 16);
        s->blob[4 * i + 3] = (uint8_t)(v >> 24);
    }
    return 0;
}

static bool valid_role(const char *role)
{
    return role && (strcmp(role, "system") == 0 || strcmp(role, "user") == 0 ||
                    strcmp(role, "assistant") == 0 || strcmp(role, "raw") == 0);
}

/* The body of store_context_append, inside its transaction. */
static int append_turns(store *s, const char *id, const store_turn *turns, int n_turns,
                        int64_t now_ms, char *err)
{
    sqlite3_stmt *st = stmt(s, ST_CTX_TURNS);
    if (sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC) != SQLITE_OK)
        return store_db_err(s, err, "append: binding");
    int rc = sqlite3_step(st);
    if (rc == SQLITE_DONE) {
        sqlite3_reset(st);
        return err_set(err, "store: append: no context '%.40s'", id);
    }
    if (rc != SQLITE_ROW) {
        store_db_err(s, err, "append: looking up context");
        sqlite3_reset(st);
        return -1;
    }
    int64_t seq = sqlite3_column_int64(st, 0);
    sqlite3_reset(st);

    int64_t added = 0;
    for (int i = 0; i < n_turns; i++) {
        const store_turn *t = &turns[i];
        if (encode_tokens(s, t->tokens, t->n_tokens, err) != 0)
            return -1;
        st = stmt(s, ST_TURN_INSERT);
        if (sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC) != SQLITE_OK ||
            sqlite3_bind_int64(st, 2, seq + i) != SQLITE_OK ||
            sqlite3_bind_text(st, 3, t->role, -1, SQLITE_STATIC) != SQLITE_OK ||
            sqlite3_bind_text(st, 4, t->text, -1, SQLITE_STATIC) != SQLITE_OK ||
            sqlite3_bind_blob64(st, 5, t->n_tokens ? (const void *)s->blob : "",
                                (sqlite3_uint64)t->n_tokens * 4, SQLITE_STATIC) != SQLITE_OK)
            return store_db_err(s, err, "append: binding turn");
        char what[96];
        snprintf(what, sizeof what, "append turn %lld to context '%.40s'",
                 (long long)(seq + i), id);
        if (run(s, st, what, err) != 0)
            return -1;
        added += t->n_tokens;
    }

    st = stmt(s, ST_CTX_TOUCH);
    if (sqlite3_bind_int64(st, 1, added) != SQLITE_OK ||
        sqlite3_bind_int64(st, 2, n_turns) != SQLITE_OK ||
        sqlite3_bind_int64(st, 3, now_ms) != SQLITE_OK ||
        sqlite3_bind_text(st, 4, id, -1, SQLITE_STATIC) != SQLITE_OK)
        return store_db_err(s, err, "append: binding context update");
    return run(s, st, "append: updating context", err);
}

/* Sets a context's window columns; "no context" when id is unknown. */
static int set_window(store *s, const char *id, const store_window *w, char *err)
{
    sqlite3_stmt *st = stmt(s, ST_CTX_WINDOW);
    if (sqlite3_bind_int(st, 1, w->overflow) != SQLITE_OK ||
        sqlite3_bind_int64(st, 2, w->sink) != SQLITE_OK ||
        sqlite3_bind_int64(st, 3, w->dropped) != SQLITE_OK ||
        sqlite3_bind_int64(st, 4, w->slides) != SQLITE_OK ||
        sqlite3_bind_text(st, 5, id, -1, SQLITE_STATIC) != SQLITE_OK)
        return store_db_err(s, err, "window: binding");
    if (run(s, st, "window: updating context", err) != 0)
        return -1;
    if (sqlite3_changes(s->db) == 0)
        return err_set(err, "store: window: no context '%.40s'", id);
    return 0;
}

int store_context_set_model(store *s, const char *id, const char *model, char err[ERR_MAX])
{
    if (!id || !id[0] || !model || !model[0])
        return err_set(err, "store: model: empty context id or model name");
    sqlite3_stmt *st = stmt(s, ST_CTX_MODEL);
    if (sqlite3_bind_text(st, 1, model, -1, SQLITE_STATIC) != SQLITE_OK ||
        sqlite3_bind_text(st, 2, id, -1, SQLITE_STATIC) != SQLITE_OK)
        return store_db_err(s, err, "model: binding");
    if (run(s, st, "model: updating context", err) != 0)
        return -1;
    if (sqlite3_changes(s->db) == 0)
        return err_set(err, "store: model: no context '%.40s'", id);
    return 0;
}

int store_context_set_stats(store *s, const char *id, const void *bytes, size_t n,
                            char err[ERR_MAX])
{
    if (!id || !id[0])
        return err_set(err, "store: stats: empty context id");
    if (n > (size_t)INT_MAX || (n && !bytes))
        return err_set(err, "store: stats of '%.40s': %zu bytes", id, n);
    sqlite3_stmt *st = stmt(s, ST_CTX_STATS_PUT);
    int rc = n ? sqlite3_bind_blob(st, 1, bytes, (int)n, SQLITE_STATIC) : sqlite3_bind_null(st, 1);
    if (rc != SQLITE_OK || sqlite3_bind_text(st, 2, id, -1, SQLITE_STATIC) != SQLITE_OK)
        return store_db_err(s, err, "stats: binding");
    if (run(s, st, "stats: updating context", err) != 0)
        return -1;
    if (sqlite3_changes(s->db) == 0)
        return err_set(err, "store: stats: no context '%.40s'", id);
    return 0;
}

int store_context_get_stats(store *s, const char *id, void **bytes, size_t *n,
                            char err[ERR_MAX])
{
    *bytes = NULL;
    *n = 0;
    if (!id || !id[0])
        return err_set(err, "store: stats: empty context id");
    sqlite3_stmt *st = stmt(s, ST_CTX_STATS_GET);
    if (sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC) != SQLITE_OK)
        return store_db_err(s, err, "stats: binding");
    int rc = sqlite3_step(st);
    if (rc == SQLITE_DONE) {
        sqlite3_reset(st);
        return err_set(err, "store: stats: no context '%.40s'", id);
    }
    if (rc != SQLITE_ROW) {
        store_db_err(s, err, "stats: reading context");
        sqlite3_reset(st);
        return -1;
    }
    int len = sqlite3_column_bytes(st, 0);
    const void *blob = sqlite3_column_blob(st, 0);
    if (len > 0 && blob) {
        *bytes = malloc((size_t)len);
        if (!*bytes) {
            sqlite3_reset(st);
            return err_set(err, "store: stats of '%.40s': out of memory", id);
        }
        memcpy(*bytes, blob, (size_t)len);
        *n = (size_t)len;
    }
    sqlite3_reset(st);
    return 0;
}

static bool valid_window(const store_window *w)
{
    return w->sink >= 0 && w->dropped >= 0 && w->slides >= 0;
}

int store_context_set_window(store *s, const char *id, const store_window *w,
                             char err[ERR_MAX])
{
    if (!id || !id[0])
        return err_set(err, "store: window: empty context id");
    if (!w || !valid_window(w))
        return err_set(err, "store: window of '%.40s': negative or missing values", id);
    return set_window(s, id, w, err);
}

int store_context_append(store *s, const char *id, const store_turn *turns, int n_turns,
                         int64_t now_ms, char err[ERR_MAX])
{
    return store_context_append_window(s, id, turns, n_turns, NULL, -1, now_ms, err);
}

int store_context_append_window(store *s, const char *id, const store_turn *turns,
                                int n_turns, const store_window *w, int drop_chunks_from,
                                int64_t now_ms, char err[ERR_MAX])
{
    if (!id || !id[0])
        return err_set(err, "store: append: empty context id");
    if (n_turns < 0 || (n_turns > 0 && !turns))
        return err_set(err, "store: append to '%.40s': %d turns", id, n_turns);
    for (int i = 0; i < n_turns; i++) {
        const store_turn *t = &turns[i];
        if (!valid_role(t->role))
            return err_set(err, "store: append to '%.40s': turn %d: role '%s' is not system, "
                           "user, assistant or raw", id, i, t->role ? t->role : "(null)");
        if (!t->text)
            return err_set(err, "store: append to '%.40s': turn %d has no text", id, i);
        if (t->n_tokens < 0 || (t->n_tokens > 0 && !t->tokens) || t->n_tokens > INT_MAX / 4)
            return err_set(err, "store: append to '%.40s': turn %d: bad token count %d", id, i,
                           t->n_tokens);
    }

    if (w && !valid_window(w))
        return err_set(err, "store: append to '%.40s': negative window values", id);
    int64_t *files = NULL;
    int n_files = 0;
    if (run(s, stmt(s, ST_BEGIN), "append: begin", err) != 0)
        return -1;
    if (append_turns(s, id, turns, n_turns, now_ms, err) != 0 ||
        (w && set_window(s, id, w, err) != 0) ||
        (drop_chunks_from >= 0 &&
         store_chunk_rows_delete_from(s, id, drop_chunks_from, &files, &n_files, err) != 0)) {
        free(files);
        /* ROLLBACK may report that sqlite already rolled back (e.g. after a full disk);
         * the first error is the one worth reporting. */
        sqlite3_step(stmt(s, ST_ROLLBACK));
        sqlite3_reset(s->st[ST_ROLLBACK]);
        return -1;
    }
    if (run(s, stmt(s, ST_COMMIT), "append: commit", err) != 0) {
        free(files);
        sqlite3_step(stmt(s, ST_ROLLBACK));
        sqlite3_reset(s->st[ST_ROLLBACK]);
        return -1;
    }
    /* The rows are gone with the commit; a file left behind is removed by the gc. */
    store_chunk_files_remove(s, id, files, n_files, NULL);
    free(files);
    return 0;
}

/* Decodes a tokens blob into the store's scratch buffer. */
static int decode_tokens(store *s, const uint8_t *b, size_t bytes, int *n, char *err)
{
    size_t count = bytes / 4;
    if (count > s->tokens_cap) {
        int32_t *t = realloc(s->tokens, count * sizeof *t);
        if (!t)
            return err_set(err, "store: out of memory for %zu tokens", count);
        s->tokens = t;
        s->tokens_cap = count;
    }
    for (size_t i = 0; i < count; i++)
        s->tokens[i] = (int32_t)((uint32_t)b[4 * i] | (uint32_t)b[4 * i + 1] << 8 |
                                 (uint32_t)b[4 * i + 2] << 16 | (uint32_t)b[4 * i + 3] << 24);
    *n = (int)count;
    return 0;
}

/* STORE_E_DAMAGED with "store: context '<id>' <why>" in err. */
static int damaged(char *err, const char *id, const char *why)
{
    err_set(err, "store: context '%.40s' %s", id, why);
    return STORE_E_DAMAGED;
}

int store_context_turns(store *s, const char *id,
                        int (*fn)(void *arg, const store_turn *t), void *arg,
                        char err[ERR_MAX])
{
    if (!id || !id[0])
        return err_set(err, "store: turns: empty context id");
    sqlite3_stmt *st = stmt(s, ST_TURN_SELECT);
    if (sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC) != SQLITE_OK)
        return store_db_err(s, err, "turns: binding");
    int rc;
    int64_t n_rows = 0, n_tokens = 0;
    char why[ERR_MAX];
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        int64_t seq = sqlite3_column_int64(st, 0);
        store_turn t = {
            .role = (const char *)sqlite3_column_text(st, 1),
            .text = (const char *)sqlite3_column_text(st, 2),
        };
        const uint8_t *blob = sqlite3_column_blob(st, 3);
        int bytes = sqlite3_column_bytes(st, 3);
        /* NULLs the schema forbids are damage; any other unreadable value, no memory */
        bool oom = (!t.role && sqlite3_column_type(st, 1) != SQLITE_NULL) ||
                   (!t.text && sqlite3_column_type(st, 2) != SQLITE_NULL) ||
                   (bytes > 0 && !blob);
        const char *bad = oom ? NULL
                          : !t.role ? "has no role"
                          : !t.text ? "has no text"
                          : bytes % 4 ? "has a tokens blob whose length is not a multiple of 4"
                          : seq != n_rows ? "is not the next turn"
                          : !sqlite3_column_int(st, 4)
                              ? "does not match its checksum (role, text and tokens)"
                              : NULL;
        if (oom || bad) {
            sqlite3_reset(st);
            if (oom)
                return err_set(err, "store: context '%.40s' turn %lld: out of memory", id,
                               (long long)seq);
            snprintf(why, sizeof why, "turn %lld %s (%d bytes of tokens)", (long long)seq, bad,
                     bytes);
            return damaged(err, id, why);
        }
        if (decode_tokens(s, blob, (size_t)bytes, &t.n_tokens, err) != 0) {
            sqlite3_reset(st);
            return -1;
        }
        t.tokens = s->tokens;
        n_rows++;
        n_tokens += t.n_tokens;
        int stop = fn(arg, &t);
        if (stop) {
            sqlite3_reset(st);
            return stop;
        }
    }
    if (rc != SQLITE_DONE) {
        /* a damaged page among this context's turns damages this context only */
        char msg[ERR_MAX];
        snprintf(why, sizeof why, "has a damaged page among its turns: %s",
                 store_db_message(s->db, msg, sizeof msg));
        store_db_err(s, err, "turns: reading");
        sqlite3_reset(st);
        return (rc & 0xff) == SQLITE_CORRUPT ? damaged(err, id, why) : -1;
    }
    sqlite3_reset(st);

    /* The context's counters say how many turns and tokens it has: a turn row gone
     * or one of another context's (a changed id) shows here. */
    st = stmt(s, ST_CTX_TURNS);
    if (sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC) != SQLITE_OK)
        return store_db_err(s, err, "turns: binding");
    rc = sqlite3_step(st);
    int64_t want_turns = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    int64_t want_tokens = rc == SQLITE_ROW ? sqlite3_column_int64(st, 1) : 0;
    sqlite3_reset(st);
    if (rc == SQLITE_DONE)
        return err_set(err, "store: turns: no context '%.40s'", id);
    if (rc != SQLITE_ROW)
        return store_db_err(s, err, "turns: looking up context");
    if (want_turns != n_rows || want_tokens != n_tokens) {
        snprintf(why, sizeof why, "counts %lld turns of %lld tokens, and has %lld of %lld",
                 (long long)want_turns, (long long)want_tokens, (long long)n_rows,
                 (long long)n_tokens);
        return damaged(err, id, why);
    }
    return 0;
}

#define SETTING_MAX_VALUES (1 << 20)

int store_setting_put(store *s, const char *key, const double *values, int n,
                      char err[ERR_MAX])
{
    if (!key || !key[0])
        return err_set(err, "store: put setting: empty key");
    if (n < 0 || n > SETTING_MAX_VALUES || (n > 0 && !values))
        return err_set(err, "store: put setting '%.60s': bad value count %d", key, n);
    if ((size_t)n * 8 > s->blob_cap) {
        uint8_t *b = realloc(s->blob, (size_t)n * 8);
        if (!b)
            return err_set(err, "store: out of memory for setting '%.60s'", key);
        s->blob = b;
        s->blob_cap = (size_t)n * 8;
    }
    for (int i = 0; i < n; i++) {
        uint64_t bits;
        memcpy(&bits, &values[i], 8);
        for (int b = 0; b < 8; b++)
            s->blob[8 * i + b] = (uint8_t)(bits >> (8 * b));
    }
    sqlite3_stmt *st = stmt(s, ST_SETTING_PUT);
    if (sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC) != SQLITE_OK ||
        sqlite3_bind_blob64(st, 2, n ? (const void *)s->blob : "", (sqlite3_uint64)n * 8,
                            SQLITE_STATIC) != SQLITE_OK)
        return store_db_err(s, err, "put setting: binding");
    char what[96];
    snprintf(what, sizeof what, "put setting '%.60s'", key);
    return run(s, st, what, err);
}

int store_setting_get(store *s, const char *key, double *values, int max, int *n,
                      bool *found, char err[ERR_MAX])
{
    *found = false;
    *n = 0;
    if (!key || !key[0])
        return err_set(err, "store: get setting: empty key");
    if (max < 0 || (max > 0 && !values))
        return err_set(err, "store: get setting '%.60s': bad capacity %d", key, max);
    sqlite3_stmt *st = stmt(s, ST_SETTING_GET);
    if (sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC) != SQLITE_OK)
        return store_db_err(s, err, "get setting: binding");
    int rc = sqlite3_step(st);
    if (rc == SQLITE_DONE) {
        sqlite3_reset(st);
        return 0;
    }
    if (rc != SQLITE_ROW) {
        store_db_err(s, err, "get setting");
        sqlite3_reset(st);
        return -1;
    }
    const uint8_t *b = sqlite3_column_blob(st, 0);
    int bytes = sqlite3_column_bytes(st, 0);
    if (bytes % 8 || (bytes > 0 && !b)) {
        sqlite3_reset(st);
        return err_set(err, "store: setting '%.60s': stored value of %d bytes is not a list "
                       "of doubles", key, bytes);
    }
    int count = bytes / 8;
    for (int i = 0; i < count && i < max; i++) {
        uint64_t bits = 0;
        for (int k = 0; k < 8; k++)
            bits |= (uint64_t)b[8 * i + k] << (8 * k);
        memcpy(&values[i], &bits, 8);
    }
    sqlite3_reset(st);
    *n = count;
    *found = true;
    return 0;
}
