/*
 * llama.cpp's server's own API on the HTTP gateway (daemon/net/llamacpp.c) end to end: a
 * real llmsd serving the trained documentation model of ../shared/testdata (skips
 * without it), its gateway on a Unix socket and a TCP port with a bearer token.
 * POST /completion (and /completions) gives exactly /v1/completions' greedy text for the
 * same prompt; a prompt of token ids (or strings and ids mixed) is the prompt those ids
 * are, with BOS only before text; n_predict, stop words, streaming (Server-Sent Events
 * whose contents add up to the whole reply), n_probs, logit_bias, json_schema, the
 * samplers list (any order), DRY (which breaks the loop greedy decoding falls into),
 * Mirostat, locally typical, XTC, top-n-sigma and dynamic temperature (each changes a
 * seeded reply; on the OpenAI routes too) and the prompt cache (tokens_cached) as
 * llama.cpp's server answers them;
 * GET /props the daemon's defaults; what cannot be honoured is 400 naming the field,
 * and every error is llama.cpp's {"error": {"code", "message", "type"}}. The routes its
 * users' scripts call next: POST /apply-template renders the prompt /v1/chat/completions
 * evaluates (chatml, set for the model, with tools), /embedding and /embeddings give
 * /v1/embeddings' vectors in llama.cpp's shape (docs-embed-5M as the embed model),
 * /reranking and /v1/reranking are /v1/rerank (which takes TEI's "texts" too, answered
 * in TEI's shape), /tokenize's with_pieces gives each token's text or bytes, and /slots
 * is refused 501 as llama.cpp refuses it, as is /infill on this model, which has no
 * fill-in-the-middle tokens (test_http_infill serves one that has).
 */
#include <grp.h>
#include <json-c/json.h>
#include <math.h>
#include <regex.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/integration/httpc.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/integration/randjson.h"
#include "tests/support/test.h"

#define TOKEN_USER "tok-llamacpp-0123456789"
#define PROMPT "The gateway answers"

static char llmsd_path[1024];
static const char *model_path;
static const char *embed_path; /* docs-embed-5M, the daemon's embed model; NULL: absent */
static llmsd_proc daemon_;
static int daemon_up;
static char hsock[700];
static int port;

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

/* Generation defaults of its own, so that /props shows the settings' and not built-in
 * values by chance; chatml for the model, which has no template of its own, so that
 * chats render with tools. */
static int start_daemon(void)
{
    char tokens[700], extra[2048], embed[1100] = "";
    proc_fmt(tokens, sizeof tokens, "%s/lc-tokens", test_tmpdir());
    FILE *f = fopen(tokens, "w");
    if (!f)
        return -1;
    fprintf(f, "%s %u lcapp\n", TOKEN_USER, (unsigned)getuid());
    fclose(f);
    chmod(tokens, 0600);
    port = httpc_free_port();
    struct group *g = getgrgid(getgid());
    proc_fmt(hsock, sizeof hsock, "%s/lc-h.sock", test_tmpdir());
    if (embed_path)
        proc_fmt(embed, sizeof embed, "embed_model = %s\n", embed_path);
    proc_fmt(extra, sizeof extra,
             "http_socket = %s\nhttp_listen = 127.0.0.1:%d\nhttp_tokens_file = %s\n"
             "threads = 2\nadmin_group = %s\nchat_template = chatml\ntemperature = 0.7\n"
             "top_k = 30\ntop_p = 0.9\n"
             "min_p = 0.02\nrepeat_penalty = 1.0\nrepeat_last_n = 48\nmax_tokens = 100\n%s",
             hsock, port, tokens, g ? g->gr_name : "root", embed);
    return proc_start(&daemon_, llmsd_path, "lc", model_path, extra);
}

static json_object *post(const char *path, const char *body, int *status)
{
    return httpc_post_json(hsock, path, body, status);
}

static const char *json_text(json_object *o)
{
    return o ? json_object_to_json_string(o) : "(none)";
}

static int64_t jint(json_object *o, const char *path)
{
    const char *s = httpc_jstr(o, path);
    return s ? strtoll(s, NULL, 10) : -1;
}

static double jnum(json_object *o, const char *path)
{
    const char *s = httpc_jstr(o, path);
    return s ? strtod(s, NULL) : -1e300;
}

static bool jeq(json_object *o, const char *path, const char *want)
{
    const char *s = httpc_jstr(o, path);
    return s && strcmp(s, want) == 0;
}

/* POSTs a /completion body: its reply (status 200 and "content" checked), NULL after a
 * failed check's message. */
static json_object *complete(const char *body)
{
    int st;
    json_object *o = post("/completion", body, &st);
    if (st != 200 || !httpc_jstr(o, "content")) {
        test_fail(__FILE__, __LINE__, "%s: %d %s", body, st, json_text(o));
        json_object_put(o);
        return NULL;
    }
    return o;
}

/* /v1/completions' greedy text of prompt (malloc'd), its token counts in *prompt_tokens
 * and *gen_tokens. */
static char *openai_greedy(const char *prompt_json, int max_tokens, int *prompt_tokens,
                           int *gen_tokens)
{
    char body[4096];
    snprintf(body, sizeof body, "{\"prompt\":%s,\"max_tokens\":%d,\"temperature\":0}",
             prompt_json, max_tokens);
    int st;
    json_object *o = post("/v1/completions", body, &st);
    const char *t = httpc_jstr(o, "choices.0.text");
    char *text = st == 200 && t ? strdup(t) : NULL;
    if (!text)
        test_fail(__FILE__, __LINE__, "/v1/completions: %d %s", st, json_text(o));
    *prompt_tokens = (int)jint(o, "usage.prompt_tokens");
    *gen_tokens = (int)jint(o, "usage.completion_tokens");
    json_object_put(o);
    return text;
}

/* The ids /tokenize gives text (add_special: with BOS when the model adds one), as a
 * JSON array's text (malloc'd); *n of them. */
static char *tokenize(const char *text, bool add_special, int *n)
{
    char body[2048];
    snprintf(body, sizeof body, "{\"content\":\"%s\",\"add_special\":%s}", text,
             add_special ? "true" : "false");
    int st;
    json_object *o = post("/tokenize", body, &st), *toks = httpc_jget(o, "tokens");
    char *ids = st == 200 && toks ? strdup(json_object_to_json_string_ext(toks,
                                                                         JSON_C_TO_STRING_PLAIN))
                                  : NULL;
    *n = toks ? (int)json_object_array_length(toks) : -1;
    if (!ids)
        test_fail(__FILE__, __LINE__, "/tokenize: %d %s", st, json_text(o));
    json_object_put(o);
    return ids;
}

/* ---- SSE ---- */

typedef struct events {
    json_object *ev[1024];
    size_t n;
} events;

static void events_free(events *e)
{
    for (size_t i = 0; i < e->n; i++)
        json_object_put(e->ev[i]);
    e->n = 0;
}

/* POSTs body to path and reads its Server-Sent Events (each "data: {...}"): the HTTP
 * status, -1 when the reply is no event stream or an event no JSON object. */
static int post_sse(const char *path, const char *body, events *e)
{
    httpc_reply r;
    e->n = 0;
    if (httpc_do(hsock, 0, "POST", path, NULL, body, &r))
        return 0;
    int status = r.status;
    if (status == 200 && !strstr(r.head, "text/event-stream"))
        status = -1;
    char *save;
    for (char *line = strtok_r(r.body, "\n", &save); line && status == 200;
         line = strtok_r(NULL, "\n", &save)) {
        json_object *o = strncmp(line, "data: ", 6) == 0 ? json_tokener_parse(line + 6) : NULL;
        if (!json_object_is_type(o, json_type_object) || e->n == 1024) {
            fprintf(stderr, "not an event of a JSON object: '%s'\n", line);
            json_object_put(o);
            status = -1;
            break;
        }
        e->ev[e->n++] = o;
    }
    httpc_reply_free(&r);
    return status;
}

/* ---- errors ---- */

/* llama.cpp's error: the status, and {"error": {"code": status, "message" containing
 * want, "type": type}}. */
static void expect_error(const char *method, const char *path, const char *body, int status,
                         const char *type, const char *want)
{
    httpc_reply r;
    CHECK(httpc_do(hsock, 0, method, path, NULL, body, &r) == 0);
    json_object *o = json_tokener_parse(r.body);
    const char *m = httpc_jstr(o, "error.message");
    bool ok = r.status == status && jint(o, "error.code") == status &&
              jeq(o, "error.type", type) && m && strstr(m, want);
    CHECK_MSG(ok, "%s %s %.300s: %d %s (want %d %s '%s')", method, path, body ? body : "",
              r.status, r.body, status, type, want);
    json_object_put(o);
    httpc_reply_free(&r);
}

/* ---- tests ---- */

static void props_answers_the_defaults(void)
{
    NEED_DAEMON();
    httpc_reply r;
    CHECK(httpc_do(hsock, 0, "GET", "/props", NULL, NULL, &r) == 0);
    json_object *o = json_tokener_parse(r.body);
    CHECK_MSG(r.status == 200 && o, "%d %s", r.status, r.body);
    httpc_reply_free(&r);
    CHECK_MSG(jint(o, "default_generation_settings.n_ctx") == 512 &&
                  jint(o, "default_generation_settings.params.top_k") == 30 &&
                  jnum(o, "default_generation_settings.params.temperature") > 0.69 &&
                  jnum(o, "default_generation_settings.params.temperature") < 0.71 &&
                  jnum(o, "default_generation_settings.params.top_p") > 0.89 &&
                  jnum(o, "default_generation_settings.params.top_p") < 0.91 &&
                  jnum(o, "default_generation_settings.params.min_p") > 0.019 &&
                  jnum(o, "default_generation_settings.params.min_p") < 0.021 &&
                  jnum(o, "default_generation_settings.params.repeat_penalty") == 1 &&
                  jint(o, "default_generation_settings.params.repeat_last_n") == 48 &&
                  jint(o, "default_generation_settings.params.n_predict") == 100 &&
                  jint(o, "default_generation_settings.params.seed") == 4294967295 &&
                  httpc_jget(o, "default_generation_settings.params.samplers") &&
                  httpc_jget(o, "default_generation_settings.params.stop") &&
                  jint(o, "total_slots") > 0 && httpc_jstr(o, "model_path") &&
                  strstr(httpc_jstr(o, "model_path"), "docs-lm-21M-F16.gguf") &&
                  jeq(o, "build_info", LLMS_VERSION) && httpc_jstr(o, "chat_template") &&
                  httpc_jstr(o, "chat_template")[0],
              "%s", json_text(o));
    json_object_put(o);
    /* HEAD too, as every GET route */
    CHECK(httpc_do(hsock, 0, "HEAD", "/props", NULL, NULL, &r) == 0);
    CHECK_EQ(r.status, 200);
    httpc_reply_free(&r);
    /* changing them is refused, as llama.cpp's server does without --props */
    expect_error("POST", "/props", "{\"n_ctx\":4}", 501, "not_supported_error", "--props");
}

