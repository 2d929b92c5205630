/*
 * graphs.h — apps' workflow graph definitions in the sqlite3 catalog.
 *
 * The store keeps a definition as opaque bytes (a packed GraphDef) under (app, name);
 * it knows nothing of nodes or edges. Same conventions as store.h: 0 or -1 with err;
 * *found for missing rows; one thread.
 */
#ifndef LLMS_STORAGE_GRAPHS_H
#define LLMS_STORAGE_GRAPHS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/err.h"
#include "storage/store.h"

/* Stores definition def (len bytes) as app_id's graph name; *exists true (and nothing
 * written) when the app has one of that name already. */
int store_graph_put(store *s, int64_t app_id, const char *name, const void *def, size_t len,
                    int64_t now_ms, bool *exists, char err[ERR_MAX]);

/* Calls fn with app_id's graph name (the bytes are valid during the call). */
int store_graph_get(store *s, int64_t app_id, const char *name,
                    int (*fn)(void *arg, const char *name, const void *def, size_t len),
                    void *arg, bool *found, char err[ERR_MAX]);

/* Calls fn for each graph of app_id, by name; a non-zero return stops and is returned. */
int store_graph_list(store *s, int64_t app_id,
                     int (*fn)(void *arg, const char *name, const void *def, size_t len),
                     void *arg, char err[ERR_MAX]);

/* How many graphs app_id has. */
int store_graph_count(store *s, int64_t app_id, int *n, char err[ERR_MAX]);

int store_graph_delete(store *s, int64_t app_id, const char *name, bool *found,
                       char err[ERR_MAX]);

#endif
