/*
 * session.c — request checks and the requests the loop answers itself.
 */
#include "daemon/net/session.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "daemon/ctx/ctxmgr.h"
#include "daemon/prompt.h"
#include "daemon/replyformat.h"
#include "daemon/reqlog.h"
#include "daemon/net/reply.h"
#include "daemon/net/tokreq.h"
#include "engine/model/drybreak.h"
#include "engine/model/logprob.h"
#include "engine/tok/stop.h"

bool session_peer_admin(int fd, uid_t uid, gid_t gid, bool have_admin_gid, gid_t admin_gid)
{
    if (uid == 0)
        return true;
    if (!have_admin_gid)
        return false;
    if (gid == admin_gid)
        return true;
    gid_t some[64], *groups = some;
    socklen_t len = sizeof some;
    int rc = getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len);
    if (rc != 0 && errno == ERANGE && (groups = malloc(len)))
        rc = getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len);
    bool found = false;
    for (size_t i = 0; rc == 0 && groups && i < len / sizeof groups[0]; i++)
        found |= groups[i] == admin_gid;
    if (groups != some)
        free(groups);
    return found;
}

bool session_valid_app(const char *name)
{
    size_t n = strlen(name);
    if (n < 1 || n > SCHED_APP_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return false;
    }
    return true;
}

/* The loop's own answers go straight to the connection (env->send), not through
 * reply_send: outq and reply_to carry the worker thread's replies. */
