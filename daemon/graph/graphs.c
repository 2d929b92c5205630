/* graphs.c — apps' workflow graphs in the store (graphs.h). */
#include "daemon/graph/graphs.h"

#include <stdlib.h>
#include <string.h>

#include "daemon/net/reply.h"
#include "engine/clock.h"
#include "storage/graphs.h"

bool graphs_is_request(Llms__Request__BodyCase body)
{
    return body == LLMS__REQUEST__BODY_GRAPH_CREATE || body == LLMS__REQUEST__BODY_GRAPH_LIST ||
           body == LLMS__REQUEST__BODY_GRAPH_DELETE;
}

graph_limits graphs_limits(const config *cfg)
{
    return (graph_limits){.max_nodes = cfg->graph_max_nodes, .max_steps = cfg->graph_max_steps};
}

static bool is_builtin(const char *name)
{
    for (int i = 0; i < GRAPH_N_BUILTINS; i++)
        if (strcmp(graph_builtin_name(i), name) == 0)
            return true;
    return false;
}

static void handle_create(const graphs_env *env, const reply_to *to, uint64_t conn_id,
                          uint32_t uid, const char *app, const Llms__Request *req)
{
    const Llms__GraphCreateRequest *cr = req->graph_create;
    char err[ERR_MAX];
    if (!graph_name_ok(cr->name)) {
        reply_error(to, conn_id, req, LLMS__ERROR_CODE__INVALID_ARGUMENT,
                    "graph name must be 1..%d bytes of [A-Za-z0-9._-]", GRAPH_NAME_MAX);
        return;
    }
    if (is_builtin(cr->name)) {
        reply_error(to, conn_id, req, LLMS__ERROR_CODE__FAILED_PRECONDITION,
                    "'%s' is a built-in graph template", cr->name);
        return;
    }
    graph_limits lim = graphs_limits(env->cfg);
    graph *g = graph_compile(cr->graph, &lim, err);
    if (!g) {
        reply_error(to, conn_id, req, LLMS__ERROR_CODE__INVALID_ARGUMENT, "graph '%s': %s",
                    cr->name, err);
        return;
    }
    graph_free(g);
    int64_t app_id;
    int n;
    bool exists;
    size_t len = llms__graph_def__get_packed_size(cr->graph);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) {
        reply_error(to, conn_id, req, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        return;
    }
    llms__graph_def__pack(cr->graph, buf);
    if (store_app_id(env->st, uid, app, &app_id, err) || store_graph_count(env->st, app_id, &n, err))
        goto fail;
    if (n >= env->cfg->graph_max_per_app) {
        reply_error(to, conn_id, req, LLMS__ERROR_CODE__RESOURCE_EXHAUSTED,
                    "app has %d graphs, the limit (graph_max_per_app)", n);
        free(buf);
        return;
    }
    if (store_graph_put(env->st, app_id, cr->name, buf, len, clock_wall_ms(), &exists, err))
        goto fail;
    free(buf);
    if (exists)
        reply_error(to, conn_id, req, LLMS__ERROR_CODE__FAILED_PRECONDITION,
                    "graph '%s' exists (delete it first)", cr->name);
    else
        reply_ok(to, conn_id, req);
    return;
fail:
    free(buf);
    reply_error(to, conn_id, req, LLMS__ERROR_CODE__INTERNAL, "%s", err);
}

/* The reply of a GraphList being built. */
typedef struct list {
    Llms__GraphInfo *infos;
    Llms__GraphInfo **ptrs;
    Llms__GraphDef **defs;       /* unpacked: freed after the reply */
    graph *builtins[GRAPH_N_BUILTINS];
    size_t n, cap;
} list;

static int list_add(list *l, const char *name, bool builtin, Llms__GraphDef *def)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        Llms__GraphInfo *infos = realloc(l->infos, cap * sizeof *infos);
        if (infos)
            l->infos = infos;
        Llms__GraphDef **defs = realloc(l->defs, cap * sizeof *defs);
        if (defs)
            l->defs = defs;
        if (!infos || !defs)
            return -1;
        l->cap = cap;
    }
    /* def joins the list only with its name: on failure the caller still owns it */
    char *copy = strdup(name);
    if (!copy)
        return -1;
    llms__graph_info__init(&l->infos[l->n]);
    l->infos[l->n].name = copy;
    l->infos[l->n].builtin = builtin;
    l->infos[l->n].graph = def;
    l->defs[l->n] = builtin ? NULL : def;
    l->n++;
    return 0;
}

/* A definition that does not decode (a damaged store: GraphCreate stores only what it
 * decoded) is left out of the listing, with a warning, so that the app still sees its
 * other graphs; running it names the problem, and GraphDelete removes it. */
static int list_stored(void *arg, const char *name, const void *bytes, size_t len)
{
    Llms__GraphDef *def = llms__graph_def__unpack(NULL, len, bytes);
    if (!def) {
        fprintf(stderr, "llmsd: warn: graph '%s': its stored definition does not decode; "
                        "left out of the listing\n", name);
        return 0;
    }
    if (list_add(arg, name, false, def)) {
        llms__graph_def__free_unpacked(def, NULL);
        return -1;
    }
    return 0;
}

