/*
 * End-to-end tests of the llms-run program: they run the binary of the same build
 * (release or sanitizer) as this test and check what it prints.
 */
#include <json-c/json.h>
#include <regex.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/encoder/bert.h"
#include "engine/gguf/gguf.h"
#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"
#include "engine/tok/tokenizer.h"
#include "tests/support/test.h"

static char llms_run[1024];

static const char *stories(void)
{
    return test_data_path("models/stories260K.gguf");
}

/* The test vectors of a vocabulary: its first cases, tokenized through the CLI. */
static void check_tokenize_vectors(const char *vocab)
{
    char name[256], inp_name[256], out_name[256];
    snprintf(name, sizeof name, "vocab/%s.gguf", vocab);
    snprintf(inp_name, sizeof inp_name, "vocab/%s.gguf.inp", vocab);
    snprintf(out_name, sizeof out_name, "vocab/%s.gguf.out", vocab);
    if (!test_data_path(name) || !test_data_path(inp_name))
        SKIP("../shared/testdata/vocab is absent");

    char gguf[1024], inp[1024], expected_path[1024];
    snprintf(gguf, sizeof gguf, "%s", test_data_path(name));
    snprintf(inp, sizeof inp, "%s", test_data_path(inp_name));
    snprintf(expected_path, sizeof expected_path, "%s", test_data_path(out_name));

    /* Cases are separated by "\n__ggml_vocab_test__\n"; take the third one, which in
     * every vector file is ordinary text, and feed it without the trailing newline. */
    char cmd[4096], got[65536], expected[65536];
    snprintf(cmd, sizeof cmd,
             "awk 'BEGIN{RS=\"\\n__ggml_vocab_test__\\n\"} NR==3{printf \"%%s\", $0}' '%s' "
             "| %s -m '%s' --tokenize",
             inp, llms_run, gguf);
    CHECK_EQ(test_run_capture(cmd, got, sizeof got), 0);
    snprintf(cmd, sizeof cmd, "sed -n 3p '%s'", expected_path);
    CHECK_EQ(test_run_capture(cmd, expected, sizeof expected), 0);
    CHECK_MSG(strcmp(got, expected) == 0, "%s: got '%s', expected '%s'", vocab, got, expected);
}

static void tokenize_matches_vectors_spm(void)
{
    check_tokenize_vectors("ggml-vocab-llama-spm");
}

static void tokenize_matches_vectors_bpe(void)
{
    check_tokenize_vectors("ggml-vocab-gpt-2");
}

static void tokenize_matches_vectors_wordpiece(void)
{
    check_tokenize_vectors("ggml-vocab-bert-bge");
}

static void detokenize_inverts_tokenize(void)
{
    const char *vocab = test_data_path("vocab/ggml-vocab-gpt-2.gguf");
    if (!vocab)
        SKIP("../shared/testdata/vocab is absent");
    char cmd[4096], got[4096];
    snprintf(cmd, sizeof cmd,
             "printf 'Hello, world! 12345  tabs\\tand ünïcödé' | %s -m '%s' --tokenize "
             "| %s -m '%s' --detokenize",
             llms_run, vocab, llms_run, vocab);
    CHECK_EQ(test_run_capture(cmd, got, sizeof got), 0);
    CHECK_MSG(strcmp(got, "Hello, world! 12345  tabs\tand ünïcödé\n") == 0, "got '%s'", got);
}

