/* kb.c — libllmsclient: knowledge bases (create, add with progress, remove, list,
 * search), RAG queries and the RAG cache (stats, tuning, clearing). */
#include "client/llms.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "client/client_internal.h"
#include "proto/frame.h"

/* ---- knowledge bases and RAG ---- */

enum llms_status llms_kb_create(llms_conn *c, const char *name, uint32_t passage_tokens,
                                uint32_t overlap_tokens)
{
    return llms_kb_create_shared(c, name, passage_tokens, overlap_tokens, 0);
}

enum llms_status llms_kb_create_shared(llms_conn *c, const char *name,
                                       uint32_t passage_tokens, uint32_t overlap_tokens,
                                       int share_uid)
{
    llms_kb_options o = {passage_tokens, overlap_tokens, share_uid, NULL};
    return llms_kb_create_opts(c, name, &o);
}

enum llms_status llms_kb_create_opts(llms_conn *c, const char *name,
                                     const llms_kb_options *options)
{
    static const llms_kb_options defaults;
    const llms_kb_options *o = options ? options : &defaults;
    enum llms_status s = client_check_str(c, name, "name");
    if (s == LLMS_OK && o->embed_model)
        s = client_check_str(c, o->embed_model, "embed_model");
    if (s != LLMS_OK)
        return s;
    Llms__KbCreateRequest kc = LLMS__KB_CREATE_REQUEST__INIT;
    kc.name = (char *)name;
    kc.has_passage_tokens = o->passage_tokens != 0;
    kc.passage_tokens = o->passage_tokens;
    kc.has_overlap_tokens = o->overlap_tokens != 0;
    kc.overlap_tokens = o->overlap_tokens;
    kc.has_share_uid = o->share_uid != 0;
    kc.share_uid = o->share_uid != 0;
    kc.embed_model = (char *)o->embed_model;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_KB_CREATE;
    req.kb_create = &kc;
    return client_unary_ok(c, &req);
}

enum llms_status llms_kb_drop(llms_conn *c, const char *name)
{
    enum llms_status s = client_check_str(c, name, "name");
    if (s != LLMS_OK)
        return s;
    Llms__KbDropRequest kd = LLMS__KB_DROP_REQUEST__INIT;
    kd.kb = (char *)name;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_KB_DROP;
    req.kb_drop = &kd;
    return client_unary_ok(c, &req);
}

enum llms_status llms_kb_add(llms_conn *c, const char *kb, const llms_kb_doc *docs, size_t n,
                             uint32_t *passages)
{
    return llms_kb_add_progress(c, kb, docs, n, NULL, NULL, passages);
}

/* Reads KbAdd id's frames to its final one, passing progress reports to on_progress;
 * when it asks to stop, a Cancel goes out and the rest is drained without callbacks. */
static enum llms_status kb_add_stream(llms_conn *c, uint64_t id, llms_kb_progress_cb on_progress,
                                      void *user, uint32_t *passages)
{
    int cancelled = 0;
    for (;;) {
        Llms__Response *r;
        enum llms_status s = client_next_answer(c, id, cancelled, &r);
        if (s != LLMS_OK)
            return s;
        if (r->body_case == LLMS__RESPONSE__BODY_KB_ADD_PROGRESS && !r->final) {
            const Llms__KbAddProgress *p = r->kb_add_progress;
            llms_kb_progress pr = {
                .phase = (enum llms_kb_phase)p->phase,
                .documents = p->documents, .documents_written = p->documents_written,
                .bytes = p->bytes, .bytes_split = p->bytes_split,
                .passages = p->passages, .passages_embedded = p->passages_embedded,
                .passages_written = p->passages_written,
            };
            int stop = 0;
            if (!cancelled && on_progress) {
                c->in_callback = 1;
                stop = on_progress(&pr, user);
                c->in_callback = 0;
            }
            if (stop) {
                cancelled = 1;
                if ((s = client_send_cancel(c, id)) != LLMS_OK) {
                    frame_free_response(r);
                    return s;
                }
            }
            frame_free_response(r);
            continue;
        }
        if (r->body_case != LLMS__RESPONSE__BODY_KB_ADD || !r->final) {
            frame_free_response(r);
            return client_fail(c, LLMS_ERR_PROTOCOL,
                               "unexpected frame in a KbAdd's reply (body %d)", (int)r->body_case);
        }
        /* a Cancel that came after the publish: the add is done, and says so */
        if (passages)
            *passages = r->kb_add->passages;
        frame_free_response(r);
        c->err[0] = '\0';
        return LLMS_OK;
    }
}

