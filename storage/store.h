/*
 * store.h — the daemon's persistent catalog: apps, contexts and their histories.
 *
 * One sqlite3 database in the state directory, in WAL mode with synchronous=FULL so
 * that a committed turn survives a crash of the daemon or the machine. The store knows bytes, strings and ids, not
 * transformers: a context's history is a list of turns, each with its role, its text
 * and the token ids it added to the context, so a context's full token sequence is the
 * concatenation of its turns' tokens and can be recomputed after a restart.
 *
 * Every function returns 0 on success and -1 on failure with a message in err. Where a
 * function offers *found, a missing row is not a failure: it returns 0 with *found false
 * (and *found is false whenever it returns -1). Other functions given an unknown context
 * fail with "no context '<id>'". A callback's non-zero return value is passed through.
 * A store is used from one thread at a time (the daemon's worker serialises access).
 */
#ifndef LLMS_STORE_H
#define LLMS_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/err.h"

typedef struct store store;

/* Returned (instead of -1) by store_context_turns when what the store holds of the
 * context cannot be trusted (a row that does not match its checksum, a turn missing,
 * a damaged page among its turns): the context is damaged, the store and its other
 * contexts are not. err says how. */
#define STORE_E_DAMAGED (-2)

/* Opens (creating when needed) <dir>/llmsd.db, creating dir with mode 0750 if missing,
 * and migrates the schema. A file that is not a valid database is an error naming it.
 * The directory stays locked (flock on <dir>/llmsd.lock) until store_close: opening it
 * again meanwhile, from this process or another, is an error saying so. */
store *store_open(const char *dir, char err[ERR_MAX]);
void store_close(store *s);

/* The schema version store_open migrates a database to (its number of migrations). */
int store_schema_version(void);

/* The id of app (uid, name) (always >= 0), created on first use. */
int store_app_id(store *s, uint32_t uid, const char *name, int64_t *app_id, char err[ERR_MAX]);

/* A context's sliding window: its overflow policy (opaque to the store) and, once it
 * slid, the window over its history: the context's model-visible tokens are the first
 * sink tokens of the concatenated turns, then those after sink + dropped. */
typedef struct store_window {
    int overflow;
    int64_t sink;
    int64_t dropped;
    int64_t slides;            /* times it slid */
} store_window;

/* What the catalog keeps about a context (strings owned by the store_context_list
 * caller's callback scope: copy what you keep). */
typedef struct store_context {
    const char *id;            /* unguessable string chosen by the daemon */
    int64_t app_id;
    uint32_t uid;
    const char *app_name;
    const char *system_prompt; /* NULL when none */
    const void *params;        /* serialized defaults (opaque bytes), NULL when none */
    size_t params_len;
    int64_t created_ms;        /* Unix time in milliseconds */
    int64_t last_used_ms;
    int64_t n_tokens;          /* sum of the turns' token counts */
    int64_t n_turns;
    store_window window;       /* all 0 for a context created before windows existed */
    const char *model;         /* the model it belongs to; NULL when none was recorded */
    const char *damage;        /* NULL, or why the row cannot be trusted (its checksum does
                                  not match: any column above may be wrong) */
} store_context;

/* Adds an empty context (no turns) of an existing app; an id already used fails. */
int store_context_create(store *s, const char *id, int64_t app_id, const char *system_prompt,
                         const void *params, size_t params_len, int64_t now_ms,
                         char err[ERR_MAX]);

/* Deletes a context and its turns; *found says whether it existed. Once deleted rows
 * leave more than a few MiB of free pages, they are given back to the file system
 * (incremental vacuum, then a checkpoint that truncates the log); a give-back that fails
 * (a full disk) does not fail the delete, and a later delete gives them back. */
int store_context_delete(store *s, const char *id, bool *found, char err[ERR_MAX]);

