/*
 * The HTTP gateway (daemon/net/http.h) end to end: a real llmsd of this build with
 * http_socket and http_listen, spoken to with a small HTTP client (httpc.h) and
 * checked against the same daemon's native answers through libllmsclient: chat,
 * completions (plain and streamed), embeddings (float and base64), contexts through
 * the "llmsd" field, identity (peer uid, bearer tokens), /metrics, errors, limits,
 * malformed input, and the cancellation of a generation whose client went away.
 * Rerank needs a model with answer tokens: the trained stories260K of the shared test
 * data with fixed yes/no ids, so that test skips without it.
 */
#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <poll.h>
#include <json-c/json.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"
#include "tests/integration/httpc.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/integration/randjson.h"
#include "tests/support/test.h"

#define TOKEN_USER "tok-user-0123456789"
#define TOKEN_ADMIN "tok-admin-0123456789"
#define UNAUTH_CONNS 4
#define BODY_LIMIT 8192

static char llmsd_path[1024];
static char model_path[1024], slow_model_path[1024];
static llmsd_proc daemon_, slow_daemon;
static int daemon_up, slow_up;
static char hsock[700];
static int port;

#define NEED(up, start)                                                        \
    do {                                                                       \
        if (!llmsd_path[0])                                                    \
            SKIP("llmsd is not built in this tree");                           \
        if (!model_path[0])                                                    \
            SKIP("no model could be generated");                               \
        if (!(up))                                                             \
            (up) = (start) == 0 ? 1 : -1;                                      \
        CHECK_MSG((up) == 1, "llmsd did not start");                           \
    } while (0)

static int start_daemon(void)
{
    char tokens[700], extra[2048];
    proc_fmt(tokens, sizeof tokens, "%s/tokens", test_tmpdir());
    FILE *f = fopen(tokens, "w");
    if (!f)
        return -1;
    fprintf(f, "# token uid app [admin]\n%s %u tokapp\n%s %u tokadmin admin\n", TOKEN_USER,
            (unsigned)getuid(), TOKEN_ADMIN, (unsigned)getuid());
    fclose(f);
    chmod(tokens, 0600);
    port = httpc_free_port();
    struct group *g = getgrgid(getgid());
    proc_fmt(hsock, sizeof hsock, "%s/http/h.sock", test_tmpdir());
    proc_fmt(extra, sizeof extra,
             "http_socket = %s\nhttp_listen = 127.0.0.1:%d\nhttp_tokens_file = %s\n"
             "http_max_body_bytes = %d\nadmin_group = %s\nmax_queued_per_app = 4\n"
             "http_max_unauthenticated_connections = %d\n",
             hsock, port, tokens, BODY_LIMIT, g ? g->gr_name : "root", UNAUTH_CONNS);
    return proc_start(&daemon_, llmsd_path, "http", model_path, extra);
}

static int start_slow(void)
{
    char extra[1024];
    proc_fmt(extra, sizeof extra, "http_socket = %s/slow-h.sock\nn_ctx = 4096\n", test_tmpdir());
    return proc_start(&slow_daemon, llmsd_path, "slow", slow_model_path, extra);
}

/* POST body to path on the gateway's Unix socket; the reply's JSON (NULL when none). */
static json_object *post(const char *path, const char *body, int *status)
{
    return httpc_post_json(hsock, path, body, status);
}

static void health_and_models(void)
{
    NEED(daemon_up, start_daemon());
    httpc_reply r;
    CHECK(httpc_do(hsock, 0, "GET", "/health", NULL, NULL, &r) == 0);
    CHECK_EQ(r.status, 200);
    CHECK(strstr(r.body, "\"ok\""));
    httpc_reply_free(&r);
    CHECK(httpc_do(hsock, 0, "GET", "/v1/models", NULL, NULL, &r) == 0);
    CHECK_EQ(r.status, 200);
    json_object *o = json_tokener_parse(r.body);
    httpc_reply_free(&r);
    CHECK(o);
    CHECK(httpc_jstr(o, "data.0.id") && strcmp(httpc_jstr(o, "data.0.id"), "http") == 0);
    CHECK(strcmp(httpc_jstr(o, "object"), "list") == 0);
    json_object_put(o);
}

static void chat_matches_native_complete(void)
{
    NEED(daemon_up, start_daemon());
    llms_conn *c = proc_connect(&daemon_, "native");
    CHECK(c);
    llms_params p = LLMS_PARAMS_INIT;
    p.temperature = 0;
    p.max_tokens = 12;
    llms_result want = {0};
    CHECK_EQ(llms_complete(c, "hello there", "Be brief.", 1, &p, NULL, NULL, &want), LLMS_OK);
    llms_close(c);
    int st;
    json_object *o = post("/v1/chat/completions",
                          "{\"model\":\"http\",\"messages\":[{\"role\":\"system\",\"content\":"
                          "\"Be brief.\"},{\"role\":\"user\",\"content\":\"hello there\"}],"
                          "\"temperature\":0,\"max_tokens\":12}", &st);
    CHECK(o);
    CHECK_EQ(st, 200);
    CHECK(strcmp(httpc_jstr(o, "object"), "chat.completion") == 0);
    CHECK(strncmp(httpc_jstr(o, "id"), "chatcmpl-", 9) == 0);
    CHECK(strcmp(httpc_jstr(o, "choices.0.message.role"), "assistant") == 0);
    CHECK_MSG(strcmp(httpc_jstr(o, "choices.0.message.content"), want.text) == 0, "'%s' vs '%s'",
              httpc_jstr(o, "choices.0.message.content"), want.text);
    CHECK_EQ(atoi(httpc_jstr(o, "usage.completion_tokens")), want.generated_tokens);
    CHECK_EQ(atoi(httpc_jstr(o, "usage.prompt_tokens")), want.prompt_tokens);
    CHECK_EQ(atoi(httpc_jstr(o, "usage.total_tokens")), want.prompt_tokens + want.generated_tokens);
    const char *fin = httpc_jstr(o, "choices.0.finish_reason");
    CHECK(strcmp(fin, want.stop_reason == LLMS_STOP_MAX_TOKENS ? "length" : "stop") == 0);
    json_object_put(o);
    llms_result_free(&want);
}

/* A message's text parts are joined with a newline, as llama.cpp's server joins them
 * (they were run together: "hello" and "there" became "hellothere"); an empty part adds
 * no line of its own before the first text. */
static void text_parts_join_with_newlines(void)
{
    NEED(daemon_up, start_daemon());
    llms_conn *c = proc_connect(&daemon_, "native");
    CHECK(c);
    llms_params p = LLMS_PARAMS_INIT;
    p.temperature = 0;
    p.max_tokens = 6;
    llms_result want = {0};
    CHECK_EQ(llms_complete(c, "hello\nthere", NULL, 1, &p, NULL, NULL, &want), LLMS_OK);
    llms_close(c);
    const char *contents[] = {
        "[{\"type\":\"text\",\"text\":\"hello\"},{\"type\":\"text\",\"text\":\"there\"}]",
        "[{\"type\":\"text\",\"text\":\"\"},{\"type\":\"text\",\"text\":\"hello\\nthere\"}]",
    };
    for (int i = 0; i < 2; i++) {
        char body[512];
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":%s}],\"temperature\":0,"
                 "\"max_tokens\":6}", contents[i]);
        int st;
        json_object *o = post("/v1/chat/completions", body, &st);
        CHECK_MSG(o && st == 200, "%s: %d", contents[i], st);
        CHECK_MSG(atoi(httpc_jstr(o, "usage.prompt_tokens")) == (int)want.prompt_tokens &&
                      !strcmp(httpc_jstr(o, "choices.0.message.content"), want.text),
                  "%s: %s tokens '%s'; \"hello\\nthere\": %u tokens '%s'", contents[i],
                  httpc_jstr(o, "usage.prompt_tokens"), httpc_jstr(o, "choices.0.message.content"),
                  want.prompt_tokens, want.text);
        json_object_put(o);
    }
    llms_result_free(&want);
}

/* Distinct "tokN" pieces of a reply of the generated test model. */
static int distinct_pieces(const char *text)
{
    int ids[64], n = 0, distinct = 0;
    for (const char *p = strstr(text, "tok"); p && n < 64; p = strstr(p + 3, "tok"))
        ids[n++] = atoi(p + 3);
    for (int i = 0; i < n; i++) {
        int j = 0;
        while (j < i && ids[j] != ids[i])
            j++;
        distinct += j == i;
    }
    return distinct;
}

/* OpenAI's frequency_penalty and presence_penalty are applied (they were ignored): the
 * greedy reply of the test model, which repeats a few tokens, uses more distinct tokens
 * with them; values outside [-2, 2] are 400 as OpenAI answers. */
static void frequency_and_presence_penalties_apply(void)
{
    NEED(daemon_up, start_daemon());
    const char *bodies[] = {
        "{\"prompt\":\"hello there\",\"max_tokens\":16,\"temperature\":0}",
        "{\"prompt\":\"hello there\",\"max_tokens\":16,\"temperature\":0,"
        "\"frequency_penalty\":2,\"presence_penalty\":2}",
    };
    int distinct[2];
    for (int i = 0; i < 2; i++) {
        int st;
        json_object *o = post("/v1/completions", bodies[i], &st);
        CHECK_MSG(o && st == 200, "%s: %d", bodies[i], st);
        distinct[i] = distinct_pieces(httpc_jstr(o, "choices.0.text"));
        printf("    %d distinct of 16: %s\n", distinct[i], httpc_jstr(o, "choices.0.text"));
        json_object_put(o);
    }
    CHECK_MSG(distinct[1] > distinct[0], "%d distinct tokens with the penalties, %d without",
              distinct[1], distinct[0]);
    const char *bad[] = {"\"frequency_penalty\":2.5", "\"presence_penalty\":-3"};
    for (int i = 0; i < 2; i++) {
        char body[256];
        snprintf(body, sizeof body, "{\"prompt\":\"hi\",\"max_tokens\":2,%s}", bad[i]);
        int st;
        json_object *o = post("/v1/completions", body, &st);
        const char *msg = o ? httpc_jstr(o, "error.message") : NULL;
        CHECK_MSG(st == 400 && msg && strstr(msg, "penalty"), "%s: %d %s", body, st,
                  msg ? msg : "");
        json_object_put(o);
    }
}

/* OpenAI's logit_bias is applied (it was ignored): a greedy reply's first token, banned
 * with -100, is not its first token any more; favoured with +100, a token the reply did
 * not use comes first. */
