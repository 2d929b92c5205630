/*
 * The model registry in a running llmsd: several models by name (a llama decoder that
 * generates, two bert encoders that embed, a bert cross-encoder that reranks), each
 * request's model or its kind's default, the errors for unknown names and missing roles,
 * the listing, loading and unloading at run time while another model's context lives
 * on (also against an Embed in flight), and contexts that outlive their model across a
 * restart. Generated models on the shared bge vocabulary: skips without it.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/llms.h"
#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/support/test.h"

static char llmsd_path[1024], decoder[1024], decoder2[1024], encoder[1024], alt[1024],
    cross[1024], cross2[1024];
static llmsd_proc daemon_;
static int up;

#define ENC_DIM 32
#define ALT_DIM 64

static int start(const char *model)
{
    char extra[5000];
    proc_fmt(extra, sizeof extra,
             "embed_model = %s\nrerank_model = %s\nmodel.alt = %s embed\n", encoder, cross,
             alt);
    return proc_start(&daemon_, llmsd_path, "registry", model, extra);
}

#define NEED()                                                                 \
    do {                                                                       \
        if (!llmsd_path[0])                                                    \
            SKIP("llmsd is not built in this tree");                           \
        if (!encoder[0])                                                       \
            SKIP("../shared/testdata/vocab/ggml-vocab-bert-bge.gguf is absent"); \
        if (!up)                                                               \
            up = start(decoder) == 0 ? 1 : -1;                                 \
        CHECK_MSG(up == 1, "llmsd did not start");                             \
    } while (0)

static const char *const TEXTS[] = {"cats sleep on warm windows", "the stock market fell"};
static const char *const DOCS[] = {"cats sleep on warm windows", "the stock market fell",
                                   "a cat naps in the sun all day"};

static enum llms_status embed(llms_conn *c, const char *model, uint32_t *dim)
{
    llms_embeddings e;
    enum llms_status s = llms_embed_model(c, model, TEXTS, 2, LLMS_POOLING_MEAN, &e);
    *dim = e.dim;
    llms_embeddings_free(&e);
    return s;
}

static enum llms_status rerank(llms_conn *c, const char *model)
{
    llms_rerank_options o;
    llms_rerank_options_init(&o);
    o.top_k = 2;
    o.model = model;
    llms_rerank_result r;
    enum llms_status s = llms_rerank(c, "where do cats sleep", DOCS, 3, &o, &r);
    llms_rerank_result_free(&r);
    return s;
}

static void models_serve_by_name_and_default(void)
{
    NEED();
    llms_conn *c = proc_connect(&daemon_, "reg");
    CHECK(c);
    uint32_t dim = 0;
    /* the embed_model shorthand is the default; model.alt answers by name */
    CHECK_MSG(embed(c, NULL, &dim) == LLMS_OK, "%s", llms_last_error(c));
    CHECK_EQ(dim, ENC_DIM);
    CHECK_MSG(embed(c, "alt", &dim) == LLMS_OK, "%s", llms_last_error(c));
    CHECK_EQ(dim, ALT_DIM);
    CHECK_MSG(embed(c, "encoder", &dim) == LLMS_OK, "%s", llms_last_error(c));
    CHECK_EQ(dim, ENC_DIM);
    CHECK_MSG(rerank(c, NULL) == LLMS_OK, "%s", llms_last_error(c));
    CHECK_MSG(rerank(c, "cross") == LLMS_OK, "%s", llms_last_error(c));
    /* generation: the default and by name */
    llms_params p;
    llms_params_init(&p);
    p.max_tokens = 4;
    p.temperature = 0;
    llms_result r;
    CHECK_MSG(llms_complete(c, "hello", NULL, 0, &p, NULL, NULL, &r) == LLMS_OK, "%s",
              llms_last_error(c));
    llms_result_free(&r);
    p.model = "decoder";
    CHECK_MSG(llms_complete(c, "hello", NULL, 0, &p, NULL, NULL, &r) == LLMS_OK, "%s",
              llms_last_error(c));
    llms_result_free(&r);
    char id[LLMS_ID_MAX];
    CHECK_MSG(llms_context_create(c, NULL, &p, id) == LLMS_OK, "%s", llms_last_error(c));
    llms_context_delete(c, id);
    llms_close(c);
}

