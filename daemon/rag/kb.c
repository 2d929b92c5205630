/*
 * kb.c — knowledge-base requests answered at once (KbCreate, KbList, KbRemove,
 * KbSearch), hybrid retrieval, and the drops finished in idle time. KbAdd and KbDrop
 * are scheduler tasks: kbadd.c.
 */
#include "daemon/rag/kb.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/net/reply.h"
#include "daemon/rag/kbint.h"
#include "daemon/reqlog.h"
#include "engine/clock.h"
#include "engine/vdist.h"
#include "storage/ivf.h"
#include "storage/kb.h"

#define KB_RRF_K 60.0f   /* reciprocal rank fusion's constant (Cormack et al.) */
#define KB_CAND KB_CAND_MAX
#define KB_HITS_MAX 64
/* Rows of k-means assignment, or of vectors added, between two looks at the stop flag
 * while an index is built in idle time: 5-15 ms of work from 100k to 1M 384-d vectors
 * (4 sqrt(n) lists), so a request that comes waits about that long. */
#define KB_IVF_SLICE_ROWS 256

/* A knowledge base's vectors in memory. */
typedef struct kb_vecs {
    int64_t kb_id;
    int64_t app_id;     /* the owner of its stored index */
    int dim;
    int n, cap;
    int64_t *ids;
    int8_t *q;          /* (n, dim) as stored: vector i is q[i] * scale[i], about unit length */
    float *scale;       /* (n) */
    int16_t *query;     /* (dim) exact search's scratch: the query quantized */
    ivf *index;         /* from kb_ivf_min_passages passages on, once searched; else NULL */
    int64_t searches;   /* IVF searches since its hot copy was last refreshed */
    bool train_pending; /* its index is to be trained in idle time; exact search till then */
    bool train_failed;  /* training failed: exact search until the next change */
    /* the index being built in idle time, a slice at a time (kb_ivf_train_idle) */
    ivf *building;         /* NULL: not begun */
    ivf_trainer *trainer;  /* building's k-means; NULL once its centroids are set */
    int64_t added;         /* rows of ids/q/scale added to building since */
    struct kb_vecs *next;
} kb_vecs;

kbm *kb_new(const kb_env *env, char err[ERR_MAX])
{
    kbm *k = calloc(1, sizeof *k);
    if (!k) {
        err_set(err, "out of memory");
        return NULL;
    }
    k->env = *env;
    k->to = (reply_to){env->out, env->cfg->max_frame_bytes};
    k->drops_pending = true; /* a drop a crash cut short is finished in idle time */
    k->disk_stale = true;
    k->disk_btree = -1;
    /* no writer is left of a staged document: it goes with the retired ones */
    if (store_kb_unstage_all(env->st, err)) {
        free(k);
        return NULL;
    }
    return k;
}

/* Drops the work of an index build under way. */
static void build_free(kb_vecs *v)
{
    ivf_trainer_free(v->trainer);
    ivf_free(v->building);
    v->trainer = NULL;
    v->building = NULL;
}

static void vecs_free(kb_vecs *v)
{
    free(v->ids);
    free(v->q);
    free(v->scale);
    free(v->query);
    ivf_free(v->index);
    build_free(v);
    free(v);
}

void kb_cache_drop(kbm *k, int64_t kb_id)
{
    k->disk_stale = true;
    for (kb_vecs **pp = &k->cache; *pp; pp = &(*pp)->next)
        if ((*pp)->kb_id == kb_id) {
            kb_vecs *v = *pp;
            *pp = v->next;
            vecs_free(v);
            return;
        }
}

void kb_free(kbm *k)
{
    if (!k)
        return;
    while (k->cache)
        kb_cache_drop(k, k->cache->kb_id);
    free(k);
}

void kb_on_changed(kbm *k, kb_changed_fn fn, void *arg)
{
    k->changed = fn;
    k->changed_arg = arg;
}

bool kb_is_request(Llms__Request__BodyCase body)
{
    switch (body) {
    case LLMS__REQUEST__BODY_KB_CREATE:
    case LLMS__REQUEST__BODY_KB_REMOVE:
    case LLMS__REQUEST__BODY_KB_LIST:
    case LLMS__REQUEST__BODY_KB_SEARCH:
        return true;
    default:
        return false;
    }
}

static bool name_ok(const char *name)
{
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n > KB_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return false;
    }
    return true;
}

static int copy_kb(void *arg, const store_kb *kb)
{
    kb_ref *r = arg;
    r->id = kb->id;
    r->dim = kb->dim;
    r->app_id = -1;
    r->share_uid = kb->share_uid;
    snprintf(r->embed_model, sizeof r->embed_model, "%s", kb->embed_model);
    snprintf(r->embedder, sizeof r->embedder, "%s", kb->embedder);
    return 0;
}

