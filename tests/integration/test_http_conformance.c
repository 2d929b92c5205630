/*
 * The HTTP gateway's conformance with HTTP and the OpenAI API where clients other than
 * the SDKs' happy paths look: the exact shape of a chat stream (what every chunk
 * carries, the role first, the empty final delta, the usage chunk), HEAD where GET is
 * served (health checks such as `wget --spider`), CORS for browser clients on the
 * token-guarded TCP listener, and a stream or reply in flight when the daemon is
 * stopped, which must still end as HTTP and SSE say, not be cut off.
 */
#include <arpa/inet.h>
#include <json-c/json.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"
#include "tests/integration/httpc.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/support/test.h"

#define TOKEN "conformance-token-0123456789"
#define AUTH "Authorization: Bearer " TOKEN "\r\n"

static char llmsd_path[1024], model_path[1024], slow_model_path[1024];
static llmsd_proc d;
static int up;
static char hsock[700];
static int port;

static int start(void)
{
    char tokens[700], extra[2048];
    proc_fmt(tokens, sizeof tokens, "%s/tokens", test_tmpdir());
    FILE *f = fopen(tokens, "w");
    if (!f)
        return -1;
    fprintf(f, "%s %u confapp\n", TOKEN, (unsigned)getuid());
    fclose(f);
    chmod(tokens, 0600);
    if ((port = httpc_free_port()) < 0)
        return -1;
    proc_fmt(hsock, sizeof hsock, "%s/h.sock", test_tmpdir());
    proc_fmt(extra, sizeof extra, "http_socket = %s\nhttp_listen = 127.0.0.1:%d\n"
                                  "http_tokens_file = %s\n", hsock, port, tokens);
    return proc_start(&d, llmsd_path, "conf", model_path, extra);
}

#define NEED_DAEMON()                                                          \
    do {                                                                       \
        if (!llmsd_path[0] || !model_path[0])                                  \
            SKIP("llmsd or its model is missing");                             \
        if (!up)                                                               \
            up = start() == 0 ? 1 : -1;                                        \
        CHECK_MSG(up == 1, "llmsd did not start");                             \
    } while (0)

/* The value of header name in a reply's head (its first line excluded), copied into out;
 * NULL when absent. */
static const char *header(const httpc_reply *r, const char *name, char *out, size_t cap)
{
    size_t n = strlen(name);
    for (const char *l = strstr(r->head, "\r\n"); l; l = strstr(l, "\r\n")) {
        l += 2;
        if (strncasecmp(l, name, n) == 0 && l[n] == ':') {
            const char *v = l + n + 1;
            v += strspn(v, " ");
            size_t len = strcspn(v, "\r\n");
            snprintf(out, cap, "%.*s", (int)len, v);
            return out;
        }
    }
    return NULL;
}

/* Every chunk of a chat stream is a chat.completion.chunk of the same id, created and
 * model; the first delta is the assistant's role; the finish_reason comes once, with an
 * empty delta; with include_usage a last chunk has no choices and the usage; the stream
 * ends with [DONE]. Non-streamed, the choice has its index and a null logprobs. */