static void wrong_names_and_roles(void)
{
    NEED();
    llms_conn *c = proc_connect(&daemon_, "reg");
    CHECK(c);
    uint32_t dim;
    CHECK_EQ(embed(c, "nope", &dim), LLMS_ERR_NOT_FOUND);
    CHECK_MSG(strstr(llms_last_error(c), "'nope'") && strstr(llms_last_error(c), "decoder") &&
                  strstr(llms_last_error(c), "alt"),
              "%s", llms_last_error(c));
    /* names that are no names: never echoed, still NOT_FOUND */
    CHECK_EQ(embed(c, "../../etc/passwd", &dim), LLMS_ERR_NOT_FOUND);
    char long_name[300];
    memset(long_name, 'x', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = '\0';
    CHECK_EQ(embed(c, long_name, &dim), LLMS_ERR_NOT_FOUND);
    CHECK_EQ(rerank(c, long_name), LLMS_ERR_NOT_FOUND);
    /* the decoder would embed, but an embed model took that role */
    CHECK_EQ(embed(c, "decoder", &dim), LLMS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(llms_last_error(c), "no embed role"), "%s", llms_last_error(c));
    CHECK_EQ(embed(c, "cross", &dim), LLMS_ERR_INVALID_ARGUMENT);
    CHECK_EQ(rerank(c, "alt"), LLMS_ERR_INVALID_ARGUMENT);
    llms_params p;
    llms_params_init(&p);
    p.model = "encoder";
    char id[LLMS_ID_MAX];
    CHECK_EQ(llms_context_create(c, NULL, &p, id), LLMS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(llms_last_error(c), "generate"), "%s", llms_last_error(c));
    p.model = "nope";
    CHECK_EQ(llms_context_create(c, NULL, &p, id), LLMS_ERR_NOT_FOUND);
    CHECK_EQ(llms_complete(c, "hi", NULL, 0, &p, NULL, NULL, NULL), LLMS_ERR_NOT_FOUND);
    llms_close(c);
}

static const llms_model_info *find(const llms_model_info *ms, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(ms[i].name, name))
            return &ms[i];
    return NULL;
}

static void models_listed_with_memory(void)
{
    NEED();
    llms_conn *c = proc_connect(&daemon_, "reg");
    CHECK(c);
    llms_model_info *ms;
    size_t n;
    CHECK_MSG(llms_list_models(c, &ms, &n) == LLMS_OK, "%s", llms_last_error(c));
    CHECK_EQ(n, 4);
    const llms_model_info *d = find(ms, n, "decoder"), *e = find(ms, n, "encoder"),
                          *a = find(ms, n, "alt"), *x = find(ms, n, "cross");
    CHECK(d && e && a && x);
    CHECK(!strcmp(d->arch, "llama") && !strcmp(d->type, "decoder"));
    CHECK_MSG(!strcmp(d->roles, "generate") && !strcmp(d->default_for, "generate"), "%s / %s",
              d->roles, d->default_for);
    CHECK(!strcmp(e->type, "encoder") && !strcmp(e->roles, "embed") &&
          !strcmp(e->default_for, "embed"));
    CHECK(!strcmp(a->roles, "embed") && !strcmp(a->default_for, ""));
    CHECK(!strcmp(x->arch, "bert") && !strcmp(x->type, "cross-encoder") &&
          !strcmp(x->roles, "rerank"));
    for (size_t i = 0; i < n; i++)
        CHECK(ms[i].file_bytes > 0 && ms[i].resident_bytes <= ms[i].file_bytes);
    CHECK(d->scratch_bytes > 0 && e->scratch_bytes > 0);
    llms_daemon_status st;
    CHECK(llms_status_get(c, &st) == LLMS_OK);
    uint64_t scratch = 0;
    for (size_t i = 0; i < n; i++)
        scratch += ms[i].scratch_bytes;
    CHECK(st.models_scratch_bytes >= d->scratch_bytes + e->scratch_bytes + a->scratch_bytes);
    CHECK(st.models_scratch_bytes <= scratch + (64u << 20));
    llms_daemon_status_free(&st);
    llms_model_list_free(ms, n);
    llms_close(c);
}