enum llms_status llms_kb_add_progress(llms_conn *c, const char *kb, const llms_kb_doc *docs,
                                      size_t n, llms_kb_progress_cb on_progress, void *user,
                                      uint32_t *passages)
{
    enum llms_status s = client_check_str(c, kb, "kb");
    if (s != LLMS_OK)
        return s;
    for (size_t i = 0; i < n; i++)
        if ((s = client_check_str(c, docs[i].id, "document id")) != LLMS_OK ||
            (s = client_check_str(c, docs[i].text, "document text")) != LLMS_OK)
            return s;
    Llms__KbDocument *d = calloc(n ? n : 1, sizeof *d);
    Llms__KbDocument **dp = calloc(n ? n : 1, sizeof *dp);
    if (!d || !dp) {
        free(d);
        free(dp);
        return client_fail(c, LLMS_ERR_INTERNAL, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        llms__kb_document__init(&d[i]);
        d[i].id = (char *)docs[i].id;
        d[i].text = (char *)docs[i].text;
        d[i].metadata = (char *)docs[i].metadata;
        dp[i] = &d[i];
    }
    Llms__KbAddRequest ka = LLMS__KB_ADD_REQUEST__INIT;
    ka.kb = (char *)kb;
    ka.n_documents = n;
    ka.documents = dp;
    /* progress frames only when someone reads them: a plain add stays one frame */
    ka.has_progress = on_progress != NULL;
    ka.progress = on_progress != NULL;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_KB_ADD;
    req.kb_add = &ka;
    uint64_t id;
    s = client_send_request(c, &req, &id);
    free(d);
    free(dp);
    if (s != LLMS_OK)
        return s;
    return kb_add_stream(c, id, on_progress, user, passages);
}

enum llms_status llms_kb_remove(llms_conn *c, const char *kb, const char *const *ids, size_t n,
                                uint32_t *removed)
{
    enum llms_status s = client_check_str(c, kb, "kb");
    if (s != LLMS_OK)
        return s;
    for (size_t i = 0; i < n; i++)
        if ((s = client_check_str(c, ids[i], "document id")) != LLMS_OK)
            return s;
    Llms__KbRemoveRequest kr = LLMS__KB_REMOVE_REQUEST__INIT;
    kr.kb = (char *)kb;
    kr.n_ids = n;
    kr.ids = (char **)ids;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_KB_REMOVE;
    req.kb_remove = &kr;
    Llms__Response *r;
    if ((s = client_unary(c, &req, LLMS__RESPONSE__BODY_KB_REMOVE, &r)) != LLMS_OK)
        return s;
    if (removed)
        *removed = r->kb_remove->removed;
    frame_free_response(r);
    return LLMS_OK;
}

void llms_kb_list_free(llms_kb_info *kbs, size_t n)
{
    for (size_t i = 0; kbs && i < n; i++) {
        free(kbs[i].name);
        free(kbs[i].embed_model);
    }
    free(kbs);
}

enum llms_status llms_kb_list(llms_conn *c, llms_kb_info **out, size_t *n_out)
{
    *out = NULL;
    *n_out = 0;
    Llms__Empty e = LLMS__EMPTY__INIT;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_KB_LIST;
    req.kb_list = &e;
    Llms__Response *r;
    enum llms_status s = client_unary(c, &req, LLMS__RESPONSE__BODY_KB_LIST, &r);
    if (s != LLMS_OK)
        return s;
    size_t n = r->kb_list->n_kbs;
    llms_kb_info *k = calloc(n ? n : 1, sizeof *k);
    for (size_t i = 0; k && i < n; i++) {
        const Llms__KbInfo *p = r->kb_list->kbs[i];
        k[i] = (llms_kb_info){strdup(p->name), p->documents, p->passages, p->bytes,
                              p->passage_tokens, p->overlap_tokens, p->qa_entries,
                              p->share_uid, strdup(p->embed_model ? p->embed_model : "")};
        if (!k[i].name || !k[i].embed_model) {
            llms_kb_list_free(k, i + 1);
            k = NULL;
        }
    }
    frame_free_response(r);
    if (!k)
        return client_fail(c, LLMS_ERR_INTERNAL, "out of memory");
    *out = k;
    *n_out = n;
    return LLMS_OK;
}

void llms_kb_hits_free(llms_kb_hit *hits, size_t n)
{
    for (size_t i = 0; hits && i < n; i++) {
        free(hits[i].document);
        free(hits[i].text);
        free(hits[i].metadata);
    }
    free(hits);
}

/* Copies n proto hits into a fresh array; NULL when memory runs out. */
static llms_kb_hit *hits_from(Llms__KbHit **p, size_t n)
{
    llms_kb_hit *h = calloc(n ? n : 1, sizeof *h);
    for (size_t i = 0; h && i < n; i++) {
        h[i].passage = p[i]->passage;
        h[i].seq = p[i]->seq;
        h[i].score = p[i]->score;
        h[i].document = client_dup_or_null(p[i]->document);
        h[i].text = client_dup_or_null(p[i]->text);
        h[i].metadata = client_dup_or_null(p[i]->metadata);
        if (!h[i].document || (p[i]->text && !h[i].text) || (p[i]->metadata && !h[i].metadata)) {
            llms_kb_hits_free(h, i + 1);
            h = NULL;
        }
    }
    return h;
}

enum llms_status llms_kb_search(llms_conn *c, const char *kb, const char *query, uint32_t top_k,
                                enum llms_retrieval retrieval, llms_kb_hit **out, size_t *n_out)
{
    *out = NULL;
    *n_out = 0;
    enum llms_status s = client_check_str(c, kb, "kb");
    if (s != LLMS_OK || (s = client_check_str(c, query, "query")) != LLMS_OK)
        return s;
    Llms__KbSearchRequest ks = LLMS__KB_SEARCH_REQUEST__INIT;
    ks.kb = (char *)kb;
    ks.query = (char *)query;
    ks.has_top_k = top_k != 0;
    ks.top_k = top_k;
    ks.has_retrieval = 1;
    ks.retrieval = (Llms__Retrieval)retrieval;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_KB_SEARCH;
    req.kb_search = &ks;
    Llms__Response *r;
    if ((s = client_unary(c, &req, LLMS__RESPONSE__BODY_KB_SEARCH, &r)) != LLMS_OK)
        return s;
    size_t n = r->kb_search->n_hits;
    llms_kb_hit *h = hits_from(r->kb_search->hits, n);
    frame_free_response(r);
    if (!h)
        return client_fail(c, LLMS_ERR_INTERNAL, "out of memory");
    *out = h;
    *n_out = n;
    return LLMS_OK;
}

const char *llms_rag_outcome_name(enum llms_rag_outcome o)
{
    switch (o) {
    case LLMS_RAG_MISS:
        return "miss";
    case LLMS_RAG_QA_HIT:
        return "qa_hit";
    case LLMS_RAG_QKV_HIT:
        return "qkv_hit";
    }
    return "unknown";
}

void llms_rag_result_free(llms_rag_result *r)
{
    if (!r)
        return;
    llms_kb_hits_free(r->passages, r->n_passages);
    free(r->text);
    memset(r, 0, sizeof *r);
}

enum llms_status client_rag_result_from(llms_conn *c, const Llms__RagResult *p,
                                        llms_rag_result *out)
{
    *out = (llms_rag_result){
        .outcome = (enum llms_rag_outcome)p->outcome,
        .n_passages = p->n_passages,
        .prompt_tokens = p->prompt_tokens,
        .reused_tokens = p->reused_tokens,
        .reused_passages = p->reused_passages,
        .generated_tokens = p->generated_tokens,
        .retrieve_ms = p->retrieve_ms,
        .prefill_ms = p->prefill_ms,
        .decode_ms = p->decode_ms,
        .queue_ms = p->queue_ms,
        .stop_reason = (enum llms_stop_reason)p->stop_reason,
        .qa_similarity = p->has_qa_similarity ? p->qa_similarity : 0,
        .text = strdup(p->text),
        .passages = hits_from(p->passages, p->n_passages),
    };
    if (!out->text || !out->passages) {
        llms_rag_result_free(out);
        return client_fail(c, LLMS_ERR_INTERNAL, "out of memory");
    }
    return LLMS_OK;
}

enum llms_status llms_rag_query(llms_conn *c, const char *kb, const char *question,
                                const llms_rag_options *opt, llms_token_cb on_text, void *user,
                                llms_rag_result *out)
{
    llms_rag_result scratch;
    llms_rag_result *res = out ? out : &scratch;
    memset(res, 0, sizeof *res);
    enum llms_status s = client_check_str(c, kb, "kb");
    if (s != LLMS_OK || (s = client_check_str(c, question, "question")) != LLMS_OK)
        return s;
    client_params_pb pb;
    if ((s = client_params_pack(c, opt ? opt->params : NULL, &pb)) != LLMS_OK)
        return s;
    Llms__RagQueryRequest rq = LLMS__RAG_QUERY_REQUEST__INIT;
    rq.kb = (char *)kb;
    rq.question = (char *)question;
    if (opt) {
        rq.has_top_k = opt->top_k != 0;
        rq.top_k = opt->top_k;
        rq.has_retrieval = 1;
        rq.retrieval = (Llms__Retrieval)opt->retrieval;
        rq.system_prompt = (char *)opt->system_prompt;
        rq.params = client_params_packed(&pb);
        rq.has_no_qa = opt->no_qa != 0;
        rq.no_qa = opt->no_qa != 0;
        rq.has_no_qkv = opt->no_qkv != 0;
        rq.no_qkv = opt->no_qkv != 0;
        rq.has_share_system_uid = opt->share_system_uid != 0;
        rq.share_system_uid = opt->share_system_uid != 0;
    }
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_RAG_QUERY;
    req.rag_query = &rq;
    uint64_t id;
    s = client_send_request(c, &req, &id);
    client_params_pb_free(&pb);
    if (s != LLMS_OK)
        return s;
    s = client_stream(c, id, on_text, user, NULL, res);
    if (!out)
        llms_rag_result_free(&scratch);
    return s;
}

/* The CacheRequest of owner (NULL: the caller's app). */
static void cache_request(const llms_cache_owner *owner, Llms__CacheRequest *cr)
{
    llms__cache_request__init(cr);
    if (!owner)
        return;
    if (owner->all) {
        cr->has_all = cr->all = 1;
        return;
    }
    cr->has_uid = 1;
    cr->uid = owner->uid;
    cr->app = (char *)owner->app;
}

enum llms_status llms_cache_stats_get(llms_conn *c, llms_cache_stats *out)
{
    return llms_cache_stats_of(c, NULL, out);
}

enum llms_status llms_cache_stats_of(llms_conn *c, const llms_cache_owner *owner,
                                     llms_cache_stats *out)
{
    memset(out, 0, sizeof *out);
    Llms__CacheRequest e;
    cache_request(owner, &e);
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_CACHE;
    req.cache = &e;
    Llms__Response *r;
    enum llms_status s = client_unary(c, &req, LLMS__RESPONSE__BODY_CACHE, &r);
    if (s != LLMS_OK)
        return s;
    const Llms__CacheResponse *p = r->cache;
    out->qa_entries = p->qa_entries;
    out->qkv_nodes = p->qkv_nodes;
    out->qa_bytes = p->qa_bytes;
    out->qkv_bytes = p->qkv_bytes;
    out->qkv_budget_bytes = p->qkv_budget_bytes;
    out->rag_queries = p->rag_queries;
    out->qa_hits = p->qa_hits;
    out->qkv_hits = p->qkv_hits;
    out->qkv_tokens_reused = p->qkv_tokens_reused;
    out->qkv_evictions = p->qkv_evictions;
    out->qa_budget_bytes = p->qa_budget_bytes;
    out->qa_evictions = p->qa_evictions;
    out->tau_query = p->tau_query;
    out->tau_scheduler = p->tau_scheduler;
    out->predicted = p->predicted;
    out->predict_prefilled = p->predict_prefilled;
    out->predict_decoded = p->predict_decoded;
    out->predict_preempted = p->predict_preempted;
    out->predict_qa_hits = p->predict_qa_hits;
    out->predict_qkv_hits = p->predict_qkv_hits;
    out->predict_generations = p->predict_generations;
    out->predict_steps = p->predict_steps;
    out->predict_ms = p->predict_ms;
    out->predict_queued = p->predict_queued;
    out->predict_converted = p->predict_converted;
    out->predict_warmed = p->predict_warmed;
    out->qkv_verify_misses = p->qkv_verify_misses;
    out->predict_resumed = p->predict_resumed;
    frame_free_response(r);
    return LLMS_OK;
}

enum llms_status llms_cache_tune(llms_conn *c, float tau_query)
{
    Llms__CacheTuneRequest t = LLMS__CACHE_TUNE_REQUEST__INIT;
    t.tau_query = tau_query;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_CACHE_TUNE;
    req.cache_tune = &t;
    return client_unary_ok(c, &req);
}

enum llms_status llms_cache_clear(llms_conn *c)
{
    return llms_cache_clear_of(c, NULL);
}

enum llms_status llms_cache_clear_of(llms_conn *c, const llms_cache_owner *owner)
{
    Llms__CacheRequest e;
    cache_request(owner, &e);
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_CACHE_CLEAR;
    req.cache_clear = &e;
    return client_unary_ok(c, &req);
}
