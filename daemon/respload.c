/*
 * respload.c — stored responses read back at start (respload.h): one walk over the store
 * puts them into memory; a second, only when the first skipped or memory evicted some,
 * deletes from the store every record memory does not hold, so that the two agree.
 */
#include "daemon/respload.h"

#include <json-c/json.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/reqlog.h"
#include "storage/responses.h"

/* Warnings for single records before they are only counted. */
#define LOAD_WARNINGS 8
/* The nesting a record's JSON may have: twice what the gateway takes in a body, which a
 * response object nests a level or two deeper. */
#define LOAD_JSON_DEPTH (2 * JSON_TOKENER_DEFAULT_DEPTH)

typedef struct load_state {
    respstore *mem;
    size_t loaded, skipped;
    int64_t *stale;            /* owned: the records to delete (their seq), n_stale */
    size_t n_stale, cap_stale;
} load_state;

/* n bytes of text as JSON of type (its one value, nothing after it); NULL when it is not.
 * The caller puts what it gets. */
static json_object *json_of(const void *text, size_t n, json_type type)
{
    json_tokener *tk = json_tokener_new_ex(LOAD_JSON_DEPTH);
    json_object *o = tk && n <= INT_MAX ? json_tokener_parse_ex(tk, text, (int)n) : NULL;
    bool ok = o && json_tokener_get_error(tk) == json_tokener_success &&
              json_tokener_get_parse_end(tk) == n && json_object_is_type(o, type);
    if (tk)
        json_tokener_free(tk);
    if (!ok) {
        json_object_put(o);
        return NULL;
    }
    return o;
}

/* Why r cannot be a stored response, NULL when it can: damage, an id that is none, or
 * texts that are not a response object of that id and an array of items. */
static const char *unusable(const store_response *r)
{
    if (r->damage)
        return r->damage;
    if (!respstore_id_valid(r->id, strlen(r->id)))
        return "its id is no response id";
    json_object *o = json_of(r->response, r->response_len, json_type_object), *id;
    bool same = o && json_object_object_get_ex(o, "id", &id) &&
                json_object_is_type(id, json_type_string) &&
                !strcmp(json_object_get_string(id), r->id);
    json_object_put(o);
    if (!same)
        return "its text is not the response object of its id";
    json_object *items = json_of(r->items, r->items_len, json_type_array);
    json_object_put(items);
    return items ? NULL : "its input items are not a JSON array";
}

static void warn_skipped(load_state *ls, const store_response *r, const char *why)
{
    if (++ls->skipped <= LOAD_WARNINGS && reqlog_enabled(REQLOG_WARN))
        fprintf(stderr, "llmsd: warn: stored response %s (record %lld): %s; skipped and "
                        "deleted\n", r->id && r->id[0] ? r->id : "(no id)", (long long)r->seq,
                why);
}

static int load_one(void *arg, const store_response *r)
{
    load_state *ls = arg;
    const char *why = unusable(r);
    if (!why && respstore_put(ls->mem, r->uid, r->id, r->response, r->response_len, r->items,
                              r->items_len))
        why = "more than half of responses_store_bytes, or out of memory";
    if (why) {
        warn_skipped(ls, r, why);
        return 0;
    }
    ls->loaded++;
    return 0;
}

/* Notes r for deletion when memory does not hold it. */
static int note_stale(void *arg, const store_response *r)
{
    load_state *ls = arg;
    if (!r->damage && r->id && respstore_get(ls->mem, r->uid, r->id, &(respstore_entry){0}))
        return 0;
    if (ls->n_stale == ls->cap_stale) {
        size_t cap = ls->cap_stale ? 2 * ls->cap_stale : 64;
        int64_t *to = realloc(ls->stale, cap * sizeof *to);
        if (!to)
            return -1;
        ls->stale = to;
        ls->cap_stale = cap;
    }
    ls->stale[ls->n_stale++] = r->seq;
    return 0;
}

/* Deletes from st the records mem does not hold. */
static void delete_stale(store *st, load_state *ls)
{
    char err[ERR_MAX] = "out of memory";
    int rc = store_response_list(st, note_stale, ls, err);
    for (size_t i = 0; rc == 0 && i < ls->n_stale; i++)
        rc = store_response_delete_seq(st, ls->stale[i], err);
    if (rc && reqlog_enabled(REQLOG_WARN))
        fprintf(stderr, "llmsd: warn: deleting skipped stored responses: %s (they are "
                        "skipped again at the next start)\n", err);
    free(ls->stale);
}

void respload(store *st, respstore *mem, const config *cfg)
{
    char err[ERR_MAX];
    int evicted = 0;
    bool disk = !strcmp(cfg->responses_store, "disk");
    int64_t budget = disk ? cfg->responses_store_bytes : 0;
    if (store_response_trim(st, budget, &evicted, err)) {
        if (reqlog_enabled(REQLOG_WARN))
            fprintf(stderr, "llmsd: warn: stored responses: %s; none read back\n", err);
        return;
    }
    if (!disk) {
        if (evicted && reqlog_enabled(REQLOG_INFO))
            fprintf(stderr, "llmsd: info: %d stored responses deleted from the store "
                            "(responses_store = memory)\n", evicted);
        return;
    }
    load_state ls = {.mem = mem};
    if (store_response_list(st, load_one, &ls, err) && reqlog_enabled(REQLOG_WARN))
        fprintf(stderr, "llmsd: warn: reading stored responses: %s; those after the %zu read "
                        "are skipped\n", err, ls.loaded + ls.skipped);
    if (ls.skipped > LOAD_WARNINGS && reqlog_enabled(REQLOG_WARN))
        fprintf(stderr, "llmsd: warn: %zu stored responses skipped and deleted in all\n",
                ls.skipped);
    if (ls.skipped || respstore_count(mem) < ls.loaded)
        delete_stale(st, &ls);
    if (reqlog_enabled(REQLOG_INFO) && (respstore_count(mem) || evicted))
        fprintf(stderr, "llmsd: info: %zu stored responses read back (%zu bytes)%s\n",
                respstore_count(mem), respstore_bytes(mem),
                evicted ? ", the oldest over responses_store_bytes deleted" : "");
}