/* The reply's shape and counts against /v1/completions' for the same prompt. */
static void greedy_equals_openai(void)
{
    NEED_DAEMON();
    int pt, gt;
    char *want = openai_greedy("\"" PROMPT "\"", 16, &pt, &gt);
    if (!want)
        return;
    static const char *const routes[] = {"/completion", "/completions"};
    for (size_t i = 0; i < 2; i++) {
        int st;
        json_object *o = post(routes[i],
                              "{\"prompt\":\"" PROMPT "\",\"n_predict\":16,\"temperature\":0,"
                              "\"cache_prompt\":true,\"id_slot\":-1}", &st);
        CHECK_MSG(st == 200 && jeq(o, "content", want), "%s: %d %s, want '%s'", routes[i], st,
                  json_text(o), want);
        const char *stop_type = httpc_jstr(o, "stop_type");
        CHECK_MSG(jeq(o, "stop", "true") && jint(o, "id_slot") == 0 &&
                      jint(o, "tokens_predicted") == gt && jint(o, "tokens_evaluated") == pt &&
                      jeq(o, "prompt", PROMPT) && jeq(o, "truncated", "false") &&
                      jeq(o, "has_new_line", strchr(want, '\n') ? "true" : "false") &&
                      stop_type && (!strcmp(stop_type, gt == 16 ? "limit" : "eos")) &&
                      jeq(o, "stopping_word", "") && jint(o, "tokens_cached") >= 0 &&
                      httpc_jstr(o, "model") && httpc_jstr(o, "model")[0] &&
                      jint(o, "generation_settings.n_predict") == 16 &&
                      jnum(o, "generation_settings.temperature") == 0 &&
                      jint(o, "generation_settings.top_k") == 30 &&
                      jint(o, "timings.predicted_n") == gt &&
                      jint(o, "timings.prompt_n") == pt - jint(o, "tokens_cached") &&
                      jnum(o, "timings.predicted_ms") > 0 &&
                      jnum(o, "timings.predicted_per_second") > 0 &&
                      httpc_jget(o, "timings.prompt_ms") &&
                      httpc_jget(o, "timings.prompt_per_token_ms") &&
                      httpc_jget(o, "timings.prompt_per_second") &&
                      httpc_jget(o, "timings.predicted_per_token_ms"),
                  "%s: %s", routes[i], json_text(o));
        json_object_put(o);
    }
    free(want);
}

/* A prompt of token ids is those tokens, with no BOS added; one of strings and ids mixed
 * gets BOS before its first string when it starts with one (llama.cpp's rule). */
static void token_prompts_are_their_tokens(void)
{
    NEED_DAEMON();
    int pt, gt, n_bos, n_plain, n_rest;
    char *want = openai_greedy("\"" PROMPT "\"", 12, &pt, &gt);
    char *with_bos = tokenize(PROMPT, true, &n_bos);
    char *plain = tokenize(PROMPT, false, &n_plain);
    char *rest = tokenize(" and more", false, &n_rest);
    CHECK(want && with_bos && plain && rest);
    CHECK_EQ(n_bos, pt);
    char body[4096];
    /* the text's own tokens, BOS included: the same reply */
    snprintf(body, sizeof body, "{\"prompt\":%s,\"n_predict\":12,\"temperature\":0}", with_bos);
    json_object *o = complete(body);
    CHECK(o);
    CHECK_MSG(jeq(o, "content", want) && jint(o, "tokens_evaluated") == pt,
              "%s: %s, want '%s'", body, json_text(o), want);
    /* a token prompt has no "prompt" text to give back */
    CHECK(!httpc_jget(o, "prompt"));
    json_object_put(o);
    /* one prompt in an array of one is that prompt */
    snprintf(body, sizeof body, "{\"prompt\":[%s],\"n_predict\":12,\"temperature\":0}", with_bos);
    CHECK((o = complete(body)));
    CHECK_MSG(jeq(o, "content", want), "%s: %s", body, json_text(o));
    json_object_put(o);
    /* ids without BOS: none is added */
    snprintf(body, sizeof body, "{\"prompt\":%s,\"n_predict\":2,\"temperature\":0}", plain);
    CHECK((o = complete(body)));
    CHECK_MSG(jint(o, "tokens_evaluated") == n_plain, "%s: %s", body, json_text(o));
    json_object_put(o);
    /* mixed: the string's tokens (with BOS, as it comes first), then the ids */
    snprintf(body, sizeof body, "{\"prompt\":[%.*s,%.*s],\"n_predict\":8,\"temperature\":0}",
             (int)strlen(with_bos) - 2, with_bos + 1, (int)strlen(rest) - 2, rest + 1);
    CHECK((o = complete(body)));
    char *want_mixed = strdup(httpc_jstr(o, "content"));
    CHECK_EQ(jint(o, "tokens_evaluated"), n_bos + n_rest);
    json_object_put(o);
    snprintf(body, sizeof body, "{\"prompt\":[\"" PROMPT "\",%.*s],\"n_predict\":8,"
             "\"temperature\":0}", (int)strlen(rest) - 2, rest + 1);
    CHECK((o = complete(body)));
    CHECK_MSG(jeq(o, "content", want_mixed) && jint(o, "tokens_evaluated") == n_bos + n_rest,
              "%s: %s, want '%s'", body, json_text(o), want_mixed);
    json_object_put(o);
    /* ids first: no BOS before the string that follows them */
    snprintf(body, sizeof body, "{\"prompt\":[%.*s,\" and more\"],\"n_predict\":2}",
             (int)strlen(plain) - 2, plain + 1);
    CHECK((o = complete(body)));
    CHECK_MSG(jint(o, "tokens_evaluated") == n_plain + n_rest, "%s: %s", body, json_text(o));
    json_object_put(o);
    free(want_mixed);
    free(want);
    free(with_bos);
    free(plain);
    free(rest);
}

/* n_predict limits the reply (stop_type "limit"); 0 evaluates the prompt and generates
 * nothing; -1 runs until EOS or a full window. */
static void n_predict_limits(void)
{
    NEED_DAEMON();
    json_object *o = complete("{\"prompt\":\"" PROMPT "\",\"n_predict\":3,\"temperature\":0}");
    CHECK(o);
    CHECK_MSG(jint(o, "tokens_predicted") == 3 && jeq(o, "stop_type", "limit") &&
                  jint(o, "timings.predicted_n") == 3,
              "%s", json_text(o));
    json_object_put(o);
    CHECK((o = complete("{\"prompt\":\"" PROMPT "\",\"n_predict\":0}")));
    CHECK_MSG(jeq(o, "content", "") && jint(o, "tokens_predicted") == 0 &&
                  jint(o, "tokens_evaluated") > 0 && jeq(o, "stop_type", "limit") &&
                  jint(o, "timings.predicted_n") == 0,
              "%s", json_text(o));
    json_object_put(o);
    /* streamed too: no text, the last event says so */
    events e;
    CHECK_EQ(post_sse("/completion", "{\"prompt\":\"" PROMPT "\",\"n_predict\":0,\"stream\":true}",
                      &e), 200);
    CHECK_MSG(e.n == 1 && jeq(e.ev[0], "content", "") && jeq(e.ev[0], "stop", "true") &&
                  jint(e.ev[0], "tokens_predicted") == 0,
              "%zu events, last %s", e.n, e.n ? json_text(e.ev[e.n - 1]) : "");
    events_free(&e);
    CHECK((o = complete("{\"prompt\":\"" PROMPT "\",\"n_predict\":-1,\"temperature\":0}")));
    int64_t total = jint(o, "tokens_evaluated") + jint(o, "tokens_predicted");
    CHECK_MSG(jeq(o, "stop_type", "eos") ||
                  (jeq(o, "stop_type", "limit") && jeq(o, "truncated", "true") && total >= 511),
              "%s", json_text(o));
    CHECK_EQ(jint(o, "generation_settings.n_predict"), -1);
    json_object_put(o);
}

/* ignore_eos: with the end-of-text token all but forced (the docs model's EOS is id 2),
 * a reply ends at once; with ignore_eos it runs to its limit, on llama.cpp's route and on
 * OpenAI's (vLLM's field). */
static void ignore_eos_runs_to_the_limit(void)
{
    NEED_DAEMON();
    json_object *o = complete("{\"prompt\":\"" PROMPT "\",\"n_predict\":8,"
                              "\"logit_bias\":[[2,100]]}");
    CHECK(o);
    CHECK_MSG(jeq(o, "stop_type", "eos") && jint(o, "tokens_predicted") == 0 &&
                  jeq(o, "generation_settings.ignore_eos", "false"),
              "%s", json_text(o));
    json_object_put(o);
    CHECK((o = complete("{\"prompt\":\"" PROMPT "\",\"n_predict\":8,"
                        "\"logit_bias\":[[2,100]],\"ignore_eos\":true}")));
    CHECK_MSG(jeq(o, "stop_type", "limit") && jint(o, "tokens_predicted") == 8 &&
                  jeq(o, "generation_settings.ignore_eos", "true"),
              "%s", json_text(o));
    json_object_put(o);
    int st;
    for (int ignore = 0; ignore < 2; ignore++) {
        char body[512];
        snprintf(body, sizeof body, "{\"prompt\":\"" PROMPT "\",\"max_tokens\":8,"
                 "\"logit_bias\":{\"2\":100},\"ignore_eos\":%s}", ignore ? "true" : "false");
        CHECK((o = post("/v1/completions", body, &st)) && st == 200);
        CHECK_MSG(jeq(o, "choices.0.finish_reason", ignore ? "length" : "stop") &&
                      jint(o, "usage.completion_tokens") == (ignore ? 8 : 0),
                  "%s", json_text(o));
        json_object_put(o);
    }
}

/* A stop word ends the reply before it: stop_type "word", stopping_word the one that
 * matched of several. */
static void stop_words_stop(void)
{
    NEED_DAEMON();
    int pt, gt;
    char *full = openai_greedy("\"" PROMPT "\"", 24, &pt, &gt);
    CHECK(full);
    size_t at = 1;
    while (full[at] && full[at + 1] &&
           !(full[at] >= 'a' && full[at] <= 'z' && full[at + 1] >= 'a' && full[at + 1] <= 'z'))
        at++;
    if (!full[at] || !full[at + 1]) {
        free(full);
        SKIP("the greedy text has no two letters in a row to stop at");
    }
    char stop[3] = {full[at], full[at + 1], 0}, body[512];
    snprintf(body, sizeof body, "{\"prompt\":\"" PROMPT "\",\"n_predict\":24,\"temperature\":0,"
             "\"stop\":[\"qqzzx\",\"%s\"]}", stop);
    json_object *o = complete(body);
    CHECK(o);
    size_t before = (size_t)(strstr(full, stop) - full);
    const char *text = httpc_jstr(o, "content");
    CHECK_MSG(strlen(text) == before && strncmp(text, full, before) == 0 &&
                  jeq(o, "stop_type", "word") && jeq(o, "stopping_word", stop) &&
                  jeq(o, "generation_settings.stop.1", stop),
              "stop '%s': %s (full '%s')", stop, json_text(o), full);
    json_object_put(o);
    free(full);
}

