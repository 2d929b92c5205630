/*
 * ollama's native API on the HTTP gateway (daemon/net/ollama.c) end to end: a real llmsd
 * of this build with two generated generate models ("ol", the default, and "slow"), its
 * gateway on a Unix socket and a TCP port with bearer tokens. /api/generate and /api/chat,
 * streamed (NDJSON, ollama's default) and whole, give exactly the text, counts and end of
 * the OpenAI routes' greedy answers for the same prompt; /api/embed and /api/embeddings
 * the vectors of /v1/embeddings; /api/version, /api/tags, /api/ps and /api/show their
 * shapes; errors are ollama's {"error": "..."} with its statuses (404 for an unknown
 * model, 400 for what is not produced or a bad option, model management refused); the
 * same token, CORS, /metrics and disconnect handling as the OpenAI routes; random and
 * malformed bodies never give a 5xx. JSON mode ("format": "json") and the options of
 * Mirostat and locally typical sampling run on the trained documentation model of
 * ../shared/testdata, and skip without it.
 */
#include <ctype.h>
#include <grp.h>
#include <json-c/json.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"
#include "tests/integration/httpc.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/integration/randjson.h"
#include "tests/support/test.h"

#define TOKEN_USER "tok-ollama-0123456789"
#define WINDOW 2048
#define SYSTEM "Be brief."
#define USER "hello there"

static char llmsd_path[1024], model_path[1024], slow_path[1024];
static const char *docs_path; /* the trained documentation model, NULL without test data */
static llmsd_proc daemon_, docs_daemon;
static int daemon_up, docs_up;
static char hsock[700], docs_sock[700];
static int port;

#define NEED(up, start)                                                        \
    do {                                                                       \
        if (!llmsd_path[0])                                                    \
            SKIP("llmsd is not built in this tree");                           \
        if (!model_path[0] || !slow_path[0])                                   \
            SKIP("no model could be generated");                               \
        if (!(up))                                                             \
            (up) = (start) == 0 ? 1 : -1;                                      \
        CHECK_MSG((up) == 1, "llmsd did not start");                           \
    } while (0)

static int start_daemon(void)
{
    char tokens[700], extra[2048];
    proc_fmt(tokens, sizeof tokens, "%s/ol-tokens", test_tmpdir());
    FILE *f = fopen(tokens, "w");
    if (!f)
        return -1;
    fprintf(f, "%s %u olapp\n", TOKEN_USER, (unsigned)getuid());
    fclose(f);
    chmod(tokens, 0600);
    port = httpc_free_port();
    struct group *g = getgrgid(getgid());
    proc_fmt(hsock, sizeof hsock, "%s/ol-h.sock", test_tmpdir());
    proc_fmt(extra, sizeof extra,
             "n_ctx = %d\nmodel.slow = %s generate\nhttp_socket = %s\n"
             "http_listen = 127.0.0.1:%d\nhttp_tokens_file = %s\nadmin_group = %s\n",
             WINDOW, slow_path, hsock, port, tokens, g ? g->gr_name : "root");
    return proc_start(&daemon_, llmsd_path, "ol", model_path, extra);
}

static int start_docs(void)
{
    char extra[1024];
    proc_fmt(docs_sock, sizeof docs_sock, "%s/ol-docs-h.sock", test_tmpdir());
    proc_fmt(extra, sizeof extra, "http_socket = %s\nthreads = 2\n", docs_sock);
    return proc_start(&docs_daemon, llmsd_path, "ol-docs", docs_path, extra);
}

static json_object *post(const char *path, const char *body, int *status)
{
    return httpc_post_json(hsock, path, body, status);
}

static json_object *get(const char *path, int *status)
{
    httpc_reply r;
    *status = 0;
    if (httpc_do(hsock, 0, "GET", path, NULL, NULL, &r))
        return NULL;
    *status = r.status;
    json_object *o = json_tokener_parse(r.body);
    httpc_reply_free(&r);
    return o;
}

static int64_t jint(json_object *o, const char *path)
{
    const char *s = httpc_jstr(o, path);
    return s ? strtoll(s, NULL, 10) : -1;
}

static bool jeq(json_object *o, const char *path, const char *want)
{
    const char *s = httpc_jstr(o, path);
    return s && strcmp(s, want) == 0;
}

/* The member key of o (whose name may hold dots, as model_info's do) as a string. */
static const char *member(json_object *o, const char *key)
{
    json_object *v;
    return json_object_object_get_ex(o, key, &v) ? json_object_get_string(v) : NULL;
}

/* Whether s is an RFC 3339 time in UTC as ollama writes them (2024-05-01T10:00:00Z, with
 * or without a fraction of a second). */
static bool is_rfc3339(const char *s)
{
    int y, mo, d, h, mi, sec, n = 0;
    if (!s || sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d%n", &y, &mo, &d, &h, &mi, &sec, &n) != 6 ||
        n != 19)
        return false;
    s += n;
    if (*s == '.')
        for (s++; isdigit((unsigned char)*s);)
            s++;
    return strcmp(s, "Z") == 0;
}

/* An NDJSON reply: every line one JSON object. */
typedef struct ndjson {
    json_object *lines[1024];
    size_t n;
} ndjson;

static void ndjson_free(ndjson *nd)
{
    for (size_t i = 0; i < nd->n; i++)
        json_object_put(nd->lines[i]);
    nd->n = 0;
}

/* POSTs body to path on sock and reads its NDJSON lines; the HTTP status, 0 when no reply
 * came, -1 when a line is no JSON object (after a message). */
static int post_ndjson(const char *sock, const char *path, const char *body, ndjson *nd)
{
    httpc_reply r;
    nd->n = 0;
    if (httpc_do(sock, 0, "POST", path, NULL, body, &r))
        return 0;
    int status = r.status;
    if (status == 200 && !strstr(r.head, "application/x-ndjson")) {
        fprintf(stderr, "not NDJSON: %s\n", r.head);
        status = -1;
    }
    char *save;
    for (char *line = strtok_r(r.body, "\n", &save); line && status == 200;
         line = strtok_r(NULL, "\n", &save)) {
        json_object *o = json_tokener_parse(line);
        if (!json_object_is_type(o, json_type_object) || nd->n == 1024) {
            fprintf(stderr, "not a JSON object line: '%s'\n", line);
            json_object_put(o);
            status = -1;
            break;
        }
        nd->lines[nd->n++] = o;
    }
    httpc_reply_free(&r);
    return status;
}

/* The OpenAI route's greedy answer to body: its text (malloc'd), tokens and finish. */
typedef struct openai_answer {
    char *text;
    int prompt_tokens, completion_tokens;
    char finish[16];
} openai_answer;

