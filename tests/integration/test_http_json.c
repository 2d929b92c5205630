/*
 * JSON mode through the HTTP gateway: response_format {"type": "json_object"} on
 * /v1/completions, /v1/chat/completions (whole and streamed) and /v1/llmsd/rag of a real
 * llmsd serving the trained documentation model. Every reply that ends with
 * finish_reason "stop" is an object json-c parses, one cut by max_tokens says "length";
 * speculation (lookup) changes no reply; a json_schema reply (OpenAI's, llama.cpp's and
 * ollama's shapes, and the native client's) is an instance of its schema, and what the
 * daemon cannot enforce is a 400 naming the keyword; a JSON-mode RAG query is never
 * answered by the QA bank's free-text answer. Skips without ../shared/testdata.
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

/* The schema the schema tests ask for: the shape of a small service's settings. */
#define SETTINGS_SCHEMA                                                                    \
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":24},"   \
    "\"port\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":65535},\"debug\":{\"type\":"      \
    "\"boolean\"},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"web\",\"db\",\"cache\"]},"  \
    "\"maxItems\":3}},\"required\":[\"name\",\"port\",\"debug\"]}"

/* Whether text is an instance of SETTINGS_SCHEMA (checked here by hand, not by the
 * daemon's compiler), keys in the schema's order. */
static bool is_settings(const char *text)
{
    json_object *o = json_tokener_parse(text), *v;
    bool ok = o && json_object_is_type(o, json_type_object);
    static const char *const order[] = {"name", "port", "debug", "tags"};
    int at = 0, n = 0;
    json_object_object_foreach(ok ? o : NULL, key, val)
    {
        (void)val;
        while (at < 4 && strcmp(order[at], key))
            at++;
        ok &= at < 4;
        n++;
    }
    ok = ok && n >= 3 && json_object_object_get_ex(o, "name", &v) &&
         json_object_is_type(v, json_type_string) && json_object_get_string_len(v) <= 24 &&
         json_object_object_get_ex(o, "port", &v) && json_object_is_type(v, json_type_int) &&
         json_object_get_int64(v) >= 1 && json_object_get_int64(v) <= 65535 &&
         json_object_object_get_ex(o, "debug", &v) && json_object_is_type(v, json_type_boolean);
    if (ok && json_object_object_get_ex(o, "tags", &v)) {
        ok = json_object_is_type(v, json_type_array) && json_object_array_length(v) <= 3;
        for (size_t i = 0; ok && i < json_object_array_length(v); i++) {
            const char *t = json_object_get_string(json_object_array_get_idx(v, i));
            ok = t && (!strcmp(t, "web") || !strcmp(t, "db") || !strcmp(t, "cache"));
        }
    }
    json_object_put(o);
    return ok;
}

/* OpenAI's json_schema response_format (and llama.cpp's json_object with a schema) on
 * completions and chats, greedy and seeded: a reply that stops is an instance of the
 * schema; one cut by max_tokens a prefix of it. */
static void json_schema_replies_follow_it(void)
{
    NEED_DAEMON();
    static const char *const formats[] = {
        "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"settings\",\"strict\":true,"
        "\"schema\":" SETTINGS_SCHEMA "}}",
        "{\"type\":\"json_object\",\"schema\":" SETTINGS_SCHEMA "}",
    };
    static const char *const routes[][2] = {
        {"/v1/completions", "\"prompt\":\"The service is described in config.json:\\n\""},
        {"/v1/chat/completions",
         "\"messages\":[{\"role\":\"user\",\"content\":\"Describe the web service.\"}]"},
    };
    int stopped = 0, runs = 0;
    for (size_t r = 0; r < 2; r++)
        for (int seed = 0; seed < 4; seed++) {
            char body[2048];
            snprintf(body, sizeof body, "{%s,\"max_tokens\":160,\"seed\":%d,%s"
                     "\"response_format\":%s}", routes[r][1], seed,
                     seed == 0 ? "\"temperature\":0," : "", formats[seed % 2]);
            int st;
            json_object *o = httpc_post_json(hsock, routes[r][0], body, &st);
            const char *text = o ? httpc_jstr(o, r ? "choices.0.message.content"
                                                   : "choices.0.text")
                                 : NULL;
            const char *finish = o ? httpc_jstr(o, "choices.0.finish_reason") : NULL;
            CHECK_MSG(st == 200 && text && finish, "%s seed %d: status %d", routes[r][0], seed,
                      st);
            runs++;
            if (!strcmp(finish, "stop")) {
                stopped++;
                CHECK_MSG(is_settings(text), "%s seed %d: '%s' is not an instance", routes[r][0],
                          seed, text);
            } else {
                CHECK_MSG(!strcmp(finish, "length") && text[strspn(text, " \t\r\n")] == '{',
                          "%s seed %d: %s '%s'", routes[r][0], seed, finish, text);
            }
            json_object_put(o);
        }
    printf("       %d of %d replies completed their instance\n", stopped, runs);
    CHECK(stopped * 2 >= runs);
}

/* Lookup speculation verifies its drafts through the schema's constrained sampler: the
 * same replies, greedy and seeded, as without it. */