models_entry *kb_embedder(kbm *k, const kb_ref *kb, char err[ERR_MAX])
{
    char why[ERR_MAX];
    models_entry *me = NULL;
    if (!kb->embed_model[0])
        me = semantic_default_embedder(k->env.sem, why);
    else if (models_resolve(k->env.reg, kb->embed_model, MODELS_EMBED, &me, why) !=
             LLMS__ERROR_CODE__OK)
        me = NULL;
    if (!me) {
        err_set(err, "knowledge base '%s': its embed model '%s' is not served now: load "
                     "it again, or drop and recreate the knowledge base (%s)",
                kb->name, kb->embed_model, why);
        return NULL;
    }
    if (strcmp(me->path, kb->embedder) != 0 || semantic_dim(k->env.sem, me) != kb->dim) {
        err_set(err, "knowledge base '%s': its vectors are another file's than model '%s' "
                     "serves now, and would not match; serve %s again, or drop and recreate "
                     "the knowledge base", kb->name, me->name, kb->embedder);
        return NULL;
    }
    return me;
}

int kb_lookup(kbm *k, uint32_t uid, const char *app, const char *name, kb_ref *out,
              char err[ERR_MAX])
{
    int64_t app_id;
    bool found;
    if (!name_ok(name)) {
        err_set(err, "no knowledge base '%.64s'", name ? name : "");
        return 0;
    }
    if (store_app_id(k->env.st, uid, app, &app_id, err) ||
        store_kb_get(k->env.st, app_id, name, copy_kb, out, &found, err))
        return -1;
    out->app_id = app_id;
    if (!found)
        err_set(err, "no knowledge base '%s'", name);
    out->uid = uid;
    out->app = app;
    out->name = name;
    return found ? 1 : 0;
}

bool kb_find(kbm *k, uint64_t conn_id, uint32_t uid, const char *app,
             const Llms__Request *req, const char *name, kb_ref *out)
{
    char err[ERR_MAX];
    int rc = kb_lookup(k, uid, app, name, out, err);
    if (rc <= 0)
        reply_error(&k->to, conn_id, req,
                    rc == 0 ? LLMS__ERROR_CODE__NOT_FOUND : LLMS__ERROR_CODE__INTERNAL, "%s", err);
    return rc == 1;
}

/* ---- create, list ---- */

static int count_kb(void *arg, const store_kb *kb)
{
    (void)kb;
    (*(int *)arg)++;
    return 0;
}

static void handle_create(kbm *k, uint64_t conn_id, uint32_t uid, const char *app,
                          const Llms__Request *req)
{
    const config *cfg = k->env.cfg;
    const Llms__KbCreateRequest *cr = req->kb_create;
    char err[ERR_MAX];
    if (!name_ok(cr->name)) {
        reply_error(&k->to, conn_id, req, LLMS__ERROR_CODE__INVALID_ARGUMENT,
                    "a knowledge base name is 1 to %d bytes of [A-Za-z0-9._-]", KB_NAME_MAX);
        return;
    }
    int ptok = cr->has_passage_tokens ? (int)cr->passage_tokens : cfg->kb_passage_tokens;
    int otok = cr->has_overlap_tokens ? (int)cr->overlap_tokens : cfg->kb_overlap_tokens;
    if (!cr->has_overlap_tokens && otok >= ptok)
        otok = ptok / 4;
    if (ptok < 8 || ptok > 4096 || otok < 0 || otok >= ptok) {
        reply_error(&k->to, conn_id, req, LLMS__ERROR_CODE__INVALID_ARGUMENT,
                    "passage_tokens must be 8..4096 and overlap_tokens below it (%d, %d)",
                    ptok, otok);
        return;
    }
    /* the model is resolved and its pooling checked now, not at the first KbAdd */
    models_entry *me = NULL;
    Llms__ErrorCode code = LLMS__ERROR_CODE__FAILED_PRECONDITION;
    if (cr->embed_model && cr->embed_model[0])
        code = models_resolve(k->env.reg, cr->embed_model, MODELS_EMBED, &me, err);
    else if ((me = semantic_default_embedder(k->env.sem, err)))
        code = LLMS__ERROR_CODE__OK;
    if (code == LLMS__ERROR_CODE__OK && semantic_embed_check(k->env.sem, me, err) < 0)
        code = LLMS__ERROR_CODE__INVALID_ARGUMENT;
    if (code != LLMS__ERROR_CODE__OK) {
        reply_error(&k->to, conn_id, req, code, "%s", err);
        return;
    }
    int64_t app_id, kb_id;
    int n = 0;
    bool exists;
    if (store_app_id(k->env.st, uid, app, &app_id, err) ||
        store_kb_list(k->env.st, app_id, count_kb, &n, err))
        goto fail;
    if (n >= cfg->kb_max_per_app) {
        reply_error(&k->to, conn_id, req, LLMS__ERROR_CODE__RESOURCE_EXHAUSTED,
                    "app has %d knowledge bases, the limit (kb_max_per_app)", n);
        return;
    }
    if (store_kb_create(k->env.st, app_id, cr->name, ptok, otok, me->name, me->path,
                        semantic_dim(k->env.sem, me), cr->has_share_uid && cr->share_uid,
                        clock_wall_ms(), &kb_id, &exists, err))
        goto fail;
    if (exists) {
        reply_error(&k->to, conn_id, req, LLMS__ERROR_CODE__FAILED_PRECONDITION,
                    "knowledge base '%s' exists", cr->name);
        return;
    }
    reply_ok(&k->to, conn_id, req);
    return;
fail:
    reply_error(&k->to, conn_id, req, LLMS__ERROR_CODE__INTERNAL, "%s", err);
}

