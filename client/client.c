/* client.c — libllmsclient: blocking calls over llms.proto frames (see llms.h). */
#include "client/llms.h"

#include <errno.h>
#include <stdbool.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "proto/frame.h"

/* Replies (a listing with histories) may be far larger than any request the daemon
 * accepts, so the client's own limit is generous; it only guards against garbage. */
#define CLIENT_MAX_FRAME (256u << 20)

struct llms_conn {
    int fd;
    uint64_t next_id; /* ids increase per connection; 0 is the daemon's "no request" */
    int broken;       /* an I/O or protocol failure: the stream is out of step */
    uint32_t timeout_ms; /* sent with every request; 0: none */
    char err[LLMS_ERROR_MAX];
};

static const char *const status_names[] = {
    "OK",          "INVALID_ARGUMENT", "NOT_FOUND",   "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "CANCELLED", "INTERNAL",
    "UNAVAILABLE", "UNIMPLEMENTED",    "MALFORMED_FRAME", "DEADLINE_EXCEEDED",
};

const char *llms_status_name(enum llms_status s)
{
    if ((unsigned)s < sizeof status_names / sizeof status_names[0])
        return status_names[s];
    if (s == LLMS_ERR_IO)
        return "IO";
    if (s == LLMS_ERR_PROTOCOL)
        return "PROTOCOL";
    return "UNKNOWN";
}

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

__attribute__((format(printf, 3, 4))) static enum llms_status
fail(llms_conn *c, enum llms_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    if (s == LLMS_ERR_IO || s == LLMS_ERR_PROTOCOL)
        c->broken = 1;
    return s;
}

void llms_params_init(llms_params *p)
{
    *p = (llms_params)LLMS_PARAMS_INIT;
}

enum llms_status llms_connect(const char *socket_path, llms_conn **out, char err[LLMS_ERROR_MAX])
{
    char scratch[LLMS_ERROR_MAX];
    if (!err)
        err = scratch;
    *out = NULL;
    if (!socket_path)
        socket_path = getenv("LLMS_SOCKET");
    if (!socket_path || !*socket_path)
        socket_path = LLMS_DEFAULT_SOCKET;

    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(socket_path) >= sizeof addr.sun_path) {
        snprintf(err, LLMS_ERROR_MAX, "socket path too long: %s", socket_path);
        return LLMS_ERR_IO;
    }
    strcpy(addr.sun_path, socket_path);

    llms_conn *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, LLMS_ERROR_MAX, "out of memory");
        return LLMS_ERR_INTERNAL;
    }
    c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->fd < 0) {
        snprintf(err, LLMS_ERROR_MAX, "socket: %s", strerror(errno));
        free(c);
        return LLMS_ERR_IO;
    }
    int rc;
    do
        rc = connect(c->fd, (struct sockaddr *)&addr, sizeof addr);
    while (rc < 0 && errno == EINTR);
    if (rc < 0) {
        snprintf(err, LLMS_ERROR_MAX, "connect %s: %s", socket_path, strerror(errno));
        close(c->fd);
        free(c);
        return LLMS_ERR_IO;
    }
    c->next_id = 1;
    *out = c;
    return LLMS_OK;
}

void llms_close(llms_conn *conn)
{
    if (!conn)
        return;
    close(conn->fd);
    free(conn);
}

void llms_set_timeout(llms_conn *c, uint32_t timeout_ms)
{
    c->timeout_ms = timeout_ms;
}

const char *llms_last_error(const llms_conn *conn)
{
    return conn ? conn->err : "no connection";
}

/* ---- transport ---- */

/* Writes n bytes; on failure *sys_errno is send's errno. */
static enum llms_status write_all(llms_conn *c, const uint8_t *p, size_t n, int *sys_errno)
{
    while (n > 0) {
        /* MSG_NOSIGNAL: a daemon that went away is an error code, not a SIGPIPE. */
        ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            *sys_errno = errno;
            return fail(c, LLMS_ERR_IO, "write to llmsd: %s", strerror(errno));
        }
        p += w;
        n -= (size_t)w;
    }
    return LLMS_OK;
}

static enum llms_status read_all(llms_conn *c, uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t r = read(c->fd, p, n);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return fail(c, LLMS_ERR_IO, "read from llmsd: %s", strerror(errno));
        }
        if (r == 0)
            return fail(c, LLMS_ERR_IO, "llmsd closed the connection");
        p += r;
        n -= (size_t)r;
    }
    return LLMS_OK;
}

static enum llms_status next_for(llms_conn *c, uint64_t id, Llms__Response **out);
static enum llms_status error_of(llms_conn *c, const Llms__Response *r);

/* Sends req with a fresh id, which is returned in *id. A daemon that refuses a request
 * from its frame header (too large) answers and closes without reading the rest, so the
 * write fails: the answer already sent says why, and is the error returned. */
static enum llms_status send_request(llms_conn *c, Llms__Request *req, uint64_t *id)
{
    if (c->broken)
        return fail(c, LLMS_ERR_IO, "connection is unusable after an earlier failure");
    req->id = c->next_id++;
    if (c->timeout_ms) {
        req->has_timeout_ms = 1;
        req->timeout_ms = c->timeout_ms;
    }
    uint8_t *buf;
    size_t len;
    if (frame_pack(&req->base, UINT32_MAX, &buf, &len) < 0)
        return fail(c, LLMS_ERR_INTERNAL, "out of memory packing a request");
    int sys_errno = 0;
    enum llms_status s = write_all(c, buf, len, &sys_errno);
    free(buf);
    if (s == LLMS_ERR_IO && (sys_errno == EPIPE || sys_errno == ECONNRESET)) {
        char wrote[LLMS_ERROR_MAX];
        snprintf(wrote, sizeof wrote, "%s", c->err);
        Llms__Response *r;
        enum llms_status why = next_for(c, req->id, &r);
        if (why == LLMS_OK) {
            s = r->error ? error_of(c, r) : fail(c, LLMS_ERR_IO, "%s", wrote);
            frame_free_response(r);
        } else if (why != LLMS_ERR_IO) {
            s = why;
        } else {
            snprintf(c->err, sizeof c->err, "%s", wrote);
        }
        c->broken = 1;
    }
    if (s == LLMS_OK && id)
        *id = req->id;
    return s;
}

/* Reads the next frame, whatever its id. */
static enum llms_status read_response(llms_conn *c, Llms__Response **out)
{
    uint8_t header[FRAME_HEADER_BYTES];
    uint32_t len = 0;
    enum llms_status s = read_all(c, header, sizeof header);
    if (s != LLMS_OK)
        return s;
    switch (frame_peek(header, sizeof header, CLIENT_MAX_FRAME, &len)) {
    case FRAME_EMPTY:
        return fail(c, LLMS_ERR_PROTOCOL, "llmsd sent an empty frame");
    case FRAME_TOO_LARGE:
        return fail(c, LLMS_ERR_PROTOCOL, "llmsd sent a frame of %u bytes", len);
    default:
        break;
    }
    uint8_t *body = malloc(len);
    if (!body)
        return fail(c, LLMS_ERR_INTERNAL, "out of memory reading a %u-byte frame", len);
    s = read_all(c, body, len);
    if (s == LLMS_OK) {
        *out = frame_unpack_response(body, len);
        if (!*out)
            s = fail(c, LLMS_ERR_PROTOCOL, "llmsd sent an undecodable frame");
    }
    free(body);
    return s;
}