static bool openai_ask(const char *path, const char *body, openai_answer *a)
{
    int st;
    json_object *o = post(path, body, &st);
    bool chat = strstr(path, "chat") != NULL;
    const char *t = o ? httpc_jstr(o, chat ? "choices.0.message.content" : "choices.0.text")
                      : NULL;
    memset(a, 0, sizeof *a);
    if (st != 200 || !t) {
        test_fail(__FILE__, __LINE__, "%s: status %d", path, st);
        json_object_put(o);
        return false;
    }
    a->text = strdup(t);
    a->prompt_tokens = (int)jint(o, "usage.prompt_tokens");
    a->completion_tokens = (int)jint(o, "usage.completion_tokens");
    snprintf(a->finish, sizeof a->finish, "%s", httpc_jstr(o, "choices.0.finish_reason"));
    json_object_put(o);
    return true;
}

/* json_object_to_json_string, for messages. */
static const char *json_text(json_object *o)
{
    return o ? json_object_to_json_string(o) : "(none)";
}

/* The text of a generate ("response") or chat ("message.content") line. */
static const char *piece_of(json_object *line, bool chat)
{
    return httpc_jstr(line, chat ? "message.content" : "response");
}

/* Checks an ollama final object against the OpenAI answer: done, done_reason, counts,
 * durations in nanoseconds. */
static bool final_matches(json_object *fin, const openai_answer *want, const char *what)
{
    bool ok = jeq(fin, "done", "true") && jeq(fin, "done_reason", want->finish) &&
              jint(fin, "prompt_eval_count") == want->prompt_tokens &&
              jint(fin, "eval_count") == want->completion_tokens &&
              jint(fin, "load_duration") == 0 && jint(fin, "eval_duration") > 0 &&
              jint(fin, "prompt_eval_duration") > 0 &&
              jint(fin, "total_duration") >=
                  jint(fin, "eval_duration") + jint(fin, "prompt_eval_duration") &&
              is_rfc3339(httpc_jstr(fin, "created_at"));
    if (!ok)
        test_fail(__FILE__, __LINE__, "%s: final %s, OpenAI's %d+%d tokens, %s", what,
                  json_text(fin), want->prompt_tokens, want->completion_tokens, want->finish);
    return ok;
}

/* Asks path (generate or chat) with fields whole and streamed; both must give want and
 * name the model as the request named it (model). */
static void ask_both_ways(const char *path, const char *fields, const char *model,
                          const openai_answer *want)
{
    bool chat = strstr(path, "chat") != NULL;
    char body[2048];
    snprintf(body, sizeof body, "{%s,\"stream\":false}", fields);
    int st;
    json_object *whole = post(path, body, &st);
    CHECK_MSG(whole && st == 200, "%s: status %d %s", path, st, json_text(whole));
    CHECK_MSG(jeq(whole, "model", model), "%s", json_text(whole));
    if (chat)
        CHECK(jeq(whole, "message.role", "assistant"));
    const char *text = piece_of(whole, chat);
    CHECK_MSG(text && strcmp(text, want->text) == 0, "%s whole: '%s', OpenAI's '%s'", path,
              text ? text : "", want->text);
    bool ok = final_matches(whole, want, "whole");
    json_object_put(whole);
    if (!ok)
        return;
    /* streamed is ollama's default: no "stream" field */
    snprintf(body, sizeof body, "{%s}", fields);
    ndjson nd;
    CHECK_EQ(post_ndjson(hsock, path, body, &nd), 200);
    CHECK(nd.n >= 2);
    char got[8192] = "";
    size_t len = 0;
    for (size_t i = 0; i + 1 < nd.n; i++) {
        const char *p = piece_of(nd.lines[i], chat);
        CHECK_MSG(p && jeq(nd.lines[i], "done", "false") && jeq(nd.lines[i], "model", model) &&
                      is_rfc3339(httpc_jstr(nd.lines[i], "created_at")),
                  "line %zu: %s", i, json_text(nd.lines[i]));
        if (chat)
            CHECK(jeq(nd.lines[i], "message.role", "assistant"));
        if (len + strlen(p) < sizeof got) {
            memcpy(got + len, p, strlen(p) + 1);
            len += strlen(p);
        }
    }
    json_object *fin = nd.lines[nd.n - 1];
    CHECK_MSG(strcmp(got, want->text) == 0, "%s streamed: '%s', OpenAI's '%s'", path, got,
              want->text);
    /* the last line carries no more text */
    const char *last = piece_of(fin, chat);
    CHECK_MSG(last && !last[0], "last line: %s", json_text(fin));
    CHECK(final_matches(fin, want, "streamed"));
    ndjson_free(&nd);
}

static void generate_matches_openai(void)
{
    NEED(daemon_up, start_daemon());
    openai_answer want;
    if (!openai_ask("/v1/chat/completions",
                    "{\"model\":\"ol\",\"messages\":[{\"role\":\"system\",\"content\":\"" SYSTEM
                    "\"},{\"role\":\"user\",\"content\":\"" USER "\"}],"
                    "\"temperature\":0,\"max_tokens\":12}",
                    &want))
        return;
    ask_both_ways("/api/generate",
                  "\"model\":\"ol\",\"prompt\":\"" USER "\",\"system\":\"" SYSTEM "\","
                  "\"options\":{\"temperature\":0,\"num_predict\":12},\"keep_alive\":\"5m\"",
                  "ol", &want);
    free(want.text);
    /* raw: the prompt as it is, as /v1/completions sends it */
    if (!openai_ask("/v1/completions",
                    "{\"model\":\"ol\",\"prompt\":\"" USER "\",\"temperature\":0,"
                    "\"max_tokens\":5}", &want))
        return;
    CHECK_EQ(want.completion_tokens, 5);
    CHECK(strcmp(want.finish, "length") == 0);
    ask_both_ways("/api/generate",
                  "\"model\":\"ol:latest\",\"prompt\":\"" USER "\",\"raw\":true,"
                  "\"options\":{\"temperature\":0,\"num_predict\":5}",
                  "ol:latest", &want);
    free(want.text);
}

/* A stop string ends the reply before it, with done_reason "stop". */
static void stop_option_stops(void)
{
    NEED(daemon_up, start_daemon());
    openai_answer full;
    if (!openai_ask("/v1/completions",
                    "{\"model\":\"ol\",\"prompt\":\"" USER "\",\"temperature\":0,"
                    "\"max_tokens\":16}", &full))
        return;
    size_t at = 1;
    while (full.text[at] && full.text[at + 1] &&
           !(isalpha((unsigned char)full.text[at]) && isalpha((unsigned char)full.text[at + 1])))
        at++;
    if (!full.text[at] || !full.text[at + 1]) {
        free(full.text);
        SKIP("the greedy text has no two letters in a row to stop at");
    }
    char stop[3] = {full.text[at], full.text[at + 1], 0}, body[512];
    snprintf(body, sizeof body,
             "{\"prompt\":\"" USER "\",\"raw\":true,\"stream\":false,"
             "\"options\":{\"temperature\":0,\"num_predict\":16,\"stop\":[\"%s\"]}}", stop);
    int st;
    json_object *o = post("/api/generate", body, &st);
    CHECK(o && st == 200);
    size_t before = (size_t)(strstr(full.text, stop) - full.text);
    const char *text = httpc_jstr(o, "response");
    CHECK_MSG(text && strlen(text) == before && strncmp(text, full.text, before) == 0 &&
                  jeq(o, "done_reason", "stop"),
              "stop '%s': %s (full '%s')", stop, json_text(o), full.text);
    json_object_put(o);
    free(full.text);
}