typedef struct kb_list {
    Llms__KbInfo *infos;
    Llms__KbInfo **ptrs;
    char **strs;            /* (2 * cap) each one's name and embed model, owned */
    int n, cap;
} kb_list;

static int list_one(void *arg, const store_kb *kb)
{
    kb_list *l = arg;
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 8;
        Llms__KbInfo *i = realloc(l->infos, sizeof *i * (size_t)cap);
        if (i)
            l->infos = i;
        char **nm = i ? realloc(l->strs, sizeof *nm * 2 * (size_t)cap) : NULL;
        if (nm)
            l->strs = nm;
        if (!i || !nm)
            return -1;
        l->cap = cap;
    }
    Llms__KbInfo *i = &l->infos[l->n];
    llms__kb_info__init(i);
    char **strs = l->strs + 2 * l->n;
    strs[0] = strdup(kb->name);
    strs[1] = strdup(kb->embed_model);
    if (!strs[0] || !strs[1]) {
        free(strs[0]);
        free(strs[1]);
        return -1;
    }
    i->name = strs[0];
    i->embed_model = strs[1];
    i->documents = (uint32_t)kb->n_docs;
    i->passages = (uint32_t)kb->n_passages;
    i->bytes = (uint64_t)kb->bytes;
    i->passage_tokens = (uint32_t)kb->passage_tokens;
    i->overlap_tokens = (uint32_t)kb->overlap_tokens;
    i->qa_entries = (uint32_t)kb->qa_entries;
    i->has_share_uid = 1;
    i->share_uid = kb->share_uid;
    l->n++;
    return 0;
}

static void handle_list(kbm *k, uint64_t conn_id, uint32_t uid, const char *app,
                        const Llms__Request *req)
{
    char err[ERR_MAX];
    int64_t app_id;
    kb_list l = {0};
    int rc = store_app_id(k->env.st, uid, app, &app_id, err);
    if (rc == 0 && (rc = store_kb_list(k->env.st, app_id, list_one, &l, err)) > 0)
        err_set(err, "out of memory");
    if (rc == 0 && l.n && !(l.ptrs = malloc(sizeof *l.ptrs * (size_t)l.n))) {
        err_set(err, "out of memory");
        rc = -1;
    }
    if (rc) {
        reply_error(&k->to, conn_id, req, LLMS__ERROR_CODE__INTERNAL, "%s", err);
    } else {
        for (int i = 0; i < l.n; i++)
            l.ptrs[i] = &l.infos[i];
        Llms__KbListResponse lr = LLMS__KB_LIST_RESPONSE__INIT;
        lr.n_kbs = (size_t)l.n;
        lr.kbs = l.ptrs;
        Llms__Response r = LLMS__RESPONSE__INIT;
        r.id = req->id;
        r.final = 1;
        r.body_case = LLMS__RESPONSE__BODY_KB_LIST;
        r.kb_list = &lr;
        reply_send(&k->to, conn_id, &r, false);
    }
    for (int i = 0; i < 2 * l.n; i++)
        free(l.strs[i]);
    free(l.strs);
    free(l.infos);
    free(l.ptrs);
}

/* ---- remove, and the rows left to delete in idle time ---- */

bool kb_drop_pending(const kbm *k)
{
    return k->drops_pending;
}

void kb_drop_idle(kbm *k, int max_rows)
{
    char err[ERR_MAX];
    int64_t id = -1;
    bool done = false;
    int rows = max_rows * KB_DROP_ROWS_PER_ROW;
    const char *what = "dropping a knowledge base";
    /* hidden knowledge bases first, then the rows of replaced and removed documents and
     * of adds cut short, then the pages they freed leave the file (a slice a turn) */
    int rc = store_kb_hidden(k->env.st, &id, err);
    if (rc == 0 && id >= 0)
        rc = store_kb_drop_step(k->env.st, id, rows, &done, err);
    else if (rc == 0 && (what = "deleting replaced documents",
                         (rc = store_kb_clean_step(k->env.st, rows, &done, err)) == 0 && done))
        rc = (what = "vacuuming", store_vacuum_step(k->env.st, rows, &done, err));
    k->disk_stale = true;
    if (rc == 0 && (!done || id >= 0))
        return;
    /* none left, or the store fails: tried again after the next drop that stops early */
    k->drops_pending = false;
    if (rc && reqlog_enabled(REQLOG_WARN))
        fprintf(stderr, "llmsd: warn: %s: %s\n", what, err);
}

bool kb_disk_stale(const kbm *k)
{
    return k->disk_stale || k->disk_btree >= 0;
}

void kb_disk_measure_idle(kbm *k)
{
    if (k->disk_btree < 0) {
        k->disk_btree = 0;
        k->disk_partial = 0;
        k->disk_stale = false;
    }
    int64_t bytes;
    bool done;
    char err[ERR_MAX];
    if (store_kb_disk_btree(k->env.st, k->disk_btree, &bytes, &done, err)) {
        /* given up until the next write: a failing store would fail every idle turn */
        k->disk_btree = -1;
        if (reqlog_enabled(REQLOG_WARN))
            fprintf(stderr, "llmsd: warn: measuring knowledge bases: %s\n", err);
        return;
    }
    k->disk_partial += bytes;
    k->disk_btree++;
    if (done) {
        k->disk_bytes = k->disk_partial;
        k->disk_measured = true;
        k->disk_btree = -1;
    }
}