/* Streamed: events of content with stop false, whose contents add up to the whole reply;
 * the last has stop true, the counts and the timings. */
static void streamed_equals_whole(void)
{
    NEED_DAEMON();
    const char *fields = "\"prompt\":\"" PROMPT "\",\"n_predict\":20,\"temperature\":0";
    char body[512];
    snprintf(body, sizeof body, "{%s}", fields);
    json_object *whole = complete(body);
    CHECK(whole);
    snprintf(body, sizeof body, "{%s,\"stream\":true}", fields);
    events e;
    CHECK_EQ(post_sse("/completion", body, &e), 200);
    CHECK(e.n >= 2);
    char got[8192] = "";
    int64_t tokens = 0;
    for (size_t i = 0; i + 1 < e.n; i++) {
        const char *c = httpc_jstr(e.ev[i], "content");
        json_object *toks = httpc_jget(e.ev[i], "tokens");
        CHECK_MSG(c && jeq(e.ev[i], "stop", "false") && toks &&
                      json_object_is_type(toks, json_type_array),
                  "event %zu: %s", i, json_text(e.ev[i]));
        tokens += (int64_t)json_object_array_length(toks);
        CHECK_EQ(jint(e.ev[i], "tokens_predicted"), tokens);
        if (strlen(got) + strlen(c) < sizeof got)
            strcat(got, c);
    }
    json_object *last = e.ev[e.n - 1];
    if (strlen(got) + strlen(httpc_jstr(last, "content")) < sizeof got)
        strcat(got, httpc_jstr(last, "content"));
    CHECK_MSG(jeq(whole, "content", got), "streamed '%s', whole %s", got, json_text(whole));
    CHECK_MSG(jeq(last, "stop", "true") &&
                  jint(last, "tokens_predicted") == jint(whole, "tokens_predicted") &&
                  jint(last, "tokens_evaluated") == jint(whole, "tokens_evaluated") &&
                  jeq(last, "stop_type", httpc_jstr(whole, "stop_type")) &&
                  jint(last, "timings.predicted_n") == jint(whole, "tokens_predicted") &&
                  httpc_jget(last, "timings.prompt_ms") && httpc_jget(last, "generation_settings"),
              "last %s, whole %s", json_text(last), json_text(whole));
    CHECK_EQ(tokens, jint(whole, "tokens_predicted"));
    events_free(&e);
    json_object_put(whole);
}

/* One entry of completion_probabilities (or of its top_logprobs: top). */
static bool prob_entry_ok(json_object *p, bool top)
{
    json_object *bytes = httpc_jget(p, "bytes");
    return httpc_jget(p, "id") && httpc_jstr(p, "token") && bytes &&
           json_object_is_type(bytes, json_type_array) && httpc_jget(p, "logprob") &&
           jnum(p, "logprob") <= 0 && (top || httpc_jget(p, "top_logprobs"));
}

/* n_probs: each generated token's id, text, bytes and log-probability with its step's
 * n_probs likeliest tokens, the first of them the greedy choice; streamed with each
 * event's tokens. */
static void n_probs_give_probabilities(void)
{
    NEED_DAEMON();
    const char *fields = "\"prompt\":\"" PROMPT "\",\"n_predict\":5,\"temperature\":0,"
                         "\"n_probs\":3";
    char body[512];
    snprintf(body, sizeof body, "{%s}", fields);
    json_object *o = complete(body);
    CHECK(o);
    json_object *probs = httpc_jget(o, "completion_probabilities");
    CHECK_MSG(probs && json_object_array_length(probs) == (size_t)jint(o, "tokens_predicted"),
              "%s", json_text(o));
    char text[1024] = "";
    for (size_t i = 0; i < json_object_array_length(probs); i++) {
        json_object *p = json_object_array_get_idx(probs, i), *tops = httpc_jget(p, "top_logprobs");
        CHECK_MSG(prob_entry_ok(p, false) && json_object_array_length(tops) == 3,
                  "%zu: %s", i, json_text(p));
        for (size_t k = 0; k < 3; k++)
            CHECK_MSG(prob_entry_ok(json_object_array_get_idx(tops, k), true), "%zu.%zu: %s", i,
                      k, json_text(p));
        CHECK_MSG(jint(p, "id") == jint(tops, "0.id") && jnum(p, "logprob") == jnum(tops, "0.logprob"),
                  "greedy token %zu is not the likeliest: %s", i, json_text(p));
        strcat(text, httpc_jstr(p, "token"));
    }
    CHECK_MSG(jeq(o, "content", text), "tokens '%s', content %s", text, json_text(o));
    json_object_put(o);
    snprintf(body, sizeof body, "{%s,\"stream\":true}", fields);
    events e;
    CHECK_EQ(post_sse("/completion", body, &e), 200);
    size_t n = 0;
    for (size_t i = 0; i + 1 < e.n; i++) {
        json_object *p = httpc_jget(e.ev[i], "completion_probabilities");
        json_object *tokens = httpc_jget(e.ev[i], "tokens");
        CHECK_MSG(p && json_object_array_length(p) == json_object_array_length(tokens),
                  "event %zu: %s", i, json_text(e.ev[i]));
        n += json_object_array_length(p);
    }
    CHECK_EQ((int64_t)n, jint(e.ev[e.n - 1], "tokens_predicted"));
    events_free(&e);
    /* beyond what llmsd gives, refused */
    expect_error("POST", "/completion", "{\"prompt\":\"x\",\"n_probs\":21}", 400,
                 "invalid_request_error", "n_probs");
}

/* logit_bias in llama.cpp's forms: [[id, false]] bans the greedy first token, as
 * {"id": false} does; [[id, bias]] and {"id": bias} are biases. */
static void logit_bias_bans(void)
{
    NEED_DAEMON();
    json_object *o = complete("{\"prompt\":\"" PROMPT "\",\"n_predict\":1,\"temperature\":0,"
                              "\"return_tokens\":true}");
    CHECK(o);
    int64_t first = jint(o, "tokens.0");
    CHECK_MSG(first >= 0, "%s", json_text(o));
    json_object_put(o);
    static const char *const forms[] = {"[[%lld,false]]", "{\"%lld\":false}", "[[%lld,-100]]",
                                        "{\"%lld\":-100}"};
    for (size_t i = 0; i < sizeof forms / sizeof *forms; i++) {
        char bias[64], body[512];
        snprintf(bias, sizeof bias, forms[i], (long long)first);
        snprintf(body, sizeof body, "{\"prompt\":\"" PROMPT "\",\"n_predict\":1,"
                 "\"temperature\":0,\"return_tokens\":true,\"logit_bias\":%s}", bias);
        CHECK((o = complete(body)));
        CHECK_MSG(jint(o, "tokens.0") >= 0 && jint(o, "tokens.0") != first, "%s: %s", bias,
                  json_text(o));
        json_object_put(o);
    }
    /* a text's tokens are not looked up */
    expect_error("POST", "/completion", "{\"prompt\":\"x\",\"logit_bias\":[[\"Hello\",-1]]}", 400,
                 "invalid_request_error", "logit_bias");
    expect_error("POST", "/completion", "{\"prompt\":\"x\",\"logit_bias\":{\"Hello\":-1}}", 400,
                 "invalid_request_error", "logit_bias");
    expect_error("POST", "/completion", "{\"prompt\":\"x\",\"logit_bias\":[[1,true]]}", 400,
                 "invalid_request_error", "logit_bias");
}

/* json_schema: the reply is an instance of it; grammar: a sentence of it (the reply
 * ends where nothing may follow); not both. */
static void json_schema_is_followed(void)
{
    NEED_DAEMON();
    json_object *o = complete(
        "{\"prompt\":\"The settings are written as JSON:\\n\",\"n_predict\":96,"
        "\"temperature\":0,\"json_schema\":{\"type\":\"object\",\"properties\":"
        "{\"name\":{\"type\":\"string\",\"maxLength\":12},\"port\":{\"type\":\"integer\"}},"
        "\"required\":[\"name\",\"port\"],\"additionalProperties\":false}}");
    CHECK(o);
    const char *text = httpc_jstr(o, "content");
    if (jeq(o, "stop_type", "eos")) {
        json_object *v = json_tokener_parse(text), *name, *p;
        CHECK_MSG(json_object_is_type(v, json_type_object) &&
                      json_object_object_get_ex(v, "name", &name) &&
                      json_object_is_type(name, json_type_string) &&
                      json_object_object_get_ex(v, "port", &p) &&
                      json_object_is_type(p, json_type_int) && json_object_object_length(v) == 2,
                  "'%s'", text);
        json_object_put(v);
    } else {
        CHECK_MSG(text[strspn(text, " \t\r\n")] == '{', "%s", json_text(o));
    }
    json_object_put(o);
    expect_error("POST", "/completion",
                 "{\"prompt\":\"x\",\"json_schema\":{\"type\":\"object\",\"minProperties\":1}}",
                 400, "invalid_request_error", "minProperties");
    expect_error("POST", "/completion", "{\"prompt\":\"x\",\"json_schema\":\"object\"}", 400,
                 "invalid_request_error", "json_schema");
    o = complete("{\"prompt\":\"The service listens on\",\"n_predict\":16,\"temperature\":0,"
                 "\"grammar\":\"root ::= \\\" port \\\" [1-9] [0-9]{0,3} \\\".\\\"\"}");
    CHECK(o);
    text = httpc_jstr(o, "content");
    regex_t re;
    CHECK(regcomp(&re, "^ port [1-9][0-9]{0,3}\\.$", REG_EXTENDED | REG_NOSUB) == 0);
    CHECK_MSG(text && regexec(&re, text, 0, NULL, 0) == 0 && jeq(o, "stop_type", "eos"), "%s",
              json_text(o));
    regfree(&re);
    json_object_put(o);
    expect_error("POST", "/completion", "{\"prompt\":\"x\",\"grammar\":\"root ::= item\"}",
                 400, "invalid_request_error", "'item'");
    expect_error("POST", "/completion",
                 "{\"prompt\":\"x\",\"grammar\":\"root ::= \\\"a\\\"\",\"json_schema\":{}}",
                 400, "invalid_request_error", "give one of them");
}

/* The samplers list: each of llmsd's that it leaves out is off, as llama.cpp leaves it
 * out of the chain; top_k 1 alone makes any temperature greedy. */
static void samplers_list_is_honoured(void)
{
    NEED_DAEMON();
    int pt, gt;
    char *want = openai_greedy("\"" PROMPT "\"", 10, &pt, &gt);
    CHECK(want);
    json_object *o = complete("{\"prompt\":\"" PROMPT "\",\"n_predict\":10,\"temperature\":5,"
                              "\"top_k\":1,\"seed\":3,\"samplers\":[\"top_k\",\"temperature\"]}");
    CHECK(o);
    CHECK_MSG(jeq(o, "content", want) && jeq(o, "generation_settings.samplers.0", "top_k") &&
                  jeq(o, "generation_settings.samplers.1", "temperature") &&
                  !httpc_jget(o, "generation_settings.samplers.2"),
              "%s, greedy '%s'", json_text(o), want);
    json_object_put(o);
    /* the same as a string of their letters */
    CHECK((o = complete("{\"prompt\":\"" PROMPT "\",\"n_predict\":10,\"temperature\":5,"
                        "\"top_k\":1,\"seed\":3,\"samplers\":\"kt\"}")));
    CHECK_MSG(jeq(o, "content", want), "%s, greedy '%s'", json_text(o), want);
    json_object_put(o);
    free(want);
}

