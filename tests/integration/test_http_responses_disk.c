/*
 * Stored responses across restarts (responses_store = disk, the default; storage/
 * responses.h, daemon/respload.h) end to end: a real llmsd of this build serving
 * toolmodel.h's random-weight chatml model, stopped and started again on the same state
 * directory. After a restart GET gives what it gave before, byte for byte, and so does
 * input_items; previous_response_id continues a response stored before it into the same
 * reply as before it; another uid (a token of its own on TCP) still finds nothing of this
 * one's, and this one nothing of the other's; what DELETE removed, before or after a
 * restart, stays gone. A stream whose client left is stored incomplete, one that failed
 * after it began failed, one the shutdown cut incomplete, and all come back so. A record damaged on disk is skipped with
 * a warning (the daemon starts, the other responses are there); responses_store = memory
 * keeps none across a restart and deletes those on disk.
 */
#include <json-c/json.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/integration/httpc.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/integration/toolmodel.h"
#include "tests/support/test.h"

/* Bearer tokens of the daemon's TCP gateway: the test's own uid, and another uid. */
#define TOKEN_MINE "disk-token-mine-0123456789"
#define TOKEN_OTHER "disk-token-other-0123456789"

static char llmsd_path[1024], model_path[1024], hsock[700], tokens[700];
static llmsd_proc d;
static int port;

/* Starts (or starts again) the daemon of state name with more settings (or NULL). */
static int start(const char *name, const char *more)
{
    char extra[2048];
    proc_fmt(hsock, sizeof hsock, "%s/%s-h.sock", test_tmpdir(), name);
    port = httpc_free_port();
    proc_fmt(extra, sizeof extra, "http_socket = %s\nn_ctx = 2048\nhttp_listen = "
             "127.0.0.1:%d\nhttp_tokens_file = %s\n%s", hsock, port, tokens, more ? more : "");
    return proc_start(&d, llmsd_path, name, model_path, extra);
}

/* Stops the daemon cleanly and starts it again on the same state. */
static int restart(const char *name, const char *more)
{
    int rc = proc_stop(&d, SIGTERM);
    if (rc != 0) {
        proc_print_log(&d);
        return -1;
    }
    return start(name, more);
}

#define NEED()                                                                 \
    do {                                                                       \
        if (!llmsd_path[0])                                                    \
            SKIP("llmsd is not built in this tree");                           \
        if (!model_path[0])                                                    \
            SKIP("no model could be generated");                               \
        if (!tokens[0])                                                        \
            SKIP("the tokens file could not be written");                      \
    } while (0)

/* A request as token's uid (NULL: on the Unix socket, the test's own uid); the reply's
 * JSON (NULL when none), its status in *status; with text, its body too (free()). */
static json_object *call(const char *token, const char *method, const char *path,
                         const char *body, int *status, char **text)
{
    httpc_reply r;
    char auth[128];
    *status = 0;
    snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", token ? token : "");
    if (httpc_do(token ? NULL : hsock, token ? port : 0, method, path, token ? auth : NULL,
                 body, &r))
        return NULL;
    *status = r.status;
    json_object *o = r.body ? json_tokener_parse(r.body) : NULL;
    if (text)
        *text = r.body ? strdup(r.body) : NULL;
    httpc_reply_free(&r);
    return o;
}

static const char *json_text(json_object *o)
{
    return o ? json_object_to_json_string(o) : "(none)";
}

static bool str_is(json_object *o, const char *path, const char *want)
{
    const char *s = httpc_jstr(o, path);
    return s && !strcmp(s, want);
}

/* POSTs one greedy turn of input (a JSON string) after prev (NULL: none) as token's uid;
 * the response, or NULL after a failed CHECK. */
static json_object *turn(const char *token, const char *prev, const char *input)
{
    char body[1024], prevf[160] = "";
    if (prev)
        snprintf(prevf, sizeof prevf, ",\"previous_response_id\":\"%s\"", prev);
    snprintf(body, sizeof body, "{\"input\":%s,\"temperature\":0,\"max_output_tokens\":12%s}",
             input, prevf);
    int st;
    json_object *o = call(token, "POST", "/v1/responses", body, &st, NULL);
    if (st != 200 || !json_object_get_boolean(httpc_jget(o, "store"))) {
        test_fail(__FILE__, __LINE__, "POST %s: %d %s", body, st, json_text(o));
        json_object_put(o);
        return NULL;
    }
    return o;
}