static void logit_bias_applies(void)
{
    NEED(daemon_up, start_daemon());
    int st;
    json_object *o = post("/v1/completions",
                          "{\"prompt\":\"hello there\",\"max_tokens\":4,\"temperature\":0}", &st);
    CHECK(o && st == 200);
    char plain[256];
    snprintf(plain, sizeof plain, "%s", httpc_jstr(o, "choices.0.text"));
    json_object_put(o);
    CHECK_MSG(!strncmp(plain, "tok", 3), "%s", plain);
    int first = atoi(plain + 3);
    char body[256];
    snprintf(body, sizeof body, "{\"prompt\":\"hello there\",\"max_tokens\":4,\"temperature\":0,"
             "\"logit_bias\":{\"%d\":-100}}", first);
    o = post("/v1/completions", body, &st);
    CHECK(o && st == 200);
    const char *banned = httpc_jstr(o, "choices.0.text");
    char want[32];
    snprintf(want, sizeof want, "tok%d", first);
    CHECK_MSG(strncmp(banned, want, strlen(want)) != 0 || isdigit((unsigned char)banned[strlen(want)]),
              "banned tok%d, got '%s'", first, banned);
    json_object_put(o);
    int favoured = first == 7 ? 8 : 7;
    snprintf(body, sizeof body, "{\"prompt\":\"hello there\",\"max_tokens\":2,\"temperature\":0,"
             "\"logit_bias\":{\"%d\":100}}", favoured);
    o = post("/v1/completions", body, &st);
    CHECK(o && st == 200);
    snprintf(want, sizeof want, "tok%dtok%d", favoured, favoured);
    CHECK_MSG(!strcmp(httpc_jstr(o, "choices.0.text"), want), "favoured tok%d, got '%s'",
              favoured, httpc_jstr(o, "choices.0.text"));
    json_object_put(o);
    /* an id outside the vocabulary of 300 */
    o = post("/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":2,\"logit_bias\":{\"300\":1}}",
             &st);
    const char *msg = o ? httpc_jstr(o, "error.message") : NULL;
    CHECK_MSG(st == 400 && msg && strstr(msg, "vocabulary"), "%d %s", st, msg ? msg : "");
    json_object_put(o);
}

/* Clients pass a model's special tokens as stop strings, more than OpenAI's 4: 14 are
 * taken beside a chat template's end (400 before: at most 6). */
static void many_stop_strings_are_taken(void)
{
    NEED(daemon_up, start_daemon());
    int st;
    json_object *o = post("/v1/chat/completions",
                          "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":2,"
                          "\"stop\":[\"s1\",\"s2\",\"s3\",\"s4\",\"s5\",\"s6\",\"s7\",\"s8\",\"s9\","
                          "\"s10\",\"s11\",\"s12\",\"s13\",\"s14\"]}", &st);
    CHECK_MSG(o && st == 200, "%d %s", st, o ? httpc_jstr(o, "error.message") : "");
    json_object_put(o);
}

static void completion_matches_native(void)
{
    NEED(daemon_up, start_daemon());
    llms_conn *c = proc_connect(&daemon_, "native");
    CHECK(c);
    llms_params p = LLMS_PARAMS_INIT;
    p.temperature = 0;
    p.max_tokens = 10;
    llms_result want = {0};
    CHECK_EQ(llms_complete(c, "one two three", NULL, 0, &p, NULL, NULL, &want), LLMS_OK);
    llms_close(c);
    int st;
    json_object *o = post("/v1/completions",
                          "{\"prompt\":\"one two three\",\"temperature\":0,\"max_tokens\":10}", &st);
    CHECK(o);
    CHECK_EQ(st, 200);
    CHECK(strcmp(httpc_jstr(o, "object"), "text_completion") == 0);
    CHECK(strcmp(httpc_jstr(o, "choices.0.text"), want.text) == 0);
    CHECK_EQ(atoi(httpc_jstr(o, "usage.completion_tokens")), want.generated_tokens);
    json_object_put(o);
    llms_result_free(&want);
}

/* llms_params' penalties and logit_bias (libllmsclient.so.3) reach the sampler as the
 * gateway's fields do: the same request both ways gives the same text, unlike the
 * request without them; as a context's defaults they apply to its calls. */
static void native_params_carry_penalties_and_bias(void)
{
    NEED(daemon_up, start_daemon());
    llms_conn *c = proc_connect(&daemon_, "native");
    CHECK(c);
    llms_params p = LLMS_PARAMS_INIT;
    p.temperature = 0;
    p.max_tokens = 12;
    llms_result plain = {0};
    CHECK_EQ(llms_complete(c, "one two three", NULL, 0, &p, NULL, NULL, &plain), LLMS_OK);
    CHECK_MSG(!strncmp(plain.text, "tok", 3), "%s", plain.text);
    int first = atoi(plain.text + 3);
    const llms_logit_bias bias[] = {{first, -100}, {first == 9 ? 10 : 9, 3}};
    p.logit_bias = bias;
    p.n_logit_bias = 2;
    p.frequency_penalty = 1.5f;
    p.presence_penalty = 0.5f;
    llms_result native = {0};
    CHECK_EQ(llms_complete(c, "one two three", NULL, 0, &p, NULL, NULL, &native), LLMS_OK);
    CHECK_MSG(strcmp(native.text, plain.text) != 0, "the fields changed nothing: %s", native.text);

    char body[512];
    snprintf(body, sizeof body,
             "{\"prompt\":\"one two three\",\"temperature\":0,\"max_tokens\":12,"
             "\"frequency_penalty\":1.5,\"presence_penalty\":0.5,"
             "\"logit_bias\":{\"%d\":-100,\"%d\":3}}", bias[0].token, bias[1].token);
    int st;
    json_object *o = post("/v1/completions", body, &st);
    CHECK(o && st == 200);
    CHECK_MSG(!strcmp(httpc_jstr(o, "choices.0.text"), native.text), "http '%s', native '%s'",
              httpc_jstr(o, "choices.0.text"), native.text);
    json_object_put(o);

    char id[LLMS_ID_MAX];
    CHECK_EQ(llms_context_create(c, NULL, &p, id), LLMS_OK);
    llms_params call = LLMS_PARAMS_INIT;
    call.temperature = 0;
    call.max_tokens = 12;
    call.raw = 1;
    llms_result ctx = {0};
    CHECK_EQ(llms_call(c, id, "one two three", &call, NULL, NULL, &ctx), LLMS_OK);
    CHECK_MSG(!strcmp(ctx.text, native.text), "context '%s', complete '%s'", ctx.text, native.text);
    CHECK_EQ(llms_context_delete(c, id), LLMS_OK);

    p.logit_bias = NULL;
    CHECK_EQ(llms_complete(c, "one", NULL, 0, &p, NULL, NULL, NULL), LLMS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(llms_last_error(c), "logit_bias"), "%s", llms_last_error(c));
    llms_result_free(&plain);
    llms_result_free(&native);
    llms_result_free(&ctx);
    llms_close(c);
}

static double jnum(json_object *o, const char *path)
{
    return json_object_get_double(httpc_jget(o, path));
}

/* Every logprobs.content entry of a streamed chat's events, in order (a new array). */
static json_object *streamed_logprobs(const char *body)
{
    httpc_reply r;
    if (httpc_do(hsock, 0, "POST", "/v1/chat/completions", NULL, body, &r) || r.status != 200)
        return NULL;
    json_object *all = json_object_new_array();
    char *save, *line = strtok_r(r.body, "\n", &save);
    for (; line; line = strtok_r(NULL, "\n", &save)) {
        if (strncmp(line, "data: {", 7) != 0)
            continue;
        json_object *ev = json_tokener_parse(line + 6);
        json_object *content = httpc_jget(ev, "choices.0.logprobs.content");
        for (size_t i = 0; content && i < json_object_array_length(content); i++)
            json_object_array_add(all, json_object_get(json_object_array_get_idx(content, i)));
        json_object_put(ev);
    }
    httpc_reply_free(&r);
    return all;
}

/* logprobs as OpenAI gives them: a chat's content entries (token, logprob, bytes and
 * top_logprobs alternatives, most likely first), the same streamed, a completion's four
 * lists; greedy picks the likeliest token, so each token is its step's first alternative
 * and the tokens spell the reply. A RAG answer refuses them, and a reply whose logprobs
 * may not fit max_frame_bytes is refused before it is generated. 400 before: refused. */