static void speculation_keeps_schema_replies(void)
{
    NEED_DAEMON();
    for (int seed = 0; seed <= 3; seed++) {
        char *text[2] = {NULL, NULL}, *finish[2] = {NULL, NULL};
        for (int k = 0; k < 2; k++) {
            char body[2048];
            snprintf(body, sizeof body,
                     "{\"prompt\":\"The service is described in config.json:\\n\",\"max_tokens\":"
                     "120,\"seed\":%d,\"speculation\":\"%s\"%s,\"response_format\":{\"type\":"
                     "\"json_schema\",\"json_schema\":{\"name\":\"s\",\"schema\":" SETTINGS_SCHEMA
                     "}}}", seed, k ? "lookup" : "off", seed == 0 ? ",\"temperature\":0" : "");
            int st;
            json_object *o = httpc_post_json(hsock, "/v1/completions", body, &st);
            CHECK_MSG(o && st == 200, "seed %d: status %d", seed, st);
            text[k] = strdup(httpc_jstr(o, "choices.0.text"));
            finish[k] = strdup(httpc_jstr(o, "choices.0.finish_reason"));
            json_object_put(o);
        }
        CHECK_MSG(!strcmp(text[0], text[1]) && !strcmp(finish[0], finish[1]),
                  "seed %d: without speculation '%s' (%s), with '%s' (%s)", seed, text[0],
                  finish[0], text[1], finish[1]);
        for (int k = 0; k < 2; k++) {
            free(text[k]);
            free(finish[k]);
        }
    }
}

/* A pattern and a format hold the strings they constrain: every reply that stops has
 * an id of three capitals, a dash and three digits, and a date that exists. */
static void patterned_strings_follow_them(void)
{
    NEED_DAEMON();
    int stopped = 0;
    for (int seed = 0; seed < 4; seed++) {
        char body[2048];
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"Give the ticket.\"}],"
                 "\"max_tokens\":60,\"seed\":%d,%s\"response_format\":{\"type\":\"json_schema\","
                 "\"json_schema\":{\"name\":\"t\",\"schema\":{\"type\":\"object\",\"properties\":"
                 "{\"id\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{3}-\\\\d{3}$\"},\"day\":{\"type\":"
                 "\"string\",\"format\":\"date\"}},\"required\":[\"id\",\"day\"]}}}}",
                 seed, seed == 0 ? "\"temperature\":0," : "");
        int st;
        json_object *o = httpc_post_json(hsock, "/v1/chat/completions", body, &st);
        const char *text = o ? httpc_jstr(o, "choices.0.message.content") : NULL;
        const char *finish = o ? httpc_jstr(o, "choices.0.finish_reason") : NULL;
        CHECK_MSG(st == 200 && text && finish, "seed %d: status %d", seed, st);
        if (text && finish && !strcmp(finish, "stop")) {
            stopped++;
            json_object *r = json_tokener_parse(text), *id, *day;
            char caps[4], digits[4];
            int y, m, d, end = 0;
            bool ok = r && json_object_object_get_ex(r, "id", &id) &&
                      json_object_object_get_ex(r, "day", &day) &&
                      json_object_get_string_len(id) == 7 &&
                      sscanf(json_object_get_string(id), "%3[A-Z]-%3[0-9]", caps, digits) == 2 &&
                      strlen(caps) == 3 && strlen(digits) == 3 &&
                      json_object_get_string_len(day) == 10 &&
                      sscanf(json_object_get_string(day), "%4d-%2d-%2d%n", &y, &m, &d, &end) == 3 &&
                      end == 10 && m >= 1 && m <= 12 && d >= 1 &&
                      d <= (m == 2 ? 28 + ((y % 4 == 0 && y % 100) || y % 400 == 0)
                                   : 30 + ((m + m / 8) % 2));
            CHECK_MSG(ok, "seed %d: '%s' breaks the pattern or the format", seed, text);
            json_object_put(r);
        }
        json_object_put(o);
    }
    printf("       %d of 4 replies completed their instance\n", stopped);
    CHECK(stopped >= 2);
}

