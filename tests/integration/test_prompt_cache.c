/*
 * The prompt cache (daemon/sched/promptcache.h) through the HTTP gateway of a real llmsd
 * serving the trained documentation model: a chat's second turn resumes the first turn's
 * prompt (usage.prompt_tokens_details.cached_tokens, a multiple of step_tokens below
 * prompt_tokens) and its greedy reply and logprobs equal, byte for byte, those of a
 * daemon with prompt_cache_mb = 0; another app's same prompt resumes nothing;
 * prompt_cache_mb = 0 never resumes; a cache with room for one prompt evicts the least
 * recently used and a small KV budget takes the cache back, the daemon answering
 * throughout; two identical requests at once both succeed with the same reply; clients
 * leaving mid-prefill and mid-decode leave the cache usable; unloading a model frees its
 * cache; every daemon exits clean (under ASan: nothing leaked). Skips without ../shared/testdata.
 */
#include <grp.h>
#include <json-c/json.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/integration/httpc.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/support/test.h"

#define STEP_TOKENS 64 /* the daemons' step_tokens: a resumed prefix is a multiple */

static char llmsd_path[1024];
static const char *model_path;

/* The daemons: the cache on, off, with room for about one prompt, under a small KV
 * budget. */
enum { D_ON, D_OFF, D_ONE, D_BUDGET, N_DAEMONS };
static const char *const names[N_DAEMONS] = {"pc-on", "pc-off", "pc-one", "pc-budget"};
static const char *const extras[N_DAEMONS] = {
    "", "prompt_cache_mb = 0\n", "prompt_cache_mb = 1\n", "kv_budget_mb = 4\n"};
static llmsd_proc daemons[N_DAEMONS];
static int up[N_DAEMONS];
static char hsocks[N_DAEMONS][700];

static int start(int k)
{
    char extra[1024];
    struct group *g = getgrgid(getgid());
    proc_fmt(hsocks[k], sizeof hsocks[k], "%s/%s-h.sock", test_tmpdir(), names[k]);
    proc_fmt(extra, sizeof extra,
             "http_socket = %s\nn_ctx = 1024\nstep_tokens = %d\nadmin_group = %s\n%s",
             hsocks[k], STEP_TOKENS, g ? g->gr_name : "root", extras[k]);
    return proc_start(&daemons[k], llmsd_path, names[k], model_path, extra);
}

#define NEED(k)                                                                \
    do {                                                                       \
        if (!llmsd_path[0])                                                    \
            SKIP("llmsd is not built in this tree");                           \
        if (!model_path)                                                       \
            SKIP("models/docs-lm-21M-F16.gguf is not in the test data");       \
        if (!up[k])                                                            \
            up[k] = start(k) == 0 ? 1 : -1;                                    \
        CHECK_MSG(up[k] == 1, "llmsd %s did not start", names[k]);             \
    } while (0)

/* The conversation: a long first question (several step_tokens of prompt), the model's
 * answer to it, a second question. */
static const char *const system_text =
    "You answer questions about llmsd, the daemon that serves language models to the apps "
    "of one machine over a Unix socket and an HTTP gateway compatible with OpenAI's.";
static const char *const first_question =
    "I run llmsd on a laptop with a small model and several apps: an editor plugin that "
    "completes code, a chat window, and a notes app that searches my documents with "
    "retrieval. The chat window keeps one context per conversation. How does the daemon "
    "keep the memory of all those contexts under the KV budget, what happens to the chunks "
    "of a context that has not been used for an hour, and what does the next call of that "
    "context pay to bring them back?";
static const char *const second_question = "And how do I see how much KV memory is in use?";

/* A chat request body: the first turn alone (answer NULL), or with its answer and the
 * second question; greedy, with logprobs. */