static void logprobs_chat_and_completion(void)
{
    NEED(daemon_up, start_daemon());
    const char *chat = "{\"messages\":[{\"role\":\"user\",\"content\":\"one two\"}],"
                       "\"max_tokens\":6,\"temperature\":0,\"logprobs\":true,\"top_logprobs\":3%s}";
    char body[512];
    snprintf(body, sizeof body, chat, "");
    int st;
    json_object *o = post("/v1/chat/completions", body, &st);
    CHECK_MSG(o && st == 200, "%d %s", st, o ? httpc_jstr(o, "error.message") : "");
    json_object *content = httpc_jget(o, "choices.0.logprobs.content");
    CHECK(content && json_object_is_type(content, json_type_array));
    size_t n = json_object_array_length(content);
    CHECK_EQ((int)n, atoi(httpc_jstr(o, "usage.completion_tokens")));
    char spelled[512] = "";
    for (size_t i = 0; i < n; i++) {
        json_object *e = json_object_array_get_idx(content, i);
        json_object *top = httpc_jget(e, "top_logprobs");
        CHECK_EQ(json_object_array_length(top), 3);
        double lp = jnum(e, "logprob");
        CHECK_MSG(lp <= 0 && lp > -50, "%g", lp);
        CHECK_MSG(!strcmp(httpc_jstr(e, "token"), httpc_jstr(top, "0.token")) &&
                      lp == jnum(top, "0.logprob"), "token %zu: '%s' %g, top '%s' %g", i,
                  httpc_jstr(e, "token"), lp, httpc_jstr(top, "0.token"), jnum(top, "0.logprob"));
        CHECK(jnum(top, "0.logprob") >= jnum(top, "1.logprob") &&
              jnum(top, "1.logprob") >= jnum(top, "2.logprob"));
        CHECK_EQ(json_object_array_length(httpc_jget(e, "bytes")), strlen(httpc_jstr(e, "token")));
        strncat(spelled, httpc_jstr(e, "token"), sizeof spelled - strlen(spelled) - 1);
    }
    CHECK_MSG(!strcmp(spelled, httpc_jstr(o, "choices.0.message.content")), "'%s' vs '%s'",
              spelled, httpc_jstr(o, "choices.0.message.content"));

    /* streamed: the same entries over the events */
    snprintf(body, sizeof body, chat, ",\"stream\":true");
    json_object *streamed = streamed_logprobs(body);
    CHECK(streamed);
    CHECK_EQ(json_object_array_length(streamed), n);
    for (size_t i = 0; streamed && i < n; i++) {
        json_object *a = json_object_array_get_idx(content, i);
        json_object *b = json_object_array_get_idx(streamed, i);
        CHECK_MSG(!strcmp(httpc_jstr(a, "token"), httpc_jstr(b, "token")) &&
                      fabs(jnum(a, "logprob") - jnum(b, "logprob")) < 1e-4, "entry %zu", i);
    }
    json_object_put(streamed);
    json_object_put(o);

    /* a chat without logprobs keeps null */
    o = post("/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                                     "\"max_tokens\":2}", &st);
    CHECK(o && st == 200);
    CHECK(httpc_jget(o, "choices.0") && !httpc_jget(o, "choices.0.logprobs"));
    json_object_put(o);

    o = post("/v1/completions", "{\"prompt\":\"one two\",\"max_tokens\":5,\"temperature\":0,"
                                "\"logprobs\":2}", &st);
    CHECK(o && st == 200);
    json_object *lp = httpc_jget(o, "choices.0.logprobs");
    n = json_object_array_length(httpc_jget(lp, "tokens"));
    CHECK(n > 0);
    CHECK_EQ(json_object_array_length(httpc_jget(lp, "token_logprobs")), n);
    CHECK_EQ(json_object_array_length(httpc_jget(lp, "top_logprobs")), n);
    CHECK_EQ(json_object_array_length(httpc_jget(lp, "text_offset")), n);
    size_t offset = 0;
    for (size_t i = 0; i < n; i++) {
        char path[64];
        snprintf(path, sizeof path, "top_logprobs.%zu", i);
        CHECK(json_object_object_length(httpc_jget(lp, path)) <= 2);
        snprintf(path, sizeof path, "text_offset.%zu", i);
        CHECK_EQ((size_t)json_object_get_int(httpc_jget(lp, path)), offset);
        snprintf(path, sizeof path, "tokens.%zu", i);
        offset += strlen(httpc_jstr(lp, path));
    }

    /* libllmsclient's llms_result.logprobs are the same numbers */
    llms_conn *c = proc_connect(&daemon_, "native");
    CHECK(c);
    llms_params p = LLMS_PARAMS_INIT;
    p.temperature = 0;
    p.max_tokens = 5;
    p.logprobs = 1;
    p.top_logprobs = 2;
    llms_result native = {0};
    CHECK_EQ(llms_complete(c, "one two", NULL, 0, &p, NULL, NULL, &native), LLMS_OK);
    CHECK_EQ(native.n_logprobs, n);
    for (size_t i = 0; i < native.n_logprobs && i < n; i++) {
        char path[64];
        snprintf(path, sizeof path, "token_logprobs.%zu", i);
        CHECK_MSG(fabs(native.logprobs[i].logprob - jnum(lp, path)) < 1e-5, "%zu", i);
        CHECK_EQ(native.logprobs[i].n_top, 2);
        CHECK_EQ(native.logprobs[i].top_token[0], native.logprobs[i].token);
    }
    llms_result_free(&native);
    llms_close(c);
    json_object_put(o);

    /* the rows a speculative step verifies give the same logprobs as one row a step */
    json_object *spec[2];
    for (int i = 0; i < 2; i++) {
        snprintf(body, sizeof body, "{\"prompt\":\"a b a b a b a b\",\"max_tokens\":24,"
                 "\"temperature\":0,\"logprobs\":1,\"speculation\":\"%s\"}", i ? "lookup" : "off");
        spec[i] = post("/v1/completions", body, &st);
        CHECK(spec[i] && st == 200);
    }
    json_object *a = httpc_jget(spec[0], "choices.0.logprobs.token_logprobs");
    json_object *b = httpc_jget(spec[1], "choices.0.logprobs.token_logprobs");
    CHECK(a && b && json_object_array_length(a) == json_object_array_length(b));
    for (size_t i = 0; a && b && i < json_object_array_length(a); i++) {
        double x = json_object_get_double(json_object_array_get_idx(a, i));
        double y = json_object_get_double(json_object_array_get_idx(b, i));
        CHECK_MSG(fabs(x - y) < 1e-3, "token %zu: %g off, %g lookup", i, x, y);
    }
    json_object_put(spec[0]);
    json_object_put(spec[1]);

    static const struct {
        const char *path, *body, *says;
    } bad[] = {
        {"/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}", "needs"},
        {"/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,"
         "\"top_logprobs\":21}", "top_logprobs"},
        {"/v1/completions", "{\"prompt\":\"x\",\"logprobs\":-1}", "logprobs"},
        {"/v1/llmsd/rag", "{\"kb\":\"k\",\"question\":\"q\",\"logprobs\":true}", "RAG"},
        /* the reply's logprobs may not fit max_frame_bytes (65536): refused before any
         * compute, streamed or not, instead of failing after it */
        {"/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":1000,"
         "\"logprobs\":true,\"top_logprobs\":20}", "tokens fit (max_tokens)"},
        {"/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":1000,\"logprobs\":20,"
         "\"stream\":true}", "tokens fit (max_tokens)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        o = post(bad[i].path, bad[i].body, &st);
        const char *msg = o ? httpc_jstr(o, "error.message") : NULL;
        CHECK_MSG(st == 400 && msg && strstr(msg, bad[i].says), "%s: %d %s", bad[i].body, st,
                  msg ? msg : "");
        json_object_put(o);
    }
}

/* POST /tokenize and /detokenize answer as llama.cpp's server does, with the ids and
 * the text the native Tokenize and Detokenize give. */
static void tokenize_and_detokenize_routes(void)
{
    NEED(daemon_up, start_daemon());
    llms_conn *c = proc_connect(&daemon_, "tok");
    CHECK(c);
    int32_t *want;
    size_t n_want;
    CHECK_EQ(llms_tokenize(c, "one two three", 1, 0, &want, &n_want), LLMS_OK);
    int st;
    json_object *o = post("/tokenize", "{\"content\":\"one two three\",\"add_special\":true}", &st);
    CHECK_MSG(o && st == 200, "%d", st);
    json_object *tokens;
    CHECK(json_object_object_get_ex(o, "tokens", &tokens));
    CHECK_EQ(json_object_array_length(tokens), n_want);
    CHECK_EQ(atoi(httpc_jstr(o, "count")), (int)n_want);
    char body[1024] = "{\"tokens\":[";
    for (size_t i = 0; i < n_want; i++) {
        CHECK_EQ(json_object_get_int(json_object_array_get_idx(tokens, i)), want[i]);
        snprintf(body + strlen(body), sizeof body - strlen(body), "%s%d", i ? "," : "", want[i]);
    }
    strcat(body, "]}");
    json_object_put(o);
    /* vLLM's names, and add_special off by default */
    o = post("/tokenize", "{\"prompt\":\"one two three\"}", &st);
    CHECK(o && st == 200);
    int32_t *bare;
    size_t n_bare;
    CHECK_EQ(llms_tokenize(c, "one two three", 0, 0, &bare, &n_bare), LLMS_OK);
    CHECK_EQ(atoi(httpc_jstr(o, "count")), (int)n_bare);
    json_object_put(o);
    /* special tokens are read in the text unless parse_special says false, as llama.cpp's
     * server reads them: "</s>" is the EOS token, or the text of its characters */
    int32_t *eos, *chars;
    size_t n_eos, n_chars;
    CHECK_EQ(llms_tokenize(c, "</s>", 0, 1, &eos, &n_eos), LLMS_OK);
    CHECK_EQ(llms_tokenize(c, "</s>", 0, 0, &chars, &n_chars), LLMS_OK);
    CHECK(n_eos == 1 && n_chars > 1);
    o = post("/tokenize", "{\"content\":\"</s>\"}", &st);
    CHECK_MSG(st == 200 && atoi(httpc_jstr(o, "count")) == 1 &&
                  atoi(httpc_jstr(o, "tokens.0")) == eos[0],
              "%d %s", st, json_object_to_json_string(o));
    json_object_put(o);
    o = post("/tokenize", "{\"content\":\"</s>\",\"parse_special\":false}", &st);
    CHECK_MSG(st == 200 && atoi(httpc_jstr(o, "count")) == (int)n_chars, "%d %s", st,
              json_object_to_json_string(o));
    json_object_put(o);
    free(eos);
    free(chars);

    char *text;
    CHECK_EQ(llms_detokenize(c, want, n_want, &text), LLMS_OK);
    o = post("/detokenize", body, &st);
    CHECK(o && st == 200);
    CHECK_MSG(!strcmp(httpc_jstr(o, "content"), text), "'%s' vs '%s'", httpc_jstr(o, "content"),
              text);
    json_object_put(o);

    static const struct {
        const char *path, *body, *says;
    } bad[] = {
        {"/tokenize", "{}", "content"},
        {"/tokenize", "{\"content\":\"a\",\"with_pieces\":\"yes\"}", "with_pieces"},
        {"/tokenize", "{\"content\":\"a\",\"add_special\":1}", "add_special"},
        {"/detokenize", "{\"tokens\":[1,-2]}", "tokens[1]"},
        {"/detokenize", "{\"tokens\":[1,300]}", "vocabulary"},
        {"/detokenize", "{\"tokens\":\"1 2\"}", "array"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        o = post(bad[i].path, bad[i].body, &st);
        const char *msg = o ? httpc_jstr(o, "error.message") : NULL;
        CHECK_MSG(st == 400 && msg && strstr(msg, bad[i].says), "%s %s: %d %s", bad[i].path,
                  bad[i].body, st, msg ? msg : "");
        json_object_put(o);
    }
    o = post("/tokenize", "{\"content\":\"a\",\"model\":\"nonesuch\"}", &st);
    CHECK_EQ(st, 404);
    json_object_put(o);
    free(want);
    free(bare);
    free(text);
    llms_close(c);
}

/* Streams a request and returns the text of its deltas; *done: ended with [DONE]. */
static char *stream_text(const char *path, const char *body, bool chat, int *status, bool *done,
                         bool *usage, char **finish)
{
    httpc_reply r;
    *done = *usage = false;
    *finish = NULL;
    if (httpc_do(hsock, 0, "POST", path, NULL, body, &r))
        return NULL;
    *status = r.status;
    size_t cap = r.body_len + 1, len = 0;
    char *text = calloc(1, cap);
    char *save, *line = strtok_r(r.body, "\n", &save);
    for (; line; line = strtok_r(NULL, "\n", &save)) {
        if (strncmp(line, "data: ", 6) != 0)
            continue;
        if (strcmp(line + 6, "[DONE]") == 0) {
            *done = true;
            continue;
        }
        json_object *o = json_tokener_parse(line + 6);
        if (!o)
            continue;
        const char *piece = httpc_jstr(o, chat ? "choices.0.delta.content" : "choices.0.text");
        if (piece) {
            size_t n = strlen(piece);
            memcpy(text + len, piece, n < cap - 1 - len ? n : cap - 1 - len);
            len += n < cap - 1 - len ? n : cap - 1 - len;
        }
        const char *f = httpc_jstr(o, "choices.0.finish_reason");
        if (f && !*finish)
            *finish = strdup(f);
        if (httpc_jstr(o, "usage.total_tokens"))
            *usage = true;
        json_object_put(o);
    }
    httpc_reply_free(&r);
    return text;
}

static void streamed_equals_whole(void)
{
    NEED(daemon_up, start_daemon());
    const char *msgs = "\"messages\":[{\"role\":\"user\",\"content\":\"tell me\"}],"
                       "\"temperature\":0,\"max_tokens\":20";
    char body[512];
    snprintf(body, sizeof body, "{%s}", msgs);
    int st;
    json_object *whole = post("/v1/chat/completions", body, &st);
    CHECK(whole && st == 200);
    snprintf(body, sizeof body, "{%s,\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
             msgs);
    bool done, usage;
    char *finish;
    char *text = stream_text("/v1/chat/completions", body, true, &st, &done, &usage, &finish);
    CHECK(text);
    CHECK_EQ(st, 200);
    CHECK(done);
    CHECK(usage);
    CHECK(finish && strcmp(finish, httpc_jstr(whole, "choices.0.finish_reason")) == 0);
    CHECK_MSG(strcmp(text, httpc_jstr(whole, "choices.0.message.content")) == 0, "'%s' vs '%s'", text,
              httpc_jstr(whole, "choices.0.message.content"));
    free(text);
    free(finish);
    /* Completions stream too, and without include_usage no usage event comes. */
    text = stream_text("/v1/completions",
                       "{\"prompt\":\"a b\",\"temperature\":0,\"max_tokens\":8,\"stream\":true}",
                       false, &st, &done, &usage, &finish);
    CHECK(text && st == 200 && done && !usage && finish);
    free(text);
    free(finish);
    json_object_put(whole);
}

/* Server-sent events end at a blank line: every event of a stream is one "data: " line
 * (a JSON object, or [DONE] last) followed by "\n\n", the token events too, with and
 * without logprobs. An event ended by a single "\n" merges with the next into one event
 * whose data is two lines, which an SSE client (OpenAI's, a browser's EventSource)
 * hands over joined, no longer JSON. */
static void streamed_events_end_with_a_blank_line(void)
{
    NEED(daemon_up, start_daemon());
    static const char *const asks[][2] = {
        {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"tell me\"}],"
                                 "\"temperature\":0,\"max_tokens\":6,\"stream\":true}"},
        {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"tell me\"}],"
                                 "\"temperature\":0,\"max_tokens\":6,\"stream\":true,"
                                 "\"logprobs\":true,\"top_logprobs\":2}"},
        {"/v1/completions", "{\"prompt\":\"a b\",\"temperature\":0,\"max_tokens\":6,"
                            "\"stream\":true}"},
    };
    for (size_t a = 0; a < sizeof asks / sizeof asks[0]; a++) {
        httpc_reply r;
        CHECK(httpc_do(hsock, 0, "POST", asks[a][0], NULL, asks[a][1], &r) == 0);
        CHECK_EQ(r.status, 200);
        int events = 0;
        bool done = false;
        char *p = r.body;
        while (*p && !done) {
            char *end = strstr(p, "\n\n");
            CHECK_MSG(end, "%s: an event without its blank line: '%.200s'", asks[a][0], p);
            if (!end)
                break;
            *end = '\0';
            CHECK_MSG(strncmp(p, "data: ", 6) == 0 && !strchr(p, '\n'),
                      "%s: event %d is not one data line: '%.300s'", asks[a][0], events, p);
            if (strcmp(p + 6, "[DONE]") == 0) {
                done = true;
            } else {
                json_object *o = json_tokener_parse(p + 6);
                CHECK_MSG(o && json_object_is_type(o, json_type_object),
                          "%s: event %d is not a JSON object: '%.300s'", asks[a][0], events, p);
                json_object_put(o);
            }
            events++;
            p = end + 2;
        }
        CHECK_MSG(done && !*p, "%s: the stream does not end with [DONE]", asks[a][0]);
        CHECK_MSG(events >= 3, "%s: %d events", asks[a][0], events);
        httpc_reply_free(&r);
    }
}

/* A field sent as null is absent, as for every other field: "max_completion_tokens": null
 * (what a client passing both of OpenAI's names, one of them None, sends) leaves
 * "max_tokens" in force. */
static void null_max_completion_tokens_keeps_max_tokens(void)
{
    NEED(daemon_up, start_daemon());
    int st;
    json_object *o = post("/v1/completions",
                          "{\"prompt\":\"one two three\",\"temperature\":0,\"max_tokens\":3,"
                          "\"max_completion_tokens\":null}", &st);
    CHECK(o && st == 200);
    CHECK_MSG(atoi(httpc_jstr(o, "usage.completion_tokens")) <= 3, "%s tokens generated",
              httpc_jstr(o, "usage.completion_tokens"));
    json_object_put(o);
}

static int b64v(char c)
{
    const char *a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const char *p = strchr(a, c);
    return c && p ? (int)(p - a) : -1;
}

static void embeddings_float_and_base64(void)
{
    NEED(daemon_up, start_daemon());
    llms_conn *c = proc_connect(&daemon_, "native");
    CHECK(c);
    const char *texts[] = {"first text", "second"};
    llms_embeddings want;
    CHECK_EQ(llms_embed(c, texts, 2, LLMS_POOLING_LAST, &want), LLMS_OK);
    llms_close(c);
    int st;
    json_object *o = post("/v1/embeddings", "{\"input\":[\"first text\",\"second\"]}", &st);
    CHECK(o && st == 200);
    json_object *data;
    CHECK(json_object_object_get_ex(o, "data", &data));
    CHECK_EQ(json_object_array_length(data), 2);
    for (size_t i = 0; i < 2; i++) {
        json_object *e = json_object_array_get_idx(data, i), *v;
        CHECK(json_object_object_get_ex(e, "embedding", &v));
        CHECK_EQ(json_object_array_length(v), want.dim);
        for (size_t d = 0; d < want.dim; d++)
            CHECK_NEAR(json_object_get_double(json_object_array_get_idx(v, d)),
                       want.values[i * want.dim + d], 1e-6);
    }
    CHECK(atoi(httpc_jstr(o, "usage.prompt_tokens")) == (int)(want.n_tokens[0] + want.n_tokens[1]));
    json_object_put(o);
    o = post("/v1/embeddings", "{\"input\":\"second\",\"encoding_format\":\"base64\"}", &st);
    CHECK(o && st == 200);
    const char *s = httpc_jstr(o, "data.0.embedding");
    CHECK(s && strlen(s) == (want.dim * 4 + 2) / 3 * 4);
    uint8_t *bytes = calloc(want.dim * 4 + 3, 1);
    size_t nb = 0;
    for (size_t i = 0; s[i] && s[i + 1]; i += 4) {
        int a = b64v(s[i]), b = b64v(s[i + 1]), cc = b64v(s[i + 2]), d = b64v(s[i + 3]);
        bytes[nb++] = (uint8_t)(a << 2 | b >> 4);
        if (cc >= 0)
            bytes[nb++] = (uint8_t)(b << 4 | cc >> 2);
        if (d >= 0)
            bytes[nb++] = (uint8_t)(cc << 6 | d);
    }
    CHECK_EQ(nb, want.dim * 4);
    for (size_t d = 0; d < want.dim; d++) {
        uint32_t bits = (uint32_t)bytes[4 * d] | (uint32_t)bytes[4 * d + 1] << 8 |
                        (uint32_t)bytes[4 * d + 2] << 16 | (uint32_t)bytes[4 * d + 3] << 24;
        float f;
        memcpy(&f, &bits, 4);
        CHECK(f == want.values[want.dim + d]);
    }
    free(bytes);
    json_object_put(o);
    llms_embeddings_free(&want);
}

/* "dimensions" the model's vectors do not have is refused naming it, as OpenAI refuses
 * it of a model that cannot shorten its vectors: answered with the model's own length,
 * the client stored vectors of another size than the one it asked for. */
static void embedding_dimensions_are_checked(void)
{
    NEED(daemon_up, start_daemon());
    int st;
    json_object *o = post("/v1/embeddings", "{\"input\":\"some text\"}", &st);
    CHECK(o && st == 200);
    json_object *data, *v;
    CHECK(json_object_object_get_ex(o, "data", &data));
    CHECK(json_object_object_get_ex(json_object_array_get_idx(data, 0), "embedding", &v));
    size_t dim = json_object_array_length(v);
    json_object_put(o);
    char body[256];
    snprintf(body, sizeof body, "{\"input\":\"some text\",\"dimensions\":%zu}", dim);
    o = post("/v1/embeddings", body, &st);
    CHECK_MSG(o && st == 200, "%s: %d", body, st);
    json_object_put(o);
    o = post("/v1/embeddings", "{\"input\":\"some text\",\"dimensions\":null}", &st);
    CHECK_MSG(o && st == 200, "null dimensions: %d", st);
    json_object_put(o);
    const char *bad[] = {"8", "0", "\"8\""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(body, sizeof body, "{\"input\":[\"a\",\"b\"],\"dimensions\":%s}", bad[i]);
        o = post("/v1/embeddings", body, &st);
        const char *msg = o ? httpc_jstr(o, "error.message") : NULL;
        CHECK_MSG(st == 400 && msg && strstr(msg, "dimensions"), "%s: %d %s", body, st,
                  o ? json_object_to_json_string(o) : "");
        json_object_put(o);
    }
}

/* A request that can never be served as sent is 400, which the OpenAI clients do not
 * retry, not 429, which they retry with backoff: a prompt beyond the model's window of
 * 512 tokens, on both generation routes; and natively, a Complete beyond max_frame_bytes. */
static void too_large_is_400_not_429(void)
{
    NEED(daemon_up, start_daemon());
    char prompt[4001];
    for (int i = 0; i < 4000; i += 5)
        memcpy(prompt + i, "word ", 5);
    prompt[4000] = '\0';
    char body[4200];
    const char *routes[] = {"/v1/completions", "/v1/chat/completions"};
    for (int i = 0; i < 2; i++) {
        if (i == 0)
            snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":2}", prompt);
        else
            snprintf(body, sizeof body,
                     "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],"
                     "\"max_tokens\":2}", prompt);
        int st;
        json_object *o = post(routes[i], body, &st);
        const char *type = o ? httpc_jstr(o, "error.type") : NULL;
        const char *msg = o ? httpc_jstr(o, "error.message") : NULL;
        CHECK_MSG(st == 400 && type && !strcmp(type, "invalid_request_error") && msg &&
                      strstr(msg, "window"),
                  "%s: %d %s", routes[i], st, o ? json_object_to_json_string(o) : "");
        json_object_put(o);
    }
    llms_conn *c = proc_connect(&daemon_, "too-large");
    CHECK(c);
    char *huge = malloc(70000);
    CHECK(huge);
    memset(huge, 'a', 69999);
    huge[69999] = '\0';
    CHECK_EQ(llms_complete(c, huge, NULL, 0, NULL, NULL, NULL, NULL), LLMS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(llms_last_error(c), "max_frame_bytes"), "%s", llms_last_error(c));
    free(huge);
    llms_close(c);
}

/* Status and error code of an exchange. */
static void expect_error(const char *method, const char *path, const char *headers,
                         const char *body, int want_status, const char *want_code, int *ok)
{
    httpc_reply r;
    *ok = 0;
    if (httpc_do(hsock, 0, method, path, headers, body, &r))
        return;
    json_object *o = json_tokener_parse(r.body);
    const char *code = o ? httpc_jstr(o, "error.code") : NULL;
    const char *msg = o ? httpc_jstr(o, "error.message") : NULL;
    const char *type = o ? httpc_jstr(o, "error.type") : NULL;
    *ok = r.status == want_status && code && msg && type && strcmp(code, want_code) == 0;
    if (!*ok)
        fprintf(stderr, "   %s %s: got %d %s, want %d %s\n", method, path, r.status, r.body,
                want_status, want_code);
    json_object_put(o);
    httpc_reply_free(&r);
}

/* GET /v1/models/{id} (what the openai clients' models.retrieve asks): the model as
 * /v1/models lists it, 404 model_not_found for a name not served. */
static void one_model_by_id(void)
{
    NEED(daemon_up, start_daemon());
    httpc_reply r;
    CHECK(httpc_do(hsock, 0, "GET", "/v1/models/http", NULL, NULL, &r) == 0);
    json_object *o = json_tokener_parse(r.body);
    CHECK_MSG(r.status == 200 && o, "%d %s", r.status, r.body);
    httpc_reply_free(&r);
    CHECK(httpc_jstr(o, "id") && strcmp(httpc_jstr(o, "id"), "http") == 0);
    CHECK(httpc_jstr(o, "object") && strcmp(httpc_jstr(o, "object"), "model") == 0);
    CHECK(httpc_jstr(o, "owned_by") && httpc_jstr(o, "created"));
    CHECK(httpc_jstr(o, "llmsd.roles.0") && strcmp(httpc_jstr(o, "llmsd.roles.0"), "generate") == 0);
    json_object_put(o);
    int ok;
    expect_error("GET", "/v1/models/gpt-4o", NULL, NULL, 404, "model_not_found", &ok);
    CHECK(ok);
    expect_error("POST", "/v1/models/http", NULL, "{}", 405, "method_not_allowed", &ok);
    CHECK(ok);
    expect_error("GET", "/v1/models/", NULL, NULL, 404, "unknown_route", &ok);
    CHECK(ok);
}

static void errors_are_openai_shaped(void)
{
    NEED(daemon_up, start_daemon());
    int ok;
    expect_error("POST", "/v1/chat/completions", NULL, "{\"messages\": [", 400, "invalid_request", &ok);
    CHECK(ok);
    expect_error("POST", "/v1/completions", NULL, "[\"not an object\"]", 400, "invalid_request", &ok);
    CHECK(ok);
    expect_error("POST", "/v1/completions", NULL, "{\"prompt\":\"x\"} {}", 400, "invalid_request", &ok);
    CHECK(ok);
    expect_error("POST", "/v1/completions", NULL, "", 400, "invalid_request", &ok);
    CHECK(ok);
    expect_error("POST", "/v1/chat/completions", NULL,
                 "{\"model\":\"gpt-4o\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 404,
                 "model_not_found", &ok);
    CHECK(ok);
    expect_error("GET", "/v1/nothing", NULL, NULL, 404, "unknown_route", &ok);
    CHECK(ok);
    expect_error("GET", "/v1/chat/completions", NULL, NULL, 405, "method_not_allowed", &ok);
    CHECK(ok);
    expect_error("POST", "/v1/chat/completions", NULL, "{\"messages\":[]}", 400, "invalid_argument", &ok);
    CHECK(ok);
    expect_error("POST", "/v1/chat/completions", NULL,
                 "{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", 400, "invalid_argument", &ok);
    CHECK(ok);
    expect_error("POST", "/v1/completions", NULL, "{\"prompt\":\"x\",\"n\":0}", 400, "invalid_argument", &ok);
    CHECK(ok);
    expect_error("POST", "/v1/completions", NULL, "{\"prompt\":\"x\",\"top_p\":3}", 400, "invalid_argument", &ok);
    CHECK(ok);
    expect_error("POST", "/v1/completions", NULL, "{\"prompt\":\"x\",\"max_tokens\":\"many\"}", 400,
                 "invalid_argument", &ok);
    CHECK(ok);
    expect_error("POST", "/v1/completions", NULL, "{\"prompt\":\"\"}", 400, "invalid_argument", &ok);
    CHECK(ok);
    expect_error("POST", "/v1/embeddings", NULL, "{\"input\":[1,2,3]}", 400, "invalid_argument", &ok);
    CHECK(ok);
    expect_error("POST", "/v1/embeddings", NULL, "{\"input\":\"x\",\"encoding_format\":\"hex\"}", 400,
                 "invalid_argument", &ok);
    CHECK(ok);
    expect_error("POST", "/v1/completions", "X-Llmsd-App: bad name!\r\n", "{\"prompt\":\"x\"}", 400,
                 "invalid_request", &ok);
    CHECK(ok);
    /* Over http_max_body_bytes: refused in JSON. */
    char *big = malloc(BODY_LIMIT + 100);
    CHECK(big);
    memset(big, ' ', BODY_LIMIT + 99);
    big[0] = '{';
    big[BODY_LIMIT + 98] = '}';
    big[BODY_LIMIT + 99] = '\0';
    expect_error("POST", "/v1/completions", NULL, big, 413, "body_too_large", &ok);
    free(big);
    CHECK(ok);
}

/* A field asking for what the gateway cannot produce (tool calls, a response format, the
 * prompt echoed) is refused naming it: answered as if honoured, the client reads no
 * tool_calls or text that is not JSON as the model's answer. The values OpenAI clients send that ask for nothing of the kind still pass. */
static void unhonoured_fields_are_refused(void)
{
    NEED(daemon_up, start_daemon());
    static const struct {
        const char *path, *field, *name;
    } refused[] = {
        {"/v1/chat/completions",
         "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}]",
         "tools"},
        {"/v1/chat/completions", "\"functions\":[{\"name\":\"f\",\"parameters\":{}}]", "functions"},
        {"/v1/chat/completions",
         "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"s\"}}",
         "response_format"},
        {"/v1/completions", "\"echo\":true", "echo"},
        {"/v1/completions", "\"suffix\":\" the end\"", "suffix"},
        {"/v1/completions", "\"best_of\":3", "best_of"},
        {"/v1/completions", "\"logit_bias\":{\"abc\":1}", "logit_bias"},
        {"/v1/completions", "\"logit_bias\":{\"5\":101}", "logit_bias"},
    };
    static const char *const accepted[] = {
        "\"logprobs\":false", "\"logprobs\":null", "\"tools\":[]", "\"tools\":null",
        "\"functions\":[]", "\"response_format\":{\"type\":\"text\"}", "\"response_format\":null",
        "\"echo\":false", "\"user\":\"u-1\"", "\"seed\":7", "\"n\":1", "\"presence_penalty\":0",
        "\"frequency_penalty\":0", "\"logit_bias\":{}", "\"parallel_tool_calls\":true",
        "\"metadata\":{\"k\":\"v\"}", "\"store\":false", "\"tool_choice\":\"none\"",
        "\"suffix\":\"\"", "\"suffix\":null", "\"best_of\":1",
    };
    char body[512];
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        bool chat = strcmp(refused[i].path, "/v1/chat/completions") == 0;
        snprintf(body, sizeof body, "{%s,\"max_tokens\":2,%s}",
                 chat ? "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]" : "\"prompt\":\"hi\"",
                 refused[i].field);
        httpc_reply r;
        CHECK(httpc_do(hsock, 0, "POST", refused[i].path, NULL, body, &r) == 0);
        json_object *o = json_tokener_parse(r.body);
        const char *msg = o ? httpc_jstr(o, "error.message") : NULL;
        CHECK_MSG(r.status == 400 && msg && strstr(msg, refused[i].name), "%s %s: %d %s",
                  refused[i].path, body, r.status, r.body);
        json_object_put(o);
        httpc_reply_free(&r);
    }
    for (size_t i = 0; i < sizeof accepted / sizeof *accepted; i++)
        for (int chat = 0; chat < 2; chat++) {
            snprintf(body, sizeof body, "{%s,\"max_tokens\":2,%s}",
                     chat ? "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"
                          : "\"prompt\":\"hi\"",
                     accepted[i]);
            int st;
            json_object *o = post(chat ? "/v1/chat/completions" : "/v1/completions", body, &st);
            CHECK_MSG(o && st == 200, "%s: %d", body, st);
            json_object_put(o);
        }
    /* JSON mode is honoured (test_http_json): this model's synthetic vocabulary ("tok5")
     * has no token that starts an object, which is said */
    int st;
    json_object *o = post("/v1/completions",
                          "{\"prompt\":\"hi\",\"max_tokens\":2,"
                          "\"response_format\":{\"type\":\"json_object\"}}", &st);
    const char *msg = o ? httpc_jstr(o, "error.message") : NULL;
    CHECK_MSG(st == 409 && msg && strstr(msg, "JSON mode"), "%d %s", st, msg ? msg : "");
    json_object_put(o);
}

