/*
 * OpenAI's "n" through the HTTP gateway: several choices of one prompt from a real
 * llmsd, on /v1/chat/completions and /v1/completions, whole and streamed. Choice i of a
 * request with a seed is the single answer of seed + i (so the whole reply is
 * reproducible and its choices differ at temperature 1), greedy choices are equal,
 * usage sums the choices' tokens and counts the prompt once; a stream interleaves the
 * choices by index, ends each with its finish_reason and the whole with one usage event
 * and one [DONE]. n = 0, n beyond the bound, n with a context, with RAG, beyond the
 * app's queue limit are refused 400; a choice refused by admission fails the whole
 * request; a client leaving mid-stream cancels every choice and leaves the daemon
 * healthy (and, under ASan, free of leaks at its exit).
 */
#include <json-c/json.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"
#include "tests/integration/httpc.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/support/test.h"

#define N_CHOICES 3
#define N_MAX 16
#define SLOW_QUEUE 4 /* the slow daemon's max_queued_per_app */

static char llmsd_path[1024];
static char model_path[1024], slow_model_path[1024];
static llmsd_proc daemon_, slow_daemon;
static int daemon_up, slow_up;
static char hsock[700], slow_hsock[700];

#define NEED(up, start)                                                        \
    do {                                                                       \
        if (!llmsd_path[0])                                                    \
            SKIP("llmsd is not built in this tree");                           \
        if (!model_path[0])                                                    \
            SKIP("no model could be generated");                               \
        if (!(up))                                                             \
            (up) = (start) == 0 ? 1 : -1;                                      \
        CHECK_MSG((up) == 1, "llmsd did not start");                           \
    } while (0)

static int start_daemon(void)
{
    char extra[1024];
    proc_fmt(hsock, sizeof hsock, "%s/n-h.sock", test_tmpdir());
    proc_fmt(extra, sizeof extra, "http_socket = %s\nmax_queued_per_app = %d\n", hsock, N_MAX);
    return proc_start(&daemon_, llmsd_path, "n", model_path, extra);
}

static int start_slow(void)
{
    char extra[1024];
    proc_fmt(slow_hsock, sizeof slow_hsock, "%s/n-slow-h.sock", test_tmpdir());
    proc_fmt(extra, sizeof extra, "http_socket = %s\nn_ctx = 4096\nmax_queued_per_app = %d\n",
             slow_hsock, SLOW_QUEUE);
    return proc_start(&slow_daemon, llmsd_path, "n-slow", slow_model_path, extra);
}

static json_object *post(const char *path, const char *body, int *status)
{
    return httpc_post_json(hsock, path, body, status);
}

/* The text of choice i of a whole reply. */
static const char *choice_text(json_object *o, bool chat, int i)
{
    char key[64];
    snprintf(key, sizeof key, chat ? "choices.%d.message.content" : "choices.%d.text", i);
    return httpc_jstr(o, key);
}

static int choice_int(json_object *o, int i, const char *field)
{
    char key[64];
    snprintf(key, sizeof key, "choices.%d.%s", i, field);
    const char *s = httpc_jstr(o, key);
    return s ? atoi(s) : -1;
}

/* by "chat": 0 a completion, 1 a chat */
static const char *const routes[2] = {"/v1/completions", "/v1/chat/completions"};

/* A request body of route chat (1) or completion (0): its prompt, then fields. */
static void body_of(char *out, size_t cap, bool chat, const char *fields)
{
    if (chat)
        snprintf(out, cap, "{\"messages\":[{\"role\":\"user\",\"content\":\"tell me a story\"}],%s}",
                 fields);
    else
        snprintf(out, cap, "{\"prompt\":\"once upon a time\",%s}", fields);
}

/* n = 3 at temperature 1 with a seed: three choices indexed 0..2 whose texts differ,
 * each equal to the single answer of seed + index; usage sums their tokens and counts
 * the prompt once; the same request again gives the same reply. */
