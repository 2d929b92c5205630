/*
 * graphs.h — apps' workflow graphs: the GraphCreate, GraphList and GraphDelete requests,
 * and the lookup a GraphRun starts from.
 *
 * A graph belongs to one app (uid, app name) and is kept in the store, so it survives
 * restarts; every lookup is by (app, name), so another app's graph is NOT_FOUND. The
 * built-in templates (graph.h) are every app's, by name, and cannot be replaced or
 * deleted. Limits (config): graph_max_per_app, graph_max_nodes, graph_max_steps.
 * Everything runs on the worker thread.
 */
#ifndef LLMS_GRAPHS_H
#define LLMS_GRAPHS_H

#include <stdbool.h>
#include <stdint.h>

#include "daemon/config.h"
#include "daemon/graph/graph.h"
#include "daemon/net/outq.h"
#include "proto/llms.pb-c.h"
#include "storage/store.h"

typedef struct graphs_env {
    const config *cfg;
    store *st;
    outq *out;
} graphs_env;

/* Whether req is one graphs_handle answers. */
bool graphs_is_request(Llms__Request__BodyCase body);

/* Answers a GraphCreate, GraphList or GraphDelete of app (uid, app). */
void graphs_handle(const graphs_env *env, uint64_t conn_id, uint32_t uid, const char *app,
                   const Llms__Request *req);

/* The limits of the config. */
graph_limits graphs_limits(const config *cfg);

/* App (uid, app)'s graph name, else the built-in template of that name, compiled. NULL
 * with *code and err when there is none (NOT_FOUND) or it cannot be read. */
graph *graphs_open(const graphs_env *env, uint32_t uid, const char *app, const char *name,
                   Llms__ErrorCode *code, char err[ERR_MAX]);

#endif