bool kb_disk_bytes(const kbm *k, int64_t *bytes)
{
    *bytes = k->disk_bytes;
    return k->disk_measured;
}

static void handle_remove(kbm *k, uint64_t conn_id, uint32_t uid, const char *app,
                          const Llms__Request *req)
{
    const Llms__KbRemoveRequest *rr = req->kb_remove;
    char err[ERR_MAX];
    kb_ref kb;
    if (!kb_find(k, conn_id, uid, app, req, rr->kb, &kb))
        return;
    uint32_t removed = 0;
    if (store_kb_begin(k->env.st, err))
        goto fail;
    for (size_t i = 0; i < rr->n_ids; i++) {
        bool found;
        if (store_kb_remove_doc(k->env.st, kb.id, rr->ids[i], &found, err)) {
            store_kb_rollback(k->env.st);
            goto fail;
        }
        removed += found;
    }
    if (store_kb_commit(k->env.st, err))
        goto fail;
    kb_cache_drop(k, kb.id);
    k->drops_pending |= removed > 0;
    if (removed && k->changed)
        k->changed(k->changed_arg, &kb, -1);
    Llms__KbRemoveResponse res = LLMS__KB_REMOVE_RESPONSE__INIT;
    res.removed = removed;
    Llms__Response r = LLMS__RESPONSE__INIT;
    r.id = req->id;
    r.final = 1;
    r.body_case = LLMS__RESPONSE__BODY_KB_REMOVE;
    r.kb_remove = &res;
    reply_send(&k->to, conn_id, &r, false);
    return;
fail:
    kb_cache_drop(k, kb.id);
    reply_error(&k->to, conn_id, req, LLMS__ERROR_CODE__INTERNAL, "%s", err);
}

/* ---- retrieval ---- */

static int vec_add(void *arg, int64_t id, const int8_t *q, float scale)
{
    kb_vecs *v = arg;
    if (v->n == v->cap) {
        int cap = v->cap ? 2 * v->cap : 256;
        int64_t *ids = realloc(v->ids, sizeof *ids * (size_t)cap);
        if (ids)
            v->ids = ids;
        int8_t *qs = ids ? realloc(v->q, (size_t)cap * v->dim) : NULL;
        if (qs)
            v->q = qs;
        float *sc = qs ? realloc(v->scale, sizeof *sc * (size_t)cap) : NULL;
        if (sc)
            v->scale = sc;
        if (!ids || !qs || !sc)
            return 1;
        v->cap = cap;
    }
    v->ids[v->n] = id;
    memcpy(v->q + (size_t)v->n * v->dim, q, (size_t)v->dim);
    v->scale[v->n] = scale;
    v->n++;
    return 0;
}

/* Vectors [from, from + n) of v as floats into out ((n, dim)), for IVF training. */
static void vecs_widen(const kb_vecs *v, int from, int n, float *out)
{
    for (int i = 0; i < n; i++)
        for (int t = 0; t < v->dim; t++)
            out[(size_t)i * v->dim + t] =
                (float)v->q[(size_t)(from + i) * v->dim + t] * v->scale[from + i];
}

/* kb's vectors, from memory or loaded from the store. */
static kb_vecs *vectors(kbm *k, const kb_ref *kb, char err[ERR_MAX])
{
    for (kb_vecs *v = k->cache; v; v = v->next)
        if (v->kb_id == kb->id)
            return v;
    kb_vecs *v = calloc(1, sizeof *v);
    if (!v) {
        err_set(err, "out of memory");
        return NULL;
    }
    v->kb_id = kb->id;
    v->app_id = kb->app_id;
    v->dim = kb->dim;
    v->query = malloc(sizeof *v->query * (size_t)(kb->dim > 0 ? kb->dim : 1));
    if (!v->query) {
        vecs_free(v);
        err_set(err, "out of memory");
        return NULL;
    }
    int rc = store_kb_vectors(k->env.st, kb->id, kb->dim, vec_add, v, err);
    if (rc) {
        if (rc > 0)
            err_set(err, "out of memory");
        vecs_free(v);
        return NULL;
    }
    v->next = k->cache;
    k->cache = v;
    return v;
}

/* Keeps the best n of (id, score) pairs seen, best first, in hits (cap entries). */
static void top_insert(kb_hit *hits, int *n, int cap, int64_t id, float score)
{
    if (*n == cap && score <= hits[cap - 1].score)
        return;
    int i = *n < cap ? (*n)++ : cap - 1;
    while (i > 0 && hits[i - 1].score < score) {
        hits[i] = hits[i - 1];
        i--;
    }
    hits[i] = (kb_hit){id, score};
}

/* Lists of an IVF index of n passages: 4 sqrt(n) (FAISS's rule of thumb), at most n / 8
 * so that lists are not nearly empty. */