static void malformed_input_never_crashes(void)
{
    NEED(daemon_up, start_daemon());
    char deep[2100];
    memset(deep, '[', 2000);
    deep[2000] = '\0';
    const char *bodies[] = {
        deep, "{\"prompt\":\"\xff\xfe\"}", "{\"prompt\":\"a\\u0000b\",\"max_tokens\":1}",
        "{\"prompt\":{\"nested\":true}}", "{\"messages\":\"hi\"}", "{\"messages\":[1,2]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}",
        "{\"prompt\":\"x\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\"]}",
        "{\"prompt\":\"x\",\"stop\":[\"\"]}", "{\"prompt\":\"x\",\"seed\":-5,\"max_tokens\":1}",
        "{\"prompt\":\"x\",\"max_tokens\":-1}", "{\"prompt\":\"x\",\"temperature\":1e999}",
        "{\"query\":\"q\",\"documents\":[{\"no\":\"text\"}]}", "{\"query\":\"q\",\"documents\":[]}",
        "{\"input\":[]}", "{\"prompt\":[\"a\",\"b\"]}", "null", "\"str\"", "12",
        /* JSON nulls where a string is read (tests/fuzz/fuzz_http_json found the first) */
        "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":null}]}]}",
        "{\"messages\":[{\"role\":null,\"content\":\"x\"}],\"llmsd\":{\"context\":\"c\"}}",
        /* Responses' input items with nulls where strings are read */
        "{\"input\":[null,{\"role\":\"user\",\"content\":[{\"type\":null}]}]}",
        "{\"input\":[{\"type\":\"function_call\",\"call_id\":null,\"arguments\":null}],"
        "\"tools\":[{\"type\":\"function\",\"name\":null}],\"tool_choice\":{\"type\":null}}",
    };
    const char *paths[] = {"/v1/completions", "/v1/chat/completions", "/v1/embeddings",
                           "/v1/rerank", "/tokenize", "/detokenize", "/v1/responses"};
    for (size_t p = 0; p < sizeof paths / sizeof *paths; p++)
        for (size_t i = 0; i < sizeof bodies / sizeof *bodies; i++) {
            httpc_reply r;
            CHECK(httpc_do(hsock, 0, "POST", paths[p], NULL, bodies[i], &r) == 0);
            CHECK_MSG(r.status >= 200 && r.status < 500, "%s %s: %d", paths[p], bodies[i], r.status);
            httpc_reply_free(&r);
        }
    /* Raw garbage instead of HTTP: the connection is answered or closed, nothing more. */
    int fd = httpc_connect(hsock, 0);
    CHECK(fd >= 0);
    const char junk[] = "\x01\x02 GARBAGE\r\n\r\n\r\nPOST / HTTP/9.9\r\nContent-Length: -5\r\n\r\n";
    CHECK(send(fd, junk, sizeof junk - 1, MSG_NOSIGNAL) > 0);
    char sink[4096];
    while (recv(fd, sink, sizeof sink, 0) > 0)
        ;
    close(fd);
    /* A NUL byte inside a head (the gateway's parser splits heads as C strings). */
    fd = httpc_connect(hsock, 0);
    CHECK(fd >= 0);
    const char nul[] = "GET /hea\0lth HTTP/1.1\r\nX: a\0b\r\n\r\n";
    CHECK(send(fd, nul, sizeof nul - 1, MSG_NOSIGNAL) > 0);
    while (recv(fd, sink, sizeof sink, 0) > 0)
        ;
    close(fd);
    httpc_reply r;
    CHECK(httpc_do(hsock, 0, "GET", "/health", NULL, NULL, &r) == 0);
    CHECK_EQ(r.status, 200);
    httpc_reply_free(&r);
}