static void greedy_generation_is_deterministic_across_threads_and_loads(void)
{
    if (!stories())
        SKIP("../shared/testdata/models/stories260K.gguf is absent");
    char cmd[4096], one[4096], two[4096];
    snprintf(cmd, sizeof cmd, "%s -m '%s' --ids -p 1 -n 40 --temp 0 -t 1 2>/dev/null",
             llms_run, stories());
    CHECK_EQ(test_run_capture(cmd, one, sizeof one), 0);
    snprintf(cmd, sizeof cmd, "%s -m '%s' --ids -p 1 -n 40 --temp 0 -t 2 2>/dev/null",
             llms_run, stories());
    CHECK_EQ(test_run_capture(cmd, two, sizeof two), 0);
    CHECK_MSG(strcmp(one, two) == 0, "1 thread: '%s', 2 threads: '%s'", one, two);
    /* weights read into memory instead of mapped: the same bytes, the same text */
    snprintf(cmd, sizeof cmd, "%s -m '%s' --ids -p 1 -n 40 --temp 0 -t 2 --no-mmap 2>/dev/null",
             llms_run, stories());
    CHECK_EQ(test_run_capture(cmd, two, sizeof two), 0);
    CHECK_MSG(strcmp(one, two) == 0, "mapped: '%s', read: '%s'", one, two);

    int n = 0;
    for (char *p = strtok(one, " \n"); p; p = strtok(NULL, " \n")) {
        int id = atoi(p);
        CHECK_MSG(id >= 0 && id < 512, "token id %d out of the 512-token vocabulary", id);
        n++;
    }
    CHECK_EQ(n, 40);
}

static void sampling_is_reproducible_by_seed(void)
{
    if (!stories())
        SKIP("../shared/testdata/models/stories260K.gguf is absent");
    char cmd[4096], a[4096], b[4096], c[4096];
    const char *fmt = "%s -m '%s' --ids -p 1 -n 60 --temp 1 --seed %d 2>/dev/null";
    snprintf(cmd, sizeof cmd, fmt, llms_run, stories(), 7);
    CHECK_EQ(test_run_capture(cmd, a, sizeof a), 0);
    snprintf(cmd, sizeof cmd, fmt, llms_run, stories(), 7);
    CHECK_EQ(test_run_capture(cmd, b, sizeof b), 0);
    snprintf(cmd, sizeof cmd, fmt, llms_run, stories(), 8);
    CHECK_EQ(test_run_capture(cmd, c, sizeof c), 0);
    CHECK(strcmp(a, b) == 0);
    CHECK(strcmp(a, c) != 0);
}

/* --json writes one JSON object (the trained documentation model, seeds whose object
 * closes within 96 tokens), and ends as it closes; over a short -n, a prefix of one. */
static void json_writes_an_object(void)
{
    const char *docs = test_data_path("models/docs-lm-21M-F16.gguf");
    if (!docs)
        SKIP("../shared/testdata/models/docs-lm-21M-F16.gguf is absent");
    char model[1024], cmd[4096], out[8192];
    snprintf(model, sizeof model, "%s", docs);
    int closed = 0;
    for (int seed = 1; seed <= 6; seed++) {
        snprintf(cmd, sizeof cmd,
                 "%s -m '%s' -p 'The response body is a JSON object such as\n' -n 96 "
                 "--json --seed %d 2>/dev/null",
                 llms_run, model, seed);
        CHECK_EQ(test_run_capture(cmd, out, sizeof out), 0);
        size_t n = strlen(out);
        CHECK(n > 0 && out[n - 1] == '\n'); /* the line llms-run ends its output with */
        out[--n] = '\0';
        json_object *o = json_tokener_parse(out);
        closed += o && json_object_is_type(o, json_type_object);
        json_object_put(o);
        CHECK_MSG(out[strspn(out, " \t\r\n")] == '{', "seed %d: '%s'", seed, out);
    }
    CHECK_MSG(closed > 0, "no reply of 6 closed its object");
    snprintf(cmd, sizeof cmd, "%s -m '%s' -p 'Example:\n' -n 3 --json --temp 0 2>/dev/null",
             llms_run, model);
    CHECK_EQ(test_run_capture(cmd, out, sizeof out), 0);
    CHECK_MSG(out[strspn(out, " \t\r\n")] == '{', "'%s'", out);
}

/* --json-schema FILE: the reply is an instance (an array of 2..3 integers in 1..9, which
 * closes within the token budget whatever the model prefers); a schema the engine cannot
 * enforce is an error naming the keyword. */
