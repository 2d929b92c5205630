/*
 * JSON mode through the HTTP gateway: response_format {"type": "json_object"} on
 * /v1/completions, /v1/chat/completions (whole and streamed) and /v1/llmsd/rag of a real
 * llmsd serving the trained documentation model. Every reply that ends with
 * finish_reason "stop" is an object json-c parses, one cut by max_tokens says "length";
 * speculation (lookup) changes no reply; json_schema is refused as a 400 that names what
 * is supported; a JSON-mode RAG query is never answered by the QA bank's free-text
 * answer. Skips without ../shared/testdata.
 */
#include <grp.h>
#include <json-c/json.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/integration/httpc.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/support/test.h"

static char llmsd_path[1024];
static const char *model_path;
static llmsd_proc daemon_;
static int daemon_up;
static char hsock[700];

#define NEED_DAEMON()                                                          \
    do {                                                                       \
        if (!llmsd_path[0])                                                    \
            SKIP("llmsd is not built in this tree");                           \
        if (!model_path)                                                       \
            SKIP("models/docs-lm-21M-F16.gguf is not in the test data");       \
        if (!daemon_up)                                                        \
            daemon_up = start_daemon() == 0 ? 1 : -1;                          \
        CHECK_MSG(daemon_up == 1, "llmsd did not start");                      \
    } while (0)

static int start_daemon(void)
{
    char extra[1024];
    struct group *g = getgrgid(getgid());
    proc_fmt(hsock, sizeof hsock, "%s/json-h.sock", test_tmpdir());
    proc_fmt(extra, sizeof extra, "http_socket = %s\nthreads = 2\nadmin_group = %s\n", hsock,
             g ? g->gr_name : "root");
    return proc_start(&daemon_, llmsd_path, "json", model_path, extra);
}

