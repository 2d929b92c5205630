/*
 * llama.cpp's POST /infill on the HTTP gateway (daemon/net/llamacpp.c, daemon/infill.h)
 * end to end, as editor plugins (llama.vim, llama.vscode) call it. No model of the shared
 * test data has fill-in-the-middle tokens, so the model is made here: random weights
 * (engine/gguf/modelgen.h, mkmodel's generator) on a vocabulary written for the test:
 * BOS and EOS, the six FIM tokens spelled as Qwen2.5-Coder spells them, control tokens
 * named by llama.cpp's tokenizer.ggml.fim_*_token_id keys, then one token per character
 * (no merges, no space prefix), so that the test spells each expected prompt out itself,
 * without the daemon's tokenizer. The prompt is checked three ways: its count
 * (tokens_evaluated), its text ("prompt", the tokens written back with their special
 * ones, as llama.cpp's server gives it) and the reply, which is /completion's for the
 * token ids the test lays out (greedy text and n_probs' log-probabilities alike); then
 * the budget's cut of a long prefix, suffix and extra context, streaming, FIM_SEP
 * ending a reply, the refusals (400, llama.cpp's shape), the model's name, and random
 * bodies (never a 5xx); ollama's /api/generate with a suffix, laid out as ollama's
 * templates of code models write it. The model without FIM tokens (501) is
 * test_http_llamacpp's (ollama's 400 test_http_ollama's).
 */
#include <json-c/json.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf/gguf.h"
#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"
#include "tests/integration/httpc.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/integration/randjson.h"
#include "tests/support/test.h"

/* the vocabulary: specials, FIM tokens, '\n' as a byte, ' '..'~', fillers */
enum { UNK, BOS, EOS, PRE, SUF, MID, PAD, REP, SEP, NL, FIRST_CHAR, N_VOCAB = 160 };

#define N_CTX 512            /* the daemon's window: a batch of 256 in the budget */
#define MAX_TEXT_BYTES 4096  /* an infill's texts together, at most */

static const char *const fim_texts[] = {"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>",
                                        "<|fim_pad|>",    "<|repo_name|>",  "<|file_sep|>"};

static char llmsd_path[1024], model_path[1024], second_path[1024], hsock[700];
static llmsd_proc daemon_;
static int daemon_up;

/* Writes the vocabulary to path. 0 or -1. */
static int write_vocab(const char *path)
{
    static const char *const keys[] = {"fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep",
                                       "fim_sep"};
    static char names[N_VOCAB][16];
    const char *texts[N_VOCAB];
    float scores[N_VOCAB] = {0};
    int32_t types[N_VOCAB];
    for (int i = 0; i < N_VOCAB; i++) {
        types[i] = i == UNK ? 2 : i < NL ? 3 : i == NL ? 6 : 1;
        if (i < PRE)
            texts[i] = i == UNK ? "<unk>" : i == BOS ? "<s>" : "</s>";
        else if (i < NL)
            texts[i] = fim_texts[i - PRE];
        else if (i == NL)
            texts[i] = "<0x0A>";
        else if (i == FIRST_CHAR)
            texts[i] = "\xe2\x96\x81"; /* SentencePiece writes a space as U+2581 */
        else
            texts[i] = names[i];
        if (i > FIRST_CHAR && i < FIRST_CHAR + 95)
            snprintf(names[i], sizeof names[i], "%c", ' ' + i - FIRST_CHAR);
        else if (i > FIRST_CHAR)
            snprintf(names[i], sizeof names[i], "tok%d", i);
    }
    char err[ERR_MAX];
    gguf_writer *w = gguf_writer_new();
    bool ok =
        w && gguf_writer_set_str(w, "tokenizer.ggml.model", "llama") == 0 &&
        gguf_writer_set_str_arr(w, "tokenizer.ggml.tokens", texts, N_VOCAB) == 0 &&
        gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_FLOAT32, scores, N_VOCAB) == 0 &&
        gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_INT32, types, N_VOCAB) == 0 &&
        gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", false) == 0;
    for (size_t i = 0; ok && i < sizeof keys / sizeof *keys; i++) {
        char key[64];
        snprintf(key, sizeof key, "tokenizer.ggml.%s_token_id", keys[i]);
        ok = gguf_writer_set_u32(w, key, PRE + (uint32_t)i) == 0;
    }
    ok = ok && gguf_writer_write(w, path, err) == 0;
    if (!ok)
        fprintf(stderr, "vocabulary: %s\n", err);
    gguf_writer_free(w);
    return ok ? 0 : -1;
}