static void json_schema_writes_an_instance(void)
{
    const char *docs = test_data_path("models/docs-lm-21M-F16.gguf");
    if (!docs)
        SKIP("../shared/testdata/models/docs-lm-21M-F16.gguf is absent");
    char schema[1024], cmd[4096], out[8192];
    snprintf(schema, sizeof schema, "%s/llms-run-schema.json", test_tmpdir());
    FILE *f = fopen(schema, "w");
    CHECK(f && fputs("{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"minimum\":1,"
                     "\"maximum\":9},\"minItems\":2,\"maxItems\":3}", f) >= 0);
    fclose(f);
    for (int seed = 0; seed < 3; seed++) {
        snprintf(cmd, sizeof cmd, "%s -m '%s' -p 'The numbers are\n' -n 200 --json-schema '%s' "
                 "--seed %d 2>/dev/null", llms_run, docs, schema, seed);
        CHECK_EQ(test_run_capture(cmd, out, sizeof out), 0);
        json_object *o = json_tokener_parse(out);
        size_t n = o && json_object_is_type(o, json_type_array) ? json_object_array_length(o) : 0;
        bool ok = n >= 2 && n <= 3;
        for (size_t i = 0; ok && i < n; i++) {
            json_object *x = json_object_array_get_idx(o, i);
            ok = json_object_is_type(x, json_type_int) && json_object_get_int(x) >= 1 &&
                 json_object_get_int(x) <= 9;
        }
        CHECK_MSG(ok, "seed %d: '%s' is not an instance", seed, out);
        json_object_put(o);
    }
    f = fopen(schema, "w");
    CHECK(f && fputs("{\"type\":\"array\",\"uniqueItems\":true}", f) >= 0);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s -m '%s' -p x -n 4 --json-schema '%s' 2>&1", llms_run, docs,
             schema);
    CHECK(test_run_capture(cmd, out, sizeof out) != 0);
    CHECK_MSG(strstr(out, "'uniqueItems'"), "%s", out);
}

/* --grammar and --grammar-file: the reply is a sentence of the grammar (a short list
 * ending with '.', after which nothing may follow, so the reply ends there); a grammar
 * that does not compile is an error naming the rule; one constraint at a time. */
static void grammar_writes_a_sentence(void)
{
    const char *docs = test_data_path("models/docs-lm-21M-F16.gguf");
    if (!docs)
        SKIP("../shared/testdata/models/docs-lm-21M-F16.gguf is absent");
    static const char gbnf[] = "root ::= \"Ports: \" port (\", \" port){0,2} \".\"\n"
                               "port ::= [1-9] [0-9]{0,3}\n";
    char file[1024], cmd[4096], out[8192];
    snprintf(file, sizeof file, "%s/llms-run.gbnf", test_tmpdir());
    FILE *f = fopen(file, "w");
    CHECK(f && fputs(gbnf, f) >= 0);
    fclose(f);
    regex_t re;
    CHECK(regcomp(&re, "^Ports: [1-9][0-9]{0,3}(, [1-9][0-9]{0,3}){0,2}\\.$",
                  REG_EXTENDED | REG_NOSUB) == 0);
    for (int seed = 0; seed < 3; seed++) {
        snprintf(cmd, sizeof cmd, "%s -m '%s' -p 'The service listens on\n' -n 40 "
                 "--grammar-file '%s' --seed %d 2>/dev/null", llms_run, docs, file, seed);
        CHECK_EQ(test_run_capture(cmd, out, sizeof out), 0);
        out[strcspn(out, "\n")] = '\0';
        CHECK_MSG(regexec(&re, out, 0, NULL, 0) == 0, "seed %d: '%s' is not a sentence", seed,
                  out);
    }
    regfree(&re);
    snprintf(cmd, sizeof cmd, "%s -m '%s' -p x -n 4 --grammar 'root ::= item' 2>&1", llms_run,
             docs);
    CHECK(test_run_capture(cmd, out, sizeof out) != 0);
    CHECK_MSG(strstr(out, "'item'"), "%s", out);
    snprintf(cmd, sizeof cmd, "%s -m '%s' -p x -n 4 --json --grammar-file '%s' 2>&1", llms_run,
             docs, file);
    CHECK(test_run_capture(cmd, out, sizeof out) != 0);
    CHECK_MSG(strstr(out, "one of --json"), "%s", out);
}

/* --presence-penalty and --frequency-penalty reach the sampler: greedy text changes
 * (stories260K repeats itself within 40 tokens), and a value outside [-2, 2] is an error. */