/* Whether json-c (strict, UTF-8 checked) parses text whole as one object. */
static bool is_object(const char *text)
{
    struct json_tokener *tk = json_tokener_new_ex(64);
    if (!tk)
        return false;
    json_tokener_set_flags(tk, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
    size_t n = strlen(text);
    json_object *o = json_tokener_parse_ex(tk, text, (int)n);
    bool ok = o && json_object_is_type(o, json_type_object) &&
              json_tokener_get_parse_end(tk) == n;
    json_object_put(o);
    json_tokener_free(tk);
    return ok;
}

/* POSTs a JSON-mode request to path: body_fmt is the request's fields but
 * response_format, with one %d for the seed. The reply's text and finish_reason
 * (malloc'd) after checking its shape; false after a failed CHECK's message. */
static bool ask(const char *path, const char *fields, int seed, char **text, char **finish)
{
    char body[1024];
    snprintf(body, sizeof body, "{%s,\"seed\":%d,\"response_format\":{\"type\":\"json_object\"}}",
             fields, seed);
    int st;
    json_object *o = httpc_post_json(hsock, path, body, &st);
    *text = *finish = NULL;
    if (!o || st != 200) {
        test_fail(__FILE__, __LINE__, "%s: status %d: %s", path, st,
                  o && httpc_jstr(o, "error.message") ? httpc_jstr(o, "error.message") : "");
        json_object_put(o);
        return false;
    }
    bool chat = strcmp(path, "/v1/chat/completions") == 0;
    const char *t = httpc_jstr(o, chat ? "choices.0.message.content" : "choices.0.text");
    const char *f = httpc_jstr(o, "choices.0.finish_reason");
    if (t && f) {
        *text = strdup(t);
        *finish = strdup(f);
    }
    json_object_put(o);
    if (!*text || !*finish) {
        test_fail(__FILE__, __LINE__, "%s: no text or finish_reason", path);
        return false;
    }
    return true;
}

/* A reply is an object when it stopped, a cut-short prefix of one otherwise. */
static bool check_reply(const char *text, const char *finish, int seed)
{
    if (strcmp(finish, "stop") == 0) {
        if (is_object(text))
            return true;
        test_fail(__FILE__, __LINE__, "seed %d: stopped, but '%s' is not an object", seed, text);
        return false;
    }
    if (strcmp(finish, "length") == 0 && text[strspn(text, " \t\r\n")] == '{')
        return true;
    test_fail(__FILE__, __LINE__, "seed %d: finish_reason %s, text '%s'", seed, finish, text);
    return false;
}

static void completions_are_json_objects(void)
{
    NEED_DAEMON();
    static const char *const routes[][2] = {
        {"/v1/completions",
         "\"prompt\":\"The response body is a JSON object such as\\n\",\"max_tokens\":96"},
        {"/v1/chat/completions",
         "\"messages\":[{\"role\":\"user\",\"content\":\"Show the settings of config.json.\"}],"
         "\"max_tokens\":96"},
    };
    for (size_t r = 0; r < 2; r++) {
        int stopped = 0;
        for (int seed = 1; seed <= 8; seed++) {
            char *text, *finish;
            if (!ask(routes[r][0], routes[r][1], seed, &text, &finish))
                return;
            bool ok = check_reply(text, finish, seed);
            stopped += strcmp(finish, "stop") == 0;
            free(text);
            free(finish);
            if (!ok)
                return;
        }
        CHECK_MSG(stopped > 0, "%s: no reply of 8 closed its object", routes[r][0]);
    }
}

/* Greedy too: the reply is valid however it ends. */
static void greedy_is_a_json_prefix(void)
{
    NEED_DAEMON();
    char *text, *finish;
    if (!ask("/v1/completions",
             "\"prompt\":\"Example:\\n\",\"max_tokens\":40,\"temperature\":0", 0, &text, &finish))
        return;
    bool ok = check_reply(text, finish, 0);
    free(text);
    free(finish);
    CHECK(ok);
}

/* The streamed deltas make the same text as the whole reply, and the same finish. */
static void streamed_json_equals_whole(void)
{
    NEED_DAEMON();
    const char *fields = "\"prompt\":\"The response body is a JSON object such as\\n\","
                         "\"max_tokens\":96";
    for (int seed = 1; seed <= 4; seed++) {
        char *whole, *finish;
        if (!ask("/v1/completions", fields, seed, &whole, &finish))
            return;
        char body[1024];
        snprintf(body, sizeof body,
                 "{%s,\"seed\":%d,\"stream\":true,\"response_format\":{\"type\":\"json_object\"}}",
                 fields, seed);
        httpc_reply r;
        CHECK(httpc_do(hsock, 0, "POST", "/v1/completions", NULL, body, &r) == 0);
        CHECK_EQ(r.status, 200);
        char text[8192] = "", last_finish[32] = "";
        size_t len = 0;
        char *save, *line = strtok_r(r.body, "\n", &save);
        for (; line; line = strtok_r(NULL, "\n", &save)) {
            if (strncmp(line, "data: {", 7) != 0)
                continue;
            json_object *o = json_tokener_parse(line + 6);
            const char *piece = o ? httpc_jstr(o, "choices.0.text") : NULL;
            const char *f = o ? httpc_jstr(o, "choices.0.finish_reason") : NULL;
            if (piece && len + strlen(piece) < sizeof text) {
                memcpy(text + len, piece, strlen(piece) + 1);
                len += strlen(piece);
            }
            if (f && strcmp(f, "null") != 0)
                snprintf(last_finish, sizeof last_finish, "%s", f);
            json_object_put(o);
        }
        httpc_reply_free(&r);
        bool same = strcmp(text, whole) == 0 && strcmp(last_finish, finish) == 0;
        CHECK_MSG(same, "seed %d: streamed '%s' (%s), whole '%s' (%s)", seed, text, last_finish,
                  whole, finish);
        free(whole);
        free(finish);
    }
}

/* Drafts are verified through the same constrained sampler: lookup speculation changes
 * no reply, greedy or seeded. */
static void speculation_keeps_the_replies(void)
{
    NEED_DAEMON();
    llms_conn *admin = proc_connect(&daemon_, NULL);
    llms_daemon_status before, after;
    CHECK(admin && proc_status(admin, &before) == 0);
    for (int seed = 0; seed <= 3; seed++) {
        char fields[2][512], *plain, *plain_fin, *spec, *spec_fin;
        for (int k = 0; k < 2; k++)
            snprintf(fields[k], sizeof fields[k],
                     "\"prompt\":\"The response body is a JSON object such as\\n\","
                     "\"max_tokens\":64,\"speculation\":\"%s\"%s", k ? "lookup" : "off",
                     seed == 0 ? ",\"temperature\":0" : "");
        if (!ask("/v1/completions", fields[0], seed, &plain, &plain_fin))
            return;
        if (!ask("/v1/completions", fields[1], seed, &spec, &spec_fin)) {
            free(plain);
            free(plain_fin);
            return;
        }
        bool same = strcmp(plain, spec) == 0 && strcmp(plain_fin, spec_fin) == 0;
        CHECK_MSG(same, "seed %d: without speculation '%s' (%s), with '%s' (%s)", seed, plain,
                  plain_fin, spec, spec_fin);
        free(plain);
        free(plain_fin);
        free(spec);
        free(spec_fin);
    }
    /* drafts were verified, and some taken: the replies repeat their keys */
    CHECK(proc_status(admin, &after) == 0);
    CHECK_MSG(after.spec_lookup_accepted > before.spec_lookup_accepted,
              "no lookup draft was taken (%llu proposed)",
              (unsigned long long)(after.spec_lookup_proposed - before.spec_lookup_proposed));
    llms_daemon_status_free(&before);
    llms_daemon_status_free(&after);
    llms_close(admin);
}

static void json_schema_is_refused(void)
{
    NEED_DAEMON();
    static const char *const formats[] = {
        "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"s\",\"schema\":{}}}",
        "{\"type\":\"yaml\"}", "{}", "\"json_object\""};
    for (size_t i = 0; i < sizeof formats / sizeof *formats; i++) {
        char body[512];
        snprintf(body, sizeof body,
                 "{\"prompt\":\"x\",\"max_tokens\":2,\"response_format\":%s}", formats[i]);
        int st;
        json_object *o = httpc_post_json(hsock, "/v1/completions", body, &st);
        const char *msg = o ? httpc_jstr(o, "error.message") : NULL;
        CHECK_MSG(st == 400 && msg && strstr(msg, "response_format") &&
                      strstr(msg, "json_object"),
                  "%s: status %d, '%s'", formats[i], st, msg ? msg : "");
        json_object_put(o);
    }
}

/* The QA bank keeps free-text answers: a JSON-mode query neither takes one nor leaves
 * its own for a free-text query. */
static void rag_json_mode_skips_the_qa_bank(void)
{
    NEED_DAEMON();
    llms_conn *c = proc_connect(&daemon_, LLMS_DEFAULT_APP);
    CHECK(c);
    llms_kb_doc docs[2] = {
        {"conf", "The server reads its settings from config.json when it starts.", NULL},
        {"log", "Errors are written to server.log in the state directory.", NULL},
    };
    CHECK_EQ(llms_kb_create(c, "notes", 0, 0), LLMS_OK);
    CHECK_EQ(llms_kb_add(c, "notes", docs, 2, NULL), LLMS_OK);
    llms_close(c);
    const char *text_q = "{\"kb\":\"notes\",\"question\":\"Where are the settings?\","
                         "\"max_tokens\":24,\"temperature\":0}";
    int st;
    json_object *first = httpc_post_json(hsock, "/v1/llmsd/rag", text_q, &st);
    CHECK(first && st == 200);
    json_object_put(first);
    /* the free-text answer is in the bank now */
    json_object *hit = httpc_post_json(hsock, "/v1/llmsd/rag", text_q, &st);
    CHECK(hit && st == 200);
    CHECK(strcmp(httpc_jstr(hit, "llmsd.outcome"), "qa_hit") == 0);
    json_object_put(hit);
    for (int round = 0; round < 2; round++) {
        json_object *j = httpc_post_json(
            hsock, "/v1/llmsd/rag",
            "{\"kb\":\"notes\",\"question\":\"Where are the settings?\",\"max_tokens\":24,"
            "\"temperature\":0,\"response_format\":{\"type\":\"json_object\"}}", &st);
        CHECK(j && st == 200);
        CHECK_MSG(strcmp(httpc_jstr(j, "llmsd.outcome"), "qa_hit") != 0,
                  "round %d: a JSON-mode query answered from the QA bank: '%s'", round,
                  httpc_jstr(j, "choices.0.text"));
        bool ok = check_reply(httpc_jstr(j, "choices.0.text"),
                              httpc_jstr(j, "choices.0.finish_reason"), 0);
        json_object_put(j);
        if (!ok)
            return;
    }
    /* and the free-text query still takes the free-text answer */
    hit = httpc_post_json(hsock, "/v1/llmsd/rag", text_q, &st);
    CHECK(hit && st == 200);
    CHECK(strcmp(httpc_jstr(hit, "llmsd.outcome"), "qa_hit") == 0);
    CHECK(httpc_jstr(hit, "choices.0.text")[0] != '{');
    json_object_put(hit);
}

/* libllmsclient asks for JSON mode with llms_params.format: the same seeded request
 * gives the gateway's reply, as a context's default too; DEFAULT leaves free text. */
static void native_client_asks_json_mode(void)
{
    NEED_DAEMON();
    char *want, *finish;
    if (!ask("/v1/completions", "\"prompt\":\"The response body is a JSON object such as\\n\","
             "\"max_tokens\":64,\"temperature\":0", 3, &want, &finish))
        return;
    llms_conn *c = proc_connect(&daemon_, "native-json");
    CHECK(c);
    llms_params p = LLMS_PARAMS_INIT;
    p.temperature = 0;
    p.max_tokens = 64;
    p.has_seed = 1;
    p.seed = 3;
    p.format = LLMS_FORMAT_JSON_OBJECT;
    llms_result r = {0};
    CHECK_EQ(llms_complete(c, "The response body is a JSON object such as\n", NULL, 0, &p, NULL,
                           NULL, &r), LLMS_OK);
    CHECK_MSG(!strcmp(r.text, want), "native '%s', gateway '%s'", r.text, want);
    CHECK(r.stop_reason != LLMS_STOP_EOS || is_object(r.text));
    llms_result_free(&r);
    p.format = LLMS_FORMAT_DEFAULT;
    CHECK_EQ(llms_complete(c, "The response body is a JSON object such as\n", NULL, 0, &p, NULL,
                           NULL, &r), LLMS_OK);
    CHECK_MSG(strcmp(r.text, want) != 0, "free text came out as the JSON reply: %s", r.text);
    llms_result_free(&r);
    free(want);
    free(finish);
    llms_close(c);
}

int main(int argc, char **argv)
{
    (void)argc;
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    const char *p = test_data_path("models/docs-lm-21M-F16.gguf");
    model_path = p ? strdup(p) : NULL;
    RUN(completions_are_json_objects);
    RUN(greedy_is_a_json_prefix);
    RUN(streamed_json_equals_whole);
    RUN(speculation_keeps_the_replies);
    RUN(json_schema_is_refused);
    RUN(rag_json_mode_skips_the_qa_bank);
    RUN(native_client_asks_json_mode);
    if (daemon_up == 1)
        proc_stop(&daemon_, SIGTERM);
    free((char *)model_path);
    return test_finish();
}
