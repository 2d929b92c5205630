/* retrieval.c — a graph's retrieval node in sub-stages (retrieval.h). */
#include "daemon/rag/retrieval.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/graph/graph.h"
#include "daemon/textbuf.h"
#include "engine/vdist.h"
#include "storage/kb.h"

enum stage { STAGE_BM25, STAGE_EMBED, STAGE_SEARCH, STAGE_READ, STAGE_DONE };

/* A list of passages and, once read, their texts joined. */
typedef struct passages {
    int64_t ids[GRAPH_TOP_K_MAX];
    int n;
    char *text;
    size_t len, cap;
    bool read;
} passages;

struct retrieval {
    kbm *k;
    semantic *sem;
    store *st;
    kb_ref kb;
    char *query;
    int top_k;
    Llms__Retrieval mode;
    enum stage stage;
    float *qvec;
    kb_hit bm[KB_CAND_MAX];  /* the BM25 candidates, best first */
    int n_bm;
    passages final;
    passages prov;           /* the estimate (prov_from: where it came from) */
    enum retrieval_estimate prov_from;
    kb_hints *hints;         /* the request's similarity hints (kb.h), or NULL */
};

static void passages_clear(passages *p)
{
    free(p->text);
    memset(p, 0, sizeof *p);
}

void retrieval_free(retrieval *r)
{
    if (!r)
        return;
    free(r->query);
    free(r->qvec);
    passages_clear(&r->final);
    passages_clear(&r->prov);
    free(r);
}

static bool blank(const char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    return *s == '\0';
}

retrieval *retrieval_begin(kbm *k, semantic *sem, store *st, uint32_t uid, const char *app,
                           const char *kb_name, const char *query, int top_k,
                           Llms__Retrieval mode, Llms__ErrorCode *code, char err[ERR_MAX])
{
    *code = LLMS__ERROR_CODE__INTERNAL;
    retrieval *r = calloc(1, sizeof *r);
    if (!r || !(r->query = strdup(query))) {
        free(r);
        err_set(err, "out of memory");
        return NULL;
    }
    r->k = k;
    r->sem = sem;
    r->st = st;
    r->top_k = top_k;
    r->mode = mode;
    int found = kb_lookup(k, uid, app, kb_name, &r->kb, err);
    if (found <= 0) {
        *code = found == 0 ? LLMS__ERROR_CODE__NOT_FOUND : *code;
        retrieval_free(r);
        return NULL;
    }
    if (top_k < 1 || top_k > GRAPH_TOP_K_MAX) {
        *code = LLMS__ERROR_CODE__INVALID_ARGUMENT;
        err_set(err, "top_k must be 1..%d", GRAPH_TOP_K_MAX);
        retrieval_free(r);
        return NULL;
    }
    if (mode != LLMS__RETRIEVAL__RETRIEVAL_BM25 && !kb_embedder(k, &r->kb, err)) {
        *code = LLMS__ERROR_CODE__FAILED_PRECONDITION;
        retrieval_free(r);
        return NULL;
    }
    /* BM25 goes first (when the mode uses it): it needs no embedding, so a hybrid
     * retrieval has its estimate before the costliest sub-stage */
    r->stage = blank(query) ? STAGE_DONE
               : mode == LLMS__RETRIEVAL__RETRIEVAL_VECTOR ? STAGE_EMBED : STAGE_BM25;
    r->final.read = r->stage == STAGE_DONE;
    return r;
}

static int add_passage(void *arg, const store_passage *pg)
{
    passages *p = arg;
    if (p->len && textbuf_append(&p->text, &p->len, &p->cap, "\n\n", 2))
        return 1;
    return textbuf_append(&p->text, &p->len, &p->cap, pg->text, strlen(pg->text)) ? 1 : 0;
}

/* The passages' texts, best first, joined by blank lines. */
static int read_passages(retrieval *r, passages *p, char err[ERR_MAX])
{
    for (int i = 0; i < p->n; i++) {
        bool found;
        int rc = store_kb_passage(r->st, r->kb.id, p->ids[i], add_passage, p, &found, err);
        if (rc > 0)
            return err_set(err, "out of memory");
        if (rc)
            return -1;
    }
    p->read = true;
    return 0;
}

static bool same_ids(const passages *a, const passages *b)
{
    return a->n == b->n && memcmp(a->ids, b->ids, sizeof *a->ids * (size_t)a->n) == 0;
}