static void send_error(const session_env *env, void *conn, uint64_t id, Llms__ErrorCode code,
                       const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static void send_error(const session_env *env, void *conn, uint64_t id, Llms__ErrorCode code,
                       const char *fmt, ...)
{
    uint8_t *buf;
    size_t len;
    va_list ap;
    va_start(ap, fmt);
    int rc = reply_pack_error_v(id, code, env->cfg->max_frame_bytes, &buf, &len, fmt, ap);
    va_end(ap);
    if (rc == 0)
        env->send(conn, buf, len);
}

static bool is_admin_call(Llms__Request__BodyCase b)
{
    return b == LLMS__REQUEST__BODY_STATUS || b == LLMS__REQUEST__BODY_LIST_APPS ||
           b == LLMS__REQUEST__BODY_LIST_ALL_CONTEXTS || b == LLMS__REQUEST__BODY_EVICT_CONTEXT ||
           b == LLMS__REQUEST__BODY_SHUTDOWN || b == LLMS__REQUEST__BODY_PROFILE ||
           b == LLMS__REQUEST__BODY_PLAN || b == LLMS__REQUEST__BODY_LOAD_MODEL ||
           b == LLMS__REQUEST__BODY_UNLOAD_MODEL ||
           b == LLMS__REQUEST__BODY_RERANK_CALIBRATE || b == LLMS__REQUEST__BODY_CACHE_TUNE;
}

/* Answers a request the loop refuses, with a line in the log. */
static void refuse(const session_env *env, const session *ss, void *conn,
                   const Llms__Request *req, Llms__ErrorCode code, const char *msg)
{
    reqlog_request(ss->uid, ss->bound ? ss->app : "", req->body_case, -1, -1, code, msg);
    send_error(env, conn, req->id, code, "%s", msg);
}

/* An empty prompt or text would only run the chat template or nothing at all: a
 * mistake of the caller. NULL when the request is fine, else why not. */
static const char *empty_input(const Llms__Request *req)
{
    if (req->body_case == LLMS__REQUEST__BODY_CALL && !req->call->prompt[0])
        return "the prompt is empty";
    if (req->body_case == LLMS__REQUEST__BODY_COMPLETE && !req->complete->prompt[0] &&
        req->complete->n_prompt_parts == 0)
        return "the prompt is empty";
    if (req->body_case == LLMS__REQUEST__BODY_RAG_QUERY && !req->rag_query->question[0])
        return "the question is empty";
    if (req->body_case == LLMS__REQUEST__BODY_KB_SEARCH && !req->kb_search->query[0])
        return "the query is empty";
    if (req->body_case == LLMS__REQUEST__BODY_EMBED)
        for (size_t i = 0; i < req->embed->n_texts; i++)
            if (!req->embed->texts[i][0])
                return "a text to embed is empty";
    return NULL;
}

/* Why a request is refused before it costs anything: the code, and the message naming
 * the field and its limit. */
typedef struct refusal {
    Llms__ErrorCode code;
    char msg[256];
} refusal;

static bool refuse_as(refusal *r, Llms__ErrorCode code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static bool refuse_as(refusal *r, Llms__ErrorCode code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->msg, sizeof r->msg, fmt, ap);
    va_end(ap);
    r->code = code;
    return true;
}

static bool text_too_long(const config *cfg, const char *field, const char *text, refusal *r)
{
    size_t n = text ? strlen(text) : 0;
    if (n <= (size_t)cfg->max_text_bytes)
        return false;
    return refuse_as(r, LLMS__ERROR_CODE__INVALID_ARGUMENT,
                     "%s is %zu bytes, the limit is %d (max_text_bytes)", field, n,
                     cfg->max_text_bytes);
}

static bool bad_context_id(const char *id, refusal *r)
{
    if (strlen(id) <= CTX_ID_LEN)
        return false;
    return refuse_as(r, LLMS__ERROR_CODE__INVALID_ARGUMENT,
                     "context_id is %zu bytes, ids are at most %d", strlen(id), CTX_ID_LEN);
}

/* OpenAI takes up to 300 biased tokens; more would only grow every generation's sampler. */
#define SESSION_LOGIT_BIAS_MAX 1024

static bool finite_in(float x, float lo, float hi)
{
    return isfinite(x) && x >= lo && x <= hi;
}

/* llama.cpp's other samplers' settings out of their ranges (engine/model/sampler.h). */
static bool bad_newer_samplers(const Llms__GenerationParams *p, refusal *r)
{
    const Llms__ErrorCode inv = LLMS__ERROR_CODE__INVALID_ARGUMENT;
    if (p->has_min_keep && p->min_keep < 0)
        return refuse_as(r, inv, "min_keep must be >= 0");
    if (p->has_typical_p && !(p->typical_p > 0 && p->typical_p <= 1))
        return refuse_as(r, inv, "typical_p must be in (0, 1] (1: off)");
    if (p->has_top_n_sigma && !isfinite(p->top_n_sigma))
        return refuse_as(r, inv, "top_n_sigma must be a number (<= 0: off)");
    if (p->has_xtc_probability && !finite_in(p->xtc_probability, 0, 1))
        return refuse_as(r, inv, "xtc_probability must be in [0, 1] (0: off)");
    if (p->has_xtc_threshold && !finite_in(p->xtc_threshold, 0, 1))
        return refuse_as(r, inv, "xtc_threshold must be in [0, 1] (above 0.5: off)");
    if (p->has_dynatemp_range && !finite_in(p->dynatemp_range, 0, 100))
        return refuse_as(r, inv, "dynatemp_range must be in [0, 100] (0: off)");
    if (p->has_dynatemp_exponent && !finite_in(p->dynatemp_exponent, 0, 100))
        return refuse_as(r, inv, "dynatemp_exponent must be in [0, 100]");
    if (p->has_dry_multiplier && !finite_in(p->dry_multiplier, 0, 100))
        return refuse_as(r, inv, "dry_multiplier must be in [0, 100] (0: off)");
    if (p->has_dry_base && !finite_in(p->dry_base, 1, 100))
        return refuse_as(r, inv, "dry_base must be in [1, 100]");
    if (p->has_dry_allowed_length && p->dry_allowed_length < 0)
        return refuse_as(r, inv, "dry_allowed_length must be >= 0");
    if (p->has_dry_penalty_last_n && p->dry_penalty_last_n < -1)
        return refuse_as(r, inv, "dry_penalty_last_n must be >= -1 (-1: the window, 0: off)");
    if (p->n_dry_sequence_breakers > DRYBREAK_MAX)
        return refuse_as(r, inv, "dry_sequence_breakers has %zu strings, at most %d",
                         p->n_dry_sequence_breakers, DRYBREAK_MAX);
    if (p->has_mirostat && (p->mirostat < 0 || p->mirostat > 2))
        return refuse_as(r, inv, "mirostat must be 0 (off), 1 or 2");
    if (p->has_mirostat_tau && !finite_in(p->mirostat_tau, 0, 100))
        return refuse_as(r, inv, "mirostat_tau must be in [0, 100] (bits of surprise)");
    if (p->has_mirostat_eta && !finite_in(p->mirostat_eta, 0, 1))
        return refuse_as(r, inv, "mirostat_eta must be in [0, 1] (the learning rate)");
    unsigned seen = 0;
    for (size_t i = 0; i < p->n_samplers; i++) {
        unsigned step = (unsigned)p->samplers[i];
        if (step > LLMS__SAMPLER_STEP__SAMPLER_TEMPERATURE)
            return refuse_as(r, inv, "samplers[%zu] is no sampler", i);
        if (seen & 1u << step)
            return refuse_as(r, inv, "samplers names a sampler twice: each runs once");
        seen |= 1u << step;
    }
    return false;
}

/* Sampling settings that would make every call of a context fail or misbehave. */
static bool bad_params(const Llms__GenerationParams *p, refusal *r)
{
    const Llms__ErrorCode inv = LLMS__ERROR_CODE__INVALID_ARGUMENT;
    if (!p)
        return false;
    if (p->has_temperature && !(isfinite(p->temperature) && p->temperature <= 100))
        return refuse_as(r, inv, "temperature must be a number <= 100 (<= 0: greedy)");
    if (p->has_top_k && p->top_k < 0)
        return refuse_as(r, inv, "top_k must be >= 0 (0: off)");
    if (p->has_top_p && !(p->top_p > 0 && p->top_p <= 1))
        return refuse_as(r, inv, "top_p must be in (0, 1]");
    if (p->has_min_p && !(p->min_p >= 0 && p->min_p <= 1))
        return refuse_as(r, inv, "min_p must be in [0, 1]");
    if (p->has_repeat_penalty && !(p->repeat_penalty > 0 && p->repeat_penalty <= 100))
        return refuse_as(r, inv, "repeat_penalty must be in (0, 100]");
    if (p->has_frequency_penalty &&
        !(p->frequency_penalty >= -2 && p->frequency_penalty <= 2))
        return refuse_as(r, inv, "frequency_penalty must be in [-2, 2]");
    if (p->has_presence_penalty && !(p->presence_penalty >= -2 && p->presence_penalty <= 2))
        return refuse_as(r, inv, "presence_penalty must be in [-2, 2]");
    if (p->n_logit_bias > SESSION_LOGIT_BIAS_MAX)
        return refuse_as(r, inv, "logit_bias has %zu tokens, at most %d", p->n_logit_bias,
                         SESSION_LOGIT_BIAS_MAX);
    for (size_t i = 0; i < p->n_logit_bias; i++)
        if (p->logit_bias[i]->token < 0 ||
            !(p->logit_bias[i]->bias >= -100 && p->logit_bias[i]->bias <= 100))
            return refuse_as(r, inv, "logit_bias: token %d: ids are >= 0, biases in [-100, 100]",
                             p->logit_bias[i]->token);
    if (p->has_logprobs && !(p->logprobs >= 0 && p->logprobs <= LOGPROB_TOP_MAX))
        return refuse_as(r, inv, "logprobs must be in [0, %d] (the alternatives beside each "
                                 "token)", LOGPROB_TOP_MAX);
    if (p->has_repeat_last_n && p->repeat_last_n < -1)
        return refuse_as(r, inv, "repeat_last_n must be >= -1 (-1: the whole history)");
    if (p->has_max_tokens && p->max_tokens < 1)
        return refuse_as(r, inv, "max_tokens must be at least 1");
    if (bad_newer_samplers(p, r))
        return true;
    char err[ERR_MAX];
    if (replyformat_check(p, err))
        return refuse_as(r, inv, "%s", err);
    /* One place of the matcher is the chat template's own end text. */
    if (p->n_stop >= STOP_MAX)
        return refuse_as(r, inv, "stop has %zu strings, at most %d", p->n_stop, STOP_MAX - 1);
    for (size_t i = 0; i < p->n_stop; i++) {
        size_t n = strlen(p->stop[i]);
        if (n == 0 || n > STOP_MAX_LEN)
            return refuse_as(r, inv, "stop string %zu is %zu bytes, stop strings are 1..%d", i,
                             n, STOP_MAX_LEN);
    }
    return false;
}

/* A system prompt must leave room for a turn in the context window. */
static bool system_prompt_too_long(const session_env *env, const char *text, refusal *r)
{
    const config *cfg = env->cfg;
    if (!text || !text[0])
        return false;
    if (text_too_long(cfg, "system_prompt", text, r))
        return true;
    int32_t *ids;
    int n;
    char err[ERR_MAX];
    if (prompt_tokenize(env->tok, text, strlen(text), false, false, &ids, &n, err))
        return refuse_as(r, LLMS__ERROR_CODE__INTERNAL, "tokenize system_prompt: %s", err);
    free(ids);
    if (n < cfg->max_tokens_per_context)
        return false;
    return refuse_as(r, LLMS__ERROR_CODE__INVALID_ARGUMENT,
                     "system_prompt is %d tokens, the context window holds %d "
                     "(max_tokens_per_context)", n, cfg->max_tokens_per_context);
}

/* A Complete's prompt_parts stand for its whole prompt (no text prompt, chat or system
 * prompt beside them), each part text or token ids; their text and tokens together are
 * bounded as a prompt's text is (a token is at least one byte of it). */
static bool bad_prompt_parts(const config *cfg, const Llms__CompleteRequest *cr, refusal *r)
{
    const Llms__ErrorCode inv = LLMS__ERROR_CODE__INVALID_ARGUMENT;
    if (cr->n_prompt_parts == 0)
        return false;
    if (cr->prompt[0] || (cr->has_chat && cr->chat) || cr->system_prompt)
        return refuse_as(r, inv, "prompt_parts are the whole prompt: prompt must be empty, chat "
                                 "false and system_prompt unset");
    for (size_t i = 0; i < cr->n_prompt_parts; i++) {
        const Llms__PromptPart *p = cr->prompt_parts[i];
        if ((p->text && p->text[0]) == (p->n_tokens > 0))
            return refuse_as(r, inv, "prompt_parts[%zu] must hold text or token ids, one of "
                                     "them", i);
        for (size_t k = 0; k < p->n_tokens; k++)
            if (p->tokens[k] < 0)
                return refuse_as(r, inv, "prompt_parts[%zu]: token id %d is negative", i,
                                 p->tokens[k]);
    }
    size_t n = prompt_parts_weight(cr->prompt_parts, cr->n_prompt_parts);
    if (n <= (size_t)cfg->max_text_bytes)
        return false;
    return refuse_as(r, inv, "prompt_parts hold %zu bytes of text and tokens, the limit is %d "
                             "(max_text_bytes)", n, cfg->max_text_bytes);
}

/* A model name longer than any name is refused before it is looked up or echoed. */
static bool bad_model_name(const char *name, refusal *r)
{
    if (!name || strlen(name) <= MODELS_NAME_MAX)
        return false;
    return refuse_as(r, LLMS__ERROR_CODE__NOT_FOUND,
                     "model name is %zu bytes, names are at most %d", strlen(name),
                     MODELS_NAME_MAX);
}

static bool bad_load(const Llms__LoadModelRequest *q, refusal *r)
{
    if (!q->name[0] || strlen(q->name) > MODELS_NAME_MAX)
        return refuse_as(r, LLMS__ERROR_CODE__INVALID_ARGUMENT,
                         "name is %zu bytes, names are 1..%d", strlen(q->name), MODELS_NAME_MAX);
    if (!q->path[0] || strlen(q->path) >= CONFIG_PATH_MAX)
        return refuse_as(r, LLMS__ERROR_CODE__INVALID_ARGUMENT,
                         "path is %zu bytes, paths are 1..%d", strlen(q->path),
                         CONFIG_PATH_MAX - 1);
    if (q->n_roles > 3)
        return refuse_as(r, LLMS__ERROR_CODE__INVALID_ARGUMENT,
                         "%zu roles, there are 3 (generate, embed, rerank)", q->n_roles);
    if (q->lora && (!q->lora[0] || strlen(q->lora) >= CONFIG_PATH_MAX))
        return refuse_as(r, LLMS__ERROR_CODE__INVALID_ARGUMENT,
                         "adapters are %zu bytes, 1..%d", strlen(q->lora), CONFIG_PATH_MAX - 1);
    for (size_t i = 0; i < q->n_roles; i++)
        if (strlen(q->roles[i]) > 16)
            return refuse_as(r, LLMS__ERROR_CODE__INVALID_ARGUMENT,
                             "role %zu is not generate, embed or rerank", i);
    return false;
}

/* Checks the size of every string and list of a request against its limit. */
static bool oversized(const session_env *env, const Llms__Request *req, refusal *r)
{
    const config *cfg = env->cfg;
    switch (req->body_case) {
    case LLMS__REQUEST__BODY_LOAD_MODEL:
        return bad_load(req->load_model, r);
    case LLMS__REQUEST__BODY_UNLOAD_MODEL:
        return bad_model_name(req->unload_model->name, r);
    case LLMS__REQUEST__BODY_RERANK:
        return bad_model_name(req->rerank->model, r);
    case LLMS__REQUEST__BODY_RERANK_CALIBRATE:
        return bad_model_name(req->rerank_calibrate->model, r);
    case LLMS__REQUEST__BODY_CREATE_CONTEXT:
        return bad_model_name(req->create_context->model, r) ||
               bad_params(req->create_context->defaults, r) ||
               system_prompt_too_long(env, req->create_context->system_prompt, r);
    case LLMS__REQUEST__BODY_CALL:
        return bad_context_id(req->call->context_id, r) ||
               text_too_long(cfg, "prompt", req->call->prompt, r) ||
               bad_params(req->call->params, r) || bad_model_name(req->call->model, r);
    case LLMS__REQUEST__BODY_COMPLETE:
        return bad_model_name(req->complete->model, r) ||
               text_too_long(cfg, "prompt", req->complete->prompt, r) ||
               text_too_long(cfg, "system_prompt", req->complete->system_prompt, r) ||
               bad_prompt_parts(cfg, req->complete, r) || bad_params(req->complete->params, r);
    case LLMS__REQUEST__BODY_DELETE_CONTEXT:
        return bad_context_id(req->delete_context->context_id, r);
    case LLMS__REQUEST__BODY_GET_CONTEXT:
        return bad_context_id(req->get_context->context_id, r);
    case LLMS__REQUEST__BODY_EVICT_CONTEXT:
        return bad_context_id(req->evict_context->context_id, r);
    case LLMS__REQUEST__BODY_EMBED:
        if (bad_model_name(req->embed->model, r))
            return true;
        for (size_t i = 0; i < req->embed->n_texts; i++)
            if (text_too_long(cfg, "a text to embed", req->embed->texts[i], r))
                return true;
        return false;
    case LLMS__REQUEST__BODY_TOKENIZE:
        return text_too_long(cfg, "text", req->tokenize->text, r) ||
               bad_model_name(req->tokenize->model, r);
    case LLMS__REQUEST__BODY_RAG_QUERY:
        if (req->rag_query->params && req->rag_query->params->has_logprobs)
            return refuse_as(r, LLMS__ERROR_CODE__INVALID_ARGUMENT,
                             "logprobs are given by Call and Complete, not by a RagQuery");
        return text_too_long(cfg, "question", req->rag_query->question, r) ||
               text_too_long(cfg, "system_prompt", req->rag_query->system_prompt, r) ||
               bad_params(req->rag_query->params, r);
    case LLMS__REQUEST__BODY_GRAPH_RUN:
        if (req->graph_run->params && req->graph_run->params->has_logprobs)
            return refuse_as(r, LLMS__ERROR_CODE__INVALID_ARGUMENT,
                             "logprobs are given by Call and Complete, not by a GraphRun");
        return bad_params(req->graph_run->params, r);
    case LLMS__REQUEST__BODY_KB_SEARCH:
        return text_too_long(cfg, "query", req->kb_search->query, r);
    case LLMS__REQUEST__BODY_DETOKENIZE:
        if (bad_model_name(req->detokenize->model, r))
            return true;
        /* Ids of more than one context window are never one text to show. */
        if (req->detokenize->n_tokens <= (size_t)cfg->max_tokens_per_context)
            return false;
        return refuse_as(r, LLMS__ERROR_CODE__INVALID_ARGUMENT,
                         "tokens has %zu ids, the limit is %d (max_tokens_per_context)",
                         req->detokenize->n_tokens, cfg->max_tokens_per_context);
    default:
        return false;
    }
}

/* Admin calls answered without an app, so that an administrator's tool does not show up
 * as an app itself. RerankCalibrate queues engine work, which belongs to an app. */
static bool is_unbound_admin_call(const session *ss, const Llms__Request *req)
{
    Llms__Request__BodyCase b = req->body_case;
    if (!ss->admin)
        return false;
    if (b == LLMS__REQUEST__BODY_GET_CONTEXT)
        return req->get_context->has_any_app && req->get_context->any_app;
    if (b == LLMS__REQUEST__BODY_DELETE_CONTEXT)
        return req->delete_context->has_any_app && req->delete_context->any_app;
    /* Cache and CacheClear are an app's own caches when bound, and those an admin names
     * (rag_handle_cache) otherwise */
    return (is_admin_call(b) && b != LLMS__REQUEST__BODY_RERANK_CALIBRATE) ||
           b == LLMS__REQUEST__BODY_LIST_MODELS || b == LLMS__REQUEST__BODY_CACHE ||
           b == LLMS__REQUEST__BODY_CACHE_CLEAR;
}

static void send_resp(const session_env *env, void *conn, Llms__Response *r)
{
    uint8_t *buf;
    size_t len;
    r->final = 1;
    if (reply_pack(r, env->cfg->max_frame_bytes, &buf, &len) == 0)
        env->send(conn, buf, len);
}

static void handle_bind(const session_env *env, session *ss, void *conn, const Llms__Request *req)
{
    const char *name = req->bind->app_name;
    if (ss->bound) {
        send_error(env, conn, req->id, LLMS__ERROR_CODE__FAILED_PRECONDITION,
                   "this connection is already bound to app '%s'", ss->app);
        return;
    }
    if (!session_valid_app(name)) {
        send_error(env, conn, req->id, LLMS__ERROR_CODE__INVALID_ARGUMENT,
                   "app name must be 1..%d bytes of [A-Za-z0-9._-]", SCHED_APP_MAX);
        return;
    }
    int names = env->bound_names(env->shutdown_arg, ss->uid, name);
    if (names >= env->cfg->max_apps_per_uid) {
        send_error(env, conn, req->id, LLMS__ERROR_CODE__RESOURCE_EXHAUSTED,
                   "uid %u has %d other app names bound, the limit (max_apps_per_uid)",
                   (unsigned)ss->uid, names);
        return;
    }
    sched_job *j = sched_job_new(SCHED_BOUND, ss->conn_id);
    if (!j) {
        send_error(env, conn, req->id, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        return;
    }
    ss->bound = true;
    snprintf(ss->app, sizeof ss->app, "%s", name);
    j->uid = ss->uid;
    snprintf(j->app, sizeof j->app, "%s", name);
    sched_submit(env->sch, j);
    Llms__BindResponse b = LLMS__BIND_RESPONSE__INIT;
    b.uid = ss->uid;
    b.app_name = ss->app;
    b.admin = ss->admin;
    Llms__Response r = LLMS__RESPONSE__INIT;
    r.id = req->id;
    r.body_case = LLMS__RESPONSE__BODY_BIND;
    r.bind = &b;
    send_resp(env, conn, &r);
}

/* Tokenize and Detokenize with the default generate model's tokenizer (those naming a
 * model go to the worker, which has the registry). */
static void handle_tokens(const session_env *env, void *conn, const Llms__Request *req)
{
    char err[ERR_MAX];
    tokreq_answer a;
    Llms__ErrorCode code = tokreq_answer_build(env->tok, req, env->cfg->max_frame_bytes, &a, err);
    if (code != LLMS__ERROR_CODE__OK)
        send_error(env, conn, req->id, code, "%s%s",
                   req->body_case == LLMS__REQUEST__BODY_TOKENIZE ? "tokenize: " : "", err);
    else
        send_resp(env, conn, &a.r);
    tokreq_answer_free(&a);
}

void session_handle(const session_env *env, session *ss, void *conn, Llms__Request *req)
{
    Llms__Request__BodyCase b = req->body_case;
    const char *empty;
    refusal why;
    if (b == LLMS__REQUEST__BODY__NOT_SET) {
        refuse(env, ss, conn, req, LLMS__ERROR_CODE__UNIMPLEMENTED,
               "request has no body this daemon knows");
    } else if (b == LLMS__REQUEST__BODY_BIND) {
        handle_bind(env, ss, conn, req);
    } else if (!ss->bound && !is_unbound_admin_call(ss, req)) {
        refuse(env, ss, conn, req, LLMS__ERROR_CODE__FAILED_PRECONDITION,
               "Bind(app_name) first");
    } else if (is_admin_call(b) && !ss->admin) {
        char msg[128];
        snprintf(msg, sizeof msg, "admin call: needs uid 0 or group %s", env->cfg->admin_group);
        refuse(env, ss, conn, req, LLMS__ERROR_CODE__PERMISSION_DENIED, msg);
    } else if ((empty = empty_input(req))) {
        refuse(env, ss, conn, req, LLMS__ERROR_CODE__INVALID_ARGUMENT, empty);
    } else if (oversized(env, req, &why)) {
        refuse(env, ss, conn, req, why.code, why.msg);
    } else if ((b == LLMS__REQUEST__BODY_TOKENIZE || b == LLMS__REQUEST__BODY_DETOKENIZE) &&
               !(tokreq_model(req) && tokreq_model(req)[0])) {
        handle_tokens(env, conn, req);
    } else if (b == LLMS__REQUEST__BODY_SHUTDOWN) {
        Llms__Empty e = LLMS__EMPTY__INIT;
        Llms__Response r = LLMS__RESPONSE__INIT;
        r.id = req->id;
        r.body_case = LLMS__RESPONSE__BODY_OK;
        r.ok = &e;
        send_resp(env, conn, &r);
        env->shutdown(env->shutdown_arg);
    } else {
        sched_job *j = sched_job_new(SCHED_REQUEST, ss->conn_id);
        if (!j) {
            send_error(env, conn, req->id, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        } else {
            j->uid = ss->uid;
            snprintf(j->app, sizeof j->app, "%s", ss->app);
            j->admin = ss->admin;
            j->req = req;
            sched_submit(env->sch, j);
            env->submitted(conn);
            return;
        }
    }
    llms__request__free_unpacked(req, NULL);
}
