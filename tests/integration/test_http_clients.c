/*
 * The HTTP gateway through real clients against a real llmsd of this build: curl (on the
 * Unix socket and on TCP with a bearer token) and the official openai npm package
 * (tests/integration/openai_client.mjs, installed into BUILD/npm-openai on first use).
 * Each skips with a message when its client is missing or cannot be installed.
 */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"
#include "tests/integration/httpc.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/support/test.h"

#define TOKEN "curl-test-token-42"
#define BODY_LIMIT 4096

static char llmsd_path[1024], model_path[1024], build_dir[1024];
static llmsd_proc d;
static int up;
static char hsock[700], tokens[700];
static int port;

static int start(void)
{
    char extra[2048];
    proc_fmt(tokens, sizeof tokens, "%s/tokens", test_tmpdir());
    FILE *f = fopen(tokens, "w");
    if (!f)
        return -1;
    fprintf(f, "%s %u curlapp\n", TOKEN, (unsigned)getuid());
    fclose(f);
    chmod(tokens, 0600);
    if ((port = httpc_free_port()) < 0)
        return -1;
    proc_fmt(hsock, sizeof hsock, "%s/h.sock", test_tmpdir());
    proc_fmt(extra, sizeof extra,
             "http_socket = %s\nhttp_listen = 127.0.0.1:%d\nhttp_tokens_file = %s\n"
             "http_max_body_bytes = %d\n",
             hsock, port, tokens, BODY_LIMIT);
    return proc_start(&d, llmsd_path, "clients", model_path, extra);
}

#define NEED_DAEMON()                                                          \
    do {                                                                       \
        if (!llmsd_path[0] || !model_path[0])                                  \
            SKIP("llmsd or its model is missing");                             \
        if (!up)                                                               \
            up = start() == 0 ? 1 : -1;                                        \
        CHECK_MSG(up == 1, "llmsd did not start");                             \
    } while (0)

