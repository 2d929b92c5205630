/*
 * ctxmgr.c — a list of contexts, oldest first, mirrored in the store, and the memory
 * their KV chunks take: claim and reclaim under the budget (LCTRU), compression and
 * ahead-of-time swap-out after a call, chunk records at startup. Lookups scan the list:
 * the daemon keeps at most apps x max_contexts_per_app contexts and a scan is cheap next
 * to a decode step.
 */
#include "daemon/ctx/ctxmgr.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "daemon/ctx/ctxmem.h"
#include "daemon/ctx/swapout.h"
#include "engine/clock.h"
#include "storage/chunks.h"

static void ctx_writes_done(void *arg);

static void entry_free(ctx_entry *c)
{
    if (!c)
        return;
    kv_seq_free(&c->seq);
    free(c->map);
    free(c->disk_layers);
    free(c->layer_stats);
    free(c->attn);
    free(c->rows);
    free(c->app_name);
    free(c->system_prompt);
    free(c->model);
    free(c->damage);
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

static void entry_init_kv(ctxmgr *cm, ctx_entry *c)
{
    kv_seq_init(&c->seq, cm->pool);
    c->seq.fault = ctx_fault;
    c->seq.fault_arg = c;
    c->cm = cm;
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

static void list_remove(ctxmgr *cm, ctx_entry *c)
{
    ctx_entry **pp = &cm->head, *prev = NULL;
    while (*pp != c) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    *pp = c->next;
    if (cm->tail == c)
        cm->tail = prev;
    cm->n--;
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
    ctx_owns_fn owns;       /* NULL: every context of the store */
    void *owns_arg;
    store_window *windows;  /* (cap_windows) of the contexts in list order */
    int n_windows, cap_windows;
} load_state;

static int load_context(void *arg, const store_context *sc)
{
    load_state *ls = arg;
    if (ls->owns && !ls->owns(sc->model, ls->owns_arg))
        return 0;
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
    c->model = sc->model ? strdup(sc->model) : NULL;
    /* A row that does not match its checksum may hold any value: its defaults are not
     * decoded and its history is not read; its owner and model are kept as they read
     * (most likely right), so that its app sees it and can delete it. */
    const char *damage = sc->damage;
    if (!damage && sc->params && sc->params_len &&
        !(c->defaults = llms__generation_params__unpack(NULL, sc->params_len, sc->params)))
        damage = "its generation defaults (params) do not decode";
    c->damage = damage ? strdup(damage) : NULL;
    c->created_ms = sc->created_ms;
    c->last_used_ms = sc->last_used_ms;
    entry_init_kv(ls->cm, c);
    if (ls->n_windows == ls->cap_windows) {
        int cap = ls->cap_windows ? 2 * ls->cap_windows : 64;
        store_window *w = realloc(ls->windows, sizeof *w * (size_t)cap);
        if (w) {
            ls->windows = w;
            ls->cap_windows = cap;
        }
    }
    if (!c->app_name || (sc->system_prompt && !c->system_prompt) || (sc->model && !c->model) ||
        (damage && !c->damage) || ls->n_windows == ls->cap_windows) {
        entry_free(c);
        return err_set(ls->err, "out of memory");
    }
    /* Applied once the turns are read. */
    ls->windows[ls->n_windows++] = sc->window;
    /* The turns are read after the walk (one statement at a time on the store). */
    list_append(ls->cm, c);
    return 0;
}

/* Keeps c as damaged (why): its history as far as it was read goes, its stored rows
 * stay. -1 when there is no memory for it. */
static int entry_set_damage(ctx_entry *c, const char *why)
{
    char *damage = strdup(why);
    if (!damage)
        return -1;
    free(c->damage);
    c->damage = damage;
    for (int i = 0; i < c->n_msgs; i++) {
        free(c->msgs[i].role);
        free(c->msgs[i].text);
    }
    c->n_msgs = 0;
    c->n_tokens = 0;
    c->window_sink = 0;
    c->window_dropped = 0;
    return 0;
}

/* The admin's line about a damaged context: which, why, and what is left to do. */
static void log_damage(const ctx_entry *c)
{
    fprintf(stderr, "llmsd: error: context app=%u/%s id=%s is damaged: %s; its stored data is "
                    "kept as it is, and its calls fail until it is deleted\n",
            c->uid, c->app_name, c->id, c->damage);
}

int ctx_map_resize(ctx_entry *c, int n)
{
    if (n > c->cap_map || n > c->seq.cap) {
        int cap = c->cap_map > c->seq.cap ? c->cap_map : c->seq.cap;
        if (cap < 16)
            cap = 16;
        while (cap < n)
            cap *= 2;
        size_t n_layer = (size_t)c->cm->shape.n_layer;
        ctx_chunk *map = realloc(c->map, sizeof *map * (size_t)cap);
        if (!map)
            return -1;
        c->map = map;
        uint8_t *layers = realloc(c->disk_layers, n_layer * (size_t)cap);
        if (!layers)
            return -1;
        c->disk_layers = layers;
        kv_chunk_stats *stats = realloc(c->layer_stats, sizeof *stats * n_layer * (size_t)cap);
        if (!stats)
            return -1;
        c->layer_stats = stats;
        c->cap_map = cap;
        kv_chunk **slots = realloc(c->seq.chunks, sizeof *slots * (size_t)cap);
        if (!slots)
            return -1;
        c->seq.chunks = slots;
        c->seq.cap = cap;
    }
    for (int i = c->n_map; i < n; i++)
        c->map[i] = (ctx_chunk){.disk_precision = -1, .dirty = true, .k_spread = -1,
                                .v_spread = -1};
    for (int i = c->seq.n_chunks; i < n; i++)
        c->seq.chunks[i] = NULL;
    c->n_map = n;
    c->seq.n_chunks = n;
    return 0;
}

/* Room for n tokens of attention statistics (new ones zero). */
static int attn_reserve(ctx_entry *c, int n)
{
    if (n <= c->cap_attn)
        return 0;
    float *a = realloc(c->attn, sizeof *a * (size_t)n);
    if (a)
        c->attn = a;
    float *r = realloc(c->rows, sizeof *r * (size_t)n);
    if (r)
        c->rows = r;
    if (!a || !r)
        return -1;
    memset(a + c->cap_attn, 0, sizeof *a * (size_t)(n - c->cap_attn));
    memset(r + c->cap_attn, 0, sizeof *r * (size_t)(n - c->cap_attn));
    c->cap_attn = n;
    return 0;
}

/* Each call scales the attention statistics by this before adding its own rows: a
 * chunk's density follows what recent calls attend to, which predicts what the next ones
 * need better than the whole history's mean does (bench/kvquant). */
#define CTX_DENSITY_DECAY 0.25f

/* Whether the record of a stored chunk has the sections and size its precision gives:
 * one section per layer plus the token ids, and for KV_MIXED the layers' precisions
 * (n_layer bytes) after them, its size then between all layers at the narrowest and at
 * the widest precision (ctxload checks each section against the table). */
static bool record_well_formed(const ctxmgr *cm, const store_chunk *r)
{
    int n_layer = cm->shape.n_layer;
    int64_t tokens = (int64_t)sizeof(int32_t) * r->n_tokens;
    if (r->precision == KV_MIXED) {
        int64_t data = r->raw_bytes - tokens - n_layer;
        return r->n_sections == n_layer + 2 &&
               data >= (int64_t)kv_chunk_data_bytes(cm->shape, KV_INT2) &&
               data <= (int64_t)kv_chunk_data_bytes(cm->shape, KV_F16);
    }
    return kv_precision_valid(r->precision) && r->n_sections == n_layer + 1 &&
           r->raw_bytes ==
               (int64_t)kv_chunk_data_bytes(cm->shape, (enum kv_precision)r->precision) + tokens;
}

/* A stored chunk record is used only when it matches the history and the model: right
 * token count, and the sections and size of its precision. */
static int load_chunk_record(void *arg, const store_chunk *r)
{
    ctx_entry *c = arg;
    ctxmgr *cm = c->cm;
    if (r->index < 0 || r->n_tokens < 0 || !record_well_formed(cm, r)) {
        cm->stats.bad_blobs++;
        return 0;
    }
    /* A well-formed record of other tokens than the history's: written for a history
     * that a later turn extended before the chunk was written again. */
    if (r->index >= c->n_map || r->n_tokens != ctx_chunk_tokens(c->n_tokens, r->index)) {
        cm->stats.stale_blobs++;
        return 0;
    }
    ctx_chunk *k = &c->map[r->index];
    k->disk_precision = r->precision;
    k->disk_layers_known = false;
    k->disk_bytes = r->raw_bytes;
    k->dirty = false;
    k->density = r->density;
    float rows = (float)cm->heads_layers * CTX_DENSITY_ROWS;
    for (int t = 0; t < r->n_tokens; t++) {
        c->attn[r->index * KV_CHUNK_TOKENS + t] = r->density * rows;
        c->rows[r->index * KV_CHUNK_TOKENS + t] = rows;
    }
    return 0;
}

/* The attention statistics of a context's tokens as the store keeps them (opaque to
 * it): CTX_STATS_MAGIC, the token count n they are for, then attn (n) and rows (n),
 * native-endian u32 and f32 (a state directory does not move between machines). */
#define CTX_STATS_MAGIC 0x31535441u /* "ATS1" */

static size_t stats_size(int n_tokens)
{
    return 2 * sizeof(uint32_t) + 2 * sizeof(float) * (size_t)n_tokens;
}

/* c's statistics packed into a malloc'ed buffer of stats_size(c->n_tokens) bytes. */
static uint8_t *stats_pack(const ctx_entry *c)
{
    size_t n = (size_t)c->n_tokens;
    uint8_t *out = malloc(stats_size(c->n_tokens));
    if (!out)
        return NULL;
    uint32_t head[2] = {CTX_STATS_MAGIC, (uint32_t)n};
    memcpy(out, head, sizeof head);
    memcpy(out + sizeof head, c->attn, n * sizeof(float));
    memcpy(out + sizeof head + n * sizeof(float), c->rows, n * sizeof(float));
    return out;
}

/* Restores the statistics stored for c when they are for its history as loaded (same
 * token count), exactly as they were, and the chunks' densities from them; else
 * (none stored, or stored for a history a crash left behind) the densities of the
 * chunk rows stay. */
static int stats_load(ctxmgr *cm, ctx_entry *c, char err[ERR_MAX])
{
    void *bytes;
    size_t size;
    if (store_context_get_stats(cm->st, c->id, &bytes, &size, err))
        return -1;
    uint32_t head[2] = {0, 0};
    if (bytes && size >= sizeof head)
        memcpy(head, bytes, sizeof head);
    if (head[0] == CTX_STATS_MAGIC && head[1] == (uint32_t)c->n_tokens &&
        size == stats_size(c->n_tokens)) {
        const uint8_t *p = (const uint8_t *)bytes + sizeof head;
        memcpy(c->attn, p, (size_t)c->n_tokens * sizeof(float));
        memcpy(c->rows, p + (size_t)c->n_tokens * sizeof(float),
               (size_t)c->n_tokens * sizeof(float));
        for (int i = 0; i < c->n_map; i++)
            c->map[i].density = ctx_chunk_density(c, i);
    }
    free(bytes);
    return 0;
}

/* Stores c's statistics with the batch that writes its chunks, or alone when none does
 * (no batch of c is in flight then: a call waited for them before it began). A failure
 * leaves the stored ones older: densities then start from those after a restart. */
static void stats_store(ctxmgr *cm, ctx_entry *c, store_chunk_batch *batch)
{
    char err[ERR_MAX];
    uint8_t *bytes = stats_pack(c);
    if (!bytes)
        return;
    size_t n = stats_size(c->n_tokens);
    if (batch)
        store_chunk_batch_set_context_stats(batch, bytes, n, err);
    else
        store_context_set_stats(cm->st, c->id, bytes, n, err);
    free(bytes);
}

ctxmgr *ctx_open(store *s, kv_pool *pool, model_runner *runner, const model *m,
                 const ctx_policy *policy, char err[ERR_MAX])
{
    return ctx_open_owned(s, pool, runner, m, policy, NULL, NULL, err);
}

ctxmgr *ctx_open_owned(store *s, kv_pool *pool, model_runner *runner, const model *m,
                       const ctx_policy *policy, ctx_owns_fn owns, void *owns_arg,
                       char err[ERR_MAX])
{
    ctxmgr *cm = calloc(1, sizeof *cm);
    if (!cm) {
        err_set(err, "out of memory");
        return NULL;
    }
    cm->st = s;
    cm->pool = pool;
    cm->runner = runner;
    cm->m = m;
    cm->shape = kv_pool_shape(pool);
    cm->heads_layers = model_hparams_of(m)->n_layer * model_hparams_of(m)->n_head;
    cm->policy = *policy;
    cm->swap = swapout_new(ctx_writes_done, cm, err);
    if (!cm->swap) {
        free(cm);
        return NULL;
    }
    load_state ls = {.cm = cm, .err = err, .owns = owns, .owns_arg = owns_arg};
    int rc = store_context_list(s, -1, load_context, &ls, err);
    int k = 0;
    for (ctx_entry *c = cm->head, *next; rc == 0 && c; c = next, k++) {
        next = c->next;
        if (strcmp(c->app_name, CTX_PROFILE_APP) == 0) {
            rc = ctx_delete(cm, c, err);
            continue;
        }
        if (!c->damage) {
            rc = store_context_turns(s, c->id, load_turn, c, err);
            if (rc > 0)
                rc = err_set(err, "out of memory loading context %s", c->id);
            /* a window that does not fit the history is damage as well */
            if (rc == 0 && ctx_window_load(c, &ls.windows[k], err) != 0)
                rc = STORE_E_DAMAGED;
            if (rc == STORE_E_DAMAGED)
                rc = entry_set_damage(c, err) ? err_set(err, "out of memory") : 0;
        }
        if (rc == 0 && c->damage)
            log_damage(c);
    }
    free(ls.windows);
    if (rc == 0)
        rc = store_chunks_gc(s, NULL, err);
    for (ctx_entry *c = cm->head; rc == 0 && c; c = c->next) {
        /* its chunk records and statistics stay in the store, unread */
        if (c->damage)
            continue;
        if (ctx_map_resize(c, ctx_n_chunks(c->n_tokens)) || attn_reserve(c, c->n_tokens)) {
            rc = err_set(err, "out of memory loading context %s", c->id);
            break;
        }
        rc = store_chunk_list(s, c->id, load_chunk_record, c, err);
        if (rc == 0)
            rc = stats_load(cm, c, err);
    }
    if (rc == 0)
        rc = ctx_cost_init(cm, err);
    if (rc == 0)
        rc = ctx_calib_load(cm, err);
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
    ctx_flush_writes(cm);
    ctx_cost_save(cm);
    swapout_free(cm->swap);
    ctx_entry *c = cm->head;
    while (c) {
        ctx_entry *next = c->next;
        entry_free(c);
        c = next;
    }
    ctx_calib_drop(cm);
    free(cm->layer_factors);
    free(cm);
}

const ctx_policy *ctx_get_policy(const ctxmgr *cm)
{
    return &cm->policy;
}

void ctx_set_policy(ctxmgr *cm, const ctx_policy *policy)
{
    cm->policy = *policy;
}

const ctx_stats *ctx_get_stats(const ctxmgr *cm)
{
    return &cm->stats;
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

int ctx_count_damaged(const ctxmgr *cm)
{
    int n = 0;
    for (const ctx_entry *c = cm->head; c; c = c->next)
        n += c->damage != NULL;
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
    entry_init_kv(cm, c);
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

int ctx_set_overflow(ctxmgr *cm, ctx_entry *c, enum ctx_overflow overflow, char err[ERR_MAX])
{
    store_window w = {.overflow = (int)overflow, .sink = c->window_sink,
                      .dropped = c->window_dropped, .slides = (int64_t)c->window_slides};
    if (store_context_set_window(cm->st, c->id, &w, err))
        return -1;
    c->overflow = overflow;
    return 0;
}

int ctx_set_model(ctxmgr *cm, ctx_entry *c, const char *model, char err[ERR_MAX])
{
    char *copy = strdup(model);
    if (!copy)
        return err_set(err, "out of memory");
    if (store_context_set_model(cm->st, c->id, model, err)) {
        free(copy);
        return -1;
    }
    free(c->model);
    c->model = copy;
    return 0;
}

int ctx_delete(ctxmgr *cm, ctx_entry *c, char err[ERR_MAX])
{
    bool found;
    ctx_wait_writes(cm, c);
    if (store_context_delete(cm->st, c->id, &found, err))
        return -1;
    list_remove(cm, c);
    entry_free(c);
    return 0;
}

void ctx_forget(ctxmgr *cm, ctx_entry *c)
{
    ctx_evict(cm, c);
    ctx_wait_writes(cm, c);
    list_remove(cm, c);
    entry_free(c);
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
    if (c->call_slides == 0) {
        if (store_context_append(cm->st, c->id, turns, 2, now_ms, err))
            goto undo;
    } else {
        store_window w = {.overflow = (int)c->overflow, .sink = c->call_sink,
                          .dropped = c->window_dropped + c->call_dropped,
                          .slides = (int64_t)c->window_slides + c->call_slides};
        if (store_context_append_window(cm->st, c->id, turns, 2, &w,
                                        c->call_sink / KV_CHUNK_TOKENS, now_ms, err))
            goto undo;
        int sink = c->call_sink, drop = c->call_dropped;
        memmove(c->tokens + sink, c->tokens + sink + drop,
                sizeof *c->tokens * (size_t)(c->n_tokens - sink - drop));
        c->n_tokens -= drop;
        c->window_sink = sink;
        c->window_dropped = w.dropped;
        c->window_slides = (uint64_t)w.slides;
    }
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

/* ---- chunks: write and drop ---- */

/* Whether resident chunk i has to be written before it may be dropped. */
static bool chunk_needs_write(const ctx_entry *c, int i)
{
    const kv_chunk *k = c->seq.chunks[i];
    return k && (c->map[i].dirty || c->map[i].disk_precision != (int)k->precision);
}

/* Sections a chunk's blob may have: one per layer, the token ids, the layers'
 * precisions. */
static int blob_max_sections(const ctxmgr *cm)
{
    return cm->shape.n_layer + 2;
}

/* Describes resident chunk i as a blob: one section per layer (each of its layer's
 * precision), then its token ids (a blob is used only for the tokens it was computed
 * from), then for a KV_MIXED chunk its layers' precisions (n_layer bytes: what sizes the
 * sections have). Uniform chunks keep the layout blobs had before layers could differ.
 * sec and bytes hold blob_max_sections entries. Until the write succeeds, a stored
 * version of other content is not to be used. */
static void chunk_blob(ctxmgr *cm, ctx_entry *c, int i, store_chunk_blob *b, const void **sec,
                       size_t *bytes)
{
    const kv_chunk *k = c->seq.chunks[i];
    int n_layer = cm->shape.n_layer;
    bool mixed = k->precision == KV_MIXED;
    for (int l = 0; l < n_layer; l++) {
        sec[l] = kv_chunk_layer(k, cm->shape, l);
        bytes[l] = kv_chunk_section_bytes(k, cm->shape, l);
    }
    sec[n_layer] = k->tokens;
    bytes[n_layer] = sizeof(int32_t) * (size_t)k->n_tokens;
    sec[n_layer + 1] = k->layer_precision;
    bytes[n_layer + 1] = (size_t)n_layer;
    *b = (store_chunk_blob){
        .meta = {.index = i, .precision = (int)k->precision, .n_tokens = k->n_tokens,
                 .density = c->map[i].density, .last_used_ms = c->last_used_ms},
        .sections = sec,
        .section_bytes = bytes,
        .n_sections = n_layer + 1 + mixed,
    };
    if (c->map[i].dirty)
        c->map[i].disk_precision = -1;
}

static void chunk_written(ctxmgr *cm, ctx_entry *c, const store_chunk_blob *b)
{
    const store_chunk *meta = &b->meta;
    ctx_chunk *k = &c->map[meta->index];
    int n_layer = cm->shape.n_layer;
    k->disk_precision = meta->precision;
    k->disk_layers_known = meta->precision == KV_MIXED;
    if (k->disk_layers_known)
        memcpy(c->disk_layers + (size_t)meta->index * n_layer, b->sections[n_layer + 1],
               (size_t)n_layer);
    k->disk_bytes = meta->raw_bytes;
    k->dirty = false;
    cm->stats.chunks_written++;
    cm->stats.bytes_written += (uint64_t)meta->raw_bytes;
}

/* Writes resident chunk i. */
static int chunk_write(ctxmgr *cm, ctx_entry *c, int i, char err[ERR_MAX])
{
    if (blob_max_sections(cm) > STORE_CHUNK_MAX_SECTIONS)
        return err_set(err, "a chunk of %d layers does not fit a blob", cm->shape.n_layer);
    const void *sec[STORE_CHUNK_MAX_SECTIONS];
    size_t bytes[STORE_CHUNK_MAX_SECTIONS];
    store_chunk_blob b;
    chunk_blob(cm, c, i, &b, sec, bytes);
    if (store_chunk_write_batch(cm->st, c->id, &b, 1, err))
        return -1;
    chunk_written(cm, c, &b);
    return 0;
}

/* ---- ahead-of-time writes on the swap-out thread ---- */

/* One background write of a context's modified chunks: the batch and the arrays it
 * points into, all owned here until the worker ends it. */
typedef struct ctx_write {
    swapout_job job;          /* first member: a taken job is its ctx_write */
    ctx_entry *c;
    store_chunk_blob *blobs;  /* (n) */
    const void **sec;         /* (n, blob_max_sections) each blob's sections */
    size_t *bytes;            /* (n, blob_max_sections) */
    int n;
} ctx_write;

static void ctx_write_free(ctx_write *w)
{
    if (!w)
        return;
    free(w->blobs);
    free(w->sec);
    free(w->bytes);
    free(w);
}

/* The swap-out thread finished a job: whoever waits for news is told. */
static void ctx_writes_done(void *arg)
{
    ctxmgr *cm = arg;
    void (*notify)(void *) = atomic_load(&cm->notify);
    if (notify)
        notify(cm->notify_arg);
}

void ctx_set_write_notify(ctxmgr *cm, void (*notify)(void *arg), void *arg)
{
    cm->notify_arg = arg;
    atomic_store(&cm->notify, notify);
}

/* The blobs of every resident chunk of c that needs writing, in *out (NULL when none
 * does). */
static int pending_write_new(ctxmgr *cm, ctx_entry *c, ctx_write **out, char err[ERR_MAX])
{
    *out = NULL;
    int n_sec = blob_max_sections(cm), n = 0;
    if (n_sec > STORE_CHUNK_MAX_SECTIONS)
        return err_set(err, "a chunk of %d layers does not fit a blob", cm->shape.n_layer);
    for (int i = 0; i < c->seq.n_chunks && i < c->n_map; i++)
        n += chunk_needs_write(c, i);
    if (n == 0)
        return 0;
    ctx_write *w = calloc(1, sizeof *w);
    if (w) {
        w->blobs = malloc(sizeof *w->blobs * (size_t)n);
        w->sec = malloc(sizeof *w->sec * (size_t)n * (size_t)n_sec);
        w->bytes = malloc(sizeof *w->bytes * (size_t)n * (size_t)n_sec);
    }
    if (!w || !w->blobs || !w->sec || !w->bytes) {
        ctx_write_free(w);
        return err_set(err, "out of memory");
    }
    w->c = c;
    for (int i = 0; i < c->seq.n_chunks && i < c->n_map; i++)
        if (chunk_needs_write(c, i)) {
            size_t at = (size_t)w->n * (size_t)n_sec;
            chunk_blob(cm, c, i, &w->blobs[w->n], w->sec + at, w->bytes + at);
            w->n++;
        }
    *out = w;
    return 0;
}

/* Queues every resident chunk of c that needs writing as one batch for the swap-out
 * thread; c's chunks must not change until the batch is ended (ctx_wait_writes). */
static int write_pending_background(ctxmgr *cm, ctx_entry *c, char err[ERR_MAX])
{
    ctx_write *w;
    if (pending_write_new(cm, c, &w, err))
        return -1;
    if (!w) {
        stats_store(cm, c, NULL);
        return 0;
    }
    w->job.batch = store_chunk_batch_begin(cm->st, c->id, w->blobs, w->n, err);
    if (!w->job.batch) {
        ctx_write_free(w);
        return -1;
    }
    stats_store(cm, c, w->job.batch);
    w->job.owner = c;
    c->n_writing++;
    swapout_submit(cm->swap, &w->job);
    return 0;
}

void ctx_collect_writes(ctxmgr *cm)
{
    swapout_job *j = swapout_take_done(cm->swap);
    while (j) {
        swapout_job *next = j->next;
        ctx_write *w = (ctx_write *)j;
        char err[ERR_MAX];
        /* a batch whose write failed is only freed here; its chunks stay dirty: written
         * when reclaimed, or recomputed. An admin learns of it once per run of failures
         * (a full disk fails every batch), not from the counter alone. */
        if (store_chunk_batch_end(cm->st, j->batch, err) == 0) {
            for (int k = 0; k < w->n; k++)
                chunk_written(cm, w->c, &w->blobs[k]);
            if (cm->writes_failing)
                fprintf(stderr, "llmsd: warn: context chunks are written to the store again\n");
            cm->writes_failing = false;
        } else {
            cm->stats.write_failures++;
            if (!cm->writes_failing)
                fprintf(stderr, "llmsd: warn: context chunks could not be written to the store "
                                "(%s): contexts keep their KV in memory, or recompute it, "
                                "until writes succeed\n", err);
            cm->writes_failing = true;
        }
        w->c->n_writing--;
        ctx_write_free(w);
        j = next;
    }
}

void ctx_wait_writes(ctxmgr *cm, ctx_entry *c)
{
    if (c->n_writing == 0)
        return;
    double t0 = clock_mono_ms();
    swapout_wait_owner(cm->swap, c);
    ctx_collect_writes(cm);
    cm->stats.write_waits++;
    cm->stats.write_wait_ms += clock_mono_ms() - t0;
}

void ctx_flush_writes(ctxmgr *cm)
{
    swapout_wait_owner(cm->swap, NULL);
    ctx_collect_writes(cm);
}

int ctx_writes_pending(ctxmgr *cm)
{
    return swapout_n_pending(cm->swap);
}

/* Writes every resident chunk of c that needs it now, in one batch that shares its syncs
 * and one catalog transaction. A batch that fails leaves its chunks dirty. */
static int write_pending(ctxmgr *cm, ctx_entry *c, char err[ERR_MAX])
{
    ctx_write *w;
    if (pending_write_new(cm, c, &w, err))
        return -1;
    if (!w)
        return 0;
    int rc = store_chunk_write_batch(cm->st, c->id, w->blobs, w->n, err);
    if (rc == 0)
        for (int k = 0; k < w->n; k++)
            chunk_written(cm, c, &w->blobs[k]);
    ctx_write_free(w);
    return rc;
}

/* Drops resident chunk i, writing it first when the store lacks it and swap-out is on;
 * a chunk that could not be written is later recomputed. */
static void chunk_drop(ctxmgr *cm, ctx_entry *c, int i)
{
    char err[ERR_MAX];
    bool stored = !chunk_needs_write(c, i) ||
                  (cm->policy.swap != CTX_SWAP_NONE && chunk_write(cm, c, i, err) == 0);
    if (!stored && c->map[i].dirty)
        c->map[i].disk_precision = -1;
    kv_chunk_free(cm->pool, c->seq.chunks[i]);
    c->seq.chunks[i] = NULL;
    cm->stats.chunks_reclaimed++;
}

void ctx_evict(ctxmgr *cm, ctx_entry *c)
{
    char err[ERR_MAX];
    if (c->busy)
        return;
    ctx_wait_writes(cm, c);
    if (cm->policy.swap != CTX_SWAP_NONE)
        write_pending(cm, c, err);
    for (int i = 0; i < c->seq.n_chunks; i++)
        if (c->seq.chunks[i])
            chunk_drop(cm, c, i);
}

/* ---- budget: claim and LCTRU reclaim ---- */

typedef struct victim {
    ctx_entry *c;
    int index;
    size_t bytes; /* of its resident data: its precision's weight */
    uint64_t last_use;
} victim;

/* LCTRU: the heaviest precision first (f16, then the widest codes), then least recently
 * used. */
static int victim_lctru(const void *a, const void *b)
{
    const victim *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes > y->bytes ? -1 : 1;
    if (x->last_use != y->last_use)
        return x->last_use < y->last_use ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* Whole contexts: the least recently used context's chunks together. */
static int victim_lru_context(const void *a, const void *b)
{
    const victim *x = a, *y = b;
    if (x->c->last_used_ms != y->c->last_used_ms)
        return x->c->last_used_ms < y->c->last_used_ms ? -1 : 1;
    if (x->c != y->c)
        return strcmp(x->c->id, y->c->id);
    return x->index < y->index ? -1 : x->index > y->index;
}

void ctx_budget_also_counts(ctxmgr *cm, kv_pool *pool)
{
    cm->also = pool;
}

void ctx_set_shed(ctxmgr *cm, size_t (*shed)(void *arg, size_t bytes), void *arg)
{
    cm->shed = shed;
    cm->shed_arg = arg;
}

/* The resident KV the budget holds: the pool's and the other counted one's. */
static size_t resident_bytes(const ctxmgr *cm)
{
    return kv_pool_bytes_used(cm->pool) + (cm->also ? kv_pool_bytes_used(cm->also) : 0);
}

/* The spare buffers the budget holds. */
static size_t spare_bytes(const ctxmgr *cm)
{
    return kv_pool_spare_bytes(cm->pool) + (cm->also ? kv_pool_spare_bytes(cm->also) : 0);
}

/* Frees spare buffers beyond what keeps resident + spare within target: the pool's
 * first, then the other counted one's. */
static void trim_spares_to(ctxmgr *cm, size_t target)
{
    size_t used = resident_bytes(cm), room = used < target ? target - used : 0;
    kv_pool_trim_spares(cm->pool, room);
    if (cm->also) {
        size_t own = kv_pool_spare_bytes(cm->pool);
        kv_pool_trim_spares(cm->also, room > own ? room - own : 0);
    }
}

/* Drops unlocked chunks in LCTRU order until the resident KV and the spare buffers
 * together are at most target bytes (spares go first). Returns whether it got there. */
static bool reclaim_to(ctxmgr *cm, size_t target)
{
    trim_spares_to(cm, target);
    if (resident_bytes(cm) <= target)
        return true;
    if (cm->shed) {
        cm->shed(cm->shed_arg, resident_bytes(cm) - target);
        trim_spares_to(cm, target);
        if (resident_bytes(cm) <= target)
            return true;
    }
    size_t n = 0;
    for (ctx_entry *c = cm->head; c; c = c->next)
        if (!c->busy)
            for (int i = 0; i < c->seq.n_chunks; i++)
                n += c->seq.chunks[i] != NULL;
    victim *v = n ? malloc(sizeof *v * n) : NULL;
    if (!v)
        return false;
    size_t k = 0;
    for (ctx_entry *c = cm->head; c; c = c->next)
        if (!c->busy)
            for (int i = 0; i < c->seq.n_chunks; i++)
                if (c->seq.chunks[i])
                    v[k++] = (victim){
                        c, i, kv_chunk_bytes(cm->shape, c->seq.chunks[i]),
                        i < c->n_map ? c->map[i].last_use : 0};
    bool whole = cm->policy.whole_context;
    qsort(v, n, sizeof *v, whole ? victim_lru_context : victim_lctru);
    for (k = 0; k < n; k++) {
        bool same_context = whole && k > 0 && v[k].c == v[k - 1].c;
        if (resident_bytes(cm) <= target && !same_context)
            break;
        ctx_wait_writes(cm, v[k].c);
        chunk_drop(cm, v[k].c, v[k].index);
        trim_spares_to(cm, target);
    }
    free(v);
    return resident_bytes(cm) + spare_bytes(cm) <= target;
}

int ctx_claim(ctxmgr *cm, size_t bytes, char err[ERR_MAX])
{
    size_t budget = cm->policy.budget_bytes;
    if (budget == 0)
        return 0;
    if (bytes <= budget && reclaim_to(cm, budget - bytes))
        return 0;
    /* a calibration waiting for idle time gives its copies up to real work */
    if (cm->calib && bytes <= budget) {
        ctx_calib_drop(cm);
        if (reclaim_to(cm, budget - bytes))
            return 0;
    }
    err_set(err, "the KV budget (%zu bytes) cannot hold %zu more bytes beside the %zu of "
            "running calls", budget, bytes, resident_bytes(cm));
    return CTX_E_BUDGET;
}

size_t ctx_budget_room(const ctxmgr *cm)
{
    size_t budget = cm->policy.budget_bytes, used = resident_bytes(cm);
    return budget == 0 ? SIZE_MAX : used < budget ? budget - used : 0;
}

void ctx_enforce_budget(ctxmgr *cm)
{
    if (cm->policy.budget_bytes)
        reclaim_to(cm, cm->policy.budget_bytes);
}

size_t ctx_squeeze(ctxmgr *cm, kv_seq *seq, int from)
{
    char err[ERR_MAX];
    if (cm->policy.compress == CTX_COMPRESS_NONE)
        return 0;
    size_t before = kv_pool_bytes_used(cm->pool);
    for (int i = from < 0 ? 0 : from; i < seq->n_chunks; i++) {
        kv_chunk *k = seq->chunks[i];
        /* a failed conversion leaves the chunk f16, still correct: the claim then fails */
        if (k && k->precision == KV_F16 && k->n_tokens == KV_CHUNK_TOKENS)
            kv_chunk_convert(cm->pool, k, KV_INT8, err);
    }
    size_t after = kv_pool_bytes_used(cm->pool);
    if (cm->policy.budget_bytes)
        trim_spares_to(cm, cm->policy.budget_bytes);
    return before > after ? before - after : 0;
}

size_t ctx_append_bytes(const kv_seq *seq, int n)
{
    kv_shape shape = kv_pool_shape(seq->pool);
    int room = 0;
    size_t extra = 0;
    const kv_chunk *last = seq->n_chunks ? seq->chunks[seq->n_chunks - 1] : NULL;
    if (last && last->n_tokens < KV_CHUNK_TOKENS) {
        room = KV_CHUNK_TOKENS - last->n_tokens;
        if (last->precision != KV_F16)
            extra = kv_chunk_data_bytes(shape, KV_F16) - kv_chunk_bytes(shape, last);
    }
    int more = n > room ? ctx_n_chunks(n - room) : 0;
    return extra + (size_t)more * kv_chunk_data_bytes(shape, KV_F16);
}

int ctx_claim_append(ctxmgr *cm, const kv_seq *seq, int n, char err[ERR_MAX])
{
    return ctx_claim(cm, ctx_append_bytes(seq, n), err);
}

/* ---- calls ---- */

int ctx_call_begin(ctxmgr *cm, ctx_entry *c, int max_tokens, ctx_load_stats *st,
                   char err[ERR_MAX])
{
    ctx_load_stats local;
    if (!st)
        st = &local;
    *st = (ctx_load_stats){0};
    if (c->damage)
        return err_set(err, "context %s is damaged: %s", c->id, c->damage);
    /* The call appends to the chunks, recompresses them and may fault some in. */
    ctx_wait_writes(cm, c);
    c->busy = true;
    c->loaded = false;
    if (attn_reserve(c, max_tokens > c->n_tokens ? max_tokens : c->n_tokens) ||
        ctx_map_resize(c, ctx_n_chunks(c->n_tokens))) {
        c->busy = false;
        return err_set(err, "out of memory");
    }
    double t0 = clock_mono_ms();
    int rc = c->n_map ? ctx_load_range(cm, c, c->n_map - 1, st, err) : 0;
    /* The whole context must fit, also when it was resident already. */
    if (rc == 0)
        rc = ctx_claim(cm, 0, err);
    if (rc) {
        c->busy = false;
        return rc;
    }
    st->ms = clock_mono_ms() - t0;
    cm->stats.switch_ins++;
    cm->stats.switch_in_ms += st->ms;
    cm->stats.last_switch_in_ms = st->ms;
    c->loaded = true;
    c->call_base = c->n_tokens;
    c->call_sink = c->window_sink;
    c->call_dropped = 0;
    c->call_slides = 0;
    for (int p = 0; p < c->n_tokens; p++) {
        c->attn[p] *= CTX_DENSITY_DECAY;
        c->rows[p] *= CTX_DENSITY_DECAY;
    }
    return 0;
}

int ctx_forward_check(const ctx_entry *c, const model_batch *b, char err[ERR_MAX])
{
    int from = kv_seq_n_tokens(&c->seq), n = b->n_tokens;
    if (!c->loaded)
        return err_set(err, "context %s: forward outside a call", c->id);
    if (n < 1 || b->positions[0] != from || from + n > c->cap_attn)
        return err_set(err, "context %s: batch does not continue the context", c->id);
    return 0;
}

void ctx_forward_account(ctxmgr *cm, ctx_entry *c, int from, int n)
{
    /* Every row of the batch could attend to every earlier entry, and row r of the
     * batch to the batch's entries up to itself. */
    float hl = (float)cm->heads_layers;
    for (int p = 0; p < from; p++)
        c->rows[p] += hl * (float)n;
    for (int p = from; p < from + n; p++)
        c->rows[p] += hl * (float)(from + n - p);
}

void ctx_forward_unwind(ctx_entry *c, int keep)
{
    int end = kv_seq_n_tokens(&c->seq);
    if (end <= keep)
        return;
    kv_seq_truncate(&c->seq, keep);
    for (int p = keep; p < end && p < c->cap_attn; p++)
        c->attn[p] = c->rows[p] = 0;
}

int ctx_forward(ctxmgr *cm, ctx_entry *c, const model_batch *b, char err[ERR_MAX])
{
    if (ctx_forward_check(c, b, err))
        return -1;
    int from = kv_seq_n_tokens(&c->seq);
    int rc = ctx_claim_append(cm, &c->seq, b->n_tokens, err);
    if (rc)
        return rc;
    model_batch bb = *b;
    bb.attn_received = c->attn;
    if (model_forward(cm->runner, &c->seq, &bb, err))
        return -1;
    ctx_forward_account(cm, c, from, b->n_tokens);
    return 0;
}

/* The mean of the layers' spreads is kv_chunk_spread's: every layer has as many
 * blocks. */
void ctx_chunk_spreads(ctxmgr *cm, ctx_entry *c, int i)
{
    ctx_chunk *k = &c->map[i];
    int n_layer = cm->shape.n_layer;
    if (k->k_spread >= 0 || !c->seq.chunks[i])
        return;
    kv_chunk_stats *ls = c->layer_stats + (size_t)i * n_layer;
    double ks = 0, vs = 0, vbs = 0;
    for (int l = 0; l < n_layer; l++) {
        kv_chunk_layer_spread(cm->pool, c->seq.chunks[i], l, &ls[l].k_spread, &ls[l].v_spread,
                              &ls[l].vb_spread);
        ks += ls[l].k_spread / n_layer;
        vs += ls[l].v_spread / n_layer;
        vbs += ls[l].vb_spread / n_layer;
    }
    k->k_spread = (float)ks;
    k->v_spread = (float)vs;
    k->vb_spread = (float)vbs;
}

float ctx_chunk_density(const ctx_entry *c, int i)
{
    double sum = 0;
    int nt = ctx_chunk_tokens(c->n_tokens, i);
    for (int t = 0; t < nt; t++) {
        int p = i * KV_CHUNK_TOKENS + t;
        if (c->rows[p] > 0)
            sum += c->attn[p] / c->rows[p];
    }
    return nt ? (float)(sum / nt) : 0;
}

/* What a chunk whose spreads are unknown (not resident, not measured) is taken to have. */
static kv_chunk_stats unknown_spread(float density)
{
    return (kv_chunk_stats){.density = density};
}

/* Densities of c's chunks, then the precisions of every full chunk's layers, level
 * (n_map, n_layer): in tolerance mode the full chunks share kv_compress_ratio times the
 * bytes they would take as int8, per (chunk, layer) once the model's layers are
 * calibrated, per chunk before; the others f16. */
static void assign_levels(ctxmgr *cm, ctx_entry *c, uint8_t *level)
{
    int n_full = c->n_tokens / KV_CHUNK_TOKENS, n_layer = cm->shape.n_layer;
    bool per_layer = cm->layer_factors != NULL;
    size_t n_stats = (size_t)(n_full ? n_full : 1) * (per_layer ? (size_t)n_layer : 1);
    kv_chunk_stats *stats = malloc(sizeof *stats * n_stats);
    enum kv_precision *chunk_level = malloc(sizeof *chunk_level * (size_t)(n_full ? n_full : 1));
    memset(level, KV_F16, (size_t)c->n_map * n_layer);
    for (int i = 0; i < c->n_map; i++) {
        ctx_chunk *k = &c->map[i];
        k->density = ctx_chunk_density(c, i);
        if (i >= n_full || !stats)
            continue;
        ctx_chunk_spreads(cm, c, i);
        bool known = k->k_spread >= 0;
        if (per_layer)
            for (int l = 0; l < n_layer; l++) {
                kv_chunk_stats *st = &stats[(size_t)i * n_layer + l];
                *st = known ? c->layer_stats[(size_t)i * n_layer + l]
                            : unknown_spread(k->density);
                st->density = k->density;
            }
        else
            stats[i] = known ? (kv_chunk_stats){.density = k->density,
                                                .k_spread = k->k_spread,
                                                .v_spread = k->v_spread,
                                                .vb_spread = k->vb_spread}
                             : unknown_spread(k->density);
    }
    size_t budget = (size_t)(cm->policy.compress_ratio * (double)n_full *
                             (double)kv_chunk_data_bytes(cm->shape, KV_INT8));
    switch (cm->policy.compress) {
    case CTX_COMPRESS_NONE:
        break;
    case CTX_COMPRESS_INT8:
        memset(level, KV_INT8, (size_t)n_full * n_layer);
        break;
    case CTX_COMPRESS_TOLERANCE:
        if (!stats || !chunk_level) {
            memset(level, KV_INT8, (size_t)n_full * n_layer);
        } else if (per_layer) {
            kv_calib_apply(cm->shape, cm->layer_factors, n_full, stats, stats);
            kv_assign_layer_precisions(cm->shape, stats, n_full, budget, true, level);
        } else {
            kv_assign_precisions(cm->shape, stats, n_full, budget, true, chunk_level);
            for (int i = 0; i < n_full; i++)
                memset(level + (size_t)i * n_layer, (int)chunk_level[i], (size_t)n_layer);
        }
        break;
    }
    free(stats);
    free(chunk_level);
}

/* At most this many chunks are recomputed per call to widen their codes, so that the
 * AoT work after a reply stays bounded (16 tokens each). */
#define CTX_PROMOTE_MAX 4

/* A chunk is promoted when its assigned precision takes this much more room than the
 * one it keeps: smaller changes are not worth a recompute. */
#define CTX_PROMOTE_GROWTH 1.25

/* A chunk the store holds as it is resident is made lighter only when that shrinks it
 * by this factor: smaller changes are not worth a rewrite (a file and a sync). As a
 * context grows and its older chunks' densities decay, the assignment moves many of
 * them down a notch at each call, typically one layer's K or V by a bit (under 2% of
 * the chunk); converting each at once rewrote most of a context after every call
 * (bench/ctxswitch on docs-lm-21M: 25 of 28 chunk files a call), and the writes still
 * running when the next call came were waited for. The chunks then hold up to this
 * much more than assigned. */
#define CTX_NARROW_SHRINK 1.1

/*
 * Compressed chunks whose assigned precision is clearly wider than what they keep have
 * become important again; lost bits come back only from recomputing them (from their
 * tokens, attending to the chunks before them), which this does for the densest
 * CTX_PROMOTE_MAX of them, then gives them their assigned precision. A chunk that cannot
 * be recomputed now (budget) is recomputed at the next call, as any missing chunk is.
 */
static void promote_chunks(ctxmgr *cm, ctx_entry *c, const uint8_t *level)
{
    char err[ERR_MAX];
    int pick[CTX_PROMOTE_MAX], n_pick = 0;
    int n_full = c->n_tokens / KV_CHUNK_TOKENS, n_layer = cm->shape.n_layer;
    for (int i = 0; i < n_full && i < c->n_map; i++) {
        kv_chunk *k = c->seq.chunks[i];
        if (!k || k->precision == KV_F16 ||
            (double)kv_layers_data_bytes(cm->shape, level + (size_t)i * n_layer) <
                CTX_PROMOTE_GROWTH * (double)kv_chunk_bytes(cm->shape, k))
            continue;
        int at = n_pick < CTX_PROMOTE_MAX ? n_pick++ : CTX_PROMOTE_MAX;
        while (at > 0 && c->map[pick[at - 1]].density < c->map[i].density) {
            if (at < CTX_PROMOTE_MAX)
                pick[at] = pick[at - 1];
            at--;
        }
        if (at < CTX_PROMOTE_MAX)
            pick[at] = i;
    }
    for (int j = 0; j < n_pick; j++) {
        int i = pick[j];
        kv_chunk_free(cm->pool, c->seq.chunks[i]);
        c->seq.chunks[i] = NULL;
        /* the stored copy is the narrow one: recompute, and write the new one later */
        c->map[i].disk_precision = -1;
        c->map[i].dirty = true;
        c->map[i].k_spread = c->map[i].v_spread = -1;
        if (ctx_load_range(cm, c, i, NULL, err) || !c->seq.chunks[i])
            continue;
        kv_chunk_convert_layers(cm->pool, c->seq.chunks[i], level + (size_t)i * n_layer, err);
        cm->stats.chunks_promoted++;
    }
}

/* The last token of a reply is sampled but not evaluated: it is evaluated now, so that
 * the KV covers the whole history and the chunks written are complete. When that fails
 * the incomplete tail chunk is dropped (recomputed at the next call). */
static void complete_tail(ctxmgr *cm, ctx_entry *c)
{
    char err[ERR_MAX];
    int from = kv_seq_n_tokens(&c->seq), n = c->n_tokens - from;
    if (n <= 0)
        return;
    int32_t *pos = malloc(sizeof *pos * (size_t)n);
    int rc = -1;
    if (pos) {
        for (int i = 0; i < n; i++)
            pos[i] = from + i;
        model_batch b = {.n_tokens = n, .tokens = c->tokens + from, .positions = pos};
        rc = ctx_forward(cm, c, &b, err);
        free(pos);
    }
    if (rc) {
        int i = from / KV_CHUNK_TOKENS;
        kv_seq_truncate(&c->seq, i * KV_CHUNK_TOKENS);
    }
}

void ctx_call_end(ctxmgr *cm, ctx_entry *c, bool committed)
{
    char err[ERR_MAX];
    if (c->loaded && c->call_slides)
        ctx_window_call_end(c, committed);
    if (committed && c->loaded)
        complete_tail(cm, c);
    if (!committed) {
        if (c->loaded && kv_seq_n_tokens(&c->seq) > c->n_tokens)
            kv_seq_truncate(&c->seq, c->n_tokens);
        /* What the call's rows gave the entries after the history described tokens that
         * are gone: the next call's tokens at those positions start from nothing (the
         * model adds into attn, ctx_forward_account into rows). */
        for (int p = c->n_tokens; p < c->cap_attn; p++)
            c->attn[p] = c->rows[p] = 0;
        /* A squeeze (ctx_squeeze from the chunk of the call's first token) may have
         * compressed the chunk that ends the history together with the call's tokens:
         * its history rows lost bits that only the store or a recompute give back, so
         * it goes, as a reclaimed chunk does. */
        int tail = c->n_tokens / KV_CHUNK_TOKENS;
        kv_chunk *k = c->n_tokens % KV_CHUNK_TOKENS && tail < c->seq.n_chunks
                          ? c->seq.chunks[tail]
                          : NULL;
        if (k && k->precision != KV_F16) {
            kv_chunk_free(cm->pool, k);
            c->seq.chunks[tail] = NULL;
            if (tail < c->n_map && c->map[tail].dirty)
                c->map[tail].disk_precision = -1;
        }
    } else if (ctx_map_resize(c, ctx_n_chunks(c->n_tokens))) {
        /* Out of memory for the map: the KV beyond it is dropped (recomputed later). */
        int keep = c->n_map * KV_CHUNK_TOKENS;
        kv_seq_truncate(&c->seq, keep < c->n_tokens ? keep : c->n_tokens);
        if (c->n_map)
            c->map[c->n_map - 1].dirty = true;
    } else {
        int base = c->call_slides && c->call_sink < c->call_base ? c->call_sink : c->call_base;
        for (int i = base / KV_CHUNK_TOKENS; i < c->n_map; i++) {
            c->map[i].dirty = true;
            c->map[i].k_spread = c->map[i].v_spread = -1;
        }
        if (cm->policy.compress == CTX_COMPRESS_TOLERANCE)
            ctx_calib_maybe(cm, c);
        int n_layer = cm->shape.n_layer;
        uint8_t *level = malloc((size_t)(c->n_map ? c->n_map : 1) * n_layer);
        if (level) {
            assign_levels(cm, c, level);
            /* Each layer is converted only towards a lighter precision: converting cannot
             * bring lost bits back (promote_chunks recomputes for that). A chunk that
             * cannot be converted stays as it is, still correct. */
            for (int i = 0; i < c->n_map; i++) {
                kv_chunk *k = c->seq.chunks[i];
                if (!k)
                    continue;
                uint8_t next[KV_MAX_LAYERS];
                for (int l = 0; l < n_layer; l++) {
                    uint8_t want = level[(size_t)i * n_layer + l], now = k->layer_precision[l];
                    next[l] = kv_chunk_layer_bytes(cm->shape, want) <
                                      kv_chunk_layer_bytes(cm->shape, now)
                                  ? want
                                  : now;
                }
                if (kv_chunk_has_layers(k, cm->shape, next))
                    continue;
                if (!chunk_needs_write(c, i) &&
                    CTX_NARROW_SHRINK * (double)kv_layers_data_bytes(cm->shape, next) >
                        (double)kv_chunk_bytes(cm->shape, k))
                    continue;
                if (kv_chunk_convert_layers(cm->pool, k, next, err) == 0)
                    c->map[i].dirty = true; /* the store may hold other layers' precisions */
            }
            if (cm->policy.compress == CTX_COMPRESS_TOLERANCE)
                promote_chunks(cm, c, level);
            free(level);
        }
        cm->clock++;
        for (int i = 0; i < c->n_map; i++)
            c->map[i].last_use = cm->clock;
        if (cm->policy.swap == CTX_SWAP_AHEAD)
            write_pending_background(cm, c, err);
        else
            stats_store(cm, c, NULL);
    }
    c->busy = false;
    c->loaded = false;
    c->call_slides = 0;
    c->call_dropped = 0;
    ctx_enforce_budget(cm);
}

/* ---- accounting ---- */

size_t ctx_kv_bytes(const ctxmgr *cm, const ctx_entry *c)
{
    size_t n = 0;
    for (int i = 0; i < c->seq.n_chunks; i++)
        if (c->seq.chunks[i])
            n += kv_chunk_bytes(cm->shape, c->seq.chunks[i]);
    return n;
}

size_t ctx_kv_bytes_total(const ctxmgr *cm)
{
    return resident_bytes(cm);
}

int ctx_count_resident(const ctxmgr *cm)
{
    int n = 0;
    for (const ctx_entry *c = cm->head; c; c = c->next)
        n += ctx_kv_bytes(cm, c) > 0;
    return n;
}

int ctx_chunk_n_tokens(const ctx_entry *c, int i)
{
    return ctx_chunk_tokens(c->n_tokens, i);
}

int ctx_chunk_bits(const ctx_entry *c, int i)
{
    int n_layer = c->cm->shape.n_layer, sum = 0;
    const kv_chunk *k = i < c->seq.n_chunks ? c->seq.chunks[i] : NULL;
    const ctx_chunk *m = &c->map[i];
    const uint8_t *layers = k ? k->layer_precision
                            : m->disk_precision == KV_MIXED && m->disk_layers_known
                                ? c->disk_layers + (size_t)i * n_layer
                                : NULL;
    if (!layers)
        return m->disk_precision >= 0 && m->disk_precision != KV_MIXED
                   ? kv_precision_bits((enum kv_precision)m->disk_precision)
                   : 0;
    for (int l = 0; l < n_layer; l++)
        sum += kv_precision_bits((enum kv_precision)layers[l]);
    return sum / n_layer;
}

bool ctx_on_disk(const ctx_entry *c)
{
    for (int i = 0; i < c->n_map; i++)
        if (c->map[i].disk_precision >= 0)
            return true;
    return false;
}