/* Gives up to max_pages free pages back to the file system (incremental vacuum), once
 * they pass a few MiB; *done (the log then checkpointed, so the file shrinks) when few
 * are left. For a large delete made in slices, called a slice at a time. */
int store_vacuum_step(store *s, int max_pages, bool *done, char err[ERR_MAX]);

/* Calls fn for each context (of one app when app_id >= 0, of all apps when -1), oldest
 * first. A non-zero return from fn stops the walk and is returned. */
int store_context_list(store *s, int64_t app_id,
                       int (*fn)(void *arg, const store_context *c), void *arg,
                       char err[ERR_MAX]);

/* Looks one context up and calls fn (which may be NULL) with it; *found false (fn not
 * called) when absent. */
int store_context_get(store *s, const char *id,
                      int (*fn)(void *arg, const store_context *c), void *arg, bool *found,
                      char err[ERR_MAX]);

/*
 * Appends turns to a context in one transaction, durable when it returns (a crash
 * afterwards keeps them; a crash before keeps none of them), and updates last_used.
 * role is "system", "user", "assistant", or "raw" for text added without a template;
 * text must not be NULL (may be empty); n_tokens >= 0. An unknown id fails with
 * "no context '<id>'" and writes nothing.
 */
typedef struct store_turn {
    const char *role;
    const char *text;
    const int32_t *tokens;
    int n_tokens;
} store_turn;

int store_context_append(store *s, const char *id, const store_turn *turns, int n_turns,
                         int64_t now_ms, char err[ERR_MAX]);

/* Records the model a context belongs to (its name, opaque to the store). */
int store_context_set_model(store *s, const char *id, const char *model, char err[ERR_MAX]);

/* Opaque bytes kept with a context (the context memory's attention statistics of its
 * tokens), replaced whole; n == 0 clears them. store_chunk_batch_set_context_stats
 * stores them with a batch of chunks instead. */
int store_context_set_stats(store *s, const char *id, const void *bytes, size_t n,
                            char err[ERR_MAX]);

/* The bytes last stored for a context, copied into *bytes (free()) and *n; NULL and 0
 * when none were. An absent context is an error. */
int store_context_get_stats(store *s, const char *id, void **bytes, size_t *n,
                            char err[ERR_MAX]);

/* Sets a context's window (e.g. its overflow policy right after store_context_create). */
int store_context_set_window(store *s, const char *id, const store_window *w,
                             char err[ERR_MAX]);

/*
 * store_context_append that, in the same transaction, also sets the context's window
 * (when w is not NULL) and deletes its chunk rows with index >= drop_chunks_from (when
 * >= 0; their files are removed after the commit, or by store_chunks_gc after a crash):
 * a slide commits its turn, its new window and the end of the chunks it invalidated
 * together.
 */
int store_context_append_window(store *s, const char *id, const store_turn *turns,
                                int n_turns, const store_window *w, int drop_chunks_from,
                                int64_t now_ms, char err[ERR_MAX]);

/* Calls fn for each turn of a context in order (strings and tokens valid during the
 * call only). Damage is STORE_E_DAMAGED naming the turn, possibly after fn saw the turns
 * before it: a row that cannot be decoded or does not match its checksum, turns missing
 * or out of order, turn and token counts other than the context's, a damaged page. */
int store_context_turns(store *s, const char *id,
                        int (*fn)(void *arg, const store_turn *t), void *arg,
                        char err[ERR_MAX]);

/* ---- settings: small named values (profiled cost models, calibrated thresholds) ---- */

/* Stores n doubles under key (replacing them). */
int store_setting_put(store *s, const char *key, const double *values, int n,
                      char err[ERR_MAX]);

/* Reads up to max values of key into values; *n gets how many are stored (0 and *found
 * false when the key is absent). */
int store_setting_get(store *s, const char *key, double *values, int max, int *n,
                      bool *found, char err[ERR_MAX]);

/* The directory the store lives in (chunk files go below it). */
const char *store_dir(const store *s);

#endif
