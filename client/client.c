/* client.c — libllmsclient: blocking calls over llms.proto frames (see llms.h). This file
 * owns the connection, the framing and the request/response machinery every call goes
 * through (client_internal.h), errors and status names, generation parameters, Bind; the
 * calls themselves live by subject in ctx.c, kb.c, graph.c, semantic.c and admin.c. */
#include "client/llms.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "client/client_internal.h"
#include "proto/frame.h"

/* Replies (a listing with histories) may be far larger than any request the daemon
 * accepts, so the client's own limit is generous; it only guards against garbage. */
#define CLIENT_MAX_FRAME (256u << 20)

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

enum llms_status client_fail(llms_conn *c, enum llms_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    if (s == LLMS_ERR_IO || s == LLMS_ERR_PROTOCOL)
        c->broken = 1;
    return s;
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
    /* A program that closed stdin, stdout or stderr gets the lowest free fd from socket();
     * what it prints there later would reach the daemon as frames. */
    if (c->fd <= STDERR_FILENO) {
        int moved = fcntl(c->fd, F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
        int saved = errno;
        close(c->fd);
        if (moved < 0) {
            snprintf(err, LLMS_ERROR_MAX, "fcntl: %s", strerror(saved));
            free(c);
            return LLMS_ERR_IO;
        }
        c->fd = moved;
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
            return client_fail(c, LLMS_ERR_IO, "write to llmsd: %s", strerror(errno));
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
            return client_fail(c, LLMS_ERR_IO, "read from llmsd: %s", strerror(errno));
        }
        if (r == 0)
            return client_fail(c, LLMS_ERR_IO, "llmsd closed the connection");
        p += r;
        n -= (size_t)r;
    }
    return LLMS_OK;
}

/* Sends req with a fresh id, which is returned in *id. A daemon that refuses a request
 * from its frame header (too large) answers and closes without reading the rest, so the
 * write fails: the answer already sent says why, and is the error returned. */