/*
 * Reads frames until the next one for request id. Frames for other ids (late answers to
 * cancelled or abandoned requests) are skipped. An error frame with id 0 is the daemon
 * refusing the stream itself: it closes the connection after it.
 */
static enum llms_status next_for(llms_conn *c, uint64_t id, Llms__Response **out)
{
    for (;;) {
        Llms__Response *r;
        enum llms_status s = read_response(c, &r);
        if (s != LLMS_OK)
            return s;
        if (r->id == id) {
            *out = r;
            return LLMS_OK;
        }
        if (r->id == 0 && r->error) {
            s = fail(c, (enum llms_status)r->error->code, "%s", r->error->message);
            c->broken = 1;
            frame_free_response(r);
            return s;
        }
        frame_free_response(r);
    }
}

/* Takes an error Response apart: its code and message. */
static enum llms_status error_of(llms_conn *c, const Llms__Response *r)
{
    enum llms_status code = (enum llms_status)r->error->code;
    if (code == LLMS_OK)
        code = LLMS_ERR_INTERNAL;
    return fail(c, code, "%s", r->error->message ? r->error->message : "");
}

/*
 * Sends a unary request and reads its single final reply, which must carry body
 * `want` (or an error).
 */
static enum llms_status unary(llms_conn *c, Llms__Request *req, Llms__Response__BodyCase want,
                              Llms__Response **out)
{
    uint64_t id;
    enum llms_status s = send_request(c, req, &id);
    if (s != LLMS_OK)
        return s;
    Llms__Response *r;
    if ((s = next_for(c, id, &r)) != LLMS_OK)
        return s;
    if (r->error)
        s = error_of(c, r);
    else if (r->body_case != want || !r->final)
        s = fail(c, LLMS_ERR_PROTOCOL, "llmsd answered with an unexpected message (body %d)",
                 (int)r->body_case);
    if (s != LLMS_OK) {
        frame_free_response(r);
        return s;
    }
    c->err[0] = '\0';
    *out = r;
    return LLMS_OK;
}

static enum llms_status unary_ok(llms_conn *c, Llms__Request *req)
{
    Llms__Response *r;
    enum llms_status s = unary(c, req, LLMS__RESPONSE__BODY_OK, &r);
    if (s == LLMS_OK)
        frame_free_response(r);
    return s;
}

static enum llms_status check_str(llms_conn *c, const char *s, const char *what)
{
    if (!s)
        return fail(c, LLMS_ERR_INVALID_ARGUMENT, "%s is NULL", what);
    return LLMS_OK;
}

static char *dup_or_null(const char *s)
{
    return s ? strdup(s) : NULL;
}

/* ---- generation parameters ---- */

/* Fills g from p; returns whether anything is set (NULL p: nothing). */
static int params_to_proto(const llms_params *p, Llms__GenerationParams *g)
{
    llms__generation_params__init(g);
    if (!p)
        return 0;
    g->has_temperature = !isnan(p->temperature);
    g->temperature = p->temperature;
    g->has_top_k = p->top_k != LLMS_UNSET;
    g->top_k = p->top_k;
    g->has_top_p = !isnan(p->top_p);
    g->top_p = p->top_p;
    g->has_min_p = !isnan(p->min_p);
    g->min_p = p->min_p;
    g->has_repeat_penalty = !isnan(p->repeat_penalty);
    g->repeat_penalty = p->repeat_penalty;
    g->has_repeat_last_n = p->repeat_last_n != LLMS_UNSET;
    g->repeat_last_n = p->repeat_last_n;
    g->has_max_tokens = p->max_tokens != LLMS_UNSET;
    g->max_tokens = p->max_tokens;
    g->has_seed = p->has_seed != 0;
    g->seed = p->seed;
    g->n_stop = p->stop ? p->n_stop : 0;
    g->stop = (char **)p->stop; /* only read while packing */
    return g->has_temperature || g->has_top_k || g->has_top_p || g->has_min_p ||
           g->has_repeat_penalty || g->has_repeat_last_n || g->has_max_tokens ||
           g->has_seed || g->n_stop > 0;
}

/* ---- session ---- */

const char *llms_default_app(void)
{
    const char *app = getenv("LLMS_APP");
    return app && *app ? app : LLMS_DEFAULT_APP;
}

enum llms_status llms_bind(llms_conn *c, const char *app_name)
{
    if (!app_name)
        app_name = llms_default_app();
    enum llms_status s = check_str(c, app_name, "app_name");
    if (s != LLMS_OK)
        return s;
    Llms__BindRequest b = LLMS__BIND_REQUEST__INIT;
    b.app_name = (char *)app_name;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_BIND;
    req.bind = &b;
    Llms__Response *r;
    if ((s = unary(c, &req, LLMS__RESPONSE__BODY_BIND, &r)) != LLMS_OK)
        return s;
    frame_free_response(r);
    return LLMS_OK;
}

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
    Llms__GenerationParams g;
    Llms__CreateContextRequest cc = LLMS__CREATE_CONTEXT_REQUEST__INIT;
    cc.system_prompt = (char *)system_prompt;
    if (params_to_proto(params, &g))
        cc.defaults = &g;
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
    enum llms_status s = unary(c, &req, LLMS__RESPONSE__BODY_CREATE_CONTEXT, &r);
    if (s != LLMS_OK)
        return s;
    const char *id = r->create_context->context_id;
    if (strlen(id) >= LLMS_ID_MAX)
        s = fail(c, LLMS_ERR_PROTOCOL, "context id longer than %d bytes", LLMS_ID_MAX - 1);
    else
        strcpy(id_out, id);
    frame_free_response(r);
    return s;
}

enum llms_status llms_context_delete(llms_conn *c, const char *context_id)
{
    enum llms_status s = check_str(c, context_id, "context_id");
    if (s != LLMS_OK)
        return s;
    Llms__DeleteContextRequest d = LLMS__DELETE_CONTEXT_REQUEST__INIT;
    d.context_id = (char *)context_id;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_DELETE_CONTEXT;
    req.delete_context = &d;
    return unary_ok(c, &req);
}

/* ---- streamed generation ---- */

void llms_result_free(llms_result *r)
{
    if (!r)
        return;
    free(r->text);
    memset(r, 0, sizeof *r);
}

/* Cancels request id; the Cancel's own answer arrives under its id and is skipped. */
static enum llms_status send_cancel(llms_conn *c, uint64_t id)
{
    Llms__CancelRequest cr = LLMS__CANCEL_REQUEST__INIT;
    cr.request_id = id;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_CANCEL;
    req.cancel = &cr;
    return send_request(c, &req, NULL);
}

/*
 * Reads the stream of request id to its final frame, passing chunks to on_text. When
 * on_text asks to stop, a Cancel goes out and the rest of the stream is drained without
 * further callbacks, so the connection stays in step.
 */
static enum llms_status rag_result_from(llms_conn *c, const Llms__RagResult *p,
                                        llms_rag_result *out);

