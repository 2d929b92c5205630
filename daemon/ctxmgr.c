/*
 * ctxmgr.c — a list of contexts, oldest first, mirrored in the store. Lookups scan the
 * list: the daemon keeps at most apps x max_contexts_per_app contexts and a scan is
 * cheap next to a decode step.
 */
#include "daemon/ctxmgr.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

struct ctxmgr {
    store *st;
    kv_pool *pool;
    ctx_entry *head, *tail;
    int n;
};

static void entry_free(ctx_entry *c)
{
    if (!c)
        return;
    kv_seq_free(&c->seq);
    free(c->app_name);
    free(c->system_prompt);
    if (c->defaults)
        llms__generation_params__free_unpacked(c->defaults, NULL);
    free(c->tokens);
    for (int i = 0; i < c->n_msgs; i++) {
        free(c->msgs[i].role);
        free(c->msgs[i].text);
    }
    free(c->msgs);
    free(c);
}

static void list_append(ctxmgr *cm, ctx_entry *c)
{
    c->next = NULL;
    if (cm->tail)
        cm->tail->next = c;
    else
        cm->head = c;
    cm->tail = c;
    cm->n++;
}

static int push_tokens(ctx_entry *c, const int32_t *t, int n)
{
    if (n <= 0)
        return 0;
    if (c->n_tokens + n > c->cap_tokens) {
        int cap = c->cap_tokens ? c->cap_tokens : 256;
        while (cap < c->n_tokens + n)
            cap *= 2;
        int32_t *p = realloc(c->tokens, sizeof *p * (size_t)cap);
        if (!p)
            return -1;
        c->tokens = p;
        c->cap_tokens = cap;
    }
    memcpy(c->tokens + c->n_tokens, t, sizeof *t * (size_t)n);
    c->n_tokens += n;
    return 0;
}

static int push_msg(ctx_entry *c, const char *role, const char *text, int n_tokens)
{
    if (c->n_msgs == c->cap_msgs) {
        int cap = c->cap_msgs ? c->cap_msgs * 2 : 8;
        ctx_msg *p = realloc(c->msgs, sizeof *p * (size_t)cap);
        if (!p)
            return -1;
        c->msgs = p;
        c->cap_msgs = cap;
    }
    char *r = strdup(role), *t = strdup(text);
    if (!r || !t) {
        free(r);
        free(t);
        return -1;
    }
    c->msgs[c->n_msgs++] = (ctx_msg){r, t, n_tokens};
    return 0;
}

static int load_turn(void *arg, const store_turn *t)
{
    ctx_entry *c = arg;
    return push_tokens(c, t->tokens, t->n_tokens) || push_msg(c, t->role, t->text, t->n_tokens) ? 1 : 0;
}

typedef struct load_state {
    ctxmgr *cm;
    char *err;
} load_state;

static int load_context(void *arg, const store_context *sc)
{
    load_state *ls = arg;
    ctx_entry *c = calloc(1, sizeof *c);
    if (!c || strlen(sc->id) > CTX_ID_LEN) {
        free(c);
        return c ? err_set(ls->err, "store: context id '%s' too long", sc->id)
                 : err_set(ls->err, "out of memory");
    }
    strcpy(c->id, sc->id);
    c->app_id = sc->app_id;
    c->uid = sc->uid;
    c->app_name = strdup(sc->app_name);
    c->system_prompt = sc->system_prompt ? strdup(sc->system_prompt) : NULL;
    if (sc->params && sc->params_len)
        c->defaults = llms__generation_params__unpack(NULL, sc->params_len, sc->params);
    c->created_ms = sc->created_ms;
    c->last_used_ms = sc->last_used_ms;
    kv_seq_init(&c->seq, ls->cm->pool);
    if (!c->app_name || (sc->system_prompt && !c->system_prompt)) {
        entry_free(c);
        return err_set(ls->err, "out of memory");
    }
    /* The turns are read after the walk (one statement at a time on the store). */
    list_append(ls->cm, c);
    return 0;
}

ctxmgr *ctx_open(store *s, kv_pool *pool, char err[ERR_MAX])
{
    ctxmgr *cm = calloc(1, sizeof *cm);
    if (!cm) {
        err_set(err, "out of memory");
        return NULL;
    }
    cm->st = s;
    cm->pool = pool;
    load_state ls = {cm, err};
    int rc = store_context_list(s, -1, load_context, &ls, err);
    for (ctx_entry *c = cm->head; rc == 0 && c; c = c->next) {
        rc = store_context_turns(s, c->id, load_turn, c, err);
        if (rc > 0)
            rc = err_set(err, "out of memory loading context %s", c->id);
    }
    if (rc) {
        ctx_close(cm);
        return NULL;
    }
    return cm;
}

void ctx_close(ctxmgr *cm)
{
    if (!cm)
        return;
    ctx_entry *c = cm->head;
    while (c) {
        ctx_entry *next = c->next;
        entry_free(c);
        c = next;
    }
    free(cm);
}

ctx_entry *ctx_find_any(ctxmgr *cm, const char *id)
{
    for (ctx_entry *c = cm->head; c; c = c->next)
        if (strcmp(c->id, id) == 0)
            return c;
    return NULL;
}

ctx_entry *ctx_find(ctxmgr *cm, const char *id, uint32_t uid, const char *app)
{
    ctx_entry *c = ctx_find_any(cm, id);
    return c && c->uid == uid && strcmp(c->app_name, app) == 0 ? c : NULL;
}

int ctx_count_app(const ctxmgr *cm, uint32_t uid, const char *app)
{
    int n = 0;
    for (const ctx_entry *c = cm->head; c; c = c->next)
        n += c->uid == uid && strcmp(c->app_name, app) == 0;
    return n;
}