enum llms_status client_send_request(llms_conn *c, Llms__Request *req, uint64_t *id)
{
    if (c->in_callback)
        return client_fail(c, LLMS_ERR_FAILED_PRECONDITION,
                           "a call is in progress on this connection: its callback may not "
                           "make another (use a second connection)");
    if (c->broken)
        return client_fail(c, LLMS_ERR_IO, "connection is unusable after an earlier failure");
    req->id = c->next_id++;
    if (c->timeout_ms) {
        req->has_timeout_ms = 1;
        req->timeout_ms = c->timeout_ms;
    }
    uint8_t *buf;
    size_t len;
    if (frame_pack(&req->base, UINT32_MAX, &buf, &len) < 0)
        return client_fail(c, LLMS_ERR_INTERNAL, "out of memory packing a request");
    int sys_errno = 0;
    enum llms_status s = write_all(c, buf, len, &sys_errno);
    free(buf);
    if (s == LLMS_ERR_IO && (sys_errno == EPIPE || sys_errno == ECONNRESET)) {
        char wrote[LLMS_ERROR_MAX];
        snprintf(wrote, sizeof wrote, "%s", c->err);
        Llms__Response *r = NULL;
        enum llms_status why = client_next_for(c, req->id, &r);
        if (why == LLMS_OK) {
            s = r->error ? client_error_of(c, r) : client_fail(c, LLMS_ERR_IO, "%s", wrote);
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
        return client_fail(c, LLMS_ERR_PROTOCOL, "llmsd sent an empty frame");
    case FRAME_TOO_LARGE:
        return client_fail(c, LLMS_ERR_PROTOCOL, "llmsd sent a frame of %u bytes", len);
    default:
        break;
    }
    uint8_t *body = malloc(len);
    if (!body)
        return client_fail(c, LLMS_ERR_INTERNAL, "out of memory reading a %u-byte frame", len);
    s = read_all(c, body, len);
    if (s == LLMS_OK) {
        *out = frame_unpack_response(body, len);
        if (!*out)
            s = client_fail(c, LLMS_ERR_PROTOCOL, "llmsd sent an undecodable frame");
    }
    free(body);
    return s;
}

/*
 * Reads frames until the next one for request id. Frames for other ids (late answers to
 * cancelled or abandoned requests) are skipped. An error frame with id 0 is the daemon
 * refusing the stream itself: it closes the connection after it.
 */
enum llms_status client_next_for(llms_conn *c, uint64_t id, Llms__Response **out)
{
    for (;;) {
        Llms__Response *r = NULL;
        enum llms_status s = read_response(c, &r);
        if (s != LLMS_OK)
            return s;
        if (r->id == id) {
            *out = r;
            return LLMS_OK;
        }
        if (r->id == 0 && r->error) {
            s = client_fail(c, (enum llms_status)r->error->code, "%s", r->error->message);
            c->broken = 1;
            frame_free_response(r);
            return s;
        }
        frame_free_response(r);
    }
}

enum llms_status client_next_answer(llms_conn *c, uint64_t id, int cancelled,
                                    Llms__Response **out)
{
    for (;;) {
        Llms__Response *r = NULL;
        enum llms_status s = client_next_for(c, id, &r);
        if (s != LLMS_OK)
            return s;
        if (!r->error) {
            *out = r;
            return LLMS_OK;
        }
        s = client_error_of(c, r);
        int final = r->final;
        frame_free_response(r);
        if (final)
            return cancelled ? client_fail(c, LLMS_ERR_CANCELLED, "cancelled by the caller") : s;
    }
}

/* Takes an error Response apart: its code and message. */
enum llms_status client_error_of(llms_conn *c, const Llms__Response *r)
{
    enum llms_status code = (enum llms_status)r->error->code;
    if (code == LLMS_OK)
        code = LLMS_ERR_INTERNAL;
    return client_fail(c, code, "%s", r->error->message ? r->error->message : "");
}

/*
 * Sends a unary request and reads its single final reply, which must carry body
 * `want` (or an error).
 */
enum llms_status client_unary(llms_conn *c, Llms__Request *req, Llms__Response__BodyCase want,
                              Llms__Response **out)
{
    uint64_t id;
    enum llms_status s = client_send_request(c, req, &id);
    if (s != LLMS_OK)
        return s;
    Llms__Response *r = NULL;
    if ((s = client_next_for(c, id, &r)) != LLMS_OK)
        return s;
    if (r->error)
        s = client_error_of(c, r);
    else if (r->body_case != want || !r->final)
        s = client_fail(c, LLMS_ERR_PROTOCOL, "llmsd answered with an unexpected message (body %d)",
                        (int)r->body_case);
    if (s != LLMS_OK) {
        frame_free_response(r);
        return s;
    }
    c->err[0] = '\0';
    *out = r;
    return LLMS_OK;
}

enum llms_status client_unary_ok(llms_conn *c, Llms__Request *req)
{
    Llms__Response *r = NULL;
    enum llms_status s = client_unary(c, req, LLMS__RESPONSE__BODY_OK, &r);
    if (s == LLMS_OK)
        frame_free_response(r);
    return s;
}

enum llms_status client_check_str(llms_conn *c, const char *s, const char *what)
{
    if (!s)
        return client_fail(c, LLMS_ERR_INVALID_ARGUMENT, "%s is NULL", what);
    return LLMS_OK;
}

char *client_dup_or_null(const char *s)
{
    return s ? strdup(s) : NULL;
}

/* ---- generation parameters ---- */

void llms_free(void *p)
{
    free(p);
}

void llms_params_init(llms_params *p)
{
    *p = (llms_params)LLMS_PARAMS_INIT;
}

/* p's samplers order (llama.cpp's letters) into pb->order: the count, or -1 for a letter
 * of no sampler or one named twice (each runs once). */
static int samplers_of_letters(const char *letters, client_params_pb *pb)
{
    static const char steps[] = "edskypmxt"; /* in the order of SamplerStep */
    int n = 0;
    unsigned seen = 0;
    for (const char *l = letters; *l; l++) {
        const char *at = strchr(steps, *l);
        if (!at || n == (int)(sizeof pb->order / sizeof *pb->order) ||
            (seen & 1u << (at - steps)))
            return -1;
        seen |= 1u << (at - steps);
        pb->order[n++] = (Llms__SamplerStep)(at - steps);
    }
    return n;
}

/* llama.cpp's other samplers of p into pb (pb->any_set when one is set). */
static enum llms_status pack_newer_samplers(llms_conn *c, const llms_params *p,
                                            client_params_pb *pb)
{
    Llms__GenerationParams *g = &pb->g;
    if (p->n_dry_sequence_breakers > 0 && !p->dry_sequence_breakers)
        return client_fail(c, LLMS_ERR_INVALID_ARGUMENT,
                           "n_dry_sequence_breakers is %zu and dry_sequence_breakers NULL",
                           p->n_dry_sequence_breakers);
    int n_order = p->samplers ? samplers_of_letters(p->samplers, pb) : 0;
    if (n_order < 0)
        return client_fail(c, LLMS_ERR_INVALID_ARGUMENT,
                           "samplers '%.32s': llama.cpp's letters (edskypmxt), each once",
                           p->samplers);
    const struct {
        protobuf_c_boolean *has;
        float *to, from;
    } floats[] = {
        {&g->has_typical_p, &g->typical_p, p->typical_p},
        {&g->has_top_n_sigma, &g->top_n_sigma, p->top_n_sigma},
        {&g->has_xtc_probability, &g->xtc_probability, p->xtc_probability},
        {&g->has_xtc_threshold, &g->xtc_threshold, p->xtc_threshold},
        {&g->has_dynatemp_range, &g->dynatemp_range, p->dynatemp_range},
        {&g->has_dynatemp_exponent, &g->dynatemp_exponent, p->dynatemp_exponent},
        {&g->has_dry_multiplier, &g->dry_multiplier, p->dry_multiplier},
        {&g->has_dry_base, &g->dry_base, p->dry_base},
        {&g->has_mirostat_tau, &g->mirostat_tau, p->mirostat_tau},
        {&g->has_mirostat_eta, &g->mirostat_eta, p->mirostat_eta},
    };
    const struct {
        protobuf_c_boolean *has;
        int32_t *to, from;
    } ints[] = {
        {&g->has_min_keep, &g->min_keep, p->min_keep},
        {&g->has_dry_allowed_length, &g->dry_allowed_length, p->dry_allowed_length},
        {&g->has_dry_penalty_last_n, &g->dry_penalty_last_n, p->dry_penalty_last_n},
        {&g->has_mirostat, &g->mirostat, p->mirostat},
    };
    for (size_t i = 0; i < sizeof floats / sizeof *floats; i++) {
        *floats[i].has = !isnan(floats[i].from);
        *floats[i].to = floats[i].from;
        pb->any_set |= *floats[i].has;
    }
    /* 0, which neither takes, is a zeroed struct's (llms.h): unset, not refused */
    g->has_typical_p &= p->typical_p != 0;
    g->has_dry_base &= p->dry_base != 0;
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) {
        *ints[i].has = ints[i].from != LLMS_UNSET;
        *ints[i].to = ints[i].from;
        pb->any_set |= *ints[i].has;
    }
    g->n_dry_sequence_breakers = p->n_dry_sequence_breakers;
    g->dry_sequence_breakers = (char **)p->dry_sequence_breakers; /* only read while packing */
    g->n_samplers = (size_t)n_order;
    g->samplers = pb->order;
    pb->any_set |= g->n_dry_sequence_breakers > 0 || g->n_samplers > 0;
    return LLMS_OK;
}

