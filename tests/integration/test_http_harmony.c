/*
 * gpt-oss's harmony format through the gateway, end to end: a real llmsd of this build
 * serving a random-weight llama on toolmodel.h's synthetic vocabulary (one token per
 * ASCII character) with harmony's control tokens and a gpt-oss chat template, so that
 * the family is gpt-oss (engine/tok/chatharmony.h, daemon/net/harmony.h).
 *
 * The request side is checked by the prompt: /apply-template's text equals the template's
 * rendering written out here (system turn with today's date and the reasoning effort,
 * developer turn, tools as TypeScript, calls and results), and every route evaluates
 * that prompt (its usage counts /tokenize's count of it), with the effort each route's
 * field asks for. The reply side: the weights are made to write one reply whatever the
 * prompt (as test_http_reasoning's: output projections zero, a chain of tokens each
 * pointing at the next) after the prompt's last token, the "t" of "<|start|>assistant":
 * "<|channel|>" "analysis" "<|message|>" " Think it." "<|end|>" "<|start|>"
 * "assistant<|channel|>final<|message|>" "The answer." and <|return|>, which ends it:
 * reasoning "Think it.", content "The answer." on the chat, Responses and ollama routes,
 * whole and streamed, no markup in any delta; "<|end|>" does not end it. A GBNF grammar
 * makes replies with a call in both of harmony's spellings, its control tokens whole or
 * spelled out character by character (logit_bias), read as tool_calls (and with
 * tool_choice "none" its arguments as the content), a call of a function outside the
 * tools read as a call, one whose body is no JSON its body as content; a named
 * tool_choice ends the prompt with the call's header. A context's turns add only what
 * the template writes after the last reply; /api/generate's think level is the prompt's.
 */
#include <fcntl.h>
#include <json-c/json.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tests/integration/httpc.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/integration/toolmodel.h"
#include "tests/support/test.h"

/* The test's own tokens (toolmodel.h's extra), from TOOLMODEL_FIRST_EXTRA on */
enum {
    T_START = TOOLMODEL_FIRST_EXTRA,
    T_CHANNEL,
    T_MESSAGE,
    T_END,
    T_RETURN,
    T_CALL,
    T_CONSTRAIN,
    T_ANALYSIS,
    T_THINK,
    T_FINAL,
    T_ANSWER,
    N_EXTRA = T_ANSWER - TOOLMODEL_FIRST_EXTRA + 1,
};
static const toolmodel_token EXTRA[N_EXTRA] = {
    {"<|start|>", 3},     {"<|channel|>", 3},         {"<|message|>", 3},
    {"<|end|>", 3},       {"<|return|>", 3},          {"<|call|>", 3},
    {"<|constrain|>", 3}, {"analysis", 1},            {"Think" TOOLMODEL_SP "it.", 1},
    {"assistant<|channel|>final<|message|>", 1},      {"The" TOOLMODEL_SP "answer.", 1},
};

/* The prompt's last token: the character "t" */
#define T_LAST_T (TOOLMODEL_FIRST_CHAR + 't' - ' ')

/* The chain: each token's next one */
static const int CHAIN[][2] = {
    {T_LAST_T, T_CHANNEL}, {T_CHANNEL, T_ANALYSIS}, {T_ANALYSIS, T_MESSAGE},
    {T_MESSAGE, T_THINK},  {T_THINK, T_END},        {T_END, T_START},
    {T_START, T_FINAL},    {T_FINAL, T_ANSWER},     {T_ANSWER, T_RETURN},
};
#define N_CHAIN ((int)(sizeof CHAIN / sizeof CHAIN[0]))
#define REPLY                                                                               \
    "<|channel|>analysis<|message|>Think it.<|end|><|start|>assistant<|channel|>final"      \
    "<|message|>The answer."
#define REPLY_TOKENS 8 /* the <|return|> that ends it is not counted */

/* gpt-oss's template, its parts that tell it */
static const char GPT_OSS_TEMPLATE[] =
    "{{- \"<|start|>system<|message|>\" }}{{- build_system_message() }}{{- \"<|end|>\" }}"
    "{%- for message in loop_messages -%}{%- if message.role == 'assistant' -%}"
    "{{- \"<|start|>assistant<|channel|>final<|message|>\" + message.content + \"<|end|>\" }}"
    "{%- elif message.role == 'user' -%}"
    "{{- \"<|start|>user<|message|>\" + message.content + \"<|end|>\" }}{%- endif -%}"
    "{%- endfor -%}{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}";