static void load_unload_keeps_contexts(void)
{
    NEED();
    llms_conn *c = proc_connect(&daemon_, "reg");
    CHECK(c);
    llms_params p;
    llms_params_init(&p);
    p.max_tokens = 3;
    p.temperature = 0;
    char id[LLMS_ID_MAX], *text;
    CHECK(llms_context_create(c, NULL, NULL, id) == LLMS_OK);
    CHECK_MSG(llms_call_text(c, id, "one", &p, &text) == LLMS_OK, "%s", llms_last_error(c));
    free(text);
    CHECK_EQ(rerank(c, "late"), LLMS_ERR_NOT_FOUND);
    CHECK_MSG(llms_model_load(c, "late", cross2, NULL) == LLMS_OK, "%s", llms_last_error(c));
    CHECK_MSG(rerank(c, "late") == LLMS_OK, "%s", llms_last_error(c));
    /* a name or a file in use, roles the file cannot serve */
    CHECK_EQ(llms_model_load(c, "late", cross, NULL), LLMS_ERR_FAILED_PRECONDITION);
    CHECK_EQ(llms_model_load(c, "again", cross2, NULL), LLMS_ERR_FAILED_PRECONDITION);
    /* a decoder embeds on a runner of its own */
    uint32_t dim = 0;
    CHECK_MSG(llms_model_load(c, "emb2", decoder2, "embed") == LLMS_OK, "%s", llms_last_error(c));
    CHECK_MSG(embed(c, "emb2", &dim) == LLMS_OK, "%s", llms_last_error(c));
    CHECK_EQ(dim, 32);
    CHECK_MSG(llms_model_unload(c, "emb2") == LLMS_OK, "%s", llms_last_error(c));
    CHECK_EQ(llms_model_load(c, "bad/name", cross2, NULL), LLMS_ERR_INVALID_ARGUMENT);
    CHECK_EQ(llms_model_load(c, "x", "/nonexistent/m.gguf", NULL), LLMS_ERR_INVALID_ARGUMENT);
    CHECK_EQ(llms_model_load(c, "x", cross2, "embed,rerank,fly"), LLMS_ERR_INVALID_ARGUMENT);
    /* draft_model is fixed at start: a model loaded to draft would never draft */
    CHECK_EQ(llms_model_load(c, "x", decoder2, "draft"), LLMS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(llms_last_error(c), "draft_model"), "%s", llms_last_error(c));
    CHECK_EQ(llms_model_unload(c, "nope"), LLMS_ERR_NOT_FOUND);
    CHECK_EQ(llms_model_unload(c, "decoder"), LLMS_ERR_FAILED_PRECONDITION);
    CHECK_MSG(llms_model_unload(c, "late") == LLMS_OK, "%s", llms_last_error(c));
    CHECK_EQ(rerank(c, "late"), LLMS_ERR_NOT_FOUND);
    /* the decoder's context goes on */
    CHECK_MSG(llms_call_text(c, id, "two", &p, &text) == LLMS_OK, "%s", llms_last_error(c));
    free(text);
    /* unloading the default embed model makes the next one with the role the default */
    CHECK(llms_model_unload(c, "encoder") == LLMS_OK);
    CHECK_MSG(embed(c, NULL, &dim) == LLMS_OK, "%s", llms_last_error(c));
    CHECK_EQ(dim, ALT_DIM);
    CHECK_MSG(llms_model_load(c, "encoder", encoder, "embed") == LLMS_OK, "%s",
              llms_last_error(c));
    CHECK(embed(c, "encoder", &dim) == LLMS_OK && dim == ENC_DIM);
    llms_close(c);
}

/*
 * Writes a copy of src whose u32 metadata key holds value instead (the bytes after the
 * key's name: its type, 4 = u32, then the value). 0, or -1 when the key is not there.
 */