/* What cannot be enforced is refused as a 400 naming it; so is a malformed format. */
static void json_schema_refusals(void)
{
    NEED_DAEMON();
    static const struct {
        const char *format, *says;
    } cases[] = {
        {"{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"s\",\"schema\":{\"type\":"
         "\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"^(?!x)\"}}}}}",
         "'pattern' at #/properties/a: "},
        {"{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"s\",\"schema\":{\"type\":"
         "\"array\",\"uniqueItems\":true}}}", "'uniqueItems' at # is not supported"},
        {"{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"s\",\"schema\":{\"type\":"
         "\"string\"}}}", "top-level value must be an object or an array"},
        {"{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"s\"}}", "json_schema.schema"},
        {"{\"type\":\"json_object\",\"schema\":3}", "response_format.schema"},
        {"{\"type\":\"yaml\"}", "json_schema"},
        {"{}", "response_format"},
        {"\"json_object\"", "response_format"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char body[1024];
        snprintf(body, sizeof body,
                 "{\"prompt\":\"x\",\"max_tokens\":2,\"response_format\":%s}", cases[i].format);
        int st;
        json_object *o = httpc_post_json(hsock, "/v1/completions", body, &st);
        const char *msg = o ? httpc_jstr(o, "error.message") : NULL;
        CHECK_MSG(st == 400 && msg && strstr(msg, cases[i].says), "%s: status %d, '%s'",
                  cases[i].format, st, msg ? msg : "");
        json_object_put(o);
    }
}

/* ollama's format with a schema: /api/generate and /api/chat reply with an instance. */
static void ollama_format_schema(void)
{
    NEED_DAEMON();
    static const char *const reqs[][2] = {
        {"/api/generate", "\"prompt\":\"The service is described in config.json:\\n\""},
        {"/api/chat", "\"messages\":[{\"role\":\"user\",\"content\":\"Describe it.\"}]"},
    };
    for (size_t i = 0; i < 2; i++) {
        char body[2048];
        snprintf(body, sizeof body, "{\"model\":\"docs-lm-21M-F16\",%s,\"stream\":false,"
                 "\"options\":{\"temperature\":0,\"num_predict\":200},\"format\":"
                 SETTINGS_SCHEMA "}", reqs[i][1]);
        int st;
        json_object *o = httpc_post_json(hsock, reqs[i][0], body, &st);
        const char *text = o ? httpc_jstr(o, i ? "message.content" : "response") : NULL;
        const char *why = o ? httpc_jstr(o, "done_reason") : NULL;
        CHECK_MSG(st == 200 && text && why, "%s: status %d", reqs[i][0], st);
        CHECK_MSG(strcmp(why, "stop") || is_settings(text), "%s: '%s' is not an instance",
                  reqs[i][0], text);
        json_object_put(o);
    }
    int st;
    json_object *o = httpc_post_json(hsock, "/api/generate",
                                     "{\"model\":\"docs-lm-21M-F16\",\"prompt\":\"x\",\"format\":"
                                     "{\"type\":\"object\",\"minProperties\":1}}", &st);
    const char *msg = o ? httpc_jstr(o, "error") : NULL;
    CHECK_MSG(st == 400 && msg && strstr(msg, "'minProperties'"), "status %d, '%s'", st,
              msg ? msg : "");
    json_object_put(o);
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

/* llms_params.json_schema with LLMS_FORMAT_JSON_SCHEMA: the gateway's greedy reply, as a
 * context's default too; a schema without the format is refused. */
static void native_client_asks_a_schema(void)
{
    NEED_DAEMON();
    int st;
    json_object *o = httpc_post_json(
        hsock, "/v1/completions",
        "{\"prompt\":\"The service is described in config.json:\\n\",\"max_tokens\":160,"
        "\"temperature\":0,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
        "{\"name\":\"s\",\"schema\":" SETTINGS_SCHEMA "}}}", &st);
    CHECK(o && st == 200);
    char *want = strdup(httpc_jstr(o, "choices.0.text"));
    json_object_put(o);
    llms_conn *c = proc_connect(&daemon_, "native-schema");
    CHECK(c && want);
    llms_params p = LLMS_PARAMS_INIT;
    p.temperature = 0;
    p.max_tokens = 160;
    p.format = LLMS_FORMAT_JSON_SCHEMA;
    p.json_schema = SETTINGS_SCHEMA;
    llms_result r = {0};
    CHECK_EQ(llms_complete(c, "The service is described in config.json:\n", NULL, 0, &p, NULL,
                           NULL, &r), LLMS_OK);
    CHECK_MSG(!strcmp(r.text, want), "native '%s', gateway '%s'", r.text, want);
    llms_result_free(&r);
    /* a context's default: its calls follow the schema without asking */
    char id[LLMS_ID_MAX];
    CHECK_EQ(llms_context_create(c, NULL, &p, id), LLMS_OK);
    CHECK_EQ(llms_call(c, id, "Describe the web service.", NULL, NULL, NULL, &r), LLMS_OK);
    CHECK_MSG(r.stop_reason != LLMS_STOP_EOS || is_settings(r.text), "'%s'", r.text);
    CHECK_MSG(r.text[strspn(r.text, " \t\r\n")] == '{', "reply %s", r.text);
    llms_result_free(&r);
    p.format = LLMS_FORMAT_JSON_OBJECT;
    CHECK_EQ(llms_complete(c, "x", NULL, 0, &p, NULL, NULL, &r), LLMS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(llms_last_error(c), "json_schema is given without"), "%s",
              llms_last_error(c));
    free(want);
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
    RUN(json_schema_replies_follow_it);
    RUN(speculation_keeps_schema_replies);
    RUN(patterned_strings_follow_them);
    RUN(json_schema_refusals);
    RUN(ollama_format_schema);
    RUN(rag_json_mode_skips_the_qa_bank);
    RUN(native_client_asks_json_mode);
    RUN(native_client_asks_a_schema);
    if (daemon_up == 1)
        proc_stop(&daemon_, SIGTERM);
    free((char *)model_path);
    return test_finish();
}