static void seeded_choices_are_the_seeds_answers(void)
{
    NEED(daemon_up, start_daemon());
    for (int chat = 1; chat >= 0; chat--) {
        char body[1024];
        body_of(body, sizeof body, chat, "\"n\":3,\"temperature\":1,\"seed\":42,\"max_tokens\":12");
        int st;
        json_object *o = post(routes[chat], body, &st);
        CHECK_MSG(o && st == 200, "%s: status %d: %s", routes[chat], st,
                  o ? httpc_jstr(o, "error.message") : "");
        CHECK_EQ(json_object_array_length(json_object_object_get(o, "choices")), N_CHOICES);
        int sum = 0, prompt = -1;
        for (int i = 0; i < N_CHOICES; i++) {
            CHECK_EQ(choice_int(o, i, "index"), i);
            CHECK(choice_text(o, chat, i));
            for (int j = 0; j < i; j++)
                CHECK_MSG(strcmp(choice_text(o, chat, i), choice_text(o, chat, j)) != 0,
                          "%s: choices %d and %d are both '%s'", routes[chat], i, j,
                          choice_text(o, chat, i));
            char one[1024], fields[128];
            snprintf(fields, sizeof fields, "\"temperature\":1,\"seed\":%d,\"max_tokens\":12",
                     42 + i);
            body_of(one, sizeof one, chat, fields);
            json_object *single = post(routes[chat], one, &st);
            CHECK(single && st == 200);
            CHECK_MSG(strcmp(choice_text(o, chat, i), choice_text(single, chat, 0)) == 0,
                      "%s: choice %d '%s', seed %d alone '%s'", routes[chat], i,
                      choice_text(o, chat, i), 42 + i, choice_text(single, chat, 0));
            char key[64];
            snprintf(key, sizeof key, "choices.%d.finish_reason", i);
            CHECK(httpc_jstr(o, key) && (strcmp(httpc_jstr(o, key), "stop") == 0 ||
                                         strcmp(httpc_jstr(o, key), "length") == 0));
            sum += atoi(httpc_jstr(single, "usage.completion_tokens"));
            prompt = atoi(httpc_jstr(single, "usage.prompt_tokens"));
            json_object_put(single);
        }
        CHECK_EQ(atoi(httpc_jstr(o, "usage.completion_tokens")), sum);
        CHECK_EQ(atoi(httpc_jstr(o, "usage.prompt_tokens")), prompt);
        CHECK_EQ(atoi(httpc_jstr(o, "usage.total_tokens")), prompt + sum);
        json_object *again = post(routes[chat], body, &st);
        CHECK(again && st == 200);
        for (int i = 0; i < N_CHOICES; i++)
            CHECK(strcmp(choice_text(o, chat, i), choice_text(again, chat, i)) == 0);
        json_object_put(again);
        json_object_put(o);
    }
}

/* Greedy choices are equal (as OpenAI's are), each with its finish_reason and its own
 * logprobs when asked for. */
static void greedy_choices_are_equal(void)
{
    NEED(daemon_up, start_daemon());
    for (int chat = 1; chat >= 0; chat--) {
        char body[1024];
        body_of(body, sizeof body, chat,
                chat ? "\"n\":3,\"temperature\":0,\"max_tokens\":10,\"logprobs\":true"
                     : "\"n\":3,\"temperature\":0,\"max_tokens\":10,\"logprobs\":1");
        int st;
        json_object *o = post(routes[chat], body, &st);
        CHECK_MSG(o && st == 200, "%s: status %d", routes[chat], st);
        CHECK_EQ(json_object_array_length(json_object_object_get(o, "choices")), N_CHOICES);
        json_object *choices = json_object_object_get(o, "choices");
        int sum = 0;
        for (int i = 0; i < N_CHOICES; i++) {
            CHECK_EQ(choice_int(o, i, "index"), i);
            CHECK(strcmp(choice_text(o, chat, i), choice_text(o, chat, 0)) == 0);
            char key[64];
            snprintf(key, sizeof key, "choices.%d.finish_reason", i);
            CHECK(httpc_jstr(o, key) && strcmp(httpc_jstr(o, key), "length") == 0);
            json_object *c = json_object_array_get_idx(choices, (size_t)i), *lp, *list;
            CHECK(json_object_object_get_ex(c, "logprobs", &lp));
            CHECK(json_object_object_get_ex(lp, chat ? "content" : "tokens", &list));
            sum += (int)json_object_array_length(list);
        }
        CHECK_EQ(atoi(httpc_jstr(o, "usage.completion_tokens")), sum);
        CHECK_EQ(sum, N_CHOICES * 10);
        json_object_put(o);
    }
}

/* What a stream of n choices said. */
typedef struct stream_seen {
    char text[N_CHOICES][4096];
    int finishes[N_CHOICES];  /* events with a finish_reason, per index */
    char finish[N_CHOICES][16];
    bool after_finish;        /* a choice's text came after its finish_reason */
    int roles[N_CHOICES];     /* a chat's assistant role events, per index */
    int dones, usages, bad_index, events_after_done;
    int completion_tokens;
    bool interleaved;         /* an index other than the last one's came before it ended */
} stream_seen;

