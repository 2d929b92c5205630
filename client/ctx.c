/* ctx.c — libllmsclient: contexts (create, delete, list, get), generation on them and
 * without one (Call, Complete), the tokenizer calls, and the names of their enums. */
#include "client/llms.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "client/client_internal.h"
#include "proto/frame.h"

/* ---- names ---- */

const char *llms_overflow_name(enum llms_overflow o)
{
    switch (o) {
    case LLMS_OVERFLOW_DEFAULT:
        return "default";
    case LLMS_OVERFLOW_WINDOW:
        return "window";
    case LLMS_OVERFLOW_REFUSE:
        return "refuse";
    }
    return "unknown";
}

const char *llms_stop_reason_name(enum llms_stop_reason r)
{
    static const char *const names[] = {"eos",       "max_tokens", "stop_string", "context_full",
                                        "cancelled", "deadline",   "shutdown"};
    if ((unsigned)r < sizeof names / sizeof names[0])
        return names[r];
    return "unknown";
}

const char *llms_memory_name(enum llms_memory m)
{
    switch (m) {
    case LLMS_MEMORY_RESIDENT:
        return "resident";
    case LLMS_MEMORY_ON_DISK:
        return "on_disk";
    default:
        return "none";
    }
}

/* ---- contexts ---- */

enum llms_status llms_context_create(llms_conn *c, const char *system_prompt,
                                     const llms_params *params, char id_out[LLMS_ID_MAX])
{
    return llms_context_create_overflow(c, system_prompt, params, LLMS_OVERFLOW_DEFAULT, id_out);
}

enum llms_status llms_context_create_overflow(llms_conn *c, const char *system_prompt,
                                              const llms_params *params,
                                              enum llms_overflow overflow,
                                              char id_out[LLMS_ID_MAX])
{
    client_params_pb pb;
    enum llms_status s = client_params_pack(c, params, &pb);
    if (s != LLMS_OK)
        return s;
    Llms__CreateContextRequest cc = LLMS__CREATE_CONTEXT_REQUEST__INIT;
    cc.system_prompt = (char *)system_prompt;
    cc.defaults = client_params_packed(&pb);
    if (params)
        cc.model = (char *)params->model;
    if (overflow != LLMS_OVERFLOW_DEFAULT) {
        cc.has_overflow = 1;
        cc.overflow = (Llms__Overflow)overflow;
    }
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_CREATE_CONTEXT;
    req.create_context = &cc;
    Llms__Response *r;
    s = client_unary(c, &req, LLMS__RESPONSE__BODY_CREATE_CONTEXT, &r);
    client_params_pb_free(&pb);
    if (s != LLMS_OK)
        return s;
    const char *id = r->create_context->context_id;
    if (strlen(id) >= LLMS_ID_MAX)
        s = client_fail(c, LLMS_ERR_PROTOCOL, "context id longer than %d bytes", LLMS_ID_MAX - 1);
    else
        strcpy(id_out, id);
    frame_free_response(r);
    return s;
}

static enum llms_status delete_context(llms_conn *c, const char *context_id, int any_app)
{
    enum llms_status s = client_check_str(c, context_id, "context_id");
    if (s != LLMS_OK)
        return s;
    Llms__DeleteContextRequest d = LLMS__DELETE_CONTEXT_REQUEST__INIT;
    d.context_id = (char *)context_id;
    d.has_any_app = any_app;
    d.any_app = any_app;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_DELETE_CONTEXT;
    req.delete_context = &d;
    return client_unary_ok(c, &req);
}

enum llms_status llms_context_delete(llms_conn *c, const char *context_id)
{
    return delete_context(c, context_id, 0);
}

enum llms_status llms_admin_context_delete(llms_conn *c, const char *context_id)
{
    return delete_context(c, context_id, 1);
}

/* ---- streamed generation ---- */

void llms_result_free(llms_result *r)
{
    if (!r)
        return;
    free(r->text);
    free(r->logprobs);
    memset(r, 0, sizeof *r);
}

