/*
 * GLM-4.5's and GLM-4.6's thinking told apart from their answer through the gateway: a
 * real llmsd of this build serving a random-weight model on toolmodel.h's synthetic
 * vocabulary (one token per ASCII character) with GLM's "[gMASK]", "<sop>", role tokens
 * and think markers as specials, and a template with GLM-4.6's markers, which llmsd
 * detects as glm-4.5.
 *
 * As in test_http_reasoning, every layer's output projections are zero and the tokens of
 * a chain point each at the next, so the reply depends on the prompt's last token alone.
 * The generation prompt ends with "<|assistant|>", which the model follows as GLM-4.5
 * does with "\n" "<think>" "some" " thought" "</think>" "\nthe" " answer" and "<|user|>"
 * (the family's stop text): reasoning "some thought", content "the answer", the block
 * opened by the reply after a line break. With enable_thinking false the prompt ends with
 * the empty block it closes, "</think>", which the model follows with "\nthe answer":
 * content, its line break left out, none of it reasoning.
 */
#include <json-c/json.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/integration/httpc.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/integration/toolmodel.h"
#include "tests/support/test.h"

enum {
    T_GMASK = TOOLMODEL_FIRST_EXTRA,
    T_SOP,
    T_USER,
    T_ASSISTANT,
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
    {"[gMASK]", 3},       {"<sop>", 3},   {"<|user|>", 3},
    {"<|assistant|>", 3}, {"<think>", 4}, {"</think>", 4},
    {"\n", 1},            {"some", 1},    {TOOLMODEL_SP "thought", 1},
    {"\nthe", 1},         {TOOLMODEL_SP "answer", 1},
};

static const int CHAIN[][2] = {
    {T_ASSISTANT, T_NL},      {T_NL, T_THINK},      {T_THINK, T_SOME},  {T_SOME, T_THOUGHT},
    {T_THOUGHT, T_END_THINK}, {T_END_THINK, T_THE}, {T_THE, T_ANSWER}, {T_ANSWER, T_USER},
};
#define N_CHAIN ((int)(sizeof CHAIN / sizeof CHAIN[0]))

/* GLM-4.6's template (llama.cpp's models/templates/GLM-4.6.jinja), the parts that tell
 * it: "[gMASK]<sop>" and the "/nothink" switch */
static const char GLM45_TEMPLATE[] =
    "[gMASK]<sop>{% for m in messages %}{%- if m.role == 'user' -%}<|user|>\n"
    "{{ visible_text(m.content) }}\n{{- '/nothink' if (enable_thinking is defined and not "
    "enable_thinking and not visible_text(m.content).endswith(\"/nothink\")) else '' -}}"
    "{%- endif -%}{%- endfor -%}{%- if add_generation_prompt -%}<|assistant|>{{- "
    "'\\n<think></think>' if (enable_thinking is defined and not enable_thinking) else '' "
    "-}}{%- endif -%}";

static char llmsd_path[1024], model_path[1024], hsock[700];
static llmsd_proc daemon_;
static int daemon_up;

#define NEED()                                                                 \
    do {                                                                       \
        if (!llmsd_path[0])                                                    \
            SKIP("llmsd is not built in this tree");                           \
        if (!model_path[0])                                                    \
            SKIP("no model could be generated");                               \
        if (!daemon_up)                                                        \
            daemon_up = start_daemon() == 0 ? 1 : -1;                          \
        CHECK_MSG(daemon_up == 1, "llmsd did not start");                      \
    } while (0)

static int start_daemon(void)
{
    char extra[1024];
    proc_fmt(hsock, sizeof hsock, "%s/glm45-h.sock", test_tmpdir());
    proc_fmt(extra, sizeof extra, "http_socket = %s\nn_ctx = 1024\n", hsock);
    return proc_start(&daemon_, llmsd_path, "glm45", model_path, extra);
}

static json_object *post(const char *path, const char *body, int *status)
{
    return httpc_post_json(hsock, path, body, status);
}

/* The body of one user message; extra: more fields (or ""). */
static void chat_body(char *out, size_t cap, const char *extra)
{
    snprintf(out, cap, "{\"messages\":[{\"role\":\"user\",\"content\":\"2 + 2?\"}]%s%s}",
             extra[0] ? "," : "", extra);
}

/* The string at path of o, "" when absent. */
static const char *str(json_object *o, const char *path)
{
    const char *v = o ? httpc_jstr(o, path) : NULL;
    return v ? v : "";
}

#define NO_THINKING "\"chat_template_kwargs\":{\"enable_thinking\":false}"

/* The prompt as glm-4.5 writes it, leaving the block to the model or closing an empty
 * one after "/nothink". */
