/*
 * GBNF grammars (llama.cpp's `grammar`) through a real llmsd serving the trained
 * documentation model: the gateway's completions and chats, and the native client's
 * LLMS_FORMAT_GRAMMAR, also as a context's default. Every reply that ends with
 * finish_reason "stop" is a whole sentence of the grammar, checked here by a POSIX
 * regular expression of the same language (not by the daemon's recogniser); lookup
 * speculation changes no reply; a grammar the daemon cannot compile, or one beside a
 * JSON format, is a 400 that says why. Skips without ../shared/testdata.
 */
#include <grp.h>
#include <json-c/json.h>
#include <regex.h>
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
    proc_fmt(hsock, sizeof hsock, "%s/gbnf-h.sock", test_tmpdir());
    proc_fmt(extra, sizeof extra, "http_socket = %s\nthreads = 2\nadmin_group = %s\n", hsock,
             g ? g->gr_name : "root");
    return proc_start(&daemon_, llmsd_path, "gbnf", model_path, extra);
}

/* A short list the model ends itself: nothing may follow the final '.', so a reply
 * that stops there is complete. Written as a JSON string (the request's field). */
#define LIST_GRAMMAR                                                                       \
    "root ::= \\\"Answer: \\\" item (\\\",\\\" \\\" \\\"? item){0,3} \\\".\\\"\\n"              \
    "# an item: a short word or a small number\\n"                                          \
    "item ::= [a-z]{1,12} | [0-9]{1,3}\\n"

/* LIST_GRAMMAR's language, as an extended regular expression. */
#define LIST_REGEX "^Answer: ([a-z]{1,12}|[0-9]{1,3})(, ?([a-z]{1,12}|[0-9]{1,3})){0,3}\\.$"

/* The same grammar as the native client passes it (plain C text). */
#define LIST_GRAMMAR_C                                                                     \
    "root ::= \"Answer: \" item (\",\" \" \"? item){0,3} \".\"\n"                          \
    "# an item: a short word or a small number\n"                                          \
    "item ::= [a-z]{1,12} | [0-9]{1,3}\n"

static bool matches(const char *text, const char *ere)
{
    regex_t re;
    if (regcomp(&re, ere, REG_EXTENDED | REG_NOSUB))
        return false;
    bool ok = regexec(&re, text, 0, NULL, 0) == 0;
    regfree(&re);
    return ok;
}

/* POSTs body to path; the reply's text and finish_reason (malloc'd) after checking its
 * status; false after a failed CHECK's message. */