enum llms_status llms_call(llms_conn *c, const char *context_id, const char *prompt,
                           const llms_params *params, llms_token_cb on_text, void *user,
                           llms_result *out)
{
    if (out)
        memset(out, 0, sizeof *out);
    enum llms_status s = client_check_str(c, context_id, "context_id");
    if (s != LLMS_OK || (s = client_check_str(c, prompt, "prompt")) != LLMS_OK)
        return s;
    client_params_pb pb;
    if ((s = client_params_pack(c, params, &pb)) != LLMS_OK)
        return s;
    Llms__CallRequest call = LLMS__CALL_REQUEST__INIT;
    call.context_id = (char *)context_id;
    call.prompt = (char *)prompt;
    call.params = client_params_packed(&pb);
    if (params && params->raw) {
        call.has_raw = 1;
        call.raw = 1;
    }
    if (params && params->model)
        call.model = (char *)params->model;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_CALL;
    req.call = &call;
    uint64_t id;
    s = client_send_request(c, &req, &id);
    client_params_pb_free(&pb);
    if (s != LLMS_OK)
        return s;
    return client_stream(c, id, on_text, user, out, NULL);
}

enum llms_status llms_call_text(llms_conn *c, const char *context_id, const char *prompt,
                                const llms_params *params, char **text_out)
{
    llms_result r;
    *text_out = NULL;
    enum llms_status s = llms_call(c, context_id, prompt, params, NULL, NULL, &r);
    if (s == LLMS_OK)
        *text_out = r.text;
    else
        llms_result_free(&r);
    return s;
}

enum llms_status llms_complete(llms_conn *c, const char *prompt, const char *system_prompt,
                               int chat, const llms_params *params, llms_token_cb on_text,
                               void *user, llms_result *out)
{
    if (out)
        memset(out, 0, sizeof *out);
    enum llms_status s = client_check_str(c, prompt, "prompt");
    if (s != LLMS_OK)
        return s;
    client_params_pb pb;
    if ((s = client_params_pack(c, params, &pb)) != LLMS_OK)
        return s;
    Llms__CompleteRequest cr = LLMS__COMPLETE_REQUEST__INIT;
    cr.prompt = (char *)prompt;
    cr.system_prompt = (char *)system_prompt;
    cr.has_chat = 1;
    cr.chat = chat != 0;
    cr.params = client_params_packed(&pb);
    if (params)
        cr.model = (char *)params->model;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_COMPLETE;
    req.complete = &cr;
    uint64_t id;
    s = client_send_request(c, &req, &id);
    client_params_pb_free(&pb);
    if (s != LLMS_OK)
        return s;
    return client_stream(c, id, on_text, user, out, NULL);
}

/* ---- context listings ---- */

void llms_context_info_free(llms_context_info *info)
{
    if (!info)
        return;
    free(info->app_name);
    free(info->system_prompt);
    free(info->model);
    free(info->damage);
    for (size_t i = 0; i < info->n_history; i++) {
        free(info->history[i].role);
        free(info->history[i].content);
    }
    free(info->history);
    free(info->chunks);
    memset(info, 0, sizeof *info);
}

void llms_context_list_free(llms_context_info *infos, size_t n)
{
    if (!infos)
        return;
    for (size_t i = 0; i < n; i++)
        llms_context_info_free(&infos[i]);
    free(infos);
}

