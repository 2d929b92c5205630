/*
 * OpenAI's Responses API (POST /v1/responses, daemon/net/responses.c) end to end: a real
 * llmsd of this build serving the trained documentation model of ../shared/testdata, and
 * the random-weight chatml model of toolmodel.h for tool calls. A response is checked
 * against /v1/chat/completions on the same daemon, which it is built on: the same greedy
 * text and token counts for the same conversation (a string input, an array of items,
 * instructions as the system message), max_output_tokens as status "incomplete", the
 * streamed events (their names, order and sequence numbers) adding up to the whole
 * response, text.format as response_format, function_call items out and
 * function_call / function_call_output items in as the chat's tool calls and tool
 * messages (the same prompt tokens), a failure after the stream began as response.failed.
 * Stored responses: a conversation chained by previous_response_id is the same
 * conversation sent whole (and resumes the prompt cache), GET gives what the POST gave,
 * input_items pages through the conversation, DELETE and store false leave nothing,
 * another uid (a token of its own on TCP) finds nothing, a small store evicts the
 * oldest. What cannot be served is 400 naming it, and random bodies, ids and paths are
 * never answered 5xx. The documentation model's tests skip without the test data.
 */
#include <grp.h>
#include <json-c/json.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/integration/httpc.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/integration/randjson.h"
#include "tests/integration/toolmodel.h"
#include "tests/support/test.h"

static char llmsd_path[1024];
static const char *docs_path; /* the trained documentation model, NULL without test data */
static llmsd_proc docs_daemon;
static int docs_up;
static char docs_sock[700];

#define NEED_DOCS()                                                            \
    do {                                                                       \
        if (!llmsd_path[0])                                                    \
            SKIP("llmsd is not built in this tree");                           \
        if (!docs_path)                                                        \
            SKIP("models/docs-lm-21M-F16.gguf is not in the test data "        \
                 "(../shared/testdata)");                                      \
        if (!docs_up)                                                          \
            docs_up = start_docs() == 0 ? 1 : -1;                              \
        CHECK_MSG(docs_up == 1, "llmsd did not start");                        \
    } while (0)

/* Bearer tokens of the docs daemon's TCP gateway: the test's own uid, and another uid,
 * whose stored responses are its own. */
#define TOKEN_MINE "resp-token-mine-0123456789"
#define TOKEN_OTHER "resp-token-other-0123456789"
static int docs_port;

static int start_docs(void)
{
    char extra[2048], tokens[700];
    struct group *g = getgrgid(getgid());
    proc_fmt(tokens, sizeof tokens, "%s/resp-tokens", test_tmpdir());
    FILE *f = fopen(tokens, "w");
    if (!f)
        return -1;
    fprintf(f, "%s %u mine\n%s %u other\n", TOKEN_MINE, (unsigned)getuid(), TOKEN_OTHER,
            (unsigned)getuid() + 1);
    fclose(f);
    chmod(tokens, 0600);
    docs_port = httpc_free_port();
    proc_fmt(docs_sock, sizeof docs_sock, "%s/resp-h.sock", test_tmpdir());
    proc_fmt(extra, sizeof extra, "http_socket = %s\nthreads = 2\nn_ctx = 1024\n"
             "step_tokens = 16\nadmin_group = %s\nhttp_listen = 127.0.0.1:%d\n"
             "http_tokens_file = %s\n", docs_sock, g ? g->gr_name : "root", docs_port, tokens);
    return proc_start(&docs_daemon, llmsd_path, "resp", docs_path, extra);
}

static json_object *post(const char *path, const char *body, int *status)
{
    return httpc_post_json(docs_sock, path, body, status);
}

static const char *json_text(json_object *o)
{
    return o ? json_object_to_json_string(o) : "(none)";
}

/* The text of a response's message item (its one output_text part), NULL when none. */
static const char *message_text(json_object *resp)
{
    json_object *out = httpc_jget(resp, "output");
    for (size_t i = 0; out && i < json_object_array_length(out); i++) {
        json_object *item = json_object_array_get_idx(out, i);
        const char *type = httpc_jstr(item, "type");
        if (type && !strcmp(type, "message"))
            return httpc_jstr(item, "content.0.text");
    }
    return NULL;
}

static bool str_is(json_object *o, const char *path, const char *want)
{
    const char *s = httpc_jstr(o, path);
    return s && !strcmp(s, want);
}

/* A response and a chat completion of the same conversation agree: the message's text,
 * the token counts, and the status for the finish reason. */
static void check_same_as_chat(json_object *resp, json_object *chat)
{
    const char *text = message_text(resp), *want = httpc_jstr(chat, "choices.0.message.content");
    CHECK_MSG(text && want && !strcmp(text, want), "response '%s', chat '%s'", text ? text : "",
              want ? want : "");
    CHECK_EQ(atoi(httpc_jstr(resp, "usage.input_tokens")),
             atoi(httpc_jstr(chat, "usage.prompt_tokens")));
    CHECK_EQ(atoi(httpc_jstr(resp, "usage.output_tokens")),
             atoi(httpc_jstr(chat, "usage.completion_tokens")));
    CHECK_EQ(atoi(httpc_jstr(resp, "usage.total_tokens")),
             atoi(httpc_jstr(chat, "usage.total_tokens")));
    bool length = str_is(chat, "choices.0.finish_reason", "length");
    CHECK_MSG(str_is(resp, "status", length ? "incomplete" : "completed"), "%s vs %s",
              httpc_jstr(resp, "status"), httpc_jstr(chat, "choices.0.finish_reason"));
}

/* The same conversation three ways (a string, items, instructions) and their chats. */
static void text_equals_chat(void)
{
    NEED_DOCS();
    static const struct {
        const char *resp, *chat;
    } pairs[] = {
        {"\"input\":\"How do I start the daemon?\"",
         "\"messages\":[{\"role\":\"user\",\"content\":\"How do I start the daemon?\"}]"},
        {"\"instructions\":\"Answer from the manual.\",\"input\":[{\"role\":\"user\","
         "\"content\":[{\"type\":\"input_text\",\"text\":\"What is a context?\"}]}]",
         "\"messages\":[{\"role\":\"system\",\"content\":\"Answer from the manual.\"},{\"role\":"
         "\"user\",\"content\":\"What is a context?\"}]"},
        {"\"input\":[{\"type\":\"message\",\"role\":\"developer\",\"content\":\"Be brief.\"},"
         "{\"role\":\"user\",\"content\":\"What is llmsd?\"},{\"type\":\"message\",\"role\":"
         "\"assistant\",\"id\":\"msg_1\",\"status\":\"completed\",\"content\":[{\"type\":"
         "\"output_text\",\"text\":\"A daemon.\",\"annotations\":[]}]},{\"role\":\"user\","
         "\"content\":[{\"type\":\"input_text\",\"text\":\"Which one?\"},{\"type\":"
         "\"input_text\",\"text\":\"Say more.\"}]}]",
         "\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\","
         "\"content\":\"What is llmsd?\"},{\"role\":\"assistant\",\"content\":\"A daemon.\"},"
         "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Which one?\"},{\"type\":"
         "\"text\",\"text\":\"Say more.\"}]}]"},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        char body[2048];
        int st;
        snprintf(body, sizeof body, "{%s,\"temperature\":0,\"max_output_tokens\":40}",
                 pairs[i].resp);
        json_object *resp = post("/v1/responses", body, &st);
        CHECK_MSG(resp && st == 200, "%zu: %d %s", i, st, json_text(resp));
        snprintf(body, sizeof body, "{%s,\"temperature\":0,\"max_tokens\":40}", pairs[i].chat);
        json_object *chat = post("/v1/chat/completions", body, &st);
        CHECK_MSG(chat && st == 200, "%zu: %d %s", i, st, json_text(chat));
        check_same_as_chat(resp, chat);
        json_object_put(chat);
        json_object_put(resp);
    }
}

/* llama.cpp's samplers, which the chat route takes as extra fields, reach the chat a
 * Responses body asks for: a seeded sample under each equals the chat's, and a value out
 * of range is refused as the chat refuses it. */
static void llamacpp_samplers_reach_the_chat(void)
{
    NEED_DOCS();
    static const char *const samplers[] = {
        "\"mirostat\":2,\"mirostat_tau\":3,\"mirostat_eta\":0.2",
        "\"typical_p\":0.5,\"min_keep\":2",
        "\"xtc_probability\":1,\"xtc_threshold\":0.05",
        "\"dry_multiplier\":0.8,\"dry_base\":1.5,\"dry_allowed_length\":1,"
        "\"dry_penalty_last_n\":32,\"dry_sequence_breakers\":[\".\"]",
        "\"dynatemp_range\":0.5,\"dynatemp_exponent\":2,\"top_n_sigma\":1.5",
        "\"samplers\":[\"top_k\",\"temperature\"],\"top_k\":5",
    };
    for (size_t i = 0; i < sizeof samplers / sizeof samplers[0]; i++) {
        char body[1024];
        int st;
        snprintf(body, sizeof body, "{\"input\":\"What is a context?\",\"seed\":5,"
                 "\"temperature\":0.9,\"max_output_tokens\":24,%s}", samplers[i]);
        json_object *resp = post("/v1/responses", body, &st);
        CHECK_MSG(resp && st == 200, "%s: %d %s", samplers[i], st, json_text(resp));
        snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":"
                 "\"What is a context?\"}],\"seed\":5,\"temperature\":0.9,\"max_tokens\":24,"
                 "%s}", samplers[i]);
        json_object *chat = post("/v1/chat/completions", body, &st);
        CHECK_MSG(chat && st == 200, "%s: %d %s", samplers[i], st, json_text(chat));
        check_same_as_chat(resp, chat);
        json_object_put(chat);
        json_object_put(resp);
    }
    int st;
    json_object *o = post("/v1/responses", "{\"input\":\"hi\",\"mirostat\":7}", &st);
    CHECK_MSG(st == 400 && strstr(json_text(o), "mirostat"), "%d %s", st, json_text(o));
    json_object_put(o);
}

