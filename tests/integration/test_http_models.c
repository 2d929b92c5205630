/*
 * The HTTP gateway in front of several models (daemon/net/http.h "Models"): one llmsd with
 * two generate models of the shared test data, stories260K (the default, no chat
 * template: plain) and TinyStories-656K-Q8_0 given a chatml template ("tiny"), and a
 * generated bert encoder ("enc", embed). /v1/models lists them with their roles; a chat
 * or completion naming each model gives exactly the greedy text, and the prompt tokens,
 * of the native Complete on that model (so tiny's chat was rendered with chatml); an
 * unknown name is 404 model_not_found naming the models; a model without the route's
 * role is refused by the worker (400); a context keeps its model; a model loaded at run
 * time (a third copy, with a llama3 template) is served over HTTP at once and is 404
 * once unloaded, also while requests naming it race with loads and unloads. Skips
 * without the two trained models (the encoder part without the bert vocabulary).
 */
#include <grp.h>
#include <json-c/json.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/llms.h"
#include "engine/tok/chat.h"
#include "tests/integration/httpc.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/support/gguf_copy.h"
#include "tests/support/test.h"

#define DEFAULT_NAME "stories260K"
#define TINY_NAME "tiny"
#define ENC_NAME "enc"
#define LATE_NAME "late"
#define SYSTEM "Be brief."
#define USER "Tell me about a cat."
#define MAX_TOKENS 16
#define RACE_CYCLES 4

static char llmsd_path[1024], stories_path[1024], tiny_path[1024], late_path[1024];
static char encoder[1024];
static const char *stories; /* NULL when the test data lacks it */
static llmsd_proc daemon_;
static int up;
static char hsock[700];
static char *late_text; /* the greedy chat of LATE_NAME, for the race */

static int start_daemon(void)
{
    char extra[4096], enc_line[1200] = "";
    struct group *g = getgrgid(getgid());
    if (encoder[0])
        proc_fmt(enc_line, sizeof enc_line, "model." ENC_NAME " = %s embed\n", encoder);
    proc_fmt(hsock, sizeof hsock, "%s/hm-h.sock", test_tmpdir());
    proc_fmt(extra, sizeof extra,
             "kv_compress = none\nmodel." TINY_NAME " = %s\n%shttp_socket = %s\n"
             "admin_group = %s\n",
             tiny_path, enc_line, hsock, g ? g->gr_name : "root");
    return proc_start(&daemon_, llmsd_path, "hm", stories, extra);
}

#define NEED()                                                                        \
    do {                                                                              \
        if (!llmsd_path[0])                                                           \
            SKIP("llmsd is not built in this tree");                                  \
        if (!stories || !tiny_path[0] || !late_path[0])                               \
            SKIP("stories260K.gguf and TinyStories-656K-Q8_0.gguf are not in the test " \
                 "data (set LLMS_TESTDATA)");                                         \
        if (!up)                                                                      \
            up = start_daemon() == 0 ? 1 : -1;                                        \
        CHECK_MSG(up == 1, "llmsd did not start");                                    \
    } while (0)

/* The body of a greedy chat of SYSTEM and USER, naming model unless it is NULL. */
static void chat_body(char *buf, size_t cap, const char *model, bool stream)
{
    char named[128] = "";
    if (model)
        snprintf(named, sizeof named, "\"model\":\"%s\",", model);
    snprintf(buf, cap,
             "{%s\"messages\":[{\"role\":\"system\",\"content\":\"" SYSTEM "\"},"
             "{\"role\":\"user\",\"content\":\"" USER "\"}],\"temperature\":0,"
             "\"max_tokens\":%d%s}",
             named, MAX_TOKENS, stream ? ",\"stream\":true" : "");
}

static json_object *get_models(void)
{
    httpc_reply r;
    if (httpc_do(hsock, 0, "GET", "/v1/models", NULL, NULL, &r) || r.status != 200) {
        httpc_reply_free(&r);
        return NULL;
    }
    json_object *o = json_tokener_parse(r.body);
    httpc_reply_free(&r);
    return o;
}