/* The longest stretch of token ids that comes twice in toks, the second after the end of
 * the first. */
static int longest_repeat(json_object *toks)
{
    int n = (int)json_object_array_length(toks), best = 0;
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) {
            int k = 0;
            while (j + k < n && i + k < j &&
                   json_object_get_int(json_object_array_get_idx(toks, i + k)) ==
                       json_object_get_int(json_object_array_get_idx(toks, j + k)))
                k++;
            best = k > best ? k : best;
        }
    return best;
}

/* Greedy decoding of PROMPT falls into a loop (a sentence of 40 tokens said again); DRY
 * with llama.cpp's settings (multiplier 0.8, its defaults for the rest) leaves no stretch
 * of more than 15 tokens repeated, and /v1/completions, which reads llama.cpp's fields
 * too, gives the same reply with it. */
static void dry_stops_a_repetition_loop(void)
{
    NEED_DAEMON();
    const char *fmt = "{\"prompt\":\"" PROMPT "\",\"n_predict\":120,\"temperature\":0,"
                      "\"return_tokens\":true%s}";
    char body[512];
    snprintf(body, sizeof body, fmt, "");
    json_object *plain = complete(body);
    snprintf(body, sizeof body, fmt, ",\"dry_multiplier\":0.8");
    json_object *dry = complete(body);
    CHECK(plain && dry);
    int loop = longest_repeat(httpc_jget(plain, "tokens"));
    int cut = longest_repeat(httpc_jget(dry, "tokens"));
    CHECK_MSG(loop >= 30, "greedy repeats at most %d tokens: %s", loop, json_text(plain));
    CHECK_MSG(cut <= 15, "with DRY %d tokens repeat: %s", cut, json_text(dry));
    CHECK_MSG(jnum(dry, "generation_settings.dry_multiplier") > 0.79 &&
                  jnum(dry, "generation_settings.dry_base") == 1.75 &&
                  jint(dry, "generation_settings.dry_allowed_length") == 2 &&
                  jint(dry, "generation_settings.dry_penalty_last_n") == 512 &&
                  jeq(dry, "generation_settings.dry_sequence_breakers.1", ":"),
              "%s", json_text(dry));
    int st;
    json_object *o = post("/v1/completions", "{\"prompt\":\"" PROMPT "\",\"max_tokens\":120,"
                                             "\"temperature\":0,\"dry_multiplier\":0.8}", &st);
    CHECK_MSG(st == 200 && jeq(o, "choices.0.text", httpc_jstr(dry, "content")), "%d %s", st,
              json_text(o));
    json_object_put(o);
    /* breakers of one's own are shown back */
    snprintf(body, sizeof body, fmt,
             ",\"dry_multiplier\":0.8,\"dry_sequence_breakers\":[\"gateway\",\".\"]");
    CHECK((o = complete(body)));
    CHECK_MSG(jeq(o, "generation_settings.dry_sequence_breakers.0", "gateway") &&
                  !httpc_jget(o, "generation_settings.dry_sequence_breakers.2"),
              "%s", json_text(o));
    json_object_put(o);
    json_object_put(plain);
    json_object_put(dry);
}

/* Mirostat (v1, v2), locally typical, XTC, top-n-sigma, dynamic temperature, min_keep
 * and an order of one's own are taken, shown in generation_settings, and change the reply
 * against the same seed without them; on /v1/chat/completions too. */
static void newer_samplers_change_the_reply(void)
{
    NEED_DAEMON();
    const char *fmt = "{\"prompt\":\"" PROMPT "\",\"n_predict\":40,\"temperature\":1,"
                      "\"top_k\":0,\"top_p\":1,\"min_p\":0,\"seed\":5%s}";
    char body[512];
    snprintf(body, sizeof body, fmt, "");
    json_object *base = complete(body);
    CHECK(base);
    static const struct {
        const char *fields, *shown, *value;
    } cases[] = {
        {",\"mirostat\":2,\"mirostat_tau\":3", "mirostat", "2"},
        {",\"mirostat\":1", "mirostat", "1"},
        {",\"typical_p\":0.5", "typical_p", "0.5"},
        {",\"xtc_probability\":1,\"xtc_threshold\":0.1", "xtc_probability", "1.0"},
        {",\"top_n_sigma\":1", "top_n_sigma", "1.0"},
        {",\"dynatemp_range\":0.8,\"dynatemp_exponent\":2", "dynatemp_exponent", "2.0"},
        {",\"min_p\":0.9,\"min_keep\":3", "min_keep", "3"},
        {",\"top_k\":3,\"temperature\":3,\"samplers\":[\"temperature\",\"top_k\",\"penalties\"]",
         "samplers.0", "temperature"},
        {",\"top_k\":3,\"temperature\":3,\"samplers\":\"tk\"", "samplers.1", "top_k"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        snprintf(body, sizeof body, fmt, cases[i].fields);
        json_object *o = complete(body);
        CHECK(o);
        char path[96];
        snprintf(path, sizeof path, "generation_settings.%s", cases[i].shown);
        CHECK_MSG(!jeq(o, "content", httpc_jstr(base, "content")) &&
                      jeq(o, path, cases[i].value),
                  "%s: %s, without them '%s'", cases[i].fields, json_text(o),
                  httpc_jstr(base, "content"));
        json_object_put(o);
    }
    /* an order without the temperature draws at temperature 1, as llama.cpp's does */
    snprintf(body, sizeof body, fmt, ",\"temperature\":0,\"samplers\":[\"top_k\"]");
    json_object *o = complete(body);
    CHECK(o);
    CHECK_MSG(jeq(o, "content", httpc_jstr(base, "content")), "%s", json_text(o));
    json_object_put(o);
    json_object_put(base);
    /* the chat route reads them too: Mirostat changes its reply */
    const char *chat = "{\"messages\":[{\"role\":\"user\",\"content\":\"What does the gateway "
                       "answer?\"}],\"max_tokens\":24,\"seed\":3,\"temperature\":1%s}";
    int st;
    snprintf(body, sizeof body, chat, "");
    json_object *a = post("/v1/chat/completions", body, &st);
    CHECK_EQ(st, 200);
    snprintf(body, sizeof body, chat, ",\"mirostat\":2,\"mirostat_tau\":2");
    json_object *b = post("/v1/chat/completions", body, &st);
    CHECK_EQ(st, 200);
    CHECK_MSG(!jeq(a, "choices.0.message.content", httpc_jstr(b, "choices.0.message.content")),
              "%s", json_text(b));
    json_object_put(a);
    json_object_put(b);
}

/* llama.cpp's samplers have settings of the daemon's, as llama-server's flags set them:
 * a daemon whose llmsd.conf sets them draws what a request setting them draws on the
 * first daemon (same model, seed and prompt), /props shows them, and a request's own
 * values win. */
static void newer_samplers_have_settings(void)
{
    NEED_DAEMON();
    static const char chain[] = ",\"typical_p\":0.6,\"xtc_probability\":1,\"xtc_threshold\":0.15,"
                                "\"dry_multiplier\":0.8,\"dry_base\":2,\"dry_allowed_length\":3,"
                                "\"dry_penalty_last_n\":64,\"dynatemp_range\":0.5,"
                                "\"dynatemp_exponent\":2,\"min_keep\":2,\"top_n_sigma\":2";
    llmsd_proc d;
    char extra[1400], sock[700];
    proc_fmt(sock, sizeof sock, "%s/lc-set.sock", test_tmpdir());
    proc_fmt(extra, sizeof extra,
             "http_socket = %s\nthreads = 2\nchat_template = chatml\ntemperature = 0.7\n"
             "top_k = 30\ntop_p = 0.9\nmin_p = 0.02\nrepeat_last_n = 48\nmax_tokens = 100\n"
             "typical_p = 0.6\nxtc_probability = 1\nxtc_threshold = 0.15\n"
             "dry_multiplier = 0.8\ndry_base = 2\ndry_allowed_length = 3\n"
             "dry_penalty_last_n = 64\ndynatemp_range = 0.5\ndynatemp_exponent = 2\n"
             "min_keep = 2\ntop_n_sigma = 2\nmirostat = 2\nmirostat_tau = 3\n"
             "mirostat_eta = 0.2\n", sock);
    CHECK(proc_start(&d, llmsd_path, "lc-set", model_path, extra) == 0);
    const char *fmt = "{\"prompt\":\"" PROMPT "\",\"n_predict\":32,\"temperature\":1,"
                      "\"seed\":11%s}";
    static const struct {
        const char *set, *asked;
    } pairs[] = {
        /* the settings' Mirostat against a request's */
        {"", ",\"mirostat\":2,\"mirostat_tau\":3,\"mirostat_eta\":0.2"},
        /* Mirostat off by the request: the settings' chain against a request's */
        {",\"mirostat\":0", chain},
        /* a request's own values win over every setting */
        {",\"mirostat\":0,\"typical_p\":1,\"xtc_probability\":0,\"dry_multiplier\":0,"
         "\"dynatemp_range\":0,\"min_keep\":0,\"top_n_sigma\":-1", ""},
    };
    char body[1024];
    snprintf(body, sizeof body, fmt, "");
    json_object *plain = complete(body);
    CHECK(plain);
    for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++) {
        int st;
        snprintf(body, sizeof body, fmt, pairs[i].set);
        json_object *set = httpc_post_json(sock, "/completion", body, &st);
        CHECK_MSG(st == 200 && httpc_jstr(set, "content"), "%d %s", st, json_text(set));
        snprintf(body, sizeof body, fmt, pairs[i].asked);
        json_object *asked = complete(body);
        CHECK(asked);
        bool want_plain = !pairs[i].asked[0];
        CHECK_MSG(jeq(set, "content", httpc_jstr(asked, "content")) &&
                      want_plain == jeq(set, "content", httpc_jstr(plain, "content")),
                  "pair %zu: set '%s', asked '%s', plain '%s'", i, httpc_jstr(set, "content"),
                  httpc_jstr(asked, "content"), httpc_jstr(plain, "content"));
        json_object_put(set);
        json_object_put(asked);
    }
    json_object_put(plain);
    httpc_reply r;
    CHECK(httpc_do(sock, 0, "GET", "/props", NULL, NULL, &r) == 0);
    json_object *o = json_tokener_parse(r.body);
    httpc_reply_free(&r);
    const char *g = "default_generation_settings.params.";
    char path[128];
#define SETTING(name) (snprintf(path, sizeof path, "%s%s", g, name), jnum(o, path))
    CHECK_MSG(SETTING("mirostat") == 2 && SETTING("mirostat_tau") == 3 &&
                  fabs(SETTING("mirostat_eta") - 0.2) < 1e-6 &&
                  fabs(SETTING("typical_p") - 0.6) < 1e-6 && SETTING("xtc_probability") == 1 &&
                  fabs(SETTING("xtc_threshold") - 0.15) < 1e-6 &&
                  fabs(SETTING("dry_multiplier") - 0.8) < 1e-6 && SETTING("dry_base") == 2 &&
                  SETTING("dry_allowed_length") == 3 && SETTING("dry_penalty_last_n") == 64 &&
                  SETTING("dynatemp_range") == 0.5 && SETTING("dynatemp_exponent") == 2 &&
                  SETTING("min_keep") == 2 && SETTING("top_n_sigma") == 2,
              "%s", json_text(o));
#undef SETTING
    json_object_put(o);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

/* A long prompt asked twice: the second resumes a multiple of 64 of its tokens from the
 * prompt cache. */
static void prompt_cache_resumes(void)
{
    NEED_DAEMON();
    char prompt[4096] = "";
    for (int i = 0; i < 24; i++)
        strcat(prompt, "The daemon serves models to local apps over a socket. ");
    char body[4500];
    snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"n_predict\":2,\"cache_prompt\":true}",
             prompt);
    json_object *a = complete(body), *b = a ? complete(body) : NULL;
    CHECK(a && b);
    int64_t cached = jint(b, "tokens_cached");
    CHECK_MSG(jint(b, "tokens_evaluated") > 128 && cached >= 64 && cached % 64 == 0 &&
                  jint(b, "timings.prompt_n") == jint(b, "tokens_evaluated") - cached,
              "%s", json_text(b));
    json_object_put(a);
    json_object_put(b);
}