static int copy_with_u32(const char *src, const char *dst, const char *key, uint32_t value)
{
    FILE *f = fopen(src, "rb");
    if (!f)
        return -1;
    static uint8_t buf[4 << 20];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    size_t klen = strlen(key);
    uint8_t *at = memmem(buf, n, key, klen);
    if (!at || at + klen + 8 > buf + n || at[klen] != 4)
        return -1;
    memcpy(at + klen + 4, &value, 4);
    if (!(f = fopen(dst, "wb")))
        return -1;
    size_t w = fwrite(buf, 1, n, f);
    return fclose(f) == 0 && w == n ? 0 : -1;
}

/* A file whose hyperparameters contradict its tensors is refused when it is loaded, for
 * any role (a reranker opens its file at its first call, which then failed INTERNAL).
 * bert.context_length is not among them: an encoder's positions are its table's rows. */
static void corrupt_hyperparameters_refused_at_load(void)
{
    NEED();
    llms_conn *c = proc_connect(&daemon_, NULL);
    CHECK(c);
    static const struct {
        const char *key;
        uint32_t value;
    } bad[] = {
        {"llama.block_count", 1000},          {"llama.block_count", 0},
        {"llama.context_length", 0},          {"llama.context_length", 0xffffffffu},
        {"llama.embedding_length", 1000},     {"llama.embedding_length", 0},
        {"llama.attention.head_count", 7},    {"llama.attention.head_count", 0},
        {"bert.block_count", 1000},           {"bert.embedding_length", 48},
        {"bert.attention.head_count", 5},     {"bert.feed_forward_length", 1000},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char path[1200];
        proc_fmt(path, sizeof path, "%s/corrupt-%zu.gguf", test_tmpdir(), i);
        const char *src = strncmp(bad[i].key, "bert.", 5) == 0 ? cross2 : decoder2;
        CHECK_MSG(copy_with_u32(src, path, bad[i].key, bad[i].value) == 0, "%s not found",
                  bad[i].key);
        enum llms_status s = llms_model_load(c, "corrupt", path, NULL);
        CHECK_MSG(s == LLMS_ERR_INVALID_ARGUMENT, "%s = %u: %s (%s)", bad[i].key,
                  (unsigned)bad[i].value, llms_status_name(s), llms_last_error(c));
        if (s == LLMS_OK)
            llms_model_unload(c, "corrupt");
    }
    llms_close(c);
}

/* An Embed on a model that another connection unloads: each request either runs on the
 * model or finds it gone, and an unload waits for no one (it is refused while the Embed
 * runs). */
#define RACE_TEXTS 128

static atomic_int embed_done;

static void *embed_many(void *arg)
{
    llms_conn *c = arg;
    static char texts[RACE_TEXTS][600];
    const char *ptrs[RACE_TEXTS];
    for (int i = 0; i < RACE_TEXTS; i++) {
        snprintf(texts[i], sizeof texts[i], "%d", i);
        for (int w = 0; w < 115; w++)
            strcat(texts[i], " cat");
        ptrs[i] = texts[i];
    }
    llms_embeddings e;
    enum llms_status s = llms_embed_model(c, "racy", ptrs, RACE_TEXTS, LLMS_POOLING_MEAN, &e);
    llms_embeddings_free(&e);
    atomic_store(&embed_done, 1);
    return (void *)(intptr_t)s;
}

/* Waits until the Embed runs on "racy" (or has ended). */
static void wait_running(llms_conn *c)
{
    for (int tries = 0; tries < 20000 && !atomic_load(&embed_done);
         tries++) {
        llms_model_info *ms;
        size_t n;
        if (llms_list_models(c, &ms, &n) != LLMS_OK)
            return;
        const llms_model_info *m = find(ms, n, "racy");
        int running = m && m->running > 0;
        llms_model_list_free(ms, n);
        if (running)
            return;
    }
}