static enum llms_status stream(llms_conn *c, uint64_t id, llms_token_cb on_text, void *user,
                               llms_result *out, llms_rag_result *rag_out)
{
    int cancelled = 0;
    for (;;) {
        Llms__Response *r;
        enum llms_status s = next_for(c, id, &r);
        if (s != LLMS_OK)
            return s;
        if (r->error) {
            s = error_of(c, r);
            int final = r->final;
            frame_free_response(r);
            if (!final)
                continue;
            return cancelled ? fail(c, LLMS_ERR_CANCELLED, "cancelled by the caller") : s;
        }
        if (r->body_case == LLMS__RESPONSE__BODY_CHUNK && !r->final) {
            if (!cancelled && on_text && on_text(r->chunk->text, strlen(r->chunk->text), user)) {
                cancelled = 1;
                if ((s = send_cancel(c, id)) != LLMS_OK) {
                    frame_free_response(r);
                    return s;
                }
            }
            frame_free_response(r);
            continue;
        }
        bool rag_final = rag_out && r->body_case == LLMS__RESPONSE__BODY_RAG_RESULT;
        if ((r->body_case != LLMS__RESPONSE__BODY_RESULT && !rag_final) || !r->final) {
            frame_free_response(r);
            return fail(c, LLMS_ERR_PROTOCOL, "unexpected frame in a streamed reply");
        }
        if (rag_final && (s = rag_result_from(c, r->rag_result, rag_out)) != LLMS_OK) {
            frame_free_response(r);
            return s;
        }
        if (out && !rag_final) {
            const Llms__CallResult *cr = r->result;
            *out = (llms_result){
                .prompt_tokens = cr->prompt_tokens,
                .generated_tokens = cr->generated_tokens,
                .context_tokens = cr->context_tokens,
                .prefill_ms = cr->prefill_ms,
                .decode_ms = cr->decode_ms,
                .queue_ms = cr->queue_ms,
                .stop_reason = (enum llms_stop_reason)cr->stop_reason,
                .text = strdup(cr->text),
                .window_slides = cr->has_window_slides ? cr->window_slides : 0,
            };
            if (!out->text) {
                frame_free_response(r);
                return fail(c, LLMS_ERR_INTERNAL, "out of memory");
            }
        }
        frame_free_response(r);
        if (cancelled)
            return fail(c, LLMS_ERR_CANCELLED, "cancelled by the caller");
        c->err[0] = '\0';
        return LLMS_OK;
    }
}

enum llms_status llms_call(llms_conn *c, const char *context_id, const char *prompt,
                           const llms_params *params, llms_token_cb on_text, void *user,
                           llms_result *out)
{
    if (out)
        memset(out, 0, sizeof *out);
    enum llms_status s = check_str(c, context_id, "context_id");
    if (s != LLMS_OK || (s = check_str(c, prompt, "prompt")) != LLMS_OK)
        return s;
    Llms__GenerationParams g;
    Llms__CallRequest call = LLMS__CALL_REQUEST__INIT;
    call.context_id = (char *)context_id;
    call.prompt = (char *)prompt;
    if (params_to_proto(params, &g))
        call.params = &g;
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
    if ((s = send_request(c, &req, &id)) != LLMS_OK)
        return s;
    return stream(c, id, on_text, user, out, NULL);
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
    enum llms_status s = check_str(c, prompt, "prompt");
    if (s != LLMS_OK)
        return s;
    Llms__GenerationParams g;
    Llms__CompleteRequest cr = LLMS__COMPLETE_REQUEST__INIT;
    cr.prompt = (char *)prompt;
    cr.system_prompt = (char *)system_prompt;
    cr.has_chat = 1;
    cr.chat = chat != 0;
    if (params_to_proto(params, &g))
        cr.params = &g;
    if (params)
        cr.model = (char *)params->model;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_COMPLETE;
    req.complete = &cr;
    uint64_t id;
    if ((s = send_request(c, &req, &id)) != LLMS_OK)
        return s;
    return stream(c, id, on_text, user, out, NULL);
}

/* ---- context listings ---- */

