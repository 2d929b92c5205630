/*
 * LoRA adapters served as models of their own over a shared base (lora.NAME lines): a
 * daemon serving docs-lm-21M-F16 and two adapter models of it ("ta": rank 8 at scale 1,
 * "tb": rank 16 at scale 1.5, llama.cpp's format, written by modelgen) answers through
 * each adapter what the adapter's merged model (modelgen_convert: W + s B A in F32, as
 * llama-export-lora) answers served as an ordinary model, greedy, on the native protocol
 * and on every HTTP route that names a model (OpenAI's /v1/completions, ollama's
 * /api/generate, llama.cpp's /completion, and llama.cpp's per-request "lora" with the
 * ids of GET /lora-adapters); the base answers as it does alone; requests
 * on the base and both adapters at once answer as alone; contexts belong to their
 * adapter model; an adapter that does not fit the base is refused at load (at run time,
 * with the file and what is wrong, the other models serving on; in llmsd.conf, llmsd
 * does not start); an adapter model loaded at run time serves and unloads, and its base
 * cannot go first; the base's file is mapped once: the adapters add their own bytes to
 * llmsd's memory, not a base's. Skips without the documentation models of ../shared.
 */
#include <grp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/llms.h"
#include "engine/gguf/gguf.h"
#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"
#include "tests/integration/httpc.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/support/test.h"

#define BASE_NAME "docs-lm-21M-F16"
#define N_PROMPTS 2
#define N_TOKENS 24
#define N_MODELS 3 /* the base, ta, tb */

static char llmsd_path[1024], base_path[1024], ad_a[1100], ad_b[1100], merged_a[1100],
    merged_b[1100], bad[1100];
static const char *const PROMPTS[N_PROMPTS] = {"The PostgreSQL server",
                                               "To install the package, run"};
static const char *const NAMES[N_MODELS] = {BASE_NAME, "ta", "tb"};
/* the merged daemon's names of the same three: the base, merged_a (its default), mb */
static const char *const MERGED_NAMES[N_MODELS] = {"base", "ma", "mb"};

static llmsd_proc lora_d, merged_d, plain_d;
static char lora_http[1100], merged_http[1100];
static int up; /* 1: the three daemons run; -1: one did not start */

/* Greedy replies of each model to each prompt: alone (the plain daemon for the base, the
 * merged daemon for the adapters) and through the adapter daemon. */
static char *ref[N_MODELS][N_PROMPTS];

static int start(llmsd_proc *d, const char *name, const char *model, const char *models,
                 char *http)
{
    char extra[5000];
    struct group *g = getgrgid(getgid());
    if (http)
        proc_fmt(http, 1100, "%s/%s-h.sock", test_tmpdir(), name);
    proc_fmt(extra, sizeof extra,
             "kv_compress = none\nadmin_group = %s\nthreads = 2\n%s%s%s%s", g ? g->gr_name : "root",
             http ? "http_socket = " : "", http ? http : "", http ? "\n" : "", models);
    return proc_start(d, llmsd_path, name, model, extra);
}

static int start_all(void)
{
    char models[4000];
    proc_fmt(models, sizeof models, "lora.ta = %s %s\nlora.tb = %s %s:1.5\n", BASE_NAME, ad_a,
             BASE_NAME, ad_b);
    if (start(&lora_d, "lora", base_path, models, lora_http) < 0)
        return -1;
    proc_fmt(models, sizeof models, "model.base = %s generate\nmodel.mb = %s generate\n",
             base_path, merged_b);
    if (start(&merged_d, "merged", merged_a, models, merged_http) < 0)
        return -1;
    return start(&plain_d, "plain", base_path, "", NULL);
}

#define NEED()                                                                        \
    do {                                                                              \
        if (!llmsd_path[0])                                                           \
            SKIP("llmsd is not built in this tree");                                  \
        if (!base_path[0] || !merged_b[0] || !bad[0])                                 \
            SKIP("docs-lm-21M-F16.gguf is not in the test data (set LLMS_TESTDATA), " \
                 "or its adapters could not be made");                                \
        if (!up)                                                                      \
            up = start_all() == 0 ? 1 : -1;                                           \
        CHECK_MSG(up == 1, "a daemon did not start");                                 \
    } while (0)