static void prompt_is_glm45s(void)
{
    NEED();
    char body[512];
    int st;
    chat_body(body, sizeof body, "");
    json_object *o = post("/apply-template", body, &st);
    CHECK_MSG(st == 200 && !strcmp(str(o, "prompt"), "[gMASK]<sop><|user|>\n2 + 2?<|assistant|>"),
              "%d %s", st, str(o, "prompt"));
    json_object_put(o);
    chat_body(body, sizeof body, NO_THINKING);
    o = post("/apply-template", body, &st);
    CHECK_MSG(st == 200 && !strcmp(str(o, "prompt"), "[gMASK]<sop><|user|>\n2 + 2?/nothink"
                                                     "<|assistant|>\n<think></think>"),
              "%d %s", st, str(o, "prompt"));
    json_object_put(o);
}

/* A stream's reasoning and content deltas added up. */
static void gather_stream(char *body, char *reasoning, char *content, size_t cap)
{
    char *save;
    reasoning[0] = content[0] = '\0';
    for (char *line = strtok_r(body, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (strncmp(line, "data: {", 7) != 0)
            continue;
        json_object *ev = json_tokener_parse(line + 6);
        strncat(reasoning, str(ev, "choices.0.delta.reasoning_content"),
                cap - 1 - strlen(reasoning));
        strncat(content, str(ev, "choices.0.delta.content"), cap - 1 - strlen(content));
        json_object_put(ev);
    }
}

/* The reply opens its block after a line break: reasoning, then content, whole and
 * streamed; "<|user|>" ends it. */
static void reply_is_reasoning_then_content(void)
{
    NEED();
    char body[512];
    int st;
    chat_body(body, sizeof body, "\"max_tokens\":16");
    json_object *o = post("/v1/chat/completions", body, &st);
    CHECK_MSG(st == 200 && !strcmp(str(o, "choices.0.message.reasoning_content"), "some thought") &&
                  !strcmp(str(o, "choices.0.message.content"), "the answer") &&
                  !strcmp(str(o, "choices.0.finish_reason"), "stop"),
              "%d %s", st, o ? json_object_to_json_string(o) : "");
    json_object_put(o);

    chat_body(body, sizeof body, "\"max_tokens\":16,\"stream\":true");
    httpc_reply r;
    CHECK(httpc_do(hsock, 0, "POST", "/v1/chat/completions", NULL, body, &r) == 0);
    char reasoning[256], content[256];
    gather_stream(r.body, reasoning, content, sizeof content);
    CHECK_MSG(r.status == 200 && !strcmp(reasoning, "some thought") &&
                  !strcmp(content, "the answer"),
              "%d '%s' '%s'", r.status, reasoning, content);
    httpc_reply_free(&r);

    /* ollama's: thinking by default */
    o = post("/api/chat", "{\"messages\":[{\"role\":\"user\",\"content\":\"2 + 2?\"}],"
                          "\"stream\":false}", &st);
    CHECK_MSG(st == 200 && !strcmp(str(o, "message.thinking"), "some thought") &&
                  !strcmp(str(o, "message.content"), "the answer"),
              "%d %s", st, o ? json_object_to_json_string(o) : "");
    json_object_put(o);
}

/* With enable_thinking false the prompt closed an empty block: the reply is content
 * alone, the line break before it left out, whole and streamed. */
static void reply_after_a_closed_block_is_content(void)
{
    NEED();
    char body[512];
    int st;
    chat_body(body, sizeof body, "\"max_tokens\":16," NO_THINKING);
    json_object *o = post("/v1/chat/completions", body, &st);
    CHECK_MSG(st == 200 && !httpc_jget(o, "choices.0.message.reasoning_content") &&
                  !strcmp(str(o, "choices.0.message.content"), "the answer"),
              "%d %s", st, o ? json_object_to_json_string(o) : "");
    json_object_put(o);

    chat_body(body, sizeof body, "\"max_tokens\":16,\"stream\":true," NO_THINKING);
    httpc_reply r;
    CHECK(httpc_do(hsock, 0, "POST", "/v1/chat/completions", NULL, body, &r) == 0);
    char reasoning[256], content[256];
    gather_stream(r.body, reasoning, content, sizeof content);
    CHECK_MSG(r.status == 200 && !reasoning[0] && !strcmp(content, "the answer"),
              "%d '%s' '%s'", r.status, reasoning, content);
    httpc_reply_free(&r);
}

static void daemon_exits_cleanly(void)
{
    proc_check_clean_exit(&daemon_, &daemon_up);
}

int main(int argc, char **argv)
{
    (void)argc;
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    toolmodel_generate("glm45", "tok3", GLM45_TEMPLATE, NULL, EXTRA, N_EXTRA, model_path,
                       sizeof model_path);
    if (model_path[0] && toolmodel_make_chain(model_path, CHAIN, N_CHAIN) != 0)
        model_path[0] = '\0';
    RUN(prompt_is_glm45s);
    RUN(reply_is_reasoning_then_content);
    RUN(reply_after_a_closed_block_is_content);
    RUN(daemon_exits_cleanly);
    return test_finish();
}