int ctx_count(const ctxmgr *cm)
{
    return cm->n;
}

ctx_entry *ctx_first(ctxmgr *cm)
{
    return cm->head;
}

int ctx_new_id(char id[CTX_ID_LEN + 1], char err[ERR_MAX])
{
    uint8_t raw[CTX_ID_LEN / 2];
    size_t got = 0;
    while (got < sizeof raw) {
        ssize_t r = getrandom(raw + got, sizeof raw - got, 0);
        if (r < 0 && errno != EINTR)
            return err_set(err, "getrandom: %s", strerror(errno));
        if (r > 0)
            got += (size_t)r;
    }
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < sizeof raw; i++) {
        id[2 * i] = hex[raw[i] >> 4];
        id[2 * i + 1] = hex[raw[i] & 15];
    }
    id[CTX_ID_LEN] = '\0';
    return 0;
}

int ctx_create(ctxmgr *cm, uint32_t uid, const char *app, const char *system_prompt,
               const Llms__GenerationParams *defaults, int64_t now_ms, ctx_entry **out,
               char err[ERR_MAX])
{
    ctx_entry *c = calloc(1, sizeof *c);
    uint8_t *params = NULL;
    size_t params_len = 0;
    if (!c)
        return err_set(err, "out of memory");
    kv_seq_init(&c->seq, cm->pool);
    c->uid = uid;
    c->app_name = strdup(app);
    c->system_prompt = system_prompt ? strdup(system_prompt) : NULL;
    c->created_ms = c->last_used_ms = now_ms;
    if (defaults) {
        params_len = llms__generation_params__get_packed_size(defaults);
        params = malloc(params_len ? params_len : 1);
        if (params) {
            llms__generation_params__pack(defaults, params);
            c->defaults = llms__generation_params__unpack(NULL, params_len, params);
        }
    }
    if (!c->app_name || (system_prompt && !c->system_prompt) ||
        (defaults && (!params || !c->defaults))) {
        err_set(err, "out of memory");
        goto fail;
    }
    if (ctx_new_id(c->id, err) || store_app_id(cm->st, uid, app, &c->app_id, err) ||
        store_context_create(cm->st, c->id, c->app_id, system_prompt, params, params_len,
                             now_ms, err))
        goto fail;
    free(params);
    list_append(cm, c);
    *out = c;
    return 0;
fail:
    free(params);
    entry_free(c);
    return -1;
}

int ctx_delete(ctxmgr *cm, ctx_entry *c, char err[ERR_MAX])
{
    bool found;
    if (store_context_delete(cm->st, c->id, &found, err))
        return -1;
    ctx_entry **pp = &cm->head, *prev = NULL;
    while (*pp != c) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    *pp = c->next;
    if (cm->tail == c)
        cm->tail = prev;
    cm->n--;
    entry_free(c);
    return 0;
}

int ctx_commit_turn(ctxmgr *cm, ctx_entry *c, const char *user_role, const char *user_text,
                    const int32_t *user_tokens, int n_user, const char *reply_text,
                    const int32_t *reply_tokens, int n_reply, int64_t now_ms,
                    char err[ERR_MAX])
{
    store_turn turns[2] = {
        {user_role, user_text, user_tokens, n_user},
        {"assistant", reply_text, reply_tokens, n_reply},
    };
    /* Reserve memory first so that a stored turn is always mirrored in memory. */
    int n0 = c->n_tokens, m0 = c->n_msgs;
    if (push_tokens(c, user_tokens, n_user) || push_tokens(c, reply_tokens, n_reply) ||
        push_msg(c, user_role, user_text, n_user) ||
        push_msg(c, "assistant", reply_text, n_reply)) {
        err_set(err, "out of memory");
        goto undo;
    }
    if (store_context_append(cm->st, c->id, turns, 2, now_ms, err))
        goto undo;
    c->last_used_ms = now_ms;
    return 0;
undo:
    c->n_tokens = n0;
    while (c->n_msgs > m0) {
        c->n_msgs--;
        free(c->msgs[c->n_msgs].role);
        free(c->msgs[c->n_msgs].text);
    }
    return -1;
}

void ctx_evict(ctxmgr *cm, ctx_entry *c)
{
    kv_seq_free(&c->seq);
    kv_seq_init(&c->seq, cm->pool);
}

size_t ctx_kv_bytes(const ctxmgr *cm, const ctx_entry *c)
{
    kv_shape shape = kv_pool_shape(cm->pool);
    size_t n = 0;
    for (int i = 0; i < c->seq.n_chunks; i++)
        if (c->seq.chunks[i])
            n += kv_chunk_data_bytes(shape, c->seq.chunks[i]->precision);
    return n;
}

size_t ctx_kv_bytes_total(const ctxmgr *cm)
{
    return kv_pool_bytes_used(cm->pool);
}

int ctx_count_resident(const ctxmgr *cm)
{
    int n = 0;
    for (const ctx_entry *c = cm->head; c; c = c->next)
        n += c->seq.n_chunks > 0;
    return n;
}

void ctx_enforce_budget(ctxmgr *cm, size_t budget)
{
    if (budget == 0)
        return;
    while (ctx_kv_bytes_total(cm) > budget) {
        ctx_entry *lru = NULL;
        for (ctx_entry *c = cm->head; c; c = c->next)
            if (!c->busy && c->seq.n_chunks > 0 && (!lru || c->last_used_ms < lru->last_used_ms))
                lru = c;
        if (!lru)
            return;
        ctx_evict(cm, lru);
    }
}
