/*
 * session.c — request checks and the requests the loop answers itself.
 */
#include "daemon/session.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/prompt.h"
#include "daemon/reqlog.h"
#include "daemon/resp.h"

bool session_peer_admin(uid_t uid, gid_t gid, pid_t pid, bool have_admin_gid, gid_t admin_gid)
{
    if (uid == 0)
        return true;
    if (!have_admin_gid)
        return false;
    if (gid == admin_gid)
        return true;
    char path[64], line[4096];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        if (strncmp(line, "Groups:", 7) != 0)
            continue;
        char *p = line + 7, *end;
        for (;;) {
            unsigned long g = strtoul(p, &end, 10);
            if (end == p)
                break;
            if ((gid_t)g == admin_gid)
                found = true;
            p = end;
        }
        break;
    }
    fclose(f);
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

static void send_error(const session_env *env, void *conn, uint64_t id, Llms__ErrorCode code,
                       const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static void send_error(const session_env *env, void *conn, uint64_t id, Llms__ErrorCode code,
                       const char *fmt, ...)
{
    uint8_t *buf;
    size_t len;
    va_list ap;
    char msg[ERR_MAX + 128];
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (resp_error(id, code, env->cfg->max_frame_bytes, &buf, &len, "%s", msg) == 0)
        env->send(conn, buf, len);
}

static bool is_admin_call(Llms__Request__BodyCase b)
{
    return b == LLMS__REQUEST__BODY_STATUS || b == LLMS__REQUEST__BODY_LIST_APPS ||
           b == LLMS__REQUEST__BODY_LIST_ALL_CONTEXTS || b == LLMS__REQUEST__BODY_EVICT_CONTEXT ||
           b == LLMS__REQUEST__BODY_SHUTDOWN || b == LLMS__REQUEST__BODY_PROFILE ||
           b == LLMS__REQUEST__BODY_RERANK_CALIBRATE;
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
    if (req->body_case == LLMS__REQUEST__BODY_COMPLETE && !req->complete->prompt[0])
        return "the prompt is empty";
    if (req->body_case == LLMS__REQUEST__BODY_EMBED)
        for (size_t i = 0; i < req->embed->n_texts; i++)
            if (!req->embed->texts[i][0])
                return "a text to embed is empty";
    return NULL;
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
    return is_admin_call(b) && b != LLMS__REQUEST__BODY_RERANK_CALIBRATE;
}

static void send_resp(const session_env *env, void *conn, Llms__Response *r)
{
    uint8_t *buf;
    size_t len;
    r->final = 1;
    if (resp_pack(r, env->cfg->max_frame_bytes, &buf, &len) == 0)
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

static void handle_tokenize(const session_env *env, void *conn, const Llms__Request *req)
{
    Llms__TokenizeRequest *t = req->tokenize;
    char err[ERR_MAX];
    int32_t *ids;
    int n;
    if (prompt_tokenize(env->tok, t->text, strlen(t->text), t->has_add_special && t->add_special,
                        t->has_parse_special && t->parse_special, &ids, &n, err)) {
        send_error(env, conn, req->id, LLMS__ERROR_CODE__INTERNAL, "tokenize: %s", err);
        return;
    }
    Llms__TokenizeResponse tr = LLMS__TOKENIZE_RESPONSE__INIT;
    tr.n_tokens = (size_t)n;
    tr.tokens = ids;
    Llms__Response r = LLMS__RESPONSE__INIT;
    r.id = req->id;
    r.body_case = LLMS__RESPONSE__BODY_TOKENIZE;
    r.tokenize = &tr;
    send_resp(env, conn, &r);
    free(ids);
}

static void handle_detokenize(const session_env *env, void *conn, const Llms__Request *req)
{
    Llms__DetokenizeRequest *d = req->detokenize;
    int n = d->n_tokens > (size_t)(1 << 24) ? -1 : (int)d->n_tokens;
    int need = n < 0 ? -1 : tok_decode(env->tok, d->tokens, n, false, false, NULL, 0);
    if (need < 0) {
        send_error(env, conn, req->id, LLMS__ERROR_CODE__INVALID_ARGUMENT,
                   "a token id is outside the vocabulary (0..%d)", tok_n_vocab(env->tok) - 1);
        return;
    }
    char *text = malloc((size_t)need + 1);
    if (!text) {
        send_error(env, conn, req->id, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        return;
    }
    tok_decode(env->tok, d->tokens, n, false, false, text, (size_t)need + 1);
    /* protobuf-c strings are C strings: text after an embedded NUL byte is cut. */
    Llms__DetokenizeResponse dr = LLMS__DETOKENIZE_RESPONSE__INIT;
    dr.text = text;
    Llms__Response r = LLMS__RESPONSE__INIT;
    r.id = req->id;
    r.body_case = LLMS__RESPONSE__BODY_DETOKENIZE;
    r.detokenize = &dr;
    send_resp(env, conn, &r);
    free(text);
}


void session_handle(const session_env *env, session *ss, void *conn, Llms__Request *req)
{
    Llms__Request__BodyCase b = req->body_case;
    const char *empty;
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
    } else if (b == LLMS__REQUEST__BODY_TOKENIZE) {
        handle_tokenize(env, conn, req);
    } else if (b == LLMS__REQUEST__BODY_DETOKENIZE) {
        handle_detokenize(env, conn, req);
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
            return;
        }
    }
    llms__request__free_unpacked(req, NULL);
}