enum llms_status client_params_pack(llms_conn *c, const llms_params *p, client_params_pb *pb)
{
    *pb = (client_params_pb){0};
    Llms__GenerationParams *g = &pb->g;
    llms__generation_params__init(g);
    if (!p)
        return LLMS_OK;
    if (p->n_logit_bias > 0 && !p->logit_bias)
        return client_fail(c, LLMS_ERR_INVALID_ARGUMENT, "n_logit_bias is %zu and logit_bias NULL",
                           p->n_logit_bias);
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
    g->has_speculation = p->speculation != LLMS_SPECULATION_DEFAULT;
    g->speculation = p->speculation == LLMS_SPECULATION_LOOKUP  ? LLMS__SPECULATION__SPECULATION_LOOKUP
                     : p->speculation == LLMS_SPECULATION_DRAFT ? LLMS__SPECULATION__SPECULATION_DRAFT
                     : p->speculation == LLMS_SPECULATION_BOTH  ? LLMS__SPECULATION__SPECULATION_BOTH
                                                                : LLMS__SPECULATION__SPECULATION_OFF;
    g->has_frequency_penalty = !isnan(p->frequency_penalty);
    g->frequency_penalty = p->frequency_penalty;
    g->has_presence_penalty = !isnan(p->presence_penalty);
    g->presence_penalty = p->presence_penalty;
    g->has_logprobs = p->logprobs != 0;
    g->logprobs = p->top_logprobs;
    g->has_format = p->format != LLMS_FORMAT_DEFAULT;
    g->format = p->format == LLMS_FORMAT_JSON_OBJECT   ? LLMS__RESPONSE_FORMAT__FORMAT_JSON_OBJECT
                : p->format == LLMS_FORMAT_JSON_SCHEMA ? LLMS__RESPONSE_FORMAT__FORMAT_JSON_SCHEMA
                : p->format == LLMS_FORMAT_GRAMMAR     ? LLMS__RESPONSE_FORMAT__FORMAT_GRAMMAR
                                                       : LLMS__RESPONSE_FORMAT__FORMAT_TEXT;
    g->json_schema = (char *)p->json_schema;
    g->grammar = (char *)p->grammar;
    g->has_ignore_eos = p->ignore_eos != 0;
    g->ignore_eos = p->ignore_eos != 0;
    enum llms_status st = pack_newer_samplers(c, p, pb);
    if (st != LLMS_OK)
        return st;
    if (p->n_logit_bias > 0) {
        pb->bias = calloc(p->n_logit_bias, sizeof *pb->bias);
        pb->bias_ptrs = calloc(p->n_logit_bias, sizeof *pb->bias_ptrs);
        if (!pb->bias || !pb->bias_ptrs) {
            client_params_pb_free(pb);
            return client_fail(c, LLMS_ERR_INTERNAL, "out of memory for %zu logit biases",
                               p->n_logit_bias);
        }
        for (size_t i = 0; i < p->n_logit_bias; i++) {
            llms__token_bias__init(&pb->bias[i]);
            pb->bias[i].token = p->logit_bias[i].token;
            pb->bias[i].bias = p->logit_bias[i].bias;
            pb->bias_ptrs[i] = &pb->bias[i];
        }
        g->n_logit_bias = p->n_logit_bias;
        g->logit_bias = pb->bias_ptrs;
    }
    pb->any_set = g->has_temperature || g->has_top_k || g->has_top_p || g->has_min_p ||
                  g->has_repeat_penalty || g->has_repeat_last_n || g->has_max_tokens ||
                  g->has_seed || g->n_stop > 0 || g->has_speculation ||
                  g->has_frequency_penalty || g->has_presence_penalty || g->n_logit_bias > 0 ||
                  g->has_logprobs || g->has_format || g->json_schema || g->grammar ||
                  g->has_ignore_eos || pb->any_set;
    return LLMS_OK;
}