/* A greedy Complete of prompt on model; the text or NULL. */
static char *complete(const llmsd_proc *d, const char *app, const char *model, const char *prompt)
{
    llms_conn *c = proc_connect(d, app);
    if (!c)
        return NULL;
    llms_params p = proc_greedy(N_TOKENS, model);
    llms_result r;
    char *text = NULL;
    if (llms_complete(c, prompt, NULL, 0, &p, NULL, NULL, &r) == LLMS_OK) {
        text = strdup(r.text);
        llms_result_free(&r);
    } else {
        fprintf(stderr, "complete on %s: %s\n", model, llms_last_error(c));
    }
    llms_close(c);
    return text;
}

/* What the base answers alone and what the merged models answer as ordinary models. */
static void references(void)
{
    NEED();
    for (int i = 0; i < N_PROMPTS; i++) {
        ref[0][i] = complete(&plain_d, "ref", NULL, PROMPTS[i]);
        for (int m = 1; m < N_MODELS; m++)
            ref[m][i] = complete(&merged_d, "ref", MERGED_NAMES[m], PROMPTS[i]);
        for (int m = 0; m < N_MODELS; m++)
            CHECK(ref[m][i]);
    }
    /* the adapters change the answers: the comparisons below tell the models apart */
    for (int m = 0; m < N_MODELS; m++)
        for (int k = m + 1; k < N_MODELS; k++) {
            bool differ = false;
            for (int i = 0; i < N_PROMPTS; i++)
                differ |= strcmp(ref[m][i], ref[k][i]) != 0;
            CHECK_MSG(differ, "%s and %s answer alike", NAMES[m], NAMES[k]);
        }
    /* the merged daemon's copy of the base answers as the plain daemon */
    char *b = complete(&merged_d, "ref", MERGED_NAMES[0], PROMPTS[0]);
    CHECK(b && strcmp(b, ref[0][0]) == 0);
    free(b);
}

#define NEED_REFS()                                                            \
    do {                                                                       \
        NEED();                                                                \
        for (int m_ = 0; m_ < N_MODELS; m_++)                                  \
            for (int p_ = 0; p_ < N_PROMPTS; p_++)                             \
                if (!ref[m_][p_])                                              \
                    SKIP("no reference replies (references failed)");          \
    } while (0)

/* Each adapter model answers as its merged model; the base as alone. */
static void adapters_answer_as_merged_models(void)
{
    NEED_REFS();
    for (int m = 0; m < N_MODELS; m++)
        for (int i = 0; i < N_PROMPTS; i++) {
            char *got = complete(&lora_d, "one", NAMES[m], PROMPTS[i]);
            CHECK_MSG(got && strcmp(got, ref[m][i]) == 0, "%s, '%s': '%s', alone '%s'",
                      NAMES[m], PROMPTS[i], got ? got : "(none)", ref[m][i]);
            free(got);
        }
    /* naming none is the base, the default generate model */
    char *got = complete(&lora_d, "one", NULL, PROMPTS[0]);
    CHECK(got && strcmp(got, ref[0][0]) == 0);
    free(got);
}

/* One greedy completion of PROMPTS[0] through a route of the gateway at sock, naming
 * model; the text or NULL. */
static char *route_text(const char *sock, int route, const char *model)
{
    char body[1024];
    const char *path, *field;
    if (route == 0)
        path = "/v1/completions", field = "choices.0.text",
        snprintf(body, sizeof body,
                 "{\"model\":\"%s\",\"prompt\":\"%s\",\"max_tokens\":%d,\"temperature\":0}",
                 model, PROMPTS[0], N_TOKENS);
    else if (route == 1)
        path = "/api/generate", field = "response",
        snprintf(body, sizeof body,
                 "{\"model\":\"%s\",\"prompt\":\"%s\",\"raw\":true,\"stream\":false,"
                 "\"options\":{\"temperature\":0,\"num_predict\":%d}}",
                 model, PROMPTS[0], N_TOKENS);
    else
        path = "/completion", field = "content",
        snprintf(body, sizeof body,
                 "{\"model\":\"%s\",\"prompt\":\"%s\",\"n_predict\":%d,\"temperature\":0}",
                 model, PROMPTS[0], N_TOKENS);
    int status;
    json_object *o = httpc_post_json(sock, path, body, &status);
    const char *t = status == 200 ? httpc_jstr(o, field) : NULL;
    char *text = t ? strdup(t) : NULL;
    if (!text)
        fprintf(stderr, "%s on %s: %d %s\n", path, model, status,
                o ? json_object_to_json_string(o) : "(no JSON)");
    json_object_put(o);
    return text;
}