/* The entry of /v1/models' data with id name, NULL when none. */
static json_object *listed(json_object *list, const char *name)
{
    json_object *data;
    if (!list || !json_object_object_get_ex(list, "data", &data))
        return NULL;
    for (size_t i = 0; i < json_object_array_length(data); i++) {
        json_object *m = json_object_array_get_idx(data, i);
        const char *id = httpc_jstr(m, "id");
        if (id && strcmp(id, name) == 0)
            return m;
    }
    return NULL;
}

/* The strings of m's array at path joined with commas ("generate,rerank"). */
static const char *joined(json_object *m, const char *path, char *buf, size_t cap)
{
    json_object *a = m;
    char key[64];
    snprintf(key, sizeof key, "%s", path);
    for (char *save, *k = strtok_r(key, ".", &save); k && a; k = strtok_r(NULL, ".", &save))
        if (!json_object_object_get_ex(a, k, &a))
            a = NULL;
    buf[0] = '\0';
    for (size_t i = 0, at = 0; a && i < json_object_array_length(a) && at < cap; i++) {
        int w = snprintf(buf + at, cap - at, "%s%s", i ? "," : "",
                         json_object_get_string(json_object_array_get_idx(a, i)));
        at += w > 0 ? (size_t)w : 0;
    }
    return buf;
}

static void models_listed_with_roles(void)
{
    NEED();
    json_object *o = get_models();
    CHECK(o);
    char roles[64], defaults[64];
    json_object *data;
    CHECK(json_object_object_get_ex(o, "data", &data));
    CHECK_EQ(json_object_array_length(data), encoder[0] ? 3 : 2);
    /* the default generate model first: what a client taking the first one gets */
    CHECK(strcmp(httpc_jstr(o, "data.0.id"), DEFAULT_NAME) == 0);
    CHECK(strcmp(httpc_jstr(o, "object"), "list") == 0);
    json_object *a = listed(o, DEFAULT_NAME), *t = listed(o, TINY_NAME);
    CHECK(a && t);
    CHECK(strcmp(httpc_jstr(t, "object"), "model") == 0);
    CHECK(strcmp(httpc_jstr(t, "owned_by"), "llmsd") == 0);
    CHECK_MSG(!strcmp(joined(t, "llmsd.roles", roles, sizeof roles), "generate") &&
                  !strcmp(joined(t, "llmsd.default_for", defaults, sizeof defaults), ""),
              "tiny: %s / %s", roles, defaults);
    /* the default generate model embeds only while no other model has the role */
    const char *want = encoder[0] ? "generate,rerank" : "generate,embed,rerank";
    CHECK_MSG(!strcmp(joined(a, "llmsd.roles", roles, sizeof roles), want) &&
                  !strcmp(joined(a, "llmsd.default_for", defaults, sizeof defaults), want),
              "%s: %s / %s", DEFAULT_NAME, roles, defaults);
    if (encoder[0]) {
        json_object *e = listed(o, ENC_NAME);
        CHECK(e);
        CHECK_MSG(!strcmp(joined(e, "llmsd.roles", roles, sizeof roles), "embed") &&
                      !strcmp(joined(e, "llmsd.default_for", defaults, sizeof defaults), "embed"),
                  "enc: %s / %s", roles, defaults);
    }
    json_object_put(o);
}

/* The native greedy chat (Complete with the chat template) on model. */
static int native_chat(const char *model, llms_result *out)
{
    llms_conn *c = proc_connect(&daemon_, "hm-native");
    if (!c)
        return -1;
    llms_params p = proc_greedy(MAX_TOKENS, model);
    enum llms_status s = llms_complete(c, USER, SYSTEM, 1, &p, NULL, NULL, out);
    if (s != LLMS_OK)
        fprintf(stderr, "native chat on %s: %s\n", model ? model : "(default)",
                llms_last_error(c));
    llms_close(c);
    return s == LLMS_OK ? 0 : -1;
}

/* Tokens of SYSTEM and USER rendered with family, with model's tokenizer (as the worker
 * tokenizes a chat prompt: BOS, special tokens parsed). */
static size_t rendered_tokens(llms_conn *c, const char *model, enum chat_family family)
{
    struct chat_message m[2] = {{"system", SYSTEM}, {"user", USER}};
    char text[1024];
    int32_t *tok = NULL;
    size_t n = 0;
    if (chat_apply(family, m, 2, true, text, sizeof text) >= (int)sizeof text ||
        llms_tokenize_model(c, model, text, 1, 1, &tok, &n) != LLMS_OK)
        return 0;
    free(tok);
    return n;
}