static void penalties_change_greedy_text(void)
{
    if (!stories())
        SKIP("../shared/testdata/models/stories260K.gguf is absent");
    char cmd[4096], plain[4096], pen[4096];
    const char *fmt = "%s -m '%s' --ids -p 1 -n 40 --temp 0 %s 2>&1";
    snprintf(cmd, sizeof cmd, fmt, llms_run, stories(), "");
    CHECK_EQ(test_run_capture(cmd, plain, sizeof plain), 0);
    snprintf(cmd, sizeof cmd, fmt, llms_run, stories(),
             "--presence-penalty 1.5 --frequency-penalty 0.5");
    CHECK_EQ(test_run_capture(cmd, pen, sizeof pen), 0);
    CHECK_MSG(strcmp(plain, pen) != 0, "the same text with and without: %s", plain);
    snprintf(cmd, sizeof cmd, fmt, llms_run, stories(), "--frequency-penalty 3");
    CHECK_EQ(test_run_capture(cmd, pen, sizeof pen), 1);
    CHECK_MSG(strstr(pen, "frequency_penalty"), "%s", pen);
}

/* The longest run of bytes that text holds twice, the second after the end of the first. */
static int longest_repeat(const char *text)
{
    int n = (int)strlen(text), best = 0;
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) {
            int k = 0;
            while (j + k < n && i + k < j && text[i + k] == text[j + k])
                k++;
            best = k > best ? k : best;
        }
    return best;
}

/* llama.cpp's samplers under its tools' flags: DRY breaks the loop greedy decoding falls
 * into on the documentation model (a sentence said again), each of the others changes a
 * seeded text, and a value out of range is an error naming it. */
static void newer_samplers_reach_the_sampler(void)
{
    const char *docs = test_data_path("models/docs-lm-21M-F16.gguf");
    if (!docs)
        SKIP("../shared/testdata/models/docs-lm-21M-F16.gguf is absent");
    char cmd[4096], plain[8192], got[8192];
    const char *greedy = "%s -m '%s' -p 'The gateway answers' -n 120 --temp 0 %s 2>/dev/null";
    snprintf(cmd, sizeof cmd, greedy, llms_run, docs, "");
    CHECK_EQ(test_run_capture(cmd, plain, sizeof plain), 0);
    snprintf(cmd, sizeof cmd, greedy, llms_run, docs, "--dry-multiplier 0.8");
    CHECK_EQ(test_run_capture(cmd, got, sizeof got), 0);
    int loop = longest_repeat(plain), cut = longest_repeat(got);
    CHECK_MSG(loop >= 100 && cut <= 60, "%d bytes repeat without DRY, %d with: '%s'", loop, cut,
              got);
    const char *seeded = "%s -m '%s' -p 'The gateway answers' -n 32 --temp 1 --top-k 0 "
                         "--top-p 1 --min-p 0 --seed 3 %s 2>&1";
    snprintf(cmd, sizeof cmd, seeded, llms_run, docs, "");
    CHECK_EQ(test_run_capture(cmd, plain, sizeof plain), 0);
    plain[strcspn(plain, "\n")] = '\0';
    static const char *const flags[] = {
        "--mirostat 2 --mirostat-ent 3 --mirostat-lr 0.2",
        "--mirostat 1",
        "--typical 0.5 --min-keep 2",
        "--xtc-probability 1 --xtc-threshold 0.05",
        "--top-nsigma 1",
        "--dynatemp-range 0.8 --dynatemp-exp 2",
        "--dry-multiplier 3 --dry-base 2 --dry-allowed-length 0 --dry-penalty-last-n 16 "
        "--dry-sequence-breaker none",
        "--dry-multiplier 3 --dry-allowed-length 0 --dry-sequence-breaker the",
        "--temp 4 --top-k 3 --sampling-seq tk",
        "--temp 4 --top-k 3 --samplers 'temperature;top_k'",
    };
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++) {
        snprintf(cmd, sizeof cmd, seeded, llms_run, docs, flags[i]);
        CHECK_MSG(test_run_capture(cmd, got, sizeof got) == 0, "%s: %s", flags[i], got);
        got[strcspn(got, "\n")] = '\0';
        CHECK_MSG(strcmp(got, plain) != 0, "%s: the same text: '%s'", flags[i], got);
    }
    static const struct {
        const char *flags, *want;
    } bad[] = {
        {"--mirostat 3", "mirostat"}, {"--typical 1.5", "typical_p"},
        {"--xtc-probability 2", "xtc_probability"}, {"--dry-base 0.5 --dry-multiplier 1",
                                                     "dry_base"},
        {"--dynatemp-range -1", "dynatemp_range"}, {"--sampling-seq kq", "--sampling-seq"},
        {"--samplers 'top_k;warp'", "--samplers"}, {"--sampling-seq tt", "order"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(cmd, sizeof cmd, seeded, llms_run, docs, bad[i].flags);
        CHECK_MSG(test_run_capture(cmd, got, sizeof got) != 0 && strstr(got, bad[i].want),
                  "%s: %s", bad[i].flags, got);
    }
}

