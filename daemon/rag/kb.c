/*
 * kb.c — knowledge base requests, passage splitting and hybrid retrieval.
 */
#include "daemon/rag/kb.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/net/reply.h"
#include "daemon/reqlog.h"
#include "engine/clock.h"
#include "engine/vdist.h"
#include "storage/ivf.h"
#include "storage/kb.h"

#define KB_RRF_K 60.0f   /* reciprocal rank fusion's constant (Cormack et al.) */
#define KB_CAND KB_CAND_MAX
#define KB_HITS_MAX 64

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
    struct kb_vecs *next;
} kb_vecs;

struct kbm {
    kb_env env;
    reply_to to;
    kb_vecs *cache;
    kb_ivf_stats ivf_stats;
    kb_changed_fn changed;
    void *changed_arg;
    bool drops_pending;     /* rows of hidden knowledge bases or retired documents, or
                             * their freed pages, may be left (kb_drop_idle) */
};

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
    /* no writer is left of a staged document: it goes with the retired ones */
    if (store_kb_unstage_all(env->st, err)) {
        free(k);
        return NULL;
    }
    return k;
}

static void vecs_free(kb_vecs *v)
{
    free(v->ids);
    free(v->q);
    free(v->scale);
    free(v->query);
    ivf_free(v->index);
    free(v);
}