/* Instructions long enough that their prompt passes step_tokens (16): the prompt cache
 * keeps it. */
#define LONG_INSTRUCTIONS "You answer questions about llmsd from its manual, briefly and plainly."

/* The response object has what the SDKs' types require, the request's settings echoed. */
static void response_object_shape(void)
{
    NEED_DOCS();
    int st;
    json_object *o = post("/v1/responses",
                          "{\"model\":\"docs-lm-21M-F16\",\"input\":\"What is a context?\","
                          "\"instructions\":\"" LONG_INSTRUCTIONS "\",\"temperature\":0,"
                          "\"top_p\":0.5,\"max_output_tokens\":8,\"metadata\":{\"k\":\"v\"},"
                          "\"user\":\"u1\",\"store\":false,\"truncation\":\"disabled\","
                          "\"seed\":3,\"frobnicate\":[1]}", &st);
    CHECK_MSG(o && st == 200, "%d %s", st, json_text(o));
    const char *id = httpc_jstr(o, "id");
    CHECK_MSG(id && !strncmp(id, "resp_", 5), "%s", json_text(o));
    CHECK(str_is(o, "object", "response"));
    CHECK(json_object_is_type(httpc_jget(o, "created_at"), json_type_int));
    CHECK(str_is(o, "model", "docs-lm-21M-F16"));
    CHECK(str_is(o, "instructions", LONG_INSTRUCTIONS));
    CHECK_EQ(atoi(httpc_jstr(o, "max_output_tokens")), 8);
    CHECK(json_object_get_double(httpc_jget(o, "temperature")) == 0);
    CHECK(json_object_get_double(httpc_jget(o, "top_p")) == 0.5);
    CHECK(str_is(o, "tool_choice", "auto"));
    CHECK(json_object_is_type(httpc_jget(o, "tools"), json_type_array) &&
          json_object_array_length(httpc_jget(o, "tools")) == 0);
    CHECK(json_object_get_boolean(httpc_jget(o, "parallel_tool_calls")));
    CHECK(str_is(o, "text.format.type", "text"));
    CHECK(str_is(o, "metadata.k", "v"));
    CHECK(str_is(o, "user", "u1"));
    CHECK(str_is(o, "truncation", "disabled"));
    CHECK(json_object_object_get_ex(o, "error", NULL) && !httpc_jget(o, "error"));
    CHECK(json_object_object_get_ex(o, "previous_response_id", NULL) &&
          !httpc_jget(o, "previous_response_id"));
    CHECK(json_object_is_type(httpc_jget(o, "store"), json_type_boolean) &&
          !json_object_get_boolean(httpc_jget(o, "store")));
    /* 8 tokens of a documentation answer: cut short */
    CHECK(str_is(o, "status", "incomplete"));
    CHECK(str_is(o, "incomplete_details.reason", "max_output_tokens"));
    CHECK_EQ(json_object_array_length(httpc_jget(o, "output")), 1);
    CHECK(str_is(o, "output.0.type", "message"));
    CHECK(httpc_jstr(o, "output.0.id") && !strncmp(httpc_jstr(o, "output.0.id"), "msg_", 4));
    CHECK(str_is(o, "output.0.role", "assistant"));
    CHECK(str_is(o, "output.0.status", "incomplete"));
    CHECK(str_is(o, "output.0.content.0.type", "output_text"));
    CHECK(json_object_is_type(httpc_jget(o, "output.0.content.0.annotations"), json_type_array));
    CHECK_EQ(atoi(httpc_jstr(o, "usage.output_tokens")), 8);
    CHECK(httpc_jget(o, "usage.input_tokens_details.cached_tokens"));
    CHECK_EQ(atoi(httpc_jstr(o, "usage.output_tokens_details.reasoning_tokens")), 0);
    CHECK_EQ(atoi(httpc_jstr(o, "usage.total_tokens")),
             atoi(httpc_jstr(o, "usage.input_tokens")) + 8);
    json_object_put(o);
    /* the same conversation again: its prompt is resumed from the prompt cache */
    o = post("/v1/responses",
             "{\"input\":\"What is a context?\",\"instructions\":\"" LONG_INSTRUCTIONS "\","
             "\"temperature\":0,\"max_output_tokens\":8}", &st);
    CHECK_MSG(o && st == 200, "%d %s", st, json_text(o));
    CHECK_MSG(atoi(httpc_jstr(o, "usage.input_tokens_details.cached_tokens")) > 0, "%s",
              json_text(o));
    json_object_put(o);
}

/* One event of a Responses stream: its "event:" name and its data. */
typedef struct sse_event {
    char name[64];
    json_object *data;
} sse_event;

/* The events of a stream body (at most cap); -1 after a failed CHECK's message when an
 * event is not one "event:" line and one "data:" line of JSON ending at a blank line. */
static int parse_events(char *body, sse_event *ev, int cap)
{
    int n = 0;
    char *p = body;
    while (*p) {
        char *end = strstr(p, "\n\n");
        if (!end || n == cap) {
            test_fail(__FILE__, __LINE__, "event %d: no blank line or too many: '%.200s'", n, p);
            return -1;
        }
        *end = '\0';
        char *nl = strchr(p, '\n');
        if (strncmp(p, "event: ", 7) || !nl || strncmp(nl + 1, "data: ", 6) ||
            strchr(nl + 1, '\n') || (size_t)(nl - p - 7) >= sizeof ev[n].name) {
            test_fail(__FILE__, __LINE__, "event %d is not 'event:' and 'data:': '%.300s'", n, p);
            return -1;
        }
        snprintf(ev[n].name, sizeof ev[n].name, "%.*s", (int)(nl - p - 7), p + 7);
        if (!(ev[n].data = json_tokener_parse(nl + 7))) {
            test_fail(__FILE__, __LINE__, "event %d's data is no JSON: '%.300s'", n, nl + 7);
            return -1;
        }
        n++;
        p = end + 2;
    }
    return n;
}

static void free_events(sse_event *ev, int n)
{
    for (int i = 0; i < n; i++)
        json_object_put(ev[i].data);
}

#define MAX_EVENTS 512

/* Streams body on sock; the events (*n of them) after checking what every stream has: each
 * event's type is its name, sequence numbers count from 0, and the stream opens with
 * response.created and response.in_progress and ends with response.completed or
 * response.incomplete, whose response is the final one. NULL after a failed CHECK. */
static sse_event *stream(const char *sock, const char *body, int *n)
{
    httpc_reply r;
    *n = 0;
    if (httpc_do(sock, 0, "POST", "/v1/responses", NULL, body, &r) != 0 || r.status != 200) {
        test_fail(__FILE__, __LINE__, "status %d: %s", r.status, r.body ? r.body : "");
        httpc_reply_free(&r);
        return NULL;
    }
    bool sse = strcasestr(r.head, "Content-Type: text/event-stream") != NULL;
    bool done_sentinel = strstr(r.body, "[DONE]") != NULL;
    sse_event *ev = calloc(MAX_EVENTS, sizeof *ev);
    int k = ev ? parse_events(r.body, ev, MAX_EVENTS) : -1;
    httpc_reply_free(&r);
    bool ok = k >= 4 && sse && !done_sentinel;
    for (int i = 0; ok && i < k; i++)
        ok = str_is(ev[i].data, "type", ev[i].name) &&
             json_object_is_type(httpc_jget(ev[i].data, "sequence_number"), json_type_int) &&
             atoi(httpc_jstr(ev[i].data, "sequence_number")) == i;
    ok = ok && !strcmp(ev[0].name, "response.created") &&
         !strcmp(ev[1].name, "response.in_progress") &&
         str_is(ev[0].data, "response.status", "in_progress") &&
         (!strcmp(ev[k - 1].name, "response.completed") ||
          !strcmp(ev[k - 1].name, "response.incomplete"));
    if (!ok) {
        test_fail(__FILE__, __LINE__, "%d events (sse %d, [DONE] %d) not in order: first %s, "
                  "last %s", k, sse, done_sentinel, k > 0 ? ev[0].name : "",
                  k > 0 ? ev[k - 1].name : "");
        if (ev && k > 0)
            free_events(ev, k);
        free(ev);
        return NULL;
    }
    *n = k;
    return ev;
}

/* Streamed: created, in_progress, the message's item and part added, its text deltas, the
 * text, part and item done, then completed or incomplete; the deltas add up to the whole
 * response's text, which the last event's response holds too. */
