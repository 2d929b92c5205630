/*
 * The thinking of GLM-4.5/4.6 (chat family glm-4.5) and of GLM-4.7 (glm-4.7) told apart
 * from their answer through the gateway: for each, a real llmsd of this build serving a
 * random-weight model on toolmodel.h's synthetic vocabulary (one token per ASCII
 * character) with the family's specials, and a template with the family's markers, which
 * llmsd detects as that family.
 *
 * As in test_http_reasoning, every layer's output projections are zero and the tokens of
 * a chain point each at the next, so the reply depends on the prompt's last token alone.
 *
 * glm-4.5: the generation prompt ends with "<|assistant|>", which the model follows as
 * GLM-4.5 does with "\n" "<think>" "some" " thought" "</think>" "\nthe" " answer" and
 * "<|user|>" (the family's stop text): reasoning "some thought", content "the answer", the
 * block opened by the reply after a line break. With enable_thinking false the prompt ends
 * with the empty block it closes, "</think>", which the model follows with "\nthe answer":
 * content, its line break left out, none of it reasoning.
 *
 * glm-4.7: the generation prompt ends with "<think>", which the model follows with "\nsome"
 * " thought\n" "</think>" "\n\nthe" " answer" <|im_end|> (an end-of-generation token by
 * its text): reasoning "some thought", content "the answer", the block opened by the
 * prompt. With enable_thinking false it ends with "</think>", which the model follows with
 * "\n\nthe answer": content, none of it reasoning, as the model answers without thinking
 * after the block the prompt closed.
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

/* glm-4.5's model */
enum {
    G45_GMASK = TOOLMODEL_FIRST_EXTRA,
    G45_SOP,
    G45_USER,
    G45_ASSISTANT,
    G45_THINK,
    G45_END_THINK,
    G45_NL,
    G45_SOME,
    G45_THOUGHT,
    G45_THE,
    G45_ANSWER,
    G45_N_EXTRA = G45_ANSWER - TOOLMODEL_FIRST_EXTRA + 1,
};
static const toolmodel_token G45_EXTRA[G45_N_EXTRA] = {
    {"[gMASK]", 3},       {"<sop>", 3},   {"<|user|>", 3},
    {"<|assistant|>", 3}, {"<think>", 4}, {"</think>", 4},
    {"\n", 1},            {"some", 1},    {TOOLMODEL_SP "thought", 1},
    {"\nthe", 1},         {TOOLMODEL_SP "answer", 1},
};
static const int G45_CHAIN[][2] = {
    {G45_ASSISTANT, G45_NL},      {G45_NL, G45_THINK},      {G45_THINK, G45_SOME},
    {G45_SOME, G45_THOUGHT},      {G45_THOUGHT, G45_END_THINK}, {G45_END_THINK, G45_THE},
    {G45_THE, G45_ANSWER},        {G45_ANSWER, G45_USER},
};

/* GLM-4.6's template (llama.cpp's models/templates/GLM-4.6.jinja), the parts that tell
 * it: "[gMASK]<sop>" and the "/nothink" switch */
static const char GLM45_TEMPLATE[] =
    "[gMASK]<sop>{% for m in messages %}{%- if m.role == 'user' -%}<|user|>\n"
    "{{ visible_text(m.content) }}\n{{- '/nothink' if (enable_thinking is defined and not "
    "enable_thinking and not visible_text(m.content).endswith(\"/nothink\")) else '' -}}"
    "{%- endif -%}{%- endfor -%}{%- if add_generation_prompt -%}<|assistant|>{{- "
    "'\\n<think></think>' if (enable_thinking is defined and not enable_thinking) else '' "
    "-}}{%- endif -%}";

/* glm-4.7's model */
enum {
    G47_IM_END = TOOLMODEL_FIRST_EXTRA,
    G47_THINK,
    G47_END_THINK,
    G47_SOME,
    G47_THOUGHT,
    G47_THE,
    G47_ANSWER,
    G47_N_EXTRA = G47_ANSWER - TOOLMODEL_FIRST_EXTRA + 1,
};
static const toolmodel_token G47_EXTRA[G47_N_EXTRA] = {
    {"<|im_end|>", 3}, {"<think>", 4},   {"</think>", 4},
    {"\nsome", 1},     {TOOLMODEL_SP "thought\n", 1},
    {"\n\nthe", 1},    {TOOLMODEL_SP "answer", 1},
};
static const int G47_CHAIN[][2] = {
    {G47_THINK, G47_SOME},         {G47_SOME, G47_THOUGHT}, {G47_THOUGHT, G47_END_THINK},
    {G47_END_THINK, G47_THE},      {G47_THE, G47_ANSWER},   {G47_ANSWER, G47_IM_END},
};

/* GLM-4.7-Flash's template, the parts that tell it: "[gMASK]<sop>", its tool calls'
 * "<arg_key>" and its generation prompt */