void llms_context_info_free(llms_context_info *info)
{
    if (!info)
        return;
    free(info->app_name);
    free(info->system_prompt);
    free(info->model);
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
        return fail(c, LLMS_ERR_PROTOCOL, "context id longer than %d bytes", LLMS_ID_MAX - 1);
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
    out->app_name = dup_or_null(p->app_name);
    out->system_prompt = dup_or_null(p->system_prompt);
    out->model = dup_or_null(p->model);
    if ((p->app_name && !out->app_name) || (p->system_prompt && !out->system_prompt) ||
        (p->model && !out->model))
        return fail(c, LLMS_ERR_INTERNAL, "out of memory");
    if (p->n_history > 0) {
        out->history = calloc(p->n_history, sizeof *out->history);
        if (!out->history)
            return fail(c, LLMS_ERR_INTERNAL, "out of memory");
        out->n_history = p->n_history;
        for (size_t i = 0; i < p->n_history; i++) {
            out->history[i].role = strdup(p->history[i]->role);
            out->history[i].content = strdup(p->history[i]->content);
            if (!out->history[i].role || !out->history[i].content)
                return fail(c, LLMS_ERR_INTERNAL, "out of memory");
        }
    }
    if (p->n_chunks > 0) {
        out->chunks = calloc(p->n_chunks, sizeof *out->chunks);
        if (!out->chunks)
            return fail(c, LLMS_ERR_INTERNAL, "out of memory");
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
        s = unary(c, &req, LLMS__RESPONSE__BODY_CONTEXTS, &r);
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
                s = fail(c, LLMS_ERR_INTERNAL, "out of memory");
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
        return fail(c, LLMS_ERR_INTERNAL, "out of memory");
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
    enum llms_status s = check_str(c, context_id, "context_id");
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
    if ((s = unary(c, &req, LLMS__RESPONSE__BODY_CONTEXT, &r)) != LLMS_OK)
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
    enum llms_status s = check_str(c, text, "text");
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
    if ((s = unary(c, &req, LLMS__RESPONSE__BODY_TOKENIZE, &r)) != LLMS_OK)
        return s;
    size_t n = r->tokenize->n_tokens;
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids) {
        frame_free_response(r);
        return fail(c, LLMS_ERR_INTERNAL, "out of memory");
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
        return fail(c, LLMS_ERR_INVALID_ARGUMENT, "tokens is NULL");
    Llms__DetokenizeRequest d = LLMS__DETOKENIZE_REQUEST__INIT;
    d.n_tokens = n;
    d.tokens = (int32_t *)tokens;
    d.model = (char *)model;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_DETOKENIZE;
    req.detokenize = &d;
    Llms__Response *r;
    enum llms_status s = unary(c, &req, LLMS__RESPONSE__BODY_DETOKENIZE, &r);
    if (s != LLMS_OK)
        return s;
    *text_out = strdup(r->detokenize->text);
    frame_free_response(r);
    return *text_out ? LLMS_OK : fail(c, LLMS_ERR_INTERNAL, "out of memory");
}

/* ---- admin ---- */

void llms_daemon_status_free(llms_daemon_status *st)
{
    if (!st)
        return;
    free(st->version);
    free(st->model_path);
    free(st->model_arch);
    free(st->sched_mode);
    memset(st, 0, sizeof *st);
}

static void cost_models_from(const Llms__CostModels *m, llms_cost_models *out)
{
    if (!m) {
        memset(out, 0, sizeof *out);
        return;
    }
    *out = (llms_cost_models){
        .rec_a = m->rec_a,
        .rec_b = m->rec_b,
        .rec_c = m->rec_c,
        .io_d = m->io_d,
        .io_e = m->io_e,
        .warm_d = m->warm_d,
        .warm_e = m->warm_e,
        .io_f = m->io_f,
        .warm_f = m->warm_f,
        .rec_resid = m->rec_resid,
        .io_resid = m->io_resid,
        .warm_resid = m->warm_resid,
        .samples = m->samples,
        .rec_fix = m->rec_fix,
        .cold_fix = m->cold_fix,
        .warm_fix = m->warm_fix,
        .rec_contention = m->rec_contention,
        .read_contention = m->read_contention,
        .observed = m->observed,
        .rec_ratio_median = m->rec_ratio_median,
        .rec_ratio_last = m->rec_ratio_last,
        .read_ratio_median = m->read_ratio_median,
        .read_ratio_last = m->read_ratio_last,
        .total_ratio_median = m->total_ratio_median,
        .total_ratio_last = m->total_ratio_last,
    };
}

enum llms_status llms_status_get(llms_conn *c, llms_daemon_status *out)
{
    memset(out, 0, sizeof *out);
    Llms__Empty e = LLMS__EMPTY__INIT;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_STATUS;
    req.status = &e;
    Llms__Response *r;
    enum llms_status s = unary(c, &req, LLMS__RESPONSE__BODY_STATUS, &r);
    if (s != LLMS_OK)
        return s;
    const Llms__StatusResponse *p = r->status;
    *out = (llms_daemon_status){
        .version = strdup(p->version),
        .model_path = strdup(p->model_path),
        .model_arch = strdup(p->model_arch),
        .model_bytes = p->model_bytes,
        .n_ctx = p->n_ctx,
        .threads = p->threads,
        .uptime_ms = p->uptime_ms,
        .n_connections = p->n_connections,
        .n_apps = p->n_apps,
        .n_contexts = p->n_contexts,
        .n_resident_contexts = p->n_resident_contexts,
        .kv_bytes_resident = p->kv_bytes_resident,
        .queued_requests = p->queued_requests,
        .running_requests = p->running_requests,
        .rss_bytes = p->rss_bytes,
        .kv_budget_bytes = p->kv_budget_bytes,
        .swap_bytes_written = p->swap_bytes_written,
        .swap_bytes_read = p->swap_bytes_read,
        .swap_chunks_written = p->swap_chunks_written,
        .swap_chunks_read = p->swap_chunks_read,
        .swap_chunks_recomputed = p->swap_chunks_recomputed,
        .swap_chunks_promoted = p->swap_chunks_promoted,
        .swap_faults = p->swap_faults,
        .swap_bad_blobs = p->swap_bad_blobs,
        .swap_stale_blobs = p->swap_stale_blobs,
        .kv_f16_bytes = p->kv_f16_bytes,
        .kv_int8_bytes = p->kv_int8_bytes,
        .kv_int4_bytes = p->kv_int4_bytes,
        .kv_int2_bytes = p->kv_int2_bytes,
        .kv_spare_bytes = p->kv_spare_bytes,
        .window_slides = p->window_slides,
        .window_dropped_tokens = p->window_dropped_tokens,
        .switch_ins = p->switch_ins,
        .switch_in_mean_ms = p->switch_in_mean_ms,
        .sched_mode = strdup(p->sched_mode ? p->sched_mode : ""),
        .sched_step_tokens = p->sched_step_tokens,
        .sched_active_sequences = p->sched_active_sequences,
        .sched_queued_generate = p->sched_queued_generate,
        .sched_queued_embed = p->sched_queued_embed,
        .sched_queued_rerank = p->sched_queued_rerank,
        .sched_steps = p->sched_steps,
        .sched_step_mean_ms = p->sched_step_mean_ms,
        .sched_rows_per_step = p->sched_rows_per_step,
        .sched_longest_stall_ms = p->sched_longest_stall_ms,
        .swap_writes_pending = p->swap_writes_pending,
        .swap_write_waits = p->swap_write_waits,
        .swap_write_wait_ms = p->swap_write_wait_ms,
        .swap_write_failures = p->swap_write_failures,
        .models_resident_bytes = p->models_resident_bytes,
        .models_scratch_bytes = p->models_scratch_bytes,
        .graph_speculations = p->graph_speculations,
        .graph_spec_hits = p->graph_spec_hits,
        .graph_spec_rollbacks = p->graph_spec_rollbacks,
        .graph_spec_saved_ms = p->graph_spec_saved_ms,
        .kv_calibrated_models = p->kv_calibrated_models,
        .kv_calib_forwards_left = p->kv_calib_forwards_left,
        .kv_calibrations = p->kv_calibrations,
        .kb_ivf_searches = p->kb_ivf_searches,
        .kb_ivf_hinted_searches = p->kb_ivf_hinted_searches,
        .kb_ivf_lists_scanned = p->kb_ivf_lists_scanned,
        .kb_ivf_lists_skipped = p->kb_ivf_lists_skipped,
        .kb_ivf_hot_bytes = p->kb_ivf_hot_bytes,
        .kb_ivf_trained = p->kb_ivf_trained,
        .kb_ivf_train_pending = p->kb_ivf_train_pending,
        .qkv_verify_misses = p->qkv_verify_misses,
        .kb_passages = p->kb_passages,
        .kb_text_bytes = p->kb_text_bytes,
        .kb_disk_bytes = p->kb_disk_bytes,
    };
    cost_models_from(p->cost_models, &out->cost);
    frame_free_response(r);
    if (!out->version || !out->model_path || !out->model_arch || !out->sched_mode) {
        llms_daemon_status_free(out);
        return fail(c, LLMS_ERR_INTERNAL, "out of memory");
    }
    return LLMS_OK;
}

void llms_app_list_free(llms_app_info *apps, size_t n)
{
    if (!apps)
        return;
    for (size_t i = 0; i < n; i++)
        free(apps[i].app_name);
    free(apps);
}

enum llms_status llms_list_apps(llms_conn *c, llms_app_info **out, size_t *n_out)
{
    *out = NULL;
    *n_out = 0;
    Llms__Empty e = LLMS__EMPTY__INIT;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_LIST_APPS;
    req.list_apps = &e;
    Llms__Response *r;
    enum llms_status s = unary(c, &req, LLMS__RESPONSE__BODY_APPS, &r);
    if (s != LLMS_OK)
        return s;
    size_t n = r->apps->n_apps;
    llms_app_info *apps = calloc(n ? n : 1, sizeof *apps);
    if (!apps) {
        frame_free_response(r);
        return fail(c, LLMS_ERR_INTERNAL, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        const Llms__AppInfo *a = r->apps->apps[i];
        apps[i] = (llms_app_info){
            .uid = a->uid,
            .app_name = strdup(a->app_name),
            .n_contexts = a->n_contexts,
            .queued_requests = a->queued_requests,
            .n_connections = a->n_connections,
        };
        if (!apps[i].app_name)
            s = LLMS_ERR_INTERNAL;
    }
    frame_free_response(r);
    if (s != LLMS_OK) {
        llms_app_list_free(apps, n);
        return fail(c, s, "out of memory");
    }
    *out = apps;
    *n_out = n;
    return LLMS_OK;
}

enum llms_status llms_evict(llms_conn *c, const char *context_id)
{
    enum llms_status s = check_str(c, context_id, "context_id");
    if (s != LLMS_OK)
        return s;
    Llms__EvictContextRequest ev = LLMS__EVICT_CONTEXT_REQUEST__INIT;
    ev.context_id = (char *)context_id;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_EVICT_CONTEXT;
    req.evict_context = &ev;
    return unary_ok(c, &req);
}

enum llms_status llms_profile(llms_conn *c, llms_profile_result *out)
{
    memset(out, 0, sizeof *out);
    Llms__Empty e = LLMS__EMPTY__INIT;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_PROFILE;
    req.profile = &e;
    Llms__Response *r;
    enum llms_status s = unary(c, &req, LLMS__RESPONSE__BODY_PROFILE, &r);
    if (s != LLMS_OK)
        return s;
    const Llms__ProfileResponse *p = r->profile;
    *out = (llms_profile_result){
        .rec_a = p->rec_a, .rec_b = p->rec_b, .rec_c = p->rec_c, .io_d = p->io_d, .io_e = p->io_e,
    };
    cost_models_from(p->models, &out->models);
    if (!p->models) {
        /* a daemon from before CostModels: the lines it has */
        out->models.rec_a = p->rec_a;
        out->models.rec_b = p->rec_b;
        out->models.rec_c = p->rec_c;
        out->models.io_d = p->io_d;
        out->models.io_e = p->io_e;
    }
    frame_free_response(r);
    return LLMS_OK;
}

enum llms_status llms_plan(llms_conn *c, uint32_t prompt_tokens, const char *model,
                           llms_plan_result *out)
{
    memset(out, 0, sizeof *out);
    Llms__PlanRequest pq = LLMS__PLAN_REQUEST__INIT;
    pq.prompt_tokens = prompt_tokens;
    pq.model = (char *)model;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_PLAN;
    req.plan = &pq;
    Llms__Response *r;
    enum llms_status s = unary(c, &req, LLMS__RESPONSE__BODY_PLAN, &r);
    if (s != LLMS_OK)
        return s;
    const Llms__PlanResponse *p = r->plan;
    char *text = strdup(p->text);
    *out = (llms_plan_result){text, p->rows, p->attn_rows, p->working_bytes, p->budget_bytes};
    frame_free_response(r);
    return text ? LLMS_OK : fail(c, LLMS_ERR_INTERNAL, "out of memory");
}

void llms_model_list_free(llms_model_info *models, size_t n)
{
    if (!models)
        return;
    for (size_t i = 0; i < n; i++) {
        free(models[i].name);
        free(models[i].path);
        free(models[i].arch);
        free(models[i].type);
        free(models[i].roles);
        free(models[i].default_for);
    }
    free(models);
}

/* "a,b,c" of n strings (never NULL on success). */
static char *join(char *const *s, size_t n)
{
    size_t len = 1;
    for (size_t i = 0; i < n; i++)
        len += strlen(s[i]) + 1;
    char *out = malloc(len);
    if (!out)
        return NULL;
    out[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        if (i)
            strcat(out, ",");
        strcat(out, s[i]);
    }
    return out;
}

enum llms_status llms_list_models(llms_conn *c, llms_model_info **out, size_t *n_out)
{
    *out = NULL;
    *n_out = 0;
    Llms__Empty e = LLMS__EMPTY__INIT;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_LIST_MODELS;
    req.list_models = &e;
    Llms__Response *r;
    enum llms_status s = unary(c, &req, LLMS__RESPONSE__BODY_MODELS, &r);
    if (s != LLMS_OK)
        return s;
    size_t n = r->models->n_models;
    llms_model_info *ms = calloc(n ? n : 1, sizeof *ms);
    if (!ms) {
        frame_free_response(r);
        return fail(c, LLMS_ERR_INTERNAL, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        const Llms__ModelInfo *m = r->models->models[i];
        ms[i] = (llms_model_info){
            .name = strdup(m->name),
            .path = strdup(m->path),
            .arch = strdup(m->arch),
            .type = strdup(m->type),
            .file_bytes = m->file_bytes,
            .roles = join(m->roles, m->n_roles),
            .default_for = join(m->default_for, m->n_default_for),
            .resident_bytes = m->resident_bytes,
            .scratch_bytes = m->scratch_bytes,
            .running = m->running,
            .generates = m->has_contexts,
            .contexts = m->contexts,
            .kv_bytes = m->kv_bytes,
            .kv_budget_bytes = m->kv_budget_bytes,
        };
        if (!ms[i].name || !ms[i].path || !ms[i].arch || !ms[i].type || !ms[i].roles ||
            !ms[i].default_for)
            s = LLMS_ERR_INTERNAL;
    }
    frame_free_response(r);
    if (s != LLMS_OK) {
        llms_model_list_free(ms, n);
        return fail(c, s, "out of memory");
    }
    *out = ms;
    *n_out = n;
    return LLMS_OK;
}

enum llms_status llms_model_load(llms_conn *c, const char *name, const char *path,
                                 const char *roles)
{
    enum llms_status s;
    if ((s = check_str(c, name, "name")) != LLMS_OK || (s = check_str(c, path, "path")) != LLMS_OK)
        return s;
    char *list[3], buf[64];
    size_t n = 0;
    if (roles && roles[0]) {
        if (strlen(roles) >= sizeof buf)
            return fail(c, LLMS_ERR_INVALID_ARGUMENT, "roles '%.64s': at most generate,embed,rerank",
                        roles);
        strcpy(buf, roles);
        for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            if (n == 3)
                return fail(c, LLMS_ERR_INVALID_ARGUMENT, "roles '%s': at most three", roles);
            list[n++] = t;
        }
    }
    Llms__LoadModelRequest lm = LLMS__LOAD_MODEL_REQUEST__INIT;
    lm.name = (char *)name;
    lm.path = (char *)path;
    lm.n_roles = n;
    lm.roles = list;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_LOAD_MODEL;
    req.load_model = &lm;
    return unary_ok(c, &req);
}

enum llms_status llms_model_unload(llms_conn *c, const char *name)
{
    enum llms_status s = check_str(c, name, "name");
    if (s != LLMS_OK)
        return s;
    Llms__UnloadModelRequest um = LLMS__UNLOAD_MODEL_REQUEST__INIT;
    um.name = (char *)name;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_UNLOAD_MODEL;
    req.unload_model = &um;
    return unary_ok(c, &req);
}

enum llms_status llms_shutdown(llms_conn *c)
{
    Llms__Empty e = LLMS__EMPTY__INIT;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_SHUTDOWN;
    req.shutdown = &e;
    return unary_ok(c, &req);
}

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
        return fail(c, LLMS_ERR_INVALID_ARGUMENT, "texts is NULL");
    for (size_t i = 0; i < n; i++)
        if (!texts[i])
            return fail(c, LLMS_ERR_INVALID_ARGUMENT, "text %zu is NULL", i);
    Llms__EmbedRequest e = LLMS__EMBED_REQUEST__INIT;
    e.n_texts = n;
    e.texts = (char **)texts;
    e.has_pooling = 1;
    e.pooling = (Llms__Pooling)pooling;
    e.model = (char *)model;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_EMBED;
    req.embed = &e;
    Llms__Response *r;
    enum llms_status s = unary(c, &req, LLMS__RESPONSE__BODY_EMBED, &r);
    if (s != LLMS_OK)
        return s;
    const Llms__EmbedResponse *p = r->embed;
    size_t dim = p->dim;
    if (p->n_vectors != n || p->n_n_tokens != n) {
        size_t got = p->n_vectors;
        frame_free_response(r);
        return fail(c, LLMS_ERR_PROTOCOL, "llmsd sent %zu vectors for %zu texts", got, n);
    }
    for (size_t i = 0; i < n; i++)
        if (p->vectors[i]->n_values != dim) {
            size_t got = p->vectors[i]->n_values;
            frame_free_response(r);
            return fail(c, LLMS_ERR_PROTOCOL, "llmsd sent a vector of %zu values, not %zu", got,
                        dim);
        }
    out->values = malloc((n * dim > 0 ? n * dim : 1) * sizeof *out->values);
    out->n_tokens = malloc((n ? n : 1) * sizeof *out->n_tokens);
    if (!out->values || !out->n_tokens) {
        frame_free_response(r);
        llms_embeddings_free(out);
        return fail(c, LLMS_ERR_INTERNAL, "out of memory");
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
    enum llms_status s = check_str(c, query, "query");
    if (s != LLMS_OK)
        return s;
    if (n > 0 && !documents)
        return fail(c, LLMS_ERR_INVALID_ARGUMENT, "documents is NULL");
    for (size_t i = 0; i < n; i++)
        if (!documents[i])
            return fail(c, LLMS_ERR_INVALID_ARGUMENT, "document %zu is NULL", i);
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
    if ((s = unary(c, &req, LLMS__RESPONSE__BODY_RERANK, &r)) != LLMS_OK)
        return s;
    const Llms__RerankResponse *p = r->rerank;
    for (size_t i = 0; i < p->n_hits; i++)
        if (p->hits[i]->index >= n) {
            uint32_t bad = p->hits[i]->index;
            frame_free_response(r);
            return fail(c, LLMS_ERR_PROTOCOL, "llmsd sent document index %u of %zu", bad, n);
        }
    out->hits = malloc((p->n_hits ? p->n_hits : 1) * sizeof *out->hits);
    out->layers_computed = dup_u32(p->layers_computed, p->n_layers_computed);
    out->pruned_at_layer = dup_u32(p->pruned_at_layer, p->n_pruned_at_layer);
    if (!out->hits || !out->layers_computed || !out->pruned_at_layer) {
        frame_free_response(r);
        llms_rerank_result_free(out);
        return fail(c, LLMS_ERR_INTERNAL, "out of memory");
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
        return fail(c, LLMS_ERR_INVALID_ARGUMENT, "queries is NULL");
    for (size_t i = 0; i < n; i++) {
        if (!queries[i].query || (queries[i].n_documents > 0 && !queries[i].documents))
            return fail(c, LLMS_ERR_INVALID_ARGUMENT, "query %zu is incomplete", i);
        for (size_t d = 0; d < queries[i].n_documents; d++)
            if (!queries[i].documents[d])
                return fail(c, LLMS_ERR_INVALID_ARGUMENT, "query %zu: document %zu is NULL", i, d);
    }
    Llms__RerankQuery *qs = calloc(n ? n : 1, sizeof *qs);
    Llms__RerankQuery **qp = calloc(n ? n : 1, sizeof *qp);
    if (!qs || !qp) {
        free(qs);
        free(qp);
        return fail(c, LLMS_ERR_INTERNAL, "out of memory");
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
    enum llms_status s = unary(c, &req, LLMS__RESPONSE__BODY_RERANK_CALIBRATE, &r);
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
        return fail(c, LLMS_ERR_INTERNAL, "out of memory");
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
    enum llms_status s = check_str(c, name, "name");
    if (s != LLMS_OK)
        return s;
    Llms__KbCreateRequest kc = LLMS__KB_CREATE_REQUEST__INIT;
    kc.name = (char *)name;
    kc.has_passage_tokens = passage_tokens != 0;
    kc.passage_tokens = passage_tokens;
    kc.has_overlap_tokens = overlap_tokens != 0;
    kc.overlap_tokens = overlap_tokens;
    kc.has_share_uid = share_uid != 0;
    kc.share_uid = share_uid != 0;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_KB_CREATE;
    req.kb_create = &kc;
    return unary_ok(c, &req);
}

enum llms_status llms_kb_drop(llms_conn *c, const char *name)
{
    enum llms_status s = check_str(c, name, "name");
    if (s != LLMS_OK)
        return s;
    Llms__KbDropRequest kd = LLMS__KB_DROP_REQUEST__INIT;
    kd.kb = (char *)name;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_KB_DROP;
    req.kb_drop = &kd;
    return unary_ok(c, &req);
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
        enum llms_status s = next_for(c, id, &r);
        if (s != LLMS_OK)
            return s;
        if (r->error) {
            s = error_of(c, r);
            int final = r->final;
            frame_free_response(r);
            if (!final)
                continue;
            return cancelled ? fail(c, LLMS_ERR_CANCELLED, "cancelled by the caller") : s;
        }
        if (r->body_case == LLMS__RESPONSE__BODY_KB_ADD_PROGRESS && !r->final) {
            const Llms__KbAddProgress *p = r->kb_add_progress;
            llms_kb_progress pr = {
                .phase = (enum llms_kb_phase)p->phase,
                .documents = p->documents, .documents_written = p->documents_written,
                .bytes = p->bytes, .bytes_split = p->bytes_split,
                .passages = p->passages, .passages_embedded = p->passages_embedded,
                .passages_written = p->passages_written,
            };
            if (!cancelled && on_progress && on_progress(&pr, user)) {
                cancelled = 1;
                if ((s = send_cancel(c, id)) != LLMS_OK) {
                    frame_free_response(r);
                    return s;
                }
            }
            frame_free_response(r);
            continue;
        }
        if (r->body_case != LLMS__RESPONSE__BODY_KB_ADD || !r->final) {
            frame_free_response(r);
            return fail(c, LLMS_ERR_PROTOCOL, "unexpected frame in a KbAdd's reply (body %d)",
                        (int)r->body_case);
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
    enum llms_status s = check_str(c, kb, "kb");
    if (s != LLMS_OK)
        return s;
    for (size_t i = 0; i < n; i++)
        if ((s = check_str(c, docs[i].id, "document id")) != LLMS_OK ||
            (s = check_str(c, docs[i].text, "document text")) != LLMS_OK)
            return s;
    Llms__KbDocument *d = calloc(n ? n : 1, sizeof *d);
    Llms__KbDocument **dp = calloc(n ? n : 1, sizeof *dp);
    if (!d || !dp) {
        free(d);
        free(dp);
        return fail(c, LLMS_ERR_INTERNAL, "out of memory");
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
    s = send_request(c, &req, &id);
    free(d);
    free(dp);
    if (s != LLMS_OK)
        return s;
    return kb_add_stream(c, id, on_progress, user, passages);
}

enum llms_status llms_kb_remove(llms_conn *c, const char *kb, const char *const *ids, size_t n,
                                uint32_t *removed)
{
    enum llms_status s = check_str(c, kb, "kb");
    if (s != LLMS_OK)
        return s;
    for (size_t i = 0; i < n; i++)
        if ((s = check_str(c, ids[i], "document id")) != LLMS_OK)
            return s;
    Llms__KbRemoveRequest kr = LLMS__KB_REMOVE_REQUEST__INIT;
    kr.kb = (char *)kb;
    kr.n_ids = n;
    kr.ids = (char **)ids;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_KB_REMOVE;
    req.kb_remove = &kr;
    Llms__Response *r;
    if ((s = unary(c, &req, LLMS__RESPONSE__BODY_KB_REMOVE, &r)) != LLMS_OK)
        return s;
    if (removed)
        *removed = r->kb_remove->removed;
    frame_free_response(r);
    return LLMS_OK;
}

void llms_kb_list_free(llms_kb_info *kbs, size_t n)
{
    for (size_t i = 0; kbs && i < n; i++)
        free(kbs[i].name);
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
    enum llms_status s = unary(c, &req, LLMS__RESPONSE__BODY_KB_LIST, &r);
    if (s != LLMS_OK)
        return s;
    size_t n = r->kb_list->n_kbs;
    llms_kb_info *k = calloc(n ? n : 1, sizeof *k);
    for (size_t i = 0; k && i < n; i++) {
        const Llms__KbInfo *p = r->kb_list->kbs[i];
        k[i] = (llms_kb_info){strdup(p->name), p->documents, p->passages, p->bytes,
                              p->passage_tokens, p->overlap_tokens, p->qa_entries,
                              p->share_uid};
        if (!k[i].name) {
            llms_kb_list_free(k, i);
            k = NULL;
        }
    }
    frame_free_response(r);
    if (!k)
        return fail(c, LLMS_ERR_INTERNAL, "out of memory");
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
        h[i].document = dup_or_null(p[i]->document);
        h[i].text = dup_or_null(p[i]->text);
        h[i].metadata = dup_or_null(p[i]->metadata);
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
    enum llms_status s = check_str(c, kb, "kb");
    if (s != LLMS_OK || (s = check_str(c, query, "query")) != LLMS_OK)
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
    if ((s = unary(c, &req, LLMS__RESPONSE__BODY_KB_SEARCH, &r)) != LLMS_OK)
        return s;
    size_t n = r->kb_search->n_hits;
    llms_kb_hit *h = hits_from(r->kb_search->hits, n);
    frame_free_response(r);
    if (!h)
        return fail(c, LLMS_ERR_INTERNAL, "out of memory");
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

static enum llms_status rag_result_from(llms_conn *c, const Llms__RagResult *p,
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
        return fail(c, LLMS_ERR_INTERNAL, "out of memory");
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
    enum llms_status s = check_str(c, kb, "kb");
    if (s != LLMS_OK || (s = check_str(c, question, "question")) != LLMS_OK)
        return s;
    Llms__GenerationParams g;
    Llms__RagQueryRequest rq = LLMS__RAG_QUERY_REQUEST__INIT;
    rq.kb = (char *)kb;
    rq.question = (char *)question;
    if (opt) {
        rq.has_top_k = opt->top_k != 0;
        rq.top_k = opt->top_k;
        rq.has_retrieval = 1;
        rq.retrieval = (Llms__Retrieval)opt->retrieval;
        rq.system_prompt = (char *)opt->system_prompt;
        if (params_to_proto(opt->params, &g))
            rq.params = &g;
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
    if ((s = send_request(c, &req, &id)) != LLMS_OK)
        return s;
    s = stream(c, id, on_text, user, NULL, res);
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
    enum llms_status s = unary(c, &req, LLMS__RESPONSE__BODY_CACHE, &r);
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
    return unary_ok(c, &req);
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
    return unary_ok(c, &req);
}

/* ---- workflow graphs ---- */

enum llms_status llms_graph_create(llms_conn *c, const char *name, const llms_graph_def *def)
{
    enum llms_status s = check_str(c, name, "name");
    if (s != LLMS_OK)
        return s;
    if (!def || (def->n_nodes && !def->nodes) || (def->n_edges && !def->edges) ||
        (def->n_inputs && !def->inputs) || !def->output)
        return fail(c, LLMS_ERR_INVALID_ARGUMENT, "incomplete graph definition");
    Llms__GraphNode *nodes = calloc(def->n_nodes + 1, sizeof *nodes);
    Llms__GraphNode **np = calloc(def->n_nodes + 1, sizeof *np);
    Llms__GenerationParams *params = calloc(def->n_nodes + 1, sizeof *params);
    Llms__GraphEdge *edges = calloc(def->n_edges + 1, sizeof *edges);
    Llms__GraphEdge **ep = calloc(def->n_edges + 1, sizeof *ep);
    if (!nodes || !np || !params || !edges || !ep) {
        s = fail(c, LLMS_ERR_INTERNAL, "out of memory");
        goto out;
    }
    Llms__GraphDef d = LLMS__GRAPH_DEF__INIT;
    d.n_inputs = def->n_inputs;
    d.inputs = (char **)def->inputs;
    d.output = (char *)def->output;
    d.has_max_steps = def->max_steps != 0;
    d.max_steps = def->max_steps;
    for (size_t i = 0; i < def->n_nodes; i++) {
        const llms_graph_node *n = &def->nodes[i];
        if (!n->name || !n->output) {
            s = fail(c, LLMS_ERR_INVALID_ARGUMENT, "node %zu: a name and an output are needed", i);
            goto out;
        }
        llms__graph_node__init(&nodes[i]);
        nodes[i].name = (char *)n->name;
        nodes[i].output = (char *)n->output;
        nodes[i].kind = (Llms__GraphNodeKind)n->kind;
        if (n->kind == LLMS_GRAPH_GENERATE) {
            nodes[i].prompt = (char *)n->prompt;
            if (params_to_proto(n->params, &params[i]))
                nodes[i].params = &params[i];
            nodes[i].has_chat = n->chat != 0;
            nodes[i].chat = n->chat != 0;
        } else {
            nodes[i].kb = (char *)n->kb;
            nodes[i].query = (char *)n->query;
            nodes[i].has_top_k = n->top_k != 0;
            nodes[i].top_k = n->top_k;
            nodes[i].has_retrieval = n->retrieval != LLMS_RETRIEVAL_RRF;
            nodes[i].retrieval = (Llms__Retrieval)n->retrieval;
        }
        np[i] = &nodes[i];
    }
    for (size_t i = 0; i < def->n_edges; i++) {
        if (!def->edges[i].from || !def->edges[i].to) {
            s = fail(c, LLMS_ERR_INVALID_ARGUMENT, "edge %zu: from and to are needed", i);
            goto out;
        }
        llms__graph_edge__init(&edges[i]);
        edges[i].from = (char *)def->edges[i].from;
        edges[i].to = (char *)def->edges[i].to;
        edges[i].when = (char *)def->edges[i].when;
        ep[i] = &edges[i];
    }
    d.n_nodes = def->n_nodes;
    d.nodes = np;
    d.n_edges = def->n_edges;
    d.edges = ep;
    Llms__GraphCreateRequest gc = LLMS__GRAPH_CREATE_REQUEST__INIT;
    gc.name = (char *)name;
    gc.graph = &d;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_GRAPH_CREATE;
    req.graph_create = &gc;
    s = unary_ok(c, &req);
out:
    free(nodes);
    free(np);
    free(params);
    free(edges);
    free(ep);
    return s;
}

enum llms_status llms_graph_delete(llms_conn *c, const char *name)
{
    enum llms_status s = check_str(c, name, "name");
    if (s != LLMS_OK)
        return s;
    Llms__GraphDeleteRequest gd = LLMS__GRAPH_DELETE_REQUEST__INIT;
    gd.name = (char *)name;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_GRAPH_DELETE;
    req.graph_delete = &gd;
    return unary_ok(c, &req);
}

void llms_graph_list_free(llms_graph_info *graphs, size_t n)
{
    if (!graphs)
        return;
    for (size_t i = 0; i < n; i++) {
        free(graphs[i].name);
        free(graphs[i].output);
        for (size_t k = 0; k < graphs[i].n_inputs; k++)
            free(graphs[i].inputs[k]);
        free(graphs[i].inputs);
    }
    free(graphs);
}

enum llms_status llms_graph_list(llms_conn *c, llms_graph_info **out, size_t *n_out)
{
    *out = NULL;
    *n_out = 0;
    Llms__Empty e = LLMS__EMPTY__INIT;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_GRAPH_LIST;
    req.graph_list = &e;
    Llms__Response *r;
    enum llms_status s = unary(c, &req, LLMS__RESPONSE__BODY_GRAPH_LIST, &r);
    if (s != LLMS_OK)
        return s;
    const Llms__GraphListResponse *l = r->graph_list;
    llms_graph_info *g = calloc(l->n_graphs + 1, sizeof *g);
    bool ok = g != NULL;
    for (size_t i = 0; ok && i < l->n_graphs; i++) {
        const Llms__GraphDef *d = l->graphs[i]->graph;
        g[i].name = strdup(l->graphs[i]->name);
        g[i].builtin = l->graphs[i]->builtin;
        g[i].output = strdup(d->output);
        g[i].inputs = calloc(d->n_inputs + 1, sizeof *g[i].inputs);
        ok = g[i].name && g[i].output && g[i].inputs;
        for (size_t k = 0; ok && k < d->n_inputs; k++, g[i].n_inputs++)
            ok = (g[i].inputs[k] = strdup(d->inputs[k])) != NULL;
        g[i].n_nodes = d->n_nodes;
        g[i].n_edges = d->n_edges;
        g[i].max_steps = d->has_max_steps ? d->max_steps : 0;
    }
    if (!ok) {
        llms_graph_list_free(g, l->n_graphs);
        frame_free_response(r);
        return fail(c, LLMS_ERR_INTERNAL, "out of memory");
    }
    *out = g;
    *n_out = l->n_graphs;
    frame_free_response(r);
    return LLMS_OK;
}

void llms_graph_result_free(llms_graph_result *r)
{
    if (!r)
        return;
    free(r->output);
    for (size_t i = 0; i < r->n_timings; i++)
        free(r->timings[i].node);
    free(r->timings);
    for (size_t i = 0; i < r->n_state; i++) {
        free(r->state_names[i]);
        free(r->state_values[i]);
    }
    free(r->state_names);
    free(r->state_values);
    memset(r, 0, sizeof *r);
}

static enum llms_status graph_result_from(llms_conn *c, const Llms__GraphResult *p,
                                          llms_graph_result *out)
{
    *out = (llms_graph_result){
        .output = strdup(p->output),
        .steps = p->steps,
        .capped = p->capped,
        .timings = calloc(p->n_timings + 1, sizeof *out->timings),
        .state_names = calloc(p->n_state + 1, sizeof *out->state_names),
        .state_values = calloc(p->n_state + 1, sizeof *out->state_values),
        .total_ms = p->total_ms,
        .queue_ms = p->queue_ms,
        .speculations = p->speculations,
        .spec_hits = p->spec_hits,
        .spec_rollbacks = p->spec_rollbacks,
        .spec_saved_ms = p->spec_saved_ms,
        .prompt_tokens = p->prompt_tokens,
        .reused_tokens = p->reused_tokens,
    };
    bool ok = out->output && out->timings && out->state_names && out->state_values;
    for (size_t i = 0; ok && i < p->n_timings; i++, out->n_timings++) {
        const Llms__GraphNodeTiming *t = p->timings[i];
        out->timings[i] = (llms_graph_timing){strdup(t->node), t->runs, t->ms,
                                              t->generated_tokens};
        ok = out->timings[i].node != NULL;
    }
    for (size_t i = 0; ok && i < p->n_state; i++, out->n_state++) {
        out->state_names[i] = strdup(p->state[i]->name);
        out->state_values[i] = strdup(p->state[i]->value);
        ok = out->state_names[i] && out->state_values[i];
    }
    if (!ok) {
        llms_graph_result_free(out);
        return fail(c, LLMS_ERR_INTERNAL, "out of memory");
    }
    return LLMS_OK;
}

enum llms_status llms_graph_run(llms_conn *c, const char *graph, const llms_graph_var *inputs,
                                size_t n, const llms_params *params, llms_graph_event_cb on_event,
                                void *user, llms_graph_result *out)
{
    return llms_graph_run_speculate(c, graph, inputs, n, params, LLMS_SPECULATE_DEFAULT,
                                    on_event, user, out);
}

enum llms_status llms_graph_run_speculate(llms_conn *c, const char *graph,
                                          const llms_graph_var *inputs, size_t n,
                                          const llms_params *params, enum llms_speculate spec,
                                          llms_graph_event_cb on_event, void *user,
                                          llms_graph_result *out)
{
    if (out)
        memset(out, 0, sizeof *out);
    enum llms_status s = check_str(c, graph, "graph");
    if (s != LLMS_OK)
        return s;
    Llms__GraphVar *vars = calloc(n + 1, sizeof *vars);
    Llms__GraphVar **vp = calloc(n + 1, sizeof *vp);
    if (!vars || !vp) {
        free(vars);
        free(vp);
        return fail(c, LLMS_ERR_INTERNAL, "out of memory");
    }
    for (size_t i = 0; i < n && s == LLMS_OK; i++) {
        if (!inputs[i].name || !inputs[i].value)
            s = fail(c, LLMS_ERR_INVALID_ARGUMENT, "input %zu: a name and a value are needed", i);
        llms__graph_var__init(&vars[i]);
        vars[i].name = (char *)inputs[i].name;
        vars[i].value = (char *)inputs[i].value;
        vp[i] = &vars[i];
    }
    Llms__GenerationParams g;
    Llms__GraphRunRequest gr = LLMS__GRAPH_RUN_REQUEST__INIT;
    gr.graph = (char *)graph;
    gr.n_inputs = n;
    gr.inputs = vp;
    if (params_to_proto(params, &g))
        gr.params = &g;
    gr.has_speculate = spec != LLMS_SPECULATE_DEFAULT;
    gr.speculate = spec == LLMS_SPECULATE_ON;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_GRAPH_RUN;
    req.graph_run = &gr;
    uint64_t id;
    if (s == LLMS_OK)
        s = send_request(c, &req, &id);
    free(vars);
    free(vp);
    if (s != LLMS_OK)
        return s;
    int cancelled = 0;
    for (;;) {
        Llms__Response *r;
        if ((s = next_for(c, id, &r)) != LLMS_OK)
            return s;
        if (r->error) {
            s = error_of(c, r);
            int final = r->final;
            frame_free_response(r);
            if (!final)
                continue;
            return cancelled ? fail(c, LLMS_ERR_CANCELLED, "cancelled by the caller") : s;
        }
        if (r->body_case == LLMS__RESPONSE__BODY_GRAPH_EVENT && !r->final) {
            const Llms__GraphEvent *e = r->graph_event;
            llms_graph_event ev = {
                .finished = e->kind == LLMS__GRAPH_EVENT_KIND__GRAPH_NODE_FINISHED,
                .node = e->node, .step = e->step, .output = e->output, .value = e->value,
                .ms = e->has_ms ? e->ms : 0,
                .generated_tokens = e->has_generated_tokens ? e->generated_tokens : 0,
                .speculation = !e->has_speculation ? LLMS_GRAPH_SPEC_NONE
                               : e->speculation == LLMS__GRAPH_SPECULATION__GRAPH_SPEC_HIT
                                   ? LLMS_GRAPH_SPEC_HIT
                                   : LLMS_GRAPH_SPEC_ROLLBACK,
            };
            if (!cancelled && on_event && on_event(&ev, user)) {
                cancelled = 1;
                if ((s = send_cancel(c, id)) != LLMS_OK) {
                    frame_free_response(r);
                    return s;
                }
            }
            frame_free_response(r);
            continue;
        }
        if (r->body_case != LLMS__RESPONSE__BODY_GRAPH_RESULT || !r->final) {
            frame_free_response(r);
            return fail(c, LLMS_ERR_PROTOCOL, "unexpected frame in a graph run");
        }
        s = out ? graph_result_from(c, r->graph_result, out) : LLMS_OK;
        frame_free_response(r);
        if (s == LLMS_OK && cancelled)
            return fail(c, LLMS_ERR_CANCELLED, "cancelled by the caller");
        if (s == LLMS_OK)
            c->err[0] = '\0';
        return s;
    }
}