/* OpenAI's, ollama's and llama.cpp's routes name an adapter model as any model: each
 * answers what the merged model answers on that route; /v1/models lists the adapter
 * models with their base ("parent", as vLLM lists LoRA modules) and adapters. */
static void every_route_names_the_adapter(void)
{
    NEED_REFS();
    for (int route = 0; route < 3; route++)
        for (int m = 1; m < N_MODELS; m++) {
            char *got = route_text(lora_http, route, NAMES[m]),
                 *want = route_text(merged_http, route, MERGED_NAMES[m]);
            CHECK_MSG(got && want && strcmp(got, want) == 0, "route %d, %s: '%s', merged '%s'",
                      route, NAMES[m], got ? got : "(none)", want ? want : "(none)");
            free(got);
            free(want);
        }
    httpc_reply r;
    CHECK(httpc_do(lora_http, 0, "GET", "/v1/models/tb", NULL, NULL, &r) == 0 && r.status == 200);
    json_object *o = json_tokener_parse(r.body);
    httpc_reply_free(&r);
    const char *parent = httpc_jstr(o, "parent"), *path = httpc_jstr(o, "llmsd.adapters.0.path");
    json_object *scale = httpc_jget(o, "llmsd.adapters.0.scale");
    CHECK_MSG(parent && strcmp(parent, BASE_NAME) == 0 && path && strcmp(path, ad_b) == 0 &&
                  scale && json_object_get_double(scale) == 1.5,
              "%s", o ? json_object_to_json_string(o) : "(none)");
    json_object_put(o);
}

/* llama-server's GET /lora-adapters lists the adapter files of the default model's
 * adapter models by id (scale 0: what a request without "lora" applies), and the models
 * applying each; a request's "lora" ([{"id", "scale"}], as newer llama.cpp takes it) runs
 * on the adapter model of exactly those adapters at those scales, on /completion and
 * OpenAI's /v1/completions alike; a set no model applies, an unknown id or a malformed
 * field is refused 400, and POST /lora-adapters (global scales) 501. */