static void handle_list(const graphs_env *env, const reply_to *to, uint64_t conn_id,
                        uint32_t uid, const char *app, const Llms__Request *req)
{
    char err[ERR_MAX] = "out of memory";
    list l = {0};
    graph_limits lim = graphs_limits(env->cfg);
    int64_t app_id;
    int rc = 0;
    for (int i = 0; i < GRAPH_N_BUILTINS && rc == 0; i++) {
        l.builtins[i] = graph_builtin(graph_builtin_name(i), &lim, err);
        rc = !l.builtins[i] || list_add(&l, graph_builtin_name(i), true,
                                        (Llms__GraphDef *)graph_def(l.builtins[i]));
    }
    if (rc == 0)
        rc = store_app_id(env->st, uid, app, &app_id, err) ||
             store_graph_list(env->st, app_id, list_stored, &l, err);
    if (rc == 0 && !(l.ptrs = malloc((l.n ? l.n : 1) * sizeof *l.ptrs)))
        rc = -1;
    if (rc) {
        reply_error(to, conn_id, req, LLMS__ERROR_CODE__INTERNAL, "listing graphs: %s", err);
    } else {
        for (size_t i = 0; i < l.n; i++)
            l.ptrs[i] = &l.infos[i];
        Llms__GraphListResponse lr = LLMS__GRAPH_LIST_RESPONSE__INIT;
        lr.n_graphs = l.n;
        lr.graphs = l.ptrs;
        Llms__Response r = LLMS__RESPONSE__INIT;
        r.id = req->id;
        r.final = 1;
        r.body_case = LLMS__RESPONSE__BODY_GRAPH_LIST;
        r.graph_list = &lr;
        reply_send(to, conn_id, &r, false);
    }
    for (size_t i = 0; i < l.n; i++) {
        free(l.infos[i].name);
        if (l.defs[i])
            llms__graph_def__free_unpacked(l.defs[i], NULL);
    }
    for (int i = 0; i < GRAPH_N_BUILTINS; i++)
        graph_free(l.builtins[i]);
    free(l.infos);
    free(l.defs);
    free(l.ptrs);
}

static void handle_delete(const graphs_env *env, const reply_to *to, uint64_t conn_id,
                          uint32_t uid, const char *app, const Llms__Request *req)
{
    const char *name = req->graph_delete->name;
    char err[ERR_MAX];
    int64_t app_id;
    bool found;
    if (is_builtin(name)) {
        reply_error(to, conn_id, req, LLMS__ERROR_CODE__FAILED_PRECONDITION,
                    "'%s' is a built-in graph template", name);
        return;
    }
    if (store_app_id(env->st, uid, app, &app_id, err) ||
        store_graph_delete(env->st, app_id, name, &found, err)) {
        reply_error(to, conn_id, req, LLMS__ERROR_CODE__INTERNAL, "%s", err);
        return;
    }
    if (!found)
        reply_error(to, conn_id, req, LLMS__ERROR_CODE__NOT_FOUND, "no graph '%.64s'", name);
    else
        reply_ok(to, conn_id, req);
}

void graphs_handle(const graphs_env *env, uint64_t conn_id, uint32_t uid, const char *app,
                   const Llms__Request *req)
{
    const reply_to to = {env->out, env->cfg->max_frame_bytes};
    switch (req->body_case) {
    case LLMS__REQUEST__BODY_GRAPH_CREATE:
        handle_create(env, &to, conn_id, uid, app, req);
        break;
    case LLMS__REQUEST__BODY_GRAPH_LIST:
        handle_list(env, &to, conn_id, uid, app, req);
        break;
    case LLMS__REQUEST__BODY_GRAPH_DELETE:
        handle_delete(env, &to, conn_id, uid, app, req);
        break;
    default:
        reply_error(&to, conn_id, req, LLMS__ERROR_CODE__UNIMPLEMENTED, "not a graph call");
        break;
    }
}

typedef struct opened {
    graph_limits lim;
    graph *g;
    char *err;
} opened;

static int open_stored(void *arg, const char *name, const void *bytes, size_t len)
{
    opened *o = arg;
    Llms__GraphDef *def = llms__graph_def__unpack(NULL, len, bytes);
    if (!def)
        return err_set(o->err, "graph '%s': its stored definition does not decode", name);
    char why[ERR_MAX];
    /* checked again: the limits may have been lowered since it was stored */
    o->g = graph_compile(def, &o->lim, why);
    llms__graph_def__free_unpacked(def, NULL);
    return o->g ? 0 : err_set(o->err, "graph '%s': %s", name, why);
}

graph *graphs_open(const graphs_env *env, uint32_t uid, const char *app, const char *name,
                   Llms__ErrorCode *code, char err[ERR_MAX])
{
    opened o = {graphs_limits(env->cfg), NULL, err};
    int64_t app_id;
    bool found = false;
    *code = LLMS__ERROR_CODE__INTERNAL;
    if (store_app_id(env->st, uid, app, &app_id, err) ||
        store_graph_get(env->st, app_id, name, open_stored, &o, &found, err)) {
        if (found)
            *code = LLMS__ERROR_CODE__FAILED_PRECONDITION;
        return NULL;
    }
    if (found)
        return o.g;
    if (is_builtin(name))
        return graph_builtin(name, &o.lim, err);
    *code = LLMS__ERROR_CODE__NOT_FOUND;
    err_set(err, "no graph '%.64s'", name);
    return NULL;
}
