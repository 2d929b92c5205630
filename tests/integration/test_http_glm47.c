/*
 * GLM-4.7's thinking told apart from its answer through the gateway: a real llmsd of this
 * build serving a random-weight model on toolmodel.h's synthetic vocabulary (one token
 * per ASCII character) with "<think>", "</think>" and chatml's "<|im_end|>" (an
 * end-of-generation token by its text) as specials, and a template with GLM-4.7's
 * markers, which llmsd detects as glm-4.7.
 *
 * As in test_http_reasoning, every layer's output projections are zero and the tokens of
 * a chain point each at the next, so the reply depends on the prompt's last token alone.
 * The generation prompt ends with "<think>", which the model follows with "\nsome"
 * " thought\n" "</think>" "\n\nthe" " answer" <|im_end|>: reasoning "some thought",
 * content "the answer", the block opened by the prompt. With enable_thinking false it
 * ends with "</think>", which the model follows with "\n\nthe answer": content, none of
 * it reasoning, as the model answers without thinking after the block the prompt closed.
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
    T_IM_END = TOOLMODEL_FIRST_EXTRA,
    T_THINK,
    T_END_THINK,
    T_SOME,
    T_THOUGHT,
    T_THE,
    T_ANSWER,
    N_EXTRA = T_ANSWER - TOOLMODEL_FIRST_EXTRA + 1,
};
static const toolmodel_token EXTRA[N_EXTRA] = {
    {"<|im_end|>", 3}, {"<think>", 4},   {"</think>", 4},
    {"\nsome", 1},     {TOOLMODEL_SP "thought\n", 1},
    {"\n\nthe", 1},    {TOOLMODEL_SP "answer", 1},
};

static const int CHAIN[][2] = {
    {T_THINK, T_SOME}, {T_SOME, T_THOUGHT}, {T_THOUGHT, T_END_THINK}, {T_END_THINK, T_THE},
    {T_THE, T_ANSWER}, {T_ANSWER, T_IM_END},
};
#define N_CHAIN ((int)(sizeof CHAIN / sizeof CHAIN[0]))

/* GLM-4.7-Flash's template, the parts that tell it: "[gMASK]<sop>", its tool calls'
 * "<arg_key>" and its generation prompt */
static const char GLM47_TEMPLATE[] =
    "[gMASK]<sop>{% for m in messages %}{%- if m.role == 'user' -%}<|user|>"
    "{{ m.content }}{%- endif -%}{% if m.tool_calls %}<arg_key>{{ k }}</arg_key>{% endif %}"
    "{%- endfor -%}{%- if add_generation_prompt -%}<|assistant|>{{- '</think>' if "
    "(enable_thinking is defined and not enable_thinking) else '<think>' -}}{%- endif -%}";

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
    proc_fmt(hsock, sizeof hsock, "%s/glm47-h.sock", test_tmpdir());
    proc_fmt(extra, sizeof extra, "http_socket = %s\nn_ctx = 1024\n", hsock);
    return proc_start(&daemon_, llmsd_path, "glm47", model_path, extra);
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

/* The prompt as glm-4.7 writes it, opening the block or closing it. */
static void prompt_is_glm47s(void)
{
    NEED();
    char body[512];
    int st;
    chat_body(body, sizeof body, "");
    json_object *o = post("/apply-template", body, &st);
    CHECK_MSG(st == 200 && !strcmp(str(o, "prompt"), "[gMASK]<sop><|user|>2 + 2?<|assistant|>"
                                                     "<think>"),
              "%d %s", st, str(o, "prompt"));
    json_object_put(o);
    chat_body(body, sizeof body, "\"chat_template_kwargs\":{\"enable_thinking\":false}");
    o = post("/apply-template", body, &st);
    CHECK_MSG(st == 200 && !strcmp(str(o, "prompt"), "[gMASK]<sop><|user|>2 + 2?<|assistant|>"
                                                     "</think>"),
              "%d %s", st, str(o, "prompt"));
    json_object_put(o);
}

/* The reply begins inside the block the prompt opened. */
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
}

/* With enable_thinking false the prompt closed the block: the reply is content alone,
 * whole and streamed. */
static void reply_after_a_closed_block_is_content(void)
{
    NEED();
    char body[512];
    int st;
    chat_body(body, sizeof body,
              "\"max_tokens\":16,\"chat_template_kwargs\":{\"enable_thinking\":false}");
    json_object *o = post("/v1/chat/completions", body, &st);
    CHECK_MSG(st == 200 && !httpc_jget(o, "choices.0.message.reasoning_content") &&
                  !strcmp(str(o, "choices.0.message.content"), "\n\nthe answer"),
              "%d %s", st, o ? json_object_to_json_string(o) : "");
    json_object_put(o);

    chat_body(body, sizeof body,
              "\"max_tokens\":16,\"stream\":true,\"chat_template_kwargs\":{\"enable_thinking\":"
              "false}");
    httpc_reply r;
    CHECK(httpc_do(hsock, 0, "POST", "/v1/chat/completions", NULL, body, &r) == 0);
    char content[256] = "";
    bool reasoning = false;
    char *save;
    /* the events' lines ("data: {...}"); a content delta's line breaks are escaped */
    for (char *line = strtok_r(r.body, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (strncmp(line, "data: {", 7) != 0)
            continue;
        json_object *ev = json_tokener_parse(line + 6);
        reasoning |= httpc_jget(ev, "choices.0.delta.reasoning_content") != NULL;
        strncat(content, str(ev, "choices.0.delta.content"), sizeof content - 1 - strlen(content));
        json_object_put(ev);
    }
    CHECK_MSG(r.status == 200 && !reasoning && !strcmp(content, "\n\nthe answer"), "%d '%s'",
              r.status, content);
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
    toolmodel_generate("glm47", "tok3", GLM47_TEMPLATE, NULL, EXTRA, N_EXTRA, model_path,
                       sizeof model_path);
    if (model_path[0] && toolmodel_make_chain(model_path, CHAIN, N_CHAIN) != 0)
        model_path[0] = '\0';
    RUN(prompt_is_glm47s);
    RUN(reply_is_reasoning_then_content);
    RUN(reply_after_a_closed_block_is_content);
    RUN(daemon_exits_cleanly);
    return test_finish();
}