/* A chat naming each model (and none) gives the native chat's text and prompt tokens
 * on that model; streamed, the same text with the model in every chunk. */
static void chat_on_each_model_equals_native(void)
{
    NEED();
    const char *models[] = {NULL, DEFAULT_NAME, TINY_NAME};
    char *texts[3] = {0};
    for (int i = 0; i < 3; i++) {
        llms_result want;
        CHECK(native_chat(models[i], &want) == 0);
        char body[1024];
        chat_body(body, sizeof body, models[i], false);
        int st;
        json_object *o = httpc_post_json(hsock, "/v1/chat/completions", body, &st);
        CHECK(o);
        CHECK_EQ(st, 200);
        const char *got = httpc_jstr(o, "choices.0.message.content");
        CHECK_MSG(got && strcmp(got, want.text) == 0, "%s: http '%s', native '%s'",
                  models[i] ? models[i] : "(default)", got ? got : "(none)", want.text);
        CHECK_EQ(atoi(httpc_jstr(o, "usage.prompt_tokens")), want.prompt_tokens);
        CHECK_EQ(atoi(httpc_jstr(o, "usage.completion_tokens")), want.generated_tokens);
        CHECK(strcmp(httpc_jstr(o, "model"), models[i] ? models[i] : DEFAULT_NAME) == 0);
        texts[i] = strdup(got);
        json_object_put(o);

        chat_body(body, sizeof body, models[i], true);
        httpc_reply r;
        CHECK(httpc_do(hsock, 0, "POST", "/v1/chat/completions", NULL, body, &r) == 0);
        CHECK_EQ(r.status, 200);
        char model_field[96];
        snprintf(model_field, sizeof model_field, "\"model\":\"%s\"",
                 models[i] ? models[i] : DEFAULT_NAME);
        CHECK_MSG(strstr(r.body, model_field) && strstr(r.body, "data: [DONE]"), "%s", r.body);
        httpc_reply_free(&r);
        llms_result_free(&want);
    }
    /* two models, two texts: the comparison can tell them apart */
    CHECK(strcmp(texts[0], texts[1]) == 0 && strcmp(texts[1], texts[2]) != 0);
    for (int i = 0; i < 3; i++)
        free(texts[i]);
    /* tiny's prompt is chatml's, not the default model's plain rendering */
    llms_conn *c = proc_connect(&daemon_, "hm-native");
    CHECK(c);
    size_t chatml = rendered_tokens(c, TINY_NAME, CHAT_CHATML),
           plain = rendered_tokens(c, TINY_NAME, CHAT_PLAIN);
    llms_close(c);
    llms_result want;
    CHECK(native_chat(TINY_NAME, &want) == 0);
    CHECK_MSG(want.prompt_tokens == chatml && chatml != plain,
              "tiny's chat prompt: %u tokens; chatml %zu, plain %zu", want.prompt_tokens,
              chatml, plain);
    llms_result_free(&want);
}

static void completion_on_each_model_equals_native(void)
{
    NEED();
    const char *models[] = {DEFAULT_NAME, TINY_NAME};
    llms_conn *c = proc_connect(&daemon_, "hm-native");
    CHECK(c);
    for (int i = 0; i < 2; i++) {
        llms_params p = proc_greedy(MAX_TOKENS, models[i]);
        llms_result want;
        CHECK(llms_complete(c, "Once upon a time", NULL, 0, &p, NULL, NULL, &want) == LLMS_OK);
        char body[256];
        snprintf(body, sizeof body,
                 "{\"model\":\"%s\",\"prompt\":\"Once upon a time\",\"temperature\":0,"
                 "\"max_tokens\":%d}",
                 models[i], MAX_TOKENS);
        int st;
        json_object *o = httpc_post_json(hsock, "/v1/completions", body, &st);
        CHECK(o);
        CHECK_EQ(st, 200);
        CHECK_MSG(strcmp(httpc_jstr(o, "choices.0.text"), want.text) == 0, "%s: '%s' vs '%s'",
                  models[i], httpc_jstr(o, "choices.0.text"), want.text);
        CHECK(strcmp(httpc_jstr(o, "model"), models[i]) == 0);
        json_object_put(o);
        llms_result_free(&want);
    }
    llms_close(c);
}