static void chat_matches_openai(void)
{
    NEED(daemon_up, start_daemon());
    const char *msgs = "[{\"role\":\"system\",\"content\":\"" SYSTEM "\"},"
                       "{\"role\":\"user\",\"content\":\"hi\"},"
                       "{\"role\":\"assistant\",\"content\":\"hello\"},"
                       "{\"role\":\"user\",\"content\":\"" USER "\"}]";
    char body[2048];
    snprintf(body, sizeof body,
             "{\"model\":\"ol\",\"messages\":%s,\"temperature\":0,\"max_tokens\":10}", msgs);
    openai_answer want;
    if (!openai_ask("/v1/chat/completions", body, &want))
        return;
    snprintf(body, sizeof body,
             "\"model\":\"ol\",\"messages\":%s,\"options\":{\"temperature\":0,"
             "\"num_predict\":10},\"tools\":[]", msgs);
    ask_both_ways("/api/chat", body, "ol", &want);
    free(want.text);
}

/* ollama's "load the model" calls: an empty prompt, no messages. */
static void empty_prompt_loads(void)
{
    NEED(daemon_up, start_daemon());
    static const char *const asks[][2] = {
        {"/api/generate", "{\"model\":\"ol\"}"},
        {"/api/generate", "{\"model\":\"ol\",\"prompt\":\"\",\"stream\":false}"},
        /* ollama loads on an empty prompt whatever else comes with it */
        {"/api/generate", "{\"model\":\"ol\",\"prompt\":\"\",\"keep_alive\":-1,"
                          "\"options\":{\"num_predict\":0}}"},
        {"/api/generate", "{\"model\":\"ol\",\"prompt\":\"\",\"system\":\"" SYSTEM "\"}"},
        {"/api/chat", "{\"model\":\"ol\",\"messages\":[]}"},
    };
    for (size_t i = 0; i < sizeof asks / sizeof *asks; i++) {
        int st;
        json_object *o = post(asks[i][0], asks[i][1], &st);
        bool chat = strstr(asks[i][0], "chat") != NULL;
        const char *text = o ? piece_of(o, chat) : NULL;
        CHECK_MSG(st == 200 && jeq(o, "done", "true") && text && !text[0] &&
                      jeq(o, "done_reason", "load"),
                  "%s %s: %d %s", asks[i][0], asks[i][1], st, json_text(o));
        json_object_put(o);
    }
}

static void embed_matches_openai(void)
{
    NEED(daemon_up, start_daemon());
    int st;
    json_object *want = post("/v1/embeddings", "{\"input\":[\"first text\",\"second\"]}", &st);
    CHECK(want && st == 200);
    json_object *o = post("/api/embed",
                          "{\"model\":\"ol:latest\",\"input\":[\"first text\",\"second\"],"
                          "\"truncate\":true,\"keep_alive\":0}", &st);
    CHECK_MSG(o && st == 200, "%d %s", st, json_text(o));
    CHECK(jeq(o, "model", "ol:latest"));
    json_object *embs, *one;
    CHECK(json_object_object_get_ex(o, "embeddings", &embs) &&
          json_object_array_length(embs) == 2);
    CHECK(jint(o, "prompt_eval_count") == jint(want, "usage.prompt_tokens"));
    for (size_t i = 0; i < 2; i++) {
        char path[64];
        snprintf(path, sizeof path, "data.%zu.embedding", i);
        json_object *w = want, *g = json_object_array_get_idx(embs, i);
        for (char *save, *k = strtok_r(path, ".", &save); k && w; k = strtok_r(NULL, ".", &save))
            w = isdigit((unsigned char)*k) ? json_object_array_get_idx(w, (size_t)atoi(k))
                : json_object_object_get_ex(w, k, &w) ? w : NULL;
        CHECK(w && json_object_array_length(w) == json_object_array_length(g));
        for (size_t d = 0; d < json_object_array_length(w); d++)
            CHECK(json_object_get_double(json_object_array_get_idx(w, d)) ==
                  json_object_get_double(json_object_array_get_idx(g, d)));
    }
    /* one string, and the legacy route */
    json_object *single = post("/api/embed", "{\"model\":\"ol\",\"input\":\"second\"}", &st);
    CHECK(single && st == 200);
    json_object *legacy = post("/api/embeddings", "{\"model\":\"ol\",\"prompt\":\"second\"}", &st);
    CHECK(legacy && st == 200);
    CHECK(json_object_object_get_ex(single, "embeddings", &one));
    json_object *a = json_object_array_get_idx(one, 0), *b = json_object_array_get_idx(embs, 1),
                *c = NULL;
    CHECK(json_object_object_get_ex(legacy, "embedding", &c));
    CHECK(a && c && json_object_array_length(a) == json_object_array_length(b) &&
          json_object_array_length(c) == json_object_array_length(b));
    for (size_t d = 0; d < json_object_array_length(b); d++) {
        double x = json_object_get_double(json_object_array_get_idx(b, d));
        CHECK(json_object_get_double(json_object_array_get_idx(a, d)) == x);
        CHECK(json_object_get_double(json_object_array_get_idx(c, d)) == x);
    }
    json_object_put(single);
    json_object_put(legacy);
    /* dimensions other than the model's: refused, not cut */
    json_object *dims = post("/api/embed", "{\"input\":\"x\",\"dimensions\":3}", &st);
    CHECK_MSG(st == 400 && httpc_jstr(dims, "error") && strstr(httpc_jstr(dims, "error"), "dimensions"),
              "%d %s", st, json_text(dims));
    json_object_put(dims);
    /* the legacy route's empty prompt is an empty vector, as ollama answers it */
    json_object *empty = post("/api/embeddings", "{\"model\":\"ol\",\"prompt\":\"\"}", &st);
    CHECK(empty && st == 200 && json_object_object_get_ex(empty, "embedding", &c) &&
          json_object_array_length(c) == 0);
    json_object_put(empty);
    /* no input (ollama's "load the model" call): no vectors */
    empty = post("/api/embed", "{\"model\":\"ol\",\"input\":[]}", &st);
    CHECK(empty && st == 200 && json_object_object_get_ex(empty, "embeddings", &c) &&
          json_object_array_length(c) == 0);
    json_object_put(empty);
    json_object_put(o);
    json_object_put(want);
}