/* The model, a small llama on that vocabulary, into model_path, and another of other
 * weights into second_path (each "" when it fails). */
static void make_models(void)
{
    char vocab_path[1024], err[ERR_MAX];
    proc_fmt(vocab_path, sizeof vocab_path, "%s/fim-vocab.gguf", test_tmpdir());
    gguf_file *vocab = write_vocab(vocab_path) == 0 ? gguf_open(vocab_path, err) : NULL;
    if (!vocab)
        return;
    modelgen_params mp = {
        .arch = "llama", .dim = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 128,
        .n_ctx = 2048, .type = QTYPE_F32, .seed = 11, .vocab = vocab, .n_threads = 1,
    };
    proc_generate_model(model_path, sizeof model_path, "fim.gguf", &mp);
    mp.seed = 12;
    proc_generate_model(second_path, sizeof second_path, "fim-second.gguf", &mp);
    gguf_close(vocab);
}

/* The daemon: the model, and a second generate model ("second"). */
static int start_daemon(void)
{
    char extra[2048];
    proc_fmt(hsock, sizeof hsock, "%s/fim-h.sock", test_tmpdir());
    proc_fmt(extra, sizeof extra,
             "http_socket = %s\nn_ctx = %d\nmax_text_bytes = %d\nmodel.second = %s generate\n",
             hsock, N_CTX, MAX_TEXT_BYTES, second_path);
    return proc_start(&daemon_, llmsd_path, "fim", model_path, extra);
}

#define NEED()                                                                 \
    do {                                                                       \
        if (!llmsd_path[0])                                                    \
            SKIP("llmsd is not built in this tree");                           \
        if (!model_path[0] || !second_path[0])                                 \
            SKIP("the test model could not be made");                          \
        if (!daemon_up)                                                        \
            daemon_up = start_daemon() == 0 ? 1 : -1;                          \
        CHECK_MSG(daemon_up == 1, "llmsd did not start");                      \
    } while (0)

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

static bool jeq(json_object *o, const char *path, const char *want)
{
    const char *s = httpc_jstr(o, path);
    return s && strcmp(s, want) == 0;
}

/* ---- the expected prompt, laid out here ---- */

#define IDS_MAX 2048

typedef struct ids {
    int32_t v[IDS_MAX];
    int n;
} ids;

static void add(ids *t, int32_t id)
{
    if (t->n < IDS_MAX)
        t->v[t->n++] = id;
}

/* s's tokens: one per character ('\n' the byte token) */
static void add_text(ids *t, const char *s)
{
    for (; *s; s++)
        add(t, *s == '\n' ? NL : FIRST_CHAR + (*s - ' '));
}

/* An infill request of the tests: what the body holds. */
typedef struct infill {
    const char *prefix, *suffix, *prompt;
    const char *files[4], *texts[4]; /* input_extra (a NULL file: no "filename") */
    int n_extra;
    int n_predict;
} infill;

/* The prompt llama.cpp's format_infill makes of c for the daemon's window, as its code
 * lays it out (its README has the prompt after FIM_MID; the code puts it after the
 * prefix): repo-level context, BOS, FIM_PRE prefix prompt FIM_SUF suffix FIM_MID; the
 * prefix's last 3 * (256 / 4) tokens, the suffix's first 256 / 4 - 2 - |prompt|, the
 * context's last N_CTX - 256 - 2 * n_predict (a batch of 256: half the window). */