/* --chat-template names the family in place of the file's (stories260K has none, so
 * plain): the chat prompt is then the chatml text, as the same text given raw shows;
 * an unknown name is a usage error listing the names. */
static void chat_template_overrides_the_files(void)
{
    if (!stories())
        SKIP("../shared/testdata/models/stories260K.gguf is absent");
    char text_path[1024], cmd[4096], chat[4096], raw[4096], plain[4096];
    snprintf(text_path, sizeof text_path, "%s/chatml.txt", test_tmpdir());
    FILE *f = fopen(text_path, "w");
    CHECK(f != NULL);
    fputs("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s -m '%s' --chat --chat-template chatml -p hi -n 8 --temp 0 "
             "2>/dev/null", llms_run, stories());
    CHECK_EQ(test_run_capture(cmd, chat, sizeof chat), 0);
    snprintf(cmd, sizeof cmd, "%s -m '%s' -f '%s' -n 8 --temp 0 2>/dev/null", llms_run,
             stories(), text_path);
    CHECK_EQ(test_run_capture(cmd, raw, sizeof raw), 0);
    CHECK_MSG(strcmp(chat, raw) == 0, "chatml: '%s', the same text raw: '%s'", chat, raw);
    snprintf(cmd, sizeof cmd, "%s -m '%s' --chat -p hi -n 8 --temp 0 2>/dev/null", llms_run,
             stories());
    CHECK_EQ(test_run_capture(cmd, plain, sizeof plain), 0);
    CHECK_MSG(strcmp(chat, plain) != 0, "chatml and the file's (plain) gave '%s'", chat);
    snprintf(cmd, sizeof cmd, "%s -m '%s' --chat --chat-template chatml2 -p hi 2>&1", llms_run,
             stories());
    CHECK_EQ(test_run_capture(cmd, raw, sizeof raw), 2);
    CHECK_MSG(strstr(raw, "chatml|hermes|llama3"), "%s", raw);
}

static void perplexity_prints_llama_style_figure(void)
{
    if (!stories())
        SKIP("../shared/testdata/models/stories260K.gguf is absent");
    char text_path[1024], cmd[4096], got[4096];
    snprintf(text_path, sizeof text_path, "%s/ppl.txt", test_tmpdir());
    FILE *f = fopen(text_path, "w");
    CHECK(f != NULL);
    for (int i = 0; i < 40; i++)
        fprintf(f, "Once upon a time there was a little girl who liked to play outside. ");
    fclose(f);

    double ppl[2];
    for (int t = 1; t <= 2; t++) {
        snprintf(cmd, sizeof cmd, "%s -m '%s' --perplexity '%s' -c 128 -t %d 2>/dev/null",
                 llms_run, stories(), text_path, t);
        CHECK_EQ(test_run_capture(cmd, got, sizeof got), 0);
        CHECK_MSG(sscanf(got, "PPL = %lf", &ppl[t - 1]) == 1, "output '%s'", got);
    }
    /* The text is unfamiliar bytes to this model (its vocabulary has placeholder pieces),
     * so the figure itself says little; it must be a real, thread-independent value. */
    CHECK(isfinite(ppl[0]) && ppl[0] > 1.0);
    CHECK_NEAR(ppl[0], ppl[1], 1e-3 * ppl[0]);
}