/* ---- random bodies ---- */

/* field names of the routes' requests, and strings of their values */
static const char *const body_keys[] = {
    "model", "prompt", "messages", "role", "content", "type", "text", "stop", "stream",
    "stream_options", "include_usage", "temperature", "top_p", "min_p", "top_k", "seed", "n",
    "max_tokens", "max_completion_tokens", "repeat_penalty", "llmsd", "context", "input",
    "encoding_format", "query", "documents", "top_n", "return_documents", "kb", "question",
    "retrieval", "system", "no_qa", "no_qkv"};
static const char *const body_words[] = {
    "", "user", "system", "assistant", "developer", "text", "base64", "float", "rrf", "bm25",
    "http", "kb1", "\xff\xfe", "a\\u0000b"};
static randjson body_gen = {0x2545f4914f6cdd1du, body_keys, sizeof body_keys / sizeof *body_keys,
                            body_words, sizeof body_words / sizeof *body_words};

/* Every route gets its valid body changed at random (fields set to values of any type,
 * in the body or in its first message, or removed) or, one time in eight, a random JSON
 * value: the answer is a status below 500 (503 only while busy), and the daemon stays
 * up. A JSON null read as a string crashed llmsd before. */
static void random_bodies_never_crash(void)
{
    NEED(daemon_up, start_daemon());
    test_random_seed(&body_gen.rng);
    static const char *const paths[] = {"/v1/completions", "/v1/chat/completions",
                                        "/v1/embeddings", "/v1/rerank", "/v1/llmsd/rag",
                                        "/tokenize", "/detokenize"};
    static const char *const valid[] = {
        "{\"prompt\":\"Hi\",\"max_tokens\":2}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":2}",
        "{\"input\":\"Hi\"}", "{\"query\":\"q\",\"documents\":[\"a\",\"b\"]}",
        "{\"kb\":\"kb1\",\"question\":\"q\",\"max_tokens\":2}",
        "{\"content\":\"Hi there\",\"add_special\":true}", "{\"tokens\":[1,2,3]}"};
    int ok = 0, n = 600;
    for (int i = 0; i < n; i++) {
        int route = randjson_pick(&body_gen, 7);
        json_object *body = randjson_pick(&body_gen, 8) ? json_tokener_parse(valid[route])
                                                        : randjson_value(&body_gen, 1);
        for (int k = randjson_pick(&body_gen, 4);
             k > 0 && json_object_is_type(body, json_type_object); k--) {
            json_object *into = body, *msgs;
            if (randjson_pick(&body_gen, 3) == 0 &&
                json_object_object_get_ex(body, "messages", &msgs) &&
                json_object_is_type(msgs, json_type_array) &&
                json_object_is_type(json_object_array_get_idx(msgs, 0), json_type_object))
                into = json_object_array_get_idx(msgs, 0);
            if (randjson_pick(&body_gen, 4) == 0)
                json_object_object_del(into, randjson_key(&body_gen));
            else
                json_object_object_add(into, randjson_key(&body_gen), randjson_value(&body_gen, 1));
        }
        /* bounded generations keep the test short (the window bounds the rest) */
        json_object *mt;
        if (json_object_is_type(body, json_type_object) &&
            json_object_object_get_ex(body, "max_tokens", &mt) &&
            json_object_is_type(mt, json_type_int) && json_object_get_int64(mt) > 8)
            json_object_object_add(body, "max_tokens", json_object_new_int(8));
        const char *text = body ? json_object_to_json_string(body) : "null";
        httpc_reply r;
        int rc = httpc_do(hsock, 0, "POST", paths[route], NULL, text, &r);
        CHECK_MSG(rc == 0, "%s %s: no answer", paths[route], text);
        CHECK_MSG(r.status >= 200 && (r.status < 500 || r.status == 503), "%s %s: %d %s",
                  paths[route], text, r.status, r.body);
        ok += r.status == 200;
        httpc_reply_free(&r);
        json_object_put(body);
    }
    fprintf(stderr, "    %d random bodies: %d answered 200\n", n, ok);
    httpc_reply r;
    CHECK(httpc_do(hsock, 0, "GET", "/health", NULL, NULL, &r) == 0);
    CHECK_EQ(r.status, 200);
    httpc_reply_free(&r);
}

