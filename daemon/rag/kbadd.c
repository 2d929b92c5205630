/*
 * kbadd.c — the knowledge-base work the scheduler advances a slice at a time (kb_begin,
 * kb_task_*): a KbAdd's ingest (its documents split into passages a slice of words at
 * a time, the passages embedded, the documents staged, their passages written in
 * slices of about KB_WRITE_SLICE_NS, all published in one transaction, KbAddProgress
 * along the way), and a KbDrop's rows deleted and pages vacuumed before it answers.
 */
#include "daemon/rag/kb.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/net/reply.h"
#include "daemon/rag/kbint.h"
#include "daemon/reqlog.h"
#include "engine/clock.h"
#include "storage/ivf.h"
#include "storage/kb.h"

/* ---- passages ---- */

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

static int doc_id_cmp(const void *a, const void *b)
{
    const Llms__KbDocument *const *x = a, *const *y = b;
    return strcmp((*x)->id, (*y)->id);
}

/* Whether the add names one id twice, answered as an error: the second document would
 * replace the first within the add, which no client means (llms kb add a/README.md
 * b/README.md gives both the id README.md). */
static bool add_ids_repeat(kbm *k, kb_task *t)
{
    const Llms__KbAddRequest *ar = t->req->kb_add;
    Llms__KbDocument **ids = malloc(ar->n_documents * sizeof *ids);
    if (!ids) {
        reply_error(&k->to, t->conn_id, t->req, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        return true;
    }
    memcpy(ids, ar->documents, ar->n_documents * sizeof *ids);
    qsort(ids, ar->n_documents, sizeof *ids, doc_id_cmp);
    const char *twice = NULL;
    for (size_t i = 1; i < ar->n_documents && !twice; i++)
        if (!strcmp(ids[i - 1]->id, ids[i]->id))
            twice = ids[i]->id;
    if (twice)
        reply_error(&k->to, t->conn_id, t->req, LLMS__ERROR_CODE__INVALID_ARGUMENT,
                    "two documents have the id '%.64s': an id names one document of the "
                    "knowledge base", twice);
    free(ids);
    return twice != NULL;
}

/* A KbAdd's checks, at once: NULL when it was answered (an error). */
static kb_task *add_begin(kb_task *t)
{
    kbm *k = t->k;
    const config *cfg = k->env.cfg;
    const Llms__KbAddRequest *ar = t->req->kb_add;
    char err[ERR_MAX];
    if (!kb_find(k, t->conn_id, t->uid, t->app, t->req, ar->kb, &t->kb))
        return NULL;
    if (!kb_embedder(k, &t->kb, err)) {
        reply_error(&k->to, t->conn_id, t->req, LLMS__ERROR_CODE__FAILED_PRECONDITION, "%s", err);
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
            reply_error(&k->to, t->conn_id, t->req, LLMS__ERROR_CODE__INVALID_ARGUMENT,
                        "document '%.64s' has %zu bytes, more than kb_max_doc_bytes (%d)", d->id,
                        bytes, cfg->kb_max_doc_bytes);
            return NULL;
        }
    }
    if (add_ids_repeat(k, t))
        return NULL;
    if (t->total > (size_t)cfg->kb_max_add_bytes) {
        reply_error(&k->to, t->conn_id, t->req, LLMS__ERROR_CODE__INVALID_ARGUMENT,
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
    if (!kb_find(k, t->conn_id, t->uid, t->app, t->req, t->req->kb_drop->kb, &t->kb))
        return NULL;
    bool found;
    store_kb info = {0};
    kb_cache_drop(k, t->kb.id);
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
    /* resolved again: the model may have been unloaded since add_begin */
    models_entry *me = kb_embedder(k, &t->kb, err);
    if (!me) {
        reply_error(&k->to, t->conn_id, t->req, LLMS__ERROR_CODE__FAILED_PRECONDITION, "%s", err);
        return 1;
    }
    if (!(t->emb = semantic_embed_texts(k->env.sem, me, t->texts, t->n_pass, err))) {
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
    kb_cache_drop(k, t->kb.id);
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
            /* the knowledge base is gone whatever the give-back does (a full disk): the
             * drop succeeded, and the free pages stay for new rows */
            if (reqlog_enabled(REQLOG_WARN))
                fprintf(stderr, "llmsd: warn: vacuuming after a knowledge base drop: %s\n",
                        err);
            done = true;
        }
        if (!done)
            return 0;
        reply_ok(&t->k->to, t->conn_id, t->req);
        return 1;
    }
    return 1;
}