static void streamed_equals_whole(void)
{
    NEED_DOCS();
    static const char *const fields[] = {
        "\"input\":\"How do I start the daemon?\",\"temperature\":0,\"max_output_tokens\":30",
        "\"input\":\"Hi\",\"instructions\":\"Answer in one word.\",\"temperature\":0,"
        "\"max_output_tokens\":200",
    };
    for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++) {
        char body[1024];
        int st, n;
        snprintf(body, sizeof body, "{%s}", fields[f]);
        json_object *whole = post("/v1/responses", body, &st);
        CHECK_MSG(whole && st == 200, "%d %s", st, json_text(whole));
        snprintf(body, sizeof body, "{%s,\"stream\":true}", fields[f]);
        sse_event *ev = stream(docs_sock, body, &n);
        CHECK(ev);
        static const char *const order[] = {
            "response.created", "response.in_progress", "response.output_item.added",
            "response.content_part.added"};
        bool ok = n >= 9;
        for (int i = 0; ok && i < 4; i++)
            ok = !strcmp(ev[i].name, order[i]);
        ok = ok && str_is(ev[2].data, "item.type", "message") &&
             str_is(ev[2].data, "item.status", "in_progress") &&
             str_is(ev[3].data, "part.type", "output_text") && str_is(ev[3].data, "part.text", "");
        const char *item_id = ok ? httpc_jstr(ev[2].data, "item.id") : NULL;
        char text[8192] = "";
        int i = 4;
        for (; ok && !strcmp(ev[i].name, "response.output_text.delta"); i++) {
            ok = str_is(ev[i].data, "item_id", item_id) &&
                 atoi(httpc_jstr(ev[i].data, "output_index")) == 0 &&
                 atoi(httpc_jstr(ev[i].data, "content_index")) == 0;
            strncat(text, httpc_jstr(ev[i].data, "delta"), sizeof text - strlen(text) - 1);
        }
        const char *want = message_text(whole);
        CHECK_MSG(ok && i + 4 == n && want, "%d events, %d deltas", n, i - 4);
        CHECK_MSG(!strcmp(text, want), "streamed '%s', whole '%s'", text, want);
        CHECK(!strcmp(ev[i].name, "response.output_text.done") && str_is(ev[i].data, "text", want));
        CHECK(!strcmp(ev[i + 1].name, "response.content_part.done") &&
              str_is(ev[i + 1].data, "part.text", want));
        CHECK(!strcmp(ev[i + 2].name, "response.output_item.done") &&
              str_is(ev[i + 2].data, "item.id", item_id) &&
              str_is(ev[i + 2].data, "item.content.0.text", want));
        json_object *last = httpc_jget(ev[n - 1].data, "response");
        bool completed = str_is(whole, "status", "completed");
        CHECK(!strcmp(ev[n - 1].name, completed ? "response.completed" : "response.incomplete"));
        CHECK(str_is(last, "status", httpc_jstr(whole, "status")));
        CHECK(str_is(last, "id", httpc_jstr(ev[0].data, "response.id")));
        CHECK(str_is(last, "output.0.id", item_id));
        CHECK_MSG(!strcmp(message_text(last), want), "%s", json_text(last));
        CHECK_EQ(atoi(httpc_jstr(last, "usage.output_tokens")),
                 atoi(httpc_jstr(whole, "usage.output_tokens")));
        CHECK_EQ(atoi(httpc_jstr(last, "usage.input_tokens")),
                 atoi(httpc_jstr(whole, "usage.input_tokens")));
        free_events(ev, n);
        free(ev);
        json_object_put(whole);
    }
}

/* The schema the structured output test asks for (test_http_json.c's). */
#define SETTINGS_SCHEMA                                                                    \
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":24},"   \
    "\"port\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":65535},\"debug\":{\"type\":"      \
    "\"boolean\"}},\"required\":[\"name\",\"port\",\"debug\"],\"additionalProperties\":false}"

/* text.format json_schema is the chat's response_format json_schema: the same greedy
 * reply, and every reply that completes is an instance; json_object is JSON mode. */
static void text_format_is_response_format(void)
{
    NEED_DOCS();
    int completed = 0;
    for (int seed = 0; seed < 4; seed++) {
        char body[2048];
        int st;
        snprintf(body, sizeof body,
                 "{\"input\":\"Describe the web service.\",\"max_output_tokens\":120,\"seed\":%d%s,"
                 "\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"settings\","
                 "\"strict\":true,\"schema\":" SETTINGS_SCHEMA "}}}",
                 seed, seed == 0 ? ",\"temperature\":0" : "");
        json_object *o = post("/v1/responses", body, &st);
        CHECK_MSG(o && st == 200, "%d %s", st, json_text(o));
        CHECK(str_is(o, "text.format.type", "json_schema") &&
              str_is(o, "text.format.name", "settings"));
        const char *text = message_text(o);
        CHECK(text);
        if (str_is(o, "status", "completed")) {
            completed++;
            json_object *v = json_tokener_parse(text), *x;
            CHECK_MSG(v && json_object_object_get_ex(v, "name", &x) &&
                          json_object_is_type(x, json_type_string) &&
                          json_object_object_get_ex(v, "port", &x) &&
                          json_object_is_type(x, json_type_int) &&
                          json_object_object_get_ex(v, "debug", &x) &&
                          json_object_is_type(x, json_type_boolean),
                      "seed %d: '%s' is not an instance", seed, text);
            json_object_put(v);
        } else {
            CHECK_MSG(text[strspn(text, " \t\r\n")] == '{', "seed %d: '%s'", seed, text);
        }
        if (seed == 0) {
            snprintf(body, sizeof body,
                     "{\"messages\":[{\"role\":\"user\",\"content\":"
                     "\"Describe the web service.\"}],\"max_tokens\":120,\"seed\":0,"
                     "\"temperature\":0,\"response_format\":{\"type\":\"json_schema\","
                     "\"json_schema\":{\"name\":\"settings\",\"schema\":" SETTINGS_SCHEMA "}}}");
            json_object *chat = post("/v1/chat/completions", body, &st);
            CHECK(chat && st == 200);
            check_same_as_chat(o, chat);
            json_object_put(chat);
        }
        json_object_put(o);
    }
    CHECK_MSG(completed >= 2, "%d of 4 replies completed their instance", completed);
    int st;
    json_object *o = post("/v1/responses",
                          "{\"input\":\"Show the settings of config.json.\",\"max_output_tokens\":"
                          "60,\"temperature\":0,\"text\":{\"format\":{\"type\":\"json_object\"}}}",
                          &st);
    CHECK_MSG(o && st == 200, "%d %s", st, json_text(o));
    const char *text = message_text(o);
    CHECK_MSG(text && text[strspn(text, " \t\r\n")] == '{', "%s", json_text(o));
    json_object_put(o);
}

/* What cannot be served as sent is 400 in OpenAI's error shape, naming it. */
static void refusals_are_400(void)
{
    NEED_DOCS();
    static const struct {
        const char *body, *says;
    } bad[] = {
        {"{\"input\":\"x\",\"previous_response_id\":7}", "previous_response_id"},
        {"{\"input\":\"x\",\"previous_response_id\":\"resp_a/b\"}", "previous_response_id"},
        {"{\"input\":\"x\",\"conversation\":\"conv_123\"}", "conversation"},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"web_search\"}]}", "web_search"},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"file_search\",\"vector_store_ids\":[]}]}",
         "file_search"},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"function\"}]}", "tools[0].name"},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"parameters\":3}]}",
         "tools[0].parameters"},
        {"{\"input\":\"x\",\"tool_choice\":{\"type\":\"file_search\"}}", "tool_choice"},
        {"{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\",\"image_url\":"
         "\"http://x/y.png\"}]}]}", "input_image"},
        {"{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_file\",\"file_id\":"
         "\"f\"}]}]}", "input_file"},
        {"{\"input\":[{\"type\":\"item_reference\",\"id\":\"msg_1\"}]}", "item_reference"},
        {"{\"input\":[{\"type\":\"message\",\"content\":\"x\"}]}", "input[0]"},
        {"{\"input\":[{\"role\":\"tool\",\"content\":\"x\"}]}", "input[0]"},
        {"{\"input\":[\"x\"]}", "input[0]"},
        {"{\"input\":[]}", "input"},
        {"{\"instructions\":\"x\"}", "input"},
        {"{\"input\":7}", "input"},
        {"{\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"c\",\"output\":\"x\"}]}",
         "tools"},
        {"{\"input\":[{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"f\"}]}",
         "input[0].arguments"},
        {"{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"xml\"}}}", "text.format"},
        {"{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"s\"}}}",
         "text.format.schema"},
        {"{\"input\":\"x\",\"background\":true}", "background"},
        {"{\"input\":\"x\",\"truncation\":\"sometimes\"}", "truncation"},
        {"{\"input\":\"x\",\"store\":\"yes\"}", "store"},
        {"{\"input\":\"x\",\"metadata\":{\"k\":1}}", "metadata"},
        {"{\"input\":\"x\",\"instructions\":5}", "instructions"},
        {"{\"input\":\"x\",\"max_output_tokens\":\"9\"}", "max_output_tokens"},
        {"{\"input\":\"x\",\"include\":[\"message.output_text.logprobs\"]}", "logprobs"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int st;
        json_object *o = post("/v1/responses", bad[i].body, &st);
        const char *msg = o ? httpc_jstr(o, "error.message") : NULL;
        CHECK_MSG(st == 400 && msg && strstr(msg, bad[i].says) &&
                      str_is(o, "error.type", "invalid_request_error"),
                  "%s: %d %s", bad[i].body, st, json_text(o));
        json_object_put(o);
    }
    /* what OpenAI lets a client send that asks for nothing passes */
    static const char *const fine[] = {
        "{\"input\":\"x\",\"max_output_tokens\":1,\"previous_response_id\":null,\"store\":true,"
        "\"truncation\":\"auto\",\"background\":false,\"tools\":[],\"include\":[],\"reasoning\":"
        "{\"effort\":null},\"service_tier\":\"auto\",\"parallel_tool_calls\":false}",
        "{\"input\":\"x\",\"max_output_tokens\":1,\"text\":{\"format\":{\"type\":\"text\"}},"
        "\"tool_choice\":\"none\",\"metadata\":null,\"include\":[\"reasoning.encrypted_content\"]}",
    };
    for (size_t i = 0; i < sizeof fine / sizeof fine[0]; i++) {
        int st;
        json_object *o = post("/v1/responses", fine[i], &st);
        CHECK_MSG(o && st == 200, "%s: %d %s", fine[i], st, json_text(o));
        json_object_put(o);
    }
    /* a model the daemon does not serve, as on every OpenAI route */
    int st;
    json_object *o = post("/v1/responses", "{\"model\":\"gpt-x\",\"input\":\"x\"}", &st);
    CHECK_MSG(st == 404 && str_is(o, "error.code", "model_not_found"), "%d %s", st, json_text(o));
    json_object_put(o);
}