static void expected(const infill *c, ids *out)
{
    ids extra = {.n = 0}, prefix = {.n = 0}, suffix = {.n = 0}, prompt = {.n = 0};
    add(&extra, REP), add_text(&extra, "myproject\n");
    for (int i = 0; i < c->n_extra; i++) {
        add(&extra, SEP), add_text(&extra, c->files[i] ? c->files[i] : "tmp");
        add_text(&extra, "\n"), add_text(&extra, c->texts[i]);
    }
    add(&extra, SEP), add_text(&extra, "filename\n");
    add_text(&prefix, c->prefix);
    add_text(&suffix, c->suffix);
    add_text(&prompt, c->prompt);
    int batch = N_CTX / 2;
    int take_prefix = prefix.n < 3 * (batch / 4) ? prefix.n : 3 * (batch / 4);
    int room = batch / 4 - 2 - prompt.n, take_suffix = suffix.n < room ? suffix.n : room;
    room = N_CTX - batch - 2 * c->n_predict;
    int take_extra = extra.n < room ? extra.n : room;
    out->n = 0;
    for (int i = extra.n - (take_extra > 0 ? take_extra : 0); i < extra.n; i++)
        add(out, extra.v[i]);
    add(out, BOS), add(out, PRE);
    for (int i = prefix.n - take_prefix; i < prefix.n; i++)
        add(out, prefix.v[i]);
    for (int i = 0; i < prompt.n; i++)
        add(out, prompt.v[i]);
    add(out, SUF);
    for (int i = 0; i < take_suffix; i++)
        add(out, suffix.v[i]);
    add(out, MID);
}

/* The text of t as llama.cpp's server writes a prompt back: special tokens as written. */
static void ids_text(const ids *t, char *out, size_t cap)
{
    size_t at = 0;
    for (int i = 0; i < t->n && at + 20 < cap; i++) {
        int32_t id = t->v[i];
        if (id == BOS || (id >= PRE && id < NL))
            at += (size_t)snprintf(out + at, cap - at, "%s",
                                   id == BOS ? "<s>" : fim_texts[id - PRE]);
        else
            out[at++] = id == NL ? '\n' : (char)(' ' + id - FIRST_CHAR);
    }
    out[at] = '\0';
}

/* c as an /infill body with more fields (",..." or ""), into body. */
static void infill_body(const infill *c, const char *more, char *body, size_t cap)
{
    json_object *o = json_object_new_object(), *extra = json_object_new_array();
    json_object_object_add(o, "input_prefix", json_object_new_string(c->prefix));
    json_object_object_add(o, "input_suffix", json_object_new_string(c->suffix));
    json_object_object_add(o, "prompt", json_object_new_string(c->prompt));
    for (int i = 0; i < c->n_extra; i++) {
        json_object *e = json_object_new_object();
        if (c->files[i])
            json_object_object_add(e, "filename", json_object_new_string(c->files[i]));
        json_object_object_add(e, "text", json_object_new_string(c->texts[i]));
        json_object_array_add(extra, e);
    }
    json_object_object_add(o, "input_extra", extra);
    json_object_object_add(o, "n_predict", json_object_new_int(c->n_predict));
    const char *s = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN);
    snprintf(body, cap, "%.*s%s}", (int)strlen(s) - 1, s, more);
    json_object_put(o);
}

/* /infill of c is the prompt expected() lays out: its count, its text, and the reply
 * /completion gives for those ids (greedy, with the alternatives' log-probabilities). */
