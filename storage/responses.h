/*
 * responses.h — the Responses API's stored responses in the sqlite3 catalog (table
 * responses, schema version 16).
 *
 * The store keeps, per response, its id, the uid that made it, its creation time, the id
 * of the response it continues, its text and its input items' text (opaque bytes here),
 * and the bytes the caller counts it for against a budget; rows keep the order they were
 * stored in, so a budget evicts the oldest first. Each row carries a CRC-32C of its
 * columns (STORE_RESPONSE_CRC in store_internal.h): a changed byte shows as damage when
 * the rows are listed, never as other bytes.
 *
 * Writes are committed without waiting for the disk (store_cache_begin, storage/kb.h): a
 * killed daemon loses none, a power loss may lose the last ones; stored responses are
 * kept as OpenAI's are, for a while and up to a budget, not as a context's history.
 *
 * Same conventions as store.h: 0 or -1 with err; *found for missing rows; one thread.
 */
#ifndef LLMS_STORAGE_RESPONSES_H
#define LLMS_STORAGE_RESPONSES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/err.h"
#include "storage/store.h"

/* A stored response (what store_response_list gives is valid during its call only). */
typedef struct store_response {
    int64_t seq;               /* its place in the order stored (listing only) */
    const char *id;
    uint32_t uid;
    int64_t created;           /* Unix time in seconds */
    const char *previous;      /* the id of the response it continues; NULL when none */
    const void *response;      /* response_len bytes */
    size_t response_len;
    const void *items;         /* items_len bytes */
    size_t items_len;
    int64_t bytes;             /* what it counts for against a budget, >= 0 */
    const char *damage;        /* listing only: NULL, or why the row cannot be trusted
                                  (any field above but seq may then be wrong; the texts
                                  may be NULL) */
} store_response;

/* Stores r (a response of r->id already there is replaced) as the newest, then, in the
 * same transaction, deletes the oldest while all stored take more than budget bytes. */
int store_response_put(store *s, const store_response *r, int64_t budget, char err[ERR_MAX]);

/* Deletes id's response when uid stored it; *found says whether it was there. */
int store_response_delete(store *s, uint32_t uid, const char *id, bool *found,
                          char err[ERR_MAX]);

/* Deletes the response listed at seq, damaged or not (nothing when there is none). */
int store_response_delete_seq(store *s, int64_t seq, char err[ERR_MAX]);

/* Deletes the oldest while all stored take more than budget bytes (0: every one);
 * *evicted (may be NULL) gets how many went. */
int store_response_trim(store *s, int64_t budget, int *evicted, char err[ERR_MAX]);

/* Calls fn for each stored response, oldest first; a row that does not match its
 * checksum comes with damage set. A non-zero return from fn stops the walk and is
 * returned; a damaged page that stops it is -1 with err, after fn saw the rows before. */
int store_response_list(store *s, int (*fn)(void *arg, const store_response *r), void *arg,
                        char err[ERR_MAX]);

/* Responses stored and the bytes they count for. */
int store_response_count(store *s, int64_t *n, int64_t *bytes, char err[ERR_MAX]);

#endif