static void tcp_needs_a_token(void)
{
    NEED(daemon_up, start_daemon());
    CHECK(port > 0);
    httpc_reply r;
    const char *body = "{\"prompt\":\"hi\",\"max_tokens\":2}";
    CHECK(httpc_do(NULL, port, "POST", "/v1/completions", NULL, body, &r) == 0);
    CHECK_EQ(r.status, 401);
    CHECK(strstr(r.body, "\"authentication_error\""));
    httpc_reply_free(&r);
    CHECK(httpc_do(NULL, port, "POST", "/v1/completions", "Authorization: Bearer wrong\r\n", body,
                   &r) == 0);
    CHECK_EQ(r.status, 401);
    CHECK(strstr(r.body, "invalid_api_key"));
    httpc_reply_free(&r);
    CHECK(httpc_do(NULL, port, "POST", "/v1/completions", "Authorization: Bearer " TOKEN_USER "\r\n",
                   body, &r) == 0);
    CHECK_EQ(r.status, 200);
    httpc_reply_free(&r);
    /* /health needs no identity; /metrics an admin. */
    CHECK(httpc_do(NULL, port, "GET", "/health", NULL, NULL, &r) == 0);
    CHECK_EQ(r.status, 200);
    httpc_reply_free(&r);
    CHECK(httpc_do(NULL, port, "GET", "/metrics", "Authorization: Bearer " TOKEN_USER "\r\n", NULL,
                   &r) == 0);
    CHECK_EQ(r.status, 403);
    httpc_reply_free(&r);
    CHECK(httpc_do(NULL, port, "GET", "/metrics", "Authorization: Bearer " TOKEN_ADMIN "\r\n", NULL,
                   &r) == 0);
    CHECK_EQ(r.status, 200);
    CHECK(strstr(r.body, "llmsd_sched_steps_total"));
    httpc_reply_free(&r);
}

/* One answer of a kept-alive connection (Content-Length bytes after its head) into buf;
 * its status, 0 when none came whole. */
static int read_answer(int fd, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = '\0';
    for (;;) {
        char *end = strstr(buf, "\r\n\r\n");
        const char *cl = end ? strcasestr(buf, "Content-Length:") : NULL;
        int status;
        if (cl && len >= (size_t)(end + 4 - buf) + strtoul(cl + 15, NULL, 10))
            return sscanf(buf, "HTTP/1.1 %d", &status) == 1 ? status : 0;
        ssize_t n = len + 1 < cap ? recv(fd, buf + len, cap - len - 1, 0) : 0;
        if (n <= 0)
            return 0;
        len += (size_t)n;
        buf[len] = '\0';
    }
}

/* TCP peers are known by their tokens: until a connection's request names one, it counts
 * under http_max_unauthenticated_connections (4 here: a fifth silent one is refused with
 * 429), then under the token's uid; the connection stays open for more requests. */
/* The status of a completion over TCP with token (waiting up to 5 s for want, as a
 * reload is the loop's to handle once the signal arrives). */
static int status_with(const char *token, int want)
{
    char auth[128];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", token);
    int status = -1;
    for (int i = 0; i < 100 && status != want; i++) {
        httpc_reply r;
        if (i)
            usleep(50000);
        if (httpc_do(NULL, port, "POST", "/v1/completions", auth,
                     "{\"prompt\":\"hi\",\"max_tokens\":1}", &r) != 0)
            return -1;
        status = r.status;
        httpc_reply_free(&r);
    }
    return status;
}

/* SIGHUP (systemctl reload) reads http_tokens_file again: a token added is taken
 * without a restart; a file that no longer loads (made readable by others) leaves the
 * tokens in use. Before, SIGHUP's default action ended the daemon. */