/* POSTs body to path; whether the answer is status with error code code and a message
 * containing each of the NULL-ended words. */
static bool refused(const char *path, const char *body, int status, const char *code, ...)
{
    int st;
    json_object *o = httpc_post_json(hsock, path, body, &st);
    const char *c = o ? httpc_jstr(o, "error.code") : NULL;
    const char *msg = o ? httpc_jstr(o, "error.message") : NULL;
    bool ok = st == status && c && msg && strcmp(c, code) == 0;
    va_list ap;
    va_start(ap, code);
    for (const char *w = va_arg(ap, const char *); ok && w; w = va_arg(ap, const char *))
        ok = strstr(msg, w) != NULL;
    va_end(ap);
    if (!ok)
        fprintf(stderr, "   %s %s: got %d %s %s, want %d %s\n", path, body, st, c ? c : "-",
                msg ? msg : "-", status, code);
    json_object_put(o);
    return ok;
}

static void unknown_model_is_404(void)
{
    NEED();
    const char *chat = "{\"model\":\"nope\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}";
    CHECK(refused("/v1/chat/completions", chat, 404, "model_not_found", "'nope'",
                  "'" DEFAULT_NAME "'", "'" TINY_NAME "'", (char *)NULL));
    CHECK(refused("/v1/completions", "{\"model\":\"nope\",\"prompt\":\"x\"}", 404,
                  "model_not_found", "'" TINY_NAME "'", (char *)NULL));
    CHECK(refused("/v1/embeddings", "{\"model\":\"gpt-4o\",\"input\":\"x\"}", 404,
                  "model_not_found", (char *)NULL));
    CHECK(refused("/v1/rerank", "{\"model\":\"x\",\"query\":\"q\",\"documents\":[\"d\"]}", 404,
                  "model_not_found", (char *)NULL));
}

/* A model without the route's role: the worker refuses it as a native request (400
 * naming its roles); embeddings go to the model named, or the default embed model. */
static void roles_are_checked(void)
{
    NEED();
    CHECK(refused("/v1/embeddings", "{\"model\":\"" TINY_NAME "\",\"input\":\"x\"}", 400,
                  "invalid_argument", "embed", (char *)NULL));
    CHECK(refused("/v1/rerank",
                  "{\"model\":\"" TINY_NAME "\",\"query\":\"q\",\"documents\":[\"d\"]}", 400,
                  "invalid_argument", "rerank", (char *)NULL));
    CHECK(refused("/v1/llmsd/rag",
                  "{\"model\":\"" TINY_NAME "\",\"kb\":\"k\",\"question\":\"q\"}", 400,
                  "invalid_argument", DEFAULT_NAME, (char *)NULL));
    if (!encoder[0])
        SKIP("no bert encoder (../shared/testdata/vocab/ggml-vocab-bert-bge.gguf is absent)");
    CHECK(refused("/v1/chat/completions",
                  "{\"model\":\"" ENC_NAME "\",\"messages\":[{\"role\":\"user\",\"content\":"
                  "\"x\"}]}",
                  400, "invalid_argument", "generate", (char *)NULL));
    CHECK(refused("/v1/embeddings", "{\"model\":\"" DEFAULT_NAME "\",\"input\":\"x\"}", 400,
                  "invalid_argument", "embed", (char *)NULL));
    llms_conn *c = proc_connect(&daemon_, "hm-native");
    CHECK(c);
    const char *texts[] = {"a cat sat"};
    llms_embeddings want;
    CHECK(llms_embed_model(c, ENC_NAME, texts, 1, LLMS_POOLING_MEAN, &want) == LLMS_OK);
    llms_close(c);
    const char *bodies[] = {"{\"model\":\"" ENC_NAME "\",\"input\":\"a cat sat\"}",
                            "{\"input\":\"a cat sat\"}"};
    for (int i = 0; i < 2; i++) {
        int st;
        json_object *o = httpc_post_json(hsock, "/v1/embeddings", bodies[i], &st), *v;
        CHECK(o);
        CHECK_EQ(st, 200);
        CHECK(strcmp(httpc_jstr(o, "model"), ENC_NAME) == 0);
        CHECK(json_object_object_get_ex(json_object_array_get_idx(
                                            json_object_object_get(o, "data"), 0),
                                        "embedding", &v));
        CHECK_EQ(json_object_array_length(v), want.dim);
        for (uint32_t d = 0; d < want.dim; d++)
            CHECK_NEAR(json_object_get_double(json_object_array_get_idx(v, d)), want.values[d],
                       1e-6);
        json_object_put(o);
    }
    llms_embeddings_free(&want);
}

