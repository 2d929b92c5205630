/* retrieval.c — a graph's retrieval node in sub-stages (retrieval.h). */
#include "daemon/retrieval.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/graph.h"
#include "daemon/textbuf.h"
#include "engine/vdist.h"
#include "storage/kb.h"

enum stage { STAGE_EMBED, STAGE_SEARCH, STAGE_READ, STAGE_DONE };

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
    kb_hit hits[GRAPH_TOP_K_MAX];
    int n_hits;
    char *text;
    size_t len, cap;
};

void retrieval_free(retrieval *r)
{
    if (!r)
        return;
    free(r->query);
    free(r->qvec);
    free(r->text);
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
    if (mode != LLMS__RETRIEVAL__RETRIEVAL_BM25 && r->kb.dim != semantic_dim(sem)) {
        *code = LLMS__ERROR_CODE__FAILED_PRECONDITION;
        err_set(err, "knowledge base '%s' holds vectors of %d floats, the embedder makes %d",
                kb_name, r->kb.dim, semantic_dim(sem));
        retrieval_free(r);
        return NULL;
    }
    r->stage = blank(query) ? STAGE_DONE
               : mode == LLMS__RETRIEVAL__RETRIEVAL_BM25 ? STAGE_SEARCH : STAGE_EMBED;
    return r;
}

static int add_passage(void *arg, const store_passage *p)
{
    retrieval *r = arg;
    if (r->len && textbuf_append(&r->text, &r->len, &r->cap, "\n\n", 2))
        return 1;
    return textbuf_append(&r->text, &r->len, &r->cap, p->text, strlen(p->text)) ? 1 : 0;
}

int retrieval_step(retrieval *r, Llms__ErrorCode *code, char err[ERR_MAX])
{
    *code = LLMS__ERROR_CODE__INTERNAL;
    switch (r->stage) {
    case STAGE_EMBED:
        if (!(r->qvec = malloc(sizeof *r->qvec * (size_t)r->kb.dim)))
            return err_set(err, "out of memory");
        if (semantic_embed_now(r->sem, r->query, r->qvec, err)) {
            *code = LLMS__ERROR_CODE__INVALID_ARGUMENT;
            return -1;
        }
        vdist_normalize(r->qvec, r->kb.dim);
        r->stage = STAGE_SEARCH;
        return 0;
    case STAGE_SEARCH:
        if (kb_retrieve(r->k, &r->kb, r->query, r->qvec, r->top_k, r->mode, r->hits, &r->n_hits,
                        err))
            return -1;
        r->stage = STAGE_READ;
        return 0;
    case STAGE_READ:
        for (int i = 0; i < r->n_hits; i++) {
            bool found;
            int rc = store_kb_passage(r->st, r->kb.id, r->hits[i].id, add_passage, r, &found, err);
            if (rc > 0)
                return err_set(err, "out of memory");
            if (rc)
                return -1;
        }
        r->stage = STAGE_DONE;
        return 1;
    case STAGE_DONE:
        break;
    }
    return 1;
}

const char *retrieval_text(const retrieval *r, size_t *len)
{
    *len = r->len;
    return r->text ? r->text : "";
}
