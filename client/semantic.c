/* semantic.c — libllmsclient: embeddings, reranking and rerank calibration. */
#include "client/llms.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "client/client_internal.h"
#include "proto/frame.h"

/* ---- embeddings and reranking ---- */

void llms_embeddings_free(llms_embeddings *e)
{
    if (!e)
        return;
    free(e->values);
    free(e->n_tokens);
    memset(e, 0, sizeof *e);
}

enum llms_status llms_embed(llms_conn *c, const char *const *texts, size_t n,
                            enum llms_pooling pooling, llms_embeddings *out)
{
    return llms_embed_model(c, NULL, texts, n, pooling, out);
}

enum llms_status llms_embed_model(llms_conn *c, const char *model, const char *const *texts,
                                  size_t n, enum llms_pooling pooling, llms_embeddings *out)
{
    memset(out, 0, sizeof *out);
    if (n > 0 && !texts)
        return client_fail(c, LLMS_ERR_INVALID_ARGUMENT, "texts is NULL");
    for (size_t i = 0; i < n; i++)
        if (!texts[i])
            return client_fail(c, LLMS_ERR_INVALID_ARGUMENT, "text %zu is NULL", i);
    Llms__EmbedRequest e = LLMS__EMBED_REQUEST__INIT;
    e.n_texts = n;
    e.texts = (char **)texts;
    e.has_pooling = pooling != LLMS_POOLING_MODEL;
    e.pooling = (Llms__Pooling)pooling;
    e.model = (char *)model;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_EMBED;
    req.embed = &e;
    Llms__Response *r;
    enum llms_status s = client_unary(c, &req, LLMS__RESPONSE__BODY_EMBED, &r);
    if (s != LLMS_OK)
        return s;
    const Llms__EmbedResponse *p = r->embed;
    size_t dim = p->dim;
    if (p->n_vectors != n || p->n_n_tokens != n) {
        size_t got = p->n_vectors;
        frame_free_response(r);
        return client_fail(c, LLMS_ERR_PROTOCOL, "llmsd sent %zu vectors for %zu texts", got, n);
    }
    for (size_t i = 0; i < n; i++)
        if (p->vectors[i]->n_values != dim) {
            size_t got = p->vectors[i]->n_values;
            frame_free_response(r);
            return client_fail(c, LLMS_ERR_PROTOCOL, "llmsd sent a vector of %zu values, not %zu",
                               got, dim);
        }
    out->values = malloc((n * dim > 0 ? n * dim : 1) * sizeof *out->values);
    out->n_tokens = malloc((n ? n : 1) * sizeof *out->n_tokens);
    if (!out->values || !out->n_tokens) {
        frame_free_response(r);
        llms_embeddings_free(out);
        return client_fail(c, LLMS_ERR_INTERNAL, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        if (dim)
            memcpy(out->values + i * dim, p->vectors[i]->values, dim * sizeof *out->values);
        out->n_tokens[i] = p->n_tokens[i];
    }
    out->n = n;
    out->dim = (uint32_t)dim;
    frame_free_response(r);
    return LLMS_OK;
}

void llms_rerank_options_init(llms_rerank_options *o)
{
    *o = (llms_rerank_options)LLMS_RERANK_OPTIONS_INIT;
}

void llms_rerank_result_free(llms_rerank_result *r)
{
    if (!r)
        return;
    free(r->hits);
    free(r->layers_computed);
    free(r->pruned_at_layer);
    memset(r, 0, sizeof *r);
}

/* Copies n uint32 into a fresh array (never NULL on success, even for n 0). */
static uint32_t *dup_u32(const uint32_t *p, size_t n)
{
    uint32_t *d = malloc((n ? n : 1) * sizeof *d);
    if (d && n)
        memcpy(d, p, n * sizeof *d);
    return d;
}

enum llms_status llms_rerank(llms_conn *c, const char *query, const char *const *documents,
                             size_t n, const llms_rerank_options *opts, llms_rerank_result *out)
{
    memset(out, 0, sizeof *out);
    enum llms_status s = client_check_str(c, query, "query");
    if (s != LLMS_OK)
        return s;
    if (n > 0 && !documents)
        return client_fail(c, LLMS_ERR_INVALID_ARGUMENT, "documents is NULL");
    for (size_t i = 0; i < n; i++)
        if (!documents[i])
            return client_fail(c, LLMS_ERR_INVALID_ARGUMENT, "document %zu is NULL", i);
    llms_rerank_options o = LLMS_RERANK_OPTIONS_INIT;
    if (opts)
        o = *opts;
    Llms__RerankRequest rq = LLMS__RERANK_REQUEST__INIT;
    rq.query = (char *)query;
    rq.n_documents = n;
    rq.documents = (char **)documents;
    rq.has_top_k = o.top_k != 0;
    rq.top_k = o.top_k;
    rq.has_mode = 1;
    rq.mode = (Llms__RerankMode)o.mode;
    rq.has_cv_threshold = !isnan(o.cv_threshold);
    rq.cv_threshold = o.cv_threshold;
    rq.has_target_precision = !isnan(o.target_precision);
    rq.target_precision = o.target_precision;
    rq.has_stream_weights = o.stream_weights >= 0;
    rq.stream_weights = o.stream_weights > 0;
    rq.model = (char *)o.model;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_RERANK;
    req.rerank = &rq;
    Llms__Response *r;
    if ((s = client_unary(c, &req, LLMS__RESPONSE__BODY_RERANK, &r)) != LLMS_OK)
        return s;
    const Llms__RerankResponse *p = r->rerank;
    for (size_t i = 0; i < p->n_hits; i++)
        if (p->hits[i]->index >= n) {
            uint32_t bad = p->hits[i]->index;
            frame_free_response(r);
            return client_fail(c, LLMS_ERR_PROTOCOL, "llmsd sent document index %u of %zu", bad, n);
        }
    out->hits = malloc((p->n_hits ? p->n_hits : 1) * sizeof *out->hits);
    out->layers_computed = dup_u32(p->layers_computed, p->n_layers_computed);
    out->pruned_at_layer = dup_u32(p->pruned_at_layer, p->n_pruned_at_layer);
    if (!out->hits || !out->layers_computed || !out->pruned_at_layer) {
        frame_free_response(r);
        llms_rerank_result_free(out);
        return client_fail(c, LLMS_ERR_INTERNAL, "out of memory");
    }
    for (size_t i = 0; i < p->n_hits; i++)
        out->hits[i] = (llms_rerank_hit){p->hits[i]->index, p->hits[i]->score};
    out->n_hits = p->n_hits;
    out->n_documents = p->n_layers_computed;
    out->n_layer = p->n_pruned_at_layer;
    out->peak_bytes = p->peak_bytes;
    out->time_ms = p->time_ms;
    out->cv_threshold = p->cv_threshold;
    frame_free_response(r);
    return LLMS_OK;
}

void llms_calibration_free(llms_calibration *cal)
{
    if (!cal)
        return;
    free(cal->grid);
    free(cal->grid_precision);
    memset(cal, 0, sizeof *cal);
}

enum llms_status llms_rerank_calibrate(llms_conn *c, const llms_rerank_query *queries, size_t n,
                                       float precision, uint32_t top_k,
                                       enum llms_rerank_mode mode, llms_calibration *out)
{
    memset(out, 0, sizeof *out);
    if (n > 0 && !queries)
        return client_fail(c, LLMS_ERR_INVALID_ARGUMENT, "queries is NULL");
    for (size_t i = 0; i < n; i++) {
        if (!queries[i].query || (queries[i].n_documents > 0 && !queries[i].documents))
            return client_fail(c, LLMS_ERR_INVALID_ARGUMENT, "query %zu is incomplete", i);
        for (size_t d = 0; d < queries[i].n_documents; d++)
            if (!queries[i].documents[d])
                return client_fail(c, LLMS_ERR_INVALID_ARGUMENT,
                                   "query %zu: document %zu is NULL", i, d);
    }
    Llms__RerankQuery *qs = calloc(n ? n : 1, sizeof *qs);
    Llms__RerankQuery **qp = calloc(n ? n : 1, sizeof *qp);
    if (!qs || !qp) {
        free(qs);
        free(qp);
        return client_fail(c, LLMS_ERR_INTERNAL, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        llms__rerank_query__init(&qs[i]);
        qs[i].query = (char *)queries[i].query;
        qs[i].n_documents = queries[i].n_documents;
        qs[i].documents = (char **)queries[i].documents;
        qp[i] = &qs[i];
    }
    Llms__RerankCalibrateRequest cr = LLMS__RERANK_CALIBRATE_REQUEST__INIT;
    cr.n_queries = n;
    cr.queries = qp;
    cr.precision = precision;
    cr.has_top_k = top_k != 0;
    cr.top_k = top_k;
    cr.has_mode = 1;
    cr.mode = (Llms__RerankMode)mode;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_RERANK_CALIBRATE;
    req.rerank_calibrate = &cr;
    Llms__Response *r;
    enum llms_status s = client_unary(c, &req, LLMS__RESPONSE__BODY_RERANK_CALIBRATE, &r);
    free(qs);
    free(qp);
    if (s != LLMS_OK)
        return s;
    const Llms__RerankCalibrateResponse *p = r->rerank_calibrate;
    size_t g = p->n_grid < p->n_grid_precision ? p->n_grid : p->n_grid_precision;
    out->grid = malloc((g ? g : 1) * sizeof *out->grid);
    out->grid_precision = malloc((g ? g : 1) * sizeof *out->grid_precision);
    if (!out->grid || !out->grid_precision) {
        frame_free_response(r);
        llms_calibration_free(out);
        return client_fail(c, LLMS_ERR_INTERNAL, "out of memory");
    }
    if (g) {
        memcpy(out->grid, p->grid, g * sizeof *out->grid);
        memcpy(out->grid_precision, p->grid_precision, g * sizeof *out->grid_precision);
    }
    out->n_grid = g;
    out->found = p->found;
    out->cv_threshold = p->cv_threshold;
    out->precision = p->precision;
    out->full_ms = p->full_ms;
    out->pruned_ms = p->pruned_ms;
    frame_free_response(r);
    return LLMS_OK;
}