static void read_stream(const char *body, bool chat, stream_seen *s)
{
    memset(s, 0, sizeof *s);
    char *copy = strdup(body), *save;
    int last = -1;
    for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (strncmp(line, "data: ", 6) != 0)
            continue;
        if (s->dones)
            s->events_after_done++;
        if (strcmp(line + 6, "[DONE]") == 0) {
            s->dones++;
            continue;
        }
        json_object *o = json_tokener_parse(line + 6), *choices;
        if (!o)
            continue;
        if (httpc_jstr(o, "usage.completion_tokens")) {
            s->usages++;
            s->completion_tokens = atoi(httpc_jstr(o, "usage.completion_tokens"));
        }
        if (json_object_object_get_ex(o, "choices", &choices))
            for (size_t k = 0; k < json_object_array_length(choices); k++) {
                json_object *c = json_object_array_get_idx(choices, k);
                const char *idx = httpc_jstr(c, "index");
                int i = idx ? atoi(idx) : -1;
                if (i < 0 || i >= N_CHOICES) {
                    s->bad_index++;
                    continue;
                }
                if (last >= 0 && i != last && s->finishes[last] == 0)
                    s->interleaved = true;
                last = i;
                const char *piece = httpc_jstr(c, chat ? "delta.content" : "text");
                if (chat && httpc_jstr(c, "delta.role"))
                    s->roles[i]++;
                if (piece && piece[0]) {
                    s->after_finish |= s->finishes[i] > 0;
                    strncat(s->text[i], piece, sizeof s->text[i] - strlen(s->text[i]) - 1);
                }
                const char *f = httpc_jstr(c, "finish_reason");
                if (f) {
                    s->finishes[i]++;
                    snprintf(s->finish[i], sizeof s->finish[i], "%s", f);
                }
            }
        json_object_put(o);
    }
    free(copy);
}

/* A stream of n = 3 says the whole reply's texts by index, ends each choice with its
 * finish_reason once, gives usage (the sum) once and [DONE] once, last. */
static void streamed_choices_equal_whole(void)
{
    NEED(daemon_up, start_daemon());
    for (int chat = 1; chat >= 0; chat--) {
        const char *fields = "\"n\":3,\"temperature\":1,\"seed\":7,\"max_tokens\":16";
        char body[1024], sfields[256];
        body_of(body, sizeof body, chat, fields);
        int st;
        json_object *whole = post(routes[chat], body, &st);
        CHECK_MSG(whole && st == 200, "%s: status %d", routes[chat], st);
        snprintf(sfields, sizeof sfields,
                 "%s,\"stream\":true,\"stream_options\":{\"include_usage\":true}", fields);
        body_of(body, sizeof body, chat, sfields);
        httpc_reply r;
        CHECK(httpc_do(hsock, 0, "POST", routes[chat], NULL, body, &r) == 0);
        CHECK_EQ(r.status, 200);
        stream_seen s;
        read_stream(r.body, chat, &s);
        httpc_reply_free(&r);
        CHECK_EQ(s.dones, 1);
        CHECK_EQ(s.events_after_done, 0);
        CHECK_EQ(s.usages, 1);
        CHECK_EQ(s.bad_index, 0);
        CHECK(!s.after_finish);
        CHECK_MSG(s.interleaved, "%s: the choices came one after another", routes[chat]);
        CHECK_EQ(s.completion_tokens, atoi(httpc_jstr(whole, "usage.completion_tokens")));
        for (int i = 0; i < N_CHOICES; i++) {
            CHECK_EQ(s.finishes[i], 1);
            if (chat)
                CHECK_EQ(s.roles[i], 1);
            CHECK_MSG(strcmp(s.text[i], choice_text(whole, chat, i)) == 0,
                      "%s: streamed choice %d '%s', whole '%s'", routes[chat], i, s.text[i],
                      choice_text(whole, chat, i));
            char key[64];
            snprintf(key, sizeof key, "choices.%d.finish_reason", i);
            CHECK(strcmp(s.finish[i], httpc_jstr(whole, key)) == 0);
        }
        json_object_put(whole);
    }
}

static void expect_400(const char *sock, const char *path, const char *body, const char *names)
{
    int st;
    json_object *o = httpc_post_json(sock, path, body, &st);
    CHECK_MSG(st == 400, "%s %s: status %d", path, body, st);
    const char *m = o ? httpc_jstr(o, "error.message") : NULL;
    CHECK_MSG(m && strstr(m, names), "%s %s: '%s' does not name %s", path, body, m ? m : "",
              names);
    json_object_put(o);
}