Llms__GenerationParams *client_params_packed(client_params_pb *pb)
{
    return pb->any_set ? &pb->g : NULL;
}

void client_params_pb_free(client_params_pb *pb)
{
    free(pb->bias);
    free(pb->bias_ptrs);
    *pb = (client_params_pb){0};
}

/* out->logprobs from the result's (none asked: none); -1 out of memory. */
static int client_logprobs_from(const Llms__CallResult *cr, llms_result *out)
{
    if (cr->n_logprobs == 0)
        return 0;
    if (!(out->logprobs = calloc(cr->n_logprobs, sizeof *out->logprobs)))
        return -1;
    out->n_logprobs = cr->n_logprobs;
    for (size_t i = 0; i < cr->n_logprobs; i++) {
        const Llms__TokenLogprob *t = cr->logprobs[i];
        llms_token_logprob *o = &out->logprobs[i];
        o->token = t->token;
        o->logprob = t->logprob;
        o->n_top = t->n_top < LLMS_LOGPROBS_MAX ? (int)t->n_top : LLMS_LOGPROBS_MAX;
        for (int k = 0; k < o->n_top; k++) {
            o->top_token[k] = t->top[k]->token;
            o->top_logprob[k] = t->top[k]->logprob;
        }
    }
    return 0;
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
    enum llms_status s = client_check_str(c, app_name, "app_name");
    if (s != LLMS_OK)
        return s;
    Llms__BindRequest b = LLMS__BIND_REQUEST__INIT;
    b.app_name = (char *)app_name;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_BIND;
    req.bind = &b;
    Llms__Response *r = NULL;
    if ((s = client_unary(c, &req, LLMS__RESPONSE__BODY_BIND, &r)) != LLMS_OK)
        return s;
    frame_free_response(r);
    return LLMS_OK;
}