static int ivf_lists_for(int n)
{
    int nlist = (int)(4.0 * sqrt((double)n));
    if (nlist > n / 8)
        nlist = n / 8;
    return nlist < 1 ? 1 : nlist;
}

/* Brings index ix up to date with v's passages: removes the ids v lacks,
 * adds those it lacks. */
static int index_sync(ivf *ix, const kb_vecs *v, char *err)
{
    int64_t have_n = ivf_count(ix);
    int64_t *have = malloc(sizeof *have * (size_t)(have_n ? have_n : 1));
    int64_t *gone = malloc(sizeof *gone * (size_t)(have_n ? have_n : 1));
    int64_t *new_ids = malloc(sizeof *new_ids * (size_t)v->n);
    int8_t *new_q = malloc((size_t)v->n * v->dim);
    float *new_scale = malloc(sizeof *new_scale * (size_t)v->n);
    int rc = 0;
    if (!have || !gone || !new_ids || !new_q || !new_scale) {
        rc = err_set(err, "out of memory");
        goto out;
    }
    ivf_ids(ix, have);
    /* both lists ascending (v's in id order from the store): one merge finds both sides */
    int64_t n_gone = 0, n_new = 0, h = 0;
    for (int i = 0; i < v->n; i++) {
        while (h < have_n && have[h] < v->ids[i])
            gone[n_gone++] = have[h++];
        if (h < have_n && have[h] == v->ids[i]) {
            h++;
            continue;
        }
        new_ids[n_new] = v->ids[i];
        memcpy(new_q + (size_t)n_new * v->dim, v->q + (size_t)i * v->dim, (size_t)v->dim);
        new_scale[n_new++] = v->scale[i];
    }
    while (h < have_n)
        gone[n_gone++] = have[h++];
    if (ivf_remove(ix, gone, n_gone, NULL, err) ||
        ivf_add_q8(ix, new_ids, new_q, new_scale, n_new, v->dim, err))
        rc = -1;
out:
    free(have);
    free(gone);
    free(new_ids);
    free(new_q);
    free(new_scale);
    return rc;
}

/* Saves ix as v's index and makes it the one searched. */
static int index_keep(kbm *k, kb_vecs *v, ivf *ix, char *err)
{
    char name[32];
    snprintf(name, sizeof name, "kb:%lld", (long long)v->kb_id);
    if (ivf_save(k->env.st, v->app_id, name, ix, err))
        return -1;
    v->index = ix;
    v->train_pending = false;
    return 0;
}

/* v's IVF index into *out: kept, or loaded and brought up to date (and saved). One that
 * must be trained (none stored, it does not load, or the passages call for twice its
 * lists) is left for idle time (v->train_pending), and *out is NULL. */
static int index_of(kbm *k, kb_vecs *v, ivf **out, char *err)
{
    *out = v->index;
    if (v->index || v->train_pending || v->train_failed)
        return 0;
    char name[32];
    snprintf(name, sizeof name, "kb:%lld", (long long)v->kb_id);
    ivf *ix = NULL;
    bool found;
    char load_err[ERR_MAX];
    ivf_rows rows = {v->ids, v->q, v->scale, v->n, v->dim};
    /* the index is derived data: one that does not load, or no longer fits, is rebuilt */
    if (ivf_load(k->env.st, v->app_id, name, &rows, &ix, &found, load_err) == 0 && found &&
        (ivf_dim(ix) != v->dim || ivf_lists_for(v->n) >= 2 * ivf_nlist(ix))) {
        ivf_free(ix);
        ix = NULL;
    }
    if (!ix) {
        v->train_pending = true;
        return 0;
    }
    if (index_sync(ix, v, err) || index_keep(k, v, ix, err)) {
        ivf_free(ix);
        return -1;
    }
    *out = ix;
    return 0;
}

bool kb_ivf_train_pending(const kbm *k)
{
    for (const kb_vecs *v = k->cache; v; v = v->next)
        if (v->train_pending)
            return true;
    return false;
}

/* The trainer's row i: v's vector i as floats. */
static void vecs_row(void *arg, int64_t i, float *out)
{
    vecs_widen(arg, (int)i, 1, out);
}

/* Builds v's index in slices of KB_IVF_SLICE_ROWS rows (k-means, then adding every
 * vector), until the index is saved and searched (1), stop is raised (0: the next call
 * goes on from there), or an error (-1). */
static int index_build(kbm *k, kb_vecs *v, const _Atomic bool *stop, char *err)
{
    if (!v->building) {
        ivf_train_params tp = {.nlist = ivf_lists_for(v->n), .seed = (uint64_t)v->kb_id};
        if (!(v->building = ivf_new(v->dim, err)))
            return -1;
        if (!(v->trainer = ivf_trainer_new(v->building, v->n, &tp, vecs_row, v, err)))
            return -1;
        v->added = 0;
    }
    while (v->trainer) {
        if (stop && atomic_load(stop))
            return 0;
        int rc = ivf_trainer_step(v->trainer, KB_IVF_SLICE_ROWS, err);
        if (rc < 0)
            return -1;
        if (rc == 1) {
            ivf_trainer_free(v->trainer);
            v->trainer = NULL;
        }
    }
    while (v->added < v->n) {
        if (stop && atomic_load(stop))
            return 0;
        int64_t a = v->added, take = v->n - a < KB_IVF_SLICE_ROWS ? v->n - a : KB_IVF_SLICE_ROWS;
        if (ivf_add_q8(v->building, v->ids + a, v->q + (size_t)a * v->dim, v->scale + a, take,
                       v->dim, err))
            return -1;
        v->added += take;
    }
    if (index_keep(k, v, v->building, err))
        return -1;
    v->building = NULL;
    k->ivf_stats.trained++;
    return 1;
}