/* n outside 1..16, not an integer, with a context or with RAG, or beyond what the app may
 * queue, is 400 naming why; best_of other than 1 stays refused. */
static void bad_n_is_refused(void)
{
    NEED(daemon_up, start_daemon());
    const char *chat = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],";
    char body[512];
    snprintf(body, sizeof body, "%s\"n\":0}", chat);
    expect_400(hsock, routes[1], body, "'n'");
    snprintf(body, sizeof body, "%s\"n\":%d}", chat, N_MAX + 1);
    expect_400(hsock, routes[1], body, "'n'");
    expect_400(hsock, routes[0], "{\"prompt\":\"x\",\"n\":-2}", "'n'");
    expect_400(hsock, routes[0], "{\"prompt\":\"x\",\"n\":\"3\"}", "'n'");
    snprintf(body, sizeof body, "%s\"n\":2,\"llmsd\":{\"context\":\"c1\"}}", chat);
    expect_400(hsock, routes[1], body, "'n'");
    expect_400(hsock, "/v1/llmsd/rag", "{\"kb\":\"k\",\"question\":\"q\",\"n\":2}", "'n'");
    expect_400(hsock, routes[0], "{\"prompt\":\"x\",\"n\":2,\"best_of\":2}", "'best_of'");
    /* n = 16 is served */
    int st;
    json_object *o = post(routes[0], "{\"prompt\":\"x\",\"n\":16,\"max_tokens\":2}", &st);
    CHECK_MSG(o && st == 200, "n=16: status %d", st);
    CHECK_EQ(json_object_array_length(json_object_object_get(o, "choices")), N_MAX);
    json_object_put(o);
    NEED(slow_up, start_slow());
    snprintf(body, sizeof body, "{\"prompt\":\"x\",\"n\":%d}", SLOW_QUEUE + 1);
    expect_400(slow_hsock, routes[0], body, "max_queued_per_app");
}

/* Reads until the stream has said something of every choice. */
static bool wait_all_choices_began(int fd)
{
    char buf[8192], seen[N_CHOICES] = {0};
    size_t have = 0;
    double deadline = proc_now() + 30;
    while (proc_now() < deadline) {
        ssize_t k = recv(fd, buf + have, sizeof buf - 1 - have, 0);
        if (k <= 0)
            return false;
        have += (size_t)k;
        buf[have] = '\0';
        int all = 0;
        for (int i = 0; i < N_CHOICES; i++) {
            char needle[32];
            snprintf(needle, sizeof needle, "\"index\":%d,\"text\"", i);
            seen[i] |= strstr(buf, needle) != NULL;
            all += seen[i];
        }
        if (all == N_CHOICES)
            return true;
        if (have > sizeof buf / 2) { /* keep the tail: an index may straddle reads */
            memmove(buf, buf + have - 64, 64);
            have = 64;
        }
    }
    return false;
}

static int log_count(const llmsd_proc *d, const char *a, const char *b)
{
    FILE *f = fopen(d->log, "r");
    char line[2048];
    int n = 0;
    while (f && fgets(line, sizeof line, f))
        n += strstr(line, a) && strstr(line, b);
    if (f)
        fclose(f);
    return n;
}

/* A client that leaves mid-stream cancels all n generations; the daemon goes on serving
 * (an n = 3 request right after is whole). */
static void disconnect_cancels_every_choice(void)
{
    NEED(slow_up, start_slow());
    int before = log_count(&slow_daemon, "kind=complete", "outcome=STOP_CANCELLED");
    int fd = httpc_connect(slow_hsock, 0);
    CHECK(fd >= 0);
    const char *body = "{\"prompt\":\"go on\",\"n\":3,\"max_tokens\":3000,\"temperature\":1,"
                       "\"seed\":1,\"stream\":true}";
    CHECK(httpc_send(fd, "POST", routes[0], NULL, body, strlen(body)) == 0);
    CHECK_MSG(wait_all_choices_began(fd), "the three choices did not all stream");
    close(fd);
    double deadline = proc_now() + 30 * TEST_TIME_SCALE;
    int seen = 0;
    while (proc_now() < deadline &&
           (seen = log_count(&slow_daemon, "kind=complete", "outcome=STOP_CANCELLED") - before) <
               N_CHOICES)
        usleep(20000);
    CHECK_MSG(seen == N_CHOICES, "%d cancelled completions in the log, not %d", seen, N_CHOICES);
    CHECK(log_count(&slow_daemon, "kind=complete", "STOP_MAX_TOKENS") == 0);
    int st;
    json_object *o = httpc_post_json(slow_hsock, routes[0],
                                     "{\"prompt\":\"again\",\"n\":3,\"max_tokens\":4}", &st);
    CHECK_MSG(o && st == 200, "after the disconnect: status %d", st);
    CHECK_EQ(json_object_array_length(json_object_object_get(o, "choices")), N_CHOICES);
    json_object_put(o);
}