static void reload_reads_the_tokens_again(void)
{
    NEED(daemon_up, start_daemon());
    CHECK(port > 0);
    const char *fresh = "tok-fresh-0123456789", *late = "tok-late-0123456789";
    CHECK_EQ(status_with(fresh, 401), 401);
    char path[700];
    proc_fmt(path, sizeof path, "%s/tokens", test_tmpdir());
    FILE *f = fopen(path, "a");
    CHECK(f);
    fprintf(f, "%s %u fresh\n", fresh, (unsigned)getuid());
    fclose(f);
    CHECK_EQ(kill(daemon_.pid, SIGHUP), 0);
    CHECK_EQ(status_with(fresh, 200), 200);
    CHECK_EQ(status_with(TOKEN_USER, 200), 200);
    f = fopen(path, "a");
    CHECK(f);
    fprintf(f, "%s %u late\n", late, (unsigned)getuid());
    fclose(f);
    CHECK_EQ(chmod(path, 0644), 0);
    CHECK_EQ(kill(daemon_.pid, SIGHUP), 0);
    usleep(300000);
    CHECK_EQ(status_with(late, 200), 401);
    CHECK_EQ(status_with(fresh, 200), 200);
    CHECK_EQ(chmod(path, 0600), 0);
    CHECK_EQ(kill(daemon_.pid, 0), 0);
}

static void tcp_connections_count_by_token(void)
{
    NEED(daemon_up, start_daemon());
    int fds[UNAUTH_CONNS];
    char buf[8192];
    for (int i = 0; i < UNAUTH_CONNS; i++)
        CHECK((fds[i] = httpc_connect(NULL, port)) >= 0);
    int extra = httpc_connect(NULL, port);
    CHECK(extra >= 0);
    httpc_reply r;
    CHECK(httpc_read(extra, &r) == 0);
    close(extra);
    CHECK_EQ(r.status, 429);
    CHECK_MSG(strstr(r.body, "http_max_unauthenticated_connections"), "%s", r.body);
    httpc_reply_free(&r);
    const char models[] = "GET /v1/models HTTP/1.1\r\nHost: llmsd\r\n"
                          "Authorization: Bearer " TOKEN_USER "\r\n\r\n";
    CHECK(send(fds[0], models, sizeof models - 1, MSG_NOSIGNAL) == (ssize_t)sizeof models - 1);
    CHECK_EQ(read_answer(fds[0], buf, sizeof buf), 200);
    /* fds[0] counts under the token's uid now: room for one more without a token. */
    extra = httpc_connect(NULL, port);
    CHECK(extra >= 0);
    struct pollfd p = {.fd = extra, .events = POLLIN};
    CHECK_MSG(poll(&p, 1, 100) == 0, "the connection after the token was refused");
    close(extra);
    const char health[] = "GET /health HTTP/1.1\r\nHost: llmsd\r\n\r\n";
    CHECK(send(fds[0], health, sizeof health - 1, MSG_NOSIGNAL) == (ssize_t)sizeof health - 1);
    CHECK_EQ(read_answer(fds[0], buf, sizeof buf), 200);
    for (int i = 0; i < UNAUTH_CONNS; i++)
        close(fds[i]);
}

static void metrics_count_requests(void)
{
    NEED(daemon_up, start_daemon());
    httpc_reply r;
    CHECK(httpc_do(hsock, 0, "GET", "/metrics", NULL, NULL, &r) == 0);
    CHECK_EQ(r.status, 200);
    CHECK(strstr(r.head, "text/plain"));
    const char *want[] = {"llmsd_http_requests_total{route=\"/health\",code=\"200\"}",
                          "llmsd_http_completion_tokens_total ", "llmsd_sched_steps_total ",
                          "llmsd_sched_step_mean_ms ", "llmsd_kv_resident_bytes ",
                          "llmsd_swap_chunks_written_total ", "llmsd_switch_ins_total ",
                          "# TYPE llmsd_http_requests_total counter",
                          "llmsd_http_connections ", "llmsd_http_body_bytes_in_flight 0\n"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        CHECK_MSG(strstr(r.body, want[i]), "no %s in\n%s", want[i], r.body);
    httpc_reply_free(&r);
}

/* A context made natively by the default app is the same app's context over HTTP; another
 * app (a token's) does not see it. */
static void context_field_calls_a_context(void)
{
    NEED(daemon_up, start_daemon());
    llms_conn *c = proc_connect(&daemon_, LLMS_DEFAULT_APP);
    CHECK(c);
    char id[LLMS_ID_MAX];
    CHECK_EQ(llms_context_create(c, "You answer.", NULL, id), LLMS_OK);
    char body[512];
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"ignored\"},{\"role\":\"user\","
             "\"content\":\"first question\"}],\"max_tokens\":4,\"llmsd\":{\"context\":\"%s\"}}",
             id);
    int st;
    json_object *o = post("/v1/chat/completions", body, &st);
    CHECK(o && st == 200);
    CHECK(strcmp(httpc_jstr(o, "llmsd.context"), id) == 0);
    int after_one = atoi(httpc_jstr(o, "llmsd.context_tokens"));
    CHECK(after_one > 0);
    json_object_put(o);
    o = post("/v1/chat/completions", body, &st);
    CHECK(o && st == 200);
    CHECK(atoi(httpc_jstr(o, "llmsd.context_tokens")) > after_one);
    json_object_put(o);
    llms_context_info info;
    CHECK_EQ(llms_context_get(c, id, 1, &info), LLMS_OK);
    /* The system prompt, then two turns of the last user message only. */
    CHECK_EQ(info.n_history, 5);
    CHECK(strcmp(info.history[1].role, "user") == 0);
    CHECK(strcmp(info.history[1].content, "first question") == 0);
    CHECK(strcmp(info.history[3].content, "first question") == 0);
    llms_context_info_free(&info);
    /* The token's app is someone else. */
    httpc_reply r;
    CHECK(httpc_do(NULL, port, "POST", "/v1/chat/completions",
                   "Authorization: Bearer " TOKEN_USER "\r\n", body, &r) == 0);
    CHECK_EQ(r.status, 404);
    httpc_reply_free(&r);
    /* The last message must be the user's. */
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"assistant\",\"content\":\"x\"}],\"llmsd\":{\"context\":\"%s\"}}",
             id);
    o = post("/v1/chat/completions", body, &st);
    CHECK_EQ(st, 400);
    json_object_put(o);
    llms_close(c);
}

/* /v1/llmsd/rag answers from the app's knowledge base as a completion, its "llmsd"
 * object carrying the outcome and the passages: a miss first, then a reuse of the
 * first answer's work (QA bank or QKV prefix) for the same question, equal text; the
 * streamed form ends with the same object; errors are OpenAI-shaped. */
static void rag_route_answers_from_a_knowledge_base(void)
{
    NEED(daemon_up, start_daemon());
    llms_conn *c = proc_connect(&daemon_, LLMS_DEFAULT_APP); /* the gateway's app on the socket */
    CHECK(c);
    llms_kb_doc docs[2] = {
        {"ball", "Lily had a red ball. She played with it in the park every day.", NULL},
        {"apple", "Tom liked to eat apples. His mom gave him a big green apple.", NULL},
    };
    CHECK_EQ(llms_kb_create(c, "notes", 0, 0), LLMS_OK);
    CHECK_EQ(llms_kb_add(c, "notes", docs, 2, NULL), LLMS_OK);
    llms_close(c);
    const char *q = "{\"kb\":\"notes\",\"question\":\"What did Lily play with?\","
                    "\"max_tokens\":8,\"temperature\":0,\"top_k\":2}";
    int st;
    json_object *first = post("/v1/llmsd/rag", q, &st);
    CHECK(first && st == 200);
    CHECK(strcmp(httpc_jstr(first, "object"), "text_completion") == 0);
    CHECK(strcmp(httpc_jstr(first, "llmsd.outcome"), "miss") == 0);
    CHECK(httpc_jstr(first, "llmsd.passages.1.document"));
    json_object *again = post("/v1/llmsd/rag", q, &st);
    CHECK(again && st == 200);
    CHECK(strcmp(httpc_jstr(again, "llmsd.outcome"), "miss") != 0);
    CHECK(strcmp(httpc_jstr(again, "choices.0.text"), httpc_jstr(first, "choices.0.text")) == 0);
    json_object_put(again);
    httpc_reply r;
    CHECK(httpc_do(hsock, 0, "POST", "/v1/llmsd/rag", NULL,
                   "{\"kb\":\"notes\",\"question\":\"What did Lily play with?\","
                   "\"max_tokens\":8,\"temperature\":0,\"top_k\":2,\"stream\":true,"
                   "\"no_qa\":true}", &r) == 0);
    CHECK_EQ(r.status, 200);
    CHECK(strstr(r.body, "\"outcome\":\"qkv_hit\"") && strstr(r.body, "data: [DONE]"));
    httpc_reply_free(&r);
    json_object_put(first);
    json_object *o = post("/v1/llmsd/rag", "{\"kb\":\"none-such\",\"question\":\"x\"}", &st);
    CHECK(o && st == 404 && httpc_jstr(o, "error.message"));
    json_object_put(o);
    o = post("/v1/llmsd/rag", "{\"question\":\"x\"}", &st);
    CHECK(o && st == 400 && strstr(httpc_jstr(o, "error.message"), "'kb'"));
    json_object_put(o);
    o = post("/v1/llmsd/rag", "{\"kb\":\"notes\",\"question\":\"x\",\"retrieval\":\"magic\"}",
             &st);
    CHECK(o && st == 400);
    json_object_put(o);
}

/* A top_k past INT32_MAX is refused as out of range (400), as any other top_k over the
 * limit is, not taken for a negative count of passages by the admission's estimate of
 * the query's KV (which then asked for more than the whole budget). */
static void rag_huge_top_k_is_invalid(void)
{
    NEED(daemon_up, start_daemon());
    llms_conn *c = proc_connect(&daemon_, LLMS_DEFAULT_APP);
    CHECK(c);
    llms_kb_doc doc = {"kite", "Ben flew a yellow kite on the hill.", NULL};
    CHECK_EQ(llms_kb_create(c, "topk", 0, 0), LLMS_OK);
    CHECK_EQ(llms_kb_add(c, "topk", &doc, 1, NULL), LLMS_OK);
    llms_close(c);
    const char *ks[] = {"17", "2147483648", "3000000000", "4294967295"};
    for (size_t i = 0; i < sizeof ks / sizeof *ks; i++) {
        char body[256];
        snprintf(body, sizeof body,
                 "{\"kb\":\"topk\",\"question\":\"What did Ben fly?\",\"max_tokens\":2,"
                 "\"top_k\":%s}", ks[i]);
        int st;
        json_object *o = post("/v1/llmsd/rag", body, &st);
        CHECK_MSG(o && st == 400, "top_k %s: %d %s", ks[i], st,
                  o ? httpc_jstr(o, "error.message") : "");
        json_object_put(o);
    }
}