static void llamacpp_lora_field(void)
{
    NEED_REFS();
    httpc_reply r;
    CHECK(httpc_do(lora_http, 0, "GET", "/lora-adapters", NULL, NULL, &r) == 0 && r.status == 200);
    json_object *o = json_tokener_parse(r.body);
    httpc_reply_free(&r);
    CHECK_MSG(o && json_object_is_type(o, json_type_array) && json_object_array_length(o) == 2,
              "%s", o ? json_object_to_json_string(o) : "(none)");
    const char *p0 = httpc_jstr(o, "0.path"), *p1 = httpc_jstr(o, "1.path"),
               *m1 = httpc_jstr(o, "1.llmsd.models.0.model");
    CHECK(p0 && p1 && m1 && strcmp(p0, ad_a) == 0 && strcmp(p1, ad_b) == 0 && strcmp(m1, "tb") == 0);
    CHECK(httpc_jget(o, "1.id") && json_object_get_int(httpc_jget(o, "1.id")) == 1);
    CHECK(json_object_get_double(httpc_jget(o, "0.scale")) == 0.0);
    CHECK(json_object_get_double(httpc_jget(o, "1.llmsd.models.0.scale")) == 1.5);
    json_object_put(o);

    const char *routes[2] = {"/completion", "/v1/completions"};
    const char *fields[2] = {"content", "choices.0.text"};
    const char *lora[3] = {"[{\"id\":0,\"scale\":1}]", "[{\"id\":0,\"scale\":0},{\"id\":1,\"scale\":1.5}]",
                           "[]"};
    const int model[3] = {1, 2, 0};
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < 3; j++) {
            char body[1024];
            snprintf(body, sizeof body,
                     "{\"prompt\":\"%s\",\"%s\":%d,\"temperature\":0,\"lora\":%s}", PROMPTS[0],
                     k ? "max_tokens" : "n_predict", N_TOKENS, lora[j]);
            int status;
            json_object *a = httpc_post_json(lora_http, routes[k], body, &status);
            const char *t = httpc_jstr(a, fields[k]);
            char *want = route_text(lora_http, k ? 0 : 2, NAMES[model[j]]);
            CHECK_MSG(status == 200 && t && want && strcmp(t, want) == 0,
                      "%s lora %s: %d %s, %s's '%s'", routes[k], lora[j], status,
                      a ? json_object_to_json_string(a) : "(none)", NAMES[model[j]],
                      want ? want : "(none)");
            free(want);
            json_object_put(a);
        }
    const char *bad_lora[4][2] = {
        {"[{\"id\":1,\"scale\":0.5}]", "no adapter model applies these adapters"},
        {"[{\"id\":0,\"scale\":1},{\"id\":1,\"scale\":1.5}]", "no adapter model"},
        {"[{\"id\":7,\"scale\":1}]", "invalid adapter id"},
        {"{\"id\":0}", "'lora' must be an array of objects with 'id' and 'scale' fields"},
    };
    for (int j = 0; j < 4; j++) {
        char body[1024];
        snprintf(body, sizeof body, "{\"prompt\":\"x\",\"n_predict\":2,\"lora\":%s}", bad_lora[j][0]);
        int status;
        json_object *a = httpc_post_json(lora_http, "/completion", body, &status);
        const char *msg = httpc_jstr(a, "error.message");
        CHECK_MSG(status == 400 && msg && strstr(msg, bad_lora[j][1]), "lora %s: %d %s",
                  bad_lora[j][0], status, a ? json_object_to_json_string(a) : "(none)");
        json_object_put(a);
    }
    /* a model named beside it must be the one it picks */
    int status;
    json_object *a = httpc_post_json(lora_http, "/completion",
                                     "{\"prompt\":\"x\",\"n_predict\":2,\"model\":\"tb\","
                                     "\"lora\":[{\"id\":0,\"scale\":1}]}", &status);
    CHECK_MSG(status == 400 && strstr(httpc_jstr(a, "error.message"), "'lora' picks model 'ta'"),
              "%d %s", status, a ? json_object_to_json_string(a) : "(none)");
    json_object_put(a);
    CHECK(httpc_do(lora_http, 0, "POST", "/lora-adapters", NULL, "[]", &r) == 0);
    CHECK_EQ(r.status, 501);
    httpc_reply_free(&r);
}

typedef struct stream {
    int model, prompt;
    char *got;
} stream;

static void *stream_main(void *arg)
{
    stream *st = arg;
    char app[32];
    snprintf(app, sizeof app, "together-%d-%d", st->model, st->prompt);
    st->got = complete(&lora_d, app, NAMES[st->model], PROMPTS[st->prompt]);
    return NULL;
}

/* llmsd_sched_shared_steps_total of the adapter daemon's /metrics; -1 when absent. */
static long shared_steps(void)
{
    httpc_reply r;
    long n = -1;
    if (httpc_do(lora_http, 0, "GET", "/metrics", NULL, NULL, &r) == 0 && r.status == 200) {
        const char *at = strstr(r.body, "\nllmsd_sched_shared_steps_total ");
        if (at)
            n = strtol(at + strlen("\nllmsd_sched_shared_steps_total "), NULL, 10);
    }
    httpc_reply_free(&r);
    return n;
}

/* The base and both adapters, both prompts, all at once (twice): each answers as alone,
 * the steps where they all decode running them in one forward (run_step_shared). */
