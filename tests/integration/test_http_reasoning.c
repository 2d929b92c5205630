/*
 * A reasoning model's thinking told apart from its answer through the gateway, end to
 * end (daemon/net/reasoning.h): a real llmsd of this build serving a random-weight model
 * on toolmodel.h's synthetic vocabulary (one token per ASCII character) with chatml's
 * specials, "<think>" and "</think>", and a Qwen3-like chat template (qwen3).
 *
 * Its weights are then made to write one reply whatever the prompt: every layer's output
 * projections are zero, so that the residual stream is the current token's embedding
 * and the next token depends on it alone; the tokens of a chain get basis vectors for
 * embeddings and the output's column of each points at the next. After the prompt's
 * last "\n" it writes "<think>" "\nsome" " thought\n" "</think>" "\n\nthe" " answer" and
 * ends with <|im_end|>: reasoning "some thought", content "the answer", on every route,
 * ollama's (which has no grammar or logit_bias) included. A GBNF grammar, with the
 * marker tokens banned or not (logit_bias) and several seeds, makes other replies whose
 * markers come as whole tokens or character by character, so the split is exercised
 * piece by piece as the daemon streams them. The official openai npm client
 * (tests/integration/openai_reasoning.mjs, as test_http_clients installs it) reads the
 * answers too.
 */
#include <fcntl.h>
#include <json-c/json.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/integration/httpc.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/integration/randjson.h"
#include "tests/integration/toolmodel.h"
#include "tests/support/test.h"

/* The test's own tokens (toolmodel.h's extra), from TOOLMODEL_FIRST_EXTRA on */
enum {
    T_IM_START = TOOLMODEL_FIRST_EXTRA,
    T_IM_END,
    T_THINK,
    T_END_THINK,
    T_NL,
    T_SOME,
    T_THOUGHT,
    T_THE,
    T_ANSWER,
    N_EXTRA = T_ANSWER - TOOLMODEL_FIRST_EXTRA + 1,
};
static const toolmodel_token EXTRA[N_EXTRA] = {
    {"<|im_start|>", 3}, {"<|im_end|>", 3},     {"<think>", 4},   {"</think>", 4},
    {"\n", 1},           {"\nsome", 1},         {TOOLMODEL_SP "thought\n", 1},
    {"\n\nthe", 1},      {TOOLMODEL_SP "answer", 1},
};

/* The chain: each token's next one */
static const int CHAIN[][2] = {
    {T_NL, T_THINK},       {T_THINK, T_SOME}, {T_SOME, T_THOUGHT}, {T_THOUGHT, T_END_THINK},
    {T_END_THINK, T_THE},  {T_THE, T_ANSWER}, {T_ANSWER, T_IM_END},
};
#define N_CHAIN ((int)(sizeof CHAIN / sizeof CHAIN[0]))
#define REPLY "<think>\nsome thought\n</think>\n\nthe answer"
#define REPLY_TOKENS 6 /* the end of turn that stops it is not counted */

/* Qwen3-8B's template, its parts that tell it (chatml with the think markers) */
static const char QWEN3_TEMPLATE[] =
    "{%- for message in messages %}{%- if message.role == \"assistant\" %}"
    "{%- if '</think>' in message.content %}"
    "{%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}";

/* The call a reply after its thinking makes, in Qwen's syntax */
#define CALL_TEXT                                                                          \
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"      \
    "</tool_call>"

#define TOKEN "reasoning-test-token-42"

static char llmsd_path[1024], model_path[1024], plain_path[1024], hsock[700];
static llmsd_proc daemon_;
static int daemon_up, port;

#define NEED()                                                                 \
    do {                                                                       \
        if (!llmsd_path[0])                                                    \
            SKIP("llmsd is not built in this tree");                           \
        if (!model_path[0] || !plain_path[0])                                  \
            SKIP("no model could be generated");                               \
        if (!daemon_up)                                                        \
            daemon_up = start_daemon() == 0 ? 1 : -1;                          \
        CHECK_MSG(daemon_up == 1, "llmsd did not start");                      \
    } while (0)

/* The thinking model as the default, and a chatml one without the markers ("plain"); the
 * gateway on TCP too, for the npm client. */
static int start_daemon(void)
{
    char extra[4096], tokens[700];
    proc_fmt(tokens, sizeof tokens, "%s/tokens", test_tmpdir());
    FILE *f = fopen(tokens, "w");
    if (!f || (port = httpc_free_port()) < 0) {
        if (f)
            fclose(f);
        return -1;
    }
    fprintf(f, "%s %u app\n", TOKEN, (unsigned)getuid());
    fclose(f);
    chmod(tokens, 0600);
    proc_fmt(hsock, sizeof hsock, "%s/reasoning-h.sock", test_tmpdir());
    proc_fmt(extra, sizeof extra,
             "http_socket = %s\nhttp_listen = 127.0.0.1:%d\nhttp_tokens_file = %s\n"
             "n_ctx = 2048\nmodel.plain = %s\n", hsock, port, tokens, plain_path);
    return proc_start(&daemon_, llmsd_path, "reasoning", model_path, extra);
}

static json_object *post(const char *path, const char *body, int *status)
{
    return httpc_post_json(hsock, path, body, status);
}

/* Whether the string at path of o is want (false when it is absent). */
static bool is(json_object *o, const char *path, const char *want)
{
    const char *v = o ? httpc_jstr(o, path) : NULL;
    return v && !strcmp(v, want);
}