/* A model of /api/tags or /api/ps: the registry's, as ollama describes a model. */
static bool model_entry_ok(json_object *m, const char *name, const char *path, const char *quant)
{
    char tagged[64];
    snprintf(tagged, sizeof tagged, "%s:latest", name);
    struct stat st;
    if (stat(path, &st) != 0)
        return false;
    const char *ps = httpc_jstr(m, "details.parameter_size");
    bool ok = jeq(m, "name", tagged) && jeq(m, "model", tagged) &&
              jint(m, "size") == (int64_t)st.st_size && jeq(m, "digest", "") &&
              jeq(m, "details.format", "gguf") && jeq(m, "details.family", "llama") &&
              jeq(m, "details.families.0", "llama") && jeq(m, "details.quantization_level", quant) &&
              ps && ps[0] && isdigit((unsigned char)ps[0]);
    if (!ok)
        test_fail(__FILE__, __LINE__, "%s: %s", name, json_text(m));
    return ok;
}

static void version_tags_ps_show(void)
{
    NEED(daemon_up, start_daemon());
    int st;
    json_object *o = get("/api/version", &st);
    CHECK(st == 200 && jeq(o, "version", LLMS_VERSION));
    json_object_put(o);
    /* HEAD too, as for every GET route */
    httpc_reply r;
    CHECK(httpc_do(hsock, 0, "HEAD", "/api/version", NULL, NULL, &r) == 0);
    CHECK_EQ(r.status, 200);
    httpc_reply_free(&r);
    /* the heartbeat ollama's CLI and tools probe before anything else (404 before) */
    CHECK(httpc_do(hsock, 0, "GET", "/", NULL, NULL, &r) == 0);
    CHECK_MSG(r.status == 200 && strstr(r.body, "running"), "%d %s", r.status, r.body);
    httpc_reply_free(&r);
    CHECK(httpc_do(hsock, 0, "HEAD", "/", NULL, NULL, &r) == 0);
    CHECK_EQ(r.status, 200);
    httpc_reply_free(&r);
    for (int ps = 0; ps < 2; ps++) {
        o = get(ps ? "/api/ps" : "/api/tags", &st);
        json_object *models;
        CHECK(st == 200 && json_object_object_get_ex(o, "models", &models));
        CHECK_EQ(json_object_array_length(models), 2);
        json_object *m0 = json_object_array_get_idx(models, 0),
                    *m1 = json_object_array_get_idx(models, 1);
        CHECK(model_entry_ok(m0, "ol", model_path, "F32"));
        CHECK(model_entry_ok(m1, "slow", slow_path, "Q8_0"));
        struct stat sb;
        CHECK(stat(model_path, &sb) == 0);
        if (ps) {
            CHECK(is_rfc3339(httpc_jstr(m0, "expires_at")));
            CHECK(jint(m0, "size_vram") == 0);
        } else {
            /* the file's mtime */
            const char *mod = httpc_jstr(m0, "modified_at");
            struct tm tm;
            char want[32];
            gmtime_r(&sb.st_mtime, &tm);
            strftime(want, sizeof want, "%Y-%m-%dT%H:%M:%SZ", &tm);
            CHECK_MSG(mod && strcmp(mod, want) == 0, "modified_at %s, the file's %s",
                      mod ? mod : "", want);
        }
        json_object_put(o);
    }
    /* names as ollama reads them: the tag optional, the case not telling (ollama run
     * Llama3.1 finds llama3.1) */
    static const char *const shows[] = {"{\"model\":\"ol\"}", "{\"name\":\"ol:latest\"}",
                                        "{\"model\":\"ol\",\"verbose\":true}",
                                        "{\"model\":\"OL:Latest\"}"};
    for (size_t i = 0; i < sizeof shows / sizeof *shows; i++) {
        o = post("/api/show", shows[i], &st);
        char ctx[32];
        snprintf(ctx, sizeof ctx, "%d", WINDOW);
        json_object *mi = NULL;
        const char *arch, *count, *window;
        CHECK_MSG(st == 200 && jeq(o, "details.format", "gguf") &&
                      jeq(o, "details.family", "llama") &&
                      httpc_jstr(o, "template") && httpc_jstr(o, "template")[0] &&
                      json_object_object_get_ex(o, "model_info", &mi) &&
                      (arch = member(mi, "general.architecture")) && !strcmp(arch, "llama") &&
                      (count = member(mi, "general.parameter_count")) && atoll(count) > 0 &&
                      (window = member(mi, "llama.context_length")) && !strcmp(window, ctx) &&
                      jeq(o, "capabilities.0", "completion") && is_rfc3339(httpc_jstr(o, "modified_at")),
                  "%s: %d %s", shows[i], st, json_text(o));
        json_object_put(o);
    }
}

/* An ollama error: the status, and {"error": a string} containing want. */
static void expect_error(const char *method, const char *path, const char *body, int status,
                         const char *want)
{
    httpc_reply r;
    CHECK(httpc_do(hsock, 0, method, path, NULL, body, &r) == 0);
    json_object *o = json_tokener_parse(r.body), *e = NULL;
    bool ok = r.status == status && json_object_object_get_ex(o, "error", &e) &&
              json_object_is_type(e, json_type_string) && strstr(json_object_get_string(e), want);
    CHECK_MSG(ok, "%s %s %.200s: %d %s (want %d '%s')", method, path, body ? body : "", r.status,
              r.body, status, want);
    json_object_put(o);
    httpc_reply_free(&r);
}

/* Fifteen stop strings: one more than a chat takes beside its template's end text. */
#define STOPS_15                                                                           \
    "\"a1\",\"b1\",\"c1\",\"d1\",\"e1\",\"f1\",\"g1\",\"h1\",\"i1\",\"j1\",\"k1\",\"l1\",\"m1\",\"n1\","  \
    "\"o1\""