void kb_ivf_train_idle(kbm *k, const _Atomic bool *stop)
{
    char err[ERR_MAX];
    for (kb_vecs *v = k->cache; v; v = v->next)
        if (v->train_pending) {
            if (index_build(k, v, stop, err) < 0) {
                /* searched exactly until the next change of the knowledge base */
                v->train_pending = false;
                v->train_failed = true;
                build_free(v);
                if (reqlog_enabled(REQLOG_WARN))
                    fprintf(stderr, "llmsd: warn: knowledge base %lld: IVF index: %s\n",
                            (long long)v->kb_id, err);
            }
            return;
        }
}

/* The best cand passages of v for qvec by brute force, into hits; the query quantized
 * as an IVF search quantizes it, so that both give the same scores. */
static void exact_search(kb_vecs *v, const float *qvec, int cand, kb_hit *hits, int *n)
{
    enum { BLOCK = 256 };
    float sc[BLOCK], qscale;
    vdist_quantize_query(qvec, v->dim, v->query, &qscale);
    for (int i0 = 0; i0 < v->n; i0 += BLOCK) {
        int nb = v->n - i0 < BLOCK ? v->n - i0 : BLOCK;
        vdist_dot_q8(v->query, &qscale, 1, v->q + (size_t)i0 * v->dim, v->scale + i0, nb,
                     v->dim, sc, BLOCK);
        for (int i = 0; i < nb; i++)
            top_insert(hits, n, cand, v->ids[i0 + i], sc[i]);
    }
}

/* The best cand passages of v for qvec through its IVF index, into hits: the lists of
 * hints (when they are this knowledge base's) first, and no list that cannot change the
 * candidates (the same results as the plain nprobe search); hints (may be NULL) then
 * get the lists these candidates came from. */
static int index_search(kbm *k, const kb_ref *kb, kb_vecs *v, const float *qvec, int cand,
                        kb_hints *hints, kb_hit *hits, int *n, char *err)
{
    ivf *ix;
    if (index_of(k, v, &ix, err))
        return -1;
    if (!ix) {
        exact_search(v, qvec, cand, hits, n);
        return 0;
    }
    ivf_hit found[KB_CAND];
    ivf_search_params p = {.k = cand, .nprobe = k->env.cfg->kb_ivf_nprobe, .early_stop = true};
    bool hinted = hints && hints->kb_id == kb->id && hints->n > 0;
    ivf_hints h = {hinted ? hints->lists : NULL, hinted ? hints->n : 0};
    ivf_search *s = ivf_search_begin(ix, qvec, 1, v->dim, &p, hinted ? &h : NULL, err);
    if (!s)
        return -1;
    while (!ivf_search_step(s, INT32_MAX))
        ;
    *n = ivf_search_results(s, 0, found);
    ivf_search_stats st;
    ivf_search_get_stats(s, &st);
    ivf_search_free(s);
    k->ivf_stats.searches++;
    k->ivf_stats.hinted += hinted;
    k->ivf_stats.lists_scanned += (uint64_t)st.lists_scanned;
    k->ivf_stats.lists_skipped += (uint64_t)st.lists_skipped;
    v->searches++;
    for (int i = 0; i < *n; i++)
        hits[i] = (kb_hit){found[i].id, found[i].score};
    if (hints) {
        hints->kb_id = kb->id;
        hints->n = 0;
        for (int i = 0; i < *n; i++) {
            int j = 0;
            while (j < hints->n && hints->lists[j] != found[i].list)
                j++;
            if (j == hints->n && hints->n < KB_HINTS_MAX)
                hints->lists[hints->n++] = found[i].list;
        }
    }
    return 0;
}

const kb_ivf_stats *kb_get_ivf_stats(const kbm *k)
{
    return &k->ivf_stats;
}

void kb_ivf_refresh_hot(kbm *k)
{
    char err[ERR_MAX];
    int n_index = 0;
    for (kb_vecs *v = k->cache; v; v = v->next)
        n_index += v->index != NULL;
    size_t share = n_index ? ((size_t)k->env.cfg->kb_ivf_hot_mb << 20) / (size_t)n_index : 0;
    k->ivf_stats.hot_bytes = 0;
    for (kb_vecs *v = k->cache; v; v = v->next) {
        if (!v->index)
            continue;
        /* a refresh that fails (out of memory) leaves the lists' own arrays in use, and
         * is not tried again before the next searches */
        if (v->searches > 0)
            ivf_hot_refresh(v->index, share, err);
        v->searches = 0;
        k->ivf_stats.hot_bytes += ivf_hot_bytes(v->index);
    }
}