static void concurrent_requests_answer_as_alone(void)
{
    NEED_REFS();
    long shared_before = shared_steps();
    CHECK(shared_before >= 0);
    for (int round = 0; round < 2; round++) {
        stream st[N_MODELS * N_PROMPTS];
        pthread_t th[N_MODELS * N_PROMPTS];
        for (int m = 0; m < N_MODELS; m++)
            for (int i = 0; i < N_PROMPTS; i++)
                st[m * N_PROMPTS + i] = (stream){m, i, NULL};
        for (int k = 0; k < N_MODELS * N_PROMPTS; k++)
            pthread_create(&th[k], NULL, stream_main, &st[k]);
        for (int k = 0; k < N_MODELS * N_PROMPTS; k++) {
            pthread_join(th[k], NULL);
            const stream *s = &st[k];
            CHECK_MSG(s->got && strcmp(s->got, ref[s->model][s->prompt]) == 0,
                      "%s, '%s': together '%s', alone '%s'", NAMES[s->model], PROMPTS[s->prompt],
                      s->got ? s->got : "(none)", ref[s->model][s->prompt]);
            free(s->got);
        }
    }
    long shared = shared_steps() - shared_before;
    fprintf(stderr, "       %ld steps ran the base and its adapter models in one forward\n",
            shared);
    CHECK(shared > 0);
}

/* A context made on an adapter model is that model's and answers as the merged model's
 * context; one app's prompt cache does not carry a prompt's KV from an adapter model to
 * the base (the same prompt, in turns, answers each model's own reply). */
static void contexts_and_cache_belong_to_the_adapter(void)
{
    NEED_REFS();
    char *got[2] = {NULL, NULL};
    const llmsd_proc *d[2] = {&lora_d, &merged_d};
    const char *model[2] = {"tb", "mb"};
    for (int k = 0; k < 2; k++) {
        llms_conn *c = proc_connect(d[k], "ctx");
        CHECK(c);
        char id[LLMS_ID_MAX];
        llms_params p = proc_greedy(N_TOKENS, model[k]);
        CHECK_MSG(llms_context_create(c, NULL, &p, id) == LLMS_OK, "%s", llms_last_error(c));
        CHECK_MSG(llms_call_text(c, id, PROMPTS[1], &p, &got[k]) == LLMS_OK, "%s",
                  llms_last_error(c));
        llms_context_info info;
        CHECK(llms_context_get(c, id, 1, &info) == LLMS_OK);
        CHECK_MSG(info.model && strcmp(info.model, model[k]) == 0, "%s",
                  info.model ? info.model : "(none)");
        llms_context_info_free(&info);
        llms_close(c);
    }
    CHECK_MSG(strcmp(got[0], got[1]) == 0, "context on tb '%s', on mb '%s'", got[0], got[1]);
    free(got[0]);
    free(got[1]);
    const int order[] = {1, 0, 2, 0, 1};
    for (size_t k = 0; k < sizeof order / sizeof order[0]; k++) {
        char *t = complete(&lora_d, "cache", NAMES[order[k]], PROMPTS[0]);
        CHECK_MSG(t && strcmp(t, ref[order[k]][0]) == 0, "turn %zu, %s: '%s', alone '%s'", k,
                  NAMES[order[k]], t ? t : "(none)", ref[order[k]][0]);
        free(t);
    }
}

/* An adapter of another model is refused at a run-time load, naming the file and the
 * tensor that does not fit, and the daemon's models answer on; in llmsd.conf it stops
 * llmsd at start with the same message. */
static void bad_adapter_refused_at_load(void)
{
    NEED_REFS();
    llms_conn *c = proc_connect(&lora_d, NULL);
    CHECK(c);
    CHECK_EQ(llms_model_load_lora(c, "bad", BASE_NAME, bad), LLMS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(llms_last_error(c), bad) &&
                  strstr(llms_last_error(c), "blk.0.attn_q.weight: lora_a has shape [64, 8]"),
              "%s", llms_last_error(c));
    CHECK_EQ(llms_model_load_lora(c, "bad", "nope", ad_a), LLMS_ERR_NOT_FOUND);
    CHECK_EQ(llms_model_load_lora(c, "ta", BASE_NAME, ad_a), LLMS_ERR_FAILED_PRECONDITION);
    llms_close(c);
    for (int m = 0; m < N_MODELS; m++) {
        char *t = complete(&lora_d, "after", NAMES[m], PROMPTS[0]);
        CHECK_MSG(t && strcmp(t, ref[m][0]) == 0, "%s after the refusal: '%s'", NAMES[m],
                  t ? t : "(none)");
        free(t);
    }
    llmsd_proc d;
    char models[2000];
    proc_fmt(models, sizeof models, "lora.bad = %s %s\n", BASE_NAME, bad);
    CHECK(start(&d, "bad", base_path, models, NULL) < 0);
    FILE *f = fopen(d.log, "r");
    char log[4096] = "";
    size_t n = f ? fread(log, 1, sizeof log - 1, f) : 0;
    log[n] = '\0';
    if (f)
        fclose(f);
    CHECK_MSG(strstr(log, "model 'bad'") && strstr(log, "lora_a has shape [64, 8]"), "%s", log);
}

