/*
 * ctxmgr.h — the daemon's contexts in memory, mirrored in the store.
 *
 * A context is an app's conversation: its token history (what the model has seen), its
 * messages (to render the chat template), and its KV (a kv_seq holding the first
 * kv_seq_n_tokens(&seq) tokens of the history, possibly none). At startup every context
 * of the store is listed with no KV; the scheduler rebuilds the KV of a context by
 * evaluating the tokens the KV lacks at its next Call. Evicting a context drops its KV
 * only.
 *
 * All functions are called from the worker thread only (the store is single-threaded).
 */
#ifndef LLMS_CTXMGR_H
#define LLMS_CTXMGR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/err.h"
#include "engine/kv.h"
#include "proto/llms.pb-c.h"
#include "storage/store.h"

#define CTX_ID_LEN 32 /* hex characters of 128 random bits */

typedef struct ctx_msg {
    char *role;   /* "user", "assistant", or "raw" (text added without the template) */
    char *text;   /* user: the prompt; assistant: the reply as the client saw it (stop
                     strings removed) */
    int n_tokens; /* tokens the message added to the context */
} ctx_msg;

typedef struct ctx_entry {
    char id[CTX_ID_LEN + 1];
    int64_t app_id;
    uint32_t uid;
    char *app_name;
    char *system_prompt;               /* NULL when none */
    Llms__GenerationParams *defaults;  /* NULL when none */
    int32_t *tokens;                   /* (n_tokens) the whole history */
    int n_tokens, cap_tokens;
    ctx_msg *msgs;                     /* (n_msgs) */
    int n_msgs, cap_msgs;
    kv_seq seq;                        /* KV of tokens[0 .. kv_seq_n_tokens(&seq)) */
    bool busy;                         /* a Call is running on it */
    int64_t created_ms, last_used_ms;
    struct ctx_entry *next;
} ctx_entry;

typedef struct ctxmgr ctxmgr;

/* Loads every context of the store (histories included) with no KV; chunks come from
 * pool. NULL + err on failure. */
ctxmgr *ctx_open(store *s, kv_pool *pool, char err[ERR_MAX]);

/* Frees every context and its KV (the store stays open: the caller closes it). */
void ctx_close(ctxmgr *cm);

/* The context with this id when it belongs to app (uid, app), else NULL: another app's
 * context and a missing one look the same. */
ctx_entry *ctx_find(ctxmgr *cm, const char *id, uint32_t uid, const char *app);

/* The context with this id, whoever owns it (admin calls). */
ctx_entry *ctx_find_any(ctxmgr *cm, const char *id);

/* Contexts of one app, and of all apps. */
int ctx_count_app(const ctxmgr *cm, uint32_t uid, const char *app);
int ctx_count(const ctxmgr *cm);

/* The first context (oldest first), to walk with ->next. */
ctx_entry *ctx_first(ctxmgr *cm);

/* Creates a context with a fresh random id, in the store then in memory. */
int ctx_create(ctxmgr *cm, uint32_t uid, const char *app, const char *system_prompt,
               const Llms__GenerationParams *defaults, int64_t now_ms, ctx_entry **out,
               char err[ERR_MAX]);

/* Deletes a context (store and memory); c is freed. */
int ctx_delete(ctxmgr *cm, ctx_entry *c, char err[ERR_MAX]);

/*
 * Records a finished turn: the user (or raw) message with the tokens it added and the
 * assistant reply with its tokens, in the store (one transaction) then in memory. On
 * failure nothing changes in memory.
 */
int ctx_commit_turn(ctxmgr *cm, ctx_entry *c, const char *user_role, const char *user_text,
                    const int32_t *user_tokens, int n_user, const char *reply_text,
                    const int32_t *reply_tokens, int n_reply, int64_t now_ms,
                    char err[ERR_MAX]);

/* Drops the context's KV (it is rebuilt on the next Call). */
void ctx_evict(ctxmgr *cm, ctx_entry *c);

/* Resident KV bytes of one context and of all. */
size_t ctx_kv_bytes(const ctxmgr *cm, const ctx_entry *c);
size_t ctx_kv_bytes_total(const ctxmgr *cm);
int ctx_count_resident(const ctxmgr *cm);

/* Drops the KV of idle contexts, least recently used first, until the resident KV is
 * at most budget bytes (0: no budget) or no idle context with KV is left. */
void ctx_enforce_budget(ctxmgr *cm, size_t budget);

/* 128 random bits as 32 lowercase hex characters and a NUL. */
int ctx_new_id(char id[CTX_ID_LEN + 1], char err[ERR_MAX]);

#endif