/* Copies a ContextInfo into *out (zeroed first, so a failure leaves it freeable). */
static enum llms_status info_from_proto(llms_conn *c, const Llms__ContextInfo *p,
                                        llms_context_info *out)
{
    memset(out, 0, sizeof *out);
    if (strlen(p->context_id) >= LLMS_ID_MAX)
        return client_fail(c, LLMS_ERR_PROTOCOL, "context id longer than %d bytes",
                           LLMS_ID_MAX - 1);
    strcpy(out->id, p->context_id);
    out->has_uid = p->has_uid;
    out->uid = p->uid;
    out->n_tokens = p->n_tokens;
    out->created_unix_ms = p->created_unix_ms;
    out->last_used_unix_ms = p->last_used_unix_ms;
    out->memory = (enum llms_memory)p->memory;
    out->kv_bytes = p->has_kv_bytes ? p->kv_bytes : 0;
    out->overflow = p->has_overflow ? (enum llms_overflow)p->overflow : LLMS_OVERFLOW_DEFAULT;
    out->window_slides = p->window_slides;
    out->window_dropped_tokens = p->window_dropped_tokens;
    out->app_name = client_dup_or_null(p->app_name);
    out->system_prompt = client_dup_or_null(p->system_prompt);
    out->model = client_dup_or_null(p->model);
    out->damage = client_dup_or_null(p->damage);
    if ((p->app_name && !out->app_name) || (p->system_prompt && !out->system_prompt) ||
        (p->model && !out->model) || (p->damage && !out->damage))
        return client_fail(c, LLMS_ERR_INTERNAL, "out of memory");
    if (p->n_history > 0) {
        out->history = calloc(p->n_history, sizeof *out->history);
        if (!out->history)
            return client_fail(c, LLMS_ERR_INTERNAL, "out of memory");
        out->n_history = p->n_history;
        for (size_t i = 0; i < p->n_history; i++) {
            out->history[i].role = strdup(p->history[i]->role);
            out->history[i].content = strdup(p->history[i]->content);
            if (!out->history[i].role || !out->history[i].content)
                return client_fail(c, LLMS_ERR_INTERNAL, "out of memory");
        }
    }
    if (p->n_chunks > 0) {
        out->chunks = calloc(p->n_chunks, sizeof *out->chunks);
        if (!out->chunks)
            return client_fail(c, LLMS_ERR_INTERNAL, "out of memory");
        out->n_chunks = p->n_chunks;
        for (size_t i = 0; i < p->n_chunks; i++) {
            const Llms__ChunkInfo *k = p->chunks[i];
            out->chunks[i] = (llms_chunk_info){k->index, k->n_tokens, k->resident, k->on_disk,
                                               k->bits, k->density};
        }
    }
    return LLMS_OK;
}

/* Every page of a listing, concatenated (contexts created or deleted between pages may
 * be missed or shifted, as with any paged listing). */
static enum llms_status list_contexts(llms_conn *c, bool all, llms_context_info **out,
                                      size_t *n_out)
{
    *out = NULL;
    *n_out = 0;
    llms_context_info *infos = NULL;
    size_t n = 0, cap = 0;
    enum llms_status s = LLMS_OK;
    for (;;) {
        Llms__ListContextsRequest lc = LLMS__LIST_CONTEXTS_REQUEST__INIT;
        lc.has_offset = 1;
        lc.offset = (uint32_t)n;
        Llms__Request req = LLMS__REQUEST__INIT;
        req.body_case = all ? LLMS__REQUEST__BODY_LIST_ALL_CONTEXTS
                            : LLMS__REQUEST__BODY_LIST_CONTEXTS;
        if (all)
            req.list_all_contexts = &lc;
        else
            req.list_contexts = &lc;
        Llms__Response *r;
        s = client_unary(c, &req, LLMS__RESPONSE__BODY_CONTEXTS, &r);
        if (s != LLMS_OK)
            break;
        size_t got = r->contexts->n_contexts;
        if (n + got > cap) {
            size_t ncap = cap ? cap : 64;
            while (ncap < n + got)
                ncap *= 2;
            llms_context_info *p = realloc(infos, ncap * sizeof *p);
            if (!p) {
                frame_free_response(r);
                s = client_fail(c, LLMS_ERR_INTERNAL, "out of memory");
                break;
            }
            memset(p + cap, 0, (ncap - cap) * sizeof *p);
            infos = p;
            cap = ncap;
        }
        for (size_t i = 0; i < got && s == LLMS_OK; i++, n++)
            s = info_from_proto(c, r->contexts->contexts[i], &infos[n]);
        bool more = got > 0 && r->contexts->has_total && n < r->contexts->total;
        frame_free_response(r);
        if (s != LLMS_OK || !more)
            break;
    }
    if (s != LLMS_OK) {
        llms_context_list_free(infos, n);
        return s;
    }
    if (!infos && !(infos = calloc(1, sizeof *infos)))
        return client_fail(c, LLMS_ERR_INTERNAL, "out of memory");
    *out = infos;
    *n_out = n;
    return LLMS_OK;
}

enum llms_status llms_context_list(llms_conn *c, llms_context_info **out, size_t *n_out)
{
    return list_contexts(c, false, out, n_out);
}