static bool have(const char *prog)
{
    char cmd[256], out[256];
    proc_fmt(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", prog);
    return test_run_capture(cmd, out, sizeof out) == 0;
}

/* curl on the Unix socket (or TCP with args of its own): the body, then the status
 * code on the last line. */
static int curl(char *out, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int curl(char *out, size_t cap, const char *fmt, ...)
{
    char args[4096], cmd[5000];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    proc_fmt(cmd, sizeof cmd, "curl -sS -N --max-time 60 -w '\\n%%{http_code}' %s", args);
    int rc = test_run_capture(cmd, out, cap);
    char *last = strrchr(out, '\n');
    return rc == 0 && last ? atoi(last + 1) : -1;
}

static void curl_chat_completions_models_embeddings(void)
{
    if (!have("curl"))
        SKIP("curl is not installed (scripts/install-deps.sh installs it)");
    NEED_DAEMON();
    static char out[1 << 16];
    CHECK_EQ(curl(out, sizeof out, "--unix-socket %s http://llmsd/v1/models", hsock), 200);
    CHECK(strstr(out, "\"id\":\"clients\""));
    CHECK_EQ(curl(out, sizeof out, "--unix-socket %s http://llmsd/health", hsock), 200);
    CHECK_EQ(curl(out, sizeof out,
                  "--unix-socket %s http://llmsd/v1/chat/completions -H 'Content-Type: "
                  "application/json' -d '{\"model\":\"clients\",\"messages\":[{\"role\":\"user\","
                  "\"content\":\"hi\"}],\"max_tokens\":6,\"temperature\":0}'", hsock), 200);
    CHECK_MSG(strstr(out, "\"object\":\"chat.completion\"") && strstr(out, "\"usage\""), "%s", out);
    CHECK_EQ(curl(out, sizeof out,
                  "--unix-socket %s http://llmsd/v1/chat/completions -d '{\"messages\":[{\"role\":"
                  "\"user\",\"content\":\"hi\"}],\"max_tokens\":6,\"stream\":true}'", hsock), 200);
    CHECK_MSG(strstr(out, "data: {") && strstr(out, "\"chat.completion.chunk\"") &&
              strstr(out, "data: [DONE]\n\n"), "%s", out);
    CHECK_EQ(curl(out, sizeof out,
                  "--unix-socket %s http://llmsd/v1/completions -d '{\"prompt\":\"a b c\","
                  "\"max_tokens\":4,\"seed\":7,\"stop\":[\"zz\"]}'", hsock), 200);
    CHECK(strstr(out, "\"text_completion\""));
    CHECK_EQ(curl(out, sizeof out,
                  "--unix-socket %s http://llmsd/v1/embeddings -d '{\"input\":[\"x\",\"y\"]}'",
                  hsock), 200);
    CHECK(strstr(out, "\"index\":1") && strstr(out, "\"embedding\":["));
    CHECK_EQ(curl(out, sizeof out,
                  "--unix-socket %s http://llmsd/v1/embeddings -d '{\"input\":\"x\","
                  "\"encoding_format\":\"base64\"}'", hsock), 200);
    CHECK(strstr(out, "\"embedding\":\""));
    /* The generated model has no yes/no answer tokens: the reranker says so. */
    CHECK_EQ(curl(out, sizeof out,
                  "--unix-socket %s http://llmsd/v1/rerank -d '{\"query\":\"q\",\"documents\":"
                  "[\"a\",\"b\"],\"top_n\":1}'", hsock), 409);
    CHECK(strstr(out, "rerank_yes_token"));
    CHECK_EQ(curl(out, sizeof out, "--unix-socket %s http://llmsd/metrics", hsock),
             getuid() == 0 ? 200 : 403);
}

static void curl_errors(void)
{
    if (!have("curl"))
        SKIP("curl is not installed (scripts/install-deps.sh installs it)");
    NEED_DAEMON();
    static char out[1 << 16];
    CHECK_EQ(curl(out, sizeof out, "--unix-socket %s http://llmsd/v1/chat/completions -d '{oops'",
                  hsock), 400);
    CHECK(strstr(out, "\"error\":{") && strstr(out, "\"type\":\"invalid_request_error\""));
    CHECK_EQ(curl(out, sizeof out,
                  "--unix-socket %s http://llmsd/v1/completions -d '{\"model\":\"gpt-x\","
                  "\"prompt\":\"a\"}'", hsock), 404);
    CHECK(strstr(out, "\"code\":\"model_not_found\""));
    CHECK_EQ(curl(out, sizeof out, "--unix-socket %s http://llmsd/v2/whatever", hsock), 404);
    CHECK(strstr(out, "\"code\":\"unknown_route\""));
    char big[700];
    proc_fmt(big, sizeof big, "%s/big.json", test_tmpdir());
    FILE *f = fopen(big, "w");
    CHECK(f);
    fprintf(f, "{\"prompt\":\"");
    for (int i = 0; i < BODY_LIMIT; i++)
        fputc('a', f);
    fprintf(f, "\"}");
    fclose(f);
    CHECK_EQ(curl(out, sizeof out, "--unix-socket %s http://llmsd/v1/completions --data-binary @%s",
                  hsock, big), 413);
    CHECK(strstr(out, "\"code\":\"body_too_large\""));
    CHECK_EQ(curl(out, sizeof out,
                  "-H 'Authorization: Bearer nope' http://127.0.0.1:%d/v1/models", port), 401);
    CHECK(strstr(out, "\"code\":\"invalid_api_key\""));
    CHECK_EQ(curl(out, sizeof out, "http://127.0.0.1:%d/v1/models", port), 401);
    CHECK_EQ(curl(out, sizeof out,
                  "-H 'Authorization: Bearer " TOKEN "' http://127.0.0.1:%d/v1/chat/completions "
                  "-d '{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":3}'",
                  port), 200);
}

static void openai_npm_client(void)
{
    if (!have("node") || !have("npm"))
        SKIP("node/npm are not installed: the openai npm client test cannot run");
    NEED_DAEMON();
    const char *script = "tests/integration/openai_client.mjs";
    if (access(script, R_OK) != 0)
        SKIP("%s is not here (run from the source tree)", script);
    char dir[1100], cmd[4096], out[8192];
    proc_fmt(dir, sizeof dir, "%s/npm-openai", build_dir);
    proc_fmt(cmd, sizeof cmd, "test -f '%s/node_modules/openai/package.json'", dir);
    if (test_run_capture(cmd, out, sizeof out) != 0) {
        proc_fmt(cmd, sizeof cmd,
                 "mkdir -p '%s' && cd '%s' && timeout 300 npm install --no-audit --no-fund "
                 "--loglevel=error openai@4 >npm-install.log 2>&1",
                 dir, dir);
        if (test_run_capture(cmd, out, sizeof out) != 0)
            SKIP("npm install openai failed (no registry?): see %s/npm-install.log", dir);
    }
    proc_fmt(cmd, sizeof cmd,
             "cp '%s' '%s/openai_client.mjs' && cd '%s' && LLMSD_URL=http://127.0.0.1:%d/v1 "
             "LLMSD_TOKEN=" TOKEN " LLMSD_MODEL=clients timeout 120 node openai_client.mjs 2>&1",
             script, dir, dir, port);
    int rc = test_run_capture(cmd, out, sizeof out);
    fputs(out, stdout);
    CHECK_MSG(rc == 0, "the openai client test failed (status %d)", rc);
    CHECK(strstr(out, "ok bad token"));
}

int main(int argc, char **argv)
{
    (void)argc;
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    if (llmsd_path[0]) /* BUILD/tests/integration/../../llmsd */
        proc_fmt(build_dir, sizeof build_dir, "%.*s", (int)(strlen(llmsd_path) - 6), llmsd_path);
    modelgen_params mp = {
        .arch = "llama", .dim = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 128,
        .n_ctx = 512, .type = QTYPE_F32, .seed = 3, .n_vocab = 300, .n_threads = 1,
    };
    proc_generate_model(model_path, sizeof model_path, "clients.gguf", &mp);
    RUN(curl_chat_completions_models_embeddings);
    RUN(curl_errors);
    RUN(openai_npm_client);
    if (up == 1)
        proc_stop(&d, SIGTERM);
    return test_finish();
}