/* A chat on a context names the context's model or none; another is refused (409). */
static void context_keeps_its_model(void)
{
    NEED();
    llms_conn *c = proc_connect(&daemon_, LLMS_DEFAULT_APP);
    CHECK(c);
    char id[LLMS_ID_MAX];
    llms_params p = proc_greedy(MAX_TOKENS, TINY_NAME);
    CHECK(llms_context_create(c, NULL, &p, id) == LLMS_OK);
    const char *names[] = {TINY_NAME, DEFAULT_NAME};
    for (int i = 0; i < 2; i++) {
        char body[512];
        snprintf(body, sizeof body,
                 "{\"model\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                 "\"max_tokens\":4,\"llmsd\":{\"context\":\"%s\"}}",
                 names[i], id);
        if (i == 0) {
            int st;
            json_object *o = httpc_post_json(hsock, "/v1/chat/completions", body, &st);
            CHECK_MSG(o && st == 200, "%d", st);
            json_object_put(o);
        } else {
            CHECK(refused("/v1/chat/completions", body, 409, "failed_precondition",
                          "'" TINY_NAME "'", (char *)NULL));
        }
    }
    CHECK(llms_context_delete(c, id) == LLMS_OK);
    llms_close(c);
}

/* A model loaded at run time is listed and served at once; unloaded, it is 404. */
static void loaded_model_served_until_unloaded(void)
{
    NEED();
    llms_conn *c = proc_connect(&daemon_, "hm-admin");
    CHECK(c);
    CHECK_MSG(llms_model_load(c, LATE_NAME, late_path, "generate") == LLMS_OK, "%s",
              llms_last_error(c));
    json_object *list = get_models();
    CHECK(list);
    bool seen = listed(list, LATE_NAME) != NULL;
    json_object_put(list);
    CHECK(seen);
    llms_result want;
    CHECK(native_chat(LATE_NAME, &want) == 0);
    char body[1024];
    chat_body(body, sizeof body, LATE_NAME, false);
    int st;
    json_object *o = httpc_post_json(hsock, "/v1/chat/completions", body, &st);
    CHECK(o);
    CHECK_EQ(st, 200);
    CHECK_MSG(strcmp(httpc_jstr(o, "choices.0.message.content"), want.text) == 0,
              "'%s' vs '%s'", httpc_jstr(o, "choices.0.message.content"), want.text);
    CHECK_EQ(atoi(httpc_jstr(o, "usage.prompt_tokens")), want.prompt_tokens);
    late_text = strdup(want.text);
    json_object_put(o);
    /* the same weights as tiny, rendered with llama3 rather than chatml */
    llms_result tiny;
    CHECK(native_chat(TINY_NAME, &tiny) == 0);
    CHECK_MSG(tiny.prompt_tokens != want.prompt_tokens, "%u prompt tokens with either template",
              want.prompt_tokens);
    llms_result_free(&tiny);
    llms_result_free(&want);

    CHECK_MSG(llms_model_unload(c, LATE_NAME) == LLMS_OK, "%s", llms_last_error(c));
    llms_close(c);
    list = get_models();
    CHECK(list);
    seen = listed(list, LATE_NAME) != NULL;
    json_object_put(list);
    CHECK(!seen);
    CHECK(refused("/v1/chat/completions", body, 404, "model_not_found", "'" LATE_NAME "'",
                  (char *)NULL));
}

typedef struct racer {
    atomic_int stop;
    int ok, gone, other;
    char last_other[512];
} racer;

static void *race_main(void *arg)
{
    racer *r = arg;
    char body[1024];
    chat_body(body, sizeof body, LATE_NAME, false);
    while (!atomic_load(&r->stop)) {
        int st;
        json_object *o = httpc_post_json(hsock, "/v1/chat/completions", body, &st);
        const char *text = o ? httpc_jstr(o, "choices.0.message.content") : NULL;
        if (st == 200 && text && strcmp(text, late_text) == 0)
            r->ok++;
        else if (st == 404)
            r->gone++;
        else
            r->other++, snprintf(r->last_other, sizeof r->last_other, "%d %s", st,
                                 o ? json_object_to_json_string(o) : "(no JSON)");
        json_object_put(o);
    }
    return NULL;
}