static const char GLM47_TEMPLATE[] =
    "[gMASK]<sop>{% for m in messages %}{%- if m.role == 'user' -%}<|user|>"
    "{{ m.content }}{%- endif -%}{% if m.tool_calls %}<arg_key>{{ k }}</arg_key>{% endif %}"
    "{%- endfor -%}{%- if add_generation_prompt -%}<|assistant|>{{- '</think>' if "
    "(enable_thinking is defined and not enable_thinking) else '<think>' -}}{%- endif -%}";

/* One family's daemon: started on its first test. */
typedef struct family {
    const char *name;
    char model_path[1024], hsock[700];
    llmsd_proc daemon;
    int up; /* 0 not started yet, 1 running, -1 failed to start */
} family;

static char llmsd_path[1024];
static family glm45 = {.name = "glm45"}, glm47 = {.name = "glm47"};

static int start_daemon(family *f)
{
    char extra[1024];
    proc_fmt(f->hsock, sizeof f->hsock, "%s/%s-h.sock", test_tmpdir(), f->name);
    proc_fmt(extra, sizeof extra, "http_socket = %s\nn_ctx = 1024\n", f->hsock);
    return proc_start(&f->daemon, llmsd_path, f->name, f->model_path, extra);
}

#define NEED(f)                                                                \
    do {                                                                       \
        if (!llmsd_path[0])                                                    \
            SKIP("llmsd is not built in this tree");                           \
        if (!(f)->model_path[0])                                               \
            SKIP("no model could be generated");                               \
        if (!(f)->up)                                                          \
            (f)->up = start_daemon(f) == 0 ? 1 : -1;                           \
        CHECK_MSG((f)->up == 1, "llmsd did not start");                        \
    } while (0)

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

/* A stream's reasoning and content deltas added up (the events' lines "data: {...}"; a
 * delta's line breaks are escaped), and whether any event had a reasoning delta. */