static const char WEATHER_TS[] =
    "// Get the weather in a city\ntype get_weather = (_: {\ncity: string,\n}) => any;\n\n";

static char llmsd_path[1024], model_path[1024], hsock[700], today[16];
static llmsd_proc daemon_;
static int daemon_up;

#define NEED()                                                                 \
    do {                                                                       \
        if (!llmsd_path[0])                                                    \
            SKIP("llmsd is not built in this tree");                           \
        if (!model_path[0])                                                    \
            SKIP("no model could be generated");                               \
        if (!daemon_up)                                                        \
            daemon_up = toolmodel_start(&daemon_, llmsd_path, "harmony", model_path, hsock, \
                                        sizeof hsock) == 0 ? 1 : -1;           \
        CHECK_MSG(daemon_up == 1, "llmsd did not start");                      \
    } while (0)

static json_object *post(const char *path, const char *body, int *status)
{
    return httpc_post_json(hsock, path, body, status);
}

static bool is(json_object *o, const char *path, const char *want)
{
    const char *v = o ? httpc_jstr(o, path) : NULL;
    return v && !strcmp(v, want);
}

static int num(json_object *o, const char *path)
{
    const char *v = o ? httpc_jstr(o, path) : NULL;
    return v ? atoi(v) : -1;
}