/* What llama.cpp's server sends by default, and llmsd's own /props settings sent back,
 * are taken: fields of its own machinery read past, samplers off at their off values. */
static void client_defaults_are_served(void)
{
    NEED_DAEMON();
    httpc_reply r;
    CHECK(httpc_do(hsock, 0, "GET", "/props", NULL, NULL, &r) == 0);
    json_object *props = json_tokener_parse(r.body);
    httpc_reply_free(&r);
    json_object *params = httpc_jget(props, "default_generation_settings.params");
    CHECK(params);
    json_object *ours = json_tokener_parse(json_object_to_json_string(params));
    json_object_put(props);
    json_object_object_add(ours, "prompt", json_object_new_string(PROMPT));
    json_object_object_add(ours, "n_predict", json_object_new_int(3));
    json_object *o = complete(json_object_to_json_string(ours));
    CHECK(o);
    json_object_put(o);
    json_object_put(ours);
    /* llama.cpp's own defaults, as its /props shows them */
    CHECK((o = complete(
               "{\"prompt\":\"" PROMPT "\",\"n_predict\":3,\"seed\":4294967295,"
               "\"temperature\":0.8,\"dynatemp_range\":0.0,\"dynatemp_exponent\":1.0,"
               "\"top_k\":40,\"top_p\":0.95,\"min_p\":0.05,\"xtc_probability\":0.0,"
               "\"xtc_threshold\":0.1,\"typical_p\":1.0,\"repeat_last_n\":64,"
               "\"repeat_penalty\":1.0,\"presence_penalty\":0.0,\"frequency_penalty\":0.0,"
               "\"dry_multiplier\":0.0,\"dry_base\":1.75,\"dry_allowed_length\":2,"
               "\"dry_penalty_last_n\":-1,\"dry_sequence_breakers\":[\"\\n\",\":\",\"\\\"\",\"*\"],"
               "\"mirostat\":0,\"mirostat_tau\":5.0,\"mirostat_eta\":0.1,\"stop\":[],"
               "\"max_tokens\":-1,\"n_keep\":0,\"n_discard\":0,\"ignore_eos\":false,"
               "\"stream\":false,\"n_probs\":0,\"min_keep\":0,\"grammar\":\"\","
               "\"samplers\":[\"penalties\",\"dry\",\"top_k\",\"typ_p\",\"top_p\",\"min_p\","
               "\"xtc\",\"temperature\"],\"speculative.n_max\":16,\"speculative.n_min\":5,"
               "\"speculative.p_min\":0.9,\"timings_per_token\":false,"
               "\"post_sampling_probs\":false,\"lora\":[],\"cache_prompt\":true,"
               "\"id_slot\":-1,\"t_max_predict_ms\":0,\"n_indent\":0,\"tfs_z\":1.0,"
               "\"top_n_sigma\":-1.0,\"logit_bias\":[],\"image_data\":[]}")));
    CHECK_MSG(jint(o, "tokens_predicted") <= 3, "%s", json_text(o));
    json_object_put(o);
}

/* response_fields picks the fields of the whole reply, a slash reaching into an object. */
static void response_fields_pick(void)
{
    NEED_DAEMON();
    json_object *o = complete("{\"prompt\":\"" PROMPT "\",\"n_predict\":2,\"response_fields\":"
                              "[\"content\",\"generation_settings/n_predict\",\"nope\"]}");
    CHECK(o);
    CHECK_MSG(json_object_object_length(o) == 2 &&
                  jint(o, "generation_settings/n_predict") == 2,
              "%s", json_text(o));
    json_object_put(o);
}

/* Whatever cannot be honoured is refused naming the field; a bad body or a field of the
 * wrong type is 400; all in llama.cpp's error shape. */