/* An adapter model loaded at run time (the first adapter again, as "tc") answers as its
 * merged model; its base cannot be unloaded before it; it unloads. */
static void load_and_unload_at_run_time(void)
{
    NEED_REFS();
    llms_conn *c = proc_connect(&lora_d, NULL);
    CHECK(c);
    char spec[1200];
    snprintf(spec, sizeof spec, "%s:1.0", ad_a);
    CHECK_MSG(llms_model_load_lora(c, "tc", BASE_NAME, spec) == LLMS_OK, "%s", llms_last_error(c));
    char *t = complete(&lora_d, "rt", "tc", PROMPTS[1]);
    CHECK_MSG(t && strcmp(t, ref[1][1]) == 0, "tc: '%s', merged '%s'", t ? t : "(none)", ref[1][1]);
    free(t);
    CHECK_EQ(llms_model_unload(c, BASE_NAME), LLMS_ERR_FAILED_PRECONDITION);
    CHECK_MSG(llms_model_unload(c, "tc") == LLMS_OK, "%s", llms_last_error(c));
    llms_close(c);
    c = proc_connect(&lora_d, "rt");
    CHECK(c);
    llms_params p = proc_greedy(4, "tc");
    llms_result r;
    CHECK_EQ(llms_complete(c, "x", NULL, 0, &p, NULL, NULL, &r), LLMS_ERR_NOT_FOUND);
    llms_close(c);
}

/* VmRSS of a process, bytes; 0 when unknown. */
static uint64_t rss_of(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    uint64_t kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %llu", (unsigned long long *)&kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb << 10;
}

/* The base's weights are mapped once: the registry counts each adapter model's memory as
 * its adapter's bytes and a little scratch, and llmsd serving the base and two adapters,
 * each having answered, holds less than a base's file more than llmsd serving the base
 * alone (two copies of the base would add two files). */
static void adapters_cost_their_own_bytes(void)
{
    NEED_REFS();
    llms_conn *c = proc_connect(&lora_d, "mem");
    CHECK(c);
    llms_model_info *m;
    size_t n;
    CHECK(llms_list_models(c, &m, &n) == LLMS_OK);
    uint64_t base_scratch = 0;
    for (size_t i = 0; i < n; i++)
        if (strcmp(m[i].name, BASE_NAME) == 0)
            base_scratch = m[i].scratch_bytes;
    struct stat st_a;
    CHECK(stat(ad_a, &st_a) == 0);
    for (size_t i = 0; i < n; i++) {
        if (strcmp(m[i].name, "ta") != 0)
            continue;
        fprintf(stderr, "       ta: resident %llu of its file's %llu, scratch %llu (the base's "
                        "%llu)\n", (unsigned long long)m[i].resident_bytes,
                (unsigned long long)st_a.st_size, (unsigned long long)m[i].scratch_bytes,
                (unsigned long long)base_scratch);
        CHECK(m[i].resident_bytes <= (uint64_t)st_a.st_size);
        CHECK(m[i].scratch_bytes > 0 && m[i].scratch_bytes < base_scratch / 10);
    }
    llms_model_list_free(m, n);
    llms_close(c);
    struct stat st;
    CHECK(stat(base_path, &st) == 0);
    uint64_t with = rss_of(lora_d.pid), alone = rss_of(plain_d.pid);
    fprintf(stderr, "       RSS: base and two adapters %.1f MiB, base alone %.1f MiB, the base's "
                    "file %.1f MiB\n", with / 1048576.0, alone / 1048576.0, st.st_size / 1048576.0);
    if (!TEST_RSS_BOUNDS_HOLD)
        SKIP("RSS bounds do not hold under this sanitizer");
    CHECK(with > 0 && alone > 0 && with < alone + (uint64_t)st.st_size);
}