bool kb_ivf_hot_stale(const kbm *k)
{
    if (k->env.cfg->kb_ivf_hot_mb <= 0)
        return false;
    for (const kb_vecs *v = k->cache; v; v = v->next)
        if (v->index && v->searches > 0)
            return true;
    return false;
}

/* Normalises a list's scores to [0, 1] (min-max); all equal: all 1. */
static void minmax(kb_hit *h, int n)
{
    if (n == 0)
        return;
    float lo = h[n - 1].score, hi = h[0].score;
    for (int i = 0; i < n; i++)
        h[i].score = hi > lo ? (h[i].score - lo) / (hi - lo) : 1.0f;
}

static int fuse_find(kb_hit *f, int n, int64_t id)
{
    for (int i = 0; i < n; i++)
        if (f[i].id == id)
            return i;
    return -1;
}

/* Candidates each retriever gives the fusion under retrieval: top_k for one retriever
 * alone, KB_CAND for a fusion. */
static int n_cand(Llms__Retrieval retrieval, int top_k)
{
    return retrieval == LLMS__RETRIEVAL__RETRIEVAL_BM25 ||
                   retrieval == LLMS__RETRIEVAL__RETRIEVAL_VECTOR
               ? top_k
               : KB_CAND;
}

int kb_retrieve_bm25(kbm *k, const kb_ref *kb, const char *query, int top_k,
                     Llms__Retrieval retrieval, kb_hit *bm, int *n_bm, char err[ERR_MAX])
{
    *n_bm = 0;
    if (top_k > KB_HITS_MAX)
        top_k = KB_HITS_MAX;
    if (top_k <= 0 || retrieval == LLMS__RETRIEVAL__RETRIEVAL_VECTOR)
        return 0;
    int64_t ids[KB_CAND];
    float sc[KB_CAND];
    if (store_kb_bm25(k->env.st, kb->id, query, n_cand(retrieval, top_k), ids, sc, n_bm, err))
        return -1;
    for (int i = 0; i < *n_bm; i++)
        bm[i] = (kb_hit){ids[i], sc[i]};
    return 0;
}

int kb_retrieve_fuse(kbm *k, const kb_ref *kb, const float *qvec, int top_k,
                     Llms__Retrieval retrieval, const kb_hit *bm_in, int n_bm,
                     kb_hints *hints, kb_hit *hits, int *n, char err[ERR_MAX])
{
    *n = 0;
    if (top_k > KB_HITS_MAX)
        top_k = KB_HITS_MAX;
    if (top_k <= 0)
        return 0;
    bool want_bm25 = retrieval != LLMS__RETRIEVAL__RETRIEVAL_VECTOR;
    bool want_vec = retrieval != LLMS__RETRIEVAL__RETRIEVAL_BM25;
    int cand = n_cand(retrieval, top_k);
    kb_hit bm[KB_CAND], vc[KB_CAND];
    int n_vc = 0;
    memcpy(bm, bm_in, sizeof *bm * (size_t)n_bm);
    if (want_vec) {
        kb_vecs *v = vectors(k, kb, err);
        if (!v)
            return -1;
        int min = k->env.cfg->kb_ivf_min_passages;
        if (min > 0 && v->n >= min) {
            if (index_search(k, kb, v, qvec, cand, hints, vc, &n_vc, err))
                return -1;
        } else {
            exact_search(v, qvec, cand, vc, &n_vc);
        }
    }
    if (!want_vec || !want_bm25) {
        kb_hit *src = want_vec ? vc : bm;
        *n = (want_vec ? n_vc : n_bm) < top_k ? (want_vec ? n_vc : n_bm) : top_k;
        memcpy(hits, src, sizeof *hits * (size_t)*n);
        return 0;
    }
    kb_hit fused[2 * KB_CAND];
    int n_f = 0;
    bool rrf = retrieval != LLMS__RETRIEVAL__RETRIEVAL_SUM;
    if (!rrf) {
        minmax(bm, n_bm);
        minmax(vc, n_vc);
    }
    kb_hit *lists[2] = {bm, vc};
    int lens[2] = {n_bm, n_vc};
    for (int l = 0; l < 2; l++)
        for (int i = 0; i < lens[l]; i++) {
            float s = rrf ? 1.0f / (KB_RRF_K + (float)(i + 1)) : lists[l][i].score;
            int at = fuse_find(fused, n_f, lists[l][i].id);
            if (at < 0)
                fused[n_f++] = (kb_hit){lists[l][i].id, s};
            else
                fused[at].score += s;
        }
    for (int i = 0; i < n_f; i++)
        top_insert(hits, n, top_k, fused[i].id, fused[i].score);
    return 0;
}

int kb_retrieve(kbm *k, const kb_ref *kb, const char *query, const float *qvec, int top_k,
                Llms__Retrieval retrieval, kb_hit *hits, int *n, char err[ERR_MAX])
{
    kb_hit bm[KB_CAND];
    int n_bm;
    *n = 0;
    if (kb_retrieve_bm25(k, kb, query, top_k, retrieval, bm, &n_bm, err))
        return -1;
    return kb_retrieve_fuse(k, kb, qvec, top_k, retrieval, bm, n_bm, NULL, hits, n, err);
}

/* ---- search ---- */

typedef struct hit_text {
    Llms__KbHit *h;
    char *doc, *text, *meta;
} hit_text;