static bool ask(const char *path, const char *body, char **text, char **finish)
{
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

/* A stopped reply is a sentence; one cut by max_tokens at least starts as one. */
static bool check_reply(const char *text, const char *finish, int seed)
{
    if (strcmp(finish, "stop") == 0 && matches(text, LIST_REGEX))
        return true;
    if (strcmp(finish, "length") == 0 && strncmp(text, "Answer: ", 8) == 0)
        return true;
    test_fail(__FILE__, __LINE__, "seed %d: finish_reason %s, text '%s'", seed, finish, text);
    return false;
}

static void replies_are_sentences_of_the_grammar(void)
{
    NEED_DAEMON();
    static const char *const routes[][2] = {
        {"/v1/completions", "\"prompt\":\"Which ports does the service listen on?\\n\""},
        {"/v1/chat/completions",
         "\"messages\":[{\"role\":\"user\",\"content\":\"Name the settings of the cache.\"}]"},
    };
    for (size_t r = 0; r < 2; r++) {
        int stopped = 0;
        for (int seed = 0; seed <= 6; seed++) {
            char body[1024], *text, *finish;
            snprintf(body, sizeof body, "{%s,\"max_tokens\":48,\"seed\":%d%s,\"grammar\":\"%s\"}",
                     routes[r][1], seed, seed == 0 ? ",\"temperature\":0" : "", LIST_GRAMMAR);
            if (!ask(routes[r][0], body, &text, &finish))
                return;
            bool ok = check_reply(text, finish, seed);
            stopped += strcmp(finish, "stop") == 0;
            free(text);
            free(finish);
            if (!ok)
                return;
        }
        CHECK_MSG(stopped > 0, "%s: no reply of 7 ended its sentence", routes[r][0]);
    }
}

/* Lookup drafts go through the same constrained sampler: the replies do not change. */
static void speculation_keeps_the_replies(void)
{
    NEED_DAEMON();
    for (int seed = 0; seed <= 3; seed++) {
        char body[2][1024], *text[2], *finish[2];
        for (int k = 0; k < 2; k++)
            snprintf(body[k], sizeof body[k],
                     "{\"prompt\":\"Answer: web, db, cache.\\nAnswer: web, db, cache.\\n\","
                     "\"max_tokens\":48,\"seed\":%d,\"speculation\":\"%s\"%s,\"grammar\":\"%s\"}",
                     seed, k ? "lookup" : "off", seed == 0 ? ",\"temperature\":0" : "",
                     LIST_GRAMMAR);
        if (!ask("/v1/completions", body[0], &text[0], &finish[0]))
            return;
        if (!ask("/v1/completions", body[1], &text[1], &finish[1])) {
            free(text[0]);
            free(finish[0]);
            return;
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

static void grammar_refusals(void)
{
    NEED_DAEMON();
    static const struct {
        const char *fields, *says;
    } cases[] = {
        {"\"grammar\":\"root ::= item\\n\"", "item"},
        {"\"grammar\":\"item ::= \\\"a\\\"\\n\"", "root"},
        {"\"grammar\":\"root ::= root \\\"a\\\" | \\\"b\\\"\\n\"", "recurs"},
        {"\"grammar\":\"root ::= \\\"a\\n\"", "unclosed string at 1:10"},
        {"\"grammar\":7", "'grammar'"},
        {"\"grammar\":\"root ::= \\\"a\\\"\",\"response_format\":{\"type\":\"json_object\"}",
         "give one of them"},
        {"\"grammar\":\"root ::= \\\"a\\\"\",\"json_schema\":{\"type\":\"object\"}",
         "give one of them"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char body[1024];
        snprintf(body, sizeof body, "{\"prompt\":\"x\",\"max_tokens\":2,%s}", cases[i].fields);
        int st;
        json_object *o = httpc_post_json(hsock, "/v1/completions", body, &st);
        const char *msg = o ? httpc_jstr(o, "error.message") : NULL;
        CHECK_MSG(st == 400 && msg && strstr(msg, cases[i].says), "%s: status %d, '%s'",
                  cases[i].fields, st, msg ? msg : "");
        json_object_put(o);
    }
    /* an empty grammar is none, as llama.cpp takes it */
    char *text, *finish;
    if (ask("/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":2,\"grammar\":\"\"}", &text,
            &finish)) {
        free(text);
        free(finish);
    }
}

/* llama.cpp's top-level json_schema is structured output, as response_format's is. */
static void top_level_json_schema(void)
{
    NEED_DAEMON();
    char *text, *finish;
    if (!ask("/v1/completions",
             "{\"prompt\":\"config.json:\\n\",\"max_tokens\":64,\"temperature\":0,"
             "\"json_schema\":{\"type\":\"object\",\"properties\":{\"port\":{\"type\":"
             "\"integer\",\"minimum\":1,\"maximum\":65535}},\"required\":[\"port\"],"
             "\"additionalProperties\":false}}",
             &text, &finish))
        return;
    CHECK_MSG(strcmp(finish, "stop") != 0 || matches(text, "^[[:space:]]*\\{[[:space:]]*\"port\""
                                                           "[[:space:]]*:[[:space:]]*[1-9][0-9]{0,4}"
                                                           "[[:space:]]*\\}$"),
              "%s: '%s'", finish, text);
    CHECK_MSG(text[strspn(text, " \t\r\n")] == '{', "'%s'", text);
    free(text);
    free(finish);
}

static void native_client_asks_a_grammar(void)
{
    NEED_DAEMON();
    char body[1024], *want, *finish;
    snprintf(body, sizeof body,
             "{\"prompt\":\"Which ports does the service listen on?\\n\",\"max_tokens\":48,"
             "\"temperature\":0,\"grammar\":\"%s\"}", LIST_GRAMMAR);
    if (!ask("/v1/completions", body, &want, &finish))
        return;
    free(finish);
    llms_conn *c = proc_connect(&daemon_, "native-gbnf");
    CHECK(c);
    llms_params p = LLMS_PARAMS_INIT;
    p.temperature = 0;
    p.max_tokens = 48;
    p.format = LLMS_FORMAT_GRAMMAR;
    p.grammar = LIST_GRAMMAR_C;
    llms_result r = {0};
    CHECK_EQ(llms_complete(c, "Which ports does the service listen on?\n", NULL, 0, &p, NULL,
                           NULL, &r), LLMS_OK);
    CHECK_MSG(!strcmp(r.text, want), "native '%s', gateway '%s'", r.text, want);
    llms_result_free(&r);
    /* a context's default: its calls follow the grammar without asking */
    char id[LLMS_ID_MAX];
    CHECK_EQ(llms_context_create(c, NULL, &p, id), LLMS_OK);
    CHECK_EQ(llms_call(c, id, "Name the settings of the cache.", NULL, NULL, NULL, &r), LLMS_OK);
    CHECK_MSG(r.stop_reason != LLMS_STOP_EOS || matches(r.text, LIST_REGEX), "'%s'", r.text);
    CHECK_MSG(!strncmp(r.text, "Answer: ", 8), "reply %s", r.text);
    llms_result_free(&r);
    /* the grammar goes with its format, and only with it */
    p.format = LLMS_FORMAT_JSON_OBJECT;
    CHECK_EQ(llms_complete(c, "x", NULL, 0, &p, NULL, NULL, &r), LLMS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(llms_last_error(c), "grammar is given without format FORMAT_GRAMMAR"),
              "%s", llms_last_error(c));
    p.format = LLMS_FORMAT_GRAMMAR;
    p.grammar = NULL;
    CHECK_EQ(llms_complete(c, "x", NULL, 0, &p, NULL, NULL, &r), LLMS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(llms_last_error(c), "format FORMAT_GRAMMAR needs grammar"), "%s",
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
    RUN(replies_are_sentences_of_the_grammar);
    RUN(speculation_keeps_the_replies);
    RUN(grammar_refusals);
    RUN(top_level_json_schema);
    RUN(native_client_asks_a_grammar);
    if (daemon_up == 1)
        proc_stop(&daemon_, SIGTERM);
    free((char *)model_path);
    return test_finish();
}