static void errors_are_ollama_shaped(void)
{
    NEED(daemon_up, start_daemon());
    static const struct {
        const char *path, *body;
        int status;
        const char *want;
    } cases[] = {
        {"/api/generate", "{\"model\":\"nope\",\"prompt\":\"x\"}", 404, "model 'nope' not found"},
        {"/api/chat", "{\"model\":\"nope\",\"messages\":[]}", 404, "model 'nope' not found"},
        {"/api/embed", "{\"model\":\"nope\",\"input\":\"x\"}", 404, "model 'nope' not found"},
        {"/api/show", "{\"model\":\"nope\"}", 404, "model 'nope' not found"},
        {"/api/generate", "{\"model\":\"ol:7b\",\"prompt\":\"x\"}", 404, "model 'ol:7b' not found"},
        {"/api/generate", "{\"prompt\":\"x\",\"images\":[\"aGk=\"]}", 400, "images"},
        {"/api/chat",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"images\":[\"aGk=\"]}]}", 400,
         "images"},
        {"/api/chat",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\"}]}",
         400, "tools"},
        {"/api/generate", "{\"prompt\":\"x\",\"template\":\"{{ .Prompt }}\"}", 400, "template"},
        {"/api/generate", "{\"prompt\":\"x\",\"suffix\":\"y\"}", 400, "does not support insert"},
        {"/api/chat", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"think\":true}",
         400, "think"},
        {"/api/generate", "{\"prompt\":\"x\",\"context\":[1,2,3]}", 400, "context"},
        {"/api/generate", "{\"prompt\":\"x\",\"options\":\"hot\"}", 400, "options"},
        {"/api/generate", "{\"prompt\":\"x\",\"options\":{\"temperature\":\"hot\"}}", 400,
         "temperature"},
        {"/api/generate", "{\"prompt\":\"x\",\"options\":{\"num_predict\":-3}}", 400,
         "num_predict"},
        {"/api/generate", "{\"prompt\":\"x\",\"options\":{\"stop\":[1]}}", 400, "stop"},
        /* the count the client sent, not one with the chat template's end text in it */
        {"/api/chat",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"options\":{\"stop\":[" STOPS_15
         "]}}", 400, "'options.stop' has 15 strings"},
        {"/api/generate", "{\"prompt\":\"x\",\"options\":{\"stop\":[" STOPS_15 ",\"p1\"]}}",
         400, "'options.stop' has 16 strings"},
        {"/api/generate", "{\"prompt\":\"x\",\"options\":{\"mirostat\":7}}", 400, "mirostat"},
        {"/api/generate", "{\"prompt\":\"x\",\"options\":{\"tfs_z\":0.95}}", 400, "tfs_z"},
        {"/api/generate", "{\"prompt\":\"x\",\"format\":{\"type\":\"object\",\"minProperties\":1}}",
         400, "'minProperties'"},
        {"/api/generate", "{\"prompt\":\"x\",\"format\":\"yaml\"}", 400, "format"},
        {"/api/generate", "{\"prompt\":\"x\",\"raw\":true,\"system\":\"s\"}", 400, "raw"},
        {"/api/generate", "{\"prompt\":\"x\",\"stream\":\"yes\"}", 400, "stream"},
        {"/api/chat", "{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", 400, "tool"},
        {"/api/embed", "{\"input\":[1,2]}", 400, "input"},
        {"/api/generate", "[1]", 400, "JSON object"},
        {"/api/pull", "{\"model\":\"llama3\"}", 403, "llmsctl load"},
        {"/api/push", "{\"model\":\"ol\"}", 403, "llmsctl load"},
        {"/api/create", "{\"model\":\"x\",\"from\":\"ol\"}", 403, "llmsctl load"},
        {"/api/copy", "{\"source\":\"ol\",\"destination\":\"x\"}", 403, "llmsctl load"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        expect_error("POST", cases[i].path, cases[i].body, cases[i].status, cases[i].want);
    expect_error("DELETE", "/api/delete", "{\"model\":\"ol\"}", 403, "llmsctl load");
    expect_error("GET", "/api/generate", NULL, 405, "POST");
    expect_error("POST", "/api/tags", "{}", 405, "GET");
    /* a prompt beyond the window: the worker's refusal, in ollama's shape, streamed or not */
    char *big = malloc(60000);
    CHECK(big);
    strcpy(big, "{\"prompt\":\"");
    for (int i = 0; i < 3000; i++)
        strcat(big, "word ");
    strcat(big, "\",\"raw\":true}");
    expect_error("POST", "/api/generate", big, 400, "window");
    free(big);
}

/* The bodies real clients send with their defaults are served, streamed or whole: the
 * ollama Python library (old and new), LangChain's ChatOllama, Open WebUI and Continue
 * (which sends its own num_ctx, 32768 by default, with every request: ollama caps a
 * num_ctx beyond what the model has rather than refusing it). */
static void client_defaults_are_served(void)
{
    NEED(daemon_up, start_daemon());
    static const struct {
        const char *who, *path, *body;
    } asks[] = {
        {"ollama-python 0.3 generate", "/api/generate",
         "{\"model\":\"ol\",\"prompt\":\"hi\",\"suffix\":\"\",\"system\":\"\",\"template\":\"\","
         "\"context\":[],\"stream\":false,\"raw\":false,\"images\":[],\"format\":\"\","
         "\"options\":{\"num_predict\":4},\"keep_alive\":null}"},
        {"ollama-python 0.4 chat", "/api/chat",
         "{\"model\":\"ol\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[],"
         "\"stream\":true,\"options\":{\"num_predict\":4}}"},
        {"LangChain ChatOllama", "/api/chat",
         "{\"model\":\"ol:latest\",\"messages\":[{\"role\":\"system\",\"content\":\"s\","
         "\"images\":[]},{\"role\":\"user\",\"content\":\"hi\",\"images\":[]}],\"stream\":true,"
         "\"format\":null,\"options\":{\"num_predict\":4,\"stop\":null},\"keep_alive\":null}"},
        {"Open WebUI", "/api/chat",
         "{\"model\":\"ol:latest\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
         "\"stream\":true,\"options\":{\"num_predict\":4},\"keep_alive\":\"5m\",\"format\":\"\"}"},
        {"Continue chat", "/api/chat",
         "{\"model\":\"ol\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
         "\"options\":{\"temperature\":0.5,\"num_predict\":4,\"num_ctx\":32768},"
         "\"keep_alive\":1800,\"stream\":true}"},
        /* a JSON number with a fraction part for an integer option, as Python's json
         * writes a float: ollama reads every option number as a float64 */
        {"integers written as floats", "/api/generate",
         "{\"model\":\"ol\",\"prompt\":\"hi\",\"stream\":false,\"options\":{\"num_predict\":4.0,"
         "\"seed\":42.0,\"top_k\":40.0,\"repeat_last_n\":64.0,\"num_ctx\":2048.0}}"},
        {"Continue autocomplete", "/api/generate",
         "{\"model\":\"ol\",\"prompt\":\"def f(\",\"raw\":true,\"options\":{\"temperature\":0.01,"
         "\"num_predict\":4,\"num_ctx\":32768,\"stop\":[\"\\n\\n\"]},\"keep_alive\":1800,"
         "\"stream\":true}"},
    };
    for (size_t i = 0; i < sizeof asks / sizeof *asks; i++) {
        bool streamed = !strstr(asks[i].body, "\"stream\":false");
        if (!streamed) {
            int st;
            json_object *o = post(asks[i].path, asks[i].body, &st);
            CHECK_MSG(st == 200 && jeq(o, "done", "true"), "%s: %d %s", asks[i].who, st,
                      json_text(o));
            json_object_put(o);
            continue;
        }
        ndjson nd;
        int st = post_ndjson(hsock, asks[i].path, asks[i].body, &nd);
        CHECK_MSG(st == 200 && nd.n >= 1 && jeq(nd.lines[nd.n - 1], "done", "true"),
                  "%s: %d %s", asks[i].who, st, nd.n ? json_text(nd.lines[nd.n - 1]) : "");
        ndjson_free(&nd);
    }
}

/* A negative top_k is off, as ollama (llama.cpp) takes it: the same sampled text as 0. */
static void negative_top_k_is_off(void)
{
    NEED(daemon_up, start_daemon());
    char *text[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) {
        char body[512];
        snprintf(body, sizeof body,
                 "{\"prompt\":\"" USER "\",\"raw\":true,\"stream\":false,\"options\":"
                 "{\"temperature\":1,\"seed\":7,\"num_predict\":8,\"top_k\":%d}}", i ? -1 : 0);
        int st;
        json_object *o = post("/api/generate", body, &st);
        const char *t = httpc_jstr(o, "response");
        CHECK_MSG(st == 200 && t, "top_k %d: %d %s", i ? -1 : 0, st, json_text(o));
        text[i] = strdup(t);
        json_object_put(o);
    }
    CHECK_MSG(strcmp(text[0], text[1]) == 0, "top_k 0 '%s', -1 '%s'", text[0], text[1]);
    free(text[0]);
    free(text[1]);
}

/* num_predict -1, -2 and 0 (no limit for ollama's runner) run until the window is full:
 * done_reason "length". */
static void num_predict_fills_the_window(void)
{
    NEED(daemon_up, start_daemon());
    for (int n = -2; n <= 0; n++) {
        char body[512];
        snprintf(body, sizeof body,
                 "{\"prompt\":\"" USER "\",\"raw\":true,\"stream\":false,"
                 "\"options\":{\"temperature\":0,\"num_predict\":%d,\"num_ctx\":%d,"
                 "\"num_gpu\":1,\"num_thread\":4,\"repeat_last_n\":64,\"repeat_penalty\":1,"
                 "\"presence_penalty\":0,\"frequency_penalty\":0,\"top_k\":40,\"top_p\":0.9,"
                 "\"min_p\":0,\"seed\":1}}", n, WINDOW);
        int st;
        json_object *o = post("/api/generate", body, &st);
        int64_t total = jint(o, "prompt_eval_count") + jint(o, "eval_count");
        /* ended by EOS (stop), or with the window full */
        CHECK_MSG(st == 200 && (jeq(o, "done_reason", "stop") ||
                                (jeq(o, "done_reason", "length") && total >= WINDOW - 1)),
                  "num_predict %d: %d %s", n, st, json_text(o));
        json_object_put(o);
    }
}

/* JSON mode on the trained documentation model: a reply that stops is one object. */
static void format_json_gives_an_object(void)
{
    if (!docs_path)
        SKIP("models/docs-lm-21M-F16.gguf is not in the test data");
    NEED(docs_up, start_docs());
    int stopped = 0;
    for (int seed = 1; seed <= 6; seed++) {
        char body[512];
        bool chat = seed % 2;
        if (chat)
            snprintf(body, sizeof body,
                     "{\"messages\":[{\"role\":\"user\",\"content\":\"Show the settings of "
                     "config.json.\"}],\"format\":\"json\",\"stream\":false,"
                     "\"options\":{\"num_predict\":96,\"seed\":%d}}", seed);
        else
            snprintf(body, sizeof body,
                     "{\"prompt\":\"The response body is a JSON object such as\\n\","
                     "\"raw\":true,\"format\":\"json\",\"stream\":false,"
                     "\"options\":{\"num_predict\":96,\"seed\":%d}}", seed);
        int st;
        json_object *o = httpc_post_json(docs_sock, chat ? "/api/chat" : "/api/generate", body, &st);
        const char *text = o ? piece_of(o, chat) : NULL;
        CHECK_MSG(st == 200 && text, "%d %s", st, json_text(o));
        if (jeq(o, "done_reason", "stop")) {
            json_object *parsed = json_tokener_parse(text);
            CHECK_MSG(json_object_is_type(parsed, json_type_object), "seed %d: '%s'", seed, text);
            json_object_put(parsed);
            stopped++;
        } else {
            CHECK_MSG(jeq(o, "done_reason", "length") && text[strspn(text, " \t\r\n")] == '{',
                      "seed %d: %s", seed, json_text(o));
        }
        json_object_put(o);
    }
    CHECK_MSG(stopped > 0, "no reply of 6 closed its object");
}

/* A Modelfile's Mirostat and typical_p (ollama's options) are taken on the trained
 * documentation model and change a seeded reply; tfs_z is refused but at its off value 1,
 * and out-of-range values are 400. */
static void mirostat_and_typical_are_taken(void)
{
    if (!docs_path)
        SKIP("models/docs-lm-21M-F16.gguf is not in the test data");
    NEED(docs_up, start_docs());
    const char *fmt = "{\"prompt\":\"The daemon reads its settings\",\"raw\":true,"
                      "\"stream\":false,\"options\":{\"num_predict\":32,\"seed\":7,"
                      "\"temperature\":1,\"top_k\":0,\"top_p\":1,\"min_p\":0%s}}";
    char body[512];
    int st;
    snprintf(body, sizeof body, fmt, "");
    json_object *base = httpc_post_json(docs_sock, "/api/generate", body, &st);
    CHECK_MSG(st == 200 && httpc_jstr(base, "response"), "%d %s", st, json_text(base));
    static const char *const options[] = {
        ",\"mirostat\":2,\"mirostat_tau\":3.0,\"mirostat_eta\":0.1",
        ",\"mirostat\":1.0,\"mirostat_tau\":4",
        ",\"typical_p\":0.5",
        ",\"mirostat\":0,\"typical_p\":0.4,\"tfs_z\":1",
    };
    for (size_t i = 0; i < sizeof options / sizeof *options; i++) {
        snprintf(body, sizeof body, fmt, options[i]);
        json_object *o = httpc_post_json(docs_sock, "/api/generate", body, &st);
        CHECK_MSG(st == 200 && httpc_jstr(o, "response") &&
                      !jeq(o, "response", httpc_jstr(base, "response")),
                  "%s: %d %s, without them '%s'", options[i], st, json_text(o),
                  httpc_jstr(base, "response"));
        json_object_put(o);
    }
    json_object_put(base);
    static const struct {
        const char *options, *want;
    } bad[] = {
        {",\"mirostat\":3", "mirostat"},
        {",\"mirostat\":2,\"mirostat_tau\":-1", "mirostat_tau"},
        {",\"mirostat_eta\":\"fast\"", "mirostat_eta"},
        {",\"typical_p\":0", "typical_p"},
        {",\"tfs_z\":0.9", "tfs_z"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(body, sizeof body, fmt, bad[i].options);
        httpc_reply r;
        CHECK(httpc_do(docs_sock, 0, "POST", "/api/generate", NULL, body, &r) == 0);
        CHECK_MSG(r.status == 400 && strstr(r.body, bad[i].want), "%s: %d %s", bad[i].options,
                  r.status, r.body);
        httpc_reply_free(&r);
    }
}

/* Over TCP the ollama routes need the bearer token, as every other route. */
static void tcp_needs_a_token(void)
{
    NEED(daemon_up, start_daemon());
    httpc_reply r;
    CHECK(httpc_do(NULL, port, "GET", "/api/tags", NULL, NULL, &r) == 0);
    CHECK_EQ(r.status, 401);
    json_object *o = json_tokener_parse(r.body), *e;
    CHECK(json_object_object_get_ex(o, "error", &e) && json_object_is_type(e, json_type_string));
    json_object_put(o);
    httpc_reply_free(&r);
    const char *body = "{\"prompt\":\"hi\",\"stream\":false,\"options\":{\"num_predict\":2}}";
    CHECK(httpc_do(NULL, port, "POST", "/api/generate", NULL, body, &r) == 0);
    CHECK_EQ(r.status, 401);
    httpc_reply_free(&r);
    CHECK(httpc_do(NULL, port, "POST", "/api/generate", "Authorization: Bearer wrong-token-000000\r\n",
                   body, &r) == 0);
    CHECK_EQ(r.status, 401);
    httpc_reply_free(&r);
    CHECK(httpc_do(NULL, port, "POST", "/api/generate", "Authorization: Bearer " TOKEN_USER "\r\n",
                   body, &r) == 0);
    CHECK_EQ(r.status, 200);
    httpc_reply_free(&r);
    CHECK(httpc_do(NULL, port, "GET", "/api/tags", "Authorization: Bearer " TOKEN_USER "\r\n", NULL,
                   &r) == 0);
    CHECK_EQ(r.status, 200);
    httpc_reply_free(&r);
}

/* CORS as on the OpenAI routes (browser front ends speak ollama's API too). */
static void cors_and_metrics(void)
{
    NEED(daemon_up, start_daemon());
    httpc_reply r;
    CHECK(httpc_do(hsock, 0, "OPTIONS", "/api/chat",
                   "Origin: http://localhost:3000\r\nAccess-Control-Request-Headers: content-type\r\n",
                   NULL, &r) == 0);
    CHECK_EQ(r.status, 200);
    CHECK(strstr(r.head, "Access-Control-Allow-Origin: *"));
    httpc_reply_free(&r);
    CHECK(httpc_do(hsock, 0, "GET", "/api/tags", "Origin: http://localhost:3000\r\n", NULL, &r) == 0);
    CHECK_EQ(r.status, 200);
    CHECK(strstr(r.head, "Access-Control-Allow-Origin: *"));
    httpc_reply_free(&r);
    CHECK(httpc_do(hsock, 0, "GET", "/metrics", NULL, NULL, &r) == 0);
    CHECK_EQ(r.status, 200);
    CHECK_MSG(strstr(r.body, "route=\"/api/generate\",code=\"200\"") &&
                  strstr(r.body, "route=\"/api/tags\",code=\"200\""),
              "%s", r.body);
    httpc_reply_free(&r);
}

/* A client that leaves mid-generation cancels it, streamed (ollama's default) or not. */
static void disconnect_cancels_generation(void)
{
    NEED(daemon_up, start_daemon());
    for (int streamed = 1; streamed >= 0; streamed--) {
        int fd = httpc_connect(hsock, 0);
        CHECK(fd >= 0);
        char body[256];
        snprintf(body, sizeof body,
                 "{\"model\":\"slow\",\"prompt\":\"go on\",\"raw\":true,\"stream\":%s,"
                 "\"options\":{\"temperature\":0,\"num_predict\":-1}}",
                 streamed ? "true" : "false");
        CHECK(httpc_send(fd, "POST", "/api/generate", NULL, body, strlen(body)) == 0);
        if (streamed) {
            char buf[512];
            CHECK(recv(fd, buf, sizeof buf, 0) > 0); /* the reply has begun */
        } else {
            usleep(50000);
        }
        close(fd);
        double deadline = proc_now() + 30;
        int want = streamed ? 1 : 2, seen = 0;
        while (proc_now() < deadline) {
            FILE *f = fopen(daemon_.log, "r");
            char line[1024];
            seen = 0;
            while (f && fgets(line, sizeof line, f))
                seen += strstr(line, "kind=complete") && strstr(line, "outcome=STOP_CANCELLED");
            if (f)
                fclose(f);
            if (seen >= want)
                break;
            usleep(20000);
        }
        CHECK_MSG(seen >= want, "no cancelled completion in the log (streamed %d)", streamed);
    }
}

static void malformed_bodies_never_crash(void)
{
    NEED(daemon_up, start_daemon());
    char deep[2100];
    memset(deep, '[', 2000);
    deep[2000] = '\0';
    const char *bodies[] = {
        deep, "null", "\"str\"", "12", "{}", "{\"prompt\":\"\xff\xfe\"}",
        "{\"prompt\":\"a\\u0000b\",\"options\":{\"num_predict\":1}}",
        "{\"prompt\":{\"nested\":true}}", "{\"messages\":\"hi\"}", "{\"messages\":[1,2]}",
        "{\"messages\":[null]}", "{\"messages\":[{\"role\":null,\"content\":null}]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":null}]}]}",
        "{\"prompt\":\"x\",\"options\":{\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\"]}}",
        "{\"prompt\":\"x\",\"options\":{\"stop\":\"\"}}", "{\"prompt\":\"x\",\"options\":null}",
        "{\"prompt\":\"x\",\"options\":{\"num_predict\":1e999}}",
        "{\"prompt\":\"x\",\"options\":{\"seed\":-1,\"num_predict\":1}}",
        "{\"prompt\":\"x\",\"options\":{\"top_k\":9223372036854775807,\"num_predict\":1}}",
        "{\"input\":null}", "{\"input\":[\"\"]}", "{\"prompt\":null}", "{\"model\":null}",
        "{\"model\":\"\"}", "{\"name\":5}", "{\"model\":\"ol:\"}", "{\"images\":null}",
        "{\"format\":null,\"prompt\":\"x\",\"options\":{\"num_predict\":1}}",
    };
    const char *paths[] = {"/api/generate", "/api/chat", "/api/embed", "/api/embeddings",
                           "/api/show"};
    for (size_t p = 0; p < sizeof paths / sizeof *paths; p++)
        for (size_t i = 0; i < sizeof bodies / sizeof *bodies; i++) {
            httpc_reply r;
            CHECK(httpc_do(hsock, 0, "POST", paths[p], NULL, bodies[i], &r) == 0);
            CHECK_MSG(r.status >= 200 && r.status < 500, "%s %s: %d %s", paths[p], bodies[i],
                      r.status, r.body);
            httpc_reply_free(&r);
        }
}