static void chat_stream_has_openai_shape(void)
{
    NEED_DAEMON();
    httpc_reply r;
    CHECK(httpc_do(hsock, 0, "POST", "/v1/chat/completions", NULL,
                   "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":6,"
                   "\"temperature\":0,\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
                   &r) == 0);
    CHECK_EQ(r.status, 200);
    char v[256];
    CHECK(header(&r, "Content-Type", v, sizeof v) && strcmp(v, "text/event-stream") == 0);
    CHECK(header(&r, "Cache-Control", v, sizeof v) && strcmp(v, "no-cache") == 0);
    /* each event ends with a blank line: a client splits the stream there */
    CHECK_MSG(!strstr(r.body, "}\ndata: "), "events not separated by a blank line: %.300s",
              r.body);
    char id[128] = "", model[128] = "";
    long long created = -1;
    int n = 0, finishes = 0, usage_at = -1, done_at = -1, finish_at = -1;
    char *save;
    for (char *line = strtok_r(r.body, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        CHECK_MSG(strncmp(line, "data: ", 6) == 0, "not an SSE data line: %s", line);
        if (strcmp(line + 6, "[DONE]") == 0) {
            done_at = n++;
            continue;
        }
        json_object *o = json_tokener_parse(line + 6);
        CHECK_MSG(o, "not JSON: %s", line);
        CHECK(strcmp(httpc_jstr(o, "object"), "chat.completion.chunk") == 0);
        if (!id[0]) {
            snprintf(id, sizeof id, "%s", httpc_jstr(o, "id"));
            snprintf(model, sizeof model, "%s", httpc_jstr(o, "model"));
            created = atoll(httpc_jstr(o, "created"));
        }
        CHECK(strcmp(httpc_jstr(o, "id"), id) == 0 && strcmp(httpc_jstr(o, "model"), model) == 0);
        CHECK_EQ(atoll(httpc_jstr(o, "created")), created);
        json_object *choices;
        CHECK(json_object_object_get_ex(o, "choices", &choices));
        if (json_object_array_length(choices) == 0) {
            CHECK(httpc_jstr(o, "usage.total_tokens"));
            usage_at = n++;
            json_object_put(o);
            continue;
        }
        CHECK(strcmp(httpc_jstr(o, "choices.0.index"), "0") == 0);
        if (n == 0)
            CHECK(httpc_jstr(o, "choices.0.delta.role") &&
                  strcmp(httpc_jstr(o, "choices.0.delta.role"), "assistant") == 0);
        const char *fin = httpc_jstr(o, "choices.0.finish_reason");
        if (fin) {
            json_object *delta;
            CHECK(json_object_object_get_ex(json_object_array_get_idx(choices, 0), "delta", &delta));
            CHECK_EQ(json_object_object_length(delta), 0);
            finishes++;
            finish_at = n;
        }
        n++;
        json_object_put(o);
    }
    CHECK(strncmp(id, "chatcmpl-", 9) == 0 && strcmp(model, "conf") == 0 && created > 0);
    CHECK_EQ(finishes, 1);
    CHECK_MSG(finish_at >= 0 && usage_at == finish_at + 1 && done_at == usage_at + 1 &&
              done_at == n - 1, "finish %d usage %d done %d of %d", finish_at, usage_at, done_at, n);
    httpc_reply_free(&r);
    int st;
    json_object *o = httpc_post_json(hsock, "/v1/chat/completions",
                                     "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                                     "\"max_tokens\":3}", &st);
    CHECK(o && st == 200);
    json_object *c = json_object_array_get_idx(
        json_object_object_get(o, "choices"), 0), *lp;
    CHECK(c && json_object_object_get_ex(c, "logprobs", &lp) && lp == NULL);
    CHECK(strcmp(httpc_jstr(o, "choices.0.index"), "0") == 0);
    CHECK(strcmp(httpc_jstr(o, "choices.0.message.role"), "assistant") == 0);
    json_object_put(o);
}

/* A piece the daemon holds back (it may begin a stop string) is no event: the stream
 * carried empty "text" events, one per held-back token, which OpenAI never sends. */
static void no_empty_text_events(void)
{
    NEED_DAEMON();
    int st;
    json_object *o = httpc_post_json(hsock, "/v1/completions",
                                     "{\"prompt\":\"hi\",\"max_tokens\":12,\"temperature\":0}",
                                     &st);
    CHECK(o && st == 200);
    char first[32];
    const char *text = httpc_jstr(o, "choices.0.text");
    CHECK_MSG(text && strncmp(text, "tok", 3) == 0, "%s", text ? text : "");
    snprintf(first, sizeof first, "tok%d", atoi(text + 3));
    json_object_put(o);
    /* every occurrence of the first piece may begin the stop string, until the next */
    char body[256];
    snprintf(body, sizeof body, "{\"prompt\":\"hi\",\"max_tokens\":12,\"temperature\":0,"
             "\"stream\":true,\"stop\":\"%s~\"}", first);
    httpc_reply r;
    CHECK(httpc_do(hsock, 0, "POST", "/v1/completions", NULL, body, &r) == 0);
    CHECK_EQ(r.status, 200);
    int events = 0, empty = 0;
    char *save;
    for (char *line = strtok_r(r.body, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (strncmp(line, "data: {", 7) != 0)
            continue;
        json_object *e = json_tokener_parse(line + 6);
        CHECK(e);
        if (!httpc_jstr(e, "choices.0.finish_reason")) {
            events++;
            empty += !httpc_jstr(e, "choices.0.text") || !httpc_jstr(e, "choices.0.text")[0];
        }
        json_object_put(e);
    }
    httpc_reply_free(&r);
    CHECK_MSG(events > 0 && empty == 0, "%d of %d text events empty (stop '%s~')", empty,
              events, first);
}

/* HEAD is answered wherever GET is (RFC 9110 9.3.2: the same status and headers, no
 * body), as health checks like `wget --spider` and `curl -I` send it. */
static void head_is_served_where_get_is(void)
{
    NEED_DAEMON();
    static const char *const paths[] = {"/health", "/v1/models", "/v1/models/conf"};
    char v[64], want[64];
    for (size_t i = 0; i < sizeof paths / sizeof *paths; i++) {
        httpc_reply get, head;
        CHECK(httpc_do(hsock, 0, "GET", paths[i], NULL, NULL, &get) == 0);
        CHECK(httpc_do(hsock, 0, "HEAD", paths[i], NULL, NULL, &head) == 0);
        CHECK_MSG(head.status == 200 && head.body_len == 0, "HEAD %s: %d %s", paths[i],
                  head.status, head.body);
        CHECK(header(&get, "Content-Length", want, sizeof want));
        CHECK(header(&head, "Content-Length", v, sizeof v) && strcmp(v, want) == 0);
        httpc_reply_free(&get);
        httpc_reply_free(&head);
    }
    /* On TCP, as GET, it needs the token. */
    httpc_reply r;
    CHECK(httpc_do(NULL, port, "HEAD", "/v1/models", NULL, NULL, &r) == 0);
    CHECK_EQ(r.status, 401);
    httpc_reply_free(&r);
    CHECK(httpc_do(NULL, port, "HEAD", "/v1/models", AUTH, NULL, &r) == 0);
    CHECK_EQ(r.status, 200);
    httpc_reply_free(&r);
    /* A POST route still takes POST only, and a GET route's 405 names HEAD too. */
    CHECK(httpc_do(hsock, 0, "HEAD", "/v1/chat/completions", NULL, NULL, &r) == 0);
    CHECK_EQ(r.status, 405);
    httpc_reply_free(&r);
    CHECK(httpc_do(hsock, 0, "POST", "/health", NULL, "{}", &r) == 0);
    CHECK(r.status == 405 && header(&r, "Allow", v, sizeof v) && strstr(v, "HEAD"));
    httpc_reply_free(&r);
}

/* A browser client on another origin first sends a preflight OPTIONS, which carries no
 * Authorization, then its request with an Origin: the preflight is answered without a
 * token and every answer to a request with an Origin says that any origin may read it.
 * That gives a page nothing without a token (no cookie or other ambient credential
 * authenticates anyone here), and the token is what OpenAI's own API asks of browsers. */
static void cors_lets_browser_clients_in(void)
{
    NEED_DAEMON();
    httpc_reply r;
    char v[512];
    CHECK(httpc_do(NULL, port, "OPTIONS", "/v1/chat/completions",
                   "Origin: http://localhost:3000\r\nAccess-Control-Request-Method: POST\r\n"
                   "Access-Control-Request-Headers: authorization,content-type,x-stainless-lang\r\n",
                   NULL, &r) == 0);
    CHECK_MSG(r.status == 200 && r.body_len == 0, "%d %s", r.status, r.body);
    CHECK(header(&r, "Access-Control-Allow-Origin", v, sizeof v) && strcmp(v, "*") == 0);
    CHECK(header(&r, "Access-Control-Allow-Methods", v, sizeof v) && strstr(v, "POST"));
    CHECK_MSG(header(&r, "Access-Control-Allow-Headers", v, sizeof v) &&
              strcasestr(v, "authorization") && strcasestr(v, "x-stainless-lang"), "%s", r.head);
    httpc_reply_free(&r);
    CHECK(httpc_do(NULL, port, "OPTIONS", "/v1/models", "Origin: http://localhost:3000\r\n"
                   "Access-Control-Request-Method: GET\r\n", NULL, &r) == 0);
    CHECK(r.status == 200 && header(&r, "Access-Control-Allow-Methods", v, sizeof v) &&
          strstr(v, "GET"));
    httpc_reply_free(&r);
    /* The request itself, answered or refused, is readable by the page. */
    CHECK(httpc_do(NULL, port, "POST", "/v1/completions",
                   "Origin: http://localhost:3000\r\n" AUTH,
                   "{\"prompt\":\"a b\",\"max_tokens\":2}", &r) == 0);
    CHECK(r.status == 200 && header(&r, "Access-Control-Allow-Origin", v, sizeof v) &&
          strcmp(v, "*") == 0);
    httpc_reply_free(&r);
    CHECK(httpc_do(NULL, port, "POST", "/v1/completions",
                   "Origin: http://localhost:3000\r\nAuthorization: Bearer wrong-token-000000\r\n",
                   "{\"prompt\":\"a b\",\"max_tokens\":2}", &r) == 0);
    CHECK(r.status == 401 && header(&r, "Access-Control-Allow-Origin", v, sizeof v));
    httpc_reply_free(&r);
    /* Without a token the preflight opens nothing. */
    CHECK(httpc_do(NULL, port, "GET", "/v1/models", "Origin: http://localhost:3000\r\n", NULL,
                   &r) == 0);
    CHECK_EQ(r.status, 401);
    httpc_reply_free(&r);
    /* Requests without an Origin (every non-browser client) are answered as before. */
    CHECK(httpc_do(NULL, port, "GET", "/v1/models", AUTH, NULL, &r) == 0);
    CHECK(r.status == 200 && !header(&r, "Access-Control-Allow-Origin", v, sizeof v));
    httpc_reply_free(&r);
}

#define STOP_ROUNDS 4 /* daemons stopped: whether the last answers leave is a race */

/* The daemon stopped (SIGTERM) while a stream and a whole reply are in flight: both are
 * answered before it exits, the stream ending as SSE and chunked encoding say (its last
 * chunk with a finish_reason or an error, then [DONE]), the reply whole, not cut off. */
static void stop_mid_stream_ends_the_stream(void)
{
    if (!llmsd_path[0] || !slow_model_path[0])
        SKIP("llmsd or its model is missing");
    char sock[700], extra[800];
    proc_fmt(sock, sizeof sock, "%s/stop-h.sock", test_tmpdir());
    proc_fmt(extra, sizeof extra, "http_socket = %s\nn_ctx = 4096\n", sock);
    int cut = 0;
    for (int round = 0; round < STOP_ROUNDS; round++) {
        llmsd_proc s;
        CHECK(proc_start(&s, llmsd_path, "stop", slow_model_path, extra) == 0);
        int fds[2]; /* [0] streamed, [1] whole */
        for (int i = 0; i < 2; i++) {
            char body[256];
            snprintf(body, sizeof body, "{\"prompt\":\"go on\",\"max_tokens\":4000,"
                                        "\"temperature\":0,\"stream\":%s}", i ? "false" : "true");
            fds[i] = httpc_connect(sock, 0);
            CHECK(fds[i] >= 0);
            CHECK(httpc_send(fds[i], "POST", "/v1/completions", NULL, body, strlen(body)) == 0);
        }
        char peek[64];
        CHECK(recv(fds[0], peek, sizeof peek, MSG_PEEK) > 0); /* the stream has begun */
        kill(s.pid, SIGTERM);
        httpc_reply r;
        int rc = httpc_read(fds[0], &r);
        const char *tail = rc == 0 && r.body_len >= 14 ? r.body + r.body_len - 14 : "";
        if (strcmp(tail, "data: [DONE]\n\n") != 0 ||
            !(strstr(r.body, "\"finish_reason\":\"shutdown\"") || strstr(r.body, "\"error\""))) {
            fprintf(stderr, "   round %d: the stream ends ...%s\n", round,
                    rc ? "(no reply)" : r.body_len > 160 ? r.body + r.body_len - 160 : r.body);
            cut++;
        }
        if (rc == 0)
            httpc_reply_free(&r);
        rc = httpc_read(fds[1], &r);
        json_object *o = rc == 0 ? json_tokener_parse(r.body) : NULL;
        if (!o || (r.status != 200 && !httpc_jstr(o, "error.message"))) {
            fprintf(stderr, "   round %d: the reply is %d '%s'\n", round, r.status,
                    rc ? "" : r.body);
            cut++;
        }
        json_object_put(o);
        if (rc == 0)
            httpc_reply_free(&r);
        close(fds[0]);
        close(fds[1]);
        CHECK_EQ(proc_stop(&s, 0), 0); /* signalled already: its exit is waited for */
    }
    CHECK_MSG(cut == 0, "%d of %d answers cut off by the stop", cut, 2 * STOP_ROUNDS);
}

int main(int argc, char **argv)
{
    (void)argc;
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    modelgen_params mp = {
        .arch = "llama", .dim = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 128,
        .n_ctx = 512, .type = QTYPE_F32, .seed = 5, .n_vocab = 300, .n_threads = 1,
    };
    proc_generate_model(model_path, sizeof model_path, "conf.gguf", &mp);
    /* slow enough that a generation of thousands of tokens is still running at the stop */
    modelgen_params slow = mp;
    slow.dim = 256;
    slow.n_layer = 4;
    slow.n_head = 8;
    slow.n_head_kv = 4;
    slow.n_ff = 768;
    slow.n_ctx = 4096;
    slow.type = QTYPE_Q8_0;
    proc_generate_model(slow_model_path, sizeof slow_model_path, "stop.gguf", &slow);
    RUN(chat_stream_has_openai_shape);
    RUN(no_empty_text_events);
    RUN(head_is_served_where_get_is);
    RUN(cors_lets_browser_clients_in);
    RUN(stop_mid_stream_ends_the_stream);
    if (up == 1)
        proc_stop(&d, SIGTERM);
    return test_finish();
}