/* field names of Responses requests, and strings of their values */
static const char *const body_keys[] = {
    "model", "input", "instructions", "role", "content", "type", "text", "format", "schema",
    "name", "strict", "tools", "tool_choice", "parameters", "description", "call_id",
    "arguments", "output", "max_output_tokens", "temperature", "top_p", "stream", "metadata",
    "store", "truncation", "previous_response_id", "parallel_tool_calls", "user", "include",
    "seed", "id", "status", "annotations", "background"};
static const char *const body_words[] = {
    "", "user", "assistant", "system", "developer", "message", "function_call",
    "function_call_output", "input_text", "output_text", "input_image", "function",
    "json_schema", "json_object", "text", "auto", "none", "required", "disabled", "resp",
    "\xff\xfe", "{\"a\":1}", "resp_00000000000000aa"};
static randjson body_gen = {0x9e3779b97f4a7c15u, body_keys, sizeof body_keys / sizeof *body_keys,
                            body_words, sizeof body_words / sizeof *body_words};

/* Valid bodies changed at random (fields set to values of any type, in the body or in its
 * first input item, or removed), and random JSON values one time in eight: never 5xx
 * (503 only while busy), and the daemon stays up. */
static void random_bodies_never_5xx(void)
{
    NEED_DOCS();
    test_random_seed(&body_gen.rng);
    static const char *const valid[] = {
        "{\"input\":\"Hi\",\"max_output_tokens\":2}",
        "{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"Hi\"}]}],"
        "\"instructions\":\"x\",\"max_output_tokens\":2,\"stream\":true}",
        "{\"input\":[{\"role\":\"user\",\"content\":\"Hi\"},{\"type\":\"function_call\","
        "\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":\"{}\"},{\"type\":"
        "\"function_call_output\",\"call_id\":\"c1\",\"output\":\"ok\"}],\"tools\":[{"
        "\"type\":\"function\",\"name\":\"f\",\"parameters\":{\"type\":\"object\","
        "\"properties\":{}}}],\"max_output_tokens\":2}",
        "{\"input\":\"Hi\",\"max_output_tokens\":2,\"text\":{\"format\":{\"type\":\"json_schema\","
        "\"name\":\"s\",\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":"
        "\"integer\"}}}}}}",
    };
    int ok = 0, n = 400;
    for (int i = 0; i < n; i++) {
        json_object *body = randjson_pick(&body_gen, 8)
                                ? json_tokener_parse(valid[randjson_pick(&body_gen, 4)])
                                : randjson_value(&body_gen, 1);
        for (int k = randjson_pick(&body_gen, 4);
             k > 0 && json_object_is_type(body, json_type_object); k--) {
            json_object *into = body, *items;
            if (randjson_pick(&body_gen, 2) == 0 &&
                json_object_object_get_ex(body, "input", &items) &&
                json_object_is_type(items, json_type_array) && json_object_array_length(items)) {
                int at = randjson_pick(&body_gen, (int)json_object_array_length(items));
                into = json_object_array_get_idx(items, (size_t)at);
            }
            if (!json_object_is_type(into, json_type_object))
                into = body;
            if (randjson_pick(&body_gen, 4) == 0)
                json_object_object_del(into, randjson_key(&body_gen));
            else
                json_object_object_add(into, randjson_key(&body_gen), randjson_value(&body_gen, 1));
        }
        /* bounded generations keep the test short (the window bounds the rest) */
        json_object *mt;
        if (json_object_is_type(body, json_type_object) &&
            (!json_object_object_get_ex(body, "max_output_tokens", &mt) ||
             !json_object_is_type(mt, json_type_int) || json_object_get_int64(mt) > 4 ||
             json_object_get_int64(mt) < 1))
            json_object_object_add(body, "max_output_tokens", json_object_new_int(4));
        const char *text = body ? json_object_to_json_string(body) : "null";
        httpc_reply r;
        int rc = httpc_do(docs_sock, 0, "POST", "/v1/responses", NULL, text, &r);
        CHECK_MSG(rc == 0, "%s: no answer", text);
        CHECK_MSG(r.status >= 200 && (r.status < 500 || r.status == 503), "%s: %d %s", text,
                  r.status, r.body);
        ok += r.status == 200;
        httpc_reply_free(&r);
        json_object_put(body);
    }
    fprintf(stderr, "    %d random bodies: %d answered 200\n", n, ok);
    CHECK(ok > 0);
    httpc_reply r;
    CHECK(httpc_do(docs_sock, 0, "GET", "/health", NULL, NULL, &r) == 0);
    CHECK_EQ(r.status, 200);
    httpc_reply_free(&r);
}

/* /metrics counts the route's answers under its path. */
static void metrics_name_the_route(void)
{
    NEED_DOCS();
    httpc_reply r;
    CHECK(httpc_do(docs_sock, 0, "GET", "/metrics", NULL, NULL, &r) == 0);
    CHECK_MSG(r.status == 200 && strstr(r.body, "{route=\"/v1/responses\",code=\"200\"}") &&
                  strstr(r.body, "{route=\"/v1/responses\",code=\"400\"}"),
              "%d %.2000s", r.status, r.body);
    httpc_reply_free(&r);
}

/* ---- stored responses (previous_response_id, GET, DELETE, input_items) ---- */

/* A request on the docs daemon: over its Unix socket (token NULL), or its TCP port as
 * the token's uid; the reply's JSON (NULL when none or not JSON), its status in *status. */
static json_object *call(const char *token, const char *method, const char *path,
                         const char *body, int *status)
{
    httpc_reply r;
    char auth[128];
    *status = 0;
    snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", token ? token : "");
    if (httpc_do(token ? NULL : docs_sock, token ? docs_port : 0, method, path,
                 token ? auth : NULL, body, &r))
        return NULL;
    *status = r.status;
    json_object *o = r.body ? json_tokener_parse(r.body) : NULL;
    httpc_reply_free(&r);
    return o;
}

/* The settings of every turn of the stored conversations: the instructions long enough
 * for the prompt cache to keep the prompt. */
#define TURN_FIELDS                                                                        \
    "\"instructions\":\"" LONG_INSTRUCTIONS "\",\"temperature\":0,\"max_output_tokens\":16"

/* One turn of a conversation: input (a JSON value) after the stored response prev (NULL:
 * none), as token's uid (NULL: the Unix socket's), streamed or whole; its response, or
 * NULL with *status its status (after a failed CHECK when the stream failed). */
static json_object *turn(const char *token, const char *prev, const char *input, bool streamed,
                         int *status)
{
    char body[8192], prevf[160] = "";
    if (prev)
        snprintf(prevf, sizeof prevf, ",\"previous_response_id\":\"%s\"", prev);
    snprintf(body, sizeof body, "{\"input\":%s,%s%s%s}", input, TURN_FIELDS, prevf,
             streamed ? ",\"stream\":true" : "");
    if (!streamed) {
        json_object *o = call(token, "POST", "/v1/responses", body, status);
        if (*status == 200)
            return o;
        json_object_put(o);
        return NULL;
    }
    int n;
    sse_event *ev = stream(docs_sock, body, &n);
    *status = ev ? 200 : 0;
    if (!ev)
        return NULL;
    json_object *o = json_object_get(httpc_jget(ev[n - 1].data, "response"));
    free_events(ev, n);
    free(ev);
    return o;
}

/* An error reply is OpenAI's 404 of a response that is not there (or not the caller's):
 * its message names the id. */
static bool is_not_found(json_object *o, int status, const char *id)
{
    const char *msg = httpc_jstr(o, "error.message");
    return status == 404 && str_is(o, "error.type", "invalid_request_error") && msg &&
           strstr(msg, id) && strstr(msg, "not found");
}

/* Three turns chained by previous_response_id (the second streamed) give the replies of
 * the same conversation sent whole: its items as the input, the earlier replies' output
 * items among them; each chained turn resumes the prompt cache, names the response it
 * follows and is stored. GET gives each as its POST (or last event) gave it. */
