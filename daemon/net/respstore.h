/*
 * respstore.h — the Responses API's stored responses (OpenAI's store: true), kept by the
 * event loop in memory: each response object and the input items it answered (the whole
 * conversation up to it), as JSON text, under the uid that made it. A byte budget bounds
 * them all, the oldest evicted first. The memory is what the gateway answers from; with
 * responses_store = disk the worker keeps a copy in the store under the same budget
 * (responses.c hands it each change), which daemon/respload.h reads back at start.
 */
#ifndef LLMS_RESPSTORE_H
#define LLMS_RESPSTORE_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* The longest id taken: OpenAI's "resp_" and its letters and digits fit well within. */
#define RESPSTORE_ID_MAX 64

typedef struct respstore respstore;

/* A stored response as respstore_get gives it: its texts belong to the store, valid
 * until the store next changes. */
typedef struct respstore_entry {
    const char *response;      /* the response object, JSON text (response_len bytes) */
    size_t response_len;
    const char *items;         /* its input items, a JSON array's text (items_len bytes) */
    size_t items_len;
} respstore_entry;

/* A store of at most budget bytes (0: off, nothing is kept); NULL out of memory. */
respstore *respstore_new(size_t budget);
void respstore_free(respstore *s);

/* Whether the store keeps anything (its budget is not 0). */
bool respstore_on(const respstore *s);

/* Whether id (n bytes) may name a stored response: "resp_" and then 1 to
 * RESPSTORE_ID_MAX - 5 ASCII letters, digits, '_' or '-'. */
bool respstore_id_valid(const char *id, size_t n);

/* What a response of these lengths takes of the budget: its texts and the entry that
 * holds them, so that the budget bounds the memory the store takes, not only the JSON. */
size_t respstore_bytes_of(size_t response_len, size_t items_len);

/* Keeps id's response of uid: the texts are copied. The oldest responses go to make room
 * (a response of id already there is replaced). 0; -1 when it would take more than half
 * the budget (nothing kept, nothing evicted) or out of memory. */
int respstore_put(respstore *s, uid_t uid, const char *id, const char *response,
                  size_t response_len, const char *items, size_t items_len);

/* id's response when uid stored it: true with *e; false when there is none, or it is
 * another uid's (the two cannot be told apart). */
bool respstore_get(const respstore *s, uid_t uid, const char *id, respstore_entry *e);

/* Forgets id's response of uid; false when respstore_get would not find it. */
bool respstore_delete(respstore *s, uid_t uid, const char *id);

/* Responses kept, and the bytes they take of the budget. */
size_t respstore_count(const respstore *s);
size_t respstore_bytes(const respstore *s);

#endif