/* The system turn the template writes today at an effort, with or without tools. */
static void system_turn(char *out, size_t cap, const char *effort, bool tools)
{
    snprintf(out, cap,
             "<|start|>system<|message|>You are ChatGPT, a large language model trained by "
             "OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: %s\n\nReasoning: %s\n\n# Valid "
             "channels: analysis, commentary, final. Channel must be included for every "
             "message.%s<|end|>",
             today, effort,
             tools ? "\nCalls to these tools must go to the commentary channel: 'functions'." : "");
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

#define USER_Q "{\"role\":\"user\",\"content\":\"What is 2 + 2?\"}"
#define USER_TURN "<|start|>user<|message|>What is 2 + 2?<|end|>"

/* The prompt as the template writes it, and each route's effort field evaluates it. */
static void prompts_as_the_template_writes_them(void)
{
    NEED();
    char want[4096], sys[512];
    system_turn(sys, sizeof sys, "medium", false);
    snprintf(want, sizeof want, "%s<|start|>developer<|message|># Instructions\n\nBe brief.\n\n"
             "<|end|>" USER_TURN "<|start|>assistant", sys);
    char *got = apply_template("{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                               USER_Q "]}");
    CHECK_MSG(got && !strcmp(got, want), "%s", got ? got : "");
    free(got);
    /* a conversation with a call, its reasoning and its result */
    system_turn(sys, sizeof sys, "medium", true);
    snprintf(want, sizeof want,
             "%s<|start|>developer<|message|># Tools\n\n## functions\n\nnamespace functions {\n\n"
             "%s} // namespace functions<|end|><|start|>user<|message|>Weather in Paris?<|end|>"
             "<|start|>assistant<|channel|>analysis<|message|>Need it.<|end|><|start|>assistant "
             "to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}"
             "<|call|><|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"
             "\"22 C\"<|end|><|start|>assistant", sys, WEATHER_TS);
    char body[4096];
    snprintf(body, sizeof body,
             "{\"tools\":[%s],\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"},"
             "{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"Need it.\","
             "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":"
             "\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},{\"role\":\"tool\","
             "\"tool_call_id\":\"c1\",\"content\":\"22 C\"}]}",
             toolmodel_weather_tool);
    got = apply_template(body);
    CHECK_MSG(got && !strcmp(got, want), "%s", got ? got : "");
    free(got);
    /* each effort, as each route asks for it: the prompt is the one with its line */
    static const struct {
        const char *path, *body, *effort, *count;
    } routes[] = {
        {"/v1/chat/completions", "{\"messages\":[" USER_Q "],\"max_tokens\":1}", "medium",
         "usage.prompt_tokens"},
        {"/v1/chat/completions", "{\"messages\":[" USER_Q "],\"max_tokens\":1,"
         "\"reasoning_effort\":\"high\"}", "high", "usage.prompt_tokens"},
        {"/v1/chat/completions", "{\"messages\":[" USER_Q "],\"max_tokens\":1,"
         "\"chat_template_kwargs\":{\"reasoning_effort\":\"low\"}}", "low", "usage.prompt_tokens"},
        {"/v1/responses", "{\"input\":\"What is 2 + 2?\",\"max_output_tokens\":1,\"reasoning\":"
         "{\"effort\":\"low\"}}", "low", "usage.input_tokens"},
        {"/api/chat", "{\"messages\":[" USER_Q "],\"stream\":false,\"think\":\"high\","
         "\"options\":{\"num_predict\":1}}", "high", "prompt_eval_count"},
        {"/api/chat", "{\"messages\":[" USER_Q "],\"stream\":false,\"think\":false,"
         "\"options\":{\"num_predict\":1}}", "medium", "prompt_eval_count"},
        {"/api/generate", "{\"prompt\":\"What is 2 + 2?\",\"stream\":false,\"think\":\"low\","
         "\"options\":{\"num_predict\":1}}", "low", "prompt_eval_count"},
        {"/api/generate", "{\"prompt\":\"What is 2 + 2?\",\"stream\":false,\"think\":"
         "\"medium\",\"options\":{\"num_predict\":1}}", "medium", "prompt_eval_count"},
        {"/api/generate", "{\"prompt\":\"What is 2 + 2?\",\"stream\":false,\"think\":\"high\","
         "\"options\":{\"num_predict\":1}}", "high", "prompt_eval_count"},
        {"/api/generate", "{\"prompt\":\"What is 2 + 2?\",\"stream\":false,\"think\":true,"
         "\"options\":{\"num_predict\":1}}", "medium", "prompt_eval_count"},
    };
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        system_turn(sys, sizeof sys, routes[i].effort, false);
        snprintf(want, sizeof want, "%s" USER_TURN "<|start|>assistant", sys);
        int st, n = token_count(want);
        json_object *o = post(routes[i].path, routes[i].body, &st);
        CHECK_MSG(o && st == 200, "%s %s: %d %s", routes[i].path, routes[i].body, st,
                  o ? json_object_to_json_string(o) : "");
        CHECK_MSG(n > 0 && num(o, routes[i].count) == n, "%s %s: %d prompt tokens, %d expected",
                  routes[i].path, routes[i].body, num(o, routes[i].count), n);
        json_object_put(o);
    }
    /* an effort the model has no line for */
    static const struct {
        const char *path, *body;
    } bad[] = {
        {"/v1/chat/completions", "{\"messages\":[" USER_Q "],\"reasoning_effort\":\"max\"}"},
        {"/v1/responses", "{\"input\":\"x\",\"reasoning\":{\"effort\":\"minimal\"}}"},
        {"/api/chat", "{\"messages\":[" USER_Q "],\"think\":\"max\"}"},
        {"/v1/chat/completions", "{\"messages\":[" USER_Q "],\"tool_choice\":\"required\","
         "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int st;
        json_object *o = post(bad[i].path, bad[i].body, &st);
        CHECK_MSG(st == 400, "%s %s: %d", bad[i].path, bad[i].body, st);
        json_object_put(o);
    }
}

/* A reply's reasoning and content, gathered from a whole answer or a stream. */
typedef struct split {
    char reasoning[1024], content[1024];
    int reasoning_events;
    bool has_reasoning_key, content_null, done, markup;
    char finish[32];
    json_object *calls; /* the last tool_calls seen */
} split;

static void append(split *sp, char *to, const char *s)
{
    if (!s)
        return;
    sp->markup |= strstr(s, "<|") || strstr(s, "tool_call>");
    strncat(to, s, 1023 - strlen(to));
}

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
        const char *f = httpc_jstr(o, "choices.0.finish_reason");
        append(sp, sp->reasoning, r);
        append(sp, sp->content, httpc_jstr(o, "choices.0.delta.content"));
        sp->reasoning_events += r && r[0];
        if (f)
            snprintf(sp->finish, sizeof sp->finish, "%s", f);
        if ((calls = httpc_jget(o, "choices.0.delta.tool_calls"))) {
            json_object_put(sp->calls);
            sp->calls = json_object_get(calls);
        }
        json_object_put(o);
    }
}