static void unload_races_embed(void)
{
    NEED();
    llms_conn *adm = proc_connect(&daemon_, "reg"), *user = proc_connect(&daemon_, "racer");
    CHECK(adm && user);
    int refused = 0;
    for (int round = 0; round < 4; round++) {
        CHECK_MSG(llms_model_load(adm, "racy", alt, NULL) == LLMS_ERR_FAILED_PRECONDITION,
                  "alt's file is model 'alt' already: %s", llms_last_error(adm));
        CHECK_MSG(llms_model_load(adm, "racy", encoder, NULL) == LLMS_ERR_FAILED_PRECONDITION,
                  "%s", llms_last_error(adm));
        CHECK(llms_model_unload(adm, "alt") == LLMS_OK);
        CHECK_MSG(llms_model_load(adm, "racy", alt, NULL) == LLMS_OK, "%s",
                  llms_last_error(adm));
        pthread_t t;
        atomic_store(&embed_done, 0);
        CHECK(pthread_create(&t, NULL, embed_many, user) == 0);
        /* every other round unloads at once: the unload may come before the Embed */
        if (round % 2)
            wait_running(adm);
        enum llms_status s;
        while ((s = llms_model_unload(adm, "racy")) == LLMS_ERR_FAILED_PRECONDITION) {
            CHECK_MSG(strstr(llms_last_error(adm), "running"), "%s", llms_last_error(adm));
            refused++;
        }
        CHECK_EQ(s, LLMS_OK);
        void *ret;
        pthread_join(t, &ret);
        enum llms_status es = (enum llms_status)(intptr_t)ret;
        CHECK_MSG(es == LLMS_OK || es == LLMS_ERR_NOT_FOUND, "%s", llms_status_name(es));
        CHECK(llms_model_load(adm, "alt", alt, "embed") == LLMS_OK);
    }
    fprintf(stderr, "(%d unloads refused while an Embed ran)\n", refused);
    CHECK_MSG(refused > 0, "no unload met a running Embed");
    llms_close(adm);
    llms_close(user);
}

/* A context belongs to the model it was made with: under another generate model it is
 * listed and kept, and its calls are refused until that model is back. */
static void context_outlives_its_model(void)
{
    NEED();
    llms_conn *c = proc_connect(&daemon_, "keeper");
    CHECK(c);
    llms_params p;
    llms_params_init(&p);
    p.max_tokens = 3;
    p.temperature = 0;
    char id[LLMS_ID_MAX], *text;
    CHECK(llms_context_create(c, NULL, NULL, id) == LLMS_OK);
    CHECK(llms_call_text(c, id, "remember", &p, &text) == LLMS_OK);
    free(text);
    llms_close(c);
    CHECK_EQ(proc_stop(&daemon_, SIGTERM), 0);
    up = start(decoder2) == 0 ? 1 : -1;
    CHECK_MSG(up == 1, "llmsd did not start with decoder2");
    c = proc_connect(&daemon_, "keeper");
    CHECK(c);
    llms_context_info info;
    CHECK_MSG(llms_context_get(c, id, 1, &info) == LLMS_OK, "%s", llms_last_error(c));
    CHECK_EQ(info.n_history, 2);
    CHECK(info.model && strcmp(info.model, "decoder") == 0);
    llms_context_info_free(&info);
    CHECK_EQ(llms_call_text(c, id, "again", &p, &text), LLMS_ERR_FAILED_PRECONDITION);
    CHECK_MSG(strstr(llms_last_error(c), "'decoder'") && strstr(llms_last_error(c), "decoder2"),
              "%s", llms_last_error(c));
    llms_close(c);
    CHECK_EQ(proc_stop(&daemon_, SIGTERM), 0);
    up = start(decoder) == 0 ? 1 : -1;
    CHECK(up == 1);
    c = proc_connect(&daemon_, "keeper");
    CHECK(c);
    CHECK_MSG(llms_call_text(c, id, "again", &p, &text) == LLMS_OK, "%s", llms_last_error(c));
    free(text);
    llms_close(c);
}

