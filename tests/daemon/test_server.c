/*
 * End-to-end tests of llmsd: they start the daemon of the same build (release or
 * sanitizer) on a socket in a temporary directory, with a tiny generated model, and
 * speak raw frames to it.
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"
#include "proto/frame.h"
#include "tests/support/test.h"

#define IO_TIMEOUT_MS 30000

static char llmsd[1024];
static char model_path[1024], sock_path[108], state_dir[1024], log_path[1024];
static pid_t daemon_pid = -1;
static char notify_path[108]; /* when set, the daemon is started under a fake systemd */

static int make_model(void)
{
    snprintf(model_path, sizeof model_path, "%s/tiny.gguf", test_tmpdir());
    modelgen_params p = {
        .arch = "llama", .dim = 32, .n_layer = 2, .n_head = 2, .n_head_kv = 1, .n_ff = 64,
        .n_ctx = 256, .type = QTYPE_F32, .seed = 7, .n_vocab = 300, .n_threads = 1,
    };
    char err[ERR_MAX];
    if (modelgen_write(&p, model_path, err)) {
        fprintf(stderr, "modelgen: %s\n", err);
        return -1;
    }
    return 0;
}

static int connect_socket(void)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", sock_path);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0)
        return fd;
    if (fd >= 0)
        close(fd);
    return -1;
}