/* One default app for every client: a knowledge base made with `llms` and no --app is
 * the one the gateway reads without X-Llmsd-App; with $LLMS_APP, llms makes it elsewhere. */
static void cli_kb_is_the_gateways_kb(void)
{
    NEED(daemon_up, start_daemon());
    char llms[1100], doc[700], cmd[4096], out[4096];
    proc_fmt(llms, sizeof llms, "%.1000s", llmsd_path);
    proc_fmt(strrchr(llms, '/') + 1, sizeof llms - (size_t)(strrchr(llms, '/') + 1 - llms), "llms");
    proc_fmt(doc, sizeof doc, "%s/kite.txt", test_tmpdir());
    FILE *f = fopen(doc, "w");
    CHECK(f);
    fputs("Ben flew a yellow kite on the hill. The wind was strong.\n", f);
    fclose(f);
    proc_fmt(cmd, sizeof cmd,
             "unset LLMS_APP; '%s' --socket '%s' kb create cli-notes && '%s' --socket '%s' kb add "
             "cli-notes '%s' && LLMS_APP=elsewhere '%s' --socket '%s' kb create cli-other 2>&1",
             llms, daemon_.sock, llms, daemon_.sock, doc, llms, daemon_.sock);
    CHECK_MSG(test_run_capture(cmd, out, sizeof out) == 0, "%s", out);
    int st;
    json_object *o = post("/v1/llmsd/rag", "{\"kb\":\"cli-notes\",\"question\":\"What did Ben "
                          "fly?\",\"max_tokens\":4,\"temperature\":0,\"top_k\":1}", &st);
    CHECK_MSG(o && st == 200, "status %d", st);
    CHECK(o && httpc_jstr(o, "llmsd.passages.0.document") &&
          strstr(httpc_jstr(o, "llmsd.passages.0.document"), "kite"));
    json_object_put(o);
    o = post("/v1/llmsd/rag", "{\"kb\":\"cli-other\",\"question\":\"x\"}", &st);
    CHECK_MSG(o && st == 404, "status %d", st);
    json_object_put(o);
}

static void rerank_returns_scores(void)
{
    const char *stories = test_data_path("models/stories260K.gguf");
    if (!stories)
        SKIP("needs the shared test data (models/stories260K.gguf)");
    if (!llmsd_path[0])
        SKIP("llmsd is not built in this tree");
    llmsd_proc d;
    char extra[512], sock[700];
    proc_fmt(sock, sizeof sock, "%s/rr-h.sock", test_tmpdir());
    proc_fmt(extra, sizeof extra, "http_socket = %s\nrerank_yes_token = 300\nrerank_no_token = 301\n",
             sock);
    CHECK(proc_start(&d, llmsd_path, "rerank", stories, extra) == 0);
    llms_conn *c = proc_connect(&d, LLMS_DEFAULT_APP);
    CHECK(c);
    const char *docs[] = {"the cat sat", "a dog ran far", "cats like milk"};
    llms_rerank_options opt;
    llms_rerank_options_init(&opt);
    opt.top_k = 2;
    opt.mode = LLMS_RERANK_ORDERED;
    llms_rerank_result want;
    CHECK_EQ(llms_rerank(c, "cat", docs, 3, &opt, &want), LLMS_OK);
    llms_close(c);
    httpc_reply r;
    CHECK(httpc_do(sock, 0, "POST", "/v1/rerank", NULL,
                   "{\"model\":\"stories260K\",\"query\":\"cat\",\"documents\":[\"the cat sat\","
                   "{\"text\":\"a dog ran far\"},\"cats like milk\"],\"top_n\":2,"
                   "\"return_documents\":true}", &r) == 0);
    CHECK_EQ(r.status, 200);
    json_object *o = json_tokener_parse(r.body), *res;
    httpc_reply_free(&r);
    CHECK(o && json_object_object_get_ex(o, "results", &res));
    CHECK_EQ(json_object_array_length(res), 2);
    for (size_t i = 0; i < 2; i++) {
        json_object *h = json_object_array_get_idx(res, i), *v;
        CHECK(json_object_object_get_ex(h, "index", &v));
        CHECK_EQ(json_object_get_int(v), want.hits[i].index);
        CHECK(json_object_object_get_ex(h, "relevance_score", &v));
        CHECK_NEAR(json_object_get_double(v), want.hits[i].score, 1e-6);
        CHECK(json_object_object_get_ex(h, "document", &v));
        CHECK(strcmp(httpc_jstr(v, "text"), docs[want.hits[i].index]) == 0);
    }
    json_object_put(o);
    /* /rerank is the same route (llama.cpp's name). */
    CHECK(httpc_do(sock, 0, "POST", "/rerank", NULL,
                   "{\"query\":\"cat\",\"documents\":[\"a\",\"b\"]}", &r) == 0);
    CHECK_EQ(r.status, 200);
    httpc_reply_free(&r);
    llms_rerank_result_free(&want);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

static bool log_has(const llmsd_proc *d, const char *what)
{
    FILE *f = fopen(d->log, "r");
    char line[1024];
    bool found = false;
    while (f && !found && fgets(line, sizeof line, f))
        found = strstr(line, what) != NULL;
    if (f)
        fclose(f);
    return found;
}

/* A client that leaves mid-stream (or while waiting for a whole reply) cancels its
 * generation, as a closed native connection does. */
static void disconnect_cancels_generation(void)
{
    NEED(slow_up, start_slow());
    char sock[700];
    proc_fmt(sock, sizeof sock, "%s/slow-h.sock", test_tmpdir());
    for (int streamed = 1; streamed >= 0; streamed--) {
        int fd = httpc_connect(sock, 0);
        CHECK(fd >= 0);
        char body[256];
        snprintf(body, sizeof body,
                 "{\"prompt\":\"go on\",\"max_tokens\":4000,\"temperature\":0,\"stream\":%s}",
                 streamed ? "true" : "false");
        CHECK(httpc_send(fd, "POST", "/v1/completions", NULL, body, strlen(body)) == 0);
        if (streamed) {
            char buf[512];
            CHECK(recv(fd, buf, sizeof buf, 0) > 0); /* the reply has begun */
        } else {
            usleep(50000);
        }
        close(fd);
        /* The worker ends the request within a step; the log says how it ended. */
        double deadline = proc_now() + 30;
        int want = streamed ? 1 : 2;
        int seen = 0;
        while (proc_now() < deadline) {
            FILE *f = fopen(slow_daemon.log, "r");
            char line[1024];
            seen = 0;
            while (f && fgets(line, sizeof line, f))
                seen += strstr(line, "kind=complete") && strstr(line, "outcome=STOP_CANCELLED");
            if (f)
                fclose(f);
            if (seen >= want)
                break;
            usleep(20000);
        }
        CHECK_MSG(seen >= want, "no cancelled completion in the log (streamed %d)", streamed);
    }
    CHECK(!log_has(&slow_daemon, "STOP_MAX_TOKENS"));
    httpc_reply r;
    CHECK(httpc_do(sock, 0, "GET", "/metrics", NULL, NULL, &r) == 0);
    CHECK(r.status == 403 || strstr(r.body, "llmsd_http_disconnects_total 2"));
    httpc_reply_free(&r);
}

static void non_loopback_is_refused(void)
{
    if (!llmsd_path[0] || !model_path[0])
        SKIP("llmsd or its model is missing");
    char cmd[4096], out[4096];
    proc_fmt(cmd, sizeof cmd,
             "'%s' --model '%s' --socket '%s/nl.sock' --state_dir '%s/nl' --threads 1 "
             "--http_listen 0.0.0.0:0 2>&1",
             llmsd_path, model_path, test_tmpdir(), test_tmpdir());
    CHECK_EQ(test_run_capture(cmd, out, sizeof out), 1);
    CHECK_MSG(strstr(out, "not a loopback address"), "%s", out);
    proc_fmt(cmd, sizeof cmd,
             "'%s' --model '%s' --socket '%s/nl.sock' --state_dir '%s/nl' --http_listen nonsense 2>&1",
             llmsd_path, model_path, test_tmpdir(), test_tmpdir());
    CHECK_EQ(test_run_capture(cmd, out, sizeof out), 1);
    CHECK_MSG(strstr(out, "http_listen"), "%s", out);
}

int main(int argc, char **argv)
{
    (void)argc;
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    modelgen_params mp = {
        .arch = "llama", .dim = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 128,
        .n_ctx = 512, .type = QTYPE_F32, .seed = 9, .n_vocab = 300, .n_threads = 1,
    };
    proc_generate_model(model_path, sizeof model_path, "http.gguf", &mp);
    modelgen_params slow = mp;
    slow.dim = 256;
    slow.n_layer = 4;
    slow.n_head = 8;
    slow.n_head_kv = 4;
    slow.n_ff = 768;
    slow.n_ctx = 4096;
    slow.type = QTYPE_Q8_0;
    proc_generate_model(slow_model_path, sizeof slow_model_path, "slow.gguf", &slow);
    RUN(health_and_models);
    RUN(one_model_by_id);
    RUN(chat_matches_native_complete);
    RUN(text_parts_join_with_newlines);
    RUN(completion_matches_native);
    RUN(frequency_and_presence_penalties_apply);
    RUN(logit_bias_applies);
    RUN(many_stop_strings_are_taken);
    RUN(native_params_carry_penalties_and_bias);
    RUN(tokenize_and_detokenize_routes);
    RUN(logprobs_chat_and_completion);
    RUN(streamed_equals_whole);
    RUN(streamed_events_end_with_a_blank_line);
    RUN(null_max_completion_tokens_keeps_max_tokens);
    RUN(embeddings_float_and_base64);
    RUN(embedding_dimensions_are_checked);
    RUN(errors_are_openai_shaped);
    RUN(unhonoured_fields_are_refused);
    RUN(too_large_is_400_not_429);
    RUN(malformed_input_never_crashes);
    RUN(random_bodies_never_crash);
    RUN(tcp_needs_a_token);
    RUN(tcp_connections_count_by_token);
    RUN(reload_reads_the_tokens_again);
    RUN(metrics_count_requests);
    RUN(context_field_calls_a_context);
    RUN(rag_route_answers_from_a_knowledge_base);
    RUN(rag_huge_top_k_is_invalid);
    RUN(cli_kb_is_the_gateways_kb);
    RUN(rerank_returns_scores);
    RUN(disconnect_cancels_generation);
    RUN(non_loopback_is_refused);
    if (daemon_up == 1)
        proc_stop(&daemon_, SIGTERM);
    if (slow_up == 1)
        proc_stop(&slow_daemon, SIGTERM);
    return test_finish();
}