/* ---- random bodies (test_http.c's pattern, with ollama's fields) ---- */

/* field names of the routes' requests, and strings of their values */
static const char *const body_keys[] = {
    "model", "name", "prompt", "system", "raw", "format", "options", "stream", "keep_alive",
    "context", "images", "suffix", "template", "messages", "role", "content", "tools",
    "tool_calls", "input", "truncate", "dimensions", "temperature", "top_k", "top_p", "min_p",
    "num_predict", "stop", "seed", "repeat_penalty", "repeat_last_n", "presence_penalty",
    "frequency_penalty", "num_ctx", "mirostat", "typical_p", "mirostat_tau", "mirostat_eta",
    "tfs_z"};
static const char *const body_words[] = {
    "", "user", "system", "assistant", "tool", "json", "ol", "ol:latest", "slow", "5m",
    "\xff\xfe", "a\\u0000b"};
static randjson body_gen = {0x9e3779b97f4a7c15u, body_keys, sizeof body_keys / sizeof *body_keys,
                            body_words, sizeof body_words / sizeof *body_words};

/* Each route's valid body changed at random (fields of the body, of its options or of
 * its first message set to any value or removed) or a random JSON value: the answer is
 * below 500 (503 only while busy), and the daemon stays up. */
static void random_bodies_never_crash(void)
{
    NEED(daemon_up, start_daemon());
    test_random_seed(&body_gen.rng);
    static const char *const paths[] = {"/api/generate", "/api/chat", "/api/embed",
                                        "/api/embeddings", "/api/show"};
    static const char *const valid[] = {
        "{\"model\":\"ol\",\"prompt\":\"Hi\",\"options\":{\"num_predict\":2}}",
        "{\"model\":\"ol\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
        "\"options\":{\"num_predict\":2}}",
        "{\"model\":\"ol\",\"input\":\"Hi\"}", "{\"model\":\"ol\",\"prompt\":\"Hi\"}",
        "{\"model\":\"ol\"}"};
    int ok = 0, n = 500;
    for (int i = 0; i < n; i++) {
        int route = randjson_pick(&body_gen, 5);
        json_object *body = randjson_pick(&body_gen, 8) ? json_tokener_parse(valid[route])
                                                        : randjson_value(&body_gen, 1);
        for (int k = randjson_pick(&body_gen, 4);
             k > 0 && json_object_is_type(body, json_type_object); k--) {
            json_object *into = body, *inner;
            int where = randjson_pick(&body_gen, 3);
            if (where == 1 && json_object_object_get_ex(body, "messages", &inner) &&
                json_object_is_type(inner, json_type_array) &&
                json_object_is_type(json_object_array_get_idx(inner, 0), json_type_object))
                into = json_object_array_get_idx(inner, 0);
            if (where == 2 && json_object_object_get_ex(body, "options", &inner) &&
                json_object_is_type(inner, json_type_object))
                into = inner;
            if (randjson_pick(&body_gen, 4) == 0)
                json_object_object_del(into, randjson_key(&body_gen));
            else
                json_object_object_add(into, randjson_key(&body_gen), randjson_value(&body_gen, 1));
        }
        /* bounded generations keep the test short: a small num_predict, or none */
        json_object *opts, *np;
        if (json_object_is_type(body, json_type_object) &&
            json_object_object_get_ex(body, "options", &opts) &&
            json_object_is_type(opts, json_type_object) &&
            json_object_object_get_ex(opts, "num_predict", &np) &&
            json_object_is_type(np, json_type_int) &&
            (json_object_get_int64(np) > 8 || json_object_get_int64(np) <= 0))
            json_object_object_add(opts, "num_predict", json_object_new_int(8));
        const char *text = body ? json_object_to_json_string(body) : "null";
        httpc_reply r;
        int rc = httpc_do(hsock, 0, "POST", paths[route], NULL, text, &r);
        CHECK_MSG(rc == 0, "%s %s: no answer", paths[route], text);
        CHECK_MSG(r.status >= 200 && (r.status < 500 || r.status == 503), "%s %s: %d %s",
                  paths[route], text, r.status, r.body);
        /* a streamed reply that failed after its start ends with an error line, never
         * with a 5xx: it must still be NDJSON */
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

/* SIGTERM ends each daemon with status 0: under the sanitizers, nothing leaked or went
 * wrong in it (its log says what did). */
static void daemons_exit_cleanly(void)
{
    llmsd_proc *procs[] = {&daemon_, &docs_daemon};
    int *ups[] = {&daemon_up, &docs_up};
    for (size_t i = 0; i < 2; i++) {
        if (*ups[i] != 1)
            continue;
        *ups[i] = 0;
        int rc = proc_stop(procs[i], SIGTERM);
        if (rc != 0)
            proc_print_log(procs[i]);
        CHECK_EQ(rc, 0);
    }
}

int main(int argc, char **argv)
{
    (void)argc;
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    modelgen_params mp = {
        .arch = "llama", .dim = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 128,
        .n_ctx = WINDOW, .type = QTYPE_F32, .seed = 9, .n_vocab = 300, .n_threads = 1,
    };
    proc_generate_model(model_path, sizeof model_path, "ol.gguf", &mp);
    modelgen_params slow = mp;
    slow.dim = 256;
    slow.n_layer = 4;
    slow.n_head = 8;
    slow.n_head_kv = 4;
    slow.n_ff = 768;
    slow.type = QTYPE_Q8_0;
    proc_generate_model(slow_path, sizeof slow_path, "ol-slow.gguf", &slow);
    const char *p = test_data_path("models/docs-lm-21M-F16.gguf");
    docs_path = p ? strdup(p) : NULL;
    RUN(version_tags_ps_show);
    RUN(generate_matches_openai);
    RUN(stop_option_stops);
    RUN(chat_matches_openai);
    RUN(empty_prompt_loads);
    RUN(embed_matches_openai);
    RUN(errors_are_ollama_shaped);
    RUN(client_defaults_are_served);
    RUN(negative_top_k_is_off);
    RUN(num_predict_fills_the_window);
    RUN(format_json_gives_an_object);
    RUN(mirostat_and_typical_are_taken);
    RUN(tcp_needs_a_token);
    RUN(cors_and_metrics);
    RUN(disconnect_cancels_generation);
    RUN(malformed_bodies_never_crash);
    RUN(random_bodies_never_crash);
    RUN(daemons_exit_cleanly);
    free((char *)docs_path);
    return test_finish();
}