/* Chats naming a model while it is loaded and unloaded again and again: each is the
 * model's text or 404 (unknown to the gateway, or gone before the worker began it). */
static void loads_race_requests(void)
{
    NEED();
    if (!late_text)
        SKIP("no reference text of the loaded model (the test before failed)");
    llms_conn *c = proc_connect(&daemon_, "hm-admin");
    CHECK(c);
    racer r = {0};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, race_main, &r) == 0);
    int loads = 0;
    for (int i = 0; i < RACE_CYCLES; i++) {
        if (llms_model_load(c, LATE_NAME, late_path, "generate") != LLMS_OK)
            break;
        loads++;
        usleep(100000);
        /* an unload is refused while a request runs on the model: again after it */
        enum llms_status s;
        double deadline = proc_now() + 30;
        while ((s = llms_model_unload(c, LATE_NAME)) == LLMS_ERR_FAILED_PRECONDITION &&
               proc_now() < deadline)
            usleep(2000);
        if (s != LLMS_OK)
            break;
        usleep(50000);
    }
    atomic_store(&r.stop, 1);
    pthread_join(th, NULL);
    llms_close(c);
    CHECK_MSG(loads == RACE_CYCLES, "%d of %d load/unload cycles", loads, RACE_CYCLES);
    fprintf(stderr, "(%d answered, %d 404)\n", r.ok, r.gone);
    CHECK_MSG(r.other == 0, "%d answers neither the model's text nor 404, the last: %s", r.other,
              r.last_other);
    CHECK(r.ok + r.gone > 0);
}

/* The daemon's files: stories260K as it is, two copies of TinyStories-656K with a chat
 * template each (tiny: chatml, late: llama3), and the encoder when the bert vocabulary is
 * there; a path stays empty when its file cannot be made. */
static void make_models(void)
{
    char err[ERR_MAX];
    const char *p = test_data_path("models/stories260K.gguf");
    stories = p ? strcpy(stories_path, p) : NULL;
    if ((p = test_data_path("models/TinyStories-656K-Q8_0.gguf"))) {
        char src[1024];
        snprintf(src, sizeof src, "%s", p);
        proc_fmt(tiny_path, sizeof tiny_path, "%s/tiny-chatml.gguf", test_tmpdir());
        proc_fmt(late_path, sizeof late_path, "%s/late-llama3.gguf", test_tmpdir());
        if (gguf_copy_with_str(src, tiny_path, "tokenizer.chat_template",
                               "{% for m in messages %}<|im_start|>{{ m.role }}\n"
                               "{{ m.content }}<|im_end|>\n{% endfor %}",
                               err) < 0 ||
            gguf_copy_with_str(src, late_path, "tokenizer.chat_template",
                               "{% for m in messages %}<|start_header_id|>{{ m.role }}"
                               "<|end_header_id|>\n\n{{ m.content }}<|eot_id|>{% endfor %}",
                               err) < 0) {
            fprintf(stderr, "copy of %s: %s\n", src, err);
            tiny_path[0] = late_path[0] = '\0';
        }
    }
    const char *vp = test_data_path("vocab/ggml-vocab-bert-bge.gguf");
    gguf_file *v = vp ? gguf_open(vp, err) : NULL;
    if (v) {
        modelgen_params bp = proc_bert_params(v);
        proc_generate_model(encoder, sizeof encoder, "encoder.gguf", &bp);
        gguf_close(v);
    }
}

int main(int argc, char **argv)
{
    (void)argc;
    signal(SIGPIPE, SIG_IGN);
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    make_models();
    RUN(models_listed_with_roles);
    RUN(chat_on_each_model_equals_native);
    RUN(completion_on_each_model_equals_native);
    RUN(unknown_model_is_404);
    RUN(roles_are_checked);
    RUN(context_keeps_its_model);
    RUN(loaded_model_served_until_unloaded);
    RUN(loads_race_requests);
    if (up == 1 && proc_stop(&daemon_, SIGTERM) != 0)
        fprintf(stderr, "llmsd did not exit cleanly\n");
    free(late_text);
    return test_finish();
}