static void bad_arguments_fail_with_a_message(void)
{
    char cmd[4096], got[4096];
    snprintf(cmd, sizeof cmd, "%s --no-such-flag 2>&1", llms_run);
    CHECK_EQ(test_run_capture(cmd, got, sizeof got), 2);
    CHECK(strstr(got, "unknown option") != NULL);

    snprintf(cmd, sizeof cmd, "%s -m /nonexistent.gguf -p hi 2>&1", llms_run);
    CHECK_EQ(test_run_capture(cmd, got, sizeof got), 1);
    CHECK(strstr(got, "/nonexistent.gguf") != NULL);

    snprintf(cmd, sizeof cmd, "%s -m x.gguf -n many 2>&1", llms_run);
    CHECK_EQ(test_run_capture(cmd, got, sizeof got), 2);

    if (!stories())
        SKIP("../shared/testdata/models/stories260K.gguf is absent");
    snprintf(cmd, sizeof cmd, "%s -m '%s' --ids -p '1 99999' 2>&1", llms_run, stories());
    CHECK_EQ(test_run_capture(cmd, got, sizeof got), 1);
    CHECK(strstr(got, "bad token id") != NULL);
}

/* --embed on a random bert with the bge vocabulary: dim unit-length values, the same
 * with 1 and 2 threads. */
static void embed_prints_a_unit_vector(void)
{
    const char *vp = test_data_path("vocab/ggml-vocab-bert-bge.gguf");
    if (!vp)
        SKIP("../shared/testdata/vocab/ggml-vocab-bert-bge.gguf is absent");
    char err[ERR_MAX], path[1024], cmd[4096], one[16384], two[16384];
    gguf_file *v = gguf_open(vp, err);
    CHECK(v);
    snprintf(path, sizeof path, "%s/bert.gguf", test_tmpdir());
    modelgen_params p = {.arch = "bert", .dim = 32, .n_layer = 2, .n_head = 2, .n_head_kv = 2,
                         .n_ff = 64, .n_ctx = 64, .type = QTYPE_F16, .seed = 3, .vocab = v,
                         .n_threads = 1, .pooling_type = 1};
    int rc = modelgen_write(&p, path, err);
    gguf_close(v);
    CHECK_MSG(rc == 0, "%s", err);
    snprintf(cmd, sizeof cmd, "echo 'The quick brown fox.' | %s -m '%s' --embed -t 1", llms_run,
             path);
    CHECK_EQ(test_run_capture(cmd, one, sizeof one), 0);
    snprintf(cmd, sizeof cmd, "echo 'The quick brown fox.' | %s -m '%s' --embed -t 2", llms_run,
             path);
    CHECK_EQ(test_run_capture(cmd, two, sizeof two), 0);
    CHECK(strcmp(one, two) == 0);
    int n = 0;
    double ss = 0;
    for (char *s = one, *end = NULL; *s && *s != '\n'; s = end, n++) {
        double x = strtod(s, &end);
        CHECK(end != s);
        ss += x * x;
    }
    CHECK_EQ(n, 32);
    CHECK_NEAR(ss, 1.0, 1e-4);
    snprintf(cmd, sizeof cmd, "echo x | %s -m '%s' --embed --pooling max 2>&1", llms_run, path);
    CHECK_EQ(test_run_capture(cmd, one, sizeof one), 2);
    CHECK(strstr(one, "--pooling") != NULL);
}

/* --embed on a random nomic-bert with the bge vocabulary prints the engine's mean-pooled
 * vector of the text. */