/* The integer at path of o, -1 when absent. */
static int num(json_object *o, const char *path)
{
    const char *v = o ? httpc_jstr(o, path) : NULL;
    return v ? atoi(v) : -1;
}

/* A chat body of one user message; extra: more fields (or ""). */
static void chat_body(char *out, size_t cap, const char *extra)
{
    snprintf(out, cap, "{\"messages\":[{\"role\":\"user\",\"content\":\"What is 2 + 2?\"}]%s%s}",
             extra[0] ? "," : "", extra);
}

/* text as a GBNF grammar of that one sentence, as a JSON string: "root ::= \"...\"". */
static char *grammar_json(const char *text)
{
    char g[1024];
    size_t n = (size_t)snprintf(g, sizeof g, "root ::= \"");
    for (const char *p = text; *p && n + 4 < sizeof g; p++) {
        if (*p == '\n')
            n += (size_t)snprintf(g + n, sizeof g - n, "\\n");
        else if (*p == '"' || *p == '\\')
            n += (size_t)snprintf(g + n, sizeof g - n, "\\%c", *p);
        else
            g[n++] = *p;
    }
    snprintf(g + n, sizeof g - n, "\"");
    json_object *s = json_object_new_string(g);
    char *out = strdup(json_object_to_json_string(s));
    json_object_put(s);
    return out;
}

/* A reply's reasoning and content, gathered from a whole answer or a stream. */
typedef struct split {
    char reasoning[1024], content[1024];
    int reasoning_events, content_events, both;
    bool has_reasoning_key, content_null, done;
    char finish[32];
    json_object *calls; /* the last tool_calls seen */
} split;

static void append(char *to, const char *s)
{
    if (s)
        strncat(to, s, 1023 - strlen(to));
}