static void check_infill(const infill *c)
{
    ids want;
    expected(c, &want);
    static char body[16384], text[16384];
    infill_body(c, ",\"temperature\":0,\"n_probs\":2", body, sizeof body);
    int st;
    json_object *o = post("/infill", body, &st);
    CHECK_MSG(st == 200 && httpc_jstr(o, "content"), "%d %s", st, json_text(o));
    ids_text(&want, text, sizeof text);
    CHECK_MSG(jint(o, "tokens_evaluated") == want.n && jeq(o, "prompt", text),
              "%d tokens, want %d: prompt\n%s\nwant\n%s", (int)jint(o, "tokens_evaluated"),
              want.n, httpc_jstr(o, "prompt"), text);
    CHECK_MSG(jeq(o, "stop", "true") && httpc_jget(o, "generation_settings") &&
                  jint(o, "generation_settings.n_predict") == c->n_predict &&
                  httpc_jget(o, "timings") && httpc_jget(o, "completion_probabilities"),
              "%s", json_text(o));
    size_t at = (size_t)snprintf(body, sizeof body, "{\"prompt\":[");
    for (int i = 0; i < want.n; i++)
        at += (size_t)snprintf(body + at, sizeof body - at, "%s%d", i ? "," : "", want.v[i]);
    snprintf(body + at, sizeof body - at, "],\"n_predict\":%d,\"temperature\":0,\"n_probs\":2}",
             c->n_predict);
    json_object *ref = post("/completion", body, &st);
    CHECK_MSG(st == 200 && jeq(o, "content", httpc_jstr(ref, "content")) &&
                  jint(ref, "tokens_evaluated") == want.n &&
                  json_object_equal(httpc_jget(o, "completion_probabilities"),
                                    httpc_jget(ref, "completion_probabilities")),
              "/infill %s\n/completion %s", json_text(o), json_text(ref));
    json_object_put(ref);
    json_object_put(o);
}

/* ---- tests ---- */

/* The vocabulary is one token per character, as the expected prompts assume. */
static void vocabulary_is_as_written(void)
{
    NEED();
    int st;
    json_object *o = post("/tokenize", "{\"content\":\"ab\\n<|file_sep|>\"}", &st);
    char want[64];
    snprintf(want, sizeof want, "[%d,%d,%d,%d]", FIRST_CHAR + 'a' - ' ', FIRST_CHAR + 'b' - ' ',
             NL, SEP);
    CHECK_MSG(st == 200 && !strcmp(json_object_to_json_string_ext(httpc_jget(o, "tokens"),
                                                                   JSON_C_TO_STRING_PLAIN),
                                   want),
              "%d %s, want %s", st, json_text(o), want);
    json_object_put(o);
}

/* The repo-level layout: each input_extra chunk after FIM_SEP and its file's name ("tmp"
 * when it has none), the prompt after the prefix. */
static void infill_is_the_fim_prompt(void)
{
    NEED();
    infill c = {.prefix = "def add(a, b):\n    ",
                .suffix = "\n\nprint(add(1, 2))\n",
                .prompt = "return",
                .files = {"util.py", NULL},
                .texts = {"import os\n", "x = 1\n"},
                .n_extra = 2,
                .n_predict = 6};
    check_infill(&c);
    /* no extra context, no prompt: the project's and the file's lines alone */
    infill bare = {.prefix = "a", .suffix = "b", .prompt = "", .n_predict = 3};
    check_infill(&bare);
}

/* A prefix, a suffix and a context longer than the budget keep the prefix's end, the
 * suffix's start and the context's end. */
static void long_prefix_and_suffix_are_cut(void)
{
    NEED();
    static char prefix[301], suffix[101], big[401];
    for (int i = 0; i < 300; i++)
        prefix[i] = (char)('a' + i % 26);
    for (int i = 0; i < 100; i++)
        suffix[i] = (char)('A' + i % 26);
    for (int i = 0; i < 400; i++)
        big[i] = (char)('0' + i % 10);
    infill c = {.prefix = prefix, .suffix = suffix, .prompt = "x", .files = {"big.txt"},
                .texts = {big}, .n_extra = 1, .n_predict = 8};
    ids want;
    expected(&c, &want);
    /* 240 of the context's 430 tokens, 192 of the prefix's 300, 61 of the suffix's 100 */
    CHECK_EQ(want.n, 240 + 2 + 192 + 1 + 1 + 61 + 1);
    check_infill(&c);
}