static int fill_hit(void *arg, const store_passage *p)
{
    hit_text *t = arg;
    t->doc = strdup(p->doc);
    t->text = strdup(p->text);
    t->meta = p->metadata ? strdup(p->metadata) : NULL;
    if (!t->doc || !t->text || (p->metadata && !t->meta))
        return 1;
    t->h->document = t->doc;
    t->h->seq = (uint32_t)p->seq;
    t->h->text = t->text;
    t->h->metadata = t->meta;
    return 0;
}

static void handle_search(kbm *k, uint64_t conn_id, uint32_t uid, const char *app,
                          const Llms__Request *req)
{
    const Llms__KbSearchRequest *sr = req->kb_search;
    char err[ERR_MAX];
    kb_ref kb;
    if (!kb_find(k, conn_id, uid, app, req, sr->kb, &kb))
        return;
    int top_k = sr->has_top_k ? (int)sr->top_k : k->env.cfg->rag_top_k;
    if (top_k < 1 || top_k > KB_HITS_MAX) {
        reply_error(&k->to, conn_id, req, LLMS__ERROR_CODE__INVALID_ARGUMENT,
                    "top_k must be 1..%d", KB_HITS_MAX);
        return;
    }
    Llms__Retrieval mode = sr->has_retrieval ? sr->retrieval : LLMS__RETRIEVAL__RETRIEVAL_RRF;
    if (mode < LLMS__RETRIEVAL__RETRIEVAL_RRF || mode > LLMS__RETRIEVAL__RETRIEVAL_VECTOR) {
        reply_error(&k->to, conn_id, req, LLMS__ERROR_CODE__INVALID_ARGUMENT,
                    "unknown retrieval %d", (int)mode);
        return;
    }
    float *qvec = malloc(sizeof *qvec * (size_t)kb.dim);
    kb_hit hits[KB_HITS_MAX];
    Llms__KbHit h[KB_HITS_MAX];
    Llms__KbHit *hp[KB_HITS_MAX];
    hit_text t[KB_HITS_MAX];
    int n = 0, filled = 0;
    Llms__ErrorCode code = LLMS__ERROR_CODE__INTERNAL;
    int rc = -1;
    if (!qvec) {
        err_set(err, "out of memory");
        goto out;
    }
    if (mode != LLMS__RETRIEVAL__RETRIEVAL_BM25) {
        models_entry *me = kb_embedder(k, &kb, err);
        if (!me) {
            code = LLMS__ERROR_CODE__FAILED_PRECONDITION;
            goto out;
        }
        if (semantic_embed_now(k->env.sem, me, sr->query, qvec, err)) {
            code = LLMS__ERROR_CODE__INVALID_ARGUMENT;
            goto out;
        }
        vdist_normalize(qvec, kb.dim);
    }
    if (kb_retrieve(k, &kb, sr->query, qvec, top_k, mode, hits, &n, err))
        goto out;
    for (; filled < n; filled++) {
        bool found;
        llms__kb_hit__init(&h[filled]);
        h[filled].passage = (uint64_t)hits[filled].id;
        h[filled].score = hits[filled].score;
        hp[filled] = &h[filled];
        t[filled] = (hit_text){.h = &h[filled]};
        int r = store_kb_passage(k->env.st, kb.id, hits[filled].id, fill_hit, &t[filled], &found,
                                 err);
        if (r || !found) {
            if (r > 0 || !found)
                err_set(err, r > 0 ? "out of memory" : "passage %lld vanished",
                        (long long)hits[filled].id);
            filled++;
            goto out;
        }
    }
    rc = 0;
out:
    if (rc) {
        reply_error(&k->to, conn_id, req, code, "%s", err);
    } else {
        Llms__KbSearchResponse res = LLMS__KB_SEARCH_RESPONSE__INIT;
        res.n_hits = (size_t)n;
        res.hits = hp;
        Llms__Response r = LLMS__RESPONSE__INIT;
        r.id = req->id;
        r.final = 1;
        r.body_case = LLMS__RESPONSE__BODY_KB_SEARCH;
        r.kb_search = &res;
        reply_send(&k->to, conn_id, &r, false);
    }
    for (int i = 0; i < filled; i++) {
        free(t[i].doc);
        free(t[i].text);
        free(t[i].meta);
    }
    free(qvec);
}

void kb_handle(kbm *k, uint64_t conn_id, uint32_t uid, const char *app, const Llms__Request *req)
{
    switch (req->body_case) {
    case LLMS__REQUEST__BODY_KB_CREATE:
        handle_create(k, conn_id, uid, app, req);
        break;
    case LLMS__REQUEST__BODY_KB_REMOVE:
        handle_remove(k, conn_id, uid, app, req);
        break;
    case LLMS__REQUEST__BODY_KB_LIST:
        handle_list(k, conn_id, uid, app, req);
        break;
    case LLMS__REQUEST__BODY_KB_SEARCH:
        handle_search(k, conn_id, uid, app, req);
        break;
    default:
        reply_error(&k->to, conn_id, req, LLMS__ERROR_CODE__UNIMPLEMENTED,
                    "not a knowledge base call");
        break;
    }
}