static bool gather_stream(char *body, char *reasoning, char *content, size_t cap)
{
    char *save;
    bool any_reasoning = false;
    reasoning[0] = content[0] = '\0';
    for (char *line = strtok_r(body, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (strncmp(line, "data: {", 7) != 0)
            continue;
        json_object *ev = json_tokener_parse(line + 6);
        any_reasoning |= httpc_jget(ev, "choices.0.delta.reasoning_content") != NULL;
        strncat(reasoning, str(ev, "choices.0.delta.reasoning_content"),
                cap - 1 - strlen(reasoning));
        strncat(content, str(ev, "choices.0.delta.content"), cap - 1 - strlen(content));
        json_object_put(ev);
    }
    return any_reasoning;
}

/* The prompt family f writes for the body with extra, which must be want. */
static void check_prompt(family *f, const char *extra, const char *want)
{
    char body[512];
    int st;
    chat_body(body, sizeof body, extra);
    json_object *o = httpc_post_json(f->hsock, "/apply-template", body, &st);
    CHECK_MSG(st == 200 && !strcmp(str(o, "prompt"), want), "%s: %d %s", f->name, st,
              str(o, "prompt"));
    json_object_put(o);
}

/* A whole chat reply of f with extra fields: its reasoning and content must be these
 * (reasoning NULL: none at all), and with stopped its finish reason "stop". */
static void check_reply(family *f, const char *extra, const char *reasoning,
                        const char *content, bool stopped)
{
    char body[512];
    int st;
    chat_body(body, sizeof body, extra);
    json_object *o = httpc_post_json(f->hsock, "/v1/chat/completions", body, &st);
    bool ok = st == 200 && !strcmp(str(o, "choices.0.message.content"), content) &&
              (!stopped || !strcmp(str(o, "choices.0.finish_reason"), "stop")) &&
              (reasoning ? !strcmp(str(o, "choices.0.message.reasoning_content"), reasoning)
                         : !httpc_jget(o, "choices.0.message.reasoning_content"));
    CHECK_MSG(ok, "%s: %d %s", f->name, st, o ? json_object_to_json_string(o) : "");
    json_object_put(o);
}

/* A streamed chat reply of f with extra fields, its deltas added up. */
static int stream_reply(family *f, const char *extra, char *reasoning, char *content,
                        size_t cap, bool *any_reasoning)
{
    char body[512];
    chat_body(body, sizeof body, extra);
    httpc_reply r;
    if (httpc_do(f->hsock, 0, "POST", "/v1/chat/completions", NULL, body, &r) != 0)
        return -1;
    *any_reasoning = gather_stream(r.body, reasoning, content, cap);
    int status = r.status;
    httpc_reply_free(&r);
    return status;
}

#define NO_THINKING "\"chat_template_kwargs\":{\"enable_thinking\":false}"

/* The prompt as glm-4.5 writes it, leaving the block to the model or closing an empty
 * one after "/nothink". */
static void prompt_is_glm45s(void)
{
    NEED(&glm45);
    check_prompt(&glm45, "", "[gMASK]<sop><|user|>\n2 + 2?<|assistant|>");
    check_prompt(&glm45, NO_THINKING,
                 "[gMASK]<sop><|user|>\n2 + 2?/nothink<|assistant|>\n<think></think>");
}

/* The reply opens its block after a line break: reasoning, then content, whole and
 * streamed; "<|user|>" ends it. */
static void glm45_reply_is_reasoning_then_content(void)
{
    NEED(&glm45);
    check_reply(&glm45, "\"max_tokens\":16", "some thought", "the answer", true);
    char reasoning[256], content[256];
    bool any;
    int st = stream_reply(&glm45, "\"max_tokens\":16,\"stream\":true", reasoning, content,
                          sizeof content, &any);
    CHECK_MSG(st == 200 && !strcmp(reasoning, "some thought") && !strcmp(content, "the answer"),
              "%d '%s' '%s'", st, reasoning, content);

    /* ollama's: thinking by default */
    int status;
    json_object *o = httpc_post_json(glm45.hsock, "/api/chat",
                                     "{\"messages\":[{\"role\":\"user\",\"content\":\"2 + 2?\"}],"
                                     "\"stream\":false}", &status);
    CHECK_MSG(status == 200 && !strcmp(str(o, "message.thinking"), "some thought") &&
                  !strcmp(str(o, "message.content"), "the answer"),
              "%d %s", status, o ? json_object_to_json_string(o) : "");
    json_object_put(o);
}

/* With enable_thinking false the prompt closed an empty block: the reply is content
 * alone, the line break before it left out, whole and streamed. */
static void glm45_reply_after_a_closed_block_is_content(void)
{
    NEED(&glm45);
    check_reply(&glm45, "\"max_tokens\":16," NO_THINKING, NULL, "the answer", false);
    char reasoning[256], content[256];
    bool any;
    int st = stream_reply(&glm45, "\"max_tokens\":16,\"stream\":true," NO_THINKING, reasoning,
                          content, sizeof content, &any);
    CHECK_MSG(st == 200 && !reasoning[0] && !strcmp(content, "the answer"), "%d '%s' '%s'", st,
              reasoning, content);
}

/* The prompt as glm-4.7 writes it, opening the block or closing it. */
static void prompt_is_glm47s(void)
{
    NEED(&glm47);
    check_prompt(&glm47, "", "[gMASK]<sop><|user|>2 + 2?<|assistant|><think>");
    check_prompt(&glm47, NO_THINKING, "[gMASK]<sop><|user|>2 + 2?<|assistant|></think>");
}

/* The reply begins inside the block the prompt opened. */
static void glm47_reply_is_reasoning_then_content(void)
{
    NEED(&glm47);
    check_reply(&glm47, "\"max_tokens\":16", "some thought", "the answer", true);
}

/* With enable_thinking false the prompt closed the block: the reply is content alone,
 * whole and streamed. */
static void glm47_reply_after_a_closed_block_is_content(void)
{
    NEED(&glm47);
    check_reply(&glm47, "\"max_tokens\":16," NO_THINKING, NULL, "\n\nthe answer", false);
    char reasoning[256], content[256];
    bool any;
    int st = stream_reply(&glm47, "\"max_tokens\":16,\"stream\":true," NO_THINKING, reasoning,
                          content, sizeof content, &any);
    CHECK_MSG(st == 200 && !any && !strcmp(content, "\n\nthe answer"), "%d '%s'", st, content);
}

static void glm45_daemon_exits_cleanly(void)
{
    proc_check_clean_exit(&glm45.daemon, &glm45.up);
}

static void glm47_daemon_exits_cleanly(void)
{
    proc_check_clean_exit(&glm47.daemon, &glm47.up);
}

/* f's model on the synthetic vocabulary with extra's tokens and template, its chain made. */
static void make_model(family *f, const char *template_text, const toolmodel_token *extra,
                       int n_extra, const int (*chain)[2], int n_chain)
{
    toolmodel_generate(f->name, "tok3", template_text, NULL, extra, n_extra, f->model_path,
                       sizeof f->model_path);
    if (f->model_path[0] && toolmodel_make_chain(f->model_path, chain, n_chain) != 0)
        f->model_path[0] = '\0';
}

int main(int argc, char **argv)
{
    (void)argc;
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    make_model(&glm45, GLM45_TEMPLATE, G45_EXTRA, G45_N_EXTRA, G45_CHAIN,
               (int)(sizeof G45_CHAIN / sizeof G45_CHAIN[0]));
    make_model(&glm47, GLM47_TEMPLATE, G47_EXTRA, G47_N_EXTRA, G47_CHAIN,
               (int)(sizeof G47_CHAIN / sizeof G47_CHAIN[0]));
    RUN(prompt_is_glm45s);
    RUN(glm45_reply_is_reasoning_then_content);
    RUN(glm45_reply_after_a_closed_block_is_content);
    RUN(glm45_daemon_exits_cleanly);
    RUN(prompt_is_glm47s);
    RUN(glm47_reply_is_reasoning_then_content);
    RUN(glm47_reply_after_a_closed_block_is_content);
    RUN(glm47_daemon_exits_cleanly);
    return test_finish();
}
