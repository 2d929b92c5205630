/*
 * checkpointer.c — the store's write-ahead log checkpointed on a thread of its own.
 *
 * SQLite's own automatic checkpoint runs inside the commit that takes the log past
 * 1000 pages: that commit writes the pages into the database file and fsyncs it. A
 * RagQuery's cache transaction holds a QKV node of megabytes (6 MB at 512 tokens of the
 * documentation model), so nearly each of them paid it, on the scheduler thread, while
 * every other sequence waited for the next step. Here the commit only wakes this thread,
 * which checkpoints through a connection of its own (PASSIVE: it never blocks a writer,
 * and copies what no reader still needs). Durability is unchanged: a commit is what the
 * log holds, whichever connection copies it on.
 */
#include "storage/store_internal.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* Pages in the log past which a commit asks for a checkpoint (SQLite's default). */
#define STORE_CHECKPOINT_PAGES 1000
/* A log reset needs a write that starts after a checkpoint ended: writes back to back
 * (a large KbAdd) start while the thread copies, and the log grows. Past this many
 * pages (32 MiB of 4 KiB pages) the committing thread checkpoints itself, as SQLite
 * would, so the log stays bounded. */
#define STORE_CHECKPOINT_INLINE_PAGES 8192

struct store_checkpointer {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake; /* due or stop set */
    pthread_mutex_t run; /* held by whoever checkpoints: one at a time */
    bool due, stop;
    sqlite3 *db;         /* the thread's own connection */
    uint64_t done;       /* checkpoints run */
};

static void *checkpointer_main(void *arg)
{
    store_checkpointer *c = arg;
    pthread_mutex_lock(&c->lock);
    for (;;) {
        while (!c->due && !c->stop)
            pthread_cond_wait(&c->wake, &c->lock);
        if (c->stop)
            break;
        c->due = false;
        pthread_mutex_unlock(&c->lock);
        /* BUSY (another checkpoint, store_reclaim's TRUNCATE, running) or an I/O error
         * leaves the log as it is: the next commit past the mark asks again */
        pthread_mutex_lock(&c->run);
        sqlite3_wal_checkpoint_v2(c->db, NULL, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
        pthread_mutex_unlock(&c->run);
        pthread_mutex_lock(&c->lock);
        c->done++;
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

/* sqlite3_wal_hook's callback, on the committing thread: a wake-up, or past
 * STORE_CHECKPOINT_INLINE_PAGES a checkpoint of its own. */
static int checkpointer_on_commit(void *arg, sqlite3 *db, const char *name, int n_pages)
{
    store_checkpointer *c = arg;
    if (n_pages >= STORE_CHECKPOINT_INLINE_PAGES) {
        pthread_mutex_lock(&c->run);
        sqlite3_wal_checkpoint_v2(db, name, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
        pthread_mutex_unlock(&c->run);
    } else if (n_pages >= STORE_CHECKPOINT_PAGES) {
        pthread_mutex_lock(&c->lock);
        c->due = true;
        pthread_cond_signal(&c->wake);
        pthread_mutex_unlock(&c->lock);
    }
    return SQLITE_OK;
}

store_checkpointer *store_checkpointer_start(sqlite3 *db, const char *path, char *err)
{
    store_checkpointer *c = calloc(1, sizeof *c);
    if (!c) {
        err_set(err, "store: out of memory for the checkpoint thread");
        return NULL;
    }
    int rc = sqlite3_open_v2(path, &c->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL);
    if (rc != SQLITE_OK) {
        err_set(err, "store: opening %s for checkpoints: %s", path,
                c->db ? sqlite3_errmsg(c->db) : sqlite3_errstr(rc));
        sqlite3_close_v2(c->db);
        free(c);
        return NULL;
    }
    /* a connection learns that the file is in WAL mode by reading it: until then a
     * checkpoint through it does nothing */
    if (sqlite3_exec(c->db, "PRAGMA journal_mode = WAL", NULL, NULL, NULL) != SQLITE_OK) {
        err_set(err, "store: %s: reading it for checkpoints: %s", path, sqlite3_errmsg(c->db));
        sqlite3_close_v2(c->db);
        free(c);
        return NULL;
    }
    pthread_mutex_init(&c->lock, NULL);
    pthread_mutex_init(&c->run, NULL);
    pthread_cond_init(&c->wake, NULL);
    if ((rc = pthread_create(&c->thread, NULL, checkpointer_main, c)) != 0) {
        err_set(err, "store: starting the checkpoint thread: %s", strerror(rc));
        pthread_cond_destroy(&c->wake);
        pthread_mutex_destroy(&c->run);
        pthread_mutex_destroy(&c->lock);
        sqlite3_close_v2(c->db);
        free(c);
        return NULL;
    }
    /* replaces SQLite's automatic checkpoint, which is a wal hook too */
    sqlite3_wal_hook(db, checkpointer_on_commit, c);
    return c;
}

void store_checkpointer_stop(store_checkpointer *c, sqlite3 *db)
{
    if (!c)
        return;
    sqlite3_wal_hook(db, NULL, NULL);
    pthread_mutex_lock(&c->lock);
    c->stop = true;
    pthread_cond_signal(&c->wake);
    pthread_mutex_unlock(&c->lock);
    pthread_join(c->thread, NULL);
    pthread_cond_destroy(&c->wake);
    pthread_mutex_destroy(&c->run);
    pthread_mutex_destroy(&c->lock);
    sqlite3_close_v2(c->db);
    free(c);
}

uint64_t store_checkpointer_done(store_checkpointer *c)
{
    if (!c)
        return 0;
    pthread_mutex_lock(&c->lock);
    uint64_t n = c->done;
    pthread_mutex_unlock(&c->lock);
    return n;
}

void store_checkpointer_hold(store_checkpointer *c)
{
    if (c)
        pthread_mutex_lock(&c->run);
}

void store_checkpointer_release(store_checkpointer *c)
{
    if (c)
        pthread_mutex_unlock(&c->run);
}