/* GET path as token's uid: the status, the body into *text (free()). */
static int get_text(const char *token, const char *path, char **text)
{
    int st;
    json_object_put(call(token, "GET", path, NULL, &st, text));
    return st;
}

/* The text of a response's message item, "" when none. */
static const char *message_text(json_object *resp)
{
    json_object *out = httpc_jget(resp, "output");
    for (size_t i = 0; out && i < json_object_array_length(out); i++) {
        json_object *item = json_object_array_get_idx(out, i);
        if (str_is(item, "type", "message"))
            return httpc_jstr(item, "content.0.text") ? httpc_jstr(item, "content.0.text") : "";
    }
    return "";
}

static void responses_survive_restarts(void)
{
    NEED();
    CHECK(start("disk", NULL) == 0);
    json_object *r1 = turn(NULL, NULL, "\"What is a model?\"");
    CHECK(r1);
    const char *id1 = httpc_jstr(r1, "id");
    json_object *r2 = turn(NULL, id1, "\"And a token?\"");
    CHECK(r2);
    const char *id2 = httpc_jstr(r2, "id");
    json_object *ro = turn(TOKEN_OTHER, NULL, "\"Whose is this?\"");
    CHECK(ro);
    const char *ido = httpc_jstr(ro, "id");
    json_object *rd = turn(TOKEN_MINE, NULL, "\"Delete me later.\"");
    json_object *rg = turn(NULL, NULL, "\"Delete me now.\"");
    CHECK(rd && rg);
    char path[256], *before[4] = {NULL}, *after = NULL;
    int st;
    /* what GET and input_items give before the restart */
    static const char *const suffix[2] = {"", "/input_items?order=asc&limit=100"};
    const char *ids[2] = {id1, id2};
    for (int k = 0; k < 4; k++) {
        snprintf(path, sizeof path, "/v1/responses/%s%s", ids[k / 2], suffix[k % 2]);
        CHECK_EQ(get_text(NULL, path, &before[k]), 200);
    }
    snprintf(path, sizeof path, "/v1/responses/%s", httpc_jstr(rg, "id"));
    json_object_put(call(NULL, "DELETE", path, NULL, &st, NULL));
    CHECK_EQ(st, 200);

    CHECK(restart("disk", NULL) == 0);
    for (int k = 0; k < 4; k++) {
        snprintf(path, sizeof path, "/v1/responses/%s%s", ids[k / 2], suffix[k % 2]);
        CHECK_EQ(get_text(NULL, path, &after), 200);
        CHECK_MSG(after && !strcmp(after, before[k]), "%s: before %s, after %s", path,
                  before[k], after ? after : "");
        free(after);
        after = NULL;
    }
    /* deleted before the restart: still gone */
    snprintf(path, sizeof path, "/v1/responses/%s", httpc_jstr(rg, "id"));
    CHECK_EQ(get_text(NULL, path, &after), 404);
    free(after);
    /* each uid its own, after the restart as before it */
    snprintf(path, sizeof path, "/v1/responses/%s", id1);
    CHECK_EQ(get_text(TOKEN_OTHER, path, &after), 404);
    free(after);
    snprintf(path, sizeof path, "/v1/responses/%s", ido);
    CHECK_EQ(get_text(TOKEN_MINE, path, &after), 404);
    free(after);
    json_object *g = call(TOKEN_OTHER, "GET", path, NULL, &st, NULL);
    CHECK_MSG(st == 200 && json_object_equal(g, ro), "%d %s", st, json_text(g));
    json_object_put(g);
    char body[256];
    snprintf(body, sizeof body, "{\"input\":\"x\",\"previous_response_id\":\"%s\"}", ido);
    json_object_put(call(TOKEN_MINE, "POST", "/v1/responses", body, &st, NULL));
    CHECK_EQ(st, 404);
    /* previous_response_id continues r1 into the reply it had before the restart */
    json_object *r2b = turn(NULL, id1, "\"And a token?\"");
    CHECK(r2b);
    CHECK_MSG(!strcmp(message_text(r2b), message_text(r2)), "before '%s', after '%s'",
              message_text(r2), message_text(r2b));
    CHECK_EQ(atoi(httpc_jstr(r2b, "usage.input_tokens")),
             atoi(httpc_jstr(r2, "usage.input_tokens")));
    CHECK(str_is(r2b, "previous_response_id", id1));
    json_object *r3 = turn(NULL, id2, "\"And a context?\"");
    CHECK(r3);
    /* DELETE after the restart removes it from the disk too */
    snprintf(path, sizeof path, "/v1/responses/%s", httpc_jstr(rd, "id"));
    json_object_put(call(TOKEN_MINE, "DELETE", path, NULL, &st, NULL));
    CHECK_EQ(st, 200);

    CHECK(restart("disk", NULL) == 0);
    CHECK_EQ(get_text(TOKEN_MINE, path, &after), 404);
    free(after);
    snprintf(path, sizeof path, "/v1/responses/%s", httpc_jstr(r3, "id"));
    CHECK_EQ(get_text(NULL, path, &after), 200);
    free(after);
    snprintf(path, sizeof path, "/v1/responses/%s", id1);
    CHECK_EQ(get_text(NULL, path, &after), 200);
    CHECK_MSG(after && !strcmp(after, before[0]), "%s", after ? after : "");
    free(after);
    for (int k = 0; k < 4; k++)
        free(before[k]);
    json_object_put(r1);
    json_object_put(r2);
    json_object_put(r2b);
    json_object_put(r3);
    json_object_put(ro);
    json_object_put(rd);
    json_object_put(rg);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

/* GETs id (as the Unix socket's uid) until it is there, up to 20 s: the closed stream is
 * stored once the loop has seen the connection go. */
static json_object *get_when_there(const char *id)
{
    char path[160];
    snprintf(path, sizeof path, "/v1/responses/%s", id);
    for (int i = 0; i < 400; i++) {
        int st;
        json_object *o = call(NULL, "GET", path, NULL, &st, NULL);
        if (st == 200)
            return o;
        json_object_put(o);
        usleep(50000);
    }
    return NULL;
}

/* Streams a long greedy reply and reads until response.created came: the connection,
 * whose next bytes are the events after it, and the response's id into id (cap bytes);
 * -1 when that failed. */
static int open_stream(char *id, size_t cap)
{
    static const char body[] = "{\"input\":\"Tell me everything.\",\"stream\":true,"
                               "\"temperature\":0,\"max_output_tokens\":1900,"
                               "\"ignore_eos\":true}";
    int fd = httpc_connect(hsock, 0);
    if (fd < 0 || httpc_send(fd, "POST", "/v1/responses", NULL, body, strlen(body))) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    char buf[8192];
    size_t len = 0;
    const char *at = NULL;
    while (!at && len + 1 < sizeof buf) {
        ssize_t got = recv(fd, buf + len, sizeof buf - len - 1, 0);
        if (got <= 0)
            break;
        len += (size_t)got;
        buf[len] = '\0';
        const char *ev = strstr(buf, "event: response.created");
        at = ev ? strstr(ev, "\"id\":\"resp_") : NULL;
        if (at && !strchr(at + 6, '"'))
            at = NULL;
    }
    if (!at) {
        close(fd);
        return -1;
    }
    at += 6;
    snprintf(id, cap, "%.*s", (int)(strchr(at, '"') - at), at);
    return fd;
}

static void abandoned_and_failed_streams_are_kept(void)
{
    NEED();
    CHECK(start("streams", NULL) == 0);
    char id[128];
    int fd = open_stream(id, sizeof id);
    CHECK(fd >= 0);
    close(fd);
    json_object *gone = get_when_there(id);
    CHECK_MSG(gone, "%s never stored", id);
    CHECK_MSG(str_is(gone, "status", "incomplete") &&
                  str_is(gone, "incomplete_details.reason", "cancelled") &&
                  json_object_get_boolean(httpc_jget(gone, "store")) &&
                  !httpc_jget(gone, "error"), "%s", json_text(gone));
    json_object *out = httpc_jget(gone, "output");
    for (size_t i = 0; out && i < json_object_array_length(out); i++)
        CHECK_MSG(str_is(json_object_array_get_idx(out, i), "status", "incomplete"), "%s",
                  json_text(gone));
    /* JSON mode finds no token of the model's ASCII vocabulary for the schema's "é"
     * after the reply's first tokens: the stream fails after it began */
    static const char failing[] =
        "{\"input\":\"Say it.\",\"max_output_tokens\":50,\"temperature\":0,\"stream\":true,"
        "\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"e\",\"schema\":{\"type\":"
        "\"object\",\"properties\":{\"a\":{\"enum\":[\"\\u00e9\"]}},\"required\":[\"a\"]}}}}";
    httpc_reply r;
    CHECK(httpc_do(hsock, 0, "POST", "/v1/responses", NULL, failing, &r) == 0);
    const char *ev = strstr(r.body, "event: response.failed\ndata: ");
    json_object *last = ev ? json_tokener_parse(ev + strlen("event: response.failed\ndata: "))
                           : NULL;
    json_object *failed = json_object_get(httpc_jget(last, "response"));
    json_object_put(last);
    httpc_reply_free(&r);
    CHECK_MSG(str_is(failed, "status", "failed") && str_is(failed, "error.code", "server_error") &&
                  json_object_get_boolean(httpc_jget(failed, "store")), "%s", json_text(failed));
    char path[160];
    snprintf(path, sizeof path, "/v1/responses/%s", httpc_jstr(failed, "id"));
    int st;
    json_object *g = call(NULL, "GET", path, NULL, &st, NULL);
    CHECK_MSG(st == 200 && json_object_equal(g, failed), "%d %s, streamed %s", st,
              json_text(g), json_text(failed));
    json_object_put(g);
    /* both as they were after a restart */
    CHECK(restart("streams", NULL) == 0);
    g = call(NULL, "GET", path, NULL, &st, NULL);
    CHECK_MSG(st == 200 && json_object_equal(g, failed), "%d %s", st, json_text(g));
    json_object_put(g);
    snprintf(path, sizeof path, "/v1/responses/%s", id);
    g = call(NULL, "GET", path, NULL, &st, NULL);
    CHECK_MSG(st == 200 && json_object_equal(g, gone), "%d %s", st, json_text(g));
    json_object_put(g);
    json_object_put(gone);
    json_object_put(failed);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

/* A stream the daemon's shutdown cuts ends incomplete ("shutdown"), and is stored for the
 * next start, whether the worker or, once it left, sched_free writes it. */
static void stream_cut_by_shutdown_is_kept(void)
{
    NEED();
    CHECK(start("shutdown", NULL) == 0);
    char id[128];
    int fd = open_stream(id, sizeof id);
    CHECK(fd >= 0);
    kill(d.pid, SIGTERM);
    size_t cap = 1 << 20, len = 0;
    char *buf = malloc(cap);
    ssize_t got;
    while (buf && len + 1 < cap && (got = recv(fd, buf + len, cap - len - 1, 0)) > 0)
        len += (size_t)got;
    close(fd);
    if (buf)
        buf[len] = '\0';
    bool incomplete = buf && strstr(buf, "event: response.incomplete");
    CHECK_MSG(incomplete, "the stream ended: %.300s",
              buf && len > 300 ? buf + len - 300 : buf ? buf : "");
    free(buf);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
    CHECK(start("shutdown", NULL) == 0);
    char path[160];
    snprintf(path, sizeof path, "/v1/responses/%s", id);
    int st;
    json_object *g = call(NULL, "GET", path, NULL, &st, NULL);
    CHECK_MSG(st == 200 && str_is(g, "status", "incomplete") &&
                  str_is(g, "incomplete_details.reason", "shutdown"), "%d %s", st, json_text(g));
    json_object_put(g);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

/* Runs sql on the stopped daemon's catalog. */
static int raw_exec(const char *sql)
{
    char path[700];
    proc_fmt(path, sizeof path, "%s/state/llmsd.db", d.dir);
    sqlite3 *db = NULL;
    int rc = sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(db, sql, NULL, NULL, NULL);
    sqlite3_close(db);
    return rc == SQLITE_OK ? 0 : -1;
}

/* Whether the daemon's log holds text. */
static bool log_has(const char *text)
{
    FILE *f = fopen(d.log, "r");
    char line[1024];
    bool found = false;
    while (f && !found && fgets(line, sizeof line, f))
        found = strstr(line, text) != NULL;
    if (f)
        fclose(f);
    return found;
}

static void damaged_record_is_skipped(void)
{
    NEED();
    CHECK(start("damaged", NULL) == 0);
    json_object *a = turn(NULL, NULL, "\"First.\""), *b = turn(NULL, NULL, "\"Second.\"");
    CHECK(a && b);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
    char sql[256];
    snprintf(sql, sizeof sql, "UPDATE responses SET response = CAST(replace(CAST(response AS "
                              "TEXT), 'response', 'respXnse') AS BLOB) WHERE id = '%s'",
             httpc_jstr(a, "id"));
    CHECK_EQ(raw_exec(sql), 0);
    CHECK(start("damaged", NULL) == 0);
    char path[160], *text = NULL;
    snprintf(path, sizeof path, "/v1/responses/%s", httpc_jstr(a, "id"));
    CHECK_EQ(get_text(NULL, path, &text), 404);
    free(text);
    snprintf(path, sizeof path, "/v1/responses/%s", httpc_jstr(b, "id"));
    CHECK_EQ(get_text(NULL, path, &text), 200);
    free(text);
    char want[160];
    snprintf(want, sizeof want, "stored response %s", httpc_jstr(a, "id"));
    CHECK_MSG(log_has(want) && log_has("checksum"), "no warning naming %s", want);
    json_object_put(a);
    json_object_put(b);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

static void memory_mode_keeps_none(void)
{
    NEED();
    CHECK(start("memory", NULL) == 0);
    json_object *a = turn(NULL, NULL, "\"Kept on disk.\"");
    CHECK(a);
    char path[160], *text = NULL;
    snprintf(path, sizeof path, "/v1/responses/%s", httpc_jstr(a, "id"));
    CHECK(restart("memory", "responses_store = memory\n") == 0);
    CHECK_EQ(get_text(NULL, path, &text), 404);
    free(text);
    json_object *b = turn(NULL, NULL, "\"In memory only.\"");
    CHECK(b);
    /* back to disk: what memory mode deleted and what it never wrote are not there */
    CHECK(restart("memory", NULL) == 0);
    CHECK_EQ(get_text(NULL, path, &text), 404);
    free(text);
    snprintf(path, sizeof path, "/v1/responses/%s", httpc_jstr(b, "id"));
    CHECK_EQ(get_text(NULL, path, &text), 404);
    free(text);
    json_object_put(a);
    json_object_put(b);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

/* The tokens file: the test's own uid, and another (its own plus one); tokens stays
 * empty when it cannot be written. */
static void write_tokens(void)
{
    char path[700];
    proc_fmt(path, sizeof path, "%s/disk-tokens", test_tmpdir());
    FILE *f = fopen(path, "w");
    if (!f)
        return;
    fprintf(f, "%s %u mine\n%s %u other\n", TOKEN_MINE, (unsigned)getuid(), TOKEN_OTHER,
            (unsigned)getuid() + 1);
    if (fclose(f) == 0 && chmod(path, 0600) == 0)
        snprintf(tokens, sizeof tokens, "%s", path);
}

int main(int argc, char **argv)
{
    (void)argc;
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    write_tokens();
    toolmodel_generate("respdisk", "<tool_call>", "{{ '<|im_start|>' }}", NULL, NULL, 0,
                       model_path, sizeof model_path);
    RUN(responses_survive_restarts);
    RUN(abandoned_and_failed_streams_are_kept);
    RUN(stream_cut_by_shutdown_is_kept);
    RUN(damaged_record_is_skipped);
    RUN(memory_mode_keeps_none);
    return test_finish();
}