/* Streamed, the events add up to the whole reply, the last with the counts. */
static void streamed_equals_whole(void)
{
    NEED();
    infill c = {.prefix = "int main(void)\n{\n", .suffix = "\n}\n", .prompt = "    ",
                .n_predict = 12};
    char body[1024];
    infill_body(&c, ",\"temperature\":0", body, sizeof body);
    int st;
    json_object *whole = post("/infill", body, &st);
    CHECK_MSG(st == 200, "%d %s", st, json_text(whole));
    infill_body(&c, ",\"temperature\":0,\"stream\":true", body, sizeof body);
    httpc_reply r;
    CHECK(httpc_do(hsock, 0, "POST", "/infill", NULL, body, &r) == 0);
    CHECK_MSG(r.status == 200 && strstr(r.head, "text/event-stream"), "%d %s", r.status, r.body);
    char got[4096] = "";
    json_object *last = NULL;
    char *save;
    for (char *line = strtok_r(r.body, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        json_object_put(last);
        last = strncmp(line, "data: ", 6) == 0 ? json_tokener_parse(line + 6) : NULL;
        CHECK_MSG(last && httpc_jstr(last, "content"), "event '%s'", line);
        if (strlen(got) + strlen(httpc_jstr(last, "content")) < sizeof got)
            strcat(got, httpc_jstr(last, "content"));
    }
    httpc_reply_free(&r);
    CHECK_MSG(last && jeq(last, "stop", "true") && jeq(whole, "content", got) &&
                  jint(last, "tokens_evaluated") == jint(whole, "tokens_evaluated") &&
                  jint(last, "tokens_predicted") == jint(whole, "tokens_predicted"),
              "streamed '%s', last %s, whole %s", got, json_text(last), json_text(whole));
    json_object_put(last);
    json_object_put(whole);
}

/* FIM_SEP ends the reply, as llama.cpp counts it among the end-of-generation tokens: a
 * model that would go on to another file stops. */
static void file_separator_ends_the_reply(void)
{
    NEED();
    infill c = {.prefix = "a", .suffix = "b", .prompt = "", .n_predict = 8};
    char body[1024], more[64];
    snprintf(more, sizeof more, ",\"logit_bias\":[[%d,100]]", SEP);
    infill_body(&c, more, body, sizeof body);
    int st;
    json_object *o = post("/infill", body, &st);
    CHECK_MSG(st == 200 && jeq(o, "stop_type", "eos") && jeq(o, "content", "") &&
                  jint(o, "tokens_predicted") <= 1,
              "%d %s", st, json_text(o));
    json_object_put(o);
}

/* ollama's /api/generate with a suffix fills in the middle as ollama's templates of code
 * models write it (qwen2.5-coder's: FIM_PRE prompt FIM_SUF suffix FIM_MID, nothing of
 * llama.cpp's repo-level lines, nothing cut): the reply is /completion's for those ids
 * (greedy); "raw" and "system", which such a prompt leaves out, are refused, and the
 * default generate model is the one whose tokenizer the gateway holds. */
static void ollama_suffix_is_fill_in_the_middle(void)
{
    NEED();
    ids want = {.n = 0};
    add(&want, BOS), add(&want, PRE), add_text(&want, "def f(x):\n");
    add(&want, SUF), add_text(&want, "    return y\n"), add(&want, MID);
    int st;
    json_object *o = post("/api/generate",
                          "{\"model\":\"fim\",\"prompt\":\"def f(x):\\n\",\"suffix\":"
                          "\"    return y\\n\",\"stream\":false,\"options\":{\"temperature\":0,"
                          "\"num_predict\":12}}", &st);
    CHECK_MSG(st == 200 && httpc_jstr(o, "response"), "%d %s", st, json_text(o));
    CHECK_MSG(jint(o, "prompt_eval_count") == want.n, "%d tokens, want %d: %s",
              (int)jint(o, "prompt_eval_count"), want.n, json_text(o));
    char body[4096];
    size_t at = (size_t)snprintf(body, sizeof body, "{\"prompt\":[");
    for (int i = 0; i < want.n; i++)
        at += (size_t)snprintf(body + at, sizeof body - at, "%s%d", i ? "," : "", want.v[i]);
    snprintf(body + at, sizeof body - at, "],\"n_predict\":12,\"temperature\":0}");
    json_object *ref = post("/completion", body, &st);
    CHECK_MSG(st == 200 && jeq(o, "response", httpc_jstr(ref, "content")),
              "/api/generate %s\n/completion %s", json_text(o), json_text(ref));
    json_object_put(ref);
    json_object_put(o);
    static const struct {
        const char *body;
        int status;
        const char *says;
    } bad[] = {
        {"{\"model\":\"fim\",\"prompt\":\"a\",\"suffix\":\"b\",\"raw\":true}", 400, "raw"},
        {"{\"model\":\"fim\",\"prompt\":\"a\",\"suffix\":\"b\",\"system\":\"s\"}", 400,
         "system"},
        {"{\"model\":\"fim\",\"prompt\":\"a\",\"suffix\":1}", 400, "suffix"},
        {"{\"model\":\"second\",\"prompt\":\"a\",\"suffix\":\"b\"}", 400, "default"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        o = post("/api/generate", bad[i].body, &st);
        const char *err = httpc_jstr(o, "error");
        CHECK_MSG(st == bad[i].status && err && strstr(err, bad[i].says), "%s: %d %s",
                  bad[i].body, st, json_text(o));
        json_object_put(o);
    }
}

/* OpenAI's /v1/completions with a suffix (the legacy insert) is the same bare
 * fill-in-the-middle prompt as ollama's: the prompt count is the ids laid out here, the
 * text /completion's for those ids (greedy); a suffix on another model than the default,
 * or one that is not a string, is refused naming it. */
static void openai_suffix_is_fill_in_the_middle(void)
{
    NEED();
    ids want = {.n = 0};
    add(&want, BOS), add(&want, PRE), add_text(&want, "x = [");
    add(&want, SUF), add_text(&want, "]\nprint(x)\n"), add(&want, MID);
    int st;
    json_object *o = post("/v1/completions",
                          "{\"model\":\"fim\",\"prompt\":\"x = [\",\"suffix\":\"]\\nprint(x)\\n\","
                          "\"max_tokens\":10,\"temperature\":0}", &st);
    CHECK_MSG(st == 200 && httpc_jstr(o, "choices.0.text"), "%d %s", st, json_text(o));
    CHECK_MSG(jint(o, "usage.prompt_tokens") == want.n, "%d tokens, want %d: %s",
              (int)jint(o, "usage.prompt_tokens"), want.n, json_text(o));
    char body[4096];
    size_t at = (size_t)snprintf(body, sizeof body, "{\"prompt\":[");
    for (int i = 0; i < want.n; i++)
        at += (size_t)snprintf(body + at, sizeof body - at, "%s%d", i ? "," : "", want.v[i]);
    snprintf(body + at, sizeof body - at, "],\"n_predict\":10,\"temperature\":0}");
    json_object *ref = post("/completion", body, &st);
    CHECK_MSG(st == 200 && jeq(o, "choices.0.text", httpc_jstr(ref, "content")),
              "/v1/completions %s\n/completion %s", json_text(o), json_text(ref));
    json_object_put(ref);
    json_object_put(o);
    static const struct {
        const char *body, *says;
    } bad[] = {
        {"{\"model\":\"fim\",\"prompt\":\"a\",\"suffix\":1}", "suffix"},
        {"{\"model\":\"fim\",\"prompt\":[1,2],\"suffix\":\"b\"}", "prompt"},
        {"{\"model\":\"second\",\"prompt\":\"a\",\"suffix\":\"b\"}", "default"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        o = post("/v1/completions", bad[i].body, &st);
        const char *err = httpc_jstr(o, "error.message");
        CHECK_MSG(st == 400 && err && strstr(err, bad[i].says), "%s: %d %s", bad[i].body, st,
                  json_text(o));
        json_object_put(o);
    }
}

/* What is no infill is refused 400 in llama.cpp's error shape, naming the field; a model
 * that is not served is 404, another generate model than the default 400. */
static void refusals_name_the_field(void)
{
    NEED();
    static char big[MAX_TEXT_BYTES + 2], body_big[MAX_TEXT_BYTES + 128];
    memset(big, 'a', MAX_TEXT_BYTES - 1);
    snprintf(body_big, sizeof body_big,
             "{\"input_prefix\":\"%s\",\"input_suffix\":\"bc\"}", big);
    static const struct {
        const char *body;
        int status;
        const char *says;
    } bad[] = {
        {"{\"input_suffix\":\"b\"}", 400, "\"input_prefix\" is required"},
        {"{\"input_prefix\":\"a\"}", 400, "\"input_suffix\" is required"},
        {"{\"input_prefix\":[1],\"input_suffix\":\"b\"}", 400, "input_prefix"},
        {"{\"input_prefix\":\"a\",\"input_suffix\":null}", 400, "input_suffix"},
        {"{\"input_prefix\":\"a\",\"input_suffix\":\"b\",\"prompt\":[1]}", 400,
         "\"prompt\" must be a string"},
        {"{\"input_prefix\":\"a\",\"input_suffix\":\"b\",\"input_extra\":{}}", 400,
         "\"input_extra\" must be an array of {\"filename\": string, \"text\": string}"},
        {"{\"input_prefix\":\"a\",\"input_suffix\":\"b\",\"input_extra\":[{\"filename\":\"f\"}]}",
         400, "chunk must contain a \"text\" field with a string value"},
        {"{\"input_prefix\":\"a\",\"input_suffix\":\"b\",\"input_extra\":[{\"text\":1}]}", 400,
         "\"text\" field"},
        {"{\"input_prefix\":\"a\",\"input_suffix\":\"b\",\"input_extra\":[\"t\"]}", 400,
         "\"text\" field"},
        {"{\"input_prefix\":\"a\",\"input_suffix\":\"b\",\"input_extra\":[{\"text\":\"t\","
         "\"filename\":2}]}",
         400, "\"filename\" field must be a string"},
        {"{\"input_prefix\":\"a\",\"input_suffix\":\"b\",\"tfs_z\":0.5}", 400, "tfs_z"},
        {"{\"input_prefix\":\"a\",\"input_suffix\":\"b\",\"n_predict\":-2}", 400, "n_predict"},
        {"{\"input_prefix\":\"a\",\"input_suffix\":\"b\",\"model\":\"nonesuch\"}", 404,
         "nonesuch"},
        {"{\"input_prefix\":\"a\",\"input_suffix\":\"b\",\"model\":\"second\"}", 400,
         "default generate model"},
        {body_big, 400, "max_text_bytes"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int st;
        json_object *o = post("/infill", bad[i].body, &st);
        const char *m = httpc_jstr(o, "error.message");
        CHECK_MSG(st == bad[i].status && jint(o, "error.code") == bad[i].status &&
                      jeq(o, "error.type", bad[i].status == 404 ? "not_found_error"
                                                                : "invalid_request_error") &&
                      m && strstr(m, bad[i].says),
                  "%.200s: %d %s", bad[i].body, st, json_text(o));
        json_object_put(o);
    }
    /* the default model named is the default model */
    httpc_reply r;
    CHECK(httpc_do(hsock, 0, "GET", "/v1/models", NULL, NULL, &r) == 0);
    json_object *models = json_tokener_parse(r.body);
    httpc_reply_free(&r);
    const char *name = httpc_jstr(models, "data.0.id");
    CHECK_MSG(name && strcmp(name, "second"), "%s", json_text(models));
    char body[512];
    snprintf(body, sizeof body, "{\"input_prefix\":\"a\",\"input_suffix\":\"b\","
                                "\"n_predict\":1,\"model\":\"%s\"}", name);
    json_object_put(models);
    int st;
    json_object *o = post("/infill", body, &st);
    CHECK_MSG(st == 200, "%s: %d %s", body, st, json_text(o));
    json_object_put(o);
}

static const char *const keys[] = {"input_prefix", "input_suffix", "input_extra", "prompt",
                                   "filename",     "text",         "n_predict",   "stream",
                                   "temperature",  "n_probs",      "stop",        "samplers",
                                   "logit_bias",   "model",        "return_tokens"};
static const char *const words[] = {"", "a", "def f():\n", "<|fim_prefix|>", "<|file_sep|>",
                                    "\xff\xfe", "a\\u0000b", "second", "infill", "\n"};
static randjson body_gen = {0x6a09e667f3bcc909u, keys, sizeof keys / sizeof *keys, words,
                            sizeof words / sizeof *words};

/* Bodies of random fields, and valid ones with fields changed or dropped (input_extra's
 * chunks too): answered, never with a 5xx. */
static void random_bodies_never_5xx(void)
{
    NEED();
    test_random_seed(&body_gen.rng);
    int ok = 0, n = 300;
    for (int i = 0; i < n; i++) {
        json_object *body =
            randjson_pick(&body_gen, 8)
                ? json_tokener_parse("{\"input_prefix\":\"x = \",\"input_suffix\":\"\\n\","
                                     "\"input_extra\":[{\"filename\":\"a\",\"text\":\"b\"}],"
                                     "\"n_predict\":2}")
                : randjson_value(&body_gen, 1);
        for (int k = randjson_pick(&body_gen, 4);
             k > 0 && json_object_is_type(body, json_type_object); k--) {
            json_object *into = body, *extra;
            if (json_object_object_get_ex(body, "input_extra", &extra) &&
                json_object_is_type(extra, json_type_array) &&
                json_object_is_type(json_object_array_get_idx(extra, 0), json_type_object) &&
                randjson_pick(&body_gen, 2))
                into = json_object_array_get_idx(extra, 0);
            if (randjson_pick(&body_gen, 4) == 0)
                json_object_object_del(into, randjson_key(&body_gen));
            else
                json_object_object_add(into, randjson_key(&body_gen),
                                       randjson_value(&body_gen, 1));
        }
        /* bounded generations keep the test short */
        json_object *np;
        if (json_object_is_type(body, json_type_object) &&
            (!json_object_object_get_ex(body, "n_predict", &np) ||
             !json_object_is_type(np, json_type_int) || json_object_get_int64(np) > 4 ||
             json_object_get_int64(np) == -1))
            json_object_object_add(body, "n_predict", json_object_new_int(2));
        const char *text = body ? json_object_to_json_string(body) : "null";
        httpc_reply r;
        CHECK_MSG(httpc_do(hsock, 0, "POST", "/infill", NULL, text, &r) == 0, "%s: no answer",
                  text);
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

static void daemon_exits_cleanly(void)
{
    proc_check_clean_exit(&daemon_, &daemon_up);
}

int main(int argc, char **argv)
{
    (void)argc;
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    make_models();
    RUN(vocabulary_is_as_written);
    RUN(infill_is_the_fim_prompt);
    RUN(long_prefix_and_suffix_are_cut);
    RUN(streamed_equals_whole);
    RUN(file_separator_ends_the_reply);
    RUN(ollama_suffix_is_fill_in_the_middle);
    RUN(openai_suffix_is_fill_in_the_middle);
    RUN(refusals_name_the_field);
    RUN(random_bodies_never_5xx);
    RUN(daemon_exits_cleanly);
    return test_finish();
}