int retrieval_step(retrieval *r, Llms__ErrorCode *code, char err[ERR_MAX])
{
    *code = LLMS__ERROR_CODE__INTERNAL;
    switch (r->stage) {
    case STAGE_BM25:
        if (kb_retrieve_bm25(r->k, &r->kb, r->query, r->top_k, r->mode, r->bm, &r->n_bm, err))
            return -1;
        if (r->mode != LLMS__RETRIEVAL__RETRIEVAL_BM25 && r->prov_from == RETRIEVAL_ESTIMATE_NONE) {
            r->prov.n = r->n_bm < r->top_k ? r->n_bm : r->top_k;
            for (int i = 0; i < r->prov.n; i++)
                r->prov.ids[i] = r->bm[i].id;
            r->prov_from = RETRIEVAL_ESTIMATE_BM25;
        }
        r->stage = r->mode == LLMS__RETRIEVAL__RETRIEVAL_BM25 ? STAGE_SEARCH : STAGE_EMBED;
        return 0;
    case STAGE_EMBED:
        if (!(r->qvec = malloc(sizeof *r->qvec * (size_t)r->kb.dim)))
            return err_set(err, "out of memory");
        /* resolved again: the model may have been unloaded since the retrieval began */
        models_entry *me = kb_embedder(r->k, &r->kb, err);
        if (!me) {
            *code = LLMS__ERROR_CODE__FAILED_PRECONDITION;
            return -1;
        }
        if (semantic_embed_now(r->sem, me, r->query, r->qvec, err)) {
            *code = LLMS__ERROR_CODE__INVALID_ARGUMENT;
            return -1;
        }
        vdist_normalize(r->qvec, r->kb.dim);
        r->stage = STAGE_SEARCH;
        return 0;
    case STAGE_SEARCH: {
        kb_hit hits[GRAPH_TOP_K_MAX];
        if (kb_retrieve_fuse(r->k, &r->kb, r->qvec, r->top_k, r->mode, r->bm, r->n_bm,
                             r->hints, hits, &r->final.n, err))
            return -1;
        for (int i = 0; i < r->final.n; i++)
            r->final.ids[i] = hits[i].id;
        r->stage = STAGE_READ;
        if (!r->prov.read || !same_ids(&r->final, &r->prov))
            return 0;
        /* the estimate was right and its texts are read already */
        r->final.text = r->prov.text;
        r->final.len = r->prov.len;
        r->final.cap = r->prov.cap;
        r->final.read = true;
        r->prov.text = NULL;
        r->prov.len = r->prov.cap = 0;
        r->prov.read = false;
        r->stage = STAGE_DONE;
        return 1;
    }
    case STAGE_READ:
        if (read_passages(r, &r->final, err))
            return -1;
        r->stage = STAGE_DONE;
        return 1;
    case STAGE_DONE:
        break;
    }
    return 1;
}

bool retrieval_done(const retrieval *r)
{
    return r->stage == STAGE_DONE;
}

const char *retrieval_text(const retrieval *r, size_t *len)
{
    *len = r->final.len;
    return r->final.text ? r->final.text : "";
}

void retrieval_use_hints(retrieval *r, kb_hints *hints)
{
    r->hints = hints;
}

void retrieval_seed(retrieval *r, const retrieval *from)
{
    passages_clear(&r->prov);
    r->prov.n = from->final.n;
    memcpy(r->prov.ids, from->final.ids, sizeof *r->prov.ids * (size_t)from->final.n);
    r->prov_from = RETRIEVAL_ESTIMATE_SEED;
    /* its texts come along when they fit in memory, else they are read when asked for */
    size_t len;
    const char *text = retrieval_text(from, &len);
    if (from->final.read && textbuf_append(&r->prov.text, &r->prov.len, &r->prov.cap, text,
                                           len) == 0)
        r->prov.read = true;
}

enum retrieval_estimate retrieval_estimate(const retrieval *r)
{
    return r->stage == STAGE_DONE ? RETRIEVAL_ESTIMATE_NONE : r->prov_from;
}

const char *retrieval_estimate_text(retrieval *r, size_t *len, char err[ERR_MAX])
{
    if (!r->prov.read && read_passages(r, &r->prov, err)) {
        passages_clear(&r->prov);
        r->prov_from = RETRIEVAL_ESTIMATE_NONE;
        return NULL;
    }
    *len = r->prov.len;
    return r->prov.text ? r->prov.text : "";
}

bool retrieval_estimate_held(const retrieval *r)
{
    return r->prov_from != RETRIEVAL_ESTIMATE_NONE && same_ids(&r->final, &r->prov);
}