static bool gather_chat(json_object *o, split *sp)
{
    memset(sp, 0, sizeof *sp);
    json_object *msg = httpc_jget(o, "choices.0.message"), *v;
    if (!msg)
        return false;
    sp->has_reasoning_key = json_object_object_get_ex(msg, "reasoning_content", &v);
    append(sp, sp->reasoning, v ? json_object_get_string(v) : NULL);
    sp->content_null = json_object_object_get_ex(msg, "content", &v) && !v;
    append(sp, sp->content, v ? json_object_get_string(v) : NULL);
    if ((v = httpc_jget(msg, "tool_calls")))
        sp->calls = json_object_get(v);
    snprintf(sp->finish, sizeof sp->finish, "%s", httpc_jstr(o, "choices.0.finish_reason"));
    return true;
}

/* body on the chat route, whole or streamed, into sp. */
static void chat(const char *body, bool stream, split *sp)
{
    httpc_reply r;
    memset(sp, 0, sizeof *sp);
    CHECK(httpc_do(hsock, 0, "POST", "/v1/chat/completions", NULL, body, &r) == 0);
    CHECK_MSG(r.status == 200, "%d %s", r.status, r.body);
    if (stream) {
        gather_chat_stream(r.body, sp);
    } else {
        json_object *o = json_tokener_parse(r.body);
        CHECK(gather_chat(o, sp));
        CHECK_MSG(num(o, "usage.completion_tokens") == REPLY_TOKENS || strstr(body, "grammar") ||
                      strstr(body, "tool_choice\":{"),
                  "%s", r.body);
        json_object_put(o);
    }
    httpc_reply_free(&r);
}

static void chat_reasoning_and_content(void)
{
    NEED();
    for (int stream = 0; stream < 2; stream++) {
        split sp;
        chat(stream ? "{\"messages\":[" USER_Q "],\"max_tokens\":32,\"stream\":true}"
                    : "{\"messages\":[" USER_Q "],\"max_tokens\":32}",
             stream, &sp);
        CHECK_MSG(!strcmp(sp.reasoning, "Think it.") && !strcmp(sp.content, "The answer."),
                  "stream %d: reasoning '%s' content '%s'", stream, sp.reasoning, sp.content);
        CHECK(!sp.markup && !strcmp(sp.finish, "stop"));
        CHECK(!stream || (sp.done && sp.reasoning_events >= 1));
    }
    /* reasoning_format none: the text as the model wrote it */
    for (int stream = 0; stream < 2; stream++) {
        split sp;
        chat(stream ? "{\"messages\":[" USER_Q "],\"reasoning_format\":\"none\",\"stream\":true}"
                    : "{\"messages\":[" USER_Q "],\"reasoning_format\":\"none\"}",
             stream, &sp);
        CHECK_MSG(!strcmp(sp.content, REPLY) && !sp.reasoning[0], "'%s'", sp.content);
    }
}

/* A context's turns (llmsd.context): the first is the template's whole prompt with the
 * context's system prompt as its developer instructions, each later one adds only the
 * reply's closing, the user's turn and the assistant's opening (the system turn is not
 * written again), the reply's reasoning kept where the model wrote it. */
static void context_turns_continue_the_conversation(void)
{
    NEED();
    llms_conn *c = proc_connect(&daemon_, LLMS_DEFAULT_APP);
    CHECK(c);
    char id[LLMS_ID_MAX];
    CHECK_EQ(llms_context_create(c, "Be brief.", NULL, id), LLMS_OK);
    char sys[512], first[1024], body[512];
    system_turn(sys, sizeof sys, "medium", false);
    snprintf(first, sizeof first,
             "%s<|start|>developer<|message|># Instructions\n\nBe brief.\n\n<|end|>" USER_TURN
             "<|start|>assistant", sys);
    int bos = token_count(""), want = token_count(first) + REPLY_TOKENS;
    int more = token_count("<|end|>" USER_TURN "<|start|>assistant") - bos + REPLY_TOKENS;
    snprintf(body, sizeof body,
             "{\"messages\":[" USER_Q "],\"max_tokens\":32,\"llmsd\":{\"context\":\"%s\"}}",
             id);
    for (int turn = 0; turn < 3; turn++, want += more) {
        int st;
        json_object *o = post("/v1/chat/completions", body, &st);
        split sp;
        CHECK_MSG(st == 200 && gather_chat(o, &sp), "turn %d: %d", turn, st);
        CHECK_MSG(!strcmp(sp.reasoning, "Think it.") && !strcmp(sp.content, "The answer.") &&
                      !sp.markup,
                  "turn %d: reasoning '%s' content '%s'", turn, sp.reasoning, sp.content);
        CHECK_MSG(num(o, "llmsd.context_tokens") == want, "turn %d: %d tokens, want %d", turn,
                  num(o, "llmsd.context_tokens"), want);
        json_object_put(o);
    }
    CHECK_EQ(llms_context_delete(c, id), LLMS_OK);
    llms_close(c);
}