static void chain_equals_whole_conversation(void)
{
    NEED_DOCS();
    static const char *const inputs[] = {"\"What is llmsd?\"", "\"How do I start it?\"",
                                         "\"What is a context?\""};
    json_object *r[3] = {NULL, NULL, NULL};
    char whole[8192] = "[";
    for (int t = 0; t < 3; t++) {
        int st;
        r[t] = turn(NULL, t ? httpc_jstr(r[t - 1], "id") : NULL, inputs[t], t == 1, &st);
        CHECK_MSG(r[t], "turn %d: %d", t, st);
        CHECK_MSG(json_object_get_boolean(httpc_jget(r[t], "store")), "%s", json_text(r[t]));
        if (t) {
            CHECK_MSG(str_is(r[t], "previous_response_id", httpc_jstr(r[t - 1], "id")), "%s",
                      json_text(r[t]));
            CHECK_MSG(atoi(httpc_jstr(r[t], "usage.input_tokens_details.cached_tokens")) > 0,
                      "turn %d: %s", t, json_text(r[t]));
        }
        /* the whole conversation as a client keeps it: its inputs and the replies' items */
        snprintf(whole + strlen(whole), sizeof whole - strlen(whole),
                 "%s{\"role\":\"user\",\"content\":%s}", t ? "," : "", inputs[t]);
        json_object *out = httpc_jget(r[t], "output");
        for (size_t i = 0; t < 2 && i < json_object_array_length(out); i++)
            snprintf(whole + strlen(whole), sizeof whole - strlen(whole), ",%s",
                     json_object_to_json_string(json_object_array_get_idx(out, i)));
    }
    strcat(whole, "]");
    int st;
    json_object *w = turn(NULL, NULL, whole, false, &st);
    CHECK_MSG(w, "%d", st);
    const char *a = message_text(r[2]), *b = message_text(w);
    CHECK_MSG(a && b && !strcmp(a, b), "chained '%s', whole '%s'", a ? a : "", b ? b : "");
    CHECK_EQ(atoi(httpc_jstr(r[2], "usage.input_tokens")),
             atoi(httpc_jstr(w, "usage.input_tokens")));
    CHECK_EQ(atoi(httpc_jstr(r[2], "usage.output_tokens")),
             atoi(httpc_jstr(w, "usage.output_tokens")));
    for (int t = 0; t < 3; t++) {
        char path[160];
        snprintf(path, sizeof path, "/v1/responses/%s", httpc_jstr(r[t], "id"));
        json_object *g = call(NULL, "GET", path, NULL, &st);
        CHECK_MSG(st == 200 && json_object_equal(g, r[t]), "turn %d: %d %s, posted %s", t, st,
                  json_text(g), json_text(r[t]));
        json_object_put(g);
    }
    json_object_put(w);
    for (int t = 0; t < 3; t++)
        json_object_put(r[t]);
}

/* The ids of a list's items, in its order, joined with spaces into out. */
static void list_ids(json_object *list, char *out, size_t cap)
{
    json_object *data = httpc_jget(list, "data");
    out[0] = '\0';
    for (size_t i = 0; i < json_object_array_length(data); i++) {
        const char *id = httpc_jstr(json_object_array_get_idx(data, i), "id");
        snprintf(out + strlen(out), cap - strlen(out), "%s%s", i ? " " : "", id ? id : "(none)");
    }
}

/* input_items lists a chained response's input (the earlier turns' inputs and outputs,
 * then its own input), each item with an id, newest first unless order=asc; limit and
 * after page through it, has_more telling whether a page is the last. */
static void input_items_page(void)
{
    NEED_DOCS();
    int st;
    json_object *r1 = turn(NULL, NULL, "\"What is a model?\"", false, &st);
    CHECK_MSG(r1, "%d", st);
    json_object *r2 = turn(NULL, httpc_jstr(r1, "id"),
                           "[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":"
                           "\"And a token?\"}]}]", false, &st);
    CHECK_MSG(r2, "%d", st);
    char path[256], all[2048], want[2048];
    snprintf(path, sizeof path, "/v1/responses/%s/input_items?order=asc&limit=100",
             httpc_jstr(r2, "id"));
    json_object *l = call(NULL, "GET", path, NULL, &st);
    CHECK_MSG(st == 200 && str_is(l, "object", "list") &&
                  !json_object_get_boolean(httpc_jget(l, "has_more")), "%d %s", st,
              json_text(l));
    json_object *data = httpc_jget(l, "data");
    size_t n = json_object_array_length(data);
    size_t n_out = json_object_array_length(httpc_jget(r1, "output"));
    CHECK_MSG(n == 2 + n_out, "%zu items, %zu outputs: %s", n, n_out, json_text(l));
    CHECK(str_is(l, "data.0.role", "user") && str_is(l, "data.0.type", "message") &&
          str_is(l, "data.0.content.0.text", "What is a model?"));
    CHECK(str_is(l, "data.1.id", httpc_jstr(r1, "output.0.id")));
    CHECK(str_is(json_object_array_get_idx(data, n - 1), "content.0.text", "And a token?"));
    CHECK(str_is(l, "first_id", httpc_jstr(l, "data.0.id")));
    CHECK(str_is(l, "last_id", httpc_jstr(json_object_array_get_idx(data, n - 1), "id")));
    list_ids(l, all, sizeof all);
    for (size_t i = 0; i < n; i++)
        CHECK(httpc_jstr(json_object_array_get_idx(data, i), "id"));
    json_object_put(l);
    /* the default order is newest first, 20 at most */
    snprintf(path, sizeof path, "/v1/responses/%s/input_items", httpc_jstr(r2, "id"));
    l = call(NULL, "GET", path, NULL, &st);
    CHECK_MSG(st == 200 && json_object_array_length(httpc_jget(l, "data")) == n, "%s",
              json_text(l));
    CHECK(str_is(l, "data.0.content.0.text", "And a token?"));
    json_object_put(l);
    /* one at a time, each page after the last one's last_id */
    for (int desc = 0; desc < 2; desc++) {
        char after[128] = "", got[2048] = "";
        for (size_t page = 0; page < n; page++) {
            snprintf(path, sizeof path, "/v1/responses/%s/input_items?limit=1&order=%s%s%s",
                     httpc_jstr(r2, "id"), desc ? "desc" : "asc", after[0] ? "&after=" : "",
                     after);
            l = call(NULL, "GET", path, NULL, &st);
            CHECK_MSG(st == 200 && json_object_array_length(httpc_jget(l, "data")) == 1 &&
                          json_object_get_boolean(httpc_jget(l, "has_more")) == (page + 1 < n),
                      "page %zu: %d %s", page, st, json_text(l));
            snprintf(after, sizeof after, "%s", httpc_jstr(l, "last_id"));
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%s", page ? " " : "",
                     after);
            json_object_put(l);
        }
        if (!desc) {
            CHECK_MSG(!strcmp(got, all), "paged '%s', whole '%s'", got, all);
            continue;
        }
        /* newest first: the whole list backwards */
        want[0] = '\0';
        char copy[2048], *ids[64];
        size_t k = 0;
        snprintf(copy, sizeof copy, "%s", all);
        for (char *s, *t = strtok_r(copy, " ", &s); t && k < 64; t = strtok_r(NULL, " ", &s))
            ids[k++] = t;
        for (size_t i = k; i-- > 0;)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s%s",
                     i + 1 < k ? " " : "", ids[i]);
        CHECK_MSG(!strcmp(got, want), "paged '%s', want '%s'", got, want);
    }
    static const char *const bad[] = {"limit=0", "limit=101", "limit=x", "order=sideways",
                                      "after=no_such_item"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(path, sizeof path, "/v1/responses/%s/input_items?%s", httpc_jstr(r2, "id"),
                 bad[i]);
        l = call(NULL, "GET", path, NULL, &st);
        CHECK_MSG(st == 400 && str_is(l, "error.type", "invalid_request_error"), "%s: %d %s",
                  bad[i], st, json_text(l));
        json_object_put(l);
    }
    json_object_put(r1);
    json_object_put(r2);
}

/* DELETE answers OpenAI's deletion object; the response is gone then for GET, DELETE,
 * input_items and previous_response_id alike. */
static void deleted_is_gone(void)
{
    NEED_DOCS();
    int st;
    json_object *r = turn(NULL, NULL, "\"What is a model?\"", false, &st);
    CHECK_MSG(r, "%d", st);
    const char *id = httpc_jstr(r, "id");
    char path[256];
    snprintf(path, sizeof path, "/v1/responses/%s", id);
    json_object *d = call(NULL, "DELETE", path, NULL, &st);
    CHECK_MSG(st == 200 && str_is(d, "id", id) && str_is(d, "object", "response") &&
                  json_object_get_boolean(httpc_jget(d, "deleted")), "%d %s", st, json_text(d));
    json_object_put(d);
    d = call(NULL, "GET", path, NULL, &st);
    CHECK_MSG(is_not_found(d, st, id), "%d %s", st, json_text(d));
    json_object_put(d);
    d = call(NULL, "DELETE", path, NULL, &st);
    CHECK_MSG(is_not_found(d, st, id), "%d %s", st, json_text(d));
    json_object_put(d);
    snprintf(path, sizeof path, "/v1/responses/%s/input_items", id);
    d = call(NULL, "GET", path, NULL, &st);
    CHECK_MSG(is_not_found(d, st, id), "%d %s", st, json_text(d));
    json_object_put(d);
    char body[256], want[160];
    snprintf(body, sizeof body, "{\"input\":\"x\",\"previous_response_id\":\"%s\"}", id);
    d = post("/v1/responses", body, &st);
    snprintf(want, sizeof want, "Previous response with id '%s' not found.", id);
    CHECK_MSG(st == 404 && str_is(d, "error.message", want) &&
                  str_is(d, "error.type", "invalid_request_error"), "%d %s", st, json_text(d));
    json_object_put(d);
    json_object_put(r);
}