/* Starts llmsd and waits until its socket answers. */
static int start_daemon(void)
{
    daemon_pid = fork();
    if (daemon_pid == 0) {
        int log = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (log >= 0)
            dup2(log, 2);
        if (notify_path[0]) {
            setenv("NOTIFY_SOCKET", notify_path, 1);
            setenv("WATCHDOG_USEC", "200000", 1);
        }
        execl(llmsd, llmsd, "--config", "/dev/null", "--model", model_path, "--socket", sock_path,
              "--state_dir", state_dir, "--threads", "1", "--temperature", "0",
              "--max_frame_bytes", "65536", "--max_contexts_per_app", "3", "--max_tokens",
              "8", "--max_queued_per_app", "2", (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 600; i++) {
        int fd = connect_socket();
        if (fd >= 0) {
            close(fd);
            return 0;
        }
        int st;
        if (waitpid(daemon_pid, &st, WNOHANG) == daemon_pid) {
            daemon_pid = -1;
            return -1;
        }
        usleep(50000);
    }
    return -1;
}

/* Copies the daemon's stderr to ours, to see why it failed. */
static void show_log(void)
{
    FILE *f = fopen(log_path, "r");
    char line[1024];
    while (f && fgets(line, sizeof line, f))
        fputs(line, stderr);
    if (f)
        fclose(f);
}

/* Sends SIGTERM and returns the exit status (or -1). */
static int stop_daemon(void)
{
    if (daemon_pid < 0)
        return -1;
    kill(daemon_pid, SIGTERM);
    int st;
    pid_t pid = daemon_pid;
    daemon_pid = -1;
    if (waitpid(pid, &st, 0) != pid)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

/* Reads exactly len bytes; 0 at a clean EOF before any byte, -1 on error or timeout. */
static int read_all(int fd, void *buf, size_t len)
{
    char *p = buf;
    size_t got = 0;
    while (got < len) {
        struct pollfd pfd = {fd, POLLIN, 0};
        if (poll(&pfd, 1, IO_TIMEOUT_MS) <= 0)
            return -1;
        ssize_t r = read(fd, p + got, len - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r == 0)
            return got == 0 ? 0 : -1;
        if (r < 0)
            return -1;
        got += (size_t)r;
    }
    return 1;
}

static int send_req(int fd, const Llms__Request *req)
{
    uint8_t *buf;
    size_t len;
    if (frame_pack(&req->base, FRAME_DEFAULT_MAX_BYTES, &buf, &len))
        return -1;
    int rc = write_all(fd, buf, len);
    free(buf);
    return rc;
}

/* The next Response, or NULL at EOF / error. */
static Llms__Response *recv_resp(int fd)
{
    uint8_t hdr[FRAME_HEADER_BYTES];
    if (read_all(fd, hdr, sizeof hdr) <= 0)
        return NULL;
    uint32_t len;
    if (frame_peek(hdr, sizeof hdr, FRAME_DEFAULT_MAX_BYTES, &len) != FRAME_NEED_MORE &&
        len != 0)
        return NULL;
    uint8_t *body = malloc(len ? len : 1);
    Llms__Response *r = NULL;
    if (body && read_all(fd, body, len) > 0)
        r = frame_unpack_response(body, len);
    free(body);
    return r;
}

/* Sends req and returns its single final response. */
static Llms__Response *roundtrip(int fd, const Llms__Request *req)
{
    if (send_req(fd, req))
        return NULL;
    return recv_resp(fd);
}

static int error_code(const Llms__Response *r)
{
    return r && r->error ? (int)r->error->code : 0;
}

static Llms__Response *do_bind(int fd, const char *app)
{
    Llms__BindRequest b = LLMS__BIND_REQUEST__INIT;
    b.app_name = (char *)app;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.id = 1;
    req.body_case = LLMS__REQUEST__BODY_BIND;
    req.bind = &b;
    return roundtrip(fd, &req);
}

/* Connects and binds; -1 on failure. */
static int open_app(const char *app)
{
    int fd = connect_socket();
    if (fd < 0)
        return -1;
    Llms__Response *r = do_bind(fd, app);
    bool ok = r && !r->error && r->body_case == LLMS__RESPONSE__BODY_BIND;
    frame_free_response(r);
    if (!ok) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Creates a context; its id is copied to id (33 bytes). */
static int create_context(int fd, const char *system, char id[33])
{
    Llms__CreateContextRequest cc = LLMS__CREATE_CONTEXT_REQUEST__INIT;
    cc.system_prompt = (char *)system;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.id = 2;
    req.body_case = LLMS__REQUEST__BODY_CREATE_CONTEXT;
    req.create_context = &cc;
    Llms__Response *r = roundtrip(fd, &req);
    int rc = -1;
    if (r && !r->error && r->body_case == LLMS__RESPONSE__BODY_CREATE_CONTEXT) {
        snprintf(id, 33, "%s", r->create_context->context_id);
        rc = 0;
    } else {
        rc = -error_code(r) - 1;
    }
    frame_free_response(r);
    return rc;
}

typedef struct call_out {
    int n_chunks;
    int chunk_tokens;
    char text[4096];
    Llms__Response *final; /* caller frees */
} call_out;

/* Runs a Call and collects its stream. 0 when a final response came. */
static int do_call(int fd, uint64_t id, const char *ctx, const char *prompt, call_out *out)
{
    memset(out, 0, sizeof *out);
    Llms__CallRequest c = LLMS__CALL_REQUEST__INIT;
    c.context_id = (char *)ctx;
    c.prompt = (char *)prompt;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.id = id;
    req.body_case = LLMS__REQUEST__BODY_CALL;
    req.call = &c;
    if (send_req(fd, &req))
        return -1;
    for (;;) {
        Llms__Response *r = recv_resp(fd);
        if (!r || r->id != id) {
            frame_free_response(r);
            return -1;
        }
        if (r->final) {
            out->final = r;
            return 0;
        }
        if (r->body_case == LLMS__RESPONSE__BODY_CHUNK) {
            out->n_chunks++;
            out->chunk_tokens += (int)r->chunk->n_tokens;
            strncat(out->text, r->chunk->text, sizeof out->text - strlen(out->text) - 1);
        }
        frame_free_response(r);
    }
}

static Llms__Response *simple(int fd, uint64_t id, Llms__Request__BodyCase body, void *msg)
{
    Llms__Request req = LLMS__REQUEST__INIT;
    req.id = id;
    req.body_case = body;
    /* Every body member of the oneof shares the union's storage. */
    req.bind = msg;
    return roundtrip(fd, &req);
}

/* ---- tests ---- */

static void bind_and_tokenize(void)
{
    int fd = connect_socket();
    CHECK(fd >= 0);
    Llms__Response *r = do_bind(fd, "test.app-1");
    CHECK(r && !r->error && r->body_case == LLMS__RESPONSE__BODY_BIND && r->final);
    CHECK_EQ(r->bind->uid, getuid());
    CHECK(strcmp(r->bind->app_name, "test.app-1") == 0);
    frame_free_response(r);

    r = do_bind(fd, "again");
    CHECK_EQ(error_code(r), LLMS__ERROR_CODE__FAILED_PRECONDITION);
    frame_free_response(r);

    Llms__TokenizeRequest t = LLMS__TOKENIZE_REQUEST__INIT;
    t.text = "tok5tok7";
    r = simple(fd, 9, LLMS__REQUEST__BODY_TOKENIZE, &t);
    CHECK(r && !r->error && r->id == 9 && r->body_case == LLMS__RESPONSE__BODY_TOKENIZE);
    CHECK(r->tokenize->n_tokens >= 1);
    Llms__DetokenizeRequest d = LLMS__DETOKENIZE_REQUEST__INIT;
    int32_t ids[2] = {5, 7};
    d.n_tokens = 2;
    d.tokens = ids;
    frame_free_response(r);
    r = simple(fd, 10, LLMS__REQUEST__BODY_DETOKENIZE, &d);
    CHECK(r && !r->error && r->body_case == LLMS__RESPONSE__BODY_DETOKENIZE);
    CHECK(strstr(r->detokenize->text, "tok5") != NULL);
    frame_free_response(r);
    ids[1] = 100000;
    r = simple(fd, 11, LLMS__REQUEST__BODY_DETOKENIZE, &d);
    CHECK_EQ(error_code(r), LLMS__ERROR_CODE__INVALID_ARGUMENT);
    frame_free_response(r);
    close(fd);
}

static void bad_app_name(void)
{
    int fd = connect_socket();
    CHECK(fd >= 0);
    Llms__Response *r = do_bind(fd, "no spaces/allowed");
    CHECK_EQ(error_code(r), LLMS__ERROR_CODE__INVALID_ARGUMENT);
    frame_free_response(r);
    close(fd);
}

static void call_before_bind(void)
{
    int fd = connect_socket();
    CHECK(fd >= 0);
    Llms__ListContextsRequest l = LLMS__LIST_CONTEXTS_REQUEST__INIT;
    Llms__Response *r = simple(fd, 5, LLMS__REQUEST__BODY_LIST_CONTEXTS, &l);
    CHECK(r && r->id == 5 && r->final);
    CHECK_EQ(error_code(r), LLMS__ERROR_CODE__FAILED_PRECONDITION);
    frame_free_response(r);
    close(fd);
}

static void call_streams_then_result(void)
{
    int fd = open_app("streamer");
    CHECK(fd >= 0);
    char id[33];
    CHECK_EQ(create_context(fd, "be brief", id), 0);
    CHECK_EQ(strlen(id), 32);
    call_out out;
    CHECK_EQ(do_call(fd, 42, id, "tok10 tok11 tok12", &out), 0);
    Llms__Response *f = out.final;
    CHECK_MSG(f && !f->error && f->body_case == LLMS__RESPONSE__BODY_RESULT, "error: %s",
              f && f->error ? f->error->message : "?");
    Llms__CallResult *res = f->result;
    CHECK(res->prompt_tokens > 0);
    /* The daemon runs greedy with max_tokens 8; this model does not pick EOS first. */
    CHECK(res->generated_tokens >= 1 && res->generated_tokens <= 8);
    CHECK_EQ(out.n_chunks, res->generated_tokens);
    CHECK_EQ(out.chunk_tokens, res->generated_tokens);
    CHECK_EQ(res->context_tokens, res->prompt_tokens + res->generated_tokens);
    CHECK(strcmp(out.text, res->text) == 0);
    uint32_t n1 = res->context_tokens;
    frame_free_response(f);

    /* The second turn extends the context. */
    CHECK_EQ(do_call(fd, 43, id, "tok20", &out), 0);
    f = out.final;
    CHECK(f && !f->error && f->body_case == LLMS__RESPONSE__BODY_RESULT);
    CHECK(f->result->context_tokens > n1);
    CHECK(f->result->prompt_tokens < f->result->context_tokens);
    frame_free_response(f);

    Llms__GetContextRequest g = LLMS__GET_CONTEXT_REQUEST__INIT;
    g.context_id = id;
    g.has_include_history = 1;
    g.include_history = 1;
    Llms__Response *r = simple(fd, 44, LLMS__REQUEST__BODY_GET_CONTEXT, &g);
    CHECK(r && !r->error && r->body_case == LLMS__RESPONSE__BODY_CONTEXT);
    CHECK_EQ(r->context->n_history, 5); /* system, user, assistant, user, assistant */
    CHECK(strcmp(r->context->history[3]->content, "tok20") == 0);
    CHECK_EQ(r->context->memory, LLMS__MEMORY_STATE__MEMORY_RESIDENT);
    frame_free_response(r);
    close(fd);
}

static void complete_is_stateless(void)
{
    int fd = open_app("completer");
    CHECK(fd >= 0);
    Llms__CompleteRequest c = LLMS__COMPLETE_REQUEST__INIT;
    c.prompt = "tok3 tok4";
    Llms__Request req = LLMS__REQUEST__INIT;
    req.id = 7;
    req.body_case = LLMS__REQUEST__BODY_COMPLETE;
    req.complete = &c;
    CHECK_EQ(send_req(fd, &req), 0);
    Llms__Response *r;
    while ((r = recv_resp(fd)) && !r->final)
        frame_free_response(r);
    CHECK(r && !r->error && r->body_case == LLMS__RESPONSE__BODY_RESULT);
    CHECK_EQ(r->result->context_tokens, 0);
    frame_free_response(r);
    Llms__ListContextsRequest l = LLMS__LIST_CONTEXTS_REQUEST__INIT;
    r = simple(fd, 8, LLMS__REQUEST__BODY_LIST_CONTEXTS, &l);
    CHECK(r && !r->error && r->body_case == LLMS__RESPONSE__BODY_CONTEXTS);
    CHECK_EQ(r->contexts->n_contexts, 0);
    frame_free_response(r);
    close(fd);
}

static void isolation_not_found(void)
{
    int a = open_app("alice"), b = open_app("bob");
    CHECK(a >= 0 && b >= 0);
    char id[33];
    CHECK_EQ(create_context(a, NULL, id), 0);
    const char *missing = "0123456789abcdef0123456789abcdef";
    const char *ids[2] = {id, missing};
    int codes[2][3];
    for (int k = 0; k < 2; k++) {
        call_out out;
        CHECK_EQ(do_call(b, 50, ids[k], "tok5", &out), 0);
        codes[k][0] = error_code(out.final);
        frame_free_response(out.final);
        Llms__GetContextRequest g = LLMS__GET_CONTEXT_REQUEST__INIT;
        g.context_id = (char *)ids[k];
        Llms__Response *r = simple(b, 51, LLMS__REQUEST__BODY_GET_CONTEXT, &g);
        codes[k][1] = error_code(r);
        frame_free_response(r);
        Llms__DeleteContextRequest d = LLMS__DELETE_CONTEXT_REQUEST__INIT;
        d.context_id = (char *)ids[k];
        r = simple(b, 52, LLMS__REQUEST__BODY_DELETE_CONTEXT, &d);
        codes[k][2] = error_code(r);
        frame_free_response(r);
    }
    for (int i = 0; i < 3; i++) {
        CHECK_EQ(codes[0][i], LLMS__ERROR_CODE__NOT_FOUND);
        CHECK_EQ(codes[1][i], LLMS__ERROR_CODE__NOT_FOUND);
    }
    /* Bob lists nothing; Alice still has her context and can delete it. */
    Llms__ListContextsRequest l = LLMS__LIST_CONTEXTS_REQUEST__INIT;
    Llms__Response *r = simple(b, 53, LLMS__REQUEST__BODY_LIST_CONTEXTS, &l);
    CHECK(r && !r->error && r->contexts->n_contexts == 0);
    frame_free_response(r);
    Llms__DeleteContextRequest d = LLMS__DELETE_CONTEXT_REQUEST__INIT;
    d.context_id = id;
    r = simple(a, 54, LLMS__REQUEST__BODY_DELETE_CONTEXT, &d);
    CHECK(r && !r->error && r->body_case == LLMS__RESPONSE__BODY_OK);
    frame_free_response(r);
    close(a);
    close(b);
}

static void context_limit(void)
{
    int fd = open_app("hoarder");
    CHECK(fd >= 0);
    char id[33];
    for (int i = 0; i < 3; i++)
        CHECK_EQ(create_context(fd, NULL, id), 0);
    CHECK_EQ(create_context(fd, NULL, id), -LLMS__ERROR_CODE__RESOURCE_EXHAUSTED - 1);
    close(fd);
}

/* Sends raw bytes and expects one error frame with id 0, then EOF. */
static void expect_fatal(const void *bytes, size_t len, int code)
{
    int fd = connect_socket();
    CHECK(fd >= 0);
    CHECK_EQ(write_all(fd, bytes, len), 0);
    Llms__Response *r = recv_resp(fd);
    CHECK(r && r->id == 0 && r->final);
    CHECK_EQ(error_code(r), code);
    frame_free_response(r);
    char c;
    struct pollfd pfd = {fd, POLLIN, 0};
    CHECK(poll(&pfd, 1, IO_TIMEOUT_MS) == 1);
    CHECK_EQ(read(fd, &c, 1), 0);
    close(fd);
}

static void malformed_frame_closes(void)
{
    const uint8_t garbage[] = {5, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff};
    expect_fatal(garbage, sizeof garbage, LLMS__ERROR_CODE__MALFORMED_FRAME);
    const uint8_t empty[] = {0, 0, 0, 0};
    expect_fatal(empty, sizeof empty, LLMS__ERROR_CODE__MALFORMED_FRAME);
    /* A well-formed frame that lacks the required id. */
    const uint8_t no_id[] = {2, 0, 0, 0, 0x52, 0x00};
    expect_fatal(no_id, sizeof no_id, LLMS__ERROR_CODE__MALFORMED_FRAME);
}

static void oversized_frame_closes(void)
{
    const uint8_t big[] = {0, 0, 0x10, 0}; /* 1 MiB, the daemon allows 64 KiB */
    expect_fatal(big, sizeof big, LLMS__ERROR_CODE__INVALID_ARGUMENT);
}

static void others_undisturbed(void)
{
    /* A client with a streaming call in flight keeps working while another sends garbage. */
    int fd = open_app("steady");
    CHECK(fd >= 0);
    char id[33];
    CHECK_EQ(create_context(fd, NULL, id), 0);
    int bad = connect_socket();
    CHECK(bad >= 0);
    CHECK_EQ(write_all(bad, "\x03\x00\x00\x00zzz", 7), 0);
    call_out out;
    CHECK_EQ(do_call(fd, 60, id, "tok8", &out), 0);
    CHECK(out.final && !out.final->error);
    frame_free_response(out.final);
    close(bad);
    close(fd);
}

static void admin_status(void)
{
    int fd = open_app("admin-check");
    CHECK(fd >= 0);
    Llms__Empty e = LLMS__EMPTY__INIT;
    Llms__Response *r = simple(fd, 70, LLMS__REQUEST__BODY_STATUS, &e);
    if (getuid() != 0) {
        CHECK_EQ(error_code(r), LLMS__ERROR_CODE__PERMISSION_DENIED);
    } else {
        CHECK(r && !r->error && r->body_case == LLMS__RESPONSE__BODY_STATUS);
        CHECK_EQ(r->status->n_ctx, 256);
        CHECK(r->status->n_connections >= 1);
        frame_free_response(r);
        char id[33];
        call_out out;
        CHECK_EQ(create_context(fd, NULL, id), 0);
        CHECK_EQ(do_call(fd, 71, id, "tok5", &out), 0);
        frame_free_response(out.final);
        Llms__EvictContextRequest ev = LLMS__EVICT_CONTEXT_REQUEST__INIT;
        ev.context_id = id;
        r = simple(fd, 72, LLMS__REQUEST__BODY_EVICT_CONTEXT, &ev);
        CHECK(r && !r->error && r->body_case == LLMS__RESPONSE__BODY_OK);
        frame_free_response(r);
        Llms__GetContextRequest g = LLMS__GET_CONTEXT_REQUEST__INIT;
        g.context_id = id;
        r = simple(fd, 73, LLMS__REQUEST__BODY_GET_CONTEXT, &g);
        CHECK(r && !r->error);
        /* Evicted from memory; its chunks were written when the call returned. */
        CHECK_EQ(r->context->memory, LLMS__MEMORY_STATE__MEMORY_ON_DISK);
        CHECK(r->context->n_chunks > 0 && !r->context->chunks[0]->resident &&
              r->context->chunks[0]->on_disk);
        frame_free_response(r);
        /* The next call brings the KV back. */
        CHECK_EQ(do_call(fd, 74, id, "tok6", &out), 0);
        CHECK(out.final && !out.final->error);
        frame_free_response(out.final);
        r = simple(fd, 75, LLMS__REQUEST__BODY_GET_CONTEXT, &g);
        CHECK(r && !r->error);
        CHECK_EQ(r->context->memory, LLMS__MEMORY_STATE__MEMORY_RESIDENT);
    }
    frame_free_response(r);
    close(fd);
}

static void cancel_call(void)
{
    int fd = open_app("canceller");
    CHECK(fd >= 0);
    char id[33];
    CHECK_EQ(create_context(fd, NULL, id), 0);
    Llms__GenerationParams gp = LLMS__GENERATION_PARAMS__INIT;
    gp.has_max_tokens = 1;
    gp.max_tokens = 200;
    Llms__CallRequest c = LLMS__CALL_REQUEST__INIT;
    c.context_id = id;
    c.prompt = "tok40";
    c.params = &gp;
    Llms__Request call = LLMS__REQUEST__INIT;
    call.id = 90;
    call.body_case = LLMS__REQUEST__BODY_CALL;
    call.call = &c;
    Llms__CancelRequest cr = LLMS__CANCEL_REQUEST__INIT;
    cr.request_id = 90;
    Llms__Request cancel = LLMS__REQUEST__INIT;
    cancel.id = 91;
    cancel.body_case = LLMS__REQUEST__BODY_CANCEL;
    cancel.cancel = &cr;
    CHECK_EQ(send_req(fd, &call), 0);
    CHECK_EQ(send_req(fd, &cancel), 0);
    Llms__Response *call_final = NULL, *cancel_final = NULL;
    while (!call_final || !cancel_final) {
        Llms__Response *r = recv_resp(fd);
        CHECK(r);
        if (r->id == 90 && r->final)
            call_final = r;
        else if (r->id == 91)
            cancel_final = r;
        else
            frame_free_response(r);
    }
    if (error_code(cancel_final) == 0) {
        /* Cancelled while queued (an error) or while generating (a partial result). */
        CHECK(error_code(call_final) == LLMS__ERROR_CODE__CANCELLED ||
              (call_final->body_case == LLMS__RESPONSE__BODY_RESULT &&
               call_final->result->stop_reason == LLMS__STOP_REASON__STOP_CANCELLED));
    } else {
        /* The call had already finished. */
        CHECK_EQ(error_code(cancel_final), LLMS__ERROR_CODE__NOT_FOUND);
        CHECK(call_final->body_case == LLMS__RESPONSE__BODY_RESULT);
    }
    /* Whatever happened, the context's length equals what the call reported. */
    uint32_t expect = call_final->body_case == LLMS__RESPONSE__BODY_RESULT
                          ? call_final->result->context_tokens : 0;
    frame_free_response(call_final);
    frame_free_response(cancel_final);
    Llms__GetContextRequest g = LLMS__GET_CONTEXT_REQUEST__INIT;
    g.context_id = id;
    Llms__Response *r = simple(fd, 92, LLMS__REQUEST__BODY_GET_CONTEXT, &g);
    CHECK(r && !r->error);
    CHECK_EQ(r->context->n_tokens, expect);
    frame_free_response(r);
    close(fd);
}

/* Starts a long Call (not waiting for it) on a fresh context of app; returns the fd. */
static int start_long_call(const char *app, uint64_t rid, char id[33])
{
    int fd = open_app(app);
    if (fd < 0 || create_context(fd, NULL, id))
        return -1;
    Llms__GenerationParams gp = LLMS__GENERATION_PARAMS__INIT;
    gp.has_max_tokens = 1;
    gp.max_tokens = 200;
    Llms__CallRequest c = LLMS__CALL_REQUEST__INIT;
    c.context_id = id;
    c.prompt = "tok50 tok51";
    c.params = &gp;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.id = rid;
    req.body_case = LLMS__REQUEST__BODY_CALL;
    req.call = &c;
    if (send_req(fd, &req)) {
        close(fd);
        return -1;
    }
    return fd;
}

/* n_tokens of a context as its app sees it, or -1. */
static long context_tokens(const char *app, const char *id)
{
    int fd = open_app(app);
    if (fd < 0)
        return -1;
    Llms__GetContextRequest g = LLMS__GET_CONTEXT_REQUEST__INIT;
    g.context_id = (char *)id;
    Llms__Response *r = simple(fd, 100, LLMS__REQUEST__BODY_GET_CONTEXT, &g);
    long n = r && !r->error && r->body_case == LLMS__RESPONSE__BODY_CONTEXT
                 ? (long)r->context->n_tokens : -1;
    frame_free_response(r);
    close(fd);
    return n;
}

static void disconnect_cancels(void)
{
    char id[33];
    int fd = start_long_call("leaver", 110, id);
    CHECK(fd >= 0);
    close(fd);
    /* The daemon keeps serving; the context holds a whole number of turns (0 or 1). */
    int other = open_app("leaver");
    CHECK(other >= 0);
    char id2[33];
    CHECK_EQ(create_context(other, NULL, id2), 0);
    call_out out;
    CHECK_EQ(do_call(other, 111, id2, "tok60", &out), 0);
    CHECK(out.final && !out.final->error);
    frame_free_response(out.final);
    close(other);
    CHECK(context_tokens("leaver", id) >= 0);
}

static void sigterm_persists_partial_turns(void)
{
    char id[33];
    int fd = start_long_call("stopper", 120, id);
    CHECK(fd >= 0);
    /* Wait for the first streamed token, so the call is running. */
    Llms__Response *r = recv_resp(fd);
    CHECK(r && r->id == 120);
    bool final = r->final;
    frame_free_response(r);
    CHECK_EQ(stop_daemon(), 0);
    /* The daemon answered the call before exiting: with a result (cancelled or done). */
    uint32_t n = 0;
    bool got = false;
    while (!final && (r = recv_resp(fd))) {
        if (r->final) {
            CHECK(r->body_case == LLMS__RESPONSE__BODY_RESULT);
            n = r->result->context_tokens;
            got = true;
            final = true;
        }
        frame_free_response(r);
    }
    close(fd);
    CHECK_EQ(start_daemon(), 0);
    if (got)
        CHECK_EQ(context_tokens("stopper", id), n);
}

/* Sends three long calls in one write on fresh contexts; counts the refusals and
 * results among the finals. -1 on a transport failure. */
static int send_three_calls(int fd, uint64_t first_id, int *exhausted, int *results)
{
    char ids[3][33];
    uint8_t *frames[3];
    size_t lens[3], total = 0;
    for (int i = 0; i < 3; i++) {
        if (create_context(fd, NULL, ids[i]) != 0)
            return -1;
        Llms__GenerationParams gp = LLMS__GENERATION_PARAMS__INIT;
        gp.has_max_tokens = 1;
        gp.max_tokens = 100;
        Llms__CallRequest c = LLMS__CALL_REQUEST__INIT;
        c.context_id = ids[i];
        c.prompt = "tok50 tok51";
        c.params = &gp;
        Llms__Request req = LLMS__REQUEST__INIT;
        req.id = first_id + (uint64_t)i;
        req.body_case = LLMS__REQUEST__BODY_CALL;
        req.call = &c;
        if (frame_pack(&req.base, FRAME_DEFAULT_MAX_BYTES, &frames[i], &lens[i]) != 0)
            return -1;
        total += lens[i];
    }
    uint8_t *all = malloc(total);
    if (!all)
        return -1;
    for (size_t i = 0, off = 0; i < 3; off += lens[i], i++) {
        memcpy(all + off, frames[i], lens[i]);
        free(frames[i]);
    }
    int rc = write_all(fd, all, total);
    free(all);
    if (rc != 0)
        return -1;
    int finals = 0;
    *exhausted = *results = 0;
    while (finals < 3) {
        Llms__Response *r = recv_resp(fd);
        if (!r)
            return -1;
        if (r->final) {
            finals++;
            *exhausted += error_code(r) == LLMS__ERROR_CODE__RESOURCE_EXHAUSTED;
            *results += r->body_case == LLMS__RESPONSE__BODY_RESULT;
        }
        frame_free_response(r);
    }
    return 0;
}

static void queue_limit(void)
{
    /* With max_queued_per_app 2, the third of three calls sent together is refused while
     * the first two are queued or running. The worker admits calls as it reads them, so
     * if the first call finishes before the third is read (the loop thread lost its CPU
     * that long) all three run: the round is repeated, and the limit must show within a
     * few rounds. Each round is a new app, as each uses up max_contexts_per_app. */
    int exhausted = 0, results = 0;
    for (int round = 0; round < 5 && exhausted == 0; round++) {
        char app[32];
        snprintf(app, sizeof app, "queuer%d", round);
        int fd = open_app(app);
        CHECK(fd >= 0);
        int rc = send_three_calls(fd, 130, &exhausted, &results);
        close(fd);
        CHECK_EQ(rc, 0);
        CHECK_EQ(exhausted + results, 3);
    }
    CHECK_EQ(exhausted, 1);
    CHECK_EQ(results, 2);
}

/* Reads datagrams from the fake notify socket until one contains want (or a timeout). */
static int notified(int fd, const char *want)
{
    char msg[4096];
    for (;;) {
        struct pollfd pfd = {fd, POLLIN, 0};
        if (poll(&pfd, 1, IO_TIMEOUT_MS) != 1)
            return 0;
        ssize_t n = recv(fd, msg, sizeof msg - 1, 0);
        if (n < 0)
            return 0;
        msg[n] = '\0';
        if (strstr(msg, want))
            return 1;
    }
}

static void sd_notify_protocol(void)
{
    /* The daemon under test stops; one under a fake systemd takes its place. */
    CHECK_EQ(stop_daemon(), 0);
    snprintf(notify_path, sizeof notify_path, "%s/notify", test_tmpdir());
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", notify_path);
    CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
    int started = start_daemon();
    notify_path[0] = '\0';
    CHECK_EQ(started, 0);
    CHECK(notified(fd, "READY=1"));
    CHECK(notified(fd, "STATUS=serving"));
    CHECK(notified(fd, "WATCHDOG=1"));
    CHECK(notified(fd, "WATCHDOG=1"));
    pid_t pid = daemon_pid;
    kill(pid, SIGTERM);
    CHECK(notified(fd, "STOPPING=1"));
    int st;
    daemon_pid = -1;
    CHECK_EQ(waitpid(pid, &st, 0), pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    close(fd);
    CHECK_EQ(start_daemon(), 0);
}

static int call_text(int fd, uint64_t rid, const char *id, const char *prompt, char *text,
                     size_t cap, uint32_t *n_ctx)
{
    call_out out;
    if (do_call(fd, rid, id, prompt, &out) || !out.final || out.final->error) {
        frame_free_response(out.final);
        return -1;
    }
    snprintf(text, cap, "%s", out.final->result->text);
    *n_ctx = out.final->result->context_tokens;
    frame_free_response(out.final);
    return 0;
}

static void kill9_keeps_finished_turns(void)
{
    int fd = open_app("crashy");
    CHECK(fd >= 0);
    char id[33], text[4096];
    uint32_t n;
    CHECK_EQ(create_context(fd, NULL, id), 0);
    CHECK_EQ(call_text(fd, 140, id, "tok70", text, sizeof text, &n), 0);
    close(fd);
    kill(daemon_pid, SIGKILL);
    int st;
    CHECK_EQ(waitpid(daemon_pid, &st, 0), daemon_pid);
    daemon_pid = -1;
    /* The socket file is left behind; the next daemon replaces it. */
    CHECK_EQ(start_daemon(), 0);
    CHECK_EQ(context_tokens("crashy", id), n);
    fd = open_app("crashy");
    CHECK(fd >= 0);
    uint32_t n2;
    CHECK_EQ(call_text(fd, 141, id, "tok71", text, sizeof text, &n2), 0);
    CHECK(n2 > n);
    close(fd);
}

static void restart_keeps_contexts(void)
{
    /* Two contexts get the same first turn; one gets its second turn before the
     * restart, the other after: greedy replies must be the same. */
    int fd = open_app("durable");
    CHECK(fd >= 0);
    char a[33], b[33], ta[4096], tb[4096], a2[4096], b2[4096];
    uint32_t na, nb, na2, nb2;
    CHECK_EQ(create_context(fd, "sys tok9", a), 0);
    CHECK_EQ(create_context(fd, "sys tok9", b), 0);
    CHECK_EQ(call_text(fd, 80, a, "tok30 tok31", ta, sizeof ta, &na), 0);
    CHECK_EQ(call_text(fd, 81, b, "tok30 tok31", tb, sizeof tb, &nb), 0);
    CHECK(strcmp(ta, tb) == 0);
    CHECK_EQ(na, nb);
    CHECK_EQ(call_text(fd, 82, a, "tok32 tok33", a2, sizeof a2, &na2), 0);
    close(fd);

    CHECK_EQ(stop_daemon(), 0);
    CHECK_EQ(start_daemon(), 0);

    fd = open_app("durable");
    CHECK(fd >= 0);
    Llms__ListContextsRequest l = LLMS__LIST_CONTEXTS_REQUEST__INIT;
    Llms__Response *r = simple(fd, 83, LLMS__REQUEST__BODY_LIST_CONTEXTS, &l);
    CHECK(r && !r->error && r->contexts->n_contexts == 2);
    CHECK(strcmp(r->contexts->contexts[0]->context_id, a) == 0);
    CHECK(strcmp(r->contexts->contexts[1]->context_id, b) == 0);
    CHECK_EQ(r->contexts->contexts[0]->n_tokens, na2);
    CHECK_EQ(r->contexts->contexts[1]->n_tokens, nb);
    CHECK_EQ(r->contexts->contexts[1]->memory, LLMS__MEMORY_STATE__MEMORY_ON_DISK);
    frame_free_response(r);
    CHECK_EQ(call_text(fd, 84, b, "tok32 tok33", b2, sizeof b2, &nb2), 0);
    CHECK_MSG(strcmp(a2, b2) == 0, "'%s' != '%s'", a2, b2);
    CHECK_EQ(na2, nb2);
    close(fd);
}

/* llmsd serves a mixture of experts (qwen3moe) as any model: a daemon of its own, on a
 * state directory of its own, streams a call's tokens. Runs last: the daemon it leaves
 * is the one main stops. */
static void serves_a_mixture_of_experts(void)
{
    CHECK_EQ(stop_daemon(), 0);
    snprintf(model_path, sizeof model_path, "%s/moe.gguf", test_tmpdir());
    snprintf(state_dir, sizeof state_dir, "%s/state-moe", test_tmpdir());
    modelgen_params p = {
        .arch = "qwen3moe", .dim = 32, .n_layer = 2, .n_head = 2, .n_head_kv = 1, .n_ff = 64,
        .n_ctx = 256, .type = QTYPE_F32, .seed = 7, .n_vocab = 300, .n_threads = 1,
        .n_expert = 4, .n_expert_used = 2, .n_ff_exp = 32,
    };
    char err[ERR_MAX];
    CHECK_MSG(modelgen_write(&p, model_path, err) == 0, "modelgen: %s", err);
    if (start_daemon() != 0) {
        show_log();
        CHECK_MSG(false, "llmsd did not start on a qwen3moe model");
    }
    int fd = open_app("experts");
    CHECK(fd >= 0);
    char id[33];
    CHECK_EQ(create_context(fd, "be brief", id), 0);
    call_out out;
    CHECK_EQ(do_call(fd, 90, id, "tok10 tok11 tok12", &out), 0);
    Llms__Response *f = out.final;
    CHECK_MSG(f && !f->error && f->body_case == LLMS__RESPONSE__BODY_RESULT, "error: %s",
              f && f->error ? f->error->message : "?");
    CHECK(f->result->generated_tokens >= 1 && f->result->generated_tokens <= 8);
    CHECK_EQ(out.n_chunks, f->result->generated_tokens);
    frame_free_response(f);
    close(fd);
}

int main(int argc, char **argv)
{
    (void)argc;
    char self[1024];
    snprintf(self, sizeof self, "%s", argv[0]);
    /* build/tests/daemon/test_server -> build/llmsd */
    snprintf(llmsd, sizeof llmsd, "%s/../../llmsd", dirname(self));
    snprintf(sock_path, sizeof sock_path, "%s/run/llmsd.sock", test_tmpdir());
    snprintf(state_dir, sizeof state_dir, "%s/state", test_tmpdir());
    snprintf(log_path, sizeof log_path, "%s/llmsd.log", test_tmpdir());
    signal(SIGPIPE, SIG_IGN);
    if (access(llmsd, X_OK) != 0 || make_model() || start_daemon()) {
        fprintf(stderr, "cannot start %s\n", llmsd);
        show_log();
        test_fail(__FILE__, __LINE__, "daemon did not start");
        return test_finish();
    }
    RUN(bind_and_tokenize);
    RUN(bad_app_name);
    RUN(call_before_bind);
    RUN(call_streams_then_result);
    RUN(complete_is_stateless);
    RUN(isolation_not_found);
    RUN(context_limit);
    RUN(malformed_frame_closes);
    RUN(oversized_frame_closes);
    RUN(others_undisturbed);
    RUN(admin_status);
    RUN(cancel_call);
    RUN(queue_limit);
    RUN(disconnect_cancels);
    RUN(sigterm_persists_partial_turns);
    RUN(restart_keeps_contexts);
    RUN(kill9_keeps_finished_turns);
    RUN(sd_notify_protocol);
    RUN(serves_a_mixture_of_experts);
    int st = stop_daemon();
    if (st != 0) {
        test_fail(__FILE__, __LINE__, "llmsd exited with %d on SIGTERM", st);
        show_log();
    }
    return test_finish();
}