/* text as a GBNF grammar of that one sentence, as a JSON string. */
static char *grammar_json(const char *text)
{
    char g[1024];
    size_t n = (size_t)snprintf(g, sizeof g, "root ::= \"");
    for (const char *p = text; *p && n + 4 < sizeof g; p++) {
        if (*p == '"' || *p == '\\')
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

/* A call in either of harmony's spellings after the reasoning, its control tokens whole
 * or spelled out: tool_calls, whole and streamed */
static void calls_in_both_spellings(void)
{
    NEED();
    static const char *const replies[] = {
        "<|channel|>analysis<|message|>I call it.<|end|><|start|>assistant<|channel|>commentary "
        "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}",
        "<|channel|>analysis<|message|>I call it.<|end|><|start|>assistant to=functions."
        "get_weather<|channel|>commentary json<|message|>{\"city\":\"Paris\"}",
    };
    char bans[3][128];
    snprintf(bans[0], sizeof bans[0], "%s", "");
    snprintf(bans[1], sizeof bans[1], ",\"logit_bias\":{\"%d\":-100,\"%d\":-100}", T_CHANNEL,
             T_MESSAGE);
    snprintf(bans[2], sizeof bans[2], ",\"logit_bias\":{\"%d\":-100,\"%d\":-100,\"%d\":-100}",
             T_END, T_START, T_CONSTRAIN);
    for (size_t v = 0; v < 2; v++) {
        char *g = grammar_json(replies[v]);
        for (int b = 0; b < 3; b++)
            for (int stream = 0; stream < 2; stream++) {
                char body[4096];
                snprintf(body, sizeof body,
                         "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}],"
                         "\"max_tokens\":200,\"temperature\":1,\"seed\":%d,\"stream\":%s,"
                         "\"grammar\":%s,\"tools\":[%s]%s}",
                         b, stream ? "true" : "false", g, toolmodel_weather_tool, bans[b]);
                split sp;
                chat(body, stream, &sp);
                CHECK_MSG(!strcmp(sp.reasoning, "I call it.") && !sp.content[0] && !sp.markup,
                          "spelling %zu ban %d stream %d: reasoning '%s' content '%s'", v, b,
                          stream, sp.reasoning, sp.content);
                CHECK(stream || sp.content_null);
                CHECK_MSG(!strcmp(sp.finish, "tool_calls"), "'%s'", sp.finish);
                CHECK_MSG(sp.calls && json_object_array_length(sp.calls) == 1 &&
                              is(sp.calls, "0.function.name", "get_weather") &&
                              is(sp.calls, "0.function.arguments", "{\"city\":\"Paris\"}"),
                          "%s", sp.calls ? json_object_to_json_string(sp.calls) : "no calls");
                json_object_put(sp.calls);
            }
        /* tool_choice "none": no calls read, the call's body is content */
        for (int stream = 0; stream < 2; stream++) {
            char body[4096];
            snprintf(body, sizeof body,
                     "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}],"
                     "\"max_tokens\":200,\"stream\":%s,\"grammar\":%s,\"tools\":[%s],"
                     "\"tool_choice\":\"none\"}",
                     stream ? "true" : "false", g, toolmodel_weather_tool);
            split sp;
            chat(body, stream, &sp);
            CHECK_MSG(!strcmp(sp.reasoning, "I call it.") &&
                          !strcmp(sp.content, "{\"city\":\"Paris\"}") && !sp.calls &&
                          !strcmp(sp.finish, "stop"),
                      "spelling %zu stream %d: reasoning '%s' content '%s' finish %s", v, stream,
                      sp.reasoning, sp.content, sp.finish);
        }
        free(g);
    }
}

/* A call of a function the request has no tool for is a call still, named as the model
 * named it (as llama.cpp's server reads gpt-oss's calls); a call whose body is no JSON
 * object is its body as content. Neither lets the gateway's own call markup out. */
static void calls_outside_the_tools(void)
{
    NEED();
    static const struct {
        const char *reply, *name, *content;
    } cases[] = {
        {"<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{\"tz\":\"UTC\"}",
         "get_time", ""},
        {"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{city: Paris}",
         NULL, "{city: Paris}"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *g = grammar_json(cases[i].reply);
        for (int stream = 0; stream < 2; stream++) {
            char body[4096];
            snprintf(body, sizeof body,
                     "{\"messages\":[{\"role\":\"user\",\"content\":\"Time?\"}],"
                     "\"max_tokens\":200,\"stream\":%s,\"grammar\":%s,\"tools\":[%s]}",
                     stream ? "true" : "false", g, toolmodel_weather_tool);
            split sp;
            chat(body, stream, &sp);
            CHECK_MSG(!sp.markup && !strcmp(sp.content, cases[i].content),
                      "case %zu stream %d: content '%s'", i, stream, sp.content);
            if (cases[i].name)
                CHECK_MSG(sp.calls && json_object_array_length(sp.calls) == 1 &&
                              is(sp.calls, "0.function.name", cases[i].name) &&
                              !strcmp(sp.finish, "tool_calls"),
                          "case %zu stream %d: %s", i, stream,
                          sp.calls ? json_object_to_json_string(sp.calls) : "no calls");
            else
                CHECK_MSG(!sp.calls && !strcmp(sp.finish, "stop"), "case %zu stream %d: %s", i,
                          stream, sp.finish);
            json_object_put(sp.calls);
        }
        free(g);
    }
}

/* A named tool_choice: the prompt ends with the call's header (/apply-template's prompt,
 * which the route evaluates), and the reply, decoded against the function's parameters,
 * is the call's arguments: a call of it, whole and streamed. */
static void named_choice_is_the_call(void)
{
    NEED();
    char body[4096];
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Pick a day.\"}],\"tools\":[%s],"
             "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"pick_day\"}}}",
             toolmodel_pick_tool);
    char *prompt = apply_template(body);
    const char *header = "<|start|>assistant<|channel|>commentary to=functions.pick_day "
                         "<|constrain|>json<|message|>";
    CHECK_MSG(prompt && strlen(prompt) > strlen(header) &&
                  !strcmp(prompt + strlen(prompt) - strlen(header), header),
              "%s", prompt ? prompt : "");
    int n_prompt = prompt ? token_count(prompt) : -1;
    free(prompt);
    for (int stream = 0; stream < 2; stream++) {
        char req[4096];
        snprintf(req, sizeof req, "%.*s,\"max_tokens\":64,\"stream\":%s}",
                 (int)strlen(body) - 1, body, stream ? "true" : "false");
        if (!stream) {
            int st;
            json_object *o = post("/v1/chat/completions", req, &st);
            CHECK_MSG(st == 200 && num(o, "usage.prompt_tokens") == n_prompt, "%d: %d, want %d",
                      st, num(o, "usage.prompt_tokens"), n_prompt);
            json_object_put(o);
        }
        split sp;
        chat(req, stream, &sp);
        const char *text = sp.calls ? httpc_jstr(sp.calls, "0.function.arguments") : NULL;
        json_object *args = text ? json_tokener_parse(text) : NULL;
        const char *day = args ? httpc_jstr(args, "day") : NULL;
        CHECK_MSG(sp.calls && json_object_array_length(sp.calls) == 1 &&
                      is(sp.calls, "0.function.name", "pick_day") && day &&
                      (!strcmp(day, "mon") || !strcmp(day, "tue")) && !sp.content[0] &&
                      !sp.markup && !strcmp(sp.finish, "tool_calls"),
                  "stream %d: content '%s' finish %s calls %s", stream, sp.content, sp.finish,
                  sp.calls ? json_object_to_json_string(sp.calls) : "none");
        json_object_put(args);
        json_object_put(sp.calls);
    }
}

static void responses_reasoning_item(void)
{
    NEED();
    int st;
    json_object *o = post("/v1/responses", "{\"input\":\"What is 2 + 2?\"}", &st);
    CHECK_MSG(o && st == 200, "%d", st);
    CHECK_MSG(is(o, "output.0.type", "reasoning") &&
                  is(o, "output.0.content.0.text", "Think it.") &&
                  is(o, "output.1.type", "message") &&
                  is(o, "output.1.content.0.text", "The answer.") && !httpc_jget(o, "output.2"),
              "%s", o ? json_object_to_json_string(o) : "");
    json_object_put(o);
    httpc_reply r;
    CHECK(httpc_do(hsock, 0, "POST", "/v1/responses", NULL,
                   "{\"input\":\"What is 2 + 2?\",\"stream\":true}", &r) == 0);
    CHECK_EQ(r.status, 200);
    split sp;
    memset(&sp, 0, sizeof sp);
    char *save;
    for (char *line = strtok_r(r.body, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (strncmp(line, "data: ", 6) != 0)
            continue;
        json_object *e = json_tokener_parse(line + 6);
        if (is(e, "type", "response.reasoning.delta"))
            append(&sp, sp.reasoning, httpc_jstr(e, "delta"));
        else if (is(e, "type", "response.output_text.delta"))
            append(&sp, sp.content, httpc_jstr(e, "delta"));
        json_object_put(e);
    }
    httpc_reply_free(&r);
    CHECK_MSG(!strcmp(sp.reasoning, "Think it.") && !strcmp(sp.content, "The answer.") &&
                  !sp.markup,
              "reasoning '%s' content '%s'", sp.reasoning, sp.content);
}

/* ollama's chat and generate: thinking and content, whole and streamed, at any think */
static void ollama_thinking(void)
{
    NEED();
    static const char *const thinks[] = {"", ",\"think\":true", ",\"think\":false",
                                         ",\"think\":\"low\""};
    for (int p = 0; p < 2; p++)
        for (int t = 0; t < 4; t++)
            for (int stream = 0; stream < 2; stream++) {
                char body[1024];
                snprintf(body, sizeof body, "{%s%s,\"stream\":%s}",
                         p ? "\"prompt\":\"What is 2 + 2?\"" : "\"messages\":[" USER_Q "]",
                         thinks[t], stream ? "true" : "false");
                httpc_reply r;
                CHECK(httpc_do(hsock, 0, "POST", p ? "/api/generate" : "/api/chat", NULL, body,
                               &r) == 0);
                CHECK_MSG(r.status == 200, "%s: %d %s", body, r.status, r.body);
                split sp;
                memset(&sp, 0, sizeof sp);
                char *save;
                for (char *line = strtok_r(r.body, "\n", &save); line;
                     line = strtok_r(NULL, "\n", &save)) {
                    json_object *o = json_tokener_parse(line);
                    append(&sp, sp.reasoning, httpc_jstr(o, p ? "thinking" : "message.thinking"));
                    append(&sp, sp.content, httpc_jstr(o, p ? "response" : "message.content"));
                    sp.done |= httpc_jget(o, "done") &&
                               json_object_get_boolean(httpc_jget(o, "done"));
                    json_object_put(o);
                }
                httpc_reply_free(&r);
                CHECK_MSG(!strcmp(sp.reasoning, "Think it.") &&
                              !strcmp(sp.content, "The answer.") && !sp.markup && sp.done,
                          "%s: thinking '%s' content '%s'", body, sp.reasoning, sp.content);
            }
}

static void daemon_exits_cleanly(void)
{
    proc_check_clean_exit(&daemon_, &daemon_up);
}

int main(int argc, char **argv)
{
    (void)argc;
    time_t now = time(NULL);
    struct tm day;
    localtime_r(&now, &day);
    strftime(today, sizeof today, "%Y-%m-%d", &day);
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    toolmodel_generate("harmony", "tok3", GPT_OSS_TEMPLATE, NULL, EXTRA, N_EXTRA, model_path,
                       sizeof model_path);
    if (model_path[0] && toolmodel_make_chain(model_path, CHAIN, N_CHAIN) != 0)
        model_path[0] = '\0';
    RUN(prompts_as_the_template_writes_them);
    RUN(chat_reasoning_and_content);
    RUN(context_turns_continue_the_conversation);
    RUN(calls_in_both_spellings);
    RUN(calls_outside_the_tools);
    RUN(named_choice_is_the_call);
    RUN(responses_reasoning_item);
    RUN(ollama_thinking);
    RUN(daemon_exits_cleanly);
    return test_finish();
}