static void refusals_name_the_field(void)
{
    NEED_DAEMON();
    static const struct {
        const char *body, *want;
    } cases[] = {
        {"{\"prompt\":\"x\",\"ignore_eos\":1}", "ignore_eos"},
        {"{\"prompt\":\"x\",\"tfs_z\":0.9}", "tfs_z"},
        {"{\"prompt\":\"x\",\"mirostat\":3}", "mirostat"},
        {"{\"prompt\":\"x\",\"mirostat\":2,\"mirostat_tau\":-1}", "mirostat_tau"},
        {"{\"prompt\":\"x\",\"mirostat_eta\":1.5}", "mirostat_eta"},
        {"{\"prompt\":\"x\",\"mirostat\":\"v2\"}", "mirostat"},
        {"{\"prompt\":\"x\",\"typical_p\":0}", "typical_p"},
        {"{\"prompt\":\"x\",\"dry_multiplier\":-0.8}", "dry_multiplier"},
        {"{\"prompt\":\"x\",\"dry_base\":1000}", "dry_base"},
        {"{\"prompt\":\"x\",\"dry_allowed_length\":-1}", "dry_allowed_length"},
        {"{\"prompt\":\"x\",\"dry_penalty_last_n\":-2}", "dry_penalty_last_n"},
        {"{\"prompt\":\"x\",\"dry_sequence_breakers\":[]}", "dry_sequence_breakers"},
        {"{\"prompt\":\"x\",\"dry_sequence_breakers\":[1]}", "dry_sequence_breakers"},
        {"{\"prompt\":\"x\",\"xtc_threshold\":1.5}", "xtc_threshold"},
        {"{\"prompt\":\"x\",\"dynatemp_exponent\":-1}", "dynatemp_exponent"},
        {"{\"prompt\":\"x\",\"top_n_sigma\":\"wide\"}", "top_n_sigma"},
        {"{\"prompt\":\"x\",\"min_keep\":-1}", "min_keep"},
        {"{\"prompt\":\"x\",\"min_keep\":2.5}", "min_keep"},
        {"{\"prompt\":\"x\",\"n_indent\":4}", "n_indent"},
        {"{\"prompt\":\"x\",\"t_max_predict_ms\":100}", "t_max_predict_ms"},
        {"{\"prompt\":\"x\",\"post_sampling_probs\":true}", "post_sampling_probs"},
        {"{\"prompt\":\"x\",\"image_data\":[{\"data\":\"aGk=\",\"id\":1}]}", "image_data"},
        {"{\"prompt\":\"x\",\"lora\":[{\"id\":0,\"scale\":0.5}]}", "lora"},
        {"{\"prompt\":\"x\",\"samplers\":[\"top_k\",\"top_k\"]}", "samplers"},
        {"{\"prompt\":\"x\",\"samplers\":[\"infill\"]}", "samplers"},
        {"{\"prompt\":\"x\",\"samplers\":[\"warp\"]}", "samplers"},
        {"{\"prompt\":\"x\",\"samplers\":\"kz\"}", "samplers"},
        {"{\"prompt\":\"x\",\"samplers\":5}", "samplers"},
        {"{\"prompt\":[\"a\",\"b\"]}", "prompt"},
        {"{\"prompt\":[[1,2],[3]]}", "prompt"},
        {"{\"prompt\":[]}", "prompt"},
        {"{\"prompt\":{\"text\":\"x\"}}", "prompt"},
        {"{\"prompt\":[1,2.5]}", "prompt"},
        {"{\"prompt\":[1,-2]}", "prompt"},
        {"{\"prompt\":[1,true]}", "prompt"},
        {"{\"n_predict\":2}", "prompt"},
        {"{\"prompt\":\"x\",\"n_predict\":-2}", "n_predict"},
        {"{\"prompt\":\"x\",\"n_predict\":1.5}", "n_predict"},
        {"{\"prompt\":\"x\",\"temperature\":\"hot\"}", "temperature"},
        {"{\"prompt\":\"x\",\"top_k\":\"x\"}", "top_k"},
        {"{\"prompt\":\"x\",\"repeat_last_n\":-2}", "repeat_last_n"},
        {"{\"prompt\":\"x\",\"stream\":\"yes\"}", "stream"},
        {"{\"prompt\":\"x\",\"cache_prompt\":\"yes\"}", "cache_prompt"},
        {"{\"prompt\":\"x\",\"stop\":[1]}", "stop"},
        {"{\"prompt\":\"x\",\"stop\":[\"a1\",\"b1\",\"c1\",\"d1\",\"e1\",\"f1\",\"g1\",\"h1\","
         "\"i1\",\"j1\",\"k1\",\"l1\",\"m1\",\"n1\",\"o1\",\"p1\"]}", "'stop' has 16 strings"},
        {"{\"prompt\":\"x\",\"logit_bias\":5}", "logit_bias"},
        {"{\"prompt\":\"x\",\"response_fields\":\"content\"}", "response_fields"},
        {"{\"prompt\":\"x\",\"n_probs\":-1}", "n_probs"},
        {"[1]", "JSON object"},
        {"{\"prompt\":[999999]}", "vocabulary"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        expect_error("POST", "/completion", cases[i].body, 400, "invalid_request_error",
                     cases[i].want);
    expect_error("POST", "/completion", "{\"prompt\":\"x\",\"model\":\"nope\"}", 404,
                 "not_found_error", "nope");
    expect_error("GET", "/completion", NULL, 405, "invalid_request_error", "POST");
    expect_error("PUT", "/props", NULL, 405, "invalid_request_error", "GET");
    /* a prompt beyond the window: the worker's refusal, in llama.cpp's shape, streamed or
     * not (the stream has not begun) */
    char *big = malloc(30000);
    CHECK(big);
    for (int streamed = 0; streamed < 2; streamed++) {
        strcpy(big, "{\"prompt\":\"");
        for (int i = 0; i < 1500; i++)
            strcat(big, "word ");
        strcat(big, streamed ? "\",\"stream\":true}" : "\"}");
        expect_error("POST", "/completion", big, 400, "invalid_request_error", "window");
    }
    free(big);
}

/* /apply-template's prompt for fields (the body's, without braces), malloc'd; NULL after a
 * failed check's message. */
static char *apply_template(const char *fields)
{
    char body[4096];
    snprintf(body, sizeof body, "{%s}", fields);
    int st;
    json_object *o = post("/apply-template", body, &st);
    const char *p = httpc_jstr(o, "prompt");
    char *prompt = st == 200 && p && json_object_object_length(o) == 1 ? strdup(p) : NULL;
    if (!prompt)
        test_fail(__FILE__, __LINE__, "/apply-template %s: %d %s", body, st, json_text(o));
    json_object_put(o);
    return prompt;
}

/* The tokens a Complete evaluates for text (BOS added, special tokens parsed): -1 after a
 * failed check's message. */
static int prompt_tokens(const char *text)
{
    json_object *b = json_object_new_object();
    json_object_object_add(b, "content", json_object_new_string(text));
    json_object_object_add(b, "add_special", json_object_new_boolean(1));
    json_object_object_add(b, "parse_special", json_object_new_boolean(1));
    int st;
    json_object *o = post("/tokenize", json_object_to_json_string(b), &st);
    int n = st == 200 ? (int)jint(o, "count") : -1;
    if (n < 0)
        test_fail(__FILE__, __LINE__, "/tokenize: %d %s", st, json_text(o));
    json_object_put(o);
    json_object_put(b);
    return n;
}

/* /v1/chat/completions' usage.prompt_tokens for fields: -1 after a failed check's
 * message. */
static int chat_prompt_tokens(const char *fields)
{
    char body[4096];
    snprintf(body, sizeof body, "{%s,\"max_tokens\":1}", fields);
    int st;
    json_object *o = post("/v1/chat/completions", body, &st);
    int n = st == 200 ? (int)jint(o, "usage.prompt_tokens") : -1;
    if (n < 0)
        test_fail(__FILE__, __LINE__, "/v1/chat/completions %s: %d %s", body, st, json_text(o));
    json_object_put(o);
    return n;
}

#define TOOLS                                                                              \
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":"   \
    "\"The weather of a city\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":"    \
    "{\"type\":\"string\"}},\"required\":[\"city\"]}}}]"

/* /apply-template renders the messages (and tools) as /v1/chat/completions does: the
 * very prompt it evaluates, assistant opening included, on the model named or the
 * default; its tokens are the chat's usage.prompt_tokens, and /completion of it
 * evaluates as many. */
static void apply_template_is_the_chat_prompt(void)
{
    NEED_DAEMON();
    static const struct {
        const char *fields, *ends; /* the body, how its prompt ends */
    } cases[] = {
        {"\"messages\":[{\"role\":\"system\",\"content\":\"You answer briefly.\"},"
         "{\"role\":\"user\",\"content\":\"What does the gateway answer?\"}]",
         "<|im_start|>assistant\n"},
        {"\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hi\"},"
         "{\"type\":\"text\",\"text\":\"there\"}]},{\"role\":\"assistant\",\"content\":"
         "\"Hello.\"},{\"role\":\"developer\",\"content\":\"Be kind.\"},{\"role\":\"user\","
         "\"content\":\"And then?\"}]",
         "<|im_start|>assistant\n"},
        {"\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}]," TOOLS,
         "<|im_start|>assistant\n"},
        {"\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"},{\"role\":"
         "\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\","
         "\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},"
         "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"sunny\"}]," TOOLS,
         "<|im_start|>assistant\n"},
        /* a forced call: the prompt ends with its opening */
        {"\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}]," TOOLS
         ",\"tool_choice\":\"required\"",
         "<tool_call>\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *prompt = apply_template(cases[i].fields);
        if (!prompt)
            continue;
        size_t len = strlen(prompt), end = strlen(cases[i].ends);
        CHECK_MSG(len > end && strcmp(prompt + len - end, cases[i].ends) == 0 &&
                      (!strstr(cases[i].fields, "tools") || strstr(prompt, "get_weather")),
                  "%s: '%s'", cases[i].fields, prompt);
        int n = prompt_tokens(prompt), want = chat_prompt_tokens(cases[i].fields);
        CHECK_MSG(n > 0 && n == want, "%s: %d tokens, the chat's %d ('%s')", cases[i].fields,
                  n, want, prompt);
        /* sent to /completion as it is, it is the chat's prompt */
        json_object *b = json_object_new_object();
        json_object_object_add(b, "prompt", json_object_new_string(prompt));
        json_object_object_add(b, "n_predict", json_object_new_int(0));
        json_object *o = complete(json_object_to_json_string(b));
        CHECK_MSG(o && jint(o, "tokens_evaluated") == want, "%s: %s, the chat's %d",
                  cases[i].fields, json_text(o), want);
        json_object_put(o);
        json_object_put(b);
        /* the model named: the same */
        char fields[4096];
        snprintf(fields, sizeof fields, "%s,\"model\":\"docs-lm-21M-F16\"", cases[i].fields);
        char *named = apply_template(fields);
        CHECK_MSG(named && strcmp(named, prompt) == 0, "'%s' vs '%s'", named, prompt);
        free(named);
        free(prompt);
    }
}

/* /apply-template refuses what the chat route refuses of messages and tools, with its
 * status and message, in llama.cpp's error shape. */
static void apply_template_refuses_as_the_chat(void)
{
    NEED_DAEMON();
    static const char *const bodies[] = {
        "{}",
        "{\"messages\":[]}",
        "{\"messages\":\"hi\"}",
        "{\"messages\":[5]}",
        "{\"messages\":[{\"content\":\"x\"}]}",
        "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":5}]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\","
        "\"image_url\":{\"url\":\"x\"}}]}]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":"
        "\"function\"}]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]," TOOLS ",\"tool_choice\":"
        "{\"type\":\"function\",\"function\":{\"name\":\"nope\"}}}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"model\":\"nope\"}",
        "[1]",
    };
    for (size_t i = 0; i < sizeof bodies / sizeof *bodies; i++) {
        int st, want_st;
        json_object *want = post("/v1/chat/completions", bodies[i], &want_st),
                    *o = post("/apply-template", bodies[i], &st);
        const char *m = httpc_jstr(o, "error.message"), *wm = httpc_jstr(want, "error.message");
        CHECK_MSG(want_st >= 400 && st == want_st && jint(o, "error.code") == st && m && wm &&
                      strcmp(m, wm) == 0,
                  "%s: %d %s, the chat's %d %s", bodies[i], st, json_text(o), want_st,
                  json_text(want));
        json_object_put(o);
        json_object_put(want);
    }
    /* a context's turn is rendered against its history, which only the worker has */
    expect_error("POST", "/apply-template", "{\"messages\":[{\"role\":\"user\",\"content\":"
                 "\"x\"}],\"llmsd\":{\"context\":\"c1\"}}", 400, "invalid_request_error",
                 "llmsd.context");
    expect_error("GET", "/apply-template", NULL, 405, "invalid_request_error", "POST");
}

/* /embedding and /embeddings, llama.cpp's own shape: one {"index", "embedding": [[...]]}
 * per text, its one vector the pooled, normalised one /v1/embeddings gives for the same
 * text on the daemon's embed model; "content" or "input", a string or strings. */
static void embedding_equals_openai(void)
{
    NEED_DAEMON();
    if (!embed_path)
        SKIP("models/docs-embed-5M-F16.gguf is not in the test data");
    int st;
    json_object *want = post("/v1/embeddings", "{\"input\":[\"The gateway answers\","
                                               "\"Contexts keep their KV.\"]}", &st);
    CHECK_MSG(st == 200 && httpc_jget(want, "data.1.embedding") &&
                  jeq(want, "model", "docs-embed-5M-F16"),
              "%d %s", st, json_text(want));
    static const struct {
        const char *path, *body;
        size_t first, n; /* the texts of /v1/embeddings' answer it has */
    } cases[] = {
        {"/embedding", "{\"content\":[\"The gateway answers\",\"Contexts keep their KV.\"]}",
         0, 2},
        {"/embeddings", "{\"content\":\"Contexts keep their KV.\"}", 1, 1},
        {"/embedding", "{\"input\":\"The gateway answers\"}", 0, 1},
        {"/embeddings", "{\"input\":[\"Contexts keep their KV.\"],\"encoding_format\":\"float\","
                        "\"model\":\"docs-embed-5M-F16\"}", 1, 1},
        /* as llama.cpp's server answers it: numbers whatever the format asked */
        {"/embedding", "{\"content\":\"The gateway answers\",\"encoding_format\":\"base64\"}",
         0, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        json_object *o = post(cases[i].path, cases[i].body, &st);
        bool ok = st == 200 && json_object_is_type(o, json_type_array) &&
                  json_object_array_length(o) == cases[i].n;
        for (size_t k = 0; ok && k < cases[i].n; k++) {
            json_object *e = json_object_array_get_idx(o, k), *emb = httpc_jget(e, "embedding");
            char at[64];
            snprintf(at, sizeof at, "data.%zu.embedding", cases[i].first + k);
            ok = jint(e, "index") == (int64_t)k && json_object_is_type(emb, json_type_array) &&
                 json_object_array_length(emb) == 1 &&
                 json_object_equal(json_object_array_get_idx(emb, 0), httpc_jget(want, at));
        }
        CHECK_MSG(ok, "%s %s: %d %.300s", cases[i].path, cases[i].body, st, json_text(o));
        json_object_put(o);
    }
    json_object_put(want);
    static const struct {
        const char *body, *want;
    } bad[] = {
        {"{}", "content"},
        {"{\"content\":[]}", "content"},
        {"{\"content\":5}", "content"},
        {"{\"content\":[1,2]}", "content"},
        {"{\"input\":[\"a\",[1]]}", "input"},
        {"{\"content\":\"a\",\"encoding_format\":\"hex\"}", "encoding_format"},
        {"{\"content\":\"a\",\"model\":\"docs-lm-21M-F16\"}", "embed"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        expect_error("POST", "/embedding", bad[i].body, 400, "invalid_request_error",
                     bad[i].want);
    expect_error("POST", "/embeddings", "{\"content\":\"a\",\"model\":\"nope\"}", 404,
                 "not_found_error", "nope");
    expect_error("GET", "/embedding", NULL, 405, "invalid_request_error", "POST");
}

/* The bytes of /tokenize's pieces (strings, or arrays of byte values) back to back into
 * out (cap bytes, NUL-terminated), from token from on: their length, or -1 when a token
 * is no {id, piece} object. */
static int pieces_bytes(json_object *toks, size_t from, char *out, size_t cap)
{
    size_t len = 0;
    for (size_t i = from; i < json_object_array_length(toks); i++) {
        json_object *t = json_object_array_get_idx(toks, i), *p = httpc_jget(t, "piece");
        if (!httpc_jget(t, "id") || !p)
            return -1;
        if (json_object_is_type(p, json_type_string)) {
            size_t n = (size_t)json_object_get_string_len(p);
            if (len + n >= cap)
                return -1;
            memcpy(out + len, json_object_get_string(p), n);
            len += n;
            continue;
        }
        for (size_t k = 0; json_object_is_type(p, json_type_array) &&
                           k < json_object_array_length(p) && len + 1 < cap; k++)
            out[len++] = (char)json_object_get_int(json_object_array_get_idx(p, k));
    }
    out[len] = '\0';
    return (int)len;
}

/* with_pieces: each token as {id, piece}, its text as llama.cpp's server gives it (a
 * control token's as written, "<s>"), or its bytes as an array of numbers when they are
 * no whole UTF-8 (a character cut into byte tokens); the same through the worker (a
 * model named). */
static void tokenize_gives_pieces(void)
{
    NEED_DAEMON();
    int n, st;
    char *ids = tokenize(PROMPT, true, &n);
    CHECK(ids);
    json_object *want = json_tokener_parse(ids);
    free(ids);
    json_object *o = post("/tokenize", "{\"content\":\"" PROMPT "\",\"add_special\":true,"
                                       "\"with_pieces\":true}", &st),
                *toks = httpc_jget(o, "tokens");
    CHECK_MSG(st == 200 && toks && json_object_array_length(toks) == (size_t)n &&
                  jint(o, "count") == n,
              "%d %s", st, json_text(o));
    for (int i = 0; i < n; i++)
        CHECK_MSG(jint(json_object_array_get_idx(toks, (size_t)i), "id") ==
                      json_object_get_int(json_object_array_get_idx(want, (size_t)i)),
                  "token %d: %s, ids %s", i, json_text(o), json_text(want));
    json_object_put(want);
    /* BOS as its text; the rest the prompt with the tokenizer's leading space */
    char text[512];
    const char *bos = httpc_jstr(toks, "0.piece");
    CHECK_MSG(bos && bos[0] == '<' && pieces_bytes(toks, 1, text, sizeof text) > 0 &&
                  strcmp(text, " " PROMPT) == 0,
              "%s", json_text(o));
    json_object_put(o);
    /* the same through the worker, which answers a Tokenize that names a model */
    json_object *named = post("/tokenize", "{\"content\":\"" PROMPT "\",\"add_special\":true,"
                                           "\"with_pieces\":true,\"model\":\"docs-lm-21M-F16\"}",
                              &st);
    o = post("/tokenize", "{\"content\":\"" PROMPT "\",\"add_special\":true,"
                          "\"with_pieces\":true}", &st);
    CHECK_MSG(st == 200 && json_object_equal(named, o), "%s, default %s", json_text(named),
              json_text(o));
    json_object_put(named);
    json_object_put(o);
    /* a character the vocabulary has no token for comes as its bytes' tokens: no whole
     * UTF-8 alone, each an array of its byte values */
    o = post("/tokenize", "{\"content\":\"a \\ud83e\\udd99\",\"with_pieces\":true}", &st);
    toks = httpc_jget(o, "tokens");
    size_t arrays = 0;
    for (size_t i = 0; toks && i < json_object_array_length(toks); i++)
        arrays += json_object_is_type(httpc_jget(json_object_array_get_idx(toks, i), "piece"),
                                      json_type_array);
    CHECK_MSG(st == 200 && toks && pieces_bytes(toks, 0, text, sizeof text) > 0 &&
                  strcmp(text, " a \xf0\x9f\xa6\x99") == 0 && arrays >= 2,
              "%d %s", st, json_text(o));
    json_object_put(o);
    /* without it, ids */
    o = post("/tokenize", "{\"content\":\"x\",\"with_pieces\":false}", &st);
    CHECK_MSG(st == 200 && json_object_is_type(httpc_jget(o, "tokens.0"), json_type_int),
              "%d %s", st, json_text(o));
    json_object_put(o);
    o = post("/tokenize", "{\"content\":\"x\",\"with_pieces\":1}", &st);
    CHECK_MSG(st == 400 && strstr(httpc_jstr(o, "error.message"), "with_pieces"), "%d %s", st,
              json_text(o));
    json_object_put(o);
}

/* /slots is refused as llama.cpp's server refuses it without --slots (and its save,
 * restore and erase actions without --slot-save-path): 501 not_supported_error. */
static void slots_are_refused(void)
{
    NEED_DAEMON();
    expect_error("GET", "/slots", NULL, 501, "not_supported_error", "slots endpoint");
    expect_error("GET", "/slots?fail_on_no_slot=1", NULL, 501, "not_supported_error",
                 "slots endpoint");
    expect_error("POST", "/slots/0?action=save", "{\"filename\":\"a.bin\"}", 501,
                 "not_supported_error", "slots action");
    expect_error("POST", "/slots/1?action=erase", NULL, 501, "not_supported_error",
                 "slots action");
    expect_error("POST", "/slots", NULL, 405, "invalid_request_error", "GET");
    expect_error("GET", "/slots/0", NULL, 405, "invalid_request_error", "POST");
    httpc_reply r;
    CHECK(httpc_do(hsock, 0, "HEAD", "/slots", NULL, NULL, &r) == 0);
    CHECK_EQ(r.status, 501);
    httpc_reply_free(&r);
}

/* llama.cpp's four names of its rerank route (/rerank, /reranking, /v1/rerank,
 * /v1/reranking) are one route: the same results for the same body. */
static void rerank_aliases_are_one_route(void)
{
    NEED_DAEMON();
    const char *body = "{\"query\":\"the gateway\",\"documents\":[\"The gateway answers "
                       "HTTP.\",\"Contexts keep their KV.\",\"a cat\"],\"top_n\":2}";
    int st;
    json_object *want = post("/v1/rerank", body, &st);
    CHECK_MSG(st == 200 && httpc_jget(want, "results.1.relevance_score"), "%d %s", st,
              json_text(want));
    static const char *const aliases[] = {"/rerank", "/reranking", "/v1/reranking"};
    for (size_t i = 0; i < sizeof aliases / sizeof *aliases; i++) {
        json_object *o = post(aliases[i], body, &st);
        CHECK_MSG(st == 200 && json_object_equal(httpc_jget(o, "results"),
                                                 httpc_jget(want, "results")),
                  "%s: %d %s, /v1/rerank %s", aliases[i], st, json_text(o), json_text(want));
        json_object_put(o);
    }
    json_object_put(want);
}

/* /infill needs the model's fill-in-the-middle tokens, which the documentation model
 * lacks: refused 501 as llama.cpp's server refuses it, whatever the body (the model is
 * checked first). test_http_infill has a model that has them. */
static void infill_needs_fim_tokens(void)
{
    NEED_DAEMON();
    static const char *const bodies[] = {"{\"input_prefix\":\"a\",\"input_suffix\":\"b\"}",
                                         "{\"input_extra\":7}"};
    for (size_t i = 0; i < sizeof bodies / sizeof *bodies; i++)
        expect_error("POST", "/infill", bodies[i], 501, "not_supported_error",
                     "Infill is not supported by this model: prefix token is missing. suffix "
                     "token is missing. middle token is missing.");
}

/* The rerank route takes TEI's form too, as llama.cpp's does: "texts" for "documents",
 * answered with TEI's array of {index, score} best first (each text with return_text),
 * the scores those of the Jina form. */
static void rerank_takes_the_tei_form(void)
{
    NEED_DAEMON();
    static const char *const texts[] = {"The gateway answers HTTP.", "Contexts keep their KV.",
                                        "a cat"};
    int st;
    json_object *want = post("/rerank", "{\"query\":\"the gateway\",\"documents\":[\"The "
                                        "gateway answers HTTP.\",\"Contexts keep their "
                                        "KV.\",\"a cat\"]}", &st);
    CHECK_MSG(st == 200 && httpc_jget(want, "results.2"), "%d %s", st, json_text(want));
    for (int text = 0; text < 2; text++) {
        char body[512];
        snprintf(body, sizeof body, "{\"query\":\"the gateway\",\"texts\":[\"%s\",\"%s\","
                                    "\"%s\"]%s}", texts[0], texts[1], texts[2],
                 text ? ",\"return_text\":true" : "");
        json_object *o = post("/reranking", body, &st);
        CHECK_MSG(st == 200 && json_object_is_type(o, json_type_array) &&
                      json_object_array_length(o) == 3,
                  "%d %s", st, json_text(o));
        for (size_t i = 0; i < 3; i++) {
            json_object *e = json_object_array_get_idx(o, i);
            char idx[32], score[48], jina[48];
            snprintf(idx, sizeof idx, "%zu.index", i);
            snprintf(score, sizeof score, "%zu.score", i);
            snprintf(jina, sizeof jina, "results.%zu.index", i);
            CHECK_MSG(jint(o, idx) == jint(want, jina), "%s vs %s", json_text(o),
                      json_text(want));
            snprintf(jina, sizeof jina, "results.%zu.relevance_score", i);
            CHECK_NEAR(jnum(o, score), jnum(want, jina), 1e-6);
            CHECK(i == 0 || jnum(o, score) <= jnum(json_object_array_get_idx(o, i - 1), "score"));
            json_object *t;
            bool has = json_object_object_get_ex(e, "text", &t);
            CHECK_EQ(has, text);
            CHECK(!has || strcmp(json_object_get_string(t), texts[jint(o, idx)]) == 0);
            CHECK_EQ(json_object_object_length(e), 2 + text);
        }
        json_object_put(o);
    }
    json_object_put(want);
    static const struct {
        const char *body, *says;
    } bad[] = {
        {"{\"query\":\"q\",\"texts\":[\"a\",1]}", "texts[1]"},
        {"{\"query\":\"q\",\"texts\":[]}", "texts"},
        {"{\"query\":\"q\",\"texts\":[\"a\"],\"documents\":[\"a\"]}", "texts"},
        {"{\"query\":\"q\",\"texts\":[\"a\"],\"return_text\":1}", "return_text"},
        {"{\"query\":\"q\",\"texts\":[\"a\"],\"raw_scores\":true}", "raw_scores"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        json_object *o = post("/rerank", bad[i].body, &st);
        const char *msg = httpc_jstr(o, "error.message");
        CHECK_MSG(st == 400 && msg && strstr(msg, bad[i].says), "%s: %d %s", bad[i].body, st,
                  json_text(o));
        json_object_put(o);
    }
}

/* Over TCP the routes need the bearer token, as every other route; CORS as for them. */
static void tcp_needs_a_token(void)
{
    NEED_DAEMON();
    httpc_reply r;
    static const char *const gets[] = {"/props", "/slots"};
    for (size_t i = 0; i < sizeof gets / sizeof *gets; i++) {
        CHECK(httpc_do(NULL, port, "GET", gets[i], NULL, NULL, &r) == 0);
        json_object *o = json_tokener_parse(r.body);
        CHECK_MSG(r.status == 401 && jint(o, "error.code") == 401 &&
                      jeq(o, "error.type", "authentication_error"),
                  "%s: %d %s", gets[i], r.status, r.body);
        json_object_put(o);
        httpc_reply_free(&r);
    }
    const char *body = "{\"prompt\":\"hi\",\"n_predict\":2}";
    CHECK(httpc_do(NULL, port, "POST", "/completion", NULL, body, &r) == 0);
    CHECK_EQ(r.status, 401);
    httpc_reply_free(&r);
    CHECK(httpc_do(NULL, port, "POST", "/completion",
                   "Authorization: Bearer " TOKEN_USER "\r\nOrigin: http://localhost:8080\r\n",
                   body, &r) == 0);
    CHECK_EQ(r.status, 200);
    CHECK(strstr(r.head, "Access-Control-Allow-Origin: *"));
    httpc_reply_free(&r);
    CHECK(httpc_do(hsock, 0, "OPTIONS", "/completion",
                   "Origin: http://localhost:3000\r\nAccess-Control-Request-Headers: content-type\r\n",
                   NULL, &r) == 0);
    CHECK_EQ(r.status, 200);
    CHECK(strstr(r.head, "Access-Control-Allow-Origin: *"));
    httpc_reply_free(&r);
    /* the other POST routes alike */
    static const struct {
        const char *path, *body;
    } posts[] = {
        {"/apply-template", "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"},
        {"/embedding", "{\"content\":\"hi\"}"},
        {"/embeddings", "{\"content\":[\"hi\"]}"},
        {"/reranking", "{\"query\":\"hi\",\"documents\":[\"a\"]}"},
        {"/tokenize", "{\"content\":\"hi\",\"with_pieces\":true}"},
    };
    for (size_t i = 0; i < sizeof posts / sizeof *posts; i++) {
        CHECK(httpc_do(NULL, port, "POST", posts[i].path, NULL, posts[i].body, &r) == 0);
        CHECK_MSG(r.status == 401, "%s: %d %s", posts[i].path, r.status, r.body);
        httpc_reply_free(&r);
        CHECK(httpc_do(NULL, port, "POST", posts[i].path,
                       "Authorization: Bearer " TOKEN_USER "\r\nOrigin: http://localhost:8080\r\n",
                       posts[i].body, &r) == 0);
        CHECK_MSG(r.status == 200 && strstr(r.head, "Access-Control-Allow-Origin: *"),
                  "%s: %d %s", posts[i].path, r.status, r.body);
        httpc_reply_free(&r);
    }
    CHECK(httpc_do(hsock, 0, "GET", "/metrics", NULL, NULL, &r) == 0);
    CHECK_MSG(r.status == 200 && strstr(r.body, "route=\"/completion\",code=\"200\"") &&
                  strstr(r.body, "route=\"/props\",code=\"200\"") &&
                  strstr(r.body, "route=\"/slots\",code=\"501\"") &&
                  strstr(r.body, "route=\"/apply-template\",code=\"200\"") &&
                  strstr(r.body, "route=\"/embedding\",code=\"200\""),
              "%d %.2000s", r.status, r.body);
    httpc_reply_free(&r);
}

/* ---- random bodies (test_http.c's pattern, with llama.cpp's fields) ---- */

/* field names of the routes' requests, and strings of their values */
static const char *const body_keys[] = {
    "prompt", "n_predict", "max_tokens", "temperature", "top_k", "top_p", "min_p",
    "repeat_penalty", "repeat_last_n", "presence_penalty", "frequency_penalty", "seed", "stop",
    "logit_bias", "n_probs", "stream", "cache_prompt", "ignore_eos", "grammar", "json_schema",
    "model", "id_slot", "samplers", "mirostat", "typical_p", "return_tokens", "response_fields",
    "post_sampling_probs", "n_keep", "min_keep", "mirostat_tau", "mirostat_eta",
    "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
    "dry_sequence_breakers", "xtc_probability", "xtc_threshold", "dynatemp_range",
    "dynatemp_exponent", "top_n_sigma"};
static const char *const body_words[] = {
    "", "top_k", "temperature", "kt", "x", "\xff\xfe", "a\\u0000b", "content",
    "timings/prompt_n", "dry", "\n", "edkt"};
static randjson body_gen = {0x9e3779b97f4a7c15u, body_keys, sizeof body_keys / sizeof *body_keys,
                            body_words, sizeof body_words / sizeof *body_words};

/* A valid body changed at random (fields set to any value or removed) or a random JSON
 * value: the answer is below 500 (503 only while busy), and the daemon stays up. */
static void random_bodies_never_crash(void)
{
    NEED_DAEMON();
    test_random_seed(&body_gen.rng);
    int ok = 0, n = 300;
    for (int i = 0; i < n; i++) {
        json_object *body = randjson_pick(&body_gen, 8)
                                ? json_tokener_parse("{\"prompt\":\"Hi\",\"n_predict\":2}")
                                : randjson_value(&body_gen, 1);
        for (int k = randjson_pick(&body_gen, 4);
             k > 0 && json_object_is_type(body, json_type_object); k--) {
            if (randjson_pick(&body_gen, 4) == 0)
                json_object_object_del(body, randjson_key(&body_gen));
            else
                json_object_object_add(body, randjson_key(&body_gen), randjson_value(&body_gen, 1));
        }
        /* bounded generations keep the test short */
        json_object *np;
        if (json_object_is_type(body, json_type_object)) {
            json_object_object_del(body, "max_tokens");
            if (!json_object_object_get_ex(body, "n_predict", &np) ||
                !json_object_is_type(np, json_type_int) || json_object_get_int64(np) > 4 ||
                json_object_get_int64(np) == -1)
                json_object_object_add(body, "n_predict", json_object_new_int(2));
        }
        const char *text = body ? json_object_to_json_string(body) : "null";
        httpc_reply r;
        int rc = httpc_do(hsock, 0, "POST", "/completion", NULL, text, &r);
        CHECK_MSG(rc == 0, "%s: no answer", text);
        CHECK_MSG(r.status >= 200 && (r.status < 500 || r.status == 503), "%s: %d %s", text,
                  r.status, r.body);
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

/* field names and words of /apply-template's, /embedding's and /tokenize's bodies */
static const char *const other_keys[] = {
    "messages", "role", "content", "tools", "tool_choice", "type", "function", "name",
    "parameters", "tool_calls", "input", "encoding_format", "with_pieces", "add_special",
    "parse_special", "model", "text"};
static const char *const other_words[] = {
    "", "user", "system", "assistant", "tool", "function", "required", "none", "auto", "text",
    "float", "base64", "docs-lm-21M-F16", "docs-embed-5M-F16", "\xff\xfe", "<s>",
    "a\\u0000b"};
static randjson other_gen = {0x2545f4914f6cdd1du, other_keys,
                             sizeof other_keys / sizeof *other_keys, other_words,
                             sizeof other_words / sizeof *other_words};

/* The same for the other routes: valid bodies changed at random, or random values. */
static void random_bodies_on_the_other_routes(void)
{
    NEED_DAEMON();
    static const struct {
        const char *path, *body;
    } routes[] = {
        {"/apply-template", "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]," TOOLS "}"},
        {"/embedding", "{\"content\":[\"Hi\",\"there\"]}"},
        {"/tokenize", "{\"content\":\"Hi \\u00e1\",\"with_pieces\":true}"},
    };
    test_random_seed(&other_gen.rng);
    for (size_t k = 0; k < sizeof routes / sizeof *routes; k++) {
        int ok = 0, n = 150;
        for (int i = 0; i < n; i++) {
            json_object *body = randjson_pick(&other_gen, 8) ? json_tokener_parse(routes[k].body)
                                                             : randjson_value(&other_gen, 1);
            for (int m = randjson_pick(&other_gen, 4);
                 m > 0 && json_object_is_type(body, json_type_object); m--) {
                json_object *into = body, *msgs;
                /* the first message's fields too, where a chat's shape is read */
                if (json_object_object_get_ex(body, "messages", &msgs) &&
                    json_object_is_type(msgs, json_type_array) &&
                    json_object_is_type(json_object_array_get_idx(msgs, 0), json_type_object) &&
                    randjson_pick(&other_gen, 2))
                    into = json_object_array_get_idx(msgs, 0);
                if (randjson_pick(&other_gen, 4) == 0)
                    json_object_object_del(into, randjson_key(&other_gen));
                else
                    json_object_object_add(into, randjson_key(&other_gen),
                                           randjson_value(&other_gen, 1));
            }
            const char *text = body ? json_object_to_json_string(body) : "null";
            httpc_reply r;
            CHECK_MSG(httpc_do(hsock, 0, "POST", routes[k].path, NULL, text, &r) == 0,
                      "%s %s: no answer", routes[k].path, text);
            CHECK_MSG(r.status >= 200 && (r.status < 500 || r.status == 503), "%s %s: %d %s",
                      routes[k].path, text, r.status, r.body);
            ok += r.status == 200;
            httpc_reply_free(&r);
            json_object_put(body);
        }
        fprintf(stderr, "    %s: %d random bodies, %d answered 200\n", routes[k].path, n, ok);
    }
    httpc_reply r;
    CHECK(httpc_do(hsock, 0, "GET", "/health", NULL, NULL, &r) == 0);
    CHECK_EQ(r.status, 200);
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
    const char *p = test_data_path("models/docs-lm-21M-F16.gguf");
    model_path = p ? strdup(p) : NULL;
    p = test_data_path("models/docs-embed-5M-F16.gguf");
    embed_path = p ? strdup(p) : NULL;
    RUN(props_answers_the_defaults);
    RUN(greedy_equals_openai);
    RUN(token_prompts_are_their_tokens);
    RUN(n_predict_limits);
    RUN(ignore_eos_runs_to_the_limit);
    RUN(stop_words_stop);
    RUN(streamed_equals_whole);
    RUN(n_probs_give_probabilities);
    RUN(logit_bias_bans);
    RUN(json_schema_is_followed);
    RUN(samplers_list_is_honoured);
    RUN(dry_stops_a_repetition_loop);
    RUN(newer_samplers_change_the_reply);
    RUN(newer_samplers_have_settings);
    RUN(prompt_cache_resumes);
    RUN(client_defaults_are_served);
    RUN(response_fields_pick);
    RUN(refusals_name_the_field);
    RUN(apply_template_is_the_chat_prompt);
    RUN(apply_template_refuses_as_the_chat);
    RUN(embedding_equals_openai);
    RUN(tokenize_gives_pieces);
    RUN(slots_are_refused);
    RUN(infill_needs_fim_tokens);
    RUN(rerank_aliases_are_one_route);
    RUN(rerank_takes_the_tei_form);
    RUN(tcp_needs_a_token);
    RUN(random_bodies_never_crash);
    RUN(random_bodies_on_the_other_routes);
    RUN(daemon_exits_cleanly);
    free((char *)model_path);
    free((char *)embed_path);
    return test_finish();
}