static void embed_on_nomic_bert_is_the_engines_vector(void)
{
    const char *vp = test_data_path("vocab/ggml-vocab-bert-bge.gguf");
    if (!vp)
        SKIP("../shared/testdata/vocab/ggml-vocab-bert-bge.gguf is absent");
    char err[ERR_MAX], path[1024], cmd[4096], got[16384];
    gguf_file *v = gguf_open(vp, err);
    CHECK(v);
    snprintf(path, sizeof path, "%s/nomic.gguf", test_tmpdir());
    modelgen_params p = {.arch = "nomic-bert", .dim = 32, .n_layer = 2, .n_head = 2,
                         .n_head_kv = 2, .n_ff = 64, .n_ctx = 64, .type = QTYPE_F16, .seed = 4,
                         .vocab = v, .n_threads = 1, .pooling_type = 1};
    int rc = modelgen_write(&p, path, err);
    gguf_close(v);
    CHECK_MSG(rc == 0, "%s", err);
    const char *text = "The quick brown fox.";
    snprintf(cmd, sizeof cmd, "echo '%s' | %s -m '%s' --embed -t 2", text, llms_run, path);
    CHECK_EQ(test_run_capture(cmd, got, sizeof got), 0);

    bert_model *m = bert_load(path, err);
    CHECK_MSG(m, "%s", err);
    tokenizer *tok;
    CHECK(tok_load(bert_gguf(m), &tok, err) == 0);
    int32_t ids[64];
    int n = tok_encode(tok, text, strlen(text), true, false, ids, 64);
    bert_runner *r = bert_runner_new(m, 1, 0, err);
    CHECK(r);
    float want[32];
    CHECK_MSG(bert_embed(r, 1, &n, ids, NULL, BERT_POOL_MEAN, want, err) == 0, "%s", err);
    char *s = got;
    for (int i = 0; i < 32; i++) {
        char *end;
        double x = strtod(s, &end);
        CHECK(end != s);
        CHECK_NEAR(x, want[i], 2e-6);
        s = end;
    }
    bert_runner_free(r);
    tok_free(tok);
    bert_free(m);
}

/* --lora and --lora-scaled (llama.cpp's flags): greedy ids through an adapter equal the
 * merged model's (mkmodel --from --lora-scaled), two stacked equal both merged, scale 0
 * is the base's, and an adapter of another model fails naming what does not fit. */