/* A model of the base's architecture but another width, for an adapter that does not fit. */
static int make_bad(void)
{
    char err[ERR_MAX], other[1100];
    proc_fmt(other, sizeof other, "%s/other.gguf", test_tmpdir());
    modelgen_params mp = {.arch = "llama", .dim = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2,
                          .n_ff = 128, .n_ctx = 256, .type = QTYPE_F16, .seed = 3,
                          .n_vocab = 300, .n_threads = 1};
    gguf_file *g = NULL;
    int rc = -1;
    if (modelgen_write(&mp, other, err) == 0 && (g = gguf_open(other, err))) {
        modelgen_lora_params lp = {.base = g, .rank = 8, .alpha = 8, .type = QTYPE_F16,
                                   .targets = MODELGEN_LORA_LAYERS, .seed = 1, .n_threads = 1};
        rc = modelgen_write_lora(&lp, bad, err);
    }
    if (rc < 0)
        fprintf(stderr, "bad adapter: %s\n", err);
    gguf_close(g);
    return rc;
}

/* The two adapters of the base and their merged models (F32, as the reference). */
static int make_adapters(void)
{
    char err[ERR_MAX];
    gguf_file *g = gguf_open(base_path, err);
    if (!g) {
        fprintf(stderr, "%s: %s\n", base_path, err);
        return -1;
    }
    modelgen_lora_params a = {.base = g, .rank = 8, .alpha = 16, .type = QTYPE_F16,
                              .targets = MODELGEN_LORA_LAYERS, .seed = 1, .n_threads = 2};
    modelgen_lora_params b = {.base = g, .rank = 16, .alpha = 16, .type = QTYPE_F16,
                              .targets = MODELGEN_LORA_LAYERS, .seed = 2, .n_threads = 2};
    const char *pa = ad_a, *pb = ad_b;
    float one = 1.0f, tb_scale = 1.5f;
    const modelgen_mix none = MODELGEN_MIX_NONE;
    int rc = modelgen_write_lora(&a, ad_a, err) < 0 || modelgen_write_lora(&b, ad_b, err) < 0 ||
                     modelgen_convert(base_path, merged_a, QTYPE_F32, none, 1, &pa, &one, 0,
                                      err) < 0 ||
                     modelgen_convert(base_path, merged_b, QTYPE_F32, none, 1, &pb, &tb_scale, 0,
                                      err) < 0
                 ? -1
                 : 0;
    if (rc < 0)
        fprintf(stderr, "adapters: %s\n", err);
    gguf_close(g);
    return rc;
}

int main(int argc, char **argv)
{
    (void)argc;
    signal(SIGPIPE, SIG_IGN);
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    const char *p = test_data_path("models/" BASE_NAME ".gguf");
    if (p) {
        snprintf(base_path, sizeof base_path, "%s", p);
        proc_fmt(ad_a, sizeof ad_a, "%s/a.gguf", test_tmpdir());
        proc_fmt(ad_b, sizeof ad_b, "%s/b.gguf", test_tmpdir());
        proc_fmt(merged_a, sizeof merged_a, "%s/ma.gguf", test_tmpdir());
        proc_fmt(merged_b, sizeof merged_b, "%s/mb.gguf", test_tmpdir());
        proc_fmt(bad, sizeof bad, "%s/bad.gguf", test_tmpdir());
        if (make_adapters() < 0)
            merged_b[0] = '\0';
        if (make_bad() < 0)
            bad[0] = '\0';
    }
    RUN(references);
    RUN(adapters_answer_as_merged_models);
    RUN(every_route_names_the_adapter);
    RUN(llamacpp_lora_field);
    RUN(concurrent_requests_answer_as_alone);
    RUN(contexts_and_cache_belong_to_the_adapter);
    RUN(bad_adapter_refused_at_load);
    RUN(load_and_unload_at_run_time);
    RUN(adapters_cost_their_own_bytes);
    llmsd_proc *ds[] = {&lora_d, &merged_d, &plain_d};
    for (int i = 0; up == 1 && i < 3; i++)
        if (proc_stop(ds[i], SIGTERM) != 0)
            fprintf(stderr, "llmsd did not exit cleanly\n");
    for (int m = 0; m < N_MODELS; m++)
        for (int i = 0; i < N_PROMPTS; i++)
            free(ref[m][i]);
    return test_finish();
}