/* A Complete with chat=1 "hi" at temperature 0: its prompt tokens and text. */
static int chat_hi(llms_conn *c, int chat, const char *prompt, llms_result *r)
{
    llms_params p = LLMS_PARAMS_INIT;
    p.temperature = 0;
    p.max_tokens = 6;
    return c ? (int)llms_complete(c, prompt, NULL, chat, &p, NULL, NULL, r) : -1;
}

/* chat_template names the default generate model's family when its file has none (the
 * generated decoder's: plain): a chat "hi" is then the chatml text, as the same text
 * sent raw shows, and no longer the plain rendering the daemon with `auto` gives. */
static void chat_template_setting(void)
{
    NEED();
    llms_conn *c = proc_connect(&daemon_, "tmpl");
    llms_result plain;
    CHECK_EQ(chat_hi(c, 1, "hi", &plain), LLMS_OK);
    llms_close(c);
    llmsd_proc d;
    CHECK_MSG(proc_start(&d, llmsd_path, "chatml", decoder, "chat_template = chatml\n") == 0,
              "llmsd did not start");
    c = proc_connect(&d, "tmpl");
    llms_result chat, raw;
    CHECK_EQ(chat_hi(c, 1, "hi", &chat), LLMS_OK);
    CHECK_EQ(chat_hi(c, 0, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", &raw),
             LLMS_OK);
    CHECK_MSG(chat.prompt_tokens == raw.prompt_tokens && !strcmp(chat.text, raw.text),
              "chatml: %u tokens '%s'; its text raw: %u tokens '%s'", chat.prompt_tokens,
              chat.text, raw.prompt_tokens, raw.text);
    CHECK_MSG(chat.prompt_tokens != plain.prompt_tokens, "as many tokens as plain (%u)",
              plain.prompt_tokens);
    llms_result_free(&chat);
    llms_result_free(&raw);
    llms_result_free(&plain);
    llms_close(c);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

int main(int argc, char **argv)
{
    (void)argc;
    signal(SIGPIPE, SIG_IGN);
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    modelgen_params mp = {.arch = "llama", .dim = 32, .n_layer = 1, .n_head = 2,
                          .n_head_kv = 2, .n_ff = 64, .n_ctx = 512, .type = QTYPE_F32,
                          .seed = 1, .n_vocab = 100, .n_threads = 1};
    proc_generate_model(decoder, sizeof decoder, "decoder.gguf", &mp);
    mp.seed = 5;
    proc_generate_model(decoder2, sizeof decoder2, "decoder2.gguf", &mp);
    const char *vp = test_data_path("vocab/ggml-vocab-bert-bge.gguf");
    char err[ERR_MAX];
    gguf_file *v = vp ? gguf_open(vp, err) : NULL;
    if (v) {
        modelgen_params bp = {.arch = "bert", .dim = ENC_DIM, .n_layer = 2, .n_head = 2,
                              .n_head_kv = 2, .n_ff = 64, .n_ctx = 128, .type = QTYPE_F16,
                              .seed = 2, .vocab = v, .n_threads = 1, .pooling_type = 1};
        proc_generate_model(encoder, sizeof encoder, "encoder.gguf", &bp);
        bp.dim = ALT_DIM;
        bp.seed = 4;
        proc_generate_model(alt, sizeof alt, "alt.gguf", &bp);
        bp.dim = ENC_DIM;
        bp.pooling_type = 4;
        bp.seed = 3;
        proc_generate_model(cross, sizeof cross, "cross.gguf", &bp);
        bp.seed = 6;
        proc_generate_model(cross2, sizeof cross2, "cross2.gguf", &bp);
        gguf_close(v);
    }
    RUN(models_serve_by_name_and_default);
    RUN(chat_template_setting);
    RUN(wrong_names_and_roles);
    RUN(models_listed_with_memory);
    RUN(load_unload_keeps_contexts);
    RUN(corrupt_hyperparameters_refused_at_load);
    RUN(unload_races_embed);
    RUN(context_outlives_its_model);
    if (up == 1 && proc_stop(&daemon_, SIGTERM) != 0)
        fprintf(stderr, "llmsd did not exit cleanly\n");
    return test_finish();
}