static void lora_flags_apply_adapters(void)
{
    if (!stories())
        SKIP("../shared/testdata/models/stories260K.gguf is absent");
    char a[1100], b[1100], m1[1100], m2[1100], other[1100], bad[1100], err[ERR_MAX];
    snprintf(a, sizeof a, "%s/a.gguf", test_tmpdir());
    snprintf(b, sizeof b, "%s/b.gguf", test_tmpdir());
    snprintf(m1, sizeof m1, "%s/m1.gguf", test_tmpdir());
    snprintf(m2, sizeof m2, "%s/m2.gguf", test_tmpdir());
    snprintf(other, sizeof other, "%s/other.gguf", test_tmpdir());
    snprintf(bad, sizeof bad, "%s/bad.gguf", test_tmpdir());
    gguf_file *g = gguf_open(stories(), err);
    CHECK_MSG(g, "%s", err);
    modelgen_lora_params lp = {.base = g, .rank = 4, .alpha = 8, .type = QTYPE_F16,
                               .targets = MODELGEN_LORA_LAYERS | MODELGEN_LORA_OUTPUT,
                               .seed = 1, .n_threads = 1};
    int rc = modelgen_write_lora(&lp, a, err);
    lp.seed = 2, lp.targets = MODELGEN_LORA_Q | MODELGEN_LORA_V;
    rc = rc < 0 ? rc : modelgen_write_lora(&lp, b, err);
    gguf_close(g);
    CHECK_MSG(rc == 0, "%s", err);
    const char *ab[2] = {a, b};
    float s1 = 1.5f, s2[2] = {1.5f, -2.0f};
    CHECK_MSG(modelgen_convert(stories(), m1, QTYPE_F32, MODELGEN_MIX_NONE, 1, ab, &s1, 0,
                               err) == 0,
              "%s", err);
    CHECK_MSG(modelgen_convert(stories(), m2, QTYPE_F32, MODELGEN_MIX_NONE, 2, ab, s2, 0, err) == 0,
              "%s", err);
    char cmd[6000], got[4096], want[4096], base[4096];
    const char *run = "--ids -p 1 -n 32 --temp 0 -t 2 2>/dev/null";
    snprintf(cmd, sizeof cmd, "%s -m '%s' %s", llms_run, stories(), run);
    CHECK_EQ(test_run_capture(cmd, base, sizeof base), 0);
    snprintf(cmd, sizeof cmd, "%s -m '%s' --lora-scaled '%s' 1.5 %s", llms_run, stories(), a, run);
    CHECK_EQ(test_run_capture(cmd, got, sizeof got), 0);
    snprintf(cmd, sizeof cmd, "%s -m '%s' %s", llms_run, m1, run);
    CHECK_EQ(test_run_capture(cmd, want, sizeof want), 0);
    CHECK_MSG(strcmp(got, want) == 0 && strcmp(got, base) != 0,
              "adapter '%s', merged '%s', base '%s'", got, want, base);
    snprintf(cmd, sizeof cmd, "%s -m '%s' --lora-scaled '%s' 1.5 --lora-scaled '%s' -2 %s",
             llms_run, stories(), a, b, run);
    CHECK_EQ(test_run_capture(cmd, got, sizeof got), 0);
    snprintf(cmd, sizeof cmd, "%s -m '%s' %s", llms_run, m2, run);
    CHECK_EQ(test_run_capture(cmd, want, sizeof want), 0);
    CHECK_MSG(strcmp(got, want) == 0, "adapters '%s', merged '%s'", got, want);
    snprintf(cmd, sizeof cmd, "%s -m '%s' --lora-scaled '%s' 0 %s", llms_run, stories(), a, run);
    CHECK_EQ(test_run_capture(cmd, got, sizeof got), 0);
    CHECK_MSG(strcmp(got, base) == 0, "scale 0 '%s', base '%s'", got, base);

    modelgen_params mp = {.arch = "llama", .dim = 32, .n_layer = 5, .n_head = 4,
                          .n_head_kv = 4, .n_ff = 64, .n_ctx = 128, .type = QTYPE_F32,
                          .seed = 3, .n_vocab = 512, .n_threads = 1};
    CHECK_MSG(modelgen_write(&mp, other, err) == 0, "%s", err);
    CHECK((g = gguf_open(other, err)) != NULL);
    lp.base = g;
    rc = modelgen_write_lora(&lp, bad, err);
    gguf_close(g);
    CHECK_MSG(rc == 0, "%s", err);
    snprintf(cmd, sizeof cmd, "%s -m '%s' --lora '%s' -p 1 2>&1", llms_run, stories(), bad);
    CHECK_EQ(test_run_capture(cmd, got, sizeof got), 1);
    CHECK_MSG(strstr(got, bad) && strstr(got, "blk.0.attn_q.weight: lora_a has shape [32, 4]"),
              "%s", got);
    snprintf(cmd, sizeof cmd, "%s -m '%s' --lora-scaled '%s' 2>&1", llms_run, stories(), a);
    CHECK_EQ(test_run_capture(cmd, got, sizeof got), 2);
    CHECK_MSG(strstr(got, "--lora-scaled needs a file and a scale"), "%s", got);
}

int main(int argc, char **argv)
{
    (void)argc;
    /* build[/asan]/tests/tools/test_llms_run -> build[/asan]/llms-run */
    char self[1024];
    snprintf(self, sizeof self, "%s", argv[0]);
    snprintf(llms_run, sizeof llms_run, "%s/../../llms-run", dirname(self));

    RUN(tokenize_matches_vectors_spm);
    RUN(tokenize_matches_vectors_bpe);
    RUN(tokenize_matches_vectors_wordpiece);
    RUN(detokenize_inverts_tokenize);
    RUN(greedy_generation_is_deterministic_across_threads_and_loads);
    RUN(sampling_is_reproducible_by_seed);
    RUN(penalties_change_greedy_text);
    RUN(newer_samplers_reach_the_sampler);
    RUN(json_writes_an_object);
    RUN(json_schema_writes_an_instance);
    RUN(grammar_writes_a_sentence);
    RUN(chat_template_overrides_the_files);
    RUN(perplexity_prints_llama_style_figure);
    RUN(bad_arguments_fail_with_a_message);
    RUN(lora_flags_apply_adapters);
    RUN(embed_prints_a_unit_vector);
    RUN(embed_on_nomic_bert_is_the_engines_vector);
    return test_finish();
}