/* store false keeps nothing: the reply says so and GET does not find it. */
static void store_false_is_not_kept(void)
{
    NEED_DOCS();
    int st;
    json_object *r = post("/v1/responses", "{\"input\":\"Hi\",\"store\":false,"
                          "\"max_output_tokens\":2}", &st);
    CHECK_MSG(st == 200 && !json_object_get_boolean(httpc_jget(r, "store")), "%d %s", st,
              json_text(r));
    char path[256];
    snprintf(path, sizeof path, "/v1/responses/%s", httpc_jstr(r, "id"));
    json_object *g = call(NULL, "GET", path, NULL, &st);
    CHECK_MSG(is_not_found(g, st, httpc_jstr(r, "id")), "%d %s", st, json_text(g));
    json_object_put(g);
    json_object_put(r);
}

/* A stored response is its creator's uid's: another uid (a token of another uid on TCP)
 * gets for GET, DELETE, input_items and previous_response_id the 404 of an id never
 * made, the same reply but for the id; the creator still has it after. */
static void other_uid_sees_nothing(void)
{
    NEED_DOCS();
    int st;
    json_object *r = turn(TOKEN_MINE, NULL, "\"What is a model?\"", false, &st);
    CHECK_MSG(r, "%d", st);
    const char *id = httpc_jstr(r, "id");
    static const char unknown[] = "resp_00000000000000aa";
    for (int k = 0; k < 4; k++) {
        json_object *o[2];
        int s[2];
        for (int u = 0; u < 2; u++) {
            const char *which = u ? unknown : id;
            char path[256], body[256];
            snprintf(path, sizeof path, "/v1/responses/%s%s", which,
                     k == 2 ? "/input_items" : "");
            snprintf(body, sizeof body, "{\"input\":\"x\",\"previous_response_id\":\"%s\"}",
                     which);
            o[u] = k == 3 ? call(TOKEN_OTHER, "POST", "/v1/responses", body, &s[u])
                          : call(TOKEN_OTHER, k == 1 ? "DELETE" : "GET", path, NULL, &s[u]);
            CHECK_MSG(s[u] == 404, "%d: %d %s", k, s[u], json_text(o[u]));
        }
        /* the same answer but for the id it names */
        char a[512], b[512];
        snprintf(a, sizeof a, "%s", json_text(o[0]));
        snprintf(b, sizeof b, "%s", json_text(o[1]));
        char *at = strstr(a, id);
        CHECK_MSG(at && strlen(id) == strlen(unknown), "%s", a);
        memcpy(at, unknown, strlen(unknown));
        CHECK_MSG(!strcmp(a, b), "%d: '%s' and '%s'", k, a, b);
        json_object_put(o[0]);
        json_object_put(o[1]);
    }
    char path[256];
    snprintf(path, sizeof path, "/v1/responses/%s", id);
    json_object *g = call(TOKEN_MINE, "GET", path, NULL, &st);
    CHECK_MSG(st == 200 && json_object_equal(g, r), "%d %s", st, json_text(g));
    json_object_put(g);
    json_object *next = turn(TOKEN_MINE, id, "\"And a token?\"", false, &st);
    CHECK_MSG(next, "%d", st);
    json_object_put(next);
    json_object_put(r);
}

/* Ids are checked before they are looked up, methods are the route's, and random ids
 * and paths are never answered 5xx. */
static void stored_routes_refuse_cleanly(void)
{
    NEED_DOCS();
    static const struct {
        const char *method, *path;
        int status;
    } cases[] = {
        {"POST", "/v1/responses/resp_0123", 405},
        {"PUT", "/v1/responses/resp_0123", 405},
        {"DELETE", "/v1/responses/resp_0123/input_items", 405},
        {"GET", "/v1/responses/resp_0123%2F..", 400},
        {"GET", "/v1/responses/x_0123", 400},
        {"GET", "/v1/responses/resp_"
                "0123456789012345678901234567890123456789012345678901234567890123456789", 400},
        {"GET", "/v1/responses/resp_0123/other", 404},
        {"GET", "/v1/responses/resp_0123", 404},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        httpc_reply r;
        CHECK(httpc_do(docs_sock, 0, cases[i].method, cases[i].path, NULL, NULL, &r) == 0);
        json_object *o = json_tokener_parse(r.body);
        CHECK_MSG(r.status == cases[i].status && httpc_jstr(o, "error.message"), "%s %s: %d %s",
                  cases[i].method, cases[i].path, r.status, r.body);
        json_object_put(o);
        httpc_reply_free(&r);
    }
    uint64_t rng;
    test_random_seed(&rng);
    static const char chars[] = "resp_ABCxyz019-/%.?&=~!$";
    for (int i = 0; i < 300; i++) {
        char path[160] = "/v1/responses/";
        size_t n = strlen(path), len = test_random(&rng) % 80;
        for (size_t k = 0; k < len; k++)
            path[n++] = chars[test_random(&rng) % (sizeof chars - 1)];
        path[n] = '\0';
        static const char *const methods[] = {"GET", "DELETE", "POST"};
        const char *m = methods[test_random(&rng) % 3];
        httpc_reply r;
        CHECK_MSG(httpc_do(docs_sock, 0, m, path, NULL, NULL, &r) == 0, "%s %s: no answer", m,
                  path);
        CHECK_MSG(r.status >= 200 && r.status < 500, "%s %s: %d %s", m, path, r.status, r.body);
        httpc_reply_free(&r);
    }
}

/* /metrics gives the store's responses and bytes. */
static void metrics_count_the_store(void)
{
    NEED_DOCS();
    httpc_reply r;
    CHECK(httpc_do(docs_sock, 0, "GET", "/metrics", NULL, NULL, &r) == 0);
    const char *n = strstr(r.body, "\nllmsd_http_responses_stored ");
    const char *b = strstr(r.body, "\nllmsd_http_responses_stored_bytes ");
    CHECK_MSG(r.status == 200 && n && b && atof(n + 29) > 0 && atof(b + 35) > 0, "%d %.3000s",
              r.status, r.body);
    httpc_reply_free(&r);
}

/* A daemon of a small responses_store_bytes keeps the newest responses: the oldest go
 * first, and one larger than the store keeps allows is answered with store false. */