/* The SSE events of a chat stream gathered into sp. */
static void gather_chat_stream(char *body, split *sp)
{
    memset(sp, 0, sizeof *sp);
    char *save;
    for (char *line = strtok_r(body, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (!strcmp(line, "data: [DONE]")) {
            sp->done = true;
            continue;
        }
        if (strncmp(line, "data: {", 7) != 0)
            continue;
        json_object *o = json_tokener_parse(line + 6), *calls;
        const char *r = httpc_jstr(o, "choices.0.delta.reasoning_content");
        const char *c = httpc_jstr(o, "choices.0.delta.content");
        const char *f = httpc_jstr(o, "choices.0.finish_reason");
        append(sp->reasoning, r);
        append(sp->content, c);
        sp->reasoning_events += r && r[0];
        sp->content_events += c && c[0];
        sp->both += r && c && c[0];
        if (f)
            snprintf(sp->finish, sizeof sp->finish, "%s", f);
        if ((calls = httpc_jget(o, "choices.0.delta.tool_calls"))) {
            json_object_put(sp->calls);
            sp->calls = json_object_get(calls);
        }
        json_object_put(o);
    }
}

/* A whole chat answer's message into sp; false (after a failed check) on a bad answer. */
static bool gather_chat(json_object *o, split *sp)
{
    memset(sp, 0, sizeof *sp);
    json_object *msg = httpc_jget(o, "choices.0.message"), *v;
    if (!msg)
        return false;
    sp->has_reasoning_key = json_object_object_get_ex(msg, "reasoning_content", &v);
    append(sp->reasoning, v ? json_object_get_string(v) : NULL);
    sp->content_null = json_object_object_get_ex(msg, "content", &v) && !v;
    append(sp->content, v ? json_object_get_string(v) : NULL);
    if ((v = httpc_jget(msg, "tool_calls")))
        sp->calls = json_object_get(v);
    snprintf(sp->finish, sizeof sp->finish, "%s", httpc_jstr(o, "choices.0.finish_reason"));
    return true;
}

static void chat_whole_answer(void)
{
    NEED();
    char body[1024];
    chat_body(body, sizeof body, "\"max_tokens\":32");
    int st;
    json_object *o = post("/v1/chat/completions", body, &st);
    split sp;
    CHECK_MSG(o && st == 200 && gather_chat(o, &sp), "%d", st);
    CHECK_MSG(!strcmp(sp.reasoning, "some thought") && !strcmp(sp.content, "the answer"),
              "%s", json_object_to_json_string(o));
    CHECK(!strcmp(sp.finish, "stop"));
    /* reasoning tokens are completion tokens */
    CHECK_EQ(num(o, "usage.completion_tokens"), REPLY_TOKENS);
    CHECK(!httpc_jget(o, "usage.completion_tokens_details"));
    json_object_put(o);
    /* each of several choices is split on its own */
    chat_body(body, sizeof body, "\"max_tokens\":32,\"n\":2");
    o = post("/v1/chat/completions", body, &st);
    CHECK(o && st == 200);
    for (int i = 0; i < 2; i++) {
        char key[64];
        snprintf(key, sizeof key, "choices.%d.message.reasoning_content", i);
        CHECK_MSG(httpc_jstr(o, key) && !strcmp(httpc_jstr(o, key), "some thought"), "%s",
                  json_object_to_json_string(o));
    }
    json_object_put(o);
}

static void chat_streamed_answer(void)
{
    NEED();
    for (int n = 1; n <= 2; n++) {
        char body[1024], extra[128];
        snprintf(extra, sizeof extra, "\"max_tokens\":32,\"stream\":true,\"n\":%d", n);
        chat_body(body, sizeof body, extra);
        httpc_reply r;
        CHECK(httpc_do(hsock, 0, "POST", "/v1/chat/completions", NULL, body, &r) == 0);
        CHECK_EQ(r.status, 200);
        split sp;
        gather_chat_stream(r.body, &sp);
        httpc_reply_free(&r);
        /* n choices' deltas add up: each choice streams the same reply */
        char want_r[256] = "", want_c[256] = "";
        for (int i = 0; i < n; i++) {
            strcat(want_r, "some thought");
            strcat(want_c, "the answer");
        }
        if (n == 1) {
            CHECK_MSG(!strcmp(sp.reasoning, want_r) && !strcmp(sp.content, want_c),
                      "reasoning '%s' content '%s'", sp.reasoning, sp.content);
        } else {
            CHECK_EQ(strlen(sp.reasoning), strlen(want_r));
            CHECK_EQ(strlen(sp.content), strlen(want_c));
        }
        /* the reasoning comes piece by piece, never in the content's events */
        CHECK_MSG(sp.reasoning_events >= 2 * n, "%d reasoning events", sp.reasoning_events);
        CHECK_EQ(sp.both, 0);
        CHECK(sp.done && !strcmp(sp.finish, "stop"));
    }
}

/* Replies a grammar makes, their markers as whole tokens or spelled out (the marker
 * tokens banned), at several seeds: the same split whole and streamed. */
static void grammar_replies_split_piece_by_piece(void)
{
    NEED();
    char *g = grammar_json("<think>\nI add 2 and 2.\n</think>\n\nIt is 4.");
    static const char *const bans[] = {"", ",\"logit_bias\":{\"101\":-100}",
                                       ",\"logit_bias\":{\"102\":-100}",
                                       ",\"logit_bias\":{\"101\":-100,\"102\":-100}"};
    for (size_t b = 0; b < 4; b++)
        for (int seed = 0; seed < 3; seed++)
            for (int stream = 0; stream < 2; stream++) {
                char body[2048], extra[1536];
                snprintf(extra, sizeof extra, "\"max_tokens\":64,\"seed\":%d,\"temperature\":1,"
                         "\"stream\":%s,\"grammar\":%s%s", seed, stream ? "true" : "false", g,
                         bans[b]);
                chat_body(body, sizeof body, extra);
                httpc_reply r;
                CHECK(httpc_do(hsock, 0, "POST", "/v1/chat/completions", NULL, body, &r) == 0);
                CHECK_MSG(r.status == 200, "%d %s", r.status, r.body);
                split sp;
                if (stream) {
                    gather_chat_stream(r.body, &sp);
                } else {
                    json_object *o = json_tokener_parse(r.body);
                    CHECK(gather_chat(o, &sp));
                    json_object_put(o);
                }
                httpc_reply_free(&r);
                CHECK_MSG(!strcmp(sp.reasoning, "I add 2 and 2.") && !strcmp(sp.content, "It is 4."),
                          "ban %zu seed %d stream %d: reasoning '%s' content '%s'", b, seed,
                          stream, sp.reasoning, sp.content);
                CHECK(!strcmp(sp.finish, "stop"));
            }
    free(g);
}

/* Qwen3 writes its calls after "</think>": they are read in the content only. */
static void tool_call_after_the_thinking(void)
{
    NEED();
    char *g = grammar_json("<think>\nI will call it.\n</think>\n\n" CALL_TEXT);
    for (int stream = 0; stream < 2; stream++) {
        char body[4096], extra[3072];
        snprintf(extra, sizeof extra, "\"max_tokens\":200,\"temperature\":0,\"stream\":%s,"
                 "\"grammar\":%s,\"tools\":[%s]", stream ? "true" : "false", g,
                 toolmodel_weather_tool);
        chat_body(body, sizeof body, extra);
        httpc_reply r;
        CHECK(httpc_do(hsock, 0, "POST", "/v1/chat/completions", NULL, body, &r) == 0);
        CHECK_MSG(r.status == 200, "%d %s", r.status, r.body);
        split sp;
        if (stream) {
            gather_chat_stream(r.body, &sp);
        } else {
            json_object *o = json_tokener_parse(r.body);
            CHECK(gather_chat(o, &sp));
            json_object_put(o);
            CHECK(sp.content_null);
        }
        httpc_reply_free(&r);
        CHECK_MSG(!strcmp(sp.reasoning, "I will call it.") && !sp.content[0],
                  "reasoning '%s' content '%s'", sp.reasoning, sp.content);
        CHECK(!strcmp(sp.finish, "tool_calls"));
        CHECK_MSG(sp.calls && json_object_array_length(sp.calls) == 1 &&
                      is(sp.calls, "0.function.name", "get_weather") &&
                      is(sp.calls, "0.function.arguments", "{\"city\":\"Paris\"}"),
                  "%s", sp.calls ? json_object_to_json_string(sp.calls) : "no calls");
        json_object_put(sp.calls);
    }
    free(g);
}

/* The prompt /apply-template gives for body; NULL after a failed check. */
static char *apply_template(const char *body)
{
    int st;
    json_object *o = post("/apply-template", body, &st);
    const char *p = o ? httpc_jstr(o, "prompt") : NULL;
    char *out = p ? strdup(p) : NULL;
    if (st != 200 || !out)
        test_fail(__FILE__, __LINE__, "/apply-template: %d %s", st,
                  o ? json_object_to_json_string(o) : "");
    json_object_put(o);
    return out;
}

/* /tokenize's count of text as a prompt (BOS and specials). */
static int token_count(const char *text)
{
    json_object *req = json_object_new_object();
    json_object_object_add(req, "content", json_object_new_string(text));
    json_object_object_add(req, "add_special", json_object_new_boolean(1));
    int st;
    json_object *t = post("/tokenize", json_object_to_json_string(req), &st);
    json_object_put(req);
    int n = st == 200 && t ? num(t, "count") : -1;
    json_object_put(t);
    return n;
}

static bool ends_with(const char *s, const char *end)
{
    size_t n = strlen(s), k = strlen(end);
    return n >= k && !strcmp(s + n - k, end);
}

/* chat_template_kwargs.enable_thinking false: the generation prompt closes an empty
 * block, on the chat and Responses routes; an earlier reply's reasoning is dropped. */
static void enable_thinking_false_renders_the_empty_block(void)
{
    NEED();
    char body[1024];
    chat_body(body, sizeof body, "");
    char *on = apply_template(body);
    chat_body(body, sizeof body, "\"chat_template_kwargs\":{\"enable_thinking\":false}");
    char *off = apply_template(body);
    CHECK(on && off);
    CHECK_MSG(ends_with(on, "<|im_start|>assistant\n"), "%s", on);
    CHECK_MSG(ends_with(off, "<|im_start|>assistant\n<think>\n\n</think>\n\n"), "%s", off);
    chat_body(body, sizeof body, "\"chat_template_kwargs\":{\"enable_thinking\":true,\"x\":1}");
    char *on2 = apply_template(body);
    CHECK(on2 && !strcmp(on, on2));
    /* the chat evaluates that prompt */
    int want = token_count(off), st;
    chat_body(body, sizeof body, "\"max_tokens\":1,\"chat_template_kwargs\":{\"enable_thinking\":false}");
    json_object *o = post("/v1/chat/completions", body, &st);
    CHECK_MSG(o && st == 200, "%d", st);
    CHECK_EQ(num(o, "usage.prompt_tokens"), want);
    json_object_put(o);
    o = post("/v1/responses",
             "{\"input\":\"What is 2 + 2?\",\"max_output_tokens\":1,"
             "\"chat_template_kwargs\":{\"enable_thinking\":false}}", &st);
    CHECK_MSG(o && st == 200, "%d %s", st, o ? json_object_to_json_string(o) : "");
    CHECK_EQ(num(o, "usage.input_tokens"), want);
    json_object_put(o);
    /* the history as Qwen3's template writes it: the earlier reply without its reasoning */
    char *hist = apply_template(
        "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":"
        "\"<think>\\nGreet.\\n</think>\\n\\nHello!\"},{\"role\":\"user\",\"content\":\"2 + 2?\"}]}");
    CHECK_MSG(hist && strstr(hist, "<|im_start|>assistant\nHello!<|im_end|>\n") &&
                  !strstr(hist, "Greet"), "%s", hist ? hist : "");
    /* refused as the field says */
    static const char *const bad[] = {"\"chat_template_kwargs\":7",
                                      "\"chat_template_kwargs\":{\"enable_thinking\":\"no\"}"};
    for (size_t i = 0; i < 2; i++) {
        chat_body(body, sizeof body, bad[i]);
        o = post("/v1/chat/completions", body, &st);
        const char *m = o ? httpc_jstr(o, "error.message") : NULL;
        CHECK_MSG(st == 400 && m && strstr(m, "chat_template_kwargs"), "%d %s", st, m ? m : "");
        json_object_put(o);
    }
    free(on);
    free(on2);
    free(off);
    free(hist);
}

/* llama.cpp's reasoning_format: "none" keeps the thinking in the content. */
static void reasoning_format_none_keeps_the_text_whole(void)
{
    NEED();
    char body[1024];
    int st;
    for (int stream = 0; stream < 2; stream++) {
        chat_body(body, sizeof body, stream ? "\"reasoning_format\":\"none\",\"stream\":true"
                                            : "\"reasoning_format\":\"none\"");
        httpc_reply r;
        CHECK(httpc_do(hsock, 0, "POST", "/v1/chat/completions", NULL, body, &r) == 0);
        CHECK_EQ(r.status, 200);
        split sp;
        if (stream) {
            gather_chat_stream(r.body, &sp);
        } else {
            json_object *o = json_tokener_parse(r.body);
            CHECK(gather_chat(o, &sp));
            json_object_put(o);
            CHECK(!sp.has_reasoning_key);
        }
        httpc_reply_free(&r);
        CHECK_MSG(!strcmp(sp.content, REPLY) && !sp.reasoning[0], "'%s'", sp.content);
    }
    /* "deepseek" and "auto" tell it apart, as the default does */
    static const char *const apart[] = {"deepseek", "auto"};
    for (size_t i = 0; i < 2; i++) {
        char extra[64];
        snprintf(extra, sizeof extra, "\"reasoning_format\":\"%s\"", apart[i]);
        chat_body(body, sizeof body, extra);
        json_object *o = post("/v1/chat/completions", body, &st);
        CHECK(o && st == 200);
        CHECK(is(o, "choices.0.message.reasoning_content", "some thought"));
        json_object_put(o);
    }
    chat_body(body, sizeof body, "\"reasoning_format\":\"deepseek-legacy\"");
    json_object *o = post("/v1/chat/completions", body, &st);
    const char *m = o ? httpc_jstr(o, "error.message") : NULL;
    CHECK_MSG(st == 400 && m && strstr(m, "reasoning_format"), "%d %s", st, m ? m : "");
    json_object_put(o);
}

/* The Responses API: a reasoning item before the message, whole and streamed, as the
 * SDK's ResponseReasoningItem and reasoning events have it. */
static void responses_reasoning_item(void)
{
    NEED();
    int st;
    json_object *o = post("/v1/responses", "{\"input\":\"What is 2 + 2?\"}", &st);
    CHECK_MSG(o && st == 200, "%d", st);
    CHECK_MSG(is(o, "output.0.type", "reasoning") &&
                  httpc_jstr(o, "output.0.id") && !strncmp(httpc_jstr(o, "output.0.id"), "rs_", 3) &&
                  json_object_array_length(httpc_jget(o, "output.0.summary")) == 0 &&
                  is(o, "output.0.content.0.type", "reasoning_text") &&
                  is(o, "output.0.content.0.text", "some thought") &&
                  is(o, "output.0.status", "completed"),
              "%s", json_object_to_json_string(o));
    CHECK(is(o, "output.1.type", "message"));
    CHECK(is(o, "output.1.content.0.text", "the answer"));
    CHECK(!httpc_jget(o, "output.2"));
    /* no exact count of the reasoning tokens: none given rather than a guess */
    CHECK(httpc_jget(o, "usage.output_tokens_details") &&
          !httpc_jget(o, "usage.output_tokens_details.reasoning_tokens"));
    CHECK_EQ(num(o, "usage.output_tokens"), REPLY_TOKENS);
    /* the items sent back as input, as the SDK's clients do */
    json_object *req = json_object_new_object(), *in = json_object_new_array();
    json_object *u = json_object_new_object();
    json_object_object_add(u, "role", json_object_new_string("user"));
    json_object_object_add(u, "content", json_object_new_string("What is 2 + 2?"));
    json_object_array_add(in, u);
    json_object_array_add(in, json_object_get(httpc_jget(o, "output.0")));
    json_object_array_add(in, json_object_get(httpc_jget(o, "output.1")));
    u = json_object_new_object();
    json_object_object_add(u, "role", json_object_new_string("user"));
    json_object_object_add(u, "content", json_object_new_string("And 3 + 3?"));
    json_object_array_add(in, u);
    json_object_object_add(req, "input", in);
    json_object_object_add(req, "max_output_tokens", json_object_new_int(1));
    json_object_put(o);
    o = post("/v1/responses", json_object_to_json_string(req), &st);
    CHECK_MSG(o && st == 200, "%d %s", st, o ? json_object_to_json_string(o) : "");
    json_object_put(o);
    json_object_put(req);

    httpc_reply r;
    CHECK(httpc_do(hsock, 0, "POST", "/v1/responses", NULL,
                   "{\"input\":\"What is 2 + 2?\",\"stream\":true}", &r) == 0);
    CHECK_EQ(r.status, 200);
    char reasoning[1024] = "", text[1024] = "", *save, *done_text = NULL, *item_id = NULL;
    int deltas = 0, seq = -1, added = 0, item_done = 0;
    bool order_ok = true, completed = false;
    for (char *line = strtok_r(r.body, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (strncmp(line, "data: ", 6) != 0)
            continue;
        json_object *e = json_tokener_parse(line + 6);
        const char *type = httpc_jstr(e, "type") ? httpc_jstr(e, "type") : "";
        int s = num(e, "sequence_number");
        order_ok &= s == seq + 1;
        seq = s;
        if (!strcmp(type, "response.output_item.added")) {
            if (is(e, "item.type", "reasoning")) {
                order_ok &= num(e, "output_index") == 0 &&
                            is(e, "item.status", "in_progress");
                free(item_id);
                item_id = strdup(httpc_jstr(e, "item.id") ? httpc_jstr(e, "item.id") : "");
            } else {
                order_ok &= num(e, "output_index") == 1 && item_done == 1;
            }
            added++;
        } else if (!strcmp(type, "response.reasoning.delta")) {
            order_ok &= item_id && is(e, "item_id", item_id) &&
                        num(e, "output_index") == 0 &&
                        num(e, "content_index") == 0 && !text[0];
            append(reasoning, httpc_jstr(e, "delta"));
            deltas++;
        } else if (!strcmp(type, "response.reasoning.done")) {
            free(done_text);
            done_text = strdup(httpc_jstr(e, "text") ? httpc_jstr(e, "text") : "");
        } else if (!strcmp(type, "response.output_item.done") &&
                   is(e, "item.type", "reasoning")) {
            order_ok &= is(e, "item.content.0.text", "some thought") &&
                        is(e, "item.status", "completed");
            item_done++;
        } else if (!strcmp(type, "response.output_text.delta")) {
            order_ok &= num(e, "output_index") == 1;
            append(text, httpc_jstr(e, "delta"));
        } else if (!strcmp(type, "response.completed")) {
            completed = is(e, "response.output.0.type", "reasoning") &&
                        is(e, "response.output.1.content.0.text", "the answer");
        }
        json_object_put(e);
    }
    httpc_reply_free(&r);
    CHECK_MSG(!strcmp(reasoning, "some thought") && deltas >= 2, "'%s' in %d", reasoning, deltas);
    CHECK(done_text && !strcmp(done_text, "some thought"));
    CHECK_MSG(!strcmp(text, "the answer"), "'%s'", text);
    CHECK(order_ok && added == 2 && item_done == 1 && completed);
    free(done_text);
    free(item_id);
}

/* An ollama answer (whole) or the lines of a stream gathered: thinking, content (chat's
 * message or generate's response), whether a thinking key came. */
static void gather_ollama(const char *path, char *body, bool stream, split *sp)
{
    memset(sp, 0, sizeof *sp);
    bool chat = !strcmp(path, "/api/chat");
    const char *tk = chat ? "message.thinking" : "thinking";
    const char *ck = chat ? "message.content" : "response";
    char *save;
    for (char *line = strtok_r(body, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        json_object *o = json_tokener_parse(line);
        const char *t = httpc_jstr(o, tk);
        sp->has_reasoning_key |= t != NULL;
        append(sp->reasoning, t);
        append(sp->content, httpc_jstr(o, ck));
        sp->reasoning_events += t && t[0];
        sp->done |= httpc_jget(o, "done") && json_object_get_boolean(httpc_jget(o, "done"));
        if (httpc_jget(o, "prompt_eval_count"))
            sp->both = num(o, "prompt_eval_count");
        json_object_put(o);
        if (!stream)
            break;
    }
}

/* ollama's think: true or absent separate the thinking (a thinking model thinks by
 * default, as current ollama has it), false renders the template's switch off and
 * separates nothing. */
static void ollama_think(void)
{
    NEED();
    static const char *const paths[] = {"/api/chat", "/api/generate"};
    static const char *const thinks[] = {"", ",\"think\":true", ",\"think\":false"};
    for (int p = 0; p < 2; p++)
        for (int t = 0; t < 3; t++)
            for (int stream = 0; stream < 2; stream++) {
                char body[1024];
                snprintf(body, sizeof body, "{%s%s,\"stream\":%s}",
                         p ? "\"prompt\":\"What is 2 + 2?\""
                           : "\"messages\":[{\"role\":\"user\",\"content\":\"What is 2 + 2?\"}]",
                         thinks[t], stream ? "true" : "false");
                httpc_reply r;
                CHECK(httpc_do(hsock, 0, "POST", paths[p], NULL, body, &r) == 0);
                CHECK_MSG(r.status == 200, "%s %s: %d %s", paths[p], body, r.status, r.body);
                split sp;
                gather_ollama(paths[p], r.body, stream, &sp);
                httpc_reply_free(&r);
                if (t < 2) {
                    CHECK_MSG(!strcmp(sp.reasoning, "some thought") &&
                                  !strcmp(sp.content, "the answer"),
                              "%s %s: thinking '%s' content '%s'", paths[p], body, sp.reasoning,
                              sp.content);
                    CHECK(!stream || sp.reasoning_events >= 2);
                } else {
                    CHECK_MSG(!sp.has_reasoning_key && !strcmp(sp.content, REPLY),
                              "%s %s: content '%s'", paths[p], body, sp.content);
                }
                CHECK(sp.done);
            }
    /* think false: the prompt closes an empty block (the same on both routes) */
    char *on = apply_template("{\"messages\":[{\"role\":\"user\",\"content\":\"What is 2 + 2?\"}]}");
    char *off = apply_template("{\"messages\":[{\"role\":\"user\",\"content\":\"What is 2 + 2?\"}],"
                               "\"chat_template_kwargs\":{\"enable_thinking\":false}}");
    int want[2] = {on ? token_count(on) : -1, off ? token_count(off) : -1};
    for (int p = 0; p < 2; p++)
        for (int t = 1; t < 3; t++) {
            char body[1024];
            snprintf(body, sizeof body, "{%s%s,\"stream\":false,\"options\":{\"num_predict\":1}}",
                     p ? "\"prompt\":\"What is 2 + 2?\""
                       : "\"messages\":[{\"role\":\"user\",\"content\":\"What is 2 + 2?\"}]",
                     thinks[t]);
            httpc_reply r;
            CHECK(httpc_do(hsock, 0, "POST", paths[p], NULL, body, &r) == 0);
            CHECK_EQ(r.status, 200);
            split sp;
            gather_ollama(paths[p], r.body, false, &sp);
            httpc_reply_free(&r);
            CHECK_MSG(sp.both == want[t - 1], "%s %s: %d prompt tokens, %d expected", paths[p],
                      body, sp.both, want[t - 1]);
        }
    free(on);
    free(off);
    /* a model that does not think cannot be asked to; a level is gpt-oss's alone */
    static const struct {
        const char *path, *body, *says;
    } bad[] = {
        {"/api/chat", "{\"model\":\"plain\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                      "\"think\":true}", "\"plain\" does not support thinking"},
        {"/api/generate", "{\"model\":\"plain\",\"prompt\":\"x\",\"think\":true}",
         "\"plain\" does not support thinking"},
        {"/api/chat", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"think\":\"high\"}",
         "think value \"high\" is not supported for this model"},
        {"/api/chat", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"think\":7}", "think"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int st;
        json_object *o = post(bad[i].path, bad[i].body, &st);
        const char *m = o ? httpc_jstr(o, "error") : NULL;
        CHECK_MSG(st == 400 && m && strstr(m, bad[i].says), "%s: %d %s", bad[i].body, st,
                  m ? m : "");
        json_object_put(o);
    }
    /* the model without the markers answers as ever, think false or absent */
    int st;
    json_object *o = post("/api/chat", "{\"model\":\"plain\",\"messages\":[{\"role\":\"user\","
                                       "\"content\":\"x\"}],\"think\":false,\"stream\":false,"
                                       "\"options\":{\"num_predict\":2}}", &st);
    CHECK(o && st == 200 && !httpc_jget(o, "message.thinking"));
    json_object_put(o);
    /* /api/show says which models think */
    o = post("/api/show", "{\"model\":\"reasoning\"}", &st);
    bool can_think = false;
    json_object *caps = o ? httpc_jget(o, "capabilities") : NULL;
    for (size_t i = 0; caps && i < json_object_array_length(caps); i++)
        can_think |= !strcmp(json_object_get_string(json_object_array_get_idx(caps, i)),
                             "thinking");
    CHECK_MSG(st == 200 && can_think, "%d %s", st, o ? json_object_to_json_string(o) : "");
    json_object_put(o);
    o = post("/api/show", "{\"model\":\"plain\"}", &st);
    CHECK(st == 200 && o && !strstr(json_object_to_json_string(o), "\"thinking\""));
    json_object_put(o);
}

/* A raw completion is no chat: its text is left whole, as llama.cpp leaves it. */
static void completion_routes_are_not_split(void)
{
    NEED();
    int st;
    json_object *o = post("/completion", "{\"prompt\":\"<|im_start|>user\\nHi<|im_end|>\\n"
                                         "<|im_start|>assistant\\n\",\"n_predict\":32}", &st);
    CHECK_MSG(o && st == 200 && is(o, "content", REPLY), "%d %s", st,
              o ? json_object_to_json_string(o) : "");
    json_object_put(o);
    o = post("/v1/completions", "{\"prompt\":\"Hi\\n\",\"max_tokens\":32}", &st);
    CHECK_MSG(o && st == 200 && is(o, "choices.0.text", REPLY), "%d %s", st,
              o ? json_object_to_json_string(o) : "");
    json_object_put(o);
}

/* The official openai npm client (installed as test_http_clients installs it, into
 * BUILD/npm-openai) reads reasoning_content and the Responses reasoning item, whole and
 * streamed, its stream helper building the response from the events. */
static void openai_npm_client_reads_the_reasoning(void)
{
    char cmd[4096], out[8192], dir[1100];
    if (test_run_capture("command -v node >/dev/null && command -v npm >/dev/null", out,
                         sizeof out) != 0)
        SKIP("node/npm are not installed: the openai npm client test cannot run");
    NEED();
    const char *script = "tests/integration/openai_reasoning.mjs";
    if (access(script, R_OK) != 0)
        SKIP("%s is not here (run from the source tree)", script);
    /* BUILD/tests/integration/../../llmsd */
    proc_fmt(dir, sizeof dir, "%.*s/npm-openai", (int)(strlen(llmsd_path) - 7), llmsd_path);
    proc_fmt(cmd, sizeof cmd, "test -f '%s/node_modules/openai/package.json' || (mkdir -p '%s' "
             "&& cd '%s' && timeout 300 npm install --no-audit --no-fund --loglevel=error "
             "openai@4 >npm-install.log 2>&1)", dir, dir, dir);
    if (test_run_capture(cmd, out, sizeof out) != 0)
        SKIP("npm install openai failed (no registry?): see %s/npm-install.log", dir);
    proc_fmt(cmd, sizeof cmd,
             "cp '%s' '%s/openai_reasoning.mjs' && cd '%s' && LLMSD_URL=http://127.0.0.1:%d/v1 "
             "LLMSD_TOKEN=" TOKEN " LLMSD_MODEL=reasoning timeout 120 node openai_reasoning.mjs "
             "2>&1", script, dir, dir, port);
    int rc = test_run_capture(cmd, out, sizeof out);
    fputs(out, stdout);
    CHECK_MSG(rc == 0, "the openai client test failed (status %d)", rc);
    CHECK(strstr(out, "ok responses stream"));
}

/* Mutated bodies with the reasoning fields on every route that reads them: never a 5xx
 * but 503. */
static void random_bodies_never_5xx(void)
{
    NEED();
    static const char *const keys[] = {
        "chat_template_kwargs", "enable_thinking", "reasoning_format", "think", "stream",
        "messages", "input", "prompt", "max_tokens", "grammar", "tools", "n", "role",
        "content", "options", "max_output_tokens", "reasoning_content",
    };
    static const char *const words[] = {"none", "deepseek", "auto", "high", "<think>",
                                        "</think>", "user", "assistant", "x"};
    randjson rj = {.keys = keys, .n_keys = sizeof keys / sizeof *keys, .words = words,
                   .n_words = sizeof words / sizeof *words};
    rj.rng = 0x7ea5012;
    test_random_seed(&rj.rng);
    static const char *const paths[] = {"/v1/chat/completions", "/v1/responses", "/api/chat",
                                        "/api/generate", "/apply-template"};
    static const char *const valid[] = {
        "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":8,"
        "\"chat_template_kwargs\":{\"enable_thinking\":false},\"reasoning_format\":\"none\"}",
        "{\"input\":\"Hi\",\"max_output_tokens\":8,\"reasoning_format\":\"auto\"}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"think\":true,"
        "\"options\":{\"num_predict\":8}}",
        "{\"prompt\":\"Hi\",\"think\":false,\"options\":{\"num_predict\":8}}",
        "{\"messages\":[{\"role\":\"assistant\",\"content\":\"<think>a</think>b\"}],"
        "\"chat_template_kwargs\":{\"enable_thinking\":true}}",
    };
    int ok = 0, n = 250;
    for (int i = 0; i < n; i++) {
        int route = randjson_pick(&rj, 5);
        json_object *body = json_tokener_parse(valid[route]);
        for (int k = randjson_pick(&rj, 4); k > 0; k--) {
            json_object *into = body, *v;
            if (randjson_pick(&rj, 3) == 0 && json_object_object_get_ex(body, "chat_template_kwargs", &v) &&
                json_object_is_type(v, json_type_object))
                into = v;
            if (randjson_pick(&rj, 4) == 0)
                json_object_object_del(into, randjson_key(&rj));
            else
                json_object_object_add(into, randjson_key(&rj), randjson_value(&rj, 1));
        }
        /* bounded generations keep the test short */
        json_object_object_add(body, "max_tokens", json_object_new_int(8));
        json_object_object_add(body, "max_output_tokens", json_object_new_int(8));
        const char *text = json_object_to_json_string(body);
        httpc_reply r;
        CHECK_MSG(httpc_do(hsock, 0, "POST", paths[route], NULL, text, &r) == 0, "%s %s: no answer",
                  paths[route], text);
        CHECK_MSG(r.status >= 200 && (r.status < 500 || r.status == 503), "%s %s: %d %s",
                  paths[route], text, r.status, r.body);
        ok += r.status == 200;
        httpc_reply_free(&r);
        json_object_put(body);
    }
    fprintf(stderr, "    %d random bodies: %d answered 200\n", n, ok);
}

/* The daemon's reasoning_format = none: the text whole unless a request asks. */
static void daemon_setting_none(void)
{
    if (!llmsd_path[0] || !model_path[0])
        SKIP("no daemon or model");
    llmsd_proc d;
    char sock[700], extra[1024];
    proc_fmt(sock, sizeof sock, "%s/reasoning-none-h.sock", test_tmpdir());
    proc_fmt(extra, sizeof extra, "http_socket = %s\nn_ctx = 2048\nreasoning_format = none\n",
             sock);
    CHECK(proc_start(&d, llmsd_path, "reasoning-none", model_path, extra) == 0);
    int st;
    const char *body = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}";
    json_object *o = httpc_post_json(sock, "/v1/chat/completions", body, &st);
    bool whole = o && st == 200 && is(o, "choices.0.message.content", REPLY) &&
                 !httpc_jget(o, "choices.0.message.reasoning_content");
    json_object_put(o);
    o = httpc_post_json(sock, "/v1/chat/completions",
                        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                        "\"reasoning_format\":\"deepseek\"}", &st);
    bool apart = o && st == 200 &&
                 is(o, "choices.0.message.reasoning_content", "some thought");
    json_object_put(o);
    /* ollama's think: true asks for it all the same */
    o = httpc_post_json(sock, "/api/chat", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                                           "\"stream\":false}", &st);
    bool ollama_whole = o && st == 200 && !httpc_jget(o, "message.thinking");
    json_object_put(o);
    o = httpc_post_json(sock, "/api/chat", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                                           "\"stream\":false,\"think\":true}", &st);
    bool ollama_apart = o && st == 200 && httpc_jstr(o, "message.thinking") &&
                        is(o, "message.thinking", "some thought");
    json_object_put(o);
    int rc = proc_stop(&d, SIGTERM);
    CHECK(whole && apart && ollama_whole && ollama_apart);
    CHECK_EQ(rc, 0);
}

static void daemon_exits_cleanly(void)
{
    proc_check_clean_exit(&daemon_, &daemon_up);
}

int main(int argc, char **argv)
{
    (void)argc;
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    toolmodel_generate("reasoning", "tok3", QWEN3_TEMPLATE, NULL, EXTRA, N_EXTRA, model_path,
                       sizeof model_path);
    if (model_path[0] && toolmodel_make_chain(model_path, CHAIN, N_CHAIN) != 0)
        model_path[0] = '\0';
    toolmodel_generate("plain", "tok3", "{{ '<|im_start|>' }}", NULL, EXTRA, N_EXTRA, plain_path,
                       sizeof plain_path);
    RUN(chat_whole_answer);
    RUN(chat_streamed_answer);
    RUN(grammar_replies_split_piece_by_piece);
    RUN(tool_call_after_the_thinking);
    RUN(enable_thinking_false_renders_the_empty_block);
    RUN(reasoning_format_none_keeps_the_text_whole);
    RUN(responses_reasoning_item);
    RUN(ollama_think);
    RUN(completion_routes_are_not_split);
    RUN(openai_npm_client_reads_the_reasoning);
    RUN(random_bodies_never_5xx);
    RUN(daemon_exits_cleanly);
    RUN(daemon_setting_none);
    return test_finish();
}