/* Forgets the in-memory vectors of kb_id (it changed). */
static void cache_drop(kbm *k, int64_t kb_id)
{
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
        cache_drop(k, k->cache->kb_id);
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
    return 0;
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

/* Looks up the request's knowledge base, answering NOT_FOUND or INTERNAL itself. */
static bool find_kb(kbm *k, uint64_t conn_id, uint32_t uid, const char *app,
                    const Llms__Request *req, const char *name, kb_ref *out)
{
    char err[ERR_MAX];
    int rc = kb_lookup(k, uid, app, name, out, err);
    if (rc <= 0)
        reply_error(&k->to, conn_id, req,
                    rc == 0 ? LLMS__ERROR_CODE__NOT_FOUND : LLMS__ERROR_CODE__INTERNAL, "%s", err);
    return rc == 1;
}

/* ---- create, list, drop ---- */

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
    if (store_kb_create(k->env.st, app_id, cr->name, ptok, otok, semantic_embedder(k->env.sem),
                        semantic_dim(k->env.sem), cr->has_share_uid && cr->share_uid,
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
    char **names;
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
        char **nm = i ? realloc(l->names, sizeof *nm * (size_t)cap) : NULL;
        if (nm)
            l->names = nm;
        if (!i || !nm)
            return -1;
        l->cap = cap;
    }
    Llms__KbInfo *i = &l->infos[l->n];
    llms__kb_info__init(i);
    if (!(l->names[l->n] = strdup(kb->name)))
        return -1;
    i->name = l->names[l->n];
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
    for (int i = 0; i < l.n; i++)
        free(l.names[i]);
    free(l.names);
    free(l.infos);
    free(l.ptrs);
}

/* ---- add, remove ---- */

/* A document split into passages: texts[i] (fresh strings, for the embedder) are the
 * spans spans[i] of the document (what the store keeps). */
typedef struct split {
    char **texts;
    store_span *spans;
    int n;
} split;

static void split_free(split *sp)
{
    for (int i = 0; i < sp->n; i++)
        free(sp->texts[i]);
    free(sp->texts);
    free(sp->spans);
    memset(sp, 0, sizeof *sp);
}

/* A document's words as far as they are scanned: word w is text[start[w], end[w]) and
 * counts ntok[w] tokens. Scanning resumes at pos, so a long document is tokenized a
 * slice at a time (KB_SPLIT_SLICE_BYTES) between the scheduler's steps. */
typedef struct word_scan {
    size_t pos;                 /* bytes of the text scanned */
    int n, cap;
    size_t *start, *end;        /* (cap) */
    int *ntok;                  /* (cap) */
} word_scan;

static void word_scan_free(word_scan *ws)
{
    free(ws->start);
    free(ws->end);
    free(ws->ntok);
    memset(ws, 0, sizeof *ws);
}

static bool is_space(char c)
{
    return c == ' ' || c == '\n' || c == '\t';
}

/* Scans the words of text (len bytes) from ws->pos on, each counted by its own
 * tokenization, until max_bytes more are scanned (ending at a word's end) or the text
 * ends (ws->pos == len). */
static int scan_words(kbm *k, const char *text, size_t len, word_scan *ws, size_t max_bytes,
                      char err[ERR_MAX])
{
    size_t i = ws->pos, stop = len - i > max_bytes ? i + max_bytes : len;
    int32_t ids[64];
    while (i < stop) {
        while (i < len && is_space(text[i]))
            i++;
        if (i >= len)
            break;
        if (ws->n == ws->cap) {
            int cap = ws->cap ? ws->cap * 2 : 1024;
            size_t *s2 = realloc(ws->start, sizeof *s2 * (size_t)cap);
            if (s2)
                ws->start = s2;
            size_t *e2 = s2 ? realloc(ws->end, sizeof *e2 * (size_t)cap) : NULL;
            if (e2)
                ws->end = e2;
            int *t2 = e2 ? realloc(ws->ntok, sizeof *t2 * (size_t)cap) : NULL;
            if (!t2)
                return err_set(err, "out of memory");
            ws->ntok = t2;
            ws->cap = cap;
        }
        size_t w0 = i;
        while (i < len && !is_space(text[i]))
            i++;
        int t = tok_encode(k->env.tok, text + w0, i - w0, false, false, ids, 64);
        ws->start[ws->n] = w0;
        ws->end[ws->n] = i;
        ws->ntok[ws->n++] = t < 1 ? 1 : t;
    }
    ws->pos = i;
    return 0;
}

/* Splits a scanned text into passages of about ptok tokens, consecutive ones sharing
 * about otok: whole words, so a passage is an exact span of the document's text (never
 * a lossy decode of tokens). */
static int split_words(const char *text, const word_scan *ws, int ptok, int otok, split *sp,
                       char err[ERR_MAX])
{
    const int n_words = ws->n;
    memset(sp, 0, sizeof *sp);
    if (n_words == 0)
        return err_set(err, "the document has no words");
    /* passage p: words [first[p], last[p]) */
    int cap = 16, n_pass = 0, rc = -1;
    int *first = malloc(sizeof *first * (size_t)cap), *last = malloc(sizeof *last * (size_t)cap);
    if (!first || !last) {
        err_set(err, "out of memory");
        goto done;
    }
    for (int w = 0; w < n_words;) {
        int e = w, t = 0;
        while (e < n_words && (e == w || t + ws->ntok[e] <= ptok))
            t += ws->ntok[e++];
        if (n_pass == cap) {
            cap *= 2;
            int *f2 = realloc(first, sizeof *f2 * (size_t)cap);
            if (f2)
                first = f2;
            int *l2 = f2 ? realloc(last, sizeof *l2 * (size_t)cap) : NULL;
            if (l2)
                last = l2;
            if (!f2 || !l2) {
                err_set(err, "out of memory");
                goto done;
            }
        }
        first[n_pass] = w;
        last[n_pass++] = e;
        if (e >= n_words)
            break;
        int back = e, o = 0;
        while (back - 1 > w && o + ws->ntok[back - 1] <= otok)
            o += ws->ntok[--back];
        w = back;
    }
    if (!(sp->texts = calloc((size_t)n_pass, sizeof *sp->texts)) ||
        !(sp->spans = calloc((size_t)n_pass, sizeof *sp->spans))) {
        err_set(err, "out of memory");
        goto done;
    }
    for (int p = 0; p < n_pass; p++) {
        size_t a = ws->start[first[p]], b = ws->end[last[p] - 1];
        sp->spans[p] = (store_span){a, b - a};
        if (!(sp->texts[p] = strndup(text + a, b - a))) {
            err_set(err, "out of memory");
            goto done;
        }
        sp->n = p + 1;
    }
    rc = 0;
done:
    free(first);
    free(last);
    if (rc)
        split_free(sp);
    return rc;
}

static int get_info(void *arg, const store_kb *kb)
{
    store_kb *out = arg;
    out->passage_tokens = kb->passage_tokens;
    out->overlap_tokens = kb->overlap_tokens;
    return 0;
}

static int copy_counts(void *arg, const store_kb *kb)
{
    store_kb *out = arg;
    out->n_docs = kb->n_docs;
    out->n_passages = kb->n_passages;
    out->qa_entries = kb->qa_entries;
    return 0;
}

/* ---- KbAdd and KbDrop: scheduler work, advanced a slice at a time ---- */

/* Rows of a KbDrop slice per row of scheduler work it is given: a deleted row costs far
 * less than a row of a forward. */
#define KB_DROP_ROWS_PER_ROW 32

enum kb_phase { KB_SPLIT, KB_EMBED, KB_STAGE, KB_WRITE, KB_PUBLISH, KB_DROP, KB_VACUUM };

/* Bytes of a document tokenized word by word in one scheduler turn: about 4 ms on one
 * core (a whole 1 MB document took 67 ms in one go). */
#define KB_SPLIT_SLICE_BYTES (64u << 10)

/* A write slice: passages are written KB_WRITE_CHUNK a call (about 1 ms) until the
 * slice has taken KB_WRITE_SLICE_NS, then committed; so a turn of the write holds the
 * worker for about that long, whatever the add's size (the whole write of a 1 MB
 * document of 27000 passages took 360 ms in one transaction). */
#define KB_WRITE_CHUNK 64
#define KB_WRITE_SLICE_NS (5 * 1000000L)

struct kb_task {
    kbm *k;
    uint64_t conn_id;
    uint32_t uid;
    const char *app;             /* borrowed, as req: the scheduler's job outlives the task */
    const Llms__Request *req;
    kb_ref kb;
    enum kb_phase phase;
    /* KbAdd */
    int ptok, otok;
    size_t total;                /* bytes of its documents */
    size_t doc;                  /* documents split so far */
    size_t split_bytes;          /* their bytes */
    size_t doc_len;              /* bytes of the document being split */
    word_scan words;             /* the document being split, as far as scanned */
    split *sp;                   /* (n_documents) */
    int n_pass;
    const char **texts;          /* (n_pass) the passages in order, into sp */
    sem_task *emb;               /* their vectors */
    /* the write: every document staged at once, their passages written a slice a turn,
     * all published in one transaction */
    int64_t *doc_ids;            /* (n_documents) the staged rows; NULL until staged */
    bool published;
    size_t wdoc;                 /* the document being written */
    int wpass;                   /* its passages written */
    int n_written;               /* passages written, every document */
    int64_t first_new;           /* the lowest id of a passage written */
    bool progress;               /* the client asked for KbAddProgress frames */
    int64_t progress_ns;         /* when the last was sent (at first: the add's start) */
    long rows_left;              /* KbDrop: rows still to delete, about */
};

/* Retires what an add that will not publish staged: its rows go in idle time. */
static void add_unstage(kb_task *t)
{
    char err[ERR_MAX];
    if (!t->doc_ids || t->published)
        return;
    int n = (int)t->req->kb_add->n_documents;
    if (store_kb_unstage(t->k->env.st, t->doc_ids, n, err) && reqlog_enabled(REQLOG_WARN))
        fprintf(stderr, "llmsd: warn: knowledge base %lld: unstaging an add: %s (its rows "
                        "go at the next start)\n", (long long)t->kb.id, err);
    t->k->drops_pending = true;
    free(t->doc_ids);
    t->doc_ids = NULL;
}

void kb_task_free(kb_task *t)
{
    if (!t)
        return;
    /* a drop cut short (cancelled, past its deadline) is finished in idle time */
    if (t->phase == KB_DROP || t->phase == KB_VACUUM)
        t->k->drops_pending = true;
    /* an add cut short (cancelled, failed) leaves nothing visible */
    add_unstage(t);
    free(t->doc_ids);
    semantic_task_free(t->emb);
    word_scan_free(&t->words);
    for (size_t i = 0; t->sp && i < t->req->kb_add->n_documents; i++)
        split_free(&t->sp[i]);
    free(t->sp);
    free(t->texts);
    free(t);
}

/* Whether the uid's knowledge bases may take bytes and passages more; otherwise err says
 * which limit. A document replaced counts until the add commits, as what it replaces
 * is only freed then. */
static int quota_check(kbm *k, uint32_t uid, int64_t bytes, int64_t passages, bool *ok,
                       char err[ERR_MAX])
{
    const config *cfg = k->env.cfg;
    int64_t used_bytes, used_pass;
    *ok = false;
    if (store_kb_uid_usage(k->env.st, uid, &used_bytes, &used_pass, err))
        return -1;
    if (used_bytes + bytes > ((int64_t)cfg->kb_max_mb_per_uid << 20))
        err_set(err, "uid %u's knowledge bases hold %lld bytes; %lld more exceed "
                     "kb_max_mb_per_uid (%d MiB)", uid, (long long)used_bytes,
                (long long)bytes, cfg->kb_max_mb_per_uid);
    else if (used_pass + passages > cfg->kb_max_passages_per_uid)
        err_set(err, "uid %u's knowledge bases hold %lld passages; %lld more exceed "
                     "kb_max_passages_per_uid (%d)", uid, (long long)used_pass,
                (long long)passages, cfg->kb_max_passages_per_uid);
    else
        *ok = true;
    return 0;
}

/* A KbAdd's checks, at once: NULL when it was answered (an error). */
static kb_task *add_begin(kb_task *t)
{
    kbm *k = t->k;
    const config *cfg = k->env.cfg;
    const Llms__KbAddRequest *ar = t->req->kb_add;
    char err[ERR_MAX];
    if (!find_kb(k, t->conn_id, t->uid, t->app, t->req, ar->kb, &t->kb))
        return NULL;
    if (t->kb.dim != semantic_dim(k->env.sem)) {
        reply_error(&k->to, t->conn_id, t->req, LLMS__ERROR_CODE__FAILED_PRECONDITION,
                    "knowledge base '%s' holds vectors of %d floats, the embedder makes %d: "
                    "drop and create it again", ar->kb, t->kb.dim, semantic_dim(k->env.sem));
        return NULL;
    }
    if (ar->n_documents == 0) {
        reply_error(&k->to, t->conn_id, t->req, LLMS__ERROR_CODE__INVALID_ARGUMENT, "no documents");
        return NULL;
    }
    for (size_t i = 0; i < ar->n_documents; i++) {
        const Llms__KbDocument *d = ar->documents[i];
        size_t bytes = strlen(d->text);
        t->total += bytes;
        if (!d->id[0] || strlen(d->id) > 256) {
            reply_error(&k->to, t->conn_id, t->req, LLMS__ERROR_CODE__INVALID_ARGUMENT,
                        "document %zu: an id is 1 to 256 bytes", i);
            return NULL;
        }
        if (bytes > (size_t)cfg->kb_max_doc_bytes) {
            reply_error(&k->to, t->conn_id, t->req, LLMS__ERROR_CODE__RESOURCE_EXHAUSTED,
                        "document '%.64s' has %zu bytes, more than kb_max_doc_bytes (%d)", d->id,
                        bytes, cfg->kb_max_doc_bytes);
            return NULL;
        }
    }
    if (t->total > (size_t)cfg->kb_max_add_bytes) {
        reply_error(&k->to, t->conn_id, t->req, LLMS__ERROR_CODE__RESOURCE_EXHAUSTED,
                    "%zu bytes of documents in one KbAdd, more than kb_max_add_bytes (%d)",
                    t->total, cfg->kb_max_add_bytes);
        return NULL;
    }
    bool ok, found;
    int64_t app_id;
    store_kb info = {0};
    if (quota_check(k, t->uid, (int64_t)t->total, 0, &ok, err) ||
        store_app_id(k->env.st, t->uid, t->app, &app_id, err) ||
        store_kb_get(k->env.st, app_id, ar->kb, get_info, &info, &found, err)) {
        reply_error(&k->to, t->conn_id, t->req, LLMS__ERROR_CODE__INTERNAL, "%s", err);
        return NULL;
    }
    if (!ok) {
        reply_error(&k->to, t->conn_id, t->req, LLMS__ERROR_CODE__RESOURCE_EXHAUSTED, "%s", err);
        return NULL;
    }
    t->ptok = info.passage_tokens;
    t->otok = info.overlap_tokens;
    t->progress = ar->has_progress && ar->progress;
    t->progress_ns = clock_mono_ns();
    if (!(t->sp = calloc(ar->n_documents, sizeof *t->sp))) {
        reply_error(&k->to, t->conn_id, t->req, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        return NULL;
    }
    t->phase = KB_SPLIT;
    return t;
}

/* A KbDrop's first slice: the knowledge base leaves every lookup and its caches at once;
 * its rows go in the slices that follow. NULL when it was answered (an error). */
static kb_task *drop_begin(kb_task *t)
{
    kbm *k = t->k;
    char err[ERR_MAX];
    if (!find_kb(k, t->conn_id, t->uid, t->app, t->req, t->req->kb_drop->kb, &t->kb))
        return NULL;
    bool found;
    store_kb info = {0};
    cache_drop(k, t->kb.id);
    char index[32];
    bool had_index;
    snprintf(index, sizeof index, "kb:%lld", (long long)t->kb.id);
    if (store_kb_get(k->env.st, t->kb.app_id, t->kb.name, copy_counts, &info, &found, err) ||
        ivf_drop(k->env.st, t->kb.app_id, index, &had_index, err) ||
        store_kb_hide(k->env.st, t->kb.id, err)) {
        reply_error(&k->to, t->conn_id, t->req, LLMS__ERROR_CODE__INTERNAL, "%s", err);
        return NULL;
    }
    if (k->changed)
        k->changed(k->changed_arg, &t->kb, -1);
    t->rows_left = (long)(info.n_passages + info.n_docs + info.qa_entries) + 1;
    t->phase = KB_DROP;
    return t;
}

kb_task *kb_begin(kbm *k, uint64_t conn_id, uint32_t uid, const char *app,
                  const Llms__Request *req)
{
    if (req->body_case != LLMS__REQUEST__BODY_KB_ADD &&
        req->body_case != LLMS__REQUEST__BODY_KB_DROP) {
        reply_error(&k->to, conn_id, req, LLMS__ERROR_CODE__UNIMPLEMENTED, "not a KbAdd or KbDrop");
        return NULL;
    }
    kb_task *t = calloc(1, sizeof *t);
    if (!t) {
        reply_error(&k->to, conn_id, req, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        return NULL;
    }
    *t = (kb_task){.k = k, .conn_id = conn_id, .uid = uid, .app = app, .req = req};
    kb_task *ok = req->body_case == LLMS__REQUEST__BODY_KB_ADD ? add_begin(t) : drop_begin(t);
    if (!ok)
        kb_task_free(t);
    return ok;
}

sem_task *kb_task_embedding(kb_task *t)
{
    return t->phase == KB_EMBED ? t->emb : NULL;
}

long kb_task_rows_left(const kb_task *t)
{
    const Llms__KbAddRequest *ar = t->req->kb_add;
    switch (t->phase) {
    case KB_SPLIT:
        /* words left to scan, about, a slice per document to cut it into passages, and
         * one to start the embedding */
        return (long)((t->total - t->split_bytes - t->words.pos) / 8) +
               (long)(ar->n_documents - t->doc) + 1;
    case KB_EMBED:
        return semantic_rows_left(t->emb) + 1;
    case KB_STAGE:
        return t->n_pass + 2;
    case KB_WRITE:
        return t->n_pass - t->n_written + 1;
    case KB_PUBLISH:
        return 1;
    case KB_DROP:
        return t->rows_left > 0 ? t->rows_left / KB_DROP_ROWS_PER_ROW + 1 : 1;
    case KB_VACUUM:
        return 1;
    }
    return 1;
}

/* Sends the add's progress now (when its client asked for it): each count as far as
 * the add has gone, so every count only grows. */
static void add_progress_send(kb_task *t)
{
    if (!t->progress)
        return;
    const Llms__KbAddRequest *ar = t->req->kb_add;
    Llms__KbAddProgress p = LLMS__KB_ADD_PROGRESS__INIT;
    bool splitting = t->phase == KB_SPLIT, embedding = t->phase == KB_EMBED;
    p.phase = splitting   ? LLMS__KB_ADD_PHASE__KB_ADD_SPLIT
              : embedding ? LLMS__KB_ADD_PHASE__KB_ADD_EMBED
                          : LLMS__KB_ADD_PHASE__KB_ADD_WRITE;
    p.documents = (uint32_t)ar->n_documents;
    p.documents_written = (uint32_t)t->wdoc;
    p.bytes = t->total;
    p.bytes_split = splitting ? t->split_bytes + t->words.pos : t->total;
    p.passages = (uint32_t)t->n_pass;
    p.passages_embedded = splitting   ? 0
                          : embedding ? (uint32_t)semantic_texts_done(t->emb)
                                      : (uint32_t)t->n_pass;
    p.passages_written = (uint32_t)t->n_written;
    Llms__Response r = LLMS__RESPONSE__INIT;
    r.id = t->req->id;
    r.final = 0;
    r.body_case = LLMS__RESPONSE__BODY_KB_ADD_PROGRESS;
    r.kb_add_progress = &p;
    /* droppable: a client that does not read keeps no more than its output cap */
    reply_send(&t->k->to, t->conn_id, &r, true);
    t->progress_ns = clock_mono_ns();
}

void kb_task_progress(kb_task *t)
{
    if (t->progress && t->req->body_case == LLMS__REQUEST__BODY_KB_ADD &&
        clock_mono_ns() - t->progress_ns >= (int64_t)KB_PROGRESS_MS * 1000000)
        add_progress_send(t);
}

/* Splits the next document; after the last, checks the passages against the uid's limit
 * and starts their embedding. 1 when the request was answered (an error). */
static int add_split(kb_task *t)
{
    kbm *k = t->k;
    const Llms__KbAddRequest *ar = t->req->kb_add;
    char err[ERR_MAX];
    if (t->doc < ar->n_documents) {
        const Llms__KbDocument *d = ar->documents[t->doc];
        if (t->words.pos == 0)
            t->doc_len = strlen(d->text);
        size_t len = t->doc_len;
        if (scan_words(k, d->text, len, &t->words, KB_SPLIT_SLICE_BYTES, err) ||
            (t->words.pos == len &&
             split_words(d->text, &t->words, t->ptok, t->otok, &t->sp[t->doc], err))) {
            reply_error(&k->to, t->conn_id, t->req, LLMS__ERROR_CODE__INVALID_ARGUMENT,
                        "document '%.64s': %s", d->id, err);
            return 1;
        }
        if (t->words.pos == len) {
            word_scan_free(&t->words);
            t->split_bytes += len;
            t->n_pass += t->sp[t->doc++].n;
        }
        return 0;
    }
    bool ok;
    if (quota_check(k, t->uid, (int64_t)t->total, t->n_pass, &ok, err)) {
        reply_error(&k->to, t->conn_id, t->req, LLMS__ERROR_CODE__INTERNAL, "%s", err);
        return 1;
    }
    if (!ok) {
        reply_error(&k->to, t->conn_id, t->req, LLMS__ERROR_CODE__RESOURCE_EXHAUSTED, "%s", err);
        return 1;
    }
    if (!(t->texts = malloc(sizeof *t->texts * (size_t)t->n_pass))) {
        reply_error(&k->to, t->conn_id, t->req, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        return 1;
    }
    for (size_t i = 0, p = 0; i < ar->n_documents; i++)
        for (int j = 0; j < t->sp[i].n; j++)
            t->texts[p++] = t->sp[i].texts[j];
    if (!(t->emb = semantic_embed_texts(k->env.sem, t->texts, t->n_pass, err))) {
        reply_error(&k->to, t->conn_id, t->req, LLMS__ERROR_CODE__INTERNAL, "embedding: %s", err);
        return 1;
    }
    t->phase = KB_EMBED;
    return 0;
}

/* Whether the add's knowledge base is still there: a KbDrop may have taken it (or a new
 * one its name) between two slices. Otherwise err and *code say why. */
static bool add_kb_there(kb_task *t, Llms__ErrorCode *code, char err[ERR_MAX])
{
    kb_ref now;
    int found = kb_lookup(t->k, t->uid, t->app, t->req->kb_add->kb, &now, err);
    if (found == 1 && now.id == t->kb.id)
        return true;
    *code = LLMS__ERROR_CODE__INTERNAL;
    if (found >= 0) {
        *code = LLMS__ERROR_CODE__NOT_FOUND;
        err_set(err, "knowledge base '%s' was dropped during the KbAdd", t->req->kb_add->kb);
    }
    return false;
}

/* Stages every document (rows seen by no read, counted in the uid's usage from now on)
 * after checking the limits again: another KbAdd of the uid may have staged or
 * published since the split. 1 when the request was answered (an error). */
static int add_stage(kb_task *t)
{
    kbm *k = t->k;
    const Llms__KbAddRequest *ar = t->req->kb_add;
    char err[ERR_MAX];
    Llms__ErrorCode code = LLMS__ERROR_CODE__INTERNAL;
    bool ok = false;
    if (!add_kb_there(t, &code, err))
        goto fail;
    if (!(t->doc_ids = malloc(sizeof *t->doc_ids * ar->n_documents))) {
        err_set(err, "out of memory");
        goto fail;
    }
    /* staged rows need no flush of their own: the publish's flushes the log they are in */
    if (store_cache_begin(k->env.st, err))
        goto fail;
    if (quota_check(k, t->uid, (int64_t)t->total, t->n_pass, &ok, err) || !ok) {
        code = ok ? code : LLMS__ERROR_CODE__RESOURCE_EXHAUSTED;
        goto rollback;
    }
    for (size_t i = 0; i < ar->n_documents; i++) {
        const Llms__KbDocument *d = ar->documents[i];
        if (store_kb_stage_doc(k->env.st, t->kb.id, d->id, d->metadata,
                               (int64_t)strlen(d->text), t->sp[i].n, clock_wall_ms(),
                               &t->doc_ids[i], err))
            goto rollback;
    }
    if (store_cache_commit(k->env.st, err))
        goto fail;
    t->first_new = INT64_MAX;
    t->phase = KB_WRITE;
    return 0;
rollback:
    store_kb_rollback(k->env.st);
    store_cache_end(k->env.st);
fail:
    free(t->doc_ids);
    t->doc_ids = NULL;
    reply_error(&k->to, t->conn_id, t->req, code, "%s", err);
    return 1;
}

/* Writes the staged documents' next passages with their vectors: KB_WRITE_CHUNK at a
 * time for about KB_WRITE_SLICE_NS, in one transaction. 1 when the request was
 * answered (an error). */
static int add_write(kb_task *t)
{
    kbm *k = t->k;
    const Llms__KbAddRequest *ar = t->req->kb_add;
    char err[ERR_MAX];
    Llms__ErrorCode code = LLMS__ERROR_CODE__INTERNAL;
    const float *vecs = semantic_task_values(t->emb, err);
    if (!vecs || !add_kb_there(t, &code, err))
        goto fail;
    if (store_cache_begin(k->env.st, err))
        goto fail;
    int dim = t->kb.dim;
    int64_t t0 = clock_mono_ns();
    do {
        const Llms__KbDocument *d = ar->documents[t->wdoc];
        const split *sp = &t->sp[t->wdoc];
        int n = sp->n - t->wpass < KB_WRITE_CHUNK ? sp->n - t->wpass : KB_WRITE_CHUNK;
        int64_t first;
        if (store_kb_put_passages(k->env.st, t->kb.id, t->doc_ids[t->wdoc], d->text, sp->spans,
                                  sp->n, t->wpass, n, vecs + (size_t)t->n_written * dim, dim,
                                  &first, err)) {
            store_kb_rollback(k->env.st);
            store_cache_end(k->env.st);
            goto fail;
        }
        if (n > 0 && first < t->first_new)
            t->first_new = first;
        t->wpass += n;
        t->n_written += n;
        if (t->wpass == sp->n) {
            t->wdoc++;
            t->wpass = 0;
        }
    } while (t->wdoc < ar->n_documents && clock_mono_ns() - t0 < KB_WRITE_SLICE_NS);
    if (store_cache_commit(k->env.st, err))
        goto fail;
    if (t->wdoc == ar->n_documents) {
        t->phase = KB_PUBLISH;
        /* the last report says every passage is written, whenever the one before went */
        add_progress_send(t);
    }
    return 0;
fail:
    reply_error(&k->to, t->conn_id, t->req, code, "%s", err);
    return 1;
}

/* Makes every staged document visible in one small transaction (the visible ones of
 * their ids retired by it) and answers: the answer goes out after the commit, so an
 * acknowledged KbAdd survives a crash whole, and a failed one leaves nothing visible. */
static void add_publish(kb_task *t)
{
    kbm *k = t->k;
    const Llms__KbAddRequest *ar = t->req->kb_add;
    char err[ERR_MAX];
    Llms__ErrorCode code = LLMS__ERROR_CODE__INTERNAL;
    if (!add_kb_there(t, &code, err) ||
        store_kb_publish(k->env.st, t->kb.id, t->doc_ids, (int)ar->n_documents, err)) {
        reply_error(&k->to, t->conn_id, t->req, code, "%s", err);
        return;
    }
    t->published = true;
    cache_drop(k, t->kb.id);
    k->drops_pending = true; /* the documents it replaced */
    int invalidated = k->changed ? k->changed(k->changed_arg, &t->kb, t->first_new) : 0;
    Llms__KbAddResponse res = LLMS__KB_ADD_RESPONSE__INIT;
    res.documents = (uint32_t)ar->n_documents;
    res.passages = (uint32_t)t->n_pass;
    res.qa_invalidated = (uint32_t)invalidated;
    Llms__Response r = LLMS__RESPONSE__INIT;
    r.id = t->req->id;
    r.final = 1;
    r.body_case = LLMS__RESPONSE__BODY_KB_ADD;
    r.kb_add = &res;
    reply_send(&k->to, t->conn_id, &r, false);
}

int kb_task_advance(kb_task *t, int max_rows)
{
    char err[ERR_MAX];
    bool done;
    int rc;
    switch (t->phase) {
    case KB_SPLIT:
        if ((rc = add_split(t)) == 0)
            kb_task_progress(t);
        return rc;
    case KB_EMBED:
        /* on an encoder; a decoder's slices run in the step's forward */
        if (semantic_rows_left(t->emb) > 0 && !semantic_uses_slices(t->emb))
            semantic_advance(t->emb, max_rows);
        kb_task_progress(t);
        if (semantic_rows_left(t->emb) == 0)
            t->phase = KB_STAGE;
        return 0;
    case KB_STAGE:
        return add_stage(t);
    case KB_WRITE:
        if ((rc = add_write(t)) == 0)
            kb_task_progress(t);
        return rc;
    case KB_PUBLISH:
        add_publish(t);
        return 1;
    case KB_DROP:
        if (store_kb_drop_step(t->k->env.st, t->kb.id, max_rows * KB_DROP_ROWS_PER_ROW, &done,
                               err)) {
            reply_error(&t->k->to, t->conn_id, t->req, LLMS__ERROR_CODE__INTERNAL, "%s", err);
            return 1;
        }
        t->rows_left -= (long)max_rows * KB_DROP_ROWS_PER_ROW;
        if (done)
            t->phase = KB_VACUUM;
        return 0;
    case KB_VACUUM:
        /* the freed pages leave the file before the reply, a slice a turn (a page moved
         * costs about what a row deleted does) */
        if (store_vacuum_step(t->k->env.st, max_rows * KB_DROP_ROWS_PER_ROW, &done, err)) {
            reply_error(&t->k->to, t->conn_id, t->req, LLMS__ERROR_CODE__INTERNAL, "%s", err);
            return 1;
        }
        if (!done)
            return 0;
        reply_ok(&t->k->to, t->conn_id, t->req);
        return 1;
    }
    return 1;
}

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
    if (rc == 0 && (!done || id >= 0))
        return;
    /* none left, or the store fails: tried again after the next drop that stops early */
    k->drops_pending = false;
    if (rc && reqlog_enabled(REQLOG_WARN))
        fprintf(stderr, "llmsd: warn: %s: %s\n", what, err);
}

static void handle_remove(kbm *k, uint64_t conn_id, uint32_t uid, const char *app,
                          const Llms__Request *req)
{
    const Llms__KbRemoveRequest *rr = req->kb_remove;
    char err[ERR_MAX];
    kb_ref kb;
    if (!find_kb(k, conn_id, uid, app, req, rr->kb, &kb))
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
    cache_drop(k, kb.id);
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
    cache_drop(k, kb.id);
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

/* v's IVF index into *out: kept, or loaded and brought up to date, or (with train)
 * (re)built; saved when it changed. Without train an index that needs training is left
 * for idle time (v->train_pending) and *out is NULL. */
static int index_of(kbm *k, kb_vecs *v, bool train, ivf **out, char *err)
{
    *out = v->index;
    if (v->index)
        return 0;
    char name[32];
    snprintf(name, sizeof name, "kb:%lld", (long long)v->kb_id);
    ivf *ix = NULL;
    bool found;
    char load_err[ERR_MAX];
    int want = ivf_lists_for(v->n);
    ivf_rows rows = {v->ids, v->q, v->scale, v->n, v->dim};
    /* the index is derived data: one that does not load, or no longer fits, is rebuilt */
    if (ivf_load(k->env.st, v->app_id, name, &rows, &ix, &found, load_err) == 0 && found &&
        (ivf_dim(ix) != v->dim || want >= 2 * ivf_nlist(ix))) {
        ivf_free(ix);
        ix = NULL;
    }
    if (ix) {
        if (index_sync(ix, v, err))
            goto fail;
    } else if (!train) {
        v->train_pending = true;
        return 0;
    } else {
        ivf_train_params tp = {.nlist = want, .seed = (uint64_t)v->kb_id};
        float *all = malloc(sizeof *all * (size_t)v->n * v->dim);
        if (!all) {
            err_set(err, "out of memory");
            goto fail;
        }
        vecs_widen(v, 0, v->n, all);
        int rc = !(ix = ivf_new(v->dim, err)) || ivf_train(ix, all, v->n, v->dim, &tp, err) ||
                 ivf_add_q8(ix, v->ids, v->q, v->scale, v->n, v->dim, err);
        free(all);
        if (rc)
            goto fail;
        k->ivf_stats.trained++;
    }
    if (ivf_save(k->env.st, v->app_id, name, ix, err))
        goto fail;
    v->index = ix;
    v->train_pending = false;
    *out = ix;
    return 0;
fail:
    ivf_free(ix);
    return -1;
}

bool kb_ivf_train_pending(const kbm *k)
{
    for (const kb_vecs *v = k->cache; v; v = v->next)
        if (v->train_pending)
            return true;
    return false;
}

void kb_ivf_train_idle(kbm *k)
{
    char err[ERR_MAX];
    for (kb_vecs *v = k->cache; v; v = v->next)
        if (v->train_pending) {
            ivf *ix;
            if (index_of(k, v, true, &ix, err)) {
                /* searched exactly until the next change of the knowledge base */
                v->train_pending = false;
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
    if (index_of(k, v, false, &ix, err))
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
    if (!find_kb(k, conn_id, uid, app, req, sr->kb, &kb))
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
        if (semantic_embed_now(k->env.sem, sr->query, qvec, err)) {
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