static void small_store_evicts_the_oldest(void)
{
    NEED_DOCS();
    llmsd_proc d;
    char extra[1024], sock[700];
    proc_fmt(sock, sizeof sock, "%s/resp-small.sock", test_tmpdir());
    proc_fmt(extra, sizeof extra, "http_socket = %s\nthreads = 2\nn_ctx = 1024\n"
             "responses_store_bytes = 16384\n", sock);
    CHECK(proc_start(&d, llmsd_path, "resp-small", docs_path, extra) == 0);
    char ids[24][64];
    int st;
    for (int i = 0; i < 24; i++) {
        json_object *o = httpc_post_json(sock, "/v1/responses",
                                         "{\"input\":\"Hi\",\"max_output_tokens\":2}", &st);
        CHECK_MSG(st == 200 && json_object_get_boolean(httpc_jget(o, "store")), "%d %s", st,
                  json_text(o));
        snprintf(ids[i], sizeof ids[i], "%s", httpc_jstr(o, "id"));
        json_object_put(o);
    }
    /* kept: the newest ones, in a row up to the last */
    int kept = 0;
    for (int i = 23; i >= 0; i--) {
        char path[160];
        snprintf(path, sizeof path, "/v1/responses/%s", ids[i]);
        httpc_reply r;
        CHECK(httpc_do(sock, 0, "GET", path, NULL, NULL, &r) == 0);
        bool found = r.status == 200;
        httpc_reply_free(&r);
        CHECK_MSG(!found || kept == 23 - i, "response %d of 24 kept, a newer one gone", i);
        kept += found;
    }
    CHECK_MSG(kept >= 2 && kept < 24, "%d of 24 kept", kept);
    /* metadata of 16 strings of 512 bytes: more than half the store, what one response
     * may take of it */
    char body[16384] = "{\"input\":\"Hi\",\"max_output_tokens\":1,\"metadata\":{";
    for (int k = 0; k < 16; k++) {
        size_t n = strlen(body);
        n += (size_t)snprintf(body + n, sizeof body - n, "%s\"k%d\":\"", k ? "," : "", k);
        memset(body + n, 'a' + k, 512);
        snprintf(body + n + 512, sizeof body - n - 512, "\"");
    }
    strcat(body, "}}");
    json_object *o = httpc_post_json(sock, "/v1/responses", body, &st);
    CHECK_MSG(st == 200 && !json_object_get_boolean(httpc_jget(o, "store")), "%d %.300s", st,
              json_text(o));
    char path[160];
    snprintf(path, sizeof path, "/v1/responses/%s", httpc_jstr(o, "id"));
    json_object_put(o);
    httpc_reply r;
    CHECK(httpc_do(sock, 0, "GET", path, NULL, NULL, &r) == 0);
    CHECK_MSG(r.status == 404, "%d %s", r.status, r.body);
    httpc_reply_free(&r);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

/* ---- tools, on toolmodel.h's chatml model ---- */

/* The call token's text: a whole Qwen-style call (test_http_tools.c's) */
static const char CALL_PIECE[] =
    "<tool_call>\n{\"name\":" TOOLMODEL_SP "\"get_weather\"," TOOLMODEL_SP "\"arguments\":"
    TOOLMODEL_SP "{\"city\":" TOOLMODEL_SP "\"Paris\"}}\n</tool_call>";

/* The tools of toolmodel.h in the Responses' flat shape */
static const char WEATHER_TOOL[] =
    "{\"type\":\"function\",\"name\":\"get_weather\",\"description\":\"Get the weather in a "
    "city\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"
    "\"required\":[\"city\"]},\"strict\":false}";
static const char PICK_TOOL[] =
    "{\"type\":\"function\",\"name\":\"pick_day\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"day\":{\"enum\":[\"mon\",\"tue\"]},\"hours\":{\"type\":\"integer\","
    "\"minimum\":1,\"maximum\":9}},\"required\":[\"day\",\"hours\"]}}";

static char tool_model[1024], tool_sock[700];
static llmsd_proc tool_daemon;
static int tool_up;

#define NEED_TOOLS()                                                           \
    do {                                                                       \
        if (!llmsd_path[0])                                                    \
            SKIP("llmsd is not built in this tree");                           \
        if (!tool_model[0])                                                    \
            SKIP("no model could be generated");                               \
        if (!tool_up)                                                          \
            tool_up = toolmodel_start(&tool_daemon, llmsd_path, "resptools",   \
                                      tool_model, tool_sock, sizeof tool_sock) \
                              == 0 ? 1 : -1;                                   \
        CHECK_MSG(tool_up == 1, "llmsd did not start");                        \
    } while (0)

static json_object *tool_post(const char *path, const char *body, int *status)
{
    return httpc_post_json(tool_sock, path, body, status);
}

/* A function_call item as the reply of calls gives it. */
static bool is_weather_call(json_object *item)
{
    const char *id = httpc_jstr(item, "id"), *call_id = httpc_jstr(item, "call_id");
    return str_is(item, "type", "function_call") && id && !strncmp(id, "fc_", 3) && call_id &&
           !strncmp(call_id, "call_", 5) && str_is(item, "name", "get_weather") &&
           str_is(item, "arguments", "{\"city\":\"Paris\"}") && str_is(item, "status", "completed");
}

/* The model emits the call token: function_call items, no message; the prompt is the
 * chat route's with the same tools (as many tokens). */
static void function_calls_are_items(void)
{
    NEED_TOOLS();
    char body[4096];
    int st;
    snprintf(body, sizeof body,
             "{\"instructions\":\"Be brief.\",\"input\":\"Weather in Paris?\",\"tools\":[%s],"
             "\"max_output_tokens\":2,\"temperature\":0,\"logit_bias\":{\"3\":100}}", WEATHER_TOOL);
    json_object *o = tool_post("/v1/responses", body, &st);
    CHECK_MSG(o && st == 200, "%d %s", st, json_text(o));
    CHECK_MSG(str_is(o, "status", "completed"), "%s", json_text(o));
    json_object *out = httpc_jget(o, "output");
    CHECK_MSG(json_object_array_length(out) == 2, "%s", json_text(o));
    CHECK_MSG(is_weather_call(json_object_array_get_idx(out, 0)) &&
                  is_weather_call(json_object_array_get_idx(out, 1)), "%s", json_text(o));
    CHECK(strcmp(httpc_jstr(o, "output.0.call_id"), httpc_jstr(o, "output.1.call_id")) != 0);
    CHECK(strcmp(httpc_jstr(o, "output.0.id"), httpc_jstr(o, "output.1.id")) != 0);
    /* the tools are echoed as sent */
    CHECK(str_is(o, "tools.0.name", "get_weather") && str_is(o, "tools.0.type", "function"));
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\","
             "\"content\":\"Weather in Paris?\"}],\"tools\":[%s],\"max_tokens\":2,"
             "\"temperature\":0,\"logit_bias\":{\"3\":100}}", toolmodel_weather_tool);
    json_object *chat = tool_post("/v1/chat/completions", body, &st);
    CHECK(chat && st == 200);
    CHECK_EQ(atoi(httpc_jstr(o, "usage.input_tokens")),
             atoi(httpc_jstr(chat, "usage.prompt_tokens")));
    json_object_put(chat);
    json_object_put(o);

    /* parallel_tool_calls false: the first call alone; tool_choice none: the text */
    snprintf(body, sizeof body,
             "{\"input\":\"Weather in Paris?\",\"tools\":[%s],\"max_output_tokens\":2,"
             "\"temperature\":0,\"logit_bias\":{\"3\":100},\"parallel_tool_calls\":false}",
             WEATHER_TOOL);
    o = tool_post("/v1/responses", body, &st);
    CHECK_MSG(o && st == 200 && json_object_array_length(httpc_jget(o, "output")) == 1 &&
                  is_weather_call(httpc_jget(o, "output.0")), "%d %s", st, json_text(o));
    CHECK(!json_object_get_boolean(httpc_jget(o, "parallel_tool_calls")));
    json_object_put(o);
    snprintf(body, sizeof body,
             "{\"input\":\"Weather in Paris?\",\"tools\":[%s],\"max_output_tokens\":1,"
             "\"temperature\":0,\"logit_bias\":{\"3\":100},\"tool_choice\":\"none\"}",
             WEATHER_TOOL);
    o = tool_post("/v1/responses", body, &st);
    CHECK_MSG(o && st == 200 && message_text(o) && strstr(message_text(o), "<tool_call>") &&
                  str_is(o, "status", "incomplete"), "%d %s", st, json_text(o));
    json_object_put(o);
}

/* The second turn: the call and its output as items are the chat's assistant tool_calls
 * and tool message (the same prompt, as many tokens). */
static void second_turn_has_the_output(void)
{
    NEED_TOOLS();
    char body[4096];
    int st;
    snprintf(body, sizeof body,
             "{\"input\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"},{\"type\":"
             "\"function_call\",\"id\":\"fc_1\",\"call_id\":\"call_abc\",\"name\":\"get_weather\","
             "\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\",\"status\":\"completed\"},{\"type\":"
             "\"function_call_output\",\"call_id\":\"call_abc\",\"output\":\"sunny\"}],"
             "\"tools\":[%s],\"max_output_tokens\":4,\"temperature\":0}", WEATHER_TOOL);
    json_object *o = tool_post("/v1/responses", body, &st);
    CHECK_MSG(o && st == 200, "%d %s", st, json_text(o));
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"},{\"role\":"
             "\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_abc\",\"type\":"
             "\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":"
             "\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},{\"role\":\"tool\","
             "\"tool_call_id\":\"call_abc\",\"content\":\"sunny\"}],\"tools\":[%s],"
             "\"max_tokens\":4,\"temperature\":0}",
             toolmodel_weather_tool);
    json_object *chat = tool_post("/v1/chat/completions", body, &st);
    CHECK_MSG(chat && st == 200, "%d %s", st, json_text(chat));
    check_same_as_chat(o, chat);
    json_object_put(chat);
    json_object_put(o);
}

/* The Agents SDK's loop: the calls of a stored response answered by previous_response_id
 * with function_call_output items alone are the same conversation as the call, its
 * items and their outputs sent whole (the same prompt and reply). */
static void chained_call_outputs_equal_whole(void)
{
    NEED_TOOLS();
    char body[8192], outputs[1024] = "", whole[8192];
    int st;
    snprintf(body, sizeof body,
             "{\"input\":\"Weather in Paris?\",\"tools\":[%s],\"max_output_tokens\":2,"
             "\"temperature\":0,\"logit_bias\":{\"3\":100}}", WEATHER_TOOL);
    json_object *r1 = tool_post("/v1/responses", body, &st);
    CHECK_MSG(r1 && st == 200 && is_weather_call(httpc_jget(r1, "output.0")), "%d %s", st,
              json_text(r1));
    json_object *out = httpc_jget(r1, "output");
    for (size_t i = 0; i < json_object_array_length(out); i++)
        snprintf(outputs + strlen(outputs), sizeof outputs - strlen(outputs),
                 "%s{\"type\":\"function_call_output\",\"call_id\":\"%s\",\"output\":"
                 "\"sunny\"}", i ? "," : "",
                 httpc_jstr(json_object_array_get_idx(out, i), "call_id"));
    snprintf(body, sizeof body,
             "{\"previous_response_id\":\"%s\",\"input\":[%s],\"tools\":[%s],"
             "\"max_output_tokens\":4,\"temperature\":0}", httpc_jstr(r1, "id"), outputs,
             WEATHER_TOOL);
    json_object *r2 = tool_post("/v1/responses", body, &st);
    CHECK_MSG(r2 && st == 200, "%d %s", st, json_text(r2));
    /* the whole conversation: the user's message, the call items, their outputs */
    const char *items = json_object_to_json_string_ext(out, JSON_C_TO_STRING_PLAIN);
    snprintf(whole, sizeof whole,
             "{\"input\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"},%.*s,%s],"
             "\"tools\":[%s],\"max_output_tokens\":4,\"temperature\":0}",
             (int)strlen(items) - 2, items + 1, outputs, WEATHER_TOOL);
    json_object *w = tool_post("/v1/responses", whole, &st);
    CHECK_MSG(w && st == 200, "%d %s", st, json_text(w));
    CHECK_EQ(atoi(httpc_jstr(r2, "usage.input_tokens")),
             atoi(httpc_jstr(w, "usage.input_tokens")));
    CHECK_EQ(atoi(httpc_jstr(r2, "usage.output_tokens")),
             atoi(httpc_jstr(w, "usage.output_tokens")));
    CHECK_MSG(json_object_equal(httpc_jget(r2, "output.0.content"),
                                httpc_jget(w, "output.0.content")) &&
                  str_is(r2, "output.0.type", httpc_jstr(w, "output.0.type")),
              "chained %s, whole %s", json_text(httpc_jget(r2, "output")),
              json_text(httpc_jget(w, "output")));
    json_object_put(w);
    json_object_put(r2);
    json_object_put(r1);
}