enum llms_status llms_list_all_contexts(llms_conn *c, llms_context_info **out, size_t *n_out)
{
    return list_contexts(c, true, out, n_out);
}

static enum llms_status get_context(llms_conn *c, const char *context_id, int with_history,
                                   int any_app, llms_context_info *out)
{
    memset(out, 0, sizeof *out);
    enum llms_status s = client_check_str(c, context_id, "context_id");
    if (s != LLMS_OK)
        return s;
    Llms__GetContextRequest g = LLMS__GET_CONTEXT_REQUEST__INIT;
    g.context_id = (char *)context_id;
    g.has_include_history = 1;
    g.include_history = with_history != 0;
    g.has_any_app = any_app;
    g.any_app = any_app;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_GET_CONTEXT;
    req.get_context = &g;
    Llms__Response *r;
    if ((s = client_unary(c, &req, LLMS__RESPONSE__BODY_CONTEXT, &r)) != LLMS_OK)
        return s;
    s = info_from_proto(c, r->context, out);
    frame_free_response(r);
    if (s != LLMS_OK)
        llms_context_info_free(out);
    return s;
}

enum llms_status llms_context_get(llms_conn *c, const char *context_id, int with_history,
                                  llms_context_info *out)
{
    return get_context(c, context_id, with_history, 0, out);
}

enum llms_status llms_admin_context_get(llms_conn *c, const char *context_id, int with_history,
                                        llms_context_info *out)
{
    return get_context(c, context_id, with_history, 1, out);
}

/* ---- tokens ---- */

enum llms_status llms_tokenize(llms_conn *c, const char *text, int add_special,
                               int parse_special, int32_t **tokens_out, size_t *n_out)
{
    return llms_tokenize_model(c, NULL, text, add_special, parse_special, tokens_out, n_out);
}

enum llms_status llms_tokenize_model(llms_conn *c, const char *model, const char *text,
                                     int add_special, int parse_special, int32_t **tokens_out,
                                     size_t *n_out)
{
    *tokens_out = NULL;
    *n_out = 0;
    enum llms_status s = client_check_str(c, text, "text");
    if (s != LLMS_OK)
        return s;
    Llms__TokenizeRequest t = LLMS__TOKENIZE_REQUEST__INIT;
    t.text = (char *)text;
    t.has_add_special = t.has_parse_special = 1;
    t.add_special = add_special != 0;
    t.parse_special = parse_special != 0;
    t.model = (char *)model;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_TOKENIZE;
    req.tokenize = &t;
    Llms__Response *r;
    if ((s = client_unary(c, &req, LLMS__RESPONSE__BODY_TOKENIZE, &r)) != LLMS_OK)
        return s;
    size_t n = r->tokenize->n_tokens;
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids) {
        frame_free_response(r);
        return client_fail(c, LLMS_ERR_INTERNAL, "out of memory");
    }
    if (n)
        memcpy(ids, r->tokenize->tokens, n * sizeof *ids);
    frame_free_response(r);
    *tokens_out = ids;
    *n_out = n;
    return LLMS_OK;
}

enum llms_status llms_detokenize(llms_conn *c, const int32_t *tokens, size_t n, char **text_out)
{
    return llms_detokenize_model(c, NULL, tokens, n, text_out);
}

enum llms_status llms_detokenize_model(llms_conn *c, const char *model, const int32_t *tokens,
                                       size_t n, char **text_out)
{
    *text_out = NULL;
    if (n > 0 && !tokens)
        return client_fail(c, LLMS_ERR_INVALID_ARGUMENT, "tokens is NULL");
    Llms__DetokenizeRequest d = LLMS__DETOKENIZE_REQUEST__INIT;
    d.n_tokens = n;
    d.tokens = (int32_t *)tokens;
    d.model = (char *)model;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_DETOKENIZE;
    req.detokenize = &d;
    Llms__Response *r;
    enum llms_status s = client_unary(c, &req, LLMS__RESPONSE__BODY_DETOKENIZE, &r);
    if (s != LLMS_OK)
        return s;
    *text_out = strdup(r->detokenize->text);
    frame_free_response(r);
    return *text_out ? LLMS_OK : client_fail(c, LLMS_ERR_INTERNAL, "out of memory");
}