/* ---- streamed replies ---- */

/* Cancels request id; the Cancel's own answer arrives under its id and is skipped. */
enum llms_status client_send_cancel(llms_conn *c, uint64_t id)
{
    Llms__CancelRequest cr = LLMS__CANCEL_REQUEST__INIT;
    cr.request_id = id;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.body_case = LLMS__REQUEST__BODY_CANCEL;
    req.cancel = &cr;
    return client_send_request(c, &req, NULL);
}

/*
 * Reads the stream of request id to its final frame, passing chunks to on_text. When
 * on_text asks to stop, a Cancel goes out and the rest of the stream is drained without
 * further callbacks, so the connection stays in step.
 */
enum llms_status client_stream(llms_conn *c, uint64_t id, llms_token_cb on_text, void *user,
                               llms_result *out, llms_rag_result *rag_out)
{
    int cancelled = 0;
    for (;;) {
        Llms__Response *r = NULL;
        enum llms_status s = client_next_answer(c, id, cancelled, &r);
        if (s != LLMS_OK)
            return s;
        if (r->body_case == LLMS__RESPONSE__BODY_CHUNK && !r->final) {
            int stop = 0;
            if (!cancelled && on_text) {
                c->in_callback = 1;
                stop = on_text(r->chunk->text, strlen(r->chunk->text), user);
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
        bool rag_final = rag_out && r->body_case == LLMS__RESPONSE__BODY_RAG_RESULT;
        if ((r->body_case != LLMS__RESPONSE__BODY_RESULT && !rag_final) || !r->final) {
            frame_free_response(r);
            return client_fail(c, LLMS_ERR_PROTOCOL, "unexpected frame in a streamed reply");
        }
        if (rag_final && (s = client_rag_result_from(c, r->rag_result, rag_out)) != LLMS_OK) {
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
                .cached_tokens = cr->has_cached_tokens ? cr->cached_tokens : 0,
            };
            if (!out->text || client_logprobs_from(cr, out)) {
                llms_result_free(out);
                frame_free_response(r);
                return client_fail(c, LLMS_ERR_INTERNAL, "out of memory");
            }
        }
        frame_free_response(r);
        if (cancelled)
            return client_fail(c, LLMS_ERR_CANCELLED, "cancelled by the caller");
        c->err[0] = '\0';
        return LLMS_OK;
    }
}