/* A choice the app's queue limit refuses (429) fails the whole request: one answer, the
 * error; its other choices are dropped, and once the queue is free again n choices are
 * served. */
static void one_refused_choice_fails_the_request(void)
{
    NEED(slow_up, start_slow());
    /* two long generations of the same app take two of its four places */
    int busy[2];
    const char *longer = "{\"prompt\":\"go on\",\"max_tokens\":3000,\"stream\":true}";
    for (int k = 0; k < 2; k++) {
        busy[k] = httpc_connect(slow_hsock, 0);
        CHECK(busy[k] >= 0);
        CHECK(httpc_send(busy[k], "POST", routes[0], NULL, longer, strlen(longer)) == 0);
        char buf[256];
        CHECK(recv(busy[k], buf, sizeof buf, 0) > 0);
    }
    int st;
    json_object *o = httpc_post_json(slow_hsock, routes[0],
                                     "{\"prompt\":\"x\",\"n\":3,\"max_tokens\":4}", &st);
    CHECK_MSG(st == 429, "status %d", st);
    CHECK(o && httpc_jstr(o, "error.message") &&
          strstr(httpc_jstr(o, "error.message"), "max_queued_per_app"));
    json_object_put(o);
    for (int k = 0; k < 2; k++)
        close(busy[k]);
    /* the places come back as the worker drops the closed requests */
    double deadline = proc_now() + 30 * TEST_TIME_SCALE;
    do {
        o = httpc_post_json(slow_hsock, routes[0], "{\"prompt\":\"x\",\"n\":4,\"max_tokens\":4}",
                            &st);
        if (st != 429)
            break;
        json_object_put(o);
        o = NULL;
        usleep(50000);
    } while (proc_now() < deadline);
    CHECK_MSG(o && st == 200, "status %d", st);
    CHECK_EQ(json_object_array_length(json_object_object_get(o, "choices")), SLOW_QUEUE);
    json_object_put(o);
    httpc_reply r;
    CHECK(httpc_do(slow_hsock, 0, "GET", "/health", NULL, NULL, &r) == 0);
    CHECK_EQ(r.status, 200);
    httpc_reply_free(&r);
}

/* Both daemons exit cleanly (under ASan: nothing leaked). */
static void daemons_exit_clean(void)
{
    if (daemon_up == 1) {
        CHECK_EQ(proc_stop(&daemon_, SIGTERM), 0);
        daemon_up = 0;
    }
    if (slow_up == 1) {
        CHECK_EQ(proc_stop(&slow_daemon, SIGTERM), 0);
        slow_up = 0;
    }
}

int main(int argc, char **argv)
{
    (void)argc;
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    modelgen_params mp = {
        .arch = "llama", .dim = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 128,
        .n_ctx = 512, .type = QTYPE_F32, .seed = 9, .n_vocab = 300, .n_threads = 1,
    };
    proc_generate_model(model_path, sizeof model_path, "http-n.gguf", &mp);
    modelgen_params slow = mp;
    slow.dim = 256;
    slow.n_layer = 4;
    slow.n_head = 8;
    slow.n_head_kv = 4;
    slow.n_ff = 768;
    slow.n_ctx = 4096;
    slow.type = QTYPE_Q8_0;
    proc_generate_model(slow_model_path, sizeof slow_model_path, "http-n-slow.gguf", &slow);
    RUN(seeded_choices_are_the_seeds_answers);
    RUN(greedy_choices_are_equal);
    RUN(streamed_choices_equal_whole);
    RUN(bad_n_is_refused);
    RUN(disconnect_cancels_every_choice);
    RUN(one_refused_choice_fails_the_request);
    RUN(daemons_exit_clean);
    if (daemon_up == 1)
        proc_stop(&daemon_, SIGTERM);
    if (slow_up == 1)
        proc_stop(&slow_daemon, SIGTERM);
    return test_finish();
}