/* Streamed calls: each an output item added, its arguments' delta and done, the item
 * done; the last event's response has them all. */
static void streamed_calls_are_items(void)
{
    NEED_TOOLS();
    char body[4096];
    int n;
    snprintf(body, sizeof body,
             "{\"input\":\"Weather in Paris?\",\"tools\":[%s],\"max_output_tokens\":2,"
             "\"temperature\":0,\"logit_bias\":{\"3\":100},\"stream\":true}", WEATHER_TOOL);
    sse_event *ev = stream(tool_sock, body, &n);
    CHECK(ev);
    static const char *const per_call[] = {
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done"};
    bool ok = n == 2 + 2 * 4 + 1;
    for (int c = 0; ok && c < 2; c++) {
        sse_event *e = ev + 2 + 4 * c;
        for (int k = 0; ok && k < 4; k++)
            ok = !strcmp(e[k].name, per_call[k]) &&
                 atoi(httpc_jstr(e[k].data, "output_index")) == c;
        const char *id = ok ? httpc_jstr(e[0].data, "item.id") : NULL;
        ok = ok && str_is(e[0].data, "item.type", "function_call") &&
             str_is(e[0].data, "item.arguments", "") &&
             str_is(e[1].data, "item_id", id) && str_is(e[2].data, "item_id", id) &&
             str_is(e[1].data, "delta", "{\"city\":\"Paris\"}") &&
             str_is(e[2].data, "arguments", "{\"city\":\"Paris\"}") &&
             is_weather_call(httpc_jget(e[3].data, "item")) &&
             str_is(httpc_jget(httpc_jget(ev[n - 1].data, "response.output"), c == 0 ? "0" : "1"),
                    "id", id);
    }
    CHECK_MSG(ok, "%d events: %s ... %s", n, ev[2].name, json_text(ev[n - 1].data));
    CHECK(!strcmp(ev[n - 1].name, "response.completed"));
    free_events(ev, n);
    free(ev);
}

/* A forced tool_choice ({"type": "function", "name"}, or "required"): one call, decoded
 * against the function's parameters, whole and streamed. */
static bool pick_arguments_valid(const char *args)
{
    json_object *a = args ? json_tokener_parse(args) : NULL, *day, *hours;
    bool ok = a && json_object_object_get_ex(a, "day", &day) &&
              json_object_object_get_ex(a, "hours", &hours) &&
              (!strcmp(json_object_get_string(day), "mon") ||
               !strcmp(json_object_get_string(day), "tue")) &&
              json_object_is_type(hours, json_type_int) && json_object_get_int(hours) >= 1 &&
              json_object_get_int(hours) <= 9;
    json_object_put(a);
    return ok;
}

static void forced_choice_is_one_call(void)
{
    NEED_TOOLS();
    static const char *const choices[] = {"{\"type\":\"function\",\"name\":\"pick_day\"}",
                                          "\"required\""};
    for (int c = 0; c < 2; c++) {
        char body[4096];
        int st;
        snprintf(body, sizeof body,
                 "{\"input\":\"Which day?\",\"tools\":[%s%s%s],\"tool_choice\":%s,"
                 "\"max_output_tokens\":400,\"temperature\":0}",
                 c == 0 ? WEATHER_TOOL : "", c == 0 ? "," : "", PICK_TOOL, choices[c]);
        json_object *o = tool_post("/v1/responses", body, &st);
        CHECK_MSG(o && st == 200, "%d %s", st, json_text(o));
        CHECK_MSG(str_is(o, "status", "completed") &&
                      json_object_array_length(httpc_jget(o, "output")) == 1 &&
                      str_is(o, "output.0.type", "function_call") &&
                      str_is(o, "output.0.name", "pick_day") &&
                      pick_arguments_valid(httpc_jstr(o, "output.0.arguments")),
                  "%s", json_text(o));
        if (c == 0)
            CHECK(str_is(o, "tool_choice.type", "function") &&
                  str_is(o, "tool_choice.name", "pick_day"));
        json_object_put(o);
    }
    char body[4096];
    int n;
    snprintf(body, sizeof body,
             "{\"input\":\"Which day?\",\"tools\":[%s],\"tool_choice\":\"required\","
             "\"max_output_tokens\":400,\"temperature\":0,\"stream\":true}", PICK_TOOL);
    sse_event *ev = stream(tool_sock, body, &n);
    CHECK(ev);
    int calls = 0, texts = 0;
    for (int i = 0; i < n; i++) {
        calls += !strcmp(ev[i].name, "response.function_call_arguments.done") &&
                 pick_arguments_valid(httpc_jstr(ev[i].data, "arguments"));
        texts += !strcmp(ev[i].name, "response.output_text.delta");
    }
    CHECK_MSG(calls == 1 && texts == 0, "%d calls, %d text deltas", calls, texts);
    free_events(ev, n);
    free(ev);
}

/* A failure once the stream has begun ends it with response.failed, its response holding
 * the error and the items streamed so far: here JSON mode finds no token of the tool
 * model's ASCII vocabulary to go on with the schema's "\u00e9" (written unescaped) after
 * the reply's first tokens. Whole, the same request is an HTTP error. */
static void failure_after_start_is_response_failed(void)
{
    NEED_TOOLS();
    static const char body[] =
        "{\"input\":\"Say it.\",\"max_output_tokens\":50,\"temperature\":0,\"text\":{"
        "\"format\":{\"type\":\"json_schema\",\"name\":\"e\",\"schema\":{\"type\":"
        "\"object\",\"properties\":{\"a\":{\"enum\":[\"\\u00e9\"]}},\"required\":[\"a\"]}}}%s}";
    char b[1024];
    httpc_reply r;
    snprintf(b, sizeof b, body, ",\"stream\":true");
    CHECK(httpc_do(tool_sock, 0, "POST", "/v1/responses", NULL, b, &r) == 0);
    CHECK_MSG(r.status == 200, "%d %s", r.status, r.body);
    sse_event *ev = calloc(MAX_EVENTS, sizeof *ev);
    int n = ev ? parse_events(r.body, ev, MAX_EVENTS) : -1;
    httpc_reply_free(&r);
    bool ok = n >= 4 && !strcmp(ev[0].name, "response.created");
    for (int i = 0; ok && i < n; i++)
        ok = atoi(httpc_jstr(ev[i].data, "sequence_number")) == i;
    json_object *last = ok ? httpc_jget(ev[n - 1].data, "response") : NULL;
    CHECK_MSG(ok && !strcmp(ev[n - 1].name, "response.failed") &&
                  str_is(last, "status", "failed") && str_is(last, "error.code", "server_error") &&
                  httpc_jstr(last, "error.message") &&
                  strstr(httpc_jstr(last, "error.message"), "JSON"),
              "%d events, last %s: %s", n, n > 0 ? ev[n - 1].name : "",
              n > 0 ? json_text(ev[n - 1].data) : "");
    if (n > 0)
        free_events(ev, n);
    free(ev);
    snprintf(b, sizeof b, body, "");
    int st;
    json_object *o = tool_post("/v1/responses", b, &st);
    CHECK_MSG(st == 409 && str_is(o, "error.type", "invalid_request_error"), "%d %s", st,
              json_text(o));
    json_object_put(o);
}

/* Under the sanitizers a leak or an error shows as a daemon's exit status. */
static void daemons_exit_cleanly(void)
{
    if (docs_up != 1 && tool_up != 1)
        SKIP("no daemon ran");
    llmsd_proc *d[2] = {docs_up == 1 ? &docs_daemon : NULL, tool_up == 1 ? &tool_daemon : NULL};
    docs_up = tool_up = 0;
    for (int i = 0; i < 2; i++) {
        if (!d[i])
            continue;
        int rc = proc_stop(d[i], SIGTERM);
        if (rc != 0)
            proc_print_log(d[i]);
        CHECK_EQ(rc, 0);
    }
}

int main(int argc, char **argv)
{
    (void)argc;
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    const char *p = test_data_path("models/docs-lm-21M-F16.gguf");
    docs_path = p ? strdup(p) : NULL;
    toolmodel_generate("resptools", CALL_PIECE, "{{ '<|im_start|>' }}", NULL, NULL, 0,
                       tool_model, sizeof tool_model);
    RUN(text_equals_chat);
    RUN(response_object_shape);
    RUN(llamacpp_samplers_reach_the_chat);
    RUN(streamed_equals_whole);
    RUN(text_format_is_response_format);
    RUN(refusals_are_400);
    RUN(random_bodies_never_5xx);
    RUN(metrics_name_the_route);
    RUN(chain_equals_whole_conversation);
    RUN(input_items_page);
    RUN(deleted_is_gone);
    RUN(store_false_is_not_kept);
    RUN(other_uid_sees_nothing);
    RUN(stored_routes_refuse_cleanly);
    RUN(metrics_count_the_store);
    RUN(small_store_evicts_the_oldest);
    RUN(function_calls_are_items);
    RUN(second_turn_has_the_output);
    RUN(chained_call_outputs_equal_whole);
    RUN(streamed_calls_are_items);
    RUN(forced_choice_is_one_call);
    RUN(failure_after_start_is_response_failed);
    RUN(daemons_exit_cleanly);
    free((char *)docs_path);
    return test_finish();
}