static void chat_body(char *out, size_t cap, const char *answer, bool stream)
{
    json_object *o = json_object_new_object(), *msgs = json_object_new_array();
    const char *roles[4] = {"system", "user", "assistant", "user"};
    const char *texts[4] = {system_text, first_question, answer, second_question};
    for (int i = 0; i < (answer ? 4 : 2); i++) {
        json_object *m = json_object_new_object();
        json_object_object_add(m, "role", json_object_new_string(roles[i]));
        json_object_object_add(m, "content", json_object_new_string(texts[i]));
        json_object_array_add(msgs, m);
    }
    json_object_object_add(o, "messages", msgs);
    json_object_object_add(o, "temperature", json_object_new_double(0));
    json_object_object_add(o, "max_tokens", json_object_new_int(24));
    json_object_object_add(o, "logprobs", json_object_new_boolean(1));
    json_object_object_add(o, "top_logprobs", json_object_new_int(3));
    if (stream)
        json_object_object_add(o, "stream", json_object_new_boolean(1));
    snprintf(out, cap, "%s", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
    json_object_put(o);
}

/* What a whole chat reply says: its text, logprobs (as JSON, every double printed in
 * full), prompt and cached tokens. */
typedef struct reply {
    int status;
    char *text, *logprobs;
    int prompt_tokens, cached_tokens;
} reply;

static void reply_free(reply *r)
{
    free(r->text);
    free(r->logprobs);
    memset(r, 0, sizeof *r);
}

static reply ask(int k, const char *app, const char *body)
{
    reply r = {0};
    char head[128] = "";
    if (app)
        snprintf(head, sizeof head, "X-Llmsd-App: %s\r\n", app);
    httpc_reply h;
    if (httpc_do(hsocks[k], 0, "POST", "/v1/chat/completions", head, body, &h))
        return r;
    r.status = h.status;
    json_object *o = json_tokener_parse(h.body);
    httpc_reply_free(&h);
    const char *t = o ? httpc_jstr(o, "choices.0.message.content") : NULL;
    json_object *choices = NULL, *lp = NULL;
    if (o && json_object_object_get_ex(o, "choices", &choices) &&
        json_object_is_type(choices, json_type_array) &&
        json_object_object_get_ex(json_object_array_get_idx(choices, 0), "logprobs", &lp))
        r.logprobs = strdup(json_object_to_json_string_ext(lp, JSON_C_TO_STRING_PLAIN));
    r.text = t ? strdup(t) : NULL;
    const char *p = o ? httpc_jstr(o, "usage.prompt_tokens") : NULL;
    const char *c = o ? httpc_jstr(o, "usage.prompt_tokens_details.cached_tokens") : NULL;
    r.prompt_tokens = p ? atoi(p) : -1;
    r.cached_tokens = c ? atoi(c) : -1;
    json_object_put(o);
    return r;
}

/* The value of a metric of daemon k's /metrics, -1 when absent. */
static double metric(int k, const char *name)
{
    httpc_reply h;
    if (httpc_do(hsocks[k], 0, "GET", "/metrics", NULL, NULL, &h))
        return -1;
    char key[128];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *at = h.body ? strstr(h.body, key) : NULL;
    double v = at ? atof(at + strlen(key)) : -1;
    httpc_reply_free(&h);
    return v;
}

/* The first turn's answer (from the cache-off daemon: every daemon answers it alike),
 * for the second turn's body. */
static char *answer1;
static char turn1[8192], turn2[16384];

static bool make_turns(void)
{
    if (answer1)
        return true;
    chat_body(turn1, sizeof turn1, NULL, false);
    reply r = ask(D_OFF, NULL, turn1);
    if (r.status != 200 || !r.text) {
        test_fail(__FILE__, __LINE__, "first turn: status %d", r.status);
        reply_free(&r);
        return false;
    }
    answer1 = r.text;
    r.text = NULL;
    reply_free(&r);
    chat_body(turn2, sizeof turn2, answer1, false);
    return true;
}

/* (a) the second turn resumes the first's prompt and replies exactly as without it. */
static void second_turn_resumes_exactly(void)
{
    NEED(D_ON);
    NEED(D_OFF);
    CHECK(make_turns());
    reply r1 = ask(D_ON, NULL, turn1);
    CHECK_EQ(r1.status, 200);
    CHECK_EQ(r1.cached_tokens, 0);
    CHECK_MSG(r1.prompt_tokens >= 2 * STEP_TOKENS, "first prompt of %d tokens", r1.prompt_tokens);
    CHECK_MSG(!strcmp(r1.text, answer1), "'%s' vs '%s'", r1.text, answer1);
    reply_free(&r1);
    reply on = ask(D_ON, NULL, turn2), off = ask(D_OFF, NULL, turn2);
    CHECK_EQ(on.status, 200);
    CHECK_EQ(off.status, 200);
    CHECK_MSG(on.cached_tokens >= STEP_TOKENS && on.cached_tokens % STEP_TOKENS == 0 &&
                  on.cached_tokens < on.prompt_tokens,
              "cached %d of %d", on.cached_tokens, on.prompt_tokens);
    CHECK_EQ(off.cached_tokens, 0);
    CHECK_EQ(on.prompt_tokens, off.prompt_tokens);
    CHECK_MSG(on.text && off.text && !strcmp(on.text, off.text), "resumed '%s', whole '%s'",
              on.text, off.text);
    CHECK_MSG(on.logprobs && off.logprobs && !strcmp(on.logprobs, off.logprobs),
              "logprobs differ:\n%s\n%s", on.logprobs, off.logprobs);
    printf("# resumed %d of %d prompt tokens, reply and logprobs equal\n", on.cached_tokens,
           on.prompt_tokens);
    reply_free(&on);
    reply_free(&off);
    CHECK(metric(D_ON, "llmsd_prompt_cache_hits_total") >= 1);
    CHECK(metric(D_ON, "llmsd_prompt_cache_bytes") > 0);
    CHECK(metric(D_ON, "llmsd_http_prompt_cached_tokens_total") >= STEP_TOKENS);
}

/* (b) another app's same prompt resumes nothing, and is answered alike. */
static void another_app_resumes_nothing(void)
{
    NEED(D_ON);
    CHECK(make_turns());
    reply mine = ask(D_ON, NULL, turn2), other = ask(D_ON, "other-app", turn2);
    CHECK_EQ(mine.status, 200);
    CHECK_EQ(other.status, 200);
    CHECK_MSG(mine.cached_tokens > 0, "the owner's own resumed %d", mine.cached_tokens);
    CHECK_EQ(other.cached_tokens, 0);
    CHECK(!strcmp(mine.text, other.text) && !strcmp(mine.logprobs, other.logprobs));
    reply_free(&mine);
    reply_free(&other);
}

/* (c) prompt_cache_mb = 0: never resumed, nothing held. */
static void off_never_resumes(void)
{
    NEED(D_OFF);
    CHECK(make_turns());
    for (int i = 0; i < 2; i++) {
        reply r = ask(D_OFF, NULL, i ? turn2 : turn1);
        CHECK_EQ(r.status, 200);
        CHECK_EQ(r.cached_tokens, 0);
        reply_free(&r);
    }
    CHECK_EQ(metric(D_OFF, "llmsd_prompt_cache_hits_total"), 0);
    CHECK_EQ(metric(D_OFF, "llmsd_prompt_cache_bytes"), 0);
}

/* (d) a cache with room for about one prompt keeps the most recently used: app b's
 * prompt evicts app a's, b's next turn resumes and then a's does not; the bytes stay under
 * the cap. A KV budget of 4 MiB takes the cache back for running work, the daemon
 * answering every request. */
static void small_caches_evict(void)
{
    NEED(D_ONE);
    CHECK(make_turns());
    reply a1 = ask(D_ONE, "a", turn1);
    CHECK_EQ(a1.status, 200);
    reply_free(&a1);
    double one = metric(D_ONE, "llmsd_prompt_cache_bytes");
    CHECK_MSG(one > 0 && one <= 1 << 20, "one prompt holds %.0f bytes", one);
    if (2 * one <= 1 << 20)
        SKIP("two prompts of %.0f bytes fit the 1 MiB cache", one);
    reply b1 = ask(D_ONE, "b", turn1), b2 = ask(D_ONE, "b", turn2), a2 = ask(D_ONE, "a", turn2);
    CHECK(b1.status == 200 && a2.status == 200 && b2.status == 200);
    CHECK_EQ(a2.cached_tokens, 0);
    CHECK_MSG(b2.cached_tokens > 0, "b resumed %d", b2.cached_tokens);
    CHECK(!strcmp(a2.text, b2.text) && !strcmp(a2.logprobs, b2.logprobs));
    reply_free(&b1);
    reply_free(&a2);
    reply_free(&b2);
    CHECK(metric(D_ONE, "llmsd_prompt_cache_bytes") <= 1 << 20);

    NEED(D_BUDGET);
    for (int i = 0; i < 6; i++) {
        char app[16];
        snprintf(app, sizeof app, "app%d", i);
        reply r = ask(D_BUDGET, app, i % 2 ? turn2 : turn1);
        CHECK_MSG(r.status == 200, "request %d: status %d", i, r.status);
        reply_free(&r);
        CHECK(metric(D_BUDGET, "llmsd_kv_resident_bytes") <= 4 << 20);
    }
}

typedef struct concurrent {
    reply r;
} concurrent;

static void *ask_thread(void *arg)
{
    concurrent *c = arg;
    c->r = ask(D_ON, "twins", turn2);
    return NULL;
}

/* (e) two identical requests at once both succeed alike, and both resume the app's
 * first turn: a take copies the entry while the budget has room, so requests sharing a
 * prefix at the same time all reuse it. */
static void concurrent_requests_both_succeed(void)
{
    NEED(D_ON);
    CHECK(make_turns());
    reply r = ask(D_ON, "twins", turn1);
    CHECK_EQ(r.status, 200);
    reply_free(&r);
    concurrent c[2] = {0};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        CHECK(pthread_create(&t[i], NULL, ask_thread, &c[i]) == 0);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    CHECK_EQ(c[0].r.status, 200);
    CHECK_EQ(c[1].r.status, 200);
    CHECK_MSG(c[0].r.cached_tokens > 0 && c[1].r.cached_tokens > 0, "resumed: %d and %d",
              c[0].r.cached_tokens, c[1].r.cached_tokens);
    CHECK(!strcmp(c[0].r.text, c[1].r.text));
    reply_free(&c[0].r);
    reply_free(&c[1].r);
}

/* A completion body of the first question as a raw prompt (no template, so no stop text),
 * EOS barred: the reply runs to max_tokens. tail is added to the prompt. */
static void running_body(char *out, size_t cap, const char *tail, int max_tokens, bool stream)
{
    snprintf(out, cap, "{\"prompt\":\"%s %s%s\",\"max_tokens\":%d,\"temperature\":0,"
             "\"logit_bias\":{\"2\":-100}%s}", system_text, first_question, tail, max_tokens,
             stream ? ",\"stream\":true" : "");
}

/* (g) a reply still running shares its prompt: once its first token came, the app's next
 * prompt that begins the same way resumes it (the prompt's KV is copied in when it is
 * evaluated, not only when the reply ends). */
static void a_running_reply_shares_its_prompt(void)
{
    NEED(D_ON);
    char body[4096];
    running_body(body, sizeof body, "", 400, true);
    int fd = httpc_connect(hsocks[D_ON], 0);
    CHECK(fd >= 0 && httpc_send(fd, "POST", "/v1/completions", "X-Llmsd-App: runner\r\n", body,
                                strlen(body)) == 0);
    static char buf[1 << 20]; /* the whole stream of 400 tokens */
    size_t got = 0;
    while (got + 1 < sizeof buf && !memmem(buf, got, "data: ", 6)) {
        ssize_t n = read(fd, buf + got, sizeof buf - 1 - got);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    CHECK_MSG(memmem(buf, got, "data: ", 6), "no token of the running reply came");
    httpc_reply h;
    running_body(body, sizeof body, " Answer briefly.", 4, false);
    CHECK(httpc_do(hsocks[D_ON], 0, "POST", "/v1/completions", "X-Llmsd-App: runner\r\n", body,
                   &h) == 0);
    json_object *o = json_tokener_parse(h.body);
    const char *c = o ? httpc_jstr(o, "usage.prompt_tokens_details.cached_tokens") : NULL;
    CHECK_MSG(h.status == 200 && c && atoi(c) >= STEP_TOKENS, "status %d, cached %s", h.status,
              c ? c : "none");
    json_object_put(o);
    httpc_reply_free(&h);
    /* the first reply was still running: its end had not come */
    for (ssize_t n; (n = recv(fd, buf + got, sizeof buf - 1 - got, MSG_DONTWAIT)) > 0;)
        got += (size_t)n;
    CHECK_MSG(!memmem(buf, got, "[DONE]", 6), "the first reply had ended (%zu bytes)", got);
    while (got + 1 < sizeof buf && !memmem(buf, got, "[DONE]", 6)) {
        ssize_t n = read(fd, buf + got, sizeof buf - 1 - got);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    buf[got] = '\0';
    CHECK_MSG(strstr(buf, "\"finish_reason\":\"length\""), "the first reply did not run to "
              "max_tokens");
    close(fd);
}

/* Sends body streamed on a new connection and closes it once `after` bytes of the reply
 * came (0: at once, the prompt still being evaluated). */
static bool leave_after(int k, const char *app, const char *body, size_t after)
{
    char head[128];
    snprintf(head, sizeof head, "X-Llmsd-App: %s\r\n", app);
    int fd = httpc_connect(hsocks[k], 0);
    if (fd < 0 || httpc_send(fd, "POST", "/v1/chat/completions", head, body, strlen(body))) {
        if (fd >= 0)
            close(fd);
        return false;
    }
    char buf[4096];
    size_t got = 0;
    while (got < after) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    return got >= after;
}

/* (f) clients leaving mid-prefill and mid-decode of resumed prompts: the cache stays
 * usable (the next turn is answered, resumed or not, as without the cache). */
static void cancelled_requests_leave_the_cache_usable(void)
{
    NEED(D_ON);
    NEED(D_OFF);
    CHECK(make_turns());
    char streamed[16384];
    chat_body(streamed, sizeof streamed, answer1, true);
    reply r = ask(D_ON, "leaver", turn1);
    CHECK_EQ(r.status, 200);
    reply_free(&r);
    CHECK(leave_after(D_ON, "leaver", streamed, 0));
    reply again = ask(D_ON, "leaver", turn1);
    CHECK_EQ(again.status, 200);
    reply_free(&again);
    CHECK(leave_after(D_ON, "leaver", streamed, 400));
    usleep(200000);
    reply after = ask(D_ON, "leaver", turn2), off = ask(D_OFF, NULL, turn2);
    CHECK_EQ(after.status, 200);
    CHECK(!strcmp(after.text, off.text) && !strcmp(after.logprobs, off.logprobs));
    reply_free(&after);
    reply_free(&off);
}

/* A generate model loaded at run time has its own cache; unloading it gives its entries'
 * KV back with its pool (under ASan: no leak, no use after free), the default model's
 * entries staying. */
static void unloading_a_model_frees_its_entries(void)
{
    NEED(D_ON);
    CHECK(make_turns());
    const char *q8 = test_data_path("models/docs-lm-21M-Q8_0.gguf");
    if (!q8)
        SKIP("models/docs-lm-21M-Q8_0.gguf is not in the test data");
    llms_conn *c = proc_connect(&daemons[D_ON], NULL);
    CHECK(c);
    CHECK_MSG(llms_model_load(c, "q8", q8, "generate") == LLMS_OK, "%s", llms_last_error(c));
    double before = metric(D_ON, "llmsd_prompt_cache_entries");
    char body[sizeof turn1 + 32];
    snprintf(body, sizeof body, "{\"model\":\"q8\",%s", turn1 + 1);
    reply r = ask(D_ON, "unloader", body);
    CHECK_MSG(r.status == 200, "status %d", r.status);
    CHECK_EQ(r.cached_tokens, 0);
    reply_free(&r);
    CHECK_EQ(metric(D_ON, "llmsd_prompt_cache_entries"), before + 1);
    CHECK_MSG(llms_model_unload(c, "q8") == LLMS_OK, "%s", llms_last_error(c));
    llms_close(c);
    CHECK_EQ(metric(D_ON, "llmsd_prompt_cache_entries"), before);
    reply again = ask(D_ON, NULL, turn2);
    CHECK_EQ(again.status, 200);
    CHECK(again.cached_tokens > 0);
    reply_free(&again);
}

/* The native client sees the same: llms_complete's result counts the resumed tokens,
 * and the daemon's status the cache's hits and what it holds. */
static void native_client_sees_the_cache(void)
{
    NEED(D_ON);
    llms_conn *c = proc_connect(&daemons[D_ON], "native");
    CHECK(c);
    char prompt[4096] = "";
    for (int i = 0; i < 24; i++)
        strcat(prompt, "The daemon keeps each app's prompt so that the next one resumes it. ");
    llms_params p = LLMS_PARAMS_INIT;
    p.temperature = 0;
    p.max_tokens = 4;
    llms_result first = {0}, second = {0};
    CHECK_EQ(llms_complete(c, prompt, NULL, 0, &p, NULL, NULL, &first), LLMS_OK);
    CHECK_EQ(llms_complete(c, prompt, NULL, 0, &p, NULL, NULL, &second), LLMS_OK);
    CHECK_EQ(first.cached_tokens, 0);
    CHECK_MSG(second.cached_tokens >= STEP_TOKENS && second.cached_tokens < second.prompt_tokens,
              "cached %u of %u", second.cached_tokens, second.prompt_tokens);
    CHECK_MSG(!strcmp(first.text, second.text), "'%s' vs '%s'", first.text, second.text);
    llms_result_free(&first);
    llms_result_free(&second);
    llms_close(c);
    llms_conn *admin = proc_connect(&daemons[D_ON], NULL);
    llms_daemon_status st;
    CHECK(admin && proc_status(admin, &st) == 0);
    CHECK_EQ((double)st.prompt_cache_hits, metric(D_ON, "llmsd_prompt_cache_hits_total"));
    CHECK(st.prompt_cache_hits >= 1 && st.prompt_cache_misses >= 1);
    CHECK(st.prompt_cache_reused_tokens >= STEP_TOKENS);
    CHECK(st.prompt_cache_entries >= 1 && st.prompt_cache_bytes > 0);
    llms_daemon_status_free(&st);
    llms_close(admin);
}

/* The choices' texts of a whole reply to body (app "choices"), joined by newlines. */
static char *choices_of(int k, const char *body)
{
    httpc_reply h;
    if (httpc_do(hsocks[k], 0, "POST", "/v1/chat/completions", "X-Llmsd-App: choices\r\n", body,
                 &h))
        return NULL;
    json_object *o = h.status == 200 ? json_tokener_parse(h.body) : NULL, *choices;
    httpc_reply_free(&h);
    char *all = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&all, &len);
    if (f && o && json_object_object_get_ex(o, "choices", &choices))
        for (size_t i = 0; i < json_object_array_length(choices); i++)
            fprintf(f, "%s\n", httpc_jstr(json_object_array_get_idx(choices, i), "message.content"));
    if (f)
        fclose(f);
    json_object_put(o);
    return all;
}

/* (g) n choices of one prompt evaluate it once: the others wait for its evaluation and
 * resume from the prompt cache, and the replies are those of a daemon without the cache. */
static void n_choices_share_one_prompt(void)
{
    NEED(D_ON);
    NEED(D_OFF);
    CHECK(make_turns());
    char body[sizeof turn1 + 64];
    snprintf(body, sizeof body, "%.*s,\"n\":4,\"seed\":7}", (int)strlen(turn1) - 1, turn1);
    double before = metric(D_ON, "llmsd_prompt_cache_reused_tokens_total");
    char *on = choices_of(D_ON, body), *off = choices_of(D_OFF, body);
    double reused = metric(D_ON, "llmsd_prompt_cache_reused_tokens_total") - before;
    CHECK_MSG(on && off && !strcmp(on, off), "choices with the cache:\n%s\nwithout:\n%s",
              on ? on : "(none)", off ? off : "(none)");
    CHECK_MSG(reused >= 3 * STEP_TOKENS, "the choices resumed %.0f tokens", reused);
    printf("# 4 choices: %.0f prompt tokens resumed by the 3 that waited\n", reused);
    free(on);
    free(off);
}

/* Every daemon exits clean (under ASan: nothing leaked, the cache's KV given back). */
static void daemons_exit_clean(void)
{
    for (int k = 0; k < N_DAEMONS; k++)
        if (up[k] == 1) {
            up[k] = 0;
            CHECK_MSG(proc_stop(&daemons[k], SIGTERM) == 0, "%s did not exit clean", names[k]);
        }
}

int main(int argc, char **argv)
{
    (void)argc;
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    const char *p = test_data_path("models/docs-lm-21M-F16.gguf");
    model_path = p ? strdup(p) : NULL;
    RUN(second_turn_resumes_exactly);
    RUN(another_app_resumes_nothing);
    RUN(off_never_resumes);
    RUN(small_caches_evict);
    RUN(concurrent_requests_both_succeed);
    RUN(cancelled_requests_leave_the_cache_usable);
    RUN(a_running_reply_shares_its_prompt);
    RUN(unloading_a_model_frees_its_entries);
    RUN(native_client_sees_the_cache);
    RUN(n_choices_share_one_prompt);
    RUN(daemons_exit_clean);
    for (int k = 0; k < N_DAEMONS; k++)
        if (up[k] == 1)
            proc_stop(&daemons[k], SIGTERM);
    free(answer1);
    free((char *)model_path);
    return test_finish();
}
